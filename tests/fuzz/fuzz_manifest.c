/* libFuzzer target: the manifest decoder, on raw input and on input signed
 * by the harness (so mutations reach the field checks behind the signature). */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"
#include "proto/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	static int ready;
	struct proto_manifest m;
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	if (!ready) {
		uint8_t seed[crypto_sign_SEEDBYTES] = {7};
		if (sodium_init() < 0)
			abort();
		crypto_sign_seed_keypair(pk, sk, seed);
		ready = 1;
	}
	if (proto_manifest_decode(data, size, pk, &m, &err) == 0)
		proto_manifest_fini(&m);
	if (size > (1u << 20))
		return 0;
	/* A seed is a whole one: keep its body, sign it with our key. */
	fz_resign(data, size, pk, sk, &buf, &len);
	if (buf == NULL)
		return 0;
	if (proto_manifest_decode(buf, len, pk, &m, &err) == 0) {
		/* What decodes must re-sign to the same bytes. */
		uint8_t *again;
		size_t again_len;
		if (proto_manifest_sign(&m, sk, &again, &again_len, &err) != 0 ||
		    again_len != len || memcmp(again, buf, len) != 0)
			abort();
		free(again);
		proto_manifest_fini(&m);
	}
	free(buf);
	return 0;
}
