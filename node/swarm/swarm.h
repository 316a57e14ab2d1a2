/*
 * The swarm side of a rank: what it serves to its peers and what it reads
 * of theirs, and the replicas of other layouts it reads from and serves.
 *
 *   offer.c     our parcels served to peers: have-pages in front of the
 *               bytes (or the slot itself), offered to the tracker; the
 *               active version kept served until the next activation
 *   have.c      the peers' have-pages, read every TESSERA_HAVE_POLL_MS (or
 *               chased while a parcel waits on its peers alone)
 *   xl_read.c   chunks assembled from the slots of replicas of other
 *               layouts (cross-layout holders), a source kind of the fetch
 *   xl_serve.c  our own slot offered to readers of other layouts, complete
 *               or while it fills
 *
 * The fetcher (node/fetch/) calls in through its hooks (swarm_hooks fills
 * them); the agent (node/agent/) drives the rest. The model behind all of
 * it, with its measurements, is in node/swarm/NOTES.md.
 */
#ifndef NODE_SWARM_H
#define NODE_SWARM_H

#include "node/fetch/fetch.h"

#define HAVE_SLOTS 32 /* have-page reads in flight at most */

struct swarm_opts {
	/* The rank's fetcher: its endpoints, ids and the fetch under way. */
	struct fetcher *x;
	const struct proto_model *model;
	bool install_inplace;   /* versions are written into the served slot */
	/* The agent's served slot (never served as a fetch's own). */
	struct node_slot *const *active;
	/* The agent's registration: offers go out only while it holds. */
	const bool *registered;
	/* A version taken whole lost its last holder: it cannot go on. */
	void (*refuse)(void *arg, const char *why);
	void *arg;
};

/* A read of a peer's have-page. */
struct swarm_have_read {
	struct fab_op op;
	struct swarm *sw;
	uint64_t gen;
	uint32_t parcel, src_idx, src_epoch, slot;
	bool busy;
};

struct swarm {
	struct swarm_opts o;
	struct fetcher *x; /* o.x */
	/* Have-page reads land here: HAVE_SLOTS of HAVE_SLOT_MAX. */
	uint8_t *hpool;
	struct fab_mr *hpool_mr;
	struct swarm_have_read *hreads;
	struct event *chase_ev; /* have-pages read again soon (have.c) */
	uint64_t reg_gen;       /* registrations so far (offers are per registration) */
	/* The version served before the one being fetched (the active one):
	 * its parcels stay offered until the next activation. */
	struct fetch *kept;
	/* Offers in flight: which version each answer is about. */
	struct swarm_ticket {
		struct swarm *sw;
		uint64_t version;
		bool used;
	} tickets[4];
	/* Cross-layout holders and our served slot (xl_*.c); NULL until needed. */
	struct swarm_xl *xl;
};

/* Sets up the have-page reads (in fanout). 0, or an error in err
 * (swarm_fini cleans up). */
int swarm_init(struct swarm *sw, const struct swarm_opts *o, struct proto_err *err);
/* Closes the regions registered, while the endpoint is still open (a setup
 * that failed half way). */
void swarm_close_regions(struct swarm *sw);
/* Frees everything, the kept version included; after fab_close and after
 * fetcher_fini. */
void swarm_fini(struct swarm *sw);
/* The fetcher's hooks this swarm answers (the agent adds its own). */
void swarm_hooks(struct swarm *sw, struct fetch_hooks *h);

/* ---- offer.c ---- */

/* f's parcels are set up: map and register their served regions and offer
 * them (nothing when fanout is off). Failure only logs: the node then
 * fetches without serving. */
void swarm_serve(struct swarm *sw, struct fetch *f);
/* Frees f (NULL is fine) after everything served of it is withdrawn and
 * no verifier worker touches it. */
void swarm_release(struct swarm *sw, struct fetch *f);
/* f became active: keep serving it until the next activation, releasing
 * the one kept before. Takes f. */
void swarm_keep(struct swarm *sw, struct fetch *f);
/* Registered again: every offer must be made again. */
void swarm_registered(struct swarm *sw);
/* Periodic: offers not yet accepted; have-pages due. */
void swarm_tick(struct swarm *sw);

/* ---- xl_read.c, xl_serve.c ---- */

/* The fetch waits for its addendum: the holders of other layouts are asked
 * for now, and our maps of their layouts built. Failure only delays. */
void swarm_xl_prefetch(struct swarm *sw);
/* Periodic: holders asked again while fetching, a silent holder's reads
 * moved, our slot kept offered; refuses a version taken whole once no
 * holder is left (o.refuse: the fetch may be gone after it). */
void swarm_xl_tick(struct swarm *sw);
/* The switch made active the served slot (sw->kept the version served):
 * offer it to readers of other layouts instead of the one before. */
void swarm_xl_serve(struct swarm *sw, const struct node_slot *active);
/* Stops serving our slot to readers of other layouts (an in-place install
 * is about to write into it): their reads fail and move elsewhere. */
void swarm_xl_withdraw(struct swarm *sw);
/* f is freed: the slot served while it filled is withdrawn first. */
void swarm_xl_unserve(struct swarm *sw, const struct fetch *f);
/* Our slot to offer with f's parcels (for readers of other layouts), or
 * NULL; valid until the next call. */
const struct trk_offer *swarm_xl_offer_slot(struct swarm *sw, const struct fetch *f);
void swarm_xl_fini(struct swarm *sw);

#endif
