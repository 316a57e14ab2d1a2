/* Have-pages: encoding and parsing (see have.h). */
#include "proto/have.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static size_t bits_len(uint32_t n)
{
	return ((size_t)n + 7) / 8;
}

size_t proto_have_bytes(uint32_t n)
{
	return PROTO_HAVE_HEADER + 2 * bits_len(n);
}

size_t proto_have_page(uint32_t n)
{
	return (proto_have_bytes(n) + 4095) / 4096 * 4096;
}

int proto_have_init(uint8_t *buf, size_t cap, uint64_t version, uint32_t nchunks,
		    uint32_t src_rank, uint32_t dst_rank)
{
	if (nchunks > PROTO_HAVE_MAX_CHUNKS || cap < proto_have_bytes(nchunks))
		return -EINVAL;
	memset(buf, 0, proto_have_bytes(nchunks));
	put32(buf, PROTO_HAVE_MAGIC);
	buf[4] = PROTO_HAVE_FORMAT;
	buf[6] = PROTO_HAVE_HEADER;
	put64(buf + 8, version);
	put32(buf + 16, nchunks);
	put32(buf + 20, src_rank);
	put32(buf + 24, dst_rank);
	return 0;
}

void proto_have_set_budget(uint8_t *page, uint64_t peers, uint64_t mbps)
{
	page[5] = (uint8_t)PROTO_MIN(peers, 255);
	put32(page + 28, (uint32_t)PROTO_MIN(mbps, UINT32_MAX));
}

void proto_have_set_slot(uint8_t *page, uint64_t addr, uint64_t key, uint64_t len,
			 uint32_t ranges)
{
	put64(page + 32, addr);
	put64(page + 40, key);
	put64(page + 48, len);
	put32(page + 56, ranges);
}

void proto_have_mark(uint8_t *page, uint32_t c, bool have, bool on)
{
	uint8_t *bits = page + PROTO_HAVE_HEADER + (have ? 0 : bits_len(get32(page + 16)));
	uint8_t m = (uint8_t)(1u << (c % 8));

	if (on)
		bits[c / 8] |= m;
	else
		bits[c / 8] &= (uint8_t)~m;
}

int proto_have_parse(const uint8_t *buf, size_t len, struct proto_have *out, struct proto_err *err)
{
	uint32_t n;

	memset(out, 0, sizeof(*out));
	if (len < PROTO_HAVE_HEADER)
		return proto_errf(err, EINVAL, "have-page: truncated (%zu bytes, header is %d)", len,
				  PROTO_HAVE_HEADER);
	if (get32(buf) != PROTO_HAVE_MAGIC)
		return proto_errf(err, EINVAL, "have-page: bad magic 0x%08x", get32(buf));
	if (buf[4] != PROTO_HAVE_FORMAT || buf[6] != PROTO_HAVE_HEADER || buf[7] != 0)
		return proto_errf(err, EPROTO, "have-page: format %u (header %u), want %d (%d)",
				  buf[4], (unsigned)buf[6] | (unsigned)buf[7] << 8, PROTO_HAVE_FORMAT,
				  PROTO_HAVE_HEADER);
	n = get32(buf + 16);
	if (n > PROTO_HAVE_MAX_CHUNKS)
		return proto_errf(err, EINVAL, "have-page: %u chunks, at most %u", n,
				  PROTO_HAVE_MAX_CHUNKS);
	if (len < proto_have_bytes(n))
		return proto_errf(err, EINVAL, "have-page: truncated (%zu bytes, %u chunks need %zu)",
				  len, n, proto_have_bytes(n));
	out->version = get64(buf + 8);
	out->nchunks = n;
	out->src_rank = get32(buf + 20);
	out->dst_rank = get32(buf + 24);
	out->upload_peers = buf[5];
	out->upload_mbps = get32(buf + 28);
	out->slot_addr = get64(buf + 32);
	out->slot_key = get64(buf + 40);
	out->slot_len = get64(buf + 48);
	out->slot_ranges = get32(buf + 56);
	if (out->slot_addr + out->slot_len < out->slot_addr)
		return proto_errf(err, EINVAL, "have-page: slot range wraps (0x%" PRIx64 " + %" PRIu64 ")",
				  out->slot_addr, out->slot_len);
	out->have = buf + PROTO_HAVE_HEADER;
	out->busy = out->have + bits_len(n);
	return 0;
}
