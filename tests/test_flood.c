/* A stranger floods a running node and a running publisher with unsolicited
 * tagged messages (raw libfabric, tcp;ofi_rxm, 16 000-byte sends, the
 * attack of issue 12), then with untagged ones and silent TCP connections
 * to their fabric ports (issue 31): their memory and descriptors stay
 * bounded and they keep working. Neither takes fabric messages at all
 * (have-pages are one-sided reads); their sink receives take and drop
 * whatever arrives (fabric/msg.c), and fabric/conns.c closes connections
 * that never complete the provider's handshake. */
#include <errno.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_tagged.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sodium.h>
#include <sys/stat.h>

#include "fabric/fab.h"
#include "proto/fixture.h"
#include "tests/testcluster.h"

#define FLOOD_MSGS 20000
#define FLOOD_BYTES 16000
#define FLOOD_WINDOW 64
/* What a flood may add to a process's resident memory, KiB: a quarter of
 * what it sends (320 MB); without the sink rxm kept all of it. */
#define FLOOD_BOUND_KIB ((long)FLOOD_MSGS * FLOOD_BYTES / 1024 / 4)

/* The stranger: its own fabric, endpoint and address vector. */
struct stranger {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fid_mr *mr;
	uint8_t *buf;
};

static void stranger_open(struct stranger *s)
{
	struct fi_info *hints = fi_allocinfo();
	struct fi_av_attr av = {.type = FI_AV_TABLE};
	struct fi_cq_attr cq = {.format = FI_CQ_FORMAT_TAGGED};

	assert_non_null(hints);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG | FI_TAGGED | FI_SEND;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				      FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(FAB_PROVIDER_DEFAULT);
	assert_int_equal(fi_getinfo(FI_VERSION(1, 9), "127.0.0.1", NULL, 0, hints, &s->info), 0);
	fi_freeinfo(hints);
	assert_int_equal(fi_fabric(s->info->fabric_attr, &s->fabric, NULL), 0);
	assert_int_equal(fi_domain(s->fabric, s->info, &s->domain, NULL), 0);
	assert_int_equal(fi_av_open(s->domain, &av, &s->av, NULL), 0);
	assert_int_equal(fi_cq_open(s->domain, &cq, &s->cq, NULL), 0);
	assert_int_equal(fi_endpoint(s->domain, s->info, &s->ep, NULL), 0);
	assert_int_equal(fi_ep_bind(s->ep, &s->av->fid, 0), 0);
	assert_int_equal(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV), 0);
	assert_int_equal(fi_enable(s->ep), 0);
	s->buf = malloc((size_t)FLOOD_WINDOW * FLOOD_BYTES);
	assert_non_null(s->buf);
	memset(s->buf, 0xab, (size_t)FLOOD_WINDOW * FLOOD_BYTES);
	if (s->info->domain_attr->mr_mode & FI_MR_LOCAL)
		assert_int_equal(fi_mr_reg(s->domain, s->buf, (size_t)FLOOD_WINDOW * FLOOD_BYTES,
					   FI_SEND, 0, 0, 0, &s->mr, NULL),
				 0);
}

static void stranger_close(struct stranger *s)
{
	if (s->mr != NULL)
		fi_close(&s->mr->fid);
	if (s->ep != NULL)
		fi_close(&s->ep->fid);
	if (s->cq != NULL)
		fi_close(&s->cq->fid);
	if (s->av != NULL)
		fi_close(&s->av->fid);
	if (s->domain != NULL)
		fi_close(&s->domain->fid);
	if (s->fabric != NULL)
		fi_close(&s->fabric->fid);
	fi_freeinfo(s->info);
	free(s->buf);
	memset(s, 0, sizeof(*s));
}

/* Sends n messages (tagged or untagged) to the fabric address in hex, at
 * most FLOOD_WINDOW in flight; returns how many completed (60 s at most). */
