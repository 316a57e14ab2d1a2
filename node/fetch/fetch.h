/*
 * Fetching one version's bytes for one rank: the parcels its plan owes the
 * rank, read chunk by chunk from their sources (publishers and swarm peers
 * the tracker lists, and cross-layout holders), each read paced by what its
 * source's host delivers, every chunk hashed against the signed manifest
 * before it counts (node/fetch/verifier.h). A node agent (node/agent/) owns
 * one fetcher per rank and hands it each version's fetch; the fetcher calls
 * back up only through its hooks (struct fetch_hooks).
 *
 *   fetcher.c  the fetcher and a fetch: setup, the parcels a manifest owes
 *              the rank, the current fetch, teardown
 *   pace.c     sources: pacing per source and per host, silence, kept
 *              connections
 *   picker.c   which chunk to read next, from whom (node/fetch/picker.h)
 *   owners.c   who reads which of the trainer's chunks; what peers hold
 *   sources.c  the tracker's source lists, merged into the parcels'
 *   reads.c    the read pool: posting reads, landing them, the verdict on
 *              each chunk; a chunk's state as our have-page shows it
 *   bans.c     peers that sent chunks failing their hash
 *   pump.c     posting reads until the windows are full; silent sources
 *   wires.c    buffers for a delta parcel's encoded bytes, kept across
 *              versions
 *
 * Sources of chunks: publishers and swarm peers are the sources the tracker
 * lists, which the fetcher reads itself (fetch_read_post: one-sided reads,
 * a peer's chunk gathered from its version slot); cross-layout holders are
 * a source kind of their own, behind two hooks (holders_post,
 * holders_serve: node/swarm/xl_read.c). A fetch is freed through
 * swarm_release (node/swarm/swarm.h), which withdraws what the swarm
 * serves of it first.
 *
 * Everything here runs on the agent's libevent loop; the verifier's workers
 * touch only a job's bytes and its destination.
 */
#ifndef NODE_FETCH_H
#define NODE_FETCH_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "fabric/fab.h"
#include "node/base/clock.h"
#include "node/base/rank_metrics.h"
#include "node/fetch/verifier.h"
#include "node/serve/serve.h"
#include "node/store/store.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define BAD_SOURCE_MS 2000  /* a failed source rests this long */
#define SOURCES_MIN_MS 300  /* least time between two /sources for a parcel */
#define WINDOW_MIN_CHUNKS 2 /* least read window per source, chunks */
#define RATE_SAMPLE_MS 250  /* least stretch a source's rate is measured over */
#define BAN_BAD_CHUNKS 2    /* bad chunks from one peer that ban it for the version */
#define BANS_MAX 64         /* peers banned per version at most (reported) */
#define MEMBERS_MAX 4096    /* swarm members of a parcel taken from /sources */
#define ENDGAME_MS 1000     /* a last chunk out this long is also asked elsewhere */
#define PEER_STALL_MS 2000  /* a peer delivering nothing this long is silent */
#define STARVE_MS 1000      /* no chunk for this long: also take what a peer is fetching */
#define SWARM_REFRESH_MS 1000 /* sources asked again while fetching (new swarm members) */
#define SOURCES_EARLY_MS 50 /* ... and while a parcel lists no publisher early in a fetch */
#define SOURCES_EARLY_FOR_MS 3000 /* ... "early": this long after the fetch started */
#define HAVE_WAIT_MS 300    /* a newly listed peer's have-page is waited for this long at most */
#define NO_SOURCE_MS 2000   /* chunks without any usable source this long: said (once) */
#define HAVE_SLOT_MAX (64u << 10) /* largest have-page read (parcels past it: no swarm) */
/* Most ranges of its slot a chunk a node serves from there may span: a
 * reader gathers them with fab_readv, fab_rma_segs ranges a read, those
 * reads together one chunk read. Chunks over it are copied after their
 * have-page (fetch_chunk_copied). */
#define GATHER_RANGES 32

/* A chunk's state in its parcel (fetch_parcel.state). */
enum fetch_chunk {
	CHUNK_TODO = 0,      /* nobody of ours reads it */
	CHUNK_READING = 1,   /* reads of it in flight (nlive) */
	CHUNK_DONE = 2,      /* verified and in place */
	CHUNK_VERIFYING = 3, /* its bytes landed, a worker hashes them */
};

