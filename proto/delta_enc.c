/* Delta encoder: finds changes chunk by chunk and keeps the smallest coding. */
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "proto/delta_internal.h"
#include "proto/params.h"
#include "proto/pool.h"
#include "proto/wsum.h"

/* Density thresholds (changes / elements) above or below which a coding is
 * not even tried: SPARSE up to 1/2, BITMAP from 1/32, DENSE from 1/8. The
 * bitmap's stream is n/8 bytes whatever the density, the largest input zstd
 * gets at an RL step's ~1.6 % of BF16 elements changed, where the gaps always
 * won: trying it only from 1/32 gives the same bytes for less CPU
 * (proto/NOTES.md). */
#define SPARSE_MAX_DEN 2
#define BITMAP_MIN_DEN 32
#define DENSE_MIN_DEN 8
#define REC_MAX (1 + 3 * 10 + PROTO_DELTA_MAX_STREAMS * 10)
#define PIECE (1u << 15) /* elements scanned and summed while in L2 */

struct chunk_out {
	uint8_t rec[REC_MAX];
	size_t rec_len;
	uint8_t *streams; /* malloc'ed frames, back to back */
	size_t streams_len;
	uint64_t nchanged, pos_bytes, val_bytes;
	uint64_t psum, csum; /* wsums of the chunk's parent and child elements (csum:
			      * how far the changes move it, see scan) */
	uint64_t tsum;       /* of the parent's elements at the positions written */
	uint8_t mode;
};

struct job {
	const struct proto_delta_version *parent, *child;
	const uint32_t *match;
	uint32_t chunk_elems, wmax;
	uint32_t maxn; /* largest chunk present: what scratch buffers hold */
	int level;
	uint64_t nchunks;
	uint32_t *ctensor; /* per chunk: child tensor */
	uint64_t *cbase;   /* per chunk: first element */
	struct chunk_out *outs;
	_Atomic uint64_t next, done;
	_Atomic uint64_t changed; /* by the chunks scanned so far */
	/* The caller's scratch (opts.keep), when it encodes alone; else NULL. */
	struct proto_delta_scratch **keep;
	struct share *shares; /* one per thread of the encode */
	const struct proto_delta_opts *o;
	pthread_mutex_t lock;
	int rc;
	struct proto_err err;
};

/* A candidate set of streams for one chunk. */
struct cand {
	unsigned ns;
	uint8_t *frame[PROTO_DELTA_MAX_STREAMS]; /* into the owning buffer */
	size_t clen[PROTO_DELTA_MAX_STREAMS];
	size_t total;
};

struct scratch {
	ZSTD_CCtx *cctx;
	uint32_t *pos;
	uint64_t *val;  /* zigzag value per change (per element for DENSE) */
	uint8_t *raw;   /* one raw stream being built */
	uint8_t *zb[4]; /* compressed candidates; swapped, never copied */
	size_t zcap;
	uint8_t *room;  /* a stretch of both sides, for opts.locate */
};

