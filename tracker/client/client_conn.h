/* The connections of one tracker client (client_conn.c).
 *
 * A client keeps its connection to the tracker open (HTTP/1.1 keep-alive)
 * instead of opening one per request: the tracker's cost per request was
 * mostly the kernel's and libevent's work for a new TCP connection. Ordinary
 * requests go out one after another on one connection (libevent's client
 * does not pipeline), in the order they were made, so a node's reports reach
 * the tracker in order; a long-poll gets a connection of its own for as long
 * as it is held (it would block everything queued behind it), kept for the
 * next long-poll. A connection that failed or that the tracker closed is
 * dropped and the next request opens a new one; a request that failed on a
 * connection that had already carried answers (the tracker may have closed
 * it, idle, while the request was on its way) is sent once more by the
 * client, on a new connection. A request waiting in the queue past its own
 * deadline fails with -ETIMEDOUT without being sent.
 *
 * Whoever is on the path decides what comes back, so an answer is bounded
 * before it is held: its head in lines and bytes, its body by its request's
 * own cap, and the whole of it by the request's deadline (a byte now and
 * then keeps no answer alive).
 */
#ifndef TRACKER_CLIENT_CONN_H
#define TRACKER_CLIENT_CONN_H

#include <event2/http.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#define TRK__ANSWER_HEADERS_MAX 64       /* header lines in an answer's head */
#define TRK__ANSWER_HEAD_MAX (16u << 10) /* bytes of an answer's head */

struct ssl_ctx_st;
struct trk__cconns;
struct trk__lane;

/* One request as the connections see it, embedded in the client's own. */
struct trk__creq {
	struct evhttp_request *req; /* built, not yet made */
	enum evhttp_cmd_type cmd;
	char *uri;                  /* owned by the embedding request */
	uint64_t deadline_ns;       /* proto_now_ns() by which it must be answered */
	bool long_poll;             /* held by the tracker: a connection of its own */
	size_t body_max;            /* the largest answer body taken, bytes */
	/* Set here. */
	struct trk__lane *lane;     /* the connection it went out on */
	bool queued, sent, reused;  /* reused: that connection had answered before */
	int fail;                   /* failed before it was sent: its status */
	bool failing;               /* waiting to be told so */
	bool head_read;             /* its answer's head was read and taken */
	char refused[160];          /* why its answer was refused here, or "" */
	TAILQ_ENTRY(trk__creq) qlink;
};

/* Told, from the loop, that r failed before it was sent (status in r->fail:
 * -ETIMEDOUT, -EIO, -ENOMEM), or that its deadline passed before its whole
 * answer came (-ETIMEDOUT, r->refused says so). r->req is freed by then. */
typedef void (*trk__creq_fail_fn)(struct trk__creq *r, void *arg);

/* The connections of a client to host:port on base; tls (may be NULL) is a
 * pointer to the client's TLS context, read at each new connection. */
int trk__cconns_new(struct event_base *base, const char *host, int port,
		    struct ssl_ctx_st *const *tls, trk__creq_fail_fn fail, void *arg,
		    struct trk__cconns **out);
/* Sends r now, or queues it (front: ahead of the others, for a request
 * sent again). From here on r->req belongs to the connections: its
 * callback runs once (libevent's), or the fail function does. Cannot fail.
 * libevent runs the callback inside this call only when a socket cannot
 * even be made (out of descriptors). */
void trk__cconns_submit(struct trk__cconns *cc, struct trk__creq *r, bool front);
/* In r's callback: its connection is free again. answered: the tracker
 * answered (the connection is kept unless it closed); otherwise the
 * connection is dropped. What is queued goes out from the loop, after
 * requests that the callback sends. */
void trk__cconns_done(struct trk__cconns *cc, struct trk__creq *r, bool answered);
/* In r's header callback (evhttp_request_set_header_cb): 0 to read the
 * body, -1 to refuse the answer (r->refused says why; the request then
 * fails as libevent's EOF). */
int trk__creq_head(struct trk__creq *r, struct evhttp_request *req);
/* The bufferevent r went out on (to read a TLS failure), or NULL. */
struct bufferevent *trk__cconns_bev(const struct trk__creq *r);
/* Forgets r without calling back: a queued one is dequeued and its
 * evhttp_request freed; a sent one is left to trk__cconns_free. Cannot
 * fail. */
void trk__cconns_cancel(struct trk__cconns *cc, struct trk__creq *r);
/* Closes every connection (requests on them are freed, no callbacks).
 * Cancel the queued requests first. NULL is fine. */
void trk__cconns_free(struct trk__cconns *cc);
/* New connections go to host:port from now on; those open are dropped
 * before their next request. */
void trk__cconns_retarget(struct trk__cconns *cc, const char *host, int port);
/* Connections open now (tests, metrics). */
size_t trk__cconns_open(const struct trk__cconns *cc);

#endif
