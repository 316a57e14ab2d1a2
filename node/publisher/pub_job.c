/* The export's workers: one job per trainer rank on the worker pool (snapshot, gather, encode). */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/canary.h"
#include "proto/chunkhash.h"
#include "proto/delta.h"
#include "proto/pool.h"

#define HASH_STEP (256u << 10) /* gather then hash this much while in cache */

static void job_snapshot(struct pub_job *j)
{
	j->rc = node__pub_source_fill(j->p, j->rank, j->version, j->block, &j->err);
}

/*
 * A delta's part: each item is encoded against its parent by the encoder,
 * which scans this version's snapshot against the parent's (the snapshot
 * the last version took, kept whole) where each piece lies in them, and
 * hands its changes to the canary update: one pass over the new bytes and
 * the old, nothing copied.
 */
static void job_delta(struct pub_job *j)
{
	struct pub_part *pt = j->part;
	uint64_t t0 = proto_now_ns(), c0 = proto_thread_cpu_ns();

	for (size_t i = 0; i < pt->nitems && !atomic_load(&j->p->abort); i++)
		node__pub_delta_encode_item(j->p, &pt->items[i], j->chunk_size, j->threads,
					    pt->items[i].block, &j->scratch, j->budget);
	j->encode_ns = proto_now_ns() - t0;
	/* With more than one encoder thread the others' CPU is not in it. */
	j->cpu_ns = proto_thread_cpu_ns() - c0;
}

/*
 * An anchor kept as the next delta's parent leaves the checksums of its
 * parcels' pieces behind (it->sums, moved into the parent export), taken
 * while the gather has each step in cache: the first delta after an anchor
 * then sums only its own side, as every later one does. False (no sums:
 * the delta sums its parent) when out of memory or the parcel has no piece.
 */
static bool item_sums_start(const struct node_pub *p, struct pub_item *it,
			    struct proto_dparcel *dp, struct proto_dparcel_summer *su)
{
	free(it->sums);
	it->sums = NULL;
	if (it->pc->bytes == 0 ||
	    proto_dparcel_build(&p->model, &it->sl->plan, it->pc, &it->sl->layout, dp, NULL) != 0)
		return false;
	it->sums = calloc((size_t)dp->npieces + 1, sizeof(*it->sums));
	if (it->sums == NULL) {
		proto_dparcel_fini(dp);
		return false;
	}
	proto_dparcel_summer_init(su, dp, it->sums);
	return true;
}

/*
 * An anchor's gather: its parcels are cut into stripes of STRIPE_CHUNKS
 * chunks, and the job's threads (j->threads, the pool's) take stripes in
 * turn, each gathering its chunks from the snapshot into the export buffer
 * in cache-sized steps, hashing each step while it is in cache, and scoring
 * the canary of the elements lying whole in its stripe. The elements cut by
 * a stripe's edge are scored after, one per edge, and an anchor kept as the
 * next delta's parent sums its pieces after, in one pass over each parcel:
 * neither is on a thread's way through its stripes.
 */
#define STRIPE_CHUNKS 16u

struct stripe {
	uint32_t item, c0, c1; /* chunks [c0, c1) of items[item] */
};

struct gather {
	struct pub_job *j;
	struct stripe *st;
	struct proto_canary_map **maps; /* per item; NULL: scored whole after */
	_Atomic uint64_t *canary;       /* per item: the stripes' parts */
};

static int gather_stripe(void *arg, unsigned slot, uint64_t i)
{
	struct gather *g = arg;
	struct pub_job *j = g->j;
	const struct stripe *s = &g->st[i];
	struct pub_item *it = &j->part->items[s->item];
	uint64_t cs = j->chunk_size, bytes = it->pc->bytes;
	uint8_t *pay = j->part->buf + it->off;

	(void)slot;
	if (atomic_load(&j->p->abort))
		return 1;
	for (uint32_t c = s->c0; c < s->c1; c++) {
		uint64_t c0 = (uint64_t)c * cs, clen = PROTO_MIN(cs, bytes - c0);
		struct proto_chunk_hasher st;
		proto_chunk_hash_init(&st);
		for (uint64_t o = 0; o < clen; o += HASH_STEP) {
			uint64_t n = PROTO_MIN(HASH_STEP, clen - o);
			proto_parcel_gather(&it->sl->plan, it->pc, it->sl->src, it->block, c0 + o, n,
					    pay + c0 + o);
			proto_chunk_hash_update(&st, pay + c0 + o, n);
		}
		proto_chunk_hash_final(&st, it->hash[c]);
	}
	if (g->maps[s->item] != NULL) {
		uint64_t a = (uint64_t)s->c0 * cs, b = PROTO_MIN((uint64_t)s->c1 * cs, bytes);
		atomic_fetch_add(&g->canary[s->item],
				 proto_canary_map_span(g->maps[s->item], a, b - a, pay));
	}
	return 0;
}

/* The piece checksums of an anchor kept as the parent (see item_sums_start),
 * in one pass over each gathered parcel. */
static void gather_sums(struct pub_job *j)
{
	struct pub_part *pt = j->part;

	for (size_t i = 0; i < pt->nitems && !atomic_load(&j->p->abort); i++) {
		struct pub_item *it = &pt->items[i];
		struct proto_dparcel dp;
		struct proto_dparcel_summer su;
		if (!item_sums_start(j->p, it, &dp, &su))
			continue;
		for (uint64_t o = 0; o < it->pc->bytes && !atomic_load(&j->p->abort); o += HASH_STEP)
			proto_dparcel_summer_feed(&su, pt->buf + it->off,
						  PROTO_MIN(o + HASH_STEP, it->pc->bytes));
		if (atomic_load(&j->p->abort) || su.k < dp.npieces) {
			free(it->sums); /* cut short: the delta sums its parent */
			it->sums = NULL;
		}
		proto_dparcel_fini(&dp);
	}
}

