/* Trackers on etcd, with the real programs on loopback: a three-member etcd
 * cluster, two trackers sharing it (--store), a publisher exporting a
 * version every 1.5 s and a tp2 and a tp1 replica, all given both tracker
 * URLs. While versions flow the test kills the leading tracker (SIGKILL),
 * then one etcd member, then starts both again: no version is lost or
 * renumbered (the chain the trackers list is 1..N, each version with the
 * digest first seen), both replicas keep activating, the publisher never
 * stops, and the longest gaps in publishing and in activation are
 * reported. The store checks: a tracker refuses a store of another cluster
 * and an empty store its state directory remembers. Skipped, saying so,
 * when etcd is not installed. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"
#include "tracker/server/store.h"
#include "tracker/wire/etcd.h"

#define WAIT_MS 120000 /* generous: the machine is shared and slow */
#define MEMBERS 3
#define MAX_V 4096

struct env {
	struct tu_hand h;
	struct proto_model m;
	int client_port[MEMBERS], peer_port[MEMBERS];
	char endpoints[200], store[260];
	struct node_proc etcd[MEMBERS];
	char listen[2][64], url[2][256], urls[520];
	struct node_proc trk[2], publisher, nodes[3];
	struct trk_client *c; /* to both trackers, as the nodes are */
	/* What the test saw: each version's digest when first listed, the
	 * newest version and each replica's active version, and when each
	 * last moved. */
	char digest[MAX_V][65];
	uint64_t latest, active[2];
	uint64_t latest_ms, active_ms[2], gap_publish_ms, gap_active_ms[2];
};

static bool have_etcd(void)
{
	return system("command -v etcd >/dev/null 2>&1") == 0;
}

/* etcd's full path: node_proc_spawn execs argv[0] as given. */
static void etcd_path(char *path, size_t cap)
{
	FILE *w = popen("command -v etcd", "r");

	assert_non_null(w);
	assert_non_null(fgets(path, (int)cap, w));
	pclose(w);
	path[strcspn(path, "\n")] = 0;
}

static void start_member(struct env *e, int i)
{
	char name[8], data[600], curl[64], purl[64], cluster[400] = "", log[600];

	for (int k = 0; k < MEMBERS; k++) {
		size_t n = strlen(cluster);
		snprintf(cluster + n, sizeof(cluster) - n, "%se%d=http://127.0.0.1:%d", k ? "," : "",
			 k, e->peer_port[k]);
	}
	snprintf(name, sizeof(name), "e%d", i);
	snprintf(data, sizeof(data), "%s/etcd-%d", e->h.dir, i);
	snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", e->client_port[i]);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", e->peer_port[i]);
	snprintf(log, sizeof(log), "%s/etcd-%d.log", e->h.dir, i);
	char path[256];
	etcd_path(path, sizeof(path));
	char *argv[] = {path, "--name", name, "--data-dir", data, "--listen-client-urls", curl,
			"--advertise-client-urls", curl, "--listen-peer-urls", purl,
			"--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
			"--initial-cluster-state", "new", "--initial-cluster-token", e->h.dir,
			"--log-level", "warn", "--logger", "zap", NULL};
	assert_int_equal(node_proc_spawn(&e->etcd[i], name, argv, log), 0);
}

/* Whether etcd member i answers GET /health with "true" (it has a leader). */
static bool member_healthy(const struct env *e, int i)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				.sin_port = htons((uint16_t)e->client_port[i])};
	char buf[2048];
	const char req[] = "GET /health HTTP/1.0\r\n\r\n";
	size_t got = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct timeval tv = {2, 0};

	assert_true(fd >= 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
		close(fd);
		return false;
	}
	while (got < sizeof(buf) - 1 && (n = read(fd, buf + got, sizeof(buf) - 1 - got)) > 0)
		got += (size_t)n;
	close(fd);
	buf[got] = 0;
	return strstr(buf, "\"health\":\"true\"") != NULL;
}

