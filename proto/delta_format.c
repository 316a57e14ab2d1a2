/* Delta format: version digests, checksums and the strict header parser. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/delta_internal.h"
#include "proto/params.h"
#include "proto/pool.h"
#include "proto/wsum.h"

void proto_delta_digest(const uint8_t *header, size_t header_len, const uint64_t *sums,
			uint32_t ntensors, uint8_t out[32])
{
	crypto_generichash_state st;
	uint8_t le[8];

	crypto_generichash_init(&st, NULL, 0, 32);
	delta__put_le64(le, header_len);
	crypto_generichash_update(&st, le, 8);
	crypto_generichash_update(&st, header, header_len);
	delta__put_le64(le, ntensors);
	crypto_generichash_update(&st, le, 8);
	for (uint32_t i = 0; i < ntensors; i++) {
		delta__put_le64(le, sums[i]);
		crypto_generichash_update(&st, le, 8);
	}
	crypto_generichash_final(&st, out, 32);
}

int proto_delta_check_parent(const struct proto_delta *d, const struct proto_delta_parent *parent,
			     struct proto_err *err)
{
	uint8_t digest[32];

	if (parent->ntensors != d->parent_ntensors)
		return proto_errf(err, EINVAL, "delta is for another parent: it has %u tensors, not %u",
				  d->parent_ntensors, parent->ntensors);
	proto_delta_digest(parent->header, parent->header_len, parent->sums, parent->ntensors,
			   digest);
	if (sodium_memcmp(digest, d->parent_digest, 32) != 0)
		return proto_errf(err, EINVAL, "delta is for another parent (parent digest differs)");
	return 0;
}

/* Pieces of at most this many elements are summed by one thread. */
#define SUM_PIECE (1ull << 24)
#define SUM_THREADS_MAX 64u

struct sum_job {
	const struct proto_model *m;
	const uint8_t *const *data;
	uint64_t npieces;
	uint32_t *ptensor;
	uint64_t *pstart, *part;
};

static int sum_piece(void *arg, unsigned slot, uint64_t i)
{
	struct sum_job *j = arg;
	const struct proto_tensor *t = &j->m->tensors[j->ptensor[i]];
	size_t w = proto_dtype_size(t->dtype);
	uint64_t n = PROTO_MIN(SUM_PIECE, t->nelem - j->pstart[i]);

	j->part[i] = proto_wsum(w, j->data[j->ptensor[i]] + j->pstart[i] * w, n);
	return 0;
}

void proto_delta_sums(const struct proto_model *m, const uint8_t *const *data,
		      unsigned threads, uint64_t *sums)
{
	struct sum_job j = {.m = m, .data = data};

	for (uint32_t t = 0; t < m->ntensors; t++)
		j.npieces += (m->tensors[t].nelem + SUM_PIECE - 1) / SUM_PIECE;
	j.ptensor = malloc((j.npieces + 1) * sizeof(*j.ptensor));
	j.pstart = malloc((j.npieces + 1) * sizeof(*j.pstart));
	j.part = malloc((j.npieces + 1) * sizeof(*j.part));
	if (j.ptensor == NULL || j.pstart == NULL || j.part == NULL) {
		/* No memory for the split: one pass per tensor. */
		for (uint32_t t = 0; t < m->ntensors; t++)
			sums[t] = proto_wsum(proto_dtype_size(m->tensors[t].dtype), data[t],
					     m->tensors[t].nelem);
		goto out;
	}
	for (uint64_t t = 0, i = 0; t < m->ntensors; t++)
		for (uint64_t a = 0; a < m->tensors[t].nelem; a += SUM_PIECE, i++) {
			j.ptensor[i] = (uint32_t)t;
			j.pstart[i] = a;
		}
	proto_pool_for(j.npieces, PROTO_MIN(threads, SUM_THREADS_MAX), sum_piece, &j);
	for (uint32_t t = 0; t < m->ntensors; t++)
		sums[t] = 0;
	for (uint64_t i = 0; i < j.npieces; i++)
		sums[j.ptensor[i]] = proto_wsum_combine(sums[j.ptensor[i]], j.pstart[i], j.part[i]);
out:
	free(j.ptensor);
	free(j.pstart);
	free(j.part);
}

