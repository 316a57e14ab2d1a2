/* The etcd client and the store over it, against a fake gateway on
 * loopback that answers what each case says: bad answers (not JSON, not
 * base64, a key outside the range asked, a parted value whose parts lie, a
 * value over its cap, no member able to serve) are refused with one line
 * and nothing kept; good ones round-trip, parts included. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/thread.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tracker/server/store.h"
#include "tracker/wire/etcd.h"

/* The fake gateway: every request is answered with code and body. */
struct fake {
	struct event_base *base;
	struct evhttp *http;
	pthread_t th;
	int port;
	int code;
	char body[4096];
	char last_path[128];
};

static void answer(struct evhttp_request *req, void *arg)
{
	struct fake *f = arg;
	struct evbuffer *b = evbuffer_new();

	snprintf(f->last_path, sizeof(f->last_path), "%s", evhttp_request_get_uri(req));
	evbuffer_add(b, f->body, strlen(f->body));
	evhttp_send_reply(req, f->code, "x", b);
	evbuffer_free(b);
}

static void *loop(void *arg)
{
	event_base_dispatch(((struct fake *)arg)->base);
	return NULL;
}

static int setup(void **state)
{
	struct fake *f = calloc(1, sizeof(*f));
	struct evhttp_bound_socket *s;
	struct sockaddr_in a;
	socklen_t len = sizeof(a);

	f->base = event_base_new();
	f->http = evhttp_new(f->base);
	evhttp_set_gencb(f->http, answer, f);
	s = evhttp_bind_socket_with_handle(f->http, "127.0.0.1", 0);
	assert_non_null(s);
	getsockname(evhttp_bound_socket_get_fd(s), (struct sockaddr *)&a, &len);
	f->port = ntohs(a.sin_port);
	f->code = 200;
	assert_int_equal(pthread_create(&f->th, NULL, loop, f), 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fake *f = *state;

	event_base_loopbreak(f->base);
	pthread_join(f->th, NULL);
	evhttp_free(f->http);
	event_base_free(f->base);
	free(f);
	return 0;
}

static struct trk_etcd *client(struct fake *f)
{
	char url[64];
	struct trk_etcd_opts o = {.url = url, .timeout_ms = 2000};
	struct trk_etcd *e = NULL;
	struct proto_err err;

	snprintf(url, sizeof(url), "etcd://127.0.0.1:%d/t", f->port);
	assert_int_equal(trk_etcd_new(&o, &e, &err), 0);
	return e;
}

/* The base64 of s. */
static const char *b64(const char *s)
{
	static char out[2][512];
	static int k;
	k ^= 1;
	sodium_bin2base64(out[k], sizeof(out[k]), (const uint8_t *)s, strlen(s),
			  sodium_base64_VARIANT_ORIGINAL);
	return out[k];
}

/* Each bad answer to a get: refused, one line, nothing returned. */
static void bad_gets(void **state)
{
	struct fake *f = *state;
	struct trk_etcd *e = client(f);
	struct proto_err err;
	uint8_t *val = (uint8_t *)"x";
	size_t len = 7;
	char big[4096];
	const struct {
		int code;
		const char *body, *want;
	} cases[] = {
		{200, "not json", "not an etcd answer"},
		{200, "[1,2]", "not an etcd answer"},
		{200, "{\"kvs\":[{\"value\":\"!!!!\"}]}", "not base64"},
		{200, "{\"kvs\":[{\"value\":5}]}", "not a string"},
		{404, "{\"error\":\"Not Found\",\"code\":5}", "HTTP 404: Not Found"},
		{503, "{\"error\":\"etcdserver: no leader\",\"code\":14}", "no endpoint answered"},
		{200, big, "over 16 bytes"},
	};

	snprintf(big, sizeof(big), "{\"kvs\":[{\"value\":\"%s\"}]}",
		 b64("a value of more than sixteen bytes"));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		f->code = cases[i].code;
		snprintf(f->body, sizeof(f->body), "%s", cases[i].body);
		val = (uint8_t *)"x";
		int rc = trk_etcd_get(e, "k", 16, &val, &len, &err);
		assert_true(rc < 0 && rc != -ENOENT);
		assert_null(val);
		assert_int_equal(len, 0);
		if (strstr(err.msg, cases[i].want) == NULL)
			fail_msg("case %zu: '%s' does not say '%s'", i, err.msg, cases[i].want);
		assert_null(strchr(err.msg, '\n'));
	}
	/* Absent, and a good one. */
	f->code = 200;
	snprintf(f->body, sizeof(f->body), "{\"header\":{}}");
	assert_int_equal(trk_etcd_get(e, "k", 16, &val, &len, &err), -ENOENT);
	snprintf(f->body, sizeof(f->body), "{\"kvs\":[{\"value\":\"%s\"}]}", b64("hello"));
	assert_int_equal(trk_etcd_get(e, "k", 16, &val, &len, &err), 0);
	assert_int_equal(len, 5);
	assert_memory_equal(val, "hello", 5);
	assert_string_equal(f->last_path, "/v3/kv/range");
	free(val);
	trk_etcd_free(e);
}

