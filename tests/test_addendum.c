/* Tests of the manifest addendum: round trip, binding to its manifest,
 * splicing into it, the raw copy of a delta's layout, and hostile bytes (every case refused with one line, the
 * output left empty). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <endian.h>
#include <errno.h>
#include <sodium.h>

#include "proto/addendum.h"
#include "proto/manifest.h"
#include "proto/params.h"
#include "tests/testutil.h"

static uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];

/* A signed anchor manifest: version 3, chunk_size 64, one layout (0xa0). */
static void base_manifest(struct proto_manifest *m, uint8_t **buf, size_t *len)
{
	uint8_t d[PROTO_HASH_BYTES], e[PROTO_HASH_BYTES];
	struct proto_mlayout *l;
	struct proto_err err = {{0}};

	proto_manifest_init(m);
	m->version = 3;
	m->parent_version = 2;
	memset(m->parent_digest, 0x11, PROTO_HASH_BYTES);
	m->kind = PROTO_KIND_ANCHOR;
	m->chunk_size = 64;
	memset(d, 0xa0, sizeof(d));
	memset(e, 0xb0, sizeof(e));
	l = proto_manifest_add_layout(m, d, e, 1);
	assert_non_null(l);
	l->parcels[0].bytes = 100;
	assert_int_equal(proto_mparcel_alloc_chunks(m, &l->parcels[0], 100), 0);
	assert_int_equal(proto_manifest_sign(m, sk, buf, len, &err), 0);
}

/* An addendum for m: layout and plan digests all bytes lay and plan, n
 * parcels (src[i] -> 0) of bytes[i] B, each chunk's hash distinct. */
static void build_addendum(const struct proto_manifest *m, struct proto_addendum *a, int lay,
			   int plan, const uint32_t *src, const uint32_t *bytes, uint32_t n)
{
	struct proto_manifest tmp;
	uint8_t d[PROTO_HASH_BYTES], e[PROTO_HASH_BYTES];
	struct proto_mlayout *l;

	proto_addendum_init(a);
	a->version = m->version;
	memcpy(a->manifest_digest, m->digest, PROTO_HASH_BYTES);
	a->chunk_size = m->chunk_size;
	/* Built through a manifest to size the chunk lists, then moved. */
	proto_manifest_init(&tmp);
	tmp.chunk_size = m->chunk_size;
	memset(d, lay, sizeof(d));
	memset(e, plan, sizeof(e));
	l = proto_manifest_add_layout(&tmp, d, e, n);
	assert_non_null(l);
	for (uint32_t p = 0; p < n; p++) {
		l->parcels[p].src_rank = src[p];
		l->parcels[p].bytes = bytes[p];
		assert_int_equal(proto_mparcel_alloc_chunks(&tmp, &l->parcels[p], bytes[p]), 0);
		for (uint32_t c = 0; c < l->parcels[p].nchunks; c++) {
			uint32_t in[2] = {p, c};
			crypto_generichash(l->parcels[p].chunks[c].hash, PROTO_HASH_BYTES,
					   (const uint8_t *)in, sizeof(in), NULL, 0);
		}
	}
	a->layout = *l;
	l->parcels = NULL;
	l->nparcels = 0;
	proto_manifest_fini(&tmp);
}

/* An addendum for m: layout 0xa1, parcels (0,0) 130 B and (1,0) 64 B. */
static void base_addendum(const struct proto_manifest *m, struct proto_addendum *a)
{
	build_addendum(m, a, 0xa1, 0xb1, (const uint32_t[]){0, 1}, (const uint32_t[]){130, 64}, 2);
}

