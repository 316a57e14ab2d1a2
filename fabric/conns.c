/* Connections to a tcp endpoint's own port: bounded in count, per address and in the handshake. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_data_segs_out (glibc's lacks it) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"
#include "proto/params.h"

/*
 * The tcp provider accepts every connection to the endpoint's port and
 * keeps it until the peer sends its connection request; rxm then accepts
 * every request. Neither has a limit (libfabric 1.17 offers no setting for
 * one), so a stranger could hold a descriptor per connection, forever. The
 * sockets are the provider's, but they are this process's descriptors: a
 * sweep looks at those whose local port is the endpoint's (outgoing
 * connections leave from other ports) and shuts down the ones over the
 * bounds; the provider then reads the end of the stream and frees them
 * itself (nothing is closed under its feet).
 *
 * A connection we never sent a byte on is one the provider has not
 * answered: its handshake is not done (a malformed request is refused at
 * once by the provider). Such connections are the first to go, the oldest
 * of the busiest address first; answered ones go only when an address, or
 * everyone together, holds more than its bound, the longest idle first.
 */

#define TCP_STATE_ESTABLISHED 1 /* tcpi_state (the kernel's TCP_ESTABLISHED) */
#define SWEEP_LOG_MS 10000 /* one line per this long while connections are shed */

struct conn {
	int fd;
	uint8_t addr[16]; /* the peer's address (IPv4 as mapped IPv6) */
	bool pending;     /* we never answered it: the handshake is not done */
	bool shed;
	uint32_t idle_ms; /* since the peer last sent anything (or connected) */
};

struct group {
	size_t start, end, next; /* [start, end) in the sorted array; next: first not shed */
	size_t live, pend;
};

static void addr_bytes(const struct sockaddr_storage *ss, uint8_t out[16])
{
	memset(out, 0, 16);
	if (ss->ss_family == AF_INET6) {
		memcpy(out, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
	} else {
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
	}
}

static void addr_str(const uint8_t a[16], char *buf, size_t cap)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

	if (memcmp(a, v4, 12) == 0)
		inet_ntop(AF_INET, a + 12, buf, (socklen_t)cap);
	else
		inet_ntop(AF_INET6, a, buf, (socklen_t)cap);
}

/* The connection on fd if it is an established TCP connection to port. */
static bool read_conn(int fd, int family, uint16_t port, struct conn *c)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	struct tcp_info ti;
	socklen_t tlen = sizeof(ti);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || ss.ss_family != family)
		return false;
	if (ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
				    : ((struct sockaddr_in6 *)&ss)->sin6_port) != port)
		return false;
	len = sizeof(ss);
	if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) /* the listener */
		return false;
	memset(&ti, 0, sizeof(ti));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &tlen) != 0 || ti.tcpi_state != TCP_STATE_ESTABLISHED)
		return false;
	*c = (struct conn){.fd = fd, .idle_ms = ti.tcpi_last_data_recv};
	addr_bytes(&ss, c->addr);
	/* tcpi_data_segs_out (Linux 4.6) follows tcpi_last_data_recv's block;
	 * a kernel too old to fill it reads 0 and no connection counts as
	 * answered: the handshake deadline then closes idle ones too. */
	c->pending = tlen < offsetof(struct tcp_info, tcpi_data_segs_out) + sizeof(uint32_t) ||
		     ti.tcpi_data_segs_out == 0;
	return true;
}

static int conn_cmp(const void *pa, const void *pb)
{
	const struct conn *a = pa, *b = pb;
	int r = memcmp(a->addr, b->addr, 16);

	if (r != 0)
		return r;
	if (a->pending != b->pending)
		return a->pending ? -1 : 1;
	return a->idle_ms > b->idle_ms ? -1 : a->idle_ms < b->idle_ms;
}

/* Sheds the next connection of g, which has one live (its pending ones
 * come first, the longest idle first); returns whether it was pending. */
static bool shed_next(struct conn *v, struct group *g)
{
	struct conn *c;

	while (v[g->next].shed)
		g->next++;
	c = &v[g->next++];
	c->shed = true;
	g->live--;
	g->pend -= c->pending;
	return c->pending;
}

/* The group holding the most live connections (with one pending when
 * pending_only), or NULL. */
static struct group *busiest(struct group *g, size_t ng, bool pending_only)
{
	struct group *best = NULL;

	for (size_t i = 0; i < ng; i++)
		if ((pending_only ? g[i].pend > 0 : g[i].live > 0) &&
		    (best == NULL || g[i].live > best->live))
			best = &g[i];
	return best;
}

/* Collects the established connections to the endpoint's port. Returns
 * their count, or -1 when /proc/self/fd cannot be read (or out of memory). */
