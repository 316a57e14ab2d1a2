/* `tessera-node`: the node agent for one rank of one serving replica. */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "node/agent.h"
#include "node/metrics_http.h"
#include "proto/config.h"
#include "proto/proto.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera-node --tracker URL --replica ID --rank R --layout L\n"
		"                    --model M.json --trainer-pubkey FILE [--cluster-key FILE]\n"
		"                    [--tls-ca FILE]\n"
		"                    [--provider NAME] [--store host|cuda[:DEV]|auto] [--expose DIR]\n"
		"                    [--attach SOCK] [--install double|in-place]\n"
		"                    [--host NAME] [--config FILE] [--log-format text|json]\n"
		"                    [--log-level err|warn|info|debug] [--metrics HOST:PORT|off]\n"
		"\n"
		"The node agent for one rank of one serving replica: registers at the\n"
		"tracker, pulls the bytes its rank keeps of every new version from the\n"
		"publisher and from peers, verifies them against the signed manifest,\n"
		"serves them to peers and activates a version once every rank of its\n"
		"replica holds it. Start one per rank of the replica's layout.\n"
		"\n"
		"      --tracker URL          the tracker, http://HOST:PORT (https:// for\n"
		"                             a tracker with TLS)\n"
		"      --replica ID           the replica this rank belongs to (A, B, ...)\n"
		"      --rank R               this rank, 0 .. ranks of the layout - 1\n"
		"      --layout L             the replica's serving layout: a layout file\n"
		"                             or a built-in (tpN)\n"
		"      --model M.json         the model spec JSON the publisher serves\n"
		"                             (`tessera model` writes it)\n"
		"      --trainer-pubkey FILE  verify manifests with this key\n"
		"      --cluster-key FILE     sign tracker requests with this cluster key\n"
		"      --tls-ca FILE          verify an https:// tracker against these PEM\n"
		"                             CA certificates (default: the system's)\n"
		"      --provider NAME        libfabric provider (default tcp;ofi_rxm)\n"
		"      --store KIND           where the weights live: host memory, cuda\n"
		"                             (GPU 0; cuda:N for device N) or auto (cuda\n"
		"                             when a GPU is usable)\n"
		"      --expose DIR           write DIR/<replica>-<rank>.json on every\n"
		"                             activation: the version, a memfd path (and\n"
		"                             CUDA IPC handle) a serving process maps, and\n"
		"                             where each local tensor lies in it\n"
		"      --attach SOCK          listen on the Unix socket SOCK for serving\n"
		"                             processes (libtessera-client): tensor table,\n"
		"                             the active version's memory, per-request\n"
		"                             pins, new-version notifications\n"
		"      --install MODE         double (default): a new version is built in\n"
		"                             a second buffer while the old one serves;\n"
		"                             in-place (memory-tight): deltas are fetched\n"
		"                             without a second buffer and written into the\n"
		"                             served one at activation, admission paused\n"
		"                             and running requests drained first\n"
		"                             (TESSERA_INPLACE_DRAIN_MS)\n"
		"      --host NAME            host name to report (default: gethostname)\n"
		"      --metrics A            serve /metrics and /healthz on A (default\n"
		"                             127.0.0.1:0, a free port; printed as\n"
		"                             `metrics on URL` on stdout; off: none)\n"
		"      --config FILE          the [node] section gives options (flags\n"
		"                             override it), [params] tunables, [log]\n"
		"                             level and format\n"
		"      --log-format F         text (default) or json, one object a line\n"
		"      --log-level L          err, warn (default), info or debug\n"
		"  -h, --help                 this text\n"
		"      --version              print the release and exit\n");
}

static struct node_agent *agent_g; /* for the signal handler */

static void on_left(void *arg)
{
	event_base_loopexit(arg, NULL);
}

