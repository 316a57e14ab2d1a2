/* The tracker client: requests signed and sent on an event_base, sent
 * again once when the tracker's epoch or the kept-open connection calls
 * for it, and their answers judged (the chain guard) and handed back. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <netdb.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <time.h>

#include "proto/log.h"
#include "proto/params.h"
#include "proto/util.h"
#include "tracker/client/client_conn.h"
#include "tracker/client/chain.h"
#include "tracker/client/client.h"
#include "tracker/wire/tls.h"

#define PATH_MAX_LEN 2048
#define DEFAULT_TIMEOUT_MS 10000
#define CLIENT_SESSIONS 64 /* node sessions one client remembers */

/* How a request came to be sent again. */
#define SENT_AGAIN_EPOCH 1u  /* signed again for the tracker's new epoch */
#define SENT_AGAIN_STALE 2u  /* its kept-open connection had been closed */
/* Sent to the next tracker of the list (bits 4..: how many times). */
#define SENT_AGAIN_NEXT 16u
#define SENT_AGAIN_NEXTS(again) ((again) / SENT_AGAIN_NEXT)

struct pending {
	struct trk_client *c;
	struct trk__creq cr; /* on the client's connections (client_conn.h) */
	trk_client_cb cb;
	void *arg;
	/* Frees arg when the request goes unanswered (the client is freed
	 * first); NULL: arg is the caller's. */
	void (*arg_free)(void *arg);
	enum evhttp_request_error error;
	bool have_error;
	/* The request is kept to send it again once: signed again if the
	 * tracker answers 401 under another epoch (it restarted, or this
	 * client had not yet seen its epoch), and on a new connection if the
	 * kept-open one turns out closed. */
	bool sign, registers;
	unsigned again; /* SENT_AGAIN_* bits of this request's past */
	size_t target;  /* the tracker of the list it went to */
	char epoch_used[2 * TRK_EPOCH_BYTES + 1];
	char method[8], ctype[64];
	char *path_query;
	void *body;
	size_t len;
	uint32_t timeout_ms;
	TAILQ_ENTRY(pending) link;
};

/* One tracker of a client's list (--tracker URL,URL,...). */
struct target {
	char host[256];
	int port;
	char prefix[256];
};

struct trk_client {
	struct event_base *base;
	/* The trackers it may ask, in order (one unless a list was given), and
	 * the one it asks now, whose host, port and prefix are below. */
	struct target targets[TRK_CLIENT_URLS_MAX];
	size_t ntargets, cur;
	bool moving; /* moved on since the last tracker that answered (said once) */
	bool own_base;
	struct ssl_ctx_st *tls; /* https:// URLs: verifies the tracker (wire/tls.c) */
	char host[256];
	int port;
	char prefix[256]; /* path prefix of the base URL, without a trailing / */
	bool have_key;
	uint8_t key[PROTO_CLUSTER_KEY_BYTES];
	uint32_t timeout_ms;
	size_t parse_max; /* 2xx JSON answers longer than this are not parsed */
	char site[TRK_SITE_MAX + 1]; /* where its nodes or publisher are ("": unnamed) */
	char epoch[2 * TRK_EPOCH_BYTES + 1]; /* the tracker's, last seen */
	/* The chain seen (TRK_CHAIN_HEADER): see trk_client_on_chain_lost. */
	struct {
		struct trk__chain_seen seen;
		bool lost;
		trk_client_chain_fn fn;
		void *arg;
	} chain;
	/* Session credentials of the nodes registered through this client,
	 * sent with their heartbeats, reports and offers. */
	struct {
		char id[TRK_ID_MAX];
		char session[2 * TRK_SESSION_BYTES + 1];
	} sessions[CLIENT_SESSIONS];
	size_t nsessions;
	TAILQ_HEAD(, pending) pending;
	struct trk__cconns *cc; /* its connections to the tracker */
};

/* The session of node id, or NULL. */
static const char *session_of(const struct trk_client *c, const char *id)
{
	for (size_t i = 0; i < c->nsessions; i++)
		if (strcmp(c->sessions[i].id, id) == 0)
			return c->sessions[i].session;
	return NULL;
}

