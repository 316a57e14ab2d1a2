/*
 * Deltas: a policy version as sparse changes against its exact parent.
 *
 * Model. A version is a list of tensors (flat arrays of 1-, 2-, 4- or 8-byte
 * elements) plus opaque header bytes (for a safetensors file, its exact
 * header). Each child tensor is patched from the parent tensor of the same
 * name, dtype and element count, or, if there is none, from zeros. A change
 * at position i is stored as the difference of the element bit patterns,
 * d = (new - old) mod 2^(8w) read as a signed w-byte integer and zigzagged.
 * That is exact for every pattern (NaN payloads, -0, inf, subnormals, sign
 * flips) and, for weights that move by an ulp or two, mostly 1 or 2: BF16
 * patterns of one sign are ordered like their values.
 *
 * Chunks. Every tensor is cut into chunks of `chunk_elems` elements
 * (TESSERA_DELTA_CHUNK, default 2^22). Each chunk is coded on its own with
 * independent zstd frames, so chunks apply on any number of threads, and the
 * encoder keeps the smallest of these for each chunk:
 *   ZERO    no change;
 *   SPARSE  positions as gaps (changes skipped, one byte each; 255 escapes
 *           to a LEB128 varint of gap - 255 in a separate "wide" stream);
 *   BITMAP  positions as a change bitmap (LSB first);
 *   DENSE   no positions; a value for every element (0 = unchanged).
 * Values (c = zigzag(d) - 1 for SPARSE/BITMAP, zigzag(d) for DENSE) come as
 *   PLANES  w byte planes (low byte first), one stream each, or
 *   NIB     two values per byte as 4-bit min(c, 15) (first value in the low
 *           nibble), plus, for each 15, c - 15 in w escape byte planes.
 * Why this layout: zstd codes literals with Huffman, which cannot spend less
 * than one bit on a symbol. One-byte gaps at ~1 % density have an entropy of
 * ~7.1 bits and Huffman lands within 2 % of it. Values of +-1 ulp are one
 * bit each; as bytes Huffman spends ~2.4 bits, two to a byte it spends
 * ~1.8: NIB gets near the bound at zstd -1, where byte planes need -19 and
 * two hundred times the time. So the default level is 1
 * (TESSERA_DELTA_LEVEL; minMatch 7 at levels <= 9 keeps the match finder
 * from breaking up literal runs). What this gives, measured: proto/NOTES.md.
 *
 * Format (little-endian):
 *   0   "TSDELTA1"
 *   8   BLAKE2b-256 of bytes [40, body): the header hash
 *   40  u64 header_len: bytes from offset 40 up to the body
 *   48  u32 version (1), u32 flags (0, or PROTO_DELTA_F_TOUCHED)
 *   56  parent digest[32], child digest[32]
 *   120 u32 parent_ntensors, u32 ntensors, u32 chunk_elems, u32 0
 *   136 u64 child_header_len, the child header bytes
 *       ntensors x { u8 elsize, u8[3] 0, u32 parent (0xffffffff: none),
 *                    u64 nelem, u64 parent_sum, u64 child_sum,
 *                    with PROTO_DELTA_F_TOUCHED u64 touched_sum }
 *       per chunk, tensor by tensor: u8 mode | vcode << 4; for SPARSE and
 *       BITMAP varint nchanges; SPARSE varint wide_len; NIB varint nesc;
 *       then one varint compressed length per stream (0: all zero bytes)
 *   body: the streams, chunk by chunk, in the order above; each is one zstd
 *       frame with its content size and checksum. The body ends the file.
 * Decoded stream lengths follow from the counts, so a frame that declares
 * another size is refused before decoding.
 *
 * Binding and verification. A version's digest is BLAKE2b-256 over
 * (u64 header_len, header, u64 ntensors, u64 wsum of each tensor) with wsum
 * the position-weighted checksum of proto/wsum.h. A node that keeps its
 * tensors' checksums can check the parent digest without re-reading them.
 * Apply refuses a parent with another digest, patches in place touching only
 * changed positions (SPARSE decodes gaps and values in 4096-change batches
 * into small buffers; nothing dense is materialised or scanned), updates each
 * tensor's checksum from (position, old, new) in O(changes), and requires it
 * to equal the child checksum in the delta. That movement is the same
 * whatever the old element was (the child is the old bits plus the
 * difference), so a parent damaged at a changed position would pass it: the
 * touched checksum (flag PROTO_DELTA_F_TOUCHED, which the encoder always
 * sets) is the wsum of the parent tensor's elements at the positions the
 * delta writes (every position of a DENSE chunk, the changes of the
 * others; zero elsewhere), and apply requires the old elements it reads to
 * sum to it. A parent damaged at a position the delta does not write is
 * beyond any check that reads changed positions only: a caller that keeps
 * its parent's checksums must cover those bytes another way (the node
 * scrubs its slot a share at a time). The header hash and the zstd
 * frame checksums catch damaged bytes; the checksum catches a wrong parent
 * and lost or misplaced changes; the trainer-signed manifest hashes remain
 * the authority on what a delta should contain.
 *
 * Threads: encode and apply split chunks over threads; a failed apply undoes
 * what it wrote (changes are invertible: old = new - d), so the buffers come
 * back byte for byte as they were.
 *
 * Cost: about 100 ns per change to encode and under 10 to apply, on one
 * core; apply is bound by memory, not by decoding (a sparse apply reads
 * and writes back every cache line that holds a change). Figures:
 * proto/NOTES.md.
 */
