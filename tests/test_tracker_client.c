/* The tracker client against a hostile tracker (or anyone on the path
 * without TLS): a fake tracker here, a socket server on a thread, answers
 * with a huge body (declared or chunked), an endless head, too many header
 * lines, or a body dribbled a byte at a time. The client refuses each with
 * one line that says what, holding no more than the request's cap, by the
 * request's deadline. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "proto/util.h"
#include "tests/testutil.h"
#include "tracker/tracker.h"

enum answer { BIG_DECLARED, BIG_CHUNKED, ENDLESS_HEAD, MANY_HEADERS, DRIBBLE, HONEST };

struct fake {
	enum answer kind;
	int lfd;
	char url[64];
	pthread_t th;
	/* What the fake tracker got out before the client went away. */
	size_t sent;
};

/* Everything of buf, or -1 once the client closed. */
static int put(struct fake *f, int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n <= 0)
			return -1;
		f->sent += (size_t)n;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

#define HUGE_BODY (60u << 20) /* the 60 MiB JSON array of the attack */
#define SEND_MAX (32u << 20)  /* the fake tracker stops there at the latest */
#define DRIBBLED 194u         /* bytes of a body dribbled after its first 6 */

static void answer(struct fake *f, int fd)
{
	static char pad[65536];
	char line[256];
	size_t i;

	switch (f->kind) {
	case BIG_DECLARED:
	case BIG_CHUNKED: {
		/* "[" then "0," over and over, then spaces and "0]". */
		bool chunked = f->kind == BIG_CHUNKED;
		size_t at = 1, n;

		for (i = 0; i < sizeof(pad); i++)
			pad[i] = i % 2 ? ',' : '0';
		snprintf(line, sizeof(line),
			 chunked ? "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				   "Transfer-Encoding: chunked\r\n\r\n1\r\n[\r\n" :
				   "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
				   "Content-Length: %u\r\n\r\n[",
			 HUGE_BODY);
		if (put(f, fd, line, strlen(line)) != 0)
			return;
		for (; at + 2 < HUGE_BODY; at += n) {
			n = PROTO_MIN(sizeof(pad), (size_t)HUGE_BODY - 2 - at);
			if (n < sizeof(pad))
				memset(pad, ' ', sizeof(pad));
			snprintf(line, sizeof(line), "%zx\r\n", n);
			if ((chunked && put(f, fd, line, strlen(line)) != 0) ||
			    put(f, fd, pad, n) != 0 || (chunked && put(f, fd, "\r\n", 2) != 0))
				return;
		}
		if (chunked)
			put(f, fd, "2\r\n0]\r\n0\r\n\r\n", 12);
		else
			put(f, fd, "0]", 2);
		break;
	}
	case ENDLESS_HEAD:
		if (put(f, fd, "HTTP/1.1 200 OK\r\n", 17) != 0)
			return;
		for (i = 0; f->sent < SEND_MAX; i++) {
			snprintf(line, sizeof(line), "X-Pad-%zu: %0200d\r\n", i, 0);
			if (put(f, fd, line, strlen(line)) != 0)
				return;
		}
		break;
	case MANY_HEADERS:
		if (put(f, fd, "HTTP/1.1 200 OK\r\n", 17) != 0)
			return;
		for (i = 0; i < 100; i++) {
			snprintf(line, sizeof(line), "X-Pad-%zu: x\r\n", i);
			if (put(f, fd, line, strlen(line)) != 0)
				return;
		}
		snprintf(line, sizeof(line), "Content-Type: application/json\r\n"
					     "Content-Length: 2\r\n\r\n{}");
		put(f, fd, line, strlen(line));
		break;
	case DRIBBLE:
		snprintf(line, sizeof(line), "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
					     "Content-Length: 200\r\n\r\n{\"a\":\"");
		if (put(f, fd, line, strlen(line)) != 0)
			return;
		/* The other 194 bytes of the body, one each 250 ms: 48 s,
		 * each well inside any inactivity timeout. */
		for (i = 0; i < DRIBBLED; i++) {
			sleep_ms(250);
			if (put(f, fd, i < DRIBBLED - 2 ? "x" : i == DRIBBLED - 2 ? "\"" : "}", 1) != 0)
				return;
		}
		break;
	case HONEST:
		snprintf(line, sizeof(line), "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
					     "Content-Length: 11\r\n\r\n{\"lease\":1}");
		put(f, fd, line, strlen(line));
		break;
	}
}

/* One connection: its request's head read, the answer sent, then held
 * until the client closes it. */
static void *serve(void *arg)
{
	struct fake *f = arg;
	char buf[4096];
	size_t got = 0;
	int fd = accept(f->lfd, NULL, NULL);

	if (fd < 0)
		return NULL;
	while (got < sizeof(buf) - 1) {
		ssize_t n = recv(fd, buf + got, sizeof(buf) - 1 - got, 0);
		if (n <= 0)
			break;
		got += (size_t)n;
		buf[got] = 0;
		/* A TLS client hello is answered at once, as a plain HTTP
		 * server answers what it cannot parse. */
		if (strstr(buf, "\r\n\r\n") != NULL || buf[0] == 0x16)
			break;
	}
	answer(f, fd);
	while (recv(fd, buf, sizeof(buf), 0) > 0)
		;
	close(fd);
	return NULL;
}

static void fake_start(struct fake *f, enum answer kind)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);

	memset(f, 0, sizeof(*f));
	f->kind = kind;
	f->lfd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%d", ntohs(sa.sin_port));
	assert_int_equal(pthread_create(&f->th, NULL, serve, f), 0);
}

