/* End to end with the real programs on loopback: `tessera cluster` runs to a
 * report with "ok":true, a publisher killed mid-transfer leaves the replica
 * on its previous version until a restarted publisher serves again, a star
 * under congestion asks for nothing twice, a late replica activates the
 * current version, and with versions published on the trainer's own clock
 * replicas stay consistent, live and bounded; versions after the first
 * fault no new pages in the publisher's or the node's buffers. */
#include <dirent.h>
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

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"
#include "tests/ckpt_util.h"

/* Runs `tessera cluster ARGS --report DIR/report.json` (its output shown
 * when it fails) and returns the report. */
static json_t *run_cluster(const char *dir, const char *args)
{
	char bin[512], report[512];

	snprintf(report, sizeof(report), "%s/report.json", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s cluster %s --report %s > %s/out 2>&1 || cat %s/out", bin, args,
			       report, dir, dir),
			 0);
	json_t *j = tu_load_json(report);
	assert_non_null(j);
	return j;
}

static void test_cluster_report(void **state)
{
	char dir[256];

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	json_t *j = run_cluster(dir, "--synthetic-mb 4 --versions 2 --replica tp2 --replica tp1");
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

/* The page faults a log gives for version v: the publisher's line
 * "published vV ... N page faults)" or a node's "vV active (... N page
 * faults in the process ...)"; -1 when the line is missing. */
static long long version_faults(const char *log, unsigned v, bool publisher)
{
	char line[2048], want[64];
	long long n = -1;
	FILE *f = fopen(log, "r");

	assert_non_null(f);
	snprintf(want, sizeof(want), publisher ? "published v%u " : ": v%u active (", v);
	while (fgets(line, sizeof(line), f) != NULL) {
		const char *at = strstr(line, want), *pf = strstr(line, " page faults");
		if (at == NULL || pf == NULL)
			continue;
		while (pf > line && pf[-1] >= '0' && pf[-1] <= '9')
			pf--;
		n = strtoll(pf, NULL, 10);
	}
	fclose(f);
	return n;
}

/*
 * Memory made once: with 4 KiB pages (every first touch of a page is a
 * fault), the first version faults in the publisher's snapshot block and
 * export buffer; the second and third reuse them or buffers made ahead
 * off the export's path, and the node fetches the second into the slot it
 * made at start, with its read buffers made once: a version after the
 * first faults fewer than a tenth of the model's pages in either process
 * (the few left are small allocations). Versions are anchors, the case
 * that copies every byte.
 */
static void test_cluster_buffers_made_once(void **state)
{
	char dir[256], keep[300], log[400];
	const long long pages = (32ll << 20) / 4096;

	(void)state;
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(keep, sizeof(keep), "%s/run", dir);
	setenv("TESSERA_HUGE_PAGES", "0", 1);
	setenv("TESSERA_LOG", "info", 1);
	char args[512];
	snprintf(args, sizeof(args), "--synthetic-mb 32 --versions 3 --anchor-every 1 "
		 "--trainer-ranks 1 --replica tp1 --keep %s", keep);
	json_t *j = run_cluster(dir, args);
	unsetenv("TESSERA_HUGE_PAGES");
	unsetenv("TESSERA_LOG");
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	snprintf(log, sizeof(log), "%s/publisher.log", keep);
	long long p1 = version_faults(log, 1, true);
	/* The count sees the buffers: the first version faults them in. */
	assert_true(p1 >= pages);
	for (unsigned v = 2; v <= 3; v++) {
		long long pv = version_faults(log, v, true);
		if (pv < 0 || pv >= pages / 10)
			fail_msg("publisher: v%u took %lld page faults (v1 %lld, the model %lld pages)",
				 v, pv, p1, pages);
	}
	snprintf(log, sizeof(log), "%s/node-A-0.log", keep);
	long long n2 = version_faults(log, 2, false);
	if (n2 < 0 || n2 >= pages / 10)
		fail_msg("node: v2 took %lld page faults (the model %lld pages)", n2, pages);
	tu_rmtree(dir);
}

/* A model dir of Hugging Face sharded checkpoints, v1/ and v2/ (three
 * shards each, with their index), published by `tessera cluster
 * --model-dir`: every replica activates each version and every rank's bytes
 * equal the checkpoint's (the cluster compares them itself). */
static void test_cluster_sharded_checkpoints(void **state)
{
	char dir[256], mdir[300], vdir[320];
	struct proto_model m;
	struct proto_err err;

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
	char args[1024];
	snprintf(args, sizeof(args), "--model-dir %s --versions 2 --replica tp2 --replica tp1", mdir);
	json_t *j = run_cluster(dir, args);
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

/*
 * A star (--mode star: nodes never fetch from peers) where reads far
 * outnumber what the one source carries: four TP1 replicas, each keeping up
 * to 64 reads of 256 KiB chunks in flight at the publisher, against a
 * 100 ms TESSERA_STALL_MS. A source that falls silent has nowhere else to
 * send its reads, so they stay where they are: nothing is received twice
 * or asked for again, no byte comes from a peer, the trainer sends exactly
 * one copy per replica, and every rank ends bit-exact.
 */
static void test_cluster_star_congested(void **state)
{
	char dir[256];

	setenv("TESSERA_CHUNK_SIZE", "262144", 1);
	setenv("TESSERA_INFLIGHT", "64", 1);
	setenv("TESSERA_FETCH_TARGET_MS", "10000", 1);
	setenv("TESSERA_STALL_MS", "100", 1);
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	json_t *j = run_cluster(dir, "--mode star --synthetic-mb 16 --versions 2 --replica tp1 "
				     "--replica tp1 --replica tp1 --replica tp1");
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_INFLIGHT");
	unsetenv("TESSERA_FETCH_TARGET_MS");
	unsetenv("TESSERA_STALL_MS");
	assert_true(json_is_true(json_object_get(j, "ok")));
	assert_string_equal(json_string_value(json_object_get(j, "mode")), "star");
	json_t *vs = json_object_get(j, "versions"), *v;
	size_t i;
	assert_int_equal(json_array_size(vs), 2);
	json_array_foreach(vs, i, v)
	{
		json_int_t s = json_integer_value(json_object_get(v, "payload_bytes"));
		assert_true(s > 0);
		assert_int_equal(json_integer_value(json_object_get(v, "trainer_upload_bytes")), 4 * s);
		assert_int_equal(json_integer_value(json_object_get(v, "peer_upload_bytes")), 0);
		assert_int_equal(json_integer_value(json_object_get(v, "duplicate_bytes")), 0);
		assert_int_equal(json_integer_value(json_object_get(v, "refetched_bytes")), 0);
		json_t *reps = json_object_get(v, "replicas"), *re;
		size_t k;
		assert_int_equal(json_array_size(reps), 4);
		json_array_foreach(reps, k, re)
		{
			assert_true(json_is_true(json_object_get(re, "activated")));
			assert_true(json_is_true(json_object_get(re, "digest_ok")));
			assert_int_equal(json_integer_value(json_object_get(re, "bytes_from_trainer")), s);
			assert_int_equal(json_integer_value(json_object_get(re, "bytes_from_peers")), 0);
			assert_int_equal(json_integer_value(json_object_get(re, "refetched_bytes")), 0);
		}
	}
	json_decref(j);
	tu_rmtree(dir);
}

/* --late-replica: a replica started once the others are active on the last
 * version activates it too (a layout the version covers: a new one waits
 * for an addendum); its entry says late, counts from its registration and
 * carries its bytes by source. The version's totals are the first wave's. */
static void test_cluster_late_replica(void **state)
{
	char dir[256];

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	json_t *j = run_cluster(dir, "--synthetic-mb 4 --versions 1 --replica tp2 --replica tp1 "
				     "--late-replica tp1");
	assert_true(json_is_true(json_object_get(j, "ok")));
	assert_string_equal(json_string_value(json_object_get(j, "mode")), "fanout");
	json_t *v = json_array_get(json_object_get(j, "versions"), 0);
	json_t *reps = json_object_get(v, "replicas");
	assert_int_equal(json_array_size(reps), 3);
	json_t *first = json_array_get(reps, 1), *late = json_array_get(reps, 2);
	assert_true(json_is_false(json_object_get(json_array_get(reps, 0), "late")));
	assert_true(json_is_false(json_object_get(first, "late")));
	assert_true(json_is_true(json_object_get(late, "late")));
	assert_string_equal(json_string_value(json_object_get(late, "layout")), "tp1");
	assert_true(json_is_true(json_object_get(late, "activated")));
	assert_true(json_is_true(json_object_get(late, "digest_ok")));
	assert_true(json_integer_value(json_object_get(late, "t_activate_ms")) > 0);
	json_int_t got = json_integer_value(json_object_get(late, "bytes_from_trainer")) +
			 json_integer_value(json_object_get(late, "bytes_from_peers"));
	assert_int_equal(got, json_integer_value(json_object_get(first, "bytes_from_trainer")) +
				      json_integer_value(json_object_get(first, "bytes_from_peers")));
	/* The first wave: the tp2 replica (which holds the replicated tensors
	 * twice) and the tp1 one. */
	json_t *a = json_array_get(reps, 0);
	assert_int_equal(json_integer_value(json_object_get(v, "trainer_upload_bytes")) +
				 json_integer_value(json_object_get(v, "peer_upload_bytes")),
			 json_integer_value(json_object_get(a, "bytes_from_trainer")) +
				 json_integer_value(json_object_get(a, "bytes_from_peers")) + got);
	json_decref(j);
	tu_rmtree(dir);
}

/* `tessera cluster --every`: versions on the publisher's clock, ranks
 * started apart; the report has, per replica, versions activated, lag
 * quantiles and checked bytes, and the publisher's peak memory. Bad flag
 * combinations are refused with status 2. */
static void test_cluster_clock_report(void **state)
{
	char dir[256], bin[512];
	json_t *r;
	size_t i;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	json_t *j = run_cluster(dir, "--synthetic-mb 4 --every 300 --stagger 500 --duration 8 "
				     "--replica tp2 --replica tp1");
	tu_bin(bin, sizeof(bin), "tessera");
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_t *c = json_object_get(j, "clock");
	assert_int_equal(json_integer_value(json_object_get(c, "every_ms")), 300);
	assert_true(json_integer_value(json_object_get(c, "published")) >= 2);
	assert_true(json_integer_value(json_object_get(c, "publisher_peak_rss_bytes")) > 0);
	assert_int_equal(json_array_size(json_object_get(c, "replicas")), 2);
	json_array_foreach(json_object_get(c, "replicas"), i, r) {
		assert_true(json_integer_value(json_object_get(r, "activated")) >= 1);
		assert_true(json_is_true(json_object_get(r, "digest_ok")));
		assert_true(json_integer_value(json_object_get(r, "lag_versions_p99")) >=
			    json_integer_value(json_object_get(r, "lag_versions_p50")));
		assert_true(json_integer_value(json_object_get(r, "lag_ms_p99")) >=
			    json_integer_value(json_object_get(r, "lag_ms_p50")));
	}
	json_decref(j);
	assert_int_equal(tu_sh("%s cluster --stagger 100 > /dev/null 2>&1", bin), 2);
	assert_int_equal(tu_sh("%s cluster --every 0 > /dev/null 2>&1", bin), 2);
	assert_int_equal(tu_sh("%s cluster --every 100 --duration x > /dev/null 2>&1", bin), 2);
	tu_rmtree(dir);
}

struct kill_env {
	char dir[256], url[256], sock[512], expose[512], model[512], key[512], pub[512];
	struct node_proc tracker, node, publisher;
	struct trk_client *trk;
	struct proto_model m;
	struct proto_layout tp1;
	const char *every; /* the publisher exports on its own clock (--every MS); NULL: asked */
};

static void start_publisher(struct kill_env *e)
{
	char bin[512], log[600];
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	unlink(e->sock);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", "8",
			"--seed", "7", "--layout", "fsdp2", "--control", e->sock,
			e->every != NULL ? "--every" : NULL, (char *)e->every, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
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
	size_t n = e->tp1.ranks[0].nbytes;

	snprintf(path, sizeof(path), "%s/A-0.json", e->expose);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
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
	unsetenv("TESSERA_WAIT_NOTICE_MS");
	free(e);
	return 0;
}

static void start_node(struct kill_env *e)
{
	char bin[512], log[600];

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node.log", e->dir);
	char *nargv[] = {bin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout", "tp1",
			 "--model", e->model, "--trainer-pubkey", e->pub, "--expose", e->expose,
			 "--store", "host", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, log), 0);
}

/* Files, the tracker and a client of it; no node, no publisher yet. */
static void start_tracker_env(struct kill_env *e)
{
	char state_dir[600], buf[512];
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_FETCH_MBPS", "32", 1);
	setenv("TESSERA_LEASE_MS", "2000", 0); /* unless the case set its own */
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
	tu_write_model(&e->m, e->model);

	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
}

/* Tracker, one tp1 node and the publisher on loopback, v1 active on the
 * node, v2 exported and the node part-way through it. Small chunks and a
 * 32 Mbit/s fetch cap: 8 MiB take about two seconds, so what the caller
 * does next lands mid-transfer. */
static void start_v1(struct kill_env *e)
{
	char line[512];

	start_tracker_env(e);
	start_node(e);
	start_publisher(e);

	/* v1 everywhere. */
	tu_control(e->sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);
	assert_true(tu_wait_active(e->trk, "A", 1, 30000));
	check_serving(e, 1);

}

static void start_mid_v2(struct kill_env *e)
{
	char line[512];

	start_v1(e);
	/* v2 is announced and on its way. */
	tu_control(e->sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 2 ", 12), 0);
	assert_true(wait_fetching(e, 2, 60000));
}

static bool proc_log_has(struct node_proc *p, const char *s);
static int proc_log_count(struct node_proc *p, const char *s);
static bool proc_log_wait(struct node_proc *p, const char *s, int ms);

static void test_publisher_killed_mid_transfer(void **state)
{
	struct kill_env *e = *state;
	char line[512];

	start_mid_v2(e);
	/* v2's only source dies: the node says it has none (once, with
	 * counts) rather than waiting in silence. */
	node_proc_kill(&e->publisher);
	assert_true(proc_log_wait(&e->node, "no source for ", 30000));
	assert_int_equal(tu_replica_active(e->trk, "A"), 1);
	check_serving(e, 1);
	assert_true(node_proc_alive(&e->node));

	/* The publisher is back: it serves v2 again and the node finishes. */
	start_publisher(e);
	assert_true(tu_wait_active(e->trk, "A", 2, 60000));
	check_serving(e, 2);
	assert_true(proc_log_has(&e->node, "a source is back after "));
	assert_int_equal(proc_log_count(&e->node, "no source for "), 1);

	tu_control(e->sock, "quit\n", line, sizeof(line));
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
 * stay open, reads never complete) is found silent after TESSERA_STALL_MS;
 * it is the only source, so its reads stay with it rather than being asked
 * again; the node keeps serving v1 meanwhile and finishes v2 once the
 * source answers again. */
static void test_publisher_stalled_mid_transfer(void **state)
{
	struct kill_env *e = *state;
	char line[512];

	setenv("TESSERA_STALL_MS", "400", 1);
	/* The stopped publisher stops its heartbeats too: with the 2 s lease
	 * the tracker stopped listing it (and the node dropped it as a source)
	 * before a loaded node's patience (4x its window at a rate measured
	 * low) ran out, and the node never judged it silent. */
	setenv("TESSERA_LEASE_MS", "60000", 1);
	start_mid_v2(e);
	assert_int_equal(kill(e->publisher.pid, SIGSTOP), 0);
	/* Bounded at a minute: the patience grows with the bytes in flight
	 * over the measured rate, which a loaded machine makes small. */
	for (int w = 0; w < 60000 && !log_has(e, "no other source, waiting for it"); w += 50)
		usleep(50000);
	assert_true(log_has(e, "no other source, waiting for it"));
	assert_int_equal(tu_replica_active(e->trk, "A"), 1);
	check_serving(e, 1);
	assert_true(node_proc_alive(&e->node));

	assert_int_equal(kill(e->publisher.pid, SIGCONT), 0);
	assert_true(tu_wait_active(e->trk, "A", 2, 60000));
	check_serving(e, 2);
	tu_control(e->sock, "quit\n", line, sizeof(line));
}

/* True once the log of p holds s. */
static bool proc_log_has(struct node_proc *p, const char *s)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	bool found;

	if (proto_read_file(p->log, 64 << 20, &buf, &len, &err) != 0)
		return false;
	found = memmem(buf, len, s, strlen(s)) != NULL;
	free(buf);
	return found;
}

/* Starts the tracker again on its port and state directory. */
static void respawn_tracker(struct kill_env *e)
{
	char bin[512], state_dir[600], listen[64], line[256], log[600];
	const char *port = strrchr(e->url, ':');

	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	snprintf(listen, sizeof(listen), "127.0.0.1%s", port);
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	char *argv[] = {bin, "--listen", listen, "--state", state_dir,
			"--trainer-pubkey", e->pub, NULL};
	snprintf(log, sizeof(log), "%s/tracker.log", e->dir);
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", argv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line),
					     10000), 0);
}