#ifndef PROTO_DELTA_H
#define PROTO_DELTA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/plan.h"
#include "proto/safetensors.h"
#include "proto/spec.h"
#include "proto/util.h"

#define PROTO_DELTA_MAGIC "TSDELTA1"
#define PROTO_DELTA_NONE 0xffffffffu     /* child tensor without a parent */
#define PROTO_DELTA_CHUNK_MAX (1u << 24) /* largest chunk_elems accepted */
#define PROTO_DELTA_MAX_STREAMS 11       /* gaps, wide, nib, 8 escape planes */
#define PROTO_DELTA_BATCH 4096           /* changes decoded at a time */
#define PROTO_DELTA_F_TOUCHED 1u         /* tensor records carry touched_sum */

enum proto_delta_mode {
	PROTO_DELTA_ZERO = 0,
	PROTO_DELTA_SPARSE = 1,
	PROTO_DELTA_BITMAP = 2,
	PROTO_DELTA_DENSE = 3,
};

enum proto_delta_vcode {
	PROTO_DELTA_PLANES = 0,
	PROTO_DELTA_NIB = 1,
};

/* One version as the codec sees it. data[i] holds model->tensors[i]
 * (any alignment); sums, if not NULL, their wsums (else computed). */
struct proto_delta_version {
	const struct proto_model *model;
	const uint8_t *header;
	size_t header_len;
	const uint8_t *const *data;
	const uint64_t *sums;
};

