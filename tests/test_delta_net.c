/* Delta versions in the network, end to end with the real programs on
 * loopback: a cluster of anchors and deltas ends bit-exact on every replica;
 * deltas in a row are built by rotation (no dense copy), a damaged retired
 * slot and a pinned one each make the node copy instead;
 * a corrupted parent slot and a publisher restarted without its parent
 * export each end in an anchor that the node reaches, while it keeps
 * serving its previous version meanwhile; a node restarted between deltas,
 * a node that missed versions and a late replica replay the chain (from the
 * anchor, or from the version they hold) to the latest delta, and a chain
 * with a damaged step falls back to an anchor, and one whose steps a newer
 * anchor withdraws while it replays moves on to that anchor; a late
 * replica for which the version whole is cheaper than the chain reads it
 * from the replica that holds it (a signed raw copy's hashes), as does one
 * with no chain to replay, and one whose only holder lies falls back to
 * the chain. The
 * models are `tessera synth` outputs: RL-like steps where ~1.7 % of the
 * BF16 elements change. */
#include <errno.h>
#include <fcntl.h>
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

#include "node/client/tessera_client.h"
#include "node/cli/proc.h"
#include "proto/checkpoint.h"
#include "proto/proto.h"
#include "proto/synth.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define MODEL_BYTES (4u << 20)
#define STEPS 6

/* Writes a synth model of STEPS steps into dir. */
static void synth(const char *dir)
{
	struct proto_synth_opts o = {.bytes = MODEL_BYTES, .steps = STEPS, .lr = 1e-6, .seed = 3,
				     .threads = 2};
	struct proto_err err;
	assert_int_equal(mkdir(dir, 0755), 0);
	assert_int_equal(proto_synth_run(dir, &o, NULL, NULL, &err), 0);
}

/* A `tessera cluster` report that says ok, with its n versions in *vs
 * (the caller frees the report). */
static json_t *cluster_report(const char *path, size_t n, json_t **vs)
{
	json_t *j = tu_load_json(path);

	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "ok")));
	*vs = json_object_get(j, "versions");
	assert_int_equal(json_array_size(*vs), n);
	return j;
}

/* `tessera cluster` over a synth model: anchors and deltas alternate as
 * --anchor-every says, every replica ends bit-exact on every version, and a
 * delta costs a few percent of the anchor on the wire. A replica of a new
 * layout joining while the latest version is a delta gets it whole (by a raw
 * addendum) and ends bit-exact too. */
static void test_delta_cluster(void **state)
{
	char dir[256], mdir[300], bin[512], report[512];

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	synth(mdir);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(report, sizeof(report), "%s/report.json", dir);
	assert_int_equal(tu_sh("%s cluster --model-dir %s --versions 6 --anchor-every 4 --replica tp2 "
			       "--replica tp1 --late-replica tp4 --report %s > %s/out 2>&1 || cat %s/out",
			       bin, mdir, report, dir, dir),
			 0);
	json_t *vs, *j = cluster_report(report, 6, &vs);
	static const char *kinds[] = {"anchor", "delta", "delta", "delta", "anchor", "delta"};
	for (size_t i = 0; i < 6; i++) {
		json_t *v = json_array_get(vs, i);
		json_int_t wire = json_integer_value(json_object_get(v, "wire_bytes"));
		json_int_t anchor = json_integer_value(json_object_get(v, "anchor_bytes"));
		assert_string_equal(json_string_value(json_object_get(v, "kind")), kinds[i]);
		assert_true(anchor > 0 && wire > 0);
		if (i == 1 || i == 5)
			assert_true(wire * 10 < anchor); /* ~1.7 % changed: ~1 % of the bytes */
		else if (i == 0 || i == 4)
			assert_int_equal(wire, anchor);
		size_t k;
		json_t *r;
		json_array_foreach(json_object_get(v, "replicas"), k, r)
			assert_true(json_is_true(json_object_get(r, "digest_ok")));
	}
	/* v6, a delta, reached the late tp4 replica too. */
	json_t *last = json_object_get(json_array_get(vs, 5), "replicas");
	assert_int_equal(json_array_size(last), 3);
	json_t *late = json_array_get(last, 2);
	assert_true(json_is_true(json_object_get(late, "late")));
	assert_true(json_is_true(json_object_get(late, "activated")));
	json_decref(j);
	/* Bad option values are refused with a clear line. */
	assert_int_equal(tu_sh("%s cluster --anchor-every 0 > /dev/null 2>&1", bin), 2);
	assert_int_equal(tu_sh("%s publish --anchor-every x --tracker http://127.0.0.1:1 --key k "
			       "> /dev/null 2>&1",
			       bin),
			 2);
	tu_rmtree(dir);
}

/* A delta that turns out too large goes as an anchor after all, gathered
 * from the version's snapshot (the encode read it in place and stopped):
 * steps at lr 1e-3 change most elements, more than twice
 * TESSERA_DELTA_MAX_PERCENT=1 of them, so v2 stops its encode and goes
 * whole, and v3 goes whole without a try (the backoff after a delta that
 * did not pay), each snapshot still kept as the next one's parent, and every
 * replica (tp2: column shards gathered; tp1) is bit-exact on every version. */
static bool file_has(const char *path, const char *s);

static void test_anchor_after_all(void **state)
{
	char dir[256], mdir[300], bin[512], report[512];
	struct proto_synth_opts o = {.bytes = MODEL_BYTES, .steps = 2, .lr = 1e-3, .seed = 5,
				     .threads = 2};
	struct proto_err err;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	assert_int_equal(proto_synth_run(mdir, &o, NULL, NULL, &err), 0);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(report, sizeof(report), "%s/report.json", dir);
	assert_int_equal(tu_sh("TESSERA_DELTA_MAX_PERCENT=1 TESSERA_LOG=info %s cluster --model-dir %s "
			       "--versions 3 --replica tp2 --replica tp1 --keep %s/run --report %s "
			       "> %s/out 2>&1 || cat %s/out",
			       bin, mdir, dir, report, dir, dir),
			 0);
	json_t *vs, *j = cluster_report(report, 3, &vs);
	for (size_t i = 0; i < 3; i++) {
		json_t *v = json_array_get(vs, i), *r;
		size_t k;
		assert_string_equal(json_string_value(json_object_get(v, "kind")), "anchor");
		assert_int_equal(json_integer_value(json_object_get(v, "wire_bytes")),
				 json_integer_value(json_object_get(v, "anchor_bytes")));
		json_array_foreach(json_object_get(v, "replicas"), k, r)
			assert_true(json_is_true(json_object_get(r, "digest_ok")));
	}
	json_decref(j);
	snprintf(report, sizeof(report), "%s/run/publisher.log", dir);
	assert_true(file_has(report, "version 2: an anchor after all: a parcel changed too much"));
	assert_true(file_has(report, "(no delta tried for the next 1 versions)"));
	/* Not tried again at once: a delta that did not pay costs its encode. */
	assert_true(file_has(report, "version 3: an anchor: the last delta tried did not pay "
				     "(0 more anchors before the next try)"));
	tu_rmtree(dir);
}

/* One of a published version's phases in the tracker's report of it
 * (timeline.publish.phases_ms): its ms, or -1 when it is not there. */
static json_int_t phase_ms(json_t *pub, const char *name)
{
	size_t i;
	json_t *e;

	json_array_foreach(json_object_get(pub, "phases_ms"), i, e)
		if (strcmp(json_string_value(json_array_get(e, 0)), name) == 0)
			return json_integer_value(json_array_get(e, 1));
	return -1;
}

