/* The node's delta wire buffers (node/agent_delta.c, "Wire buffers"): kept
 * between versions and handed again to parcels of other wire sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <malloc.h>
#include <string.h>

#include "node/agent/agent_internal.h"

/* A buffer given back is handed again to a parcel it fits, the smallest
 * that fits first; one too small for a grown parcel stays kept and a new
 * one is made; every byte handed out can be written. */
static void test_reuse_across_sizes(void **state)
{
	struct node_agent a = {0};

	(void)state;
	uint8_t *small = agent_wire_get(&a, 1000), *big = agent_wire_get(&a, 300000);
	assert_non_null(small);
	assert_non_null(big);
	memset(small, 1, 1000);
	memset(big, 2, 300000);
	agent_wire_put(&a, small);
	agent_wire_put(&a, big);
	/* The next version's parcels: one a little smaller, one grown. */
	uint8_t *x = agent_wire_get(&a, 900);
	assert_ptr_equal(x, small);
	uint8_t *y = agent_wire_get(&a, 400000);
	assert_ptr_not_equal(y, big);
	memset(x, 3, 900);
	memset(y, 4, 400000);
	/* The one after: a parcel that fits only the big one kept. */
	uint8_t *z = agent_wire_get(&a, 250000);
	assert_ptr_equal(z, big);
	assert_true(malloc_usable_size(z) >= 250000);
	memset(z, 5, 250000);
	agent_wire_put(&a, x);
	agent_wire_put(&a, y);
	agent_wire_put(&a, z);
	/* Both fit 2000 bytes: the smaller of the two kept large ones. */
	uint8_t *w = agent_wire_get(&a, 2000);
	assert_ptr_equal(w, big);
	agent_wire_put(&a, w);
	agent_wire_put(&a, NULL); /* nothing */
	agent_delta_fini(&a);     /* frees the kept ones (ASan: no leak) */
	/* Given back after the teardown: freed at once, not kept. */
	agent_wire_put(&a, agent_wire_get(&a, 64));
	assert_null(a.wires);
}

/* More buffers given back than the pool keeps: the smallest go, and a zero
 * length still gets a buffer. */
static void test_pool_bounded(void **state)
{
	struct node_agent a = {0};
	uint8_t *b[40];

	(void)state;
	for (size_t i = 0; i < 40; i++) {
		b[i] = agent_wire_get(&a, 4096 * (i + 1));
		assert_non_null(b[i]);
	}
	for (size_t i = 0; i < 40; i++)
		agent_wire_put(&a, b[i]);
	/* The largest was kept: a parcel that needs it gets it back. */
	assert_ptr_equal(agent_wire_get(&a, 4096 * 40), b[39]);
	agent_wire_put(&a, b[39]);
	uint8_t *e = agent_wire_get(&a, 0);
	assert_non_null(e);
	agent_wire_put(&a, e);
	agent_delta_fini(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reuse_across_sizes),
		cmocka_unit_test(test_pool_bounded),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
