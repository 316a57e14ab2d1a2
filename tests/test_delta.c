/*
 * Tests for the delta codec: round trips (every dtype, adversarial bit
 * patterns, 0 / 50 / 100 % changed, empty and one-element tensors, tensors
 * added, dropped or retyped), threads, wrong parents, truncation and bit
 * flips, checksum mismatches, forged streams, the bad-delta corpus, and the
 * CLI end to end. TESSERA_WRITE_SEEDS=1 rewrites the corpus files this test
 * owns (seed-delta-*, bad-delta-forged-*).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include <cmocka.h>

#include "proto/delta.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/testutil.h"

/* ---- building versions in memory -------------------------------------- */

struct tspec {
	const char *name;
	enum proto_dtype dt;
	uint64_t n;
};

static void mkver(struct fz_version *v, const struct tspec *ts, size_t nts)
{
	memset(v, 0, sizeof(*v));
	proto_model_init(&v->m);
	for (size_t i = 0; i < nts; i++)
		assert_int_equal(proto_model_add(&v->m, ts[i].name, ts[i].dt, 1, &ts[i].n, NULL), 0);
	assert_int_equal(proto_model_finish(&v->m, NULL), 0);
	assert_int_equal(proto_st_header_build(&v->m, NULL, &v->header, &v->header_len, NULL), 0);
	v->data = calloc(v->m.ntensors + 1, sizeof(*v->data));
	v->sums = calloc(v->m.ntensors + 1, sizeof(*v->sums));
	assert_non_null(v->data);
	for (uint32_t i = 0; i < v->m.ntensors; i++) {
		v->data[i] = calloc(1, v->m.tensors[i].nbytes + 1);
		assert_non_null(v->data[i]);
	}
}

static void resum(struct fz_version *v)
{
	for (uint32_t i = 0; i < v->m.ntensors; i++)
		v->sums[i] = proto_wsum(proto_dtype_size(v->m.tensors[i].dtype), v->data[i],
					v->m.tensors[i].nelem);
}

/* Copies the model and data of a version (same tensors). */
static void clone(struct fz_version *dst, const struct fz_version *src)
{
	struct tspec ts[64];
	assert_true(src->m.ntensors <= 64);
	for (uint32_t i = 0; i < src->m.ntensors; i++)
		ts[i] = (struct tspec){src->m.tensors[i].name, src->m.tensors[i].dtype,
				       src->m.tensors[i].nelem};
	mkver(dst, ts, src->m.ntensors);
	for (uint32_t i = 0; i < src->m.ntensors; i++)
		memcpy(dst->data[i], src->data[i], src->m.tensors[i].nbytes);
	resum(dst);
}

static void fill_random(struct fz_version *v, uint64_t seed)
{
	for (uint32_t i = 0; i < v->m.ntensors; i++)
		for (uint64_t b = 0; b < v->m.tensors[i].nbytes; b++)
			v->data[i][b] = (uint8_t)fz_rand(&seed);
	resum(v);
}

/* Encodes p -> c, applies to a copy of p and checks the result is c. Returns
 * the parsed chunk modes seen (bit per mode) and vcodes (bit 4 + vcode). */
static unsigned roundtrip(const struct fz_version *p, const struct fz_version *c,
			  uint32_t chunk, unsigned threads, struct proto_delta_stats *st)
{
	struct proto_delta_version vp = {&p->m, p->header, p->header_len,
					 (const uint8_t *const *)p->data, NULL};
	struct proto_delta_version vc = {&c->m, c->header, c->header_len,
					 (const uint8_t *const *)c->data, NULL};
	struct proto_delta_opts o = {.chunk_elems = chunk, .threads = threads};
	struct proto_delta_stats st0;
	struct proto_err err = {{0}};
	struct proto_delta d;
	uint8_t *buf = NULL, **bufs;
	size_t len;
	unsigned seen = 0;

	if (proto_delta_encode(&vp, &vc, &o, &buf, &len, st ? st : &st0, &err) != 0)
		fail_msg("encode: %s", err.msg);
	if (proto_delta_parse(buf, len, &d, &err) != 0)
		fail_msg("parse: %s", err.msg);
	assert_int_equal(d.ntensors, c->m.ntensors);
	bufs = calloc(d.ntensors + 1, sizeof(*bufs));
	for (uint32_t i = 0; i < d.ntensors; i++) {
		bufs[i] = calloc(1, c->m.tensors[i].nbytes + 1);
		if (d.tensors[i].parent != PROTO_DELTA_NONE)
			memcpy(bufs[i], p->data[d.tensors[i].parent], c->m.tensors[i].nbytes);
	}
	{
		struct proto_delta_parent par = {p->header, p->header_len, p->m.ntensors, p->sums};
		if (proto_delta_apply(&d, &par, bufs, threads, &err) != 0)
			fail_msg("apply: %s", err.msg);
	}
	for (uint32_t i = 0; i < d.ntensors; i++) {
		assert_memory_equal(bufs[i], c->data[i], c->m.tensors[i].nbytes);
		free(bufs[i]);
	}
	for (uint32_t i = 0; i < d.nchunks; i++)
		seen |= 1u << d.chunks[i].mode | (d.chunks[i].mode ? 1u << (4 + d.chunks[i].vcode) : 0);
	free(bufs);
	proto_delta_fini(&d);
	free(buf);
	return seen;
}

/* ---- round trips --------------------------------------------------------- */

static void test_every_dtype(void **state)
{
	static const uint64_t lens[] = {0, 1, 7, 1000, 20000};
	(void)state;
	for (int dt = 0; dt < PROTO_DT_COUNT; dt++) {
		for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
			struct tspec ts = {"x", (enum proto_dtype)dt, lens[l]};
			struct fz_version p, c;
			uint64_t seed = (uint64_t)dt * 100 + l;
			size_t w = proto_dtype_size((enum proto_dtype)dt);
			mkver(&p, &ts, 1);
			fill_random(&p, seed);
			clone(&c, &p);
			/* ~10 % random new patterns, ~5 % off by one. */
			for (uint64_t e = 0; e < lens[l]; e++) {
				uint64_t r = fz_rand(&seed) % 100;
				if (r < 10)
					for (size_t b = 0; b < w; b++)
						c.data[0][e * w + b] = (uint8_t)fz_rand(&seed);
				else if (r < 15)
					c.data[0][e * w] = (uint8_t)(c.data[0][e * w] + 1);
			}
			resum(&c);
			roundtrip(&p, &c, 4096, 1, NULL);
			fz_free(&p);
			fz_free(&c);
		}
	}
}

