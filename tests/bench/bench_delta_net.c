/* bench_delta_net: delta versions through the whole network on loopback.
 *
 * Usage: bench_delta_net BINDIR DIR (make bench-delta-net passes
 * $(BUILD)/bin and $(BUILD)/bench-delta-net). Writes, once, a 256 MiB
 * `tessera synth` model of 6 steps at lr 1e-6 into DIR/model, then runs
 * `tessera cluster` twice on it with replicas tp2, tp2, tp1: once with
 * anchors only (--anchor-every 1: the bound, measured in the same run) and
 * once with an anchor every 10 versions (v1 an anchor, v2..v7 deltas). For
 * every version it prints the kind, wire bytes against anchor bytes, the
 * time from the manifest's creation to the last replica's activation
 * against the anchor's (v1 of the same run, and the median warm anchor of
 * the anchors-only run), the encode time (also per GiB of the parcels it
 * went over, the anchor's payload: the longest rank's encoding time, the
 * ranks encoding at once, so a throughput of the whole publisher), and where the time went (ms, from
 * the tracker's timeline: publish = export asked to published, fetch = to
 * the last chunk, verify = to the last rank verified, which for a delta
 * includes the rebuild, switch = to the last activation), and the publisher's
 * CPU ms for the version (pub_cpu: snapshot, gather and hash or encode,
 * manifest and signature; snap_cpu: the snapshot), from its start-up log
 * lines (each run is kept in DIR/anchors.run, DIR/deltas.run). Goals: a delta costs at most
 * 3 % of the anchor's wire bytes and at most 15 % of its end-to-end time.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#define MODEL_MB 256
#define STEPS 6
#define VERSIONS (STEPS + 1)
#define WIRE_GOAL 3.0 /* % of the anchor */
#define TIME_GOAL 15.0

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static json_t *run_cluster(const char *bindir, const char *dir, const char *mdir, int every,
			   const char *name)
{
	char cmd[4096], report[1024];

	snprintf(report, sizeof(report), "%s/%s.json", dir, name);
	/* Kept (DIR/NAME.run) for the publisher's log: its start-up lines give
	 * its CPU per version (info level). */
	snprintf(cmd, sizeof(cmd),
		 "rm -rf %s/%s.run && TESSERA_LOG=info %s/tessera cluster --model-dir %s --versions %d "
		 "--anchor-every %d --replica tp2 --replica tp2 --replica tp1 --report %s "
		 "--keep %s/%s.run > %s/%s.out 2>&1",
		 dir, name, bindir, mdir, VERSIONS, every, report, dir, name, dir, name);
	if (system(cmd) != 0) {
		fprintf(stderr, "bench_delta_net: `%s` failed; see %s/%s.out\n", cmd, dir, name);
		return NULL;
	}
	json_error_t e;
	json_t *j = json_load_file(report, 0, &e);
	if (j == NULL)
		fprintf(stderr, "bench_delta_net: %s: %s\n", report, e.text);
	return j;
}

/* The publisher's CPU ms for each version (index v - 1), from its log's
 * start-up lines ("the publisher's CPU ms: snapshot X, encode Y, manifest
 * and signature Z", or "gather and hash Y" for an anchor): the snapshot and
 * the sum of the three; 0 where the line is missing. */
static void pub_cpu(const char *dir, const char *name, uint64_t *snap, uint64_t *total)
{
	char path[1100], line[2048];
	FILE *f;

	memset(snap, 0, VERSIONS * sizeof(*snap));
	memset(total, 0, VERSIONS * sizeof(*total));
	snprintf(path, sizeof(path), "%s/%s.run/publisher.log", dir, name);
	if ((f = fopen(path, "r")) == NULL)
		return;
	while (fgets(line, sizeof(line), f) != NULL) {
		const char *v = strstr(line, "version "), *c = strstr(line, "CPU ms: snapshot ");
		unsigned long long n, x, y, z;
		if (v == NULL || c == NULL || strstr(v, " start-up,") == NULL ||
		    sscanf(v, "version %llu", &n) != 1 || n < 1 || n > VERSIONS ||
		    sscanf(c, "CPU ms: snapshot %llu, %*[a-z ] %llu, manifest and signature %llu", &x,
			   &y, &z) != 3)
			continue;
		snap[n - 1] = x;
		total[n - 1] = x + y + z;
	}
	fclose(f);
}

