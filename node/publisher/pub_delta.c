/* The publisher's delta versions: the parent export, anchor or delta, encoding and placing. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/canary.h"
#include "proto/chunkhash.h"
#include "proto/delta.h"

void node__pub_parent_free(struct pub_parent *pp)
{
	if (pp == NULL)
		return;
	for (size_t i = 0; i < pp->nparts; i++) {
		if (pp->parts[i].block != NULL)
			node_serve_unmap(pp->parts[i].block, pp->parts[i].cap);
		for (size_t k = 0; k < pp->parts[i].nitems; k++)
			free(pp->parts[i].items[k].sums);
		free(pp->parts[i].items);
	}
	free(pp->parts);
	free(pp);
}

const char *node__pub_delta_why_anchor(struct node_pub *p, struct pub_export *ex)
{
	const struct pub_parent *pp = p->parent;

	if (p->anchor_every <= 1)
		return "every version is an anchor (anchor every 1)";
	if (p->nhosted != p->tl.nranks)
		return "the trainer ranks are hosted by several publishers";
	if (pp == NULL)
		return p->published == 0 ? "the first version this publisher exports"
					 : "no parent export (the last one was not kept)";
	if (pp->version + 1 != ex->version ||
	    memcmp(pp->digest, p->prev_digest, PROTO_HASH_BYTES) != 0)
		return "the parent export is not the latest version's";
	if (pp->since_anchor + 1 >= p->anchor_every) {
		snprintf(ex->why, sizeof(ex->why), "one anchor every %u versions", p->anchor_every);
		return ex->why;
	}
	/* The publisher serves the anchor and every delta after it (a node
	 * lacking the parent replays them): a chain that costs as much as the
	 * anchor is cut, which bounds what it keeps at twice the anchor. */
	if (pp->chain_wire >= pp->anchor_bytes)
		return "the deltas since the anchor add up to its size";
	if (p->anchor_wanted)
		return "a node asked for one (it lacks the parent)";
	if (p->delta_skip > 0) {
		snprintf(ex->why, sizeof(ex->why),
			 "the last delta tried did not pay (%u more anchors before the next try)",
			 p->delta_skip - 1);
		return ex->why;
	}
	return NULL;
}

bool node__pub_delta_link(struct node_pub *p, struct pub_export *ex)
{
	const struct pub_parent *pp = p->parent;

	for (size_t i = 0; i < ex->pv->nparts; i++) {
		struct pub_part *pt = &ex->pv->parts[i];
		const struct pub_praw *pr = NULL;
		for (size_t k = 0; k < pp->nparts; k++)
			if (pp->parts[k].rank == pt->rank)
				pr = &pp->parts[k];
		for (size_t j = 0; j < pt->nitems; j++) {
			struct pub_item *it = &pt->items[j];
			it->parent = NULL;
			it->parent_sums = NULL;
			/* An FP8 layout's parent is its quantized source's. */
			const uint8_t *pb = it->sl->q != NULL ? node__pub_q_block(it->sl->q, pp->version)
							      : pr != NULL ? pr->block : NULL;
			for (size_t k = 0; pr != NULL && k < pr->nitems; k++) {
				const struct pub_pitem *q = &pr->items[k];
				if (q->src == it->pc->src_rank && q->dst == it->pc->dst_rank &&
				    q->bytes == it->pc->bytes && pb != NULL &&
				    memcmp(q->layout, it->sl->digest, PROTO_HASH_BYTES) == 0) {
					it->parent = pb;
					it->parent_canary = q->canary;
					it->parent_sums = q->sums;
				}
			}
			if (it->parent == NULL && it->pc->bytes > 0)
				return false;
		}
	}
	return true;
}

/*
 * How many changed elements a parcel's delta may have before encoding
 * stops (0: no limit). Encoding a dense change costs seconds per GiB and
 * its result is refused anyway (the synthetic fixture's versions are
 * unrelated random bytes), so the encoder's scan, which counts the changes
 * anyway, stops it once more than twice TESSERA_DELTA_MAX_PERCENT of the
 * elements changed (no sampling pass of its own). At the default 50 % that
 * is every element: no limit, and a dense child is encoded whole.
 */
