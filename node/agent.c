/* The node agent: register, watch, fetch, verify, activate (see agent.h). */
#include "node/agent.h"
#include "node/waitnote.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "node/agent_metrics.h"
#include "node/attach.h"
#include "node/fabloop.h"
#include "node/store.h"
#include "node/verifier.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define RETRY_MS 500        /* registration and metadata retries */
#define SOURCES_MIN_MS 300  /* least time between two /sources for a parcel */
#define BAD_SOURCE_MS 2000  /* a failed source rests this long */
#define REPORT_MS 500       /* progress reports while fetching */
#define REPLICA_POLL_MS 100 /* waiting for the rest of the replica */
#define SYNC_MS 200         /* asking the tracker for the replica's target */
#define FAILED_RETRY_MS 2000 /* a version we gave up on is tried again after */
#define WINDOW_MIN_CHUNKS 2 /* least read window per source, chunks */
#define RATE_SAMPLE_MS 250  /* least stretch a source's rate is measured over */

struct agent_source {
	struct trk_source info;
	fi_addr_t fa;
	bool fa_valid;
	uint64_t bad_until_ms;
	/* Pacing, kept across source list refreshes (see pump()): */
	uint64_t inflight_bytes;
	uint32_t inflight_reads;
	uint64_t rate;            /* measured bytes/s while busy; 0: not yet */
	uint64_t meas_ms, meas_bytes; /* the measurement under way */
	uint64_t progress_ms;     /* a read completed, or it became busy */
	bool silent_logged;       /* "no other source" said for this silence */
};

struct agent_parcel {
	const struct proto_mparcel *mp;
	const struct proto_parcel *pp;
	struct agent_source *srcs;
	size_t nsrcs;
	uint32_t rr; /* round-robin position among sources */
	uint32_t src_epoch; /* bumped whenever srcs is replaced */
	uint64_t sources_ms;
	bool sources_pending;
	uint8_t *state; /* per chunk: 0 todo, 1 in flight, 2 done */
	uint8_t *asked; /* per chunk: a read was posted for it before */
	uint32_t next_todo;
	uint32_t done;
};

struct agent_read {
	struct fab_op op;
	struct node_agent *a;
	uint32_t parcel, chunk, slot, len;
	uint32_t src_idx, src_epoch; /* srcs[src_idx] while the epoch holds */
	bool src_peer;
	uint64_t started_ms;
	bool abandoned; /* stalled: its slot stays reserved until completion */
	bool busy;      /* the slot holds this read (in fabric or verifying) */
	bool in_fabric; /* posted, not completed */
	struct node_vjob job;
	uint64_t gen; /* fetch generation it belongs to */
};

struct agent_fetch {
	uint64_t version;
	struct proto_manifest man;
	bool have_man;
	const struct proto_mlayout *ml;
	const struct proto_plan *plan; /* the agent's, checked against the manifest */
	struct node_slot *slot;
	struct agent_parcel *parcels;
	uint32_t nparcels;
	uint64_t bytes_total, bytes_done, from_trainer, from_peers;
	uint64_t refetched; /* bytes requested again (failed, bad or moved reads) */
	uint64_t started_ms;
	uint64_t first_byte_ms, last_byte_ms; /* wall clock: chunks landed */
	bool verified, reported_verified;
	/* The activation record could not be written: not active, and why. */
	char expose_error[512];
	/* Per-chunk trouble, tallied and logged once per version (the first
	 * of each kind at warn, the rest at debug, totals on the way out). */
	uint32_t stalls, bad_chunks, read_failures;
};

struct node_agent {
	struct node_agent_opts o;
	struct event_base *base;
	struct trk_client *trk;
	struct proto_model model;
	struct proto_layout layout;
	json_t *layout_json;
	char layout_name[65]; /* "tp2", or the layout file's name; "" if none fits */
	uint8_t trainer_pk[PROTO_PK_BYTES];
	struct node_store store;
	struct fab_ctx *fab;
	struct node_fabloop *fl;
	char fabric_hex[2 * FAB_ADDR_MAX + 1];
	char host[256];
	char node_id[TRK_ID_MAX];
	bool registered, watching;
	uint64_t lease_ms;

	/* Bounce buffers: reads land here, are hashed, then scattered. */
	uint8_t *bounce;
	size_t bounce_len;
	struct fab_mr *bounce_mr;
	struct node_verifier *ver;
	struct agent_read *reads;
	uint32_t nreads, inflight, max_inflight;
	uint32_t chunk_size;
	/* Fetch rate cap (token bucket; rate 0: none), so pulling a version
	 * cannot starve the serving traffic that shares the host's links. */
	uint64_t rate_bps, tokens, tokens_ns;
	struct event *rate_ev;

	uint64_t seen;   /* newest version the tracker told us about */
	uint64_t failed; /* the version we last gave up on, and when */
	uint64_t failed_ms;
	uint64_t target; /* the replica's target, as the tracker last said */
	bool syncing;
	struct agent_fetch *fetch;
	uint64_t gen;
	/* The plan from the trainer layout to ours, kept across versions. */
	struct proto_plan plan;
	bool have_plan;
	uint8_t plan_src[PROTO_HASH_BYTES];
	struct node_slot *active;
	uint8_t active_digest[PROTO_HASH_BYTES];
	/* Serving processes pin slots through it; it frees retired ones. */
	struct node_attach *attach;

	/* Verified parent links: the last manifest we accepted. */
	uint64_t last_version;
	uint8_t last_digest[PROTO_HASH_BYTES];

	struct event *retry_ev, *heartbeat_ev, *tick_ev, *sync_ev;
	struct node_wait wait; /* what we wait for, said when it lasts */
	uint64_t last_report_ms;
	int fatal;
	struct proto_err fatal_err;
	struct node_agent_metrics am;
};

static void start_register(struct node_agent *a);
static void start_watch(struct node_agent *a);
static void start_fetch(struct node_agent *a, uint64_t v);
static void sync_now(struct node_agent *a);
static void pump(struct node_agent *a);
static void fetch_fail(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static uint64_t now_ms(void)
{
	return proto_now_ns() / 1000000;
}

static void arm(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	event_add(ev, &tv);
}

static void give_up(struct node_agent *a, const char *why)
{
	a->fatal = 1;
	snprintf(a->fatal_err.msg, sizeof(a->fatal_err.msg), "%s", why);
	node_metrics_set_health(a->am.m, false, why);
	event_base_loopexit(a->base, NULL);
}

/* The tracker forgot the chain this node saw (its answers are refused
 * until it has it again): keep serving the active version, say so. */
static void on_chain_lost(void *arg, const char *why)
{
	struct node_agent *a = arg;

	if (why != NULL)
		node_metrics_set_health(a->am.m, false, why);
	else if (a->registered)
		node_metrics_set_health(a->am.m, true, NULL);
}

/* ---- reporting ---------------------------------------------------------- */

static void ignore_answer(const struct trk_answer *ans, void *arg)
{
	if (ans->status < 0 || ans->status >= 400)
		LOG_DEBUG("tracker: %d %s", ans->status, ans->error);
}

static void report(struct node_agent *a, uint64_t version, enum trk_rank_state st,
		   const char *error, trk_client_cb cb)
{
	struct agent_fetch *f = a->fetch;
	struct trk_state_report r = {
		.id = a->node_id,
		.version = version,
		.state = st,
		.error = error,
	};
	if (f != NULL && f->version == version) {
		r.bytes_done = f->bytes_done;
		r.bytes_total = f->bytes_total;
		r.bytes_from_trainer = f->from_trainer;
		r.bytes_from_peers = f->from_peers;
		r.first_byte_ms = f->first_byte_ms;
		r.last_byte_ms = f->last_byte_ms;
	} else if (a->active != NULL && a->active->version == version) {
		r.bytes_done = r.bytes_total = a->active->len;
	}
	if (!a->registered)
		return;
	if (trk_client_report_state(a->trk, &r, cb ? cb : ignore_answer, a) != 0)
		LOG_WARN("node %s: could not report %s for v%" PRIu64, a->node_id,
			 trk_state_name(st), version);
}

/* ---- fetch lifecycle ---------------------------------------------------- */

static void fetch_free(struct node_agent *a, struct agent_fetch *f)
{
	if (f == NULL)
		return;
	/* No worker may still be scattering into this fetch's slot. */
	if (a->ver != NULL)
		node_verifier_drain(a->ver);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		for (size_t s = 0; s < p->nsrcs; s++) {
			if (p->srcs[s].fa_valid && a->fab != NULL)
				fab_av_remove(a->fab, p->srcs[s].fa);
			free(p->srcs[s].info.fabric_addr);
		}
		free(p->srcs);
		free(p->state);
		free(p->asked);
	}
	free(f->parcels);
	if (f->slot != NULL)
		node_slot_free(&a->store, f->slot);
	if (f->have_man)
		proto_manifest_fini(&f->man);
	free(f);
}

