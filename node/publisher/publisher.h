/* The publisher: trainer ranks exporting, signing and serving policy versions. */
#ifndef NODE_PUBLISHER_H
#define NODE_PUBLISHER_H

/*
 * One object hosts a set of trainer ranks of one trainer layout and exports
 * numbered versions of the policy for every serving layout registered at the
 * tracker: each version is snapshotted from the source, cut into parcels per
 * serving layout, sent as an anchor (raw parcels) or a delta against the
 * version before, hashed chunk by chunk, signed in a manifest, published and
 * offered for remote reads. Versions no replica aims at any more are
 * withdrawn and freed. The process hosting trainer rank 0 is the leader and
 * signs; others rebuild their ranks' parcels and offer them only when every
 * chunk matches the signed manifest (so does the leader after a restart).
 *
 * Everything runs on the caller's libevent loop, which owns the state; the
 * heavy work runs on the worker pool, one job per rank, posting results
 * back. The steps, retention, addenda and the reasons behind them: NOTES.md
 * in this folder.
 *
 * What an offer means (trk_offer for one parcel of one hosted rank):
 *   key   the remote key of the region holding the parcel: its layout's
 *         slice of the rank's export buffer (fab_mr_rkey().key);
 *   addr  where the parcel starts, as fab_read wants it: fab_mr_rkey().addr
 *         + the parcel's offset in the region, i.e. the virtual address under
 *         FI_MR_VIRT_ADDR, else the 0-based offset in the region;
 *   len   the parcel's wire bytes (its payload, or its delta; chunks back
 *         to back).
 * A reader fetches chunk c with
 *   struct fab_rkey rk = {addr, key, len};
 *   fab_read(ctx, op, lmr, loff, chunk[c].size, peer, &rk,
 *            (uint64_t)c * manifest.chunk_size, cb);
 * from the fabric address the tracker lists for that publisher rank.
 */

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/spec.h"
#include "proto/util.h"

struct node_pub;

struct node_pub_opts {
	const char *tracker_url;    /* "http://HOST:PORT" */
	const uint8_t *cluster_key; /* PROTO_CLUSTER_KEY_BYTES, or NULL */
	const char *tls_ca;         /* CA file for an https:// tracker (NULL: system's) */
	const char *site;           /* where the trainer is (--site; NULL: the unnamed site) */
	const uint8_t *sk;          /* PROTO_SK_BYTES trainer secret key */
	/* Source of weights: synthetic_bytes > 0 for the fixture model of that
	 * size (version v's bytes from proto_fixture_fill_rank with seed), else
	 * model_dir: one checkpoint per version, v<N>.safetensors or a v<N>/
	 * Hugging Face directory (sharded or not), in numeric order of N; the
	 * i-th (1-based) is version i. A Hugging Face checkpoint directory is
	 * itself one version (proto/checkpoint.h). */
	uint64_t synthetic_bytes;
	uint64_t seed;
	const char *model_dir;
	/* Or trainer_model: the model spec (JSON) of a trainer that hands each
	 * version's shards over shared buffers (node_pub_trainer_buffer); the
	 * process must host every trainer rank. */
	const char *trainer_model;
	/* Trainer layout: a built-in name (fsdpN, tpN) or a layout file; NULL
	 * means "fsdp2". */
	const char *layout;
	const uint32_t *ranks; /* hosted ranks; NULL (nranks 0) = all */
	size_t nranks;
	const char *provider; /* NULL: FAB_PROVIDER_DEFAULT */
	/* Local fabric address; NULL: the first address of fabric_iface when
	 * set, else the one the route to the tracker leaves from
	 * (node/base/fabiface.h). */
	const char *bind;
	const char *fabric_iface; /* --fabric-iface */
	const char *host; /* host name to register; NULL: gethostname() */
	/* An anchor every this many versions, deltas in between (1: anchors
	 * only); 0: TESSERA_ANCHOR_EVERY. Deltas need every trainer rank
	 * hosted by this publisher (else every version is an anchor). */
	uint32_t anchor_every;
	/* The caller's clock: a version every this many ms (tessera publish
	 * --every), told to the tracker at registration for its status page
	 * to hold the versions against; 0: none. */
	uint64_t every_ms;
	/* Called (once) when the publisher cannot go on: the tracker refused
	 * the registration, ... msg is one line. The caller should stop the
	 * loop and free the publisher. May be NULL. */
	void (*on_fatal)(void *arg, const char *msg);
	void *arg;
};

/*
 * Loads the model and the trainer layout, opens one fabric endpoint per
 * hosted rank, and starts (on base) registering with the tracker and looking
 * for a version to re-offer. Options are copied. On failure *out is NULL,
 * nothing is left open and err says why in one line (a bad layout file, a
 * model dir whose files disagree, an unknown provider, ...).
 */
int node_pub_new(struct event_base *base, const struct node_pub_opts *o,
		 struct node_pub **out, struct proto_err *err);

struct trk_publish_report; /* tracker/tracker.h */

