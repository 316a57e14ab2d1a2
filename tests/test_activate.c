/* Replica-local two-phase activation with the real programs: a rank that fails to prepare holds back its replica only. */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define DEADLINE_MS 120000

struct env {
	char dir[256], url[256], ctl[512], model[512], key[512], pub[512];
	char expose_a[512], expose_b0[512], expose_b1[512];
	struct node_proc tracker, publisher, nodes[3];
	struct trk_client *trk;
	struct proto_model m;
};

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
	unsetenv("TESSERA_LEASE_MS");
	free(e);
	return 0;
}

static json_t *get(struct env *e, const char *path)
{
	return tu_get_json(e->trk, path);
}

static bool wait_active(struct env *e, const char *name, uint64_t v)
{
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		if (tu_replica_active(e->trk, name) >= v)
			return true;
		usleep(100000);
	}
	return false;
}

/* The error the tracker lists for replica name's rank, or "" (into buf). */
static const char *rank_error(struct env *e, const char *name, uint32_t rank, char *buf, size_t cap)
{
	json_t *st = get(e, TRK_API "/status"), *rep;
	size_t i;

	buf[0] = 0;
	json_array_foreach(json_object_get(st, "replicas"), i, rep) {
		if (strcmp(json_string_value(json_object_get(rep, "replica")) ?: "", name) != 0)
			continue;
		json_t *rk = json_array_get(json_object_get(rep, "ranks"), rank);
		const char *err = json_string_value(json_object_get(rk, "error"));
		if (err != NULL)
			snprintf(buf, cap, "%s", err);
	}
	json_decref(st);
	return buf;
}

/* Whether the tracker's activation log holds (replica, version), with a time. */
static bool activation_logged(struct env *e, const char *replica, uint64_t v)
{
	json_t *st = get(e, TRK_API "/status"), *a;
	bool found = false;
	size_t i;

	json_array_foreach(json_object_get(st, "activations"), i, a)
		found |= strcmp(json_string_value(json_object_get(a, "replica")) ?: "", replica) == 0 &&
			 (uint64_t)json_integer_value(json_object_get(a, "version")) == v &&
			 json_integer_value(json_object_get(a, "wall_ms")) > 0;
	json_decref(st);
	return found;
}

/* The version a rank's activation record names (0: none). */
static uint64_t record_version(const char *expose, const char *replica, uint32_t rank)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/%s-%u.json", expose, replica, rank);
	json_t *j = tu_load_json(path);
	uint64_t v = j ? (uint64_t)json_integer_value(json_object_get(j, "version")) : 0;
	json_decref(j);
	return v;
}

/*
 * Replica A (TP1) and replica B (TP2) serve v1. B1 then cannot prepare v2
 * (its expose directory became a file, so it cannot stage the activation
 * record): B1 reports the reason and never says verified, so B, both of its
 * ranks, stays on v1 (B0 holds v2 verified and does not switch alone) while
 * A activates v2. Once B1 can prepare, B activates v2 too. The tracker's
 * activation log has (replica, version, time) for each.
 */
static void test_failed_prepare_holds_its_replica_only(void **state)
{
	struct env *e = *state;
	char bin[512], log[600], state_dir[600], err[512];
	struct proto_err perr;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_LEASE_MS", "3000", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose_a, sizeof(e->expose_a), "%s/expose-a", e->dir);
	snprintf(e->expose_b0, sizeof(e->expose_b0), "%s/expose-b0", e->dir);
	snprintf(e->expose_b1, sizeof(e->expose_b1), "%s/expose-b1", e->dir);
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
	tu_start_node(&e->nodes[0], e->dir, e->url, "A", "0", "tp1", e->model, e->pub, e->expose_a,
		      NULL, "A0");
	tu_start_node(&e->nodes[1], e->dir, e->url, "B", "0", "tp2", e->model, e->pub, e->expose_b0,
		      NULL, "B0");
	tu_start_node(&e->nodes[2], e->dir, e->url, "B", "1", "tp2", e->model, e->pub, e->expose_b1,
		      NULL, "B1");

	/* Both layouts registered before the first export, so that it has
	 * parcels for each. */
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		json_t *a = get(e, TRK_API "/replicas/A"), *b = get(e, TRK_API "/replicas/B");
		bool both = a != NULL && b != NULL;
		json_decref(a);
		json_decref(b);
		if (both)
			break;
		usleep(100000);
	}
	tu_control_export(e->ctl, 1);
	assert_true(wait_active(e, "A", 1));
	assert_true(wait_active(e, "B", 1));

	/* B1 can no longer stage an activation record. */
	tu_rmtree(e->expose_b1);
	assert_int_equal(tu_write(e->expose_b1, "a file where a directory should be\n"), 0);
	tu_control_export(e->ctl, 2);
	assert_true(wait_active(e, "A", 2));
	bool said = false;
	for (int w = 0; w < DEADLINE_MS && !said; w += 100) {
		said = strstr(rank_error(e, "B", 1, err, sizeof(err)), "activation record") != NULL;
		if (!said)
			usleep(100000);
	}
	if (!said)
		fail_msg("B1 never reported why it cannot prepare (error '%s')", err);
	/* B0 comes to hold v2 verified (it may finish after B1 failed) but
	 * does not switch alone; B serves v1. */
	bool verified = false;
	for (int w = 0; w < DEADLINE_MS && !verified; w += 100) {
		verified = tu_rank_is(e->trk, "B", 0, 2, "verified");
		if (!verified)
			usleep(100000);
	}
	assert_true(verified);
	assert_int_equal(tu_replica_active(e->trk, "B"), 1);
	assert_int_equal(record_version(e->expose_b0, "B", 0), 1);
	assert_int_equal(tu_sh("grep -q 'v2 active' '%s/B0.log'", e->dir), 1);
	assert_true(activation_logged(e, "A", 2));
	assert_true(activation_logged(e, "B", 1));
	assert_false(activation_logged(e, "B", 2));
	for (int i = 0; i < 3; i++)
		assert_true(node_proc_alive(&e->nodes[i]));

	/* B1 can prepare again: B activates v2, both ranks together. */
	assert_int_equal(unlink(e->expose_b1), 0);
	assert_true(wait_active(e, "B", 2));
	assert_int_equal(record_version(e->expose_b0, "B", 0), 2);
	assert_int_equal(record_version(e->expose_b1, "B", 1), 2);
	assert_true(activation_logged(e, "B", 2));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_failed_prepare_holds_its_replica_only, setup,
						teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
