/* End to end with the real programs on loopback: `tessera cluster` runs to a
 * report with "ok":true, and a publisher killed mid-transfer leaves the
 * replica on its previous version until a restarted publisher serves again. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "node/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/ckpt_util.h"

static void test_cluster_report(void **state)
{
	char dir[256], bin[512], report[512];
	uint8_t *buf;
	size_t len;
	struct proto_err err;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(report, sizeof(report), "%s/report.json", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s cluster --synthetic-mb 4 --versions 2 --replica tp2 --replica tp1 "
			       "--report %s > %s/out 2>&1 || cat %s/out",
			       bin, report, dir, dir),
			 0);
	assert_int_equal(proto_read_file(report, 1 << 20, &buf, &len, &err), 0);
	json_t *j = json_loadb((char *)buf, len, 0, NULL);
	free(buf);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_t *vs = json_object_get(j, "versions");
	assert_int_equal(json_array_size(vs), 2);
	for (size_t i = 0; i < 2; i++) {
		json_t *v = json_array_get(vs, i);
		assert_int_equal(json_integer_value(json_object_get(v, "version")), (json_int_t)i + 1);
		assert_string_equal(json_string_value(json_object_get(v, "kind")), "anchor");
		assert_true(json_integer_value(json_object_get(v, "payload_bytes")) > 0);
		assert_true(json_integer_value(json_object_get(v, "trainer_upload_bytes")) > 0);
		json_t *reps = json_object_get(v, "replicas");
		assert_int_equal(json_array_size(reps), 2);
		for (size_t r = 0; r < 2; r++) {
			json_t *re = json_array_get(reps, r);
			assert_true(json_is_true(json_object_get(re, "activated")));
			assert_true(json_is_true(json_object_get(re, "digest_ok")));
		}
		/* The tracker's timeline of the update: the publisher's snapshot,
		 * and for every rank its first and last byte and verification,
		 * in order, before its replica's activation. */
		json_t *tl = json_object_get(v, "timeline");
		assert_non_null(tl);
		json_int_t asked = json_integer_value(json_object_get(tl, "export_asked_ms"));
		json_int_t snap = json_integer_value(json_object_get(tl, "snapshot_ms"));
		json_int_t pub = json_integer_value(json_object_get(tl, "published_ms"));
		assert_true(asked > 0 && snap >= asked && pub >= snap);
		json_t *tr = json_object_get(tl, "replicas");
		assert_int_equal(json_array_size(tr), 2);
		for (size_t r = 0; r < 2; r++) {
			json_t *re = json_array_get(tr, r), *rk;
			json_int_t act = json_integer_value(json_object_get(re, "activated_ms"));
			size_t k;
			assert_int_equal(json_array_size(json_object_get(re, "ranks")),
					 json_integer_value(json_object_get(re, "nranks")));
			json_array_foreach(json_object_get(re, "ranks"), k, rk) {
				json_int_t first = json_integer_value(json_object_get(rk, "first_byte_ms"));
				json_int_t last = json_integer_value(json_object_get(rk, "last_byte_ms"));
				json_int_t ver = json_integer_value(json_object_get(rk, "verified_ms"));
				assert_true(first >= pub && last >= first && ver >= last && act >= ver);
			}
		}
	}
	json_decref(j);
	tu_rmtree(dir);
}

/* A model dir of Hugging Face sharded checkpoints, v1/ and v2/ (three
 * shards each, with their index), published by `tessera cluster
 * --model-dir`: every replica activates each version and every rank's bytes
 * equal the checkpoint's (the cluster compares them itself). */
static void test_cluster_sharded_checkpoints(void **state)
{
	char dir[256], mdir[300], vdir[320], bin[512], report[512];
	struct proto_model m;
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	assert_int_equal(proto_fixture_model(4 << 20, &m, &err), 0);
	for (uint64_t v = 1; v <= 2; v++) {
		const void **data = calloc(m.ntensors, sizeof(*data));
		assert_non_null(data);
		for (uint32_t t = 0; t < m.ntensors; t++) {
			uint8_t *b = malloc(m.tensors[t].nbytes);
			assert_non_null(b);
			proto_fixture_fill(&m, 99, v, t, 0, m.tensors[t].nelem, b);
			data[t] = b;
		}
		snprintf(vdir, sizeof(vdir), "%s/v%llu", mdir, (unsigned long long)v);
		tu_write_hf_checkpoint(vdir, &m, 3, data);
		for (uint32_t t = 0; t < m.ntensors; t++)
			free((void *)data[t]);
		free(data);
	}
	proto_model_fini(&m);
	assert_int_equal(tu_sh("test -f %s/v2/model-00003-of-00003.safetensors", mdir), 0);
	snprintf(report, sizeof(report), "%s/report.json", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s cluster --model-dir %s --versions 2 --replica tp2 --replica tp1 "
			       "--report %s > %s/out 2>&1 || cat %s/out",
			       bin, mdir, report, dir, dir),
			 0);
	assert_int_equal(proto_read_file(report, 1 << 20, &buf, &len, &err), 0);
	json_t *j = json_loadb((char *)buf, len, 0, NULL);
	free(buf);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_t *vs = json_object_get(j, "versions");
	assert_int_equal(json_array_size(vs), 2);
	for (size_t i = 0; i < 2; i++) {
		json_t *reps = json_object_get(json_array_get(vs, i), "replicas");
		assert_int_equal(json_array_size(reps), 2);
		for (size_t r = 0; r < 2; r++) {
			json_t *re = json_array_get(reps, r);
			assert_true(json_is_true(json_object_get(re, "activated")));
			assert_true(json_is_true(json_object_get(re, "digest_ok")));
		}
	}
	json_decref(j);
	tu_rmtree(dir);
}

