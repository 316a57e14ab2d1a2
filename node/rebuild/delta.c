/* A delta version's build: its slot (from the standby, a rotation or a
 * copy), the apply of its parcels on the worker as they land, and what
 * the activation keeps of it for the next one. */
#include "node/rebuild/internal.h"

#include <errno.h>

#include "node/fetch/verifier.h"

/* On the rebuild's worker: parcel i's delta applied to the new slot, each
 * piece's checksum checked, its child checksums kept in b->csums. */
static int apply_parcel(struct delta_build *b, uint32_t i, unsigned threads,
			struct proto_err *err)
{
	struct fetch *f = b->f;
	const struct delta_state *d = b->d;
	struct fetch_parcel *p = &f->parcels[i];
	struct proto_dparcel dp;

	if (b->test_corrupt && p->mp->wire_bytes > 0) { /* test only */
		p->wire[p->mp->wire_bytes / 2] ^= 0x40;
		b->test_corrupt = false;
	}
	struct proto_err e;
	int rc = proto_dparcel_build(d->o.model, f->plan, p->pp, d->o.x->o.layout, &dp, &e);
	if (rc == 0) {
		const uint64_t *ps = delta__sums_find(b->psums, p->mp->src_rank, p->mp->dst_rank, &dp);
		struct delta_psums *cs = b->csums != NULL ? &b->csums->p[i] : NULL;
		if (cs != NULL) {
			cs->src_rank = p->mp->src_rank;
			cs->dst_rank = p->mp->dst_rank;
			cs->npieces = dp.npieces;
			cs->sums = malloc(((size_t)dp.npieces + 1) * sizeof(*cs->sums));
			cs->pieces = malloc(((size_t)dp.npieces + 1) * sizeof(*cs->pieces));
			if (cs->pieces != NULL)
				memcpy(cs->pieces, dp.pieces, dp.npieces * sizeof(*dp.pieces));
		}
		rc = proto_dparcel_apply_known(&dp, p->wire, p->mp->wire_bytes, f->slot->host, ps,
					       cs != NULL ? cs->sums : NULL, threads, &e);
		if (rc == -ENOTSUP) /* no touched checksums: the parent's from the slot */
			rc = proto_dparcel_apply_known(&dp, p->wire, p->mp->wire_bytes, f->slot->host,
						       NULL, cs != NULL ? cs->sums : NULL, threads,
						       &e);
		else if (rc == 0 && ps != NULL && b->csums != NULL)
			b->csums->known++;
		if (cs != NULL && (cs->sums == NULL || cs->pieces == NULL)) {
			delta__sums_free(b->csums); /* out of memory: none kept */
			b->csums = NULL;
		}
		proto_dparcel_fini(&dp);
	}
	if (rc != 0)
		return proto_errf(err, -rc, "delta parcel %u<-%u does not rebuild v%" PRIu64
				  " from v%" PRIu64 ": %s",
				  p->mp->dst_rank, p->mp->src_rank, f->version, f->man.parent_version,
				  e.msg);
	return 0;
}

/*
 * On the rebuild's worker, after the copy: every parcel's delta applied,
 * each as soon as its bytes are whole (delta_landed), so that the
 * parcels that land first are applied while the others arrive and only
 * what landed last is left after the last chunk. Parcels write disjoint
 * pieces of the slot: their order does not matter. It reads only what the
 * loop leaves alone while the fetch lives (the model, plan and layout, the
 * parcels' manifest entries and landed wire bytes, the slot).
 */
static int apply_all(void *arg, struct proto_err *err)
{
	struct delta_build *b = arg;
	struct fetch *f = b->f;
	unsigned threads = node_verifier_threads();
	uint8_t *done = calloc((size_t)f->nparcels + 1, 1);
	uint32_t ndone = 0;
	int rc = 0;

	if (done == NULL)
		return proto_errf(err, ENOMEM, "delta apply: out of memory");
	/* A rerun after a dense copy starts over. */
	delta__sums_free(b->csums);
	b->csums = delta__sums_new(f->nparcels); /* NULL: the child's are not kept */
	while (rc == 0 && ndone < f->nparcels) {
		uint64_t seen = node_rebuild_fed(b->rebuild); /* before looking */
		uint32_t took = 0;
		for (uint32_t i = 0; rc == 0 && i < f->nparcels; i++) {
			if (done[i] || !__atomic_load_n(&f->parcels[i].landed, __ATOMIC_ACQUIRE))
				continue;
			rc = apply_parcel(b, i, threads, err);
			done[i] = 1;
			ndone++;
			took++;
		}
		if (rc == 0 && took == 0 && !node_rebuild_wait_fed(b->rebuild, seen))
			rc = proto_errf(err, ECANCELED, "delta apply: stopped");
	}
	free(done);
	return rc;
}

