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
 * delta carries (the tag says the slot holds that parent); its touched
 * checksums catch a slot that differs from v(n-1) where the delta writes,
 * and the scrub (below) re-sums a share of the rest, between versions: a
 * mismatch in either makes the worker fall back to the dense copy. The
 * apply of the next delta then reads only its changed positions, from the
 * checksums the node keeps for the active slot (below). The copy of the
 * whole active slot remains for when the retired slot is pinned, not back
 * yet, of another size, or did not come from the last delta (an anchor, a
 * chain replay, an in-place install, TESSERA_DELTA_ROTATE=0). */
#include "node/agent/agent_internal.h"

#include <errno.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "node/rebuild/rebuild.h"
#include "proto/delta.h"
#include "proto/wsum.h"

/* A share of a slot's pieces with their kept checksums, to re-sum (the
 * scrub, below). */
struct scrub_item {
	uint64_t off, len, sum;
	uint32_t elsize;
	uint32_t src_rank, dst_rank, piece;
};

struct scrub_plan {
	struct scrub_item *items;
	uint32_t nitems, share, k;
	uint64_t bytes;
};

/* The last delta of this rank, to patch its parent's slot up to its child. */
struct agent_rot_parcel {
	uint32_t src_rank, dst_rank;
	uint8_t *wire;
	size_t len;
	struct proto_dparcel dp; /* its pieces, built on the loop before it runs */
	bool have_dp;
};

struct agent_rotation {
	struct node_agent *a;    /* whose wire pool its buffers go back to */
	uint64_t tag;            /* the parent's slot, as activated */
	uint64_t parent_version; /* what that slot holds */
	uint64_t version;        /* what the delta makes of it: the active one */
	uint8_t plan_src[PROTO_HASH_BYTES];
	struct agent_rot_parcel *parcels;
	uint32_t nparcels;
	struct node_slot *slot; /* set when it runs: what the catch-up writes */
	struct scrub_plan scrub; /* re-summed after the catch-up (no items: none) */
	/* Set by the loop when an apply waits for the catch-up (or its worker
	 * is being stopped): the scrub after it stops where it is, and
	 * scrub_cut says so (both atomic). */
	int hurry, scrub_cut;
};

void agent_rotation_stop(struct agent_rotation *r)
{
	if (r != NULL)
		__atomic_store_n(&r->hurry, 1, __ATOMIC_RELAXED);
}

void agent_rotation_free(struct agent_rotation *r)
{
	if (r == NULL)
		return;
	for (uint32_t i = 0; i < r->nparcels; i++) {
		agent_wire_put(r->a, r->parcels[i].wire);
		if (r->parcels[i].have_dp)
			proto_dparcel_fini(&r->parcels[i].dp);
	}
	free(r->parcels);
	free(r->scrub.items);
	free(r);
}

/*
 * Wire buffers. A delta parcel's bytes land in a buffer of its own, kept
 * after the activation for the next rotation's catch-up and given back at
 * the activation after that. Made by malloc for each version, a buffer of
 * a megabyte or more was a new mapping each time (glibc's mmap threshold)
 * or new heap, and on this VM every first write to one of its pages is a
 * fault and a trap: ~300 a parcel, paid on the loop as the chunks landed.
 * So the node keeps the buffers it is given back (WIRES_MAX at most) and
 * hands the smallest one large enough to the next delta; a
 * parcel grown past every kept buffer gets a new one, and the smallest kept
 * goes when the pool is full.
 */
#define WIRES_MAX 16u

struct agent_wires {
	uint32_t n;
	uint8_t *buf[WIRES_MAX];
	size_t cap[WIRES_MAX];
};

uint8_t *agent_wire_get(struct node_agent *a, size_t len)
{
	struct agent_wires *w = a->wires;
	uint32_t best = UINT32_MAX;

	for (uint32_t i = 0; w != NULL && i < w->n; i++)
		if (w->cap[i] >= len && (best == UINT32_MAX || w->cap[i] < w->cap[best]))
			best = i;
	if (best == UINT32_MAX)
		return malloc(PROTO_MAX(len, 1));
	uint8_t *b = w->buf[best];
	w->n--;
	w->buf[best] = w->buf[w->n];
	w->cap[best] = w->cap[w->n];
	return b;
}

void agent_wire_put(struct node_agent *a, uint8_t *buf)
{
	struct agent_wires *w = a != NULL ? a->wires : NULL;

	if (buf == NULL)
		return;
	if (a != NULL && w == NULL && !a->wires_closed)
		w = a->wires = calloc(1, sizeof(*w));
	if (w == NULL) {
		free(buf);
		return;
	}
	size_t cap = malloc_usable_size(buf);
	if (w->n == WIRES_MAX) { /* full: the smallest goes, maybe this one */
		uint32_t small = 0;
		for (uint32_t i = 1; i < w->n; i++)
			if (w->cap[i] < w->cap[small])
				small = i;
		if (w->cap[small] >= cap) {
			free(buf);
			return;
		}
		free(w->buf[small]);
		w->buf[small] = w->buf[--w->n];
		w->cap[small] = w->cap[w->n];
	}
	w->buf[w->n] = buf;
	w->cap[w->n++] = cap;
}

