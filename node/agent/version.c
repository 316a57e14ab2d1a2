/*
 * A version's lifecycle on this rank, from asked to active: its signed
 * manifest and parent link, our layout's parcels (by a signed addendum
 * when the manifest lacks them), the plan, the fetch, a delta's rebuild,
 * the verified report, the replica's agreement and the switch. The stages are
 * enum agent_stage (internal.h); agent_stage moves between them, and the
 * decision to activate is agent_follow_target's.
 */
#include "node/agent/internal.h"

#include "proto/addendum.h"

static void agent_addendum_wait(struct node_agent *a);
static void agent_copy_wait(struct node_agent *a);
static void agent_with_addendum(struct node_agent *a);
static void agent_verified(struct node_agent *a);
static void agent_on_verified_report(const struct trk_answer *ans, void *arg);
struct agent_version_ask;
static struct agent_version_ask *agent_version_ask_new(struct node_agent *a);
static struct agent_version *agent_version_answered(void *arg, struct node_agent **ap);
static void agent_version_ask_cancel(struct agent_version_ask *t);

static const char *stage_name(enum agent_stage st)
{
	static const char *const names[] = {
		[STAGE_MANIFEST] = "manifest", [STAGE_ADDENDUM] = "addendum",
		[STAGE_PLAN] = "plan",         [STAGE_FETCHING] = "fetching",
		[STAGE_REBUILDING] = "rebuilding", [STAGE_VERIFIED] = "verified",
		[STAGE_ACTIVATING] = "activating", [STAGE_ACTIVE] = "active",
		[STAGE_FAILED] = "failed",
	};
	return (size_t)st < sizeof(names) / sizeof(names[0]) ? names[st] : "?";
}

void agent_stage(struct node_agent *a, enum agent_stage st)
{
	struct agent_version *v = a->ver;

	if (v == NULL || v->stage == st)
		return;
	LOG_DEBUG("node %s: v%" PRIu64 ": %s -> %s", a->node_id, v->version, stage_name(v->stage),
		  stage_name(st));
	v->stage = st;
}

/* ---- the record, and leaving it ------------------------------------------ */

/* The fetch's up_free: what the lifecycle keeps with the version. */
static void version_free(void *up)
{
	struct agent_version *v = up;

	delta_build_fini(&v->db); /* no worker copies or applies into its slot after this */
	if (v->addendum_ev != NULL)
		event_free(v->addendum_ev);
	free(v);
}

static struct agent_version *version_new(struct node_agent *a, uint64_t version)
{
	struct agent_version *v = calloc(1, sizeof(*v));
	struct fetch *f = fetch_new(version);

	if (v == NULL || f == NULL) {
		free(v);
		free(f);
		return NULL;
	}
	*v = (struct agent_version){.stage = STAGE_MANIFEST, .version = version,
				    .id = ++a->version_ids, .a = a, .f = f};
	v->db.f = f;
	f->up = v;
	f->up_free = version_free;
	return v;
}

void agent_version_drop(struct node_agent *a)
{
	struct agent_version *v = a->ver;

	a->ver = NULL;
	fetch_end(&a->fx); /* reads in flight finish into their slots and are ignored */
	if (v != NULL) {
		delta_build_fini(&v->db); /* first: its worker copies or applies no more */
		swarm_release(&a->sw, v->f);
	}
	delta_warm_pause(&a->ds, false);
}

static void version_fail(struct node_agent *a, bool quiet, const char *fmt, va_list ap)
{
	struct agent_version *v = a->ver;
	uint64_t version = v != NULL ? v->version : 0;
	enum proto_log_level lv = quiet ? PROTO_LOG_DEBUG : PROTO_LOG_WARN;
	char msg[512];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (v != NULL)
		proto_log(lv, __FILE__, __LINE__, "node %s: v%" PRIu64 " refused: %s (%u stalled reads, %u failed reads, "
			   "%u chunks failed their hash)",
		       a->node_id, version, msg, v->f->stalls, v->f->read_failures,
		       v->f->bad_chunks);
	else
		proto_log(lv, __FILE__, __LINE__, "node %s: v%" PRIu64 " refused: %s", a->node_id, version, msg);
	agent_report(a, version, TRK_STATE_FAILED, msg, NULL);
	proto_metrics_add(a->am.m, a->am.refused, 1);
	a->failed = a->chain != NULL ? a->chain->target : version;
	a->failed_ms = node_now_ms();
	a->failed_wait_ms = FAILED_RETRY_MS;
	agent_stage(a, STAGE_FAILED);
	agent_version_drop(a);
	agent_chain_end(a, true); /* a failed step ends the replay: an anchor next */
}