static uint64_t max_changed(const struct proto_dparcel *dp)
{
	uint64_t pct = 2 * proto_param(PROTO_PARAM_DELTA_MAX_PERCENT), n = 0;

	if (pct >= 100)
		return 0;
	for (uint32_t i = 0; i < dp->npieces; i++)
		n += dp->pieces[i].len / dp->pieces[i].elsize;
	return PROTO_MAX(n / 100 * pct + n % 100 * pct / 100, 1);
}

/* What the encoder's callbacks of one parcel share: its canary part from
 * the changes, and where each stretch of its pieces lies in the snapshots. */
struct enc_ctx {
	const struct node_pub *p;
	const struct pub_item *it;
	const struct proto_dparcel *dp;
	const struct proto_canary_map *map;
	const uint8_t *block, *parent; /* the version's and the parent's snapshots */
	_Atomic uint64_t sum;          /* wrapping, like the score */
	_Atomic uint64_t in_place;     /* bytes read where they lie */
	const uint8_t *scales;         /* per piece: an FP8 layout's scales; NULL: none */
	_Atomic uint64_t changed_scales;
};

static void on_changes(void *arg, uint32_t t, uint64_t base, const uint32_t *pos, size_t k,
		       const uint8_t *parent, const uint8_t *child)
{
	struct enc_ctx *c = arg;
	const struct proto_dpiece *pp = &c->dp->pieces[t];

	atomic_fetch_add(&c->sum, proto_canary_map_changes(c->map, pp->pay_off + base * pp->elsize,
							   pp->elsize, pos, k, parent, child));
	if (c->scales != NULL && c->scales[t])
		atomic_fetch_add(&c->changed_scales, k);
}

/* Which of dp's pieces are an FP8 layout's scales (the destination local
 * holding each; locals lie in offset order). NULL: none, or no memory
 * (then the scales are counted with the values). */
static uint8_t *scale_pieces(const struct pub_item *it, const struct proto_dparcel *dp,
			     uint64_t *elems)
{
	const struct proto_rank *rk = &it->sl->layout.ranks[it->pc->dst_rank];
	uint8_t *v;

	*elems = 0;
	if (it->sl->q == NULL || (v = calloc(dp->npieces + 1, 1)) == NULL)
		return NULL;
	for (uint32_t t = 0; t < dp->npieces; t++) {
		uint32_t lo = 0, hi = rk->nlocals;
		while (hi - lo > 1) { /* the last local starting at or before it */
			uint32_t mid = (lo + hi) / 2;
			if (rk->locals[mid].offset <= dp->pieces[t].dst_off)
				lo = mid;
			else
				hi = mid;
		}
		v[t] = rk->nlocals > 0 && rk->locals[lo].scales;
		*elems += v[t] ? dp->pieces[t].len / dp->pieces[t].elsize : 0;
	}
	return v;
}

/* Where a stretch lies in the source rank's memory: at is its first byte's
 * offset while the spans follow each other; ok false once one does not. */
struct src_run {
	uint64_t at, end;
	bool any, ok;
};

static void src_span(void *arg, uint64_t at, uint64_t n)
{
	struct src_run *r = arg;

	if (!r->any)
		r->at = r->end = at;
	r->ok &= !r->any || at == r->end;
	r->any = true;
	r->end = at + n;
}

/*
 * The encoder asks where a stretch of a piece lies (proto/delta.h's
 * locate): where it is one stretch of the source rank's memory, which it
 * nearly always is (a piece is runs adjacent in payload and destination:
 * several tensors, whose shards lie apart in the trainer rank, or a
 * column shard's rows, apart in a row-split one; a stretch of 2^15
 * elements is mostly inside one run), the scan reads both snapshots there;
 * else the stretch of each is gathered into the thread's room, in cache,
 * right before the scan reads it.
 */