/* Its phases add up to its total. */
static void phases_add_up(json_t *pub)
{
	json_int_t sum = 0;
	size_t i;
	json_t *e;

	assert_non_null(pub);
	json_array_foreach(json_object_get(pub, "phases_ms"), i, e)
		sum += json_integer_value(json_array_get(e, 1));
	assert_int_equal(sum, json_integer_value(json_object_get(pub, "total_ms")));
}

/*
 * A delta that cannot pay is not encoded to the end: v3's bytes are noise
 * (an update that changes the whole model), so its delta's output passes
 * TESSERA_DELTA_MAX_PERCENT (the default 50 %) of the anchor about half way
 * through its input, and every parcel's encode stops there; the version
 * goes as an anchor, and the publisher's line and the report the tracker
 * got with the offer (the version's timeline) say it was tried, discarded,
 * stopped early, where and why, its phases adding up to the total. v2, a
 * delta that pays, says kept. Counted in bytes encoded, never in time.
 */
static void test_delta_stops_early(void **state)
{
	char dir[256], mdir[300], bin[512], report[512], path[600];
	struct proto_synth_opts o = {.bytes = MODEL_BYTES, .steps = 2, .lr = 1e-6, .seed = 5,
				     .threads = 2};
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(mdir, sizeof(mdir), "%s/model", dir);
	assert_int_equal(mkdir(mdir, 0755), 0);
	assert_int_equal(proto_synth_run(mdir, &o, NULL, NULL, &err), 0);
	/* The last step's tensors become noise: every byte after the header. */
	snprintf(path, sizeof(path), "%s/v2.safetensors", mdir);
	assert_int_equal(proto_read_file(path, 64 << 20, &buf, &len, &err), 0);
	uint64_t hlen = 0, x = 0x2545f4914f6cdd1dull;
	memcpy(&hlen, buf, 8);
	assert_true(8 + hlen < len);
	for (size_t i = 8 + hlen; i < len; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		buf[i] = (uint8_t)(x >> 24);
	}
	FILE *fp = fopen(path, "wb");
	assert_non_null(fp);
	assert_int_equal(fwrite(buf, 1, len, fp), len);
	assert_int_equal(fclose(fp), 0);
	free(buf);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(report, sizeof(report), "%s/report.json", dir);
	/* Chunks of 2^16 elements: the encodes stop within a few of the
	 * budget whatever the model's tensor sizes. */
	assert_int_equal(tu_sh("TESSERA_DELTA_CHUNK=65536 %s cluster --model-dir %s --versions 3 "
			       "--replica tp2 --replica tp1 --keep %s/run --report %s > %s/out 2>&1 "
			       "|| cat %s/out",
			       bin, mdir, dir, report, dir, dir),
			 0);
	json_t *vs, *j = cluster_report(report, 3, &vs);
	static const char *kinds[] = {"anchor", "delta", "anchor"};
	for (size_t i = 0; i < 3; i++) {
		json_t *v = json_array_get(vs, i), *r;
		size_t k;
		assert_string_equal(json_string_value(json_object_get(v, "kind")), kinds[i]);
		json_array_foreach(json_object_get(v, "replicas"), k, r)
			assert_true(json_is_true(json_object_get(r, "digest_ok")));
		phases_add_up(json_object_get(json_object_get(v, "timeline"), "publish"));
	}
	/* v1: an anchor, no delta tried. */
	json_t *p1 = json_object_get(json_object_get(json_array_get(vs, 0), "timeline"), "publish");
	assert_null(json_object_get(p1, "delta"));
	assert_true(phase_ms(p1, "snapshot") >= 0 && phase_ms(p1, "gather+hash") >= 0);
	assert_true(phase_ms(p1, "sign") >= 0 && phase_ms(p1, "publish") >= 0);
	/* v2: a delta kept, encoded whole; nothing gathered after it. */
	json_t *p2 = json_object_get(json_object_get(json_array_get(vs, 1), "timeline"), "publish");
	json_t *d2 = json_object_get(p2, "delta");
	assert_true(json_is_true(json_object_get(d2, "tried")));
	assert_true(json_is_true(json_object_get(d2, "kept")));
	assert_true(json_is_false(json_object_get(d2, "stopped_early")));
	assert_true(json_real_value(json_object_get(d2, "percent")) < 10.0);
	assert_int_equal(json_integer_value(json_object_get(d2, "encode_ms")),
			 phase_ms(p2, "delta encode"));
	assert_int_equal(phase_ms(p2, "gather+hash"), -1);
	/* v3: tried, stopped at the budget and discarded: gathered as an
	 * anchor after it. */
	json_t *p3 = json_object_get(json_object_get(json_array_get(vs, 2), "timeline"), "publish");
	json_t *d3 = json_object_get(p3, "delta");
	assert_true(json_is_true(json_object_get(d3, "tried")));
	assert_true(json_is_false(json_object_get(d3, "kept")));
	assert_true(json_is_true(json_object_get(d3, "stopped_early")));
	double pct = json_real_value(json_object_get(d3, "percent"));
	assert_true(pct >= 50.0 && pct < 60.0);
	assert_true(phase_ms(p3, "delta encode") >= 0 && phase_ms(p3, "gather+hash") >= 0);
	const char *why = json_string_value(json_object_get(d3, "why"));
	assert_non_null(why);
	assert_non_null(strstr(why, "its output passed 50 % of the anchor after encoding "));
	/* ... about half of its input: noise codes to about its own size. */
	const char *at = strrchr(why, '(');
	assert_non_null(at);
	int in_pct = atoi(at + 1);
	assert_true(in_pct >= 40 && in_pct <= 70);
	json_decref(j);
	/* The publisher's line names every phase and what became of the delta. */
	snprintf(path, sizeof(path), "%s/run/publisher.log", dir);
	assert_true(file_has(path, "published v2 delta "));
	assert_true(file_has(path, ": kept, it is "));
	assert_true(file_has(path, "published v3 anchor "));
	assert_true(file_has(path, ": discarded (stopped early), its output passed 50 % of the "
				   "anchor after encoding "));
	assert_true(file_has(path, "gather+hash "));
	assert_true(file_has(path, ", offer "));
	tu_rmtree(dir);
}

/* ---- one node, one publisher, driven step by step -------------------------- */

struct env {
	char dir[256], url[256], sock[512], expose[512], model[512], mdir[512], key[512],
		pub[512];
	struct node_proc tracker, node, publisher;
	struct node_proc late; /* replica B, when a test starts it */
	struct node_proc peer; /* replica C (tp2), when the setup starts it */
	struct trk_client *trk;
	struct proto_ckpt ck; /* v0, for the model */
	struct proto_layout tp1, tp2; /* tp2: when the setup starts replica C */
	int nodes_started;
};

/* The publisher's --anchor-every (a setup may change it). */
static char anchor_every[8] = "10";

static void start_publisher(struct env *e)
{
	char bin[512], log[600];
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	unlink(e->sock);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--model-dir", e->mdir,
			"--layout", "fsdp2", "--control", e->sock, "--anchor-every", anchor_every, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
}

/* Replica rep's attach socket (serving processes pin versions there). */
static void attach_path(const struct env *e, const char *rep, char *out, size_t n)
{
	snprintf(out, n, "%s/%s0.sock", e->dir, rep);
}

/* The ranks `ranks` ("0-1") of replica `replica` in layout `layout`, in
 * one process, each with its attach socket in the test's directory; NULL
 * ranks: rank 0 alone, its socket at attach_path. */
