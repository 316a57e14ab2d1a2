/* A parcel delta decoded and verified ahead, written on the worker pool (see dpatch.h). */
#include "proto/dpatch.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "proto/delta_internal.h"
#include "proto/pool.h"
#include "proto/wsum.h"

#define P PROTO_WSUM_P
#define PF 64 /* changes prefetched ahead (as delta_apply.c) */
#define THREADS_MAX 8

static const uint8_t no_header[1];

/* ---- the pool ----------------------------------------------------------------- */

/* How many threads of the process's pool (proto/pool.h) a patch runs on,
 * the caller's included. */
struct proto_dpatch_pool {
	unsigned threads;
};

void proto_dpatch_pool_free(struct proto_dpatch_pool *pl)
{
	free(pl);
}

struct proto_dpatch_pool *proto_dpatch_pool_new(unsigned threads)
{
	struct proto_dpatch_pool *pl = calloc(1, sizeof(*pl));

	if (pl == NULL)
		return NULL;
	pl->threads = proto_dpatch_threads(threads);
	proto_pool_reserve(pl->threads); /* made now, not in the install */
	return pl;
}

unsigned proto_dpatch_pool_size(const struct proto_dpatch_pool *pl)
{
	return pl == NULL ? 1 : pl->threads;
}

unsigned proto_dpatch_threads(unsigned threads)
{
	if (threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	return threads > THREADS_MAX ? THREADS_MAX : threads;
}

/* ---- decoding ------------------------------------------------------------------ */

static inline uint64_t modp(__int128 x)
{
	__int128 r = x % P;
	return (uint64_t)(r < 0 ? r + P : r);
}

/* One chunk being decoded: where its old bytes are, and its checksum
 * movement so far. */
struct emit_ctx {
	struct proto_dpatch_chunk *pc;
	const uint8_t *old;
	uint64_t pa, pb;
	bool nomem;
};

static int chunk_grow(struct proto_dpatch_chunk *pc)
{
	uint32_t cap = pc->cap ? 2 * pc->cap : 4096;
	uint32_t *np = realloc(pc->pos, (size_t)cap * sizeof(*np));
	if (np == NULL)
		return -ENOMEM;
	pc->pos = np;
	uint8_t *nv = realloc(pc->val, (size_t)cap * pc->w);
	if (nv == NULL)
		return -ENOMEM;
	pc->val = nv;
	pc->cap = cap;
	return 0;
}

/* A batch of decoded changes: old bytes read, new bytes recorded, the
 * checksum moved (exact in 128 bits within a batch: |d| < 2^32, positions
 * below 2^24, at most PROTO_DELTA_BATCH terms). */
static void emit(void *arg, const uint32_t *pos, const uint64_t *diff, uint32_t m)
{
	struct emit_ctx *e = arg;
	struct proto_dpatch_chunk *pc = e->pc;
	uint32_t w = pc->w;
	uint64_t mask = delta__mask(w);
	__int128 sa = 0, sb = 0;

	if (e->nomem)
		return;
	for (uint32_t j = 0; j < m; j++) {
		uint64_t o = 0, n;
		if (j + PF < m)
			__builtin_prefetch(e->old + (size_t)pos[j + PF] * w, 0, 0);
		if (diff[j] == 0)
			continue; /* a DENSE chunk's unchanged element */
		if (pc->n == pc->cap && chunk_grow(pc) != 0) {
			e->nomem = true;
			return;
		}
		memcpy(&o, e->old + (size_t)pos[j] * w, w);
		n = (o + diff[j]) & mask;
		pc->pos[pc->n] = pos[j];
		memcpy(pc->val + (size_t)pc->n * w, &n, w);
		pc->n++;
		int64_t dl = (int64_t)(n % P) - (int64_t)(o % P);
		sa += dl;
		sb += (__int128)(pos[j] + 1) * dl;
	}
	e->pa = (e->pa + modp(sa)) % P;
	e->pb = (e->pb + modp(sb)) % P;
}

struct prep_job {
	const struct proto_delta *d;
	struct proto_dpatch *p;
	struct delta__decoder **dec; /* one per thread */
	pthread_mutex_t lock;
	int rc;
	uint32_t err_chunk;
	struct proto_err err;
};

/* Decodes chunk ci into its list of changes. */
static int prep_chunk(void *arg, unsigned slot, uint64_t i)
{
	struct prep_job *j = arg;
	struct proto_err err = {{0}};
	uint32_t ci = (uint32_t)i;
	const struct proto_delta_chunk *c = &j->d->chunks[ci];
	struct proto_dpatch_chunk *pc = &j->p->chunks[ci];

	if (c->mode == PROTO_DELTA_ZERO)
		return 0;
	struct emit_ctx e = {pc, pc->dst, 0, 0, false};
	int rc;
	/* Sparse and bitmap chunks say how many changes they hold. */
	if (c->mode != PROTO_DELTA_DENSE && c->nchanges > 0) {
		pc->pos = malloc((size_t)c->nchanges * sizeof(*pc->pos));
		pc->val = malloc((size_t)c->nchanges * pc->w);
		if (pc->pos != NULL && pc->val != NULL)
			pc->cap = c->nchanges;
	}
	rc = delta__decode_chunk(j->dec[slot], j->d, ci, emit, &e, &err);
	if (rc == 0 && e.nomem)
		rc = proto_errf(&err, ENOMEM, "out of memory");
	if (rc != 0) {
		pthread_mutex_lock(&j->lock);
		if (j->rc == 0 || ci < j->err_chunk) {
			j->rc = rc;
			j->err_chunk = ci;
			j->err = err;
		}
		pthread_mutex_unlock(&j->lock);
		return 1;
	}
	pc->part = e.pb << 32 | e.pa;
	return 0;
}

/*
 * Maps every page the write will store to as writable now, so that the
 * write takes no page fault (a fault costs microseconds, more in a VM).
 * The pages' bytes are not changed: MADV_POPULATE_WRITE only faults them in
 * for writing, as a store would. Where the kernel lacks it (before Linux
 * 5.14) the write faults as it goes; nothing else differs.
 */
static void pretouch(const struct proto_dpatch *p)
{
#ifdef MADV_POPULATE_WRITE
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);

	for (uint32_t ci = 0; ci < p->nchunks; ci++) {
		const struct proto_dpatch_chunk *pc = &p->chunks[ci];
		if (pc->n == 0)
			continue;
		uintptr_t lo = (uintptr_t)(pc->dst + (size_t)pc->pos[0] * pc->w) & ~(pg - 1);
		uintptr_t hi = (uintptr_t)(pc->dst + ((size_t)pc->pos[pc->n - 1] + 1) * pc->w);
		(void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
	}
#else
	(void)p;
#endif
}

void proto_dpatch_fini(struct proto_dpatch *p)
{
	for (uint32_t i = 0; p->chunks != NULL && i < p->nchunks; i++) {
		free(p->chunks[i].pos);
		free(p->chunks[i].val);
	}
	free(p->chunks);
	memset(p, 0, sizeof(*p));
}

int proto_dpatch_prepare(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			 uint8_t *block, const uint64_t *sums, struct proto_dpatch_pool *pool,
			 struct proto_dpatch *out, struct proto_err *err)
{
	struct proto_delta dl;
	struct prep_job j;
	unsigned nt = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	memset(&j, 0, sizeof(j));
	rc = proto_delta_parse(delta, len, &dl, err);
	if (rc != 0)
		return rc;
	pthread_mutex_init(&j.lock, NULL);
	if ((rc = delta__match_parcel(d, &dl, err)) != 0)
		goto out;
	for (uint32_t i = 0; i < d->npieces; i++) {
		if (sums[i] != dl.tensors[i].parent_sum) {
			rc = proto_errf(err, EINVAL,
					"delta piece %u: the parent's checksum differs from the delta's", i);
			goto out;
		}
	}
	struct proto_delta_parent par = {no_header, 0, d->npieces, sums};
	if ((rc = proto_delta_check_parent(&dl, &par, err)) != 0)
		goto out;
	out->nchunks = dl.nchunks;
	out->chunks = calloc(dl.nchunks + 1, sizeof(*out->chunks));
	if (out->chunks == NULL) {
		rc = proto_errf(err, ENOMEM, "delta prepare: out of memory");
		goto out;
	}
	for (uint32_t ci = 0; ci < dl.nchunks; ci++) {
		const struct proto_delta_chunk *c = &dl.chunks[ci];
		const struct proto_delta_tensor *t = &dl.tensors[c->tensor];
		out->chunks[ci].w = t->elsize;
		out->chunks[ci].dst = block + d->pieces[c->tensor].dst_off + c->base * t->elsize;
	}
	nt = proto_dpatch_pool_size(pool);
	j.d = &dl;
	j.p = out;
	j.dec = calloc(nt, sizeof(*j.dec));
	for (unsigned i = 0; j.dec != NULL && i < nt; i++)
		if ((j.dec[i] = delta__decoder_new()) == NULL) {
			rc = proto_errf(err, ENOMEM, "delta prepare: out of memory");
			goto out;
		}
	if (j.dec == NULL) {
		rc = proto_errf(err, ENOMEM, "delta prepare: out of memory");
		goto out;
	}
	proto_pool_for(dl.nchunks, nt, prep_chunk, &j);
	if (j.rc != 0) {
		rc = j.rc;
		*err = j.err;
		proto_err_prefix(err, "delta: piece %u chunk %u", dl.chunks[j.err_chunk].tensor,
				 j.err_chunk - dl.tensors[dl.chunks[j.err_chunk].tensor].chunk0);
		goto out;
	}
	/* Every piece's child checksum, from the parent's and the movement. */
	for (uint32_t i = 0; i < dl.ntensors; i++) {
		const struct proto_delta_tensor *t = &dl.tensors[i];
		uint64_t s = sums[i];
		for (uint32_t k = 0; k < t->nchunks; k++) {
			const struct proto_delta_chunk *c = &dl.chunks[t->chunk0 + k];
			if (c->mode != PROTO_DELTA_ZERO)
				s = proto_wsum_combine(s, c->base, out->chunks[t->chunk0 + k].part);
		}
		if (s != t->child_sum) {
			rc = proto_errf(err, EINVAL,
					"delta: piece %u: checksum after the changes would be %016llx, the "
					"child's is %016llx",
					i, (unsigned long long)s, (unsigned long long)t->child_sum);
			goto out;
		}
	}
	for (uint32_t ci = 0; ci < out->nchunks; ci++)
		out->nchanges += out->chunks[ci].n;
	pretouch(out);
	rc = 0;
out:
	for (unsigned i = 0; j.dec != NULL && i < nt; i++)
		delta__decoder_free(j.dec[i]);
	free(j.dec);
	pthread_mutex_destroy(&j.lock);
	proto_delta_fini(&dl);
	if (rc != 0)
		proto_dpatch_fini(out);
	return rc;
}

/* ---- writing --------------------------------------------------------------------- */

/* The chunks of n patches, numbered across them, taken in turns by the
 * pool's threads; each thread's place in the patches (its chunks come in
 * order). */
struct write_job {
	const struct proto_dpatch *p;
	size_t n;
	struct {
		size_t k;
		uint64_t base; /* chunks of the patches before p[k] */
	} at[THREADS_MAX];
};

static void write_chunk(const struct proto_dpatch_chunk *pc)
{
	uint8_t *dst = pc->dst;
	const uint32_t *pos = pc->pos;
	uint32_t n = pc->n, w = pc->w;

	if (w == 2) {
		const uint16_t *v = (const uint16_t *)(const void *)pc->val;
		for (uint32_t j = 0; j < n; j++) {
			if (j + PF < n)
				__builtin_prefetch(dst + (size_t)pos[j + PF] * 2, 1, 0);
			memcpy(dst + (size_t)pos[j] * 2, &v[j], 2);
		}
		return;
	}
	for (uint32_t j = 0; j < n; j++) {
		if (j + PF < n)
			__builtin_prefetch(dst + (size_t)pos[j + PF] * w, 1, 0);
		memcpy(dst + (size_t)pos[j] * w, pc->val + (size_t)j * w, w);
	}
}

static int write_one(void *arg, unsigned slot, uint64_t ci)
{
	struct write_job *j = arg;
	size_t *k = &j->at[slot].k;
	uint64_t *base = &j->at[slot].base;

	while (*k < j->n && ci >= *base + j->p[*k].nchunks)
		*base += j->p[(*k)++].nchunks;
	if (*k == j->n)
		return 1;
	const struct proto_dpatch_chunk *pc = &j->p[*k].chunks[ci - *base];
	if (pc->n > 0)
		write_chunk(pc);
	return 0;
}

void proto_dpatch_write(const struct proto_dpatch *p, size_t n, struct proto_dpatch_pool *pool)
{
	struct write_job j = {.p = p, .n = n};
	uint64_t nchunks = 0;

	for (size_t k = 0; k < n; k++)
		nchunks += p[k].nchunks;
	proto_pool_for(nchunks, proto_dpatch_pool_size(pool), write_one, &j);
}
