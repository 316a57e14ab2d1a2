/* Internals shared by the delta codec's files (format, encode, apply). */
#ifndef PROTO_DELTA_INTERNAL_H
#define PROTO_DELTA_INTERNAL_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#include "proto/delta.h"

#define DELTA_FIXED 136u      /* bytes before the child header */
#define DELTA_HASHED_FROM 40u /* the header hash covers [40, body) */
#define DELTA_TREC 32u        /* bytes per tensor record (flags 0) */
#define DELTA_TREC_TOUCHED 40u /* with PROTO_DELTA_F_TOUCHED: + u64 touched_sum */
#define DELTA_VERSION 1u

/* Decoded length of each stream of a chunk; returns the stream count. */
static inline unsigned delta__streams(const struct proto_delta_chunk *c, uint32_t w,
				      uint64_t *dlen)
{
	unsigned s = 0;
	uint64_t count = c->mode == PROTO_DELTA_DENSE ? c->n : c->nchanges;

	if (c->mode == PROTO_DELTA_ZERO)
		return 0;
	if (c->mode == PROTO_DELTA_SPARSE) {
		dlen[s++] = c->nchanges;
		dlen[s++] = c->wide_len;
	} else if (c->mode == PROTO_DELTA_BITMAP) {
		dlen[s++] = ((uint64_t)c->n + 7) / 8;
	}
	if (c->vcode == PROTO_DELTA_NIB) {
		dlen[s++] = (count + 1) / 2;
		for (uint32_t b = 0; b < w; b++)
			dlen[s++] = c->nesc;
	} else {
		for (uint32_t b = 0; b < w; b++)
			dlen[s++] = count;
	}
	return s;
}

static inline uint64_t delta__mask(uint32_t w)
{
	return w >= 8 ? ~0ull : (1ull << (8 * w)) - 1;
}

/* Zigzag of a w-byte signed difference (both in the low 8w bits). */
static inline uint64_t delta__zz(uint64_t d, uint32_t w)
{
	unsigned bits = 8 * w;
	uint64_t sign = (d >> (bits - 1)) & 1;
	return ((d << 1) ^ (0 - sign)) & delta__mask(w);
}

static inline uint64_t delta__unzz(uint64_t z, uint32_t w)
{
	return ((z >> 1) ^ (0 - (z & 1))) & delta__mask(w);
}

static inline void delta__put_le32(uint8_t *p, uint32_t v)
{
	v = htole32(v);
	memcpy(p, &v, 4);
}

static inline void delta__put_le64(uint8_t *p, uint64_t v)
{
	v = htole64(v);
	memcpy(p, &v, 8);
}

static inline uint32_t delta__le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return le32toh(v);
}

static inline uint64_t delta__le64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return le64toh(v);
}

/* Appends a LEB128 varint at p (room for 10 bytes); returns bytes written. */
static inline unsigned delta__put_varint(uint8_t *p, uint64_t v)
{
	unsigned n = 0;
	do {
		uint8_t b = v & 0x7f;
		v >>= 7;
		p[n++] = b | (v ? 0x80 : 0);
	} while (v);
	return n;
}

/*
 * Decoding without writing (proto/delta_apply.c): a decoder holds one
 * thread's zstd contexts and stream windows; delta__decode_chunk hands chunk ci's changes, a batch
 * at a time, to emit (positions from the chunk's first element, ascending;
 * differences as apply adds them; DENSE chunks pass every element, 0 for
 * unchanged) and checks the chunk's streams like an apply. Nothing is
 * written. decoder_new: NULL when out of memory.
 */
struct delta__decoder;
typedef void (*delta__emit_fn)(void *arg, const uint32_t *pos, const uint64_t *diff, uint32_t m);
struct delta__decoder *delta__decoder_new(void);
void delta__decoder_free(struct delta__decoder *w);
int delta__decode_chunk(struct delta__decoder *w, const struct proto_delta *d, uint32_t ci,
			delta__emit_fn emit, void *arg, struct proto_err *err);

/* proto/delta_parcel.c: the delta dl speaks of parcel d's pieces, in
 * order, with their element sizes and counts; 0 or -EINVAL with err set. */
struct proto_dparcel;
int delta__match_parcel(const struct proto_dparcel *d, const struct proto_delta *dl,
			struct proto_err *err);

#endif
