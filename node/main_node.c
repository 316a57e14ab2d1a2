/* `tessera-node`: the node agent for one rank of one serving replica. */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "node/agent.h"
#include "node/metrics_http.h"
#include "proto/config.h"
#include "proto/proto.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera-node --tracker URL --replica ID --rank R --layout S.json|tpN\n"
		"                    --model M.json --trainer-pubkey FILE [--cluster-key FILE]\n"
		"                    [--provider NAME] [--store host|cuda|auto] [--expose DIR]\n"
		"                    [--attach SOCKET]\n"
		"                    [--host NAME] [--config FILE] [--log-format text|json]\n"
		"                    [--log-level err|warn|info|debug] [--metrics HOST:PORT|off]\n"
		"  --metrics A   serve /metrics and /healthz on A (default 127.0.0.1:0, a\n"
		"                free port; printed as `metrics on URL` on stdout)\n"
		"  --config FILE the [node] section gives options (flags override it),\n"
		"                [params] tunables, [log] level and format\n"
		"  --expose DIR  write DIR/<replica>-<rank>.json on every activation: the\n"
		"                version, a memfd path (and CUDA IPC handle) a serving\n"
		"                process maps, and where each local tensor lies in it\n"
		"  --attach SOCK listen on the Unix socket SOCK for serving processes\n"
		"                (libtessera-client): tensor table, the active version's\n"
		"                memory, per-request pins, new-version notifications\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	event_base_loopexit(arg, NULL);
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
		{"provider", required_argument, NULL, 'P'},
		{"store", required_argument, NULL, 's'},
		{"expose", required_argument, NULL, 'e'},
		{"attach", required_argument, NULL, 'A'},
		{"host", required_argument, NULL, 'H'},
		{"metrics", required_argument, NULL, 'M'},
		{"help", no_argument, NULL, 'h'},
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

	proto_log_setup("tessera-node", -1);
	proto_config_cli("tessera-node", "node", opts, &argc, &argv);
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
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
		case 'P': o.provider = optarg; break;
		case 's': o.store = optarg; break;
		case 'e': o.expose_dir = optarg; break;
		case 'A': o.attach_path = optarg; break;
		case 'H': o.host = optarg; break;
		case 'M': metrics_at = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (o.tracker_url == NULL || o.replica == NULL || rank == UINT64_MAX || o.layout == NULL ||
	    o.model == NULL || o.trainer_pubkey == NULL || optind != argc) {
		usage(stderr);
		return 2;
	}
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
	event_base_dispatch(base);
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