/* From the manifest's creation to the last replica's activation, ms. */
static uint64_t last_activation(json_t *v)
{
	uint64_t t = 0;
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(v, "replicas"), i, r) {
		uint64_t x = (uint64_t)json_integer_value(json_object_get(r, "t_activate_ms"));
		t = x > t ? x : t;
	}
	return t;
}

/* The largest field among the version's replicas' ranks (timeline). */
static uint64_t rank_max(json_t *tl, const char *field)
{
	uint64_t t = 0;
	size_t i, k;
	json_t *r, *rk;
	json_array_foreach(json_object_get(tl, "replicas"), i, r)
		json_array_foreach(json_object_get(r, "ranks"), k, rk) {
			uint64_t x = (uint64_t)json_integer_value(json_object_get(rk, field));
			t = x > t ? x : t;
		}
	return t;
}

static uint64_t span(uint64_t from, uint64_t to)
{
	return from != 0 && to > from ? to - from : 0;
}

/* Where a version's time went, from the tracker's timeline: the publisher
 * (export asked to published: snapshot, gather, hash, encode), the fetch
 * (to the last rank's last chunk), verification or the delta's rebuild (to
 * the last rank verified) and the switch (to the last activation). */
static void breakdown(json_t *v)
{
	json_t *tl = json_object_get(v, "timeline");
	uint64_t asked = (uint64_t)json_integer_value(json_object_get(tl, "export_asked_ms"));
	uint64_t pub = (uint64_t)json_integer_value(json_object_get(tl, "published_ms"));
	uint64_t last = rank_max(tl, "last_byte_ms"), ver = rank_max(tl, "verified_ms");
	uint64_t act = rank_max(tl, "activated_ms");
	printf(" %9llu %9llu %9llu %9llu", (unsigned long long)span(asked, pub),
	       (unsigned long long)span(pub, last), (unsigned long long)span(last, ver),
	       (unsigned long long)span(ver, act));
}

