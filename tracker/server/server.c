/* The tracker server: its listener, its state opened and closed in order,
 * and the timer that ends leases between requests. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/log.h"
#include "proto/optval.h"
#include "proto/params.h"
#include "tracker/server/internal.h"
#include "tracker/wire/etcd.h"

#define MAX_HEADERS_SIZE (16u << 10) /* request line and headers, bytes */

static void sweep_cb(evutil_socket_t fd, short what, void *arg)
{
	struct trk_server *s = arg;
	trk__registry_sweep(s->reg);
}

/* Splits "host:port" or "[v6]:port" into host (in buf) and port. */
int trk_listen_check(const char *v, struct proto_err *err)
{
	char host[256];
	uint16_t port;

	if (proto_hostport_parse(v, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "want HOST:PORT");
	return 0;
}

static int bound_port(evutil_socket_t fd, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0)
		return -errno;
	if (ss.ss_family == AF_INET)
		*port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	else if (ss.ss_family == AF_INET6)
		*port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	else
		return -EAFNOSUPPORT;
	return 0;
}

/* Binds host:port with the configured backlog (libevent's default is
 * small) and hands the listener to evhttp, which then owns it. */
static int listen_on(struct trk_server *s, const char *host, uint16_t port,
		     struct proto_err *err)
{
	struct evutil_addrinfo hints = {0}, *ai = NULL;
	struct evconnlistener *lev = NULL;
	char portstr[8];
	int gai, backlog = (int)PROTO_MIN(proto_param(PROTO_PARAM_LISTEN_BACKLOG), INT32_MAX);

	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = EVUTIL_AI_PASSIVE;
	snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
	gai = evutil_getaddrinfo(host, portstr, &hints, &ai);
	if (gai != 0)
		return proto_errf(err, EADDRNOTAVAIL, "%s", evutil_gai_strerror(gai));
	lev = evconnlistener_new_bind(s->base, NULL, NULL,
				      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC |
					      LEV_OPT_REUSEABLE,
				      backlog > 0 ? backlog : -1, ai->ai_addr,
				      (int)ai->ai_addrlen);
	evutil_freeaddrinfo(ai);
	if (lev == NULL)
		return proto_errf(err, EADDRNOTAVAIL, "%s", strerror(errno));
	s->sock = evhttp_bind_listener(s->http, lev);
	if (s->sock == NULL) {
		evconnlistener_free(lev);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	return 0;
}

/* The cluster id a store holds: 0 with id filled, -ENOENT, or an error. */
static int stored_cluster(struct trk_store *st, char *id, size_t cap, struct proto_err *err)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc = trk__store_get(st, "cluster.id", 64, &buf, &len, err);

	if (rc == 0) {
		snprintf(id, cap, "%.*s", (int)strcspn((char *)buf, "\n"), (char *)buf);
		free(buf);
	}
	return rc;
}

/*
 * An etcd store and a state directory: the directory remembers the cluster
 * id of the store it served. A store with another id, or an empty store
 * while the directory remembers one (etcd wiped, or the wrong endpoints),
 * is refused: serving it would start a new chain under the old one's
 * nodes. The id is remembered after the versions are loaded (remember).
 */
static int check_memory(struct trk_server *s, const char *dir, char *mem, size_t cap,
			struct proto_err *err)
{
	struct trk_store *d = NULL;
	char id[80];
	int rc, drc;

	mem[0] = 0;
	if ((rc = trk__store_open_dir(dir, &d, err)) != 0)
		return rc;
	drc = stored_cluster(d, mem, cap, err);
	trk__store_free(d);
	if (drc != 0 && drc != -ENOENT)
		return drc;
	rc = stored_cluster(s->st, id, sizeof(id), err);
	if (rc != 0 && rc != -ENOENT)
		return rc;
	if (drc == 0 && rc == -ENOENT)
		return proto_errf(err, EINVAL, "%s has no cluster id, but the state directory %s remembers "
				  "cluster %s: a wiped etcd or the wrong endpoints? "
				  "(restore etcd, or start a new chain with an empty --state)",
				  trk__store_name(s->st), dir, mem);
	if (drc == 0 && strcmp(id, mem) != 0)
		return proto_errf(err, EINVAL, "%s holds cluster %s, the state directory %s "
				  "served cluster %s: another cluster's store? (fix --store, "
				  "or start with an empty --state)", trk__store_name(s->st), id, dir,
				  mem);
	return 0;
}

/* Every tracker of a store authenticates with the same cluster key (or
 * none): its fingerprint (a hash of it: nothing to sign with) is kept in
 * the store by the first, and another refused before it can lead. */
