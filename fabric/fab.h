/* fabric/: tessera's small libfabric layer — the one header other directories include. */
#ifndef FABRIC_FAB_H
#define FABRIC_FAB_H

/*
 * Design
 * ------
 * A fab_ctx is one libfabric RDM endpoint with everything it needs: fabric,
 * domain, one completion queue (FI_CQ_FORMAT_TAGGED) for sends, receives and
 * RMA, and an address vector (FI_AV_TABLE). The provider is picked by name
 * ("tcp;ofi_rxm" by default, "shm" on one host, "verbs;ofi_rxm" or "efa" on
 * RDMA fabrics).
 *
 * Data moves as one-sided reads (fab_read) and writes (fab_write) of
 * registered memory (fab_mr). A region served to peers is registered for
 * remote read only; a peer needs its fab_rkey (address, key, length), which
 * the owner packs into FAB_RKEY_LEN bytes and ships through the tracker or a
 * control message. Control messages are small tagged sends (fab_tsend /
 * fab_trecv, at most FAB_MSG_MAX bytes) copied through buffers the context
 * registered itself, so callers never register message memory.
 *
 * Memory registration follows the mr_mode bits the provider returns: we
 * advertise FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY and
 * FI_MR_ENDPOINT and branch on what comes back (local descriptors are always
 * passed; remote addresses are 0-based offsets unless FI_MR_VIRT_ADDR; keys
 * are ours unless FI_MR_PROV_KEY; regions are bound to the endpoint and
 * enabled under FI_MR_ENDPOINT).
 *
 * Every operation is asynchronous and carries a caller-owned struct fab_op
 * (it embeds the struct fi_context2 libfabric needs). fab_poll() reads the
 * CQ and calls each finished op's callback with 0 or a negative errno;
 * callbacks run only from fab_poll/fab_wait/fab_close, never from inside a
 * posting call, so a callback may post new operations. fab_wait() is the
 * blocking helper for simple callers and tests.
 *
 * Back-pressure: when the provider answers -FI_EAGAIN (queue full, or a
 * connection still being set up, which needs the peer's progress), a post
 * progresses the CQ and retries a bounded number of times, then parks the
 * op in a FIFO that fab_poll() retries; the caller just sees 0. Posts to one
 * peer stay in order (a new one queues behind that peer's parked ones);
 * posts to other peers go ahead. A peer that keeps refusing (unreachable:
 * rxm answers -FI_EAGAIN while it reconnects, forever) fails its parked ops
 * with -EHOSTUNREACH after TESSERA_PARK_MS, and fab_av_remove() fails them
 * at once with -ECONNABORTED, so one dead peer never blocks the rest.
 * Callers bound how much they have in flight (fab_inflight()).
 *
 * Threads: a fab_ctx (and its regions and ops) is used by one thread at a
 * time; the domain is opened FI_THREAD_DOMAIN. Two contexts may be driven by
 * two threads.
 *
 * Progress: tcp;ofi_rxm and shm progress only when their CQ is read, on
 * BOTH sides: a peer serving reads must call fab_poll too (shm needs the
 * peer only for the first contact; later reads are copied by the reader
 * with process_vm_readv). An event loop waits on fab_wait_fd() (the CQ's
 * FI_WAIT_FD descriptor) after fab_trywait() says blocking is safe, plus a
 * slow timer (~100 ms: connection setup may not signal the fd); without an
 * fd (-ENOSYS: shm) or when fab_trywait() says -EAGAIN, it polls on a short
 * timer. tcp;ofi_rxm has the fd.
 *
 * Errors: every int-returning function returns 0 or a negative errno;
 * libfabric's -FI_E* codes are turned into errno values at this boundary and
 * logged with fi_strerror, the call, file and line.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <rdma/fabric.h>

#include "proto/util.h"

/* Largest control message payload, bytes. Protocol constant, not tunable. */
#define FAB_MSG_MAX 4096
/* Largest endpoint address (fab_getname / fab_av_insert), bytes. */
#define FAB_ADDR_MAX 256
/* Size of a packed fab_rkey. */
#define FAB_RKEY_LEN 24
/* Sink receives of each kind for a context that takes no messages
 * (fab_opts.sink). */
