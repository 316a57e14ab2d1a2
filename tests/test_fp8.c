/* fp8_e4m3_block128: the quantizer (proto/fp8.c) against a reference
 * written apart from it (tests/py/fp8_ref.py, numpy), bit for bit, on random
 * tensors and on the edge cases; FP8 layouts (proto/layout_fp8.c): scale
 * locals, splits that cut a block, the plan from the quantized source. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "proto/fixture.h"
#include "proto/fp8.h"
#include "proto/plan.h"
#include "proto/spec.h"
#include "tests/fp8test.h"
#include "tests/testutil.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static uint16_t bf16_of(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16); /* truncation: any BF16 will do */
}

static void test_codes(void **state)
{
	(void)state;
	assert_int_equal(proto_fp8_from_f32(448.0f), 0x7e);
	assert_int_equal(proto_fp8_from_f32(463.9f), 0x7e);
	assert_int_equal(proto_fp8_from_f32(464.0f), 0x7e);
	assert_int_equal(proto_fp8_from_f32(1e30f), 0x7e);
	assert_int_equal(proto_fp8_from_f32(-448.0f), 0xfe);
	assert_int_equal(proto_fp8_from_f32(1.0f), 0x38);
	assert_int_equal(proto_fp8_from_f32(0.0f), 0x00);
	assert_int_equal(proto_fp8_from_f32(-0.0f), 0x80);
	assert_int_equal(proto_fp8_from_f32(ldexpf(1, -9)), 0x01);  /* smallest subnormal */
	assert_int_equal(proto_fp8_from_f32(ldexpf(1, -10)), 0x00); /* tie: even code 0 */
	assert_int_equal(proto_fp8_from_f32(ldexpf(3, -10)), 0x02); /* tie 1|2: 2 */
	assert_int_equal(proto_fp8_from_f32(ldexpf(15, -10)), 0x08); /* tie 7|8: 8, a normal */
	assert_int_equal(proto_fp8_from_f32(1.0625f), 0x38);        /* tie 1.0|1.125: even */
	assert_int_equal(proto_fp8_from_f32(1.1875f), 0x3a);        /* tie 1.125|1.25: even */
	for (unsigned c = 0; c < 0x7f; c++) {
		float v = proto_fp8_to_f32((uint8_t)c);
		assert_int_equal(proto_fp8_from_f32(v), c);
		assert_int_equal(proto_fp8_from_f32(-v), c | 0x80);
	}
	assert_true(isnan(proto_fp8_to_f32(0x7f)));
}

/* A tensor of the edge cases, 300 x 390 (partial blocks on both edges):
 * block (0,0) zeros; (0,1) subnormal BF16 values; (0,2) amax ties (+a and
 * -a, many times); (1,0) values whose quotient lands exactly on 448 and on
 * FP8 midpoints; (1,1) -0 and tiny values beside big ones (quotients in
 * FP8's subnormal range); the rest random across 2^-40..2^40. */
static void fill_edges(uint16_t *x, uint64_t rows, uint64_t cols)
{
	for (uint64_t r = 0; r < rows; r++)
		for (uint64_t c = 0; c < cols; c++) {
			uint64_t br = r / 128, bc = c / 128, k = r * cols + c;
			float v;
			if (br == 0 && bc == 0)
				v = 0.0f;
			else if (br == 0 && bc == 1)
				v = ldexpf((float)(1 + rng() % 127), -133) * (rng() & 1 ? 1 : -1);
			else if (br == 0 && bc == 2)
				v = (rng() % 3 == 0 ? 3.5f : (float)(rng() % 64) / 32.0f) *
				    (rng() & 1 ? 1 : -1);
			else if (br == 1 && bc == 0)
				v = ldexpf(448.0f, -(int)(rng() % 8)) * (1.0f + (float)(rng() % 16) / 64.0f);
			else if (br == 1 && bc == 1)
				v = rng() % 5 == 0 ? -0.0f : ldexpf(1.0f, (int)(rng() % 40) - 30);
			else
				v = ldexpf((float)((int64_t)(rng() % 2001) - 1000) / 1000.0f,
					   (int)(rng() % 81) - 40);
			x[k] = bf16_of(v);
		}
	x[129 * cols + 5] = bf16_of(448.0f); /* block (1,0)'s amax: quotient 448 */
}

