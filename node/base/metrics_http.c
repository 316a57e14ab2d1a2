/* /metrics and /healthz on a local port, with libevent's evhttp. */
#include "node/base/metrics_http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>

#include "proto/log.h"
#include "proto/proto.h"

/*
 * The port's guard. A scrape is one small GET answered in microseconds, so
 * the port holds at most CONNS connections at once, each for LIFE_MS at
 * most (a head dribbled a byte at a time included): past CONNS a new
 * connection closes the oldest of the peer address holding the most, so a
 * flood sheds itself and a scraper elsewhere is served. accept() failures
 * pause the listener and are logged once per LOG_EVERY_MS with a count.
 * Connections are closed with shutdown(): evhttp then frees them on its
 * own path; the guard holds a reference on each bufferevent and lets go
 * once evhttp has (its callbacks are cleared).
 */
#define CONNS 64
#define LIFE_MS 10000
#define SWEEP_MS 500
#define ACCEPT_PAUSE_MS 100
#define LOG_EVERY_MS 10000

struct mconn {
	struct mconn *next;
	struct bufferevent *bev;
	uint64_t opened_ms;
};

struct node_metrics_http {
	struct evhttp *http;
	const struct proto_metrics *m;
	char url[300];
	struct mconn *conns;
	size_t live;
	struct evconnlistener *lev;
	struct event *sweep_ev, *resume_ev;
	uint64_t accept_errors, logged_errors, last_log_ms, shed;
};

static uint64_t now_ms(void)
{
	return proto_now_ns() / 1000000u;
}

static bool conn_gone(const struct mconn *c)
{
	bufferevent_data_cb rd = NULL;
	bufferevent_event_cb ev = NULL;

	bufferevent_getcb(c->bev, &rd, NULL, &ev, NULL);
	return rd == NULL && ev == NULL; /* evhttp freed it */
}

static void conn_close(struct mconn *c)
{
	evutil_socket_t fd = bufferevent_getfd(c->bev);

	if (fd >= 0)
		shutdown(fd, SHUT_RDWR);
}

/* Drops the connections evhttp has let go of. */
static void reap(struct node_metrics_http *s)
{
	for (struct mconn **pp = &s->conns; *pp != NULL;) {
		struct mconn *c = *pp;
		if (conn_gone(c)) {
			*pp = c->next;
			bufferevent_decref(c->bev);
			free(c);
			s->live--;
		} else {
			pp = &c->next;
		}
	}
}

static bool same_peer(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
	return true;
}

static void peer_of(const struct mconn *c, struct sockaddr_storage *ss)
{
	socklen_t sl = sizeof(*ss);

	memset(ss, 0, sizeof(*ss));
	if (bufferevent_getfd(c->bev) < 0 ||
	    getpeername(bufferevent_getfd(c->bev), (struct sockaddr *)ss, &sl) != 0)
		ss->ss_family = AF_UNSPEC;
}

/* Closes the oldest connection of the peer address holding the most. */
static void shed_one(struct node_metrics_http *s)
{
	struct sockaddr_storage peers[CONNS + 1], mine;
	struct mconn *victim = NULL;
	size_t i = 0, best = 0;

	for (struct mconn *c = s->conns; c != NULL && i < CONNS + 1; c = c->next, i++)
		peer_of(c, &peers[i]);
	i = 0;
	for (struct mconn *c = s->conns; c != NULL && i < CONNS + 1; c = c->next, i++) {
		size_t n = 0;
		mine = peers[i];
		for (size_t j = 0; j < CONNS + 1 && j < s->live; j++)
			n += same_peer(&mine, &peers[j]);
		/* The list is newest first: ties go to the older. */
		if (n >= best) {
			best = n;
			victim = c;
		}
	}
	if (victim != NULL) {
		s->shed++;
		conn_close(victim);
	}
}

static struct bufferevent *new_bev(struct event_base *base, void *arg)
{
	struct node_metrics_http *s = arg;
	struct mconn *c = calloc(1, sizeof(*c));
	struct bufferevent *bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);

	if (c == NULL || bev == NULL) {
		free(c);
		return bev; /* unguarded, but served: evhttp owns it */
	}
	reap(s);
	if (s->live >= CONNS)
		shed_one(s);
	bufferevent_incref(bev);
	c->bev = bev;
	c->opened_ms = now_ms();
	c->next = s->conns;
	s->conns = c;
	s->live++;
	return bev;
}

static void sweep(evutil_socket_t fd, short what, void *arg)
{
	struct node_metrics_http *s = arg;
	uint64_t now = now_ms();

	reap(s);
	for (struct mconn *c = s->conns; c != NULL; c = c->next)
		if (now - c->opened_ms > LIFE_MS) {
			s->shed++;
			conn_close(c);
		}
	if (s->accept_errors > s->logged_errors && now - s->last_log_ms > LOG_EVERY_MS) {
		LOG_WARN("metrics: accept() failed %llu times (%zu connections open, at most %d); "
			 "pausing %d ms after each",
			 (unsigned long long)(s->accept_errors - s->logged_errors), s->live, CONNS,
			 ACCEPT_PAUSE_MS);
		s->logged_errors = s->accept_errors;
		s->last_log_ms = now;
	}
}

static void resume(evutil_socket_t fd, short what, void *arg)
{
	struct node_metrics_http *s = arg;

	evconnlistener_enable(s->lev);
}

/* The listener's error callback has evhttp's argument: the server is found
 * through the one listener each has (few servers per process). */
static struct node_metrics_http *servers[8];