static void test_roundtrip_and_extend(void **state)
{
	struct proto_manifest m, m2;
	struct proto_addendum a, b;
	struct proto_err err = {{0}};
	uint8_t *mbuf, *abuf;
	size_t mlen, alen;

	base_manifest(&m, &mbuf, &mlen);
	base_addendum(&m, &a);
	assert_int_equal(proto_addendum_sign(&a, sk, &abuf, &alen, &err), 0);
	assert_int_equal(proto_addendum_decode(abuf, alen, pk, &b, &err), 0);
	assert_int_equal(b.version, 3);
	assert_memory_equal(b.digest, a.digest, PROTO_HASH_BYTES);
	assert_int_equal(b.layout.nparcels, 2);
	assert_int_equal(b.layout.parcels[0].nchunks, 3);
	assert_memory_equal(b.layout.parcels[1].chunks[0].hash, a.layout.parcels[1].chunks[0].hash,
			    PROTO_HASH_BYTES);
	assert_int_equal(proto_addendum_binds(&b, &m, &err), 0);

	/* Spliced in, the layout reads like the manifest's own. */
	assert_int_equal(proto_manifest_decode(mbuf, mlen, pk, &m2, &err), 0);
	assert_int_equal(proto_addendum_extend(&m2, &b), 0);
	assert_int_equal(m2.nlayouts, 2);
	assert_non_null(proto_manifest_layout(&m2, b.layout.layout_digest));
	assert_non_null(proto_mlayout_parcel(proto_manifest_layout(&m2, b.layout.layout_digest), 1, 0));
	/* Now it is listed: a second addendum for it does not bind. */
	assert_int_equal(proto_addendum_binds(&b, &m2, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "already lists"));

	json_t *j = proto_addendum_to_json(&b);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "wire_bytes")), 194);
	json_decref(j);
	proto_manifest_fini(&m2);
	proto_addendum_fini(&b);
	proto_addendum_fini(&a);
	proto_addendum_fini(&a); /* twice is harmless */
	free(abuf);
	free(mbuf);
	proto_manifest_fini(&m);
}

static void test_binding_refused(void **state)
{
	struct proto_manifest m;
	struct proto_addendum a;
	struct proto_err err = {{0}};
	uint8_t *mbuf;
	size_t mlen;

	base_manifest(&m, &mbuf, &mlen);
	base_addendum(&m, &a);
	a.version = 4;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "not 3"));
	a.version = 3;
	a.manifest_digest[5] ^= 1;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "another manifest"));
	a.manifest_digest[5] ^= 1;
	a.chunk_size = 128;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "chunk size"));
	a.chunk_size = 64;
	memset(a.layout.layout_digest, 0xa0, PROTO_HASH_BYTES);
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	proto_addendum_fini(&a);
	free(mbuf);
	proto_manifest_fini(&m);
}

/* A raw copy of m's layout 0xa0 (plan 0xb0): parcel (0,0), 100 B. */
static void copy_addendum(const struct proto_manifest *m, struct proto_addendum *a)
{
	build_addendum(m, a, 0xa0, 0xb0, (const uint32_t[]){0}, (const uint32_t[]){100}, 1);
	a->copy = true;
}

/* A raw copy (format 2) of a layout a delta version lists: it round-trips
 * as a copy, binds only to a delta that lists its layout with the same plan
 * and parcels, and replaces that layout's parcels when spliced in (the
 * delta's chunk hashes give way to the raw ones). A copy signed by another
 * key, or a format word changed after signing, is refused. */