static void fill_random(uint16_t *x, uint64_t n)
{
	for (uint64_t k = 0; k < n; k++) {
		uint16_t b = (uint16_t)rng();
		if ((b & 0x7f80) == 0x7f80)
			b &= 0xbfff; /* no NaN or infinity */
		x[k] = b;
	}
}

static int write_file(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	if (f == NULL)
		return -1;
	size_t w = fwrite(p, 1, n, f);
	return fclose(f) == 0 && w == n ? 0 : -1;
}

static int read_file(const char *path, void *p, size_t n)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return -1;
	size_t r = fread(p, 1, n, f);
	int extra = fgetc(f);
	fclose(f);
	return r == n && extra == EOF ? 0 : -1;
}

/* Quantizes x with tessera and with the reference; fails on any byte apart. */
static void compare(const char *dir, const uint16_t *x, uint64_t rows, uint64_t cols)
{
	const char *py = tu_python();
	uint64_t nbr = proto_fp8_blocks(rows), nbc = proto_fp8_blocks(cols), bad;
	uint8_t *q = malloc(rows * cols + 1), *rq = malloc(rows * cols + 1);
	float *s = malloc(nbr * nbc * 4 + 4), *rs = malloc(nbr * nbc * 4 + 4);
	char in[600], oq[600], os[600], ref[600];

	assert_non_null(q);
	assert_non_null(rq);
	assert_non_null(s);
	assert_non_null(rs);
	for (uint64_t br = 0; br < nbr; br++)
		assert_int_equal(proto_fp8_quantize_rows((const uint8_t *)x, rows, cols, br, q, s, &bad), 0);
	snprintf(in, sizeof(in), "%s/in.bf16", dir);
	snprintf(oq, sizeof(oq), "%s/out.fp8", dir);
	snprintf(os, sizeof(os), "%s/out.scale", dir);
	assert_int_equal(write_file(in, x, rows * cols * 2), 0);
	assert_int_equal(tu_sh("%s %s %llu %llu %s %s %s", py, tu_src(ref, sizeof(ref), "tests/py/fp8_ref.py"),
			       (unsigned long long)rows, (unsigned long long)cols, in, oq, os), 0);
	assert_int_equal(read_file(oq, rq, rows * cols), 0);
	assert_int_equal(read_file(os, rs, nbr * nbc * 4), 0);
	for (uint64_t k = 0; k < nbr * nbc; k++)
		if (memcmp(&s[k], &rs[k], 4) != 0)
			fail_msg("%llux%llu: scale %llu: %a, the reference %a", (unsigned long long)rows,
				 (unsigned long long)cols, (unsigned long long)k, (double)s[k], (double)rs[k]);
	for (uint64_t k = 0; k < rows * cols; k++)
		if (q[k] != rq[k])
			fail_msg("%llux%llu: element %llu (bf16 0x%04x): 0x%02x, the reference 0x%02x",
				 (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)k,
				 x[k], q[k], rq[k]);
	free(q);
	free(rq);
	free(s);
	free(rs);
}

static void test_reference(void **state)
{
	static const uint64_t shapes[][2] = {{128, 128}, {1, 5}, {129, 1}, {257, 384}, {300, 260}, {64, 1000}};
	const char *py = tu_python();
	char dir[256];

	(void)state;
	if (py == NULL) {
		print_message("skipped: needs TESSERA_PYTHON (make test sets it) for the numpy reference\n");
		skip();
	}
	if (tu_sh("%s -c 'import numpy' 2>/dev/null", py) != 0)
		fail_msg("numpy is not installed for %s (Debian: python3-numpy)", py);
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	uint16_t *x = malloc(300 * 390 * 2);
	assert_non_null(x);
	fill_edges(x, 300, 390);
	compare(dir, x, 300, 390);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		uint16_t *y = malloc(shapes[i][0] * shapes[i][1] * 2);
		assert_non_null(y);
		fill_random(y, shapes[i][0] * shapes[i][1]);
		compare(dir, y, shapes[i][0], shapes[i][1]);
		free(y);
	}
	free(x);
	tu_rmtree(dir);
}

