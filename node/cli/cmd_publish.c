/* `tessera publish`: the trainer-side publisher process (see node/publisher/publisher.h). */
#include <errno.h>
#include <event2/event.h>
#include <getopt.h>
#include <signal.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "node/base/metrics_http.h"
#include "node/publisher/pub_control.h"
#include "node/publisher/pub_metrics.h"
#include "node/publisher/publisher.h"
#include "proto/config.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

static void publish_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera publish --tracker URL --key TRAINER.key [--cluster-key FILE]\n"
		"                       (--synthetic-mb N [--seed S] | --model-dir DIR |\n"
		"                        --trainer MODEL.json --control PATH)\n"
		"                       [--layout T.json|fsdpK|tpK] [--ranks LIST]\n"
		"                       [--provider NAME] [--fabric-iface NAME]\n"
		"                       [--versions V] [--every MS]\n"
		"                       [--anchor-every K]\n"
		"                       [--control PATH] [--config FILE]\n"
		"                       [--tls-ca FILE] [--site NAME]\n"
		"                       [--log-format text|json] [--log-level LEVEL]\n"
		"                       [--metrics HOST:PORT|off]\n"
		"\n"
		"Hosts trainer ranks: for each version it snapshots their shards, plans\n"
		"and gathers the parcels of every serving layout registered at the\n"
		"tracker, hashes and signs the manifest, publishes it and serves the\n"
		"parcels over fabric until the tracker says they are no longer needed.\n"
		"Each line on stdout is one published version.\n"
		"\n"
		"Source of weights (one of):\n"
		"      --synthetic-mb N   the synthetic Llama-shaped BF16 model of N MiB;\n"
		"                         version v is a pure function of (seed, v)\n"
		"      --seed S           its seed (default 1)\n"
		"      --model-dir DIR    one checkpoint per version: DIR/v<N>.safetensors\n"
		"                         (as `tessera synth` writes them) or DIR/v<N>/, a\n"
		"                         Hugging Face directory (model.safetensors, or\n"
		"                         model-0000K-of-0000N.safetensors shards with\n"
		"                         model.safetensors.index.json), taken in numeric\n"
		"                         order of N: the i-th (1-based) is tessera\n"
		"                         version i, so v0 is version 1. A Hugging Face\n"
		"                         directory given as DIR is one version. All\n"
		"                         versions must hold the same tensors.\n"
		"      --trainer MODEL.json  the trainer hands over each version: every\n"
		"                         trainer rank attaches over --control, fills the\n"
		"                         shared buffer it is given and says \"export STEP\"\n"
		"                         (the Python package's tessera.Trainer does it);\n"
		"                         MODEL.json is the model spec (tessera model).\n"
		"                         This process hosts every trainer rank.\n"
		"\n"
		"Ranks:\n"
		"      --layout L         trainer layout: a layout file or a built-in\n"
		"                         (fsdpK: equal dim-0 shares; default fsdp2)\n"
		"      --ranks LIST       trainer ranks this process hosts, e.g. 0,1 or\n"
		"                         0-3 (default: all). The process hosting rank 0\n"
		"                         signs and publishes; the others wait for each\n"
		"                         version, check their parcels against it and\n"
		"                         offer them.\n"
		"      --provider NAME    libfabric provider (default tcp;ofi_rxm; shm on\n"
		"                         one host)\n"
		"      --fabric-iface NAME  the network interface the fabric endpoints\n"
		"                         bind (default: the one the route to the\n"
		"                         tracker leaves from; logged at start, at the\n"
		"                         default level)\n"
		"\n"
		"Triggers (without any: one version, then serve until stopped):\n"
		"      --versions V       publish V versions, each once the previous one\n"
		"                         is accepted (with --every: at most V; 0 = no\n"
		"                         limit)\n"
		"      --every MS         publish one version every MS ms\n"
		"      --anchor-every K   an anchor (full parcels) every K versions, and\n"
		"                         deltas against the previous version between\n"
		"                         them (default TESSERA_ANCHOR_EVERY, 10; 1: no\n"
		"                         deltas). Also an anchor for the first version,\n"
		"                         a new serving layout, a delta over\n"
		"                         TESSERA_DELTA_MAX_PERCENT of the anchor, or a\n"
		"                         node that asked for one\n"
		"      --control PATH     a unix stream socket taking lines: \"export\"\n"
		"                         exports the next version and answers\n"
		"                         \"published <v> <created_ms> <kind> <wire_bytes>\n"
		"                         <anchor_bytes> <encode_us>\" once the tracker\n"
		"                         accepted it and it is offered (or \"error <why>\");\n"
		"                         \"status\" says what this connection's export\n"
		"                         waits for; \"quit\" exits; trainer ranks attach\n"
		"                         there too\n"
		"\n"
		"After a restart, numbering continues after the tracker's latest version,\n"
		"which is rebuilt and offered again if its chunk hashes still match.\n"
		"\n"
		"      --tracker URL      http://HOST:PORT (https:// with TLS); URL,URL,...:\n"
		"                         trackers of one chain, the next asked when one\n"
		"                         is down\n"
		"      --tls-ca FILE      verify an https:// tracker against these PEM CA\n"
		"                         certificates (default: the system's)\n"
		"      --site NAME        the site (data centre, cloud region) the trainer\n"
		"                         is in (default: one site); each site's replicas\n"
		"                         read one copy of a version from it\n"
		"      --key FILE         trainer secret key (tessera keygen)\n"
		"      --cluster-key FILE sign tracker requests with this cluster key\n"
		"      --config FILE      the [publish] section gives options (flags\n"
		"                         override it), [params] tunables, [log] settings\n"
		"      --log-format F     text or json, one line per event\n"
		"      --log-level L      err, warn, note (default), info or debug\n"
		"      --metrics HOST:PORT serve /metrics and /healthz there (default off;\n"
		"                         port 0 picks one, logged at info)\n"
		"  -h, --help             this text\n");
}

