/*
 * The canary score: a fixed-input number computed through a rank's live
 * weights, so that anyone holding the expected value can check that what a
 * serving engine reads is the version it should be.
 *
 * Definition. Each local tensor t of a rank (in the rank's order) is read as
 * a matrix W of rows x cols, cols its last dimension (1 for a scalar) and
 * rows the product of the others. A fixed input vector x (one entry per
 * column) and a fixed readout u (one per row), both derived from t's index,
 * give the tensor's term u^T g(W) x, and the score is the sum of the terms
 * of all tensors: a matrix-vector product and a dot product per tensor.
 *
 *   x_j, u_r  odd multiples of 1/32 in (-1, 1) from a hash of (t, j) and
 *             (t, r); u_r * x_j is exact in FP32;
 *   g(w)      the element as FP32 (bf16, fp16, fp8, fp32, fp64 rounded,
 *             integers and bool converted), clamped to +-2^30 (NaN to
 *             -2^30): bounded, so random bit patterns cannot overflow the
 *             fixed point, and the identity on any real weight, so a changed
 *             value moves the score (weights beyond 2^30 all read the same);
 *   term      each product (u_r * x_j) * g(w) is rounded once to FP32 and
 *             then accumulated exactly in 32.32 fixed point (truncated to
 *             a multiple of 2^-32), in a wrapping 64-bit sum.
 *
 * The exact accumulation makes the score independent of the order in which
 * elements are visited: the publisher adds up the parcels of a destination
 * rank as it gathers them (the bytes of one rank come from several trainer
 * ranks) and gets bit for bit what a probe reading the rank's block gets.
 * Padding between local tensors does not count.
 *
 * It is a check of the live weights, not an integrity hash (that is the
 * manifest's job): a change to an element moves the score unless the
 * change is below what the fixed point resolves (2^-32 absolute; for large
 * weights the FP32 product's 24-bit precision). Cost: about one pass of
 * scalar FP32 work per element (a few ns; the publisher pays it per
 * gathered anchor parcel, a probe per read of its rank); a delta parcel's
 * part is its parent's updated from the changed elements, which the
 * delta encoder's scan hands over (proto_canary_map_changes): no pass of
 * its own.
 */
#ifndef PROTO_CANARY_H
#define PROTO_CANARY_H

#include <stddef.h>
#include <stdint.h>

#include "proto/plan.h"
#include "proto/spec.h"

/* Scale of the fixed point: a score s stands for s / 2^32. */
#define PROTO_CANARY_ONE 4294967296.0

/* The term of elements [first, first + count) (row-major) of local tensor
 * number index of a rank, whose dtype is dt and whose last dimension is cols
 * (0 is taken as 1), read from bytes (count elements, any alignment).
 * Cannot fail. */
uint64_t proto_canary_elems(enum proto_dtype dt, uint32_t index, uint64_t cols,
			    uint64_t first, uint64_t count, const uint8_t *bytes);

/* The score of a whole rank block (local tensors at their offsets; len
 * bytes, at least rank->nbytes, else -ERANGE and *out unchanged). */
int proto_canary_rank(const struct proto_rank *rank, const uint8_t *block, size_t len,
		      uint64_t *out);

/* A parcel's part of its destination rank's score, from its payload
 * (pc->bytes bytes, as gathered). The parts of every parcel of a
 * destination rank add up (wrapping) to the rank's score. Cannot fail. */
uint64_t proto_canary_parcel(const struct proto_plan *p, const struct proto_parcel *pc,
			     const struct proto_layout *dst, const uint8_t *payload);

/* The same part for a payload that differs from a parent payload of the
 * same parcel in few elements, given the parent's part: the terms are
 * summed exactly, so only the changed elements are scored (old terms out,
 * new ones in), and the result is bit for bit proto_canary_parcel's. Both
 * payloads are read once, compared in blocks. parent NULL: every element
 * is scored (parent_part is added). Cannot fail. */
uint64_t proto_canary_parcel_update(const struct proto_plan *p, const struct proto_parcel *pc,
				    const struct proto_layout *dst, uint64_t parent_part,
				    const uint8_t *parent, const uint8_t *payload);

/*
 * The same update from changes another pass has found already (the delta
 * encoder's scan, proto/delta.h's on_changes), so the payloads are not
 * compared again: a map of a parcel's runs by payload offset says where a
 * changed element lies in its destination tensor. map_new: NULL when out
 * of memory; map_free(NULL) is harmless.
 */
struct proto_canary_map;
struct proto_canary_map *proto_canary_map_new(const struct proto_plan *p,
					      const struct proto_parcel *pc,
					      const struct proto_layout *dst);
void proto_canary_map_free(struct proto_canary_map *m);

/* What k changed elements of es bytes add to the parcel's part (new terms
 * in, old ones out): element q at payload offset off + pos[q] * es (pos
 * ascending), its old bytes at a + pos[q] * es (a NULL: zero), its new ones
 * at b + pos[q] * es. Positions outside the parcel's runs add nothing. The
 * parts of any split of a payload's changes add up (wrapping) to
 * proto_canary_parcel_update's difference; the map is only read, so
 * threads may call this at once. Cannot fail. */
uint64_t proto_canary_map_changes(const struct proto_canary_map *m, uint64_t off, size_t es,
				  const uint32_t *pos, size_t k, const uint8_t *a,
				  const uint8_t *b);

/*
 * A payload scored in pieces, by threads at once (the publisher's gather):
 * span gives the part of the elements lying whole in payload bytes
 * [off, off + len), reading only those bytes (payload is the payload's
 * start); straddler the part of the one element, if any, that holds both
 * byte x - 1 and byte x (it reads that element). Spans that cut the payload
 * at x_1 < x_2 < ..., at least 8 bytes apart (no element is cut twice),
 * plus the straddlers at each x_k, add up (wrapping) to proto_canary_parcel.
 * Cannot fail.
 */
uint64_t proto_canary_map_span(const struct proto_canary_map *m, uint64_t off, uint64_t len,
			       const uint8_t *payload);
uint64_t proto_canary_map_straddler(const struct proto_canary_map *m, uint64_t x,
				    const uint8_t *payload);

/* The score as a number (s / 2^32, s read as signed). */
double proto_canary_value(uint64_t s);

#endif
