/* The synthetic Llama-shaped policy used by demos, tests and benchmarks. */
#include "proto/fixture.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>


static uint64_t mix(uint64_t z)
{
	z += 0x9E3779B97F4A7C15ull;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static int add(struct proto_model *m, const char *name, uint64_t d0, uint64_t d1,
	       struct proto_err *err)
{
	uint64_t shape[2] = {d0, d1};
	return proto_model_add(m, name, PROTO_DT_BF16, d1 ? 2 : 1, shape, err);
}

int proto_fixture_model(uint64_t total_bytes, struct proto_model *m, struct proto_err *err)
{
	static const char *const proj[] = {"self_attn.q_proj", "self_attn.k_proj",
					   "self_attn.v_proj", "self_attn.o_proj",
					   "mlp.gate_proj",    "mlp.up_proj",
					   "mlp.down_proj"};
	uint64_t h = 64, layers;
	char name[PROTO_NAME_MAX];
	int rc;

	/* Bytes: embeddings and head 2 * 8H*H * 2, a layer (11.5 H^2 + 2H) * 2.
	 * The widest H that still leaves room for eight layers. */
	while (h < 4096 && 32 * (2 * h) * (2 * h) + 8 * 23 * (2 * h) * (2 * h) <= total_bytes)
		h *= 2;
	uint64_t fixed = 2 * 8 * h * h * 2 + 2 * h, layer = 23 * h * h + 4 * h;
	layers = total_bytes > fixed + layer ? (total_bytes - fixed) / layer : 1;
	proto_model_init(m);
	rc = add(m, "model.embed_tokens.weight", 8 * h, h, err);
	for (uint64_t l = 0; l < layers && rc == 0; l++) {
		uint64_t rows[] = {h, h / 4, h / 4, h, 3 * h, 3 * h, h};
		uint64_t cols[] = {h, h, h, h, h, h, 3 * h};
		for (size_t p = 0; p < PROTO_ARRAY_LEN(proj) && rc == 0; p++) {
			snprintf(name, sizeof(name), "model.layers.%llu.%s.weight", (unsigned long long)l,
				 proj[p]);
			rc = add(m, name, rows[p], cols[p], err);
		}
		snprintf(name, sizeof(name), "model.layers.%llu.input_layernorm.weight", (unsigned long long)l);
		if (rc == 0)
			rc = add(m, name, h, 0, err);
		snprintf(name, sizeof(name), "model.layers.%llu.post_attention_layernorm.weight",
			 (unsigned long long)l);
		if (rc == 0)
			rc = add(m, name, h, 0, err);
	}
	if (rc == 0)
		rc = add(m, "model.norm.weight", h, 0, err);
	if (rc == 0)
		rc = add(m, "lm_head.weight", 8 * h, h, err);
	if (rc == 0)
		rc = proto_model_finish(m, err);
	if (rc != 0)
		proto_model_fini(m);
	return rc;
}

void proto_fixture_fill(const struct proto_model *m, uint64_t seed, uint64_t version, uint32_t t,
			uint64_t first, uint64_t count, uint8_t *out)
{
	/* Projections ~ +-2^-7 scale with random mantissas; norms near 1.0. */
	bool norm = strstr(m->tensors[t].name, "norm") != NULL;
	uint64_t key = mix(seed ^ mix(version ^ ((uint64_t)t << 32)));
	uint16_t *o = (uint16_t *)out;
	uint64_t i = first, end = first + count, r = 0;

	while (i < end) {
		if (i == first || (i & 3) == 0)
			r = mix(key ^ (i >> 2)) >> ((i & 3) * 16);
		uint16_t v = (uint16_t)r;
		uint16_t bits = norm ? (uint16_t)(0x3F80 | (v & 0x0F))
				     : (uint16_t)((v & 0x8000) | (0x3C00 + (v & 0x01FF)));
		memcpy(o++, &bits, 2);
		r >>= 16;
		i++;
	}
}

static void fixture_source(void *arg, uint32_t tensor, uint64_t first, uint64_t count,
			   uint8_t *out)
{
	const uint64_t *a = arg; /* {model pointer, seed, version} */
	proto_fixture_fill((const struct proto_model *)(uintptr_t)a[0], a[1], a[2], tensor, first,
			   count, out);
}

void proto_fixture_fill_rank(const struct proto_model *m, const struct proto_layout *l,
			     uint32_t rank, uint64_t seed, uint64_t version, uint8_t *block)
{
	uint64_t arg[3] = {(uint64_t)(uintptr_t)m, seed, version};
	proto_layout_fill_rank(m, l, rank, fixture_source, arg, block);
}
