/* The connections of a tracker client: one kept open for ordinary requests,
 * one per long-poll; the queue, reconnects (see client_conn.h). */
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "proto/params.h"
#include "proto/util.h"
#include "tracker/client/client_conn.h"
#include "tracker/wire/tls.h"

#define POLL_LANES_KEPT 2 /* idle long-poll connections kept for the next ones */

struct trk__lane {
	struct trk__cconns *cc;
	struct evhttp_connection *conn; /* NULL: none open */
	struct trk__creq *busy;         /* the request on it, one at a time */
	struct event *deadline;         /* busy's whole answer is due by then */
	uint64_t answered;              /* answers on the connection open now */
	bool poll, broken;              /* broken: drop conn before the next */
	TAILQ_ENTRY(trk__lane) link;
};

struct trk__cconns {
	struct event_base *base;
	char host[256];
	int port;
	struct ssl_ctx_st *const *tls;
	trk__creq_fail_fn fail;
	void *arg;
	struct trk__lane main;          /* ordinary requests, one after another */
	TAILQ_HEAD(, trk__lane) polls;  /* long-polls, one each */
	TAILQ_HEAD(, trk__creq) queue;  /* waiting for main */
	TAILQ_HEAD(, trk__creq) failed; /* failed unsent: told from the loop */
	/* Connections dropped inside one of their callbacks, where libevent
	 * forbids freeing them: freed from the loop. */
	struct evhttp_connection **dead;
	size_t ndead, capdead;
	struct event *later;
};

static struct evhttp_connection *conn_new(struct trk__cconns *cc)
{
	struct evhttp_connection *conn;

	if (*cc->tls != NULL) {
		struct bufferevent *bev = trk__tls_client_bev(*cc->tls, cc->base, cc->host);

		/* The connection owns bev from here, even when it fails. */
		conn = bev == NULL ? NULL :
			evhttp_connection_base_bufferevent_new(cc->base, NULL, bev, cc->host,
							       (uint16_t)cc->port);
		if (conn == NULL && bev != NULL)
			bufferevent_free(bev);
	} else {
		conn = evhttp_connection_base_new(cc->base, NULL, cc->host, (uint16_t)cc->port);
	}
	if (conn == NULL)
		return NULL;
	/* A failed connect fails the request; the caller's retry rules apply. */
	evhttp_connection_set_retries(conn, 0);
	/* The body's cap is set per request (send_on). */
	evhttp_connection_set_max_headers_size(conn, TRK__ANSWER_HEAD_MAX);
	return conn;
}

/* Lets go of l's connection (freed from the loop). -ENOMEM: kept, broken. */
static int conn_drop(struct trk__cconns *cc, struct trk__lane *l)
{
	if (l->conn == NULL)
		return 0;
	if (cc->ndead == cc->capdead) {
		size_t cap = cc->capdead ? 2 * cc->capdead : 4;
		struct evhttp_connection **d = realloc(cc->dead, cap * sizeof(*d));

		if (d == NULL) {
			l->broken = true;
			return -ENOMEM;
		}
		cc->dead = d;
		cc->capdead = cap;
	}
	cc->dead[cc->ndead++] = l->conn;
	l->conn = NULL;
	l->answered = 0;
	l->broken = false;
	event_active(cc->later, EV_TIMEOUT, 1);
	return 0;
}

/* An open connection for l's next request: the one it has unless it broke
 * or the tracker closed it since its last answer. */
static int lane_ready(struct trk__cconns *cc, struct trk__lane *l)
{
	if (l->conn != NULL &&
	    (l->broken ||
	     (l->answered > 0 &&
	      bufferevent_getfd(evhttp_connection_get_bufferevent(l->conn)) < 0)) &&
	    conn_drop(cc, l) != 0)
		return -ENOMEM;
	if (l->conn == NULL && (l->conn = conn_new(cc)) == NULL)
		return -ENOMEM;
	return 0;
}

/* Tells r's failure from the loop; r->req is no longer the caller's. */
static void fail_later(struct trk__cconns *cc, struct trk__creq *r, int status, bool req_taken)
{
	if (!req_taken && r->req != NULL)
		evhttp_request_free(r->req);
	r->req = NULL;
	r->fail = status;
	r->failing = true;
	TAILQ_INSERT_TAIL(&cc->failed, r, qlink);
	event_active(cc->later, EV_TIMEOUT, 1);
}

/* r's deadline passed before its whole answer came, however it trickles
 * in: the connection is let go and r fails. */
static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
	struct trk__lane *l = arg;
	struct trk__cconns *cc = l->cc;
	struct trk__creq *r = l->busy;

	if (r == NULL)
		return;
	snprintf(r->refused, sizeof(r->refused), "no whole answer by the request's deadline%s",
		 r->head_read ? " (the answer's body came too slowly)" : "");
	l->busy = NULL;
	r->sent = false;
	r->lane = NULL;
	/* libevent frees the request and resets the connection, calling
	 * back no one but the error callback. */
	evhttp_cancel_request(r->req);
	conn_drop(cc, l);
	fail_later(cc, r, -ETIMEDOUT, true);
}

