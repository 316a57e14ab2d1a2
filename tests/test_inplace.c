/* In-place installs (tessera-node --install in-place) with the real programs
 * on a `tessera synth` model (RL-like steps: deltas of ~1.7 % of elements):
 * admission paused while a version is written, running requests drained
 * (and dropped past the bound), deltas applied into the served memory, and a
 * failed install keeping serving blocked until an anchor is installed. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "node/client/tessera_client.h"
#include "node/serve/expose.h"
#include "node/cli/probe.h"
#include "node/cli/proc.h"
#include "proto/checkpoint.h"
#include "proto/proto.h"
#include "proto/synth.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define DEADLINE_MS 120000

struct env {
	char dir[256], url[256], ctl[512], sock[512], expose[512], model[512], mdir[512], key[512],
		pub[512], nlog[600];
	struct node_proc tracker, node, publisher;
	struct trk_client *trk;
	struct proto_ckpt ck; /* v0, for the model */
	struct proto_layout tp1;
};

static int setup(void **state)
{
	*state = calloc(1, sizeof(struct env));
	return *state == NULL;
}

static int teardown(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	proto_layout_fini(&e->tp1);
	proto_ckpt_fini(&e->ck);
	if (e->dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	else if (e->dir[0] != 0)
		print_message("kept %s\n", e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_INPLACE_DRAIN_MS");
	unsetenv("TESSERA_TEST_INPLACE_FAIL");
	free(e);
	return 0;
}

/* drain_ms: the node's TESSERA_INPLACE_DRAIN_MS. */
static void start(struct env *e, const char *drain_ms)
{
	char bin[512], log[600], state_dir[600], path[600];
	struct proto_err err;
	struct proto_synth_opts so = {.bytes = 4u << 20, .steps = 5, .lr = 1e-6, .seed = 3,
				      .threads = 2};

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_INPLACE_DRAIN_MS", drain_ms, 1);
	setenv("TESSERA_TEST_INPLACE_FAIL", "4", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->sock, sizeof(e->sock), "%s/A0.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->mdir, sizeof(e->mdir), "%s/synth", e->dir);
	snprintf(e->nlog, sizeof(e->nlog), "%s/node.log", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(mkdir(e->mdir, 0755), 0);
	assert_int_equal(proto_synth_run(e->mdir, &so, NULL, NULL, &err), 0);
	snprintf(path, sizeof(path), "%s/v0.safetensors", e->mdir);
	assert_int_equal(proto_ckpt_open(path, &e->ck, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->ck.model, "tp1", &e->tp1, &err), 0);
	tu_write_model(&e->ck.model, e->model);
	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	tu_bin(bin, sizeof(bin), "tessera-node");
	char *nargv[] = {bin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout",
			 "tp1", "--model", e->model, "--trainer-pubkey", e->pub, "--expose", e->expose,
			 "--store", "host", "--attach", e->sock, "--install", "in-place",
			 "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, e->nlog), 0);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--model-dir", e->mdir,
			 "--layout", "fsdp2", "--control", e->ctl, "--anchor-every", "10", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		struct trk_reply r;
		bool have = trk_client_call(e->trk, "GET", TRK_API "/replicas/A", NULL, NULL, 0, &r) == 0 &&
			    r.status == 200;
		trk_reply_fini(&r);
		if (have)
			break;
		usleep(100000);
	}
}

/* Exports the next version; asserts its number and kind. */
static void export_one(struct env *e, uint64_t v, const char *kind)
{
	char line[512], want[64];

	tu_control(e->ctl, "export\n", line, sizeof(line));
	snprintf(want, sizeof(want), "published %llu ", (unsigned long long)v);
	if (strncmp(line, want, strlen(want)) != 0 || strstr(line, kind) == NULL)
		fail_msg("v%llu: want a %s, the publisher said: %s", (unsigned long long)v, kind, line);
}

static bool wait_log(struct env *e, const char *s)
{
	for (int w = 0; w < DEADLINE_MS; w += 50) {
		if (tu_sh("grep -qF -- '%s' '%s'", s, e->nlog) == 0)
			return true;
		usleep(50000);
	}
	return false;
}

static void ck_fill(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct proto_ckpt *ck = arg;
	size_t es = proto_dtype_size(ck->model.tensors[t].dtype);
	memcpy(out, proto_ckpt_tensor(ck, t) + first * es, count * es);
}

/* The bytes rank 0 of tp1 holds of version v (file v<v-1>). */
static bool bytes_are(struct env *e, const uint8_t *m, uint64_t v)
{
	char path[600];
	struct proto_ckpt ck;
	struct proto_err err;
	size_t n = e->tp1.ranks[0].nbytes;
	uint8_t *expect = malloc(n);

	assert_non_null(expect);
	snprintf(path, sizeof(path), "%s/v%llu.safetensors", e->mdir, (unsigned long long)v - 1);
	assert_int_equal(proto_ckpt_open(path, &ck, &err), 0);
	proto_layout_fill_rank(&ck.model, &e->tp1, 0, ck_fill, &ck, expect);
	proto_ckpt_fini(&ck);
	bool same = memcmp(m, expect, n) == 0;
	free(expect);
	return same;
}

static tessera_client *attach(struct env *e, int timeout_ms)
{
	char why[256];
	tessera_client *c;

	assert_int_equal(tessera_attach(e->sock, "A", 0, timeout_ms, &c, why, sizeof(why)), 0);
	return c;
}

/* A fresh client pins the active version: it is v with v's exact bytes,
 * and the canary matches the publisher's. */
static void serving(struct env *e, uint64_t v)
{
	tessera_client *c = attach(e, 30000);
	struct tessera_pin pin;
	struct node_probe pr;
	struct proto_err err;

	assert_int_equal(tessera_wait_version(c, v, DEADLINE_MS), 0);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, v);
	assert_true(bytes_are(e, pin.base, v));
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		assert_int_equal(node_probe_read(e->sock, "A", 0, v, 30000, &pr, &err), 0);
		assert_int_equal(node_probe_report(e->trk, "A", 0, &pr, &err), 0);
		if (pr.ok >= 0)
			break;
		usleep(100000);
	}
	assert_int_equal(pr.ok, 1);
}

/* Admission is paused now: an acquire waits (the client's 5 s timeout),
 * then gives up (-EBUSY). */
static void paused(struct env *e)
{
	tessera_client *c = attach(e, 5000);
	struct tessera_pin pin;

	assert_int_equal(tessera_acquire(c, &pin), -EBUSY);
	assert_non_null(strstr(tessera_error(c), "admission paused"));
	tessera_detach(c);
}

/*
 * v1 (an anchor, nothing served yet) activates as usual. v2, a delta: a
 * request pinning v1 holds the install (admission paused, the pinned bytes
 * stay v1's) until it releases; then v2 is written into the same memory
 * and served. v3 (nothing pinned) goes straight in. v4: the install fails
 * halfway (test hook): serving stays blocked, the node asks for an anchor;
 * v5 is one, and once installed serving resumes with v5's exact bytes. The
 * drain bound is far (120 s): the pause lasts as long as the pin.
 */
static void test_inplace_pause_and_fail(void **state)
{
	struct env *e = *state;
	struct tessera_pin p1;

	start(e, "120000");
	export_one(e, 1, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 1, DEADLINE_MS));
	serving(e, 1);

	tessera_client *c1 = attach(e, 30000);
	assert_int_equal(tessera_wait_version(c1, 1, DEADLINE_MS), 0);
	assert_int_equal(tessera_acquire(c1, &p1), 0);
	assert_int_equal(p1.version, 1);
	export_one(e, 2, "delta");
	assert_true(wait_log(e, "installing v2 in place over v1"));
	paused(e);
	assert_true(bytes_are(e, p1.base, 1));
	assert_int_equal(tu_replica_active(e->trk, "A"), 1);
	assert_int_equal(tessera_release(c1, &p1), 0);
	assert_true(tu_wait_active(e->trk, "A", 2, DEADLINE_MS));
	assert_true(wait_log(e, "v2 installed in place (delta)"));
	serving(e, 2);
	/* c1 was told of v2: the same memory, now v2's. */
	assert_int_equal(tessera_wait_version(c1, 2, DEADLINE_MS), 0);
	tessera_detach(c1);

	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, DEADLINE_MS));
	serving(e, 3);

	/* v4: the install fails halfway; serving stays blocked. */
	export_one(e, 4, "delta");
	assert_true(wait_log(e, "v4 in-place install failed"));
	paused(e);
	assert_int_equal(tu_replica_active(e->trk, "A"), 3);
	/* The next version is an anchor (the node asked for one). */
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		struct trk_reply r;
		bool want = trk_client_call(e->trk, "GET", TRK_API "/versions", NULL, NULL, 0, &r) == 0 &&
			    r.status == 200 && json_is_true(json_object_get(r.json, "anchor_wanted"));
		trk_reply_fini(&r);
		if (want)
			break;
		usleep(100000);
	}
	export_one(e, 5, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 5, DEADLINE_MS));
	assert_true(wait_log(e, "v5 installed in place (full copy)"));
	serving(e, 5);
	assert_true(node_proc_alive(&e->node));

	/* Stopped with SIGTERM, the node takes its activation record with it;
	 * a client coming later is told in one line that no node is there. */
	char rec[600], why[256];
	struct proto_err err;
	json_t *j;
	tessera_client *c;
	snprintf(rec, sizeof(rec), "%s/A-0.json", e->expose);
	assert_int_equal(node_expose_read(rec, &j, &err), 0);
	json_decref(j);
	node_proc_stop(&e->node, 30000);
	assert_int_equal(access(rec, F_OK), -1);
	assert_int_equal(node_expose_read(rec, &j, &err), -ENOENT);
	assert_null(j);
	assert_non_null(strstr(err.msg, "no activation record"));
	assert_int_equal(tessera_attach(e->sock, "A", 0, 5000, &c, why, sizeof(why)), -ENOENT);
	assert_non_null(strstr(why, "no such socket"));
	assert_null(strchr(why, '\n'));
}