static int check_cluster_key(struct trk_server *s, const uint8_t *key, struct proto_err *err)
{
	uint8_t fp[16], *have = NULL;
	char hex[2 * sizeof(fp) + 2] = "none\n";
	size_t len = 0;
	int rc;

	if (key != NULL) {
		crypto_generichash(fp, sizeof(fp), key, PROTO_CLUSTER_KEY_BYTES,
				   (const uint8_t *)"tessera cluster key fingerprint", 31);
		sodium_bin2hex(hex, sizeof(hex), fp, sizeof(fp));
		hex[2 * sizeof(fp)] = '\n'; /* the room sodium's NUL took, NUL after */
		hex[2 * sizeof(fp) + 1] = 0;
	}
	rc = trk__store_create(s->st, "cluster-key.fp", hex, strlen(hex), err);
	if (rc != -EEXIST)
		return rc;
	if ((rc = trk__store_get(s->st, "cluster-key.fp", 64, &have, &len, err)) != 0)
		return rc;
	if (len != strlen(hex) || memcmp(have, hex, len) != 0)
		rc = proto_errf(err, EINVAL, "the trackers of %s use %s: give every tracker of a "
				"store the same --cluster-key", trk__store_name(s->st),
				key == NULL ? "a --cluster-key, this one none" :
				strncmp((char *)have, "none", 4) == 0 ? "no --cluster-key" :
									"another --cluster-key");
	free(have);
	return rc;
}

static int open_store(struct trk_server *s, const struct trk_server_opts *o,
		      struct proto_err *err)
{
	struct trk_etcd_opts eo = {o->store, o->etcd_ca, o->etcd_cert, o->etcd_key, 0};
	struct trk_etcd *e = NULL;
	uint8_t *was = NULL;
	size_t len = 0;
	char mem[80] = "";
	int rc;

	if (o->store == NULL) {
		if ((rc = trk__store_open_dir(o->state_dir, &s->st, err)) != 0)
			return rc;
		/* The memory of a tracker on etcd is no state of its own. */
		if (trk__store_get(s->st, "store.url", 1024, &was, &len, NULL) == 0) {
			rc = proto_errf(err, EINVAL, "the state directory %s belongs to a tracker "
					"on the store %.*s: give --store (or start on an "
					"empty --state)", o->state_dir,
					(int)strcspn((char *)was, "\n"), (char *)was);
			free(was);
			return rc;
		}
		return trk__versions_open(s->st, o->trainer_pk, &s->vs, err);
	}
	if ((rc = trk_etcd_new(&eo, &e, err)) != 0 ||
	    (rc = trk__store_open_etcd(e, &s->st, err)) != 0) {
		proto_err_prefix(err, "--store");
		return rc;
	}
	if (o->state_dir != NULL && (rc = check_memory(s, o->state_dir, mem, sizeof(mem), err)) != 0)
		return rc;
	if ((rc = check_cluster_key(s, o->cluster_key, err)) != 0 ||
	    (rc = trk__versions_open(s->st, o->trainer_pk, &s->vs, err)) != 0)
		return rc;
	if (o->state_dir != NULL && mem[0] == 0) {
		struct trk_store *d = NULL;
		char line[80], url[700];
		snprintf(line, sizeof(line), "%s\n", trk__versions_cluster(s->vs));
		snprintf(url, sizeof(url), "%s\n", trk__store_name(s->st));
		if ((rc = trk__store_open_dir(o->state_dir, &d, err)) == 0 &&
		    (rc = trk__store_put(d, "store.url", url, strlen(url), err)) == 0)
			rc = trk__store_put(d, "cluster.id", line, strlen(line), err);
		trk__store_free(d);
		if (rc != 0)
			return rc;
	}
	return 0;
}