const char *trk_client_session(const struct trk_client *c, const char *id)
{
	return session_of(c, id);
}

void trk_client_keep_session(struct trk_client *c, const char *id, const char *ses)
{
	size_t i;

	if (id == NULL || ses == NULL || strlen(id) >= TRK_ID_MAX ||
	    strlen(ses) != 2 * TRK_SESSION_BYTES)
		return;
	for (i = 0; i < c->nsessions && strcmp(c->sessions[i].id, id) != 0; i++)
		;
	if (i == CLIENT_SESSIONS)
		i = CLIENT_SESSIONS - 1; /* full: the last slot turns over */
	else if (i == c->nsessions)
		c->nsessions++;
	snprintf(c->sessions[i].id, sizeof(c->sessions[i].id), "%s", id);
	snprintf(c->sessions[i].session, sizeof(c->sessions[i].session), "%s", ses);
}

/* Remembers a registration's answer: {"node_id":..,"session":..} or
 * {"publisher_id":..,"session":..}. */
static void keep_session(struct trk_client *c, json_t *answer)
{
	const char *id = json_string_value(json_object_get(answer, "node_id"));

	if (id == NULL)
		id = json_string_value(json_object_get(answer, "publisher_id"));
	trk_client_keep_session(c, id, json_string_value(json_object_get(answer, "session")));
}

static void on_fail(struct trk__creq *r, void *arg);

/* The URL if it is one of a tracker (scheme http or https, a host), else NULL. */
static struct evhttp_uri *url_parse(const char *url)
{
	struct evhttp_uri *u = evhttp_uri_parse(url);
	const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL;
	const char *host = u ? evhttp_uri_get_host(u) : NULL;

	if (u != NULL && (scheme == NULL ||
			  (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) ||
			  host == NULL || host[0] == 0)) {
		evhttp_uri_free(u);
		u = NULL;
	}
	return u;
}

/* The list's URLs (comma-separated) as targets; *https set by the first.
 * -EINVAL (err: why) for a bad URL, more than TRK_CLIENT_URLS_MAX, or
 * schemes that differ. */
static int parse_targets(const char *list, struct target *t, size_t *n, bool *https,
			 struct proto_err *err)
{
	const char *at = list;

	*n = 0;
	do {
		const char *end = strchr(at, ',');
		size_t len = end != NULL ? (size_t)(end - at) : strlen(at);
		char url[1024];
		struct evhttp_uri *u;

		if (*n == TRK_CLIENT_URLS_MAX)
			return proto_errf(err, EINVAL, "at most %d trackers", TRK_CLIENT_URLS_MAX);
		snprintf(url, sizeof(url), "%.*s", (int)PROTO_MIN(len, sizeof(url) - 1), at);
		if (len >= sizeof(url) || (u = url_parse(url)) == NULL)
			return proto_errf(err, EINVAL, "'%s': want http://HOST:PORT or https://HOST:PORT%s",
					  url, *n > 0 || end != NULL ? " (a list: URL,URL)" : "");
		bool tls = strcmp(evhttp_uri_get_scheme(u), "https") == 0;
		if (*n > 0 && tls != *https) {
			evhttp_uri_free(u);
			return proto_errf(err, EINVAL, "'%s': every tracker of the list is http:// or "
					  "every one https://", url);
		}
		*https = tls;
		struct target *x = &t[(*n)++];
		snprintf(x->host, sizeof(x->host), "%s", evhttp_uri_get_host(u));
		/* evhttp wants a v6 address without its brackets. */
		if (x->host[0] == '[') {
			size_t hl = strlen(x->host);
			memmove(x->host, x->host + 1, hl);
			if (hl >= 2 && x->host[hl - 2] == ']')
				x->host[hl - 2] = 0;
		}
		x->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : tls ? 443 : 80;
		const char *path = evhttp_uri_get_path(u);
		snprintf(x->prefix, sizeof(x->prefix), "%s", path ? path : "");
		while (x->prefix[0] && x->prefix[strlen(x->prefix) - 1] == '/')
			x->prefix[strlen(x->prefix) - 1] = 0;
		evhttp_uri_free(u);
		at = end != NULL ? end + 1 : NULL;
	} while (at != NULL);
	return 0;
}

