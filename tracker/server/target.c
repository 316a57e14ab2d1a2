/* The replica target: the one version all ranks of a replica work toward. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

/*
 * The rule (tracker/API.md, "Replica targets"), evaluated after every report,
 * registration and lease sweep. The target T of a live replica R moves only
 * in these cases, in this order:
 *   1. R is complete (every rank holds it verified or active) at some
 *      version above its active one: T is the newest such version. Ranks
 *      that hold it activate; nothing is ever taken from them.
 *   2. T is not above R's active version (reached, or none yet): T is picked.
 *   3. Something newer than T exists and T is dropped (no publisher serves
 *      it, or its parcels of R's layout, any more) or a live rank reported T failed: T is picked among the
 *      other versions.
 *   4. Something newer than T exists and no live rank has reported T at all
 *      (nobody started on it): T is picked, so a replica that was idle
 *      starts on the newest version instead of an old one.
 *   5. Something newer than T exists, T is a delta that a live rank has
 *      not reported and cannot build (it is not active on T's parent, T's
 *      anchor is no longer served: T is not in the latest version's chain,
 *      and no raw copy of T will be made: only the latest is copied): T is
 *      picked among the other versions. A rank joining late (or restarted)
 *      is so never handed a version it can only refuse.
 * Picking: the newest version above R's active one that some live rank
 * holds verified (and that is neither dropped nor failed there), so a rank
 * that finished a version is not stranded on it; else the latest version.
 * Otherwise T stays, however many versions arrive: once a rank started on
 * T, the replica finishes T before it moves on, so the ranks never chase
 * different versions and a replica slower than the trainer still activates
 * one version per fetch, skipping the ones published meanwhile.
 */

static bool rank_failed(const struct trk_node *n, uint64_t v)
{
	for (size_t i = 0; n != NULL && n->alive && i < n->nvers; i++)
		if (n->vers[i].version == v && n->vers[i].state == TRK_STATE_FAILED)
			return true;
	return false;
}

static bool rank_reported(const struct trk_node *n, uint64_t v)
{
	for (size_t i = 0; n != NULL && n->alive && i < n->nvers; i++)
		if (n->vers[i].version == v)
			return true;
	return false;
}

/* n is active on v: a delta against v builds on what it serves. */
static bool rank_active_on(const struct trk_node *n, uint64_t v)
{
	for (size_t i = 0; n != NULL && n->alive && i < n->nvers; i++)
		if (n->vers[i].version == v && n->vers[i].state == TRK_STATE_ACTIVE)
			return true;
	return false;
}

static bool any_rank(const struct trk_replica *rep, uint64_t v,
		     bool (*pred)(const struct trk_node *, uint64_t))
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (pred(rep->ranks[i], v))
			return true;
	return false;
}

/* No live publisher offers a parcel of v (of layout when not NULL) any more,
 * while one did offer v once; never the latest. */
static bool dropped(struct trk_server *s, uint64_t v, const uint8_t *layout)
{
	struct trk_version *ver = trk__versions_find(s->vs, v);

	if (ver == NULL || !ver->offered || v == trk__versions_latest(s->vs))
		return false;
	for (struct trk_publisher *p = s->reg->pubs; p; p = p->next) {
		if (!p->alive)
			continue;
		for (size_t i = 0; i < p->offers.n; i++) {
			const struct trk_offer_set *os = &p->offers.sets[i];
			if (os->version != v)
				continue;
			for (size_t k = 0; k < os->n; k++)
				if (layout == NULL ||
				    memcmp(os->o[k].layout, layout, PROTO_HASH_BYTES) == 0)
					return false;
		}
	}
	return true;
}

bool trk__version_dropped(struct trk_server *s, uint64_t v)
{
	return dropped(s, v, NULL);
}

bool trk__version_dropped_for(struct trk_server *s, uint64_t v, const uint8_t *layout)
{
	return dropped(s, v, layout);
}

bool trk__version_in_chain(struct trk_server *s, uint64_t v)
{
	struct trk_version *x = trk__versions_find(s->vs, trk__versions_latest(s->vs));

	/* From the latest back along parents while they are deltas: at most
	 * one step per version in the log. */
	for (size_t n = trk__versions_count(s->vs); x != NULL && n > 0; n--) {
		if (x->version == v)
			return true;
		if (x->kind != PROTO_KIND_DELTA || x->version < v)
			return false;
		x = trk__versions_find(s->vs, x->parent);
	}
	return false;
}

