/* The picker (node/fetch/picker.c) and its inputs (node/fetch/owners.c),
 * tested on plain parcels and sources, without an agent: who owns which of
 * the trainer's chunks, stealing from the slowest owner, the trainer's
 * share and last wave, a fresh version's first read, per-peer queues and
 * rarest first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "node/fetch/picker.h"
#include "tests/fetchtest.h"
#include "tests/testutil.h"

static struct node_rank_metrics no_metrics; /* no registry: updates are no-ops */

/*
 * Who reads which of the trainer's chunks (fetch_owners), as each of
 * eight members computes it from the same members list: every chunk has
 * exactly one owner that agrees it is its own, and no member owns more
 * than its even share (62 chunks: 8 each at most), which unbounded
 * rendezvous hashing did not keep (shares of 11 to 29 of 124 chunks).
 * With a member banned, the seven others share the chunks the same way.
 * Nodes listed .. n - 1 compute theirs from a list that leaves them out
 * (cut: a larger swarm's, TESSERA_SWARM_MEMBERS, "members_cut"; else a
 * whole list, as while their leases lapsed).
 */
static void owners_of(int n, int listed, bool cut, int banned, uint32_t nchunks, uint8_t *mine,
		      bool *seed)
{
	json_t *ans = json_pack("{s:[]}", "members");
	char id[TRK_ID_MAX];

	if (cut)
		json_object_set_new(ans, "members_cut", json_true());
	for (int i = 0; i < listed; i++) {
		snprintf(id, sizeof(id), "R%d/0", i + 1);
		json_array_append_new(json_object_get(ans, "members"), json_string(id));
	}
	for (int i = 0; i < n; i++) {
		struct fetcher x = {0};
		char me[TRK_ID_MAX];
		struct fetch f = {0};
		struct fetch_parcel p = {0};
		struct proto_mparcel mp = {.nchunks = nchunks};
		char bad[1][TRK_ID_MAX];
		uint8_t counts[1] = {BAN_BAD_CHUNKS};

		x.fanout = true;
		x.f = &f;
		snprintf(me, sizeof(me), "R%d/0", i + 1);
		x.o.id = me;
		x.o.am = &no_metrics;
		f.parcels = &p;
		f.nparcels = 1;
		if (banned >= 0) {
			snprintf(bad[0], sizeof(bad[0]), "R%d/0", banned + 1);
			f.bad_ids = bad;
			f.bad_counts = counts;
			f.nbad = 1;
		}
		p.mp = &mp;
		p.mine = &mine[(size_t)i * nchunks];
		p.owner = calloc(nchunks, sizeof(*p.owner));
		assert_non_null(p.owner);
		fetch_owners(&x, x.f, 0, ans);
		seed[i] = p.seed;
		free(p.owner);
		free(p.members);
	}
	json_decref(ans);
}

static void test_picker_owners_even(void **state)
{
	enum { N = 8, CHUNKS = 62 };
	uint8_t mine[(N + 3) * CHUNKS];
	bool seed[N + 3];

	for (int banned = -1; banned < 1; banned++) {
		int share = banned < 0 ? (CHUNKS + N - 1) / N : (CHUNKS + N - 2) / (N - 1);
		owners_of(N, N, false, banned, CHUNKS, mine, seed);
		for (int c = 0; c < CHUNKS; c++) {
			int owners = 0;
			for (int i = 0; i < N; i++)
				owners += i != banned && mine[i * CHUNKS + c];
			assert_int_equal(owners, 1);
		}
		for (int i = 0; i < N; i++) {
			int own = 0;
			for (int c = 0; c < CHUNKS; c++)
				own += mine[i * CHUNKS + c];
			if (i != banned)
				assert_true(own <= share);
		}
	}
	/* A node left out of a whole list (its lease lapsed) still reads
	 * its share (its peers keep it as a member while it answers). */
	owners_of(N + 1, N, false, -1, CHUNKS, mine, seed);
	assert_true(seed[N]);
	/* Three more nodes a cut list leaves out: no seed readers, they own
	 * nothing, and the listed eight still own every chunk once. */
	owners_of(N + 3, N, true, -1, CHUNKS, mine, seed);
	for (int c = 0; c < CHUNKS; c++) {
		int owners = 0;
		for (int i = 0; i < N + 3; i++)
			owners += mine[i * CHUNKS + c];
		assert_int_equal(owners, 1);
	}
	for (int i = 0; i < N + 3; i++) {
		assert_true(seed[i] == (i < N));
		for (int c = 0; i >= N && c < CHUNKS; c++)
			assert_false(mine[i * CHUNKS + c]);
	}
}

