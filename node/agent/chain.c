/* Chain replay: a node that lacks a delta version's parent (a late joiner,
 * a restarted node, one that missed versions) rebuilds it from the latest
 * anchor, or from its active version when that is in the chain, one
 * version at a time: each step is fetched and verified like any version
 * (chunk hashes from its signed manifest; a delta's pieces' checksums after
 * the apply) into a slot that is not served, and each delta is applied only
 * to the step before it, its exact parent. Only the target is reported
 * verified and activated.
 *
 * Or the target whole: once the chain is planned, its wire bytes for our
 * rank (the anchor's, unless the chain starts from the active version,
 * and each delta's) are weighed against the target's raw bytes for our
 * rank. When the whole version is cheaper and replicas hold it complete
 * (GET /holders: of a delta, our own layout's too), the node asks for the
 * raw copy of its layout (proto/addendum.h: signed by the trainer key,
 * chunk hashes of the raw bytes) and fetches the version like a late
 * layout fetches an addendum's, its chunks read from the holders' slots
 * and each verified against the copy's hashes; nothing of it comes from
 * the delta's swarm or its publisher. One line says which way and why.
 * A target with no chain to replay (none served, or longer than
 * TESSERA_CHAIN_MAX) is fetched whole the same way when replicas hold it,
 * else the node asks for an anchor. */
#include "node/agent/internal.h"

static void chain_free(struct agent_chain *c)
{
	free(c->steps);
	free(c->walked);
	free(c->walked_wire);
	free(c->vi);
	free(c);
}

void agent_chain_end(struct node_agent *a, bool failed)
{
	struct agent_chain *c = a->chain;

	if (c == NULL)
		return;
	if (failed)
		a->chain_failed_v = c->target;
	if (c->slot != NULL)
		node_slot_free(&a->store, c->slot);
	a->chain = NULL;
	chain_free(c);
}

/* An anchor newer than the target that the tracker lists as served (0:
 * none, or the versions are not known). */
static uint64_t newer_anchor(const struct agent_chain *c)
{
	uint64_t v = 0;

	for (size_t k = 0; k < c->nvi; k++)
		if (c->vi[k].version > c->target && c->vi[k].kind == PROTO_KIND_ANCHOR &&
		    !c->vi[k].dropped)
			v = PROTO_MAX(v, c->vi[k].version);
	return v;
}

/* No chain to replay: the node keeps serving what it has and asks for an
 * anchor, as it would without a chain (the version is already dropped);
 * when a newer anchor is out, the replica moves on to a newer version
 * instead (the tracker picks its target again once this rank refused it). */
static void no_replay(struct node_agent *a, const char *msg)
{
	struct agent_chain *c = a->chain;
	uint64_t anchor = newer_anchor(c);

	if (anchor != 0)
		LOG_WARN("node %s: v%" PRIu64 " refused: no chain to replay: %s; the anchor v%" PRIu64
			 " is out: the replica moves on to a newer version",
			 a->node_id, c->target, msg, anchor);
	else
		LOG_WARN("node %s: v%" PRIu64 " refused: no chain to replay: %s; falling back to a full "
			 "fetch: asking for an anchor",
			 a->node_id, c->target, msg);
	a->need_anchor |= anchor == 0;
	proto_metrics_add(a->am.m, a->am.delta_refused, 1);
	a->failed = c->target;
	a->failed_ms = node_now_ms();
	agent_report(a, c->target, TRK_STATE_FAILED, msg, NULL);
	agent_chain_end(a, true);
}

static void on_holders(const struct trk_answer *ans, void *arg);

/* Whether the target may be fetched whole: asks for its holders (true;
 * on_holders goes on). Only the latest version is: the publisher makes
 * raw copies of it alone (node/publisher/). */
static bool ask_whole(struct node_agent *a)
{
	struct agent_chain *c = a->chain;

	if (!a->fx.fanout || proto_param(PROTO_PARAM_CHAIN_FULL) == 0 || a->full_failed_v == c->target ||
	    c->latest != c->target ||
	    trk_client_holders(a->trk, c->target, a->layout.digest, on_holders, a) != 0)
		return false;
	a->chain_asking = true;
	return true;
}

