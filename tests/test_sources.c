/* The tracker's source lists, merged into a parcel's (node/fetch/sources.c):
 * how soon a parcel asks again, and reads in flight following their
 * source to its new place in the list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "node/fetch/fetch.h"
#include "node/swarm/swarm.h"

/*
 * How soon a parcel asks for sources again (fetch_sources_gap): early in a
 * fetch, while the tracker lists peers but no publisher yet (a version is
 * announced before its publisher's offer lands), every SOURCES_EARLY_MS;
 * once a publisher is listed, or later in the fetch, at the usual periods.
 */
static void test_sources_early(void **state)
{
	struct fetch f = {.started_ms = 10000};
	struct fetch_source srcs[2] = {{.info = {.peer = true}}, {.info = {.peer = false}}};
	struct fetch_parcel p = {.srcs = srcs, .nsrcs = 1};

	assert_int_equal(fetch_sources_gap(&f, &p, true, 10040), SOURCES_EARLY_MS);
	assert_int_equal(fetch_sources_gap(&f, &p, false, 10040), SOURCES_EARLY_MS);
	assert_int_equal(fetch_sources_gap(&f, &p, true, 10000 + SOURCES_EARLY_FOR_MS),
			 SWARM_REFRESH_MS);
	assert_int_equal(fetch_sources_gap(&f, &p, false, 10000 + SOURCES_EARLY_FOR_MS),
			 SOURCES_MIN_MS);
	p.nsrcs = 2; /* the publisher's offer is in */
	assert_int_equal(fetch_sources_gap(&f, &p, true, 10040), SWARM_REFRESH_MS);
	assert_int_equal(fetch_sources_gap(&f, &p, false, 10040), SOURCES_MIN_MS);
}

/*
 * A new source list keeps the reads in flight (fetch_reads_follow, and the
 * swarm's sources_moved hook for have-page reads): a
 * chunk read and a have-page read to a source still listed follow it to
 * its new index, the have-page stays busy there (not asked twice, and not
 * dropped: early in a fetch the list is refreshed every SOURCES_EARLY_MS,
 * faster than a page was asked again); those to a source that left keep
 * the old epoch, so their answers are dropped.
 */
static void test_sources_reads_follow(void **state)
{
	struct fetch_parcel parcels[2] = {{.nsrcs = 2, .src_epoch = 5}, {.nsrcs = 2, .src_epoch = 5}};
	struct fetch f = {.parcels = parcels, .nparcels = 2};
	struct fetch_read reads[3] = {
		{.in_fabric = true, .gen = 1, .parcel = 0, .src_idx = 1, .src_epoch = 5},
		{.in_fabric = true, .gen = 1, .parcel = 0, .src_idx = 0, .src_epoch = 5},
		{.in_fabric = true, .gen = 1, .parcel = 1, .src_idx = 1, .src_epoch = 5}};
	struct swarm_have_read *hreads = calloc(HAVE_SLOTS, sizeof(*hreads));
	struct fetcher x = {.gen = 1, .f = &f, .reads = reads, .nreads = 3};
	struct swarm sw = {.x = &x, .hreads = hreads};
	struct fetch_source ns[3];
	uint32_t moved[2] = {0, 3}; /* old 0 left the list, old 1 is new 2 */

	assert_non_null(hreads);
	memset(ns, 0, sizeof(ns));
	hreads[0] = (struct swarm_have_read){.busy = true, .gen = 1, .parcel = 0, .src_idx = 1,
					     .src_epoch = 5};
	hreads[1] = (struct swarm_have_read){.busy = true, .gen = 1, .parcel = 0, .src_idx = 0,
					     .src_epoch = 5};
	hreads[2] = (struct swarm_have_read){.busy = true, .gen = 0, .parcel = 0, .src_idx = 1,
					     .src_epoch = 5}; /* an older registration's */
	swarm_hooks(&sw, &x.o.hooks);
	fetch_reads_follow(&x, &parcels[0], moved, ns);
	assert_int_equal(reads[0].src_idx, 2);
	assert_int_equal(reads[0].src_epoch, 6);
	assert_int_equal(reads[1].src_epoch, 5); /* its source left */
	assert_int_equal(reads[2].src_idx, 1);   /* another parcel's */
	assert_int_equal(reads[2].src_epoch, 5);
	assert_int_equal(hreads[0].src_idx, 2);
	assert_int_equal(hreads[0].src_epoch, 6);
	assert_true(ns[2].have_busy);
	assert_int_equal(hreads[1].src_epoch, 5);
	assert_false(ns[0].have_busy);
	assert_int_equal(hreads[2].src_epoch, 5);
	free(hreads);
}

/* Small chunks and a per-node fetch cap of 8 Mbit/s: a chunk takes about
 * 65 ms, so have-pages (read every 20 ms) are fresh next to it, and the
 * version takes seconds, so a peer can be killed mid-transfer. */

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sources_early),
		cmocka_unit_test(test_sources_reads_follow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
