/* Delta versions on a node: the exact-parent check, the rebuild of the new
 * slot from the active one (on a worker, made between versions into a
 * standby slot or else while the delta's chunks arrive, then a sparse apply
 * checked by wsum on the same worker), and asking for an anchor when the
 * parent is missing or does not verify.
 *
 * Rotation. The slot the new version is built in must first hold the
 * active version v(n). The node has a slot that nearly does: the one it
 * retired at v(n)'s activation, which held v(n-1) and, once no request pins
 * it, comes back as the store's spare with those bytes (the store keeps the
 * tag the node gave it at its activation: nothing wrote it since). When
 * v(n) was itself built by delta from v(n-1), re-applying that delta (kept
 * from v(n)'s fetch, about 1 % of the slot) makes it v(n) again, touching
 * only the positions that changed: the node alternates between two slots
 * and never copies one whole. The catch-up takes the parent checksums the
 * delta carries (the tag says the slot holds that parent); the apply of the
 * next delta then takes its parent checksums from the caught-up slot
 * itself, as after a copy, so a slot that did not hold v(n-1) after all is
 * caught there and the worker falls back to the dense copy. The copy of the
 * whole active slot remains for when the retired slot is pinned, not back
 * yet, of another size, or did not come from the last delta (an anchor, a
 * chain replay, an in-place install, TESSERA_DELTA_ROTATE=0). */
#include "node/agent_internal.h"

#include "node/rebuild.h"
#include "proto/delta.h"

/* The last delta of this rank, to patch its parent's slot up to its child. */
struct agent_rot_parcel {
	uint32_t src_rank, dst_rank;
	uint8_t *wire;
	size_t len;
	struct proto_dparcel dp; /* its pieces, built on the loop before it runs */
	bool have_dp;
};

struct agent_rotation {
	uint64_t tag;            /* the parent's slot, as activated */
	uint64_t parent_version; /* what that slot holds */
	uint64_t version;        /* what the delta makes of it: the active one */
	uint8_t plan_src[PROTO_HASH_BYTES];
	struct agent_rot_parcel *parcels;
	uint32_t nparcels;
	struct node_slot *slot; /* set when it runs: what the catch-up writes */
};

void agent_rotation_free(struct agent_rotation *r)
{
	if (r == NULL)
		return;
	for (uint32_t i = 0; i < r->nparcels; i++) {
		free(r->parcels[i].wire);
		if (r->parcels[i].have_dp)
			proto_dparcel_fini(&r->parcels[i].dp);
	}
	free(r->parcels);
	free(r);
}

/* On the rebuild's worker: r->slot, which holds r->parent_version, made to
 * hold r->version by re-applying its delta. Reads only r and the slot. */
static int catch_up(void *arg, struct proto_err *err)
{
	struct agent_rotation *r = arg;
	unsigned threads = node_verifier_threads();

	for (uint32_t i = 0; i < r->nparcels; i++) {
		struct agent_rot_parcel *rp = &r->parcels[i];
		struct proto_err e;
		int rc = proto_dparcel_apply_trusted(&rp->dp, rp->wire, rp->len, r->slot->host, threads,
						     &e);
		if (rc != 0)
			return proto_errf(err, -rc, "v%" PRIu64 "'s delta parcel %u<-%u does not "
					  "make the slot of v%" PRIu64 " v%" PRIu64 " again: %s",
					  r->version, rp->dst_rank, rp->src_rank, r->parent_version,
					  r->version, e.msg);
	}
	return 0;
}

/* The pieces of r's parcels in the current plan: 0, or -ENOENT (logged). */
static int rotation_pieces(struct node_agent *a, struct agent_rotation *r)
{
	for (uint32_t i = 0; i < r->nparcels; i++) {
		struct agent_rot_parcel *rp = &r->parcels[i];
		const struct proto_parcel *pp = proto_plan_parcel(&a->plan, rp->src_rank, rp->dst_rank);
		struct proto_err e;
		if (rp->have_dp)
			continue;
		if (pp == NULL || proto_dparcel_build(&a->model, &a->plan, pp, &a->layout, &rp->dp,
						      &e) != 0) {
			LOG_WARN("node %s: v%" PRIu64 "'s delta parcel %u<-%u: %s: no rotation",
				 a->node_id, r->version, rp->dst_rank, rp->src_rank,
				 pp == NULL ? "not in the plan" : e.msg);
			return -ENOENT;
		}
		rp->have_dp = true;
	}
	return 0;
}

