/* Fabric read throughput on loopback, against a plain TCP socket copy of the same bytes. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "proto/util.h"

#define MiB ((size_t)1 << 20)
#define MAX_REPS 32

struct cfg {
	size_t region;   /* bytes registered on each side */
	size_t total;    /* bytes moved per run */
	size_t chunk;    /* bytes per read */
	int inflight;    /* reads in flight */
	int reps;        /* measured runs (one warm-up run more) */
	bool spin;       /* server busy-polls instead of waiting on its fd */
};

static __attribute__((noreturn)) void die(const char *what, int err)
{
	fprintf(stderr, "bench_fabric: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static void *xalloc(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, len) != 0)
		die("out of memory", ENOMEM);
	return p;
}

static void fill(uint8_t *p, size_t len)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;

	for (size_t i = 0; i + 8 <= len; i += 8) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		memcpy(p + i, &x, 8);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	double s[MAX_REPS];

	memcpy(s, v, sizeof(double) * (size_t)n);
	qsort(s, (size_t)n, sizeof(double), cmp_double);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

/* ---- the serving side: an event-loop-like thread ------------------------ */

struct server {
	struct fab_ctx *ctx;
	bool spin;
	atomic_int stop;
	atomic_int pause; /* during socket runs: stay out of their way */
};

static void *serve(void *arg)
{
	struct server *s = arg;
	int fd = s->spin ? -1 : fab_wait_fd(s->ctx);

	while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
		if (atomic_load_explicit(&s->pause, memory_order_relaxed)) {
			usleep(1000);
			continue;
		}
		if (fab_poll(s->ctx, 0) < 0)
			break;
		if (fd >= 0 && fab_trywait(s->ctx) == 0) {
			struct pollfd p = {.fd = fd, .events = POLLIN};

			poll(&p, 1, 10);
		}
	}
	return NULL;
}

/* ---- the reading side: a window of reads, reposted from callbacks ------- */

struct reader {
	struct fab_ctx *ctx;
	struct fab_mr *dst;
	struct fab_rkey rk;
	fi_addr_t peer;
	const struct cfg *cfg;
	size_t next, done, n;
	int err;
};

struct rop {
	struct fab_op op;
	struct reader *r;
};

static void post_next(struct rop *o);

static void read_done(struct fab_op *op, int status)
{
	struct rop *o = proto_container_of(op, struct rop, op);

	if (status != 0 && o->r->err == 0)
		o->r->err = status;
	o->r->done++;
	post_next(o);
}

static void post_next(struct rop *o)
{
	struct reader *r = o->r;
	size_t i, off;
	int ret;

	if (r->next >= r->n || r->err != 0)
		return;
	i = r->next++;
	off = (i * r->cfg->chunk) % r->cfg->region;
	ret = fab_read(r->ctx, &o->op, r->dst, off,
		       PROTO_MIN(r->cfg->chunk, r->cfg->region - off), r->peer,
		       &r->rk, off, read_done);
	if (ret != 0) {
		r->err = ret;
		r->done++;
	}
}

/* One run: total bytes in chunk-sized reads; returns GB/s. */
static double fabric_run(struct reader *r, struct rop *ops)
{
	uint64_t t0;

	r->next = r->done = 0;
	r->err = 0;
	r->n = r->cfg->total / r->cfg->chunk;
	t0 = proto_now_ns();
	for (int i = 0; i < r->cfg->inflight; i++) {
		ops[i].r = r;
		post_next(&ops[i]);
	}
	while (r->done < r->n && r->err == 0) {
		int ret = fab_poll(r->ctx, 0);

		if (ret < 0)
			die("fab_poll", ret);
		/* Like the node's event loop: sleep on the fd when idle. */
		if (ret == 0 && !r->cfg->spin && fab_trywait(r->ctx) == 0) {
			struct pollfd p = {.fd = fab_wait_fd(r->ctx),
					   .events = POLLIN};

			poll(&p, 1, 10);
		}
	}
	if (r->err != 0)
		die("read", r->err);
	/* The window may still hold reads posted before an error: none here. */
	return (double)(r->n * r->cfg->chunk) / (double)(proto_now_ns() - t0);
}

/* ---- the baseline: the same bytes through a loopback TCP socket --------- */

struct sock_sender {
	int fd;
	const uint8_t *src;
	const struct cfg *cfg;
};

static void *sock_send(void *arg)
{
	struct sock_sender *s = arg;
	size_t sent = 0;

	while (sent < s->cfg->total) {
		size_t off = sent % s->cfg->region;
		ssize_t n = send(s->fd, s->src + off,
				 PROTO_MIN(s->cfg->region - off,
					   s->cfg->total - sent),
				 MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("send", errno);
		}
		sent += (size_t)n;
	}
	return NULL;
}

