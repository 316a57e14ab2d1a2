/* The node agent's series: Prometheus names with units and _total. */
#include "node/agent_metrics.h"

/* Seconds from the first sight of a version to its activation. */
static const double activation_bounds[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500};

int node_agent_metrics_init(struct node_agent_metrics *am, struct node_metrics *m)
{
	*am = (struct node_agent_metrics){
		.active_version = -1, .serving_bytes = -1, .registered = -1,
		.fetched_trainer = -1, .fetched_peer = -1, .failed_hash = -1,
		.failed_read = -1, .stalled = -1, .activations = -1, .refused = -1,
		.activation_seconds = -1, .unbacked_claims = -1, .duplicate = -1, .banned = -1,
		.offered_parcels = -1, .delta_versions = -1, .full_versions = -1,
		.delta_refused = -1,
	};
	if (m == NULL)
		return 0;
	struct node_agent_metrics t = {.m = m};
	t.active_version = node_metrics_gauge(m, "tessera_node_active_version", NULL,
					      "Version this rank serves (0: none yet).");
	t.serving_bytes = node_metrics_gauge(m, "tessera_node_serving_bytes", NULL,
					     "Bytes of the active version held for peers to read.");
	t.registered = node_metrics_gauge(m, "tessera_node_registered", NULL,
					  "1 while the node holds a lease at the tracker.");
	t.fetched_trainer = node_metrics_counter(m, "tessera_node_fetched_bytes_total",
						 "source=\"trainer\"",
						 "Verified bytes fetched, by source kind.");
	t.fetched_peer = node_metrics_counter(m, "tessera_node_fetched_bytes_total",
					      "source=\"peer\"", "Verified bytes fetched, by source kind.");
	t.failed_hash = node_metrics_counter(m, "tessera_node_chunk_failures_total",
					     "reason=\"hash\"",
					     "Chunks fetched again: failed hash or failed read.");
	t.failed_read = node_metrics_counter(m, "tessera_node_chunk_failures_total",
					     "reason=\"read\"",
					     "Chunks fetched again: failed hash or failed read.");
	t.stalled = node_metrics_counter(m, "tessera_node_stalled_reads_total", NULL,
					 "Reads abandoned after receiving nothing for stall_ms.");
	t.activations = node_metrics_counter(m, "tessera_node_activations_total", NULL,
					     "Versions activated.");
	t.refused = node_metrics_counter(m, "tessera_node_refused_versions_total", NULL,
					 "Versions given up (bad manifest, plan mismatch, ...).");
	t.unbacked_claims = node_metrics_counter(
		m, "tessera_node_unbacked_claims_total", NULL,
		"Tracker claims that the replica is complete that other ranks' statements did not back.");
	t.activation_seconds = node_metrics_histogram(
		m, "tessera_node_activation_seconds",
		"From starting to fetch a version to serving it, seconds.", activation_bounds,
		sizeof(activation_bounds) / sizeof(activation_bounds[0]));
	t.duplicate = node_metrics_counter(m, "tessera_node_duplicate_bytes_total", NULL,
					   "Bytes received for chunks already had or being verified.");
	t.banned = node_metrics_counter(m, "tessera_node_banned_peers_total", NULL,
					"Peers banned for a version after sending bad chunks twice.");
	t.offered_parcels = node_metrics_gauge(m, "tessera_node_offered_parcels", NULL,
					       "Parcels this rank offers to its swarms now.");
	t.delta_versions = node_metrics_counter(m, "tessera_node_versions_built_total",
						"how=\"delta\"",
						"Versions built, by how: from the parent by delta, or full.");
	t.full_versions = node_metrics_counter(m, "tessera_node_versions_built_total",
					       "how=\"full\"",
					       "Versions built, by how: from the parent by delta, or full.");
	t.delta_refused = node_metrics_counter(m, "tessera_node_delta_refused_total", NULL,
					       "Delta versions not built here (parent missing or its checksum differs); an anchor was asked for.");
	const int hs[] = {t.active_version, t.serving_bytes, t.registered, t.fetched_trainer,
			  t.fetched_peer, t.failed_hash, t.failed_read, t.stalled,
			  t.activations, t.refused, t.activation_seconds, t.unbacked_claims,
			  t.duplicate, t.banned, t.offered_parcels, t.delta_versions,
			  t.full_versions, t.delta_refused};
	for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
		if (hs[i] < 0)
			return hs[i];
	*am = t;
	node_metrics_set_health(m, false, "not registered with the tracker yet");
	return 0;
}
