/* `tessera config check FILE`: validates a configuration file and prints
 * the effective values. `tessera config params`: the table of tunables
 * compiled into the program, as the Markdown of proto/PARAMS.md. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "node/host/host.h"
#include "proto/config.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

/*
 * The options each program takes from its section. The programs check their
 * own section against their real getopt tables at start-up; these copies let
 * one command check every section of a shared file. tests/test_config.c
 * starts each program with a file naming every key here, so a renamed flag
 * fails the test until this table follows.
 */
static const struct option tracker_opts[] = {
	{"listen", required_argument, NULL, 0},
	{"state", required_argument, NULL, 0},
	{"cluster-key", required_argument, NULL, 0},
	{"trainer-pubkey", required_argument, NULL, 0},
	{"tls-cert", required_argument, NULL, 0},
	{"tls-key", required_argument, NULL, 0},
	{"store", required_argument, NULL, 0},
	{"etcd-ca", required_argument, NULL, 0},
	{"etcd-cert", required_argument, NULL, 0},
	{"etcd-key", required_argument, NULL, 0},
	{"leader-ttl", required_argument, NULL, 0},
	{NULL, 0, NULL, 0},
};

static const struct option node_opts[] = {
	{"tracker", required_argument, NULL, 0},
	{"replica", required_argument, NULL, 0},
	{"rank", required_argument, NULL, 0},
	{"ranks", required_argument, NULL, 0},
	{"serve", required_argument, NULL, 0},
	{"layout", required_argument, NULL, 0},
	{"model", required_argument, NULL, 0},
	{"trainer-pubkey", required_argument, NULL, 0},
	{"cluster-key", required_argument, NULL, 0},
	{"provider", required_argument, NULL, 0},
	{"fabric-iface", required_argument, NULL, 0},
	{"store", required_argument, NULL, 0},
	{"expose", required_argument, NULL, 0},
	{"attach", required_argument, NULL, 0},
	{"attach-mode", required_argument, NULL, 0},
	{"attach-group", required_argument, NULL, 0},
	{"install", required_argument, NULL, 0},
	{"host", required_argument, NULL, 0},
	{"metrics", required_argument, NULL, 0},
	{"tls-ca", required_argument, NULL, 0},
	{"site", required_argument, NULL, 0},
	{NULL, 0, NULL, 0},
};

static const struct option publish_opts[] = {
	{"tracker", required_argument, NULL, 0},
	{"key", required_argument, NULL, 0},
	{"cluster-key", required_argument, NULL, 0},
	{"synthetic-mb", required_argument, NULL, 0},
	{"seed", required_argument, NULL, 0},
	{"model-dir", required_argument, NULL, 0},
	{"layout", required_argument, NULL, 0},
	{"ranks", required_argument, NULL, 0},
	{"provider", required_argument, NULL, 0},
	{"fabric-iface", required_argument, NULL, 0},
	{"versions", required_argument, NULL, 0},
	{"every", required_argument, NULL, 0},
	{"anchor-every", required_argument, NULL, 0},
	{"control", required_argument, NULL, 0},
	{"trainer", required_argument, NULL, 0},
	{"metrics", required_argument, NULL, 0},
	{"tls-ca", required_argument, NULL, 0},
	{"site", required_argument, NULL, 0},
	{NULL, 0, NULL, 0},
};

static void config_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera config check FILE\n"
		"       tessera config params\n"
		"\n"
		"Checks a configuration file (INI) for tessera-tracker, tessera-node and\n"
		"tessera publish (each reads it with --config FILE) and prints the\n"
		"effective values: [log] level and format, every tunable of [params] with\n"
		"where its value comes from (default, file, or the environment, which\n"
		"wins over the file), and the options of [tracker], [node] and [publish].\n"
		"Every value goes through the parser its program applies (rank lists,\n"
		"layouts, stores, durations, URLs, addresses, numbers, key files, which\n"
		"must exist), and so does every TESSERA_* tunable of the environment.\n"
		"Exits 0 when all is valid, 1 when not, with one line per error\n"
		"(FILE:LINE: [section] key = value: reason) on stderr.\n"
		"\n"
		"`params` prints every tunable (environment variable, [params] name,\n"
		"default, meaning) as a Markdown table: proto/PARAMS.md is its output.\n");
}

/* A default as a reader says it: bytes that are a whole number of KiB,
 * MiB or GiB also in those units. */
static void print_default(FILE *f, enum proto_param_id id)
{
	static const char *units[] = {"KiB", "MiB", "GiB"};
	uint64_t v = proto_param_default(id);
	int u = -1;

	fprintf(f, "%llu", (unsigned long long)v);
	if (strstr(proto_param_doc(id), "bytes") == NULL)
		return;
	while (u + 1 < (int)PROTO_ARRAY_LEN(units) && v >= 1024 && v % 1024 == 0) {
		v /= 1024;
		u++;
	}
	if (u >= 0)
		fprintf(f, " (%llu %s)", (unsigned long long)v, units[u]);
}

/* Markdown of every tunable, in the order of proto/params.h. */
static void print_params(FILE *f)
{
	fprintf(f,
		"# Tunables\n"
		"\n"
		"<!-- Generated: `tessera config params > proto/PARAMS.md` after a change to\n"
		"     proto/params.h; `make test T=config` fails while this file differs. -->\n"
		"\n"
		"Every tunable of tessera is an environment variable, read through one table,\n"
		"`proto/params.h` (why each default is what it is: there and in\n"
		"`proto/NOTES.md`). A configuration file (`--config FILE`) names any of them\n"
		"in its `[params]` section by the lower-case name; the environment wins over\n"
		"the file, the file over the default. `tessera config check FILE` prints the\n"
		"effective values and where each comes from. A value is a whole number, at\n"
		"least 1 unless the default is 0 or the meaning says what 0 does.\n"
		"\n"
		"| variable | `[params]` name | default | meaning |\n"
		"| --- | --- | --- | --- |\n");
	for (int i = 0; i < PROTO_PARAM_COUNT; i++) {
		enum proto_param_id id = (enum proto_param_id)i;
		fprintf(f, "| `%s` | `%s` | ", proto_param_env(id), proto_param_name(id));
		print_default(f, id);
		fputs(" | ", f);
		for (const char *s = proto_param_doc(id); *s != '\0'; s++)
			if (*s == '|')
				fputs("\\|", f);
			else
				fputc(*s, f);
		fputs(" |\n", f);
	}
}

int node_cmd_config(int argc, char **argv)
{
	static const struct proto_config_schema schemas[] = {
		{"tracker", tracker_opts, trk_config_values},
		{"node", node_opts, node_host_config_values},
		{"publish", publish_opts, node_publish_config_values},
	};
	struct proto_err err;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		config_usage(stdout);
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "params") == 0) {
		print_params(stdout);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (argc != 3 || strcmp(argv[1], "check") != 0) {
		config_usage(stderr);
		return 2;
	}
	/* Every error is a line of its own on stderr ("FILE:LINE: ..."). */
	if (proto_config_check(argv[2], schemas, PROTO_ARRAY_LEN(schemas), stdout, stderr, &err) != 0)
		return 1;
	return 0;
}
