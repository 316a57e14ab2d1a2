/* GET /metrics: the tracker's counters and gauges, gathered into a metrics
 * registry (proto/metrics.h) at each scrape and rendered as Prometheus
 * text. Names: tessera_tracker_*, base units in the name, _total only on
 * counters; a state or kind is a label (tracker/API.md lists them). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/metrics.h"
#include "tracker/server/internal.h"

#define SERIES_FIXED 64 /* series besides the per-replica ones, at least */

/* One series of name with labels (NULL: none) set to v; a failure to
 * register is remembered in *bad. ms: v is milliseconds, shown as seconds. */
static void put(struct proto_metrics *m, bool counter, const char *name, const char *labels,
		const char *help, uint64_t v, bool ms, bool *bad)
{
	int h = counter ? proto_metrics_counter(m, name, labels, help) :
			  proto_metrics_gauge(m, name, labels, help);

	*bad |= h < 0;
	if (ms)
		proto_metrics_set_ms(m, h, v);
	else
		proto_metrics_set(m, h, v);
}

static void gauge(struct proto_metrics *m, const char *name, const char *labels, const char *help,
		  uint64_t v, bool *bad)
{
	put(m, false, name, labels, help, v, false, bad);
}

static void counter(struct proto_metrics *m, const char *name, const char *labels,
		    const char *help, uint64_t v, bool *bad)
{
	put(m, true, name, labels, help, v, false, bad);
}

/* Per live replica: active version, target, lag (versions and seconds) and
 * how long its ranks have disagreed. Replica names need no escaping
 * ([A-Za-z0-9._-]). */
static void replica_metrics(struct proto_metrics *m, struct trk_server *s, bool *bad)
{
	uint64_t now = proto_wall_ms();
	char l[TRK_REPLICA_MAX + 16];

	for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next) {
		uint64_t lv, lms, dms = rep->disagree_ms ? now - rep->disagree_ms : 0;
		if (!trk__replica_alive(rep))
			continue;
		trk__replica_lag(s, rep, now, &lv, &lms);
		snprintf(l, sizeof(l), "replica=\"%s\"", rep->name);
		gauge(m, "tessera_tracker_replica_active_version", l, "Version the replica serves.",
		      rep->active, bad);
		gauge(m, "tessera_tracker_replica_target_version", l,
		      "Version the replica's ranks work toward.", rep->target, bad);
		gauge(m, "tessera_tracker_replica_lag_versions", l,
		      "Versions the replica is behind the latest.", lv, bad);
		put(m, false, "tessera_tracker_replica_lag_seconds", l,
		    "Seconds since the first version newer than the active one was published.", lms,
		    true, bad);
		put(m, false, "tessera_tracker_replica_disagree_seconds", l,
		    "Seconds the replica's ranks have held different versions.", dms, true, bad);
	}
}

/* Per site: its live replicas, those on the latest version, its live
 * publishers; and per version, what its nodes took from other sites. Site
 * names need no escaping ([A-Za-z0-9._-]); the unnamed site is site="". */
static void site_metrics(struct proto_metrics *m, struct trk_server *s, bool *bad)
{
	json_t *sites = trk__sites_json(s), *e;
	char l[TRK_SITE_MAX + 16];
	size_t i;

	*bad |= sites == NULL;
	json_array_foreach(sites, i, e) {
		const char *name = json_string_value(json_object_get(e, "site"));
		snprintf(l, sizeof(l), "site=\"%s\"", name != NULL ? name : "");
		gauge(m, "tessera_tracker_site_replicas", l, "Live replicas per site (--site).",
		      (uint64_t)json_integer_value(json_object_get(e, "replicas_alive")), bad);
		gauge(m, "tessera_tracker_site_replicas_current", l,
		      "Live replicas per site active on the latest version.",
		      (uint64_t)json_integer_value(json_object_get(e, "replicas_current")), bad);
		gauge(m, "tessera_tracker_site_publishers", l, "Live publishers per site.",
		      (uint64_t)json_integer_value(json_object_get(e, "publishers_alive")), bad);
	}
	json_decref(sites);
}

