/* The read pool: reads posted to publishers and peers, landed, hashed by
 * the verifier's workers, and the verdict on each chunk; a chunk's state
 * as our have-page shows it; the start-up timeline. */
#include "node/fetch/fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* A read completed: failures are retried elsewhere, data goes to a worker
 * to be hashed and scattered (on_verified picks it up). */
static void startup_log(const struct fetcher *x, const struct fetch *f);
static void verify_on_workers(struct fetcher *x, struct fetch *f, struct fetch_parcel *p,
			      struct fetch_read *rd);
static uint32_t chunk_spans(const struct fetcher *x, const struct fetch *f,
			    const struct fetch_parcel *p, uint32_t c,
			    struct proto_span sp[GATHER_RANGES]);

static void on_read(struct fab_op *op, int status)
{
	struct fetch_read *rd = proto_container_of(op, struct fetch_read, op);
	struct fetcher *x = rd->x;
	uint32_t first = rd->slot, n = PROTO_MAX(rd->run, 1u);

	/* Each chunk of the read lands as its own (a landing may post reads:
	 * they take only free slots, and these stay busy until they land). */
	for (uint32_t k = 0; k < n; k++)
		fetch_read_landed(&x->reads[first + k], status);
}

/* On a verification worker: the chunk is in the host slot; the CUDA store
 * uploads it now, while the network brings the next ones. */
static void chunk_placed(struct node_vjob *job, void *arg)
{
	struct fetcher *x = arg;
	struct fetch_read *rd = proto_container_of(job, struct fetch_read, job);

	node_slot_stream_chunk(x->o.store, rd->vslot, job->plan, job->parcel, job->layout, job->off,
			       job->buf, job->len);
}

void fetch_read_landed(struct fetch_read *rd, int status)
{
	struct fetcher *x = rd->x;
	struct fetch *f = x->f;

	x->inflight--;
	rd->in_fabric = false;
	if (rd->hp != NULL) /* the host's record, whatever became of the fetch */
		fetch_source_done(rd->hp, rd->len, status == 0);
	if (f != NULL && rd->gen == x->gen && fetch_read_source(f, rd) != NULL)
		fetch_source_done(fetch_read_source(f, rd), rd->len, status == 0);
	if (rd->abandoned || f == NULL || rd->gen != x->gen) {
		/* Moved elsewhere (its chunk was put back then): what it brought
		 * came twice. */
		if (rd->abandoned && status == 0 && f != NULL && rd->gen == x->gen) {
			f->duplicate += rd->len;
			proto_metrics_add(x->o.am->m, x->o.am->duplicate, rd->len);
		}
		rd->abandoned = false;
		rd->busy = false;
		fetch_pump(x);
		return;
	}
	struct fetch_parcel *p = &f->parcels[rd->parcel];

	p->nlive[rd->chunk]--;
	if (status == 0 && p->state[rd->chunk] != CHUNK_READING) {
		/* Another read of it (endgame) came first: a duplicate. */
		f->duplicate += rd->len;
		proto_metrics_add(x->o.am->m, x->o.am->duplicate, rd->len);
		rd->busy = false;
		fetch_pump(x);
		return;
	}
	if (status != 0) {
		LOG_DEBUG("node %s: chunk %u/%u of parcel %u<-%u failed: %d", x->o.id, rd->chunk,
			  p->mp->nchunks, p->mp->dst_rank, p->mp->src_rank, status);
		f->read_failures++;
		proto_metrics_add(x->o.am->m, x->o.am->failed_read, 1);
		rd->busy = false;
		fetch_source_failed(x, fetch_read_source(f, rd));
		fetch_chunk_idle(p, rd->chunk);
		fetch_pump(x);
		return;
	}
	p->state[rd->chunk] = CHUNK_VERIFYING;
	f->last_byte_ms = proto_wall_ms();
	if (f->first_byte_ms == 0) {
		f->first_byte_ms = f->last_byte_ms;
		startup_log(x, f);
	}
	if (x->o.tx != NULL)
		x->o.tx->verify(x->o.tx->ctx, x, rd);
	else
		verify_on_workers(x, f, p, rd);
	fetch_pump(x);
}

