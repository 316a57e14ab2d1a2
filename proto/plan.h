/*
 * The transfer planner: a pure function from (model, source layout,
 * destination layout) to the parcels each source rank owes each destination
 * rank.
 *
 * Model. Every destination piece is a box of a logical tensor (a flat piece
 * is first cut into at most 2*ndim-1 boxes). Its still-uncovered part is a
 * list of boxes; source pieces are visited in a rotating order (so replicated
 * sources share the load) and each intersection becomes a segment, then is
 * subtracted from the uncovered list. Whatever stays uncovered is an error.
 * Inside a segment, element (x) sits at base + sum (x_d - origin_d)*stride_d
 * on both sides; the innermost dims where both sides are contiguous give the
 * run length, the outer dims are walked, and adjacent runs are merged.
 *
 * A parcel's payload is its runs' bytes concatenated in order; that is what
 * gets chunked, hashed, signed and sent, and the destination scatters it.
 */
#ifndef PROTO_PLAN_H
#define PROTO_PLAN_H

#include <jansson.h>
#include <stdint.h>

#include "proto/spec.h"

struct proto_run {
	uint64_t src_off; /* byte offset inside the source local tensor */
	uint64_t dst_off; /* byte offset inside the destination local tensor */
	uint64_t len;
	uint64_t pay_off; /* byte offset of this run inside the parcel payload */
};

struct proto_segment {
	uint32_t tensor;    /* logical tensor index */
	uint32_t src_local; /* local tensor index on the source rank */
	uint32_t dst_local; /* local tensor index on the destination rank */
	struct proto_box box;
	uint64_t run0, nruns; /* into plan->runs */
};

struct proto_parcel {
	uint32_t src_rank, dst_rank;
	uint64_t bytes;
	uint64_t seg0, nsegs; /* into plan->segs */
	uint64_t run0, nruns; /* all runs of the parcel, contiguous */
};

struct proto_plan {
	uint32_t nsrc, ndst;
	uint32_t nparcels;
	struct proto_parcel *parcels; /* sorted by (src_rank, dst_rank) */
	uint64_t nsegs;
	struct proto_segment *segs;
	uint64_t nruns;
	struct proto_run *runs;
	uint64_t retained_bytes;  /* all destination local tensors */
	uint64_t mapped_bytes;    /* what the plan delivers */
	uint64_t broadcast_bytes; /* whole needed tensors to every dst rank */
	uint8_t digest[32];       /* BLAKE2b-256 over every parcel and run */
};

/* Builds the plan. On failure (a destination element no source holds,
 * mismatched models) *out is empty and err says which tensor and rank. */
int proto_plan_build(const struct proto_model *m,
		     const struct proto_layout *src,
		     const struct proto_layout *dst, struct proto_plan *out,
		     struct proto_err *err);
void proto_plan_fini(struct proto_plan *p);

/* The parcel (src_rank -> dst_rank), or NULL when nothing flows there. */
const struct proto_parcel *proto_plan_parcel(const struct proto_plan *p,
					     uint32_t src_rank,
					     uint32_t dst_rank);

/* JSON as printed by `tessera plan --json` (new reference). */
json_t *proto_plan_to_json(const struct proto_plan *p,
			   const struct proto_model *m,
			   const struct proto_layout *src,
			   const struct proto_layout *dst);

/* The index (into p->runs) of the parcel's run whose payload range holds
 * payload offset off (its last run for an offset past the end). */
uint64_t proto_parcel_run_at(const struct proto_plan *p, const struct proto_parcel *pc,
			     uint64_t off);

/*
 * Copies payload bytes [off, off+len) of a parcel out of the source rank's
 * memory (local tensors at src_rank_base + local->offset) into out.
 * Cannot fail for a range inside the parcel.
 */
void proto_parcel_gather(const struct proto_plan *p,
			 const struct proto_parcel *pc,
			 const struct proto_layout *src,
			 const uint8_t *src_rank_base, uint64_t off,
			 uint64_t len, uint8_t *out);
/* The reverse: scatters payload bytes [off, off+len) into the destination
 * rank's memory. */
void proto_parcel_scatter(const struct proto_plan *p,
			  const struct proto_parcel *pc,
			  const struct proto_layout *dst, uint8_t *dst_rank_base,
			  uint64_t off, uint64_t len, const uint8_t *in);
/* The reverse of gather: puts payload bytes [off, off+len) back where they
 * came from in the source rank's memory (a rank's memory rebuilt from the
 * parcels it sent). Cannot fail for a range inside the parcel. */
void proto_parcel_ungather(const struct proto_plan *p,
			   const struct proto_parcel *pc,
			   const struct proto_layout *src, uint8_t *src_rank_base,
			   uint64_t off, uint64_t len, const uint8_t *in);
/* Where payload bytes [off, off+len) go in the destination rank's memory:
 * span(arg, offset, length) once per run, in payload order. */
void proto_parcel_dst_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *dst, uint64_t off, uint64_t len,
			    void (*span)(void *arg, uint64_t at, uint64_t n), void *arg);
/* The same on the source side: where they come from in the source rank's
 * memory. */
void proto_parcel_src_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *src, uint64_t off, uint64_t len,
			    void (*span)(void *arg, uint64_t at, uint64_t n), void *arg);

/* Where payload bytes [off, off+len) of a parcel land in the destination
 * rank's block: spans (block offset, offset from off, length), adjacent ones
 * merged. Fills at most cap and returns how many there are (more than cap:
 * call again with room for that many). Cannot fail. */
struct proto_span {
	uint64_t dst_off;
	uint64_t src_off;
	uint64_t len;
};
size_t proto_parcel_spans(const struct proto_plan *p, const struct proto_parcel *pc,
			  const struct proto_layout *dst, uint64_t off, uint64_t len,
			  struct proto_span *out, size_t cap);

#endif