/* Every pair of special values, both ways, for each float width. */
static void test_adversarial_patterns(void **state)
{
	static const uint16_t b16[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff,
				       0x0001, 0x8001, 0x007f, 0x3f80, 0xbf80, 0x7f7f, 0xff7f};
	static const uint16_t f16[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff,
				       0x0001, 0x8001, 0x03ff, 0x3c00, 0xbc00, 0x7bff};
	static const uint32_t f32[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
				       0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x00000001u,
				       0x80000001u, 0x007fffffu, 0x3f800000u, 0x7f7fffffu,
				       PROTO_WSUM_P, PROTO_WSUM_P + 4};
	static const uint64_t f64[] = {0, 0x8000000000000000ull, 0x7ff0000000000000ull,
				       0xfff0000000000000ull, 0x7ff8000000000001ull,
				       0xffffffffffffffffull, 1, 0x000fffffffffffffull,
				       0x3ff0000000000000ull};
	static const uint8_t f8[] = {0x00, 0x80, 0x7f, 0xff, 0x78, 0xf8, 0x01, 0x81, 0x7e};
	struct {
		enum proto_dtype dt;
		const void *vals;
		size_t n;
	} sets[] = {
		{PROTO_DT_BF16, b16, sizeof(b16) / 2}, {PROTO_DT_FP16, f16, sizeof(f16) / 2},
		{PROTO_DT_FP32, f32, sizeof(f32) / 4}, {PROTO_DT_FP64, f64, sizeof(f64) / 8},
		{PROTO_DT_FP8_E4M3, f8, sizeof(f8)},   {PROTO_DT_I8, f8, sizeof(f8)},
	};
	(void)state;
	for (size_t s = 0; s < sizeof(sets) / sizeof(sets[0]); s++) {
		size_t w = proto_dtype_size(sets[s].dt), n = sets[s].n;
		struct tspec ts = {"special", sets[s].dt, n * n};
		struct fz_version p, c;
		mkver(&p, &ts, 1);
		mkver(&c, &ts, 1);
		for (size_t i = 0; i < n; i++)
			for (size_t j = 0; j < n; j++) {
				memcpy(p.data[0] + (i * n + j) * w, (const uint8_t *)sets[s].vals + i * w, w);
				memcpy(c.data[0] + (i * n + j) * w, (const uint8_t *)sets[s].vals + j * w, w);
			}
		resum(&p);
		resum(&c);
		roundtrip(&p, &c, 0, 1, NULL);
		roundtrip(&c, &p, 0, 1, NULL);
		fz_free(&p);
		fz_free(&c);
	}
}

/* 0 %, ~1 %, 50 % and 100 % changed; modes and value codings all used. */
static void test_densities(void **state)
{
	struct tspec ts = {"w", PROTO_DT_BF16, 50000};
	struct proto_delta_stats st;
	unsigned seen = 0;

	(void)state;
	for (int pct = 0; pct <= 100; pct += 1) {
		if (pct != 0 && pct != 1 && pct != 3 && pct != 20 && pct != 50 && pct != 100)
			continue;
		for (int big = 0; big < 2; big++) {
			struct fz_version p, c;
			uint64_t seed = (uint64_t)pct * 7 + (uint64_t)big;
			mkver(&p, &ts, 1);
			fill_random(&p, seed);
			clone(&c, &p);
			uint64_t k = 0;
			for (uint64_t e = 0; e < ts.n; e++) {
				if ((int)(fz_rand(&seed) % 100) >= pct)
					continue;
				uint16_t x;
				memcpy(&x, c.data[0] + 2 * e, 2);
				/* small steps (NIB) or arbitrary patterns (PLANES) */
				x = big ? (uint16_t)(x ^ (1 + fz_rand(&seed) % 65535))
					: (uint16_t)(x + ((fz_rand(&seed) & 1) ? 1 : 65535));
				memcpy(c.data[0] + 2 * e, &x, 2);
				k++;
			}
			resum(&c);
			seen |= roundtrip(&p, &c, 8192, 2, &st);
			assert_int_equal(st.nchanged, k);
			if (pct == 0)
				assert_int_equal(st.chunks[PROTO_DELTA_ZERO], 7);
			fz_free(&p);
			fz_free(&c);
		}
	}
	/* SPARSE, BITMAP, DENSE; PLANES and NIB. */
	assert_int_equal(seen & 0x3f, 0x3f);
}

/* Gap escapes: gaps of 254, 255, 256 and > 2^16; one element; the last one. */
static void test_gaps(void **state)
{
	struct tspec ts[] = {{"long", PROTO_DT_U16, 1u << 20}, {"one", PROTO_DT_FP32, 1}};
	static const uint64_t at[] = {254, 509, 765, 766, 100000, 700000, (1u << 20) - 1};
	struct fz_version p, c;

	(void)state;
	mkver(&p, ts, 2);
	fill_random(&p, 5);
	clone(&c, &p);
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++)
		c.data[0][at[i] * 2] ^= 1;
	c.data[1][3] ^= 0x80;
	resum(&c);
	roundtrip(&p, &c, 0, 1, NULL);
	roundtrip(&p, &c, 1u << 16, 3, NULL);
	fz_free(&p);
	fz_free(&c);
}

static void test_threads(void **state)
{
	struct tspec ts[] = {{"a", PROTO_DT_BF16, 100000}, {"b", PROTO_DT_FP32, 30000},
			     {"c", PROTO_DT_U8, 5000}};
	struct fz_version p, c;
	uint64_t seed = 9;

	(void)state;
	mkver(&p, ts, 3);
	fill_random(&p, 11);
	clone(&c, &p);
	for (uint32_t t = 0; t < 3; t++)
		for (uint64_t b = 0; b < c.m.tensors[t].nbytes; b++)
			if (fz_rand(&seed) % 50 == 0)
				c.data[t][b]++;
	resum(&c);
	for (unsigned th = 1; th <= 8; th++)
		roundtrip(&p, &c, 4096, th, NULL);
	fz_free(&p);
	fz_free(&c);
}

/* Encodes p -> c on th threads; the delta's bytes. */
static uint8_t *encode_on(const struct fz_version *p, const struct fz_version *c, uint32_t chunk,
			  unsigned th, size_t *len)
{
	struct proto_delta_version vp = {&p->m, p->header, p->header_len,
					 (const uint8_t *const *)p->data, NULL};
	struct proto_delta_version vc = {&c->m, c->header, c->header_len,
					 (const uint8_t *const *)c->data, NULL};
	struct proto_delta_opts o = {.chunk_elems = chunk, .threads = th};
	struct proto_err err = {{0}};
	uint8_t *buf = NULL;

	if (proto_delta_encode(&vp, &vc, &o, &buf, len, NULL, &err) != 0)
		fail_msg("encode on %u threads: %s", th, err.msg);
	return buf;
}

/*
 * Encoding on 1..8 threads gives the same bytes, and they decode bit-exact:
 * odd tensor sizes (no whole 64-byte block at the end), changes on both
 * sides of every chunk boundary (where one thread's range ends and the
 * next one's starts), a change at every byte of a 64-byte block and of each
 * element width (the block scan's masks), one in the last element.
 */
