/*
 * Model specs and layouts.
 *
 * A model spec names the logical tensors (name, dtype, shape). A layout says
 * how the ranks of one job hold them: each rank has local tensors, each local
 * tensor is its pieces concatenated along concat_dim and stored row-major.
 * A piece is a box (half-open [lo,hi) per dimension) of one logical tensor,
 * or a flat half-open range of the tensor's row-major elements; a local tensor
 * made of flat pieces is one-dimensional.
 *
 * JSON, explicit form:
 *   model:  {"tensors":[{"name":"W","dtype":"bf16","shape":[4,4]}, ...]}
 *   layout: {"ranks":[{"tensors":[{"name":"W","concat_dim":0,
 *             "pieces":[{"tensor":"W","box":[[0,4],[0,2]]}, ...]}]}]}
 * Shorthand form: {"ranks":P,"tensors":[rule, ...]} where rules are tried in
 * order and a tensor is placed by the first rule that names it:
 *   {"tensor":"W" | "match":"glob*", "replicate":true}
 *   {"tensor"|"match", "split":D}      D-th dim in P chunks (torch.chunk sizes)
 *   {"tensor"|"match", "flat":true}    P contiguous row-major element ranges
 *   {"tensor"|"match", "experts":[[3,1],[0,2]], "dim":0}
 *                                      rank r holds those indices of dim, in order
 *   {"match":"*.q", "fuse":["*.q","*.k","*.v"], "name":"*.qkv", "split":0}
 *                                      one local per match: the ranks' shares of
 *                                      each fused tensor concatenated on dim 0
 * Every model tensor must be placed by some rule.
 */
#ifndef PROTO_SPEC_H
#define PROTO_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

#define PROTO_MAX_DIMS 8
#define PROTO_NAME_MAX 256 /* longest tensor or local name, bytes */
#define PROTO_MAX_TENSORS (1u << 20)
#define PROTO_MAX_RANKS 65536

enum proto_dtype {
	PROTO_DT_BF16,
	PROTO_DT_FP16,
	PROTO_DT_FP32,
	PROTO_DT_FP64,
	PROTO_DT_FP8_E4M3,
	PROTO_DT_FP8_E5M2,
	PROTO_DT_BOOL,
	PROTO_DT_U8,
	PROTO_DT_I8,
	PROTO_DT_U16,
	PROTO_DT_I16,
	PROTO_DT_U32,
	PROTO_DT_I32,
	PROTO_DT_U64,
	PROTO_DT_I64,
	PROTO_DT_COUNT
};

/* "bf16", "fp32", ... (spec names) and their sizes in bytes. */
const char *proto_dtype_name(enum proto_dtype dt);
size_t proto_dtype_size(enum proto_dtype dt);
/* Accepts spec names ("bf16") and safetensors names ("BF16", "F32"). */
int proto_dtype_parse(const char *s, enum proto_dtype *out);
/* The safetensors name of a dtype ("BF16", "F8_E4M3", ...). */
const char *proto_dtype_st_name(enum proto_dtype dt);

struct proto_tensor {
	char *name;
	enum proto_dtype dtype;
	uint32_t ndim;
	uint64_t shape[PROTO_MAX_DIMS];
	uint64_t nelem;
	uint64_t nbytes;
};

struct proto_model {
	uint32_t ntensors;
	struct proto_tensor *tensors; /* in spec order */
	uint32_t *sorted;             /* indices sorted by name, for lookup */
	uint8_t digest[32];           /* BLAKE2b-256 of the canonical JSON */
};

/* An empty model to fill with proto_model_add() and seal with
 * proto_model_finish(). */
void proto_model_init(struct proto_model *m);
/* Appends a tensor (name copied). -EINVAL on a bad name or shape. */
int proto_model_add(struct proto_model *m, const char *name,
		    enum proto_dtype dt, uint32_t ndim, const uint64_t *shape,
		    struct proto_err *err);
/* Builds the name index and digest; -EINVAL on duplicate names. */
int proto_model_finish(struct proto_model *m, struct proto_err *err);
/* Parses a model spec (what names the source in errors). On failure *out is
 * left empty (nothing to free). */
int proto_model_parse(const char *json, size_t len, const char *what,
		      struct proto_model *out, struct proto_err *err);
int proto_model_load(const char *path, struct proto_model *out,
		     struct proto_err *err);
/* Same, from an already-parsed JSON value. */
int proto_model_from_json(json_t *root, const char *what,
			  struct proto_model *out, struct proto_err *err);
