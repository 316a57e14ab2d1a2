/* The fanout simulator (tests/sim/): a small calibration case runs to the
 * end, gives the same figures twice for a seed, and the physics it models
 * holds (a star takes N x S/b, every chunk leaves the trainer once in
 * fanout); bad configurations and command lines are refused in one line. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto/log.h"
#include "tests/sim/sim.h"
#include "tests/testutil.h"

/* 8 tp1 replicas of a 16 MiB model on 100 Mbit/s links (the trainer's
 * too): an anchor, then a delta of 1 %. */
static void small(struct sim_cfg *c)
{
	sim_cfg_default(c);
	c->model_bytes = 16u << 20;
	c->versions = 2;
	c->max_sim_s = 120;
}

/* Every replica got version v whole, the trainer sent it about once; its
 * line printed. */
static void delivered_once(const struct sim_cfg *c, const struct sim_result *r, uint32_t v)
{
	const struct sim_version *sv = &r->v[v];
	char line[512];

	sim_line(c, r, v, line, sizeof(line));
	print_message("%s\n", line);
	assert_int_equal(sv->done, c->replicas);
	assert_int_equal(sv->received_bytes, (uint64_t)c->replicas * sv->wire_bytes);
	assert_true(sv->trainer_bytes >= sv->wire_bytes);
	assert_true(sv->trainer_bytes <= sv->wire_bytes + sv->wire_bytes / 10);
}

static void same(const struct sim_result *a, const struct sim_result *b)
{
	assert_int_equal(a->nversions, b->nversions);
	assert_int_equal(a->events, b->events);
	for (uint32_t v = 0; v < a->nversions; v++) {
		assert_true(a->v[v].t_last_s == b->v[v].t_last_s);
		assert_true(a->v[v].t_p50_s == b->v[v].t_p50_s);
		assert_int_equal(a->v[v].trainer_bytes, b->v[v].trainer_bytes);
		assert_int_equal(a->v[v].duplicate_bytes, b->v[v].duplicate_bytes);
		assert_int_equal(a->v[v].tracker_requests, b->v[v].tracker_requests);
		assert_true(a->v[v].down_idle == b->v[v].down_idle);
		assert_true(a->v[v].spread_all == b->v[v].spread_all);
	}
}

/* Where the time over S/b went: a downlink idles at most the last
 * replica's time over S/b (mean over replicas), and a chunk reaches half
 * the replicas no later than all of them. */
static void accounted(const struct sim_cfg *c, const struct sim_result *r, uint32_t v)
{
	const struct sim_version *sv = &r->v[v];
	double sb = (double)sv->wire_bytes / c->link_bps;

	assert_true(sv->down_idle >= 0 && sv->down_idle <= sv->t_last_s / sb - 1 + 0.01);
	assert_true(sv->spread_half > 0 && sv->spread_half <= sv->spread_all);
}

/* Fanout: every replica gets both versions, each chunk leaves the trainer
 * about once, the last replica within 1.5 x S/b (the testbed's goal at
 * N = 8; its runs give 1.05-1.14); the same figures again for the seed. */
static void test_sim_fanout_deterministic(void **state)
{
	struct sim_cfg c;
	struct sim_result r1, r2;
	struct proto_err err;

	small(&c);
	assert_int_equal(sim_run(&c, &r1, &err), 0);
	assert_int_equal(sim_run(&c, &r2, &err), 0);
	same(&r1, &r2);
	assert_int_equal(r1.nversions, 2);
	for (uint32_t v = 0; v < 2; v++) {
		const struct sim_version *sv = &r1.v[v];
		double sb = (double)sv->wire_bytes / c.link_bps;
		delivered_once(&c, &r1, v);
		accounted(&c, &r1, v);
		assert_true(sv->t_last_s >= sb && sv->t_last_s <= 1.5 * sb + 0.5);
	}
	assert_true(r1.v[1].wire_bytes < r1.v[0].wire_bytes / 50);
	/* Another seed: a run of its own, complete all the same. */
	c.seed = 7;
	assert_int_equal(sim_run(&c, &r2, &err), 0);
	assert_int_equal(r2.v[0].done, c.replicas);
}

/* A swarm listed bounded (TESSERA_SWARM_PEERS, TESSERA_SWARM_MEMBERS):
 * 24 replicas, answers of 6 peers and 8 members. Every replica gets both
 * versions though most never list most others; the 16 left out of the
 * members read nothing from the trainer, which sends each chunk about
 * once; the same figures twice. */
static void test_sim_bounded_views(void **state)
{
	struct sim_cfg c;
	struct sim_result r1, r2;
	struct proto_err err;

	small(&c);
	c.replicas = 24;
	setenv("TESSERA_SWARM_PEERS", "6", 1);
	setenv("TESSERA_SWARM_MEMBERS", "8", 1);
	assert_int_equal(sim_run(&c, &r1, &err), 0);
	assert_int_equal(sim_run(&c, &r2, &err), 0);
	unsetenv("TESSERA_SWARM_PEERS");
	unsetenv("TESSERA_SWARM_MEMBERS");
	same(&r1, &r2);
	for (uint32_t v = 0; v < 2; v++)
		delivered_once(&c, &r1, v);
	/* Sampled: the same run as listing all differs (its events). */
	assert_int_equal(sim_run(&c, &r2, &err), 0);
	assert_true(r1.events != r2.events);
}

