/*
 * The local metrics port (node/base/metrics_http.c) under a slow-header
 * flood: it holds 64 connections at most, the flood's own go first, a
 * dribbled head is closed within its 10 s life, and /healthz keeps
 * answering. Before the guard, every flood connection stayed open (the
 * issue's 20 000 ran a publisher out of descriptors; /healthz answered 5 of
 * 14).
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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

#include "node/base/metrics_http.h"
#include "proto/proto.h"
#include "tests/testutil.h"

#define FLOOD 300

struct env {
	struct event_base *base;
	pthread_t loop;
	struct proto_metrics *m;
	struct node_metrics_http *s;
	uint16_t port;
};

static void *loop_main(void *arg)
{
	struct env *e = arg;
	event_base_loop(e->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static int connect_port(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* GET /healthz on a fresh connection: the status code (503 here: nothing
 * set the health), or -1 without an answer. */
static int healthz(uint16_t port)
{
	static const char req[] = "GET /healthz HTTP/1.0\r\n\r\n";
	char buf[512];
	size_t n = 0;
	int fd = connect_port(port), code = -1;

	if (write(fd, req, sizeof(req) - 1) != (ssize_t)sizeof(req) - 1)
		goto out;
	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 30000) != 1)
			break;
		ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = 0;
	if (sscanf(buf, "HTTP/1.%*d %d", &code) != 1)
		code = -1;
out:
	close(fd);
	return code;
}

/* Whether the server closed fd (EOF or reset), without waiting. */
static bool closed_by_server(int fd)
{
	struct pollfd p = {fd, POLLIN | POLLRDHUP, 0};
	char c;

	if (poll(&p, 1, 0) != 1)
		return false;
	return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static void test_slow_header_flood(void **state)
{
	struct env e = {0};
	struct proto_err err;
	int flood[FLOOD + 1];
	size_t open_now = 0;

	assert_int_equal(evthread_use_pthreads(), 0);
	e.base = event_base_new();
	e.m = proto_metrics_new();
	assert_non_null(e.m);
	assert_int_equal(node_metrics_http_new(e.base, "127.0.0.1:0", e.m, &e.s, &err), 0);
	const char *url = node_metrics_http_url(e.s);
	e.port = (uint16_t)atoi(strrchr(url, ':') + 1);
	assert_int_equal(pthread_create(&e.loop, NULL, loop_main, &e), 0);

	/* Heads begun and never finished. */
	for (int i = 0; i < FLOOD; i++) {
		flood[i] = connect_port(e.port);
		assert_int_equal(write(flood[i], "GET /metrics HTTP/1.1\r\nX-A: ", 28), 28);
	}
	/* Scrapes are served meanwhile. */
	int ok = 0;
	for (int i = 0; i < 10; i++)
		ok += healthz(e.port) > 0;
	print_message("/healthz answered %d of 10 during a flood of %d slow heads\n", ok, FLOOD);
	assert_int_equal(ok, 10);
	/* The port holds at most 64 of them, however they dribble (a byte a
	 * second keeps evhttp's 10 s idle timeout from ever firing). */
	for (int tries = 0; tries < 16; tries++) {
		open_now = 0;
		for (int i = 0; i < FLOOD; i++)
			if (!closed_by_server(flood[i])) {
				open_now++;
				(void)!send(flood[i], "x", 1, MSG_NOSIGNAL);
			}
		if (open_now <= 64)
			break;
		usleep(500000);
	}
	print_message("flood connections still open: %zu of %d\n", open_now, FLOOD);
	assert_true(open_now <= 64);
	/* The rest dribble a byte now and then: their life ends anyway. */
	for (int tries = 0; tries < 60 && open_now > 0; tries++) {
		open_now = 0;
		for (int i = 0; i < FLOOD; i++)
			if (!closed_by_server(flood[i])) {
				open_now++;
				(void)!send(flood[i], "x", 1, MSG_NOSIGNAL);
			}
		sleep(1);
	}
	print_message("dribbling connections open after their life: %zu\n", open_now);
	assert_int_equal(open_now, 0);
	for (int i = 0; i < FLOOD; i++)
		close(flood[i]);
	event_base_loopbreak(e.base);
	pthread_join(e.loop, NULL);
	node_metrics_http_free(e.s);
	event_base_free(e.base);
	proto_metrics_free(e.m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_slow_header_flood),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
