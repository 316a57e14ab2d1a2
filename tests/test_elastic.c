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
#include <arpa/inet.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <strings.h>

#include <sys/queue.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <pthread.h>

#include "fabric/fab.h"
#include "node/cli/proc.h"
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
			e->pub, "--cluster-key", e->ckey, "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", argv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line), 20000), 0);
	snprintf(e->url, sizeof(e->url), "%s", line);
	trk_client_free(e->trk);
	assert_int_equal(trk_client_new(NULL, e->url, e->cluster_key, &e->trk, &err), 0);
}

/* Publishes one version (or, with control, none: it only serves what the
 * tracker has, as after a restart) and serves until stopped. */
static void start_publisher_opt(struct env *e, bool control)
{
	char bin[512], log[512], mb[16], ctl[512];

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	snprintf(mb, sizeof(mb), "%d", MODEL_MB);
	snprintf(ctl, sizeof(ctl), "%s/publisher.sock", e->dir);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--cluster-key",
			e->ckey, "--synthetic-mb", mb, "--layout", "fsdp2", "--log-level", "info",
			control ? "--control" : "--versions", control ? ctl : "1", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
}

static void start_publisher(struct env *e)
{
	start_publisher_opt(e, false);
}

static int start_node_at(struct env *e, const char *url, const char *replica, int rank,
			 const char *layout);

/* Starts a tessera-node; returns its index in e->nodes. */
static int start_node(struct env *e, const char *replica, int rank, const char *layout)
{
	return start_node_at(e, e->url, replica, rank, layout);
}