/* l's deadline timer, made when first needed. */
static int lane_deadline(struct trk__cconns *cc, struct trk__lane *l)
{
	if (l->deadline == NULL)
		l->deadline = evtimer_new(cc->base, deadline_cb, l);
	return l->deadline != NULL ? 0 : -ENOMEM;
}

/* Sends r on l (idle). On failure r is told from the loop. Touches nothing
 * after evhttp_make_request succeeds: libevent may have called back. */
static void send_on(struct trk__cconns *cc, struct trk__lane *l, struct trk__creq *r)
{
	uint64_t now = proto_now_ns(), left;
	struct timeval tv;
	int rc;

	if (r->deadline_ns <= now) {
		fail_later(cc, r, -ETIMEDOUT, false);
		return;
	}
	if ((rc = lane_ready(cc, l)) != 0 || (rc = lane_deadline(cc, l)) != 0) {
		fail_later(cc, r, rc, false);
		return;
	}
	left = (r->deadline_ns - now) / 1000;
	tv.tv_sec = (time_t)(left / 1000000);
	tv.tv_usec = (suseconds_t)(left % 1000000);
	/* libevent's timeout restarts with every byte read: the deadline
	 * timer bounds the whole answer. */
	evhttp_connection_set_timeout_tv(l->conn, &tv);
	evhttp_connection_set_max_body_size(l->conn, (ev_ssize_t)r->body_max);
	evtimer_add(l->deadline, &tv);
	r->lane = l;
	r->reused = l->answered > 0;
	r->sent = true;
	l->busy = r;
	if (evhttp_make_request(l->conn, r->req, r->cmd, r->uri) != 0) {
		/* libevent keeps or frees the request depending on where it
		 * failed: it is not ours to free. */
		r->sent = false;
		r->lane = NULL;
		l->busy = NULL;
		l->broken = true;
		evtimer_del(l->deadline);
		fail_later(cc, r, -EIO, true);
	}
}

static void pump(struct trk__cconns *cc)
{
	struct trk__creq *r;

	while (cc->main.busy == NULL && (r = TAILQ_FIRST(&cc->queue)) != NULL) {
		TAILQ_REMOVE(&cc->queue, r, qlink);
		r->queued = false;
		send_on(cc, &cc->main, r);
	}
}

static void later_cb(evutil_socket_t fd, short what, void *arg)
{
	struct trk__cconns *cc = arg;
	struct trk__creq *r;

	while (cc->ndead > 0)
		evhttp_connection_free(cc->dead[--cc->ndead]);
	pump(cc);
	while ((r = TAILQ_FIRST(&cc->failed)) != NULL) {
		TAILQ_REMOVE(&cc->failed, r, qlink);
		r->failing = false;
		cc->fail(r, cc->arg);
	}
}

int trk__cconns_new(struct event_base *base, const char *host, int port,
		    struct ssl_ctx_st *const *tls, trk__creq_fail_fn fail, void *arg,
		    struct trk__cconns **out)
{
	struct trk__cconns *cc = calloc(1, sizeof(*cc));

	*out = NULL;
	if (cc == NULL)
		return -ENOMEM;
	cc->base = base;
	snprintf(cc->host, sizeof(cc->host), "%s", host);
	cc->port = port;
	cc->tls = tls;
	cc->fail = fail;
	cc->arg = arg;
	cc->main.cc = cc;
	TAILQ_INIT(&cc->polls);
	TAILQ_INIT(&cc->queue);
	TAILQ_INIT(&cc->failed);
	cc->later = event_new(base, -1, 0, later_cb, cc);
	if (cc->later == NULL) {
		free(cc);
		return -ENOMEM;
	}
	*out = cc;
	return 0;
}

void trk__cconns_submit(struct trk__cconns *cc, struct trk__creq *r, bool front)
{
	struct trk__lane *l;

	r->lane = NULL;
	r->sent = r->reused = r->queued = r->failing = r->head_read = false;
	r->fail = 0;
	r->refused[0] = 0;
	if (!r->long_poll) {
		if (front)
			TAILQ_INSERT_HEAD(&cc->queue, r, qlink);
		else
			TAILQ_INSERT_TAIL(&cc->queue, r, qlink);
		r->queued = true;
		pump(cc);
		return;
	}
	/* A long-poll: an idle one of its own, with an open connection first. */
	TAILQ_FOREACH(l, &cc->polls, link)
		if (l->busy == NULL && l->conn != NULL && !l->broken)
			break;
	if (l == NULL)
		TAILQ_FOREACH(l, &cc->polls, link)
			if (l->busy == NULL)
				break;
	if (l == NULL) {
		l = calloc(1, sizeof(*l));
		if (l == NULL) {
			fail_later(cc, r, -ENOMEM, false);
			return;
		}
		l->cc = cc;
		l->poll = true;
		TAILQ_INSERT_TAIL(&cc->polls, l, link);
	}
	send_on(cc, l, r);
}

