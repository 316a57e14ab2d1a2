/* The slots a delta build starts from: the standby copy made between
 * versions, the retired slot caught up by rotation, the warm slot made at
 * start, or a fresh copy (NOTES.md, "Rotation", "The warm slot"). */
#include "node/rebuild/internal.h"

#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "node/base/fabloop.h"
#include "node/fetch/verifier.h"

static void on_standby(evutil_socket_t fd, short what, void *arg);

void delta__rotation_stop(struct delta_rotation *r)
{
	if (r != NULL)
		__atomic_store_n(&r->hurry, 1, __ATOMIC_RELAXED);
}

void delta__rotation_free(struct delta_rotation *r)
{
	if (r == NULL)
		return;
	for (uint32_t i = 0; i < r->nparcels; i++) {
		fetch_wire_put(r->x, r->parcels[i].wire);
		if (r->parcels[i].have_dp)
			proto_dparcel_fini(&r->parcels[i].dp);
	}
	free(r->parcels);
	free(r->scrub.items);
	free(r);
}

/* On the rebuild's worker: r->slot, which holds r->parent_version, made to
 * hold r->version by re-applying its delta. Reads only r and the slot. */
static int catch_up(void *arg, struct proto_err *err)
{
	struct delta_rotation *r = arg;
	unsigned threads = node_verifier_threads();

	for (uint32_t i = 0; i < r->nparcels; i++) {
		struct delta_rot_parcel *rp = &r->parcels[i];
		struct proto_err e;
		int rc = proto_dparcel_apply_trusted(&rp->dp, rp->wire, rp->len, r->slot->host, threads,
						     &e);
		if (rc != 0)
			return proto_errf(err, -rc, "v%" PRIu64 "'s delta parcel %u<-%u does not "
					  "make the slot of v%" PRIu64 " v%" PRIu64 " again: %s",
					  r->version, rp->dst_rank, rp->src_rank, r->parent_version,
					  r->version, e.msg);
	}
	/* Test only: the catch-up is still scrubbing when the next delta
	 * comes (bounded; the loop sets hurry before it waits for us). */
	for (int i = 0; i < 30000 && proto_param(PROTO_PARAM_TEST_CATCHUP_HOLD) != 0 &&
			!__atomic_load_n(&r->hurry, __ATOMIC_RELAXED);
	     i++)
		usleep(1000);
	/* The catch-up read the changed positions only: a share of the rest
	 * is re-summed here, between versions; never while an apply waits for
	 * the slot (it is re-summed in the active slot after the activation,
	 * see rebuilt). */
	int rc = delta__scrub_check(&r->scrub, r->slot->host, r->slot->memfd, r->version, &r->hurry, err);
	if (rc == -EINTR)
		__atomic_store_n(&r->scrub_cut, 1, __ATOMIC_RELAXED);
	return rc == -EINTR ? 0 : rc;
}

/* The pieces of r's parcels in the current plan: 0, or -ENOENT (logged). */
static int rotation_pieces(struct delta_state *d, struct delta_rotation *r)
{
	for (uint32_t i = 0; i < r->nparcels; i++) {
		struct delta_rot_parcel *rp = &r->parcels[i];
		const struct proto_parcel *pp = proto_plan_parcel(d->o.plan, rp->src_rank, rp->dst_rank);
		struct proto_err e;
		if (rp->have_dp)
			continue;
		if (pp == NULL || proto_dparcel_build(d->o.model, d->o.plan, pp, d->o.x->o.layout, &rp->dp,
						      &e) != 0) {
			LOG_WARN("node %s: v%" PRIu64 "'s delta parcel %u<-%u: %s: no rotation",
				 d->o.x->o.id, r->version, rp->dst_rank, rp->src_rank,
				 pp == NULL ? "not in the plan" : e.msg);
			return -ENOENT;
		}
		rp->have_dp = true;
	}
	return 0;
}

/* The warm slot. The first access from user space to each page of a new
 * mapping is a fault, and in a VM a trap to the hypervisor, however the
 * kernel populated it: the first dense copy after the node's first anchor
 * paid those on its way to activation. The node needs that second slot
 * anyway: it makes it when it starts, and a worker at the lowest priority
 * touches every page while the node has nothing else to do, held while a
 * version is fetched. The first dense copy of a parent takes it (NOTES.md,
 * "The warm slot"). */
