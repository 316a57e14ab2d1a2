/* Internals shared by the publisher's files: its objects and each file's functions. */
#ifndef NODE_PUB_INTERNAL_H
#define NODE_PUB_INTERNAL_H

/*
 * The publisher is one object (struct node_pub) whose state the loop owns;
 * its files split the work by noun, callers above callees:
 *   publisher.c    the object: new/free, the export queue, tracker
 *                  registration, heartbeats and the version resync;
 *   pub_export.c   exporting one version: the state machine from the
 *                  tracker's layouts to the offer (publish or verify);
 *   pub_offer.c    what the tracker is offered and withdrawn, and the
 *                  retention check that decides it;
 *   pub_job.c      the export's workers: one job per trainer rank on the
 *                  worker pool (snapshot, gather and hash, delta encode);
 *   pub_manifest.c the manifest (and each addendum's layout) from the
 *                  parts' chunk hashes; a rebuild checked against it;
 *   pub_addendum.c a served version extended by signed addenda for a
 *                  layout registered after it was published;
 *   pub_restore.c  a rank's memory rebuilt from the parcels it served;
 *   pub_delta.c    delta versions: the parent export, when to send an
 *                  anchor, encoding each parcel, laying the deltas out;
 *   pub_report.c   what a version's export cost, phase by phase;
 *   pub_canary.c   the expected canary scores of a version;
 *   pub_serve.c    served versions: their regions, offers list, freeing;
 *   pub_part.c     a rank's part of a version: its parcels, where each
 *                  lies in the export buffer, the buffer;
 *   pub_prefault.c pages touched ahead by a worker, off the critical path;
 *   pub_source.c   where a version's bytes come from (fixture or model dir);
 *   pub_trainer.c  the trainer source: a shared buffer per trainer rank;
 *   pub_layout.c   the serving layouts and their plans, cached by digest;
 *   pub_quant.c    FP8 serving layouts: the quantized source their plans
 *                  read, filled from the snapshots once per version;
 *   pub_wait.c     why an export is not done yet, for whoever waits on it.
 * pub_control.c (the control socket) and pub_metrics.c (its series) sit
 * on the face, publisher.h, as any caller does. Everything here is for
 * these files only. Design notes: NOTES.md.
 */

#include <event2/event.h>
#include <jansson.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fabric/fab.h"
#include "node/base/fabloop.h"
#include "node/base/needsfix.h"
#include "node/serve/serve.h"
#include "node/publisher/publisher.h"
#include "proto/proto.h"
#include "proto/checkpoint.h"
#include "proto/delta.h"
#include "proto/pool.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"

#define PUB_ALIGN 4096u           /* parcels start page-aligned in a buffer */
#define RETRY_MS 500              /* tracker unreachable: try again */

/*
 * The quantized source of FP8 serving layouts whose model has this digest
 * (pub_quant.c): one rank holding every tensor whole, the quantized ones
 * as FP8 with their scales (proto_layout_fp8_source), filled from every
 * trainer rank's snapshot once per version, on the gather's threads. Its
 * plans' parcels all come from trainer rank 0's part. Two blocks take
 * turns: the one kept with the parent export (deltas read it) and the one
 * a version is quantized into.
 */
struct pub_q {
	uint8_t digest[PROTO_HASH_BYTES]; /* its model's */
	struct proto_layout src;
	uint8_t *blk[2];
	size_t cap;
	uint64_t ver[2]; /* the version each block holds, 0: none */
	struct proto_fp8_scratch scratch; /* a tensor gathered whole, kept */
	const void *made_by; /* the job that made the last (compared, never read) */
	struct pub_q *next;
};

/* A serving layout and the plan trainer layout -> it, by digest. A layout
 * that failed to parse or plan stays cached as bad (warned about once).
 * An FP8 layout's plan is made from its quantized source (q) instead. */
struct pub_layout {
	uint8_t digest[PROTO_HASH_BYTES];
	bool bad;
	struct proto_layout layout;
	struct proto_plan plan;
	const struct proto_layout *src; /* the plan's source: &p->tl or &q->src */
	struct pub_q *q;                /* NULL: not transformed */
	struct pub_layout *next;
};

