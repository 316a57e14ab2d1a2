/*
 * The manifest addendum: one more serving layout for a version that is
 * already published, signed by the trainer key.
 *
 * A replica may register a layout after the latest version was published;
 * that version's manifest (immutable, its digest chained by the next one)
 * lists no parcels for it. Rather than make the replica wait for the next
 * version, the publisher plans and hashes that layout's parcels of the
 * version and signs an addendum: the layout's block exactly as a manifest
 * carries it (layout and plan digests, parcels, chunk hashes), bound to the
 * version by its number and its manifest's digest. Whoever holds the
 * manifest and an addendum that verifies with the trainer key and binds to
 * that manifest holds the same guarantee for the new layout's bytes as for
 * the manifest's own layouts. An addendum's parcels are raw (full bytes),
 * whatever the version's kind: a layout nobody held has no parent to apply
 * a delta to.
 *
 * A raw copy (format 2) is the same block for a layout a delta version's
 * manifest does list (as deltas): the version's raw bytes in that layout,
 * chunk-hashed and signed, for a node that lacks the exact parent and takes
 * the version whole from replicas that hold it (node/agent/chain.c). Its
 * plan and parcels (ranks, sizes) must be the listed block's; only the
 * encoding and the chunk hashes differ.
 *
 * Encoding, format 1 or 2 (little-endian): "TSRA" | u32 format | u64 version |
 * manifest_digest[32] | u32 chunk_size | one layout block (proto/manifest.c's
 * encoding) | signer[32] | signature[64] (Ed25519 over every byte before
 * it). The digest is BLAKE2b-256 over the whole encoding. The decoder treats
 * its input as hostile, as the manifest's does.
 */
#ifndef PROTO_ADDENDUM_H
#define PROTO_ADDENDUM_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/manifest.h"

struct proto_addendum {
	uint64_t version;
	uint8_t manifest_digest[PROTO_HASH_BYTES]; /* the version's manifest */
	uint32_t chunk_size;                       /* the manifest's */
	bool copy;                                 /* format 2: a raw copy of a listed layout */
	struct proto_mlayout layout;               /* parcels owned here */
	uint8_t signer[PROTO_PK_BYTES];
	uint8_t signature[PROTO_SIG_BYTES];
	uint8_t digest[PROTO_HASH_BYTES]; /* of the signed encoding */
};

/* Zeroes a / frees what it owns and zeroes it (twice is harmless). */
void proto_addendum_init(struct proto_addendum *a);
void proto_addendum_fini(struct proto_addendum *a);

/* Checks a (the decoder's rules), encodes and signs with sk; fills signer,
 * signature and digest. *out is malloc'ed (caller frees). On failure
 * (-EBADMSG/-EINVAL a broken rule, -EFBIG over TESSERA_MANIFEST_MAX,
 * -ENOMEM) *out is NULL, *outlen 0 and a unchanged. */
int proto_addendum_sign(struct proto_addendum *a, const uint8_t sk[PROTO_SK_BYTES],
			uint8_t **out, size_t *outlen, struct proto_err *err);
/* Verifies the signature with pk, then decodes. Errors: -EFBIG over
 * TESSERA_MANIFEST_MAX; -EKEYREJECTED bad signature or a signer that is not
 * pk; -EBADMSG malformed (magic, format, truncation, trailing bytes, version
 * not in [1, INT64_MAX], the manifest's layout rules with raw parcels only);
 * -ENOMEM. On failure *out is empty and err says why in one line. */
int proto_addendum_decode(const uint8_t *buf, size_t len, const uint8_t pk[PROTO_PK_BYTES],
			  struct proto_addendum *out, struct proto_err *err);
/* Whether a extends m: same version, m's digest, m's chunk size, and a
 * layout m does not list; a copy: a layout m lists, m a delta, the same
 * plan digest and parcels (ranks and sizes, in order). 0, or -EINVAL with
 * err saying which. */
int proto_addendum_binds(const struct proto_addendum *a, const struct proto_manifest *m,
			 struct proto_err *err);
/* Appends a copy of a's layout to m (call proto_addendum_binds first), so
 * that code reading manifests finds it like any other layout; a raw copy
 * replaces the parcels of the layout m lists instead. m's
 * encoding-derived fields (digest, signature) stay those of the signed
 * manifest. -ENOMEM leaves m unchanged. */
int proto_addendum_extend(struct proto_manifest *m, const struct proto_addendum *a);
/* Summary JSON: version, manifest_digest, digest, layout_digest,
 * plan_digest, parcels, bytes, and copy (true) for a raw copy. New reference; NULL on ENOMEM. */
json_t *proto_addendum_to_json(const struct proto_addendum *a);

#endif
