/* `tessera publish`: the trainer-side publisher process (see node/publisher.h). */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <getopt.h>
#include <signal.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/cmd.h"
#include "node/metrics_http.h"
#include "node/pub_metrics.h"
#include "node/publisher.h"
#include "proto/config.h"
#include "proto/proto.h"

#define CTL_LINE_MAX 256 /* longest control command, bytes */

static void publish_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera publish --tracker URL --key TRAINER.key [--cluster-key FILE]\n"
		"                       (--synthetic-mb N [--seed S] | --model-dir DIR)\n"
		"                       [--layout T.json|fsdpK|tpK] [--ranks LIST]\n"
		"                       [--provider NAME] [--versions V] [--every MS]\n"
		"                       [--anchor-every K]\n"
		"                       [--control PATH] [--config FILE]\n"
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
		"                         \"quit\" exits\n"
		"\n"
		"After a restart, numbering continues after the tracker's latest version,\n"
		"which is rebuilt and offered again if its chunk hashes still match.\n"
		"\n"
		"      --tracker URL      http://HOST:PORT\n"
		"      --key FILE         trainer secret key (tessera keygen)\n"
		"      --cluster-key FILE sign tracker requests with this cluster key\n"
		"      --config FILE      the [publish] section gives options (flags\n"
		"                         override it), [params] tunables, [log] settings\n"
		"      --log-format F     text or json, one line per event\n"
		"      --log-level L      err, warn (default), info or debug\n"
		"      --metrics HOST:PORT serve /metrics and /healthz there (default off;\n"
		"                         port 0 picks one, logged at info)\n"
		"  -h, --help             this text\n");
}

struct app;

/* One control connection. It outlives its socket while exports it asked for
 * are still running, so that their answers have somewhere to go. */
struct ctl_client {
	struct app *app;
	struct bufferevent *bev; /* NULL once the peer went away */
	unsigned pending;
	bool closing; /* close once the output is flushed */
	struct ctl_client *next;
};

struct app {
	struct event_base *base;
	struct node_pub *pub;
	int exit_code;
	uint64_t versions; /* limit; 0: none */
	bool have_versions, every;
	uint64_t done;
	struct event *every_ev;
	struct evconnlistener *lis;
	const char *control;
	bool control_bound;
	struct ctl_client *clients;
	struct node_pub_metrics pm;
};

