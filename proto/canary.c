/* The canary score (proto/canary.h): a fixed-input pass through the weights. */
#include "proto/canary.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "proto/util.h"

/* An odd multiple of 1/32 in [-31/32, 31/32] from a 64-bit key. */
static float coef(uint64_t key)
{
	uint64_t h = key * 0x9E3779B97F4A7C15ull;
	h ^= h >> 29;
	h *= 0xBF58476D1CE4E5B9ull;
	int a = (int)((h >> 59) & 31) * 2 - 31;
	return (float)a / 32.0f;
}

static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15), e = (h >> 10) & 31, m = h & 1023;
	float v;

	if (e == 31)
		return NAN;
	v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), (int)e - 25);
	return sign ? -v : v;
}

/* fp8 e4m3 (the "fn" variant: no infinities, S.1111.111 is NaN). */
static float e4m3_to_float(uint8_t b)
{
	uint32_t e = (b >> 3) & 15, m = b & 7;
	float v;

	if (e == 15 && m == 7)
		return NAN;
	v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m | 8), (int)e - 10);
	return (b & 0x80) ? -v : v;
}

static float load(enum proto_dtype dt, const uint8_t *p)
{
	uint8_t b[8];
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;
	float f;
	double d;

	switch (dt) {
	case PROTO_DT_BF16:
		u32 = (uint32_t)(p[0] | p[1] << 8) << 16;
		memcpy(&f, &u32, 4);
		return f;
	case PROTO_DT_FP16:
		return half_to_float((uint16_t)(p[0] | p[1] << 8));
	case PROTO_DT_FP32:
		memcpy(&f, p, 4);
		return f;
	case PROTO_DT_FP64:
		memcpy(&d, p, 8);
		return (float)d;
	case PROTO_DT_FP8_E4M3:
		return e4m3_to_float(p[0]);
	case PROTO_DT_FP8_E5M2:
		return half_to_float((uint16_t)(p[0] << 8));
	case PROTO_DT_BOOL:
		return p[0] ? 1.0f : 0.0f;
	case PROTO_DT_U8:
		return (float)p[0];
	case PROTO_DT_I8:
		return (float)(int8_t)p[0];
	case PROTO_DT_U16:
		u16 = (uint16_t)(p[0] | p[1] << 8);
		return (float)u16;
	case PROTO_DT_I16:
		u16 = (uint16_t)(p[0] | p[1] << 8);
		return (float)(int16_t)u16;
	case PROTO_DT_U32:
	case PROTO_DT_I32:
		memcpy(&u32, p, 4);
		return dt == PROTO_DT_U32 ? (float)u32 : (float)(int32_t)u32;
	case PROTO_DT_U64:
	case PROTO_DT_I64:
		memcpy(b, p, 8);
		memcpy(&u64, b, 8);
		return dt == PROTO_DT_U64 ? (float)u64 : (float)(int64_t)u64;
	default:
		return 0.0f;
	}
}

/* x_j: an odd multiple of 1/32 in [-31/32, 31/32] from column j and the
 * tensor's salt; one multiplication, as it is taken for every element. */
static inline float xcoef(uint64_t j, uint32_t salt)
{
	uint32_t h = (uint32_t)j * 0x9E3779B1u + salt;
	return (float)((int)(h >> 27) * 2 - 31) * (1.0f / 32.0f);
}

/* g(w): w clamped to +-2^30 (NaN to -2^30): the product times 2^32 stays
 * below 2^63. */
static inline float clampw(float w)
{
	if (!(w >= -1073741824.0f)) /* NaN too */
		w = -1073741824.0f;
	return w > 1073741824.0f ? 1073741824.0f : w;
}

/* One element's term: w at column j of a row whose coefficient is u. */
static inline uint64_t term(float u, uint64_t j, uint32_t salt32, float w)
{
	float prod = (u * xcoef(j, salt32)) * clampw(w);
	return (uint64_t)(int64_t)(prod * 4294967296.0f);
}

/* The loop for one dtype: load is inlined, the row's u hoisted. */
#define CANARY_LOOP(LOADX)                                                            \
	for (uint64_t i = 0; i < count; i++) {                                        \
		sum += term(u, j, salt32, LOADX);                                     \
		if (++j == cols) {                                                    \
			j = 0;                                                        \
			u = coef(salt ^ (++r | 1ull << 63));                          \
		}                                                                     \
	}

static inline float bf16_at(const uint8_t *p)
{
	uint32_t u32 = (uint32_t)(p[0] | p[1] << 8) << 16;
	float f;
	memcpy(&f, &u32, 4);
	return f;
}