/* Drops the current fetch; reads still in flight finish into their slots
 * and are ignored (their generation is stale). */
static void fetch_drop(struct node_agent *a)
{
	for (uint32_t i = 0; i < a->nreads; i++)
		if (a->reads[i].in_fabric)
			a->reads[i].abandoned = true;
	fetch_free(a, a->fetch);
	a->fetch = NULL;
	a->gen++;
}

static void fetch_fail(struct node_agent *a, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	uint64_t v = a->fetch ? a->fetch->version : 0;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (a->fetch != NULL)
		LOG_WARN("node %s: v%" PRIu64 " refused: %s (%u stalled reads, %u failed reads, "
			 "%u chunks failed their hash)",
			 a->node_id, v, msg, a->fetch->stalls, a->fetch->read_failures,
			 a->fetch->bad_chunks);
	else
		LOG_WARN("node %s: v%" PRIu64 " refused: %s", a->node_id, v, msg);
	report(a, v, TRK_STATE_FAILED, msg, NULL);
	node_metrics_add(a->am.m, a->am.refused, 1);
	a->failed = v;
	a->failed_ms = now_ms();
	fetch_drop(a);
}

/* ---- activation ---------------------------------------------------------- */

/*
 * The activation record, <expose>/<replica>-<rank>.json: what a serving
 * process reads to find the served slot. A node is active on a version only
 * once that record names it; when it cannot be written the old version stays
 * the served one and the node reports the reason as a failure.
 */
static int write_expose(struct node_agent *a, struct node_slot *slot, const uint8_t *digest,
			struct proto_err *err)
{
	char path[4096];
	json_t *o, *locals;
	int rc = -ENOMEM;

	if (a->o.expose_dir == NULL)
		return 0;
	o = node_slot_describe(&a->store, slot);
	locals = json_array();
	if (o == NULL || locals == NULL) {
		proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	const struct proto_rank *rk = &a->layout.ranks[a->o.rank];
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct proto_local *l = &rk->locals[i];
		json_t *shape = json_array();
		for (uint32_t d = 0; d < l->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)l->shape[d]));
		json_array_append_new(locals, json_pack("{s:s,s:I,s:I,s:s,s:o}", "name", l->name,
							"offset", (json_int_t)l->offset, "nbytes",
							(json_int_t)l->nbytes, "dtype",
							proto_dtype_name(l->dtype), "shape", shape));
	}
	char hex[2 * PROTO_HASH_BYTES + 1], mhex[2 * PROTO_HASH_BYTES + 1];
	sodium_bin2hex(hex, sizeof(hex), a->layout.digest, PROTO_HASH_BYTES);
	sodium_bin2hex(mhex, sizeof(mhex), digest, PROTO_HASH_BYTES);
	json_object_set_new(o, "replica", json_string(a->o.replica));
	json_object_set_new(o, "rank", json_integer(a->o.rank));
	json_object_set_new(o, "pid", json_integer(getpid()));
	json_object_set_new(o, "layout_digest", json_string(hex));
	json_object_set_new(o, "manifest_digest", json_string(mhex));
	json_object_set_new(o, "activated_ms", json_integer((json_int_t)proto_wall_ms()));
	json_object_set_new(o, "locals", locals);
	locals = NULL;
	if (a->attach != NULL)
		json_object_set_new(o, "attach", json_string(node_attach_path(a->attach)));
	snprintf(path, sizeof(path), "%s/%s-%u.json", a->o.expose_dir, a->o.replica, a->o.rank);
	rc = proto_write_json_atomic(path, o, JSON_COMPACT, err);
out:
	json_decref(locals);
	json_decref(o);
	return rc;
}

/* The activation record can be written now: a probe file in the expose
 * directory (created first if missing) is written and removed. A rank that
 * could not activate does not say "verified", so its replica never becomes
 * complete and no other rank switches without it. */
static int probe_expose(struct node_agent *a, struct proto_err *err)
{
	char path[4096];
	int rc;

	if (a->o.expose_dir == NULL)
		return 0;
	if ((rc = proto_mkdir_p(a->o.expose_dir, err)) != 0)
		return rc;
	snprintf(path, sizeof(path), "%s/.%s-%u.probe", a->o.expose_dir, a->o.replica, a->o.rank);
	if ((rc = proto_write_file_atomic(path, "{}", 2, 0644, err)) != 0)
		return rc;
	unlink(path);
	return 0;
}

/* The node cannot activate f: it says so (once per reason) and keeps the
 * fetch; the next sync tries again. */
static void expose_blocked(struct node_agent *a, const char *what, const struct proto_err *err)
{
	struct agent_fetch *f = a->fetch;
	char msg[sizeof(f->expose_error)];

	snprintf(msg, sizeof(msg), "%s: %s", what, err->msg);
	if (strcmp(msg, f->expose_error) != 0)
		LOG_ERR("node %s: v%" PRIu64 " not activated: %s", a->node_id, f->version, msg);
	snprintf(f->expose_error, sizeof(f->expose_error), "%s", msg);
	report(a, f->version, TRK_STATE_FAILED, msg, NULL);
}

static void activate(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	struct proto_err err;

	if (node_slot_activate(&a->store, f->slot, &err) != 0) {
		fetch_fail(a, "activation: %s", err.msg);
		return;
	}
	if (write_expose(a, f->slot, f->man.digest, &err) != 0) {
		expose_blocked(a, "cannot write the activation record", &err);
		return;
	}
	/* The switch: from here on the new slot is the served one. */
	struct node_slot *old = a->active;
	a->active = f->slot;
	f->slot = NULL;
	memcpy(a->active_digest, f->man.digest, PROTO_HASH_BYTES);
	node_wait_over(&a->wait, NULL);
	LOG_INFO("node %s: v%" PRIu64 " active (%" PRIu64 " bytes, %" PRIu64 " from trainer, %" PRIu64
		 " from peers, %" PRIu64 " refetched, %" PRIu64 " ms; %u stalled reads, %u failed "
		 "reads, %u chunks failed their hash)",
		 a->node_id, f->version, f->bytes_done, f->from_trainer, f->from_peers, f->refetched,
		 now_ms() - f->started_ms, f->stalls, f->read_failures, f->bad_chunks);
	node_metrics_set(a->am.m, a->am.active_version, f->version);
	node_metrics_set(a->am.m, a->am.serving_bytes, a->active->len);
	node_metrics_add(a->am.m, a->am.activations, 1);
	node_metrics_observe(a->am.m, a->am.activation_seconds,
			     (double)(now_ms() - f->started_ms) / 1000.0);
	report(a, f->version, TRK_STATE_ACTIVE, NULL, NULL);
	fetch_drop(a);
	/* Requests pinning the old slot keep it until they release it. */
	node_attach_activate(a->attach, a->active, a->active_digest);
	node_attach_retire(a->attach, &a->store, old);
	sync_now(a); /* the replica's next target may be there already */
}

