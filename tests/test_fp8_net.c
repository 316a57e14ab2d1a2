/* FP8 serving end to end with the real programs on loopback: a BF16 and an
 * FP8 replica of the same model through anchors and deltas, every FP8 rank
 * bit-exact; the quantized bytes equal the numpy reference's on the
 * version's own tensors; a NaN in a quantized tensor fails its version's
 * export, naming the tensor, while the replicas serve the last one. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "node/cli/proc.h"
#include "proto/checkpoint.h"
#include "proto/fp8.h"
#include "proto/proto.h"
#include "tests/fp8test.h"
#include "tests/testcluster.h"
#include "tests/testutil.h"

#define VERSIONS 5

/* Bytes of the replica's rank r in a cluster report's version v. */
static json_t *report_replica(json_t *v, const char *name)
{
	size_t k;
	json_t *r;

	json_array_foreach(json_object_get(v, "replicas"), k, r)
		if (strcmp(json_string_value(json_object_get(r, "replica")), name) == 0)
			return r;
	return NULL;
}

static json_int_t replica_bytes(json_t *r)
{
	return json_integer_value(json_object_get(r, "bytes_from_trainer")) +
	       json_integer_value(json_object_get(r, "bytes_from_peers"));
}

/* The reference quantizer (tests/py/fp8_ref.py) on every quantized tensor
 * of checkpoint path agrees with the publisher's (proto_fp8 through
 * proto_layout_fp8_fill, which the cluster checked each FP8 rank's bytes
 * against). */
static void check_against_reference(const char *dir, const char *path, const struct proto_layout *l)
{
	const char *py = tu_python();
	struct proto_ckpt ck;
	struct proto_err err;
	char ref[600];

	if (py == NULL) {
		print_message("the numpy comparison needs TESSERA_PYTHON (make test sets it)\n");
		return;
	}
	assert_int_equal(proto_ckpt_open(path, &ck, &err), 0);
	tu_src(ref, sizeof(ref), "tests/py/fp8_ref.py");
	for (uint32_t t = 0; t < l->nbase; t++) {
		const struct proto_tensor *x = &ck.model.tensors[t];
		if (l->model->tensors[t].dtype != PROTO_DT_FP8_E4M3)
			continue;
		uint64_t nb = proto_fp8_blocks(x->shape[0]) * proto_fp8_blocks(x->shape[1]), bad;
		uint8_t *in = malloc(x->nbytes), *q = malloc(x->nelem), *rq = malloc(x->nelem);
		float *s = malloc(nb * 4), *rs = malloc(nb * 4);
		char fin[600], fq[600], fs[600];
		assert_int_equal(proto_ckpt_read(&ck, t, 0, x->nbytes, in, &err), 0);
		for (uint64_t br = 0; br < proto_fp8_blocks(x->shape[0]); br++)
			assert_int_equal(proto_fp8_quantize_rows(in, x->shape[0], x->shape[1], br, q, s, &bad), 0);
		snprintf(fin, sizeof(fin), "%s/t.bf16", dir);
		snprintf(fq, sizeof(fq), "%s/t.fp8", dir);
		snprintf(fs, sizeof(fs), "%s/t.scale", dir);
		FILE *f = fopen(fin, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(in, 1, x->nbytes, f), x->nbytes);
		fclose(f);
		assert_int_equal(tu_sh("%s %s %llu %llu %s %s %s", py, ref, (unsigned long long)x->shape[0],
				       (unsigned long long)x->shape[1], fin, fq, fs),
				 0);
		f = fopen(fq, "rb");
		assert_non_null(f);
		assert_int_equal(fread(rq, 1, x->nelem, f), x->nelem);
		fclose(f);
		f = fopen(fs, "rb");
		assert_non_null(f);
		assert_int_equal(fread(rs, 4, nb, f), nb);
		fclose(f);
		if (memcmp(q, rq, x->nelem) != 0 || memcmp(s, rs, nb * 4) != 0)
			fail_msg("%s: tessera's FP8 differs from the numpy reference", x->name);
		free(in);
		free(q);
		free(rq);
		free(s);
		free(rs);
	}
	proto_ckpt_fini(&ck);
}