static void test_nonfinite(void **state)
{
	uint16_t x[200 * 3];
	uint8_t q[200 * 3];
	float s[2];
	uint64_t bad = 0;

	(void)state;
	for (size_t k = 0; k < 600; k++)
		x[k] = bf16_of(1.0f);
	x[130 * 3 + 2] = 0x7fc0; /* NaN in block row 1 */
	assert_int_equal(proto_fp8_quantize_rows((uint8_t *)x, 200, 3, 0, q, s, &bad), 0);
	assert_int_equal(proto_fp8_quantize_rows((uint8_t *)x, 200, 3, 1, q, s, &bad), -EDOM);
	assert_int_equal(bad, 130 * 3 + 2);
	x[130 * 3 + 2] = 0xff80; /* -inf */
	assert_int_equal(proto_fp8_quantize_rows((uint8_t *)x, 200, 3, 1, q, s, &bad), -EDOM);
}

static const struct proto_local *find_local(const struct proto_layout *l, uint32_t r, const char *name)
{
	for (uint32_t i = 0; i < l->ranks[r].nlocals; i++)
		if (strcmp(l->ranks[r].locals[i].name, name) == 0)
			return &l->ranks[r].locals[i];
	return NULL;
}

static void test_layout(void **state)
{
	struct proto_model m;
	struct proto_layout l, again, src, bf;
	struct proto_plan p;
	struct proto_err err;
	const struct proto_local *qkv, *sc, *emb, *down, *dsc;

	(void)state;
	fp8t_model(&m, false);
	if (proto_layout_builtin(&m, "tp2:fp8", &l, &err) != 0)
		fail_msg("%s", err.msg);
	assert_true(proto_layout_transformed(&l));
	assert_int_equal(l.model->ntensors, m.ntensors + 7); /* a scale per projection */
	for (uint32_t r = 0; r < 2; r++) {
		qkv = find_local(&l, r, "model.layers.0.self_attn.qkv_proj.weight");
		sc = find_local(&l, r, "model.layers.0.self_attn.qkv_proj.weight_scale_inv");
		assert_non_null(qkv);
		assert_non_null(sc);
		assert_int_equal(qkv->dtype, PROTO_DT_FP8_E4M3);
		assert_int_equal(qkv->shape[0], 384);
		assert_int_equal(qkv->nbytes, 384 * 256);
		assert_ptr_equal(sc, qkv + 1); /* right after its tensor */
		assert_true(sc->scales);
		assert_int_equal(sc->dtype, PROTO_DT_FP32);
		assert_int_equal(sc->shape[0], 3);
		assert_int_equal(sc->shape[1], 2);
		down = find_local(&l, r, "model.layers.0.mlp.down_proj.weight");
		dsc = find_local(&l, r, "model.layers.0.mlp.down_proj.weight_scale_inv");
		assert_int_equal(down->shape[1], 384);
		assert_int_equal(dsc->shape[0], 2);
		assert_int_equal(dsc->shape[1], 3);
		assert_int_equal(dsc->pieces[0].box.lo[1], r * 3);
		emb = find_local(&l, r, "model.embed_tokens.weight");
		assert_int_equal(emb->dtype, PROTO_DT_BF16); /* embeddings stay BF16 */
		assert_null(find_local(&l, r, "model.embed_tokens.weight_scale_inv"));
	}
	assert_int_equal(proto_layout_check_complete(&m, &l, &err), 0);
	/* The explicit form names the transform, not the scales, and parses
	 * back to the same layout. */
	json_t *j = proto_layout_to_json(&m, &l);
	assert_non_null(json_object_get(j, "quantize"));
	/* The digest (hashed a rank at a time) is that of the whole form. */
	char *txt = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	uint8_t d[32];
	crypto_generichash(d, sizeof(d), (const uint8_t *)txt, strlen(txt), NULL, 0);
	assert_memory_equal(d, l.digest, 32);
	free(txt);
	assert_int_equal(proto_layout_from_json(&m, j, "again", &again, &err), 0);
	assert_memory_equal(again.digest, l.digest, 32);
	assert_int_equal(again.ranks[1].nlocals, l.ranks[1].nlocals);
	json_decref(j);
	/* Planned from the quantized source; a BF16 layout is not a source. */
	assert_int_equal(proto_layout_builtin(&m, "tp2", &bf, &err), 0);
	assert_int_not_equal(memcmp(bf.digest, l.digest, 32), 0);
	j = proto_layout_to_json(&m, &bf); /* and a BF16 layout's digest, the same way */
	txt = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	crypto_generichash(d, sizeof(d), (const uint8_t *)txt, strlen(txt), NULL, 0);
	assert_memory_equal(d, bf.digest, 32);
	free(txt);
	json_decref(j);
	assert_int_equal(proto_plan_build(&m, &bf, &l, &p, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "different models"));
	assert_int_equal(proto_layout_fp8_source(&m, &l, &src, &err), 0);
	assert_int_equal(src.nranks, 1);
	if (proto_plan_build(&m, &src, &l, &p, &err) != 0)
		fail_msg("%s", err.msg);
	assert_int_equal(p.mapped_bytes, p.retained_bytes); /* every byte, once */
	assert_true(p.retained_bytes > 0);
	proto_plan_fini(&p);
	proto_layout_fini(&src);
	proto_layout_fini(&bf);
	proto_layout_fini(&again);
	proto_layout_fini(&l);
	proto_model_fini(&m);
}