/* Hands rd's landed chunk of p to the verifier's workers: hashed, then
 * scattered into the slot (or kept in the delta's wire) and copied after
 * the have-page when served from there. */
static void verify_on_workers(struct fetcher *x, struct fetch *f, struct fetch_parcel *p,
			      struct fetch_read *rd)
{
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];

	rd->job = (struct node_vjob){
		.buf = x->bounce + (size_t)rd->slot * x->chunk_size,
		.len = c->size,
		.hash = c->hash,
		.plan = f->plan,
		.parcel = p->wire != NULL ? NULL : p->pp, /* a delta's bytes are kept, not scattered */
		.layout = x->o.layout,
		.dst = p->wire != NULL ? p->wire : f->slot->host,
		.by_fd = p->wire == NULL && f->slot->memfd >= 0, /* see node_vjob */
		.dst_fd = p->wire == NULL ? f->slot->memfd : -1, /* an in-place delta: no slot */
		.off = (uint64_t)rd->chunk * f->man.chunk_size,
		.keep = fetch_chunk_copied(x, f, p, rd->chunk)
				? p->held + p->head + (size_t)rd->chunk * f->man.chunk_size
				: NULL, /* served from the slot: the scatter is the only copy */
		.placed = p->wire == NULL && __atomic_load_n(&f->slot->streaming, __ATOMIC_RELAXED)
				  ? chunk_placed
				  : NULL,
		.placed_arg = x,
	};
	rd->vslot = f->slot;
	node_verifier_submit(x->verifier, &rd->job);
}

/* Back on the loop from a verifier's worker: the verdict on one chunk. */
static void on_verified(struct node_vjob *job, void *arg)
{
	fetch_read_verified(proto_container_of(job, struct fetch_read, job), job->ok);
}

void fetch_read_verified(struct fetch_read *rd, bool ok)
{
	struct fetcher *x = rd->x;
	struct fetch *f = x->f;

	rd->busy = false;
	if (f == NULL || rd->gen != x->gen) {
		fetch_pump(x);
		return;
	}
	struct fetch_parcel *p = &f->parcels[rd->parcel];
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];
	if (!ok) {
		/* Never trust the bytes: discard, set the source aside, refetch. */
		proto_log(f->bad_chunks++ == 0 ? PROTO_LOG_WARN : PROTO_LOG_DEBUG, __FILE__, __LINE__,
			  "node %s: v%" PRIu64 " chunk %u of parcel %u<-%u from %s failed its hash; "
			  "discarded (further ones are counted)",
			  x->o.id, f->version, rd->chunk, p->mp->dst_rank, p->mp->src_rank,
			  rd->src_id);
		proto_metrics_add(x->o.am->m, x->o.am->failed_hash, 1);
		/* A peer is counted towards its ban, not rested: it answers,
		 * what it sends is the question. */
		if (!rd->src_peer)
			fetch_source_failed(x, fetch_read_source(f, rd));
		if (rd->src_peer && fetch_bad_peer(x, f, rd->src_id) && x->o.hooks.banned != NULL)
			x->o.hooks.banned(x->o.hooks.agent); /* the state report says whom */
		p->state[rd->chunk] = p->nlive[rd->chunk] > 0 ? CHUNK_READING : CHUNK_TODO;
		if (p->state[rd->chunk] == CHUNK_TODO)
			fetch_mark(p, rd->chunk, FETCH_MARK_NONE);
		fetch_pump(x);
		return;
	}
	if (fetch_chunk_copied(x, f, p, rd->chunk) && proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0)
		p->held[p->head + (size_t)rd->chunk * f->man.chunk_size] ^= 0x5a; /* test only */
	fetch_mark(p, rd->chunk, FETCH_MARK_HAVE);
	proto_metrics_add(x->o.am->m, rd->src_peer ? x->o.am->fetched_peer : x->o.am->fetched_trainer,
			  c->size);
	if (rd->gathered)
		proto_metrics_add(x->o.am->m, x->o.am->fetched_peer_slot, c->size);
	p->state[rd->chunk] = CHUNK_DONE;
	p->progress_ms = node_now_ms();
	LOG_DEBUG("node %s: v%" PRIu64 " chunk %u of parcel %u<-%u verified, from %s", x->o.id,
		  f->version, rd->chunk, p->mp->dst_rank, p->mp->src_rank, rd->src_id);
	/* The partial slot's have-map for other layouts; the swarm's chase. */
	if (x->o.hooks.chunk_verified != NULL)
		x->o.hooks.chunk_verified(x->o.hooks.swarm, rd->parcel, rd->chunk);
	p->done++;
	f->bytes_done += c->size;
	if (rd->src_peer)
		f->from_peers += c->size;
	else
		f->from_trainer += c->size;
	if (rd->src_far) {
		f->from_other_sites += c->size;
		proto_metrics_add(x->o.am->m, x->o.am->fetched_far, c->size);
	}
	if (!rd->src_peer && x->fanout && !p->mine[rd->chunk])
		proto_metrics_add(x->o.am->m, x->o.am->unowned_trainer, c->size);
	if (f->bytes_done == f->bytes_total) {
		f->complete = true;
		if (x->o.hooks.complete != NULL)
			x->o.hooks.complete(x->o.hooks.agent);
		return;
	}
	if (f->delta && p->done == p->mp->nchunks && x->o.hooks.parcel_landed != NULL)
		x->o.hooks.parcel_landed(x->o.hooks.agent, rd->parcel);
	fetch_pump(x);
}