/* Names the ranks of our replica that do not hold the version we verified. */
static void note_replica_wait(struct node_agent *a, const struct trk_answer *ans)
{
	char missing[256] = "";
	size_t n = 0, i;
	json_t *r;

	json_array_foreach(json_object_get(ans->json, "ranks"), i, r)
	{
		const char *st = json_string_value(json_object_get(r, "state"));
		uint64_t v = (uint64_t)json_integer_value(json_object_get(r, "version"));
		bool alive = json_is_true(json_object_get(r, "alive"));
		if (alive && v == a->fetch->version && st != NULL &&
		    (strcmp(st, "verified") == 0 || strcmp(st, "active") == 0))
			continue;
		n += (size_t)snprintf(missing + n, n < sizeof(missing) ? sizeof(missing) - n : 0,
				      "%s%lld (%s)", n ? ", " : "",
				      (long long)json_integer_value(json_object_get(r, "rank")),
				      !alive ? (json_is_null(json_object_get(r, "id")) ? "never registered" : "dead")
					     : st ? st : "?");
	}
	node_wait_note(&a->wait, now_ms(), a->node_id, "replica",
		       "the rest of replica %s to verify v%" PRIu64 "%s%s", a->o.replica,
		       a->fetch->version, missing[0] ? "; not yet: rank " : "",
		       ans->status == 200 ? missing : ans->error);
}

static bool in_list(json_t *arr, uint64_t v)
{
	size_t i;
	json_t *e;

	json_array_foreach(arr, i, e)
		if (json_is_integer(e) && (uint64_t)json_integer_value(e) == v)
			return true;
	return false;
}

/*
 * The tracker chose the replica's target t (the rule is in tracker/API.md):
 * work toward it. A fetch of another version is dropped (the tracker moves
 * a target away from a version only when no rank can finish it first); no
 * fetch is started for a version at or below the one we serve. A verified
 * fetch of t activates once the replica is complete at t.
 */
static void follow_target(struct node_agent *a, uint64_t t, bool complete)
{
	struct agent_fetch *f = a->fetch;
	uint64_t active = a->active ? a->active->version : 0;

	if (t == 0)
		return;
	if (t != a->target)
		LOG_DEBUG("node %s: replica target v%" PRIu64, a->node_id, t);
	a->target = t;
	if (f != NULL && f->version != t) {
		LOG_INFO("node %s: replica %s moved to v%" PRIu64 ": dropping v%" PRIu64 "%s",
			 a->node_id, a->o.replica, t, f->version, f->verified ? " (verified)" : "");
		fetch_drop(a);
		f = NULL;
	}
	if (f == NULL) {
		if (t > active && (t != a->failed || now_ms() - a->failed_ms >= FAILED_RETRY_MS))
			start_fetch(a, t);
		return;
	}
	if (!f->verified)
		return;
	if (f->expose_error[0] != 0) {
		struct proto_err err;
		if (probe_expose(a, &err) != 0) {
			expose_blocked(a, "cannot write the activation record", &err);
			return;
		}
		LOG_INFO("node %s: the activation record can be written again", a->node_id);
		f->expose_error[0] = 0;
		f->reported_verified = false; /* the tick says verified again */
		return;
	}
	if (complete)
		activate(a);
}

static void on_sync(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	uint64_t t;
	bool complete;

	a->syncing = false;
	if (ans->status != 200 || !json_is_integer(json_object_get(ans->json, "target")))
		return;
	t = (uint64_t)json_integer_value(json_object_get(ans->json, "target"));
	complete = in_list(json_object_get(ans->json, "complete"), t);
	follow_target(a, t, complete);
	if (!complete && a->fetch != NULL && a->fetch->verified && a->fetch->version == t)
		note_replica_wait(a, ans);
}

/* Asks the tracker for the replica (its target and where it is complete). */
static void sync_now(struct node_agent *a)
{
	if (!a->registered || a->syncing)
		return;
	if (trk_client_replica(a->trk, a->o.replica, on_sync, a) == 0)
		a->syncing = true;
}

static void on_sync_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	sync_now(a);
	arm(a->sync_ev, a->fetch != NULL && a->fetch->verified ? REPLICA_POLL_MS : SYNC_MS);
}

static void on_verified_report(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	json_t *t;

	if (f == NULL || !f->verified)
		return;
	if (ans->status != 200) {
		f->reported_verified = false; /* say it again on the next tick */
		return;
	}
	t = json_object_get(ans->json, "replica_target");
	follow_target(a, json_is_integer(t) ? (uint64_t)json_integer_value(t) : f->version,
		      json_is_true(json_object_get(ans->json, "replica_complete")));
}

static void all_verified(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	struct proto_err err;

	f->verified = true;
	f->reported_verified = true;
	LOG_INFO("node %s: v%" PRIu64 " verified in %" PRIu64 " ms", a->node_id, f->version,
		 now_ms() - f->started_ms);
	if (probe_expose(a, &err) != 0) {
		expose_blocked(a, "cannot write the activation record", &err);
		return;
	}
	report(a, f->version, TRK_STATE_VERIFIED, NULL, on_verified_report);
}

/* ---- transfers ---------------------------------------------------------- */

static void on_sources(const struct trk_answer *ans, void *arg);

struct sources_req {
	struct node_agent *a;
	uint64_t gen;
	uint32_t parcel;
};

static void want_sources(struct node_agent *a, uint32_t pi)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	struct sources_req *req;

	if (p->sources_pending || now_ms() - p->sources_ms < SOURCES_MIN_MS)
		return;
	req = malloc(sizeof(*req));
	if (req == NULL)
		return;
	*req = (struct sources_req){a, a->gen, pi};
	p->sources_pending = true;
	p->sources_ms = now_ms();
	if (trk_client_sources(a->trk, f->version, f->ml->layout_digest, p->mp->src_rank,
			       p->mp->dst_rank, on_sources, req) != 0) {
		p->sources_pending = false;
		free(req);
	}
}

