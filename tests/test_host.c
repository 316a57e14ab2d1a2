/* One tessera-node process for several ranks (node/host/host.h), with the real
 * programs on loopback: all ranks of a replica, several replicas, mixed with
 * one-rank processes, all-or-nothing activation, bad rank options. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define DEADLINE_MS 120000
#define MODEL_MB 4
#define SEED 7

struct env {
	char dir[256], url[256], ctl[512], model[512], key[512], pub[512], expose[512];
	struct node_proc tracker, publisher, nodes[3];
	struct trk_client *trk;
	struct proto_model m;
};

static int setup(void **state)
{
	*state = calloc(1, sizeof(struct env));
	return *state == NULL;
}

static int teardown(void **state)
{
	struct env *e = *state;

	tu_cluster_down(e->nodes, PROTO_ARRAY_LEN(e->nodes), &e->publisher, e->trk, &e->tracker, &e->m,
			e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_LEASE_MS");
	free(e);
	return 0;
}

/* Tracker and publisher (fsdp2, synthetic, control socket) in a new dir. */
static void start(struct env *e)
{
	char bin[512], log[600], state_dir[600], mb[16];
	struct proto_err perr;

	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	setenv("TESSERA_LEASE_MS", "3000", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model(MODEL_MB << 20, &e->m, &perr), 0);
	tu_write_model(&e->m, e->model);
	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &perr), 0);
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	snprintf(mb, sizeof(mb), "%d", MODEL_MB);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", mb,
			 "--seed", "7", "--layout", "fsdp2", "--control", e->ctl, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
}

/* Starts tessera-node i with the common options and the rank options
 * given (NULL-terminated, at most 8), its log in dir/<tag>.log. */
static void start_node(struct env *e, int i, const char *tag, ...)
{
	char bin[512], log[600], attach[600];
	char *argv[40];
	int n = 0;
	va_list ap;

	tu_bin(bin, sizeof(bin), "tessera-node");
	snprintf(log, sizeof(log), "%s/%s.log", e->dir, tag);
	snprintf(attach, sizeof(attach), "%s/attach-%s", e->dir, tag);
	char *common[] = {bin, "--tracker", e->url, "--model", e->model, "--trainer-pubkey", e->pub,
			  "--expose", e->expose, "--store", "host", "--log-level", "info",
			  "--metrics", "127.0.0.1:0", "--attach", attach};
	for (size_t k = 0; k < PROTO_ARRAY_LEN(common); k++)
		argv[n++] = common[k];
	va_start(ap, tag);
	for (char *a; (a = va_arg(ap, char *)) != NULL && n < 38;)
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	assert_int_equal(node_proc_spawn(&e->nodes[i], tag, argv, log), 0);
}

/* Waits until the tracker lists every (replica, nranks) given as alive. */
static void wait_registered(struct env *e, const char *const *replicas, const int *nranks, int n)
{
	for (int w = 0; w < DEADLINE_MS; w += 100) {
		int ok = 0;
		for (int i = 0; i < n; i++) {
			char path[128];
			snprintf(path, sizeof(path), TRK_API "/replicas/%s", replicas[i]);
			json_t *j = tu_get_json(e->trk, path), *rk;
			size_t k;
			int alive = 0;
			json_array_foreach(json_object_get(j, "ranks"), k, rk)
				alive += json_is_true(json_object_get(rk, "alive"));
			ok += alive == nranks[i];
			json_decref(j);
		}
		if (ok == n)
			return;
		usleep(100000);
	}
	fail_msg("the replicas did not all register");
}

/* The rank's activation record names v and its memory holds exactly v's
 * bytes of that rank in layout (computed here, not taken from the node). */
