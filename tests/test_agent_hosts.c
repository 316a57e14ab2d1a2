/* Pacing per source host (node/agent_hosts.c): the sources of one host
 * share one record, so their reads fill one window and one silence. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/agent/agent_internal.h"

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

	/* Silent together: no read to the host landed for long (judged an
	 * hour on, not by moving progress an hour back: the monotonic clock
	 * of a machine up for less than that would wrap). */
	assert_false(agent_source_silent(&s2, now));
	assert_true(agent_source_silent(&s1, s1.hp->progress_ms + 3600 * 1000));
	assert_true(agent_source_silent(&s2, s1.hp->progress_ms + 3600 * 1000));
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

/* Have-pages over the second endpoint (agent_have_addr): a page read is
 * answered while the same peer still has many chunk reads of ours queued
 * on the chunk endpoint's connection (it waited behind all of them on one
 * connection). Counted: the chunk reads done when the page landed. */
#define Q_CHUNK (512u << 10)
#define Q_READS 64 /* 32 MiB queued on the peer: more than its socket takes */

struct qread {
	struct fab_op op;
	uint32_t *done, *at_page;
	bool page;
};

static void on_qread(struct fab_op *op, int status)
{
	struct qread *q = proto_container_of(op, struct qread, op);

	assert_int_equal(status, 0);
	if (q->page)
		*q->at_page = *q->done;
	else
		++*q->done;
}

/* Polls the three endpoints until want chunk reads and the page read
 * are done (bounded: a hung read fails the test, it is not timed). */
static void drive(struct fab_ctx *c1, struct fab_ctx *c2, struct fab_ctx *srv,
		  const uint32_t *done, const uint32_t *at_page, uint32_t want)
{
	uint64_t until = agent_now_ms() + 60000;

	while ((*done < want || *at_page == UINT32_MAX) && agent_now_ms() < until) {
		fab_poll(srv, 0);
		fab_poll(c1, 0);
		fab_poll(c2, 0);
	}
	assert_int_equal(*done, want);
	assert_int_not_equal(*at_page, UINT32_MAX);
}

static void test_hosts_have_endpoint(void **state)
{
	struct fab_ctx *srv = NULL;
	struct node_agent a = {0};
	struct fab_mr *smr = NULL, *cmr = NULL, *pmr = NULL;
	size_t len = (size_t)Q_READS * Q_CHUNK, alen;
	uint8_t addr[FAB_ADDR_MAX], *big = calloc(1, len), *dst = malloc(len), page[4096];
	struct qread q[Q_READS + 1];
	uint32_t done = 0, at_page = UINT32_MAX;
	struct fab_rkey rk;
	fi_addr_t hfa;

	assert_non_null(big);
	assert_non_null(dst);
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &srv, NULL), 0);
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &a.fab, NULL), 0);
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &a.hfab, NULL), 0);
	assert_int_equal(fab_mr_reg(srv, big, len, FAB_MR_REMOTE_READ, &smr), 0);
	assert_int_equal(fab_mr_reg(a.fab, dst, len, FAB_MR_READ, &cmr), 0);
	assert_int_equal(fab_mr_reg(a.hfab, page, sizeof(page), FAB_MR_READ, &pmr), 0);
	fab_mr_rkey(smr, &rk);
	assert_int_equal(fab_getname(srv, addr, sizeof(addr), &alen), 0);
	struct agent_source s = {.info = src(true, "R1/0", "host1")};
	s.info.fabric_addr = addr;
	s.info.fabric_addr_len = alen;
	assert_true(agent_source_ready(&a, &s, agent_now_ms()));
	assert_int_equal(agent_have_addr(&a, &s, &hfa), 0);
	assert_int_equal(agent_warm_count(&a), 1); /* one address, both handles */

	/* Both connections up first (a first read also connects). */
	for (int i = 0; i < 2; i++) {
		q[i] = (struct qread){.done = &done, .at_page = &at_page, .page = i == 1};
		assert_int_equal(i == 0 ? fab_read(a.fab, &q[i].op, cmr, 0, 4096, s.fa, &rk, 0, on_qread)
					: fab_read(a.hfab, &q[i].op, pmr, 0, 4096, hfa, &rk, 0, on_qread),
				 0);
	}
	drive(a.fab, a.hfab, srv, &done, &at_page, 1);
	done = 0;
	at_page = UINT32_MAX;

	/* Q_READS chunk reads queued on the peer, then a page read. */
	for (uint32_t i = 0; i < Q_READS; i++) {
		q[i] = (struct qread){.done = &done, .at_page = &at_page};
		assert_int_equal(fab_read(a.fab, &q[i].op, cmr, (size_t)i * Q_CHUNK, Q_CHUNK, s.fa, &rk,
					  (uint64_t)i * Q_CHUNK, on_qread),
				 0);
	}
	q[Q_READS] = (struct qread){.done = &done, .at_page = &at_page, .page = true};
	assert_int_equal(fab_read(a.hfab, &q[Q_READS].op, pmr, 0, 4096, hfa, &rk, 0, on_qread), 0);
	drive(a.fab, a.hfab, srv, &done, &at_page, Q_READS);
	print_message("page read landed after %u of %u queued chunk reads\n", at_page, Q_READS);
	assert_true(at_page < Q_READS);

	/* A failure gives both handles back; the next page read connects anew. */
	agent_warm_drop(&a, &s);
	assert_int_equal(agent_warm_count(&a), 0);
	fab_mr_close(pmr);
	fab_mr_close(cmr);
	fab_mr_close(smr);
	fab_close(a.hfab);
	fab_close(a.fab);
	fab_close(srv);
	a.fab = a.hfab = NULL;
	agent_warm_fini(&a);
	free(big);
	free(dst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hosts_grouping),
		cmocka_unit_test(test_hosts_full),
		cmocka_unit_test(test_hosts_shared_pacing),
		cmocka_unit_test(test_hosts_have_endpoint),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
