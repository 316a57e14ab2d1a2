/* Checkpoints: a safetensors file, a Hugging Face directory and a sharded
 * one give the same model and bytes; model directories list their versions;
 * a bad index (tests/data/bad-ckpt-index-*) is refused in one line; a file
 * truncated after it was opened is a clear read error. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proto/checkpoint.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tests/ckpt_util.h"
#include "tests/testutil.h"

struct env {
	char dir[256];
	struct proto_model m;
	uint8_t *data[3];
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;
	const uint64_t sa[2] = {4, 4}, sb[1] = {3}, sc[2] = {2, 8};

	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	proto_model_init(&e->m);
	assert_int_equal(proto_model_add(&e->m, "a", PROTO_DT_BF16, 2, sa, &err), 0);
	assert_int_equal(proto_model_add(&e->m, "b", PROTO_DT_FP32, 1, sb, &err), 0);
	assert_int_equal(proto_model_add(&e->m, "c", PROTO_DT_BF16, 2, sc, &err), 0);
	assert_int_equal(proto_model_finish(&e->m, &err), 0);
	for (uint32_t t = 0; t < 3; t++) {
		e->data[t] = malloc(e->m.tensors[t].nbytes);
		for (uint64_t i = 0; i < e->m.tensors[t].nbytes; i++)
			e->data[t][i] = (uint8_t)(i * 7 + t * 31 + 1);
	}
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	tu_rmtree(e->dir);
	for (uint32_t t = 0; t < 3; t++)
		free(e->data[t]);
	proto_model_fini(&e->m);
	free(e);
	return 0;
}

/* The checkpoint at path holds exactly e's model and bytes. */
static void expect_same(struct env *e, const char *path)
{
	struct proto_ckpt ck;
	struct proto_err err = {{0}};

	if (proto_ckpt_open(path, &ck, &err) != 0)
		fail_msg("%s", err.msg);
	assert_int_equal(ck.model.ntensors, 3);
	assert_memory_equal(ck.model.digest, e->m.digest, PROTO_HASH_BYTES);
	for (uint32_t t = 0; t < 3; t++) {
		uint64_t n = e->m.tensors[t].nbytes;
		uint8_t buf[64];
		assert_memory_equal(proto_ckpt_tensor(&ck, t), e->data[t], n);
		/* pread gives the same bytes, whole and from inside. */
		assert_true(n <= sizeof(buf));
		assert_int_equal(proto_ckpt_read(&ck, t, 0, n, buf, &err), 0);
		assert_memory_equal(buf, e->data[t], n);
		assert_int_equal(proto_ckpt_read(&ck, t, 1, n - 2, buf, &err), 0);
		assert_memory_equal(buf, e->data[t] + 1, n - 2);
	}
	proto_ckpt_fini(&ck);
	proto_ckpt_fini(&ck); /* twice is fine */
}