struct proto_delta_opts {
	int level;            /* zstd level; 0 = TESSERA_DELTA_LEVEL */
	uint32_t chunk_elems; /* 0 = TESSERA_DELTA_CHUNK */
	unsigned threads;     /* 0 = 1 */
	/* Called from worker threads with the chunks done so far; may be NULL. */
	void (*progress)(void *arg, uint64_t done, uint64_t total);
	void *progress_arg;
	/* Not NULL: receives the child's checksum per tensor (a parcel's: per
	 * piece), which the next encode against this child may take as its
	 * parent's instead of summing the parent again. */
	uint64_t *child_sums;
	/* proto_dparcel_encode: the parent pieces' checksums when the caller
	 * has them (child_sums of the encode that made the parent, over the
	 * same pieces and bytes), else NULL: summed here. */
	const uint64_t *parent_sums;
	/* Not NULL: called from the encoding threads with the changes the scan
	 * found, a stretch of tensor t at a time while its bytes are in cache:
	 * k positions (ascending, from element base), parent and child the
	 * bytes of element base (parent NULL: the tensor has no parent, old
	 * elements are zero). Stretches come in any order, on any thread;
	 * after a failed encode some may be missing. */
	void (*on_changes)(void *arg, uint32_t t, uint64_t base, const uint32_t *pos, size_t k,
			   const uint8_t *parent, const uint8_t *child);
	void *changes_arg;
	/* Not NULL: the child's bytes are not in place yet. Called from the
	 * encoding threads right before the scan reads elements [base, base +
	 * n) of child tensor t (each stretch once, in any order), to put them
	 * there: a caller that copies the child in (a gather) has each stretch
	 * scanned while it is still in cache, instead of copying it all first
	 * and reading it back from memory. After a failed encode some
	 * stretches may never have been asked for. */
	void (*fill)(void *arg, uint32_t t, uint64_t base, uint64_t n);
	void *fill_arg;
	/* Not NULL: where the scan reads elements [base, base + n) of child
	 * tensor t and of its parent (a stretch of at most 2^15 elements
	 * inside one chunk; tensors with a parent only), asked on the encoding
	 * thread right before it reads them. *a and *b come set to the
	 * elements in data[], and may be pointed elsewhere: at the bytes
	 * where they lie (each side's n elements contiguous there), or at
	 * room, this thread's 2 * n elements' bytes, valid until its next call,
	 * after gathering them into it. A caller whose tensors are pieces of a
	 * larger memory reads them in place, or gathers them while in cache;
	 * data[t] then need only be a base the offsets stay inside. */
	void (*locate)(void *arg, uint32_t t, uint64_t base, uint64_t n, uint8_t *room,
		       const uint8_t **a, const uint8_t **b);
	void *locate_arg;
	/* Not 0: the encode stops with -E2BIG as soon as more elements than
	 * this have changed (a delta that large is not wanted; the changes
	 * are counted by the scan, so a dense child costs about one compare,
	 * not its encoding). */
	uint64_t max_changed;
	/* Not NULL: a budget of coded bytes this encode shares with others
	 * (struct proto_delta_budget): past it the encode stops with -E2BIG. */
	struct proto_delta_budget *budget;
	/* Not NULL: an encode on one thread keeps its scratch (zstd context
	 * and buffers) in *keep for the next one, made or remade as needed
	 * (*keep NULL at first), instead of making and freeing its own: a
	 * caller encoding parcels one after the other maps and faults them in
	 * once. The caller frees it with proto_delta_scratch_free. */
	struct proto_delta_scratch **keep;
};

/*
 * A budget of coded bytes that several encodes share (a version's parcels,
 * encoded at once on any number of threads): a delta that costs more than
 * `limit` is not wanted, and the encoder finds that out while it encodes
 * instead of at the end. Each chunk's coded bytes (its record and frames)
 * are added to `out` as the chunk is produced; the chunk whose bytes pass
 * `limit` sets `over` and its encode stops with -E2BIG, as does every
 * encode sharing the budget at its next chunk (before scanning it). `in`
 * counts the child bytes scanned, so a caller can say how far the encodes
 * got. The caller zeroes it and sets limit; the encoders only add.
 */
struct proto_delta_budget {
	uint64_t limit;       /* coded bytes allowed, all encodes together */
	_Atomic uint64_t out; /* coded bytes of the chunks produced so far */
	_Atomic uint64_t in;  /* child bytes scanned so far */
	_Atomic bool over;    /* out passed limit: every encode stops */
};

struct proto_delta_scratch;
/* Frees what opts.keep kept; NULL is fine. */
void proto_delta_scratch_free(struct proto_delta_scratch *s);

/* What an encode produced. Bytes are compressed bytes in the delta. */
struct proto_delta_stats {
	uint64_t nelem;         /* elements in the child */
	uint64_t nchanged;      /* elements whose bits differ (or new tensors') */
	uint64_t bytes;         /* the whole delta */
	uint64_t header_bytes;  /* fixed part, tables, child header */
	uint64_t pos_bytes;     /* gap, wide and bitmap streams */
	uint64_t val_bytes;     /* value streams */
	uint64_t chunks[4];     /* chunks by enum proto_delta_mode */
};