static bool take_tokens(struct fetcher *x, uint64_t n);

static int free_read_slot(struct fetcher *x)
{
	for (uint32_t i = 0; i < x->nreads; i++)
		if (!x->reads[i].busy)
			return (int)i;
	return -1;
}

/* The first of n free slots in a row (their bounce buffers make one), or -1. */
static int free_read_run(const struct fetcher *x, uint32_t n)
{
	for (uint32_t i = 0, k = 0; i < x->nreads; i++) {
		k = x->reads[i].busy ? 0 : k + 1;
		if (k == n)
			return (int)(i + 1 - n);
	}
	return -1;
}

uint32_t fetch_read_run(const struct fetcher *x, const struct fetch_parcel *p, uint32_t c,
			const struct fetch_source *s)
{
	const struct fetch *f = x->f;
	const struct fetch_source *ps = fetch_pace(s);
	uint64_t cs = f->man.chunk_size, win = fetch_source_window(x, s);
	uint64_t n = PROTO_MIN(proto_param(PROTO_PARAM_READ_CHUNKS), ps->rate / 1000 / cs);
	uint32_t k = 1;

	if (s->info.peer || cs != x->chunk_size || p->wire != NULL)
		return 1;
	uint64_t room = win > ps->inflight_bytes ? (win - ps->inflight_bytes) / cs : 0;
	room = PROTO_MIN(room, x->max_inflight > x->inflight ? x->max_inflight - x->inflight : 0);
	/* Reads land one by one: with the window half full or more, wait for
	 * room for a whole run rather than post one chunk per landing. */
	if (n > 1 && room < n && ps->inflight_bytes >= win / 2)
		return 0;
	n = PROTO_MIN(n, room);
	while (k < n && c + k < p->mp->nchunks && p->mp->chunks[c + k - 1].size == cs &&
	       p->state[c + k] == CHUNK_TODO && p->nlive[c + k] == 0 && p->mine[c + k] &&
	       p->avail[c + k] == 0 && !p->peer_busy[c + k])
		k++;
	return k;
}

/* Takes n bytes from the rate bucket; when it is short, arms a timer for
 * when it will have them and says no. */
static bool take_tokens(struct fetcher *x, uint64_t n)
{
	uint64_t now = proto_now_ns(), burst = PROTO_MAX(x->chunk_size, x->rate_bps / 10);

	if (x->rate_bps == 0)
		return true;
	x->tokens = PROTO_MIN(burst, x->tokens + (now - x->tokens_ns) * x->rate_bps / 1000000000ull);
	x->tokens_ns = now;
	if (x->tokens >= n) {
		x->tokens -= n;
		return true;
	}
	if (!evtimer_pending(x->rate_ev, NULL))
		node_arm(x->rate_ev, (n - x->tokens) * 1000 / x->rate_bps + 1);
	return false;
}