/* Frees a long-poll lane whose connection is let go. */
static void lane_free(struct trk__lane *l)
{
	if (l->deadline != NULL)
		event_free(l->deadline);
	free(l);
}

/* Keeps at most POLL_LANES_KEPT idle long-poll connections. */
static void trim_polls(struct trk__cconns *cc)
{
	struct trk__lane *l, *next;
	size_t idle = 0;

	for (l = TAILQ_FIRST(&cc->polls); l != NULL; l = next) {
		next = TAILQ_NEXT(l, link);
		if (l->busy != NULL || idle++ < POLL_LANES_KEPT)
			continue;
		if (conn_drop(cc, l) != 0)
			continue;
		TAILQ_REMOVE(&cc->polls, l, link);
		lane_free(l);
	}
}

void trk__cconns_done(struct trk__cconns *cc, struct trk__creq *r, bool answered)
{
	struct trk__lane *l = r->lane;

	r->sent = false;
	r->lane = NULL;
	if (l == NULL)
		return;
	l->busy = NULL;
	evtimer_del(l->deadline);
	if (answered)
		l->answered++;
	else
		conn_drop(cc, l);
	if (l->poll)
		trim_polls(cc);
	else if (!TAILQ_EMPTY(&cc->queue))
		event_active(cc->later, EV_TIMEOUT, 1);
}

int trk__creq_head(struct trk__creq *r, struct evhttp_request *req)
{
	const struct evkeyval *h;
	const char *cl;
	size_t n = 0;
	char *end;

	TAILQ_FOREACH(h, evhttp_request_get_input_headers(req), next)
		n++;
	if (n > TRK__ANSWER_HEADERS_MAX) {
		snprintf(r->refused, sizeof(r->refused),
			 "the answer's head has %zu header lines (at most %d)", n,
			 TRK__ANSWER_HEADERS_MAX);
		return -1;
	}
	cl = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Length");
	if (cl != NULL) {
		unsigned long long v = strtoull(cl, &end, 10);

		if (end == cl || *end != 0 || v > r->body_max) {
			snprintf(r->refused, sizeof(r->refused),
				 "the answer's Content-Length %.24s exceeds %zu bytes, the most "
				 "this request's answer holds", cl, r->body_max);
			return -1;
		}
	}
	r->head_read = true;
	return 0;
}

struct bufferevent *trk__cconns_bev(const struct trk__creq *r)
{
	return r->lane != NULL && r->lane->conn != NULL ?
		       evhttp_connection_get_bufferevent(r->lane->conn) : NULL;
}

void trk__cconns_cancel(struct trk__cconns *cc, struct trk__creq *r)
{
	if (r->queued) {
		TAILQ_REMOVE(&cc->queue, r, qlink);
		r->queued = false;
		evhttp_request_free(r->req);
		r->req = NULL;
	} else if (r->failing) {
		TAILQ_REMOVE(&cc->failed, r, qlink);
		r->failing = false;
	}
}

void trk__cconns_retarget(struct trk__cconns *cc, const char *host, int port)
{
	struct trk__lane *l;

	snprintf(cc->host, sizeof(cc->host), "%s", host);
	cc->port = port;
	/* Open connections lead to the old tracker: each is dropped before
	 * its next request (one carrying a request finishes it first). */
	cc->main.broken |= cc->main.conn != NULL;
	TAILQ_FOREACH(l, &cc->polls, link)
		l->broken |= l->conn != NULL;
}

size_t trk__cconns_open(const struct trk__cconns *cc)
{
	const struct trk__lane *l;
	size_t n = cc->main.conn != NULL;

	TAILQ_FOREACH(l, &cc->polls, link)
		n += l->conn != NULL;
	return n;
}

void trk__cconns_free(struct trk__cconns *cc)
{
	struct trk__lane *l;

	if (cc == NULL)
		return;
	/* Frees the requests on them too, without calling back. */
	if (cc->main.conn != NULL)
		evhttp_connection_free(cc->main.conn);
	if (cc->main.deadline != NULL)
		event_free(cc->main.deadline);
	while ((l = TAILQ_FIRST(&cc->polls)) != NULL) {
		TAILQ_REMOVE(&cc->polls, l, link);
		if (l->conn != NULL)
			evhttp_connection_free(l->conn);
		lane_free(l);
	}
	while (cc->ndead > 0)
		evhttp_connection_free(cc->dead[--cc->ndead]);
	free(cc->dead);
	event_free(cc->later);
	free(cc);
}
