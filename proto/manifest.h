/*
 * The version manifest: everything needed to check every byte of a version,
 * signed by the trainer key.
 *
 * A version is immutable and numbered (1, 2, ...); it names its parent by
 * number and by the parent manifest's digest. For each serving layout it
 * lists the parcels (source rank -> destination rank) with their chunk lists;
 * a chunk is `chunk_size` bytes of the parcel's wire payload (the last one
 * shorter) with its hash (proto/chunkhash.h). For anchors the wire payload
 * is the parcel payload itself (encoding RAW); deltas carry an encoded payload:
 * the TSDELTA1 encoding of the parcel against the same parcel of the parent
 * version (proto/delta.h, "Parcels"), which names the parent parcel's
 * digest and carries each piece's (segment's) child checksum. Those are
 * signed through the chunk hashes, like every byte of a parcel.
 *
 * Encoding: little-endian binary, "TSRM" magic and a format number first, the
 * Ed25519 signature (over every byte before it) last. The digest of a
 * manifest is BLAKE2b-256 over its whole encoding, signature included.
 * The decoder treats its input as hostile: the signature is checked before
 * any field is trusted, every count is capped against the bytes that remain
 * before anything is allocated, and every size is range-checked.
 */
#ifndef PROTO_MANIFEST_H
#define PROTO_MANIFEST_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

#define PROTO_HASH_BYTES 32 /* BLAKE2b-256 */
#define PROTO_PK_BYTES 32   /* Ed25519 public key */
#define PROTO_SK_BYTES 64   /* Ed25519 secret key (libsodium form) */
#define PROTO_SIG_BYTES 64
#define PROTO_CLUSTER_KEY_BYTES 32 /* crypto_auth key */

/* Sane ranges the encoder and the decoder both enforce. */
#define PROTO_CHUNK_SIZE_MIN 64u            /* bytes */
#define PROTO_CHUNK_SIZE_MAX (1u << 30)     /* bytes */
#define PROTO_PARCEL_BYTES_MAX (1ull << 40) /* bytes and wire_bytes of a parcel */

enum proto_kind { PROTO_KIND_ANCHOR = 1, PROTO_KIND_DELTA = 2 };
enum proto_encoding { PROTO_ENC_RAW = 0, PROTO_ENC_DELTA = 1 };

struct proto_chunk {
	uint32_t size;
	uint8_t hash[PROTO_HASH_BYTES];
};

struct proto_mparcel {
	uint32_t src_rank, dst_rank;
	uint64_t bytes;      /* decoded parcel payload (sum of its runs) */
	uint8_t encoding;    /* enum proto_encoding */
	uint64_t wire_bytes; /* bytes that are chunked and sent */
	uint32_t nchunks;
	struct proto_chunk *chunks;
};

struct proto_mlayout {
	uint8_t layout_digest[PROTO_HASH_BYTES]; /* serving layout */
	uint8_t plan_digest[PROTO_HASH_BYTES];   /* proto_plan.digest */
	uint32_t nparcels;
	struct proto_mparcel *parcels; /* sorted by (src_rank, dst_rank) */
};

struct proto_manifest {
	uint64_t version;        /* >= 1 */
	uint64_t parent_version; /* 0: no parent */
	uint8_t parent_digest[PROTO_HASH_BYTES];
	uint8_t kind; /* enum proto_kind */
	uint8_t model_digest[PROTO_HASH_BYTES];
	uint8_t src_layout_digest[PROTO_HASH_BYTES]; /* trainer layout */
	uint64_t created_ms;                         /* wall clock at export */
	uint32_t chunk_size;
	uint32_t nlayouts;
	struct proto_mlayout *layouts;
	uint8_t signer[PROTO_PK_BYTES];
	uint8_t signature[PROTO_SIG_BYTES];
	uint8_t digest[PROTO_HASH_BYTES]; /* of the signed encoding */
};

/* Building: init, add layouts, set each parcel's chunks, then sign. Arrays
 * are owned by the manifest and freed by proto_manifest_fini(). init zeroes m
 * and sets chunk_size to proto_param(PROTO_PARAM_CHUNK_SIZE); fini frees and
 * zeroes m (calling it twice is harmless). Neither can fail. */
void proto_manifest_init(struct proto_manifest *m);
void proto_manifest_fini(struct proto_manifest *m);
/* Appends a layout with nparcels zeroed parcels; NULL on ENOMEM (m is then
 * unchanged). The pointer is valid until the next add_layout (realloc). */
struct proto_mlayout *proto_manifest_add_layout(struct proto_manifest *m,
						const uint8_t *layout_digest,
						const uint8_t *plan_digest,
						uint32_t nparcels);
