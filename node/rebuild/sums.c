/* Piece checksums: those of the served slot, kept from the apply that built
 * it (or summed on a worker after an anchor), and the scrub that re-sums a
 * share of the slot between versions (NOTES.md, "Piece checksums"). */
#include "node/rebuild/internal.h"

#include <errno.h>
#include <unistd.h>

#include "node/fetch/verifier.h"

/* The node keeps, for its active slot, the child checksums the apply that
 * built it verified, bound to the slot by its activation tag and to the
 * version by its manifest digest: the next delta built from that slot
 * takes them as its parent's and reads only its changed positions. After
 * an anchor, a whole fetch or an in-place install they are summed on a
 * worker once the version is active (sums_learn). NOTES.md. */
void delta__sums_free(struct delta_sums *s)
{
	if (s == NULL)
		return;
	for (uint32_t i = 0; i < s->nparcels; i++) {
		free(s->p[i].sums);
		free(s->p[i].pieces);
	}
	free(s->p);
	free(s);
}

struct delta_sums *delta__sums_new(uint32_t nparcels)
{
	struct delta_sums *s = calloc(1, sizeof(*s));

	if (s != NULL && (s->p = calloc(nparcels + 1, sizeof(*s->p))) == NULL) {
		free(s);
		return NULL;
	}
	if (s != NULL)
		s->nparcels = nparcels;
	return s;
}

/* A copy of s, for a worker to read while the loop keeps s; NULL when out
 * of memory (the apply then reads the sums from the slot). */
struct delta_sums *delta__sums_dup(const struct delta_sums *s)
{
	struct delta_sums *d = delta__sums_new(s->nparcels);

	if (d == NULL)
		return NULL;
	memcpy(d->digest, s->digest, PROTO_HASH_BYTES);
	memcpy(d->plan_src, s->plan_src, PROTO_HASH_BYTES);
	d->tag = s->tag;
	d->complete = s->complete;
	for (uint32_t i = 0; i < s->nparcels; i++) {
		const struct delta_psums *ps = &s->p[i];
		struct delta_psums *pd = &d->p[i];
		*pd = (struct delta_psums){ps->src_rank, ps->dst_rank, ps->npieces, NULL, NULL};
		pd->sums = malloc(((size_t)ps->npieces + 1) * sizeof(*pd->sums));
		pd->pieces = malloc(((size_t)ps->npieces + 1) * sizeof(*pd->pieces));
		if (pd->sums == NULL || pd->pieces == NULL) {
			delta__sums_free(d);
			return NULL;
		}
		memcpy(pd->sums, ps->sums, ps->npieces * sizeof(*pd->sums));
		memcpy(pd->pieces, ps->pieces, ps->npieces * sizeof(*pd->pieces));
	}
	return d;
}

/* The parent checksums s keeps for parcel src->dst cut into dp's pieces, or
 * NULL (none kept, or cut otherwise). */
const uint64_t *delta__sums_find(const struct delta_sums *s, uint32_t src, uint32_t dst,
				 const struct proto_dparcel *dp)
{
	for (uint32_t i = 0; s != NULL && i < s->nparcels; i++) {
		const struct delta_psums *ps = &s->p[i];
		if (ps->src_rank != src || ps->dst_rank != dst)
			continue;
		if (ps->npieces != dp->npieces)
			return NULL;
		/* Field by field: a piece's tail padding is not part of it. */
		for (uint32_t k = 0; k < dp->npieces; k++) {
			const struct proto_dpiece *x = &ps->pieces[k], *y = &dp->pieces[k];
			if (x->pay_off != y->pay_off || x->dst_off != y->dst_off || x->len != y->len ||
			    x->elsize != y->elsize)
				return NULL;
		}
		return ps->sums;
	}
	return NULL;
}

/* The active slot's kept checksums, when they are bound to it: its tag,
 * the version's digest and the current plan. */
const struct delta_sums *delta__active_sums(const struct delta_state *d)
{
	const struct delta_sums *s = d->sums;

	if (s == NULL || !s->complete || delta_active(d) == NULL || delta_active(d)->tag == 0 ||
	    s->tag != delta_active(d)->tag ||
	    sodium_memcmp(s->digest, d->o.active_digest, PROTO_HASH_BYTES) != 0 ||
	    sodium_memcmp(s->plan_src, d->o.plan_src, PROTO_HASH_BYTES) != 0)
		return NULL;
	return s;
}

