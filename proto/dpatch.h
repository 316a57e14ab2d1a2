/*
 * A parcel delta prepared for an in-place install: decoded, checked and
 * turned into (position, new bytes) while the block still serves its
 * parent, so that the pause only writes.
 *
 * proto_dpatch_prepare parses the delta (hostile bytes), checks it was made
 * for the parent whose piece checksums are given (read from the block ahead
 * with proto_dparcel_sums), decodes every change on a small pool of
 * threads, reads the old element at each changed position from the block
 * (read only: it serves on), computes the new bytes, and verifies every
 * piece's child checksum from (position, old, new) alone. Nothing is
 * written; the pages the write will store to are mapped writable
 * (MADV_POPULATE_WRITE, bytes unchanged), so that the write takes no page
 * fault. A delta that does not verify is refused before any pause.
 *
 * proto_dpatch_write then stores the new bytes at the changed positions,
 * the chunks of every patch given split over one pool: O(changes), no
 * decoding, cannot fail, one wake-up of the pool however many parcels the
 * install has. The block must still hold the bytes the patch was prepared
 * from (nothing writes a served slot but its install).
 *
 * The pool (proto_dpatch_pool_new) is the caller's: an install makes one,
 * prepares all its parcels on it, writes them all in one run, frees it.
 * It says how many threads of the process's pool (proto/pool.h) a patch
 * runs on, and has them made when it is made, not during the install.
 *
 * Memory: 4 bytes of position plus the element width per change (about 6
 * bytes per change for BF16, 3 % of the block at 1 % changed).
 */
#ifndef PROTO_DPATCH_H
#define PROTO_DPATCH_H

#include <stddef.h>
#include <stdint.h>

#include "proto/delta.h"
#include "proto/util.h"

struct proto_dpatch_pool;

/* One chunk's changes: element positions from dst, ascending, and the new
 * bytes (w each) to store there. */
struct proto_dpatch_chunk {
	uint8_t *dst;
	uint32_t w, n, cap;
	uint32_t *pos;
	uint8_t *val;
	uint64_t part; /* its checksum movement (proto/wsum.h), chunk-relative */
};

struct proto_dpatch {
	uint32_t nchunks;
	struct proto_dpatch_chunk *chunks;
	uint64_t nchanges;
};

/* A pool of proto_dpatch_threads(threads) threads in all, the caller's
 * being one (fewer run when threads cannot be made). NULL: out of memory.
 * Freed with proto_dpatch_pool_free (NULL is fine); the threads stay in
 * the process's pool. */
struct proto_dpatch_pool *proto_dpatch_pool_new(unsigned threads);
void proto_dpatch_pool_free(struct proto_dpatch_pool *pool);
/* Threads the pool runs on, the caller's included. */
unsigned proto_dpatch_pool_size(const struct proto_dpatch_pool *pool);

/*
 * Prepares the delta (len bytes, the caller's) of parcel d against block,
 * whose pieces have the checksums sums (d->npieces), decoding on pool (the
 * caller's; used only during the call). On failure *out is empty (fini
 * harmless) and err says why in one line; block is untouched either way.
 */
int proto_dpatch_prepare(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			 uint8_t *block, const uint64_t *sums, struct proto_dpatch_pool *pool,
			 struct proto_dpatch *out, struct proto_err *err);

/* Writes the n prepared patches p[0..n) into the blocks given to prepare,
 * their chunks split over pool in one run (NULL: on the caller's thread
 * alone). Cannot fail. */
void proto_dpatch_write(const struct proto_dpatch *p, size_t n, struct proto_dpatch_pool *pool);

/* Frees the changes. Twice is harmless. */
void proto_dpatch_fini(struct proto_dpatch *p);

/* Threads a pool of `threads` (0: online CPUs, at most 8) runs on. */
unsigned proto_dpatch_threads(unsigned threads);

#endif
