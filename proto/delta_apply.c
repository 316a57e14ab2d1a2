/* Delta apply: decodes chunks in small batches and patches in place. */
#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "proto/delta_internal.h"
#include "proto/pool.h"
#include "proto/wsum.h"

#define SR_CAP (32u << 10) /* decoded bytes a stream reader holds */
/* Changes prefetched ahead of the write (chosen on the 1 GiB bench:
 * proto/NOTES.md). */
#define PF 64
#define BATCH PROTO_DELTA_BATCH
#define P PROTO_WSUM_P

static const uint8_t zeros[SR_CAP];

/* Pulls the decoded bytes of one stream, a window at a time. */
struct sreader {
	const uint8_t *src;
	uint64_t total, produced;
	ZSTD_DCtx *dctx;
	ZSTD_inBuffer in;
	uint8_t *buf;
	size_t rd, wr;
	bool zero;
	bool finished; /* the last zstd call completed the frame */
};

struct decoder {
	ZSTD_DCtx *dctx[PROTO_DELTA_MAX_STREAMS];
	uint8_t *bufs[PROTO_DELTA_MAX_STREAMS];
	struct sreader sr[PROTO_DELTA_MAX_STREAMS];
	uint32_t pos[BATCH];
	uint64_t val[BATCH];
	uint32_t esc[BATCH + 1]; /* batch indices of escaped values */
	struct proto_err err;
};

static int sr_open(struct sreader *r, struct decoder *dec, unsigned slot, const uint8_t *src,
		   size_t clen, uint64_t total, struct proto_err *err)
{
	unsigned long long fcs;

	memset(r, 0, sizeof(*r));
	r->total = total;
	if (clen == 0) {
		r->zero = true;
		return 0;
	}
	fcs = ZSTD_getFrameContentSize(src, clen);
	if (fcs == ZSTD_CONTENTSIZE_ERROR || fcs == ZSTD_CONTENTSIZE_UNKNOWN)
		return proto_errf(err, EINVAL, "stream %u: not a zstd frame with a content size",
				  slot);
	if (fcs != total)
		return proto_errf(err, EINVAL, "stream %u: frame declares %llu bytes, expected %llu",
				  slot, fcs, (unsigned long long)total);
	if (ZSTD_findFrameCompressedSize(src, clen) != clen)
		return proto_errf(err, EINVAL, "stream %u: frame does not fill its %zu bytes", slot,
				  clen);
	r->src = src;
	r->dctx = dec->dctx[slot];
	r->buf = dec->bufs[slot];
	r->in.src = src;
	r->in.size = clen;
	ZSTD_DCtx_reset(r->dctx, ZSTD_reset_session_only);
	return 0;
}

/* n (<= SR_CAP) decoded bytes, valid until the next call; NULL on error. */
static const uint8_t *sr_get(struct sreader *r, size_t n, struct proto_err *err)
{
	const uint8_t *p;

	if (r->zero) {
		if (n > r->total - r->produced) {
			proto_errf(err, EINVAL, "stream ends before the chunk does");
			return NULL;
		}
		r->produced += n;
		return zeros;
	}
	if (r->wr - r->rd < n) {
		if (r->rd > 0) {
			memmove(r->buf, r->buf + r->rd, r->wr - r->rd);
			r->wr -= r->rd;
			r->rd = 0;
		}
		while (r->wr < n) {
			uint64_t room = PROTO_MIN((uint64_t)(SR_CAP - r->wr), r->total - r->produced);
			ZSTD_outBuffer out = {r->buf, r->wr + room, r->wr};
			size_t in0 = r->in.pos, ret;
			if (room == 0) {
				proto_errf(err, EINVAL, "stream ends before the chunk does");
				return NULL;
			}
			ret = ZSTD_decompressStream(r->dctx, &out, &r->in);
			if (ZSTD_isError(ret)) {
				proto_errf(err, EINVAL, "zstd: %s", ZSTD_getErrorName(ret));
				return NULL;
			}
			r->produced += out.pos - r->wr;
			r->finished = ret == 0;
			if (ret == 0 && r->produced != r->total) {
				proto_errf(err, EINVAL, "frame ends before its declared size");
				return NULL;
			}
			if (out.pos == r->wr && r->in.pos == in0) {
				proto_errf(err, EINVAL, "stream truncated");
				return NULL;
			}
			r->wr = out.pos;
		}
	}
	p = r->buf + r->rd;
	r->rd += n;
	return p;
}

