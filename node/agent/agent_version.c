/* One version's fetch: its signed manifest and parent link, the plan to our
 * layout, the parcels to pull; and dropping it again. */
#include "node/agent/agent_internal.h"

void agent_fetch_free(struct node_agent *a, struct agent_fetch *f)
{
	if (f == NULL)
		return;
	/* No worker may still be copying, applying or scattering into this
	 * fetch's slot. */
	agent_rotation_stop(f->rot);
	node_rebuild_free(f->rebuild);
	f->rebuild = NULL;
	agent_rotation_free(f->rot);
	f->rot = NULL;
	agent_sums_free(f->psums);
	agent_sums_free(f->csums);
	f->psums = f->csums = NULL;
	if (a->ver != NULL)
		node_verifier_drain(a->ver);
	agent_swarm_unserve(a, f);
	agent_xl_unserve(a, f); /* before its slot goes back to the store */
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		for (size_t s = 0; s < p->nsrcs; s++) {
			if (p->srcs[s].fa_valid && a->fab != NULL)
				fab_av_remove(a->fab, p->srcs[s].fa);
			free(p->srcs[s].info.fabric_addr);
			free(p->srcs[s].have);
		}
		free(p->srcs);
		free(p->state);
		free(p->asked);
		free(p->nlive);
		free(p->avail);
		free(p->peer_busy);
		free(p->busy_ms);
		free(p->mine);
		free(p->owner);
		free(p->owner_on);
		free(p->standin);
		free(p->members);
		agent_wire_put(a, p->wire);
	}
	free(f->parcels);
	if (f->addendum_ev != NULL)
		event_free(f->addendum_ev);
	free(f->bad_ids);
	free(f->bad_counts);
	if (f->slot != NULL)
		node_slot_free(&a->store, f->slot);
	if (f->have_man)
		proto_manifest_fini(&f->man);
	free(f);
}

/* Drops the current fetch; reads still in flight finish into their slots
 * and are ignored (their generation is stale). */
void agent_fetch_drop(struct node_agent *a)
{
	for (uint32_t i = 0; i < a->nreads; i++)
		if (a->reads[i].in_fabric)
			a->reads[i].abandoned = true;
	agent_fetch_free(a, a->fetch);
	a->fetch = NULL;
	a->gen++;
	agent_warm_pause(a, false);
}

void agent_fetch_fail(struct node_agent *a, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	uint64_t v = a->fetch ? a->fetch->version : 0;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (a->fetch != NULL)
		LOG_WARN("node %s: v%" PRIu64 " refused: %s (%u stalled reads, %u failed reads, "
			 "%u chunks failed their hash)",
			 a->node_id, v, msg, a->fetch->stalls, a->fetch->read_failures,
			 a->fetch->bad_chunks);
	else
		LOG_WARN("node %s: v%" PRIu64 " refused: %s", a->node_id, v, msg);
	agent_report(a, v, TRK_STATE_FAILED, msg, NULL);
	proto_metrics_add(a->am.m, a->am.refused, 1);
	a->failed = a->chain != NULL ? a->chain->target : v;
	a->failed_ms = agent_now_ms();
	agent_fetch_drop(a);
	agent_chain_end(a, true); /* a failed step ends the replay: an anchor next */
}

