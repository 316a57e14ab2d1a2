/* Tests of the signed version manifest: round trips, digests, tampering, and
 * the tests/data/bad-manifest-* corpus (which this program also generates:
 * `test_manifest --gen-bad-manifests DIR`, see tests/data/gen-bad-manifests.sh). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <sodium.h>

#include "proto/chunkhash.h"
#include "proto/manifest.h"
#include "proto/params.h"
#include "tests/testutil.h"

/* test_digest_stable's expectation: BLAKE2b-256 of base_manifest() signed by
 * tests/data/test-trainer.key. */
#define GOLDEN_DIGEST "9fdbdbf3fecec1ffbecf43cb0c8bc9ae0156b5061f9179bbcdba91951300b175"

/* ---- helpers ------------------------------------------------------------ */

static void fill(uint8_t *d, size_t n, uint8_t v)
{
	memset(d, v, n);
}

/* A deterministic chunk hash from a few indices. */
static void fake_hash(uint8_t h[PROTO_HASH_BYTES], uint32_t a, uint32_t b,
		      uint32_t c)
{
	uint32_t in[3] = {a, b, c};
	crypto_generichash(h, PROTO_HASH_BYTES, (const uint8_t *)in, sizeof(in),
			   NULL, 0);
}

static void set_parcel(struct proto_manifest *m, struct proto_mlayout *l,
		       uint32_t li, uint32_t pi, uint32_t src, uint32_t dst,
		       uint8_t enc, uint64_t bytes, uint64_t wire)
{
	struct proto_mparcel *p = &l->parcels[pi];

	p->src_rank = src;
	p->dst_rank = dst;
	p->encoding = enc;
	p->bytes = bytes;
	assert_int_equal(proto_mparcel_alloc_chunks(m, p, wire), 0);
	for (uint32_t c = 0; c < p->nchunks; c++)
		fake_hash(p->chunks[c].hash, li, pi, c);
}

/*
 * The corpus base: a delta (version 5, parent 4), chunk_size 64, two layouts.
 * Layout 0: (0,0) raw 130 B = chunks 64,64,2; (0,1) delta 1000 B sent as
 * 70 B = chunks 64,6; (1,0) raw, empty (no chunks). Layout 1: (0,0) raw 64 B,
 * one chunk: the last parcel, which some corpus cases rely on.
 */
static void base_manifest(struct proto_manifest *m)
{
	struct proto_mlayout *l;
	uint8_t d[PROTO_HASH_BYTES], e[PROTO_HASH_BYTES];

	proto_manifest_init(m);
	m->version = 5;
	m->parent_version = 4;
	fill(m->parent_digest, PROTO_HASH_BYTES, 0x11);
	m->kind = PROTO_KIND_DELTA;
	fill(m->model_digest, PROTO_HASH_BYTES, 0x22);
	fill(m->src_layout_digest, PROTO_HASH_BYTES, 0x33);
	m->created_ms = 1700000000000ull;
	m->chunk_size = 64;
	fill(d, sizeof(d), 0xa0);
	fill(e, sizeof(e), 0xb0);
	l = proto_manifest_add_layout(m, d, e, 3);
	assert_non_null(l);
	set_parcel(m, l, 0, 0, 0, 0, PROTO_ENC_RAW, 130, 130);
	set_parcel(m, l, 0, 1, 0, 1, PROTO_ENC_DELTA, 1000, 70);
	set_parcel(m, l, 0, 2, 1, 0, PROTO_ENC_RAW, 0, 0);
	fill(d, sizeof(d), 0xa1);
	fill(e, sizeof(e), 0xb1);
	l = proto_manifest_add_layout(m, d, e, 1);
	assert_non_null(l);
	set_parcel(m, l, 1, 0, 0, 0, PROTO_ENC_RAW, 64, 64);
}

/* The fixed test key pair in tests/data (a test key: never use it elsewhere). */
static void test_keys(uint8_t sk[PROTO_SK_BYTES], uint8_t pk[PROTO_PK_BYTES])
{
	static uint8_t tsk[PROTO_SK_BYTES], tpk[PROTO_PK_BYTES];
	static bool loaded;
	char p[4096];
	struct proto_err err = {{0}};

	if (!loaded) {
		if (proto_key_load_secret(tu_data(p, sizeof(p), "test-trainer.key"),
					  tsk, &err) != 0 ||
		    proto_key_load_public(tu_data(p, sizeof(p), "test-trainer.pub"),
					  tpk, &err) != 0) {
			fprintf(stderr, "%s\n", err.msg);
			fail();
		}
		loaded = true;
	}
	memcpy(sk, tsk, PROTO_SK_BYTES);
	memcpy(pk, tpk, PROTO_PK_BYTES);
}

/* Another key, derived from a fixed seed so that the corpus is reproducible. */
static void other_keys(uint8_t sk[PROTO_SK_BYTES], uint8_t pk[PROTO_PK_BYTES])
{
	uint8_t seed[crypto_sign_SEEDBYTES];
	fill(seed, sizeof(seed), 0x5e);
	crypto_sign_seed_keypair(pk, sk, seed);
}

static bool is_empty(const struct proto_manifest *m)
{
	static const struct proto_manifest zero;
	return memcmp(m, &zero, sizeof(zero)) == 0;
}

/* Decodes and expects a failure whose message contains want (if not NULL),
 * leaving out empty. */
