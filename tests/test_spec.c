/* Model spec and layout parsing: shorthands expand to the explicit form, and
 * every file of the bad-model-* / bad-layout-* corpus is refused with one
 * clear line naming the file. Also `tessera plan` end to end. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proto/proto.h"
#include "tests/testutil.h"

static void load_model(struct proto_model *m)
{
	char path[512];
	struct proto_err err;
	if (proto_model_load(tu_data(path, sizeof(path), "spec-model.json"), m, &err) != 0)
		fail_msg("%s", err.msg);
}

/* Runs fn on every tests/data file whose name starts with prefix. */
static int for_each_bad(const char *prefix, void (*fn)(const char *path, const char *name, void *),
			void *arg)
{
	char dir[512], path[1024];
	struct dirent *e;
	DIR *d = opendir(tu_data(dir, sizeof(dir), "."));
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		fn(path, e->d_name, arg);
		n++;
	}
	closedir(d);
	return n;
}

static void check_one_line(const struct proto_err *err, const char *name)
{
	if (strstr(err->msg, name) == NULL)
		fail_msg("error for %s does not name the file: %s", name, err->msg);
	assert_null(strchr(err->msg, '\n'));
}

static void bad_model(const char *path, const char *name, void *arg)
{
	struct proto_model m;
	struct proto_err err;
	int rc = proto_model_load(path, &m, &err);
	if (rc >= 0)
		fail_msg("%s was accepted", name);
	check_one_line(&err, name);
	/* Nothing left behind on failure. */
	assert_int_equal(m.ntensors, 0);
	assert_null(m.tensors);
}

static void bad_layout(const char *path, const char *name, void *arg)
{
	const struct proto_model *m = arg;
	struct proto_layout l;
	struct proto_err err;
	int rc = proto_layout_load(m, path, &l, &err);
	if (rc >= 0)
		fail_msg("%s was accepted", name);
	check_one_line(&err, name);
	assert_int_equal(l.nranks, 0);
	assert_null(l.ranks);
}

static void good_layout(const char *path, const char *name, void *arg)
{
	const struct proto_model *m = arg;
	struct proto_layout l;
	struct proto_err err;
	if (proto_layout_load(m, path, &l, &err) != 0)
		fail_msg("%s: %s", name, err.msg);
	proto_layout_fini(&l);
}

/* The fuzzer's seeds are valid layouts of spec-model.json. */
static void test_seed_layouts(void **state)
{
	struct proto_model m;
	load_model(&m);
	assert_true(for_each_bad("seed-layout-", good_layout, &m) >= 2);
	proto_model_fini(&m);
}

static void test_bad_models(void **state)
{
	assert_true(for_each_bad("bad-model-", bad_model, NULL) >= 8);
}

static void test_bad_layouts(void **state)
{
	struct proto_model m;
	load_model(&m);
	assert_true(for_each_bad("bad-layout-", bad_layout, &m) >= 30);
	proto_model_fini(&m);
}

static void digest_of(const struct proto_model *m, const char *json, uint8_t out[32])
{
	struct proto_layout l;
	struct proto_err err;
	if (proto_layout_parse(m, json, strlen(json), "layout", &l, &err) != 0)
		fail_msg("%s", err.msg);
	memcpy(out, l.digest, 32);
	proto_layout_fini(&l);
}

/* Each shorthand equals the explicit form it stands for. */
static void test_shorthand_expands(void **state)
{
	struct proto_model m;
	uint8_t a[32], b[32];
	struct proto_err err;

	const char *model = "{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]},"
			    "{\"name\":\"V\",\"dtype\":\"bf16\",\"shape\":[2,4]},"
			    "{\"name\":\"E\",\"dtype\":\"fp32\",\"shape\":[4,2]}]}";
	assert_int_equal(proto_model_parse(model, strlen(model), "m", &m, &err), 0);

	/* split */
	digest_of(&m, "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"split\":1}]}", a);
	digest_of(&m,
		  "{\"ranks\":[{\"tensors\":[{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[0,2]]}]},"
		  "{\"name\":\"V\",\"pieces\":[{\"tensor\":\"V\",\"box\":[[0,2],[0,2]]}]},"
		  "{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"box\":[[0,4],[0,1]]}]}]},"
		  "{\"tensors\":[{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[2,4]]}]},"
		  "{\"name\":\"V\",\"pieces\":[{\"tensor\":\"V\",\"box\":[[0,2],[2,4]]}]},"
		  "{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"box\":[[0,4],[1,2]]}]}]}]}",
		  b);
	assert_memory_equal(a, b, 32);
	/* fuse + split, replicate, experts (consecutive indices merge), flat */
	digest_of(&m,
		  "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"fuse\":[\"W\",\"V\"],\"name\":\"WV\",\"split\":0},"
		  "{\"tensor\":\"E\",\"experts\":[[3,0,1],[2]]}]}",
		  a);
	digest_of(&m,
		  "{\"ranks\":[{\"tensors\":[{\"name\":\"WV\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,2],[0,4]]},"
		  "{\"tensor\":\"V\",\"box\":[[0,1],[0,4]]}]},"
		  "{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"box\":[[3,4],[0,2]]},{\"tensor\":\"E\",\"box\":[[0,2],[0,2]]}]}]},"
		  "{\"tensors\":[{\"name\":\"WV\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[2,4],[0,4]]},"
		  "{\"tensor\":\"V\",\"box\":[[1,2],[0,4]]}]},"
		  "{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"box\":[[2,3],[0,2]]}]}]}]}",
		  b);
	assert_memory_equal(a, b, 32);
	digest_of(&m, "{\"ranks\":3,\"tensors\":[{\"tensor\":\"E\",\"flat\":true},{\"match\":\"*\",\"replicate\":true}]}", a);
	digest_of(&m,
		  "{\"ranks\":[{\"tensors\":[{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"flat\":[0,3]}]},"
		  "{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[0,4]]}]},"
		  "{\"name\":\"V\",\"pieces\":[{\"tensor\":\"V\",\"box\":[[0,2],[0,4]]}]}]},"
		  "{\"tensors\":[{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"flat\":[3,6]}]},"
		  "{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[0,4]]}]},"
		  "{\"name\":\"V\",\"pieces\":[{\"tensor\":\"V\",\"box\":[[0,2],[0,4]]}]}]},"
		  "{\"tensors\":[{\"name\":\"E\",\"pieces\":[{\"tensor\":\"E\",\"flat\":[6,8]}]},"
		  "{\"name\":\"W\",\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[0,4]]}]},"
		  "{\"name\":\"V\",\"pieces\":[{\"tensor\":\"V\",\"box\":[[0,2],[0,4]]}]}]}]}",
		  b);
	assert_memory_equal(a, b, 32);
	/* The explicit JSON form re-parses to the same layout. */
	struct proto_layout l, l2;
	const char *sh = "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"fuse\":[\"W\",\"V\"],\"name\":\"WV\",\"split\":0},"
			 "{\"tensor\":\"E\",\"flat\":true}]}";
	assert_int_equal(proto_layout_parse(&m, sh, strlen(sh), "l", &l, &err), 0);
	json_t *j = proto_layout_to_json(&m, &l);
	assert_int_equal(proto_layout_from_json(&m, j, "l2", &l2, &err), 0);
	assert_memory_equal(l.digest, l2.digest, 32);
	assert_int_equal(l.ranks[0].locals[0].shape[0], 3);
	assert_int_equal(l.ranks[0].locals[0].shape[1], 4);
	json_decref(j);
	proto_layout_fini(&l);
	proto_layout_fini(&l2);
	proto_model_fini(&m);
}

