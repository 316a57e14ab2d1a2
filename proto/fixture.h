/*
 * A deterministic synthetic policy: a Llama-shaped model of a requested size
 * with BF16 tensors whose every byte is a pure function of (seed, version,
 * tensor, element). Publishers export it, the launcher recomputes the bytes
 * each rank must hold to check the nodes without trusting them.
 */
#ifndef PROTO_FIXTURE_H
#define PROTO_FIXTURE_H

#include <stdint.h>

#include "proto/spec.h"

/* Fills m with a model of about total_bytes (eight layers or more when the
 * size allows, at least one): embeddings
 * and lm_head [8H, H], per layer q/o [H, H], k/v [H/4, H], gate/up [3H, H],
 * down [H, 3H] and two norms [H], a final norm. H is a power of two, so every
 * dimension divides by 1..8-way tensor parallelism. */
int proto_fixture_model(uint64_t total_bytes, struct proto_model *m,
			struct proto_err *err);

/* Writes elements [first, first+count) of tensor t (row-major) of the given
 * version into out (count * 2 bytes for BF16). Cannot fail. */
void proto_fixture_fill(const struct proto_model *m, uint64_t seed,
			uint64_t version, uint32_t t, uint64_t first,
			uint64_t count, uint8_t *out);

/* Fills a whole rank block of a layout (local tensors at their offsets) with
 * the version's bytes; the padding between tensors is zeroed. */
void proto_fixture_fill_rank(const struct proto_model *m,
			     const struct proto_layout *l, uint32_t rank,
			     uint64_t seed, uint64_t version, uint8_t *block);

#endif