/*
 * The BF16 terms of n elements of one row (columns j0.., coefficient u),
 * summed: every term exactly as term() takes it, in a loop with no branch
 * and no state carried but the sum, so that the compiler vectorizes it;
 * built for x86-64-v4 (AVX-512: 16 terms at a time, float to int64 in one
 * instruction) and v3 besides the baseline, the widest the CPU has picked
 * at load (target_clones). Same IEEE operations per element, and the sum
 * is exact: bit for bit the scalar loop's. About 8 of the 9 ns a BF16
 * element cost scalar on the publisher's gather (NOTES.md).
 */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"), optimize("O3")))
#endif
static uint64_t row_bf16(float u, uint64_t j0, uint32_t salt32, uint64_t n, const uint8_t *b)
{
	uint64_t sum = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint16_t v;
		uint32_t bits;
		float w;
		memcpy(&v, b + 2 * i, 2);
		bits = (uint32_t)v << 16;
		memcpy(&w, &bits, 4);
		sum += term(u, j0 + i, salt32, w);
	}
	return sum;
}

uint64_t proto_canary_elems(enum proto_dtype dt, uint32_t index, uint64_t cols,
			    uint64_t first, uint64_t count, const uint8_t *bytes)
{
	size_t es = proto_dtype_size(dt);
	uint64_t salt = ((uint64_t)index + 1) << 40, sum = 0;
	uint32_t salt32 = (uint32_t)(index + 1) * 0x85EBCA6Bu;
	uint64_t r, j;
	float u;

	if (cols == 0)
		cols = 1;
	r = first / cols;
	j = first % cols;
	u = coef(salt ^ (r | 1ull << 63));
	if (dt == PROTO_DT_BF16) {
		/* Row by row: the coefficient changes only between rows. */
		while (count > 0) {
			uint64_t m = PROTO_MIN(count, cols - j);
			sum += row_bf16(u, j, salt32, m, bytes);
			bytes += m * 2;
			count -= m;
			if ((j += m) == cols) {
				j = 0;
				u = coef(salt ^ (++r | 1ull << 63));
			}
		}
	} else {
		CANARY_LOOP(load(dt, bytes + i * es))
	}
	return sum;
}

static uint64_t last_dim(const struct proto_local *l)
{
	return l->ndim == 0 ? 1 : l->shape[l->ndim - 1];
}

int proto_canary_rank(const struct proto_rank *rank, const uint8_t *block, size_t len,
		      uint64_t *out)
{
	uint64_t sum = 0;

	if (len < rank->nbytes)
		return -ERANGE;
	for (uint32_t t = 0; t < rank->nlocals; t++) {
		const struct proto_local *l = &rank->locals[t];
		sum += proto_canary_elems(l->dtype, t, last_dim(l), 0, l->nelem, block + l->offset);
	}
	*out = sum;
	return 0;
}

/* Whether element i of es bytes is the same in a and b. */
static inline bool same_elem(const uint8_t *a, const uint8_t *b, uint64_t i, size_t es)
{
	uint64_t x = 0, y = 0;

	switch (es) {
	case 1:
		return a[i] == b[i];
	case 2:
		memcpy(&x, a + i * 2, 2);
		memcpy(&y, b + i * 2, 2);
		return x == y;
	case 4:
		memcpy(&x, a + i * 4, 4);
		memcpy(&y, b + i * 4, 4);
		return x == y;
	default:
		return memcmp(a + i * es, b + i * es, es) == 0;
	}
}

/* Whether the 64 bytes at a and b are the same (eight word compares, no call). */
static inline bool same64(const uint8_t *a, const uint8_t *b)
{
	uint64_t d = 0, x, y;

	for (int k = 0; k < 64; k += 8) {
		memcpy(&x, a + k, 8);
		memcpy(&y, b + k, 8);
		d |= x ^ y;
	}
	return d == 0;
}

/* Where the changes walk: the row and column of element `at`, and the
 * coefficient of row `urow`. */
struct walk {
	enum proto_dtype dt;
	size_t es;
	uint64_t cols, r, j, at, urow, sum;
	uint32_t salt32;
	uint64_t salt;
	float u;
};

/* Element i (from the walk's start) changed from the element at old (NULL:
 * zero) to the one at nw: its new term less its old one. */
static inline void walk_elem(struct walk *w, const uint8_t *old, const uint8_t *nw, uint64_t i)
{
	w->j += i - w->at;
	w->at = i;
	if (w->j >= w->cols) {
		w->r += w->j / w->cols;
		w->j %= w->cols;
	}
	if (w->r != w->urow) {
		w->u = coef(w->salt ^ (w->r | 1ull << 63));
		w->urow = w->r;
	}
	float wo = old == NULL ? 0.0f : w->dt == PROTO_DT_BF16 ? bf16_at(old) : load(w->dt, old);
	float wn = w->dt == PROTO_DT_BF16 ? bf16_at(nw) : load(w->dt, nw);
	w->sum += term(w->u, w->j, w->salt32, wn) - term(w->u, w->j, w->salt32, wo);
}