static void start_node_ranks(struct env *e, struct node_proc *proc, const char *replica,
			     const char *layout, const char *ranks)
{
	char bin[512], log[600], rep[64], att[600], lay[32], rk[16];
	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node-%d.log", e->dir, e->nodes_started++);
	snprintf(rep, sizeof(rep), "%s", replica);
	snprintf(lay, sizeof(lay), "%s", layout);
	snprintf(rk, sizeof(rk), "%s", ranks != NULL ? ranks : "0");
	if (ranks != NULL)
		snprintf(att, sizeof(att), "%s/", e->dir);
	else
		attach_path(e, replica, att, sizeof(att));
	char *argv[] = {bin, "--tracker", e->url, "--replica", rep, ranks != NULL ? "--ranks" : "--rank",
			rk, "--layout", lay, "--model", e->model, "--trainer-pubkey", e->pub, "--expose",
			e->expose, "--store", "host", "--attach", att, NULL};
	assert_int_equal(node_proc_spawn(proc, "node", argv, log), 0);
}

/* Rank 0 of replica `replica` in a one-rank layout (tp1 unless a test
 * wants another). */
static void start_node_in(struct env *e, struct node_proc *proc, const char *replica,
			  const char *layout)
{
	start_node_ranks(e, proc, replica, layout, NULL);
}

static void start_node_as(struct env *e, struct node_proc *proc, const char *replica)
{
	start_node_in(e, proc, replica, "tp1");
}

static void start_node(struct env *e)
{
	start_node_as(e, &e->node, "A");
}

/* Exports the next version; asserts its number and kind. */
static void export_one(struct env *e, uint64_t v, const char *kind)
{
	char line[512], want[64];

	tu_control(e->sock, "export\n", line, sizeof(line));
	snprintf(want, sizeof(want), "published %llu ", (unsigned long long)v);
	assert_int_equal(strncmp(line, want, strlen(want)), 0);
	if (strstr(line, kind) == NULL)
		fail_msg("v%llu: want %s, the publisher said: %s", (unsigned long long)v, kind, line);
}

/* How the tracker says rank 0 of replica rep got the version it last
 * reported. */
static bool replica_how(struct env *e, const char *rep, const char *how)
{
	struct trk_reply r;
	char path[128];
	bool ok = false;
	snprintf(path, sizeof(path), TRK_API "/replicas/%s", rep);
	if (trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r) == 0 &&
	    r.status == 200) {
		json_t *rk = json_array_get(json_object_get(r.json, "ranks"), 0);
		const char *h = json_string_value(json_object_get(rk, "how"));
		ok = h != NULL && strcmp(h, how) == 0;
	}
	trk_reply_fini(&r);
	return ok;
}

static bool rank_how(struct env *e, const char *how)
{
	return replica_how(e, "A", how);
}

static bool file_has(const char *path, const char *s)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	bool found;

	if (proto_read_file(path, 64 << 20, &buf, &len, &err) != 0)
		return false;
	found = memmem(buf, len, s, strlen(s)) != NULL;
	free(buf);
	return found;
}

/* How many times s is in the file at path. */
static int file_count(const char *path, const char *s)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	int n = 0;

	if (proto_read_file(path, 64 << 20, &buf, &len, &err) != 0)
		return 0;
	for (const uint8_t *at = buf; (at = memmem(at, len - (size_t)(at - buf), s, strlen(s))) != NULL;
	     at += strlen(s))
		n++;
	free(buf);
	return n;
}

/* The first line of path holding s also holds t. */
static bool line_has(const char *path, const char *s, const char *t)
{
	uint8_t *buf;
	size_t len;
	struct proto_err err;
	bool found = false;

	if (proto_read_file(path, 64 << 20, &buf, &len, &err) != 0)
		return false;
	const uint8_t *at = memmem(buf, len, s, strlen(s));
	if (at != NULL) {
		const uint8_t *end = memchr(at, '\n', len - (size_t)(at - buf));
		size_t n = end != NULL ? (size_t)(end - at) : len - (size_t)(at - buf);
		found = memmem(at, n, t, strlen(t)) != NULL;
	}
	free(buf);
	return found;
}

static bool wait_log_of(const struct node_proc *proc, const char *s, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		if (file_has(proc->log, s))
			return true;
		usleep(50000);
	}
	return false;
}

static bool wait_log(struct env *e, const char *s, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		if (file_has(e->node.log, s))
			return true;
		usleep(50000);
	}
	return false;
}

/* The tracker passes a node's request for an anchor on. */
static bool wait_anchor_wanted(struct env *e, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		struct trk_reply r;
		bool want = false;
		if (trk_client_call(e->trk, "GET", TRK_API "/versions", NULL, NULL, 0, &r) == 0 &&
		    r.status == 200)
			want = json_is_true(json_object_get(r.json, "anchor_wanted"));
		trk_reply_fini(&r);
		if (want)
			return true;
		usleep(50000);
	}
	return false;
}

static void ck_fill(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct proto_ckpt *ck = arg;
	size_t es = proto_dtype_size(ck->model.tensors[t].dtype);
	memcpy(out, proto_ckpt_tensor(ck, t) + first * es, count * es);
}

/* Maps the n-byte slot replica rep's node serves (writable when corrupt
 * is set). */
static uint8_t *map_slot(struct env *e, const char *rep, uint64_t v, size_t n, bool writable)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/%s-0.json", e->expose, rep);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	int fd = open(json_string_value(json_object_get(j, "memfd_path")), writable ? O_RDWR : O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	close(fd);
	json_decref(j);
	return m;
}

static uint8_t *map_served_of(struct env *e, const char *rep, uint64_t v, bool writable)
{
	return map_slot(e, rep, v, e->tp1.ranks[0].nbytes, writable);
}

static uint8_t *map_served(struct env *e, uint64_t v, bool writable)
{
	return map_served_of(e, "A", v, writable);
}

/* Version v's bytes for rank 0 of layout l (v is file v<v-1>); the
 * caller frees. */
static uint8_t *expect_in(struct env *e, const struct proto_layout *l, uint64_t v)
{
	char path[600];
	struct proto_ckpt ck;
	struct proto_err err;
	uint8_t *expect = malloc(l->ranks[0].nbytes + 1);

	assert_non_null(expect);
	snprintf(path, sizeof(path), "%s/v%llu.safetensors", e->mdir, (unsigned long long)v - 1);
	assert_int_equal(proto_ckpt_open(path, &ck, &err), 0);
	proto_layout_fill_rank(&ck.model, l, 0, ck_fill, &ck, expect);
	proto_ckpt_fini(&ck);
	return expect;
}

static uint8_t *expect_bytes(struct env *e, uint64_t v)
{
	return expect_in(e, &e->tp1, v);
}

/* Replica rep's node (rank 0 of layout l) serves exactly version v's bytes. */
static void check_serving_in(struct env *e, const char *rep, const struct proto_layout *l,
			     uint64_t v)
{
	size_t n = l->ranks[0].nbytes;
	uint8_t *expect = expect_in(e, l, v), *m = map_slot(e, rep, v, n, false);

	assert_memory_equal(m, expect, n);
	free(expect);
	munmap(m, n);
}

static void check_serving_of(struct env *e, const char *rep, uint64_t v)
{
	check_serving_in(e, rep, &e->tp1, v);
}

static void check_serving(struct env *e, uint64_t v)
{
	check_serving_of(e, "A", v);
}

/* env_setup stops after the anchor v1 (the node logging at debug). */
static bool setup_anchor_only;
/* env_setup also starts replica C, tp2 (ranks 0-1 in one process), before
 * the first version, so that every version lists its layout. */
static bool setup_tp2;