#define FAB_SINK_DEFAULT 16
/* The default provider. */
#define FAB_PROVIDER_DEFAULT "tcp;ofi_rxm"

struct fab_ctx;
struct fab_mr;
struct fab_op;
struct fab_seg;

/* fab_op completion callback: status is 0 or a negative errno (-ECANCELED
 * when the context was closed with the op in flight). The op may be reposted
 * or freed inside the callback. */
typedef void (*fab_cb)(struct fab_op *op, int status);

enum fab_op_kind {
	FAB_OP_NONE = 0,
	FAB_OP_READ,
	FAB_OP_WRITE,
	FAB_OP_SEND,
	FAB_OP_RECV,
};

/*
 * One asynchronous operation. Caller-owned: embed it in your own request
 * struct, recover that with proto_container_of() in the callback. It must
 * stay alive and untouched from a successful post until its callback has
 * run (or fab_wait reports it done). Posting functions set every field but
 * data; a post that fails leaves the op unposted and never calls the
 * callback.
 */
struct fab_op {
	struct fi_context2 fi; /* libfabric's; must not be touched */
	fab_cb cb;             /* may be NULL (fab_wait users) */
	void *data;            /* caller's, untouched by fabric/ */
	/* Results, valid once done: */
	int status;            /* 0 or negative errno */
	size_t len;            /* bytes moved / received */
	uint64_t tag;          /* receive: tag of the matched message */
	/* Private to fabric/: */
	struct fab_ctx *ctx_;
	struct fab_op *prev_, *next_;
	void *lbuf_;       /* local bytes handed to the provider */
	void *desc_;       /* their registration descriptor */
	void *ubuf_;       /* receive: the caller's buffer */
	size_t ucap_;
	fi_addr_t peer_;
	uint64_t raddr_;   /* RMA: remote address */
	const struct fab_seg *segs_; /* fab_readv: the caller's remote ranges */
	uint32_t nsegs_;   /* their count; 0: one range (raddr_, len) */
	uint64_t key_;     /* RMA: remote key; receive: ignore mask */
	uint64_t parked_ns_; /* when it was parked */
	int slot_;         /* message slot, -1 when none */
	uint8_t kind_;
	uint8_t state_;
	uint8_t cancel_;   /* fab_cancel asked */
	uint8_t internal_; /* fabric/'s own (the sink): not in fab_inflight */
	uint8_t untagged_; /* receive: an untagged one (fi_recv; the sink's) */
};

/* What a peer needs to read (or write) a registered region. addr is what the
 * peer passes to fi_read: the virtual address under FI_MR_VIRT_ADDR, else 0
 * (offsets are then 0-based). */
struct fab_rkey {
	uint64_t addr;
	uint64_t key;
	uint64_t len;
};

/* Per-context counters (initiator side: bytes this endpoint pulled/pushed). */
struct fab_stats {
	uint64_t bytes_read;    /* completed fab_read bytes */
	uint64_t bytes_written; /* completed fab_write bytes */
	uint64_t reads, writes;
	uint64_t msgs_sent, msgs_recv;
	uint64_t bytes_sent, bytes_recv;
	uint64_t errors;        /* ops that completed with an error */
	uint64_t msgs_dropped;  /* unsolicited messages the sink took */
	/* Connections to the endpoint's port (tcp providers), as the last
	 * sweep found them (every 250 ms of fab_poll): established, and of
	 * those still in the handshake; and how many it shut down so far. */
	uint64_t conns_open, conns_pending, conns_shed;
	uint64_t prewarmed;     /* 1: fab_open's read from itself finished
	                         * (FAB_F_PREWARM); not in reads or bytes_read */
};

/* fab_open flags */
#define FAB_F_NO_WAIT_FD 0x1u /* open the CQ without a wait object */
/* Ask for FI_HMEM (registering CUDA device memory) when the provider offers
 * it; open without it otherwise. fab_hmem_cuda says which it got. */
#define FAB_F_HMEM_CUDA  0x2u
/* Read once from ourselves before fab_open returns, so that the provider's
 * first-transfer setup is paid at open rather than in the middle of the
 * first read a peer waits on (context.c says what rxm does then). Best
 * effort, waits at most 2 s; for contexts that will read (nodes). */
#define FAB_F_PREWARM    0x4u

