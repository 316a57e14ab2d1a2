/* etcd's v3 API through its HTTP/JSON gateway (/v3/kv/..., /v3/lease/...),
 * one blocking call at a time on a private event loop. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "proto/optval.h"
#include "tracker/wire/etcd.h"
#include "tracker/wire/tls.h"

/*
 * The gateway speaks JSON over HTTP/1.1: keys and values in base64, 64-bit
 * integers as strings. Each call opens a connection to the endpoint that
 * answered last, with a deadline; an endpoint that does not answer, or
 * answers that it cannot serve now (no etcd leader, a timed-out proposal:
 * gRPC codes 4 and 14), hands the call to the next one. Reads are
 * linearizable (etcd's default): what a call reads, a quorum has.
 */
#define ANSWER_MAX (8u << 20) /* the most a gateway answer may hold */

struct endpoint {
	char host[256];
	uint16_t port;
};

struct trk_etcd {
	struct endpoint ep[TRK_ETCD_ENDPOINTS_MAX];
	size_t n, cur;
	char prefix[160]; /* "/tessera/NAME/" */
	char url[600];
	struct ssl_ctx_st *tls;
	unsigned timeout_ms;
	struct event_base *base;
	/* Kept open between calls (HTTP/1.1 keep-alive), one per endpoint;
	 * dropped when a call on it fails. */
	struct evhttp_connection *conn[TRK_ETCD_ENDPOINTS_MAX];
};

struct call {
	bool done, late, answered; /* answered: evhttp called back (req is gone) */
	int status;
	struct evbuffer *body;
	char why[160];
	struct bufferevent *bev;
};

