/* fabric/ internals shared by its .c files; never included outside fabric/. */
#ifndef FABRIC_FAB_INTERNAL_H
#define FABRIC_FAB_INTERNAL_H

#include <sys/types.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include "fabric/fab.h"

/* How many times a post that gets -FI_EAGAIN progresses the CQ and retries
 * before parking the op for fab_poll. Bounded so that a peer in the same
 * thread (which only the caller can progress) cannot wedge us. */
#define FAB__EAGAIN_TRIES 8
/* CQ entries read per fi_cq_read call. */
#define FAB__CQ_BATCH 32
#define FAB__MSG_SLOTS_DEFAULT 64

enum fab_op_state {
	FAB__OP_FREE = 0, /* never posted */
	FAB__OP_PARKED,   /* provider said -FI_EAGAIN; retried by fab_poll */
	FAB__OP_POSTED,   /* handed to the provider */
	FAB__OP_REAPED,   /* completion read, callback not yet run */
	FAB__OP_DONE,     /* callback ran (or about to) */
};

struct fab_mr {
	struct fab_ctx *ctx;
	struct fid_mr *mr;
	void *buf;
	size_t len;
	void *desc;
	uint64_t key;
	unsigned access;
	struct fab_mr *prev, *next; /* ctx->mrs */
};

/* Largest fi_addr av.c tracks (FI_AV_TABLE hands out small indexes). */
#define FAB__AV_MAX (1u << 24)

struct fab__av_ref {
	uint32_t handles; /* fab_av_insert calls not yet removed */
	uint32_t inserts; /* fi_av_insert calls the provider still counts */
	bool doomed;      /* no handle left, removal waits for transfers to end */
};

struct fab_ctx {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	int wait_fd;       /* -1: none */
	uint64_t mr_mode;  /* as returned by the provider */
	bool hmem;         /* opened with FI_HMEM (FAB_F_HMEM_CUDA) */
	size_t max_rma;
	size_t rma_segs;     /* remote ranges one read may gather (fab_readv) */
	bool write_dc;     /* fab_write asks FI_DELIVERY_COMPLETE */
	bool closing;
	uint8_t name[FAB_ADDR_MAX];
	size_t namelen;

	/* Handles per fi_addr (av.c): the provider hands one fi_addr to
	 * every insert of an address, and removing it drops the peer's one
	 * connection, so it is removed only when the last handle goes.
	 * Indexed by fi_addr (FI_AV_TABLE: small integers); grows. */
	struct fab__av_ref *av_refs;
	size_t av_refs_cap;
	size_t av_doomed; /* entries with doomed set */

	/* ops handed to the provider (doubly linked); ops parked on
	 * -FI_EAGAIN and ops reaped awaiting their callback (FIFOs via
	 * next_). n_posted counts all three: what the caller sees in flight. */
	struct fab_op *posted;
	struct fab_op *parked_head, *parked_tail;
	struct fab_op *reaped_head, *reaped_tail;
	size_t n_posted;
	bool dispatching;

	struct fab_mr *mrs;

	/* control-message buffers: nslots * FAB_MSG_MAX bytes, registered */
	uint8_t *slab;
	struct fab_mr *slab_mr;
	int *free_slots;
	unsigned nslots, nfree;

	/* the sink (msg.c): nsink receives that drop what they take */
	struct fab_op *sink;
	unsigned nsink;
	uint64_t sink_logged, sink_log_ms; /* drops logged so far, and when */

	/* the connection sweep (conns.c): the endpoint's own port and family
	 * (a tcp provider's, set at open; port 0: none to sweep, e.g. shm,
	 * verbs), when it runs next, sheds logged */
	uint16_t conns_port;
	int conns_family;
	uint64_t conns_next_ns;
	uint64_t conns_logged, conns_log_ms;

	struct fab_stats stats;
	/* FAB_F_PREWARM's read from ourselves while it is still out after
	 * fab_open gave up waiting on it (context.c); NULL otherwise. */
	struct fab__prewarm *prewarm;
	struct fab_ctx *abandoned_next; /* closed with transfers pending */
};