/* A request that never releases its pin is dropped once the drain bound
 * (1 s here) passed, and the version is installed. */
static void test_inplace_drain_bound(void **state)
{
	struct env *e = *state;
	struct tessera_pin p1;

	start(e, "1000");
	export_one(e, 1, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 1, DEADLINE_MS));
	tessera_client *c1 = attach(e, 30000);
	assert_int_equal(tessera_wait_version(c1, 1, DEADLINE_MS), 0);
	assert_int_equal(tessera_acquire(c1, &p1), 0);
	export_one(e, 2, "delta");
	assert_true(tu_wait_active(e->trk, "A", 2, DEADLINE_MS));
	assert_true(wait_log(e, "after 1000 ms (TESSERA_INPLACE_DRAIN_MS): disconnected"));
	assert_true(tessera_release(c1, &p1) != 0);
	tessera_detach(c1);
	serving(e, 2);

	/* Killed, the node leaves its record and socket behind: a reader of
	 * the record and a client of the socket each get one line saying the
	 * node is gone, not a failure to open a memfd. */
	char rec[600], why[256];
	struct proto_err err;
	json_t *j;
	tessera_client *c;
	pid_t pid = e->node.pid;
	snprintf(rec, sizeof(rec), "%s/A-0.json", e->expose);
	node_proc_kill(&e->node);
	assert_int_equal(access(rec, F_OK), 0);
	assert_int_equal(node_expose_read(rec, &j, &err), -ESRCH);
	assert_null(j);
	char want[64];
	snprintf(want, sizeof(want), "is stale: node process %ld is not running", (long)pid);
	assert_non_null(strstr(err.msg, want));
	assert_int_equal(tessera_attach(e->sock, "A", 0, 5000, &c, why, sizeof(why)), -ECONNREFUSED);
	assert_non_null(strstr(why, "no node listens there"));
}

/* --install takes double or in-place only. */
static void test_install_option(void **state)
{
	char bin[512];

	(void)state;
	tu_bin(bin, sizeof(bin), "tessera-node");
	assert_int_equal(tu_sh("'%s' --install sideways --tracker http://127.0.0.1:1 >/dev/null 2>&1",
			       bin), 2);
	assert_int_equal(tu_sh("'%s' --install sideways 2>&1 | grep -q 'want double or in-place'", bin),
			 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_inplace_pause_and_fail, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inplace_drain_bound, setup, teardown),
		cmocka_unit_test(test_install_option),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