/* A bounded cursor over the header. */
struct cur {
	const uint8_t *p;
	size_t len, at;
};

static int get_varint(struct cur *c, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	for (unsigned shift = 0; shift < 64; shift += 7) {
		if (c->at >= c->len)
			return -EINVAL;
		uint8_t b = c->p[c->at++];
		if (shift == 63 && (b & 0x7e))
			return -EINVAL;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			if (v > max)
				return -EINVAL;
			*out = v;
			return 0;
		}
	}
	return -EINVAL;
}

void proto_delta_fini(struct proto_delta *d)
{
	free(d->tensors);
	free(d->chunks);
	memset(d, 0, sizeof(*d));
}

static int parse_chunk(struct cur *c, struct proto_delta_chunk *ch, uint32_t w,
		       uint64_t *body, uint64_t body_end, struct proto_err *err, uint32_t ci)
{
	uint64_t v, dlen[PROTO_DELTA_MAX_STREAMS];
	uint64_t count;
	unsigned ns;

	if (c->at >= c->len)
		return proto_errf(err, EINVAL, "chunk %u: chunk table truncated", ci);
	v = c->p[c->at++];
	ch->mode = v & 0x0f;
	ch->vcode = (uint8_t)(v >> 4);
	if (ch->mode > PROTO_DELTA_DENSE || ch->vcode > PROTO_DELTA_NIB ||
	    (ch->mode == PROTO_DELTA_ZERO && ch->vcode != 0))
		return proto_errf(err, EINVAL, "chunk %u: unknown coding 0x%02x", ci, (unsigned)v);
	if (ch->mode == PROTO_DELTA_SPARSE || ch->mode == PROTO_DELTA_BITMAP) {
		if (get_varint(c, ch->n, &v) != 0 || v == 0)
			return proto_errf(err, EINVAL, "chunk %u: change count not in 1..%u", ci,
					  ch->n);
		ch->nchanges = (uint32_t)v;
	}
	if (ch->mode == PROTO_DELTA_SPARSE) {
		/* At most one escape per change, each a varint of < 2^28. */
		if (get_varint(c, 4ull * ch->nchanges, &v) != 0)
			return proto_errf(err, EINVAL, "chunk %u: wide gap stream length out of range",
					  ci);
		ch->wide_len = (uint32_t)v;
	}
	count = ch->mode == PROTO_DELTA_DENSE ? ch->n : ch->nchanges;
	if (ch->mode != PROTO_DELTA_ZERO && ch->vcode == PROTO_DELTA_NIB) {
		if (get_varint(c, count, &v) != 0)
			return proto_errf(err, EINVAL, "chunk %u: escape count out of range", ci);
		ch->nesc = (uint32_t)v;
	}
	ns = delta__streams(ch, w, dlen);
	ch->nstreams = (uint8_t)ns;
	ch->off = *body;
	for (unsigned s = 0; s < ns; s++) {
		if (get_varint(c, body_end - *body, &v) != 0)
			return proto_errf(err, EINVAL,
					  "chunk %u: stream %u length runs past the end of the delta",
					  ci, s);
		if (v > 0 && dlen[s] == 0)
			return proto_errf(err, EINVAL, "chunk %u: stream %u is empty but has a frame",
					  ci, s);
		ch->clen[s] = (uint32_t)v;
		*body += v;
	}
	return 0;
}

int proto_delta_parse(const uint8_t *buf, size_t len, struct proto_delta *d,
		      struct proto_err *err)
{
	uint8_t hash[32], digest[32];
	uint64_t hlen, chlen, nchunks = 0, body, *csums = NULL, trec;
	struct cur c;
	int rc;

