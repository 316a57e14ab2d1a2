/* Activation records as readers see them (node/serve/expose.c): a live one is
 * read; a missing, malformed or oversized one is refused with one line; a
 * stale one (its node process gone, or its pid now another process's) is
 * refused as stale; a node removes only a record that names it, and
 * replaces it whole (no fsync: proto_write_file_replace). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "node/serve/expose.h"
#include "tests/testutil.h"

struct env {
	char dir[256], rec[512];
	int memfd;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	if (e == NULL || tu_mkdtemp(e->dir, sizeof(e->dir)) == NULL)
		return -1;
	snprintf(e->rec, sizeof(e->rec), "%s/A-0.json", e->dir);
	e->memfd = memfd_create("tessera-v7", MFD_CLOEXEC); /* as a node's slot */
	*state = e;
	return e->memfd < 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	close(e->memfd);
	tu_rmtree(e->dir);
	free(e);
	return 0;
}

/* A record naming process pid and its fd (as a node writes it). */
static void write_record(struct env *e, long pid, int fd)
{
	char txt[512];

	snprintf(txt, sizeof(txt),
		 "{\"store\":\"host\",\"memfd_path\":\"/proc/%ld/fd/%d\",\"size\":4096,"
		 "\"version\":7,\"replica\":\"A\",\"rank\":0,\"pid\":%ld}",
		 pid, fd, pid);
	assert_int_equal(tu_write(e->rec, txt), 0);
}

/* A pid that ran and is gone. */
static pid_t dead_pid(void)
{
	pid_t p = fork();
	assert_true(p >= 0);
	if (p == 0)
		_exit(0);
	assert_int_equal(waitpid(p, NULL, 0), p);
	return p;
}

static void test_live_record(void **state)
{
	struct env *e = *state;
	struct proto_err err;
	json_t *j;

	write_record(e, (long)getpid(), e->memfd);
	assert_int_equal(node_expose_read(e->rec, &j, &err), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 7);
	json_decref(j);
}

/* A node replaces its record without an fsync (proto_write_file_replace):
 * readers see the old record or the new one, and a write that cannot be
 * made leaves the old one and no temporary file. */
static void test_record_replaced(void **state)
{
	struct env *e = *state;
	struct proto_err err;
	char txt[512], bad[600];
	json_t *j;

	write_record(e, (long)getpid(), e->memfd);
	snprintf(txt, sizeof(txt),
		 "{\"store\":\"host\",\"memfd_path\":\"/proc/%ld/fd/%d\",\"size\":4096,"
		 "\"version\":8,\"replica\":\"A\",\"rank\":0,\"pid\":%ld}",
		 (long)getpid(), e->memfd, (long)getpid());
	assert_int_equal(proto_write_file_replace(e->rec, txt, strlen(txt), 0644, &err), 0);
	assert_int_equal(node_expose_read(e->rec, &j, &err), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 8);
	json_decref(j);
	snprintf(bad, sizeof(bad), "%s/no-such-dir/A-0.json", e->dir);
	assert_true(proto_write_file_replace(bad, txt, strlen(txt), 0644, &err) < 0);
	assert_int_equal(tu_sh("test $(ls -a %s | wc -l) -eq 3", e->dir), 0); /* . .. A-0.json */
	assert_int_equal(node_expose_read(e->rec, &j, &err), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 8);
	json_decref(j);
}

static void test_stale_records(void **state)
{
	struct env *e = *state;
	struct proto_err err;
	json_t *j;
	char want[128];

	/* Its process is gone. */
	pid_t gone = dead_pid();
	write_record(e, (long)gone, 3);
	assert_int_equal(node_expose_read(e->rec, &j, &err), -ESRCH);
	assert_null(j);
	snprintf(want, sizeof(want), "is stale: node process %ld is not running", (long)gone);
	assert_non_null(strstr(err.msg, want));
	assert_null(strchr(err.msg, '\n'));
	/* Its pid runs, but holds no tessera slot at that fd (a pid reused). */
	write_record(e, (long)getpid(), 0);
	assert_int_equal(node_expose_read(e->rec, &j, &err), -ESRCH);
	assert_non_null(strstr(err.msg, "is not a tessera slot"));
}

static void test_bad_records(void **state)
{
	static const char *bad[] = {
		"",
		"not json",
		"[1,2]",
		"{\"pid\":1}",
		"{\"version\":7,\"memfd_path\":\"/proc/1/fd/3\"}",
		"{\"pid\":-5,\"version\":7,\"memfd_path\":\"/proc/1/fd/3\"}",
		"{\"pid\":1,\"version\":0,\"memfd_path\":\"/proc/1/fd/3\"}",
		"{\"pid\":1,\"version\":7,\"memfd_path\":3}",
		"{\"pid\":1,\"version\":7,\"memfd_path\":\"/etc/passwd\"}",
		"{\"pid\":1,\"version\":7,\"memfd_path\":\"/proc/12/fd/3\"}",
	};
	struct env *e = *state;
	struct proto_err err;
	json_t *j;

	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		assert_int_equal(tu_write(e->rec, bad[i]), 0);
		assert_int_equal(node_expose_read(e->rec, &j, &err), -EINVAL);
		assert_null(j);
		assert_true(strlen(err.msg) > 0 && strchr(err.msg, '\n') == NULL);
	}
	/* Larger than any record: refused before it is read. */
	FILE *f = fopen(e->rec, "w");
	assert_non_null(f);
	for (int i = 0; i < (2 << 20) / 64; i++)
		fputs("                                                               \n", f);
	fclose(f);
	assert_int_equal(node_expose_read(e->rec, &j, &err), -EFBIG);
	assert_null(j);
	/* None at all. */
	unlink(e->rec);
	assert_int_equal(node_expose_read(e->rec, &j, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "no activation record"));
}

/* A stopping node removes its own record, not another process's (a node
 * of the same rank started since), and not one it cannot read. */
static void test_remove_only_own(void **state)
{
	struct env *e = *state;
	struct proto_err err;

	write_record(e, (long)getpid() + 1, 3);
	assert_int_equal(node_expose_remove(e->rec, getpid(), &err), 0);
	assert_int_equal(access(e->rec, F_OK), 0);
	assert_int_equal(tu_write(e->rec, "garbage"), 0);
	assert_int_not_equal(node_expose_remove(e->rec, getpid(), &err), 0);
	assert_int_equal(access(e->rec, F_OK), 0);
	write_record(e, (long)getpid(), e->memfd);
	assert_int_equal(node_expose_remove(e->rec, getpid(), &err), 0);
	assert_int_equal(access(e->rec, F_OK), -1);
	assert_int_equal(node_expose_remove(e->rec, getpid(), &err), 0); /* none: fine */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_live_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_record_replaced, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_records, setup, teardown),
		cmocka_unit_test_setup_teardown(test_remove_only_own, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
