/* Cross-layout sources on loopback, with the real programs: a TP1 node
 * completes a version from the two ranks of a TP2 replica while the
 * trainer uploads nothing (its publisher stopped); a TP2 rank that serves
 * a damaged slot is banned by the TP1 reader, which still activates the
 * right bytes (every assembled chunk is checked against its own layout's
 * hashes); the tracker's /holders and slot offers refuse bad input with a
 * one-line 4xx and no change. A mixed first wave (TP2 and TP1 replicas
 * fetching at once) costs the trainer about one copy: the TP1 node reads
 * the TP2 ranks' verified blocks while they still fetch (partial holders),
 * never an unverified one; a partial holder whose have-map lies is banned. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>
#include <sys/stat.h>

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define MODEL_MB 2
#define WAIT_MS 90000 /* generous: the machine is shared and slow */
#define NODES_MAX 4

struct env {
	char dir[256], state[512], model[512], key[512], pub[512], expose[512], sock[512];
	char url[256];
	struct node_proc tracker, publisher, nodes[NODES_MAX];
	int nnodes;
	struct trk_client *trk;
	struct proto_model m;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;
	char bin[512], log[600], mb[16];

	assert_non_null(e);
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_LEASE_MS", "60000", 1); /* a stopped process stays a member */
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->state, sizeof(e->state), "%s/state", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->sock, sizeof(e->sock), "%s/publisher.sock", e->dir);
	mkdir(e->expose, 0755);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model((uint64_t)MODEL_MB << 20, &e->m, &err), 0);
	tu_write_model(&e->m, e->model);
	tu_start_tracker(&e->tracker, e->dir, e->state, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	/* The publisher exports only when told (its control socket). */
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	snprintf(mb, sizeof(mb), "%d", MODEL_MB);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", mb,
			"--layout", "fsdp2", "--log-level", "info", "--control", e->sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	for (int i = 0; i < e->nnodes; i++) {
		if (e->nodes[i].pid > 0)
			kill(e->nodes[i].pid, SIGCONT);
		node_proc_stop(&e->nodes[i], 5000);
	}
	if (e->publisher.pid > 0)
		kill(e->publisher.pid, SIGCONT);
	node_proc_stop(&e->publisher, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	proto_model_fini(&e->m);
	if (getenv("TESSERA_TEST_KEEP") != NULL)
		print_message("kept %s\n", e->dir);
	else
		tu_rmtree(e->dir);
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
	unsetenv("TESSERA_XL_PATIENCE_MS");
	unsetenv("TESSERA_FETCH_MBPS");
	free(e);
	return 0;
}

static int start_node(struct env *e, const char *replica, const char *rank, const char *layout)
{
	char tag[64];
	int i = e->nnodes++;

	assert_true(i < NODES_MAX);
	snprintf(tag, sizeof(tag), "node-%s-%s", replica, rank);
	tu_start_node(&e->nodes[i], e->dir, e->url, replica, rank, layout, e->model, e->pub,
		      e->expose, NULL, tag);
	return i;
}

static json_t *get_json(struct env *e, const char *path, int want)
{
	struct trk_reply r;

	assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
	if (r.status != want)
		fail_msg("GET %s: %d %s (want %d)", path, r.status, r.error, want);
	json_t *j = json_incref(r.json);
	trk_reply_fini(&r);
	return j;
}

/* Rank id's entry in /status (a new reference; NULL if absent). */
static json_t *rank_entry(struct env *e, const char *id)
{
	json_t *st = get_json(e, TRK_API "/status", 200), *rep, *rk, *out = NULL;
	size_t i, j;

	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		json_array_foreach(json_object_get(rep, "ranks"), j, rk) {
			const char *rid = json_string_value(json_object_get(rk, "id"));
			if (rid != NULL && strcmp(rid, id) == 0)
				out = json_incref(rk);
		}
	json_decref(st);
	return out;
}

static uint64_t jint(json_t *o, const char *k)
{
	return (uint64_t)json_integer_value(json_object_get(o, k));
}

/* Waits (bounded) until node id is registered and alive. */
static void wait_registered(struct env *e, const char *id)
{
	for (int waited = 0; waited < WAIT_MS; waited += 100) {
		json_t *rk = rank_entry(e, id);
		bool alive = rk != NULL && json_is_true(json_object_get(rk, "alive"));
		json_decref(rk);
		if (alive)
			return;
		usleep(100000);
	}
	fail_msg("%s did not register (see %s)", id, e->dir);
}

/* The digest (hex) replica name registered its layout with. */
static void replica_layout(struct env *e, const char *name, char *hex, size_t len)
{
	char path[128];

	snprintf(path, sizeof(path), TRK_API "/replicas/%s", name);
	json_t *r = get_json(e, path, 200);
	snprintf(hex, len, "%s", json_string_value(json_object_get(r, "layout_digest")));
	json_decref(r);
}

/* A TP2 replica and a TP1 node are registered (the TP1 node stopped, so
 * that the version lists its layout but it fetches nothing yet); v1 is
 * exported and the TP2 replica activates it. Returns the TP1 node's index. */
static int tp2_then_stopped_tp1(struct env *e, bool liar)
{
	start_node(e, "A", "0", "tp2");
	if (liar)
		setenv("TESSERA_TEST_CORRUPT_SERVE", "1", 1); /* A/1 serves a damaged slot */
	start_node(e, "A", "1", "tp2");
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
	int c = start_node(e, "C", "0", "tp1");
	wait_registered(e, "C/0");
	assert_int_equal(kill(e->nodes[c].pid, SIGSTOP), 0);
	tu_control_export(e->sock, 1);
	if (!tu_wait_active(e->trk, "A", 1, WAIT_MS))
		fail_msg("replica A did not activate v1 (see %s)", e->dir);
	return c;
}

/* Waits (bounded) until /holders for layout lhex lists replica name. */
static json_t *wait_holder(struct env *e, const char *lhex, const char *name)
{
	char path[256];

	snprintf(path, sizeof(path), TRK_API "/holders?version=1&layout=%s", lhex);
	for (int waited = 0; waited < WAIT_MS; waited += 100) {
		json_t *h = get_json(e, path, 200), *x;
		size_t i;
		json_array_foreach(json_object_get(h, "holders"), i, x)
			if (strcmp(json_string_value(json_object_get(x, "replica")), name) == 0) {
				json_t *out = json_incref(x);
				json_decref(h);
				return out;
			}
		json_decref(h);
		usleep(100000);
	}
	fail_msg("/holders never listed %s (see %s)", name, e->dir);
	return NULL;
}

static int post_offer(struct env *e, const char *body, char *err, size_t cap)
{
	struct trk_reply r;
	int st;

	assert_int_equal(trk_client_call(e->trk, "POST", TRK_API "/offers", "application/json",
					 body, strlen(body), &r), 0);
	st = r.status;
	snprintf(err, cap, "%s", r.error);
	trk_reply_fini(&r);
	return st;
}

/* The done-when of cross-layout sources: the trainer capped to nothing
 * (its publisher stopped once the TP2 replica is active), the TP1 node
 * still completes, every byte from the TP2 replica's two ranks. */
static void test_tp1_from_tp2_ranks(void **state)
{
	struct env *e = *state;
	char tp1[80], tp2[80], path[256], err[512], body[512];

	int c = tp2_then_stopped_tp1(e, false);
	replica_layout(e, "A", tp2, sizeof(tp2));
	replica_layout(e, "C", tp1, sizeof(tp1));
	/* A offers its two ranks' memory: listed for readers of tp1. */
	json_t *h = wait_holder(e, tp1, "A");
	assert_string_equal(json_string_value(json_object_get(h, "layout")), tp2);
	assert_int_equal(jint(h, "nranks"), 2);
	json_t *srcs = json_object_get(h, "sources");
	assert_int_equal(json_array_size(srcs), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(srcs, 0), "id")), "A/0");
	assert_string_equal(json_string_value(json_object_get(json_array_get(srcs, 1), "id")), "A/1");
	json_decref(h);
	/* Never to readers of its own layout (they are its parcels' swarm). */
	snprintf(path, sizeof(path), TRK_API "/holders?version=1&layout=%s", tp2);
	h = get_json(e, path, 200);
	assert_int_equal(json_array_size(json_object_get(h, "holders")), 0);
	json_decref(h);

	/* Bad input: each refused with one line, nothing changed. */
	h = get_json(e, TRK_API "/holders?version=1&layout=zz", 400);
	json_decref(h);
	snprintf(path, sizeof(path), TRK_API "/holders?layout=%s", tp1);
	json_decref(get_json(e, path, 400));
	snprintf(path, sizeof(path), TRK_API "/holders?version=99&layout=%s", tp1);
	json_decref(get_json(e, path, 404));
	snprintf(body, sizeof(body),
		 "{\"id\":\"A/1\",\"version\":1,\"parcels\":[],\"slot\":{\"addr\":\"1\",\"key\":\"2\",\"len\":5}}");
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	assert_non_null(strstr(err, "slot: len 5 but rank 1"));
	assert_null(strchr(err, '\n'));
	snprintf(body, sizeof(body), "{\"id\":\"A/1\",\"version\":1,\"parcels\":[],\"slot\":\"x\"}");
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	assert_non_null(strstr(err, "slot: must be an object"));
	snprintf(body, sizeof(body),
		 "{\"id\":\"A/1\",\"version\":1,\"parcels\":[],\"slot\":{\"addr\":\"x\",\"key\":\"2\",\"len\":5}}");
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	json_t *st = get_json(e, TRK_API "/status", 200);
	const char *pid = json_string_value(
		json_object_get(json_array_get(json_object_get(st, "publishers"), 0), "id"));
	assert_non_null(pid);
	snprintf(body, sizeof(body),
		 "{\"id\":\"%s\",\"version\":1,\"parcels\":[],\"slot\":{\"addr\":\"1\",\"key\":\"2\",\"len\":5}}",
		 pid);
	json_decref(st);
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	assert_non_null(strstr(err, "only a node offers one"));
	h = wait_holder(e, tp1, "A"); /* still listed, with both ranks */
	assert_int_equal(json_array_size(json_object_get(h, "sources")), 2);
	json_decref(h);

	/* The trainer uploads nothing from now on. */
	assert_int_equal(kill(e->publisher.pid, SIGSTOP), 0);
	assert_int_equal(kill(e->nodes[c].pid, SIGCONT), 0);
	if (!tu_wait_active(e->trk, "C", 1, WAIT_MS))
		fail_msg("replica C did not activate v1 from replica A (see %s)", e->dir);
	json_t *rk = rank_entry(e, "C/0");
	assert_non_null(rk);
	assert_true(jint(rk, "bytes_total") > 0);
	assert_int_equal(jint(rk, "bytes_from_trainer"), 0);
	assert_int_equal(jint(rk, "bytes_from_peers"), jint(rk, "bytes_total"));
	json_decref(rk);
	assert_int_equal(kill(e->publisher.pid, SIGCONT), 0);
}

