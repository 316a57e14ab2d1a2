/*
 * In-place installs (tessera-node --install in-place), for nodes without the
 * memory for a second copy of their rank. A delta's parcels are fetched and
 * verified as they are (no second slot); an anchor is staged in a second
 * slot, as there is nothing to apply it against. When the replica agrees on
 * the version (the same two-phase activation as double-buffered):
 *
 *   1. admission is paused: new acquires wait (node/serve/attach.h);
 *   2. running requests drain: the install waits until no request pins the
 *      served slot, at most TESSERA_INPLACE_DRAIN_MS (default 2 s); clients
 *      still pinning it then are disconnected (their requests fail rather
 *      than read a mix of versions);
 *   3. the version is written into the served slot: a delta's changes only
 *      (proto_dpatch_write: the new bytes at the changed positions of every
 *      parcel, in one run of one pool of TESSERA_INPLACE_THREADS threads),
 *      an anchor by a copy from its staging slot; a CUDA store scatters the
 *      same changes into its device copy (node_slot_activate_patched) where
 *      it would otherwise upload the whole slot;
 *   4. admission resumes: clients are sent the new version, waiting
 *      acquires get it; then the activation record, written beside it
 *      before step 1, is renamed into place (see record_after_resume).
 * Everything else happens before step 1, while the slot still serves the
 * parent: the parent's checksums are read, the delta is decoded, the old
 * bytes at its positions read, every piece's child checksum verified and
 * the pages to write mapped writable (proto/dpatch.h); the new activation
 * record is written (its activated_ms: when admission paused); the slot is
 * withdrawn from readers of other layouts. So the pause is the stores and
 * the slot's activation; the record's rename and fsync and what the install
 * no longer needs (the prepared changes, the wire bytes, an anchor's
 * staging slot) come after admission resumed.
 * A delta that does not verify against the served parent pauses admission
 * all the same (the replica committed to the version: its other ranks
 * switch, this one must not serve the old version beside them), and so
 * does a failure while writing (a test hook): the node refuses deltas
 * against the slot and asks for an anchor, and serving resumes only once a
 * complete version is installed. Never a mix.
 */
#include "node/agent/internal.h"

#include "proto/delta.h"
#include "proto/dpatch.h"

/* What a delta's install prepares before pausing: per parcel, its pieces
 * and its changes, decoded and verified against the served slot, on one
 * pool of threads that writes them all in the pause. */
struct agent_inplace_prep {
	uint32_t n;                  /* parcels prepared */
	struct proto_dparcel *dp;    /* per parcel */
	struct proto_dpatch *patch;  /* per parcel, side by side: one write */
	struct proto_dpatch_pool *pool;
};

bool agent_inplace(const struct node_agent *a)
{
	return a->o.install_inplace && a->active != NULL;
}

static void prep_free(struct node_agent *a)
{
	struct agent_inplace_prep *pr = a->inplace_prep;

	if (pr == NULL)
		return;
	for (uint32_t i = 0; i < pr->n; i++) {
		proto_dparcel_fini(&pr->dp[i]);
		proto_dpatch_fini(&pr->patch[i]);
	}
	free(pr->dp);
	free(pr->patch);
	proto_dpatch_pool_free(pr->pool);
	free(pr);
	a->inplace_prep = NULL;
}

/* Decodes and verifies every delta parcel against the served slot (it
 * serves on meanwhile: nothing writes it). */
static int prep(struct node_agent *a, struct fetch *f, struct proto_err *err)
{
	unsigned threads = (unsigned)proto_param(PROTO_PARAM_INPLACE_THREADS);
	struct agent_inplace_prep *pr;
	uint64_t *sums = NULL;
	int rc = 0;

	prep_free(a);
	if (!f->delta)
		return 0;
	if ((pr = a->inplace_prep = calloc(1, sizeof(*pr))) == NULL ||
	    (pr->dp = calloc(f->nparcels + 1, sizeof(*pr->dp))) == NULL ||
	    (pr->patch = calloc(f->nparcels + 1, sizeof(*pr->patch))) == NULL ||
	    (pr->pool = proto_dpatch_pool_new(threads)) == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t i = 0; i < f->nparcels && rc == 0; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		rc = proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &pr->dp[i], err);
		if (rc != 0)
			break;
		pr->n = i + 1;
		free(sums);
		if ((sums = malloc(((size_t)pr->dp[i].npieces + 1) * sizeof(uint64_t))) == NULL) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			break;
		}
		proto_dparcel_sums(&pr->dp[i], a->active->host, sums);
		rc = proto_dpatch_prepare(&pr->dp[i], p->wire, p->mp->wire_bytes, a->active->host,
					  sums, pr->pool, &pr->patch[i], err);
		if (rc != 0)
			proto_err_prefix(err, "parcel %u", i);
	}
	free(sums);
	return rc;
}

