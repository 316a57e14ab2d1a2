/* tracker: the versioned registry of a tessera cluster, and the client that
 * node agents and publishers use to talk to it. This is the one header other
 * directories include; the HTTP API itself is written down in tracker/API.md,
 * and tracker/README.md says where the code of each part lives.
 *
 * Model. The tracker holds two kinds of state, on one libevent thread:
 *  - durable: the version log. Every accepted version is an immutable signed
 *    manifest stored under --state (one file per version, written
 *    temp-fsync-rename before the tracker answers) with its parent chain and
 *    the pinned trainer key. A restarted tracker keeps all of it.
 *  - soft: publishers, nodes (one per replica rank), their leases, offers and
 *    per-version states. It comes back by re-registration and heartbeats; a
 *    lease that runs out marks its holder gone (still shown, never offered as
 *    a source).
 * Everything else is derived on demand from those two: a replica is complete
 * at v when every one of its ranks is alive and holds v verified or active;
 * its active version is the one all its ranks report active (each change is
 * an activation, logged); its target is the one version all its ranks work
 * toward (tracker/server/target.c, the rule in API.md); a version is retained while
 * it is the latest or the target of a live replica.
 *
 * Mutating calls (POST) are signed with the cluster key: the header
 * `Authorization: Tessera ts=<unix s>,ep=<epoch>,hdr=<hex>,mac=<hex>` carries
 * crypto_auth(key, METHOD "\n" URI "\n" ts "\n" epoch "\n" body) and,
 * checked before the body is read, crypto_auth(key, "head\n" METHOD "\n"
 * URI "\n" ts "\n" epoch "\n" body length); the epoch is the tracker
 * instance's (random at start, sent in X-Tessera-Epoch), so nothing signed
 * before a restart passes after it; stale timestamps and replayed macs are
 * refused. Reads are
 * open, except GET /sources (memory keys), signed the same way.
 */
#ifndef TRACKER_TRACKER_H
#define TRACKER_TRACKER_H

#include <event2/event.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/config.h"
#include "proto/manifest.h"
#include "proto/util.h"

#define TRK_API "/api/v1"
#define TRK_JSON_MAX (1u << 20)   /* largest JSON request body, bytes */
#define TRK_WAIT_MAX_MS 30000     /* longest long-poll the tracker holds */
#define TRK_ID_MAX 128            /* longest node or publisher id, bytes */
#define TRK_REPLICA_MAX 64        /* longest replica name, bytes */
#define TRK_SITE_MAX 32           /* longest site name, bytes */
#define TRK_AUTH_MAC_BYTES 32     /* crypto_auth_BYTES */
#define TRK_EPOCH_BYTES 8         /* a tracker instance's random epoch */
#define TRK_SESSION_BYTES 32      /* a node's session credential */
#define TRK_SESSION_HEADER "X-Tessera-Session"
#define TRK_EPOCH_HEADER "X-Tessera-Epoch" /* on every answer, when keyed */
/* On a standby tracker's 503s: the leading tracker's URL (empty when not
 * known). A client with a list of trackers asks the next one. */
#define TRK_STANDBY_HEADER "X-Tessera-Standby"
#define TRK_CLUSTER_ID_BYTES 16   /* a chain's random identity */
/* On every answer: "CLUSTER INSTANCE LATEST DIGEST", the chain's identity,
 * the tracker process's random instance, its latest version and that
 * version's digest (hex; "-" with no version). Clients refuse a tracker
 * whose chain went back (see tracker/API.md). */
#define TRK_CHAIN_HEADER "X-Tessera-Chain"
#define TRK_CHAIN_MAX \
	(2 * TRK_CLUSTER_ID_BYTES + 2 * TRK_EPOCH_BYTES + 21 + 2 * PROTO_HASH_BYTES + 4)

/* ---- server --------------------------------------------------------------- */

struct trk_server;

struct trk_server_opts {
	const char *listen;    /* "HOST:PORT" ("[v6]:PORT"); port 0 = ephemeral */
	const char *state_dir; /* created if missing */
	const uint8_t *cluster_key; /* PROTO_CLUSTER_KEY_BYTES, or NULL: open */
	const uint8_t *trainer_pk;  /* PROTO_PK_BYTES, or NULL: pin the first */
	/* Both set: serve HTTPS only, with this PEM certificate chain and key
	 * (one set alone is refused). */
	const char *tls_cert, *tls_key;
	/* etcd://HOST:PORT[,...][/NAME] (etcds:// with TLS): the durable
	 * state lives there, shared by every tracker given the same store;
	 * one leads, the others stand by. state_dir then only remembers the
	 * store's cluster id (and may be NULL). NULL: state_dir holds it all. */
	const char *store;
	const char *etcd_ca, *etcd_cert, *etcd_key; /* etcds:// (wire/etcd.h) */
	unsigned leader_ttl_s; /* the leader's lease; 0: 5 s */
};

