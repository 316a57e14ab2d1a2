/* The command line of every built program and subcommand: --help documents
 * each option the command takes and only those, an unknown option and a
 * missing value get one wording and status 2, a missing required flag is
 * named, --version and `tessera help` answer. Runs the built binaries. */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tests/testutil.h"
#include "tests/ckpt_util.h"

struct cmd {
	const char *bin;       /* program under build/bin */
	const char *sub;       /* subcommand of `tessera`, or NULL */
	const char *prog;      /* how its messages name it */
	const char *opts[28];  /* every long option it takes (NULL-terminated) */
	const char *required;  /* one flag the error names when nothing is given */
	const char *mentions[4]; /* other commands' options its help refers to */
};

static const struct cmd cmds[] = {
	{"tessera-tracker", NULL, "tessera-tracker",
	 {"listen", "state", "cluster-key", "trainer-pubkey", "config", "log-format", "log-level", "help",
	  "version", "tls-cert", "tls-key", "store", "etcd-ca", "etcd-cert", "etcd-key",
	  "leader-ttl"}, "--listen", {NULL}},
	{"tessera-node", NULL, "tessera-node",
	 {"tracker", "replica", "rank", "layout", "model", "trainer-pubkey", "cluster-key",
	  "provider", "store", "expose", "attach", "install", "host", "metrics", "config", "log-format", "log-level", "help",
	  "version", "tls-ca", "ranks", "serve", "attach-mode", "attach-group", "fabric-iface",
	  "site"},
	 "--tracker", {NULL}},
	{"tessera", "plan", "tessera plan", {"model", "from", "to", "json", "help"}, "--model", {NULL}},
	{"tessera", "cluster", "tessera cluster",
	 {"trainer-ranks", "trainer-layout", "replica", "synthetic-mb", "model-dir", "versions",
	  "provider", "seed", "report", "keep", "every", "stagger", "duration", "mode", "late-replica",
	  "help", "anchor-every", "trainer-site"},
	 NULL, {NULL}},
	{"tessera", "keygen", "tessera keygen", {"out", "cluster", "force", "help"}, "-o PATH", {NULL}},
	{"tessera", "publish", "tessera publish",
	 {"tracker", "key", "cluster-key", "synthetic-mb", "seed", "model-dir", "layout", "ranks",
	  "provider", "versions", "every", "anchor-every", "control", "metrics", "config", "log-format", "log-level",
	  "help", "trainer", "tls-ca", "fabric-iface", "site"},
	 "--tracker URL", {NULL}},
	{"tessera", "synth", "tessera synth",
	 {"out", "synthetic-mb", "steps", "lr", "seed", "threads", "help"}, "-o DIR", {NULL}},
	{"tessera", "delta", "tessera delta",
	 {"parent", "child", "out", "level", "chunk", "threads", "help"}, NULL, {NULL}},
	{"tessera", "model", "tessera model", {"synthetic-mb", "model-dir", "tracker", "out", "help", "tls-ca"}, NULL,
	 {"model"}},
	{"tessera", "probe", "tessera probe",
	 {"attach", "replica", "rank", "min-version", "timeout-ms", "tracker", "cluster-key", "help"},
	 "--attach SOCK", {NULL}},
};

struct env {
	char dir[256], out[512], err[512];
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->out, sizeof(e->out), "%s/out", e->dir);
	snprintf(e->err, sizeof(e->err), "%s/err", e->dir);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	tu_rmtree(e->dir);
	free(e);
	return 0;
}

static char *slurp(const char *path)
{
	uint8_t *buf = NULL;
	size_t len;
	struct proto_err err;
	assert_int_equal(proto_read_file(path, 1 << 20, &buf, &len, &err), 0);
	return (char *)buf;
}

/* Runs `<cmd> ARGS` (ARGS: a shell word list) with stdout and stderr in
 * e->out and e->err; returns the exit status. */
static int run(struct env *e, const struct cmd *c, const char *args)
{
	char bin[512];
	tu_bin(bin, sizeof(bin), c->bin);
	return tu_sh("cd %s && %s %s %s </dev/null >%s 2>%s", e->dir, bin, c->sub ? c->sub : "",
		     args, e->out, e->err);
}

/* The option names "--xyz" a help text mentions. */
static size_t help_options(const char *help, char names[][64], size_t max)
{
	size_t n = 0;
	for (const char *p = strstr(help, "--"); p != NULL && n < max; p = strstr(p + 2, "--")) {
		size_t k = 0;
		const char *q = p + 2;
		if (p > help && (isalnum((unsigned char)p[-1]) || p[-1] == '-'))
			continue;
		while (k < 63 && (isalnum((unsigned char)q[k]) || q[k] == '-'))
			k++;
		if (k == 0)
			continue;
		memcpy(names[n], q, k);
		names[n][k] = 0;
		n++;
	}
	return n;
}