/* Back on the loop: the slot holds the new version, or the fetch is refused. */
static void rebuilt(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		    void *arg)
{
	struct delta_build *b = arg;
	struct delta_state *d = b->d;
	struct fetch *f = b->f;
	char how[600];

	if (rc != 0) {
		b->done(b->done_arg, rc, err->msg);
		return;
	}
	/* The wire bytes stay: the next delta's rotation re-applies them. */
	b->rebuild_ms = node_now_ms() - b->rebuild_ms;
	uint32_t known = 0;
	if (b->csums != NULL) {
		memcpy(b->csums->digest, f->man.digest, PROTO_HASH_BYTES);
		memcpy(b->csums->plan_src, d->o.plan_src, PROTO_HASH_BYTES);
		b->csums->complete = true;
		known = b->csums->known;
	}
	proto_metrics_add(d->o.x->o.am->m, d->o.x->o.am->delta_versions, 1);
	proto_metrics_add(d->o.x->o.am->m,
			  t->dense ? d->o.x->o.am->delta_copies : d->o.x->o.am->delta_rotations, 1);
	if (b->rot != NULL && !t->dense)
		snprintf(how, sizeof(how), "no dense copy: the slot of v%" PRIu64 " made v%" PRIu64
			 " again by its delta%s in %" PRIu64 " ms",
			 b->rot->parent_version, b->rot->version,
			 b->from_standby ? " (the standby one)" : "", t->catchup_ms);
	else if (b->rot != NULL)
		snprintf(how, sizeof(how), "a dense copy: the slot of v%" PRIu64 " was not v%" PRIu64
			 " after its delta (%s), so v%" PRIu64 " was copied whole%s",
			 b->rot->parent_version, b->rot->version, t->fallback, b->rot->version,
			 b->from_standby ? " (the standby one)" : "");
	else
		snprintf(how, sizeof(how), "a dense copy of the parent%s",
			 b->from_standby ? " (the standby one)" : "");
	LOG_INFO("node %s: v%" PRIu64 " rebuilt from v%" PRIu64 " by delta (%" PRIu64
		 " wire bytes for %" PRIu64 " bytes, every piece's checksum verified, %" PRIu64
		 " ms after the last chunk; %s; the parent took %" PRIu64 " ms, %" PRIu64
		 " ms of it after the apply was handed over; the apply %" PRIu64 " ms (%" PRIu64
		 " ms of CPU, %" PRIu64 " page faults), from %u of %u parcels landed before the "
		 "last chunk; parent checksums %s)",
		 d->o.x->o.id, f->version, f->man.parent_version, f->bytes_total, f->slot->len,
		 b->rebuild_ms, how, t->copy_ms, t->wait_ms, t->apply_ms, t->apply_cpu_ms,
		 t->apply_faults, b->fed_early, f->nparcels,
		 known == f->nparcels && known > 0 ? "kept (sparse: only changed positions read)"
		 : known > 0 ? "kept for some parcels, read from the slot for the others"
			     : "read from the slot");
	if (b->rot != NULL && !t->dense && __atomic_load_n(&b->rot->scrub_cut, __ATOMIC_RELAXED) &&
	    b->rot->scrub.nitems > 0) {
		/* The share it skipped is the one the last activation's scrub
		 * took: the scrub after this activation takes it again. */
		LOG_INFO("node %s: the scrub of share %u/%u of the slot of v%" PRIu64 " gave way to "
			 "v%" PRIu64 "'s apply: it is re-summed after the activation",
			 d->o.x->o.id, b->rot->scrub.share + 1, b->rot->scrub.k, b->rot->version,
			 f->version);
		if (d->scrub_round > 0)
			d->scrub_round--;
	}
	delta__rotation_free(b->rot); /* the worker is done with it */
	b->rot = NULL;
	b->done(b->done_arg, 0, NULL);
}

/* Hands the apply to the worker, which takes each parcel as it lands: 0,
 * or -ENOENT when the parent is no longer the delta's (nothing started). */
static int apply_begin(struct delta_state *d, struct delta_build *b,
		       const struct node_slot *parent, const uint8_t *digest)
{
	struct fetch *f = b->f;

	/* The parent may have changed since the fetch began only through an
	 * activation, which needs this fetch: check anyway, cheaply. */
	if (parent == NULL || parent->version != f->man.parent_version ||
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0)
		return -ENOENT;
	b->d = d;
	b->rotatable = parent == delta_active(d);
	/* The slot holds a copy of the active one, or the retired one caught
	 * up to it: the active slot's kept checksums are its parent's. */
	delta__sums_free(b->psums);
	b->psums = NULL;
	const struct delta_sums *kept = parent == delta_active(d) ? delta__active_sums(d) : NULL;
	if (kept != NULL)
		b->psums = delta__sums_dup(kept);
	b->test_corrupt = b->chained && proto_param(PROTO_PARAM_TEST_CORRUPT_CHAIN) == f->version;
	for (uint32_t i = 0; i < f->nparcels; i++) /* nothing to wait for */
		if (f->parcels[i].mp->nchunks == 0)
			__atomic_store_n(&f->parcels[i].landed, 1, __ATOMIC_RELEASE);
	b->applying = true;
	delta__rotation_stop(b->rot); /* the catch-up's scrub must not hold the apply up */
	node_rebuild_apply(b->rebuild, apply_all, b, rebuilt, b);
	return 0;
}