/*
 * Before the first delta the pool is empty, and the first delta after the
 * node's first anchor paid those faults (~300 a parcel of 1.2 MB, on the
 * loop and the verifier's workers, while the apply ran). So when a standby
 * copy first goes ahead, between versions, before any buffer was given
 * back, a buffer of WIRE_READY_PERMILLE of each parcel's
 * bytes is made and written once: a delta of that size or less lands in
 * touched pages (a larger one gets a new buffer, as before). 2 %: twice
 * what 1.6 % of BF16 elements changed costs on the wire (0.95 %).
 */
#define WIRE_READY_PERMILLE 20u

static void wires_ready(struct node_agent *a)
{
	uint32_t mine = 0, made = 0;
	uint64_t t0 = agent_now_ms(), bytes = 0;

	for (uint32_t i = 0; i < a->plan.nparcels; i++)
		mine += a->plan.parcels[i].dst_rank == a->o.rank;
	if (mine == 0 || a->wires != NULL || a->wires_closed)
		return; /* once: later deltas find the buffers of earlier ones */
	for (uint32_t i = 0; i < a->plan.nparcels; i++) {
		const struct proto_parcel *pp = &a->plan.parcels[i];
		size_t len = (size_t)(pp->bytes * WIRE_READY_PERMILLE / 1000);
		if (pp->dst_rank != a->o.rank || len == 0)
			continue;
		uint8_t *b = malloc(len);
		if (b == NULL)
			break;
		/* Each page's first write, now (not 0: malloc and a memset to 0
		 * may be made a calloc, which writes nothing). */
		memset(b, 0xa5, len);
		agent_wire_put(a, b);
		made++;
		bytes += len;
	}
	LOG_DEBUG("node %s: %u delta wire buffers (%" PRIu64 " bytes) made ready in %" PRIu64 " ms",
		  a->node_id, made, bytes, agent_now_ms() - t0);
}

/* Frees the kept buffers; those given back later are freed at once. */
static void wires_fini(struct node_agent *a)
{
	struct agent_wires *w = a->wires;

	a->wires_closed = true;
	a->wires = NULL;
	for (uint32_t i = 0; w != NULL && i < w->n; i++)
		free(w->buf[i]);
	free(w);
}

/*
 * Piece checksums. The apply of a delta needs the parent's checksum of each
 * piece (proto/delta.h, "Parcels"). Read from the slot, that is a pass over
 * the whole rank per version; instead the node keeps, for its active slot,
 * the child checksums the apply that built it verified (each delta's are
 * signed through its chunk hashes), bound to the slot by the tag it gets at
 * activation and to the version by its manifest digest. The next delta
 * built from that slot (a copy of it, or the retired slot caught up to it)
 * takes them as its parent's, and the apply then reads and writes the
 * changed positions alone: the touched checksums catch a parent damaged
 * there. A byte damaged where no delta writes is left to the scrub (below).
 * After an anchor, a whole fetch or an in-place install none are known:
 * the first delta reads them from its slot, as before.
 */
struct agent_psums {
	uint32_t src_rank, dst_rank, npieces;
	uint64_t *sums;             /* npieces */
	struct proto_dpiece *pieces; /* where each is in the rank's block */
};

struct agent_sums {
	uint8_t digest[PROTO_HASH_BYTES];   /* the version's manifest */
	uint8_t plan_src[PROTO_HASH_BYTES]; /* the plan the pieces come from */
	uint64_t tag;      /* the slot they describe, as activated (0: none yet) */
	uint32_t nparcels; /* in the fetch's parcel order */
	uint32_t known;    /* parcels applied with their parent's kept */
	bool complete;     /* every parcel's are set (the apply succeeded) */
	struct agent_psums *p;
};

void agent_sums_free(struct agent_sums *s)
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

static struct agent_sums *sums_new(uint32_t nparcels)
{
	struct agent_sums *s = calloc(1, sizeof(*s));

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
static struct agent_sums *sums_dup(const struct agent_sums *s)
{
	struct agent_sums *d = sums_new(s->nparcels);