static inline void walk_change(struct walk *w, const uint8_t *a, const uint8_t *b, uint64_t i)
{
	walk_elem(w, a + i * w->es, b + i * w->es, i);
}

/* A walk over local tensor index (dtype dt, last dimension cols) from its
 * element first on. */
static struct walk walk_start(enum proto_dtype dt, uint32_t index, uint64_t cols, uint64_t first)
{
	struct walk w = {.dt = dt, .es = proto_dtype_size(dt), .cols = cols ? cols : 1,
			 .urow = UINT64_MAX, .salt = ((uint64_t)index + 1) << 40,
			 .salt32 = (uint32_t)(index + 1) * 0x85EBCA6Bu};

	w.r = first / w.cols;
	w.j = first % w.cols;
	return w;
}

/*
 * What n elements at positions first.. add to the score when they change
 * from a to b: for each changed element its new term less its old one,
 * each term exactly as proto_canary_elems takes it. Most 64-byte blocks
 * have no change and cost one compare, then most of their words; the row
 * of a change is followed from the previous change's (a division only
 * across rows), its coefficient kept while the row stays.
 */
static uint64_t changes(enum proto_dtype dt, uint32_t index, uint64_t cols, uint64_t first,
			uint64_t n, const uint8_t *a, const uint8_t *b)
{
	struct walk w = walk_start(dt, index, cols, first);
	size_t es = w.es;
	uint64_t per = es >= 1 && es <= 8 && 8 % es == 0 ? 64 / es : 1, word = per / 8;

	for (uint64_t i0 = 0; i0 < n; i0 += per) {
		uint64_t m = PROTO_MIN(per, n - i0);
		if (m == per && per > 1 && same64(a + i0 * es, b + i0 * es))
			continue;
		for (uint64_t w0 = i0; w0 < i0 + m; w0 += PROTO_MAX(word, 1u)) {
			uint64_t k = PROTO_MIN(PROTO_MAX(word, 1u), i0 + m - w0), x, y;
			if (k == word && word > 1) {
				memcpy(&x, a + w0 * es, 8);
				memcpy(&y, b + w0 * es, 8);
				if (x == y)
					continue;
			}
			for (uint64_t i = w0; i < w0 + k; i++)
				if (!same_elem(a, b, i, es))
					walk_change(&w, a, b, i);
		}
	}
	return w.sum;
}

uint64_t proto_canary_parcel_update(const struct proto_plan *p, const struct proto_parcel *pc,
				    const struct proto_layout *dst, uint64_t parent_part,
				    const uint8_t *parent, const uint8_t *payload)
{
	const struct proto_rank *rk = &dst->ranks[pc->dst_rank];
	uint64_t sum = parent_part;

	for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++) {
		const struct proto_segment *sg = &p->segs[s];
		const struct proto_local *l = &rk->locals[sg->dst_local];
		size_t es = proto_dtype_size(l->dtype);
		for (uint64_t k = sg->run0; k < sg->run0 + sg->nruns; k++) {
			const struct proto_run *run = &p->runs[k];
			const uint8_t *a = parent ? parent + run->pay_off : NULL;
			const uint8_t *b = payload + run->pay_off;
			uint64_t n = run->len / es, first = run->dst_off / es;
			if (parent == NULL) {
				sum += proto_canary_elems(l->dtype, sg->dst_local, last_dim(l), first,
							  n, b);
				continue;
			}
			sum += changes(l->dtype, sg->dst_local, last_dim(l), first, n, a, b);
		}
	}
	return sum;
}

uint64_t proto_canary_parcel(const struct proto_plan *p, const struct proto_parcel *pc,
			     const struct proto_layout *dst, const uint8_t *payload)
{
	return proto_canary_parcel_update(p, pc, dst, 0, NULL, payload);
}

/* One run of a parcel for the map: where it lies in the payload and in
 * its destination tensor. */
struct map_run {
	uint64_t pay_off, end; /* payload bytes [pay_off, end) */
	uint64_t first;        /* its first element's index in the local tensor */
	uint64_t cols;
	uint32_t local;
	enum proto_dtype dt;
};

struct proto_canary_map {
	size_t n;
	struct map_run runs[]; /* by pay_off */
};

static int run_cmp(const void *a, const void *b)
{
	const struct map_run *x = a, *y = b;
	return x->pay_off < y->pay_off ? -1 : x->pay_off > y->pay_off;
}

