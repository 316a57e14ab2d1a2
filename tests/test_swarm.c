/* The swarm (node/swarm/): the chase of peers' pages, and peer fanout end
 * to end on loopback: a swarm of nodes gets a version from about one copy
 * of the trainer's upload, survives a peer killed mid-transfer, and bans a
 * peer that serves corrupt chunks. The chunk choice is tested on its own
 * in test_picker.c. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "node/swarm/swarm_internal.h"
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/fetchtest.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define NODES 4
#define MODEL_MB 4
#define SEED 7

/*
 * The chase (node/swarm/have.c): a parcel that waits on its peers alone,
 * nothing of ours in flight and up to 2 MiB of chunks left that peers are
 * fetching (a delta's, at 128 KiB 16 of them), has their pages read every
 * HAVE_CHASE_MS; more left, or a read of ours out, leaves them to the
 * poll. It counted 4 chunks, not 2 MiB: a 128 KiB delta's parcel of 20
 * chunks waited on 100 ms polls.
 */
static void test_swarm_chase_bytes(void **state)
{
	enum { CN = 24 };
	struct qparcel q;
	uint8_t *st = q.st;
	struct fetch f = {.version = 5, .parcels = &q.p, .nparcels = 1};
	struct fetcher x = {.fanout = true, .f = &f, .chunk_size = 131072, .max_inflight = 16};
	struct swarm sw = {.x = &x};

	(void)state;
	x.o.base = event_base_new();
	assert_non_null(x.o.base);
	qparcel_init(&q, CN, 131072, 0, 0);
	memset(q.busy, 1, CN); /* a peer is fetching each */
	for (uint32_t i = 0; i < 8; i++)
		st[i] = 2;
	q.p.done = 8; /* 16 left: 2 MiB */
	swarm__chase(&sw);
	assert_non_null(sw.chase_ev);
	assert_true(evtimer_pending(sw.chase_ev, NULL));
	evtimer_del(sw.chase_ev);

	st[7] = 0; /* 17 left: more than 2 MiB, the poll's */
	q.p.done = 7;
	swarm__chase(&sw);
	assert_false(evtimer_pending(sw.chase_ev, NULL));

	st[7] = 2; /* 16 left again, but one of ours in flight */
	q.p.done = 8;
	st[8] = 1;
	swarm__chase(&sw);
	assert_false(evtimer_pending(sw.chase_ev, NULL));

	st[8] = 0; /* with 512 KiB chunks, 4 left (2 MiB) are chased, 5 not */
	for (uint32_t i = 0; i < CN; i++)
		q.chunks[i].size = 524288;
	for (uint32_t i = 0; i < CN; i++)
		st[i] = i < CN - 4 ? 2 : 0;
	q.p.done = CN - 4;
	swarm__chase(&sw);
	assert_true(evtimer_pending(sw.chase_ev, NULL));
	evtimer_del(sw.chase_ev);
	st[CN - 5] = 0;
	q.p.done = CN - 5;
	swarm__chase(&sw);
	assert_false(evtimer_pending(sw.chase_ev, NULL));

	event_free(sw.chase_ev);
	event_base_free(x.o.base);
}


static void swarm_env(void)
{
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_FETCH_MBPS", "8", 1);
	setenv("TESSERA_HAVE_POLL_MS", "20", 1);
	setenv("TESSERA_LEASE_MS", "2000", 1);
}

static void swarm_env_clear(void)
{
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_FETCH_MBPS");
	unsetenv("TESSERA_HAVE_POLL_MS");
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
	unsetenv("TESSERA_FANOUT");
	unsetenv("TESSERA_PUB_UPLOAD_READERS");
	unsetenv("TESSERA_UPLOAD_PEERS");
	unsetenv("TESSERA_UPLOAD_MBPS");
}