/* Planning failed: the target whole, if replicas hold it, else an anchor. */
static void plan_fail(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void plan_fail(struct node_agent *a, const char *fmt, ...)
{
	struct agent_chain *c = a->chain;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->nochain, sizeof(c->nochain), fmt, ap);
	va_end(ap);
	c->planning = false;
	if (!ask_whole(a))
		no_replay(a, c->nochain);
}

/* The target whole (its raw copy, from its holders): the chain ends. */
static void take_whole(struct node_agent *a)
{
	uint64_t target = a->chain->target;

	agent_chain_end(a, false);
	a->full_v = target;
	agent_version_start(a, target);
}

/* Our rank's wire and payload bytes in layout ml of a manifest. */
static void rank_bytes(const struct node_agent *a, const struct proto_mlayout *ml, uint64_t *wire,
		       uint64_t *raw)
{
	*wire = *raw = 0;
	for (uint32_t i = 0; i < ml->nparcels; i++)
		if (ml->parcels[i].dst_rank == a->o.rank) {
			*wire += ml->parcels[i].wire_bytes;
			*raw += ml->parcels[i].bytes;
		}
}

static void next_step(struct node_agent *a)
{
	struct agent_chain *c = a->chain;
	uint64_t hold = proto_param(PROTO_PARAM_TEST_CHAIN_HOLD);

	if (c->next == 0 && hold != 0 && a->seen < hold) { /* agent_chain_check goes on */
		if (!c->held)
			LOG_INFO("node %s: test hold: the chain's first step waits for v%" PRIu64,
				 a->node_id, hold);
		c->held = true;
		return;
	}
	c->held = false;
	agent_version_start(a, c->steps[c->next++]);
}

static void choose(struct node_agent *a, bool full, size_t holders);

/* Whether the tracker lists a chain step (vi, NULL: not listed) as still
 * served in our layout: retained (publishers withdraw the others), offered,
 * and kept in every layout or in ours. */
static bool step_served(const struct node_agent *a, const struct trk_version_info *vi)
{
	bool ours = vi != NULL && (vi->chain || vi->all_layouts);

	for (uint32_t k = 0; vi != NULL && k < vi->nlayouts && !ours; k++)
		ours = sodium_memcmp(vi->layouts[k], a->layout.digest, PROTO_HASH_BYTES) == 0;
	return ours && vi->retain && !vi->dropped;
}

static const struct trk_version_info *find_vi(const struct trk_version_info *vi, size_t n,
					      uint64_t v)
{
	for (size_t k = 0; k < n; k++)
		if (vi[k].version == v)
			return &vi[k];
	return NULL;
}

/* The walk reached an anchor or the active version: the chain is there
 * when the tracker still lists every step as served. */
static void plan_done(struct node_agent *a)
{
	struct agent_chain *c = a->chain;

	c->nsteps = c->nwalked;
	c->steps = calloc(c->nsteps, sizeof(*c->steps));
	if (c->steps == NULL) {
		plan_fail(a, "out of memory");
		return;
	}
	for (uint32_t i = 0; i < c->nsteps; i++) {
		uint64_t v = c->walked[c->nsteps - 1 - i];
		c->steps[i] = v;
		c->wire += c->walked_wire[c->nsteps - 1 - i];
		if (v != c->target && !step_served(a, find_vi(c->vi, c->nvi, v))) {
			plan_fail(a, "v%" PRIu64 " of the chain is no longer served", v);
			return;
		}
	}
	free(c->vi);
	c->vi = NULL;
	c->nvi = 0;
	c->planning = false;
	/* The whole version is worth asking about only when it is cheaper. */
	if (c->target_raw < c->wire && ask_whole(a))
		return;
	choose(a, false, 0);
}

/* The chain is planned: replay it, or (full, with holders) fetch the
 * target whole; says which and why. */