/* A parsed delta: a validated view of bytes the caller keeps alive. */
struct proto_delta_tensor {
	uint32_t elsize;     /* 1, 2, 4 or 8 */
	uint32_t parent;     /* parent tensor index, or PROTO_DELTA_NONE */
	uint64_t nelem;
	uint64_t parent_sum; /* wsum of that parent tensor (0 when none) */
	uint64_t child_sum;  /* wsum the patched tensor must have */
	uint64_t touched_sum; /* PROTO_DELTA_F_TOUCHED: wsum of the parent's
			       * elements at the positions written, else 0 */
	uint32_t chunk0, nchunks;
};

struct proto_delta_chunk {
	uint8_t mode, vcode;
	uint8_t nstreams;
	uint32_t tensor;
	uint32_t n;        /* elements in the chunk */
	uint64_t base;     /* first element */
	uint32_t nchanges; /* SPARSE/BITMAP */
	uint32_t wide_len; /* SPARSE */
	uint32_t nesc;     /* NIB */
	uint64_t off;      /* of the first stream, from the start of the delta */
	uint32_t clen[PROTO_DELTA_MAX_STREAMS];
};

struct proto_delta {
	const uint8_t *buf; /* borrowed */
	size_t len;
	uint8_t parent_digest[32], child_digest[32];
	uint32_t flags; /* PROTO_DELTA_F_* */
	uint32_t parent_ntensors;
	uint32_t chunk_elems;
	const uint8_t *child_header; /* inside buf */
	size_t child_header_len;
	uint32_t ntensors;
	struct proto_delta_tensor *tensors;
	uint32_t nchunks;
	struct proto_delta_chunk *chunks;
};

/* A parent as apply checks it: header bytes and the wsum of every tensor. */
struct proto_delta_parent {
	const uint8_t *header;
	size_t header_len;
	uint32_t ntensors;
	const uint64_t *sums;
};

/* BLAKE2b-256 digest of a version (see above). Cannot fail. */
void proto_delta_digest(const uint8_t *header, size_t header_len, const uint64_t *sums,
			uint32_t ntensors, uint8_t out[32]);

/* The wsum of each tensor of a model whose data is at data[i], split over
 * threads. Cannot fail (falls back to one thread). */
void proto_delta_sums(const struct proto_model *m, const uint8_t *const *data,
		      unsigned threads, uint64_t *sums);

/*
 * Encodes child against parent. *out is malloc'ed (caller frees), *out_len
 * its size; st (may be NULL) receives what was produced. On failure *out is
 * NULL. Tensors are matched by name, dtype and element count.
 */
int proto_delta_encode(const struct proto_delta_version *parent,
		       const struct proto_delta_version *child,
		       const struct proto_delta_opts *o, uint8_t **out, size_t *out_len,
		       struct proto_delta_stats *st, struct proto_err *err);

/*
 * Parses and validates a delta: magic, header hash, every count, offset and
 * length against caps and the buffer, and the child digest against the
 * child header and checksums it carries. Stream contents are checked as they
 * are applied. buf must outlive *d. On failure *d is empty (nothing to free).
 */
int proto_delta_parse(const uint8_t *buf, size_t len, struct proto_delta *d,
		      struct proto_err *err);
void proto_delta_fini(struct proto_delta *d);

/* Whether parent is the version d was made for (tensor count and digest).
 * Cannot change anything; err says which parent d wants. */
int proto_delta_check_parent(const struct proto_delta *d, const struct proto_delta_parent *parent,
			     struct proto_err *err);

/* Makes sure threads (at most 16) apply decoders are kept ready, their
 * windows' pages faulted in, and as many threads in the pool
 * (proto/pool.h), so that the next apply on that many threads starts
 * without mapping or making any (a node calls it while it waits for its
 * first delta). 0, or -ENOMEM (those made are kept). Thread-safe. */
int proto_delta_apply_warm(unsigned threads);

