/* A replica's state in words (tracker/server/rstate.c) and the rate it is
 * given (rate.c): plain inputs, no tracker. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "tracker/server/internal.h"

#define MB 1000000ull

/* Two live ranks of a replica active on v6, the latest v8, fetching v8 at
 * 2 MB/s each, half done of 8 MB each; a young version. */
static void base(struct trk_rs_in *in, struct trk_rs_rank *r)
{
	memset(in, 0, sizeof(*in));
	memset(r, 0, 2 * sizeof(*r));
	for (int i = 0; i < 2; i++) {
		r[i].present = r[i].alive = r[i].reported = true;
		r[i].id = i == 0 ? "B/0" : "B/1";
		r[i].state = TRK_STATE_FETCHING;
		r[i].version = 8;
		r[i].done = 4 * MB;
		r[i].total = 8 * MB;
		r[i].from_trainer = 1 * MB;
		r[i].from_peers = 3 * MB;
		r[i].rate_bps = 2 * MB;
		r[i].error = "";
	}
	in->latest = 8;
	in->active = 6;
	in->target = 8;
	in->lag_ms = 1300;
	in->grace_ms = 5000;
	in->stall_ms = 5000;
	in->nranks = 2;
	in->ranks = r;
}

static void judge(const struct trk_rs_in *in, struct trk_rs_out *out, enum trk_rstate want,
		  const char *has)
{
	trk__rstate_judge(in, out);
	if (out->state != want || strstr(out->why, has) == NULL)
		fail_msg("got %s '%s', want %s with '%s'", trk__rstate_name(out->state), out->why,
			 trk__rstate_name(want), has);
}

/* Mid-fetch of a version 1.3 s old: updating, with rate, sources and
 * finish; the same fetch of a version older than its updates take: behind. */
static void test_updating_or_behind(void **state)
{
	struct trk_rs_in in;
	struct trk_rs_rank r[2];
	struct trk_rs_out o;

	base(&in, r);
	judge(&in, &o, TRK_RSTATE_UPDATING,
	      "fetching v8 at 4.0 MB/s (25 % from the trainer, 75 % from peers), 50 % done, "
	      "expected in 2.0 s");
	assert_int_equal(o.rate_bps, 4 * MB);
	assert_int_equal(o.eta_ms, 2000);
	assert_int_equal(o.fetching, 8);

	in.lag_ms = 9200;
	in.usual_ms = 3000;
	judge(&in, &o, TRK_RSTATE_BEHIND, "slower than the versions come: v7 came 9.2 s ago, "
					  "its last update took 3.0 s; fetching v8 at 4.0 MB/s");
	/* Its own usual update time is the measure when longer. */
	in.usual_ms = 10000;
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8");
	/* The finish is the bytes left at the replica's rate: 8 MB at 3 MB/s. */
	in.usual_ms = 0;
	in.lag_ms = 100;
	r[1].rate_bps = 1 * MB;
	judge(&in, &o, TRK_RSTATE_UPDATING, "expected in 2.7 s");
	/* One rank's rate unknown: the other's is the replica's. */
	r[1].rate_bps = 0;
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8 at 2.0 MB/s");
	assert_int_equal(o.eta_ms, 4000);
	/* No rate at all: no finish, and none is made up. */
	r[0].rate_bps = 0;
	judge(&in, &o, TRK_RSTATE_UPDATING, "50 % done, no rate yet");
	assert_int_equal(o.eta_ms, UINT64_MAX);
	assert_null(strstr(o.why, "expected"));
}

/* The total is the whole replica's from the start: a rank not reporting
 * yet counts its parcels' size, one that holds the version counts done,
 * so "% done" never goes back as ranks report or finish. */
static void test_progress_whole_replica(void **state)
{
	struct trk_rs_in in;
	struct trk_rs_rank r[2];
	struct trk_rs_out o;

	base(&in, r);
	in.want_version = 8;
	in.sized = true;
	r[0].want_bytes = r[1].want_bytes = 8 * MB;
	r[1].reported = false; /* not reported yet */
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8 at 2.0 MB/s");
	assert_int_equal(o.total, 16 * MB);
	assert_int_equal(o.done, 4 * MB);
	assert_int_equal(o.eta_ms, 6000); /* 12 MB left at 2 MB/s */
	assert_non_null(strstr(o.why, "25 % done, expected in 6.0 s"));
	/* Rank 1 reports: the total stays; rank 0 holds it whole: done. */
	r[1].reported = true;
	r[1].done = 1 * MB;
	judge(&in, &o, TRK_RSTATE_UPDATING, "31 % done");
	assert_int_equal(o.total, 16 * MB);
	r[0].state = TRK_STATE_VERIFIED;
	r[0].done = 8 * MB;
	judge(&in, &o, TRK_RSTATE_UPDATING, "56 % done, expected in 3.5 s");
	assert_int_equal(o.total, 16 * MB);

	/* Not sized, a rank not reporting: no total, no share, no finish. */
	base(&in, r);
	r[1].reported = false;
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8 at 2.0 MB/s (25 % from the trainer, "
					    "75 % from peers), 1 of 2 ranks reporting");
	assert_int_equal(o.total, 0);
	assert_int_equal(o.eta_ms, UINT64_MAX);
	assert_int_equal(o.reporting, 1);
	assert_null(strstr(o.why, "% done"));

	/* The first report, nothing measured yet: no "expected in 0.0 s". */
	base(&in, r);
	for (int i = 0; i < 2; i++) {
		r[i].done = r[i].from_trainer = r[i].from_peers = r[i].rate_bps = 0;
		r[i].total = 0;
	}
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8, 2 of 2 ranks reporting, no rate yet");
	in.want_version = 8;
	in.sized = true;
	r[0].want_bytes = r[1].want_bytes = 8 * MB;
	judge(&in, &o, TRK_RSTATE_UPDATING, "fetching v8, 0 % done, no rate yet");
	assert_int_equal(o.eta_ms, UINT64_MAX);
}