void proto_model_fini(struct proto_model *m);
/* Index of the tensor called name, or -1. */
int64_t proto_model_find(const struct proto_model *m, const char *name);
uint64_t proto_model_bytes(const struct proto_model *m);
/* The explicit JSON form (new reference; caller decrefs). */
json_t *proto_model_to_json(const struct proto_model *m);

/* Half-open box; for a flat piece only lo[0]/hi[0] are used (elements). */
struct proto_box {
	uint64_t lo[PROTO_MAX_DIMS];
	uint64_t hi[PROTO_MAX_DIMS];
};

struct proto_piece {
	uint32_t tensor; /* index into the model */
	bool flat;
	struct proto_box box;
	uint64_t base; /* element offset of the piece inside its local tensor */
};

struct proto_local {
	char *name;
	enum proto_dtype dtype;
	uint32_t concat_dim;
	uint32_t ndim;
	uint64_t shape[PROTO_MAX_DIMS];
	uint64_t nelem;
	uint64_t nbytes;
	uint64_t offset; /* byte offset of this local tensor in its rank's block */
	uint32_t npieces;
	struct proto_piece *pieces;
	/* The FP32 scales of the FP8 local before it (fp8_e4m3_block128,
	 * proto/fp8.h): derived from that local's pieces, never written in
	 * the layout's JSON. */
	bool scales;
};

struct proto_rank {
	uint32_t nlocals;
	struct proto_local *locals;
	uint64_t nbytes; /* all local tensors, laid out back to back */
};

struct proto_layout {
	uint32_t nranks;
	struct proto_rank *ranks;
	uint8_t digest[32]; /* BLAKE2b-256 of the explicit JSON form */
	/* A layout that serves some tensors as block-scaled FP8 ("transform":
	 * "fp8_e4m3_block128", proto/fp8.h): the model its pieces index, owned:
	 * the cluster's model with those tensors as FP8 (same indices) and a
	 * "<name>_scale_inv" FP32 tensor per quantized tensor appended after
	 * the nbase tensors of the cluster's model. NULL: the cluster's model. */
	struct proto_model *model;
	uint32_t nbase;
};

/* The model a layout's pieces index: its own (FP8) or the cluster's m. */
static inline const struct proto_model *proto_layout_model(const struct proto_model *m,
							   const struct proto_layout *l)
{
	return l->model != NULL ? l->model : m;
}

/* Parses a layout (explicit or shorthand) against a model and validates it:
 * boxes in range, no overlap inside a local tensor, matching dtypes and
 * extents. Errors name `what` and the field. On failure *out is empty. */
int proto_layout_parse(const struct proto_model *m, const char *json,
		       size_t len, const char *what, struct proto_layout *out,
		       struct proto_err *err);
int proto_layout_load(const struct proto_model *m, const char *path,
		      struct proto_layout *out, struct proto_err *err);
/* Same, from an already-parsed JSON value. */
int proto_layout_from_json(const struct proto_model *m, json_t *root,
			   const char *what, struct proto_layout *out,
			   struct proto_err *err);
void proto_layout_fini(struct proto_layout *l);
/* 0 when the ranks together hold every element of every model tensor (what
 * a serving replica must do); else -EINVAL naming a missing tensor/box. */
int proto_layout_check_complete(const struct proto_model *m,
				const struct proto_layout *l,
				struct proto_err *err);
/* The explicit JSON form (new reference). */
json_t *proto_layout_to_json(const struct proto_model *m,
			     const struct proto_layout *l);

/* A layout named on a command line: a file when it exists, contains a '/'
 * or ends in ".json", else a built-in (below). */
bool proto_layout_arg_is_file(const char *arg);
int proto_layout_open(const struct proto_model *m, const char *arg,
		      struct proto_layout *out, struct proto_err *err);

/* Built-in layouts: "fsdpN" (each rank an equal dim-0 share of every tensor,
 * as FSDP2 does) and "tpN" (Megatron rules for Llama-style names: fused
 * qkv_proj and gate_up_proj and embeddings/lm_head split on dim 0, o_proj
 * and down_proj on dim 1, the rest replicated). "tpN:fp8" is tpN serving
 * the linear projections (2-D BF16 "*_proj.weight") as fp8_e4m3_block128. */
/* Whether name is a built-in's name: 0 with its ranks in *ranks (when not
 * NULL), or -EINVAL with a one-line error. */
