/* The tracker's HTTP server: listener, routing, limits, auth gate, answers. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <malloc.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

#define MAX_HEADERS_SIZE (16u << 10) /* request line and headers, bytes */
#define MAX_URI 2048

/* ---- answers ---------------------------------------------------------- */

const char *trk__reason(int code)
{
	switch (code) {
	case 200: return "OK";
	case 201: return "Created";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 411: return "Length Required";
	case 413: return "Payload Too Large";
	case 503: return "Service Unavailable";
	default: return code < 400 ? "OK" : "Internal Server Error";
	}
}

static void count_answer(struct trk_server *s, int code)
{
	int cls = code / 100;
	if (cls >= 1 && cls <= 5)
		s->answers[cls]++;
}

static void send_buf(struct trk_server *s, struct evhttp_request *req, int code,
		     const char *ctype, const void *buf, size_t len)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	struct evbuffer *out = evbuffer_new();

	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Cache-Control", "no-store");
	if (s->auth != NULL)
		evhttp_add_header(h, TRK_EPOCH_HEADER, trk__auth_epoch(s->auth));
	if (s->vs != NULL) {
		char chain[TRK_CHAIN_MAX];
		trk__versions_chain(s->vs, chain, sizeof(chain));
		evhttp_add_header(h, TRK_CHAIN_HEADER, chain);
	}
	if (out != NULL && len > 0 && evbuffer_add(out, buf, len) != 0) {
		evbuffer_free(out);
		out = NULL;
	}
	if (out == NULL && len > 0)
		code = 500;
	count_answer(s, code);
	evhttp_send_reply(req, code, trk__reason(code), out);
	if (out != NULL)
		evbuffer_free(out);
}

char *trk__json_text(const json_t *obj, size_t *len)
{
	char *txt = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;

	if (txt == NULL)
		return NULL;
	size_t n = strlen(txt);
	/* One trailing newline makes curl output readable. */
	char *t = realloc(txt, n + 2);
	if (t != NULL) {
		txt = t;
		txt[n++] = '\n';
		txt[n] = 0;
	}
	*len = n;
	return txt;
}

void trk__reply_req_text(struct trk_server *s, struct evhttp_request *req, int code,
			 const char *txt, size_t len)
{
	static const char oom[] = "{\"error\":\"out of memory\"}\n";

	if (txt == NULL)
		send_buf(s, req, 500, "application/json", oom, sizeof(oom) - 1);
	else
		send_buf(s, req, code, "application/json", txt, len);
}

void trk__reply_req_json(struct trk_server *s, struct evhttp_request *req,
			 int code, json_t *obj)
{
	size_t n = 0;
	char *txt = trk__json_text(obj, &n);

	json_decref(obj);
	trk__reply_req_text(s, req, code, txt, n);
	free(txt);
}

void trk__reply_json(struct trk_call *c, int code, json_t *obj)
{
	if (c->answered) {
		json_decref(obj);
		return;
	}
	c->answered = true;
	trk__reply_req_json(c->s, c->req, code, obj);
}

void trk__reply_req_raw(struct trk_server *s, struct evhttp_request *req, int code,
			const char *ctype, const void *buf, size_t len)
{
	send_buf(s, req, code, ctype, buf, len);
}

void trk__reply_raw(struct trk_call *c, int code, const char *ctype,
		    const void *buf, size_t len)
{
	if (c->answered)
		return;
	c->answered = true;
	send_buf(c->s, c->req, code, ctype, buf, len);
}

void trk__fail(struct trk_call *c, int code, const char *fmt, ...)
{
	char msg[600];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	LOG_INFO("%s %s -> %d %s", c->post ? "POST" : "GET", c->path, code, msg);
	trk__reply_json(c, code, json_pack("{s:s}", "error", msg));
}

/* ---- JSON field helpers ------------------------------------------------ */

void trk__hex(const uint8_t *b, size_t n, char *out)
{
	sodium_bin2hex(out, 2 * n + 1, b, n);
}

