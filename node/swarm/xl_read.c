/* Cross-layout holders: chunks assembled from the slots of replicas of other
 * layouts (complete, or partial while they fetch), read window by window,
 * then verified like any chunk (node/swarm/NOTES.md, "Cross-layout"). */
#include "node/swarm/swarm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/base/fabloop.h"

struct swarm_xl *swarm__xl_get(struct swarm *sw)
{
	if (sw->xl == NULL)
		sw->xl = calloc(1, sizeof(*sw->xl));
	return sw->xl;
}

static bool xl_refresh(struct swarm *sw, bool early);
static void ask_holders(struct swarm *sw, uint64_t now);

static void holder_drop(struct swarm *sw, struct xl_holder *h)
{
	for (uint32_t r = 0; r < h->nranks; r++) {
		if (h->ranks[r].fa_valid && sw->x->o.fab != NULL)
			fab_av_remove(sw->x->o.fab, h->ranks[r].fa);
		free(h->ranks[r].info.fabric_addr);
	}
	free(h->ranks);
	free(h->hv_off);
	uint32_t epoch = h->epoch + 1, live = h->hv_live;
	/* Have-map reads still in flight land in the entry's part of x->hv:
	 * it is not reused before they are back (take_holder). */
	*h = (struct xl_holder){.epoch = epoch, .hv_live = live};
}

static bool holder_banned(const struct fetch *f, const struct xl_holder *h)
{
	if (fetch_banned(f, h->replica))
		return true;
	for (uint32_t r = 0; r < h->nranks; r++)
		if (fetch_banned(f, h->ranks[r].info.id))
			return true;
	return false;
}

/* A holder delivering nothing this long with reads in flight is silent:
 * like a publisher (a chunk needs all its reads, which share our link with
 * the other holders'), three times TESSERA_STALL_MS before it delivered
 * anything, then four times what its bytes in flight take at its rate. */
static bool holder_silent(const struct xl_holder *h, uint64_t now)
{
	uint64_t stall = proto_param(PROTO_PARAM_STALL_MS), pat;

	if (h->pace.inflight_reads == 0)
		return false;
	pat = h->pace.rate == 0 ? 3 * stall
				: PROTO_MAX(stall, 4 * h->pace.inflight_bytes * 1000 / h->pace.rate);
	return now - h->pace.progress_ms >= pat;
}

static bool holder_usable(struct swarm *sw, const struct xl_holder *h, uint64_t now)
{
	const struct swarm_xl *x = sw->xl;

	if (!h->used || !h->listed || x->lays[h->lay].state != 1 || h->bad_until_ms > now ||
	    holder_silent(h, now) || holder_banned(sw->x->f, h) ||
	    (h->partial && (!h->hv_fits || !h->hv_ready)))
		return false;
	for (uint32_t r = 0; r < h->nranks; r++)
		if (h->ranks[r].bad_until_ms > now)
			return false;
	return true;
}

static bool holder_room(struct swarm *sw, const struct xl_holder *h, uint64_t len)
{
	return h->pace.inflight_reads == 0 ||
	       h->pace.inflight_bytes + len <= fetch_source_window(sw->x, &h->pace);
}

static void on_layouts(const struct trk_answer *ans, void *arg);

/* The layout entry for digest, added (to be read) if new; NULL when full. */
static struct xl_layout *layout_for(struct swarm *sw, const uint8_t *digest)
{
	struct swarm_xl *x = sw->xl;

	for (uint32_t i = 0; i < x->nlays; i++)
		if (memcmp(x->lays[i].digest, digest, PROTO_HASH_BYTES) == 0)
			return &x->lays[i];
	if (x->nlays == XL_LAYOUTS_MAX)
		return NULL;
	struct xl_layout *l = &x->lays[x->nlays++];
	memcpy(l->digest, digest, PROTO_HASH_BYTES);
	return l;
}

static void poll_have(struct swarm *sw, struct xl_holder *h, uint64_t now);