void agent_version_fail(struct node_agent *a, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	version_fail(a, false, fmt, ap);
	va_end(ap);
}

void agent_version_fail_quiet(struct node_agent *a, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	version_fail(a, true, fmt, ap);
	va_end(ap);
}

/* A manifest that our --trainer-pubkey does not verify: nothing here
 * changes that (a wrong key, or a tracker serving forged manifests), so it
 * is said once and on /healthz, and asked again ever more slowly; the
 * first manifest that verifies ends it. */
static void key_refused(struct node_agent *a, const char *msg)
{
	char why[512];

	snprintf(why, sizeof(why), "manifests refused: %s: check --trainer-pubkey %s: it must be "
		 "the trainer's public key (trainer.pub of `tessera keygen`)", msg,
		 a->o.trainer_pubkey ? a->o.trainer_pubkey : "");
	uint64_t wait = agent_needs_fix(a, why, FIX_RETRY_MAX_MS);
	agent_version_fail_quiet(a, "%s", msg);
	a->failed_wait_ms = wait;
}

/* The node cannot build the version from its delta: it says why and which
 * path it takes (an anchor: the tracker passes the request on to the
 * publisher, whose next version is then full), then refuses the version;
 * the active one stays. */
static void need_anchor(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void need_anchor(struct node_agent *a, const char *fmt, ...)
{
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	a->need_anchor = true;
	proto_metrics_add(a->am.m, a->am.delta_refused, 1);
	agent_version_fail(a, "%s; falling back to a full fetch: asking for an anchor", msg);
}

/* ---- manifest, layout, plan, parcels --------------------------------------- */

struct node_slot *agent_delta_parent(const struct node_agent *a, const uint8_t **digest)
{
	struct node_slot *s = agent_chain_parent(a, digest);

	if (s != NULL)
		return s;
	*digest = a->active_digest;
	return a->inplace_broken ? NULL : a->active;
}

/* A delta: 0 when the slot it builds on is its exact parent (number and
 * manifest digest); else the chain replay takes over, or an anchor is
 * asked for, and the version is refused. */
static int check_parent(struct node_agent *a)
{
	struct fetch *f = a->ver->f;
	char want[17], have[17];
	const uint8_t *digest;
	struct node_slot *parent = agent_delta_parent(a, &digest);

	if (parent != NULL && parent->version == f->man.parent_version &&
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) == 0)
		return 0;
	/* Not the parent: replay the chain to it if one is served. */
	if (agent_chain_begin(a) == 0)
		return -ENOENT;
	sodium_bin2hex(want, sizeof(want), f->man.parent_digest, 8);
	if (a->active == NULL || a->inplace_broken) {
		need_anchor(a, "a delta against v%" PRIu64 " (%s), and this node holds no %sversion",
			    f->man.parent_version, want, a->active ? "complete " : "");
		return -ENOENT;
	}
	sodium_bin2hex(have, sizeof(have), parent != NULL ? digest : a->active_digest, 8);
	need_anchor(a, "a delta against v%" PRIu64 " (%s), but this node holds v%" PRIu64 " (%s)",
		    f->man.parent_version, want,
		    parent != NULL ? parent->version : a->active->version, have);
	return -ENOENT;
}

/* A delta's build is over: the slot holds the version, or it is refused.
 * (A build is freed with its version, and no callback comes after that.) */
static void on_rebuilt(void *arg, int rc, const char *why)
{
	struct agent_version *v = arg;
	struct node_agent *a = v->a;

	if (a->ver != v)
		return;
	if (rc != 0)
		need_anchor(a, "%s", why);
	else
		agent_verified(a);
}

static int setup_parcels(struct node_agent *a)
{
	struct agent_version *v = a->ver;
	struct fetch *f = v->f;
	struct proto_err err = {{0}};
	int rc;

	f->delta = fetch_is_delta(f, a->o.rank);
	if (f->delta && check_parent(a) != 0)
		return -ENOENT;
	if ((rc = fetch_parcels(&a->fx, f, &err)) != 0) {
		if (rc != -ENOMEM)
			agent_version_fail(a, "%s", err.msg);
		return rc;
	}
	/* In place, a delta is applied to the served slot: no second one. */
	if (!(f->delta && agent_inplace(a))) {
		const uint8_t *digest;
		v->db.chained = a->chain != NULL;
		v->db.done = on_rebuilt;
		v->db.done_arg = v;
		if (delta_slot(&a->ds, &v->db, agent_chain_parent(a, &digest), &err) != 0) {
			agent_version_fail(a, "%s", err.msg);
			return -ENOMEM;
		}
	}
	if (!f->delta) /* every byte comes as a verified chunk: upload them as they do */
		node_slot_stream_begin(&a->store, f->slot, f->bytes_total);
	swarm_serve(&a->sw, f);
	f->su.parcels = proto_wall_ms();
	LOG_DEBUG("node %s: fetching v%" PRIu64 ": %u parcels, %" PRIu64 " bytes%s%s", a->node_id,
		  f->version, f->nparcels, f->bytes_total, f->served ? ", serving them to peers" : "",
		  f->delta ? " (a delta: rebuilt from the active version)" : "");
	agent_stage(a, STAGE_FETCHING);
	if (f->bytes_total == 0) {
		f->complete = true;
		agent_version_fetched(a);
		return 0;
	}
	for (uint32_t i = 0; i < f->nparcels; i++)
		fetch_want_sources(&a->fx, i);
	return 0;
}