static void check_serving(struct env *e, const char *replica, uint32_t rank, const char *layout,
			  uint64_t v)
{
	struct proto_layout l;
	struct proto_err perr;
	char path[700];

	assert_int_equal(proto_layout_builtin(&e->m, layout, &l, &perr), 0);
	size_t n = l.ranks[rank].nbytes;
	snprintf(path, sizeof(path), "%s/%s-%u.json", e->expose, replica, rank);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), (json_int_t)v);
	int fd = open(json_string_value(json_object_get(j, "memfd_path")), O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0), *expect = malloc(n);
	assert_true(m != MAP_FAILED);
	proto_fixture_fill_rank(&e->m, &l, rank, SEED, v, expect);
	assert_memory_equal(m, expect, n);
	free(expect);
	munmap(m, n);
	close(fd);
	json_decref(j);
	proto_layout_fini(&l);
}

/* The version a rank's activation record names (0: none). */
static uint64_t record_version(struct env *e, const char *replica, uint32_t rank)
{
	char path[700];
	snprintf(path, sizeof(path), "%s/%s-%u.json", e->expose, replica, rank);
	json_t *j = tu_load_json(path);
	uint64_t v = j ? (uint64_t)json_integer_value(json_object_get(j, "version")) : 0;
	json_decref(j);
	return v;
}

/* The error the tracker lists for replica name's rank, or "" (into buf). */
static const char *rank_error(struct env *e, const char *name, uint32_t rank, char *buf,
			      size_t cap)
{
	json_t *st = tu_get_json(e->trk, TRK_API "/status"), *rep;
	size_t i;

	buf[0] = 0;
	json_array_foreach(json_object_get(st, "replicas"), i, rep) {
		if (strcmp(json_string_value(json_object_get(rep, "replica")) ?: "", name) != 0)
			continue;
		json_t *rk = json_array_get(json_object_get(rep, "ranks"), rank);
		const char *err = json_string_value(json_object_get(rk, "error"));
		if (err != NULL)
			snprintf(buf, cap, "%s", err);
	}
	json_decref(st);
	return buf;
}

/* GET url into buf (curl); its exit status. */
static int http_get(const char *url, char *buf, size_t cap)
{
	char dir[256], out[512];
	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	snprintf(out, sizeof(out), "%s/body", dir);
	int rc = tu_sh("curl -s -f -o %s '%s'", out, url);
	FILE *f = fopen(out, "r");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
	buf[n] = '\0';
	if (f != NULL)
		fclose(f);
	tu_rmtree(dir);
	return rc;
}

/*
 * One process serves both ranks of a TP2 replica: the replica activates v1
 * then v2, each rank's memory bit-exact, each rank with its own attach
 * socket, its own metrics series (replica and rank labels) and its part of
 * /healthz.
 */
static void test_tp2_in_one_process(void **state)
{
	struct env *e = *state;
	char murl[256], body[65536], path[700];

	start(e);
	start_node(e, 0, "B", "--replica", "B", "--ranks", "0-1", "--layout", "tp2", NULL);
	assert_int_equal(node_proc_wait_line(&e->nodes[0], "metrics on ", murl, sizeof(murl), 30000), 0);
	wait_registered(e, (const char *[]){"B"}, (int[]){2}, 1);
	for (uint64_t v = 1; v <= 2; v++) {
		tu_control_export(e->ctl, v);
		assert_true(tu_wait_active(e->trk, "B", v, DEADLINE_MS));
		check_serving(e, "B", 0, "tp2", v);
		check_serving(e, "B", 1, "tp2", v);
	}
	for (int r = 0; r < 2; r++) {
		struct stat st;
		snprintf(path, sizeof(path), "%s/attach-B/B-%d.sock", e->dir, r);
		assert_int_equal(stat(path, &st), 0);
		assert_true(S_ISSOCK(st.st_mode));
	}
	char url[300];
	snprintf(url, sizeof(url), "%s/metrics", murl);
	assert_int_equal(http_get(url, body, sizeof(body)), 0);
	assert_non_null(strstr(body, "\ntessera_node_active_version{replica=\"B\",rank=\"0\"} 2\n"));
	assert_non_null(strstr(body, "\ntessera_node_active_version{replica=\"B\",rank=\"1\"} 2\n"));
	assert_non_null(strstr(
		body, "\ntessera_node_activation_seconds_count{replica=\"B\",rank=\"1\"} 2\n"));
	/* One HELP per name, however many ranks. */
	const char *h = strstr(body, "# HELP tessera_node_active_version ");
	assert_non_null(h);
	assert_null(strstr(h + 1, "# HELP tessera_node_active_version "));
	snprintf(url, sizeof(url), "%s/healthz", murl);
	assert_int_equal(http_get(url, body, sizeof(body)), 0);
	assert_string_equal(body, "ok\n");
	assert_true(node_proc_alive(&e->nodes[0]));
	/* The ranks asked for their sources in batched queries (POST
	 * /sources), not one GET each. */
	struct trk_reply r;
	const char *k = "\ntessera_tracker_sources_batched_parcels_total ";
	assert_int_equal(trk_client_call(e->trk, "GET", "/metrics", NULL, NULL, 0, &r), 0);
	const char *at = strstr((const char *)r.body, k);
	assert_non_null(at);
	assert_true(strtoull(at + strlen(k), NULL, 10) >= 2);
	trk_reply_fini(&r);
}