static void test_threads_ranges(void **state)
{
	struct tspec ts[] = {{"bf", PROTO_DT_BF16, 3 * 1000 + 7}, {"f32", PROTO_DT_FP32, 2 * 1000 + 3},
			     {"u8", PROTO_DT_U8, 5 * 1000 + 1},   {"f64", PROTO_DT_FP64, 1000 + 13},
			     {"one", PROTO_DT_BF16, 1}};
	const uint32_t chunk = 1000;
	struct fz_version p, c;
	size_t len1, len;

	(void)state;
	mkver(&p, ts, 5);
	fill_random(&p, 21);
	clone(&c, &p);
	for (uint32_t t = 0; t < 4; t++) {
		size_t w = proto_dtype_size(ts[t].dt), nb = c.m.tensors[t].nbytes;
		for (uint64_t b = chunk; b < ts[t].n; b += chunk) /* chunk boundaries */
			for (uint64_t e = b - 1; e <= b + 1 && e < ts[t].n; e++)
				c.data[t][e * w + (e % w)] ^= 0x10;
		for (size_t q = 0; q < 64; q++) /* every byte of the second block */
			c.data[t][64 + q] ^= (uint8_t)(1u << (q % 8));
		for (size_t q = 0; q < w; q++) /* only the top byte of one element */
			c.data[t][256 + q] ^= q + 1 == w ? 0x80 : 0;
		c.data[t][nb - 1] ^= 0x01; /* the last element's last byte */
	}
	c.data[4][1] ^= 0x40;
	resum(&c);
	uint8_t *one = encode_on(&p, &c, chunk, 1, &len1);
	for (unsigned th = 1; th <= 8; th++) {
		uint8_t *d = encode_on(&p, &c, chunk, th, &len);
		assert_int_equal(len, len1);
		assert_memory_equal(d, one, len1);
		free(d);
		roundtrip(&p, &c, chunk, th, NULL);
	}
	free(one);
	fz_free(&p);
	fz_free(&c);
}

/* Tensors added, dropped, retyped, reshaped; a different header. */
static void test_tensor_set_changes(void **state)
{
	struct tspec pt[] = {{"keep", PROTO_DT_BF16, 1000}, {"drop", PROTO_DT_FP32, 10},
			     {"retype", PROTO_DT_FP16, 100}, {"grow", PROTO_DT_U8, 10}};
	struct tspec ct[] = {{"new", PROTO_DT_I32, 33}, {"keep", PROTO_DT_BF16, 1000},
			     {"retype", PROTO_DT_BF16, 100}, {"grow", PROTO_DT_U8, 11},
			     {"empty", PROTO_DT_FP64, 0}};
	struct fz_version p, c;

	(void)state;
	mkver(&p, pt, 4);
	mkver(&c, ct, 5);
	fill_random(&p, 1);
	fill_random(&c, 2);
	memcpy(c.data[1], p.data[0], 2000);
	c.data[1][10]++;
	resum(&c);
	roundtrip(&p, &c, 0, 2, NULL);
	fz_free(&p);
	fz_free(&c);
}

/*
 * Given the parent's sums, the encoder takes the child's from them and the
 * changes alone (the child is not summed): the delta's bytes are the same as
 * when it sums both sides itself, and the child sums it hands back are the
 * child's, for every element width, no change, a few, half and every
 * element changed (dense chunks), stretches and chunks of odd sizes, and a
 * tensor with no parent.
 */
static void test_child_sums_from_changes(void **state)
{
	struct tspec pt[] = {{"u8", PROTO_DT_U8, 70001}, {"bf", PROTO_DT_BF16, 100003},
			     {"f32", PROTO_DT_FP32, 40000}, {"f64", PROTO_DT_FP64, 33000},
			     {"one", PROTO_DT_BF16, 1}};
	struct tspec ct[] = {{"u8", PROTO_DT_U8, 70001}, {"bf", PROTO_DT_BF16, 100003},
			     {"new", PROTO_DT_I32, 5000}, {"f32", PROTO_DT_FP32, 40000},
			     {"f64", PROTO_DT_FP64, 33000}, {"one", PROTO_DT_BF16, 1}};
	const int pcts[] = {0, 1, 50, 100};

	(void)state;
	for (size_t pi = 0; pi < sizeof(pcts) / sizeof(pcts[0]); pi++) {
		struct fz_version p, c;
		uint64_t seed = 11 + pi;
		mkver(&p, pt, 5);
		mkver(&c, ct, 6);
		fill_random(&p, seed);
		fill_random(&c, seed + 100);
		for (uint32_t i = 0; i < c.m.ntensors; i++) {
			int64_t q = proto_model_find(&p.m, c.m.tensors[i].name);
			size_t w = proto_dtype_size(c.m.tensors[i].dtype);
			if (q < 0)
				continue;
			memcpy(c.data[i], p.data[q], c.m.tensors[i].nbytes);
			for (uint64_t e = 0; e < c.m.tensors[i].nelem; e++)
				if ((int)(fz_rand(&seed) % 100) < pcts[pi])
					c.data[i][e * w + fz_rand(&seed) % w] ^=
						(uint8_t)(1 + fz_rand(&seed) % 255);
		}
		resum(&c);
		uint64_t *got = calloc(c.m.ntensors, sizeof(*got));
		uint8_t *a = NULL, *b = NULL;
		size_t alen = 0, blen = 0;
		struct proto_err err = {{0}};
		struct proto_delta_version vc = {&c.m, c.header, c.header_len,
						 (const uint8_t *const *)c.data, NULL};
		struct proto_delta_version v0 = {&p.m, p.header, p.header_len,
						 (const uint8_t *const *)p.data, NULL};
		struct proto_delta_version v1 = v0;
		v1.sums = p.sums;
		struct proto_delta_opts o = {.chunk_elems = 70000, .threads = 2};
		assert_non_null(got);
		assert_int_equal(proto_delta_encode(&v0, &vc, &o, &a, &alen, NULL, &err), 0);
		o.child_sums = got;
		assert_int_equal(proto_delta_encode(&v1, &vc, &o, &b, &blen, NULL, &err), 0);
		assert_int_equal(alen, blen);
		assert_memory_equal(a, b, alen);
		assert_memory_equal(got, c.sums, c.m.ntensors * sizeof(*got));
		free(a);
		free(b);
		free(got);
		fz_free(&p);
		fz_free(&c);
	}
}

/* ---- binding and damage ------------------------------------------------- */

