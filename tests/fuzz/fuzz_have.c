/* libFuzzer target: have-pages as a peer's one-sided read returns them
 * (proto_have_parse), and the cross-layout have-map check a reader makes
 * on the bytes that follow. What parses lies inside the input, reads back
 * through a page built from its fields, and every bit it names is read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/have.h"
#include "proto/xmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_have h, again;
	struct proto_err err;
	uint64_t src, len;

	if (proto_have_parse(data, size, &h, &err) == 0) {
		size_t bits = (h.nchunks + 7) / 8;
		unsigned n = 0;
		if (h.have != data + PROTO_HAVE_HEADER || h.busy + bits > data + size)
			abort();
		for (uint32_t c = 0; c < h.nchunks; c++)
			n += proto_have_bit(h.have, c) + proto_have_bit(h.busy, c);
		if (n > 2 * h.nchunks)
			abort();
		/* The same fields written by the node's side parse the same. */
		size_t cap = proto_have_bytes(h.nchunks);
		uint8_t *page = calloc(1, cap);
		if (page == NULL || proto_have_init(page, cap, h.version, h.nchunks, h.src_rank,
						    h.dst_rank) != 0)
			abort();
		proto_have_set_slot(page, h.slot_addr, h.slot_key, h.slot_len, h.slot_ranges);
		for (uint32_t c = 0; c < h.nchunks; c++) {
			proto_have_mark(page, c, true, proto_have_bit(h.have, c));
			proto_have_mark(page, c, false, proto_have_bit(h.busy, c));
		}
		if (proto_have_parse(page, cap, &again, &err) != 0 || again.nchunks != h.nchunks ||
		    again.slot_len != h.slot_len)
			abort();
		for (uint32_t c = 0; c < h.nchunks; c++) /* bits past n are padding */
			if (proto_have_bit(again.have, c) != proto_have_bit(h.have, c) ||
			    proto_have_bit(again.busy, c) != proto_have_bit(h.busy, c))
				abort();
		free(page);
	}
	/* A have-map: the first 16 bytes ask for a range, the rest is the map. */
	if (size < 16)
		return 0;
	memcpy(&src, data, 8);
	memcpy(&len, data + 8, 8);
	proto_xmap_have_covers(data + 16, size - 16, src, len);
	return 0;
}
