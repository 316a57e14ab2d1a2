/* The signed version manifest: building, encoding and signing, hostile decoding. */
#include "proto/manifest.h"

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/chunkhash.h"
#include "proto/mlayout.h"
#include "proto/params.h"

/*
 * Encoding, format 2 (all integers little-endian):
 *
 *   "TSRM" | u32 format | u32 chunk_hash | u64 version | u64 parent_version |
 *   parent_digest[32] | u8 kind | model_digest[32] | src_layout_digest[32] |
 *   u64 created_ms | u32 chunk_size | u32 nlayouts |
 *   nlayouts x { layout_digest[32] | plan_digest[32] | u32 nparcels |
 *     nparcels x { u32 src_rank | u32 dst_rank | u64 bytes | u8 encoding |
 *       u64 wire_bytes | u32 nchunks | nchunks x { u32 size | hash[32] } } } |
 *   signer[32] | signature[64]
 *
 * chunk_hash names the function of every chunk's hash (proto/chunkhash.h:
 * 1 is BLAKE3-256; format 1, before it, hashed chunks with BLAKE2b-256 and
 * had no such field). The signature covers every byte before it; the
 * digest is BLAKE2b-256 of the whole encoding. The signer and signature sit at fixed offsets from the
 * end, so they can be found without parsing anything else.
 */
#define MAN_MAGIC "TSRM"
#define MAN_FORMAT 2u
#define MAN_HDR_BYTES (4 + 4 + 4 + 8 + 8 + 32 + 1 + 32 + 32 + 8 + 4 + 4)
#define MAN_LAYOUT_BYTES (32 + 32 + 4)
#define MAN_PARCEL_BYTES (4 + 4 + 8 + 1 + 8 + 4)
#define MAN_CHUNK_BYTES (4 + PROTO_HASH_BYTES)
#define MAN_TRAILER_BYTES (PROTO_PK_BYTES + PROTO_SIG_BYTES)
#define MAN_JSON_INT_MAX ((uint64_t)INT64_MAX)

/* ---- building ---------------------------------------------------------- */

void proto_manifest_init(struct proto_manifest *m)
{
	memset(m, 0, sizeof(*m));
	m->chunk_size = (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_CHUNK_SIZE),
					    (uint64_t)UINT32_MAX);
}

void proto_manifest_fini(struct proto_manifest *m)
{
	if (m->layouts != NULL) {
		for (uint32_t i = 0; i < m->nlayouts; i++) {
			struct proto_mlayout *l = &m->layouts[i];
			if (l->parcels == NULL)
				continue;
			for (uint32_t j = 0; j < l->nparcels; j++)
				free(l->parcels[j].chunks);
			free(l->parcels);
		}
		free(m->layouts);
	}
	memset(m, 0, sizeof(*m));
}

struct proto_mlayout *proto_manifest_add_layout(struct proto_manifest *m,
						const uint8_t *layout_digest,
						const uint8_t *plan_digest,
						uint32_t nparcels)
{
	struct proto_mlayout *ls, *l;
	struct proto_mparcel *ps = NULL;

	if (m->nlayouts == UINT32_MAX)
		return NULL;
	if (nparcels > 0) {
		ps = calloc(nparcels, sizeof(*ps));
		if (ps == NULL)
			return NULL;
	}
	ls = realloc(m->layouts, ((size_t)m->nlayouts + 1) * sizeof(*ls));
	if (ls == NULL) {
		free(ps);
		return NULL;
	}
	m->layouts = ls;
	l = &ls[m->nlayouts++];
	memset(l, 0, sizeof(*l));
	if (layout_digest != NULL)
		memcpy(l->layout_digest, layout_digest, PROTO_HASH_BYTES);
	if (plan_digest != NULL)
		memcpy(l->plan_digest, plan_digest, PROTO_HASH_BYTES);
	l->nparcels = nparcels;
	l->parcels = ps;
	return l;
}

static uint64_t chunks_for(uint64_t wire_bytes, uint32_t chunk_size)
{
	return wire_bytes / chunk_size + (wire_bytes % chunk_size != 0);
}

int proto_mparcel_alloc_chunks(const struct proto_manifest *m,
			       struct proto_mparcel *pc, uint64_t wire_bytes)
{
	struct proto_chunk *cs = NULL;
	uint64_t n;