/* Members that keep up (TESSERA_SWARM_SLOW): 128 replicas, 5 % of them
 * on links at a tenth, two anchors of 64 MiB. Owning trainer chunks, the
 * slow ones hold the others past 2 x S/b in both versions with the rule
 * off; with it the tracker leaves them out of the members once their
 * first reports show their rate (TRK_MEMBERS_REJUDGE_MS), and the others
 * get both within 1.5 x S/b. A small swarm (24 replicas of 16 MiB, two
 * links at a tenth) that the slow ones drag down as a whole: by their
 * whole fetch they kept up with the others (at 1/3 of their rate), by
 * the highest rate their reports showed (trk__fetch_bps) they did not,
 * and the second anchor comes within 1.5 x S/b (6.8 x with the rule
 * off); its first (S/b 1.3 s) is over before their rate is known.
 * Simulated time: deterministic for the seed. */
static void slow_members(const struct sim_cfg *c, double first_max, double off_min)
{
	struct sim_result r;
	struct proto_err err;

	assert_int_equal(sim_run(c, &r, &err), 0);
	double sb = (double)r.v[0].wire_bytes / c->link_bps;
	assert_int_equal(r.v[1].wire_bytes, r.v[0].wire_bytes);
	assert_true(r.v[0].t_slow_s > 0); /* there are stragglers */
	for (uint32_t v = 0; v < 2; v++) {
		char line[512];
		sim_line(c, &r, v, line, sizeof(line));
		print_message("%s\n", line);
		assert_int_equal(r.v[v].done, c->replicas);
	}
	assert_true(first_max == 0 || r.v[0].t_last_s <= first_max * sb);
	assert_true(r.v[1].t_last_s <= 1.5 * sb);
	setenv("TESSERA_SWARM_SLOW", "0", 1);
	assert_int_equal(sim_run(c, &r, &err), 0);
	unsetenv("TESSERA_SWARM_SLOW");
	assert_true(r.v[0].t_last_s > off_min * sb && r.v[1].t_last_s > off_min * sb);
}

static void test_sim_slow_members(void **state)
{
	struct sim_cfg c;

	sim_cfg_default(&c);
	c.replicas = 128;
	c.model_bytes = 64u << 20;
	c.versions = 2;
	c.anchors = true;
	c.stragglers = 0.05;
	c.seed = 1;
	c.max_sim_s = 300;
	slow_members(&c, 1.5, 2);
	c.replicas = 24;
	c.model_bytes = 16u << 20;
	c.stragglers = 2.0 / 24;
	slow_members(&c, 0, 3);
}

/* A star: the trainer's link carries every copy, N x S/b. */
static void test_sim_star(void **state)
{
	struct sim_cfg c;
	struct sim_result r;
	struct proto_err err;

	small(&c);
	c.versions = 1;
	c.star = true;
	assert_int_equal(sim_run(&c, &r, &err), 0);
	double sb = (double)r.v[0].wire_bytes / c.link_bps;
	assert_int_equal(r.v[0].trainer_bytes, (uint64_t)c.replicas * r.v[0].wire_bytes);
	assert_true(r.v[0].t_last_s >= 0.98 * c.replicas * sb);
	assert_true(r.v[0].t_last_s <= 1.05 * c.replicas * sb);
	/* The trainer's link sends a chunk's copies one after another, and
	 * each replica's downlink waits for its turn on it most of the time. */
	accounted(&c, &r, 0);
	assert_true(r.v[0].spread_all >= c.replicas - 1);
	assert_true(r.v[0].down_idle >= c.replicas / 2.0 - 1);
}

/* Mixed layouts, a straggler and churn: it still ends, every replica that
 * stayed has the version, and the trainer sends each layout's swarm its
 * bytes about once. */
static void test_sim_mixed_churn(void **state)
{
	struct sim_cfg c;
	struct sim_result r;
	struct proto_err err;

	small(&c);
	c.versions = 1;
	c.replicas = 12;
	c.tp[0] = 1;
	c.tp[1] = 2;
	c.tp[2] = 4;
	c.ntp = 3;
	c.stragglers = 0.1;
	c.churn = 0.2;
	assert_int_equal(sim_run(&c, &r, &err), 0);
	assert_true(r.v[0].stayed >= c.replicas - 3);
	assert_true(r.v[0].trainer_bytes <= 3 * r.v[0].wire_bytes + r.v[0].wire_bytes / 2);
}

/* Two sites (the replicas in turn, the trainer in the first): each site's
 * swarm reads the trainer's chunks about once, so the trainer sends about
 * two copies and one crosses into the other site; with the trainer's link
 * twice a replica's, the last replica within 1.5 x S/b. */
