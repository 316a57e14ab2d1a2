/*
 * The node agent's insides, shared by its files (node/agent/agent.h says
 * what the agent does):
 *
 *   agent.c     setup and teardown: the rank's fetcher, swarm and rebuild
 *   version.c   a version's lifecycle: its stages, from asked to active or
 *               failed (our layout's addendum among them), and the decision
 *               to activate
 *   session.c   the tracker session: registration, lease, watch, the
 *               replica's target, state reports (tracker I/O only)
 *   activate.c  the activation: the other ranks' statements checked, the
 *               activation record, the switch, what follows it
 *   inplace.c   in-place installs: drain, write into the served slot, resume
 *   chain.c     a delta without its parent: replay the chain, or take the
 *               version whole
 *   poke.c      waking the replica's other ranks on this host
 *   leave.c     leaving the tracker when stopped
 *   replica_log.c  what the replica says at the default log level, by its
 *               rank 0: activations, falling behind, catching up
 *
 * Everything runs on the agent's one libevent loop.
 */
#ifndef NODE_AGENT_INTERNAL_H
#define NODE_AGENT_INTERNAL_H

#include "node/agent/agent.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/base/clock.h"
#include "node/base/needsfix.h"
#include "node/base/rank_metrics.h"
#include "node/base/waitnote.h"
#include "node/fetch/fetch.h"
#include "node/rebuild/delta.h"
#include "node/serve/attach.h"
#include "node/store/store.h"
#include "node/swarm/swarm.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define RETRY_MS 500        /* registration and metadata retries */
#define REPORT_MS 500       /* progress reports while fetching */
#define REPLICA_POLL_MS 100 /* waiting for the rest of the replica, at most */
#define REPLICA_POLL_MIN_MS 10 /* ... and at first (a quarter of the wait so far) */
#define SYNC_MS 200         /* asking the tracker for the replica's target */
#define FAILED_RETRY_MS 2000 /* a version we gave up on is tried again after */
#define FIX_RETRY_MAX_MS 60000 /* ... at most this far apart while a person must fix it */
#define CHAIN_CHECK_MS 2000  /* a chain step without a source asks if it is withdrawn */

/*
 * A version's stages on this rank. One function moves a version between
 * them (agent_stage, version.c); a failure at any stage refuses the
 * version: it is dropped and tried again while it is the replica's target
 * (FAILED_RETRY_MS later). A delta whose parent this rank lacks leaves the
 * version to the chain replay (chain.c), which starts each step as a
 * version of its own.
 */
enum agent_stage {
	STAGE_MANIFEST,   /* its signed manifest (and its parent's link) asked for */
	STAGE_ADDENDUM,   /* our layout's addendum, or its raw copy, awaited */
	STAGE_PLAN,       /* the trainer layout asked for: the plan to our layout */
	STAGE_FETCHING,   /* its parcels pulled and verified chunk by chunk */
	STAGE_REBUILDING, /* a delta applied to its parent on a worker */
	STAGE_VERIFIED,   /* every byte verified, reported: the replica's agreement awaited */
	STAGE_ACTIVATING, /* in place: admission paused, pins draining, the slot written */
	STAGE_ACTIVE,     /* served (kept served by the swarm until the next activation) */
	STAGE_FAILED,     /* refused: dropped (logged and reported on the way) */
};

/* One version on this rank: its fetch (node/fetch/) and what its lifecycle
 * adds. Owned by its fetch (f->up): freed with it, by the agent while it
 * is under way, by the swarm once kept. */
struct agent_version {
	enum agent_stage stage;
	uint64_t version;
	uint64_t id; /* a->version_ids when started: its tracker answers carry it */
	struct node_agent *a;
	struct fetch *f;
	struct delta_build db; /* a delta's build (node/rebuild/) */
	bool plan_asked;        /* the trainer layout is asked for (our plan) */
	bool reported_verified; /* the tracker took our verified report */
	uint64_t verified_ms;   /* when verified: the replica wait polls from then */
	/* The activation record could not be written: not active, and why. */
	char expose_error[512];
	/* Why the tracker's last claim that the replica is complete did not
	 * hold up (a rank's statement missing or forged); "" if none. */
	char unbacked[256];
	struct event *addendum_ev; /* the next ask for our layout's addendum */
};