/* The plan is known: check it is the one the manifest signed, then fetch. */
static void with_plan(struct node_agent *a)
{
	struct fetch *f = a->ver->f;

	f->plan = &a->plan;
	if (sodium_memcmp(a->plan.digest, f->ml->plan_digest, PROTO_HASH_BYTES) != 0) {
		agent_version_fail(a, "our plan differs from the one the manifest signed");
		return;
	}
	if (setup_parcels(a) == -ENOMEM && a->ver != NULL)
		agent_version_fail(a, "out of memory");
	else
		fetch_pump(&a->fx);
}

/* Builds a->plan from the tracker's trainer layout in ans, if its digest is
 * want (NULL: any), and keeps that digest in plan_src; on failure the old
 * plan may be gone (have_plan says). */
static int plan_from_layouts(struct node_agent *a, const struct trk_answer *ans,
			     const uint8_t *want, struct proto_err *err)
{
	struct proto_layout tl;
	int rc;

	if (ans->status != 200)
		return proto_errf(err, EIO, "cannot read the trainer layout: %s", ans->error);
	rc = proto_layout_from_json(&a->model, json_object_get(ans->json, "trainer_layout"),
				    "trainer layout", &tl, err);
	if (rc != 0)
		return rc;
	/* The tracker is not trusted: the signed manifest names the layout. */
	if (want != NULL && sodium_memcmp(tl.digest, want, PROTO_HASH_BYTES) != 0) {
		proto_layout_fini(&tl);
		return proto_errf(err, EBADMSG,
				  "the trainer layout does not match the manifest's digest");
	}
	/* No fetch is using the old plan now (one fetch at a time). */
	if (a->have_plan)
		proto_plan_fini(&a->plan);
	a->have_plan = false;
	if (proto_layout_transformed(&a->layout)) {
		/* An FP8 layout's parcels come from the publisher's quantized
		 * source of the trainer's export, not its ranks' bytes. */
		struct proto_layout src;
		rc = proto_layout_fp8_source(&a->model, &a->layout, &src, err);
		if (rc == 0) {
			rc = proto_plan_build(&a->model, &src, &a->layout, &a->plan, err);
			proto_layout_fini(&src);
		}
	} else {
		rc = proto_plan_build(&a->model, &tl, &a->layout, &a->plan, err);
	}
	if (rc == 0) {
		a->have_plan = true;
		memcpy(a->plan_src, tl.digest, PROTO_HASH_BYTES);
	}
	proto_layout_fini(&tl);
	return rc;
}

static void on_layouts(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_version *v = a->ver;
	struct proto_err err;

	if (v == NULL)
		return;
	v->plan_asked = false;
	if (plan_from_layouts(a, ans, v->f->man.src_layout_digest, &err) != 0) {
		agent_version_fail(a, "%s", err.msg);
		return;
	}
	LOG_DEBUG("node %s: v%" PRIu64 ": planned from the trainer layout", a->node_id, v->version);
	if (v->f->ml != NULL) /* else planned ahead of the addendum: it goes on */
		with_plan(a);
}

/*
 * Ready ahead. A registered node that holds no version yet has nothing to
 * do until the first one is published: the trainer layout's round trip,
 * the plan and the version slot, which do not depend on the version, are
 * made while it waits. The slot is left as the store's spare, which the
 * fetch's node_slot_new takes; the plan is kept with its digest, and the
 * fetch uses it only if the signed manifest names that digest
 * (plan_ready). Asked again every AHEAD_RETRY_MS until the tracker knows a
 * trainer layout; nothing here holds up a fetch that starts meanwhile.
 */
