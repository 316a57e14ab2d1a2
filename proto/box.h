/* N-dimensional half-open boxes: intersection, subtraction, flat ranges. */
#ifndef PROTO_BOX_H
#define PROTO_BOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/spec.h"

/* A growable list of boxes; free with proto_boxes_fini. */
struct proto_boxes {
	struct proto_box *v;
	uint32_t n, cap;
};

void proto_boxes_fini(struct proto_boxes *l);
/* Appends a box; -ENOMEM leaves the list unchanged. */
int proto_boxes_push(struct proto_boxes *l, const struct proto_box *b);

/* Elements in a box of ndim dims (1 for ndim 0). */
uint64_t proto_box_nelem(const struct proto_box *b, uint32_t ndim);
/* out = a ∩ b; false (out undefined) when empty. */
bool proto_box_intersect(const struct proto_box *a, const struct proto_box *b,
			 uint32_t ndim, struct proto_box *out);
/* Appends a − x to out, where x ⊆ a (at most 2*ndim boxes). */
int proto_box_subtract(const struct proto_box *a, const struct proto_box *x,
		       uint32_t ndim, struct proto_boxes *out);
/* Appends the boxes covering row-major elements [start, end) of a tensor of
 * the given shape (at most 2*ndim-1 boxes). */
int proto_flat_to_boxes(const uint64_t *shape, uint32_t ndim, uint64_t start,
			uint64_t end, struct proto_boxes *out);

/* "[lo,hi),[lo,hi)" into buf (truncated to len). Cannot fail. */
void proto_box_str(char *buf, size_t len, const struct proto_box *b, uint32_t ndim);

/* Appends the boxes a layout piece covers (a flat range becomes several). */
int proto_piece_boxes(const struct proto_model *m, const struct proto_piece *p,
		      struct proto_boxes *out);

/*
 * Cuts b out of every box of *unc (in place; scratch is working space the
 * caller keeps between calls). For each non-empty intersection, fn (may be
 * NULL) is called before it is removed; a non-zero return from fn stops and
 * is returned. -ENOMEM leaves *unc unspecified.
 */
int proto_boxes_cut(struct proto_boxes *unc, const struct proto_box *b,
		    uint32_t ndim, struct proto_boxes *scratch,
		    int (*fn)(void *arg, const struct proto_box *x), void *arg);

#endif