static void expect_refused(const uint8_t *buf, size_t len, const uint8_t *pk,
			   const char *want, const char *what)
{
	struct proto_manifest m;
	struct proto_err err = {{0}};
	int rc;

	memset(&m, 0xa5, sizeof(m));
	rc = proto_manifest_decode(buf, len, pk, &m, &err);
	if (rc >= 0 || !is_empty(&m) || err.msg[0] == 0 ||
	    strchr(err.msg, '\n') != NULL ||
	    (want != NULL && strstr(err.msg, want) == NULL)) {
		fprintf(stderr, "%s: rc %d, message '%s', wanted '%s'\n", what, rc,
			err.msg, want ? want : "(any)");
		if (rc == 0)
			proto_manifest_fini(&m);
		fail();
	}
}

/* ---- an independent encoder, with no checks, for building bad input ------ */

struct bb {
	uint8_t *p;
	size_t len, cap;
};

static void bb_bytes(struct bb *b, const void *v, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->len, v, n);
	b->len += n;
}

static void bb_u8(struct bb *b, uint8_t v)
{
	bb_bytes(b, &v, 1);
}

static void bb_u32(struct bb *b, uint32_t v)
{
	uint8_t x[4];
	for (int i = 0; i < 4; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	bb_bytes(b, x, 4);
}

static void bb_u64(struct bb *b, uint64_t v)
{
	uint8_t x[8];
	for (int i = 0; i < 8; i++)
		x[i] = (uint8_t)(v >> (8 * i));
	bb_bytes(b, x, 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Byte offsets in the encoding (see proto/manifest.c). */
#define OFF_FORMAT 4
#define OFF_HASH_ID 8
#define OFF_VERSION 12
#define OFF_PARENT 20
#define OFF_KIND 60
#define OFF_CHUNK_SIZE 133
#define OFF_NLAYOUTS 137
#define OFF_LAYOUTS 141
#define LAYOUT_HDR 68
#define PARCEL_HDR 29
#define CHUNK_REC 36

/* Offset of layout li's nparcels field, or of parcel pi's first field. */
static size_t off_layout(const struct proto_manifest *m, uint32_t li)
{
	size_t off = OFF_LAYOUTS;
	for (uint32_t i = 0; i < li; i++) {
		off += LAYOUT_HDR;
		for (uint32_t j = 0; j < m->layouts[i].nparcels; j++)
			off += PARCEL_HDR + (size_t)m->layouts[i].parcels[j].nchunks * CHUNK_REC;
	}
	return off;
}

static size_t off_parcel(const struct proto_manifest *m, uint32_t li, uint32_t pi)
{
	size_t off = off_layout(m, li) + LAYOUT_HDR;
	for (uint32_t j = 0; j < pi; j++)
		off += PARCEL_HDR + (size_t)m->layouts[li].parcels[j].nchunks * CHUNK_REC;
	return off;
}

/* The body (everything before the signer) of m, as format 2 lays it out. */
static void encode_raw(const struct proto_manifest *m, struct bb *b)
{
	bb_bytes(b, "TSRM", 4);
	bb_u32(b, 2);
	bb_u32(b, PROTO_CHUNK_HASH_ID);
	bb_u64(b, m->version);
	bb_u64(b, m->parent_version);
	bb_bytes(b, m->parent_digest, PROTO_HASH_BYTES);
	bb_u8(b, m->kind);
	bb_bytes(b, m->model_digest, PROTO_HASH_BYTES);
	bb_bytes(b, m->src_layout_digest, PROTO_HASH_BYTES);
	bb_u64(b, m->created_ms);
	bb_u32(b, m->chunk_size);
	bb_u32(b, m->nlayouts);
	for (uint32_t li = 0; li < m->nlayouts; li++) {
		const struct proto_mlayout *l = &m->layouts[li];
		bb_bytes(b, l->layout_digest, PROTO_HASH_BYTES);
		bb_bytes(b, l->plan_digest, PROTO_HASH_BYTES);
		bb_u32(b, l->nparcels);
		for (uint32_t pi = 0; pi < l->nparcels; pi++) {
			const struct proto_mparcel *p = &l->parcels[pi];
			bb_u32(b, p->src_rank);
			bb_u32(b, p->dst_rank);
			bb_u64(b, p->bytes);
			bb_u8(b, p->encoding);
			bb_u64(b, p->wire_bytes);
			bb_u32(b, p->nchunks);
			for (uint32_t c = 0; c < p->nchunks; c++) {
				bb_u32(b, p->chunks[c].size);
				bb_bytes(b, p->chunks[c].hash, PROTO_HASH_BYTES);
			}
		}
	}
}

/* Appends the signer field and a signature by sk over everything before it. */
static void bb_sign(struct bb *b, const uint8_t *signer, const uint8_t *sk)
{
	uint8_t sig[PROTO_SIG_BYTES];
	bb_bytes(b, signer, PROTO_PK_BYTES);
	crypto_sign_detached(sig, NULL, b->p, b->len, sk);
	bb_bytes(b, sig, sizeof(sig));
}

/* ---- the corpus ------------------------------------------------------------ */

struct corpus_ctx {
	struct proto_manifest m;
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
	uint8_t osk[PROTO_SK_BYTES], opk[PROTO_PK_BYTES];
};

/* Each case edits the base manifest (ctx->m) or its body bytes. `sign`
 * says how the result is finished: with the test key (properly signed, so
 * only the decoder's semantic checks can refuse it), or as the case sees fit. */
enum finish { SIGNED, RAW };
struct corpus_case {
	const char *name;
	const char *want; /* substring of the expected error */
	enum finish finish;
	void (*edit_m)(struct corpus_ctx *c);             /* before encoding */
	void (*edit_b)(struct corpus_ctx *c, struct bb *b); /* after encoding */
};

static struct proto_mparcel *P(struct corpus_ctx *c, uint32_t li, uint32_t pi)
{
	return &c->m.layouts[li].parcels[pi];
}

/* Unsigned or wrongly signed input. */
static void b_empty(struct corpus_ctx *c, struct bb *b)
{
	b->len = 0;
}
static void b_short(struct corpus_ctx *c, struct bb *b)
{
	b->len = 12;
}
static void b_bad_magic(struct corpus_ctx *c, struct bb *b)
{
	bb_sign(b, c->pk, c->sk);
	b->p[3] = 'X';
}
static void b_format3(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_FORMAT, 3);
	bb_sign(b, c->pk, c->sk);
}
/* What a publisher of format 1 sent: no chunk-hash field (its chunks were
 * BLAKE2b-256), signed by the right key. */
static void b_format1(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_FORMAT, 1);
	memmove(b->p + OFF_HASH_ID, b->p + OFF_HASH_ID + 4, b->len - OFF_HASH_ID - 4);
	b->len -= 4;
	bb_sign(b, c->pk, c->sk);
}
static void b_hash_unknown(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_HASH_ID, 7);
	bb_sign(b, c->pk, c->sk);
}
static void b_zero_sig(struct corpus_ctx *c, struct bb *b)
{
	uint8_t z[PROTO_SIG_BYTES] = {0};
	bb_bytes(b, c->pk, PROTO_PK_BYTES);
	bb_bytes(b, z, sizeof(z));
}
static void b_flipped(struct corpus_ctx *c, struct bb *b)
{
	bb_sign(b, c->pk, c->sk);
	b->p[off_parcel(&c->m, 0, 0) + PARCEL_HDR + 4] ^= 0x04; /* a chunk hash */
}
static void b_other_key(struct corpus_ctx *c, struct bb *b)
{
	bb_sign(b, c->opk, c->osk);
}
static void b_signer_mismatch(struct corpus_ctx *c, struct bb *b)
{
	bb_sign(b, c->opk, c->sk);
}
static void b_truncated(struct corpus_ctx *c, struct bb *b)
{
	bb_sign(b, c->pk, c->sk);
	b->len -= 10;
}
static void b_short_signed(struct corpus_ctx *c, struct bb *b)
{
	b->len = 40;
	bb_sign(b, c->pk, c->sk);
}