static void on_locate(void *arg, uint32_t t, uint64_t base, uint64_t n, uint8_t *room,
		      const uint8_t **a, const uint8_t **b)
{
	struct enc_ctx *c = arg;
	const struct pub_item *it = c->it;
	const struct proto_dpiece *pp = &c->dp->pieces[t];
	uint64_t off = pp->pay_off + base * pp->elsize, len = n * pp->elsize;
	struct src_run sr = {.ok = true};

	proto_parcel_src_spans(&it->sl->plan, it->pc, it->sl->src, off, len, src_span, &sr);
	if (sr.ok && sr.any && sr.end - sr.at == len) {
		*a = c->parent + sr.at;
		*b = c->block + sr.at;
		atomic_fetch_add(&c->in_place, len);
		return;
	}
	proto_parcel_gather(&it->sl->plan, it->pc, it->sl->src, c->block, off, len, room);
	proto_parcel_gather(&it->sl->plan, it->pc, it->sl->src, c->parent, off, len, room + len);
	*b = room;
	*a = room + len;
}

unsigned node__pub_delta_threads(size_t nranks)
{
	uint64_t n = proto_param(PROTO_PARAM_DELTA_THREADS);
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	if (n == 0)
		n = (uint64_t)PROTO_MAX(1, ncpu) / PROTO_MAX(nranks, 1);
	return (unsigned)PROTO_MAX(1, PROTO_MIN(n, 8u));
}

void node__pub_delta_encode_item(struct node_pub *p, struct pub_item *it, uint32_t chunk_size,
				 unsigned threads, const uint8_t *block,
				 struct proto_delta_scratch **keep, struct proto_delta_budget *budget)
{
	struct proto_dparcel dp;
	struct proto_delta_stats st;
	struct proto_delta_opts o = {.threads = threads, .parent_sums = it->parent_sums,
				     .keep = keep, .budget = budget};
	struct enc_ctx cn = {.p = p, .it = it, .dp = &dp, .block = block, .parent = it->parent,
			     .sum = 0, .in_place = 0};
	const uint8_t **pd = NULL, **cd = NULL;
	struct proto_canary_map *map = NULL;
	struct proto_err err = {{0}};
	size_t len = 0;

	free(it->hash);
	it->hash = NULL;
	free(it->sums);
	it->sums = NULL;
	it->nchunks = 0;
	it->wire = 0;
	it->in_place = 0;
	if (it->pc->bytes == 0) {
		it->canary = 0;
		return;
	}
	/* Another parcel's output passed the version's budget: none is sent. */
	if (budget != NULL && atomic_load(&budget->over)) {
		it->enc_rc = -E2BIG;
		goto done;
	}
	it->enc_rc = proto_dparcel_build(&p->model, &it->sl->plan, it->pc, &it->sl->layout, &dp,
					 &err);
	if (it->enc_rc != 0)
		goto done;
	it->elems = 0;
	for (uint32_t i = 0; i < dp.npieces; i++)
		it->elems += dp.pieces[i].len / dp.pieces[i].elsize;
	cn.scales = scale_pieces(it, &dp, &it->scale_elems);
	/* Kept for the next version's encode against this one: its parent
	 * sums (no sums on out of memory: summed there). */
	it->sums = calloc(PROTO_MAX(dp.npieces, 1), sizeof(*it->sums));
	/* Every piece is read where on_locate says; data[] is only the base
	 * its offsets stay inside (a piece is at most the rank's bytes). */
	pd = calloc((size_t)dp.npieces + 1, sizeof(*pd));
	cd = calloc((size_t)dp.npieces + 1, sizeof(*cd));
	/* The canary part follows the scan's changes: without its map the
	 * parcel has no payload to compare, and goes as an anchor. */
	map = proto_canary_map_new(&it->sl->plan, it->pc, &it->sl->layout);
	if (pd == NULL || cd == NULL || map == NULL) {
		it->enc_rc = proto_errf(&err, ENOMEM, "out of memory");
	} else {
		for (uint32_t i = 0; i < dp.npieces; i++) {
			pd[i] = it->parent;
			cd[i] = block;
		}
		cn.map = map;
		o.child_sums = it->sums;
		o.max_changed = max_changed(&dp);
		o.on_changes = on_changes;
		o.changes_arg = &cn;
		o.locate = on_locate;
		o.locate_arg = &cn;
		it->enc_rc = proto_dparcel_encode_at(&dp, pd, cd, &o, &it->enc, &len, &st, &err);
	}
	free(pd);
	free(cd);
	free((void *)cn.scales);
	it->changed_scales = atomic_load(&cn.changed_scales);
	proto_dparcel_fini(&dp);
	proto_canary_map_free(map);
	it->canary = it->parent_canary + atomic_load(&cn.sum);
	it->in_place = atomic_load(&cn.in_place);
done:
	if (it->enc_rc == -E2BIG) {
		free(it->sums);
		it->sums = NULL;
		it->enc_rc = 0;
		it->wire = it->pc->bytes; /* as the anchor: place() refuses it */
		/* Past the budget (this parcel's output or another's), or more
		 * elements changed than max_changed: then the other parcels
		 * stop too, the version goes as an anchor anyway. */
		it->stopped = budget != NULL && atomic_load(&budget->over);
		it->dense = !it->stopped;
		if (budget != NULL)
			atomic_store(&budget->over, true);
		return;
	}
	if (it->enc_rc != 0) {
		free(it->sums);
		it->sums = NULL;
		LOG_WARN("version parcel %u->%u: delta encoding failed: %s", it->pc->src_rank,
			 it->pc->dst_rank, err.msg);
		return;
	}
	it->wire = len;
	it->changed = st.nchanged;
	it->nchunks = (uint32_t)((len + chunk_size - 1) / chunk_size);
	it->hash = calloc(PROTO_MAX(it->nchunks, 1), PROTO_HASH_BYTES);
	if (it->hash == NULL) {
		it->enc_rc = -ENOMEM;
		return;
	}
	for (uint32_t c = 0; c < it->nchunks; c++) {
		uint64_t c0 = (uint64_t)c * chunk_size;
		proto_chunk_hash(it->hash[c], it->enc + c0, PROTO_MIN((uint64_t)chunk_size, len - c0));
	}
}

