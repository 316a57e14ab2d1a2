/*
 * libtessera-client: how a serving process reaches the weights a tessera
 * node serves on its host (static libtessera-client.a, shared
 * libtessera-client.so; depends on libc only).
 *
 *   tessera_client *c;
 *   char err[256];
 *   if (tessera_attach("/run/tessera/A-0.sock", "A", 0, 10000, &c, err, sizeof(err)))
 *           die(err);
 *   tessera_wait_version(c, 1, 60000);      // a version is active
 *   struct tessera_pin pin;
 *   tessera_acquire(c, &pin);               // a request starts: pin
 *   const struct tessera_tensor *t = tessera_find(c, "model.layers.0.self_attn.o_proj.weight");
 *   const void *w = pin.base + t->offset;   // the pinned version's bytes
 *   ...
 *   tessera_release(c, &pin);               // the request ends
 *
 * A pin keeps its version's memory valid and unchanged until it is
 * released, however many versions become active meanwhile; new acquires
 * get the newest. When the client detaches (or dies) its pins are dropped.
 * Acquire and release go through memory shared with the node (an epoch
 * page naming the active version, and this client's pin counters; see
 * wire.h, protocol 2): no syscall and no round trip to the node, except
 * the first acquire of a new version, which reads its announcement (and
 * maps it) from the socket. Older nodes are asked over the socket.
 *
 * The library is synchronous and not thread-safe: one thread per client (or
 * a lock around it). Notifications of new versions arrive on the socket and
 * are handled whenever the client reads it: in an acquire that finds a new
 * version admitted, in tessera_wait_version(), or explicitly with
 * tessera_poll() when tessera_fd() is readable (for an event loop).
 * Functions returning int return 0 or a negative errno; tessera_error()
 * then says why in one line.
 */
#ifndef TESSERA_CLIENT_H
#define TESSERA_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TESSERA_DIMS_MAX 8

typedef struct tessera_client tessera_client;

/* Where part of a local tensor comes from: a box of one model tensor (the
 * checkpoint's, under its own name). A plain shard is one piece; a fused
 * tensor (tpN's qkv_proj, gate_up_proj) is its parts in order along the
 * local tensor's concat_dim. */
struct tessera_piece {
	const char *name;   /* the model tensor */
	uint32_t ndim;
	uint64_t shape[TESSERA_DIMS_MAX]; /* the whole model tensor's */
	uint64_t lo[TESSERA_DIMS_MAX], hi[TESSERA_DIMS_MAX]; /* the box, hi exclusive */
	uint64_t base;      /* the piece's first element in the local tensor */
	int flat;           /* a run lo[0]..hi[0] of the flattened tensor instead */
};

/* One local tensor of the rank: where it lies in a version's memory. */
struct tessera_tensor {
	const char *name;
	const char *dtype;  /* "bf16", "fp16", "fp32", ... */
	uint32_t ndim;
	uint64_t shape[TESSERA_DIMS_MAX];
	uint64_t offset;    /* bytes from the start of the version's memory */
	uint64_t nbytes;
	/* Where it comes from (npieces 0: the node did not say). */
	uint32_t concat_dim;
	uint32_t npieces;
	const struct tessera_piece *pieces;
	/* An FP8 tensor served block-scaled (fp8_e4m3_block128: one FP32
	 * scale per 128 x 128 block, dequantized as value * scale): the name of
	 * the local tensor holding its scales, "<name>_scale_inv", shaped
	 * ceil(rows/128) x ceil(cols/128); NULL for any other tensor. */
	const char *scale;
};

/* A version as the node sent it. */
struct tessera_version {
	uint64_t version;
	uint64_t size;          /* bytes */
	uint8_t digest[32];     /* the signed manifest's digest */
	int store;              /* 0 host, 1 cuda */
	int cuda_device;        /* -1 on host */
	/* cudaIpcMemHandle_t in GPU mode: the serving process copies it into
	 * one and calls cudaIpcOpenMemHandle on cuda_device (this library
	 * itself links libc only); the tensor table's offsets hold there. */
	uint8_t cuda_ipc_handle[64];
	int memfd;              /* the host copy; the client owns it */
	const uint8_t *host;    /* mapped read-only (NULL when size is 0) */
};

/* One request's hold on a version: version is what the request ran on (to
 * record with its trajectory, with the version's manifest digest from
 * tessera_version_info()). base is valid until the pin is released, and
 * not after: the node may then write a later version into the same memory
 * (it reuses retired slots, and an in-place node writes the served one). A
 * client with tessera_guard() on makes that a fault instead of a silent
 * read of another version. */
struct tessera_pin {
	uint64_t id;
	uint64_t version;
	const uint8_t *base;    /* host bytes of the version (NULL when empty) */
	uint64_t size;
	uint64_t acquired_ms;   /* wall clock (ms since the epoch) when the node granted it */
};