static double socket_run(const struct cfg *cfg, const uint8_t *src,
			 uint8_t *dst)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t salen = sizeof(sa);
	struct sock_sender s = {.src = src, .cfg = cfg};
	int lfd, cfd, one = 1;
	size_t got = 0;
	pthread_t th;
	uint64_t t0, t1;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(lfd, 1) != 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &salen) != 0)
		die("listen", errno);
	s.fd = socket(AF_INET, SOCK_STREAM, 0);
	if (s.fd < 0 || connect(s.fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		die("connect", errno);
	cfd = accept(lfd, NULL, NULL);
	if (cfd < 0)
		die("accept", errno);
	setsockopt(s.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	t0 = proto_now_ns();
	if (pthread_create(&th, NULL, sock_send, &s) != 0)
		die("pthread_create", errno);
	while (got < cfg->total) {
		size_t off = got % cfg->region;
		ssize_t n = recv(cfd, dst + off,
				 PROTO_MIN(cfg->region - off, cfg->total - got),
				 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			die("recv", n < 0 ? errno : EPIPE);
		got += (size_t)n;
	}
	t1 = proto_now_ns();
	pthread_join(th, NULL);
	close(cfd);
	close(s.fd);
	close(lfd);
	return (double)got / (double)(t1 - t0);
}

/* ---- one provider: fabric and socket runs interleaved ------------------- */

struct result {
	const char *prov;
	double fab[MAX_REPS], sock[MAX_REPS];
	double fab_med, sock_med;
	bool ok;
	char why[512];
};

static void bench_provider(const struct cfg *cfg, struct result *res,
			   uint8_t *src, uint8_t *dst)
{
	const char *node = strcmp(res->prov, "shm") == 0 ? NULL : "127.0.0.1";
	struct proto_err err = {{0}};
	struct fab_ctx *a = NULL, *b = NULL;
	struct fab_mr *smr = NULL, *dmr = NULL;
	struct server srv = {.spin = cfg->spin};
	struct reader rd = {.cfg = cfg};
	struct rop *ops;
	uint8_t name[FAB_ADDR_MAX];
	size_t nlen;
	pthread_t th;
	int ret;

	ops = calloc((size_t)cfg->inflight, sizeof(*ops));
	if (ops == NULL)
		die("calloc", ENOMEM);
	ret = fab_open(res->prov, node, NULL, &a, &err);
	if (ret == 0)
		ret = fab_open(res->prov, node, NULL, &b, &err);
	if (ret != 0) {
		snprintf(res->why, sizeof(res->why), "%s", err.msg);
		goto out;
	}
	if ((ret = fab_getname(b, name, sizeof(name), &nlen)) != 0 ||
	    (ret = fab_av_insert(a, name, nlen, &rd.peer)) != 0 ||
	    (ret = fab_mr_reg(b, src, cfg->region, FAB_MR_REMOTE_READ, &smr)) ||
	    (ret = fab_mr_reg(a, dst, cfg->region, FAB_MR_READ, &dmr)) != 0) {
		snprintf(res->why, sizeof(res->why), "setup: %s", strerror(-ret));
		goto out;
	}
	fab_mr_rkey(smr, &rd.rk);
	rd.ctx = a;
	rd.dst = dmr;
	srv.ctx = b;
	if (pthread_create(&th, NULL, serve, &srv) != 0)
		die("pthread_create", errno);

	memset(dst, 0, cfg->region);
	fabric_run(&rd, ops); /* warm-up: connection, page faults */
	if (memcmp(dst, src, cfg->region) != 0)
		die("fabric copy differs from source", EIO);
	atomic_store(&srv.pause, 1);
	socket_run(cfg, src, dst); /* warm-up */
	for (int i = 0; i < cfg->reps; i++) {
		atomic_store(&srv.pause, 0);
		res->fab[i] = fabric_run(&rd, ops);
		atomic_store(&srv.pause, 1);
		res->sock[i] = socket_run(cfg, src, dst);
	}
	atomic_store(&srv.stop, 1);
	pthread_join(th, NULL);
	res->fab_med = median(res->fab, cfg->reps);
	res->sock_med = median(res->sock, cfg->reps);
	res->ok = true;
out:
	fab_mr_close(dmr);
	fab_mr_close(smr);
	fab_close(b);
	fab_close(a);
	free(ops);
}

static __attribute__((noreturn)) void usage(void)
{
	fprintf(stderr,
		"usage: bench_fabric [--region-mib N] [--total-mib N] "
		"[--chunk-kib N] [--inflight N] [--reps N] [--spin] "
		"[provider...]\n"
		"  defaults: 256 MiB region, 1024 MiB per run, 4096 KiB reads, "
		"8 in flight, 5 runs, providers tcp;ofi_rxm and shm\n");
	exit(2);
}

static uint64_t arg_num(int argc, char **argv, int *i, uint64_t max)
{
	uint64_t v;

	if (*i + 1 >= argc || proto_parse_u64(argv[*i + 1], 1, max, &v) != 0)
		usage();
	(*i)++;
	return v;
}

int main(int argc, char **argv)
{
	struct cfg cfg = {
		.region = 256 * MiB,
		.total = 1024 * MiB,
		.chunk = 4 * MiB,
		.inflight = 8,
		.reps = 5,
	};
	const char *provs[8];
	struct result res[8];
	int nprov = 0;
	uint8_t *src, *dst;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--region-mib") == 0)
			cfg.region = arg_num(argc, argv, &i, 1 << 16) * MiB;
		else if (strcmp(argv[i], "--total-mib") == 0)
			cfg.total = arg_num(argc, argv, &i, 1 << 20) * MiB;
		else if (strcmp(argv[i], "--chunk-kib") == 0)
			cfg.chunk = arg_num(argc, argv, &i, 1 << 20) * 1024;
		else if (strcmp(argv[i], "--inflight") == 0)
			cfg.inflight = (int)arg_num(argc, argv, &i, 1024);
		else if (strcmp(argv[i], "--reps") == 0)
			cfg.reps = (int)arg_num(argc, argv, &i, MAX_REPS);
		else if (strcmp(argv[i], "--spin") == 0)
			cfg.spin = true;
		else if (argv[i][0] == '-' || nprov == 8)
			usage();
		else
			provs[nprov++] = argv[i];
	}
	if (nprov == 0) {
		provs[nprov++] = FAB_PROVIDER_DEFAULT;
		provs[nprov++] = "shm";
	}
	if (cfg.chunk > cfg.region || cfg.region % cfg.chunk != 0 ||
	    cfg.total % cfg.chunk != 0) {
		fprintf(stderr, "bench_fabric: the chunk must divide the region "
				"and the total\n");
		return 2;
	}

	src = xalloc(cfg.region);
	dst = xalloc(cfg.region);
	fill(src, cfg.region);
	printf("fabric read throughput on loopback: %zu MiB per run from a "
	       "%zu MiB registered region, %zu KiB reads, %d in flight, "
	       "server %s; %d runs after one warm-up, each followed by a TCP "
	       "socket copy of the same bytes\n\n",
	       cfg.total / MiB, cfg.region / MiB, cfg.chunk / 1024,
	       cfg.inflight, cfg.spin ? "busy-polls" : "waits on its fd",
	       cfg.reps);
	for (int p = 0; p < nprov; p++) {
		memset(&res[p], 0, sizeof(res[p]));
		res[p].prov = provs[p];
		bench_provider(&cfg, &res[p], src, dst);
	}

	printf("%-16s %-12s", "provider", "what");
	for (int i = 0; i < cfg.reps; i++)
		printf(" run%-3d", i + 1);
	printf("  median GB/s\n");
	for (int p = 0; p < nprov; p++) {
		if (!res[p].ok) {
			printf("%-16s unavailable: %s\n", res[p].prov,
			       res[p].why);
			continue;
		}
		printf("%-16s %-12s", res[p].prov, "fabric read");
		for (int i = 0; i < cfg.reps; i++)
			printf(" %6.2f", res[p].fab[i]);
		printf("  %6.2f\n", res[p].fab_med);
		printf("%-16s %-12s", "", "tcp socket");
		for (int i = 0; i < cfg.reps; i++)
			printf(" %6.2f", res[p].sock[i]);
		printf("  %6.2f\n", res[p].sock_med);
	}
	printf("\n");
	for (int p = 0; p < nprov; p++) {
		if (!res[p].ok) {
			printf("fabric %s: unavailable (%s)\n", res[p].prov,
			       res[p].why);
			continue;
		}
		printf("fabric %s: %.2f GB/s median, tcp socket: %.2f GB/s "
		       "median, ratio %.2f\n",
		       res[p].prov, res[p].fab_med, res[p].sock_med,
		       res[p].fab_med / res[p].sock_med);
	}
	free(dst);
	free(src);
	/* A provider that cannot run here (shm without /dev/shm) is reported,
	 * not fatal; the default provider must work. */
	return res[0].ok ? 0 : 1;
}