static void test_wrong_parent(void **state)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	struct proto_err err = {{0}};
	struct fz_version q;
	struct proto_delta d;
	uint8_t *buf, **bufs;
	size_t len;

	(void)state;
	assert_int_equal(fz_encode(p, c, 0, &buf, &len), 0);
	assert_int_equal(proto_delta_parse(buf, len, &d, &err), 0);
	/* Another parent: same tensors, one byte different. */
	clone(&q, p);
	q.data[0][17] ^= 4;
	resum(&q);
	bufs = calloc(d.ntensors, sizeof(*bufs));
	for (uint32_t i = 0; i < d.ntensors; i++) {
		bufs[i] = calloc(1, c->m.tensors[i].nbytes + 1);
		if (d.tensors[i].parent != PROTO_DELTA_NONE)
			memcpy(bufs[i], q.data[d.tensors[i].parent], c->m.tensors[i].nbytes);
	}
	{
		struct proto_delta_parent par = {q.header, q.header_len, q.m.ntensors, q.sums};
		assert_int_equal(proto_delta_apply(&d, &par, bufs, 2, &err), -EINVAL);
		assert_non_null(strstr(err.msg, "another parent"));
		/* Nothing was written. */
		for (uint32_t i = 0; i < d.ntensors; i++)
			if (d.tensors[i].parent != PROTO_DELTA_NONE)
				assert_memory_equal(bufs[i], q.data[d.tensors[i].parent],
						    c->m.tensors[i].nbytes);
		/* The wrong tensor count is refused too. */
		par.ntensors--;
		assert_int_equal(proto_delta_apply(&d, &par, bufs, 1, &err), -EINVAL);
	}
	for (uint32_t i = 0; i < d.ntensors; i++)
		free(bufs[i]);
	free(bufs);
	proto_delta_fini(&d);
	fz_free(&q);
	free(buf);
}

static void test_truncation(void **state)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	uint8_t *buf;
	size_t len;
	bool ok;

	(void)state;
	assert_int_equal(fz_encode(p, c, 0, &buf, &len), 0);
	assert_int_equal(fz_delta_one(buf, len, false, &ok, NULL), 0);
	assert_true(ok);
	for (size_t l = 0; l < len; l++) {
		assert_true(fz_delta_one(buf, l, false, NULL, NULL) < 0);
		assert_true(fz_delta_one(buf, l, true, NULL, NULL) < 0);
	}
	free(buf);
}

/* Every flipped bit (of three per byte) is refused or harmless. */
static void test_bit_flips(void **state)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	uint8_t *buf;
	size_t len, refused = 0, harmless = 0;

	(void)state;
	assert_int_equal(fz_encode(p, c, 512, &buf, &len), 0);
	for (size_t i = 0; i < len; i++)
		for (int b = 0; b < 8; b += 3) {
			for (int fix = 0; fix < 2; fix++) {
				bool ok = false;
				buf[i] ^= (uint8_t)(1u << b);
				int rc = fz_delta_one(buf, len, fix, &ok, NULL);
				buf[i] ^= (uint8_t)(1u << b);
				if (rc == 0 && !ok)
					fail_msg("flip of bit %d at byte %zu (fixup %d) applied a wrong child",
						 b, i, fix);
				refused += rc != 0;
				harmless += rc == 0;
			}
		}
	print_message("bit flips on a %zu-byte delta: %zu refused, %zu harmless\n", len, refused,
		      harmless);
	assert_true(refused > harmless);
	free(buf);
}

/* ---- forged deltas -------------------------------------------------------- */

struct fb {
	uint8_t *p;
	size_t len;
};

