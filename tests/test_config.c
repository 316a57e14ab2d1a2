/*
 * Configuration files: every file of the bad-config-* corpus is refused with
 * one clear line naming the file and line, by the library, by `tessera config
 * check` and by a program at start-up, and leaves nothing applied; a good
 * file sets tunables and log settings; flags override the file; every program
 * accepts every key `tessera config check` knows; proto/PARAMS.md is what
 * `tessera config params` prints.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "node/host/host.h"
#include "proto/config.h"
#include "proto/proto.h"
#include "tests/testutil.h"
#include "tracker/tracker.h"

/* A program's table, as tessera-node's. */
static const struct option node_opts[] = {
	{"tracker", required_argument, NULL, 't'},
	{"replica", required_argument, NULL, 'r'},
	{"rank", required_argument, NULL, 'k'},
	{"layout", required_argument, NULL, 'l'},
	{"model", required_argument, NULL, 'm'},
	{"expose", required_argument, NULL, 'e'},
	{"verbose", no_argument, NULL, 'v'},
	{"trainer-pubkey", required_argument, NULL, 'p'},
	{"ranks", required_argument, NULL, 'R'},
	{"store", required_argument, NULL, 's'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* As tessera-node checks its section: these keys, its values' parsers. */
static const struct proto_config_schema node_schema = {"node", node_opts,
						      node_host_config_values};

/* Parts of the other programs' tables, with their values' parsers. */
static const struct option tracker_opts[] = {
	{"listen", required_argument, NULL, 'l'},
	{NULL, 0, NULL, 0},
};
static const struct option publish_opts[] = {
	{"every", required_argument, NULL, 'e'},
	{NULL, 0, NULL, 0},
};
static const struct proto_config_schema tracker_schema = {"tracker", tracker_opts,
							 trk_config_values};
static const struct proto_config_schema publish_schema = {"publish", publish_opts,
							 node_publish_config_values};

static void check_one_line(const char *msg, const char *name)
{
	if (strchr(msg, '\n') != NULL || strlen(msg) < 10)
		fail_msg("%s: not one clear line: '%s'", name, msg);
	if (strstr(msg, name) == NULL)
		fail_msg("%s: the error does not name the file: '%s'", name, msg);
}

static int for_each_bad(void (*fn)(const char *path, const char *name))
{
	char dir[4096], names[64][256];
	struct dirent *e;
	int n = 0;
	DIR *d = opendir(tu_data(dir, sizeof(dir), ""));

	assert_non_null(d);
	while ((e = readdir(d)) != NULL && n < 64)
		if (strncmp(e->d_name, "bad-config-", 11) == 0)
			snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
	closedir(d); /* before any check can fail out of this function */
	for (int i = 0; i < n; i++) {
		char path[8192];
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		fn(path, names[i]);
	}
	return n;
}

static void bad_lib(const char *path, const char *name)
{
	char *argv0[] = {"tessera-node", "--config", (char *)path, "--rank", "3", NULL};
	char **argv = argv0;
	int argc = 5, level = proto_log_level();
	struct proto_err err = {{0}};
	/* bad-config-tracker-* and bad-config-publish-* are those programs'. */
	const struct proto_config_schema *schema =
		strncmp(name, "bad-config-tracker-", 19) == 0   ? &tracker_schema
		: strncmp(name, "bad-config-publish-", 19) == 0 ? &publish_schema
								: &node_schema;

	if (proto_config_args(schema, &argc, &argv, &err) == 0)
		fail_msg("%s was accepted", name);
	check_one_line(err.msg, name);
	/* Nothing applied: the vector, the tunables and the log level. */
	assert_ptr_equal(argv, argv0);
	assert_int_equal(argc, 5);
	for (int id = 0; id < PROTO_PARAM_COUNT; id++)
		assert_int_equal(proto_param_source((enum proto_param_id)id), PROTO_PARAM_FROM_DEFAULT);
	assert_int_equal(proto_log_level(), level);
}

static void bad_check(const char *path, const char *name)
{
	char bin[4096], dir[4096], out[4096];
	char buf[1024] = "";

	tu_mkdtemp(dir, sizeof(dir));
	snprintf(out, sizeof(out), "%s/err", dir);
	if (tu_sh("%s config check '%s' >/dev/null 2>%s", tu_bin(bin, sizeof(bin), "tessera"), path,
		  out) != 1)
		fail_msg("tessera config check %s did not exit 1", name);
	FILE *f = fopen(out, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	assert_true(n > 0 && buf[n - 1] == '\n');
	buf[n - 1] = '\0';
	check_one_line(buf, name);
	tu_rmtree(dir);
}

static void test_bad_configs_lib(void **state)
{
	assert_true(for_each_bad(bad_lib) >= 27);
}

static void test_bad_configs_check(void **state)
{
	assert_true(for_each_bad(bad_check) >= 27);
}

/* A program refuses a bad file at start-up with status 2 before anything. */
static void test_bad_config_program(void **state)
{
	char bin[4096], path[4096];

	tu_data(path, sizeof(path), "bad-config-unknown-section.ini");
	assert_int_equal(tu_sh("%s --config '%s' 2>/dev/null",
			       tu_bin(bin, sizeof(bin), "tessera-tracker"), path), 2);
	assert_int_equal(tu_sh("%s --config /nonexistent/file.ini 2>/dev/null",
			       tu_bin(bin, sizeof(bin), "tessera-node")), 2);
}

static void test_file_then_flags(void **state)
{
	char dir[4096], path[4096];
	struct proto_err err;

	tu_mkdtemp(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/t.ini", dir);
	assert_int_equal(tu_write(path, "[log]\nlevel = debug\n[params]\nchunk_size = 65536\n"
					"fetch_mbps = 0\n[node]\ntracker = http://file\nrank = 1\n"
					"verbose = true\n[tracker]\nlisten = ignored\n"),
			 0);
	char *argv0[] = {"tessera-node", "--rank", "7", "--config", path, "--log-level=warn",
			 "--", "--config", NULL};
	char **argv = argv0;
	int argc = 8, c;
	unsetenv("TESSERA_CHUNK_SIZE");
	assert_int_equal(proto_config_args(&node_schema, &argc, &argv, &err), 0);
	/* argv0, the file's three options, the line's --rank 7 -- --config. */
	assert_int_equal(argc, 8);
	assert_string_equal(argv[0], "tessera-node");
	assert_string_equal(argv[1], "--tracker=http://file");
	assert_string_equal(argv[2], "--rank=1");
	assert_string_equal(argv[3], "--verbose");
	assert_string_equal(argv[7], "--config");
	const char *tracker = NULL, *rank = NULL;
	int verbose = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", node_opts, NULL)) != -1) {
		if (c == 't')
			tracker = optarg;
		else if (c == 'k')
			rank = optarg;
		else if (c == 'v')
			verbose = 1;
	}
	assert_string_equal(tracker, "http://file");
	assert_string_equal(rank, "7"); /* the flag wins */
	assert_int_equal(verbose, 1);
	assert_int_equal(optind, 7);      /* "--config" after "--" is an operand */
	assert_int_equal(proto_log_level(), PROTO_LOG_WARN); /* --log-level wins */
	assert_int_equal(proto_param(PROTO_PARAM_CHUNK_SIZE), 65536);
	assert_int_equal(proto_param_source(PROTO_PARAM_CHUNK_SIZE), PROTO_PARAM_FROM_FILE);
	assert_int_equal(proto_param(PROTO_PARAM_FETCH_MBPS), 0);
	/* The environment beats the file. */
	setenv("TESSERA_CHUNK_SIZE", "131072", 1);
	assert_int_equal(proto_param(PROTO_PARAM_CHUNK_SIZE), 131072);
	assert_int_equal(proto_param_source(PROTO_PARAM_CHUNK_SIZE), PROTO_PARAM_FROM_ENV);
	/* 0 means "none" only where the default is 0; FANOUT is a switch. */
	setenv("TESSERA_CHUNK_SIZE", "0", 1);
	assert_int_equal(proto_param(PROTO_PARAM_CHUNK_SIZE), 65536);
	setenv("TESSERA_FANOUT", "0", 1);
	assert_int_equal(proto_param(PROTO_PARAM_FANOUT), 0);
	unsetenv("TESSERA_FANOUT");
	assert_int_equal(proto_param(PROTO_PARAM_FANOUT), 1);
	unsetenv("TESSERA_CHUNK_SIZE");
	proto_config_reset();
	assert_int_equal(proto_param(PROTO_PARAM_CHUNK_SIZE), proto_param_default(PROTO_PARAM_CHUNK_SIZE));
	proto_log_setup("t", PROTO_LOG_WARN);
	tu_rmtree(dir);
}

/* Makes in dir the files good-config-full.ini and test_spellings name:
 * keys (trainer, t, cluster, c), the TLS files and model (empty: their
 * check is that they can be read) and the versions directory. */
static void make_files(const char *dir)
{
	char bin[4096];

	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("cd %s && %s keygen -o trainer >/dev/null && %s keygen -o t >/dev/null"
			       " && %s keygen --cluster -o cluster.key >/dev/null"
			       " && cp cluster.key c.key && touch tracker.pem tracker.key ca.pem"
			       " model.json && mkdir -p versions",
			       dir, bin, bin, bin),
			 0);
}

/* Writes text to DIR/t.ini and returns what proto_config_args says of it
 * for tessera-node (0 or a negative errno, err filled). */
static int config_text(const char *dir, const char *text, int *argc, char ***argv,
		       struct proto_err *err)
{
	static char path[4096];
	static char *argv0[4];

	snprintf(path, sizeof(path), "%s/t.ini", dir);
	assert_int_equal(tu_write(path, text), 0);
	argv0[0] = "tessera-node";
	argv0[1] = "--config";
	argv0[2] = path;
	argv0[3] = NULL;
	*argv = argv0;
	*argc = 3;
	return proto_config_args(&node_schema, argc, argv, err);
}

/* The message for text, which must be refused, and nothing applied. */
static const char *refused(const char *dir, const char *text, struct proto_err *err)
{
	char **argv;
	int argc;

	assert_true(config_text(dir, text, &argc, &argv, err) < 0);
	assert_int_equal(argc, 3);
	for (int id = 0; id < PROTO_PARAM_COUNT; id++)
		assert_int_equal(proto_param_source((enum proto_param_id)id), PROTO_PARAM_FROM_DEFAULT);
	return err->msg;
}

/* Every key takes dashes and underscores alike, in every section; a key
 * set in both spellings is set twice; an unknown key or section names the
 * nearest known one, when one is near (the library, and `tessera config
 * check` with the programs' own tables). */
static void test_spellings(void **state)
{
	char dir[4096], path[4096], bin[4096];
	struct proto_err err;
	char **argv;
	int argc;

	char cwd[4096];

	tu_mkdtemp(dir, sizeof(dir));
	make_files(dir);
	/* Key files are read where the program runs: here, in dir. */
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0);
	unsetenv("TESSERA_CHUNK_SIZE");
	assert_int_equal(config_text(dir, "[node]\ntrainer_pubkey = t.pub\n[params]\n"
					  "chunk-size = 65536\n",
				     &argc, &argv, &err),
			 0);
	assert_int_equal(argc, 2);
	assert_string_equal(argv[1], "--trainer-pubkey=t.pub"); /* the option's own name */
	assert_int_equal(proto_param(PROTO_PARAM_CHUNK_SIZE), 65536);
	proto_config_reset();

	assert_non_null(strstr(refused(dir, "[node]\ntrainer_pubky = t.pub\n", &err),
			       ":2: unknown key 'trainer_pubky' in [node]; did you mean "
			       "'trainer-pubkey'?"));
	assert_non_null(strstr(refused(dir, "[node]\nreplcia = A\n", &err),
			       "unknown key 'replcia' in [node]; did you mean 'replica'?"));
	assert_non_null(strstr(refused(dir, "[params]\nchunksize = 65536\n", &err),
			       "unknown key 'chunksize' in [params]; did you mean 'chunk_size'?"));
	assert_non_null(strstr(refused(dir, "[log]\nlevle = info\n", &err),
			       "unknown key 'levle' in [log]; did you mean 'level'?"));
	assert_non_null(strstr(refused(dir, "[nod]\nrank = 1\n", &err),
			       "unknown section [nod]; did you mean [node]?"));
	/* Nothing near: no guess, the list to look in. */
	const char *m = refused(dir, "[node]\nzzzzzzzz = 1\n", &err);
	assert_non_null(strstr(m, "unknown key 'zzzzzzzz' in [node] ("));
	assert_null(strstr(m, "did you mean"));
	assert_null(strstr(refused(dir, "[params]\nq = 1\n", &err), "did you mean"));
	/* One key in two spellings is set twice. */
	assert_non_null(strstr(refused(dir, "[node]\nrank = 1\n[params]\nchunk_size = 1\n"
					    "chunk-size = 2\n",
					    &err),
			       ":5: [params] chunk-size is already set on line 4 (as chunk_size)"));
	/* The reserved keys in either spelling. */
	assert_non_null(strstr(refused(dir, "[node]\nlog_level = info\n", &err),
			       ":2: [node] cannot set 'log_level' (the log's settings go in [log]"));

	/* tessera config check: the programs' tables, both spellings. */
	snprintf(path, sizeof(path), "%s/t.ini", dir);
	assert_int_equal(tu_write(path, "[node]\ntrainer_pubkey = t.pub\nfabric_iface = lo\n"
					"[tracker]\ntrainer-pubkey = t.pub\n[publish]\n"
					"cluster_key = c.key\n[params]\nchunk-size = 65536\n"),
			 0);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_sh("%s config check '%s' >%s/out", bin, path, dir), 0);
	assert_int_equal(tu_sh("grep -qx 'trainer-pubkey = t.pub' %s/out && "
			       "grep -qx 'fabric-iface = lo' %s/out && "
			       "grep -qx 'cluster-key = c.key' %s/out && "
			       "grep -q '^chunk_size = 65536 .*(file;' %s/out",
			       dir, dir, dir, dir),
			 0);
	assert_int_equal(tu_write(path, "[tracker]\nlisten = 127.0.0.1:0\ntrainer_pubky = t.pub\n"),
			 0);
	assert_int_equal(tu_sh("%s config check '%s' 2>%s/err >/dev/null", bin, path, dir), 1);
	assert_int_equal(tu_sh("grep -qF \"t.ini:3: unknown key 'trainer_pubky' in [tracker]; did you "
			       "mean 'trainer-pubkey'?\" %s/err",
			       dir),
			 0);
	/* A program takes the underscore spelling of its options, and refuses
	 * a misspelt one with status 2, naming the right one. */
	tu_bin(bin, sizeof(bin), "tessera-node");
	assert_int_equal(tu_write(path, "[node]\ntrainer_pubkey = t.pub\n"), 0);
	assert_int_equal(tu_sh("%s --config '%s' --help >/dev/null", bin, path), 0);
	assert_int_equal(tu_write(path, "[node]\ntrainer_pubky = t.pub\n"), 0);
	assert_int_equal(tu_sh("%s --config '%s' --help >/dev/null 2>%s/err", bin, path, dir), 2);
	assert_int_equal(tu_sh("grep -qF \"did you mean 'trainer-pubkey'?\" %s/err", dir), 0);
	assert_int_equal(chdir(cwd), 0);
	tu_rmtree(dir);
}

