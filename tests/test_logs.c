/* The logs at the default level, end to end with the real programs on
 * loopback: a tracker on a fresh state, a publisher hosting two trainer
 * ranks and one replica of two ranks (tp2, one tessera-node) through a
 * clean first start and a few versions (an anchor, then deltas). No
 * process logs a warning or an error; the replica says each activation in
 * exactly one line (its rank 0 speaks for it), and when it is held back
 * (its node stopped while two versions go out) one line that it falls
 * behind and one that it caught up, behind at least as long as it was
 * stopped after the first version it lacked went out. Nothing here waits
 * on a clock: each step waits for what the tracker says, bounded only
 * against a hang (the one sleep holds the stopped node, so that the lower
 * bound on "behind for" would catch a count from when it noticed). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/stat.h>

#include "node/cli/proc.h"
#include "proto/checkpoint.h"
#include "proto/proto.h"
#include "proto/synth.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define MODEL_BYTES (4u << 20)
#define STEPS 6
#define WAIT_MS 120000 /* against a hang only */

struct env {
	char dir[256], url[256], sock[512], expose[512], model[512], mdir[512], key[512],
		pub[512], ckey[512];
	struct node_proc tracker, node, publisher;
	struct trk_client *trk;
};

static struct env env;

/* The text of the file at path (the caller frees; NULL: unreadable). */
static char *slurp(const char *path)
{
	struct proto_err err;
	uint8_t *buf;
	size_t len;

	if (proto_read_file(path, 64 << 20, &buf, &len, &err) != 0)
		return NULL;
	char *s = realloc(buf, len + 1);
	if (s == NULL) {
		free(buf);
		return NULL;
	}
	s[len] = 0;
	return s;
}

/* How many times s is in the file at path. */
static int count(const char *path, const char *s)
{
	char *txt = slurp(path);
	int n = 0;

	for (const char *at = txt; at != NULL && (at = strstr(at, s)) != NULL; at += strlen(s))
		n++;
	free(txt);
	return n;
}

static bool wait_log(const char *path, const char *s)
{
	for (int w = 0; w < WAIT_MS; w += 50) {
		if (count(path, s) > 0)
			return true;
		usleep(50000);
	}
	return false;
}

/* The log lines of path (a timestamp, then the level) at warn or error;
 * each is printed. Lines the programs print on stdout have no level. */
static int faults(const char *path)
{
	char *txt = slurp(path), *save = NULL;
	int n = 0;

	assert_non_null(txt);
	for (char *l = strtok_r(txt, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save)) {
		const char *sp = strchr(l, ' ');
		if (strlen(l) < 24 || l[4] != '-' || l[10] != 'T' || sp == NULL)
			continue;
		if (strncmp(sp, " warn ", 6) == 0 || strncmp(sp, " error ", 7) == 0) {
			print_message("%s: %s\n", path, l);
			n++;
		}
	}
	free(txt);
	return n;
}

static void export_one(struct env *e, uint64_t v)
{
	tu_control_export(e->sock, v);
}