static void on_sources(const struct trk_answer *ans, void *arg)
{
	struct sources_req *req = arg;
	struct node_agent *a = req->a;
	struct agent_fetch *f = a->fetch;
	struct trk_source *s = NULL;
	struct proto_err err;
	size_t n = 0;

	if (f == NULL || req->gen != a->gen) {
		free(req);
		return;
	}
	struct agent_parcel *p = &f->parcels[req->parcel];
	free(req);
	p->sources_pending = false;
	p->sources_ms = now_ms();
	if (ans->status != 200 || trk_sources_parse(ans->json, &s, &n, &err) != 0) {
		LOG_DEBUG("node %s: sources: %s", a->node_id, ans->status != 200 ? ans->error : err.msg);
		return;
	}
	/* Keep what we know of sources still listed (their rest periods and
	 * fabric handles); add new ones. */
	struct agent_source *ns = calloc(n + 1, sizeof(*ns));
	if (ns == NULL) {
		trk_sources_free(s, n);
		return;
	}
	uint32_t *moved = calloc(p->nsrcs + 1, sizeof(*moved)); /* old index -> new + 1 */
	if (moved == NULL) {
		free(ns);
		trk_sources_free(s, n);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		ns[i].info = s[i];
		for (size_t j = 0; j < p->nsrcs; j++) {
			struct agent_source *o = &p->srcs[j];
			if (moved[j] == 0 && o->info.fabric_addr_len == s[i].fabric_addr_len &&
			    memcmp(o->info.fabric_addr, s[i].fabric_addr, s[i].fabric_addr_len) == 0 &&
			    o->info.key == s[i].key && o->info.addr == s[i].addr) {
				struct trk_source info = ns[i].info;
				ns[i] = *o; /* handle, rest period, pacing */
				ns[i].info = info;
				o->fa_valid = false;
				moved[j] = (uint32_t)i + 1;
			}
		}
	}
	/* Reads in flight follow their source to the new list; those whose
	 * source left it no longer name one. */
	for (uint32_t r = 0; r < a->nreads; r++) {
		struct agent_read *rd = &a->reads[r];
		if (rd->in_fabric && rd->gen == a->gen && &f->parcels[rd->parcel] == p &&
		    rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs && moved[rd->src_idx] != 0) {
			rd->src_idx = moved[rd->src_idx] - 1;
			rd->src_epoch = p->src_epoch + 1;
		}
	}
	free(moved);
	p->src_epoch++;
	for (size_t j = 0; j < p->nsrcs; j++) {
		if (p->srcs[j].fa_valid)
			fab_av_remove(a->fab, p->srcs[j].fa);
		free(p->srcs[j].info.fabric_addr);
	}
	free(p->srcs);
	free(s); /* the strings moved into ns */
	p->srcs = ns;
	p->nsrcs = n;
	pump(a);
}

/*
 * Pacing. A source's window is the bytes we keep in flight to it: its
 * measured rate times TESSERA_FETCH_TARGET_MS, at least WINDOW_MIN_CHUNKS
 * chunks (enough to keep a link busy between two completions), at most
 * TESSERA_INFLIGHT chunks. A fixed count of reads per node queued far more
 * than a shared link carries in the stall timeout, and turned congestion
 * into a refetch storm.
 */
static uint64_t source_window(const struct node_agent *a, const struct agent_source *s)
{
	uint64_t lo = (uint64_t)WINDOW_MIN_CHUNKS * a->chunk_size;
	uint64_t hi = PROTO_MAX(lo, (uint64_t)a->max_inflight * a->chunk_size);
	uint64_t w = s->rate == 0 ? lo : s->rate * proto_param(PROTO_PARAM_FETCH_TARGET_MS) / 1000;
	return PROTO_MIN(hi, PROTO_MAX(lo, w));
}

/* How long s may deliver nothing while it has reads in flight: the time
 * its window takes at its measured rate, four times over, and never less
 * than TESSERA_STALL_MS (three times that before it delivered anything). */
static uint64_t source_patience(const struct agent_source *s)
{
	uint64_t stall = proto_param(PROTO_PARAM_STALL_MS);

	if (s->rate == 0)
		return 3 * stall;
	return PROTO_MAX(stall, 4 * s->inflight_bytes * 1000 / s->rate);
}

static bool source_silent(const struct agent_source *s, uint64_t now)
{
	return s->inflight_reads > 0 && now - s->progress_ms >= source_patience(s);
}

/* A source for a read of len bytes of parcel p, round-robin among those
 * resting from no failure, not silent, and with room in their window; NULL
 * when there is none (*none_usable: not even one with a full window). */
static struct agent_source *pick_source(struct node_agent *a, struct agent_parcel *p, uint64_t len,
					bool *none_usable)
{
	uint64_t now = now_ms();

	*none_usable = true;
	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[(p->rr + k) % p->nsrcs];
		if (s->bad_until_ms > now || source_silent(s, now))
			continue;
		*none_usable = false;
		if (s->inflight_reads > 0 && s->inflight_bytes + len > source_window(a, s))
			continue;
		if (!s->fa_valid) {
			if (fab_av_insert(a->fab, s->info.fabric_addr, s->info.fabric_addr_len, &s->fa) != 0) {
				s->bad_until_ms = now + BAD_SOURCE_MS;
				continue;
			}
			s->fa_valid = true;
		}
		p->rr = (uint32_t)((p->rr + k + 1) % p->nsrcs);
		return s;
	}
	return NULL;
}

/* Accounting for a read posted to s. */
static void source_posted(struct agent_source *s, uint64_t len)
{
	uint64_t now = now_ms();

	if (s->inflight_reads == 0) {
		/* Busy from now: silence and rate are measured from here. */
		s->progress_ms = now;
		s->meas_ms = now;
		s->meas_bytes = 0;
		s->silent_logged = false;
	}
	s->inflight_reads++;
	s->inflight_bytes += len;
}

/* Accounting for a read of s that completed (ok: with its bytes). The rate
 * is measured over stretches of at least RATE_SAMPLE_MS while busy, and
 * smoothed (half the old, half the new). */
static void source_done(struct agent_source *s, uint64_t len, bool ok)
{
	uint64_t now = now_ms();

	s->inflight_reads--;
	s->inflight_bytes -= PROTO_MIN(len, s->inflight_bytes);
	if (ok) {
		s->progress_ms = now;
		s->silent_logged = false;
		s->meas_bytes += len;
		if (now - s->meas_ms >= RATE_SAMPLE_MS) {
			uint64_t sample = s->meas_bytes * 1000 / (now - s->meas_ms);
			s->rate = s->rate == 0 ? sample : (s->rate + sample) / 2;
			s->meas_ms = now;
			s->meas_bytes = 0;
		}
	}
}

/* The source a read went to, if the parcel's source list is still the one
 * it was picked from. */
static struct agent_source *read_source(struct agent_fetch *f, const struct agent_read *rd)
{
	struct agent_parcel *p = &f->parcels[rd->parcel];
	return rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs ? &p->srcs[rd->src_idx] : NULL;
}

static void source_failed(struct node_agent *a, struct agent_source *s)
{
	if (s == NULL)
		return;
	s->bad_until_ms = now_ms() + BAD_SOURCE_MS;
	/* tcp;ofi_rxm drops the connection on an error: start afresh. */
	if (s->fa_valid) {
		fab_av_remove(a->fab, s->fa);
		s->fa_valid = false;
	}
}

/* A read completed: failures are retried elsewhere, data goes to a worker
 * to be hashed and scattered (on_verified picks it up). */
static void on_read(struct fab_op *op, int status)
{
	struct agent_read *rd = proto_container_of(op, struct agent_read, op);
	struct node_agent *a = rd->a;
	struct agent_fetch *f = a->fetch;

	a->inflight--;
	rd->in_fabric = false;
	if (f != NULL && rd->gen == a->gen && read_source(f, rd) != NULL)
		source_done(read_source(f, rd), rd->len, status == 0);
	if (rd->abandoned || f == NULL || rd->gen != a->gen) {
		rd->abandoned = false;
		rd->busy = false;
		pump(a);
		return;
	}
	struct agent_parcel *p = &f->parcels[rd->parcel];
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];

	if (status != 0) {
		LOG_DEBUG("node %s: chunk %u/%u of parcel %u<-%u failed: %d", a->node_id, rd->chunk,
			  p->mp->nchunks, p->mp->dst_rank, p->mp->src_rank, status);
		f->read_failures++;
		node_metrics_add(a->am.m, a->am.failed_read, 1);
		rd->busy = false;
		source_failed(a, read_source(f, rd));
		p->state[rd->chunk] = 0;
		p->next_todo = PROTO_MIN(p->next_todo, rd->chunk);
		pump(a);
		return;
	}
	f->last_byte_ms = proto_wall_ms();
	if (f->first_byte_ms == 0)
		f->first_byte_ms = f->last_byte_ms;
	rd->job = (struct node_vjob){
		.buf = a->bounce + (size_t)rd->slot * a->chunk_size,
		.len = c->size,
		.hash = c->hash,
		.plan = f->plan,
		.parcel = p->pp,
		.layout = &a->layout,
		.dst = f->slot->host,
		.off = (uint64_t)rd->chunk * f->man.chunk_size,
	};
	node_verifier_submit(a->ver, &rd->job);
	pump(a);
}