static void versions_metrics(struct proto_metrics *m, const struct trk_versions *vs, bool *bad)
{
	static const char by_kind[] = "Versions in the log, by kind.";
	static const char wire[] = "Wire bytes of the versions in the log (once per layout), by kind.";
	static const char builds[] = "Versions ranks reported built, by how: from the parent by "
				     "delta, by replaying the chain from an anchor, or full.";
	struct trk_versions_stats v;

	trk__versions_stats(vs, &v);
	gauge(m, "tessera_tracker_versions_by_kind", "kind=\"anchor\"", by_kind, v.anchors, bad);
	gauge(m, "tessera_tracker_versions_by_kind", "kind=\"delta\"", by_kind, v.deltas, bad);
	gauge(m, "tessera_tracker_version_wire_bytes", "kind=\"anchor\"", wire, v.anchor_wire_bytes,
	      bad);
	gauge(m, "tessera_tracker_version_wire_bytes", "kind=\"delta\"", wire, v.delta_wire_bytes, bad);
	counter(m, "tessera_tracker_rank_builds_total", "how=\"delta\"", builds, v.built_delta, bad);
	counter(m, "tessera_tracker_rank_builds_total", "how=\"chain\"", builds, v.built_chain, bad);
	counter(m, "tessera_tracker_rank_builds_total", "how=\"full\"", builds, v.built_full, bad);
	counter(m, "tessera_tracker_anchor_requests_total", NULL,
		"Delta versions a node could not build and asked an anchor for.", v.anchor_requests,
		bad);
}

static void canary_metrics(struct proto_metrics *m, const struct trk_server *s, bool *bad)
{
	static const char *const names[] = {"result=\"match\"", "result=\"mismatch\"",
					    "result=\"unknown\""};
	uint64_t reports[3], mismatched;

	trk__canary_stats(s, reports, &mismatched);
	for (int i = 0; i < 3; i++)
		counter(m, "tessera_tracker_canary_reports_total", names[i],
			"Live canary scores probes reported, by verdict against the publisher's.",
			reports[i], bad);
	gauge(m, "tessera_tracker_canary_mismatched_ranks", NULL,
	      "Live ranks whose last canary score differs from the expected one.", mismatched, bad);
}

static void conns_metrics(struct proto_metrics *m, const struct trk_server *s, bool *bad)
{
	static const char closed[] = "Connections the tracker closed, by reason.";
	struct trk_conns_stats st;

	trk__conns_stats(s->conns, &st);
	gauge(m, "tessera_tracker_http_connections", NULL, "Connections open.", st.open, bad);
	gauge(m, "tessera_tracker_http_connections_cap", NULL,
	      "The cap on open connections (TESSERA_TRACKER_CONNS, or the descriptor limit).",
	      st.cap, bad);
	counter(m, "tessera_tracker_http_accepted_total", NULL,
		"Connections accepted (clients keep theirs open).", st.accepted, bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"over_cap\"", closed, st.evicted,
		bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"slow_head\"", closed, st.slow, bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"refused_head\"", closed,
		st.refused_heads, bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"idle\"", closed, st.idle, bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"slow_body\"", closed, st.slow_body,
		bad);
	counter(m, "tessera_tracker_http_closed_total", "reason=\"per_addr\"", closed, st.per_addr,
		bad);
	counter(m, "tessera_tracker_http_accept_errors_total", NULL, "Failed accept() calls.",
		st.accept_errors, bad);
}