/* One parcel a rank gathers into its export buffer. */
struct pub_item {
	const struct pub_layout *sl;
	const struct proto_parcel *pc;
	/* Its source rank's memory: the rank's snapshot, or an FP8 layout's
	 * quantized block (set by the job before it reads). */
	const uint8_t *block;
	uint32_t li, pi; /* layout index in the export, parcel index in its plan */
	uint64_t off;    /* in the rank's export buffer */
	uint32_t nchunks;
	uint8_t (*hash)[PROTO_HASH_BYTES]; /* nchunks hashes, filled by a worker */
	/* Deltas (pub_delta.c): */
	uint64_t wire;          /* bytes served: pc->bytes, or the delta's */
	/* The parent's snapshot of this parcel's source rank (owned by the
	 * parent export), or NULL: the parcel has no parent. */
	const uint8_t *parent;
	uint64_t parent_canary; /* the parent parcel's canary part (with parent) */
	/* The parent's piece checksums from the encode that made it, or NULL
	 * (summed again); owned by the parent export. */
	const uint64_t *parent_sums;
	uint64_t *sums; /* this payload's piece checksums (encoder), or NULL */
	uint8_t *enc;           /* the encoded delta (worker), until placed */
	uint64_t changed;       /* elements the delta changes */
	uint64_t elems;         /* elements of the parcel (its delta's pieces) */
	uint64_t changed_scales, scale_elems; /* of those, an FP8 layout's scales */
	/* The bytes its encode read where they lie, not gathered (a dense
	 * chunk's parent, read again for its checksum, counts twice). */
	uint64_t in_place;
	int enc_rc;             /* the encoder's result */
	bool dense;             /* changed too much to encode (encoding stopped) */
	/* Its encode stopped (or was not begun) because the version's delta
	 * passed its budget (pub_export.budget), here or in another parcel. */
	bool stopped;
	/* The parcel's part of its destination rank's canary score
	 * (proto/canary.h), from its raw payload (worker; a delta's from its
	 * encoder's changes). */
	uint64_t canary;
};

/* One serving layout's parcels in a part's export buffer: contiguous and
 * page-aligned, registered on their own so that the layout can be withdrawn
 * and its pages freed while the version's other layouts go on serving. */
struct pub_slice {
	uint64_t off, len; /* in the buffer; len is page-rounded, 0: no parcel */
	struct fab_mr *mr;
};

/* One rank's part of one version: its export buffer and what is in it. */
struct pub_part {
	uint32_t rank;
	bool hosted;
	uint8_t *buf; /* mmap'ed, cap bytes */
	size_t cap;
	uint64_t used;
	struct pub_slice *slices; /* one per layout of the version */
	size_t nslices;
	struct pub_item *items;
	size_t nitems;
};

/* Where one layout of a served version stands. A layout no replica of it
 * aims at (and not the newest version's) is dropped: its offers are
 * withdrawn, then its slices' regions closed and their pages freed. */
enum pub_lstate {
	PUB_L_SERVED,
	PUB_L_DROP,     /* to withdraw with the next offer */
	PUB_L_WITHDRAW, /* left out of the offer in flight */
	PUB_L_FREED,
};

struct pub_vlayout {
	uint8_t digest[PROTO_HASH_BYTES];
	enum pub_lstate state;
};

/* A version being served (or being built by the current export). */
struct pub_version {
	struct node_pub *p;
	uint64_t version, created_ms;
	uint64_t snapshot_ms; /* wall clock when the snapshot was complete */
	/* What its export cost, phase by phase, up to its offer (a leader's
	 * fresh export): sent with the offer, for the version's timeline. */
	struct trk_publish_report report;
	bool has_report;
	struct pub_part *parts;
	size_t nparts;
	struct pub_vlayout *layouts; /* the export's layouts, in its order */
	size_t nlayouts;
	struct trk_offer *offers;
	uint32_t *offer_li; /* per offer: its layout's index */
	size_t noffers;
	size_t nsent;       /* parcels in the last offer sent */
	struct node_serve_offer so; /* the offer at the tracker (node/serve/serve.h) */
	bool delta;       /* published as a delta (else an anchor) */
	bool releasing;   /* no longer needed: withdraw, then free */
	bool wanted;      /* the tracker's last answer listed it as retained */
	struct pub_version *next;
};

struct pub_req {
	node_pub_cb cb;
	node_pub_snap_cb on_snap; /* NULL: not asked for */
	void *arg;
	uint64_t created_ms, t0_ns;
	struct pub_req *next;
};

/* The last published version by rank: its snapshot of the rank's memory,
 * which the next export's deltas are encoded against (pub_delta.c),
 * and what its parcels' encodes left for the next one. Owns its blocks. */
struct pub_pitem {
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t src, dst;
	uint64_t bytes;
	uint64_t canary; /* its canary part: the child's is updated from it */
	uint64_t *sums;  /* its piece checksums, from its encode, or NULL */
};

struct pub_praw {
	uint32_t rank;
	uint8_t *block; /* the rank's snapshot, cap bytes (node_serve_map) */
	size_t cap;
	struct pub_pitem *items;
	size_t nitems;
};

struct pub_parent {
	uint64_t version;
	uint8_t digest[PROTO_HASH_BYTES]; /* its manifest's */
	uint32_t since_anchor;
	/* The anchor's raw bytes and the wire bytes of the deltas since it
	 * (this one included): once the chain costs as much as the anchor,
	 * the next version is an anchor (pub_delta.c). */
	uint64_t anchor_bytes, chain_wire;
	struct pub_praw *parts;
	size_t nparts;
};

enum ex_phase { EX_PREP, EX_GATHER, EX_PUBLISH, EX_OFFER };
enum ex_need { NEED_WATCH, NEED_MANIFEST, NEED_LAYOUTS, NEED_NONE };

