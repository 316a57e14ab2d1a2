/* Cross-layout sources: a destination rank's bytes in another layout's
 * ranks (proto/xmap.h says how). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/xmap.h"

static int span_cmp(const void *a, const void *b)
{
	const struct proto_xspan *x = a, *y = b;
	return x->dst < y->dst ? -1 : x->dst > y->dst;
}

int proto_xmap_build(const struct proto_plan *hp, const struct proto_layout *holder,
		     const struct proto_layout *dst, uint32_t dst_rank, struct proto_xmap *out,
		     struct proto_err *err)
{
	uint64_t n = 0, k = 0;

	memset(out, 0, sizeof(*out));
	if (dst_rank >= dst->nranks || hp->ndst != dst->nranks || hp->nsrc != holder->nranks)
		return proto_errf(err, EINVAL, "cross-layout map: plan and layouts differ");
	for (uint32_t i = 0; i < hp->nparcels; i++)
		if (hp->parcels[i].dst_rank == dst_rank)
			n += hp->parcels[i].nruns;
	struct proto_xspan *sp = calloc(n + 1, sizeof(*sp));
	if (sp == NULL)
		return proto_errf(err, ENOMEM, "cross-layout map: out of memory");
	for (uint32_t i = 0; i < hp->nparcels; i++) {
		const struct proto_parcel *pc = &hp->parcels[i];
		if (pc->dst_rank != dst_rank)
			continue;
		for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++) {
			const struct proto_segment *sg = &hp->segs[s];
			uint64_t db = dst->ranks[dst_rank].locals[sg->dst_local].offset;
			uint64_t sb = holder->ranks[pc->src_rank].locals[sg->src_local].offset;
			for (uint64_t r = sg->run0; r < sg->run0 + sg->nruns; r++) {
				const struct proto_run *run = &hp->runs[r];
				sp[k++] = (struct proto_xspan){db + run->dst_off, run->len,
							       sb + run->src_off, pc->src_rank};
			}
		}
	}
	qsort(sp, k, sizeof(*sp), span_cmp);
	uint64_t m = 0;
	for (uint64_t i = 0; i < k; i++) {
		struct proto_xspan *last = m > 0 ? &sp[m - 1] : NULL;
		if (last != NULL && sp[i].dst < last->dst + last->len) {
			unsigned long long twice = sp[i].dst;
			free(sp);
			return proto_errf(err, EINVAL, "cross-layout map: byte %llu of rank %u mapped twice",
					  twice, dst_rank);
		}
		if (last != NULL && last->rank == sp[i].rank && last->dst + last->len == sp[i].dst &&
		    last->src + last->len == sp[i].src)
			last->len += sp[i].len;
		else
			sp[m++] = sp[i];
	}
	*out = (struct proto_xmap){dst_rank, holder->nranks, m, sp};
	return 0;
}

void proto_xmap_fini(struct proto_xmap *x)
{
	free(x->spans);
	memset(x, 0, sizeof(*x));
}

/* The span holding destination byte d, or the first after it. */
static uint64_t span_at(const struct proto_xmap *x, uint64_t d)
{
	uint64_t lo = 0, hi = x->nspans;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (x->spans[mid].dst + x->spans[mid].len <= d)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Appends a piece, merging it into the last when both continue each other. */
static int put_piece(struct proto_xpiece *out, size_t max, size_t *n, uint32_t rank, uint64_t src,
		     uint64_t len, uint64_t o)
{
	struct proto_xpiece *last = *n > 0 ? &out[*n - 1] : NULL;

	if (last != NULL && last->rank == rank && last->src + last->len == src &&
	    last->out + last->len == o) {
		last->len += len;
		return 0;
	}
	if (*n == max)
		return -ENOSPC;
	out[(*n)++] = (struct proto_xpiece){.rank = rank, .src = src, .len = len, .out = o};
	return 0;
}

int proto_xmap_pieces(const struct proto_xmap *x, const struct proto_plan *p,
		      const struct proto_parcel *pc, const struct proto_layout *dst, uint64_t off,
		      uint64_t len, struct proto_xpiece *out, size_t max, size_t *n)
{
	uint64_t end = off + len, o = 0;

	*n = 0;
	if (pc->dst_rank != x->dst_rank || end < off || end > pc->bytes)
		return -ERANGE;
	if (len == 0)
		return 0;
	uint64_t sg = pc->seg0;
	for (uint64_t r = proto_parcel_run_at(p, pc, off); off < end && r < pc->run0 + pc->nruns; r++) {
		const struct proto_run *run = &p->runs[r];
		while (sg + 1 < pc->seg0 + pc->nsegs && p->segs[sg + 1].run0 <= r)
			sg++;
		uint64_t in = off - run->pay_off, take = PROTO_MIN(run->len - in, end - off);
		uint64_t d = dst->ranks[pc->dst_rank].locals[p->segs[sg].dst_local].offset +
			     run->dst_off + in;
		/* Destination bytes [d, d+take) through the map's spans. */
		for (uint64_t k = span_at(x, d); take > 0; k++) {
			const struct proto_xspan *s = &x->spans[k];
			if (k >= x->nspans || s->dst > d)
				return -ENOENT;
			uint64_t sin = d - s->dst, t = PROTO_MIN(s->len - sin, take);
			int rc = put_piece(out, max, n, s->rank, s->src + sin, t, o);
			if (rc != 0)
				return rc;
			d += t;
			o += t;
			off += t;
			take -= t;
		}
	}
	return off == end ? 0 : -ERANGE;
}

static int piece_cmp(const void *a, const void *b)
{
	const struct proto_xpiece *x = *(const struct proto_xpiece *const *)a;
	const struct proto_xpiece *y = *(const struct proto_xpiece *const *)b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return x->src < y->src ? -1 : x->src > y->src;
}

/* Groups the sorted pieces: ranges (pieces closer than gap merged), up to
 * segs ranges of one rank a window; the count of windows, and their
 * staging bytes in *bytes; fills out (and each piece's win and at) when it
 * is not NULL. */
static size_t group(struct proto_xpiece **sorted, size_t n, uint64_t gap, uint32_t segs,
		    uint64_t *bytes, struct proto_xwin *out)
{
	struct proto_xwin cur = {0};
	size_t w = 0;
	uint64_t start = 0, rend = 0, total = 0;
	bool open = false;

	for (size_t i = 0; i < n; i++) {
		struct proto_xpiece *q = sorted[i];
		if (open && q->rank == cur.rank && q->src <= rend + gap) {
			rend = PROTO_MAX(rend, q->src + q->len); /* the same range */
		} else {
			if (open) { /* the range [start, rend) ends */
				cur.segs[cur.nsegs++] = (struct proto_xseg){start, rend - start};
				cur.len += rend - start;
			}
			if (!open || q->rank != cur.rank || cur.nsegs == segs) {
				if (open) { /* the window ends */
					if (out != NULL)
						out[w - 1] = cur;
					total += cur.len;
				}
				cur = (struct proto_xwin){.rank = q->rank, .stage = total};
				w++;
			}
			open = true;
			start = q->src;
			rend = q->src + q->len;
		}
		if (out != NULL) {
			/* Its place: the window's start, the ranges before its own,
			 * then its offset in its range. */
			q->win = (uint32_t)(w - 1);
			q->at = cur.stage + cur.len + (q->src - start);
		}
	}
	if (open) {
		cur.segs[cur.nsegs++] = (struct proto_xseg){start, rend - start};
		cur.len += rend - start;
		if (out != NULL)
			out[w - 1] = cur;
		total += cur.len;
	}
	*bytes = total;
	return w;
}

int proto_xmap_windows(struct proto_xpiece *pc, size_t n, uint64_t stage_cap, uint32_t segs,
		       struct proto_xwin *out, size_t max)
{
	struct proto_xpiece **sorted;
	uint64_t gap = 0, bytes = 0;
	size_t w;

	if (segs < 1 || segs > PROTO_XWIN_SEGS)
		return -EINVAL;
	if (max == 0)
		return -ENOSPC;
	if (n == 0)
		return 0;
	if ((sorted = malloc(n * sizeof(*sorted))) == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		sorted[i] = &pc[i];
	qsort(sorted, n, sizeof(*sorted), piece_cmp);
	while ((w = group(sorted, n, gap, segs, &bytes, NULL)) > max && bytes <= stage_cap &&
	       gap < (1ull << 40))
		gap = gap == 0 ? 64 : 2 * gap;
	if (w > max || bytes > stage_cap) {
		free(sorted);
		return -ENOSPC;
	}
	group(sorted, n, gap, segs, &bytes, out);
	free(sorted);
	return (int)w;
}

/* ---- have-maps of partial holders ------------------------------------------ */

uint64_t proto_xmap_have_len(uint64_t slot_len)
{
	return (slot_len + PROTO_XMAP_HAVE_BLOCK - 1) / PROTO_XMAP_HAVE_BLOCK;
}

void proto_xmap_have_add(uint32_t *cnt, uint8_t *map, uint64_t slot_len, uint64_t at, uint64_t n)
{
	uint64_t end = at + n < at || at + n > slot_len ? slot_len : at + n;

	while (at < end) {
		uint64_t b = at / PROTO_XMAP_HAVE_BLOCK, lo = b * PROTO_XMAP_HAVE_BLOCK;
		uint64_t hi = PROTO_MIN(lo + PROTO_XMAP_HAVE_BLOCK, slot_len);
		uint64_t k = PROTO_MIN(hi, end) - at;
		cnt[b] = (uint32_t)PROTO_MIN((uint64_t)cnt[b] + k, hi - lo);
		if (cnt[b] == hi - lo)
			map[b] = 1;
		at += k;
	}
}

static int range_cmp(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;
	return x[0] < y[0] ? -1 : x[0] > y[0];
}

int proto_xmap_rank_gaps(const struct proto_rank *rk,
			 void (*span)(void *arg, uint64_t at, uint64_t n), void *arg)
{
	uint64_t (*r)[2] = calloc(rk->nlocals + 1, sizeof(*r)), at = 0;

	if (r == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		r[i][0] = rk->locals[i].offset;
		r[i][1] = rk->locals[i].offset + rk->locals[i].nbytes;
	}
	qsort(r, rk->nlocals, sizeof(*r), range_cmp);
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		if (r[i][0] > at)
			span(arg, at, r[i][0] - at);
		at = PROTO_MAX(at, r[i][1]);
	}
	if (rk->nbytes > at)
		span(arg, at, rk->nbytes - at);
	free(r);
	return 0;
}

bool proto_xmap_have_covers(const uint8_t *map, uint64_t nblocks, uint64_t src, uint64_t len)
{
	if (len == 0)
		return true;
	uint64_t b0 = src / PROTO_XMAP_HAVE_BLOCK, b1 = (src + len - 1) / PROTO_XMAP_HAVE_BLOCK;

	if (src + len < src || b1 >= nblocks)
		return false;
	for (uint64_t b = b0; b <= b1; b++)
		if (map[b] == 0)
			return false;
	return true;
}
