/* The chunk hash (see chunkhash.h): BLAKE3. */
#include "proto/chunkhash.h"

_Static_assert(PROTO_HASH_BYTES == BLAKE3_OUT_LEN, "a chunk hash is BLAKE3's default output");

void proto_chunk_hash(uint8_t out[PROTO_HASH_BYTES], const uint8_t *buf, size_t len)
{
	blake3_hasher h;

	blake3_hasher_init(&h);
	blake3_hasher_update(&h, buf, len);
	blake3_hasher_finalize(&h, out, PROTO_HASH_BYTES);
}

void proto_chunk_hash_init(struct proto_chunk_hasher *h)
{
	blake3_hasher_init(&h->st);
}

void proto_chunk_hash_update(struct proto_chunk_hasher *h, const uint8_t *buf, size_t len)
{
	blake3_hasher_update(&h->st, buf, len);
}

void proto_chunk_hash_final(struct proto_chunk_hasher *h, uint8_t out[PROTO_HASH_BYTES])
{
	blake3_hasher_finalize(&h->st, out, PROTO_HASH_BYTES);
}