static void test_model_basics(void **state)
{
	struct proto_model m, m2;
	struct proto_err err;
	const char *a = "{\"tensors\":[{\"name\":\"b\",\"dtype\":\"BF16\",\"shape\":[3,5]},{\"name\":\"a\",\"dtype\":\"i64\",\"shape\":[]}]}";
	const char *b = "{\"tensors\":[{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[3,5]},{\"name\":\"a\",\"dtype\":\"I64\",\"shape\":[]}]}";

	assert_int_equal(proto_model_parse(a, strlen(a), "a", &m, &err), 0);
	assert_int_equal(proto_model_parse(b, strlen(b), "b", &m2, &err), 0);
	assert_memory_equal(m.digest, m2.digest, 32);
	assert_int_equal(proto_model_find(&m, "a"), 1);
	assert_int_equal(proto_model_find(&m, "b"), 0);
	assert_int_equal(proto_model_find(&m, "c"), -1);
	assert_int_equal(m.tensors[0].nbytes, 30);
	assert_int_equal(m.tensors[1].nbytes, 8);
	assert_int_equal(proto_model_bytes(&m), 38);
	proto_model_fini(&m);
	proto_model_fini(&m2);
}

/* `tessera plan` prints the reference example, and refuses bad input with a
 * one-line error and a non-zero status. */
static void test_cli(void **state)
{
	char bin[512], model[512], tr[512], tp[512], bad[512], dir[256], out[600];
	uint8_t *buf;
	size_t len;
	struct proto_err err;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	tu_bin(bin, sizeof(bin), "tessera");
	tu_data(model, sizeof(model), "plan/w4x4-model.json");
	tu_data(tr, sizeof(tr), "plan/w4x4-trainer.json");
	tu_data(tp, sizeof(tp), "plan/w4x4-tp2.json");
	snprintf(out, sizeof(out), "%s/out", dir);
	assert_int_equal(tu_sh("%s plan --model %s --from %s --to %s --json > %s", bin, model, tr, tp, out), 0);
	assert_int_equal(proto_read_file(out, 1 << 20, &buf, &len, &err), 0);
	assert_non_null(strstr((char *)buf, "\"runs\":[[0,8,4],[8,12,4]]"));
	assert_non_null(strstr((char *)buf, "\"retained_bytes\":32,\"mapped_bytes\":32,\"broadcast_bytes\":64"));
	free(buf);
	tu_data(bad, sizeof(bad), "bad-layout-overlap.json");
	assert_int_equal(tu_sh("%s plan --model %s --from %s --to %s > %s 2>&1", bin,
			       tu_data(model, sizeof(model), "spec-model.json"), bad, tp, out), 1);
	assert_int_equal(proto_read_file(out, 1 << 20, &buf, &len, &err), 0);
	assert_non_null(strstr((char *)buf, "bad-layout-overlap.json"));
	assert_ptr_equal(strchr((char *)buf, '\n'), (char *)buf + len - 1);
	free(buf);
	assert_int_equal(tu_sh("%s plan --model %s > /dev/null 2>&1", bin, model), 2);
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model_basics),
		cmocka_unit_test(test_bad_models),
		cmocka_unit_test(test_bad_layouts),
		cmocka_unit_test(test_seed_layouts),
		cmocka_unit_test(test_shorthand_expands),
		cmocka_unit_test(test_cli),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