static int setup(void **state)
{
	struct env *e = &env;
	char state_dir[600], path[600];
	struct proto_synth_opts so = {.bytes = MODEL_BYTES, .steps = STEPS, .lr = 1e-6, .seed = 5,
				      .threads = 2};
	struct proto_ckpt ck;
	struct proto_err err;

	*state = e;
	/* The default level: nothing set, no --log-level given. */
	unsetenv("TESSERA_LOG");
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	/* The node is stopped while versions go out: its lease outlasts that. */
	setenv("TESSERA_LEASE_MS", "60000", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->sock, sizeof(e->sock), "%s/ctl.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(e->mdir, sizeof(e->mdir), "%s/synth", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	assert_int_equal(mkdir(e->mdir, 0755), 0);
	assert_int_equal(proto_synth_run(e->mdir, &so, NULL, NULL, &err), 0);
	snprintf(path, sizeof(path), "%s/v0.safetensors", e->mdir);
	assert_int_equal(proto_ckpt_open(path, &ck, &err), 0);
	tu_write_model(&ck.model, e->model);
	proto_ckpt_fini(&ck);

	/* As the README's by-hand run: a cluster key authenticates POSTs. */
	char bin[512], tbin[512], log[600], line[256];
	tu_bin(bin, sizeof(bin), "tessera");
	tu_bin(tbin, sizeof(tbin), "tessera-tracker");
	snprintf(e->ckey, sizeof(e->ckey), "%s/cluster.key", e->dir);
	assert_int_equal(tu_sh("%s keygen --cluster -o %s >/dev/null", bin, e->ckey), 0);
	/* Keys as keygen makes them (a key others can read is warned of). */
	snprintf(e->key, sizeof(e->key), "%s/trainer.key", e->dir);
	snprintf(e->pub, sizeof(e->pub), "%s/trainer.pub", e->dir);
	assert_int_equal(tu_sh("%s keygen -o %s/trainer >/dev/null", bin, e->dir), 0);
	snprintf(log, sizeof(log), "%s/tracker.log", e->dir);
	char *targv[] = {tbin, "--listen", "127.0.0.1:0", "--state", state_dir, "--cluster-key",
			 e->ckey, "--trainer-pubkey", e->pub, NULL};
	assert_int_equal(node_proc_spawn(&e->tracker, "tracker", targv, log), 0);
	assert_int_equal(node_proc_wait_line(&e->tracker, "listening on ", line, sizeof(line),
					     WAIT_MS), 0);
	snprintf(e->url, sizeof(e->url), "%s", line);
	assert_int_equal(trk_client_new(NULL, e->url, NULL, &e->trk, &err), 0);
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--cluster-key",
			 e->ckey, "--model-dir", e->mdir, "--layout", "fsdp2", "--control", e->sock,
			 NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);
	/* The node runs in the test's directory, its --expose and --attach
	 * given relative: its activation records name them absolute. */
	char nbin[512], cwd[4096];
	tu_bin(nbin, sizeof(nbin), "tessera-node");
	snprintf(log, sizeof(log), "%s/node.log", e->dir);
	char *nargv[] = {nbin, "--tracker", e->url, "--replica", "A", "--ranks", "0-1", "--layout",
			 "tp2", "--model", e->model, "--trainer-pubkey", e->pub, "--cluster-key",
			 e->ckey, "--expose", "expose", "--store", "host", "--attach", "./", NULL};
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(e->dir), 0);
	int rc = node_proc_spawn(&e->node, "node", nargv, log);
	assert_int_equal(chdir(cwd), 0);
	assert_int_equal(rc, 0);
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->publisher, 5000);
	trk_client_free(e->trk);
	node_proc_stop(&e->tracker, 5000);
	if (e->dir[0] != 0 && getenv("TESSERA_TEST_KEEP") == NULL)
		tu_rmtree(e->dir);
	else if (e->dir[0] != 0)
		print_message("kept %s\n", e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	unsetenv("TESSERA_LEASE_MS");
	return 0;
}

/* "replica A: vV active (" lines in the node's log. */
static int activations(struct env *e, uint64_t v)
{
	char want[64];

	snprintf(want, sizeof(want), "replica A: v%llu active (", (unsigned long long)v);
	return count(e->node.log, want);
}

