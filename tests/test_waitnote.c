/* A node's notices of what it waits for: nothing before the wait has lasted
 * TESSERA_WAIT_NOTICE_MS, then one line per period while it lasts, at the
 * default log level; a new wait starts over, an ended one says nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/base/waitnote.h"
#include "proto/proto.h"
#include "tests/testutil.h"

static char dir[256], path[300];

/* Lines logged since the last call (stderr goes to a file). */
static int lines_since(long *off, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[1024];
	int n = 0;

	assert_non_null(f);
	fseek(f, *off, SEEK_SET);
	while (fgets(line, sizeof(line), f) != NULL) {
		assert_non_null(strstr(line, needle));
		n++;
	}
	*off = ftell(f);
	fclose(f);
	return n;
}

static void test_rate_limited(void **state)
{
	struct node_wait w;

	memset(&w, 0, sizeof(w));
	long off = 0;

	/* 1000 ms: the environment set before the first proto_param(). */
	node_wait_note(&w, 100000, "A/0", "tracker", "the tracker at %s", "http://x");
	node_wait_note(&w, 100999, "A/0", "tracker", "the tracker at %s", "http://x");
	assert_int_equal(lines_since(&off, "warn"), 0);
	node_wait_note(&w, 101000, "A/0", "tracker", "the tracker at %s", "http://x");
	assert_int_equal(lines_since(&off, "A/0: waiting 1 s for the tracker at http://x"), 1);
	node_wait_note(&w, 101000, "A/0", "tracker", "the tracker at %s", "http://x");
	assert_int_equal(lines_since(&off, "warn"), 0);
	for (uint64_t t = 101010; t < 102000; t += 10)
		node_wait_note(&w, t, "A/0", "tracker", "the tracker at %s", "http://x");
	assert_int_equal(lines_since(&off, "warn"), 0);
	node_wait_note(&w, 102000, "A/0", "tracker", "the tracker at %s", "http://x");
	assert_int_equal(lines_since(&off, " warn test waitnote.c"), 1);

	/* Another wait starts over. */
	node_wait_note(&w, 102500, "A/0", "version", "a first version");
	node_wait_note(&w, 103400, "A/0", "version", "a first version");
	assert_int_equal(lines_since(&off, "warn"), 0);
	node_wait_note(&w, 103500, "A/0", "version", "a first version");
	/* No version yet is not a fault: said at note. */
	assert_int_equal(lines_since(&off, " note test waitnote.c"), 1);

	/* Ending another wait changes nothing; ending this one starts over. */
	node_wait_over(&w, "tracker");
	node_wait_note(&w, 104500, "A/0", "version", "a first version");
	assert_int_equal(lines_since(&off, "waiting 2 s for a first version"), 1);
	node_wait_over(&w, "version");
	node_wait_note(&w, 105000, "A/0", "version", "a first version");
	node_wait_note(&w, 105900, "A/0", "version", "a first version");
	assert_int_equal(lines_since(&off, "warn"), 0);
	node_wait_over(&w, NULL);
	assert_int_equal(w.key[0], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rate_limited),
	};
	int rc;

	setenv("TESSERA_WAIT_NOTICE_MS", "1000", 1);
	unsetenv("TESSERA_LOG"); /* the default level says it */
	proto_log_setup("test", -1);
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(path, sizeof(path), "%s/stderr", dir);
	fflush(stderr);
	int saved = dup(2);
	if (freopen(path, "w", stderr) == NULL)
		return 1;
	setvbuf(stderr, NULL, _IONBF, 0);
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	fflush(stderr);
	dup2(saved, 2);
	tu_rmtree(dir);
	return rc;
}