/* proto_param caches what the environment says: every change must show
 * at once, whatever order variables come and go in, with values glibc
 * hands back the same strings for, and with more TESSERA_ variables than
 * the cache keeps. */
static void set_pads(const char *prefix, int n, bool set)
{
	char name[40];

	for (int i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "%sPAD_%d", prefix, i);
		if (set)
			setenv(name, "x", 1);
		else
			unsetenv(name);
	}
}

static void test_param_follows_env(void **state)
{
	const uint64_t def = proto_param_default(PROTO_PARAM_STALL_MS);

	unsetenv("TESSERA_STALL_MS");
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
	setenv("TESSERA_STALL_MS", "1234", 1);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 1234);
	setenv("TESSERA_STALL_MS", "4321", 1); /* same length, new value */
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 4321);
	setenv("TESSERA_STALL_MS", "1234", 1); /* an earlier value again */
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 1234);
	/* Other variables coming and going shift it in environ. */
	set_pads("TSR_TEST_", 40, true);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 1234);
	unsetenv("TESSERA_STALL_MS");
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
	setenv("TESSERA_STALL_MS", "77", 1);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 77);
	/* One variable out, ours in: as many variables as before. */
	unsetenv("TESSERA_STALL_MS");
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
	unsetenv("TSR_TEST_PAD_3");
	setenv("TESSERA_STALL_MS", "78", 1);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 78);
	set_pads("TSR_TEST_", 40, false);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 78);
	/* More TESSERA_ variables than the cache keeps. */
	set_pads("TESSERA_TEST_", 40, true);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 78);
	setenv("TESSERA_STALL_MS", "79", 1);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 79);
	set_pads("TESSERA_TEST_", 40, false);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), 79);
	/* Not a number: ignored, each time it is asked for. */
	setenv("TESSERA_STALL_MS", "soon", 1);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
	unsetenv("TESSERA_STALL_MS");
	assert_int_equal(proto_param(PROTO_PARAM_STALL_MS), def);
}

