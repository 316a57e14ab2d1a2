/* The canary with the real programs: the publisher's expected scores, live
 * scores read through the attach socket like a serving engine reads them,
 * the tracker's verdict per rank and replica, a replica whose live memory was
 * altered after activation, and the canary endpoints' bad input. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>
#include "node/client/tessera_client.h"
#include "node/cli/probe.h"
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define DEADLINE_MS 120000

struct env {
	char dir[256], url[256], ctl[512], model[512], key[512], pub[512], expose[512];
	char sock[3][512];
	struct node_proc tracker, publisher, nodes[3];
	struct trk_client *trk;
	struct proto_model m;
};

static const char *const reps[3] = {"A", "B", "B"};
static const uint32_t ranks[3] = {0, 0, 1};

static int setup(void **state)
{
	*state = calloc(1, sizeof(struct env));
	return *state == NULL;
}

static int teardown(void **state)
{
	struct env *e = *state;

	tu_cluster_down(e->nodes, PROTO_ARRAY_LEN(e->nodes), &e->publisher, e->trk, &e->tracker, &e->m,
			e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	free(e);
	return 0;
}

static json_t *get(struct env *e, const char *path)
{
	return tu_get_json(e->trk, path);
}

/* POSTs body (text) to path; the HTTP status. */
static int post(struct env *e, const char *path, const char *body)
{
	struct trk_reply r;
	int st = -1;

	if (trk_client_call(e->trk, "POST", path, NULL, body, strlen(body), &r) == 0)
		st = r.status;
	trk_reply_fini(&r);
	return st;
}

/* Probes node i and reports; waits (bounded) for a verdict. */
static struct node_probe probe(struct env *e, int i, uint64_t v)
{
	struct node_probe pr = {0};
	struct proto_err err;

	for (int w = 0; w < DEADLINE_MS; w += 100) {
		assert_int_equal(node_probe_read(e->sock[i], reps[i], ranks[i], v, 30000, &pr, &err), 0);
		assert_int_equal(node_probe_report(e->trk, reps[i], ranks[i], &pr, &err), 0);
		if (pr.ok >= 0)
			break;
		usleep(100000);
	}
	assert_int_equal(pr.version, v);
	return pr;
}

/* The replica entry of the status (a new reference) or NULL. */
static json_t *replica_status(struct env *e, const char *name)
{
	json_t *st = get(e, TRK_API "/status"), *rep, *out = NULL;
	size_t i;

	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		if (strcmp(json_string_value(json_object_get(rep, "replica")) ?: "", name) == 0)
			out = json_incref(rep);
	json_decref(st);
	return out;
}

/* The replica's canary_ok as the status says: 1, 0, or -1 for null. */
static int replica_canary(struct env *e, const char *name)
{
	json_t *rep = replica_status(e, name), *ok = json_object_get(rep, "canary_ok");
	int v = json_is_true(ok) ? 1 : json_is_false(ok) ? 0 : -1;
	json_decref(rep);
	return v;
}

static void start(struct env *e)
{
	char bin[512], log[600], state_dir[600];
	struct proto_err perr;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model(4 << 20, &e->m, &perr), 0);
	tu_write_model(&e->m, e->model);
	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &perr), 0);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", "4",
			 "--seed", "7", "--layout", "fsdp2", "--control", e->ctl, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	for (int i = 0; i < 3; i++) {
		char rank[8], tag[8];
		snprintf(rank, sizeof(rank), "%u", ranks[i]);
		snprintf(tag, sizeof(tag), "%s%u", reps[i], ranks[i]);
		char dir[sizeof(e->dir)];
		memcpy(dir, e->dir, sizeof(dir));
		snprintf(e->sock[i], sizeof(e->sock[i]), "%s/%s.sock", dir, tag);
		tu_start_node(&e->nodes[i], e->dir, e->url, reps[i], rank, i == 0 ? "tp1" : "tp2",
			      e->model, e->pub, e->expose, e->sock[i], tag);
	}
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		json_t *a = get(e, TRK_API "/replicas/A"), *b = get(e, TRK_API "/replicas/B");
		bool both = a != NULL && b != NULL;
		json_decref(a);
		json_decref(b);
		if (both)
			break;
		usleep(100000);
	}
}

