/* BLAKE3 of device bytes (node/store/store_cuda_blake3.cu) against the
 * CPU's (blake3.h, what proto_chunk_hash calls): the kernel's own steps run
 * on the CPU (node_cuda_blake3_host; needs tessera built with CUDA, no
 * device), and the kernel itself on a device (skipped, saying so, when
 * none is visible). Inputs: BLAKE3's test vector lengths (bytes i % 251)
 * and random bytes, aligned and not, up to chunks of several 128 KiB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blake3.h"
#include "node/store/store_cuda.h"
#include "tests/cudatest.h"

#ifdef TESSERA_CUDA
static const size_t vector_lens[] = {
	0,    1,    63,   64,   65,   1023, 1024, 1025, 2048,  2049,  3072,   3073,   4096,   4097,
	5120, 5121, 6144, 6145, 7168, 7169, 8192, 8193, 16384, 31744, 102400, 131071, 131072,
	/* chunks of several 128-leaf groups: the kernel's stack of subtrees */
	131073, 262144, 393221, 524288, 918527, 1048576, 1048577, (3 << 20) + 17,
};
#define NLENS (sizeof(vector_lens) / sizeof(vector_lens[0]))
#define MAXLEN ((3 << 20) + 17)

static uint64_t rng = 0x2545f4914f6cdd1dull;

static void fill(uint8_t *p, size_t n, int random)
{
	for (size_t i = 0; i < n; i++) {
		if (random) {
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
		}
		p[i] = random ? (uint8_t)(rng >> 24) : (uint8_t)(i % 251);
	}
}

static void cpu_blake3(const uint8_t *p, size_t len, uint8_t out[32])
{
	blake3_hasher h;

	blake3_hasher_init(&h);
	blake3_hasher_update(&h, p, len);
	blake3_hasher_finalize(&h, out, 32);
}