static void choose(struct node_agent *a, bool full, size_t holders)
{
	struct agent_chain *c = a->chain;
	uint64_t target = c->target;
	uint32_t deltas = c->nsteps - (c->from_active ? 0 : 1);
	char from[80];

	snprintf(from, sizeof(from), "%s v%" PRIu64, c->from_active ? "from the active" : "the anchor",
		 c->from_active ? a->active->version : c->steps[0]);
	if (full) {
		LOG_INFO("node %s: v%" PRIu64 " without its parent: fetching it whole from %zu "
			 "holder%s: %" PRIu64 " bytes for this rank, cheaper than the chain (%s, then "
			 "%u delta%s: %" PRIu64 " wire bytes)",
			 a->node_id, target, holders, holders == 1 ? "" : "s", c->target_raw, from,
			 deltas, deltas == 1 ? "" : "s", c->wire);
		take_whole(a);
		return;
	}
	LOG_INFO("node %s: replaying the chain to v%" PRIu64 ": %s, then %u delta%s, "
		 "%" PRIu64 " wire bytes for this rank (v%" PRIu64 " whole is %" PRIu64
		 " bytes%s, by its delta %" PRIu64 ")",
		 a->node_id, target, from, deltas, deltas == 1 ? "" : "s", c->wire, target,
		 c->target_raw,
		 c->target_raw >= c->wire ? ""
		 : a->full_failed_v == target ? ": its whole fetch failed"
		 : c->latest != target ? ": only the latest version is copied whole"
		 : !a->fx.fanout || proto_param(PROTO_PARAM_CHAIN_FULL) == 0 ? ": not fetched whole here"
			      : ": no replica holds it complete",
		 c->target_wire);
	next_step(a);
}

/* GET /holders for the target: complete holders make the whole fetch. */
static void on_holders(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_chain *c = a->chain;
	json_t *list, *e;
	size_t i, n = 0;

	a->chain_asking = false;
	if (c == NULL || c->planning || c->next > 0)
		return;
	list = ans->status == 200 ? json_object_get(ans->json, "holders") : NULL;
	json_array_foreach(list, i, e)
		n += json_is_true(json_object_get(e, "complete"));
	if (c->nochain[0] == 0) {
		choose(a, n > 0, n);
	} else if (n == 0) {
		no_replay(a, c->nochain);
	} else {
		LOG_INFO("node %s: v%" PRIu64 " without its parent and no chain to replay (%s): "
			 "fetching it whole from %zu holder%s: %" PRIu64 " bytes for this rank",
			 a->node_id, c->target, c->nochain, n, n == 1 ? "" : "s", c->target_raw);
		take_whole(a);
	}
}

static void ask_manifest(struct node_agent *a);

static void on_walk(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_chain *c = a->chain;
	struct proto_manifest pm;
	struct proto_err err;
	uint64_t wire, raw;

	a->chain_asking = false;
	if (c == NULL || !c->planning)
		return;
	if (ans->status != 200) {
		plan_fail(a, "manifest of v%" PRIu64 ": %s", c->walk_v, ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &pm, &err) != 0) {
		plan_fail(a, "manifest of v%" PRIu64 ": %s", c->walk_v, err.msg);
		return;
	}
	if (pm.version != c->walk_v ||
	    sodium_memcmp(pm.digest, c->walk_digest, PROTO_HASH_BYTES) != 0) {
		proto_manifest_fini(&pm);
		plan_fail(a, "broken parent chain: v%" PRIu64 " is not the parent it names", c->walk_v);
		return;
	}
	if (sodium_memcmp(pm.model_digest, a->model.digest, PROTO_HASH_BYTES) != 0) {
		proto_manifest_fini(&pm);
		plan_fail(a, "v%" PRIu64 " is of another model", c->walk_v);
		return;
	}
	/* The active slot is this step, exactly: the chain starts from it. */
	if (a->active != NULL && !a->inplace_broken && a->active->version == pm.version &&
	    sodium_memcmp(a->active_digest, pm.digest, PROTO_HASH_BYTES) == 0) {
		proto_manifest_fini(&pm);
		c->from_active = true;
		plan_done(a);
		return;
	}
	const struct proto_mlayout *ml = proto_manifest_layout(&pm, a->layout.digest);
	if (ml == NULL) {
		proto_manifest_fini(&pm);
		plan_fail(a, "v%" PRIu64 " does not list this node's layout (it came by an addendum)",
			  c->walk_v);
		return;
	}
	rank_bytes(a, ml, &wire, &raw);
	c->walked[c->nwalked] = pm.version;
	c->walked_wire[c->nwalked++] = wire;
	bool anchor = pm.kind == PROTO_KIND_ANCHOR;
	c->walk_v = pm.parent_version;
	memcpy(c->walk_digest, pm.parent_digest, PROTO_HASH_BYTES);
	proto_manifest_fini(&pm);
	if (anchor) {
		plan_done(a);
		return;
	}
	if (c->nwalked >= proto_param(PROTO_PARAM_CHAIN_MAX) || c->walk_v == 0) {
		plan_fail(a, "no anchor within %u versions (TESSERA_CHAIN_MAX)", c->nwalked);
		return;
	}
	ask_manifest(a);
}