bool trk__version_retained(struct trk_server *s, uint64_t v)
{
	if (v == trk__versions_latest(s->vs) || trk__version_in_chain(s, v))
		return true;
	for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next)
		if (rep->target == v && trk__replica_alive(rep))
			return true;
	return false;
}

json_t *trk__version_retain_layouts(struct trk_server *s, uint64_t v)
{
	json_t *a = json_array();

	for (struct trk_replica *rep = s->reg->reps; a != NULL && rep; rep = rep->next) {
		bool seen = false;
		if (rep->target != v || !trk__replica_alive(rep) || rep->layout == NULL)
			continue;
		for (struct trk_replica *q = s->reg->reps; q != rep; q = q->next)
			seen |= q->target == v && trk__replica_alive(q) && q->layout != NULL &&
				memcmp(q->layout->digest, rep->layout->digest, PROTO_HASH_BYTES) == 0;
		if (!seen && json_array_append_new(a, trk__json_hex(rep->layout->digest,
								    PROTO_HASH_BYTES)) != 0) {
			json_decref(a);
			a = NULL;
		}
	}
	return a;
}

/* Rule 5: v (not the latest) is a delta out of the latest's chain that a
 * live rank has no way to: it never reported v and is not active on its
 * parent. */
static bool unreachable(struct trk_server *s, const struct trk_replica *rep, uint64_t v)
{
	const struct trk_version *ver = trk__versions_find(s->vs, v);

	if (ver == NULL || ver->kind != PROTO_KIND_DELTA || v == trk__versions_latest(s->vs) ||
	    trk__version_in_chain(s, v))
		return false;
	for (uint32_t i = 0; i < rep->nranks; i++) {
		const struct trk_node *n = rep->ranks[i];
		if (n != NULL && n->alive && !rank_reported(n, v) && !rank_active_on(n, ver->parent))
			return true;
	}
	return false;
}

/* v is dropped for rep: no live publisher serves v's parcels of its layout. */
static bool rep_dropped(struct trk_server *s, const struct trk_replica *rep, uint64_t v)
{
	return dropped(s, v, rep->layout != NULL ? rep->layout->digest : NULL);
}

static uint64_t pick(struct trk_server *s, const struct trk_replica *rep, uint64_t not)
{
	uint64_t best = 0;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		const struct trk_node *n = rep->ranks[i];
		for (size_t j = 0; n != NULL && n->alive && j < n->nvers; j++) {
			uint64_t v = n->vers[j].version;
			if (n->vers[j].state != TRK_STATE_VERIFIED || v <= rep->active ||
			    v <= best || v == not)
				continue;
			if (!rep_dropped(s, rep, v) && !any_rank(rep, v, rank_failed))
				best = v;
		}
	}
	if (best != 0)
		return best;
	return PROTO_MAX(trk__versions_latest(s->vs), rep->active);
}

/* One line: what each rank holds and what it waits for. */
static void describe(const struct trk_replica *rep, char *out, size_t len)
{
	size_t k = 0;

	out[0] = 0;
	for (uint32_t i = 0; i < rep->nranks && k + 1 < len; i++) {
		const struct trk_node *n = rep->ranks[i];
		const struct trk_nver *e = n != NULL && n->last >= 0 ? &n->vers[n->last] : NULL;
		int w;
		if (n == NULL)
			w = snprintf(out + k, len - k, "%srank %u absent", i ? "; " : "", i);
		else if (!n->alive)
			w = snprintf(out + k, len - k, "%s%s gone", i ? "; " : "", n->id);
		else if (e == NULL)
			w = snprintf(out + k, len - k, "%s%s registered, no report yet",
				     i ? "; " : "", n->id);
		else if (e->state == TRK_STATE_FETCHING)
			w = snprintf(out + k, len - k, "%s%s fetching v%" PRIu64 " (%" PRIu64 "%%)",
				     i ? "; " : "", n->id, e->version,
				     e->total ? e->done * 100 / e->total : 0);
		else if (e->state == TRK_STATE_FAILED)
			w = snprintf(out + k, len - k, "%s%s %s", i ? "; " : "", n->id, n->error);
		else if (e->state == TRK_STATE_VERIFIED)
			w = snprintf(out + k, len - k, "%s%s holds v%" PRIu64 " verified, waits for the other ranks",
				     i ? "; " : "", n->id, e->version);
		else
			w = snprintf(out + k, len - k, "%s%s active on v%" PRIu64, i ? "; " : "",
				     n->id, e->version);
		if (w < 0)
			break;
		k += (size_t)w;
	}
}