/* Takes one holder of a /holders answer (hostile: every field checked). */
static void take_holder(struct swarm *sw, json_t *e, size_t i)
{
	struct swarm_xl *x = sw->xl;
	const char *name = json_string_value(json_object_get(e, "replica"));
	const char *lhex = json_string_value(json_object_get(e, "layout"));
	json_int_t nranks = json_integer_value(json_object_get(e, "nranks"));
	uint8_t digest[PROTO_HASH_BYTES];
	struct trk_source *s = NULL;
	struct proto_err err;
	size_t n = 0;

	if (name == NULL || name[0] == 0 || strlen(name) >= TRK_ID_MAX || lhex == NULL ||
	    proto_parse_hex(lhex, digest, sizeof(digest)) != 0 || nranks < 1 ||
	    nranks > XL_RANKS_MAX || trk_sources_parse(e, &s, &n, &err) != 0 ||
	    n != (size_t)nranks) {
		LOG_DEBUG("node %s: holders[%zu]: malformed; skipped", sw->x->o.id, i);
		trk_sources_free(s, n);
		return;
	}
	struct xl_layout *l = layout_for(sw, digest);
	if (l == NULL || l->state < 0) {
		trk_sources_free(s, n);
		return;
	}
	/* The same holder as before (same replica, same keys): keep it. */
	struct xl_holder *h = NULL, *free_h = NULL;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		struct xl_holder *o = &x->hs[k];
		if (!o->used) {
			if (o->hv_live == 0)
				free_h = free_h != NULL ? free_h : o;
			continue;
		}
		if (strcmp(o->replica, name) != 0)
			continue;
		bool same = o->nranks == n && o->lay == (uint32_t)(l - x->lays);
		for (uint32_t r = 0; same && r < n; r++)
			same = o->ranks[r].info.key == s[r].key && o->ranks[r].info.addr == s[r].addr &&
			       o->ranks[r].info.fabric_addr_len == s[r].fabric_addr_len &&
			       memcmp(o->ranks[r].info.fabric_addr, s[r].fabric_addr, s[r].fabric_addr_len) == 0;
		if (same) {
			h = o;
			break;
		}
		holder_drop(sw, o); /* it offers anew: start afresh */
		if (o->hv_live == 0)
			free_h = free_h != NULL ? free_h : o;
	}
	if (h != NULL || free_h == NULL) {
		if (h != NULL) {
			/* The same memory: a partial rank may have become complete. */
			bool partial = false;
			for (uint32_t r = 0; r < h->nranks; r++) {
				h->ranks[r].info.partial = s[r].partial;
				h->ranks[r].info.have_addr = s[r].have_addr;
				h->ranks[r].info.have_key = s[r].have_key;
				partial |= s[r].partial;
			}
			h->partial = partial;
			if (partial && h->hv_off == NULL)
				h->hv_fits = false; /* complete before: no room laid out for maps */
			h->listed = true;
		}
		trk_sources_free(s, n);
		return;
	}
	h = free_h;
	if ((h->ranks = calloc(n, sizeof(*h->ranks))) == NULL) {
		trk_sources_free(s, n);
		return;
	}
	h->used = h->listed = true;
	snprintf(h->replica, sizeof(h->replica), "%s", name);
	h->lay = (uint32_t)(l - x->lays);
	h->nranks = (uint32_t)n;
	h->pace = (struct fetch_source){.info.peer = true};
	for (size_t r = 0; r < n; r++)
		h->ranks[r].info = s[r]; /* takes the fabric address */
	free(s);
	h->grew_ms = node_now_ms();
	h->hv_fits = true;
	for (uint32_t r = 0; r < h->nranks; r++)
		h->partial |= h->ranks[r].info.partial;
	if (h->partial && (h->hv_off = calloc(h->nranks + 1, sizeof(*h->hv_off))) != NULL) {
		for (uint32_t r = 0; r < h->nranks; r++)
			h->hv_off[r + 1] = h->hv_off[r] + proto_xmap_have_len(h->ranks[r].info.len);
		h->hv_fits = h->hv_off[h->nranks] <= XL_HV_MAX;
	} else if (h->partial) {
		h->hv_fits = false;
	}
	x->cov_gen++;
	poll_have(sw, h, node_now_ms());
}

/* Takes /holders "fetching" (hostile: malformed entries are skipped):
 * replicas of other layouts working toward the version that offer no slot
 * yet, each remembered with when it was first listed. */
static void take_fetching(struct swarm *sw, json_t *list)
{
	struct swarm_xl *x = sw->xl;
	uint64_t now = node_now_ms();
	json_t *e;
	size_t i;

	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
		x->fetching[k].listed = false;
	json_array_foreach(list, i, e) {
		const char *name = json_string_value(json_object_get(e, "replica"));
		const char *lhex = json_string_value(json_object_get(e, "layout"));
		json_int_t nranks = json_integer_value(json_object_get(e, "nranks"));
		uint8_t digest[PROTO_HASH_BYTES];
		struct xl_fetching *q = NULL;
		if (name == NULL || name[0] == 0 || strlen(name) >= TRK_ID_MAX || lhex == NULL ||
		    proto_parse_hex(lhex, digest, sizeof(digest)) != 0 || nranks < 1 ||
		    nranks > XL_RANKS_MAX)
			continue;
		for (uint32_t k = 0; k < XL_FETCHING_MAX && q == NULL; k++)
			if (x->fetching[k].since_ms != 0 && strcmp(x->fetching[k].replica, name) == 0 &&
			    memcmp(x->fetching[k].digest, digest, PROTO_HASH_BYTES) == 0)
				q = &x->fetching[k];
		for (uint32_t k = 0; k < XL_FETCHING_MAX && q == NULL; k++)
			if (x->fetching[k].since_ms == 0) {
				q = &x->fetching[k];
				*q = (struct xl_fetching){.since_ms = now, .nranks = (uint32_t)nranks};
				snprintf(q->replica, sizeof(q->replica), "%s", name);
				memcpy(q->digest, digest, PROTO_HASH_BYTES);
			}
		if (q != NULL)
			q->listed = true;
	}
	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
		if (!x->fetching[k].listed)
			x->fetching[k].since_ms = 0; /* it offers now, or stopped */
}

struct xl_req {
	struct swarm *sw;
	uint64_t gen;
};

static void on_holders(const struct trk_answer *ans, void *arg)
{
	struct xl_req *req = arg;
	struct swarm *sw = req->sw;
	struct swarm_xl *x = sw->xl;
	bool stale = req->gen != sw->x->gen || sw->x->f == NULL;
	json_t *list, *e;
	size_t i;

	free(req);
	x->pending = false;
	x->answered |= !stale;
	if (stale || ans->status != 200 || !json_is_array(list = json_object_get(ans->json, "holders"))) {
		if (!stale && ans->status != 200)
			LOG_DEBUG("node %s: holders: %s", sw->x->o.id, ans->error);
		return;
	}
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		x->hs[k].listed = false;
	json_array_foreach(list, i, e) {
		if (i == XL_HOLDERS_MAX)
			break;
		take_holder(sw, e, i);
	}
	take_fetching(sw, json_object_get(ans->json, "fetching"));
	bool want = false;
	for (uint32_t k = 0; k < x->nlays; k++)
		want |= x->lays[k].state == 0;
	if (want && !x->lays_pending && trk_client_layouts(sw->x->o.trk, on_layouts, sw) == 0) {
		x->lays_pending = true;
		for (uint32_t k = 0; k < x->nlays; k++)
			x->lays[k].asked |= x->lays[k].state == 0;
	}
	fetch_pump(sw->x);
}