/* How many times the log of p holds s. */
static int proc_log_count(struct node_proc *p, const char *s)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	int n = 0;

	if (proto_read_file(p->log, 64 << 20, &buf, &len, &err) != 0)
		return -1;
	for (const uint8_t *q = buf; (q = memmem(q, len - (size_t)(q - buf), s, strlen(s))) != NULL;
	     q += strlen(s))
		n++;
	free(buf);
	return n;
}

/* Waits (bounded) until the log of p holds s. */
static bool proc_log_wait(struct node_proc *p, const char *s, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		if (proc_log_has(p, s))
			return true;
		usleep(50000);
	}
	return proc_log_has(p, s);
}

/*
 * A publisher says at the default level what it waits for, once each: a
 * node to register a serving layout (started alone, exporting on its own
 * clock), and the tracker while its heartbeats fail (one line when they
 * start failing, one with the count when one is answered again), not a
 * line per heartbeat.
 */
static void test_publisher_says_what_it_waits_for(void **state)
{
	struct kill_env *e = *state;

	setenv("TESSERA_WAIT_NOTICE_MS", "300", 1);
	e->every = "1000";
	start_tracker_env(e);
	start_publisher(e);
	assert_true(proc_log_wait(&e->publisher, "waits for one to register", 30000));
	start_node(e);
	assert_true(tu_wait_active(e->trk, "A", 1, 60000) || tu_replica_active(e->trk, "A") > 1);
	/* Counted now: while the tracker is away the node's registration
	 * lapses, and a version exported before it registers again is a new
	 * wait, said again if it lasts. */
	assert_int_equal(proc_log_count(&e->publisher, "waits for one to register"), 1);

	node_proc_stop(&e->tracker, 5000);
	assert_true(proc_log_wait(&e->publisher, "the tracker may be down", 30000));
	respawn_tracker(e);
	assert_true(proc_log_wait(&e->publisher, "the tracker answers again, after", 30000));
	assert_int_equal(proc_log_count(&e->publisher, "the tracker may be down"), 1);
	assert_true(node_proc_alive(&e->publisher));
}

