/* The tracker's HTTP API over TLS: a tracker with --tls-cert/--tls-key, the
 * client verifying it against a CA (and the host name), a wrong CA and a
 * wrong host refused, plain HTTP to it refused cleanly, and a publisher and
 * a node running a version through an https:// tracker. The test CA and
 * certificates are made here with the openssl command; no key is kept. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include "proto/fixture.h"
#include "tests/testcluster.h"

struct env {
	char dir[256], url[256], ca[512], other_ca[512], cert[512], key[512];
	char wrong_cert[512], wrong_key[512], ckey[512];
	struct node_proc tracker, tracker2, node, publisher;
	struct trk_client *trk;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	char buf[600];

	if (e == NULL || tu_mkdtemp(e->dir, sizeof(e->dir)) == NULL)
		return 1;
	tu_make_ca(e->dir, "ca");
	tu_make_ca(e->dir, "other");
	tu_make_cert(e->dir, "tracker", "127.0.0.1");
	tu_make_cert(e->dir, "wronghost", "127.0.0.9");
	snprintf(e->ca, sizeof(e->ca), "%s/ca.pem", e->dir);
	snprintf(e->other_ca, sizeof(e->other_ca), "%s/other.pem", e->dir);
	snprintf(e->cert, sizeof(e->cert), "%s/tracker.pem", e->dir);
	snprintf(e->key, sizeof(e->key), "%s/tracker.key", e->dir);
	snprintf(e->wrong_cert, sizeof(e->wrong_cert), "%s/wronghost.pem", e->dir);
	snprintf(e->wrong_key, sizeof(e->wrong_key), "%s/wronghost.key", e->dir);
	snprintf(e->ckey, sizeof(e->ckey), "%s/cluster.key", e->dir);
	tu_bin(buf, sizeof(buf), "tessera");
	assert_int_equal(tu_sh("%s keygen --cluster -o %s > /dev/null 2>&1", buf, e->ckey), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	node_proc_stop(&e->tracker2, 5000);
	if (getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	free(e);
	return 0;
}

/* Starts a TLS tracker (cluster key when ckey) presenting cert and key;
 * its URL goes into url. */
static void start_tls_tracker(struct env *e, struct node_proc *p, const char *tag,
			      const char *cert, const char *key, bool ckey, char *url,
			      size_t cap)
{
	char bin[512], log[600], state[600], line[300];

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(log, sizeof(log), "%s/%s.log", e->dir, tag);
	snprintf(state, sizeof(state), "%s/%s-state", e->dir, tag);
	char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state", state, "--tls-cert",
			(char *)cert, "--tls-key", (char *)key, "--log-level", "info",
			ckey ? "--cluster-key" : NULL, e->ckey, NULL};
	assert_int_equal(node_proc_spawn(p, tag, argv, log), 0);
	assert_int_equal(node_proc_wait_line(p, "listening on ", line, sizeof(line), 20000), 0);
	assert_int_equal(strncmp(line, "https://127.0.0.1:", 18), 0);
	snprintf(url, cap, "%s", line);
}

/* GET /api/v1/status through a new client for url (trusting ca, or the
 * system's store when NULL); the reply is left in r. */
static int get_status(const char *url, const char *ca, struct trk_reply *r)
{
	struct trk_client *c = NULL;
	struct proto_err err;
	int rc;

	assert_int_equal(trk_client_new(NULL, url, NULL, &c, &err), 0);
	if (ca != NULL)
		assert_int_equal(trk_client_set_tls_ca(c, ca, &err), 0);
	trk_client_set_timeout(c, 30000);
	rc = trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, r);
	trk_client_free(c);
	return rc;
}

/* Connects to the tracker at url and sends one byte of a TLS hello every
 * 200 ms; true once the tracker closed the connection (within 30 s). */
static bool dribble_closed(const char *url)
{
	const char *colon = strrchr(url, ':');
	struct sockaddr_in sa = {.sin_family = AF_INET};
	static const uint8_t hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01};
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	bool closed = false;

	assert_true(fd >= 0 && colon != NULL);
	sa.sin_port = htons((uint16_t)atoi(colon + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	for (int i = 0; i < 150 && !closed; i++) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		uint8_t b;

		if (send(fd, &hello[i % sizeof(hello)], 1, MSG_NOSIGNAL) != 1)
			closed = true;
		else if (poll(&p, 1, 200) == 1 && read(fd, &b, 1) <= 0)
			closed = true;
	}
	close(fd);
	return closed;
}