	if (m->chunk_size < PROTO_CHUNK_SIZE_MIN ||
	    m->chunk_size > PROTO_CHUNK_SIZE_MAX)
		return -EINVAL;
	n = chunks_for(wire_bytes, m->chunk_size);
	if (n > UINT32_MAX)
		return -EOVERFLOW;
	if (n > 0) {
		cs = calloc((size_t)n, sizeof(*cs));
		if (cs == NULL)
			return -ENOMEM;
		for (uint64_t i = 0; i < n; i++)
			cs[i].size = m->chunk_size;
		if (wire_bytes % m->chunk_size != 0)
			cs[n - 1].size = (uint32_t)(wire_bytes % m->chunk_size);
	}
	free(pc->chunks);
	pc->chunks = cs;
	pc->nchunks = (uint32_t)n;
	pc->wire_bytes = wire_bytes;
	return 0;
}

const struct proto_mlayout *proto_manifest_layout(const struct proto_manifest *m,
						  const uint8_t *layout_digest)
{
	for (uint32_t i = 0; i < m->nlayouts; i++)
		if (memcmp(m->layouts[i].layout_digest, layout_digest,
			   PROTO_HASH_BYTES) == 0)
			return &m->layouts[i];
	return NULL;
}

/* Binary search: parcels are sorted by (src_rank, dst_rank) in every signed
 * or decoded manifest. */
const struct proto_mparcel *proto_mlayout_parcel(const struct proto_mlayout *l,
						 uint32_t src_rank,
						 uint32_t dst_rank)
{
	uint64_t key = (uint64_t)src_rank << 32 | dst_rank;
	uint32_t lo = 0, hi = l->nparcels;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct proto_mparcel *p = &l->parcels[mid];
		uint64_t k = (uint64_t)p->src_rank << 32 | p->dst_rank;
		if (k == key)
			return p;
		if (k < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

uint64_t proto_manifest_wire_bytes(const struct proto_manifest *m)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < m->nlayouts; i++)
		for (uint32_t j = 0; j < m->layouts[i].nparcels; j++)
			sum += m->layouts[i].parcels[j].wire_bytes;
	return sum;
}

/* ---- semantic checks, shared by the encoder and the decoder ------------- */

static int cmp_layout_digest(const void *a, const void *b, void *arg)
{
	const struct proto_mlayout *ls = arg;
	return memcmp(ls[*(const uint32_t *)a].layout_digest,
		      ls[*(const uint32_t *)b].layout_digest, PROTO_HASH_BYTES);
}

static int check_parcel(const struct proto_manifest *m, uint32_t li,
			uint32_t pi, struct proto_err *err)
{
	const struct proto_mparcel *p = &m->layouts[li].parcels[pi];
	uint64_t want, sum = 0;

	if (p->encoding != PROTO_ENC_RAW && p->encoding != PROTO_ENC_DELTA)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: unknown encoding %u",
				  pi, li, p->encoding);
	if (m->kind == PROTO_KIND_ANCHOR && p->encoding != PROTO_ENC_RAW)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: an anchor's parcels must be raw",
				  pi, li);
	if (p->bytes > PROTO_PARCEL_BYTES_MAX || p->wire_bytes > PROTO_PARCEL_BYTES_MAX)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: %llu bytes (%llu on the wire), more than the %llu allowed",
				  pi, li, (unsigned long long)p->bytes,
				  (unsigned long long)p->wire_bytes,
				  (unsigned long long)PROTO_PARCEL_BYTES_MAX);
	if (p->encoding == PROTO_ENC_RAW && p->wire_bytes != p->bytes)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: raw parcel has %llu wire bytes but %llu bytes",
				  pi, li, (unsigned long long)p->wire_bytes,
				  (unsigned long long)p->bytes);
	want = chunks_for(p->wire_bytes, m->chunk_size);
	if (p->nchunks != want)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: %u chunks but %llu wire bytes at chunk_size %u need %llu",
				  pi, li, p->nchunks, (unsigned long long)p->wire_bytes,
				  m->chunk_size, (unsigned long long)want);
	if (p->nchunks > 0 && p->chunks == NULL)
		return proto_errf(err, EINVAL,
				  "manifest: parcel %u of layout %u: chunks not allocated",
				  pi, li);
	for (uint32_t c = 0; c < p->nchunks; c++) {
		uint32_t sz = p->chunks[c].size;
		bool last = c + 1 == p->nchunks;
		if (!last && sz != m->chunk_size)
			return proto_errf(err, EBADMSG,
					  "manifest: parcel %u of layout %u: chunk %u size %u but chunk_size is %u",
					  pi, li, c, sz, m->chunk_size);
		if (last && (sz == 0 || sz > m->chunk_size))
			return proto_errf(err, EBADMSG,
					  "manifest: parcel %u of layout %u: last chunk %u size %u, not in [1,%u]",
					  pi, li, c, sz, m->chunk_size);
		sum += sz;
	}
	if (sum != p->wire_bytes)
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: chunk sizes add up to %llu, not wire_bytes %llu",
				  pi, li, (unsigned long long)sum,
				  (unsigned long long)p->wire_bytes);
	return 0;
}

