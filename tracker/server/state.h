/* The tracker's state, apart from HTTP (tracker.h tells the model): the
 * durable version log and its addenda, the soft registry of publishers and
 * node ranks, and what derives from them: replicas whole, complete and
 * active, their targets, offers, timelines, canary scores. The endpoints
 * (internal.h) read and change it, on the loop's thread.
 */
#ifndef TRACKER_SERVER_STATE_H
#define TRACKER_SERVER_STATE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/manifest.h"
#include "proto/spec.h"
#include "proto/util.h"
#include "tracker/tracker.h"

struct trk_server;
struct trk_versions;
struct trk_registry;
struct trk_addenda;
struct trk_timeline;
struct trk_canary;
struct trk_srcache;
struct trk_srcentry;
struct proto_addendum;

#define TRK__NODE_VERSIONS 8      /* per-version states a node keeps */
#define TRK__OFFER_VERSIONS 16    /* versions a holder may offer at once */
#define TRK__ACTIVATIONS_MAX 1024 /* activation log entries kept */
#define TRK__FABRIC_ADDR_MAX 1024 /* bytes */
#define TRK__HOST_MAX 255
#define TRK__PROVIDER_MAX 63
#define TRK__ERROR_MAX 255
#define TRK__WALL_MS_MAX (1ull << 53) /* largest wall time in ms a body may carry */
#define TRK__TIMELINE_VERSIONS 64 /* versions whose timeline is kept */
#define TRK__TIMELINE_RANKS 4096  /* ranks (and replicas) per timeline */
#define TRK__LAYOUT_FORMS 16 /* layout forms (as nodes wrote them) cached */
#define TRK__CANARY_ENTRIES 256 /* (version, layout) expected canary scores kept */
#define TRK__EVERY_MS_MAX 86400000u /* the longest publisher clock accepted: a day */

/* ---- version_log.c: the durable version log ---- */

struct trk_version {
	uint64_t version, parent;
	uint8_t kind;
	uint8_t digest[PROTO_HASH_BYTES];
	uint8_t model_digest[PROTO_HASH_BYTES];
	uint8_t src_layout_digest[PROTO_HASH_BYTES];
	uint64_t wire_bytes, created_ms, published_ms;
	uint32_t nlayouts;
	/* Summed from node reports (soft). */
	uint64_t bytes_from_trainer, bytes_from_peers;
	uint64_t duplicate_bytes, refetched_bytes;
	uint64_t bytes_from_other_sites; /* received from sources in another site */
	bool offered; /* a publisher offered it at some time (soft) */
	/* Cache of the newest versions: raw bytes and decoded manifest. */
	uint8_t *raw;
	size_t rawlen;
	struct proto_manifest *m;
};

struct trk_store;

/* Loads the log from st (the server's store), making a cluster id in an
 * empty one; trainer_pk NULL means the pinned key (if any). On failure
 * *out is NULL and err says why. */
int trk__versions_open(struct trk_store *st, const uint8_t *trainer_pk,
		       struct trk_versions **out, struct proto_err *err);
/* NULL is fine. */
void trk__versions_free(struct trk_versions *vs);
/* The chain rule for m appended after the log: increasing numbers, parent 0
 * only for the very first, else an accepted version with the same digest.
 * 0 when it fits, else the HTTP code to refuse it with (err says why). */
int trk__versions_fits(struct trk_versions *vs, const struct proto_manifest *m,
		       struct proto_err *err);
/* Accepts m (checked by trk__versions_fits; raw its bytes, copied): stored
 * durably (and the trainer key pinned with the first version) before it is
 * appended. 0, taking m; or a negative errno with the answer's one line in
 * err (m stays the caller's; nothing is appended). */
int trk__versions_append(struct trk_versions *vs, struct proto_manifest *m, const uint8_t *raw,
			 size_t len, struct proto_err *err);
size_t trk__versions_count(const struct trk_versions *vs);
/* The i-th version, oldest first. */
struct trk_version *trk__versions_at(struct trk_versions *vs, size_t i);
/* The version numbered v, or NULL. */
struct trk_version *trk__versions_find(struct trk_versions *vs, uint64_t v);
uint64_t trk__versions_latest(const struct trk_versions *vs);
/* A node could not build delta version v from its parent: an anchor is
 * wanted (answered as "anchor_wanted" with the versions) until one newer
 * than v is published. */
void trk__versions_want_anchor(struct trk_versions *vs, uint64_t v);
bool trk__versions_anchor_wanted(const struct trk_versions *vs);
/* A rank reported a version built, how: "delta", "chain" or "full". */
void trk__versions_note_built(struct trk_versions *vs, const char *how);
/* For /metrics: versions by kind, their wire bytes, builds by how, anchor
 * requests. */