static ssize_t collect(int family, uint16_t port, struct conn **out)
{
	DIR *d = opendir("/proc/self/fd");
	struct conn *v = NULL, c;
	size_t n = 0, cap = 0;
	struct dirent *de;

	*out = NULL;
	if (d == NULL)
		return -1;
	while ((de = readdir(d)) != NULL) {
		char *end;
		long fd = strtol(de->d_name, &end, 10);

		if (*end != '\0' || end == de->d_name || fd == dirfd(d) || fd < 0 ||
		    !read_conn((int)fd, family, port, &c))
			continue;
		if (n == cap) {
			size_t ncap = cap ? 2 * cap : 64;
			struct conn *nv = realloc(v, ncap * sizeof(*v));
			if (nv == NULL)
				break;
			v = nv;
			cap = ncap;
		}
		v[n++] = c;
	}
	closedir(d);
	*out = v;
	return (ssize_t)n;
}

/* Groups the sorted connections by address; NULL when out of memory. */
static struct group *group_by_addr(struct conn *v, size_t n, size_t *ng)
{
	struct group *g = calloc(n ? n : 1, sizeof(*g));

	*ng = 0;
	if (g == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		if (i == 0 || memcmp(v[i].addr, v[i - 1].addr, 16) != 0)
			g[(*ng)++] = (struct group){.start = i, .next = i};
		struct group *cur = &g[*ng - 1];
		cur->end = i + 1;
		cur->live++;
		cur->pend += v[i].pending;
	}
	return g;
}

static void log_shed(struct fab_ctx *ctx, uint16_t port, size_t late, size_t over,
		     const uint8_t *worst, size_t open, size_t pending)
{
	uint64_t now = proto_now_ns() / 1000000u;
	char who[INET6_ADDRSTRLEN] = "?";

	ctx->stats.conns_shed += late + over;
	if (ctx->conns_log_ms != 0 && now - ctx->conns_log_ms < SWEEP_LOG_MS)
		return;
	if (worst != NULL)
		addr_str(worst, who, sizeof(who));
	LOG_WARN("fabric port %u: closed %llu connection(s) since %s (now %zu, %zu of them in "
		 "the handshake): never completed the handshake in TESSERA_FAB_HANDSHAKE_MS, or over "
		 "TESSERA_FAB_PENDING_MAX, TESSERA_FAB_CONNS_PER_ADDR or TESSERA_FAB_CONNS_MAX; the "
		 "most from %s",
		 port, (unsigned long long)(ctx->stats.conns_shed - ctx->conns_logged),
		 ctx->conns_log_ms == 0 ? "start" : "the last such line", open, pending, who);
	ctx->conns_logged = ctx->stats.conns_shed;
	ctx->conns_log_ms = now;
}

void fab__conns_sweep(struct fab_ctx *ctx)
{
	uint64_t deadline = proto_param(PROTO_PARAM_FAB_HANDSHAKE_MS);
	uint64_t pend_max = proto_param(PROTO_PARAM_FAB_PENDING_MAX);
	uint64_t per_addr = proto_param(PROTO_PARAM_FAB_CONNS_PER_ADDR);
	uint64_t all_max = proto_param(PROTO_PARAM_FAB_CONNS_MAX);
	size_t ng = 0, pend = 0, live, late = 0, over = 0;
	struct group *g = NULL, *worst = NULL;
	struct conn *v = NULL;
	uint16_t port = ctx->conns_port;
	ssize_t n;

	if (port == 0)
		return;
	n = collect(ctx->conns_family, port, &v);
	if (n <= 0)
		goto out;
	qsort(v, (size_t)n, sizeof(*v), conn_cmp);
	g = group_by_addr(v, (size_t)n, &ng);
	if (g == NULL)
		goto out;
	live = (size_t)n;
	for (size_t i = 0; i < ng; i++) {
		for (size_t j = g[i].start; j < g[i].end; j++)
			if (v[j].pending && v[j].idle_ms >= deadline) {
				v[j].shed = true;
				g[i].live--;
				g[i].pend--;
				live--;
				late++;
			}
		pend += g[i].pend;
	}
	for (size_t i = 0; i < ng; i++)
		while (g[i].live > per_addr) {
			pend -= shed_next(v, &g[i]);
			live--;
			over++;
			worst = &g[i];
		}
	for (struct group *b; pend > pend_max && (b = busiest(g, ng, true)) != NULL; pend--) {
		shed_next(v, b);
		live--;
		over++;
		worst = b;
	}
	for (struct group *b; live > all_max && (b = busiest(g, ng, false)) != NULL; live--) {
		pend -= shed_next(v, b);
		over++;
		worst = b;
	}
	for (ssize_t i = 0; i < n; i++) {
		struct conn now;

		/* Still a connection to our port (another thread may have
		 * closed the descriptor and got its number again since). */
		if (!v[i].shed || !read_conn(v[i].fd, ctx->conns_family, port, &now) ||
		    memcmp(now.addr, v[i].addr, 16) != 0)
			continue;
		if (shutdown(v[i].fd, SHUT_RDWR) != 0)
			LOG_DEBUG("fabric port %u: shutdown(%d): %s", port, v[i].fd, strerror(errno));
	}
	ctx->stats.conns_open = live;
	ctx->stats.conns_pending = pend;
	if (late + over > 0)
		log_shed(ctx, port, late, over, worst ? v[worst->start].addr : v[0].addr, live, pend);
	free(g);
	free(v);
	return;
out:
	ctx->stats.conns_open = ctx->stats.conns_pending = 0;
	free(v);
}