#define AHEAD_RETRY_MS 2000
static void on_layouts_ahead(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct proto_err err;

	a->ahead_asked = false;
	if (a->ver != NULL || a->active != NULL || a->have_plan)
		return; /* a fetch owns the plan now */
	if (plan_from_layouts(a, ans, NULL, &err) != 0) {
		LOG_DEBUG("node %s: no plan ahead yet: %s", a->node_id, err.msg);
		return;
	}
	LOG_DEBUG("node %s: planned ahead of the first version", a->node_id);
	proto_metrics_add(a->am.m, a->am.ready_ahead_plan, 1);
}

void agent_ready_ahead(struct node_agent *a)
{
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct node_slot *spare;
	struct proto_err err;

	if (!a->registered || a->leaving || a->ver != NULL || a->active != NULL)
		return;
	if (!a->ahead_slot && a->ds.standby == NULL) {
		a->ahead_slot = true; /* once: a failure here fails the fetch too */
		if (node_slot_new(&a->store, 0, len, &spare, &err) == 0) {
			node_slot_free(&a->store, spare);
			proto_metrics_add(a->am.m, a->am.ready_ahead_slot, 1);
		} else {
			LOG_DEBUG("node %s: no slot ahead: %s", a->node_id, err.msg);
		}
	}
	if (a->have_plan || a->ahead_asked || node_now_ms() - a->ahead_ms < AHEAD_RETRY_MS)
		return;
	a->ahead_ms = node_now_ms();
	a->ahead_asked = trk_client_layouts(a->trk, on_layouts_ahead, a) == 0;
}

/* The plan trainer layout -> ours is here (true), or asked for: on_layouts
 * goes on with the fetch once our parcels are known. */
static bool plan_ready(struct node_agent *a)
{
	struct agent_version *v = a->ver;

	/* The same trainer layout as last time: the plan is already here. */
	if (a->have_plan &&
	    sodium_memcmp(a->plan_src, v->f->man.src_layout_digest, PROTO_HASH_BYTES) == 0)
		return true;
	if (v->plan_asked)
		return false;
	if (trk_client_layouts(a->trk, on_layouts, a) != 0)
		agent_version_fail(a, "cannot ask for the trainer layout");
	else
		v->plan_asked = true;
	return false;
}

/* Our layout's parcels are known (f->ml): the plan, then the parcels. */
static void with_layout(struct node_agent *a)
{
	if (plan_ready(a))
		with_plan(a);
	else if (a->ver != NULL)
		agent_stage(a, STAGE_PLAN);
}

/* The manifest is signed and its parent link checked. */
static void with_manifest(struct node_agent *a)
{
	struct agent_version *v = a->ver;
	struct fetch *f = v->f;

	a->last_version = f->man.version;
	memcpy(a->last_digest, f->man.digest, PROTO_HASH_BYTES);

	f->ml = proto_manifest_layout(&f->man, a->layout.digest);
	/* A delta the chain planner chose to take whole: its raw copy first. */
	bool full = f->ml != NULL && a->full_v == f->version && f->man.kind == PROTO_KIND_DELTA;
	a->full_v = 0;
	if (full || f->ml == NULL) {
		/* Published before our layout registered: the publisher adds
		 * it by a signed addendum (below), else we wait for the
		 * next version. Meanwhile what does not depend on it is made
		 * ready: the plan from the trainer layout, the holders of
		 * other layouts and our maps of them, and the slot (made and
		 * kept as the store's spare, which the fetch then takes), so
		 * that the first read goes out as soon as the addendum is in. */
		f->ml = NULL; /* the raw copy's block, once it is in */
		if (full)
			agent_copy_wait(a);
		else
			agent_addendum_wait(a);
		if (a->ver == v)
			(void)plan_ready(a);
		if (a->ver == v)
			swarm_xl_prefetch(&a->sw);
		struct node_slot *spare;
		struct proto_err err;
		if (a->ver == v && a->ds.standby == NULL &&
		    node_slot_new(&a->store, f->version, a->layout.ranks[a->o.rank].nbytes, &spare,
				  &err) == 0)
			node_slot_free(&a->store, spare);
		return;
	}
	/* Whether replicas of other layouts hold it: the first read from the
	 * trainer waits for that answer, and the node's tracker requests go
	 * out one after another, so it goes first. Not for a delta: holders
	 * of our layout give its encoded parcels, no others. */
	if (f->man.kind != PROTO_KIND_DELTA)
		swarm_xl_prefetch(&a->sw);
	if (a->ver == v)
		with_layout(a);
}

static void agent_with_addendum(struct node_agent *a)
{
	struct fetch *f = a->ver->f;

	f->ml = proto_manifest_layout(&f->man, a->layout.digest);
	with_layout(a);
}

/* ---- our layout's addendum (stage ADDENDUM) ---------------------------------- */