/* Layout li's parcels: sorted by (src, dst), each well-formed. */
static int check_layout(const struct proto_manifest *m, uint32_t li,
			struct proto_err *err)
{
	const struct proto_mlayout *l = &m->layouts[li];
	int rc;

	if (l->nparcels > 0 && l->parcels == NULL)
		return proto_errf(err, EINVAL,
				  "manifest: layout %u: parcels not allocated", li);
	for (uint32_t pi = 0; pi < l->nparcels; pi++) {
		const struct proto_mparcel *p = &l->parcels[pi];
		if (pi > 0) {
			const struct proto_mparcel *q = &l->parcels[pi - 1];
			if (p->src_rank < q->src_rank ||
			    (p->src_rank == q->src_rank && p->dst_rank <= q->dst_rank))
				return proto_errf(err, EBADMSG,
						  "manifest: parcel %u of layout %u (src %u, dst %u) does not sort after (src %u, dst %u)",
						  pi, li, p->src_rank, p->dst_rank,
						  q->src_rank, q->dst_rank);
		}
		rc = check_parcel(m, li, pi, err);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/*
 * Everything a well-formed manifest must satisfy beyond its framing. The
 * encoder runs it so that it never signs what the decoder would refuse.
 */
static int manifest_check(const struct proto_manifest *m, struct proto_err *err)
{
	uint32_t *idx = NULL;
	int rc;

	if (m->version < 1 || m->version > MAN_JSON_INT_MAX)
		return proto_errf(err, EBADMSG, "manifest: version %llu, not in [1,%llu]",
				  (unsigned long long)m->version,
				  (unsigned long long)MAN_JSON_INT_MAX);
	if (m->parent_version >= m->version)
		return proto_errf(err, EBADMSG,
				  "manifest: parent version %llu is not below version %llu",
				  (unsigned long long)m->parent_version,
				  (unsigned long long)m->version);
	if (m->parent_version == 0 &&
	    !sodium_is_zero(m->parent_digest, PROTO_HASH_BYTES))
		return proto_errf(err, EBADMSG,
				  "manifest: parent digest set but there is no parent version");
	if (m->parent_version != 0 &&
	    sodium_is_zero(m->parent_digest, PROTO_HASH_BYTES))
		return proto_errf(err, EBADMSG,
				  "manifest: parent version %llu without a parent digest",
				  (unsigned long long)m->parent_version);
	if (m->kind != PROTO_KIND_ANCHOR && m->kind != PROTO_KIND_DELTA)
		return proto_errf(err, EBADMSG,
				  "manifest: unknown kind %u (1 anchor, 2 delta)", m->kind);
	if (m->kind == PROTO_KIND_DELTA && m->parent_version == 0)
		return proto_errf(err, EBADMSG, "manifest: a delta without a parent");
	if (m->created_ms > MAN_JSON_INT_MAX)
		return proto_errf(err, EBADMSG, "manifest: created_ms %llu out of range",
				  (unsigned long long)m->created_ms);
	if (m->chunk_size < PROTO_CHUNK_SIZE_MIN || m->chunk_size > PROTO_CHUNK_SIZE_MAX)
		return proto_errf(err, EBADMSG,
				  "manifest: chunk_size %u, not in [%u,%u]", m->chunk_size,
				  PROTO_CHUNK_SIZE_MIN, PROTO_CHUNK_SIZE_MAX);
	if (m->nlayouts > 0 && m->layouts == NULL)
		return proto_errf(err, EINVAL, "manifest: layouts not allocated");

	for (uint32_t li = 0; li < m->nlayouts; li++) {
		rc = check_layout(m, li, err);
		if (rc != 0)
			return rc;
	}

	/* Layout digests unique: sort indices, compare neighbours (n log n, as
	 * a signed manifest may hold many layouts). */
	if (m->nlayouts > 1) {
		idx = malloc((size_t)m->nlayouts * sizeof(*idx));
		if (idx == NULL)
			return proto_errf(err, ENOMEM, "manifest: out of memory");
		for (uint32_t i = 0; i < m->nlayouts; i++)
			idx[i] = i;
		qsort_r(idx, m->nlayouts, sizeof(*idx), cmp_layout_digest, m->layouts);
		for (uint32_t i = 1; i < m->nlayouts; i++) {
			if (memcmp(m->layouts[idx[i]].layout_digest,
				   m->layouts[idx[i - 1]].layout_digest,
				   PROTO_HASH_BYTES) == 0) {
				uint32_t a = PROTO_MIN(idx[i], idx[i - 1]);
				uint32_t b = PROTO_MAX(idx[i], idx[i - 1]);
				free(idx);
				return proto_errf(err, EBADMSG,
						  "manifest: layouts %u and %u have the same layout digest",
						  a, b);
			}
		}
		free(idx);
	}
	return 0;
}

/* ---- encoding ---------------------------------------------------------- */

static uint8_t *put_u8(uint8_t *p, uint8_t v)
{
	*p = v;
	return p + 1;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 4;
}

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 8;
}

static uint8_t *put_bytes(uint8_t *p, const void *v, size_t n)
{
	memcpy(p, v, n);
	return p + n;
}

static uint8_t *put_layout(uint8_t *p, const struct proto_mlayout *l)
{
	p = put_bytes(p, l->layout_digest, PROTO_HASH_BYTES);
	p = put_bytes(p, l->plan_digest, PROTO_HASH_BYTES);
	p = put_u32(p, l->nparcels);
	for (uint32_t pi = 0; pi < l->nparcels; pi++) {
		const struct proto_mparcel *pc = &l->parcels[pi];
		p = put_u32(p, pc->src_rank);
		p = put_u32(p, pc->dst_rank);
		p = put_u64(p, pc->bytes);
		p = put_u8(p, pc->encoding);
		p = put_u64(p, pc->wire_bytes);
		p = put_u32(p, pc->nchunks);
		for (uint32_t c = 0; c < pc->nchunks; c++) {
			p = put_u32(p, pc->chunks[c].size);
			p = put_bytes(p, pc->chunks[c].hash, PROTO_HASH_BYTES);
		}
	}
	return p;
}

int proto_manifest_sign(struct proto_manifest *m,
			const uint8_t sk[PROTO_SK_BYTES], uint8_t **out,
			size_t *outlen, struct proto_err *err)
{
	uint8_t signer[PROTO_PK_BYTES], *buf, *p;
	uint64_t size = MAN_HDR_BYTES + MAN_TRAILER_BYTES;
	uint64_t cap = proto_param(PROTO_PARAM_MANIFEST_MAX);
	int rc;

	*out = NULL;
	*outlen = 0;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "manifest: libsodium failed to initialise");
	rc = manifest_check(m, err);
	if (rc != 0)
		return rc;
	for (uint32_t li = 0; li < m->nlayouts; li++) {
		const struct proto_mlayout *l = &m->layouts[li];
		size += MAN_LAYOUT_BYTES;
		for (uint32_t pi = 0; pi < l->nparcels; pi++)
			size += MAN_PARCEL_BYTES +
				(uint64_t)l->parcels[pi].nchunks * MAN_CHUNK_BYTES;
		if (size > cap)
			break;
	}
	if (size > cap)
		return proto_errf(err, EFBIG,
				  "manifest: encoding exceeds the %llu bytes a decoder accepts (TESSERA_MANIFEST_MAX)",
				  (unsigned long long)cap);
	buf = malloc((size_t)size);
	if (buf == NULL)
		return proto_errf(err, ENOMEM, "manifest: out of memory");
	crypto_sign_ed25519_sk_to_pk(signer, sk);

