/*
 * The fanout simulator: the node's own fetching code (node/fetch: picker,
 * owner split and seed readers, upload budgets, pacing, silence, source
 * lists, the read pool and its verdicts, the pump) run for many replicas on
 * simulated time, links and CPUs. What it replaces, and how:
 *
 *   the clock      proto_clock_set: one clock, advanced event by event;
 *   the fabric     struct fetch_transport: a read crosses its source's
 *                  uplink and its reader's downlink, each a queue served at
 *                  its rate in order, plus the one-way latency each way;
 *   the verifier   the same: a chunk's hash costs its reader's CPU
 *                  cpu_ns_per_byte, one chunk after another;
 *   have-pages     every TESSERA_HAVE_POLL_MS a rank copies the pages of the
 *                  peers it lists, as they are then (no chase period);
 *   the tracker    /sources answers made as tracker/server/sources.c makes
 *                  them: the members of the parcel's swarm (rank dst of
 *                  every live replica of the layout), the live ones that
 *                  offer the version (shuffled), then the publisher; after
 *                  a round trip.
 *
 * It is deterministic for a seed: same configuration, same output, on any
 * machine. tests/sim/README.md says what it was checked against.
 */
#ifndef TESSERA_TESTS_SIM_H
#define TESSERA_TESTS_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/util.h"

#define SIM_LAYOUTS_MAX 4 /* tp1, tp2, tp4, tp8 */
#define SIM_VERSIONS_MAX 16
#define SIM_SITES_MAX 16

struct sim_cfg {
	uint32_t replicas;
	/* Serving layouts, given to replicas in turn: ranks of each (1, 2, 4
	 * or 8; one tensor split by rows). */
	uint32_t tp[SIM_LAYOUTS_MAX];
	uint32_t ntp;
	uint64_t model_bytes;   /* the anchor's bytes */
	uint32_t versions;      /* the first an anchor, the others deltas */
	bool anchors;           /* ... or anchors too */
	double delta_ratio;     /* a delta's wire bytes over the anchor's */
	double link_bps;        /* each replica host's link, each direction, bytes/s */
	double trainer_bps;     /* the publisher's uplink, bytes/s */
	double latency_ms;      /* one way, every path */
	double cpu_ns_per_byte; /* a rank's hashing cost */
	double stragglers;      /* share of replica hosts whose link is a tenth */
	double churn;           /* share of replicas that leave, and as many that join, per version */
	/* Sites (tracker/API.md, "Sites"): replicas in turn in sites 0..sites-1
	 * (0, 1: one site), the trainer in site 0; what the trainer sends
	 * another site crosses that site's wide-area link (wan_bps, 0: no
	 * cap; wan_latency_ms more each way). */
	uint32_t sites;
	double wan_bps, wan_latency_ms;
	bool star;              /* peers are not sources (TESSERA_FANOUT=0) */
	uint64_t seed;
	double max_sim_s;       /* a version not done by then ends the run */
	FILE *curve;            /* not NULL: "version replica seconds" per replica done */
};

/* Per version: S is the bytes one replica receives (its wire bytes), b the
 * replica link rate; times are from the version's export. */
struct sim_version {
	bool delta;
	uint64_t wire_bytes;     /* S */
	/* Replicas that stayed the whole version, stragglers apart (their
	 * own links are a tenth: t_slow_s is the last of them, 0: none). */
	double t_last_s, t_p50_s, t_p99_s, t_slow_s;
	uint32_t done, stayed;   /* replicas done; those that stayed (stragglers too) */
	uint64_t trainer_bytes;  /* sent by the publisher */
	uint64_t wan_bytes;      /* ... of them, into other sites than the trainer's */
	uint64_t duplicate_bytes; /* received twice (fetch.duplicate), all ranks */
	uint64_t received_bytes; /* verified, all ranks */
	uint64_t tracker_requests;
	double span_s;           /* export to the last replica done */
	double trainer_s;        /* export to the trainer's last byte sent */
	/* Where the time over S/b goes: the replicas' downlinks idle before
	 * they were done (mean over those that stayed, stragglers apart, x
	 * S/b), and how long a chunk took from its first copy at a replica to
	 * half and to all of them (stragglers apart; median over the chunks
	 * of the first layout's first parcel, in chunk times at b; "all" are
	 * as many as were alive at the export: with churn, joiners count). */
	double down_idle;
	double spread_half, spread_all;
};

struct sim_result {
	uint32_t nversions;
	struct sim_version v[SIM_VERSIONS_MAX];
	uint64_t events;
	double wall_s;
};

/* Defaults: 8 tp1 replicas, 128 MiB, one anchor, 100 Mbit/s links, the
 * trainer's as fast, 0.1 ms, 1 ns/B, seed 1. */
void sim_cfg_default(struct sim_cfg *c);
/* Runs c: 0, or -errno with why in err (a bad configuration, no memory, a
 * version not done within max_sim_s). */
int sim_run(const struct sim_cfg *c, struct sim_result *r, struct proto_err *err);
/* The one-line summary of version v of r (what bench-sim prints). */
void sim_line(const struct sim_cfg *c, const struct sim_result *r, uint32_t v, char *out,
	      size_t cap);

#endif