static int name_ok(const char *s)
{
	size_t n = strlen(s);
	return n >= 1 && n <= 64 && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 &&
	       strspn(s, "abcdefghijklmnopqrstuvwxyz"
			 "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == n;
}

int trk_etcd_new(const struct trk_etcd_opts *o, struct trk_etcd **out, struct proto_err *err)
{
	struct trk_etcd *e;
	const char *p, *name = "default";
	char list[512];
	bool tls;
	int rc;

	*out = NULL;
	if (strncmp(o->url, "etcd://", 7) == 0)
		tls = false, p = o->url + 7;
	else if (strncmp(o->url, "etcds://", 8) == 0)
		tls = true, p = o->url + 8;
	else
		return proto_errf(err, EINVAL, "%s: want etcd://HOST:PORT[,HOST:PORT...][/NAME] "
				  "(etcds:// for TLS)", o->url);
	if (strlen(p) >= sizeof(list))
		return proto_errf(err, EINVAL, "store URL too long");
	snprintf(list, sizeof(list), "%s", p);
	char *slash = strchr(list, '/');
	if (slash != NULL) {
		*slash = 0;
		name = slash + 1;
		if (!name_ok(name))
			return proto_errf(err, EINVAL, "%s: the name after / wants 1..64 of "
					  "[A-Za-z0-9._-]", o->url);
	}
	if (!tls && (o->cert != NULL || o->ca != NULL))
		return proto_errf(err, EINVAL, "--etcd-ca, --etcd-cert: want an etcds:// store");
	if ((o->cert == NULL) != (o->key == NULL))
		return proto_errf(err, EINVAL, "--etcd-cert and --etcd-key go together");
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	e->timeout_ms = o->timeout_ms ? o->timeout_ms : 2000;
	if (list[0] == ',' || strstr(list, ",,") != NULL || (list[0] && list[strlen(list) - 1] == ',')) {
		rc = proto_errf(err, EINVAL, "%s: an empty endpoint in the list", o->url);
		goto fail;
	}
	for (char *save = NULL, *t = strtok_r(list, ",", &save); t != NULL;
	     t = strtok_r(NULL, ",", &save)) {
		if (e->n == TRK_ETCD_ENDPOINTS_MAX) {
			rc = proto_errf(err, EINVAL, "%s: at most %d endpoints", o->url,
					TRK_ETCD_ENDPOINTS_MAX);
			goto fail;
		}
		if (proto_hostport_parse(t, e->ep[e->n].host, sizeof(e->ep[e->n].host),
					 &e->ep[e->n].port) != 0 || e->ep[e->n].port == 0) {
			rc = proto_errf(err, EINVAL, "%s: endpoint '%s': want HOST:PORT", o->url, t);
			goto fail;
		}
		e->n++;
	}
	if (e->n == 0) {
		rc = proto_errf(err, EINVAL, "%s: no endpoint", o->url);
		goto fail;
	}
	snprintf(e->prefix, sizeof(e->prefix), "/tessera/%s/", name);
	snprintf(e->url, sizeof(e->url), "%s", o->url);
	if (tls) {
		if ((rc = trk__tls_client_ctx(o->ca, &e->tls, err)) != 0) {
			if (o->ca != NULL)
				proto_errf(err, -rc, "--etcd-ca %s: no PEM CA certificate", o->ca);
			goto fail;
		}
		if (o->cert != NULL && (rc = trk__tls_client_cert(e->tls, o->cert, o->key, err)) != 0) {
			proto_err_prefix(err, "--etcd-cert");
			goto fail;
		}
	}
	e->base = event_base_new();
	if (e->base == NULL) {
		rc = proto_errf(err, ENOMEM, "event_base_new failed");
		goto fail;
	}
	*out = e;
	return 0;
fail:
	trk_etcd_free(e);
	return rc;
}

void trk_etcd_free(struct trk_etcd *e)
{
	if (e == NULL)
		return;
	for (size_t i = 0; i < e->n; i++)
		if (e->conn[i] != NULL)
			evhttp_connection_free(e->conn[i]);
	trk__tls_ctx_free(e->tls);
	if (e->base != NULL)
		event_base_free(e->base);
	free(e);
}

const char *trk_etcd_url(const struct trk_etcd *e)
{
	return e->url;
}

static void on_answer(struct evhttp_request *req, void *arg)
{
	struct call *c = arg;

	c->done = c->answered = true;
	if (req == NULL || evhttp_request_get_response_code(req) == 0) {
		if (c->bev == NULL || !trk__tls_failure(c->bev, c->why, sizeof(c->why)))
			snprintf(c->why, sizeof(c->why), "connection refused or closed");
		return;
	}
	c->status = evhttp_request_get_response_code(req);
	evbuffer_add_buffer(c->body, evhttp_request_get_input_buffer(req));
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	struct call *c = arg;

	c->done = c->late = true;
}

/* Endpoint i's connection, made when there is none. */
static struct evhttp_connection *conn_of(struct trk_etcd *e, size_t i)
{
	const struct endpoint *ep = &e->ep[i];
	struct bufferevent *bev = NULL;

	if (e->conn[i] != NULL)
		return e->conn[i];
	if (e->tls != NULL && (bev = trk__tls_client_bev(e->tls, e->base, ep->host)) == NULL)
		return NULL;
	e->conn[i] = evhttp_connection_base_bufferevent_new(e->base, NULL, bev, ep->host, ep->port);
	if (e->conn[i] != NULL) {
		/* Per read or write; the call's deadline (call) comes first. */
		struct timeval tv = {2 * e->timeout_ms / 1000, (2 * e->timeout_ms % 1000) * 1000};
		evhttp_connection_set_timeout_tv(e->conn[i], &tv);
		evhttp_connection_set_max_body_size(e->conn[i], ANSWER_MAX);
	}
	return e->conn[i];
}

/* gRPC codes that say "this member cannot serve now; another may". */
static bool retry_elsewhere(int status, const json_t *j)
{
	json_int_t code = json_integer_value(json_object_get(j, "code"));
	return status >= 500 && (code == 4 || code == 14 || code == 0);
}

/*
 * POSTs req (JSON) to path on one endpoint after another, starting with the
 * last that answered, until one answers for itself, each within
 * timeout_ms all told (a member that trickles its answer is cut off too).
 * *out: the answer's JSON object (HTTP 200).
 */
static int call(struct trk_etcd *e, const char *path, const json_t *req, json_t **out,
		struct proto_err *err)
{
	char *body = json_dumps(req, JSON_COMPACT);
	char whys[512] = "";
	bool tls_failed = false, tls_closed = false;
	int rc = -EIO;

	*out = NULL;
	if (body == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (size_t k = 0; k < e->n; k++) {
		size_t i = (e->cur + k) % e->n;
		const struct endpoint *ep = &e->ep[i];
		struct call c = {.body = evbuffer_new()};
		struct evhttp_connection *conn = conn_of(e, i);
		struct evhttp_request *r = NULL;
		struct timeval tv = {e->timeout_ms / 1000, (e->timeout_ms % 1000) * 1000};
		struct event *deadline = evtimer_new(e->base, on_deadline, &c);
		char host[300];
		json_t *j = NULL;

		r = conn != NULL && c.body != NULL && deadline != NULL ?
			    evhttp_request_new(on_answer, &c) : NULL;
		if (r == NULL) {
			if (deadline != NULL)
				event_free(deadline);
			if (c.body != NULL)
				evbuffer_free(c.body);
			rc = proto_errf(err, ENOMEM, "out of memory");
			break;
		}
		c.bev = evhttp_connection_get_bufferevent(conn);
		snprintf(host, sizeof(host), strchr(ep->host, ':') ? "[%s]:%u" : "%s:%u", ep->host,
			 (unsigned)ep->port);
		evhttp_add_header(evhttp_request_get_output_headers(r), "Host", host);
		evhttp_add_header(evhttp_request_get_output_headers(r), "Content-Type",
				  "application/json");
		evbuffer_add(evhttp_request_get_output_buffer(r), body, strlen(body));
		evtimer_add(deadline, &tv);
		if (evhttp_make_request(conn, r, EVHTTP_REQ_POST, path) != 0)
			snprintf(c.why, sizeof(c.why), "cannot send");
		else
			while (!c.done && event_base_loop(e->base, EVLOOP_ONCE) == 0)
				;
		event_free(deadline);
		if (c.late && !c.answered) {
			evhttp_cancel_request(r);
			snprintf(c.why, sizeof(c.why), "no answer in %u ms", e->timeout_ms);
		}
		if (c.status == 0) { /* a connection that failed is made anew */
			evhttp_connection_free(conn);
			e->conn[i] = NULL;
		}
		if (c.status != 0) {
			size_t n = evbuffer_get_length(c.body);
			j = json_loadb((const char *)evbuffer_pullup(c.body, -1), n, 0, NULL);
		}
		evbuffer_free(c.body);
		if (c.status == 200 && json_is_object(j)) {
			e->cur = (e->cur + k) % e->n;
			*out = j;
			rc = 0;
			break;
		}
		if (c.status != 0 && !retry_elsewhere(c.status, j)) {
			const char *m = json_string_value(json_object_get(j, "error"));
			if (m == NULL)
				m = json_string_value(json_object_get(j, "message"));
			rc = proto_errf(err, EPROTO, "etcd %s:%u %s: HTTP %d: %s", ep->host,
					(unsigned)ep->port, path, c.status,
					m != NULL ? m : "not an etcd answer");
			json_decref(j);
			break;
		}
		if (c.status != 0) {
			const char *m = json_string_value(json_object_get(j, "error"));
			snprintf(c.why, sizeof(c.why), "HTTP %d: %s", c.status, m ? m : "unavailable");
		}
		json_decref(j);
		tls_failed |= strncmp(c.why, "TLS", 3) == 0;
		/* A member that refuses our certificate may close before its
		 * alert is read (TLS 1.3 checks it after the handshake). */
		tls_closed |= e->tls != NULL && c.status == 0 && !c.late;
		size_t w = strlen(whys);
		snprintf(whys + w, sizeof(whys) - w, "%s%s:%u %s", w ? "; " : "", ep->host,
			 (unsigned)ep->port, c.why);
	}
	free(body);
	if (rc == -EIO)
		proto_errf(err, EIO, "etcd: no endpoint answered %s (%s)%s", path, whys,
			   tls_failed ? ": check --etcd-ca, --etcd-cert and --etcd-key" :
			   tls_closed ? " (if etcd is up: check --etcd-ca, --etcd-cert and --etcd-key)" : "");
	return rc;
}

/* base64 of n bytes, as a JSON string. */
static json_t *b64(const void *buf, size_t n)
{
	size_t cap = sodium_base64_encoded_len(n, sodium_base64_VARIANT_ORIGINAL);
	char *s = malloc(cap);
	json_t *j;

	if (s == NULL)
		return NULL;
	sodium_bin2base64(s, cap, buf, n, sodium_base64_VARIANT_ORIGINAL);
	j = json_string(s);
	free(s);
	return j;
}

static json_t *b64_key(const struct trk_etcd *e, const char *key)
{
	char full[512];

	snprintf(full, sizeof(full), "%s%s", e->prefix, key);
	return b64(full, strlen(full));
}

/* Decodes a base64 JSON string into a fresh buffer (NUL past *len). */
static int unb64(const json_t *j, size_t cap, uint8_t **out, size_t *len,
		 struct proto_err *err)
{
	const char *s = json_string_value(j);
	size_t n = s != NULL ? strlen(s) : 0, got = 0;
	uint8_t *buf;

	*out = NULL;
	*len = 0;
	if (j != NULL && s == NULL)
		return proto_errf(err, EPROTO, "etcd: a value that is not a string");
	if (n / 4 * 3 > cap + 3)
		return proto_errf(err, EMSGSIZE, "etcd: a value over %zu bytes", cap);
	buf = malloc(n / 4 * 3 + 4);
	if (buf == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if (n > 0 && sodium_base642bin(buf, n / 4 * 3 + 3, s, n, NULL, &got, NULL,
				       sodium_base64_VARIANT_ORIGINAL) != 0) {
		free(buf);
		return proto_errf(err, EPROTO, "etcd: a value that is not base64");
	}
	if (got > cap) {
		free(buf);
		return proto_errf(err, EMSGSIZE, "etcd: a value over %zu bytes", cap);
	}
	buf[got] = 0;
	*out = buf;
	*len = got;
	return 0;
}

/* The gateway writes int64 as a string; an integer is taken too. */
static int64_t jint(const json_t *j)
{
	if (json_is_integer(j))
		return json_integer_value(j);
	if (json_is_string(j))
		return strtoll(json_string_value(j), NULL, 10);
	return 0;
}

static json_t *put_request(const struct trk_etcd *e, const char *key, const void *val,
			   size_t len, int64_t lease)
{
	json_t *r = json_object();

	json_object_set_new(r, "key", b64_key(e, key));
	json_object_set_new(r, "value", b64(val, len));
	if (lease != 0)
		json_object_set_new(r, "lease", json_integer(lease));
	return r;
}

/* Reads key (its value too unless keys_only): *ans (the caller drops it)
 * and its kv in *kv, or -ENOENT. */
static int range_one(struct trk_etcd *e, const char *key, bool keys_only, json_t **ans,
		     json_t **kv, struct proto_err *err)
{
	json_t *req = json_object();
	int rc;

	json_object_set_new(req, "key", b64_key(e, key));
	if (keys_only)
		json_object_set_new(req, "keys_only", json_true());
	rc = call(e, "/v3/kv/range", req, ans, err);
	json_decref(req);
	if (rc != 0)
		return rc;
	*kv = json_array_get(json_object_get(*ans, "kvs"), 0);
	if (*kv != NULL)
		return 0;
	json_decref(*ans);
	*ans = NULL;
	return -ENOENT;
}

int trk_etcd_get(struct trk_etcd *e, const char *key, size_t cap, uint8_t **val, size_t *len,
		 struct proto_err *err)
{
	json_t *ans = NULL, *kv = NULL;
	int rc;

	*val = NULL;
	*len = 0;
	if ((rc = range_one(e, key, false, &ans, &kv, err)) != 0)
		return rc;
	rc = unb64(json_object_get(kv, "value"), cap, val, len, err);
	json_decref(ans);
	return rc;
}

int trk_etcd_lease_of(struct trk_etcd *e, const char *key, int64_t *lease, struct proto_err *err)
{
	json_t *ans = NULL, *kv = NULL;
	int rc;

	*lease = 0;
	if ((rc = range_one(e, key, true, &ans, &kv, err)) != 0)
		return rc;
	*lease = jint(json_object_get(kv, "lease"));
	json_decref(ans);
	return 0;
}

int trk_etcd_put(struct trk_etcd *e, const char *key, const void *val, size_t len,
		 int64_t lease, struct proto_err *err)
{
	json_t *req = put_request(e, key, val, len, lease), *ans = NULL;
	int rc = call(e, "/v3/kv/put", req, &ans, err);

	json_decref(req);
	json_decref(ans);
	return rc;
}

int trk_etcd_delete(struct trk_etcd *e, const char *key, struct proto_err *err)
{
	json_t *req = json_object(), *ans = NULL;
	int rc;

	json_object_set_new(req, "key", b64_key(e, key));
	rc = call(e, "/v3/kv/deleterange", req, &ans, err);
	json_decref(req);
	json_decref(ans);
	return rc;
}

int trk_etcd_put_if(struct trk_etcd *e, const char *key, const void *val, size_t len,
		    int64_t lease, const struct trk_etcd_if *cond, struct proto_err *err)
{
	json_t *req, *ans = NULL, *cmp = json_array(), *fail = json_array(), *rs;
	char lease_s[24];
	int rc;

	if (cond->cur != NULL) {
		*cond->cur = NULL;
		*cond->curlen = 0;
	}
	/* The key's create revision is 0 (it does not exist); the fence's
	 * lease is ours. On failure both are read back to say which. */
	if (cond->absent)
		json_array_append_new(cmp, json_pack("{s:o, s:s, s:s, s:s}", "key", b64_key(e, key),
						     "target", "CREATE", "result", "EQUAL",
						     "create_revision", "0"));
	json_array_append_new(fail, json_pack("{s:{s:o}}", "request_range", "key", b64_key(e, key)));
	if (cond->fence_key != NULL) {
		snprintf(lease_s, sizeof(lease_s), "%lld", (long long)cond->fence_lease);
		json_array_append_new(cmp, json_pack("{s:o, s:s, s:s, s:s}", "key",
						     b64_key(e, cond->fence_key), "target", "LEASE",
						     "result", "EQUAL", "lease", lease_s));
		json_array_append_new(fail, json_pack("{s:{s:o}}", "request_range", "key",
						      b64_key(e, cond->fence_key)));
	}
	req = json_pack("{s:o, s:[{s:o}], s:o}", "compare", cmp, "success", "request_put",
			put_request(e, key, val, len, lease), "failure", fail);
	if (req == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	rc = call(e, "/v3/kv/txn", req, &ans, err);
	json_decref(req);
	if (rc != 0)
		return rc;
	if (json_is_true(json_object_get(ans, "succeeded"))) {
		json_decref(ans);
		return 0;
	}
	rs = json_object_get(ans, "responses");
#define KV_OF(i)                                                                                  \
	json_array_get(json_object_get(json_object_get(json_array_get(rs, i), "response_range"), \
				       "kvs"),                                                    \
		       0)
	json_t *have = KV_OF(0), *fence = cond->fence_key != NULL ? KV_OF(1) : NULL;
#undef KV_OF
	if (cond->fence_key != NULL &&
	    (fence == NULL || jint(json_object_get(fence, "lease")) != cond->fence_lease)) {
		rc = proto_errf(err, EPERM, "%s is no longer held by this tracker's lease",
				cond->fence_key);
	} else if (have != NULL) {
		rc = -EEXIST;
		if (cond->cur != NULL &&
		    unb64(json_object_get(have, "value"), ANSWER_MAX, cond->cur, cond->curlen, err) != 0)
			rc = -EPROTO;
	} else {
		rc = proto_errf(err, EPROTO, "etcd: a transaction failed for no reason it shows");
	}
	json_decref(ans);
	return rc;
}

int trk_etcd_keys(struct trk_etcd *e, const char *prefix,
		  int (*fn)(const char *key, void *arg), void *arg, struct proto_err *err)
{
	char full[512];
	json_t *req, *ans = NULL, *kvs, *kv;
	size_t n, i, skip = strlen(e->prefix);
	int rc;

	n = (size_t)snprintf(full, sizeof(full), "%s%s", e->prefix, prefix);
	req = json_object();
	json_object_set_new(req, "key", b64(full, n));
	full[n - 1]++; /* the range's end: the prefix's last byte plus one */
	json_object_set_new(req, "range_end", b64(full, n));
	json_object_set_new(req, "keys_only", json_true());
	json_object_set_new(req, "sort_order", json_string("ASCEND"));
	json_object_set_new(req, "sort_target", json_string("KEY"));
	rc = call(e, "/v3/kv/range", req, &ans, err);
	json_decref(req);
	if (rc != 0)
		return rc;
	kvs = json_object_get(ans, "kvs");
	json_array_foreach(kvs, i, kv) {
		uint8_t *k;
		size_t klen;
		if ((rc = unb64(json_object_get(kv, "key"), 1024, &k, &klen, err)) != 0)
			break;
		if (klen < skip || memcmp(k, e->prefix, skip) != 0 || strlen((char *)k) != klen) {
			free(k);
			rc = proto_errf(err, EPROTO, "etcd: a key outside the range asked");
			break;
		}
		rc = fn((const char *)k + skip, arg);
		free(k);
		if (rc != 0)
			break;
	}
	json_decref(ans);
	return rc;
}

/* POSTs {key: n} to path: the answer in *ans (the caller drops it). */
static int call_int(struct trk_etcd *e, const char *path, const char *key, int64_t n,
		    json_t **ans, struct proto_err *err)
{
	json_t *req = json_pack("{s:I}", key, (json_int_t)n);
	int rc = req != NULL ? call(e, path, req, ans, err) : proto_errf(err, ENOMEM, "out of memory");

	json_decref(req);
	return rc;
}

int trk_etcd_lease_grant(struct trk_etcd *e, unsigned ttl_s, int64_t *id, struct proto_err *err)
{
	json_t *ans = NULL;
	int rc = call_int(e, "/v3/lease/grant", "TTL", ttl_s, &ans, err);

	if (rc != 0)
		return rc;
	*id = jint(json_object_get(ans, "ID"));
	if (*id == 0) {
		const char *m = json_string_value(json_object_get(ans, "error"));
		rc = proto_errf(err, EPROTO, "etcd: no lease granted: %s", m ? m : "no ID");
	}
	json_decref(ans);
	return rc;
}

int trk_etcd_lease_keepalive(struct trk_etcd *e, int64_t id, struct proto_err *err)
{
	json_t *ans = NULL;
	int rc = call_int(e, "/v3/lease/keepalive", "ID", id, &ans, err);

	if (rc != 0)
		return rc;
	/* An expired lease comes back without a TTL (or 0). */
	if (jint(json_object_get(json_object_get(ans, "result"), "TTL")) <= 0)
		rc = -ENOENT;
	json_decref(ans);
	return rc;
}

int trk_etcd_lease_revoke(struct trk_etcd *e, int64_t id, struct proto_err *err)
{
	json_t *ans = NULL;
	int rc = call_int(e, "/v3/lease/revoke", "ID", id, &ans, err);

	json_decref(ans);
	return rc;
}