/* Refusals: one line each, naming what to change. */
static void test_layout_refused(void **state)
{
	static const struct {
		const char *json, *want;
	} bad[] = {
		{"{\"ranks\":2,\"transform\":\"fp8_e4m3_block128\",\"tensors\":[{\"match\":\"*\",\"split\":0}]}",
		 "model.layers.0.self_attn.q_proj.weight split [0, 100) on dim 0 (of 200) cuts a 128-block"},
		{"{\"ranks\":1,\"transform\":\"fp8_e5m2\",\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
		 "the only one is"},
		{"{\"ranks\":1,\"transform\":\"fp8_e4m3_block128\",\"quantize\":[\"model.norm.weight\"],"
		 "\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
		 "takes 2-D bf16 tensors"},
		{"{\"ranks\":1,\"transform\":\"fp8_e4m3_block128\",\"quantize\":[\"nope*\"],"
		 "\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
		 "nope* matches none of the model's 2-D bf16 tensors"},
		{"{\"ranks\":2,\"transform\":\"fp8_e4m3_block128\",\"tensors\":[{\"match\":\"*\",\"flat\":true}]}",
		 "is split flat"},
		{"{\"ranks\":1,\"transform\":\"fp8_e4m3_block128\",\"tensors\":["
		 "{\"tensor\":\"model.layers.0.self_attn.q_proj.weight_scale_inv\",\"replicate\":true},"
		 "{\"match\":\"*\",\"replicate\":true}]}",
		 "is not in the model"},
	};
	struct proto_model m;
	struct proto_layout l;
	struct proto_err err;

	(void)state;
	fp8t_model(&m, true);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&err, 0, sizeof(err));
		assert_int_not_equal(proto_layout_parse(&m, bad[i].json, strlen(bad[i].json), "l", &l, &err), 0);
		if (strstr(err.msg, bad[i].want) == NULL || strchr(err.msg, '\n') != NULL)
			fail_msg("case %zu: %s (want \"%s\")", i, err.msg, bad[i].want);
		assert_null(l.model);
		assert_int_equal(l.nranks, 0);
	}
	/* The built-in says the same. */
	assert_int_not_equal(proto_layout_builtin(&m, "tp2:fp8", &l, &err), 0);
	assert_non_null(strstr(err.msg, "cuts a 128-block"));
	/* tp1 cuts nothing, but q (200 rows) is fused before k and v. */
	assert_int_not_equal(proto_layout_builtin(&m, "tp1:fp8", &l, &err), 0);
	assert_non_null(strstr(err.msg, "ends on a partial 128-block (200 on dim 0) and more tensors "
				       "are fused after it"));
	assert_int_not_equal(proto_layout_builtin(&m, "fsdp2:fp8", &l, &err), 0);
	assert_int_not_equal(proto_layout_builtin(&m, "tp2:fp16", &l, &err), 0);
	proto_model_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codes),
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_nonfinite),
		cmocka_unit_test(test_layout),
		cmocka_unit_test(test_layout_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