static int setup_parcels(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	const struct proto_mlayout *ml = f->ml;
	uint32_t mine = 0;

	/* A delta version's parcels for our layout are deltas, unless our
	 * layout came by an addendum after it (addenda are always raw: a late
	 * layout gets the version whole). */
	f->delta = false;
	for (uint32_t i = 0; i < ml->nparcels; i++)
		if (ml->parcels[i].dst_rank == a->o.rank)
			f->delta = f->man.kind == PROTO_KIND_DELTA &&
				   ml->parcels[i].encoding == PROTO_ENC_DELTA;
	if (f->delta && agent_delta_check_parent(a) != 0)
		return -ENOENT;
	for (uint32_t i = 0; i < ml->nparcels; i++)
		mine += ml->parcels[i].dst_rank == a->o.rank;
	f->parcels = calloc(mine + 1, sizeof(*f->parcels));
	if (f->parcels == NULL)
		return -ENOMEM;
	/* Every parcel the plan owes this rank must be in the manifest, with
	 * the plan's size, and nothing else. */
	uint32_t planned = 0;
	for (uint32_t i = 0; i < f->plan->nparcels; i++)
		planned += f->plan->parcels[i].dst_rank == a->o.rank;
	if (planned != mine) {
		agent_fetch_fail(a, "manifest lists %u parcels for rank %u, the plan %u", mine, a->o.rank, planned);
		return -EBADMSG;
	}
	for (uint32_t i = 0; i < ml->nparcels; i++) {
		const struct proto_mparcel *mp = &ml->parcels[i];
		if (mp->dst_rank != a->o.rank)
			continue;
		const struct proto_parcel *pp = proto_plan_parcel(f->plan, mp->src_rank, mp->dst_rank);
		if (pp == NULL || pp->bytes != mp->bytes ||
		    mp->encoding != (f->delta ? PROTO_ENC_DELTA : PROTO_ENC_RAW) ||
		    (!f->delta && mp->wire_bytes != mp->bytes)) {
			agent_fetch_fail(a, "parcel %u<-%u does not match the plan", mp->dst_rank, mp->src_rank);
			return -EBADMSG;
		}
		struct agent_parcel *p = &f->parcels[f->nparcels++];
		p->mp = mp;
		p->pp = pp;
		p->state = calloc(mp->nchunks + 1, 1);
		p->asked = calloc(mp->nchunks + 1, 1);
		p->nlive = calloc(mp->nchunks + 1, 1);
		p->avail = calloc(mp->nchunks + 1, sizeof(*p->avail));
		p->peer_busy = calloc(mp->nchunks + 1, 1);
		p->busy_ms = calloc(mp->nchunks + 1, sizeof(*p->busy_ms));
		p->mine = malloc(mp->nchunks + 1);
		p->owner = calloc(mp->nchunks + 1, sizeof(*p->owner));
		p->owner_on = calloc(mp->nchunks + 1, 1);
		p->standin = calloc(mp->nchunks + 1, 1);
		if (p->state == NULL || p->asked == NULL || p->nlive == NULL || p->avail == NULL ||
		    p->peer_busy == NULL || p->busy_ms == NULL || p->mine == NULL || p->owner == NULL ||
		    p->owner_on == NULL || p->standin == NULL)
			return -ENOMEM;
		memset(p->mine, 1, mp->nchunks + 1);
		if (f->delta && (p->wire = agent_wire_get(a, mp->wire_bytes)) == NULL)
			return -ENOMEM;
		f->bytes_total += mp->wire_bytes;
	}
	/* In place, a delta is applied to the served slot: no second one. */
	if (!(f->delta && agent_inplace(a)) && agent_delta_slot(a) != 0)
		return -ENOMEM;
	if (!f->delta) /* every byte comes as a verified chunk: upload them as they do */
		node_slot_stream_begin(&a->store, f->slot, f->bytes_total);
	agent_swarm_serve(a, f);
	f->su.parcels = proto_wall_ms();
	LOG_INFO("node %s: fetching v%" PRIu64 ": %u parcels, %" PRIu64 " bytes%s%s", a->node_id,
		 f->version, f->nparcels, f->bytes_total, f->served ? ", serving them to peers" : "",
		 f->delta ? " (a delta: rebuilt from the active version)" : "");
	if (f->bytes_total == 0) {
		agent_all_verified(a);
		return 0;
	}
	for (uint32_t i = 0; i < f->nparcels; i++)
		agent_want_sources(a, i);
	return 0;
}

