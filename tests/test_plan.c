/* Planner tests: exact parcels for the reference example, and a brute-force
 * check (every destination byte equals the source byte it must be) over
 * fused, flat, MoE, 3-D, replicated and random layouts in every dtype. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>

#include "proto/box.h"
#include "proto/chunkhash.h"
#include "proto/proto.h"
#include "tests/testutil.h"

/* The byte a logical element's byte b must hold: a hash of its identity. */
static uint8_t elem_byte(uint32_t tensor, uint64_t idx, uint32_t b)
{
	uint64_t x = (idx * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)tensor << 40) ^ b;
	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint8_t)x;
}

/* Visits every element of a piece: calls fn(local byte offset, flat index). */
static void for_each_elem(const struct proto_model *m, const struct proto_local *l,
			  const struct proto_piece *p,
			  void (*fn)(void *, uint64_t, uint32_t, uint64_t), void *arg)
{
	const struct proto_tensor *t = &m->tensors[p->tensor];
	size_t es = proto_dtype_size(t->dtype);
	struct proto_boxes bx = {0};
	uint64_t x[PROTO_MAX_DIMS];

	if (p->flat)
		assert_int_equal(proto_flat_to_boxes(t->shape, t->ndim, p->box.lo[0], p->box.hi[0], &bx), 0);
	else
		assert_int_equal(proto_boxes_push(&bx, &p->box), 0);
	for (uint32_t b = 0; b < bx.n; b++) {
		const struct proto_box *bb = &bx.v[b];
		for (uint32_t d = 0; d < t->ndim; d++)
			x[d] = bb->lo[d];
		for (;;) {
			uint64_t flat = 0;
			for (uint32_t d = 0; d < t->ndim; d++)
				flat = flat * t->shape[d] + x[d];
			fn(arg, l->offset + proto_local_elem_offset(m, l, p, x) * es, p->tensor, flat);
			uint32_t d = t->ndim;
			while (d > 0) {
				d--;
				if (++x[d] < bb->hi[d])
					break;
				x[d] = bb->lo[d];
				if (d == 0)
					goto next;
			}
			if (t->ndim == 0)
				break;
		}
	next:;
	}
	proto_boxes_fini(&bx);
}

struct fill {
	const struct proto_model *m;
	uint8_t *mem;
	uint64_t *checked;
};

static void fill_fn(void *arg, uint64_t off, uint32_t tensor, uint64_t idx)
{
	struct fill *f = arg;
	size_t es = proto_dtype_size(f->m->tensors[tensor].dtype);
	for (uint32_t b = 0; b < es; b++)
		f->mem[off + b] = elem_byte(tensor, idx, b);
}

static void check_fn(void *arg, uint64_t off, uint32_t tensor, uint64_t idx)
{
	struct fill *f = arg;
	size_t es = proto_dtype_size(f->m->tensors[tensor].dtype);
	for (uint32_t b = 0; b < es; b++)
		assert_int_equal(f->mem[off + b], elem_byte(tensor, idx, b));
	*f->checked += es;
}

/*
 * Plans src -> dst, moves every parcel with gather/scatter through a payload
 * buffer (in odd-sized pieces, as chunks would), and checks every byte of
 * every destination local tensor. Returns the plan's totals in *out.
 */