/*
 * Loads the version log from state_dir, binds the listener and starts serving
 * on base (the caller runs the loop). Options are copied. On failure *out is
 * NULL, nothing is left bound and err says why. A base with one priority
 * (libevent's default) gets three: held watches' connections are served at
 * the lowest (server/conns.c), every other event at the middle one; so base should
 * be new, or its events should not care.
 */
int trk_server_new(struct event_base *base, const struct trk_server_opts *o,
		   struct trk_server **out, struct proto_err *err);
/* "http://HOST:PORT" ("https://" with TLS) with the port actually bound.
 * Owned by the server. */
const char *trk_server_url(const struct trk_server *s);
/* 0 after a loop that ended on a signal; 3 when the tracker stopped
 * because it may have lost the lead to another (server/lead.c). */
int trk_server_exit_code(const struct trk_server *s);
/* Closes the listener, drops held long-polls and frees everything. Must run
 * on the loop's thread, with the loop not dispatching a tracker callback.
 * NULL is fine. */
void trk_server_free(struct trk_server *s);

/* ---- request signing (shared by the server and the client) ---------------- */

/* mac = crypto_auth(key, method "\n" uri "\n" ts "\n" epoch "\n" body).
 * Cannot fail. */
void trk_auth_mac(const uint8_t key[PROTO_CLUSTER_KEY_BYTES], const char *method,
		  const char *uri, uint64_t ts, const char *epoch,
		  const uint8_t *body, size_t len, uint8_t mac[TRK_AUTH_MAC_BYTES]);
/* hdr = crypto_auth(key, "head\n" method "\n" uri "\n" ts "\n" epoch "\n"
 * len), len in
 * decimal: what the tracker checks before it reads a body. Cannot fail. */
void trk_auth_head_mac(const uint8_t key[PROTO_CLUSTER_KEY_BYTES],
		       const char *method, const char *uri, uint64_t ts,
		       const char *epoch, uint64_t len,
		       uint8_t mac[TRK_AUTH_MAC_BYTES]);
/* Formats the Authorization header value into buf
 * ("Tessera ts=..,ep=..,hdr=..,mac=.."); epoch is the tracker instance's
 * (X-Tessera-Epoch; NULL: ""). -ENOSPC when buflen is too small. */
int trk_auth_header(const uint8_t key[PROTO_CLUSTER_KEY_BYTES],
		    const char *method, const char *uri, uint64_t ts,
		    const char *epoch, const uint8_t *body, size_t len,
		    char *buf, size_t buflen);

/* ---- client --------------------------------------------------------------- */

struct trk_client;

/*
 * The answer to one request, given to a callback:
 *  status  the HTTP status, or a negative errno when no answer came
 *          (-ETIMEDOUT, -ECONNREFUSED, -ECONNRESET, -EMSGSIZE, -EIO);
 *  json    the parsed body when it is JSON, else NULL. Borrowed: valid during
 *          the callback only (json_incref to keep it);
 *  body    the raw body (borrowed, NUL-terminated past len), len its size;
 *  error   a one-line reason for status >= 400 or < 0 (the tracker's
 *          {"error"} when it sent one), else "".
 */
struct trk_answer {
	int status;
	json_t *json;
	const uint8_t *body;
	size_t len;
	const char *error;
	/* The failure needs a person: asking again cannot succeed until a
	 * setting changes (a wrong --cluster-key, https:// to a plain
	 * tracker, a certificate --tls-ca does not verify, a host that does
	 * not resolve); error names the setting. */
	bool fix;
};
typedef void (*trk_client_cb)(const struct trk_answer *a, void *arg);

/* Whether url is a tracker URL trk_client_new takes (http:// or https://,
 * a host, an optional port and path): 0, or -EINVAL with the reason in err.
 * The same check trk_client_new makes; the configuration check calls it. */
int trk_url_check(const char *url, struct proto_err *err);