static void give_tokens(struct fetcher *x, uint64_t n)
{
	if (x->rate_bps != 0)
		x->tokens += n;
}

static void on_rate(evutil_socket_t fd, short what, void *arg)
{
	fetch_pump(arg);
}

int fetch_read_claim(struct fetcher *x, uint32_t len)
{
	int slot = free_read_slot(x);

	return slot < 0 || !take_tokens(x, len) ? -1 : slot;
}

void fetch_read_unclaim(struct fetcher *x, uint32_t len)
{
	give_tokens(x, len);
}

void fetch_read_started(struct fetcher *x, uint32_t pi, uint32_t c, uint32_t len)
{
	struct fetch *f = x->f;
	struct fetch_parcel *p = &f->parcels[pi];

	if (p->asked[c] && p->nlive[c] == 0)
		f->refetched += len;
	p->asked[c] = 1;
	x->inflight++;
	p->state[c] = CHUNK_READING;
	p->nlive[c]++;
	fetch_mark(p, c, FETCH_MARK_BUSY);
}

static void on_gather(struct fab_op *op, int status)
{
	struct fetch_gather *g = proto_container_of(op, struct fetch_gather, op);
	struct fetch_read *rd = g->rd;

	if (status != 0 && rd->gstatus == 0)
		rd->gstatus = status;
	if (--rd->gleft == 0)
		fetch_read_landed(rd, rd->gstatus);
}

/* Posts the read rd of a chunk from peer s. One its have-page says it
 * serves from its version slot (lying in at most the page's slot ranges,
 * and in at most GATHER_RANGES) is gathered from the chunk's spans there
 * (our layout is the peer's), in payload order, into rd's bounce slot: a
 * fab_readv per fab_rma_segs ranges; any other is read from after the
 * page. 0: rd lands once (fetch_read_landed); else nothing is out. */
static int post_peer(struct fetcher *x, struct fetch_read *rd, const struct fetch_source *s,
		     const struct fetch_parcel *p)
{
	struct fetch *f = x->f;
	struct proto_span sp[GATHER_RANGES];
	uint32_t n = s->slot_rk.len != 0 ? chunk_spans(x, f, p, rd->chunk, sp) : UINT32_MAX;
	struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
	uint32_t per = (uint32_t)fab_rma_segs(x->o.fab), nops = 0;
	size_t at = (size_t)rd->slot * x->chunk_size;

	if (n > s->slot_ranges)
		return fab_read(x->o.fab, &rd->op, x->bounce_mr, at, rd->len, s->fa, &rk,
				(uint64_t)rd->chunk * f->man.chunk_size, on_read);
	if (n == 0 || n > GATHER_RANGES)
		return -EMSGSIZE; /* more ranges than we gather */
	if (rd->g == NULL && (rd->g = malloc(sizeof(*rd->g))) == NULL)
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		rd->g->segs[i] = (struct fab_seg){sp[i].dst_off, sp[i].len};
	rd->gstatus = 0;
	rd->gathered = true;
	rd->gleft = (n + per - 1) / per;
	for (uint32_t i = 0; i < n; i += per, nops++) {
		uint32_t k = PROTO_MIN(per, n - i);
		rd->g->gops[nops].rd = rd;
		int rc = fab_readv(x->o.fab, &rd->g->gops[nops].op, x->bounce_mr, at, s->fa,
				   &s->slot_rk, rd->g->segs + i, k, on_gather);
		if (rc != 0 && nops == 0)
			return rc;
		if (rc != 0) { /* those out land, failed */
			rd->gstatus = rc;
			rd->gleft = nops; /* callbacks run only from fab_poll */
			return 0;
		}
		for (uint32_t j = 0; j < k; j++)
			at += rd->g->segs[i + j].len;
	}
	return 0;
}