static void test_tls_client(void **state)
{
	struct env *e = *state;
	char plain[300], url2[300];
	struct trk_reply r;
	struct trk_client *c = NULL;
	struct proto_err err;

	start_tls_tracker(e, &e->tracker, "tracker", e->cert, e->key, true, e->url,
			  sizeof(e->url));

	/* The right CA: answered. */
	assert_int_equal(get_status(e->url, e->ca, &r), 0);
	assert_int_equal(r.status, 200);
	assert_non_null(json_object_get(r.json, "replicas"));
	trk_reply_fini(&r);

	/* Another CA, or the system's store: refused before a byte is sent,
	 * with one line that says why. */
	assert_int_equal(get_status(e->url, e->other_ca, &r), -EPROTO);
	assert_non_null(strstr(r.error, "certificate not verified"));
	assert_null(strchr(r.error, '\n'));
	trk_reply_fini(&r);
	assert_int_equal(get_status(e->url, NULL, &r), -EPROTO);
	assert_non_null(strstr(r.error, "certificate not verified"));
	trk_reply_fini(&r);

	/* Plain HTTP to the TLS listener: a 400 that says to use https://. */
	snprintf(plain, sizeof(plain), "http://%s", e->url + strlen("https://"));
	assert_int_equal(get_status(plain, NULL, &r), 0);
	assert_int_equal(r.status, 400);
	assert_non_null(strstr(r.error, "https://"));
	trk_reply_fini(&r);

	/* A refusal the connection guard answers itself (an unsigned POST,
	 * before its body) reaches the client through TLS. */
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &c, &err), 0);
	assert_int_equal(trk_client_set_tls_ca(c, e->ca, &err), 0);
	trk_client_set_timeout(c, 30000);
	assert_int_equal(trk_client_call(c, "POST", TRK_API "/heartbeat", "application/json",
					 "{\"id\":\"A/0\"}", 12, &r),
			 0);
	assert_int_equal(r.status, 401);
	trk_reply_fini(&r);
	/* ... and the tracker still answers. */
	assert_int_equal(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	trk_client_free(c);

	/* A certificate for another address, from the right CA: refused. That
	 * tracker has a short head deadline: a TLS handshake dribbled byte by
	 * byte is cut off as a slow head is. */
	setenv("TESSERA_HEADER_MS", "2000", 1);
	start_tls_tracker(e, &e->tracker2, "tracker2", e->wrong_cert, e->wrong_key, false, url2,
			  sizeof(url2));
	unsetenv("TESSERA_HEADER_MS");
	assert_true(dribble_closed(url2));
	assert_int_equal(get_status(url2, e->ca, &r), -EPROTO);
	assert_non_null(strstr(r.error, "certificate not verified"));
	assert_non_null(strstr(r.error, "mismatch"));
	trk_reply_fini(&r);

	/* The client's refusals of bad settings. */
	assert_int_equal(trk_client_new(NULL, plain, NULL, &c, &err), 0);
	assert_int_equal(trk_client_set_tls_ca(c, e->ca, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "not https://"));
	trk_client_free(c);
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &c, &err), 0);
	assert_int_equal(trk_client_set_tls_ca(c, e->key, &err), -EINVAL); /* not a CA */
	assert_non_null(strstr(err.msg, "--tls-ca"));
	trk_client_free(c);
	assert_int_not_equal(trk_client_new(NULL, "ftp://127.0.0.1:1", NULL, &c, &err), 0);
	assert_null(c);
}

/* Runs tessera-tracker with args (on a fresh state dir n): wants status
 * and one line of stderr holding want. */
static void tracker_refuses(struct env *e, int n, const char *args, int status,
			    const char *want)
{
	char bin[512], out[600];

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(out, sizeof(out), "%s/opt.err", e->dir);
	assert_int_equal(tu_sh("%s --listen 127.0.0.1:0 --state %s/s%d %s 2> %s", bin, e->dir, n,
			       args, out),
			 status);
	assert_int_equal(tu_sh("grep -q -- '%s' %s && test $(wc -l < %s) = 1", want, out, out), 0);
}