/*
 * A replica that registers a layout after the latest version was published
 * finds no parcels for it in that manifest. The publisher, told by the
 * tracker, plans and hashes the layout's parcels of that version and posts
 * an addendum signed by the trainer key (proto/addendum.h). We ask the
 * tracker for it with a long-poll it answers when the addendum is posted
 * (asked again after a failure, TESSERA_ADDENDUM_WAIT_MS in all),
 * check its signature with the trainer key and its binding to the manifest
 * we verified (same version and manifest digest), and splice its layout
 * into our copy of the manifest: from there on the fetch is the one every
 * layout gets, every chunk checked against the addendum's hashes. A bad
 * addendum refuses the version like a bad manifest does.
 */

static void ask(struct node_agent *a);

/* No addendum came: the old rule, wait for the next version. The tracker
 * hears the failure, so the replica's target moves past this version. No
 * raw copy came: the version is refused here, and tried again by its chain. */
static void no_cover(struct node_agent *a)
{
	struct fetch *f = a->ver->f;

	if (f->full) {
		a->full_failed_v = f->version;
		agent_version_fail(a, "no raw copy of v%" PRIu64 " came; its chain is replayed next",
				 f->version);
		return;
	}
	LOG_INFO("node %s: v%" PRIu64 " has no parcels for our layout and no addendum came; "
		 "waiting for a newer version",
		 a->node_id, f->version);
	agent_report(a, f->version, TRK_STATE_FAILED,
		     "no parcels for our layout (published before it registered, no addendum)", NULL);
	a->failed = f->version;
	a->failed_ms = node_now_ms();
	agent_stage(a, STAGE_FAILED);
	agent_version_drop(a);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	if (a->ver != NULL && a->ver->stage == STAGE_ADDENDUM)
		ask(a);
}

/* Not there yet (or the tracker did not answer): ask again soon, until the
 * wait is over. */
static void again(struct node_agent *a, const char *why)
{
	struct agent_version *v = a->ver;
	struct fetch *f = v->f;

	if (node_now_ms() - f->started_ms >= proto_param(PROTO_PARAM_ADDENDUM_WAIT_MS)) {
		no_cover(a);
		return;
	}
	if (v->addendum_ev == NULL)
		v->addendum_ev = evtimer_new(a->base, on_timer, a);
	if (v->addendum_ev == NULL) {
		no_cover(a);
		return;
	}
	node_wait_note(&a->wait, node_now_ms(), a->node_id, "addendum",
		       "the %s of v%" PRIu64 " for our layout (%s)",
		       f->full ? "raw copy" : "addendum", f->version, why);
	node_arm(v->addendum_ev, RETRY_MS);
}

static void on_addendum(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_version *v = agent_version_answered(arg, &a);
	struct proto_addendum ad;
	struct proto_err err = {{0}};

	if (v == NULL || v->stage != STAGE_ADDENDUM)
		return;
	struct fetch *f = v->f;
	if (ans->status == 410 && f->full) { /* a newer version came: none will */
		a->full_failed_v = f->version;
		agent_version_fail(a, "no raw copy of v%" PRIu64 " will come: a newer version is out "
				 "(only the latest is copied); the replica moves on",
				 f->version);
		return;
	}
	if (ans->status != 200) {
		again(a, ans->error);
		return;
	}
	if (proto_addendum_decode(ans->body, ans->len, a->trainer_pk, &ad, &err) != 0 ||
	    (ad.copy != f->full &&
	     proto_errf(&err, EINVAL, "the tracker sent %s", f->full ? "an addendum, not a raw copy" :
								       "a raw copy, not an addendum")) ||
	    proto_addendum_binds(&ad, &f->man, &err) != 0) {
		if (ad.version != 0)
			proto_addendum_fini(&ad);
		agent_version_fail(a, "%s", err.msg);
		return;
	}
	if (sodium_memcmp(ad.layout.layout_digest, a->layout.digest, PROTO_HASH_BYTES) != 0) {
		proto_addendum_fini(&ad);
		agent_version_fail(a, "the tracker sent the addendum of another layout");
		return;
	}
	if (proto_addendum_extend(&f->man, &ad) != 0) {
		proto_addendum_fini(&ad);
		agent_version_fail(a, "out of memory");
		return;
	}
	proto_addendum_fini(&ad);
	node_wait_over(&a->wait, "addendum");
	LOG_INFO("node %s: v%" PRIu64 " %s", a->node_id, f->version,
		 f->full ? "taken whole: its signed raw copy of our layout is in" :
			   "extended for our layout by its signed addendum");
	agent_with_addendum(a);
}

/* A long-poll for what is left of the wait: the tracker answers as soon
 * as the publisher posts the addendum. */