int fetch_read_post(struct fetcher *x, uint32_t pi, uint32_t c, struct fetch_source *s)
{
	struct fetch *f = x->f;
	struct fetch_parcel *p = &f->parcels[pi];
	uint32_t n = fetch_read_run(x, p, c, s), len = 0;
	int slot = -1;

	if (n == 0)
		return -EAGAIN; /* a run waits for room */
	/* A run of n chunks in n slots in a row, else one chunk. */
	for (uint32_t k = 0; k < n; k++)
		len += p->mp->chunks[c + k].size;
	if (n > 1 && ((slot = free_read_run(x, n)) < 0 || !take_tokens(x, len)))
		slot = -1;
	if (slot < 0) {
		n = 1;
		len = p->mp->chunks[c].size;
		if ((slot = fetch_read_claim(x, len)) < 0)
			return -EAGAIN;
	}
	for (uint32_t k = 0; k < n; k++) {
		struct fetch_read *rk = &x->reads[slot + k];
		*rk = (struct fetch_read){.g = rk->g, .x = x, .parcel = pi, .chunk = c + k,
					  .slot = (uint32_t)slot + k, .len = p->mp->chunks[c + k].size,
					  .src_idx = (uint32_t)(s - p->srcs), .src_epoch = p->src_epoch,
					  .src_peer = s->info.peer, .started_ms = node_now_ms(),
					  .src_far = !trk_site_same(s->info.site,
								    trk_client_site(x->o.trk)),
					  .run = k == 0 ? n : 0, .busy = true, .in_fabric = true,
					  .gen = x->gen, .hp = s->hp};
		snprintf(rk->src_id, sizeof(rk->src_id), "%s", s->info.id);
	}
	struct fetch_read *rd = &x->reads[slot];
	struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
	int rc = x->o.tx != NULL ? x->o.tx->read(x->o.tx->ctx, x, rd, s, len)
		 : s->info.peer ? post_peer(x, rd, s, p)
			      : fab_read(x->o.fab, &rd->op, x->bounce_mr, (size_t)slot * x->chunk_size,
					 len, s->fa, &rk, (uint64_t)c * f->man.chunk_size, on_read);
	if (rc != 0) {
		for (uint32_t k = 0; k < n; k++)
			x->reads[slot + k].busy = x->reads[slot + k].in_fabric = false;
		give_tokens(x, len);
		LOG_DEBUG("node %s: read post failed: %d", x->o.id, rc);
		fetch_source_failed(x, s);
		return rc == -EAGAIN ? -EIO : rc;
	}
	if (f->su.read == 0)
		f->su.read = proto_wall_ms();
	LOG_DEBUG("node %s: post %u/%u (%u chunks) from %s", x->o.id, pi, c, n, s->info.id);
	/* Each chunk counts as a read of its own: each lands as one. */
	for (uint32_t k = 0; k < n; k++) {
		fetch_source_posted(s, x->reads[slot + k].len);
		fetch_read_started(x, pi, c + k, x->reads[slot + k].len);
	}
	if (n > 1)
		proto_metrics_add(x->o.am->m, x->o.am->read_runs, 1);
	return 0;
}

void fetch_reads_abandon(struct fetcher *x)
{
	for (uint32_t i = 0; i < x->nreads; i++)
		if (x->reads[i].in_fabric)
			x->reads[i].abandoned = true;
}

void fetch_pool_size(struct fetcher *x)
{
	x->chunk_size = (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_CHUNK_SIZE), PROTO_CHUNK_SIZE_MAX);
	x->max_inflight = (uint32_t)PROTO_MAX(1, PROTO_MIN(proto_param(PROTO_PARAM_INFLIGHT), 256));
	x->nreads = 2 * x->max_inflight;
}

/* The pool: twice the reads in flight as slots, so reads moved off a
 * silent source keep their slots while replacements go out; the buffers,
 * reused for every chunk, mapped populated and registered once. */
