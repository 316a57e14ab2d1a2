/* The transfer planner: exact parcels between two layouts (see plan.h). */
#include "proto/plan.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/box.h"

/* Where a piece's elements live inside its local tensor, as an affine map:
 * offset(x) = base + sum_d (x_d - origin_d) * stride_d, in elements. */
struct view {
	int64_t base;
	uint64_t origin[PROTO_MAX_DIMS];
	uint64_t stride[PROTO_MAX_DIMS];
};

static void piece_view(const struct proto_model *m, const struct proto_local *l,
		       const struct proto_piece *p, struct view *v)
{
	const struct proto_tensor *t = &m->tensors[p->tensor];
	uint64_t s = 1;

	memset(v, 0, sizeof(*v));
	if (p->flat) {
		/* Row-major position in the logical tensor, shifted. */
		v->base = (int64_t)p->base - (int64_t)p->box.lo[0];
		for (uint32_t d = t->ndim; d-- > 0;) {
			v->stride[d] = s;
			s *= t->shape[d];
		}
		return;
	}
	v->base = (int64_t)p->base;
	for (uint32_t d = l->ndim; d-- > 0;) {
		v->origin[d] = p->box.lo[d];
		v->stride[d] = s;
		s *= l->shape[d];
	}
}

static uint64_t view_offset(const struct view *v, const uint64_t *x, uint32_t ndim)
{
	int64_t off = v->base;
	for (uint32_t d = 0; d < ndim; d++)
		off += (int64_t)((x[d] - v->origin[d]) * v->stride[d]);
	return (uint64_t)off;
}

/* Smallest k such that dims [k, ndim) of box are one contiguous block. */
static uint32_t contiguous_from(const struct view *v, const struct proto_box *b, uint32_t ndim)
{
	uint32_t k = ndim - 1;
	while (k > 0 && v->stride[k - 1] == v->stride[k] * (b->hi[k] - b->lo[k]))
		k--;
	return k;
}

/* A segment before runs are computed and parcels grouped. */
struct pseg {
	uint32_t src_rank, dst_rank, tensor;
	uint32_t src_local, src_piece, dst_local, dst_piece;
	uint64_t order; /* emission order, keeps the sort stable */
	struct proto_box box;
};

struct builder {
	const struct proto_model *m;
	const struct proto_layout *src, *dst;
	struct pseg *segs;
	uint64_t nsegs, capsegs;
	struct proto_run *runs;
	uint64_t nruns, capruns;
};

static int push_seg(struct builder *b, const struct pseg *s)
{
	if (b->nsegs == b->capsegs) {
		uint64_t cap = b->capsegs ? 2 * b->capsegs : 64;
		struct pseg *v = realloc(b->segs, cap * sizeof(*v));
		if (v == NULL)
			return -ENOMEM;
		b->segs = v;
		b->capsegs = cap;
	}
	b->segs[b->nsegs] = *s;
	b->segs[b->nsegs].order = b->nsegs;
	b->nsegs++;
	return 0;
}

static int push_run(struct builder *b, uint64_t first_of_seg, uint64_t so, uint64_t d,
		    uint64_t len)
{
	if (b->nruns > first_of_seg) {
		struct proto_run *r = &b->runs[b->nruns - 1];
		if (r->src_off + r->len == so && r->dst_off + r->len == d) {
			r->len += len;
			return 0;
		}
	}
	if (b->nruns == b->capruns) {
		uint64_t cap = b->capruns ? 2 * b->capruns : 256;
		struct proto_run *v = realloc(b->runs, cap * sizeof(*v));
		if (v == NULL)
			return -ENOMEM;
		b->runs = v;
		b->capruns = cap;
	}
	b->runs[b->nruns++] = (struct proto_run){so, d, len, 0};
	return 0;
}