static inline bool agent_verified_stage(const struct agent_version *v)
{
	return v->stage >= STAGE_VERIFIED && v->stage != STAGE_FAILED;
}

/* Replaying a chain (chain.c): the node lacks a delta version's parent, so
 * it fetches the latest anchor (or starts from its active version, when
 * that is in the chain) and each delta after it in turn, building each
 * step in a slot it does not serve; only the target is reported verified
 * and activated. */
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
	uint64_t done, from_trainer, from_peers, duplicate, refetched, from_other_sites;
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
	uint64_t id;     /* a->chain_ids when planned: a check's answer is its own */
	uint64_t checked_ms; /* when its steps were last checked (agent_chain_check) */
	bool held;       /* TESSERA_TEST_CHAIN_HOLD: the first step waits */
};

/* What rank 0 says for its replica (replica_log.c). */
#define AGENT_RLOG_PUBLISHED 16 /* publish times kept, the newest versions seen */
/* A replica is behind once a version newer than the one after its active
 * one is out: it did not activate a version before the next came. */
#define AGENT_BEHIND_VERSIONS 2
struct agent_rlog_pub {
	uint64_t version; /* 0: an empty slot */
	/* When it was published: on node_now_ms's clock (UINT64_MAX: not
	 * known yet), the earliest estimate of any answer; and on the
	 * tracker's (its published_ms), for the estimates of later answers. */
	uint64_t mono_ms, tracker_ms;
};
struct agent_rlog {
	struct agent_rlog_pub pub[AGENT_RLOG_PUBLISHED];
	uint32_t next;
	/* Rank 0 switched to said_v (0: nothing to say): how it was built,
	 * how long after its publish, our bytes; said once the replica is
	 * active on it. */
	uint64_t said_v, own_trainer, own_peers;
	char how[8], when[64];
	/* Said behind: noticed at behind_ms, at most behind_max versions;
	 * behind_from is the first version it lacked (0: none active, it
	 * joined), whose publish time is when it really fell behind. */
	bool behind;
	uint64_t behind_ms, behind_max, behind_from;
	/* A replica with none active: the latest version when it first saw
	 * one (its first chance), and when (node_now_ms). */
	uint64_t joined_v, joined_ms;
};

struct node_agent {
	struct node_agent_opts o;
	struct event_base *base;
	struct trk_client *trk;
	struct fab_ctx *fab; /* the shared endpoint: our address, its provider */
	struct proto_model model;
	struct proto_layout layout;
	json_t *layout_json;
	char layout_name[65]; /* "tp2", or the layout file's name; "" if none fits */
	uint8_t trainer_pk[PROTO_PK_BYTES];
	struct node_store store;
	char fabric_hex[2 * FAB_ADDR_MAX + 1];
	char host[256];
	char node_id[TRK_ID_MAX];
	struct node_rank_metrics am;
	struct node_wait wait; /* what we wait for, said when it lasts */
	int fatal;
	struct proto_err fatal_err;
	struct event *retry_ev, *heartbeat_ev, *tick_ev, *sync_ev;

	/* The tracker session (session.c, leave.c). */
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
	uint64_t seen;         /* newest version the tracker told us about */
	uint64_t seen_wall_ms; /* when a watch answer last raised seen */
	/* The last version a watch answer named while fresh, and until when
	 * (node_now_ms) it is (agent_note_fresh). */
	uint64_t fresh_v, fresh_until_ms;
	uint64_t target; /* the replica's target, as the tracker last said */
	bool syncing;
	uint64_t report_seq; /* the number of the last state report sent */
	uint64_t last_report_ms;
	uint32_t model_refusals; /* registrations refused in a row: another model */
	bool said_live; /* said that our id is still live (a previous process's) */
	/* Sibling wake-ups (poke.c): watches the bound socket. */
	struct event *poke_ev;
	uint32_t poke_asks; /* pokes that made it ask the tracker */
	struct event *poke_retry_ev; /* its name was taken: binding again */
	uint32_t poke_tries;