/* The stream must be fully consumed and its frame complete (checksum). */
static int sr_end(struct sreader *r, struct proto_err *err)
{
	uint8_t extra;

	if (r->produced != r->total || (!r->zero && r->rd != r->wr))
		return proto_errf(err, EINVAL, "stream has %llu bytes the chunk does not use",
				  (unsigned long long)(r->total - r->produced + (r->wr - r->rd)));
	if (r->zero)
		return 0;
	while (!r->finished) {
		ZSTD_outBuffer out = {&extra, 1, 0};
		size_t in0 = r->in.pos, ret = ZSTD_decompressStream(r->dctx, &out, &r->in);
		if (ZSTD_isError(ret))
			return proto_errf(err, EINVAL, "zstd: %s", ZSTD_getErrorName(ret));
		if (out.pos != 0)
			return proto_errf(err, EINVAL, "frame holds more than it declares");
		r->finished = ret == 0;
		if (!r->finished && r->in.pos == in0)
			return proto_errf(err, EINVAL, "frame truncated");
	}
	return r->in.pos == r->in.size ? 0 : proto_errf(err, EINVAL, "bytes after the frame");
}

static int read_varint(struct sreader *r, uint64_t *out, struct proto_err *err)
{
	uint64_t v = 0;

	for (unsigned shift = 0; shift < 35; shift += 7) {
		const uint8_t *b = sr_get(r, 1, err);
		if (b == NULL)
			return -EINVAL;
		v |= (uint64_t)(*b & 0x7f) << shift;
		if (!(*b & 0x80)) {
			*out = v;
			return 0;
		}
	}
	return proto_errf(err, EINVAL, "wide gap varint too long");
}

/* The position after *prev that gap byte g (255: 255 plus a wide gap from
 * stream 1) names, checked against the chunk's n elements. */
static inline int gap_pos(struct decoder *dec, uint8_t g, uint32_t n, uint32_t *prev, uint32_t *out,
			  struct proto_err *err)
{
	uint64_t gap = g, p;

	if (__builtin_expect(gap == 255, 0)) {
		if (read_varint(&dec->sr[1], &gap, err) != 0)
			return -EINVAL;
		gap += 255;
	}
	p = *prev + gap;
	if (__builtin_expect(p >= n, 0))
		return proto_errf(err, EINVAL, "gap stream runs past the end of the chunk");
	*out = (uint32_t)p;
	*prev = (uint32_t)p + 1;
	return 0;
}

/*
 * m differences into dec->val: coded values c (NIB or PLANES) plus bias,
 * unzigzagged. NIB goes through a 16-entry table; escapes (nibble 15) take
 * their c - 15 from the escape planes. *nesc counts escapes.
 */