static int start_node_at(struct env *e, const char *url, const char *replica, int rank,
			 const char *layout)
{
	char bin[512], log[512], rk[16];
	int i = e->nnodes++;

	assert_true(i < NODES_MAX);
	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node-%s-%d.log", e->dir, replica, rank);
	snprintf(rk, sizeof(rk), "%d", rank);
	char *argv[] = {bin, "--tracker", (char *)url, "--replica", (char *)replica, "--rank", rk,
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
	/* No periodic check within the test: the publisher learns of B's
	 * layout from its held watch alone. */
	setenv("TESSERA_PUB_CHECK_MS", "600000", 1);
	start_publisher(e);
	unsetenv("TESSERA_PUB_CHECK_MS");
	wait_active(e, "A", 1);

	/* Held before B comes: a publisher's watch for replicas coming alive
	 * and a node's wait for the addendum of tp1 (neither can be answered
	 * yet: a round trip on the other connection finds them pending). */
	struct trk_reply lw, aw;
	uint64_t rev0;
	{
		struct proto_layout tp1;
		json_t *vl = get_json(e, TRK_API "/versions", 200);
		rev0 = (uint64_t)jint(vl, "layouts_rev");
		json_decref(vl);
		assert_int_equal(proto_layout_builtin(&e->m, "tp1", &tp1, &err), 0);
		memcpy(keep, tp1.digest, sizeof(keep));
		proto_layout_fini(&tp1);
		trk_reply_init(&lw);
		trk_reply_init(&aw);
		assert_int_equal(trk_client_watch_layouts(e->trk, 1, rev0, TRK_WAIT_MAX_MS, trk_reply_cb,
							  &lw), 0);
		assert_int_equal(trk_client_get_addendum(e->trk, 1, keep, TRK_WAIT_MAX_MS, trk_reply_cb,
							 &aw), 0);
		vl = get_json(e, TRK_API "/versions", 200);
		json_decref(vl);
		assert_false(lw.done);
		assert_false(aw.done);
	}

	/* B joins with tp1, which version 1's manifest does not list. */
	int bi = start_node(e, "B", 0, "tp1");
	wait_active(e, "B", 1);
	assert_int_equal(tu_sh("grep -q 'extended for our layout by its signed addendum' %s",
			       e->nodes[bi].log), 0);
	/* Both were answered by the events, not by their 30 s wait: B came
	 * alive (layouts_rev moved), then its addendum was posted. */
	trk_client_wait(e->trk, &lw);
	assert_int_equal(lw.status, 200);
	assert_true((uint64_t)jint(lw.json, "layouts_rev") > rev0);
	trk_client_wait(e->trk, &aw);
	assert_int_equal(aw.status, 200);
	assert_int_equal(proto_addendum_decode(aw.body, aw.len, e->pk, &a, &err), 0);
	assert_memory_equal(a.layout.layout_digest, keep, PROTO_HASH_BYTES);
	proto_addendum_fini(&a);
	trk_reply_fini(&lw);
	trk_reply_fini(&aw);
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

	/* A restarted publisher serves the added layout again: it makes the
	 * same addendum (the tracker answers 200, nothing new) and offers. */
	node_proc_stop(&e->publisher, 5000);
	start_publisher_opt(e, true);
	for (int waited = 0; tu_sh("test $(grep -c 'extended by 1 addenda' %s/publisher.log) -ge 2",
				   e->dir) != 0; waited += 200) {
		if (waited > WAIT_MS)
			fail_msg("the restarted publisher did not extend v1 again (see %s)", e->dir);
		usleep(200000);
	}

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
	/* A raw copy of a layout the anchor lists: refused (an anchor is raw),
	 * and a wish for one is not kept. */
	a.copy = true;
	b = resign(&a, e->sk, &blen);
	expect_refused(e, b, blen, 409, "an anchor", d);
	free(b);
	a.copy = false;
	{
		char lh[2 * PROTO_HASH_BYTES + 1];
		sodium_bin2hex(lh, sizeof(lh), a.layout.layout_digest, PROTO_HASH_BYTES);
		snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%s&copy=1", lh);
		json_decref(get_json(e, path, 404));
		json_t *vs = get_json(e, TRK_API "/versions", 200);
		json_t *v1 = json_array_get(json_object_get(vs, "versions"), 0);
		assert_int_equal(json_array_size(json_object_get(v1, "copy_wanted")), 0);
		json_decref(vs);
	}
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
	bad = get_json(e, TRK_API "/addenda?version=1&layout=zz&wait_ms=-1", 400);
	json_decref(bad);
	bad = get_json(e, TRK_API "/versions?after=1&wait_ms=100&layouts_rev=x", 400);
	json_decref(bad);
	/* A wait for an addendum nobody posts ends as a 404. */
	snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%064d&wait_ms=50", 0);
	bad = get_json(e, path, 404);
	json_decref(bad);
	snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%064d", 0);
	bad = get_json(e, path, 404);
	json_decref(bad);

	/* A damaged stored addendum stops the tracker with the file's name. */
	node_proc_stop(&e->tracker, 5000);
	assert_int_equal(tu_sh("f=$(ls %s/addenda/*.addendum) && printf '\\001' | "
			       "dd of=$f bs=1 seek=200 conv=notrunc status=none", e->state), 0);
	{
		char bin[512], log[512];
		tu_bin(bin, sizeof(bin), "tessera-tracker");
		snprintf(log, sizeof(log), "%s/tracker-damaged.log", e->dir);
		char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state", e->state,
				"--trainer-pubkey", e->pub, NULL};
		assert_int_equal(node_proc_spawn(&e->tracker, "tracker", argv, log), 0);
		for (int waited = 0; node_proc_alive(&e->tracker); waited += 100) {
			if (waited > WAIT_MS)
				fail_msg("the tracker started on a damaged addendum");
			usleep(100000);
		}
		assert_int_not_equal(WEXITSTATUS(e->tracker.status), 0);
		assert_int_equal(tu_sh("grep -q 'addenda/.*addendum: bad signature' %s", log), 0);
	}
}


/* Waits (bounded) until replica name's entry says incomplete. */
static void wait_incomplete(struct env *e, const char *name)
{
	for (int waited = 0; waited < WAIT_MS; waited += 100) {
		json_t *rep = replica(e, name);
		bool inc = rep != NULL && json_is_true(json_object_get(rep, "incomplete"));
		json_decref(rep);
		if (inc)
			return;
		usleep(100000);
	}
	fail_msg("replica %s never showed incomplete (see %s)", name, e->dir);
}