/* A tunable whose documented 0 means off takes 0 from the environment
 * (not refused as below its least value). */
static void test_zero_means_off(void **state)
{
	static const enum proto_param_id ids[] = {PROTO_PARAM_DELTA_WARM, PROTO_PARAM_DELTA_SCRUB,
						  PROTO_PARAM_DELTA_STANDBY_QUIET_MS,
						  PROTO_PARAM_ATTACH_FREE_GRACE_MS};

	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		assert_int_equal(proto_param_min(ids[i]), 0);
		setenv(proto_param_env(ids[i]), "0", 1);
		assert_int_equal(proto_param(ids[i]), 0);
		unsetenv(proto_param_env(ids[i]));
		assert_int_equal(proto_param(ids[i]), proto_param_default(ids[i]));
	}
}

static void test_missing_values(void **state)
{
	struct proto_err err;
	char *a1[] = {"p", "--config", NULL};
	char *a2[] = {"p", "--log-format", "xml", NULL};
	char **argv = a1;
	int argc = 2;

	assert_true(proto_config_args(&node_schema, &argc, &argv, &err) < 0);
	assert_non_null(strstr(err.msg, "--config needs a value"));
	argv = a2;
	argc = 3;
	assert_true(proto_config_args(&node_schema, &argc, &argv, &err) < 0);
	assert_non_null(strstr(err.msg, "xml"));
}

