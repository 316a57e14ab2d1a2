/* TEST_FILTER=pattern runs only the matching cases (a cmocka glob) of any test binary. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

/*
 * Linked into every tests/test_*.c binary (Makefile): set before main, so
 * no test repeats it; a test that calls cmocka_set_test_filter itself
 * overrides it.
 */
__attribute__((constructor)) static void test_filter_from_env(void)
{
	const char *f = getenv("TEST_FILTER");

	if (f != NULL && f[0] != 0)
		cmocka_set_test_filter(f);
}