/* Whether v is an address tessera-tracker --listen takes (HOST:PORT): 0, or
 * -EINVAL with the reason in err. */
int trk_listen_check(const char *v, struct proto_err *err);
/* --store URL (etcd://...), --leader-ttl SECONDS. */
int trk_store_check(const char *v, struct proto_err *err);
int trk_leader_ttl_check(const char *v, struct proto_err *err);

/* The checks of [tracker]'s values: the parsers tessera-tracker applies. */
extern const struct proto_config_value trk_config_values[];

/*
 * A client bound to an event_base (NULL: the client makes a private one, for
 * blocking use through trk_client_wait) and a base URL ("http://host:port", or
 * "https://host:port": TLS, verified against the system's trust store unless
 * trk_client_set_tls_ca names a CA file).
 * cluster_key may be NULL (unsigned POSTs). The client keeps no pointer to its
 * arguments. On failure *out is NULL.
 *
 * url may list up to TRK_CLIENT_URLS_MAX trackers, "URL,URL,..." (all http://
 * or all https://): trackers that serve the same chain (a standby started on
 * the state of one that died). The client asks the first; when one does not
 * answer at all (connection refused or reset, a timeout), it asks the next
 * from then on, and sends the request that failed there, once per other
 * tracker. The chain guard below holds across them: a tracker of another
 * chain, or one behind the chain seen, is refused as ever.
 */
#define TRK_CLIENT_URLS_MAX 8
int trk_client_new(struct event_base *base, const char *url,
		   const uint8_t *cluster_key, struct trk_client **out,
		   struct proto_err *err);
/* Verify an https:// tracker against the PEM CA certificates in ca_file
 * instead of the system's trust store (the certificate must also name the
 * URL's host). Refused (EINVAL) for an http:// URL or a file that does not
 * load; the client is then unchanged. A request to a tracker whose
 * certificate does not verify fails with status -EPROTO and a one-line
 * error. */
int trk_client_set_tls_ca(struct trk_client *c, const char *ca_file, struct proto_err *err);
/* Cancels pending requests without calling their callbacks, frees the client
 * (and its private base). Not from inside one of its callbacks. NULL is fine. */
void trk_client_free(struct trk_client *c);
/* Default per-request timeout in ms (initially 10000). Long-polls add their
 * wait to it. */
void trk_client_set_timeout(struct trk_client *c, uint32_t ms);
/* The session credential c keeps for node id (from its registration), or
 * NULL; valid until c registers another node. */
const char *trk_client_session(const struct trk_client *c, const char *id);
/* Makes c carry session ses for node id (as if it had registered it):
 * another client of the same process may then speak for that node. Ignored
 * when id or ses is NULL or malformed. */
void trk_client_keep_session(struct trk_client *c, const char *id, const char *ses);
/* Successful JSON answers longer than bytes reach the callback unparsed
 * (json NULL, the raw body given): for a load generator that does not read
 * them (make bench-tracker). Default: every answer is parsed. */
void trk_client_set_parse_max(struct trk_client *c, size_t bytes);
/* The site c's nodes or publisher are in (--site; NULL or "": the unnamed
 * site). Registrations then say it, and source and holder queries ask for
 * the site's view: its own members, publishers wherever they are
 * (tracker/API.md, "Sites"). -EINVAL for a name trk_site_valid refuses. */
int trk_client_set_site(struct trk_client *c, const char *site);
const char *trk_client_site(const struct trk_client *c); /* "" when unnamed (or c NULL) */
/*
 * The chain guard. A client remembers the chain its answers announced
 * (TRK_CHAIN_HEADER): the cluster id and the highest version with its
 * digest. An answer whose cluster id differs, or whose tracker process
 * (instance) is another one and whose latest version is below the one seen
 * (or equal with another digest), is refused: its callback gets status
 * -ESTALE and an error that says the tracker forgot the chain. fn (may be
 * NULL) hears it once when refusing starts, with the one-line reason, and
 * once with NULL when a tracker with the remembered chain answers again.
 * Only a new client (a restarted process) accepts another chain.
 */
typedef void (*trk_client_chain_fn)(void *arg, const char *why);
void trk_client_on_chain_lost(struct trk_client *c, trk_client_chain_fn fn,
			      void *arg);
struct event_base *trk_client_base(struct trk_client *c);

