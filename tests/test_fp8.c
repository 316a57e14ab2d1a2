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

#include "proto/fixture.h"
#include "proto/fp8.h"
#include "proto/plan.h"
#include "proto/spec.h"
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codes),
		cmocka_unit_test(test_reference),
		cmocka_unit_test(test_nonfinite),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
