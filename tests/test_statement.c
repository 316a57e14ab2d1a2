/* Ranks' statements (tracker/wire/statement.c): a statement verifies only for the
 * rank, replica, version and manifest digest it was signed for, under the
 * key that signed it; the check of a tracker's statements refuses a missing,
 * doubled, malformed or forged one for any other rank. */
#include <setjmp.h>
#include <sodium.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <string.h>

#include "tracker/tracker.h"

#define NR 3

struct keys {
	uint8_t pk[NR][TRK_STMT_PK_BYTES], sk[NR][TRK_STMT_SK_BYTES];
	uint8_t digest[PROTO_HASH_BYTES];
};

static json_t *hexj(const uint8_t *b, size_t n)
{
	char s[2 * TRK_STMT_SIG_BYTES + 1];
	sodium_bin2hex(s, sizeof(s), b, n);
	return json_string(s);
}

static json_t *entry(int rank, const uint8_t *pk, const uint8_t *sig)
{
	return json_pack("{s:i,s:o,s:o}", "rank", rank, "key", hexj(pk, TRK_STMT_PK_BYTES), "sig",
			 hexj(sig, TRK_STMT_SIG_BYTES));
}

/* Every rank's true statement for A at v7, as a tracker hands them out. */
static json_t *all(struct keys *k)
{
	json_t *arr = json_array();
	uint8_t sig[TRK_STMT_SIG_BYTES];

	for (int r = 0; r < NR; r++) {
		trk_statement_sign(k->sk[r], "A", (uint32_t)r, 7, k->digest, sig);
		json_array_append_new(arr, entry(r, k->pk[r], sig));
	}
	return arr;
}

static void make_keys(struct keys *k)
{
	for (int r = 0; r < NR; r++)
		crypto_sign_keypair(k->pk[r], k->sk[r]);
	randombytes_buf(k->digest, sizeof(k->digest));
}

static int check(json_t *arr, struct keys *k, uint32_t self, struct proto_err *err)
{
	int rc = trk_statements_check(arr, "A", NR, self, 7, k->digest, err);
	json_decref(arr);
	return rc;
}

static void test_sign_verify(void **state)
{
	struct keys k;
	uint8_t sig[TRK_STMT_SIG_BYTES], other[PROTO_HASH_BYTES];
	char long_name[TRK_REPLICA_MAX + 8];

	make_keys(&k);
	memcpy(other, k.digest, sizeof(other));
	other[5] ^= 1;
	trk_statement_sign(k.sk[1], "A", 1, 7, k.digest, sig);
	assert_true(trk_statement_verify(k.pk[1], "A", 1, 7, k.digest, sig));
	assert_false(trk_statement_verify(k.pk[0], "A", 1, 7, k.digest, sig)); /* other key */
	assert_false(trk_statement_verify(k.pk[1], "A", 0, 7, k.digest, sig)); /* other rank */
	assert_false(trk_statement_verify(k.pk[1], "B", 1, 7, k.digest, sig)); /* other replica */
	assert_false(trk_statement_verify(k.pk[1], "A", 1, 8, k.digest, sig)); /* other version */
	assert_false(trk_statement_verify(k.pk[1], "A", 1, 7, other, sig));    /* other manifest */
	sig[9] ^= 0x10;
	assert_false(trk_statement_verify(k.pk[1], "A", 1, 7, k.digest, sig));
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = 0;
	trk_statement_sign(k.sk[1], long_name, 1, 7, k.digest, sig);
	assert_false(trk_statement_verify(k.pk[1], long_name, 1, 7, k.digest, sig));
}