struct trk_versions_stats {
	uint64_t anchors, deltas, anchor_wire_bytes, delta_wire_bytes;
	uint64_t built_delta, built_chain, built_full, anchor_requests;
};
void trk__versions_stats(const struct trk_versions *vs, struct trk_versions_stats *out);
/* The chain's identity (hex) and the TRK_CHAIN_HEADER value: "CLUSTER
 * INSTANCE LATEST DIGEST" (DIGEST "-" while there is no version). */
const char *trk__versions_cluster(const struct trk_versions *vs);
void trk__versions_chain(const struct trk_versions *vs, char *buf, size_t len);
/* The decoded manifest of v (cached, or loaded and verified from disk; then
 * owned by the caller through *owned, freed with proto_manifest_fini+free).
 * -ENOENT for an unknown version. */
int trk__versions_manifest(struct trk_versions *vs, uint64_t v,
			   const struct proto_manifest **m,
			   struct proto_manifest **owned, struct proto_err *err);
/* r's bytes read from disk and checked against its digest: *buf malloc'ed,
 * or a negative errno with err set. */
int trk__versions_read_raw(struct trk_versions *vs, const struct trk_version *r, uint8_t **buf,
			   size_t *len, struct proto_err *err);
bool trk__versions_pinned(const struct trk_versions *vs);
/* The trainer key versions are checked with; NULL before one is known. */
const uint8_t *trk__versions_pk(const struct trk_versions *vs);

/* ---- addenda_store.c: layouts added to published versions ---- */

/* Loads (verifying each against the trainer key and its version's
 * manifest) the addenda in s->st; s->vs must be open. On failure *out is
 * NULL and err names the damaged one. */
int trk__addenda_open(struct trk_server *s, struct trk_addenda **out,
		      struct proto_err *err);
void trk__addenda_free(struct trk_addenda *ad);
/* Checks a posted addendum (signature, binding to its version's manifest)
 * and stores it durably: 201 stored, 200 the same one was already, or the
 * HTTP code to refuse it with (err says why). *out is the stored addendum
 * (201, 200), borrowed. */
int trk__addenda_add(struct trk_server *s, const uint8_t *buf, size_t len,
		     const struct proto_addendum **out, struct proto_err *err);
/* The stored bytes of v's addendum for layout (borrowed); false: none. */
bool trk__addenda_get(struct trk_server *s, uint64_t v, const uint8_t *layout, const uint8_t **raw,
		      size_t *len);
/* v's parcels of layout: m's (v's manifest) or an addendum's; NULL when
 * neither lists the layout. */
const struct proto_mlayout *trk__version_layout(struct trk_server *s, uint64_t v,
						const struct proto_manifest *m,
						const uint8_t *layout);
/* v's addenda as status JSON (new array; NULL on ENOMEM). */
json_t *trk__addenda_json(struct trk_server *s, uint64_t v);
/* A raw copy of layout for v is wanted: kept (true) when v is a delta whose
 * manifest lists layout and the want is new; else false (the asker's wait
 * runs out). */
bool trk__addenda_want_copy(struct trk_server *s, uint64_t v, const uint8_t *layout);
/* No raw copy of v will be made: the publisher makes them of the latest
 * version only (it keeps no other version's raw parcels). */
bool trk__addenda_copy_gone(struct trk_server *s, uint64_t v);
#define TRK__COPY_GONE_FMT "version %llu is no longer the latest: no raw copy of it will be made"
/* The layouts (hex, each once) of live replicas that v does not cover yet:
 * what the publisher is asked to add (new array; NULL on ENOMEM). */
json_t *trk__version_uncovered(struct trk_server *s, uint64_t v);
/* Layouts of v whose raw copy a node asked for and none is posted yet. */
json_t *trk__version_copy_wanted(struct trk_server *s, uint64_t v);

/* ---- the registry: publishers, replicas of node ranks ---- */

/* A serving layout some replica uses, shared by its replicas. */
struct trk_slayout {
	uint8_t digest[PROTO_HASH_BYTES];
	char name[TRK_REPLICA_MAX + 1]; /* what its first node called it, or "" */
	struct proto_layout l;
	json_t *json; /* explicit form */
	unsigned refs;
	struct trk_slayout *next;
};

/* A layout as some node wrote it (a JSON value), and what it parsed to. */
struct trk_lform {
	json_t *form;
	struct trk_slayout *sl; /* holds a reference */
};

struct trk_offer_set {
	uint64_t version;
	size_t n;
	struct trk_offer *o;
	/* A node's whole rank memory holding the version complete, for
	 * cross-layout readers (holders.c); len 0: none offered. */
	struct trk_offer slot;
};