/* Every key `tessera config check` knows is one the program takes. */
static void test_programs_take_every_key(void **state)
{
	char bin[4096], path[4096], dir[4096];

	/* Its paths name files that must exist: made in dir, run from there. */
	tu_mkdtemp(dir, sizeof(dir));
	make_files(dir);
	tu_data(path, sizeof(path), "good-config-full.ini");
	assert_int_equal(tu_sh("cd %s && %s config check '%s' >/dev/null", dir,
			       tu_bin(bin, sizeof(bin), "tessera"), path), 0);
	assert_int_equal(tu_sh("cd %s && %s --config '%s' --help >/dev/null", dir,
			       tu_bin(bin, sizeof(bin), "tessera-tracker"), path), 0);
	assert_int_equal(tu_sh("cd %s && %s --config '%s' --help >/dev/null", dir,
			       tu_bin(bin, sizeof(bin), "tessera-node"), path), 0);
	assert_int_equal(tu_sh("cd %s && %s publish --config '%s' --help >/dev/null", dir,
			       tu_bin(bin, sizeof(bin), "tessera"), path), 0);
	assert_int_equal(tu_sh("cd %s && %s config check '%s' | grep -q '^chunk_size = 1048576 .*(file;'",
			       dir, tu_bin(bin, sizeof(bin), "tessera"), path), 0);
	/* Elsewhere the same file is refused: its key files are missing. */
	assert_int_equal(tu_sh("cd / && %s config check '%s' >/dev/null 2>&1",
			       tu_bin(bin, sizeof(bin), "tessera"), path), 1);
	tu_rmtree(dir);
}