/* `tessera cluster` with tp2 (BF16), tp2:fp8 and a late tp1:fp8 over five
 * versions, an anchor then deltas: every rank of every replica holds the
 * bytes the launcher computes (for FP8: the version's BF16 quantized), an
 * FP8 anchor costs about half the BF16 one, an FP8 delta no more than the
 * BF16 delta of the same step. */
static void test_fp8_cluster(void **state)
{
	char dir[256], mdir[300], bin[512], report[512], path[600];
	struct proto_model m;
	struct proto_layout l8;
	struct proto_err err;

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	fp8t_model(&m, false);
	assert_int_equal(fp8t_versions(&m, mdir, VERSIONS, 0), 0);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(report, sizeof(report), "%s/report.json", dir);
	assert_int_equal(tu_sh("TESSERA_CHUNK_SIZE=65536 %s cluster --model-dir %s --versions %d "
			       "--anchor-every 8 --replica tp2 --replica tp2:fp8 --late-replica tp1:fp8 "
			       "--report %s > %s/out 2>&1 || cat %s/out",
			       bin, mdir, VERSIONS, report, dir, dir),
			 0);
	json_t *j = tu_load_json(report), *vs = json_object_get(j, "versions");
	assert_true(json_is_true(json_object_get(j, "ok")));
	assert_int_equal(json_array_size(vs), VERSIONS);
	for (size_t i = 0; i < VERSIONS; i++) {
		json_t *v = json_array_get(vs, i), *r;
		size_t k;
		assert_string_equal(json_string_value(json_object_get(v, "kind")), i == 0 ? "anchor" : "delta");
		json_array_foreach(json_object_get(v, "replicas"), k, r) {
			assert_true(json_is_true(json_object_get(r, "digest_ok")));
			assert_false(json_is_false(json_object_get(r, "canary_ok")));
		}
		json_t *bf = report_replica(v, "A"), *f8 = report_replica(v, "B");
		assert_non_null(bf);
		assert_non_null(f8);
		if (i == 0) /* projections are 3/4 of the model here: ~0.62 of its bytes */
			assert_true(replica_bytes(f8) * 100 < replica_bytes(bf) * 65);
		else
			assert_true(replica_bytes(f8) <= replica_bytes(bf));
	}
	/* The late tp1:fp8 replica reached the last version. */
	json_t *late = report_replica(json_array_get(vs, VERSIONS - 1), "C");
	assert_non_null(late);
	assert_true(json_is_true(json_object_get(late, "activated")));
	json_decref(j);
	/* The numpy reference on the last version's tensors. */
	assert_int_equal(proto_layout_builtin(&m, "tp2:fp8", &l8, &err), 0);
	snprintf(path, sizeof(path), "%s/v%d.safetensors", mdir, VERSIONS);
	check_against_reference(dir, path, &l8);
	proto_layout_fini(&l8);
	proto_model_fini(&m);
	tu_rmtree(dir);
}

static bool file_has(const char *path, const char *s)
{
	struct proto_err err;
	uint8_t *buf;
	size_t len;
	bool has;

	if (proto_read_file(path, 64 << 20, &buf, &len, &err) != 0)
		return false;
	has = memmem(buf, len, s, strlen(s)) != NULL;
	free(buf);
	return has;
}

/* Pieces by hand, versions on the publisher's clock: v3 holds a NaN in a
 * quantized tensor; its export fails in one line naming the tensor and the
 * element, and both replicas (BF16 and FP8) keep serving v2. */
