/* Connections to a fabric endpoint's port (fabric/conns.c): a stranger's raw
 * TCP connections, which the provider accepts and would hold forever, are
 * shut down past TESSERA_FAB_PENDING_MAX, TESSERA_FAB_CONNS_PER_ADDR,
 * TESSERA_FAB_CONNS_MAX and the handshake deadline, the stranger's first,
 * while a member's reads go on. tcp;ofi_rxm on loopback. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "fabric/fab.h"
#include "tests/fabtest.h"
#include "proto/util.h"

#define NRAW 300
#define WAIT_MS 120000 /* reached only by a failing case */
#define REGION 4096

struct env {
	struct fab_ctx *srv, *cli;
	fi_addr_t to_srv;
	struct fab_mr *smr, *cmr;
	uint8_t sbuf[REGION], cbuf[REGION];
	int raw[NRAW];
	bool closed[NRAW];
	int fd0; /* this process's descriptors before the stranger came */
};

static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	int n = 0;

	assert_non_null(d);
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n - 3; /* ".", ".." and the directory's own */
}

static void pump(struct env *e)
{
	assert_true(fab_poll(e->srv, 0) >= 0);
	assert_true(fab_poll(e->cli, 0) >= 0);
	usleep(1000);
}

/* A member reads the server's region: it must still be served. */
static void member_reads(struct env *e, uint8_t seed)
{
	struct fab_rkey rk;
	struct tu_fab_req q = {0};
	uint64_t end = proto_now_ns() + WAIT_MS * 1000000ull;

	memset(e->sbuf, seed, sizeof(e->sbuf));
	fab_mr_rkey(e->smr, &rk);
	assert_int_equal(fab_read(e->cli, &q.op, e->cmr, 0, REGION, e->to_srv, &rk, 0, tu_fab_req_cb), 0);
	while (!q.done && proto_now_ns() < end)
		pump(e);
	assert_true(q.done);
	assert_int_equal(q.status, 0);
	assert_memory_equal(e->cbuf, e->sbuf, REGION);
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	uint8_t name[FAB_ADDR_MAX];
	size_t len;
	struct proto_err err;

	if (e == NULL || fab_open("tcp;ofi_rxm", "127.0.0.1", &(struct fab_opts){.sink = 16},
				  &e->srv, &err) != 0 ||
	    fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &e->cli, &err) != 0 ||
	    fab_getname(e->srv, name, sizeof(name), &len) != 0 ||
	    fab_av_insert(e->cli, name, len, &e->to_srv) != 0 ||
	    fab_mr_reg(e->srv, e->sbuf, REGION, FAB_MR_REMOTE_READ, &e->smr) != 0 ||
	    fab_mr_reg(e->cli, e->cbuf, REGION, FAB_MR_READ, &e->cmr) != 0)
		return 1;
	for (int i = 0; i < NRAW; i++)
		e->raw[i] = -1;
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	for (int i = 0; i < NRAW; i++)
		if (e->raw[i] >= 0)
			close(e->raw[i]);
	fab_close(e->cli);
	fab_close(e->srv);
	free(e);
	unsetenv("TESSERA_FAB_HANDSHAKE_MS");
	unsetenv("TESSERA_FAB_PENDING_MAX");
	unsetenv("TESSERA_FAB_CONNS_PER_ADDR");
	unsetenv("TESSERA_FAB_CONNS_MAX");
	return 0;
}