/* Writes f into the served slot s; 0, or an error in err (s then holds a
 * part of f: incomplete). */
static int write_version(struct node_agent *a, struct fetch *f, struct node_slot *s,
			 struct proto_err *err)
{
	uint64_t fail_v = proto_param(PROTO_PARAM_TEST_INPLACE_FAIL);

	if (!f->delta) {
		size_t len = PROTO_MIN(s->len, f->slot->len);
		if (fail_v == f->version) {
			memcpy(s->host, f->slot->host, len / 2);
			return proto_errf(err, EIO, "TESSERA_TEST_INPLACE_FAIL: stopped halfway");
		}
		memcpy(s->host, f->slot->host, len);
		return 0;
	}
	struct agent_inplace_prep *pr = a->inplace_prep;
	if (pr == NULL || pr->n != f->nparcels)
		return proto_errf(err, EINVAL, "the delta's parcels were not prepared");
	if (fail_v == f->version && f->nparcels > 1) {
		uint32_t half = f->nparcels / 2;
		proto_dpatch_write(pr->patch, half, pr->pool);
		return proto_errf(err, EIO, "TESSERA_TEST_INPLACE_FAIL: stopped after %u of %u parcels",
				  half, f->nparcels);
	}
	proto_dpatch_write(pr->patch, pr->n, pr->pool);
	return 0;
}

/* The served slot s holds f now: the store makes it the served one (a CUDA
 * store scatters a delta's changes into its device copy). */
static int activate_written(struct node_agent *a, struct fetch *f, struct node_slot *s,
			    struct proto_err *err)
{
	struct agent_inplace_prep *pr = a->inplace_prep;

	s->version = f->version;
	if (f->delta && pr != NULL)
		return node_slot_activate_patched(&a->store, s, pr->patch, pr->n, err);
	return node_slot_activate(&a->store, s, err);
}

/*
 * The activation record is written and fsync'ed beside the record before
 * the pause and renamed into place right after admission resumed, then
 * the directory fsync'ed: no file system call in the pause (on a busy
 * ext4 even a rename waits milliseconds for the journal). Correctness does
 * not need the record inside the pause. What a request runs on comes from
 * the attach socket (its pin and version); the record is a description
 * for processes that map the slot without the socket, which take no pins
 * and so had no guarantee during the writes either (the record named the
 * old version all through the pause). Whoever learns of the activation
 * from the tracker finds the record naming it: the node reports after the
 * rename and its fsync (agent_activated). Written before the pause, a
 * record that cannot be written stops the install while the old version
 * still serves, as for a double-buffered switch; a rename that fails after
 * the writes (the directory was writable a moment before) removes the
 * record rather than leave it naming the old version, and is logged. The
 * fsync guards against a crash of the machine alone, after which what the
 * record names (the slot's memfd, this process's memory) is gone anyway.
 */
static void record_after_resume(struct node_agent *a, struct fetch *f)
{
	struct proto_err err;

	if (agent_commit_expose(a, &err) != 0) {
		LOG_ERR("node %s: v%" PRIu64 " serves, but its activation record could not be put in "
			"place: %s; the old record is removed",
			a->node_id, f->version, err.msg);
		agent_unstage_expose(a);
		agent_unexpose(a);
		return;
	}
	agent_sync_expose(a);
}

/* f cannot be installed: admission stays paused until a complete version
 * is (see the top of the file). */
static void fail_paused(struct node_agent *a, struct fetch *f, const struct proto_err *err)
{
	a->inplace_broken = true;
	a->need_anchor = f->delta;
	LOG_ERR("node %s: v%" PRIu64 " in-place install failed: %s; admission stays paused "
		"until a complete version is installed",
		a->node_id, f->version, err->msg);
	agent_version_fail(a, "in-place install of v%" PRIu64 " failed: %s (serving paused)",
			 f->version, err->msg);
}

/* What the pause did not need, once serving resumed: the prepared changes,
 * the delta's wire bytes, an anchor's staging slot. */
static void after_pause(struct node_agent *a, struct fetch *f)
{
	prep_free(a);
	for (uint32_t i = 0; f->delta && i < f->nparcels; i++) {
		free(f->parcels[i].wire);
		f->parcels[i].wire = NULL;
	}
	if (f->slot != NULL) {
		node_slot_free(&a->store, f->slot);
		f->slot = NULL;
	}
}