/* A holder rank that serves damaged bytes: the TP1 reader's chunks fail
 * its own hashes, it bans the holder and completes from the trainer. */
static void test_lying_holder_banned(void **state)
{
	struct env *e = *state;
	char tp1[80];

	int c = tp2_then_stopped_tp1(e, true);
	replica_layout(e, "C", tp1, sizeof(tp1));
	json_decref(wait_holder(e, tp1, "A"));
	assert_int_equal(kill(e->nodes[c].pid, SIGCONT), 0);
	if (!tu_wait_active(e->trk, "C", 1, WAIT_MS))
		fail_msg("replica C did not activate v1 (see %s)", e->dir);
	json_t *rk = rank_entry(e, "C/0");
	assert_non_null(rk);
	const char *banned = json_string_value(json_object_get(rk, "banned"));
	if (banned == NULL || strstr(banned, "A") == NULL)
		fail_msg("C/0 banned '%s', want the lying holder (see %s)", banned ? banned : "", e->dir);
	assert_true(jint(rk, "bytes_from_trainer") > 0); /* what the liar could not give */
	assert_int_equal(jint(rk, "bytes_done"), jint(rk, "bytes_total"));
	json_decref(rk);
}

/* Starts TP2 replica A (A/1 lying about its have-map and capped to the
 * slowest fetch rate when liar) and TP1 replica C at once, waits until
 * all are registered and exports v1. A TP1 node waits for the TP2 replica
 * (the leading layout) as long as the test runs: the trainer's upload
 * does not depend on how fast this machine is. */