/* The deltas are not sent: each item goes back to its raw payload. */
static void back_to_raw(struct pub_export *ex)
{
	for (size_t i = 0; i < ex->pv->nparts; i++) {
		struct pub_part *pt = &ex->pv->parts[i];
		for (size_t j = 0; j < pt->nitems; j++) {
			struct pub_item *it = &pt->items[j];
			free(it->enc);
			it->enc = NULL;
			it->wire = it->pc->bytes;
		}
	}
}

/* The version's raw bytes: what its parcels weigh as an anchor. */
static uint64_t raw_bytes(const struct pub_export *ex)
{
	uint64_t raw = 0;

	for (size_t i = 0; i < ex->pv->nparts; i++)
		for (size_t j = 0; j < ex->pv->parts[i].nitems; j++)
			raw += ex->pv->parts[i].items[j].pc->bytes;
	return raw;
}

/*
 * A delta that cannot pay is not encoded to the end: its budget is
 * TESSERA_DELTA_MAX_PERCENT of the version's raw bytes, which the encodes
 * of all its parcels share, on every thread; once their coded bytes pass
 * it they all stop and the version goes as an anchor. An update that
 * changes the whole model then costs the encode of about that share of
 * it, not all of it.
 */
void node__pub_delta_begin(struct pub_export *ex)
{
	uint64_t raw = raw_bytes(ex), pct = proto_param(PROTO_PARAM_DELTA_MAX_PERCENT);

	memset(&ex->budget, 0, sizeof(ex->budget));
	ex->budget.limit = raw / 100 * pct + raw % 100 * pct / 100;
	ex->delta_tried = true;
}

static double mib(uint64_t b)
{
	return (double)b / (1024.0 * 1024.0);
}

/* The delta's density by layout: an FP8 layout's (changed FP8 values and
 * scales) beside the BF16 ones' of the same step. */
