/* `tessera config check FILE`: validates a configuration file and prints
 * the effective values. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "proto/config.h"
#include "proto/proto.h"

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
	{"store", required_argument, NULL, 0},
	{"expose", required_argument, NULL, 0},
	{"attach", required_argument, NULL, 0},
	{"install", required_argument, NULL, 0},
	{"host", required_argument, NULL, 0},
	{"metrics", required_argument, NULL, 0},
	{"tls-ca", required_argument, NULL, 0},
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
	{"versions", required_argument, NULL, 0},
	{"every", required_argument, NULL, 0},
	{"anchor-every", required_argument, NULL, 0},
	{"control", required_argument, NULL, 0},
	{"trainer", required_argument, NULL, 0},
	{"metrics", required_argument, NULL, 0},
	{"tls-ca", required_argument, NULL, 0},
	{NULL, 0, NULL, 0},
};

static void config_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera config check FILE\n"
		"\n"
		"Checks a configuration file (INI) for tessera-tracker, tessera-node and\n"
		"tessera publish (each reads it with --config FILE) and prints the\n"
		"effective values: [log] level and format, every tunable of [params] with\n"
		"where its value comes from (default, file, or the environment, which\n"
		"wins over the file), and the options of [tracker], [node] and [publish].\n"
		"Exits 0 when the file is valid, 1 with a one-line FILE:LINE error when not.\n");
}

int node_cmd_config(int argc, char **argv)
{
	static const struct proto_config_schema schemas[] = {
		{"tracker", tracker_opts},
		{"node", node_opts},
		{"publish", publish_opts},
	};
	struct proto_err err;

	if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		config_usage(stdout);
		return 0;
	}
	if (argc != 3 || strcmp(argv[1], "check") != 0) {
		config_usage(stderr);
		return 2;
	}
	if (proto_config_check(argv[2], schemas, PROTO_ARRAY_LEN(schemas), stdout, &err) != 0) {
		fprintf(stderr, "tessera config: %s\n", err.msg);
		return 1;
	}
	return 0;
}