/* Makes layout l ready: parsed from its explicit form, its digest checked,
 * planned into ours, our rank's map built. */
static void layout_ready(struct swarm *sw, struct xl_layout *l, json_t *form)
{
	struct proto_plan hp;
	struct proto_err err;
	char hex[17];

	sodium_bin2hex(hex, sizeof(hex), l->digest, 8);
	if (proto_layout_from_json(sw->o.model, form, "holder layout", &l->l, &err) != 0) {
		LOG_WARN("node %s: holder layout %s: %s; not used", sw->x->o.id, hex, err.msg);
		l->state = -1;
		return;
	}
	/* A layout that serves other bytes (FP8 against BF16, or another
	 * quantization) holds nothing of ours. */
	if (memcmp(proto_layout_model(sw->o.model, &l->l)->digest,
		   proto_layout_model(sw->o.model, sw->x->o.layout)->digest, PROTO_HASH_BYTES) != 0) {
		LOG_DEBUG("node %s: holder layout %s serves another model (FP8 or not); not used",
			  sw->x->o.id, hex);
		proto_layout_fini(&l->l);
		l->state = -1;
		return;
	}
	if (memcmp(l->l.digest, l->digest, PROTO_HASH_BYTES) != 0 ||
	    proto_layout_check_complete(sw->o.model, &l->l, &err) != 0 ||
	    proto_plan_build(sw->o.model, &l->l, sw->x->o.layout, &hp, &err) != 0) {
		if (memcmp(l->l.digest, l->digest, PROTO_HASH_BYTES) != 0)
			snprintf(err.msg, sizeof(err.msg), "its form has another digest");
		LOG_WARN("node %s: holder layout %s: %s; not used", sw->x->o.id, hex, err.msg);
		proto_layout_fini(&l->l);
		l->state = -1;
		return;
	}
	int rc = proto_xmap_build(&hp, &l->l, sw->x->o.layout, sw->x->o.rank, &l->map, &err);
	proto_plan_fini(&hp);
	if (rc != 0) {
		LOG_WARN("node %s: holder layout %s: %s; not used", sw->x->o.id, hex, err.msg);
		proto_layout_fini(&l->l);
		l->state = -1;
		return;
	}
	l->state = 1;
	LOG_DEBUG("node %s: holder layout %s: %" PRIu64 " spans for rank %u", sw->x->o.id, hex,
		  l->map.nspans, sw->x->o.rank);
}

static void on_layouts(const struct trk_answer *ans, void *arg)
{
	struct swarm *sw = arg;
	struct swarm_xl *x = sw->xl;
	json_t *list, *e;
	size_t i;

	x->lays_pending = false;
	list = ans->status == 200 ? json_object_get(ans->json, "layouts") : NULL;
	json_array_foreach(list, i, e) {
		const char *hex = json_string_value(json_object_get(e, "digest"));
		uint8_t d[PROTO_HASH_BYTES];
		if (hex == NULL || proto_parse_hex(hex, d, sizeof(d)) != 0)
			continue;
		for (uint32_t k = 0; k < x->nlays; k++)
			if (x->lays[k].state == 0 && memcmp(x->lays[k].digest, d, PROTO_HASH_BYTES) == 0)
				layout_ready(sw, &x->lays[k], json_object_get(e, "layout"));
	}
	/* Asked and not answered: not waited for again (never used). */
	for (uint32_t k = 0; k < x->nlays; k++)
		if (x->lays[k].state == 0 && x->lays[k].asked)
			x->lays[k].state = -1;
	fetch_pump(sw->x);
}

/* ---- reads ------------------------------------------------------------------- */

static int post_window(struct swarm *sw, struct xl_read *xr, struct xl_op *op);

/* All of a chunk's reads are back: its pieces go from staging into its
 * bounce slot, and the read takes the common path (fetch_read_landed). */
static void xl_finish(struct swarm *sw, struct xl_read *xr)
{
	struct swarm_xl *x = sw->xl;
	struct fetch_read *rd = xr->rd;
	struct xl_holder *h = &x->hs[xr->holder];
	int status = xr->status;

	if (status == 0) {
		uint8_t *out = sw->x->bounce + (size_t)rd->slot * sw->x->chunk_size;
		const uint8_t *st = x->stage + (size_t)xr->stage * x->stage_slot;
		for (size_t i = 0; i < xr->npcs; i++) {
			const struct proto_xpiece *q = &xr->pcs[i];
			memcpy(out + q->out, st + q->at, q->len);
		}
	}
	if (h->used && h->epoch == xr->epoch && rd->gen == sw->x->gen) {
		fetch_source_done(&h->pace, rd->len, status == 0);
		if (status != 0 && status != -ECANCELED)
			h->bad_until_ms = node_now_ms() + BAD_SOURCE_MS;
	}
	free(xr->pcs);
	free(xr->wins);
	xr->pcs = NULL;
	xr->wins = NULL;
	xr->busy = false;
	fetch_read_landed(rd, status);
}

