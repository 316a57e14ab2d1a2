/* Tests for have-pages: round trip, and hostile pages refused with one line. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/have.h"

static void test_have_round_trip(void **state)
{
	uint8_t page[4096];
	struct proto_have h;
	struct proto_err err;

	assert_int_equal(proto_have_page(1), 4096);
	assert_int_equal(proto_have_page(8 * (4096 - PROTO_HAVE_HEADER) / 2), 4096);
	assert_int_equal(proto_have_page(8 * (4096 - PROTO_HAVE_HEADER) / 2 + 8), 8192);
	assert_int_equal(proto_have_init(page, sizeof(page), 7, 100, 3, 5), 0);
	proto_have_mark(page, 0, true, true);
	proto_have_mark(page, 99, true, true);
	proto_have_mark(page, 42, false, true);
	proto_have_mark(page, 43, false, true);
	proto_have_mark(page, 43, false, false);
	assert_int_equal(proto_have_parse(page, proto_have_bytes(100), &h, &err), 0);
	assert_int_equal(h.version, 7);
	assert_int_equal(h.nchunks, 100);
	assert_int_equal(h.src_rank, 3);
	assert_int_equal(h.dst_rank, 5);
	assert_int_equal(h.upload_peers, 0); /* no budget unless announced */
	assert_int_equal(h.upload_mbps, 0);
	assert_int_equal(h.slot_len, 0); /* bytes after the page unless a slot is announced */
	for (uint32_t c = 0; c < 100; c++) {
		assert_int_equal(proto_have_bit(h.have, c), c == 0 || c == 99);
		assert_int_equal(proto_have_bit(h.busy, c), c == 42);
	}
	/* An upload budget: every value a peer may send is taken as it is
	 * (a reader only ever uses it to ask for less); over 255 peers is 255. */
	proto_have_set_budget(page, 3, 400);
	assert_int_equal(proto_have_parse(page, proto_have_bytes(100), &h, &err), 0);
	assert_int_equal(h.upload_peers, 3);
	assert_int_equal(h.upload_mbps, 400);
	assert_true(proto_have_bit(h.have, 99)); /* the bitmaps are untouched */
	proto_have_set_budget(page, 1000, (uint64_t)1 << 40);
	assert_int_equal(proto_have_parse(page, proto_have_bytes(100), &h, &err), 0);
	assert_int_equal(h.upload_peers, 255);
	assert_int_equal(h.upload_mbps, UINT32_MAX);
	/* Served from the slot: its rkey comes back as it was set. */
	proto_have_set_slot(page, 0x7f0000001000ull, 0xdeadbeefcafeull, 1ull << 33, 4);
	assert_int_equal(proto_have_parse(page, proto_have_bytes(100), &h, &err), 0);
	assert_int_equal(h.slot_addr, 0x7f0000001000ull);
	assert_int_equal(h.slot_key, 0xdeadbeefcafeull);
	assert_int_equal(h.slot_len, 1ull << 33);
	assert_int_equal(h.slot_ranges, 4);
	assert_true(proto_have_bit(h.have, 99));
	assert_int_equal(h.upload_peers, 255);
	/* Too small a buffer or too many chunks: nothing is written. */
	assert_int_equal(proto_have_init(page, 40, 7, 100, 3, 5), -EINVAL);
	assert_int_equal(proto_have_init(page, sizeof(page), 7, PROTO_HAVE_MAX_CHUNKS + 1, 0, 0),
			 -EINVAL);
}

/* Every hostile page is refused with a one-line reason, never read past. */
static void test_have_bad_pages(void **state)
{
	uint8_t page[4096], *cut;
	struct proto_have h;
	struct proto_err err;
	size_t full = proto_have_bytes(100);

	assert_int_equal(proto_have_init(page, sizeof(page), 7, 100, 3, 5), 0);
	/* Truncated, at every length short of the whole: copied to the heap
	 * so that ASan sees a read past what was given. */
	for (size_t len = 0; len < full; len++) {
		cut = malloc(len + 1);
		assert_non_null(cut);
		memcpy(cut, page, len);
		err.msg[0] = 0;
		assert_int_equal(proto_have_parse(cut, len, &h, &err), -EINVAL);
		assert_non_null(strstr(err.msg, "truncated"));
		assert_null(strchr(err.msg, '\n'));
		free(cut);
	}
	/* Wrong magic. */
	page[0] ^= 1;
	assert_int_equal(proto_have_parse(page, full, &h, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "magic"));
	page[0] ^= 1;
	/* Another format version, another header size. */
	page[4] = 1; /* the page before slots: its header is shorter */
	assert_int_equal(proto_have_parse(page, full, &h, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "format 1"));
	page[4] = 3;
	assert_int_equal(proto_have_parse(page, full, &h, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "format 3"));
	page[4] = PROTO_HAVE_FORMAT;
	page[6] = 32; /* format 1's header size */
	assert_int_equal(proto_have_parse(page, full, &h, &err), -EPROTO);
	page[6] = PROTO_HAVE_HEADER;
	/* Oversized: more chunks than the cap, or than the bytes carry. */
	page[16] = 0xff, page[17] = 0xff, page[18] = 0xff, page[19] = 0xff;
	assert_int_equal(proto_have_parse(page, sizeof(page), &h, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "at most"));
	page[16] = 0x00, page[17] = 0x00, page[18] = 0x01, page[19] = 0x00; /* 65536 */
	assert_int_equal(proto_have_parse(page, sizeof(page), &h, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "truncated"));
	/* A slot range that wraps around the address space. */
	page[16] = 100, page[18] = 0;
	proto_have_set_slot(page, UINT64_MAX - 4095, 1, 8192, 1);
	assert_int_equal(proto_have_parse(page, full, &h, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "wraps"));
	assert_null(strchr(err.msg, '\n'));
	proto_have_set_slot(page, 0, 0, 0, 0);
	assert_int_equal(proto_have_parse(page, full, &h, &err), 0);
	/* Nothing but garbage. */
	for (size_t i = 0; i < sizeof(page); i++)
		page[i] = (uint8_t)(i * 131 + 7);
	assert_int_not_equal(proto_have_parse(page, sizeof(page), &h, &err), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_have_round_trip),
		cmocka_unit_test(test_have_bad_pages),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