	p = put_bytes(buf, MAN_MAGIC, 4);
	p = put_u32(p, MAN_FORMAT);
	p = put_u32(p, PROTO_CHUNK_HASH_ID);
	p = put_u64(p, m->version);
	p = put_u64(p, m->parent_version);
	p = put_bytes(p, m->parent_digest, PROTO_HASH_BYTES);
	p = put_u8(p, m->kind);
	p = put_bytes(p, m->model_digest, PROTO_HASH_BYTES);
	p = put_bytes(p, m->src_layout_digest, PROTO_HASH_BYTES);
	p = put_u64(p, m->created_ms);
	p = put_u32(p, m->chunk_size);
	p = put_u32(p, m->nlayouts);
	for (uint32_t li = 0; li < m->nlayouts; li++)
		p = put_layout(p, &m->layouts[li]);
	p = put_bytes(p, signer, PROTO_PK_BYTES);
	if (crypto_sign_detached(p, NULL, buf, (size_t)(p - buf), sk) != 0) {
		free(buf);
		return proto_errf(err, EIO, "manifest: signing failed");
	}
	memcpy(m->signer, signer, PROTO_PK_BYTES);
	memcpy(m->signature, p, PROTO_SIG_BYTES);
	crypto_generichash(m->digest, PROTO_HASH_BYTES, buf, (size_t)size, NULL, 0);
	*out = buf;
	*outlen = (size_t)size;
	return 0;
}