/*
 * One source of a parcel: a publisher or a swarm peer as the tracker
 * listed it (info), or a cross-layout holder's rank (node/swarm/xl_read.c), with
 * what this node learned of it. Pacing (inflight, rate, progress) is kept
 * on the record of its host (hp) when it has one (pace.c, fetch_pace()).
 */
struct fetch_source {
	struct trk_source info;
	fi_addr_t fa;
	bool fa_valid;
	uint64_t bad_until_ms; /* resting after a failure until then */
	/* Pacing (pace.c): */
	uint64_t inflight_bytes;
	uint32_t inflight_reads;
	uint64_t rate;            /* measured bytes/s while busy; 0: not yet */
	uint64_t meas_ms, meas_bytes; /* the measurement under way */
	uint64_t progress_ms;     /* a read completed, or it became busy */
	/* A peer: the latest post time of its have-page reads that were
	 * answered: it was alive then (fetch_source_silent). */
	uint64_t answered_ms;
	bool silent_logged;       /* "no other source" said for this silence */
	bool congested_logged;    /* "answers its have-page" said for this silence */
	/* A peer's have-page (node/swarm/have.c): its have then busy bitmaps,
	 * as last read; NULL until read. */
	uint8_t *have;
	uint64_t have_ms;         /* when the last read of it was posted */
	uint64_t have_page_ms;    /* when the read of the page we hold was posted */
	bool have_busy;           /* a read of it is in flight */
	/* Where its have-page says the parcel's bytes are: its version slot
	 * (len != 0: chunks are gathered from the slot's spans), else right
	 * after the page (the offer's addr). */
	struct fab_rkey slot_rk;
	uint32_t slot_ranges; /* chunks over this many ranges follow the page */
	bool self;                /* it is us: never read from */
	uint64_t listed_ms;       /* first listed by the tracker */
	uint64_t unlisted_ms;     /* the tracker stopped listing it: since when (0: listed) */
	/* A peer's upload budget, as its have-page announces it, and what it
	 * leaves us (owners.c): refused, we are not among the readers it
	 * serves; else our share of its rate, bytes/s (0: no cap), spent from
	 * a bucket of tokens. */
	uint32_t up_peers, up_mbps;
	bool up_refused;
	uint64_t up_bps, up_tokens, up_ns;
	/* The pacing record every source on its host shares (pace.c): rate,
	 * window and silence are its; NULL: paced on its own. */
	struct fetch_source *hp;
	/* Its index in the parcel's members (UINT32_MAX: none), as matched
	 * by name when its members were last taken: valid while member_epoch
	 * is the parcel's members_epoch (fetch_source_member). */
	uint32_t member, member_epoch;
};

/* FNV-1a of the string s from h (FETCH_FNV_BASIS, or it varied by a
 * parcel or chunk): the node ids' hashes the picker and the owner split
 * agree on across nodes. Its low bits mix poorly: finish it before a
 * modulus of a small number. */
