/*
 * Tests for the safetensors reader and writer: round trips, lying headers,
 * and the tests/data corpus (seed-safetensors-* must parse,
 * bad-safetensors-* must not). TESSERA_WRITE_SEEDS=1 rewrites the corpus
 * files this test owns from the cases below.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/safetensors.h"
#include "tests/fuzz/fuzz_common.h"
#include "tests/testutil.h"

/* A file image: 8-byte size, the JSON, then data_len bytes. */
static uint8_t *mk(const char *json, uint64_t data_len, size_t *len)
{
	size_t n = strlen(json);
	uint8_t *p = malloc(8 + n + data_len + 1);
	uint64_t le = htole64((uint64_t)n);

	assert_non_null(p);
	memcpy(p, &le, 8);
	memcpy(p + 8, json, n);
	for (uint64_t i = 0; i < data_len; i++)
		p[8 + n + i] = (uint8_t)(i * 7 + 1);
	*len = 8 + n + data_len;
	return p;
}

static int parse(const uint8_t *p, size_t len, struct proto_st *st, struct proto_err *err)
{
	return proto_st_parse(p, len, len, "t", st, err);
}

static void test_valid(void **state)
{
	struct proto_st st;
	struct proto_err err = {{0}};
	size_t len;
	uint8_t *p;

	(void)state;
	/* JSON order differs from data order; metadata kept; padding allowed. */
	p = mk("{\"__metadata__\":{\"format\":\"pt\"},"
	       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]},"
	       "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[0,4]},"
	       "\"e\":{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[12,12]},"
	       "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[12,13]}}   ",
	       13, &len);
	assert_int_equal(parse(p, len, &st, &err), 0);
	assert_int_equal(st.model.ntensors, 4);
	assert_string_equal(st.model.tensors[0].name, "a");
	assert_string_equal(st.model.tensors[1].name, "b");
	assert_string_equal(st.model.tensors[2].name, "e");
	assert_string_equal(st.model.tensors[3].name, "s");
	assert_int_equal(st.model.tensors[3].nelem, 1);
	assert_int_equal(st.offsets[1], st.header_len + 4);
	assert_non_null(st.metadata);
	assert_string_equal(json_string_value(json_object_get(st.metadata, "format")), "pt");
	assert_memory_equal(st.header, p, st.header_len);
	assert_null(proto_st_tensor(&st, 0)); /* not opened from a file */
	proto_st_fini(&st);
	free(p);
	/* No tensors at all. */
	p = mk("{}", 0, &len);
	assert_int_equal(parse(p, len, &st, &err), 0);
	assert_int_equal(st.model.ntensors, 0);
	proto_st_fini(&st);
	free(p);
}