struct trk_offers {
	struct trk_offer_set sets[TRK__OFFER_VERSIONS];
	size_t n;
};

struct trk_prank {
	uint32_t rank;
	char *host, *provider, *addr;
};

struct trk_publisher {
	char id[32];
	char site[TRK_SITE_MAX + 1]; /* where it is ("": the unnamed site) */
	char session[2 * TRK_SESSION_BYTES + 1]; /* its credential (hex), from registration */
	bool alive;
	uint64_t expires_ns, registered_ms, gone_ms;
	uint64_t every_ms; /* its clock (tessera publish --every), 0: none said */
	struct trk_prank *ranks;
	size_t nranks;
	struct trk_offers offers;
	struct trk_publisher *next;
};

/* A rank's recent progress reports (rate.c): (tracker wall ms, bytes
 * done) samples, the newest at (n - 1) % TRK__RATE_SAMPLES. */
#define TRK__RATE_SAMPLES 16
struct trk_rate {
	uint64_t ms[TRK__RATE_SAMPLES], bytes[TRK__RATE_SAMPLES];
	uint32_t n;       /* samples taken since the fetch (re)started */
	uint64_t grew_ms; /* when the bytes last grew */
	uint64_t peak_bps; /* the highest trk__rate_bps at a sample since then */
};

struct trk_nver {
	uint64_t version;
	enum trk_rank_state state;
	char how[8]; /* "delta", "chain" or "full" once built ("" until then) */
	uint64_t done, total, from_trainer, from_peers;
	uint64_t duplicate, refetched; /* bytes received twice, asked again */
	uint64_t from_other_sites; /* bytes received from sources in another site */
	uint64_t first_ms; /* wall time of the first report of this version */
	/* The rank's signed statement that it holds the version (wire/statement.c),
	 * kept while it reports it verified or active. */
	bool has_sig;
	uint8_t sig[TRK_STMT_SIG_BYTES];
	char banned[TRK__ERROR_MAX + 1]; /* peers it banned for the version, space-separated */
	struct trk_rate rate; /* its bytes done, over time */
};

struct trk_replica;

struct trk_node {
	char id[TRK_ID_MAX];
	char site[TRK_SITE_MAX + 1]; /* where it is ("": the unnamed site) */
	struct trk_replica *rep;
	uint32_t rank;
	char *host, *provider, *addr;
	struct trk_slayout *layout;
	bool alive;
	uint64_t expires_ns, registered_ms, gone_ms, report_ms;
	uint64_t beat_ms;    /* wall clock of its last lease renewal (registration, heartbeat) */
	const char *gone_why; /* why it went ("left", "lease expired"): a static string */
	uint64_t active; /* last version this rank reported active */
	struct trk_nver vers[TRK__NODE_VERSIONS];
	size_t nvers;
	int last; /* index of the last report in vers, -1 none */
	uint64_t report_seq; /* the highest `seq` of a report applied */
	char error[TRK__ERROR_MAX + 1];
	struct trk_offers offers;
	/* Handed to the node at registration; its heartbeats, reports and
	 * offers carry it (X-Tessera-Session) when the tracker is keyed. */
	char session[2 * TRK_SESSION_BYTES + 1];
	/* The key its statements are signed with, when it registered one: its
	 * verified and active reports then need a statement that verifies. */
	bool has_stmt_key;
	uint8_t stmt_key[TRK_STMT_PK_BYTES];
	/* What serving processes pinned on it, per version, at its last
	 * heartbeat (heartbeat.c). */
	struct trk_pin_count pins[TRK_PIN_VERSIONS_MAX];
	size_t npins;
	uint64_t pins_ms;
	/* The last live canary score a probe reported for it (canary.c). */
	struct {
		bool have;
		uint64_t version, ms;
		int64_t score;
	} canary;
};

struct trk_replica {
	char name[TRK_REPLICA_MAX + 1];
	struct trk_slayout *layout; /* holds a reference */
	uint32_t nranks;
	struct trk_node **ranks; /* nranks slots, NULL = never registered */
	uint64_t active;         /* the version all ranks last agreed active on */
	/* The version the replica works toward (target.c). */
	uint64_t target, target_ms;
	uint64_t created_ms;
	uint64_t fetch_ms;       /* last first-report -> verified time of a rank */
	uint64_t fetch_bps;      /* that fetch's rate (trk__fetch_bps; 0: not known) */
	uint64_t update_ms;      /* its last activation's time since that version's publication */
	uint64_t disagree_ms;    /* ranks hold different versions since (0: agree) */
	bool disagree_logged;
	char why[512];           /* what each rank holds and waits for, one line */
	struct trk_replica *next;
	struct trk_replica *hnext; /* its bucket's chain in the name index */
};