static void ask(struct node_agent *a)
{
	struct fetch *f = a->ver->f;
	uint64_t waited = node_now_ms() - f->started_ms;
	uint64_t wait = proto_param(PROTO_PARAM_ADDENDUM_WAIT_MS);
	uint32_t left = waited < wait ? (uint32_t)PROTO_MIN(wait - waited, TRK_WAIT_MAX_MS) : 1;
	struct agent_version_ask *t = agent_version_ask_new(a);

	if (t == NULL || (f->full ? trk_client_get_copy : trk_client_get_addendum)(
				 a->trk, f->version, a->layout.digest, left, on_addendum, t) != 0) {
		agent_version_ask_cancel(t);
		again(a, "cannot ask the tracker");
	}
}

static void agent_addendum_wait(struct node_agent *a)
{
	agent_stage(a, STAGE_ADDENDUM);
	ask(a);
}

static void agent_copy_wait(struct node_agent *a)
{
	a->ver->f->full = true;
	agent_addendum_wait(a);
}

/* ---- the version's tracker requests ----------------------------------------- */

/* A tracker request of one version (its manifest, its parent's, its
 * addendum or raw copy): the version may be dropped and another started
 * before the answer comes (the replica's target moved), and that answer is
 * not the new one's. Tickets live in a->version_asks until their answer (or
 * node_agent_free). */
struct agent_version_ask {
	struct node_agent *a;
	uint64_t id;
	struct agent_version_ask *next;
};

/* A ticket for a tracker request of the version under way, passed as the
 * callback's arg: agent_version_answered(arg, &a) in the callback gives the
 * version that asked if it is still under way (else NULL: drop the
 * answer) and frees the ticket. NULL on ENOMEM. A request that could not
 * be sent frees its ticket with agent_version_ask_cancel (NULL is fine). */
static struct agent_version_ask *agent_version_ask_new(struct node_agent *a)
{
	struct agent_version_ask *t = malloc(sizeof(*t));

	if (t == NULL)
		return NULL;
	*t = (struct agent_version_ask){a, a->ver->id, a->version_asks};
	a->version_asks = t;
	return t;
}

/* Unlinks and frees t; returns its agent. */
static struct node_agent *ask_free(struct agent_version_ask *t)
{
	struct node_agent *a = t->a;
	struct agent_version_ask **pp;

	for (pp = &a->version_asks; *pp != NULL && *pp != t; pp = &(*pp)->next)
		;
	if (*pp == t)
		*pp = t->next;
	free(t);
	return a;
}

static void agent_version_ask_cancel(struct agent_version_ask *t)
{
	if (t != NULL)
		ask_free(t);
}

static struct agent_version *agent_version_answered(void *arg, struct node_agent **ap)
{
	struct agent_version_ask *t = arg;
	uint64_t id = t->id;
	struct node_agent *a = ask_free(t);

	*ap = a;
	return a->ver != NULL && a->ver->id == id ? a->ver : NULL;
}

void agent_version_asks_fini(struct node_agent *a)
{
	while (a->version_asks != NULL) {
		struct agent_version_ask *t = a->version_asks;
		a->version_asks = t->next;
		free(t);
	}
}

static int ask_manifest(struct node_agent *a, uint64_t v, trk_client_cb cb)
{
	struct agent_version_ask *t = agent_version_ask_new(a);

	if (t == NULL || trk_client_get_manifest(a->trk, v, cb, t) != 0) {
		agent_version_ask_cancel(t);
		return -EIO;
	}
	return 0;
}

static void on_parent(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_version *v = agent_version_answered(arg, &a);
	struct proto_manifest pm;
	struct proto_err err;

	if (v == NULL)
		return;
	struct fetch *f = v->f;
	if (ans->status != 200) {
		agent_version_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &pm, &err) != 0) {
		agent_version_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, err.msg);
		return;
	}
	bool ok = pm.version == f->man.parent_version &&
		  sodium_memcmp(pm.digest, f->man.parent_digest, PROTO_HASH_BYTES) == 0;
	proto_manifest_fini(&pm);
	if (!ok) {
		agent_version_fail(a, "broken parent chain: v%" PRIu64 " is not the parent it names",
				 f->man.parent_version);
		return;
	}
	with_manifest(a);
}

