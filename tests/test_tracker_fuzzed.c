/* The tracker's fuzz targets replayed on every input they were seeded with
 * and every finding they saved (tests/data/seed-<target>-*, bad-<target>-*),
 * plus the tracker's bad-body corpus sent through the request harness: each
 * must come back without a crash, a leak or a 5xx answer (the harnesses
 * abort on those). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define LLVMFuzzerTestOneInput fz_tracker_requests
#include "tests/fuzz/fuzz_tracker_requests.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_tracker_chain
#include "tests/fuzz/fuzz_tracker_chain.c"
#undef LLVMFuzzerTestOneInput

#include "tests/testutil.h"

/* Runs fn on every tests/data file whose name starts with one of the
 * prefixes, with route (when not 0) put before the file's bytes; returns
 * how many. */
static size_t replay(const char *const *prefixes, size_t np, uint8_t route,
		     int (*fn)(const uint8_t *, size_t))
{
	char dir[4096], p[8192];
	struct dirent *e;
	size_t n = 0;
	DIR *d = opendir(tu_data(dir, sizeof(dir), ""));

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		for (size_t i = 0; i < np; i++) {
			struct proto_err err;
			uint8_t *buf;
			size_t len;
			if (strncmp(e->d_name, prefixes[i], strlen(prefixes[i])) != 0)
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			assert_int_equal(proto_read_file(p, 1 << 20, &buf, &len, &err), 0);
			if (route != 0) {
				uint8_t *r = malloc(len + 2);
				assert_non_null(r);
				r[0] = route;
				r[1] = '\n';
				memcpy(r + 2, buf, len);
				fn(r, len + 2);
				free(r);
			} else {
				fn(buf, len);
			}
			free(buf);
			n++;
		}
	}
	closedir(d);
	return n;
}

static void test_requests_replayed(void **state)
{
	static const char *const mine[] = {"seed-tracker_requests-", "bad-tracker_requests-"};
	static const struct {
		const char *prefix;
		uint8_t route; /* as the harness picks it: byte % its routes */
	} bodies[] = {
		{"tracker-bad-publishers-", 0x10 + 9}, {"tracker-bad-nodes-", 0x10 + 10},
		{"tracker-bad-heartbeat-", 0x10 + 11}, {"tracker-bad-state-", 0x10 + 12},
		{"tracker-bad-offers-", 0x10 + 13},
	};

	assert_true(replay(mine, 2, 0, fz_tracker_requests) >= 3);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bodies); i++)
		assert_true(replay(&bodies[i].prefix, 1, bodies[i].route, fz_tracker_requests) >= 3);
}

static void test_chain_replayed(void **state)
{
	static const char *const mine[] = {"seed-tracker_chain-", "bad-tracker_chain-"};

	assert_true(replay(mine, 2, 0, fz_tracker_chain) >= 3);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_requests_replayed),
		cmocka_unit_test(test_chain_replayed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