	/* The version under way (version.c). */
	struct agent_version *ver;
	struct agent_version *stopped_ver; /* node_agent_stop -> node_agent_free */
	/* Tracker requests of a version: an answer counts only for the version
	 * that asked, not for one started since. */
	uint64_t version_ids;
	struct agent_version_ask *version_asks;
	uint64_t failed; /* the version we last gave up on, and when */
	uint64_t failed_ms;
	uint64_t failed_wait_ms; /* tried again this much later */
	/* A failure only a person can fix (session.c: agent_needs_fix): said
	 * once, on /healthz until it clears. */
	struct node_fix fix;
	/* Registration answered "no model known yet" since (0: it was not). */
	uint64_t no_model_ms;
	/* A delta could not be applied here: the tracker is told, so that the
	 * publisher sends an anchor next (cleared by any activation). */
	bool need_anchor;
	/* Verified parent links: the last manifest we accepted. */
	uint64_t last_version;
	uint8_t last_digest[PROTO_HASH_BYTES];
	/* The plan from the trainer layout to ours, kept across versions. */
	struct proto_plan plan;
	bool have_plan;
	uint8_t plan_src[PROTO_HASH_BYTES];
	/* Ready ahead of the first version (agent_ready_ahead): the plan
	 * asked for (when last), the slot made once. */
	bool ahead_asked, ahead_slot;
	uint64_t ahead_ms;

	/* What is served (activate.c, inplace.c). */
	struct node_slot *active;
	uint8_t active_digest[PROTO_HASH_BYTES];
	/* Serving processes pin slots through it; it frees retired ones. */
	struct node_attach *attach;
	/* In-place installs: the drain bound's timer, whether an install
	 * paused admission, and whether a failed write left the served slot
	 * incomplete (admission stays paused, the next version must be an
	 * anchor). */
	struct event *inplace_ev;
	bool installing;
	uint64_t inplace_version, inplace_t0_ns;
	struct agent_inplace_prep *inplace_prep; /* a delta's, until it is written */
	bool inplace_broken;

	/* The chain being replayed (chain.c), or NULL; whether a planning
	 * request of one is on its way (its answer is awaited even when the
	 * chain is gone); the target a replay failed for. */
	struct agent_chain *chain;
	bool chain_asking;
	uint64_t chain_failed_v;
	/* Chains planned so far, and the one whose steps' check is on its
	 * way (0: none). */
	uint64_t chain_ids, chain_check;
	/* The delta version the planner chose to fetch whole (0: none), and
	 * one whose whole fetch failed (the chain is taken for it then). */
	uint64_t full_v, full_failed_v;

	struct agent_rlog rlog; /* what rank 0 says for the replica */

	/* The layers below, one each. */
	struct fetcher fx;      /* reading the version's chunks (node/fetch/) */
	struct swarm sw;        /* serving them to peers, other layouts (node/swarm/) */
	struct delta_state ds;  /* building deltas on their parents (node/rebuild/) */
};

/* A failure only a person can fix (why: what failed and what to change):
 * said once at warn (again only when why changes), on /healthz until
 * agent_fixed (node/base/needsfix.h). Returns how long to wait before
 * trying again: doubling from FAILED_RETRY_MS up to max_ms. */
uint64_t agent_needs_fix(struct node_agent *a, const char *why, uint64_t max_ms);
/* What agent_needs_fix said is over (a try succeeded). */
void agent_fixed(struct node_agent *a);

/* ---- version.c: the lifecycle ---- */

