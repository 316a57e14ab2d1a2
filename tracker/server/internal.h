/* The tracker server's internals, shared by the files of tracker/server/:
 * the server and one request being handled, the HTTP plumbing under the
 * endpoints, the JSON views and the endpoints themselves. The state they
 * read and change is in state.h; tracker/README.md says which file does
 * what, and what may call what.
 */
#ifndef TRACKER_SERVER_INTERNAL_H
#define TRACKER_SERVER_INTERNAL_H

#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto/util.h"
#include "tracker/server/state.h"
#include "tracker/server/store.h"
#include "tracker/tracker.h"
#include "tracker/wire/tls.h"

struct trk_auth;
struct trk_conns;
struct trk_watches;

struct trk_server {
	struct event_base *base;
	struct evhttp *http;
	struct evhttp_bound_socket *sock;
	struct event *sweep_ev;
	char url[300];
	uint64_t lease_ms;
	struct trk_auth *auth; /* NULL: POSTs are not authenticated */
	struct trk_store *st; /* where durable state lives (store.c) */
	struct trk_versions *vs;
	struct trk_registry *reg;
	uint64_t started_ms;
	/* Counters for /metrics. */
	uint64_t answers[6]; /* by status class: [2] = 2xx, ... */
	uint64_t auth_refused;
	struct trk_conns *conns;   /* the connection guard (conns.c) */
	struct trk_watches *w;     /* requests held: watches, addendum waits */
	struct trk_addenda *ad;    /* layouts added to published versions */
	struct ssl_ctx_st *tls;    /* NULL: plain HTTP (wire/tls.c) */
	struct trk_canary *canary; /* expected canary scores (canary.c) */
	/* Several trackers on one etcd store (lead.c); NULL: this one alone. */
	struct trk_lead *lead;
	bool standby;           /* another leads: every request is handed on */
	char leader[300];       /* the leader's URL as last read ("": not known) */
	uint64_t lead_since_ms; /* took over from another (0: led from the start) */
	int exit_code;          /* why the loop was broken (trk_server_exit_code) */
	bool trainer_pk_set;
	uint8_t trainer_pk[PROTO_PK_BYTES]; /* --trainer-pubkey, for a reload */
};

/* ---- lead.c: one leader among the trackers of a store ---- */

struct trk_lead;
/* Takes a lease on the store's etcd and leads, or stands by (s->standby),
 * trying again every ttl_s / 3 seconds. */
int trk__lead_new(struct trk_server *s, unsigned ttl_s, struct trk_lead **out,
		  struct proto_err *err);
/* Stops the tracker (status 3) for why: it may no longer lead, or the
 * store holds what it did not write; a restart loads the store again. */
void trk__lead_stop(struct trk_server *s, const char *why);
/* Gives the lead up (the lease revoked) and frees. NULL is fine. */
void trk__lead_free(struct trk_lead *l);

/* A request as the router takes it once evhttp parsed it: its method, URI
 * (as sent, and parsed), headers and body. Borrowed for one call. */
struct trk_request {
	enum evhttp_cmd_type cmd;
	const char *raw_uri;             /* NULL: none */
	const struct evhttp_uri *uri;    /* raw_uri parsed; NULL: it did not parse */
	const struct evkeyvalq *headers; /* never NULL */
	struct evbuffer *body;           /* a POST's body; NULL: none */
	/* The connection's request, answered (or held) through evhttp; NULL:
	 * the request has no connection, and its answer is written to the
	 * trk_answer the router is given instead. */
	struct evhttp_request *req;
};

/* What a request without a connection was answered. */
struct trk_outcome {
	int code;       /* 0: held (a watch the tracker would answer later) */
	char ctype[64]; /* its Content-Type */
	char chain[TRK_CHAIN_MAX]; /* its TRK_CHAIN_HEADER ("": none) */
	uint8_t *body;  /* malloc'ed (NULL when empty); trk__outcome_fini frees */
	size_t len;
};

