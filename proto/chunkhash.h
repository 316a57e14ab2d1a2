/* The chunk hash: the one function every chunk of a parcel is hashed with. */
#ifndef PROTO_CHUNKHASH_H
#define PROTO_CHUNKHASH_H

/*
 * A manifest lists each chunk of a parcel's wire payload with this hash
 * (proto/manifest.h); the publisher computes it, a node checks every chunk
 * it receives against it. Both sides call these and nothing else, so the
 * function can change in one place. It is BLAKE3 (unkeyed, 32 bytes), from
 * the C implementation Debian ships (the Makefile compiles it); it is part
 * of the wire format: a manifest names it (PROTO_CHUNK_HASH_ID) and a node
 * refuses a manifest that names another. Whole-chunk and incremental forms
 * give the same bytes. None can fail.
 */

#include <blake3.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/manifest.h"

/* The chunk hash's number in a manifest, and its name in messages. */
#define PROTO_CHUNK_HASH_ID 1u
#define PROTO_CHUNK_HASH_NAME "BLAKE3-256"

/* A chunk being hashed piece by piece; on the stack (about 2 KiB), no fini. */
struct proto_chunk_hasher {
	blake3_hasher st;
};

/* out = the hash of buf[0, len). */
void proto_chunk_hash(uint8_t out[PROTO_HASH_BYTES], const uint8_t *buf, size_t len);

void proto_chunk_hash_init(struct proto_chunk_hasher *h);
void proto_chunk_hash_update(struct proto_chunk_hasher *h, const uint8_t *buf, size_t len);
/* out = the hash of every byte given since init; h is spent. */
void proto_chunk_hash_final(struct proto_chunk_hasher *h, uint8_t out[PROTO_HASH_BYTES]);

#endif