int trk_server_new(struct event_base *base, const struct trk_server_opts *o,
		   struct trk_server **out, struct proto_err *err)
{
	struct trk_server *s;
	char host[256];
	uint16_t port = 0;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	if (proto_hostport_parse(o->listen, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "--listen %s: want HOST:PORT", o->listen);
	/* Three priorities, before any event of ours: everything at the
	 * middle one (libevent's default for new events), held watches'
	 * connections and their wake-ups below it (conns.c, watches.c). */
	if (event_base_get_npriorities(base) == 1)
		event_base_priority_init(base, 3);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	s->base = base;
	s->started_ms = proto_wall_ms();
	s->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
	if ((o->tls_cert != NULL || o->tls_key != NULL) &&
	    (rc = trk__tls_server_ctx(o->tls_cert, o->tls_key, &s->tls, err)) != 0)
		goto fail;
	if (o->cluster_key != NULL) {
		if (trk__auth_new(o->cluster_key, proto_param(PROTO_PARAM_AUTH_WINDOW_S),
				  &s->auth) != 0) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto fail;
		}
	} else {
		LOG_WARN("no --cluster-key: POST requests are not authenticated");
	}
	s->http = evhttp_new(base);
	if (s->http == NULL) {
		rc = proto_errf(err, ENOMEM, "evhttp_new failed");
		goto fail;
	}
	/* evhttp buffers a body before calling us; this caps it at the largest
	 * body any route takes (a manifest). The connection guard (conns.c)
	 * judges each head first: route caps and the head mac are checked
	 * before a byte of body is kept. */
	evhttp_set_max_body_size(s->http,
				 (ev_ssize_t)proto_param(PROTO_PARAM_MANIFEST_MAX));
	evhttp_set_max_headers_size(s->http, MAX_HEADERS_SIZE);
	evhttp_set_timeout(s->http, 60);
	/* Every method reaches the router, which answers 405 in JSON. */
	evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST |
						    EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
						    EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS |
						    EVHTTP_REQ_TRACE | EVHTTP_REQ_CONNECT |
						    EVHTTP_REQ_PATCH);
	evhttp_set_gencb(s->http, trk__route, s);
	/* Bound before the state is opened: a tracker that cannot listen
	 * (the port is taken) leaves no state directory behind. Nothing is
	 * served before the loop runs. */
	if ((rc = listen_on(s, host, port, err)) != 0) {
		proto_err_prefix(err, "cannot listen on %s", o->listen);
		goto fail;
	}
	if (o->trainer_pk != NULL) {
		memcpy(s->trainer_pk, o->trainer_pk, PROTO_PK_BYTES);
		s->trainer_pk_set = true;
	}
	if ((rc = open_store(s, o, err)) != 0)
		goto fail;
	if ((rc = trk__addenda_open(s, &s->ad, err)) != 0)
		goto fail;
	if ((rc = trk__canary_new(&s->canary)) != 0) {
		proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if ((rc = trk__watches_new(s, &s->w)) != 0) {
		proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if ((rc = trk__registry_new(s, &s->reg)) != 0) {
		proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if ((rc = trk__conns_new(s, trk__head_verdict, &s->conns)) != 0) {
		rc = proto_errf(err, -rc, "out of memory");
		goto fail;
	}
	if (bound_port(evhttp_bound_socket_get_fd(s->sock), &port) != 0) {
		rc = proto_errf(err, EIO, "cannot read the bound port");
		goto fail;
	}
	snprintf(s->url, sizeof(s->url), strchr(host, ':') ? "%s://[%s]:%u" : "%s://%s:%u",
		 s->tls != NULL ? "https" : "http", host, (unsigned)port);
	if (o->store != NULL &&
	    (rc = trk__lead_new(s, o->leader_ttl_s ? o->leader_ttl_s : 5, &s->lead, err)) != 0) {
		proto_err_prefix(err, "--store");
		goto fail;
	}
	s->sweep_ev = event_new(base, -1, EV_PERSIST, sweep_cb, s);
	if (s->sweep_ev == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	uint64_t every = PROTO_MAX(PROTO_MIN(s->lease_ms / 4, 500), 10);
	struct timeval tv = {(time_t)(every / 1000), (suseconds_t)(every % 1000) * 1000};
	event_add(s->sweep_ev, &tv);
	LOG_INFO("tracker on %s, %zu versions, lease %llu ms", s->url,
		 trk__versions_count(s->vs), (unsigned long long)s->lease_ms);
	*out = s;
	return 0;
fail:
	trk_server_free(s);
	return rc;
}

int trk_server_exit_code(const struct trk_server *s)
{
	return s->exit_code;
}

const char *trk_server_url(const struct trk_server *s)
{
	return s->url;
}

void trk_server_free(struct trk_server *s)
{
	if (s == NULL)
		return;
	if (s->sweep_ev != NULL)
		event_free(s->sweep_ev);
	trk__lead_free(s->lead);
	/* Held long-polls first: evhttp_free frees their requests. */
	if (s->w != NULL)
		trk__watches_drop(s->w);
	if (s->http != NULL)
		evhttp_free(s->http);
	trk__conns_free(s->conns);
	trk__registry_free(s->reg);
	trk__addenda_free(s->ad);
	trk__canary_free(s->canary);
	trk__watches_free(s->w);
	trk__versions_free(s->vs);
	trk__store_free(s->st);
	trk__auth_free(s->auth);
	trk__tls_ctx_free(s->tls);
	free(s);
}