/* Waits until every running member says it is healthy. */
static void wait_etcd(const struct env *e)
{
	for (int w = 0; w < WAIT_MS; w += 100) {
		bool all = true;
		for (int i = 0; i < MEMBERS; i++)
			all = all && (e->etcd[i].pid == 0 || member_healthy(e, i));
		if (all)
			return;
		usleep(100000);
	}
	fail_msg("etcd did not become healthy (see %s)", e->h.dir);
}

static void start_tracker(struct env *e, int i)
{
	char bin[512], log[600], line[256], state[600], tag[8];

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(tag, sizeof(tag), "t%d", i);
	snprintf(log, sizeof(log), "%s/tracker-%d.log", e->h.dir, i);
	snprintf(state, sizeof(state), "%s/tracker-%d", e->h.dir, i);
	char *argv[] = {bin, "--listen", e->listen[i], "--store", e->store, "--state", state,
			"--leader-ttl", "2", "--trainer-pubkey", e->h.pub, "--cluster-key", e->h.ckey,
			"--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->trk[i], tag, argv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->trk[i], "listening on ", line, sizeof(line), 30000),
			 0);
	assert_string_equal(line, e->url[i]);
}

static void start_node(struct env *e, int k, const char *replica, const char *rank,
		       const char *layout)
{
	char bin[512], log[600], expose[600], tag[16];

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(tag, sizeof(tag), "%s%s", replica, rank);
	snprintf(log, sizeof(log), "%s/node-%s.log", e->h.dir, tag);
	snprintf(expose, sizeof(expose), "%s/expose-%s", e->h.dir, tag);
	mkdir(expose, 0755);
	char *argv[] = {bin, "--tracker", e->urls, "--replica", (char *)replica, "--rank",
			(char *)rank, "--layout", (char *)layout, "--model", e->h.model,
			"--trainer-pubkey", e->h.pub, "--cluster-key", e->h.ckey, "--expose", expose,
			"--store", "host", "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->nodes[k], tag, argv, log), 0);
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;

	if (!have_etcd()) {
		free(e);
		*state = NULL;
		return 0;
	}
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	tu_hand_files(&e->h, 4, &e->m);
	for (int i = 0; i < MEMBERS; i++) {
		e->client_port[i] = tu_free_port();
		e->peer_port[i] = tu_free_port();
		char one[32];
		snprintf(one, sizeof(one), "%s127.0.0.1:%d", i ? "," : "", e->client_port[i]);
		strncat(e->endpoints, one, sizeof(e->endpoints) - strlen(e->endpoints) - 1);
	}
	snprintf(e->store, sizeof(e->store), "etcd://%s/test", e->endpoints);
	for (int i = 0; i < MEMBERS; i++)
		start_member(e, i);
	wait_etcd(e);
	for (int i = 0; i < 2; i++) {
		snprintf(e->listen[i], sizeof(e->listen[i]), "127.0.0.1:%d", tu_free_port());
		snprintf(e->url[i], sizeof(e->url[i]), "http://127.0.0.1:%s",
			 strchr(e->listen[i], ':') + 1);
	}
	snprintf(e->urls, sizeof(e->urls), "%s,%s", e->url[0], e->url[1]);
	assert_int_equal(trk_client_new(NULL, e->urls, e->h.cluster_key, &e->c, &err), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	if (e == NULL)
		return 0;
	for (int k = 0; k < 3; k++)
		node_proc_stop(&e->nodes[k], 5000);
	node_proc_stop(&e->publisher, 5000);
	for (int i = 0; i < 2; i++)
		node_proc_stop(&e->trk[i], 5000);
	for (int i = 0; i < MEMBERS; i++)
		node_proc_stop(&e->etcd[i], 5000);
	tu_cluster_down(NULL, 0, &e->publisher, e->c, &e->publisher, &e->m, e->h.dir);
	free(e);
	return 0;
}

/* One look through the client (whichever tracker leads): the versions
 * listed, checked against what was seen before, and the replicas' active
 * versions; the gaps since each last moved. */
static void look(struct env *e)
{
	json_t *v = tu_get_json(e->c, TRK_API "/versions?after=0"), *x;
	uint64_t now = proto_wall_ms(), n = 0;
	size_t i;

	json_array_foreach(v != NULL ? json_object_get(v, "versions") : NULL, i, x) {
		uint64_t ver = (uint64_t)json_integer_value(json_object_get(x, "version"));
		const char *d = json_string_value(json_object_get(x, "digest"));
		/* 1..N, no hole, no number reused for other bytes. */
		if (ver != i + 1)
			fail_msg("the chain lists version %" PRIu64 " at place %zu", ver, i + 1);
		assert_true(ver < MAX_V && d != NULL);
		if (e->digest[ver][0] == 0)
			snprintf(e->digest[ver], sizeof(e->digest[ver]), "%s", d);
		else if (strcmp(e->digest[ver], d) != 0)
			fail_msg("version %" PRIu64 " changed digest", ver);
		n = ver;
	}
	json_decref(v);
	if (v != NULL) {
		if (n < e->latest)
			fail_msg("the chain went back from %" PRIu64 " to %" PRIu64, e->latest, n);
		if (n > e->latest) {
			if (e->latest_ms != 0)
				e->gap_publish_ms = PROTO_MAX(e->gap_publish_ms, now - e->latest_ms);
			e->latest = n;
			e->latest_ms = now;
		}
	}
	for (int r = 0; r < 2; r++) {
		uint64_t a = tu_replica_active(e->c, r == 0 ? "A" : "B");
		if (a > e->active[r]) {
			if (e->active_ms[r] != 0)
				e->gap_active_ms[r] = PROTO_MAX(e->gap_active_ms[r], now - e->active_ms[r]);
			e->active[r] = a;
			e->active_ms[r] = now;
		}
	}
}

/* Looks every 100 ms until both replicas are active on v or later. */
static void wait_both(struct env *e, uint64_t v, const char *when)
{
	for (int w = 0; w < WAIT_MS; w += 100) {
		look(e);
		if (e->active[0] >= v && e->active[1] >= v)
			return;
		usleep(100000);
	}
	fail_msg("%s: the replicas did not reach v%" PRIu64 " (A on %" PRIu64 ", B on %" PRIu64
		 "; see %s)", when, v, e->active[0], e->active[1], e->h.dir);
}

static bool healthy(const char *url)
{
	struct trk_client *c = NULL;
	struct trk_reply r;
	bool ok = false;

	if (trk_client_new(NULL, url, NULL, &c, NULL) != 0)
		return false;
	ok = trk_client_call(c, "GET", "/healthz", NULL, NULL, 0, &r) == 0 && r.status == 200;
	trk_reply_fini(&r);
	trk_client_free(c);
	return ok;
}

static void kills(void **state)
{
	struct env *e = *state;
	char bin[512], log[600];
	uint64_t t0, takeover_ms = 0, relearn_ms = 0;

	if (e == NULL) {
		print_message("skipped: etcd is not installed (deploy/install-deps.sh installs it)\n");
		skip();
	}
	start_tracker(e, 0);
	start_tracker(e, 1);
	assert_true(healthy(e->url[0]));
	assert_false(healthy(e->url[1])); /* standing by */

	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->h.dir);
	char *pargv[] = {bin, "publish", "--tracker", e->urls, "--key", e->h.key, "--cluster-key",
			 e->h.ckey, "--synthetic-mb", "4", "--layout", "fsdp2", "--every", "1500",
			 "--log-level", "info", NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	start_node(e, 0, "A", "0", "tp2");
	start_node(e, 1, "A", "1", "tp2");
	start_node(e, 2, "B", "0", "tp1");
	wait_both(e, 2, "before any kill");

	/* The leading tracker dies: the standby takes over. */
	uint64_t at = e->latest;
	node_proc_kill(&e->trk[0]);
	t0 = proto_wall_ms();
	for (int w = 0; w < WAIT_MS && !healthy(e->url[1]); w += 50)
		usleep(50000);
	takeover_ms = proto_wall_ms() - t0;
	assert_true(healthy(e->url[1]));
	/* Soft state: the new leader starts knowing no node; every rank is
	 * back within a heartbeat period or so (lease 6 s, heartbeats every
	 * 2 s). */
	t0 = proto_wall_ms();
	if (!tu_wait_alive(e->c, "A", 2, WAIT_MS) || !tu_wait_alive(e->c, "B", 1, WAIT_MS))
		fail_msg("the ranks did not register at the new leader (see %s)", e->h.dir);
	relearn_ms = proto_wall_ms() - t0;
	wait_both(e, at + 2, "after the leading tracker was killed");

	/* One etcd member dies: the two left are a quorum. */
	at = e->latest;
	node_proc_kill(&e->etcd[0]);
	wait_both(e, at + 2, "after an etcd member was killed");

	/* Both come back; the tracker as a standby. */
	at = e->latest;
	start_member(e, 0);
	wait_etcd(e);
	start_tracker(e, 0);
	wait_both(e, at + 2, "after the restarts");
	assert_false(healthy(e->url[0]));

	/* The leader freezes past its lease (a long GC-like pause, a VM
	 * migration): the standby takes over; woken, the old leader finds its
	 * lease gone and stops (status 3) instead of answering beside it. */
	at = e->latest;
	kill(e->trk[1].pid, SIGSTOP);
	for (int w = 0; w < WAIT_MS && !healthy(e->url[0]); w += 50)
		usleep(50000);
	assert_true(healthy(e->url[0]));
	kill(e->trk[1].pid, SIGCONT);
	for (int w = 0; w < 20000 && node_proc_alive(&e->trk[1]); w += 50)
		usleep(50000);
	assert_false(node_proc_alive(&e->trk[1]));
	char lines[600];
	/* Its tick finds the lease gone, or a write it takes first is refused
	 * by the fence: either way it stops, saying so. */
	snprintf(lines, sizeof(lines), "grep -Eq '(my leader lease has ended|another tracker "
		 "leads the store): stopping' %s/tracker-1.log", e->h.dir);
	assert_int_equal(system(lines), 0);
	wait_both(e, at + 2, "after the frozen leader");

	/* The leader key deleted by hand: the standby takes it, and the
	 * leader that lost it stops rather than lead beside it. */
	at = e->latest;
	start_tracker(e, 1);
	struct trk_etcd_opts eo = {.url = e->store};
	struct trk_etcd *etcd = NULL;
	struct proto_err err;
	assert_int_equal(trk_etcd_new(&eo, &etcd, &err), 0);
	assert_int_equal(trk_etcd_delete(etcd, "leader", &err), 0);
	trk_etcd_free(etcd);
	for (int w = 0; w < 20000 && node_proc_alive(&e->trk[0]); w += 50)
		usleep(50000);
	assert_false(node_proc_alive(&e->trk[0]));
	snprintf(lines, sizeof(lines), "grep -Eq '(the leader key is no longer mine|another "
		 "tracker leads the store).*: stopping' %s/tracker-0.log", e->h.dir);
	assert_int_equal(system(lines), 0);
	wait_both(e, at + 2, "after the leader key was deleted");
	assert_true(node_proc_alive(&e->publisher));
	for (int k = 0; k < 3; k++)
		assert_true(node_proc_alive(&e->nodes[k]));
	print_message("versions 1..%" PRIu64 ", none lost; takeover %" PRIu64 " ms (lease 2 s), "
		      "every rank known again %" PRIu64 " ms later; "
		      "longest gap: publishing %" PRIu64 " ms (every 1500), activation A %" PRIu64
		      " ms, B %" PRIu64 " ms\n", e->latest, takeover_ms, relearn_ms, e->gap_publish_ms,
		      e->gap_active_ms[0], e->gap_active_ms[1]);
}

/* Runs tessera-tracker with args (after --listen 127.0.0.1:0) and returns
 * its exit status, its output's last line in out. */
static int tracker_exit(struct env *e, const char *args, char *out, size_t cap)
{
	char cmd[2048], bin[512];
	FILE *p;

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(cmd, sizeof(cmd), "timeout 30 %s --listen 127.0.0.1:0 %s 2>&1 | tail -n 1; "
		 "exit ${PIPESTATUS[0]}", bin, args);
	char full[2200];
	snprintf(full, sizeof(full), "bash -c '%s'", cmd);
	p = popen(full, "r");
	assert_non_null(p);
	out[0] = 0;
	if (fgets(out, (int)cap, p) == NULL)
		out[0] = 0;
	out[strcspn(out, "\n")] = 0;
	int st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A tracker refuses a store its state directory does not remember, and
 * a store URL that does not parse; the status says one line. */
static void store_checks(void **state)
{
	struct env *e = *state;
	char args[1200], out[600], mem[600];

	if (e == NULL) {
		print_message("skipped: etcd is not installed\n");
		skip();
	}
	snprintf(mem, sizeof(mem), "%s/mem", e->h.dir);
	/* First start: the store of cluster "one" is made, the directory
	 * remembers it (the tracker is stopped at once by timeout). */
	char cmd[2048], bin[512];
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	snprintf(cmd, sizeof(cmd), "%s --listen 127.0.0.1:0 --store etcd://%s/one --state %s "
		 ">%s/one.log 2>&1 & sleep 2; kill $!; wait $!; test -s %s/cluster.id", bin,
		 e->endpoints, mem, e->h.dir, mem);
	assert_int_equal(system(cmd), 0);
	/* Another cluster's store: refused. */
	snprintf(args, sizeof(args), "--store etcd://%s/two --state %s", e->endpoints, mem);
	assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "has no cluster id, but the state directory"));
	/* The directory without --store: not a state of its own. */
	snprintf(args, sizeof(args), "--state %s", mem);
	assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
	if (strstr(out, "belongs to a tracker on the store") == NULL)
		fail_msg("--state alone: '%s'", out);
	/* Another cluster key than the store's first tracker used: refused. */
	snprintf(args, sizeof(args), "--store etcd://%s/one --cluster-key %s", e->endpoints,
		 e->h.ckey);
	assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
	if (strstr(out, "give every tracker of a store the same --cluster-key") == NULL)
		fail_msg("another cluster key: '%s'", out);
	/* Bad URLs: one line, status 2, before anything starts. */
	static const char *const bad[] = {"http://127.0.0.1:1", "etcd://", "etcd://h:1/a/b",
					  "etcd://127.0.0.1:99999", "etcd://127.0.0.1:1/"};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		snprintf(args, sizeof(args), "--store %s", bad[i]);
		assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
		if (strstr(out, "--store") == NULL)
			fail_msg("--store %s: %s", bad[i], out);
	}
}