#define FETCH_FNV_BASIS 1469598103934665603ull
static inline uint64_t fetch_fnv(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

/* The pacing s follows: its host's, or its own. */
static inline struct fetch_source *fetch_pace(const struct fetch_source *s)
{
	return s->hp != NULL ? s->hp : (struct fetch_source *)s;
}

/* One parcel of the fetch: its chunks' state, its sources, what the swarm
 * holds of it, and (served to peers) the have-page in front of its bytes. */
struct fetch_parcel {
	const struct proto_mparcel *mp; /* in the fetch's manifest */
	const struct proto_parcel *pp;  /* in the plan */
	struct fetch_source *srcs;
	size_t nsrcs;
	uint32_t rr;        /* round-robin position among sources */
	uint32_t src_epoch; /* bumped whenever srcs is replaced */
	uint64_t sources_ms;
	bool sources_pending;
	uint8_t *state; /* per chunk: enum fetch_chunk */
	uint8_t *asked; /* per chunk: a read was posted for it before */
	uint32_t done;  /* chunks verified */
	/* Served to peers (node/swarm/offer.c): the region of its have-page,
	 * then its bytes; NULL: not served. */
	uint8_t *held;
	size_t held_cap;
	uint32_t head;       /* bytes of the have-page in front of the parcel */
	struct fab_mr *held_mr;
	bool from_slot;      /* its chunks are served from the fetch's slot (slot_mr),
			      * those over one gathering read's ranges copied after the
			      * have-page (fetch_chunk_copied) */
	/* What the picker weighs (owners.c keeps them): */
	uint8_t *nlive;      /* per chunk: reads of it in flight */
	uint16_t *avail;     /* per chunk: peers whose have-page lists it */
	uint8_t *peer_busy;  /* per chunk: a peer is fetching it */
	uint64_t *busy_ms;   /* per chunk: since when a peer is fetching it (0: none is) */
	uint8_t *mine;       /* per chunk: we own it (we ask the trainer for it first) */
	uint32_t *owner;     /* per chunk: its owner's index in members (UINT32_MAX: us, or unknown) */
	uint8_t *owner_on;   /* per chunk: its owner serves this parcel (a usable peer) */
	uint8_t *standin;    /* per chunk: we stand in for its owner (fetch_pick_steal) */
	uint32_t rot;        /* where our walk over its chunks starts */
	uint64_t progress_ms; /* a chunk of it verified (or the fetch started) */
	bool hungry;          /* it starved once: any unheld chunk may come from the trainer */
	bool ahead;           /* we hold more of it than the median peer's page shows */
	char (*members)[TRK_ID_MAX]; /* its swarm as the tracker last listed it */
	uint32_t nmembers;
	uint32_t members_epoch; /* bumped when members are taken and matched to srcs (0: never) */
	bool seed;           /* we read it from the trainer (TESSERA_PUB_UPLOAD_READERS) */
	uint32_t nowners;    /* seed readers sharing its trainer's chunks, us included */
	bool sampled;        /* the tracker lists a sample of its peers (TESSERA_SWARM_PEERS) */
	bool members_cut;    /* ... and only some of its members (TESSERA_SWARM_MEMBERS) */
	uint64_t owners_key; /* what owner/mine/standin were split by (owners.c; 0: none) */
	uint8_t *wire;  /* a delta parcel's bytes (wires.c), else NULL */
	uint8_t landed; /* a delta parcel's wire is whole, for the apply (atomic) */
};

/* A read of one chunk: in the fabric, then verifying. Reads belong to the
 * fetcher's pool and outlive fetches: one of a dropped fetch lands into its
 * slot and is ignored (gen). */
struct fetch_read {
	struct fab_op op;
	struct fetcher *x;
	uint32_t parcel, chunk, slot, len;
	uint32_t src_idx, src_epoch; /* srcs[src_idx] while the epoch holds */
	bool src_peer;
	bool src_far; /* its source is in another site than ours */
	struct fetch_source *hp; /* its source's host record, given back at landing */
	bool xl; /* assembled from a cross-layout holder (node/swarm/xl_read.c) */
	char src_id[TRK_ID_MAX]; /* the source's id (bans outlive source lists) */
	/* A chunk gathered from a peer's slot: its ranges and the reads that
	 * take them (each lands after the one before), in a block the slot
	 * gets at its first gather and keeps (7 KiB: kept inline, it made
	 * every slot that large, and a walk over the slots touched a page
	 * per slot); how many are still out and the first failure; it lands
	 * when the last completes. */
	struct fetch_gather_set {
		struct fab_seg segs[GATHER_RANGES];
		struct fetch_gather {
			struct fab_op op;
			struct fetch_read *rd;
		} gops[GATHER_RANGES];
	} *g;
	uint32_t gleft;
	int gstatus;
	bool gathered; /* from the peer's slot (those reads) */
	uint64_t started_ms;
	/* Chunks of one fabric read (the first's op) in slots slot..slot+run-1,
	 * on the first read; 0 on the others, 1 alone. */
	uint32_t run;
	bool abandoned; /* moved elsewhere: its slot stays reserved until completion */
	bool busy;      /* the slot holds this read (in fabric or verifying) */
	bool in_fabric; /* posted, not completed */
	struct node_vjob job;
	struct node_slot *vslot; /* the slot job places into (uploads while fetching) */
	uint64_t gen; /* fetch generation it belongs to */
};

/* One version's transfer for this rank. Made by fetch_new, filled by the
 * agent (manifest, plan, slot, then fetch_parcels), run by the fetcher
 * while it is the current one (fetch_begin), freed by fetch_free. */
struct fetch {
	uint64_t version;
	struct proto_manifest man;
	bool have_man;
	const struct proto_mlayout *ml;
	const struct proto_plan *plan;
	struct node_slot *slot; /* where chunks are scattered (NULL: a delta in place) */
	bool delta;  /* its parcels are delta-encoded: bytes kept in wire, not scattered */
	bool full;   /* a delta version taken whole: its chunks from holders only */
	bool complete; /* every chunk verified: nothing more is read */
	struct fetch_parcel *parcels;
	uint32_t nparcels;
	uint64_t bytes_total, bytes_done, from_trainer, from_peers;
	uint64_t from_other_sites; /* of those, from sources in another site */
	uint64_t refetched; /* bytes requested again (failed, bad or moved reads) */
	bool trainer_late;  /* a read of the trainer's last wave is late (picker.c) */
	uint64_t peer_bytes; /* in flight from peers, as trainer_late was judged */
	uint64_t late_judged_ms; /* when trainer_late was last judged */
	uint64_t duplicate; /* bytes received for chunks we had or were verifying */
	/* Peers that sent bad chunks this version: their ids and counts; a
	 * peer at BAN_BAD_CHUNKS is banned until the version is done. */
	char (*bad_ids)[TRK_ID_MAX];
	uint8_t *bad_counts;
	uint32_t nbad, nbanned;
	struct node_serve_offer so; /* our offer of its parcels (node/swarm/offer.c) */
	/* Its slot, registered once for peers' reads of the parcels served
	 * from it; closed before the slot can be freed or written by anything
	 * but the verifier. Outlives slot moving to the agent's active one:
	 * a kept version is served from the active slot. */
	struct fab_mr *slot_mr;
	bool served; /* its parcels are registered and offered (or to be) */
	uint64_t started_ms;
	uint64_t faults0; /* the process's page faults when it started */
	uint64_t first_byte_ms, last_byte_ms; /* wall clock: chunks landed */
	uint64_t first_post_ms;
	/* Until when (node_now_ms) no peer can hold a chunk we own: the
	 * version was fresh when we heard of it; 0 if not. */
	uint64_t fresh_until_ms;
	/* Its start-up, wall clock ms (0: not yet): the watch answer that
	 * named it, the signed manifest in, the parcels set, the first
	 * /sources answer, have-page and read posted; logged with the first
	 * byte, on the clock of the manifest's created_ms. */
	struct {
		uint64_t watch, manifest, parcels, sources, have, read;
	} su;
	/* Per-chunk trouble, tallied and logged once per version (the first
	 * of each kind at warn, the rest at debug, totals on the way out). */
	uint32_t stalls, bad_chunks, read_failures;
	uint32_t congested; /* peers past their patience that answered their have-page */
	/* What the layer above keeps with this fetch (the agent's record of
	 * the version), released first by fetch_free; NULL: nothing. */
	void *up;
	void (*up_free)(void *up);
};

/* The source a read went to, if the parcel's source list is still the one
 * it was picked from. */
static inline struct fetch_source *fetch_read_source(const struct fetch *f,
						     const struct fetch_read *rd)
{
	struct fetch_parcel *p = &f->parcels[rd->parcel];

	return rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs ? &p->srcs[rd->src_idx]
								       : NULL;
}

/*
 * What the fetcher tells the layers above it and asks of them: the swarm
 * and the cross-layout holders (node/swarm/), and the version's lifecycle
 * (node/agent/). Set once by the agent; every hook may be NULL.
 */
struct fetch_hooks {
	void *swarm; /* the first argument of the swarm's hooks */
	/* Parcel pi has a new source list (its owners are recomputed). */
	void (*sources_changed)(void *swarm, uint32_t pi);
	/* Parcel p's sources moved in the list (moved[j]: old index j's new
	 * one + 1, 0: gone) into ns, before p->src_epoch moves on: reads in
	 * flight to a source still listed follow it. */
	void (*sources_moved)(void *swarm, const struct fetch_parcel *p, const uint32_t *moved,
			      struct fetch_source *ns);
	/* Chunk c of parcel pi is verified and in its slot. */
	void (*chunk_verified)(void *swarm, uint32_t pi, uint32_t c);
	/* Cross-layout holders, a source kind of their own: post a read of a
	 * chunk of parcel pi (hint if still to fetch): 1 posted; 0 none can
	 * serve it (go on with the trainer); -1 they can but not now (wait
	 * for them, not the trainer). */
	int (*holders_post)(void *swarm, uint32_t pi, uint32_t hint);
	/* A usable holder exists (somewhere to move a silent source's reads). */
	bool (*holders_serve)(void *swarm);

	void *agent; /* the first argument of the lifecycle's hooks */
	/* Every chunk of delta parcel pi is verified, the fetch's last not yet. */
	void (*parcel_landed)(void *agent, uint32_t pi);
	/* Every chunk of the fetch is verified. */
	void (*complete)(void *agent);
	/* A peer was banned (the state report names it). */
	void (*banned)(void *agent);
};

/*
 * How a read's bytes travel and are checked, when not over the fabric and
 * the verifier's workers: the simulator (tests/sim/) runs the fetcher
 * whole on simulated links and CPUs through it. Both calls answer later,
 * on the loop, never from inside themselves.
 */
struct fetch_transport {
	void *ctx;
	/* Posts rd, the first of rd->run reads of chunks laid end to end
	 * (len bytes in all), from s: 0, then fetch_read_landed for each of
	 * them; or -errno, nothing out. */
	int (*read)(void *ctx, struct fetcher *x, struct fetch_read *rd, struct fetch_source *s,
		    uint32_t len);
	/* Hashes rd's landed chunk: fetch_read_verified(rd, ok) later. */
	void (*verify)(void *ctx, struct fetcher *x, struct fetch_read *rd);
};

/* What the fetcher needs of its rank, set once by the agent. */
struct fetcher_opts {
	struct event_base *base;
	const char *id;             /* the rank's node id (borrowed: it may change at registration) */
	uint32_t rank;
	const struct proto_layout *layout;
	struct node_store *store;
	struct trk_client *trk;
	struct fab_ctx *fab;        /* chunk reads */
	struct node_fabloop *fl;
	struct fab_ctx *hfab;       /* have-page reads (NULL: fab) */
	struct node_fabloop *hfl;
	/* Sources queries (NULL: trk_client_sources_key): a host of several
	 * ranks batches them (node/host/host_sources.c). */
	int (*sources)(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg);
	void *sources_ctx;
	struct node_rank_metrics *am; /* the rank's series (not NULL; its registry may be) */
	struct fetch_hooks hooks;
	/* NULL: reads go over fab and are hashed by the verifier's workers. */
	const struct fetch_transport *tx;
};

/* The per-rank fetching machinery: the read pool and the current fetch. */
struct fetcher {
	struct fetcher_opts o;
	bool fanout; /* TESSERA_FANOUT: peers are sources */
	/* The read pool (reads.c): reads land in the bounce buffer, are
	 * hashed, then scattered. */
	uint8_t *bounce;
	size_t bounce_len;
	struct fab_mr *bounce_mr;
	struct node_verifier *verifier;
	struct fetch_read *reads;
	uint32_t nreads, inflight, max_inflight;
	uint32_t chunk_size;
	/* Fetch rate cap (token bucket; rate 0: none), so pulling a version
	 * cannot starve the serving traffic that shares the host's links. */
	uint64_t rate_bps, tokens, tokens_ns;
	struct event *rate_ev;
	/* The fetch under way (fetch_begin), and the generation reads carry. */
	struct fetch *f;
	uint64_t gen;
	/* The members list last heard per parcel swarm, with its tag
	 * (sources.c): {"<layout hex>/<src>/<dst>":{"tag":..,"members":[..]}}. */
	json_t *members_memo;
	/* Since when some chunks of the fetch have no usable source (0: all
	 * have one), and whether that was said (pump.c); kept across fetches
	 * of the version. */
	uint64_t nosrc_ms, nosrc_gen;
	bool nosrc_said;
	/* When silences were last judged (fetch_silence_due); 0: a late tick
	 * judged nothing. */
	uint64_t silence_ms;
	/* Pacing per source host (pace.c); NULL until first needed. */
	struct fetch_source *hosts;
	uint32_t nhosts;
	/* Kept connections: a fabric handle per source address reached, held
	 * across versions (pace.c); NULL until first needed. */
	struct fetch_conn *conns;
	uint32_t nconns;
	uint64_t conns_clock;
	/* Delta wire buffers kept between versions (wires.c). */
	struct fetch_wires *wires;
	bool wires_closed; /* torn down: buffers given back are freed */
};

/* The bytes of the rank's block (its slot's length). */
static inline size_t fetch_rank_bytes(const struct fetcher *x)
{
	return x->o.layout->ranks[x->o.rank].nbytes;
}

/* ---- fetcher.c ---- */

/* Sets up the fetcher: its read buffers registered with o->fab, the
 * verifier's workers. 0, or an error in err (fetcher_fini cleans up). */
int fetcher_init(struct fetcher *x, const struct fetcher_opts *o, struct proto_err *err);
/* Teardown around the shared endpoint's fab_close (whose cancelled
 * operations call back): fetcher_stop frees the timers and detaches the
 * fetch; after fab_close, fetcher_quiesce stops the verifier's workers (no
 * worker touches a fetch after it: fetches may be freed, fetch_free works
 * without the endpoint), and fetcher_fini, after the fetches, frees the
 * rest (it quiesces first when that was not done). */
void fetcher_stop(struct fetcher *x);
void fetcher_quiesce(struct fetcher *x);
void fetcher_fini(struct fetcher *x);
/* The regions the fetcher registered, closed while the endpoint is still
 * open (a setup that failed half way). */
void fetcher_close_regions(struct fetcher *x);
/* Waits until no verifier worker touches a job (the fetch's slot, its
 * served pages); queued jobs are finished first. Cannot fail. */
void fetch_drain(struct fetcher *x);
/* A fetch of version v started now (NULL when out of memory). */
struct fetch *fetch_new(uint64_t v);
/* Whether f's parcels for rank are delta-encoded (f->ml set). */
bool fetch_is_delta(const struct fetch *f, uint32_t rank);
/* Our layout's parcels of f's manifest (f->ml, f->plan, f->delta set):
 * checked against the plan and allocated; delta parcels get their wire
 * buffers. 0, -ENOMEM, or -EBADMSG, with why in err. */
int fetch_parcels(struct fetcher *x, struct fetch *f, struct proto_err *err);
/* f is the fetch under way from now on (reads of the one before are
 * abandoned: they land and are ignored). */
void fetch_begin(struct fetcher *x, struct fetch *f);
/* No fetch is under way any more: reads in flight are abandoned. */
void fetch_end(struct fetcher *x);
/* Frees f (not under way; NULL is fine): what the layer above keeps with
 * it first (f->up_free), then its sources, parcels, wires, its slot if it
 * still has one, its manifest. What the swarm serves of it must be
 * withdrawn first (swarm_release does both). */
void fetch_free(struct fetcher *x, struct fetch *f);
/* ---- bans.c ---- */

/* A chunk from the peer with this id failed its hash; true when that bans it. */
bool fetch_bad_peer(struct fetcher *x, struct fetch *f, const char *id);
bool fetch_banned(const struct fetch *f, const char *id);
/* The ids f banned, at most max, into ids (borrowed from f); how many. */
uint32_t fetch_bans(const struct fetch *f, const char **ids, uint32_t max);

/* ---- pace.c ---- */

/* A source's read window (publishers and holders): its host's measured
 * rate times TESSERA_FETCH_TARGET_MS, WINDOW_MIN_CHUNKS..TESSERA_INFLIGHT
 * chunks. */
uint64_t fetch_source_window(const struct fetcher *x, const struct fetch_source *s);
/* Its host delivered nothing for its patience while reads were out. */
bool fetch_source_silent(const struct fetch_source *s, uint64_t now);
/* A peer past its patience that answers its have-page: congested. */
bool fetch_source_congested(const struct fetch_source *s, uint64_t now);
/* A have-page read of s posted at posted_ms was answered: its host is
 * alive as of then. Cannot fail. */
void fetch_source_answered(struct fetch_source *s, uint64_t posted_ms);
/* How long s takes for bytes at its measured rate; 0 while unmeasured. */
uint64_t fetch_source_queue_ms(const struct fetch_source *s, uint64_t bytes);
/* s has a fabric handle (inserted now if need be); false, with s set
 * aside for a while, when its address cannot be inserted. */
bool fetch_source_ready(struct fetcher *x, struct fetch_source *s, uint64_t now);
/* s may be read from now: not us, not resting, not silent; a peer only in
 * fanout, once its have-page was read, and while not banned in f. */
bool fetch_source_usable(const struct fetcher *x, const struct fetch *f,
			 const struct fetch_source *s, uint64_t now);
/* Pacing accounting of a read of len bytes posted to s / completed from s
 * (ok: with its bytes), for rate and silence. */
void fetch_source_posted(struct fetch_source *s, uint64_t len);
void fetch_source_done(struct fetch_source *s, uint64_t len, bool ok);
/* s failed: it rests BAD_SOURCE_MS and its connection is dropped. NULL is fine. */
void fetch_source_failed(struct fetcher *x, struct fetch_source *s);
/* Gives s's fabric handle back (its list is being freed or replaced). */
void fetch_source_release(struct fetcher *x, struct fetch_source *s);
/* The pacing record of the host that serves info (made at first sight,
 * kept until fetcher_fini), or NULL when too many hosts are known. */
struct fetch_source *fetch_host_pace(struct fetcher *x, const struct trk_source *info);
/* The handle to read s's have-pages with over the have-page endpoint (its
 * address's, held with its kept connection; inserted at first use): 0, or
 * -errno with s set aside for a while. */
int fetch_have_addr(struct fetcher *x, struct fetch_source *s, fi_addr_t *out);
/* Addresses whose connection is kept now (tests). */
uint32_t fetch_conns_count(const struct fetcher *x);
void fetch_hosts_fini(struct fetcher *x);
void fetch_conns_fini(struct fetcher *x);

/* ---- reads.c ---- */

/* Whether a verified chunk c of p is copied after its have-page (it is
 * served, not from the slot). */
bool fetch_chunk_copied(const struct fetcher *x, const struct fetch *f,
			const struct fetch_parcel *p, uint32_t c);
/* Our have-page of p: chunk c is being fetched (busy), had, or neither. */
void fetch_mark(struct fetch_parcel *p, uint32_t c, int what);
#define FETCH_MARK_NONE 0
#define FETCH_MARK_BUSY 1
#define FETCH_MARK_HAVE 2
/* A read of chunk c of p failed or moved (nlive already counts it out):
 * with no other read of it out, it is to fetch again. */
void fetch_chunk_idle(struct fetch_parcel *p, uint32_t c);

/* The read pool's sizes from the tunables: chunk_size, max_inflight, nreads. */
void fetch_pool_size(struct fetcher *x);
/* Frees x->reads and what its slots hold (NULL after). */
void fetch_reads_free(struct fetcher *x);
int fetch__pool_init(struct fetcher *x, struct proto_err *err);
void fetch__pool_fini(struct fetcher *x);

/* A read slot (index into reads and bounce) for len bytes with the rate
 * bucket's tokens taken, or -1 (nothing taken) when none is free now. */
int fetch_read_claim(struct fetcher *x, uint32_t len);
/* Gives back the tokens of a claimed read that could not be posted. */
void fetch_read_unclaim(struct fetcher *x, uint32_t len);
/* A read of chunk c of parcel pi (len bytes) was posted. */
void fetch_read_started(struct fetcher *x, uint32_t pi, uint32_t c, uint32_t len);
/* A read's bytes are in its bounce slot (status 0) or it failed: on to
 * verification, or back to the pool. */
void fetch_read_landed(struct fetch_read *rd, int status);
/* The verdict on rd's chunk, hashed (ok: it matched the manifest). */
void fetch_read_verified(struct fetch_read *rd, bool ok);
/* Posts a read of chunk c of parcel pi from s (a publisher or a peer)
 * into a claimed slot: 0, or an error (s failed, the slot freed). From a
 * publisher on a fast link the read may take the chunks after c too
 * (TESSERA_READ_CHUNKS): each is a read of its own in the pool (a slot,
 * its verdict) that lands when the one fabric read does. */
int fetch_read_post(struct fetcher *x, uint32_t pi, uint32_t c, struct fetch_source *s);
/*
 * How many chunks from c one read from publisher s takes (TESSERA_READ_CHUNKS
 * at most): c and the chunks after it that nobody of ours reads yet, that
 * are ours to take from the trainer and that no peer holds or fetches,
 * whole chunks laid end to end in the bounce buffers, as many as s's
 * measured rate moves in about a millisecond and its read window has room
 * for; 0 (post nothing now) while that window is half full or more and
 * has no room for a whole run: reads land one by one, and a read posted
 * per landing would be one chunk again. 1 from a peer, and on slower or
 * unmeasured links: there a chunk is the fanout's step.
 */
uint32_t fetch_read_run(const struct fetcher *x, const struct fetch_parcel *p, uint32_t c,
			const struct fetch_source *s);
/* Reads in flight are abandoned (their fetch is over): they land and are
 * ignored. */
void fetch_reads_abandon(struct fetcher *x);

/* ---- sources.c ---- */

/* Reads in flight to p's sources follow them to their new places in ns
 * (moved[j]: old index j's new one + 1, 0: gone); so do have-page reads
 * (the sources_moved hook). Before p->src_epoch moves on. */
void fetch_reads_follow(struct fetcher *x, const struct fetch_parcel *p, const uint32_t *moved,
			struct fetch_source *ns);
/* Asks the tracker for parcel pi's sources, unless asked lately. */
void fetch_want_sources(struct fetcher *x, uint32_t pi);
/* Asks the tracker again for parcel pi's sources while it lacks chunks,
 * once its period is up (fetch_sources_gap): members join the swarm as
 * they offer. Whether it lists peers (other than us). */
bool fetch_sources_refresh(struct fetcher *x, uint32_t pi, uint64_t now);
/* How soon after its last /sources parcel p of f may ask again, as of now.
 * Cannot fail. */
uint64_t fetch_sources_gap(const struct fetch *f, const struct fetch_parcel *p, bool peers,
			   uint64_t now);

/* ---- pump.c ---- */

/* Posts reads until every source's window is full, the node's reads are
 * all out, or nothing can be fetched now. */
void fetch_pump(struct fetcher *x);
/* Periodic (the agent's tick): silent sources' reads moved, chunks without
 * any source said; the pump is the caller's. */
void fetch_tick(struct fetcher *x);
/* Whether the tick at now may judge silences: not when the loop itself ran
 * late. Cannot fail. */
bool fetch_silence_due(struct fetcher *x, uint64_t now);
/* Moves the reads of parcel pi's silent sources elsewhere, where there is
 * somewhere to go. Cannot fail. */
void fetch_check_silent(struct fetcher *x, struct fetch *f, uint32_t pi, uint64_t now);

/* ---- wires.c ---- */

/* A buffer of at least len bytes for a delta parcel's wire: the smallest
 * large enough of those kept from earlier versions, else a new one; NULL
 * when out of memory. Given back with fetch_wire_put. */
uint8_t *fetch_wire_get(struct fetcher *x, size_t len);
/* Keeps buf (NULL is fine) for a later version, or frees it (the pool is
 * full, or torn down). Cannot fail. */
void fetch_wire_put(struct fetcher *x, uint8_t *buf);
/* Once, before the first delta: buffers of a few percent of each of the
 * plan's parcels for our rank, written once (their pages faulted in). */
void fetch_wires_ready(struct fetcher *x, const struct proto_plan *plan);
/* Frees the kept buffers; those given back later are freed at once. */
void fetch_wires_fini(struct fetcher *x);

#endif