static long flood_n(struct stranger *s, const char *hex, long count, bool tagged)
{
	uint8_t addr[1024];
	size_t alen = 0;
	fi_addr_t to;
	struct fi_context2 ctx[FLOOD_WINDOW];
	long posted = 0, done = 0, inflight = 0;
	uint64_t end = proto_now_ns() + 60000ull * 1000000u;

	assert_int_equal(sodium_hex2bin(addr, sizeof(addr), hex, strlen(hex), NULL, &alen, NULL),
			 0);
	assert_int_equal(fi_av_insert(s->av, addr, 1, &to, 0, NULL), 1);
	while (done < count && proto_now_ns() < end) {
		struct fi_cq_tagged_entry e[16];
		ssize_t n;

		while (inflight < FLOOD_WINDOW && posted < count) {
			int slot = (int)(posted % FLOOD_WINDOW);
			void *b = s->buf + (size_t)slot * FLOOD_BYTES;
			void *desc = s->mr ? fi_mr_desc(s->mr) : NULL;
			ssize_t rc = tagged ? fi_tsend(s->ep, b, FLOOD_BYTES, desc, to,
						       (uint64_t)posted, &ctx[slot])
					    : fi_send(s->ep, b, FLOOD_BYTES, desc, to, &ctx[slot]);
			if (rc == -FI_EAGAIN)
				break;
			assert_int_equal(rc, 0);
			posted++;
			inflight++;
		}
		n = fi_cq_read(s->cq, e, 16);
		if (n > 0) {
			done += n;
			inflight -= n;
		} else if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(s->cq, &err, 0);
			done++;
			inflight--;
		}
	}
	fi_av_remove(s->av, &to, 1, 0);
	return done;
}

static long flood(struct stranger *s, const char *hex)
{
	return flood_n(s, hex, FLOOD_MSGS, true);
}