static void put(struct fb *b, const void *src, size_t n)
{
	if (n == 0 && b->p != NULL)
		return;
	b->p = realloc(b->p, b->len + n + 1);
	assert_non_null(b->p);
	if (n > 0)
		memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void put64(struct fb *b, uint64_t v)
{
	v = htole64(v);
	put(b, &v, 8);
}

static void put32(struct fb *b, uint32_t v)
{
	v = htole32(v);
	put(b, &v, 4);
}

static void putv(struct fb *b, uint64_t v)
{
	uint8_t tmp[10];
	size_t n = 0;
	do {
		uint8_t x = v & 0x7f;
		v >>= 7;
		tmp[n++] = x | (v ? 0x80 : 0);
	} while (v);
	put(b, tmp, n);
}

/* A zstd frame of raw (content size and checksum on). */
static void zframe(struct fb *out, const uint8_t *raw, size_t n)
{
	size_t cap = ZSTD_compressBound(n), r;
	uint8_t *tmp = malloc(cap);
	ZSTD_CCtx *cx = ZSTD_createCCtx();
	ZSTD_CCtx_setParameter(cx, ZSTD_c_checksumFlag, 1);
	r = ZSTD_compress2(cx, tmp, cap, raw, n);
	assert_false(ZSTD_isError(r));
	put(out, tmp, r);
	ZSTD_freeCCtx(cx);
	free(tmp);
}

/*
 * A delta for the fixed parent whose child is the parent itself except for
 * tensor 0 (w.bf16, 1500 elements, one chunk): its chunk record is rec, its
 * streams body, its child checksum sum0. Every other chunk is ZERO. The
 * header hash and both digests are correct, so apply reaches the streams.
 */
static void forge(const struct fb *rec, const struct fb *body, uint64_t sum0, uint8_t **out,
		  size_t *len)
{
	const struct fz_version *p = fz_fixed(false);
	uint64_t sums[16];
	struct fb h = {0};
	uint8_t zero32[32] = {0};

	put(&h, PROTO_DELTA_MAGIC, 8);
	put(&h, zero32, 32); /* header hash, below */
	put64(&h, 0);        /* header length, below */
	put32(&h, 1);
	put32(&h, 0);
	put(&h, zero32, 32); /* parent digest */
	put(&h, zero32, 32); /* child digest */
	put32(&h, p->m.ntensors);
	put32(&h, p->m.ntensors);
	put32(&h, 4096);
	put32(&h, 0);
	put64(&h, p->header_len);
	put(&h, p->header, p->header_len);
	for (uint32_t i = 0; i < p->m.ntensors; i++) {
		uint8_t r[8] = {(uint8_t)proto_dtype_size(p->m.tensors[i].dtype)};
		put(&h, r, 4);
		put32(&h, i);
		put64(&h, p->m.tensors[i].nelem);
		put64(&h, p->sums[i]);
		sums[i] = i == 0 ? sum0 : p->sums[i];
		put64(&h, sums[i]);
	}
	put(&h, rec->p, rec->len);
	for (uint32_t i = 1; i < p->m.ntensors; i++)
		if (p->m.tensors[i].nelem > 0)
			put(&h, zero32, 1); /* ZERO chunk */
	{
		uint64_t hl = htole64(h.len - 40);
		memcpy(h.p + 40, &hl, 8);
	}
	proto_delta_digest(p->header, p->header_len, p->sums, p->m.ntensors, h.p + 56);
	proto_delta_digest(p->header, p->header_len, sums, p->m.ntensors, h.p + 88);
	put(&h, body->p, body->len);
	fz_rehash(h.p, h.len);
	*out = h.p;
	*len = h.len;
}

/* SPARSE/PLANES chunk for w.bf16 with the given raw gaps, wide and planes. */
static void forge_sparse(const uint8_t *gaps, size_t ng, const uint8_t *wide, size_t nw,
			 const uint8_t *lo, const uint8_t *hi, size_t nv, uint64_t sum0,
			 uint8_t **out, size_t *len)
{
	struct fb rec = {0}, body = {0}, f = {0};
	uint8_t mode = PROTO_DELTA_SPARSE;

	put(&rec, &mode, 1);
	putv(&rec, ng);
	putv(&rec, nw);
	const uint8_t *raw[4] = {gaps, wide, lo, hi};
	size_t n[4] = {ng, nw, nv, nv};
	for (int s = 0; s < 4; s++) {
		f.len = 0;
		if (n[s] > 0)
			zframe(&f, raw[s], n[s]);
		putv(&rec, f.len);
		put(&body, f.p ? f.p : (uint8_t *)"", f.len);
	}
	forge(&rec, &body, sum0, out, len);
	free(rec.p);
	free(body.p);
	free(f.p);
}

static void expect_refused(const uint8_t *buf, size_t len, const char *why)
{
	struct proto_err err = {{0}};
	int rc = fz_delta_one(buf, len, false, NULL, &err);
	if (rc == 0)
		fail_msg("forged delta (%s) applied", why);
	if (strstr(err.msg, why) == NULL)
		fail_msg("forged delta: expected \"%s\", got \"%s\"", why, err.msg);
}

static void test_forged_streams(void **state)
{
	const struct fz_version *p = fz_fixed(false);
	uint8_t gaps[4] = {10, 20, 30, 40}, lo[6] = {1, 2, 1, 2, 1, 2}, hi[6] = {0};
	uint8_t big[6] = {254, 254, 254, 254, 254, 254}; /* the 6th lands at 1529 */
	uint8_t wide[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	uint8_t *d;
	size_t len;
	uint64_t sum;

	(void)state;
	/* The honest version applies: compute its child checksum. */
	{
		uint16_t x[1500];
		uint64_t pos = 0;
		memcpy(x, p->data[0], sizeof(x));
		for (int j = 0; j < 4; j++) {
			pos += gaps[j];
			/* c = zigzag - 1: c 1 -> zigzag 2 -> +1, c 2 -> zigzag 3 -> -2 */
			uint16_t z = (uint16_t)(lo[j] + 1);
			x[pos] = (uint16_t)(x[pos] + (uint16_t)((z >> 1) ^ (0u - (z & 1))));
			pos++;
		}
		sum = proto_wsum(2, x, 1500);
	}
	forge_sparse(gaps, 4, NULL, 0, lo, hi, 4, sum, &d, &len);
	{
		bool ok;
		struct proto_err err = {{0}};
		if (fz_delta_one(d, len, false, &ok, &err) != 0)
			fail_msg("honest forged delta refused: %s", err.msg);
	}
	free(d);
	/* The same with a wrong child checksum. */
	forge_sparse(gaps, 4, NULL, 0, lo, hi, 4, sum ^ 1, &d, &len);
	expect_refused(d, len, "checksum after apply");
	free(d);
	/* Gaps running past the 1500 elements. */
	forge_sparse(big, 6, NULL, 0, lo, hi, 6, sum, &d, &len);
	expect_refused(d, len, "past the end of the chunk");
	free(d);
	/* An escaped gap whose varint is too long. */
	{
		uint8_t g[2] = {255, 255};
		forge_sparse(g, 2, wide, 6, lo, hi, 2, sum, &d, &len);
		expect_refused(d, len, "varint");
		free(d);
	}
	/* A value that cannot be a change (zigzag 0 after the bias). */
	{
		uint8_t ff[4] = {0xff, 0xff, 0xff, 0xff};
		forge_sparse(gaps, 4, NULL, 0, ff, ff, 4, sum, &d, &len);
		expect_refused(d, len, "out of range");
		free(d);
	}
	/* A frame that declares more output than the chunk says. */
	{
		struct fb rec = {0}, body = {0};
		uint8_t mode = PROTO_DELTA_SPARSE, g5[5] = {1, 1, 1, 1, 1};
		size_t at;
		put(&rec, &mode, 1);
		putv(&rec, 4);
		putv(&rec, 0);
		zframe(&body, g5, 5);
		putv(&rec, body.len);
		putv(&rec, 0);
		at = body.len;
		zframe(&body, lo, 4);
		putv(&rec, body.len - at);
		putv(&rec, 0);
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, "frame declares 5 bytes");
		free(d);
		free(rec.p);
		free(body.p);
	}
	/* A frame followed by a stray byte inside its length. */
	{
		struct fb rec = {0}, body = {0};
		uint8_t mode = PROTO_DELTA_SPARSE, z = 0;
		size_t at;
		put(&rec, &mode, 1);
		putv(&rec, 4);
		putv(&rec, 0);
		zframe(&body, gaps, 4);
		put(&body, &z, 1);
		putv(&rec, body.len);
		putv(&rec, 0);
		at = body.len;
		zframe(&body, lo, 4);
		putv(&rec, body.len - at);
		putv(&rec, 0);
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, "does not fill");
		free(d);
		free(rec.p);
		free(body.p);
	}
	/* NIB: escapes counted wrong; a non-zero padding nibble. */
	for (int which = 0; which < 2; which++) {
		struct fb rec = {0}, body = {0};
		uint8_t mode = PROTO_DELTA_SPARSE | PROTO_DELTA_NIB << 4;
		uint8_t nib[2] = {0x01, (uint8_t)(which ? 0x10 : 0x00)};
		size_t at;
		put(&rec, &mode, 1);
		putv(&rec, 3);
		putv(&rec, 0);
		putv(&rec, which ? 0 : 1); /* nesc */
		zframe(&body, gaps, 3);
		putv(&rec, body.len);
		putv(&rec, 0);
		at = body.len;
		zframe(&body, nib, 2);
		putv(&rec, body.len - at);
		if (which == 0) {
			uint8_t e[1] = {0};
			at = body.len;
			zframe(&body, e, 1);
			putv(&rec, body.len - at);
			at = body.len;
			zframe(&body, e, 1);
			putv(&rec, body.len - at);
		} else {
			putv(&rec, 0);
			putv(&rec, 0);
		}
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, which ? "padding" : "escapes");
		free(d);
		free(rec.p);
		free(body.p);
	}
	/* BITMAP with more set bits than changes, and with a bit past the end. */
	for (int which = 0; which < 2; which++) {
		struct fb rec = {0}, body = {0};
		uint8_t mode = PROTO_DELTA_BITMAP, bm[188] = {0}, one[2] = {1, 1};
		size_t at;
		bm[0] = 0x03;
		if (which)
			bm[187] = 0x80; /* element 1503 of 1500 */
		put(&rec, &mode, 1);
		putv(&rec, which ? 3 : 1);
		zframe(&body, bm, sizeof(bm));
		putv(&rec, body.len);
		at = body.len;
		zframe(&body, one, which ? 2 : 1);
		if (which) { /* three values */
			body.len = at;
			uint8_t three[3] = {1, 1, 1};
			zframe(&body, three, 3);
		}
		putv(&rec, body.len - at);
		putv(&rec, 0);
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, which ? "past the end" : "more bits than changes");
		free(d);
		free(rec.p);
		free(body.p);
	}
	/* An unknown coding byte; a stream length past the end. */
	{
		struct fb rec = {0}, body = {0};
		uint8_t mode = 0x27;
		put(&rec, &mode, 1);
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, "unknown coding");
		free(d);
		rec.len = 0;
		mode = PROTO_DELTA_DENSE;
		put(&rec, &mode, 1);
		putv(&rec, 1000000);
		putv(&rec, 0);
		forge(&rec, &body, sum, &d, &len);
		expect_refused(d, len, "past the end of the delta");
		free(d);
		free(rec.p);
	}
}

