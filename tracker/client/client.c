/* The tracker client: signed async requests on an event_base, typed helpers,
 * answer parsers and a blocking mode for command-line use. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
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
#include "tracker/wire/tls.h"

#define PATH_MAX_LEN 2048
#define DEFAULT_TIMEOUT_MS 10000
#define CLIENT_SESSIONS 64 /* node sessions one client remembers */

/* How a request came to be sent again. */
#define SENT_AGAIN_EPOCH 1u  /* signed again for the tracker's new epoch */
#define SENT_AGAIN_STALE 2u  /* its kept-open connection had been closed */

struct pending {
	struct trk_client *c;
	struct trk__creq cr; /* on the client's connections (client_conn.h) */
	trk_client_cb cb;
	void *arg;
	enum evhttp_request_error error;
	bool have_error;
	/* The request is kept to send it again once: signed again if the
	 * tracker answers 401 under another epoch (it restarted, or this
	 * client had not yet seen its epoch), and on a new connection if the
	 * kept-open one turns out closed. */
	bool sign, registers;
	unsigned again; /* SENT_AGAIN_* bits of this request's past */
	char epoch_used[2 * TRK_EPOCH_BYTES + 1];
	char method[8], ctype[64];
	char *path_query;
	void *body;
	size_t len;
	uint32_t timeout_ms;
	TAILQ_ENTRY(pending) link;
};

struct trk_client {
	struct event_base *base;
	bool own_base;
	struct ssl_ctx_st *tls; /* https:// URLs: verifies the tracker (tls.c) */
	char host[256];
	int port;
	char prefix[256]; /* path prefix of the base URL, without a trailing / */
	bool have_key;
	uint8_t key[PROTO_CLUSTER_KEY_BYTES];
	uint32_t timeout_ms;
	size_t parse_max; /* 2xx JSON answers longer than this are not parsed */
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
	/* Registrations sent by layout digest, with their full bodies kept for
	 * a tracker that does not hold that layout. */
	TAILQ_HEAD(, reg_retry) regs;
};

struct reg_retry {
	struct trk_client *c;
	json_t *full; /* the body with the layout itself */
	trk_client_cb cb;
	void *arg;
	TAILQ_ENTRY(reg_retry) link;
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

/* Remembers a registration's answer: {"node_id":..,"session":..}. */
static void keep_session(struct trk_client *c, json_t *answer)
{
	trk_client_keep_session(c, json_string_value(json_object_get(answer, "node_id")),
				json_string_value(json_object_get(answer, "session")));
}

static void on_fail(struct trk__creq *r, void *arg);

int trk_client_new(struct event_base *base, const char *url,
		   const uint8_t *cluster_key, struct trk_client **out,
		   struct proto_err *err)
{
	struct trk_client *c;
	struct evhttp_uri *u = NULL;
	const char *scheme, *host, *path;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	TAILQ_INIT(&c->pending);
	TAILQ_INIT(&c->regs);
	c->timeout_ms = DEFAULT_TIMEOUT_MS;
	c->parse_max = SIZE_MAX;
	u = evhttp_uri_parse(url);
	scheme = u ? evhttp_uri_get_scheme(u) : NULL;
	host = u ? evhttp_uri_get_host(u) : NULL;
	if (u == NULL || scheme == NULL ||
	    (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0) ||
	    host == NULL || host[0] == 0) {
		rc = proto_errf(err, EINVAL,
				"tracker URL '%s': want http://HOST:PORT or https://HOST:PORT", url);
		goto fail;
	}
	if (strcmp(scheme, "https") == 0 &&
	    (rc = trk__tls_client_ctx(NULL, &c->tls, err)) != 0)
		goto fail;
	snprintf(c->host, sizeof(c->host), "%s", host);
	/* evhttp wants a v6 address without its brackets. */
	if (c->host[0] == '[') {
		size_t n = strlen(c->host);
		memmove(c->host, c->host + 1, n);
		if (n >= 2 && c->host[n - 2] == ']')
			c->host[n - 2] = 0;
	}
	c->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : c->tls ? 443 : 80;
	path = evhttp_uri_get_path(u);
	snprintf(c->prefix, sizeof(c->prefix), "%s", path ? path : "");
	while (c->prefix[0] && c->prefix[strlen(c->prefix) - 1] == '/')
		c->prefix[strlen(c->prefix) - 1] = 0;
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
	evhttp_uri_free(u);
	*out = c;
	return 0;
fail:
	if (u != NULL)
		evhttp_uri_free(u);
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
	struct reg_retry *rr;