static void test_default_level(void **state)
{
	struct env *e = *state;

	/* A clean first start, then three versions in step. */
	assert_true(tu_wait_alive(e->trk, "A", 2, WAIT_MS));
	for (uint64_t v = 1; v <= 3; v++) {
		export_one(e, v);
		assert_true(tu_wait_active(e->trk, "A", v, WAIT_MS));
		/* Said once the whole replica is seen active on it. */
		char want[64];
		snprintf(want, sizeof(want), "replica A: v%llu active (", (unsigned long long)v);
		assert_true(wait_log(e->node.log, want));
	}
	assert_true(wait_log(e->node.log, "replica A: v1 active (full, "));
	assert_true(wait_log(e->node.log, "replica A: v2 active (delta, "));
	assert_int_equal(count(e->node.log, "falls behind"), 0);

	/* Held back: the node stopped while v4 and v5 go out (its lease
	 * holds), and a while after. Back, it is two versions behind until it
	 * activates v5, and says it was behind since v4's publish: at least
	 * from when v4's export was answered (published) to SIGCONT, a lower
	 * bound, not the time it took once resumed. */
	assert_int_equal(kill(e->node.pid, SIGSTOP), 0);
	export_one(e, 4);
	uint64_t published4 = proto_now_ns() / 1000000;
	export_one(e, 5);
	usleep(3000000); /* stopped long enough for "since it noticed" to fall short */
	uint64_t stopped = proto_now_ns() / 1000000 - published4;
	assert_int_equal(kill(e->node.pid, SIGCONT), 0);
	assert_true(tu_wait_active(e->trk, "A", 5, WAIT_MS));
	assert_true(wait_log(e->node.log, "replica A: v5 active ("));
	const char *cu = "replica A: caught up: v5 active, the latest (behind for ";
	assert_true(wait_log(e->node.log, cu));
	char *log = slurp(e->node.log);
	double behind = 0;
	assert_non_null(log);
	assert_int_equal(sscanf(strstr(log, cu) + strlen(cu), "%lf", &behind), 1);
	free(log);
	/* Printed to 0.1 s; the node's estimate of v4's publish may be late
	 * by the watch answer's trip. */
	if (behind + 0.1 < (double)stopped / 1000.0)
		fail_msg("behind for %.1f s, but stopped %.1f s after v4 was published", behind,
			 (double)stopped / 1000.0);
	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->tracker, 5000);

	/* One line per activation of the replica (two ranks, one line). */
	for (uint64_t v = 1; v <= 5; v++)
		if (v != 4) /* v4 may be skipped for v5 */
			assert_int_equal(activations(e, v), 1);
	assert_true(activations(e, 4) <= 1);
	/* Behind once, caught up once, in that order. */
	assert_int_equal(count(e->node.log, "replica A: falls behind, 2 versions (active v3, latest v5"), 1);
	assert_int_equal(count(e->node.log, "replica A: caught up"), 1);
	char *txt = slurp(e->node.log);
	assert_non_null(txt);
	assert_true(strstr(txt, "falls behind") < strstr(txt, "caught up"));
	free(txt);
	/* Nothing reads as a fault, in any of the three. */
	assert_int_equal(faults(e->tracker.log), 0);
	assert_int_equal(faults(e->publisher.log), 0);
	assert_int_equal(faults(e->node.log), 0);
	/* The tracker's first line is no warning, and no per-rank detail
	 * shows at the default level. */
	assert_int_equal(count(e->tracker.log, " note tracker"), 1);
	assert_int_equal(count(e->node.log, " info "), 0);
}

/* The activation record: indented, one key a line, its paths absolute. */
static void test_record(void **state)
{
	struct env *e = *state;
	char path[600];

	assert_true(tu_wait_alive(e->trk, "A", 2, WAIT_MS));
	export_one(e, 1);
	assert_true(tu_wait_active(e->trk, "A", 1, WAIT_MS));
	snprintf(path, sizeof(path), "%s/A-1.json", e->expose);
	json_t *j = tu_load_json(path);
	assert_non_null(j);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 1);
	const char *att = json_string_value(json_object_get(j, "attach"));
	char want[600];
	snprintf(want, sizeof(want), "%s/A-1.sock", e->dir);
	assert_non_null(att);
	assert_string_equal(att, want);
	assert_int_equal(json_string_value(json_object_get(j, "memfd_path"))[0], '/');
	json_decref(j);
	assert_true(count(path, "\n  \"version\": 1,\n") == 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_default_level, setup, teardown),
		cmocka_unit_test_setup_teardown(test_record, setup, teardown),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