struct fab_opts {
	unsigned flags;     /* FAB_F_* */
	unsigned msg_slots; /* control-message buffers (sends + posted receives);
	                     * 0: 64 */
	/* For a context that takes no messages (node, publisher): receives
	 * kept posted that take every message and drop it, sink tagged ones
	 * and sink untagged ones, so what strangers send cannot pile up in
	 * the provider (rxm keeps unexpected messages without bound). 0:
	 * none. 2 * sink at most msg_slots / 2. Such a context refuses
	 * fab_trecv (-EBUSY). */
	unsigned sink;
};

/*
 * Opens an RDM endpoint on the named provider ("tcp;ofi_rxm" when NULL).
 * node, when not NULL, is the local address to bind ("127.0.0.1" for
 * loopback tcp; leave NULL for shm); NULL takes the provider's first
 * interface. opts may be NULL. On success *out owns every libfabric object;
 * free it with fab_close. On failure *out is NULL, nothing is left open,
 * and err (may be NULL) says why; an unknown provider gives -ENODATA
 * naming the providers that exist.
 */
int fab_open(const char *provider, const char *node,
	     const struct fab_opts *opts, struct fab_ctx **out,
	     struct proto_err *err);

/*
 * Closes the endpoint first (abandoning every op in flight: the provider
 * stops touching their buffers), then calls each abandoned op's callback
 * with -ECANCELED (posting from it gives -ESHUTDOWN), then closes regions
 * the caller left open, the AV, the CQ, the domain, the fabric: the reverse
 * of fab_open. No last progress is made. NULL is fine. Never hangs on a
 * silent peer; cannot fail. With reads, writes or sends still accepted by
 * the provider the libfabric objects are not closed at all (tcp;ofi_rxm
 * 1.17 crashes closing connections that carry RMA): the callbacks still
 * run with -ECANCELED, and the endpoint is left, never progressed again,
 * to the process's exit; memory it was given is no longer touched.
 * shm (libfabric 1.17) caveat: a peer that later progresses a first-contact
 * request from an endpoint closed this way crashes in the provider, and in
 * one process two shm endpoints must not close with traffic pending between
 * them. tessera runs one endpoint per process, and abandons only stalled
 * peers it is dropping anyway.
 */
void fab_close(struct fab_ctx *ctx);

/* Copies this endpoint's raw address into buf (cap bytes); *len gets its
 * size. -ENOBUFS (with *len set) when cap is too small. */
int fab_getname(const struct fab_ctx *ctx, void *buf, size_t cap, size_t *len);

/* The provider actually opened (e.g. "tcp;ofi_rxm"), its mr_mode bits, the
 * largest single RMA transfer. Borrowed; cannot fail. */
const char *fab_provider(const struct fab_ctx *ctx);
uint64_t fab_mr_mode(const struct fab_ctx *ctx);
size_t fab_max_rma(const struct fab_ctx *ctx);
/* Remote ranges one fab_readv may gather: the provider's rma_iov_limit,
 * at most FAB_SEGS_MAX, at least 1. Cannot fail. */
size_t fab_rma_segs(const struct fab_ctx *ctx);
/* One line: provider, fabric, domain, mr_mode bits, progress, wait fd. */
void fab_describe(const struct fab_ctx *ctx, char *buf, size_t cap);
/* Names of the mr_mode bits set in mode, e.g. "FI_MR_LOCAL|FI_MR_VIRT_ADDR"
 * ("none" when 0). */
void fab_mr_mode_str(uint64_t mode, char *buf, size_t cap);

/* Counters since open. Cannot fail. */
void fab_stats(const struct fab_ctx *ctx, struct fab_stats *out);

/*
 * Turns a peer's address bytes (hostile: checked against the provider's
 * address format and FAB_ADDR_MAX) into *out. -EINVAL for malformed bytes.
 * Inserting the same address twice gives two handles to one peer.
 */
int fab_av_insert(struct fab_ctx *ctx, const void *addr, size_t len,
		  fi_addr_t *out);
/* Gives back one handle. Inserting the same address twice gives two
 * handles to one peer (and one connection); when the last handle goes, the
 * peer is forgotten: its connection is closed (a later insert connects
 * afresh, never reusing one the provider has not yet seen die), ops parked
 * for it fail with -ECONNABORTED at the next fab_poll, and ops in flight to
 * it complete with -ECONNABORTED (or their result, if it came first); the
 * connection is closed only once none of them is with the provider (a new
 * insert before then keeps it).
 * -ENOENT for a handle that is not held. */