static bool listed(const struct cmd *c, const char *name)
{
	for (size_t i = 0; c->opts[i] != NULL; i++)
		if (strcmp(c->opts[i], name) == 0)
			return true;
	for (size_t i = 0; i < PROTO_ARRAY_LEN(c->mentions) && c->mentions[i] != NULL; i++)
		if (strcmp(c->mentions[i], name) == 0)
			return true;
	return false;
}

static void test_help_lists_every_option(void **state)
{
	struct env *e = *state;

	for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++) {
		const struct cmd *c = &cmds[i];
		char names[128][64], word[80];
		assert_int_equal(run(e, c, "--help"), 0);
		char *help = slurp(e->out);
		assert_non_null(strstr(help, "usage: "));
		/* Every option the command takes is in its help ... */
		for (size_t k = 0; c->opts[k] != NULL; k++) {
			snprintf(word, sizeof(word), "--%s", c->opts[k]);
			if (strstr(help, word) == NULL)
				fail_msg("%s --help does not mention %s", c->prog, word);
		}
		/* ... and every option its help names is one it takes (deprecated
		 * spellings are named as such and still accepted). */
		size_t n = help_options(help, names, 128);
		for (size_t k = 0; k < n; k++) {
			if (listed(c, names[k]))
				continue;
			snprintf(word, sizeof(word), "--%s: deprecated", names[k]);
			if (strstr(help, word) != NULL)
				continue;
			fail_msg("%s --help names --%s, which it does not take", c->prog, names[k]);
		}
		free(help);
	}
}

static void test_unknown_option_one_wording(void **state)
{
	struct env *e = *state;
	char want[256];

	for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++) {
		const struct cmd *c = &cmds[i];
		const char *sub = c->sub && strcmp(c->sub, "delta") == 0 ? "encode " : "";
		char args[128];
		snprintf(args, sizeof(args), "%s--no-such-option", sub);
		assert_int_equal(run(e, c, args), 2);
		char *err = slurp(e->err);
		snprintf(want, sizeof(want), "%s: unknown option '--no-such-option' (see --help)\n",
			 c->prog);
		assert_string_equal(err, want);
		free(err);
		/* A value-taking option without its value. */
		const char *valued = c->opts[0];
		if (strcmp(valued, "help") != 0 && strcmp(valued, "json") != 0) {
			snprintf(args, sizeof(args), "%s--%s", sub, strcmp(valued, "cluster") == 0 ? "out" : valued);
			assert_int_equal(run(e, c, args), 2);
			err = slurp(e->err);
			assert_non_null(strstr(err, "needs a value (see --help)\n"));
			assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1);
			free(err);
		}
		/* Nothing at all: the missing flag is named. */
		if (c->required != NULL) {
			snprintf(args, sizeof(args), "%s", sub);
			assert_int_equal(run(e, c, args), 2);
			err = slurp(e->err);
			snprintf(want, sizeof(want), "%s: %s is required (see --help)\n", c->prog,
				 c->required);
			if (strcmp(c->prog, "tessera delta") != 0)
				assert_string_equal(err, want);
			free(err);
		}
	}
}

static void test_required_flag_named(void **state)
{
	struct env *e = *state;
	char *err;

	/* tessera-node names the first flag that is missing, in turn. */
	assert_int_equal(run(e, &cmds[1], "--tracker http://127.0.0.1:1 --replica A"), 2);
	err = slurp(e->err);
	assert_string_equal(err, "tessera-node: --rank is required (see --help)\n");
	free(err);
	assert_int_equal(run(e, &cmds[0], "--listen 127.0.0.1:0"), 2);
	err = slurp(e->err);
	assert_string_equal(err, "tessera-tracker: --state (or --store) is required (see --help)\n");
	free(err);
	assert_int_equal(run(e, &cmds[2], "--model m.json --from tp2"), 2);
	err = slurp(e->err);
	assert_string_equal(err, "tessera plan: --to is required (see --help)\n");
	free(err);
	/* An extra argument is named too. */
	assert_int_equal(run(e, &cmds[0], "--listen 127.0.0.1:0 --state s extra"), 2);
	err = slurp(e->err);
	assert_string_equal(err, "tessera-tracker: unexpected argument 'extra' (see --help)\n");
	free(err);
}

