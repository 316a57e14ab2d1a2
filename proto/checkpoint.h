/*
 * Checkpoints: one version's weights as a trainer writes them, and model
 * directories holding one checkpoint per version.
 *
 * A checkpoint is any of
 *   - a safetensors file;
 *   - a Hugging Face directory with model.safetensors;
 *   - a Hugging Face sharded directory: model.safetensors.index.json, whose
 *     "weight_map" names for every tensor the shard file that holds it
 *     (model-0000K-of-0000N.safetensors, beside the index).
 * Its model lists the tensors shard by shard (in the order of the shards'
 * names), each shard in data order: the same files give the same model and
 * digest whatever their JSON key order.
 *
 * The index is hostile input like the shards: its size is capped
 * (TESSERA_SPEC_MAX) before it is read; every weight_map value must be a
 * plain file name (no '/', not starting with '.') ending in .safetensors;
 * every tensor the index names must be in the shard it names, and every
 * tensor of every shard must be named by the index, for that shard.
 *
 * A model directory holds the versions a publisher serves, in one of two
 * forms: entries v<N>.safetensors or v<N>/ (a checkpoint directory each),
 * taken in numeric order of N, the i-th (1-based) being version i; or the
 * directory is itself a Hugging Face checkpoint: one version.
 */
#ifndef PROTO_CHECKPOINT_H
#define PROTO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/safetensors.h"
#include "proto/spec.h"
#include "proto/util.h"

#define PROTO_CKPT_INDEX "model.safetensors.index.json"
#define PROTO_CKPT_SINGLE "model.safetensors"
#define PROTO_CKPT_SHARDS_MAX 65536 /* distinct shard files in an index */

struct proto_ckpt {
	struct proto_model model; /* every tensor, shard by shard */
	struct proto_st *shards;  /* opened and mapped */
	uint32_t nshards;
	uint32_t *shard_of; /* per model tensor: its shard */
	uint32_t *index_in; /* per model tensor: its index in that shard */
};

/* Opens a checkpoint (a file or a directory, see above). On failure *ck is
 * empty (nothing to free) and err names the file and what is wrong. */
int proto_ckpt_open(const char *path, struct proto_ckpt *ck, struct proto_err *err);

/* The bytes of model tensor t (mapped; read with memcpy, not aligned). */
const uint8_t *proto_ckpt_tensor(const struct proto_ckpt *ck, uint32_t t);

/* Copies len bytes of model tensor t, from byte off of its data, into out
 * by pread on its shard (proto_st_read: no page of the mapping is touched).
 * A negative errno when the range is outside the tensor or the shard file
 * ends before it (-EIO: truncated since it was opened); err names the tensor
 * and what is wrong in one line. */
int proto_ckpt_read(const struct proto_ckpt *ck, uint32_t t, uint64_t off, size_t len,
		    uint8_t *out, struct proto_err *err);

/* Fills rank's block of layout l over model m (proto_layout_fill_rank)
 * from the checkpoint by pread (proto_ckpt_read), one read per stretch
 * that continues in the tensor and in the block. map[t] is ck's tensor
 * for m's tensor t (NULL: the same index; m and ck's model must then have
 * the same tensors in the same order). 0, or the first read's failure
 * (err as proto_ckpt_read's); the block is then partly written. */
int proto_ckpt_fill_rank(const struct proto_ckpt *ck, const struct proto_model *m,
			 const uint32_t *map, const struct proto_layout *l, uint32_t rank,
			 uint8_t *block, struct proto_err *err);

/* Unmaps and frees; *ck becomes empty. Safe on an empty struct. */
void proto_ckpt_fini(struct proto_ckpt *ck);

/* True when dir is a Hugging Face checkpoint directory (it holds an index
 * or model.safetensors). */
bool proto_ckpt_is_hf_dir(const char *dir);

/*
 * The versions of a model directory: (*paths)[i] is the checkpoint path of
 * version i + 1, malloc'ed (free with proto_ckpt_list_free). Refuses a
 * directory with none, two entries of the same N (v1 and v01, or v1 and
 * v1.safetensors), and N with leading zeros. On failure *paths is NULL.
 */
int proto_ckpt_dir_list(const char *dir, char ***paths, size_t *n, struct proto_err *err);
void proto_ckpt_list_free(char **paths, size_t n);

#endif
