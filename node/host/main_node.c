/* `tessera-node`: the node agent for the serving ranks of one host: one rank
 * of one replica, or several, of one or several replicas (node/host/host.h). */
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "node/agent/agent.h"
#include "node/host/host.h"
#include "node/serve/perm.h"
#include "node/store/store.h"
#include "tracker/tracker.h"
#include "node/base/metrics_http.h"
#include "proto/config.h"
#include "proto/proto.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera-node --tracker URL --replica ID --rank R --layout L\n"
		"                    --model M.json --trainer-pubkey FILE [--cluster-key FILE]\n"
		"                    [--tls-ca FILE] [--site NAME]\n"
		"                    [--provider NAME] [--fabric-iface NAME] [--store host|cuda[:DEV]|auto] [--expose DIR]\n"
		"                    [--attach SOCK [--attach-mode MODE] [--attach-group GROUP]]\n"
		"                    [--install double|in-place]\n"
		"                    [--host NAME] [--config FILE] [--log-format text|json]\n"
		"                    [--log-level err|warn|note|info|debug] [--metrics HOST:PORT|off]\n"
		"       tessera-node ... --replica ID --ranks LIST [--replica ID --ranks LIST]\n"
		"       tessera-node ... --serve 'REPLICA/RANKS[@LAYOUT] ...'\n"
		"\n"
		"The node agent for ranks of serving replicas: for each, it registers at the\n"
		"tracker, pulls the bytes the rank keeps of every new version from the\n"
		"publisher and from peers, verifies them against the signed manifest,\n"
		"serves them to peers and activates a version once every rank of its\n"
		"replica holds it. One process serves every rank its host holds (all\n"
		"ranks of a replica, several replicas), sharing one tracker client and\n"
		"one fabric endpoint, with a store, expose record and attach socket per\n"
		"rank; a replica activates a version only when all its ranks, in this\n"
		"process or others, hold it.\n"
		"\n"
		"      --tracker URL          the tracker, http://HOST:PORT (https:// for\n"
		"                             a tracker with TLS); URL,URL,...: trackers of\n"
		"                             one chain, the next asked when one is down\n"
		"      --replica ID           the replica this rank belongs to (A, B, ...);\n"
		"                             again for another replica: the --rank and\n"
		"                             --ranks after it are its ranks\n"
		"      --rank R               this rank, 0 .. ranks of the layout - 1;\n"
		"                             again for more ranks of the replica\n"
		"      --ranks LIST           ranks of the replica: R-S or a comma list\n"
		"                             of R and R-S (0-3, 0,2)\n"
		"      --serve LIST           ranks of any replicas: items REPLICA/RANKS\n"
		"                             with an optional @LAYOUT (A/0-3@tp4 B/0@tp1),\n"
		"                             separated by spaces or ';'\n"
		"      --layout L             the replicas' serving layout: a layout file\n"
		"                             or a built-in (tpN, tpN:fp8: FP8)\n"
		"      --model M.json         the model spec JSON the publisher serves\n"
		"                             (`tessera model` writes it)\n"
		"      --trainer-pubkey FILE  verify manifests with this key\n"
		"      --cluster-key FILE     sign tracker requests with this cluster key\n"
		"      --tls-ca FILE          verify an https:// tracker against these PEM\n"
		"                             CA certificates (default: the system's)\n"
		"      --site NAME            the site (data centre, cloud region) this\n"
		"                             host is in: a site's replicas share one copy\n"
		"                             of each version from the publishers and relay\n"
		"                             it among themselves (default: one site)\n"
		"      --provider NAME        libfabric provider (default tcp;ofi_rxm)\n"
		"      --fabric-iface NAME    the network interface the fabric endpoint\n"
		"                             binds (default: the one the route to the\n"
		"                             tracker leaves from; logged at start, at\n"
		"                             the default level)\n"
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
		"                             pins, new-version notifications; with\n"
		"                             several ranks, or when SOCK ends in '/', SOCK\n"
		"                             is a directory and each rank listens on\n"
		"                             SOCK/<replica>-<rank>.sock\n"
		"      --attach-mode MODE     make each attach socket MODE (octal: 0660\n"
		"                             lets its group connect; default: as the\n"
		"                             umask makes it, the node's user only)\n"
		"      --attach-group GROUP   give each attach socket group GROUP (a name\n"
		"                             or a gid the node is a member of), so that\n"
		"                             engines of other users in it can connect\n"
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

static struct node_host *host_g; /* for the signal handler */

static void on_left(void *arg)
{
	event_base_loopexit(arg, NULL);
}

/* The first signal: tell the tracker we leave, then stop; a second one
 * stops at once. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	static bool asked;

	if (host_g == NULL || asked) {
		event_base_loopexit(arg, NULL);
		return;
	}
	asked = true;
	node_host_leave(host_g, on_left, arg);
}

/* The replica/rank options in the order given, and where each came from. */
struct rank_opt {
	int c;           /* 'r' --replica, 'k' --rank, 'R' --ranks, 'S' --serve */
	const char *val;
	bool from_file;
};

