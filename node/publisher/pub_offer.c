/* What the tracker is offered: offers, withdrawals and the retention check deciding them. */
#include "node/publisher/pub_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t newest_version(const struct node_pub *p)
{
	uint64_t v = 0;
	for (const struct pub_version *pv = p->versions; pv; pv = pv->next)
		v = PROTO_MAX(v, pv->version);
	return v;
}

/* ---- offers ------------------------------------------------------------------- */

static bool layouts_to_drop(const struct pub_version *pv)
{
	for (size_t li = 0; li < pv->nlayouts; li++)
		if (pv->layouts[li].state == PUB_L_DROP)
			return true;
	return false;
}

/* The offers of pv's layouts still served, into a new array (*out, free()
 * it); layouts to drop are marked as being withdrawn by this offer. */
static int offers_live(struct pub_version *pv, struct trk_offer **out, size_t *n)
{
	*n = 0;
	*out = malloc(PROTO_MAX(pv->noffers, 1) * sizeof(**out));
	if (*out == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < pv->noffers; i++)
		if (pv->layouts[pv->offer_li[i]].state == PUB_L_SERVED)
			(*out)[(*n)++] = pv->offers[i];
	for (size_t li = 0; li < pv->nlayouts; li++)
		if (pv->layouts[li].state == PUB_L_DROP)
			pv->layouts[li].state = PUB_L_WITHDRAW;
	return 0;
}

static void on_offer(const struct trk_answer *a, void *arg)
{
	struct pub_version *pv = arg;
	struct node_pub *p = pv->p;
	int ok;

	if (pv->releasing) {
		pv->so.busy = false;
		if (a->status < 200 || a->status >= 300)
			LOG_INFO("withdrawing version %llu: %s (freed anyway)",
				 (unsigned long long)pv->version, a->error);
		node__pub_version_unlink(p, pv);
		node__pub_version_free(p, pv);
		return;
	}
	ok = node_serve_offer_done(&pv->so, a, p->reg_gen, "offering");
	/* Layouts this offer left out are withdrawn (as with a version, also
	 * when the answer is an error: nobody aims at them). */
	for (size_t li = 0; li < pv->nlayouts; li++)
		if (pv->layouts[li].state == PUB_L_WITHDRAW)
			node__pub_layout_free(pv, li);
	if (ok == 1) {
		pv->so.offered = pv->so.gen == p->reg_gen && !layouts_to_drop(pv);
		LOG_INFO("offered version %llu: %zu parcels", (unsigned long long)pv->version,
			 pv->nsent);
	} else if (ok == 0) {
		/* Only an answer about the current registration says it is gone. */
		p->registered = false;
		node__pub_register(p);
	}
	if (p->ex != NULL && p->ex->pv == pv)
		node__pub_ex_step(p);
	else if (layouts_to_drop(pv))
		node__pub_sync_offers(p); /* marked while the offer was in flight */
}

/* The first version of the newest chain served: the newest anchor when
 * every version from it to the newest is served and a delta; else
 * UINT64_MAX (no chain). */
static uint64_t chain_start(const struct node_pub *p, uint64_t newest)
{
	uint64_t v = newest;

	for (;;) {
		const struct pub_version *pv = NULL;
		for (const struct pub_version *q = p->versions; q; q = q->next)
			if (q->version == v && !q->releasing)
				pv = q;
		if (pv == NULL || v == 0)
			return UINT64_MAX;
		if (!pv->delta)
			return v;
		v--;
	}
}

/* Keeps at most TESSERA_PUB_RETAIN versions: the newest and the one being
 * exported always; beyond those the oldest go first, those the tracker did
 * not list as retained (no replica aims at them) before those it did. The
 * tracker then lists them dropped and replicas aiming at them retarget.
 * The newest chain (its anchor and the deltas after it, which nodes that
 * lack a parent replay) is kept besides, whole: at most anchor_every
 * versions, whose deltas add up to less than the anchor (pub_delta.c). */
static void cap_retained(struct node_pub *p, uint64_t newest)
{
	uint64_t cap = PROTO_MAX(proto_param(PROTO_PARAM_PUB_RETAIN), 1), kept = 0;
	uint64_t chain = chain_start(p, newest);

	for (;;) {
		struct pub_version *oldest = NULL;
		kept = 0;
		for (struct pub_version *pv = p->versions; pv; pv = pv->next) {
			if (pv->releasing || (pv->version >= chain && pv->version <= newest))
				continue;
			kept++;
			if (pv->version == newest || (p->ex != NULL && p->ex->pv == pv))
				continue;
			if (oldest == NULL || (oldest->wanted && !pv->wanted) ||
			    (oldest->wanted == pv->wanted && pv->version < oldest->version))
				oldest = pv;
		}
		if (kept <= cap || oldest == NULL)
			return;
		LOG_INFO("version %llu dropped: serving at most %llu versions (TESSERA_PUB_RETAIN)",
			 (unsigned long long)oldest->version, (unsigned long long)cap);
		oldest->releasing = true;
	}
}