/*
 * Stealing (fetch_pick_steal): a seed reader whose own chunks have all
 * left the trainer takes one of another owner's that it stands in for.
 * Eight members compute owners and stand-ins from the same list: every
 * chunk has one stand-in, never its owner, so idle readers that steal at
 * once take different chunks (the trainer sends none twice for that);
 * nothing is taken from an owner whose have-page is stale, from an owner
 * with fewer than STEAL_LEFT chunks not started, a chunk a peer is
 * fetching, or by a member that is not a seed reader.
 */
enum { SN = 8, SCHUNKS = 124 };
struct steal_view {
	struct fetcher x;
	char id[TRK_ID_MAX];
	struct fetch f;
	struct fetch_parcel p;
	struct proto_mparcel mp;
	struct fetch_source srcs[SN];
	uint8_t have[SN][2 * ((SCHUNKS + 7) / 8)];
	uint8_t mine[SCHUNKS], state[SCHUNKS], peer_busy[SCHUNKS], owner_on[SCHUNKS];
	uint8_t standin[SCHUNKS];
	uint16_t avail[SCHUNKS];
	uint32_t owner[SCHUNKS];
};

static void steal_view_init(struct steal_view *v, int i, json_t *ans)
{
	v->x.fanout = true;
	v->x.f = &v->f;
	snprintf(v->id, sizeof(v->id), "R%d/0", i + 1);
	v->x.o.id = v->id;
	v->x.o.am = &no_metrics;
	v->f.parcels = &v->p;
	v->f.nparcels = 1;
	v->mp.nchunks = SCHUNKS;
	v->p.mp = &v->mp;
	v->p.mine = v->mine;
	v->p.state = v->state;
	v->p.peer_busy = v->peer_busy;
	v->p.owner_on = v->owner_on;
	v->p.standin = v->standin;
	v->p.avail = v->avail;
	v->p.owner = v->owner;
	fetch_owners(&v->x, &v->f, 0, ans);
	assert_true(v->p.seed);
	/* Every other member's page, read just now; ours all left the trainer. */
	for (int k = 0, j = 0; k < SN; k++) {
		if (k == i)
			continue;
		v->srcs[j].info.peer = true;
		snprintf(v->srcs[j].info.id, sizeof(v->srcs[j].info.id), "R%d/0", k + 1);
		v->srcs[j].have = v->have[j];
		v->srcs[j].have_page_ms = node_now_ms();
		j++;
	}
	v->p.srcs = v->srcs;
	v->p.nsrcs = SN - 1;
	for (uint32_t c = 0; c < SCHUNKS; c++) {
		v->owner_on[c] = v->owner[c] < v->p.nmembers;
		v->state[c] = v->mine[c] ? 2 : 0;
	}
}

