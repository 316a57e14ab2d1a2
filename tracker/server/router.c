/* The tracker's router: each request to its handler, through the gates a
 * request passes first: size, authentication, the node's own session. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <malloc.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/queue.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

#define MAX_URI 2048

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
	{"/healthz", false, BODY_NONE, trk__handle_healthz},
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
#define PAGE_VERSIONS_PREFIX "/versions/"

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
	/* /versions/N: a version's page (HTML). */
	if (strncmp(c->path, PAGE_VERSIONS_PREFIX, strlen(PAGE_VERSIONS_PREFIX)) == 0 &&
	    strchr(c->path + strlen(PAGE_VERSIONS_PREFIX), '/') == NULL) {
		if (c->post) {
			trk__fail(c, 405, "%s takes GET", c->path);
			return true;
		}
		trk__handle_version_page(c, c->path + strlen(PAGE_VERSIONS_PREFIX));
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
		      bool *authed, bool *routine, char *msg, size_t cap)
{
	struct proto_err err = {{0}};
	char path[sizeof(h->uri)];
	size_t limit;
	uint64_t len;

	*authed = false;
	*routine = false;
	if (strcmp(h->method, "POST") != 0) {
		/* Only a POST carries a body: any other is refused unread
		 * (the router would refuse the method after it anyway). */
		if (strcmp(h->method, "GET") != 0 && strcmp(h->method, "HEAD") != 0) {
			snprintf(msg, cap, "only GET, HEAD and POST are served");
			return 405;
		}
		if (h->chunked || h->content_length > 0) {
			snprintf(msg, cap, "a %s carries no body", h->method);
			return 413;
		}
		/* A signed read (sources, holders, a node's watch) is a
		 * member's; the router checks it in full. */
		*authed = s->auth != NULL && h->has_auth &&
			  trk__auth_check_head(s->auth, h->method, h->uri, h->auth, 0,
					       proto_wall_ms() / 1000, &err) == 0;
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
	if (s->auth != NULL) {
		int rc = trk__auth_check_head(s->auth, "POST", h->uri,
					      h->has_auth ? h->auth : NULL, len,
					      proto_wall_ms() / 1000, &err);
		if (rc != 0) {
			snprintf(msg, cap, "%s", err.msg);
			*routine = rc == -EAGAIN;
			return 401;
		}
	}
	*authed = s->auth != NULL;
	return 0;
}

bool trk__session_presented(const struct evkeyvalq *headers, const char *ses)
{
	const char *have = evhttp_find_header(headers, TRK_SESSION_HEADER);

	return have != NULL && strlen(have) == strlen(ses) &&
	       sodium_memcmp(have, ses, strlen(ses)) == 0;
}

/* Each node and publisher speaks only for itself: on a keyed tracker, a
 * heartbeat, report or offer for a live node or publisher id needs its
 * session credential, and a registration cannot take over a live node id
 * (unless it comes from the node itself; publishers.c checks a
 * publisher's ranks). Returns 0 to go on, else the code answered. */
static int check_session(struct trk_call *c, const struct route *rt)
{
	char idbuf[TRK_ID_MAX + 32];
	const char *id = NULL, *ses;
	struct trk_node *n;
	struct trk_publisher *p = NULL;
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
	if (n == NULL && !reg)
		p = trk__publisher_find(c->s->reg, id);
	if ((n == NULL || !n->alive) && (p == NULL || !p->alive))
		return 0; /* unknown or gone: the handler decides (404 / new) */
	ses = n != NULL ? n->session : p->session;
	if (trk__session_presented(c->headers, ses))
		return 0;
	if (reg) {
		trk__fail(c, 409, "node %s is live: a second registration cannot "
			  "take it over (wait for its lease to end)", id);
		return 409;
	}
	c->s->auth_refused++;
	trk__fail(c, 403, "%s %s: wrong or missing %s: a %s speaks only for itself",
		  n != NULL ? "node" : "publisher", id, TRK_SESSION_HEADER,
		  n != NULL ? "node" : "publisher");
	return 403;
}

void trk__route_request(struct trk_server *s, const struct trk_request *r,
			struct trk_outcome *out)
{
	struct trk_call call = {.s = s, .req = r->req, .out = out, .headers = r->headers,
				.path = "?"};
	struct trk_call *c = &call;
	enum evhttp_cmd_type cmd = r->cmd;
	const struct evhttp_uri *uri = r->uri;
	const char *raw_uri = r->raw_uri;
	const struct route *rt = NULL;
	bool path_known = false;
	struct proto_err err = {{0}};

	if (r->req == NULL)
		memset(out, 0, sizeof(*out));
	TAILQ_INIT(&c->query);
	c->post = cmd == EVHTTP_REQ_POST;
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
	/* A standby hands everything on but its metrics (and its health,
	 * which says so). */
	if (s->standby && strcmp(c->path, "/metrics") != 0 && strcmp(c->path, "/healthz") != 0) {
		trk__fail_routine(c, 503, "standby: the leading tracker is %s",
				  s->leader[0] ? s->leader : "not known yet");
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
		const char *h = evhttp_find_header(r->headers, "Authorization");
		if (trk__auth_check(s->auth, "GET", raw_uri, h, NULL, 0,
				    proto_wall_ms() / 1000, &err) != 0) {
			s->auth_refused++;
			trk__fail(c, 401, "%s", err.msg);
			goto out;
		}
	}
	if (c->post) {
		size_t cap = rt->body == BODY_MANIFEST ?
				     (size_t)proto_param(PROTO_PARAM_MANIFEST_MAX) :
				     TRK_JSON_MAX;
		c->len = r->body != NULL ? evbuffer_get_length(r->body) : 0;
		/* Tighter limits before authentication: size first. */
		if (c->len > cap) {
			trk__fail(c, 413, "body of %zu bytes is over the %zu allowed",
				  c->len, cap);
			goto out;
		}
		c->body = c->len > 0 ? evbuffer_pullup(r->body, -1) : (const uint8_t *)"";
		if (c->body == NULL) {
			trk__fail(c, 500, "out of memory");
			goto out;
		}
		if (s->auth != NULL) {
			const char *h = evhttp_find_header(r->headers, "Authorization");
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
	if (s->conns != NULL && r->req != NULL)
		trk__conns_handled(s->conns, r->req);
	json_decref(c->json);
	evhttp_clear_headers(&c->query);
	/* A big body's buffers went back to malloc: give them to the system
	 * too, so one large request does not pin the tracker's memory. */
	if (c->len > (1u << 20))
		malloc_trim(0);
}

void trk__route(struct evhttp_request *req, void *arg)
{
	struct trk_server *s = arg;
	struct trk_request r = {
		.cmd = evhttp_request_get_command(req),
		.raw_uri = evhttp_request_get_uri(req),
		.uri = evhttp_request_get_evhttp_uri(req),
		.headers = evhttp_request_get_input_headers(req),
		.body = evhttp_request_get_input_buffer(req),
		.req = req,
	};
	bool refused;

	trk__conns_request(s->conns, req, &refused);
	if (refused) {
		/* Answered before its body; the connection is closing. */
		evhttp_send_error(req, 400, NULL);
		return;
	}
	trk__route_request(s, &r, NULL);
}