struct app;

struct app {
	struct event_base *base;
	struct node_pub *pub;
	int exit_code;
	uint64_t versions; /* limit; 0: none */
	bool have_versions, every;
	uint64_t done;
	struct event *every_ev;
	uint64_t failed_v, failed_tries; /* --every: the version failing, tries so far */
	const char *control;
	struct node_pub_control *ctl;
	struct node_pub_metrics pm;
};

/* A published version's line: every phase from the request to the offer,
 * adding up to the total, and the delta tried (kept or discarded, and
 * why) beside its encode's. */
static void print_phases(const struct node_pub_result *r, const char *size)
{
	const struct trk_publish_report *rep = r->report;

	printf("published v%llu %s %s in %llu ms (", (unsigned long long)r->version,
	       r->delta ? "delta" : "anchor", size, (unsigned long long)rep->total_ms);
	for (uint32_t i = 0; i < rep->nphases; i++) {
		printf("%s%s %llu ms", i ? ", " : "", rep->phases[i].name,
		       (unsigned long long)rep->phases[i].ms);
		if (rep->delta_tried && strcmp(rep->phases[i].name, "delta encode") == 0)
			printf(": %s%s, %s", rep->delta_kept ? "kept" : "discarded",
			       rep->delta_stopped_early ? " (stopped early)" : "", rep->delta_why);
	}
	printf("; %llu page faults)\n", (unsigned long long)r->faults);
	fflush(stdout);
}

static void print_result(const struct node_pub_result *r)
{
	double mib = (double)r->wire_bytes / (1024.0 * 1024.0);
	char size[64], wait[128] = "";

	if (r->wire_bytes % (1024 * 1024) == 0)
		snprintf(size, sizeof(size), "%.0f MiB", mib);
	else
		snprintf(size, sizeof(size), "%.1f MiB", mib);
	if (r->wait_ns > r->snapshot_ns + 50000000ull)
		snprintf(wait, sizeof(wait), ", waited %llu ms for %s",
			 (unsigned long long)(r->wait_ns / 1000000),
			 r->leader ? "a serving layout" : "the manifest");
	if (r->delta)
		snprintf(wait + strlen(wait), sizeof(wait) - strlen(wait), ", encode %llu ms",
			 (unsigned long long)(r->encode_ns / 1000000));
	snprintf(wait + strlen(wait), sizeof(wait) - strlen(wait), ", %llu page faults",
		 (unsigned long long)r->faults);
	if (r->report != NULL) {
		print_phases(r, size);
		return;
	}
	printf("%s v%llu %s %s in %llu ms (snapshot %llu ms, gather+hash %llu ms%s)\n",
	       r->leader ? "published" : "offered", (unsigned long long)r->version,
	       r->delta ? "delta" : "anchor", size,
	       (unsigned long long)(r->total_ns / 1000000),
	       (unsigned long long)(r->snapshot_ns / 1000000),
	       (unsigned long long)(r->hash_ns / 1000000), wait);
	fflush(stdout);
}