/* One request being handled: the parsed URI and body. */
struct trk_call {
	struct trk_server *s;
	struct evhttp_request *req; /* NULL: no connection; answered into out */
	struct trk_outcome *out;
	const struct evkeyvalq *headers;
	bool post;
	const char *path; /* without the query; owned by the request's URI */
	struct evkeyvalq query;
	const uint8_t *body;
	size_t len;
	json_t *json; /* the parsed object body of JSON POSTs, else NULL */
	bool answered;
};

/* ---- json.c: request fields and answer values ---- */

/*
 * Field getters for request JSON. Each returns 0 and sets *out, or -EINVAL
 * with err naming the field (one line). Optional fields left absent (or
 * null) return 0 and leave *out unchanged.
 */
int trk__get_str(json_t *o, const char *key, bool required, size_t maxlen,
		 const char **out, struct proto_err *err);
int trk__get_u64(json_t *o, const char *key, bool required, uint64_t max,
		 uint64_t *out, struct proto_err *err);
/* A u64 written as a decimal string ("addr", "key"). */
int trk__get_u64_str(json_t *o, const char *key, uint64_t *out,
		     struct proto_err *err);
/* Exactly n bytes as 2n hex digits. */
int trk__get_hex(json_t *o, const char *key, uint8_t *out, size_t n,
		 struct proto_err *err);
/* 1..max bytes of hex; *out is the lower-case hex, malloc'ed. */
int trk__get_hexvar(json_t *o, const char *key, size_t max, char **out,
		    struct proto_err *err);
/* hex of n bytes into out[2n+1]. */
void trk__hex(const uint8_t *b, size_t n, char *out);
/* A new JSON string holding the hex of n bytes (NULL on ENOMEM). */
json_t *trk__json_hex(const uint8_t *b, size_t n);
/* json_object_set_new that remembers failure: returns 1 on failure. */
int trk__set(json_t *o, const char *key, json_t *v);
/* A JSON integer for a u64 (values above INT64_MAX are clamped). */
json_t *trk__jint(uint64_t v);
/* Puts a JSON array in random order. */
void trk__json_shuffle(json_t *a);

/* ---- call.c: a request's query and its answer ---- */

const char *trk__query_str(struct trk_call *c, const char *key);
int trk__query_u64(struct trk_call *c, const char *key, bool required,
		   uint64_t max, uint64_t *out, struct proto_err *err);
/* Answer with obj (a reference stolen; NULL is answered as a 500). */
void trk__reply_json(struct trk_call *c, int code, json_t *obj);
/* Answer {"error":"<message>"} with code (4xx/5xx); the message is made one
 * line. Returns nothing useful; cannot fail. */
