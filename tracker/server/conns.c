/* The tracker's connection guard: a cap on connections, a deadline for a
 * request's headers, and refusals before a body is read. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

/*
 * libevent 2.1's evhttp reads a whole request, body included, before it
 * calls the server, and has no hook between accept and the first request
 * (2.2's newreqcb). So the guard sits on the bytes: it makes each
 * connection's bufferevent (evhttp_set_bevcb) and watches its input buffer
 * (evbuffer_add_cb, which runs as bytes arrive, before evhttp parses them).
 * It copies a request's head until the empty line, judges it
 * (with the verdict the server gave it: the router's) and, when refused, answers itself, throws away what
 * follows and closes: the body is never buffered. It holds a reference on
 * each bufferevent, so it notices when evhttp lets go of one (the callbacks
 * are cleared) and only then closes the socket. It closes a connection with
 * shutdown(): evhttp then reads end-of-file and frees it on its own path.
 *
 * A head that does not parse is answered 400 here, never handed on: read
 * one way by the judge and another by evhttp, it would carry a body past
 * it. Only a signed POST carries a body (trk__head_verdict).
 *
 * Every connection counts against its peer address (an IPv6 /64 as one):
 * over TESSERA_TRACKER_CONNS_PER_ADDR, or over the cap (or out of
 * descriptors), the address that holds the most loses one (shed): idle,
 * still sending a head or refused first, then one whose request is
 * unauthenticated (a body being read, a held watch); a signed request
 * never. A flood closes its own connections, not the one or two a node or
 * publisher holds. Every phase has a deadline: a head TESSERA_HEADER_MS
 * after its first byte (slowloris; a TLS handshake too, from the
 * connection's opening), a body TESSERA_TRACKER_BODY_MS after its head, an
 * answer that long after the longest a request is held
 * (TRK_WAIT_MAX_MS), a refused request's draining REFUSED_LINGER_MS.
 * Clients keep their connection open between requests (HTTP/1.1
 * keep-alive); one that has carried nothing for TESSERA_TRACKER_IDLE_MS is
 * closed. accept() failures are logged once per LOG_EVERY_MS with a count,
 * and pause the listener.
 */

#define SWEEP_MS 100
#define SWEEP_SLICES 10          /* a sweep visits this share of the connections,
				  * so each is looked at every second (tracker/NOTES.md) */
#define SWEEP_MIN 64             /* visited per sweep at least */
#define HEAD_CAP (20u << 10)    /* request line and headers copied, bytes */
#define HEAD_FIRST 1024u         /* first size of a head's copy, doubled as needed
				  * (not HEAD_CAP at once: tracker/NOTES.md) */
#define REFUSED_LINGER_MS 5000   /* time a refused client gets to finish
				  * sending (thrown away) and read */
#define ACCEPT_PAUSE_MS 100      /* listener pause after accept() fails */
#define LOG_EVERY_MS 10000       /* one line per this long for repeats */
#define FD_RESERVE 64            /* descriptors kept for files, logs */

enum conn_state {
	C_IDLE,    /* between requests, nothing received */
	C_HEAD,    /* receiving a request's head */
	C_BODY,    /* head accepted, evhttp reads the body */
	C_REFUSED, /* answered, draining, closing */
};

struct addr_slot {
	uint64_t addr;
	uint32_t n;         /* its live connections */
	unsigned full_pass; /* make_room's pass that found none to close */
	bool used;
};

struct trk_conn {
	struct bufferevent *bev;
	struct trk_conns *g;
	struct trk_conn *prev, *next; /* oldest first */
	enum conn_state state;
	bool closing;       /* shut down, waiting for evhttp to let go */
	bool admitted;      /* its peer address is known */
	bool counted;       /* ... and counted in the address table */
	bool authed;        /* its last judged head was signed */
	bool serving_authed; /* the request with evhttp was */
	int fd;             /* its slot in by_fd, once indexed; -1 before */
	uint64_t addr;      /* the peer's address, folded to 64 bits */
	uint64_t opened_ms, head_ms, refused_ms;
	uint64_t body_ms;   /* its last head was judged (C_BODY from then) */
	uint64_t serve_ms;  /* the request with evhttp reached it */
	uint64_t active_ms; /* bytes last came in, or last seen busy */
	uint64_t drained, declared; /* refused: body bytes thrown away, and
				     * what its head declared */
	size_t head_end;    /* where the judged head ended in the input */
	bool answered;      /* refused: the answer is written */
	bool serving;       /* a request of it is with evhttp, not yet all answered */
	bool answer_now;    /* refused: answered at once, not after the body */
	bool background;    /* it carries a held watch: at the low priority */
	int code;           /* refused: the answer */
	char msg[300];
	uint8_t *head;      /* headcap bytes while receiving a head */
	size_t headlen, headcap;
	/* Tracing (TESSERA_TRACKER_TRACE): when the current request's head
	 * began to arrive, reached the tracker, and was answered (ns). */
	uint64_t head_ns, req_head_ns, req_ns, done_ns;
};

