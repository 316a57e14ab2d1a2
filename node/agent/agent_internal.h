/*
 * The node agent's insides, shared by its files (node/agent.h says what the
 * agent does):
 *
 *   agent.c          setup and teardown, the shared helpers
 *   agent_session.c  the tracker session: registration, lease, watch, the
 *                    replica's target, progress reports
 *   agent_version.c  one version's fetch: manifest, parent link, plan, parcels
 *   agent_fetch.c    pulling chunks: sources, pacing, reads, verification,
 *                    stalls
 *   agent_activate.c verified -> active: the replica's agreement, the
 *                    activation record, the switch
 *   agent_swarm.c    peer fanout: the parcels we serve (have-pages, offers),
 *                    what peers hold, which chunk to read from whom, bans
 *   agent_xlayout.c  cross-layout sources: chunks assembled from replicas
 *                    of other layouts (complete, or partial with have-maps);
 *                    our own slot offered to them, also while it fills
 *
 * Everything runs on the agent's one libevent loop.
 */
#ifndef NODE_AGENT_INTERNAL_H
#define NODE_AGENT_INTERNAL_H

#include "node/agent/agent.h"
#include "node/base/waitnote.h"
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "node/agent/agent_metrics.h"
#include "node/serve/attach.h"
#include "node/base/fabloop.h"
#include "node/rebuild/rebuild.h"
#include "node/serve/serve.h"
#include "node/store/store.h"
#include "node/agent/verifier.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define RETRY_MS 500        /* registration and metadata retries */
#define SOURCES_MIN_MS 300  /* least time between two /sources for a parcel */
#define BAD_SOURCE_MS 2000  /* a failed source rests this long */
#define REPORT_MS 500       /* progress reports while fetching */
#define REPLICA_POLL_MS 100 /* waiting for the rest of the replica, at most */
#define REPLICA_POLL_MIN_MS 10 /* ... and at first (a quarter of the wait so far) */
#define SYNC_MS 200         /* asking the tracker for the replica's target */
#define FAILED_RETRY_MS 2000 /* a version we gave up on is tried again after */
#define WINDOW_MIN_CHUNKS 2 /* least read window per source, chunks */
#define RATE_SAMPLE_MS 250  /* least stretch a source's rate is measured over */
#define HAVE_SLOTS 32       /* have-page reads in flight at most */
#define HAVE_SLOT_MAX (64u << 10) /* largest have-page read (parcels past it: no swarm) */
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
/* Most ranges of its slot a chunk a node serves from there may span: a
 * reader gathers them with fab_readv, fab_rma_segs ranges a read, those
 * reads together one chunk read. Chunks over it are copied after their
 * have-page (agent_chunk_copied). */
#define GATHER_RANGES 32

struct agent_source {
	struct trk_source info;
	fi_addr_t fa;
	bool fa_valid;
	uint64_t bad_until_ms;
	/* Pacing, kept across source list refreshes (see pump()): */
	uint64_t inflight_bytes;
	uint32_t inflight_reads;
	uint64_t rate;            /* measured bytes/s while busy; 0: not yet */
	uint64_t meas_ms, meas_bytes; /* the measurement under way */
	uint64_t progress_ms;     /* a read completed, or it became busy */
	/* A peer: the latest post time of its have-page reads that were
	 * answered (agent_swarm.c): it was alive then (agent_source_silent). */
	uint64_t answered_ms;
	bool silent_logged;       /* "no other source" said for this silence */
	bool congested_logged;    /* "answers its have-page" said for this silence */
	/* A peer's have-page (agent_swarm.c): its have then busy bitmaps, as
	 * last read; NULL until read. */
	uint8_t *have;
	uint64_t have_ms;         /* when the last read of it was posted */
	uint64_t have_page_ms;    /* when the read of the page we hold was posted:
				   * its bits are no older */
	bool have_busy;           /* a read of it is in flight */
	/* Where its have-page says the parcel's bytes are: its version slot
	 * (len != 0: chunks are gathered from the slot's spans), else right
	 * after the page (the offer's addr). */
	struct fab_rkey slot_rk;
	uint32_t slot_ranges; /* chunks over this many ranges follow the page */
	bool self;                /* it is us: never read from */
	uint64_t listed_ms;       /* first listed by the tracker */
	uint64_t unlisted_ms;     /* a peer the tracker stopped listing: since when (0: listed) */
	/* A peer's upload budget, as its have-page announces it, and what it
	 * leaves us (agent_swarm.c): refused, we are not among the readers it
	 * serves; else our share of its rate, bytes/s (0: no cap), spent from
	 * a bucket of tokens. */
	uint32_t up_peers, up_mbps;
	bool up_refused;
	uint64_t up_bps, up_tokens, up_ns;
	/* The pacing record every source on its host shares (agent_hosts.c):
	 * rate, window and silence are its; NULL: paced on its own. */
	struct agent_source *hp;
};

/* The pacing s follows: its host's, or its own. */
static inline struct agent_source *agent_pace(const struct agent_source *s)
{
	return s->hp != NULL ? s->hp : (struct agent_source *)s;
}

