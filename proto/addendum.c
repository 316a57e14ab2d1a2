/* The manifest addendum: one more serving layout for a published version, signed. */
#include "proto/addendum.h"

#include <endian.h>
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/mlayout.h"
#include "proto/params.h"

#define ADD_MAGIC "TSRA"
#define ADD_FORMAT 1u
#define ADD_FORMAT_COPY 2u
#define ADD_HDR_BYTES (4 + 4 + 8 + PROTO_HASH_BYTES + 4)
#define ADD_TRAILER_BYTES (PROTO_PK_BYTES + PROTO_SIG_BYTES)
#define ADD_VERSION_MAX ((uint64_t)INT64_MAX)

void proto_addendum_init(struct proto_addendum *a)
{
	memset(a, 0, sizeof(*a));
}

void proto_addendum_fini(struct proto_addendum *a)
{
	proto__mlayout_fini(&a->layout);
	memset(a, 0, sizeof(*a));
}

/* The rules the signer and the decoder share. */
static int addendum_check(const struct proto_addendum *a, struct proto_err *err)
{
	int rc;

	if (a->version < 1 || a->version > ADD_VERSION_MAX)
		return proto_errf(err, EBADMSG, "addendum: version %llu, not in [1,%llu]",
				  (unsigned long long)a->version,
				  (unsigned long long)ADD_VERSION_MAX);
	/* An anchor's rules: every parcel raw, wire bytes == bytes. */
	rc = proto__mlayout_check(&a->layout, PROTO_KIND_ANCHOR, a->chunk_size, err);
	if (rc != 0)
		proto_err_prefix(err, "addendum");
	return rc;
}

int proto_addendum_sign(struct proto_addendum *a, const uint8_t sk[PROTO_SK_BYTES],
			uint8_t **out, size_t *outlen, struct proto_err *err)
{
	uint64_t size, cap = proto_param(PROTO_PARAM_MANIFEST_MAX);
	uint8_t signer[PROTO_PK_BYTES], *buf, *p;
	uint32_t u32;
	uint64_t u64;
	int rc;

	*out = NULL;
	*outlen = 0;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "addendum: libsodium failed to initialise");
	if ((rc = addendum_check(a, err)) != 0)
		return rc;
	size = ADD_HDR_BYTES + proto__mlayout_size(&a->layout) + ADD_TRAILER_BYTES;
	if (size > cap)
		return proto_errf(err, EFBIG,
				  "addendum: encoding exceeds the %llu bytes a decoder accepts (TESSERA_MANIFEST_MAX)",
				  (unsigned long long)cap);
	buf = malloc((size_t)size);
	if (buf == NULL)
		return proto_errf(err, ENOMEM, "addendum: out of memory");
	crypto_sign_ed25519_sk_to_pk(signer, sk);
	p = buf;
	memcpy(p, ADD_MAGIC, 4);
	p += 4;
	u32 = htole32(a->copy ? ADD_FORMAT_COPY : ADD_FORMAT);
	memcpy(p, &u32, 4);
	p += 4;
	u64 = htole64(a->version);
	memcpy(p, &u64, 8);
	p += 8;
	memcpy(p, a->manifest_digest, PROTO_HASH_BYTES);
	p += PROTO_HASH_BYTES;
	u32 = htole32(a->chunk_size);
	memcpy(p, &u32, 4);
	p += 4;
	p = proto__mlayout_put(p, &a->layout);
	memcpy(p, signer, PROTO_PK_BYTES);
	p += PROTO_PK_BYTES;
	if (crypto_sign_detached(p, NULL, buf, (size_t)(p - buf), sk) != 0) {
		free(buf);
		return proto_errf(err, EIO, "addendum: signing failed");
	}
	memcpy(a->signer, signer, PROTO_PK_BYTES);
	memcpy(a->signature, p, PROTO_SIG_BYTES);
	crypto_generichash(a->digest, PROTO_HASH_BYTES, buf, (size_t)size, NULL, 0);
	*out = buf;
	*outlen = (size_t)size;
	return 0;
}

int proto_addendum_decode(const uint8_t *buf, size_t len, const uint8_t pk[PROTO_PK_BYTES],
			  struct proto_addendum *out, struct proto_err *err)
{
	struct proto_addendum a;
	uint64_t cap = proto_param(PROTO_PARAM_MANIFEST_MAX);
	uint32_t u32;
	uint64_t u64;
	size_t body, used;
	int rc;