/*
 * Where each item reads its source: its rank's memory, or for an FP8
 * layout its quantized source, made here first from every rank's memory
 * of the version (FP8 parcels all come from trainer rank 0's part, so one
 * job makes it, while the others gather). 0, or the quantizer's error (a
 * NaN or an infinity in a quantized tensor fails the version).
 */
static int job_sources(struct pub_job *j)
{
	struct pub_part *pt = j->part;

	for (size_t i = 0; i < pt->nitems; i++) {
		struct pub_item *it = &pt->items[i];
		struct pub_q *q = it->sl->q;
		it->block = j->block;
		if (q == NULL)
			continue;
		/* Made once per job: this job's earlier item of that source did. */
		bool have = (q->made_by == j || j->q_reuse) && node__pub_q_block(q, j->version) != NULL;
		for (uint32_t r = 0; r < j->p->tl.nranks && !have; r++)
			if (j->tl_blocks[r] == NULL)
				return proto_errf(&j->err, ENOENT,
						  "version %llu: its FP8 source is gone (rank %u's memory "
						  "of it is no longer kept); FP8 replicas wait for the next",
						  (unsigned long long)j->version, r);
		int rc = have ? 0 : node__pub_quantize(j->p, q, j->version, j->q_keep, j->q_reuse,
						       j->tl_blocks, j->threads, &j->p->abort, &j->err);
		if (rc != 0)
			return rc;
		q->made_by = j;
		it->block = node__pub_q_block(q, j->version);
	}
	return 0;
}

/* Gathers, hashes and scores every parcel of the part on j->threads. */
static void job_gather(struct pub_job *j)
{
	struct node_pub *p = j->p;
	struct pub_part *pt = j->part;
	uint64_t cs = j->chunk_size;
	struct gather g = {.j = j};
	size_t n = 0;

	j->encode_ns = 0;
	if (j->restore && !j->restored) {
		j->restored = p->trainer && j->nrs > 0 &&
			      node__pub_restore(p, j->rank, j->rs, j->nrs, pt, j->block,
						 p->block_cap[j->rank]);
		if (!j->restored &&
		    (j->rc = node__pub_source_fill(p, j->rank, j->version, j->block, &j->err)) != 0)
			return;
	}
	if ((j->rc = job_sources(j)) != 0)
		return;
	if (j->delta) {
		job_delta(j);
		return;
	}
	for (size_t i = 0; i < pt->nitems; i++)
		n += (pt->items[i].nchunks + STRIPE_CHUNKS - 1) / STRIPE_CHUNKS;
	g.st = calloc(PROTO_MAX(n, 1), sizeof(*g.st));
	g.maps = calloc(PROTO_MAX(pt->nitems, 1), sizeof(*g.maps));
	g.canary = calloc(PROTO_MAX(pt->nitems, 1), sizeof(*g.canary));
	if (g.st == NULL || g.maps == NULL || g.canary == NULL) {
		j->rc = -ENOMEM;
		proto_errf(&j->err, ENOMEM, "out of memory");
		goto out;
	}
	n = 0;
	for (size_t i = 0; i < pt->nitems; i++) {
		struct pub_item *it = &pt->items[i];
		for (uint32_t c = 0; c < it->nchunks; c += STRIPE_CHUNKS)
			g.st[n++] = (struct stripe){.item = (uint32_t)i, .c0 = c,
						    .c1 = PROTO_MIN(c + STRIPE_CHUNKS, it->nchunks)};
		g.maps[i] = proto_canary_map_new(&it->sl->plan, it->pc, &it->sl->layout);
	}
	proto_pool_for(n, j->threads, gather_stripe, &g);
	if (atomic_load(&p->abort))
		goto out;
	for (size_t i = 0; i < pt->nitems; i++) {
		struct pub_item *it = &pt->items[i];
		const uint8_t *pay = pt->buf + it->off;
		if (g.maps[i] == NULL) { /* out of memory for the map: in one pass */
			it->canary = proto_canary_parcel(&it->sl->plan, it->pc, &it->sl->layout, pay);
			continue;
		}
		it->canary = atomic_load(&g.canary[i]);
		for (uint32_t c = STRIPE_CHUNKS; c < it->nchunks; c += STRIPE_CHUNKS)
			it->canary += proto_canary_map_straddler(g.maps[i], (uint64_t)c * cs, pay);
	}
	if (j->sums)
		gather_sums(j);
out:
	for (size_t i = 0; g.maps != NULL && i < pt->nitems; i++)
		proto_canary_map_free(g.maps[i]);
	free(g.st);
	free(g.maps);
	free((void *)g.canary);
}

static void job_main(void *arg)
{
	struct pub_job *j = arg;

	if (j->kind == PUB_JOB_SNAPSHOT)
		job_snapshot(j);
	else
		job_gather(j);
	atomic_store(&j->done, true);
	/* A full socket means a wake-up is already pending. */
	if (send(j->p->wake[1], "", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
		LOG_WARN("publisher: waking the loop: %s", strerror(errno));
}

int node__pub_job_start(struct pub_job *j, enum pub_job_kind kind)
{
	int rc;

	j->kind = kind;
	atomic_store(&j->done, false);
	if ((rc = proto_pool_start(&j->task, job_main, j)) != 0)
		return rc;
	j->running = true;
	return 0;
}

void node__pub_job_join(struct pub_job *j)
{
	if (!j->running)
		return;
	proto_pool_join(&j->task);
	j->running = false;
}
