/* Failures that a person must fix, as real processes: a node given another
 * trainer key than the publisher signs with refuses every manifest; it
 * must say so once at warn naming --trainer-pubkey, answer /healthz with
 * 503 and the reason, and ask again ever more slowly (not every 2 s). The
 * same for a node that no model reaches (no publisher, or the tracker
 * refused the publisher's model: its --state holds another model's
 * versions), for a publisher given https:// to a plain tracker, and for
 * a publisher or node given another cluster key than the tracker's. */
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
	struct node_proc old_tracker, old_publisher, old_node; /* a cluster before a restart */
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
	node_proc_stop(&e->old_node, 5000);
	node_proc_stop(&e->old_publisher, 5000);
	node_proc_stop(&e->old_tracker, 5000);
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

/* The run's files, and a tracker on dir/state trusting their trainer key. */
static void start_tracker(struct env *e, struct tu_run_files *f)
{
	char sdir[300];

	tu_run_files(f, e->dir);
	snprintf(sdir, sizeof(sdir), "%s/state", e->dir);
	tu_start_tracker(&e->tracker, e->dir, sdir, f->pub, e->url, sizeof(e->url));
}

/* Waits (bounded: 60 s) until the log at path has a line holding what. */
static bool wait_log(const char *path, const char *what)
{
	for (int i = 0; i < 300; i++) {
		if (tu_sh("grep -q -- '%s' %s", what, path) == 0)
			return true;
		sleep_ms(200);
	}
	return false;
}

/* Waits (bounded: 60 s) until GET url answers a body holding what; the
 * last answer is in body, its status returned. */
static int wait_health(struct env *e, const char *url, const char *what, char *body, size_t len)
{
	int code = 0;

	for (int i = 0; i < 300; i++) {
		code = tu_http_get(e->dir, "GET", url, body, len);
		if (strstr(body, what) != NULL)
			break;
		sleep_ms(200);
	}
	return code;
}

/* Starts a tessera-node of replica A, rank 0, tp1, trusting the trainer
 * key, at debug, with /metrics and /healthz at e->murl; no model for
 * 1 s is then said (TESSERA_WAIT_NOTICE_MS). */
static void start_node(struct env *e, const struct tu_run_files *f, const char *model)
{
	char bin[512];

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(e->log, sizeof(e->log), "%s/node.log", e->dir);
	char *nargv[] = {bin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout",
			 "tp1", "--model", (char *)model, "--trainer-pubkey", (char *)f->pub,
			 "--expose", (char *)f->expose, "--store", "host", "--log-level", "debug",
			 "--metrics", "127.0.0.1:0", NULL};
	setenv("TESSERA_WAIT_NOTICE_MS", "1000", 1);
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, e->log), 0);
	unsetenv("TESSERA_WAIT_NOTICE_MS");
	assert_int_equal(node_proc_wait_line(&e->node, "metrics on ", e->murl, sizeof(e->murl),
					     30000),
			 0);
}

/* After two more tries (bounded), the log at e->log holds one warn line
 * matching what, and p still runs. */
static void check_said_once(struct env *e, struct node_proc *p, const char *what)
{
	assert_true(wait_log(e->log, "still failing (3 in a row)"));
	int said = log_lines(e, what);
	print_message("log: %d warn lines match '%s'\n", said, what);
	assert_int_equal(said, 1);
	assert_true(node_proc_alive(p));
}

/* The node's /healthz once it says why no model comes (bounded), then
 * after two more tries: one warn line, still 503 with it. */
static void check_no_model(struct env *e, const char *what)
{
	static char body[65536];
	char url[300];

	snprintf(url, sizeof(url), "%s/healthz", e->murl);
	int code = wait_health(e, url, what, body, sizeof(body));
	print_message("/healthz %d: %s", code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "no model known yet"));
	assert_non_null(strstr(body, what));
	/* Asked again twice more (2 s, then 4 s later), said no more. */
	check_said_once(e, &e->node, " warn .*no model known yet");
	code = tu_http_get(e->dir, "GET", url, body, sizeof(body));
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, what));
}

/* No publisher ever: the node says so, and that the publisher's log
 * says why it was refused. */
static void test_no_publisher(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;

	start_tracker(e, &f);
	start_node(e, &f, f.model);
	check_no_model(e, "no publisher has registered one");
	assert_int_equal(log_lines(e, "is the publisher running?"), 1);
}