static void on_verified(struct node_vjob *job, void *arg)
{
	struct agent_read *rd = proto_container_of(job, struct agent_read, job);
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;

	rd->busy = false;
	if (f == NULL || rd->gen != a->gen) {
		pump(a);
		return;
	}
	struct agent_parcel *p = &f->parcels[rd->parcel];
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];
	if (!job->ok) {
		/* Never trust the bytes: discard, set the source aside, refetch. */
		proto_log(f->bad_chunks++ == 0 ? PROTO_LOG_WARN : PROTO_LOG_DEBUG, __FILE__, __LINE__,
			  "node %s: v%" PRIu64 " chunk %u of parcel %u<-%u from %s failed its hash; "
			  "discarded (further ones are counted)",
			  a->node_id, f->version, rd->chunk, p->mp->dst_rank, p->mp->src_rank,
			  read_source(f, rd) ? read_source(f, rd)->info.id : "?");
		node_metrics_add(a->am.m, a->am.failed_hash, 1);
		source_failed(a, read_source(f, rd));
		p->state[rd->chunk] = 0;
		p->next_todo = PROTO_MIN(p->next_todo, rd->chunk);
		pump(a);
		return;
	}
	node_metrics_add(a->am.m, rd->src_peer ? a->am.fetched_peer : a->am.fetched_trainer, c->size);
	p->state[rd->chunk] = 2;
	p->done++;
	f->bytes_done += c->size;
	if (rd->src_peer)
		f->from_peers += c->size;
	else
		f->from_trainer += c->size;
	if (f->bytes_done == f->bytes_total) {
		all_verified(a);
		return;
	}
	pump(a);
}

static int free_read_slot(struct node_agent *a)
{
	for (uint32_t i = 0; i < a->nreads; i++)
		if (!a->reads[i].busy)
			return (int)i;
	return -1;
}

/* Takes n bytes from the rate bucket; when it is short, arms a timer for
 * when it will have them and says no. */
static bool take_tokens(struct node_agent *a, uint64_t n)
{
	uint64_t now = proto_now_ns(), burst = PROTO_MAX(a->chunk_size, a->rate_bps / 10);

	if (a->rate_bps == 0)
		return true;
	a->tokens = PROTO_MIN(burst, a->tokens + (now - a->tokens_ns) * a->rate_bps / 1000000000ull);
	a->tokens_ns = now;
	if (a->tokens >= n) {
		a->tokens -= n;
		return true;
	}
	if (!evtimer_pending(a->rate_ev, NULL))
		arm(a->rate_ev, (n - a->tokens) * 1000 / a->rate_bps + 1);
	return false;
}

static void give_tokens(struct node_agent *a, uint64_t n)
{
	if (a->rate_bps != 0)
		a->tokens += n;
}

static void on_rate(evutil_socket_t fd, short what, void *arg)
{
	pump(arg);
}

/* Posts reads until every source's window is full, the node's reads are
 * all out, or nothing can be fetched now. */
static void pump(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	if (f == NULL || f->verified || f->parcels == NULL)
		return;
	for (uint32_t pi = 0; pi < f->nparcels && a->inflight < a->max_inflight; pi++) {
		struct agent_parcel *p = &f->parcels[pi];
		while (p->done < p->mp->nchunks && a->inflight < a->max_inflight) {
			while (p->next_todo < p->mp->nchunks && p->state[p->next_todo] != 0)
				p->next_todo++;
			if (p->next_todo >= p->mp->nchunks)
				break;
			uint32_t c = p->next_todo, len = p->mp->chunks[c].size;
			bool none_usable;
			struct agent_source *s = pick_source(a, p, len, &none_usable);
			if (s == NULL) {
				if (none_usable)
					want_sources(a, pi);
				break;
			}
			int slot = free_read_slot(a);
			if (slot < 0 || !take_tokens(a, len))
				return;
			struct agent_read *rd = &a->reads[slot];
			struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
			*rd = (struct agent_read){.a = a, .parcel = pi, .chunk = c, .slot = (uint32_t)slot,
						  .len = len, .src_idx = (uint32_t)(s - p->srcs),
						  .src_epoch = p->src_epoch, .src_peer = s->info.peer,
						  .started_ms = now_ms(), .busy = true, .in_fabric = true,
						  .gen = a->gen};
			int rc = fab_read(a->fab, &rd->op, a->bounce_mr, (size_t)slot * a->chunk_size, len,
					  s->fa, &rk, (uint64_t)c * f->man.chunk_size, on_read);
			if (rc != 0) {
				rd->busy = false;
				rd->in_fabric = false;
				give_tokens(a, len);
				LOG_DEBUG("node %s: read post failed: %d", a->node_id, rc);
				source_failed(a, s);
				continue;
			}
			source_posted(s, len);
			if (p->asked[c])
				f->refetched += len;
			p->asked[c] = 1;
			a->inflight++;
			p->state[c] = 1;
		}
	}
	node_fabloop_kick(a->fl);
}

/*
 * A source is silent when none of its reads completed for its patience
 * (source_patience: four times what its window takes at its measured
 * rate). Flows on a busy shared link take turns, so the age of one read
 * says nothing; a source that delivers is never given up on. A silent
 * source's reads move to another source of the parcel only when there is
 * one (resting from no failure, not silent itself): the source rests and
 * its reads are abandoned (their slots stay reserved until they complete
 * or the endpoint closes). With nowhere else to go they stay where they
 * are, since asking the same source again only queues the same bytes
 * twice; the tracker is asked for sources meanwhile.
 */
static bool other_source(const struct agent_parcel *p, const struct agent_source *s, uint64_t now)
{
	for (size_t k = 0; k < p->nsrcs; k++)
		if (&p->srcs[k] != s && p->srcs[k].bad_until_ms <= now && !source_silent(&p->srcs[k], now))
			return true;
	return false;
}

static void check_silent(struct node_agent *a, struct agent_fetch *f, uint32_t pi, uint64_t now)
{
	struct agent_parcel *p = &f->parcels[pi];

	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[k];
		uint32_t live = 0;
		if (!source_silent(s, now))
			continue;
		for (uint32_t i = 0; i < a->nreads; i++) {
			const struct agent_read *rd = &a->reads[i];
			live += rd->in_fabric && !rd->abandoned && rd->gen == a->gen && rd->parcel == pi &&
				read_source(f, rd) == s;
		}
		if (live == 0) /* only reads already moved elsewhere */
			continue;
		if (!other_source(p, s, now)) {
			if (!s->silent_logged)
				LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
					 " ms; no other source, waiting for it",
					 a->node_id, pi, s->info.id, now - s->progress_ms);
			s->silent_logged = true;
			want_sources(a, pi);
			continue;
		}
		LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
			 " ms; moving its %u reads elsewhere",
			 a->node_id, pi, s->info.id, now - s->progress_ms, live);
		f->stalls += live;
		node_metrics_add(a->am.m, a->am.stalled, live);
		for (uint32_t i = 0; i < a->nreads; i++) {
			struct agent_read *rd = &a->reads[i];
			if (!rd->in_fabric || rd->abandoned || rd->gen != a->gen || rd->parcel != pi ||
			    read_source(f, rd) != s)
				continue;
			rd->abandoned = true;
			p->state[rd->chunk] = 0;
			p->next_todo = PROTO_MIN(p->next_todo, rd->chunk);
		}
		s->bad_until_ms = now + BAD_SOURCE_MS;
	}
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	uint64_t now = now_ms();

	if (f == NULL || f->parcels == NULL)
		return;
	if (!f->verified)
		for (uint32_t pi = 0; pi < f->nparcels; pi++)
			check_silent(a, f, pi, now);
	if (f->verified && !f->reported_verified) {
		f->reported_verified = true;
		report(a, f->version, TRK_STATE_VERIFIED, NULL, on_verified_report);
	} else if (!f->verified && now - a->last_report_ms >= REPORT_MS) {
		a->last_report_ms = now;
		report(a, f->version, TRK_STATE_FETCHING, NULL, NULL);
	}
	pump(a);
}

