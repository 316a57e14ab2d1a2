/*
 * The node agent: one rank of one serving replica.
 *
 * It registers with the tracker (replica, rank, layout, fabric address),
 * keeps its lease alive and long-polls for versions. It works only toward
 * its replica's target, the version the tracker chose for the whole
 * replica (tracker/API.md, "Replica targets"), and drops any other when
 * the target moves. A version goes through named stages (internal.h, enum
 * agent_stage): its signed manifest and parent link, our layout's parcels
 * (by addendum when needed), the plan, the fetch of exactly our parcels
 * (node/fetch/: every chunk hashed against the manifest before it counts),
 * a delta's rebuild on its parent (node/rebuild/), the verified report;
 * it activates only once the tracker says every rank of its replica holds
 * the version verified and every other rank's signed statement backs that
 * (replica-local, all or nothing). Until then the previous version keeps
 * serving from its own slot.
 *
 * Activation is honest: with an expose directory (created if missing) the
 * node is active on a version only once its activation record names it.
 * When the directory cannot be written the node does not report the version
 * verified (so its replica does not switch without it) or, if writing the
 * record itself fails, keeps serving the old slot; either way it reports
 * "failed" with the reason and tries again while the version is its target.
 *
 * Everything runs on one libevent loop; the agent owns its state. One
 * process may run several agents, one per rank it serves (node/host/host.h):
 * they share the loop, the tracker client and the fabric endpoint, which
 * the host owns and lends them (struct node_agent_shared); each keeps its
 * own identity at the tracker, its store, its registered memory and its
 * fetches.
 */
#ifndef NODE_AGENT_H
#define NODE_AGENT_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto/util.h"
#include "tracker/tracker.h"

struct trk_client;
struct fab_ctx;
struct node_fabloop;

/* What the agents of one process share, owned by its host (node/host/host.h):
 * the tracker client (it keeps each rank's session), the fabric endpoint
 * and the loop driving it. They outlive the agents. */
struct node_agent_shared {
	struct trk_client *trk;
	struct fab_ctx *fab;
	struct node_fabloop *fl;
	/* The endpoint the agents read their peers' have-pages over, and its
	 * loop (node/fetch/pace.c); NULL: they read them over fab. */
	struct fab_ctx *hfab;
	struct node_fabloop *hfl;
	/* The host renews every agent's lease in one request from its own
	 * thread (node/host/beat.h): agents then send no heartbeat of their
	 * own. */
	bool host_heartbeat;
	/* Set by a host of several ranks: sources queries go through it,
	 * batched with its other ranks' (node/host/host_sources.c); NULL: one
	 * GET per parcel. Same contract as trk_client_sources. */
	int (*sources)(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg);
	void *sources_ctx;
	/* Likewise the version watch: one held for the host's ranks
	 * (node/host/host_watch.c); NULL: each its own. trk_client_watch's
	 * contract. */
	int (*watch)(void *ctx, uint64_t after, uint32_t wait_ms, trk_client_cb cb, void *arg);
	void *watch_ctx;
};

struct node_perm;

struct node_agent_opts {
	const struct node_agent_shared *shared; /* required */
	const char *tracker_url;
	const char *replica;
	uint32_t rank;
	const char *layout;        /* layout file, or a built-in (tp2, ...) */
	const char *model;         /* model spec file */
	const char *trainer_pubkey;
	const char *cluster_key;   /* NULL: unsigned requests */
	const char *tls_ca;        /* CA file for an https:// tracker (NULL: system's) */
	const char *site;          /* where the host is (--site; NULL: the unnamed site) */
	const char *provider;      /* NULL: tcp;ofi_rxm */
	/* The interface the fabric endpoints bind (--fabric-iface); NULL: the
	 * one the route to the tracker leaves from (node/base/fabiface.h). */
	const char *fabric_iface;
	const char *store;         /* "host", "cuda" or "auto" (NULL) */
	unsigned store_index;      /* the rank's place in its process (node_store_spread) */
	const char *expose_dir;    /* NULL: no activation records */
	const char *attach_path;   /* Unix socket for serving processes (node/serve/attach.h); NULL: none */
	const struct node_perm *attach_perm; /* its mode and group (node/serve/perm.h); NULL: as made */
	/* --install in-place: versions are written into the served slot at
	 * activation (node/agent/inplace.c); else double-buffered. */
	bool install_inplace;
	const char *host;          /* host name to report (NULL: gethostname) */
	struct proto_metrics *metrics; /* series to update (NULL: none); outlives the agent */
};

struct node_agent;

/* For the host's heartbeat (node_agent_shared.host_heartbeat): fills e
 * with a's node id (borrowed from a) and what serving processes pin on it;
 * false when a is not registered or is leaving (nothing to renew). */
struct trk_hb_node;
bool node_agent_heartbeat_entry(struct node_agent *a, struct trk_hb_node *e);
/* The tracker answered that a's lease ran out: a registers again. True
 * when it does (false: not registered, or leaving); the caller says so,
 * once for all the ranks it carries. Cannot fail. */
bool node_agent_lease_lost(struct node_agent *a);

/* Loads keys, model and layout, opens the store and registers its read
 * buffers with the shared endpoint; nothing is sent yet (node_agent_start).
 * On failure *out is NULL and err says why. */
int node_agent_new(struct event_base *base, const struct node_agent_opts *o,
		   struct node_agent **out, struct proto_err *err);
/* Starts registering and the agent's timers. */
void node_agent_start(struct node_agent *a);
/* The digest of the agent's layout (PROTO_HASH_BYTES), for the host to
 * check that the ranks of one replica agree on it. */
const uint8_t *node_agent_layout_digest(const struct node_agent *a);
/* The tracker client's chain guard (trk_client_on_chain_lost) for this
 * agent: the host hears it once and tells every agent. */
void node_agent_chain_lost(struct node_agent *a, const char *why);
/* Non-zero once the agent gave up (e.g. registration refused); err says why.
 * The agent has then asked its base to exit. */
int node_agent_failed(const struct node_agent *a, struct proto_err *err);
/* The version the agent serves now (0: none yet). */
uint64_t node_agent_active(const struct node_agent *a);
/* The node is stopping (SIGTERM): tells the tracker it leaves (signed with
 * its session, as its heartbeats are), so that peers stop being sent to it
 * and its replica shows incomplete at once rather than at lease expiry.
 * From now on it neither heartbeats nor registers again. done(arg) runs
 * once, from the loop, when the tracker answered or after at most
 * LEAVE_WAIT_MS (leave.c); also when the node was not registered. */
void node_agent_leave(struct node_agent *a, void (*done)(void *arg), void *arg);
/* Teardown is in two steps around the shared endpoint's fab_close (whose
 * cancelled operations call back into the agents): node_agent_stop frees
 * the timers and detaches the fetch, so that callbacks find nothing to do;
 * node_agent_free, after fab_close, frees the rest in reverse order. NULL
 * is fine for both. */
void node_agent_stop(struct node_agent *a);
void node_agent_free(struct node_agent *a);

#endif