/* Properly signed, semantically bad: counts. */
static void b_layouts_huge(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_NLAYOUTS, UINT32_MAX);
}
static void b_parcels_huge(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + off_layout(&c->m, 0) + 64, UINT32_MAX);
}
static void b_chunks_huge(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + off_parcel(&c->m, 0, 0) + 25, 0x7fffffffu);
}
static void b_chunks_one_over(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + off_parcel(&c->m, 1, 0) + 25, 2); /* the last parcel */
}
static void b_layouts_one_over(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_NLAYOUTS, 3);
}
static void b_parcels_one_under(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + off_layout(&c->m, 1) + 64, 0); /* leaves its parcel trailing */
}
static void b_trailing(struct corpus_ctx *c, struct bb *b)
{
	bb_bytes(b, "junk!", 5);
}
static void b_chunk_size_one(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_CHUNK_SIZE, 1);
}
static void b_chunk_size_huge(struct corpus_ctx *c, struct bb *b)
{
	put32(b->p + OFF_CHUNK_SIZE, UINT32_MAX);
}
static void b_version_zero(struct corpus_ctx *c, struct bb *b)
{
	put64(b->p + OFF_VERSION, 0);
}
static void b_version_absurd(struct corpus_ctx *c, struct bb *b)
{
	put64(b->p + OFF_VERSION, UINT64_MAX);
}
static void b_parent_not_below(struct corpus_ctx *c, struct bb *b)
{
	put64(b->p + OFF_PARENT, 5);
}
static void b_bad_kind(struct corpus_ctx *c, struct bb *b)
{
	b->p[OFF_KIND] = 3;
}

/* Properly signed, semantically bad: fields. */
static void m_chunk_mismatch(struct corpus_ctx *c)
{
	P(c, 0, 0)->chunks[0].size = 12;
	P(c, 0, 0)->chunks[2].size = 54; /* the sum still matches */
}
static void m_last_chunk_zero(struct corpus_ctx *c)
{
	P(c, 0, 1)->chunks[1].size = 0;
}
static void m_chunk_sum(struct corpus_ctx *c)
{
	P(c, 0, 0)->chunks[2].size = 1;
}
static void m_nchunks_mismatch(struct corpus_ctx *c)
{
	P(c, 0, 1)->wire_bytes = 200;
}
static void m_unsorted(struct corpus_ctx *c)
{
	struct proto_mparcel t = *P(c, 0, 0);
	*P(c, 0, 0) = *P(c, 0, 1);
	*P(c, 0, 1) = t;
}
static void m_dup_parcel(struct corpus_ctx *c)
{
	P(c, 0, 1)->dst_rank = 0;
}
static void m_dup_layout(struct corpus_ctx *c)
{
	fill(c->m.layouts[1].layout_digest, PROTO_HASH_BYTES, 0xa0);
}
static void m_parent_digest_no_parent(struct corpus_ctx *c)
{
	c->m.kind = PROTO_KIND_ANCHOR;
	P(c, 0, 1)->encoding = PROTO_ENC_RAW;
	P(c, 0, 1)->bytes = 70;
	c->m.parent_version = 0;
}
static void m_parent_no_digest(struct corpus_ctx *c)
{
	fill(c->m.parent_digest, PROTO_HASH_BYTES, 0);
}
static void m_delta_no_parent(struct corpus_ctx *c)
{
	c->m.parent_version = 0;
	fill(c->m.parent_digest, PROTO_HASH_BYTES, 0);
}
static void m_anchor_delta_parcel(struct corpus_ctx *c)
{
	c->m.kind = PROTO_KIND_ANCHOR;
}
static void m_bad_encoding(struct corpus_ctx *c)
{
	P(c, 0, 1)->encoding = 7;
}
static void m_raw_wire_mismatch(struct corpus_ctx *c)
{
	P(c, 0, 0)->bytes = 131;
}
static void m_bytes_absurd(struct corpus_ctx *c)
{
	P(c, 0, 1)->bytes = UINT64_MAX;
}

