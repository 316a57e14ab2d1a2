/* What derives from a replica's ranks: whether it is alive, whole,
 * complete at a version, its active version (each change logged as an
 * activation) and the statements its ranks signed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

/* 1..TRK_REPLICA_MAX of [A-Za-z0-9._-], and ':' where colon says. */
static bool name_valid(const char *s, bool colon)
{
	size_t n = strlen(s);

	if (n == 0 || n > TRK_REPLICA_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
		      (colon && c == ':')))
			return false;
	}
	return true;
}

const char *trk__replica_site(const struct trk_replica *rep)
{
	for (uint32_t r = 0; r < rep->nranks; r++)
		if (rep->ranks[r] != NULL)
			return rep->ranks[r]->site;
	return "";
}

bool trk__replica_name_valid(const char *s)
{
	return name_valid(s, false);
}

bool trk__layout_name_valid(const char *s)
{
	return name_valid(s, true); /* "tp2:fp8" */
}

struct trk_nver *trk__node_version(struct trk_node *n, uint64_t v)
{
	for (size_t i = 0; i < n->nvers; i++)
		if (n->vers[i].version == v)
			return &n->vers[i];
	return NULL;
}

/* The node holds v whole: it reported v verified or active. */
bool trk__node_holds(struct trk_node *n, uint64_t v)
{
	struct trk_nver *e;

	if (n == NULL || !n->alive)
		return false;
	e = trk__node_version(n, v);
	return e != NULL &&
	       (e->state == TRK_STATE_VERIFIED || e->state == TRK_STATE_ACTIVE);
}

bool trk__replica_alive(const struct trk_replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (rep->ranks[i] != NULL && rep->ranks[i]->alive)
			return true;
	return false;
}

bool trk__replica_whole(const struct trk_replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (rep->ranks[i] == NULL || !rep->ranks[i]->alive)
			return false;
	return rep->nranks > 0;
}

/* Complete at v: every rank alive and holding v (model-parallel
 * consistency: a replica is only as complete as its least rank). */
bool trk__replica_complete(const struct trk_replica *rep, uint64_t v)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (!trk__node_holds(rep->ranks[i], v))
			return false;
	return rep->nranks > 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The versions a replica is complete at, ascending, into out[TRK__NODE_VERSIONS];
 * returns how many. Rank 0's versions are the candidates. */
size_t trk__replica_complete_list(const struct trk_replica *rep, uint64_t *out)
{
	struct trk_node *n0 = rep->nranks > 0 ? rep->ranks[0] : NULL;
	size_t k = 0;

	if (n0 == NULL)
		return 0;
	for (size_t i = 0; i < n0->nvers; i++)
		if (trk__replica_complete(rep, n0->vers[i].version))
			out[k++] = n0->vers[i].version;
	qsort(out, k, sizeof(*out), cmp_u64);
	return k;
}

static void log_activation(struct trk_registry *r, struct trk_replica *rep)
{
	struct trk_activation *a = &r->act[r->act_next];

	struct trk_version *ver = trk__versions_find(r->s->vs, rep->active);

	snprintf(a->replica, sizeof(a->replica), "%s", rep->name);
	a->version = rep->active;
	a->wall_ms = proto_wall_ms();
	/* How long an update takes here: what "behind" is measured against. */
	if (ver != NULL && ver->published_ms != 0 && a->wall_ms > ver->published_ms)
		rep->update_ms = a->wall_ms - ver->published_ms;
	r->act_next = (r->act_next + 1) % TRK__ACTIVATIONS_MAX;
	r->act_n = PROTO_MIN(r->act_n + 1, TRK__ACTIVATIONS_MAX);
	r->act_total++;
	LOG_INFO("replica %s activated version %llu", rep->name,
		 (unsigned long long)rep->active);
}

/* Replica-local activation: when every rank is alive and reports the same
 * active version, that is the replica's active version. */
void trk__replica_update_active(struct trk_registry *r, struct trk_replica *rep)
{
	uint64_t a = 0;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		struct trk_node *n = rep->ranks[i];
		if (n == NULL || !n->alive || n->active == 0)
			return;
		if (i > 0 && n->active != a)
			return;
		a = n->active;
	}
	if (a != 0 && a != rep->active) {
		rep->active = a;
		log_activation(r, rep);
	}
}