static void on_manifest(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_version *v = agent_version_answered(arg, &a);
	struct proto_err err;

	if (v == NULL)
		return;
	struct fetch *f = v->f;
	if (ans->status != 200) {
		agent_version_fail(a, "manifest: %s", ans->error);
		return;
	}
	int rc = proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &f->man, &err);
	if (rc == -EKEYREJECTED) {
		key_refused(a, err.msg);
		return;
	}
	if (rc != 0) {
		agent_version_fail(a, "%s", err.msg);
		return;
	}
	agent_fixed(a);
	f->have_man = true;
	f->su.manifest = proto_wall_ms();
	if (f->man.version != f->version) {
		agent_version_fail(a, "the tracker sent the manifest of v%" PRIu64, f->man.version);
		return;
	}
	if (sodium_memcmp(f->man.model_digest, a->model.digest, PROTO_HASH_BYTES) != 0) {
		agent_version_fail(a, "the manifest is for another model");
		return;
	}
	if (f->man.chunk_size > a->fx.chunk_size) {
		agent_version_fail(a, "chunk size %u exceeds ours (%u)", f->man.chunk_size,
				 a->fx.chunk_size);
		return;
	}
	/* The parent link: checked against the manifest we accepted last when
	 * it is the parent, else against the parent's own signed manifest. */
	if (f->man.parent_version == 0) {
		with_manifest(a);
	} else if (a->last_version == f->man.parent_version) {
		if (sodium_memcmp(a->last_digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
			agent_version_fail(a, "broken parent chain: parent digest differs from v%" PRIu64
					 "'s", a->last_version);
			return;
		}
		with_manifest(a);
	} else if (ask_manifest(a, f->man.parent_version, on_parent) != 0) {
		agent_version_fail(a, "cannot fetch the parent manifest");
	}
}

void agent_version_start(struct node_agent *a, uint64_t version)
{
	struct agent_version *v = version_new(a, version);

	if (v == NULL)
		return;
	v->f->su.watch = a->seen >= version ? a->seen_wall_ms : 0;
	v->f->fresh_until_ms = a->fresh_v == version ? a->fresh_until_ms : 0;
	a->ver = v;
	fetch_begin(&a->fx, v->f);
	delta_warm_pause(&a->ds, true);
	agent_report(a, version, TRK_STATE_FETCHING, NULL, NULL);
	if (ask_manifest(a, version, on_manifest) != 0)
		agent_version_fail(a, "cannot ask for the manifest");
}

/*
 * A fresh version: the tracker published it less than STARVE_MS ago (its
 * own clock: now_ms - published_ms, no skew). Every member heard of it at
 * about the same time, and a member takes a chunk it does not own from a
 * publisher only once starved for STARVE_MS: until then no peer can hold a
 * chunk we own, so our first reads need not wait for peers' first
 * have-pages (fetch_pick). An answer without now_ms (an older tracker)
 * makes no version fresh.
 */
void agent_note_fresh(struct node_agent *a, uint64_t v, uint64_t now_ms,
		      const struct trk_version_info *vs, size_t n)
{
	for (size_t i = 0; i < n && now_ms != 0; i++) {
		uint64_t age = now_ms > vs[i].published_ms ? now_ms - vs[i].published_ms : 0;
		if (vs[i].version != v || age >= STARVE_MS)
			continue;
		a->fresh_v = v;
		a->fresh_until_ms = node_now_ms() + (STARVE_MS - age);
		LOG_DEBUG("node %s: v%" PRIu64 " is fresh (published %" PRIu64 " ms ago)%s", a->node_id,
			  v, age, a->ver != NULL && a->ver->version == v ? "; so is its fetch" : "");
		/* The replica's target may have moved first (its poll), and
		 * the fetch started before this answer came. */
		if (a->ver != NULL && a->ver->version == v)
			a->ver->f->fresh_until_ms = a->fresh_until_ms;
	}
}

/* ---- fetched, verified, active ----------------------------------------------- */

void agent_version_fetched(void *arg)
{
	struct node_agent *a = arg;
	struct agent_version *v = a->ver; /* the fetcher's fetch is this version's */
	struct fetch *f = v->f;

	/* In place, a delta is applied to the served slot at activation. */
	if (f->delta && !agent_inplace(a)) {
		const uint8_t *digest;
		struct node_slot *parent = agent_delta_parent(a, &digest);
		agent_stage(a, STAGE_REBUILDING);
		if (delta_rebuild(&a->ds, &v->db, parent, digest) != 0)
			need_anchor(a, "the parent slot changed during the fetch");
		return; /* on_rebuilt goes on */
	}
	if (!f->delta)
		proto_metrics_add(a->am.m, a->am.full_versions, 1);
	agent_verified(a);
}