/* One trainer rank's work in an export, on a pool thread of its own
 * (pub_job.c); the loop reads its results after joining it. */
enum pub_job_kind {
	PUB_JOB_SNAPSHOT, /* the rank's memory into its snapshot block */
	PUB_JOB_GATHER,   /* its parcels gathered and hashed, or encoded as deltas */
};

struct pub_job {
	struct node_pub *p;
	enum pub_job_kind kind;
	uint64_t version;
	uint32_t rank;
	uint8_t *block;
	struct pub_part *part;
	uint32_t chunk_size;
	bool delta;        /* encode against the parent's snapshot */
	bool sums;         /* an anchor kept as the parent: its piece checksums */
	/* An addendum: the block is rebuilt from the served export's raw
	 * parcels (rs), or from the source when they do not cover it (a
	 * version kept as the parent: block is its snapshot, restored). */
	bool restore, restored;
	struct pub_rsrc *rs;
	size_t nrs;
	/* Every trainer rank's memory of the version (the export's), which
	 * FP8 layouts' quantized sources are made from (pub_quant.c), and the
	 * version whose quantized block they keep (the parent's). */
	uint8_t *const *tl_blocks;
	uint64_t q_keep;
	bool q_reuse; /* an addendum: a quantized block of the version is it */
	unsigned threads;  /* for the encoder */
	/* The version's budget of delta bytes, shared by every parcel's
	 * encode (the export's); NULL when no delta is tried. */
	struct proto_delta_budget *budget;
	uint64_t encode_ns; /* a delta's encode, with the gather it does */
	uint64_t cpu_ns;    /* the CPU time of that (this thread's only) */
	/* The encoder's scratch, kept from parcel to parcel while the job
	 * encodes them on its own thread (proto_delta_opts.keep), and from
	 * version to version in the publisher's (node_pub.scratch): its pages
	 * are faulted in once, as the export's buffers are. */
	struct proto_delta_scratch *scratch;
	int rc;             /* the snapshot's read (node__pub_source_fill) */
	struct proto_err err;
	struct proto_pool_task task;
	bool running; /* started and not joined yet */
	atomic_bool done;
};

/* The export in progress (one at a time). */
struct pub_export {
	struct pub_req *req; /* NULL: the restart re-offer */
	uint64_t version;
	bool verify; /* check against the tracker's manifest instead of publishing */
	enum ex_phase phase;
	enum ex_need need;
	bool failed;
	int status;
	char error[512];
	struct pub_job *jobs;
	size_t njobs, jobs_left;
	uint8_t **tl_blocks; /* per trainer rank: its memory of the version (pub_job.tl_blocks) */
	bool req_busy; /* a tracker request of this export is in flight */
	bool snap_done;
	unsigned tries;
	uint64_t t0_ns, start_ns, phase_ns, snapshot_ns, hash_ns, wait_ns;
	uint64_t created_ms;
	/* Its start-up, wall clock ms (0: not yet): hashed, signed, the
	 * publish sent and answered; logged by ex_finish with the offer's
	 * answer, on the clock of created_ms. */
	struct {
		uint64_t hashed, signed_, sent, answered;
	} su;
	/* The publisher's CPU time (ns, every thread) at its start, once the
	 * snapshot is taken, hashed (encoded) and signed: what each step
	 * cost, whatever else the machine runs. */
	uint64_t cpu0, cpu_snap, cpu_hashed, cpu_signed;
	uint64_t faults0; /* the process's page faults when it began */
	uint32_t chunk_size;
	struct pub_layout **layouts;
	size_t nlayouts;
	struct proto_manifest m; /* built and signed (leader) or decoded */
	bool have_m;
	uint8_t *mbuf; /* signed bytes (leader) */
	size_t mlen;
	struct pub_version *pv;
	/* Extending a published version by addenda (pub_addendum.c): m is
	 * the tracker's manifest, layouts only those to add. */
	bool addendum;
	struct pub_addenda *add;
	/* Deltas (pub_delta.c). */
	bool delta;            /* parcels encoded against the parent export */
	bool copying;          /* a delta too large: the anchor is being hashed */
	char why[200];         /* why this export is an anchor */
	uint32_t since_anchor; /* versions since the last anchor (0: this one) */
	uint64_t encode_ns, raw_bytes;
	/* The delta tried (pub_delta.c): its budget, TESSERA_DELTA_MAX_PERCENT
	 * of the version's raw bytes, which stops every parcel's encode once
	 * their output together passes it; what became of it, for the
	 * version's report: kept or not, stopped early, its size (or where it
	 * stopped) as a percent of the anchor, and why, in words. */
	struct proto_delta_budget budget;
	bool delta_tried, delta_stopped;
	double delta_percent;
	char delta_why[200];
	/* Monotonic ns at which each phase of a fresh export ended (0: not
	 * passed): the snapshot, the wait for the tracker (layouts, the
	 * retention check) that ends when the gather begins, the delta's
	 * encode, the gather and hash, the publish request sent (sign, and
	 * serving the buffers) and answered; the offer ends the export. The
	 * version's report is made of them (pub_report.c). */
	uint64_t snap_end_ns, gather0_ns, encode_end_ns, gathered_ns, sent_ns, answered_ns;
	/* It waited for a node to register a serving layout (the tracker had
	 * none): its wait is named for that, not for the tracker. */
	bool waited_node;
	unsigned unservable; /* layouts the tracker listed that this publisher cannot serve */
	size_t recycled;       /* snapshot blocks there before it (not mapped afresh) */
	struct pub_parent *next_parent; /* becomes p->parent once published */
	/* The expected canary scores of the export's layouts (leader, built
	 * with the manifest; pub_canary.c), posted once it is published. */
	json_t *canary;
};