/* Appends the merged byte runs of one segment. */
static int segment_runs(struct builder *b, const struct pseg *s)
{
	const struct proto_tensor *t = &b->m->tensors[s->tensor];
	const struct proto_local *sl = &b->src->ranks[s->src_rank].locals[s->src_local];
	const struct proto_local *dl = &b->dst->ranks[s->dst_rank].locals[s->dst_local];
	uint64_t es = proto_dtype_size(t->dtype), first = b->nruns, x[PROTO_MAX_DIMS];
	uint32_t n = t->ndim, k;
	struct view sv, dv;
	uint64_t len = 1;

	piece_view(b->m, sl, &sl->pieces[s->src_piece], &sv);
	piece_view(b->m, dl, &dl->pieces[s->dst_piece], &dv);
	if (n == 0)
		return push_run(b, first, (uint64_t)sv.base * es, (uint64_t)dv.base * es, es);
	k = PROTO_MAX(contiguous_from(&sv, &s->box, n), contiguous_from(&dv, &s->box, n));
	for (uint32_t d = k; d < n; d++)
		len *= s->box.hi[d] - s->box.lo[d];
	/* Odometer over the outer dims [0, k). */
	for (uint32_t d = 0; d < n; d++)
		x[d] = s->box.lo[d];
	for (;;) {
		int rc = push_run(b, first, view_offset(&sv, x, n) * es, view_offset(&dv, x, n) * es,
				  len * es);
		if (rc != 0)
			return rc;
		uint32_t d = k;
		while (d > 0) {
			d--;
			if (++x[d] < s->box.hi[d])
				break;
			x[d] = s->box.lo[d];
			if (d == 0)
				return 0;
		}
		if (k == 0)
			return 0;
	}
}

/* Source pieces of one tensor, grouped: holders[hstart[t] .. hstart[t+1]). */
struct holder {
	uint32_t rank, local, piece;
};

static int index_holders(const struct proto_model *m, const struct proto_layout *l,
			 struct holder **out, uint64_t **start)
{
	uint64_t *cnt = calloc(m->ntensors + 1, sizeof(*cnt)), total = 0;
	struct holder *h = NULL;

	if (cnt == NULL)
		return -ENOMEM;
	for (uint32_t r = 0; r < l->nranks; r++)
		for (uint32_t i = 0; i < l->ranks[r].nlocals; i++)
			for (uint32_t k = 0; k < l->ranks[r].locals[i].npieces; k++)
				cnt[l->ranks[r].locals[i].pieces[k].tensor + 1]++;
	for (uint32_t t = 0; t < m->ntensors; t++)
		cnt[t + 1] += cnt[t];
	total = cnt[m->ntensors];
	h = malloc((total + 1) * sizeof(*h));
	uint64_t *fill = malloc((m->ntensors + 1) * sizeof(*fill));
	if (h == NULL || fill == NULL) {
		free(h);
		free(fill);
		free(cnt);
		return -ENOMEM;
	}
	memcpy(fill, cnt, (m->ntensors + 1) * sizeof(*fill));
	for (uint32_t r = 0; r < l->nranks; r++)
		for (uint32_t i = 0; i < l->ranks[r].nlocals; i++)
			for (uint32_t k = 0; k < l->ranks[r].locals[i].npieces; k++) {
				uint32_t t = l->ranks[r].locals[i].pieces[k].tensor;
				h[fill[t]++] = (struct holder){r, i, k};
			}
	free(fill);
	*out = h;
	*start = cnt;
	return 0;
}

struct emit_ctx {
	struct builder *b;
	const struct pseg *proto;
};

static int emit_seg(void *arg, const struct proto_box *x)
{
	struct emit_ctx *e = arg;
	struct pseg seg = *e->proto;
	seg.box = *x;
	return push_seg(e->b, &seg);
}

