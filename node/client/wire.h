/*
 * The attach protocol between a node and the serving processes on its host,
 * over a local Unix stream socket. Shared by the node's server (node/serve/attach.c)
 * and libtessera-client; it depends on nothing but libc.
 *
 * Every message is a frame: an 8-byte header (u32 payload length, u16 type,
 * u16 zero; little-endian) and the payload. Integers are little-endian.
 *
 *   client -> node
 *     ATTACH   u16 protocol (1..3), u16 replica length, u32 rank, replica
 *              bytes; protocol 3 adds u32 flags (TSR_ATTACH_HOLD).
 *              Must be the first message; the node answers ATTACHED, then a
 *              VERSION for the active version if there is one.
 *     ACQUIRE  empty: pin the active version for one request. Protocol 3:
 *              or u64 version: pin that version, which must be active or
 *              held for this client (else a survivable ERROR).
 *     RELEASE  u64 pin id.
 *     UNPIN    empty (protocol 2): look at this client's pin page again.
 *     DROP     u64 version (protocol 3): let go of a held version (no
 *              reply; one not held is a fatal error).
 *
 *   node -> client
 *     ATTACHED u64 active version (0: none; its VERSION follows), u32 tensors, u64 bytes of the rank's block, 32-byte layout
 *              digest, u8 store (0 host, 1 cuda), then per tensor: u16 name
 *              length, name, u8 dtype length, dtype name, u8 ndim,
 *              ndim x u64 shape, u64 offset, u64 bytes.
 *              Protocol 3 adds, after the store byte, u8 install (0 double-
 *              buffered, 1 in place) and u8 holding (1: the node holds the
 *              versions it sends this client, TSR_ATTACH_HOLD granted), and
 *              per tensor, after its bytes, where it comes from: u8 concat
 *              dim, u16 pieces, per piece u16 name length, the model
 *              tensor's name, u8 flat, u8 ndim, ndim x u64 the model
 *              tensor's shape, ndim x u64 lo, ndim x u64 hi (the box of the
 *              model tensor the piece holds, hi exclusive; a flat piece: the
 *              run lo[0]..hi[0] of the flattened tensor) and u64 base (the
 *              piece's first element in the local tensor).
 *     VERSION  u64 version, u64 bytes, 32-byte manifest digest, u8 store,
 *              i32 CUDA device (-1 host), 64-byte CUDA IPC handle (zero on
 *              host); the slot's memfd rides along (SCM_RIGHTS). Sent when
 *              a version becomes active; it precedes every reply naming it.
 *     ACQUIRED u64 pin id, u64 version.
 *     RELEASED u64 pin id.
 *     DROPPED  u64 version (protocol 3): the node let go of a hold, the
 *              oldest, as this client held more than TESSERA_ATTACH_HOLDS.
 *     ERROR    u8 fatal, u16 length, reason. Fatal (1): the node closes the
 *              connection after it (and drops the client's pins). 2: an
 *              ACQUIRE found admission paused (the node installs a version
 *              in place): ask again after the next VERSION.
 *
 * A client's pins are dropped when its socket closes: a client that
 * disappears cannot hold a version forever.
 *
 * Protocol 2: acquire and release without a round trip. A client that
 * attaches with protocol 2 is also sent, right after ATTACHED, two PAGES
 * frames, each with a memfd of TSR_PAGE_SIZE bytes:
 *
 *     PAGES    u8 kind, u32 bytes; the memfd rides along (SCM_RIGHTS).
 *     kind 0, the epoch page, one for the whole node, mapped read-only:
 *              u64 magic TSR_EPOCH_MAGIC at 0; u64 state at 8, written by
 *              the node with one atomic store: active version << 8 | entry
 *              (entry TSR_ENTRY_NONE: no admission, i.e. nothing active,
 *              or paused by an in-place install; TSR_ENTRY_SOCKET: the
 *              active version has no entry, ACQUIRE it over the socket).
 *     kind 1, the client's pin page, its own, mapped read-write: u32
 *              pins[TSR_ENTRIES] at 0 and u64 requests[TSR_ENTRIES] at
 *              TSR_PAGE_REQUESTS, written by the client only; u32 revoked
 *              at TSR_PAGE_REVOKED, set by the node when it drops the
 *              client (its pins no longer count: read the socket's ERROR).
 *
 * Every version a protocol-2 client is sent has an entry (0 ..
 * TSR_ENTRIES - 1): its VERSION frame carries u8 entry after the CUDA
 * handle (TSR_WIRE_VERSION2_LEN). The node sends a version's VERSION frame
 * before it stores the state naming it, and keeps an entry for one version
 * until no client pins it. A request:
 *     acquire  s = state; if s names a version older than the newest
 *              VERSION received, ACQUIRE over the socket (the node is
 *              between sending and storing); the entry's version mapped
 *              (else read the socket for its VERSION, already sent);
 *              pins[entry] += 1 (atomic,
 *              sequentially consistent); requests[entry] += 1; read state
 *              again: equal to s, the request runs on s's version; else
 *              pins[entry] -= 1 and start over.
 *     release  pins[entry] -= 1 (atomic, sequentially consistent); read
 *              state: if admission is paused (an in-place install waits
 *              for its pins to drain), send UNPIN (no payload, no reply)
 *              so that the node looks again at once. A retired version's
 *              pins the node looks at by itself, every
 *              TESSERA_ATTACH_SCAN_MS: no wake-up of the node at a switch.
 *              (acquire's "start over" does the same.)
 * The node stores a new state, then reads the pins of what it retires
 * (sequentially consistent): either it sees a pin, or the client sees the
 * new state. A switch is one store; acquire and release are a few memory
 * operations and no syscall. The socket ACQUIRE/RELEASE stay valid.
 * The node counts a version's pins as the socket pins plus the pins[entry]
 * of every open pin page; a page's counts stop counting when its client's
 * socket closes (or the node drops it).
 *
 * Protocol 3: holds, for an engine that switches a replica's ranks
 * together. A client attached with TSR_ATTACH_HOLD (on a double-buffered
 * node; an in-place node says holding 0) has every version it is sent held
 * for it: the version stays, with its entry, until the client DROPs it (or
 * closes), whatever the node activates meanwhile. Its VERSION frames carry
 * u8 held after the entry (TSR_WIRE_VERSION3_LEN). A held version with an
 * entry is pinned through the pin page without looking at the state: the
 * hold keeps it. The node holds at most TESSERA_ATTACH_HOLDS versions for a
 * client; past that it drops the oldest and says so (DROPPED).
 */