static int get_values(struct decoder *dec, const struct proto_delta_chunk *c, unsigned s0,
		      uint32_t w, uint32_t m, uint64_t bias, uint64_t *nesc, struct proto_err *err)
{
	uint64_t *val = dec->val, mask = delta__mask(w);
	uint32_t *esc = dec->esc;

	if (c->vcode == PROTO_DELTA_NIB) {
		const uint8_t *nb = sr_get(&dec->sr[s0], (m + 1) / 2, err);
		uint64_t tab[16];
		uint32_t e = 0, j;

		if (nb == NULL)
			return -EINVAL;
		for (unsigned q = 0; q < 16; q++)
			tab[q] = delta__unzz(q + bias, w);
		/* Escapes are noted as they pass (esc[] has room for all m): a
		 * store per value beats a second scan of the nibbles. */
		for (j = 0; j + 1 < m; j += 2) {
			uint8_t b = nb[j >> 1];
			val[j] = tab[b & 15];
			val[j + 1] = tab[b >> 4];
			esc[e] = j;
			e += (b & 15) == 15;
			esc[e] = j + 1;
			e += (b >> 4) == 15;
		}
		if (m & 1) {
			uint8_t b = nb[m >> 1];
			if (b >> 4)
				return proto_errf(err, EINVAL, "non-zero padding nibble");
			val[m - 1] = tab[b & 15];
			esc[e] = m - 1;
			e += (b & 15) == 15;
		}
		if (e > 0) {
			const uint8_t *pl[8];
			for (uint32_t b = 0; b < w; b++) {
				pl[b] = sr_get(&dec->sr[s0 + 1 + b], e, err);
				if (pl[b] == NULL)
					return -EINVAL;
			}
			for (uint32_t at = 0; at < e; at++) {
				uint64_t x = 0;
				for (uint32_t b = 0; b < w; b++)
					x |= (uint64_t)pl[b][at] << (8 * b);
				if (x > mask - 15 - bias)
					return proto_errf(err, EINVAL, "escaped value out of range");
				val[esc[at]] = delta__unzz(15 + x + bias, w);
			}
		}
		*nesc += e;
		return 0;
	}
	{
		const uint8_t *pl = sr_get(&dec->sr[s0], m, err);
		if (pl == NULL)
			return -EINVAL;
		for (uint32_t j = 0; j < m; j++)
			val[j] = pl[j];
		for (uint32_t b = 1; b < w; b++) {
			pl = sr_get(&dec->sr[s0 + b], m, err);
			if (pl == NULL)
				return -EINVAL;
			for (uint32_t j = 0; j < m; j++)
				val[j] |= (uint64_t)pl[j] << (8 * b);
		}
		for (uint32_t j = 0; j < m; j++) {
			if (bias && val[j] == mask)
				return proto_errf(err, EINVAL, "change value out of range");
			val[j] = delta__unzz(val[j] + bias, w);
		}
	}
	return 0;
}

static inline uint64_t modp(__int128 x)
{
	__int128 r = x % P;
	return (uint64_t)(r < 0 ? r + P : r);
}

/*
 * Writing changes. PUT adds difference val[k] to the element at pos[k], the
 * checksum movement to sa / sb and the old element to ta / tb (the touched
 * checksum). Narrow elements keep exact 64-bit sums within a batch:
 * |delta| < 2^16 and positions < 2^24, so 4096 terms stay below 2^52; wide
 * ones sum in 128 bits, each term reduced mod P.
 */
#define PUT(T, W, VAL, k)                                                         \
	do {                                                                      \
		uint8_t *q_ = base + (size_t)pos[k] * W;                          \
		T o_, n_;                                                         \
		memcpy(&o_, q_, W);                                               \
		n_ = (T)(o_ + (T)val[k]);                                         \
		memcpy(q_, &n_, W);                                               \
		__typeof__(sa) dl_ = (__typeof__(sa))VAL(n_) - (__typeof__(sa))VAL(o_); \
		sa += dl_;                                                        \
		sb += (__typeof__(sa))(pos[k] + 1) * dl_;                         \
		ta += (__typeof__(sa))VAL(o_);                                    \
		tb += (__typeof__(sa))(pos[k] + 1) * (__typeof__(sa))VAL(o_);     \
	} while (0)

/* TAKE takes change k back out (no sums: the undo path). */
#define TAKE(T, W, k)                                                             \
	do {                                                                      \
		uint8_t *q_ = base + (size_t)pos[k] * W;                          \
		T o_;                                                             \
		memcpy(&o_, q_, W);                                               \
		o_ = (T)(o_ - (T)val[k]);                                         \
		memcpy(q_, &o_, W);                                               \
	} while (0)

/* Adds a batch's sums to the chunk's: movement (A, B), then touched. */
#define ADD_SUMS(ms)                                                              \
	do {                                                                      \
		(ms)[0] = ((ms)[0] + modp(sa)) % P;                               \
		(ms)[1] = ((ms)[1] + modp(sb)) % P;                               \
		(ms)[2] = ((ms)[2] + modp(ta)) % P;                               \
		(ms)[3] = ((ms)[3] + modp(tb)) % P;                               \
	} while (0)

/*
 * Writes m decoded changes (positions pos, differences val) into base and
 * adds the checksum movement and the touched checksum to ms[0..3]; with
 * undo, subtracts and skips the sums.
 */