struct trk_activation {
	char replica[TRK_REPLICA_MAX + 1];
	uint64_t version, wall_ms;
};

struct trk_registry {
	struct trk_server *s;
	bool have_model;
	/* Why the last publisher's model was refused, while no model is
	 * known ("" when none was refused since one was): told to the nodes
	 * that ask for the model (trk__registry_no_model). */
	char model_refused[192];
	struct proto_model model;
	json_t *model_json;
	struct proto_layout tlayout;
	json_t *tlayout_json;
	struct trk_slayout *layouts;
	struct trk_lform forms[TRK__LAYOUT_FORMS]; /* most recently used first */
	size_t nforms;
	uint64_t forms_hits, forms_misses;
	struct trk_publisher *pubs;
	struct trk_replica *reps; /* sorted by name */
	/* The same replicas by name (repindex.c). */
	struct trk_replica **rix;
	size_t rix_nb, rix_n;
	uint8_t rix_key[16]; /* crypto_shorthash_KEYBYTES */
	/* Bumped by every change to who serves what (registrations, nodes
	 * gone, offers, publishers): /sources answers are kept against it
	 * (srcache.c). */
	uint64_t swarm_gen;
	/* Bumped by changes to who is in which swarm (registrations, nodes
	 * gone, the model dropped), not by offers: members lists are kept
	 * against it (srcache.c), across versions. */
	uint64_t members_gen;
	/* A replica without a finished fetch had its first rate (its
	 * reports'): members are chosen again at a sweep (rate.c,
	 * trk__members_rejudge). */
	bool rates_new;
	uint64_t rates_judged_ms; /* monotonic */
	struct trk_srcache *srcache;
	uint64_t src_batches, src_batched; /* POST /sources: requests, parcels */
	struct trk_activation act[TRK__ACTIVATIONS_MAX];
	size_t act_n, act_next;
	uint64_t act_total;
	uint64_t bytes_from_trainer, bytes_from_peers, bytes_from_other_sites;
	struct trk_timeline *tl; /* per-version update timelines */
	/* The next full sweep is due at this monotonic time (ns): the earliest
	 * lease end or prune time seen by the last sweep, at most one sweep
	 * period after it; 0 forces one at the next request. */
	uint64_t sweep_due_ns;
	/* Replica targets are looked at again by every sweep at this time or
	 * after (once a sweep period), by a forced one, and for a replica a
	 * sweep changed; other sweeps only end leases and prune. */
	uint64_t targets_due_ns;
};

/* ---- registry.c: lifetime, lookups, leases, counts ---- */

int trk__registry_new(struct trk_server *s, struct trk_registry **out);
void trk__registry_free(struct trk_registry *r);
/* Drops the model, the trainer layout and every replica (with its nodes);
 * publishers stay. Cannot fail. */
void trk__registry_drop_model(struct trk_registry *r);
/* Free an entry and everything it owns (offers included). NULL is fine for
 * a node; neither is unlinked from the registry. */
void trk__node_free(struct trk_node *n);
void trk__publisher_free(struct trk_publisher *p);
/* Lookups (alive or not); NULL when there is none. A node id is "A/0". */
struct trk_replica *trk__replica_find(struct trk_registry *r, const char *name);
struct trk_node *trk__node_find(struct trk_registry *r, const char *id);
struct trk_publisher *trk__publisher_find(struct trk_registry *r,
					  const char *id);
/* p serves rank (of the trainer layout). */
bool trk__publisher_has_rank(const struct trk_publisher *p, uint32_t rank);
/* true and the digests when a publisher registered a model. */
/* Why no model is known yet, for an answer: a publisher's model refused
 * (and why), or none registered. Owned by r, valid until the next change.
 * Cannot fail. */
const char *trk__registry_no_model(const struct trk_registry *r);
bool trk__registry_model(const struct trk_registry *r, uint8_t *model_digest,
			 uint8_t *layout_digest);
/* The lease a registration or heartbeat grants, in ns. */
uint64_t trk__registry_lease_ns(const struct trk_registry *r);
/* A lease was granted that ends at exp_ns (registrations; heartbeats only
 * extend leases and need not call this). */
void trk__registry_lease_granted(struct trk_registry *r, uint64_t exp_ns);
/* n is gone (its lease ran out, or it left) at now_ms; why (a string that
 * outlives n) is logged and kept for the status page. */