struct kill_env {
	char dir[256], url[256], sock[512], expose[512], model[512], key[512], pub[512];
	struct node_proc tracker, node, publisher;
	struct trk_client *trk;
	struct proto_model m;
	struct proto_layout tp1;
};

static void start_publisher(struct kill_env *e)
{
	char bin[512], log[600];
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	unlink(e->sock);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", "8",
			"--seed", "7", "--layout", "fsdp2", "--control", e->sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
}

static int control(struct kill_env *e, const char *cmd, char *reply, size_t len)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = -1;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", e->sock);
	for (int i = 0; i < 300; i++) {
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		close(fd);
		fd = -1;
		usleep(50000);
	}
	if (fd < 0)
		return -1;
	if (write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
		close(fd);
		return -1;
	}
	size_t n = 0;
	while (n + 1 < len && read(fd, reply + n, 1) == 1 && reply[n] != '\n')
		n++;
	reply[n] = 0;
	close(fd);
	return 0;
}

static uint64_t active_of(struct kill_env *e)
{
	struct trk_reply r;
	uint64_t v = 0;
	if (trk_client_call(e->trk, "GET", TRK_API "/replicas/A", NULL, NULL, 0, &r) == 0 &&
	    r.status == 200)
		v = (uint64_t)json_integer_value(json_object_get(r.json, "active"));
	trk_reply_fini(&r);
	return v;
}

static bool wait_active(struct kill_env *e, uint64_t v, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		if (active_of(e) == v)
			return true;
		usleep(50000);
	}
	return false;
}

/* True once the node reported some but not all of v's bytes. */
static bool wait_fetching(struct kill_env *e, uint64_t v, int ms)
{
	for (int w = 0; w < ms; w += 20) {
		struct trk_reply r;
		bool mid = false;
		if (trk_client_call(e->trk, "GET", TRK_API "/replicas/A", NULL, NULL, 0, &r) == 0 &&
		    r.status == 200) {
			json_t *rk = json_array_get(json_object_get(r.json, "ranks"), 0);
			uint64_t done = (uint64_t)json_integer_value(json_object_get(rk, "bytes_done"));
			uint64_t total = (uint64_t)json_integer_value(json_object_get(rk, "bytes_total"));
			mid = (uint64_t)json_integer_value(json_object_get(rk, "version")) == v &&
			      done > 0 && done < total;
		}
		trk_reply_fini(&r);
		if (mid)
			return true;
		usleep(20000);
	}
	return false;
}

/* The node serves exactly v's bytes (checked here, not taken from it). */
static void check_serving(struct kill_env *e, uint64_t v)
{
	char path[600];
	uint8_t *buf;
	size_t len, n = e->tp1.ranks[0].nbytes;
	struct proto_err err;

	snprintf(path, sizeof(path), "%s/A-0.json", e->expose);
	assert_int_equal(proto_read_file(path, 1 << 20, &buf, &len, &err), 0);
	json_t *j = json_loadb((char *)buf, len, 0, NULL);
	free(buf);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	int fd = open(json_string_value(json_object_get(j, "memfd_path")), O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0), *expect = malloc(n);
	assert_true(m != MAP_FAILED);
	proto_fixture_fill_rank(&e->m, &e->tp1, 0, 7, v, expect);
	assert_memory_equal(m, expect, n);
	free(expect);
	munmap(m, n);
	close(fd);
	json_decref(j);
}

static int kill_setup(void **state)
{
	*state = calloc(1, sizeof(struct kill_env));
	return *state == NULL;
}