#define RMW_FN(name, T, W, ACC, VAL)                                              \
	static void name(uint8_t *base, const uint32_t *pos, const uint64_t *val,     \
			 uint32_t m, bool undo, uint64_t *ms)                         \
	{                                                                         \
		ACC sa = 0, sb = 0, ta = 0, tb = 0;                               \
		if (undo) {                                                       \
			for (uint32_t j = 0; j < m; j++)                          \
				TAKE(T, W, j);                                    \
			return;                                                   \
		}                                                                 \
		for (uint32_t j = 0; j < m; j++) {                                \
			if (j + PF < m)                                           \
				__builtin_prefetch(base + (size_t)pos[j + PF] * W, 1, 0); \
			PUT(T, W, VAL, j);                                        \
		}                                                                 \
		ADD_SUMS(ms);                                                     \
	}

/*
 * Sparse chunks: decodes m gaps (g, and the wide-gap stream) into positions
 * from *prev on and writes each change PF positions behind the one just
 * decoded, so that decoding overlaps the writes' memory stalls. The
 * differences are in dec->val already. On error nothing of the batch stays
 * written, so that the undo replays whole batches. Faster than decoding
 * every position of a batch first (proto/NOTES.md).
 */
#define GAPS_FN(name, T, W, ACC, VAL)                                             \
	static int name(struct decoder *dec, const uint8_t *g, uint32_t m, uint32_t n,  \
			uint8_t *base, uint32_t *prevp, uint64_t *ms,                     \
			struct proto_err *err)                                            \
	{                                                                         \
		uint32_t *pos = dec->pos, prev = *prevp, j;                        \
		const uint64_t *val = dec->val;                                    \
		ACC sa = 0, sb = 0, ta = 0, tb = 0;                               \
		int rc = 0;                                                       \
		for (j = 0; j < m; j++) {                                         \
			rc = gap_pos(dec, g[j], n, &prev, &pos[j], err);           \
			if (rc != 0)                                              \
				break;                                            \
			__builtin_prefetch(base + (size_t)pos[j] * W, 1, 0);      \
			if (j >= PF)                                              \
				PUT(T, W, VAL, j - PF);                           \
		}                                                                 \
		if (rc != 0) {                                                    \
			/* Take back this batch's writes: the undo replays whole  \
			 * batches only. */                                       \
			for (uint32_t k = 0; k + PF < j; k++)                     \
				TAKE(T, W, k);                                    \
			return rc;                                                \
		}                                                                 \
		for (uint32_t k = m > PF ? m - PF : 0; k < m; k++)                \
			PUT(T, W, VAL, k);                                        \
		*prevp = prev;                                                    \
		ADD_SUMS(ms);                                                     \
		return 0;                                                         \
	}