/*
 * Sends one request: method "GET" or "POST", path_query like
 * "/api/v1/versions?after=3" (a POST gets "nonce=<random>" appended, so that
 * two equal calls in one second are not replays, and is signed when the
 * client has a key). body may be NULL for GET; ctype NULL means
 * application/json. timeout_ms 0 uses the default. Returns 0 and calls cb
 * exactly once later, or a negative errno and never calls it.
 */
int trk_client_request(struct trk_client *c, const char *method,
		       const char *path_query, const char *ctype,
		       const void *body, size_t len, uint32_t timeout_ms,
		       trk_client_cb cb, void *arg);
/* POST with a JSON body (borrowed, serialized compactly). */
int trk_client_post_json(struct trk_client *c, const char *path,
			 json_t *body, trk_client_cb cb, void *arg);

/* ---- typed helpers: build the request of one endpoint (see API.md) ---- */

struct trk_rank_addr {
	uint32_t rank;
	const char *host;
	const char *provider;    /* e.g. "tcp;ofi_rxm" */
	const char *fabric_addr; /* hex */
};

/* POST /publishers. model and layout are borrowed JSON values; every_ms
 * the publisher's clock (tessera publish --every), 0 when it has none. */
int trk_client_register_publisher(struct trk_client *c, json_t *model,
				  json_t *layout,
				  const struct trk_rank_addr *ranks,
				  size_t nranks, uint64_t every_ms, trk_client_cb cb, void *arg);

struct trk_node_reg {
	const char *replica;
	struct trk_rank_addr addr;
	json_t *layout; /* serving layout, borrowed */
	const uint8_t *model_digest; /* PROTO_HASH_BYTES */
	const char *layout_name; /* how people call it ("tp2"), or NULL */
	/* The layout's digest (PROTO_HASH_BYTES), or NULL. When set, the
	 * registration names the layout by digest, and sends it in full only
	 * when the tracker answers that it holds no such layout. */
	const uint8_t *layout_digest;
	/* The public key (TRK_STMT_PK_BYTES) this registration signs its
	 * statements with, or NULL (see "statements" below). */
	const uint8_t *statement_key;
};
/* POST /nodes. */
int trk_client_register_node(struct trk_client *c, const struct trk_node_reg *r,
			     trk_client_cb cb, void *arg);
/* POST /heartbeat for a node id ("A/0") or a publisher id. */
int trk_client_heartbeat(struct trk_client *c, const char *id,
			 trk_client_cb cb, void *arg);
/* A node's heartbeat with what serving processes pin on it: per version it
 * holds, the requests pinning it now and those that ran on it (at most
 * TRK_PIN_VERSIONS_MAX entries are sent). */
#define TRK_PIN_VERSIONS_MAX 8
struct trk_pin_count {
	uint64_t version, requests;
	uint32_t pins;
};
int trk_client_heartbeat_pins(struct trk_client *c, const char *id,
			      const struct trk_pin_count *pins, size_t n, trk_client_cb cb,
			      void *arg);
/* One rank's part of a host heartbeat. */
#define TRK_HOST_HEARTBEAT_MAX 64 /* ranks one host heartbeat renews at most */
struct trk_hb_node {
	const char *id; /* "A/0" */
	struct trk_pin_count pins[TRK_PIN_VERSIONS_MAX];
	size_t npins;
};
/* POST /heartbeat for every rank of a host at once (1..TRK_HOST_HEARTBEAT_MAX
 * of them; -EINVAL else, nothing sent): each entry carries its pins and the
 * session this client keeps for it. Answered {"lease_ms":N,"gone":[ids]}:
 * the ids in "gone" are unknown or their lease ran out (register them
 * again); every other one is renewed. */
int trk_client_heartbeat_host(struct trk_client *c, const struct trk_hb_node *nodes, size_t n,
			      trk_client_cb cb, void *arg);
/* POST /versions with signed manifest bytes (copied). */
int trk_client_publish(struct trk_client *c, const uint8_t *manifest,
		       size_t len, trk_client_cb cb, void *arg);
/* GET /versions?after=A&wait_ms=W: answers at once when versions > after
 * exist, else when one is published or after W ms (capped at 30000). */
int trk_client_watch(struct trk_client *c, uint64_t after, uint32_t wait_ms,
		     trk_client_cb cb, void *arg);
/* The same watch, also answered when a replica comes alive after the
 * tracker's layouts_rev passed this one (at once when it already has):
 * the publisher's, which extends the latest version for a new layout at
 * once (the answer's "layouts_rev" is the next one to pass). */