static void hex(const uint8_t d[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", d[i]);
}

#endif

/* The kernel's leaf, level and stack steps on the CPU agree with BLAKE3's
 * published hashes and with the CPU's BLAKE3 on every input. */
static void test_blake3_host_emulation(void **state)
{
#ifndef TESSERA_CUDA
	print_message("skipped: tessera was built without CUDA (no nvcc)\n");
	skip();
#else
	/* BLAKE3's official test vectors (input bytes i % 251). */
	static const struct {
		size_t len;
		const char *hash;
	} known[] = {
		{0, "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
		{1025, "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444"},
	};
	uint8_t *buf = malloc(MAXLEN + 1), want[32], got[32];
	char hx[65];

	assert_non_null(buf);
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		fill(buf, known[i].len, 0);
		node_cuda_blake3_host(buf, known[i].len, got);
		hex(got, hx);
		assert_string_equal(hx, known[i].hash);
	}
	for (int random = 0; random < 2; random++)
		for (size_t i = 0; i < NLENS; i++)
			for (size_t mis = 0; mis < 2; mis++) {
				fill(buf + mis, vector_lens[i], random);
				cpu_blake3(buf + mis, vector_lens[i], want);
				node_cuda_blake3_host(buf + mis, vector_lens[i], got);
				if (memcmp(want, got, 32) != 0)
					fail_msg("%zu bytes (%s, %s): the emulated kernel's hash differs",
						 vector_lens[i], random ? "random" : "i % 251",
						 mis ? "unaligned" : "aligned");
			}
	free(buf);
#endif
}

/* The kernel on the device: each input as one chunk, all of them in one
 * launch at odd offsets, and a run of 128 KiB chunks with a short tail
 * through a batch smaller than it, verified and then refused once a byte
 * changes. */
static void test_blake3_device(void **state)
{
#ifndef TESSERA_CUDA
	print_message("skipped: tessera was built without CUDA (no nvcc)\n");
	skip();
#else
	struct node_cuda_blake3 *b = NULL;
	uint64_t offs[NLENS], lens[NLENS], *offs_d = NULL, *lens_d = NULL;
	uint8_t (*want)[32], (*got)[32], (*out_d)[32] = NULL;
	size_t total = 16;
	char why[256];

	tu_skip_without_gpu();
	want = malloc(NLENS * 32);
	got = malloc(NLENS * 32);
	for (size_t i = 0; i < NLENS; i++)
		total += vector_lens[i] + 3 + 15;
	uint8_t *host = calloc(1, total), *dev = NULL;
	assert_true(host != NULL && want != NULL && got != NULL);
	assert_int_equal(node_cuda_blake3_new(0, 4, &b, why, sizeof(why)), 0);
	assert_int_equal(node_cuda_alloc(0, total, (void **)&dev, why, sizeof(why)), 0);
	for (int random = 0; random < 2; random++) {
		size_t at = 0;
		for (size_t i = 0; i < NLENS; i++) {
			at += i % 4;
			offs[i] = at;
			lens[i] = vector_lens[i];
			fill(host + at, vector_lens[i], random);
			cpu_blake3(host + at, vector_lens[i], want[i]);
			at = (at + vector_lens[i] + 15) & ~(size_t)15;
		}
		assert_true(at <= total);
		assert_int_equal(node_cuda_upload(0, dev, host, total, why, sizeof(why)), 0);
		for (size_t i = 0; i < NLENS; i++) {
			size_t len = vector_lens[i];
			assert_int_equal(node_cuda_blake3_chunks(b, dev + offs[i], len, len ? len : 1, got,
								 why, sizeof(why)), 0);
			if (memcmp(got[0], want[i], 32) != 0)
				fail_msg("%zu bytes (%s): the device's hash differs from the CPU's", len,
					 random ? "random" : "i % 251");
		}
		if (offs_d == NULL) {
			assert_int_equal(node_cuda_alloc(0, sizeof(offs), (void **)&offs_d, why, sizeof(why)), 0);
			assert_int_equal(node_cuda_alloc(0, sizeof(lens), (void **)&lens_d, why, sizeof(why)), 0);
			assert_int_equal(node_cuda_alloc(0, NLENS * 32, (void **)&out_d, why, sizeof(why)), 0);
		}
		assert_int_equal(node_cuda_upload(0, offs_d, offs, sizeof(offs), why, sizeof(why)), 0);
		assert_int_equal(node_cuda_upload(0, lens_d, lens, sizeof(lens), why, sizeof(why)), 0);
		assert_int_equal(node_cuda_blake3_launch(dev, offs_d, lens_d, NLENS, out_d, NULL, why,
							 sizeof(why)), 0);
		assert_int_equal(node_cuda_download(0, got, out_d, NLENS * 32, why, sizeof(why)), 0);
		for (size_t i = 0; i < NLENS; i++)
			if (memcmp(got[i], want[i], 32) != 0)
				fail_msg("launch, %zu bytes (%s): the device's hash differs from the CPU's",
					 vector_lens[i], random ? "random" : "i % 251");
	}
	node_cuda_free(out_d);
	node_cuda_free(lens_d);
	node_cuda_free(offs_d);
	node_cuda_free(dev);
	node_cuda_blake3_free(b);
	free(host);
	free(want);
	free(got);

	/* 40 chunks of 128 KiB and a 1000-byte tail, batches of 16. */
	const size_t chunk = 1 << 17, len = 40 * chunk + 1000;
	uint64_t n = node_cuda_blake3_count(len, chunk);
	uint8_t *bytes = malloc(len), (*sums)[32] = malloc(n * 32), *bad = malloc(n), x;
	assert_true(bytes != NULL && sums != NULL && bad != NULL);
	assert_int_equal(n, 41);
	fill(bytes, len, 1);
	for (uint64_t i = 0; i < n; i++)
		cpu_blake3(bytes + i * chunk, i + 1 < n ? chunk : 1000, sums[i]);
	assert_int_equal(node_cuda_alloc(0, len, (void **)&dev, why, sizeof(why)), 0);
	assert_int_equal(node_cuda_upload(0, dev, bytes, len, why, sizeof(why)), 0);
	assert_int_equal(node_cuda_blake3_new(0, 16, &b, why, sizeof(why)), 0);
	assert_int_equal(node_cuda_blake3_verify(b, dev, len, chunk, (const uint8_t (*)[32])sums, bad,
						 why, sizeof(why)), 0);
	x = bytes[7 * chunk + 99] ^ 1;
	assert_int_equal(node_cuda_upload(0, dev + 7 * chunk + 99, &x, 1, why, sizeof(why)), 0);
	assert_int_equal(node_cuda_blake3_verify(b, dev, len, chunk, (const uint8_t (*)[32])sums, bad,
						 why, sizeof(why)), 1);
	for (uint64_t i = 0; i < n; i++)
		assert_int_equal(bad[i], i == 7);
	node_cuda_blake3_free(b);
	node_cuda_free(dev);
	free(bytes);
	free(sums);
	free(bad);
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_blake3_host_emulation),
		cmocka_unit_test(test_blake3_device),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