struct agent_parcel {
	const struct proto_mparcel *mp;
	const struct proto_parcel *pp;
	struct agent_source *srcs;
	size_t nsrcs;
	uint32_t rr; /* round-robin position among sources */
	uint32_t src_epoch; /* bumped whenever srcs is replaced */
	uint64_t sources_ms;
	bool sources_pending;
	uint8_t *state; /* per chunk: 0 todo, 1 in flight, 2 done */
	uint8_t *asked; /* per chunk: a read was posted for it before */
	uint32_t next_todo;
	uint32_t done;
	/* Swarm (agent_swarm.c): the region we serve it from (its have-page,
	 * then its bytes; NULL: not served), and what the peers hold. */
	uint8_t *held;
	size_t held_cap;
	uint32_t head;       /* bytes of the have-page in front of the parcel */
	struct fab_mr *held_mr;
	bool from_slot;      /* its chunks are served from the fetch's slot (f->slot_mr),
			      * those over one gathering read's ranges copied after the
			      * have-page (agent_chunk_copied) */
	uint8_t *nlive;      /* per chunk: reads of it in flight */
	uint16_t *avail;     /* per chunk: peers whose have-page lists it */
	uint8_t *peer_busy;  /* per chunk: a peer is fetching it */
	uint64_t *busy_ms;   /* per chunk: since when a peer is fetching it (0: none is) */
	uint8_t *mine;       /* per chunk: we own it (we ask the trainer for it first) */
	uint32_t *owner;     /* per chunk: its owner's index in members (UINT32_MAX: us, or unknown) */
	uint8_t *owner_on;   /* per chunk: its owner serves this parcel (a usable peer) */
	uint8_t *standin;    /* per chunk: we stand in for its owner (agent_swarm_steal) */
	uint32_t rot;        /* where our walk over its chunks starts */
	uint64_t progress_ms; /* a chunk of it verified (or the fetch started) */
	bool hungry;          /* it starved once: any unheld chunk may come from the trainer */
	bool ahead;           /* we hold more of it than the median peer's page shows
			       * (by AHEAD_CHUNKS): one read per peer (agent_swarm.c) */
	char (*members)[TRK_ID_MAX]; /* its swarm as the tracker last listed it */
	uint32_t nmembers;
	bool seed;           /* we read it from the trainer (TESSERA_PUB_UPLOAD_READERS) */
	uint32_t nowners;    /* seed readers sharing its trainer's chunks, us included */
	uint8_t *wire; /* a delta parcel's bytes (malloc'ed), else NULL */
	uint8_t landed; /* a delta parcel's wire is whole, for the apply (atomic) */
};

struct agent_read {
	struct fab_op op;
	struct node_agent *a;
	uint32_t parcel, chunk, slot, len;
	uint32_t src_idx, src_epoch; /* srcs[src_idx] while the epoch holds */
	bool src_peer;
	struct agent_source *hp; /* its source's host record, given back at landing */
	bool xl; /* assembled from a cross-layout holder (agent_xlayout.c) */
	char src_id[TRK_ID_MAX]; /* the source's id (bans outlive source lists) */
	/* A chunk gathered from a peer's slot: its ranges, the reads that
	 * take them (each lands after the one before), how many are still
	 * out and the first failure; it lands when the last completes. */
	struct fab_seg segs[GATHER_RANGES];
	struct agent_gather {
		struct fab_op op;
		struct agent_read *rd;
	} gops[GATHER_RANGES];
	uint32_t gleft;
	int gstatus;
	bool gathered; /* from the peer's slot (those reads) */
	uint64_t started_ms;
	bool abandoned; /* stalled: its slot stays reserved until completion */
	bool busy;      /* the slot holds this read (in fabric or verifying) */
	bool in_fabric; /* posted, not completed */
	struct node_vjob job;
	struct node_slot *vslot; /* the slot job places into (uploads while fetching) */
	uint64_t gen; /* fetch generation it belongs to */
};

struct agent_fetch {
	uint64_t version;
	uint64_t id; /* a->fetch_ids when started: its tracker answers carry it */
	struct proto_manifest man;
	bool have_man;
	const struct proto_mlayout *ml;
	const struct proto_plan *plan; /* the agent's, checked against the manifest */
	struct node_slot *slot;
	struct agent_parcel *parcels;
	uint32_t nparcels;
	uint64_t bytes_total, bytes_done, from_trainer, from_peers;
	uint64_t refetched; /* bytes requested again (failed, bad or moved reads) */
	bool trainer_late;  /* a read of the trainer's last wave is late (agent_swarm.c) */
	uint64_t peer_bytes; /* in flight from peers, as trainer_late was judged */
	uint64_t late_judged_ms; /* when trainer_late was last judged */
	uint64_t duplicate; /* bytes received for chunks we had or were verifying */
	/* Peers that sent bad chunks this version: their ids and counts; a
	 * peer at BAN_BAD_CHUNKS is banned until the version is done. */
	char (*bad_ids)[TRK_ID_MAX];
	uint8_t *bad_counts;
	uint32_t nbad, nbanned;
	struct node_serve_offer so; /* our offer of its parcels */
	/* Its slot, registered once for peers' reads of the parcels served
	 * from it (agent_swarm.c); closed before the slot can be freed or
	 * written by anything but the verifier. Outlives f->slot moving to
	 * a->active: the kept version is served from the active slot. */
	struct fab_mr *slot_mr;
	bool served; /* its parcels are registered and offered (or to be) */
	uint64_t started_ms;
	uint64_t first_byte_ms, last_byte_ms; /* wall clock: chunks landed */
	uint64_t first_post_ms;
	/* Until when (agent_now_ms) no peer can hold a chunk we own: the
	 * version was fresh when we heard of it (agent_note_fresh); 0 if not. */
	uint64_t fresh_until_ms;
	/* Its start-up, wall clock ms (0: not yet): the watch answer that
	 * named it, the signed manifest in, the parcels set, the first
	 * /sources answer, have-page and read posted. Logged with the first
	 * byte (agent_startup_log), on the clock of the manifest's
	 * created_ms and the tracker's trace. */
	struct {
		uint64_t watch, manifest, parcels, sources, have, read;
	} su;
	bool verified, reported_verified;
	uint64_t verified_ms; /* when verified: the replica wait polls from then */
	/* The activation record could not be written: not active, and why. */
	char expose_error[512];
	/* Why the tracker's last claim that the replica is complete did not
	 * hold up (a rank's statement missing or forged); "" if none. */
	char unbacked[256];
	/* Per-chunk trouble, tallied and logged once per version (the first
	 * of each kind at warn, the rest at debug, totals on the way out). */
	uint32_t stalls, bad_chunks, read_failures;
	uint32_t congested; /* peers past their patience that answered their have-page */
	/* The manifest lacks our layout: asking for its addendum. full: a
	 * delta version taken whole (the chain planner chose it): its raw
	 * copy is asked for instead, its bytes come from the replicas that
	 * hold it (agent_xlayout.c), never from its delta swarm. */
	bool want_addendum;
	bool full;
	bool plan_asked; /* the trainer layout is asked for (our plan) */
	struct event *addendum_ev; /* the next ask */
	/* A delta version: rebuilt from the active slot (node/agent_delta.c). */
	bool delta;
	struct node_rebuild *rebuild; /* the copy and apply's worker (node/rebuild.h) */
	bool from_standby;            /* it is the standby copy's */
	const struct node_agent *rebuild_agent; /* what the apply reads (model, layout) */
	uint64_t rebuild_ms;
	bool applying;       /* the apply is handed over: parcels feed it as they land */
	uint32_t fed_early;  /* parcels it had before the last chunk */
	bool test_corrupt; /* TESSERA_TEST_CORRUPT_CHAIN: damage the delta before the apply */
	bool rotatable; /* rebuilt from the active slot: its delta can rotate (agent_delta.c) */
	struct agent_rotation *rot; /* the catch-up its slot is made by, or NULL */
	/* Piece checksums (agent_delta.c): the parent's, when the node knows
	 * them for the slot the delta builds on, and the child's, which the
	 * apply fills; NULL when none. */
	struct agent_sums *psums, *csums;
};