static void test_picker_steal(void **state)
{
	json_t *ans = json_pack("{s:[]}", "members");
	struct steal_view *v = calloc(SN, sizeof(*v));
	uint32_t got[SN];
	char id[TRK_ID_MAX];
	int stole = 0;

	assert_non_null(v);
	for (int i = 0; i < SN; i++) {
		snprintf(id, sizeof(id), "R%d/0", i + 1);
		json_array_append_new(json_object_get(ans, "members"), json_string(id));
	}
	for (int i = 0; i < SN; i++)
		steal_view_init(&v[i], i, ans);
	for (uint32_t c = 0; c < SCHUNKS; c++) {
		int owners = 0, standins = 0;
		for (int i = 0; i < SN; i++) {
			owners += v[i].mine[c];
			standins += v[i].standin[c];
			assert_false(v[i].mine[c] && v[i].standin[c]);
		}
		assert_int_equal(owners, 1);
		assert_int_equal(standins, 1);
	}
	/* Everyone idle at once: different chunks, each of another owner. */
	for (int i = 0; i < SN; i++) {
		got[i] = fetch_pick_steal(&v[i].x, 0);
		if (got[i] == UINT32_MAX)
			continue;
		stole++;
		assert_true(got[i] < SCHUNKS);
		assert_false(v[i].mine[got[i]]);
		assert_true(v[i].standin[got[i]]);
		for (int k = 0; k < i; k++)
			assert_true(got[k] != got[i]);
	}
	assert_true(stole > 0);
	for (int i = 0; i < SN; i++) {
		struct steal_view *w = &v[i];
		uint32_t c = got[i];
		if (c == UINT32_MAX)
			continue;
		/* A peer is fetching it (its busy bit): another one, or none. */
		w->peer_busy[c] = 1;
		assert_true(fetch_pick_steal(&w->x, 0) != c);
		w->peer_busy[c] = 0;
		/* Not a seed reader: nothing. */
		w->p.seed = false;
		assert_int_equal(fetch_pick_steal(&w->x, 0), UINT32_MAX);
		w->p.seed = true;
		/* The pages are stale: nothing. */
		for (int k = 0; k < SN - 1; k++)
			w->srcs[k].have_page_ms = 0;
		assert_int_equal(fetch_pick_steal(&w->x, 0), UINT32_MAX);
		for (int k = 0; k < SN - 1; k++)
			w->srcs[k].have_page_ms = node_now_ms();
		/* Every owner has one chunk not started: left to it. */
		uint32_t left[SN] = {0};
		for (uint32_t k = 0; k < SCHUNKS; k++) {
			if (w->mine[k])
				continue;
			w->state[k] = left[w->owner[k]] < 1 ? 0 : 2;
			left[w->owner[k]]++;
		}
		assert_int_equal(fetch_pick_steal(&w->x, 0), UINT32_MAX);
	}
	for (int i = 0; i < SN; i++)
		free(v[i].p.members);
	free(v);
	json_decref(ans);
}

/*
 * A fresh version's first read (fetch->fresh_until_ms, which the agent sets
 * from the watch answer: node/agent/version.c, agent_note_fresh): while the
 * version is fresh, its first read goes to the publisher although a listed
 * peer's have-page is still to come; not fresh (a late joiner), the pick
 * waits for that page (HAVE_WAIT_MS) as before.
 */
static void test_picker_fresh_first_read(void **state)
{
	struct proto_chunk chunks[4] = {{.size = 4096}, {.size = 4096}, {.size = 4096}, {.size = 4096}};
	struct proto_mparcel mp = {.nchunks = 4, .chunks = chunks, .bytes = 4 * 4096,
				   .wire_bytes = 4 * 4096};
	uint8_t st[4] = {0}, busy[4] = {0}, mine[4] = {1, 1, 1, 1}, on[4] = {0};
	uint16_t avail[4] = {0};
	uint64_t busy_ms[4] = {0};
	struct fetch_source srcs[2] = {{.info = {.peer = true, .id = "R2/0"}},
				       {.info = {.peer = false, .id = "pub"}, .fa_valid = true}};
	struct fetch_parcel p = {.mp = &mp, .state = st, .avail = avail, .peer_busy = busy,
				 .busy_ms = busy_ms, .mine = mine, .owner_on = on, .srcs = srcs,
				 .nsrcs = 2};
	struct fetch f = {.version = 5, .parcels = &p, .nparcels = 1};
	struct fetcher x = {.fanout = true, .f = &f, .chunk_size = 4096, .max_inflight = 16};
	uint32_t c = UINT32_MAX;
	bool want;

	x.o.id = "R1/0";
	x.o.am = &no_metrics;
	srcs[0].listed_ms = srcs[1].listed_ms = node_now_ms();
	p.progress_ms = node_now_ms();
	/* Not fresh: the peer's page is waited for. */
	assert_null(fetch_pick(&x, 0, &c, &want));
	/* Fresh: the publisher's chunk at once. */
	f.fresh_until_ms = node_now_ms() + STARVE_MS;
	assert_ptr_equal(fetch_pick(&x, 0, &c, &want), &srcs[1]);
	assert_true(c < 4);
	assert_int_equal(st[c], CHUNK_TODO); /* the pick posts nothing */
	/* No longer fresh: the page again. */
	f.fresh_until_ms = 0;
	assert_null(fetch_pick(&x, 0, &c, &want));
}

/*
 * A seed reader's share of the trainer (picker.c, pub_window): a
 * reader that measured the whole trainer link (it came first, alone on it)
 * keeps at most TESSERA_INFLIGHT chunks over the parcel's owners queued
 * on the trainer, two at least: 2 of 32 with 16 owners, 8 with 4; alone
 * in its swarm, or in star mode, what its rate asks for (TESSERA_INFLIGHT
 * here). Counted by the reads the picks post before the trainer has no
 * room.
 */