static const struct corpus_case corpus[] = {
	{"empty", "shorter than the smallest", RAW, NULL, b_empty},
	{"short", "shorter than the smallest", RAW, NULL, b_short},
	{"short-signed", "shorter than the smallest", RAW, NULL, b_short_signed},
	{"bad-magic", "bad magic", RAW, NULL, b_bad_magic},
	{"format-3", "format 3, this build reads format 2", RAW, NULL, b_format3},
	{"format-1-blake2b", "format 1 (BLAKE2b-256 chunk hashes", RAW, NULL, b_format1},
	{"chunk-hash-unknown", "chunk hash 7 unknown, this build checks chunks with BLAKE3-256",
	 RAW, NULL, b_hash_unknown},
	{"zero-signature", "bad signature", RAW, NULL, b_zero_sig},
	{"flipped-hash-bit", "bad signature", RAW, NULL, b_flipped},
	{"other-key", "bad signature", RAW, NULL, b_other_key},
	{"signer-mismatch", "signer field", RAW, NULL, b_signer_mismatch},
	{"truncated", "bad signature", RAW, NULL, b_truncated},
	{"layouts-huge", "layouts declared but only", SIGNED, NULL, b_layouts_huge},
	{"layouts-one-over", "layout 2: truncated", SIGNED, NULL, b_layouts_one_over},
	{"parcels-huge", "parcels declared but only", SIGNED, NULL, b_parcels_huge},
	{"parcels-one-under", "trailing bytes", SIGNED, NULL, b_parcels_one_under},
	{"chunks-huge", "chunks declared but only", SIGNED, NULL, b_chunks_huge},
	{"chunks-one-over", "chunks declared but only", SIGNED, NULL, b_chunks_one_over},
	{"trailing-bytes", "5 trailing bytes", SIGNED, NULL, b_trailing},
	{"chunk-size-1", "chunk_size 1, not in", SIGNED, NULL, b_chunk_size_one},
	{"chunk-size-huge", "chunk_size 4294967295, not in", SIGNED, NULL, b_chunk_size_huge},
	{"version-zero", "version 0, not in", SIGNED, NULL, b_version_zero},
	{"version-absurd", "version 18446744073709551615, not in", SIGNED, NULL, b_version_absurd},
	{"parent-not-below", "parent version 5 is not below version 5", SIGNED, NULL, b_parent_not_below},
	{"bad-kind", "unknown kind 3", SIGNED, NULL, b_bad_kind},
	{"chunk-size-mismatch", "parcel 0 of layout 0: chunk 0 size 12 but chunk_size is 64", SIGNED, m_chunk_mismatch, NULL},
	{"last-chunk-zero", "last chunk 1 size 0", SIGNED, m_last_chunk_zero, NULL},
	{"chunk-sum", "chunk sizes add up to 129, not wire_bytes 130", SIGNED, m_chunk_sum, NULL},
	{"nchunks-mismatch", "2 chunks but 200 wire bytes", SIGNED, m_nchunks_mismatch, NULL},
	{"unsorted-parcels", "parcel 1 of layout 0 (src 0, dst 0) does not sort after (src 0, dst 1)", SIGNED, m_unsorted, NULL},
	{"duplicate-parcel", "parcel 1 of layout 0 (src 0, dst 0) does not sort after", SIGNED, m_dup_parcel, NULL},
	{"duplicate-layout", "layouts 0 and 1 have the same layout digest", SIGNED, m_dup_layout, NULL},
	{"parent-digest-without-parent", "parent digest set but there is no parent", SIGNED, m_parent_digest_no_parent, NULL},
	{"parent-without-digest", "parent version 4 without a parent digest", SIGNED, m_parent_no_digest, NULL},
	{"delta-without-parent", "a delta without a parent", SIGNED, m_delta_no_parent, NULL},
	{"anchor-with-delta-parcel", "an anchor's parcels must be raw", SIGNED, m_anchor_delta_parcel, NULL},
	{"bad-encoding", "unknown encoding 7", SIGNED, m_bad_encoding, NULL},
	{"raw-wire-mismatch", "raw parcel has 130 wire bytes but 131 bytes", SIGNED, m_raw_wire_mismatch, NULL},
	{"bytes-absurd", "18446744073709551615 bytes", SIGNED, m_bytes_absurd, NULL},
};

/* Builds corpus case i into b (caller frees b->p). */
static void corpus_build(size_t i, struct bb *b)
{
	const struct corpus_case *k = &corpus[i];
	struct corpus_ctx c;

	test_keys(c.sk, c.pk);
	other_keys(c.osk, c.opk);
	base_manifest(&c.m);
	if (k->edit_m != NULL)
		k->edit_m(&c);
	memset(b, 0, sizeof(*b));
	encode_raw(&c.m, b);
	if (k->edit_b != NULL)
		k->edit_b(&c, b);
	if (k->finish == SIGNED)
		bb_sign(b, c.pk, c.sk);
	/* Edits may have swapped parcels: fini frees each chunk list once. */
	proto_manifest_fini(&c.m);
	sodium_memzero(c.sk, sizeof(c.sk));
}