/* The pins the tracker lists for rank of replica name at version v, as its
 * node last said (-1: the version is not listed); requests into *req. */
static int64_t tracker_pins(struct env *e, const char *name, uint32_t rank, uint64_t v,
			    uint64_t *req)
{
	json_t *rep = replica_status(e, name), *p;
	json_t *rk = json_array_get(json_object_get(rep, "ranks"), rank);
	int64_t n = -1;
	size_t i;

	json_array_foreach(json_object_get(rk, "pins"), i, p)
		if ((uint64_t)json_integer_value(json_object_get(p, "version")) == v) {
			n = json_integer_value(json_object_get(p, "pins"));
			*req = (uint64_t)json_integer_value(json_object_get(p, "requests"));
		}
	json_decref(rep);
	return n;
}

/* Waits (bounded) until the tracker lists want pins (and at least min_req
 * requests) for rank of name at v; want 0 also takes v no longer listed. */
static bool wait_pins(struct env *e, const char *name, uint32_t rank, uint64_t v, int64_t want,
		      uint64_t min_req)
{
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		uint64_t req = 0;
		int64_t n = tracker_pins(e, name, rank, v, &req);
		if ((n == want && req >= min_req) || (want == 0 && n == -1))
			return true;
		usleep(100000);
	}
	return false;
}

/* Writes through the memfd the node hands serving processes: element 0 of
 * the rank's first tensor (bf16) becomes another value. */
static void alter_live(struct env *e, int i)
{
	char why[256];
	tessera_client *c;

	assert_int_equal(tessera_attach(e->sock[i], reps[i], ranks[i], 30000, &c, why, sizeof(why)), 0);
	assert_int_equal(tessera_wait_version(c, 1, 30000), 0);
	const struct tessera_version *vi = tessera_version_info(c, tessera_active(c));
	const struct tessera_tensor *t = tessera_tensor(c, 0);
	assert_non_null(vi);
	assert_string_equal(t->dtype, "bf16");
	uint8_t *w = mmap(NULL, vi->size, PROT_READ | PROT_WRITE, MAP_SHARED, vi->memfd, 0);
	assert_true(w != MAP_FAILED);
	uint8_t *el = w + t->offset;
	bool one = el[0] == 0x80 && el[1] == 0x3f;
	el[0] = one ? 0x00 : 0x80; /* 2.0 or 1.0 */
	el[1] = one ? 0x40 : 0x3f;
	munmap(w, vi->size);
	tessera_detach(c);
}

/*
 * v1 active everywhere: every rank's live score is the publisher's, the
 * status says canary_ok for A and B. Then one element of B1's live memory
 * is overwritten through the attach memfd: B1's probe mismatches, B is not
 * canary_ok while A still is, `tessera probe` exits 1 saying so, and the
 * metrics count the mismatched rank.
 */