	if (d == NULL)
		return NULL;
	memcpy(d->digest, s->digest, PROTO_HASH_BYTES);
	memcpy(d->plan_src, s->plan_src, PROTO_HASH_BYTES);
	d->tag = s->tag;
	d->complete = s->complete;
	for (uint32_t i = 0; i < s->nparcels; i++) {
		const struct agent_psums *ps = &s->p[i];
		struct agent_psums *pd = &d->p[i];
		*pd = (struct agent_psums){ps->src_rank, ps->dst_rank, ps->npieces, NULL, NULL};
		pd->sums = malloc(((size_t)ps->npieces + 1) * sizeof(*pd->sums));
		pd->pieces = malloc(((size_t)ps->npieces + 1) * sizeof(*pd->pieces));
		if (pd->sums == NULL || pd->pieces == NULL) {
			agent_sums_free(d);
			return NULL;
		}
		memcpy(pd->sums, ps->sums, ps->npieces * sizeof(*pd->sums));
		memcpy(pd->pieces, ps->pieces, ps->npieces * sizeof(*pd->pieces));
	}
	return d;
}

/* The parent checksums s keeps for parcel src->dst cut into dp's pieces, or
 * NULL (none kept, or cut otherwise). */
static const uint64_t *sums_find(const struct agent_sums *s, uint32_t src, uint32_t dst,
				 const struct proto_dparcel *dp)
{
	for (uint32_t i = 0; s != NULL && i < s->nparcels; i++) {
		const struct agent_psums *ps = &s->p[i];
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
static const struct agent_sums *active_sums(const struct node_agent *a)
{
	const struct agent_sums *s = a->sums;

	if (s == NULL || !s->complete || a->active == NULL || a->active->tag == 0 ||
	    s->tag != a->active->tag ||
	    sodium_memcmp(s->digest, a->active_digest, PROTO_HASH_BYTES) != 0 ||
	    sodium_memcmp(s->plan_src, a->plan_src, PROTO_HASH_BYTES) != 0)
		return NULL;
	return s;
}

/*
 * The scrub. A sparse apply cannot see a byte of its parent damaged where
 * the delta does not write (a stray write into a served or a retired slot):
 * the child inherits it and passes every check. So a worker re-sums the
 * pieces that start in a rotating 1/K of the rank's block
 * (TESSERA_DELTA_SCRUB) and compares them with the kept checksums, never on
 * a version's way to activation: the active slot after each activation
 * (what the next copy is made from), and the retired slot after its
 * rotation's catch-up, between versions (what the next delta is built on:
 * a mismatch there makes the rebuild copy the active slot instead). Every
 * byte is re-read once every K versions. A mismatch in the active slot
 * revokes its provenance: its checksums are dropped and its tag cleared,
 * so the next delta reads its parent's checksums from the bytes it is
 * built on (refused when that is a copy of the damaged slot: an anchor
 * follows) and the damaged slot is never rotated into.
 */
/* The pieces of s that start in share `share` of K of a block of len
 * bytes; 0, or -ENOMEM (nothing to free). */
static int scrub_plan(const struct agent_sums *s, uint32_t share, uint32_t k, size_t len,
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

/*
 * The checksum of the len bytes at off of a slot (elements of elsize). A
 * slot filled through its memfd (an anchor's, a whole fetch's: pwrite of
 * verified chunks) has no page mapped in this process yet, and on this VM
 * the first touch of each page through the mapping costs ~12 us, reading
 * too: summing 128 MiB through host took 0.42-0.48 CPU-s against 0.044-0.047
 * read with pread into a small buffer that is reused (same sums). So the
 * bytes are read through fd when there is one (the same page cache pages
 * the mapping shows), else through host. scratch: SUM_BUF bytes, or NULL
 * (host only).
 */
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
static int scrub_check(const struct scrub_plan *sp, const uint8_t *host, int fd, uint64_t v,
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

struct agent_scrub {
	const uint8_t *host; /* the active slot's bytes, which it reads */
	int fd;              /* and its memfd (-1: none), read instead (slot_wsum) */
	uint64_t tag, version;
	struct scrub_plan plan;
	/* Not NULL: no checksums were kept for the slot (an anchor, a whole
	 * fetch): every piece of these is summed instead, to be kept. */
	struct agent_sums *learn;
	uint64_t learn_ms;
	int stop; /* atomic */
	int rc;
	struct proto_err err;
};

static void scrub_stop(struct node_agent *a)
{
	if (a->scrub != NULL)
		__atomic_store_n(&a->scrub->stop, 1, __ATOMIC_RELAXED);
	node_rebuild_free(a->scrub_rb);
	a->scrub_rb = NULL;
	if (a->scrub != NULL) {
		free(a->scrub->plan.items);
		agent_sums_free(a->scrub->learn);
	}
	free(a->scrub);
	a->scrub = NULL;
}

/* On the scrub's worker: reads only sc and the slot. */
static int scrub_run(void *arg, struct proto_err *err)
{
	struct agent_scrub *sc = arg;

	(void)err;
	/* After an anchor or a whole fetch: the first delta's apply finds its
	 * workers made (proto_delta_apply_warm), as every later one does. */
	if (sc->learn != NULL)
		(void)proto_delta_apply_warm(node_verifier_threads());
	uint8_t *scratch = sc->learn != NULL && sc->fd >= 0 ? malloc(SUM_BUF) : NULL;
	for (uint32_t i = 0; sc->learn != NULL && i < sc->learn->nparcels; i++) {
		struct agent_psums *ps = &sc->learn->p[i];
		for (uint32_t q = 0; q < ps->npieces && !__atomic_load_n(&sc->stop, __ATOMIC_RELAXED);
		     q++)
			ps->sums[q] = slot_wsum(sc->fd, sc->host, scratch, ps->pieces[q].dst_off,
						ps->pieces[q].len, ps->pieces[q].elsize);
	}
	free(scratch);
	if (sc->learn == NULL)
		sc->rc = scrub_check(&sc->plan, sc->host, sc->fd, sc->version, &sc->stop, &sc->err);
	if (sc->rc == -EINTR) /* stopped: scrub_stop frees it, no callback */
		sc->rc = 0;
	return 0;
}

static void scrubbed(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		     void *arg)
{
	struct node_agent *a = arg;
	struct agent_scrub *sc = a->scrub;

	(void)rc;
	(void)err;
	(void)t;
	if (sc->learn != NULL) {
		/* Summed from bytes every chunk hash verified, bound to the slot
		 * the same way as an apply's. */
		if (a->active != NULL && a->active->tag == sc->tag && a->sums == NULL) {
			a->sums = sc->learn;
			sc->learn = NULL;
			a->sums->tag = sc->tag;
			a->sums->complete = true;
			LOG_DEBUG("node %s: the piece checksums of v%" PRIu64 "'s slot summed in %" PRIu64
				  " ms, off the next delta's way", a->node_id, sc->version,
				  agent_now_ms() - sc->learn_ms);
		}
	} else if (sc->rc == 0) {
		LOG_DEBUG("node %s: scrub of v%" PRIu64 ": share %u/%u, %u pieces, %" PRIu64
			  " bytes match their checksums",
			  a->node_id, sc->version, sc->plan.share + 1, sc->plan.k, sc->plan.nitems,
			  sc->plan.bytes);
	} else if (a->active != NULL && a->active->tag == sc->tag) {
		LOG_WARN("node %s: %s; its checksums are dropped, the next delta reads its parent "
			 "whole", a->node_id, sc->err.msg);
		a->active->tag = 0;
		agent_sums_free(a->sums);
		a->sums = NULL;
	}
	scrub_stop(a); /* joins the worker, which is done */
}

/* After an activation without kept checksums (an anchor, a whole fetch):
 * sums every piece of f's parcels in the active slot on a worker, so that
 * the first delta after it need not read its parent whole. Nothing when a
 * piece cannot be placed (the next delta reads the slot then). */
static void sums_learn(struct node_agent *a, const struct agent_fetch *f)
{
	struct agent_scrub *sc = calloc(1, sizeof(*sc));
	struct proto_err err;

	if (sc == NULL || (sc->learn = sums_new(f->nparcels)) == NULL)
		goto fail;
	for (uint32_t i = 0; i < f->nparcels; i++) {
		const struct agent_parcel *p = &f->parcels[i];
		struct agent_psums *ps = &sc->learn->p[i];
		struct proto_dparcel dp;
		/* Only the agent's own plan's parcels (a version taken whole
		 * from another layout's holders is not cut like a delta). */
		if (f->full || f->plan != &a->plan || p->pp == NULL || p->pp < a->plan.parcels ||
		    p->pp >= a->plan.parcels + a->plan.nparcels ||
		    proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &dp, &err) != 0)
			goto fail;
		*ps = (struct agent_psums){p->mp->src_rank, p->mp->dst_rank, dp.npieces, NULL, NULL};
		ps->sums = calloc((size_t)dp.npieces + 1, sizeof(*ps->sums));
		ps->pieces = malloc(((size_t)dp.npieces + 1) * sizeof(*ps->pieces));
		bool fits = true;
		for (uint32_t q = 0; q < dp.npieces; q++)
			fits &= dp.pieces[q].dst_off + dp.pieces[q].len <= a->active->len;
		if (ps->pieces != NULL)
			memcpy(ps->pieces, dp.pieces, dp.npieces * sizeof(*dp.pieces));
		proto_dparcel_fini(&dp);
		if (ps->sums == NULL || ps->pieces == NULL || !fits)
			goto fail;
	}
	memcpy(sc->learn->digest, a->active_digest, PROTO_HASH_BYTES);
	memcpy(sc->learn->plan_src, a->plan_src, PROTO_HASH_BYTES);
	sc->host = a->active->host;
	sc->fd = a->active->memfd;
	sc->tag = a->active->tag;
	sc->version = a->active->version;
	sc->learn_ms = agent_now_ms();
	a->scrub = sc;
	if (node_rebuild_start(a->base, NULL, -1, false, NULL, -1, 0, &a->scrub_rb, &err) != 0) {
		scrub_stop(a);
		return;
	}
	node_rebuild_apply(a->scrub_rb, scrub_run, sc, scrubbed, a);
	return;
fail:
	if (sc != NULL)
		agent_sums_free(sc->learn);
	free(sc);
}

/* Starts the scrub of the active slot's next share (nothing when its
 * checksums are not kept or K is 0). */
static void scrub_start(struct node_agent *a)
{
	const struct agent_sums *s = active_sums(a);
	uint32_t k = (uint32_t)proto_param(PROTO_PARAM_DELTA_SCRUB);
	struct proto_err err;

	scrub_stop(a);
	if (s == NULL || k == 0 || a->active->len == 0)
		return;
	struct agent_scrub *sc = calloc(1, sizeof(*sc));
	if (sc == NULL)
		return;
	if (scrub_plan(s, (uint32_t)(a->scrub_round++ % k), k, a->active->len, &sc->plan) != 0) {
		free(sc);
		return;
	}
	sc->host = a->active->host;
	sc->fd = a->active->memfd;
	sc->tag = a->active->tag;
	sc->version = a->active->version;
	a->scrub = sc;
	if (node_rebuild_start(a->base, NULL, -1, false, NULL, -1, 0, &a->scrub_rb, &err) != 0) {
		LOG_WARN("node %s: no scrub of v%" PRIu64 ": %s", a->node_id, sc->version, err.msg);
		scrub_stop(a);
		return;
	}
	node_rebuild_apply(a->scrub_rb, scrub_run, sc, scrubbed, a);
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
	int rc = scrub_check(&r->scrub, r->slot->host, r->slot->memfd, r->version, &r->hurry, err);
	if (rc == -EINTR)
		__atomic_store_n(&r->scrub_cut, 1, __ATOMIC_RELAXED);
	return rc == -EINTR ? 0 : rc;
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

/*
 * The warm slot. In a VM, the first access from user space to each page
 * of a new mapping traps to the hypervisor, whether or not the kernel
 * already allocated and mapped the page (MAP_POPULATE,
 * MADV_POPULATE_WRITE, copy_file_range into the memfd do not take it off):
 * ~11 us a page on an idle 2-core VM, 25-50 us a page under load, against
 * 0.04 us for a page touched before. After the node's first anchor there
 * is no retired slot to rotate into: the first delta's parent is copied
 * into a new slot, and that copy, or the apply, paid ~0.4 s per 128 MiB
 * of such traps while the delta waited (the later deltas rotate between
 * two slots touched long before). The node needs that second slot anyway:
 * it makes it when it starts, and a worker at the lowest priority touches
 * every page of it while the node has nothing else to do (before the first
 * version, or between versions): it waits while a version is fetched (at
 * N = 16 on 2 cores, a nice-19 touch still took up to 8 % of a node's CPU
 * while the first version came, time the swarm's other nodes waited on).
 * The first dense copy of a parent takes
 * it: a memcpy into touched pages. Taken before the touch is done, it is
 * copied into as a fresh slot (the pages touched so far cost nothing more).
 */
static int warm_run(void *arg, struct proto_err *err)
{
	struct node_agent *a = arg; /* reads a->second and second_stop, writes second_cpu_ms */
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
	rc = node_slot_populate(a->second, &a->second_stop, &a->second_pause);
	if (rc != 0 && rc != -ENOTSUP)
		goto out;
	/* Only what the node leaves idle: the fetch of the first version
	 * keeps the CPU when it comes. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19) != 0)
		LOG_DEBUG("node %s: the warm slot's worker keeps its priority: %s", a->node_id,
			  strerror(errno));
	rc = node_slot_touch(a->second, &a->second_stop, &a->second_pause);
out:
	/* Its own CPU, not the process's (the fetch runs meanwhile): read by
	 * warmed, on the loop, after the rebuild's eventfd. */
	a->second_cpu_ms = (proto_thread_cpu_ns() - cpu0) / 1000000;
	return rc;
}

static void warmed(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		   void *arg)
{
	struct node_agent *a = arg;

	(void)err;
	(void)t; /* its CPU is the whole process's: second_cpu_ms is the worker's */
	a->second_ready = rc == 0;
	if (rc == 0) {
		a->second->fresh = false;
		LOG_INFO("node %s: the second slot (%zu MiB) is warm: every page touched in %" PRIu64
			 " ms (%" PRIu64 " ms of the worker's CPU), for the first copy after an anchor",
			 a->node_id, a->second->len >> 20, agent_now_ms() - a->second_ms,
			 a->second_cpu_ms);
	} else {
		/* Not a stop (warm_stop frees the rebuild: no call then). */
		LOG_WARN("node %s: the second slot's pages were not mapped ahead: %s; the first copy "
			 "after an anchor maps them",
			 a->node_id, strerror(-rc));
	}
	node_rebuild_free(a->second_rb); /* done: the join is immediate */
	a->second_rb = NULL;
}

void agent_warm_pause(struct node_agent *a, bool fetching)
{
	__atomic_store_n(&a->second_pause, fetching ? 1 : 0, __ATOMIC_RELAXED);
}

/* Stops the warm slot's touch; the slot stays (a->second). */
static void warm_stop(struct node_agent *a)
{
	__atomic_store_n(&a->second_stop, 1, __ATOMIC_RELAXED);
	node_rebuild_free(a->second_rb);
	a->second_rb = NULL;
}

void agent_delta_warm(struct node_agent *a)
{
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct proto_err err = {{0}};

	if (a->o.install_inplace || len == 0 || a->second != NULL ||
	    proto_param(PROTO_PARAM_DELTA_WARM) == 0)
		return;
	a->second_stop = 0;
	a->second_ready = false;
	a->second_ms = agent_now_ms();
	if (node_slot_new_blank(&a->store, 0, len, &a->second, &err) != 0 ||
	    node_rebuild_start(a->base, NULL, -1, false, NULL, -1, 0, &a->second_rb, &err) != 0) {
		LOG_WARN("node %s: no warm second slot (%s): the first copy after an anchor makes "
			 "its own", a->node_id, err.msg);
		if (a->second != NULL)
			node_slot_free(&a->store, a->second);
		a->second = NULL;
		return;
	}
	node_rebuild_apply(a->second_rb, warm_run, a, warmed, a);
}

/* The warm slot for version, a copy of parent, if it has len bytes (else
 * it is freed): its touch stopped, and fresh unless it was done. NULL when
 * none. */
static struct node_slot *warm_take(struct node_agent *a, const struct node_slot *parent,
				   uint64_t version, size_t len)
{
	struct node_slot *s = a->second;

	if (s == NULL)
		return NULL;
	warm_stop(a);
	a->second = NULL;
	if (s->len != len) {
		node_slot_free(&a->store, s);
		return NULL;
	}
	s->version = version;
	s->tag = 0;
	LOG_INFO("node %s: v%" PRIu64 " is copied into the second slot made at start (%s)",
		 a->node_id, parent->version,
		 a->second_ready ? "warm: every page touched"
				 : "its pages not all touched yet: copied into as a new slot");
	return s;
}

/* The copy path: a fresh slot for version and, when parent is given, a
 * copy of the parent's bytes into it on a worker (into the warm slot when
 * there is one). On failure *slot may be set (the caller frees it with
 * the rest). */
static int copy_start(struct node_agent *a, uint64_t version, size_t len,
		      const struct node_slot *parent, struct node_slot **slot,
		      struct node_rebuild **rb, struct proto_err *err)
{
	int rc = 0;

	/* A copy fills the slot whole through its memfd: a new one's pages
	 * are allocated by the copy, not cleared first. */
	if (parent != NULL && (*slot = warm_take(a, parent, version, len)) == NULL)
		rc = node_slot_new_blank(&a->store, version, len, slot, err);
	else if (parent == NULL)
		rc = node_slot_new(&a->store, version, len, slot, err);
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
	/* The share the scrub after this activation takes, of the slot that
	 * will hold the active version. */
	const struct agent_sums *kept = active_sums(a);
	uint32_t k = (uint32_t)proto_param(PROTO_PARAM_DELTA_SCRUB);
	free(r->scrub.items);
	memset(&r->scrub, 0, sizeof(r->scrub));
	if (kept != NULL && k > 0 && len > 0)
		(void)scrub_plan(kept, (uint32_t)((a->scrub_round + k - 1) % k), k, len, &r->scrub);
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
	proto_metrics_add(a->am.m, a->am.delta_refused, 1);
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
	agent_rotation_stop(a->standby_rot);
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
 * makes its own copy (agent_delta_slot), on its way to activation.
 * While it waits it looks every quiet/STANDBY_LOOKS ms, and goes ahead a
 * quiet period after the last look that saw a read: looking once per
 * quiet period, it went ahead between one and two periods after the last
 * read (300-600 ms), and after the first anchor the next version often
 * came meanwhile and waited for its parent's copy.
 */
#define STANDBY_LOOKS 4u
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
	if (busy)
		a->standby_read_ms = now;
	else if (a->standby_defer_ms == 0 || now - a->standby_read_ms >= quiet)
		return false; /* no read since the activation, or none for a quiet period */
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
	agent_arm(a->standby_ev, PROTO_MAX(quiet / STANDBY_LOOKS, 1));
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
	wires_ready(a);
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
	r->a = a;
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
	/* The checksums the apply verified describe the new active slot. */
	scrub_stop(a);
	agent_sums_free(a->sums);
	a->sums = NULL;
	if (f->delta && f->csums != NULL && f->csums->complete && !a->o.install_inplace &&
	    old != a->active) {
		a->sums = f->csums;
		f->csums = NULL;
		a->sums->tag = a->active->tag;
		scrub_start(a);
	} else if (!a->o.install_inplace && old != a->active && a->active->len > 0 &&
		   f->nparcels > 0) {
		sums_learn(a, f);
	}
	a->standby_defer_ms = 0;
	a->standby_test_busy = proto_param(PROTO_PARAM_TEST_STANDBY_BUSY);
	if (a->o.install_inplace)
		return; /* memory-tight: no second copy of the rank */
	struct node_fabloop_counts c = {0};
	if (a->fl != NULL)
		node_fabloop_counts(a->fl, &c);
	a->standby_fd_polls = c.fd_polls; /* peers' reads are counted from here */
	a->standby_read_ms = agent_now_ms(); /* as if one read came now */
	if (a->standby_ev == NULL)
		a->standby_ev = evtimer_new(a->base, on_standby, a);
	if (a->standby_ev != NULL)
		agent_arm(a->standby_ev, proto_param(PROTO_PARAM_DELTA_STANDBY_MS));
}

void agent_delta_fini(struct node_agent *a)
{
	agent_chain_end(a, false);
	scrub_stop(a);
	agent_sums_free(a->sums);
	a->sums = NULL;
	standby_drop(a);
	agent_rotation_free(a->rot);
	a->rot = NULL;
	warm_stop(a);
	if (a->second != NULL)
		node_slot_free(&a->store, a->second);
	a->second = NULL;
	wires_fini(a);
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
			agent_rotation_stop(a->standby_rot);
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

/* On the rebuild's worker: parcel i's delta applied to the new slot, each
 * piece's checksum checked, its child checksums kept in f->csums. */
static int apply_parcel(struct agent_fetch *f, const struct node_agent *a, uint32_t i,
			unsigned threads, struct proto_err *err)
{
	struct agent_parcel *p = &f->parcels[i];
	struct proto_dparcel dp;

	if (f->test_corrupt && p->mp->wire_bytes > 0) { /* test only */
		p->wire[p->mp->wire_bytes / 2] ^= 0x40;
		f->test_corrupt = false;
	}
	struct proto_err e;
	int rc = proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &dp, &e);
	if (rc == 0) {
		const uint64_t *ps = sums_find(f->psums, p->mp->src_rank, p->mp->dst_rank, &dp);
		struct agent_psums *cs = f->csums != NULL ? &f->csums->p[i] : NULL;
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
		else if (rc == 0 && ps != NULL && f->csums != NULL)
			f->csums->known++;
		if (cs != NULL && (cs->sums == NULL || cs->pieces == NULL)) {
			agent_sums_free(f->csums); /* out of memory: none kept */
			f->csums = NULL;
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
 * each as soon as its bytes are whole (agent_delta_landed), so that the
 * parcels that land first are applied while the others arrive and only
 * what landed last is left after the last chunk. Parcels write disjoint
 * pieces of the slot: their order does not matter. It reads only what the
 * loop leaves alone while the fetch lives (the model, plan and layout, the
 * parcels' manifest entries and landed wire bytes, the slot).
 */
static int apply_all(void *arg, struct proto_err *err)
{
	struct agent_fetch *f = arg; /* not a->fetch: the loop may clear that before the join */
	const struct node_agent *a = f->rebuild_agent;
	unsigned threads = node_verifier_threads();
	uint8_t *done = calloc((size_t)f->nparcels + 1, 1);
	uint32_t ndone = 0;
	int rc = 0;

	if (done == NULL)
		return proto_errf(err, ENOMEM, "delta apply: out of memory");
	/* A rerun after a dense copy starts over. */
	agent_sums_free(f->csums);
	f->csums = sums_new(f->nparcels); /* NULL: the child's are not kept */
	while (rc == 0 && ndone < f->nparcels) {
		uint64_t seen = node_rebuild_fed(f->rebuild); /* before looking */
		uint32_t took = 0;
		for (uint32_t i = 0; rc == 0 && i < f->nparcels; i++) {
			if (done[i] || !__atomic_load_n(&f->parcels[i].landed, __ATOMIC_ACQUIRE))
				continue;
			rc = apply_parcel(f, a, i, threads, err);
			done[i] = 1;
			ndone++;
			took++;
		}
		if (rc == 0 && took == 0 && !node_rebuild_wait_fed(f->rebuild, seen))
			rc = proto_errf(err, ECANCELED, "delta apply: stopped");
	}
	free(done);
	return rc;
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
	uint32_t known = 0;
	if (f->csums != NULL) {
		memcpy(f->csums->digest, f->man.digest, PROTO_HASH_BYTES);
		memcpy(f->csums->plan_src, a->plan_src, PROTO_HASH_BYTES);
		f->csums->complete = true;
		known = f->csums->known;
	}
	proto_metrics_add(a->am.m, a->am.delta_versions, 1);
	proto_metrics_add(a->am.m, t->dense ? a->am.delta_copies : a->am.delta_rotations, 1);
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
		 " ms of it after the apply was handed over; the apply %" PRIu64 " ms (%" PRIu64
		 " ms of CPU, %" PRIu64 " page faults), from %u of %u parcels landed before the "
		 "last chunk; parent checksums %s)",
		 a->node_id, f->version, f->man.parent_version, f->bytes_total, f->slot->len,
		 f->rebuild_ms, how, t->copy_ms, t->wait_ms, t->apply_ms, t->apply_cpu_ms,
		 t->apply_faults, f->fed_early, f->nparcels,
		 known == f->nparcels && known > 0 ? "kept (sparse: only changed positions read)"
		 : known > 0 ? "kept for some parcels, read from the slot for the others"
			     : "read from the slot");
	if (f->rot != NULL && !t->dense && __atomic_load_n(&f->rot->scrub_cut, __ATOMIC_RELAXED) &&
	    f->rot->scrub.nitems > 0) {
		/* The share it skipped is the one the last activation's scrub
		 * took: the scrub after this activation takes it again. */
		LOG_INFO("node %s: the scrub of share %u/%u of the slot of v%" PRIu64 " gave way to "
			 "v%" PRIu64 "'s apply: it is re-summed after the activation",
			 a->node_id, f->rot->scrub.share + 1, f->rot->scrub.k, f->rot->version,
			 f->version);
		if (a->scrub_round > 0)
			a->scrub_round--;
	}
	agent_rotation_free(f->rot); /* the worker is done with it */
	f->rot = NULL;
	agent_verified(a);
}

/* Hands the apply to the worker, which takes each parcel as it lands: 0,
 * or -ENOENT when the parent is no longer the delta's (nothing started). */
static int apply_begin(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	const uint8_t *digest;
	struct node_slot *parent = parent_slot(a, &digest);

	/* The parent may have changed since the fetch began only through an
	 * activation, which needs this fetch: check anyway, cheaply. */
	if (parent == NULL || parent->version != f->man.parent_version ||
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0)
		return -ENOENT;
	f->rebuild_agent = a;
	f->rotatable = parent == a->active;
	/* The slot holds a copy of the active one, or the retired one caught
	 * up to it: the active slot's kept checksums are its parent's. */
	agent_sums_free(f->psums);
	f->psums = NULL;
	const struct agent_sums *kept = parent == a->active ? active_sums(a) : NULL;
	if (kept != NULL)
		f->psums = sums_dup(kept);
	f->test_corrupt = a->chain != NULL &&
			  proto_param(PROTO_PARAM_TEST_CORRUPT_CHAIN) == f->version;
	for (uint32_t i = 0; i < f->nparcels; i++) /* nothing to wait for */
		if (f->parcels[i].mp->nchunks == 0)
			__atomic_store_n(&f->parcels[i].landed, 1, __ATOMIC_RELEASE);
	f->applying = true;
	agent_rotation_stop(f->rot); /* the catch-up's scrub must not hold the apply up */
	node_rebuild_apply(f->rebuild, apply_all, f, rebuilt, a);
	return 0;
}

void agent_delta_landed(struct node_agent *a, uint32_t pi)
{
	struct agent_fetch *f = a->fetch;

	if (f == NULL || !f->delta || f->rebuild == NULL || f->slot == NULL || agent_inplace(a) ||
	    pi >= f->nparcels || (!f->applying && apply_begin(a) != 0))
		return; /* agent_delta_rebuild checks and says why */
	__atomic_store_n(&f->parcels[pi].landed, 1, __ATOMIC_RELEASE);
	f->fed_early++;
	node_rebuild_feed(f->rebuild);
}

void agent_delta_rebuild(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	f->rebuild_ms = agent_now_ms();
	if (!f->applying && apply_begin(a) != 0) {
		need_anchor(a, "the parent slot changed during the fetch");
		return;
	}
	for (uint32_t i = 0; i < f->nparcels; i++)
		__atomic_store_n(&f->parcels[i].landed, 1, __ATOMIC_RELEASE);
	node_rebuild_feed(f->rebuild);
}
