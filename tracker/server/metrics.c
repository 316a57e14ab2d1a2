/* GET /metrics: the tracker's counters and gauges in Prometheus text. */
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>

#include "tracker/server/internal.h"

static void metric(struct evbuffer *b, const char *name, const char *type,
		   const char *help, uint64_t v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name,
			    help, name, type, name, v);
}

/* Per live replica: active version, target, lag (versions and seconds) and
 * how long its ranks have disagreed. Replica names need no escaping. */
static void replica_metrics(struct evbuffer *b, struct trk_server *s)
{
	static const char *const names[][2] = {
		{"tessera_tracker_replica_active_version", "Version the replica serves."},
		{"tessera_tracker_replica_target_version", "Version the replica's ranks work toward."},
		{"tessera_tracker_replica_lag_versions", "Versions the replica is behind the latest."},
		{"tessera_tracker_replica_lag_seconds", "Seconds since the first version newer than the active one was published."},
		{"tessera_tracker_replica_disagree_seconds", "Seconds the replica's ranks have held different versions."},
	};
	uint64_t now = proto_wall_ms();

	for (size_t m = 0; m < PROTO_ARRAY_LEN(names); m++) {
		evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", names[m][0], names[m][1],
				    names[m][0]);
		for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next) {
			uint64_t lv, lms, dms = rep->disagree_ms ? now - rep->disagree_ms : 0;
			if (!trk__replica_alive(rep))
				continue;
			trk__replica_lag(s, rep, now, &lv, &lms);
			evbuffer_add_printf(b, "%s{replica=\"%s\"} ", names[m][0], rep->name);
			if (m == 0)
				evbuffer_add_printf(b, "%" PRIu64 "\n", rep->active);
			else if (m == 1)
				evbuffer_add_printf(b, "%" PRIu64 "\n", rep->target);
			else if (m == 2)
				evbuffer_add_printf(b, "%" PRIu64 "\n", lv);
			else if (m == 3)
				evbuffer_add_printf(b, "%.3f\n", (double)lms / 1000.0);
			else
				evbuffer_add_printf(b, "%.3f\n", (double)dms / 1000.0);
		}
	}
}

static void versions_metrics(struct evbuffer *b, const struct trk_versions *vs)
{
	struct trk_versions_stats v;

	trk__versions_stats(vs, &v);
	evbuffer_add_printf(b,
			    "# HELP tessera_tracker_versions_by_kind Versions in the log, by kind.\n"
			    "# TYPE tessera_tracker_versions_by_kind gauge\n"
			    "tessera_tracker_versions_by_kind{kind=\"anchor\"} %" PRIu64 "\n"
			    "tessera_tracker_versions_by_kind{kind=\"delta\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_version_wire_bytes Wire bytes of the versions in the log (once per layout), by kind.\n"
			    "# TYPE tessera_tracker_version_wire_bytes gauge\n"
			    "tessera_tracker_version_wire_bytes{kind=\"anchor\"} %" PRIu64 "\n"
			    "tessera_tracker_version_wire_bytes{kind=\"delta\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_rank_builds_total Versions ranks reported built, by how: from the parent by delta, by replaying the chain from an anchor, or full.\n"
			    "# TYPE tessera_tracker_rank_builds_total counter\n"
			    "tessera_tracker_rank_builds_total{how=\"delta\"} %" PRIu64 "\n"
			    "tessera_tracker_rank_builds_total{how=\"chain\"} %" PRIu64 "\n"
			    "tessera_tracker_rank_builds_total{how=\"full\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_anchor_requests_total Delta versions a node could not build and asked an anchor for.\n"
			    "# TYPE tessera_tracker_anchor_requests_total counter\n"
			    "tessera_tracker_anchor_requests_total %" PRIu64 "\n",
			    v.anchors, v.deltas, v.anchor_wire_bytes, v.delta_wire_bytes, v.built_delta,
			    v.built_chain, v.built_full, v.anchor_requests);
}