int trk_client_watch_layouts(struct trk_client *c, uint64_t after, uint64_t layouts_rev,
			     uint32_t wait_ms, trk_client_cb cb, void *arg);
/* POST /addenda with a signed addendum (copied). */
int trk_client_post_addendum(struct trk_client *c, const uint8_t *addendum, size_t len,
			     trk_client_cb cb, void *arg);
/* GET /addenda?version=V&layout=HEX: the raw addendum bytes in a->body;
 * with wait_ms > 0 (capped at 30000) a long-poll the tracker answers when
 * the addendum is posted (404 when wait_ms passes first). */
int trk_client_get_addendum(struct trk_client *c, uint64_t version,
			    const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms,
			    trk_client_cb cb, void *arg);
/* GET /addenda?...&copy=1: the same for the raw copy of a layout a delta
 * version lists (proto/addendum.h); the request also tells the publisher
 * (the latest version's copy_wanted) that one is wanted. */
int trk_client_get_copy(struct trk_client *c, uint64_t version,
			const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms, trk_client_cb cb,
			void *arg);
/* POST /nodes/leave: node id leaves now (its session goes with it). */
int trk_client_leave(struct trk_client *c, const char *id, trk_client_cb cb, void *arg);
/* GET /versions/V/manifest: the raw bytes in a->body. */
int trk_client_get_manifest(struct trk_client *c, uint64_t version,
			    trk_client_cb cb, void *arg);

enum trk_rank_state {
	TRK_STATE_FETCHING,
	TRK_STATE_VERIFIED,
	TRK_STATE_ACTIVE,
	TRK_STATE_FAILED,
	TRK_STATE_COUNT
};
/* A site's name (--site): 1..TRK_SITE_MAX of [A-Za-z0-9._-]. Nodes and
 * publishers that name none are in the unnamed site (""): one site. */
bool trk_site_valid(const char *s);
bool trk_site_same(const char *a, const char *b); /* NULL is the unnamed site */
/* --site's value check (a proto_config_value parser): one line in err. */
int trk_site_check(const char *v, struct proto_err *err);

/* Bounded swarm views (TESSERA_SWARM_MEMBERS, TESSERA_SWARM_SLOW;
 * tracker/NOTES.md, "Swarms of thousands"). A swarm lists as members the
 * replicas that keep up, and of a larger swarm than its members cap those
 * of highest weight: a hash of the replica's name keyed by the layout. */
uint64_t trk_member_weight(const char *replica, const uint8_t layout[PROTO_HASH_BYTES]);
/* Which of n replicas are members: bps[i] is replica i's rate in its last
 * fetch (0: not known) and w[i] its weight. Those under 1/slow of the
 * median known rate are left out (slow 0: none), then of the rest the m heaviest are kept (ties: the
 * lower index first; m 0: all). Sets keep[i], and *cut when one is left
 * out; -1 without memory. */
int trk_members_pick(const uint64_t *w, const uint64_t *bps, size_t n, size_t m, uint64_t slow,
		     bool *keep, bool *cut);

/* "fetching", "verified", "active", "failed"; parse returns -EINVAL else. */
const char *trk_state_name(enum trk_rank_state s);
int trk_state_parse(const char *s, enum trk_rank_state *out);

struct trk_state_report {
	const char *id; /* node id */
	uint64_t version;
	enum trk_rank_state state;
	uint64_t bytes_done, bytes_total;
	uint64_t bytes_from_trainer, bytes_from_peers;
	/* Bytes received that were not needed, and bytes asked for again. */
	uint64_t duplicate_bytes, refetched_bytes;
	/* Of bytes_from_trainer and _peers, those from sources in another site
	 * (sent when not 0). */
	uint64_t bytes_from_other_sites;
	/* When this version's first and (so far) last chunk arrived, node
	 * wall clock ms; 0: not yet (not sent). */
	uint64_t first_byte_ms, last_byte_ms;
	const char *error; /* NULL or one line */
	/* With verified or active: the rank's statement
	 * (TRK_STMT_SIG_BYTES), or NULL. */
	const uint8_t *statement;
	const char *const *banned; /* peers banned for this version (sent when nbanned > 0) */
	size_t nbanned;
	/* How the version was built: "delta" (from the parent), "full", or
	 * NULL (not said); need_anchor: a delta could not be built here, the
	 * publisher should send an anchor. */
	const char *how;
	bool need_anchor;
	/* This node's report number, growing with each report it sends (0: not
	 * sent): the tracker ignores a report older than one it applied, so
	 * reports overtaking each other on their way never roll a rank back. */
	uint64_t seq;
};
/* POST /nodes/state. */
int trk_client_report_state(struct trk_client *c,
			    const struct trk_state_report *r, trk_client_cb cb,
			    void *arg);