json_t *trk__json_hex(const uint8_t *b, size_t n)
{
	char *s = malloc(2 * n + 1);
	json_t *j;

	if (s == NULL)
		return NULL;
	trk__hex(b, n, s);
	j = json_string(s);
	free(s);
	return j;
}

int trk__set(json_t *o, const char *key, json_t *v)
{
	return v == NULL || json_object_set_new(o, key, v) != 0;
}

json_t *trk__jint(uint64_t v)
{
	return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *field(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_null(v) ? NULL : v;
}

int trk__get_str(json_t *o, const char *key, bool required, size_t maxlen,
		 const char **out, struct proto_err *err)
{
	json_t *v = field(o, key);
	const char *s;
	size_t n;

	if (v == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (!json_is_string(v))
		return proto_errf(err, EINVAL, "%s: must be a string", key);
	s = json_string_value(v);
	n = json_string_length(v);
	if (n == 0 || n > maxlen || strlen(s) != n)
		return proto_errf(err, EINVAL, "%s: must be 1..%zu bytes, no NUL",
				  key, maxlen);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return proto_errf(err, EINVAL,
					  "%s: control characters are not allowed",
					  key);
	*out = s;
	return 0;
}

int trk__get_u64(json_t *o, const char *key, bool required, uint64_t max,
		 uint64_t *out, struct proto_err *err)
{
	json_t *v = field(o, key);
	json_int_t i;

	if (v == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (!json_is_integer(v))
		return proto_errf(err, EINVAL, "%s: must be an integer", key);
	i = json_integer_value(v);
	if (i < 0 || (uint64_t)i > max)
		return proto_errf(err, EINVAL, "%s: must be in 0..%llu", key,
				  (unsigned long long)max);
	*out = (uint64_t)i;
	return 0;
}

int trk__get_u64_str(json_t *o, const char *key, uint64_t *out,
		     struct proto_err *err)
{
	json_t *v = field(o, key);

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v) ||
	    proto_parse_u64(json_string_value(v), 0, UINT64_MAX, out) != 0)
		return proto_errf(err, EINVAL,
				  "%s: must be a decimal u64 in a string", key);
	return 0;
}

int trk__get_hex(json_t *o, const char *key, uint8_t *out, size_t n,
		 struct proto_err *err)
{
	json_t *v = field(o, key);

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v) || proto_parse_hex(json_string_value(v), out, n) != 0)
		return proto_errf(err, EINVAL, "%s: must be %zu hex digits", key,
				  2 * n);
	return 0;
}

int trk__get_hexvar(json_t *o, const char *key, size_t max, char **out,
		    struct proto_err *err)
{
	json_t *v = field(o, key);
	const char *s;
	size_t n;
	char *copy;

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v))
		return proto_errf(err, EINVAL, "%s: must be a hex string", key);
	s = json_string_value(v);
	n = strlen(s);
	if (n == 0 || n % 2 != 0 || n / 2 > max || n != json_string_length(v))
		return proto_errf(err, EINVAL,
				  "%s: must be an even number of hex digits, 2..%zu",
				  key, 2 * max);
	copy = malloc(n + 1);
	if (copy == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", key);
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (ch >= 'A' && ch <= 'F')
			ch = (char)(ch - 'A' + 'a');
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
			free(copy);
			return proto_errf(err, EINVAL, "%s: not hex", key);
		}
		copy[i] = ch;
	}
	copy[n] = 0;
	*out = copy;
	return 0;
}

const char *trk__query_str(struct trk_call *c, const char *key)
{
	return evhttp_find_header(&c->query, key);
}

