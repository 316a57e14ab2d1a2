/* The rebuild's insides, shared by its files (node/rebuild/delta.h says
 * what it does). */
#ifndef NODE_REBUILD_INTERNAL_H
#define NODE_REBUILD_INTERNAL_H

#include "node/rebuild/delta.h"

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/delta.h"
#include "proto/wsum.h"

/* A share of a slot's pieces with their kept checksums, to re-sum (the
 * scrub, below). */
struct scrub_item {
	uint64_t off, len, sum;
	uint32_t elsize;
	uint32_t src_rank, dst_rank, piece;
};

struct scrub_plan {
	struct scrub_item *items;
	uint32_t nitems, share, k;
	uint64_t bytes;
};

/* The last delta of this rank, to patch its parent's slot up to its child. */
struct delta_rot_parcel {
	uint32_t src_rank, dst_rank;
	uint8_t *wire;
	size_t len;
	struct proto_dparcel dp; /* its pieces, built on the loop before it runs */
	bool have_dp;
};

struct delta_rotation {
	struct fetcher *x;       /* whose wire pool its buffers go back to */
	uint64_t tag;            /* the parent's slot, as activated */
	uint64_t parent_version; /* what that slot holds */
	uint64_t version;        /* what the delta makes of it: the active one */
	uint8_t plan_src[PROTO_HASH_BYTES];
	struct delta_rot_parcel *parcels;
	uint32_t nparcels;
	struct node_slot *slot; /* set when it runs: what the catch-up writes */
	struct scrub_plan scrub; /* re-summed after the catch-up (no items: none) */
	/* Set by the loop when an apply waits for the catch-up (or its worker
	 * is being stopped): the scrub after it stops where it is, and
	 * scrub_cut says so (both atomic). */
	int hurry, scrub_cut;
};

/* Piece checksums of one parcel (sums.c). */
struct delta_psums {
	uint32_t src_rank, dst_rank, npieces;
	uint64_t *sums;             /* npieces */
	struct proto_dpiece *pieces; /* where each is in the rank's block */
};

struct delta_sums {
	uint8_t digest[PROTO_HASH_BYTES];   /* the version's manifest */
	uint8_t plan_src[PROTO_HASH_BYTES]; /* the plan the pieces come from */
	uint64_t tag;      /* the slot they describe, as activated (0: none yet) */
	uint32_t nparcels; /* in the fetch's parcel order */
	uint32_t known;    /* parcels applied with their parent's kept */
	bool complete;     /* every parcel's are set (the apply succeeded) */
	struct delta_psums *p;
};

struct delta_scrub {
	const uint8_t *host; /* the active slot's bytes, which it reads */
	int fd;              /* and its memfd (-1: none), read instead (slot_wsum) */
	uint64_t tag, version;
	struct scrub_plan plan;
	/* Not NULL: no checksums were kept for the slot (an anchor, a whole
	 * fetch): every piece of these is summed instead, to be kept. */
	struct delta_sums *learn;
	uint64_t learn_ms;
	int stop; /* atomic */
	int rc;
	struct proto_err err;
};

/* The served slot (the agent's, as of now). */
static inline struct node_slot *delta_active(const struct delta_state *d)
{
	return *d->o.active;
}

void delta__rotation_stop(struct delta_rotation *r);
void delta__rotation_free(struct delta_rotation *r);
void delta__sums_free(struct delta_sums *s);
struct delta_sums *delta__sums_new(uint32_t nparcels);
struct delta_sums *delta__sums_dup(const struct delta_sums *s);
const struct delta_sums *delta__active_sums(const struct delta_state *d);
const uint64_t *delta__sums_find(const struct delta_sums *s, uint32_t src, uint32_t dst,
				 const struct proto_dparcel *dp);
/* After an activation: the new active slot's checksums (b's, or summed on
 * a worker), and the next share of its scrub. */
void delta__sums_activated(struct delta_state *d, struct delta_build *b, struct node_slot *old);
void delta__scrub_stop(struct delta_state *d);
int delta__scrub_plan(const struct delta_sums *s, uint32_t share, uint32_t k, size_t len,
		      struct scrub_plan *sp);
int delta__scrub_check(const struct scrub_plan *sp, const uint8_t *host, int fd, uint64_t v,
		       const int *stop, struct proto_err *err);
int delta__rotate_start(struct delta_state *d, uint64_t version, size_t len,
			struct node_slot **slot, struct node_rebuild **rb,
			struct delta_rotation **rot, bool *retry, struct proto_err *err);
int delta__copy_start(struct delta_state *d, uint64_t version, size_t len,
		      const struct node_slot *parent, struct node_slot **slot,
		      struct node_rebuild **rb, struct proto_err *err);
void delta__standby_drop(struct delta_state *d);
void delta__standby_arm(struct delta_state *d);
void delta__keep_rotation(struct delta_state *d, struct delta_build *b, struct node_slot *old);
void delta__warm_stop(struct delta_state *d);

#endif
