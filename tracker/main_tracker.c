/* `tessera-tracker`: runs the tracker until SIGTERM or SIGINT. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "proto/config.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera-tracker --listen HOST:PORT (--state DIR | --store URL)\n"
		"                       [--cluster-key FILE] [--trainer-pubkey FILE]\n"
		"                       [--tls-cert FILE --tls-key FILE]\n"
		"                       [--etcd-ca FILE] [--etcd-cert FILE --etcd-key FILE]\n"
		"                       [--leader-ttl SECONDS]\n"
		"                       [--config FILE] [--log-format text|json]\n"
		"                       [--log-level err|warn|note|info|debug]\n"
		"\n"
		"The versioned registry of a tessera cluster. Prints\n"
		"`listening on http://HOST:PORT` first (https:// with TLS; port 0\n"
		"picks a free one).\n"
		"\n"
		"  -l, --listen HOST:PORT      address to serve HTTP on\n"
		"  -s, --state DIR             durable version log (created if missing);\n"
		"                              with --store, only the store's cluster id\n"
		"                              is remembered there (and checked)\n"
		"      --store URL             keep the durable state in etcd instead:\n"
		"                              etcd://HOST:PORT[,HOST:PORT...][/NAME]\n"
		"                              (etcds:// for TLS); the trackers of one\n"
		"                              store elect a leader, the others stand by\n"
		"      --etcd-ca FILE          etcds://: the CA of etcd's certificates\n"
		"      --etcd-cert FILE        etcds://: a client certificate (PEM), with\n"
		"      --etcd-key FILE         its key\n"
		"      --leader-ttl SECONDS    the leader's lease in etcd: a standby takes\n"
		"                              over within about one (default 5)\n"
		"  -k, --cluster-key FILE      authenticate POSTs with this key\n"
		"                              (without it, POSTs are open)\n"
		"  -p, --trainer-pubkey FILE   verify manifests with this key (without\n"
		"                              it, the first version's signer is pinned)\n"
		"      --tls-cert FILE         serve HTTPS only, presenting this PEM\n"
		"                              certificate (chain); with --tls-key\n"
		"      --tls-key FILE          the certificate's PEM private key\n"
		"      --config FILE           the [tracker] section gives options (flags\n"
		"                              override it), [params] tunables, [log]\n"
		"                              level and format\n"
		"      --log-format text|json  one line per event, as text or JSON\n"
		"      --log-level L           err, warn (default), info or debug\n"
		"  -h, --help                  this text\n"
		"      --version               print the release and exit\n"
		"\n"
		"API: tracker/API.md. Status page: GET /, metrics: GET /metrics.\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	LOG_INFO("signal %d: shutting down", (int)sig);
	event_base_loopbreak(arg);
}

/* The event loop. Every request is a connection whose read and write
 * interest evhttp turns on and off several times within one loop turn:
 * with the epoll changelist, each socket's changes reach the kernel once
 * per turn (one epoll_ctl instead of several). The tracker never dup()s a
 * socket, the case the changelist gets wrong. Held watches are served at
 * the lowest of the priorities trk_server_new sets up (2): libevent runs a
 * priority's whole queue of ready events in one go, and a thousand watch
 * answers written in one go held the requests that came meanwhile for tens
 * of ms; at most 32 of them now run before the loop looks for new ones. */
static struct event_base *tracker_base(void)
{
	struct event_config *cfg = event_config_new();
	struct event_base *base;