/* ---- triggers ---------------------------------------------------------------- */

static void on_trigger_done(void *arg, const struct node_pub_result *r);

static void trigger(struct app *a)
{
	int rc = node_pub_export(a->pub, on_trigger_done, a);

	if (rc != 0) {
		fprintf(stderr, "tessera publish: cannot queue an export: %s\n", strerror(-rc));
		a->exit_code = 1;
		event_base_loopexit(a->base, NULL);
	}
}

static void on_trigger_done(void *arg, const struct node_pub_result *r)
{
	struct app *a = arg;

	node_pub_metrics_result(&a->pm, r);
	if (r->status == -ERANGE && a->every) {
		/* The source has no more versions (a model dir's last file is
		 * out): asking again every tick would only repeat this. */
		fprintf(stderr, "tessera publish: version %llu: %s; --every stops here, the versions "
			"published stay served until the publisher is stopped\n",
			(unsigned long long)r->version, r->error);
		event_del(a->every_ev);
		return;
	}
	if (r->status != 0 && !a->every) { /* --versions: the caller wants to know */
		fprintf(stderr, "tessera publish: version %llu: %s\n",
			(unsigned long long)r->version, r->error);
		a->exit_code = 1;
		event_base_loopexit(a->base, NULL);
		return;
	}
	if (r->status != 0) {
		/* --every asks for the same version each tick (a checkpoint
		 * being rewritten may be whole again): said at the first try,
		 * then at tries 2, 4, 8, ... */
		a->failed_tries = a->failed_v == r->version ? a->failed_tries + 1 : 1;
		a->failed_v = r->version;
		if ((a->failed_tries & (a->failed_tries - 1)) == 0)
			fprintf(stderr, "tessera publish: version %llu: %s (try %llu; --every tries "
				"again each tick)\n", (unsigned long long)r->version, r->error,
				(unsigned long long)a->failed_tries);
		return;
	}
	if (a->failed_v == r->version)
		fprintf(stderr, "tessera publish: version %llu went out after %llu failed tries\n",
			(unsigned long long)r->version, (unsigned long long)a->failed_tries);
	a->failed_v = a->failed_tries = 0;
	print_result(r);
	a->done++;
	if (!a->every && a->done < a->versions)
		trigger(a);
}

static void on_every(evutil_socket_t fd, short what, void *arg)
{
	struct app *a = arg;

	if (a->versions > 0 && a->done >= a->versions) {
		event_del(a->every_ev);
		return;
	}
	if (node_pub_pending(a->pub) > 0) {
		LOG_INFO("--every: the previous export is still running; tick skipped");
		return;
	}
	trigger(a);
}

/* ---- the control socket (node/publisher/pub_control.c) ------------------------------ */

static void on_control_result(void *arg, const struct node_pub_result *r)
{
	struct app *a = arg;

	node_pub_metrics_result(&a->pm, r);
	if (r->status == 0)
		print_result(r);
	else
		fprintf(stderr, "tessera publish: version %llu: %s\n", (unsigned long long)r->version,
			r->error);
}

static void on_control_quit(void *arg)
{
	struct app *a = arg;

	event_base_loopexit(a->base, NULL);
}

/* ---- main ----------------------------------------------------------------------- */

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct app *a = arg;

	LOG_INFO("signal %d: stopping", (int)sig);
	event_base_loopexit(a->base, NULL);
}

static void on_fatal(void *arg, const char *msg)
{
	struct app *a = arg;

	fprintf(stderr, "tessera publish: %s\n", msg);
	a->exit_code = 1;
	event_base_loopexit(a->base, NULL);
}