static void log_density(const struct pub_export *ex)
{
	char line[1024];
	int n = 0;

	for (size_t li = 0; li < ex->nlayouts && n < (int)sizeof(line) - 160; li++) {
		uint64_t changed = 0, elems = 0, wire = 0, sc = 0, se = 0;
		char hex[2 * PROTO_HASH_BYTES + 1];
		sodium_bin2hex(hex, sizeof(hex), ex->layouts[li]->digest, PROTO_HASH_BYTES);
		for (size_t i = 0; i < ex->pv->nparts; i++)
			for (size_t j = 0; j < ex->pv->parts[i].nitems; j++) {
				const struct pub_item *it = &ex->pv->parts[i].items[j];
				if (it->li != li)
					continue;
				changed += it->changed;
				elems += it->elems;
				wire += it->wire;
				sc += it->changed_scales;
				se += it->scale_elems;
			}
		n += snprintf(line + n, sizeof(line) - (size_t)n,
			      "%s layout %.8s (%s): %.3f %% of %llu %s changed", li ? ";" : "", hex,
			      ex->layouts[li]->q != NULL ? "fp8" : "as trained",
			      elems > se ? 100.0 * (double)(changed - sc) / (double)(elems - se) : 0.0,
			      (unsigned long long)(elems - se), se ? "values" : "elements");
		if (se > 0)
			n += snprintf(line + n, sizeof(line) - (size_t)n, ", %.3f %% of %llu scales",
				      100.0 * (double)sc / (double)se, (unsigned long long)se);
		n += snprintf(line + n, sizeof(line) - (size_t)n, ", %.1f KiB", (double)wire / 1024.0);
	}
	LOG_INFO("version %llu: its delta by layout:%s", (unsigned long long)ex->version, line);
}

int node__pub_delta_place(struct node_pub *p, struct pub_export *ex, struct proto_err *err)
{
	uint64_t wire = 0, raw = raw_bytes(ex), pct = proto_param(PROTO_PARAM_DELTA_MAX_PERCENT);
	uint64_t in = atomic_load(&ex->budget.in), out = atomic_load(&ex->budget.out);
	bool failed = false, dense = false, stopped = false;

	for (size_t i = 0; i < ex->pv->nparts; i++)
		for (size_t j = 0; j < ex->pv->parts[i].nitems; j++) {
			const struct pub_item *it = &ex->pv->parts[i].items[j];
			failed |= it->enc_rc != 0;
			dense |= it->dense;
			stopped |= it->stopped;
			wire += it->wire;
		}
	ex->raw_bytes = raw;
	ex->delta_stopped = !failed && (dense || stopped);
	/* Its size as a percent of the anchor: where it stopped, else whole. */
	ex->delta_percent = raw == 0 ? 0.0 : 100.0 * (double)(failed || dense || stopped ? out : wire) /
						     (double)raw;
	if (failed || dense || stopped || wire * 100 > raw * pct) {
		if (failed)
			snprintf(ex->delta_why, sizeof(ex->delta_why),
				 "a parcel's delta could not be encoded");
		else if (dense)
			snprintf(ex->delta_why, sizeof(ex->delta_why),
				 "a parcel changed too much for a delta (more than 2 x %llu %% of its "
				 "elements, counted while encoding)", (unsigned long long)pct);
		else if (stopped)
			snprintf(ex->delta_why, sizeof(ex->delta_why),
				 "its output passed %llu %% of the anchor after encoding %.1f of %.1f MiB "
				 "(%.0f %%)", (unsigned long long)pct, mib(in), mib(raw),
				 raw ? 100.0 * (double)in / (double)raw : 0.0);
		else
			snprintf(ex->delta_why, sizeof(ex->delta_why),
				 "it was %.1f %% of the anchor, more than %llu %% "
				 "(TESSERA_DELTA_MAX_PERCENT)", ex->delta_percent, (unsigned long long)pct);
		snprintf(ex->why, sizeof(ex->why), "%s", ex->delta_why);
		back_to_raw(ex);
		ex->delta = false;
		return 1;
	}
	snprintf(ex->delta_why, sizeof(ex->delta_why),
		 "it is %.1f %% of the anchor, at most %llu %% (TESSERA_DELTA_MAX_PERCENT)",
		 ex->delta_percent, (unsigned long long)pct);
	log_density(ex);
	for (size_t i = 0; i < ex->pv->nparts; i++) {
		struct pub_part *pt = &ex->pv->parts[i];
		node__pub_part_layout(pt, ex->nlayouts);
		if (node__pub_part_alloc(p, pt) != 0)
			return proto_errf(err, ENOMEM, "cannot map a %llu-byte export buffer for rank %u",
					  (unsigned long long)node__pub_page_round(pt->used), pt->rank);
		for (size_t j = 0; j < pt->nitems; j++) {
			struct pub_item *it = &pt->items[j];
			if (it->enc != NULL)
				memcpy(pt->buf + it->off, it->enc, it->wire);
			free(it->enc);
			it->enc = NULL;
		}
	}
	return 0;
}

