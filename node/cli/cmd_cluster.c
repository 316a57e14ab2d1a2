/* `tessera cluster`: a whole tessera cluster on loopback, driven and checked
 * from the outside: tracker, publisher, node agents as separate processes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "node/cli/cmd.h"
#include "node/serve/expose.h"
#include "node/cli/probe.h"
#include "node/cli/proc.h"
#include "proto/checkpoint.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"

#define MAX_REPLICAS 16
#define VERSION_TIMEOUT_MS 120000

struct replica {
	char name[8];
	char layout_arg[1024];
	struct proto_layout layout;
	struct node_proc *procs; /* one per rank */
	uint32_t started;        /* ranks 0..started-1 were spawned */
	bool activated;
	uint64_t t_activate_ms;
	bool digest_ok;
	/* --late-replica: started once every other replica is active on the
	 * last version; its t_activate_ms counts from its registration. */
	bool late;
	uint64_t registered_ms;
	/* Its ranks' counters for the version, from the tracker. */
	uint64_t from_trainer, from_peers, duplicate, refetched;
	/* Its ranks' live canary scores against the publisher's: 1 all match,
	 * 0 one does not, -1 no verdict (probe_replica). */
	int canary_ok;
};

struct cluster {
	/* options */
	uint32_t trainer_ranks;
	const char *trainer_layout;
	const char *model_dir;
	uint64_t model_mb, seed, versions;
	const char *provider, *report, *keep;
	bool star; /* --mode star: nodes run with TESSERA_FANOUT=0 */
	/* --every: publish on a clock for duration_s; stagger a replica's ranks */
	uint64_t every_ms, stagger_ms, duration_s;
	uint64_t anchor_every; /* 0: the publisher's default */
	struct replica reps[MAX_REPLICAS];
	uint32_t nreps;
	/* running */
	char dir[4096], bindir[4096], url[256];
	struct proto_model model;
	char **ckpts; /* --model-dir: checkpoint paths in version order */
	size_t nckpts;
	struct node_proc tracker, publisher;
	struct trk_client *trk;
	int control;
	json_t *out_versions;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera cluster [--trainer-ranks K] [--trainer-layout FILE]\n"
		"                       [--replica tpN|FILE]... [--synthetic-mb N | --model-dir DIR]\n"
		"                       [--versions V] [--provider NAME] [--seed S]\n"
		"                       [--report FILE] [--keep DIR] [--mode fanout|star]\n"
		"                       [--late-replica tpN|FILE]...\n"
		"                       [--every MS [--stagger MS] [--duration S]]\n"
		"                       [--anchor-every K]\n"
		"\n"
		"Starts a tracker, a publisher hosting K trainer ranks and one node agent per\n"
		"replica rank as separate processes on loopback, publishes V versions, checks\n"
		"every rank's bytes itself, stops everything and writes a JSON report.\n"
		"SIGINT, SIGTERM or SIGHUP stop the run and every process it started\n"
		"(exit status 128 + the signal).\n"
		"\n"
		"      --trainer-ranks K    trainer ranks the publisher hosts (default 2)\n"
		"      --trainer-layout L   trainer layout file or built-in (default fsdpK)\n"
		"      --replica L          one replica of layout L, tpN or a layout file;\n"
		"                           repeat for more (default: tp2 tp2 tp1)\n"
		"      --synthetic-mb N     a synthetic model of about N MiB, whole layers\n"
		"                           (default 256; --model-mb: deprecated)\n"
		"      --model-dir DIR      the weights of `tessera publish --model-dir`:\n"
		"                           v<N>.safetensors files or v<N>/ Hugging Face\n"
		"                           checkpoints, one per version, in order of N\n"
		"      --versions V         versions to publish (default 3)\n"
		"      --provider NAME      libfabric provider (default tcp;ofi_rxm)\n"
		"      --seed S             seed of the synthetic model (default 1)\n"
		"      --report FILE        write the JSON report to FILE\n"
		"      --mode fanout|star   fanout: nodes fetch from and serve peers;\n"
		"                           star: only from the publisher (nodes run\n"
		"                           with TESSERA_FANOUT=0); default: as\n"
		"                           TESSERA_FANOUT says (fanout unless 0)\n"
		"      --late-replica L     a replica of layout L started once every other\n"
		"                           one is active on the last version; it must\n"
		"                           activate that version too (repeatable; its\n"
		"                           t_activate_ms counts from its registration)\n"
		"      --keep DIR           run in DIR and keep its keys, logs and state\n"
		"                           (default: a temporary directory, removed when\n"
		"                           the run succeeds or is stopped by a signal)\n"
		"      --every MS           publish a version every MS ms whatever the\n"
		"                           replicas do (the trainer's own clock); the\n"
		"                           report then gives per replica the versions\n"
		"                           activated, the lag behind the latest (p50/p99,\n"
		"                           in versions and seconds) and the publisher's\n"
		"                           peak resident memory\n"
		"      --stagger MS         with --every: start the ranks of each replica\n"
		"                           MS ms apart (default 0)\n"
		"      --duration S         with --every: run S seconds (default 60; up to\n"
		"                           15 more until two versions are out and every\n"
		"                           replica activated one); every rank's bytes are\n"
		"                           checked at the end\n"
		"      --anchor-every K     an anchor every K versions, deltas between\n"
		"                           (default: the publisher's, 10); the report\n"
		"                           gives each version's kind, wire_bytes (all\n"
		"                           replicas together) and anchor_bytes\n"
		"  -h, --help               this text\n");
}