#define WN 256

static uint32_t trainer_reads(int members, bool fanout)
{
	static struct proto_chunk chunks[WN];
	struct proto_mparcel mp = {.nchunks = WN, .chunks = chunks};
	static uint8_t st[WN], busy[WN], mine[WN], on[WN], standin[WN];
	static uint16_t avail[WN];
	static uint64_t busy_ms[WN];
	static uint32_t owner[WN];
	struct fetch_source pub = {.info = {.peer = false, .id = "pub"}, .fa_valid = true};
	struct fetch_parcel p = {.mp = &mp, .state = st, .avail = avail, .peer_busy = busy,
				 .busy_ms = busy_ms, .mine = mine, .owner_on = on, .owner = owner,
				 .standin = standin, .srcs = &pub, .nsrcs = 1,
				 .progress_ms = node_now_ms()};
	struct fetch f = {.version = 5, .parcels = &p, .nparcels = 1};
	struct fetcher x = {.fanout = fanout, .f = &f, .chunk_size = 4096,
			       .max_inflight = 32};
	json_t *ans = json_pack("{s:[]}", "members");
	char id[TRK_ID_MAX];
	uint32_t c, posted = 0;
	bool want;

	memset(st, 0, sizeof(st));
	memset(busy, 0, sizeof(busy));
	memset(avail, 0, sizeof(avail));
	for (uint32_t i = 0; i < WN; i++)
		chunks[i] = (struct proto_chunk){.size = 4096};
	x.o.id = "R1/0";
	x.o.am = &no_metrics;
	for (int i = 0; i < members; i++) {
		snprintf(id, sizeof(id), "R%d/0", i + 1);
		json_array_append_new(json_object_get(ans, "members"), json_string(id));
	}
	fetch_owners(&x, x.f, 0, ans);
	if (!fanout)
		memset(mine, 1, sizeof(mine));
	/* The whole trainer link measured: 12 MB/s, its window 12 MB. */
	pub.rate = 12000000;
	pub.progress_ms = node_now_ms();
	while (posted < WN && fetch_pick(&x, 0, &c, &want) == &pub) {
		assert_true(mine[c]);
		st[c] = 1;
		fetch_source_posted(&pub, 4096);
		posted++;
	}
	free(p.members);
	json_decref(ans);
	return posted;
}

static void test_picker_trainer_share(void **state)
{
	assert_int_equal(trainer_reads(16, true), 2);
	assert_int_equal(trainer_reads(4, true), 8);
	assert_int_equal(trainer_reads(1, true), 32);
	assert_int_equal(trainer_reads(16, false), 32);
}

/*
 * The trainer's last wave (picker.c, trainer_late): with one of our
 * trainer reads out ENDGAME_MS for a chunk no peer holds, and no more such
 * chunks left than the parcel has owners, a reader keeps two chunks of
 * peer reads in flight, not the four its window to a fast peer allows;
 * with that read younger, outside the last wave, or once a peer holds
 * the chunk, four. Counted by the peer reads the picks post.
 */
#define LW 16