struct trk_conns {
	struct trk_server *s;
	trk__head_verdict_fn verdict;
	struct evconnlistener *lev;
	struct event *sweep_ev, *resume_ev, *admit_ev;
	struct trk_conn *head, *tail;
	struct trk_conn *cursor; /* where the next sweep starts (NULL: head) */
	/* The connections by socket: a request finds its connection in O(1)
	 * (thousands are open at once, one per node's held watch). A socket
	 * stays open until conn_free, so a descriptor names one connection. */
	struct trk_conn **by_fd;
	size_t nfd;
	size_t n, cap;
	size_t live; /* n less those closing */
	size_t per_addr; /* connections one address may hold */
	/* Live connections by peer address (open addressing; an address
	 * whose count fell to 0 keeps its slot until the table is rebuilt). */
	struct addr_slot *addrs;
	size_t addrs_cap, addrs_used;
	unsigned room_pass; /* make_room's current pass */
	uint64_t header_ms, idle_ms, body_ms;
	/* Counters for /metrics and the rate-limited log. */
	uint64_t accepted, evicted, slow, refused_heads, idle, slow_body, per_addr_closed;
	uint64_t accept_errors, accept_errors_logged, last_log_ms;
	struct trk_conns *next_guard; /* guards, by listener */
	int low_pri;             /* held watches' connections' priority (0: none) */
	int norm_pri;            /* the base's default, everything else's */
	FILE *trace;             /* TESSERA_TRACKER_TRACE, or NULL */
	struct event *lag_ev;    /* tracing: the loop's own lateness */
	uint64_t lag_due_ns;
};

static uint64_t now_ms(void)
{
	return proto_now_ns() / 1000000u;
}

static void conn_unlink(struct trk_conns *g, struct trk_conn *c)
{
	if (g->cursor == c)
		g->cursor = c->next;
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		g->head = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	else
		g->tail = c->prev;
	g->n--;
}

/* Enters c under its socket once the socket is set; a failure to grow the
 * index leaves c unindexed (found by walking the list). */