/* ---- metadata: manifest, parent, trainer layout, plan ------------------- */

static int setup_parcels(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	const struct proto_mlayout *ml = f->ml;
	struct proto_err err;
	uint32_t mine = 0;

	for (uint32_t i = 0; i < ml->nparcels; i++)
		mine += ml->parcels[i].dst_rank == a->o.rank;
	f->parcels = calloc(mine + 1, sizeof(*f->parcels));
	if (f->parcels == NULL)
		return -ENOMEM;
	/* Every parcel the plan owes this rank must be in the manifest, with
	 * the plan's size, and nothing else. */
	uint32_t planned = 0;
	for (uint32_t i = 0; i < f->plan->nparcels; i++)
		planned += f->plan->parcels[i].dst_rank == a->o.rank;
	if (planned != mine) {
		fetch_fail(a, "manifest lists %u parcels for rank %u, the plan %u", mine, a->o.rank, planned);
		return -EBADMSG;
	}
	for (uint32_t i = 0; i < ml->nparcels; i++) {
		const struct proto_mparcel *mp = &ml->parcels[i];
		if (mp->dst_rank != a->o.rank)
			continue;
		const struct proto_parcel *pp = proto_plan_parcel(f->plan, mp->src_rank, mp->dst_rank);
		if (pp == NULL || pp->bytes != mp->bytes || mp->encoding != PROTO_ENC_RAW ||
		    mp->wire_bytes != mp->bytes) {
			fetch_fail(a, "parcel %u<-%u does not match the plan", mp->dst_rank, mp->src_rank);
			return -EBADMSG;
		}
		struct agent_parcel *p = &f->parcels[f->nparcels++];
		p->mp = mp;
		p->pp = pp;
		p->state = calloc(mp->nchunks + 1, 1);
		p->asked = calloc(mp->nchunks + 1, 1);
		if (p->state == NULL || p->asked == NULL)
			return -ENOMEM;
		f->bytes_total += mp->bytes;
	}
	if (node_slot_new(&a->store, f->version, a->layout.ranks[a->o.rank].nbytes, &f->slot, &err) != 0) {
		fetch_fail(a, "%s", err.msg);
		return -ENOMEM;
	}
	LOG_INFO("node %s: fetching v%" PRIu64 ": %u parcels, %" PRIu64 " bytes", a->node_id,
		 f->version, f->nparcels, f->bytes_total);
	if (f->bytes_total == 0) {
		all_verified(a);
		return 0;
	}
	for (uint32_t i = 0; i < f->nparcels; i++)
		want_sources(a, i);
	return 0;
}

/* The plan is known: check it is the one the manifest signed, then fetch. */
static void with_plan(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	f->plan = &a->plan;
	if (sodium_memcmp(a->plan.digest, f->ml->plan_digest, PROTO_HASH_BYTES) != 0) {
		fetch_fail(a, "our plan differs from the one the manifest signed");
		return;
	}
	if (setup_parcels(a) == -ENOMEM && a->fetch != NULL)
		fetch_fail(a, "out of memory");
	else
		pump(a);
}

static void on_layouts(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	struct proto_layout tl;
	struct proto_err err;
	int rc;

	if (f == NULL)
		return;
	if (ans->status != 200) {
		fetch_fail(a, "cannot read the trainer layout: %s", ans->error);
		return;
	}
	rc = proto_layout_from_json(&a->model, json_object_get(ans->json, "trainer_layout"),
				    "trainer layout", &tl, &err);
	if (rc != 0) {
		fetch_fail(a, "%s", err.msg);
		return;
	}
	/* The tracker is not trusted: the signed manifest names the layout. */
	if (sodium_memcmp(tl.digest, f->man.src_layout_digest, PROTO_HASH_BYTES) != 0) {
		proto_layout_fini(&tl);
		fetch_fail(a, "the trainer layout does not match the manifest's digest");
		return;
	}
	/* No fetch is using the old plan now (one fetch at a time). */
	if (a->have_plan)
		proto_plan_fini(&a->plan);
	a->have_plan = false;
	rc = proto_plan_build(&a->model, &tl, &a->layout, &a->plan, &err);
	proto_layout_fini(&tl);
	if (rc != 0) {
		fetch_fail(a, "%s", err.msg);
		return;
	}
	a->have_plan = true;
	memcpy(a->plan_src, f->man.src_layout_digest, PROTO_HASH_BYTES);
	with_plan(a);
}

/* The manifest is signed and its parent link checked. */
static void with_manifest(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	a->last_version = f->man.version;
	memcpy(a->last_digest, f->man.digest, PROTO_HASH_BYTES);

	f->ml = proto_manifest_layout(&f->man, a->layout.digest);
	if (f->ml == NULL) {
		/* Published before our layout registered: wait for the next. The
		 * tracker hears it, so the replica's target moves past it. */
		LOG_INFO("node %s: v%" PRIu64 " has no parcels for our layout; waiting for a newer version",
			 a->node_id, f->version);
		report(a, f->version, TRK_STATE_FAILED,
		       "no parcels for our layout (published before it registered)", NULL);
		a->failed = f->version;
		a->failed_ms = now_ms();
		fetch_drop(a);
		return;
	}
	/* The same trainer layout as last time: the plan is already here. */
	if (a->have_plan && sodium_memcmp(a->plan_src, f->man.src_layout_digest, PROTO_HASH_BYTES) == 0) {
		with_plan(a);
		return;
	}
	if (trk_client_layouts(a->trk, on_layouts, a) != 0)
		fetch_fail(a, "cannot ask for the trainer layout");
}

static void on_parent(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	struct proto_manifest pm;
	struct proto_err err;

	if (f == NULL)
		return;
	if (ans->status != 200) {
		fetch_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &pm, &err) != 0) {
		fetch_fail(a, "parent v%" PRIu64 ": %s", f->man.parent_version, err.msg);
		return;
	}
	bool ok = pm.version == f->man.parent_version &&
		  sodium_memcmp(pm.digest, f->man.parent_digest, PROTO_HASH_BYTES) == 0;
	proto_manifest_fini(&pm);
	if (!ok) {
		fetch_fail(a, "broken parent chain: v%" PRIu64 " is not the parent it names",
			   f->man.parent_version);
		return;
	}
	with_manifest(a);
}

