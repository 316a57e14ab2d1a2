/* A rank's statement that it holds a version: signed by the rank with the
 * key it registered, passed along by the tracker, checked by the other ranks
 * of its replica before they switch. */
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "tracker/tracker.h"

/* "tessera-holds-v1\n" replica "\n" rank "\n" version "\n" digest (hex). */
static size_t statement_msg(const char *replica, uint32_t rank, uint64_t version,
			    const uint8_t digest[PROTO_HASH_BYTES], char *buf, size_t cap)
{
	char hex[2 * PROTO_HASH_BYTES + 1];
	int n;

	sodium_bin2hex(hex, sizeof(hex), digest, PROTO_HASH_BYTES);
	n = snprintf(buf, cap, "tessera-holds-v1\n%s\n%" PRIu32 "\n%" PRIu64 "\n%s", replica,
		     rank, version, hex);
	return n < 0 ? 0 : PROTO_MIN((size_t)n, cap - 1);
}

void trk_statement_sign(const uint8_t sk[TRK_STMT_SK_BYTES], const char *replica,
			uint32_t rank, uint64_t version,
			const uint8_t digest[PROTO_HASH_BYTES], uint8_t sig[TRK_STMT_SIG_BYTES])
{
	char msg[TRK_REPLICA_MAX + 160];
	size_t n = statement_msg(replica, rank, version, digest, msg, sizeof(msg));

	crypto_sign_detached(sig, NULL, (const uint8_t *)msg, n, sk);
}

bool trk_statement_verify(const uint8_t pk[TRK_STMT_PK_BYTES], const char *replica,
			  uint32_t rank, uint64_t version,
			  const uint8_t digest[PROTO_HASH_BYTES],
			  const uint8_t sig[TRK_STMT_SIG_BYTES])
{
	char msg[TRK_REPLICA_MAX + 160];
	size_t n = statement_msg(replica, rank, version, digest, msg, sizeof(msg));

	if (strlen(replica) > TRK_REPLICA_MAX)
		return false;
	return crypto_sign_verify_detached(sig, (const uint8_t *)msg, n, pk) == 0;
}

/* Exactly n bytes as 2n hex digits in a JSON string. */
static bool hex_field(json_t *o, const char *key, uint8_t *out, size_t n)
{
	const char *s = json_string_value(json_object_get(o, key));
	size_t got = 0;

	return s != NULL && strlen(s) == 2 * n &&
	       sodium_hex2bin(out, n, s, 2 * n, NULL, &got, NULL) == 0 && got == n;
}

int trk_statements_check(json_t *statements, const char *replica, uint32_t nranks,
			 uint32_t self, uint64_t version,
			 const uint8_t digest[PROTO_HASH_BYTES], struct proto_err *err)
{
	size_t i;
	json_t *e;

	if (!json_is_array(statements))
		return proto_errf(err, EINVAL, "the answer carries no statements");
	for (uint32_t r = 0; r < nranks; r++) {
		uint8_t pk[TRK_STMT_PK_BYTES], sig[TRK_STMT_SIG_BYTES];
		json_t *found = NULL;

		if (r == self)
			continue;
		json_array_foreach(statements, i, e)
		{
			json_t *jr = json_object_get(e, "rank");
			if (!json_is_integer(jr) || json_integer_value(jr) != (json_int_t)r)
				continue;
			if (found != NULL)
				return proto_errf(err, EINVAL, "rank %" PRIu32 ": two statements", r);
			found = e;
		}
		if (found == NULL)
			return proto_errf(err, ENOENT, "rank %" PRIu32 ": no statement", r);
		if (!hex_field(found, "key", pk, sizeof(pk)) ||
		    !hex_field(found, "sig", sig, sizeof(sig)))
			return proto_errf(err, EINVAL, "rank %" PRIu32 ": malformed statement", r);
		if (!trk_statement_verify(pk, replica, r, version, digest, sig))
			return proto_errf(err, EPERM,
					  "rank %" PRIu32 ": statement does not verify", r);
	}
	return 0;
}
