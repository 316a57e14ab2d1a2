/* Pacing per source host (node/fetch/pace.c): the sources of one host
 * share one record, so their reads fill one window and one silence; kept
 * handles, and have-pages over an endpoint of their own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "node/fetch/fetch.h"

#include <arpa/inet.h>
#include <string.h>
#include <netinet/in.h>

static struct node_rank_metrics no_metrics; /* no registry: updates are no-ops */

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
	struct fetcher x = {0};
	struct trk_source r1a = src(true, "R1/0", "host1"), r1b = src(true, "R1/1", "host1");
	struct trk_source r2 = src(true, "R2/0", "host1"), pub = src(false, "pub-0", "host0");
	struct trk_source pub2 = src(false, "pub-0", "host0"), r1c = src(true, "R1/0", "host9");

	struct fetch_source *h1 = fetch_host_pace(&x, &r1a);
	assert_non_null(h1);
	assert_ptr_equal(fetch_host_pace(&x, &r1b), h1); /* another rank, same host */
	assert_ptr_not_equal(fetch_host_pace(&x, &r2), h1); /* one machine's loopback */
	assert_ptr_not_equal(fetch_host_pace(&x, &r1c), h1);
	struct fetch_source *hp = fetch_host_pace(&x, &pub);
	assert_non_null(hp);
	assert_ptr_not_equal(hp, h1);
	assert_false(hp->info.peer);
	assert_ptr_equal(fetch_host_pace(&x, &pub2), hp);
	assert_int_equal(x.nhosts, 4);
	fetch_hosts_fini(&x);
	assert_null(x.hosts);
}

/* Past the table's size a source paces on its own (NULL record). */
static void test_hosts_full(void **state)
{
	struct fetcher x = {0};
	char id[32];
	uint32_t n = 0;

	for (int i = 0; i < 1000; i++) {
		snprintf(id, sizeof(id), "R%d/0", i);
		struct trk_source s = src(true, id, "h");
		if (fetch_host_pace(&x, &s) == NULL)
			break;
		n++;
	}
	assert_true(n > 0 && n < 1000);
	struct trk_source again = src(true, "R0/0", "h");
	assert_non_null(fetch_host_pace(&x, &again)); /* known hosts still found */
	fetch_hosts_fini(&x);
}

/* Two parcels' sources on one host: the bytes posted to either count in
 * the host's window, a read landing on the host's record is progress for
 * both, and a host with reads out and no progress past its patience makes
 * both silent. */
static void test_hosts_shared_pacing(void **state)
{
	struct fetcher x = {.chunk_size = 1 << 20, .max_inflight = 32};
	struct trk_source info = src(false, "pub-0", "host0");
	struct fetch_source s1 = {.info = info}, s2 = {.info = info}, alone = {.info = info};
	uint64_t now = node_now_ms();

	s1.hp = s2.hp = fetch_host_pace(&x, &info);
	assert_non_null(s1.hp);
	fetch_source_posted(&s1, 1 << 20);
	fetch_source_posted(&s2, 1 << 20);
	assert_int_equal(s1.hp->inflight_reads, 2);
	assert_int_equal(s1.hp->inflight_bytes, 2u << 20);
	assert_ptr_equal(fetch_pace(&s2), s1.hp);
	assert_ptr_equal(fetch_pace(&alone), &alone); /* no record: its own */

	/* The host's rate sets both sources' windows. */
	s1.hp->rate = 8u << 20;
	assert_int_equal(fetch_source_window(&x, &s2), fetch_source_window(&x, &s1));
	assert_true(fetch_source_window(&x, &s2) > fetch_source_window(&x, &alone));
	assert_int_equal(fetch_source_queue_ms(&s2, 8u << 20), 1000);

	/* Silent together: no read to the host landed for long (judged an
	 * hour on, not by moving progress an hour back: the monotonic clock
	 * of a machine up for less than that would wrap). */
	assert_false(fetch_source_silent(&s2, now));
	assert_true(fetch_source_silent(&s1, s1.hp->progress_ms + 3600 * 1000));
	assert_true(fetch_source_silent(&s2, s1.hp->progress_ms + 3600 * 1000));
	/* A read of s1 lands on the host: s2 is not silent either. */
	fetch_source_done(s1.hp, 1 << 20, true);
	assert_false(fetch_source_silent(&s2, node_now_ms()));
	assert_int_equal(s1.hp->inflight_reads, 1);
	fetch_source_done(s1.hp, 1 << 20, false); /* a failed one gives back its bytes */
	assert_int_equal(s1.hp->inflight_reads, 0);
	assert_int_equal(s1.hp->inflight_bytes, 0);
	assert_false(fetch_source_silent(&s1, now + 3600 * 1000)); /* nothing out */
	fetch_hosts_fini(&x);
}