static void install(struct node_agent *a)
{
	struct fetch *f = a->ver != NULL ? a->ver->f : NULL;
	struct node_slot *s = a->active;
	uint64_t t_write = proto_now_ns(), t_activate, t_resume;
	struct proto_err err = {{0}};
	int rc;

	a->installing = false;
	event_del(a->inplace_ev);
	if (f == NULL || f->version != a->inplace_version || !agent_verified_stage(a->ver)) {
		prep_free(a);
		agent_unstage_expose(a);
		/* The version went away before anything was written. */
		LOG_INFO("node %s: v%" PRIu64 " no longer installed in place; serving goes on",
			 a->node_id, a->inplace_version);
		if (!a->inplace_broken) {
			node_attach_resume(a->attach, s, a->active_digest);
			swarm_xl_serve(&a->sw, s); /* withdrawn at the start */
		}
		return;
	}
	/* The pause: the stores, the slot's activation, resume. */
	rc = write_version(a, f, s, &err);
	t_activate = proto_now_ns();
	if (rc == 0)
		rc = activate_written(a, f, s, &err);
	if (rc != 0) {
		agent_unstage_expose(a);
		prep_free(a);
		fail_paused(a, f, &err);
		return;
	}
	a->inplace_broken = false;
	t_resume = proto_now_ns();
	node_attach_resume(a->attach, s, f->man.digest); /* agent_activated does not again */
	uint64_t now = proto_now_ns();
	record_after_resume(a, f);
	uint64_t t_recorded = proto_now_ns();
	after_pause(a, f);
	if (f->delta)
		proto_metrics_add(a->am.m, a->am.delta_versions, 1);
	LOG_INFO("node %s: v%" PRIu64 " installed in place (%s): admission paused %.2f ms "
		 "(drain %.2f ms, write %.2f ms, store activation %.2f ms, resume %.2f ms; "
		 "%.2f ms outside the drain); activation record in place %.2f ms after",
		 a->node_id, f->version, f->delta ? "delta" : "full copy",
		 (double)(now - a->inplace_t0_ns) / 1e6, (double)(t_write - a->inplace_t0_ns) / 1e6,
		 (double)(t_activate - t_write) / 1e6, (double)(t_resume - t_activate) / 1e6,
		 (double)(now - t_resume) / 1e6, (double)(now - t_write) / 1e6,
		 (double)(t_recorded - now) / 1e6);
	agent_activated(a, s);
}

static void on_drained(void *arg)
{
	struct node_agent *a = arg;

	if (a->installing)
		install(a);
}

static void on_drain_bound(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	if (!a->installing)
		return;
	uint32_t n = node_attach_evict(a->attach);
	LOG_WARN("node %s: %u serving clients still pinned v%" PRIu64 " after %" PRIu64
		 " ms (TESSERA_INPLACE_DRAIN_MS): disconnected",
		 a->node_id, n, a->active->version, proto_param(PROTO_PARAM_INPLACE_DRAIN_MS));
	install(a);
}

void agent_inplace_start(struct node_agent *a)
{
	struct fetch *f = a->ver->f;

	struct proto_err err = {{0}};

	if (a->installing)
		return;
	if (a->inplace_ev == NULL && (a->inplace_ev = evtimer_new(a->base, on_drain_bound, a)) == NULL) {
		agent_version_fail(a, "in-place install: out of memory");
		return;
	}
	uint64_t t_prep = proto_now_ns();
	if (prep(a, f, &err) != 0) {
		prep_free(a);
		if (a->attach != NULL && node_attach_pause(a->attach, f->version, NULL, NULL) != 0) {
			agent_version_fail(a, "in-place install: out of memory");
			return;
		}
		fail_paused(a, f, &err);
		return;
	}
	if (agent_stage_expose(a, a->active, f->version, f->man.digest, &err) != 0) {
		prep_free(a);
		agent_expose_blocked(a, "cannot write the activation record", &err);
		return;
	}
	if (f->delta)
		LOG_INFO("node %s: v%" PRIu64 " prepared for an in-place install in %.1f ms (decoded "
			 "and verified against v%" PRIu64 " while it serves)",
			 a->node_id, f->version, (double)(proto_now_ns() - t_prep) / 1e6,
			 a->active->version);
	a->installing = true;
	a->inplace_version = f->version;
	agent_stage(a, STAGE_ACTIVATING);
	/* Readers of other layouts stop reading the slot before it changes;
	 * served again by the switch, or when the install is abandoned. Done
	 * before the pause: closing a registration can take milliseconds. */
	swarm_xl_withdraw(&a->sw);
	a->inplace_t0_ns = proto_now_ns();
	LOG_INFO("node %s: installing v%" PRIu64 " in place over v%" PRIu64 ": admission paused",
		 a->node_id, f->version, a->active->version);
	if (a->attach == NULL) {
		install(a);
		return;
	}
	if (node_attach_pause(a->attach, f->version, on_drained, a) != 0) {
		a->installing = false;
		agent_unstage_expose(a);
		swarm_xl_serve(&a->sw, a->active);
		agent_version_fail(a, "in-place install: out of memory");
		return;
	}
	node_arm(a->inplace_ev, proto_param(PROTO_PARAM_INPLACE_DRAIN_MS));
}

void agent_inplace_fini(struct node_agent *a)
{
	prep_free(a);
	if (a->inplace_ev != NULL)
		event_free(a->inplace_ev);
	a->inplace_ev = NULL;
}