#define ID(x) (x)
#define MODP(x) ((x) % P)
#define WIDTHS(FN, prefix)                                                        \
	FN(prefix##1, uint8_t, 1, int64_t, ID)                                    \
	FN(prefix##2, uint16_t, 2, int64_t, ID)                                   \
	FN(prefix##4, uint32_t, 4, __int128, MODP)                                \
	FN(prefix##8, uint64_t, 8, __int128, MODP)
WIDTHS(RMW_FN, rmw)
WIDTHS(GAPS_FN, gaps)

static void rmw(uint32_t w, uint8_t *base, const uint32_t *pos, const uint64_t *val, uint32_t m,
		bool undo, uint64_t *ms)
{
	switch (w) {
	case 1:
		rmw1(base, pos, val, m, undo, ms);
		break;
	case 2:
		rmw2(base, pos, val, m, undo, ms);
		break;
	case 4:
		rmw4(base, pos, val, m, undo, ms);
		break;
	default:
		rmw8(base, pos, val, m, undo, ms);
		break;
	}
}

static int gaps(uint32_t w, struct decoder *dec, const uint8_t *g, uint32_t m, uint32_t n,
		uint8_t *base, uint32_t *prev, uint64_t *ms, struct proto_err *err)
{
	switch (w) {
	case 1:
		return gaps1(dec, g, m, n, base, prev, ms, err);
	case 2:
		return gaps2(dec, g, m, n, base, prev, ms, err);
	case 4:
		return gaps4(dec, g, m, n, base, prev, ms, err);
	default:
		return gaps8(dec, g, m, n, base, prev, ms, err);
	}
}

/* Walks set bits of a bitmap stream. */
struct bitwalk {
	uint64_t word, wbase; /* current bits and the element of bit 0 */
	uint64_t bytes_read, nbytes;
};

static int bits_next(struct decoder *dec, struct sreader *r, struct bitwalk *bw, uint32_t n,
		     uint32_t *out, uint32_t m, struct proto_err *err)
{
	for (uint32_t j = 0; j < m;) {
		while (bw->word == 0) {
			size_t take = (size_t)PROTO_MIN((uint64_t)8, bw->nbytes - bw->bytes_read);
			const uint8_t *b;
			if (take == 0)
				return proto_errf(err, EINVAL, "bitmap has fewer bits than changes");
			b = sr_get(r, take, err);
			if (b == NULL)
				return -EINVAL;
			bw->word = 0;
			memcpy(&bw->word, b, take);
			bw->wbase = bw->bytes_read * 8;
			bw->bytes_read += take;
		}
		uint64_t p = bw->wbase + (uint64_t)__builtin_ctzll(bw->word);
		bw->word &= bw->word - 1;
		if (p >= n)
			return proto_errf(err, EINVAL, "bitmap bit past the end of the chunk");
		out[j++] = (uint32_t)p;
	}
	(void)dec;
	return 0;
}

/*
 * Applies (or with undo, reverts the first `limit` changes of) chunk c to the
 * chunk's first element at base. *done counts changes (elements for DENSE)
 * written, also on error; part[0] receives the checksum movement of the
 * chunk and part[1] the touched checksum (positions from the chunk's start).
 */
static int apply_chunk(struct decoder *dec, const struct proto_delta *d,
		       const struct proto_delta_chunk *c, uint8_t *base, bool undo, uint64_t limit,
		       uint64_t *done, uint64_t part[2], delta__emit_fn emit, void *emit_arg,
		       struct proto_err *err)
{
	const struct proto_delta_tensor *t = &d->tensors[c->tensor];
	uint32_t w = t->elsize;
	uint64_t dlen[PROTO_DELTA_MAX_STREAMS], at = c->off, ms[4] = {0, 0, 0, 0};
	uint64_t count = c->mode == PROTO_DELTA_DENSE ? c->n : c->nchanges, nesc = 0;
	unsigned ns = delta__streams(c, w, dlen), s0;
	struct bitwalk bw = {0, 0, 0, ((uint64_t)c->n + 7) / 8};
	uint32_t prev = 0;
	int rc;

	*done = 0;
	part[0] = part[1] = 0;
	for (unsigned s = 0; s < ns; s++) {
		rc = sr_open(&dec->sr[s], dec, s, d->buf + at, c->clen[s], dlen[s], err);
		if (rc != 0)
			return rc;
		at += c->clen[s];
	}
	s0 = c->mode == PROTO_DELTA_SPARSE ? 2 : c->mode == PROTO_DELTA_BITMAP ? 1 : 0;
	if (undo)
		count = PROTO_MIN(count, limit);
	for (uint64_t k = 0; k < count;) {
		uint32_t m = (uint32_t)PROTO_MIN((uint64_t)BATCH, count - k);
		if (c->mode == PROTO_DELTA_SPARSE && !undo && emit == NULL) {
			/* Values first, then positions fused with the writes. */
			const uint8_t *g = sr_get(&dec->sr[0], m, err);
			if (g == NULL)
				return -EINVAL;
			rc = get_values(dec, c, s0, w, m, true, &nesc, err);
			if (rc != 0)
				return rc;
			rc = gaps(w, dec, g, m, c->n, base, &prev, ms, err);
			if (rc != 0)
				return rc;
			k += m;
			*done = k;
			continue;
		}
		if (c->mode == PROTO_DELTA_SPARSE) { /* the undo's replay, or emit */
			const uint8_t *g = sr_get(&dec->sr[0], m, err);
			if (g == NULL)
				return -EINVAL;
			/* g stays valid: the wide stream has its own window. */
			for (uint32_t j = 0; j < m; j++)
				if (gap_pos(dec, g[j], c->n, &prev, &dec->pos[j], err) != 0)
					return -EINVAL;
		} else if (c->mode == PROTO_DELTA_BITMAP) {
			if (bits_next(dec, &dec->sr[0], &bw, c->n, dec->pos, m, err) != 0)
				return -EINVAL;
		} else {
			for (uint32_t j = 0; j < m; j++)
				dec->pos[j] = (uint32_t)(k + j);
		}
		rc = get_values(dec, c, s0, w, m, c->mode != PROTO_DELTA_DENSE, &nesc, err);
		if (rc != 0)
			return rc;
		if (emit != NULL)
			emit(emit_arg, dec->pos, dec->val, m);
		else
			rmw(w, base, dec->pos, dec->val, m, undo, ms);
		k += m;
		*done = k;
	}
	if (undo)
		return 0;
	if (nesc != c->nesc)
		return proto_errf(err, EINVAL, "%llu escapes, %u declared",
				  (unsigned long long)nesc, c->nesc);
	if (c->mode == PROTO_DELTA_BITMAP) {
		/* No set bit may remain. */
		if (bw.word != 0)
			return proto_errf(err, EINVAL, "bitmap has more bits than changes");
		while (bw.bytes_read < bw.nbytes) {
			size_t take = (size_t)PROTO_MIN((uint64_t)SR_CAP, bw.nbytes - bw.bytes_read);
			const uint8_t *b = sr_get(&dec->sr[0], take, err);
			if (b == NULL)
				return -EINVAL;
			for (size_t i = 0; i < take; i++)
				if (b[i])
					return proto_errf(err, EINVAL, "bitmap has more bits than changes");
			bw.bytes_read += take;
		}
	}
	for (unsigned s = 0; s < ns; s++) {
		rc = sr_end(&dec->sr[s], err);
		if (rc != 0) {
			proto_err_prefix(err, "stream %u", s);
			return rc;
		}
	}
	part[0] = ms[1] << 32 | ms[0];
	part[1] = ms[3] << 32 | ms[2];
	return 0;
}

struct job {
	const struct proto_delta *d;
	uint8_t *const *bufs;
	uint32_t *work; /* chunks that change something */
	uint64_t nwork;
	struct decoder **decs; /* one per thread of the apply */
	uint64_t *done;
	uint64_t (*part)[2]; /* per chunk: movement and touched checksum */
	pthread_mutex_t lock;
	int rc;
	uint32_t err_chunk;
	struct proto_err err;
};

static int decoder_init(struct decoder *dec)
{
	memset(dec, 0, sizeof(*dec));
	for (unsigned s = 0; s < PROTO_DELTA_MAX_STREAMS; s++) {
		dec->dctx[s] = ZSTD_createDCtx();
		dec->bufs[s] = malloc(SR_CAP);
		if (dec->dctx[s] == NULL || dec->bufs[s] == NULL)
			return -ENOMEM;
		ZSTD_DCtx_setParameter(dec->dctx[s], ZSTD_d_windowLogMax, 25);
	}
	return 0;
}

static void decoder_fini(struct decoder *dec)
{
	for (unsigned s = 0; s < PROTO_DELTA_MAX_STREAMS; s++) {
		ZSTD_freeDCtx(dec->dctx[s]);
		free(dec->bufs[s]);
	}
}

/*
 * Decoders (zstd contexts and stream windows, ~0.8 MiB each) kept between
 * applies. A node applies one delta per version; made afresh for each, a
 * decoder's pages were mapped and faulted in again every time. At most
 * KEPT_MAX are kept, for the life of the process; proto_delta_apply_warm
 * makes them ahead.
 */
#define KEPT_MAX 16
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static struct decoder *kept[KEPT_MAX];
static unsigned nkept;

static void decoder_free(struct decoder *dec)
{
	if (dec != NULL) {
		decoder_fini(dec);
		free(dec);
	}
}

/* A kept decoder, or a new one; NULL when out of memory. */
static struct decoder *decoder_get(void)
{
	struct decoder *dec = NULL;

	pthread_mutex_lock(&kept_mu);
	if (nkept > 0)
		dec = kept[--nkept];
	pthread_mutex_unlock(&kept_mu);
	if (dec != NULL)
		return dec;
	if ((dec = malloc(sizeof(*dec))) != NULL && decoder_init(dec) != 0) {
		decoder_free(dec); /* decoder_init left what it made: fini frees it */
		dec = NULL;
	}
	return dec;
}

/* Keeps dec for the next apply (or frees it when KEPT_MAX are kept). */
static void decoder_put(struct decoder *dec)
{
	pthread_mutex_lock(&kept_mu);
	if (dec != NULL && nkept < KEPT_MAX) {
		kept[nkept++] = dec;
		dec = NULL;
	}
	pthread_mutex_unlock(&kept_mu);
	decoder_free(dec);
}

int proto_delta_apply_warm(unsigned threads)
{
	struct decoder *decs[KEPT_MAX];
	unsigned n = threads < KEPT_MAX ? threads : KEPT_MAX, got = 0;
	int rc = 0;

	/* Take them all at once, so that n distinct ones are kept. */
	for (; got < n; got++)
		if ((decs[got] = decoder_get()) == NULL) {
			rc = -ENOMEM;
			break;
		}
	for (unsigned i = 0; i < got; i++) {
		/* The windows' pages, faulted in now rather than in an apply. */
		for (unsigned s = 0; s < PROTO_DELTA_MAX_STREAMS; s++)
			memset(decs[i]->bufs[s], 0, SR_CAP);
		decoder_put(decs[i]);
	}
	proto_pool_reserve(n);
	return rc;
}

static uint8_t *chunk_base(const struct proto_delta *d, uint8_t *const *bufs, uint32_t ci)
{
	const struct proto_delta_chunk *c = &d->chunks[ci];
	return bufs[c->tensor] + c->base * d->tensors[c->tensor].elsize;
}

/* Applies the i-th chunk that changes something, on the thread's decoder
 * (allocated before any thread starts). */
static int apply_one(void *arg, unsigned slot, uint64_t i)
{
	struct job *j = arg;
	struct decoder *dec = j->decs[slot];
	uint32_t ci = j->work[i];
	int rc = apply_chunk(dec, j->d, &j->d->chunks[ci], chunk_base(j->d, j->bufs, ci), false, 0,
			     &j->done[ci], j->part[ci], NULL, NULL, &dec->err);

	if (rc == 0)
		return 0;
	pthread_mutex_lock(&j->lock);
	if (j->rc == 0 || ci < j->err_chunk) {
		j->rc = rc;
		j->err_chunk = ci;
		j->err = dec->err;
	}
	pthread_mutex_unlock(&j->lock);
	return 1;
}

/* Reverts every chunk that wrote something, with a decoder allocated before
 * the apply started. The bytes were validated when first decoded and decode
 * the same way again, so the replay cannot fail. */
static void undo_all(struct job *j, struct decoder *dec)
{
	struct proto_err e;
	uint64_t dn, part[2];

	for (uint64_t i = 0; i < j->nwork; i++) {
		uint32_t ci = j->work[i];
		if (j->done[ci] == 0)
			continue;
		if (apply_chunk(dec, j->d, &j->d->chunks[ci], chunk_base(j->d, j->bufs, ci), true,
				j->done[ci], &dn, part, NULL, NULL, &e) != 0 || dn != j->done[ci])
			abort(); /* unreachable; never leave half-patched bytes silently */
	}
}

struct delta__decoder *delta__decoder_new(void)
{
	struct decoder *dec = malloc(sizeof(*dec));

	if (dec != NULL && decoder_init(dec) != 0) {
		decoder_fini(dec);
		free(dec);
		dec = NULL;
	}
	return (struct delta__decoder *)dec;
}

void delta__decoder_free(struct delta__decoder *w)
{
	if (w != NULL) {
		decoder_fini((struct decoder *)w);
		free(w);
	}
}

int delta__decode_chunk(struct delta__decoder *w, const struct proto_delta *d, uint32_t ci,
			delta__emit_fn emit, void *arg, struct proto_err *err)
{
	uint64_t done, part[2];

	return apply_chunk((struct decoder *)w, d, &d->chunks[ci], NULL, false, 0, &done, part, emit,
			   arg, err);
}

int proto_delta_apply(const struct proto_delta *d, const struct proto_delta_parent *parent,
		      uint8_t *const *bufs, unsigned threads, struct proto_err *err)
{
	uint64_t *sums = NULL;
	struct decoder **decs = NULL;
	unsigned ready = 0;
	struct job j;
	int rc;

	memset(&j, 0, sizeof(j));
	pthread_mutex_init(&j.lock, NULL);
	j.d = d;
	j.bufs = bufs;
	rc = proto_delta_check_parent(d, parent, err);
	if (rc != 0)
		goto out;
	sums = malloc((d->ntensors + 1) * sizeof(*sums));
	j.work = malloc((d->nchunks + 1) * sizeof(*j.work));
	j.done = calloc(d->nchunks + 1, sizeof(*j.done));
	j.part = calloc(d->nchunks + 1, sizeof(*j.part));
	if (sums == NULL || j.work == NULL || j.done == NULL || j.part == NULL) {
		rc = proto_errf(err, ENOMEM, "delta apply: out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < d->ntensors; i++) {
		const struct proto_delta_tensor *t = &d->tensors[i];
		if (t->parent == PROTO_DELTA_NONE) {
			/* A new tensor: start from what the buffer holds (zeros). */
			sums[i] = proto_wsum(t->elsize, bufs[i], t->nelem);
		} else if (parent->sums[t->parent] != t->parent_sum) {
			rc = proto_errf(err, EINVAL,
					"delta: tensor %u: parent tensor %u checksum differs from the delta's",
					i, t->parent);
			goto out;
		} else {
			sums[i] = t->parent_sum;
		}
	}
	for (uint32_t ci = 0; ci < d->nchunks; ci++)
		if (d->chunks[ci].mode != PROTO_DELTA_ZERO)
			j.work[j.nwork++] = ci;
	if (threads == 0)
		threads = 1;
	if (threads > j.nwork)
		threads = (unsigned)PROTO_MAX(j.nwork, (uint64_t)1);
	/* Decoders (zstd contexts and windows) exist before anything is
	 * written, so that undo never needs memory; decoder 0 also serves the
	 * undo. */
	decs = calloc(threads, sizeof(*decs));
	if (decs == NULL) {
		rc = proto_errf(err, ENOMEM, "delta apply: out of memory");
		goto out;
	}
	for (ready = 0; ready < threads; ready++)
		if ((decs[ready] = decoder_get()) == NULL) {
			rc = proto_errf(err, ENOMEM, "delta apply: out of memory");
			goto out;
		}
	j.decs = decs;
	proto_pool_for(j.nwork, threads, apply_one, &j);
	if (j.rc != 0) {
		rc = j.rc;
		if (err != NULL)
			*err = j.err;
		proto_err_prefix(err, "delta: tensor %u chunk %u", d->chunks[j.err_chunk].tensor,
				 j.err_chunk - d->tensors[d->chunks[j.err_chunk].tensor].chunk0);
		undo_all(&j, decs[0]);
		goto out;
	}
	for (uint32_t i = 0; i < d->ntensors; i++) {
		const struct proto_delta_tensor *t = &d->tensors[i];
		uint64_t s = sums[i], ts = 0;
		for (uint32_t k = 0; k < t->nchunks; k++) {
			const struct proto_delta_chunk *c = &d->chunks[t->chunk0 + k];
			if (c->mode == PROTO_DELTA_ZERO)
				continue;
			s = proto_wsum_combine(s, c->base, j.part[t->chunk0 + k][0]);
			ts = proto_wsum_combine(ts, c->base, j.part[t->chunk0 + k][1]);
		}
		/* The old elements it read are the parent's: the movement alone
		 * is blind to a parent damaged where the delta writes. */
		if ((d->flags & PROTO_DELTA_F_TOUCHED) && t->parent != PROTO_DELTA_NONE &&
		    ts != t->touched_sum) {
			rc = proto_errf(err, EINVAL,
					"delta: tensor %u: the parent differs where the delta writes "
					"(checksum %016llx there, the delta's parent has %016llx)",
					i, (unsigned long long)ts, (unsigned long long)t->touched_sum);
			undo_all(&j, decs[0]);
			goto out;
		}
		if (s != t->child_sum) {
			rc = proto_errf(err, EINVAL,
					"delta: tensor %u: checksum after apply is %016llx, the child's is %016llx",
					i, (unsigned long long)s, (unsigned long long)t->child_sum);
			undo_all(&j, decs[0]);
			goto out;
		}
	}
	rc = 0;
out:
	for (unsigned i = 0; i < ready; i++)
		decoder_put(decs[i]);
	free(decs);
	free(sums);
	free(j.work);
	free(j.done);
	free(j.part);
	pthread_mutex_destroy(&j.lock);
	return rc;
}
