/* libFuzzer target: the addendum decoder, on raw input and on input signed
 * by the harness (so mutations reach the field checks behind the
 * signature); what decodes must re-sign to the same bytes, bind or not to a
 * fixed manifest without harm, and extend a copy of it when it binds. */
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz_common.h"
#include "proto/addendum.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Checks one decoded addendum against the fixed manifest m. */
static void fza_check(const struct proto_addendum *a, const struct proto_manifest *m)
{
	struct proto_manifest copy;
	struct proto_err err;
	json_t *j = proto_addendum_to_json(a);

	if (j == NULL)
		abort();
	json_decref(j);
	if (proto_addendum_binds(a, m, &err) != 0)
		return;
	copy = *m; /* the fixed manifest lists no layouts: nothing is shared */
	if (proto_addendum_extend(&copy, a) == 0)
		proto_manifest_fini(&copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	static struct proto_manifest m;
	static int ready;
	struct proto_addendum a;
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	if (!ready) {
		uint8_t seed[crypto_sign_SEEDBYTES] = {9};
		if (sodium_init() < 0)
			abort();
		crypto_sign_seed_keypair(pk, sk, seed);
		proto_manifest_init(&m);
		m.version = 2;
		m.chunk_size = 64;
		ready = 1;
	}
	if (proto_addendum_decode(data, size, pk, &a, &err) == 0) {
		fza_check(&a, &m);
		proto_addendum_fini(&a);
	}
	if (size > (1u << 20))
		return 0;
	/* A seed is a whole one: keep its body, sign it with our key. */
	fz_resign(data, size, pk, sk, &buf, &len);
	if (buf == NULL)
		return 0;
	if (proto_addendum_decode(buf, len, pk, &a, &err) == 0) {
		uint8_t *again;
		size_t again_len;
		if (proto_addendum_sign(&a, sk, &again, &again_len, &err) != 0 ||
		    again_len != len || memcmp(again, buf, len) != 0)
			abort();
		free(again);
		fza_check(&a, &m);
		proto_addendum_fini(&a);
	}
	free(buf);
	return 0;
}