static int warm_run(void *arg, struct proto_err *err)
{
	struct delta_state *d = arg; /* reads d->warm and warm_stop, writes warm_cpu_ms */
	uint64_t cpu0 = proto_thread_cpu_ns();
	int rc;

	(void)err;
	/* The kernel maps the pages first, at our normal priority: a fault
	 * holds the process's address space, and a nice-19 thread preempted
	 * inside one on a busy machine held it for seconds while the loop's
	 * mmap waited (16 nodes on 2 cores, a monitoring loop adding load:
	 * in 7 of 13 runs a node's first fetch spent 0.5-1.8 s instead of
	 * 1 ms setting up, in its cross-layout buffers' mmap, a lag it never
	 * made up; with the warm slot off, and populated first, 0 of 3 and
	 * 0 of 4). An old kernel without MADV_POPULATE_WRITE faults them in
	 * with the touch, as before. */
	rc = node_slot_populate(d->warm, &d->warm_stop, &d->warm_pause);
	if (rc != 0 && rc != -ENOTSUP)
		goto out;
	/* Only what the node leaves idle: the fetch of the first version
	 * keeps the CPU when it comes. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
		LOG_DEBUG("node %s: the warm slot's worker keeps its priority: %s", d->o.x->o.id,
			  strerror(errno));
	rc = node_slot_touch(d->warm, &d->warm_stop, &d->warm_pause);
out:
	/* Its own CPU, not the process's (the fetch runs meanwhile): read by
	 * warmed, on the loop, after the rebuild's eventfd. */
	d->warm_cpu_ms = (proto_thread_cpu_ns() - cpu0) / 1000000;
	return rc;
}

static void warmed(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		   void *arg)
{
	struct delta_state *d = arg;

	(void)err;
	(void)t; /* its CPU is the whole process's: second_cpu_ms is the worker's */
	d->warm_ready = rc == 0;
	if (rc == 0) {
		d->warm->fresh = false;
		LOG_INFO("node %s: the second slot (%zu MiB) is warm: every page touched in %" PRIu64
			 " ms (%" PRIu64 " ms of the worker's CPU), for the first copy after an anchor",
			 d->o.x->o.id, d->warm->len >> 20, node_now_ms() - d->warm_ms,
			 d->warm_cpu_ms);
	} else {
		/* Not a stop (warm_stop frees the rebuild: no call then). */
		LOG_WARN("node %s: the second slot's pages were not mapped ahead: %s; the first copy "
			 "after an anchor maps them",
			 d->o.x->o.id, strerror(-rc));
	}
	node_rebuild_free(d->warm_rb); /* done: the join is immediate */
	d->warm_rb = NULL;
}

void delta_warm_pause(struct delta_state *d, bool fetching)
{
	__atomic_store_n(&d->warm_pause, fetching ? 1 : 0, __ATOMIC_RELAXED);
}

/* Stops the warm slot's touch; the slot stays (d->warm). */
void delta__warm_stop(struct delta_state *d)
{
	__atomic_store_n(&d->warm_stop, 1, __ATOMIC_RELAXED);
	node_rebuild_free(d->warm_rb);
	d->warm_rb = NULL;
}

void delta_warm(struct delta_state *d)
{
	size_t len = fetch_rank_bytes(d->o.x);
	struct proto_err err = {{0}};

	if (d->o.install_inplace || len == 0 || d->warm != NULL ||
	    proto_param(PROTO_PARAM_DELTA_WARM) == 0)
		return;
	d->warm_stop = 0;
	d->warm_ready = false;
	d->warm_ms = node_now_ms();
	if (node_slot_new_blank(d->o.x->o.store, 0, len, &d->warm, &err) != 0 ||
	    node_rebuild_start(d->o.x->o.base, NULL, -1, false, NULL, -1, 0, &d->warm_rb, &err) != 0) {
		LOG_WARN("node %s: no warm second slot (%s): the first copy after an anchor makes "
			 "its own", d->o.x->o.id, err.msg);
		if (d->warm != NULL)
			node_slot_free(d->o.x->o.store, d->warm);
		d->warm = NULL;
		return;
	}
	node_rebuild_apply(d->warm_rb, warm_run, d, warmed, d);
}

/* The warm slot for version, a copy of parent, if it has len bytes (else
 * it is freed): its touch stopped, and fresh unless it was done. NULL when
 * none. */