static int gen_corpus(const char *dir)
{
	char path[4096];
	struct proto_err err = {{0}};

	for (size_t i = 0; i < PROTO_ARRAY_LEN(corpus); i++) {
		struct bb b;
		corpus_build(i, &b);
		snprintf(path, sizeof(path), "%s/bad-manifest-%s", dir, corpus[i].name);
		if (proto_write_file_atomic(path, b.p ? b.p : (uint8_t *)"", b.len,
					    0644, &err) != 0) {
			fprintf(stderr, "%s\n", err.msg);
			free(b.p);
			return 1;
		}
		printf("%s (%zu bytes)\n", path, b.len);
		free(b.p);
	}
	return 0;
}

/* ---- tests -------------------------------------------------------------- */

static void assert_manifest_equal(const struct proto_manifest *a,
				  const struct proto_manifest *b)
{
	assert_int_equal(a->version, b->version);
	assert_int_equal(a->parent_version, b->parent_version);
	assert_memory_equal(a->parent_digest, b->parent_digest, PROTO_HASH_BYTES);
	assert_int_equal(a->kind, b->kind);
	assert_memory_equal(a->model_digest, b->model_digest, PROTO_HASH_BYTES);
	assert_memory_equal(a->src_layout_digest, b->src_layout_digest, PROTO_HASH_BYTES);
	assert_int_equal(a->created_ms, b->created_ms);
	assert_int_equal(a->chunk_size, b->chunk_size);
	assert_int_equal(a->nlayouts, b->nlayouts);
	for (uint32_t i = 0; i < a->nlayouts; i++) {
		const struct proto_mlayout *la = &a->layouts[i], *lb = &b->layouts[i];
		assert_memory_equal(la->layout_digest, lb->layout_digest, PROTO_HASH_BYTES);
		assert_memory_equal(la->plan_digest, lb->plan_digest, PROTO_HASH_BYTES);
		assert_int_equal(la->nparcels, lb->nparcels);
		for (uint32_t j = 0; j < la->nparcels; j++) {
			const struct proto_mparcel *pa = &la->parcels[j], *pb = &lb->parcels[j];
			assert_int_equal(pa->src_rank, pb->src_rank);
			assert_int_equal(pa->dst_rank, pb->dst_rank);
			assert_int_equal(pa->bytes, pb->bytes);
			assert_int_equal(pa->encoding, pb->encoding);
			assert_int_equal(pa->wire_bytes, pb->wire_bytes);
			assert_int_equal(pa->nchunks, pb->nchunks);
			if (pa->nchunks > 0)
				assert_memory_equal(pa->chunks, pb->chunks,
						    pa->nchunks * sizeof(*pa->chunks));
		}
	}
	assert_memory_equal(a->signer, b->signer, PROTO_PK_BYTES);
	assert_memory_equal(a->signature, b->signature, PROTO_SIG_BYTES);
	assert_memory_equal(a->digest, b->digest, PROTO_HASH_BYTES);
}

static void test_alloc_chunks(void **state)
{
	struct proto_manifest m;
	struct proto_mparcel p;
	static const struct {
		uint64_t wire;
		uint32_t n, last;
	} cases[] = {{0, 0, 0}, {1, 1, 1}, {63, 1, 63}, {64, 1, 64},
		     {65, 2, 1}, {128, 2, 64}, {1000, 16, 40}};

	proto_manifest_init(&m);
	assert_int_equal(m.chunk_size, proto_param(PROTO_PARAM_CHUNK_SIZE));
	m.chunk_size = 64;
	memset(&p, 0, sizeof(p));
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cases); i++) {
		assert_int_equal(proto_mparcel_alloc_chunks(&m, &p, cases[i].wire), 0);
		assert_int_equal(p.nchunks, cases[i].n);
		assert_int_equal(p.wire_bytes, cases[i].wire);
		for (uint32_t c = 0; c + 1 < p.nchunks; c++)
			assert_int_equal(p.chunks[c].size, 64);
		if (p.nchunks > 0) {
			assert_int_equal(p.chunks[p.nchunks - 1].size, cases[i].last);
			assert_true(sodium_is_zero(p.chunks[0].hash, PROTO_HASH_BYTES));
		} else {
			assert_null(p.chunks);
		}
	}
	/* Out-of-range chunk sizes and chunk counts leave the parcel alone. */
	m.chunk_size = 1;
	assert_int_equal(proto_mparcel_alloc_chunks(&m, &p, 10), -EINVAL);
	assert_int_equal(p.nchunks, 16);
	m.chunk_size = 64;
	assert_int_equal(proto_mparcel_alloc_chunks(&m, &p, UINT64_MAX), -EOVERFLOW);
	assert_int_equal(p.wire_bytes, 1000);
	free(p.chunks);
	proto_manifest_fini(&m);
}