static void on_manifest(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	struct proto_err err;

	if (f == NULL)
		return;
	if (ans->status != 200) {
		fetch_fail(a, "manifest: %s", ans->error);
		return;
	}
	if (proto_manifest_decode(ans->body, ans->len, a->trainer_pk, &f->man, &err) != 0) {
		fetch_fail(a, "%s", err.msg);
		return;
	}
	f->have_man = true;
	if (f->man.version != f->version) {
		fetch_fail(a, "the tracker sent the manifest of v%" PRIu64, f->man.version);
		return;
	}
	if (sodium_memcmp(f->man.model_digest, a->model.digest, PROTO_HASH_BYTES) != 0) {
		fetch_fail(a, "the manifest is for another model");
		return;
	}
	if (f->man.chunk_size > a->chunk_size) {
		fetch_fail(a, "chunk size %u exceeds ours (%u)", f->man.chunk_size, a->chunk_size);
		return;
	}
	/* The parent link: checked against the manifest we accepted last when
	 * it is the parent, else against the parent's own signed manifest. */
	if (f->man.parent_version == 0) {
		with_manifest(a);
	} else if (a->last_version == f->man.parent_version) {
		if (sodium_memcmp(a->last_digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
			fetch_fail(a, "broken parent chain: parent digest differs from v%" PRIu64 "'s",
				   a->last_version);
			return;
		}
		with_manifest(a);
	} else if (trk_client_get_manifest(a->trk, f->man.parent_version, on_parent, a) != 0) {
		fetch_fail(a, "cannot fetch the parent manifest");
	}
}

static void start_fetch(struct node_agent *a, uint64_t v)
{
	struct agent_fetch *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return;
	f->version = v;
	f->started_ms = now_ms();
	a->fetch = f;
	a->gen++;
	report(a, v, TRK_STATE_FETCHING, NULL, NULL);
	if (trk_client_get_manifest(a->trk, v, on_manifest, a) != 0)
		fetch_fail(a, "cannot ask for the manifest");
}

/* ---- watching ------------------------------------------------------------ */

static void on_watch(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct trk_version_info *vs = NULL;
	struct proto_err err;
	uint64_t latest = 0;
	size_t n = 0;

	a->watching = false;
	if (ans->status == 200 && trk_versions_parse(ans->json, &latest, &vs, &n, &err) == 0) {
		free(vs);
		a->seen = PROTO_MAX(a->seen, latest);
		node_wait_over(&a->wait, "tracker");
	} else {
		LOG_DEBUG("node %s: watch: %s", a->node_id, ans->status == 200 ? err.msg : ans->error);
		node_wait_note(&a->wait, now_ms(), a->node_id, "tracker", "the tracker at %s (%s)",
			       a->o.tracker_url, ans->status == 200 ? err.msg : ans->error);
		arm(a->retry_ev, RETRY_MS);
		return;
	}
	if (a->seen == 0)
		node_wait_note(&a->wait, now_ms(), a->node_id, "version",
			       "a first version (registered; the tracker has none yet)");
	else
		node_wait_over(&a->wait, "version");
	/* A new version may move the replica's target: ask now. */
	sync_now(a);
	start_watch(a);
}

static void start_watch(struct node_agent *a)
{
	if (!a->registered || a->watching)
		return;
	if (trk_client_watch(a->trk, a->seen, (uint32_t)proto_param(PROTO_PARAM_WATCH_MS), on_watch,
			     a) != 0)
		arm(a->retry_ev, RETRY_MS);
	else
		a->watching = true;
}

/* ---- registration and lease --------------------------------------------- */

static void on_heartbeat(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;

	if (ans->status == 404) {
		/* Expired or the tracker restarted: register again. */
		LOG_WARN("node %s: lease lost; registering again", a->node_id);
		a->registered = false;
		node_metrics_set(a->am.m, a->am.registered, 0);
		node_metrics_set_health(a->am.m, false, "lease lost; registering again");
		start_register(a);
		return;
	}
	arm(a->heartbeat_ev, PROTO_MAX(a->lease_ms / 3, 100));
}

static void heartbeat(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	if (trk_client_heartbeat(a->trk, a->node_id, on_heartbeat, a) != 0)
		arm(a->heartbeat_ev, PROTO_MAX(a->lease_ms / 3, 100));
}

static void on_register(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	const char *id;

	if (ans->status == 200 || ans->status == 201) {
		id = json_string_value(json_object_get(ans->json, "node_id"));
		snprintf(a->node_id, sizeof(a->node_id), "%s", id ? id : a->node_id);
		a->lease_ms = (uint64_t)json_integer_value(json_object_get(ans->json, "lease_ms"));
		if (a->lease_ms == 0)
			a->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
		a->registered = true;
		node_metrics_set(a->am.m, a->am.registered, 1);
		node_metrics_set_health(a->am.m, true, NULL);
		node_wait_over(&a->wait, "tracker");
		LOG_INFO("node %s: registered (lease %" PRIu64 " ms)", a->node_id, a->lease_ms);
		arm(a->heartbeat_ev, PROTO_MAX(a->lease_ms / 3, 100));
		/* What we hold is still good: say so again after a re-register. */
		if (a->active != NULL)
			report(a, a->active->version, TRK_STATE_ACTIVE, NULL, NULL);
		/* The tracker forgot our reports: a verified fetch says so again. */
		if (a->fetch != NULL)
			a->fetch->reported_verified = false;
		start_watch(a);
		if (!evtimer_pending(a->sync_ev, NULL))
			arm(a->sync_ev, 0);
		return;
	}
	if (ans->status == 400 || ans->status == 401 || ans->status == 403) {
		char why[600];
		snprintf(why, sizeof(why), "registration refused: %s", ans->error);
		give_up(a, why);
		return;
	}
	/* 409 (no model yet) or the tracker is not up: try again. */
	LOG_DEBUG("node %s: registration: %d %s; retrying", a->node_id, ans->status, ans->error);
	if (ans->status <= 0)
		node_wait_note(&a->wait, now_ms(), a->node_id, "tracker", "the tracker at %s (%s)",
			       a->o.tracker_url, ans->error);
	else
		node_wait_note(&a->wait, now_ms(), a->node_id, "tracker",
			       "the tracker to accept our registration (%s)", ans->error);
	arm(a->retry_ev, RETRY_MS);
}

static void start_register(struct node_agent *a)
{
	struct trk_node_reg r = {
		.replica = a->o.replica,
		.addr = {.rank = a->o.rank, .host = a->host, .provider = fab_provider(a->fab),
			 .fabric_addr = a->fabric_hex},
		.layout = a->layout_json,
		.model_digest = a->model.digest,
		.layout_name = a->layout_name[0] ? a->layout_name : NULL,
		.layout_digest = a->layout.digest,
	};
	if (trk_client_register_node(a->trk, &r, on_register, a) != 0)
		arm(a->retry_ev, RETRY_MS);
}

static void on_retry(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	if (!a->registered)
		start_register(a);
	else
		start_watch(a);
}

/* ---- setup and teardown ------------------------------------------------- */

/* The name the status page shows for our layout: a built-in's own ("tp2"),
 * a file's name without directory and .json; "" when it has other
 * characters than the tracker takes ([A-Za-z0-9._-]). */
static void layout_name(const char *arg, char *out, size_t len)
{
	const char *base = strrchr(arg, '/');
	size_t n;

	base = base ? base + 1 : arg;
	n = strlen(base);
	if (n > 5 && strcmp(base + n - 5, ".json") == 0)
		n -= 5;
	out[0] = 0;
	if (n == 0 || n >= len)
		return;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)base[i]) && base[i] != '-' && base[i] != '_' &&
		    base[i] != '.')
			return;
	memcpy(out, base, n);
	out[n] = 0;
}