/* The tracker's --state holds another model's version (published through
 * a cluster of a 4 MiB model, then restarted); the publisher of an 8 MiB
 * model is refused and exits; its node is told why by the tracker. */
static void test_state_of_another_model(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;
	struct proto_model m;
	struct proto_err err;
	char bin[512], sdir[300], dir2[300], plog[600], model8[600], line[300];

	tu_run_files(&f, e->dir);
	snprintf(sdir, sizeof(sdir), "%s/state", e->dir);
	tu_start_tracker(&e->old_tracker, e->dir, sdir, f.pub, e->url, sizeof(e->url));
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(plog, sizeof(plog), "%s/publisher-4.log", e->dir);
	char *p4[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--synthetic-mb",
		      "4", "--seed", "7", "--layout", "fsdp2", "--control", f.sock, NULL};
	assert_int_equal(node_proc_spawn(&e->old_publisher, "publisher", p4, plog), 0);
	tu_start_node(&e->old_node, e->dir, e->url, "A", "0", "tp1", f.model, f.pub, f.expose,
		      NULL, "node-4");
	tu_control(f.sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);
	node_proc_stop(&e->old_node, 5000);
	node_proc_stop(&e->old_publisher, 5000);
	node_proc_stop(&e->old_tracker, 5000);

	/* The same state, another model's publisher: refused, it exits. */
	snprintf(dir2, sizeof(dir2), "%s/again", e->dir);
	assert_int_equal(mkdir(dir2, 0755), 0);
	tu_start_tracker(&e->tracker, dir2, sdir, f.pub, e->url, sizeof(e->url));
	snprintf(plog, sizeof(plog), "%s/publisher-8.log", e->dir);
	char *p8[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--synthetic-mb",
		      "8", "--seed", "7", "--layout", "fsdp2", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", p8, plog), 0);
	for (int i = 0; i < 300 && node_proc_alive(&e->publisher); i++)
		sleep_ms(200);
	assert_false(node_proc_alive(&e->publisher));
	assert_int_equal(tu_sh("grep -q -- 'model digest differs.*--state' %s", plog), 0);

	/* Its node: the tracker says why no model is known. */
	snprintf(model8, sizeof(model8), "%s/model-8.json", e->dir);
	assert_int_equal(proto_fixture_model(8 << 20, &m, &err), 0);
	tu_write_model(&m, model8);
	proto_model_fini(&m);
	start_node(e, &f, model8);
	check_no_model(e, "the tracker refused a publisher's model: model digest differs");
	assert_int_equal(log_lines(e, "empty --state"), 1);
}

/* The publisher's /healthz (address from its log) once it holds a body
 * with what (bounded), into body; returns its status. */
static int publisher_health(struct env *e, const char *what, char *body, size_t len)
{
	char murl_file[600], url[300];

	assert_true(wait_log(e->log, "metrics on "));
	snprintf(murl_file, sizeof(murl_file), "%s/murl", e->dir);
	assert_int_equal(tu_sh("sed -n 's/.*metrics on //p' %s | head -1 | tr -d '\\n' > %s",
			       e->log, murl_file), 0);
	FILE *mf = fopen(murl_file, "r");
	assert_non_null(mf);
	assert_non_null(fgets(e->murl, sizeof(e->murl), mf));
	fclose(mf);
	snprintf(url, sizeof(url), "%s/healthz", e->murl);
	return wait_health(e, url, what, body, len);
}

/* A publisher given https:// to a plain tracker keeps running (the
 * tracker may yet be restarted with TLS): its /healthz says what to
 * change, its log says it once, and it asks ever more slowly. */
static void test_publisher_tls_mismatch(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;
	char bin[512], turl[300];
	static char body[65536];

	start_tracker(e, &f);
	assert_int_equal(strncmp(e->url, "http://", 7), 0);
	snprintf(turl, sizeof(turl), "https://%s", e->url + 7);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(e->log, sizeof(e->log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", turl, "--key", f.key, "--synthetic-mb",
			 "4", "--seed", "7", "--layout", "fsdp2", "--metrics", "127.0.0.1:0",
			 "--log-level", "debug", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, e->log), 0);
	int code = publisher_health(e, "does not speak TLS", body, sizeof(body));
	print_message("/healthz %d: %s", code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "check --tracker"));
	assert_non_null(strstr(body, "--tls-cert)")); /* the whole reason */
	/* Asked again twice more (1 s, then 2 s later), said no more. */
	check_said_once(e, &e->publisher, " warn .*does not speak TLS");
}