void trk__node_gone(struct trk_registry *r, struct trk_node *n, uint64_t now_ms, const char *why);
/* Expires leases that ran out by now, prunes long-gone entries and re-derives
 * every replica's target. Called before every request and by a timer, it
 * walks the registry only when something is due (a lease end, a prune, a
 * change marked by trk__registry_changed, or a sweep period passed), so a
 * request costs O(1) here however many nodes there are. */
void trk__registry_sweep(struct trk_registry *r);
/* The period after which a sweep walks the registry regardless, in ns. */
uint64_t trk__registry_sweep_period_ns(const struct trk_registry *r);
/* Something every replica's target depends on changed (a version was
 * published, a publisher registered or changed its offers): the next
 * request sweeps. */
void trk__registry_changed(struct trk_registry *r);
/* A change to the swarms: cached /sources answers are rebuilt. */
void trk__registry_swarm_changed(struct trk_registry *r);
/* A change to the swarms' members (a node registered or gone): members
 * lists are rebuilt, and cached /sources answers too. */
void trk__registry_members_changed(struct trk_registry *r);
/* For /metrics. */
struct trk_counts {
	uint64_t nodes_alive, nodes_gone, publishers_alive, publishers_gone;
	/* Replicas: whole and current, updating, failed or behind otherwise
	 * (rstate.c), a rank not alive, none alive. */
	uint64_t replicas_current, replicas_updating, replicas_failed, replicas_behind,
		replicas_partial, replicas_gone;
	uint64_t bytes_from_trainer, bytes_from_peers, bytes_from_other_sites, activations;
	uint64_t layout_cache_hits, layout_cache_misses;
};
void trk__registry_counts(struct trk_registry *r, struct trk_counts *out);

/* ---- repindex.c: replicas by name ---- */

/* An empty index (-ENOMEM); fini frees it (the replicas stay). */
int trk__repindex_init(struct trk_registry *r);
void trk__repindex_fini(struct trk_registry *r);
/* Enters rep (named, not yet in the index); cannot fail. */
void trk__repindex_add(struct trk_registry *r, struct trk_replica *rep);
/* Takes rep out (a no-op when it is not in). */
void trk__repindex_del(struct trk_registry *r, struct trk_replica *rep);

/* ---- slayouts.c: shared serving layouts and the cache of their forms ---- */

/* The serving layout that the JSON value jl describes, against the
 * registry's model: found among the forms seen before (an equal JSON value),
 * else parsed and checked to cover the model, then remembered. *out gets a
 * new reference. A bad layout is refused on every use with the same one-line
 * err (-EINVAL) and is never remembered; -ENOMEM. */
int trk__slayout_get(struct trk_registry *r, json_t *jl, struct trk_slayout **out,
		     struct proto_err *err);
/* The serving layout whose digest is digest, with a new reference, or NULL
 * when the tracker holds none (never seen, or no longer used). Every entry
 * was parsed and checked against the registry's model when it was made. */
struct trk_slayout *trk__slayout_by_digest(struct trk_registry *r, const uint8_t *digest);
/* Drop a reference; the last one unlinks and frees sl. NULL is fine. */
void trk__slayout_put(struct trk_registry *r, struct trk_slayout *sl);
/* Forgets every cached form (the model changes or the registry goes). */
void trk__slayout_cache_clear(struct trk_registry *r);

/* ---- replica.c: what derives from a replica's ranks ---- */

/* 1..TRK_REPLICA_MAX of [A-Za-z0-9._-]. */
bool trk__replica_name_valid(const char *s);
/* The same for a layout's name, which may hold ':' too ("tp2:fp8"). */
bool trk__layout_name_valid(const char *s);
/* n's state entry for v, or NULL. */
struct trk_nver *trk__node_version(struct trk_node *n, uint64_t v);
/* n is alive and reported v verified or active. NULL n is false. */
bool trk__node_holds(struct trk_node *n, uint64_t v);
/* Some rank of rep is alive. */
bool trk__replica_alive(const struct trk_replica *rep);
/* The site rep's ranks said at registration (its first registered rank's;
 * "" for the unnamed site). */
const char *trk__replica_site(const struct trk_replica *rep);
/* sites.c: per site (by name, the unnamed one, null, first): its replicas,
 * those alive and current, its live publishers. A new array, NULL on
 * ENOMEM. */
json_t *trk__sites_json(struct trk_server *s);
/* Every rank of rep registered and alive: only such a replica counts as
 * holding (or being active at) a version. */
bool trk__replica_whole(const struct trk_replica *rep);
/* Every rank of rep alive and holding v. */
bool trk__replica_complete(const struct trk_replica *rep, uint64_t v);
/* The versions rep is complete at, ascending, into out[TRK__NODE_VERSIONS];
 * returns how many. */
size_t trk__replica_complete_list(const struct trk_replica *rep,
				  uint64_t *out);