/* The plan is known: check it is the one the manifest signed, then fetch. */
static void with_plan(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	f->plan = &a->plan;
	if (sodium_memcmp(a->plan.digest, f->ml->plan_digest, PROTO_HASH_BYTES) != 0) {
		agent_fetch_fail(a, "our plan differs from the one the manifest signed");
		return;
	}
	if (setup_parcels(a) == -ENOMEM && a->fetch != NULL)
		agent_fetch_fail(a, "out of memory");
	else
		agent_pump(a);
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
	rc = proto_plan_build(&a->model, &tl, &a->layout, &a->plan, err);
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
	struct agent_fetch *f = a->fetch;
	struct proto_err err;

	if (f == NULL)
		return;
	f->plan_asked = false;
	if (plan_from_layouts(a, ans, f->man.src_layout_digest, &err) != 0) {
		agent_fetch_fail(a, "%s", err.msg);
		return;
	}
	LOG_DEBUG("node %s: v%" PRIu64 ": planned from the trainer layout", a->node_id, f->version);
	if (f->ml != NULL) /* else planned ahead of the addendum: it goes on */
		with_plan(a);
}

/*
 * Ready ahead. A registered node that holds no version yet has nothing to
 * do until the first one is published, and that fetch used to spend its
 * start on what does not depend on the version: the trainer layout's round
 * trip and the plan, and the version slot (mapped and populated, all the
 * rank's bytes: the largest step between the watch's wake-up and the first
 * read). So they are done while the node waits: the slot is made and left
 * as the store's spare, which the fetch's node_slot_new takes; the plan is
 * built from the tracker's trainer layout and kept with its digest, and
 * the fetch uses it only if the signed manifest names that digest
 * (plan_ready). Asked again every AHEAD_RETRY_MS until the tracker knows
 * a trainer layout; nothing here holds up a fetch that starts meanwhile.
 */
#define AHEAD_RETRY_MS 2000
static void on_layouts_ahead(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct proto_err err;

	a->ahead_asked = false;
	if (a->fetch != NULL || a->active != NULL || a->have_plan)
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

	if (!a->registered || a->leaving || a->fetch != NULL || a->active != NULL)
		return;
	if (!a->ahead_slot && a->standby == NULL) {
		a->ahead_slot = true; /* once: a failure here fails the fetch too */
		if (node_slot_new(&a->store, 0, len, &spare, &err) == 0) {
			node_slot_free(&a->store, spare);
			proto_metrics_add(a->am.m, a->am.ready_ahead_slot, 1);
		} else {
			LOG_DEBUG("node %s: no slot ahead: %s", a->node_id, err.msg);
		}
	}
	if (a->have_plan || a->ahead_asked || agent_now_ms() - a->ahead_ms < AHEAD_RETRY_MS)
		return;
	a->ahead_ms = agent_now_ms();
	a->ahead_asked = trk_client_layouts(a->trk, on_layouts_ahead, a) == 0;
}

/* The plan trainer layout -> ours is here (true), or asked for: on_layouts
 * goes on with the fetch once our parcels are known. */
static bool plan_ready(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	/* The same trainer layout as last time: the plan is already here. */
	if (a->have_plan && sodium_memcmp(a->plan_src, f->man.src_layout_digest, PROTO_HASH_BYTES) == 0)
		return true;
	if (f->plan_asked)
		return false;
	if (trk_client_layouts(a->trk, on_layouts, a) != 0)
		agent_fetch_fail(a, "cannot ask for the trainer layout");
	else
		f->plan_asked = true;
	return false;
}

/* Our layout's parcels are known (f->ml): the plan, then the parcels. */
static void with_layout(struct node_agent *a)
{
	if (plan_ready(a))
		with_plan(a);
}

