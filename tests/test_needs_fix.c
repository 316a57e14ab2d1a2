/* Failures that a person must fix, as real processes: a node given another
 * trainer key than the publisher signs with refuses every manifest; it
 * must say so once at warn naming --trainer-pubkey, answer /healthz with
 * 503 and the reason, and ask again ever more slowly (not every 2 s). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <time.h>

#include "tests/testcluster.h"

struct env {
	char dir[256], url[256], log[600], murl[256];
	struct node_proc tracker, publisher, node;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->tracker, 5000);
	tu_rmtree(e->dir);
	free(e);
	return 0;
}

/* The node's count of refused versions, from its /metrics. */
static uint64_t refusals(struct env *e)
{
	static char body[1 << 18];
	char url[300];
	const char *p;

	snprintf(url, sizeof(url), "%s/metrics", e->murl);
	if (tu_http_get(e->dir, "GET", url, body, sizeof(body)) != 200)
		return 0;
	p = strstr(body, "\ntessera_node_refused_versions_total{replica=\"A\",rank=\"0\"} ");
	return p != NULL ? strtoull(strchr(p, '}') + 2, NULL, 10) : 0;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Lines of the node's log holding what. */
static int log_lines(struct env *e, const char *what)
{
	return tu_sh("exit $(grep -c -- '%s' %s)", what, e->log);
}

static void test_wrong_trainer_key(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;
	char bin[512], plog[600], other[600], line[300], url[300];
	static char body[65536];

	tu_run_files(&f, e->dir);
	snprintf(line, sizeof(line), "%s/state", e->dir);
	tu_start_tracker(&e->tracker, e->dir, line, f.pub, e->url, sizeof(e->url));
	tu_bin(bin, sizeof(bin), "tessera");
	/* A key pair the publisher does not sign with: the node's. */
	assert_int_equal(tu_sh("%s keygen -o %s/other > /dev/null 2>&1", bin, e->dir), 0);
	snprintf(other, sizeof(other), "%s/other.pub", e->dir);

	snprintf(plog, sizeof(plog), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--synthetic-mb",
			 "4", "--seed", "7", "--layout", "fsdp2", "--control", f.sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, plog), 0);

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(e->log, sizeof(e->log), "%s/node.log", e->dir);
	char *nargv[] = {bin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout",
			 "tp1", "--model", f.model, "--trainer-pubkey", other, "--expose", f.expose,
			 "--store", "host", "--log-level", "info", "--metrics", "127.0.0.1:0", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, e->log), 0);
	assert_int_equal(node_proc_wait_line(&e->node, "metrics on ", e->murl, sizeof(e->murl),
					     30000),
			 0);

	tu_control(f.sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);

	/* Three refusals of v1 (bounded: 2 + 4 s of back-off, 120 s). */
	for (int i = 0; i < 600 && refusals(e) < 3; i++)
		sleep_ms(200);
	uint64_t n = refusals(e);
	assert_true(n >= 3);

	snprintf(url, sizeof(url), "%s/healthz", e->murl);
	int code = tu_http_get(e->dir, "GET", url, body, sizeof(body));
	print_message("%llu refusals: /healthz %d: %s", (unsigned long long)n, code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "bad signature"));
	assert_non_null(strstr(body, "--trainer-pubkey"));
	/* Said once, at warn, naming the flag; the refusals after it at debug
	 * only. */
	int said = log_lines(e, "check --trainer-pubkey"),
	    warned = log_lines(e, "v1 refused: manifest: bad signature");
	print_message("log: %d lines name --trainer-pubkey, %d more say the refusal\n", said,
		      warned);
	assert_int_equal(said, 1);
	assert_int_equal(warned, 0);
	assert_true(node_proc_alive(&e->node));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_wrong_trainer_key, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