static void print_result(const struct node_pub_result *r)
{
	double mib = (double)r->wire_bytes / (1024.0 * 1024.0);
	char size[64], wait[64] = "";

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
	if (r->status != 0) {
		fprintf(stderr, "tessera publish: version %llu: %s\n",
			(unsigned long long)r->version, r->error);
		if (!a->every) { /* --versions: the caller wants to know */
			a->exit_code = 1;
			event_base_loopexit(a->base, NULL);
		}
		return;
	}
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

/* ---- the control socket ----------------------------------------------------------- */

static void client_free(struct ctl_client *c)
{
	struct app *a = c->app;

	for (struct ctl_client **pp = &a->clients; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	if (c->bev != NULL)
		bufferevent_free(c->bev);
	free(c);
}

/* The peer is gone (or we are done with it): drop the socket, keep the
 * struct while answers are owed. */
static void client_gone(struct ctl_client *c)
{
	if (c->bev != NULL) {
		bufferevent_free(c->bev);
		c->bev = NULL;
	}
	if (c->pending == 0)
		client_free(c);
}

static void client_say(struct ctl_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void client_say(struct ctl_client *c, const char *fmt, ...)
{
	char line[600];
	va_list ap;
	int n;

	if (c->bev == NULL)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	n = PROTO_MIN(n, (int)sizeof(line) - 2);
	for (int i = 0; i < n; i++)
		if (line[i] == '\n' || line[i] == '\r')
			line[i] = ' ';
	line[n++] = '\n';
	bufferevent_write(c->bev, line, (size_t)n);
}

static void on_ctl_done(void *arg, const struct node_pub_result *r)
{
	struct ctl_client *c = arg;

	c->pending--;
	node_pub_metrics_result(&c->app->pm, r);
	if (r->status == 0) {
		print_result(r);
		client_say(c, "published %llu %llu %s %llu %llu %llu", (unsigned long long)r->version,
			   (unsigned long long)r->created_ms, r->delta ? "delta" : "anchor",
			   (unsigned long long)r->wire_bytes, (unsigned long long)r->anchor_bytes,
			   (unsigned long long)(r->encode_ns / 1000));
	} else {
		fprintf(stderr, "tessera publish: version %llu: %s\n",
			(unsigned long long)r->version, r->error);
		client_say(c, "error version %llu: %s", (unsigned long long)r->version, r->error);
	}
	if (c->bev == NULL && c->pending == 0)
		client_free(c);
}

static void ctl_command(struct ctl_client *c, char *line)
{
	struct app *a = c->app;
	char *s = line, *e;
	int rc;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
		*--e = 0;
	if (*s == 0)
		return;
	if (strcmp(s, "export") == 0) {
		rc = node_pub_export(a->pub, on_ctl_done, c);
		if (rc != 0)
			client_say(c, "error cannot queue an export: %s", strerror(-rc));
		else
			c->pending++;
	} else if (strcmp(s, "quit") == 0) {
		LOG_INFO("control: quit");
		event_base_loopexit(a->base, NULL);
	} else {
		client_say(c, "error unknown command '%.64s' (want export or quit)", s);
	}
}

static void on_ctl_write(struct bufferevent *bev, void *arg)
{
	struct ctl_client *c = arg;

	if (c->closing)
		client_gone(c);
}

static void on_ctl_read(struct bufferevent *bev, void *arg)
{
	struct ctl_client *c = arg;
	struct evbuffer *in = bufferevent_get_input(bev);
	char *line;
	size_t n;

	while (!c->closing && (line = evbuffer_readln(in, &n, EVBUFFER_EOL_LF)) != NULL) {
		if (n > CTL_LINE_MAX)
			client_say(c, "error line too long (at most %d bytes)", CTL_LINE_MAX);
		else
			ctl_command(c, line);
		free(line);
	}
	if (!c->closing && evbuffer_get_length(in) > CTL_LINE_MAX) {
		client_say(c, "error line too long (at most %d bytes)", CTL_LINE_MAX);
		c->closing = true;
		bufferevent_disable(bev, EV_READ);
	}
}

static void on_ctl_event(struct bufferevent *bev, short what, void *arg)
{
	struct ctl_client *c = arg;

	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR))
		client_gone(c);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	struct app *a = arg;
	struct ctl_client *c = calloc(1, sizeof(*c));

	if (c == NULL || (c->bev = bufferevent_socket_new(a->base, fd, BEV_OPT_CLOSE_ON_FREE)) == NULL) {
		LOG_WARN("control: out of memory; connection refused");
		free(c);
		evutil_closesocket(fd);
		return;
	}
	c->app = a;
	c->next = a->clients;
	a->clients = c;
	bufferevent_setcb(c->bev, on_ctl_read, on_ctl_write, on_ctl_event, c);
	bufferevent_enable(c->bev, EV_READ | EV_WRITE);
}

static int control_open(struct app *a, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	evutil_socket_t fd;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "tessera publish: --control %s: path too long (at most %zu bytes)\n",
			path, sizeof(sa.sun_path) - 1);
		return -ENAMETOOLONG;
	}
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			fprintf(stderr, "tessera publish: --control %s: exists and is not a socket\n",
				path);
			return -EEXIST;
		}
		unlink(path); /* a stale socket of an earlier run */
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = errno;
		fprintf(stderr, "tessera publish: --control %s: %s\n", path, strerror(e));
		if (fd >= 0)
			close(fd);
		return -e;
	}
	a->control_bound = true;
	chmod(path, 0600); /* whoever can connect can export and stop us */
	evutil_make_socket_nonblocking(fd);
	a->lis = evconnlistener_new(a->base, on_accept, a, LEV_OPT_CLOSE_ON_FREE, 16, fd);
	if (a->lis == NULL) {
		fprintf(stderr, "tessera publish: --control %s: cannot listen\n", path);
		close(fd);
		return -EIO;
	}
	return 0;
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
	char buf[32];

	*out = NULL;
	*n = 0;
	while (*s) {
		const char *comma = strchr(s, ',');
		size_t len = comma ? (size_t)(comma - s) : strlen(s);
		uint64_t lo, hi;
		char *dash;
		if (len == 0 || len >= sizeof(buf))
			goto bad;
		memcpy(buf, s, len);
		buf[len] = 0;
		dash = strchr(buf, '-');
		if (dash != NULL) {
			*dash = 0;
			if (proto_parse_u64(buf, 0, PROTO_MAX_RANKS - 1, &lo) != 0 ||
			    proto_parse_u64(dash + 1, 0, PROTO_MAX_RANKS - 1, &hi) != 0 || hi < lo)
				goto bad;
		} else if (proto_parse_u64(buf, 0, PROTO_MAX_RANKS - 1, &lo) == 0) {
			hi = lo;
		} else {
			goto bad;
		}
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
		s += len + (comma != NULL);
		if (comma != NULL && *s == 0)
			goto bad;
	}
	if (cnt == 0)
		goto bad;
	*out = r;
	*n = cnt;
	return 0;