/* Have-pages over the second endpoint (fetch_have_addr): a page read is
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
	uint64_t until = node_now_ms() + 60000;

	while ((*done < want || *at_page == UINT32_MAX) && node_now_ms() < until) {
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
	struct fetcher x = {0};
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
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &x.o.fab, NULL), 0);
	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &x.o.hfab, NULL), 0);
	assert_int_equal(fab_mr_reg(srv, big, len, FAB_MR_REMOTE_READ, &smr), 0);
	assert_int_equal(fab_mr_reg(x.o.fab, dst, len, FAB_MR_READ, &cmr), 0);
	assert_int_equal(fab_mr_reg(x.o.hfab, page, sizeof(page), FAB_MR_READ, &pmr), 0);
	fab_mr_rkey(smr, &rk);
	assert_int_equal(fab_getname(srv, addr, sizeof(addr), &alen), 0);
	struct fetch_source s = {.info = src(true, "R1/0", "host1")};
	s.info.fabric_addr = addr;
	s.info.fabric_addr_len = alen;
	assert_true(fetch_source_ready(&x, &s, node_now_ms()));
	assert_int_equal(fetch_have_addr(&x, &s, &hfa), 0);
	assert_int_equal(fetch_conns_count(&x), 1); /* one address, both handles */

	/* Both connections up first (a first read also connects). */
	for (int i = 0; i < 2; i++) {
		q[i] = (struct qread){.done = &done, .at_page = &at_page, .page = i == 1};
		assert_int_equal(i == 0 ? fab_read(x.o.fab, &q[i].op, cmr, 0, 4096, s.fa, &rk, 0, on_qread)
					: fab_read(x.o.hfab, &q[i].op, pmr, 0, 4096, hfa, &rk, 0, on_qread),
				 0);
	}
	drive(x.o.fab, x.o.hfab, srv, &done, &at_page, 1);
	done = 0;
	at_page = UINT32_MAX;

	/* Q_READS chunk reads queued on the peer, then a page read. */
	for (uint32_t i = 0; i < Q_READS; i++) {
		q[i] = (struct qread){.done = &done, .at_page = &at_page};
		assert_int_equal(fab_read(x.o.fab, &q[i].op, cmr, (size_t)i * Q_CHUNK, Q_CHUNK, s.fa, &rk,
					  (uint64_t)i * Q_CHUNK, on_qread),
				 0);
	}
	q[Q_READS] = (struct qread){.done = &done, .at_page = &at_page, .page = true};
	assert_int_equal(fab_read(x.o.hfab, &q[Q_READS].op, pmr, 0, 4096, hfa, &rk, 0, on_qread), 0);
	drive(x.o.fab, x.o.hfab, srv, &done, &at_page, Q_READS);
	print_message("page read landed after %u of %u queued chunk reads\n", at_page, Q_READS);
	assert_true(at_page < Q_READS);

	/* A failure gives both handles back; the next page read connects anew. */
	fetch_source_failed(&x, &s);
	assert_int_equal(fetch_conns_count(&x), 0);
	fab_mr_close(pmr);
	fab_mr_close(cmr);
	fab_mr_close(smr);
	fab_close(x.o.hfab);
	fab_close(x.o.fab);
	fab_close(srv);
	x.o.fab = x.o.hfab = NULL;
	fetch_conns_fini(&x);
	free(big);
	free(dst);
}

/*
 * Congested, not dead (fetch_check_silent): a peer with one read of ours
 * held (nothing delivered) that keeps answering its have-page keeps the
 * read past PEER_STALL_MS: no read moved, no byte refetched; once it stops
 * answering, its read moves PEER_STALL_MS after the last page it answered
 * was asked for, and the chunk asked again elsewhere counts as refetched.
 * A peer that never answers moves at PEER_STALL_MS, and one that answers
 * but delivers nothing for a publisher's patience moves too. A silent
 * source's read moves only when another source holds its chunk, and a
 * tick of a loop that ran late judges nothing. Driven by the clock values
 * given, not by time passing.
 */
#define CG_CHUNK 4096u

struct congested {
	struct proto_chunk chunks[8];
	struct proto_mparcel mp;
	uint8_t state[8], asked[8], nlive[8];
	uint8_t have[2];
	struct fetch_source srcs[2]; /* the peer, the trainer */
	struct fetch_parcel p;
	struct fetch f;
	struct fetch_read reads[2];
	struct fetcher x;
	uint64_t t0; /* the read's post */
};