/* The scrub: a sparse apply cannot see a byte of its parent damaged where
 * the delta does not write, so a worker re-sums the pieces that start in a
 * rotating 1/K of the rank's block (TESSERA_DELTA_SCRUB), never on a
 * version's way to activation: the active slot after each activation, the
 * retired slot after its rotation's catch-up. A mismatch in the active
 * slot drops its checksums and clears its tag: it is never rotated into,
 * and the next delta reads its parent's checksums from the bytes it is
 * built on (NOTES.md). */
/* The pieces of s that start in share `share` of K of a block of len
 * bytes; 0, or -ENOMEM (nothing to free). */
int delta__scrub_plan(const struct delta_sums *s, uint32_t share, uint32_t k, size_t len,
		      struct scrub_plan *sp)
{
	uint32_t n = 0;

	memset(sp, 0, sizeof(*sp));
	for (uint32_t i = 0; i < s->nparcels; i++)
		n += s->p[i].npieces;
	if ((sp->items = calloc(n + 1, sizeof(*sp->items))) == NULL)
		return -ENOMEM;
	sp->share = share;
	sp->k = k;
	for (uint32_t i = 0; i < s->nparcels; i++)
		for (uint32_t q = 0; q < s->p[i].npieces; q++) {
			const struct proto_dpiece *pc = &s->p[i].pieces[q];
			if (pc->dst_off + pc->len > len ||
			    (uint32_t)((unsigned __int128)pc->dst_off * k / len) != share)
				continue;
			sp->items[sp->nitems++] = (struct scrub_item){
				pc->dst_off, pc->len, s->p[i].sums[q], pc->elsize,
				s->p[i].src_rank, s->p[i].dst_rank, q};
			sp->bytes += pc->len;
		}
	return 0;
}

/* The checksum of the len bytes at off of a slot (elements of elsize),
 * read through its memfd when it has one (pread into a small buffer that
 * is reused: a slot filled through its memfd has no page mapped here yet,
 * and a first touch through the mapping costs a fault each), else through
 * host. scratch: SUM_BUF bytes, or NULL (host only). NOTES.md. */
#define SUM_BUF (1u << 20) /* a multiple of every element size */

static uint64_t slot_wsum(int fd, const uint8_t *host, uint8_t *scratch, uint64_t off,
			  uint64_t len, uint32_t elsize)
{
	uint64_t sum = 0, done = 0;

	while (fd >= 0 && scratch != NULL && done < len) {
		size_t n = len - done < SUM_BUF ? (size_t)(len - done) : SUM_BUF;
		ssize_t got = pread(fd, scratch, n, (off_t)(off + done));
		if (got <= 0 || (size_t)got % elsize != 0)
			break; /* the rest through the mapping */
		sum = proto_wsum_combine(sum, done / elsize,
					 proto_wsum(elsize, scratch, (uint64_t)got / elsize));
		done += (uint64_t)got;
	}
	if (done < len)
		sum = proto_wsum_combine(sum, done / elsize,
					 proto_wsum(elsize, host + off + done, (len - done) / elsize));
	return sum;
}

/* Re-sums sp's pieces of host (fd: its memfd, or -1): 0, or -EIO with err
 * naming the first that differs (of version v); -EINTR (err unset) when
 * *stop was set before the last piece. */
int delta__scrub_check(const struct scrub_plan *sp, const uint8_t *host, int fd, uint64_t v,
		       const int *stop, struct proto_err *err)
{
	uint8_t *scratch = fd >= 0 && sp->nitems > 0 ? malloc(SUM_BUF) : NULL;

	for (uint32_t i = 0; i < sp->nitems; i++) {
		if (stop != NULL && __atomic_load_n(stop, __ATOMIC_RELAXED)) {
			free(scratch);
			return -EINTR;
		}
		const struct scrub_item *it = &sp->items[i];
		uint64_t got = slot_wsum(fd, host, scratch, it->off, it->len, it->elsize);
		if (got != it->sum) {
			free(scratch);
			return proto_errf(err, EIO, "scrub: the slot of v%" PRIu64 " is damaged: piece "
					  "%u of parcel %u<-%u (bytes %" PRIu64 "..%" PRIu64 ") sums to "
					  "%016" PRIx64 ", not %016" PRIx64,
					  v, it->piece, it->dst_rank, it->src_rank, it->off,
					  it->off + it->len, got, it->sum);
		}
	}
	free(scratch);
	return 0;
}