static void canary_metrics(struct evbuffer *b, const struct trk_server *s)
{
	static const char *const names[] = {"match", "mismatch", "unknown"};
	uint64_t reports[3], bad;

	trk__canary_stats(s, reports, &bad);
	evbuffer_add_printf(b, "# HELP tessera_tracker_canary_reports_total Live canary scores "
			       "probes reported, by verdict against the publisher's.\n"
			       "# TYPE tessera_tracker_canary_reports_total counter\n");
	for (int i = 0; i < 3; i++)
		evbuffer_add_printf(b, "tessera_tracker_canary_reports_total{result=\"%s\"} %" PRIu64
				       "\n", names[i], reports[i]);
	evbuffer_add_printf(b, "# HELP tessera_tracker_canary_mismatched_ranks Live ranks whose "
			       "last canary score differs from the expected one.\n"
			       "# TYPE tessera_tracker_canary_mismatched_ranks gauge\n"
			       "tessera_tracker_canary_mismatched_ranks %" PRIu64 "\n", bad);
}

static void conns_metrics(struct evbuffer *b, const struct trk_server *s)
{
	struct trk_conns_stats st;

	trk__conns_stats(s->conns, &st);
	evbuffer_add_printf(b,
		"# HELP tessera_tracker_http_connections Connections open, and the cap.\n"
		"# TYPE tessera_tracker_http_connections gauge\n"
		"tessera_tracker_http_connections %zu\n"
		"tessera_tracker_http_connections_cap %zu\n"
		"# HELP tessera_tracker_http_accepted_total Connections accepted (clients keep theirs open).\n"
		"# TYPE tessera_tracker_http_accepted_total counter\n"
		"tessera_tracker_http_accepted_total %llu\n"
		"# HELP tessera_tracker_http_closed_total Connections the tracker closed, by reason.\n"
		"# TYPE tessera_tracker_http_closed_total counter\n"
		"tessera_tracker_http_closed_total{reason=\"over_cap\"} %llu\n"
		"tessera_tracker_http_closed_total{reason=\"slow_head\"} %llu\n"
		"tessera_tracker_http_closed_total{reason=\"refused_head\"} %llu\n"
		"tessera_tracker_http_closed_total{reason=\"idle\"} %llu\n"
		"# HELP tessera_tracker_http_accept_errors_total Failed accept() calls.\n"
		"# TYPE tessera_tracker_http_accept_errors_total counter\n"
		"tessera_tracker_http_accept_errors_total %llu\n",
		st.open, st.cap, (unsigned long long)st.accepted, (unsigned long long)st.evicted,
		(unsigned long long)st.slow, (unsigned long long)st.refused_heads,
		(unsigned long long)st.idle,
		(unsigned long long)st.accept_errors);
}