/* The manifest is signed and its parent link checked. */
static void with_manifest(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	a->last_version = f->man.version;
	memcpy(a->last_digest, f->man.digest, PROTO_HASH_BYTES);

	f->ml = proto_manifest_layout(&f->man, a->layout.digest);
	/* A delta the chain planner chose to take whole: its raw copy first. */
	bool full = f->ml != NULL && a->full_v == f->version && f->man.kind == PROTO_KIND_DELTA;
	a->full_v = 0;
	if (full || f->ml == NULL) {
		/* Published before our layout registered: the publisher adds
		 * it by a signed addendum (agent_addendum.c), else we wait
		 * for the next version. Meanwhile what does not depend on
		 * it is made ready: the plan from the trainer layout, the
		 * holders of other layouts and our maps of them, and the
		 * slot (made and kept as the store's spare, which the fetch
		 * then takes), so that the first read goes out as soon as
		 * the addendum is in. */
		f->ml = NULL; /* the raw copy's block, once it is in */
		if (full)
			agent_copy_wait(a);
		else
			agent_addendum_wait(a);
		if (a->fetch == f)
			(void)plan_ready(a);
		if (a->fetch == f)
			agent_xl_prefetch(a);
		struct node_slot *spare;
		struct proto_err err;
		if (a->fetch == f && a->standby == NULL &&
		    node_slot_new(&a->store, f->version, a->layout.ranks[a->o.rank].nbytes, &spare,
				  &err) == 0)
			node_slot_free(&a->store, spare);
		return;
	}
	/* Whether replicas of other layouts hold it: the first read from the
	 * trainer waits for that answer (agent_xl_post), and the node's
	 * tracker requests go out one after another; asked after the
	 * parcels' offer and /sources it was the last round trip of that
	 * chain, so it goes first. Not for a delta: holders of our layout
	 * give its encoded parcels, no others. */
	if (f->man.kind != PROTO_KIND_DELTA)
		agent_xl_prefetch(a);
	if (a->fetch == f)
		with_layout(a);
}

void agent_with_addendum(struct node_agent *a)
{
	a->fetch->ml = proto_manifest_layout(&a->fetch->man, a->layout.digest);
	with_layout(a);
}

/* A tracker request of one fetch (its manifest, its parent's, its
 * addendum or raw copy): the fetch may be dropped and another started
 * before the answer comes (the replica's target moved), and that answer is
 * not the new fetch's. Tickets live in a->fetch_asks until their answer
 * (or node_agent_free). */
struct agent_fetch_ask {
	struct node_agent *a;
	uint64_t fetch_id;
	struct agent_fetch_ask *next;
};

struct agent_fetch_ask *agent_fetch_ask_new(struct node_agent *a)
{
	struct agent_fetch_ask *t = malloc(sizeof(*t));

	if (t == NULL)
		return NULL;
	*t = (struct agent_fetch_ask){a, a->fetch->id, a->fetch_asks};
	a->fetch_asks = t;
	return t;
}

/* Unlinks and frees t; returns its agent. */
static struct node_agent *ask_free(struct agent_fetch_ask *t)
{
	struct node_agent *a = t->a;
	struct agent_fetch_ask **pp;

	for (pp = &a->fetch_asks; *pp != NULL && *pp != t; pp = &(*pp)->next)
		;
	if (*pp == t)
		*pp = t->next;
	free(t);
	return a;
}

void agent_fetch_ask_cancel(struct agent_fetch_ask *t)
{
	if (t != NULL)
		ask_free(t);
}

struct agent_fetch *agent_fetch_answered(void *arg, struct node_agent **ap)
{
	struct agent_fetch_ask *t = arg;
	uint64_t id = t->fetch_id;
	struct node_agent *a = ask_free(t);

	*ap = a;
	return a->fetch != NULL && a->fetch->id == id ? a->fetch : NULL;
}

void agent_fetch_asks_fini(struct node_agent *a)
{
	while (a->fetch_asks != NULL) {
		struct agent_fetch_ask *t = a->fetch_asks;
		a->fetch_asks = t->next;
		free(t);
	}
}

static int ask_manifest(struct node_agent *a, uint64_t v, trk_client_cb cb)
{
	struct agent_fetch_ask *t = agent_fetch_ask_new(a);

	if (t == NULL || trk_client_get_manifest(a->trk, v, cb, t) != 0) {
		agent_fetch_ask_cancel(t);
		return -EIO;
	}
	return 0;
}