static void congested_start(struct congested *g)
{
	memset(g, 0, sizeof(*g));
	for (int i = 0; i < 8; i++)
		g->chunks[i] = (struct proto_chunk){.size = CG_CHUNK};
	g->mp = (struct proto_mparcel){.nchunks = 8, .chunks = g->chunks};
	g->have[0] = 0xff;
	struct trk_source peer = {.peer = true, .id = "R2/0", .host = "h2"};
	struct trk_source pub = {.peer = false, .id = "pub-0", .host = "h0"};
	g->srcs[0] = (struct fetch_source){.info = peer, .fa_valid = true, .have = g->have};
	g->srcs[1] = (struct fetch_source){.info = pub, .fa_valid = true};
	g->p = (struct fetch_parcel){.mp = &g->mp, .state = g->state, .asked = g->asked,
				     .nlive = g->nlive, .srcs = g->srcs, .nsrcs = 2, .src_epoch = 1,
				     .sources_pending = true}; /* no tracker to ask here */
	g->f = (struct fetch){.version = 1, .parcels = &g->p, .nparcels = 1};
	g->x = (struct fetcher){.fanout = true, .f = &g->f, .reads = g->reads, .nreads = 2,
				   .max_inflight = 2, .chunk_size = CG_CHUNK, .gen = 1};
	g->x.o.id = "R1/0";
	g->x.o.am = &no_metrics;
	g->srcs[0].hp = fetch_host_pace(&g->x, &peer);
	g->srcs[1].hp = fetch_host_pace(&g->x, &pub);
	assert_non_null(g->srcs[0].hp);
	assert_non_null(g->srcs[1].hp);
	/* Chunk 3 asked from the peer; its bytes are held there. */
	g->reads[0] = (struct fetch_read){.x = &g->x, .parcel = 0, .chunk = 3, .len = CG_CHUNK,
					  .src_idx = 0, .src_epoch = 1, .src_peer = true,
					  .busy = true, .in_fabric = true, .gen = 1,
					  .hp = g->srcs[0].hp};
	fetch_source_posted(&g->srcs[0], CG_CHUNK);
	fetch_read_started(&g->x, 0, 3, CG_CHUNK);
	g->t0 = g->srcs[0].hp->progress_ms;
}

static void congested_end(struct congested *g)
{
	fetch_hosts_fini(&g->x);
}