int fetch__pool_init(struct fetcher *x, struct proto_err *err)
{
	int rc;

	fetch_pool_size(x);
	x->reads = calloc(x->nreads, sizeof(*x->reads));
	x->bounce_len = ((size_t)x->nreads * x->chunk_size + 4095) / 4096 * 4096;
	x->bounce = mmap(NULL, x->bounce_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (x->bounce == MAP_FAILED)
		x->bounce = NULL;
	if (x->reads == NULL || x->bounce == NULL)
		return proto_errf(err, ENOMEM, "out of memory for %u read buffers", x->nreads);
	rc = fab_mr_reg(x->o.fab, x->bounce, (size_t)x->nreads * x->chunk_size, FAB_MR_READ,
			&x->bounce_mr);
	if (rc != 0)
		return proto_errf(err, -rc, "fabric: cannot register read buffers");
	x->verifier = node_verifier_new(x->o.base, node_verifier_threads(), on_verified, x);
	x->rate_bps = proto_param(PROTO_PARAM_FETCH_MBPS) * 1000000ull / 8;
	x->rate_ev = evtimer_new(x->o.base, on_rate, x);
	if (x->verifier == NULL || x->rate_ev == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	return 0;
}

void fetch__pool_fini(struct fetcher *x)
{
	node_verifier_free(x->verifier); /* no worker touches a fetch after this */
	x->verifier = NULL;
	if (x->bounce != NULL)
		munmap(x->bounce, x->bounce_len);
	x->bounce = NULL;
	fetch_reads_free(x);
}

void fetch_reads_free(struct fetcher *x)
{
	for (uint32_t i = 0; x->reads != NULL && i < x->nreads; i++)
		free(x->reads[i].g);
	free(x->reads);
	x->reads = NULL;
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

/* Logs f's start-up timeline (f->su) at its first byte; once. At debug:
 * a rank's activation line carries its totals at info. */
static void startup_log(const struct fetcher *x, const struct fetch *f)
{
	char w[24], m[24], p[24], s[24], h[24], r[24], b[24];
	uint64_t c = f->man.created_ms;

	LOG_DEBUG("node %s: v%" PRIu64 " start-up, ms from the manifest's creation: watch %s, "
		  "manifest %s, parcels %s, sources %s, have-page %s, read posted %s, first byte %s",
		  x->o.id, f->version, su_ms(w, sizeof(w), f->su.watch, c),
		  su_ms(m, sizeof(m), f->su.manifest, c), su_ms(p, sizeof(p), f->su.parcels, c),
		  su_ms(s, sizeof(s), f->su.sources, c), su_ms(h, sizeof(h), f->su.have, c),
		  su_ms(r, sizeof(r), f->su.read, c), su_ms(b, sizeof(b), f->first_byte_ms, c));
}

/* The ranges of the slot chunk c of p lies in (sp: the first GATHER_RANGES
 * of them); more than GATHER_RANGES: not gathered. */
static uint32_t chunk_spans(const struct fetcher *x, const struct fetch *f,
			    const struct fetch_parcel *p, uint32_t c,
			    struct proto_span sp[GATHER_RANGES])
{
	size_t n = proto_parcel_spans(f->plan, p->pp, x->o.layout, (uint64_t)c * f->man.chunk_size,
				      p->mp->chunks[c].size, sp, GATHER_RANGES);
	return (uint32_t)PROTO_MIN(n, UINT32_MAX);
}

bool fetch_chunk_copied(const struct fetcher *x, const struct fetch *f,
			const struct fetch_parcel *p, uint32_t c)
{
	struct proto_span sp[GATHER_RANGES];

	return p->held != NULL &&
	       (!p->from_slot || chunk_spans(x, f, p, c, sp) > GATHER_RANGES);
}

void fetch_mark(struct fetch_parcel *p, uint32_t c, int what)
{
	if (p->held == NULL)
		return;
	proto_have_mark(p->held, c, false, what == FETCH_MARK_BUSY);
	if (what == FETCH_MARK_HAVE)
		proto_have_mark(p->held, c, true, true);
}

void fetch_chunk_idle(struct fetch_parcel *p, uint32_t c)
{
	if (p->state[c] == CHUNK_READING && p->nlive[c] == 0) {
		p->state[c] = CHUNK_TODO;
		fetch_mark(p, c, FETCH_MARK_NONE);
	}
}