static void fake_stop(struct fake *f)
{
	pthread_join(f->th, NULL);
	close(f->lfd);
}

static long peak_rss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* The fake tracker answers a version watch (GET /versions) as kind; the
 * client's answer lands in r. Returns the seconds it took. */
static double ask(enum answer kind, uint32_t timeout_ms, struct trk_reply *r, size_t *sent,
		  long *grew_kib)
{
	struct trk_client *c;
	struct proto_err err;
	struct fake f;
	uint64_t t0 = proto_now_ns();
	long rss0 = peak_rss_kib();

	fake_start(&f, kind);
	assert_int_equal(trk_client_new(NULL, f.url, NULL, &c, &err), 0);
	trk_client_set_timeout(c, timeout_ms);
	trk_reply_init(r);
	assert_int_equal(trk_client_watch(c, 0, 0, trk_reply_cb, r), 0);
	trk_client_wait(c, r);
	double s = (double)(proto_now_ns() - t0) / 1e9;
	*grew_kib = peak_rss_kib() - rss0;
	trk_client_free(c); /* closes the connection: the fake tracker ends */
	fake_stop(&f);
	*sent = f.sent;
	return s;
}

/* One line, naming what was asked and why it was refused. */
static void refused_with(const struct trk_reply *r, const char *why)
{
	assert_true(r->done);
	assert_true(r->status < 0);
	assert_null(strchr(r->error, '\n'));
	assert_non_null(strstr(r->error, "GET /api/v1/versions"));
	if (strstr(r->error, why) == NULL)
		fail_msg("'%s' does not say '%s'", r->error, why);
}

/* The fake tracker answers as kind (what: for the log); the client refuses
 * it saying why, having let at most sent_max bytes out of the fake tracker
 * and grown its peak RSS by under 64 MiB. Returns the answer's status. */
static int refuses(enum answer kind, const char *what, uint32_t timeout_ms, const char *why,
		   size_t sent_max)
{
	struct trk_reply r;
	size_t sent;
	long grew;
	int status;

	double s = ask(kind, timeout_ms, &r, &sent, &grew);
	print_message("%s: refused after %.2f s, %zu bytes sent, peak RSS +%ld KiB: %s\n", what, s,
		      sent, grew, r.error);
	refused_with(&r, why);
	assert_true(sent < sent_max);
	assert_true(grew < 64 * 1024);
	status = r.status;
	trk_reply_fini(&r);
	return status;
}