	proto_addendum_init(&a);
	proto_addendum_init(out);
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "addendum: libsodium failed to initialise");
	if (len > cap)
		return proto_errf(err, EFBIG, "addendum: %zu bytes, more than the %llu allowed",
				  len, (unsigned long long)cap);
	if (buf == NULL || len < ADD_HDR_BYTES + ADD_TRAILER_BYTES)
		return proto_errf(err, EBADMSG,
				  "addendum: %zu bytes, shorter than the smallest addendum (%d)",
				  len, ADD_HDR_BYTES + ADD_TRAILER_BYTES);
	if (memcmp(buf, ADD_MAGIC, 4) != 0)
		return proto_errf(err, EBADMSG, "addendum: bad magic, not a tessera addendum");
	memcpy(&u32, buf + 4, 4);
	if (le32toh(u32) != ADD_FORMAT && le32toh(u32) != ADD_FORMAT_COPY)
		return proto_errf(err, EBADMSG, "addendum: format %u, this build reads formats %u and %u",
				  le32toh(u32), ADD_FORMAT, ADD_FORMAT_COPY);
	a.copy = le32toh(u32) == ADD_FORMAT_COPY;
	/* Nothing past the magic is believed before this. */
	body = len - PROTO_SIG_BYTES;
	if (crypto_sign_verify_detached(buf + body, buf, body, pk) != 0)
		return proto_errf(err, EKEYREJECTED,
				  "addendum: bad signature (not signed by the expected trainer key, or altered)");
	if (sodium_memcmp(buf + body - PROTO_PK_BYTES, pk, PROTO_PK_BYTES) != 0)
		return proto_errf(err, EKEYREJECTED,
				  "addendum: signer field does not name the verifying key");
	memcpy(&u64, buf + 8, 8);
	a.version = le64toh(u64);
	memcpy(a.manifest_digest, buf + 16, PROTO_HASH_BYTES);
	memcpy(&u32, buf + 16 + PROTO_HASH_BYTES, 4);
	a.chunk_size = le32toh(u32);
	rc = proto__mlayout_get(buf + ADD_HDR_BYTES, len - ADD_HDR_BYTES - ADD_TRAILER_BYTES,
				&used, &a.layout, err);
	if (rc != 0) {
		proto_err_prefix(err, "addendum");
		return rc;
	}
	if (used != len - ADD_HDR_BYTES - ADD_TRAILER_BYTES) {
		rc = proto_errf(err, EBADMSG, "addendum: %zu trailing bytes after the layout",
				len - ADD_HDR_BYTES - ADD_TRAILER_BYTES - used);
		goto fail;
	}
	if ((rc = addendum_check(&a, err)) != 0)
		goto fail;
	memcpy(a.signer, buf + body - PROTO_PK_BYTES, PROTO_PK_BYTES);
	memcpy(a.signature, buf + body, PROTO_SIG_BYTES);
	crypto_generichash(a.digest, PROTO_HASH_BYTES, buf, len, NULL, 0);
	*out = a;
	return 0;
fail:
	proto_addendum_fini(&a);
	return rc;
}