int fab_av_remove(struct fab_ctx *ctx, fi_addr_t addr);

/* Access a region is registered for (any combination). */
#define FAB_MR_REMOTE_READ  0x1u /* peers fab_read from it (serving) */
#define FAB_MR_REMOTE_WRITE 0x2u /* peers fab_write into it */
#define FAB_MR_READ         0x4u /* local destination of our fab_read */
#define FAB_MR_WRITE        0x8u /* local source of our fab_write */

/*
 * Registers [buf, buf+len) (len > 0; memory allocated by the caller, who
 * keeps it alive until fab_mr_close). On failure *out is NULL and nothing
 * is registered. The region belongs to ctx; fab_close frees one left open.
 */
int fab_mr_reg(struct fab_ctx *ctx, void *buf, size_t len, unsigned access,
	       struct fab_mr **out);
/* Whether ctx was opened with FI_HMEM (FAB_F_HMEM_CUDA, and the provider
 * offers it: shm and verbs/efa builds with CUDA do, tcp;ofi_rxm does not). */
bool fab_hmem_cuda(const struct fab_ctx *ctx);
/* Registers len bytes of CUDA device memory (cudaMalloc'ed on device dev)
 * like fab_mr_reg. -EOPNOTSUPP when ctx has no FI_HMEM: the caller then
 * stages through registered host memory. */
int fab_mr_reg_cuda(struct fab_ctx *ctx, void *dptr, size_t len, unsigned access, int dev,
		    struct fab_mr **out);
/* Deregisters; no op may be in flight on it. NULL is fine; cannot fail. */
void fab_mr_close(struct fab_mr *mr);
/* The region's base and length. */
void *fab_mr_buf(const struct fab_mr *mr);
size_t fab_mr_len(const struct fab_mr *mr);
/* What a peer needs to access the region. Cannot fail. */
void fab_mr_rkey(const struct fab_mr *mr, struct fab_rkey *out);

/* Serialises an rkey as three little-endian u64 (addr, key, len). */
void fab_rkey_pack(const struct fab_rkey *rk, uint8_t out[FAB_RKEY_LEN]);
/* Parses FAB_RKEY_LEN bytes (hostile); -EINVAL on a wrong length or an
 * addr+len that wraps. */
int fab_rkey_unpack(const uint8_t *buf, size_t len, struct fab_rkey *out);

/*
 * Posts a one-sided read of len bytes at offset roff of the peer's region
 * rk into local region lmr at loff (lmr registered with FAB_MR_READ), or a
 * write the other way (lmr with FAB_MR_WRITE; the peer's region with
 * FAB_MR_REMOTE_WRITE). A write's completion means the bytes are in the
 * peer's memory (FI_DELIVERY_COMPLETE) where the provider offers it, else
 * that our buffer may be reused.
 * Returns 0 (cb will run exactly once), -ERANGE when either range falls
 * outside its region (checked here against rk->len, the peer still checks
 * its own), -EACCES when lmr lacks the access, -EMSGSIZE above
 * fab_max_rma, -ESHUTDOWN while closing, other negative errno from the
 * provider. A range the peer refuses (bad key, past its region) completes
 * with a negative status (-EREMOTEIO on tcp;ofi_rxm, which also drops the
 * connection: fab_av_remove and re-insert the peer before using it again).
 * shm (1.17) checks neither keys nor ranges: it is for peers on one host
 * that already trust each other; a read from an unmapped address there
 * never completes.
 */
int fab_read(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	     size_t loff, size_t len, fi_addr_t peer,
	     const struct fab_rkey *rk, uint64_t roff, fab_cb cb);
int fab_write(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, size_t len, fi_addr_t peer,
	      const struct fab_rkey *rk, uint64_t roff, fab_cb cb);

/* One remote range of a gathering read: offset into the region, length. */
struct fab_seg {
	uint64_t roff, len;
};
#define FAB_SEGS_MAX 4