/*
 * Four tp1 replicas and a trainer of two ranks (`tessera cluster`): every
 * replica ends with the version's exact bytes (the cluster compares them),
 * and the trainer sent about one copy. What a node takes from the trainer
 * beyond its share is what it reads before it knows its peers' chunks (its
 * first source list may not name them yet, asked again after
 * SOURCES_MIN_MS = 300 ms; a have-page is up to two polls old) or while it
 * starves (STARVE_MS without a chunk): at 8 Mbit/s about 0.34 MB per node
 * on an idle machine, and as much more as the scheduler delays those
 * steps on a loaded one (1.00-1.09 S measured idle, up to 1.30 S at load
 * 60). A time-derived bound would fail on a busy machine, so the bound is
 * one and a half copies; in star mode the trainer sends NODES = 4 copies:
 * that run is the contrast that shows the bound means something.
 */
#define ABOUT_ONE_COPY(s) ((s) + (s) / 2)
static json_t *cluster(const char *dir, const char *fanout)
{
	char bin[512], report[512];

	setenv("TESSERA_FANOUT", fanout, 1);
	snprintf(report, sizeof(report), "%s/report.json", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s cluster --synthetic-mb %d --versions 1 --replica tp1 --replica tp1 "
			       "--replica tp1 --replica tp1 --report %s > %s/out 2>&1 || cat %s/out",
			       bin, MODEL_MB, report, dir, dir),
			 0);
	json_t *j = tu_load_json(report);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	return j;
}

/*
 * Star mode (TESSERA_FANOUT=0) with tessera-node built under ASan: a
 * version a node does not serve to peers is freed at its activation, when
 * the swarm would keep it; the rebuild takes what it keeps of the version
 * first. It used to read the freed fetch there (a use after free that the
 * release builds the other tests run did not show). Three anchors: each
 * activation but the first also retires the one before.
 */
static void test_swarm_star_activation(void **state)
{
	const char *rel = getenv("TESSERA_BIN"), *asan = getenv("TESSERA_ASAN_BIN");
	char dir[256], report[512], opts[512];
	const char *was = getenv("ASAN_OPTIONS");

	if (rel == NULL || asan == NULL) {
		print_message("no TESSERA_BIN/TESSERA_ASAN_BIN (make test sets them): skipped\n");
		skip();
	}
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	/* tessera cluster runs the programs beside its own binary (a copy:
	 * it finds its directory through /proc/self/exe). */
	assert_int_equal(tu_sh("mkdir -p %s/bin && cp %s/tessera %s/bin/ && "
			       "ln -s %s/tessera-tracker %s/bin/ && ln -s %s/tessera-node %s/bin/",
			       dir, rel, dir, rel, dir, asan, dir),
			 0);
	snprintf(opts, sizeof(opts), "%s", was != NULL ? was : "");
	setenv("ASAN_OPTIONS", "detect_leaks=0:protect_shadow_gap=0:abort_on_error=1", 1);
	setenv("TESSERA_FANOUT", "0", 1);
	snprintf(report, sizeof(report), "%s/report.json", dir);
	int rc = tu_sh("%s/bin/tessera cluster --mode star --synthetic-mb %d --versions 3 "
		       "--replica tp1 --keep %s/run --report %s > %s/out 2>&1 || "
		       "(cat %s/out; grep -h -A20 Sanitizer %s/run/node-*.log; false)",
		       dir, MODEL_MB, dir, report, dir, dir, dir);
	unsetenv("TESSERA_FANOUT");
	if (was != NULL)
		setenv("ASAN_OPTIONS", opts, 1);
	else
		unsetenv("ASAN_OPTIONS");
	assert_int_equal(rc, 0);
	json_t *j = tu_load_json(report);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	json_decref(j);
	tu_rmtree(dir);
}