/*
 * Applies d in place. parent identifies the version the buffers come from
 * (its digest must equal d->parent_digest). bufs[i], for each child tensor i,
 * holds d->tensors[i].nelem * elsize bytes: a copy of parent tensor
 * d->tensors[i].parent, or zeros when it has none; buffers must not overlap.
 * On success they hold the child and every tensor's checksum was verified.
 * On failure (wrong parent, damaged delta, checksum mismatch) the buffers are
 * restored to their exact previous bytes and err says why.
 */
int proto_delta_apply(const struct proto_delta *d, const struct proto_delta_parent *parent,
		      uint8_t *const *bufs, unsigned threads, struct proto_err *err);

/*
 * Files. encode writes D for parent P and child C (safetensors); apply writes
 * the child rebuilt from P and D: a temporary file beside out, patched in
 * place through a shared mapping, fsynced and renamed, so on any failure out
 * is untouched and no temporary is left. Errors name the file.
 */
int proto_delta_encode_files(const char *parent, const char *child, const char *out,
			     const struct proto_delta_opts *o, struct proto_delta_stats *st,
			     struct proto_err *err);
int proto_delta_apply_files(const char *parent, const char *delta, const char *out,
			    unsigned threads, struct proto_err *err);

/* A pair compared against the usual alternatives, in one run. */
struct proto_delta_report {
	uint64_t nelem, nchanged;
	uint32_t ntensors;
	double pos_bound;    /* sum over tensors of log2 C(n, k) / 8, bytes */
	double val_h0;       /* order-0 entropy of the zigzag values, bytes
			      * (tensors of at most 2-byte elements), or -1 */
	uint64_t ours;       /* this codec */
	uint64_t idx32_raw;  /* int32 index + raw new value per change */
	uint64_t gap16_raw;  /* uint16 gap + raw value, uint32 gaps per tensor
			      * when one does not fit */
	uint64_t xor_zstd1;  /* XOR of the bytes, zstd level 1 */
	uint64_t zstd_patch; /* zstd -3 with the parent tensor as prefix
			      * (ZSTD_CCtx_refPrefix, long-distance matching:
			      * what `zstd --patch-from` does), per tensor */
	struct proto_delta_stats st;
	double encode_s;     /* wall time of our encode */
};

/*
 * Computes the report for two opened safetensors files. Slow baselines run
 * on the calling thread; `o` configures our encode. Cannot fail except for
 * out-of-memory or a zstd error (err says which).
 */
int proto_delta_compare(const struct proto_st *parent, const struct proto_st *child,
			const struct proto_delta_opts *o, struct proto_delta_report *r,
			struct proto_err *err);

/*
 * Parcels. A parcel's delta is coded in destination-local coordinates: its
 * runs (proto/plan.h) are merged into pieces, each a stretch adjacent both
 * in the parcel payload and in the destination rank's block, of one element
 * width. Each piece is one tensor of the codec (named "p<i>", no header), so
 * a delta carries the child checksum of every piece (a segment, or several
 * adjacent ones) and the receiver patches its block in place: no scatter,
 * nothing dense. Publisher and node derive the same pieces from the plan.
 */
struct proto_dpiece {
	uint64_t pay_off; /* in the parcel payload */
	uint64_t dst_off; /* in the destination rank's block */
	uint64_t len;     /* bytes */
	uint32_t elsize;
};

struct proto_dparcel {
	uint32_t npieces;
	struct proto_dpiece *pieces;
	struct proto_model model; /* one 1-D tensor per piece */
};

/* The pieces of parcel pc of plan p (model m, destination layout dst). On
 * failure *out is empty; fini frees (twice is harmless). */
int proto_dparcel_build(const struct proto_model *m, const struct proto_plan *p,
			const struct proto_parcel *pc, const struct proto_layout *dst,
			struct proto_dparcel *out, struct proto_err *err);
void proto_dparcel_fini(struct proto_dparcel *d);
/* Encodes the child payload against the parent payload (both in payload
 * order, the parcel's bytes each). Like proto_delta_encode. */
