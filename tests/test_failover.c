/* Clients that fail over, with the real programs on loopback: a publisher
 * and a node are given two tracker URLs (--tracker URL,URL). The first
 * tracker is killed (SIGKILL) after version 1; a second one starts on the
 * same state directory (a standby on the dead one's disk) at the second URL.
 * The publisher exports version 2 through it and the node activates it,
 * both having moved to the next tracker of their list on their own, the
 * chain checks kept (same cluster id, no version lost). Lists that mix
 * schemes or hold a bad URL are refused in one line. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define WAIT_MS 120000 /* generous: the machine is shared and slow */

struct env {
	struct tu_hand h; /* its files */
	char url1[256], url2[256], urls[520];
	struct node_proc t1, t2, publisher, node;
	struct trk_client *trk; /* to the second tracker */
	struct proto_model m;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	char bin[512], log[512], listen2[64];

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	tu_hand_files(&e->h, 4, &e->m);

	tu_hand_tracker(&e->t1, &e->h, "127.0.0.1:0", "1", e->url1, sizeof(e->url1));
	snprintf(listen2, sizeof(listen2), "127.0.0.1:%d", tu_free_port());
	snprintf(e->url2, sizeof(e->url2), "http://%s", listen2);
	snprintf(e->urls, sizeof(e->urls), "%s,%s", e->url1, e->url2);

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->h.dir);
	char *pargv[] = {bin, "publish", "--tracker", e->urls, "--key", e->h.key, "--cluster-key",
			 e->h.ckey, "--synthetic-mb", "4", "--layout", "fsdp2", "--log-level", "info",
			 "--control", e->h.sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node-A.log", e->h.dir);
	char *nargv[] = {bin, "--tracker", e->urls, "--replica", "A", "--rank", "0", "--layout",
			 "tp1", "--model", e->h.model, "--trainer-pubkey", e->h.pub, "--cluster-key",
			 e->h.ckey, "--expose", e->h.expose, "--store", "host", "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, log), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->t1, 5000);
	tu_cluster_down(NULL, 0, &e->t2, e->trk, &e->t2, &e->m, e->h.dir);
	free(e);
	return 0;
}

static void failover(void **state)
{
	struct env *e = *state;
	struct trk_client *t1 = NULL;
	struct proto_err err;
	char listen2[64], url[256];

	assert_int_equal(trk_client_new(NULL, e->url1, e->h.cluster_key, &t1, &err), 0);
	if (!tu_wait_alive(t1, "A", 1, WAIT_MS))
		fail_msg("replica A did not register (see %s)", e->h.dir);
	tu_control_export(e->h.sock, 1);
	if (!tu_wait_active(t1, "A", 1, WAIT_MS))
		fail_msg("replica A did not activate v1 (see %s)", e->h.dir);
	trk_client_free(t1);

	/* The first tracker dies; a standby starts on its state. */
	node_proc_kill(&e->t1);
	snprintf(listen2, sizeof(listen2), "%s", e->url2 + strlen("http://"));
	tu_hand_tracker(&e->t2, &e->h, listen2, "2", url, sizeof(url));
	assert_string_equal(url, e->url2);
	assert_int_equal(trk_client_new(NULL, e->url2, e->h.cluster_key, &e->trk, &err), 0);

	/* Version 2 goes out through it, and the node activates it. */
	tu_control_export(e->h.sock, 2);
	if (!tu_wait_active(e->trk, "A", 2, WAIT_MS))
		fail_msg("replica A did not activate v2 through the second tracker (see %s)", e->h.dir);
	json_t *v = tu_get_json(e->trk, TRK_API "/versions?after=0");
	assert_non_null(v);
	assert_int_equal(json_array_size(json_object_get(v, "versions")), 2);
	json_decref(v);
}

/* Tracker lists the programs refuse, in one line, before they start. */
static void bad_lists(void **state)
{
	static const char *const bad[] = {
		"http://127.0.0.1:1,ftp://127.0.0.1:2",
		"http://127.0.0.1:1,https://127.0.0.1:2",
		"http://127.0.0.1:1,",
		"http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3,http://127.0.0.1:4,"
		"http://127.0.0.1:5,http://127.0.0.1:6,http://127.0.0.1:7,http://127.0.0.1:8,"
		"http://127.0.0.1:9",
	};
	struct trk_client *c;
	struct proto_err err;
	char bin[512], dir[256], out[300];

	(void)state;
	tu_bin(bin, sizeof(bin), "tessera-node");
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(out, sizeof(out), "%s/out", dir);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		assert_int_not_equal(trk_client_new(NULL, bad[i], NULL, &c, &err), 0);
		assert_null(c);
		assert_null(strchr(err.msg, '\n'));
		print_message("%s: %s\n", bad[i], err.msg);
		assert_int_not_equal(trk_url_check(bad[i], &err), 0);
		/* Refused with status 2, the line naming --tracker. */
		assert_int_equal(tu_sh("%s --tracker '%s' --replica A --rank 0 --layout tp1 --model m.json "
				       "--trainer-pubkey t.pub >%s 2>&1; test $? -eq 2 && grep -q -- "
				       "'^tessera-node: --tracker ' %s",
				       bin, bad[i], out, out),
				 0);
	}
	assert_int_equal(trk_client_new(NULL, "http://127.0.0.1:1,http://[::1]:2/t/", NULL, &c, &err),
			 0);
	trk_client_free(c);
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(failover, setup, teardown),
		cmocka_unit_test(bad_lists),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