void trk__handle_metrics(struct trk_call *c)
{
	struct trk_server *s = c->s;
	struct evbuffer *b = evbuffer_new();
	struct trk_counts k;
	static const char *classes[] = {NULL, "1xx", "2xx", "3xx", "4xx", "5xx"};

	if (b == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__registry_counts(s->reg, &k);
	/* Names: tessera_tracker_*, base units in the name, _total only on
	 * counters; a state or kind is a label (see tracker/API.md). */
	metric(b, "tessera_tracker_versions", "gauge", "Versions in the log.",
	       trk__versions_count(s->vs));
	metric(b, "tessera_tracker_latest_version", "gauge", "Newest version number.",
	       trk__versions_latest(s->vs));
	versions_metrics(b, s->vs);
	evbuffer_add_printf(b, "# HELP tessera_tracker_replicas Replicas by state (current: "
			       "active on the latest version).\n# TYPE tessera_tracker_replicas gauge\n");
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"current\"} %" PRIu64 "\n",
			    k.replicas_current);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"behind\"} %" PRIu64 "\n",
			    k.replicas_behind);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"partial\"} %" PRIu64 "\n",
			    k.replicas_partial);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"gone\"} %" PRIu64 "\n",
			    k.replicas_gone);
	replica_metrics(b, s);
	evbuffer_add_printf(b, "# HELP tessera_tracker_nodes Node ranks by lease state.\n"
			       "# TYPE tessera_tracker_nodes gauge\n"
			       "tessera_tracker_nodes{state=\"alive\"} %" PRIu64 "\n"
			       "tessera_tracker_nodes{state=\"gone\"} %" PRIu64 "\n",
			    k.nodes_alive, k.nodes_gone);
	metric(b, "tessera_tracker_publishers", "gauge", "Publishers with a live lease.",
	       k.publishers_alive);
	evbuffer_add_printf(b, "# HELP tessera_tracker_reported_fetched_bytes_total Bytes nodes "
			       "reported fetching, by source kind.\n"
			       "# TYPE tessera_tracker_reported_fetched_bytes_total counter\n"
			       "tessera_tracker_reported_fetched_bytes_total{source=\"trainer\"} %" PRIu64 "\n"
			       "tessera_tracker_reported_fetched_bytes_total{source=\"peer\"} %" PRIu64 "\n",
			    k.bytes_from_trainer, k.bytes_from_peers);
	metric(b, "tessera_tracker_activations_total", "counter",
	       "Replica activations since start.", k.activations);
	canary_metrics(b, s);
	evbuffer_add_printf(b, "# HELP tessera_tracker_layout_cache_lookups_total Node "
			       "registrations by whether their layout was a form already parsed.\n"
			       "# TYPE tessera_tracker_layout_cache_lookups_total counter\n"
			       "tessera_tracker_layout_cache_lookups_total{result=\"hit\"} %" PRIu64 "\n"
			       "tessera_tracker_layout_cache_lookups_total{result=\"miss\"} %" PRIu64 "\n",
			    k.layout_cache_hits, k.layout_cache_misses);
	uint64_t sh, sm;
	trk__srcache_stats(s->reg->srcache, &sh, &sm);
	evbuffer_add_printf(b, "# HELP tessera_tracker_sources_cache_answers_total Sources "
			       "queries answered from a kept answer (hit) or that built one (miss).\n"
			       "# TYPE tessera_tracker_sources_cache_answers_total counter\n"
			       "tessera_tracker_sources_cache_answers_total{result=\"hit\"} %" PRIu64 "\n"
			       "tessera_tracker_sources_cache_answers_total{result=\"miss\"} %" PRIu64 "\n",
			    sh, sm);
	metric(b, "tessera_tracker_sources_batches_total", "counter",
	       "Batched sources queries (POST /sources) answered.", s->reg->src_batches);
	metric(b, "tessera_tracker_sources_batched_parcels_total", "counter",
	       "Parcels asked for in batched sources queries.", s->reg->src_batched);
	metric(b, "tessera_tracker_watches_held", "gauge",
	       "Long-polls held now (version watches, addendum waits).",
	       (uint64_t)trk__watches_held(s->w));
	metric(b, "tessera_tracker_auth_refused_requests_total", "counter",
	       "POSTs refused by authentication.", s->auth_refused);
	conns_metrics(b, s);
	evbuffer_add_printf(b, "# HELP tessera_tracker_http_responses_total Answers by status class.\n"
			       "# TYPE tessera_tracker_http_responses_total counter\n");
	for (int i = 1; i <= 5; i++)
		evbuffer_add_printf(b, "tessera_tracker_http_responses_total{code=\"%s\"} %" PRIu64 "\n",
				    classes[i], s->answers[i]);

	size_t len = evbuffer_get_length(b);
	const uint8_t *p = evbuffer_pullup(b, -1);
	if (p == NULL)
		trk__fail(c, 500, "out of memory");
	else
		trk__reply_raw(c, 200, "text/plain; version=0.0.4", p, len);
	evbuffer_free(b);
}
