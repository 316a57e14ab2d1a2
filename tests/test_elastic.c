/* Elastic replicas on loopback, with the real programs: a replica that joins
 * with a layout the latest manifest lacks activates that version through a
 * signed addendum (no new version); forged addenda are refused by the
 * tracker with a one-line 4xx and no state change, and by the node; a node
 * stopped with SIGTERM leaves at once (gone from /sources, its replica
 * incomplete), a killed one at lease expiry. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "node/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define MODEL_MB 2
#define WAIT_MS 90000 /* generous: the machine is shared and slow */
#define NODES_MAX 6

struct env {
	char dir[256], state[512], model[512], key[512], pub[512], ckey[512], expose[512];
	char url[256];
	struct node_proc tracker, publisher, nodes[NODES_MAX];
	int nnodes;
	struct trk_client *trk; /* signed with the cluster key */
	uint8_t cluster_key[PROTO_CLUSTER_KEY_BYTES];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
	struct proto_model m;
};

static void start_tracker(struct env *e)
{
	char bin[512], log[512], line[256];
	struct proto_err err;

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	static int starts;
	/* One log per start: the URL is read from its first line. */
	snprintf(log, sizeof(log), "%s/tracker-%d.log", e->dir, starts++);
	char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state", e->state, "--trainer-pubkey",
			e->pub, "--cluster-key", e->ckey, NULL};
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", argv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line), 20000), 0);
	snprintf(e->url, sizeof(e->url), "%s", line);
	trk_client_free(e->trk);
	assert_int_equal(trk_client_new(NULL, e->url, e->cluster_key, &e->trk, &err), 0);
}

static void start_publisher(struct env *e)
{
	char bin[512], log[512], mb[16];

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	snprintf(mb, sizeof(mb), "%d", MODEL_MB);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--cluster-key",
			e->ckey, "--synthetic-mb", mb, "--layout", "fsdp2", "--versions", "1", "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
}

