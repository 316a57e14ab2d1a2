/* A node's version and the tracker's answers (node/agent/version.c): an
 * answer counts only for the version that asked, not for one started since. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <unistd.h>

#include "node/agent/internal.h"
#include "tests/testutil.h"

struct fx {
	char dir[256];
	struct event_base *base;
	struct trk_server *srv;
	struct node_agent a;
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	uint8_t model[PROTO_HASH_BYTES];
	uint8_t digs[4][PROTO_HASH_BYTES];
};

/* Runs the loop until *flag or a bound of iterations (each waits at most
 * 100 ms for an event). */
static void loop_until(struct fx *f, const bool *flag)
{
	for (int i = 0; i < 300 && !*flag; i++) {
		struct timeval tv = {0, 100000};
		event_base_loopexit(f->base, &tv);
		event_base_loop(f->base, EVLOOP_ONCE);
	}
}

static void on_published(const struct trk_answer *ans, void *arg)
{
	bool *done = arg;
	assert_int_equal(ans->status, 201);
	*done = true;
}

/* Signs and publishes v (an anchor when parent is 0, else a delta), with
 * no layouts: the node refuses it before it would need one. */
static void publish(struct fx *f, uint64_t v)
{
	struct proto_manifest m;
	struct proto_err err = {{0}};
	uint8_t *buf;
	size_t len;
	bool done = false;

	proto_manifest_init(&m);
	m.version = v;
	m.parent_version = v - 1;
	if (v > 1)
		memcpy(m.parent_digest, f->digs[v - 1], PROTO_HASH_BYTES);
	m.kind = v > 1 ? PROTO_KIND_DELTA : PROTO_KIND_ANCHOR;
	memcpy(m.model_digest, f->model, PROTO_HASH_BYTES);
	m.created_ms = 1700000000000ull + v;
	m.chunk_size = 64;
	assert_int_equal(proto_manifest_sign(&m, f->sk, &buf, &len, &err), 0);
	memcpy(f->digs[v], m.digest, PROTO_HASH_BYTES);
	proto_manifest_fini(&m);
	assert_int_equal(trk_client_publish(f->a.trk, buf, len, on_published, &done), 0);
	free(buf);
	loop_until(f, &done);
	assert_true(done);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct proto_err err = {{0}};
	char sdir[300];

	if (f == NULL || tu_mkdtemp(f->dir, sizeof(f->dir)) == NULL)
		return -1;
	snprintf(sdir, sizeof(sdir), "%s/state", f->dir);
	crypto_sign_keypair(f->pk, f->sk);
	randombytes_buf(f->model, sizeof(f->model));
	f->base = event_base_new();
	struct trk_server_opts o = {.listen = "127.0.0.1:0", .state_dir = sdir, .trainer_pk = f->pk};
	if (f->base == NULL || trk_server_new(f->base, &o, &f->srv, &err) != 0 ||
	    trk_client_new(f->base, trk_server_url(f->srv), NULL, &f->a.trk, &err) != 0) {
		fprintf(stderr, "setup: %s\n", err.msg);
		return -1;
	}
	/* Only what a fetch's manifest stage reads. */
	f->a.base = f->base;
	snprintf(f->a.node_id, sizeof(f->a.node_id), "A/0");
	memcpy(f->a.trainer_pk, f->pk, sizeof(f->pk));
	memcpy(f->a.model.digest, f->model, PROTO_HASH_BYTES);
	f->a.fx.chunk_size = 1u << 20;
	f->a.sw.x = &f->a.fx; /* what a dropped version is released through */
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	trk_client_free(f->a.trk);
	trk_server_free(f->srv);
	event_base_free(f->base);
	tu_rmtree(f->dir);
	free(f);
	return 0;
}