/* The tracker comes back on the same port with its state lost: wiped
 * (wipe: a new cluster id) or truncated (its versions gone, the cluster id
 * kept). The publisher stops with an error rather than numbering from 1
 * again; the node keeps serving v1, says why, and stays up. */
static void state_lost(struct kill_env *e, bool wipe)
{
	char state_dir[600];
	int status;

	start_v1(e);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	/* The first tracker started on a fresh state and said so. */
	assert_true(proc_log_has(&e->tracker, "new state in "));
	node_proc_stop(&e->tracker, 5000);
	if (wipe)
		assert_int_equal(tu_sh("rm -rf '%s'", state_dir), 0);
	else
		assert_int_equal(tu_sh("rm -f '%s'/versions/*", state_dir), 0);
	assert_int_equal(tu_sh("mv '%s/tracker.log' '%s/tracker.1.log'", e->dir, e->dir), 0);
	respawn_tracker(e);
	assert_int_equal(proc_log_has(&e->tracker, "new state in "), wipe);

	/* The publisher stops, non-zero, saying why. */
	for (int w = 0; w < 30000 && node_proc_alive(&e->publisher); w += 50)
		usleep(50000);
	assert_false(node_proc_alive(&e->publisher));
	status = e->publisher.status;
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) != 0);
	assert_true(proc_log_has(&e->publisher, "forgot the chain"));

	/* The node refuses the tracker and keeps v1. */
	for (int w = 0; w < 30000 && !proc_log_has(&e->node, "forgot the chain"); w += 50)
		usleep(50000);
	assert_true(proc_log_has(&e->node, wipe ? "forgot the chain: its cluster id is"
						: "forgot the chain: its latest version is 0"));
	assert_true(node_proc_alive(&e->node));
	check_serving(e, 1);
	/* Nothing was published into the new chain (a new client: the old
	 * one saw the old chain and refuses this tracker too). */
	struct trk_reply r;
	trk_client_free(e->trk);
	struct proto_err err;
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	assert_int_equal(trk_client_call(e->trk, "GET", TRK_API "/versions", NULL, NULL, 0, &r), 0);
	assert_int_equal(json_integer_value(json_object_get(r.json, "latest")), 0);
	trk_reply_fini(&r);
	assert_true(node_proc_alive(&e->node));
	check_serving(e, 1);
}