static void on_window(struct fab_op *op, int status)
{
	struct xl_op *xo = proto_container_of(op, struct xl_op, op);
	struct xl_read *xr = xo->xr;
	struct swarm *sw = xr->sw;
	struct swarm_xl *x = sw->xl;
	struct xl_holder *h = &x->hs[xr->holder];
	bool ours = h->used && h->epoch == xr->epoch;

	xr->live--;
	if (status == 0 && ours)
		h->pace.progress_ms = node_now_ms(); /* a chunk of many reads is not silent */
	if (status != 0 && xr->status == 0) {
		xr->status = status;
		if (ours && status != -ECANCELED) {
			LOG_DEBUG("node %s: holder %s rank %u: read failed: %d", sw->x->o.id, h->replica,
				  xr->wins[xo->win].rank, status);
			fetch_source_failed(sw->x, &h->ranks[xr->wins[xo->win].rank]);
		}
	}
	if (xr->status == 0 && xr->next < xr->nwins) {
		/* More of the chunk to read: only for the fetch it belongs to,
		 * from the holder it was planned on. */
		int rc = !ours || xr->rd->abandoned || xr->rd->gen != sw->x->gen || sw->x->f == NULL
				 ? -ECANCELED
				 : post_window(sw, xr, xo);
		if (rc == 0)
			return;
		xr->status = rc;
	}
	if (xr->live > 0)
		return;
	xl_finish(sw, xr);
}

static int post_window(struct swarm *sw, struct xl_read *xr, struct xl_op *op)
{
	struct swarm_xl *x = sw->xl;
	struct xl_holder *h = &x->hs[xr->holder];
	const struct proto_xwin *w = &xr->wins[xr->next];
	struct fetch_source *s = &h->ranks[w->rank];
	int rc;

	if (!fetch_source_ready(sw->x, s, node_now_ms()))
		return -EHOSTUNREACH;
	struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
	size_t at = (size_t)xr->stage * x->stage_slot + w->stage;
	op->xr = xr;
	op->win = xr->next;
	if (w->nsegs == 1) {
		rc = fab_read(sw->x->o.fab, &op->op, x->stage_mr, at, w->len, s->fa, &rk, w->segs[0].src,
			      on_window);
	} else {
		for (uint32_t k = 0; k < w->nsegs; k++)
			op->segs[k] = (struct fab_seg){w->segs[k].src, w->segs[k].len};
		rc = fab_readv(sw->x->o.fab, &op->op, x->stage_mr, at, s->fa, &rk, op->segs, w->nsegs,
			       on_window);
	}
	if (rc != 0) {
		fetch_source_failed(sw->x, s);
		return rc;
	}
	if (sw->x->f != NULL && sw->x->f->su.read == 0) /* start-up line: reads from a holder */
		sw->x->f->su.read = proto_wall_ms();
	xr->next++;
	xr->live++;
	return 0;
}

/* ---- partial holders: their have-maps, and who leads ------------------------ */

static void on_have_map(struct fab_op *op, int status)
{
	struct xl_hvop *ho = proto_container_of(op, struct xl_hvop, op);
	struct swarm *sw = ho->sw;
	struct swarm_xl *x = sw->xl;
	struct xl_holder *h = &x->hs[ho->holder];

	h->hv_live--;
	if (!h->used || h->epoch != ho->epoch)
		return; /* the entry was dropped (or reused once every read was back) */
	if (status != 0) {
		h->hv_bad++;
		if (status != -ECANCELED)
			h->bad_until_ms = node_now_ms() + BAD_SOURCE_MS;
	}
	if (h->hv_live > 0)
		return;
	if (h->hv_bad == 0) {
		const uint8_t *m = x->hv + (size_t)(h - x->hs) * XL_HV_MAX;
		uint64_t set = 0;
		for (uint64_t b = 0; b < h->hv_off[h->nranks]; b++)
			set += m[b] != 0;
		if (set > h->hv_set) {
			h->hv_set = set;
			h->grew_ms = node_now_ms();
			x->cov_gen++;
		}
		h->hv_ready = true;
		/* The start-up line's first have-page: a holder's map. */
		if (sw->x->f != NULL && sw->x->f->su.have == 0)
			sw->x->f->su.have = proto_wall_ms();
	}
	fetch_pump(sw->x);
}

/* Reads every rank's have-map of partial holder h (one read each), at most
 * every TESSERA_HAVE_POLL_MS and one poll at a time. Each map only grows
 * while the holder's registration lasts (a new registration is a new key,
 * a new holder entry), so a map read in place is never ahead of its slot. */
static void poll_have(struct swarm *sw, struct xl_holder *h, uint64_t now)
{
	struct swarm_xl *x = sw->xl;
	uint32_t k = (uint32_t)(h - x->hs);

	if (!h->used || !h->listed || !h->partial || !h->hv_fits || h->hv_live > 0 ||
	    h->bad_until_ms > now || holder_banned(sw->x->f, h) || x->hv == NULL ||
	    now - h->hv_ms < proto_param(PROTO_PARAM_HAVE_POLL_MS))
		return;
	h->hv_ms = now;
	h->hv_bad = 0;
	for (uint32_t r = 0; r < h->nranks; r++) {
		struct fetch_source *rs = &h->ranks[r];
		uint64_t nb = h->hv_off[r + 1] - h->hv_off[r];
		uint8_t *m = x->hv + (size_t)k * XL_HV_MAX + h->hv_off[r];
		if (!rs->info.partial) { /* complete: every block is there */
			memset(m, 1, nb);
			continue;
		}
		struct xl_hvop *ho = &x->hvops[k][r];
		struct fab_rkey rk = {rs->info.have_addr, rs->info.have_key, nb};
		*ho = (struct xl_hvop){.sw = sw, .holder = k, .epoch = h->epoch};
		if (!fetch_source_ready(sw->x, rs, now) ||
		    fab_read(sw->x->o.fab, &ho->op, x->hv_mr, (size_t)k * XL_HV_MAX + h->hv_off[r], nb, rs->fa,
			     &rk, 0, on_have_map) != 0) {
			h->hv_bad++;
			h->bad_until_ms = now + BAD_SOURCE_MS;
			break;
		}
		h->hv_live++;
	}
	node_fabloop_kick(sw->x->o.fl);
}

