/* The simulator's inside (tests/sim/sim.h): its events and cluster, shared
 * by sim.c (the model, replicas, versions, the run) and sim_net.c (what it
 * replaces: the fabric and verifier, have-page reads, the tracker). */
#ifndef TESSERA_TESTS_SIM_INTERNAL_H
#define TESSERA_TESTS_SIM_INTERNAL_H

#include "node/fetch/fetch.h"
#include "proto/plan.h"
#include "proto/spec.h"
#include "tests/sim/sim.h"
#include "tracker/server/state.h"

/* ---- events ---- */

enum ev_kind {
	E_VERSION,  /* a: version index: exported now */
	E_START,    /* a: rank: hears of the current version */
	E_TICK,     /* a: rank: sources, have-pages, silences */
	E_SOURCES,  /* a: rank, p: its pending /sources request */
	E_UPLINK,   /* a: rank, b: read slot: its source sent it (t0: from when) */
	E_READ,     /* a: rank, b: read slot, gen: x->gen at posting */
	E_VERIFIED, /* the same: its chunk is hashed */
	E_LEAVE,    /* a: host: the replica is gone */
	E_JOIN,     /* a: host: a replica registers */
};

struct ev {
	uint64_t t, seq;
	uint32_t kind, a, b;
	int status;
	uint64_t gen, t0;
	uint32_t len;
	void *p;
};

struct heap {
	struct ev *v;
	size_t n, cap;
};

/* ---- the simulated cluster ---- */

/* A replica's host: its link, shared by its ranks. */
struct host {
	double up_bps, down_bps;
	uint64_t up_free, down_free; /* when its queues are next free, ns */
	uint32_t layout, rank0;      /* its ranks: ranks[rank0 .. rank0 + tp) */
	bool alive;
	bool stayed;                 /* alive through the whole current version */
	bool slow;                   /* a straggler: its link is a tenth */
	uint64_t done_ns;            /* its last rank completed the version (0: not yet) */
	uint64_t weight;             /* trk_member_weight of its replica name and layout */
	uint64_t fetch_bps;          /* its last fetch's rate, as the tracker has it (0: none) */
	uint32_t site;
	uint64_t down_busy_ns;       /* the current version's bytes over its downlink, as time */
};

/* One rank of a replica: a node agent's fetcher. */
struct rank {
	struct fetcher x; /* first: the transport finds the rank from it */
	char id[TRK_ID_MAX];
	uint32_t host, rank, layout;
	uint64_t cpu_free;
	bool fetching;       /* a fetch of the current version is under way or done */
	uint64_t fetch_ns;   /* ... since then */
	struct trk_rate rate; /* the tracker's record of its progress reports (rate.c) */
	uint64_t report_ms;  /* its last report, as node/agent's every REPORT_MS */
};

/* The /sources request a rank has out (the tracker's answer comes later). */
struct sources_req {
	trk_client_cb cb;
	void *arg;
	struct trk_parcel_key k;
	uint32_t site; /* the asker's: the swarm answered is that site's */
};

/* A serving layout's plan, and per version its manifest's parcels. */
struct layout {
	struct proto_layout l;
	struct proto_plan plan;
	struct proto_mlayout ml; /* the current version's */
	struct proto_chunk *chunks;
};

struct sim {
	const struct sim_cfg *c;
	struct sim_result *r;
	struct heap h;
	uint64_t seq, rng;
	struct proto_model model;
	struct proto_layout trainer;
	struct layout lay[SIM_LAYOUTS_MAX];
	uint32_t nlay;
	struct host *hosts;
	uint32_t nhosts, max_hosts;
	struct rank *ranks;
	uint32_t nranks, max_ranks;
	uint32_t chunk;
	uint32_t vi;         /* the current version's index */
	uint64_t v_start;    /* its export, ns */
	bool v_live;
	uint64_t tick_ns;
	uint64_t wan_free[SIM_SITES_MAX]; /* when each site's wide-area link is next free, ns */
	uint64_t members_gen;                       /* bumped when a replica joins or leaves */
	bool rates_new;           /* as the tracker's registry (TRK_MEMBERS_REJUDGE_MS) */
	uint64_t rates_judged_ms;
	struct sim_members *members;                /* the tracker's members lists, kept */
	struct fetch_transport tx;
	struct node_rank_metrics am;
	/* The current version's chunks of layout 0's parcel 0, as its
	 * replicas (their rank 0) verify them: copies so far, and when the
	 * first, half and all of them were had (sim_version.spread_*). */
	struct sim_spread {
		uint32_t nchunks, cap;
		uint32_t want; /* layout 0's replicas alive at the export, stragglers apart */
		struct sim_chunk_spread {
			uint32_t copies;
			uint64_t first, half, all; /* ns (0: not yet) */
		} *c;
	} spread;
	int failed;          /* -errno: stop */
};

/* The clock every fetcher reads (proto_clock_set), ns. */
extern uint64_t sim__clock_ns;
uint64_t sim__now(void);

/* ---- sim_net.c ---- */

/* The tracker's members lists as kept (sources_answer), freed. */
void sim__members_free(struct sim *s);
/* Events, in time order (ties: in the order pushed). */
void sim__push(struct sim *s, struct ev e);
struct ev sim__pop(struct sim *s);
void sim__at(struct sim *s, uint64_t t, uint32_t kind, uint32_t a, uint32_t b);
uint64_t sim__ns(double seconds);
uint64_t sim__latency(const struct sim *s);
/* The run's random numbers (splitmix64 from the seed). */
uint64_t sim__rnd(struct sim *s);
double sim__rnd01(struct sim *s);
/* The tracker: a rank's /sources query (fetcher_opts.sources), answered
 * at the E_SOURCES event. */
int sim__ask_sources(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg);
void sim__sources_due(struct sim *s, struct ev *e);
/* The fabric and the verifier (struct fetch_transport) and their events. */
int sim__tx_read(void *ctx, struct fetcher *x, struct fetch_read *rd, struct fetch_source *src,
		 uint32_t len);
void sim__tx_verify(void *ctx, struct fetcher *x, struct fetch_read *rd);
void sim__uplink(struct sim *s, struct ev *e);
void sim__read_done(struct sim *s, const struct ev *e);
void sim__verified(struct sim *s, const struct ev *e);
/* Have-pages: rk reads those of the peers it lists, as they are now. */
void sim__read_pages(struct sim *s, struct rank *rk);

#endif