json_t *trk__replica_statements(const struct trk_replica *rep, uint64_t v)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; arr != NULL && i < rep->nranks; i++) {
		struct trk_node *n = rep->ranks[i];
		struct trk_nver *e;

		if (!trk__node_holds(n, v) || !n->has_stmt_key ||
		    (e = trk__node_version(n, v)) == NULL || !e->has_sig)
			continue;
		if (json_array_append_new(arr, json_pack("{s:I,s:o,s:o}", "rank", (json_int_t)i,
							 "key",
							 trk__json_hex(n->stmt_key,
								       TRK_STMT_PK_BYTES),
							 "sig",
							 trk__json_hex(e->sig,
								       TRK_STMT_SIG_BYTES))) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	return arr;
}

/* The latest version has parcels of rep's layout (its own or an addendum's). */
static bool latest_covers(struct trk_server *s, const struct trk_replica *rep)
{
	uint64_t v = trk__versions_latest(s->vs);
	const struct proto_manifest *m;
	struct proto_manifest *owned = NULL;
	struct proto_err err = {{0}};
	bool yes;

	if (v == 0 || rep->layout == NULL || trk__versions_manifest(s->vs, v, &m, &owned, &err) != 0)
		return true; /* nothing to say it does not */
	yes = trk__version_layout(s, v, m, rep->layout->digest) != NULL;
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
	return yes;
}

/* Each rank's wire bytes of v in rep's layout (its parcels, the manifest's
 * or an addendum's) into ranks[].want_bytes; false when v or its parcels
 * for the layout are not known here. */
static bool size_ranks(struct trk_server *s, const struct trk_replica *rep, uint64_t v,
		       struct trk_rs_rank *ranks, uint32_t nranks)
{
	const struct proto_manifest *m;
	const struct proto_mlayout *ml;
	struct proto_manifest *owned = NULL;
	struct proto_err err = {{0}};

	if (v == 0 || rep->layout == NULL || trk__versions_manifest(s->vs, v, &m, &owned, &err) != 0)
		return false;
	ml = trk__version_layout(s, v, m, rep->layout->digest);
	for (uint32_t i = 0; ml != NULL && i < ml->nparcels; i++)
		if (ml->parcels[i].dst_rank < nranks)
			ranks[ml->parcels[i].dst_rank].want_bytes += ml->parcels[i].wire_bytes;
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
	return ml != NULL;
}

void trk__replica_state(struct trk_server *s, const struct trk_replica *rep, uint64_t now_ms,
			struct trk_rs_out *out)
{
	/* A replica's ranks on the stack up to a typical tensor-parallel
	 * size; beyond, on the heap (only the first of them without memory). */
	struct trk_rs_rank few[64], *ranks = few;
	uint64_t lag_v;
	struct trk_rs_in in = {
		.latest = trk__versions_latest(s->vs),
		.active = rep->active,
		.target = rep->target,
		.usual_ms = rep->update_ms,
		.grace_ms = proto_param(PROTO_PARAM_UPDATING_MS),
		.stall_ms = proto_param(PROTO_PARAM_NO_PROGRESS_MS),
		.nranks = PROTO_MIN(rep->nranks, PROTO_ARRAY_LEN(few)),
	};

	if (rep->nranks > PROTO_ARRAY_LEN(few) &&
	    (ranks = calloc(rep->nranks, sizeof(*ranks))) != NULL)
		in.nranks = rep->nranks;
	else
		ranks = few;
	in.ranks = ranks;

	trk__replica_lag(s, rep, now_ms, &lag_v, &in.lag_ms);
	for (uint32_t i = 0; i < in.nranks; i++) {
		const struct trk_node *n = rep->ranks[i];
		const struct trk_nver *e = n != NULL && n->last >= 0 ? &n->vers[n->last] : NULL;
		struct trk_rs_rank *k = &ranks[i];

		memset(k, 0, sizeof(*k));
		if (n == NULL)
			continue;
		k->present = true;
		k->alive = n->alive;
		k->id = n->id;
		k->gone_ms = !n->alive && now_ms > n->gone_ms ? now_ms - n->gone_ms : 0;
		k->gone_why = n->alive ? NULL : n->gone_why;
		k->beat_ms = n->beat_ms != 0 && now_ms > n->beat_ms ? now_ms - n->beat_ms : 0;
		k->error = n->error;
		if (e == NULL)
			continue;
		k->reported = true;
		k->state = e->state;
		k->version = e->version;
		k->done = e->done;
		k->total = e->total;
		k->from_trainer = e->from_trainer;
		k->from_peers = e->from_peers;
		k->rate_bps = trk__rate_bps(&e->rate, now_ms);
		k->still_ms = trk__rate_still_ms(&e->rate, now_ms);
		if (n->alive && e->state == TRK_STATE_FETCHING && e->version > in.active)
			in.want_version = PROTO_MAX(in.want_version, e->version);
	}
	/* The version fetched (as rstate.c finds it), sized from its parcels. */
	if (in.want_version == 0)
		in.want_version = in.target != 0 ? in.target : in.latest;
	in.sized = in.want_version > in.active &&
		   size_ranks(s, rep, in.want_version, ranks, in.nranks) && in.nranks == rep->nranks;
	/* Only a replica that lacks the latest asks whether it can have it. */
	in.uncovered = rep->active < in.latest && !latest_covers(s, rep);
	trk__rstate_judge(&in, out);
	if (ranks != few)
		free(ranks);
}

int trk__replica_state_json(struct trk_server *s, const struct trk_replica *rep,
			    uint64_t now_ms, json_t *o)
{
	struct trk_rs_out st;
	int bad = 0;

	trk__replica_state(s, rep, now_ms, &st);
	bad |= trk__set(o, "state", json_string(trk__rstate_name(st.state)));
	bad |= trk__set(o, "why", json_string(st.why));
	/* Unknown is null: a total no rank's report or the version gives, a
	 * rate not measured yet, a finish without both. */
	if (st.fetching != 0)
		bad |= trk__set(o, "fetch",
				json_pack("{s:I,s:I,s:o,s:I,s:I,s:o,s:o,s:I,s:I}", "version",
					  (json_int_t)st.fetching, "bytes_done", (json_int_t)st.done,
					  "bytes_total",
					  st.total != 0 ? trk__jint(st.total) : json_null(),
					  "bytes_from_trainer", (json_int_t)st.from_trainer,
					  "bytes_from_peers", (json_int_t)st.from_peers, "rate_bps",
					  st.rate_bps != 0 ? trk__jint(st.rate_bps) : json_null(),
					  "eta_ms",
					  st.eta_ms == UINT64_MAX ? json_null() :
								    trk__jint(st.eta_ms),
					  "ranks_reporting", (json_int_t)st.reporting, "nranks",
					  (json_int_t)rep->nranks));
	return bad;
}