/* Layout (nranks, digest) leads ours for the trainer's bytes: more ranks
 * (more uplinks to relay from), then the lower digest. */
static bool leads(const struct swarm *sw, uint32_t nranks, const uint8_t *digest)
{
	if (nranks != sw->x->o.layout->nranks)
		return nranks > sw->x->o.layout->nranks;
	return memcmp(digest, sw->x->o.layout->digest, PROTO_HASH_BYTES) < 0;
}

static bool replica_banned(const struct fetch *f, const char *name)
{
	size_t n = strlen(name);

	if (fetch_banned(f, name))
		return true;
	for (uint32_t i = 0; i < f->nbad; i++)
		if (f->bad_counts[i] >= BAN_BAD_CHUNKS && strncmp(f->bad_ids[i], name, n) == 0 &&
		    f->bad_ids[i][n] == '/')
			return true;
	return false;
}

/*
 * Trainer chunks across layouts. Replicas of several layouts fetching one
 * version would each take it all from the trainer. The rule: one layout
 * leads (leads()); its nodes take from the trainer what their own swarm
 * does not hold, as alone. A node of any other layout takes a byte range
 * from the trainer only when no replica of a leading layout will have it
 * soon: while a leading replica works toward the version (listed as
 * fetching, or as a partial holder whose have-map still grows), its chunks
 * are awaited and read from that replica's verified blocks; once none of
 * them has progressed for TESSERA_XL_PATIENCE_MS (or they are banned, or
 * gone), the trainer is the last resort again. True: wait.
 */
static bool wait_for_lead(struct swarm *sw, uint64_t now)
{
	struct swarm_xl *x = sw->xl;
	uint64_t patience = proto_param(PROTO_PARAM_XL_PATIENCE_MS);

	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		const struct xl_holder *h = &x->hs[k];
		if (h->used && h->listed && h->partial && h->hv_fits &&
		    x->lays[h->lay].state >= 0 && !holder_banned(sw->x->f, h) &&
		    leads(sw, h->nranks, x->lays[h->lay].digest) && now - h->grew_ms < patience)
			return true;
	}
	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++) {
		const struct xl_fetching *q = &x->fetching[k];
		if (q->since_ms != 0 && q->listed && !replica_banned(sw->x->f, q->replica) &&
		    leads(sw, q->nranks, q->digest) && now - q->since_ms < patience)
			return true;
	}
	return false;
}

/* Partial holder h has every window's bytes verified (its have-maps). */
static bool have_covers(const struct swarm_xl *x, const struct xl_holder *h, int nwins)
{
	const uint8_t *m = x->hv + (size_t)(h - x->hs) * XL_HV_MAX;

	for (int i = 0; i < nwins; i++) {
		const struct proto_xwin *w = &x->wscratch[i];
		for (uint32_t k = 0; k < w->nsegs; k++)
			if (!proto_xmap_have_covers(m + h->hv_off[w->rank],
						    h->hv_off[w->rank + 1] - h->hv_off[w->rank],
						    w->segs[k].src, w->segs[k].len))
				return false;
	}
	return true;
}

/* Staging and scratch, made on first use; false when out of memory. */
static bool xl_buffers(struct swarm *sw)
{
	struct swarm_xl *x = sw->xl;

	if (x->stage != NULL)
		return true;
	x->stage_slot = ((size_t)2 * sw->x->chunk_size + 4095) / 4096 * 4096;
	x->stage_len = XL_STAGES * x->stage_slot;
	x->scratch = malloc(XL_PIECES_MAX * sizeof(*x->scratch));
	x->wscratch = malloc(XL_WINS_MAX * sizeof(*x->wscratch));
	x->stage = node_serve_map(x->stage_len);
	x->hv = node_serve_map((size_t)XL_HOLDERS_MAX * XL_HV_MAX);
	if (x->scratch == NULL || x->wscratch == NULL || x->stage == NULL || x->hv == NULL ||
	    fab_mr_reg(sw->x->o.fab, x->stage, x->stage_len, FAB_MR_READ, &x->stage_mr) != 0 ||
	    fab_mr_reg(sw->x->o.fab, x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX, FAB_MR_READ,
		       &x->hv_mr) != 0) {
		if (x->stage_mr != NULL)
			fab_mr_close(x->stage_mr);
		x->stage_mr = NULL;
		node_serve_unmap(x->stage, x->stage_len);
		node_serve_unmap(x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX);
		x->stage = x->hv = NULL;
		free(x->scratch);
		free(x->wscratch);
		x->scratch = NULL;
		x->wscratch = NULL;
		return false;
	}
	for (uint32_t i = 0; i < XL_STAGES; i++)
		x->reads[i] = (struct xl_read){.sw = sw, .stage = i};
	return true;
}

/* The chunk of parcel p to read from a holder: hint if still to fetch,
 * else the first from our starting point that no peer holds or fetches
 * and that no holder could give as of gen (uncov, when not NULL). */