static void test_tracker_state_wiped(void **state)
{
	state_lost(*state, true);
}

static void test_tracker_state_truncated(void **state)
{
	state_lost(*state, false);
}

/* ---- the trainer's own clock ------------------------------------------------------ */

#define CLOCK_VERSIONS 30 /* published every CLOCK_EVERY_MS, then served */
#define CLOCK_EVERY_MS "300"
#define CLOCK_DEADLINE_MS 120000

struct clock_env {
	char dir[256], url[256], model[512], key[512], pub[512], expose[512];
	struct node_proc tracker, publisher, nodes[8];
	struct trk_client *trk;
	struct proto_model m;
};

static int clock_setup(void **state)
{
	*state = calloc(1, sizeof(struct clock_env));
	return *state == NULL;
}

static int clock_teardown(void **state)
{
	struct clock_env *e = *state;
	tu_cluster_down(e->nodes, PROTO_ARRAY_LEN(e->nodes), &e->publisher, e->trk, &e->tracker, &e->m,
			e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_LOG");
	free(e);
	return 0;
}

/* Tracker and a publisher exporting `versions` versions of a 4 MiB model,
 * one every `every` ms whatever the replicas do. */
static void clock_start(struct clock_env *e, const char *every, int versions)
{
	char bin[512], log[600], state_dir[600], buf[512], nv[16];
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_LEASE_MS", "2000", 1);
	setenv("TESSERA_LOG", "info", 1); /* the children log their activations */
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	snprintf(e->key, sizeof(e->key), "%s", tu_data(buf, sizeof(buf), "test-trainer.key"));
	snprintf(e->pub, sizeof(e->pub), "%s", tu_data(buf, sizeof(buf), "test-trainer.pub"));
	assert_int_equal(proto_fixture_model(4 << 20, &e->m, &err), 0);
	tu_write_model(&e->m, e->model);

	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	snprintf(nv, sizeof(nv), "%d", versions);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", "4",
			 "--seed", "7", "--layout", "fsdp2", "--every", (char *)every, "--versions", nv,
			 NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
}

/* Starts node slot i as replica/rank with layout, logging to <dir>/<tag>.log. */
static void clock_node(struct clock_env *e, int i, const char *replica, const char *rank,
		       const char *layout, const char *expose, const char *tag)
{
	char bin[512], log[600];
	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/%s.log", e->dir, tag);
	char *argv[] = {bin, "--tracker", e->url, "--replica", (char *)replica, "--rank", (char *)rank,
			"--layout", (char *)layout, "--model", e->model, "--trainer-pubkey", e->pub,
			"--expose", (char *)expose, "--store", "host", NULL};
	assert_int_equal(node_proc_spawn(&e->nodes[i], tag, argv, log), 0);
}

static json_t *clock_get(struct clock_env *e, const char *path)
{
	return tu_get_json(e->trk, path);
}

static uint64_t clock_replica_u64(struct clock_env *e, const char *name, const char *key)
{
	char path[128];
	snprintf(path, sizeof(path), TRK_API "/replicas/%s", name);
	json_t *j = clock_get(e, path);
	uint64_t v = j ? (uint64_t)json_integer_value(json_object_get(j, key)) : 0;
	json_decref(j);
	return v;
}

/* What publishers hold back, sampled: versions the tracker says to retain,
 * and versions the publisher still offers. */
struct held {
	size_t retained, offered, dropped;
};

static void clock_sample(struct clock_env *e, struct held *max)
{
	json_t *st = clock_get(e, TRK_API "/status"), *v;
	size_t i, ret = 0, drop = 0, off = 0;
	if (st == NULL)
		return;
	json_array_foreach(json_object_get(st, "versions"), i, v) {
		ret += json_is_true(json_object_get(v, "retain"));
		drop += json_is_true(json_object_get(v, "dropped"));
	}
	json_array_foreach(json_object_get(st, "publishers"), i, v)
		if (json_is_true(json_object_get(v, "alive")))
			off = PROTO_MAX(off, json_array_size(json_object_get(v, "offered_versions")));
	max->retained = PROTO_MAX(max->retained, ret);
	max->offered = PROTO_MAX(max->offered, off);
	max->dropped = PROTO_MAX(max->dropped, drop);
	json_decref(st);
}

/* Waits (sampling what is held) until replica name's `key` is >= v. */
static bool clock_wait(struct clock_env *e, const char *name, const char *key, uint64_t v,
		       struct held *max)
{
	for (int w = 0; w < CLOCK_DEADLINE_MS; w += 100) {
		if (clock_replica_u64(e, name, key) >= v)
			return true;
		clock_sample(e, max);
		usleep(100000);
	}
	return false;
}

/* The versions a node's log says it activated ("node A/0: v7 active (..."),
 * in order. */
static size_t activations_in_log(const char *log, uint64_t *out, size_t max)
{
	uint8_t *buf;
	size_t len, n = 0;
	struct proto_err err;
	char *txt, *save = NULL;

	if (proto_read_file(log, 64 << 20, &buf, &len, &err) != 0)
		return 0;
	txt = malloc(len + 1);
	assert_non_null(txt);
	memcpy(txt, buf, len);
	txt[len] = 0;
	free(buf);
	for (char *line = strtok_r(txt, "\n", &save); line != NULL && n < max;
	     line = strtok_r(NULL, "\n", &save)) {
		char *q = strstr(line, ": v");
		unsigned long long v;
		char tail[16];
		if (q != NULL && sscanf(q, ": v%llu %15s", &v, tail) == 2 &&
		    strcmp(tail, "active") == 0)
			out[n++] = v;
	}
	free(txt);
	return n;
}

/* Every version a rank of the replica activated is one the replica as a
 * whole activated (in the tracker's activation log): no rank ever switched
 * alone to a version its replica did not serve (the replica was never torn). */
static void check_not_torn(struct clock_env *e, const char *replica, const char *const *logs,
			   size_t nlogs)
{
	json_t *st = clock_get(e, TRK_API "/status"), *a;
	assert_non_null(st);
	for (size_t l = 0; l < nlogs; l++) {
		char path[600];
		uint64_t seen[256];
		snprintf(path, sizeof(path), "%s/%s.log", e->dir, logs[l]);
		size_t n = activations_in_log(path, seen, 256);
		assert_true(n > 0);
		for (size_t k = 0; k < n; k++) {
			bool found = false;
			size_t i;
			json_array_foreach(json_object_get(st, "activations"), i, a)
				found |= strcmp(json_string_value(json_object_get(a, "replica")), replica) == 0 &&
					 (uint64_t)json_integer_value(json_object_get(a, "version")) == seen[k];
			if (!found)
				fail_msg("%s activated v%llu alone: replica %s never did", logs[l],
					 (unsigned long long)seen[k], replica);
		}
	}
	json_decref(st);
}

/* The rank serves exactly version v's bytes (read from its activation record). */
static void check_rank_bytes(struct clock_env *e, const char *expose, const char *replica,
			     uint32_t rank, const char *layout, uint64_t v)
{
	char path[700];
	struct proto_err err;
	struct proto_layout l;

	assert_int_equal(proto_layout_builtin(&e->m, layout, &l, &err), 0);
	size_t n = l.ranks[rank].nbytes;
	snprintf(path, sizeof(path), "%s/%s-%u.json", expose, replica, rank);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	int fd = open(json_string_value(json_object_get(j, "memfd_path")), O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0), *expect = malloc(n);
	assert_true(m != MAP_FAILED);
	proto_fixture_fill_rank(&e->m, &l, rank, 7, v, expect);
	assert_memory_equal(m, expect, n);
	free(expect);
	munmap(m, n);
	close(fd);
	json_decref(j);
	proto_layout_fini(&l);
}

/*
 * Versions every 300 ms whatever the replicas do: a TP2 replica whose ranks
 * start apart activates within a bounded time and never tears; a rank
 * restarted mid-stream rejoins and the replica moves on; a replica absent
 * for many versions holds nothing back at the publisher, and catches up
 * when it returns; at the end every replica serves the last version.
 */
static void test_trainer_clock(void **state)
{
	struct clock_env *e = *state;
	struct held max = {0, 0, 0};

	clock_start(e, CLOCK_EVERY_MS, CLOCK_VERSIONS);
	clock_node(e, 0, "A", "0", "tp2", e->expose, "A0");
	clock_node(e, 2, "B", "0", "tp1", e->expose, "B0");
	clock_node(e, 3, "C", "0", "tp1", e->expose, "C0");

	/* Staggered: A/1 starts once A/0 holds a version verified. */
	for (int w = 0; w < CLOCK_DEADLINE_MS; w += 100) {
		char path[128];
		snprintf(path, sizeof(path), TRK_API "/replicas/A");
		json_t *j = clock_get(e, path);
		json_t *r0 = json_array_get(json_object_get(j, "ranks"), 0);
		const char *s = json_string_value(json_object_get(r0, "state"));
		bool held = s != NULL && strcmp(s, "verified") == 0;
		json_decref(j);
		if (held)
			break;
		usleep(100000);
	}
	clock_node(e, 1, "A", "1", "tp2", e->expose, "A1");
	assert_true(clock_wait(e, "A", "active", 1, &max));

	/* C goes away for many versions. */
	assert_true(clock_wait(e, "C", "active", 1, &max));
	node_proc_kill(&e->nodes[3]);

	/* A/1 is killed and restarted mid-stream: A activates again after
	 * (unless a slow machine already saw the last version out; then the
	 * restarted rank's bytes are checked at the end). */
	uint64_t before = clock_replica_u64(e, "A", "active");
	node_proc_kill(&e->nodes[1]);
	clock_node(e, 1, "A", "1", "tp2", e->expose, "A1-restarted");
	assert_true(clock_wait(e, "A", "active", PROTO_MIN(before + 1, CLOCK_VERSIONS), &max));

	/* All versions published while C is away; then it comes back. */
	assert_true(clock_wait(e, "B", "active", CLOCK_VERSIONS, &max));
	clock_node(e, 3, "C", "0", "tp1", e->expose, "C0-back");
	assert_true(clock_wait(e, "A", "active", CLOCK_VERSIONS, &max));
	assert_true(clock_wait(e, "C", "active", CLOCK_VERSIONS, &max));

	/* Bounded: the tracker asked to keep at most the latest and one target
	 * per live replica; the publisher served at most TESSERA_PUB_RETAIN (4)
	 * versions, plus one being withdrawn; it dropped the rest. */
	assert_true(max.retained <= 1 + 3);
	assert_true(max.offered <= 4 + 1);
	assert_true(max.dropped > 0);

	static const char *const a_logs[] = {"A0", "A1", "A1-restarted"};
	/* The restarted rank activated something (the replica may have been
	 * on the last version before it came back). */
	char rlog[600];
	uint64_t seen[1];
	snprintf(rlog, sizeof(rlog), "%s/A1-restarted.log", e->dir);
	for (int w = 0; w < CLOCK_DEADLINE_MS && activations_in_log(rlog, seen, 1) == 0; w += 100)
		usleep(100000);
	check_not_torn(e, "A", a_logs, 3);
	check_rank_bytes(e, e->expose, "A", 0, "tp2", CLOCK_VERSIONS);
	check_rank_bytes(e, e->expose, "A", 1, "tp2", CLOCK_VERSIONS);
	check_rank_bytes(e, e->expose, "B", 0, "tp1", CLOCK_VERSIONS);
	check_rank_bytes(e, e->expose, "C", 0, "tp1", CLOCK_VERSIONS);
	/* A serves the latest version: it lags by nothing. */
	assert_int_equal(clock_replica_u64(e, "A", "lag_versions"), 0);
	assert_int_equal(clock_replica_u64(e, "A", "lag_ms"), 0);
}

/* A node whose expose directory cannot be created is never "active": it
 * reports the reason, its replica does not switch, and once the directory
 * can be made it activates. */
static void test_expose_unwritable(void **state)
{
	struct clock_env *e = *state;
	char blocked[600], expose[700], path[128];
	struct held max = {0, 0, 0};

	clock_start(e, "400", 4);
	snprintf(blocked, sizeof(blocked), "%s/blocked", e->dir);
	snprintf(expose, sizeof(expose), "%s/blocked/expose", e->dir);
	assert_int_equal(tu_write(blocked, "a file where a directory should be\n"), 0);
	clock_node(e, 0, "D", "0", "tp1", expose, "D0");
	snprintf(path, sizeof(path), TRK_API "/replicas/D");
	bool said = false;
	for (int w = 0; w < CLOCK_DEADLINE_MS && !said; w += 100) {
		json_t *j = clock_get(e, TRK_API "/status"), *rep;
		size_t i;
		json_array_foreach(json_object_get(j, "replicas"), i, rep) {
			const char *err = json_string_value(json_object_get(
				json_array_get(json_object_get(rep, "ranks"), 0), "error"));
			said |= err != NULL && strstr(err, "activation record") != NULL;
		}
		json_decref(j);
		if (!said)
			usleep(100000);
	}
	assert_true(said);
	assert_int_equal(clock_replica_u64(e, "D", "active"), 0);
	assert_true(node_proc_alive(&e->nodes[0]));

	/* The directory can be made now: the node activates the latest. */
	assert_int_equal(unlink(blocked), 0);
	assert_true(clock_wait(e, "D", "active", 4, &max));
	check_rank_bytes(e, expose, "D", 0, "tp1", 4);
}

/* How many running processes have needle in their command line (zombies
 * have none, so they do not count). */
static int procs_naming(const char *needle)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		char path[300], cmd[8192];
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, cmd, sizeof(cmd) - 1);
		close(fd);
		for (ssize_t i = 0; i < len; i++)
			cmd[i] = cmd[i] ? cmd[i] : ' ';
		cmd[len > 0 ? len : 0] = 0;
		n += strstr(cmd, needle) != NULL;
	}
	closedir(d);
	return n;
}