#ifndef TESSERA_CLIENT_WIRE_H
#define TESSERA_CLIENT_WIRE_H

#include <stdint.h>
#include <string.h>

#define TSR_WIRE_PROTOCOL 3 /* what the client speaks; nodes take 1 to 3 */
#define TSR_WIRE_HDR 8
/* Largest client message a node reads (before anything is allocated). */
#define TSR_WIRE_REQ_MAX 1024
/* Largest node message a client reads (the tensor table of big models). */
#define TSR_WIRE_REPLY_MAX (256u << 20)
#define TSR_WIRE_NAME_MAX 255
#define TSR_WIRE_DIMS_MAX 8
#define TSR_WIRE_VERSION_LEN (8 + 8 + 32 + 1 + 4 + 64)
#define TSR_WIRE_VERSION2_LEN (TSR_WIRE_VERSION_LEN + 1)
#define TSR_WIRE_VERSION3_LEN (TSR_WIRE_VERSION_LEN + 2)

/* ATTACH's flags (protocol 3). */
#define TSR_ATTACH_HOLD 1u

/* Protocol 2's shared pages. */
#define TSR_PAGE_SIZE 4096
#define TSR_ENTRIES 64
#define TSR_ENTRY_NONE 0xff   /* state: nothing admitted (none active, or paused) */
#define TSR_ENTRY_SOCKET 0xfe /* state: the active version has no entry: ACQUIRE it */
#define TSR_EPOCH_MAGIC 0x48434f5045525354ull /* "TSREPOCH" */
#define TSR_EPOCH_STATE 8      /* byte offset of the state word */
#define TSR_PAGE_REQUESTS 256  /* byte offset of requests[] in a pin page */
#define TSR_PAGE_REVOKED 4092  /* u32 in a pin page: the node dropped this client */
#define TSR_PAGE_EPOCH 0
#define TSR_PAGE_PINS 1

/* ERROR's first byte. */
#define TSR_ERR_SURVIVABLE 0
#define TSR_ERR_FATAL 1
#define TSR_ERR_PAUSED 2

enum tsr_wire_type {
	TSR_MSG_ATTACH = 1,
	TSR_MSG_ATTACHED = 2,
	TSR_MSG_VERSION = 3,
	TSR_MSG_ACQUIRE = 4,
	TSR_MSG_ACQUIRED = 5,
	TSR_MSG_RELEASE = 6,
	TSR_MSG_RELEASED = 7,
	TSR_MSG_ERROR = 8,
	TSR_MSG_PAGES = 9,
	TSR_MSG_UNPIN = 10,
	TSR_MSG_DROP = 11,
	TSR_MSG_DROPPED = 12,
};

static inline void tsr_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void tsr_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline void tsr_put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t tsr_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t tsr_get32(const uint8_t *p)
{
	uint32_t v = 0;
	for (int i = 3; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline uint64_t tsr_get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline void tsr_put_hdr(uint8_t *p, uint32_t len, uint16_t type)
{
	tsr_put32(p, len);
	tsr_put16(p + 4, type);
	tsr_put16(p + 6, 0);
}

/* A bounded reader over a payload: every take checks what is left. */
struct tsr_rd {
	const uint8_t *p;
	size_t left;
	int bad;
};

static inline const uint8_t *tsr_take(struct tsr_rd *r, size_t n)
{
	const uint8_t *p = r->p;
	if (r->bad || n > r->left) {
		r->bad = 1;
		return NULL;
	}
	r->p += n;
	r->left -= n;
	return p;
}

static inline uint64_t tsr_take_int(struct tsr_rd *r, size_t n)
{
	const uint8_t *p = tsr_take(r, n);
	if (p == NULL)
		return 0;
	return n == 1 ? p[0] : n == 2 ? tsr_get16(p) : n == 4 ? tsr_get32(p) : tsr_get64(p);
}

#endif