static void test_roundtrip(void **state)
{
	struct proto_manifest m, d;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *buf;
	uint8_t dig[PROTO_HASH_BYTES], tmp[PROTO_HASH_BYTES];
	size_t len;
	struct bb raw = {0};

	crypto_sign_keypair(pk, sk);
	base_manifest(&m);
	/* A third layout with many parcels and a multi-chunk delta parcel. */
	fill(tmp, sizeof(tmp), 0xa2);
	struct proto_mlayout *l = proto_manifest_add_layout(&m, tmp, tmp, 40);
	assert_non_null(l);
	for (uint32_t i = 0; i < 40; i++)
		set_parcel(&m, l, 2, i, i / 8, i % 8, i % 3 ? PROTO_ENC_RAW : PROTO_ENC_DELTA,
			   i % 3 ? 64ull * i + i : 5000, 64ull * i + i);
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), 0);
	assert_memory_equal(m.signer, pk, PROTO_PK_BYTES);
	crypto_generichash(dig, sizeof(dig), buf, len, NULL, 0);
	assert_memory_equal(m.digest, dig, PROTO_HASH_BYTES);

	/* The library's encoding is exactly the documented format. */
	encode_raw(&m, &raw);
	bb_sign(&raw, pk, sk);
	assert_int_equal(raw.len, len);
	assert_memory_equal(raw.p, buf, len);
	free(raw.p);

	assert_int_equal(proto_manifest_decode(buf, len, pk, &d, &err), 0);
	assert_manifest_equal(&m, &d);
	assert_int_equal(proto_manifest_wire_bytes(&d), proto_manifest_wire_bytes(&m));
	assert_int_equal(proto_manifest_wire_bytes(&d),
			 130 + 70 + 0 + 64 + 40 * 39 / 2 * 65);

	/* Lookups. */
	fill(tmp, sizeof(tmp), 0xa1);
	assert_ptr_equal(proto_manifest_layout(&d, tmp), &d.layouts[1]);
	fill(tmp, sizeof(tmp), 0xa3);
	assert_null(proto_manifest_layout(&d, tmp));
	for (uint32_t i = 0; i < 40; i++)
		assert_ptr_equal(proto_mlayout_parcel(&d.layouts[2], i / 8, i % 8),
				 &d.layouts[2].parcels[i]);
	assert_null(proto_mlayout_parcel(&d.layouts[2], 5, 0));
	assert_null(proto_mlayout_parcel(&d.layouts[2], 0, 8));
	assert_ptr_equal(proto_mlayout_parcel(&d.layouts[0], 1, 0), &d.layouts[0].parcels[2]);
	assert_null(proto_mlayout_parcel(&d.layouts[0], 1, 1));

	uint8_t peek[PROTO_PK_BYTES];
	assert_int_equal(proto_manifest_peek_signer(buf, len, peek), 0);
	assert_memory_equal(peek, pk, PROTO_PK_BYTES);
	assert_int_equal(proto_manifest_peek_signer(buf, 100, peek), -EINVAL);

	proto_manifest_fini(&d);
	assert_true(is_empty(&d));
	proto_manifest_fini(&d); /* twice is harmless */
	proto_manifest_fini(&m);
	free(buf);
}

/* The smallest manifests: an anchor without parent or layouts, and one
 * with an empty layout. */
static void test_roundtrip_minimal(void **state)
{
	struct proto_manifest m, d;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *buf, z[PROTO_HASH_BYTES] = {0};
	size_t len;

	crypto_sign_keypair(pk, sk);
	proto_manifest_init(&m);
	m.version = 1;
	m.kind = PROTO_KIND_ANCHOR;
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), 0);
	assert_int_equal(len, 141 + 96);
	assert_int_equal(proto_manifest_decode(buf, len, pk, &d, &err), 0);
	assert_manifest_equal(&m, &d);
	assert_int_equal(d.chunk_size, proto_param(PROTO_PARAM_CHUNK_SIZE));
	proto_manifest_fini(&d);
	free(buf);

	assert_non_null(proto_manifest_add_layout(&m, z, z, 0));
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), 0);
	assert_int_equal(proto_manifest_decode(buf, len, pk, &d, &err), 0);
	assert_manifest_equal(&m, &d);
	assert_int_equal(proto_manifest_wire_bytes(&d), 0);
	proto_manifest_fini(&d);
	proto_manifest_fini(&m);
	free(buf);
}

/* Signing is deterministic and the format is stable: a fixed manifest under
 * the fixed test key always has this digest. If this fails, the encoding
 * changed: bump the format number and regenerate the corpus. */
static void test_digest_stable(void **state)
{
	static const char want[] = GOLDEN_DIGEST;
	struct proto_manifest m;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *a, *b;
	uint8_t d1[PROTO_HASH_BYTES];
	char hex[2 * PROTO_HASH_BYTES + 1];
	size_t alen, blen;

	test_keys(sk, pk);
	base_manifest(&m);
	assert_int_equal(proto_manifest_sign(&m, sk, &a, &alen, &err), 0);
	memcpy(d1, m.digest, sizeof(d1));
	assert_int_equal(proto_manifest_sign(&m, sk, &b, &blen, &err), 0);
	assert_int_equal(alen, blen);
	assert_memory_equal(a, b, alen);
	assert_memory_equal(d1, m.digest, sizeof(d1));
	sodium_bin2hex(hex, sizeof(hex), m.digest, PROTO_HASH_BYTES);
	if (strcmp(hex, want) != 0) {
		fprintf(stderr, "digest %s, expected %s\n", hex, want);
		fail();
	}
	/* A one-field change changes the digest. */
	m.created_ms++;
	free(b);
	assert_int_equal(proto_manifest_sign(&m, sk, &b, &blen, &err), 0);
	assert_memory_not_equal(d1, m.digest, sizeof(d1));
	free(a);
	free(b);
	proto_manifest_fini(&m);
}

static void test_other_key_refused(void **state)
{
	struct proto_manifest m;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	uint8_t opk[PROTO_PK_BYTES], osk[PROTO_SK_BYTES], *buf;
	size_t len;

	crypto_sign_keypair(pk, sk);
	crypto_sign_keypair(opk, osk);
	base_manifest(&m);
	assert_int_equal(proto_manifest_sign(&m, osk, &buf, &len, &err), 0);
	expect_refused(buf, len, pk, "bad signature", "signed by another key");
	struct proto_manifest d;
	assert_int_equal(proto_manifest_decode(buf, len, pk, &d, &err), -EKEYREJECTED);
	free(buf);
	proto_manifest_fini(&m);
}