static void test_three_forms_agree(void **state)
{
	struct env *e = *state;
	struct proto_err err;
	char path[512];

	snprintf(path, sizeof(path), "%s/one.safetensors", e->dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	expect_same(e, path);
	snprintf(path, sizeof(path), "%s/hf", e->dir);
	tu_write_hf_checkpoint(path, &e->m, 0, (const void *const *)e->data);
	assert_true(proto_ckpt_is_hf_dir(path));
	expect_same(e, path);
	for (uint32_t n = 1; n <= 3; n++) {
		snprintf(path, sizeof(path), "%s/sharded%u", e->dir, n);
		tu_write_hf_checkpoint(path, &e->m, n, (const void *const *)e->data);
		assert_true(proto_ckpt_is_hf_dir(path));
		expect_same(e, path);
	}
	/* A directory that is none of these. */
	struct proto_ckpt ck;
	assert_int_not_equal(proto_ckpt_open(e->dir, &ck, &err), 0);
	assert_non_null(strstr(err.msg, "not a checkpoint directory"));
	assert_null(ck.shards);
}

/* A checkpoint file truncated after it was opened: a read past its new end
 * is one clear error (the mapping would have raised SIGBUS), a read before
 * it still works, and a range outside the tensor is refused. */
static void test_read_truncated_after_open(void **state)
{
	struct env *e = *state;
	struct proto_err err = {{0}};
	struct proto_ckpt ck;
	char path[512];
	uint8_t buf[64];

	snprintf(path, sizeof(path), "%s/cut.safetensors", e->dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	if (proto_ckpt_open(path, &ck, &err) != 0)
		fail_msg("%s", err.msg);
	int64_t c = proto_model_find(&ck.model, "c");
	assert_true(c >= 0);
	const struct proto_st *sh = &ck.shards[ck.shard_of[c]];
	uint64_t c_at = sh->offsets[ck.index_in[c]];
	/* The file now ends 3 bytes into tensor c. */
	assert_int_equal(truncate(path, (off_t)(c_at + 3)), 0);
	assert_int_equal(proto_ckpt_read(&ck, (uint32_t)c, 0, 3, buf, &err), 0);
	assert_memory_equal(buf, e->data[2], 3);
	assert_int_equal(proto_ckpt_read(&ck, (uint32_t)c, 0, 8, buf, &err), -EIO);
	assert_non_null(strstr(err.msg, "tensor 'c'"));
	assert_non_null(strstr(err.msg, "truncated"));
	char now[64];
	snprintf(now, sizeof(now), "is %llu bytes now", (unsigned long long)(c_at + 3));
	if (strstr(err.msg, now) == NULL) /* the file's real end, not where the read began */
		fail_msg("'%s' lacks '%s'", err.msg, now);
	assert_null(strchr(err.msg, '\n'));
	assert_int_equal(proto_ckpt_read(&ck, (uint32_t)c, 30, 4, buf, &err), -EINVAL);
	assert_int_equal(proto_ckpt_read(&ck, 7, 0, 1, buf, &err), -EINVAL);
	proto_ckpt_fini(&ck);
}

struct mem_src {
	const struct env *e;
};

static void mem_source(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct mem_src *s = arg;
	size_t es = proto_dtype_size(s->e->m.tensors[t].dtype);

	memcpy(out, s->e->data[t] + first * es, count * es);
}

/* A rank's block filled from the checkpoint by pread is the block the
 * layout fills from the tensors' bytes, for each rank of each layout; a
 * file cut short since it was opened fails the fill with -EIO. */
static void test_fill_rank(void **state)
{
	struct env *e = *state;
	struct proto_err err = {{0}};
	struct proto_ckpt ck;
	struct mem_src ms = {e};
	const char *names[] = {"tp1", "fsdp2"};
	char path[512];

	snprintf(path, sizeof(path), "%s/fill.safetensors", e->dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	if (proto_ckpt_open(path, &ck, &err) != 0)
		fail_msg("%s", err.msg);
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct proto_layout l;
		if (proto_layout_builtin(&e->m, names[k], &l, &err) != 0)
			fail_msg("%s: %s", names[k], err.msg);
		for (uint32_t r = 0; r < l.nranks; r++) {
			size_t n = l.ranks[r].nbytes;
			uint8_t *want = calloc(1, n + 1), *got = calloc(1, n + 1);
			assert_non_null(want);
			assert_non_null(got);
			proto_layout_fill_rank(&e->m, &l, r, mem_source, &ms, want);
			assert_int_equal(proto_ckpt_fill_rank(&ck, &e->m, NULL, &l, r, got, &err), 0);
			assert_memory_equal(got, want, n);
			free(want);
			free(got);
		}
		proto_layout_fini(&l);
	}
	struct proto_layout l;
	assert_int_equal(proto_layout_builtin(&e->m, "tp1", &l, &err), 0);
	uint8_t *block = calloc(1, l.ranks[0].nbytes + 1);
	assert_non_null(block);
	assert_int_equal(truncate(path, 100), 0);
	assert_int_equal(proto_ckpt_fill_rank(&ck, &e->m, NULL, &l, 0, block, &err), -EIO);
	assert_non_null(strstr(err.msg, "truncated"));
	free(block);
	proto_layout_fini(&l);
	proto_ckpt_fini(&ck);
}

static void test_model_dir_lists_versions(void **state)
{
	struct env *e = *state;
	struct proto_err err = {{0}};
	char dir[512], path[700], **paths;
	size_t n;

	snprintf(dir, sizeof(dir), "%s/versions", e->dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	/* v0 a file, v1 sharded, v10 a whole-file directory, and noise. */
	snprintf(path, sizeof(path), "%s/v0.safetensors", dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	snprintf(path, sizeof(path), "%s/v1", dir);
	tu_write_hf_checkpoint(path, &e->m, 2, (const void *const *)e->data);
	snprintf(path, sizeof(path), "%s/v10", dir);
	tu_write_hf_checkpoint(path, &e->m, 0, (const void *const *)e->data);
	snprintf(path, sizeof(path), "%s/notes.txt", dir);
	assert_int_equal(tu_write(path, "x"), 0);
	snprintf(path, sizeof(path), "%s/vx.safetensors", dir);
	assert_int_equal(tu_write(path, "x"), 0);
	if (proto_ckpt_dir_list(dir, &paths, &n, &err) != 0)
		fail_msg("%s", err.msg);
	assert_int_equal(n, 3);
	snprintf(path, sizeof(path), "%s/v0.safetensors", dir);
	assert_string_equal(paths[0], path);
	snprintf(path, sizeof(path), "%s/v1", dir);
	assert_string_equal(paths[1], path);
	snprintf(path, sizeof(path), "%s/v10", dir);
	assert_string_equal(paths[2], path);
	for (size_t i = 0; i < n; i++)
		expect_same(e, paths[i]);
	proto_ckpt_list_free(paths, n);

	/* A Hugging Face directory given as the model dir: one version. */
	snprintf(path, sizeof(path), "%s/v1", dir);
	assert_int_equal(proto_ckpt_dir_list(path, &paths, &n, &err), 0);
	assert_int_equal(n, 1);
	assert_string_equal(paths[0], path);
	proto_ckpt_list_free(paths, n);

	/* The same version twice, leading zeros, nothing at all. */
	snprintf(path, sizeof(path), "%s/v1.safetensors", dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	assert_int_not_equal(proto_ckpt_dir_list(dir, &paths, &n, &err), 0);
	assert_non_null(strstr(err.msg, "are version v1"));
	assert_null(paths);
	unlink(path);
	snprintf(path, sizeof(path), "%s/v02.safetensors", dir);
	assert_int_equal(proto_st_write(path, &e->m, NULL, (const void *const *)e->data, &err), 0);
	assert_int_not_equal(proto_ckpt_dir_list(dir, &paths, &n, &err), 0);
	assert_non_null(strstr(err.msg, "leading zeros"));
	snprintf(path, sizeof(path), "%s/empty", e->dir);
	assert_int_equal(mkdir(path, 0755), 0);
	assert_int_not_equal(proto_ckpt_dir_list(path, &paths, &n, &err), 0);
	assert_non_null(strstr(err.msg, "no v<N>"));
	snprintf(path, sizeof(path), "%s/missing", e->dir);
	assert_int_not_equal(proto_ckpt_dir_list(path, &paths, &n, &err), 0);
	assert_non_null(strstr(err.msg, "missing"));
}

/* Every tests/data/bad-ckpt-index-* beside good shards: refused, one line
 * naming a file, nothing left to free. */
static void test_bad_indexes(void **state)
{
	struct env *e = *state;
	char dir[512], data[512], src[1024], dst[700];
	DIR *d;
	struct dirent *de;
	int seen = 0;

	snprintf(dir, sizeof(dir), "%s/bad", e->dir);
	tu_write_hf_checkpoint(dir, &e->m, 2, (const void *const *)e->data);
	snprintf(dst, sizeof(dst), "%s/model.safetensors.index.json", dir);
	expect_same(e, dir); /* the good index first */
	tu_data(data, sizeof(data), "");
	d = opendir(data);
	assert_non_null(d);
	while ((de = readdir(d)) != NULL) {
		struct proto_ckpt ck;
		struct proto_err err = {{0}};
		if (strncmp(de->d_name, "bad-ckpt-index-", 15) != 0)
			continue;
		snprintf(src, sizeof(src), "%s/%s", data, de->d_name);
		assert_int_equal(tu_sh("cp %s %s", src, dst), 0);
		if (proto_ckpt_open(dir, &ck, &err) == 0)
			fail_msg("%s was accepted", de->d_name);
		print_message("%s: %s\n", de->d_name, err.msg);
		assert_null(strchr(err.msg, '\n'));
		assert_true(strstr(err.msg, ".safetensors") != NULL || strstr(err.msg, ".json") != NULL);
		assert_null(ck.shards);
		assert_int_equal(ck.model.ntensors, 0);
		seen++;
	}
	closedir(d);
	assert_true(seen >= 16);
}

int main(void)
{
	/* Before the first proto_param(): the huge index is over this cap. */
	setenv("TESSERA_SPEC_MAX", "65536", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_three_forms_agree, setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_truncated_after_open, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fill_rank, setup, teardown),
		cmocka_unit_test_setup_teardown(test_model_dir_lists_versions, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_indexes, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