/* Resident memory of pid, KiB (-1: unknown). */
static long rss_kib(pid_t pid)
{
	char path[64], line[256];
	long kib = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

struct env {
	char dir[256], url[256], sock[512];
	struct node_proc tracker, node, publisher;
	struct trk_client *trk;
	struct stranger st;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	if (e == NULL || tu_mkdtemp(e->dir, sizeof(e->dir)) == NULL)
		return 1;
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	stranger_close(&e->st);
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	if (getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_FAB_HANDSHAKE_MS");
	free(e);
	return 0;
}

/* The fabric addresses of replica A's node and of the publisher's rank 0,
 * from the sources of v1 (the tracker has no cluster key here). */
static void find_addrs(struct env *e, char *node_hex, char *pub_hex, size_t cap)
{
	struct trk_reply r;
	char path[300];
	const char *digest;
	json_t *src;
	size_t i;

	assert_int_equal(trk_client_call(e->trk, "GET", TRK_API "/layouts", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	digest = json_string_value(
		json_object_get(json_array_get(json_object_get(r.json, "layouts"), 0), "digest"));
	assert_non_null(digest);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=0",
		 digest);
	trk_reply_fini(&r);
	node_hex[0] = pub_hex[0] = 0;
	/* The node offers v1 once it holds it; wait for that (bounded). */
	for (int w = 0; w < 600 && (node_hex[0] == 0 || pub_hex[0] == 0); w++) {
		assert_int_equal(trk_client_call(e->trk, "GET", path, NULL, NULL, 0, &r), 0);
		assert_int_equal(r.status, 200);
		json_array_foreach(json_object_get(r.json, "sources"), i, src) {
			const char *kind = json_string_value(json_object_get(src, "kind"));
			const char *hex = json_string_value(json_object_get(src, "fabric_addr"));
			if (kind != NULL && hex != NULL)
				snprintf(strcmp(kind, "peer") == 0 ? node_hex : pub_hex, cap, "%s",
					 hex);
		}
		trk_reply_fini(&r);
		if (node_hex[0] == 0 || pub_hex[0] == 0)
			usleep(100000);
	}
	assert_true(node_hex[0] != 0 && pub_hex[0] != 0);
}

/* A tracker, a publisher and a node of replica A holding v1; their fabric
 * addresses (hex) and a stranger ready to send. */
static void start(struct env *e, char *node_hex, char *pub_hex, size_t cap)
{
	char bin[512], log[600], state_dir[600];
	struct tu_run_files f;
	struct proto_err err;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_run_files(&f, e->dir);
	snprintf(e->sock, sizeof(e->sock), "%s", f.sock);

	tu_start_tracker(&e->tracker, e->dir, state_dir, f.pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	trk_client_set_timeout(e->trk, 30000);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", f.key, "--synthetic-mb", "4",
			 "--seed", "7", "--layout", "fsdp2", "--control", e->sock, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	tu_start_node(&e->node, e->dir, e->url, "A", "0", "tp1", f.model, f.pub, f.expose, NULL,
		      "node");

	tu_control_export(e->sock, 1);
	assert_true(tu_wait_active(e->trk, "A", 1, 60000));
	find_addrs(e, node_hex, pub_hex, cap);
	stranger_open(&e->st);
}

static struct sockaddr_in sockaddr_of(const char *hex);

static void test_tagged_flood_node_and_publisher(void **state)
{
	struct env *e = *state;
	char node_hex[2100], pub_hex[2100], ip[INET_ADDRSTRLEN];
	long n0, p0, n1, p1, n2, p2;
	struct sockaddr_in sin;

	start(e, node_hex, pub_hex, sizeof(node_hex));
	/* With the tracker on loopback the node binds loopback (the route to
	 * the tracker), not the machine's first interface. */
	sin = sockaddr_of(node_hex);
	inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip));
	fprintf(stderr, "# the node's fabric address: %s\n", ip);
	assert_string_equal(ip, "127.0.0.1");

	n0 = rss_kib(e->node.pid);
	p0 = rss_kib(e->publisher.pid);
	assert_int_equal(flood(&e->st, node_hex), FLOOD_MSGS);
	assert_int_equal(flood(&e->st, pub_hex), FLOOD_MSGS);
	/* Both went on working through it: v2 is published and activated. */
	tu_control_export(e->sock, 2);
	assert_true(tu_wait_active(e->trk, "A", 2, 60000));
	n1 = rss_kib(e->node.pid);
	p1 = rss_kib(e->publisher.pid);
	assert_int_equal(flood(&e->st, node_hex), FLOOD_MSGS);
	assert_int_equal(flood(&e->st, pub_hex), FLOOD_MSGS);
	tu_control_export(e->sock, 3);
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	n2 = rss_kib(e->node.pid);
	p2 = rss_kib(e->publisher.pid);
	fprintf(stderr,
		"# %d unsolicited %d-byte tagged sends per flood (%ld KiB): node RSS %ld -> "
		"%ld -> %ld KiB, publisher RSS %ld -> %ld -> %ld KiB (bound +%ld KiB a flood)\n",
		FLOOD_MSGS, FLOOD_BYTES, (long)FLOOD_MSGS * FLOOD_BYTES / 1024, n0, n1, n2, p0,
		p1, p2, FLOOD_BOUND_KIB);
	assert_true(n0 > 0 && p0 > 0);
	assert_true(n1 - n0 < FLOOD_BOUND_KIB && n2 - n1 < FLOOD_BOUND_KIB);
	assert_true(p1 - p0 < FLOOD_BOUND_KIB && p2 - p1 < FLOOD_BOUND_KIB);
	assert_true(node_proc_alive(&e->node) && node_proc_alive(&e->publisher));
	/* Each says so in a few lines (one per 10 s at most), not one per
	 * message. */
	for (int i = 0; i < 2; i++) {
		const char *name = i == 0 ? "node" : "publisher";
		int lines = tu_sh("exit $(grep -c 'unsolicited message' %s/%s.log)", e->dir, name);
		fprintf(stderr, "# %s logged %d line(s) about dropped messages\n", name, lines);
		assert_true(lines >= 1 && lines < 100);
	}
}

/* A tcp fabric address (hex) as the socket address it is. */
static struct sockaddr_in sockaddr_of(const char *hex)
{
	uint8_t addr[1024];
	struct sockaddr_in sin;
	size_t alen = 0;

	assert_int_equal(sodium_hex2bin(addr, sizeof(addr), hex, strlen(hex), NULL, &alen, NULL),
			 0);
	assert_true(alen >= sizeof(sin));
	memcpy(&sin, addr, sizeof(sin));
	assert_int_equal(sin.sin_family, AF_INET);
	return sin;
}

/* Descriptors open in pid. */
static int fd_count(pid_t pid)
{
	char path[64];
	DIR *d;
	int n = 0;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	assert_non_null(d);
	while (readdir(d) != NULL)
		n++;
	closedir(d);
	return n - 2;
}

#define UNTAGGED_MSGS 4000
#define UNTAGGED_BOUND_KIB ((long)UNTAGGED_MSGS * FLOOD_BYTES / 1024 / 4)
#define SILENT_CONNS 200

/* SILENT_CONNS connections to the fabric address in hex that say nothing. */
static void connect_silent(const char *hex, int *fds)
{
	struct sockaddr_in sin = sockaddr_of(hex);

	for (int i = 0; i < SILENT_CONNS; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		assert_true(fds[i] >= 0);
		int rc = connect(fds[i], (struct sockaddr *)&sin, sizeof(sin));
		assert_true(rc == 0 || errno == EINPROGRESS);
	}
}

/* How many of fds the other end closed; those it did are closed here. */
static int count_closed(int *fds, int n)
{
	int closed = 0;

	for (int i = 0; i < n; i++) {
		char b;
		if (fds[i] >= 0 && recv(fds[i], &b, 1, MSG_DONTWAIT) == 0) {
			close(fds[i]);
			fds[i] = -1;
		}
		closed += fds[i] < 0;
	}
	return closed;
}

static void test_untagged_flood_and_silent_connections(void **state)
{
	struct env *e = *state;
	char node_hex[2100], pub_hex[2100];
	int fds[2][SILENT_CONNS], closed[2] = {0}, d0[2], peak[2] = {0}, d1[2];
	pid_t pid[2];
	long n0, p0, n1, p1;
	uint64_t end;

	/* Inherited by the processes: a silent connection goes in 3 s. */
	setenv("TESSERA_FAB_HANDSHAKE_MS", "3000", 1);
	start(e, node_hex, pub_hex, sizeof(node_hex));
	pid[0] = e->node.pid;
	pid[1] = e->publisher.pid;

	n0 = rss_kib(e->node.pid);
	p0 = rss_kib(e->publisher.pid);
	assert_int_equal(flood_n(&e->st, node_hex, UNTAGGED_MSGS, false), UNTAGGED_MSGS);
	assert_int_equal(flood_n(&e->st, pub_hex, UNTAGGED_MSGS, false), UNTAGGED_MSGS);
	tu_control_export(e->sock, 2);
	assert_true(tu_wait_active(e->trk, "A", 2, 60000));
	n1 = rss_kib(e->node.pid);
	p1 = rss_kib(e->publisher.pid);
	fprintf(stderr, "# %d unsolicited %d-byte untagged sends each (%ld KiB): node RSS %ld -> "
		"%ld KiB, publisher RSS %ld -> %ld KiB (bound +%ld KiB)\n",
		UNTAGGED_MSGS, FLOOD_BYTES, (long)UNTAGGED_MSGS * FLOOD_BYTES / 1024, n0, n1, p0,
		p1, UNTAGGED_BOUND_KIB);
	assert_true(n0 > 0 && p0 > 0);
	assert_true(n1 - n0 < UNTAGGED_BOUND_KIB);
	assert_true(p1 - p0 < UNTAGGED_BOUND_KIB);

	/* Silent connections to both fabric ports: each process closes them
	 * (the handshake deadline, TESSERA_FAB_PENDING_MAX before it) and
	 * gives their descriptors back, and goes on serving. */
	for (int i = 0; i < 2; i++)
		d0[i] = fd_count(pid[i]);
	connect_silent(node_hex, fds[0]);
	connect_silent(pub_hex, fds[1]);
	end = proto_now_ns() + 120000ull * 1000000u;
	while ((closed[0] < SILENT_CONNS || closed[1] < SILENT_CONNS) && proto_now_ns() < end) {
		for (int i = 0; i < 2; i++) {
			closed[i] = count_closed(fds[i], SILENT_CONNS);
			peak[i] = PROTO_MAX(peak[i], fd_count(pid[i]) - d0[i]);
		}
		usleep(50000);
	}
	tu_control_export(e->sock, 3);
	assert_true(tu_wait_active(e->trk, "A", 3, 60000));
	for (int i = 0; i < 2; i++)
		d1[i] = fd_count(pid[i]) - d0[i];
	fprintf(stderr, "# %d silent connections to each fabric port: node closed %d (at most %+d "
		"descriptors, %+d after), publisher closed %d (at most %+d, %+d after)\n",
		SILENT_CONNS, closed[0], peak[0], d1[0], closed[1], peak[1], d1[1]);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(closed[i], SILENT_CONNS);
		assert_true(d1[i] < 16);
	}
	assert_true(node_proc_alive(&e->node) && node_proc_alive(&e->publisher));
	int lines = tu_sh("exit $(grep -c 'fabric port' %s/publisher.log)", e->dir);
	assert_true(lines >= 1 && lines < 100);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_tagged_flood_node_and_publisher, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_untagged_flood_and_silent_connections, setup,
						teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