int trk__query_u64(struct trk_call *c, const char *key, bool required,
		   uint64_t max, uint64_t *out, struct proto_err *err)
{
	const char *s = trk__query_str(c, key);

	if (s == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (proto_parse_u64(s, 0, max, out) != 0)
		return proto_errf(err, EINVAL, "%s: must be an integer in 0..%llu",
				  key, (unsigned long long)max);
	return 0;
}

/* ---- routing ----------------------------------------------------------- */

enum body_kind { BODY_NONE, BODY_JSON, BODY_MANIFEST };

struct route {
	const char *path;
	bool post;
	enum body_kind body;
	void (*fn)(struct trk_call *c);
};

static const struct route routes[] = {
	{"/", false, BODY_NONE, trk__handle_page},
	{"/metrics", false, BODY_NONE, trk__handle_metrics},
	{TRK_API "/status", false, BODY_NONE, trk__handle_status},
	{TRK_API "/layouts", false, BODY_NONE, trk__handle_layouts},
	{TRK_API "/versions", false, BODY_NONE, trk__handle_versions},
	{TRK_API "/sources", false, BODY_NONE, trk__handle_sources},
	{TRK_API "/sources", true, BODY_JSON, trk__handle_sources_batch},
	{TRK_API "/holders", false, BODY_NONE, trk__handle_holders},
	{TRK_API "/publishers", true, BODY_JSON, trk__handle_publishers},
	{TRK_API "/nodes", true, BODY_JSON, trk__handle_nodes},
	{TRK_API "/heartbeat", true, BODY_JSON, trk__handle_heartbeat},
	{TRK_API "/nodes/state", true, BODY_JSON, trk__handle_node_state},
	{TRK_API "/nodes/leave", true, BODY_JSON, trk__handle_leave},
	{TRK_API "/offers", true, BODY_JSON, trk__handle_offers},
	{TRK_API "/versions", true, BODY_MANIFEST, trk__handle_publish},
	{TRK_API "/addenda", false, BODY_NONE, trk__handle_addendum_get},
	{TRK_API "/addenda", true, BODY_MANIFEST, trk__handle_addendum_post},
	{TRK_API "/canary/expected", true, BODY_JSON, trk__handle_canary_expected},
	{TRK_API "/canary", true, BODY_JSON, trk__handle_canary_live},
};

#define VERSIONS_PREFIX TRK_API "/versions/"
#define REPLICAS_PREFIX TRK_API "/replicas/"

/* GET routes with a parameter in the path. Returns true when handled. */
static bool route_param(struct trk_call *c)
{
	size_t vp = strlen(VERSIONS_PREFIX), rp = strlen(REPLICAS_PREFIX);

	if (strncmp(c->path, VERSIONS_PREFIX, vp) == 0) {
		const char *v = c->path + vp, *slash = strchr(v, '/');
		char num[32];
		if (slash == NULL ||
		    (strcmp(slash, "/manifest") != 0 && strcmp(slash, "/timeline") != 0) ||
		    (size_t)(slash - v) >= sizeof(num))
			return false;
		if (c->post) {
			trk__fail(c, 405, "%s takes GET", c->path);
			return true;
		}
		memcpy(num, v, (size_t)(slash - v));
		num[slash - v] = 0;
		if (strcmp(slash, "/timeline") == 0)
			trk__handle_timeline(c, num);
		else
			trk__handle_manifest(c, num);
		return true;
	}
	if (strncmp(c->path, REPLICAS_PREFIX, rp) == 0) {
		if (c->post) {
			trk__fail(c, 405, "%s takes GET", c->path);
			return true;
		}
		trk__handle_replica(c, c->path + rp);
		return true;
	}
	return false;
}

/* The body cap of a POST to path: its route's, or the JSON cap for paths
 * that will be answered 404/405 anyway. */
static size_t post_cap(const char *path)
{
	for (size_t i = 0; i < PROTO_ARRAY_LEN(routes); i++)
		if (routes[i].post && strcmp(routes[i].path, path) == 0)
			return routes[i].body == BODY_MANIFEST ?
				       (size_t)proto_param(PROTO_PARAM_MANIFEST_MAX) :
				       TRK_JSON_MAX;
	return TRK_JSON_MAX;
}

int trk__head_verdict(struct trk_server *s, const struct trk_head *h,
		      char *msg, size_t cap)
{
	struct proto_err err = {{0}};
	char path[sizeof(h->uri)];
	size_t limit;
	uint64_t len;

	if (strcmp(h->method, "POST") != 0) {
		/* Reads take no body: a declared one is refused unread. */
		if (h->chunked || h->content_length > (int64_t)TRK_JSON_MAX) {
			snprintf(msg, cap, "a %s body is not read", h->method);
			return 413;
		}
		return 0;
	}
	snprintf(path, sizeof(path), "%s", h->uri);
	path[strcspn(path, "?#")] = 0;
	limit = post_cap(path);
	/* Tighter limits before authentication: size first. */
	if (h->chunked) {
		snprintf(msg, cap, "a POST needs a Content-Length (no chunked bodies)");
		return 411;
	}
	len = h->content_length < 0 ? 0 : (uint64_t)h->content_length;
	if (len > limit) {
		snprintf(msg, cap, "body of %llu bytes is over the %zu allowed",
			 (unsigned long long)len, limit);
		return 413;
	}
	if (s->auth != NULL &&
	    trk__auth_check_head(s->auth, "POST", h->uri,
				 h->has_auth ? h->auth : NULL, len,
				 proto_wall_ms() / 1000, &err) != 0) {
		snprintf(msg, cap, "%s", err.msg);
		return 401;
	}
	return 0;
}

void trk__session_new(char out[2 * TRK_SESSION_BYTES + 1])
{
	uint8_t b[TRK_SESSION_BYTES];

	randombytes_buf(b, sizeof(b));
	sodium_bin2hex(out, 2 * TRK_SESSION_BYTES + 1, b, sizeof(b));
}

/* Each node speaks only for itself: on a keyed tracker, a heartbeat, report
 * or offer for a live node id needs that node's session credential, and a
 * registration cannot take over a live node id (unless it comes from the
 * node itself). Returns 0 to go on, else the code answered. */
static int check_session(struct trk_call *c, const struct route *rt)
{
	char idbuf[TRK_ID_MAX + 32];
	const char *id = NULL, *have;
	struct trk_node *n;
	bool reg = rt->fn == trk__handle_nodes;

	if (c->s->auth == NULL || c->json == NULL ||
	    !(reg || rt->fn == trk__handle_heartbeat ||
	      rt->fn == trk__handle_node_state || rt->fn == trk__handle_offers ||
	      rt->fn == trk__handle_leave))
		return 0;
	if (reg) {
		json_t *rep = json_object_get(c->json, "replica");
		json_t *rank = json_object_get(c->json, "rank");

		if (!json_is_string(rep) || !json_is_integer(rank))
			return 0; /* the handler answers 400 */
		snprintf(idbuf, sizeof(idbuf), "%s/%lld", json_string_value(rep),
			 (long long)json_integer_value(rank));
		id = idbuf;
	} else {
		id = json_string_value(json_object_get(c->json, "id"));
	}
	if (id == NULL)
		return 0;
	n = trk__node_find(c->s->reg, id);
	if (n == NULL || !n->alive)
		return 0; /* unknown or gone: the handler decides (404 / new) */
	have = evhttp_find_header(evhttp_request_get_input_headers(c->req),
				  TRK_SESSION_HEADER);
	if (have != NULL && strlen(have) == strlen(n->session) &&
	    sodium_memcmp(have, n->session, strlen(n->session)) == 0)
		return 0;
	if (reg) {
		trk__fail(c, 409, "node %s is live: a second registration cannot "
			  "take it over (wait for its lease to end)", id);
		return 409;
	}
	c->s->auth_refused++;
	trk__fail(c, 403, "node %s: wrong or missing %s: a node speaks only "
		  "for itself", id, TRK_SESSION_HEADER);
	return 403;
}

static void dispatch(struct evhttp_request *req, void *arg)
{
	struct trk_server *s = arg;
	struct trk_call call = {.s = s, .req = req, .path = "?"};
	struct trk_call *c = &call;
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *raw_uri = evhttp_request_get_uri(req);
	const struct route *rt = NULL;
	bool path_known = false;
	struct proto_err err = {{0}};

	bool refused;

	TAILQ_INIT(&c->query);
	c->post = cmd == EVHTTP_REQ_POST;
	trk__conns_request(s->conns, req, &refused);
	if (refused) {
		/* Answered before its body; the connection is closing. */
		evhttp_send_error(req, 400, NULL);
		return;
	}
	if (uri == NULL || raw_uri == NULL) {
		trk__fail(c, 400, "malformed request URI");
		return;
	}
	c->path = evhttp_uri_get_path(uri);
	if (c->path == NULL || c->path[0] == 0)
		c->path = "/";
	if (strlen(raw_uri) > MAX_URI) {
		trk__fail(c, 400, "request URI longer than %u bytes", MAX_URI);
		return;
	}
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD &&
	    cmd != EVHTTP_REQ_POST) {
		trk__fail(c, 405, "only GET, HEAD and POST are served");
		return;
	}
	if (evhttp_uri_get_query(uri) != NULL &&
	    evhttp_parse_query_str(evhttp_uri_get_query(uri), &c->query) != 0) {
		trk__fail(c, 400, "malformed query string");
		goto out;
	}

	for (size_t i = 0; i < PROTO_ARRAY_LEN(routes); i++) {
		if (strcmp(routes[i].path, c->path) != 0)
			continue;
		path_known = true;
		if (routes[i].post == c->post)
			rt = &routes[i];
	}
	if (rt == NULL) {
		trk__registry_sweep(s->reg);
		if (path_known)
			trk__fail(c, 405, "%s does not take %s", c->path,
				  c->post ? "POST" : "GET");
		else if (!route_param(c))
			trk__fail(c, 404, "no such endpoint: %s", c->path);
		goto out;
	}

	/* Sources hand out memory keys: members only (tracker.h). */
	if (!c->post && (rt->fn == trk__handle_sources || rt->fn == trk__handle_holders) &&
	    s->auth != NULL) {
		const char *h = evhttp_find_header(
			evhttp_request_get_input_headers(req), "Authorization");
		if (trk__auth_check(s->auth, "GET", raw_uri, h, NULL, 0,
				    proto_wall_ms() / 1000, &err) != 0) {
			s->auth_refused++;
			trk__fail(c, 401, "%s", err.msg);
			goto out;
		}
	}
	if (c->post) {
		struct evbuffer *in = evhttp_request_get_input_buffer(req);
		size_t cap = rt->body == BODY_MANIFEST ?
				     (size_t)proto_param(PROTO_PARAM_MANIFEST_MAX) :
				     TRK_JSON_MAX;
		c->len = evbuffer_get_length(in);
		/* Tighter limits before authentication: size first. */
		if (c->len > cap) {
			trk__fail(c, 413, "body of %zu bytes is over the %zu allowed",
				  c->len, cap);
			goto out;
		}
		c->body = c->len > 0 ? evbuffer_pullup(in, -1) : (const uint8_t *)"";
		if (c->body == NULL) {
			trk__fail(c, 500, "out of memory");
			goto out;
		}
		if (s->auth != NULL) {
			const char *h = evhttp_find_header(
				evhttp_request_get_input_headers(req), "Authorization");
			if (trk__auth_check(s->auth, "POST", raw_uri, h, c->body,
					    c->len, proto_wall_ms() / 1000,
					    &err) != 0) {
				s->auth_refused++;
				trk__fail(c, 401, "%s", err.msg);
				goto out;
			}
		}
		if (rt->body == BODY_JSON) {
			json_error_t jerr;
			c->json = json_loadb((const char *)c->body, c->len,
					     JSON_REJECT_DUPLICATES, &jerr);
			if (c->json == NULL) {
				trk__fail(c, 400, "bad JSON: %s at line %d column %d",
					  jerr.text, jerr.line, jerr.column);
				goto out;
			}
			if (!json_is_object(c->json)) {
				trk__fail(c, 400, "bad JSON: the body must be an object");
				goto out;
			}
		}
	}
	trk__registry_sweep(s->reg);
	if (check_session(c, rt) != 0)
		goto out;
	rt->fn(c);
	if (!c->answered)
		trk__fail(c, 500, "internal error: no answer");
out:
	if (s->conns != NULL)
		trk__conns_handled(s->conns, req);
	json_decref(c->json);
	evhttp_clear_headers(&c->query);
	/* A big body's buffers went back to malloc: give them to the system
	 * too, so one large request does not pin the tracker's memory. */
	if (c->len > (1u << 20))
		malloc_trim(0);
}

