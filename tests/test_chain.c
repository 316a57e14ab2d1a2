/* The client's chain guard (tracker/client/chain.c): only the canonical header is
 * accepted; a tracker process may answer out of order, another one may not
 * go back or change the cluster id; a malformed header (a sign, a leading
 * zero, an overflowing version) changes nothing remembered. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "tracker/client/chain.h"

#define CL "0123456789abcdef0123456789abcdef"
#define I1 "00112233aabbccdd"
#define I2 "ffeeddcc00112233"
#define D1 "abababababababababababababababababababababababababababababababab"
#define D2 "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"

static void test_parse(void **state)
{
	static const char *bad[] = {
		"", CL, CL " " I1 " 1", CL " " I1 " -1 " D1, CL " " I1 " +1 " D1,
		CL " " I1 " 01 " D1, CL " " I1 " 18446744073709551616 " D1,
		CL " " I1 " 99999999999999999999 " D1, CL "  " I1 " 1 " D1,
		" " CL " " I1 " 1 " D1, CL " " I1 " 1 " D1 " ", CL " " I1 " 1 " D1 " x",
		CL " " I1 " 1 -", CL " " I1 " 1 " D1 "ab", "0123456789ABCDEF0123456789ABCDEF " I1 " 1 " D1,
		CL "0 " I1 " 1 " D1, CL " " I1 "0 1 " D1, CL " " I1 " 1\t" D1, CL " " I1 " 1a " D1,
	};
	struct trk__chain c;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (trk__chain_parse(bad[i], &c) != -EPROTO)
			fail_msg("accepted: '%s'", bad[i]);
	assert_int_equal(trk__chain_parse(CL " " I1 " 0 -", &c), 0);
	assert_int_equal(c.latest, 0);
	assert_string_equal(c.digest, "-");
	assert_int_equal(trk__chain_parse(CL " " I1 " 18446744073709551615 " D1, &c), 0);
	assert_true(c.latest == UINT64_MAX);
	assert_string_equal(c.cluster, CL);
	assert_string_equal(c.instance, I1);
	assert_string_equal(c.digest, D1);
}

static void test_check(void **state)
{
	struct trk__chain_seen seen = {0};
	char msg[1024];

	assert_int_equal(trk__chain_check(&seen, NULL, "t", msg, sizeof(msg)), 0);
	assert_false(seen.have);
	assert_int_equal(trk__chain_check(&seen, CL " " I1 " 3 " D1, "t", msg, sizeof(msg)), 0);
	/* One process's answers may come out of order. */
	assert_int_equal(trk__chain_check(&seen, CL " " I1 " 2 " D2, "t", msg, sizeof(msg)), 0);
	assert_int_equal(seen.c.latest, 3);
	/* A malformed header, "-1" above all, is refused and remembers nothing. */
	assert_int_equal(trk__chain_check(&seen, CL " " I2 " -1 " D1, "t", msg, sizeof(msg)), -EPROTO);
	assert_non_null(strstr(msg, "malformed"));
	assert_int_equal(seen.c.latest, 3);
	/* Another process: back, or the same version with another digest. */
	assert_int_equal(trk__chain_check(&seen, CL " " I2 " 2 " D1, "t", msg, sizeof(msg)), -ESTALE);
	assert_non_null(strstr(msg, "forgot the chain"));
	assert_int_equal(trk__chain_check(&seen, CL " " I2 " 3 " D2, "t", msg, sizeof(msg)), -ESTALE);
	assert_int_equal(trk__chain_check(&seen, CL " " I2 " 3 " D1, "t", msg, sizeof(msg)), 0);
	assert_int_equal(trk__chain_check(&seen, CL " " I2 " 4 " D2, "t", msg, sizeof(msg)), 0);
	assert_int_equal(seen.c.latest, 4);
	/* Another chain. */
	assert_int_equal(trk__chain_check(&seen, "ffffffffffffffffffffffffffffffff " I2 " 9 " D1, "t",
					  msg, sizeof(msg)),
			 -ESTALE);
	assert_non_null(strstr(msg, "cluster id"));
	assert_string_equal(seen.c.cluster, CL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_check),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