static void conn_index(struct trk_conns *g, struct trk_conn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	if (c->fd >= 0 || fd < 0)
		return;
	if ((size_t)fd >= g->nfd) {
		size_t n = PROTO_MAX(g->nfd * 2, (size_t)fd + 1);
		struct trk_conn **t = realloc(g->by_fd, n * sizeof(*t));
		if (t == NULL)
			return;
		memset(t + g->nfd, 0, (n - g->nfd) * sizeof(*t));
		g->by_fd = t;
		g->nfd = n;
	}
	g->by_fd[fd] = c;
	c->fd = fd;
	/* Answers go out as written: libevent writes at most 16 KiB at a
	 * time, and with Nagle the rest of a larger answer waits for the
	 * client's delayed ACK (tracker/NOTES.md). */
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static size_t addr_hash(uint64_t addr, size_t cap)
{
	return (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 24) & (cap - 1);
}

/* Rebuilds the address table at cap slots (a power of two), dropping the
 * addresses that hold nothing. -ENOMEM leaves it unchanged. */
static int addrs_rebuild(struct trk_conns *g, size_t cap)
{
	struct addr_slot *t = calloc(cap, sizeof(*t));

	if (t == NULL)
		return -ENOMEM;
	g->addrs_used = 0;
	for (size_t i = 0; i < g->addrs_cap; i++) {
		size_t j;

		if (!g->addrs[i].used || g->addrs[i].n == 0)
			continue;
		for (j = addr_hash(g->addrs[i].addr, cap); t[j].used; j = (j + 1) & (cap - 1))
			;
		t[j] = g->addrs[i];
		g->addrs_used++;
	}
	free(g->addrs);
	g->addrs = t;
	g->addrs_cap = cap;
	return 0;
}

/* addr's slot; with add, made when absent (NULL: out of memory). */
static struct addr_slot *addr_slot(struct trk_conns *g, uint64_t addr, bool add)
{
	size_t i;

	if (add && 2 * (g->addrs_used + 1) > g->addrs_cap) {
		size_t cap = 64;

		while (cap < 4 * (g->live + 1))
			cap *= 2;
		if (addrs_rebuild(g, cap) != 0)
			return NULL;
	}
	if (g->addrs_cap == 0)
		return NULL;
	for (i = addr_hash(addr, g->addrs_cap); g->addrs[i].used;
	     i = (i + 1) & (g->addrs_cap - 1))
		if (g->addrs[i].addr == addr)
			return &g->addrs[i];
	if (!add)
		return NULL;
	g->addrs[i].used = true;
	g->addrs[i].addr = addr;
	g->addrs_used++;
	return &g->addrs[i];
}

/* c no longer counts against its address (it closes). */
static void addr_uncount(struct trk_conns *g, struct trk_conn *c)
{
	struct addr_slot *a = c->counted ? addr_slot(g, c->addr, false) : NULL;

	if (a != NULL && a->n > 0)
		a->n--;
	c->counted = false;
}

static void conn_free(struct trk_conns *g, struct trk_conn *c)
{
	if (!c->closing) {
		g->live--;
		addr_uncount(g, c);
	}
	if (c->fd >= 0 && (size_t)c->fd < g->nfd && g->by_fd[c->fd] == c)
		g->by_fd[c->fd] = NULL;
	conn_unlink(g, c);
	/* evhttp has freed it: ours is the last reference; this closes the
	 * socket. */
	bufferevent_decref(c->bev);
	free(c->head);
	free(c);
}

/* Makes evhttp drop the connection: it reads end-of-file and frees it. */
static void conn_close(struct trk_conn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	if (c->closing)
		return;
	c->closing = true;
	c->g->live--;
	addr_uncount(c->g, c);
	if (fd >= 0)
		shutdown(fd, SHUT_RDWR);
}

/* evhttp clears the callbacks when it frees the bufferevent. */
static bool conn_released(const struct trk_conn *c)
{
	bufferevent_data_cb rd = NULL, wr = NULL;
	bufferevent_event_cb ev = NULL;
	void *arg = NULL;

	bufferevent_getcb(c->bev, &rd, &wr, &ev, &arg);
	return rd == NULL && ev == NULL;
}

/* Between requests and reading: nothing of ours would be lost. (evhttp
 * keeps reading while it holds a request without a body, a long-poll.) */
static bool conn_idle(const struct trk_conn *c)
{
	return c->state == C_IDLE && !c->closing && !c->serving &&
	       (bufferevent_get_enabled(c->bev) & EV_READ);
}

/* How readily c is shed: 0 when nothing of a request would be lost (idle,
 * still sending a head, refused); 1 when its requests are unauthenticated
 * (a body being read, a held watch); 2 never (a signed request); -1 when
 * it is closing already. */
static int conn_rank(const struct trk_conn *c)
{
	if (c->closing)
		return -1;
	if (conn_idle(c) || c->state == C_HEAD || c->state == C_REFUSED)
		return 0;
	if ((!c->serving || !c->serving_authed) && (c->state != C_BODY || !c->authed))
		return 1;
	return 2;
}

static uint64_t peer_addr(const struct trk_conn *c)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	uint64_t h = 0;

	if (getpeername(bufferevent_getfd(c->bev), (struct sockaddr *)&ss,
			&sl) != 0)
		return 0;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
		return 1ull << 32 | in->sin_addr.s_addr;
	}
	if (ss.ss_family == AF_INET6) {
		const uint8_t *b = ((const struct sockaddr_in6 *)&ss)->sin6_addr.s6_addr;
		/* A v4-mapped address is its IPv4 one; else its /64, which one
		 * host is given whole. */
		if (IN6_IS_ADDR_V4MAPPED((const struct in6_addr *)b)) {
			uint32_t v4;
			memcpy(&v4, b + 12, 4);
			return 1ull << 32 | v4;
		}
		for (int i = 0; i < 8; i++)
			h = (h ^ b[i]) * 0x100000001b3ull;
		return h | 1ull << 63;
	}
	return 0;
}

/* The connection of address addr to shed first (conn_rank 0, oldest
 * first, else rank 1), or NULL when it has none to lose. */
static struct trk_conn *victim(struct trk_conns *g, uint64_t addr)
{
	struct trk_conn *c, *unauth = NULL;

	for (c = g->head; c != NULL; c = c->next) {
		if (!c->counted || c->addr != addr)
			continue;
		switch (conn_rank(c)) {
		case 0:
			return c;
		case 1:
			if (unauth == NULL)
				unauth = c;
			break;
		default:
			break;
		}
	}
	return unauth;
}