/* ---- listener ---------------------------------------------------------- */

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
	struct trk_server *s = arg;
	trk__registry_sweep(s->reg);
}

/* Splits "host:port" or "[v6]:port" into host (in buf) and port. */
static int parse_listen(const char *spec, char *host, size_t hostlen,
			uint16_t *port, struct proto_err *err)
{
	const char *colon = strrchr(spec, ':'), *h = spec;
	size_t hl;
	uint64_t p;

	if (colon == NULL || proto_parse_u64(colon + 1, 0, 65535, &p) != 0)
		return proto_errf(err, EINVAL, "--listen %s: want HOST:PORT", spec);
	hl = (size_t)(colon - spec);
	if (hl >= 2 && spec[0] == '[' && spec[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl == 0 || hl >= hostlen)
		return proto_errf(err, EINVAL, "--listen %s: bad host", spec);
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (uint16_t)p;
	return 0;
}

static int bound_port(evutil_socket_t fd, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
		return -errno;
	if (ss.ss_family == AF_INET)
		*port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	else if (ss.ss_family == AF_INET6)
		*port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	else
		return -EAFNOSUPPORT;
	return 0;
}

/* Binds host:port with the configured backlog (libevent's default is
 * small) and hands the listener to evhttp, which then owns it. */
static int listen_on(struct trk_server *s, const char *host, uint16_t port,
		     struct proto_err *err)
{
	struct evutil_addrinfo hints = {0}, *ai = NULL;
	struct evconnlistener *lev = NULL;
	char portstr[8];
	int gai, backlog = (int)PROTO_MIN(proto_param(PROTO_PARAM_LISTEN_BACKLOG), INT32_MAX);

	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = EVUTIL_AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
	gai = evutil_getaddrinfo(host, portstr, &hints, &ai);
	if (gai != 0)
		return proto_errf(err, EADDRNOTAVAIL, "%s", evutil_gai_strerror(gai));
	lev = evconnlistener_new_bind(s->base, NULL, NULL,
				      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
					      LEV_OPT_REUSEABLE,
				      backlog > 0 ? backlog : -1, ai->ai_addr,
				      (int)ai->ai_addrlen);
	evutil_freeaddrinfo(ai);
	if (lev == NULL)
		return proto_errf(err, EADDRNOTAVAIL, "%s", strerror(errno));
	s->sock = evhttp_bind_listener(s->http, lev);
	if (s->sock == NULL) {
		evconnlistener_free(lev);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	return 0;
}

int trk_server_new(struct event_base *base, const struct trk_server_opts *o,
		   struct trk_server **out, struct proto_err *err)
{
	struct trk_server *s;
	char host[256];
	uint16_t port = 0;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	if ((rc = parse_listen(o->listen, host, sizeof(host), &port, err)) != 0)
		return rc;
	/* Three priorities, before any event of ours: everything at the
	 * middle one (libevent's default for new events), held watches'
	 * connections and their wake-ups below it (conns.c, versions.c). */
	if (event_base_get_npriorities(base) == 1)
		event_base_priority_init(base, 3);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	s->base = base;
	s->started_ms = proto_wall_ms();
	s->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
	if ((o->tls_cert != NULL || o->tls_key != NULL) &&
	    (rc = trk__tls_server_ctx(o->tls_cert, o->tls_key, &s->tls, err)) != 0)
		goto fail;
	if (o->cluster_key != NULL) {
		if (trk__auth_new(o->cluster_key, proto_param(PROTO_PARAM_AUTH_WINDOW_S),
				  &s->auth) != 0) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto fail;
		}
	} else {
		LOG_WARN("no --cluster-key: POST requests are not authenticated");
	}
	s->http = evhttp_new(base);
	if (s->http == NULL) {
		rc = proto_errf(err, ENOMEM, "evhttp_new failed");
		goto fail;
	}
	/* evhttp buffers a body before calling us; this caps it at the largest
	 * body any route takes (a manifest). The connection guard (conns.c)
	 * judges each head first: route caps and the head mac are checked
	 * before a byte of body is kept. */
	evhttp_set_max_body_size(s->http,
				 (ev_ssize_t)proto_param(PROTO_PARAM_MANIFEST_MAX));
	evhttp_set_max_headers_size(s->http, MAX_HEADERS_SIZE);
	evhttp_set_timeout(s->http, 60);
	/* Every method reaches dispatch(), which answers 405 in JSON. */
	evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST |
						    EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
						    EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
						    EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT |
						    EVHTTP_REQ_PATCH);
	evhttp_set_gencb(s->http, dispatch, s);
	/* Bound before the state is opened: a tracker that cannot listen
	 * (the port is taken) leaves no state directory behind. Nothing is
	 * served before the loop runs. */
	if ((rc = listen_on(s, host, port, err)) != 0) {
		proto_err_prefix(err, "cannot listen on %s", o->listen);
		goto fail;
	}
	if ((rc = trk__versions_open(o->state_dir, o->trainer_pk, &s->vs, err)) != 0)
		goto fail;
	if ((rc = trk__addenda_open(s, o->state_dir, &s->ad, err)) != 0)
		goto fail;
	if ((rc = trk__canary_new(&s->canary)) != 0) {
		proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if ((rc = trk__registry_new(s, &s->reg)) != 0) {
		proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if ((rc = trk__conns_new(s, &s->conns)) != 0) {
		rc = proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if (bound_port(evhttp_bound_socket_get_fd(s->sock), &port) != 0) {
		rc = proto_errf(err, EIO, "cannot read the bound port");
		goto fail;
	}
	snprintf(s->url, sizeof(s->url), strchr(host, ':') ? "%s://[%s]:%u" : "%s://%s:%u",
		 s->tls != NULL ? "https" : "http", host, (unsigned)port);
	s->sweep_ev = event_new(base, -1, EV_PERSIST, sweep_cb, s);
	if (s->sweep_ev == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	uint64_t every = PROTO_MAX(PROTO_MIN(s->lease_ms / 4, 500), 10);
	struct timeval tv = {(time_t)(every / 1000), (suseconds_t)(every % 1000) * 1000};
	event_add(s->sweep_ev, &tv);
	LOG_INFO("tracker on %s, %zu versions, lease %llu ms", s->url,
		 trk__versions_count(s->vs), (unsigned long long)s->lease_ms);
	*out = s;
	return 0;
fail:
	trk_server_free(s);
	return rc;
}

const char *trk_server_url(const struct trk_server *s)
{
	return s->url;
}

void trk_server_free(struct trk_server *s)
{
	if (s == NULL)
		return;
	if (s->sweep_ev != NULL)
		event_free(s->sweep_ev);
	/* Held long-polls first: evhttp_free frees their requests. */
	if (s->vs != NULL)
		trk__versions_drop_waiters(s->vs);
	if (s->http != NULL)
		evhttp_free(s->http);
	trk__conns_free(s->conns);
	trk__registry_free(s->reg);
	trk__addenda_free(s->ad);
	trk__canary_free(s->canary);
	trk__versions_free(s->vs);
	trk__auth_free(s->auth);
	trk__tls_ctx_free(s->tls);
	free(s);
}