/* "0,2,4-7" -> ranks (malloc'ed). */
static int parse_ranks(const char *s, uint32_t **out, size_t *n)
{
	uint32_t *r = NULL;
	size_t cnt = 0, cap = 0;
	uint64_t lo, hi;
	int more;

	*out = NULL;
	*n = 0;
	while ((more = proto_ranks_next(&s, PROTO_MAX_RANKS - 1, &lo, &hi)) == 1) {
		for (uint64_t v = lo; v <= hi; v++) {
			if (cnt == cap) {
				size_t nc = cap ? 2 * cap : 8;
				uint32_t *nr;
				if (nc > PROTO_MAX_RANKS || (nr = realloc(r, nc * sizeof(*nr))) == NULL)
					goto bad;
				r = nr;
				cap = nc;
			}
			r[cnt++] = (uint32_t)v;
		}
	}
	if (more < 0 || cnt == 0)
		goto bad;
	*out = r;
	*n = cnt;
	return 0;
bad:
	free(r);
	return -EINVAL;
}

/* The parsers of the numbers publish takes, each used by its flag and by
 * its configuration key (node_publish_config_values below). */
static int versions_parse(const char *s, uint64_t *v)
{
	return proto_parse_u64(s, 0, 1000000000, v);
}

static int every_parse(const char *s, uint64_t *v)
{
	return proto_parse_u64(s, 1, 86400000, v);
}

static int anchor_every_parse(const char *s, uint64_t *v)
{
	return proto_parse_u64(s, 1, UINT32_MAX, v);
}

static int ranks_check(const char *s, struct proto_err *err)
{
	uint32_t *r;
	size_t n;

	if (parse_ranks(s, &r, &n) != 0)
		return proto_errf(err, EINVAL, "want a list like 0,1 or 0-3 (ranks below %d)",
				  PROTO_MAX_RANKS);
	free(r);
	return 0;
}

static int synthetic_mb_check(const char *s, struct proto_err *err)
{
	uint64_t b;

	return proto_cli_parse_mib(s, &b) == 0 ? 0 : proto_errf(err, EINVAL, "want a positive size, MiB");
}

static int versions_check(const char *s, struct proto_err *err)
{
	uint64_t v;

	return versions_parse(s, &v) == 0 ? 0 : proto_errf(err, EINVAL, "want 0..1e9");
}

static int every_check(const char *s, struct proto_err *err)
{
	uint64_t v;

	return every_parse(s, &v) == 0 ? 0 : proto_errf(err, EINVAL, "want 1..86400000 ms");
}

static int anchor_every_check(const char *s, struct proto_err *err)
{
	uint64_t v;

	return anchor_every_parse(s, &v) == 0 ? 0 : proto_errf(err, EINVAL, "want 1..%u", UINT32_MAX);
}

const struct proto_config_value node_publish_config_values[] = {
	{"tracker", trk_url_check},
	{"key", proto_optval_secret_key},
	{"cluster-key", proto_optval_cluster_key},
	{"synthetic-mb", synthetic_mb_check},
	{"seed", proto_optval_u64},
	{"model-dir", proto_optval_dir},
	{"layout", proto_optval_layout},
	{"ranks", ranks_check},
	{"versions", versions_check},
	{"every", every_check},
	{"anchor-every", anchor_every_check},
	{"metrics", node_metrics_addr_check},
	{"tls-ca", proto_optval_file},
	{"site", trk_site_check},
	{NULL, NULL},
};