/* Starts a tessera-node; returns its index in e->nodes. */
static int start_node(struct env *e, const char *replica, int rank, const char *layout)
{
	char bin[512], log[512], rk[16];
	int i = e->nnodes++;

	assert_true(i < NODES_MAX);
	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node-%s-%d.log", e->dir, replica, rank);
	snprintf(rk, sizeof(rk), "%d", rank);
	char *argv[] = {bin, "--tracker", e->url, "--replica", (char *)replica, "--rank", rk,
			"--layout", (char *)layout, "--model", e->model, "--trainer-pubkey", e->pub,
			"--cluster-key", e->ckey, "--expose", e->expose, "--store", "host", "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->nodes[i], "node", argv, log), 0);
	return i;
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;
	char sec[512];

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_LEASE_MS", "60000", 1); /* leaving, not the lease, ends a node */
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->state, sizeof(e->state), "%s/state", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->ckey, sizeof(e->ckey), "%s/cluster.key", e->dir);
	snprintf(sec, sizeof(sec), "%s/trainer", e->dir);
	snprintf(e->key, sizeof(e->key), "%s/trainer.key", e->dir);
	snprintf(e->pub, sizeof(e->pub), "%s/trainer.pub", e->dir);
	mkdir(e->expose, 0755);
	assert_int_equal(proto_keygen(e->key, e->pub, &err), 0);
	assert_int_equal(proto_cluster_keygen(e->ckey, &err), 0);
	assert_int_equal(proto_key_load_cluster(e->ckey, e->cluster_key, &err), 0);
	assert_int_equal(proto_key_load_secret(e->key, e->sk, &err), 0);
	assert_int_equal(proto_key_load_public(e->pub, e->pk, &err), 0);
	assert_int_equal(proto_fixture_model((uint64_t)MODEL_MB << 20, &e->m, &err), 0);
	tu_write_model(&e->m, e->model);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	for (int i = 0; i < e->nnodes; i++)
		node_proc_stop(&e->nodes[i], 5000);
	node_proc_stop(&e->publisher, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	proto_model_fini(&e->m);
	sodium_memzero(e->sk, sizeof(e->sk));
	if (getenv("TESSERA_TEST_KEEP") != NULL)
		print_message("kept %s\n", e->dir);
	else
		tu_rmtree(e->dir);
	unsetenv("TESSERA_LEASE_MS");
	free(e);
	return 0;
}

/* GET path: the answer (status checked against want), its JSON kept. */
static json_t *get_json(struct env *e, const char *path, int want)
{
	struct trk_reply r;

	assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
	if (r.status != want)
		fail_msg("GET %s: %d %s", path, r.status, r.error);
	json_t *j = json_incref(r.json);
	trk_reply_fini(&r);
	return j;
}

/* Replica name's entry in /status (a new reference) or NULL. */
static json_t *replica(struct env *e, const char *name)
{
	json_t *st = get_json(e, TRK_API "/status", 200), *v, *out = NULL;
	size_t i;

	json_array_foreach(json_object_get(st, "replicas"), i, v)
		if (strcmp(json_string_value(json_object_get(v, "replica")), name) == 0)
			out = json_incref(v);
	json_decref(st);
	return out;
}

static uint64_t jint(json_t *o, const char *k)
{
	return (uint64_t)json_integer_value(json_object_get(o, k));
}

/* Waits (bounded) until replica name is active at v. */
static void wait_active(struct env *e, const char *name, uint64_t v)
{
	for (int waited = 0; waited < WAIT_MS; waited += 200) {
		json_t *rep = replica(e, name);
		uint64_t a = rep ? jint(rep, "active") : 0;
		json_decref(rep);
		if (a == v)
			return;
		usleep(200000);
	}
	fail_msg("replica %s did not activate v%" PRIu64 " (see %s)", name, v, e->dir);
}

/* Version v's entry in /status (a new reference). */
static json_t *version_entry(struct env *e, uint64_t v)
{
	json_t *st = get_json(e, TRK_API "/status", 200), *x, *out = NULL;
	size_t i;

	json_array_foreach(json_object_get(st, "versions"), i, x)
		if (jint(x, "version") == v)
			out = json_incref(x);
	json_decref(st);
	assert_non_null(out);
	return out;
}

/* POSTs addendum bytes; the status, and the error in err (one line). */
static int post_addendum(struct env *e, const uint8_t *b, size_t len, char *err, size_t cap)
{
	struct trk_reply r;
	int st;

	trk_reply_init(&r);
	assert_int_equal(trk_client_post_addendum(e->trk, b, len, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	st = r.status;
	snprintf(err, cap, "%s", r.error);
	trk_reply_fini(&r);
	return st;
}

/* The tracker refuses b with code and a one-line error naming needle, and
 * still holds exactly the one addendum of v1 it had (digest d). */
static void expect_refused(struct env *e, const uint8_t *b, size_t len, int code,
			   const char *needle, const char *d)
{
	char err[600];
	int st = post_addendum(e, b, len, err, sizeof(err));
	json_t *l;

	if (st != code || strstr(err, needle) == NULL || strchr(err, '\n') != NULL)
		fail_msg("want %d '%s', got %d '%s'", code, needle, st, err);
	l = get_json(e, TRK_API "/addenda?version=1", 200);
	assert_int_equal(json_array_size(json_object_get(l, "addenda")), 1);
	assert_string_equal(json_string_value(json_object_get(
				    json_array_get(json_object_get(l, "addenda"), 0), "digest")), d);
	json_decref(l);
}

/* Signs a (edited) with sk into a new buffer. */
static uint8_t *resign(struct proto_addendum *a, const uint8_t *sk, size_t *len)
{
	struct proto_err err;
	uint8_t *b;

	assert_int_equal(proto_addendum_sign(a, sk, &b, len, &err), 0);
	return b;
}

static void test_late_layout_addendum(void **state)
{
	struct env *e = *state;
	char path[400], d[2 * PROTO_HASH_BYTES + 1], hex[2 * PROTO_HASH_BYTES + 1];
	struct proto_addendum a;
	struct proto_err err;
	struct trk_reply r;
	uint8_t *b, opk[PROTO_PK_BYTES], osk[PROTO_SK_BYTES], keep[PROTO_HASH_BYTES];
	size_t blen;
	json_t *rep, *ve, *ad;

	start_tracker(e);
	start_node(e, "A", 0, "tp2");
	start_node(e, "A", 1, "tp2");
	start_publisher(e);
	wait_active(e, "A", 1);

	/* B joins with tp1, which version 1's manifest does not list. */
	int bi = start_node(e, "B", 0, "tp1");
	wait_active(e, "B", 1);
	assert_int_equal(tu_sh("grep -q 'extended for our layout by its signed addendum' %s",
			       e->nodes[bi].log), 0);
	ve = version_entry(e, 1);
	rep = replica(e, "B");
	{
		json_t *vl = get_json(e, TRK_API "/versions", 200);
		assert_int_equal(jint(vl, "latest"), 1);
		json_decref(vl);
	}
	ad = json_object_get(ve, "addenda");
	assert_int_equal(json_array_size(ad), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(ad, 0), "layout_digest")),
			    json_string_value(json_object_get(rep, "layout_digest")));
	assert_int_equal(json_array_size(json_object_get(ve, "uncovered_layouts")), 0);
	snprintf(d, sizeof(d), "%s",
		 json_string_value(json_object_get(json_array_get(ad, 0), "digest")));
	snprintf(hex, sizeof(hex), "%s", json_string_value(json_object_get(rep, "layout_digest")));
	json_decref(rep);
	json_decref(ve);

	/* The stored addendum, as nodes get it. */
	snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%s", hex);
	assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(proto_addendum_decode(r.body, r.len, e->pk, &a, &err), 0);

	/* Forged: tampered hash, another key, bound to another manifest, an
	 * unknown version, a layout the manifest lists, garbage. */
	b = malloc(r.len);
	memcpy(b, r.body, r.len);
	b[r.len / 2] ^= 1;
	expect_refused(e, b, r.len, 400, "bad signature", d);
	free(b);
	crypto_sign_keypair(opk, osk);
	b = resign(&a, osk, &blen);
	expect_refused(e, b, blen, 400, "bad signature", d);
	free(b);
	memcpy(keep, a.manifest_digest, sizeof(keep));
	a.manifest_digest[0] ^= 1;
	b = resign(&a, e->sk, &blen);
	expect_refused(e, b, blen, 409, "another manifest", d);
	free(b);
	memcpy(a.manifest_digest, keep, sizeof(keep));
	a.version = 7;
	b = resign(&a, e->sk, &blen);
	expect_refused(e, b, blen, 404, "unknown", d);
	free(b);
	a.version = 1;
	{
		struct proto_layout tp2;
		assert_int_equal(proto_layout_builtin(&e->m, "tp2", &tp2, &err), 0);
		memcpy(keep, a.layout.layout_digest, sizeof(keep));
		memcpy(a.layout.layout_digest, tp2.digest, PROTO_HASH_BYTES);
		proto_layout_fini(&tp2);
	}
	b = resign(&a, e->sk, &blen);
	expect_refused(e, b, blen, 409, "already lists", d);
	free(b);
	expect_refused(e, (const uint8_t *)"hello", 5, 400, "shorter", d);
	/* The genuine one again: the same answer, nothing new. */
	{
		char msg[600];
		assert_int_equal(post_addendum(e, r.body, r.len, msg, sizeof(msg)), 200);
	}
	proto_addendum_fini(&a);
	trk_reply_fini(&r);

	/* Stored with the version: a restarted tracker still has it. */
	node_proc_stop(&e->tracker, 5000);
	start_tracker(e);
	ve = get_json(e, TRK_API "/addenda?version=1", 200);
	ad = json_object_get(ve, "addenda");
	assert_int_equal(json_array_size(ad), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(ad, 0), "digest")), d);
	json_decref(ve);
	json_t *bad = get_json(e, TRK_API "/addenda?version=0", 400);
	json_decref(bad);
	bad = get_json(e, TRK_API "/addenda?version=1&layout=zz", 400);
	json_decref(bad);
	snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%064d", 0);
	bad = get_json(e, path, 404);
	json_decref(bad);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_late_layout_addendum, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