int trk_url_check(const char *url, struct proto_err *err)
{
	struct target t[TRK_CLIENT_URLS_MAX];
	struct proto_err why;
	size_t n;
	bool https = false;

	if (parse_targets(url, t, &n, &https, &why) != 0)
		return proto_errf(err, EINVAL, "%s", strstr(why.msg, ": want") != NULL ?
					    "want http://HOST:PORT or https://HOST:PORT (a list: URL,URL)" :
					    why.msg);
	return 0;
}

/* Makes target i the one asked. */
static void use_target(struct trk_client *c, size_t i)
{
	c->cur = i;
	memcpy(c->host, c->targets[i].host, sizeof(c->host));
	c->port = c->targets[i].port;
	memcpy(c->prefix, c->targets[i].prefix, sizeof(c->prefix));
}

/* A tracker of the list did not answer at all: the next one is asked from
 * now on (and what it did not answer is sent there). */
static void next_target(struct trk_client *c, const char *why)
{
	char was[300];

	snprintf(was, sizeof(was), "%s:%d", c->host, c->port);
	use_target(c, (c->cur + 1) % c->ntargets);
	trk__cconns_retarget(c->cc, c->host, c->port);
	if (!c->moving)
		LOG_WARN("tracker %s: %s; asking %s:%d (tracker %zu of %zu) from now on", was, why,
			 c->host, c->port, c->cur + 1, c->ntargets);
	else /* none of the list answers yet: said once */
		LOG_DEBUG("tracker %s: %s; asking %s:%d", was, why, c->host, c->port);
	c->moving = true;
}