/* Every chunk verified (and a delta rebuilt): report verified. */
static void agent_verified(struct node_agent *a)
{
	struct agent_version *v = a->ver;
	struct proto_err err;

	if (agent_chain_step_done(a)) /* a step of a chain: on to the next */
		return;
	agent_stage(a, STAGE_VERIFIED);
	v->verified_ms = node_now_ms();
	v->reported_verified = true;
	LOG_DEBUG("node %s: v%" PRIu64 " verified in %" PRIu64 " ms", a->node_id, v->version,
		  node_now_ms() - v->f->started_ms);
	if (agent_probe_expose(a, &err) != 0) {
		agent_expose_blocked(a, "cannot write the activation record", &err);
		return;
	}
	agent_report(a, v->version, TRK_STATE_VERIFIED, NULL, agent_on_verified_report);
}

/*
 * The tracker chose the replica's target t (the rule is in tracker/API.md):
 * work toward it. A version under way that is not t is dropped (the
 * tracker moves a target away from a version only when no rank can finish
 * it first); none is started for a version at or below the one we serve.
 * A verified t activates once the replica is complete at t and every other
 * rank's signed statement backs that.
 */
void agent_follow_target(struct node_agent *a, uint64_t t, bool complete, json_t *statements)
{
	struct agent_version *v = a->ver;
	uint64_t active = a->active ? a->active->version : 0;

	if (t == 0)
		return;
	if (t != a->target)
		LOG_DEBUG("node %s: replica target v%" PRIu64, a->node_id, t);
	a->target = t;
	if (a->chain != NULL && a->chain->target != t) {
		LOG_INFO("node %s: replica %s moved to v%" PRIu64 ": dropping the chain replay to v%" PRIu64,
			 a->node_id, a->o.replica, t, a->chain->target);
		agent_version_drop(a); /* first: no worker reads the chain's slot then */
		agent_chain_end(a, false);
		v = NULL;
	}
	if (v != NULL && v->version != t && a->chain == NULL) {
		LOG_INFO("node %s: replica %s moved to v%" PRIu64 ": dropping v%" PRIu64 "%s",
			 a->node_id, a->o.replica, t, v->version,
			 agent_verified_stage(v) ? " (verified)" : "");
		agent_version_drop(a);
		v = NULL;
	}
	if (v == NULL) {
		if (a->chain != NULL)
			return; /* planning the replay to t */
		if (t > active && (t != a->failed || node_now_ms() - a->failed_ms >= a->failed_wait_ms))
			agent_version_start(a, t);
		return;
	}
	if (v->stage != STAGE_VERIFIED)
		return;
	if (v->expose_error[0] != 0) {
		struct proto_err err;
		if (agent_probe_expose(a, &err) != 0) {
			agent_expose_blocked(a, "cannot write the activation record", &err);
			return;
		}
		LOG_INFO("node %s: the activation record can be written again", a->node_id);
		v->expose_error[0] = 0;
		v->reported_verified = false; /* the tick says verified again */
		return;
	}
	if (complete && agent_replica_backed(a, statements))
		agent_activate(a);
}

/* The tracker answered our verified report. */
static void agent_on_verified_report(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_version *v = a->ver;
	json_t *t;

	if (v == NULL || !agent_verified_stage(v))
		return;
	if (ans->status != 200) {
		v->reported_verified = false; /* say it again on the next tick */
		return;
	}
	agent_poke_siblings(a, v->version); /* they may be waiting for us alone */
	t = json_object_get(ans->json, "replica_target");
	agent_follow_target(a, json_is_integer(t) ? (uint64_t)json_integer_value(t) : v->version,
			    json_is_true(json_object_get(ans->json, "replica_complete")),
			    json_object_get(ans->json, "statements"));
	/* Still waiting for the rest of the replica: ask again soon, not at
	 * the sync period armed before the verification. */
	if (a->ver == v && agent_verified_stage(v))
		node_arm(a->sync_ev, agent_sync_period(a));
}

/* ---- the tick ------------------------------------------------------------------ */

void agent_on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	struct agent_version *v;
	uint64_t now = node_now_ms();

	swarm_tick(&a->sw);
	swarm_xl_tick(&a->sw); /* may refuse the version (one taken whole with no holder left) */
	v = a->ver;
	if (v == NULL || v->f->parcels == NULL)
		return;
	fetch_tick(&a->fx);
	agent_chain_sourceless(a); /* a step with no source: is it withdrawn? */
	if (agent_verified_stage(v) && !v->reported_verified) {
		v->reported_verified = true;
		agent_report(a, v->version, TRK_STATE_VERIFIED, NULL, agent_on_verified_report);
	} else if (!agent_verified_stage(v) && now - a->last_report_ms >= REPORT_MS) {
		a->last_report_ms = now;
		agent_report(a, v->version, TRK_STATE_FETCHING, NULL, NULL);
	}
	fetch_pump(&a->fx);
}