static uint32_t peer_reads_beside(uint64_t trainer_age_ms, uint32_t nowners, bool peer_has_it,
				  bool all_else_held)
{
	struct proto_chunk chunks[LW];
	struct proto_mparcel mp = {.nchunks = LW, .chunks = chunks};
	uint8_t st[LW] = {0}, busy[LW] = {0}, mine[LW] = {0}, on[LW] = {0};
	uint8_t have[2 * LW / 8] = {0};
	uint16_t avail[LW] = {0};
	uint64_t busy_ms[LW] = {0};
	uint32_t owner[LW], c, posted = 0;
	uint64_t now = node_now_ms();
	struct fetch_source srcs[2] = {
		{.info = {.peer = true, .id = "R2/0"}, .fa_valid = true, .have = have},
		{.info = {.peer = false, .id = "pub"}, .fa_valid = true}};
	struct fetch_parcel p = {.mp = &mp, .state = st, .avail = avail, .peer_busy = busy,
				 .busy_ms = busy_ms, .mine = mine, .owner_on = on, .owner = owner,
				 .srcs = srcs, .nsrcs = 2, .progress_ms = now, .nowners = nowners};
	struct fetch f = {.version = 5, .parcels = &p, .nparcels = 1};
	static struct fetch_read reads[LW];
	struct fetcher x = {.fanout = true, .f = &f, .chunk_size = 4096, .max_inflight = 32,
			       .reads = reads, .nreads = LW, .gen = 1};
	bool want;

	memset(reads, 0, sizeof(reads));
	x.o.id = "R1/0";
	x.o.am = &no_metrics;
	for (uint32_t i = 0; i < LW; i++) {
		chunks[i] = (struct proto_chunk){.size = 4096};
		owner[i] = UINT32_MAX;
	}
	/* The peer holds chunks 0-11 and answers at 10 MB/s (a window of 4). */
	for (uint32_t i = 0; i < 12; i++) {
		have[i / 8] |= (uint8_t)(1u << (i % 8));
		avail[i] = 1;
	}
	srcs[0].have_ms = srcs[0].listed_ms = now;
	srcs[0].rate = 10000000;
	/* Chunks 14-15 are ours (13 too if all_else_held), 12 comes from the
	 * trainer, its read this old. */
	st[13] = all_else_held ? 2 : 0;
	st[14] = st[15] = 2;
	st[12] = 1;
	avail[12] = peer_has_it;
	reads[0] = (struct fetch_read){.x = &x, .parcel = 0, .chunk = 12, .len = 4096,
				       .busy = true, .in_fabric = true, .gen = 1,
				       .started_ms = now - trainer_age_ms};
	fetch_source_posted(&srcs[1], 4096);
	srcs[1].progress_ms = now;
	while (posted < 8 && fetch_pick(&x, 0, &c, &want) == &srcs[0]) {
		assert_true(c < 12);
		st[c] = 1;
		reads[1 + posted] = (struct fetch_read){.x = &x, .parcel = 0, .chunk = c, .len = 4096,
							.src_peer = true, .busy = true,
							.in_fabric = true, .gen = 1, .started_ms = now};
		fetch_source_posted(&srcs[0], 4096);
		posted++;
	}
	return posted;
}

static void test_picker_trainer_last_wave(void **state)
{
	assert_int_equal(peer_reads_beside(ENDGAME_MS + 500, 4, false, true), WINDOW_MIN_CHUNKS);
	assert_int_equal(peer_reads_beside(ENDGAME_MS + 500, 1, false, true), WINDOW_MIN_CHUNKS);
	assert_int_equal(peer_reads_beside(ENDGAME_MS / 2, 4, false, true), 4);
	assert_int_equal(peer_reads_beside(ENDGAME_MS + 500, 4, true, true), 4);
	/* Two chunks no peer holds (12, and 13 not ours yet), one owner: not
	 * the last wave. */
	assert_int_equal(peer_reads_beside(ENDGAME_MS + 500, 1, false, false), 4);
}

/* One reader (R1/0) of a fanout fetch with one parcel of QN chunks and
 * three peers (R2, R3, R4), for the queue tests below. */
struct rig {
	struct qparcel q;
	struct fetch f;
	struct fetcher x;
};

static void rig_init(struct rig *r, uint64_t now)
{
	memset(r, 0, sizeof(*r));
	r->f = (struct fetch){.version = 5, .parcels = &r->q.p, .nparcels = 1};
	r->x = (struct fetcher){.fanout = true, .f = &r->f, .chunk_size = 4096,
				.max_inflight = 16};
	r->x.o.id = "R1/0";
	r->x.o.am = &no_metrics;
	qparcel_init(&r->q, QN, 4096, 3, now);
}

/*
 * Per-peer queues (picker.c): among the holders of a chunk a reader
 * asks the one whose queue of its reads empties first (an unmeasured,
 * empty one before one with a read queued), and a reader ahead of its
 * swarm (AHEAD_CHUNKS more chunks than the median peer's page shows)
 * keeps one read per peer (with TESSERA_AHEAD_PEERS=2, at two peers at
 * once), giving way to the readers behind; not ahead, it queues up to
 * TESSERA_PEER_INFLIGHT at every peer. Counted by the picks made.
 */