/* Every long option a program lists in its --help is a key `tessera config
 * check` takes in that program's section (its copy of the tables had lost
 * `ranks`, `serve`, `attach`, `install`, `anchor-every` and `trainer`, and
 * refused the `ranks = 0-7` deploy/ suggests). The value 'x' may be refused,
 * as a value, never the key. */
static void test_check_knows_every_flag(void **state)
{
	static const char *progs[][2] = {
		{"tessera-tracker", "tracker"}, {"tessera-node", "node"}, {"tessera publish", "publish"}};
	char bin[4096], dir[256];

	assert_non_null(tu_mkdtemp(dir, sizeof(dir)));
	for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++) {
		char prog[4200];
		const char *sub = strchr(progs[i][0], ' ');
		if (sub != NULL)
			snprintf(prog, sizeof(prog), "%s%s", tu_bin(bin, sizeof(bin), "tessera"), sub);
		else
			snprintf(prog, sizeof(prog), "%s", tu_bin(bin, sizeof(bin), progs[i][0]));
		/* The options are the help's lines that start with one. */
		int rc = tu_sh("n=0; for k in $(%s --help 2>&1 | grep -o -- '^ *\\(-[a-zA-Z], \\)\\?--[a-z][a-z-]*'"
			       " | sed 's/.*--//' | sort -u); do"
			       " case $k in help|version|config|log-level|log-format) continue;; esac;"
			       " n=$((n + 1)); printf '[%s]\\n%%s = x\\n' $k > %s/k.ini;"
			       " %s config check %s/k.ini >/dev/null 2>%s/e;"
			       " ! grep -q 'unknown key' %s/e ||"
			       " { echo \"config check refuses [%s] $k\"; exit 1; }; done; [ $n -ge 5 ]",
			       prog, progs[i][1], dir, tu_bin(bin, sizeof(bin), "tessera"), dir, dir,
			       dir, progs[i][1]);
		assert_int_equal(rc, 0);
	}
	tu_rmtree(dir);
}

