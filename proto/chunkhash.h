/* The chunk hash: the one function every chunk of a parcel is hashed with. */
#ifndef PROTO_CHUNKHASH_H
#define PROTO_CHUNKHASH_H

/*
 * A manifest lists each chunk of a parcel's wire payload with this hash
 * (proto/manifest.h); the publisher computes it, a node checks every chunk
 * it receives against it. Both sides call these and nothing else, so the
 * function can change in one place (today BLAKE2b-256, unkeyed; the hash is
 * part of the wire format: changing it changes the manifest's format).
 * Whole-chunk and incremental forms give the same bytes. None can fail.
 */

#include <sodium.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/manifest.h"

/* A chunk being hashed piece by piece; on the stack, no fini. */
struct proto_chunk_hasher {
	crypto_generichash_state st;
};

/* out = the hash of buf[0, len). */
void proto_chunk_hash(uint8_t out[PROTO_HASH_BYTES], const uint8_t *buf, size_t len);

void proto_chunk_hash_init(struct proto_chunk_hasher *h);
void proto_chunk_hash_update(struct proto_chunk_hasher *h, const uint8_t *buf, size_t len);
/* out = the hash of every byte given since init; h is spent. */
void proto_chunk_hash_final(struct proto_chunk_hasher *h, uint8_t out[PROTO_HASH_BYTES]);

#endif
