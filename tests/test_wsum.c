/* Tests for the position-weighted checksum: definition, updates, detection. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/wsum.h"

static uint64_t rnd(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t get(const uint8_t *p, size_t w, uint64_t i)
{
	uint64_t x = 0;
	memcpy(&x, p + i * w, w);
	return x;
}

/* The definition, computed the slow way. */
static uint64_t naive(size_t w, const uint8_t *p, uint64_t n)
{
	unsigned __int128 a = 0, b = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t v = get(p, w, i) % PROTO_WSUM_P;
		a += v;
		b += (unsigned __int128)(i + 1) * v;
	}
	return (uint64_t)(b % PROTO_WSUM_P) << 32 | (uint64_t)(a % PROTO_WSUM_P);
}

static void test_definition(void **state)
{
	static const uint64_t lens[] = {0, 1, 2, 127, 128, 129, 4095, 4096, 4097, 100003};
	uint64_t s = 1;
	uint8_t *p = malloc(100003 * 8 + 1);

	(void)state;
	assert_non_null(p);
	for (size_t w = 1; w <= 8; w *= 2)
		for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
			for (uint64_t b = 0; b < lens[l] * w; b++)
				p[b] = (uint8_t)rnd(&s);
			/* Extremes too: all ones (x >= p for 32/64-bit). */
			if (l == 5)
				memset(p, 0xff, lens[l] * w);
			assert_int_equal(proto_wsum(w, p + 0, lens[l]), naive(w, p, lens[l]));
			/* Any alignment. */
			memmove(p + 1, p, lens[l] * w);
			assert_int_equal(proto_wsum(w, p + 1, lens[l]), naive(w, p + 1, lens[l]));
		}
	free(p);
}

static void test_update_and_combine(void **state)
{
	uint64_t s = 7, n = 10000;
	uint8_t *p = malloc(n * 8);

	(void)state;
	assert_non_null(p);
	for (size_t w = 1; w <= 8; w *= 2) {
		for (uint64_t b = 0; b < n * w; b++)
			p[b] = (uint8_t)rnd(&s);
		uint64_t sum = proto_wsum(w, p, n);
		for (int k = 0; k < 200; k++) {
			uint64_t i = rnd(&s) % n, old = get(p, w, i), nw = rnd(&s);
			memcpy(p + i * w, &nw, w);
			nw = get(p, w, i);
			sum = proto_wsum_update(sum, i, old, nw);
		}
		assert_int_equal(sum, proto_wsum(w, p, n));
		/* Pieces combine into the whole at any split. */
		for (int k = 0; k < 20; k++) {
			uint64_t cut = rnd(&s) % (n + 1);
			uint64_t c = proto_wsum_combine(proto_wsum(w, p, cut), cut,
							proto_wsum(w, p + cut * w, n - cut));
			assert_int_equal(c, sum);
		}
	}
	free(p);
}

/* Lost, wrong and misplaced changes move the checksum. */
static void test_detects(void **state)
{
	uint64_t s = 3, n = 5000;
	uint16_t *p = malloc(n * 2);

	(void)state;
	assert_non_null(p);
	for (uint64_t i = 0; i < n; i++)
		p[i] = (uint16_t)rnd(&s);
	uint64_t base = proto_wsum(2, p, n);
	for (int k = 0; k < 2000; k++) {
		uint64_t i = rnd(&s) % n, j = rnd(&s) % n;
		uint16_t d = (uint16_t)(1 + rnd(&s) % 65535);
		/* One wrong value anywhere. */
		uint64_t x = proto_wsum_update(base, i, p[i], (uint16_t)(p[i] + d));
		assert_int_not_equal(x, base);
		/* The same difference applied at j instead of i. */
		if (i != j && (int)p[i] + 1 <= 65535 && (int)p[j] + 1 <= 65535) {
			uint64_t at_i = proto_wsum_update(base, i, p[i], p[i] + 1u);
			uint64_t at_j = proto_wsum_update(base, j, p[j], p[j] + 1u);
			assert_int_not_equal(at_i, at_j);
		}
	}
	free(p);
}

/* The documented limit: 32-bit patterns p apart alias. */
static void test_documented_alias(void **state)
{
	uint32_t v[4] = {1, 2, 0, 4};
	uint64_t a = proto_wsum(4, v, 4);

	(void)state;
	v[2] = PROTO_WSUM_P;
	assert_int_equal(proto_wsum(4, v, 4), a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_definition),
		cmocka_unit_test(test_update_and_combine),
		cmocka_unit_test(test_detects),
		cmocka_unit_test(test_documented_alias),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