int trk_client_new(struct event_base *base, const char *url,
		   const uint8_t *cluster_key, struct trk_client **out,
		   struct proto_err *err)
{
	struct trk_client *c;
	bool https = false;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	TAILQ_INIT(&c->pending);
	c->timeout_ms = DEFAULT_TIMEOUT_MS;
	c->parse_max = SIZE_MAX;
	if ((rc = parse_targets(url, c->targets, &c->ntargets, &https, err)) != 0) {
		proto_err_prefix(err, "tracker URL");
		goto fail;
	}
	if (https && (rc = trk__tls_client_ctx(NULL, &c->tls, err)) != 0)
		goto fail;
	use_target(c, 0);
	if (cluster_key != NULL) {
		memcpy(c->key, cluster_key, sizeof(c->key));
		c->have_key = true;
	}
	if (base == NULL) {
		base = event_base_new();
		if (base == NULL) {
			rc = proto_errf(err, ENOMEM, "event_base_new failed");
			goto fail;
		}
		c->own_base = true;
	}
	c->base = base;
	if (trk__cconns_new(base, c->host, c->port, &c->tls, on_fail, c, &c->cc) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	*out = c;
	return 0;
fail:
	if (c->own_base && c->base != NULL)
		event_base_free(c->base);
	trk__tls_ctx_free(c->tls);
	free(c);
	return rc;
}

int trk_client_set_tls_ca(struct trk_client *c, const char *ca_file, struct proto_err *err)
{
	struct ssl_ctx_st *ctx;
	int rc;

	if (c->tls == NULL)
		return proto_errf(err, EINVAL, "--tls-ca %s: the tracker URL is not https://",
				  ca_file);
	if ((rc = trk__tls_client_ctx(ca_file, &ctx, err)) != 0)
		return rc;
	trk__tls_ctx_free(c->tls);
	c->tls = ctx;
	return 0;
}

void trk_client_free(struct trk_client *c)
{
	struct pending *p;

	if (c == NULL)
		return;
	while ((p = TAILQ_FIRST(&c->pending)) != NULL) {
		TAILQ_REMOVE(&c->pending, p, link);
		/* A queued request is freed here, a sent one with its
		 * connection below; neither calls back. */
		trk__cconns_cancel(c->cc, &p->cr);
		if (p->arg_free != NULL)
			p->arg_free(p->arg);
		free(p->cr.uri);
		free(p->path_query);
		free(p->body);
		free(p);
	}
	trk__cconns_free(c->cc);
	if (c->own_base)
		event_base_free(c->base);
	trk__tls_ctx_free(c->tls);
	sodium_memzero(c->key, sizeof(c->key));
	free(c);
}

void trk_client_set_parse_max(struct trk_client *c, size_t bytes)
{
	c->parse_max = bytes;
}

int trk_client_set_site(struct trk_client *c, const char *site)
{
	if (site != NULL && site[0] != 0 && !trk_site_valid(site))
		return -EINVAL;
	snprintf(c->site, sizeof(c->site), "%s", site != NULL ? site : "");
	return 0;
}

const char *trk_client_site(const struct trk_client *c)
{
	return c != NULL ? c->site : "";
}

void trk_client_set_timeout(struct trk_client *c, uint32_t ms)
{
	c->timeout_ms = ms > 0 ? ms : DEFAULT_TIMEOUT_MS;
}

struct event_base *trk_client_base(struct trk_client *c)
{
	return c->base;
}

static int transport_errno(const struct pending *p)
{
	if (!p->have_error)
		return -ECONNREFUSED;
	switch (p->error) {
	case EVREQ_HTTP_TIMEOUT: return -ETIMEDOUT;
	case EVREQ_HTTP_EOF: return -ECONNRESET;
	case EVREQ_HTTP_DATA_TOO_LONG: return -EMSGSIZE;
	case EVREQ_HTTP_REQUEST_CANCEL: return -ECANCELED;
	default: return -EIO;
	}
}

static void on_error(enum evhttp_request_error e, void *arg)
{
	struct pending *p = arg;
	p->error = e;
	p->have_error = true;
}

static void pending_free(struct pending *p)
{
	TAILQ_REMOVE(&p->c->pending, p, link);
	free(p->cr.uri);
	free(p->path_query);
	free(p->body);
	free(p);
}

static int start_request(struct trk_client *c, const char *method,
			 const char *path_query, const char *ctype,
			 const void *body, size_t len, uint32_t timeout_ms,
			 trk_client_cb cb, void *arg, void (*arg_free)(void *), unsigned again);

/* Sends p's request once more (again: the reason); 0 when it went. */
static int send_again(struct pending *p, unsigned again)
{
	return start_request(p->c, p->method, p->path_query, p->ctype, p->body, p->len,
			     p->timeout_ms, p->cb, p->arg, p->arg_free, p->again | again);
}

/* Tells p's caller that it failed without an answer (msg: why), and frees p. */
static void answer_failed(struct pending *p, int status, const char *msg)
{
	struct trk_answer a = {.status = status, .body = (const uint8_t *)"", .error = msg};

	p->cb(&a, p->arg);
	pending_free(p);
}

/* "tracker HOST:PORT: " then, for an answer refused, what was asked. */
static void say_refused(const struct pending *p, char *msg, size_t cap, const char *why)
{
	snprintf(msg, cap, "tracker %s:%d: answer to %s %s refused: %s", p->c->host, p->c->port,
		 p->method, p->path_query, why);
}

/* A request that failed before it was sent, or whose answer did not come
 * whole by its deadline (client_conn.c). */
static void on_fail(struct trk__creq *r, void *arg)
{
	struct pending *p = proto_container_of(r, struct pending, cr);
	char msg[512];

	if (r->refused[0] != 0)
		say_refused(p, msg, sizeof(msg), r->refused);
	else
		snprintf(msg, sizeof(msg), "tracker %s:%d: %s", p->c->host, p->c->port,
			 r->fail == -ETIMEDOUT ? "timed out waiting to be sent" :
						 strerror(-r->fail));
	answer_failed(p, r->fail, msg);
}

/* Keeps the tracker's epoch from an answer's header (hex, bounded). */
static void learn_epoch(struct trk_client *c, struct evhttp_request *req)
{
	const char *e = evhttp_find_header(evhttp_request_get_input_headers(req),
					   TRK_EPOCH_HEADER);
	size_t n = e != NULL ? strlen(e) : 0;

	if (n > 0 && n <= 2 * TRK_EPOCH_BYTES &&
	    strspn(e, "0123456789abcdef") == n)
		memcpy(c->epoch, e, n + 1);
}

void trk_client_on_chain_lost(struct trk_client *c, trk_client_chain_fn fn,
			      void *arg)
{
	c->chain.fn = fn;
	c->chain.arg = arg;
}

/* Checks an answer's chain against the one seen (chain.c). 0 when it fits
 * (and is then remembered), -ESTALE (msg says why) when the tracker went
 * back, -EPROTO for a malformed header. No header (an answer made before
 * the request was read): 0. */
static int check_chain(struct trk_client *c, struct evhttp_request *req,
		       char *msg, size_t cap)
{
	const char *h = evhttp_find_header(evhttp_request_get_input_headers(req),
					   TRK_CHAIN_HEADER);
	char who[300];
	int rc;

	snprintf(who, sizeof(who), "%s:%d", c->host, c->port);
	rc = trk__chain_check(&c->chain.seen, h, who, msg, cap);
	if (rc == 0 && c->chain.lost) {
		c->chain.lost = false;
		LOG_WARN("tracker %s has the chain seen before again (version "
			 "%llu)", who, (unsigned long long)c->chain.seen.c.latest);
		if (c->chain.fn != NULL)
			c->chain.fn(c->chain.arg, NULL);
	} else if (rc == -ESTALE && !c->chain.lost) {
		c->chain.lost = true;
		LOG_ERR("%s", msg);
		if (c->chain.fn != NULL)
			c->chain.fn(c->chain.arg, msg);
	}
	return rc;
}

/* The answer's head is read: bounded before its body is (client_conn.c). */
static int on_head(struct evhttp_request *req, void *arg)
{
	struct pending *p = arg;

	return trk__creq_head(&p->cr, req);
}

/* Why libevent gave up on an answer it was reading, in words, or NULL for
 * a transport failure; sets *status. */
static const char *too_long(struct pending *p, char *buf, size_t cap, int *status)
{
	if (p->cr.refused[0] != 0) {
		*status = -EMSGSIZE;
		return p->cr.refused;
	}
	if (!p->have_error || (p->error != EVREQ_HTTP_DATA_TOO_LONG &&
			       p->error != EVREQ_HTTP_INVALID_HEADER))
		return NULL;
	*status = p->error == EVREQ_HTTP_DATA_TOO_LONG ? -EMSGSIZE : -EPROTO;
	if (p->cr.head_read)
		snprintf(buf, cap, "its body exceeds %zu bytes, the most this request's answer "
			 "holds", p->cr.body_max);
	else
		snprintf(buf, cap, "its head is malformed or exceeds %u bytes",
			 TRK__ANSWER_HEAD_MAX);
	return buf;
}

/* p was not answered by the tracker asked (it is down, or stands by):
 * the next of the list is asked from now on, and p sent there (once per
 * other tracker). True when p went; false when the list is used up. */
static bool send_to_next(struct trk_client *c, struct pending *p, const char *why)
{
	unsigned nexts = SENT_AGAIN_NEXTS(p->again) + 1;

	if (p->target == c->cur) /* not yet moved on by another request */
		next_target(c, why);
	if (nexts < c->ntargets &&
	    start_request(c, p->method, p->path_query, p->ctype, p->body, p->len, p->timeout_ms,
			  p->cb, p->arg, p->arg_free,
			  (p->again % SENT_AGAIN_NEXT) | nexts * SENT_AGAIN_NEXT) == 0) {
		pending_free(p);
		return true;
	}
	return false;
}

static void on_done(struct evhttp_request *req, void *arg)
{
	struct pending *p = arg;
	struct trk_client *c = p->c;
	struct trk_answer a = {.error = ""};
	char msg[512] = "", why[300] = "";
	const char *refused = NULL;
	json_t *json = NULL;
	bool tls_failed = false;

	a.status = req != NULL ? evhttp_request_get_response_code(req) : 0;
	if (a.status == 0)
		refused = too_long(p, why, sizeof(why), &a.status);
	if (refused != NULL) {
		/* Refused here: not sent again, whatever its connection. */
		trk__cconns_done(c->cc, &p->cr, false);
		say_refused(p, msg, sizeof(msg), refused);
		answer_failed(p, a.status, msg);
		return;
	}
	if (a.status == 0 && c->tls != NULL)
		tls_failed = trk__tls_failure(trk__cconns_bev(&p->cr), why, sizeof(why));
	int dns = a.status == 0 && trk__cconns_bev(&p->cr) != NULL ?
			  bufferevent_socket_get_dns_error(trk__cconns_bev(&p->cr)) : 0;
	/* Its connection is free for the next request (or dropped). */
	trk__cconns_done(c->cc, &p->cr, a.status != 0);
	/* A standby tracker (another of its store leads): the next of the
	 * list, as for one that is down. Its answer says nothing of the
	 * chain. */
	bool standby = a.status == 503 && c->ntargets > 1 &&
		       evhttp_find_header(evhttp_request_get_input_headers(req),
					  TRK_STANDBY_HEADER) != NULL;
	if (standby && send_to_next(c, p, "standing by"))
		return;
	if (a.status != 0 && !standby)
		learn_epoch(c, req);
	if (a.status != 0 && !standby && c->moving && p->target == c->cur) {
		c->moving = false;
		LOG_NOTE("tracker %s:%d (%zu of %zu) answers", c->host, c->port, c->cur + 1,
			 c->ntargets);
	}
	/* Signed for an epoch the tracker does not have: sign again, once. */
	if (a.status == 401 && p->sign && !(p->again & SENT_AGAIN_EPOCH) &&
	    strcmp(c->epoch, p->epoch_used) != 0 && send_again(p, SENT_AGAIN_EPOCH) == 0) {
		pending_free(p);
		return;
	}
	/* The kept-open connection was closed by the tracker (idle, or it
	 * restarted) while this request was on its way: once more, on a new
	 * connection. A tracker that is down then refuses the connect. */
	if (a.status == 0 && p->cr.reused && p->have_error && p->error == EVREQ_HTTP_EOF &&
	    !(p->again & SENT_AGAIN_STALE) && send_again(p, SENT_AGAIN_STALE) == 0) {
		pending_free(p);
		return;
	}
	if (a.status != 0) {
		int rc = check_chain(c, req, msg, sizeof(msg));
		if (rc != 0) {
			answer_failed(p, rc, msg);
			return;
		}
	}
	if (a.status == 0) {
		a.status = transport_errno(p);
		if (tls_failed) {
			a.status = -EPROTO;
			a.fix = true;
			snprintf(msg, sizeof(msg), "tracker %s:%d: %s: check %s", c->host, c->port, why,
				 strstr(why, "wrong version number") != NULL ?
					 "--tracker: that tracker does not speak TLS (http://, or "
					 "start it with --tls-cert)" :
					 "--tls-ca: the CA that signed the tracker's certificate");
		} else if (dns != 0) {
			a.status = -EHOSTUNREACH;
			a.fix = dns != EAI_AGAIN;
			snprintf(msg, sizeof(msg), "tracker %s:%d: cannot resolve %s: %s%s", c->host,
				 c->port, c->host, gai_strerror(dns), a.fix ? ": check --tracker" : "");
		} else {
			snprintf(msg, sizeof(msg), "tracker %s:%d: %s", c->host, c->port,
				 strerror(-a.status));
		}
		/* A tracker that does not answer at all: the next of the list,
		 * this request sent there (once per other tracker). Its chain
		 * checks stay: a tracker of another chain is refused as ever. */
		if (c->ntargets > 1 && !tls_failed && a.status != -ECANCELED &&
		    a.status != -EMSGSIZE && send_to_next(c, p, strerror(-a.status)))
			return;
		a.body = (const uint8_t *)"";
	} else {
		struct evbuffer *in = evhttp_request_get_input_buffer(req);
		const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req),
						    "Content-Type");
		/* One spare byte so that text parsers see a NUL. */
		evbuffer_add(in, "", 1);
		a.len = evbuffer_get_length(in) - 1;
		a.body = evbuffer_pullup(in, -1);
		if (a.body == NULL) {
			a.status = -ENOMEM;
			a.len = 0;
			a.body = (const uint8_t *)"";
			snprintf(msg, sizeof(msg), "out of memory");
		} else if (ct != NULL && strstr(ct, "json") != NULL &&
			   (a.len <= c->parse_max || a.status >= 300)) {
			json = json_loadb((const char *)a.body, a.len, 0, NULL);
		}
		a.json = json;
		if (a.status == 200 && p->registers)
			keep_session(c, json);
		if (a.status >= 400) {
			const char *e = json_string_value(json_object_get(json, "error"));
			snprintf(msg, sizeof(msg), "HTTP %d: %s", a.status,
				 e ? e : evhttp_request_get_response_code_line(req) ?
				     evhttp_request_get_response_code_line(req) : "error");
			/* Signed (and signed again for the tracker's epoch) and
			 * refused, or not signed and refused: the keys differ. */
			if (a.status == 401 && (!c->have_key || (e != NULL && strstr(e, "bad mac")))) {
				a.fix = true;
				snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg),
					 ": check --cluster-key: %s", c->have_key ?
					 "the tracker's and ours differ" : "the tracker wants one");
			}
		}
	}
	a.error = msg;
	p->cb(&a, p->arg);
	json_decref(json);
	pending_free(p);
}