static void test_current_failed_gone(void **state)
{
	struct trk_rs_in in;
	struct trk_rs_rank r[2];
	struct trk_rs_out o;

	base(&in, r);
	in.active = 8;
	r[0].state = r[1].state = TRK_STATE_ACTIVE;
	judge(&in, &o, TRK_RSTATE_CURRENT, "active on v8, the latest");

	/* A rank whose last report is a failure: failed, with its error. */
	base(&in, r);
	r[1].state = TRK_STATE_FAILED;
	r[1].error = "v8: in-place install of v8 failed";
	judge(&in, &o, TRK_RSTATE_FAILED, "rank 1 (B/1) failed v8: v8: in-place install");
	/* Trying again: behind, the failure said first, however young. */
	r[1].state = TRK_STATE_FETCHING;
	judge(&in, &o, TRK_RSTATE_BEHIND,
	      "rank 1 (B/1) failed: v8: in-place install of v8 failed; trying again: fetching v8");

	/* A rank gone: behind, naming it and why it went (its own words: it
	 * left; its lease expired, counted from its last heartbeat); every
	 * rank gone: gone. */
	base(&in, r);
	r[1].alive = false;
	r[1].gone_ms = 14300;
	r[1].beat_ms = 14800;
	r[1].gone_why = "left";
	judge(&in, &o, TRK_RSTATE_BEHIND, "rank 1 (B/1) left 14 s ago; fetching v8");
	r[1].gone_why = "lease expired";
	r[1].gone_ms = 4000;
	r[1].beat_ms = 9200;
	judge(&in, &o, TRK_RSTATE_BEHIND,
	      "rank 1 (B/1): lease expired, last heartbeat 9.2 s ago; fetching v8");
	r[0].alive = false;
	r[0].gone_why = "left";
	r[0].gone_ms = 3000;
	judge(&in, &o, TRK_RSTATE_GONE, "no rank alive: rank 0 (B/0) left 3.0 s ago");
	assert_null(strstr(o.why, "heartbeat"));
	base(&in, r);
	r[0].present = r[0].alive = false;
	r[0].id = NULL;
	judge(&in, &o, TRK_RSTATE_BEHIND, "rank 0 has not registered");
	/* Dead while active on the latest is not current either. */
	base(&in, r);
	in.active = 8;
	r[0].alive = false;
	judge(&in, &o, TRK_RSTATE_BEHIND, "rank 0 (B/0): gone");

	/* No version published yet: nothing to be behind, never "v0". */
	base(&in, r);
	in.latest = in.active = in.target = 0;
	r[0].reported = r[1].reported = false;
	judge(&in, &o, TRK_RSTATE_CURRENT, "no version published yet");
	assert_null(strstr(o.why, "v0"));
	/* Joined late, holding none: it says so, and what it waits for. */
	in.latest = in.target = 24;
	judge(&in, &o, TRK_RSTATE_BEHIND,
	      "none active yet; waiting for sources: no rank has started v24 yet");
	assert_null(strstr(o.why, "v0"));
}

static void test_behind_reasons(void **state)
{
	struct trk_rs_in in;
	struct trk_rs_rank r[2];
	struct trk_rs_out o;

	base(&in, r);
	in.uncovered = true;
	judge(&in, &o, TRK_RSTATE_BEHIND, "no version covers its layout yet");

	/* Nobody started the target. */
	base(&in, r);
	r[0].version = r[1].version = 6;
	r[0].state = r[1].state = TRK_STATE_ACTIVE;
	judge(&in, &o, TRK_RSTATE_BEHIND, "waiting for sources: no rank has started v8 yet");
	r[0].reported = r[1].reported = false;
	judge(&in, &o, TRK_RSTATE_BEHIND, "waiting for sources");

	/* One rank holds the target, the other has not begun it. */
	base(&in, r);
	r[0].state = TRK_STATE_VERIFIED;
	r[1].version = 6;
	r[1].state = TRK_STATE_ACTIVE;
	judge(&in, &o, TRK_RSTATE_BEHIND, "waiting for rank 1 (B/1) to start v8");
	/* Every rank holds it: activating. */
	r[1].version = 8;
	r[1].state = TRK_STATE_VERIFIED;
	judge(&in, &o, TRK_RSTATE_UPDATING, "every rank holds v8, activating");

	/* Bytes that stopped growing. */
	base(&in, r);
	r[1].still_ms = 7000;
	r[1].rate_bps = 0;
	judge(&in, &o, TRK_RSTATE_BEHIND, "no progress for 7.0 s (rank 1 (B/1)); fetching v8");
}