static void test_version_and_help(void **state)
{
	struct env *e = *state;
	static const struct cmd bins[] = {
		{"tessera", NULL, "tessera", {NULL}, NULL, {NULL}},
		{"tessera-node", NULL, "tessera-node", {NULL}, NULL, {NULL}},
		{"tessera-tracker", NULL, "tessera-tracker", {NULL}, NULL, {NULL}},
	};
	char want[128], *out;

	for (size_t i = 0; i < PROTO_ARRAY_LEN(bins); i++) {
		assert_int_equal(run(e, &bins[i], "--version"), 0);
		out = slurp(e->out);
		snprintf(want, sizeof(want), "%s %s\n", bins[i].prog, PROTO_RELEASE);
		assert_string_equal(out, want);
		free(out);
	}
	/* `tessera help` lists every subcommand; `tessera help X` = `tessera X --help`. */
	assert_int_equal(run(e, &bins[0], "help"), 0);
	out = slurp(e->out);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cmds); i++) {
		char line[64];
		if (cmds[i].sub == NULL)
			continue;
		snprintf(line, sizeof(line), "\n  %s ", cmds[i].sub);
		assert_non_null(strstr(out, line));
	}
	free(out);
	assert_int_equal(run(e, &bins[0], "help publish"), 0);
	out = slurp(e->out);
	assert_non_null(strstr(out, "usage: tessera publish"));
	free(out);
	assert_int_equal(run(e, &bins[0], "help nonesuch"), 2);
	assert_int_equal(run(e, &bins[0], "nonesuch"), 2);
	out = slurp(e->err);
	assert_string_equal(out, "tessera: unknown command 'nonesuch' (see tessera help)\n");
	free(out);
}

/* Deprecated spellings still work and say what replaced them; cluster's old
 * --model DIR is refused, since --model names a model spec elsewhere. */
static void test_deprecated_spellings(void **state)
{
	struct env *e = *state;
	char *err;

	assert_int_equal(run(e, &cmds[6], "-o d --mb 0.01"), 2); /* still wants --steps */
	err = slurp(e->err);
	assert_string_equal(err, "tessera synth: --mb is deprecated, use --synthetic-mb\n"
				 "tessera synth: --steps K is required (see --help)\n");
	free(err);
	assert_int_equal(run(e, &cmds[3], "--model somewhere"), 2);
	err = slurp(e->err);
	assert_string_equal(err, "tessera cluster: --model DIR is now --model-dir DIR\n");
	free(err);
}

/* tessera-node refuses a bad --attach-mode or --attach-group, or one
 * without --attach, in one line and status 2, before it makes anything. */
static void test_node_bad_attach_perm(void **state)
{
	struct env *e = *state;
	static const char *base = "--tracker http://127.0.0.1:1 --replica A --rank 0 --layout tp1"
				  " --model m.json --trainer-pubkey k.pub";
	static const struct {
		const char *args, *err;
	} bad[] = {
		{"--attach-mode 0660",
		 "tessera-node: --attach-mode needs --attach\n"},
		{"--attach-group 0",
		 "tessera-node: --attach-group needs --attach\n"},
		{"--attach s/A-0.sock --attach-mode 0986",
		 "tessera-node: --attach-mode 0986: want octal permission bits, 0000 to 0777 (0660)\n"},
		{"--attach s/A-0.sock --attach-mode u=rw,g=rw",
		 "tessera-node: --attach-mode u=rw,g=rw: want octal permission bits, 0000 to 0777 (0660)\n"},
		{"--attach s/A-0.sock --attach-mode 0660 --attach-group tessera-no-such-group-x",
		 "tessera-node: --attach-group tessera-no-such-group-x: no such group\n"},
	};
	char args[512];

	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		snprintf(args, sizeof(args), "%s %s", base, bad[i].args);
		assert_int_equal(run(e, &cmds[1], args), 2);
		char *err = slurp(e->err);
		assert_string_equal(err, bad[i].err);
		free(err);
		assert_int_equal(tu_sh("test ! -e %s/s", e->dir), 0);
	}
	/* The same from the configuration file's [node] section. */
	assert_int_equal(tu_sh("printf '[node]\\nattach = s\\nattach-mode = 8\\n' >%s/n.ini", e->dir), 0);
	snprintf(args, sizeof(args), "%s --config n.ini", base);
	assert_int_equal(run(e, &cmds[1], args), 2);
	char *err = slurp(e->err);
	assert_string_equal(err, "tessera-node: n.ini:3: [node] attach-mode = 8: want octal permission "
				 "bits, 0000 to 0777 (0660)\n");
	free(err);
}