/* Covers one destination piece from the source holders of its tensor. */
static int cover_piece(struct builder *b, uint32_t j, uint32_t li, uint32_t pi,
		       const struct holder *h, uint64_t nh, struct proto_err *err)
{
	const struct proto_piece *dp = &b->dst->ranks[j].locals[li].pieces[pi];
	const struct proto_tensor *t = &b->m->tensors[dp->tensor];
	struct proto_boxes unc = {0}, next = {0}, sb = {0};
	int rc;

	rc = proto_piece_boxes(b->m, dp, &unc);
	/* Rotate the starting holder so replicated sources share the load. */
	uint64_t start = nh ? ((uint64_t)j + dp->tensor) % nh : 0;
	for (uint64_t q = 0; q < nh && unc.n > 0 && rc == 0; q++) {
		const struct holder *hd = &h[(start + q) % nh];
		const struct proto_piece *sp = &b->src->ranks[hd->rank].locals[hd->local].pieces[hd->piece];
		struct pseg seg = {.src_rank = hd->rank, .dst_rank = j, .tensor = dp->tensor,
				   .src_local = hd->local, .src_piece = hd->piece, .dst_local = li,
				   .dst_piece = pi};
		struct emit_ctx ec = {b, &seg};

		sb.n = 0;
		rc = proto_piece_boxes(b->m, sp, &sb);
		for (uint32_t s = 0; s < sb.n && rc == 0; s++)
			rc = proto_boxes_cut(&unc, &sb.v[s], t->ndim, &next, emit_seg, &ec);
	}
	if (rc == -ENOMEM) {
		rc = proto_errf(err, ENOMEM, "plan: out of memory");
	} else if (rc == 0 && unc.n > 0) {
		char box[256];
		proto_box_str(box, sizeof(box), &unc.v[0], t->ndim);
		rc = proto_errf(err, EINVAL,
				"plan: destination rank %u local %s needs %s elements %s that no source rank holds",
				j, b->dst->ranks[j].locals[li].name, t->name, box);
	}
	proto_boxes_fini(&unc);
	proto_boxes_fini(&next);
	proto_boxes_fini(&sb);
	return rc;
}