/* Every value goes through the parser its program applies; `tessera config
 * check` reports every bad one, FILE:LINE: [section] key = value: reason,
 * a line each, with the hints for keys in the wrong place, and the
 * TESSERA_* variables the programs would ignore. */
static void test_values_checked(void **state)
{
	char bin[4096], dir[4096], path[4096];

	tu_mkdtemp(dir, sizeof(dir));
	snprintf(path, sizeof(path), "%s/v.ini", dir);
	tu_bin(bin, sizeof(bin), "tessera");
	assert_int_equal(tu_write(path, "[node]\nranks = 0-x\nlayout = tp3x\nstore = gpu\n"
					"tracker = 127.0.0.1:7400\nlisten = 127.0.0.1:7070\n"
					"trainer-pubkey = /nonexistent/t.pub\n"
					"[publish]\nevery = soon\nranks = 0,\n"
					"[tracker]\nlisten = 7400\n"
					"[params]\nTESSERA_CHUNK_SIZE = 65536\nlease_ms = abc\n"),
			 0);
	assert_int_equal(tu_sh("env -u TESSERA_LEASE_MS %s config check '%s' >%s/out 2>%s/err", bin,
			       path, dir, dir),
			 1);
	static const char *const lines[] = {
		"v.ini:2: [node] ranks = 0-x: want R, R-S or a comma list of those",
		"v.ini:3: [node] layout = tp3x: not a built-in (tpN, tpN:fp8 or fsdpN) nor a layout file",
		"v.ini:4: [node] store = gpu: want host, cuda, cuda:DEVICE or auto",
		"v.ini:5: [node] tracker = 127.0.0.1:7400: want http://HOST:PORT or https://",
		"v.ini:6: unknown key 'listen' in [node]; [tracker] takes it",
		"v.ini:7: [node] trainer-pubkey = /nonexistent/t.pub: ",
		"v.ini:9: [publish] every = soon: want 1..86400000 ms",
		"v.ini:10: [publish] ranks = 0,: want a list like 0,1 or 0-3",
		"v.ini:12: [tracker] listen = 7400: want HOST:PORT",
		"v.ini:14: unknown key 'TESSERA_CHUNK_SIZE' in [params]; that is the environment "
		"variable, the key here is 'chunk_size'",
		"v.ini:15: [params] lease_ms = abc: not a whole number of at least 1",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(lines); i++)
		if (tu_sh("grep -qF -- \"%s\" %s/err", lines[i], dir) != 0)
			fail_msg("no line '%s' in the check's errors", lines[i]);
	assert_int_equal(tu_sh("[ $(wc -l < %s/err) -eq %zu ] && [ ! -s %s/out ]", dir,
			       PROTO_ARRAY_LEN(lines), dir),
			 0);
	/* Another section's key in [params], a tunable in a program's. */
	assert_int_equal(tu_write(path, "[params]\nlisten = 1\n[tracker]\nchunk_size = 1\n"), 0);
	assert_int_equal(tu_sh("%s config check '%s' 2>%s/err >/dev/null", bin, path, dir), 1);
	assert_int_equal(tu_sh("grep -qF \"v.ini:2: unknown key 'listen' in [params]; [tracker] "
			       "takes it\" %s/err && grep -qF \"v.ini:4: unknown key 'chunk_size' in "
			       "[tracker]; [params] takes it\" %s/err",
			       dir, dir),
			 0);
	/* The environment, as the programs read it: refused, rc 1. */
	assert_int_equal(tu_write(path, "[log]\nlevel = info\n"), 0);
	assert_int_equal(tu_sh("TESSERA_LEASE_MS=abc %s config check '%s' 2>%s/err >/dev/null", bin,
			       path, dir),
			 1);
	assert_int_equal(tu_sh("[ $(wc -l < %s/err) -eq 1 ] && grep -qF 'TESSERA_LEASE_MS=abc is "
			       "not a number of at least 1' %s/err",
			       dir, dir),
			 0);
	assert_int_equal(tu_sh("TESSERA_LEASE_MS=9000 %s config check '%s' 2>/dev/null | "
			       "grep -q '^lease_ms = 9000 .*(environment;'",
			       bin, path),
			 0);
	tu_rmtree(dir);
}