int trk_client_request(struct trk_client *c, const char *method,
		       const char *path_query, const char *ctype,
		       const void *body, size_t len, uint32_t timeout_ms,
		       trk_client_cb cb, void *arg)
{
	return start_request(c, method, path_query, ctype, body, len,
			     timeout_ms, cb, arg, NULL, 0);
}

/* True when path_query is path, with or without a query string. */
static bool is_path(const char *path_query, const char *path)
{
	size_t n = strlen(path);

	return strncmp(path_query, path, n) == 0 &&
	       (path_query[n] == '\0' || path_query[n] == '?');
}

static int start_request(struct trk_client *c, const char *method,
			 const char *path_query, const char *ctype,
			 const void *body, size_t len, uint32_t timeout_ms,
			 trk_client_cb cb, void *arg, void (*arg_free)(void *), unsigned again)
{
	bool post = strcmp(method, "POST") == 0, sign;
	char uri[PATH_MAX_LEN + 64], auth[256], hostport[300];
	struct pending *p;
	struct evkeyvalq *h;
	uint32_t t = timeout_ms ? timeout_ms : c->timeout_ms;
	int n;

	if (!post && strcmp(method, "GET") != 0)
		return -EINVAL;
	if (path_query[0] != '/' || strlen(path_query) > PATH_MAX_LEN)
		return -EINVAL;
	/* Reads that hand out memory keys are signed too (tracker.h). */
	sign = c->have_key && (post ||
			       strncmp(path_query, TRK_API "/sources", strlen(TRK_API "/sources")) == 0 ||
			       strncmp(path_query, TRK_API "/holders", strlen(TRK_API "/holders")) == 0);
	if (sign) {
		uint8_t nonce[8];
		char nhex[17];
		randombytes_buf(nonce, sizeof(nonce));
		sodium_bin2hex(nhex, sizeof(nhex), nonce, sizeof(nonce));
		n = snprintf(uri, sizeof(uri), "%s%s%cnonce=%s", c->prefix, path_query,
			     strchr(path_query, '?') ? '&' : '?', nhex);
	} else {
		n = snprintf(uri, sizeof(uri), "%s%s", c->prefix, path_query);
	}
	if (n < 0 || (size_t)n >= sizeof(uri))
		return -ENAMETOOLONG;
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	p->c = c;
	p->target = c->cur;
	p->cb = cb;
	p->arg = arg;
	p->arg_free = arg_free;
	p->sign = sign;
	p->again = again;
	/* A registration: a POST to /nodes or /publishers itself (a query
	 * string allowed). */
	p->registers = post && (is_path(path_query, TRK_API "/nodes") ||
				is_path(path_query, TRK_API "/publishers"));
	/* Kept to send it again (a new epoch, a closed connection). */
	snprintf(p->method, sizeof(p->method), "%s", method);
	snprintf(p->ctype, sizeof(p->ctype), "%s", ctype ? ctype : "application/json");
	p->path_query = strdup(path_query);
	p->cr.uri = strdup(uri);
	p->body = len > 0 ? malloc(len) : NULL;
	p->len = len;
	p->timeout_ms = timeout_ms;
	if (p->path_query == NULL || p->cr.uri == NULL || (len > 0 && p->body == NULL))
		goto fail;
	if (len > 0)
		memcpy(p->body, body, len);
	p->cr.cmd = post ? EVHTTP_REQ_POST : EVHTTP_REQ_GET;
	p->cr.deadline_ns = proto_now_ns() + (uint64_t)t * 1000000u;
	/* Held by the tracker past an ordinary answer: its own connection,
	 * so that nothing waits behind it. */
	p->cr.long_poll = timeout_ms > c->timeout_ms;
	p->cr.body_max = trk__answer_max(post, path_query);
	p->cr.req = evhttp_request_new(on_done, p);
	if (p->cr.req == NULL)
		goto fail;
	evhttp_request_set_error_cb(p->cr.req, on_error);
	evhttp_request_set_header_cb(p->cr.req, on_head);
	h = evhttp_request_get_output_headers(p->cr.req);
	snprintf(hostport, sizeof(hostport), strchr(c->host, ':') ? "[%s]:%d" : "%s:%d",
		 c->host, c->port);
	evhttp_add_header(h, "Host", hostport);
	/* No "Connection: close": the connection stays open for the next
	 * request (client_conn.h). */
	if (post && c->nsessions > 0 && len > 0 && len <= TRK_JSON_MAX) {
		/* A node's own calls carry its session credential. */
		json_t *j = json_loadb(body, len, 0, NULL);
		const char *id = json_string_value(json_object_get(j, "id"));
		json_t *rep = json_object_get(j, "replica"), *rank = json_object_get(j, "rank");
		char regid[TRK_ID_MAX + 32];
		const char *ses;

		if (id == NULL && json_is_string(rep) && json_is_integer(rank)) {
			/* A registration: the id it would take. */
			snprintf(regid, sizeof(regid), "%s/%lld", json_string_value(rep),
				 (long long)json_integer_value(rank));
			id = regid;
		}
		ses = id != NULL ? session_of(c, id) : NULL;

		if (ses != NULL)
			evhttp_add_header(h, TRK_SESSION_HEADER, ses);
		json_decref(j);
	}
	if (post) {
		evhttp_add_header(h, "Content-Type", ctype ? ctype : "application/json");
		if (len > 0 && evbuffer_add(evhttp_request_get_output_buffer(p->cr.req), body,
					    len) != 0)
			goto fail;
	}
	if (sign) {
		snprintf(p->epoch_used, sizeof(p->epoch_used), "%s", c->epoch);
		if (trk_auth_header(c->key, post ? "POST" : "GET", uri,
				    (uint64_t)time(NULL), c->epoch,
				    post ? body : NULL, post ? len : 0, auth,
				    sizeof(auth)) != 0)
			goto fail;
		evhttp_add_header(h, "Authorization", auth);
	}
	TAILQ_INSERT_TAIL(&c->pending, p, link);
	/* Sent now or queued; the callback comes later either way (and p
	 * may be gone when this returns). */
	trk__cconns_submit(c->cc, &p->cr, again != 0);
	return 0;
fail:
	if (p->cr.req != NULL)
		evhttp_request_free(p->cr.req);
	free(p->cr.uri);
	free(p->path_query);
	free(p->body);
	free(p);
	return -ENOMEM;
}

int trk__client_post_owned(struct trk_client *c, const char *path, json_t *body,
			   trk_client_cb cb, void *arg, void (*arg_free)(void *arg))
{
	char *txt = json_dumps(body, JSON_COMPACT);
	int rc;

	if (txt == NULL)
		return -ENOMEM;
	rc = start_request(c, "POST", path, "application/json", txt, strlen(txt), 0, cb, arg,
			   arg_free, 0);
	free(txt);
	return rc;
}

int trk_client_post_json(struct trk_client *c, const char *path, json_t *body,
			 trk_client_cb cb, void *arg)
{
	return trk__client_post_owned(c, path, body, cb, arg, NULL);
}

uint32_t trk__client_timeout(const struct trk_client *c)
{
	return c->timeout_ms;
}