static int load_layout(struct node_agent *a, struct proto_err *err)
{
	const char *s = a->o.layout;
	int rc = proto_layout_open(&a->model, s, &a->layout, err);
	if (rc != 0)
		return rc;
	if (a->o.rank >= a->layout.nranks)
		return proto_errf(err, EINVAL, "rank %u: layout %s has %u ranks", a->o.rank, s,
				  a->layout.nranks);
	a->layout_json = proto_layout_to_json(&a->model, &a->layout);
	layout_name(s, a->layout_name, sizeof(a->layout_name));
	return a->layout_json ? 0 : proto_errf(err, ENOMEM, "out of memory");
}

int node_agent_new(struct event_base *base, const struct node_agent_opts *o,
		   struct node_agent **out, struct proto_err *err)
{
	struct node_agent *a = calloc(1, sizeof(*a));
	uint8_t ckey[PROTO_CLUSTER_KEY_BYTES], addr[FAB_ADDR_MAX];
	size_t alen;
	int rc;

	*out = NULL;
	if (a == NULL || sodium_init() < 0)
		return proto_errf(err, ENOMEM, "out of memory");
	a->o = *o;
	a->base = base;
	proto_model_init(&a->model);
	if ((rc = node_agent_metrics_init(&a->am, o->metrics)) != 0) {
		proto_errf(err, -rc, "metrics: cannot register the node's series");
		goto fail;
	}
	snprintf(a->node_id, sizeof(a->node_id), "%s/%u", o->replica, o->rank);
	if (o->host != NULL)
		snprintf(a->host, sizeof(a->host), "%s", o->host);
	else if (gethostname(a->host, sizeof(a->host)) != 0)
		snprintf(a->host, sizeof(a->host), "unknown");
	rc = proto_model_load(o->model, &a->model, err);
	if (rc == 0)
		rc = load_layout(a, err);
	if (rc == 0)
		rc = proto_key_load_public(o->trainer_pubkey, a->trainer_pk, err);
	if (rc == 0 && o->cluster_key != NULL)
		rc = proto_key_load_cluster(o->cluster_key, ckey, err);
	if (rc == 0)
		rc = node_store_open(o->store ? o->store : "auto", &a->store, err);
	if (rc != 0)
		goto fail;
	rc = trk_client_new(base, o->tracker_url, o->cluster_key ? ckey : NULL, &a->trk, err);
	sodium_memzero(ckey, sizeof(ckey));
	if (rc != 0)
		goto fail;
	trk_client_on_chain_lost(a->trk, on_chain_lost, a);
	rc = fab_open(o->provider, NULL, &(struct fab_opts){.sink = FAB_SINK_DEFAULT},
		      &a->fab, err); /* a node takes no messages: drop strangers' */
	if (rc != 0)
		goto fail;
	rc = fab_getname(a->fab, addr, sizeof(addr), &alen);
	if (rc != 0) {
		proto_errf(err, -rc, "fabric: cannot read our address");
		goto fail;
	}
	sodium_bin2hex(a->fabric_hex, sizeof(a->fabric_hex), addr, alen);
	/* Read slots: twice the reads in flight, so reads moved off a silent
	 * source can keep their slots while replacements go out. */
	a->chunk_size = (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_CHUNK_SIZE), PROTO_CHUNK_SIZE_MAX);
	a->max_inflight = (uint32_t)PROTO_MAX(1, PROTO_MIN(proto_param(PROTO_PARAM_INFLIGHT), 256));
	a->nreads = 2 * a->max_inflight;
	a->reads = calloc(a->nreads, sizeof(*a->reads));
	/* Read buffers are reused for every chunk: map them populated. */
	a->bounce_len = ((size_t)a->nreads * a->chunk_size + 4095) / 4096 * 4096;
	a->bounce = mmap(NULL, a->bounce_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (a->bounce == MAP_FAILED)
		a->bounce = NULL;
	if (a->reads == NULL || a->bounce == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory for %u read buffers", a->nreads);
		goto fail;
	}
	rc = fab_mr_reg(a->fab, a->bounce, (size_t)a->nreads * a->chunk_size, FAB_MR_READ,
			&a->bounce_mr);
	if (rc != 0) {
		proto_errf(err, -rc, "fabric: cannot register read buffers");
		goto fail;
	}
	a->fl = node_fabloop_new(base, a->fab, 1000);
	a->ver = node_verifier_new(base, (unsigned)proto_param(PROTO_PARAM_VERIFY_THREADS),
				   on_verified, a);
	a->rate_bps = proto_param(PROTO_PARAM_FETCH_MBPS) * 1000000ull / 8;
	a->rate_ev = evtimer_new(base, on_rate, a);
	a->retry_ev = evtimer_new(base, on_retry, a);
	a->heartbeat_ev = evtimer_new(base, heartbeat, a);
	a->sync_ev = evtimer_new(base, on_sync_timer, a);
	a->tick_ev = event_new(base, -1, EV_PERSIST, on_tick, a);
	if (a->fl == NULL || a->ver == NULL || a->rate_ev == NULL || a->retry_ev == NULL || a->heartbeat_ev == NULL ||
	    a->sync_ev == NULL || a->tick_ev == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	if (o->expose_dir != NULL) {
		struct proto_err xerr;
		/* Not fatal: activation reports the failure until it works. */
		if (proto_mkdir_p(o->expose_dir, &xerr) != 0)
			LOG_WARN("node %s: --expose: %s", a->node_id, xerr.msg);
	}
	if (o->attach_path != NULL) {
		struct node_attach_info ai = {
			.replica = o->replica,
			.rank = o->rank,
			.spec = &a->layout.ranks[o->rank],
			.layout_digest = a->layout.digest,
			.store = &a->store,
		};
		if ((rc = node_attach_new(base, o->attach_path, &ai, &a->attach, err)) != 0)
			goto fail;
	}
	struct timeval tick = {0, 100000};
	event_add(a->tick_ev, &tick);
	start_register(a);
	*out = a;
	return 0;
fail:
	node_agent_free(a);
	return rc;
}

int node_agent_failed(const struct node_agent *a, struct proto_err *err)
{
	if (a->fatal && err != NULL)
		*err = a->fatal_err;
	return a->fatal;
}

uint64_t node_agent_active(const struct node_agent *a)
{
	return a->active ? a->active->version : 0;
}

void node_agent_free(struct node_agent *a)
{
	if (a == NULL)
		return;
	/* Reverse order: timers, the fetch, fabric (cancels reads), then the
	 * memory reads could land in, the tracker client, the specs. */
	if (a->tick_ev)
		event_free(a->tick_ev);
	if (a->sync_ev)
		event_free(a->sync_ev);
	if (a->heartbeat_ev)
		event_free(a->heartbeat_ev);
	if (a->retry_ev)
		event_free(a->retry_ev);
	if (a->rate_ev)
		event_free(a->rate_ev);
	node_fabloop_free(a->fl);
	struct agent_fetch *f = a->fetch;
	a->fetch = NULL;
	fab_close(a->fab); /* read callbacks see no fetch and return */
	a->fab = NULL;
	node_verifier_free(a->ver); /* no worker touches the fetch after this */
	a->ver = NULL;
	fetch_free(a, f);
	if (a->bounce != NULL)
		munmap(a->bounce, a->bounce_len);
	free(a->reads);
	node_attach_free(a->attach); /* frees the slots only requests kept */
	if (a->active != NULL)
		node_slot_free(&a->store, a->active);
	trk_client_free(a->trk);
	if (a->have_plan)
		proto_plan_fini(&a->plan);
	json_decref(a->layout_json);
	proto_layout_fini(&a->layout);
	proto_model_fini(&a->model);
	free(a);
}