int proto_addendum_binds(const struct proto_addendum *a, const struct proto_manifest *m,
			 struct proto_err *err)
{
	if (a->version != m->version)
		return proto_errf(err, EINVAL, "addendum: for version %llu, not %llu",
				  (unsigned long long)a->version, (unsigned long long)m->version);
	if (sodium_memcmp(a->manifest_digest, m->digest, PROTO_HASH_BYTES) != 0)
		return proto_errf(err, EINVAL,
				  "addendum: bound to another manifest of version %llu (digest differs)",
				  (unsigned long long)a->version);
	if (a->chunk_size != m->chunk_size)
		return proto_errf(err, EINVAL, "addendum: chunk size %u, the manifest's is %u",
				  a->chunk_size, m->chunk_size);
	const struct proto_mlayout *ml = proto_manifest_layout(m, a->layout.layout_digest);
	if (!a->copy && ml != NULL)
		return proto_errf(err, EINVAL,
				  "addendum: version %llu's manifest already lists its layout",
				  (unsigned long long)a->version);
	if (!a->copy)
		return 0;
	if (ml == NULL || m->kind != PROTO_KIND_DELTA)
		return proto_errf(err, EINVAL,
				  "addendum: a raw copy of a layout version %llu's manifest %s",
				  (unsigned long long)a->version,
				  ml == NULL ? "does not list" : "sends raw already (an anchor)");
	if (sodium_memcmp(ml->plan_digest, a->layout.plan_digest, PROTO_HASH_BYTES) != 0 ||
	    ml->nparcels != a->layout.nparcels)
		return proto_errf(err, EINVAL, "addendum: a raw copy with another plan than the manifest's");
	for (uint32_t i = 0; i < ml->nparcels; i++)
		if (ml->parcels[i].src_rank != a->layout.parcels[i].src_rank ||
		    ml->parcels[i].dst_rank != a->layout.parcels[i].dst_rank ||
		    ml->parcels[i].bytes != a->layout.parcels[i].bytes)
			return proto_errf(err, EINVAL,
					  "addendum: raw copy parcel %u differs from the manifest's", i);
	return 0;
}

int proto_addendum_extend(struct proto_manifest *m, const struct proto_addendum *a)
{
	const struct proto_mlayout *src = &a->layout;
	struct proto_mparcel *ps = NULL;
	struct proto_mlayout *l;

	if (src->nparcels > 0) {
		ps = calloc(src->nparcels, sizeof(*ps));
		if (ps == NULL)
			return -ENOMEM;
	}
	for (uint32_t i = 0; i < src->nparcels; i++) {
		ps[i] = src->parcels[i];
		ps[i].chunks = NULL;
		if (src->parcels[i].nchunks == 0)
			continue;
		ps[i].chunks = malloc((size_t)src->parcels[i].nchunks * sizeof(*ps[i].chunks));
		if (ps[i].chunks == NULL)
			goto fail;
		memcpy(ps[i].chunks, src->parcels[i].chunks,
		       (size_t)src->parcels[i].nchunks * sizeof(*ps[i].chunks));
	}
	l = NULL;
	for (uint32_t k = 0; a->copy && k < m->nlayouts && l == NULL; k++)
		if (memcmp(m->layouts[k].layout_digest, src->layout_digest, PROTO_HASH_BYTES) == 0)
			l = &m->layouts[k];
	if (l != NULL) { /* a raw copy: the listed deltas give way */
		for (uint32_t i = 0; i < l->nparcels; i++)
			free(l->parcels[i].chunks);
		free(l->parcels);
	} else if (a->copy ||
		   (l = proto_manifest_add_layout(m, src->layout_digest, src->plan_digest, 0)) == NULL) {
		goto fail;
	}
	l->nparcels = src->nparcels;
	l->parcels = ps;
	return 0;
fail:
	for (uint32_t i = 0; ps != NULL && i < src->nparcels; i++)
		free(ps[i].chunks);
	free(ps);
	return -ENOMEM;
}

static json_t *hex_json(const uint8_t *b, size_t n)
{
	char hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), b, PROTO_MIN(n, (size_t)PROTO_HASH_BYTES));
	return json_string(hex);
}

json_t *proto_addendum_to_json(const struct proto_addendum *a)
{
	uint64_t bytes = 0;

	for (uint32_t i = 0; i < a->layout.nparcels; i++)
		bytes += a->layout.parcels[i].wire_bytes;
	json_t *j = json_pack("{s:I,s:o,s:o,s:o,s:o,s:I,s:I}", "version", (json_int_t)a->version,
			 "manifest_digest", hex_json(a->manifest_digest, PROTO_HASH_BYTES),
			 "digest", hex_json(a->digest, PROTO_HASH_BYTES), "layout_digest",
			 hex_json(a->layout.layout_digest, PROTO_HASH_BYTES), "plan_digest",
			 hex_json(a->layout.plan_digest, PROTO_HASH_BYTES), "parcels",
			 (json_int_t)a->layout.nparcels, "wire_bytes", (json_int_t)PROTO_MIN(bytes, (uint64_t)INT64_MAX));
	if (j != NULL && a->copy && json_object_set_new(j, "copy", json_true()) != 0) {
		json_decref(j);
		return NULL;
	}
	return j;
}