/*
 * A gathering read: the n ranges segs (offsets into rk's region, n at most
 * fab_rma_segs(ctx)) land back to back in lmr from loff, as one operation
 * (fi_readmsg with n remote iovs): reading many short ranges costs a
 * quarter of the operations, and no bytes between them. segs is the
 * caller's and must stay untouched until the callback ran (a parked op is
 * issued again from it). Returns as fab_read, and -EINVAL for n == 0, more
 * than fab_rma_segs, or an empty range; op->len is the sum.
 */
int fab_readv(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, fi_addr_t peer, const struct fab_rkey *rk,
	      const struct fab_seg *segs, size_t n, fab_cb cb);

/*
 * Sends len <= FAB_MSG_MAX bytes with a 64-bit tag. buf is copied before
 * this returns (the caller keeps ownership). -EMSGSIZE when too long,
 * -ENOBUFS when every message buffer is in use, else as fab_read.
 */
int fab_tsend(struct fab_ctx *ctx, struct fab_op *op, fi_addr_t peer,
	      uint64_t tag, const void *buf, size_t len, fab_cb cb);
/*
 * Posts a receive for a message from any peer whose tag matches tag in the
 * bits not set in ignore. On completion the payload is copied into buf
 * (cap bytes, caller-owned, alive until completion), op->len and op->tag
 * are set; a message longer than cap completes with -EMSGSIZE (first cap
 * bytes kept). Errors as fab_tsend.
 */
int fab_trecv(struct fab_ctx *ctx, struct fab_op *op, uint64_t tag,
	      uint64_t ignore, void *buf, size_t cap, fab_cb cb);
/* Asks the provider to cancel a posted receive; its callback then runs with
 * -ECANCELED from a later fab_poll (or 0 if it matched first). RMA and
 * sends cannot be cancelled; abandon them with fab_close. */
int fab_cancel(struct fab_ctx *ctx, struct fab_op *op);

/*
 * Drives progress: reads up to max completions (max 0: all there are),
 * retries parked posts, and runs the callbacks of finished ops (including
 * any reaped earlier by a posting call). Every 250 ms it also sweeps the
 * connections to the endpoint's port (tcp providers, fabric/conns.c): one
 * that has not completed the provider's handshake in
 * TESSERA_FAB_HANDSHAKE_MS, and those over TESSERA_FAB_PENDING_MAX,
 * TESSERA_FAB_CONNS_PER_ADDR or TESSERA_FAB_CONNS_MAX (the busiest
 * address's first), are shut down. Returns the number of callbacks
 * run, or a negative errno if the CQ failed.
 */
int fab_poll(struct fab_ctx *ctx, int max);
/*
 * Polls until op has completed (op NULL: until nothing is in flight), or
 * timeout_ms (< 0: no limit) passes. Returns op's status (0 for NULL), or
 * -ETIMEDOUT with the op still in flight (it stays owned by ctx until it
 * completes or ctx is closed), -EINVAL for an op that was never posted.
 * Not for ops whose callback frees them. Progresses only this context: a
 * peer in the same thread must be polled by the caller instead.
 */
int fab_wait(struct fab_ctx *ctx, struct fab_op *op, int timeout_ms);
/* Ops posted (or parked) and not yet completed. */
size_t fab_inflight(const struct fab_ctx *ctx);
/* No read, write or send of ours is with the provider, parked or awaiting
 * its callback (posted receives do not count): nothing of ours needs
 * progress, only what peers may ask of us. */
bool fab_quiet(const struct fab_ctx *ctx);
/* Posts parked on a busy or unreachable peer: only fab_poll retries them,
 * so a caller blocking on the wait fd must also poll on a timer. */
bool fab_parked(const struct fab_ctx *ctx);

/* The CQ's wait fd for an event loop (read-ready means: call fab_poll), or
 * -ENOSYS when the provider gives none (poll on a timer instead). Owned by
 * ctx; do not close or read it. */
int fab_wait_fd(const struct fab_ctx *ctx);
/* 0 when it is safe to block on fab_wait_fd now; -EAGAIN when completions
 * or progress are pending (call fab_poll first); -ENOSYS without an fd.
 * Parked posts do not count: while fab_inflight() > 0, a blocking caller
 * also wakes on a timer so fab_poll can retry them. */
int fab_trywait(struct fab_ctx *ctx);

#endif
