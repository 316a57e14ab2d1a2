/* The fuzz targets of the node, the client library, the publisher's control
 * socket, the tracker client and proto's hostile-input parsers (tests/fuzz/)
 * replayed on every input they were seeded with and every finding they
 * saved (tests/data/seed-<target>-*, bad-<target>-*): each must come back
 * without a crash, a leak, an ASan or UBSan report (the harnesses abort on
 * a broken invariant). */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#define LLVMFuzzerTestOneInput fz_addendum
#include "tests/fuzz/fuzz_addendum.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_attach_client
#include "tests/fuzz/fuzz_attach_client.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_attach_server
#include "tests/fuzz/fuzz_attach_server.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_ckpt_index
#include "tests/fuzz/fuzz_ckpt_index.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_config_file
#include "tests/fuzz/fuzz_config_file.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_have
#include "tests/fuzz/fuzz_have.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_pub_control
#include "tests/fuzz/fuzz_pub_control.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_tracker_client
#include "tests/fuzz/fuzz_tracker_client.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fz_xmap
#include "tests/fuzz/fuzz_xmap.c"
#undef LLVMFuzzerTestOneInput

#include "proto/proto.h"
#include "tests/testutil.h"

/* Runs fn on every tests/data file named seed-<target>-* or bad-<target>-*;
 * returns how many. */
static size_t replay(const char *target, int (*fn)(const uint8_t *, size_t))
{
	char dir[4096], p[8192], seed[128], bad[128];
	struct dirent *e;
	size_t n = 0;
	DIR *d = opendir(tu_data(dir, sizeof(dir), ""));

	assert_non_null(d);
	snprintf(seed, sizeof(seed), "seed-%s-", target);
	snprintf(bad, sizeof(bad), "bad-%s-", target);
	while ((e = readdir(d)) != NULL) {
		struct proto_err err;
		uint8_t *buf;
		size_t len;
		if (strncmp(e->d_name, seed, strlen(seed)) != 0 &&
		    strncmp(e->d_name, bad, strlen(bad)) != 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		assert_int_equal(proto_read_file(p, 1 << 20, &buf, &len, &err), 0);
		fn(buf, len);
		free(buf);
		n++;
	}
	closedir(d);
	return n;
}

#define REPLAY(name, min)                                                                  \
	static void test_##name##_replayed(void **state)                                  \
	{                                                                                  \
		assert_true(replay(#name, fz_##name) >= (min));                            \
	}
REPLAY(addendum, 2)
REPLAY(attach_client, 4)
REPLAY(attach_server, 3)
REPLAY(ckpt_index, 1)
REPLAY(config_file, 2)
REPLAY(have, 2)
REPLAY(pub_control, 3)
REPLAY(tracker_client, 6)
REPLAY(xmap, 3)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_addendum_replayed),
		cmocka_unit_test(test_attach_client_replayed),
		cmocka_unit_test(test_attach_server_replayed),
		cmocka_unit_test(test_ckpt_index_replayed),
		cmocka_unit_test(test_config_file_replayed),
		cmocka_unit_test(test_have_replayed),
		cmocka_unit_test(test_pub_control_replayed),
		cmocka_unit_test(test_tracker_client_replayed),
		cmocka_unit_test(test_xmap_replayed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