/* Logs "call: fi_strerror" at the caller's file:line and returns the
 * negative errno for a negative libfabric return value. */
int fab__fi_err(ssize_t ret, const char *call, const char *file, int line);
#define FAB_FI_ERR(ret, call) fab__fi_err((ret), (call), __FILE__, __LINE__)
/* The errno for a positive or negative FI_E* code; no logging. */
int fab__errno(int fi_err);

/* Reads the CQ once (up to max entries, 0: a batch), moving finished ops to
 * the reaped list without running callbacks (cq.c). Returns entries read or
 * a negative errno. */
int fab__progress(struct fab_ctx *ctx, int max);

/* Op lifecycle (op.c). prepare fills the common fields; the caller then
 * sets the kind's fields and submits: the op is issued (retrying -FI_EAGAIN
 * with bounded progress), else parked. Returns 0, or a negative errno with
 * the op not posted (its slot, if any, still the caller's to release). */
void fab__op_prepare(struct fab_ctx *ctx, struct fab_op *op, int kind,
		     fab_cb cb);
int fab__submit(struct fab_ctx *ctx, struct fab_op *op);
/* Issues parked ops, in order per peer; fails those refused too long. */
void fab__retry_parked(struct fab_ctx *ctx);
/* Fails every parked op to peer with -ECONNABORTED (run by the next poll)
 * and marks its posted ops so that their cancellation by the provider
 * (the connection is being closed) reads -ECONNABORTED too. */
void fab__fail_parked_peer(struct fab_ctx *ctx, fi_addr_t peer);
/* Removes the peers whose last handle went while transfers to them were
 * with the provider, once none is (fab_av_remove). */
void fab__av_reap_doomed(struct fab_ctx *ctx);
/* op->cancel_ values: the caller cancelled it / its peer was removed. */
#define FAB__CANCEL_ASKED 1
#define FAB__CANCEL_PEER_GONE 2
/* Moves a posted or parked op to the reaped list with its result. */
void fab__op_reap(struct fab_ctx *ctx, struct fab_op *op, int status,
		  size_t len, uint64_t tag);
/* Runs callbacks of reaped ops (not re-entrant; nested calls return 0). */
int fab__dispatch(struct fab_ctx *ctx);
/* Reaps every posted and parked op with status -ECANCELED. */
void fab__cancel_all(struct fab_ctx *ctx);
/* Takes a parked op out of the parked FIFO; false if it is not there. */
bool fab__unpark(struct fab_ctx *ctx, struct fab_op *op);

/* Message slots (msg.c): nslots buffers of FAB_MSG_MAX bytes in one
 * registered slab; init leaves nothing allocated on failure. */
void fab__slot_release(struct fab_ctx *ctx, int slot);
int fab__slots_init(struct fab_ctx *ctx, unsigned n);
void fab__slots_fini(struct fab_ctx *ctx);
/* Posts n tagged and n untagged sink receives (fab_opts.sink); 0 or a negative errno, nothing
 * left posted on failure... except those already posted, which fab_close
 * cancels. */
int fab__sink_start(struct fab_ctx *ctx, unsigned n);

/* How often fab_poll sweeps the connections to the endpoint's port. */
#define FAB__CONNS_SWEEP_MS 250
/* Shuts down the connections to the endpoint's port over the bounds of
 * proto/params.h (TESSERA_FAB_*): those that never completed the handshake
 * in time, then the busiest address's; counts them in the stats. */
void fab__conns_sweep(struct fab_ctx *ctx);

/* Regions (mr.c). _private ones are fabric/'s own (the message slab): not
 * on ctx's list, access given in libfabric bits. close_all is for
 * fab_close. */
int fab__mr_reg_private(struct fab_ctx *ctx, void *buf, size_t len,
			uint64_t access, struct fab_mr **out);
/* The same for memory of another interface (FI_HMEM_CUDA on device dev). */
int fab__mr_reg_iface(struct fab_ctx *ctx, void *buf, size_t len, uint64_t access,
		      enum fi_hmem_iface iface, int dev, struct fab_mr **out);
void fab__mr_close_private(struct fab_mr *m);
void fab__mr_close_all(struct fab_ctx *ctx);

#endif