static void ask_manifest(struct node_agent *a)
{
	if (trk_client_get_manifest(a->trk, a->chain->walk_v, on_walk, a) != 0) {
		plan_fail(a, "cannot ask for the manifest of v%" PRIu64, a->chain->walk_v);
		return;
	}
	a->chain_asking = true;
}

static void on_versions(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_chain *c = a->chain;
	struct proto_err err;
	uint64_t latest;

	a->chain_asking = false;
	if (c == NULL || !c->planning)
		return;
	if (ans->status != 200) {
		plan_fail(a, "the tracker's versions: %s", ans->error);
		return;
	}
	if (trk_versions_parse(ans->json, &latest, &c->vi, &c->nvi, &err) != 0) {
		plan_fail(a, "the tracker's versions: %s", err.msg);
		return;
	}
	c->latest = latest;
	ask_manifest(a);
}

int agent_chain_begin(struct node_agent *a)
{
	struct fetch *f = a->ver->f;
	uint64_t max = PROTO_MAX(proto_param(PROTO_PARAM_CHAIN_MAX), 1);
	struct agent_chain *c;

	if (a->o.install_inplace || a->chain != NULL || a->chain_asking ||
	    a->chain_failed_v == f->version || max > UINT32_MAX)
		return -1;
	c = calloc(1, sizeof(*c));
	if (c == NULL || (c->walked = calloc(max + 1, sizeof(*c->walked))) == NULL ||
	    (c->walked_wire = calloc(max + 1, sizeof(*c->walked_wire))) == NULL) {
		if (c != NULL)
			chain_free(c);
		return -1;
	}
	c->target = f->version;
	c->id = ++a->chain_ids;
	c->planning = true;
	rank_bytes(a, f->ml, &c->target_wire, &c->target_raw);
	c->walked[0] = f->version;
	c->walked_wire[c->nwalked++] = c->target_wire;
	c->walk_v = f->man.parent_version;
	memcpy(c->walk_digest, f->man.parent_digest, PROTO_HASH_BYTES);
	if (a->active != NULL)
		LOG_INFO("node %s: v%" PRIu64 " is a delta against v%" PRIu64 ", but this node holds v%" PRIu64
			 ": looking for the chain to replay",
			 a->node_id, f->version, f->man.parent_version, a->active->version);
	else
		LOG_INFO("node %s: v%" PRIu64 " is a delta against v%" PRIu64
			 ", and this node holds no version: looking for the chain to replay",
			 a->node_id, f->version, f->man.parent_version);
	agent_version_drop(a);
	a->chain = c;
	if (trk_client_watch(a->trk, 0, 0, on_versions, a) != 0) {
		plan_fail(a, "cannot ask the tracker for its versions");
		return 0;
	}
	a->chain_asking = true;
	return 0;
}

/* ---- a step withdrawn while the replay runs ----------------------------------- */

/* The first step still to build: the one under way (or held), and those
 * after it. */
static uint32_t first_needed(const struct agent_chain *c)
{
	return c->next > 0 ? c->next - 1 : 0;
}