/* Starts `tessera cluster` (output in dir/<out>) with its temporary
 * directory under dir/tmp and waits (bounded) until v1 is reported:
 * tracker, publisher and node are running. */
static void start_long_cluster(struct node_proc *p, const char *dir, const char *out)
{
	char bin[512], tmp[600], env[620], log[600], line[256];

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(tmp, sizeof(tmp), "%s/tmp", dir);
	snprintf(env, sizeof(env), "TMPDIR=%s", tmp);
	snprintf(log, sizeof(log), "%s/%s", dir, out);
	assert_int_equal(mkdir(tmp, 0755), 0);
	char *argv[] = {"/usr/bin/env", env, bin, "cluster", "--synthetic-mb", "1", "--versions",
			"100000", "--replica", "tp1", NULL};
	assert_int_equal(node_proc_spawn(p, "cluster", argv, log), 0);
	if (node_proc_wait_line(p, "  v1 anchor", line, sizeof(line), 120000) != 0) {
		tu_sh("cat %s", log);
		fail_msg("the cluster did not activate v1");
	}
	assert_int_equal(procs_naming(tmp), 3); /* tracker, publisher, node */
}

/* Waits (at most 30 s) until p exited; its wait status. */
static int wait_exit(struct node_proc *p)
{
	for (int waited = 0; node_proc_alive(p); waited += 20) {
		assert_true(waited < 30000);
		usleep(20000);
	}
	return p->status;
}