/* Re-derives rep's active version from its ranks' reports; a change is
 * logged as an activation. */
void trk__replica_update_active(struct trk_registry *r,
				struct trk_replica *rep);
/* The statements of the ranks of rep that hold v with one, as the array
 * the answers carry ([{"rank","key","sig"}]); NULL when out of memory. */
json_t *trk__replica_statements(const struct trk_replica *rep, uint64_t v);

/* A replica's state in words (trk__replica_state): gathered from its
 * ranks and the versions, judged by rstate.c. */
struct trk_rs_out;
void trk__replica_state(struct trk_server *s, const struct trk_replica *rep, uint64_t now_ms,
			struct trk_rs_out *out);
/* The same as JSON: {"state","why","fetch":{...}} members set on o; 1 on
 * failure (ENOMEM). */
int trk__replica_state_json(struct trk_server *s, const struct trk_replica *rep,
			    uint64_t now_ms, json_t *o);

/* ---- rate.c: a rank's fetch rate over a recent window ---- */

/* A report said bytes done at now_ms; true when it gave the fetch its
 * first rate (peak_bps). Cannot fail. */
bool trk__rate_sample(struct trk_rate *r, uint64_t now_ms, uint64_t bytes);
/* Bytes per second over about the last five seconds (0: not known). */
uint64_t trk__rate_bps(const struct trk_rate *r, uint64_t now_ms);
/* How long the bytes have not grown (0: no sample). */
uint64_t trk__rate_still_ms(const struct trk_rate *r, uint64_t now_ms);
/* How fast a rank can fetch, from the fetch r sampled (bytes in ms): the
 * highest rate its reports showed, or, with fewer than two reports, its
 * bytes over its time. What keeping up with a swarm is judged by
 * (members_cut, sources.c): a replica's time over a fetch counts the
 * waits its swarm put it through, the highest rate only its link. In a
 * swarm that 5 % of links at a tenth slowed as a whole (simulated, 64
 * replicas), those were at 1/3 of the others' whole-fetch rate and stayed
 * members; by their highest, at 1/10. */
uint64_t trk__fetch_bps(const struct trk_rate *r, uint64_t bytes, uint64_t ms);
/* Members are chosen again when a version is published, a replica joins
 * or leaves, and, at most this often, when a replica that never finished
 * a fetch has its first rate (*rates_new, set on that report): a slow
 * link that owns trainer chunks in the first version it fetches holds its
 * readers for the whole version otherwise. True when they are to be
 * chosen again now (monotonic ms), *judged_ms the last time. */
#define TRK_MEMBERS_REJUDGE_MS 1000
bool trk__members_rejudge(bool *rates_new, uint64_t *judged_ms, uint64_t now_ms);

/* ---- rstate.c: a replica's state, and why (a pure rule) ---- */

enum trk_rstate {
	TRK_RSTATE_CURRENT,  /* active on the latest version */
	TRK_RSTATE_UPDATING, /* on its way to a version younger than its usual update time */
	TRK_RSTATE_BEHIND,   /* anything else short of the latest: why says what holds it */
	TRK_RSTATE_FAILED,   /* a live rank's last report is a failure */
	TRK_RSTATE_GONE,     /* no rank alive */
	TRK_RSTATE_COUNT
};
/* "current", "updating", "behind", "failed", "gone". */
const char *trk__rstate_name(enum trk_rstate s);

struct trk_rs_rank {
	bool present, alive;  /* registered; its lease holds */
	const char *id;       /* NULL: none */
	uint64_t gone_ms;     /* not alive: for how long */
	const char *gone_why; /* not alive: why ("left", "lease expired"; NULL: not known) */
	uint64_t beat_ms;     /* since its last heartbeat (0: not known) */
	bool reported;        /* the fields below come from its last report */
	enum trk_rank_state state;
	uint64_t version, done, total, from_trainer, from_peers;
	uint64_t rate_bps;    /* over a recent window; 0: not known */
	uint64_t still_ms;    /* since its bytes last grew */
	const char *error;    /* its last failure ("" or NULL: none) */
	uint64_t want_bytes;  /* its parcels' wire bytes at the version the replica
			       * fetches (trk_rs_in.want_version), when sized */
};

struct trk_rs_in {
	uint64_t latest, active, target;
	uint64_t lag_ms;      /* since the first version after active came out */
	uint64_t usual_ms;    /* its last update took (0: not known) */
	uint64_t grace_ms;    /* TESSERA_UPDATING_MS: updating while lag_ms is within
			       * this or usual_ms */
	uint64_t stall_ms;    /* TESSERA_NO_PROGRESS_MS */
	bool uncovered;       /* the latest version has no parcels for its layout */
	/* The version the ranks fetch (the highest one fetching above active,
	 * else the target) and whether every rank's want_bytes is its size
	 * there (from the version's manifest or an addendum). */
	uint64_t want_version;
	bool sized;
	uint32_t nranks;
	const struct trk_rs_rank *ranks;
};