/* Replaying a chain (agent_chain.c): the node lacks a delta version's
 * parent, so it fetches the latest anchor (or starts from its active
 * version, when that is in the chain) and each delta after it in turn,
 * building each step in a slot it does not serve; only the target is
 * reported verified and activated. */
struct agent_chain {
	uint64_t target;
	uint64_t *steps; /* versions to fetch, oldest first; the last is target */
	uint32_t nsteps, next;
	uint64_t wire;   /* the steps' wire bytes for our rank, planned */
	/* The last step built (NULL before the first, or when the chain
	 * starts from the active slot): the next delta's parent. */
	struct node_slot *slot;
	uint64_t slot_version;
	uint8_t slot_digest[PROTO_HASH_BYTES];
	/* What the finished steps took (reported with the target's). */
	uint64_t done, from_trainer, from_peers, duplicate, refetched;
	/* Planning: the manifests are walked back from the target's parent. */
	bool planning;
	uint64_t walk_v;
	uint8_t walk_digest[PROTO_HASH_BYTES];
	uint64_t *walked, *walked_wire; /* newest first */
	uint32_t nwalked;
	bool from_active;
	uint64_t target_raw, target_wire; /* the target whole, and as its delta */
	char nochain[400]; /* why no chain can be replayed ("": one can) */
	struct trk_version_info *vi;     /* the tracker's versions */
	size_t nvi;
	uint64_t latest; /* the tracker's latest version, as listed */
};

struct node_agent {
	struct node_agent_opts o;
	struct event_base *base;
	struct trk_client *trk;
	struct proto_model model;
	struct proto_layout layout;
	json_t *layout_json;
	char layout_name[65]; /* "tp2", or the layout file's name; "" if none fits */
	uint8_t trainer_pk[PROTO_PK_BYTES];
	struct node_store store;
	struct fab_ctx *fab;
	struct node_fabloop *fl;
	/* Have-pages are read over this endpoint and its loop (the host's
	 * second one, agent_hosts.c): a->fab and a->fl when it has none. */
	struct fab_ctx *hfab;
	struct node_fabloop *hfl;
	char fabric_hex[2 * FAB_ADDR_MAX + 1];
	char host[256];
	char node_id[TRK_ID_MAX];
	bool registered, watching;
	bool leaving; /* node_agent_leave: no heartbeat or registration any more */
	struct event *leave_ev;
	void (*leave_done)(void *arg);
	void *leave_arg;
	uint64_t lease_ms;
	/* This registration's statement key (made anew for each one): our
	 * verified and active reports are signed with it, and the other ranks
	 * check them before they switch (tracker.h, "Statements"). */
	uint8_t stmt_pk[TRK_STMT_PK_BYTES], stmt_sk[TRK_STMT_SK_BYTES];

	/* Bounce buffers: reads land here, are hashed, then scattered. */
	uint8_t *bounce;
	size_t bounce_len;
	struct fab_mr *bounce_mr;
	struct node_verifier *ver;
	struct agent_read *reads;
	uint32_t nreads, inflight, max_inflight;
	uint32_t chunk_size;
	/* Fetch rate cap (token bucket; rate 0: none), so pulling a version
	 * cannot starve the serving traffic that shares the host's links. */
	uint64_t rate_bps, tokens, tokens_ns;
	struct event *rate_ev;