static int scratch_init(struct scratch *s, const struct job *j)
{
	size_t n = PROTO_MAX(j->maxn, 1u), w = j->wmax;

	memset(s, 0, sizeof(*s));
	s->cctx = ZSTD_createCCtx();
	s->pos = malloc(n * sizeof(*s->pos));
	s->val = malloc(n * sizeof(*s->val));
	/* Longest raw stream: a plane of n bytes, or k gaps plus the wide
	 * stream (an escape needs a gap >= 255, so at most n / 255 of them,
	 * 4 bytes each at most). */
	s->raw = malloc(n + n / 32 + 64);
	/* Largest candidate: w + 1 streams of at most n bytes, or the
	 * position streams. */
	s->zcap = (w + 1) * ZSTD_compressBound(n) + ZSTD_compressBound(n / 32 + 64) + 1024;
	for (int i = 0; i < 4; i++)
		s->zb[i] = malloc(s->zcap);
	s->room = malloc(2 * (size_t)PIECE * w);
	if (s->cctx == NULL || !s->pos || !s->val || !s->raw || !s->zb[0] || !s->zb[1] ||
	    !s->zb[2] || !s->zb[3] || !s->room)
		return -ENOMEM;
	ZSTD_CCtx_setParameter(s->cctx, ZSTD_c_compressionLevel, j->level);
	ZSTD_CCtx_setParameter(s->cctx, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(s->cctx, ZSTD_c_contentSizeFlag, 1);
	if (j->level <= 9)
		ZSTD_CCtx_setParameter(s->cctx, ZSTD_c_minMatch, 7);
	return 0;
}

static void scratch_fini(struct scratch *s)
{
	ZSTD_freeCCtx(s->cctx);
	free(s->pos);
	free(s->val);
	free(s->raw);
	for (int i = 0; i < 4; i++)
		free(s->zb[i]);
	free(s->room);
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

/* Compresses one raw stream into the candidate (at dst + c->total). */
static int add_stream(struct scratch *s, struct cand *c, uint8_t *dst, size_t cap,
		      const uint8_t *src, size_t len)
{
	size_t r = 0;

	if (len > 0 && !all_zero(src, len)) {
		r = ZSTD_compress2(s->cctx, dst + c->total, cap - c->total, src, len);
		if (ZSTD_isError(r))
			return -EIO;
	}
	c->frame[c->ns] = dst + c->total;
	c->clen[c->ns++] = r;
	c->total += r;
	return 0;
}

/* Value streams for count values (minus bias) as PLANES or NIB. */
static int add_values(struct scratch *s, struct cand *c, uint8_t *dst, size_t cap,
		      const uint64_t *val, size_t count, uint64_t bias, uint32_t w, int vcode,
		      uint32_t *nesc_out)
{
	uint8_t *raw = s->raw;
	size_t nesc = 0;
	int rc;

	if (vcode == PROTO_DELTA_NIB) {
		size_t nb = (count + 1) / 2;
		memset(raw, 0, nb);
		for (size_t i = 0; i < count; i++) {
			uint64_t v = val[i] - bias;
			raw[i >> 1] |= (uint8_t)((v < 15 ? v : 15) << ((i & 1) * 4));
			nesc += v >= 15;
		}
		rc = add_stream(s, c, dst, cap, raw, nb);
		if (rc != 0)
			return rc;
		for (uint32_t b = 0; b < w; b++) {
			size_t k = 0;
			for (size_t i = 0; i < count; i++) {
				uint64_t v = val[i] - bias;
				if (v >= 15)
					raw[k++] = (uint8_t)((v - 15) >> (8 * b));
			}
			rc = add_stream(s, c, dst, cap, raw, k);
			if (rc != 0)
				return rc;
		}
	} else {
		for (uint32_t b = 0; b < w; b++) {
			for (size_t i = 0; i < count; i++)
				raw[i] = (uint8_t)((val[i] - bias) >> (8 * b));
			rc = add_stream(s, c, dst, cap, raw, count);
			if (rc != 0)
				return rc;
		}
	}
	*nesc_out = (uint32_t)nesc;
	return 0;
}

/*
 * Which of 64 bytes differ between a and b: bit i for byte i. SSE2 (every
 * x86-64) compares 16 bytes at a time; elsewhere a plain loop.
 */
static inline uint64_t diff_mask64(const uint8_t *a, const uint8_t *b)
{
#if defined(__SSE2__)
	uint64_t m = 0;
	for (int q = 0; q < 4; q++) {
		__m128i x = _mm_loadu_si128((const __m128i *)(const void *)(a + 16 * q));
		__m128i y = _mm_loadu_si128((const __m128i *)(const void *)(b + 16 * q));
		m |= (uint64_t)(uint16_t)~_mm_movemask_epi8(_mm_cmpeq_epi8(x, y)) << (16 * q);
	}
	return m;
#else
	uint64_t m = 0;
	for (int i = 0; i < 64; i++)
		m |= (uint64_t)(a[i] != b[i]) << i;
	return m;
#endif
}

/* One bit per W-byte element that has any differing byte, at the
 * element's first byte. */
static inline uint64_t elem_mask(uint64_t m, unsigned w)
{
	if (w >= 2)
		m |= m >> 1;
	if (w >= 4)
		m |= m >> 2;
	if (w >= 8)
		m |= m >> 4;
	return m & (w == 1 ? ~0ull : w == 2 ? 0x5555555555555555ull :
			 w == 4 ? 0x1111111111111111ull : 0x0101010101010101ull);
}

/*
 * Finds the changes of one chunk of n elements: positions into pos, zigzag
 * differences into val; returns their count. Old is all zero when the tensor
 * has no parent (a == NULL). Each 64-byte block is compared at once into a
 * mask of the elements that differ (most blocks have none), and only those
 * are visited: one step per change, no branch per element to mispredict.
 * The old elements of the changes are summed into t[0] / t[1] (A and B of
 * their wsum, not yet reduced: n <= PIECE keeps them below 2^62), the new
 * ones into t[2] / t[3]: the child's checksum moves by their difference.
 */
#define SCAN_FN(name, T, W)                                                        \
	static size_t name(uint32_t *pos, uint64_t *val, const uint8_t *a,         \
			   const uint8_t *b, uint32_t n, uint64_t t[4])               \
	{                                                                          \
		const uint32_t per = 64 / W;                                       \
		size_t k = 0;                                                      \
		uint32_t i = 0;                                                    \
		uint64_t sa = 0, sb = 0, na = 0, nb = 0;                           \
		if (a != NULL)                                                     \
			for (; i + per <= n; i += per) {                           \
				const uint8_t *pa = a + (size_t)i * W;             \
				const uint8_t *pb = b + (size_t)i * W;             \
				uint64_t m = elem_mask(diff_mask64(pa, pb), W);    \
				while (m != 0) {                                   \
					unsigned at = (unsigned)__builtin_ctzll(m); \
					T o, nw;                                   \
					m &= m - 1;                                \
					memcpy(&o, pa + at, W);                    \
					memcpy(&nw, pb + at, W);                   \
					pos[k] = i + at / W;                       \
					val[k++] = delta__zz((T)(nw - o), W);      \
					sa += proto_wsum_val(o);                   \
					sb += (uint64_t)(i + at / W + 1) *         \
					      proto_wsum_val(o);                   \
					na += proto_wsum_val(nw);                  \
					nb += (uint64_t)(i + at / W + 1) *         \
					      proto_wsum_val(nw);                  \
				}                                                  \
			}                                                          \
		for (; i < n; i++) {                                               \
			T o = 0, nw;                                               \
			if (a != NULL)                                             \
				memcpy(&o, a + (size_t)i * W, W);                  \
			memcpy(&nw, b + (size_t)i * W, W);                         \
			if (o != nw) {                                             \
				pos[k] = i;                                        \
				val[k++] = delta__zz((T)(nw - o), W);              \
				sa += proto_wsum_val(o);                           \
				sb += (uint64_t)(i + 1) * proto_wsum_val(o);       \
				na += proto_wsum_val(nw);                          \
				nb += (uint64_t)(i + 1) * proto_wsum_val(nw);      \
			}                                                          \
		}                                                                  \
		t[0] = sa;                                                         \
		t[1] = sb;                                                         \
		t[2] = na;                                                         \
		t[3] = nb;                                                         \
		return k;                                                          \
	}
SCAN_FN(scan1, uint8_t, 1)
SCAN_FN(scan2, uint16_t, 2)
SCAN_FN(scan4, uint32_t, 4)
SCAN_FN(scan8, uint64_t, 8)

/* Scans chunk ci (n elements from element base of child tensor t) piece by
 * piece and sums both sides of each piece while it is still in cache, so
 * the checksums cost no extra pass over memory (the parent's side only when
 * its sums are not known already), and hands each piece's changes to the
 * caller's on_changes there too; *tsum receives the wsum of the parent's
 * elements at the changed positions. With the parent's sums known (and a
 * parent), *csum is not the child's sum but how far the changes move it
 * (wsum.h: the sums are linear), from the changed elements alone: the
 * child's sum is its parent's moved by that, and no child byte is read
 * beyond those the compare reads. */
static size_t scan(const struct job *j, struct scratch *s, uint32_t t, uint64_t base,
		   const uint8_t *a, const uint8_t *b, uint32_t n, uint32_t w, bool sum_parent,
		   bool moved, uint64_t *psum, uint64_t *csum, uint64_t *tsum)
{
	const struct proto_delta_opts *o = j->o;

	size_t k = 0;

	*psum = *csum = *tsum = 0;
	for (uint32_t i = 0; i < n; i += PIECE) {
		uint32_t m = PROTO_MIN(PIECE, n - i);
		const uint8_t *pa = a ? a + (size_t)i * w : NULL, *pb = b + (size_t)i * w;
		size_t k0 = k;
		uint64_t ts[4];
		if (o != NULL && o->fill != NULL)
			o->fill(o->fill_arg, t, base + i, m);
		if (o != NULL && o->locate != NULL && pa != NULL)
			o->locate(o->locate_arg, t, base + i, m, s->room, &pa, &pb);
		switch (w) {
		case 1:
			k += scan1(s->pos + k, s->val + k, pa, pb, m, ts);
			break;
		case 2:
			k += scan2(s->pos + k, s->val + k, pa, pb, m, ts);
			break;
		case 4:
			k += scan4(s->pos + k, s->val + k, pa, pb, m, ts);
			break;
		default:
			k += scan8(s->pos + k, s->val + k, pa, pb, m, ts);
			break;
		}
		uint64_t ta = ts[0] % PROTO_WSUM_P, tb = ts[1] % PROTO_WSUM_P;
		*tsum = proto_wsum_combine(*tsum, i, tb << 32 | ta);
		if (moved) {
			uint64_t da = (ts[2] % PROTO_WSUM_P + PROTO_WSUM_P - ta) % PROTO_WSUM_P;
			uint64_t db = (ts[3] % PROTO_WSUM_P + PROTO_WSUM_P - tb) % PROTO_WSUM_P;
			*csum = proto_wsum_combine(*csum, i, db << 32 | da);
		}
		/* (Positions from the stretch's first element, as scanned.) */
		if (o != NULL && o->on_changes != NULL && k > k0)
			o->on_changes(o->changes_arg, t, base + i, s->pos + k0, k - k0, pa, pb);
		for (size_t q = k0; q < k; q++)
			s->pos[q] += i;
		if (sum_parent)
			*psum = proto_wsum_combine(*psum, i, proto_wsum(w, pa, m));
		if (!moved)
			*csum = proto_wsum_combine(*csum, i, proto_wsum(w, pb, m));
	}
	return k;
}

/* The wsum of the parent's n elements of chunk (t, base), read where
 * opts.locate says they are (a dense chunk's, after its scan). */
static uint64_t parent_wsum(const struct job *j, struct scratch *s, uint32_t t, uint64_t base,
			    const uint8_t *a, const uint8_t *b, uint32_t n, uint32_t w)
{
	const struct proto_delta_opts *o = j->o;
	uint64_t sum = 0;

	if (o == NULL || o->locate == NULL)
		return proto_wsum(w, a, n);
	for (uint32_t i = 0; i < n; i += PIECE) {
		uint32_t m = PROTO_MIN(PIECE, n - i);
		const uint8_t *pa = a + (size_t)i * w, *pb = b + (size_t)i * w;
		o->locate(o->locate_arg, t, base + i, m, s->room, &pa, &pb);
		sum = proto_wsum_combine(sum, i, proto_wsum(w, pa, m));
	}
	return sum;
}

static void swap(uint8_t **a, uint8_t **b)
{
	uint8_t *t = *a;
	*a = *b;
	*b = t;
}

/* A chunk's coded bytes go on the shared budget (opts.budget): -E2BIG when
 * they pass it, or another encode did. */
static int spend(const struct job *j, uint64_t bytes)
{
	struct proto_delta_budget *b = j->o != NULL ? j->o->budget : NULL;

	if (b == NULL)
		return 0;
	if (atomic_fetch_add(&b->out, bytes) + bytes > b->limit)
		atomic_store(&b->over, true);
	return atomic_load(&b->over) ? -E2BIG : 0;
}

/*
 * Encodes one chunk. Buffers: zb[0] holds the best values of the changes,
 * zb[1] the best positions, zb[2] and zb[3] are free for trials; a winner
 * is swapped in, never copied.
 */
static int encode_chunk(struct job *j, struct scratch *s, uint64_t ci)
{
	uint32_t t = j->ctensor[ci];
	uint32_t w = (uint32_t)proto_dtype_size(j->child->model->tensors[t].dtype);
	uint64_t base = j->cbase[ci];
	uint32_t n = (uint32_t)PROTO_MIN((uint64_t)j->chunk_elems,
					 j->child->model->tensors[t].nelem - base);
	const uint8_t *b = j->child->data[t] + base * w;
	const uint8_t *a = j->match[t] == PROTO_DELTA_NONE ? NULL
			 : j->parent->data[j->match[t]] + base * w;
	struct chunk_out *out = &j->outs[ci];
	struct cand vals = {0}, pos = {0}, trial;
	uint32_t vnesc = 0, tnesc = 0, wide_len = 0;
	int vcode = PROTO_DELTA_PLANES, rc;
	uint8_t mode = PROTO_DELTA_ZERO, *p;
	size_t k, at = 0;

	/* Another encode sharing the budget passed it: nothing more is read. */
	if (j->o != NULL && j->o->budget != NULL && atomic_load(&j->o->budget->over))
		return -E2BIG;
	/* The parent's sums known (from the encode that made it): not summed,
	 * and the child's follows from them and the changes. */
	k = scan(j, s, t, base, a, b, n, w, a != NULL && j->parent->sums == NULL,
		 a != NULL && j->parent->sums != NULL, &out->psum, &out->csum, &out->tsum);
	if (j->o != NULL && j->o->budget != NULL)
		atomic_fetch_add(&j->o->budget->in, (uint64_t)n * w);
	if (j->o != NULL && j->o->max_changed != 0 &&
	    atomic_fetch_add(&j->changed, k) + k > j->o->max_changed)
		return -E2BIG;
	out->nchanged = k;
	out->mode = PROTO_DELTA_ZERO;
	out->rec[0] = 0;
	out->rec_len = 1;
	out->streams = NULL;
	out->streams_len = 0;
	if (k == 0)
		return spend(j, out->rec_len);
	/* Values of the changes (biased by 1): PLANES, then NIB if smaller. */
	rc = add_values(s, &vals, s->zb[0], s->zcap, s->val, k, 1, w, PROTO_DELTA_PLANES, &vnesc);
	memset(&trial, 0, sizeof(trial));
	if (rc == 0)
		rc = add_values(s, &trial, s->zb[2], s->zcap, s->val, k, 1, w, PROTO_DELTA_NIB,
				&tnesc);
	if (rc != 0)
		return rc;
	if (trial.total < vals.total) {
		vals = trial;
		vnesc = tnesc;
		vcode = PROTO_DELTA_NIB;
		swap(&s->zb[0], &s->zb[2]);
	}
	if ((uint64_t)k * SPARSE_MAX_DEN <= n) {
		/* Gaps: unchanged elements skipped since the previous change. */
		uint8_t *g = s->raw, *wide = s->raw + k;
		uint32_t prev = 0;
		size_t nw = 0;
		for (size_t i = 0; i < k; i++) {
			uint32_t gap = s->pos[i] - prev;
			prev = s->pos[i] + 1;
			if (gap < 255) {
				g[i] = (uint8_t)gap;
			} else {
				g[i] = 255;
				nw += delta__put_varint(wide + nw, gap - 255);
			}
		}
		rc = add_stream(s, &pos, s->zb[1], s->zcap, g, k);
		if (rc == 0)
			rc = add_stream(s, &pos, s->zb[1], s->zcap, wide, nw);
		if (rc != 0)
			return rc;
		mode = PROTO_DELTA_SPARSE;
		wide_len = (uint32_t)nw;
	}
	if ((uint64_t)k * BITMAP_MIN_DEN >= n) {
		size_t nb = ((size_t)n + 7) / 8;
		memset(&trial, 0, sizeof(trial));
		memset(s->raw, 0, nb);
		for (size_t i = 0; i < k; i++)
			s->raw[s->pos[i] >> 3] |= (uint8_t)(1u << (s->pos[i] & 7));
		rc = add_stream(s, &trial, s->zb[2], s->zcap, s->raw, nb);
		if (rc != 0)
			return rc;
		if (mode == PROTO_DELTA_ZERO || trial.total < pos.total) {
			pos = trial;
			mode = PROTO_DELTA_BITMAP;
			swap(&s->zb[1], &s->zb[2]);
		}
	}
	if ((uint64_t)k * DENSE_MIN_DEN >= n) {
		/* Every element's value, unbiased (0 = unchanged), built in place:
		 * going down, pos[i] >= i, so nothing still needed is overwritten. */
		struct cand dpl = {0}, dnib = {0};
		uint32_t end = n, dn = 0, unused;
		for (size_t i = k; i-- > 0;) {
			uint64_t v = s->val[i];
			for (uint32_t q = s->pos[i] + 1; q < end; q++)
				s->val[q] = 0;
			s->val[s->pos[i]] = v;
			end = s->pos[i];
		}
		for (uint32_t q = 0; q < end; q++)
			s->val[q] = 0;
		rc = add_values(s, &dpl, s->zb[2], s->zcap, s->val, n, 0, w, PROTO_DELTA_PLANES,
				&unused);
		if (rc == 0)
			rc = add_values(s, &dnib, s->zb[3], s->zcap, s->val, n, 0, w, PROTO_DELTA_NIB,
					&dn);
		if (rc != 0)
			return rc;
		int dv = PROTO_DELTA_PLANES;
		if (dnib.total < dpl.total) {
			dpl = dnib;
			dv = PROTO_DELTA_NIB;
		} else {
			dn = 0;
		}
		if (mode == PROTO_DELTA_ZERO || dpl.total < pos.total + vals.total) {
			/* Apply writes every element of a dense chunk. */
			out->tsum = a == NULL ? 0 : j->parent->sums == NULL ? out->psum
								   : parent_wsum(j, s, t, base, a, b, n, w);
			mode = PROTO_DELTA_DENSE;
			vcode = dv;
			vals = dpl;
			vnesc = dn;
			memset(&pos, 0, sizeof(pos));
		}
	}
	p = out->rec;
	*p++ = (uint8_t)(mode | vcode << 4);
	if (mode != PROTO_DELTA_DENSE)
		p += delta__put_varint(p, k);
	if (mode == PROTO_DELTA_SPARSE)
		p += delta__put_varint(p, wide_len);
	if (vcode == PROTO_DELTA_NIB)
		p += delta__put_varint(p, vnesc);
	out->streams = malloc(pos.total + vals.total + 1);
	if (out->streams == NULL)
		return -ENOMEM;
	for (unsigned i = 0; i < pos.ns; i++) {
		p += delta__put_varint(p, pos.clen[i]);
		memcpy(out->streams + at, pos.frame[i], pos.clen[i]);
		at += pos.clen[i];
	}
	for (unsigned i = 0; i < vals.ns; i++) {
		p += delta__put_varint(p, vals.clen[i]);
		memcpy(out->streams + at, vals.frame[i], vals.clen[i]);
		at += vals.clen[i];
	}
	out->mode = mode;
	out->streams_len = at;
	out->pos_bytes = pos.total;
	out->val_bytes = vals.total;
	out->rec_len = (size_t)(p - out->rec);
	return spend(j, out->rec_len + at);
}

/*
 * An encode on one thread may keep its scratch for the next encode in the
 * caller's hands (opts.keep): a publisher's rank worker encodes its parcels
 * one after the other, and fresh buffers (malloc maps tens of MiB anew each
 * time) had every page a scan touches faulted in and zeroed again for each
 * parcel.
 */
struct proto_delta_scratch {
	struct scratch s;
	uint32_t maxn, wmax;
	int level;
};

void proto_delta_scratch_free(struct proto_delta_scratch *k)
{
	if (k == NULL)
		return;
	scratch_fini(&k->s);
	free(k);
}

/* The kept scratch, fit for j (made or remade), or NULL. */
static struct scratch *kept_scratch(const struct job *j)
{
	struct proto_delta_scratch *k = *j->keep;

	if (k != NULL && (k->maxn < j->maxn || k->wmax < j->wmax || k->level != j->level)) {
		proto_delta_scratch_free(k);
		*j->keep = k = NULL;
	}
	if (k == NULL) {
		if ((k = calloc(1, sizeof(*k))) == NULL)
			return NULL;
		if (scratch_init(&k->s, j) != 0) {
			proto_delta_scratch_free(k);
			return NULL;
		}
		k->maxn = j->maxn;
		k->wmax = j->wmax;
		k->level = j->level;
		*j->keep = k;
	}
	return &k->s;
}

/* One thread's share of an encode: its scratch, made at its first chunk
 * (the kept one when the caller encodes alone). */
struct share {
	struct scratch own, *s;
};

static int enc_chunk(void *arg, unsigned slot, uint64_t ci)
{
	struct job *j = arg;
	struct share *sh = &j->shares[slot];
	int rc = 0;

	if (sh->s == NULL && (sh->s = j->keep != NULL ? kept_scratch(j) : NULL) == NULL) {
		sh->s = &sh->own;
		rc = scratch_init(&sh->own, j);
	}
	if (rc == 0) {
		rc = encode_chunk(j, sh->s, ci);
		uint64_t done = atomic_fetch_add(&j->done, 1) + 1;
		if (j->o != NULL && j->o->progress != NULL)
			j->o->progress(j->o->progress_arg, done, j->nchunks);
	}
	if (rc == 0)
		return 0;
	pthread_mutex_lock(&j->lock);
	if (j->rc == 0)
		j->rc = proto_errf(&j->err, -rc, "delta encode: %s",
				   rc == -ENOMEM ? "out of memory" :
				   rc == -E2BIG && j->o->budget != NULL &&
						   atomic_load(&j->o->budget->over)
						 ? "its output passed the budget it shares" :
				   rc == -E2BIG  ? "more elements changed than the limit" :
						   "zstd compression failed");
	pthread_mutex_unlock(&j->lock);
	return 1;
}

int proto_delta_encode(const struct proto_delta_version *parent,
		       const struct proto_delta_version *child,
		       const struct proto_delta_opts *o, uint8_t **out, size_t *out_len,
		       struct proto_delta_stats *st, struct proto_err *err)
{
	const struct proto_model *pm = parent->model, *cm = child->model;
	uint64_t *psums = NULL, *csums = NULL, *tsums = NULL, hdr_len, body_len = 0;
	uint32_t *match = NULL;
	unsigned nth = o && o->threads ? o->threads : 1;
	struct job j;
	uint8_t *buf = NULL, *p;
	int rc;

	*out = NULL;
	*out_len = 0;
	memset(&j, 0, sizeof(j));
	pthread_mutex_init(&j.lock, NULL);
	j.parent = parent;
	j.child = child;
	j.o = o;
	j.level = o && o->level ? o->level : (int)proto_param(PROTO_PARAM_DELTA_LEVEL);
	j.chunk_elems = o && o->chunk_elems ? o->chunk_elems
					    : (uint32_t)PROTO_MIN((uint64_t)PROTO_DELTA_CHUNK_MAX,
								  proto_param(PROTO_PARAM_DELTA_CHUNK));
	if (j.chunk_elems > PROTO_DELTA_CHUNK_MAX) {
		rc = proto_errf(err, EINVAL, "delta encode: chunk of %u elements exceeds %u",
				j.chunk_elems, PROTO_DELTA_CHUNK_MAX);
		goto fail;
	}
	j.level = PROTO_MAX(PROTO_MIN(j.level, ZSTD_maxCLevel()), 1);
	match = malloc((cm->ntensors + 1) * sizeof(*match));
	psums = malloc((pm->ntensors + 1) * sizeof(*psums));
	csums = malloc((cm->ntensors + 1) * sizeof(*csums));
	tsums = malloc((cm->ntensors + 1) * sizeof(*tsums));
	if (match == NULL || psums == NULL || csums == NULL || tsums == NULL) {
		rc = proto_errf(err, ENOMEM, "delta encode: out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < cm->ntensors; i++) {
		const struct proto_tensor *ct = &cm->tensors[i];
		int64_t pi = proto_model_find(pm, ct->name);
		match[i] = PROTO_DELTA_NONE;
		if (pi >= 0 && pm->tensors[pi].dtype == ct->dtype && pm->tensors[pi].nelem == ct->nelem)
			match[i] = (uint32_t)pi;
		j.nchunks += (ct->nelem + j.chunk_elems - 1) / j.chunk_elems;
		j.wmax = PROTO_MAX(j.wmax, (uint32_t)proto_dtype_size(ct->dtype));
		j.maxn = (uint32_t)PROTO_MAX((uint64_t)j.maxn,
					     PROTO_MIN(ct->nelem, (uint64_t)j.chunk_elems));
	}
	j.match = match;
	j.ctensor = malloc((j.nchunks + 1) * sizeof(*j.ctensor));
	j.cbase = malloc((j.nchunks + 1) * sizeof(*j.cbase));
	j.outs = calloc(j.nchunks + 1, sizeof(*j.outs));
	if (j.ctensor == NULL || j.cbase == NULL || j.outs == NULL) {
		rc = proto_errf(err, ENOMEM, "delta encode: out of memory");
		goto fail;
	}
	for (uint64_t i = 0, ci = 0; i < cm->ntensors; i++)
		for (uint64_t b = 0; b < cm->tensors[i].nelem; b += j.chunk_elems, ci++) {
			j.ctensor[ci] = (uint32_t)i;
			j.cbase[ci] = b;
		}
	if (j.wmax == 0)
		j.wmax = 1;
	/* Every thread holds scratch for a chunk: no more threads than chunks. */
	nth = (unsigned)PROTO_MAX((uint64_t)1, PROTO_MIN((uint64_t)nth, j.nchunks));
	j.keep = nth == 1 && o != NULL ? o->keep : NULL;
	j.shares = calloc(nth, sizeof(*j.shares));
	if (j.shares == NULL) {
		rc = proto_errf(err, ENOMEM, "delta encode: out of memory");
		goto fail;
	}
	proto_pool_for(j.nchunks, nth, enc_chunk, &j);
	for (unsigned i = 0; i < nth; i++)
		if (j.shares[i].s == &j.shares[i].own)
			scratch_fini(&j.shares[i].own);
	free(j.shares);
	j.shares = NULL;
	if (j.rc != 0) {
		rc = j.rc;
		if (err != NULL)
			*err = j.err;
		goto fail;
	}
	/* Checksums: combined from the chunks' (the scan summed both sides);
	 * a parent tensor no child tensor patches is summed on its own. */
	if (parent->sums != NULL)
		memcpy(psums, parent->sums, pm->ntensors * sizeof(*psums));
	if (child->sums != NULL)
		memcpy(csums, child->sums, cm->ntensors * sizeof(*csums));
	for (uint32_t i = 0; i < pm->ntensors && parent->sums == NULL; i++)
		psums[i] = PROTO_WSUM_P; /* not a valid sum: marks "not yet known" */
	for (uint64_t i = 0, ci = 0; i < cm->ntensors; i++) {
		uint64_t ps = 0, cs = 0, ts = 0;
		for (uint64_t b = 0; b < cm->tensors[i].nelem; b += j.chunk_elems, ci++) {
			ps = proto_wsum_combine(ps, b, j.outs[ci].psum);
			cs = proto_wsum_combine(cs, b, j.outs[ci].csum);
			if (j.outs[ci].mode != PROTO_DELTA_ZERO)
				ts = proto_wsum_combine(ts, b, j.outs[ci].tsum);
		}
		tsums[i] = ts;
		/* (With the parent's sums known, cs is how far the changes moved
		 * the parent's: see scan.) */
		if (child->sums == NULL)
			csums[i] = parent->sums != NULL && match[i] != PROTO_DELTA_NONE
					   ? proto_wsum_combine(parent->sums[match[i]], 0, cs)
					   : cs;
		if (parent->sums == NULL && match[i] != PROTO_DELTA_NONE)
			psums[match[i]] = ps;
	}
	if (o != NULL && o->child_sums != NULL)
		memcpy(o->child_sums, csums, cm->ntensors * sizeof(*csums));
	for (uint32_t i = 0; i < pm->ntensors && parent->sums == NULL; i++)
		if (psums[i] == PROTO_WSUM_P)
			psums[i] = proto_wsum(proto_dtype_size(pm->tensors[i].dtype), parent->data[i],
					      pm->tensors[i].nelem);
	/* Assemble: fixed part, child header, tensor table, chunk table, body. */
	hdr_len = DELTA_FIXED + 8 + child->header_len +
		  (uint64_t)cm->ntensors * DELTA_TREC_TOUCHED;
	for (uint64_t ci = 0; ci < j.nchunks; ci++) {
		hdr_len += j.outs[ci].rec_len;
		body_len += j.outs[ci].streams_len;
	}
	if (hdr_len - DELTA_HASHED_FROM > proto_param(PROTO_PARAM_DELTA_HEADER_MAX)) {
		rc = proto_errf(err, EFBIG, "delta encode: header of %llu bytes exceeds the limit",
				(unsigned long long)hdr_len);
		goto fail;
	}
	buf = malloc(hdr_len + body_len);
	if (buf == NULL) {
		rc = proto_errf(err, ENOMEM, "delta encode: out of memory");
		goto fail;
	}
	memset(buf, 0, DELTA_FIXED);
	memcpy(buf, PROTO_DELTA_MAGIC, 8);
	delta__put_le64(buf + 40, hdr_len - DELTA_HASHED_FROM);
	delta__put_le32(buf + 48, DELTA_VERSION);
	delta__put_le32(buf + 52, PROTO_DELTA_F_TOUCHED);
	proto_delta_digest(parent->header, parent->header_len, psums, pm->ntensors, buf + 56);
	proto_delta_digest(child->header, child->header_len, csums, cm->ntensors, buf + 88);
	delta__put_le32(buf + 120, pm->ntensors);
	delta__put_le32(buf + 124, cm->ntensors);
	delta__put_le32(buf + 128, j.chunk_elems);
	p = buf + DELTA_FIXED;
	delta__put_le64(p, child->header_len);
	p += 8;
	memcpy(p, child->header, child->header_len);
	p += child->header_len;
	for (uint32_t i = 0; i < cm->ntensors; i++) {
		memset(p, 0, DELTA_TREC_TOUCHED);
		p[0] = (uint8_t)proto_dtype_size(cm->tensors[i].dtype);
		delta__put_le32(p + 4, match[i]);
		delta__put_le64(p + 8, cm->tensors[i].nelem);
		delta__put_le64(p + 16, match[i] == PROTO_DELTA_NONE ? 0 : psums[match[i]]);
		delta__put_le64(p + 24, csums[i]);
		delta__put_le64(p + 32, match[i] == PROTO_DELTA_NONE ? 0 : tsums[i]);
		p += DELTA_TREC_TOUCHED;
	}
	for (uint64_t ci = 0; ci < j.nchunks; ci++) {
		memcpy(p, j.outs[ci].rec, j.outs[ci].rec_len);
		p += j.outs[ci].rec_len;
	}
	for (uint64_t ci = 0; ci < j.nchunks; ci++) {
		if (j.outs[ci].streams_len)
			memcpy(p, j.outs[ci].streams, j.outs[ci].streams_len);
		p += j.outs[ci].streams_len;
	}
	crypto_generichash(buf + 8, 32, buf + DELTA_HASHED_FROM, hdr_len - DELTA_HASHED_FROM,
			   NULL, 0);
	if (st != NULL) {
		memset(st, 0, sizeof(*st));
		for (uint32_t i = 0; i < cm->ntensors; i++)
			st->nelem += cm->tensors[i].nelem;
		st->bytes = hdr_len + body_len;
		st->header_bytes = hdr_len;
		for (uint64_t ci = 0; ci < j.nchunks; ci++) {
			st->nchanged += j.outs[ci].nchanged;
			st->pos_bytes += j.outs[ci].pos_bytes;
			st->val_bytes += j.outs[ci].val_bytes;
			st->chunks[j.outs[ci].mode]++;
		}
	}
	*out = buf;
	*out_len = hdr_len + body_len;
	rc = 0;
fail:
	if (j.outs != NULL)
		for (uint64_t ci = 0; ci < j.nchunks; ci++)
			free(j.outs[ci].streams);
	free(j.outs);
	free(j.ctensor);
	free(j.cbase);
	free(match);
	free(psums);
	free(csums);
	free(tsums);
	pthread_mutex_destroy(&j.lock);
	return rc;
}