/* The copy path: a fresh slot for version and, when parent is given, a
 * copy of the parent's bytes into it on a worker. On failure *slot may be
 * set (the caller frees it with the rest). */
static int copy_start(struct node_agent *a, uint64_t version, size_t len,
		      const struct node_slot *parent, struct node_slot **slot,
		      struct node_rebuild **rb, struct proto_err *err)
{
	/* A copy fills the slot whole through its memfd: a new one's pages
	 * are allocated by the copy, not cleared first. */
	int rc = parent != NULL ? node_slot_new_blank(&a->store, version, len, slot, err)
				: node_slot_new(&a->store, version, len, slot, err);

	if (rc != 0 || parent == NULL)
		return rc;
	rc = node_rebuild_start(a->base, (*slot)->host, (*slot)->memfd, (*slot)->fresh,
				parent->host, parent->memfd, PROTO_MIN((*slot)->len, parent->len), rb,
				err);
	if (rc == 0)
		(*slot)->fresh = false; /* the copy writes every page once */
	return rc;
}

/* Builds version's slot by rotation (see the top of the file): *slot is
 * the retired slot and *rb its catch-up under way, then 0; else -ENOENT
 * with nothing changed (*retry: the retired slot is neither pinned nor
 * back yet, it soon will be), or the error of a failed start. */
static int rotate_start(struct node_agent *a, uint64_t version, size_t len,
			struct node_slot **slot, struct node_rebuild **rb,
			struct agent_rotation **rot, bool *retry, struct proto_err *err)
{
	struct agent_rotation *r = a->rot;

	*retry = false;
	if (r == NULL || a->active == NULL || a->active->version != r->version ||
	    a->o.install_inplace || proto_param(PROTO_PARAM_DELTA_ROTATE) == 0 ||
	    sodium_memcmp(r->plan_src, a->plan_src, PROTO_HASH_BYTES) != 0)
		return -ENOENT;
	if (rotation_pieces(a, r) != 0)
		return -ENOENT;
	if (node_slot_reuse(&a->store, r->tag, version, len, slot) != 0) {
		uint32_t pins = node_attach_pins(a->attach, r->parent_version);
		*retry = pins == 0;
		if (pins > 0)
			LOG_INFO("node %s: the slot of v%" PRIu64 " is pinned by %u request%s: no "
				 "rotation, v%" PRIu64 " is copied whole",
				 a->node_id, r->parent_version, pins, pins == 1 ? "" : "s", r->version);
		else
			LOG_DEBUG("node %s: the slot of v%" PRIu64 " is not back in the store yet",
				  a->node_id, r->parent_version);
		return -ENOENT;
	}
	r->slot = *slot;
	(*slot)->fresh = false; /* the catch-up writes most pages, the apply the rest */
	if (node_rebuild_start_sparse(a->base, (*slot)->host, (*slot)->memfd, a->active->host,
				      a->active->memfd, len, catch_up, r, rb, err) != 0) {
		node_slot_free(&a->store, *slot);
		*slot = NULL;
		return -ENOMEM;
	}
	a->rot = NULL;
	*rot = r;
	return 0;
}

/* The node cannot build v from a delta: it says why and which path it takes
 * (an anchor: the tracker passes the request on to the publisher, whose next
 * version is then full), then refuses the version; the active one stays. */
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
	node_metrics_add(a->am.m, a->am.delta_refused, 1);
	agent_fetch_fail(a, "%s; falling back to a full fetch: asking for an anchor", msg);
}

/* The slot a delta of a->fetch builds on, and its manifest digest: the
 * chain's last step while replaying one, else the active slot (NULL: none). */
static struct node_slot *parent_slot(const struct node_agent *a, const uint8_t **digest)
{
	struct node_slot *s = agent_chain_parent(a, digest);

	if (s != NULL)
		return s;
	*digest = a->active_digest;
	return a->inplace_broken ? NULL : a->active;
}

int agent_delta_check_parent(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	char want[17], have[17];
	const uint8_t *digest;
	struct node_slot *parent = parent_slot(a, &digest);

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
		    f->man.parent_version, want, parent != NULL ? parent->version : a->active->version,
		    have);
	return -ENOENT;
}

/* Stops and frees the standby copy (its slot may become the store's spare). */
static void standby_drop(struct node_agent *a)
{
	node_rebuild_free(a->standby_rb);
	a->standby_rb = NULL;
	agent_rotation_free(a->standby_rot);
	a->standby_rot = NULL;
	if (a->standby != NULL)
		node_slot_free(&a->store, a->standby);
	a->standby = NULL;
}