static void on_accept_error(struct evconnlistener *lev, void *arg)
{
	struct timeval tv = {0, ACCEPT_PAUSE_MS * 1000};

	for (size_t i = 0; i < PROTO_ARRAY_LEN(servers); i++) {
		struct node_metrics_http *s = servers[i];
		if (s == NULL || s->lev != lev)
			continue;
		s->accept_errors++;
		reap(s);
		if (s->live > 0)
			shed_one(s);
		evconnlistener_disable(lev);
		event_add(s->resume_ev, &tv);
		return;
	}
}

static void reply(struct evhttp_request *req, int code, const char *reason, const char *ctype,
		  struct evbuffer *body)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_send_reply(req, code, reason, body);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct node_metrics_http *s = arg;
	const char *uri = evhttp_request_get_uri(req);
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	struct evbuffer *b = evbuffer_new();
	const char *why;
	size_t plen;

	if (b == NULL) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	/* The path without its query string. */
	plen = strcspn(uri, "?");
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		evbuffer_add_printf(b, "only GET\n");
		reply(req, 405, "Method Not Allowed", "text/plain", b);
	} else if (plen == 8 && strncmp(uri, "/metrics", plen) == 0) {
		size_t len;
		char *text = proto_metrics_render(s->m, &len);

		if (text == NULL || evbuffer_add(b, text, len) != 0) {
			evbuffer_drain(b, evbuffer_get_length(b));
			evbuffer_add_printf(b, "out of memory\n");
			reply(req, 500, "Internal Server Error", "text/plain", b);
		} else {
			reply(req, 200, "OK", "text/plain; version=0.0.4", b);
		}
		free(text);
	} else if (plen == 8 && strncmp(uri, "/healthz", plen) == 0) {
		if (proto_metrics_healthy(s->m, &why)) {
			evbuffer_add_printf(b, "ok\n");
			reply(req, 200, "OK", "text/plain", b);
		} else {
			evbuffer_add_printf(b, "%s\n", why);
			reply(req, 503, "Service Unavailable", "text/plain", b);
		}
	} else {
		evbuffer_add_printf(b, "not found: /metrics and /healthz are served here\n");
		reply(req, 404, "Not Found", "text/plain", b);
	}
	evbuffer_free(b);
}

/* "host:port" or "[v6]:port" into host (without brackets) and port. */
int node_metrics_addr_check(const char *v, struct proto_err *err)
{
	char host[256];
	uint16_t port;

	if (strcmp(v, "off") != 0 && proto_hostport_parse(v, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "want HOST:PORT or off");
	return 0;
}

int node_metrics_http_new(struct event_base *base, const char *listen, const struct proto_metrics *m,
			  struct node_metrics_http **out, struct proto_err *err)
{
	struct node_metrics_http *s = NULL;
	struct evhttp_bound_socket *sock;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256];
	uint16_t port;
	int rc;

	*out = NULL;
	if (proto_hostport_parse(listen, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "--metrics %s is not HOST:PORT (or off)", listen);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	s->m = m;
	s->http = evhttp_new(base);
	if (s->http == NULL) {
		rc = proto_errf(err, ENOMEM, "evhttp_new failed");
		goto fail;
	}
	/* Scrapers send small GETs: tight caps, short idle time. */
	evhttp_set_max_body_size(s->http, 0);
	evhttp_set_max_headers_size(s->http, 8192);
	evhttp_set_timeout(s->http, 10);
	evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
						    EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
	evhttp_set_gencb(s->http, on_request, s);
	sock = evhttp_bind_socket_with_handle(s->http, host, port);
	if (sock == NULL) {
		rc = proto_errf(err, EADDRNOTAVAIL, "metrics: cannot listen on %s: %s", listen,
				strerror(errno));
		goto fail;
	}
	/* The guard (above). */
	struct timeval every = {0, SWEEP_MS * 1000};
	s->lev = evhttp_bound_socket_get_listener(sock);
	s->sweep_ev = event_new(base, -1, EV_PERSIST, sweep, s);
	s->resume_ev = evtimer_new(base, resume, s);
	s->last_log_ms = now_ms();
	if (s->sweep_ev == NULL || s->resume_ev == NULL || event_add(s->sweep_ev, &every) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	evhttp_set_bevcb(s->http, new_bev, s);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(servers); i++)
		if (servers[i] == NULL) {
			servers[i] = s;
			evconnlistener_set_error_cb(s->lev, on_accept_error);
			break;
		}
	if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) != 0) {
		rc = proto_errf(err, EIO, "metrics: cannot read the bound port");
		goto fail;
	}
	port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					: ntohs(((struct sockaddr_in *)&ss)->sin_port);
	snprintf(s->url, sizeof(s->url), strchr(host, ':') ? "http://[%s]:%u" : "http://%s:%u", host,
		 (unsigned)port);
	*out = s;
	return 0;
fail:
	node_metrics_http_free(s);
	return rc;
}

const char *node_metrics_http_url(const struct node_metrics_http *s)
{
	return s->url;
}

size_t node_metrics_http_conns(struct node_metrics_http *s)
{
	reap(s);
	return s->live;
}

void node_metrics_http_free(struct node_metrics_http *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < PROTO_ARRAY_LEN(servers); i++)
		if (servers[i] == s)
			servers[i] = NULL;
	if (s->http != NULL)
		evhttp_free(s->http);
	/* evhttp freed every connection: our references are the last. */
	while (s->conns != NULL) {
		struct mconn *c = s->conns;
		s->conns = c->next;
		bufferevent_decref(c->bev);
		free(c);
	}
	if (s->sweep_ev != NULL)
		event_free(s->sweep_ev);
	if (s->resume_ev != NULL)
		event_free(s->resume_ev);
	free(s);
}