struct trk_rs_out {
	enum trk_rstate state;
	char why[512];        /* one line, without the state's name */
	/* The current fetch of the version fetching (0: none), over the whole
	 * replica: done counts a rank that holds it whole; total is every
	 * rank's parcels (0 when not known: a rank not reporting and the
	 * version not sized); rate_bps is the fetching ranks' summed (0: not
	 * known). */
	uint64_t fetching, done, total, from_trainer, from_peers, rate_bps;
	uint32_t reporting;   /* ranks that reported the version fetching or held */
	uint64_t eta_ms;      /* (total - done) / rate_bps; UINT64_MAX: not known */
	uint64_t still_ms;    /* the longest a fetching rank made no progress */
	uint32_t still_rank;
};
/* Judges in into *out. Cannot fail. */
void trk__rstate_judge(const struct trk_rs_in *in, struct trk_rs_out *out);

/* ---- offer_sets.c: what a holder offers ---- */

/* Frees every offer set; o stays usable (empty). */
void trk__offers_clear(struct trk_offers *o);
/* Replaces the set for v (n == 0 without a slot removes it); takes list.
 * Past TRK__OFFER_VERSIONS sets, the oldest version's goes. */
void trk__offers_put(struct trk_offers *o, uint64_t v, struct trk_offer *list, size_t n,
		     const struct trk_offer *slot);
/* The offer of parcel (v, layout, src, dst), or NULL. */
const struct trk_offer *trk__offers_find(struct trk_offers *o, uint64_t v, const uint8_t *layout,
					 uint32_t src, uint32_t dst);
/* The slot a holder offers for version v (NULL: none). */
const struct trk_offer *trk__offers_slot(const struct trk_offers *o, uint64_t v);
/* One /sources entry (new reference; NULL on ENOMEM). */
json_t *trk__source_json(bool peer, const char *id, const char *site, const char *host,
			 const char *provider, const char *addr, const struct trk_offer *o);

/* ---- srcache.c: /sources answers kept per swarm state ---- */

struct trk_srckey {
	uint64_t version;
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t src, dst;
	char site[TRK_SITE_MAX + 1]; /* the asker's: its site's view */
};
int trk__srcache_new(struct trk_srcache **out);
void trk__srcache_free(struct trk_srcache *sc); /* NULL is fine */
/* k's entry. Current when made at generation gen (trk__srcache_ready):
 * then render it. Else it comes back empty for the caller to fill (members,
 * then sources: peers first) and mark ready; one left unready (a failure)
 * is rebuilt by the next query. Cannot fail. */
struct trk_srcentry *trk__srcache_get(struct trk_srcache *sc, const struct trk_srckey *k,
				      uint64_t gen);
bool trk__srcache_ready(const struct trk_srcentry *e);
/* Stores the rendered members array and the array of their replicas'
 * names (both borrowed), and whether the swarm had more members (cut:
 * answers say "members_cut"); -ENOMEM. */
int trk__srcache_set_members(struct trk_srcentry *e, json_t *members, json_t *reps, bool cut);
/* The replica names' array as text and its tag (*rtag): the entry's, valid
 * until the entry is next got. */
const char *trk__srcache_replicas(const struct trk_srcentry *e, const char **rtag);
/* Stores one source object (its reference stolen; NULL: -ENOMEM). Peers
 * come before publishers (-EINVAL else). */
int trk__srcache_add_source(struct trk_srcentry *e, json_t *src, bool peer);
void trk__srcache_set_ready(struct trk_srcentry *e);
/* The answer's body, peers in a fresh random order: malloc'ed, *len set;
 * NULL on ENOMEM. Members as "members_same" (tag is the list's), else
 * with shared as "members_of" the replicas' tag (*listed set: the batch
 * must carry that list), else listed. */
char *trk__srcache_render(struct trk_srcentry *e, const char *tag, bool shared, bool *listed,
			  size_t *len);
/* The members of rank k->dst's swarm of k->layout in k->site (what
 * set_members stored for it), kept across versions while the registry's
 * members generation stays gen: copied into e (0), or -ENOENT (build
 * them), -ENOMEM. */
int trk__srcache_members_copy(struct trk_srcache *sc, struct trk_srcentry *e,
			      const struct trk_srckey *k, uint64_t gen);
/* Keeps e's members (set by set_members) for k's swarm at members
 * generation gen; nothing kept on ENOMEM (the next build makes them). */