	uint64_t seen;   /* newest version the tracker told us about */
	uint64_t seen_wall_ms; /* when a watch answer last raised seen */
	/* The last version a watch answer named while fresh, and until when
	 * (agent_now_ms) it is (agent_note_fresh). */
	uint64_t fresh_v, fresh_until_ms;
	uint64_t failed; /* the version we last gave up on, and when */
	uint64_t failed_ms;
	uint64_t target; /* the replica's target, as the tracker last said */
	bool syncing;
	/* Sibling wake-ups (agent_poke.c): watches the bound socket. */
	struct event *poke_ev;
	uint32_t poke_asks; /* pokes that made it ask the tracker */
	struct event *poke_retry_ev; /* its name was taken: binding again */
	uint32_t poke_tries;
	struct agent_fetch *fetch;
	struct agent_fetch *stopped_fetch; /* node_agent_stop -> node_agent_free */
	uint64_t gen;
	/* Tracker requests of fetches (agent_version.c): an answer counts
	 * only for the fetch that asked, not for one started since. */
	uint64_t fetch_ids;
	struct agent_fetch_ask *fetch_asks;
	/* The plan from the trainer layout to ours, kept across versions. */
	struct proto_plan plan;
	bool have_plan;
	uint8_t plan_src[PROTO_HASH_BYTES];
	/* Ready ahead of the first version (agent_ready_ahead): the plan
	 * asked for (when last), the slot made once. */
	bool ahead_asked, ahead_slot;
	uint64_t ahead_ms;
	struct node_slot *active;
	uint8_t active_digest[PROTO_HASH_BYTES];
	/* Serving processes pin slots through it; it frees retired ones. */
	struct node_attach *attach;
	/* In-place installs (agent_inplace.c): the drain bound's timer, when
	 * the install paused admission, and whether a failed write left the
	 * served slot incomplete (admission stays paused, the next version
	 * must be an anchor). */
	struct event *inplace_ev;
	bool installing;
	uint64_t inplace_version, inplace_t0_ns;
	struct agent_inplace_prep *inplace_prep; /* a delta's, until it is written */
	bool inplace_broken;

	/* Verified parent links: the last manifest we accepted. */
	uint64_t last_version;
	uint8_t last_digest[PROTO_HASH_BYTES];
	/* A delta could not be applied here: the tracker is told, so that the
	 * publisher sends an anchor next (cleared by any activation). */
	bool need_anchor;
	uint64_t report_seq; /* the number of the last state report sent */
	/* The active slot's copy made ahead of the next version (agent_delta.c):
	 * a delta against the active version starts from it, anything else
	 * takes its slot. NULL when none; dropped at every activation. */
	struct node_slot *standby;
	struct node_rebuild *standby_rb;
	struct event *standby_ev;
	/* The last delta, kept to patch the slot it was applied against (the
	 * retired one, back in the store) up to the active version: the next
	 * delta is built there without a dense copy (agent_delta.c). NULL when
	 * none; the standby's catch-up while one is made; tags numbering what
	 * activated slots hold; standby waits for the retired slot. */
	struct agent_rotation *rot, *standby_rot;
	uint64_t slot_tags;
	/* The second slot made when the node starts, its pages touched by a
	 * worker (agent_delta.c, "The warm slot"); the first dense copy of a
	 * parent takes it. NULL when none or taken; second_stop (atomic) stops
	 * the touch, second_pause (atomic) holds it while a fetch runs;
	 * second_ready: it touched every page. */
	struct node_slot *second;
	struct node_rebuild *second_rb;
	int second_stop, second_pause;
	bool second_ready;
	uint64_t second_ms; /* when the touch began */
	uint64_t second_cpu_ms; /* the touch's CPU (its worker's) */
	/* The active slot's piece checksums, verified by the apply that built
	 * it and bound to it by its tag (agent_delta.c); NULL when unknown. */
	struct agent_sums *sums;
	/* Delta wire buffers kept between versions (agent_delta.c); NULL
	 * until the first is given back. */
	struct agent_wires *wires;
	bool wires_closed; /* torn down: buffers given back are freed */
	/* The scrub of the active slot under way (agent_delta.c), its worker,
	 * and which share comes next. */
	struct agent_scrub *scrub;
	struct node_rebuild *scrub_rb;
	uint64_t scrub_round;
	uint32_t standby_tries;
	/* The standby waits while peers read from this node: the fabric
	 * loop's wake-ups by its wait fd at the last look, when it began
	 * waiting (0: not yet), when a look last saw one, looks left that
	 * count as serving (test). */
	uint64_t standby_fd_polls, standby_defer_ms, standby_read_ms;
	uint64_t standby_test_busy;
	struct event *chase_ev; /* have-pages read again soon (agent_swarm.c) */
	/* The chain being replayed (agent_chain.c), or NULL; whether a
	 * planning request of one is on its way (its answer is awaited even
	 * when the chain is gone); the target a replay failed for. */
	struct agent_chain *chain;
	bool chain_asking;
	uint64_t chain_failed_v;
	/* The delta version the planner chose to fetch whole (0: none), and
	 * one whose whole fetch failed (the chain is taken for it then). */
	uint64_t full_v, full_failed_v;

	struct event *retry_ev, *heartbeat_ev, *tick_ev, *sync_ev;
	uint32_t model_refusals; /* registrations refused in a row: another model */
	bool said_live; /* said that our id is still live (a previous process's) */
	/* The members list last heard per parcel swarm, with its tag
	 * (agent_fetch.c): {"<layout hex>/<src>/<dst>":{"tag":..,"members":[..]}}. */
	json_t *members_memo;
	struct node_wait wait; /* what we wait for, said when it lasts */
	/* Since when some chunks of the fetch have no usable source (0: all
	 * have one), and whether that was said (agent_fetch.c,
	 * check_sourceless); kept across fetches of the version. */
	uint64_t nosrc_ms, nosrc_gen; /* nosrc_gen: the fetch generation it was seen in */
	bool nosrc_said;
	uint64_t last_report_ms;
	/* When silences were last judged (agent_silence_due); 0: a late tick
	 * judged nothing. */
	uint64_t silence_ms;
	int fatal;
	struct proto_err fatal_err;
	struct node_agent_metrics am;

