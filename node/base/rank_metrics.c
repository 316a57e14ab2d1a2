/* A rank's series: Prometheus names with units and _total. */
#include "node/base/rank_metrics.h"

#include <stdio.h>

/* Seconds from the first sight of a version to its activation. */
static const double activation_bounds[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500};

/* "who,extra": the rank's labels then the series' own (NULL: none). */
static const char *lbl(char *buf, size_t len, const char *who, const char *extra)
{
	snprintf(buf, len, "%s%s%s", who, extra ? "," : "", extra ? extra : "");
	return buf;
}

int node_rank_metrics_init(struct node_rank_metrics *am, struct proto_metrics *m,
			    const char *replica, uint32_t rank)
{
	char who[160], b[256], part[160];

	*am = (struct node_rank_metrics){
		.active_version = -1, .serving_bytes = -1, .registered = -1,
		.fetched_trainer = -1, .fetched_peer = -1, .fetched_peer_slot = -1, .fetched_far = -1,
		.read_runs = -1,
		.failed_hash = -1,
		.failed_read = -1, .stalled = -1, .activations = -1, .refused = -1,
		.activation_seconds = -1, .unbacked_claims = -1, .duplicate = -1, .banned = -1,
		.offered_parcels = -1, .unowned_trainer = -1, .seed_parcels = -1,
		.budget_refusals = -1, .delta_versions = -1, .full_versions = -1,
		.delta_refused = -1, .delta_rotations = -1, .delta_copies = -1,
		.ready_ahead_plan = -1, .ready_ahead_slot = -1, .health = -1,
	};
	if (m == NULL)
		return 0;
	struct node_rank_metrics t = {.m = m};
	snprintf(who, sizeof(who), "replica=\"%s\",rank=\"%u\"", replica, rank);
	snprintf(part, sizeof(part), "%s/%u", replica, rank);
	t.active_version = proto_metrics_gauge(m, "tessera_node_active_version", lbl(b, sizeof(b), who, NULL),
					      "Version this rank serves (0: none yet).");
	t.serving_bytes = proto_metrics_gauge(m, "tessera_node_serving_bytes", lbl(b, sizeof(b), who, NULL),
					     "Bytes of the active version held for peers to read.");
	t.registered = proto_metrics_gauge(m, "tessera_node_registered", lbl(b, sizeof(b), who, NULL),
					  "1 while the node holds a lease at the tracker.");
	t.fetched_trainer = proto_metrics_counter(m, "tessera_node_fetched_bytes_total",
						 lbl(b, sizeof(b), who, "source=\"trainer\""),
						 "Verified bytes fetched, by source kind.");
	t.fetched_peer = proto_metrics_counter(m, "tessera_node_fetched_bytes_total",
					      lbl(b, sizeof(b), who, "source=\"peer\""), "Verified bytes fetched, by source kind.");
	t.fetched_peer_slot = proto_metrics_counter(
		m, "tessera_node_peer_slot_bytes_total", lbl(b, sizeof(b), who, NULL),
		"Verified bytes gathered straight from peers' version slots (of the peer bytes: "
		"chunks the peer copied nowhere else).");
	t.fetched_far = proto_metrics_counter(
		m, "tessera_node_fetched_other_sites_bytes_total", lbl(b, sizeof(b), who, NULL),
		"Verified bytes fetched from sources in another site (--site): what crossed the "
		"wide-area link to this rank.");
	t.read_runs = proto_metrics_counter(
		m, "tessera_node_read_runs_total", lbl(b, sizeof(b), who, NULL),
		"Reads from a publisher that took several chunks at once (a fast link, "
		"TESSERA_READ_CHUNKS).");
	t.failed_hash = proto_metrics_counter(m, "tessera_node_chunk_failures_total",
					     lbl(b, sizeof(b), who, "reason=\"hash\""),
					     "Chunks fetched again: failed hash or failed read.");
	t.failed_read = proto_metrics_counter(m, "tessera_node_chunk_failures_total",
					     lbl(b, sizeof(b), who, "reason=\"read\""),
					     "Chunks fetched again: failed hash or failed read.");
	t.stalled = proto_metrics_counter(m, "tessera_node_stalled_reads_total", lbl(b, sizeof(b), who, NULL),
					 "Reads abandoned after receiving nothing for stall_ms.");
	t.activations = proto_metrics_counter(m, "tessera_node_activations_total", lbl(b, sizeof(b), who, NULL),
					     "Versions activated.");
	t.refused = proto_metrics_counter(m, "tessera_node_refused_versions_total", lbl(b, sizeof(b), who, NULL),
					 "Versions given up (bad manifest, plan mismatch, ...).");
	t.unbacked_claims = proto_metrics_counter(
		m, "tessera_node_unbacked_claims_total", lbl(b, sizeof(b), who, NULL),
		"Tracker claims that the replica is complete that other ranks' statements did not back.");
	t.activation_seconds = proto_metrics_histogram(
		m, "tessera_node_activation_seconds", lbl(b, sizeof(b), who, NULL),
		"From starting to fetch a version to serving it, seconds.", activation_bounds,
		sizeof(activation_bounds) / sizeof(activation_bounds[0]));
	t.duplicate = proto_metrics_counter(m, "tessera_node_duplicate_bytes_total", lbl(b, sizeof(b), who, NULL),
					   "Bytes received for chunks already had or being verified.");
	t.banned = proto_metrics_counter(m, "tessera_node_banned_peers_total", lbl(b, sizeof(b), who, NULL),
					"Peers banned for a version after sending bad chunks twice.");
	t.offered_parcels = proto_metrics_gauge(m, "tessera_node_offered_parcels", lbl(b, sizeof(b), who, NULL),
					       "Parcels this rank offers to its swarms now.");
	t.unowned_trainer = proto_metrics_counter(
		m, "tessera_node_trainer_unowned_bytes_total", lbl(b, sizeof(b), who, NULL),
		"Verified bytes taken from the trainer for chunks another reader owned (it died, "
		"left or was slow; capped readers' chunks included).");
	t.seed_parcels = proto_metrics_gauge(m, "tessera_node_seed_parcels", lbl(b, sizeof(b), who, NULL),
					    "Parcels this rank reads from the trainer as one of its readers "
					    "(TESSERA_PUB_UPLOAD_READERS).");
	t.budget_refusals = proto_metrics_counter(
		m, "tessera_node_budget_refusals_total", lbl(b, sizeof(b), who, NULL),
		"Times a peer's upload budget left this rank out (its chunks were read elsewhere).");
	t.delta_versions = proto_metrics_counter(m, "tessera_node_versions_built_total",
						lbl(b, sizeof(b), who, "how=\"delta\""),
						"Versions built, by how: from the parent by delta, or full.");
	t.full_versions = proto_metrics_counter(m, "tessera_node_versions_built_total",
					       lbl(b, sizeof(b), who, "how=\"full\""),
					       "Versions built, by how: from the parent by delta, or full.");
	t.delta_refused = proto_metrics_counter(m, "tessera_node_delta_refused_total", lbl(b, sizeof(b), who, NULL),
					       "Delta versions not built here (parent missing or its checksum differs); an anchor was asked for.");
	t.delta_rotations = proto_metrics_counter(
		m, "tessera_node_delta_parents_total", lbl(b, sizeof(b), who, "how=\"rotation\""),
		"Delta versions built, by how their slot got the parent: rotation (the retired slot "
		"caught up by the last delta) or a dense copy of the active slot.");
	t.delta_copies = proto_metrics_counter(
		m, "tessera_node_delta_parents_total", lbl(b, sizeof(b), who, "how=\"copy\""),
		"Delta versions built, by how their slot got the parent: rotation (the retired slot "
		"caught up by the last delta) or a dense copy of the active slot.");
	static const char ahead[] = "What this rank made ready before its first version existed: "
				    "the plan from the trainer layout, the version slot.";
	t.ready_ahead_plan = proto_metrics_counter(m, "tessera_node_ready_ahead_total",
						  lbl(b, sizeof(b), who, "what=\"plan\""), ahead);
	t.ready_ahead_slot = proto_metrics_counter(m, "tessera_node_ready_ahead_total",
						  lbl(b, sizeof(b), who, "what=\"slot\""), ahead);
	t.health = proto_metrics_health_part(m, part);
	const int hs[] = {t.active_version, t.serving_bytes, t.registered, t.fetched_trainer,
			  t.fetched_peer, t.fetched_peer_slot, t.fetched_far, t.read_runs, t.failed_hash, t.failed_read, t.stalled,
			  t.activations, t.refused, t.activation_seconds, t.unbacked_claims,
			  t.duplicate, t.banned, t.offered_parcels, t.unowned_trainer,
			  t.seed_parcels, t.budget_refusals, t.delta_versions,
			  t.full_versions, t.delta_refused, t.delta_rotations, t.delta_copies,
			  t.ready_ahead_plan, t.ready_ahead_slot, t.health};
	for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++)
		if (hs[i] < 0)
			return hs[i];
	*am = t;
	node_rank_metrics_health(am, false, "not registered with the tracker yet");
	return 0;
}

void node_rank_metrics_health(struct node_rank_metrics *am, bool ok, const char *why)
{
	am->ok = ok;
	snprintf(am->why, sizeof(am->why), "%s", why ? why : "");
	if (am->fix[0] != 0)
		proto_metrics_set_part_health(am->m, am->health, false, am->fix);
	else
		proto_metrics_set_part_health(am->m, am->health, ok, why);
}

void node_rank_metrics_needs_fix(struct node_rank_metrics *am, const char *why)
{
	char was[sizeof(am->why)];

	snprintf(am->fix, sizeof(am->fix), "%s", why ? why : "");
	snprintf(was, sizeof(was), "%s", am->why);
	node_rank_metrics_health(am, am->ok, was);
}