/* Whether /sources for (v, layout hex, 0 -> 0) lists id. */
static bool listed(struct env *e, const char *lhex, const char *id)
{
	char path[400];
	json_t *j, *x;
	size_t i;
	bool found = false;

	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=0",
		 lhex);
	j = get_json(e, path, 200);
	json_array_foreach(json_object_get(j, "sources"), i, x)
		found |= strcmp(json_string_value(json_object_get(x, "id")), id) == 0;
	json_decref(j);
	return found;
}

static int post_status(struct trk_client *c, int (*send)(struct trk_reply *r, void *arg), void *arg)
{
	struct trk_reply r;
	int st;

	trk_reply_init(&r);
	assert_int_equal(send(&r, arg), 0);
	trk_client_wait(c, &r);
	st = r.status;
	trk_reply_fini(&r);
	return st;
}

struct leave_arg {
	struct trk_client *c;
	const char *id;
};

static int send_leave(struct trk_reply *r, void *arg)
{
	struct leave_arg *l = arg;
	return trk_client_leave(l->c, l->id, trk_reply_cb, r);
}

/*
 * A node stopped with SIGTERM leaves at once: its replica shows incomplete
 * and is no longer counted active at the version, the tracker logs it as
 * left (not as a lapsed lease: the lease here is 60 s). Nodes do not serve
 * peers yet, so a peer source is played by this test: a registered node C/0
 * offering its parcel from an endpoint that holds nothing. It is listed in
 * /sources while a fetching node D starts, whose reads then move on to the
 * publisher; once C leaves (signed with its session; another member's
 * leave for it is refused) /sources no longer lists it.
 */