	memset(d, 0, sizeof(*d));
	if (len < DELTA_FIXED + 8)
		return proto_errf(err, EINVAL, "delta: %zu bytes, too short for a delta", len);
	if (memcmp(buf, PROTO_DELTA_MAGIC, 8) != 0)
		return proto_errf(err, EINVAL, "delta: bad magic (not a tessera delta)");
	hlen = delta__le64(buf + 40);
	if (hlen > proto_param(PROTO_PARAM_DELTA_HEADER_MAX))
		return proto_errf(err, EFBIG, "delta: header of %llu bytes exceeds the limit",
				  (unsigned long long)hlen);
	if (hlen < DELTA_FIXED + 8 - DELTA_HASHED_FROM || hlen > len - DELTA_HASHED_FROM)
		return proto_errf(err, EINVAL, "delta: header length %llu does not fit in %zu bytes",
				  (unsigned long long)hlen, len);
	crypto_generichash(hash, 32, buf + DELTA_HASHED_FROM, hlen, NULL, 0);
	if (sodium_memcmp(hash, buf + 8, 32) != 0)
		return proto_errf(err, EINVAL, "delta: header hash mismatch (damaged delta)");
	if (delta__le32(buf + 48) != DELTA_VERSION ||
	    (delta__le32(buf + 52) & ~PROTO_DELTA_F_TOUCHED) != 0)
		return proto_errf(err, EINVAL, "delta: unsupported version %u flags %u",
				  delta__le32(buf + 48), delta__le32(buf + 52));
	d->flags = delta__le32(buf + 52);
	trec = d->flags & PROTO_DELTA_F_TOUCHED ? DELTA_TREC_TOUCHED : DELTA_TREC;
	d->buf = buf;
	d->len = len;
	memcpy(d->parent_digest, buf + 56, 32);
	memcpy(d->child_digest, buf + 88, 32);
	d->parent_ntensors = delta__le32(buf + 120);
	d->ntensors = delta__le32(buf + 124);
	d->chunk_elems = delta__le32(buf + 128);
	if (delta__le32(buf + 132) != 0) {
		rc = proto_errf(err, EINVAL, "delta: reserved field not zero");
		goto fail;
	}
	if (d->chunk_elems == 0 || d->chunk_elems > PROTO_DELTA_CHUNK_MAX ||
	    d->parent_ntensors > PROTO_MAX_TENSORS || d->ntensors > PROTO_MAX_TENSORS) {
		rc = proto_errf(err, EINVAL, "delta: chunk size or tensor counts out of range");
		goto fail;
	}
	c.p = buf;
	c.len = DELTA_HASHED_FROM + hlen; /* the header ends where the body starts */
	c.at = DELTA_FIXED;
	chlen = delta__le64(buf + DELTA_FIXED);
	c.at += 8;
	if (chlen > c.len - c.at) {
		rc = proto_errf(err, EINVAL, "delta: child header length %llu runs past the header",
				(unsigned long long)chlen);
		goto fail;
	}
	d->child_header = buf + c.at;
	d->child_header_len = (size_t)chlen;
	c.at += chlen;
	if ((uint64_t)d->ntensors * trec > c.len - c.at) {
		rc = proto_errf(err, EINVAL, "delta: tensor table truncated");
		goto fail;
	}
	d->tensors = calloc(d->ntensors ? d->ntensors : 1, sizeof(*d->tensors));
	csums = malloc((d->ntensors ? d->ntensors : 1) * sizeof(*csums));
	if (d->tensors == NULL || csums == NULL) {
		rc = proto_errf(err, ENOMEM, "delta: out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < d->ntensors; i++) {
		struct proto_delta_tensor *t = &d->tensors[i];
		const uint8_t *r = buf + c.at;

		t->elsize = r[0];
		t->parent = delta__le32(r + 4);
		t->nelem = delta__le64(r + 8);
		t->parent_sum = delta__le64(r + 16);
		t->child_sum = delta__le64(r + 24);
		t->touched_sum = trec > DELTA_TREC ? delta__le64(r + 32) : 0;
		c.at += trec;
		if ((t->elsize != 1 && t->elsize != 2 && t->elsize != 4 && t->elsize != 8) ||
		    r[1] || r[2] || r[3])
		{
			rc = proto_errf(err, EINVAL, "delta: tensor %u: element size %u", i,
					t->elsize);
			goto fail;
		}
		if (t->nelem > (1ull << 56)) {
			rc = proto_errf(err, EINVAL, "delta: tensor %u: %llu elements is too many", i,
					(unsigned long long)t->nelem);
			goto fail;
		}
		if (t->parent != PROTO_DELTA_NONE && t->parent >= d->parent_ntensors) {
			rc = proto_errf(err, EINVAL, "delta: tensor %u: parent tensor %u of %u", i,
					t->parent, d->parent_ntensors);
			goto fail;
		}
		if (t->parent == PROTO_DELTA_NONE && (t->parent_sum != 0 || t->touched_sum != 0)) {
			rc = proto_errf(err, EINVAL, "delta: tensor %u: parent checksum without parent",
					i);
			goto fail;
		}
		/* Both halves of a wsum are residues mod p. */
		if ((t->touched_sum & 0xffffffffu) >= PROTO_WSUM_P ||
		    (t->touched_sum >> 32) >= PROTO_WSUM_P) {
			rc = proto_errf(err, EINVAL, "delta: tensor %u: touched checksum %016llx is "
					"not a checksum", i, (unsigned long long)t->touched_sum);
			goto fail;
		}
		t->chunk0 = (uint32_t)nchunks;
		t->nchunks = (uint32_t)((t->nelem + d->chunk_elems - 1) / d->chunk_elems);
		nchunks += t->nchunks;
		/* Every chunk record takes at least one byte: bound before allocating. */
		if (nchunks > c.len - c.at) {
			rc = proto_errf(err, EINVAL, "delta: chunk table truncated");
			goto fail;
		}
		csums[i] = t->child_sum;
	}
	proto_delta_digest(d->child_header, d->child_header_len, csums, d->ntensors, digest);
	if (sodium_memcmp(digest, d->child_digest, 32) != 0) {
		rc = proto_errf(err, EINVAL,
				"delta: child digest does not match its header and checksums");
		goto fail;
	}
	d->nchunks = (uint32_t)nchunks;
	d->chunks = calloc(nchunks ? nchunks : 1, sizeof(*d->chunks));
	if (d->chunks == NULL) {
		rc = proto_errf(err, ENOMEM, "delta: out of memory");
		goto fail;
	}
	body = c.len;
	for (uint32_t i = 0; i < d->ntensors; i++) {
		struct proto_delta_tensor *t = &d->tensors[i];
		for (uint32_t k = 0; k < t->nchunks; k++) {
			struct proto_delta_chunk *ch = &d->chunks[t->chunk0 + k];
			ch->tensor = i;
			ch->base = (uint64_t)k * d->chunk_elems;
			ch->n = (uint32_t)PROTO_MIN((uint64_t)d->chunk_elems, t->nelem - ch->base);
			rc = parse_chunk(&c, ch, t->elsize, &body, len, err, t->chunk0 + k);
			if (rc != 0) {
				proto_err_prefix(err, "delta: tensor %u", i);
				goto fail;
			}
		}
	}
	if (c.at != c.len) {
		rc = proto_errf(err, EINVAL, "delta: %zu stray bytes after the chunk table",
				c.len - c.at);
		goto fail;
	}
	if (body != len) {
		rc = proto_errf(err, EINVAL, "delta: streams take %llu bytes, the file has %llu",
				(unsigned long long)(body - c.len),
				(unsigned long long)(len - c.len));
		goto fail;
	}
	free(csums);
	return 0;
fail:
	free(csums);
	proto_delta_fini(d);
	return rc;
}