static void test_picker_peer_queues(void **state)
{
	uint32_t c = UINT32_MAX;
	uint64_t now = node_now_ms();
	struct rig r;

	rig_init(&r, now);
	struct qparcel *qp = &r.q;
	uint8_t *st = qp->st, (*have)[2 * QN / 8] = qp->have;
	uint16_t *avail = qp->avail;
	struct fetch_source *srcs = qp->srcs;
	struct fetch *f = &r.f;
	struct fetcher *x = &r.x;
	bool want;

	srcs[2].bad_until_ms = UINT64_MAX; /* R4 rests until the last part */
	for (uint32_t i = 40; i < 50; i++) /* the peers hold chunks 40-49 */
		have[0][i / 8] = have[1][i / 8] = have[2][i / 8] |= (uint8_t)(1u << (i % 8));

	/* Not ahead (12 held, the peers 10): the emptier queue first. */
	for (uint32_t i = 0; i < 12; i++)
		st[i] = 2;
	qp->p.done = 12;
	fetch_recount(f, &qp->p);
	assert_false(qp->p.ahead);
	assert_int_equal(avail[40], 2);
	srcs[0].rate = 1000000; /* R2: measured, one read queued */
	fetch_source_posted(&srcs[0], 4096);
	srcs[0].progress_ms = now;
	assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[1]);
	assert_true(c >= 40 && c < 50);
	srcs[1].rate = 1000000; /* R3: two queued, more than R2 */
	fetch_source_posted(&srcs[1], 4096);
	fetch_source_posted(&srcs[1], 4096);
	srcs[1].progress_ms = now;
	assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[0]);

	/* Ahead (40 held, the median peer 10): one read per peer at most. */
	for (uint32_t i = 0; i < 40; i++)
		st[i] = 2;
	qp->p.done = 40;
	fetch_recount(f, &qp->p);
	assert_true(qp->p.ahead);
	assert_null(fetch_pick(x, 0, &c, &want)); /* both have one out */
	fetch_source_done(&srcs[1], 4096, true);
	fetch_source_done(&srcs[1], 4096, true);
	assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[1]);
	/* R4 back, idle: ahead, a third peer at once (no limit by default),
	 * but not with TESSERA_AHEAD_PEERS=2; R3's read lands, and R3 or R4
	 * (both empty) may take one. */
	srcs[2].bad_until_ms = 0;
	fetch_source_posted(&srcs[1], 4096);
	fetch_recount(f, &qp->p);
	assert_true(qp->p.ahead);
	assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[2]);
	setenv("TESSERA_AHEAD_PEERS", "2", 1);
	assert_null(fetch_pick(x, 0, &c, &want));
	fetch_source_done(&srcs[1], 4096, true);
	struct fetch_source *got = fetch_pick(x, 0, &c, &want);
	assert_true(got == &srcs[1] || got == &srcs[2]); /* idle both; R2 has its one */
	unsetenv("TESSERA_AHEAD_PEERS");
	/* The swarm catches up (the peers' pages show 40 more): not ahead,
	 * and a second read may go to a busy peer again. */
	for (uint32_t i = 0; i < 40; i++)
		have[0][i / 8] = have[1][i / 8] = have[2][i / 8] |= (uint8_t)(1u << (i % 8));
	fetch_recount(f, &qp->p);
	assert_false(qp->p.ahead);
	fetch_source_posted(&srcs[1], 4096);
	fetch_source_posted(&srcs[2], 4096);
	assert_non_null(fetch_pick(x, 0, &c, &want));
}

/*
 * Rarest first (fetch_pick, pick_holder): the chunk the fewest peers
 * hold, from the least queued of its holders, round-robin among equals;
 * the parcel's short last chunk gets a holder too. Three peers: R2 holds
 * 0-9 and the last chunk, R3 0-4, R4 0-4 and 8-9.
 */