static void mixed_wave(struct env *e, bool liar)
{
	setenv("TESSERA_XL_PATIENCE_MS", "600000", 1);
	start_node(e, "A", "0", "tp2");
	if (liar) {
		setenv("TESSERA_TEST_CORRUPT_SERVE", "1", 1);
		setenv("TESSERA_FETCH_MBPS", "1", 1); /* its blocks come slowly */
	}
	start_node(e, "A", "1", "tp2");
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
	unsetenv("TESSERA_FETCH_MBPS");
	start_node(e, "C", "0", "tp1");
	wait_registered(e, "A/0");
	wait_registered(e, "A/1");
	wait_registered(e, "C/0");
	tu_control_export(e->sock, 1);
}

/* Log of node tag contains needle. */
static bool log_has(struct env *e, const char *tag, const char *needle)
{
	char path[600];
	uint8_t *buf;
	size_t len;
	struct proto_err err;

	snprintf(path, sizeof(path), "%s/%s.log", e->dir, tag);
	if (proto_read_file(path, 64u << 20, &buf, &len, &err) != 0)
		fail_msg("cannot read %s: %s", path, err.msg);
	bool has = memmem(buf, len, needle, strlen(needle)) != NULL;
	free(buf);
	return has;
}

/* Part 3's done-when: a TP2 and a TP1 replica fetch v1 at once; the
 * trainer uploads about one copy of the model in all (the readers' own
 * counters: every byte a node took from the publisher), the TP1 node
 * almost nothing; no chunk it read failed its hash (it never read a
 * block a holder had not verified); both replicas activate v1, every
 * chunk checked against the signed manifest. */