struct pub_hosted {
	uint32_t rank;
	struct fab_ctx *fab;
	struct node_fabloop *fl;
	char addr_hex[2 * FAB_ADDR_MAX + 1];
};

struct pub_file {
	char *path; /* the checkpoint of this version (proto/checkpoint.h) */
	struct proto_ckpt ck;
	uint32_t *map; /* model tensor index -> this checkpoint's tensor index */
};

struct node_pub {
	struct event_base *base;
	void (*on_fatal)(void *arg, const char *msg);
	void *arg;
	bool dead; /* on_fatal was called */
	char host[256];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];

	/* Source and layouts. */
	bool synthetic;
	uint64_t seed;
	struct proto_model model;
	bool have_model;
	struct pub_file *files;
	size_t nfiles;
	struct proto_layout tl;
	bool have_tl;
	json_t *model_json, *tl_json;
	/* The trainer source (pub_trainer.c): per trainer rank a sealed memfd
	 * the trainer fills, mapped here; NULL / -1 for other sources. */
	bool trainer;
	int *tr_fd;
	uint8_t **tr_map;
	/* Per trainer rank: the block the next snapshot is taken into. When
	 * parents are kept, a published version's block becomes the parent's
	 * and the parent before it gives its block back here: two blocks per
	 * rank take turns (pub_delta.c); else it is unmapped after the
	 * gather. */
	uint8_t **blocks;
	size_t *block_cap;
	/* Per trainer rank: an export buffer touched before the first export
	 * (node__pub_prefault_first), which its export maps no fresh one for. */
	uint8_t **spare_buf;
	size_t *spare_buf_cap;
	size_t *export_cap; /* per rank: its last export buffer's size, 0 before one */
	struct proto_delta_scratch **scratch; /* per rank: the encoder's, between exports */
	bool second_made;   /* the second export buffers were made ahead (once) */
	/* An anchor leaves no block to take turns with (there was no parent
	 * to give one back): a worker maps and touches one per rank while the
	 * anchor goes out, and the next export's start joins it
	 * (pub_prefault.c). NULL: none. */
	struct pub_prefault *prefault;

	/* Hosted ranks. */
	struct pub_hosted *hosted;
	size_t nhosted;
	bool leader;

	/* Tracker. */
	struct trk_client *trk;
	struct event *hb_ev, *check_ev, *reg_ev, *ex_ev, *wake_ev, *kick_ev;
	evutil_socket_t wake[2];
	atomic_bool abort;
	char id[TRK_ID_MAX];
	bool registered, reg_busy, hb_busy, check_busy, init_busy, ready;
	bool reg_warned, layouts_waiting;
	bool layouts_warned;      /* the wait for a serving layout was said at warn */
	uint64_t layouts_wait_ms; /* since when it waits for one (monotonic) */
	bool layouts_seen; /* the tracker has listed a serving layout before */
	/* The leader's watch for replicas coming alive (a layout to extend
	 * the latest version for): in flight; the tracker's layouts_rev and
	 * latest version it last told; a check to make once the one in
	 * flight is back. */
	bool lw_busy, check_again;
	uint64_t lw_rev, lw_after;
	uint64_t lease_ms;
	uint64_t every_ms; /* its clock, told to the tracker at registration (0: none) */
	uint64_t reg_gen, hb_gen; /* registrations so far; the heartbeat's */
	/* Heartbeats failed in a row (a tracker down or unreachable), and
	 * since when: said once when it starts, once when it recovers. */
	uint64_t hb_fails, hb_fail_ms;
	/* A failure only a person can fix (node__pub_needs_fix), on /healthz
	 * until it clears; whether it is our model the tracker refused (only
	 * an accepted model clears that) or a tracker setting (any answer
	 * that gets through does). */
	struct node_fix fix;
	bool fix_model;
	uint64_t next_version, reoffer;
	uint64_t published; /* the highest version this process published */
	uint8_t prev_digest[PROTO_HASH_BYTES];
	/* Deltas: the parent export, the anchor period, and whether a node
	 * asked for an anchor (pub_delta.c). */
	struct pub_parent *parent;
	uint32_t anchor_every;
	bool anchor_wanted;
	/* After a delta that did not pay (larger than TESSERA_DELTA_MAX_PERCENT
	 * or too dense): this many versions go out as anchors without trying,
	 * and the next failure doubles it, up to anchor_every; a delta that pays
	 * resets it. Weights that change whole every version (the synthetic
	 * model) then cost an anchor, not an encode and an anchor, per version. */
	uint32_t delta_backoff, delta_skip;

	struct pub_layout *layouts;
	struct pub_q *qs; /* FP8 layouts' quantized sources (pub_quant.c) */
	struct pub_version *versions;
	struct pub_req *queue, **queue_tail;
	size_t nqueue;
	struct pub_export *ex;

	/* Addenda (pub_addendum.c): the next export extends add_version by
	 * the layouts in add_want; a failed try waits before the next. */
	bool addendum_next;
	/* The addenda are raw copies of layouts the (delta) version lists,
	 * for nodes that take it whole (tracker copy_wanted). */
	bool add_copy;
	uint64_t add_version, add_failed_v, add_failed_ms, add_gone_v;
	uint32_t nadd_want;
	uint8_t add_want[TRK_RETAIN_LAYOUTS_MAX][PROTO_HASH_BYTES];
};