static void test_picker_rarest_first(void **state)
{
	uint32_t c = UINT32_MAX;
	uint64_t now = node_now_ms();
	struct rig r;

	rig_init(&r, now);
	struct qparcel *qp = &r.q;
	uint8_t *st = qp->st, (*have)[2 * QN / 8] = qp->have;
	uint16_t *avail = qp->avail;
	struct fetch_source *srcs = qp->srcs;
	struct fetch *f = &r.f;
	struct fetcher *x = &r.x;
	bool want;

	qp->chunks[QN - 1].size = 1000;
	for (uint32_t i = 0; i < QN; i++) {
		bool h0 = i < 10 || i == QN - 1, h1 = i < 5, h2 = i < 5 || i == 8 || i == 9;
		have[0][i / 8] |= (uint8_t)(h0 << (i % 8));
		have[1][i / 8] |= (uint8_t)(h1 << (i % 8));
		have[2][i / 8] |= (uint8_t)(h2 << (i % 8));
	}
	fetch_recount(f, &qp->p);
	assert_int_equal(avail[0], 3);
	assert_int_equal(avail[8], 2);
	assert_int_equal(avail[5], 1);

	/* Chunks 5-7 and the last one only R2 holds: those first, from R2,
	 * the short last one among them. */
	bool last = false;
	for (int i = 0; i < 4; i++) {
		assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[0]);
		assert_true((c >= 5 && c <= 7) || c == QN - 1);
		assert_int_equal(st[c], 0);
		last |= c == QN - 1;
		st[c] = 1; /* posted, and landed at once: R2's queue stays empty */
	}
	assert_true(last);
	/* Then 8-9 (two holders): the emptier queue, R4, as R2 has a read
	 * of ours queued, though the round-robin comes to R2 first (the walk
	 * meets chunk 0 first, which R4, next from p->rr, takes: p->rr is R2
	 * when chunk 8 is weighed). */
	srcs[0].rate = 1000000;
	fetch_source_posted(&srcs[0], 4096);
	srcs[0].progress_ms = now;
	qp->p.rr = 2;
	assert_ptr_equal(fetch_pick(x, 0, &c, &want), &srcs[2]);
	assert_int_equal(c, 8);
	st[c] = 1;
	/* R2's queue empties: each pick weighs chunk 0 first (R2, next
	 * from p->rr, would take it), then chunk 9, rarer, which R4 takes
	 * (R3 lacks it); then chunks 0-4 go round-robin among all three. */
	fetch_source_done(&srcs[0], 4096, true);
	const int order[6] = {2, 0, 1, 2, 0, 1};
	for (int i = 0; i < 6; i++) {
		struct fetch_source *got = fetch_pick(x, 0, &c, &want);
		assert_ptr_equal(got, &srcs[order[i]]);
		assert_true(i == 0 ? c == 9 : c < 5);
		st[c] = 1;
	}
	/* Every chunk a peer holds is out: nothing more from the peers. */
	f->fresh_until_ms = UINT64_MAX; /* and none from a publisher (there is none) */
	assert_null(fetch_pick(x, 0, &c, &want));
}

/*
 * Rarest first in turns (herd_turn): R2 alone holds chunks 0-19, all
 * three peers 40-49. Every reader may take a chunk of three holders; one
 * of R2's alone only in its turn, with TESSERA_HERD_READERS=1 about one
 * in three. So fewer than 20 of them come before 40-49, and the others
 * not while reads of ours are out (more than HERD_OUT); with none out
 * and nothing else to read, they come all the same. With the turns off
 * (0), all 20 first.
 */
static uint32_t herd_rig(struct rig *r, uint64_t now)
{
	uint8_t(*have)[2 * QN / 8] = r->q.have;

	rig_init(r, now);
	for (uint32_t i = 0; i < 20; i++)
		have[0][i / 8] |= (uint8_t)(1u << (i % 8));
	for (uint32_t i = 40; i < 50; i++)
		have[0][i / 8] = have[1][i / 8] = have[2][i / 8] |= (uint8_t)(1u << (i % 8));
	for (uint32_t i = 50; i < QN; i++) /* held here already: the peers have what we lack */
		r->q.st[i] = CHUNK_DONE;
	r->f.fresh_until_ms = UINT64_MAX; /* no publisher pass */
	fetch_recount(&r->f, &r->q.p);
	assert_int_equal(r->q.avail[0], 1);
	assert_int_equal(r->q.avail[40], 3);
	/* Picks, each posted (reading); how many of 0-19 before the first of 40-49. */
	uint32_t c = UINT32_MAX, before = 0;
	bool want, seen = false;
	for (int k = 0; k < 30; k++) {
		if (fetch_pick(&r->x, 0, &c, &want) == NULL)
			break;
		assert_int_equal(r->q.st[c], CHUNK_TODO);
		r->q.st[c] = CHUNK_READING;
		seen |= c >= 40;
		before += !seen && c < 20;
	}
	return before;
}