/* Lost and misplaced changes: a delta whose streams omit or move a change
 * but which claims the real child's checksums is refused after apply. */
static void test_checksum_catches(void **state)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	(void)state;
	for (int kind = 0; kind < 2; kind++) {
		struct fz_version wrong;
		uint8_t *buf;
		size_t len;
		struct proto_delta d;
		struct proto_err err = {{0}};
		clone(&wrong, c);
		/* Find a changed BF16 element of tensor 0. */
		uint64_t e = 0;
		while (memcmp(wrong.data[0] + 2 * e, p->data[0] + 2 * e, 2) == 0)
			e++;
		if (kind == 1) /* move it one element on */
			memcpy(wrong.data[0] + 2 * (e + 1), wrong.data[0] + 2 * e, 2);
		memcpy(wrong.data[0] + 2 * e, p->data[0] + 2 * e, 2);
		resum(&wrong);
		assert_int_equal(fz_encode(p, &wrong, 0, &buf, &len), 0);
		assert_int_equal(proto_delta_parse(buf, len, &d, NULL), 0);
		/* Claim the real child: its checksums and digest, re-hashed. */
		{
			size_t rec0 = 136 + 8 + d.child_header_len;
			for (uint32_t i = 0; i < d.ntensors; i++) {
				uint64_t s = htole64(c->sums[i]);
				memcpy(buf + rec0 + (size_t)i * 40 + 24, &s, 8);
			}
			proto_delta_digest(d.child_header, d.child_header_len, c->sums, c->m.ntensors,
					   buf + 88);
			fz_rehash(buf, len);
		}
		proto_delta_fini(&d);
		assert_true(fz_delta_one(buf, len, false, NULL, &err) < 0);
		assert_non_null(strstr(err.msg, "checksum after apply"));
		free(buf);
		fz_free(&wrong);
	}
}

/* Apply workers are kept between applies (proto_delta_apply_warm makes
 * them ahead): applies after a warm-up, after an apply that failed and was
 * undone, and on more threads than were warmed all end bit-exact, and the
 * failed one leaves its buffers as they were. */
static void test_warm_workers(void **state)
{
	struct tspec ts[] = {{"a", PROTO_DT_BF16, 70000}, {"b", PROTO_DT_FP32, 9000}};
	struct fz_version p, c;
	uint64_t seed = 5;
	size_t len;

	(void)state;
	assert_int_equal(proto_delta_apply_warm(2), 0);
	assert_int_equal(proto_delta_apply_warm(0), 0);
	mkver(&p, ts, 2);
	fill_random(&p, 21);
	clone(&c, &p);
	for (uint32_t t = 0; t < 2; t++)
		for (uint64_t b = 0; b < c.m.tensors[t].nbytes; b++)
			if (fz_rand(&seed) % 40 == 0)
				c.data[t][b] ^= 0x11;
	resum(&c);
	uint8_t *buf = encode_on(&p, &c, 4096, 2, &len);
	struct proto_delta d;
	struct proto_err err = {{0}};
	assert_int_equal(proto_delta_parse(buf, len, &d, &err), 0);
	/* The first changed byte of tensor 0: damaged there, the parent is refused. */
	uint64_t at = 0;
	while (p.data[0][at] == c.data[0][at])
		at++;
	for (int round = 0; round < 3; round++) {
		unsigned th = round == 2 ? 5 : 2;
		uint8_t *bufs[2];
		for (uint32_t i = 0; i < 2; i++) {
			bufs[i] = malloc(p.m.tensors[i].nbytes);
			assert_non_null(bufs[i]);
			memcpy(bufs[i], p.data[i], p.m.tensors[i].nbytes);
		}
		struct proto_delta_parent par = {p.header, p.header_len, p.m.ntensors, p.sums};
		bufs[0][at] ^= 0x80;
		assert_true(proto_delta_apply(&d, &par, bufs, th, &err) < 0);
		assert_int_equal(memcmp(bufs[1], p.data[1], p.m.tensors[1].nbytes), 0);
		bufs[0][at] ^= 0x80;
		assert_int_equal(memcmp(bufs[0], p.data[0], p.m.tensors[0].nbytes), 0);
		if (proto_delta_apply(&d, &par, bufs, th, &err) != 0)
			fail_msg("apply on kept workers: %s", err.msg);
		for (uint32_t i = 0; i < 2; i++) {
			assert_memory_equal(bufs[i], c.data[i], c.m.tensors[i].nbytes);
			free(bufs[i]);
		}
	}
	proto_delta_fini(&d);
	free(buf);
	fz_free(&p);
	fz_free(&c);
}

/* The touched checksums: the encoder writes them (flag set), and apply
 * requires the parent's elements it reads at the changed positions to sum
 * to them. A parent damaged at a changed position passes the movement check
 * (the child is the damaged bits plus the difference) and is refused by
 * this one, with the buffers restored; one damaged where the delta does not
 * write is beyond any check that reads changed positions only (it applies:
 * the node's scrub covers those bytes). Forged fields are refused. */