	if (c == NULL)
		return;
	while ((p = TAILQ_FIRST(&c->pending)) != NULL) {
		TAILQ_REMOVE(&c->pending, p, link);
		/* A queued request is freed here, a sent one with its
		 * connection below; neither calls back. */
		trk__cconns_cancel(c->cc, &p->cr);
		free(p->cr.uri);
		free(p->path_query);
		free(p->body);
		free(p);
	}
	trk__cconns_free(c->cc);
	while ((rr = TAILQ_FIRST(&c->regs)) != NULL) {
		TAILQ_REMOVE(&c->regs, rr, link);
		json_decref(rr->full);
		free(rr);
	}
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
			 trk_client_cb cb, void *arg, unsigned again);

/* Sends p's request once more (again: the reason); 0 when it went. */
static int send_again(struct pending *p, unsigned again)
{
	return start_request(p->c, p->method, p->path_query, p->ctype, p->body, p->len,
			     p->timeout_ms, p->cb, p->arg, p->again | again);
}

/* A request that failed before it was sent (client_conn.c). */
static void on_fail(struct trk__creq *r, void *arg)
{
	struct pending *p = proto_container_of(r, struct pending, cr);
	struct trk_answer a = {.status = r->fail, .body = (const uint8_t *)""};
	char msg[512];

	snprintf(msg, sizeof(msg), "tracker %s:%d: %s", p->c->host, p->c->port,
		 r->fail == -ETIMEDOUT ? "timed out waiting to be sent" : strerror(-r->fail));
	a.error = msg;
	p->cb(&a, p->arg);
	pending_free(p);
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

static void on_done(struct evhttp_request *req, void *arg)
{
	struct pending *p = arg;
	struct trk_client *c = p->c;
	struct trk_answer a = {.error = ""};
	char msg[512] = "", why[300] = "";
	json_t *json = NULL;
	bool tls_failed = false;

	a.status = req != NULL ? evhttp_request_get_response_code(req) : 0;
	if (a.status == 0 && c->tls != NULL)
		tls_failed = trk__tls_failure(trk__cconns_bev(&p->cr), why, sizeof(why));
	/* Its connection is free for the next request (or dropped). */
	trk__cconns_done(c->cc, &p->cr, a.status != 0);
	if (a.status != 0)
		learn_epoch(c, req);
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
			a.status = rc;
			a.body = (const uint8_t *)"";
			a.error = msg;
			p->cb(&a, p->arg);
			pending_free(p);
			return;
		}
	}
	if (a.status == 0) {
		a.status = transport_errno(p);
		if (tls_failed) {
			a.status = -EPROTO;
			snprintf(msg, sizeof(msg), "tracker %s:%d: %s", c->host, c->port, why);
		} else {
			snprintf(msg, sizeof(msg), "tracker %s:%d: %s", c->host, c->port,
				 strerror(-a.status));
		}
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
			     timeout_ms, cb, arg, 0);
}

static int start_request(struct trk_client *c, const char *method,
			 const char *path_query, const char *ctype,
			 const void *body, size_t len, uint32_t timeout_ms,
			 trk_client_cb cb, void *arg, unsigned again)
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
	p->cb = cb;
	p->arg = arg;
	p->sign = sign;
	p->again = again;
	p->registers = post && strncmp(path_query, TRK_API "/nodes", strlen(TRK_API "/nodes")) == 0 &&
		       strchr("?", path_query[strlen(TRK_API "/nodes")]) != NULL;
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
	p->cr.req = evhttp_request_new(on_done, p);
	if (p->cr.req == NULL)
		goto fail;
	evhttp_request_set_error_cb(p->cr.req, on_error);
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

int trk_client_post_json(struct trk_client *c, const char *path, json_t *body,
			 trk_client_cb cb, void *arg)
{
	char *txt = json_dumps(body, JSON_COMPACT);
	int rc;

	if (txt == NULL)
		return -ENOMEM;
	rc = trk_client_request(c, "POST", path, "application/json", txt,
				strlen(txt), 0, cb, arg);
	free(txt);
	return rc;
}

/* Posts obj (a reference stolen). */
static int post_new(struct trk_client *c, const char *path, json_t *obj,
		    trk_client_cb cb, void *arg)
{
	int rc;

	if (obj == NULL)
		return -ENOMEM;
	rc = trk_client_post_json(c, path, obj, cb, arg);
	json_decref(obj);
	return rc;
}

static json_t *hexj(const uint8_t *b, size_t n)
{
	char *s = malloc(2 * n + 1);
	json_t *j;

	if (s == NULL)
		return NULL;
	sodium_bin2hex(s, 2 * n + 1, b, n);
	j = json_string(s);
	free(s);
	return j;
}

static json_t *u64s(uint64_t v)
{
	char b[24];
	snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
	return json_string(b);
}

static json_t *rank_addr(const struct trk_rank_addr *a)
{
	return json_pack("{s:I,s:s,s:s,s:s}", "rank", (json_int_t)a->rank, "host",
			 a->host, "provider", a->provider, "fabric_addr",
			 a->fabric_addr);
}