void delta_landed(struct delta_state *d, struct delta_build *b, uint32_t pi,
		  const struct node_slot *parent, const uint8_t *digest)
{
	struct fetch *f = b->f;

	if (f == NULL || !f->delta || b->rebuild == NULL || f->slot == NULL ||
	    (d->o.install_inplace && delta_active(d) != NULL) || pi >= f->nparcels ||
	    (!b->applying && apply_begin(d, b, parent, digest) != 0))
		return; /* delta_rebuild checks and says why */
	__atomic_store_n(&f->parcels[pi].landed, 1, __ATOMIC_RELEASE);
	b->fed_early++;
	node_rebuild_feed(b->rebuild);
}

int delta_rebuild(struct delta_state *d, struct delta_build *b, const struct node_slot *parent,
		  const uint8_t *digest)
{
	struct fetch *f = b->f;

	b->rebuild_ms = node_now_ms();
	if (!b->applying && apply_begin(d, b, parent, digest) != 0)
		return -ENOENT;
	for (uint32_t i = 0; i < f->nparcels; i++)
		__atomic_store_n(&f->parcels[i].landed, 1, __ATOMIC_RELEASE);
	node_rebuild_feed(b->rebuild);
	return 0;
}

void delta_activated(struct delta_state *d, struct delta_build *b, struct node_slot *old)
{
	delta__standby_drop(d);
	delta__keep_rotation(d, b, old);
	delta_active(d)->tag = ++d->slot_tags;
	d->standby_tries = 0;
	delta__sums_activated(d, b, old);
	delta__standby_arm(d);
}

void delta_build_fini(struct delta_build *b)
{
	/* No worker may still be copying or applying into the fetch's slot. */
	delta__rotation_stop(b->rot);
	node_rebuild_free(b->rebuild);
	b->rebuild = NULL;
	delta__rotation_free(b->rot);
	b->rot = NULL;
	delta__sums_free(b->psums);
	delta__sums_free(b->csums);
	b->psums = b->csums = NULL;
}

void delta_init(struct delta_state *d, const struct delta_opts *o)
{
	d->o = *o;
}

void delta_fini(struct delta_state *d)
{
	delta__scrub_stop(d);
	delta__sums_free(d->sums);
	d->sums = NULL;
	delta__standby_drop(d);
	delta__rotation_free(d->rot);
	d->rot = NULL;
	delta__warm_stop(d);
	if (d->warm != NULL)
		node_slot_free(d->o.x->o.store, d->warm);
	d->warm = NULL;
	if (d->standby_ev != NULL)
		event_free(d->standby_ev);
	d->standby_ev = NULL;
}

int delta_slot(struct delta_state *d, struct delta_build *b, struct node_slot *chain,
	       struct proto_err *err)
{
	struct fetch *f = b->f;
	size_t len = fetch_rank_bytes(d->o.x);
	bool retry;

	b->d = d;
	if (d->standby != NULL && d->standby->len == len && !(f->delta && chain != NULL)) {
		/* The standby holds the active slot's bytes, or will: a delta's
		 * exact parent (checked before); for anything else it is only
		 * memory, which the fetch overwrites whole. */
		f->slot = d->standby;
		f->slot->version = f->version;
		d->standby = NULL;
		if (f->delta) {
			b->rebuild = d->standby_rb;
			b->rot = d->standby_rot;
			b->from_standby = true;
		} else {
			delta__rotation_stop(d->standby_rot);
			node_rebuild_free(d->standby_rb);
			delta__rotation_free(d->standby_rot);
		}
		d->standby_rb = NULL;
		d->standby_rot = NULL;
		return 0;
	}
	/* A chain's delta builds on the step before, not on the active slot. */
	struct node_slot *parent = chain != NULL ? chain : delta_active(d);
	delta__standby_drop(d);
	int rc = -ENOENT;
	if (f->delta && chain == NULL)
		rc = delta__rotate_start(d, f->version, len, &f->slot, &b->rebuild, &b->rot, &retry,
					 err);
	if (rc == -ENOENT) /* no rotation: a delta's parent is copied whole */
		rc = delta__copy_start(d, f->version, len, f->delta ? parent : NULL, &f->slot,
				       &b->rebuild, err);
	return rc;
}
