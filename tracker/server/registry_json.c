/* The registry as JSON: replicas, serving layouts, the soft half of /status. */
#include "proto/fp8.h"
#include "tracker/server/internal.h"

/* ---- JSON helpers ---------------------------------------------------------- */

static json_t *u64_array(const uint64_t *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a != NULL && i < n; i++)
		if (json_array_append_new(a, trk__jint(v[i])) != 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *rank_json(const struct trk_replica *rep, uint32_t rank, bool full)
{
	struct trk_node *n = rep->ranks[rank];
	json_t *o = json_object();
	const struct trk_nver *e;
	int bad = o == NULL;

	if (bad)
		return NULL;
	bad |= trk__set(o, "rank", json_integer(rank));
	if (n == NULL) {
		bad |= trk__set(o, "id", json_null());
		bad |= trk__set(o, "alive", json_false());
		bad |= trk__set(o, "state", json_string("absent"));
		bad |= trk__set(o, "version", json_integer(0));
		bad |= trk__set(o, "bytes_done", json_integer(0));
		bad |= trk__set(o, "bytes_total", json_integer(0));
		goto out;
	}
	e = n->last >= 0 ? &n->vers[n->last] : NULL;
	bad |= trk__set(o, "id", json_string(n->id));
	bad |= trk__set(o, "alive", json_boolean(n->alive));
	bad |= trk__set(o, "state", json_string(e ? trk_state_name(e->state) :
						    "registered"));
	bad |= trk__set(o, "version", trk__jint(e ? e->version : 0));
	bad |= trk__set(o, "bytes_done", trk__jint(e ? e->done : 0));
	bad |= trk__set(o, "bytes_total", trk__jint(e ? e->total : 0));
	/* Where those bytes came from (a chain's steps included). */
	bad |= trk__set(o, "bytes_from_trainer", trk__jint(e ? e->from_trainer : 0));
	bad |= trk__set(o, "bytes_from_peers", trk__jint(e ? e->from_peers : 0));
	bad |= trk__set(o, "bytes_from_other_sites", trk__jint(e ? e->from_other_sites : 0));
	bad |= trk__set(o, "active", trk__jint(n->active));
	/* How the rank got the version it reports on: rebuilt from its parent
	 * by delta, or full parcels (absent until it is built). */
	if (e != NULL && e->how[0])
		bad |= trk__set(o, "how", json_string(e->how));
	/* Requests pinning each version the rank holds, as it last said. */
	json_t *pins = json_array();
	for (size_t i = 0; pins != NULL && i < n->npins; i++)
		bad |= json_array_append_new(pins, json_pack("{s:o,s:I,s:o}", "version",
							     trk__jint(n->pins[i].version), "pins",
							     (json_int_t)n->pins[i].pins, "requests",
							     trk__jint(n->pins[i].requests))) != 0;
	bad |= trk__set(o, "pins", pins);
	if (full) {
		bad |= trk__set(o, "host", json_string(n->host));
		bad |= trk__set(o, "provider", json_string(n->provider));
		bad |= trk__set(o, "registered_ms", trk__jint(n->registered_ms));
		bad |= trk__set(o, "report_ms", trk__jint(n->report_ms));
		if (!n->alive)
			bad |= trk__set(o, "gone_ms", trk__jint(n->gone_ms));
		if (n->error[0])
			bad |= trk__set(o, "error", json_string(n->error));
		if (e != NULL) {
			bad |= trk__set(o, "bytes_from_trainer", trk__jint(e->from_trainer));
			bad |= trk__set(o, "bytes_from_peers", trk__jint(e->from_peers));
			bad |= trk__set(o, "duplicate_bytes", trk__jint(e->duplicate));
			if (e->banned[0])
				bad |= trk__set(o, "banned", json_string(e->banned));
			bad |= trk__set(o, "refetched_bytes", trk__jint(e->refetched));
		}
	}
out:
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *replica_json(struct trk_registry *r, const struct trk_replica *rep, bool full)
{
	json_t *o = json_object(), *ranks = json_array();
	uint64_t list[TRK__NODE_VERSIONS], lag_v, lag_ms, now = proto_wall_ms();
	size_t k = trk__replica_complete_list(rep, list);
	int bad = o == NULL || ranks == NULL;

	trk__replica_lag(r->s, rep, now, &lag_v, &lag_ms);

	for (uint32_t i = 0; !bad && i < rep->nranks; i++) {
		json_t *rk = rank_json(rep, i, full);
		/* What a probe last read through the rank's live memory. */
		if (rk != NULL)
			bad |= trk__set(rk, "canary", trk__canary_rank_json(r->s, rep->ranks[i]));
		bad |= json_array_append_new(ranks, rk) != 0;
	}
	if (!bad) {
		bad |= trk__set(o, "replica", json_string(rep->name));
		/* Where it is: null for the unnamed site. */
		bad |= trk__set(o, "site", trk__replica_site(rep)[0] ?
						   json_string(trk__replica_site(rep)) : json_null());
		bad |= trk__set(o, "layout_digest",
				trk__json_hex(rep->layout->digest, PROTO_HASH_BYTES));
		bad |= trk__set(o, "layout_name", rep->layout->name[0] ?
							  json_string(rep->layout->name) :
							  json_null());
		/* What it serves transformed (FP8), or null: as trained. */
		bad |= trk__set(o, "transform", proto_layout_transformed(&rep->layout->l) ?
							json_string(PROTO_FP8_TRANSFORM) : json_null());
		bad |= trk__set(o, "nranks", json_integer(rep->nranks));
		bad |= trk__set(o, "alive", json_boolean(trk__replica_alive(rep)));
		bad |= trk__set(o, "incomplete", json_boolean(!trk__replica_whole(rep)));
		bad |= trk__set(o, "ranks", ranks);
		ranks = NULL;
		bad |= trk__set(o, "complete", u64_array(list, k));
		bad |= trk__set(o, "active", trk__jint(rep->active));
		bad |= trk__set(o, "canary_ok", trk__canary_replica_ok(r->s, rep, rep->active));
		bad |= trk__set(o, "target", trk__jint(rep->target));
		bad |= trk__set(o, "target_ms", trk__jint(rep->target_ms));
		bad |= trk__set(o, "lag_versions", trk__jint(lag_v));
		bad |= trk__set(o, "lag_ms", trk__jint(lag_ms));
		bad |= trk__set(o, "disagree_ms",
				trk__jint(rep->disagree_ms ? now - rep->disagree_ms : 0));
		if (rep->disagree_logged)
			bad |= trk__set(o, "disagreement", json_string(rep->why));
		/* Its state in words, and its current fetch. */
		bad |= trk__replica_state_json(r->s, rep, now, o);
	}
	json_decref(ranks);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ---- GET /layouts, /replicas/R ---------------------------------------------- */

void trk__handle_layouts(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	json_t *o, *arr = json_array();
	int bad = arr == NULL;

	if (!r->have_model) {
		json_decref(arr);
		trk__fail(c, 404, "no model known yet: %s", trk__registry_no_model(r));
		return;
	}
	for (struct trk_slayout *sl = r->layouts; !bad && sl; sl = sl->next) {
		json_t *names = json_array();
		bad |= names == NULL;
		for (struct trk_replica *rep = r->reps; !bad && rep; rep = rep->next)
			if (rep->layout == sl && trk__replica_alive(rep))
				bad |= json_array_append_new(names, json_string(rep->name)) != 0;
		if (!bad && json_array_size(names) > 0)
			bad |= json_array_append_new(
				       arr, json_pack("{s:o,s:O,s:O}", "digest",
						      trk__json_hex(sl->digest, PROTO_HASH_BYTES),
						      "layout", sl->json, "replicas",
						      names)) != 0;
		json_decref(names);
	}
	if (bad) {
		json_decref(arr);
		trk__fail(c, 500, "out of memory");
		return;
	}
	o = json_pack("{s:o,s:O,s:O,s:o,s:o}", "model_digest",
		      trk__json_hex(r->model.digest, PROTO_HASH_BYTES), "model",
		      r->model_json, "trainer_layout", r->tlayout_json,
		      "trainer_layout_digest",
		      trk__json_hex(r->tlayout.digest, PROTO_HASH_BYTES), "layouts", arr);
	trk__reply_json(c, 200, o);
}

void trk__handle_replica(struct trk_call *c, const char *name)
{
	struct trk_replica *rep = trk__replica_name_valid(name) ?
					  trk__replica_find(c->s->reg, name) :
					  NULL;

	if (rep == NULL) {
		trk__fail(c, 404, "no replica named '%s'", name);
		return;
	}
	json_t *o = replica_json(c->s->reg, rep, false);
	/* A claim of completeness at the target comes with what backs it. */
	if (o != NULL && rep->target != 0 && trk__replica_complete(rep, rep->target) &&
	    trk__set(o, "target_statements", trk__replica_statements(rep, rep->target)) != 0) {
		json_decref(o);
		o = NULL;
	}
	trk__reply_json(c, 200, o);
}

/* ---- status -------------------------------------------------------------------- */

json_t *trk__registry_version_replicas(struct trk_registry *r, uint64_t v,
				       bool active, size_t max, uint64_t *count)
{
	json_t *a = json_array();

	*count = 0;
	for (struct trk_replica *rep = r->reps; a != NULL && rep; rep = rep->next) {
		bool in = active ? rep->active == v && trk__replica_whole(rep) :
				   trk__replica_complete(rep, v);
		if (!in)
			continue;
		if ((*count)++ < max && json_array_append_new(a, json_string(rep->name)) != 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The versions the trainer got out, against a publisher's clock: the
 * intervals between the newest publications (median and last), the time
 * since the last, whether that is past twice the clock (late) and whether
 * the median is past one and a half times it (slow). */
#define CLOCK_VERSIONS 16
static json_t *clock_json(struct trk_server *s, const struct trk_publisher *p, uint64_t now)
{
	size_t n = trk__versions_count(s->vs), k = 0;
	uint64_t iv[CLOCK_VERSIONS], last_pub = 0, prev = 0;
	json_t *o = json_object();
	int bad = o == NULL;

	for (size_t i = n > CLOCK_VERSIONS + 1 ? n - CLOCK_VERSIONS - 1 : 0; i < n; i++) {
		uint64_t t = trk__versions_at(s->vs, i)->published_ms;
		if (prev != 0 && t > prev && k < CLOCK_VERSIONS)
			iv[k++] = t - prev;
		prev = t;
		last_pub = PROTO_MAX(last_pub, t);
	}
	uint64_t last_iv = k > 0 ? iv[k - 1] : 0, since = last_pub && now > last_pub ? now - last_pub : 0;
	qsort(iv, k, sizeof(iv[0]), cmp_u64);
	/* Late: nothing for twice the clock since the last version (or since
	 * it registered, before its first). */
	uint64_t quiet = last_pub > p->registered_ms ? since :
			 now > p->registered_ms ? now - p->registered_ms : 0;
	bool late = p->alive && p->every_ms != 0 && quiet > 2 * p->every_ms;
	/* Slow: its versions come, but further apart than its clock (the
	 * median of two intervals or more past 1.5 times it). */
	bool slow = p->alive && p->every_ms != 0 && k >= 2 && 2 * iv[k / 2] > 3 * p->every_ms;
	bad |= trk__set(o, "every_ms", p->every_ms ? trk__jint(p->every_ms) : json_null());
	bad |= trk__set(o, "site", p->site[0] ? json_string(p->site) : json_null());
	bad |= trk__set(o, "interval_median_ms", k ? trk__jint(iv[k / 2]) : json_null());
	bad |= trk__set(o, "interval_last_ms", k ? trk__jint(last_iv) : json_null());
	bad |= trk__set(o, "since_last_ms", last_pub ? trk__jint(since) : json_null());
	bad |= trk__set(o, "late", json_boolean(late));
	bad |= trk__set(o, "slow", json_boolean(slow));
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *publisher_json(struct trk_server *s, const struct trk_publisher *p, uint64_t now)
{
	json_t *o = json_object(), *ranks = json_array(), *offers = json_array();
	int bad = o == NULL || ranks == NULL || offers == NULL;

	for (size_t i = 0; !bad && i < p->nranks; i++)
		bad |= json_array_append_new(
			       ranks, json_pack("{s:i,s:s,s:s}", "rank", (int)p->ranks[i].rank,
						"host", p->ranks[i].host, "provider",
						p->ranks[i].provider)) != 0;
	for (size_t i = 0; !bad && i < p->offers.n; i++)
		bad |= json_array_append_new(offers,
					     trk__jint(p->offers.sets[i].version)) != 0;
	if (!bad) {
		bad |= trk__set(o, "id", json_string(p->id));
		bad |= trk__set(o, "alive", json_boolean(p->alive));
		bad |= trk__set(o, "registered_ms", trk__jint(p->registered_ms));
		if (!p->alive)
			bad |= trk__set(o, "gone_ms", trk__jint(p->gone_ms));
		bad |= trk__set(o, "ranks", json_incref(ranks));
		bad |= trk__set(o, "offered_versions", json_incref(offers));
		bad |= trk__set(o, "clock", clock_json(s, p, now));
	}
	json_decref(ranks);
	json_decref(offers);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *trk__registry_status(struct trk_registry *r, struct trk_status_page *pg)
{
	uint64_t total = 0, shown = 0, rows = 0;
	json_t *o = json_object(), *pubs = json_array(), *reps = json_array(),
	       *acts = json_array();
	int bad = o == NULL || pubs == NULL || reps == NULL || acts == NULL;
	struct trk_counts cnt;

	for (struct trk_publisher *p = r->pubs; !bad && p; p = p->next)
		bad |= json_array_append_new(pubs, publisher_json(r->s, p, proto_wall_ms())) != 0;
	for (struct trk_replica *rep = r->reps; !bad && rep; rep = rep->next, total++) {
		if (total < pg->offset || shown >= pg->limit)
			continue;
		if (pg->ranks_max > 0 && shown > 0 && rows + rep->nranks > pg->ranks_max) {
			pg->limit = shown; /* a page a person can read */
			continue;
		}
		bad |= json_array_append_new(reps, replica_json(r, rep, true)) != 0;
		shown++;
		rows += rep->nranks;
	}
	/* Newest activation first. */
	for (size_t k = 0; !bad && k < r->act_n; k++) {
		const struct trk_activation *a =
			&r->act[(r->act_next + TRK__ACTIVATIONS_MAX - 1 - k) %
				TRK__ACTIVATIONS_MAX];
		bad |= json_array_append_new(
			       acts, json_pack("{s:s,s:o,s:o}", "replica", a->replica,
					       "version", trk__jint(a->version),
					       "wall_ms", trk__jint(a->wall_ms))) != 0;
	}
	trk__registry_counts(r, &cnt);
	if (!bad) {
		bad |= trk__set(o, "sites", trk__sites_json(r->s));
		bad |= trk__set(o, "model_digest",
				r->have_model ? trk__json_hex(r->model.digest,
							      PROTO_HASH_BYTES) :
						json_null());
		bad |= trk__set(o, "trainer_layout_digest",
				r->have_model ? trk__json_hex(r->tlayout.digest,
							      PROTO_HASH_BYTES) :
						json_null());
		bad |= trk__set(o, "model_bytes",
				trk__jint(r->have_model ? proto_model_bytes(&r->model) : 0));
		bad |= trk__set(o, "publishers", json_incref(pubs));
		bad |= trk__set(o, "replicas", json_incref(reps));
		bad |= trk__set(o, "replicas_total", trk__jint(total));
		bad |= trk__set(o, "replicas_offset", trk__jint(pg->offset));
		bad |= trk__set(o, "replicas_limit", trk__jint(pg->limit));
		bad |= trk__set(o, "replicas_by_state",
				json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "current",
					  trk__jint(cnt.replicas_current), "updating",
					  trk__jint(cnt.replicas_updating), "failed",
					  trk__jint(cnt.replicas_failed), "behind",
					  trk__jint(cnt.replicas_behind), "partial",
					  trk__jint(cnt.replicas_partial), "gone",
					  trk__jint(cnt.replicas_gone)));
		bad |= trk__set(o, "activations", json_incref(acts));
		bad |= trk__set(o, "activations_total", trk__jint(r->act_total));
		bad |= trk__set(o, "bytes_from_trainer", trk__jint(r->bytes_from_trainer));
		bad |= trk__set(o, "bytes_from_peers", trk__jint(r->bytes_from_peers));
		bad |= trk__set(o, "nodes_alive", trk__jint(cnt.nodes_alive));
		bad |= trk__set(o, "publishers_alive", trk__jint(cnt.publishers_alive));
	}
	json_decref(pubs);
	json_decref(reps);
	json_decref(acts);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}
