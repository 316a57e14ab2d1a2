/* Helpers for tests that run tessera's real programs: the model spec a node
 * takes, and a tracker started on a free loopback port. Test-only. */
#ifndef TESTS_TESTCLUSTER_H
#define TESTS_TESTCLUSTER_H

#include <jansson.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tests/testutil.h"
#include "tracker/tracker.h"

/* Writes m as the model spec JSON that `tessera-node --model` reads. */
static inline void tu_write_model(const struct proto_model *m, const char *path)
{
	struct proto_err err;
	json_t *j = proto_model_to_json(m);
	char *txt = json_dumps(j, 0);

	assert_int_equal(proto_write_file_atomic(path, txt, strlen(txt), 0644, &err), 0);
	free(txt);
	json_decref(j);
}

/* The JSON document in path (a report, an activation record); NULL when it
 * cannot be read or parsed. The caller json_decref()s it. */
static inline json_t *tu_load_json(const char *path)
{
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	if (proto_read_file(path, 1 << 20, &buf, &len, &err) != 0)
		return NULL;
	json_t *j = json_loadb((char *)buf, len, 0, NULL);
	free(buf);
	return j;
}

/* Starts tessera-tracker on 127.0.0.1:0 with its state in state_dir and its
 * log in dir/tracker.log, pinning the trainer key pub (NULL: the first
 * signer is pinned), and writes its URL into url. */
static inline void tu_start_tracker(struct node_proc *p, const char *dir, const char *state_dir,
				    const char *pub, char *url, size_t url_len)
{
	char bin[512], log[512], line[256];
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(log, sizeof(log), "%s/tracker.log", dir);
	char *argv[] = {bin, "--listen", "127.0.0.1:0", "--state", (char *)state_dir,
			pub ? "--trainer-pubkey" : NULL, (char *)pub, NULL};
	assert_int_equal(node_proc_spawn(p, "tracker", argv, log), 0);
	assert_int_equal(node_proc_wait_line(p, "listening on ", line, sizeof(line), 30000), 0);
	snprintf(url, url_len, "%s", line);
}

/* The trainer key pair of tests/data: paths of the secret and public key. */
static inline void tu_trainer_keys(char *key, size_t klen, char *pub, size_t plen)
{
	char buf[512];

	snprintf(key, klen, "%s", tu_data(buf, sizeof(buf), "test-trainer.key"));
	snprintf(pub, plen, "%s", tu_data(buf, sizeof(buf), "test-trainer.pub"));
}

/* Starts tessera-node (host store, log level info, log in dir/<tag>.log) as
 * (replica, rank) in layout, trusting the trainer key pub; attach is its
 * attach socket (NULL: none). */
static inline void tu_start_node(struct node_proc *p, const char *dir, const char *url,
				 const char *replica, const char *rank, const char *layout,
				 const char *model, const char *pub, const char *expose,
				 const char *attach, const char *tag)
{
	char bin[512], log[600];

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/%s.log", dir, tag);
	char *argv[] = {bin, "--tracker", (char *)url, "--replica", (char *)replica,
			"--rank", (char *)rank, "--layout", (char *)layout, "--model", (char *)model,
			"--trainer-pubkey", (char *)pub, "--expose", (char *)expose, "--store", "host",
			"--log-level", "info", attach ? "--attach" : NULL, (char *)attach, NULL};
	assert_int_equal(node_proc_spawn(p, tag, argv, log), 0);
}

/* Connects to the publisher's control socket (tessera publish --control),
 * waiting (bounded: 60 s) for the publisher to open it. */
static inline int tu_control_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	for (int i = 0; i < 1200; i++) {
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		assert_true(fd >= 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		close(fd);
		usleep(50000);
	}
	fail_msg("cannot connect to %s", path);
	return -1;
}

/* Sends cmd (a line) on the control socket at path and reads the answer
 * line into reply ("" when the publisher closed without one; 120 s). */
static inline void tu_control(const char *path, const char *cmd, char *reply, size_t len)
{
	int fd = tu_control_connect(path);
	size_t n = 0;
	struct pollfd p = {.fd = fd, .events = POLLIN};

	assert_int_equal(write(fd, cmd, strlen(cmd)), (ssize_t)strlen(cmd));
	while (n + 1 < len && poll(&p, 1, 120000) == 1 && read(fd, reply + n, 1) == 1 &&
	       reply[n] != '\n')
		n++;
	reply[n] = 0;
	close(fd);
}

