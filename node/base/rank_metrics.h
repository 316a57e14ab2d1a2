/* What a node measures of one rank, as series of proto/metrics.h: names,
 * labels and help in one place; the agent, fetcher and swarm update them
 * by handle. */
#ifndef NODE_RANK_METRICS_H
#define NODE_RANK_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/metrics.h"

struct node_rank_metrics {
	struct proto_metrics *m; /* NULL: nothing is measured */
	int active_version, serving_bytes, registered;
	int fetched_trainer, fetched_peer, fetched_peer_slot, fetched_far, read_runs;
	int failed_hash, failed_read, stalled;
	int activations, refused, activation_seconds;
	int unbacked_claims;
	int duplicate, banned, offered_parcels;
	int unowned_trainer, seed_parcels, budget_refusals;
	int delta_versions, full_versions, delta_refused;
	int delta_rotations, delta_copies; /* how a delta's slot got its parent */
	int ready_ahead_plan, ready_ahead_slot; /* made before the first version */
	int health; /* the rank's part of /healthz (proto_metrics_health_part) */
	/* The rank's health as last set, and a failure only a person can fix
	 * ("" when none), which /healthz says instead while it lasts. */
	bool ok;
	char why[256];
	char fix[512];
};

/* Registers the series of one rank in m, labelled replica="R",rank="N"
 * (a multi-rank node registers each of its ranks in one registry), and the
 * rank's part of /healthz (NULL m: every handle stays a no-op). Returns 0
 * or a negative errno (then handles are no-ops). */
int node_rank_metrics_init(struct node_rank_metrics *am, struct proto_metrics *m,
			    const char *replica, uint32_t rank);
/* The rank's health for /healthz: ok, or not and why. */
void node_rank_metrics_health(struct node_rank_metrics *am, bool ok, const char *why);
/* A failure that retrying cannot heal (a wrong key, a wrong URL): /healthz
 * says why (what to change) until it is called with NULL, whatever else
 * sets the rank's health meanwhile. */
void node_rank_metrics_needs_fix(struct node_rank_metrics *am, const char *why);

#endif
