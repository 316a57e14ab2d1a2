/* What a node agent measures, as series of node/metrics.h: names, labels and
 * help in one place; agent.c updates them by handle. */
#ifndef NODE_AGENT_METRICS_H
#define NODE_AGENT_METRICS_H

#include "node/metrics.h"

struct node_agent_metrics {
	struct node_metrics *m; /* NULL: nothing is measured */
	int active_version, serving_bytes, registered;
	int fetched_trainer, fetched_peer;
	int failed_hash, failed_read, stalled;
	int activations, refused, activation_seconds;
	int unbacked_claims;
	int duplicate, banned, offered_parcels;
	int delta_versions, full_versions, delta_refused;
};

/* Registers the node's series in m (NULL: every handle stays a no-op).
 * Returns 0 or a negative errno (then handles are no-ops). */
int node_agent_metrics_init(struct node_agent_metrics *am, struct node_metrics *m);

#endif