/* Every single-bit flip, every truncation and every extension is refused. */
static void test_tampering(void **state)
{
	struct proto_manifest m, d;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *buf, *big;
	uint8_t z[PROTO_HASH_BYTES] = {0};
	size_t len;
	char what[64];

	crypto_sign_keypair(pk, sk);
	proto_manifest_init(&m);
	m.version = 2;
	m.parent_version = 1;
	fill(m.parent_digest, PROTO_HASH_BYTES, 7);
	m.kind = PROTO_KIND_DELTA;
	m.chunk_size = 64;
	struct proto_mlayout *l = proto_manifest_add_layout(&m, z, z, 2);
	set_parcel(&m, l, 0, 0, 0, 0, PROTO_ENC_DELTA, 500, 100);
	set_parcel(&m, l, 0, 1, 0, 1, PROTO_ENC_RAW, 10, 10);
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), 0);
	assert_int_equal(proto_manifest_decode(buf, len, pk, &d, &err), 0);
	proto_manifest_fini(&d);

	for (size_t bit = 0; bit < len * 8; bit++) {
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		snprintf(what, sizeof(what), "bit %zu flipped", bit);
		expect_refused(buf, len, pk, NULL, what);
		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	for (size_t n = 0; n < len; n++) {
		/* A copy of exactly n bytes, so ASan sees any read past the end. */
		uint8_t *t = malloc(n + 1);
		memcpy(t, buf, n);
		snprintf(what, sizeof(what), "truncated to %zu", n);
		expect_refused(n ? t : NULL, n, pk, NULL, what);
		free(t);
	}
	big = malloc(len + 1);
	memcpy(big, buf, len);
	big[len] = 0;
	expect_refused(big, len + 1, pk, "bad signature", "one byte appended");
	free(big);
	free(buf);
	proto_manifest_fini(&m);
}

static void test_size_cap(void **state)
{
	size_t cap = (size_t)proto_param(PROTO_PARAM_MANIFEST_MAX);
	uint8_t *buf = calloc(1, cap + 1), pk[PROTO_PK_BYTES] = {0};

	assert_non_null(buf);
	memcpy(buf, "TSRM", 4);
	buf[4] = 1;
	expect_refused(buf, cap + 1, pk, "more than the", "one byte over the cap");
	free(buf);
}

static void test_sign_refuses_invalid(void **state)
{
	struct proto_manifest m;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *buf = (uint8_t *)&err;
	size_t len = 1;

	crypto_sign_keypair(pk, sk);
	/* Every field-level corpus case is refused by the encoder too. */
	for (size_t i = 0; i < PROTO_ARRAY_LEN(corpus); i++) {
		struct corpus_ctx c;
		if (corpus[i].edit_m == NULL)
			continue;
		base_manifest(&c.m);
		corpus[i].edit_m(&c);
		memset(&err, 0, sizeof(err));
		assert_true(proto_manifest_sign(&c.m, sk, &buf, &len, &err) < 0);
		assert_null(buf);
		assert_int_equal(len, 0);
		if (strstr(err.msg, corpus[i].want) == NULL) {
			fprintf(stderr, "%s: '%s'\n", corpus[i].name, err.msg);
			fail();
		}
		proto_manifest_fini(&c.m);
	}
	/* And header-level ones. */
	base_manifest(&m);
	m.version = 0;
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), -EBADMSG);
	m.version = 5;
	m.kind = 9;
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), -EBADMSG);
	m.kind = PROTO_KIND_DELTA;
	m.chunk_size = 1u << 31;
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "chunk_size"));
	proto_manifest_fini(&m);
}

static void test_to_json(void **state)
{
	struct proto_manifest m;
	struct proto_err err = {{0}};
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], *buf;
	char hex[2 * PROTO_HASH_BYTES + 1];
	size_t len;
	json_t *j, *l, *p;

	crypto_sign_keypair(pk, sk);
	base_manifest(&m);
	assert_int_equal(proto_manifest_sign(&m, sk, &buf, &len, &err), 0);
	free(buf);

	j = proto_manifest_to_json(&m, false);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 5);
	assert_int_equal(json_integer_value(json_object_get(j, "parent_version")), 4);
	assert_string_equal(json_string_value(json_object_get(j, "kind")), "delta");
	assert_int_equal(json_integer_value(json_object_get(j, "chunk_size")), 64);
	assert_int_equal(json_integer_value(json_object_get(j, "wire_bytes")), 264);
	sodium_bin2hex(hex, sizeof(hex), m.digest, PROTO_HASH_BYTES);
	assert_string_equal(json_string_value(json_object_get(j, "digest")), hex);
	sodium_bin2hex(hex, sizeof(hex), pk, PROTO_PK_BYTES);
	assert_string_equal(json_string_value(json_object_get(j, "signer")), hex);
	assert_string_equal(json_string_value(json_object_get(j, "parent_digest")),
			    "1111111111111111111111111111111111111111111111111111111111111111");
	l = json_array_get(json_object_get(j, "layouts"), 0);
	assert_int_equal(json_array_size(json_object_get(j, "layouts")), 2);
	assert_string_equal(json_string_value(json_object_get(l, "layout_digest")),
			    "a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0");
	assert_int_equal(json_integer_value(json_object_get(l, "bytes")), 1130);
	assert_int_equal(json_integer_value(json_object_get(l, "wire_bytes")), 200);
	p = json_array_get(json_object_get(l, "parcels"), 1);
	assert_int_equal(json_integer_value(json_object_get(p, "dst_rank")), 1);
	assert_string_equal(json_string_value(json_object_get(p, "encoding")), "delta");
	assert_int_equal(json_integer_value(json_object_get(p, "nchunks")), 2);
	assert_null(json_object_get(p, "chunks"));
	json_decref(j);

	j = proto_manifest_to_json(&m, true);
	assert_non_null(j);
	l = json_array_get(json_object_get(j, "layouts"), 0);
	p = json_array_get(json_object_get(l, "parcels"), 1);
	assert_int_equal(json_array_size(json_object_get(p, "chunks")), 2);
	json_t *c = json_array_get(json_object_get(p, "chunks"), 1);
	assert_int_equal(json_integer_value(json_object_get(c, "size")), 6);
	sodium_bin2hex(hex, sizeof(hex), m.layouts[0].parcels[1].chunks[1].hash,
		       PROTO_HASH_BYTES);
	assert_string_equal(json_string_value(json_object_get(c, "hash")), hex);
	char *s = json_dumps(j, JSON_COMPACT);
	assert_non_null(s);
	free(s);
	json_decref(j);

	/* No parent: parent_digest is null. */
	m.parent_version = 0;
	j = proto_manifest_to_json(&m, false);
	assert_true(json_is_null(json_object_get(j, "parent_digest")));
	json_decref(j);
	proto_manifest_fini(&m);
}