void delta__scrub_stop(struct delta_state *d)
{
	if (d->scrub != NULL)
		__atomic_store_n(&d->scrub->stop, 1, __ATOMIC_RELAXED);
	node_rebuild_free(d->scrub_rb);
	d->scrub_rb = NULL;
	if (d->scrub != NULL) {
		free(d->scrub->plan.items);
		delta__sums_free(d->scrub->learn);
	}
	free(d->scrub);
	d->scrub = NULL;
}

/* On the scrub's worker: reads only sc and the slot. */
static int scrub_run(void *arg, struct proto_err *err)
{
	struct delta_scrub *sc = arg;

	(void)err;
	/* After an anchor or a whole fetch: the first delta's apply finds its
	 * workers made (proto_delta_apply_warm), as every later one does. */
	if (sc->learn != NULL)
		(void)proto_delta_apply_warm(node_verifier_threads());
	uint8_t *scratch = sc->learn != NULL && sc->fd >= 0 ? malloc(SUM_BUF) : NULL;
	for (uint32_t i = 0; sc->learn != NULL && i < sc->learn->nparcels; i++) {
		struct delta_psums *ps = &sc->learn->p[i];
		for (uint32_t q = 0; q < ps->npieces && !__atomic_load_n(&sc->stop, __ATOMIC_RELAXED);
		     q++)
			ps->sums[q] = slot_wsum(sc->fd, sc->host, scratch, ps->pieces[q].dst_off,
						ps->pieces[q].len, ps->pieces[q].elsize);
	}
	free(scratch);
	if (sc->learn == NULL)
		sc->rc = delta__scrub_check(&sc->plan, sc->host, sc->fd, sc->version, &sc->stop, &sc->err);
	if (sc->rc == -EINTR) /* stopped: scrub_stop frees it, no callback */
		sc->rc = 0;
	return 0;
}

static void scrubbed(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		     void *arg)
{
	struct delta_state *d = arg;
	struct delta_scrub *sc = d->scrub;

	(void)rc;
	(void)err;
	(void)t;
	if (sc->learn != NULL) {
		/* Summed from bytes every chunk hash verified, bound to the slot
		 * the same way as an apply's. */
		if (delta_active(d) != NULL && delta_active(d)->tag == sc->tag && d->sums == NULL) {
			d->sums = sc->learn;
			sc->learn = NULL;
			d->sums->tag = sc->tag;
			d->sums->complete = true;
			LOG_DEBUG("node %s: the piece checksums of v%" PRIu64 "'s slot summed in %" PRIu64
				  " ms, off the next delta's way", d->o.x->o.id, sc->version,
				  node_now_ms() - sc->learn_ms);
		}
	} else if (sc->rc == 0) {
		LOG_DEBUG("node %s: scrub of v%" PRIu64 ": share %u/%u, %u pieces, %" PRIu64
			  " bytes match their checksums",
			  d->o.x->o.id, sc->version, sc->plan.share + 1, sc->plan.k, sc->plan.nitems,
			  sc->plan.bytes);
	} else if (delta_active(d) != NULL && delta_active(d)->tag == sc->tag) {
		LOG_WARN("node %s: %s; its checksums are dropped, the next delta reads its parent "
			 "whole", d->o.x->o.id, sc->err.msg);
		delta_active(d)->tag = 0;
		delta__sums_free(d->sums);
		d->sums = NULL;
	}
	delta__scrub_stop(d); /* joins the worker, which is done */
}

/* After an activation without kept checksums (an anchor, a whole fetch):
 * sums every piece of f's parcels in the active slot on a worker, so that
 * the first delta after it need not read its parent whole. Nothing when a
 * piece cannot be placed (the next delta reads the slot then). */