static void test_copy(void **state)
{
	struct proto_manifest m;
	struct proto_addendum a, b;
	struct proto_err err = {{0}};
	uint8_t *mbuf, *abuf, opk[PROTO_PK_BYTES], osk[PROTO_SK_BYTES];
	size_t mlen, alen;

	base_manifest(&m, &mbuf, &mlen);
	copy_addendum(&m, &a);
	/* An anchor sends raw already. */
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "anchor"));
	m.kind = PROTO_KIND_DELTA; /* in memory only: the binding reads fields */
	assert_int_equal(proto_addendum_binds(&a, &m, &err), 0);
	assert_int_equal(proto_addendum_sign(&a, sk, &abuf, &alen, &err), 0);
	assert_int_equal(proto_addendum_decode(abuf, alen, pk, &b, &err), 0);
	assert_true(b.copy);
	assert_int_equal(proto_addendum_binds(&b, &m, &err), 0);
	json_t *j = proto_addendum_to_json(&b);
	assert_true(json_is_true(json_object_get(j, "copy")));
	json_decref(j);
	proto_addendum_fini(&b);
	/* The format word is signed: 2 -> 1 breaks the signature. */
	abuf[4] = 1;
	assert_int_equal(proto_addendum_decode(abuf, alen, pk, &b, &err), -EKEYREJECTED);
	assert_false(b.copy);
	free(abuf);
	/* Another key's copy. */
	crypto_sign_keypair(opk, osk);
	assert_int_equal(proto_addendum_sign(&a, osk, &abuf, &alen, &err), 0);
	assert_int_equal(proto_addendum_decode(abuf, alen, pk, &b, &err), -EKEYREJECTED);
	free(abuf);
	/* Spliced in: the same layout, its parcels now the copy's. */
	assert_int_equal(proto_addendum_extend(&m, &a), 0);
	assert_int_equal(m.nlayouts, 1);
	assert_memory_equal(m.layouts[0].parcels[0].chunks[1].hash, a.layout.parcels[0].chunks[1].hash,
			    PROTO_HASH_BYTES);
	/* Another size, another plan, an unlisted layout: not bound. */
	a.layout.parcels[0].bytes = 101;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "parcel 0 differs"));
	a.layout.parcels[0].bytes = 100;
	a.layout.plan_digest[0] ^= 1;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "another plan"));
	a.layout.plan_digest[0] ^= 1;
	a.layout.layout_digest[0] ^= 1;
	assert_int_equal(proto_addendum_binds(&a, &m, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "does not list"));
	proto_addendum_fini(&a);
	free(mbuf);
	proto_manifest_fini(&m);
}

/* The signer refuses what the decoder would. */
static void test_sign_refuses_bad(void **state)
{
	struct proto_manifest m;
	struct proto_addendum a;
	struct proto_err err = {{0}};
	uint8_t *mbuf, *abuf = (uint8_t *)"x";
	size_t mlen, alen = 1;

	base_manifest(&m, &mbuf, &mlen);
	base_addendum(&m, &a);
	a.layout.parcels[0].encoding = PROTO_ENC_DELTA;
	assert_int_equal(proto_addendum_sign(&a, sk, &abuf, &alen, &err), -EBADMSG);
	assert_null(abuf);
	assert_int_equal(alen, 0);
	assert_non_null(strstr(err.msg, "addendum"));
	a.layout.parcels[0].encoding = PROTO_ENC_RAW;
	a.version = 0;
	assert_int_equal(proto_addendum_sign(&a, sk, &abuf, &alen, &err), -EBADMSG);
	proto_addendum_fini(&a);
	free(mbuf);
	proto_manifest_fini(&m);
}

/* Re-signs buf (len bytes, trailer included) after an edit. */
static void resign(uint8_t *buf, size_t len)
{
	crypto_sign_detached(buf + len - PROTO_SIG_BYTES, NULL, buf, len - PROTO_SIG_BYTES, sk);
}

static void expect_refused(const uint8_t *buf, size_t len, const uint8_t *key, int code,
			   const char *needle)
{
	struct proto_addendum out;
	struct proto_err err = {{0}};
	int rc = proto_addendum_decode(buf, len, key, &out, &err);

	if (rc != code || strstr(err.msg, needle) == NULL || strchr(err.msg, '\n') != NULL)
		fail_msg("want %d '%s', got %d '%s'", code, needle, rc, err.msg);
	assert_int_equal(out.layout.nparcels, 0);
	assert_null(out.layout.parcels);
	assert_int_equal(out.version, 0);
}