static void test_fp8_nan_fails_the_version(void **state)
{
	char dir[256], mdir[300], url[256], key[512], pub[512], model[600], expose[600],
		state_dir[600], bin[512], log[600], att0[600], att1[600], ck[600], script[600];
	struct node_proc tracker = {0}, publisher = {0}, nodes[4] = {{0}};
	struct trk_client *trk = NULL;
	struct proto_model m;
	struct proto_err err;

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	snprintf(model, sizeof(model), "%s/model.json", dir);
	snprintf(expose, sizeof(expose), "%s/expose", dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	assert_int_equal(mkdir(expose, 0755), 0);
	fp8t_model(&m, false);
	assert_int_equal(fp8t_versions(&m, mdir, 3, 3), 0);
	tu_write_model(&m, model);
	tu_trainer_keys(key, sizeof(key), pub, sizeof(pub));
	tu_start_tracker(&tracker, dir, state_dir, pub, url, sizeof(url));
	assert_int_equal(trk_client_new(NULL, url, NULL, &trk, &err), 0);
	tu_start_node(&nodes[0], dir, url, "A", "0", "tp2", model, pub, expose, NULL, "node-A0");
	tu_start_node(&nodes[1], dir, url, "A", "1", "tp2", model, pub, expose, NULL, "node-A1");
	snprintf(att0, sizeof(att0), "%s/B-0.sock", dir);
	snprintf(att1, sizeof(att1), "%s/B-1.sock", dir);
	tu_start_node(&nodes[2], dir, url, "B", "0", "tp2:fp8", model, pub, expose, att0, "node-B0");
	tu_start_node(&nodes[3], dir, url, "B", "1", "tp2:fp8", model, pub, expose, att1, "node-B1");
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", dir);
	char *argv[] = {bin, "publish", "--tracker", url, "--key", key, "--model-dir", mdir,
			"--layout", "fsdp2", "--every", "300", NULL};
	assert_int_equal(node_proc_spawn(&publisher, "publisher", argv, log), 0);
	/* Nodes register once the publisher has. */
	assert_true(tu_wait_alive(trk, "A", 2, 30000) && tu_wait_alive(trk, "B", 2, 30000));
	assert_true(tu_wait_active(trk, "A", 2, 60000));
	assert_true(tu_wait_active(trk, "B", 2, 60000));
	for (int w = 0; w < 60000 && !file_has(log, "is NaN; it cannot be quantized"); w += 100)
		usleep(100000);
	assert_true(file_has(log, "tensor model.layers.0.self_attn.q_proj.weight: element [3, 232] is NaN; "
				  "it cannot be quantized to FP8 (fp8_e4m3_block128)"));
	/* The activation record names each FP8 tensor's scales. */
	char rec[700];
	snprintf(rec, sizeof(rec), "%s/B-0.json", expose);
	json_t *xr = tu_load_json(rec), *xt;
	size_t xi, nscale = 0;
	assert_non_null(xr);
	json_array_foreach(json_object_get(xr, "locals"), xi, xt) {
		const char *sn = json_string_value(json_object_get(xt, "scale"));
		const char *dt = json_string_value(json_object_get(xt, "dtype"));
		assert_true((sn != NULL) == (strcmp(dt, "fp8_e4m3") == 0));
		nscale += sn != NULL;
	}
	assert_int_equal(nscale, 4); /* qkv, o, gate_up, down */
	json_decref(xr);
	/* The tracker says which replica serves FP8, and in which layout. */
	json_t *rb = tu_get_json(trk, TRK_API "/replicas/B"), *ra = tu_get_json(trk, TRK_API "/replicas/A");
	assert_non_null(rb);
	assert_non_null(ra);
	assert_string_equal(json_string_value(json_object_get(rb, "layout_name")), "tp2:fp8");
	assert_string_equal(json_string_value(json_object_get(rb, "transform")), "fp8_e4m3_block128");
	assert_true(json_is_null(json_object_get(ra, "transform")));
	json_decref(ra);
	json_decref(rb);
	/* Each FP8 rank, read through the attach API (the Python client), holds
	 * the numpy reference's quantization of v2, byte for byte. */
	const char *py = tu_python();
	snprintf(ck, sizeof(ck), "%s/v2.safetensors", mdir);
	tu_src(script, sizeof(script), "tests/py/attach_fp8.py");
	if (py == NULL) {
		print_message("the attach check needs TESSERA_PYTHON (make test sets it)\n");
	} else {
		assert_int_equal(tu_sh("%s %s %s B 0 2 %s", py, script, att0, ck), 0);
		assert_int_equal(tu_sh("%s %s %s B 1 2 %s", py, script, att1, ck), 0);
	}
	/* Some ticks later nothing moved. */
	usleep(1500000);
	assert_int_equal(tu_replica_active(trk, "A"), 2);
	assert_int_equal(tu_replica_active(trk, "B"), 2);
	assert_true(node_proc_alive(&publisher));
	tu_cluster_down(nodes, 4, &publisher, trk, &tracker, &m, dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fp8_cluster),
		cmocka_unit_test(test_fp8_nan_fails_the_version),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