void trk__srcache_members_keep(struct trk_srcache *sc, const struct trk_srcentry *e,
			       const struct trk_srckey *k, uint64_t gen);
/* Queries answered from an entry / that built one, for /metrics. */
void trk__srcache_stats(const struct trk_srcache *sc, uint64_t *hits, uint64_t *misses);

/* ---- target.c: the version a replica works toward ---- */

/* Re-derives rep's target from its ranks' reports, the latest version and
 * what publishers still serve (the rule is in tracker/API.md); updates the
 * disagreement note and logs its start and end. Cannot fail. */
void trk__replica_update_target(struct trk_server *s, struct trk_replica *rep);
/* A version a publisher served and no live publisher serves now (never the
 * latest). */
bool trk__version_dropped(struct trk_server *s, uint64_t v);
/* The same for v's parcels of one serving layout: a publisher may drop the
 * layouts of a version that no replica of that layout aims at. */
bool trk__version_dropped_for(struct trk_server *s, uint64_t v, const uint8_t *layout);
/* v is the latest version's anchor or one of the deltas after it (the
 * chain a node without the latest's parent replays): kept whole. */
bool trk__version_in_chain(struct trk_server *s, uint64_t v);
/* v is the latest or the target of a live replica: publishers keep it. */
bool trk__version_retained(struct trk_server *s, uint64_t v);
/* The digests (hex) of the layouts of the live replicas aiming at v, each
 * once: a new JSON array, NULL on ENOMEM. */
json_t *trk__version_retain_layouts(struct trk_server *s, uint64_t v);
/* How far rep's active version is behind the latest: in versions, and in ms
 * since the first version after it was published (0 when current). */
void trk__replica_lag(struct trk_server *s, const struct trk_replica *rep,
		      uint64_t now_ms, uint64_t *versions, uint64_t *ms);

/* ---- timeline.c: per-version update timelines (soft) ---- */

int trk__timeline_new(struct trk_timeline **out);
void trk__timeline_free(struct trk_timeline *tl);
/* Records the boundaries of version v's update as they pass. Times are wall
 * clock ms: snapshot and first/last byte as their senders measured them
 * (0: not known), now_ms the tracker's. The timelines of the newest
 * TRK__TIMELINE_VERSIONS versions are kept. Cannot fail (an entry that
 * cannot be stored is not). */
void trk__timeline_snapshot(struct trk_timeline *tl, uint64_t v, uint64_t snapshot_ms);
void trk__timeline_rank(struct trk_timeline *tl, uint64_t v, const char *replica,
			uint32_t nranks, uint32_t rank, enum trk_rank_state st,
			uint64_t first_byte_ms, uint64_t last_byte_ms, uint64_t from_trainer,
			uint64_t from_peers, uint64_t now_ms);
/* The replica became complete (prepared) or activated at v. */
void trk__timeline_replica(struct trk_timeline *tl, uint64_t v, const char *replica,
			   uint32_t nranks, bool activated, uint64_t now_ms);
/* The publisher's report of v's export (checked by the caller): the last
 * one sent replaces the one before. */
void trk__timeline_publish(struct trk_timeline *tl, uint64_t v,
			   const struct trk_publish_report *r);
/* GET /versions/V/timeline's object for ver (new reference; NULL: no memory). */
json_t *trk__timeline_json(struct trk_timeline *tl, const struct trk_version *ver);
/* Sets "publish", the report of v's export, in o (nothing when there is
 * none); nonzero on ENOMEM. */
int trk__timeline_set_publish(struct trk_timeline *tl, uint64_t v, json_t *o);

/* ---- canary.c: expected and live canary scores ---- */

int trk__canary_new(struct trk_canary **out);
void trk__canary_free(struct trk_canary *cn);
/* The expected score of rank of layout at v; -ENOENT when none was posted. */
int trk__canary_expected(struct trk_server *s, uint64_t v, const uint8_t *layout, uint32_t rank,
			 int64_t *out);
/* n's last live score with its verdict ({"version","score","expected","ok",...};
 * JSON null when never probed). New reference; NULL on ENOMEM. */
json_t *trk__canary_rank_json(struct trk_server *s, const struct trk_node *n);
/* true when every rank of rep was probed at v and matches, false when one
 * does not, null otherwise. */
json_t *trk__canary_replica_ok(struct trk_server *s, const struct trk_replica *rep, uint64_t v);
/* For /metrics: live reports by verdict (match, mismatch, unknown), and the
 * live ranks whose last score differs from the expected one. */
void trk__canary_stats(const struct trk_server *s, uint64_t reports[3], uint64_t *mismatched);

#endif
