/* The swarm's insides, shared by its files (node/swarm/swarm.h says what
 * the swarm does). */
#ifndef NODE_SWARM_INTERNAL_H
#define NODE_SWARM_INTERNAL_H

#include "node/swarm/swarm.h"

/* ---- have.c ---- */

/* The fetcher's hook (swarm_hooks): parcel pi has a new source list. */
void swarm__sources_changed(void *arg, uint32_t pi);
/* A read of ours completed: the parcel may wait on its peers alone now. */
void swarm__chase(struct swarm *sw);

/* ---- offer.c ---- */

/* Offers f's parcels, if due (not offered, none in flight, registered). */
void swarm__offer(struct swarm *sw, struct fetch *f);

/* ---- cross-layout holders (xl_read.c) and our slot (xl_serve.c) ---- */

#define XL_HOLDERS_MAX 16
#define XL_LAYOUTS_MAX 8
#define XL_RANKS_MAX 64
#define XL_INFLIGHT 4               /* cross-layout chunk reads in flight per node */
#define XL_STAGES (2 * XL_INFLIGHT) /* staging slots (a moved read keeps its own) */
#define XL_POST_MAX 128             /* reads of one chunk in flight at once */
#define XL_PIECES_MAX 65536         /* pieces of one chunk */
/* Reads of one chunk at most. A read gathers up to four ranges of one
 * holder rank (fab_readv), so a chunk costs only its own bytes: a TP4
 * rank's 1 MiB chunk of row-parallel rows from a TP2 holder is 4096
 * pieces of 256 or 768 bytes, about 1024 reads. Past this many the gaps
 * between ranges are read along (proto_xmap_windows). With one range per
 * read and 64 reads a chunk, the gaps cost tp4 from tp2 1.26 x its bytes. */
#define XL_WINS_MAX 1024
#define XL_ASK_MS 1000              /* holders asked again while fetching */
#define XL_HV_MAX (64u << 10)       /* have-map bytes of one partial holder (all ranks) */
#define XL_SCAN 64                  /* chunks tried against partial holders per call */
#define XL_FETCHING_MAX 16          /* replicas working toward the version, remembered */
#define XL_ALONE_MS 3000            /* a whole fetch of a delta waits this long with no holder */

struct xl_layout {
	uint8_t digest[PROTO_HASH_BYTES];
	int state; /* 0: to read from /layouts, 1: ready, -1: unusable */
	bool asked; /* a /layouts request went out since it was added */
	struct proto_layout l;
	struct proto_xmap map;
};

struct xl_holder {
	bool used, listed;
	uint32_t epoch; /* bumped whenever the entry is reused */
	char replica[TRK_ID_MAX];
	uint32_t lay, nranks;
	struct fetch_source *ranks; /* info: the rank's slot offer; fabric handle */
	struct fetch_source pace;   /* the holder's rate, bytes in flight, progress */
	uint64_t bad_until_ms;
	/* A partial holder (a rank's slot offered while it fetches): the
	 * ranks' have-maps, read back to back into the entry's part of
	 * x->hv (rank r's at hv_off[r]), polled every TESSERA_HAVE_POLL_MS. */
	bool partial, hv_fits, hv_ready;
	uint64_t *hv_off;
	uint32_t hv_live;  /* have-map reads in flight (kept across reuse) */
	uint32_t hv_bad;   /* reads of this poll that failed */
	uint64_t hv_ms;    /* the last poll posted */
	uint64_t hv_set;   /* blocks set at the last poll */
	uint64_t grew_ms;  /* hv_set grew (or the holder was listed) */
};

/* A replica of another layout working toward the version that offers no
 * slot yet (/holders "fetching"). */
struct xl_fetching {
	char replica[TRK_ID_MAX];
	uint8_t digest[PROTO_HASH_BYTES];
	uint32_t nranks;
	uint64_t since_ms;
	bool listed;
};

struct xl_hvop {
	struct fab_op op;
	struct swarm *sw;
	uint32_t holder, epoch;
};

struct xl_read;

struct xl_op {
	struct fab_op op;
	struct xl_read *xr;
	uint32_t win;
	struct fab_seg segs[PROTO_XWIN_SEGS]; /* the window's ranges, while it is read */
};

struct xl_read {
	struct swarm *sw;
	bool busy;
	struct fetch_read *rd;
	uint32_t holder, epoch, stage;
	struct proto_xpiece *pcs;
	size_t npcs;
	struct proto_xwin *wins;
	uint32_t nwins, next, live;
	int status;
	struct xl_op ops[XL_POST_MAX];
};

struct swarm_xl {
	struct xl_layout lays[XL_LAYOUTS_MAX];
	uint32_t nlays;
	bool lays_pending;
	uint64_t version, gen; /* the fetch the holders were listed for */
	struct xl_holder hs[XL_HOLDERS_MAX];
	uint32_t rr;
	bool pending, answered; /* answered: the first /holders for this fetch came */
	uint64_t asked_ms;
	uint64_t alone_ms; /* a whole fetch of a delta found no holder left since (0: has one) */
	uint8_t *stage;
	size_t stage_len, stage_slot;
	struct fab_mr *stage_mr;
	struct xl_read reads[XL_STAGES];
	struct proto_xpiece *scratch;
	struct proto_xwin *wscratch;
	size_t npieces; /* in scratch */
	/* Partial holders' have-maps land here (XL_HV_MAX per holder entry). */
	uint8_t *hv;
	struct fab_mr *hv_mr;
	struct xl_hvop hvops[XL_HOLDERS_MAX][XL_RANKS_MAX];
	struct xl_fetching fetching[XL_FETCHING_MAX];
	/* Chunks no holder could give as of cov_gen (per parcel, by chunk). */
	uint32_t **uncov;
	uint32_t nuncov;
	uint32_t cov_gen;
	/* Our slot, served to readers of other layouts. */
	struct fab_mr *slot_mr;
	const struct node_slot *slot;
	bool slot_in_offer; /* the last offer built for it carried it */
	struct trk_offer slot_offer;
	/* Its have-map, when it was first served partial (all set now). */
	uint8_t *slot_have;
	size_t slot_have_cap;
	struct fab_mr *slot_have_mr;
	/* The fetch's slot, served while it fills (partial): its registration,
	 * its have-map (registered for remote read) and per-block byte counts. */
	const struct fetch *part_f;
	struct fab_mr *part_mr, *part_have_mr;
	uint8_t *part_have;
	size_t part_have_cap;
	uint32_t *part_cnt;
	uint64_t part_nblocks;
	bool part_in_offer;
	struct trk_offer part_offer;
	/* Test only (TESSERA_TEST_CORRUPT_SERVE): a damaged copy served instead. */
	uint8_t *liar;
	size_t liar_len;
};


struct swarm_xl *swarm__xl_get(struct swarm *sw);
/* The fetcher's hooks: post a read from a holder; whether one serves. */
int swarm__xl_post(void *arg, uint32_t pi, uint32_t hint);
bool swarm__xl_serves(void *arg);
/* Chunk c of parcel pi of the fetch is verified and in its slot: marked in
 * the have-map of the slot served while it fills. */
void swarm__xl_landed(struct swarm *sw, uint32_t pi, uint32_t c);
/* The fetch's slot offered while it fills, when it can be. */
void swarm__xl_part_serve(struct swarm *sw, struct swarm_xl *x);
void swarm__xl_serve_fini(struct swarm *sw, struct swarm_xl *x);

#endif