/* The newest version a rank holds (verified or active), 0 for none. */
static uint64_t rank_holds(const struct trk_node *n)
{
	uint64_t h = 0;

	for (size_t i = 0; n != NULL && n->alive && i < n->nvers; i++)
		if (n->vers[i].state == TRK_STATE_VERIFIED || n->vers[i].state == TRK_STATE_ACTIVE)
			h = PROTO_MAX(h, n->vers[i].version);
	return h;
}

/* Ranks disagree when they hold different versions; that is normal while a
 * version is being fetched, so it is reported only when it lasts longer than
 * a fetch takes (the replica's last one, at least TESSERA_DISAGREE_MS). */
static void update_disagreement(struct trk_replica *rep, uint64_t now)
{
	uint64_t first = 0, limit;
	bool differ = false;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		uint64_t h = rank_holds(rep->ranks[i]);
		if (i == 0)
			first = h;
		differ |= h != first;
	}
	if (!differ || !trk__replica_alive(rep)) {
		if (rep->disagree_logged)
			LOG_INFO("replica %s: ranks agree again (active v%" PRIu64 ", target v%" PRIu64 ")",
				 rep->name, rep->active, rep->target);
		rep->disagree_ms = 0;
		rep->disagree_logged = false;
		rep->why[0] = 0;
		return;
	}
	if (rep->disagree_ms == 0)
		rep->disagree_ms = now;
	describe(rep, rep->why, sizeof(rep->why));
	limit = PROTO_MAX(proto_param(PROTO_PARAM_DISAGREE_MS), rep->fetch_ms);
	if (!rep->disagree_logged && now - rep->disagree_ms > limit) {
		rep->disagree_logged = true;
		LOG_WARN("replica %s: ranks hold different versions for %" PRIu64
			 " ms (target v%" PRIu64 "): %s",
			 rep->name, now - rep->disagree_ms, rep->target, rep->why);
	}
}

void trk__replica_update_target(struct trk_server *s, struct trk_replica *rep)
{
	uint64_t latest = trk__versions_latest(s->vs), t = rep->target, list[TRK__NODE_VERSIONS];
	size_t k;
	const char *why = NULL;

	update_disagreement(rep, proto_wall_ms());
	if (!trk__replica_alive(rep))
		return;
	k = trk__replica_complete_list(rep, list);
	if (k > 0 && list[k - 1] > rep->active) {
		if (t != list[k - 1])
			why = "complete there";
		t = list[k - 1];
	} else if (t <= rep->active) {
		t = pick(s, rep, 0);
		why = "reached the previous one";
	} else if (latest > t && (rep_dropped(s, rep, t) || any_rank(rep, t, rank_failed))) {
		why = rep_dropped(s, rep, t) ? "the publisher dropped the old one" :
						   "a rank failed the old one";
		t = pick(s, rep, t);
	} else if (latest > t && !any_rank(rep, t, rank_reported)) {
		t = pick(s, rep, t);
		why = "no rank had started on the old one";
	} else if (latest > t && unreachable(s, rep, t)) {
		t = pick(s, rep, t);
		why = "a rank cannot build the old one: its chain is no longer served";
	}
	if (t == rep->target)
		return;
	if (t > rep->active || rep->target != 0)
		LOG_INFO("replica %s: target v%" PRIu64 " -> v%" PRIu64 " (%s; active v%" PRIu64
			 ", latest v%" PRIu64 ")",
			 rep->name, rep->target, t, why ? why : "-", rep->active, latest);
	rep->target = t;
	rep->target_ms = proto_wall_ms();
}

void trk__replica_lag(struct trk_server *s, const struct trk_replica *rep, uint64_t now_ms,
		      uint64_t *versions, uint64_t *ms)
{
	uint64_t latest = trk__versions_latest(s->vs);
	struct trk_version *next;

	*versions = *ms = 0;
	if (rep->active >= latest)
		return;
	*versions = latest - rep->active;
	next = trk__versions_find(s->vs, rep->active + 1);
	uint64_t since = PROTO_MAX(next != NULL ? next->published_ms : 0, rep->created_ms);
	*ms = now_ms > since ? now_ms - since : 0;
}