	/* Swarm (agent_swarm.c). */
	bool fanout;         /* TESSERA_FANOUT */
	uint8_t *hpool;      /* have-page reads land here, HAVE_SLOTS of HAVE_SLOT_MAX */
	struct fab_mr *hpool_mr;
	struct agent_have_read *hreads;
	uint64_t reg_gen;    /* registrations so far (offers are per registration) */
	/* The version we served before the one being fetched (the active
	 * one): its parcels stay offered until the next activation. */
	struct agent_fetch *kept;
	/* Offers in flight: which version each answer is about. */
	struct agent_ticket {
		struct node_agent *a;
		uint64_t version;
		bool used;
	} tickets[4];
	/* Cross-layout sources and our served slot (agent_xlayout.c); NULL
	 * until first needed. */
	struct agent_xl *xl;
	/* Pacing per source host (agent_hosts.c); NULL until first needed. */
	struct agent_source *hosts;
	uint32_t nhosts;
	/* Warm fabric handles, one per source address, across versions
	 * (agent_hosts.c); NULL until first needed. */
	struct agent_warm *warm;
	uint32_t nwarm;
	uint64_t warm_clock;
};

/* A read of a peer's have-page. */
struct agent_have_read {
	struct fab_op op;
	struct node_agent *a;
	uint64_t gen;
	uint32_t parcel, src_idx, src_epoch, slot;
	bool busy;
};

/* ---- shared between the agent's files ---------------------------------- */

uint64_t agent_now_ms(void);

void agent_arm(struct event *ev, uint64_t ms);

void agent_give_up(struct node_agent *a, const char *why);

void agent_on_chain_lost(void *arg, const char *why);

void agent_report(struct node_agent *a, uint64_t version, enum trk_rank_state st,
		   const char *error, trk_client_cb cb);

void agent_fetch_free(struct node_agent *a, struct agent_fetch *f);

void agent_fetch_drop(struct node_agent *a);

/* A ticket for a tracker request of a->fetch (not NULL), passed as the
 * callback's arg: agent_fetch_answered(arg, &a) in the callback gives the
 * fetch that asked if it is still a->fetch (else NULL: drop the answer)
 * and frees the ticket. NULL on ENOMEM. A request that could not be sent
 * frees its ticket with agent_fetch_ask_cancel (NULL is fine). */
struct agent_fetch_ask *agent_fetch_ask_new(struct node_agent *a);
struct agent_fetch *agent_fetch_answered(void *arg, struct node_agent **ap);
void agent_fetch_ask_cancel(struct agent_fetch_ask *t);
/* Frees the tickets still out (node_agent_free, with the tracker client
 * about to go: none calls back). */
void agent_fetch_asks_fini(struct node_agent *a);