/* The tracker's refusals of bad TLS options: one line, non-zero status. */
static void test_tls_tracker_options(void **state)
{
	struct env *e = *state;
	char args[2000];

	snprintf(args, sizeof(args), "--tls-cert %s", e->cert);
	tracker_refuses(e, 1, args, 2, "go together");
	/* A key that is not the certificate's. */
	snprintf(args, sizeof(args), "--tls-cert %s --tls-key %s", e->cert, e->wrong_key);
	tracker_refuses(e, 2, args, 1, "does not match");
	/* Files that are not PEM, or not there. */
	snprintf(args, sizeof(args), "--tls-cert %s/openssl.log --tls-key %s", e->dir, e->key);
	tracker_refuses(e, 3, args, 1, "--tls-cert");
	snprintf(args, sizeof(args), "--tls-cert %s --tls-key %s/missing", e->cert, e->dir);
	tracker_refuses(e, 4, args, 1, "--tls-key");
}

/* A publisher and a node through an https:// tracker: v1 goes active;
 * `tessera model` reads the model through it and refuses a wrong CA. */
static void test_tls_cluster(void **state)
{
	struct env *e = *state;
	char bin[512], log[600], buf[600], line[300];
	struct tu_run_files f;
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	start_tls_tracker(e, &e->tracker, "tracker", e->cert, e->key, true, e->url,
			  sizeof(e->url));
	tu_run_files(&f, e->dir);

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--tls-ca", e->ca, "--key", f.key,
			 "--cluster-key", e->ckey, "--synthetic-mb", "4", "--seed", "7",
			 "--layout", "fsdp2", "--control", f.sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node.log", e->dir);
	char *nargv[] = {bin, "--tracker", e->url, "--tls-ca", e->ca, "--cluster-key", e->ckey,
			 "--replica", "A", "--rank", "0", "--layout", "tp1", "--model", f.model,
			 "--trainer-pubkey", f.pub, "--expose", f.expose, "--store", "host", NULL};
	assert_int_equal(node_proc_spawn(&e->node, "node", nargv, log), 0);

	tu_control(f.sock, "export\n", line, sizeof(line));
	assert_int_equal(strncmp(line, "published 1 ", 12), 0);
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	assert_int_equal(trk_client_set_tls_ca(e->trk, e->ca, &err), 0);
	trk_client_set_timeout(e->trk, 30000);
	assert_true(tu_wait_active(e->trk, "A", 1, 60000));

	/* tessera model through TLS: the right CA, then a wrong one (one line,
	 * status 1). */
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s model --tracker %s --tls-ca %s -o %s/model2.json", bin, e->url,
			       e->ca, e->dir),
			 0);
	snprintf(buf, sizeof(buf), "%s/model2.json", e->dir);
	json_t *want = tu_load_json(f.model), *got = tu_load_json(buf);
	assert_true(want != NULL && got != NULL && json_equal(want, got));
	json_decref(want);
	json_decref(got);
	assert_int_equal(tu_sh("%s model --tracker %s --tls-ca %s 2> %s/model.err", bin, e->url,
			       e->other_ca, e->dir),
			 1);
	assert_int_equal(tu_sh("grep -q 'certificate not verified' %s/model.err && "
			       "test $(wc -l < %s/model.err) = 1",
			       e->dir, e->dir),
			 0);
	/* A node given an http:// URL and a CA file refuses to start. */
	tu_bin(bin, sizeof(bin), "tessera-node");
	assert_int_not_equal(tu_sh("%s --tracker http://127.0.0.1:1 --tls-ca %s --replica B "
				   "--rank 0 --layout tp1 --model %s --trainer-pubkey %s --store host "
				   "--metrics off 2> %s/node2.err",
				   bin, e->ca, f.model, f.pub, e->dir),
			     0);
	assert_int_equal(tu_sh("grep -q 'not https://' %s/node2.err", e->dir), 0);
	unsetenv("TESSERA_CHUNK_SIZE");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_tls_client, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_tracker_options, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tls_cluster, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
