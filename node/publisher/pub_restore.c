/* A trainer rank's memory put back together from the raw parcels it served (for addenda). */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>

static int add_src(struct pub_rsrc **rs, size_t *n, size_t *cap, const struct pub_layout *sl,
		   const struct proto_parcel *pc, const uint8_t *payload)
{
	if (sl == NULL || pc == NULL || payload == NULL)
		return 0;
	if (*n == *cap) {
		size_t c = PROTO_MAX(2 * *cap, 16);
		struct pub_rsrc *g = realloc(*rs, c * sizeof(*g));
		if (g == NULL)
			return -ENOMEM;
		*rs = g;
		*cap = c;
	}
	(*rs)[(*n)++] = (struct pub_rsrc){sl, pc, payload};
	return 0;
}

int node__pub_restore_sources(struct node_pub *p, uint64_t v, uint32_t rank,
			      struct pub_rsrc **out, size_t *n)
{
	struct pub_version *pv = node__pub_version_served(p, v);
	size_t cap = 0;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (pv == NULL)
		return 0;
	if (!pv->delta) {
		/* An anchor serves its parcels raw: each offer says where (its
		 * layout's slice of the rank's buffer, the offset in it). */
		for (size_t k = 0; k < pv->noffers && rc == 0; k++) {
			const struct trk_offer *o = &pv->offers[k];
			uint32_t li = pv->offer_li[k];
			const struct pub_part *pt = NULL;
			for (size_t i = 0; i < pv->nparts && pt == NULL; i++)
				if (pv->parts[i].rank == o->src_rank && pv->parts[i].buf != NULL)
					pt = &pv->parts[i];
			if (o->src_rank != rank || pt == NULL || li >= pv->nlayouts ||
			    pv->layouts[li].state != PUB_L_SERVED || li >= pt->nslices ||
			    pt->slices[li].mr == NULL)
				continue;
			const struct pub_slice *sc = &pt->slices[li];
			const struct pub_layout *sl = node__pub_layout_find(p, o->layout);
			/* An FP8 layout's parcels are not the rank's bytes. */
			const struct proto_parcel *pc =
				sl != NULL && !sl->bad && sl->q == NULL ? proto_plan_parcel(&sl->plan, o->src_rank, o->dst_rank)
						       : NULL;
			struct fab_rkey rk;
			fab_mr_rkey(sc->mr, &rk);
			if (pc == NULL || pc->bytes != o->len || o->addr < rk.addr ||
			    o->addr - rk.addr > sc->len || o->len > sc->len - (o->addr - rk.addr))
				continue;
			rc = add_src(out, n, &cap, sl, pc, pt->buf + sc->off + (o->addr - rk.addr));
		}
	}
	if (rc != 0) {
		free(*out);
		*out = NULL;
		*n = 0;
	}
	return rc;
}

/* A bit per byte of a rank's memory: which bytes the served parcels hold. */
struct cover {
	uint64_t *bits;
	uint64_t len;
	bool ok, bad;
};

static void cover_mark(void *arg, uint64_t at, uint64_t n)
{
	struct cover *cv = arg;

	if (at > cv->len || n > cv->len - at) {
		cv->bad = true; /* a parcel outside the rank: not ours to trust */
		return;
	}
	for (uint64_t b = at; b < at + n;) {
		if (b % 64 == 0 && at + n - b >= 64) {
			cv->bits[b / 64] = ~(uint64_t)0;
			b += 64;
		} else {
			cv->bits[b / 64] |= (uint64_t)1 << (b % 64);
			b++;
		}
	}
}

static void cover_check(void *arg, uint64_t at, uint64_t n)
{
	struct cover *cv = arg;

	if (!cv->ok || at > cv->len || n > cv->len - at) {
		cv->ok = false;
		return;
	}
	for (uint64_t b = at; b < at + n && cv->ok;) {
		if (b % 64 == 0 && at + n - b >= 64) {
			cv->ok = cv->bits[b / 64] == ~(uint64_t)0;
			b += 64;
		} else {
			cv->ok = (cv->bits[b / 64] >> (b % 64)) & 1;
			b++;
		}
	}
}

/* Layout by layout (rs lists each layout's parcels together), the served
 * parcels are marked until they reach every byte pt's items read; only
 * those layouts' parcels are put back (usually the first layout's: any
 * layout's parcels from a rank hold all of it). */
bool node__pub_restore(const struct node_pub *p, uint32_t rank, const struct pub_rsrc *rs,
		       size_t n, const struct pub_part *pt, uint8_t *block, size_t cap)
{
	struct cover cv = {.len = p->tl.ranks[rank].nbytes};
	size_t used = 0;

	if (cv.len > cap || (cv.bits = calloc(cv.len / 64 + 1, sizeof(*cv.bits))) == NULL)
		return false;
	while (used < n && !cv.ok && !cv.bad) {
		const struct pub_layout *sl = rs[used].sl;
		for (; used < n && rs[used].sl == sl && !cv.bad; used++)
			proto_parcel_src_spans(&sl->plan, rs[used].pc, &p->tl, 0, rs[used].pc->bytes,
					       cover_mark, &cv);
		cv.ok = !cv.bad;
		for (size_t k = 0; k < pt->nitems && cv.ok; k++)
			if (pt->items[k].sl->q == NULL) /* FP8: from its quantized source */
				proto_parcel_src_spans(&pt->items[k].sl->plan, pt->items[k].pc, &p->tl, 0,
					       pt->items[k].pc->bytes, cover_check, &cv);
	}
	free(cv.bits);
	if (!cv.ok || cv.bad)
		return false;
	for (size_t i = 0; i < used; i++)
		proto_parcel_ungather(&rs[i].sl->plan, rs[i].pc, &p->tl, block, 0, rs[i].pc->bytes,
				      rs[i].payload);
	return true;
}
