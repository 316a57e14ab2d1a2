/* `tessera keygen`: writes a trainer Ed25519 key pair or a cluster key. */
#include <errno.h>
#include <getopt.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "node/cli/cmd.h"
#include "proto/proto.h"

static void keygen_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera keygen -o PREFIX [--force]\n"
		"       tessera keygen --cluster -o FILE [--force]\n"
		"\n"
		"Writes a trainer Ed25519 key pair: PREFIX.key (secret, mode 0600) and\n"
		"PREFIX.pub (public, mode 0644). Publishers sign manifests with the\n"
		"secret key; trackers and nodes verify them with the public key.\n"
		"With --cluster, writes one shared cluster key to FILE (mode 0600).\n"
		"\n"
		"  -o, --out PATH   output prefix (key pair) or file (--cluster)\n"
		"  -c, --cluster    write a cluster key instead of a key pair\n"
		"  -f, --force      replace existing files\n"
		"  -h, --help       this text\n");
}

/* Refuses to replace a key file unless asked: losing a trainer key means
 * every node must be given a new public key. */
static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

int node_cmd_keygen(int argc, char **argv)
{
	static const struct option opts[] = {
		{"out", required_argument, NULL, 'o'},
		{"cluster", no_argument, NULL, 'c'},
		{"force", no_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *out = NULL;
	bool cluster = false, force = false;
	char sec[4096], pub[4096];
	struct proto_err err = {{0}};
	int c, rc;

	optind = 1;
	opterr = 0; /* errors are reported below, in one line */
	while ((c = getopt_long(argc, argv, ":o:cfh", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 'c':
			cluster = true;
			break;
		case 'f':
			force = true;
			break;
		case 'h':
			keygen_usage(stdout);
			return 0;
		default:
			return proto_cli_bad_option("tessera keygen", c, argv);
		}
	}
	if (optind < argc)
		return proto_cli_extra("tessera keygen", argv[optind]);
	if (out == NULL || *out == 0)
		return proto_cli_missing("tessera keygen", "-o PATH");

	if (cluster) {
		if (!force && exists(out)) {
			fprintf(stderr, "tessera keygen: %s exists; use --force to replace it\n",
				out);
			return 1;
		}
		rc = proto_cluster_keygen(out, &err);
		if (rc != 0) {
			fprintf(stderr, "tessera keygen: %s\n", err.msg);
			return 1;
		}
		fprintf(stderr, "tessera keygen: wrote cluster key %s\n", out);
		return 0;
	}

	if ((size_t)snprintf(sec, sizeof(sec), "%s.key", out) >= sizeof(sec) ||
	    (size_t)snprintf(pub, sizeof(pub), "%s.pub", out) >= sizeof(pub)) {
		fprintf(stderr, "tessera keygen: %s: path too long\n", out);
		return 1;
	}
	if (!force && (exists(sec) || exists(pub))) {
		fprintf(stderr, "tessera keygen: %s exists; use --force to replace it\n",
			exists(sec) ? sec : pub);
		return 1;
	}
	rc = proto_keygen(sec, pub, &err);
	if (rc != 0) {
		fprintf(stderr, "tessera keygen: %s\n", err.msg);
		return 1;
	}
	{
		uint8_t pk[PROTO_PK_BYTES];
		char hex[2 * PROTO_PK_BYTES + 1];
		if (proto_key_load_public(pub, pk, &err) != 0) {
			fprintf(stderr, "tessera keygen: %s\n", err.msg);
			return 1;
		}
		sodium_bin2hex(hex, sizeof(hex), pk, sizeof(pk));
		/* The message to stderr; the public key, machine output, alone
		 * on stdout (PUB=$(tessera keygen -o trainer)). */
		fprintf(stderr, "tessera keygen: wrote %s and %s\n", sec, pub);
		printf("%s\n", hex);
	}
	return 0;
}
