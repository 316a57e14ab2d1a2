/*
 * The position-weighted checksum of a tensor: a 64-bit, Adler-like, linear
 * sum that a delta updates in O(changes).
 *
 * Definition. A tensor of n elements has element bit patterns x_0..x_{n-1}
 * (little-endian unsigned integers of the element width, 1 to 8 bytes). With
 * p = 4294967291 (the largest prime below 2^32) and v_i = x_i mod p:
 *
 *     A = sum v_i            mod p
 *     B = sum (i + 1) * v_i  mod p
 *     wsum = B << 32 | A
 *
 * Both sums are linear in v, so changing element i from x to x' moves A by
 * d = (x' - x) mod p and B by (i + 1) * d: a receiver updates the parent's
 * checksum from the changed positions and their old and new values alone and
 * never re-reads the tensor. Checksums of pieces combine the same way
 * (proto_wsum_combine), so they can be computed in parallel.
 *
 * What it detects, given a trusted parent checksum:
 *  - a lost, extra or wrong change at one position: A moves by d != 0 (for
 *    elements of at most 16 bits |d| < p always; for 32- and 64-bit elements
 *    the change goes unnoticed only if x' - x is a multiple of p, e.g.
 *    0x00000000 <-> 0xFFFFFFFB);
 *  - a change applied at position j instead of i: A is unchanged but B moves
 *    by (j - i) * d, which is non-zero unless j = i mod p (tensors longer than
 *    p elements alias positions p apart);
 *  - a wrong parent: the receiver starts from the checksum of the parent it
 *    actually holds (computed once from verified bytes, then carried along),
 *    so a different parent gives a different result with probability about
 *    1 - 2^-32 per sum for unstructured differences.
 * Limits: it is linear and not cryptographic. Structured errors cancel, e.g.
 * a set of changes whose differences sum to 0 mod p shifted together by the
 * same offset, or two errors chosen to cancel in both sums. Forged data must
 * be caught by the manifest's BLAKE2b hashes (and, for deltas, the zstd frame
 * checksums); this checksum proves that a sparse apply produced the intended
 * child from the intended parent without re-reading the tensor.
 */
#ifndef PROTO_WSUM_H
#define PROTO_WSUM_H

#include <stddef.h>
#include <stdint.h>

#define PROTO_WSUM_P 4294967291u

/* The checksum of nelem elements of elsize bytes (1, 2, 4 or 8) at data (any
 * alignment). The first element has position 0. Cannot fail. */
uint64_t proto_wsum(size_t elsize, const void *data, uint64_t nelem);

/*
 * The checksum of a whole made of `sum` (positions from 0) followed, at
 * position `base`, by a piece whose own checksum (positions from 0) is
 * `part`. Because the sums are linear, `part` may also be the checksum of a
 * difference vector (values (x' - x) mod p): then the result is the checksum
 * after those changes. Cannot fail.
 */
uint64_t proto_wsum_combine(uint64_t sum, uint64_t base, uint64_t part);

/* The checksum after one element at position pos changes its bit pattern from
 * old to new (element width irrelevant). Cannot fail. */
uint64_t proto_wsum_update(uint64_t sum, uint64_t pos, uint64_t old, uint64_t new_);

/* x mod p for a bit pattern x: the value v an element contributes. */
static inline uint64_t proto_wsum_val(uint64_t x)
{
	return x % PROTO_WSUM_P;
}

#endif