static int env_setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	char path[600], buf[512], state_dir[600];
	struct proto_err err;

	*state = e;
	if (e == NULL)
		return 1;
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	/* (A replica stopped for a while keeps its lease where a test
	 * starts one of tp2.) */
	setenv("TESSERA_LEASE_MS", setup_tp2 ? "30000" : "2000", 1);
	/* The node's rebuild lines (and, after an anchor only, when its
	 * slot's checksums are summed). */
	setenv("TESSERA_LOG", setup_anchor_only ? "debug" : "info", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->sock, sizeof(e->sock), "%s/ctl.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->mdir, sizeof(e->mdir), "%s/synth", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	snprintf(e->key, sizeof(e->key), "%s", tu_data(buf, sizeof(buf), "test-trainer.key"));
	snprintf(e->pub, sizeof(e->pub), "%s", tu_data(buf, sizeof(buf), "test-trainer.pub"));
	mkdir(e->expose, 0755);
	synth(e->mdir);
	snprintf(path, sizeof(path), "%s/v0.safetensors", e->mdir);
	assert_int_equal(proto_ckpt_open(path, &e->ck, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->ck.model, "tp1", &e->tp1, &err), 0);
	tu_write_model(&e->ck.model, e->model);
	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	start_node(e);
	if (setup_tp2) {
		assert_int_equal(proto_layout_builtin(&e->ck.model, "tp2", &e->tp2, &err), 0);
		start_node_ranks(e, &e->peer, "C", "tp2", "0-1");
	}
	start_publisher(e);
	/* Nodes register once the publisher has; v1 lists the layouts of
	 * those registered when it is exported. */
	if (setup_tp2)
		assert_true(tu_wait_alive(e->trk, "A", 1, 30000) && tu_wait_alive(e->trk, "C", 2, 30000));
	/* v1 is an anchor, v2 a delta the node rebuilds. */
	export_one(e, 1, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 1, 60000));
	check_serving(e, 1);
	if (setup_anchor_only)
		return 0;
	export_one(e, 2, "delta");
	assert_true(tu_wait_active(e->trk, "A", 2, 60000));
	assert_true(rank_how(e, "delta"));
	check_serving(e, 2);
	return 0;
}