/* A publisher given another cluster key than the tracker's, then none at
 * all, and a node given another: each refusal is a setting a person must
 * change; /healthz says which (--cluster-key, and how the keys differ),
 * the log says it once, and the process keeps asking, ever more slowly
 * (the tracker may be the one restarted with the right key). */
static void test_wrong_cluster_key(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;
	char bin[512], tbin[512], sdir[300], tkey[300], pkey[300], tlog[600], line[256];
	static char body[65536];

	tu_run_files(&f, e->dir);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(tkey, sizeof(tkey), "%s/tracker-cluster.key", e->dir);
	snprintf(pkey, sizeof(pkey), "%s/other-cluster.key", e->dir);
	assert_int_equal(tu_sh("%s keygen --cluster -o %s > /dev/null 2>&1 && "
			       "%s keygen --cluster -o %s > /dev/null 2>&1",
			       bin, tkey, bin, pkey),
			 0);
	tu_bin(tbin, sizeof(tbin), "tessera-tracker");
	snprintf(sdir, sizeof(sdir), "%s/state", e->dir);
	snprintf(tlog, sizeof(tlog), "%s/tracker.log", e->dir);
	char *targv[] = {tbin, "--listen", "127.0.0.1:0", "--state", sdir, "--trainer-pubkey",
			 f.pub, "--cluster-key", tkey, NULL};
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", targv, tlog), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line), 30000),
			 0);
	snprintf(e->url, sizeof(e->url), "%s", line);

	snprintf(e->log, sizeof(e->log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--cluster-key", pkey,
			 "--synthetic-mb", "4", "--seed", "7", "--layout", "fsdp2", "--metrics",
			 "127.0.0.1:0", "--log-level", "debug", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, e->log), 0);
	int code = publisher_health(e, "the tracker's and ours differ", body, sizeof(body));
	print_message("another cluster key: /healthz %d: %s", code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "check --cluster-key"));
	check_said_once(e, &e->publisher, " warn .*check --cluster-key");
	node_proc_stop(&e->publisher, 5000);

	/* No key at all, to a tracker that has one. */
	snprintf(e->log, sizeof(e->log), "%s/publisher-unkeyed.log", e->dir);
	char *uargv[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--synthetic-mb",
			 "4", "--seed", "7", "--layout", "fsdp2", "--metrics", "127.0.0.1:0",
			 "--log-level", "debug", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", uargv, e->log), 0);
	code = publisher_health(e, "the tracker wants one", body, sizeof(body));
	print_message("no cluster key: /healthz %d: %s", code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "check --cluster-key"));
	check_said_once(e, &e->publisher, " warn .*check --cluster-key");

	/* A node with the other key. */
	char nbin[512], url[300];
	tu_bin(nbin, sizeof(nbin), "tessera-node");
	snprintf(e->log, sizeof(e->log), "%s/node.log", e->dir);
	char *nargv[] = {nbin, "--tracker", e->url, "--replica", "A", "--rank", "0", "--layout",
			 "tp1", "--model", f.model, "--trainer-pubkey", f.pub, "--cluster-key", pkey,
			 "--expose", f.expose, "--store", "host", "--log-level", "debug",
			 "--metrics", "127.0.0.1:0", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, e->log), 0);
	assert_int_equal(node_proc_wait_line(&e->node, "metrics on ", e->murl, sizeof(e->murl),
					     30000),
			 0);
	snprintf(url, sizeof(url), "%s/healthz", e->murl);
	code = wait_health(e, url, "the tracker's and ours differ", body, sizeof(body));
	print_message("node, another cluster key: /healthz %d: %s", code, body);
	assert_int_equal(code, 503);
	assert_non_null(strstr(body, "check --cluster-key"));
	check_said_once(e, &e->node, " warn .*check --cluster-key");
}

static void test_wrong_trainer_key(void **state)
{
	struct env *e = *state;
	struct tu_run_files f;
	char bin[512], plog[600], other[600], line[300], url[300];
	static char body[65536];

	start_tracker(e, &f);
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
		cmocka_unit_test_setup_teardown(test_no_publisher, setup, teardown),
		cmocka_unit_test_setup_teardown(test_state_of_another_model, setup, teardown),
		cmocka_unit_test_setup_teardown(test_publisher_tls_mismatch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_cluster_key, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