/* The tracker's versions from the first step still to build: one of the
 * steps before the target that it no longer lists as served cannot come
 * (its publisher withdraws it; no peer holds a version older than the one
 * it serves), and the chain to the target is the only one (each delta
 * names its parent): the target is planned again from the start, which
 * fetches it whole when it is the latest and replicas hold it, else
 * refuses it, and the replica moves on (to the newer anchor that withdrew
 * the chain), or an anchor is asked for. */
static void on_check(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_chain *c = a->chain;
	struct trk_version_info *vi = NULL;
	struct proto_err err;
	uint64_t latest, gone = 0, target;
	size_t n = 0;

	if (c == NULL || c->id != a->chain_check) {
		a->chain_check = 0;
		return; /* that replay is over */
	}
	a->chain_check = 0;
	if (ans->status != 200 || trk_versions_parse(ans->json, &latest, &vi, &n, &err) != 0) {
		LOG_DEBUG("node %s: the chain's steps: %s", a->node_id,
			  ans->status == 200 ? err.msg : ans->error);
		return;
	}
	for (uint32_t i = first_needed(c); i + 1 < c->nsteps && gone == 0; i++)
		if (!step_served(a, find_vi(vi, n, c->steps[i])))
			gone = c->steps[i];
	free(vi);
	if (gone == 0)
		return;
	target = c->target;
	LOG_WARN("node %s: v%" PRIu64 " of the chain to v%" PRIu64 " is withdrawn (the tracker no "
		 "longer lists it as served; the latest is v%" PRIu64 "): planning v%" PRIu64 " again",
		 a->node_id, gone, target, latest, target);
	agent_version_drop(a); /* first: no worker reads the chain's slot then */
	agent_chain_end(a, false);
	agent_version_start(a, target);
}

void agent_chain_check(struct node_agent *a)
{
	struct agent_chain *c = a->chain;

	/* Not while planning, nor while the holders of the whole are asked. */
	if (c == NULL || c->planning || a->chain_asking || a->chain_check != 0)
		return;
	if (c->held)
		next_step(a); /* the test hold ends once its version is heard of */
	if (a->chain != c)
		return;
	c->checked_ms = node_now_ms();
	if (trk_client_watch(a->trk, c->steps[first_needed(c)] - 1, 0, on_check, a) == 0)
		a->chain_check = c->id;
}

void agent_chain_sourceless(struct node_agent *a)
{
	const struct agent_chain *c = a->chain;

	if (c != NULL && !c->planning && a->fx.nosrc_said &&
	    node_now_ms() - c->checked_ms >= CHAIN_CHECK_MS)
		agent_chain_check(a);
}

bool agent_chain_step_done(struct node_agent *a)
{
	struct fetch *f = a->ver->f;
	struct agent_chain *c = a->chain;
	struct node_slot *built;

	if (c == NULL || c->planning || f->version == c->target)
		return false;
	c->done += f->bytes_done;
	c->from_trainer += f->from_trainer;
	c->from_peers += f->from_peers;
	c->duplicate += f->duplicate;
	c->refetched += f->refetched;
	c->from_other_sites += f->from_other_sites;
	LOG_INFO("node %s: chain step v%" PRIu64 " of %u built (%s, %" PRIu64 " wire bytes)",
		 a->node_id, f->version, c->nsteps, f->delta ? "by delta from the step before" : "whole",
		 f->bytes_done);
	built = f->slot;
	f->slot = NULL;
	c->slot_version = f->version;
	memcpy(c->slot_digest, f->man.digest, PROTO_HASH_BYTES);
	/* No worker reads the previous step once this fetch is freed. */
	agent_version_drop(a);
	if (c->slot != NULL)
		node_slot_free(&a->store, c->slot);
	c->slot = built;
	next_step(a);
	return true;
}

struct node_slot *agent_chain_parent(const struct node_agent *a, const uint8_t **digest)
{
	if (a->chain == NULL || a->chain->slot == NULL)
		return NULL;
	*digest = a->chain->slot_digest;
	return a->chain->slot;
}