void trk__fail(struct trk_call *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The same, for an answer that is a normal step of the protocol (a node
 * registering by layout digest is asked for the layout itself; the model
 * is not known before the publisher registers): logged at debug. */
void trk__fail_routine(struct trk_call *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void trk__reply_raw(struct trk_call *c, int code, const char *ctype,
		    const void *buf, size_t len);
/* Answers a held request (outside trk_call): obj stolen. */
void trk__reply_req_json(struct trk_server *s, struct evhttp_request *req,
			 int code, json_t *obj);
/* obj as an answer's text (compact, one trailing newline), malloc'ed, its
 * length in *len; NULL (out of memory, or obj NULL). */
char *trk__json_text(const json_t *obj, size_t *len);
/* Answers a held request with JSON text already made (txt NULL: a 500),
 * for one answer sent to many. */
void trk__reply_req_text(struct trk_server *s, struct evhttp_request *req, int code,
			 const char *txt, size_t len);
/* Answers a held request with bytes (copied). */
void trk__reply_req_raw(struct trk_server *s, struct evhttp_request *req, int code,
			const char *ctype, const void *buf, size_t len);
/* The reason phrase of an HTTP status code. Cannot fail. */
const char *trk__reason(int code);

/* ---- head.c: a request's head, from raw bytes ---- */

struct trk_head {
	char method[16];
	char uri[2100];       /* as on the request line */
	int64_t content_length; /* -1: none */
	bool chunked;         /* a Transfer-Encoding header */
	bool has_auth;
	char auth[300];       /* the Authorization value (truncated past 299) */
};

/* True when buf (a head received so far) ends with its empty line. */
bool trk__head_complete(const uint8_t *buf, size_t len);
/* Parses a complete head (hostile bytes). 1: parsed into *out; 0: no empty
 * line yet; -1: malformed (the guard answers 400 and closes). */
int trk__head_parse(const uint8_t *buf, size_t len, struct trk_head *out);

/* ---- auth.c: the server's check of request signatures ---- */

int trk__auth_new(const uint8_t key[PROTO_CLUSTER_KEY_BYTES], uint64_t window_s,
		  struct trk_auth **out);
void trk__auth_free(struct trk_auth *a);
/* Forgets every mac seen (key, window and epoch stay): the fuzz harness
 * starts each input with an empty replay cache. Cannot fail. */
void trk__auth_forget(struct trk_auth *a);
/* This instance's epoch (hex; NULL when a is NULL). Borrowed. */
const char *trk__auth_epoch(const struct trk_auth *a);
/* 0 when header is a valid, fresh, unreplayed signature of the request (the
 * mac is then remembered); -EACCES with a one-line reason else. */
int trk__auth_check(struct trk_auth *a, const char *method, const char *uri,
		    const char *header, const uint8_t *body, size_t len,
		    uint64_t now_s, struct proto_err *err);
/* The part of trk__auth_check that needs no body (the header's hdr= mac over
 * method, URI, ts and the declared body length, and the ts window): run
 * before a body is read, so strangers cannot make the tracker buffer one.
 * 0, or -EACCES with a one-line reason. Remembers nothing. */
int trk__auth_check_head(struct trk_auth *a, const char *method,
			 const char *uri, const char *header, uint64_t len,
			 uint64_t now_s, struct proto_err *err);

/* ---- conns.c: the connection guard ---- */

struct trk_conns_stats {
	size_t open, cap;
	uint64_t accepted, evicted, slow, refused_heads, idle;
	uint64_t accept_errors;
	uint64_t slow_body, per_addr; /* closed: body or answer past its
				       * deadline; over TESSERA_TRACKER_CONNS_PER_ADDR */
};
/* What the tracker answers a head before reading its body: 0 to read on,
 * or an HTTP code with a one-line reason in msg (trk__head_verdict);
 * *authed: the request carries a valid signature (its connection is then
 * the last a flood's address loses); *routine: the refusal is a normal
 * step of the protocol (a client's first signed request, before it knew
 * the tracker's epoch), logged at debug rather than info. */
typedef int (*trk__head_verdict_fn)(struct trk_server *s, const struct trk_head *h,
				    bool *authed, bool *routine, char *msg, size_t cap);

/* Starts guarding s->http's connections (s->sock bound): a cap of
 * TESSERA_TRACKER_CONNS (and the descriptor limit) and of
 * TESSERA_TRACKER_CONNS_PER_ADDR per peer address, heads due within
 * TESSERA_HEADER_MS, bodies within TESSERA_TRACKER_BODY_MS, heads judged
 * by verdict before the body.
 * -ENOMEM with nothing changed. Free with trk__conns_free after
 * evhttp_free. */
int trk__conns_new(struct trk_server *s, trk__head_verdict_fn verdict, struct trk_conns **out);
void trk__conns_free(struct trk_conns *g);
/* Called as a request reaches the tracker: *refused when its head was
 * already answered (the request must then be dropped). g may be NULL. */
void trk__conns_request(struct trk_conns *g, struct evhttp_request *req,
			bool *refused);
/* Tracing (TESSERA_TRACKER_TRACE=FILE): req's answer is built; a burst of
 * work (what, begun at t0 ns, n items) ended now. */
void trk__conns_handled(struct trk_conns *g, struct evhttp_request *req);
void trk__conns_trace(struct trk_conns *g, const char *what, uint64_t t0, uint64_t n);
/* req is held (a watch): its connection is served at the low priority
 * until its next request arrives, so that the answers a version sends to
 * every node at once do not hold heartbeats and sources queries behind
 * them. g may be NULL; nothing happens for an unguarded connection. */
void trk__conns_background(struct trk_conns *g, struct evhttp_request *req);
/* Counters for /metrics; g may be NULL (all zero). */
void trk__conns_stats(const struct trk_conns *g, struct trk_conns_stats *out);

/* ---- nodes.c, publishers.c: registrations ---- */

/* A fresh random session credential (hex) into out: what a registered
 * node or publisher presents (TRK_SESSION_HEADER) to speak for itself.
 * Cannot fail. */
void trk__session_new(char out[2 * TRK_SESSION_BYTES + 1]);
/* True when a request's headers carry session ses in TRK_SESSION_HEADER. */
bool trk__session_presented(const struct evkeyvalq *headers, const char *ses);

/* ---- router.c: each request to its endpoint ---- */

/* evhttp's callback for every request (arg: the server). */
void trk__route(struct evhttp_request *req, void *arg);
/* Routes r, past evhttp's parse, to its handler: the tracker's answer to
 * every request. With r->req it is answered (or held) through evhttp and
 * out is unused; without, its answer is written to *out (out->code 0: it
 * would be held), which trk__outcome_fini frees; the request then waits for
 * nothing and the event loop need not run. Cannot fail (a failure is a
 * 5xx answer). */
void trk__route_request(struct trk_server *s, const struct trk_request *r,
			struct trk_outcome *out);
/* Frees what a trk_answer holds; leaves it empty. */
void trk__outcome_fini(struct trk_outcome *a);
/* What the tracker answers a head before reading its body: 0 to read on,
 * or an HTTP code (401, 405, 411, 413) with a one-line reason in msg. Uses
 * the routes' body caps and trk__auth_check_head; only a signed POST
 * carries a body. */
int trk__head_verdict(struct trk_server *s, const struct trk_head *h,
		      bool *authed, bool *routine, char *msg, size_t cap);

/* ---- watches.c: requests held (long-polls) ---- */

int trk__watches_new(struct trk_server *s, struct trk_watches **out);
/* Drops held requests without answering (before evhttp_free frees them),
 * then frees. NULL is fine. */
void trk__watches_free(struct trk_watches *ws);
void trk__watches_drop(struct trk_watches *ws);
/* Requests held now (version watches and addendum waits). */
size_t trk__watches_held(const struct trk_watches *ws);
/* Holds c, a watch of the versions after `after` (GET /versions with
 * wait_ms), for wait_ms (ended somewhere in its last tenth); with layouts
 * (layouts_rev=R), a publisher's, also answered when a replica comes
 * alive. -ENOMEM (c answered 500). A call without a connection (c->req
 * NULL) is only answered "held" (out->code 0): nothing waits. */
int trk__watch_versions(struct trk_call *c, uint64_t after, uint64_t wait_ms, bool layouts);
/* Holds c (GET /addenda?version=V&layout=HEX&wait_ms=N) until the
 * addendum of v for layout is posted (trk__watches_addendum_posted) or
 * wait_ms passes, or (copy: a raw copy is waited for) a newer version is
 * published; each way answered by trk__addendum_reply_req. -ENOMEM
 * (c answered 500). Without a connection, as trk__watch_versions. */
int trk__watch_addendum(struct trk_call *c, uint64_t v, const uint8_t *layout,
			uint64_t wait_ms, bool copy);
/* A version landed: the watches it concerns are answered, a slice per turn
 * of the loop at the low priority, with one answer made per version they
 * wait after. */
void trk__watches_version_landed(struct trk_watches *ws);
/* A replica came alive (a new one, or one whose ranks were all gone): its
 * layout may be one the latest version lacks. Bumps layouts_rev (shown
 * with the versions) and answers the publishers' watches that passed
 * layouts_rev (GET /versions?layouts_rev=R): they extend the version at
 * once. Cannot fail. */
void trk__watches_replica_alive(struct trk_watches *ws);
uint64_t trk__watches_layouts_rev(const struct trk_watches *ws);
/* The addendum of v for layout is stored: its held requests are answered. */
void trk__watches_addendum_posted(struct trk_watches *ws, uint64_t v, const uint8_t *layout);

/* addenda_store.c: answers req (held, outside trk_call) with the addendum
 * of v for layout, or 404 when there is none (410 when a raw copy is asked
 * for, copy, and none will come: v is no longer the latest). */
void trk__addendum_reply_req(struct trk_server *s, struct evhttp_request *req, uint64_t v,
			     const uint8_t *layout, bool copy);

/* ---- views: the state as JSON ---- */

/* versions_json.c: one entry of a version list (what GET /versions and the
 * status show), and {"latest","now_ms","layouts_rev","anchor_wanted",
 * "versions":[...]} for the versions after `after` (the newest 256). New
 * references; NULL on ENOMEM. */
json_t *trk__version_json(struct trk_server *s, const struct trk_version *v);
json_t *trk__versions_list_json(struct trk_server *s, uint64_t after, uint64_t layouts_rev);

/* registry_json.c. Which replicas a status shows: `limit` of them from
 * `offset`, by name. */
struct trk_status_page {
	uint64_t offset, limit;
	/* Not 0: the page also stops before the replica that would take its
	 * rank rows past this (at least one replica is shown); limit is then
	 * lowered to the replicas shown. */
	uint64_t ranks_max;
};
/* Status pieces (new references). */
json_t *trk__registry_status(struct trk_registry *r, struct trk_status_page *pg);
/* The names of the replicas complete / active at v, the first max of them by
 * name, for a version's status entry; *count gets how many there are. */
json_t *trk__registry_version_replicas(struct trk_registry *r, uint64_t v,
				       bool active, size_t max, uint64_t *count);

/* status.c: the page c asks for (?replicas_offset=N&replicas_limit=M):
 * 0, or -EINVAL with c answered 400. The status object of that page (new
 * reference; NULL on ENOMEM). */
int trk__status_page(struct trk_call *c, struct trk_status_page *pg);
json_t *trk__status_json(struct trk_server *s, struct trk_status_page *pg);

/* ---- the endpoints (router.c maps paths to them) ---- */

/* sources.c: the query's layout (hex) for a known version; else the call
 * is failed (400 bad layout, 404 unknown version) and -errno returned. */
int trk__query_layout_known(struct trk_call *c, uint64_t version,
			    uint8_t layout[PROTO_HASH_BYTES]);

void trk__handle_publish(struct trk_call *c);                 /* versions.c */
void trk__handle_versions(struct trk_call *c);
void trk__handle_manifest(struct trk_call *c, const char *v);
void trk__handle_timeline(struct trk_call *c, const char *v); /* timeline.c */
void trk__handle_addendum_post(struct trk_call *c);           /* addenda.c */
void trk__handle_addendum_get(struct trk_call *c);
void trk__handle_publishers(struct trk_call *c);              /* publishers.c */
void trk__handle_nodes(struct trk_call *c);                   /* nodes.c */
void trk__handle_node_state(struct trk_call *c);
void trk__handle_heartbeat(struct trk_call *c);               /* heartbeat.c */
void trk__handle_leave(struct trk_call *c);
void trk__handle_offers(struct trk_call *c);                  /* offers.c */
void trk__handle_sources(struct trk_call *c);                 /* sources.c */
void trk__handle_sources_batch(struct trk_call *c);
void trk__handle_holders(struct trk_call *c);                 /* holders.c */
void trk__handle_canary_expected(struct trk_call *c);         /* canary.c */
void trk__handle_canary_live(struct trk_call *c);
void trk__handle_layouts(struct trk_call *c);                 /* registry_json.c */
void trk__handle_replica(struct trk_call *c, const char *name);
void trk__handle_status(struct trk_call *c);                  /* status.c */
void trk__handle_page(struct trk_call *c);                    /* page.c */
void trk__handle_version_page(struct trk_call *c, const char *v); /* page_version.c */
void trk__handle_metrics(struct trk_call *c);                 /* metrics.c */
void trk__handle_healthz(struct trk_call *c);                 /* healthz.c */

#endif