/* How long on_standby waits for the retired slot to come back. */
#define STANDBY_RETRY_MS 50u
#define STANDBY_TRIES 40u

/* The longest the standby waits for peers to stop reading. */
#define STANDBY_DEFER_MAX_MS 60000u

/*
 * Whether peers are still reading from this node, so that the standby
 * waits (armed again, true). Reads are one-sided: the node sees none of
 * them, but its fabric loop is woken by its wait fd for each request it
 * serves, and between versions nothing of its own is in flight. So the
 * standby waits until a whole TESSERA_DELTA_STANDBY_QUIET_MS went by with
 * no such wake-up: in a fanout the replicas that finish first serve the
 * last ones, and a copy of the slot then took the CPU those were waiting
 * on. Bounded by STANDBY_DEFER_MAX_MS; a delta that comes meanwhile
 * makes its own copy (agent_delta_slot).
 */
static bool standby_wait(struct node_agent *a)
{
	uint64_t quiet = proto_param(PROTO_PARAM_DELTA_STANDBY_QUIET_MS), now = agent_now_ms();
	struct node_fabloop_counts c = {0};

	if (quiet == 0)
		return false;
	if (a->fl != NULL)
		node_fabloop_counts(a->fl, &c);
	bool busy = c.fd_polls != a->standby_fd_polls;
	if (a->standby_test_busy > 0) { /* test only */
		a->standby_test_busy--;
		busy = true;
	}
	a->standby_fd_polls = c.fd_polls;
	if (!busy)
		return false;
	if (a->standby_defer_ms == 0) {
		a->standby_defer_ms = now;
		LOG_INFO("node %s: peers are reading from this node: the standby copy of v%" PRIu64
			 " waits until they stop (%" PRIu64 " ms without a read)",
			 a->node_id, a->active->version, quiet);
	}
	if (now - a->standby_defer_ms >= STANDBY_DEFER_MAX_MS) {
		LOG_INFO("node %s: peers still read from this node after %u ms: the standby copy of v%"
			 PRIu64 " is made all the same", a->node_id, STANDBY_DEFER_MAX_MS,
			 a->active->version);
		a->standby_defer_ms = 0; /* said: on_standby does not say it went ahead */
		return false;
	}
	agent_arm(a->standby_ev, quiet);
	return true;
}

/* Between versions: a standby slot is made to hold the active version on
 * a worker, by rotation or else a copy, so that a delta against it, when it
 * comes, is only applied. A fetch that began first made its own slot:
 * nothing to do then. */
static void on_standby(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct proto_err err = {{0}};
	bool retry;

	(void)fd;
	(void)what;
	if (a->fetch != NULL || a->active == NULL || a->standby != NULL || a->active->len != len)
		return;
	if (a->standby_tries == 0 && standby_wait(a))
		return;
	if (a->standby_defer_ms != 0 && a->standby_tries == 0)
		LOG_INFO("node %s: no peer read from this node for %" PRIu64 " ms: the standby copy of v%"
			 PRIu64 " goes ahead, %" PRIu64 " ms after it began waiting",
			 a->node_id, proto_param(PROTO_PARAM_DELTA_STANDBY_QUIET_MS),
			 a->active->version, agent_now_ms() - a->standby_defer_ms);
	uint64_t was = a->rot != NULL ? a->rot->parent_version : 0;
	int rc = rotate_start(a, a->active->version + 1, len, &a->standby, &a->standby_rb,
			      &a->standby_rot, &retry, &err);
	if (rc == 0) {
		LOG_INFO("node %s: the slot of v%" PRIu64 " made v%" PRIu64 " by its delta for the next "
			 "delta (a rotation: no dense copy)",
			 a->node_id, was, a->active->version);
		return;
	}
	/* The retired slot is on its way back (ATTACH_FREE_GRACE_MS): wait for
	 * it, a bounded while. */
	if (rc == -ENOENT && retry && a->standby_tries++ < STANDBY_TRIES) {
		agent_arm(a->standby_ev, STANDBY_RETRY_MS);
		return;
	}
	if (rc == -ENOENT && retry)
		LOG_INFO("node %s: the slot of v%" PRIu64 " did not come back in %u ms: no rotation",
			 a->node_id, was, STANDBY_TRIES * STANDBY_RETRY_MS);
	if (rc == -ENOENT)
		rc = copy_start(a, a->active->version + 1, len, a->active, &a->standby,
				&a->standby_rb, &err);
	if (rc != 0) {
		LOG_WARN("node %s: no standby copy of v%" PRIu64 " (%s); a delta will copy it then",
			 a->node_id, a->active->version, err.msg);
		standby_drop(a);
		return;
	}
	LOG_INFO("node %s: copying v%" PRIu64 " into a standby slot for the next delta", a->node_id,
		 a->active->version);
}