int proto_dparcel_encode(const struct proto_dparcel *d, const uint8_t *parent,
			 const uint8_t *child, const struct proto_delta_opts *o, uint8_t **out,
			 size_t *out_len, struct proto_delta_stats *st, struct proto_err *err);
/* The same with each piece's bytes where they lie: parent[i] and child[i]
 * point at piece i's len bytes (d->npieces each), e.g. straight into the
 * source rank's memory where a piece is contiguous there, so nothing is
 * gathered first. The delta is the one proto_dparcel_encode makes of the
 * same bytes. */
int proto_dparcel_encode_at(const struct proto_dparcel *d, const uint8_t *const *parent,
			    const uint8_t *const *child, const struct proto_delta_opts *o,
			    uint8_t **out, size_t *out_len, struct proto_delta_stats *st,
			    struct proto_err *err);
/* Applies a parcel delta in place to a destination block holding the
 * parent: parses it (hostile bytes), takes each piece's parent checksum from
 * the block itself (a damaged parent is refused), patches the changed
 * positions and checks every piece's child checksum. On failure the block
 * is as it was and err says why in one line. */
int proto_dparcel_apply(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			uint8_t *block, unsigned threads, struct proto_err *err);
/* The same in two steps, for an in-place install: proto_dparcel_sums reads
 * the parent's checksums (one per piece, d->npieces) from the block ahead,
 * while it still serves; proto_dparcel_apply_sums then patches the block in
 * O(changes). The block must still hold the bytes the sums were taken from:
 * a parent damaged in between is not refused here (the canary sees it). */
void proto_dparcel_sums(const struct proto_dparcel *d, const uint8_t *block, uint64_t *sums);
/*
 * The same checksums taken from the payload while it is made in order (a
 * gather in cache-sized steps): feed(s, payload, upto), with payload bytes
 * [0, upto) now in place, sums every whole element of the pieces below upto
 * not summed yet (from the cache, right after the gather wrote it); once
 * upto reaches the parcel's bytes, sums holds what proto_dparcel_sums gives
 * for a block holding that payload. Pieces are taken in order: one that lies
 * before an unfinished one in the payload waits for it. sums (npieces) is
 * the caller's; init zeroes it. Cannot fail.
 */
struct proto_dparcel_summer {
	const struct proto_dparcel *d;
	uint64_t *sums;
	uint32_t k;    /* the first piece not done */
	uint64_t done; /* its bytes summed so far */
};
void proto_dparcel_summer_init(struct proto_dparcel_summer *s, const struct proto_dparcel *d,
			       uint64_t *sums);
void proto_dparcel_summer_feed(struct proto_dparcel_summer *s, const uint8_t *payload,
			       uint64_t upto);
int proto_dparcel_apply_sums(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			     uint8_t *block, const uint64_t *sums, unsigned threads,
			     struct proto_err *err);
/* The same with the parent's checksums the delta itself carries, for a
 * block the caller knows holds that parent (nothing is read but the changed
 * positions, so a damaged block is not refused here: a later apply that
 * takes its parent checksums from the block sees it). The child checksums
 * still prove the delta decoded into the changes it was made of. */
int proto_dparcel_apply_trusted(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
				uint8_t *block, unsigned threads, struct proto_err *err);
/* The sparse apply of a caller that keeps its block's checksums: sums holds
 * the parent's, one per piece, as the caller verified its block held them
 * (the delta's must be the same: else refused as for another parent); the
 * block is read and written at the positions the delta writes and nowhere
 * else, the touched checksums check the old elements there (a parent
 * damaged where the delta writes is refused) and every piece's child
 * checksum the result. A delta without touched checksums is refused
 * (-ENOTSUP). sums NULL: they are read from the whole block first (as
 * proto_dparcel_apply does). On success child_sums (may be NULL; npieces)
 * receives the child's checksums: the next delta's parent sums. On failure
 * the block is as it was and err says why in one line. */
int proto_dparcel_apply_known(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			      uint8_t *block, const uint64_t *sums, uint64_t *child_sums,
			      unsigned threads, struct proto_err *err);

#endif