static void test_sim_sites(void **state)
{
	struct sim_cfg c;
	struct sim_result r;
	struct proto_err err;
	char line[512];

	small(&c);
	c.replicas = 8;
	c.sites = 2;
	c.trainer_bps = 2 * c.link_bps;
	assert_int_equal(sim_run(&c, &r, &err), 0);
	for (uint32_t v = 0; v < 2; v++) {
		const struct sim_version *sv = &r.v[v];
		double sb = (double)sv->wire_bytes / c.link_bps;
		sim_line(&c, &r, v, line, sizeof(line));
		print_message("%s\n", line);
		assert_int_equal(sv->done, c.replicas);
		assert_true(sv->trainer_bytes >= 2 * sv->wire_bytes);
		assert_true(sv->trainer_bytes <= 2 * sv->wire_bytes + sv->wire_bytes / 5);
		assert_true(sv->wan_bytes >= sv->wire_bytes);
		assert_true(sv->wan_bytes <= sv->wire_bytes + sv->wire_bytes / 10);
		if (v == 0)
			assert_true(sv->t_last_s <= 1.5 * sb);
	}
	assert_non_null(strstr(line, " sites=2 wan/S="));
	/* One site: nothing crosses. */
	c.sites = 1;
	assert_int_equal(sim_run(&c, &r, &err), 0);
	assert_int_equal(r.v[0].wan_bytes, 0);
}

static void test_sim_bad_config(void **state)
{
	struct sim_cfg c;
	struct sim_result r;
	struct proto_err err;

	small(&c);
	c.replicas = 0;
	assert_int_equal(sim_run(&c, &r, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "sim:"));
	small(&c);
	c.model_bytes = 1000;
	assert_int_equal(sim_run(&c, &r, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "64 KiB"));
	small(&c);
	c.tp[0] = 3;
	assert_int_equal(sim_run(&c, &r, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "tp3"));
	small(&c);
	c.sites = SIM_SITES_MAX + 1;
	assert_int_equal(sim_run(&c, &r, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "sites"));
	/* Too little simulated time: it says so, and where it stopped. */
	small(&c);
	c.max_sim_s = 1;
	assert_int_equal(sim_run(&c, &r, &err), -ETIMEDOUT);
	assert_non_null(strstr(err.msg, "not done"));
}

/* tessera-sim's command line: bad values get exit 2 and one line naming
 * the flag. */
static void test_sim_cli(void **state)
{
	static const char *bad[][2] = {
		{"--replicas 0", "--replicas"},      {"--layouts tp3", "--layouts"},
		{"--layouts tp1,tp9", "--layouts"},   {"--link-mbps -1", "--link-mbps"},
		{"--churn 2", "--churn"},            {"--model-mib 1.01", "--model-mib"},
		{"--bogus", "unknown option"},       {"--replicas", "--replicas"},
		{"--sites 0", "--sites"},            {"--wan-mbps x", "--wan-mbps"},
	};
	char sim[512], dir[512], cmd[2048], out[4096];
	const char *build = getenv("TESSERA_BUILD");

	snprintf(sim, sizeof(sim), "%s/%s/sim/tessera-sim", getenv("TESSERA_ROOT") ?: ".",
		 build ? build : "build");
	if (access(sim, X_OK) != 0) {
		print_message("skip: %s not built (make builds it)\n", sim);
		skip();
	}
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		snprintf(cmd, sizeof(cmd), "%s %s > %s/out 2> %s/err", sim, bad[i][0], dir, dir);
		assert_int_equal(tu_sh("%s", cmd), 2);
		snprintf(cmd, sizeof(cmd), "%s/err", dir);
		FILE *f = fopen(cmd, "r");
		assert_non_null(f);
		size_t n = fread(out, 1, sizeof(out) - 1, f);
		fclose(f);
		out[n] = 0;
		print_message("%s -> %s", bad[i][0], out);
		assert_non_null(strstr(out, bad[i][1]));
	}
	/* A good one: a line per version. */
	snprintf(cmd, sizeof(cmd), "%s --replicas 4 --model-mib 4 --versions 2 > %s/out 2> %s/err",
		 sim, dir, dir);
	assert_int_equal(tu_sh("%s", cmd), 0);
	assert_int_equal(tu_sh("test $(grep -c '^N=4 tp1 ' %s/out) -eq 2", dir), 0);
	tu_rmtree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sim_fanout_deterministic),
		cmocka_unit_test(test_sim_bounded_views),
		cmocka_unit_test(test_sim_slow_members),
		cmocka_unit_test(test_sim_star),
		cmocka_unit_test(test_sim_mixed_churn),
		cmocka_unit_test(test_sim_sites),
		cmocka_unit_test(test_sim_bad_config),
		cmocka_unit_test(test_sim_cli),
	};
	proto_log_setup("test_sim", PROTO_LOG_ERR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