void node__pub_sync_offers(struct node_pub *p)
{
	struct pub_version *pv, *next;

	cap_retained(p, newest_version(p));
	for (pv = p->versions; pv; pv = next) {
		int rc;
		next = pv->next;
		if (pv->so.busy)
			continue;
		if (pv->releasing && !p->registered) {
			node__pub_version_unlink(p, pv);
			node__pub_version_free(p, pv);
			continue;
		}
		if (!p->registered) {
			/* The tracker lists none of our offers now: free at once. */
			for (size_t li = 0; li < pv->nlayouts; li++)
				if (pv->layouts[li].state == PUB_L_DROP)
					node__pub_layout_free(pv, li);
			continue;
		}
		if (p->dead || (pv->so.offered && !pv->releasing && !layouts_to_drop(pv)))
			continue;
		if (pv->releasing) {
			rc = node_serve_offer_send(p->trk, p->id, &pv->so, p->reg_gen, 0, NULL, NULL,
						   0, NULL, on_offer, pv);
		} else {
			struct trk_offer *live;
			if ((rc = offers_live(pv, &live, &pv->nsent)) == 0) {
				rc = node_serve_offer_send(p->trk, p->id, &pv->so, p->reg_gen,
							   pv->snapshot_ms,
							   pv->has_report ? &pv->report : NULL,
							   live, pv->nsent, NULL, on_offer, pv);
				free(live);
			}
			if (rc != 0) /* not sent: try the drop again next time */
				for (size_t li = 0; li < pv->nlayouts; li++)
					if (pv->layouts[li].state == PUB_L_WITHDRAW)
						pv->layouts[li].state = PUB_L_DROP;
		}
		if (rc != 0)
			LOG_WARN("offering version %llu: %s", (unsigned long long)pv->version,
				 strerror(-rc));
	}
}

/* ---- retention ---------------------------------------------------------------- */

/* A retained version's layouts that no replica of them aims at are
 * dropped; when none is left the whole version goes. */
static void drop_layouts(struct pub_version *pv, const struct trk_version_info *info)
{
	size_t served = 0;
	char h[2 * PROTO_HASH_BYTES + 1];

	for (size_t li = 0; li < pv->nlayouts && !info->all_layouts; li++) {
		struct pub_vlayout *l = &pv->layouts[li];
		bool aimed = false;
		if (l->state != PUB_L_SERVED)
			continue;
		for (uint32_t k = 0; k < info->nlayouts; k++)
			aimed |= memcmp(info->layouts[k], l->digest, PROTO_HASH_BYTES) == 0;
		if (aimed) {
			served++;
			continue;
		}
		sodium_bin2hex(h, sizeof(h), l->digest, PROTO_HASH_BYTES);
		LOG_INFO("version %llu layout %.16s: no replica of it aims there: withdrawing it",
			 (unsigned long long)pv->version, h);
		l->state = PUB_L_DROP;
	}
	if (!info->all_layouts && served == 0 && pv->nlayouts > 0)
		pv->releasing = true;
}

static void on_check_answer(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0, newest = newest_version(p);
	size_t n = 0;

	p->check_busy = false;
	if (p->check_again) { /* a replica came alive after this was asked */
		p->check_again = false;
		node__pub_on_check(-1, 0, p);
	}
	/* A node could not build a delta: the next export is an anchor. */
	if (a->status == 200 && json_is_true(json_object_get(a->json, "anchor_wanted")))
		p->anchor_wanted = true;
	if (a->status == 200 && trk_versions_parse(a->json, &latest, &vi, &n, &err) == 0) {
		for (struct pub_version *pv = p->versions; pv; pv = pv->next) {
			bool all = pv->version == newest || (p->ex != NULL && p->ex->pv == pv);
			const struct trk_version_info *info = NULL;
			pv->wanted = false;
			for (size_t i = 0; i < n; i++)
				if (vi[i].version == pv->version && vi[i].retain) {
					pv->wanted = true;
					info = &vi[i];
				}
			if (!all && !pv->wanted && !pv->releasing) {
				LOG_INFO("version %llu is no longer needed: withdrawing it",
					 (unsigned long long)pv->version);
				pv->releasing = true;
			}
			if (!all && info != NULL && !pv->releasing && info->version != latest)
				drop_layouts(pv, info);
		}
		if (node__pub_addendum_check(p, vi, n, latest))
			node__pub_ex_start(p, NULL, latest, false);
		free(vi);
	} else {
		LOG_DEBUG("retain check: %s", a->status == 200 ? err.msg : a->error);
	}
	node__pub_sync_offers(p);
	node__pub_ex_step(p); /* an export may wait for this answer */
}

static void watch_layouts(struct node_pub *p);

/* The tracker says a replica came alive (or a version was published, or
 * the wait ended): check at once, and watch again. A failure waits for
 * the next periodic check, which watches again. */
static void on_layouts_watch(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	json_t *rev = a->status == 200 ? json_object_get(a->json, "layouts_rev") : NULL;
	json_t *latest = a->status == 200 ? json_object_get(a->json, "latest") : NULL;

	p->lw_busy = false;
	if (!json_is_integer(rev) || !json_is_integer(latest))
		return;
	bool moved = (uint64_t)json_integer_value(rev) != p->lw_rev ||
		     (uint64_t)json_integer_value(latest) != p->lw_after;
	p->lw_rev = (uint64_t)json_integer_value(rev);
	p->lw_after = (uint64_t)json_integer_value(latest);
	if (moved) {
		if (p->check_busy)
			p->check_again = true;
		else
			node__pub_on_check(-1, 0, p);
	}
	watch_layouts(p);
}

/* Only the leader extends versions (pub_addendum.c): it learns of a new
 * replica from a held watch, not from the next periodic check. */
static void watch_layouts(struct node_pub *p)
{
	if (!p->leader || p->lw_busy || !p->registered || p->dead)
		return;
	if (trk_client_watch_layouts(p->trk, p->lw_after, p->lw_rev,
				     (uint32_t)proto_param(PROTO_PARAM_WATCH_MS), on_layouts_watch,
				     p) == 0)
		p->lw_busy = true;
}

void node__pub_on_check(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	watch_layouts(p);
	if (!p->registered || p->check_busy || p->dead || p->versions == NULL)
		return;
	if (trk_client_watch(p->trk, 0, 0, on_check_answer, p) == 0)
		p->check_busy = true;
}