bad:
	free(r);
	return -EINVAL;
}

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
		{"versions", required_argument, NULL, 'V'},
		{"every", required_argument, NULL, 'e'},
		{"anchor-every", required_argument, NULL, 'A'},
		{"control", required_argument, NULL, 'c'},
		{"metrics", required_argument, NULL, 'M'},
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
	struct node_metrics *metrics = NULL;
	struct node_metrics_http *mhttp = NULL;
	int c, rc = 2;

	proto_log_setup("tessera-publish", -1);
	proto_config_cli("tessera publish", "publish", opts, &argc, &argv);
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
		case 'V':
			if (proto_parse_u64(optarg, 0, 1000000000, &a.versions) != 0) {
				fprintf(stderr, "tessera publish: --versions wants 0..1e9, not '%s'\n", optarg);
				goto out;
			}
			a.have_versions = true;
			break;
		case 'e':
			if (proto_parse_u64(optarg, 1, 86400000, &every_ms) != 0) {
				fprintf(stderr, "tessera publish: --every wants 1..86400000 ms, not '%s'\n",
					optarg);
				goto out;
			}
			a.every = true;
			break;
		case 'c':
			a.control = optarg;
			break;
		case 'M':
			metrics_at = optarg;
			break;
		case 'A': {
			uint64_t k;
			if (proto_parse_u64(optarg, 1, UINT32_MAX, &k) != 0) {
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
	if ((po.synthetic_bytes > 0) == (po.model_dir != NULL)) {
		fprintf(stderr, "tessera publish: give exactly one of --synthetic-mb N and --model-dir DIR (see --help)\n");
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
	if (a.control != NULL && control_open(&a, a.control) != 0)
		goto out;
	if (strcmp(metrics_at, "off") != 0) {
		metrics = node_metrics_new();
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
	if (a.lis != NULL)
		evconnlistener_free(a.lis);
	if (a.control_bound)
		unlink(a.control);
	node_metrics_http_free(mhttp);
	node_pub_metrics_fini(&a.pm);
	node_metrics_free(metrics);
	node_pub_free(a.pub); /* drops queued exports: no callback after this */
	while (a.clients != NULL)
		client_free(a.clients);
	if (a.base != NULL)
		event_base_free(a.base);
	free(ranks);
	sodium_memzero(sk, sizeof(sk));
	sodium_memzero(ck, sizeof(ck));
	return rc;
}