/* What one export gave (valid during the callback). */
struct node_pub_result {
	int status;          /* 0 or a negative errno */
	const char *error;   /* one line when status != 0, else "" */
	uint64_t version;
	uint64_t created_ms; /* wall clock when the export was requested */
	bool leader;         /* published (else only checked and offered) */
	uint64_t wire_bytes; /* all parcels of all layouts of the manifest */
	uint32_t nlayouts;
	uint64_t total_ns;   /* request -> offers answered */
	uint64_t snapshot_ns, hash_ns, wait_ns; /* wait: for layouts/manifest */
	bool delta;            /* a delta version (else an anchor) */
	uint64_t encode_ns;    /* delta encoding, the slowest rank's */
	uint64_t anchor_bytes; /* what the version costs as an anchor */
	/* Page faults the publisher process took from the request to now: after
	 * the first version, its buffers are reused and fault no more. */
	uint64_t faults;
	/* A published version's phases from the request to its offer, which
	 * add up to its total_ms, and the delta tried (tracker/tracker.h); the
	 * tracker got them with the offer, but for the offer's own. NULL for
	 * a version only checked and offered, or one that failed. */
	const struct trk_publish_report *report;
};
typedef void (*node_pub_cb)(void *arg, const struct node_pub_result *r);

/*
 * Asks for the next version to be exported (queued behind the ones asked
 * before; created_ms is taken now). cb runs exactly once, from the loop,
 * when the version is published and offered or the export failed (the
 * version number is then not used up by a leader). -ENOMEM: not queued,
 * cb never called.
 */
int node_pub_export(struct node_pub *p, node_pub_cb cb, void *arg);

/* Called once the snapshot of the export is taken: the source (the
 * trainer's buffers) may change from then on. Not called when the export
 * fails before. */
typedef void (*node_pub_snap_cb)(void *arg, uint64_t version);
/* node_pub_export, with on_snap (may be NULL) called when the snapshot is
 * taken, before cb. */
int node_pub_export_snap(struct node_pub *p, node_pub_cb cb, node_pub_snap_cb on_snap,
			 void *arg);

/* What an export that is not done waits for (node_pub_export_why). */
enum node_pub_wait {
	NODE_PUB_WAIT_BUSY,    /* queued behind another export */
	NODE_PUB_WAIT_WORKING, /* the publisher's own work: snapshot, encode, hash */
	NODE_PUB_WAIT_TRACKER, /* the tracker: registering, publishing, offering */
	NODE_PUB_WAIT_LAYOUTS, /* a serving layout: no node has registered one */
};
struct node_pub_why {
	enum node_pub_wait cause;
	uint64_t version; /* the version it exports; 0 while it waits in the queue */
	char text[320];   /* one line for people, e.g. "no node has registered ..." */
};
/*
 * Why the export asked with arg (node_pub_export_snap's, the oldest when
 * several share it) is not done yet, as the publisher sees it now. -ENOENT
 * when no export of arg is queued or running (*out unchanged); else 0.
 */
int node_pub_export_why(const struct node_pub *p, const void *arg, struct node_pub_why *out);
/* The cause in one word: busy, working, tracker or layouts. Cannot fail. */
const char *node_pub_wait_name(enum node_pub_wait w);

/* Trainer source: the shared buffer of trainer rank (a sealed memfd of
 * *bytes bytes, the rank's block of the trainer layout: its local tensors
 * back to back). The publisher keeps the fd: the caller dups or sends it.
 * -ENOENT when the source is not the trainer, -ERANGE for a rank the
 * layout does not have. */
int node_pub_trainer_buffer(const struct node_pub *p, uint32_t rank, int *fd, uint64_t *bytes);
/* Whether the source is the trainer; the trainer layout. */
bool node_pub_trainer_source(const struct node_pub *p);
const struct proto_layout *node_pub_trainer_layout(const struct node_pub *p);
const struct proto_model *node_pub_model(const struct node_pub *p);

/* Exports queued or running. Cannot fail. */
size_t node_pub_pending(const struct node_pub *p);
/* Whether the publisher holds a lease at the tracker now. */
bool node_pub_registered(const struct node_pub *p);
/* A failure only a person can fix that the publisher lives with (a
 * tracker setting, its model refused), what to change; NULL when none.
 * Owned by p, valid until its next event. */
const char *node_pub_needs_fix(const struct node_pub *p);
/* The trainer ranks this publisher hosts / whether it hosts rank 0. */
size_t node_pub_nranks(const struct node_pub *p);
bool node_pub_leader(const struct node_pub *p);
/* The model's total bytes (one full copy). */
uint64_t node_pub_model_bytes(const struct node_pub *p);
/* Bytes of export buffers held for serving: every served version's slices
 * of the hosted ranks, less those of dropped layouts. Cannot fail. */
uint64_t node_pub_served_bytes(const struct node_pub *p);

/*
 * Stops everything in reverse order: waits for worker threads (they stop
 * early), drops queued exports without calling their callbacks, cancels
 * tracker requests, closes regions and endpoints, frees buffers. Offers are
 * not withdrawn: the tracker stops listing this publisher when its lease
 * ends. Must run on the loop's thread, not from inside one of the
 * publisher's callbacks. NULL is fine.
 */
void node_pub_free(struct node_pub *p);

#endif