struct proto_canary_map *proto_canary_map_new(const struct proto_plan *p,
					      const struct proto_parcel *pc,
					      const struct proto_layout *dst)
{
	const struct proto_rank *rk = &dst->ranks[pc->dst_rank];
	struct proto_canary_map *m;
	size_t n = 0;

	for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++)
		n += p->segs[s].nruns;
	m = malloc(sizeof(*m) + PROTO_MAX(n, 1) * sizeof(m->runs[0]));
	if (m == NULL)
		return NULL;
	m->n = 0;
	for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++) {
		const struct proto_segment *sg = &p->segs[s];
		const struct proto_local *l = &rk->locals[sg->dst_local];
		size_t es = proto_dtype_size(l->dtype);
		for (uint64_t k = sg->run0; k < sg->run0 + sg->nruns; k++) {
			const struct proto_run *run = &p->runs[k];
			if (run->len == 0)
				continue;
			m->runs[m->n++] = (struct map_run){
				.pay_off = run->pay_off, .end = run->pay_off + run->len,
				.first = run->dst_off / es, .cols = last_dim(l),
				.local = sg->dst_local, .dt = l->dtype};
		}
	}
	qsort(m->runs, m->n, sizeof(m->runs[0]), run_cmp);
	return m;
}

void proto_canary_map_free(struct proto_canary_map *m)
{
	free(m);
}

/* The run holding payload byte x, or NULL. */
static const struct map_run *map_find(const struct proto_canary_map *m, uint64_t x)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) { /* the first run starting after x */
		size_t mid = lo + (hi - lo) / 2;
		if (m->runs[mid].pay_off <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && x < m->runs[lo - 1].end ? &m->runs[lo - 1] : NULL;
}

uint64_t proto_canary_map_changes(const struct proto_canary_map *m, uint64_t off, size_t es,
				  const uint32_t *pos, size_t k, const uint8_t *a,
				  const uint8_t *b)
{
	const struct map_run *ru = NULL;
	struct walk w = {0};
	uint64_t sum = 0;

	for (size_t q = 0; q < k; q++) {
		uint64_t x = off + (uint64_t)pos[q] * es;
		if (ru == NULL || x >= ru->end) {
			sum += w.sum;
			/* Positions ascend: most often the next run holds it. */
			if (ru != NULL && ru + 1 < m->runs + m->n && x >= ru[1].pay_off &&
			    x < ru[1].end)
				ru++;
			else
				ru = map_find(m, x);
			if (ru == NULL || proto_dtype_size(ru->dt) != es) {
				/* Not the parcel's bytes: no element of it. */
				w = (struct walk){0};
				ru = NULL;
				continue;
			}
			w = walk_start(ru->dt, ru->local, ru->cols, ru->first);
		}
		walk_elem(&w, a != NULL ? a + (size_t)pos[q] * es : NULL, b + (size_t)pos[q] * es,
			  (x - ru->pay_off) / es);
	}
	return sum + w.sum;
}

/* The index of the first run ending after x (m->n when none). */
static size_t map_lower(const struct proto_canary_map *m, uint64_t x)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (m->runs[mid].end <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

uint64_t proto_canary_map_span(const struct proto_canary_map *m, uint64_t off, uint64_t len,
			       const uint8_t *payload)
{
	uint64_t sum = 0, end = off + len;

	for (size_t i = map_lower(m, off); i < m->n && m->runs[i].pay_off < end; i++) {
		const struct map_run *ru = &m->runs[i];
		uint64_t es = proto_dtype_size(ru->dt);
		uint64_t a = PROTO_MAX(off, ru->pay_off), b = PROTO_MIN(end, ru->end);
		uint64_t e0 = (a - ru->pay_off + es - 1) / es, e1 = (b - ru->pay_off) / es;
		if (e1 > e0)
			sum += proto_canary_elems(ru->dt, ru->local, ru->cols, ru->first + e0, e1 - e0,
						  payload + ru->pay_off + e0 * es);
	}
	return sum;
}

uint64_t proto_canary_map_straddler(const struct proto_canary_map *m, uint64_t x,
				    const uint8_t *payload)
{
	const struct map_run *ru = map_find(m, x);
	uint64_t es, e;

	if (ru == NULL || (es = proto_dtype_size(ru->dt)) == 0 || (x - ru->pay_off) % es == 0)
		return 0;
	e = (x - ru->pay_off) / es;
	return proto_canary_elems(ru->dt, ru->local, ru->cols, ru->first + e, 1,
				  payload + ru->pay_off + e * es);
}

double proto_canary_value(uint64_t s)
{
	return (double)(int64_t)s / PROTO_CANARY_ONE;
}