static void test_check_all_good(void **state)
{
	struct keys k;
	struct proto_err err;

	make_keys(&k);
	for (uint32_t self = 0; self < NR; self++)
		assert_int_equal(check(all(&k), &k, self, &err), 0);
	/* Our own statement is not needed; entries for other ranks are ignored. */
	json_t *arr = all(&k);
	json_array_remove(arr, 0);
	uint8_t sig[TRK_STMT_SIG_BYTES];
	trk_statement_sign(k.sk[0], "A", 9, 7, k.digest, sig);
	json_array_append_new(arr, entry(9, k.pk[0], sig));
	assert_int_equal(check(arr, &k, 0, &err), 0);
	/* A replica of one rank needs no one else's word. */
	arr = json_array();
	assert_int_equal(trk_statements_check(arr, "A", 1, 0, 7, k.digest, &err), 0);
	json_decref(arr);
}

static void test_check_refuses(void **state)
{
	struct keys k;
	struct proto_err err;
	uint8_t sig[TRK_STMT_SIG_BYTES], other[PROTO_HASH_BYTES];
	json_t *arr;

	make_keys(&k);
	/* No statements at all, or not an array. */
	assert_int_equal(check(NULL, &k, 0, &err), -EINVAL);
	assert_int_equal(check(json_object(), &k, 0, &err), -EINVAL);
	/* Rank 2's missing. */
	arr = all(&k);
	json_array_remove(arr, 2);
	assert_int_equal(check(arr, &k, 0, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "rank 2: no statement"));
	/* Rank 1's forged: signed by rank 0's key (listed as rank 0's key, or as
	 * its own), or rank 0's statement relabelled. */
	arr = all(&k);
	trk_statement_sign(k.sk[0], "A", 1, 7, k.digest, sig);
	json_array_set_new(arr, 1, entry(1, k.pk[1], sig));
	assert_int_equal(check(arr, &k, 0, &err), -EPERM);
	assert_non_null(strstr(err.msg, "rank 1: statement does not verify"));
	arr = all(&k);
	trk_statement_sign(k.sk[0], "A", 0, 7, k.digest, sig);
	json_array_set_new(arr, 1, entry(1, k.pk[0], sig));
	assert_int_equal(check(arr, &k, 2, &err), -EPERM);
	/* For another version or manifest. */
	arr = all(&k);
	trk_statement_sign(k.sk[1], "A", 1, 6, k.digest, sig);
	json_array_set_new(arr, 1, entry(1, k.pk[1], sig));
	assert_int_equal(check(arr, &k, 0, &err), -EPERM);
	memcpy(other, k.digest, sizeof(other));
	other[0] ^= 0x80;
	arr = all(&k);
	trk_statement_sign(k.sk[1], "A", 1, 7, other, sig);
	json_array_set_new(arr, 1, entry(1, k.pk[1], sig));
	assert_int_equal(check(arr, &k, 0, &err), -EPERM);
	/* Twice for one rank (even if one of them is good). */
	arr = all(&k);
	trk_statement_sign(k.sk[1], "A", 1, 7, k.digest, sig);
	json_array_append_new(arr, entry(1, k.pk[1], sig));
	assert_int_equal(check(arr, &k, 0, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "two statements"));
	/* Malformed: short, long, non-hex, wrong types, missing fields. */
	const char *bad[] = {
		"{\"rank\":1,\"key\":\"00\",\"sig\":\"00\"}",
		"{\"rank\":1,\"sig\":\"00\"}",
		"{\"rank\":1,\"key\":7,\"sig\":null}",
		"{\"rank\":1,\"key\":\"zz00000000000000000000000000000000000000000000000000000000000000\","
		"\"sig\":\"00\"}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		arr = all(&k);
		json_array_set_new(arr, 1, json_loads(bad[i], 0, NULL));
		assert_int_equal(check(arr, &k, 0, &err), -EINVAL);
	}
	arr = all(&k);
	json_object_set_new(json_array_get(arr, 1), "rank", json_string("1"));
	assert_int_equal(check(arr, &k, 0, &err), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sign_verify),
		cmocka_unit_test(test_check_all_good),
		cmocka_unit_test(test_check_refuses),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