int trk_client_register_publisher(struct trk_client *c, json_t *model,
				  json_t *layout,
				  const struct trk_rank_addr *ranks,
				  size_t nranks, trk_client_cb cb, void *arg)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr != NULL && i < nranks; i++)
		if (json_array_append_new(arr, rank_addr(&ranks[i])) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	if (arr == NULL)
		return -ENOMEM;
	return post_new(c, TRK_API "/publishers",
			json_pack("{s:O,s:O,s:o}", "model", model, "layout", layout,
				  "ranks", arr),
			cb, arg);
}

/* A registration sent by digest came back: a tracker that holds no such
 * layout (restarted, or the layout's last rank went) gets it in full, once. */
static void on_reg_answer(const struct trk_answer *a, void *arg)
{
	struct reg_retry *rr = arg;
	struct trk_client *c = rr->c;
	trk_client_cb cb = rr->cb;
	void *cb_arg = rr->arg;
	json_t *full = rr->full;
	/* POST /nodes is answered 404 only for a layout_digest it does not
	 * hold (API.md). */
	bool resend = a->status == 404;

	TAILQ_REMOVE(&c->regs, rr, link);
	free(rr);
	if (!resend || trk_client_post_json(c, TRK_API "/nodes", full, cb, cb_arg) != 0)
		cb(a, cb_arg);
	json_decref(full);
}

int trk_client_register_node(struct trk_client *c, const struct trk_node_reg *r,
			     trk_client_cb cb, void *arg)
{
	json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:s,s:o}", "replica", r->replica, "rank",
			      (json_int_t)r->addr.rank, "host", r->addr.host, "provider",
			      r->addr.provider, "fabric_addr", r->addr.fabric_addr,
			      "model_digest", hexj(r->model_digest, PROTO_HASH_BYTES));
	struct reg_retry *rr;
	json_t *full;
	int rc;

	if (o != NULL && r->layout_name != NULL &&
	    json_object_set_new(o, "layout_name", json_string(r->layout_name)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->statement_key != NULL &&
	    json_object_set_new(o, "statement_key", hexj(r->statement_key, TRK_STMT_PK_BYTES)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o == NULL)
		return -ENOMEM;
	if (r->layout_digest == NULL) {
		if (json_object_set(o, "layout", r->layout) != 0) {
			json_decref(o);
			return -ENOMEM;
		}
		return post_new(c, TRK_API "/nodes", o, cb, arg);
	}
	if (json_object_set_new(o, "layout_digest", hexj(r->layout_digest, PROTO_HASH_BYTES)) != 0 ||
	    (full = json_copy(o)) == NULL) {
		json_decref(o);
		return -ENOMEM;
	}
	rr = calloc(1, sizeof(*rr));
	if (rr == NULL || json_object_set(full, "layout", r->layout) != 0) {
		free(rr);
		json_decref(full);
		json_decref(o);
		return -ENOMEM;
	}
	*rr = (struct reg_retry){.c = c, .full = full, .cb = cb, .arg = arg};
	TAILQ_INSERT_TAIL(&c->regs, rr, link);
	rc = post_new(c, TRK_API "/nodes", o, on_reg_answer, rr);
	if (rc != 0) {
		TAILQ_REMOVE(&c->regs, rr, link);
		json_decref(full);
		free(rr);
	}
	return rc;
}

int trk_client_heartbeat(struct trk_client *c, const char *id, trk_client_cb cb,
			 void *arg)
{
	return post_new(c, TRK_API "/heartbeat", json_pack("{s:s}", "id", id), cb, arg);
}

static json_t *pins_json(const struct trk_pin_count *pins, size_t n)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr != NULL && i < PROTO_MIN(n, TRK_PIN_VERSIONS_MAX); i++)
		if (json_array_append_new(arr, json_pack("{s:I,s:I,s:I}", "version",
							 (json_int_t)pins[i].version, "pins",
							 (json_int_t)pins[i].pins, "requests",
							 (json_int_t)pins[i].requests)) != 0) {
			json_decref(arr);
			return NULL;
		}
	return arr;
}

int trk_client_heartbeat_pins(struct trk_client *c, const char *id,
			      const struct trk_pin_count *pins, size_t n, trk_client_cb cb,
			      void *arg)
{
	return post_new(c, TRK_API "/heartbeat",
			json_pack("{s:s,s:o}", "id", id, "pins", pins_json(pins, n)), cb, arg);
}

