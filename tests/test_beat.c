/* Heartbeats from their own thread (node/host/beat.h): a node whose loop is held
 * busy keeps its lease; one whose loop stops feeding them loses it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "node/host/beat.h"
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define LEASE "1500"     /* heartbeats every 500 ms */
#define STALL "6000"     /* four leases */
#define DEADLINE_MS 60000

struct env {
	char dir[256], url[256];
	struct node_proc tracker;
	struct trk_client *trk; /* the loop's client: registers A/0 */
	struct proto_model m;
	struct proto_layout l;
	struct event_base *base; /* the node's loop: never run while it is "busy" */
	int gone;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;
	char sdir[300];

	if (e == NULL)
		return 1;
	*state = e;
	/* Set before any thread reads them. */
	setenv("TESSERA_LEASE_MS", LEASE, 1);
	setenv("TESSERA_HEARTBEAT_STALL_MS", STALL, 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(sdir, sizeof(sdir), "%s/state", e->dir);
	tu_start_tracker(&e->tracker, e->dir, sdir, NULL, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	assert_int_equal(proto_fixture_model(1 << 20, &e->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "tp1", &e->l, &err), 0);
	assert_non_null(e->base = event_base_new());
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 2000);
	event_base_free(e->base);
	proto_layout_fini(&e->l);
	proto_model_fini(&e->m);
	tu_rmtree(e->dir);
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_HEARTBEAT_STALL_MS");
	free(e);
	return 0;
}

static void on_gone(void *arg, const char (*ids)[TRK_ID_MAX], size_t n)
{
	struct env *e = arg;
	e->gone += (int)n;
	(void)ids;
}

/* Whether the tracker holds A/0 alive. */
static bool alive(struct env *e)
{
	json_t *j = tu_get_json(e->trk, TRK_API "/replicas/A");
	bool yes = json_is_true(json_object_get(json_array_get(json_object_get(j, "ranks"), 0), "alive"));
	json_decref(j);
	return yes;
}

static void test_busy_loop_keeps_lease(void **state)
{
	struct env *e = *state;
	struct node_beat *b;
	struct proto_err err;
	struct trk_reply r;
	json_t *lj = proto_layout_to_json(&e->m, &e->l);
	struct trk_node_reg reg = {.replica = "A", .addr = {0, "localhost", "tcp;ofi_rxm", "00"},
				   .layout = lj, .model_digest = e->m.digest};
	struct trk_hb_node hb = {.id = "A/0"};

	/* A publisher first: the tracker takes nodes once it knows the model. */
	json_t *mj = proto_model_to_json(&e->m);
	struct trk_rank_addr ra = {0, "localhost", "tcp;ofi_rxm", "00"};
	trk_reply_init(&r);
	assert_int_equal(trk_client_register_publisher(e->trk, mj, lj, &ra, 1, 0, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	if (r.status / 100 != 2)
		fail_msg("register the publisher: %d %s", r.status, r.error);
	trk_reply_fini(&r);
	json_decref(mj);
	trk_reply_init(&r);
	assert_int_equal(trk_client_register_node(e->trk, &reg, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	if (r.status != 200)
		fail_msg("register A/0: %d %s", r.status, r.error);
	trk_reply_fini(&r);
	json_decref(lj);
	assert_int_equal(node_beat_new(e->base, e->url, NULL, NULL, on_gone, e, &b, &err), 0);
	node_beat_feed(b, &hb, 1, e->trk);

	/* The loop is busy from here: e->base does not run and nothing feeds
	 * the beat again. Seven heartbeats answered span two leases (one every
	 * third of a lease), longer than the lease that registration gave. */
	int w;
	for (w = 0; w < DEADLINE_MS && node_beat_sent(b) < 7; w += 50) {
		assert_true(alive(e));
		usleep(50000);
	}
	assert_true(node_beat_sent(b) >= 7);
	assert_true(alive(e));
	/* Never dropped: a heartbeat for a dropped rank is answered "gone". */
	event_base_loop(e->base, EVLOOP_NONBLOCK);
	assert_int_equal(e->gone, 0);

	/* A loop that stays silent past TESSERA_HEARTBEAT_STALL_MS is taken as
	 * hung: its heartbeats stop and the tracker lets the lease run out. */
	for (w = 0; w < DEADLINE_MS && alive(e); w += 100)
		usleep(100000);
	assert_false(alive(e));
	node_beat_free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_busy_loop_keeps_lease, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