/* The ranks the options name. Of each kind (replicas, ranks, serve lists)
 * the command line's replace the file's, as flags override the file. Ranks
 * belong to the --replica before them (those before the first, to the
 * first). 0, or a one-line error. */
static int collect_ranks(const struct rank_opt *ro, size_t n, struct node_host_ranks *l,
			 struct proto_err *err)
{
	enum { K_REPLICA, K_RANK, K_SERVE };
	bool line[3] = {false};
	struct {
		const char *replica;
		char ranks[1024];
	} g[2 * NODE_HOST_RANKS_MAX];
	char pre[1024] = ""; /* ranks before the first --replica */
	size_t ng = 0;
	int rc = 0;

#define KIND(c) ((c) == 'r' ? K_REPLICA : (c) == 'S' ? K_SERVE : K_RANK)
	for (size_t i = 0; i < n; i++)
		line[KIND(ro[i].c)] |= !ro[i].from_file;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (ro[i].from_file && line[KIND(ro[i].c)])
			continue;
		if (ro[i].c == 'S') {
			rc = node_host_ranks_serve(l, ro[i].val, err);
		} else if (ro[i].c == 'r') {
			if (ng == PROTO_ARRAY_LEN(g))
				return proto_errf(err, E2BIG, "too many --replica");
			g[ng].replica = ro[i].val;
			g[ng++].ranks[0] = '\0';
		} else {
			char *to = ng ? g[ng - 1].ranks : pre;
			size_t len = strlen(to);
			if ((size_t)snprintf(to + len, sizeof(pre) - len, "%s%s", len ? "," : "",
					     ro[i].val) >= sizeof(pre) - len)
				return proto_errf(err, E2BIG, "--rank %s: too many ranks", ro[i].val);
		}
	}