/* ---- small helpers ---------------------------------------------------------- */

static inline size_t node__pub_page_round(uint64_t n)
{
	return (size_t)((PROTO_MAX(n, 1) + PUB_ALIGN - 1) & ~(uint64_t)(PUB_ALIGN - 1));
}

static inline void node__pub_timer_ms(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	evtimer_add(ev, &tv);
}

/* Whether exports keep their snapshots as the next one's parent (deltas
 * are on and this publisher hosts every trainer rank); then two snapshot
 * blocks per rank take turns from version to version. */
static inline bool node__pub_keeps_parent(const struct node_pub *p)
{
	return p->anchor_every > 1 && p->nhosted == p->tl.nranks;
}

/* ---- publisher.c: the object ---------------------------------------------------- */

/* Registers (again) with the tracker unless a registration is in flight or
 * the publisher is dead; retries on a timer when the request cannot start. */
void node__pub_register(struct node_pub *p);
/* A failure only a person can fix (why: what failed and what to change;
 * model: the tracker refused our model): said once at warn, on /healthz
 * until node__pub_fixed (node/base/needsfix.h). Returns how long to wait
 * before trying again. Cannot fail. */
uint64_t node__pub_needs_fix(struct node_pub *p, const char *why, bool model);
/* A request got through (model: and our model was accepted): what
 * node__pub_needs_fix said of it is over. Cannot fail. */
void node__pub_fixed(struct node_pub *p, bool model);
/* Asks the tracker for its versions unless that is in flight; the answer
 * sets next_version and prev_digest, withdraws versions the tracker lost,
 * picks the one to re-offer and makes the publisher ready. */
void node__pub_watch_versions(struct node_pub *p);

/* ---- pub_export.c: the export ------------------------------------------------------- */

/* Starts exporting version (req NULL: the restart re-offer; verify: check
 * against the tracker's manifest instead of publishing). Takes req; its
 * callback runs once when the export is done or failed, also when it fails
 * to start (node__pub_ex_free drops it without calling it). */
void node__pub_ex_start(struct node_pub *p, struct pub_req *req, uint64_t version, bool verify);
/* Moves the export on as far as it can go now. Last call of every callback. */
void node__pub_ex_step(struct node_pub *p);
/* Joins the workers and frees ex, and its version unless that is among the
 * served ones. The request's callback is not called. */
void node__pub_ex_free(struct node_pub *p, struct pub_export *ex);
/* Event callbacks: a worker finished (wake socket), the export's timer. */
void node__pub_on_wake(evutil_socket_t fd, short what, void *arg);
void node__pub_on_ex_timer(evutil_socket_t fd, short what, void *arg);

/* ---- pub_offer.c: what the tracker is offered ---------------------------------------- */

/* Offers versions not offered under this registration and withdraws (then
 * frees) the released ones; failures are logged and retried later. */
void node__pub_sync_offers(struct node_pub *p);
/* The retention check's timer: asks which versions are still retained. */
void node__pub_on_check(evutil_socket_t fd, short what, void *arg);

/* ---- pub_job.c: the export's workers ------------------------------------------------- */

/* Starts j as kind on a pool thread of its own; when done it sets j->done
 * and wakes the loop (p->wake). 0, or a negative errno: no thread could
 * be had and j does not run. */
int node__pub_job_start(struct pub_job *j, enum pub_job_kind kind);
/* Waits for j if it was started and not joined yet; cannot fail. */
void node__pub_job_join(struct pub_job *j);

/* ---- pub_manifest.c: manifests from the parts' hashes ------------------------------ */