/* Runs even when the test failed: no child outlives it. */
static int env_teardown(void **state)
{
	struct env *e = *state;
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->late, 5000);
	node_proc_stop(&e->peer, 5000);
	node_proc_stop(&e->node, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	proto_layout_fini(&e->tp1);
	proto_layout_fini(&e->tp2);
	proto_ckpt_fini(&e->ck);
	if (e->dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_LEASE_MS");
	unsetenv("TESSERA_LOG");
	/* what the variants below set: unset whether or not one did */
	unsetenv("TESSERA_DELTA_STANDBY_MS");
	unsetenv("TESSERA_DELTA_ROTATE");
	unsetenv("TESSERA_DELTA_SCRUB");
	unsetenv("TESSERA_TEST_CATCHUP_HOLD");
	unsetenv("TESSERA_TEST_STANDBY_BUSY");
	unsetenv("TESSERA_PUB_RETAIN");
	setup_anchor_only = false;
	setup_tp2 = false;
	snprintf(anchor_every, sizeof(anchor_every), "10");
	free(e);
	return 0;
}

/* The node builds the next delta on a copy of its served slot made when
 * the delta comes: no standby copy made before, no rotation (either builds
 * on bytes a stray write to the served slot cannot reach). */
static int env_setup_no_standby(void **state)
{
	setenv("TESSERA_DELTA_STANDBY_MS", "3600000", 1);
	setenv("TESSERA_DELTA_ROTATE", "0", 1);
	return env_setup(state);
}

/* The first byte where versions v and v + 1 differ on rank 0. */
static size_t first_change(struct env *e, uint64_t v)
{
	size_t n = e->tp1.ranks[0].nbytes, at = 0;
	uint8_t *a = expect_bytes(e, v), *b = expect_bytes(e, v + 1);

	while (at < n && a[at] == b[at])
		at++;
	assert_true(at < n);
	free(a);
	free(b);
	return at;
}

/* A byte of the served v flips where the delta v + 1 writes: the node
 * refuses v + 1 before activating it, keeps serving v and asks for an
 * anchor; the publisher's v + 2 is one, and the node activates it. */
static void refused_then_anchor(struct env *e, uint64_t v)
{
	size_t n = e->tp1.ranks[0].nbytes;
	uint8_t *m = map_served(e, v, true);

	m[first_change(e, v)] ^= 0x40;
	munmap(m, n);
	export_one(e, v + 1, "delta");
	assert_true(wait_log(e, "the parent differs where the delta writes", 30000));
	assert_true(wait_log(e, "asking for an anchor", 30000));
	assert_int_equal(tu_replica_active(e->trk, "A"), v);
	/* The request reached the publisher: v + 2 is an anchor. */
	assert_true(wait_anchor_wanted(e, 30000));
	export_one(e, v + 2, "anchor");
	assert_true(tu_wait_active(e->trk, "A", v + 2, 60000));
}

/* A byte of the served parent flips (as a stray write by a serving process
 * would) at a position the next delta changes. The node keeps v2's piece
 * checksums (from the apply that built it), so v3's apply reads only the
 * changed positions: the parent's old elements there do not sum to the
 * delta's touched checksums, so the node refuses v3 before activating it,
 * keeps serving v2 and asks for an anchor; the publisher's next version is
 * one, and the deltas after it are reached bit-exact. */
static void test_corrupted_parent(void **state)
{
	struct env *e = *state;

	refused_then_anchor(e, 2);
	assert_true(rank_how(e, "full"));
	check_serving(e, 4);
	/* The chain goes on with deltas. */
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	check_serving(e, 5);
}

/* The first delta after an anchor. The node sums the anchor's slot once,
 * off the delta's way (through its memfd), and keeps the sums: the
 * delta's apply reads the changed positions only. A byte of the served
 * anchor flipped where that delta writes is caught by its touched
 * checksums against those sums: v2 is refused before activation and v1
 * kept; the anchor v3 and the delta v4 after it, built from sums kept the
 * same way, are bit-exact. (No standby copy and no rotation: the delta is
 * built on a copy of the damaged slot made when it comes.) */
static void test_first_delta_after_anchor(void **state)
{
	struct env *e = *state;

	assert_true(wait_log(e, "the piece checksums of v1's slot summed in", 30000));
	refused_then_anchor(e, 1);
	/* The copy went into the second slot the node made at start. */
	assert_true(file_has(e->node.log, "v1 is copied into the second slot made at start"));
	check_serving(e, 3);
	assert_true(wait_log(e, "the piece checksums of v3's slot summed in", 30000));
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	check_serving(e, 4);
	assert_true(line_has(e->node.log, "v4 rebuilt from v3 by delta",
			     "parent checksums kept (sparse"));
}

static int env_setup_anchor(void **state)
{
	setup_anchor_only = true;
	return env_setup_no_standby(state);
}

/* A byte of the served slot flips where the next delta does not write:
 * no check of the changed positions can see it, and v3 is built on it.
 * The scrub (here TESSERA_DELTA_SCRUB=1: the whole slot after every
 * activation) finds v3's slot damaged and drops its checksums, so v4's
 * apply reads its parent whole, refuses it and asks for an anchor; v5 is
 * one and v6's delta is reached bit-exact. */
static void test_scrub(void **state)
{
	struct env *e = *state;
	size_t n = e->tp1.ranks[0].nbytes, at = n / 2;
	uint8_t *m = map_served(e, 2, true);
	uint8_t *v2 = expect_bytes(e, 2), *v3 = expect_bytes(e, 3), *v4 = expect_bytes(e, 4);

	while (v2[at] != v3[at] || v3[at] != v4[at]) /* unchanged by v3 and v4 */
		at++;
	free(v2);
	free(v3);
	free(v4);
	m[at] ^= 0x40;
	munmap(m, n);
	export_one(e, 3, "delta");
	assert_true(wait_log(e, "scrub: the slot of v3 is damaged", 60000));
	export_one(e, 4, "delta");
	assert_true(wait_log(e, "delta is for another parent", 30000));
	assert_true(wait_log(e, "asking for an anchor", 30000));
	assert_int_equal(tu_replica_active(e->trk, "A"), 3);
	assert_true(wait_anchor_wanted(e, 30000));
	export_one(e, 5, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	check_serving(e, 5);
	export_one(e, 6, "delta");
	assert_true(tu_wait_active(e->trk, "A", 6, 60000));
	check_serving(e, 6);
}

static int env_setup_scrub(void **state)
{
	setenv("TESSERA_DELTA_SCRUB", "1", 1);
	return env_setup_no_standby(state);
}

/* A node restarted between two deltas holds no parent: it replays the
 * chain (the anchor v1, then v2's delta onto it), says so, and activates
 * v2 bit-exact; then deltas again. */
static void test_node_restarted(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->node, 5000);
	start_node(e);
	assert_true(wait_log(e, "this node holds no version: looking for the chain", 30000));
	assert_true(wait_log(e, "replaying the chain to v2: the anchor v1, then 1 delta", 30000));
	/* The replica served v2 before: the restarted node's activation is
	 * seen in its log (the activation record is written by then). */
	assert_true(wait_log(e, "v2 active", 60000));
	assert_true(rank_how(e, "chain"));
	assert_int_equal(tu_replica_active(e->trk, "A"), 2);
	check_serving(e, 2);
	assert_true(wait_log(e, "copying v2 into a standby slot", 30000));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(rank_how(e, "delta"));
	check_serving(e, 3);
}

/* A node that missed versions (stopped while v3 and v4 went out) holds v2,
 * but v4's delta is against v3: it replays the chain from its active v2
 * (v3's delta, then v4's), serving v2 meanwhile, and activates v4; then
 * v5's delta starts from its standby copy of v4. */
static void test_missed_version(void **state)
{
	struct env *e = *state;

	assert_int_equal(kill(e->node.pid, SIGSTOP), 0);
	export_one(e, 3, "delta");
	export_one(e, 4, "delta");
	assert_int_equal(kill(e->node.pid, SIGCONT), 0);
	assert_true(wait_log(e, "v4 is a delta against v3, but this node holds v2", 30000));
	assert_true(wait_log(e, "replaying the chain to v4: from the active v2, then 2 deltas", 30000));
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	assert_true(rank_how(e, "chain"));
	check_serving(e, 4);
	assert_true(wait_log(e, "copying v4 into a standby slot", 30000));
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	assert_true(rank_how(e, "delta"));
	assert_true(wait_log(e, "v5 rebuilt from v4 by delta", 30000));
	assert_true(line_has(e->node.log, "v5 rebuilt from v4 by delta", "(the standby one)"));
	check_serving(e, 5);
}

/* Versions anchor (v1), delta (v2), delta (v3); replica B, of A's layout,
 * joins after the last one and may not fetch a version whole
 * (TESSERA_CHAIN_FULL=0): it replays the chain (v1 whole, then v2's and
 * v3's deltas, each onto the step before) and activates v3 bit-exact; the
 * tracker shows it built v3 by chain, with what every step took. */
static void test_chain_replay(void **state)
{
	struct env *e = *state;

	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	setenv("TESSERA_CHAIN_FULL", "0", 1);
	start_node_as(e, &e->late, "B");
	unsetenv("TESSERA_CHAIN_FULL");
	assert_true(tu_wait_active(e->trk, "B", 3, 60000));
	assert_true(replica_how(e, "B", "chain"));
	assert_true(wait_log_of(&e->late, "replaying the chain to v3: the anchor v1, then 2 deltas",
				30000));
	assert_true(wait_log_of(&e->late, "chain step v2 of 3 built (by delta from the step before",
				30000));
	check_serving_of(e, "B", 3);
	check_serving(e, 3);
	/* Its bytes: the anchor's and the two deltas', more than v3's delta. */
	struct trk_reply r;
	assert_int_equal(trk_client_call(e->trk, "GET", TRK_API "/replicas/B", NULL, NULL, 0, &r), 0);
	json_t *rk = json_array_get(json_object_get(r.json, "ranks"), 0);
	assert_true((size_t)json_integer_value(json_object_get(rk, "bytes_done")) >
		    e->tp1.ranks[0].nbytes);
	trk_reply_fini(&r);
	/* The versions of the chain are listed as kept whole. */
	assert_int_equal(trk_client_call(e->trk, "GET", TRK_API "/versions", NULL, NULL, 0, &r), 0);
	json_t *v1 = json_array_get(json_object_get(r.json, "versions"), 0);
	assert_int_equal(json_integer_value(json_object_get(v1, "version")), 1);
	assert_true(json_is_true(json_object_get(v1, "chain")));
	assert_true(json_is_true(json_object_get(v1, "retain")));
	trk_reply_fini(&r);
}

/* Rank 0 of replica rep as /replicas/rep shows it: field's value. */
static json_int_t rank_field(struct env *e, const char *rep, const char *field)
{
	struct trk_reply r;
	char path[128];
	json_int_t v;

	snprintf(path, sizeof(path), TRK_API "/replicas/%s", rep);
	assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
	v = json_integer_value(json_object_get(json_array_get(json_object_get(r.json, "ranks"), 0),
					       field));
	trk_reply_fini(&r);
	return v;
}

/* Versions anchor (v1), then deltas v2..v4; replica B, of A's layout,
 * joins after the last one. The chain (v1 whole and three deltas) costs
 * more than v4 whole, and A holds v4 complete: B says so in one line, gets
 * the raw copy of its layout signed by the publisher, reads every chunk
 * from A's slot (none from the trainer), each hashed against the copy, and
 * activates v4 bit-exact; the tracker shows it built v4 full. The next
 * delta is built on it by delta like on A. */
static void test_full_from_peers(void **state)
{
	struct env *e = *state;
	size_t n = e->tp1.ranks[0].nbytes;

	export_one(e, 3, "delta");
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	start_node_as(e, &e->late, "B");
	assert_true(tu_wait_active(e->trk, "B", 4, 60000));
	assert_true(replica_how(e, "B", "full"));
	assert_true(wait_log_of(&e->late, "v4 without its parent: fetching it whole from 1 holder",
				30000));
	assert_true(line_has(e->late.log, "v4 without its parent", "cheaper than the chain (the "
				      "anchor v1, then 3 deltas"));
	assert_true(wait_log_of(&e->late, "its signed raw copy of our layout is in", 30000));
	assert_true(wait_log_of(&e->publisher, "a raw copy of layout", 30000));
	check_serving_of(e, "B", 4);
	assert_int_equal(rank_field(e, "B", "bytes_from_trainer"), 0);
	assert_int_equal(rank_field(e, "B", "bytes_done"), (json_int_t)n);
	assert_true(rank_field(e, "B", "bytes_from_peers") >= (json_int_t)n);
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "B", 5, 60000));
	assert_true(replica_how(e, "B", "delta"));
	check_serving_of(e, "B", 5);
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	check_serving(e, 5);
}

/* A late replica B whose chain is longer than it may replay
 * (TESSERA_CHAIN_MAX=2: v1, v2, v3) has no chain; A holds v3 complete, so
 * B fetches it whole instead of asking for an anchor, and says why. */