static void test_pace_congested_peer(void **state)
{
	struct congested g;
	uint64_t t;

	/* Held for 6 s, its have-page answered every 100 ms meanwhile. */
	congested_start(&g);
	for (t = g.t0; t <= g.t0 + 6000; t += 100) {
		if (t >= g.t0 + 50)
			fetch_source_answered(&g.srcs[0], t - 50);
		fetch_check_silent(&g.x, &g.f, 0, t);
	}
	assert_false(g.reads[0].abandoned);
	assert_int_equal(g.f.stalls, 0);
	assert_int_equal(g.f.congested, 1); /* one silence, said once */
	assert_int_equal(g.p.nlive[3], 1);
	assert_int_equal(g.p.state[3], 1);
	assert_true(fetch_source_usable(&g.x, &g.f, &g.srcs[0], t));
	/* It stops answering (the last page answered was asked at t0 + 5950):
	 * still there 1999 ms on, moved at PEER_STALL_MS. */
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + 5950 + PEER_STALL_MS - 1);
	assert_false(g.reads[0].abandoned);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + 5950 + PEER_STALL_MS);
	assert_true(g.reads[0].abandoned);
	assert_int_equal(g.f.stalls, 1);
	assert_int_equal(g.p.state[3], 0);
	assert_int_equal(g.p.nlive[3], 0);
	assert_true(g.srcs[0].bad_until_ms > g.t0 + 5950 + PEER_STALL_MS);
	assert_int_equal(g.f.refetched, 0);
	fetch_read_started(&g.x, 0, 3, CG_CHUNK); /* from the trainer */
	assert_int_equal(g.f.refetched, CG_CHUNK);
	congested_end(&g);

	/* A peer that never answers a page: moved at PEER_STALL_MS. */
	congested_start(&g);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + PEER_STALL_MS - 1);
	assert_false(g.reads[0].abandoned);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + PEER_STALL_MS);
	assert_true(g.reads[0].abandoned);
	assert_int_equal(g.f.stalls, 1);
	assert_int_equal(g.f.congested, 0);
	congested_end(&g);

	/* Answering, but nothing delivered for a publisher's patience
	 * (unmeasured: three times TESSERA_STALL_MS): moved. */
	congested_start(&g);
	uint64_t cap = 3 * proto_param(PROTO_PARAM_STALL_MS);
	fetch_source_answered(&g.srcs[0], g.t0 + cap - 100);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + cap - 1);
	assert_false(g.reads[0].abandoned);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + cap);
	assert_true(g.reads[0].abandoned);
	assert_int_equal(g.f.stalls, 1);
	congested_end(&g);

	/* The trainer silent with reads of chunks 3 and 5 out, the peer
	 * holding chunk 3 only: chunk 3's read moves, chunk 5's stays (only
	 * the trainer holds it: asked again, it would be sent twice). */
	congested_start(&g);
	g.have[0] = 1u << 3;
	g.reads[0].src_idx = 1;
	g.reads[0].src_peer = false;
	g.reads[0].hp = g.srcs[1].hp;
	fetch_source_done(g.srcs[0].hp, CG_CHUNK, false); /* posted to the trainer instead */
	fetch_source_posted(&g.srcs[1], CG_CHUNK);
	g.reads[1] = g.reads[0];
	g.reads[1].chunk = 5;
	fetch_source_posted(&g.srcs[1], CG_CHUNK);
	fetch_read_started(&g.x, 0, 5, CG_CHUNK);
	g.srcs[1].hp->progress_ms = g.t0;
	cap = 3 * proto_param(PROTO_PARAM_STALL_MS); /* unmeasured */
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + cap);
	assert_true(g.reads[0].abandoned);
	assert_false(g.reads[1].abandoned);
	assert_int_equal(g.f.stalls, 1);
	assert_int_equal(g.p.state[5], 1);
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + cap + 1000); /* still nobody else */
	assert_false(g.reads[1].abandoned);
	assert_int_equal(g.f.stalls, 1);
	congested_end(&g);

	/* The node's own loop ran late (starved of CPU): that tick judges
	 * nothing, the next one does (fetch_silence_due). */
	congested_start(&g);
	assert_true(fetch_silence_due(&g.x, g.t0));
	assert_true(fetch_silence_due(&g.x, g.t0 + 100));
	assert_false(fetch_silence_due(&g.x, g.t0 + 100 + PEER_STALL_MS / 2));
	assert_true(fetch_silence_due(&g.x, g.t0 + 200 + PEER_STALL_MS / 2));
	/* Late on every tick: every other one judges. */
	assert_false(fetch_silence_due(&g.x, g.t0 + 200 + PEER_STALL_MS * 2));
	assert_true(fetch_silence_due(&g.x, g.t0 + 200 + PEER_STALL_MS * 4));
	congested_end(&g);

	/* With only the peer to go to, nothing moves: the read stays. */
	congested_start(&g);
	g.p.nsrcs = 1;
	fetch_check_silent(&g.x, &g.f, 0, g.t0 + 60000);
	assert_false(g.reads[0].abandoned);
	assert_int_equal(g.f.stalls, 0);
	congested_end(&g);
}

/*
 * Reads of several chunks (fetch_read_run): from a publisher whose measured
 * rate moves several chunks a millisecond, the chunks after c that are ours,
 * untouched and held by no peer, up to TESSERA_READ_CHUNKS and the room in
 * its window; one chunk from a peer, unmeasured or slower sources.
 */