static int cmp_pseg(const void *a, const void *b)
{
	const struct pseg *x = a, *y = b;
	if (x->src_rank != y->src_rank)
		return x->src_rank < y->src_rank ? -1 : 1;
	if (x->dst_rank != y->dst_rank)
		return x->dst_rank < y->dst_rank ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

/* Whole tensors every destination rank would receive under broadcast. */
static uint64_t broadcast_bytes(const struct proto_model *m, const struct proto_layout *dst)
{
	uint32_t *seen = calloc(m->ntensors + 1, sizeof(*seen));
	uint64_t total = 0;

	if (seen == NULL)
		return 0;
	for (uint32_t j = 0; j < dst->nranks; j++)
		for (uint32_t i = 0; i < dst->ranks[j].nlocals; i++)
			for (uint32_t k = 0; k < dst->ranks[j].locals[i].npieces; k++) {
				uint32_t t = dst->ranks[j].locals[i].pieces[k].tensor;
				if (seen[t] != j + 1) {
					seen[t] = j + 1;
					total += m->tensors[t].nbytes;
				}
			}
	free(seen);
	return total;
}

static void plan_digest(struct proto_plan *p)
{
	crypto_generichash_state st;
	uint64_t hdr[2] = {p->nsrc, p->ndst};

	crypto_generichash_init(&st, NULL, 0, sizeof(p->digest));
	crypto_generichash_update(&st, (const uint8_t *)hdr, sizeof(hdr));
	for (uint32_t i = 0; i < p->nparcels; i++) {
		const struct proto_parcel *pc = &p->parcels[i];
		uint64_t h[3] = {pc->src_rank, pc->dst_rank, pc->bytes};
		crypto_generichash_update(&st, (const uint8_t *)h, sizeof(h));
		/* Runs are plain u64 fields: hash them as they lie in memory
		 * (little-endian hosts only, which tessera targets). */
		crypto_generichash_update(&st, (const uint8_t *)&p->runs[pc->run0],
					  pc->nruns * sizeof(struct proto_run));
	}
	crypto_generichash_final(&st, p->digest, sizeof(p->digest));
}

int proto_plan_build(const struct proto_model *m, const struct proto_layout *src,
		     const struct proto_layout *dst, struct proto_plan *out,
		     struct proto_err *err)
{
	struct builder b = {.src = src, .dst = dst};
	struct holder *h = NULL;
	uint64_t *hstart = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	/* An FP8 layout's pieces index its own model: both sides must. */
	if (memcmp(proto_layout_model(m, src)->digest, proto_layout_model(m, dst)->digest,
		   sizeof(m->digest)) != 0)
		return proto_errf(err, EINVAL, "plan: the layouts serve different models (one serves FP8: "
				  "it is planned from the publisher's quantized source, not another layout)");
	m = proto_layout_model(m, dst);
	b.m = m;
	if (index_holders(m, src, &h, &hstart) != 0)
		return proto_errf(err, ENOMEM, "plan: out of memory");
	for (uint32_t j = 0; j < dst->nranks; j++) {
		for (uint32_t li = 0; li < dst->ranks[j].nlocals; li++) {
			const struct proto_local *dl = &dst->ranks[j].locals[li];
			out->retained_bytes += dl->nbytes;
			for (uint32_t pi = 0; pi < dl->npieces; pi++) {
				uint32_t t = dl->pieces[pi].tensor;
				rc = cover_piece(&b, j, li, pi, h + hstart[t], hstart[t + 1] - hstart[t], err);
				if (rc != 0)
					goto fail;
			}
		}
	}
	qsort(b.segs, b.nsegs, sizeof(*b.segs), cmp_pseg);
	out->segs = malloc((b.nsegs + 1) * sizeof(*out->segs));
	out->parcels = malloc((b.nsegs + 1) * sizeof(*out->parcels));
	if (out->segs == NULL || out->parcels == NULL) {
		rc = proto_errf(err, ENOMEM, "plan: out of memory");
		goto fail;
	}
	for (uint64_t i = 0; i < b.nsegs; i++) {
		const struct pseg *s = &b.segs[i];
		struct proto_segment *os = &out->segs[i];
		struct proto_parcel *pc;

		if (i == 0 || s->src_rank != b.segs[i - 1].src_rank ||
		    s->dst_rank != b.segs[i - 1].dst_rank) {
			pc = &out->parcels[out->nparcels++];
			*pc = (struct proto_parcel){.src_rank = s->src_rank, .dst_rank = s->dst_rank,
						    .seg0 = i, .run0 = b.nruns};
		}
		pc = &out->parcels[out->nparcels - 1];
		*os = (struct proto_segment){.tensor = s->tensor, .src_local = s->src_local,
					     .dst_local = s->dst_local, .box = s->box,
					     .run0 = b.nruns};
		rc = segment_runs(&b, s);
		if (rc != 0) {
			rc = proto_errf(err, ENOMEM, "plan: out of memory");
			goto fail;
		}
		os->nruns = b.nruns - os->run0;
		pc->nsegs++;
		pc->nruns = b.nruns - pc->run0;
	}
	out->nsegs = b.nsegs;
	out->runs = b.runs;
	out->nruns = b.nruns;
	b.runs = NULL;
	for (uint32_t i = 0; i < out->nparcels; i++) {
		struct proto_parcel *pc = &out->parcels[i];
		uint64_t off = 0;
		for (uint64_t r = pc->run0; r < pc->run0 + pc->nruns; r++) {
			out->runs[r].pay_off = off;
			off += out->runs[r].len;
		}
		pc->bytes = off;
		out->mapped_bytes += off;
	}
	out->nsrc = src->nranks;
	out->ndst = dst->nranks;
	out->broadcast_bytes = broadcast_bytes(m, dst);
	plan_digest(out);
	free(b.segs);
	free(h);
	free(hstart);
	return 0;
fail:
	free(b.segs);
	free(b.runs);
	free(h);
	free(hstart);
	proto_plan_fini(out);
	return rc;
}

void proto_plan_fini(struct proto_plan *p)
{
	free(p->parcels);
	free(p->segs);
	free(p->runs);
	memset(p, 0, sizeof(*p));
}

const struct proto_parcel *proto_plan_parcel(const struct proto_plan *p, uint32_t src_rank,
					     uint32_t dst_rank)
{
	uint32_t lo = 0, hi = p->nparcels;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct proto_parcel *pc = &p->parcels[mid];
		if (pc->src_rank == src_rank && pc->dst_rank == dst_rank)
			return pc;
		if (pc->src_rank < src_rank || (pc->src_rank == src_rank && pc->dst_rank < dst_rank))
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

json_t *proto_plan_to_json(const struct proto_plan *p, const struct proto_model *m,
			   const struct proto_layout *src, const struct proto_layout *dst)
{
	json_t *parcels = json_array();

	m = proto_layout_model(m, dst);
	for (uint32_t i = 0; i < p->nparcels; i++) {
		const struct proto_parcel *pc = &p->parcels[i];
		json_t *segs = json_array();
		for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++) {
			const struct proto_segment *sg = &p->segs[s];
			const struct proto_tensor *t = &m->tensors[sg->tensor];
			json_t *box = json_array(), *runs = json_array();
			for (uint32_t d = 0; d < t->ndim; d++)
				json_array_append_new(box, json_pack("[I,I]", (json_int_t)sg->box.lo[d],
								     (json_int_t)sg->box.hi[d]));
			for (uint64_t r = sg->run0; r < sg->run0 + sg->nruns; r++)
				json_array_append_new(runs, json_pack("[I,I,I]",
								      (json_int_t)p->runs[r].src_off,
								      (json_int_t)p->runs[r].dst_off,
								      (json_int_t)p->runs[r].len));
			json_array_append_new(
				segs, json_pack("{s:s,s:o,s:s,s:s,s:o}", "tensor", t->name, "box", box,
						"src_local", src->ranks[pc->src_rank].locals[sg->src_local].name,
						"dst_local", dst->ranks[pc->dst_rank].locals[sg->dst_local].name,
						"runs", runs));
		}
		json_array_append_new(parcels, json_pack("{s:i,s:i,s:I,s:o}", "src_rank",
							 (int)pc->src_rank, "dst_rank", (int)pc->dst_rank,
							 "bytes", (json_int_t)pc->bytes, "segments", segs));
	}
	return json_pack("{s:o,s:I,s:I,s:I}", "parcels", parcels, "retained_bytes",
			 (json_int_t)p->retained_bytes, "mapped_bytes", (json_int_t)p->mapped_bytes,
			 "broadcast_bytes", (json_int_t)p->broadcast_bytes);
}

uint64_t proto_parcel_run_at(const struct proto_plan *p, const struct proto_parcel *pc,
			     uint64_t off)
{
	uint64_t lo = pc->run0, hi = pc->run0 + pc->nruns;
	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (p->runs[mid].pay_off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* The segment of parcel pc owning run r, for its local tensor. */
static const struct proto_segment *run_segment(const struct proto_plan *p,
					       const struct proto_parcel *pc, uint64_t r)
{
	uint64_t lo = pc->seg0, hi = pc->seg0 + pc->nsegs;

	while (hi - lo > 1) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (p->segs[mid].run0 <= r)
			lo = mid;
		else
			hi = mid;
	}
	return &p->segs[lo];
}

enum walk_op { WALK_READ, WALK_WRITE, WALK_SPAN };

/* Walks payload [off, off+len) run by run on the destination side (dst) or
 * the source side: reads rank memory into buf, writes buf into it, or calls
 * span with each run's place in rank memory (base and buf unused). */
static void walk(const struct proto_plan *p, const struct proto_parcel *pc,
		 const struct proto_layout *l, bool dst, uint8_t *base, uint64_t off,
		 uint64_t len, uint8_t *buf, enum walk_op op,
		 void (*span)(void *arg, uint64_t at, uint64_t n), void *arg)
{
	uint64_t r = proto_parcel_run_at(p, pc, off), end = off + len;
	uint32_t rank = dst ? pc->dst_rank : pc->src_rank;

	for (; off < end && r < pc->run0 + pc->nruns; r++) {
		const struct proto_run *run = &p->runs[r];
		const struct proto_segment *sg = run_segment(p, pc, r);
		uint64_t in = off - run->pay_off, n = PROTO_MIN(run->len - in, end - off);
		const struct proto_local *lt =
			&l->ranks[rank].locals[dst ? sg->dst_local : sg->src_local];
		uint64_t at = lt->offset + (dst ? run->dst_off : run->src_off) + in;
		if (op == WALK_SPAN)
			span(arg, at, n);
		else if (op == WALK_WRITE)
			memcpy(base + at, buf, n);
		else
			memcpy(buf, base + at, n);
		if (op != WALK_SPAN)
			buf += n;
		off += n;
	}
}

void proto_parcel_gather(const struct proto_plan *p, const struct proto_parcel *pc,
			 const struct proto_layout *src, const uint8_t *src_rank_base,
			 uint64_t off, uint64_t len, uint8_t *out)
{
	walk(p, pc, src, false, (uint8_t *)src_rank_base, off, len, out, WALK_READ, NULL, NULL);
}

void proto_parcel_ungather(const struct proto_plan *p, const struct proto_parcel *pc,
			   const struct proto_layout *src, uint8_t *src_rank_base, uint64_t off,
			   uint64_t len, const uint8_t *in)
{
	walk(p, pc, src, false, src_rank_base, off, len, (uint8_t *)in, WALK_WRITE, NULL, NULL);
}

void proto_parcel_scatter(const struct proto_plan *p, const struct proto_parcel *pc,
			  const struct proto_layout *dst, uint8_t *dst_rank_base, uint64_t off,
			  uint64_t len, const uint8_t *in)
{
	walk(p, pc, dst, true, dst_rank_base, off, len, (uint8_t *)in, WALK_WRITE, NULL, NULL);
}

void proto_parcel_dst_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *dst, uint64_t off, uint64_t len,
			    void (*span)(void *arg, uint64_t at, uint64_t n), void *arg)
{
	walk(p, pc, dst, true, NULL, off, len, NULL, WALK_SPAN, span, arg);
}

void proto_parcel_src_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *src, uint64_t off, uint64_t len,
			    void (*span)(void *arg, uint64_t at, uint64_t n), void *arg)
{
	walk(p, pc, src, false, NULL, off, len, NULL, WALK_SPAN, span, arg);
}

size_t proto_parcel_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			  const struct proto_layout *dst, uint64_t off, uint64_t len,
			  struct proto_span *out, size_t cap)
{
	uint64_t r = proto_parcel_run_at(p, pc, off), end = off + len, start = off;
	size_t n = 0;

	for (; off < end && r < pc->run0 + pc->nruns; r++) {
		const struct proto_run *run = &p->runs[r];
		const struct proto_local *lt =
			&dst->ranks[pc->dst_rank].locals[run_segment(p, pc, r)->dst_local];
		uint64_t in = off - run->pay_off, k = PROTO_MIN(run->len - in, end - off);
		uint64_t at = lt->offset + run->dst_off + in;
		if (n > 0 && n <= cap && out[n - 1].dst_off + out[n - 1].len == at)
			out[n - 1].len += k; /* adjacent in the block too: one span */
		else if (n++ < cap)
			out[n - 1] = (struct proto_span){at, off - start, k};
		off += k;
	}
	return n;
}
