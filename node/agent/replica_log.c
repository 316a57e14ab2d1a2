/* What a replica says at the default log level (note), said once for the
 * whole replica by its rank 0: each activation, and when it falls behind
 * the trainer and catches up again. */
#include "node/agent/internal.h"

/*
 * Why rank 0: every replica has exactly one, wherever its ranks run (one
 * tessera-node for all of them, or one per rank on several hosts), so a
 * replica of N ranks prints one line per event, not N. Rank 0 notes its
 * own switch (the time since the publish, its bytes) and says the line
 * once the tracker's replica answer (GET /replicas/R, polled every
 * SYNC_MS) shows the whole replica active on it: the other ranks' bytes
 * by source come from their own reports there.
 */

enum agent_lag_event agent_lag_event(bool behind, uint64_t lag_versions)
{
	if (!behind && lag_versions >= AGENT_BEHIND_VERSIONS)
		return AGENT_LAG_BEHIND;
	if (behind && lag_versions == 0)
		return AGENT_LAG_CAUGHT_UP;
	return AGENT_LAG_NONE;
}

uint64_t agent_lag_versions(uint64_t active, uint64_t latest, uint64_t joined_v)
{
	if (active != 0)
		return latest > active ? latest - active : 0;
	if (joined_v == 0)
		return latest;
	return latest >= joined_v ? latest - joined_v + 1 : 1;
}

static bool speaks(const struct node_agent *a)
{
	return a->o.rank == 0;
}

void agent_rlog_published(struct node_agent *a, const struct trk_version_info *vs, size_t n,
			  uint64_t now_ms)
{
	struct agent_rlog *r = &a->rlog;
	uint64_t mono = node_now_ms();

	if (!speaks(a) || now_ms == 0)
		return;
	for (size_t i = 0; i < n; i++) {
		bool known = false;
		for (size_t k = 0; k < AGENT_RLOG_PUBLISHED && !known; k++)
			known = r->pub[k].version == vs[i].version;
		if (known || vs[i].published_ms == 0)
			continue;
		r->pub[r->next] = (struct agent_rlog_pub){vs[i].version, UINT64_MAX, vs[i].published_ms};
		r->next = (r->next + 1) % AGENT_RLOG_PUBLISHED;
	}
	/* On this node's monotonic clock: the tracker's wall clock is used
	 * only for ages (its now_ms - its published_ms), never compared with
	 * ours. An answer read late (the node was stopped, its loop busy)
	 * makes a publish look later than it was, never earlier: each
	 * version keeps the earliest estimate any answer gives, this one's
	 * for versions it does not list too (a stopped node reads the answer
	 * that woke it late, and the next, fresh one lists only newer
	 * versions). */
	for (size_t k = 0; k < AGENT_RLOG_PUBLISHED; k++) {
		struct agent_rlog_pub *e = &r->pub[k];
		if (e->version == 0 || e->tracker_ms > now_ms || now_ms - e->tracker_ms >= mono)
			continue;
		e->mono_ms = PROTO_MIN(e->mono_ms, mono - (now_ms - e->tracker_ms));
	}
}

/* Bytes a rank entry of a replica answer reports for version v; false
 * when it reports on another version. */