/* f's delta becomes the next rotation's catch-up, when it was applied to
 * old (the active slot then, retired now) and old is activated content. */
static void keep_rotation(struct node_agent *a, struct agent_fetch *f, struct node_slot *old)
{
	agent_rotation_free(a->rot);
	a->rot = NULL;
	if (!f->delta || !f->rotatable || old == NULL || old == a->active || old->tag == 0 ||
	    a->o.install_inplace)
		return;
	struct agent_rotation *r = calloc(1, sizeof(*r));
	if (r == NULL || (r->parcels = calloc(f->nparcels + 1, sizeof(*r->parcels))) == NULL) {
		free(r);
		return; /* the next delta copies */
	}
	r->tag = old->tag;
	r->parent_version = old->version;
	r->version = f->version;
	memcpy(r->plan_src, a->plan_src, PROTO_HASH_BYTES);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		struct agent_rot_parcel *rp = &r->parcels[r->nparcels++];
		rp->src_rank = p->mp->src_rank;
		rp->dst_rank = p->mp->dst_rank;
		rp->len = p->mp->wire_bytes;
		rp->wire = p->wire; /* the fetch's no more */
		p->wire = NULL;
		if (rp->wire == NULL) {
			agent_rotation_free(r);
			return;
		}
	}
	a->rot = r;
}

void agent_delta_activated(struct node_agent *a, struct agent_fetch *f, struct node_slot *old)
{
	agent_chain_end(a, false); /* the target is active: the replay is over */
	standby_drop(a);
	keep_rotation(a, f, old);
	a->active->tag = ++a->slot_tags;
	a->standby_tries = 0;
	a->standby_defer_ms = 0;
	a->standby_test_busy = proto_param(PROTO_PARAM_TEST_STANDBY_BUSY);
	if (a->o.install_inplace)
		return; /* memory-tight: no second copy of the rank */
	struct node_fabloop_counts c = {0};
	if (a->fl != NULL)
		node_fabloop_counts(a->fl, &c);
	a->standby_fd_polls = c.fd_polls; /* peers' reads are counted from here */
	if (a->standby_ev == NULL)
		a->standby_ev = evtimer_new(a->base, on_standby, a);
	if (a->standby_ev != NULL)
		agent_arm(a->standby_ev, proto_param(PROTO_PARAM_DELTA_STANDBY_MS));
}

void agent_delta_fini(struct node_agent *a)
{
	agent_chain_end(a, false);
	standby_drop(a);
	agent_rotation_free(a->rot);
	a->rot = NULL;
	if (a->standby_ev != NULL)
		event_free(a->standby_ev);
	a->standby_ev = NULL;
}

int agent_delta_slot(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct proto_err err = {{0}};
	bool retry;

	const uint8_t *pdigest;
	struct node_slot *chain = agent_chain_parent(a, &pdigest);

	if (a->standby != NULL && a->standby->len == len && !(f->delta && chain != NULL)) {
		/* The standby holds the active slot's bytes, or will: a delta's
		 * exact parent (checked before); for anything else it is only
		 * memory, which the fetch overwrites whole. */
		f->slot = a->standby;
		f->slot->version = f->version;
		a->standby = NULL;
		if (f->delta) {
			f->rebuild = a->standby_rb;
			f->rot = a->standby_rot;
			f->from_standby = true;
		} else {
			node_rebuild_free(a->standby_rb);
			agent_rotation_free(a->standby_rot);
		}
		a->standby_rb = NULL;
		a->standby_rot = NULL;
		return 0;
	}
	/* A chain's delta builds on the step before, not on the active slot. */
	struct node_slot *parent = chain != NULL ? chain : a->active;
	standby_drop(a);
	int rc = -ENOENT;
	if (f->delta && chain == NULL)
		rc = rotate_start(a, f->version, len, &f->slot, &f->rebuild, &f->rot, &retry, &err);
	if (rc == -ENOENT) /* no rotation: a delta's parent is copied whole */
		rc = copy_start(a, f->version, len, f->delta ? parent : NULL, &f->slot, &f->rebuild,
				&err);
	if (rc != 0) {
		agent_fetch_fail(a, "%s", err.msg);
		return -ENOMEM;
	}
	return 0;
}