int node_cmd_publish(int argc, char **argv)
{
	static const struct option opts[] = {
		{"tracker", required_argument, NULL, 't'},
		{"key", required_argument, NULL, 'k'},
		{"cluster-key", required_argument, NULL, 'C'},
		{"synthetic-mb", required_argument, NULL, 'm'},
		{"seed", required_argument, NULL, 'S'},
		{"model-dir", required_argument, NULL, 'd'},
		{"layout", required_argument, NULL, 'l'},
		{"ranks", required_argument, NULL, 'r'},
		{"provider", required_argument, NULL, 'p'},
		{"fabric-iface", required_argument, NULL, 'i'},
		{"versions", required_argument, NULL, 'V'},
		{"every", required_argument, NULL, 'e'},
		{"anchor-every", required_argument, NULL, 'A'},
		{"control", required_argument, NULL, 'c'},
		{"trainer", required_argument, NULL, 'T'},
		{"metrics", required_argument, NULL, 'M'},
		{"tls-ca", required_argument, NULL, 'a'},
		{"site", required_argument, NULL, 'W'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct node_pub_opts po = {.seed = 1};
	struct app a = {.exit_code = 0};
	const char *key = NULL, *ckey = NULL;
	uint8_t sk[PROTO_SK_BYTES], ck[PROTO_CLUSTER_KEY_BYTES];
	uint32_t *ranks = NULL;
	uint64_t every_ms = 0;
	struct proto_err err = {{0}};
	struct event *sigint = NULL, *sigterm = NULL;
	const char *metrics_at = "off";
	struct proto_metrics *metrics = NULL;
	struct node_metrics_http *mhttp = NULL;
	int c, rc = 2;

	proto_log_setup("tessera-publish", -1);
	static const struct proto_config_schema schema = {"publish", opts,
							   node_publish_config_values};
	proto_config_cli("tessera publish", &schema, &argc, &argv);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			po.tracker_url = optarg;
			break;
		case 'k':
			key = optarg;
			break;
		case 'C':
			ckey = optarg;
			break;
		case 'a':
			po.tls_ca = optarg;
			break;
		case 'W':
			if (trk_site_check(optarg, &err) != 0) {
				fprintf(stderr, "tessera publish: --site %s: %s\n", optarg, err.msg);
				goto out;
			}
			po.site = optarg;
			break;
		case 'm':
			if (proto_cli_parse_mib(optarg, &po.synthetic_bytes) != 0) {
				fprintf(stderr, "tessera publish: --synthetic-mb wants a positive size, not '%s'\n",
					optarg);
				goto out;
			}
			break;
		case 'S':
			if (proto_parse_u64(optarg, 0, UINT64_MAX, &po.seed) != 0) {
				fprintf(stderr, "tessera publish: --seed wants a number, not '%s'\n", optarg);
				goto out;
			}
			break;
		case 'd':
			po.model_dir = optarg;
			break;
		case 'l':
			po.layout = optarg;
			break;
		case 'r':
			free(ranks);
			if (parse_ranks(optarg, &ranks, &po.nranks) != 0) {
				ranks = NULL;
				fprintf(stderr, "tessera publish: --ranks wants a list like 0,1 or 0-3, not '%s'\n",
					optarg);
				goto out;
			}
			po.ranks = ranks;
			proto_log_set_identity(optarg);
			break;
		case 'p':
			po.provider = optarg;
			break;
		case 'i':
			po.fabric_iface = optarg;
			break;
		case 'V':
			if (versions_parse(optarg, &a.versions) != 0) {
				fprintf(stderr, "tessera publish: --versions wants 0..1e9, not '%s'\n", optarg);
				goto out;
			}
			a.have_versions = true;
			break;
		case 'e':
			if (every_parse(optarg, &every_ms) != 0) {
				fprintf(stderr, "tessera publish: --every wants 1..86400000 ms, not '%s'\n",
					optarg);
				goto out;
			}
			a.every = true;
			po.every_ms = every_ms;
			break;
		case 'c':
			a.control = optarg;
			break;
		case 'T':
			po.trainer_model = optarg;
			break;
		case 'M':
			metrics_at = optarg;
			break;
		case 'A': {
			uint64_t k;
			if (anchor_every_parse(optarg, &k) != 0) {
				fprintf(stderr, "tessera publish: --anchor-every wants 1..%u, not '%s'\n",
					UINT32_MAX, optarg);
				rc = 2;
				goto out;
			}
			po.anchor_every = (uint32_t)k;
			break;
		}
		case 'h':
			publish_usage(stdout);
			rc = 0;
			goto out;
		default:
			rc = proto_cli_bad_option("tessera publish", c, argv);
			goto out;
		}
	}
	if (optind < argc) {
		rc = proto_cli_extra("tessera publish", argv[optind]);
		goto out;
	}
	if (po.tracker_url == NULL || key == NULL) {
		rc = proto_cli_missing("tessera publish", po.tracker_url == NULL ? "--tracker URL" : "--key FILE");
		goto out;
	}
	if ((po.synthetic_bytes > 0) + (po.model_dir != NULL) + (po.trainer_model != NULL) != 1) {
		fprintf(stderr, "tessera publish: give exactly one of --synthetic-mb N, --model-dir DIR and --trainer MODEL.json (see --help)\n");
		goto out;
	}
	if (po.trainer_model != NULL && (a.control == NULL || a.have_versions || a.every)) {
		fprintf(stderr, "tessera publish: --trainer takes its versions from trainer ranks over --control PATH (and not --versions or --every)\n");
		goto out;
	}
	if (!a.have_versions && !a.every && a.control == NULL) {
		a.versions = 1; /* no trigger: one version */
		a.have_versions = true;
	}

	rc = 1;
	if (proto_key_load_secret(key, sk, &err) != 0 ||
	    (ckey != NULL && proto_key_load_cluster(ckey, ck, &err) != 0)) {
		fprintf(stderr, "tessera publish: %s\n", err.msg);
		goto out;
	}
	po.sk = sk;
	po.cluster_key = ckey ? ck : NULL;
	po.on_fatal = on_fatal;
	po.arg = &a;
	signal(SIGPIPE, SIG_IGN);
	a.base = event_base_new();
	if (a.base == NULL) {
		fprintf(stderr, "tessera publish: event_base_new failed\n");
		goto out;
	}
	if (node_pub_new(a.base, &po, &a.pub, &err) != 0) {
		fprintf(stderr, "tessera publish: %s\n", err.msg);
		goto out;
	}
	if (a.control != NULL) {
		struct node_pub_control_ops ops = {on_control_result, on_control_quit, &a};
		if (node_pub_control_new(a.base, a.control, a.pub, &ops, &a.ctl, &err) != 0) {
			fprintf(stderr, "tessera publish: %s\n", err.msg);
			goto out;
		}
	}
	if (strcmp(metrics_at, "off") != 0) {
		metrics = proto_metrics_new();
		if (metrics == NULL || node_pub_metrics_init(&a.pm, metrics, a.base, a.pub) != 0) {
			fprintf(stderr, "tessera publish: metrics: out of memory\n");
			goto out;
		}
		if (node_metrics_http_new(a.base, metrics_at, metrics, &mhttp, &err) != 0) {
			fprintf(stderr, "tessera publish: %s\n", err.msg);
			goto out;
		}
		LOG_INFO("metrics on %s", node_metrics_http_url(mhttp));
	}
	sigint = evsignal_new(a.base, SIGINT, on_signal, &a);
	sigterm = evsignal_new(a.base, SIGTERM, on_signal, &a);
	if (sigint == NULL || sigterm == NULL || evsignal_add(sigint, NULL) != 0 ||
	    evsignal_add(sigterm, NULL) != 0) {
		fprintf(stderr, "tessera publish: cannot catch signals\n");
		goto out;
	}
	if (a.every) {
		struct timeval tv = {(time_t)(every_ms / 1000), (suseconds_t)(every_ms % 1000) * 1000};
		a.every_ev = event_new(a.base, -1, EV_PERSIST, on_every, &a);
		if (a.every_ev == NULL || event_add(a.every_ev, &tv) != 0) {
			fprintf(stderr, "tessera publish: out of memory\n");
			goto out;
		}
	} else if (a.versions > 0) {
		trigger(&a);
	}
	event_base_dispatch(a.base);
	rc = a.exit_code;
out:
	/* Reverse order: triggers, control, publisher, loop. */
	if (a.every_ev != NULL)
		event_free(a.every_ev);
	if (sigterm != NULL)
		event_free(sigterm);
	if (sigint != NULL)
		event_free(sigint);
	node_metrics_http_free(mhttp);
	node_pub_metrics_fini(&a.pm);
	proto_metrics_free(metrics);
	node_pub_free(a.pub); /* drops queued exports: no callback after this */
	node_pub_control_free(a.ctl);
	if (a.base != NULL)
		event_base_free(a.base);
	free(ranks);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(ck, sizeof(ck));
	return rc;
}