static uint32_t xl_chunk(const struct fetch_parcel *p, uint32_t hint, const uint32_t *uncov,
			 uint32_t gen)
{
	uint32_t n = p->mp->nchunks;

	if (hint < n && p->state[hint] == CHUNK_TODO && (uncov == NULL || uncov[hint] != gen))
		return hint;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t c = (p->rot + k) % n;
		if (p->state[c] == CHUNK_TODO && p->avail[c] == 0 && !p->peer_busy[c] &&
		    (uncov == NULL || uncov[c] != gen))
			return c;
	}
	return UINT32_MAX;
}

/* Chunk c of parcel pi from holder h: pieces into scratch (npieces),
 * windows into wscratch; the count of windows and their bytes, or <= 0
 * when the holder cannot give it in XL_WINS_MAX reads within staging. */
static int xl_plan(struct swarm *sw, const struct xl_holder *h, uint32_t pi, uint32_t c,
		   uint64_t *staged)
{
	struct swarm_xl *x = sw->xl;
	struct fetch *f = sw->x->f;
	const struct fetch_parcel *p = &f->parcels[pi];
	const struct xl_layout *l = &x->lays[h->lay];
	size_t n = 0;
	int rc = proto_xmap_pieces(&l->map, f->plan, p->pp, sw->x->o.layout,
				   (uint64_t)c * f->man.chunk_size,
				   p->mp->chunks[c].size, x->scratch, XL_PIECES_MAX, &n);

	for (size_t i = 0; rc == 0 && i < n; i++)
		if (x->scratch[i].rank >= h->nranks ||
		    x->scratch[i].src + x->scratch[i].len > h->ranks[x->scratch[i].rank].info.len)
			rc = -ERANGE; /* the holder offered less than its layout holds */
	uint32_t segs = (uint32_t)PROTO_MIN(fab_rma_segs(sw->x->o.fab), PROTO_XWIN_SEGS);
	int w = rc == 0 ? proto_xmap_windows(x->scratch, n, x->stage_slot, segs, x->wscratch, XL_WINS_MAX)
			: rc;
	if (w > 0 && h->partial && !have_covers(x, h, w))
		w = -ENODATA; /* not all verified there yet: nothing of it is read */
	x->npieces = n;
	*staged = 0;
	for (int i = 0; i < w; i++)
		*staged += x->wscratch[i].len;
	if (w <= 0 && w != -ENODATA)
		LOG_DEBUG("node %s: parcel %u chunk %u: not from holder %s (%d)", sw->x->o.id, pi, c,
			  h->replica, w);
	return w;
}