/* The first signal: tell the tracker we leave, then stop; a second one
 * stops at once. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	static bool asked;

	if (agent_g == NULL || asked) {
		event_base_loopexit(arg, NULL);
		return;
	}
	asked = true;
	node_agent_leave(agent_g, on_left, arg);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tracker", required_argument, NULL, 't'},
		{"replica", required_argument, NULL, 'r'},
		{"rank", required_argument, NULL, 'k'},
		{"layout", required_argument, NULL, 'l'},
		{"model", required_argument, NULL, 'm'},
		{"trainer-pubkey", required_argument, NULL, 'p'},
		{"cluster-key", required_argument, NULL, 'c'},
		{"tls-ca", required_argument, NULL, 'T'},
		{"provider", required_argument, NULL, 'P'},
		{"store", required_argument, NULL, 's'},
		{"expose", required_argument, NULL, 'e'},
		{"attach", required_argument, NULL, 'A'},
		{"install", required_argument, NULL, 'I'},
		{"host", required_argument, NULL, 'H'},
		{"metrics", required_argument, NULL, 'M'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0}};
	struct node_agent_opts o = {0};
	struct node_agent *agent = NULL;
	struct node_metrics *metrics = NULL;
	struct node_metrics_http *mhttp = NULL;
	const char *metrics_at = NODE_METRICS_DEFAULT;
	struct event_base *base;
	struct event *sigint, *sigterm;
	struct proto_err err;
	uint64_t rank = UINT64_MAX;
	int c, rc = 1;

	proto_cli_setup();
	proto_log_setup("tessera-node", -1);
	proto_config_cli("tessera-node", "node", opts, &argc, &argv);
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 't': o.tracker_url = optarg; break;
		case 'r': o.replica = optarg; break;
		case 'k':
			if (proto_parse_u64(optarg, 0, 65535, &rank) != 0) {
				fprintf(stderr, "tessera-node: --rank %s is not a rank\n", optarg);
				return 2;
			}
			break;
		case 'l': o.layout = optarg; break;
		case 'm': o.model = optarg; break;
		case 'p': o.trainer_pubkey = optarg; break;
		case 'c': o.cluster_key = optarg; break;
		case 'T': o.tls_ca = optarg; break;
		case 'P': o.provider = optarg; break;
		case 's': o.store = optarg; break;
		case 'e': o.expose_dir = optarg; break;
		case 'A': o.attach_path = optarg; break;
		case 'I':
			if (strcmp(optarg, "double") != 0 && strcmp(optarg, "in-place") != 0) {
				fprintf(stderr, "tessera-node: --install %s: want double or in-place\n",
					optarg);
				return 2;
			}
			o.install_inplace = strcmp(optarg, "in-place") == 0;
			break;
		case 'H': o.host = optarg; break;
		case 'M': metrics_at = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'V': proto_cli_version("tessera-node"); return 0;
		default: return proto_cli_bad_option("tessera-node", c, argv);
		}
	}
	if (optind != argc)
		return proto_cli_extra("tessera-node", argv[optind]);
	static const char *const required[] = {"--tracker", "--replica", "--rank", "--layout",
					       "--model", "--trainer-pubkey"};
	const bool given[] = {o.tracker_url, o.replica, rank != UINT64_MAX, o.layout, o.model,
			      o.trainer_pubkey};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(required); i++)
		if (!given[i])
			return proto_cli_missing("tessera-node", required[i]);
	o.rank = (uint32_t)rank;
	char ident[128];
	snprintf(ident, sizeof(ident), "%s/%u", o.replica, o.rank);
	proto_log_set_identity(ident);
	signal(SIGPIPE, SIG_IGN);
	base = event_base_new();
	if (base == NULL) {
		fprintf(stderr, "tessera-node: cannot create an event loop\n");
		return 1;
	}
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	if (strcmp(metrics_at, "off") != 0) {
		metrics = node_metrics_new();
		if (metrics == NULL) {
			fprintf(stderr, "tessera-node: out of memory\n");
			goto out;
		}
		if (node_metrics_http_new(base, metrics_at, metrics, &mhttp, &err) != 0) {
			fprintf(stderr, "tessera-node: %s\n", err.msg);
			goto out;
		}
		printf("metrics on %s\n", node_metrics_http_url(mhttp));
		fflush(stdout);
		o.metrics = metrics;
	}
	if (node_agent_new(base, &o, &agent, &err) != 0) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		goto out;
	}
	agent_g = agent;
	event_base_dispatch(base);
	agent_g = NULL;
	if (node_agent_failed(agent, &err)) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		goto out;
	}
	rc = 0;
out:
	node_agent_free(agent);
	node_metrics_http_free(mhttp);
	node_metrics_free(metrics);
	event_free(sigint);
	event_free(sigterm);
	event_base_free(base);
	return rc;
}