/* Sizes parcel->chunks for wire_bytes at m->chunk_size (hashes zeroed),
 * fills size fields and sets pc->wire_bytes, freeing any previous chunk list.
 * wire_bytes 0 gives no chunks. -ENOMEM, -EINVAL (chunk_size outside
 * [PROTO_CHUNK_SIZE_MIN, PROTO_CHUNK_SIZE_MAX]) or -EOVERFLOW (more than
 * UINT32_MAX chunks) leave the parcel unchanged. */
int proto_mparcel_alloc_chunks(const struct proto_manifest *m,
			       struct proto_mparcel *pc, uint64_t wire_bytes);
/* Looks a layout up by digest (linear) or a parcel by ranks (binary search:
 * needs the sorted order that signing and decoding guarantee); NULL when
 * absent. */
const struct proto_mlayout *proto_manifest_layout(const struct proto_manifest *m,
						  const uint8_t *layout_digest);
const struct proto_mparcel *proto_mlayout_parcel(const struct proto_mlayout *l,
						 uint32_t src_rank,
						 uint32_t dst_rank);

/* Checks m against the same rules as the decoder (never signs what a node
 * would refuse), encodes and signs with sk; fills m->signer, m->signature
 * and m->digest. The buffer is malloc'ed; the caller frees it. On failure
 * (-EBADMSG/-EINVAL: m breaks a rule, -EFBIG: larger than
 * TESSERA_MANIFEST_MAX, -ENOMEM) *out is NULL, *outlen 0 and m unchanged. */
int proto_manifest_sign(struct proto_manifest *m,
			const uint8_t sk[PROTO_SK_BYTES], uint8_t **out,
			size_t *outlen, struct proto_err *err);
/* Verifies the signature with pk, then decodes. On failure *out is empty
 * (zeroed, nothing to free) and err says what was wrong in one line, naming
 * the layout/parcel/chunk by 0-based index. Errors: -EFBIG over
 * TESSERA_MANIFEST_MAX; -EKEYREJECTED bad signature or a signer field that
 * is not pk; -EBADMSG malformed (framing, counts, or the rules: version in
 * [1, INT64_MAX], parent_version < version, parent digest all-zero iff
 * parent_version is 0, a delta has a parent, known kind and encodings, an
 * anchor's parcels raw, raw parcels' wire_bytes == bytes, chunk_size in
 * range, nchunks == ceil(wire_bytes / chunk_size), every chunk chunk_size but
 * the last (1..chunk_size), parcels strictly sorted by (src, dst), layout
 * digests unique, no trailing bytes); -ENOMEM. Empty parcels (wire_bytes 0,
 * no chunks) and layouts without parcels are allowed. On success the caller
 * owns *out and calls proto_manifest_fini(). */
int proto_manifest_decode(const uint8_t *buf, size_t len,
			  const uint8_t pk[PROTO_PK_BYTES],
			  struct proto_manifest *out, struct proto_err *err);
/* The signer key a manifest claims (not verified): lets a tracker pin the
 * first key it sees. -EINVAL if buf is too short to be a manifest or lacks
 * the magic; pk is then unchanged. */
int proto_manifest_peek_signer(const uint8_t *buf, size_t len,
			       uint8_t pk[PROTO_PK_BYTES]);

/* Summary JSON for status pages: version, parent, kind, digests (hex;
 * parent_digest null without a parent), layouts with parcel sizes; chunk
 * hashes only if with_chunks. New reference; NULL on ENOMEM. */
json_t *proto_manifest_to_json(const struct proto_manifest *m,
			       bool with_chunks);
/* Sum of wire bytes over all parcels of all layouts. */
uint64_t proto_manifest_wire_bytes(const struct proto_manifest *m);

/*
 * Keys. Key files are one text line: "tessera-ed25519-secret <hex>",
 * "tessera-ed25519-public <hex>" or "tessera-cluster-key <hex>". Secret and
 * cluster key files are written mode 0600 (public 0644, less the umask),
 * atomically, replacing what was there. If proto_keygen cannot write the
 * public file it removes the secret one. Loaders accept exactly one line
 * (the newline optional) and name the file in every error; on failure the
 * key buffer is zeroed. A secret key's public half must match its seed. A
 * secret or cluster key file readable by others is loaded with a warning.
 */
int proto_keygen(const char *secret_path, const char *public_path,
		 struct proto_err *err);
int proto_cluster_keygen(const char *path, struct proto_err *err);
int proto_key_load_secret(const char *path, uint8_t sk[PROTO_SK_BYTES],
			  struct proto_err *err);
int proto_key_load_public(const char *path, uint8_t pk[PROTO_PK_BYTES],
			  struct proto_err *err);
/* The public key file's form from a buffer (a store's value), name naming
 * it in errors. */
int proto_key_parse_public(const uint8_t *buf, size_t len, const char *name,
			   uint8_t pk[PROTO_PK_BYTES], struct proto_err *err);
int proto_key_load_cluster(const char *path,
			   uint8_t key[PROTO_CLUSTER_KEY_BYTES],
			   struct proto_err *err);

#endif
