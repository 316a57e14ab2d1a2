/* FP8 serving layouts: the quantized source their plans read, filled from the snapshots. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/box.h"

struct pub_q *node__pub_q_get(struct node_pub *p, const struct proto_layout *dst,
			      struct proto_err *err)
{
	struct pub_q *q;

	for (q = p->qs; q != NULL; q = q->next)
		if (memcmp(q->digest, dst->model->digest, PROTO_HASH_BYTES) == 0)
			return q;
	q = calloc(1, sizeof(*q));
	if (q == NULL) {
		proto_errf(err, ENOMEM, "out of memory");
		return NULL;
	}
	if (proto_layout_fp8_source(&p->model, dst, &q->src, err) != 0) {
		free(q);
		return NULL;
	}
	memcpy(q->digest, dst->model->digest, PROTO_HASH_BYTES);
	q->cap = node__pub_page_round(q->src.ranks[0].nbytes);
	q->next = p->qs;
	p->qs = q;
	return q;
}

const uint8_t *node__pub_q_block(const struct pub_q *q, uint64_t v)
{
	for (int i = 0; i < 2; i++)
		if (v != 0 && q->ver[i] == v && q->blk[i] != NULL)
			return q->blk[i];
	return NULL;
}

void node__pub_q_free_all(struct node_pub *p)
{
	while (p->qs != NULL) {
		struct pub_q *q = p->qs;
		p->qs = q->next;
		for (int i = 0; i < 2; i++)
			node_serve_unmap(q->blk[i], q->cap);
		proto_layout_fini(&q->src);
		free(q->scratch.p);
		free(q);
	}
}

/* ---- reading a logical tensor out of the trainer ranks ------------------------ */

struct copy {
	const uint8_t *from;
	uint8_t *to;
	size_t es;
};

static void copy_run(void *arg, uint32_t tensor, uint64_t first, uint64_t count, uint64_t at)
{
	struct copy *c = arg;
	(void)tensor;
	memcpy(c->to + first * c->es, c->from + at, count * c->es);
}

/* Elements of tensor t trainer rank r holds. */
static uint64_t held(const struct proto_model *m, const struct proto_layout *tl, uint32_t r,
		     uint32_t t, const struct proto_local **whole)
{
	uint64_t n = 0;

	*whole = NULL;
	for (uint32_t i = 0; i < tl->ranks[r].nlocals; i++) {
		const struct proto_local *lt = &tl->ranks[r].locals[i];
		for (uint32_t k = 0; k < lt->npieces; k++) {
			const struct proto_piece *pc = &lt->pieces[k];
			uint64_t e = pc->flat ? pc->box.hi[0] - pc->box.lo[0]
					      : proto_box_nelem(&pc->box, m->tensors[t].ndim);
			if (pc->tensor != t)
				continue;
			n += e;
			/* Row-major and in one stretch: the piece is the whole
			 * tensor and nothing is interleaved with it. */
			if (e == m->tensors[t].nelem && (lt->npieces == 1 || lt->concat_dim == 0))
				*whole = lt;
		}
	}
	return n;
}

/* Tensor t's bytes, row-major: where one rank holds it in one stretch, a
 * pointer into that rank's memory; else copied into to. */
static const uint8_t *tensor_bytes(const struct node_pub *p, uint8_t *const *blocks, uint32_t t,
				   uint8_t *to)
{
	const struct proto_tensor *x = &p->model.tensors[t];
	struct copy c = {.to = to, .es = proto_dtype_size(x->dtype)};
	const struct proto_local *whole;
	int64_t full = -1;

	for (uint32_t r = 0; r < p->tl.nranks && full < 0; r++) {
		if (held(&p->model, &p->tl, r, t, &whole) != x->nelem)
			continue;
		if (whole != NULL) {
			for (uint32_t k = 0; k < whole->npieces; k++)
				if (whole->pieces[k].tensor == t)
					return blocks[r] + whole->offset + whole->pieces[k].base * c.es;
		}
		full = r;
	}
	for (uint32_t r = 0; r < p->tl.nranks; r++) {
		if (full >= 0 && r != (uint32_t)full)
			continue;
		c.from = blocks[r];
		proto_layout_walk_rank(&p->model, &p->tl, r, t, copy_run, &c);
	}
	return to;
}

/* ---- quantizing ------------------------------------------------------------------ */

struct qsrc {
	const struct node_pub *p;
	uint8_t *const *blocks;
};

static const uint8_t *qsrc_bytes(void *arg, uint32_t t, uint8_t *scratch)
{
	struct qsrc *s = arg;
	return tensor_bytes(s->p, s->blocks, t, scratch);
}

int node__pub_quantize(const struct node_pub *p, struct pub_q *q, uint64_t v, uint64_t keep,
		       bool reuse, uint8_t *const *blocks, unsigned threads,
		       const atomic_bool *abort, struct proto_err *err)
{
	struct qsrc s = {.p = p, .blocks = blocks};
	int w, rc;

	if (reuse && node__pub_q_block(q, v) != NULL)
		return 0;
	for (int i = 0; i < 2; i++)
		if (q->ver[i] == v && v != keep)
			q->ver[i] = 0; /* an earlier try of v: not this snapshot's */
	w = q->ver[0] == keep && keep != 0 ? 1 : 0;
	if (q->blk[w] == NULL && (q->blk[w] = node_serve_map(q->cap)) == NULL)
		return proto_errf(err, ENOMEM, "cannot map the %zu-byte FP8 source", q->cap);
	q->ver[w] = 0; /* until it is whole */
	rc = proto_layout_fp8_fill(&p->model, &q->src, qsrc_bytes, &s, threads, abort, &q->scratch,
				   q->blk[w], err);
	if (rc == 0)
		q->ver[w] = v;
	return rc;
}