static void test_bad_input(void **state)
{
	struct proto_manifest m;
	struct proto_addendum a;
	struct proto_err err = {{0}};
	uint8_t *mbuf, *abuf, *b, opk[PROTO_PK_BYTES], osk[PROTO_SK_BYTES];
	size_t mlen, alen;
	/* Offsets: header 52 bytes, layout block at 52: digests 64, nparcels
	 * at 116, parcel 0 at 120 (src 4, dst 4, bytes 8, enc 1, wire 8,
	 * nchunks 4 = 29), its first chunk at 149 (size 4, hash 32). */
	const size_t nparcels_at = 116, enc_at = 120 + 16, nchunks_at = 120 + 25,
		     hash_at = 149 + 4;

	base_manifest(&m, &mbuf, &mlen);
	base_addendum(&m, &a);
	assert_int_equal(proto_addendum_sign(&a, sk, &abuf, &alen, &err), 0);
	b = malloc(alen + 8);
	assert_non_null(b);

	expect_refused(NULL, 0, pk, -EBADMSG, "shorter");
	expect_refused(abuf, 40, pk, -EBADMSG, "shorter");
	memcpy(b, abuf, alen);
	b[0] = 'X';
	expect_refused(b, alen, pk, -EBADMSG, "bad magic");
	memcpy(b, abuf, alen);
	b[4] = 3;
	expect_refused(b, alen, pk, -EBADMSG, "format 3");
	memcpy(b, abuf, alen);
	b[4] = 2; /* a copy's format word on an addendum: not what was signed */
	expect_refused(b, alen, pk, -EKEYREJECTED, "bad signature");
	/* Tampered chunk hash, version or digest binding: the signature. */
	memcpy(b, abuf, alen);
	b[hash_at] ^= 1;
	expect_refused(b, alen, pk, -EKEYREJECTED, "bad signature");
	memcpy(b, abuf, alen);
	b[8] ^= 1;
	expect_refused(b, alen, pk, -EKEYREJECTED, "bad signature");
	memcpy(b, abuf, alen);
	b[20] ^= 1;
	expect_refused(b, alen, pk, -EKEYREJECTED, "bad signature");
	/* Another key. */
	crypto_sign_keypair(opk, osk);
	expect_refused(abuf, alen, opk, -EKEYREJECTED, "bad signature");
	/* Signed by the right key but naming another signer. */
	memcpy(b, abuf, alen);
	memcpy(b + alen - PROTO_SIG_BYTES - PROTO_PK_BYTES, opk, PROTO_PK_BYTES);
	resign(b, alen);
	expect_refused(b, alen, pk, -EKEYREJECTED, "signer field");
	/* Well signed but malformed: counts, trailing bytes, rules. */
	memcpy(b, abuf, alen);
	b[nparcels_at] = 200;
	resign(b, alen);
	expect_refused(b, alen, pk, -EBADMSG, "parcels declared");
	memcpy(b, abuf, alen);
	b[nchunks_at] = 0xff;
	b[nchunks_at + 1] = 0xff;
	resign(b, alen);
	expect_refused(b, alen, pk, -EBADMSG, "chunks declared");
	memcpy(b, abuf, alen);
	b[enc_at] = PROTO_ENC_DELTA;
	resign(b, alen);
	expect_refused(b, alen, pk, -EBADMSG, "raw");
	memcpy(b, abuf, alen);
	memset(b + 8, 0, 8); /* version 0 */
	resign(b, alen);
	expect_refused(b, alen, pk, -EBADMSG, "version 0");
	memcpy(b, abuf, alen);
	memset(b + 48, 0, 4); /* chunk_size 0 */
	resign(b, alen);
	expect_refused(b, alen, pk, -EBADMSG, "chunk_size 0");
	/* Trailing bytes: 8 more before the trailer. */
	memcpy(b, abuf, alen - 96);
	memset(b + alen - 96, 0, 8);
	memcpy(b + alen - 96 + 8, abuf + alen - 96, 96);
	resign(b, alen + 8);
	expect_refused(b, alen + 8, pk, -EBADMSG, "trailing");
	/* Truncated inside the layout block (re-signed, so only framing). */
	memcpy(b, abuf, 140);
	memcpy(b + 140, abuf + alen - 96, 96);
	resign(b, 236);
	expect_refused(b, 236, pk, -EBADMSG, "remain");
	/* Larger than the cap. */
	setenv("TESSERA_MANIFEST_MAX", "64", 1);
	expect_refused(abuf, alen, pk, -EFBIG, "more than");
	unsetenv("TESSERA_MANIFEST_MAX");

	free(b);
	free(abuf);
	proto_addendum_fini(&a);
	free(mbuf);
	proto_manifest_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_and_extend),
		cmocka_unit_test(test_binding_refused),
		cmocka_unit_test(test_copy),
		cmocka_unit_test(test_sign_refuses_bad),
		cmocka_unit_test(test_bad_input),
	};

	assert_int_equal(sodium_init() >= 0, 1);
	crypto_sign_keypair(pk, sk);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