/* Each generated case fails for the reason it was made for, and the
 * committed files are exactly what the generator makes. */
static void test_corpus_reasons(void **state)
{
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES], *file;
	char path[4096], name[256];
	size_t flen;
	struct proto_err err = {{0}};

	test_keys(sk, pk);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(corpus); i++) {
		struct bb b;
		corpus_build(i, &b);
		expect_refused(b.p, b.len, pk, corpus[i].want, corpus[i].name);
		snprintf(name, sizeof(name), "bad-manifest-%s", corpus[i].name);
		if (proto_read_file(tu_data(path, sizeof(path), name), 1u << 20, &file,
				    &flen, &err) != 0) {
			fprintf(stderr, "%s (run tests/data/gen-bad-manifests.sh)\n", err.msg);
			fail();
		}
		if (flen != b.len || (flen > 0 && memcmp(file, b.p, flen) != 0)) {
			fprintf(stderr, "%s differs from the generator's output "
					"(run tests/data/gen-bad-manifests.sh)\n", path);
			fail();
		}
		free(file);
		free(b.p);
	}
}

static int bad_manifest_filter(const struct dirent *e)
{
	return strncmp(e->d_name, "bad-manifest-", 13) == 0;
}

/* Every tests/data/bad-manifest-* file, generated or not, is refused. */
static void test_corpus_files(void **state)
{
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES], *buf;
	struct dirent **ents;
	char dir[4096], path[8192];
	struct proto_err err = {{0}};
	size_t len;
	int n;

	test_keys(sk, pk);
	tu_data(dir, sizeof(dir), "");
	n = scandir(dir, &ents, bad_manifest_filter, alphasort);
	assert_true(n >= (int)PROTO_ARRAY_LEN(corpus));
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
		assert_int_equal(proto_read_file(path, 1u << 26, &buf, &len, &err), 0);
		expect_refused(len ? buf : NULL, len, pk, NULL, ents[i]->d_name);
		free(buf);
		free(ents[i]);
	}
	free(ents);
}

/*
 * The chunk hash is part of the wire format (proto/chunkhash.h): known
 * answers pin it, BLAKE3 unkeyed of "" and "abc" (the values its authors
 * publish), and of a 128 KiB chunk whole and piece by piece, so a change of
 * hash is a change of this test.
 */
static void test_chunk_hash_known_answer(void **state)
{
	static const struct {
		const char *in, *want;
	} kat[] = {
		{"", "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{"abc", "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"},
	};
	uint8_t out[PROTO_HASH_BYTES], again[PROTO_HASH_BYTES], *big;
	char hex[2 * PROTO_HASH_BYTES + 1];
	struct proto_chunk_hasher h;
	size_t n = 128u << 10;

	(void)state;
	for (size_t i = 0; i < PROTO_ARRAY_LEN(kat); i++) {
		proto_chunk_hash(out, (const uint8_t *)kat[i].in, strlen(kat[i].in));
		sodium_bin2hex(hex, sizeof(hex), out, sizeof(out));
		assert_string_equal(hex, kat[i].want);
	}
	/* Many BLAKE3 chunks (1 KiB each) in uneven pieces: the tree and the
	 * SIMD paths give what one call gives. */
	big = malloc(n);
	assert_non_null(big);
	for (size_t i = 0; i < n; i++)
		big[i] = (uint8_t)(i % 251);
	proto_chunk_hash(out, big, n);
	proto_chunk_hash_init(&h);
	for (size_t o = 0, step = 1; o < n; o += step, step = step * 3 + 1)
		proto_chunk_hash_update(&h, big + o, PROTO_MIN(step, n - o));
	proto_chunk_hash_final(&h, again);
	assert_memory_equal(again, out, sizeof(out));
	free(big);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alloc_chunks),
		cmocka_unit_test(test_chunk_hash_known_answer),
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_roundtrip_minimal),
		cmocka_unit_test(test_digest_stable),
		cmocka_unit_test(test_other_key_refused),
		cmocka_unit_test(test_tampering),
		cmocka_unit_test(test_size_cap),
		cmocka_unit_test(test_sign_refuses_invalid),
		cmocka_unit_test(test_to_json),
		cmocka_unit_test(test_corpus_reasons),
		cmocka_unit_test(test_corpus_files),
	};

	if (sodium_init() < 0)
		return 1;
	if (argc == 3 && strcmp(argv[1], "--gen-bad-manifests") == 0)
		return gen_corpus(argv[2]);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
