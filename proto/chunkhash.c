/* The chunk hash (see chunkhash.h). */
#include "proto/chunkhash.h"

void proto_chunk_hash(uint8_t out[PROTO_HASH_BYTES], const uint8_t *buf, size_t len)
{
	crypto_generichash(out, PROTO_HASH_BYTES, buf, len, NULL, 0);
}

void proto_chunk_hash_init(struct proto_chunk_hasher *h)
{
	crypto_generichash_init(&h->st, NULL, 0, PROTO_HASH_BYTES);
}

void proto_chunk_hash_update(struct proto_chunk_hasher *h, const uint8_t *buf, size_t len)
{
	crypto_generichash_update(&h->st, buf, len);
}

void proto_chunk_hash_final(struct proto_chunk_hasher *h, uint8_t out[PROTO_HASH_BYTES])
{
	crypto_generichash_final(&h->st, out, PROTO_HASH_BYTES);
}
