/* Have-pages: which chunks of a parcel a peer holds, as peers read them. */
#ifndef PROTO_HAVE_H
#define PROTO_HAVE_H

/*
 * A node serving a parcel keeps, in front of the parcel's bytes and in the
 * same registered region, one have-page: a small header and two bitmaps,
 * "have" (the chunk verified against the signed manifest and copied here:
 * readers may take it) and "busy" (the node is fetching the chunk now, so
 * another reader need not ask the trainer for it). Peers of the swarm read
 * the page with a one-sided read, every TESSERA_HAVE_POLL_MS, and fetch
 * only chunks whose have bit is set. Bits only go from 0 to 1 while a
 * version is served (busy bits are cleared when the chunk is had or its
 * read given up), so a page read while it changes is merely old.
 *
 * Wire format (little endian), version 1:
 *   0  u32  magic 0x56414854 ("THAV")
 *   4  u8   format (1)
 *   5  u8   upload peers: readers the node serves at once (0: any)
 *   6  u16  header bytes (32)
 *   8  u64  policy version
 *   16 u32  chunks in the parcel (n, at most PROTO_HAVE_MAX_CHUNKS)
 *   20 u32  src_rank
 *   24 u32  dst_rank
 *   28 u32  upload rate the node allows its readers together, Mbit/s (0: any)
 *   32      have bits: ceil(n/8) bytes, chunk c is bit c%8 of byte c/8
 *   ..      busy bits: the same
 * The page occupies proto_have_page(n) bytes (page-rounded); the parcel's
 * bytes follow it. A reader checks every field against what it expects
 * (its manifest says n and the ranks): a page that is truncated, declares
 * more chunks than the cap or than it carries, or has another magic or
 * format is refused with a one-line reason. The upload budget (bytes 5
 * and 28, once reserved and 0: "no budget") is the node's word on how
 * much it serves; readers keep it (reads are one-sided, the node cannot).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

#define PROTO_HAVE_MAGIC 0x56414854u
#define PROTO_HAVE_FORMAT 1
#define PROTO_HAVE_HEADER 32
#define PROTO_HAVE_MAX_CHUNKS (1u << 20)

struct proto_have {
	uint64_t version;
	uint32_t nchunks, src_rank, dst_rank;
	uint32_t upload_peers, upload_mbps; /* the node's upload budget (0: none) */
	const uint8_t *have, *busy; /* ceil(nchunks/8) bytes each, inside the parsed buffer */
};

/* Bytes of the header and bitmaps for n chunks; the page: that rounded up
 * to 4096. Cannot fail (n is at most PROTO_HAVE_MAX_CHUNKS). */
size_t proto_have_bytes(uint32_t n);
size_t proto_have_page(uint32_t n);

/* Writes an empty page for the parcel into buf (cap >= proto_have_bytes(n));
 * -EINVAL when n is over the cap or buf too small. */
int proto_have_init(uint8_t *buf, size_t cap, uint64_t version, uint32_t nchunks,
		    uint32_t src_rank, uint32_t dst_rank);

/* Announces the node's upload budget on a page built by proto_have_init:
 * peers (more than 255: 255) and Mbit/s, 0 for none. Cannot fail. */
void proto_have_set_budget(uint8_t *page, uint64_t peers, uint64_t mbps);

/* Sets or clears chunk c's bit in a page built by proto_have_init. */
void proto_have_mark(uint8_t *page, uint32_t c, bool have, bool on);

/* Parses len hostile bytes. -EINVAL (truncated, bad magic, oversized
 * count), -EPROTO (another format); err says which in one line. out points
 * into buf. */
int proto_have_parse(const uint8_t *buf, size_t len, struct proto_have *out, struct proto_err *err);

/* Whether bit c is set in a bitmap of a parsed page. */
static inline bool proto_have_bit(const uint8_t *bits, uint32_t c)
{
	return (bits[c / 8] >> (c % 8)) & 1u;
}

#endif