/* A 60 MiB JSON array (the attack took a node to 1.9 GiB): refused at its
 * head, by the Content-Length a watch's answer never reaches; what was
 * sent is what socket buffers took. */
static void test_huge_declared_body(void **state)
{
	(void)state;
	assert_int_equal(refuses(BIG_DECLARED, "declared 60 MiB body", 30000, "Content-Length",
				 HUGE_BODY / 2),
			 -EMSGSIZE);
}

/* The same array chunked (no length declared): refused once the body
 * passes the watch's cap (4 MiB), not parsed. */
static void test_huge_chunked_body(void **state)
{
	(void)state;
	assert_int_equal(refuses(BIG_CHUNKED, "chunked 60 MiB body", 30000, "body exceeds",
				 HUGE_BODY / 2),
			 -EMSGSIZE);
}

/* Header lines without end (the attack: 946 MiB in 25 s): refused once
 * the head passes 16 KiB. */
static void test_endless_head(void **state)
{
	(void)state;
	refuses(ENDLESS_HEAD, "endless head", 30000, "head", SEND_MAX / 2);
}

/* A head of 100 short lines (2 KiB, under the byte cap): refused for its
 * count. */
static void test_many_headers(void **state)
{
	(void)state;
	refuses(MANY_HEADERS, "100 header lines", 30000, "102 header lines (at most 64)", 1 << 20);
}

/* A body dribbled a byte each 250 ms (48 s in all) never stalls long
 * enough for an inactivity timeout; the answer's deadline (2 s here) ends
 * it: the state, not the time, is checked (the fake tracker was still
 * dribbling). */
static void test_dribbled_answer(void **state)
{
	(void)state;
	assert_int_equal(refuses(DRIBBLE, "dribbled body (deadline 2 s)", 2000,
				 "no whole answer by the request's deadline", 100 + DRIBBLED / 2),
			 -ETIMEDOUT);
}

/* An honest answer within every cap is taken as before. */
static void test_honest_answer(void **state)
{
	struct trk_reply r;
	size_t sent;
	long grew;

	(void)state;
	ask(HONEST, 30000, &r, &sent, &grew);
	assert_int_equal(r.status, 200);
	assert_non_null(r.json);
	trk_reply_fini(&r);
}

/* Settings only a person can change are said so, naming the flag: a host
 * that does not resolve (getaddrinfo's words, not a reset connection),
 * https:// to a tracker that speaks plain HTTP. */
static void test_needs_a_person(void **state)
{
	struct trk_client *c;
	struct trk_reply r;
	struct proto_err err;
	struct fake f;
	char url[80];

	(void)state;
	assert_int_equal(trk_client_new(NULL, "http://no-such-host.invalid:7400", NULL, &c, &err), 0);
	assert_true(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r) < 0);
	print_message("unknown host: %s\n", r.error);
	assert_non_null(strstr(r.error, "cannot resolve no-such-host.invalid"));
	assert_null(strstr(r.error, "reset"));
	trk_reply_fini(&r);
	trk_client_free(c);

	fake_start(&f, HONEST);
	snprintf(url, sizeof(url), "https://%s", f.url + strlen("http://"));
	assert_int_equal(trk_client_new(NULL, url, NULL, &c, &err), 0);
	assert_int_equal(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r), -EPROTO);
	print_message("https:// to plain HTTP: %s\n", r.error);
	assert_non_null(strstr(r.error, "check --tracker"));
	trk_reply_fini(&r);
	trk_client_free(c);
	fake_stop(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_honest_answer),
		cmocka_unit_test(test_huge_declared_body),
		cmocka_unit_test(test_huge_chunked_body),
		cmocka_unit_test(test_endless_head),
		cmocka_unit_test(test_many_headers),
		cmocka_unit_test(test_dribbled_answer),
		cmocka_unit_test(test_needs_a_person),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