/*
 * Statements. A rank that holds a version verified (or active) signs
 * "tessera-holds-v1\n" replica "\n" rank "\n" version "\n" manifest digest
 * (hex) with an Ed25519 key it made for its registration (sent as
 * statement_key). The tracker checks each statement against the key the
 * rank registered, and hands the replica's statements out with every claim
 * that the replica is complete; a rank switches only when every other rank's
 * statement verifies, so no single other node (nor the tracker's answer
 * alone) can make it switch. What this leaves open is in tracker/API.md.
 */
#define TRK_STMT_PK_BYTES 32  /* crypto_sign_PUBLICKEYBYTES */
#define TRK_STMT_SK_BYTES 64  /* crypto_sign_SECRETKEYBYTES */
#define TRK_STMT_SIG_BYTES 64 /* crypto_sign_BYTES */
/* Signs the statement that rank of replica holds version (manifest digest).
 * Cannot fail. */
void trk_statement_sign(const uint8_t sk[TRK_STMT_SK_BYTES], const char *replica,
			uint32_t rank, uint64_t version,
			const uint8_t digest[PROTO_HASH_BYTES], uint8_t sig[TRK_STMT_SIG_BYTES]);
bool trk_statement_verify(const uint8_t pk[TRK_STMT_PK_BYTES], const char *replica,
			  uint32_t rank, uint64_t version,
			  const uint8_t digest[PROTO_HASH_BYTES],
			  const uint8_t sig[TRK_STMT_SIG_BYTES]);
/*
 * Checks a tracker's statements (a JSON array of {"rank","key","sig"}, from
 * an answer) for every rank of replica (0..nranks-1) but self, at version
 * with digest: each rank exactly once, each signature valid under its key.
 * 0 when all hold, else a negative errno and err names the first rank that
 * fails.
 */
int trk_statements_check(json_t *statements, const char *replica, uint32_t nranks,
			 uint32_t self, uint64_t version,
			 const uint8_t digest[PROTO_HASH_BYTES], struct proto_err *err);

struct trk_offer {
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t src_rank, dst_rank;
	uint64_t addr, key; /* remote address and key of the registered memory */
	uint64_t len;       /* the parcel's wire bytes */
	/* A slot offered while its node still fetches (partial): its have-map
	 * (one byte per PROTO_XMAP_HAVE_BLOCK of the slot, nonzero once those
	 * bytes are verified and in place), registered for remote read. */
	bool partial;
	uint64_t have_addr, have_key;
};
/*
 * What a publisher's export of a version cost, phase by phase, as its offer
 * carries it ("publish", tracker/API.md) and the tracker shows it with the
 * version: the time from the export request to the offer, in phases named
 * by the publisher that add up to total_ms, and the delta it tried, if
 * any: kept or discarded, what its encode cost, how large it was (or where
 * it stopped) as a percent of the anchor, and why.
 */
#define TRK_PHASES_MAX 8             /* phases in one report */
#define TRK_PHASE_NAME_MAX 24        /* bytes of a phase's name: [a-z0-9 +-] */
#define TRK_PUBLISH_WHY_MAX 240      /* bytes of the delta's why */
#define TRK_PUBLISH_MS_MAX 604800000 /* a week: no phase takes longer */
#define TRK_PUBLISH_PERCENT_MAX 1000 /* a delta ten times the anchor's size */
struct trk_phase {
	char name[TRK_PHASE_NAME_MAX + 1];
	uint64_t ms;
};
struct trk_publish_report {
	uint64_t total_ms;
	uint32_t nphases;
	struct trk_phase phases[TRK_PHASES_MAX];
	bool delta_tried; /* else nothing below is sent */
	bool delta_kept, delta_stopped_early;
	uint64_t delta_encode_ms;
	double delta_percent;
	char delta_why[TRK_PUBLISH_WHY_MAX + 1];
};
/* Appends a phase (name cut to TRK_PHASE_NAME_MAX bytes); false when the
 * report holds TRK_PHASES_MAX already (nothing added). */