static void test_read_runs(void **state)
{
	struct congested g;
	uint8_t mine[8], busy[8];
	uint16_t avail[8];

	(void)state;
	congested_start(&g);
	memset(mine, 1, sizeof(mine));
	memset(busy, 0, sizeof(busy));
	memset(avail, 0, sizeof(avail));
	g.p.mine = mine;
	g.p.peer_busy = busy;
	g.p.avail = avail;
	g.p.nlive[3] = 0; /* the harness's read of chunk 3 is not ours here */
	g.p.state[3] = 0;
	g.f.man.chunk_size = CG_CHUNK;
	g.x.max_inflight = 64;
	struct fetch_source *pub = &g.srcs[1], *peer = &g.srcs[0];
	struct fetch_source *h = fetch_pace(pub);

	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 1); /* unmeasured */
	h->rate = 2000000; /* 2 MB/s: not a chunk a millisecond */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 1);
	h->rate = 100000000; /* 100 MB/s: 24 chunks of 4 KiB a millisecond */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 8);
	assert_int_equal(fetch_read_run(&g.x, &g.p, 5, pub), 3); /* the parcel ends */
	fetch_pace(peer)->rate = 100000000;
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, peer), 1); /* a peer */
	g.p.state[3] = 1; /* being read */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 3);
	g.p.state[3] = 0;
	mine[2] = 0; /* another member's to take from the trainer */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 2);
	mine[2] = 1;
	avail[1] = 1; /* a peer holds it */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 1);
	avail[1] = 0;
	busy[4] = 1; /* a peer fetches it */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 4);
	busy[4] = 0;
	g.chunks[1].size = CG_CHUNK / 2; /* a short chunk ends a run */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 2);
	g.chunks[1].size = CG_CHUNK;
	/* The window (64 chunks) with room for 3: wait for a whole run. */
	h->inflight_bytes = fetch_source_window(&g.x, pub) - 3 * CG_CHUNK;
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 0);
	h->inflight_bytes = 0;
	g.x.max_inflight = 4; /* less than half of it out, room for 3: those */
	g.x.inflight = 1;
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 3);
	g.x.max_inflight = 64;
	g.x.inflight = 0;
	g.f.man.chunk_size = CG_CHUNK / 2; /* the publisher's chunks are not our slots' */
	assert_int_equal(fetch_read_run(&g.x, &g.p, 0, pub), 1);
	congested_end(&g);
}

/*
 * Kept connections (pace.c, conn_hold): a source's address gets one kept
 * handle the first time it is reached, however many sources (parcels,
 * versions) name it, so its connection outlives their lists; a failure
 * from that address gives it back (the next insert connects afresh); at
 * CONNS_MAX addresses the least recently reached one goes.
 */
static void test_pace_kept_conns(void **state)
{
	struct fab_ctx *fab;
	struct fetcher x = {0};
	uint8_t name[FAB_ADDR_MAX];
	size_t len;

	assert_int_equal(fab_open("tcp;ofi_rxm", "127.0.0.1", NULL, &fab, NULL), 0);
	assert_int_equal(fab_getname(fab, name, sizeof(name), &len), 0);
	x.o.fab = fab;
	struct fetch_source s[2] = {{.info = {.fabric_addr = name, .fabric_addr_len = len}},
				    {.info = {.fabric_addr = name, .fabric_addr_len = len}}};
	assert_true(fetch_source_ready(&x, &s[0], node_now_ms()));
	assert_true(fetch_source_ready(&x, &s[1], node_now_ms()));
	assert_int_equal(fetch_conns_count(&x), 1);
	/* The sources' lists go (a version ends): the kept connection stays. */
	assert_int_equal(fab_av_remove(fab, s[0].fa), 0);
	assert_int_equal(fab_av_remove(fab, s[1].fa), 0);
	s[0].fa_valid = s[1].fa_valid = false;
	assert_int_equal(fetch_conns_count(&x), 1);
	assert_true(fetch_source_ready(&x, &s[0], node_now_ms()));
	fetch_source_failed(&x, &s[0]);
	assert_false(s[0].fa_valid);
	assert_int_equal(fetch_conns_count(&x), 0);
	/* More addresses than it keeps: the oldest go, the newest stay. */
	struct sockaddr_in sin;
	assert_int_equal(len, sizeof(sin));
	memcpy(&sin, name, sizeof(sin));
	for (int i = 0; i < 70; i++) {
		struct fetch_source o = {.info = {.fabric_addr = (uint8_t *)&sin,
						  .fabric_addr_len = sizeof(sin)}};
		sin.sin_port = htons((uint16_t)(20000 + i));
		assert_true(fetch_source_ready(&x, &o, node_now_ms()));
		assert_int_equal(fab_av_remove(fab, o.fa), 0);
	}
	assert_true(fetch_conns_count(&x) < 70);
	struct fetch_source last = {.info = {.fabric_addr = (uint8_t *)&sin,
					     .fabric_addr_len = sizeof(sin)}};
	uint32_t n = fetch_conns_count(&x);
	fetch_source_failed(&x, &last); /* the newest is still held: given back */
	assert_int_equal(fetch_conns_count(&x), n - 1);
	fetch_conns_fini(&x);
	assert_int_equal(fetch_conns_count(&x), 0);
	fab_close(fab);
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hosts_grouping),
		cmocka_unit_test(test_hosts_full),
		cmocka_unit_test(test_hosts_shared_pacing),
		cmocka_unit_test(test_hosts_have_endpoint),
		cmocka_unit_test(test_pace_congested_peer),
		cmocka_unit_test(test_pace_kept_conns),
		cmocka_unit_test(test_read_runs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