/* NRAW connections to the server's port that never say anything. */
static void stranger_connects(struct env *e)
{
	uint8_t name[FAB_ADDR_MAX];
	struct sockaddr_in sin;
	size_t len;

	assert_int_equal(fab_getname(e->srv, name, sizeof(name), &len), 0);
	assert_true(len >= sizeof(sin));
	memcpy(&sin, name, sizeof(sin));
	assert_int_equal(sin.sin_family, AF_INET);
	for (int i = 0; i < NRAW; i++) {
		e->raw[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		assert_true(e->raw[i] >= 0);
		int rc = connect(e->raw[i], (struct sockaddr *)&sin, sizeof(sin));
		assert_true(rc == 0 || errno == EINPROGRESS);
	}
}

/* The stranger's connections the server has closed. */
static int closed(struct env *e)
{
	int n = 0;

	for (int i = 0; i < NRAW; i++) {
		char b;
		if (!e->closed[i] && recv(e->raw[i], &b, 1, MSG_DONTWAIT) == 0)
			e->closed[i] = true;
		n += e->closed[i];
	}
	return n;
}

/* Pumps until the server has closed want of them (or WAIT_MS); returns
 * how many it closed, and the most descriptors the server held for them. */
static int pump_until_closed(struct env *e, int want, int *peak)
{
	uint64_t end = proto_now_ns() + WAIT_MS * 1000000ull;
	int n;

	while ((n = closed(e)) < want && proto_now_ns() < end) {
		/* Ours: fd0 and the stranger's NRAW; the rest are the server's. */
		int held = fd_count() - e->fd0 - NRAW;
		if (peak != NULL && held > *peak)
			*peak = held;
		pump(e);
	}
	return n;
}

/* Pumps until the server holds at most max descriptors for the stranger's
 * connections (it frees a closed one once it reads its end); returns how
 * many it holds. */
static int settle(struct env *e, int max)
{
	uint64_t end = proto_now_ns() + WAIT_MS * 1000000ull;
	int held;

	while ((held = fd_count() - e->fd0 - NRAW) > max && proto_now_ns() < end)
		pump(e);
	return held;
}

/* With var=val, the server closes all but keep of the stranger's
 * connections, and a member is still served. */
static void check_bound(struct env *e, const char *var, const char *val, int keep, uint8_t seed)
{
	int n;

	setenv(var, val, 1);
	n = pump_until_closed(e, NRAW - keep, NULL);
	fprintf(stderr, "# %s=%s: %d of %d closed\n", var, val, n, NRAW);
	assert_true(n >= NRAW - keep);
	member_reads(e, seed);
}

static void test_stranger_connections_are_bounded(void **state)
{
	struct env *e = *state;
	struct fab_stats st;
	int n, peak = 0, settled;

	setenv("TESSERA_FAB_HANDSHAKE_MS", "600000", 1);
	setenv("TESSERA_FAB_PENDING_MAX", "32", 1);
	member_reads(e, 1);
	e->fd0 = fd_count();
	stranger_connects(e);

	/* At most 32 in the handshake: the rest are closed. */
	n = pump_until_closed(e, NRAW - 32, &peak);
	fab_stats(e->srv, &st);
	fprintf(stderr, "# %d silent connections, TESSERA_FAB_PENDING_MAX=32: %d closed, %llu left "
		"in the handshake, the server held at most %d descriptors for them\n",
		NRAW, n, (unsigned long long)st.conns_pending, peak);
	assert_true(n >= NRAW - 32);
	assert_true(st.conns_pending <= 32);
	settled = settle(e, 32 + 2);
	fprintf(stderr, "# then it holds %d descriptors for them\n", settled);
	assert_true(settled <= 32 + 2);
	member_reads(e, 2);

	/* At most 16 from one address: the stranger's go first, the
	 * member's answered connection (same address) stays. At most 8 in
	 * all. */
	setenv("TESSERA_FAB_PENDING_MAX", "1000", 1);
	check_bound(e, "TESSERA_FAB_CONNS_PER_ADDR", "16", 16, 3);
	setenv("TESSERA_FAB_CONNS_PER_ADDR", "256", 1);
	check_bound(e, "TESSERA_FAB_CONNS_MAX", "8", 8, 4);

	/* None past the handshake deadline. */
	setenv("TESSERA_FAB_CONNS_MAX", "4096", 1);
	setenv("TESSERA_FAB_HANDSHAKE_MS", "500", 1);
	n = pump_until_closed(e, NRAW, NULL);
	settled = settle(e, 0);
	fab_stats(e->srv, &st);
	fprintf(stderr, "# TESSERA_FAB_HANDSHAKE_MS=500: %d of %d closed, %llu shut down in all, "
		"the server holds %d descriptors for them\n",
		n, NRAW, (unsigned long long)st.conns_shed, settled);
	assert_int_equal(n, NRAW);
	assert_true(st.conns_shed >= NRAW);
	assert_true(settled <= 2);
	member_reads(e, 5);
	assert_int_equal(st.conns_pending, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stranger_connections_are_bounded, setup,
						teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