bool trk_publish_report_add(struct trk_publish_report *r, const char *name, uint64_t ms);
/* The report as JSON (tracker/API.md); new reference, NULL on ENOMEM. */
json_t *trk_publish_report_json(const struct trk_publish_report *r);
/* Parses and checks a report from outside bytes: types, at most
 * TRK_PHASES_MAX phases with names of [a-z0-9 +-], times up to
 * TRK_PUBLISH_MS_MAX that add up to at most total_ms, the delta's fields.
 * 0, or -EINVAL with err saying which field in one line ("publish..."
 * prefixed); *out is written only on success. */
int trk_publish_report_parse(json_t *j, struct trk_publish_report *out, struct proto_err *err);

/* POST /offers: replaces id's offers for version (n == 0 withdraws them). */
int trk_client_offer(struct trk_client *c, const char *id, uint64_t version,
		     const struct trk_offer *parcels, size_t n,
		     trk_client_cb cb, void *arg);
/* The same from a publisher, with the wall time (ms) its snapshot of the
 * version was taken (0: not sent), for the version's timeline. */
int trk_client_offer_timed(struct trk_client *c, const char *id, uint64_t version,
			   uint64_t snapshot_ms, const struct trk_offer *parcels, size_t n,
			   trk_client_cb cb, void *arg);
/* The same with a node's slot (NULL: none): its whole rank memory, for
 * readers of other layouts (GET /holders); its addr, key and len are sent,
 * and, for a partial slot, its have-map's addr and key. A publisher sends
 * its report of the version's export (NULL: none) as "publish", for the
 * version's timeline. */
int trk_client_offer_slot(struct trk_client *c, const char *id, uint64_t version,
			  uint64_t snapshot_ms, const struct trk_publish_report *report,
			  const struct trk_offer *parcels, size_t n, const struct trk_offer *slot,
			  trk_client_cb cb, void *arg);
/* GET /sources?version=&layout=&src_rank=&dst_rank=. */
int trk_client_sources(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], uint32_t src_rank,
		       uint32_t dst_rank, trk_client_cb cb, void *arg);
/* POST /sources: the sources of n (1..TRK_SOURCES_BATCH_MAX) parcels in one
 * request, what a process serving several ranks asks instead of one GET per
 * rank. The answer's "answers" holds, in order, one object per parcel as
 * GET /sources answers it (trk_sources_parse), or {"status":404,"error":..}
 * for an unknown version. -EINVAL for a bad n. */
#define TRK_SOURCES_BATCH_MAX 64
#define TRK_MEMBERS_TAG_HEX 16 /* a members list's tag: hex digits */
struct trk_parcel_key {
	uint64_t version;
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t src_rank, dst_rank;
	/* The members_tag of the members list the asker holds for this
	 * parcel's swarm ("" none): an answer whose list has that tag says
	 * "members_same":true instead of listing them. */
	char members_tag[TRK_MEMBERS_TAG_HEX + 1];
};
/* GET /sources for k (its members_tag included). */
int trk_client_sources_key(struct trk_client *c, const struct trk_parcel_key *k, trk_client_cb cb,
			   void *arg);
int trk_client_sources_batch(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			     trk_client_cb cb, void *arg);
/* The same, asking for shared members lists: an answer that lists its
 * members names them "members_of" a list of replica names that the batch
 * carries once ("replicas"); trk_sources_expand puts them back. */
int trk_client_sources_shared(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			      trk_client_cb cb, void *arg);
/* Gives each of the first n answers of a shared batch answer that names
 * "members_of" its "members" ("<replica>/<dst[i]>", in the list's order),
 * as an unshared answer has them. 0, -EPROTO for a list the batch lacks or
 * a name that is not a string or too long, -ENOMEM; answers before the
 * failing one are expanded. */
int trk_sources_expand(json_t *batch, const uint32_t *dst, size_t n);
/* GET /holders?version=&layout=: complete replicas of other layouts that
 * offer their ranks' memory for the version (each holder's "sources", in
 * rank order, parse with trk_sources_parse). */
int trk_client_holders(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], trk_client_cb cb, void *arg);
/* GET /layouts, /replicas/R, /status. */
int trk_client_layouts(struct trk_client *c, trk_client_cb cb, void *arg);
int trk_client_replica(struct trk_client *c, const char *replica,
		       trk_client_cb cb, void *arg);