void agent_fetch_fail(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

int agent_probe_expose(struct node_agent *a, struct proto_err *err);

void agent_expose_blocked(struct node_agent *a, const char *what, const struct proto_err *err);

void agent_activate(struct node_agent *a);
/* The activation record of slot (at digest), fsync'ed and renamed into
 * place; 0 or an error in err. */
int agent_write_expose(struct node_agent *a, struct node_slot *slot, const uint8_t *digest,
		       struct proto_err *err);
/* In place (agent_inplace.c says why): the record of slot serving v is
 * written beside the record before the pause (stage), renamed over it in
 * the pause (commit), fsync'ed after (sync; a failure is logged). unstage
 * drops a staged record that is not committed. */
int agent_stage_expose(struct node_agent *a, struct node_slot *slot, uint64_t v,
		       const uint8_t *digest, struct proto_err *err);
int agent_commit_expose(struct node_agent *a, struct proto_err *err);
void agent_unstage_expose(struct node_agent *a);
void agent_sync_expose(struct node_agent *a);
/* Removes the record when it names this process (the node stops: the
 * memory it names goes with it); a failure is logged. */
void agent_unexpose(struct node_agent *a);
/* a->active serves a->fetch's version now (old: the slot served before; the
 * same slot when it was written in place): report, metrics, attach, the
 * fetch ends. */
void agent_activated(struct node_agent *a, struct node_slot *old);

void agent_follow_target(struct node_agent *a, uint64_t t, bool complete, json_t *statements);

bool agent_replica_backed(struct node_agent *a, json_t *statements);

/* The sync timer's next period (faster while verified and waiting). */
uint64_t agent_sync_period(const struct node_agent *a);
void agent_sync_now(struct node_agent *a);

void agent_on_sync_timer(evutil_socket_t fd, short what, void *arg);

void agent_on_verified_report(const struct trk_answer *ans, void *arg);

void agent_all_verified(struct node_agent *a);

/* Every chunk verified and the slot holds the version: report it verified. */
void agent_verified(struct node_agent *a);

void agent_want_sources(struct node_agent *a, uint32_t pi);

void agent_on_verified(struct node_vjob *job, void *arg);

void agent_on_rate(evutil_socket_t fd, short what, void *arg);

void agent_pump(struct node_agent *a);
/* Notes v fresh when the /versions answer (its now_ms and entries vs[n])
 * says the tracker published it less than STARVE_MS ago. */
void agent_note_fresh(struct node_agent *a, uint64_t v, uint64_t now_ms,
		      const struct trk_version_info *vs, size_t n);
/* Logs f's start-up timeline (f->su) at its first byte; once. */
void agent_startup_log(const struct node_agent *a, const struct agent_fetch *f);

void agent_on_tick(evutil_socket_t fd, short what, void *arg);

void agent_source_failed(struct node_agent *a, struct agent_source *s);

void agent_start_fetch(struct node_agent *a, uint64_t v);
/* Registered and holding no version: makes the first version's slot (the
 * store's spare) and asks for the plan, once each (agent_version.c). */
void agent_ready_ahead(struct node_agent *a);

/* agent_addendum.c: the manifest does not list our layout: fetch the
 * layout's signed addendum (asking again while the publisher makes it, up
 * to TESSERA_ADDENDUM_WAIT_MS), check it, splice it into the fetch's
 * manifest and go on with agent_with_addendum; without one, report the
 * version failed and wait for the next. */
void agent_addendum_wait(struct node_agent *a);
/* The same for a->fetch->full: the raw copy of our layout, signed as a
 * copy addendum; without one the version is refused, and its next try
 * replays the chain. */
void agent_copy_wait(struct node_agent *a);
void agent_with_addendum(struct node_agent *a);

void agent_heartbeat(evutil_socket_t fd, short what, void *arg);

void agent_start_register(struct node_agent *a);

void agent_on_retry(evutil_socket_t fd, short what, void *arg);

void agent_layout_name(const char *arg, char *out, size_t len);

/* ---- agent_swarm.c ---- */

/* Sets up the swarm side of the agent (have-read pool); 0 or -errno. */
int agent_swarm_init(struct node_agent *a);
/* Frees what agent_swarm_init made and the kept version; after fab_close. */
void agent_swarm_fini(struct node_agent *a);
/* The fetch's parcels are set up: map and register their served regions
 * and offer them (nothing when fanout is off). Failure only logs: the node
 * then fetches without serving. */
void agent_swarm_serve(struct node_agent *a, struct agent_fetch *f);
/* Frees f's served regions (withdrawing its offer); in agent_fetch_free. */
void agent_swarm_unserve(struct node_agent *a, struct agent_fetch *f);
/* f became active: keep serving it (in a->kept) until the next activation,
 * dropping the one kept before. Takes f (the caller forgets it). */
void agent_swarm_keep(struct node_agent *a, struct agent_fetch *f);
/* Periodic work: have-page reads, offers not yet accepted. */
void agent_swarm_tick(struct node_agent *a);
/* Registered again: every offer must be made again. */
void agent_swarm_registered(struct node_agent *a);
/* The ranges of the slot chunk c of p lies in (sp: the first
 * GATHER_RANGES of them); more than GATHER_RANGES: not gathered. */
uint32_t agent_chunk_spans(const struct node_agent *a, const struct agent_fetch *f,
			   const struct agent_parcel *p, uint32_t c, struct proto_span sp[GATHER_RANGES]);
/* Whether a verified chunk c of p is copied after its have-page (it is
 * served, not from the slot). */
bool agent_chunk_copied(const struct node_agent *a, const struct agent_fetch *f,
			const struct agent_parcel *p, uint32_t c);
/* Chooses the next read of parcel pi: its chunk and source (NULL: none now;
 * *want_sources: ask the tracker for more). */
struct agent_source *agent_swarm_pick(struct node_agent *a, uint32_t pi, uint32_t *chunk,
				      bool *want_sources);
/* Our have-page: chunk c of parcel p is being fetched (busy), had, or
 * neither. */
void agent_swarm_mark(struct agent_parcel *p, uint32_t c, int what);
#define AGENT_MARK_NONE 0
#define AGENT_MARK_BUSY 1
#define AGENT_MARK_HAVE 2
/* A chunk from the peer with this id failed its hash; true when that bans it. */
bool agent_swarm_bad_peer(struct node_agent *a, const char *id);
bool agent_swarm_banned(const struct agent_fetch *f, const char *id);
/* Takes the swarm's members from a /sources answer (hostile: at most
 * MEMBERS_MAX ids, each shorter than TRK_ID_MAX; others are skipped) and
 * decides which chunks of parcel pi we own among them (or among the peers
 * listed, when the answer names none). */
void agent_swarm_owners(struct node_agent *a, uint32_t pi, json_t *answer);
/* A chunk of parcel pi that another seed reader owns and would reach
 * last, for us to read from the trainer once our own chunks have all left
 * it (agent_swarm.c); UINT32_MAX: none. Cannot fail. */
uint32_t agent_swarm_steal(const struct node_agent *a, uint32_t pi);
/* Recounts which peers hold each chunk of parcel pi (after a source list). */
void agent_swarm_recount(struct node_agent *a, uint32_t pi);
/* Reads the pages of the peers a parcel waits on every TESSERA_HAVE_CHASE_MS
 * from now, when one does (a read of ours just completed). */
void agent_swarm_chase(struct node_agent *a);
/* How soon after its last /sources parcel p of f may ask again, as of now
 * (agent_fetch.c). Cannot fail. */
uint64_t agent_sources_gap(const struct agent_fetch *f, const struct agent_parcel *p, bool peers,
			   uint64_t now);
/* After a new source list of parcel p (before p->src_epoch moves on):
 * the chunk and have-page reads in flight to a source still listed follow
 * it to its index in ns (moved[j]: old index j's new one + 1, 0: gone),
 * and ns marks those sources' have-pages busy (agent_fetch.c). Cannot
 * fail. */
void agent_reads_follow(struct node_agent *a, const struct agent_parcel *p, const uint32_t *moved,
			struct agent_source *ns);
/* Source helpers shared with agent_fetch.c. */
uint64_t agent_source_window(const struct node_agent *a, const struct agent_source *s);
bool agent_source_silent(const struct agent_source *s, uint64_t now);
/* A have-page read of s posted at posted_ms was answered: its host is
 * alive as of then (a peer past its patience that answers is congested,
 * not silent: agent_fetch.c). Cannot fail. */
void agent_source_answered(struct agent_source *s, uint64_t posted_ms);
/* Whether the tick at now may judge silences: not when the loop itself ran
 * late (agent_fetch.c). Cannot fail. */
bool agent_silence_due(struct node_agent *a, uint64_t now);
/* Moves the reads of parcel pi's silent sources elsewhere, where there is
 * somewhere to go (agent_fetch.c; every tick). Cannot fail. */
void agent_check_silent(struct node_agent *a, struct agent_fetch *f, uint32_t pi, uint64_t now);
/* How long s takes for bytes at its measured rate; 0 while unmeasured. */
uint64_t agent_source_queue_ms(const struct agent_source *s, uint64_t bytes);
bool agent_source_ready(struct node_agent *a, struct agent_source *s, uint64_t now);
/* s may be read from now: not us, not resting, not silent; a peer only in
 * fanout, once its have-page was read, and while not banned. */
bool agent_source_usable(struct node_agent *a, const struct agent_fetch *f,
			 const struct agent_source *s, uint64_t now);
/* ---- agent_hosts.c ---- */

/* The pacing record of the host that serves info (made at first sight,
 * kept until agent_hosts_fini), or NULL when too many hosts are known. */
struct agent_source *agent_host_pace(struct node_agent *a, const struct trk_source *info);
void agent_hosts_fini(struct node_agent *a);
/* s got a fabric handle: hold one more for its address (once per address,
 * WARM_MAX at most, the least recently used given back), so that its
 * connection outlives s's list and version. Cannot fail (without room or
 * memory the address is simply not kept warm). */
void agent_warm_hold(struct node_agent *a, const struct agent_source *s);
/* s failed: its address's warm handle is given back (the provider drops a
 * connection on an error; the next insert connects afresh). */
void agent_warm_drop(struct node_agent *a, const struct agent_source *s);
/* The handle to read s's have-pages with over a->hfab (its address's,
 * held with its warm handle; inserted at first use): 0, or -errno with s
 * set aside for a while (its address cannot be inserted, or no room). */
int agent_have_addr(struct node_agent *a, struct agent_source *s, fi_addr_t *out);
/* Gives every warm handle back (a->fab NULL: fab_close did); frees the table. */
void agent_warm_fini(struct node_agent *a);
/* Warm addresses held now (tests). */
uint32_t agent_warm_count(const struct node_agent *a);

/* ---- agent_inplace.c ---- */

/* The node installs versions in place (--install in-place) and has a
 * served slot to write into. */
bool agent_inplace(const struct node_agent *a);
/* The replica agreed on a->fetch: pause admission, drain pins (bounded),
 * write the version into the served slot, resume. A failure while writing
 * leaves admission paused (a->inplace_broken) until a complete version is
 * installed. */
void agent_inplace_start(struct node_agent *a);
/* Frees the install's timer (teardown). */
void agent_inplace_fini(struct node_agent *a);

/* Pacing accounting of a read of len bytes posted to s / completed from s
 * (ok: with its bytes), for rate and silence (agent_fetch.c). */
void agent_source_posted(struct agent_source *s, uint64_t len);
void agent_source_done(struct agent_source *s, uint64_t len, bool ok);
/* A read slot (index into reads and bounce) for len bytes with the rate
 * bucket's tokens taken, or -1 (nothing taken) when none is free now. */
int agent_read_claim(struct node_agent *a, uint32_t len);
/* Gives back the tokens of a claimed read that could not be posted. */
void agent_read_unclaim(struct node_agent *a, uint32_t len);
/* A read of chunk c of parcel pi (len bytes) was posted. */
void agent_read_started(struct node_agent *a, uint32_t pi, uint32_t c, uint32_t len);
/* A read's bytes are in its bounce slot (status 0) or it failed: on to
 * verification, or back to the pool. */
void agent_read_landed(struct agent_read *rd, int status);

/* ---- agent_xlayout.c ---- */

/* Posts a read of a chunk of parcel pi assembled from a complete replica
 * of another layout (chunk hint if it is still to fetch, else one no peer
 * of our swarm holds or fetches). 1: posted; 0: no such holder can serve
 * the parcel (go on with the trainer); -1: holders can, but have no room
 * now or no read slot is free (wait for them rather than ask the trainer). */
int agent_xl_post(struct node_agent *a, uint32_t pi, uint32_t hint);
/* A usable cross-layout holder exists for the fetch (somewhere to move a
 * silent source's reads). */
bool agent_xl_serves(struct node_agent *a);
/* Periodic: asks the tracker for holders while fetching, moves the reads
 * of a silent holder, keeps our own slot offered; refuses a delta taken
 * whole once no holder is left (a->fetch may be gone after it). */
void agent_xl_tick(struct node_agent *a);
/* The fetch waits for its addendum: the holders of other layouts are asked
 * for now, and our maps of their layouts built, so that reads from them
 * start as soon as our parcels are known. Failure only delays. */
void agent_xl_prefetch(struct node_agent *a);
/* The switch made a->active the served slot (old is retired): offer it to
 * readers of other layouts instead of old. */
void agent_xl_serve(struct node_agent *a, struct node_slot *old);
/* Stops serving our slot to readers of other layouts (an in-place install
 * is about to write into it): their reads fail and move elsewhere, rather
 * than assemble a mix of versions and ban us for it. */
void agent_xl_withdraw(struct node_agent *a);
/* Chunk c of parcel pi of a->fetch is verified and in its slot: marked in
 * the have-map of the slot we serve while fetching (if we do). */
void agent_xl_landed(struct node_agent *a, uint32_t pi, uint32_t c);
/* f is freed: the slot served while it filled is withdrawn first. */
void agent_xl_unserve(struct node_agent *a, const struct agent_fetch *f);
/* Our slot to offer with f's parcels (for readers of other layouts: the
 * active one with the kept fetch, the one filling, partial, with the
 * fetch), or NULL; valid until the next call. */
const struct trk_offer *agent_xl_offer_slot(struct node_agent *a, const struct agent_fetch *f);
/* Frees what the module holds; after fab_close. */
void agent_xl_fini(struct node_agent *a);

/* ---- agent_chain.c ---- */

/* a->fetch is a delta whose parent this node does not hold: plans a chain
 * replay (walking the manifests back to an anchor or to the active
 * version, then checking the tracker still serves every step) and, when
 * one is served, fetches its steps, or, when the version whole costs fewer
 * bytes (or no chain is served) and replicas hold it, fetches it whole
 * (a->full_v: its raw copy, read from the holders); the fetch is dropped
 * meanwhile. 0 when
 * it took over; -1 when no replay is possible now (in-place installs, a
 * replay of this target failed before, or one is under way): the caller
 * asks for an anchor. */
int agent_chain_begin(struct node_agent *a);
/* At verification: when a->fetch is a step before the chain's target, its
 * slot becomes the next step's parent and the next step starts: true.
 * False when there is no chain or a->fetch is its target. */
bool agent_chain_step_done(struct node_agent *a);
/* The parent slot of a->fetch's delta when replaying a chain (NULL when
 * the chain starts from the active slot, or there is none) and its digest. */
struct node_slot *agent_chain_parent(const struct node_agent *a, const uint8_t **digest);
/* Ends the chain (after the fetch building on its slot was freed): frees
 * its slot; failed: the target is not replayed again (an anchor is waited
 * for). NULL chain is fine. */
void agent_chain_end(struct node_agent *a, bool failed);

/* ---- agent_poke.c ---- */

/* Binds this rank's wake-up socket (nothing when it cannot: it polls; a
 * name another process holds is tried again, a bounded while). */
void agent_poke_open(struct node_agent *a);
void agent_poke_close(struct node_agent *a);
/* The tracker took our verified report of version: the replica's other
 * ranks on this host ask it now (best effort, cannot fail). */
void agent_poke_siblings(struct node_agent *a, uint64_t version);

/* ---- agent_delta.c ---- */

/* A delta fetch: 0 when the active slot is its exact parent (number and
 * manifest digest), else the fetch is refused (and an anchor asked for). */
int agent_delta_check_parent(struct node_agent *a);
/* The fetch's slot: the standby slot when there is one (for a delta, with
 * the active slot's copy in it or under way), else a new one, into which a
 * delta's parent is then copied on a worker while the chunks arrive. 0, or
 * the fetch is refused. */
int agent_delta_slot(struct node_agent *a);
/* f's version became active (old served before): drops the standby, keeps
 * f's delta for the next rotation, and arms the next standby
 * (TESSERA_DELTA_STANDBY_MS later, when no fetch has begun by then, and
 * put off while peers read from this node: TESSERA_DELTA_STANDBY_QUIET_MS). */
void agent_delta_activated(struct node_agent *a, struct agent_fetch *f, struct node_slot *old);
/* A buffer of at least len bytes for a delta parcel's wire: the smallest
 * large enough of those kept from earlier versions, else a new one (its
 * pages, new, cost a fault each when written); NULL when out of memory.
 * The caller gives it back with agent_wire_put. */
uint8_t *agent_wire_get(struct node_agent *a, size_t len);
/* Keeps buf (from agent_wire_get; NULL is fine) for a later version, or
 * frees it (the pool is full, or torn down). Cannot fail. */
void agent_wire_put(struct node_agent *a, uint8_t *buf);
/* Frees a catch-up, or piece checksums (NULL is fine). */
void agent_rotation_free(struct agent_rotation *r);
/* Before the catch-up's worker is stopped: its scrub ends at once. */
void agent_rotation_stop(struct agent_rotation *r);
void agent_sums_free(struct agent_sums *s);
/* Makes the warm slot and starts touching its pages (node start; nothing
 * in in-place mode, or with TESSERA_DELTA_WARM=0). Cannot fail: without
 * one, the first copy makes its own slot. */
void agent_delta_warm(struct node_agent *a);
/* Holds the warm slot's touch while a version is fetched (fetching), lets
 * it go on when the fetch ends. */
void agent_warm_pause(struct node_agent *a, bool fetching);
/* Drops the standby copy and its timer (teardown). */
void agent_delta_fini(struct node_agent *a);
/* Every chunk of delta parcel pi verified before the fetch's last: the
 * worker may apply it while the rest arrives (cannot fail; the fetch stays). */
void agent_delta_landed(struct node_agent *a, uint32_t pi);
/* All delta parcels verified: the worker applies every parcel's delta once
 * the copy is done (those that landed first already, maybe), checking each
 * piece's checksum; then, on the loop, agent_verified, or the fetch is
 * refused (and an anchor asked for). */
void agent_delta_rebuild(struct node_agent *a);

#endif