#undef KIND
	if (rc != 0)
		return rc;
	if (ng == 0 && pre[0] != '\0')
		return proto_errf(err, EINVAL, "--rank %s: no --replica for it", pre);
	for (size_t i = 0; i < ng && rc == 0; i++) {
		char all[2048];
		snprintf(all, sizeof(all), "%s%s%s", i == 0 ? pre : "",
			 i == 0 && pre[0] && g[i].ranks[0] ? "," : "", g[i].ranks);
		if (all[0] == '\0')
			return proto_errf(err, EINVAL, "--replica %s: no --rank or --ranks for it",
					  g[i].replica);
		rc = node_host_ranks_add(l, g[i].replica, all, NULL, err);
	}
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tracker", required_argument, NULL, 't'},
		{"replica", required_argument, NULL, 'r'},
		{"rank", required_argument, NULL, 'k'},
		{"ranks", required_argument, NULL, 'R'},
		{"serve", required_argument, NULL, 'S'},
		{"layout", required_argument, NULL, 'l'},
		{"model", required_argument, NULL, 'm'},
		{"trainer-pubkey", required_argument, NULL, 'p'},
		{"cluster-key", required_argument, NULL, 'c'},
		{"tls-ca", required_argument, NULL, 'T'},
		{"site", required_argument, NULL, 'W'},
		{"provider", required_argument, NULL, 'P'},
		{"fabric-iface", required_argument, NULL, 'F'},
		{"store", required_argument, NULL, 's'},
		{"expose", required_argument, NULL, 'e'},
		{"attach", required_argument, NULL, 'A'},
		{"attach-mode", required_argument, NULL, 'a'},
		{"attach-group", required_argument, NULL, 'g'},
		{"install", required_argument, NULL, 'I'},
		{"host", required_argument, NULL, 'H'},
		{"metrics", required_argument, NULL, 'M'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0}};
	struct node_agent_opts o = {0};
	struct node_perm attach_perm = {0};
	const char *attach_mode = NULL, *attach_group = NULL;
	struct node_host *host = NULL;
	struct node_host_ranks ranks = {0};
	struct rank_opt ro[2 * NODE_HOST_RANKS_MAX];
	size_t nro = 0;
	struct proto_metrics *metrics = NULL;
	struct node_metrics_http *mhttp = NULL;
	const char *metrics_at = NODE_METRICS_DEFAULT;
	struct event_base *base = NULL;
	struct event *sigint = NULL, *sigterm = NULL;
	struct proto_err err;
	int c, rc = 1, nfile;

	proto_cli_setup();
	proto_log_setup("tessera-node", -1);
	static const struct proto_config_schema schema = {"node", opts, node_host_config_values};
	proto_config_cli("tessera-node", &schema, &argc, &argv);
	nfile = proto_config_file_args();
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 't': o.tracker_url = optarg; break;
		case 'r':
		case 'k':
		case 'R':
		case 'S':
			if (c == 'k' && node_host_rank_parse(optarg, &(uint64_t){0}, &err) != 0) {
				fprintf(stderr, "tessera-node: --rank %s: %s\n", optarg, err.msg);
				return 2;
			}
			if (nro == PROTO_ARRAY_LEN(ro)) {
				fprintf(stderr, "tessera-node: more than %zu --replica, --rank, --ranks and --serve\n",
					PROTO_ARRAY_LEN(ro));
				return 2;
			}
			/* The file's options are argv[1..nfile], one element each. */
			ro[nro++] = (struct rank_opt){c, optarg, optind - 1 <= nfile};
			break;
		case 'l': o.layout = optarg; break;
		case 'm': o.model = optarg; break;
		case 'p': o.trainer_pubkey = optarg; break;
		case 'c': o.cluster_key = optarg; break;
		case 'T': o.tls_ca = optarg; break;
		case 'W':
			if (trk_site_check(optarg, &err) != 0) {
				fprintf(stderr, "tessera-node: --site %s: %s\n", optarg, err.msg);
				return 2;
			}
			o.site = optarg;
			break;
		case 'P': o.provider = optarg; break;
		case 'F': o.fabric_iface = optarg; break;
		case 's': o.store = optarg; break;
		case 'e': o.expose_dir = optarg; break;
		case 'A': o.attach_path = optarg; break;
		case 'a': attach_mode = optarg; break;
		case 'g': attach_group = optarg; break;
		case 'I':
			if (node_host_install_parse(optarg, &o.install_inplace, &err) != 0) {
				fprintf(stderr, "tessera-node: --install %s: %s\n", optarg, err.msg);
				return 2;
			}
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
	bool has_replica = false, has_rank = false;
	for (size_t i = 0; i < nro; i++) {
		has_replica |= ro[i].c == 'r' || ro[i].c == 'S';
		has_rank |= ro[i].c != 'r';
	}
	static const char *const required[] = {"--tracker", "--replica", "--rank", "--model",
					       "--trainer-pubkey"};
	const bool given[] = {o.tracker_url, has_replica, has_rank, o.model, o.trainer_pubkey};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(required); i++)
		if (!given[i])
			return proto_cli_missing("tessera-node", required[i]);
	if ((attach_mode != NULL || attach_group != NULL) && o.attach_path == NULL) {
		fprintf(stderr, "tessera-node: --%s needs --attach\n",
			attach_mode != NULL ? "attach-mode" : "attach-group");
		return 2;
	}
	if (node_perm_parse(attach_mode, attach_group, "--attach-mode", "--attach-group",
			    &attach_perm, &err) != 0) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		return 2;
	}
	if (attach_mode != NULL || attach_group != NULL)
		o.attach_perm = &attach_perm;
	if (collect_ranks(ro, nro, &ranks, &err) != 0) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		node_host_ranks_fini(&ranks);
		return 2;
	}
	for (size_t i = 0; i < ranks.n && o.layout == NULL; i++)
		if (ranks.r[i].layout == NULL) {
			node_host_ranks_fini(&ranks);
			return proto_cli_missing("tessera-node", "--layout");
		}
	/* Values that would fail only once the metrics listener and the fabric
	 * are up: refused now, by the parsers the agent applies later. */
	const struct {
		const char *flag, *v;
		proto_config_check_fn check;
	} early[] = {{"--tracker", o.tracker_url, trk_url_check},
		     {"--layout", o.layout, proto_optval_layout},
		     {"--store", o.store, node_store_name_check}};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(early); i++)
		if (early[i].v != NULL && early[i].check(early[i].v, &err) != 0) {
			fprintf(stderr, "tessera-node: %s %s: %s\n", early[i].flag, early[i].v, err.msg);
			node_host_ranks_fini(&ranks);
			return 2;
		}
	/* Log lines say whom they speak for: "A/0", or every rank served. */
	char ident[128] = "";
	for (size_t i = 0, len = 0; i < ranks.n && len < sizeof(ident); i++)
		len += (size_t)snprintf(ident + len, sizeof(ident) - len, "%s%s/%u", i ? "," : "",
					ranks.r[i].replica, ranks.r[i].rank);
	proto_log_set_identity(ident);
	signal(SIGPIPE, SIG_IGN);
	base = event_base_new();
	if (base == NULL) {
		fprintf(stderr, "tessera-node: cannot create an event loop\n");
		goto out;
	}
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	evsignal_add(sigint, NULL);
	evsignal_add(sigterm, NULL);
	if (strcmp(metrics_at, "off") != 0) {
		metrics = proto_metrics_new();
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
	if (node_host_new(base, &o, &ranks, &host, &err) != 0) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		goto out;
	}
	/* The process is up; each rank's part of /healthz says the rest. */
	proto_metrics_set_health(metrics, true, NULL);
	host_g = host;
	event_base_dispatch(base);
	host_g = NULL;
	if (node_host_failed(host, &err)) {
		fprintf(stderr, "tessera-node: %s\n", err.msg);
		goto out;
	}
	rc = 0;
out:
	node_host_free(host);
	node_host_ranks_fini(&ranks);
	node_metrics_http_free(mhttp);
	proto_metrics_free(metrics);
	if (sigint != NULL)
		event_free(sigint);
	if (sigterm != NULL)
		event_free(sigterm);
	if (base != NULL)
		event_base_free(base);
	return rc;
}