/* Every series, in the order the answer shows them. */
static void fill(struct proto_metrics *m, struct trk_server *s, bool *bad)
{
	static const char *const classes[] = {NULL, "code=\"1xx\"", "code=\"2xx\"", "code=\"3xx\"",
					      "code=\"4xx\"", "code=\"5xx\""};
	static const char replicas[] = "Replicas by state (current: active on the latest version).";
	static const char nodes[] = "Node ranks by lease state.";
	static const char fetched[] = "Bytes nodes reported fetching, by source kind.";
	static const char forms[] = "Node registrations by whether their layout was a form "
				    "already parsed.";
	static const char answers[] = "Sources queries answered from a kept answer (hit) or that "
				      "built one (miss).";
	struct trk_counts k;
	uint64_t sh, sm;

	trk__registry_counts(s->reg, &k);
	trk__srcache_stats(s->reg->srcache, &sh, &sm);
	/* A standby's chain is as of its start (or its last takeover). */
	gauge(m, "tessera_tracker_leading", NULL,
	      "1 when this tracker answers (alone, or leading the trackers of its store); 0 "
	      "while it stands by and the version counts below are not current.",
	      s->standby ? 0 : 1, bad);
	gauge(m, "tessera_tracker_versions", NULL, "Versions in the log.", trk__versions_count(s->vs),
	      bad);
	gauge(m, "tessera_tracker_latest_version", NULL, "Newest version number.",
	      trk__versions_latest(s->vs), bad);
	versions_metrics(m, s->vs, bad);
	gauge(m, "tessera_tracker_replicas", "state=\"current\"", replicas, k.replicas_current, bad);
	gauge(m, "tessera_tracker_replicas", "state=\"updating\"", replicas, k.replicas_updating,
	      bad);
	gauge(m, "tessera_tracker_replicas", "state=\"failed\"", replicas, k.replicas_failed, bad);
	gauge(m, "tessera_tracker_replicas", "state=\"behind\"", replicas, k.replicas_behind, bad);
	gauge(m, "tessera_tracker_replicas", "state=\"partial\"", replicas, k.replicas_partial, bad);
	gauge(m, "tessera_tracker_replicas", "state=\"gone\"", replicas, k.replicas_gone, bad);
	replica_metrics(m, s, bad);
	site_metrics(m, s, bad);
	gauge(m, "tessera_tracker_nodes", "state=\"alive\"", nodes, k.nodes_alive, bad);
	gauge(m, "tessera_tracker_nodes", "state=\"gone\"", nodes, k.nodes_gone, bad);
	gauge(m, "tessera_tracker_publishers", NULL, "Publishers with a live lease.",
	      k.publishers_alive, bad);
	counter(m, "tessera_tracker_reported_fetched_bytes_total", "source=\"trainer\"", fetched,
		k.bytes_from_trainer, bad);
	counter(m, "tessera_tracker_reported_fetched_bytes_total", "source=\"peer\"", fetched,
		k.bytes_from_peers, bad);
	counter(m, "tessera_tracker_reported_other_sites_bytes_total", NULL,
		"Of the bytes nodes reported fetching, those from sources in another site "
		"(what crossed wide-area links).", k.bytes_from_other_sites, bad);
	counter(m, "tessera_tracker_activations_total", NULL, "Replica activations since start.",
		k.activations, bad);
	canary_metrics(m, s, bad);
	counter(m, "tessera_tracker_layout_cache_lookups_total", "result=\"hit\"", forms,
		k.layout_cache_hits, bad);
	counter(m, "tessera_tracker_layout_cache_lookups_total", "result=\"miss\"", forms,
		k.layout_cache_misses, bad);
	counter(m, "tessera_tracker_sources_cache_answers_total", "result=\"hit\"", answers, sh, bad);
	counter(m, "tessera_tracker_sources_cache_answers_total", "result=\"miss\"", answers, sm, bad);
	counter(m, "tessera_tracker_sources_batches_total", NULL,
		"Batched sources queries (POST /sources) answered.", s->reg->src_batches, bad);
	counter(m, "tessera_tracker_sources_batched_parcels_total", NULL,
		"Parcels asked for in batched sources queries.", s->reg->src_batched, bad);
	gauge(m, "tessera_tracker_watches_held", NULL,
	      "Long-polls held now (version watches, addendum waits).", trk__watches_held(s->w), bad);
	counter(m, "tessera_tracker_auth_refused_requests_total", NULL,
		"POSTs refused by authentication.", s->auth_refused, bad);
	conns_metrics(m, s, bad);
	for (int i = 1; i <= 5; i++)
		counter(m, "tessera_tracker_http_responses_total", classes[i],
			"Answers by status class.", s->answers[i], bad);
}

void trk__handle_metrics(struct trk_call *c)
{
	struct trk_server *s = c->s;
	size_t nrep = 0, len = 0;
	struct proto_metrics *m;
	char *text = NULL;
	bool bad = false;

	for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next)
		nrep++;
	m = proto_metrics_new_max(SERIES_FIXED + 5 * nrep);
	if (m != NULL) {
		fill(m, s, &bad);
		text = bad ? NULL : proto_metrics_render(m, &len);
	}
	proto_metrics_free(m);
	if (text == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__reply_raw(c, 200, "text/plain; version=0.0.4", text, len);
	free(text);
}