static void test_touched(void **state)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	uint8_t *buf;
	size_t len;
	struct proto_delta d;
	struct proto_err err = {{0}};

	(void)state;
	assert_int_equal(fz_encode(p, c, 0, &buf, &len), 0);
	assert_int_equal(proto_delta_parse(buf, len, &d, &err), 0);
	assert_int_equal(d.flags, PROTO_DELTA_F_TOUCHED);
	/* Tensor 0 (BF16): its first changed and first unchanged element. */
	uint64_t ch = 0, un = 0;
	while (memcmp(c->data[0] + 2 * ch, p->data[0] + 2 * ch, 2) == 0)
		ch++;
	while (memcmp(c->data[0] + 2 * un, p->data[0] + 2 * un, 2) != 0)
		un++;
	assert_true(ch < p->m.tensors[0].nelem && un < p->m.tensors[0].nelem);
	assert_int_not_equal(d.tensors[0].touched_sum, 0);
	for (int where = 0; where < 2; where++) {
		uint8_t **bufs = calloc(d.ntensors + 1, sizeof(*bufs));
		assert_non_null(bufs);
		for (uint32_t i = 0; i < d.ntensors; i++) {
			uint32_t pi = d.tensors[i].parent;
			bufs[i] = calloc(1, d.tensors[i].nelem * d.tensors[i].elsize + 1);
			assert_non_null(bufs[i]);
			if (pi != PROTO_DELTA_NONE)
				memcpy(bufs[i], p->data[pi], p->m.tensors[pi].nbytes);
		}
		uint64_t e = where == 0 ? ch : un;
		bufs[0][2 * e + 1] ^= 0x40; /* the parent damaged; its sums kept as they were */
		uint8_t *snap = malloc(p->m.tensors[0].nbytes + 1);
		assert_non_null(snap);
		memcpy(snap, bufs[0], p->m.tensors[0].nbytes);
		struct proto_delta_parent par = {p->header, p->header_len, p->m.ntensors, p->sums};
		int rc = proto_delta_apply(&d, &par, bufs, 2, &err);
		if (where == 0) {
			assert_int_not_equal(rc, 0);
			assert_non_null(strstr(err.msg, "the parent differs where the delta writes"));
			assert_memory_equal(bufs[0], snap, p->m.tensors[0].nbytes);
		} else {
			assert_int_equal(rc, 0); /* not visible to a sparse check */
			assert_int_not_equal(memcmp(bufs[0], c->data[0], c->m.tensors[0].nbytes), 0);
		}
		for (uint32_t i = 0; i < d.ntensors; i++)
			free(bufs[i]);
		free(bufs);
		free(snap);
	}
	/* Forged: an unknown flag; a touched checksum that is no checksum, one
	 * on a tensor without a parent, and a wrong one. */
	size_t rec0 = 136 + 8 + d.child_header_len;
	uint8_t *f = malloc(len);
	assert_non_null(f);
	uint32_t orphan = 0; /* a child tensor without a parent */
	while (orphan < d.ntensors && d.tensors[orphan].parent != PROTO_DELTA_NONE)
		orphan++;
	assert_true(orphan < d.ntensors);
	for (int forgery = 0; forgery < 4; forgery++) {
		memcpy(f, buf, len);
		if (forgery == 0) {
			f[52] |= 2;
		} else if (forgery == 1) {
			memset(f + rec0 + 32, 0xff, 8);
		} else if (forgery == 2) {
			f[rec0 + 32] ^= 1;
		} else {
			f[rec0 + (size_t)orphan * 40 + 32] = 1;
		}
		fz_rehash(f, len);
		const char *why[4] = {"unsupported version", "is not a checksum",
				      "the parent differs where the delta writes",
				      "parent checksum without parent"};
		assert_true(fz_delta_one(f, len, false, NULL, &err) < 0);
		if (strstr(err.msg, why[forgery]) == NULL)
			fail_msg("forgery %d: expected \"%s\", got \"%s\"", forgery, why[forgery],
				 err.msg);
	}
	proto_delta_fini(&d);
	free(f);
	free(buf);
}

/* ---- corpus ------------------------------------------------------------- */

static void write_file(const char *name, const uint8_t *p, size_t len)
{
	char path[4096];
	assert_int_equal(proto_write_file_atomic(tu_data(path, sizeof(path), name), p, len, 0644,
						 NULL),
			 0);
}

/* Writes the corpus files this test owns (TESSERA_WRITE_SEEDS=1). */
static void write_corpus(void)
{
	const struct fz_version *p = fz_fixed(false), *c = fz_fixed(true);
	uint8_t *buf, gaps[4] = {10, 20, 30, 40}, big[6] = {254, 254, 254, 254, 254, 254};
	uint8_t lo[6] = {1, 2, 1, 2, 1, 2}, hi[6] = {0}, ff[4] = {0xff, 0xff, 0xff, 0xff};
	struct fz_version q;
	size_t len;

	assert_int_equal(fz_encode(p, c, 0, &buf, &len), 0);
	write_file("seed-delta-small", buf, len);
	write_file("bad-delta-forged-truncated", buf, len / 2);
	buf[len - 10] ^= 1; /* inside the last zstd frame */
	write_file("bad-delta-forged-stream-bitflip", buf, len);
	buf[len - 10] ^= 1;
	buf[200] ^= 1; /* inside the header: hash mismatch */
	write_file("bad-delta-forged-header-bitflip", buf, len);
	free(buf);
	assert_int_equal(fz_encode(p, c, 256, &buf, &len), 0);
	write_file("seed-delta-chunked", buf, len);
	free(buf);
	clone(&q, p);
	q.data[0][0] ^= 1;
	resum(&q);
	assert_int_equal(fz_encode(&q, c, 0, &buf, &len), 0);
	write_file("bad-delta-forged-wrong-parent", buf, len);
	free(buf);
	fz_free(&q);
	forge_sparse(big, 6, NULL, 0, lo, hi, 6, 0, &buf, &len);
	write_file("bad-delta-forged-gap-overrun", buf, len);
	free(buf);
	forge_sparse(gaps, 4, NULL, 0, ff, ff, 4, 0, &buf, &len);
	write_file("bad-delta-forged-value-range", buf, len);
	free(buf);
	forge_sparse(gaps, 4, NULL, 0, lo, hi, 4, 12345, &buf, &len);
	write_file("bad-delta-forged-checksum", buf, len);
	free(buf);
}

static void test_corpus(void **state)
{
	char dir[4096], path[8192];
	struct dirent *e;
	int seeds = 0, bad = 0;
	DIR *dd;

	(void)state;
	if (getenv("TESSERA_WRITE_SEEDS") != NULL)
		write_corpus();
	tu_data(dir, sizeof(dir), "");
	dd = opendir(dir);
	assert_non_null(dd);
	while ((e = readdir(dd)) != NULL) {
		bool is_seed = strncmp(e->d_name, "seed-delta-", 11) == 0;
		bool is_bad = strncmp(e->d_name, "bad-delta-", 10) == 0;
		uint8_t *buf;
		size_t len;
		bool ok = false;
		if (!is_seed && !is_bad)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		assert_int_equal(proto_read_file(path, 64u << 20, &buf, &len, NULL), 0);
		int rc = fz_delta_one(buf, len, false, &ok, NULL);
		if (is_seed && (rc != 0 || !ok))
			fail_msg("%s: a seed must rebuild the fixed child", e->d_name);
		if (is_bad && rc == 0)
			fail_msg("%s: a bad delta applied", e->d_name);
		fz_delta_one(buf, len, true, NULL, NULL); /* must not crash */
		seeds += is_seed;
		bad += is_bad;
		free(buf);
	}
	closedir(dd);
	assert_true(seeds >= 1);
	assert_true(bad >= 5);
}