int trk_client_heartbeat_host(struct trk_client *c, const struct trk_hb_node *nodes, size_t n,
			      trk_client_cb cb, void *arg)
{
	json_t *o, *arr;

	if (n == 0 || n > TRK_HOST_HEARTBEAT_MAX)
		return -EINVAL;
	arr = json_array();
	for (size_t i = 0; arr != NULL && i < n; i++) {
		const char *ses = session_of(c, nodes[i].id);
		json_t *e = json_pack("{s:s,s:o}", "id", nodes[i].id, "pins",
				      pins_json(nodes[i].pins, nodes[i].npins));
		if (e != NULL && ses != NULL)
			json_object_set_new(e, "session", json_string(ses));
		if (e == NULL || json_array_append_new(arr, e) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	o = arr != NULL ? json_pack("{s:o}", "nodes", arr) : NULL;
	return post_new(c, TRK_API "/heartbeat", o, cb, arg);
}

int trk_client_publish(struct trk_client *c, const uint8_t *manifest, size_t len,
		       trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "POST", TRK_API "/versions",
				  "application/octet-stream", manifest, len, 0, cb, arg);
}

int trk_client_post_addendum(struct trk_client *c, const uint8_t *addendum, size_t len,
			     trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "POST", TRK_API "/addenda", "application/octet-stream",
				  addendum, len, 0, cb, arg);
}

/* GET TRK_API what?version=V&layout=HEX. */
static int get_version_layout(struct trk_client *c, const char *what, uint64_t version,
			      const uint8_t layout[PROTO_HASH_BYTES], trk_client_cb cb, void *arg)
{
	char path[200], hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "%s?version=%llu&layout=%s", what,
		 (unsigned long long)version, hex);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

static int get_addendum(struct trk_client *c, uint64_t version, const uint8_t layout[PROTO_HASH_BYTES],
			uint32_t wait_ms, bool copy, trk_client_cb cb, void *arg)
{
	char path[280], hex[2 * PROTO_HASH_BYTES + 1];

	if (wait_ms == 0 && !copy)
		return get_version_layout(c, "/addenda", version, layout, cb, arg);
	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "/addenda?version=%llu&layout=%s&wait_ms=%u%s",
		 (unsigned long long)version, hex, wait_ms, copy ? "&copy=1" : "");
	/* A long-poll: on a connection of its own (its timeout says so). */
	return trk_client_request(c, "GET", path, NULL, NULL, 0, c->timeout_ms + wait_ms, cb, arg);
}

int trk_client_get_addendum(struct trk_client *c, uint64_t version,
			    const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms,
			    trk_client_cb cb, void *arg)
{
	return get_addendum(c, version, layout, wait_ms, false, cb, arg);
}

int trk_client_get_copy(struct trk_client *c, uint64_t version,
			const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms, trk_client_cb cb,
			void *arg)
{
	return get_addendum(c, version, layout, wait_ms, true, cb, arg);
}

int trk_client_leave(struct trk_client *c, const char *id, trk_client_cb cb, void *arg)
{
	return post_new(c, TRK_API "/nodes/leave", json_pack("{s:s}", "id", id), cb, arg);
}

int trk_client_watch(struct trk_client *c, uint64_t after, uint32_t wait_ms,
		     trk_client_cb cb, void *arg)
{
	char path[128];

	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	snprintf(path, sizeof(path), TRK_API "/versions?after=%llu&wait_ms=%u",
		 (unsigned long long)after, wait_ms);
	return trk_client_request(c, "GET", path, NULL, NULL, 0,
				  c->timeout_ms + wait_ms, cb, arg);
}

int trk_client_watch_layouts(struct trk_client *c, uint64_t after, uint64_t layouts_rev,
			     uint32_t wait_ms, trk_client_cb cb, void *arg)
{
	char path[160];

	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	snprintf(path, sizeof(path), TRK_API "/versions?after=%llu&wait_ms=%u&layouts_rev=%llu",
		 (unsigned long long)after, wait_ms, (unsigned long long)layouts_rev);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, c->timeout_ms + wait_ms, cb, arg);
}