static void test_swarm_trainer_uploads_once(void **state)
{
	char dir[256];

	swarm_env();
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	json_t *j = cluster(dir, "1");
	json_t *v = json_array_get(json_object_get(j, "versions"), 0);
	uint64_t s = (uint64_t)json_integer_value(json_object_get(v, "payload_bytes"));
	uint64_t up = (uint64_t)json_integer_value(json_object_get(v, "trainer_upload_bytes"));
	uint64_t peers = (uint64_t)json_integer_value(json_object_get(v, "peer_upload_bytes"));
	uint64_t blind = 8000000 / 8 * (300 + 2 * 20) / 1000; /* a node's idle excess, see above */
	size_t i;
	json_t *r;

	json_array_foreach(json_object_get(v, "replicas"), i, r) {
		assert_true(json_is_true(json_object_get(r, "activated")));
		assert_true(json_is_true(json_object_get(r, "digest_ok")));
	}
	assert_true(s > 0);
	print_message("fanout: trainer sent %.3f S, peers %.3f S (bound %.3f S)\n", (double)up / s,
		      (double)peers / s, (double)ABOUT_ONE_COPY(s) / s);
	assert_true(up >= s);
	assert_true(up <= ABOUT_ONE_COPY(s));
	assert_int_equal(up + peers, NODES * s); /* every byte counted once, by source */
	json_decref(j);

	/* The trainer's upload capped to one reader per parcel (two parcels:
	 * one per trainer rank): the other members take the trainer's chunks
	 * from peers, every node ends with the exact bytes and the trainer
	 * sends about one copy, within the bound above: a member that starves
	 * (its reader's have-page not read yet on a loaded machine) reads the
	 * trainer past the cap, as a blind one does. How many replicas read
	 * more than that from the trainer is printed (2 on an idle machine). */
	int readers = 0;
	setenv("TESSERA_PUB_UPLOAD_READERS", "1", 1);
	j = cluster(dir, "1");
	v = json_array_get(json_object_get(j, "versions"), 0);
	up = (uint64_t)json_integer_value(json_object_get(v, "trainer_upload_bytes"));
	peers = (uint64_t)json_integer_value(json_object_get(v, "peer_upload_bytes"));
	json_array_foreach(json_object_get(v, "replicas"), i, r) {
		assert_true(json_is_true(json_object_get(r, "activated")));
		assert_true(json_is_true(json_object_get(r, "digest_ok")));
		readers += (uint64_t)json_integer_value(json_object_get(r, "bytes_from_trainer")) > blind;
	}
	print_message("capped: trainer sent %.3f S, peers %.3f S (bound %.3f S), %d readers\n",
		      (double)up / s, (double)peers / s, (double)ABOUT_ONE_COPY(s) / s, readers);
	assert_true(up >= s);
	assert_true(up <= ABOUT_ONE_COPY(s));
	assert_int_equal(up + peers, NODES * s);
	json_decref(j);
	unsetenv("TESSERA_PUB_UPLOAD_READERS");

	/* Star mode: nobody serves, the trainer sends every copy. */
	json_t *k = cluster(dir, "0");
	v = json_array_get(json_object_get(k, "versions"), 0);
	assert_int_equal(json_integer_value(json_object_get(v, "peer_upload_bytes")), 0);
	assert_int_equal(json_integer_value(json_object_get(v, "trainer_upload_bytes")),
			 (json_int_t)(NODES * s));
	json_decref(k);
	swarm_env_clear();
	tu_rmtree(dir);
}

/* ---- a swarm of separate processes ------------------------------------------ */

struct swarm_run {
	char dir[256], url[256], sock[512], expose[512], model[512], key[512], pub[512];
	struct node_proc tracker, publisher, nodes[NODES];
	struct trk_client *trk;
	struct proto_model m;
	struct proto_layout tp1;
	const char *mbps; /* each node's fetch cap (TESSERA_FETCH_MBPS); NULL: 8 */
	/* A TCP forwarder in front of the tracker for node 1 (B) alone, which
	 * the test can pause: B's control path, not its fabric. */
	struct node_proc proxy;
	char proxy_url[256];
};