/* etcds:// with client certificates: an etcd member that asks for them
 * serves a tracker that presents one, and refuses one that does not, which
 * exits in one line naming the flags to check. */
static void tls_store(void **state)
{
	struct env *e = *state;
	char path[256] = "", dir[300], curl[64], purl[64], cluster[100], data[400], log[400];
	char args[1400], out[600];
	struct node_proc member = {0};
	int cp = tu_free_port(), pp = tu_free_port();

	if (e == NULL) {
		print_message("skipped: etcd is not installed\n");
		skip();
	}
	snprintf(dir, sizeof(dir), "%s/tls", e->h.dir);
	mkdir(dir, 0755);
	tu_make_ca(dir, "ca");
	tu_make_cert(dir, "server", "127.0.0.1");
	tu_make_cert(dir, "client", "127.0.0.1");
	etcd_path(path, sizeof(path));
	snprintf(curl, sizeof(curl), "https://127.0.0.1:%d", cp);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", pp);
	snprintf(cluster, sizeof(cluster), "s=%s", purl);
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(log, sizeof(log), "%s/etcd.log", dir);
	char cert[400], key[400], ca[400];
	snprintf(cert, sizeof(cert), "%s/server.pem", dir);
	snprintf(key, sizeof(key), "%s/server.key", dir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
	char *argv[] = {path, "--name", "s", "--data-dir", data, "--listen-client-urls", curl,
			"--advertise-client-urls", curl, "--listen-peer-urls", purl,
			"--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
			"--cert-file", cert, "--key-file", key, "--client-cert-auth",
			"--trusted-ca-file", ca, "--logger", "zap", "--log-level", "warn", NULL};
	assert_int_equal(node_proc_spawn(&member, "etcd-tls", argv, log), 0);
	/* With the client certificate: it serves (until timeout stops it). */
	snprintf(args, sizeof(args), "--store etcds://127.0.0.1:%d/tls --etcd-ca %s "
		 "--etcd-cert %s/client.pem --etcd-key %s/client.key", cp, ca, dir, dir);
	char cmd[2000], bin[512];
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	int ok = 1;
	for (int t = 0; t < 100 && ok != 0; t++) {
		snprintf(cmd, sizeof(cmd), "timeout 3 %s --listen 127.0.0.1:0 %s 2>&1 | "
			 "grep -q 'leading the trackers'", bin, args);
		if ((ok = system(cmd)) != 0)
			usleep(200000); /* the member may still be starting */
	}
	assert_int_equal(ok, 0);
	/* Without it: refused in one line, naming the flags. */
	snprintf(args, sizeof(args), "--store etcds://127.0.0.1:%d/tls --etcd-ca %s", cp, ca);
	assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
	if (strstr(out, "check --etcd-ca, --etcd-cert and --etcd-key") == NULL)
		fail_msg("without a client certificate: '%s'", out);
	/* A plain etcd:// URL with certificates is refused before anything. */
	snprintf(args, sizeof(args), "--store etcd://127.0.0.1:%d/tls --etcd-ca %s", cp, ca);
	assert_int_not_equal(tracker_exit(e, args, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "want an etcds:// store"));
	node_proc_stop(&member, 5000);
}

/* The fence, against the real etcd: a write under a lease that no longer
 * holds the leader key is refused (-EPERM), whatever the key written. */
static void fence(void **state)
{
	struct env *e = *state;
	struct trk_etcd_opts o = {.url = e != NULL ? e->store : ""};
	struct trk_etcd *c = NULL;
	struct trk_store *st = NULL;
	struct proto_err err;
	int64_t a = 0, b = 0;

	if (e == NULL) {
		print_message("skipped: etcd is not installed\n");
		skip();
	}
	assert_int_equal(trk_etcd_new(&o, &c, &err), 0);
	assert_int_equal(trk__store_open_etcd(c, &st, &err), 0);
	assert_int_equal(trk_etcd_lease_grant(c, 30, &a, &err), 0);
	assert_int_equal(trk_etcd_lease_grant(c, 30, &b, &err), 0);
	struct trk_etcd_if new_only = {.absent = true};
	assert_int_equal(trk_etcd_put_if(c, "leader", "a", 1, a, &new_only, &err), 0);
	assert_int_equal(trk_etcd_put_if(c, "leader", "b", 1, b, &new_only, &err), -EEXIST);
	trk__store_fence(st, "leader", a);
	assert_int_equal(trk__store_put(st, "k1", "x", 1, &err), 0);
	assert_int_equal(trk__store_create(st, "k2", "x", 1, &err), 0);
	assert_int_equal(trk__store_create(st, "k2", "y", 1, &err), -EEXIST);
	/* a's lease ends; b leads. */
	assert_int_equal(trk_etcd_lease_revoke(c, a, &err), 0);
	assert_int_equal(trk_etcd_put_if(c, "leader", "b", 1, b, &new_only, &err), 0);
	assert_int_equal(trk__store_put(st, "k1", "z", 1, &err), -EPERM);
	assert_non_null(strstr(err.msg, "no longer held"));
	assert_int_equal(trk__store_create(st, "k3", "z", 1, &err), -EPERM);
	uint8_t *v = NULL;
	size_t n = 0;
	assert_int_equal(trk__store_get(st, "k1", 16, &v, &n, &err), 0);
	assert_memory_equal(v, "x", 1);
	free(v);
	assert_int_equal(trk__store_get(st, "k3", 16, &v, &n, &err), -ENOENT);
	trk__store_fence(st, "leader", b);
	assert_int_equal(trk__store_put(st, "k1", "w", 1, &err), 0);
	trk__store_free(st);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(store_checks, setup, teardown),
		cmocka_unit_test_setup_teardown(tls_store, setup, teardown),
		cmocka_unit_test_setup_teardown(fence, setup, teardown),
		cmocka_unit_test_setup_teardown(kills, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