/* Fills ml, layout li of the export as m holds it (its nparcels zeroed
 * parcels, as proto_manifest_add_layout made them), from the parts' items
 * of that layout: ranks, sizes, encoding (a delta's or raw) and chunk
 * hashes. The one builder of manifest layouts: the version's manifest and
 * each addendum use it. On failure (-ENOMEM, -EOVERFLOW) err says which
 * parcel; what was filled stays for the manifest's fini. */
int node__pub_mlayout_fill(const struct pub_export *ex, size_t li, const struct proto_manifest *m,
			   struct proto_mlayout *ml, struct proto_err *err);
/* Leader: builds ex->m from every part's hashes (and ex->canary, the
 * layouts' expected canary scores) and signs it into ex->mbuf. */
int node__pub_manifest_build(struct node_pub *p, struct proto_err *err);
/* Verify: every hosted parcel must match the signed one (ex->m), chunk by
 * chunk; -EINVAL / -EBADMSG with err naming the first that does not. */
int node__pub_manifest_compare(struct node_pub *p, struct proto_err *err);

/* ---- pub_addendum.c: extending a published version ------------------------------- */

struct pub_addenda;
/* From the retention check's answer (vi[n], latest): true when the latest
 * version lacks layouts of live replicas (or raw copies of its own are
 * wanted) and this leader serves it; the caller then starts the export that
 * adds them (addendum_next is set). Only when no export runs. */
bool node__pub_addendum_check(struct node_pub *p, const struct trk_version_info *vi, size_t n,
			      uint64_t latest);
/* Whether the addendum export wants layout sl. */
bool node__pub_addendum_wants(const struct node_pub *p, const struct pub_layout *sl);
/* Builds and signs one addendum per layout of the export, from its parts'
 * hashes and the tracker's manifest (ex->m). */
int node__pub_addendum_build(struct node_pub *p, struct proto_err *err);
/* POSTs the next addendum, its answer to cb (arg p). 0 when sent, else a
 * negative errno. */
int node__pub_addendum_post(struct node_pub *p, trk_client_cb cb);
/* The tracker's answer to the addendum posted: 0 when the next one is to
 * be posted (now, or on the export's timer after a transport failure); 1
 * when all are in and the new layouts joined to the served version, which
 * ex->pv now is; a negative errno (err says why) when the export fails. */
int node__pub_addendum_answer(struct node_pub *p, const struct trk_answer *ans,
			       struct proto_err *err);
void node__pub_addenda_free(struct pub_addenda *a);

/* ---- pub_restore.c: a rank's memory from its served parcels ----------------------- */

/* One parcel of a served export, whole and raw: where an addendum's export
 * rebuilds its source rank's memory from (instead of the source). */
struct pub_rsrc {
	const struct pub_layout *sl;
	const struct proto_parcel *pc;
	const uint8_t *payload; /* pc->bytes */
};
/* The raw parcels trainer rank sent in the served anchor v (its served
 * buffers), each layout still served (a version kept as the parent is read
 * from its snapshot instead: node__pub_parent_block); *out (free it) NULL
 * and *n 0 when there are none. Loop only; -ENOMEM leaves none. The
 * buffers stay valid while the export runs: no export publishes
 * meanwhile, so v stays the newest. */
int node__pub_restore_sources(struct node_pub *p, uint64_t v, uint32_t rank,
			      struct pub_rsrc **out, size_t *n);
/* Worker: rebuilds trainer rank's memory in block (cap bytes) from rs[n]
 * (each layout's parcels together: only as many layouts as it takes to
 * reach every byte pt's items gather are put back); true when they reach
 * them all. False (out of memory, or not reached): the caller fills block
 * from the source. */
bool node__pub_restore(const struct node_pub *p, uint32_t rank, const struct pub_rsrc *rs,
		       size_t n, const struct pub_part *pt, uint8_t *block, size_t cap);

/* ---- pub_delta.c: delta versions ------------------------------------------------- */

struct proto_delta_scratch; /* proto/delta.h */

/* Frees a parent export; NULL is fine. */
void node__pub_parent_free(struct pub_parent *pp);
/* Decides whether ex (its layouts known, parts listed) can be a delta:
 * NULL when it can, else why it must be an anchor. */
const char *node__pub_delta_why_anchor(struct node_pub *p, struct pub_export *ex);
/* Points every item of ex at its parcel in the parent export; false when
 * one is missing (then ex must be an anchor). */
bool node__pub_delta_link(struct node_pub *p, struct pub_export *ex);
/* Threads each parcel's delta encode runs on when nranks trainer ranks
 * encode at once (TESSERA_DELTA_THREADS). Cannot fail. */