/* Hostile headers, each refused with a one-line error. */
static const struct bad {
	const char *name, *json;
	uint64_t data_len;
} bads[] = {
	{"not-json", "{\"a\":", 0},
	{"array", "[1,2]", 0},
	{"leading-space", " {}", 0},
	{"trailing-garbage", "{}x", 0},
	{"duplicate-key", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			  "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2},
	{"bad-dtype", "{\"a\":{\"dtype\":\"BF17\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2},
	{"lowercase-dtype", "{\"a\":{\"dtype\":\"bf16\",\"shape\":[1],\"data_offsets\":[0,2]}}", 2},
	{"missing-offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1},
	{"extra-field", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1},
	{"entry-not-object", "{\"a\":[1]}", 0},
	{"negative-shape", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1},
	{"float-shape", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1},
	{"too-many-dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			  "\"data_offsets\":[0,1]}}", 1},
	{"shape-overflow", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776],"
			   "\"data_offsets\":[0,1]}}", 1},
	{"end-before-begin", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1},
	{"size-mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4},
	{"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12},
	{"hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12},
	{"past-end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8},
	{"uncovered-tail", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8},
	{"huge-offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],"
			"\"data_offsets\":[18446744073709551615,0]}}", 1},
	{"metadata-not-object", "{\"__metadata__\":[]}", 0},
	{"metadata-not-string", "{\"__metadata__\":{\"k\":1}}", 0},
	{"nul-in-name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1},
	{"empty-name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1},
};

static void test_lying_headers(void **state)
{
	struct proto_st st;
	struct proto_err err;
	size_t len;

	(void)state;
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		uint8_t *p = mk(bads[i].json, bads[i].data_len, &len);
		memset(&err, 0, sizeof(err));
		int rc = parse(p, len, &st, &err);
		if (rc == 0)
			fail_msg("%s: accepted", bads[i].name);
		assert_true(rc < 0);
		assert_true(strlen(err.msg) > 0);
		assert_null(strchr(err.msg, '\n'));
		assert_int_equal(st.model.ntensors, 0); /* left empty */
		free(p);
	}
}

static void test_lying_sizes(void **state)
{
	struct proto_st st;
	struct proto_err err;
	uint8_t p[64];
	uint64_t n;

	(void)state;
	memset(p, 0, sizeof(p));
	/* Too short for the size field. */
	assert_true(parse(p, 7, &st, &err) < 0);
	/* Absurd header size: refused before anything is allocated. */
	n = htole64(1ull << 40);
	memcpy(p, &n, 8);
	memset(p + 8, '{', sizeof(p) - 8);
	assert_int_equal(parse(p, sizeof(p), &st, &err), -EFBIG);
	/* Header longer than the file. */
	n = htole64(100);
	memcpy(p, &n, 8);
	assert_int_equal(parse(p, sizeof(p), &st, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "runs past"));
	/* Header present only in part (file claims more than the buffer). */
	n = htole64(40);
	memcpy(p, &n, 8);
	assert_int_equal(proto_st_parse(p, 20, sizeof(p), "t", &st, &err), -EINVAL);
}

static void test_write_open_round_trip(void **state)
{
	char dir[256], path[512];
	struct proto_model m;
	struct proto_st st;
	struct proto_err err = {{0}};
	uint8_t *data[PROTO_DT_COUNT], *hdr;
	size_t hlen;
	json_t *md = json_pack("{s:s}", "format", "pt");

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	proto_model_init(&m);
	for (int dt = 0; dt < PROTO_DT_COUNT; dt++) {
		char name[32];
		uint64_t shape[2] = {3, (uint64_t)dt}; /* dtype 0 is an empty tensor */
		snprintf(name, sizeof(name), "t%d", dt);
		assert_int_equal(proto_model_add(&m, name, (enum proto_dtype)dt, 2, shape, &err), 0);
	}
	assert_int_equal(proto_model_finish(&m, &err), 0);
	for (int dt = 0; dt < PROTO_DT_COUNT; dt++) {
		data[dt] = malloc(m.tensors[dt].nbytes + 1);
		for (uint64_t b = 0; b < m.tensors[dt].nbytes; b++)
			data[dt][b] = (uint8_t)(b * 13 + (uint64_t)dt);
	}
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
	assert_int_equal(proto_st_write(path, &m, md, (const void *const *)data, &err), 0);
	assert_int_equal(proto_st_open(path, &st, &err), 0);
	assert_int_equal(proto_st_header_build(&m, md, &hdr, &hlen, &err), 0);
	assert_int_equal(st.header_len, hlen);
	assert_memory_equal(st.header, hdr, hlen);
	assert_int_equal(hlen % 8, 0);
	assert_int_equal(st.model.ntensors, PROTO_DT_COUNT);
	for (int dt = 0; dt < PROTO_DT_COUNT; dt++) {
		assert_string_equal(st.model.tensors[dt].name, m.tensors[dt].name);
		assert_int_equal(st.model.tensors[dt].dtype, dt);
		if (m.tensors[dt].nbytes)
			assert_memory_equal(proto_st_tensor(&st, (uint32_t)dt), data[dt],
					    m.tensors[dt].nbytes);
		free(data[dt]);
	}
	proto_st_fini(&st);
	proto_st_fini(&st); /* idempotent */
	free(hdr);
	/* Missing file, directory: one-line errors. */
	snprintf(path, sizeof(path), "%s/none.safetensors", dir);
	assert_true(proto_st_open(path, &st, &err) < 0);
	assert_true(proto_st_open(dir, &st, &err) < 0);
	json_decref(md);
	proto_model_fini(&m);
	tu_rmtree(dir);
}

/* Writes the corpus files this test owns (TESSERA_WRITE_SEEDS=1). */
static void write_corpus(void)
{
	char path[4096];
	size_t len;
	uint8_t *p;

	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		char name[128];
		snprintf(name, sizeof(name), "bad-safetensors-%s", bads[i].name);
		p = mk(bads[i].json, bads[i].data_len, &len);
		assert_int_equal(proto_write_file_atomic(tu_data(path, sizeof(path), name), p, len,
							 0644, NULL), 0);
		free(p);
	}
	p = mk("{\"__metadata__\":{\"format\":\"pt\"},"
	       "\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
	       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
	       "\"c\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[12,12]}}",
	       12, &len);
	assert_int_equal(proto_write_file_atomic(tu_data(path, sizeof(path),
							 "seed-safetensors-small"),
						 p, len, 0644, NULL),
			 0);
	free(p);
}

static void test_corpus(void **state)
{
	char dir[4096], path[8192];
	struct dirent *e;
	int seeds = 0, bad = 0;
	DIR *d;

	(void)state;
	if (getenv("TESSERA_WRITE_SEEDS") != NULL)
		write_corpus();
	tu_data(dir, sizeof(dir), "");
	d = opendir(dir);
	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		bool is_seed = strncmp(e->d_name, "seed-safetensors-", 17) == 0;
		bool is_bad = strncmp(e->d_name, "bad-safetensors-", 16) == 0;
		uint8_t *buf;
		size_t len;
		if (!is_seed && !is_bad)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		assert_int_equal(proto_read_file(path, 64u << 20, &buf, &len, NULL), 0);
		int rc = fz_safetensors_one(buf, len);
		if (is_seed && rc != 0)
			fail_msg("%s: a seed must parse", e->d_name);
		if (is_bad && rc == 0)
			fail_msg("%s: a bad input parsed", e->d_name);
		seeds += is_seed;
		bad += is_bad;
		free(buf);
	}
	closedir(d);
	assert_true(seeds >= 1);
	assert_true(bad >= 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_lying_headers),
		cmocka_unit_test(test_lying_sizes),
		cmocka_unit_test(test_write_open_round_trip),
		cmocka_unit_test(test_corpus),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
