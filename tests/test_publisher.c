/* Functional tests of the publisher against a real tracker, read back chunk by chunk over tcp;ofi_rxm. */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sodium.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fabric/fab.h"
#include "node/publisher/publisher.h"
#include "proto/chunkhash.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tests/testutil.h"
#include "tracker/tracker.h"

extern char **environ;

#define MODEL_BYTES (1u << 20)
#define SEED 7
#define CHUNK "65536"
#define WAIT_MS 60000 /* bounded waits: long enough for a machine at load 70 */

struct result {
	int status;
	uint64_t version;
	char error[256];
};

static struct {
	char dir[256], key[300], state[300];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
	struct event_base *base;
	struct trk_server *srv;
	char url[300];
	pthread_t loop;
	bool looping;
	struct node_pub *pub, *pub2;
	struct proto_model model;
	struct proto_layout fsdp2, tp2, tp1;
	struct proto_plan plan, plan1; /* fsdp2 -> tp2, fsdp2 -> tp1 */
	struct trk_client *cli; /* blocking, on its own base */
	struct fab_ctx *rd;     /* the reader's endpoint */
	char rd_hex[2 * FAB_ADDR_MAX + 1];
	pthread_mutex_t mu;
	struct result res[16];
	int nres;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- the loop thread (tracker + publisher) --------------------------------- */

static void *loop_main(void *arg)
{
	event_base_loop(g.base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void loop_start(void)
{
	assert_int_equal(pthread_create(&g.loop, NULL, loop_main, NULL), 0);
	g.looping = true;
}

static void loop_stop(void)
{
	if (!g.looping)
		return;
	event_base_loopexit(g.base, NULL); /* thread-safe: evthread_use_pthreads */
	pthread_join(g.loop, NULL);
	g.looping = false;
}

static void on_done(void *arg, const struct node_pub_result *r)
{
	pthread_mutex_lock(&g.mu);
	if (g.nres < (int)PROTO_ARRAY_LEN(g.res)) {
		struct result *x = &g.res[g.nres++];
		x->status = r->status;
		x->version = r->version;
		snprintf(x->error, sizeof(x->error), "%s", r->error);
	}
	pthread_mutex_unlock(&g.mu);
}

static void wait_results(int n)
{
	uint64_t end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;

	for (;;) {
		pthread_mutex_lock(&g.mu);
		int have = g.nres;
		pthread_mutex_unlock(&g.mu);
		if (have >= n)
			return;
		if (proto_now_ns() > end)
			fail_msg("timed out waiting for %d exports (have %d)", n, have);
		usleep(10000);
	}
}

/* A publisher of the fixture hosting ranks (NULL: all). */
static struct node_pub *pub_new(const uint32_t *ranks, size_t n)
{
	struct node_pub_opts o = {
		.tracker_url = g.url,
		.sk = g.sk,
		.synthetic_bytes = MODEL_BYTES,
		.seed = SEED,
		.ranks = ranks,
		.nranks = n,
		.provider = "tcp;ofi_rxm",
	};
	struct proto_err err = {{0}};
	struct node_pub *p = NULL;

	if (node_pub_new(g.base, &o, &p, &err) != 0)
		fail_msg("node_pub_new: %s", err.msg);
	return p;
}

static void pub_start(void)
{
	g.pub = pub_new(NULL, 0);
	assert_int_equal(node_pub_nranks(g.pub), 2);
	assert_true(node_pub_leader(g.pub));
}

/* ---- tracker helpers (test thread) --------------------------------------------- */

static json_t *get_json(const char *path, int want)
{
	struct trk_reply r;
	json_t *j;

	assert_int_equal(trk_client_call(g.cli, "GET", path, NULL, NULL, 0, &r), 0);
	if (r.status != want)
		fail_msg("GET %s: %d %s", path, r.status, r.error);
	j = json_incref(r.json);
	trk_reply_fini(&r);
	return j;
}

static uint64_t latest_version(void)
{
	json_t *j = get_json(TRK_API "/versions", 200);
	uint64_t v = (uint64_t)json_integer_value(json_object_get(j, "latest"));
	json_decref(j);
	return v;
}

/* Publisher sources of one parcel of a layout: how many, and the first one. */
static size_t pub_sources_of(const struct proto_layout *l, uint64_t v, uint32_t src, uint32_t dst,
			     struct trk_source *first)
{
	char path[512], h[2 * PROTO_HASH_BYTES + 1];
	struct trk_source *s = NULL;
	struct proto_err err = {{0}};
	size_t n = 0, k = 0;
	json_t *j;

	sodium_bin2hex(h, sizeof(h), l->digest, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "/sources?version=%llu&layout=%s&src_rank=%u&dst_rank=%u",
		 (unsigned long long)v, h, src, dst);
	j = get_json(path, 200);
	if (trk_sources_parse(j, &s, &n, &err) != 0)
		fail_msg("sources: %s", err.msg);
	for (size_t i = 0; i < n; i++)
		if (!s[i].peer) {
			if (k++ == 0 && first != NULL) {
				*first = s[i];
				s[i].fabric_addr = NULL; /* moved */
			}
		}
	trk_sources_free(s, n);
	json_decref(j);
	return k;
}

/* The same for the tp2 layout of replica A. */
static size_t pub_sources(uint64_t v, uint32_t src, uint32_t dst, struct trk_source *first)
{
	return pub_sources_of(&g.tp2, v, src, dst, first);
}

static void post_ok(const char *what, int rc, struct trk_reply *r)
{
	if (rc != 0)
		fail_msg("%s: %s", what, strerror(-rc));
	trk_client_wait(g.cli, r);
	if (r->status != 200)
		fail_msg("%s: %d %s", what, r->status, r->error);
	trk_reply_fini(r);
}

/* The serving replica "A": two tp2 nodes (they never fetch; the test reads). */
static void register_nodes(void)
{
	json_t *lj = proto_layout_to_json(&g.model, &g.tp2);
	uint64_t end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	struct trk_reply r;

	/* The model is known once the publisher has registered. */
	for (;;) {
		assert_int_equal(trk_client_call(g.cli, "GET", TRK_API "/layouts", NULL, NULL, 0, &r), 0);
		int st = r.status;
		trk_reply_fini(&r);
		if (st == 200)
			break;
		if (proto_now_ns() > end)
			fail_msg("the publisher never registered");
		usleep(20000);
	}
	for (uint32_t rank = 0; rank < 2; rank++) {
		struct trk_node_reg reg = {
			.replica = "A",
			.addr = {.rank = rank, .host = "test", .provider = "tcp;ofi_rxm",
				 .fabric_addr = g.rd_hex},
			.layout = lj,
			.model_digest = g.model.digest,
		};
		trk_reply_init(&r);
		post_ok("register node", trk_client_register_node(g.cli, &reg, trk_reply_cb, &r), &r);
	}
	json_decref(lj);
}

/* ---- the reader ------------------------------------------------------------------- */

/* Pulls every chunk of every tp2 parcel of version v from the publisher the
 * tracker lists, checks each hash against the signed manifest and the
 * assembled ranks against the fixture. */
static void read_and_check(uint64_t v)
{
	char path[128], h[2 * PROTO_HASH_BYTES + 1];
	struct trk_reply r;
	struct proto_manifest m;
	struct proto_err err = {{0}};
	const struct proto_mlayout *ml;
	uint8_t *blocks[2], *expect, *chunk;
	struct fab_mr *lmr = NULL;
	struct fab_ctx *rd = NULL;
	size_t cs;

	snprintf(path, sizeof(path), TRK_API "/versions/%llu/manifest", (unsigned long long)v);
	assert_int_equal(trk_client_call(g.cli, "GET", path, NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	if (proto_manifest_decode(r.body, r.len, g.pk, &m, &err) != 0)
		fail_msg("manifest %llu: %s", (unsigned long long)v, err.msg);
	trk_reply_fini(&r);
	assert_int_equal(m.version, v);
	assert_int_equal(m.parent_version, v - 1);
	assert_int_equal(m.kind, PROTO_KIND_ANCHOR);
	assert_memory_equal(m.model_digest, g.model.digest, PROTO_HASH_BYTES);
	assert_memory_equal(m.src_layout_digest, g.fsdp2.digest, PROTO_HASH_BYTES);
	assert_int_equal(m.chunk_size, atoi(CHUNK));
	ml = proto_manifest_layout(&m, g.tp2.digest);
	assert_non_null(ml);
	assert_memory_equal(ml->plan_digest, g.plan.digest, PROTO_HASH_BYTES);
	assert_int_equal(ml->nparcels, g.plan.nparcels);
	sodium_bin2hex(h, sizeof(h), g.tp2.digest, PROTO_HASH_BYTES);

	/* A fresh endpoint per check: no connection to a publisher that has
	 * gone away is reused. */
	if (fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &rd, &err) != 0)
		fail_msg("reader: %s", err.msg);
	cs = m.chunk_size;
	chunk = malloc(cs);
	assert_non_null(chunk);
	assert_int_equal(fab_mr_reg(rd, chunk, cs, FAB_MR_READ, &lmr), 0);
	for (int d = 0; d < 2; d++) {
		blocks[d] = calloc(1, g.tp2.ranks[d].nbytes);
		assert_non_null(blocks[d]);
	}
	for (uint32_t i = 0; i < ml->nparcels; i++) {
		const struct proto_mparcel *mp = &ml->parcels[i];
		const struct proto_parcel *pc = proto_plan_parcel(&g.plan, mp->src_rank, mp->dst_rank);
		struct trk_source s;
		fi_addr_t fa;
		assert_non_null(pc);
		assert_int_equal(mp->bytes, pc->bytes);
		/* An offer can be missing for a moment (a publisher that registers
		 * again re-sends its offers): wait for one, bounded, as a node would. */
		uint64_t until = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
		while (pub_sources(v, mp->src_rank, mp->dst_rank, &s) == 0) {
			if (proto_now_ns() > until)
				fail_msg("v%llu parcel %u->%u: no publisher offers it",
					 (unsigned long long)v, mp->src_rank, mp->dst_rank);
			usleep(20000);
		}
		assert_int_equal(s.len, mp->wire_bytes);
		assert_int_equal(fab_av_insert(rd, s.fabric_addr, s.fabric_addr_len, &fa), 0);
		free(s.fabric_addr);
		/* What an offer means: rk = {addr, key, len}, chunk c at c * chunk_size. */
		struct fab_rkey rk = {s.addr, s.key, s.len};
		for (uint32_t c = 0; c < mp->nchunks; c++) {
			struct fab_op op;
			uint8_t hash[PROTO_HASH_BYTES];
			size_t len = mp->chunks[c].size;
			int rc = fab_read(rd, &op, lmr, 0, len, fa, &rk, (uint64_t)c * cs, NULL);
			assert_int_equal(rc, 0);
			rc = fab_wait(rd, &op, 30000);
			if (rc != 0)
				fail_msg("v%llu parcel %u->%u chunk %u: read: %s", (unsigned long long)v,
					 mp->src_rank, mp->dst_rank, c, strerror(-rc));
			proto_chunk_hash(hash, chunk, len);
			if (memcmp(hash, mp->chunks[c].hash, sizeof(hash)) != 0)
				fail_msg("v%llu parcel %u->%u chunk %u: hash mismatch",
					 (unsigned long long)v, mp->src_rank, mp->dst_rank, c);
			proto_parcel_scatter(&g.plan, pc, &g.tp2, blocks[mp->dst_rank], (uint64_t)c * cs,
					     len, chunk);
		}
	}
	for (uint32_t d = 0; d < 2; d++) {
		expect = malloc(g.tp2.ranks[d].nbytes);
		assert_non_null(expect);
		proto_fixture_fill_rank(&g.model, &g.tp2, d, SEED, v, expect);
		if (memcmp(expect, blocks[d], g.tp2.ranks[d].nbytes) != 0)
			fail_msg("v%llu: tp2 rank %u's assembled bytes differ from the fixture",
				 (unsigned long long)v, d);
		free(expect);
		free(blocks[d]);
	}
	fab_mr_close(lmr);
	fab_close(rd);
	free(chunk);
	proto_manifest_fini(&m);
}

/* ---- setup ------------------------------------------------------------------------- */

static int group_setup(void **state)
{
	struct trk_server_opts so = {.listen = "127.0.0.1:0"};
	struct proto_err err = {{0}};
	uint8_t addr[FAB_ADDR_MAX];
	size_t alen;
	char pubp[320];

	if (tu_mkdtemp(g.dir, sizeof(g.dir)) == NULL)
		return -1;
	snprintf(g.key, sizeof(g.key), "%s/tr.key", g.dir);
	snprintf(pubp, sizeof(pubp), "%s/tr.pub", g.dir);
	snprintf(g.state, sizeof(g.state), "%s/state", g.dir);
	if (proto_keygen(g.key, pubp, &err) != 0 || proto_key_load_secret(g.key, g.sk, &err) != 0 ||
	    proto_key_load_public(pubp, g.pk, &err) != 0) {
		fprintf(stderr, "keys: %s\n", err.msg);
		return -1;
	}
	if (proto_fixture_model(MODEL_BYTES, &g.model, &err) != 0 ||
	    proto_layout_builtin(&g.model, "fsdp2", &g.fsdp2, &err) != 0 ||
	    proto_layout_builtin(&g.model, "tp2", &g.tp2, &err) != 0 ||
	    proto_plan_build(&g.model, &g.fsdp2, &g.tp2, &g.plan, &err) != 0 ||
	    proto_layout_builtin(&g.model, "tp1", &g.tp1, &err) != 0 ||
	    proto_plan_build(&g.model, &g.fsdp2, &g.tp1, &g.plan1, &err) != 0) {
		fprintf(stderr, "model: %s\n", err.msg);
		return -1;
	}
	g.base = event_base_new();
	so.state_dir = g.state;
	if (g.base == NULL || trk_server_new(g.base, &so, &g.srv, &err) != 0) {
		fprintf(stderr, "tracker: %s\n", err.msg);
		return -1;
	}
	snprintf(g.url, sizeof(g.url), "%s", trk_server_url(g.srv));
	if (trk_client_new(NULL, g.url, NULL, &g.cli, &err) != 0 ||
	    fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &g.rd, &err) != 0 ||
	    fab_getname(g.rd, addr, sizeof(addr), &alen) != 0) {
		fprintf(stderr, "client/reader: %s\n", err.msg);
		return -1;
	}
	sodium_bin2hex(g.rd_hex, sizeof(g.rd_hex), addr, alen);
	return 0;
}

static int group_teardown(void **state)
{
	loop_stop();
	node_pub_free(g.pub2);
	node_pub_free(g.pub);
	g.pub = NULL;
	trk_server_free(g.srv);
	trk_client_free(g.cli);
	fab_close(g.rd);
	if (g.base)
		event_base_free(g.base);
	proto_plan_fini(&g.plan);
	proto_plan_fini(&g.plan1);
	proto_layout_fini(&g.tp1);
	proto_layout_fini(&g.tp2);
	proto_layout_fini(&g.fsdp2);
	proto_model_fini(&g.model);
	tu_rmtree(g.dir);
	return 0;
}

/* ---- tests -------------------------------------------------------------------------- */

/* Two versions, exported while no serving layout exists yet (the publisher
 * waits), then read back chunk by chunk from the offered memory. No replica
 * aims at v1 (their target is the latest, v2): v1 is withdrawn. */
static void test_publish_and_read(void **state)
{
	struct node_pub_why why;
	int first, second, other;

	pub_start();
	assert_int_equal(node_pub_export(g.pub, on_done, &first), 0);
	assert_int_equal(node_pub_export(g.pub, on_done, &second), 0);
	assert_int_equal(node_pub_pending(g.pub), 2);
	/* Before the loop runs, the publisher has not registered: a queued
	 * export says it waits for that; an unknown one is not found. */
	assert_int_equal(node_pub_export_why(g.pub, &second, &why), 0);
	assert_int_equal(why.cause, NODE_PUB_WAIT_TRACKER);
	assert_int_equal(why.version, 0);
	assert_string_equal(why.text, "the publisher is starting: registering with the tracker "
				      "(is the tracker up?)");
	assert_string_equal(node_pub_wait_name(why.cause), "tracker");
	assert_int_equal(node_pub_export_why(g.pub, &other, &why), -ENOENT);
	loop_start();
	register_nodes();
	wait_results(2);
	for (int i = 0; i < 2; i++) {
		if (g.res[i].status != 0)
			fail_msg("export %d: %s", i, g.res[i].error);
		assert_int_equal(g.res[i].version, (uint64_t)i + 1);
	}
	assert_int_equal(latest_version(), 2);
	read_and_check(2);
	uint64_t end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	while (pub_sources(1, 0, 0, NULL) > 0) {
		if (proto_now_ns() > end)
			fail_msg("version 1 is still offered");
		usleep(50000);
	}
}

static void report_all(uint64_t v, enum trk_rank_state st)
{
	for (uint32_t rank = 0; rank < 2; rank++) {
		char id[16];
		struct trk_reply r;
		snprintf(id, sizeof(id), "A/%u", rank);
		struct trk_state_report rep = {.id = id, .version = v, .state = st};
		trk_reply_init(&r);
		post_ok("report", trk_client_report_state(g.cli, &rep, trk_reply_cb, &r), &r);
	}
}

/* Replica A holds v2, its target and the latest: v2 stays offered (and v1,
 * which no replica aims at, stays withdrawn). */
static void test_retire(void **state)
{
	report_all(2, TRK_STATE_VERIFIED);
	report_all(2, TRK_STATE_ACTIVE);
	assert_int_equal(pub_sources(1, 0, 0, NULL), 0);
	assert_true(pub_sources(2, 0, 0, NULL) > 0);
	read_and_check(2);
}

/* A new publisher process: the tracker's latest version is rebuilt, checked
 * against its manifest and offered again without publishing, and numbering
 * goes on after it. */
static void test_restart(void **state)
{
	struct trk_source s;
	char old_id[TRK_ID_MAX];
	uint64_t end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;

	assert_int_equal(pub_sources(2, 0, 0, &s), 1);
	snprintf(old_id, sizeof(old_id), "%s", s.id);
	free(s.fabric_addr);
	loop_stop();
	node_pub_free(g.pub);
	g.pub = NULL;
	g.nres = 0;
	pub_start();
	loop_start();
	for (;;) {
		size_t n = pub_sources(2, 0, 0, &s);
		if (n > 0)
			free(s.fabric_addr);
		if (n > 0 && strcmp(s.id, old_id) != 0)
			break;
		if (proto_now_ns() > end)
			fail_msg("version 2 was not offered again");
		usleep(20000);
	}
	assert_int_equal(latest_version(), 2); /* not published again */
	read_and_check(2);
	/* Then v3 (after which v2 is withdrawn: replica A, active on v2, aims at v3). */
	loop_stop();
	assert_int_equal(node_pub_export(g.pub, on_done, NULL), 0);
	loop_start();
	wait_results(1);
	if (g.res[0].status != 0)
		fail_msg("export after restart: %s", g.res[0].error);
	assert_int_equal(g.res[0].version, 3);
	assert_int_equal(latest_version(), 3);
	read_and_check(3);
}

/* Two processes' worth of publishers: rank 0 (the leader) publishes, rank 1
 * waits for the version, checks its own parcels against the signed manifest
 * and offers them. The reader pulls from both. */
static void test_leader_follower(void **state)
{
	static const uint32_t r0[] = {0}, r1[] = {1};

	loop_stop();
	node_pub_free(g.pub);
	g.pub = pub_new(r0, 1);
	g.pub2 = pub_new(r1, 1);
	assert_true(node_pub_leader(g.pub));
	assert_false(node_pub_leader(g.pub2));
	g.nres = 0;
	/* The follower is asked first: it must wait for the leader. */
	assert_int_equal(node_pub_export(g.pub2, on_done, NULL), 0);
	assert_int_equal(node_pub_export(g.pub, on_done, NULL), 0);
	loop_start();
	wait_results(2);
	for (int i = 0; i < 2; i++) {
		if (g.res[i].status != 0)
			fail_msg("export %d: %s", i, g.res[i].error);
		assert_int_equal(g.res[i].version, 4);
	}
	assert_int_equal(latest_version(), 4);
	read_and_check(4);
	loop_stop();
	node_pub_free(g.pub2);
	g.pub2 = NULL;
	loop_start();
}

/* ---- per-layout retention ------------------------------------------------------ */

struct served_box {
	atomic_bool done;
	uint64_t n;
};

static void served_cb(evutil_socket_t fd, short what, void *arg)
{
	struct served_box *b = arg;

	b->n = node_pub_served_bytes(g.pub);
	atomic_store(&b->done, true);
}

/* node_pub_served_bytes, read on the loop's thread (the loop owns it). */
static uint64_t served_bytes(void)
{
	struct served_box b = {.done = false};
	struct timeval tv = {0, 0};
	uint64_t end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;

	assert_int_equal(event_base_once(g.base, -1, EV_TIMEOUT, served_cb, &b, &tv), 0);
	while (!atomic_load(&b.done)) {
		if (proto_now_ns() > end)
			fail_msg("the loop did not answer");
		usleep(5000);
	}
	return b.n;
}

/* What one layout of one version takes in the export buffers: every parcel
 * page-rounded, both trainer ranks. */
static uint64_t layout_bytes(const struct proto_plan *pl)
{
	uint64_t n = 0;

	for (uint32_t k = 0; k < pl->nparcels; k++)
		n += (pl->parcels[k].bytes + 4095) & ~(uint64_t)4095;
	return n;
}

static void report_one(const char *id, uint64_t v, enum trk_rank_state st)
{
	struct trk_reply r;
	struct trk_state_report rep = {.id = id, .version = v, .state = st};

	trk_reply_init(&r);
	post_ok("report", trk_client_report_state(g.cli, &rep, trk_reply_cb, &r), &r);
}

/* The version's retain flags and its retain_layouts as one string of
 * 16-digit digest prefixes. */
static bool version_retain(uint64_t v, char *layouts, size_t cap, bool *dropped)
{
	json_t *j = get_json(TRK_API "/versions", 200), *e, *d;
	bool retain = false;
	size_t i, k;

	layouts[0] = 0;
	json_array_foreach(json_object_get(j, "versions"), i, e) {
		if ((uint64_t)json_integer_value(json_object_get(e, "version")) != v)
			continue;
		retain = json_is_true(json_object_get(e, "retain"));
		*dropped = json_is_true(json_object_get(e, "dropped"));
		json_array_foreach(json_object_get(e, "retain_layouts"), k, d)
			snprintf(layouts + strlen(layouts), cap - strlen(layouts), "%s%.16s",
				 k ? "," : "", json_string_value(d));
	}
	json_decref(j);
	return retain;
}

/* A tp1 replica C joins replica A (tp2). A aims at vN when vN+1 comes and C
 * at vN+1: vN stays retained for tp2 only, so the publisher withdraws vN's
 * tp1 parcels and gives their pages back while its tp2 parcels go on being
 * served, and vN+1 keeps both layouts. */
static void test_layout_drop(void **state)
{
	json_t *lj = proto_layout_to_json(&g.model, &g.tp1);
	struct trk_node_reg reg = {
		.replica = "C",
		.addr = {.rank = 0, .host = "test", .provider = "tcp;ofi_rxm", .fabric_addr = g.rd_hex},
		.layout = lj,
		.model_digest = g.model.digest,
	};
	uint64_t t2 = layout_bytes(&g.plan), t1 = layout_bytes(&g.plan1), want = 2 * t2 + t1;
	uint64_t end, N, have = 0;
	char lays[256], h2[2 * PROTO_HASH_BYTES + 1];
	bool dropped = true;
	struct trk_reply r;

	/* A publisher of both ranks (it re-offers the latest version). */
	loop_stop();
	node_pub_free(g.pub);
	g.nres = 0;
	pub_start();
	loop_start();
	trk_reply_init(&r);
	post_ok("register node C", trk_client_register_node(g.cli, &reg, trk_reply_cb, &r), &r);
	json_decref(lj);

	assert_int_equal(node_pub_export(g.pub, on_done, NULL), 0);
	wait_results(1);
	if (g.res[0].status != 0)
		fail_msg("export: %s", g.res[0].error);
	N = g.res[0].version;
	report_all(N, TRK_STATE_FETCHING); /* A aims at vN */
	assert_int_equal(node_pub_export(g.pub, on_done, NULL), 0);
	wait_results(2);
	if (g.res[1].status != 0)
		fail_msg("export: %s", g.res[1].error);
	assert_int_equal(g.res[1].version, N + 1);
	report_one("C/0", N + 1, TRK_STATE_FETCHING); /* C aims at vN+1 */

	/* vN: tp1 withdrawn, tp2 served; vN+1: both. */
	end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	while (pub_sources_of(&g.tp1, N, 0, 0, NULL) > 0) {
		if (proto_now_ns() > end)
			fail_msg("v%llu's tp1 parcels are still offered", (unsigned long long)N);
		usleep(20000);
	}
	assert_int_equal(pub_sources_of(&g.tp2, N, 0, 0, NULL), 1);
	assert_int_equal(pub_sources_of(&g.tp2, N, 1, 1, NULL), 1);
	assert_int_equal(pub_sources_of(&g.tp1, N + 1, 0, 0, NULL), 1);
	assert_int_equal(pub_sources_of(&g.tp1, N + 1, 1, 0, NULL), 1);
	read_and_check(N);
	read_and_check(N + 1);
	sodium_bin2hex(h2, sizeof(h2), g.tp2.digest, PROTO_HASH_BYTES);
	assert_true(version_retain(N, lays, sizeof(lays), &dropped));
	assert_false(dropped);
	if (strlen(lays) != 16 || strncmp(lays, h2, 16) != 0)
		fail_msg("v%llu retain_layouts: '%s', want only tp2 (%.16s)", (unsigned long long)N,
			 lays, h2);

	/* What the publisher holds: vN+1 whole and vN's tp2 slices, nothing
	 * of the re-offered version nor of vN's tp1. */
	end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	while ((have = served_bytes()) != want) {
		if (proto_now_ns() > end)
			fail_msg("the publisher holds %llu bytes for serving, want %llu (tp2 %llu, tp1 %llu per version)",
				 (unsigned long long)have, (unsigned long long)want,
				 (unsigned long long)t2, (unsigned long long)t1);
		usleep(20000);
	}
}

/* ---- the CLI ------------------------------------------------------------------------ */

static void write_version_file(const char *path, const struct proto_model *m, uint64_t v)
{
	const void **data = calloc(m->ntensors, sizeof(*data));
	struct proto_err err = {{0}};

	assert_non_null(data);
	for (uint32_t t = 0; t < m->ntensors; t++) {
		uint8_t *b = malloc(m->tensors[t].nbytes);
		assert_non_null(b);
		proto_fixture_fill(m, SEED, v, t, 0, m->tensors[t].nelem, b);
		data[t] = b;
	}
	if (proto_st_write(path, m, NULL, data, &err) != 0)
		fail_msg("%s", err.msg);
	for (uint32_t t = 0; t < m->ntensors; t++)
		free((void *)data[t]);
	free(data);
}

static pid_t spawn(char *const argv[], const char *out, const char *errf)
{
	posix_spawn_file_actions_t fa;
	pid_t pid;

	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	posix_spawn_file_actions_addopen(&fa, 2, errf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);
	return pid;
}

/* Exit status, or -1 (after killing it) when it runs past ms. */
static int wait_exit(pid_t pid, int ms)
{
	int st;

	for (int i = 0; i < ms / 10; i++) {
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
		usleep(10000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return -1;
}

static int ctl_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	for (int i = 0; i < 1000; i++) {
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		close(fd);
		usleep(10000);
	}
	fail_msg("cannot connect to %s", path);
	return -1;
}

/* One line (without its newline) into buf, waiting at most ms. */
static void ctl_line(int fd, char *buf, size_t cap, int ms)
{
	size_t n = 0;

	while (n + 1 < cap) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		if (poll(&p, 1, ms) <= 0)
			fail_msg("no answer on the control socket (have '%.*s')", (int)n, buf);
		if (read(fd, buf + n, 1) != 1)
			fail_msg("control socket closed");
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = 0;
}

static void ctl_send(int fd, const char *s)
{
	assert_int_equal(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

/* The binary with --control and --model-dir: versions 1..L+2 are files
 * v0..vL+1 holding the fixture's bytes (L the tracker's latest), so the
 * restart check of vL passes only if the safetensors source (read with
 * pread) gives exactly the synthetic bytes. The file of version L+2 is
 * truncated once the publisher has opened it: its export fails in one
 * clear line and the versions before it stay served. */
static void test_cli_control_model_dir(void **state)
{
	char bin[512], mdir[320], sock[320], out[320], errf[320], path[400], line[512];
	char *argv[16];
	int a, b, k = 0;
	pid_t pid;
	bool saw_unknown = false, saw_cut = false;
	uint64_t end, L = latest_version();
	char cut[64];
	struct stat st;

	/* The in-process publisher leaves; the tracker stays. */
	loop_stop();
	node_pub_free(g.pub);
	g.pub = NULL;
	loop_start();

	snprintf(mdir, sizeof(mdir), "%s/model", g.dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	for (uint64_t v = 1; v <= L + 2; v++) {
		snprintf(path, sizeof(path), "%s/v%llu.safetensors", mdir, (unsigned long long)(v - 1));
		write_version_file(path, &g.model, v);
	}
	snprintf(sock, sizeof(sock), "%s/ctl.sock", g.dir);
	snprintf(out, sizeof(out), "%s/cli.out", g.dir);
	snprintf(errf, sizeof(errf), "%s/cli.err", g.dir);
	tu_bin(bin, sizeof(bin), "tessera");
	argv[k++] = bin;
	argv[k++] = "publish";
	argv[k++] = "--tracker";
	argv[k++] = g.url;
	argv[k++] = "--key";
	argv[k++] = g.key;
	argv[k++] = "--model-dir";
	argv[k++] = mdir;
	argv[k++] = "--control";
	argv[k++] = sock;
	argv[k] = NULL;
	pid = spawn(argv, out, errf);

	/* Replica A's ranks start on vL, so it stays retained after vL+1. */
	report_all(L, TRK_STATE_FETCHING);

	/* A client that asks and leaves at once: the export still happens. */
	a = ctl_connect(sock);
	ctl_send(a, "export\n");
	close(a);
	end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
	while (latest_version() < L + 1) {
		if (proto_now_ns() > end)
			fail_msg("version %llu never appeared (see %s)", (unsigned long long)L + 1, errf);
		usleep(20000);
	}
	/* Version L+2's file loses its second half after it was opened. */
	snprintf(path, sizeof(path), "%s/v%llu.safetensors", mdir, (unsigned long long)L + 1);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(truncate(path, st.st_size / 2), 0);
	/* Two commands in one write. */
	snprintf(cut, sizeof(cut), "error version %llu: ", (unsigned long long)L + 2);
	b = ctl_connect(sock);
	ctl_send(b, "export\nbogus\n");
	for (int i = 0; i < 2; i++) {
		ctl_line(b, line, sizeof(line), WAIT_MS);
		saw_unknown |= strncmp(line, "error unknown command 'bogus'", 29) == 0;
		saw_cut |= strncmp(line, cut, strlen(cut)) == 0 && strstr(line, path) != NULL &&
			   strstr(line, "truncated") != NULL;
	}
	assert_true(saw_unknown);
	if (!saw_cut)
		fail_msg("no '%s...%s...truncated' line (see %s)", cut, path, errf);
	/* vL was rebuilt from the safetensors file and re-offered. */
	for (uint64_t v = L; v <= L + 1; v++) {
		end = proto_now_ns() + (uint64_t)WAIT_MS * 1000000u;
		while (pub_sources(v, 0, 0, NULL) == 0) {
			if (proto_now_ns() > end)
				fail_msg("version %llu is not offered", (unsigned long long)v);
			usleep(20000);
		}
		read_and_check(v);
	}
	ctl_send(b, "quit\n");
	assert_int_equal(wait_exit(pid, 30000), 0);
	close(b);
	assert_int_equal(access(sock, F_OK), -1); /* removed on exit */
	assert_int_equal(tu_sh("grep -q '^published v%llu anchor' %s", (unsigned long long)L + 1, out), 0);
}

/* Bad input: one clear line on stderr and a non-zero exit. */
static void expect_one_line(const char *args, const char *needle)
{
	char bin[512], errf[320];
	int rc;

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(errf, sizeof(errf), "%s/bad.err", g.dir);
	rc = tu_sh("%s publish --tracker http://127.0.0.1:1 --key %s %s >/dev/null 2>%s", bin,
		   g.key, args, errf);
	if (rc == 0)
		fail_msg("'%s' succeeded", args);
	if (tu_sh("test $(wc -l < %s) -eq 1", errf) != 0 || tu_sh("grep -q -- '%s' %s", needle, errf) != 0) {
		tu_sh("cat %s >&2", errf);
		fail_msg("'%s': want one line mentioning '%s'", args, needle);
	}
}

static void test_bad_input(void **state)
{
	char path[400], dir[320], args[800];
	struct proto_model big;
	struct proto_err err = {{0}};

	snprintf(path, sizeof(path), "%s/bad-layout.json", g.dir);
	assert_int_equal(tu_write(path, "{\"ranks\": [{\"tensors\": 7}]"), 0);
	snprintf(args, sizeof(args), "--synthetic-mb 1 --layout %s", path);
	expect_one_line(args, "bad-layout.json");

	/* Two versions of different models. */
	snprintf(dir, sizeof(dir), "%s/mixed", g.dir);
	assert_int_equal(mkdir(dir, 0755), 0);
	snprintf(path, sizeof(path), "%s/v0.safetensors", dir);
	write_version_file(path, &g.model, 1);
	assert_int_equal(proto_fixture_model(2 * MODEL_BYTES, &big, &err), 0);
	snprintf(path, sizeof(path), "%s/v1.safetensors", dir);
	write_version_file(path, &big, 2);
	proto_model_fini(&big);
	snprintf(args, sizeof(args), "--model-dir %s", dir);
	expect_one_line(args, "must share the model");

	snprintf(args, sizeof(args), "--model-dir %s/empty-nonexistent", g.dir);
	expect_one_line(args, "empty-nonexistent");

	expect_one_line("--synthetic-mb 1 --provider no-such-provider", "no-such-provider");
	expect_one_line("--synthetic-mb 1 --ranks 0,5", "rank 5");
	expect_one_line("--synthetic-mb 1 --model-dir /tmp", "exactly one");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_publish_and_read),
		cmocka_unit_test(test_retire),
		cmocka_unit_test(test_restart),
		cmocka_unit_test(test_leader_follower),
		cmocka_unit_test(test_layout_drop),
		cmocka_unit_test(test_cli_control_model_dir),
		cmocka_unit_test(test_bad_input),
	};

	/* Before anything reads a tunable: small chunks (several per parcel), a
	 * lease that outlives the test, a quick retain check. */
	setenv("TESSERA_CHUNK_SIZE", CHUNK, 1);
	setenv("TESSERA_LEASE_MS", "60000", 1);
	setenv("TESSERA_PUB_CHECK_MS", "200", 1);
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0 || evthread_use_pthreads() != 0)
		return 1;
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