/* A fetch of the delta v2 by a node holding nothing asks for v2's manifest,
 * then for its parent's. The replica's target moves meanwhile: the fetch is
 * dropped and v1's starts. The parent's answer, which comes first, was
 * taken as the new fetch's and refused it ("broken parent chain: v0 is not
 * the parent it names"); it must be dropped, and the new fetch go on with
 * its own manifest (here refused for its chunk size: where the test stops
 * it, before it would need a layout). */
static void test_stale_parent_answer(void **state)
{
	struct fx *f = *state;
	struct node_agent *a = &f->a;
	char log[300];
	int saved, fd;

	publish(f, 1);
	publish(f, 2);
	snprintf(log, sizeof(log), "%s/log", f->dir);
	fd = open(log, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_true(fd >= 0);
	fflush(stderr);
	saved = dup(2);
	dup2(fd, 2);
	close(fd);

	agent_version_start(a, 2);
	struct agent_version *first = a->ver;
	assert_non_null(first);
	assert_int_equal(first->stage, STAGE_MANIFEST);
	/* v2's manifest in, its parent's asked for: still the manifest stage. */
	loop_until(f, &first->f->have_man);
	assert_true(first->f->have_man);
	assert_int_equal(first->stage, STAGE_MANIFEST);
	a->fx.chunk_size = 32; /* the next manifest (chunks of 64) is refused */
	agent_version_drop(a);
	agent_version_start(a, 1);
	struct agent_version *second = a->ver;
	for (int i = 0; i < 300 && a->ver == second; i++) {
		struct timeval tv = {0, 100000};
		event_base_loopexit(f->base, &tv);
		event_base_loop(f->base, EVLOOP_ONCE);
	}
	bool ended = a->ver != second;
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	assert_true(ended);

	char *text = NULL;
	size_t len = 0;
	FILE *fp = fopen(log, "r");
	assert_non_null(fp);
	assert_int_equal(getdelim(&text, &len, 0, fp) > 0, 1);
	fclose(fp);
	fputs(text, stderr);
	assert_null(strstr(text, "broken parent chain"));
	assert_non_null(strstr(text, "v1 refused: chunk size 64 exceeds ours (32)"));
	free(text);
}

/*
 * A fresh version (agent_note_fresh): a watch answer whose now_ms says the
 * version was published less than STARVE_MS ago makes it fresh, and so the
 * version under way of that number (its fetch's first read need not wait
 * for peers' have-pages: test_picker.c); heard of STARVE_MS after, from a
 * tracker that sends no now_ms, or another version: not fresh.
 */
static void test_note_fresh(void **state)
{
	struct node_agent *a = calloc(1, sizeof(*a));
	struct fetch f = {.version = 5};
	struct agent_version v = {.version = 5, .f = &f};
	struct trk_version_info vi = {.version = 5, .published_ms = 1700000000000ull};

	assert_non_null(a);
	snprintf(a->node_id, sizeof(a->node_id), "R1/0");
	a->ver = &v;
	agent_note_fresh(a, 5, vi.published_ms + 10, &vi, 1);
	assert_int_equal(a->fresh_v, 5);
	assert_true(a->fresh_until_ms > node_now_ms() + STARVE_MS / 2);
	assert_int_equal(f.fresh_until_ms, a->fresh_until_ms);
	a->fresh_v = a->fresh_until_ms = 0;
	f.fresh_until_ms = 0;
	agent_note_fresh(a, 5, vi.published_ms + STARVE_MS, &vi, 1);
	agent_note_fresh(a, 5, 0, &vi, 1);
	agent_note_fresh(a, 6, vi.published_ms + 10, &vi, 1);
	assert_int_equal(a->fresh_v, 0);
	assert_int_equal(a->fresh_until_ms, 0);
	assert_int_equal(f.fresh_until_ms, 0);
	free(a);
}

/* What sync() said: agent_rlog_sync's lines (stderr, caught in a file);
 * the caller frees. */
static char *rlog_said(struct node_agent *a, const char *rep_json, uint64_t target)
{
	char path[] = "/tmp/tessera-rlog-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	json_error_t jerr;
	json_t *rep = json_loads(rep_json, 0, &jerr);
	char *out = calloc(1, 4096);

	assert_true(fd >= 0 && saved >= 0);
	assert_non_null(rep);
	assert_non_null(out);
	fflush(stderr);
	assert_true(dup2(fd, 2) >= 0);
	agent_rlog_sync(a, rep, target);
	fflush(stderr);
	assert_true(dup2(saved, 2) >= 0);
	close(saved);
	assert_true(pread(fd, out, 4095, 0) >= 0);
	close(fd);
	unlink(path);
	json_decref(rep);
	return out;
}

/* The replica's lines: "behind for" counts from the publish of the first
 * version it lacked (a node stopped 25 s notices late); a replica that
 * joins late is not behind until a version after the one it joined at is
 * out, and never names v0. */
static void test_replica_lines(void **state)
{
	struct node_agent *a = calloc(1, sizeof(*a));
	uint64_t now = 1700000000000ull;
	struct trk_version_info vi[2] = {{.version = 4, .published_ms = now - 25000},
					 {.version = 5, .published_ms = now - 20000}};
	char *s;
	double behind = 0;

	(void)state;
	assert_non_null(a);
	proto_log_set_level(PROTO_LOG_NOTE);
	assert_int_equal(agent_lag_versions(3, 5, 0), 2);
	assert_int_equal(agent_lag_versions(0, 24, 24), 1);
	assert_int_equal(agent_lag_versions(0, 25, 24), 2);
	assert_int_equal(agent_lag_versions(0, 20, 24), 1);

	a->o.replica = "A";
	a->layout.nranks = 2;
	agent_rlog_published(a, vi, 2, now);
	s = rlog_said(a, "{\"active\":3,\"lag_versions\":2,\"ranks\":[{\"rank\":0,\"state\":"
			 "\"active\",\"version\":3,\"alive\":true,\"id\":\"A/0\"}]}", 5);
	assert_non_null(strstr(s, "replica A: falls behind, 2 versions (active v3, latest v5"));
	free(s);
	s = rlog_said(a, "{\"active\":5,\"lag_versions\":0,\"ranks\":[]}", 5);
	const char *at = strstr(s, "replica A: caught up: v5 active, the latest (behind for ");
	assert_non_null(at);
	assert_int_equal(sscanf(at + strlen("replica A: caught up: v5 active, the latest (behind for "),
				"%lf", &behind), 1);
	assert_true(behind >= 25.0);
	assert_non_null(strstr(s, "since v4's publish; 2 versions at most)"));
	free(s);

	/* B joins at v24, holding none: not behind until v25 is out. */
	memset(a, 0, sizeof(*a));
	a->o.replica = "B";
	a->layout.nranks = 1;
	s = rlog_said(a, "{\"active\":0,\"lag_versions\":24,\"ranks\":[{\"rank\":0,\"state\":"
			 "\"registered\",\"version\":0,\"alive\":true,\"id\":\"B/0\"}]}", 24);
	assert_string_equal(s, "");
	free(s);
	s = rlog_said(a, "{\"active\":0,\"lag_versions\":25,\"ranks\":[{\"rank\":0,\"state\":"
			 "\"registered\",\"version\":0,\"alive\":true,\"id\":\"B/0\"}]}", 25);
	assert_non_null(strstr(s, "replica B: falls behind, none active yet (joined at v24, "
				  "latest v25; working on v25: rank 0 registered)"));
	assert_null(strstr(s, "v0"));
	free(s);
	s = rlog_said(a, "{\"active\":25,\"lag_versions\":0,\"ranks\":[]}", 25);
	assert_non_null(strstr(s, "replica B: caught up: v25 active, the latest ("));
	assert_non_null(strstr(s, "s after it joined at v24; 2 versions behind at most)"));
	free(s);
	free(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_note_fresh),
		cmocka_unit_test(test_replica_lines),
		cmocka_unit_test_setup_teardown(test_stale_parent_answer, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