static void move_and_check(const struct proto_model *m, const struct proto_layout *src,
			   const struct proto_layout *dst, struct proto_plan *out)
{
	struct proto_plan p;
	struct proto_err err;
	uint8_t **smem = calloc(src->nranks, sizeof(*smem));
	uint8_t **dmem = calloc(dst->nranks, sizeof(*dmem));
	uint64_t checked = 0;

	if (proto_plan_build(m, src, dst, &p, &err) != 0)
		fail_msg("plan: %s", err.msg);
	for (uint32_t r = 0; r < src->nranks; r++) {
		smem[r] = calloc(1, src->ranks[r].nbytes + 1);
		struct fill f = {m, smem[r], NULL};
		for (uint32_t i = 0; i < src->ranks[r].nlocals; i++)
			for (uint32_t k = 0; k < src->ranks[r].locals[i].npieces; k++)
				for_each_elem(m, &src->ranks[r].locals[i], &src->ranks[r].locals[i].pieces[k],
					      fill_fn, &f);
	}
	uint8_t **smem2 = calloc(dst->nranks, sizeof(*smem2)); /* placed along proto_parcel_spans */
	for (uint32_t r = 0; r < dst->nranks; r++) {
		dmem[r] = calloc(1, dst->ranks[r].nbytes + 1);
		smem2[r] = calloc(1, dst->ranks[r].nbytes + 1);
	}
	for (uint32_t i = 0; i < p.nparcels; i++) {
		const struct proto_parcel *pc = &p.parcels[i];
		uint8_t *pay = malloc(pc->bytes + 1);
		/* Odd piece sizes cross run boundaries the way chunks do. */
		for (uint64_t off = 0, step = 7; off < pc->bytes; off += step, step = step * 3 % 61 + 1) {
			uint64_t n = PROTO_MIN(step, pc->bytes - off);
			proto_parcel_gather(&p, pc, src, smem[pc->src_rank], off, n, pay + off);
		}
		for (uint64_t off = 0, step = 5; off < pc->bytes; off += step, step = step * 7 % 53 + 1) {
			uint64_t n = PROTO_MIN(step, pc->bytes - off);
			proto_parcel_scatter(&p, pc, dst, dmem[pc->dst_rank], off, n, pay + off);
		}
		/* The same payload placed along its spans, in uneven pieces, with
		 * too little room first. */
		for (uint64_t off = 0, step = 3; off < pc->bytes; off += step, step = step * 5 % 97 + 1) {
			uint64_t n = PROTO_MIN(step, pc->bytes - off), sum = 0;
			struct proto_span one[1], *sp;
			size_t k = proto_parcel_spans(&p, pc, dst, off, n, one, 1);
			assert_true(k >= 1);
			sp = calloc(k, sizeof(*sp));
			size_t k2 = proto_parcel_spans(&p, pc, dst, off, n, sp, k);
			assert_true(k2 <= k);
			for (size_t j = 0; j < k2; j++) {
				assert_true(sp[j].src_off == sum); /* in payload order, no gap */
				if (j > 0) /* merged: never adjacent in the block */
					assert_true(sp[j - 1].dst_off + sp[j - 1].len != sp[j].dst_off);
				assert_true(sp[j].dst_off + sp[j].len <= dst->ranks[pc->dst_rank].nbytes);
				memcpy(smem2[pc->dst_rank] + sp[j].dst_off, pay + off + sp[j].src_off,
				       sp[j].len);
				sum += sp[j].len;
			}
			assert_true(sum == n);
			free(sp);
		}
		free(pay);
	}
	for (uint32_t r = 0; r < dst->nranks; r++) {
		struct fill f = {m, dmem[r], &checked};
		for (uint32_t i = 0; i < dst->ranks[r].nlocals; i++)
			for (uint32_t k = 0; k < dst->ranks[r].locals[i].npieces; k++)
				for_each_elem(m, &dst->ranks[r].locals[i], &dst->ranks[r].locals[i].pieces[k],
					      check_fn, &f);
	}
	assert_int_equal(checked, p.retained_bytes);
	assert_int_equal(p.mapped_bytes, p.retained_bytes);
	/* Runs are merged: no two consecutive runs of a segment are adjacent
	 * on both sides. */
	for (uint64_t s = 0; s < p.nsegs; s++)
		for (uint64_t r = p.segs[s].run0 + 1; r < p.segs[s].run0 + p.segs[s].nruns; r++)
			assert_false(p.runs[r - 1].src_off + p.runs[r - 1].len == p.runs[r].src_off &&
				     p.runs[r - 1].dst_off + p.runs[r - 1].len == p.runs[r].dst_off);
	for (uint32_t r = 0; r < src->nranks; r++)
		free(smem[r]);
	for (uint32_t r = 0; r < dst->nranks; r++) {
		assert_memory_equal(smem2[r], dmem[r], dst->ranks[r].nbytes);
		free(dmem[r]);
		free(smem2[r]);
	}
	free(smem2);
	free(smem);
	free(dmem);
	if (out != NULL)
		*out = p;
	else
		proto_plan_fini(&p);
}