int swarm__xl_post(void *arg, uint32_t pi, uint32_t hint)
{
	struct swarm *sw = arg;
	struct swarm_xl *x = sw->xl;
	struct fetch *f = sw->x->f;
	struct fetch_parcel *p = &f->parcels[pi];
	struct xl_holder *h = NULL;
	struct xl_read *xr = NULL;
	uint64_t now = node_now_ms();
	uint32_t live = 0, c = UINT32_MAX;
	bool any = false;

	if (p->wire != NULL || !xl_refresh(sw, false))
		return 0;
	x = sw->xl;
	ask_holders(sw, now);
	/* Not from the trainer before we know whether holders exist (one
	 * round trip at the start of a fetch). */
	if (!x->answered)
		return -1;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX && !any; k++)
		any = holder_usable(sw, &x->hs[k], now);
	if (!any) {
		/* A holder whose layout is being read: wait for it, not the trainer. */
		for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
			if (x->hs[k].used && x->hs[k].listed && x->lays[x->hs[k].lay].state == 0)
				return -1;
		return wait_for_lead(sw, now) ? -1 : 0;
	}
	/* The swarm's endgame (a chunk already out, asked again): not from
	 * the trainer while holders deliver; a silent one's reads move. */
	if (hint < p->mp->nchunks && p->state[hint] == CHUNK_READING)
		return -1;
	for (uint32_t i = 0; i < XL_STAGES; i++) {
		live += x->reads[i].busy && !x->reads[i].rd->abandoned;
		if (!x->reads[i].busy && xr == NULL)
			xr = &x->reads[i];
	}
	if (xr == NULL) /* every staging slot held by reads that never came back */
		return 0;
	if (live >= XL_INFLIGHT)
		return -1;
	/* The chunk: the hint, else ones no peer of our swarm holds or
	 * fetches, from our starting point; partial holders give only those
	 * whose every read is verified there (chunks none could give are not
	 * tried again before something changes: cov_gen). */
	const struct proto_chunk *ch = NULL;
	uint64_t staged;
	int w = 0;
	uint32_t *uncov = pi < x->nuncov ? x->uncov[pi] : NULL;
	for (uint32_t tries = 0; h == NULL && tries < XL_SCAN; tries++) {
		if ((c = xl_chunk(p, tries == 0 ? hint : UINT32_MAX, uncov, x->cov_gen)) == UINT32_MAX)
			break;
		ch = &p->mp->chunks[c];
		/* Round-robin over the holders with room (readers spread over
		 * their uplinks): the first whose reads of the chunk carry at
		 * most half as many bytes again (gaps read along), else the one
		 * with the fewest. */
		uint64_t best = UINT64_MAX;
		bool room = false;
		for (uint32_t k = 0; k < XL_HOLDERS_MAX && best > ch->size + ch->size / 2; k++) {
			struct xl_holder *o = &x->hs[(x->rr + k) % XL_HOLDERS_MAX];
			if (!holder_usable(sw, o, now) || !holder_room(sw, o, ch->size))
				continue;
			room = true;
			if (xl_plan(sw, o, pi, c, &staged) > 0 && staged < best) {
				best = staged;
				h = o;
			}
		}
		if (!room)
			return -1; /* holders, all busy: wait for them, not the trainer */
		if (h == NULL && uncov != NULL)
			uncov[c] = x->cov_gen;
	}
	if (h == NULL) /* no holder can give one now: a leading layout's, or the trainer */
		return wait_for_lead(sw, now) ? -1 : 0;
	x->rr = (uint32_t)(h - x->hs + 1) % XL_HOLDERS_MAX;
	w = xl_plan(sw, h, pi, c, &staged);
	if (w <= 0)
		return 0;
	size_t n = x->npieces;
	int slot = fetch_read_claim(sw->x, ch->size);
	if (slot < 0)
		return -1;
	xr->pcs = malloc(n * sizeof(*xr->pcs));
	xr->wins = malloc((size_t)w * sizeof(*xr->wins));
	if (xr->pcs == NULL || xr->wins == NULL) {
		free(xr->pcs);
		free(xr->wins);
		xr->pcs = NULL;
		xr->wins = NULL;
		fetch_read_unclaim(sw->x, ch->size);
		return -1;
	}
	memcpy(xr->pcs, x->scratch, n * sizeof(*xr->pcs));
	memcpy(xr->wins, x->wscratch, (size_t)w * sizeof(*xr->wins));
	xr->npcs = n;
	xr->nwins = (uint32_t)w;
	xr->next = xr->live = 0;
	xr->status = 0;
	xr->holder = (uint32_t)(h - x->hs);
	xr->epoch = h->epoch;
	struct fetch_read *rd = &sw->x->reads[slot];
	*rd = (struct fetch_read){.x = sw->x, .parcel = pi, .chunk = c, .slot = (uint32_t)slot,
				  .len = ch->size, .src_idx = UINT32_MAX, .src_peer = true, .xl = true,
				  .started_ms = now, .busy = true, .in_fabric = true, .gen = sw->x->gen};
	/* Whom a bad chunk counts against: the one rank that sent it all, else
	 * the replica. */
	bool one = true;
	for (int i = 1; i < w; i++)
		one &= xr->wins[i].rank == xr->wins[0].rank;
	snprintf(rd->src_id, sizeof(rd->src_id), "%s",
		 one ? h->ranks[xr->wins[0].rank].info.id : h->replica);
	xr->rd = rd;
	int rc = 0;
	for (uint32_t i = 0; i < XL_POST_MAX && xr->next < xr->nwins; i++)
		if ((rc = post_window(sw, xr, &xr->ops[i])) != 0)
			break;
	if (xr->live == 0) { /* nothing went out: as if never tried */
		rd->busy = rd->in_fabric = false;
		free(xr->pcs);
		free(xr->wins);
		xr->pcs = NULL;
		xr->wins = NULL;
		fetch_read_unclaim(sw->x, ch->size);
		h->bad_until_ms = now + BAD_SOURCE_MS;
		return 0;
	}
	if (rc != 0)
		xr->status = rc; /* the rest is not asked; what went out comes back first */
	xr->busy = true;
	if (f->first_post_ms == 0) {
		f->first_post_ms = now;
		LOG_DEBUG("node %s: v%" PRIu64 ": first read posted, to holder %s", sw->x->o.id,
			  f->version, h->replica);
	}
	fetch_source_posted(&h->pace, ch->size);
	fetch_read_started(sw->x, pi, c, ch->size);
	return 1;
}

bool swarm__xl_serves(void *arg)
{
	struct swarm *sw = arg;
	uint64_t now = node_now_ms();

	if (sw->xl == NULL || sw->x->f == NULL || sw->xl->version != sw->x->f->version ||
	    sw->xl->gen != sw->x->gen)
		return false;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		if (holder_usable(sw, &sw->xl->hs[k], now))
			return true;
	return false;
}

/* ---- periodic work -------------------------------------------------------------- */


/* A silent holder's reads go back to the pool (their slots stay reserved
 * until they complete) and it rests. */
static void move_silent(struct swarm *sw, struct fetch *f, uint64_t now)
{
	struct swarm_xl *x = sw->xl;

	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		struct xl_holder *h = &x->hs[k];
		uint32_t moved = 0;
		if (!h->used || !holder_silent(h, now) || h->bad_until_ms > now)
			continue;
		for (uint32_t i = 0; i < XL_STAGES; i++) {
			struct xl_read *xr = &x->reads[i];
			struct fetch_read *rd = xr->rd;
			if (!xr->busy || xr->holder != k || xr->epoch != h->epoch || rd->abandoned ||
			    rd->gen != sw->x->gen || !rd->in_fabric)
				continue;
			struct fetch_parcel *p = &f->parcels[rd->parcel];
			rd->abandoned = true;
			p->nlive[rd->chunk]--;
			fetch_chunk_idle(p, rd->chunk);
			moved++;
		}
		if (moved == 0)
			continue;
		LOG_WARN("node %s: holder %s delivered nothing for %" PRIu64 " ms; moving its %u reads "
			 "elsewhere",
			 sw->x->o.id, h->replica, now - h->pace.progress_ms, moved);
		f->stalls += moved;
		proto_metrics_add(sw->x->o.am->m, sw->x->o.am->stalled, moved);
		h->bad_until_ms = now + BAD_SOURCE_MS;
	}
}