/* ---- decoding ---------------------------------------------------------- */

/* A cursor over the signed body (the trailer excluded). Every read checks
 * the bytes left; counts are checked against them before allocating. */
struct rd {
	const uint8_t *p;
	size_t left;
};

static bool get_bytes(struct rd *r, void *v, size_t n)
{
	if (r->left < n)
		return false;
	memcpy(v, r->p, n);
	r->p += n;
	r->left -= n;
	return true;
}

static bool get_u8(struct rd *r, uint8_t *v)
{
	return get_bytes(r, v, 1);
}

static bool get_u32(struct rd *r, uint32_t *v)
{
	uint8_t b[4];
	if (!get_bytes(r, b, 4))
		return false;
	*v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
	     (uint32_t)b[3] << 24;
	return true;
}

static bool get_u64(struct rd *r, uint64_t *v)
{
	uint32_t lo, hi;
	if (!get_u32(r, &lo) || !get_u32(r, &hi))
		return false;
	*v = (uint64_t)hi << 32 | lo;
	return true;
}

static int decode_parcel(struct rd *r, struct proto_mparcel *p, uint32_t li,
			 uint32_t pi, struct proto_err *err)
{
	if (!get_u32(r, &p->src_rank) || !get_u32(r, &p->dst_rank) ||
	    !get_u64(r, &p->bytes) || !get_u8(r, &p->encoding) ||
	    !get_u64(r, &p->wire_bytes) || !get_u32(r, &p->nchunks))
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: truncated", pi, li);
	if (p->nchunks > r->left / MAN_CHUNK_BYTES) {
		uint32_t n = p->nchunks;
		p->nchunks = 0;
		return proto_errf(err, EBADMSG,
				  "manifest: parcel %u of layout %u: %u chunks declared but only %zu bytes remain",
				  pi, li, n, r->left);
	}
	if (p->nchunks == 0)
		return 0;
	p->chunks = calloc(p->nchunks, sizeof(*p->chunks));
	if (p->chunks == NULL) {
		p->nchunks = 0;
		return proto_errf(err, ENOMEM, "manifest: out of memory");
	}
	for (uint32_t c = 0; c < p->nchunks; c++)
		if (!get_u32(r, &p->chunks[c].size) ||
		    !get_bytes(r, p->chunks[c].hash, PROTO_HASH_BYTES))
			return proto_errf(err, EBADMSG,
					  "manifest: parcel %u of layout %u: truncated chunk list",
					  pi, li);
	return 0;
}

static int decode_layout(struct rd *r, struct proto_mlayout *l, uint32_t li,
			 struct proto_err *err)
{
	uint32_t n;
	int rc;