static void test_full_no_chain(void **state)
{
	struct env *e = *state;

	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	setenv("TESSERA_CHAIN_MAX", "2", 1);
	start_node_as(e, &e->late, "B");
	unsetenv("TESSERA_CHAIN_MAX");
	assert_true(tu_wait_active(e->trk, "B", 3, 60000));
	assert_true(replica_how(e, "B", "full"));
	assert_true(wait_log_of(&e->late, "v3 without its parent and no chain to replay (no anchor "
				"within 2 versions", 30000));
	assert_false(file_has(e->late.log, "asking for an anchor"));
	check_serving_of(e, "B", 3);
}

/* The same late replica B, but A serves its slot with a byte in every 4 KiB
 * flipped (test hook, as a lying peer would): B's chunks read from A fail
 * the raw copy's hashes, A is banned, no holder is left, and B refuses the
 * whole fetch, says so and replays the chain instead, ending bit-exact. */
static void test_full_liar(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->node, 5000);
	setenv("TESSERA_TEST_CORRUPT_SERVE", "1", 1);
	start_node(e);
	unsetenv("TESSERA_TEST_CORRUPT_SERVE");
	assert_true(wait_log(e, "v2 active", 60000));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	start_node_as(e, &e->late, "B");
	assert_true(wait_log_of(&e->late, "v3 without its parent: fetching it whole", 30000));
	assert_true(wait_log_of(&e->late, "no replica left to read v3 whole from", 60000));
	assert_true(wait_log_of(&e->late, "replaying the chain to v3", 60000));
	assert_true(tu_wait_active(e->trk, "B", 3, 60000));
	assert_true(replica_how(e, "B", "chain"));
	check_serving_of(e, "B", 3);
}

/* The same late replica, but the middle step's delta arrives damaged (test
 * hook, after its hashes verified, as a wrong delta would): the step's
 * checksum check refuses it, B says so, serves nothing meanwhile and asks
 * for an anchor; the next version is one, and B activates it. */
static void test_chain_corrupt(void **state)
{
	struct env *e = *state;

	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	setenv("TESSERA_TEST_CORRUPT_CHAIN", "2", 1);
	setenv("TESSERA_CHAIN_FULL", "0", 1);
	start_node_as(e, &e->late, "B");
	unsetenv("TESSERA_TEST_CORRUPT_CHAIN");
	unsetenv("TESSERA_CHAIN_FULL");
	assert_true(wait_log_of(&e->late, "replaying the chain to v3", 30000));
	assert_true(wait_log_of(&e->late, "v2 refused: delta parcel", 30000));
	assert_true(wait_log_of(&e->late, "asking for an anchor", 30000));
	assert_int_equal(tu_replica_active(e->trk, "B"), 0);
	assert_true(wait_anchor_wanted(e, 30000));
	export_one(e, 4, "anchor");
	assert_true(tu_wait_active(e->trk, "B", 4, 60000));
	assert_true(replica_how(e, "B", "full"));
	check_serving_of(e, "B", 4);
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	check_serving(e, 4);
}

/* Waits until the tracker lists version v as dropped (no live publisher
 * offers it). */
static bool wait_dropped(struct env *e, uint64_t v, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		json_t *j = tu_get_json(e->trk, TRK_API "/versions"), *x;
		size_t i;
		bool dropped = false;
		json_array_foreach(j != NULL ? json_object_get(j, "versions") : NULL, i, x)
			dropped |= json_integer_value(json_object_get(x, "version")) == (json_int_t)v &&
				   json_is_true(json_object_get(x, "dropped"));
		json_decref(j);
		if (dropped)
			return true;
		usleep(50000);
	}
	return false;
}

/* Anchors every 5 versions (v1, v6), the publisher serving at most 2
 * versions besides the latest's chain (TESSERA_PUB_RETAIN), replicas A
 * (tp1) and C (tp2) from the start. A late tp2 replica B (two ranks, one
 * process) may not fetch a version whole (TESSERA_CHAIN_FULL=0): it plans
 * the chain to v5 (the anchor v1, then 4 deltas) and its first step waits
 * for v6 (TESSERA_TEST_CHAIN_HOLD=6). B is stopped while the anchor v6 is
 * published: v1..v4 are then out of the latest's chain and no replica's
 * target, and the publisher withdraws them; B goes on only then, so that
 * the step it starts has no source left. B finds its chain withdrawn,
 * plans v5 again, refuses it without asking for an anchor (v6 is one) and
 * moves on with its replica: it activates v6, then v7 by delta,
 * bit-exact. The time from B's going on to B active on v6 is printed. */
static void test_chain_withdrawn(void **state)
{
	struct env *e = *state;

	for (uint64_t v = 3; v <= 5; v++)
		export_one(e, v, "delta");
	assert_true(tu_wait_active(e->trk, "C", 5, 60000));
	setenv("TESSERA_CHAIN_FULL", "0", 1);
	setenv("TESSERA_TEST_CHAIN_HOLD", "6", 1);
	start_node_ranks(e, &e->late, "B", "tp2", "0-1");
	unsetenv("TESSERA_CHAIN_FULL");
	unsetenv("TESSERA_TEST_CHAIN_HOLD");
	for (int w = 0; w < 30000 && file_count(e->late.log, "the chain's first step waits") < 2;
	     w += 50)
		usleep(50000);
	assert_int_equal(file_count(e->late.log, "replaying the chain to v5: the anchor v1, then 4 "
						 "deltas"),
			 2);
	assert_int_equal(kill(e->late.pid, SIGSTOP), 0);
	export_one(e, 6, "anchor");
	bool dropped = wait_dropped(e, 1, 30000);
	assert_int_equal(kill(e->late.pid, SIGCONT), 0);
	assert_true(dropped);
	uint64_t t0 = proto_wall_ms();
	assert_true(tu_wait_active(e->trk, "B", 6, 60000));
	uint64_t recovered = proto_wall_ms() - t0;
	assert_true(file_has(e->late.log, "v1 of the chain to v5 is withdrawn"));
	assert_true(file_has(e->late.log, "the anchor v6 is out: the replica moves on"));
	assert_false(file_has(e->late.log, "asking for an anchor"));
	check_serving_in(e, "B", &e->tp2, 6);
	export_one(e, 7, "delta");
	assert_true(tu_wait_active(e->trk, "B", 7, 60000));
	assert_true(replica_how(e, "B", "delta"));
	check_serving_in(e, "B", &e->tp2, 7);
	assert_true(tu_wait_active(e->trk, "C", 7, 60000));
	check_serving_in(e, "C", &e->tp2, 7);
	print_message("late replica B: active on the anchor v6 %llu ms after it went on\n",
		      (unsigned long long)recovered);
}

static int env_setup_withdrawn(void **state)
{
	setenv("TESSERA_PUB_RETAIN", "2", 1);
	snprintf(anchor_every, sizeof(anchor_every), "5");
	setup_tp2 = true;
	return env_setup(state);
}

/* A publisher restarted without its parent export publishes an anchor. */
static void test_publisher_restarted(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->publisher, 5000);
	start_publisher(e);
	export_one(e, 3, "anchor");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	check_serving(e, 3);
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	check_serving(e, 4);
}

/* `--every` over a model dir: once its last version is out, the publisher
 * says so once and stops exporting (it asked again every tick, each time
 * failing the same way); it keeps serving what it published. */
static void test_every_model_dir_runs_out(void **state)
{
	struct env *e = *state;
	char bin[512], log[600];

	node_proc_stop(&e->publisher, 5000);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher-every.log", e->dir);
	char *argv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--model-dir", e->mdir,
			"--layout", "fsdp2", "--every", "100", "--anchor-every", "10", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", argv, log), 0);
	/* v3..v7: the files v2..v6; then no v8. */
	assert_true(wait_log_of(&e->publisher, "--every stops here", 60000));
	assert_true(line_has(log, "version 8: the model dir holds only 7 versions", "stops here"));
	assert_true(tu_wait_active(e->trk, "A", 7, 60000));
	check_serving(e, 7);
	/* Ticks go on every 100 ms: 2 s are 20 of them, none exports. */
	for (int w = 0; w < 2000 && file_count(log, "holds only") == 1; w += 50)
		usleep(50000);
	assert_int_equal(file_count(log, "holds only"), 1);
}