/* Node i is replica "A"+i, rank 0, tp1; corrupt: it serves corrupt chunks
 * (TESSERA_TEST_CORRUPT_SERVE, its own copy stays right). */
static void start_node(struct swarm_run *w, int i, bool corrupt)
{
	char bin[512], log[600], rep[8];

	snprintf(rep, sizeof(rep), "%c", 'A' + i);
	snprintf(log, sizeof(log), "%s/node-%s.log", w->dir, rep);
	tu_bin(bin, sizeof(bin), "tessera-node");
	char *argv[] = {bin, "--tracker", i == 1 && w->proxy_url[0] ? w->proxy_url : w->url,
			"--replica", rep, "--rank", "0", "--layout", "tp1",
			"--model", w->model, "--trainer-pubkey", w->pub, "--expose", w->expose,
			"--store", "host", NULL};
	if (corrupt)
		setenv("TESSERA_TEST_CORRUPT_SERVE", "1", 1);
	assert_int_equal(node_proc_spawn(&w->nodes[i], rep, argv, log), 0);
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
}

static void start_proxy(struct swarm_run *w)
{
	char log[600], line[64];
	const char *port = strrchr(w->url, ':');
	char *argv[] = {"/usr/bin/python3", "-c",
			"import socket, sys, threading\n"
			"ls = socket.socket()\n"
			"ls.bind(('127.0.0.1', 0))\n"
			"ls.listen(64)\n"
			"print('proxy on', ls.getsockname()[1], flush=True)\n"
			"def pipe(a, b):\n"
			"    try:\n"
			"        while True:\n"
			"            d = a.recv(65536)\n"
			"            if not d: break\n"
			"            b.sendall(d)\n"
			"    except OSError: pass\n"
			"    for x in (a, b):\n"
			"        try: x.shutdown(socket.SHUT_RDWR)\n"
			"        except OSError: pass\n"
			"while True:\n"
			"    c, _ = ls.accept()\n"
			"    try: u = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
			"    except OSError: c.close(); continue\n"
			"    for x, y in ((c, u), (u, c)):\n"
			"        threading.Thread(target=pipe, args=(x, y), daemon=True).start()\n",
			(char *)(port != NULL ? port + 1 : ""), NULL};

	snprintf(log, sizeof(log), "%s/proxy.log", w->dir);
	assert_int_equal(node_proc_spawn(&w->proxy, "proxy", argv, log), 0);
	assert_int_equal(node_proc_wait_line(&w->proxy, "proxy on ", line, sizeof(line), 30000), 0);
	snprintf(w->proxy_url, sizeof(w->proxy_url), "http://127.0.0.1:%s", line);
}

