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
 * Wire format (little endian), version 2:
 *   0  u32  magic 0x56414854 ("THAV")
 *   4  u8   format (2)
 *   5  u8   upload peers: readers the node serves at once (0: any)
 *   6  u16  header bytes (64)
 *   8  u64  policy version
 *   16 u32  chunks in the parcel (n, at most PROTO_HAVE_MAX_CHUNKS)
 *   20 u32  src_rank
 *   24 u32  dst_rank
 *   28 u32  upload rate the node allows its readers together, Mbit/s (0: any)
 *   32 u64  slot address, 40 u64 slot key, 48 u64 slot length: where the
 *           parcel's bytes are served (0 length: right after the page)
 *   56 u32  slot ranges: the most ranges of the slot a chunk served from it
 *           spans (one gathering read takes them); 60 u32 reserved (0)
 *   64      have bits: ceil(n/8) bytes, chunk c is bit c%8 of byte c/8
 *   ..      busy bits: the same
 * The page occupies proto_have_page(n) bytes (page-rounded). The parcel's
 * bytes follow it, or, with a slot, each chunk that lies in at most "slot
 * ranges" ranges of the node's version slot (its rank's memory in the
 * destination layout, where the verifier scattered the chunk: no second
 * copy) is served from there: a reader gathers it from the spans that
 * proto_parcel_spans gives for the chunk's payload, as one fab_readv. A
 * chunk that spans more ranges is still copied after the page. The slot
 * fields are a fab_rkey (address, key, length) like the offer's, and as
 * hostile as any peer's bytes. A reader checks every field against what
 * it expects (its manifest says n and the ranks): a page that is
 * truncated, declares more chunks than the cap or than it carries, has a
 * slot range that wraps, or has another magic or format is refused with a one-line reason. The upload budget (bytes 5
 * and 28, once reserved and 0: "no budget") is the node's word on how
 * much it serves; readers keep it (reads are one-sided, the node cannot).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

#define PROTO_HAVE_MAGIC 0x56414854u
#define PROTO_HAVE_FORMAT 2
#define PROTO_HAVE_HEADER 64
#define PROTO_HAVE_MAX_CHUNKS (1u << 20)

struct proto_have {
	uint64_t version;
	uint32_t nchunks, src_rank, dst_rank;
	uint32_t upload_peers, upload_mbps; /* the node's upload budget (0: none) */
	uint64_t slot_addr, slot_key, slot_len; /* bytes served from the slot (len 0: after the page) */
	uint32_t slot_ranges; /* chunks over this many slot ranges follow the page */
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

/* Announces that the parcel's chunks that lie in at most ranges ranges of
 * the registered slot (addr, key, len: its fab_rkey) are served from it
 * rather than after the page. Cannot fail. */
void proto_have_set_slot(uint8_t *page, uint64_t addr, uint64_t key, uint64_t len,
			 uint32_t ranges);

/* Sets or clears chunk c's bit in a page built by proto_have_init. */
void proto_have_mark(uint8_t *page, uint32_t c, bool have, bool on);

/* Parses len hostile bytes. -EINVAL (truncated, bad magic, oversized
 * count, a slot range that wraps), -EPROTO (another format); err says which in one line. out points
 * into buf. */
int proto_have_parse(const uint8_t *buf, size_t len, struct proto_have *out, struct proto_err *err);

/* Whether bit c is set in a bitmap of a parsed page. */
static inline bool proto_have_bit(const uint8_t *bits, uint32_t c)
{
	return (bits[c / 8] >> (c % 8)) & 1u;
}

#endif