static void model_from(struct proto_model *m, const char *json)
{
	struct proto_err err;
	if (proto_model_parse(json, strlen(json), "model", m, &err) != 0)
		fail_msg("model: %s", err.msg);
}

static void layout_from(const struct proto_model *m, struct proto_layout *l, const char *json)
{
	struct proto_err err;
	if (proto_layout_parse(m, json, strlen(json), "layout", l, &err) != 0)
		fail_msg("layout: %s", err.msg);
}

static void check_pair(const char *model, const char *src, const char *dst,
		       struct proto_plan *out)
{
	struct proto_model m;
	struct proto_layout s, d;
	model_from(&m, model);
	layout_from(&m, &s, src);
	layout_from(&m, &d, dst);
	move_and_check(&m, &s, &d, out);
	proto_layout_fini(&s);
	proto_layout_fini(&d);
	proto_model_fini(&m);
}

static void test_reference_example(void **state)
{
	char path[512];
	struct proto_model m;
	struct proto_layout s, d;
	struct proto_plan p;
	struct proto_err err;

	assert_int_equal(proto_model_load(tu_data(path, sizeof(path), "plan/w4x4-model.json"), &m, &err), 0);
	assert_int_equal(proto_layout_load(&m, tu_data(path, sizeof(path), "plan/w4x4-trainer.json"), &s, &err), 0);
	assert_int_equal(proto_layout_load(&m, tu_data(path, sizeof(path), "plan/w4x4-tp2.json"), &d, &err), 0);
	move_and_check(&m, &s, &d, &p);
	assert_int_equal(p.nparcels, 4);
	assert_int_equal(p.retained_bytes, 32);
	assert_int_equal(p.mapped_bytes, 32);
	assert_int_equal(p.broadcast_bytes, 64);
	const struct proto_parcel *pc = proto_plan_parcel(&p, 1, 0);
	assert_non_null(pc);
	assert_int_equal(pc->bytes, 8);
	assert_int_equal(pc->nsegs, 1);
	const struct proto_segment *sg = &p.segs[pc->seg0];
	assert_int_equal(sg->box.lo[0], 2);
	assert_int_equal(sg->box.hi[0], 4);
	assert_int_equal(sg->box.lo[1], 0);
	assert_int_equal(sg->box.hi[1], 2);
	assert_int_equal(sg->nruns, 2);
	const struct proto_run *r = &p.runs[sg->run0];
	assert_int_equal(r[0].src_off, 0);
	assert_int_equal(r[0].dst_off, 8);
	assert_int_equal(r[0].len, 4);
	assert_int_equal(r[1].src_off, 8);
	assert_int_equal(r[1].dst_off, 12);
	assert_int_equal(r[1].len, 4);
	/* The JSON form carries the same numbers. */
	json_t *j = proto_plan_to_json(&p, &m, &s, &d);
	char *txt = json_dumps(j, JSON_COMPACT);
	assert_non_null(strstr(txt, "{\"src_rank\":1,\"dst_rank\":0,\"bytes\":8,\"segments\":[{\"tensor\":\"W\","
				    "\"box\":[[2,4],[0,2]],\"src_local\":\"W\",\"dst_local\":\"W\","
				    "\"runs\":[[0,8,4],[8,12,4]]}]}"));
	assert_non_null(strstr(txt, "\"retained_bytes\":32,\"mapped_bytes\":32,\"broadcast_bytes\":64"));
	free(txt);
	json_decref(j);
	/* Same inputs, same digest; planning is a pure function. */
	struct proto_plan p2;
	assert_int_equal(proto_plan_build(&m, &s, &d, &p2, &err), 0);
	assert_memory_equal(p.digest, p2.digest, 32);
	proto_plan_fini(&p2);
	proto_plan_fini(&p);
	proto_layout_fini(&s);
	proto_layout_fini(&d);
	proto_model_fini(&m);
}