static void swarm_start(struct swarm_run *w, int corrupt)
{
	char bin[512], log[600], state_dir[600], buf[512];
	struct proto_err err;

	swarm_env();
	if (w->mbps != NULL)
		setenv("TESSERA_FETCH_MBPS", w->mbps, 1);
	assert_non_null(tu_mkdtemp(w->dir, sizeof(w->dir)));
	snprintf(w->sock, sizeof(w->sock), "%s/ctl.sock", w->dir);
	snprintf(w->expose, sizeof(w->expose), "%s/expose", w->dir);
	snprintf(w->model, sizeof(w->model), "%s/model.json", w->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", w->dir);
	snprintf(w->key, sizeof(w->key), "%s", tu_data(buf, sizeof(buf), "test-trainer.key"));
	snprintf(w->pub, sizeof(w->pub), "%s", tu_data(buf, sizeof(buf), "test-trainer.pub"));
	mkdir(w->expose, 0755);
	assert_int_equal(proto_fixture_model(MODEL_MB << 20, &w->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&w->m, "tp1", &w->tp1, &err), 0);
	tu_write_model(&w->m, w->model);
	tu_start_tracker(&w->tracker, w->dir, state_dir, w->pub, w->url, sizeof(w->url));
	assert_int_equal(trk_client_new(NULL, w->url, NULL, &w->trk, &err), 0);
	if (w->proxy.name[0] != 0)
		start_proxy(w);
	for (int i = 0; i < NODES; i++)
		start_node(w, i, i == corrupt);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", w->dir);
	char mb[16];
	snprintf(mb, sizeof(mb), "%d", MODEL_MB);
	char *argv[] = {bin, "publish", "--tracker", w->url, "--key", w->key, "--synthetic-mb", mb,
			"--seed", "7", "--layout", "fsdp2", "--control", w->sock, NULL};
	assert_int_equal(node_proc_spawn(&w->publisher, "publisher", argv, log), 0);
}

static int swarm_setup(void **state)
{
	*state = calloc(1, sizeof(struct swarm_run));
	return *state == NULL;
}

static int swarm_teardown(void **state)
{
	struct swarm_run *w = *state;

	node_proc_stop(&w->publisher, 5000);
	for (int i = 0; i < NODES; i++)
		node_proc_stop(&w->nodes[i], 5000);
	trk_client_free(w->trk);
	if (w->proxy.pid > 0)
		kill(w->proxy.pid, SIGCONT);
	node_proc_stop(&w->proxy, 5000);
	node_proc_stop(&w->tracker, 5000);
	proto_layout_fini(&w->tp1);
	proto_model_fini(&w->m);
	if (w->dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(w->dir);
	swarm_env_clear();
	free(w);
	return 0;
}

/* Rank 0 of replica "A"+i as /status shows it; NULL if absent. The
 * caller json_decref()s *st. */
static json_t *rank_of(struct swarm_run *w, int i, json_t **st)
{
	struct trk_reply r;
	char rep[8];
	json_t *v, *found = NULL;
	size_t k;

	*st = NULL;
	snprintf(rep, sizeof(rep), "%c", 'A' + i);
	if (trk_client_call(w->trk, "GET", TRK_API "/status", NULL, NULL, 0, &r) == 0 &&
	    r.status == 200 && r.json != NULL) {
		*st = json_incref(r.json);
		json_array_foreach(json_object_get(r.json, "replicas"), k, v)
			if (strcmp(json_string_value(json_object_get(v, "replica")), rep) == 0)
				found = json_array_get(json_object_get(v, "ranks"), 0);
	}
	trk_reply_fini(&r);
	return found;
}

static uint64_t active_of(struct swarm_run *w, int i)
{
	json_t *st, *rk = rank_of(w, i, &st);
	uint64_t v = rk ? (uint64_t)json_integer_value(json_object_get(rk, "active")) : 0;
	json_decref(st);
	return v;
}

static bool wait_active(struct swarm_run *w, int i, uint64_t v, int ms)
{
	for (int t = 0; t < ms; t += 50) {
		if (active_of(w, i) == v)
			return true;
		usleep(50000);
	}
	return false;
}

/* Node i serves exactly v's bytes (checked here, not taken from it). */
static void check_serving(struct swarm_run *w, int i, uint64_t v)
{
	char path[600];
	size_t n = w->tp1.ranks[0].nbytes;

	snprintf(path, sizeof(path), "%s/%c-0.json", w->expose, 'A' + i);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	int fd = open(json_string_value(json_object_get(j, "memfd_path")), O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0), *expect = malloc(n);
	assert_true(m != MAP_FAILED);
	proto_fixture_fill_rank(&w->m, &w->tp1, 0, SEED, v, expect);
	assert_memory_equal(m, expect, n);
	free(expect);
	munmap(m, n);
	close(fd);
	json_decref(j);
}

/* Waits until every node is registered (so that the version's swarm has
 * all of them), then exports v1. */
static void export_v1(struct swarm_run *w)
{
	char line[512];

	for (int t = 0; t < 30000; t += 50) {
		int n = 0;
		for (int i = 0; i < NODES; i++) {
			json_t *st, *rk = rank_of(w, i, &st);
			n += rk != NULL && json_is_true(json_object_get(rk, "alive"));
			json_decref(st);
		}
		if (n == NODES)
			break;
		usleep(50000);
	}
	tu_control(w->sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);
}

/* A peer killed while the others read from it: their reads fail and move
 * to other holders; everyone else finishes with the exact bytes. */
static uint64_t metric_sum(struct swarm_run *w, int skip, const char *series);

/* Every node made its first version's slot and plan while it waited for
 * the version (agent_ready_ahead), once each: true when they all did
 * within ms. */
static bool wait_ready_ahead(struct swarm_run *w, int ms)
{
	for (int t = 0; t < ms; t += 200) {
		if (metric_sum(w, -1, "tessera_node_ready_ahead_total.*slot") == NODES &&
		    metric_sum(w, -1, "tessera_node_ready_ahead_total.*plan") == NODES)
			return true;
		usleep(200000);
	}
	return false;
}

static void test_swarm_peer_killed(void **state)
{
	struct swarm_run *w = *state;
	bool mid = false;

	swarm_start(w, -1);
	/* The slot and plan are ready before v1 exists: its fetch starts
	 * with its first reads, not with a layout round trip and a slot. */
	assert_true(wait_ready_ahead(w, 60000));
	export_v1(w);
	/* B holds part of v1 and its peers have read from it. */
	for (int t = 0; t < 30000 && !mid; t += 20) {
		json_t *st, *rk = rank_of(w, 1, &st);
		uint64_t done = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_done")) : 0;
		uint64_t total = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_total")) : 0;
		uint64_t peers = 0;
		for (int i = 0; i < NODES; i++) {
			json_t *s2, *r2 = rank_of(w, i, &s2);
			peers += r2 ? (uint64_t)json_integer_value(json_object_get(r2, "bytes_from_peers")) : 0;
			json_decref(s2);
		}
		mid = total > 0 && done >= total / 4 && done < total && peers > 0;
		json_decref(st);
		if (!mid)
			usleep(20000);
	}
	assert_true(mid);
	node_proc_kill(&w->nodes[1]);
	for (int i = 0; i < NODES; i++) {
		if (i == 1)
			continue;
		assert_true(wait_active(w, i, 1, 60000));
		check_serving(w, i, 1);
	}
	/* Peers' chunks were gathered straight from the slots they were
	 * scattered into (the served copy is gone), and every byte of them
	 * was verified (bit-exact above). */
	uint64_t slot = metric_sum(w, 1, "tessera_node_peer_slot_bytes_total");
	uint64_t peer = 0;
	for (int i = 0; i < NODES; i++) {
		json_t *st = NULL, *rk = i == 1 ? NULL : rank_of(w, i, &st);
		peer += rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers")) : 0;
		json_decref(st);
	}
	print_message("peer bytes %" PRIu64 ", of them gathered from slots %" PRIu64 "\n", peer, slot);
	assert_true(slot > 0);
	assert_true(slot <= peer);
}

/* Node i's bytes from the trainer as the tracker last heard them. */
static uint64_t from_trainer_of(struct swarm_run *w, int i)
{
	json_t *st, *rk = rank_of(w, i, &st);
	uint64_t b = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer")) : 0;

	json_decref(st);
	return b;
}

/* The sum over the live nodes of one metric series (their /metrics). */
static uint64_t metric_sum(struct swarm_run *w, int skip, const char *series)
{
	char out[600];
	uint64_t sum = 0;

	snprintf(out, sizeof(out), "%s/metric.out", w->dir);
	for (int i = 0; i < NODES; i++) {
		if (i == skip)
			continue;
		assert_int_equal(tu_sh("url=$(sed -n 's/^metrics on //p' %s/node-%c.log | head -1); "
				       "curl -s -m 10 \"$url/metrics\" | awk '$1 ~ /^%s/ {s += $2} "
				       "END {print s + 0}' > %s",
				       w->dir, 'A' + i, series, out),
			 0);
		struct proto_err err;
		uint8_t *text;
		size_t len;
		assert_int_equal(proto_read_file(out, 4096, &text, &len, &err), 0);
		sum += strtoull((const char *)text, NULL, 10);
		free(text);
	}
	return sum;
}

/*
 * The trainer capped to one reader per parcel, and that reader killed
 * mid-transfer, while the others read the trainer's chunks from it: the
 * chunks it owned and had not passed on can come from nobody else, so the
 * survivors must take them from the trainer past the cap (starved, then
 * as the next reader in line once the tracker drops it). Every survivor
 * activates the exact bytes. Every node also serves two readers at most
 * (TESSERA_UPLOAD_PEERS): readers left out by a peer read elsewhere, and
 * nobody counts that peer as bad.
 */
static void test_swarm_capped_reader_killed(void **state)
{
	struct swarm_run *w = *state;
	uint64_t s, most = 0;
	int reader = -1;
	bool mid = false;

	setenv("TESSERA_PUB_UPLOAD_READERS", "1", 1);
	setenv("TESSERA_UPLOAD_PEERS", "2", 1);
	swarm_start(w, -1);
	s = w->tp1.ranks[0].nbytes;
	export_v1(w);
	/* The reader (whoever took the most from the trainer) holds part of
	 * v1, and the others have read some of it from peers. */
	for (int t = 0; t < 30000 && !mid; t += 20) {
		uint64_t peers = 0;
		most = 0;
		for (int i = 0; i < NODES; i++) {
			json_t *st, *rk = rank_of(w, i, &st);
			uint64_t ft = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer")) : 0;
			peers += rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers")) : 0;
			json_decref(st);
			if (ft > most) {
				most = ft;
				reader = i;
			}
		}
		mid = most >= s / 8 && most < s / 2 && peers > 0;
		if (!mid)
			usleep(20000);
	}
	assert_true(mid);
	node_proc_kill(&w->nodes[reader]);
	for (int i = 0; i < NODES; i++) {
		if (i == reader)
			continue;
		assert_true(wait_active(w, i, 1, 60000));
		check_serving(w, i, 1);
	}
	for (int i = 0; i < NODES; i++)
		if (i != reader)
			print_message("node %c took %.3f S from the trainer\n", 'A' + i,
				      (double)from_trainer_of(w, i) / s);
	uint64_t refusals = metric_sum(w, reader, "tessera_node_budget_refusals_total");
	uint64_t unowned = metric_sum(w, reader, "tessera_node_trainer_unowned_bytes_total");
	print_message("budget refusals %" PRIu64 ", trainer bytes past the cap %.3f S\n", refusals,
		      (double)unowned / s);
	assert_true(refusals > 0); /* with 4 members, each peer leaves one reader out */
	/* The dead reader's chunks came past the cap (unowned > 0) or from the
	 * next reader in line once the tracker dropped it: which one depends on
	 * how soon the lease lapsed, so only the exact bytes above are asserted. */
	assert_int_equal(metric_sum(w, reader, "tessera_node_banned_peers_total"), 0);
}

/* A peer serving corrupt chunks: its chunks fail their hash, it is banned
 * for the version by the nodes that read two of them (shown by the
 * tracker), and every other node ends with the exact bytes. */
static void test_swarm_corrupt_peer_banned(void **state)
{
	struct swarm_run *w = *state;
	const int bad = 3; /* node D */
	int banned = 0;

	swarm_start(w, bad);
	export_v1(w);
	for (int i = 0; i < NODES; i++) {
		json_t *st, *rk;
		assert_true(wait_active(w, i, 1, 60000));
		check_serving(w, i, 1); /* the corrupt one's own copy is right too */
		rk = rank_of(w, i, &st);
		const char *b = json_string_value(json_object_get(rk, "banned"));
		if (i != bad && b != NULL) {
			assert_string_equal(b, "D/0");
			banned++;
		}
		json_decref(st);
	}
	assert_true(banned >= 1);
}

/*
 * Node B's control path to the tracker stalls for longer than its lease
 * while the swarm fetches (heartbeats stuck behind a congested link): the
 * tracker drops B and lists it nowhere until B registers and offers again.
 * B keeps its fetch, and B's peers keep it as a source and an owner while
 * it answers over the fabric (TESSERA_PEER_GRACE_MS): every node activates
 * the exact bytes, B registered again, and the trainer still sent about
 * one copy, within the bound of test_swarm_trainer_uploads_once. (On
 * loopback the lapse is short and a swarm without the grace stays within
 * the bound too: this guards the lapse path, it does not measure the
 * grace.)
 */
static void test_swarm_lease_lapse(void **state)
{
	struct swarm_run *w = *state;
	uint64_t s, from_trainer[NODES] = {0}, up = 0;
	bool mid = false, all = false;
	char path[600];

	w->mbps = "2"; /* 4 MiB take about 17 s: the stall falls mid-transfer */
	snprintf(w->proxy.name, sizeof(w->proxy.name), "proxy");
	swarm_start(w, -1);
	s = w->tp1.ranks[0].nbytes;
	export_v1(w);
	for (int t = 0; t < 30000 && !mid; t += 50) {
		json_t *st, *rk = rank_of(w, 1, &st);
		uint64_t done = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_done")) : 0;
		json_decref(st);
		mid = done >= s / 8; /* B holds chunks its peers want */
		if (!mid)
			usleep(50000);
	}
	assert_true(mid);
	assert_int_equal(kill(w->proxy.pid, SIGSTOP), 0);
	/* The lease is 2 s: wait until the tracker dropped B. */
	for (int t = 0; t < 30000; t += 50) {
		json_t *st, *rk = rank_of(w, 1, &st);
		bool gone = rk == NULL || !json_is_true(json_object_get(rk, "alive"));
		json_decref(st);
		if (gone)
			break;
		usleep(50000);
	}
	usleep(2000 * 1000); /* peers ask for sources every second meanwhile */
	assert_int_equal(kill(w->proxy.pid, SIGCONT), 0);
	/* The nodes' counters (cumulative per version) as last reported. */
	for (int t = 0; t < 90000 && !all; t += 50) {
		all = true;
		for (int i = 0; i < NODES; i++) {
			json_t *st, *rk = rank_of(w, i, &st);
			uint64_t ft = rk ? (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer")) : 0;
			from_trainer[i] = PROTO_MAX(from_trainer[i], ft);
			all &= rk != NULL && json_integer_value(json_object_get(rk, "active")) == 1;
			json_decref(st);
		}
		if (!all)
			usleep(50000);
	}
	assert_true(all);
	for (int i = 0; i < NODES; i++) {
		check_serving(w, i, 1);
		up += from_trainer[i];
	}
	/* B's lease did lapse: it said so and registered again. */
	snprintf(path, sizeof(path), "%s/node-B.log", w->dir);
	assert_int_equal(tu_sh("grep -q 'lease lost' %s", path), 0);
	print_message("B's lease lapsed: trainer sent %.3f S (bound %.3f S)\n", (double)up / s,
		      (double)ABOUT_ONE_COPY(s) / s);
	assert_true(up >= s);
	assert_true(up <= ABOUT_ONE_COPY(s));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_swarm_chase_bytes),
		cmocka_unit_test(test_swarm_trainer_uploads_once),
		cmocka_unit_test(test_swarm_star_activation),
		cmocka_unit_test_setup_teardown(test_swarm_peer_killed, swarm_setup, swarm_teardown),
		cmocka_unit_test_setup_teardown(test_swarm_corrupt_peer_banned, swarm_setup,
						swarm_teardown),
		cmocka_unit_test_setup_teardown(test_swarm_lease_lapse, swarm_setup, swarm_teardown),
		cmocka_unit_test_setup_teardown(test_swarm_capped_reader_killed, swarm_setup,
						swarm_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