static void test_leave_sigterm(void **state)
{
	struct env *e = *state;
	struct proto_layout tp1;
	struct proto_err err;
	struct fab_ctx *fab;
	struct trk_client *other;
	struct trk_reply r;
	struct proto_addendum a;
	uint8_t addr[FAB_ADDR_MAX];
	char fhex[2 * FAB_ADDR_MAX + 1], lhex[2 * PROTO_HASH_BYTES + 1], path[400];
	size_t alen;
	json_t *lj, *ve;

	start_tracker(e);
	start_node(e, "A", 0, "tp2");
	start_node(e, "A", 1, "tp2");
	start_publisher(e);
	wait_active(e, "A", 1);

	/* C/0: a tp1 peer registered by this test (the client keeps its
	 * session), holding v1 verified. */
	assert_int_equal(proto_layout_builtin(&e->m, "tp1", &tp1, &err), 0);
	sodium_bin2hex(lhex, sizeof(lhex), tp1.digest, PROTO_HASH_BYTES);
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &fab, &err), 0);
	assert_int_equal(fab_getname(fab, addr, sizeof(addr), &alen), 0);
	sodium_bin2hex(fhex, sizeof(fhex), addr, alen);
	lj = proto_layout_to_json(&e->m, &tp1);
	struct trk_node_reg reg = {.replica = "C", .addr = {0, "localhost", "tcp;ofi_rxm", fhex},
				   .layout = lj, .model_digest = e->m.digest};
	trk_reply_init(&r);
	assert_int_equal(trk_client_register_node(e->trk, &reg, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	json_decref(lj);
	/* C registering tp1 makes the publisher add it to v1. */
	snprintf(path, sizeof(path), TRK_API "/addenda?version=1&layout=%s", lhex);
	for (int waited = 0;; waited += 200) {
		assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
		if (r.status == 200)
			break;
		trk_reply_fini(&r);
		if (waited > WAIT_MS)
			fail_msg("no addendum for tp1 (see %s)", e->dir);
		usleep(200000);
	}
	assert_int_equal(proto_addendum_decode(r.body, r.len, e->pk, &a, &err), 0);
	trk_reply_fini(&r);
	const struct proto_mparcel *mp = proto_mlayout_parcel(&a.layout, 0, 0);
	assert_non_null(mp);
	struct trk_state_report rep = {.id = "C/0", .version = 1, .state = TRK_STATE_VERIFIED};
	trk_reply_init(&r);
	assert_int_equal(trk_client_report_state(e->trk, &rep, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	struct trk_offer off = {.src_rank = 0, .dst_rank = 0, .addr = 0, .key = 1, .len = mp->wire_bytes};
	memcpy(off.layout, tp1.digest, PROTO_HASH_BYTES);
	trk_reply_init(&r);
	assert_int_equal(trk_client_offer(e->trk, "C/0", 1, &off, 1, trk_reply_cb, &r), 0);
	trk_client_wait(e->trk, &r);
	if (r.status != 200)
		fail_msg("offer: %d %s", r.status, r.error);
	trk_reply_fini(&r);
	proto_addendum_fini(&a);
	assert_true(listed(e, lhex, "C/0"));

	/* D fetches with C listed first; its reads from C fail and move on. */
	start_node(e, "D", 0, "tp1");
	wait_active(e, "D", 1);

	/* Another member cannot make C leave; C itself can. */
	assert_int_equal(trk_client_new(NULL, e->url, e->cluster_key, &other, &err), 0);
	struct leave_arg la = {other, "C/0"};
	assert_int_equal(post_status(other, send_leave, &la), 403);
	assert_true(listed(e, lhex, "C/0"));
	la.c = e->trk;
	assert_int_equal(post_status(e->trk, send_leave, &la), 200);
	assert_false(listed(e, lhex, "C/0"));
	assert_int_equal(post_status(e->trk, send_leave, &la), 404);
	trk_client_free(other);

	/* SIGTERM to A/1: A is incomplete at once, not counted active at v1. */
	assert_int_equal(kill(e->nodes[1].pid, SIGTERM), 0);
	wait_incomplete(e, "A");
	ve = version_entry(e, 1);
	json_t *act = json_object_get(ve, "active"), *x;
	size_t i;
	json_array_foreach(act, i, x)
		assert_string_not_equal(json_string_value(x), "A");
	json_decref(ve);
	json_t *ra = replica(e, "A");
	assert_int_equal(json_array_size(json_object_get(ra, "complete")), 0);
	json_decref(ra);
	assert_int_equal(tu_sh("grep -q 'node A/1 gone (left)' %s/tracker-*.log", e->dir), 0);
	assert_int_equal(tu_sh("grep -q 'left the tracker' %s", e->nodes[1].log), 0);
	node_proc_stop(&e->nodes[1], 5000);
	assert_int_equal(WEXITSTATUS(e->nodes[1].status), 0);
	fab_close(fab);
	proto_layout_fini(&tp1);
}

/* Replica A (tp2, a node per rank) activates v1; then A/1 is killed
 * (SIGKILL: it does not leave). */
static void kill_a1_once_active(struct env *e)
{
	start_tracker(e);
	start_node(e, "A", 0, "tp2");
	start_node(e, "A", 1, "tp2");
	start_publisher(e);
	wait_active(e, "A", 1);
	node_proc_kill(&e->nodes[1]);
}

/* A node that vanishes (SIGKILL) is dropped when its lease runs out. */
static void test_killed_node_lease(void **state)
{
	struct env *e = *state;

	setenv("TESSERA_LEASE_MS", "4000", 1);
	kill_a1_once_active(e);
	wait_incomplete(e, "A");
	assert_int_equal(tu_sh("grep -q 'node A/1 gone (lease expired)' %s/tracker-*.log", e->dir), 0);
	assert_int_not_equal(tu_sh("grep -q 'node A/1 gone (left)' %s/tracker-*.log", e->dir), 0);
}

/* A node killed (SIGKILL) and started again while its previous
 * registration is live (the lease here is 60 s): the tracker refuses to let
 * the new process take the id over, and the new process says so in one
 * line instead of waiting in silence. */
static void test_killed_node_restarted(void **state)
{
	struct env *e = *state;
	bool said = false;

	kill_a1_once_active(e);
	start_node(e, "A", 1, "tp2");
	for (int w = 0; w < 30000 && !said; w += 100) {
		said = tu_sh("grep -q 'the tracker still holds A/1 live (a previous process that did "
			     "not leave): registering once its lease there ends' %s/node-A-1.log",
			     e->dir) == 0;
		if (!said)
			usleep(100000);
	}
	assert_true(said);
}

/* ---- a tracker that lies: a proxy that alters the addenda it forwards ---- */

enum lie { LIE_HASH, LIE_BINDING, LIE_NONE };

static struct {
	struct event_base *base;
	struct evhttp *http;
	pthread_t th;
	char upstream[128];
	int port;
	_Atomic int lie;
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
} px;

struct px_call {
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	bool addendum;
	struct px_call *next;
};

static struct px_call *px_calls; /* forwarded, not answered yet */
static struct evhttp_connection **px_conns; /* every upstream connection */
static size_t px_nconns;

static void px_forget(struct px_call *pc)
{
	for (struct px_call **pp = &px_calls; *pp; pp = &(*pp)->next)
		if (*pp == pc) {
			*pp = pc->next;
			return;
		}
}

static void px_done(struct evhttp_request *resp, void *arg)
{
	struct px_call *pc = arg;
	struct evbuffer *out = evbuffer_new();
	struct evkeyvalq *h;
	struct evkeyval *kv;
	int code = resp ? evhttp_request_get_response_code(resp) : 502;

	if (resp != NULL) {
		struct evbuffer *in = evhttp_request_get_input_buffer(resp);
		size_t n = evbuffer_get_length(in);
		uint8_t *b = malloc(n + 1);
		evbuffer_remove(in, b, n);
		if (pc->addendum && code == 200 && px.lie == LIE_HASH) {
			b[n / 2] ^= 1;
		} else if (pc->addendum && code == 200 && px.lie == LIE_BINDING) {
			struct proto_addendum a;
			struct proto_err err;
			uint8_t *nb;
			size_t nl;
			assert_int_equal(proto_addendum_decode(b, n, px.pk, &a, &err), 0);
			a.manifest_digest[3] ^= 1;
			assert_int_equal(proto_addendum_sign(&a, px.sk, &nb, &nl, &err), 0);
			proto_addendum_fini(&a);
			free(b);
			b = nb;
			n = nl;
		}
		evbuffer_add(out, b, n);
		free(b);
		h = evhttp_request_get_input_headers(resp);
		TAILQ_FOREACH(kv, h, next)
			if (strcasecmp(kv->key, "Content-Length") != 0 &&
			    strcasecmp(kv->key, "Connection") != 0 &&
			    strcasecmp(kv->key, "Transfer-Encoding") != 0)
				evhttp_add_header(evhttp_request_get_output_headers(pc->req), kv->key,
						  kv->value);
	}
	evhttp_send_reply(pc->req, code, "proxied", out);
	evbuffer_free(out);
	px_forget(pc);
	free(pc);
}

static void px_cb(struct evhttp_request *req, void *arg)
{
	struct px_call *pc = calloc(1, sizeof(*pc));
	const char *uri = evhttp_request_get_uri(req);
	struct evhttp_connection *conn;
	struct evhttp_request *out;
	struct evkeyval *kv;
	char host[64];
	int port;

	pc->req = req;
	pc->addendum = strncmp(uri, TRK_API "/addenda?", strlen(TRK_API "/addenda?")) == 0;
	sscanf(px.upstream, "http://%63[^:]:%d", host, &port);
	conn = evhttp_connection_base_new(px.base, NULL, host, (unsigned short)port);
	evhttp_connection_set_timeout(conn, 60);
	out = evhttp_request_new(px_done, pc);
	TAILQ_FOREACH(kv, evhttp_request_get_input_headers(req), next)
		if (strcasecmp(kv->key, "Host") != 0 && strcasecmp(kv->key, "Connection") != 0)
			evhttp_add_header(evhttp_request_get_output_headers(out), kv->key, kv->value);
	evhttp_add_header(evhttp_request_get_output_headers(out), "Host", host);
	evbuffer_add_buffer(evhttp_request_get_output_buffer(out),
			    evhttp_request_get_input_buffer(req));
	px_conns = realloc(px_conns, (px_nconns + 1) * sizeof(*px_conns));
	px_conns[px_nconns++] = conn;
	pc->conn = conn;
	pc->next = px_calls;
	px_calls = pc;
	evhttp_make_request(conn, out, evhttp_request_get_command(req), uri);
}

static void *px_main(void *arg)
{
	event_base_dispatch(px.base);
	return NULL;
}

static void px_start(struct env *e)
{
	struct evhttp_bound_socket *sock;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	snprintf(px.upstream, sizeof(px.upstream), "%s", e->url);
	memcpy(px.sk, e->sk, sizeof(px.sk));
	memcpy(px.pk, e->pk, sizeof(px.pk));
	px.base = event_base_new();
	px.http = evhttp_new(px.base);
	evhttp_set_allowed_methods(px.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD);
	evhttp_set_gencb(px.http, px_cb, NULL);
	sock = evhttp_bind_socket_with_handle(px.http, "127.0.0.1", 0);
	assert_non_null(sock);
	getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl);
	px.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	assert_int_equal(pthread_create(&px.th, NULL, px_main, NULL), 0);
}

static void px_stop(void)
{
	event_base_loopexit(px.base, NULL);
	pthread_join(px.th, NULL);
	/* Upstream connections first (a held long-poll's request is freed
	 * with its connection, without its callback). */
	for (size_t i = 0; i < px_nconns; i++)
		evhttp_connection_free(px_conns[i]);
	free(px_conns);
	px_conns = NULL;
	px_nconns = 0;
	while (px_calls != NULL) {
		struct px_call *pc = px_calls;
		px_calls = pc->next;
		free(pc);
	}
	evhttp_free(px.http);
	event_base_free(px.base);
	sodium_memzero(px.sk, sizeof(px.sk));
}

/* Waits (bounded) until the log at path holds text. */
static void wait_log(struct env *e, const char *path, const char *text)
{
	for (int waited = 0; waited < WAIT_MS; waited += 200) {
		if (tu_sh("grep -q '%s' %s", text, path) == 0)
			return;
		usleep(200000);
	}
	fail_msg("'%s' never appeared in %s", text, path);
}

/* The node checks the addendum itself: one whose hash was altered, or
 * re-signed by the trainer key for another manifest, handed over by a
 * tracker that lies, is refused and the version not activated; the genuine
 * one then activates it. */
static void test_node_refuses_forged_addendum(void **state)
{
	struct env *e = *state;
	char url[128];
	int bi;

	start_tracker(e);
	start_node(e, "A", 0, "tp2");
	start_node(e, "A", 1, "tp2");
	start_publisher(e);
	wait_active(e, "A", 1);
	px.lie = LIE_HASH;
	px_start(e);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", px.port);
	bi = start_node_at(e, url, "B", 0, "tp1");
	wait_log(e, e->nodes[bi].log, "v1 refused: addendum: bad signature");
	px.lie = LIE_BINDING;
	wait_log(e, e->nodes[bi].log, "v1 refused: addendum: bound to another manifest");
	json_t *rep = replica(e, "B");
	assert_int_equal(jint(rep, "active"), 0);
	json_decref(rep);
	px.lie = LIE_NONE;
	wait_active(e, "B", 1);
	node_proc_stop(&e->nodes[bi], 5000);
	px_stop();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_late_layout_addendum, setup, teardown),
		cmocka_unit_test_setup_teardown(test_node_refuses_forged_addendum, setup, teardown),
		cmocka_unit_test_setup_teardown(test_leave_sigterm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_killed_node_lease, setup, teardown),
		cmocka_unit_test_setup_teardown(test_killed_node_restarted, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0 || evthread_use_pthreads() != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