	if (!get_bytes(r, l->layout_digest, PROTO_HASH_BYTES) ||
	    !get_bytes(r, l->plan_digest, PROTO_HASH_BYTES) || !get_u32(r, &n))
		return proto_errf(err, EBADMSG, "manifest: layout %u: truncated", li);
	if (n > r->left / MAN_PARCEL_BYTES)
		return proto_errf(err, EBADMSG,
				  "manifest: layout %u: %u parcels declared but only %zu bytes remain",
				  li, n, r->left);
	if (n == 0)
		return 0;
	l->parcels = calloc(n, sizeof(*l->parcels));
	if (l->parcels == NULL)
		return proto_errf(err, ENOMEM, "manifest: out of memory");
	l->nparcels = n;
	for (uint32_t pi = 0; pi < n; pi++) {
		rc = decode_parcel(r, &l->parcels[pi], li, pi, err);
		if (rc != 0)
			return rc;
	}
	return 0;
}

int proto_manifest_decode(const uint8_t *buf, size_t len,
			  const uint8_t pk[PROTO_PK_BYTES],
			  struct proto_manifest *out, struct proto_err *err)
{
	struct proto_manifest m;
	struct rd r;
	uint64_t cap = proto_param(PROTO_PARAM_MANIFEST_MAX);
	uint32_t format, hash_id, n;
	size_t body;
	int rc;

	memset(&m, 0, sizeof(m));
	memset(out, 0, sizeof(*out));
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "manifest: libsodium failed to initialise");
	if (len > cap)
		return proto_errf(err, EFBIG,
				  "manifest: %zu bytes, more than the %llu allowed",
				  len, (unsigned long long)cap);
	if (buf == NULL || len < MAN_HDR_BYTES + MAN_TRAILER_BYTES)
		return proto_errf(err, EBADMSG,
				  "manifest: %zu bytes, shorter than the smallest manifest (%d)",
				  len, MAN_HDR_BYTES + MAN_TRAILER_BYTES);
	if (memcmp(buf, MAN_MAGIC, 4) != 0)
		return proto_errf(err, EBADMSG,
				  "manifest: bad magic, not a tessera manifest");
	format = (uint32_t)buf[4] | (uint32_t)buf[5] << 8 |
		 (uint32_t)buf[6] << 16 | (uint32_t)buf[7] << 24;
	if (format == 1)
		return proto_errf(err, EBADMSG,
				  "manifest: format 1 (BLAKE2b-256 chunk hashes, from an older publisher); this build reads format %u (%s): run publisher and nodes from one release",
				  MAN_FORMAT, PROTO_CHUNK_HASH_NAME);
	if (format != MAN_FORMAT)
		return proto_errf(err, EBADMSG,
				  "manifest: format %u, this build reads format %u",
				  format, MAN_FORMAT);
	hash_id = (uint32_t)buf[8] | (uint32_t)buf[9] << 8 |
		  (uint32_t)buf[10] << 16 | (uint32_t)buf[11] << 24;
	if (hash_id != PROTO_CHUNK_HASH_ID)
		return proto_errf(err, EBADMSG,
				  "manifest: chunk hash %u unknown, this build checks chunks with %s (%u)",
				  hash_id, PROTO_CHUNK_HASH_NAME, PROTO_CHUNK_HASH_ID);

	/* Nothing past the magic is believed before this. */
	body = len - PROTO_SIG_BYTES;
	if (crypto_sign_verify_detached(buf + body, buf, body, pk) != 0)
		return proto_errf(err, EKEYREJECTED,
				  "manifest: bad signature (not signed by the expected trainer key, or altered)");
	if (sodium_memcmp(buf + body - PROTO_PK_BYTES, pk, PROTO_PK_BYTES) != 0)
		return proto_errf(err, EKEYREJECTED,
				  "manifest: signer field does not name the verifying key");

	r.p = buf + 12;
	r.left = len - 12 - MAN_TRAILER_BYTES;
	/* The header fits: len was checked against MAN_HDR_BYTES above. */
	get_u64(&r, &m.version);
	get_u64(&r, &m.parent_version);
	get_bytes(&r, m.parent_digest, PROTO_HASH_BYTES);
	get_u8(&r, &m.kind);
	get_bytes(&r, m.model_digest, PROTO_HASH_BYTES);
	get_bytes(&r, m.src_layout_digest, PROTO_HASH_BYTES);
	get_u64(&r, &m.created_ms);
	get_u32(&r, &m.chunk_size);
	get_u32(&r, &n);
	if (n > r.left / MAN_LAYOUT_BYTES) {
		rc = proto_errf(err, EBADMSG,
				"manifest: %u layouts declared but only %zu bytes remain",
				n, r.left);
		goto fail;
	}
	if (n > 0) {
		m.layouts = calloc(n, sizeof(*m.layouts));
		if (m.layouts == NULL) {
			rc = proto_errf(err, ENOMEM, "manifest: out of memory");
			goto fail;
		}
		m.nlayouts = n;
	}
	for (uint32_t li = 0; li < n; li++) {
		rc = decode_layout(&r, &m.layouts[li], li, err);
		if (rc != 0)
			goto fail;
	}
	if (r.left != 0) {
		rc = proto_errf(err, EBADMSG,
				"manifest: %zu trailing bytes after the last layout",
				r.left);
		goto fail;
	}
	rc = manifest_check(&m, err);
	if (rc != 0)
		goto fail;
	memcpy(m.signer, buf + body - PROTO_PK_BYTES, PROTO_PK_BYTES);
	memcpy(m.signature, buf + body, PROTO_SIG_BYTES);
	crypto_generichash(m.digest, PROTO_HASH_BYTES, buf, len, NULL, 0);
	*out = m;
	return 0;
