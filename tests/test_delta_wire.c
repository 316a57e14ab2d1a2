/* The node's delta wire buffers (node/fetch/wires.c): kept between
 * versions and handed again to parcels of other wire sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <malloc.h>
#include <string.h>

#include "node/fetch/fetch.h"

/* A buffer given back is handed again to a parcel it fits, the smallest
 * that fits first; one too small for a grown parcel stays kept and a new
 * one is made; every byte handed out can be written. */
static void test_reuse_across_sizes(void **state)
{
	struct fetcher fx = {0};

	(void)state;
	uint8_t *small = fetch_wire_get(&fx, 1000), *big = fetch_wire_get(&fx, 300000);
	assert_non_null(small);
	assert_non_null(big);
	memset(small, 1, 1000);
	memset(big, 2, 300000);
	fetch_wire_put(&fx, small);
	fetch_wire_put(&fx, big);
	/* The next version's parcels: one a little smaller, one grown. */
	uint8_t *x = fetch_wire_get(&fx, 900);
	assert_ptr_equal(x, small);
	uint8_t *y = fetch_wire_get(&fx, 400000);
	assert_ptr_not_equal(y, big);
	memset(x, 3, 900);
	memset(y, 4, 400000);
	/* The one after: a parcel that fits only the big one kept. */
	uint8_t *z = fetch_wire_get(&fx, 250000);
	assert_ptr_equal(z, big);
	assert_true(malloc_usable_size(z) >= 250000);
	memset(z, 5, 250000);
	fetch_wire_put(&fx, x);
	fetch_wire_put(&fx, y);
	fetch_wire_put(&fx, z);
	/* Both fit 2000 bytes: the smaller of the two kept large ones. */
	uint8_t *w = fetch_wire_get(&fx, 2000);
	assert_ptr_equal(w, big);
	fetch_wire_put(&fx, w);
	fetch_wire_put(&fx, NULL); /* nothing */
	fetch_wires_fini(&fx);     /* frees the kept ones (ASan: no leak) */
	/* Given back after the teardown: freed at once, not kept. */
	fetch_wire_put(&fx, fetch_wire_get(&fx, 64));
	assert_null(fx.wires);
}

/* More buffers given back than the pool keeps: the smallest go, and a zero
 * length still gets a buffer. */
static void test_pool_bounded(void **state)
{
	struct fetcher fx = {0};
	uint8_t *b[40];

	(void)state;
	for (size_t i = 0; i < 40; i++) {
		b[i] = fetch_wire_get(&fx, 4096 * (i + 1));
		assert_non_null(b[i]);
	}
	for (size_t i = 0; i < 40; i++)
		fetch_wire_put(&fx, b[i]);
	/* The largest was kept: a parcel that needs it gets it back. */
	assert_ptr_equal(fetch_wire_get(&fx, 4096 * 40), b[39]);
	fetch_wire_put(&fx, b[39]);
	uint8_t *e = fetch_wire_get(&fx, 0);
	assert_non_null(e);
	fetch_wire_put(&fx, e);
	fetch_wires_fini(&fx);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reuse_across_sizes),
		cmocka_unit_test(test_pool_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