int main(int argc, char **argv)
{
	char mdir[1024], cmd[4096], probe[1100];
	struct stat st;

	if (argc != 3) {
		fprintf(stderr, "usage: bench_delta_net BINDIR DIR\n");
		return 2;
	}
	mkdir(argv[2], 0755);
	snprintf(mdir, sizeof(mdir), "%s/model", argv[2]);
	snprintf(probe, sizeof(probe), "%s/v%d.safetensors", mdir, STEPS);
	if (stat(probe, &st) != 0) {
		snprintf(cmd, sizeof(cmd), "%s/tessera synth -o %s --synthetic-mb %d --steps %d --lr 1e-6",
			 argv[1], mdir, MODEL_MB, STEPS);
		printf("bench_delta_net: %s\n", cmd);
		fflush(stdout);
		if (system(cmd) != 0)
			return 1;
	}
	json_t *base = run_cluster(argv[1], argv[2], mdir, 1, "anchors");
	json_t *run = base ? run_cluster(argv[1], argv[2], mdir, 10, "deltas") : NULL;
	if (run == NULL)
		return 1;

	/* The bound: the anchors-only run's warm anchors (v2..), median. */
	uint64_t warm[VERSIONS];
	size_t nw = 0, i;
	json_t *v;
	json_array_foreach(json_object_get(base, "versions"), i, v)
		if (i > 0)
			warm[nw++] = last_activation(v);
	qsort(warm, nw, sizeof(*warm), cmp_u64);
	uint64_t warm_ms = nw ? warm[nw / 2] : 0;

	json_t *vs = json_object_get(run, "versions");
	json_t *v1 = json_array_get(vs, 0);
	uint64_t anchor_ms = last_activation(v1);
	uint64_t anchor_bytes = (uint64_t)json_integer_value(json_object_get(v1, "anchor_bytes"));
	printf("replicas tp2 tp2 tp1, %d MiB synth model, lr 1e-6; anchor v1 %llu ms, warm anchor "
	       "(anchors-only run, median of v2..v%d) %llu ms\n",
	       MODEL_MB, (unsigned long long)anchor_ms, VERSIONS, (unsigned long long)warm_ms);
	/* What the encoder went over: every parcel of the version as it is
	 * (the anchor's payload, each layout once). */
	double raw_gib = (double)json_integer_value(json_object_get(v1, "payload_bytes")) /
			 (double)(1u << 30);
	uint64_t snap_cpu[VERSIONS], pub_cpu_ms[VERSIONS], dcpu[VERSIONS];
	size_t nd = 0;
	pub_cpu(argv[2], "deltas", snap_cpu, pub_cpu_ms);
	printf("%-3s %-7s %14s %14s %9s %9s %11s %11s %10s %9s %9s %9s %9s %9s %9s %9s\n", "v",
	       "kind", "wire_bytes", "anchor_bytes", "wire/anc", "time_ms", "t/anchor",
	       "t/warm_anc", "encode_ms", "enc_s/GiB", "publish", "fetch", "verify", "switch",
	       "pub_cpu", "snap_cpu");
	double worst_wire = 0, worst_t = 0, worst_tw = 0;
	bool ok = true;
	json_array_foreach(vs, i, v) {
		const char *kind = json_string_value(json_object_get(v, "kind"));
		uint64_t wire = (uint64_t)json_integer_value(json_object_get(v, "wire_bytes"));
		uint64_t anc = (uint64_t)json_integer_value(json_object_get(v, "anchor_bytes"));
		uint64_t t = last_activation(v);
		double w = anc ? 100.0 * (double)wire / (double)anc : 0;
		double tr = anchor_ms ? 100.0 * (double)t / (double)anchor_ms : 0;
		double tw = warm_ms ? 100.0 * (double)t / (double)warm_ms : 0;
		double enc = json_real_value(json_object_get(v, "encode_ms"));
		printf("%-3zu %-7s %14llu %14llu %8.2f%% %9llu %10.1f%% %10.1f%% %10.1f %9.2f", i + 1,
		       kind, (unsigned long long)wire, (unsigned long long)anc, w,
		       (unsigned long long)t, tr, tw, enc, raw_gib > 0 ? enc / 1000.0 / raw_gib : 0.0);
		breakdown(v);
		printf(" %9llu %9llu\n", (unsigned long long)(i < VERSIONS ? pub_cpu_ms[i] : 0),
		       (unsigned long long)(i < VERSIONS ? snap_cpu[i] : 0));
		ok &= json_is_true(json_object_get(json_array_get(json_object_get(v, "replicas"), 0),
						   "digest_ok"));
		if (kind != NULL && strcmp(kind, "delta") == 0) {
			worst_wire = w > worst_wire ? w : worst_wire;
			worst_t = tr > worst_t ? tr : worst_t;
			worst_tw = tw > worst_tw ? tw : worst_tw;
			if (i < VERSIONS)
				dcpu[nd++] = pub_cpu_ms[i];
		}
	}
	(void)anchor_bytes;
	printf("worst delta: wire %.2f %% of the anchor (goal <= %.0f %%: %s); end to end %.1f %% of "
	       "anchor v1, %.1f %% of the warm anchor (goal <= %.0f %%: %s)\n",
	       worst_wire, WIRE_GOAL, worst_wire <= WIRE_GOAL ? "met" : "MISSED", worst_t, worst_tw,
	       TIME_GOAL, worst_tw <= TIME_GOAL ? "met" : "MISSED");
	qsort(dcpu, nd, sizeof(*dcpu), cmp_u64);
	printf("publisher CPU per delta (its start-up lines: snapshot, encode, manifest and "
	       "signature): median %llu ms\n", nd ? (unsigned long long)dcpu[nd / 2] : 0ull);
	printf("every replica bit-exact on every version: %s\n",
	       ok && json_is_true(json_object_get(run, "ok")) ? "yes" : "NO");
	json_decref(base);
	json_decref(run);
	return 0;
}