/* Counts c against its peer address, once its socket is set; sheds one of
 * that address's connections when it holds more than its share. */
static void admit_one(struct trk_conns *g, struct trk_conn *c)
{
	struct addr_slot *a;
	struct trk_conn *v;

	if (c->admitted || c->closing || bufferevent_getfd(c->bev) < 0)
		return;
	c->addr = peer_addr(c);
	c->admitted = true;
	a = addr_slot(g, c->addr, true);
	if (a == NULL)
		return; /* uncounted: the overall cap still holds */
	a->n++;
	c->counted = true;
	if (a->n <= g->per_addr)
		return;
	v = victim(g, c->addr);
	g->per_addr_closed++;
	LOG_DEBUG("an address holds over %zu connections: closing one", g->per_addr);
	conn_close(v != NULL ? v : c);
}

/*
 * Brings the live connections back under the cap. The victims come from
 * the peer address that holds the most connections (victim()): a flood
 * from a few addresses closes its own connections, never those of nodes
 * and publishers that hold one or two. Returns how many it closed.
 */
static size_t make_room(struct trk_conns *g, size_t want_free)
{
	size_t closed = 0;

	for (struct trk_conn *c = g->head; c != NULL; c = c->next)
		admit_one(g, c);
	g->room_pass++;
	while (g->live + want_free > g->cap) {
		struct addr_slot *best = NULL;
		struct trk_conn *v;

		for (size_t i = 0; i < g->addrs_cap; i++) {
			struct addr_slot *a = &g->addrs[i];
			if (a->used && a->n > 0 && a->full_pass != g->room_pass &&
			    (best == NULL || a->n > best->n))
				best = a;
		}
		if (best == NULL)
			break;
		v = victim(g, best->addr);
		if (v == NULL) {
			best->full_pass = g->room_pass; /* all signed: the next address */
			continue;
		}
		conn_close(v);
		closed++;
	}
	return closed;
}

/* Frees the connections evhttp has let go of (closing their sockets). */
static void release(struct trk_conns *g)
{
	struct trk_conn *c, *next;

	for (c = g->head; c != NULL; c = next) {
		next = c->next;
		if (conn_released(c))
			conn_free(g, c);
	}
}

static void admit(evutil_socket_t fd, short what, void *arg)
{
	struct trk_conns *g = arg;

	release(g);
	/* New connections are at the tail. */
	for (struct trk_conn *c = g->tail; c != NULL && !c->admitted; c = c->prev)
		admit_one(g, c);
	if (g->live > g->cap)
		g->evicted += make_room(g, 0);
}

/* Writes a whole small answer straight to the socket: evhttp has not
 * parsed this request and never will. Best effort (a full socket buffer
 * loses it; the connection closes either way). */