static const char *qkv_model =
	"{\"tensors\":[{\"name\":\"l0.q\",\"dtype\":\"bf16\",\"shape\":[8,6]},"
	"{\"name\":\"l0.k\",\"dtype\":\"bf16\",\"shape\":[4,6]},"
	"{\"name\":\"l0.v\",\"dtype\":\"bf16\",\"shape\":[4,6]},"
	"{\"name\":\"l1.q\",\"dtype\":\"bf16\",\"shape\":[8,6]},"
	"{\"name\":\"l1.k\",\"dtype\":\"bf16\",\"shape\":[4,6]},"
	"{\"name\":\"l1.v\",\"dtype\":\"bf16\",\"shape\":[4,6]}]}";

static void test_fused_qkv_from_flat(void **state)
{
	struct proto_plan p;
	check_pair(qkv_model, "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"flat\":true}]}",
		   "{\"ranks\":2,\"tensors\":[{\"match\":\"*.q\",\"fuse\":[\"*.q\",\"*.k\",\"*.v\"],"
		   "\"name\":\"*.qkv\",\"split\":0}]}",
		   &p);
	/* Flat shards of 16/8/8 elements: TP rank 0 needs the first half of
	 * each tensor (flat ranks 0-1), rank 1 the second half (ranks 1-2). */
	assert_int_equal(p.nparcels, 4);
	assert_int_equal(p.retained_bytes, 2 * 16 * 6 * 2);
	proto_plan_fini(&p);
	/* And the explicit fused form, with a declared shape. */
	check_pair(qkv_model, "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
		   "{\"ranks\":[{\"tensors\":[{\"name\":\"qkv\",\"concat_dim\":0,\"shape\":[8,6],"
		   "\"dtype\":\"bf16\",\"pieces\":[{\"tensor\":\"l0.q\",\"box\":[[4,8],[0,6]]},"
		   "{\"tensor\":\"l0.k\",\"box\":[[2,4],[0,6]]},{\"tensor\":\"l0.v\",\"box\":[[2,4],[0,6]]}]}]}]}",
		   NULL);
}

static void test_moe_experts_reordered(void **state)
{
	const char *model = "{\"tensors\":[{\"name\":\"experts.w1\",\"dtype\":\"fp8_e4m3\",\"shape\":[8,4,6]},"
			    "{\"name\":\"experts.w2\",\"dtype\":\"bf16\",\"shape\":[8,6,4]}]}";
	struct proto_plan p;
	check_pair(model, "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"split\":0}]}",
		   "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"experts\":[[7,2,5,0],[1,3,4,6]]}]}", &p);
	assert_int_equal(p.nparcels, 4);
	proto_plan_fini(&p);
	/* Experts on a later dim, and flat trainer shards. */
	check_pair(model, "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"flat\":true}]}",
		   "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"experts\":[[3,0],[1],[2]],\"dim\":1}]}",
		   NULL);
}

static void test_3d_middle_split(void **state)
{
	const char *model = "{\"tensors\":[{\"name\":\"T\",\"dtype\":\"i64\",\"shape\":[3,8,5]},"
			    "{\"name\":\"U\",\"dtype\":\"fp32\",\"shape\":[2,6,3,4]}]}";
	check_pair(model, "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"split\":0}]}",
		   "{\"ranks\":4,\"tensors\":[{\"match\":\"*\",\"split\":1}]}", NULL);
	check_pair(model, "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"split\":2}]}",
		   "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"split\":1}]}", NULL);
}

static void test_replicated(void **state)
{
	const char *model = "{\"tensors\":[{\"name\":\"norm\",\"dtype\":\"fp32\",\"shape\":[16]},"
			    "{\"name\":\"n2\",\"dtype\":\"fp16\",\"shape\":[16]},"
			    "{\"name\":\"n3\",\"dtype\":\"u8\",\"shape\":[16]},"
			    "{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]}]}";
	struct proto_plan p;
	check_pair(model,
		   "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"split\":0},{\"match\":\"*\",\"replicate\":true}]}",
		   "{\"ranks\":3,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}", &p);
	/* Replicated sources share the load: both trainer ranks send. */
	uint64_t from[2] = {0, 0};
	for (uint32_t i = 0; i < p.nparcels; i++)
		from[p.parcels[i].src_rank] += p.parcels[i].bytes;
	assert_true(from[0] > 0 && from[1] > 0);
	/* Broadcast equals retained when every rank keeps whole tensors. */
	assert_int_equal(p.broadcast_bytes, p.retained_bytes);
	proto_plan_fini(&p);
}