static void test_picker_herd_turns(void **state)
{
	uint64_t now = node_now_ms();
	uint32_t c = UINT32_MAX, left = 0;
	struct rig r;
	bool want;

	setenv("TESSERA_HERD_READERS", "1", 1);
	uint32_t before = herd_rig(&r, now);
	assert_true(before > 0 && before < 20);
	for (uint32_t i = 0; i < 20; i++)
		left += r.q.st[i] == CHUNK_TODO;
	assert_true(left > 0); /* not our turn, and ten reads of ours are out */
	for (uint32_t i = 40; i < 50; i++)
		assert_int_equal(r.q.st[i], CHUNK_READING);
	/* Every read of ours lands: the rest, out of turn, one by one. */
	for (uint32_t i = 0; i < 50; i++)
		if (r.q.st[i] == CHUNK_READING)
			r.q.st[i] = CHUNK_DONE;
	assert_ptr_equal(fetch_pick(&r.x, 0, &c, &want), &r.q.srcs[0]);
	assert_true(c < 20);
	unsetenv("TESSERA_HERD_READERS");

	setenv("TESSERA_HERD_READERS", "0", 1);
	assert_int_equal(herd_rig(&r, now), 20);
	unsetenv("TESSERA_HERD_READERS");
}

/*
 * Sources matched to members once per members list (fetch_owners, by a
 * sort of the members' names): each peer gets its member's index (the
 * first of two equal names), a peer outside the swarm and a publisher
 * none; a recount then marks the same owners as serving as matching by
 * name does (members_epoch 0: the name path, as hand-built parcels take).
 */
static void test_picker_members_matched(void **state)
{
	enum { N = 64 };
	json_t *ans = json_pack("{s:[s,s,s,s,s]}", "members", "R5/0", "R2/0", "R3/0", "R2/0", "R9/0");
	static const char *ids[] = {"R9/0", "R2/0", "X/0", "R3/0", "R3/0"};
	static const bool peer[] = {true, true, true, true, false};
	const uint32_t want[] = {4, 1, UINT32_MAX, 2, UINT32_MAX};
	struct fetcher x = {0};
	struct fetch f = {0};
	struct fetch_parcel p = {0};
	struct proto_mparcel mp = {.nchunks = N};
	struct fetch_source srcs[5];
	uint8_t have[5][2 * N / 8], mine[N], st[N], busy[N], on[N], on2[N], standin[N];
	uint16_t avail[N];
	uint64_t busy_ms[N];
	uint32_t owner[N];

	x.fanout = true;
	x.f = &f;
	x.o.id = "R1/0";
	x.o.am = &no_metrics;
	f.parcels = &p;
	f.nparcels = 1;
	memset(srcs, 0, sizeof(srcs));
	memset(have, 0xff, sizeof(have));
	for (int i = 0; i < 5; i++) {
		srcs[i].info.peer = peer[i];
		snprintf(srcs[i].info.id, sizeof(srcs[i].info.id), "%s", ids[i]);
		srcs[i].have = have[i];
	}
	memset(st, 0, sizeof(st));
	p = (struct fetch_parcel){.mp = &mp, .srcs = srcs, .nsrcs = 5, .state = st, .mine = mine,
				  .peer_busy = busy, .owner_on = on, .standin = standin,
				  .avail = avail, .busy_ms = busy_ms, .owner = owner};
	fetch_owners(&x, &f, 0, ans);
	assert_int_equal(p.nmembers, 5);
	assert_int_not_equal(p.members_epoch, 0);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(srcs[i].member_epoch, p.members_epoch);
		assert_int_equal(fetch_source_member(&p, &srcs[i]), want[i]);
	}
	fetch_recount(&f, &p);
	memcpy(on2, on, sizeof(on));
	p.members_epoch = 0; /* by name */
	for (int i = 0; i < 5; i++)
		assert_int_equal(fetch_source_member(&p, &srcs[i]), want[i]);
	fetch_recount(&f, &p);
	assert_memory_equal(on, on2, sizeof(on));
	/* Owners R9/0, R2/0 and R3/0 serve; R5/0 is not listed. */
	for (uint32_t c = 0; c < N; c++)
		assert_int_equal(on[c], owner[c] == 1 || owner[c] == 2 || owner[c] == 4);
	free(p.members);
	json_decref(ans);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_picker_owners_even),
		cmocka_unit_test(test_picker_steal),
		cmocka_unit_test(test_picker_trainer_share),
		cmocka_unit_test(test_picker_trainer_last_wave),
		cmocka_unit_test(test_picker_fresh_first_read),
		cmocka_unit_test(test_picker_peer_queues),
		cmocka_unit_test(test_picker_rarest_first),
		cmocka_unit_test(test_picker_herd_turns),
		cmocka_unit_test(test_picker_members_matched),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