/* What rank 0 of replica name says it took from peers for the version it
 * last reported (/status). */
static uint64_t from_peers(struct env *e, const char *name)
{
	json_t *st = tu_get_json(e->trk, TRK_API "/status"), *rep;
	uint64_t n = 0;
	size_t i;

	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		if (strcmp(json_string_value(json_object_get(rep, "replica")) ?: "", name) == 0)
			n = (uint64_t)json_integer_value(json_object_get(
				json_array_get(json_object_get(rep, "ranks"), 0), "bytes_from_peers"));
	json_decref(st);
	return n;
}

/*
 * One process serves two TP1 replicas. They need the same parcels, so they
 * are one swarm and read from each other through the process's one
 * endpoint (the fetch rate is capped so that each takes seconds, and each
 * owns half the chunks: what it does not own it takes from the other).
 * Both activate v1 and v2 exactly.
 */
static void test_two_tp1_replicas_in_one_process(void **state)
{
	struct env *e = *state;

	setenv("TESSERA_FETCH_MBPS", "8", 1);
	setenv("TESSERA_HAVE_POLL_MS", "20", 1);
	start(e);
	start_node(e, 0, "AC", "--serve", "A/0 C/0", "--layout", "tp1", NULL);
	unsetenv("TESSERA_FETCH_MBPS");
	unsetenv("TESSERA_HAVE_POLL_MS");
	wait_registered(e, (const char *[]){"A", "C"}, (int[]){1, 1}, 2);
	for (uint64_t v = 1; v <= 2; v++) {
		tu_control_export(e->ctl, v);
		assert_true(tu_wait_active(e->trk, "A", v, DEADLINE_MS));
		assert_true(tu_wait_active(e->trk, "C", v, DEADLINE_MS));
		check_serving(e, "A", 0, "tp1", v);
		check_serving(e, "C", 0, "tp1", v);
		uint64_t pa = from_peers(e, "A"), pc = from_peers(e, "C");
		print_message("v%llu: A took %llu bytes from peers, C %llu\n", (unsigned long long)v,
			      (unsigned long long)pa, (unsigned long long)pc);
		assert_true(pa + pc > 0);
	}
	assert_true(node_proc_alive(&e->nodes[0]));
}

/*
 * Mixed: one process serves A/0 (tp1) and B/0 (tp2), another the one-rank
 * command line for B/1. Both replicas activate v1 and v2, B across the two
 * processes. Their attach sockets have the mode and group asked, and the
 * one-rank process names its socket as a directory when asked ("DIR/").
 */