/* tessera cluster refuses a mode it does not know, late replicas with
 * nobody to join, and late replicas on a publishing clock, in one line. */
static void test_cluster_bad_mode_and_late(void **state)
{
	struct env *e = *state;
	static const struct {
		const char *args, *err;
	} bad[] = {
		{"--mode ring", "tessera cluster: --mode wants fanout or star, not 'ring'\n"},
		{"--late-replica tp1", "tessera cluster: --late-replica joins replicas named by --replica\n"},
		{"--replica tp1 --late-replica tp1 --every 100",
		 "tessera cluster: --late-replica joins after the last version; drop --every\n"},
	};

	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		assert_int_equal(run(e, &cmds[3], bad[i].args), 2);
		char *err = slurp(e->err);
		assert_string_equal(err, bad[i].err);
		free(err);
	}
}

/* A command that writes a file says so in one line on stderr (starting
 * with want) and prints nothing on stdout, which is for machine output. */
static void said_wrote(struct env *e, const char *want)
{
	char *out = slurp(e->out), *err = slurp(e->err);

	assert_string_equal(out, "");
	assert_non_null(strchr(err, '\n'));
	assert_string_equal(strchr(err, '\n') + 1, "");
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("said '%s', want '%s...'", err, want);
	free(out);
	free(err);
}

/* `tessera synth` writes its versions and says so in one line. */
static void test_synth_says_one_line(void **state)
{
	struct env *e = *state;

	assert_int_equal(run(e, &cmds[6], "--synthetic-mb 0.25 --steps 2 --threads 1 -o syn"), 0);
	said_wrote(e, "tessera synth: wrote syn/v0..v2.safetensors: ");
}

/* `tessera model` writes the spec a node takes: the same digest as the
 * synthetic model the publisher builds for the same size. */
static void test_model_command(void **state)
{
	struct env *e = *state;
	struct proto_model a, b;
	struct proto_err err;
	char path[600];

	assert_int_equal(run(e, &cmds[8], "--synthetic-mb 2 -o m.json"), 0);
	said_wrote(e, "tessera model: wrote m.json ");
	snprintf(path, sizeof(path), "%s/m.json", e->dir);
	proto_model_init(&a);
	assert_int_equal(proto_model_load(path, &a, &err), 0);
	assert_int_equal(proto_fixture_model(2 << 20, &b, &err), 0);
	assert_memory_equal(a.digest, b.digest, PROTO_HASH_BYTES);
	proto_model_fini(&a);
	/* A Hugging Face sharded checkpoint given as the model dir. */
	const void **data = calloc(b.ntensors, sizeof(*data));
	assert_non_null(data);
	for (uint32_t t = 0; t < b.ntensors; t++)
		assert_non_null(data[t] = calloc(1, b.tensors[t].nbytes));
	snprintf(path, sizeof(path), "%s/hf", e->dir);
	tu_write_hf_checkpoint(path, &b, 2, data);
	for (uint32_t t = 0; t < b.ntensors; t++)
		free((void *)data[t]);
	free(data);
	assert_int_equal(run(e, &cmds[8], "--model-dir hf -o hf.json"), 0);
	snprintf(path, sizeof(path), "%s/hf.json", e->dir);
	proto_model_init(&a);
	assert_int_equal(proto_model_load(path, &a, &err), 0);
	assert_memory_equal(a.digest, b.digest, PROTO_HASH_BYTES);
	proto_model_fini(&a);
	proto_model_fini(&b);
	/* Bad input: a size that is not one, both sources, neither. */
	assert_int_equal(run(e, &cmds[8], "--synthetic-mb -3"), 2);
	assert_int_equal(run(e, &cmds[8], "--synthetic-mb 2 --tracker http://127.0.0.1:1"), 2);
	assert_int_equal(run(e, &cmds[8], ""), 2);
	/* A tracker that is not there: a one-line error, status 1. */
	assert_int_equal(run(e, &cmds[8], "--tracker http://127.0.0.1:1"), 1);
	char *msg = slurp(e->err);
	assert_ptr_equal(strchr(msg, '\n'), msg + strlen(msg) - 1);
	free(msg);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_help_lists_every_option),
		cmocka_unit_test(test_unknown_option_one_wording),
		cmocka_unit_test(test_required_flag_named),
		cmocka_unit_test(test_version_and_help),
		cmocka_unit_test(test_deprecated_spellings),
		cmocka_unit_test(test_cluster_bad_mode_and_late),
		cmocka_unit_test(test_node_bad_attach_perm),
		cmocka_unit_test(test_model_command),
		cmocka_unit_test(test_synth_says_one_line),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