int trk_client_get_manifest(struct trk_client *c, uint64_t version,
			    trk_client_cb cb, void *arg)
{
	char path[128];

	snprintf(path, sizeof(path), TRK_API "/versions/%llu/manifest",
		 (unsigned long long)version);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

int trk_client_report_state(struct trk_client *c,
			    const struct trk_state_report *r, trk_client_cb cb,
			    void *arg)
{
	json_t *o = json_pack("{s:s,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "id", r->id, "version",
			      (json_int_t)r->version, "state", trk_state_name(r->state),
			      "bytes_done", (json_int_t)r->bytes_done, "bytes_total",
			      (json_int_t)r->bytes_total, "bytes_from_trainer",
			      (json_int_t)r->bytes_from_trainer, "bytes_from_peers",
			      (json_int_t)r->bytes_from_peers, "duplicate_bytes",
			      (json_int_t)r->duplicate_bytes, "refetched_bytes",
			      (json_int_t)r->refetched_bytes);

	if (o != NULL && r->error != NULL &&
	    json_object_set_new(o, "error", json_string(r->error)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->first_byte_ms != 0 &&
	    (json_object_set_new(o, "first_byte_ms", json_integer((json_int_t)r->first_byte_ms)) != 0 ||
	     json_object_set_new(o, "last_byte_ms", json_integer((json_int_t)r->last_byte_ms)) != 0)) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->statement != NULL &&
	    json_object_set_new(o, "statement", hexj(r->statement, TRK_STMT_SIG_BYTES)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->nbanned > 0) {
		json_t *ban = json_array();
		for (size_t i = 0; ban != NULL && i < r->nbanned; i++)
			if (json_array_append_new(ban, json_string(r->banned[i])) != 0) {
				json_decref(ban);
				ban = NULL;
			}
		if (ban == NULL || json_object_set_new(o, "banned", ban) != 0) {
			json_decref(o);
			o = NULL;
		}
	}
	if (o != NULL && ((r->how != NULL && json_object_set_new(o, "how", json_string(r->how)) != 0) ||
			  (r->need_anchor && json_object_set_new(o, "need_anchor", json_true()) != 0) ||
			  (r->seq != 0 && json_object_set_new(o, "seq", json_integer((json_int_t)r->seq)) != 0))) {
		json_decref(o);
		o = NULL;
	}
	return post_new(c, TRK_API "/nodes/state", o, cb, arg);
}

int trk_client_offer(struct trk_client *c, const char *id, uint64_t version,
		     const struct trk_offer *parcels, size_t n, trk_client_cb cb,
		     void *arg)
{
	return trk_client_offer_timed(c, id, version, 0, parcels, n, cb, arg);
}

int trk_client_offer_timed(struct trk_client *c, const char *id, uint64_t version,
			   uint64_t snapshot_ms, const struct trk_offer *parcels, size_t n,
			   trk_client_cb cb, void *arg)
{
	return trk_client_offer_slot(c, id, version, snapshot_ms, parcels, n, NULL, cb, arg);
}

int trk_client_offer_slot(struct trk_client *c, const char *id, uint64_t version,
			  uint64_t snapshot_ms, const struct trk_offer *parcels, size_t n,
			  const struct trk_offer *so, trk_client_cb cb, void *arg)
{
	json_t *arr = json_array(), *slot = NULL;

	if (so != NULL &&
	    (slot = json_pack("{s:o,s:o,s:I}", "addr", u64s(so->addr), "key", u64s(so->key), "len",
			      (json_int_t)so->len)) == NULL) {
		json_decref(arr);
		return -ENOMEM;
	}
	if (slot != NULL && so->partial &&
	    json_object_set_new(slot, "have", json_pack("{s:o,s:o}", "addr", u64s(so->have_addr),
							  "key", u64s(so->have_key))) != 0) {
		json_decref(slot);
		json_decref(arr);
		return -ENOMEM;
	}
	for (size_t i = 0; arr != NULL && i < n; i++) {
		const struct trk_offer *o = &parcels[i];
		if (json_array_append_new(
			    arr, json_pack("{s:o,s:I,s:I,s:o,s:o,s:I}", "layout",
					   hexj(o->layout, PROTO_HASH_BYTES), "src_rank",
					   (json_int_t)o->src_rank, "dst_rank",
					   (json_int_t)o->dst_rank, "addr", u64s(o->addr),
					   "key", u64s(o->key), "len", (json_int_t)o->len)) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	if (arr == NULL) {
		json_decref(slot);
		return -ENOMEM;
	}
	json_t *o = json_pack("{s:s,s:I,s:o}", "id", id, "version", (json_int_t)version, "parcels",
			      arr);
	if (o != NULL && slot != NULL && json_object_set(o, "slot", slot) != 0) {
		json_decref(o);
		o = NULL;
	}
	json_decref(slot);
	if (o != NULL && snapshot_ms != 0 &&
	    json_object_set_new(o, "snapshot_ms", json_integer((json_int_t)snapshot_ms)) != 0) {
		json_decref(o);
		o = NULL;
	}
	return post_new(c, TRK_API "/offers", o, cb, arg);
}

int trk_client_sources(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], uint32_t src_rank,
		       uint32_t dst_rank, trk_client_cb cb, void *arg)
{
	struct trk_parcel_key k = {.version = version, .src_rank = src_rank, .dst_rank = dst_rank};

	memcpy(k.layout, layout, PROTO_HASH_BYTES);
	return trk_client_sources_key(c, &k, cb, arg);
}

int trk_client_sources_key(struct trk_client *c, const struct trk_parcel_key *k, trk_client_cb cb,
			   void *arg)
{
	char path[320], hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), k->layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path),
		 TRK_API "/sources?version=%llu&layout=%s&src_rank=%u&dst_rank=%u%s%.*s",
		 (unsigned long long)k->version, hex, k->src_rank, k->dst_rank,
		 k->members_tag[0] ? "&members_tag=" : "", TRK_MEMBERS_TAG_HEX, k->members_tag);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

static int sources_batch(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			 bool shared, trk_client_cb cb, void *arg)
{
	char hex[2 * PROTO_HASH_BYTES + 1];
	json_t *arr;

	if (n == 0 || n > TRK_SOURCES_BATCH_MAX)
		return -EINVAL;
	arr = json_array();
	for (size_t i = 0; arr != NULL && i < n; i++) {
		sodium_bin2hex(hex, sizeof(hex), keys[i].layout, PROTO_HASH_BYTES);
		json_t *e = json_pack("{s:I,s:s,s:I,s:I}", "version", (json_int_t)keys[i].version,
				      "layout", hex, "src_rank", (json_int_t)keys[i].src_rank,
				      "dst_rank", (json_int_t)keys[i].dst_rank);
		if (e != NULL && keys[i].members_tag[0] != 0 &&
		    json_object_set_new(e, "members_tag", json_stringn(keys[i].members_tag,
								       strnlen(keys[i].members_tag,
									       TRK_MEMBERS_TAG_HEX))) != 0) {
			json_decref(e);
			e = NULL;
		}
		if (json_array_append_new(arr, e) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	json_t *body = arr != NULL ? json_pack("{s:o}", "parcels", arr) : NULL;
	if (body != NULL && shared && json_object_set_new(body, "shared_members", json_true()) != 0) {
		json_decref(body);
		body = NULL;
	}
	return post_new(c, TRK_API "/sources", body, cb, arg);
}

int trk_client_sources_batch(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			     trk_client_cb cb, void *arg)
{
	return sources_batch(c, keys, n, false, cb, arg);
}

int trk_client_sources_shared(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			      trk_client_cb cb, void *arg)
{
	return sources_batch(c, keys, n, true, cb, arg);
}

int trk_sources_expand(json_t *batch, const uint32_t *dst, size_t n)
{
	json_t *answers = json_object_get(batch, "answers"), *lists = json_object_get(batch, "replicas");
	char id[TRK_ID_MAX];

	for (size_t i = 0; i < n && i < json_array_size(answers); i++) {
		json_t *one = json_array_get(answers, i), *names, *v, *m;
		const char *of = json_string_value(json_object_get(one, "members_of"));
		size_t k;
		if (of == NULL)
			continue;
		if (!json_is_array(names = json_object_get(lists, of)))
			return -EPROTO;
		if ((m = json_array()) == NULL)
			return -ENOMEM;
		json_array_foreach(names, k, v) {
			int w = json_is_string(v) ? snprintf(id, sizeof(id), "%s/%u",
							     json_string_value(v), dst[i])
						  : -1;
			if (w < 0 || (size_t)w >= sizeof(id) ||
			    json_array_append_new(m, json_string(id)) != 0) {
				json_decref(m);
				return w < 0 || (size_t)w >= sizeof(id) ? -EPROTO : -ENOMEM;
			}
		}
		if (json_object_set_new(one, "members", m) != 0)
			return -ENOMEM;
		json_object_del(one, "members_of");
	}
	return 0;
}

int trk_client_holders(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], trk_client_cb cb, void *arg)
{
	return get_version_layout(c, "/holders", version, layout, cb, arg);
}

int trk_client_layouts(struct trk_client *c, trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "GET", TRK_API "/layouts", NULL, NULL, 0, 0, cb, arg);
}

int trk_client_replica(struct trk_client *c, const char *replica, trk_client_cb cb,
		       void *arg)
{
	char path[256];
	int n = snprintf(path, sizeof(path), TRK_API "/replicas/%s", replica);

	if (n < 0 || (size_t)n >= sizeof(path) || strpbrk(replica, "/?#%") != NULL)
		return -EINVAL;
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

int trk_client_status(struct trk_client *c, trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "GET", TRK_API "/status", NULL, NULL, 0, 0, cb, arg);
}

/* ---- answer parsers ------------------------------------------------------------- */

static int jstr(json_t *o, const char *key, char *out, size_t cap,
		struct proto_err *err)
{
	const char *s = json_string_value(json_object_get(o, key));

	if (s == NULL || strlen(s) >= cap)
		return proto_errf(err, EINVAL, "%s: missing or too long", key);
	memcpy(out, s, strlen(s) + 1);
	return 0;
}

static int ju64(json_t *o, const char *key, uint64_t *out, struct proto_err *err)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return proto_errf(err, EINVAL, "%s: not a non-negative integer", key);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int ju64s(json_t *o, const char *key, uint64_t *out, struct proto_err *err)
{
	const char *s = json_string_value(json_object_get(o, key));

	if (s == NULL || proto_parse_u64(s, 0, UINT64_MAX, out) != 0)
		return proto_errf(err, EINVAL, "%s: not a decimal string", key);
	return 0;
}

int trk_versions_now(json_t *answer, uint64_t *now_ms, struct proto_err *err)
{
	*now_ms = 0;
	if (json_object_get(answer, "now_ms") == NULL)
		return 0;
	return ju64(answer, "now_ms", now_ms, err);
}

void trk_sources_free(struct trk_source *s, size_t n)
{
	for (size_t i = 0; s != NULL && i < n; i++)
		free(s[i].fabric_addr);
	free(s);
}

int trk_sources_parse(json_t *answer, struct trk_source **out, size_t *n,
		      struct proto_err *err)
{
	json_t *arr = json_object_get(answer, "sources"), *e;
	struct trk_source *s;
	size_t i, cnt;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!json_is_array(arr))
		return proto_errf(err, EINVAL, "sources: missing");
	cnt = json_array_size(arr);
	s = calloc(cnt ? cnt : 1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	json_array_foreach(arr, i, e) {
		struct trk_source *x = &s[i];
		const char *kind = json_string_value(json_object_get(e, "kind"));
		const char *hex = json_string_value(json_object_get(e, "fabric_addr"));
		size_t hl = hex ? strlen(hex) : 0;
		if (kind == NULL || (strcmp(kind, "peer") != 0 &&
				     strcmp(kind, "publisher") != 0)) {
			rc = proto_errf(err, EINVAL, "sources[%zu].kind: bad", i);
			goto fail;
		}
		x->peer = strcmp(kind, "peer") == 0;
		if ((rc = jstr(e, "id", x->id, sizeof(x->id), err)) != 0 ||
		    (rc = jstr(e, "host", x->host, sizeof(x->host), err)) != 0 ||
		    (rc = jstr(e, "provider", x->provider, sizeof(x->provider), err)) != 0 ||
		    (rc = ju64s(e, "addr", &x->addr, err)) != 0 ||
		    (rc = ju64s(e, "key", &x->key, err)) != 0 ||
		    (rc = ju64(e, "len", &x->len, err)) != 0)
			goto fail;
		json_t *hv = json_object_get(e, "have");
		if (hv != NULL && (!json_is_object(hv) || ju64s(hv, "addr", &x->have_addr, err) != 0 ||
				   ju64s(hv, "key", &x->have_key, err) != 0)) {
			rc = proto_errf(err, EINVAL, "sources[%zu].have: bad", i);
			goto fail;
		}
		x->partial = hv != NULL;
		if (hl == 0 || hl % 2 != 0 ||
		    (x->fabric_addr = malloc(hl / 2)) == NULL ||
		    sodium_hex2bin(x->fabric_addr, hl / 2, hex, hl, NULL,
				   &x->fabric_addr_len, NULL) != 0 ||
		    x->fabric_addr_len != hl / 2) {
			rc = proto_errf(err, EINVAL, "sources[%zu].fabric_addr: bad hex", i);
			goto fail;
		}
	}
	*out = s;
	*n = cnt;
	return 0;
fail:
	trk_sources_free(s, cnt);
	return rc;
}

/* retain_layouts: absent (an older tracker) or too many to list means keep
 * every layout; anything but an array of layout digests is an error. */
static int parse_retain_layouts(json_t *e, size_t i, struct trk_version_info *v,
				struct proto_err *err)
{
	json_t *a = json_object_get(e, "retain_layouts"), *d;
	size_t k;

	v->all_layouts = a == NULL || json_array_size(a) > TRK_RETAIN_LAYOUTS_MAX;
	if (a == NULL)
		return 0;
	if (!json_is_array(a))
		return proto_errf(err, EINVAL, "versions[%zu].retain_layouts: not an array", i);
	json_array_foreach(a, k, d) {
		uint8_t tmp[PROTO_HASH_BYTES];
		if (proto_parse_hex(json_string_value(d), tmp, PROTO_HASH_BYTES) != 0)
			return proto_errf(err, EINVAL, "versions[%zu].retain_layouts[%zu]: bad digest",
					  i, k);
		if (!v->all_layouts)
			memcpy(v->layouts[v->nlayouts++], tmp, PROTO_HASH_BYTES);
	}
	return 0;
}

/* uncovered_layouts (the latest version's only; digests) and addenda
 * (objects with layout_digest): absent means none; past
 * TRK_RETAIN_LAYOUTS_MAX the first ones are kept. */
static int parse_layout_list(json_t *e, size_t i, const char *key, const char *field,
			     uint8_t (*out)[PROTO_HASH_BYTES], uint32_t *n,
			     struct proto_err *err)
{
	json_t *a = json_object_get(e, key), *d;
	size_t k;

	if (a == NULL)
		return 0;
	if (!json_is_array(a))
		return proto_errf(err, EINVAL, "versions[%zu].%s: not an array", i, key);
	json_array_foreach(a, k, d) {
		if (*n == TRK_RETAIN_LAYOUTS_MAX)
			break;
		if (field != NULL && json_is_true(json_object_get(d, "copy")))
			continue; /* a raw copy of a listed layout adds none */
		if (field != NULL)
			d = json_object_get(d, field);
		if (proto_parse_hex(json_string_value(d), out[*n], PROTO_HASH_BYTES) != 0)
			return proto_errf(err, EINVAL, "versions[%zu].%s[%zu]: bad digest", i, key,
					  k);
		(*n)++;
	}
	return 0;
}

int trk_versions_parse(json_t *answer, uint64_t *latest,
		       struct trk_version_info **out, size_t *n,
		       struct proto_err *err)
{
	json_t *arr = json_object_get(answer, "versions"), *e;
	struct trk_version_info *v;
	size_t i, cnt;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = ju64(answer, "latest", latest, err)) != 0)
		return rc;
	if (!json_is_array(arr))
		return proto_errf(err, EINVAL, "versions: missing");
	cnt = json_array_size(arr);
	v = calloc(cnt ? cnt : 1, sizeof(*v));
	if (v == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	json_array_foreach(arr, i, e) {
		const char *kind = json_string_value(json_object_get(e, "kind"));
		const char *d = json_string_value(json_object_get(e, "digest"));
		if ((rc = ju64(e, "version", &v[i].version, err)) != 0 ||
		    (rc = ju64(e, "parent", &v[i].parent, err)) != 0 ||
		    (rc = ju64(e, "wire_bytes", &v[i].wire_bytes, err)) != 0 ||
		    (rc = ju64(e, "created_ms", &v[i].created_ms, err)) != 0 ||
		    (rc = ju64(e, "published_ms", &v[i].published_ms, err)) != 0)
			goto fail;
		if (kind == NULL || (strcmp(kind, "anchor") != 0 && strcmp(kind, "delta") != 0)) {
			rc = proto_errf(err, EINVAL, "versions[%zu].kind: bad", i);
			goto fail;
		}
		v[i].kind = strcmp(kind, "delta") == 0 ? PROTO_KIND_DELTA : PROTO_KIND_ANCHOR;
		if (proto_parse_hex(d, v[i].digest, PROTO_HASH_BYTES) != 0) {
			rc = proto_errf(err, EINVAL, "versions[%zu].digest: bad", i);
			goto fail;
		}
		v[i].retain = json_is_true(json_object_get(e, "retain"));
		v[i].chain = json_is_true(json_object_get(e, "chain"));
		v[i].dropped = json_is_true(json_object_get(e, "dropped"));
		if ((rc = parse_retain_layouts(e, i, &v[i], err)) != 0 ||
		    (rc = parse_layout_list(e, i, "uncovered_layouts", NULL, v[i].uncovered,
					       &v[i].nuncovered, err)) != 0 ||
		    (rc = parse_layout_list(e, i, "addenda", "layout_digest", v[i].added,
					       &v[i].nadded, err)) != 0 ||
		    (rc = parse_layout_list(e, i, "copy_wanted", NULL, v[i].copy_wanted,
					       &v[i].ncopy_wanted, err)) != 0)
			goto fail;
	}
	*out = v;
	*n = cnt;
	return 0;
fail:
	free(v);
	return rc;
}