/* ---- the CLI ------------------------------------------------------------- */

static bool same_file(const char *a, const char *b)
{
	return tu_sh("cmp -s '%s' '%s'", a, b) == 0;
}

static bool has_content(const char *path, const char *want)
{
	char got[64] = "";
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return false;
	size_t n = fread(got, 1, sizeof(got) - 1, f);
	fclose(f);
	got[n] = 0;
	return strcmp(got, want) == 0;
}

static void test_cli(void **state)
{
	char dir[256], bin[4096], bad[4096];

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s synth -o %s --synthetic-mb 0.25 --steps 2 --seed 3 --threads 1 2> %s/synth.err",
			       bin, dir, dir), 0);
	assert_int_equal(tu_sh("grep -q 'of them changed per step$' %s/synth.err", dir), 0);
	/* Reproducible whatever the thread count. */
	assert_int_equal(tu_sh("%s synth -o %s/again --synthetic-mb 0.25 --steps 2 --seed 3 --threads 3 > /dev/null",
			       bin, dir), 0);
	assert_int_equal(tu_sh("cmp -s %s/v2.safetensors %s/again/v2.safetensors", dir, dir), 0);
	/* Encode, apply, byte-identical; and the next step. */
	assert_int_equal(tu_sh("%s delta encode --parent %s/v0.safetensors --child %s/v1.safetensors "
			       "-o %s/d01 > /dev/null", bin, dir, dir, dir), 0);
	assert_int_equal(tu_sh("%s delta apply --parent %s/v0.safetensors %s/d01 -o %s/r1.safetensors",
			       bin, dir, dir, dir), 0);
	{
		char a[512], b[512];
		snprintf(a, sizeof(a), "%s/r1.safetensors", dir);
		snprintf(b, sizeof(b), "%s/v1.safetensors", dir);
		assert_true(same_file(a, b));
	}
	assert_int_equal(tu_sh("%s delta encode --parent %s/r1.safetensors --child %s/v2.safetensors "
			       "-o %s/d12 --level 3 --chunk 4096 --threads 2 > %s/enc.out 2> %s/enc.err",
			       bin, dir, dir, dir, dir, dir), 0);
	assert_int_equal(tu_sh("%s delta apply --parent %s/v1.safetensors %s/d12 -o %s/r2.safetensors "
			       "--threads 2 > %s/apply.out 2> %s/apply.err", bin, dir, dir, dir, dir, dir),
			 0);
	assert_int_equal(tu_sh("cmp -s %s/r2.safetensors %s/v2.safetensors", dir, dir), 0);
	/* Each writes one line, to stderr, saying what it wrote; stdout is
	 * for machine output (none here). */
	assert_int_equal(tu_sh("test ! -s %s/enc.out && test $(wc -l < %s/enc.err) -eq 1 && "
			       "grep -q '^tessera delta encode: wrote %s/d12: ' %s/enc.err",
			       dir, dir, dir, dir), 0);
	assert_int_equal(tu_sh("test ! -s %s/apply.out && test $(wc -l < %s/apply.err) -eq 1 && "
			       "grep -q '^tessera delta apply: wrote %s/r2.safetensors ' %s/apply.err",
			       dir, dir, dir, dir), 0);
	/* Stats: every baseline and the bound. */
	assert_int_equal(tu_sh("%s delta stats --parent %s/v0.safetensors --child %s/v1.safetensors "
			       "> %s/stats.out", bin, dir, dir, dir), 0);
	assert_int_equal(tu_sh("grep -q 'tessera delta (ours)' %s/stats.out && grep -q 'int32 index' "
			       "%s/stats.out && grep -q 'uint16 gap' %s/stats.out && grep -q 'XOR' "
			       "%s/stats.out && grep -q 'patch-from' %s/stats.out && grep -q 'entropy "
			       "bound' %s/stats.out", dir, dir, dir, dir, dir, dir), 0);
	/* Failures: non-zero exit, one line on stderr, the output untouched. */
	{
		char out[512];
		snprintf(out, sizeof(out), "%s/keep.safetensors", dir);
		assert_int_equal(tu_write(out, "keep"), 0);
		/* wrong parent */
		assert_int_equal(tu_sh("%s delta apply --parent %s/v1.safetensors %s/d01 -o %s "
				       "2> %s/err.out", bin, dir, dir, out, dir), 1);
		assert_int_equal(tu_sh("grep -q 'another parent' %s/err.out && test $(wc -l < "
				       "%s/err.out) -eq 1", dir, dir), 0);
		assert_true(has_content(out, "keep"));
		/* truncated delta */
		assert_int_equal(tu_sh("head -c 3000 %s/d01 > %s/trunc", dir, dir), 0);
		assert_int_equal(tu_sh("%s delta apply --parent %s/v0.safetensors %s/trunc -o %s "
				       "2> /dev/null", bin, dir, dir, out), 1);
		assert_true(has_content(out, "keep"));
		/* a lying safetensors parent */
		tu_data(bad, sizeof(bad), "bad-safetensors-overlap");
		assert_int_equal(tu_sh("%s delta apply --parent %s %s/d01 -o %s 2> %s/err.out", bin,
				       bad, dir, out, dir), 1);
		assert_int_equal(tu_sh("grep -q 'overlaps' %s/err.out", dir), 0);
		assert_true(has_content(out, "keep"));
		assert_int_equal(tu_sh("%s delta encode --parent %s --child %s/v1.safetensors -o %s "
				       "2> /dev/null", bin, bad, dir, out), 1);
		assert_true(has_content(out, "keep"));
		/* usage errors */
		assert_int_equal(tu_sh("%s delta apply --parent %s/v0.safetensors 2> /dev/null", bin,
				       dir), 2);
		assert_int_equal(tu_sh("%s delta frobnicate 2> /dev/null", bin), 2);
		/* No temporary file left behind. */
		assert_int_equal(tu_sh("ls %s | grep -q tmp", dir), 1);
	}
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_dtype),
		cmocka_unit_test(test_adversarial_patterns),
		cmocka_unit_test(test_densities),
		cmocka_unit_test(test_gaps),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_threads_ranges),
		cmocka_unit_test(test_tensor_set_changes),
		cmocka_unit_test(test_child_sums_from_changes),
		cmocka_unit_test(test_wrong_parent),
		cmocka_unit_test(test_truncation),
		cmocka_unit_test(test_bit_flips),
		cmocka_unit_test(test_forged_streams),
		cmocka_unit_test(test_checksum_catches),
		cmocka_unit_test(test_touched),
		cmocka_unit_test(test_warm_workers),
		cmocka_unit_test(test_corpus),
		cmocka_unit_test(test_cli),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