void node__pub_parent_stage(struct node_pub *p, struct pub_export *ex)
{
	struct pub_parent *pp = calloc(1, sizeof(*pp));
	struct pub_version *pv = ex->pv;

	if (pp == NULL || (pp->parts = calloc(PROTO_MAX(pv->nparts, 1), sizeof(*pp->parts))) == NULL)
		goto fail;
	for (size_t i = 0; i < pv->nparts; i++)
		if (pv->parts[i].rank >= p->tl.nranks || p->blocks[pv->parts[i].rank] == NULL)
			goto fail;
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		struct pub_praw *pr = &pp->parts[pp->nparts];
		pr->items = calloc(PROTO_MAX(pt->nitems, 1), sizeof(*pr->items));
		if (pr->items == NULL)
			goto fail;
		pp->nparts++;
		pr->rank = pt->rank;
		for (size_t j = 0; j < pt->nitems; j++) {
			struct pub_item *it = &pt->items[j];
			struct pub_pitem *q = &pr->items[pr->nitems++];
			memcpy(q->layout, it->sl->digest, PROTO_HASH_BYTES);
			q->src = it->pc->src_rank;
			q->dst = it->pc->dst_rank;
			q->bytes = it->pc->bytes;
			q->canary = it->canary;
			q->sums = it->sums; /* moves: the snapshot they sum moves too */
			it->sums = NULL;
		}
		/* The snapshot is the parent now: the next one is taken into
		 * the block the parent before it gives back (at the commit). */
		pr->block = p->blocks[pt->rank];
		pr->cap = p->block_cap[pt->rank];
		p->blocks[pt->rank] = NULL;
		p->block_cap[pt->rank] = 0;
	}
	pp->version = ex->version;
	pp->since_anchor = ex->delta ? ex->since_anchor : 0;
	pp->anchor_bytes = ex->delta && p->parent != NULL ? p->parent->anchor_bytes : ex->raw_bytes;
	if (ex->delta && p->parent != NULL) {
		pp->chain_wire = p->parent->chain_wire;
		for (size_t i = 0; i < pv->nparts; i++)
			for (size_t j = 0; j < pv->parts[i].nitems; j++)
				pp->chain_wire += pv->parts[i].items[j].wire;
	}
	node__pub_parent_free(ex->next_parent);
	ex->next_parent = pp;
	return;
fail:
	node__pub_parent_free(pp);
}

uint8_t *node__pub_parent_block(const struct node_pub *p, uint64_t v, uint32_t rank)
{
	for (size_t i = 0; p->parent != NULL && p->parent->version == v && i < p->parent->nparts;
	     i++)
		if (p->parent->parts[i].rank == rank && p->parent->parts[i].cap >= p->tl.ranks[rank].nbytes)
			return p->parent->parts[i].block;
	return NULL;
}

void node__pub_parent_commit(struct node_pub *p, struct pub_export *ex)
{
	if (!ex->delta)
		p->anchor_wanted = false;
	/* The parent before this one is no longer encoded against: its
	 * blocks take the next snapshots. */
	for (size_t i = 0; p->parent != NULL && i < p->parent->nparts; i++) {
		struct pub_praw *pr = &p->parent->parts[i];
		if (pr->rank < p->tl.nranks && p->blocks[pr->rank] == NULL &&
		    pr->cap >= p->tl.ranks[pr->rank].nbytes) {
			p->blocks[pr->rank] = pr->block;
			p->block_cap[pr->rank] = pr->cap;
			pr->block = NULL;
		}
	}
	node__pub_parent_free(p->parent);
	p->parent = ex->next_parent;
	ex->next_parent = NULL;
	if (p->parent != NULL)
		memcpy(p->parent->digest, ex->m.digest, PROTO_HASH_BYTES);
	/* After an anchor: no blocks were given back. */
	node__pub_prefault_start(p, ex->version + 1);
}