static void test_every_dtype(void **state)
{
	for (int dt = 0; dt < PROTO_DT_COUNT; dt++) {
		char model[256];
		snprintf(model, sizeof(model),
			 "{\"tensors\":[{\"name\":\"A\",\"dtype\":\"%s\",\"shape\":[5,7]},"
			 "{\"name\":\"s\",\"dtype\":\"%s\",\"shape\":[]}]}",
			 proto_dtype_name((enum proto_dtype)dt), proto_dtype_name((enum proto_dtype)dt));
		check_pair(model,
			   "{\"ranks\":3,\"tensors\":[{\"tensor\":\"A\",\"flat\":true},{\"tensor\":\"s\",\"replicate\":true}]}",
			   "{\"ranks\":2,\"tensors\":[{\"tensor\":\"A\",\"split\":1},{\"tensor\":\"s\",\"replicate\":true}]}",
			   NULL);
	}
}

/* A tiny deterministic PRNG for random layouts. */
static uint64_t rng_next(uint64_t *s)
{
	*s += 0x9E3779B97F4A7C15ull;
	uint64_t z = *s;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void random_rules(uint64_t *rng, const struct proto_model *m, char *buf, size_t len,
			 uint32_t nranks)
{
	size_t n = (size_t)snprintf(buf, len, "{\"ranks\":%u,\"tensors\":[", nranks);
	for (uint32_t t = 0; t < m->ntensors; t++) {
		const struct proto_tensor *tt = &m->tensors[t];
		uint64_t kind = rng_next(rng) % 3;
		n += (size_t)snprintf(buf + n, len - n, "%s{\"tensor\":\"%s\",", t ? "," : "", tt->name);
		if (kind == 0)
			n += (size_t)snprintf(buf + n, len - n, "\"replicate\":true}");
		else if (kind == 1)
			n += (size_t)snprintf(buf + n, len - n, "\"flat\":true}");
		else
			n += (size_t)snprintf(buf + n, len - n, "\"split\":%u}",
					      (unsigned)(rng_next(rng) % tt->ndim));
	}
	snprintf(buf + n, len - n, "]}");
}

static void test_random_layouts(void **state)
{
	uint64_t rng = 42;
	char model[2048], src[4096], dst[4096];

	for (int iter = 0; iter < 60; iter++) {
		size_t n = (size_t)snprintf(model, sizeof(model), "{\"tensors\":[");
		uint32_t nt = 1 + (uint32_t)(rng_next(&rng) % 4);
		for (uint32_t t = 0; t < nt; t++) {
			uint32_t nd = 1 + (uint32_t)(rng_next(&rng) % 4);
			n += (size_t)snprintf(model + n, sizeof(model) - n,
					      "%s{\"name\":\"t%u\",\"dtype\":\"%s\",\"shape\":[", t ? "," : "", t,
					      proto_dtype_name((enum proto_dtype)(rng_next(&rng) % PROTO_DT_COUNT)));
			for (uint32_t d = 0; d < nd; d++)
				n += (size_t)snprintf(model + n, sizeof(model) - n, "%s%u", d ? "," : "",
						      1 + (unsigned)(rng_next(&rng) % 7));
			n += (size_t)snprintf(model + n, sizeof(model) - n, "]}");
		}
		snprintf(model + n, sizeof(model) - n, "]}");
		struct proto_model m;
		model_from(&m, model);
		random_rules(&rng, &m, src, sizeof(src), 1 + (uint32_t)(rng_next(&rng) % 5));
		random_rules(&rng, &m, dst, sizeof(dst), 1 + (uint32_t)(rng_next(&rng) % 5));
		struct proto_layout s, d;
		layout_from(&m, &s, src);
		layout_from(&m, &d, dst);
		move_and_check(&m, &s, &d, NULL);
		proto_layout_fini(&s);
		proto_layout_fini(&d);
		proto_model_fini(&m);
	}
}

static const char *llama_model =
		"{\"tensors\":[{\"name\":\"model.embed_tokens.weight\",\"dtype\":\"bf16\",\"shape\":[32,8]},"
		"{\"name\":\"model.layers.0.self_attn.q_proj.weight\",\"dtype\":\"bf16\",\"shape\":[8,8]},"
		"{\"name\":\"model.layers.0.self_attn.k_proj.weight\",\"dtype\":\"bf16\",\"shape\":[4,8]},"
		"{\"name\":\"model.layers.0.self_attn.v_proj.weight\",\"dtype\":\"bf16\",\"shape\":[4,8]},"
		"{\"name\":\"model.layers.0.self_attn.o_proj.weight\",\"dtype\":\"bf16\",\"shape\":[8,8]},"
		"{\"name\":\"model.layers.0.mlp.gate_proj.weight\",\"dtype\":\"bf16\",\"shape\":[16,8]},"
		"{\"name\":\"model.layers.0.mlp.up_proj.weight\",\"dtype\":\"bf16\",\"shape\":[16,8]},"
		"{\"name\":\"model.layers.0.mlp.down_proj.weight\",\"dtype\":\"bf16\",\"shape\":[8,16]},"
		"{\"name\":\"model.layers.0.input_layernorm.weight\",\"dtype\":\"bf16\",\"shape\":[8]},"
		"{\"name\":\"model.norm.weight\",\"dtype\":\"bf16\",\"shape\":[8]},"
		"{\"name\":\"lm_head.weight\",\"dtype\":\"bf16\",\"shape\":[32,8]}]}";

/* A Llama-shaped model: fsdp2 trainer -> built-in tp2 and tp1. */
static void test_builtin_tp(void **state)
{
	struct proto_model m;
	struct proto_layout s, t2, t1;
	struct proto_err err;

	model_from(&m, llama_model);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &s, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &t2, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp1", &t1, &err), 0);
	assert_int_equal(proto_layout_check_complete(&m, &t2, &err), 0);
	/* tp2 fuses qkv and gate_up: 8 locals per rank (embed, qkv, o, gate_up,
	 * down, two norms, head). */
	assert_int_equal(t2.ranks[0].nlocals, 8);
	assert_int_equal(t2.ranks[1].nlocals, 8);
	move_and_check(&m, &s, &t2, NULL);
	move_and_check(&m, &s, &t1, NULL);
	move_and_check(&m, &t2, &t1, NULL);
	/* Same layout, same digest; different layout, different digest. */
	struct proto_layout t2b;
	assert_int_equal(proto_layout_builtin(&m, "tp2", &t2b, &err), 0);
	assert_memory_equal(t2.digest, t2b.digest, 32);
	assert_memory_not_equal(t2.digest, t1.digest, 32);
	proto_layout_fini(&t2b);
	assert_int_not_equal(proto_layout_builtin(&m, "pp2", &t2b, &err), 0);
	assert_non_null(strstr(err.msg, "pp2"));
	proto_layout_fini(&s);
	proto_layout_fini(&t2);
	proto_layout_fini(&t1);
	proto_model_fini(&m);
}

/* A destination element no source holds is an error naming the tensor. */
static void test_uncovered_source(void **state)
{
	struct proto_model m;
	struct proto_layout s, d;
	struct proto_plan p;
	struct proto_err err;

	model_from(&m, "{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]}]}");
	layout_from(&m, &s, "{\"ranks\":[{\"tensors\":[{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,3],[0,4]]}]}]}]}");
	layout_from(&m, &d, "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"split\":1}]}");
	assert_int_equal(proto_plan_build(&m, &s, &d, &p, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "W elements [3,4)"));
	assert_int_equal(p.nparcels, 0);
	assert_int_not_equal(proto_layout_check_complete(&m, &s, &err), 0);
	assert_non_null(strstr(err.msg, "does not cover"));
	proto_layout_fini(&s);
	proto_layout_fini(&d);
	proto_model_fini(&m);
}

static void elem_source(void *arg, uint32_t tensor, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct proto_model *m = arg;
	size_t es = proto_dtype_size(m->tensors[tensor].dtype);
	for (uint64_t i = 0; i < count; i++)
		for (uint32_t b = 0; b < es; b++)
			out[i * es + b] = elem_byte(tensor, first + i, b);
}

/* fill_rank writes exactly what the brute-force walk says, for box, fused,
 * expert and flat pieces. */
static void test_fill_rank(void **state)
{
	struct proto_model m;
	struct proto_layout l;
	uint64_t checked = 0;

	model_from(&m, qkv_model);
	layout_from(&m, &l, "{\"ranks\":3,\"tensors\":[{\"match\":\"l0.q\",\"fuse\":[\"l0.q\",\"l0.k\"],"
			    "\"name\":\"qk\",\"split\":0},{\"tensor\":\"l0.v\",\"flat\":true},"
			    "{\"tensor\":\"l1.q\",\"experts\":[[7,0],[3],[1,2,4,5,6]]},"
			    "{\"match\":\"*\",\"replicate\":true}]}");
	for (uint32_t r = 0; r < l.nranks; r++) {
		uint8_t *block = malloc(l.ranks[r].nbytes + 1);
		proto_layout_fill_rank(&m, &l, r, elem_source, &m, block);
		struct fill f = {&m, block, &checked};
		for (uint32_t i = 0; i < l.ranks[r].nlocals; i++)
			for (uint32_t k = 0; k < l.ranks[r].locals[i].npieces; k++)
				for_each_elem(&m, &l.ranks[r].locals[i], &l.ranks[r].locals[i].pieces[k],
					      check_fn, &f);
		free(block);
	}
	assert_true(checked > 0);
	proto_layout_fini(&l);
	proto_model_fini(&m);
}

/* Served parcels of one trainer rank, put back with ungather. */
struct served {
	const struct proto_plan *plan;
	const struct proto_parcel *pc;
	uint8_t *payload;
};

static void span_mark(void *arg, uint64_t at, uint64_t n)
{
	memset((uint8_t *)arg + at, 1, n);
}

/* Every byte parcel pc reads from its source rank is marked. */
static bool all_marked(const uint8_t *mark, const struct proto_plan *p, const struct proto_parcel *pc,
		       const struct proto_layout *src)
{
	uint8_t *want = calloc(src->ranks[pc->src_rank].nbytes + 1, 1);
	bool ok = true;

	proto_parcel_src_spans(p, pc, src, 0, pc->bytes, span_mark, want);
	for (uint64_t b = 0; b < src->ranks[pc->src_rank].nbytes; b++)
		ok &= !want[b] || mark[b];
	free(want);
	return ok;
}

/*
 * An addendum's parcels from the version as served: each fsdp2 trainer
 * rank's memory rebuilt (ungather) from the tp2 and tp1 parcels it sent
 * gives tp4 parcels whose chunk hashes are those of a full rebuild from the
 * source; the source spans say which bytes the served parcels reach, and
 * without one of them some byte a tp4 parcel reads is not reached.
 */
static void test_ungather_rebuilds_source(void **state)
{
	struct proto_model m;
	struct proto_layout s, t2, t1, t4;
	struct proto_plan p2, p1, p4;
	struct proto_err err;
	const uint64_t cs = 64; /* chunk size */
	uint64_t chunks = 0;

	model_from(&m, llama_model);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &s, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &t2, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp1", &t1, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp4", &t4, &err), 0);
	assert_int_equal(proto_plan_build(&m, &s, &t2, &p2, &err), 0);
	assert_int_equal(proto_plan_build(&m, &s, &t1, &p1, &err), 0);
	assert_int_equal(proto_plan_build(&m, &s, &t4, &p4, &err), 0);
	for (uint32_t r = 0; r < s.nranks; r++) {
		uint64_t nb = s.ranks[r].nbytes;
		uint8_t *src = malloc(nb + 1), *back = malloc(nb + 1), *mark = calloc(nb + 1, 1);
		struct served sv[16];
		size_t n = 0;
		proto_layout_fill_rank(&m, &s, r, elem_source, &m, src);
		memset(back, 0xee, nb + 1);
		/* The served export: rank r's tp2 parcels, then its tp1 one, raw. */
		const struct proto_plan *plans[] = {&p2, &p1};
		for (size_t k = 0; k < 2; k++)
			for (uint32_t i = 0; i < plans[k]->nparcels; i++) {
				const struct proto_parcel *pc = &plans[k]->parcels[i];
				if (pc->src_rank != r)
					continue;
				assert_true(n < 16);
				sv[n] = (struct served){plans[k], pc, malloc(pc->bytes + 1)};
				proto_parcel_gather(plans[k], pc, &s, src, 0, pc->bytes, sv[n].payload);
				n++;
			}
		assert_true(n > 1);
		for (size_t k = 0; k < n; k++) {
			proto_parcel_ungather(sv[k].plan, sv[k].pc, &s, back, 0, sv[k].pc->bytes,
					      sv[k].payload);
			proto_parcel_src_spans(sv[k].plan, sv[k].pc, &s, 0, sv[k].pc->bytes, span_mark,
					       mark);
		}
		for (uint32_t i = 0; i < p4.nparcels; i++) {
			const struct proto_parcel *pc = &p4.parcels[i];
			if (pc->src_rank != r)
				continue;
			assert_true(all_marked(mark, &p4, pc, &s));
			uint8_t *a = malloc(pc->bytes + 1), *b = malloc(pc->bytes + 1);
			proto_parcel_gather(&p4, pc, &s, src, 0, pc->bytes, a);
			proto_parcel_gather(&p4, pc, &s, back, 0, pc->bytes, b);
			for (uint64_t c0 = 0; c0 < pc->bytes; c0 += cs) {
				uint8_t ha[32], hb[32];
				uint64_t len = PROTO_MIN(cs, pc->bytes - c0);
				proto_chunk_hash(ha, a + c0, len);
				proto_chunk_hash(hb, b + c0, len);
				assert_memory_equal(ha, hb, sizeof(ha));
				chunks++;
			}
			free(a);
			free(b);
		}
		/* Without the rank's last tp2 parcel (and its tp1 one) some
		 * byte a tp4 parcel reads is not reached. */
		memset(mark, 0, nb + 1);
		size_t last2 = 0;
		for (size_t k = 0; k < n; k++)
			if (sv[k].plan == &p2)
				last2 = k;
		for (size_t k = 0; k < last2; k++)
			proto_parcel_src_spans(sv[k].plan, sv[k].pc, &s, 0, sv[k].pc->bytes, span_mark,
					       mark);
		bool all = true;
		for (uint32_t i = 0; i < p4.nparcels; i++)
			if (p4.parcels[i].src_rank == r)
				all &= all_marked(mark, &p4, &p4.parcels[i], &s);
		assert_false(all);
		for (size_t k = 0; k < n; k++)
			free(sv[k].payload);
		free(src);
		free(back);
		free(mark);
	}
	assert_true(chunks > 0);
	proto_plan_fini(&p2);
	proto_plan_fini(&p1);
	proto_plan_fini(&p4);
	proto_layout_fini(&s);
	proto_layout_fini(&t2);
	proto_layout_fini(&t1);
	proto_layout_fini(&t4);
	proto_model_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reference_example),
		cmocka_unit_test(test_fused_qkv_from_flat),
		cmocka_unit_test(test_moe_experts_reordered),
		cmocka_unit_test(test_3d_middle_split),
		cmocka_unit_test(test_replicated),
		cmocka_unit_test(test_every_dtype),
		cmocka_unit_test(test_random_layouts),
		cmocka_unit_test(test_builtin_tp),
		cmocka_unit_test(test_uncovered_source),
		cmocka_unit_test(test_fill_rank),
		cmocka_unit_test(test_ungather_rebuilds_source),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