static void answer_raw(const struct trk_server *s, struct bufferevent *bev,
		       int code, const char *msg)
{
	evutil_socket_t fd = bufferevent_getfd(bev);
	char body[400], all[800], ep[100] = "";
	int bl, n;

	bl = snprintf(body, sizeof(body), "{\"error\":\"%s\"}\n", msg);
	if (bl < 0 || (size_t)bl >= sizeof(body))
		bl = snprintf(body, sizeof(body), "{\"error\":\"refused\"}\n");
	if (s->auth != NULL)
		snprintf(ep, sizeof(ep), "%s: %s\r\n", TRK_EPOCH_HEADER,
			 trk__auth_epoch(s->auth));
	n = snprintf(all, sizeof(all),
		     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
		     "Cache-Control: no-store\r\nConnection: close\r\n%s"
		     "Content-Length: %d\r\n\r\n%s",
		     code, trk__reason(code), ep, bl, body);
	if (n > 0 && (size_t)n < sizeof(all) &&
	    trk__tls_write_now(bev, all, (size_t)n) == -ENOTSUP)
		(void)send(fd, all, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
	shutdown(fd, SHUT_WR);
}

/* Room for more of c's head: its copy doubles, up to HEAD_CAP. */
static int head_grow(struct trk_conn *c)
{
	size_t cap = c->headcap ? PROTO_MIN(2 * c->headcap, HEAD_CAP) : HEAD_FIRST;
	uint8_t *h = realloc(c->head, cap);

	if (h == NULL)
		return -ENOMEM;
	c->head = h;
	c->headcap = cap;
	return 0;
}

/* Drops c's copy of a head. */
static void head_drop(struct trk_conn *c)
{
	free(c->head);
	c->head = NULL;
	c->headlen = c->headcap = 0;
}

/* Refuses the request whose head was just read. Its body (len bytes, as
 * declared; -2: answered at once: chunked, not a POST, no head to trust)
 * is read and thrown away, never buffered; a POST's answer goes out
 * once the client has sent it all: a libevent client that receives an
 * answer while it is still writing exits ("illegal connection state"). A
 * client that does not finish within REFUSED_LINGER_MS is cut off. */
static void refuse(struct trk_conn *c, int code, const char *msg, int64_t len, bool routine)
{
	struct trk_conns *g = c->g;

	snprintf(c->msg, sizeof(c->msg), "%s", msg);
	for (char *p = c->msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == '"' || *p == '\\')
			*p = ' ';
	proto_log(routine ? PROTO_LOG_DEBUG : PROTO_LOG_INFO, __FILE__, __LINE__,
		  "refused before the body: %d %s", code, c->msg);
	g->refused_heads++;
	g->s->answers[code / 100]++;
	if (code == 401)
		g->s->auth_refused++;
	c->code = code;
	c->state = C_REFUSED;
	c->refused_ms = now_ms();
	c->drained = 0;
	c->answered = false;
	c->declared = (uint64_t)PROTO_MAX(len, 0);
	c->answer_now = len == -2;
	head_drop(c);
}

/* Throws away what is in buf from byte from on (the refused body) and
 * answers once the whole declared body is gone. */
static void drain_refused(struct trk_conn *c, struct evbuffer *buf, size_t from)
{
	size_t len = evbuffer_get_length(buf);

	c->drained += len > from ? len - from : 0;
	evbuffer_drain(buf, len);
	if (c->answered || c->closing)
		return;
	if (c->drained > c->declared && !c->answer_now) {
		conn_close(c); /* more than it declared: not HTTP we speak */
	} else if (c->drained >= c->declared) {
		answer_raw(c->g->s, c->bev, c->code, c->msg);
		c->answered = true;
	}
}

/* A complete head: judge it. Bytes past it are the body's. */
static void judge(struct trk_conn *c)
{
	struct trk_head h;
	char msg[300];
	bool routine;
	int code;

	c->state = C_BODY;
	c->body_ms = now_ms();
	c->authed = false;
	if (trk__head_parse(c->head, c->headlen, &h) != 1) {
		refuse(c, 400, "malformed request head", -2, false);
		return;
	}
	code = c->g->verdict(c->g->s, &h, &c->authed, &routine, msg, sizeof(msg));
	head_drop(c);
	c->declared = (uint64_t)PROTO_MAX(h.content_length, 0);
	if (code != 0)
		refuse(c, code, msg,
		       h.chunked || strcmp(h.method, "POST") != 0 ? -2 : h.content_length, routine);
}

/* Copies bytes of a head as they arrive; stops at the empty line. */
static void take_head(struct trk_conn *c, struct evbuffer *buf, size_t from)
{
	size_t len = evbuffer_get_length(buf);

	while (from < len && (c->state == C_IDLE || c->state == C_HEAD)) {
		struct evbuffer_ptr pos;
		uint8_t chunk[512];
		size_t n = PROTO_MIN(len - from, sizeof(chunk));
		ev_ssize_t got;

		if (c->state == C_IDLE) {
			c->state = C_HEAD;
			c->head_ms = now_ms();
			c->head_ns = c->g->trace != NULL ? proto_now_ns() : 0;
		}
		if (evbuffer_ptr_set(buf, &pos, from, EVBUFFER_PTR_SET) != 0)
			return;
		got = evbuffer_copyout_from(buf, &pos, chunk, n);
		if (got <= 0)
			return;
		for (ev_ssize_t i = 0; i < got; i++) {
			if (c->headlen == HEAD_CAP) {
				c->head_end = from + (size_t)i;
				refuse(c, 431, "request head over 20 KiB", -2, false);
				break;
			}
			if (c->headlen == c->headcap && head_grow(c) != 0) {
				conn_close(c);
				return;
			}
			c->head[c->headlen++] = chunk[i];
			if (trk__head_complete(c->head, c->headlen)) {
				c->head_end = from + (size_t)i + 1;
				judge(c);
				break;
			}
		}
		from += (size_t)got;
	}
}

static void on_input(struct evbuffer *buf, const struct evbuffer_cb_info *info,
		     void *arg)
{
	struct trk_conn *c = arg;

	if (info->n_added == 0 || c->closing)
		return;
	c->active_ms = now_ms();
	conn_index(c->g, c);
	if (c->state == C_REFUSED) {
		drain_refused(c, buf, 0);
		return;
	}
	take_head(c, buf, evbuffer_get_length(buf) - info->n_added);
	/* Bytes past the head never reach evhttp. */
	if (c->state == C_REFUSED)
		drain_refused(c, buf, c->head_end);
	/* A judged request waits for evhttp (behind a held one): what it
	 * may send meanwhile is its body and the next head. */
	else if (c->state == C_BODY &&
		 evbuffer_get_length(buf) > c->head_end + c->declared + HEAD_CAP)
		conn_close(c);
}

static struct bufferevent *new_bev(struct event_base *base, void *arg)
{
	struct trk_conns *g = arg;
	struct bufferevent *bev;
	struct trk_conn *c;

	if (g->s->tls != NULL) {
		bev = trk__tls_server_bev(g->s->tls, base);
		if (bev == NULL)
			return NULL; /* evhttp then closes the connection */
	} else {
		bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
		if (bev == NULL)
			return NULL; /* evhttp makes one itself, unguarded */
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		/* Unguarded but working; caps hold for the others. */
		return bev;
	}
	c->bev = bev;
	c->g = g;
	c->fd = -1;
	c->opened_ms = c->active_ms = now_ms();
	c->authed = c->serving_authed = false;
	bufferevent_incref(bev);
	evbuffer_add_cb(bufferevent_get_input(bev), on_input, c);
	c->prev = g->tail;
	if (g->tail != NULL)
		g->tail->next = c;
	else
		g->head = c;
	g->tail = c;
	g->n++;
	g->live++;
	g->accepted++;
	/* Its socket is set after we return: count it against its address
	 * (with the rest of this accept batch) right after. */
	event_active(g->admit_ev, EV_TIMEOUT, 1);
	return bev;
}

static void sweep(evutil_socket_t fd, short what, void *arg)
{
	struct trk_conns *g = arg;
	uint64_t now = now_ms();
	struct trk_conn *c, *next;
	size_t budget = PROTO_MAX(SWEEP_MIN, (g->n + SWEEP_SLICES - 1) / SWEEP_SLICES);

	if (g->live > g->cap)
		g->evicted += make_room(g, 0);
	for (c = g->cursor != NULL ? g->cursor : g->head; c != NULL && budget > 0;
	     c = next, budget--) {
		next = c->next;
		g->cursor = next;
		if (conn_released(c)) {
			conn_free(g, c);
			continue;
		}
		if (c->state == C_HEAD && now - c->head_ms > g->header_ms) {
			g->slow++;
			LOG_DEBUG("closing a connection whose request head took "
				  "over %llu ms", (unsigned long long)g->header_ms);
			conn_close(c);
		} else if (c->state == C_REFUSED &&
			   now - c->refused_ms > REFUSED_LINGER_MS) {
			conn_close(c);
		} else if (c->state == C_IDLE && now - c->opened_ms > g->header_ms &&
			   trk__tls_handshaking(c->bev)) {
			g->slow++; /* a TLS handshake dribbled: slowloris too */
			conn_close(c);
		} else if ((c->state == C_BODY && !c->serving && now - c->body_ms > g->body_ms) ||
			   (c->serving && now - c->serve_ms > g->body_ms + TRK_WAIT_MAX_MS)) {
			g->slow_body++; /* a body, or an answer's reading, dribbled */
			conn_close(c);
		} else if (!conn_idle(c)) {
			c->active_ms = now; /* a request is being served or held */
		} else if (now - c->active_ms > g->idle_ms) {
			g->idle++;
			conn_close(c);
		}
	}
	if (g->accept_errors > g->accept_errors_logged &&
	    now - g->last_log_ms > LOG_EVERY_MS) {
		LOG_WARN("accept() failed %llu times in the last %llu s "
			 "(descriptors: %zu connections open, cap %zu); "
			 "closing idle connections",
			 (unsigned long long)(g->accept_errors -
					      g->accept_errors_logged),
			 (unsigned long long)((now - g->last_log_ms) / 1000),
			 g->live, g->cap);
		g->accept_errors_logged = g->accept_errors;
		g->last_log_ms = now;
	}
}

static void resume(evutil_socket_t fd, short what, void *arg)
{
	struct trk_conns *g = arg;

	evconnlistener_enable(g->lev);
}

/* A listener's error callback gets the listener's own argument (evhttp's),
 * so guards are found by listener. */
static pthread_mutex_t guards_mu = PTHREAD_MUTEX_INITIALIZER;
static struct trk_conns *guards;

static struct trk_conns *guard_of(struct evconnlistener *lev)
{
	struct trk_conns *g;

	pthread_mutex_lock(&guards_mu);
	for (g = guards; g != NULL && g->lev != lev; g = g->next_guard)
		;
	pthread_mutex_unlock(&guards_mu);
	return g;
}

/* accept() failed (out of descriptors, most likely): without this libevent
 * logs a line per attempt and the listener spins. Pause it, make room. */
static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct trk_conns *g = guard_of(lev);
	struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};

	if (g == NULL)
		return;

	g->accept_errors++;
	g->evicted += make_room(g, 1);
	evconnlistener_disable(lev);
	event_add(g->resume_ev, &tv);
}