fail:
	proto_manifest_fini(&m);
	return rc;
}

int proto_manifest_peek_signer(const uint8_t *buf, size_t len,
			       uint8_t pk[PROTO_PK_BYTES])
{
	if (buf == NULL || len < MAN_HDR_BYTES + MAN_TRAILER_BYTES ||
	    memcmp(buf, MAN_MAGIC, 4) != 0)
		return -EINVAL;
	memcpy(pk, buf + len - MAN_TRAILER_BYTES, PROTO_PK_BYTES);
	return 0;
}

/* ---- one layout's block, for manifest addenda (proto/mlayout.h) ---------- */

uint64_t proto__mlayout_size(const struct proto_mlayout *l)
{
	uint64_t size = MAN_LAYOUT_BYTES;

	for (uint32_t pi = 0; pi < l->nparcels; pi++)
		size += MAN_PARCEL_BYTES + (uint64_t)l->parcels[pi].nchunks * MAN_CHUNK_BYTES;
	return size;
}

uint8_t *proto__mlayout_put(uint8_t *p, const struct proto_mlayout *l)
{
	return put_layout(p, l);
}

int proto__mlayout_get(const uint8_t *buf, size_t len, size_t *used,
		       struct proto_mlayout *out, struct proto_err *err)
{
	struct rd r = {buf, len};
	int rc;

	memset(out, 0, sizeof(*out));
	rc = decode_layout(&r, out, 0, err);
	if (rc != 0) {
		proto__mlayout_fini(out);
		return rc;
	}
	*used = len - r.left;
	return 0;
}

int proto__mlayout_check(const struct proto_mlayout *l, uint8_t kind,
			 uint32_t chunk_size, struct proto_err *err)
{
	struct proto_manifest m = {.kind = kind, .chunk_size = chunk_size, .nlayouts = 1,
				   .layouts = (struct proto_mlayout *)l};

	if (chunk_size < PROTO_CHUNK_SIZE_MIN || chunk_size > PROTO_CHUNK_SIZE_MAX)
		return proto_errf(err, EBADMSG, "manifest: chunk_size %u, not in [%u,%u]",
				  chunk_size, PROTO_CHUNK_SIZE_MIN, PROTO_CHUNK_SIZE_MAX);
	return check_layout(&m, 0, err);
}

void proto__mlayout_fini(struct proto_mlayout *l)
{
	for (uint32_t j = 0; l->parcels != NULL && j < l->nparcels; j++)
		free(l->parcels[j].chunks);
	free(l->parcels);
	memset(l, 0, sizeof(*l));
}

/* ---- JSON -------------------------------------------------------------- */

static json_t *hex_json(const uint8_t *b, size_t n)
{
	char hex[2 * PROTO_SIG_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), b, n);
	return json_string(hex);
}

static const char *kind_name(uint8_t kind)
{
	return kind == PROTO_KIND_ANCHOR ? "anchor" :
	       kind == PROTO_KIND_DELTA	 ? "delta" :
					   "unknown";
}

static const char *encoding_name(uint8_t enc)
{
	return enc == PROTO_ENC_RAW ? "raw" : enc == PROTO_ENC_DELTA ? "delta" : "unknown";
}

/* Sets o[k] = v, stealing v (json_object_set_new drops v on failure and
 * refuses NULL); returns non-zero on failure. */
static int jset(json_t *o, const char *k, json_t *v)
{
	return json_object_set_new(o, k, v) != 0;
}

