/* N-dimensional half-open boxes: the geometry under layouts and the planner. */
#include "proto/box.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void proto_boxes_fini(struct proto_boxes *l)
{
	free(l->v);
	memset(l, 0, sizeof(*l));
}

int proto_boxes_push(struct proto_boxes *l, const struct proto_box *b)
{
	if (l->n == l->cap) {
		uint32_t cap = l->cap ? 2 * l->cap : 8;
		struct proto_box *v = realloc(l->v, cap * sizeof(*v));
		if (v == NULL)
			return -ENOMEM;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *b;
	return 0;
}

uint64_t proto_box_nelem(const struct proto_box *b, uint32_t ndim)
{
	uint64_t n = 1;
	for (uint32_t d = 0; d < ndim; d++)
		n *= b->hi[d] - b->lo[d];
	return n;
}

bool proto_box_intersect(const struct proto_box *a, const struct proto_box *b,
			 uint32_t ndim, struct proto_box *out)
{
	for (uint32_t d = 0; d < ndim; d++) {
		out->lo[d] = a->lo[d] > b->lo[d] ? a->lo[d] : b->lo[d];
		out->hi[d] = a->hi[d] < b->hi[d] ? a->hi[d] : b->hi[d];
		if (out->lo[d] >= out->hi[d])
			return false;
	}
	return true;
}

int proto_box_subtract(const struct proto_box *a, const struct proto_box *x,
		       uint32_t ndim, struct proto_boxes *out)
{
	/* Peel slabs off dimension by dimension; `rest` shrinks towards x. */
	struct proto_box rest = *a;

	for (uint32_t d = 0; d < ndim; d++) {
		if (rest.lo[d] < x->lo[d]) {
			struct proto_box s = rest;
			s.hi[d] = x->lo[d];
			if (proto_boxes_push(out, &s) != 0)
				return -ENOMEM;
		}
		if (x->hi[d] < rest.hi[d]) {
			struct proto_box s = rest;
			s.lo[d] = x->hi[d];
			if (proto_boxes_push(out, &s) != 0)
				return -ENOMEM;
		}
		rest.lo[d] = x->lo[d];
		rest.hi[d] = x->hi[d];
	}
	return 0;
}

/* Boxes for elements [start,end) of the sub-tensor at dims [d, ndim), with
 * dims < d fixed by prefix. */
static int flat_rec(const uint64_t *shape, uint32_t ndim, uint32_t d,
		    struct proto_box *prefix, uint64_t start, uint64_t end,
		    struct proto_boxes *out)
{
	uint64_t inner = 1, i0, i1, ra, rb;
	int rc;

	if (start >= end)
		return 0;
	if (d == ndim)
		return proto_boxes_push(out, prefix);
	for (uint32_t k = d + 1; k < ndim; k++)
		inner *= shape[k];
	i0 = start / inner;
	ra = start % inner;
	i1 = end / inner;
	rb = end % inner;
	if (i0 == i1) {
		prefix->lo[d] = i0;
		prefix->hi[d] = i0 + 1;
		return flat_rec(shape, ndim, d + 1, prefix, ra, rb, out);
	}
	if (ra > 0) {
		prefix->lo[d] = i0;
		prefix->hi[d] = i0 + 1;
		rc = flat_rec(shape, ndim, d + 1, prefix, ra, inner, out);
		if (rc != 0)
			return rc;
		i0++;
	}
	if (i1 > i0) {
		struct proto_box b = *prefix;
		b.lo[d] = i0;
		b.hi[d] = i1;
		for (uint32_t k = d + 1; k < ndim; k++) {
			b.lo[k] = 0;
			b.hi[k] = shape[k];
		}
		rc = proto_boxes_push(out, &b);
		if (rc != 0)
			return rc;
	}
	if (rb > 0) {
		prefix->lo[d] = i1;
		prefix->hi[d] = i1 + 1;
		return flat_rec(shape, ndim, d + 1, prefix, 0, rb, out);
	}
	return 0;
}

int proto_flat_to_boxes(const uint64_t *shape, uint32_t ndim, uint64_t start,
			uint64_t end, struct proto_boxes *out)
{
	struct proto_box prefix;

	memset(&prefix, 0, sizeof(prefix));
	return flat_rec(shape, ndim, 0, &prefix, start, end, out);
}

int proto_piece_boxes(const struct proto_model *m, const struct proto_piece *p,
		      struct proto_boxes *out)
{
	const struct proto_tensor *t = &m->tensors[p->tensor];
	if (p->flat)
		return proto_flat_to_boxes(t->shape, t->ndim, p->box.lo[0], p->box.hi[0], out);
	return proto_boxes_push(out, &p->box);
}

int proto_boxes_cut(struct proto_boxes *unc, const struct proto_box *b, uint32_t ndim,
		    struct proto_boxes *scratch, int (*fn)(void *arg, const struct proto_box *x),
		    void *arg)
{
	int rc = 0;

	scratch->n = 0;
	for (uint32_t u = 0; u < unc->n && rc == 0; u++) {
		struct proto_box x;
		if (!proto_box_intersect(&unc->v[u], b, ndim, &x)) {
			rc = proto_boxes_push(scratch, &unc->v[u]);
			continue;
		}
		if (fn != NULL)
			rc = fn(arg, &x);
		if (rc == 0)
			rc = proto_box_subtract(&unc->v[u], &x, ndim, scratch);
	}
	struct proto_boxes tmp = *unc;
	*unc = *scratch;
	*scratch = tmp;
	return rc;
}

void proto_box_str(char *buf, size_t len, const struct proto_box *b, uint32_t ndim)
{
	size_t n = 0;

	buf[0] = 0;
	for (uint32_t d = 0; d < ndim && n + 48 < len; d++)
		n += (size_t)snprintf(buf + n, len - n, "%s[%llu,%llu)", d ? "," : "",
				      (unsigned long long)b->lo[d], (unsigned long long)b->hi[d]);
}
