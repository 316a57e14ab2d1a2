/*
 * Building a delta version on a node: the slot the version is built in is
 * made to hold its parent first (a standby copy made between versions, the
 * retired slot caught up by re-applying the last delta, or a dense copy),
 * then the delta's parcels are applied on a worker as they land, each
 * piece's checksum checked, the child's checksums kept for the next delta;
 * a scrub re-sums a share of the served slot between versions.
 *
 *   delta.c    a version's build: its slot, the apply, what activation keeps
 *   slots.c    the slots a build starts from: standby, rotation, warm slot, copy
 *   sums.c     piece checksums kept per slot, and the scrub
 *   rebuild.c  the worker a copy and an apply run on (node/rebuild/rebuild.h)
 *
 * The model, with the measurements behind it, is in node/rebuild/NOTES.md.
 * Everything here runs on the agent's loop but the worker's functions.
 */
#ifndef NODE_REBUILD_DELTA_H
#define NODE_REBUILD_DELTA_H

#include "node/fetch/fetch.h"
#include "node/rebuild/rebuild.h"
#include "node/serve/attach.h"

struct delta_rotation;
struct delta_sums;
struct delta_scrub;

/* What the rebuild needs of its rank, set once. The pointers into the
 * agent's state are read when needed: they change with each activation. */
struct delta_opts {
	struct fetcher *x; /* the rank's: id, layout, store, metrics, loop, wire buffers */
	const struct proto_model *model;
	bool install_inplace;        /* no second copy of the rank is ever made */
	struct node_attach *attach;  /* who pins which slot (NULL: none) */
	struct node_slot *const *active; /* the served slot */
	const uint8_t *active_digest;    /* its manifest digest */
	const struct proto_plan *plan;   /* the plan trainer -> our layout */
	const uint8_t *plan_src;         /* the trainer layout it was built from */
};

/* Per rank: the slots kept ready for the next delta, and the checksums. */
struct delta_state {
	struct delta_opts o;
	/* The active slot's copy made ahead of the next version: a delta
	 * against the active version starts from it, anything else takes its
	 * slot. NULL when none; dropped at every activation. */
	struct node_slot *standby;
	struct node_rebuild *standby_rb;
	struct event *standby_ev;
	/* The last delta, kept to patch the slot it was applied against (the
	 * retired one, back in the store) up to the active version (NULL
	 * when none); the standby's catch-up while one is made. */
	struct delta_rotation *rot, *standby_rot;
	uint64_t slot_tags; /* numbering what activated slots hold */
	uint32_t standby_tries; /* waits for the retired slot to come back */
	/* The standby waits while peers read from this node: the fabric
	 * loop's wake-ups by its wait fd at the last look, when it began
	 * waiting (0: not yet), when a look last saw one, looks left that
	 * count as serving (test). */
	uint64_t standby_fd_polls, standby_defer_ms, standby_read_ms;
	uint64_t standby_test_busy;
	/* The warm slot: made when the node starts, its pages touched by a
	 * worker while the node is idle; the first dense copy of a parent
	 * takes it. NULL when none or taken; warm_stop and warm_pause
	 * (atomic) stop and hold the touch; warm_ready: every page touched. */
	struct node_slot *warm;
	struct node_rebuild *warm_rb;
	int warm_stop, warm_pause;
	bool warm_ready;
	uint64_t warm_ms;     /* when the touch began */
	uint64_t warm_cpu_ms; /* the touch's CPU (its worker's) */
	/* The active slot's piece checksums, verified by the apply that built
	 * it and bound to it by its tag; NULL when unknown. */
	struct delta_sums *sums;
	/* The scrub of the active slot under way, its worker, and which
	 * share comes next. */
	struct delta_scrub *scrub;
	struct node_rebuild *scrub_rb;
	uint64_t scrub_round;
};

/* One version's build. The agent keeps it with the version. */
struct delta_build {
	struct fetch *f;                /* the version's fetch: its parcels' wire, its slot */
	struct delta_state *d;          /* its rank's: what the worker reads, what it keeps */
	struct node_rebuild *rebuild;   /* the copy and apply's worker */
	struct delta_rotation *rot;     /* the catch-up its slot is made by, or NULL */
	bool from_standby;              /* the slot is the standby copy's */
	bool chained;                   /* a step of a chain replay (test hooks) */
	bool rotatable;                 /* built on the active slot: its delta can rotate */
	bool applying;                  /* the apply is handed over: parcels feed it as they land */
	bool test_corrupt;              /* TESSERA_TEST_CORRUPT_CHAIN: damage it before the apply */
	uint32_t fed_early;             /* parcels it had before the last chunk */
	uint64_t rebuild_ms;
	/* Piece checksums: the parent's, when known for the slot the delta
	 * builds on, and the child's, which the apply fills; NULL when none. */
	struct delta_sums *psums, *csums;
	/* The build's end: rc 0 (the slot holds the version), or why not. */
	void (*done)(void *arg, int rc, const char *why);
	void *done_arg;
};

void delta_init(struct delta_state *d, const struct delta_opts *o);
/* Drops the standby copy, the warm slot and the checksums (teardown). */
void delta_fini(struct delta_state *d);
/* Makes the warm slot and starts touching its pages (node start; nothing
 * in place, or with TESSERA_DELTA_WARM=0). Cannot fail: without one, the
 * first copy makes its own slot. */
void delta_warm(struct delta_state *d);
/* Holds the warm slot's touch while a version is fetched (fetching), lets
 * it go on when the fetch ends. */
void delta_warm_pause(struct delta_state *d, bool fetching);

/* The slot of b->f: the standby slot when there is one (for a delta, with
 * the active slot's copy in it or under way), else a new one, into which
 * a delta's parent is copied (or the retired slot caught up) on a worker
 * while the chunks arrive. chain: the parent when replaying a chain
 * (NULL: the active slot). 0, or an error in err. */
int delta_slot(struct delta_state *d, struct delta_build *b, struct node_slot *chain,
	       struct proto_err *err);
/* Every chunk of delta parcel pi verified before the fetch's last: the
 * worker may apply it while the rest arrives (parent, digest: the slot the
 * delta builds on, checked again). Cannot fail. */
void delta_landed(struct delta_state *d, struct delta_build *b, uint32_t pi,
		  const struct node_slot *parent, const uint8_t *digest);
/* All delta parcels verified: the worker applies every parcel's delta once
 * the copy is done, checking each piece's checksum; then b->done. 0, or
 * -ENOENT when the parent slot changed during the fetch (nothing started). */
int delta_rebuild(struct delta_state *d, struct delta_build *b, const struct node_slot *parent,
		  const uint8_t *digest);
/* b's version became active (old served before): drops the standby, keeps
 * b's delta for the next rotation, and arms the next standby. */
void delta_activated(struct delta_state *d, struct delta_build *b, struct node_slot *old);
/* Stops and frees what b holds (its worker first). */
void delta_build_fini(struct delta_build *b);

#endif