	if (cfg == NULL)
		return NULL;
	event_config_set_flag(cfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
	event_config_set_max_dispatch_interval(cfg, NULL, 32, 2);
	base = event_base_new_with_config(cfg);
	event_config_free(cfg);
	return base;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"listen", required_argument, NULL, 'l'},
		{"state", required_argument, NULL, 's'},
		{"cluster-key", required_argument, NULL, 'k'},
		{"trainer-pubkey", required_argument, NULL, 'p'},
		{"tls-cert", required_argument, NULL, 'C'},
		{"tls-key", required_argument, NULL, 'K'},
		{"store", required_argument, NULL, 'S'},
		{"etcd-ca", required_argument, NULL, 'A'},
		{"etcd-cert", required_argument, NULL, 'E'},
		{"etcd-key", required_argument, NULL, 'Y'},
		{"leader-ttl", required_argument, NULL, 'T'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	const char *listen = NULL, *state = NULL, *ckey = NULL, *pkey = NULL;
	const char *tls_cert = NULL, *tls_key = NULL, *store = NULL;
	const char *etcd_ca = NULL, *etcd_cert = NULL, *etcd_key = NULL, *ttl = NULL;
	uint8_t cluster[PROTO_CLUSTER_KEY_BYTES], pk[PROTO_PK_BYTES];
	struct trk_server_opts o = {0};
	struct proto_err err = {{0}};
	struct event_base *base = NULL;
	struct event *sigterm = NULL, *sigint = NULL;
	struct trk_server *s = NULL;
	int c, rc = 1;

	proto_cli_setup();
	proto_log_setup("tracker", -1);
	static const struct proto_config_schema schema = {"tracker", opts, trk_config_values};
	proto_config_cli("tessera-tracker", &schema, &argc, &argv);
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":l:s:k:p:h", opts, NULL)) != -1) {
		switch (c) {
		case 'l': listen = optarg; break;
		case 's': state = optarg; break;
		case 'k': ckey = optarg; break;
		case 'p': pkey = optarg; break;
		case 'C': tls_cert = optarg; break;
		case 'K': tls_key = optarg; break;
		case 'S': store = optarg; break;
		case 'A': etcd_ca = optarg; break;
		case 'E': etcd_cert = optarg; break;
		case 'Y': etcd_key = optarg; break;
		case 'T': ttl = optarg; break;
		case 'h': usage(stdout); return 0;
		case 'V': proto_cli_version("tessera-tracker"); return 0;
		default: return proto_cli_bad_option("tessera-tracker", c, argv);
		}
	}
	if (optind != argc)
		return proto_cli_extra("tessera-tracker", argv[optind]);
	if (listen == NULL)
		return proto_cli_missing("tessera-tracker", "--listen");
	if (state == NULL && store == NULL)
		return proto_cli_missing("tessera-tracker", "--state (or --store)");
	if (ttl != NULL && trk_leader_ttl_check(ttl, &err) != 0) {
		fprintf(stderr, "tessera-tracker: --leader-ttl %s: %s\n", ttl, err.msg);
		return 2;
	}
	if (store == NULL && (etcd_ca || etcd_cert || etcd_key || ttl)) {
		fprintf(stderr, "tessera-tracker: --etcd-ca, --etcd-cert, --etcd-key and "
			"--leader-ttl go with --store\n");
		return 2;
	}
	if ((tls_cert == NULL) != (tls_key == NULL)) {
		fprintf(stderr, "tessera-tracker: --tls-cert and --tls-key go together\n");
		return 2;
	}
	if (ckey != NULL && proto_key_load_cluster(ckey, cluster, &err) != 0) {
		fprintf(stderr, "tessera-tracker: %s\n", err.msg);
		return 1;
	}
	if (pkey != NULL && proto_key_load_public(pkey, pk, &err) != 0) {
		fprintf(stderr, "tessera-tracker: %s\n", err.msg);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	proto_log_set_identity(listen);
	o.listen = listen;
	o.state_dir = state;
	o.cluster_key = ckey ? cluster : NULL;
	o.trainer_pk = pkey ? pk : NULL;
	o.tls_cert = tls_cert;
	o.tls_key = tls_key;
	o.store = store;
	o.etcd_ca = etcd_ca;
	o.etcd_cert = etcd_cert;
	o.etcd_key = etcd_key;
	o.leader_ttl_s = ttl != NULL ? (unsigned)strtoul(ttl, NULL, 10) : 0;
	base = tracker_base();
	if (base == NULL) {
		fprintf(stderr, "tessera-tracker: event_base_new failed\n");
		goto out;
	}
	if (trk_server_new(base, &o, &s, &err) != 0) {
		fprintf(stderr, "tessera-tracker: %s\n", err.msg);
		goto out;
	}
	sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	sigint = evsignal_new(base, SIGINT, on_signal, base);
	if (sigterm == NULL || sigint == NULL || evsignal_add(sigterm, NULL) != 0 ||
	    evsignal_add(sigint, NULL) != 0) {
		fprintf(stderr, "tessera-tracker: cannot handle signals\n");
		goto out;
	}
	printf("listening on %s\n", trk_server_url(s));
	fflush(stdout);
	rc = event_base_dispatch(base) < 0 ? 1 : trk_server_exit_code(s);
out:
	if (sigterm != NULL)
		event_free(sigterm);
	if (sigint != NULL)
		event_free(sigint);
	trk_server_free(s);
	if (base != NULL)
		event_base_free(base);
	memset(cluster, 0, sizeof(cluster));
	return rc;
}