int proto_layout_builtin_parse(const char *name, uint64_t *ranks, struct proto_err *err);
int proto_layout_builtin(const struct proto_model *m, const char *name,
			 struct proto_layout *out, struct proto_err *err);

/*
 * Fills a rank's block (its local tensors at their offsets; padding zeroed)
 * from a source of logical tensor bytes: source(arg, tensor, first, count,
 * out) writes elements [first, first+count) of a tensor, row-major, to out.
 * Calls are row segments; every byte of every local tensor is written once.
 */
typedef void (*proto_tensor_source)(void *arg, uint32_t tensor, uint64_t first,
				    uint64_t count, uint8_t *out);
void proto_layout_fill_rank(const struct proto_model *m,
			    const struct proto_layout *l, uint32_t rank,
			    proto_tensor_source source, void *arg,
			    uint8_t *block);

/*
 * FP8 serving layouts (proto/layout_fp8.c). A layout's JSON (either form)
 * may say "transform": "fp8_e4m3_block128" and "quantize": [name or glob,
 * ...] (default ["*_proj.weight"]; globs take the 2-D BF16 tensors they
 * match, a name must be one). Each quantized tensor's local is FP8 and is
 * followed by "<local>_scale_inv", its block scales split as it is; a piece
 * must start on a multiple of 128 on both dims and end on one or at the
 * tensor's edge (and only the last piece of a local may end on a partial
 * block along its concat dim), else the layout is refused naming the tensor
 * and the split.
 */
/* Whether l serves some tensors transformed (FP8). */
static inline bool proto_layout_transformed(const struct proto_layout *l)
{
	return l->model != NULL;
}
/* The layout a plan into an FP8 layout dst is made from: one rank holding
 * every tensor of dst's model whole (the quantized ones as FP8 with their
 * scales), which a publisher fills by quantizing the trainer's export. Its
 * model has dst's model's digest. */
int proto_layout_fp8_source(const struct proto_model *m, const struct proto_layout *dst,
			    struct proto_layout *out, struct proto_err *err);

/* Fills the block of an FP8 source layout src8 (proto_layout_fp8_source)
 * from the logical tensors of the cluster's model m: bytes(arg, t, scratch)
 * returns tensor t's row-major bytes, its own or written into scratch
 * (room for the largest tensor: keep's, or one made for the call when keep
 * is NULL); quantized tensors are quantized on up to
 * threads threads (proto/fp8.h), the others copied. abort (may be NULL) is
 * looked at between tensors. 0, or -EDOM when a quantized tensor holds a
 * NaN or an infinity (err names it and the element), -ENOMEM, -ECANCELED. */
typedef const uint8_t *(*proto_tensor_bytes)(void *arg, uint32_t t, uint8_t *scratch);
/* The scratch a caller keeps from fill to fill (grown as needed, freed
 * with free(p)): its pages are touched once, not per version. */
struct proto_fp8_scratch {
	uint8_t *p;
	size_t cap;
};
int proto_layout_fp8_fill(const struct proto_model *m, const struct proto_layout *src8,
			  proto_tensor_bytes bytes, void *arg, unsigned threads,
			  const _Atomic bool *abort, struct proto_fp8_scratch *keep, uint8_t *block,
			  struct proto_err *err);

/* A whole rank block of FP8 layout l (what its node must hold), from the
 * cluster model's logical tensors as proto_layout_fp8_fill takes them: the
 * quantized source is made and l's rank filled from it. For checks and
 * tests (it holds the quantized model in memory while it works). */
int proto_layout_fp8_fill_rank(const struct proto_model *m, const struct proto_layout *l,
			       uint32_t rank, proto_tensor_bytes bytes, void *arg, uint8_t *block,
			       struct proto_err *err);

/* Walks a rank's elements (of tensor `only`, or all for -1) in runs that
 * are contiguous both in the logical tensor and in the rank's block:
 * fn(arg, tensor, first, count, at) for elements [first, first+count) of
 * the tensor (row-major) lying at byte offset at of the block. */
typedef void (*proto_layout_walk_fn)(void *arg, uint32_t tensor, uint64_t first, uint64_t count,
				     uint64_t at);
void proto_layout_walk_rank(const struct proto_model *m, const struct proto_layout *l,
			    uint32_t rank, int64_t only, proto_layout_walk_fn fn, void *arg);

/* Row-major element offset of a piece element inside its local tensor. */
uint64_t proto_local_elem_offset(const struct proto_model *m,
				 const struct proto_local *l,
				 const struct proto_piece *p,
				 const uint64_t *coord);

#endif