static void test_canary_matches_then_catches_altered_memory(void **state)
{
	struct env *e = *state;
	char bin[512], out[700];

	start(e);
	tu_control_export(e->ctl, 1);
	assert_true(tu_wait_active(e->trk, "A", 1, DEADLINE_MS));
	assert_true(tu_wait_active(e->trk, "B", 1, DEADLINE_MS));
	for (int i = 0; i < 3; i++) {
		struct node_probe pr = probe(e, i, 1);
		assert_int_equal(pr.ok, 1);
		assert_true(pr.have_expected && pr.expected == pr.score);
	}
	assert_int_equal(replica_canary(e, "A"), 1);
	assert_int_equal(replica_canary(e, "B"), 1);
	/* Different ranks, different scores (the rank's own weights). */
	struct node_probe b0 = probe(e, 1, 1), b1 = probe(e, 2, 1);
	assert_true(b0.score != b1.score);

	alter_live(e, 2);
	struct node_probe bad = probe(e, 2, 1);
	assert_int_equal(bad.ok, 0);
	assert_true(bad.score != b1.score && bad.expected == b1.score);
	assert_int_equal(replica_canary(e, "B"), 0);
	assert_int_equal(replica_canary(e, "A"), 1);
	json_t *rep = replica_status(e, "B");
	json_t *cn = json_object_get(json_array_get(json_object_get(rep, "ranks"), 1), "canary");
	assert_true(json_is_false(json_object_get(cn, "ok")));
	assert_int_equal(json_integer_value(json_object_get(cn, "version")), 1);
	json_decref(rep);

	/* The command says the same, with its exit status. */
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(out, sizeof(out), "%s/probe.out", e->dir);
	assert_int_equal(tu_sh("'%s' probe --attach '%s' --replica B --rank 1 --tracker '%s' >'%s' 2>&1",
			       bin, e->sock[2], e->url, out), 1);
	assert_int_equal(tu_sh("grep -q 'B/1 v1 canary .*MISMATCH' '%s'", out), 0);
	assert_int_equal(tu_sh("'%s' probe --attach '%s' --replica A --rank 0 --tracker '%s' >'%s' 2>&1",
			       bin, e->sock[0], e->url, out), 0);
	assert_int_equal(tu_sh("grep -q 'A/0 v1 canary .*: ok$' '%s'", out), 0);
	/* A replica the node does not serve: refused with the node's reason. */
	assert_int_equal(tu_sh("'%s' probe --attach '%s' --replica Z --rank 0 >'%s' 2>&1", bin,
			       e->sock[0], out), 1);
	assert_int_equal(tu_sh("grep -q 'tessera probe: attaching to .*Z' '%s'", out), 0);
	assert_int_equal(tu_sh("curl -s '%s/metrics' | grep -q '^tessera_tracker_canary_mismatched_ranks 1$'",
			       e->url), 0);
	assert_int_equal(tu_sh("curl -s '%s/' | grep -q 'MISMATCH'", e->url), 0);

	/* v2 serves the right bytes again: B matches at v2. A request pinning
	 * v1 on B0 across the switch: the tracker lists, from B0's heartbeats,
	 * one request running on v1 (and the probes' requests that ran on it),
	 * then none once it is released; the pin names the version it ran on. */
	char why[256];
	tessera_client *c;
	struct tessera_pin pin;
	assert_int_equal(tessera_attach(e->sock[1], "B", 0, 30000, &c, why, sizeof(why)), 0);
	assert_int_equal(tessera_wait_version(c, 1, 30000), 0);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 1);
	tu_control_export(e->ctl, 2);
	assert_true(tu_wait_active(e->trk, "B", 2, DEADLINE_MS));
	assert_true(wait_pins(e, "B", 0, 1, 1, 2));
	assert_int_equal(tessera_release(c, &pin), 0);
	assert_true(wait_pins(e, "B", 0, 1, 0, 0));
	tessera_detach(c);
	assert_int_equal(probe(e, 2, 2).ok, 1);
	assert_int_equal(probe(e, 1, 2).ok, 1);
	assert_int_equal(replica_canary(e, "B"), 1);
}

/* The canary endpoints refuse bad bodies with a reason and keep nothing of
 * them: a POST whose second layout is bad stores not even its first. */