static int path_join(char *out, size_t len, const char *a, const char *b)
{
	int n = snprintf(out, len, "%s/%s", a, b);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* ---- model sources ------------------------------------------------------ */

/* The bytes rank `rank` of layout l must hold at version v. */
static int expected_block(struct cluster *c, const struct proto_layout *l, uint32_t rank,
			  uint64_t v, uint8_t *block, struct proto_err *err)
{
	if (c->model_dir == NULL) {
		proto_fixture_fill_rank(&c->model, l, rank, c->seed, v, block);
		return 0;
	}
	struct proto_ckpt ck;
	int rc = proto_ckpt_open(c->ckpts[v - 1], &ck, err);
	if (rc != 0)
		return rc;
	/* Same names, dtypes and shapes, in the same order, as the model the
	 * nodes use. */
	if (sodium_memcmp(ck.model.digest, c->model.digest, PROTO_HASH_BYTES) != 0) {
		proto_ckpt_fini(&ck);
		return proto_errf(err, EINVAL, "%s: a different model than the first version",
				  c->ckpts[v - 1]);
	}
	/* By pread, as the publisher reads it: a file cut short since is an
	 * error here, not a SIGBUS from its mapping. */
	rc = proto_ckpt_fill_rank(&ck, &ck.model, NULL, l, rank, block, err);
	if (rc != 0)
		proto_err_prefix(err, "%s", c->ckpts[v - 1]);
	proto_ckpt_fini(&ck);
	return rc;
}

/* ---- checks -------------------------------------------------------------- */

/* Compares what a rank serves (through the memfd its node exposes) with
 * the bytes computed here. */
static bool check_rank(struct cluster *c, struct replica *r, uint32_t rank, uint64_t v,
		       const uint8_t *expect, size_t len)
{
	char path[4200], name[64];
	struct proto_err err;
	json_t *j;
	bool ok = false;

	snprintf(name, sizeof(name), "expose/%s-%u.json", r->name, rank);
	path_join(path, sizeof(path), c->dir, name);
	if (node_expose_read(path, &j, &err) != 0) {
		fprintf(stderr, "cluster: replica %s rank %u: %s\n", r->name, rank, err.msg);
		return false;
	}
	const char *memfd = json_string_value(json_object_get(j, "memfd_path"));
	uint64_t jv = (uint64_t)json_integer_value(json_object_get(j, "version"));
	uint64_t size = (uint64_t)json_integer_value(json_object_get(j, "size"));
	if (memfd == NULL || jv != v || size != len) {
		fprintf(stderr, "cluster: replica %s rank %u exposes v%" PRIu64 " (%" PRIu64
				" bytes), want v%" PRIu64 " (%zu bytes)\n",
			r->name, rank, jv, size, v, len);
		goto out;
	}
	int fd = open(memfd, O_RDONLY);
	if (fd < 0) {
		fprintf(stderr, "cluster: replica %s rank %u: %s: %s\n", r->name, rank, memfd,
			strerror(errno));
		goto out;
	}
	void *m = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (m == MAP_FAILED)
		goto out;
	ok = len == 0 || memcmp(m, expect, len) == 0;
	if (!ok)
		fprintf(stderr, "cluster: replica %s rank %u: bytes differ from v%" PRIu64 "\n", r->name,
			rank, v);
	if (len)
		munmap(m, len);
out:
	json_decref(j);
	return ok;
}

/* Checks every replica's ranks; the expected bytes of a (layout, rank) are
 * computed once and compared with every replica of that layout. */
static bool check_digests(struct cluster *c, uint64_t v)
{
	bool all = true;

	for (uint32_t i = 0; i < c->nreps; i++)
		c->reps[i].digest_ok = true;
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		bool seen = false;
		for (uint32_t j = 0; j < i && !seen; j++)
			seen = c->reps[j].started > 0 &&
			       memcmp(c->reps[j].layout.digest, r->layout.digest, PROTO_HASH_BYTES) == 0;
		if (seen || r->started == 0) /* a late replica not started yet */
			continue; /* checked with the first replica of its layout */
		for (uint32_t k = 0; k < r->layout.nranks; k++) {
			size_t len = r->layout.ranks[k].nbytes;
			uint8_t *expect = malloc(len + 1);
			struct proto_err err;
			bool have = expect != NULL &&
				    expected_block(c, &r->layout, k, v, expect, &err) == 0;
			if (!have)
				fprintf(stderr, "cluster: %s\n", expect ? err.msg : "out of memory");
			for (uint32_t j = i; j < c->nreps; j++) {
				struct replica *o = &c->reps[j];
				if (o->started == 0 ||
				    memcmp(o->layout.digest, r->layout.digest, PROTO_HASH_BYTES) != 0)
					continue;
				if (!have || !check_rank(c, o, k, v, expect, len))
					o->digest_ok = false;
			}
			free(expect);
		}
	}
	for (uint32_t i = 0; i < c->nreps; i++)
		all &= c->reps[i].digest_ok || c->reps[i].started == 0;
	return all;
}

/* ---- the run ------------------------------------------------------------- */

/* SIGINT, SIGTERM or SIGHUP, once one came: every wait below gives up, the
 * children are stopped and the run ends with status 128 + the signal. */
static volatile sig_atomic_t stop_signal;

static void on_stop_signal(int sig)
{
	stop_signal = sig;
}

/* Catches the signals that stop a run, without SA_RESTART, so that a read
 * from the publisher's control socket returns at once. */
