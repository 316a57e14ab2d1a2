/* `tessera probe`: the canary of a rank's live weights, read like a serving
 * engine reads them (node/cli/probe.h). */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "node/cli/probe.h"
#include "proto/canary.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

static void probe_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera probe --attach SOCK --replica NAME [--rank N] [--min-version V]\n"
		"                     [--timeout-ms MS] [--tracker URL --cluster-key FILE]\n"
		"\n"
		"Attaches to a node's attach socket as a serving engine would, pins the\n"
		"active version and computes its canary score: a fixed-input pass of\n"
		"matrix-vector products through every tensor of the rank, the same\n"
		"computation the publisher ran over the version's export. With --tracker\n"
		"the score is reported and compared with the publisher's; the tracker's\n"
		"status then shows per replica and version whether the live weights match.\n"
		"Prints one line; exits 1 when the score is not the expected one or the\n"
		"probe failed, 0 otherwise (also when no expected score is known).\n"
		"\n"
		"      --attach SOCK       the node's attach socket (tessera-node --attach)\n"
		"      --replica NAME      replica to attach as\n"
		"      --rank N            rank to attach as (default 0)\n"
		"      --min-version V     wait until version V or newer is active (default 1)\n"
		"      --timeout-ms MS     bound on every wait (default 10000)\n"
		"      --tracker URL       report the score to this tracker\n"
		"      --cluster-key FILE  the cluster key the tracker checks POSTs with\n"
		"  -h, --help              this text\n");
}

int node_cmd_probe(int argc, char **argv)
{
	static const struct option opts[] = {
		{"attach", required_argument, NULL, 'a'},
		{"replica", required_argument, NULL, 'r'},
		{"rank", required_argument, NULL, 'k'},
		{"min-version", required_argument, NULL, 'm'},
		{"timeout-ms", required_argument, NULL, 't'},
		{"tracker", required_argument, NULL, 'T'},
		{"cluster-key", required_argument, NULL, 'c'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *sock = NULL, *replica = NULL, *url = NULL, *ckey = NULL;
	uint64_t rank = 0, minv = 1, timeout = 10000;
	uint8_t ck[PROTO_CLUSTER_KEY_BYTES];
	struct proto_err err = {{0}};
	struct trk_client *trk = NULL;
	struct node_probe pr;
	int c, rc;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 'a': sock = optarg; break;
		case 'r': replica = optarg; break;
		case 'T': url = optarg; break;
		case 'c': ckey = optarg; break;
		case 'k':
		case 'm':
		case 't': {
			uint64_t *dst = c == 'k' ? &rank : c == 'm' ? &minv : &timeout;
			uint64_t lo = c == 'k' ? 0 : 1, hi = c == 'k' ? UINT32_MAX :
						     c == 'm' ? INT64_MAX : 86400000;
			if (proto_parse_u64(optarg, lo, hi, dst) != 0) {
				fprintf(stderr, "tessera probe: --%s: '%s' is not a number in %" PRIu64
						"..%" PRIu64 "\n",
					c == 'k' ? "rank" : c == 'm' ? "min-version" : "timeout-ms",
					optarg, lo, hi);
				return 2;
			}
			break;
		}
		case 'h':
			probe_usage(stdout);
			return 0;
		default:
			return proto_cli_bad_option("tessera probe", c, argv);
		}
	}
	if (optind < argc)
		return proto_cli_extra("tessera probe", argv[optind]);
	if (sock == NULL)
		return proto_cli_missing("tessera probe", "--attach SOCK");
	if (replica == NULL)
		return proto_cli_missing("tessera probe", "--replica NAME");
	if (ckey != NULL && url == NULL)
		return proto_cli_missing("tessera probe", "--tracker URL (with --cluster-key)");
	/* Without a cluster key the report goes unsigned (a tracker without one). */
	if (url != NULL && ((ckey != NULL && (rc = proto_key_load_cluster(ckey, ck, &err)) != 0) ||
			    (rc = trk_client_new(NULL, url, ckey ? ck : NULL, &trk, &err)) != 0)) {
		fprintf(stderr, "tessera probe: %s\n", err.msg);
		return 1;
	}
	rc = node_probe_read(sock, replica, (uint32_t)rank, minv, (int)timeout, &pr, &err);
	if (rc == 0 && trk != NULL)
		rc = node_probe_report(trk, replica, (uint32_t)rank, &pr, &err);
	trk_client_free(trk);
	if (rc != 0) {
		fprintf(stderr, "tessera probe: %s\n", err.msg);
		return 1;
	}
	printf("%s/%" PRIu64 " v%" PRIu64 " canary %.9f (score %" PRId64 ")", replica, rank,
	       pr.version, proto_canary_value(pr.score), (int64_t)pr.score);
	if (url == NULL)
		printf("\n");
	else if (pr.ok < 0)
		printf(": no expected score at the tracker\n");
	else
		printf(", expected %" PRId64 ": %s\n", (int64_t)pr.expected,
		       pr.ok ? "ok" : "MISMATCH: the live weights are not the version's");
	return pr.ok == 0 ? 1 : 0;
}