static void on_parent(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_fetch *f = agent_fetch_answered(arg, &a);
	struct proto_manifest pm;
	struct proto_err err;

	if (f == NULL)
		return;
	if (ans->status != 200) {
		agent_fetch_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &pm, &err) != 0) {
		agent_fetch_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, err.msg);
		return;
	}
	bool ok = pm.version == f->man.parent_version &&
		  sodium_memcmp(pm.digest, f->man.parent_digest, PROTO_HASH_BYTES) == 0;
	proto_manifest_fini(&pm);
	if (!ok) {
		agent_fetch_fail(a, "broken parent chain: v%" PRIu64 " is not the parent it names",
			   f->man.parent_version);
		return;
	}
	with_manifest(a);
}

static void on_manifest(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_fetch *f = agent_fetch_answered(arg, &a);
	struct proto_err err;

	if (f == NULL)
		return;
	if (ans->status != 200) {
		agent_fetch_fail(a, "manifest: %s", ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &f->man, &err) != 0) {
		agent_fetch_fail(a, "%s", err.msg);
		return;
	}
	f->have_man = true;
	f->su.manifest = proto_wall_ms();
	if (f->man.version != f->version) {
		agent_fetch_fail(a, "the tracker sent the manifest of v%" PRIu64, f->man.version);
		return;
	}
	if (sodium_memcmp(f->man.model_digest, a->model.digest, PROTO_HASH_BYTES) != 0) {
		agent_fetch_fail(a, "the manifest is for another model");
		return;
	}
	if (f->man.chunk_size > a->chunk_size) {
		agent_fetch_fail(a, "chunk size %u exceeds ours (%u)", f->man.chunk_size, a->chunk_size);
		return;
	}
	/* The parent link: checked against the manifest we accepted last when
	 * it is the parent, else against the parent's own signed manifest. */
	if (f->man.parent_version == 0) {
		with_manifest(a);
	} else if (a->last_version == f->man.parent_version) {
		if (sodium_memcmp(a->last_digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
			agent_fetch_fail(a, "broken parent chain: parent digest differs from v%" PRIu64 "'s",
				   a->last_version);
			return;
		}
		with_manifest(a);
	} else if (ask_manifest(a, f->man.parent_version, on_parent) != 0) {
		agent_fetch_fail(a, "cannot fetch the parent manifest");
	}
}

void agent_start_fetch(struct node_agent *a, uint64_t v)
{
	struct agent_fetch *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return;
	f->version = v;
	f->id = ++a->fetch_ids;
	f->started_ms = agent_now_ms();
	f->su.watch = a->seen >= v ? a->seen_wall_ms : 0;
	f->fresh_until_ms = a->fresh_v == v ? a->fresh_until_ms : 0;
	a->fetch = f;
	a->gen++;
	agent_warm_pause(a, true);
	agent_report(a, v, TRK_STATE_FETCHING, NULL, NULL);
	if (ask_manifest(a, v, on_manifest) != 0)
		agent_fetch_fail(a, "cannot ask for the manifest");
}

/* ms of t after the manifest's creation ("-": not yet, or before it). */
static const char *su_ms(char *buf, size_t len, uint64_t t, uint64_t created)
{
	if (t == 0 || t < created)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%" PRIu64, t - created);
	return buf;
}

void agent_startup_log(const struct node_agent *a, const struct agent_fetch *f)
{
	char w[24], m[24], p[24], s[24], h[24], r[24], b[24];
	uint64_t c = f->man.created_ms;

	LOG_INFO("node %s: v%" PRIu64 " start-up, ms from the manifest's creation: watch %s, "
		 "manifest %s, parcels %s, sources %s, have-page %s, read posted %s, first byte %s",
		 a->node_id, f->version, su_ms(w, sizeof(w), f->su.watch, c),
		 su_ms(m, sizeof(m), f->su.manifest, c), su_ms(p, sizeof(p), f->su.parcels, c),
		 su_ms(s, sizeof(s), f->su.sources, c), su_ms(h, sizeof(h), f->su.have, c),
		 su_ms(r, sizeof(r), f->su.read, c), su_ms(b, sizeof(b), f->first_byte_ms, c));
}