/* ---- blocking use ---------------------------------------------------------------- */

void trk_reply_init(struct trk_reply *r)
{
	memset(r, 0, sizeof(*r));
}

void trk_reply_fini(struct trk_reply *r)
{
	json_decref(r->json);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

void trk_reply_cb(const struct trk_answer *a, void *arg)
{
	struct trk_reply *r = arg;

	r->done = true;
	r->status = a->status;
	r->json = json_incref(a->json);
	r->body = malloc(a->len + 1);
	if (r->body != NULL) {
		memcpy(r->body, a->body, a->len);
		r->body[a->len] = 0;
		r->len = a->len;
	}
	snprintf(r->error, sizeof(r->error), "%s", a->error ? a->error : "");
}

void trk_client_wait(struct trk_client *c, struct trk_reply *r)
{
	while (!r->done)
		if (event_base_loop(c->base, EVLOOP_ONCE) != 0)
			break;
}

int trk_client_call(struct trk_client *c, const char *method,
		    const char *path_query, const char *ctype, const void *body,
		    size_t len, struct trk_reply *r)
{
	int rc;

	trk_reply_init(r);
	rc = trk_client_request(c, method, path_query, ctype, body, len, 0,
				trk_reply_cb, r);
	if (rc != 0) {
		snprintf(r->error, sizeof(r->error), "request not sent: %s", strerror(-rc));
		return rc;
	}
	trk_client_wait(c, r);
	if (!r->done)
		return -EIO;
	return r->status < 0 ? r->status : 0;
}