/*
 * Connects to the node's attach socket and attaches to (replica, rank); the
 * node refuses (with a reason, in err) a replica or rank it does not serve.
 * timeout_ms bounds every wait for a reply from here on. On failure *out is
 * NULL.
 */
int tessera_attach(const char *path, const char *replica, uint32_t rank, int timeout_ms,
		   tessera_client **out, char *err, size_t errlen);

/*
 * The same with flags. TESSERA_HOLD: the node holds every version it sends
 * this client (the active one at attach, then each new one) until the
 * client drops it, so that an engine can switch all its ranks to one
 * version at its own step boundary, whatever moment each node activated
 * it: each worker holds what its rank prepared, the engine agrees on a
 * version every rank holds (the newest one all hold), each worker pins
 * exactly that one (tessera_acquire_version) and drops the older ones
 * (tessera_drop). A node holds at most TESSERA_ATTACH_HOLDS versions for a
 * client (each is a copy of the rank); past it, its oldest hold goes. A
 * node that installs in place has one copy and holds nothing
 * (tessera_holding() is 0): there, every rank pauses its requests while it
 * writes the next version, so an engine checks that its workers' pins agree.
 */
#define TESSERA_HOLD 1u
int tessera_attach_flags(const char *path, const char *replica, uint32_t rank, int timeout_ms,
			 unsigned flags, tessera_client **out, char *err, size_t errlen);
/* 1 when the node holds versions for this client (TESSERA_HOLD granted). */
int tessera_holding(const tessera_client *c);
/* 1 when the node installs versions in place (one copy, no second slot). */
int tessera_in_place(const tessera_client *c);
/* The versions this client can pin by number, ascending: those held for it
 * and the active one. Fills at most max, returns how many there are. */
size_t tessera_prepared(const tessera_client *c, uint64_t *out, size_t max);
/* Pins version (held, or active) for a request: 0, or -ENOENT when this
 * client neither holds it nor sees it active. No syscall for a held version. */
int tessera_acquire_version(tessera_client *c, uint64_t version, struct tessera_pin *out);
/* Lets a held version go (its running pins keep it until released). */
int tessera_drop(tessera_client *c, uint64_t version);
/* on 1: when this client's last pin of a version is released, its memory
 * is made inaccessible (PROT_NONE) until the version is pinned again, so a
 * pointer kept past release faults instead of reading whatever the node
 * writes there next. Costs two mprotect calls per request that finds its
 * version unpinned. Host memory only. */
void tessera_guard(tessera_client *c, int on);
/* Closes the connection (the node drops its pins) and unmaps everything:
 * pointers from this client are invalid after. NULL is fine. */
void tessera_detach(tessera_client *c);

/* The tensor table of the rank; pointers live as long as the client. */
size_t tessera_ntensors(const tessera_client *c);
const struct tessera_tensor *tessera_tensor(const tessera_client *c, size_t i);
const struct tessera_tensor *tessera_find(const tessera_client *c, const char *name);
/* Bytes of the rank's block; 0 host store, 1 cuda. */
uint64_t tessera_block_size(const tessera_client *c);
int tessera_store(const tessera_client *c);

/* The newest version the node said is active (0: none yet), as far as
 * the client has read the socket (see tessera_poll). */
uint64_t tessera_active(const tessera_client *c);
/* A version this client still holds (active, or pinned); NULL otherwise. */
const struct tessera_version *tessera_version_info(const tessera_client *c, uint64_t version);

/* Pins the active version for a request; -EAGAIN when none is active yet.
 * While the node installs a version in place (admission paused) it waits
 * for that version, at most the client's timeout (then -EBUSY). */
int tessera_acquire(tessera_client *c, struct tessera_pin *out);
/* Ends the request: the pin's memory may be unmapped after. */
int tessera_release(tessera_client *c, const struct tessera_pin *pin);

/* Waits until a version >= min is active: 0, -ETIMEDOUT, or an error. */
int tessera_wait_version(tessera_client *c, uint64_t min, int timeout_ms);
/* Handles notifications waiting on the socket, waiting at most timeout_ms
 * for the first (0: do not wait). Returns how many new versions arrived. */
int tessera_poll(tessera_client *c, int timeout_ms);
/* The socket, to watch for readability in an event loop (then tessera_poll). */
int tessera_fd(const tessera_client *c);
/* Called (from inside any client call) when a new version becomes active. */
typedef void (*tessera_version_cb)(tessera_client *c, uint64_t version, void *arg);
void tessera_on_version(tessera_client *c, tessera_version_cb cb, void *arg);

/* The last error, one line. */
const char *tessera_error(const tessera_client *c);

/* The tessera release this library is ("0.1.0"; pkg-config's
 * --modversion tessera-client says the same). Static; cannot fail. */
const char *tessera_client_version(void);

#ifdef __cplusplus
}
#endif

#endif