/* A delta taken whole has no source but holders: once none is left for
 * XL_ALONE_MS (none listed, or each banned for chunks that failed the raw
 * copy's hashes), the fetch is refused (o.refuse) and the version's next
 * try replays the chain. True when it was refused: the fetch may be gone. */
static bool full_alone(struct swarm *sw, struct swarm_xl *x, struct fetch *f,
		       uint64_t now)
{
	bool left = false;

	if (!f->full || !x->answered)
		return false;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX && !left; k++)
		left = x->hs[k].used && x->hs[k].listed && x->lays[x->hs[k].lay].state >= 0 &&
		       !holder_banned(f, &x->hs[k]);
	if (left || x->alone_ms == 0) {
		x->alone_ms = left ? 0 : now;
		return false;
	}
	if (now - x->alone_ms < XL_ALONE_MS)
		return false;
	char why[200];
	snprintf(why, sizeof(why), "no replica left to read v%" PRIu64 " whole from (%u chunks "
		 "failed their hash); its chain is replayed next", f->version, f->bad_chunks);
	if (sw->o.refuse != NULL)
		sw->o.refuse(sw->o.arg, why);
	return true;
}

void swarm_xl_tick(struct swarm *sw)
{
	struct fetch *f = sw->x->f;
	struct swarm_xl *x = sw->xl;
	uint64_t now = node_now_ms();

	/* An offer without our slot was accepted: offer again, with it. */
	if (x != NULL && x->slot_mr != NULL && sw->kept != NULL && sw->kept->so.offered &&
	    !sw->kept->so.busy && !x->slot_in_offer)
		sw->kept->so.offered = false;
	if (!xl_refresh(sw, false))
		return;
	x = sw->xl;
	swarm__xl_part_serve(sw, x);
	if (x->part_mr != NULL && x->part_f == f && f->so.offered && !f->so.busy && !x->part_in_offer)
		f->so.offered = false;
	move_silent(sw, f, now);
	ask_holders(sw, now);
	if (full_alone(sw, x, f, now))
		return;
	x->cov_gen++; /* holders rest and come back: chunks are tried again */
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		poll_have(sw, &x->hs[k], now);
}

static void uncov_free(struct swarm_xl *x)
{
	for (uint32_t i = 0; i < x->nuncov; i++)
		free(x->uncov[i]);
	free(x->uncov);
	x->uncov = NULL;
	x->nuncov = 0;
}

/* Holders are for the fetch under way (dropped when it changed); asked
 * again every XL_ASK_MS. False when there is nothing to do for this fetch.
 * early: its parcels are not known yet (the addendum is awaited); holders
 * and their layouts are made ready meanwhile. */
static bool xl_refresh(struct swarm *sw, bool early)
{
	struct fetch *f = sw->x->f;
	struct swarm_xl *x;

	if (!sw->x->fanout || f == NULL || (f->parcels == NULL && !early) || !f->have_man ||
	    f->complete || f->delta || (x = swarm__xl_get(sw)) == NULL || !xl_buffers(sw))
		return false;
	if (x->version != f->version || x->gen != sw->x->gen) {
		for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
			if (x->hs[k].used)
				holder_drop(sw, &x->hs[k]);
		for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
			x->fetching[k] = (struct xl_fetching){.since_ms = 0};
		uncov_free(x);
		x->cov_gen = 1;
		x->version = f->version;
		x->gen = sw->x->gen;
		x->asked_ms = 0;
		x->alone_ms = 0;
		x->answered = false;
	}
	if (x->uncov == NULL && f->parcels != NULL &&
	    (x->uncov = calloc(f->nparcels, sizeof(*x->uncov))) != NULL) {
		x->nuncov = f->nparcels;
		for (uint32_t i = 0; i < f->nparcels; i++)
			x->uncov[i] = calloc(f->parcels[i].mp->nchunks + 1, sizeof(**x->uncov));
	}
	return true;
}

void swarm_xl_prefetch(struct swarm *sw)
{
	if (xl_refresh(sw, true))
		ask_holders(sw, node_now_ms());
}

static void ask_holders(struct swarm *sw, uint64_t now)
{
	struct fetch *f = sw->x->f;
	struct swarm_xl *x = sw->xl;

	if (x->pending || now - x->asked_ms < XL_ASK_MS)
		return;
	struct xl_req *req = malloc(sizeof(*req));
	x->asked_ms = now;
	if (req != NULL)
		*req = (struct xl_req){sw, sw->x->gen};
	if (req == NULL ||
	    trk_client_holders(sw->x->o.trk, f->version, sw->x->o.layout->digest, on_holders, req) != 0) {
		free(req);
		x->answered = true; /* not waiting for an answer that will not come */
	} else {
		x->pending = true;
	}
}

void swarm_xl_fini(struct swarm *sw)
{
	struct swarm_xl *x = sw->xl;

	if (x == NULL)
		return;
	/* The endpoint is closed (it closed the regions and cancelled reads). */
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		if (x->hs[k].used)
			holder_drop(sw, &x->hs[k]);
	for (uint32_t i = 0; i < x->nlays; i++)
		if (x->lays[i].state == 1) {
			proto_xmap_fini(&x->lays[i].map);
			proto_layout_fini(&x->lays[i].l);
		}
	for (uint32_t i = 0; i < XL_STAGES; i++) {
		free(x->reads[i].pcs);
		free(x->reads[i].wins);
	}
	node_serve_unmap(x->stage, x->stage_len);
	node_serve_unmap(x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX);
	swarm__xl_serve_fini(sw, x);
	uncov_free(x);
	free(x->scratch);
	free(x->wscratch);
	free(x);
	sw->xl = NULL;
}