static void test_mixed_wave_one_copy(void **state)
{
	struct env *e = *state;
	char tp1[80], path[256], err[512], body[512];

	mixed_wave(e, false);
	if (!tu_wait_active(e->trk, "A", 1, WAIT_MS) || !tu_wait_active(e->trk, "C", 1, WAIT_MS))
		fail_msg("replicas A and C did not both activate v1 (see %s)", e->dir);
	uint64_t trainer = 0, S = 0;
	const char *ids[] = {"A/0", "A/1", "C/0"};
	for (int i = 0; i < 3; i++) {
		json_t *rk = rank_entry(e, ids[i]);
		assert_non_null(rk);
		assert_int_equal(jint(rk, "bytes_done"), jint(rk, "bytes_total"));
		trainer += jint(rk, "bytes_from_trainer");
		if (i == 2)
			S = jint(rk, "bytes_total"); /* TP1: the whole model */
		print_message("%s: %" PRIu64 " bytes from the trainer, %" PRIu64 " from peers\n", ids[i],
			      jint(rk, "bytes_from_trainer"), jint(rk, "bytes_from_peers"));
		json_decref(rk);
	}
	assert_true(S > ((uint64_t)MODEL_MB << 20) / 2);
	if (trainer > S + S / 4)
		fail_msg("the trainer uploaded %" PRIu64 " bytes for a model of %" PRIu64 " (see %s)",
			 trainer, S, e->dir);
	json_t *rk = rank_entry(e, "C/0");
	if (jint(rk, "bytes_from_trainer") > S / 8)
		fail_msg("C/0 took %" PRIu64 " bytes from the trainer (see %s)",
			 jint(rk, "bytes_from_trainer"), e->dir);
	const char *banned = json_string_value(json_object_get(rk, "banned"));
	if (banned != NULL && banned[0] != 0)
		fail_msg("C/0 banned '%s' (see %s)", banned, e->dir);
	json_decref(rk);
	if (log_has(e, "node-C-0", "failed its hash"))
		fail_msg("C/0 read bytes a holder had not verified (see %s)", e->dir);

	/* A partial slot's have-map: bad input refused with one line. */
	replica_layout(e, "C", tp1, sizeof(tp1));
	snprintf(path, sizeof(path), TRK_API "/holders?version=1&layout=%s", tp1);
	json_t *h = get_json(e, path, 200);
	assert_true(json_is_array(json_object_get(h, "fetching")));
	json_decref(h);
	snprintf(body, sizeof(body),
		 "{\"id\":\"A/1\",\"version\":1,\"parcels\":[],\"slot\":{\"addr\":\"1\",\"key\":\"2\","
		 "\"len\":1048576,\"have\":\"x\"}}");
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	assert_non_null(strstr(err, "slot.have: must be an object"));
	assert_null(strchr(err, '\n'));
	snprintf(body, sizeof(body),
		 "{\"id\":\"A/1\",\"version\":1,\"parcels\":[],\"slot\":{\"addr\":\"1\",\"key\":\"2\","
		 "\"len\":1048576,\"have\":{\"addr\":\"-1\",\"key\":\"3\"}}}");
	assert_int_equal(post_offer(e, body, err, sizeof(err)), 400);
	assert_non_null(strstr(err, "slot.have"));
	h = wait_holder(e, tp1, "A"); /* unchanged: complete, both ranks */
	assert_true(json_is_true(json_object_get(h, "complete")));
	assert_int_equal(json_array_size(json_object_get(h, "sources")), 2);
	json_decref(h);
}

/* A partial holder rank whose have-map claims blocks it has not verified
 * (TESSERA_TEST_CORRUPT_SERVE; it fetches slowly, so they are not there):
 * the TP1 reader's chunks fail its own hashes, it bans the holder, stops
 * waiting for it and completes from the trainer, with the right bytes. */
static void test_lying_have_map_banned(void **state)
{
	struct env *e = *state;

	mixed_wave(e, true);
	if (!tu_wait_active(e->trk, "C", 1, WAIT_MS))
		fail_msg("replica C did not activate v1 (see %s)", e->dir);
	json_t *rk = rank_entry(e, "C/0");
	assert_non_null(rk);
	const char *banned = json_string_value(json_object_get(rk, "banned"));
	if (banned == NULL || strstr(banned, "A") == NULL)
		fail_msg("C/0 banned '%s', want the lying holder (see %s)", banned ? banned : "", e->dir);
	assert_int_equal(jint(rk, "bytes_done"), jint(rk, "bytes_total"));
	assert_true(jint(rk, "bytes_from_trainer") > 0); /* what the liar could not give */
	json_decref(rk);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_tp1_from_tp2_ranks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lying_holder_banned, setup, teardown),
		cmocka_unit_test_setup_teardown(test_mixed_wave_one_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lying_have_map_banned, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