/* The publisher took v1's snapshot into blocks it touched before its
 * first export (node__pub_prefault_first), v2's into blocks touched while
 * v1 went out, and v3's on into the blocks the parent before the last gave
 * back (two trainer ranks: two a version), which hold those versions'
 * bytes: every version the node rebuilds from the deltas is bit-exact, so
 * no byte of an older version leaks into a newer one. The node builds each of v3..v5 by
 * rotation, in the slot it retired at the last activation, and says it
 * made no dense copy. */
static void test_recycled_buffers(void **state)
{
	struct env *e = *state;
	char path[600];

	for (uint64_t v = 3; v <= 5; v++) {
		char line[64], how[64], ready[96];
		/* The standby: the slot of v-2 made v-1 (wait for it, so that
		 * the delta does not come before the retired slot is back). */
		snprintf(ready, sizeof(ready), "the slot of v%llu made v%llu by its delta",
			 (unsigned long long)v - 2, (unsigned long long)v - 1);
		assert_true(wait_log(e, ready, 30000));
		export_one(e, v, "delta");
		assert_true(tu_wait_active(e->trk, "A", v, 60000));
		assert_true(rank_how(e, "delta"));
		check_serving(e, v);
		/* Built in the slot of v-2, patched up to v-1 by v-1's delta:
		 * no dense copy. */
		snprintf(line, sizeof(line), "v%llu rebuilt from v%llu by delta", (unsigned long long)v,
			 (unsigned long long)v - 1);
		snprintf(how, sizeof(how), "no dense copy: the slot of v%llu made v%llu again",
			 (unsigned long long)v - 2, (unsigned long long)v - 1);
		assert_true(line_has(e->node.log, line, how));
	}
	snprintf(path, sizeof(path), "%s/publisher.log", e->dir);
	assert_true(file_has(path, "version 1: an anchor: the first version this publisher "
				   "exports (2 of 2 snapshot blocks"));
	assert_true(file_has(path, "version 2: a delta against version 1 (1 since the anchor; 2 of 2 snapshot blocks"));
	assert_true(file_has(path, "version 3: a delta against version 2 (2 since the anchor; 2 of 2 snapshot blocks"));
	assert_true(file_has(path, "version 5: a delta against version 4 (4 since the anchor; 2 of 2 snapshot blocks"));
	assert_true(file_has(path, "version 5: 2 trainer ranks' parcels encoded in"));
	assert_true(file_has(path, "MiB read in place from the snapshots"));
}

/* Replica B of a new layout (fsdp1: one rank, the tensors flat) joins
 * after v2, a delta: it gets v2 whole by an addendum, gathered from v2's
 * snapshot kept as the parent. v3 is then an anchor (the parent export
 * lacks the new layout); v4 and v5 are deltas for two layouts from the
 * same snapshots, which keep their size (one trainer rank's memory each).
 * Both replicas serve every version bit-exact. */
static void test_new_layout_between_deltas(void **state)
{
	struct env *e = *state;
	struct proto_layout fsdp1;
	struct proto_err err;
	char path[600];

	assert_int_equal(proto_layout_builtin(&e->ck.model, "fsdp1", &fsdp1, &err), 0);
	assert_true(memcmp(fsdp1.digest, e->tp1.digest, sizeof(fsdp1.digest)) != 0);
	start_node_in(e, &e->late, "B", "fsdp1");
	assert_true(tu_wait_active(e->trk, "B", 2, 60000));
	check_serving_in(e, "B", &fsdp1, 2);
	export_one(e, 3, "anchor");
	snprintf(path, sizeof(path), "%s/publisher.log", e->dir);
	/* v2's new layout was gathered from v2's snapshots, kept as the parent. */
	assert_true(file_has(path, "version 2: new layouts gathered and hashed in"));
	assert_true(file_has(path, "2 of 2 trainer ranks from the version as served"));
	assert_true(file_has(path, "version 3: an anchor: a serving layout the parent export does "
				   "not have"));
	for (uint64_t v = 3; v <= 5; v++) {
		if (v > 3)
			export_one(e, v, "delta");
		assert_true(tu_wait_active(e->trk, "A", v, 60000));
		assert_true(tu_wait_active(e->trk, "B", v, 60000));
		check_serving(e, v);
		check_serving_in(e, "B", &fsdp1, v);
	}
	assert_true(file_has(path, "version 4: a delta against version 3 (1 since the anchor; 2 of 2 snapshot blocks"));
	assert_true(file_has(path, "version 5: a delta against version 4 (2 since the anchor; 2 of 2 snapshot blocks"));
	proto_layout_fini(&fsdp1);
}

/* Where replica A's node serves v from now: the memfd path of its slot
 * (the node keeps the descriptor while the slot lives). */
static void served_path(struct env *e, uint64_t v, char *out, size_t n)
{
	char path[600];

	snprintf(path, sizeof(path), "%s/A-0.json", e->expose);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	snprintf(out, n, "%s", json_string_value(json_object_get(j, "memfd_path")));
	json_decref(j);
}

/* A byte of the retired v2 slot flips once the node made it v3 again for
 * the next delta (as a stray write into a slot no one serves would), where
 * neither v4's delta nor v5's writes. v4's apply reads only its changed
 * positions and cannot see it: v4 is built on it. The scrub after v4's
 * activation (TESSERA_DELTA_SCRUB=1 here: the whole slot; by default a
 * share, all of it within 8 versions) finds the slot damaged and revokes
 * it: its checksums are dropped, so v5, built by rotation from v3's slot,
 * reads its parent's checksums whole, and is bit-exact. (When the byte
 * flips while the catch-up still runs, the catch-up's own scrub finds it
 * and v4 is built on a copy of v3, bit-exact.) */