/* The rate is of the last five seconds' bytes, not since the start;
 * a restart of the fetch starts it over; silence brings it down. */
static void test_rate_window(void **state)
{
	struct trk_rate r = {0};
	uint64_t t = 1000000;

	assert_int_equal(trk__rate_bps(&r, t), 0);
	trk__rate_sample(&r, t, 0);
	assert_int_equal(trk__rate_bps(&r, t), 0); /* one sample: no rate */
	/* 10 MB/s for 10 s, then 1 MB/s for 10 s, reports every 500 ms. */
	uint64_t bytes = 0;
	for (int i = 1; i <= 20; i++)
		trk__rate_sample(&r, t + 500 * (uint64_t)i, bytes += 5 * MB);
	assert_int_equal(trk__rate_bps(&r, t + 10000), 10 * MB);
	t += 10000;
	for (int i = 1; i <= 20; i++)
		trk__rate_sample(&r, t + 500 * (uint64_t)i, bytes += MB / 2);
	t += 10000;
	assert_int_equal(trk__rate_bps(&r, t), 1 * MB); /* since the start: 5.5 MB/s */
	assert_int_equal(trk__rate_still_ms(&r, t + 300), 300);
	/* Reports close together replace each other. */
	trk__rate_sample(&r, t + 50, bytes);
	assert_int_equal(trk__rate_still_ms(&r, t + 300), 300);
	/* Nothing more for 10 s: the rate falls. */
	assert_true(trk__rate_bps(&r, t + 10000) < MB / 2);
	/* The fetch started over (fewer bytes): a fresh rate. */
	trk__rate_sample(&r, t + 11000, 0);
	assert_int_equal(trk__rate_bps(&r, t + 11000), 0);
	trk__rate_sample(&r, t + 12000, 3 * MB);
	assert_int_equal(trk__rate_bps(&r, t + 12000), 3 * MB);
}

/* What a fetch says of a rank's link (trk__fetch_bps, the members rule):
 * the highest rate its reports showed, not its bytes over its time. A
 * rank its swarm kept waiting (10 MB/s for a second, then nothing for 9)
 * fetched at 10 MB/s; one at 0.5 MB/s throughout, at 0.5, though over
 * the whole fetch it did half as much as the other, not a twentieth.
 * With fewer than two reports, bytes over time; a fetch started over
 * forgets its old peak. */
static void test_rate_peak(void **state)
{
	struct trk_rate a = {0}, s = {0}, one = {0};
	uint64_t t = 1000000, bytes = 0;
	int first = 0;

	for (int i = 0; i <= 20; i++) {
		trk__rate_sample(&a, t + 500 * (uint64_t)i, i <= 2 ? 5 * MB * (uint64_t)i : 10 * MB);
		first += trk__rate_sample(&s, t + 500 * (uint64_t)i, bytes); /* its first rate: once */
		bytes += MB / 4;
	}
	assert_int_equal(first, 1);
	assert_int_equal(trk__fetch_bps(&a, 10 * MB, 10000), 10 * MB);
	assert_int_equal(trk__fetch_bps(&s, 5 * MB, 10000), MB / 2);
	assert_true(trk__rate_bps(&a, t + 10000) < MB); /* the window's rate: the wait */
	trk__rate_sample(&one, t, 0);
	assert_int_equal(trk__fetch_bps(&one, 3 * MB, 2000), 3 * MB / 2);
	assert_int_equal(trk__fetch_bps(&one, 1000, 0), 1000 * 1000); /* 0 ms counts as 1 */
	trk__rate_sample(&a, t + 11000, 0);
	assert_true(trk__rate_sample(&a, t + 12000, MB)); /* started over: a first rate again */
	assert_int_equal(trk__fetch_bps(&a, MB, 1000), MB);
	/* Members chosen again on first rates: at most once a second. */
	bool fresh = false;
	uint64_t judged = 0, now = 5000;
	assert_false(trk__members_rejudge(&fresh, &judged, now));
	fresh = true;
	assert_true(trk__members_rejudge(&fresh, &judged, now));
	assert_false(fresh);
	fresh = true;
	assert_false(trk__members_rejudge(&fresh, &judged, now + TRK_MEMBERS_REJUDGE_MS - 1));
	assert_true(trk__members_rejudge(&fresh, &judged, now + TRK_MEMBERS_REJUDGE_MS));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_updating_or_behind),
		cmocka_unit_test(test_progress_whole_replica),
		cmocka_unit_test(test_current_failed_gone),
		cmocka_unit_test(test_behind_reasons),
		cmocka_unit_test(test_rate_window),
		cmocka_unit_test(test_rate_peak),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