static struct node_slot *warm_take(struct delta_state *d, const struct node_slot *parent,
				   uint64_t version, size_t len)
{
	struct node_slot *s = d->warm;

	if (s == NULL)
		return NULL;
	delta__warm_stop(d);
	d->warm = NULL;
	if (s->len != len) {
		node_slot_free(d->o.x->o.store, s);
		return NULL;
	}
	s->version = version;
	s->tag = 0;
	if (parent != NULL)
		LOG_INFO("node %s: v%" PRIu64 " is copied into the second slot made at start (%s)",
			 d->o.x->o.id, parent->version,
			 d->warm_ready ? "warm: every page touched"
				       : "its pages not all touched yet: copied into as a new slot");
	else
		LOG_INFO("node %s: v%" PRIu64 " is fetched into the second slot made at start (%s)",
			 d->o.x->o.id, version,
			 d->warm_ready ? "warm: every page touched" : "its pages not all touched yet");
	return s;
}

/* The copy path: a fresh slot for version and, when parent is given, a
 * copy of the parent's bytes into it on a worker (into the warm slot when
 * there is one). Without a parent (an anchor, fetched whole) the slot is
 * the store's spare, else the warm slot, else a new one: a node taking
 * anchors in turn writes into pages made once. On failure *slot may be
 * set (the caller frees it with the rest). */
int delta__copy_start(struct delta_state *d, uint64_t version, size_t len,
		      const struct node_slot *parent, struct node_slot **slot,
		      struct node_rebuild **rb, struct proto_err *err)
{
	int rc = 0;