static void test_rotation_damaged_slot(void **state)
{
	struct env *e = *state;
	size_t n = e->tp1.ranks[0].nbytes, at = n / 3;
	char v2path[600];
	uint8_t *v3 = expect_bytes(e, 3), *v4 = expect_bytes(e, 4), *v5 = expect_bytes(e, 5);

	while (v3[at] != v4[at] || v4[at] != v5[at])
		at++;
	free(v3);
	free(v4);
	free(v5);
	served_path(e, 2, v2path, sizeof(v2path));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(wait_log(e, "the slot of v2 made v3 by its delta for the next delta", 30000));
	int fd = open(v2path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	close(fd);
	m[at] ^= 0x40;
	munmap(m, n);
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	/* The log line that the catch-up is under way comes before it ends: on
	 * a busy machine the byte may flip while it runs, and then its scrub
	 * finds it and v4 is built on a copy of v3 instead. */
	bool caught_up_damaged = false, scrubbed = false;
	for (int w = 0; w < 30000 && !caught_up_damaged && !scrubbed; w += 50) {
		scrubbed = file_has(e->node.log, "scrub: the slot of v4 is damaged");
		caught_up_damaged = line_has(e->node.log, "v4 rebuilt from v3 by delta",
					     "was not v3 after its delta (scrub: ");
		usleep(50000);
	}
	assert_true(caught_up_damaged || scrubbed);
	if (caught_up_damaged)
		check_serving(e, 4);
	assert_true(wait_log(e, "the slot of v3 made v4 by its delta for the next delta", 30000));
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	if (scrubbed)
		assert_true(line_has(e->node.log, "v5 rebuilt from v4 by delta",
				     "parent checksums read"));
	check_serving(e, 5);
}

/* The catch-up of the retired slot is still scrubbing when the next delta
 * comes (TESSERA_TEST_CATCHUP_HOLD): the scrub gives way at once, the delta
 * is applied on the caught-up slot, and the share it skipped (all of it,
 * K=1) is re-summed after the activation. A byte of the retired v2 slot
 * damaged where no delta writes, which the skipped scrub would have seen,
 * is found there: v4's kept checksums are dropped, and v5 is bit-exact. */
static void test_scrub_gives_way(void **state)
{
	struct env *e = *state;
	size_t n = e->tp1.ranks[0].nbytes, at = n / 3;
	char v2path[600];
	uint8_t *v2 = expect_bytes(e, 2), *v3 = expect_bytes(e, 3), *v4 = expect_bytes(e, 4),
		*v5 = expect_bytes(e, 5);

	while (v2[at] != v3[at] || v3[at] != v4[at] || v4[at] != v5[at])
		at++;
	free(v2);
	free(v3);
	free(v4);
	free(v5);
	served_path(e, 2, v2path, sizeof(v2path));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(wait_log(e, "the scrub of share 1/1 of the slot of v2 gave way to v3's apply", 30000));
	/* Two parcels (fsdp2 to tp1): the one not holding the last chunk was
	 * handed to the apply before it. */
	assert_true(line_has(e->node.log, "v3 rebuilt from v2 by delta",
			     "from 1 of 2 parcels landed before the last chunk"));
	check_serving(e, 3);
	/* v2's slot is being made v3; its scrub waits for v4's apply. */
	assert_true(wait_log(e, "the slot of v2 made v3 by its delta for the next delta", 30000));
	int fd = open(v2path, O_RDWR);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	close(fd);
	m[at] ^= 0x40;
	munmap(m, n);
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	assert_true(wait_log(e, "the scrub of share 1/1 of the slot of v3 gave way to v4's apply", 30000));
	assert_true(line_has(e->node.log, "v4 rebuilt from v3 by delta", "no dense copy"));
	assert_true(wait_log(e, "scrub: the slot of v4 is damaged", 30000));
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	assert_true(line_has(e->node.log, "v5 rebuilt from v4 by delta", "parent checksums read"));
	check_serving(e, 5);
}

static int env_setup_hold(void **state)
{
	setenv("TESSERA_DELTA_SCRUB", "1", 1);
	setenv("TESSERA_TEST_CATCHUP_HOLD", "1", 1);
	return env_setup(state);
}

static int env_setup_scrub1(void **state)
{
	setenv("TESSERA_DELTA_SCRUB", "1", 1);
	return env_setup(state);
}

/* A request pins v2 across v3's activation: the retired v2 slot is not
 * the node's to write, so v4 is built on a copy of v3; the pinned bytes
 * stay v2's throughout. Once released, the rotation comes back. */
static void test_rotation_pinned(void **state)
{
	struct env *e = *state;
	char att[600], why[256];
	tessera_client *c;
	struct tessera_pin pin;
	size_t n = e->tp1.ranks[0].nbytes;

	/* After the anchor v1 there was no retired slot to rotate into: v2's
	 * parent was copied into the second slot the node made at start
	 * (setup checked v2 bit-exact), not into a new one. */
	assert_true(file_has(e->node.log, "v1 is copied into the second slot made at start"));
	attach_path(e, "A", att, sizeof(att));
	assert_int_equal(tessera_attach(att, "A", 0, 30000, &c, why, sizeof(why)), 0);
	assert_int_equal(tessera_wait_version(c, 2, 30000), 0);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 2);
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(wait_log(e, "the slot of v2 is pinned by 1 request: no rotation", 30000));
	assert_true(wait_log(e, "copying v3 into a standby slot", 30000));
	export_one(e, 4, "delta");
	assert_true(tu_wait_active(e->trk, "A", 4, 60000));
	assert_true(line_has(e->node.log, "v4 rebuilt from v3 by delta",
			     "a dense copy of the parent (the standby one)"));
	check_serving(e, 4);
	uint8_t *expect = expect_bytes(e, 2);
	assert_memory_equal(pin.base, expect, n);
	free(expect);
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
	/* v3's slot, retired unpinned, came back: made v4 for v5's delta. */
	assert_true(wait_log(e, "the slot of v3 made v4 by its delta", 30000));
	export_one(e, 5, "delta");
	assert_true(tu_wait_active(e->trk, "A", 5, 60000));
	assert_true(line_has(e->node.log, "v5 rebuilt from v4 by delta", "no dense copy"));
	check_serving(e, 5);
}

/* The standby copy waits while peers read from the node (the first looks
 * are made to find it serving): it is made once they stop, and the next
 * delta starts from it. */
static int env_setup_busy(void **state)
{
	setenv("TESSERA_TEST_STANDBY_BUSY", "3", 1);
	return env_setup(state);
}

/* The node serves for longer than the test: no standby is ever made, and a
 * delta builds its slot when it comes (the retired slot, caught up). */
static int env_setup_busy_long(void **state)
{
	setenv("TESSERA_TEST_STANDBY_BUSY", "1000000", 1);
	return env_setup(state);
}

static void test_standby_waits_for_peers(void **state)
{
	struct env *e = *state;

	assert_true(wait_log(e, "the standby copy of v2 waits until they stop", 30000));
	assert_true(wait_log(e, "the standby copy of v2 goes ahead", 30000));
	assert_true(wait_log(e, "made v2 by its delta for the next delta", 30000));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(wait_log(e, "v3 rebuilt from v2 by delta", 30000));
	assert_true(line_has(e->node.log, "v3 rebuilt from v2 by delta", "(the standby one)"));
	check_serving(e, 3);
}

static void test_standby_never_made(void **state)
{
	struct env *e = *state;

	assert_true(wait_log(e, "the standby copy of v2 waits until they stop", 30000));
	export_one(e, 3, "delta");
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	assert_true(wait_log(e, "v3 rebuilt from v2 by delta", 30000));
	assert_false(line_has(e->node.log, "v3 rebuilt from v2 by delta", "(the standby one)"));
	assert_false(file_has(e->node.log, "the standby copy of v2 goes ahead"));
	check_serving(e, 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_delta_cluster),
		cmocka_unit_test(test_anchor_after_all),
		cmocka_unit_test(test_delta_stops_early),
		cmocka_unit_test_setup_teardown(test_corrupted_parent, env_setup_no_standby,
						env_teardown),
		cmocka_unit_test_setup_teardown(test_first_delta_after_anchor, env_setup_anchor,
						env_teardown),
		cmocka_unit_test_setup_teardown(test_scrub, env_setup_scrub, env_teardown),
		cmocka_unit_test_setup_teardown(test_node_restarted, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_missed_version, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_publisher_restarted, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_every_model_dir_runs_out, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_recycled_buffers, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_new_layout_between_deltas, env_setup,
						env_teardown),
		cmocka_unit_test_setup_teardown(test_rotation_damaged_slot, env_setup_scrub1,
						env_teardown),
		cmocka_unit_test_setup_teardown(test_scrub_gives_way, env_setup_hold, env_teardown),
		cmocka_unit_test_setup_teardown(test_rotation_pinned, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_chain_replay, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_full_from_peers, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_full_liar, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_full_no_chain, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_chain_corrupt, env_setup, env_teardown),
		cmocka_unit_test_setup_teardown(test_chain_withdrawn, env_setup_withdrawn, env_teardown),
		cmocka_unit_test_setup_teardown(test_standby_waits_for_peers, env_setup_busy,
						env_teardown),
		cmocka_unit_test_setup_teardown(test_standby_never_made, env_setup_busy_long,
						env_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