static void test_multi_and_single_rank_processes(void **state)
{
	struct env *e = *state;
	char dir[600], gid[16], path[700];
	struct stat st;

	/* The one-rank process's socket is named as the others' ("DIR/"),
	 * with the mode and group asked; the other's with its mode. */
	snprintf(dir, sizeof(dir), "%s/attach-dir/", e->dir);
	snprintf(gid, sizeof(gid), "%u", (unsigned)getegid());
	start(e);
	start_node(e, 0, "AB0", "--serve", "A/0@tp1;B/0@tp2", "--attach-mode", "0640", NULL);
	start_node(e, 1, "B1", "--replica", "B", "--rank", "1", "--layout", "tp2", "--attach", dir,
		   "--attach-mode", "0660", "--attach-group", gid, NULL);
	wait_registered(e, (const char *[]){"A", "B"}, (int[]){1, 2}, 2);
	snprintf(path, sizeof(path), "%sB-1.sock", dir);
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_gid, getegid());
	snprintf(path, sizeof(path), "%s/attach-AB0/A-0.sock", e->dir);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0640);
	for (uint64_t v = 1; v <= 2; v++) {
		tu_control_export(e->ctl, v);
		assert_true(tu_wait_active(e->trk, "A", v, DEADLINE_MS));
		assert_true(tu_wait_active(e->trk, "B", v, DEADLINE_MS));
		check_serving(e, "A", 0, "tp1", v);
		check_serving(e, "B", 0, "tp2", v);
		check_serving(e, "B", 1, "tp2", v);
	}
}

/*
 * One process serves A/0 (tp1) and both ranks of B (tp2). B/1 cannot
 * prepare v2 (its activation record cannot be staged): B stays on v1 with
 * both ranks, B/0's record still v1, while A in the same process moves to
 * v2. Once B/1 can prepare, B activates v2 with both ranks.
 */
static void test_failed_prepare_in_multi_rank_process(void **state)
{
	struct env *e = *state;
	char err[512], block[700], path[800];

	start(e);
	start_node(e, 0, "AB", "--serve", "A/0@tp1 B/0-1@tp2", NULL);
	wait_registered(e, (const char *[]){"A", "B"}, (int[]){1, 2}, 2);
	tu_control_export(e->ctl, 1);
	assert_true(tu_wait_active(e->trk, "A", 1, DEADLINE_MS));
	assert_true(tu_wait_active(e->trk, "B", 1, DEADLINE_MS));

	/* B/1's probe of its record's place is a non-empty directory: the
	 * rename that stages it fails, for B/1 only. */
	snprintf(block, sizeof(block), "%s/.B-1.probe", e->expose);
	assert_int_equal(mkdir(block, 0755), 0);
	snprintf(path, sizeof(path), "%s/x", block);
	assert_int_equal(tu_write(path, "x\n"), 0);
	tu_control_export(e->ctl, 2);
	assert_true(tu_wait_active(e->trk, "A", 2, DEADLINE_MS));
	bool said = false;
	for (int w = 0; w < DEADLINE_MS && !said; w += 100) {
		said = strstr(rank_error(e, "B", 1, err, sizeof(err)), "activation record") != NULL;
		if (!said)
			usleep(100000);
	}
	if (!said)
		fail_msg("B/1 never reported why it cannot prepare (error '%s')", err);
	bool verified = false;
	for (int w = 0; w < DEADLINE_MS && !verified; w += 100) {
		verified = tu_rank_is(e->trk, "B", 0, 2, "verified");
		if (!verified)
			usleep(100000);
	}
	assert_true(verified);
	assert_int_equal(tu_replica_active(e->trk, "B"), 1);
	assert_int_equal(record_version(e, "B", 0), 1);
	assert_int_equal(record_version(e, "B", 1), 1);
	check_serving(e, "A", 0, "tp1", 2);
	assert_true(node_proc_alive(&e->nodes[0]));

	tu_rmtree(block);
	assert_true(tu_wait_active(e->trk, "B", 2, DEADLINE_MS));
	check_serving(e, "B", 0, "tp2", 2);
	check_serving(e, "B", 1, "tp2", 2);
}

/* tessera-node with the options after "model" refuses them: non-zero
 * status, one line on stderr holding want (at --log-level warn: the
 * default level also says which interface the fabric would bind). */