/* `tessera cluster` stopped by SIGTERM stops what it started and removes
 * its temporary directory; killed with SIGKILL, it cannot, and its
 * children still exit (they asked for SIGTERM when their parent dies). */
static void test_cluster_stopped_by_signal(void **state)
{
	char dir[256], tmp[300];
	struct node_proc p;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(tmp, sizeof(tmp), "%s/tmp", dir);
	start_long_cluster(&p, dir, "out");
	assert_int_equal(kill(p.pid, SIGTERM), 0);
	int st = wait_exit(&p);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 128 + SIGTERM)
		tu_sh("cat %s/out", dir);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 128 + SIGTERM);
	/* It reaped its children before it exited. */
	assert_int_equal(procs_naming(tmp), 0);
	assert_int_equal(tu_sh("test -z \"$(ls -A %s)\"", tmp), 0);
	assert_int_equal(tu_sh("grep -q 'stopped by SIGTERM' %s/out", dir), 0);

	tu_rmtree(tmp);
	start_long_cluster(&p, dir, "out-killed");
	node_proc_kill(&p);
	for (int waited = 0; procs_naming(tmp) > 0; waited += 20) {
		assert_true(waited < 30000);
		usleep(20000);
	}
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cluster_report),
		cmocka_unit_test(test_cluster_buffers_made_once),
		cmocka_unit_test(test_cluster_clock_report),
		cmocka_unit_test(test_cluster_sharded_checkpoints),
		cmocka_unit_test(test_cluster_star_congested),
		cmocka_unit_test(test_cluster_late_replica),
		cmocka_unit_test(test_cluster_stopped_by_signal),
		cmocka_unit_test_setup_teardown(test_publisher_killed_mid_transfer, kill_setup,
						kill_teardown),
		cmocka_unit_test_setup_teardown(test_publisher_stalled_mid_transfer, kill_setup,
						kill_teardown),
		cmocka_unit_test_setup_teardown(test_publisher_says_what_it_waits_for, kill_setup,
						kill_teardown),
		cmocka_unit_test_setup_teardown(test_tracker_state_wiped, kill_setup, kill_teardown),
		cmocka_unit_test_setup_teardown(test_tracker_state_truncated, kill_setup,
						kill_teardown),
		cmocka_unit_test_setup_teardown(test_trainer_clock, clock_setup, clock_teardown),
		cmocka_unit_test_setup_teardown(test_expose_unwritable, clock_setup, clock_teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