/* On the rebuild's worker, after the copy: every parcel's delta applied to
 * the new slot, each piece's checksum checked. It reads only what the loop
 * leaves alone while the fetch lives (the model, plan and layout, the
 * parcels' manifest entries and wire bytes, the slot). */
static int apply_all(void *arg, struct proto_err *err)
{
	struct agent_fetch *f = arg; /* not a->fetch: the loop may clear that before the join */
	const struct node_agent *a = f->rebuild_agent;
	unsigned threads = node_verifier_threads();

	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		struct proto_dparcel dp;
		if (f->test_corrupt && p->mp->wire_bytes > 0) { /* test only */
			p->wire[p->mp->wire_bytes / 2] ^= 0x40;
			f->test_corrupt = false;
		}
		struct proto_err e;
		int rc = proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &dp, &e);
		if (rc == 0) {
			rc = proto_dparcel_apply(&dp, p->wire, p->mp->wire_bytes, f->slot->host, threads,
						 &e);
			proto_dparcel_fini(&dp);
		}
		if (rc != 0)
			return proto_errf(err, -rc, "delta parcel %u<-%u does not rebuild v%" PRIu64
					  " from v%" PRIu64 ": %s",
					  p->mp->dst_rank, p->mp->src_rank, f->version,
					  f->man.parent_version, e.msg);
	}
	return 0;
}

/* Back on the loop: the slot holds the new version, or the fetch is refused. */
static void rebuilt(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		    void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	char how[600];

	if (rc != 0) {
		need_anchor(a, "%s", err->msg);
		return;
	}
	/* The wire bytes stay: the next delta's rotation re-applies them. */
	f->rebuild_ms = agent_now_ms() - f->rebuild_ms;
	node_metrics_add(a->am.m, a->am.delta_versions, 1);
	node_metrics_add(a->am.m, t->dense ? a->am.delta_copies : a->am.delta_rotations, 1);
	if (f->rot != NULL && !t->dense)
		snprintf(how, sizeof(how), "no dense copy: the slot of v%" PRIu64 " made v%" PRIu64
			 " again by its delta%s in %" PRIu64 " ms",
			 f->rot->parent_version, f->rot->version,
			 f->from_standby ? " (the standby one)" : "", t->catchup_ms);
	else if (f->rot != NULL)
		snprintf(how, sizeof(how), "a dense copy: the slot of v%" PRIu64 " was not v%" PRIu64
			 " after its delta (%s), so v%" PRIu64 " was copied whole%s",
			 f->rot->parent_version, f->rot->version, t->fallback, f->rot->version,
			 f->from_standby ? " (the standby one)" : "");
	else
		snprintf(how, sizeof(how), "a dense copy of the parent%s",
			 f->from_standby ? " (the standby one)" : "");
	LOG_INFO("node %s: v%" PRIu64 " rebuilt from v%" PRIu64 " by delta (%" PRIu64
		 " wire bytes for %" PRIu64 " bytes, every piece's checksum verified, %" PRIu64
		 " ms after the last chunk; %s; the parent took %" PRIu64 " ms, %" PRIu64
		 " ms of it after the last chunk, the apply %" PRIu64 " ms)",
		 a->node_id, f->version, f->man.parent_version, f->bytes_total, f->slot->len,
		 f->rebuild_ms, how, t->copy_ms, t->wait_ms, t->apply_ms);
	agent_rotation_free(f->rot); /* the worker is done with it */
	f->rot = NULL;
	agent_verified(a);
}

void agent_delta_rebuild(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	const uint8_t *digest;
	struct node_slot *parent = parent_slot(a, &digest);

	/* The parent may have changed since the fetch began only through an
	 * activation, which needs this fetch: check anyway, cheaply. */
	if (parent == NULL || parent->version != f->man.parent_version ||
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
		need_anchor(a, "the parent slot changed during the fetch");
		return;
	}
	f->rebuild_ms = agent_now_ms();
	f->rebuild_agent = a;
	f->rotatable = parent == a->active;
	f->test_corrupt = a->chain != NULL &&
			  proto_param(PROTO_PARAM_TEST_CORRUPT_CHAIN) == f->version;
	node_rebuild_apply(f->rebuild, apply_all, f, rebuilt, a);
}