static void refused(const char *dir, const char *model, const char *pub, const char *args,
		    const char *want)
{
	char bin[512], out[600], buf[1024] = "";

	snprintf(out, sizeof(out), "%s/err", dir);
	int rc = tu_sh("%s --tracker http://127.0.0.1:9 --model %s --trainer-pubkey %s "
		       "--metrics off --store host --log-level warn %s 2>%s >/dev/null",
		       tu_bin(bin, sizeof(bin), "tessera-node"), model, pub, args, out);
	if (rc == 0)
		fail_msg("'%s' was accepted", args);
	FILE *f = fopen(out, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (n == 0 || buf[n - 1] != '\n' || strchr(buf, '\n') != buf + n - 1 ||
	    strstr(buf, want) == NULL)
		fail_msg("'%s': want one line with '%s', got '%s'", args, want, buf);
}

static void test_bad_rank_options(void **state)
{
	struct env *e = *state;
	struct proto_err perr;
	char ini[600], args[700];

	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model(MODEL_MB << 20, &e->m, &perr), 0);
	tu_write_model(&e->m, e->model);
	const char *m = e->model, *p = e->pub;

	refused(e->dir, m, p, "--replica A --rank 0 --rank 0 --layout tp2", "rank 0 is given twice");
	refused(e->dir, m, p, "--replica A --ranks 0-1 --rank 1 --layout tp2",
		"rank 1 is given twice");
	refused(e->dir, m, p, "--serve 'A/0-1 A/1' --layout tp2", "rank 1 is given twice");
	refused(e->dir, m, p, "--replica A --ranks 0-2 --layout tp2", "layout tp2 has ranks 0-1");
	refused(e->dir, m, p, "--serve 'A/0@tp2 B/3@tp2'", "replica B rank 3");
	refused(e->dir, m, p, "--serve 'A/0@tp2 A/1@tp4'", "share one layout");
	refused(e->dir, m, p, "--replica A --ranks 3-1 --layout tp4", "want R, R-S");
	refused(e->dir, m, p, "--replica A --ranks 0,,1 --layout tp4", "want R, R-S");
	refused(e->dir, m, p, "--replica A --ranks x --layout tp4", "want R, R-S");
	refused(e->dir, m, p, "--serve A --layout tp4", "want REPLICA/RANKS");
	refused(e->dir, m, p, "--serve 'A/0@' --layout tp4", "layout is missing");
	refused(e->dir, m, p, "--serve 'A/0' ", "--layout");
	refused(e->dir, m, p, "--serve 'a b/0' --layout tp4", "want REPLICA/RANKS");
	refused(e->dir, m, p, "--serve 'A:x/0' --layout tp4", "replica 'A:x'");
	refused(e->dir, m, p, "--replica A --rank 0 --replica B --layout tp4",
		"--replica B: no --rank");
	refused(e->dir, m, p, "--replica A --ranks 0-64 --layout tp4", "more than 64 ranks");
	/* The same from a config file; the command line's ranks replace the
	 * file's (so the file's duplicate is gone), the file's alone count. */
	snprintf(ini, sizeof(ini), "%s/node.ini", e->dir);
	assert_int_equal(tu_write(ini, "[node]\nreplica = A\nranks = 0-1\nrank = 1\nlayout = tp2\n"), 0);
	snprintf(args, sizeof(args), "--config %s", ini);
	refused(e->dir, m, p, args, "rank 1 is given twice");
	assert_int_equal(tu_write(ini, "[node]\nserve = A/0@tp2 A/1@tp1\n"), 0);
	refused(e->dir, m, p, args, "replica A rank 1: layout tp1 has ranks 0-0");
	assert_int_equal(tu_write(ini, "[node]\nreplica = A\nranks = 0-1\nrank = 1\nlayout = tp2\n"), 0);
	snprintf(args, sizeof(args), "--config %s --rank 5", ini);
	refused(e->dir, m, p, args, "replica A rank 5: layout tp2 has ranks 0-1");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_bad_rank_options, setup, teardown),
		cmocka_unit_test_setup_teardown(test_tp2_in_one_process, setup, teardown),
		cmocka_unit_test_setup_teardown(test_two_tp1_replicas_in_one_process, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_multi_and_single_rank_processes, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_failed_prepare_in_multi_rank_process, setup,
						teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
