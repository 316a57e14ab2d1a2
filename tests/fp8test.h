/* What the FP8 tests share: a small Llama-shaped model whose two-way
 * tensor-parallel shards start on 128-blocks, and versions of it written as
 * a model dir. Test-only, header-only. */
#ifndef TESTS_FP8TEST_H
#define TESTS_FP8TEST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/safetensors.h"
#include "proto/spec.h"

/* H 256, no GQA, FFN 768 (tp2 shards on block edges); cut: q_proj and
 * o_proj of 200 (tp2 cuts a block). */
static inline void fp8t_model(struct proto_model *m, bool cut)
{
	char json[2048];
	struct proto_err err;
	int q = cut ? 200 : 256;

	snprintf(json, sizeof(json),
		 "{\"tensors\":["
		 "{\"name\":\"model.embed_tokens.weight\",\"dtype\":\"bf16\",\"shape\":[512,256]},"
		 "{\"name\":\"model.layers.0.input_layernorm.weight\",\"dtype\":\"bf16\",\"shape\":[256]},"
		 "{\"name\":\"model.layers.0.self_attn.q_proj.weight\",\"dtype\":\"bf16\",\"shape\":[%d,256]},"
		 "{\"name\":\"model.layers.0.self_attn.k_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,256]},"
		 "{\"name\":\"model.layers.0.self_attn.v_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,256]},"
		 "{\"name\":\"model.layers.0.self_attn.o_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,%d]},"
		 "{\"name\":\"model.layers.0.mlp.gate_proj.weight\",\"dtype\":\"bf16\",\"shape\":[768,256]},"
		 "{\"name\":\"model.layers.0.mlp.up_proj.weight\",\"dtype\":\"bf16\",\"shape\":[768,256]},"
		 "{\"name\":\"model.layers.0.mlp.down_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,768]},"
		 "{\"name\":\"model.norm.weight\",\"dtype\":\"bf16\",\"shape\":[256]},"
		 "{\"name\":\"lm_head.weight\",\"dtype\":\"bf16\",\"shape\":[512,256]}]}",
		 q, q);
	if (proto_model_parse(json, strlen(json), "model", m, &err) != 0) {
		fprintf(stderr, "fp8t_model: %s\n", err.msg);
		abort();
	}
}

static inline uint64_t fp8t_rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Writes dir/v1..v<n>.safetensors of m: weights of magnitude ~2^-6, each
 * version changing about 2 % of the elements by one BF16 step, as an
 * optimizer step at a small learning rate does. nan_at (0: none): that
 * version has a NaN at q_proj's element 1000. 0, or -1 when a file cannot
 * be written. */
static inline int fp8t_versions(const struct proto_model *m, const char *dir, int n, int nan_at)
{
	uint8_t **data = calloc(m->ntensors, sizeof(*data));
	uint64_t s = 0x243f6a8885a308d3ull;
	int rc = 0;

	for (uint32_t t = 0; t < m->ntensors; t++) {
		uint16_t *x = malloc(m->tensors[t].nbytes);
		for (uint64_t k = 0; k < m->tensors[t].nelem; k++)
			x[k] = (uint16_t)(0x3c00 + (fp8t_rng(&s) & 0x3ff)) | (fp8t_rng(&s) & 1 ? 0x8000 : 0);
		data[t] = (uint8_t *)x;
	}
	for (int v = 1; v <= n && rc == 0; v++) {
		char path[512];
		struct proto_err err;
		for (uint32_t t = 0; t < m->ntensors && v > 1; t++) {
			uint16_t *x = (uint16_t *)data[t];
			for (uint64_t k = 0; k < m->tensors[t].nelem; k++)
				if (fp8t_rng(&s) % 50 == 0)
					x[k] = (uint16_t)(x[k] + 1);
		}
		int64_t q = proto_model_find(m, "model.layers.0.self_attn.q_proj.weight");
		uint16_t keep = ((uint16_t *)data[q])[1000];
		if (v == nan_at)
			((uint16_t *)data[q])[1000] = 0x7fc0;
		snprintf(path, sizeof(path), "%s/v%d.safetensors", dir, v);
		if (proto_st_write(path, m, NULL, (const void *const *)data, &err) != 0) {
			fprintf(stderr, "fp8t_versions: %s\n", err.msg);
			rc = -1;
		}
		((uint16_t *)data[q])[1000] = keep;
	}
	for (uint32_t t = 0; t < m->ntensors; t++)
		free(data[t]);
	free(data);
	return rc;
}

#endif