static int count_key(const char *key, void *arg)
{
	(*(int *)arg)++;
	return 0;
}

/* A listing with a key outside the range asked is refused. */
static void bad_keys(void **state)
{
	struct fake *f = *state;
	struct trk_etcd *e = client(f);
	struct proto_err err;
	int n = 0;

	snprintf(f->body, sizeof(f->body), "{\"kvs\":[{\"key\":\"%s\"},{\"key\":\"%s\"}]}",
		 b64("/tessera/t/versions/1"), b64("/elsewhere/x"));
	assert_int_equal(trk_etcd_keys(e, "versions/", count_key, &n, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "outside the range"));
	snprintf(f->body, sizeof(f->body), "{\"kvs\":[{\"key\":\"%s\"}]}",
		 b64("/tessera/t/versions/1"));
	n = 0;
	assert_int_equal(trk_etcd_keys(e, "versions/", count_key, &n, &err), 0);
	assert_int_equal(n, 1);
	trk_etcd_free(e);
}

/* The store's value forms: a value not in tessera's form, or parts that
 * do not match their digest, are refused naming the key. */
static void bad_values(void **state)
{
	struct fake *f = *state;
	struct trk_store *st = NULL;
	struct proto_err err;
	uint8_t *buf = NULL;
	size_t len = 0;
	char hex[65];

	assert_int_equal(trk__store_open_etcd(client(f), &st, &err), 0);
	const char *forms[] = {"zzz", "", "p0 0 00", "p2 10 ab", "p1 99999999999 ab"};
	for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
		snprintf(f->body, sizeof(f->body), "{\"kvs\":[{\"value\":\"%s\"}]}", b64(forms[i]));
		assert_true(trk__store_get(st, "cluster.id", 1 << 20, &buf, &len, &err) < 0);
		assert_null(buf);
		if (strstr(err.msg, "cluster.id") == NULL)
			fail_msg("form '%s': '%s' does not name the key", forms[i], err.msg);
	}
	/* One part, its digest another's: every read answers the same part. */
	memset(hex, 'a', 64);
	hex[64] = 0;
	char v[200];
	snprintf(v, sizeof(v), "p1 %u %s", 600u << 10, hex);
	snprintf(f->body, sizeof(f->body), "{\"kvs\":[{\"value\":\"%s\"}]}", b64(v));
	assert_true(trk__store_get(st, "versions/x", 1 << 20, &buf, &len, &err) < 0);
	assert_null(buf);
	trk__store_free(st);
}

/* A member that takes the connection and never answers (or trickles):
 * the call ends at its deadline, whole, not per read. */
static void silent_member(void **state)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t alen = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char url[64];
	struct trk_etcd_opts o = {.url = url, .timeout_ms = 300};
	struct trk_etcd *e = NULL;
	struct proto_err err;
	uint8_t *val = NULL;
	size_t len = 0;
	struct timespec t0, t1;

	(void)state;
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fd, 4), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
	snprintf(url, sizeof(url), "etcd://127.0.0.1:%d", ntohs(a.sin_port));
	assert_int_equal(trk_etcd_new(&o, &e, &err), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(trk_etcd_get(e, "k", 16, &val, &len, &err), -EIO);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_non_null(strstr(err.msg, "no answer in 300 ms"));
	/* Bounded: the deadline, not the machine's TCP timeouts. */
	assert_true(t1.tv_sec - t0.tv_sec < 10);
	trk_etcd_free(e);
	close(fd);
}

int main(void)
{
	/* The fake gateway's loop is stopped from the test's thread. */
	evthread_use_pthreads();
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(bad_gets, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_keys, setup, teardown),
		cmocka_unit_test_setup_teardown(bad_values, setup, teardown),
		cmocka_unit_test(silent_member),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