int trk_client_status(struct trk_client *c, trk_client_cb cb, void *arg);

/* ---- parsing answers ---- */

struct trk_source {
	bool peer; /* else a publisher */
	char id[TRK_ID_MAX];
	char host[256];
	char provider[64];
	uint8_t *fabric_addr; /* malloc'ed */
	size_t fabric_addr_len;
	uint64_t addr, key, len;
	/* A /holders rank whose slot is partial: where its have-map is. */
	bool partial;
	uint64_t have_addr, have_key;
	char site[TRK_SITE_MAX + 1]; /* where it is ("": the unnamed site) */
};
/* Parses a /sources answer into a malloc'ed array (trk_sources_free frees it).
 * -EINVAL on a malformed answer; *out is then NULL. */
int trk_sources_parse(json_t *answer, struct trk_source **out, size_t *n,
		      struct proto_err *err);
void trk_sources_free(struct trk_source *s, size_t n);

#define TRK_RETAIN_LAYOUTS_MAX 8
struct trk_version_info {
	uint64_t version, parent;
	uint8_t kind; /* enum proto_kind */
	uint8_t digest[PROTO_HASH_BYTES];
	uint64_t wire_bytes, created_ms, published_ms;
	bool retain;
	/* Kept whole as part of the latest version's chain (its anchor and the
	 * deltas after it); no live publisher offers it any more. */
	bool chain, dropped;
	/* The layouts whose replicas aim at it (retain_layouts); all_layouts
	 * when the answer did not say or named more than TRK_RETAIN_LAYOUTS_MAX:
	 * then keep every layout. */
	bool all_layouts;
	uint32_t nlayouts;
	uint8_t layouts[TRK_RETAIN_LAYOUTS_MAX][PROTO_HASH_BYTES];
	/* Layouts of live replicas this version does not cover yet (the
	 * latest's only): the publisher adds them by addendum. */
	uint32_t nuncovered;
	uint8_t uncovered[TRK_RETAIN_LAYOUTS_MAX][PROTO_HASH_BYTES];
	/* Layouts added to it by addenda (the first TRK_RETAIN_LAYOUTS_MAX). */
	uint32_t nadded;
	uint8_t added[TRK_RETAIN_LAYOUTS_MAX][PROTO_HASH_BYTES];
	/* Layouts a node asked a raw copy of (the latest delta's only, while
	 * none is posted): the publisher signs one (copy addendum). */
	uint32_t ncopy_wanted;
	uint8_t copy_wanted[TRK_RETAIN_LAYOUTS_MAX][PROTO_HASH_BYTES];
};
/* Parses a /versions answer: latest and a malloc'ed array (free() it). */
int trk_versions_parse(json_t *answer, uint64_t *latest,
		       struct trk_version_info **out, size_t *n,
		       struct proto_err *err);
/* A /versions answer's now_ms (the tracker's clock when it answered, that
 * of published_ms): 0 in *now_ms when absent (an older tracker); -EINVAL
 * (err says why, *now_ms 0) when it is not a non-negative integer. */
int trk_versions_now(json_t *answer, uint64_t *now_ms, struct proto_err *err);

/* ---- blocking use (clients on a private base) ---- */

/* Collects one answer for trk_client_wait: pass trk_reply_cb and the reply as
 * (cb, arg) to any request above. */
struct trk_reply {
	bool done;
	int status;
	json_t *json;  /* owned reference or NULL */
	uint8_t *body; /* malloc'ed, NUL-terminated past len */
	size_t len;
	char error[512];
};
void trk_reply_init(struct trk_reply *r);
void trk_reply_fini(struct trk_reply *r);
void trk_reply_cb(const struct trk_answer *a, void *arg);
/* Runs the client's base until r is done. Only for a client with a private
 * base (trk_client_new with base NULL), outside any of its callbacks. */
void trk_client_wait(struct trk_client *c, struct trk_reply *r);

/*
 * One blocking call: request + wait. Returns 0 when an answer came (the HTTP
 * status in r->status, 2xx or not), or the negative errno of the request or
 * of the transport (r->error says why). r is initialized here; the caller
 * finalizes it in every case.
 */
int trk_client_call(struct trk_client *c, const char *method,
		    const char *path_query, const char *ctype, const void *body,
		    size_t len, struct trk_reply *r);

#endif