static void test_canary_bad_input(void **state)
{
	struct env *e = *state;
	char body[1024];

	start(e);
	tu_control_export(e->ctl, 1);
	assert_true(tu_wait_active(e->trk, "A", 1, DEADLINE_MS));
	assert_int_equal(probe(e, 0, 1).ok, 1);
	json_t *rep = replica_status(e, "A");
	const char *lay = json_string_value(json_object_get(rep, "layout_digest"));
	assert_non_null(lay);

	static const char *const live[] = {
		"{}",
		"{\"id\":\"A/0\",\"version\":1}",
		"{\"id\":\"A/0\",\"version\":1,\"score\":\"12\"}",
		"{\"id\":\"A/0\",\"version\":-1,\"score\":1}",
		"{\"id\":7,\"version\":1,\"score\":1}",
		"[1,2]",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(live); i++)
		assert_int_equal(post(e, TRK_API "/canary", live[i]), 400);
	assert_int_equal(post(e, TRK_API "/canary", "{\"id\":\"Q/0\",\"version\":1,\"score\":1}"), 404);
	assert_int_equal(post(e, TRK_API "/canary", "{\"id\":\"A/0\",\"version\":99,\"score\":1}"), 404);

	snprintf(body, sizeof(body),
		 "{\"version\":1,\"layouts\":[{\"layout\":\"%s\",\"scores\":[5]},"
		 "{\"layout\":\"zz\",\"scores\":[1]}]}", lay);
	assert_int_equal(post(e, TRK_API "/canary/expected", body), 400);
	snprintf(body, sizeof(body), "{\"version\":1,\"layouts\":[{\"layout\":\"%s\",\"scores\":[5,6]}]}",
		 lay);
	assert_int_equal(post(e, TRK_API "/canary/expected", body), 400);
	snprintf(body, sizeof(body), "{\"version\":1,\"layouts\":[{\"layout\":\"%s\",\"scores\":[1.5]}]}",
		 lay);
	assert_int_equal(post(e, TRK_API "/canary/expected", body), 400);
	snprintf(body, sizeof(body), "{\"version\":1,\"layouts\":[{\"layout\":\"%s\",\"scores\":[]}]}",
		 lay);
	assert_int_equal(post(e, TRK_API "/canary/expected", body), 400);
	assert_int_equal(post(e, TRK_API "/canary/expected", "{\"version\":1,\"layouts\":{}}"), 400);
	snprintf(body, sizeof(body), "{\"version\":9,\"layouts\":[{\"layout\":\"%s\",\"scores\":[5]}]}",
		 lay);
	assert_int_equal(post(e, TRK_API "/canary/expected", body), 404);
	json_decref(rep);
	/* A node's pin counts: every entry checked, nothing kept of a bad one. */
	static const char *const beats[] = {
		"{\"id\":\"A/0\",\"pins\":{}}",
		"{\"id\":\"A/0\",\"pins\":[{\"version\":1}]}",
		"{\"id\":\"A/0\",\"pins\":[{\"version\":1,\"pins\":-1,\"requests\":0}]}",
		"{\"id\":\"A/0\",\"pins\":[7]}",
		"{\"id\":\"A/0\",\"pins\":[{},{},{},{},{},{},{},{},{}]}",
		"{\"id\":\"A/0\",\"pins\":[{\"version\":1,\"pins\":5,\"requests\":5},"
		"{\"version\":\"2\",\"pins\":0,\"requests\":0}]}",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(beats); i++)
		assert_int_equal(post(e, TRK_API "/heartbeat", beats[i]), 400);
	uint64_t req = 0;
	assert_true(tracker_pins(e, "A", 0, 1, &req) != 5);
	/* A good one is kept (until A0's own next heartbeat, which may come in
	 * between: then again). */
	bool kept = false;
	for (int tries = 0; tries < 10 && !kept; tries++) {
		assert_int_equal(post(e, TRK_API "/heartbeat",
				      "{\"id\":\"A/0\",\"pins\":[{\"version\":1,\"pins\":5,\"requests\":9}]}"),
				 200);
		kept = tracker_pins(e, "A", 0, 1, &req) == 5 && req == 9;
	}
	assert_true(kept);
	/* Nothing of those was kept: A still matches the publisher's score. */
	assert_int_equal(probe(e, 0, 1).ok, 1);
	assert_int_equal(replica_canary(e, "A"), 1);
	assert_true(node_proc_alive(&e->tracker));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_canary_matches_then_catches_altered_memory, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_canary_bad_input, setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