static void sums_learn(struct delta_state *d, const struct fetch *f)
{
	struct delta_scrub *sc = calloc(1, sizeof(*sc));
	struct proto_err err;

	if (sc == NULL || (sc->learn = delta__sums_new(f->nparcels)) == NULL)
		goto fail;
	for (uint32_t i = 0; i < f->nparcels; i++) {
		const struct fetch_parcel *p = &f->parcels[i];
		struct delta_psums *ps = &sc->learn->p[i];
		struct proto_dparcel dp;
		/* Only the agent's own plan's parcels (a version taken whole
		 * from another layout's holders is not cut like a delta). */
		if (f->full || f->plan != d->o.plan || p->pp == NULL || p->pp < d->o.plan->parcels ||
		    p->pp >= d->o.plan->parcels + d->o.plan->nparcels ||
		    proto_dparcel_build(d->o.model, f->plan, p->pp, d->o.x->o.layout, &dp, &err) != 0)
			goto fail;
		*ps = (struct delta_psums){p->mp->src_rank, p->mp->dst_rank, dp.npieces, NULL, NULL};
		ps->sums = calloc((size_t)dp.npieces + 1, sizeof(*ps->sums));
		ps->pieces = malloc(((size_t)dp.npieces + 1) * sizeof(*ps->pieces));
		bool fits = true;
		for (uint32_t q = 0; q < dp.npieces; q++)
			fits &= dp.pieces[q].dst_off + dp.pieces[q].len <= delta_active(d)->len;
		if (ps->pieces != NULL)
			memcpy(ps->pieces, dp.pieces, dp.npieces * sizeof(*dp.pieces));
		proto_dparcel_fini(&dp);
		if (ps->sums == NULL || ps->pieces == NULL || !fits)
			goto fail;
	}
	memcpy(sc->learn->digest, d->o.active_digest, PROTO_HASH_BYTES);
	memcpy(sc->learn->plan_src, d->o.plan_src, PROTO_HASH_BYTES);
	sc->host = delta_active(d)->host;
	sc->fd = delta_active(d)->memfd;
	sc->tag = delta_active(d)->tag;
	sc->version = delta_active(d)->version;
	sc->learn_ms = node_now_ms();
	d->scrub = sc;
	if (node_rebuild_start(d->o.x->o.base, NULL, -1, false, NULL, -1, 0, &d->scrub_rb, &err) != 0) {
		delta__scrub_stop(d);
		return;
	}
	node_rebuild_apply(d->scrub_rb, scrub_run, sc, scrubbed, d);
	return;
fail:
	if (sc != NULL)
		delta__sums_free(sc->learn);
	free(sc);
}

/* Starts the scrub of the active slot's next share (nothing when its
 * checksums are not kept or K is 0). */
static void scrub_start(struct delta_state *d)
{
	const struct delta_sums *s = delta__active_sums(d);
	uint32_t k = (uint32_t)proto_param(PROTO_PARAM_DELTA_SCRUB);
	struct proto_err err;

	delta__scrub_stop(d);
	if (s == NULL || k == 0 || delta_active(d)->len == 0)
		return;
	struct delta_scrub *sc = calloc(1, sizeof(*sc));
	if (sc == NULL)
		return;
	if (delta__scrub_plan(s, (uint32_t)(d->scrub_round++ % k), k, delta_active(d)->len,
			      &sc->plan) != 0) {
		free(sc);
		return;
	}
	sc->host = delta_active(d)->host;
	sc->fd = delta_active(d)->memfd;
	sc->tag = delta_active(d)->tag;
	sc->version = delta_active(d)->version;
	d->scrub = sc;
	if (node_rebuild_start(d->o.x->o.base, NULL, -1, false, NULL, -1, 0, &d->scrub_rb, &err) != 0) {
		LOG_WARN("node %s: no scrub of v%" PRIu64 ": %s", d->o.x->o.id, sc->version, err.msg);
		delta__scrub_stop(d);
		return;
	}
	node_rebuild_apply(d->scrub_rb, scrub_run, sc, scrubbed, d);
}


void delta__sums_activated(struct delta_state *d, struct delta_build *b, struct node_slot *old)
{
	struct fetch *f = b->f;
	struct node_slot *active = *d->o.active;

	/* The checksums the apply verified describe the new active slot. */
	delta__scrub_stop(d);
	delta__sums_free(d->sums);
	d->sums = NULL;
	if (f->delta && b->csums != NULL && b->csums->complete && !d->o.install_inplace &&
	    old != active) {
		d->sums = b->csums;
		b->csums = NULL;
		d->sums->tag = active->tag;
		scrub_start(d);
	} else if (!d->o.install_inplace && old != active && active->len > 0 && f->nparcels > 0) {
		sums_learn(d, f);
	}
}