static bool rank_bytes(json_t *rk, uint64_t v, uint64_t *trainer, uint64_t *peers)
{
	const char *st = json_string_value(json_object_get(rk, "state"));

	if ((uint64_t)json_integer_value(json_object_get(rk, "version")) != v || st == NULL ||
	    (strcmp(st, "verified") != 0 && strcmp(st, "active") != 0))
		return false;
	*trainer = (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer"));
	*peers = (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers"));
	return true;
}

/* Why the replica is behind, from its ranks' entries: those that do not
 * hold its target verified yet, and how far they are. */
static void behind_why(json_t *rep, uint64_t target, char *out, size_t len)
{
	size_t n = 0, i;
	json_t *rk;

	out[0] = 0;
	json_array_foreach(json_object_get(rep, "ranks"), i, rk)
	{
		const char *st = json_string_value(json_object_get(rk, "state"));
		uint64_t v = (uint64_t)json_integer_value(json_object_get(rk, "version"));
		uint64_t done = (uint64_t)json_integer_value(json_object_get(rk, "bytes_done"));
		uint64_t total = (uint64_t)json_integer_value(json_object_get(rk, "bytes_total"));
		int rank = (int)json_integer_value(json_object_get(rk, "rank"));
		char what[96];

		if (st == NULL)
			continue;
		if (!json_is_true(json_object_get(rk, "alive")))
			snprintf(what, sizeof(what), "%s",
				 json_is_null(json_object_get(rk, "id")) ? "never registered" : "gone");
		else if (v == target && (strcmp(st, "verified") == 0 || strcmp(st, "active") == 0))
			continue;
		else if (strcmp(st, "fetching") == 0 && total > 0 && v != 0)
			snprintf(what, sizeof(what), "fetching v%" PRIu64 " (%" PRIu64 "%%)", v,
				 done * 100 / total);
		else if (strcmp(st, "active") == 0 && v != 0)
			snprintf(what, sizeof(what), "holds v%" PRIu64, v);
		else if (v == 0) /* registered, no version yet */
			snprintf(what, sizeof(what), "%s", st);
		else
			snprintf(what, sizeof(what), "%s v%" PRIu64, st, v);
		n += (size_t)snprintf(out + n, n < len ? len - n : 0, "%srank %d %s", n ? ", " : "",
				      rank, what);
	}
	if (n == 0)
		snprintf(out, len, "every rank holds v%" PRIu64 ": switching to it", target);
}

/* Bytes as a person reads them: "512 B", "70.3 KiB", "3.4 MiB", "1.20 GiB". */
static void human_bytes(uint64_t n, char *out, size_t len)
{
	if (n < 1024)
		snprintf(out, len, "%" PRIu64 " B", n);
	else if (n < (1u << 20))
		snprintf(out, len, "%.1f KiB", (double)n / 1024);
	else if (n < (1ull << 30))
		snprintf(out, len, "%.1f MiB", (double)n / (1 << 20));
	else
		snprintf(out, len, "%.2f GiB", (double)n / (1ull << 30));
}

/* Says the pending activation line, with the other ranks' bytes from the
 * replica answer rep (NULL: ours alone). */
static void say_activated(struct node_agent *a, json_t *rep)
{
	struct agent_rlog *r = &a->rlog;
	uint64_t from_trainer = r->own_trainer, from_peers = r->own_peers, trainer, peers;
	uint32_t counted = 1;
	char tb[32], pb[32], ranks[64] = "";
	size_t i;
	json_t *rk;

	json_array_foreach(json_object_get(rep, "ranks"), i, rk)
	{
		if (json_integer_value(json_object_get(rk, "rank")) == (json_int_t)a->o.rank ||
		    !rank_bytes(rk, r->said_v, &trainer, &peers))
			continue;
		from_trainer += trainer;
		from_peers += peers;
		counted++;
	}
	human_bytes(from_trainer, tb, sizeof(tb));
	human_bytes(from_peers, pb, sizeof(pb));
	if (counted < a->layout.nranks)
		snprintf(ranks, sizeof(ranks), "; bytes of %u of its %u ranks", counted,
			 a->layout.nranks);
	LOG_NOTE("replica %s: v%" PRIu64 " active (%s, %s; %s from the trainer, %s from peers%s)",
		 a->o.replica, r->said_v, r->how, r->when, tb, pb, ranks);
	r->said_v = 0;
}

/* When the replica really fell behind: the publish of the first version
 * it lacked (on our clock, agent_rlog_published), else when it was
 * noticed. A node stopped or cut off notices late: the publish says the
 * truth. */
static uint64_t behind_since(const struct agent_rlog *r, bool *published)
{
	*published = false;
	for (size_t k = 0; k < AGENT_RLOG_PUBLISHED; k++)
		if (r->pub[k].version == r->behind_from && r->pub[k].mono_ms != UINT64_MAX &&
		    r->pub[k].mono_ms <= r->behind_ms) {
			*published = true;
			return r->pub[k].mono_ms;
		}
	return r->behind_ms;
}

void agent_rlog_sync(struct node_agent *a, json_t *rep, uint64_t target)
{
	struct agent_rlog *r = &a->rlog;
	uint64_t lag, active, latest;
	char why[400];

	if (!speaks(a))
		return;
	active = (uint64_t)json_integer_value(json_object_get(rep, "active"));
	/* The whole replica is active on what rank 0 switched to (or past it). */
	if (r->said_v != 0 && active >= r->said_v)
		say_activated(a, rep);
	if (!json_is_integer(json_object_get(rep, "lag_versions")))
		return;
	latest = active + (uint64_t)json_integer_value(json_object_get(rep, "lag_versions"));
	/* Holding none, it had its first chance at the latest it saw then. */
	if (active == 0 && r->joined_v == 0 && latest != 0) {
		r->joined_v = latest;
		r->joined_ms = node_now_ms();
	}
	lag = agent_lag_versions(active, latest, r->joined_v);
	switch (agent_lag_event(r->behind, lag)) {
	case AGENT_LAG_BEHIND:
		r->behind = true;
		r->behind_ms = node_now_ms();
		r->behind_max = lag;
		r->behind_from = active != 0 ? active + 1 : 0;
		behind_why(rep, target, why, sizeof(why));
		if (active == 0)
			LOG_NOTE("replica %s: falls behind, none active yet (joined at v%" PRIu64
				 ", latest v%" PRIu64 "; working on v%" PRIu64 ": %s)",
				 a->o.replica, r->joined_v, latest, target, why);
		else
			LOG_NOTE("replica %s: falls behind, %" PRIu64 " versions (active v%" PRIu64
				 ", latest v%" PRIu64 "; working on v%" PRIu64 ": %s)",
				 a->o.replica, lag, active, latest, target, why);
		break;
	case AGENT_LAG_CAUGHT_UP:
		r->behind = false;
		if (r->behind_from == 0)
			LOG_NOTE("replica %s: caught up: v%" PRIu64 " active, the latest ("
				 "%.1f s after it joined at v%" PRIu64 "; %" PRIu64
				 " versions behind at most)",
				 a->o.replica, active,
				 (double)(node_now_ms() - r->joined_ms) / 1000.0, r->joined_v,
				 r->behind_max);
		else {
			bool published;
			uint64_t since = behind_since(r, &published);
			char from[48];
			if (published)
				snprintf(from, sizeof(from), "since v%" PRIu64 "'s publish",
					 r->behind_from);
			else /* its publish time unknown */
				snprintf(from, sizeof(from), "since it was seen");
			LOG_NOTE("replica %s: caught up: v%" PRIu64 " active, the latest (behind for "
				 "%.1f s, %s; %" PRIu64 " versions at most)",
				 a->o.replica, active, (double)(node_now_ms() - since) / 1000.0, from,
				 r->behind_max);
		}
		break;
	case AGENT_LAG_NONE:
		r->behind_max = PROTO_MAX(r->behind_max, lag);
		break;
	}
	if (active != 0 && !r->behind) /* should it hold none again, it joins again */
		r->joined_v = 0;
}

void agent_rlog_activated(struct node_agent *a, uint64_t version, const char *how,
			  uint64_t from_trainer, uint64_t from_peers, uint64_t created_ms)
{
	struct agent_rlog *r = &a->rlog;
	bool known = false;

	if (!speaks(a))
		return;
	if (r->said_v != 0) /* switched again before the replica was seen whole */
		say_activated(a, NULL);
	r->said_v = version;
	snprintf(r->how, sizeof(r->how), "%s", how);
	r->own_trainer = from_trainer;
	r->own_peers = from_peers;
	for (size_t k = 0; k < AGENT_RLOG_PUBLISHED && !known; k++)
		if (r->pub[k].version == version && r->pub[k].mono_ms != UINT64_MAX) {
			snprintf(r->when, sizeof(r->when), "%.2f s after its publish",
				 (double)(node_now_ms() - r->pub[k].mono_ms) / 1000.0);
			known = true;
		}
	if (!known && created_ms != 0 && proto_wall_ms() >= created_ms)
		snprintf(r->when, sizeof(r->when), "%.2f s after its export",
			 (double)(proto_wall_ms() - created_ms) / 1000.0);
	else if (!known)
		snprintf(r->when, sizeof(r->when), "its publish time unknown");
	/* A replica of one rank is whole now. */
	if (a->layout.nranks == 1)
		say_activated(a, NULL);
}