/* Runs even when the test failed: no child outlives it. */
static int kill_teardown(void **state)
{
	struct kill_env *e = *state;
	if (e->publisher.pid > 0)
		kill(e->publisher.pid, SIGCONT); /* a stopped one cannot take SIGTERM */
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	proto_layout_fini(&e->tp1);
	proto_model_fini(&e->m);
	if (e->dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_FETCH_MBPS");
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_STALL_MS");
	free(e);
	return 0;
}

/* Tracker, one tp1 node and the publisher on loopback, v1 active on the
 * node, v2 exported and the node part-way through it. Small chunks and a
 * 32 Mbit/s fetch cap: 8 MiB take about two seconds, so what the caller
 * does next lands mid-transfer. */
static void start_mid_v2(struct kill_env *e)
{
	char bin[512], line[512], log[600], state_dir[600], buf[512];
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_FETCH_MBPS", "32", 1);
	setenv("TESSERA_LEASE_MS", "2000", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->sock, sizeof(e->sock), "%s/ctl.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	snprintf(e->key, sizeof(e->key), "%s", tu_data(buf, sizeof(buf), "test-trainer.key"));
	snprintf(e->pub, sizeof(e->pub), "%s", tu_data(buf, sizeof(buf), "test-trainer.pub"));
	mkdir(e->expose, 0755);
	assert_int_equal(proto_fixture_model(8 << 20, &e->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "tp1", &e->tp1, &err), 0);
	json_t *mj = proto_model_to_json(&e->m);
	char *txt = json_dumps(mj, 0);
	assert_int_equal(proto_write_file_atomic(e->model, txt, strlen(txt), 0644, &err), 0);
	free(txt);
	json_decref(mj);

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(log, sizeof(log), "%s/tracker.log", e->dir);
	char *targv[] = {bin, "--listen", "127.0.0.1:0", "--state", state_dir, "--trainer-pubkey", e->pub, NULL};
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", targv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line), 10000), 0);
	snprintf(e->url, sizeof(e->url), "%s", line);
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node.log", e->dir);
	char *nargv[] = {bin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout", "tp1",
			 "--model", e->model, "--trainer-pubkey", e->pub, "--expose", e->expose,
			 "--store", "host", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, log), 0);
	start_publisher(e);

	/* v1 everywhere. */
	assert_int_equal(control(e, "export\n", line, sizeof(line)), 0);
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);
	assert_true(wait_active(e, 1, 30000));
	check_serving(e, 1);

	/* v2 is announced and on its way. */
	assert_int_equal(control(e, "export\n", line, sizeof(line)), 0);
	assert_int_equal(strncmp(line, "published 2 ", 12), 0);
	assert_true(wait_fetching(e, 2, 10000));
}

static void test_publisher_killed_mid_transfer(void **state)
{
	struct kill_env *e = *state;
	char line[512];

	start_mid_v2(e);
	/* v2's only source dies. */
	node_proc_kill(&e->publisher);
	sleep(3);
	assert_int_equal(active_of(e), 1);
	check_serving(e, 1);
	assert_true(node_proc_alive(&e->node));

	/* The publisher is back: it serves v2 again and the node finishes. */
	start_publisher(e);
	assert_true(wait_active(e, 2, 60000));
	check_serving(e, 2);

	assert_int_equal(control(e, "quit\n", line, sizeof(line)), 0);
}

/* True once the node's log holds s. */
static bool log_has(struct kill_env *e, const char *s)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	bool found;

	if (proto_read_file(e->node.log, 64 << 20, &buf, &len, &err) != 0)
		return false;
	found = memmem(buf, len, s, strlen(s)) != NULL;
	free(buf);
	return found;
}

/* A source that hangs without an error (its process stopped: connections
 * stay open, reads never complete) is declared stalled after
 * TESSERA_STALL_MS, set aside and tried again; the node keeps serving v1
 * meanwhile and finishes v2 once the source answers again. */
static void test_publisher_stalled_mid_transfer(void **state)
{
	struct kill_env *e = *state;
	char line[512];

	setenv("TESSERA_STALL_MS", "400", 1);
	start_mid_v2(e);
	assert_int_equal(kill(e->publisher.pid, SIGSTOP), 0);
	for (int w = 0; w < 10000 && !log_has(e, "stalled: nothing received"); w += 50)
		usleep(50000);
	assert_true(log_has(e, "stalled: nothing received"));
	assert_int_equal(active_of(e), 1);
	check_serving(e, 1);
	assert_true(node_proc_alive(&e->node));

	assert_int_equal(kill(e->publisher.pid, SIGCONT), 0);
	assert_true(wait_active(e, 2, 60000));
	check_serving(e, 2);
	assert_int_equal(control(e, "quit\n", line, sizeof(line)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_report),
		cmocka_unit_test(test_cluster_sharded_checkpoints),
		cmocka_unit_test_setup_teardown(test_publisher_killed_mid_transfer, kill_setup,
						kill_teardown),
		cmocka_unit_test_setup_teardown(test_publisher_stalled_mid_transfer, kill_setup,
						kill_teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