static void catch_stop_signals(void)
{
	struct sigaction sa = {.sa_handler = on_stop_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

static bool children_alive(struct cluster *c)
{
	if (stop_signal)
		return false;
	bool ok = node_proc_alive(&c->tracker) && node_proc_alive(&c->publisher);
	for (uint32_t i = 0; i < c->nreps; i++)
		for (uint32_t k = 0; k < c->reps[i].started; k++)
			if (!node_proc_alive(&c->reps[i].procs[k])) {
				fprintf(stderr, "cluster: node %s/%u exited (log %s)\n", c->reps[i].name, k,
					c->reps[i].procs[k].log);
				ok = false;
			}
	if (!ok && c->publisher.pid == 0)
		fprintf(stderr, "cluster: publisher exited (log %s)\n", c->publisher.log);
	return ok;
}

static int get_status(struct cluster *c, json_t **out)
{
	struct trk_reply r;
	int rc = trk_client_call(c->trk, "GET", TRK_API "/status", NULL, NULL, 0, &r);
	if (rc == 0 && r.status == 200 && r.json != NULL) {
		*out = json_incref(r.json);
		trk_reply_fini(&r);
		return 0;
	}
	trk_reply_fini(&r);
	return rc ? rc : -EIO;
}

/* Waits until every node registered (the publisher exports only for
 * layouts it knows of). */
static int wait_registered(struct cluster *c)
{
	uint32_t want = 0;
	for (uint32_t i = 0; i < c->nreps; i++)
		want += c->reps[i].started;
	for (int waited = 0; waited < 30000; waited += 50) {
		json_t *st;
		if (!children_alive(c))
			return -ECHILD;
		if (get_status(c, &st) == 0) {
			uint64_t alive = (uint64_t)json_integer_value(json_object_get(st, "nodes_alive"));
			json_decref(st);
			if (alive >= want)
				return 0;
		}
		usleep(50000);
	}
	return -ETIMEDOUT;
}

/* What the publisher said of one export. */
struct exported {
	uint64_t v, created_ms, wire, anchor, encode_us;
	char kind[8];
};

static int control_export(struct cluster *c, struct exported *x)
{
	char line[512];
	size_t n = 0;

	if (write(c->control, "export\n", 7) != 7)
		return -EIO;
	while (n < sizeof(line) - 1) {
		ssize_t k = read(c->control, line + n, 1);
		if (k <= 0)
			return -EIO;
		if (line[n] == '\n')
			break;
		n++;
	}
	line[n] = 0;
	unsigned long long vv, cm, w, an, enc;
	if (sscanf(line, "published %llu %llu %7s %llu %llu %llu", &vv, &cm, x->kind, &w, &an,
		   &enc) != 6) {
		fprintf(stderr, "cluster: publisher said: %s\n", line);
		return -EIO;
	}
	x->v = vv;
	x->created_ms = cm;
	x->wire = w;
	x->anchor = an;
	x->encode_us = enc;
	return 0;
}

static json_t *find_replica(json_t *st, const char *name);

/* Marks the replicas (the late ones, or the others) that the status st
 * shows active on v, with the time it took: from the manifest's creation,
 * or for a late replica from its registration. */
static void scan_activations(struct cluster *c, json_t *st, uint64_t v, uint64_t created, bool late)
{
	json_t *a;
	size_t k;

	json_array_foreach(json_object_get(st, "activations"), k, a)
	{
		const char *name = json_string_value(json_object_get(a, "replica"));
		uint64_t wall = (uint64_t)json_integer_value(json_object_get(a, "wall_ms"));
		if ((uint64_t)json_integer_value(json_object_get(a, "version")) != v || name == NULL)
			continue;
		for (uint32_t i = 0; i < c->nreps; i++) {
			struct replica *r = &c->reps[i];
			if (r->late != late || r->activated || strcmp(name, r->name) != 0)
				continue;
			if (late && r->registered_ms == 0)
				continue; /* not known to have registered yet */
			r->activated = true;
			r->t_activate_ms = wall - PROTO_MIN(wall, late ? r->registered_ms : created);
		}
	}
}

/* From the status st: when r's first rank registered, and the counters of
 * its ranks whose last report is about v. */
static void replica_counters(json_t *st, struct replica *r, uint64_t v)
{
	json_t *rk;
	size_t k;

	r->from_trainer = r->from_peers = r->duplicate = r->refetched = 0;
	json_t *rep = find_replica(st, r->name);
	json_array_foreach(json_object_get(rep, "ranks"), k, rk)
	{
		uint64_t reg = (uint64_t)json_integer_value(json_object_get(rk, "registered_ms"));
		if (reg != 0 && (r->registered_ms == 0 || reg < r->registered_ms))
			r->registered_ms = reg;
		if ((uint64_t)json_integer_value(json_object_get(rk, "version")) != v)
			continue;
		r->from_trainer += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer"));
		r->from_peers += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers"));
		r->duplicate += (uint64_t)json_integer_value(json_object_get(rk, "duplicate_bytes"));
		r->refetched += (uint64_t)json_integer_value(json_object_get(rk, "refetched_bytes"));
	}
}

/* Waits (at most VERSION_TIMEOUT_MS) until every replica of the wave
 * (late or not) is active on v; *st is the last status seen. */
static int wait_wave(struct cluster *c, uint64_t v, uint64_t created, bool late, json_t **st)
{
	for (int waited = 0;; waited += 20) {
		bool all = true;
		json_decref(*st);
		*st = NULL;
		if (!children_alive(c))
			return -ECHILD;
		if (get_status(c, st) == 0) {
			for (uint32_t i = 0; i < c->nreps; i++)
				if (c->reps[i].late == late && c->reps[i].started > 0)
					replica_counters(*st, &c->reps[i], v);
			scan_activations(c, *st, v, created, late);
		}
		for (uint32_t i = 0; i < c->nreps; i++)
			all &= c->reps[i].late != late || c->reps[i].activated;
		if (all && *st != NULL)
			return 0;
		if (waited > VERSION_TIMEOUT_MS) {
			for (uint32_t i = 0; i < c->nreps; i++)
				if (c->reps[i].late == late && !c->reps[i].activated)
					fprintf(stderr, "cluster: %sreplica %s (%s) not active on v%" PRIu64
							" after %d s\n",
						late ? "late " : "", c->reps[i].name, c->reps[i].layout_arg, v,
						VERSION_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		usleep(20000);
	}
}

/* The attach socket of rank k of r. */
static void attach_path(const struct cluster *c, const struct replica *r, uint32_t k, char *out,
			size_t cap)
{
	char name[64];

	snprintf(name, sizeof(name), "attach-%s-%u.sock", r->name, k);
	path_join(out, cap, c->dir, name);
}

/* Probes every rank of r like a serving engine (node/probe.h) and reports
 * the live canary scores to the tracker, which compares them with the
 * publisher's for v. The publisher posts its scores right after publishing
 * v, long before a replica activates; a verdict still missing is asked for
 * again for a few seconds. */
static void probe_replica(struct cluster *c, struct replica *r, uint64_t v)
{
	struct proto_err err;
	char sock[4200];

	r->canary_ok = 1;
	for (uint32_t k = 0; k < r->layout.nranks && r->canary_ok != 0; k++) {
		struct node_probe pr;
		int rc = -1;
		attach_path(c, r, k, sock, sizeof(sock));
		for (int tries = 0; tries < 50 && !stop_signal; tries++) {
			rc = node_probe_read(sock, r->name, k, v, 10000, &pr, &err);
			if (rc == 0)
				rc = node_probe_report(c->trk, r->name, k, &pr, &err);
			if (rc != 0 || pr.ok >= 0)
				break;
			usleep(100000);
		}
		if (rc != 0) {
			fprintf(stderr, "cluster: canary of %s/%u: %s\n", r->name, k, err.msg);
			r->canary_ok = -1;
			continue;
		}
		if (pr.version != v)
			fprintf(stderr, "cluster: canary of %s/%u read v%" PRIu64 ", not v%" PRIu64 "\n",
				r->name, k, pr.version, v);
		if (pr.ok == 0 || pr.version != v)
			r->canary_ok = 0;
		else if (pr.ok < 0 && r->canary_ok == 1)
			r->canary_ok = -1;
	}
}

/* The report's entry for replica r at version v. */
static json_t *replica_entry(const struct replica *r, uint64_t v)
{
	printf("  v%" PRIu64 " %sreplica %s (%s): %s after %" PRIu64 " ms%s, %" PRIu64
	       " bytes from the trainer, %" PRIu64 " from peers, bytes %s, canary %s\n",
	       v, r->late ? "late " : "", r->name, r->layout_arg,
	       r->activated ? "active" : "NOT active", r->t_activate_ms,
	       r->late ? " from its registration" : "", r->from_trainer, r->from_peers,
	       r->digest_ok ? "ok" : "WRONG",
	       r->canary_ok == 1 ? "ok" : r->canary_ok == 0 ? "MISMATCH" : "unknown");
	return json_pack("{s:s,s:s,s:b,s:b,s:I,s:b,s:o,s:I,s:I,s:I,s:I}", "replica", r->name,
			 "layout", r->layout_arg, "late", r->late, "activated", r->activated,
			 "t_activate_ms", (json_int_t)r->t_activate_ms, "digest_ok", r->digest_ok,
			 "canary_ok", r->canary_ok < 0 ? json_null() : json_boolean(r->canary_ok),
			 "bytes_from_trainer", (json_int_t)r->from_trainer, "bytes_from_peers",
			 (json_int_t)r->from_peers, "duplicate_bytes", (json_int_t)r->duplicate,
			 "refetched_bytes", (json_int_t)r->refetched);
}

/* Publishes one version and waits until every replica but the late ones
 * is active on it. The version's byte counts are those of these replicas. */
static int run_version(struct cluster *c, uint64_t want_v)
{
	uint64_t v, created, published_ms;
	json_t *st = NULL;
	struct exported x;
	int rc = control_export(c, &x);

	if (rc != 0)
		return rc;
	v = x.v;
	created = x.created_ms;
	published_ms = proto_wall_ms();
	if (v != want_v)
		fprintf(stderr, "cluster: publisher exported v%" PRIu64 ", expected v%" PRIu64 "\n", v,
			want_v);
	for (uint32_t i = 0; i < c->nreps; i++)
		c->reps[i].activated = false;
	rc = wait_wave(c, v, created, false, &st);
	if (rc != 0) {
		json_decref(st);
		return rc;
	}
	uint64_t payload = 0;
	json_t *ver;
	size_t i;
	json_array_foreach(json_object_get(st, "versions"), i, ver)
	{
		if ((uint64_t)json_integer_value(json_object_get(ver, "version")) == v)
			payload = (uint64_t)json_integer_value(json_object_get(ver, "wire_bytes"));
	}
	json_decref(st);
	bool ok = check_digests(c, v);
	for (uint32_t r = 0; r < c->nreps; r++)
		if (!c->reps[r].late) {
			probe_replica(c, &c->reps[r], v);
			ok &= c->reps[r].canary_ok != 0;
		}
	/* Bytes the replicas pulled for v, by source. */
	uint64_t from_trainer = 0, from_peers = 0, dup = 0, refetched = 0;
	json_t *reps = json_array();
	for (uint32_t r = 0; r < c->nreps; r++) {
		struct replica *re = &c->reps[r];
		if (re->late)
			continue;
		from_trainer += re->from_trainer;
		from_peers += re->from_peers;
		dup += re->duplicate;
		refetched += re->refetched;
		json_array_append_new(reps, replica_entry(re, v));
	}
	/* The wire cost of the version for all replicas together, and what
	 * the same version costs as an anchor (every replica's full parcels). */
	uint64_t wire_all = 0, anchor_all = 0;
	for (uint32_t r = 0; r < c->nreps; r++) {
		uint64_t full = 0;
		if (c->reps[r].late)
			continue; /* as in wire_all */
		for (uint32_t q = 0; q < c->reps[r].layout.nranks; q++)
			full += c->reps[r].layout.ranks[q].nbytes;
		anchor_all += full;
	}
	wire_all = from_trainer + from_peers;
	printf("  v%" PRIu64 " %s: %" PRIu64 " wire bytes for all replicas, %.2f %% of an anchor"
	       " (encode %.1f ms)\n",
	       v, x.kind, wire_all, anchor_all ? 100.0 * (double)wire_all / (double)anchor_all : 0.0,
	       (double)x.encode_us / 1000.0);
	fflush(stdout); /* progress shows as it happens, into a file or a pipe too */
	json_t *entry = json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "version", (json_int_t)v,
				  "kind", x.kind, "payload_bytes", (json_int_t)payload,
				  "trainer_upload_bytes", (json_int_t)from_trainer,
				  "peer_upload_bytes", (json_int_t)from_peers, "duplicate_bytes",
				  (json_int_t)dup, "refetched_bytes", (json_int_t)refetched,
				  "t_published_ms", (json_int_t)(published_ms - created), "replicas", reps);
	/* Where the update spent its time, as the tracker recorded it. */
	char path[128];
	struct trk_reply tr;
	snprintf(path, sizeof(path), TRK_API "/versions/%" PRIu64 "/timeline", v);
	if (entry != NULL && trk_client_call(c->trk, "GET", path, NULL, NULL, 0, &tr) == 0 &&
	    tr.status == 200 && tr.json != NULL)
		json_object_set(entry, "timeline", tr.json);
	trk_reply_fini(&tr);
	json_object_set_new(entry, "wire_bytes", json_integer((json_int_t)wire_all));
	json_object_set_new(entry, "anchor_bytes", json_integer((json_int_t)anchor_all));
	json_object_set_new(entry, "encode_ms", json_real((double)x.encode_us / 1000.0));
	json_array_append_new(c->out_versions, entry);
	return ok ? 0 : -EBADMSG;
}

static int start_rank(struct cluster *c, struct replica *r, struct proto_err *err);

/* After the last version v: starts the late replicas and waits until they
 * are active on v too; their entries join v's in the report. */
static int run_late(struct cluster *c, uint64_t v)
{
	struct proto_err err;
	json_t *st = NULL;
	bool any = false;
	int rc = 0;

	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		if (!r->late)
			continue;
		any = true;
		while (r->started < r->layout.nranks)
			if ((rc = start_rank(c, r, &err)) != 0) {
				fprintf(stderr, "cluster: %s\n", err.msg);
				return rc;
			}
	}
	if (!any)
		return 0;
	printf("tessera cluster: late replicas started after v%" PRIu64 "\n", v);
	fflush(stdout);
	rc = wait_wave(c, v, 0, true, &st);
	json_decref(st);
	bool ok = check_digests(c, v) && rc == 0;
	for (uint32_t i = 0; i < c->nreps && rc == 0; i++)
		if (c->reps[i].late) {
			probe_replica(c, &c->reps[i], v);
			ok &= c->reps[i].canary_ok != 0;
		}
	json_t *entry = json_array_get(c->out_versions, json_array_size(c->out_versions) - 1);
	json_t *reps = json_object_get(entry, "replicas");
	for (uint32_t i = 0; i < c->nreps; i++)
		if (c->reps[i].late)
			json_array_append_new(reps, replica_entry(&c->reps[i], v));
	return rc != 0 ? rc : ok ? 0 : -EBADMSG;
}

/* Spawns the next rank of r (rank r->started). */
static int start_rank(struct cluster *c, struct replica *r, struct proto_err *err)
{
	char bin[4200], log[4200], pub[4200], ckey[4200], model[4200], expose[4200];
	char rank[16], name[32], sock[4200];
	uint32_t k = r->started;
	int rc;

	path_join(bin, sizeof(bin), c->bindir, "tessera-node");
	path_join(pub, sizeof(pub), c->dir, "trainer.pub");
	path_join(ckey, sizeof(ckey), c->dir, "cluster.key");
	path_join(model, sizeof(model), c->dir, "model.json");
	path_join(expose, sizeof(expose), c->dir, "expose");
	snprintf(rank, sizeof(rank), "%u", k);
	snprintf(name, sizeof(name), "node-%s-%u.log", r->name, k);
	path_join(log, sizeof(log), c->dir, name);
	attach_path(c, r, k, sock, sizeof(sock));
	char *nargv[] = {bin, "--tracker", c->url, "--replica", r->name, "--rank", rank,
			 "--layout", r->layout_arg, "--model", model, "--trainer-pubkey", pub,
			 "--cluster-key", ckey, "--provider", (char *)c->provider, "--expose",
			 expose, "--store", "host", "--attach", sock, NULL};
	/* The mode is the nodes' alone: set for the spawn, then put back. */
	const char *was = getenv("TESSERA_FANOUT");
	char *saved = was ? strdup(was) : NULL;
	setenv("TESSERA_FANOUT", c->star ? "0" : "1", 1);
	rc = node_proc_spawn(&r->procs[k], name, nargv, log);
	if (saved != NULL)
		setenv("TESSERA_FANOUT", saved, 1);
	else
		unsetenv("TESSERA_FANOUT");
	free(saved);
	if (rc != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	r->started++;
	return 0;
}

static int start_all(struct cluster *c, struct proto_err *err)
{
	char key[4200], pub[4200], ckey[4200], state[4200], model[4200], expose[4200],
		sock[4200], log[4200], bin[4200], line[512], tlayout[4200];
	int rc;

	path_join(key, sizeof(key), c->dir, "trainer.key");
	path_join(pub, sizeof(pub), c->dir, "trainer.pub");
	path_join(ckey, sizeof(ckey), c->dir, "cluster.key");
	path_join(state, sizeof(state), c->dir, "tracker-state");
	path_join(model, sizeof(model), c->dir, "model.json");
	path_join(expose, sizeof(expose), c->dir, "expose");
	path_join(sock, sizeof(sock), c->dir, "publisher.sock");
	if ((rc = proto_keygen(key, pub, err)) != 0 || (rc = proto_cluster_keygen(ckey, err)) != 0)
		return rc;
	json_t *mj = proto_model_to_json(&c->model);
	rc = proto_write_json_atomic(model, mj, JSON_INDENT(1), err);
	json_decref(mj);
	if (rc != 0)
		return rc;
	mkdir(expose, 0755);

	/* Tracker first; it prints where it listens. */
	path_join(bin, sizeof(bin), c->bindir, "tessera-tracker");
	path_join(log, sizeof(log), c->dir, "tracker.log");
	char *targv[] = {bin, "--listen", "127.0.0.1:0", "--state", state, "--cluster-key", ckey,
			 "--trainer-pubkey", pub, NULL};
	if ((rc = node_proc_spawn(&c->tracker, "tracker", targv, log)) != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	if (node_proc_wait_line(&c->tracker, "listening on ", line, sizeof(line), 10000) != 0)
		return proto_errf(err, EIO, "the tracker did not start (log %s)", log);
	snprintf(c->url, sizeof(c->url), "%s", line);
	uint8_t ck[PROTO_CLUSTER_KEY_BYTES];
	if ((rc = proto_key_load_cluster(ckey, ck, err)) != 0 ||
	    (rc = trk_client_new(NULL, c->url, ck, &c->trk, err)) != 0)
		return rc;
	printf("tessera cluster: status page %s/\n", c->url);
	fflush(stdout);

	/* Node agents, one per replica rank (with --stagger only rank 0 now). */
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		r->procs = calloc(r->layout.nranks, sizeof(*r->procs));
		if (r->procs == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		while (!r->late && r->started < (c->stagger_ms > 0 ? 1 : r->layout.nranks))
			if ((rc = start_rank(c, r, err)) != 0)
				return rc;
	}

	/* The publisher hosts every trainer rank and takes orders on a socket. */
	path_join(bin, sizeof(bin), c->bindir, "tessera");
	path_join(log, sizeof(log), c->dir, "publisher.log");
	char seed[32], mb[32], tl[64];
	snprintf(seed, sizeof(seed), "%" PRIu64, c->seed);
	snprintf(mb, sizeof(mb), "%" PRIu64, c->model_mb);
	snprintf(tl, sizeof(tl), "fsdp%u", c->trainer_ranks);
	snprintf(tlayout, sizeof(tlayout), "%s", c->trainer_layout ? c->trainer_layout : tl);
	char *pargv[24] = {bin, "publish", "--tracker", c->url, "--key", key, "--cluster-key", ckey,
			   "--layout", tlayout, "--provider", (char *)c->provider, "--control", sock};
	int n = 14;
	char every[32], anchors[32];
	if (c->anchor_every > 0) {
		snprintf(anchors, sizeof(anchors), "%" PRIu64, c->anchor_every);
		pargv[n++] = "--anchor-every";
		pargv[n++] = anchors;
	}
	if (c->every_ms > 0) {
		snprintf(every, sizeof(every), "%" PRIu64, c->every_ms);
		pargv[n++] = "--every";
		pargv[n++] = every;
	}
	if (c->model_dir) {
		pargv[n++] = "--model-dir";
		pargv[n++] = (char *)c->model_dir;
	} else {
		pargv[n++] = "--synthetic-mb";
		pargv[n++] = mb;
		pargv[n++] = "--seed";
		pargv[n++] = seed;
	}
	pargv[n] = NULL;
	if ((rc = node_proc_spawn(&c->publisher, "publisher", pargv, log)) != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	rc = wait_registered(c);
	if (rc != 0)
		return proto_errf(err, -rc, "nodes did not register (logs in %s)", c->dir);
	/* Connect to the publisher's control socket once it is there. */
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(sock) >= sizeof(sa.sun_path))
		return proto_errf(err, ENAMETOOLONG, "%s: path too long for a socket", sock);
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	for (int waited = 0;; waited += 50) {
		c->control = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (c->control >= 0 && connect(c->control, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if (c->control >= 0)
			close(c->control);
		c->control = -1;
		if (!children_alive(c) || waited > 30000)
			return proto_errf(err, EIO, "the publisher did not open %s (log %s)", sock,
					  c->publisher.log);
		usleep(50000);
	}
	return 0;
}

/* ---- --every: versions on the trainer's own clock ----------------------- */

#define CLOCK_SAMPLE_MS 100
#define CLOCK_SETTLE_MS 15000 /* after the last version, for ranks to agree */

struct lag_samples {
	uint64_t *versions, *ms;
	size_t n, cap;
};

static int lag_push(struct lag_samples *s, uint64_t v, uint64_t ms)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 1024;
		uint64_t *a = realloc(s->versions, cap * sizeof(*a));
		if (a == NULL)
			return -ENOMEM;
		s->versions = a;
		uint64_t *b = realloc(s->ms, cap * sizeof(*b));
		if (b == NULL)
			return -ENOMEM;
		s->ms = b;
		s->cap = cap;
	}
	s->versions[s->n] = v;
	s->ms[s->n++] = ms;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The p-quantile (nearest rank) of n samples; sorts them. 0 when n == 0. */
static uint64_t quantile(uint64_t *a, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(a, n, sizeof(*a), cmp_u64);
	size_t k = (size_t)(p * (double)n + 0.999999);
	return a[k == 0 ? 0 : PROTO_MIN(k, n) - 1];
}

/* A process's peak resident memory (VmHWM), bytes; 0 when unknown. */
static uint64_t peak_rss(pid_t pid)
{
	char path[64], line[256];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

static json_t *find_replica(json_t *st, const char *name)
{
	json_t *rep;
	size_t i;
	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		if (strcmp(json_string_value(json_object_get(rep, "replica")), name) == 0)
			return rep;
	return NULL;
}

/* With the publisher stopped no version arrives: waits until every rank of
 * every replica exposes the replica's active version, then checks the
 * bytes of each rank. */
static bool settle_and_check(struct cluster *c)
{
	bool all = true;

	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		uint64_t v = 0;
		r->digest_ok = false;
		for (int w = 0; w < CLOCK_SETTLE_MS && !stop_signal; w += CLOCK_SAMPLE_MS) {
			json_t *st = NULL, *rep;
			bool agree = get_status(c, &st) == 0 && (rep = find_replica(st, r->name)) != NULL;
			if (agree) {
				v = (uint64_t)json_integer_value(json_object_get(rep, "active"));
				json_t *rk;
				size_t k;
				json_array_foreach(json_object_get(rep, "ranks"), k, rk)
					agree &= (uint64_t)json_integer_value(json_object_get(rk, "active")) == v;
				/* Ranks that agree on v while their target is newer are
				 * about to move: wait for it (or the end of the settle
				 * time, if the target can no longer be fetched). */
				agree &= v >= (uint64_t)json_integer_value(json_object_get(rep, "target"));
			}
			json_decref(st);
			if (agree && v > 0)
				break;
			usleep(CLOCK_SAMPLE_MS * 1000);
		}
		if (v == 0) {
			fprintf(stderr, "cluster: replica %s activated nothing\n", r->name);
			all = false;
			continue;
		}
		r->digest_ok = true;
		for (uint32_t k = 0; k < r->layout.nranks; k++) {
			struct proto_err err;
			size_t len = r->layout.ranks[k].nbytes;
			uint8_t *block = malloc(PROTO_MAX(len, 1));
			if (block == NULL || expected_block(c, &r->layout, k, v, block, &err) != 0)
				r->digest_ok = false;
			else
				r->digest_ok &= check_rank(c, r, k, v, block, len);
			free(block);
		}
		all &= r->digest_ok;
	}
	return all;
}

/*
 * The publisher exports a version every --every ms on its own; ranks start
 * --stagger ms apart. Every CLOCK_SAMPLE_MS the tracker's status is sampled:
 * per replica, once all its ranks run and it activated a first version, its
 * lag behind the latest in versions and in ms. At the end: the versions each
 * replica activated, the lag quantiles and the publisher's peak memory.
 */
static int run_clock(struct cluster *c, json_t **out)
{
	struct lag_samples lag[MAX_REPLICAS];
	uint64_t first_ms[MAX_REPLICAS] = {0}, t0 = proto_now_ns(), latest = 0, peak;
	uint64_t model_bytes = proto_model_bytes(&c->model);
	struct proto_err err;
	json_t *reps = json_array(), *st = NULL;
	bool ok = true;
	int rc = 0;

	memset(lag, 0, sizeof(lag));
	printf("tessera cluster: a version every %" PRIu64 " ms for %" PRIu64 " s, ranks %" PRIu64
	       " ms apart\n",
	       c->every_ms, c->duration_s, c->stagger_ms);
	fflush(stdout);
	for (;;) {
		uint64_t el = (proto_now_ns() - t0) / 1000000;
		/* A machine too slow to publish twice and activate a version on
		 * every replica within the duration gets up to CLOCK_SETTLE_MS
		 * more for it: a report without them measures nothing. */
		bool seen = latest >= 2;
		for (uint32_t i = 0; i < c->nreps; i++)
			seen &= first_ms[i] > 0;
		if (el >= c->duration_s * 1000 && (seen || el >= c->duration_s * 1000 + CLOCK_SETTLE_MS))
			break;
		for (uint32_t i = 0; i < c->nreps; i++) {
			struct replica *r = &c->reps[i];
			while (r->started < r->layout.nranks && el >= r->started * c->stagger_ms)
				if ((rc = start_rank(c, r, &err)) != 0) {
					fprintf(stderr, "cluster: %s\n", err.msg);
					goto out;
				}
		}
		if (!children_alive(c)) {
			rc = -ECHILD;
			goto out;
		}
		if (get_status(c, &st) == 0) {
			latest = (uint64_t)json_integer_value(json_object_get(st, "latest"));
			for (uint32_t i = 0; i < c->nreps; i++) {
				struct replica *r = &c->reps[i];
				json_t *rep = find_replica(st, r->name);
				if (rep == NULL || r->started < r->layout.nranks)
					continue;
				if (json_integer_value(json_object_get(rep, "active")) == 0)
					continue;
				if (first_ms[i] == 0)
					first_ms[i] = PROTO_MAX(el, 1);
				if (lag_push(&lag[i],
					     (uint64_t)json_integer_value(json_object_get(rep, "lag_versions")),
					     (uint64_t)json_integer_value(json_object_get(rep, "lag_ms"))) != 0) {
					rc = -ENOMEM;
					goto out;
				}
			}
			json_decref(st);
			st = NULL;
		}
		usleep(CLOCK_SAMPLE_MS * 1000);
	}
	peak = peak_rss(c->publisher.pid);
	/* Count each replica's activations before anything stops. */
	uint64_t nact[MAX_REPLICAS] = {0};
	if (get_status(c, &st) == 0) {
		json_t *a;
		size_t k;
		latest = (uint64_t)json_integer_value(json_object_get(st, "latest"));
		json_array_foreach(json_object_get(st, "activations"), k, a)
			for (uint32_t i = 0; i < c->nreps; i++)
				nact[i] += strcmp(json_string_value(json_object_get(a, "replica")),
						  c->reps[i].name) == 0;
		json_decref(st);
		st = NULL;
	}
	/* No more versions: the ranks settle on their replica's version. */
	if (c->control >= 0) {
		if (write(c->control, "quit\n", 5) < 0)
			LOG_DEBUG("cluster: publisher gone before quit");
		close(c->control);
		c->control = -1;
	}
	node_proc_stop(&c->publisher, 5000);
	ok = settle_and_check(c);
	printf("tessera cluster: %" PRIu64 " versions published; publisher peak memory %.1f MiB = %.2f x the model\n",
	       latest, (double)peak / (1 << 20), (double)peak / (double)PROTO_MAX(model_bytes, 1));
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		uint64_t v50 = quantile(lag[i].versions, lag[i].n, 0.50);
		uint64_t v99 = quantile(lag[i].versions, lag[i].n, 0.99);
		uint64_t m50 = quantile(lag[i].ms, lag[i].n, 0.50);
		uint64_t m99 = quantile(lag[i].ms, lag[i].n, 0.99);
		ok &= nact[i] > 0;
		printf("  replica %s (%s): %" PRIu64 " versions activated, first after %.1f s; lag p50 %" PRIu64
		       " versions / %.2f s, p99 %" PRIu64 " versions / %.2f s; bytes %s\n",
		       r->name, r->layout_arg, nact[i], (double)first_ms[i] / 1000.0, v50,
		       (double)m50 / 1000.0, v99, (double)m99 / 1000.0, r->digest_ok ? "ok" : "WRONG");
		json_array_append_new(reps, json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b}",
						      "replica", r->name, "layout", r->layout_arg,
						      "ranks", (json_int_t)r->layout.nranks,
						      "activated", (json_int_t)nact[i],
						      "first_activation_ms", (json_int_t)first_ms[i],
						      "samples", (json_int_t)lag[i].n,
						      "lag_versions_p50", (json_int_t)v50,
						      "lag_versions_p99", (json_int_t)v99,
						      "lag_ms_p50", (json_int_t)m50,
						      "lag_ms_p99", (json_int_t)m99,
						      "digest_ok", r->digest_ok));
	}
	*out = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:O}", "every_ms", (json_int_t)c->every_ms,
			 "stagger_ms", (json_int_t)c->stagger_ms, "duration_s",
			 (json_int_t)c->duration_s, "model_bytes", (json_int_t)model_bytes,
			 "published", (json_int_t)latest, "publisher_peak_rss_bytes", (json_int_t)peak,
			 "publisher_peak_over_model", (double)peak / (double)PROTO_MAX(model_bytes, 1),
			 "replicas", reps);
	rc = ok ? 0 : -EBADMSG;
out:
	json_decref(st);
	json_decref(reps);
	for (uint32_t i = 0; i < MAX_REPLICAS; i++) {
		free(lag[i].versions);
		free(lag[i].ms);
	}
	return rc;
}

