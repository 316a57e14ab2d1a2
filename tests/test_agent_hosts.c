/* Pacing per source host (node/agent_hosts.c): the sources of one host
 * share one record, so their reads fill one window and one silence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/agent_internal.h"

static struct trk_source src(bool peer, const char *id, const char *host)
{
	struct trk_source s = {.peer = peer};

	snprintf(s.id, sizeof(s.id), "%s", id);
	snprintf(s.host, sizeof(s.host), "%s", host);
	return s;
}

/* One record per (host, what runs there): a peer's replica, or a
 * publisher; a record is found again for every later source list. */
static void test_hosts_grouping(void **state)
{
	struct node_agent a = {0};
	struct trk_source r1a = src(true, "R1/0", "host1"), r1b = src(true, "R1/1", "host1");
	struct trk_source r2 = src(true, "R2/0", "host1"), pub = src(false, "pub-0", "host0");
	struct trk_source pub2 = src(false, "pub-0", "host0"), r1c = src(true, "R1/0", "host9");

	struct agent_source *h1 = agent_host_pace(&a, &r1a);
	assert_non_null(h1);
	assert_ptr_equal(agent_host_pace(&a, &r1b), h1); /* another rank, same host */
	assert_ptr_not_equal(agent_host_pace(&a, &r2), h1); /* one machine's loopback */
	assert_ptr_not_equal(agent_host_pace(&a, &r1c), h1);
	struct agent_source *hp = agent_host_pace(&a, &pub);
	assert_non_null(hp);
	assert_ptr_not_equal(hp, h1);
	assert_false(hp->info.peer);
	assert_ptr_equal(agent_host_pace(&a, &pub2), hp);
	assert_int_equal(a.nhosts, 4);
	agent_hosts_fini(&a);
	assert_null(a.hosts);
}

/* Past the table's size a source paces on its own (NULL record). */
static void test_hosts_full(void **state)
{
	struct node_agent a = {0};
	char id[32];
	uint32_t n = 0;

	for (int i = 0; i < 1000; i++) {
		snprintf(id, sizeof(id), "R%d/0", i);
		struct trk_source s = src(true, id, "h");
		if (agent_host_pace(&a, &s) == NULL)
			break;
		n++;
	}
	assert_true(n > 0 && n < 1000);
	struct trk_source again = src(true, "R0/0", "h");
	assert_non_null(agent_host_pace(&a, &again)); /* known hosts still found */
	agent_hosts_fini(&a);
}

/* Two parcels' sources on one host: the bytes posted to either count in
 * the host's window, a read landing on the host's record is progress for
 * both, and a host with reads out and no progress past its patience makes
 * both silent. */
static void test_hosts_shared_pacing(void **state)
{
	struct node_agent a = {.chunk_size = 1 << 20, .max_inflight = 32};
	struct trk_source info = src(false, "pub-0", "host0");
	struct agent_source s1 = {.info = info}, s2 = {.info = info}, alone = {.info = info};
	uint64_t now = agent_now_ms();

	s1.hp = s2.hp = agent_host_pace(&a, &info);
	assert_non_null(s1.hp);
	agent_source_posted(&s1, 1 << 20);
	agent_source_posted(&s2, 1 << 20);
	assert_int_equal(s1.hp->inflight_reads, 2);
	assert_int_equal(s1.hp->inflight_bytes, 2u << 20);
	assert_ptr_equal(agent_pace(&s2), s1.hp);
	assert_ptr_equal(agent_pace(&alone), &alone); /* no record: its own */

	/* The host's rate sets both sources' windows. */
	s1.hp->rate = 8u << 20;
	assert_int_equal(agent_source_window(&a, &s2), agent_source_window(&a, &s1));
	assert_true(agent_source_window(&a, &s2) > agent_source_window(&a, &alone));
	assert_int_equal(agent_source_queue_ms(&s2, 8u << 20), 1000);

	/* Silent together: no read to the host landed for long. */
	assert_false(agent_source_silent(&s2, now));
	/* Judged an hour later, not by moving the progress an hour back: the
	 * monotonic clock of a machine up for less than an hour is smaller. */
	s1.hp->progress_ms = now;
	assert_true(agent_source_silent(&s1, now + 3600 * 1000));
	assert_true(agent_source_silent(&s2, now + 3600 * 1000));
	/* A read of s1 lands on the host: s2 is not silent either. */
	agent_source_done(s1.hp, 1 << 20, true);
	assert_false(agent_source_silent(&s2, agent_now_ms()));
	assert_int_equal(s1.hp->inflight_reads, 1);
	agent_source_done(s1.hp, 1 << 20, false); /* a failed one gives back its bytes */
	assert_int_equal(s1.hp->inflight_reads, 0);
	assert_int_equal(s1.hp->inflight_bytes, 0);
	assert_false(agent_source_silent(&s1, now + 3600 * 1000)); /* nothing out */
	agent_hosts_fini(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hosts_grouping),
		cmocka_unit_test(test_hosts_full),
		cmocka_unit_test(test_hosts_shared_pacing),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