/* A program given a file with a bad value refuses it at start with the
 * check's line, status 2, before it opens anything (no `metrics on`, no
 * fabric line). */
static void test_program_refuses_values(void **state)
{
	char bin[4096], dir[4096], path[4096];

	tu_mkdtemp(dir, sizeof(dir));
	make_files(dir);
	snprintf(path, sizeof(path), "%s/v.ini", dir);
	static const struct {
		const char *text, *line;
	} cases[] = {
		{"[node]\nranks = 0-x\n", "v.ini:2: [node] ranks = 0-x: want R, R-S"},
		{"[node]\nlayout = tp3x\n", "v.ini:2: [node] layout = tp3x: not a built-in"},
		{"[node]\nstore = gpu\n", "v.ini:2: [node] store = gpu: want host"},
		{"[node]\ntracker = 127.0.0.1:7400\n", "v.ini:2: [node] tracker = 127.0.0.1:7400: want"},
	};
	tu_bin(bin, sizeof(bin), "tessera-node");
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cases); i++) {
		assert_int_equal(tu_write(path, cases[i].text), 0);
		/* Everything else given, so that only the value stops it. */
		int rc = tu_sh("cd %s && timeout 20 %s --config v.ini --tracker http://127.0.0.1:9"
			       " --replica A --rank 0 --layout tp1 --model model.json"
			       " --trainer-pubkey trainer.pub --log-level info >out 2>err",
			       dir, bin);
		assert_int_equal(rc, 2);
		if (tu_sh("grep -qF \"tessera-node: %s\" %s/err", cases[i].line, dir) != 0)
			fail_msg("case %zu: the node's refusal is not '%s'", i, cases[i].line);
		assert_int_equal(tu_sh("[ ! -s %s/out ] && [ $(wc -l < %s/err) -eq 1 ]", dir, dir), 0);
	}
	/* The command line's values too, before the metrics listener. */
	assert_int_equal(tu_sh("cd %s && timeout 20 %s --tracker 127.0.0.1:7400 --replica A --rank 0"
			       " --layout tp3x --model model.json --trainer-pubkey trainer.pub"
			       " >out 2>err",
			       dir, bin),
			 2);
	assert_int_equal(tu_sh("[ ! -s %s/out ] && grep -qF 'tessera-node: --tracker 127.0.0.1:7400: "
			       "want http://' %s/err",
			       dir, dir),
			 0);
	assert_int_equal(tu_write(path, "[tracker]\nlisten = 7400\n"), 0);
	assert_int_equal(tu_sh("cd %s && timeout 20 %s --config v.ini --state st >out 2>err", dir,
			       tu_bin(bin, sizeof(bin), "tessera-tracker")),
			 2);
	assert_int_equal(tu_sh("[ ! -s %s/out ] && [ ! -e %s/st ] && grep -qF 'tessera-tracker: "
			       "v.ini:2: [tracker] listen = 7400: want HOST:PORT' %s/err",
			       dir, dir, dir),
			 0);
	assert_int_equal(tu_write(path, "[publish]\nevery = soon\n"), 0);
	assert_int_equal(tu_sh("cd %s && timeout 20 %s publish --config v.ini >out 2>err", dir,
			       tu_bin(bin, sizeof(bin), "tessera")),
			 2);
	assert_int_equal(tu_sh("grep -qF 'tessera publish: v.ini:2: [publish] every = soon: want "
			       "1..86400000 ms' %s/err",
			       dir),
			 0);
	tu_rmtree(dir);
}

/* proto/PARAMS.md, the reference table of tunables, is what `tessera config
 * params` prints from the table compiled into the program. */
static void test_params_table_committed(void **state)
{
	char bin[4096], data[4096];

	tu_data(data, sizeof(data), "../../proto/PARAMS.md");
	if (tu_sh("%s config params | diff -u '%s' - >&2", tu_bin(bin, sizeof(bin), "tessera"), data) != 0)
		fail_msg("proto/PARAMS.md differs from `tessera config params` (diff above); "
			 "regenerate it: make && build/bin/tessera config params > proto/PARAMS.md");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_configs_lib),
		cmocka_unit_test(test_bad_configs_check),
		cmocka_unit_test(test_bad_config_program),
		cmocka_unit_test(test_file_then_flags),
		cmocka_unit_test(test_spellings),
		cmocka_unit_test(test_missing_values),
		cmocka_unit_test(test_param_follows_env),
		cmocka_unit_test(test_zero_means_off),
		cmocka_unit_test(test_programs_take_every_key),
		cmocka_unit_test(test_check_knows_every_flag),
		cmocka_unit_test(test_values_checked),
		cmocka_unit_test(test_program_refuses_values),
		cmocka_unit_test(test_params_table_committed),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