static void stop_all(struct cluster *c)
{
	if (c->control >= 0) {
		if (write(c->control, "quit\n", 5) < 0)
			LOG_DEBUG("cluster: publisher gone before quit");
		close(c->control);
		c->control = -1;
	}
	node_proc_stop(&c->publisher, 5000);
	for (uint32_t i = 0; i < c->nreps; i++) {
		for (uint32_t k = 0; c->reps[i].procs && k < c->reps[i].layout.nranks; k++)
			node_proc_stop(&c->reps[i].procs[k], 5000);
		free(c->reps[i].procs);
		c->reps[i].procs = NULL;
	}
	node_proc_stop(&c->tracker, 5000);
}

static int parse_args(struct cluster *c, int argc, char **argv)
{
	static const struct option opts[] = {
		{"trainer-ranks", required_argument, NULL, 'k'},
		{"trainer-layout", required_argument, NULL, 'T'},
		{"replica", required_argument, NULL, 'r'},
		{"synthetic-mb", required_argument, NULL, 'm'},
		{"model-dir", required_argument, NULL, 'M'},
		{"model-mb", required_argument, NULL, 'B'}, /* deprecated */
		{"model", required_argument, NULL, 'x'},    /* now --model-dir */
		{"versions", required_argument, NULL, 'v'},
		{"provider", required_argument, NULL, 'p'},
		{"seed", required_argument, NULL, 's'},
		{"report", required_argument, NULL, 'o'},
		{"mode", required_argument, NULL, 'F'},
		{"late-replica", required_argument, NULL, 'L'},
		{"keep", required_argument, NULL, 'K'},
		{"every", required_argument, NULL, 'e'},
		{"stagger", required_argument, NULL, 'S'},
		{"duration", required_argument, NULL, 'd'},
		{"anchor-every", required_argument, NULL, 'A'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	uint64_t k = 2;
	int ch;

	c->model_mb = 256;
	c->versions = 3;
	c->duration_s = 60;
	c->seed = 1;
	c->provider = FAB_PROVIDER_DEFAULT;
	optind = 1;
	opterr = 0;
	int li = 0;
	while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
		int bad = 0;
		switch (ch) {
		case 'k': bad = proto_parse_u64(optarg, 1, 1024, &k); break;
		case 'T': c->trainer_layout = optarg; break;
		case 'r':
		case 'L':
			if (c->nreps == MAX_REPLICAS) {
				fprintf(stderr, "tessera cluster: at most %d replicas\n", MAX_REPLICAS);
				return 2;
			}
			snprintf(c->reps[c->nreps].layout_arg, sizeof(c->reps[0].layout_arg), "%s", optarg);
			c->reps[c->nreps].late = ch == 'L';
			c->nreps++;
			break;
		case 'F':
			if (strcmp(optarg, "fanout") != 0 && strcmp(optarg, "star") != 0) {
				fprintf(stderr, "tessera cluster: --mode wants fanout or star, not '%s'\n",
					optarg);
				return 2;
			}
			c->star = strcmp(optarg, "star") == 0;
			break;
		case 'B':
			proto_cli_deprecated("tessera cluster", "--model-mb", "--synthetic-mb");
			/* fall through */
		case 'm': bad = proto_parse_u64(optarg, 1, 1 << 20, &c->model_mb); break;
		case 'M': c->model_dir = optarg; break;
		case 'x':
			/* --model names a model spec JSON everywhere else. */
			fprintf(stderr, "tessera cluster: --model DIR is now --model-dir DIR\n");
			return 2;
		case 'v': bad = proto_parse_u64(optarg, 1, 1000000, &c->versions); break;
		case 'p': c->provider = optarg; break;
		case 's': bad = proto_parse_u64(optarg, 0, UINT64_MAX, &c->seed); break;
		case 'o': c->report = optarg; break;
		case 'K': c->keep = optarg; break;
		case 'e': bad = proto_parse_u64(optarg, 1, 86400000, &c->every_ms); break;
		case 'S': bad = proto_parse_u64(optarg, 0, 3600000, &c->stagger_ms); break;
		case 'd': bad = proto_parse_u64(optarg, 1, 86400, &c->duration_s); break;
		case 'A': bad = proto_parse_u64(optarg, 1, UINT32_MAX, &c->anchor_every); break;
		case 'h': usage(stdout); return 1;
		default: return proto_cli_bad_option("tessera cluster", ch, argv);
		}
		if (bad) {
			fprintf(stderr, "tessera cluster: --%s wants a number in range, not '%s'\n",
				opts[li].name, optarg);
			return 2;
		}
	}
	if (optind != argc)
		return proto_cli_extra("tessera cluster", argv[optind]);
	if (c->every_ms == 0 && c->stagger_ms > 0) {
		fprintf(stderr, "tessera cluster: --stagger needs --every\n");
		return 2;
	}
	if (c->every_ms > 0 && c->model_dir != NULL) {
		fprintf(stderr, "tessera cluster: --every publishes a synthetic model; drop --model-dir\n");
		return 2;
	}
	c->trainer_ranks = (uint32_t)k;
	uint32_t nlate = 0;
	for (uint32_t i = 0; i < c->nreps; i++)
		nlate += c->reps[i].late;
	if (nlate > 0 && c->every_ms > 0) {
		fprintf(stderr, "tessera cluster: --late-replica joins after the last version; drop --every\n");
		return 2;
	}
	if (nlate > 0 && nlate == c->nreps) {
		fprintf(stderr, "tessera cluster: --late-replica joins replicas named by --replica\n");
		return 2;
	}
	if (c->nreps == 0) {
		static const char *def[] = {"tp2", "tp2", "tp1"};
		for (; c->nreps < 3; c->nreps++)
			snprintf(c->reps[c->nreps].layout_arg, sizeof(c->reps[0].layout_arg), "%s",
				 def[c->nreps]);
	}
	for (uint32_t i = 0; i < c->nreps; i++)
		snprintf(c->reps[i].name, sizeof(c->reps[i].name), "%c", 'A' + i);
	return 0;
}

static int load_model_and_layouts(struct cluster *c, struct proto_err *err)
{
	int rc;

	if (c->model_dir != NULL) {
		struct proto_ckpt ck;
		if ((rc = proto_ckpt_dir_list(c->model_dir, &c->ckpts, &c->nckpts, err)) != 0)
			return rc;
		if (c->versions > c->nckpts)
			return proto_errf(err, EINVAL, "%s holds %zu versions, --versions asks for %" PRIu64,
					  c->model_dir, c->nckpts, c->versions);
		if ((rc = proto_ckpt_open(c->ckpts[0], &ck, err)) != 0)
			return rc;
		/* Keep a copy of the model (the files are closed again). */
		json_t *mj = proto_model_to_json(&ck.model);
		proto_ckpt_fini(&ck);
		rc = proto_model_from_json(mj, c->ckpts[0], &c->model, err);
		json_decref(mj);
		if (rc != 0)
			return rc;
	} else if ((rc = proto_fixture_model(c->model_mb << 20, &c->model, err)) != 0) {
		return rc;
	}
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct replica *r = &c->reps[i];
		const char *s = r->layout_arg;
		rc = proto_layout_open(&c->model, s, &r->layout, err);
		if (rc == 0)
			rc = proto_layout_check_complete(&c->model, &r->layout, err);
		if (rc != 0)
			return rc;
		/* Layout files are handed to the nodes by absolute path. */
		if (proto_layout_arg_is_file(s)) {
			char abs[4096];
			if (realpath(s, abs) != NULL)
				snprintf(r->layout_arg, sizeof(r->layout_arg), "%s", abs);
		}
	}
	return 0;
}

