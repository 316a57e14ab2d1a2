/* The export's workers: one job per trainer rank on the worker pool (snapshot, gather, encode). */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "proto/canary.h"
#include "proto/chunkhash.h"
#include "proto/delta.h"

#define HASH_STEP (256u << 10) /* gather then hash this much while in cache */

static void job_snapshot(struct pub_job *j)
{
	j->rc = node__pub_source_fill(j->p, j->rank, j->version, j->block, &j->err);
}

/*
 * The snapshot is given back while the gather goes: each RELEASE_UNIT of it
 * is unmapped from memory (MADV_DONTNEED) as soon as the gather has passed
 * the last payload byte read from it, so the snapshot shrinks while the
 * export buffer grows instead of both being whole at the end. A unit's key
 * is that position: (item << 40) | payload end.
 */
struct release {
	uint64_t *key;   /* per unit */
	uint32_t *order; /* units by key */
	size_t n, next;  /* next: first unit not given back yet */
};

#define RELEASE_UNIT (2u << 20) /* one huge page */
#define KEY(item, end) (((uint64_t)(item) << 40) | (end))

static int unit_cmp(const void *a, const void *b, void *keys)
{
	const uint64_t *k = keys;
	uint64_t x = k[*(const uint32_t *)a], y = k[*(const uint32_t *)b];
	return x < y ? -1 : x > y;
}

/* Plans the release of j's snapshot; false (nothing released early) when
 * out of memory. */
static bool release_plan(struct pub_job *j, struct release *r)
{
	const struct node_pub *p = j->p;
	const struct pub_part *pt = j->part;
	const struct proto_rank *rk = &p->tl.ranks[j->rank];

	r->n = (p->block_cap[j->rank] + RELEASE_UNIT - 1) / RELEASE_UNIT;
	r->next = 0;
	r->key = calloc(PROTO_MAX(r->n, 1), sizeof(*r->key));
	r->order = calloc(PROTO_MAX(r->n, 1), sizeof(*r->order));
	if (r->key == NULL || r->order == NULL)
		return false;
	for (size_t i = 0; i < pt->nitems; i++) {
		const struct pub_item *it = &pt->items[i];
		const struct proto_plan *pl = &it->sl->plan;
		for (uint64_t s = it->pc->seg0; s < it->pc->seg0 + it->pc->nsegs; s++) {
			const struct proto_segment *sg = &pl->segs[s];
			uint64_t base = rk->locals[sg->src_local].offset;
			for (uint64_t k = sg->run0; k < sg->run0 + sg->nruns; k++) {
				const struct proto_run *ru = &pl->runs[k];
				uint64_t key = KEY(i, ru->pay_off + ru->len);
				if (ru->len == 0)
					continue;
				for (uint64_t u = (base + ru->src_off) / RELEASE_UNIT;
				     u <= (base + ru->src_off + ru->len - 1) / RELEASE_UNIT && u < r->n; u++)
					r->key[u] = PROTO_MAX(r->key[u], key);
			}
		}
	}
	for (size_t u = 0; u < r->n; u++)
		r->order[u] = (uint32_t)u;
	qsort_r(r->order, r->n, sizeof(*r->order), unit_cmp, r->key);
	return true;
}

/* Gives back every unit no read at or after pos needs. */
static void release_upto(struct pub_job *j, struct release *r, uint64_t pos)
{
	size_t cap = j->p->block_cap[j->rank];

	while (r->next < r->n && r->key[r->order[r->next]] <= pos) {
		uint64_t u = r->order[r->next++], off = u * RELEASE_UNIT;
		(void)madvise(j->block + off, PROTO_MIN(RELEASE_UNIT, cap - off), MADV_DONTNEED);
	}
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
		node__pub_delta_encode_item(j->p, &pt->items[i], j->chunk_size, j->threads, j->block,
					    &j->scratch);
	proto_delta_scratch_free(j->scratch);
	j->scratch = NULL;
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

/* Gathers each chunk in cache-sized steps and hashes it as it goes, giving
 * the snapshot back behind it. */
static void job_gather(struct pub_job *j)
{
	struct node_pub *p = j->p;
	struct pub_part *pt = j->part;
	uint64_t cs = j->chunk_size;
	struct release rel = {0};

	j->encode_ns = 0;
	if (j->restore && !j->restored) {
		j->restored = p->trainer && j->nrs > 0 &&
			      node__pub_restore(p, j->rank, j->rs, j->nrs, pt, j->block,
						 p->block_cap[j->rank]);
		if (!j->restored &&
		    (j->rc = node__pub_source_fill(p, j->rank, j->version, j->block, &j->err)) != 0)
			return;
	}
	if (j->delta) {
		job_delta(j);
		return;
	}
	/* A publisher that keeps parents keeps its snapshot blocks too, so
	 * that the next snapshot writes into pages already there. */
	bool early = !node__pub_keeps_parent(p) && release_plan(j, &rel);

	/* An anchor gathers into the export buffer and hashes (the snapshot
	 * is the next delta's parent). */
	for (size_t i = 0; i < pt->nitems && !atomic_load(&p->abort); i++) {
		struct pub_item *it = &pt->items[i];
		uint64_t bytes = it->pc->bytes;
		struct proto_dparcel dp;
		struct proto_dparcel_summer su;
		bool sums = j->sums && item_sums_start(p, it, &dp, &su);
		for (uint32_t c = 0; c < it->nchunks && !atomic_load(&p->abort); c++) {
			uint64_t c0 = (uint64_t)c * cs, clen = PROTO_MIN(cs, bytes - c0);
			struct proto_chunk_hasher st;
			proto_chunk_hash_init(&st);
			for (uint64_t o = 0; o < clen; o += HASH_STEP) {
				uint64_t n = PROTO_MIN(HASH_STEP, clen - o);
				uint8_t *dst = pt->buf + it->off + c0 + o;
				proto_parcel_gather(&it->sl->plan, it->pc, &p->tl, j->block, c0 + o, n, dst);
				proto_chunk_hash_update(&st, dst, n);
				if (sums)
					proto_dparcel_summer_feed(&su, pt->buf + it->off, c0 + o + n);
			}
			proto_chunk_hash_final(&st, it->hash[c]);
			if (early)
				release_upto(j, &rel, KEY(i, c0 + clen));
		}
		if (!atomic_load(&p->abort))
			it->canary = proto_canary_parcel(&it->sl->plan, it->pc, &it->sl->layout,
							 pt->buf + it->off);
		if (sums && (atomic_load(&p->abort) || su.k < dp.npieces)) {
			free(it->sums); /* cut short: the delta sums its parent */
			it->sums = NULL;
		}
		if (sums)
			proto_dparcel_fini(&dp);
	}
	free(rel.key);
	free(rel.order);
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