unsigned node__pub_delta_threads(size_t nranks);
/* Worker: encodes one item against its parent (it->parent, the parent's
 * snapshot of the same source rank) from block, this version's snapshot:
 * each stretch the scan reads is read where it lies in both when it is one
 * stretch of the rank's memory, else gathered from both into the encoding
 * thread's room (in cache) right before the scan.
 * Takes its canary part from the encoder's changes and hashes the delta's
 * chunks. keep: the encoder's scratch kept from item to item
 * (proto_delta_opts.keep). budget: the version's, which every parcel's
 * encode shares (proto_delta_opts.budget): past it, or once another parcel
 * passed it, the item stops (it->stopped) without reading more. Cannot
 * fail: the item's enc_rc says how it went (-ENOMEM, a failed encode, or
 * dense or stopped: the version then goes as an anchor). */
void node__pub_delta_encode_item(struct node_pub *p, struct pub_item *it, uint32_t chunk_size,
				 unsigned threads, const uint8_t *block,
				 struct proto_delta_scratch **keep, struct proto_delta_budget *budget);
/* Loop: starts ex's delta: its budget (TESSERA_DELTA_MAX_PERCENT of the
 * version's raw bytes) for the encodes to share. Cannot fail. */
void node__pub_delta_begin(struct pub_export *ex);
/* Loop: lays the encoded deltas out in each part's export buffer. 1 when
 * the deltas are too large (or one failed, or they stopped at the
 * budget): ex is then an anchor (served offsets reset to the raw layout);
 * 0 when placed; -ENOMEM. Either way ex->delta_why and delta_percent say
 * what became of the delta. */
int node__pub_delta_place(struct node_pub *p, struct pub_export *ex, struct proto_err *err);
/* Takes the snapshot blocks of ex's parts as the next parent export (kept
 * in ex->next_parent until the version is published; the next snapshot is
 * taken into another block). Cannot fail: without memory the next export
 * is an anchor. */
void node__pub_parent_stage(struct node_pub *p, struct pub_export *ex);
/* The version is published: its staged parent replaces p->parent, whose
 * blocks become the next snapshot's. */
void node__pub_parent_commit(struct node_pub *p, struct pub_export *ex);
/* The snapshot of trainer rank kept as the parent export, when that is
 * version v, else NULL; read only (it is the next delta's parent). */
uint8_t *node__pub_parent_block(const struct node_pub *p, uint64_t v, uint32_t rank);

/* ---- pub_quant.c: FP8 layouts' quantized sources -------------------------------------- */

/* The quantized source of FP8 layout dst (made once per model digest). NULL
 * with err on ENOMEM or a model the trainer layout cannot fill. */
struct pub_q *node__pub_q_get(struct node_pub *p, const struct proto_layout *dst,
			      struct proto_err *err);
/* The block of q holding version v, or NULL. */
const uint8_t *node__pub_q_block(const struct pub_q *q, uint64_t v);
/* Worker: quantizes version v into q's block that does not hold keep (the
 * parent's version), from every trainer rank's memory blocks[r], on
 * threads; reuse: a block already holding v is taken as it is (an
 * addendum: v's snapshots are the kept ones it was made from), else v is
 * quantized again (a fresh export of v takes a fresh snapshot, which may
 * differ). 0, or -EDOM (a NaN or an infinity: err names the tensor and
 * element), -ENOMEM. */
int node__pub_quantize(const struct node_pub *p, struct pub_q *q, uint64_t v, uint64_t keep,
		       bool reuse, uint8_t *const *blocks, unsigned threads,
		       const atomic_bool *abort, struct proto_err *err);
/* Frees every quantized source. */
void node__pub_q_free_all(struct node_pub *p);

/* ---- pub_report.c: what a version's export cost ------------------------------------ */

/* Fills r with ex's phases from the request to end_ns, which add up to
 * r->total_ms, and the delta it tried: with offer, the offer's phase ends
 * at end_ns (the version's line); without, the report ends when the
 * publish was answered (what the offer carries). Cannot fail. */
void node__pub_report(const struct pub_export *ex, uint64_t end_ns, bool offer,
		      struct trk_publish_report *r);

/* ---- pub_canary.c: expected canary scores --------------------------------------- */

/* The expected canary score of every destination rank of every layout of
 * ex, summed from its parcels' parts (every rank's parcels must be there:
 * the leader's). New reference; NULL on ENOMEM. */
json_t *node__pub_canary_json(const struct pub_export *ex);
/* POSTs ex->canary to the tracker (fire and forget: a failure is logged,
 * the probe then finds no expected score). */
void node__pub_canary_post(struct node_pub *p, struct pub_export *ex);

/* ---- pub_serve.c: served versions --------------------------------------------------- */

/* Closes layout li's regions in every part of pv and gives its pages back
 * (the buffers stay mapped); cannot fail. */
void node__pub_layout_free(struct pub_version *pv, size_t li);
/* Frees pv and its parts; NULL is fine. */
void node__pub_version_free(struct node_pub *p, struct pub_version *pv);
/* The served version v not being released, or NULL. */
struct pub_version *node__pub_version_served(struct node_pub *p, uint64_t v);
/* Takes pv off p->versions if it is there; cannot fail. */
void node__pub_version_unlink(struct node_pub *p, struct pub_version *pv);
/* Registers the hosted parts' buffers for remote reads and lists the offers.
 * On failure the regions opened so far stay in pv for version_free. */