/* A request's answer is all written: its connection is idle again. */
static void served(struct evhttp_request *req, void *arg)
{
	struct trk_conn *c = arg;

	c->serving = false;
	c->active_ms = now_ms();
	if (c->state == C_BODY)
		c->body_ms = c->active_ms; /* a pipelined request's turn now */
	if (c->g->trace != NULL) {
		const char *uri = evhttp_request_get_uri(req);
		fprintf(c->g->trace, "R %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %d %s %.40s\n",
			c->req_head_ns, c->req_ns, c->done_ns, proto_now_ns(), c->fd,
			evhttp_request_get_command(req) == EVHTTP_REQ_POST ? "POST" : "GET",
			uri != NULL ? uri : "?");
	}
}

/* req's connection, when indexed (NULL else). */
static struct trk_conn *conn_of(struct trk_conns *g, struct evhttp_request *req)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev =
		evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
	evutil_socket_t fd = bev != NULL ? bufferevent_getfd(bev) : -1;
	struct trk_conn *c = fd >= 0 && (size_t)fd < g->nfd ? g->by_fd[fd] : NULL;

	return c != NULL && c->bev == bev ? c : NULL;
}

void trk__conns_handled(struct trk_conns *g, struct evhttp_request *req)
{
	struct trk_conn *c = g->trace != NULL ? conn_of(g, req) : NULL;

	if (c != NULL)
		c->done_ns = proto_now_ns();
}

