/* Cross-layout sources: where the bytes a destination rank keeps sit in the
 * ranks of a replica of another layout. */
#ifndef PROTO_XMAP_H
#define PROTO_XMAP_H

/*
 * A replica that holds a version complete holds the whole model in its own
 * layout (the holder layout H): rank h's memory is its local tensors back
 * to back (proto_layout, locals[i].offset). A node of layout L fetching the
 * same version needs, for each chunk of each of its parcels (trainer rank
 * s -> its rank d), payload bytes [off, off+len); the parcel's runs say
 * where each payload byte sits in rank d's memory. The plan H -> L
 * (proto_plan_build with H as source) says, for every byte of rank d's
 * memory, which rank of H holds it and where: that is the map built here,
 * a sorted list of spans (dst offset in rank d's memory, length, holder
 * rank, offset in that rank's memory). Composing the two gives a chunk's
 * pieces: (holder rank, offset, length, offset inside the chunk), in
 * payload order. A TP1 rank's chunk comes from both ranks of a TP2 replica,
 * a TP4 rank's from one quarter of a TP2 rank, a TP2 rank's from two TP4
 * ranks; replicated tensors from whichever rank the planner's rotation
 * picked.
 *
 * Reading: pieces of one holder rank that touch are read as one range, and
 * up to four ranges as one gathering read (a window: fi_readmsg with
 * several remote iovs), so a chunk costs a few hundred one-sided reads at
 * most, not one per row, and only its own bytes (gaps are read along only
 * past a cap on the reads); the windows land in a staging area and the
 * pieces are copied out of it into the chunk's bytes. What comes
 * out is checked against the fetching layout's own signed chunk hash, like
 * any other chunk: the map only says where to look.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/plan.h"
#include "proto/spec.h"

struct proto_xspan {
	uint64_t dst;  /* byte offset in the destination rank's memory */
	uint64_t len;
	uint64_t src;  /* byte offset in the holder rank's memory */
	uint32_t rank; /* the holder rank */
};

struct proto_xmap {
	uint32_t dst_rank;
	uint32_t nranks; /* the holder layout's */
	uint64_t nspans;
	struct proto_xspan *spans; /* sorted by dst, disjoint, adjacent ones merged */
};

/* A chunk's bytes [out, out+len) are holder rank `rank`'s bytes [src, src+len). */
struct proto_xpiece {
	uint32_t rank;
	uint32_t win; /* its window (proto_xmap_windows) */
	uint64_t src, len, out;
	uint64_t at;  /* where its bytes land in the staging area */
};

/* One range of holder memory a window reads. */
struct proto_xseg {
	uint64_t src, len;
};
#define PROTO_XWIN_SEGS 4

/* One read: holder rank `rank`'s ranges segs[0..nsegs) (in source order)
 * into the staging area back to back from stage, len bytes in all. */
struct proto_xwin {
	uint32_t rank;
	uint32_t nsegs;
	uint64_t len, stage;
	struct proto_xseg segs[PROTO_XWIN_SEGS];
};

/* Builds the map of destination rank dst_rank from hp, the plan from the
 * holder layout to the destination layout (proto_plan_build(m, holder,
 * dst)). On failure (-ENOMEM, -EINVAL: a byte mapped twice) *out is empty
 * and err says why. */
int proto_xmap_build(const struct proto_plan *hp, const struct proto_layout *holder,
		     const struct proto_layout *dst, uint32_t dst_rank, struct proto_xmap *out,
		     struct proto_err *err);
void proto_xmap_fini(struct proto_xmap *x);

/* The pieces of payload bytes [off, off+len) of parcel pc of plan p (the
 * trainer's plan into the destination layout dst; pc->dst_rank must be
 * x->dst_rank), in payload order, adjacent ones merged, into out (max
 * entries); *n gets the count. -ENOSPC when more than max are needed,
 * -ERANGE when the range leaves the parcel, -ENOENT when the map lacks a
 * byte (a holder layout that does not cover the model). */
int proto_xmap_pieces(const struct proto_xmap *x, const struct proto_plan *p,
		      const struct proto_parcel *pc, const struct proto_layout *dst, uint64_t off,
		      uint64_t len, struct proto_xpiece *out, size_t max, size_t *n);

/* Groups n pieces into reads (windows): per holder rank, pieces in source
 * order, merged into one range when they touch; up to segs ranges
 * (1..PROTO_XWIN_SEGS: what one gathering read takes) make one window.
 * While there are more than max windows, ranges closer than a gap are
 * merged too, the gap read along (64 bytes, doubling). Windows are placed
 * back to back in a staging area; sets each piece's win and at. Returns
 * the number of windows, -ENOSPC when they would need more than stage_cap
 * bytes of staging (or max is 0), -EINVAL for segs out of range, -ENOMEM. */
int proto_xmap_windows(struct proto_xpiece *pc, size_t n, uint64_t stage_cap, uint32_t segs,
		       struct proto_xwin *out, size_t max);

/*
 * Partial holders. A node offers its slot while it still fetches, with a
 * have-map: one byte per PROTO_XMAP_HAVE_BLOCK bytes of its rank's memory,
 * set once every byte of the block is verified and in place (a block's
 * bytes may come from several chunks; the holder counts them). A reader
 * reads the map and reads a piece only when every block it touches is
 * set: it never asks for bytes the holder has not verified.
 */
#define PROTO_XMAP_HAVE_BLOCK (64u << 10)

/* The have-map's length (blocks) for a rank memory of slot_len bytes. */
uint64_t proto_xmap_have_len(uint64_t slot_len);
/* Counts bytes [at, at+n) of the memory (slot_len bytes) into cnt (one
 * counter per block, each byte counted once) and sets map[b] = 1 for every
 * block whose bytes are all counted. Bytes past slot_len are ignored.
 * Cannot fail. */
void proto_xmap_have_add(uint32_t *cnt, uint8_t *map, uint64_t slot_len, uint64_t at, uint64_t n);
/* The bytes of rank memory rk that no local tensor holds (alignment gaps,
 * the tail): span(arg, offset, length) for each, in order; a holder counts
 * them into its have-map up front (no chunk ever brings them). Cannot
 * fail (-ENOMEM: nothing called). */
int proto_xmap_rank_gaps(const struct proto_rank *rk,
			 void (*span)(void *arg, uint64_t at, uint64_t n), void *arg);
/* Every block of [src, src+len) is set in map (nblocks long); false for a
 * range past it. */
bool proto_xmap_have_covers(const uint8_t *map, uint64_t nblocks, uint64_t src, uint64_t len);

#endif