static json_t *jint(uint64_t v)
{
	return json_integer((json_int_t)PROTO_MIN(v, MAN_JSON_INT_MAX));
}

static json_t *parcel_json(const struct proto_mparcel *p, bool with_chunks)
{
	json_t *j = json_object(), *cs;
	int bad = 0;

	if (j == NULL)
		return NULL;
	bad |= jset(j, "src_rank", jint(p->src_rank));
	bad |= jset(j, "dst_rank", jint(p->dst_rank));
	bad |= jset(j, "bytes", jint(p->bytes));
	bad |= jset(j, "encoding", json_string(encoding_name(p->encoding)));
	bad |= jset(j, "wire_bytes", jint(p->wire_bytes));
	bad |= jset(j, "nchunks", jint(p->nchunks));
	if (with_chunks) {
		cs = json_array();
		bad |= jset(j, "chunks", cs);
		for (uint32_t c = 0; !bad && c < p->nchunks; c++) {
			json_t *cj = json_object();
			if (cj == NULL || json_array_append_new(cs, cj) != 0) {
				bad = 1;
				break;
			}
			bad |= jset(cj, "size", jint(p->chunks[c].size));
			bad |= jset(cj, "hash", hex_json(p->chunks[c].hash, PROTO_HASH_BYTES));
		}
	}
	if (bad) {
		json_decref(j);
		return NULL;
	}
	return j;
}

static json_t *layout_json(const struct proto_mlayout *l, bool with_chunks)
{
	json_t *j = json_object(), *ps = json_array();
	uint64_t bytes = 0, wire = 0;
	int bad = 0;

	if (j == NULL) {
		json_decref(ps);
		return NULL;
	}
	for (uint32_t i = 0; i < l->nparcels; i++) {
		bytes += l->parcels[i].bytes;
		wire += l->parcels[i].wire_bytes;
	}
	bad |= jset(j, "layout_digest", hex_json(l->layout_digest, PROTO_HASH_BYTES));
	bad |= jset(j, "plan_digest", hex_json(l->plan_digest, PROTO_HASH_BYTES));
	bad |= jset(j, "bytes", jint(bytes));
	bad |= jset(j, "wire_bytes", jint(wire));
	if (bad)
		json_decref(ps); /* not yet owned by j */
	else
		bad |= jset(j, "parcels", ps);
	for (uint32_t i = 0; !bad && i < l->nparcels; i++)
		bad |= json_array_append_new(ps, parcel_json(&l->parcels[i], with_chunks)) != 0;
	if (bad) {
		json_decref(j);
		return NULL;
	}
	return j;
}

json_t *proto_manifest_to_json(const struct proto_manifest *m, bool with_chunks)
{
	json_t *j = json_object(), *ls = json_array();
	int bad = 0;

	if (j == NULL) {
		json_decref(ls);
		return NULL;
	}
	bad |= jset(j, "version", jint(m->version));
	bad |= jset(j, "parent_version", jint(m->parent_version));
	bad |= jset(j, "parent_digest",
		    m->parent_version != 0 ?
			    hex_json(m->parent_digest, PROTO_HASH_BYTES) :
			    json_null());
	bad |= jset(j, "kind", json_string(kind_name(m->kind)));
	bad |= jset(j, "model_digest", hex_json(m->model_digest, PROTO_HASH_BYTES));
	bad |= jset(j, "src_layout_digest",
		    hex_json(m->src_layout_digest, PROTO_HASH_BYTES));
	bad |= jset(j, "created_ms", jint(m->created_ms));
	bad |= jset(j, "chunk_size", jint(m->chunk_size));
	bad |= jset(j, "wire_bytes", jint(proto_manifest_wire_bytes(m)));
	bad |= jset(j, "signer", hex_json(m->signer, PROTO_PK_BYTES));
	bad |= jset(j, "digest", hex_json(m->digest, PROTO_HASH_BYTES));
	if (bad)
		json_decref(ls); /* not yet owned by j */
	else
		bad |= jset(j, "layouts", ls);
	for (uint32_t i = 0; !bad && i < m->nlayouts; i++)
		bad |= json_array_append_new(ls, layout_json(&m->layouts[i], with_chunks)) != 0;
	if (bad) {
		json_decref(j);
		return NULL;
	}
	return j;
}