void trk__conns_background(struct trk_conns *g, struct evhttp_request *req)
{
	struct trk_conn *c = g != NULL && g->low_pri > 0 ? conn_of(g, req) : NULL;

	/* A TLS bufferevent keeps its priority (libevent sets it only on
	 * socket ones): its watches then wait with the rest. */
	if (c != NULL && bufferevent_priority_set(c->bev, g->low_pri) == 0)
		c->background = true;
}

void trk__conns_trace(struct trk_conns *g, const char *what, uint64_t t0, uint64_t n)
{
	if (g != NULL && g->trace != NULL)
		fprintf(g->trace, "B %s %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", what, t0,
			proto_now_ns(), n);
}

/* Tracing: a 1 ms timer; when it runs late, the loop was busy that long. */
static void lag(evutil_socket_t fd, short what, void *arg)
{
	struct trk_conns *g = arg;

	proto_lag_tick(g->trace, &g->lag_due_ns);
}

void trk__conns_request(struct trk_conns *g, struct evhttp_request *req,
			bool *refused)
{
	struct evhttp_connection *evcon = evhttp_request_get_connection(req);
	struct bufferevent *bev =
		evcon != NULL ? evhttp_connection_get_bufferevent(evcon) : NULL;
	struct trk_conn *c;

	*refused = false;
	if (g == NULL || bev == NULL)
		return;
	evutil_socket_t fd = bufferevent_getfd(bev);
	c = fd >= 0 && (size_t)fd < g->nfd ? g->by_fd[fd] : NULL;
	if (c == NULL || c->bev != bev) {
		for (c = g->tail; c != NULL && c->bev != bev; c = c->prev)
			;
		if (c == NULL)
			return;
		conn_index(g, c);
	}
	if (c->state == C_REFUSED) {
		*refused = true;
		return;
	}
	/* This request is evhttp's now; bytes still in the buffer begin the
	 * next one. The connection is not idle until it is answered (evhttp
	 * frees it, and never calls served, if the connection goes first;
	 * c outlives it: it is freed only once evhttp let go of the socket). */
	c->serving = true;
	c->serving_authed = c->authed;
	c->serve_ms = now_ms();
	if (c->background) {
		c->background = false;
		bufferevent_priority_set(bev, g->norm_pri);
	}
	c->req_head_ns = c->head_ns;
	c->req_ns = g->trace != NULL ? proto_now_ns() : 0;
	c->done_ns = 0;
	evhttp_request_set_on_complete_cb(req, served, c);
	c->state = C_IDLE;
	head_drop(c);
	take_head(c, bufferevent_get_input(bev), 0);
	if (c->state == C_REFUSED)
		drain_refused(c, bufferevent_get_input(bev), c->head_end);
}