/* Starts version v (the replica's target): its manifest is asked for. */
void agent_version_start(struct node_agent *a, uint64_t v);
/* Moves the version under way to stage st (logged). */
void agent_stage(struct node_agent *a, enum agent_stage st);
/* Refuses the version under way: logs and reports why, drops it, and ends
 * a chain replay (an anchor is asked for next). */
void agent_version_fail(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The same, said at debug: a failure already said (agent_needs_fix). */
void agent_version_fail_quiet(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Drops the version under way (reads in flight finish and are ignored). */
void agent_version_drop(struct node_agent *a);
/* The tracker chose the replica's target t (complete: the replica holds it
 * verified, with the other ranks' statements): work toward it, activate. */
void agent_follow_target(struct node_agent *a, uint64_t t, bool complete, json_t *statements);
/* The fetcher's hook: every chunk of the version is verified (a delta is
 * rebuilt next). */
void agent_version_fetched(void *arg);
/* Registered and holding no version: the first version's slot and the plan
 * made ahead, once each. */
void agent_ready_ahead(struct node_agent *a);
/* Notes v fresh when the /versions answer says the tracker published it
 * less than STARVE_MS ago. */
void agent_note_fresh(struct node_agent *a, uint64_t v, uint64_t now_ms,
		      const struct trk_version_info *vs, size_t n);
/* The slot a delta of the version under way builds on, and its manifest
 * digest: the chain's last step while replaying one, else the active slot
 * (NULL: none). */
struct node_slot *agent_delta_parent(const struct node_agent *a, const uint8_t **digest);
/* The periodic tick: the swarm's and the fetch's, reports. */
void agent_on_tick(evutil_socket_t fd, short what, void *arg);

/* Frees the tickets still out for the version's tracker requests
 * (node_agent_free). */
void agent_version_asks_fini(struct node_agent *a);

/* ---- session.c: tracker I/O ---- */

void agent_start_register(struct node_agent *a);
void agent_on_retry(evutil_socket_t fd, short what, void *arg);
void agent_heartbeat(evutil_socket_t fd, short what, void *arg);
void agent_on_chain_lost(void *arg, const char *why);
/* Reports state st of version to the tracker (with the version's or the
 * chain's counters, signed statements for verified and active). */
void agent_report(struct node_agent *a, uint64_t version, enum trk_rank_state st,
		  const char *error, trk_client_cb cb);
/* Asks the tracker for the replica (its target and where it is complete). */
void agent_sync_now(struct node_agent *a);
/* The sync timer's next period (faster while verified and waiting). */
uint64_t agent_sync_period(const struct node_agent *a);
void agent_on_sync_timer(evutil_socket_t fd, short what, void *arg);

/* ---- activate.c ---- */

/* The replica agreed: switch the served slot (or install in place). */
void agent_activate(struct node_agent *a);
/* a->active serves the version under way now (old: the slot served
 * before; the same slot when written in place): report, metrics, attach;
 * the version is kept served by the swarm. */
void agent_activated(struct node_agent *a, struct node_slot *old);
/* The tracker's claim that the replica is complete holds: every other
 * rank's signed statement comes with it. */
bool agent_replica_backed(struct node_agent *a, json_t *statements);
int agent_probe_expose(struct node_agent *a, struct proto_err *err);
void agent_expose_blocked(struct node_agent *a, const char *what, const struct proto_err *err);
/* In place (inplace.c says why): the record of slot serving v is written
 * beside the record before the pause (stage), renamed over it in the pause
 * (commit), fsync'ed after (sync; a failure is logged). unstage drops a
 * staged record that is not committed. */
int agent_stage_expose(struct node_agent *a, struct node_slot *slot, uint64_t v,
		       const uint8_t *digest, struct proto_err *err);
int agent_commit_expose(struct node_agent *a, struct proto_err *err);
void agent_unstage_expose(struct node_agent *a);
void agent_sync_expose(struct node_agent *a);
/* Removes the record when it names this process (the node stops: the
 * memory it names goes with it); a failure is logged. */
void agent_unexpose(struct node_agent *a);

/* ---- inplace.c ---- */

/* The node installs versions in place (--install in-place) and has a
 * served slot to write into. */
bool agent_inplace(const struct node_agent *a);
/* The replica agreed: pause admission, drain pins (bounded), write the
 * version into the served slot, resume. */
void agent_inplace_start(struct node_agent *a);
void agent_inplace_fini(struct node_agent *a);

/* ---- chain.c ---- */

/* The version under way is a delta whose parent this node does not hold:
 * plans a chain replay, or a fetch of the version whole; the version is
 * dropped meanwhile. 0 when it took over; -1 when no replay is possible
 * now (the caller asks for an anchor). */
int agent_chain_begin(struct node_agent *a);
/* At verification: a step before the chain's target passes its slot on to
 * the next step, which starts: true. False when there is no chain or the
 * version is its target. */
bool agent_chain_step_done(struct node_agent *a);
/* The parent slot of a delta while replaying a chain (NULL: none) and its
 * digest. */
struct node_slot *agent_chain_parent(const struct node_agent *a, const uint8_t **digest);
/* Asks the tracker whether the steps the replay still needs are served
 * (a version was published, or a step waits with no source): one that is
 * withdrawn makes the target planned again. Cannot fail (a request not
 * sent is tried at the next occasion). */
void agent_chain_check(struct node_agent *a);
/* The tick: a step that has waited with no source (said by the fetcher)
 * has the steps checked, once every CHAIN_CHECK_MS at most. */
void agent_chain_sourceless(struct node_agent *a);
/* Ends the chain (after the version building on its slot was freed);
 * failed: the target is not replayed again. NULL chain is fine. */
void agent_chain_end(struct node_agent *a, bool failed);

/* ---- replica_log.c: the replica's lines, said by its rank 0 ---- */

enum agent_lag_event {
	AGENT_LAG_NONE,
	AGENT_LAG_BEHIND,    /* it falls behind: say so, once */
	AGENT_LAG_CAUGHT_UP, /* it serves the latest again */
};
/* The policy, pure: whether a replica said behind (or not) falls behind or
 * catches up at lag_versions (the tracker's latest - active). Behind at
 * AGENT_BEHIND_VERSIONS or more, caught up at 0: one line each way, not
 * one per version while behind. */
enum agent_lag_event agent_lag_event(bool behind, uint64_t lag_versions);
/* The lag the policy is given, pure: latest - active; for a replica with
 * none active (active 0) that joined at joined_v, counted as if it held
 * joined_v - 1 (at least 1): it is not behind until a version after the
 * one it joined at is out. */
uint64_t agent_lag_versions(uint64_t active, uint64_t latest, uint64_t joined_v);
/* A watch answer (the tracker's versions, its clock now_ms): their publish
 * times, kept for the activation line. Cannot fail. */
void agent_rlog_published(struct node_agent *a, const struct trk_version_info *vs, size_t n,
			  uint64_t now_ms);
/* A replica answer (GET /replicas/R) naming target: says the activation
 * line once the whole replica is active on rank 0's version, with every
 * rank's bytes, and when the replica falls behind or catches up. Only rank
 * 0 says anything. Cannot fail. */
void agent_rlog_sync(struct node_agent *a, json_t *rep, uint64_t target);
/* Rank 0 switched to version (how: delta, chain, full; our bytes by
 * source; the manifest's created_ms, for when its publish time is not
 * known): the replica's activation line is said by agent_rlog_sync once
 * the replica is whole on it (at once for a replica of one rank). Cannot
 * fail. */
void agent_rlog_activated(struct node_agent *a, uint64_t version, const char *how,
			  uint64_t from_trainer, uint64_t from_peers, uint64_t created_ms);

/* ---- poke.c ---- */

void agent_poke_open(struct node_agent *a);
void agent_poke_close(struct node_agent *a);
/* The tracker took our verified report of version: the replica's other
 * ranks on this host ask it now (best effort, cannot fail). */
void agent_poke_siblings(struct node_agent *a, uint64_t version);

#endif