/* "export" on the control socket at path; wants "published v ..." (120 s). */
static inline void tu_control_export(const char *path, uint64_t v)
{
	char reply[256], want[64];

	tu_control(path, "export\n", reply, sizeof(reply));
	snprintf(want, sizeof(want), "published %llu ", (unsigned long long)v);
	if (strncmp(reply, want, strlen(want)) != 0)
		fail_msg("publisher said '%s', want '%s...'", reply, want);
}

/* Stops a test cluster, nodes first, then the publisher, the client and the
 * tracker; removes its directory unless TESSERA_TEST_KEEP is set (then says
 * where it is). */
static inline void tu_cluster_down(struct node_proc *nodes, size_t n, struct node_proc *publisher,
				   struct trk_client *trk, struct node_proc *tracker,
				   struct proto_model *m, const char *dir)
{
	for (size_t i = 0; i < n; i++)
		node_proc_stop(&nodes[i], 5000);
	node_proc_stop(publisher, 5000);
	trk_client_free(trk);
	node_proc_stop(tracker, 5000);
	proto_model_fini(m);
	if (dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(dir);
	else if (dir[0] != 0)
		print_message("kept %s\n", dir);
}

/* The tracker's JSON answer to GET path (a reference the caller drops),
 * or NULL when it did not answer 200. */
static inline json_t *tu_get_json(struct trk_client *trk, const char *path)
{
	struct trk_reply r;
	json_t *j = NULL;

	if (trk_client_call(trk, "GET", path, NULL, NULL, 0, &r) == 0 && r.status == 200)
		j = json_incref(r.json);
	trk_reply_fini(&r);
	return j;
}

/* The version replica name is active on, as the tracker says (0: none or
 * no answer). */
static inline uint64_t tu_replica_active(struct trk_client *trk, const char *name)
{
	char path[128];
	json_t *j;
	uint64_t v;

	snprintf(path, sizeof(path), TRK_API "/replicas/%s", name);
	j = tu_get_json(trk, path);
	v = j != NULL ? (uint64_t)json_integer_value(json_object_get(j, "active")) : 0;
	json_decref(j);
	return v;
}

/* Waits up to ms until replica name is active on exactly v. */
static inline bool tu_wait_active(struct trk_client *trk, const char *name, uint64_t v, int ms)
{
	for (int w = 0; w < ms; w += 50) {
		if (tu_replica_active(trk, name) == v)
			return true;
		usleep(50000);
	}
	return false;
}

/* Whether the tracker's status says replica name's rank reports version v
 * in state ("verified", "active", ...). */
static inline bool tu_rank_is(struct trk_client *trk, const char *name, uint32_t rank, uint64_t v,
			      const char *state)
{
	json_t *st = tu_get_json(trk, TRK_API "/status"), *rep;
	bool is = false;
	size_t i;

	json_array_foreach(json_object_get(st, "replicas"), i, rep) {
		json_t *rk = json_array_get(json_object_get(rep, "ranks"), rank);
		const char *s = json_string_value(json_object_get(rk, "state"));
		if (strcmp(json_string_value(json_object_get(rep, "replica")) ?: "", name) == 0)
			is = json_integer_value(json_object_get(rk, "version")) == (json_int_t)v &&
			     s != NULL && strcmp(s, state) == 0;
	}
	json_decref(st);
	return is;
}

/* Waits up to ms until the tracker lists n live ranks of replica rep. */
static inline bool tu_wait_alive(struct trk_client *trk, const char *rep, size_t n, int ms)
{
	char path[128];

	snprintf(path, sizeof(path), TRK_API "/replicas/%s", rep);
	for (int w = 0; w < ms; w += 50) {
		json_t *j = tu_get_json(trk, path), *r;
		size_t i, alive = 0;
		json_array_foreach(j != NULL ? json_object_get(j, "ranks") : NULL, i, r)
			alive += json_is_true(json_object_get(r, "alive"));
		json_decref(j);
		if (alive == n)
			return true;
		usleep(50000);
	}
	return false;
}

/* The files of a one-replica run in dir: the publisher's control socket,
 * the model spec of a 4 MiB fixture model (written), the expose directory
 * (made) and the trainer key pair of tests/data. */
struct tu_run_files {
	char sock[512], model[512], expose[512], key[512], pub[512];
};

static inline void tu_run_files(struct tu_run_files *f, const char *dir)
{
	struct proto_model m;
	struct proto_err err;

	snprintf(f->sock, sizeof(f->sock), "%s/ctl.sock", dir);
	snprintf(f->model, sizeof(f->model), "%s/model.json", dir);
	snprintf(f->expose, sizeof(f->expose), "%s/expose", dir);
	tu_trainer_keys(f->key, sizeof(f->key), f->pub, sizeof(f->pub));
	mkdir(f->expose, 0755);
	assert_int_equal(proto_fixture_model(4 << 20, &m, &err), 0);
	tu_write_model(&m, f->model);
	proto_model_fini(&m);
}

/* The files of a cluster started by hand in a new temporary directory:
 * its state directory, model spec (of a fixture model of mb MiB, written
 * and kept in *m), expose directory (made), a fresh cluster key (loaded
 * into cluster_key) and trainer key pair, and the publisher's control
 * socket. */
struct tu_hand {
	char dir[256], state[512], model[512], expose[512], ckey[512], key[512], pub[512];
	char sock[512];
	uint8_t cluster_key[PROTO_CLUSTER_KEY_BYTES];
};

static inline void tu_hand_files(struct tu_hand *h, uint64_t mb, struct proto_model *m)
{
	struct proto_err err;

	assert_non_null(tu_mkdtemp(h->dir, sizeof(h->dir)));
	snprintf(h->state, sizeof(h->state), "%s/state", h->dir);
	snprintf(h->model, sizeof(h->model), "%s/model.json", h->dir);
	snprintf(h->expose, sizeof(h->expose), "%s/expose", h->dir);
	snprintf(h->ckey, sizeof(h->ckey), "%s/cluster.key", h->dir);
	snprintf(h->key, sizeof(h->key), "%s/trainer.key", h->dir);
	snprintf(h->pub, sizeof(h->pub), "%s/trainer.pub", h->dir);
	snprintf(h->sock, sizeof(h->sock), "%s/ctl.sock", h->dir);
	mkdir(h->expose, 0755);
	assert_int_equal(proto_keygen(h->key, h->pub, &err), 0);
	assert_int_equal(proto_cluster_keygen(h->ckey, &err), 0);
	assert_int_equal(proto_key_load_cluster(h->ckey, h->cluster_key, &err), 0);
	assert_int_equal(proto_fixture_model(mb << 20, m, &err), 0);
	tu_write_model(m, h->model);
}

/* Starts tessera-tracker of h's cluster (its state, trainer key, cluster
 * key) on listen ("127.0.0.1:0": any port), its log h->dir/tracker-<tag>.log,
 * and writes its URL into url. */
static inline void tu_hand_tracker(struct node_proc *p, const struct tu_hand *h, const char *listen,
				   const char *tag, char *url, size_t cap)
{
	char bin[512], log[600], line[256];

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(log, sizeof(log), "%s/tracker-%s.log", h->dir, tag);
	char *argv[] = {bin, "--listen", (char *)listen, "--state", (char *)h->state,
			"--trainer-pubkey", (char *)h->pub, "--cluster-key", (char *)h->ckey,
			"--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(p, tag, argv, log), 0);
	assert_int_equal(node_proc_wait_line(p, "listening on ", line, sizeof(line), 20000), 0);
	snprintf(url, cap, "%s", line);
}

/* A TCP port on 127.0.0.1 that nothing listens on now. */
static inline int tu_free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* A CA (key and self-signed certificate) named prefix.{key,pem} in dir. */
static inline void tu_make_ca(const char *dir, const char *prefix)
{
	assert_int_equal(tu_sh("cd %s && openssl req -x509 -newkey ec -pkeyopt "
			       "ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=%s-ca "
			       "-keyout %s.key -out %s.pem > openssl.log 2>&1",
			       dir, prefix, prefix, prefix),
			 0);
}

/* A certificate for IP address ip (a server's, or a client's), named
 * prefix.{key,pem} in dir, signed by dir's ca.{key,pem}. */
static inline void tu_make_cert(const char *dir, const char *prefix, const char *ip)
{
	assert_int_equal(tu_sh("cd %s && printf 'subjectAltName=IP:%s\\n' > %s.ext && "
			       "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
			       "-subj /CN=tracker -keyout %s.key -out %s.csr >> openssl.log 2>&1 && "
			       "openssl x509 -req -in %s.csr -CA ca.pem -CAkey ca.key "
			       "-CAcreateserial -days 2 -extfile %s.ext -out %s.pem "
			       ">> openssl.log 2>&1",
			       dir, ip, prefix, prefix, prefix, prefix, prefix, prefix),
			 0);
}

#endif