void trk__conns_stats(const struct trk_conns *g, struct trk_conns_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (g == NULL)
		return;
	out->open = g->live;
	out->cap = g->cap;
	out->accepted = g->accepted;
	out->evicted = g->evicted;
	out->slow = g->slow;
	out->refused_heads = g->refused_heads;
	out->idle = g->idle;
	out->accept_errors = g->accept_errors;
	out->slow_body = g->slow_body;
	out->per_addr = g->per_addr_closed;
}

int trk__conns_new(struct trk_server *s, trk__head_verdict_fn verdict, struct trk_conns **out)
{
	struct trk_conns *g = calloc(1, sizeof(*g));
	struct timeval tv = {0, SWEEP_MS * 1000};
	struct rlimit rl;
	size_t cap = (size_t)proto_param(PROTO_PARAM_TRACKER_CONNS);

	*out = NULL;
	if (g == NULL)
		return -ENOMEM;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur > 2 * FD_RESERVE && cap > rl.rlim_cur - FD_RESERVE)
		cap = rl.rlim_cur - FD_RESERVE;
	g->s = s;
	g->verdict = verdict;
	g->cap = PROTO_MAX(cap, 2);
	g->header_ms = proto_param(PROTO_PARAM_HEADER_MS);
	g->body_ms = proto_param(PROTO_PARAM_TRACKER_BODY_MS);
	g->per_addr = PROTO_MAX((size_t)proto_param(PROTO_PARAM_TRACKER_CONNS_PER_ADDR), 1);
	g->idle_ms = proto_param(PROTO_PARAM_TRACKER_IDLE_MS);
	g->last_log_ms = now_ms();
	g->lev = evhttp_bound_socket_get_listener(s->sock);
	/* trk_server_new gave the base three priorities, unless it had some:
	 * held watches' connections go to the lowest. */
	if (event_base_get_npriorities(s->base) >= 2)
		g->low_pri = event_base_get_npriorities(s->base) - 1;
	g->norm_pri = event_base_get_npriorities(s->base) / 2;
	g->sweep_ev = event_new(s->base, -1, EV_PERSIST, sweep, g);
	g->resume_ev = evtimer_new(s->base, resume, g);
	g->admit_ev = evtimer_new(s->base, admit, g);
	if (g->sweep_ev == NULL || g->resume_ev == NULL || g->admit_ev == NULL ||
	    g->lev == NULL) {
		trk__conns_free(g);
		return -ENOMEM;
	}
	event_add(g->sweep_ev, &tv);
	if (getenv("TESSERA_TRACKER_TRACE") != NULL &&
	    (g->trace = fopen(getenv("TESSERA_TRACKER_TRACE"), "w")) != NULL) {
		struct timeval ms = {0, 1000};
		/* Its clock against the wall clock of the logs and manifests. */
		fprintf(g->trace, "W %" PRIu64 " %" PRIu64 "\n", proto_now_ns(), proto_wall_ms());
		g->lag_ev = event_new(s->base, -1, EV_PERSIST, lag, g);
		if (g->lag_ev != NULL)
			event_add(g->lag_ev, &ms);
	}
	pthread_mutex_lock(&guards_mu);
	g->next_guard = guards;
	guards = g;
	pthread_mutex_unlock(&guards_mu);
	evconnlistener_set_error_cb(g->lev, on_accept_error);
	evhttp_set_bevcb(s->http, new_bev, g);
	*out = g;
	return 0;
}

void trk__conns_free(struct trk_conns *g)
{
	if (g == NULL)
		return;
	pthread_mutex_lock(&guards_mu);
	for (struct trk_conns **pp = &guards; *pp != NULL; pp = &(*pp)->next_guard)
		if (*pp == g) {
			*pp = g->next_guard;
			break;
		}
	pthread_mutex_unlock(&guards_mu);
	if (g->sweep_ev != NULL)
		event_free(g->sweep_ev);
	if (g->resume_ev != NULL)
		event_free(g->resume_ev);
	if (g->admit_ev != NULL)
		event_free(g->admit_ev);
	if (g->lag_ev != NULL)
		event_free(g->lag_ev);
	if (g->trace != NULL)
		fclose(g->trace);
	/* Run after evhttp_free: every bufferevent is released. */
	while (g->head != NULL)
		conn_free(g, g->head);
	free(g->by_fd);
	free(g->addrs);
	free(g);
}