	/* A copy fills the slot whole through its memfd: a new one's pages
	 * are allocated by the copy, not cleared first. */
	if (parent != NULL && (*slot = warm_take(d, parent, version, len)) == NULL)
		rc = node_slot_new_blank(d->o.x->o.store, version, len, slot, err);
	else if (parent == NULL && node_slot_take_spare(d->o.x->o.store, version, len, slot) != 0 &&
		 (*slot = warm_take(d, NULL, version, len)) == NULL)
		rc = node_slot_new(d->o.x->o.store, version, len, slot, err);
	if (rc != 0 || parent == NULL)
		return rc;
	rc = node_rebuild_start(d->o.x->o.base, (*slot)->host, (*slot)->memfd, (*slot)->fresh,
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
int delta__rotate_start(struct delta_state *d, uint64_t version, size_t len,
			struct node_slot **slot, struct node_rebuild **rb,
			struct delta_rotation **rot, bool *retry, struct proto_err *err)
{
	struct delta_rotation *r = d->rot;

	*retry = false;
	if (r == NULL || delta_active(d) == NULL || delta_active(d)->version != r->version ||
	    d->o.install_inplace || proto_param(PROTO_PARAM_DELTA_ROTATE) == 0 ||
	    sodium_memcmp(r->plan_src, d->o.plan_src, PROTO_HASH_BYTES) != 0)
		return -ENOENT;
	if (rotation_pieces(d, r) != 0)
		return -ENOENT;
	if (node_slot_reuse(d->o.x->o.store, r->tag, version, len, slot) != 0) {
		uint32_t pins = node_attach_pins(d->o.attach, r->parent_version);
		*retry = pins == 0;
		if (pins > 0)
			LOG_INFO("node %s: the slot of v%" PRIu64 " is pinned by %u request%s: no "
				 "rotation, v%" PRIu64 " is copied whole",
				 d->o.x->o.id, r->parent_version, pins, pins == 1 ? "" : "s", r->version);
		else
			LOG_DEBUG("node %s: the slot of v%" PRIu64 " is not back in the store yet",
				  d->o.x->o.id, r->parent_version);
		return -ENOENT;
	}
	r->slot = *slot;
	/* The share the scrub after this activation takes, of the slot that
	 * will hold the active version. */
	const struct delta_sums *kept = delta__active_sums(d);
	uint32_t k = (uint32_t)proto_param(PROTO_PARAM_DELTA_SCRUB);
	free(r->scrub.items);
	memset(&r->scrub, 0, sizeof(r->scrub));
	if (kept != NULL && k > 0 && len > 0)
		(void)delta__scrub_plan(kept, (uint32_t)((d->scrub_round + k - 1) % k), k, len, &r->scrub);
	(*slot)->fresh = false; /* the catch-up writes most pages, the apply the rest */
	if (node_rebuild_start_sparse(d->o.x->o.base, (*slot)->host, (*slot)->memfd, delta_active(d)->host,
				      delta_active(d)->memfd, len, catch_up, r, rb, err) != 0) {
		node_slot_free(d->o.x->o.store, *slot);
		*slot = NULL;
		return -ENOMEM;
	}
	d->rot = NULL;
	*rot = r;
	return 0;
}

/* Stops and frees the standby copy (its slot may become the store's spare). */
void delta__standby_drop(struct delta_state *d)
{
	delta__rotation_stop(d->standby_rot);
	node_rebuild_free(d->standby_rb);
	d->standby_rb = NULL;
	delta__rotation_free(d->standby_rot);
	d->standby_rot = NULL;
	if (d->standby != NULL)
		node_slot_free(d->o.x->o.store, d->standby);
	d->standby = NULL;
}

/* How long on_standby waits for the retired slot to come back. */
#define STANDBY_RETRY_MS 50u
#define STANDBY_TRIES 40u

/* The longest the standby waits for peers to stop reading. */
#define STANDBY_DEFER_MAX_MS 60000u

/* Whether peers are still reading from this node, so that the standby
 * waits (armed again, true). Reads are one-sided: the node sees none, but
 * its fabric loop is woken by its wait fd for each request it serves, and
 * between versions nothing of its own is in flight. So the standby waits
 * until a whole TESSERA_DELTA_STANDBY_QUIET_MS went by with no such
 * wake-up, looking every quiet/STANDBY_LOOKS ms, at most
 * STANDBY_DEFER_MAX_MS: in a fanout the replicas that finish first serve
 * the last ones, and a copy of the slot took the CPU those waited on. A
 * delta that comes meanwhile makes its own copy (delta_slot). */
#define STANDBY_LOOKS 4u
static bool standby_wait(struct delta_state *d)
{
	uint64_t quiet = proto_param(PROTO_PARAM_DELTA_STANDBY_QUIET_MS), now = node_now_ms();
	struct node_fabloop_counts c = {0};

	if (quiet == 0)
		return false;
	if (d->o.x->o.fl != NULL)
		node_fabloop_counts(d->o.x->o.fl, &c);
	bool busy = c.fd_polls != d->standby_fd_polls;
	if (d->standby_test_busy > 0) { /* test only */
		d->standby_test_busy--;
		busy = true;
	}
	d->standby_fd_polls = c.fd_polls;
	if (busy)
		d->standby_read_ms = now;
	else if (d->standby_defer_ms == 0 || now - d->standby_read_ms >= quiet)
		return false; /* no read since the activation, or none for a quiet period */
	if (d->standby_defer_ms == 0) {
		d->standby_defer_ms = now;
		LOG_INFO("node %s: peers are reading from this node: the standby copy of v%" PRIu64
			 " waits until they stop (%" PRIu64 " ms without a read)",
			 d->o.x->o.id, delta_active(d)->version, quiet);
	}
	if (now - d->standby_defer_ms >= STANDBY_DEFER_MAX_MS) {
		LOG_INFO("node %s: peers still read from this node after %u ms: the standby copy of v%"
			 PRIu64 " is made all the same", d->o.x->o.id, STANDBY_DEFER_MAX_MS,
			 delta_active(d)->version);
		d->standby_defer_ms = 0; /* said: on_standby does not say it went ahead */
		return false;
	}
	node_arm(d->standby_ev, PROTO_MAX(quiet / STANDBY_LOOKS, 1));
	return true;
}

/* Between versions: a standby slot is made to hold the active version on
 * a worker, by rotation or else a copy, so that a delta against it, when it
 * comes, is only applied. A fetch that began first made its own slot:
 * nothing to do then. */
static void on_standby(evutil_socket_t fd, short what, void *arg)
{
	struct delta_state *d = arg;
	size_t len = fetch_rank_bytes(d->o.x);
	struct proto_err err = {{0}};
	bool retry;

	(void)fd;
	(void)what;
	if (d->o.x->f != NULL || delta_active(d) == NULL || d->standby != NULL ||
	    delta_active(d)->len != len)
		return;
	if (d->standby_tries == 0 && standby_wait(d))
		return;
	if (d->standby_defer_ms != 0 && d->standby_tries == 0)
		LOG_INFO("node %s: no peer read from this node for %" PRIu64 " ms: the standby copy of v%"
			 PRIu64 " goes ahead, %" PRIu64 " ms after it began waiting",
			 d->o.x->o.id, proto_param(PROTO_PARAM_DELTA_STANDBY_QUIET_MS),
			 delta_active(d)->version, node_now_ms() - d->standby_defer_ms);
	fetch_wires_ready(d->o.x, d->o.plan);
	uint64_t was = d->rot != NULL ? d->rot->parent_version : 0;
	int rc = delta__rotate_start(d, delta_active(d)->version + 1, len, &d->standby, &d->standby_rb,
			      &d->standby_rot, &retry, &err);
	if (rc == 0) {
		LOG_INFO("node %s: the slot of v%" PRIu64 " made v%" PRIu64 " by its delta for the next "
			 "delta (a rotation: no dense copy)",
			 d->o.x->o.id, was, delta_active(d)->version);
		return;
	}
	/* The retired slot is on its way back (ATTACH_FREE_GRACE_MS): wait for
	 * it, a bounded while. */
	if (rc == -ENOENT && retry && d->standby_tries++ < STANDBY_TRIES) {
		node_arm(d->standby_ev, STANDBY_RETRY_MS);
		return;
	}
	if (rc == -ENOENT && retry)
		LOG_INFO("node %s: the slot of v%" PRIu64 " did not come back in %u ms: no rotation",
			 d->o.x->o.id, was, STANDBY_TRIES * STANDBY_RETRY_MS);
	if (rc == -ENOENT)
		rc = delta__copy_start(d, delta_active(d)->version + 1, len, delta_active(d), &d->standby,
				&d->standby_rb, &err);
	if (rc != 0) {
		LOG_WARN("node %s: no standby copy of v%" PRIu64 " (%s); a delta will copy it then",
			 d->o.x->o.id, delta_active(d)->version, err.msg);
		delta__standby_drop(d);
		return;
	}
	LOG_INFO("node %s: copying v%" PRIu64 " into a standby slot for the next delta", d->o.x->o.id,
		 delta_active(d)->version);
}

/* f's delta becomes the next rotation's catch-up, when it was applied to
 * old (the active slot then, retired now) and old is activated content. */
void delta__keep_rotation(struct delta_state *d, struct delta_build *b, struct node_slot *old)
{
	struct fetch *f = b->f;

	delta__rotation_free(d->rot);
	d->rot = NULL;
	if (!f->delta || !b->rotatable || old == NULL || old == delta_active(d) || old->tag == 0 ||
	    d->o.install_inplace)
		return;
	struct delta_rotation *r = calloc(1, sizeof(*r));
	if (r == NULL || (r->parcels = calloc(f->nparcels + 1, sizeof(*r->parcels))) == NULL) {
		free(r);
		return; /* the next delta copies */
	}
	r->x = d->o.x;
	r->tag = old->tag;
	r->parent_version = old->version;
	r->version = f->version;
	memcpy(r->plan_src, d->o.plan_src, PROTO_HASH_BYTES);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		struct delta_rot_parcel *rp = &r->parcels[r->nparcels++];
		rp->src_rank = p->mp->src_rank;
		rp->dst_rank = p->mp->dst_rank;
		rp->len = p->mp->wire_bytes;
		rp->wire = p->wire; /* the fetch's no more */
		p->wire = NULL;
		if (rp->wire == NULL) {
			delta__rotation_free(r);
			return;
		}
	}
	d->rot = r;
}


/* After an activation: the next standby is made TESSERA_DELTA_STANDBY_MS
 * later, once no peer has read from this node for a quiet period. */
void delta__standby_arm(struct delta_state *d)
{
	struct node_fabloop_counts c = {0};

	d->standby_defer_ms = 0;
	d->standby_test_busy = proto_param(PROTO_PARAM_TEST_STANDBY_BUSY);
	if (d->o.install_inplace)
		return; /* memory-tight: no second copy of the rank */
	if (d->o.x->o.fl != NULL)
		node_fabloop_counts(d->o.x->o.fl, &c);
	d->standby_fd_polls = c.fd_polls; /* peers' reads are counted from here */
	d->standby_read_ms = node_now_ms(); /* as if one read came now */
	if (d->standby_ev == NULL)
		d->standby_ev = evtimer_new(d->o.x->o.base, on_standby, d);
	if (d->standby_ev != NULL)
		node_arm(d->standby_ev, proto_param(PROTO_PARAM_DELTA_STANDBY_MS));
}