int node__pub_version_serve(struct node_pub *p, struct pub_version *pv, struct proto_err *err);

/* ---- pub_part.c: a rank's part of a version ----------------------------------------- */

/* Lists pt's items: every parcel of the layouts whose source is pt's rank,
 * layout by layout, with room for its raw chunks' hashes, laid out as
 * node__pub_part_layout does. -ENOMEM, or -EOVERFLOW (a parcel of more
 * than UINT32_MAX chunks), err saying which; what was listed stays in pt
 * for its release. */
int node__pub_part_list(struct pub_part *pt, struct pub_layout *const *layouts, size_t nlayouts,
			uint32_t chunk_size, struct proto_err *err);
/* Lays out pt's export buffer: each item at a page-aligned offset sized
 * it->wire, layout by layout (one slice each); sets pt->used. */
void node__pub_part_layout(struct pub_part *pt, size_t nlayouts);
/* Its items back to raw payloads (deltas that are not sent): laid out
 * again, with room for their raw chunks' hashes. -ENOMEM. */
int node__pub_part_raw(struct pub_part *pt, size_t nlayouts, uint32_t chunk_size);
/* Maps pt's export buffer (pt->used bytes, page-rounded), or takes the
 * rank's spare one touched ahead. -ENOMEM leaves pt without a buffer. */
int node__pub_part_alloc(struct node_pub *p, struct pub_part *pt);
/* Frees pt's items (hashes and checksums); cannot fail. */
void node__pub_part_items_free(struct pub_part *pt);
/* Closes the regions, frees the items and unmaps the buffer; cannot fail. */
void node__pub_part_release(struct node_pub *p, struct pub_part *pt);

/* ---- pub_prefault.c: pages touched ahead ----------------------------------------------- */

/* After a commit that left a rank without a snapshot block (after an
 * anchor: no parent gave one back): maps one per such rank on a worker and
 * touches every page, so the next snapshot writes pages the kernel already
 * gave. A model-dir publisher's worker also reads version next's
 * checkpoint ahead (its snapshot then copies from the page cache instead
 * of faulting pages in one by one on its critical path). Nothing happens
 * when out of memory (the take maps a fresh buffer as before). */
void node__pub_prefault_start(struct node_pub *p, uint64_t next);
/* Before the first export of a publisher that keeps parents: maps on a
 * worker, and touches every page of, each trainer rank's snapshot block
 * and spare export buffer, sized to the rank's shard, so that the first
 * export does not fault them in on its critical path (and reads the first
 * version's checkpoint ahead, as the start does). Nothing happens when out
 * of memory; cannot fail. */
void node__pub_prefault_first(struct node_pub *p);
/* Waits for that worker (if any) and hands its buffers to the blocks (and
 * the spare export buffers); cannot fail. Called by an export's start and
 * export buffer, and when the publisher is freed. */
void node__pub_prefault_join(struct node_pub *p);

/* ---- pub_source.c: the weights ---------------------------------------------------- */

/* Whether the source holds version v (any v >= 1 for the fixture). */
bool node__pub_source_has(const struct node_pub *p, uint64_t v);
/* Opens every version of the model dir (proto/checkpoint.h: v<N>.safetensors,
 * v<N>/ checkpoints, or dir a checkpoint itself) into p->files and builds
 * p->model from the first; all must share the model. On failure what was
 * opened stays in p for node_pub_free. */
int node__pub_load_model_dir(struct node_pub *p, const char *dir, struct proto_err *err);
/* Fills rank's snapshot block with version's bytes. Runs on a worker
 * thread. Only the model dir can fail (a checkpoint file truncated or
 * unreadable since it was opened): a negative errno, err naming the file
 * and tensor, and the block partly filled. */
int node__pub_source_fill(struct node_pub *p, uint32_t rank, uint64_t version, uint8_t *block,
			  struct proto_err *err);

/* ---- pub_trainer.c: the trainer's shared buffers ------------------------------------ */

/* Loads the model spec (JSON, as `tessera model` writes it) into p->model. */
int node__pub_trainer_model(struct node_pub *p, const char *path, struct proto_err *err);
/* Creates and maps one sealed memfd per trainer rank, sized by its rank
 * spec. On failure what was made stays in p for node__pub_trainer_free. */
int node__pub_trainer_open(struct node_pub *p, struct proto_err *err);
void node__pub_trainer_free(struct node_pub *p);

/* ---- pub_layout.c: serving layouts -------------------------------------------------- */

/* The cached layout with this digest, or NULL. */
struct pub_layout *node__pub_layout_find(struct node_pub *p, const uint8_t *digest);
/* Parses and plans one entry of GET /layouts into p->layouts (once per
 * digest; p owns it). NULL only on ENOMEM or a malformed entry. */
struct pub_layout *node__pub_layout_absorb(struct node_pub *p, json_t *e);

#endif