int node_cmd_cluster(int argc, char **argv)
{
	/* Without --mode, the nodes' mode is what TESSERA_FANOUT says. */
	struct cluster c = {.control = -1, .star = proto_param(PROTO_PARAM_FANOUT) == 0};
	struct proto_err err;
	uint64_t t0 = proto_now_ns();
	int rc = parse_args(&c, argc, argv), status = 1;
	json_t *report, *clock = NULL;

	if (rc != 0)
		return rc == 1 ? 0 : rc;
	signal(SIGPIPE, SIG_IGN);
	catch_stop_signals();
	proto_model_init(&c.model);
	c.out_versions = json_array();
	if (node_self_dir(c.bindir, sizeof(c.bindir)) != 0) {
		fprintf(stderr, "tessera cluster: cannot find my own directory\n");
		goto out;
	}
	if (load_model_and_layouts(&c, &err) != 0) {
		fprintf(stderr, "tessera cluster: %s\n", err.msg);
		goto out; /* before making a directory: nothing to remove */
	}
	if (c.keep != NULL) {
		mkdir(c.keep, 0755);
		snprintf(c.dir, sizeof(c.dir), "%s", c.keep);
	} else {
		const char *t = getenv("TMPDIR");
		snprintf(c.dir, sizeof(c.dir), "%s/tessera-cluster-XXXXXX", t ? t : "/tmp");
		if (mkdtemp(c.dir) == NULL) {
			fprintf(stderr, "tessera cluster: %s: %s\n", c.dir, strerror(errno));
			goto out;
		}
	}
	printf("tessera cluster: model %.1f MiB (%u tensors), %u trainer ranks, %u replicas, %" PRIu64
	       " versions, provider %s, %s\n",
	       (double)proto_model_bytes(&c.model) / (1 << 20), c.model.ntensors, c.trainer_ranks,
	       c.nreps, c.every_ms ? 0 : c.versions, c.provider, c.star ? "star" : "fanout");
	fflush(stdout);
	if (start_all(&c, &err) != 0) {
		if (!stop_signal)
			fprintf(stderr, "tessera cluster: %s\n", err.msg);
		goto stop;
	}
	status = 0;
	if (c.every_ms > 0) {
		rc = run_clock(&c, &clock);
		if (rc != 0 && !stop_signal) {
			fprintf(stderr, "tessera cluster: the clock run failed (logs in %s)\n", c.dir);
			status = 1;
		}
	}
	for (uint64_t v = 1; c.every_ms == 0 && v <= c.versions; v++) {
		rc = run_version(&c, v);
		if (rc != 0) {
			if (!stop_signal)
				fprintf(stderr, "tessera cluster: v%" PRIu64 " failed (logs in %s)\n", v,
					c.dir);
			status = 1;
			break;
		}
	}
	if (status == 0 && c.every_ms == 0 && (rc = run_late(&c, c.versions)) != 0) {
		if (!stop_signal)
			fprintf(stderr, "tessera cluster: the late replicas failed (logs in %s)\n", c.dir);
		status = 1;
	}
stop:
	stop_all(&c);
	if (stop_signal) {
		/* Stopped on purpose: no run to look into, nothing left behind. */
		fprintf(stderr, "tessera cluster: stopped by SIG%s; every process it started has exited\n",
			sigabbrev_np(stop_signal));
		status = 128 + stop_signal;
	}
	report = json_pack("{s:b,s:s,s:I,s:o}", "ok", status == 0, "mode",
			   c.star ? "star" : "fanout", "wall_ms",
			   (json_int_t)((proto_now_ns() - t0) / 1000000), "versions",
			   json_incref(c.out_versions));
	if (clock != NULL)
		json_object_set(report, "clock", clock);
	if (c.report != NULL && proto_write_json_atomic(c.report, report, JSON_INDENT(1), &err) != 0) {
		fprintf(stderr, "tessera cluster: %s\n", err.msg);
		status = 1;
	}
	printf("tessera cluster: %s in %.1f s%s%s\n",
	       status == 0 ? "ok" : stop_signal ? "stopped" : "FAILED",
	       (double)(proto_now_ns() - t0) / 1e9, c.report ? ", report " : "",
	       c.report ? c.report : "");
	json_decref(report);
	if ((status == 0 || stop_signal) && c.keep == NULL) {
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c.dir);
		if (system(cmd) != 0)
			LOG_WARN("cluster: could not remove %s", c.dir);
	}
out:
	json_decref(clock);
	trk_client_free(c.trk);
	json_decref(c.out_versions);
	for (uint32_t i = 0; i < c.nreps; i++)
		proto_layout_fini(&c.reps[i].layout);
	proto_ckpt_list_free(c.ckpts, c.nckpts);
	proto_model_fini(&c.model);
	return status;
}
