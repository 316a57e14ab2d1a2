/* One tessera-node process for every rank its host holds (see host.h). */
#include "node/host/host.h"

#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/fab.h"
#include "node/host/beat.h"
#include "node/base/fabiface.h"
#include "node/base/fabloop.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

struct node_host {
	struct event_base *base;
	struct node_agent_shared shared;
	struct node_agent **agents;
	char (*ids)[TRK_ID_MAX]; /* "A/0", per agent */
	size_t n;
	/* node_host_leave: ranks that have not yet left, then done(arg). */
	size_t leaving;
	void (*leave_done)(void *arg);
	void *leave_arg;
	/* One heartbeat renews all the ranks' leases, sent by the beat's
	 * thread; hb_ev feeds it from this loop (node/host/beat.h). */
	struct node_beat *beat;
	struct event *hb_ev;
	struct node_host_sources *srcq; /* several ranks: batched sources queries */
	struct node_host_watch *watch;  /* several ranks: one version watch */
};

/* ---- one heartbeat for every rank --------------------------------------------- */

/* The loop feeds the beat this often: well inside a third of a lease. */
#define FEED_MS 500

static void feed_beat(evutil_socket_t fd, short what, void *arg);

static void arm_feed(struct node_host *h)
{
	struct timeval tv = {0, FEED_MS * 1000};

	evtimer_add(h->hb_ev, &tv);
}

/* The ranks the tracker no longer knows register again: one line for the
 * process, naming them, not one per rank. */
static void on_gone(void *arg, const char (*ids)[TRK_ID_MAX], size_t n)
{
	struct node_host *h = arg;
	char names[256] = "";
	size_t len = 0, lost = 0;

	for (size_t i = 0; i < h->n; i++)
		for (size_t k = 0; k < n; k++)
			if (strcmp(ids[k], h->ids[i]) == 0 && node_agent_lease_lost(h->agents[i])) {
				if (len < sizeof(names))
					len += (size_t)snprintf(names + len, sizeof(names) - len,
								"%s%s", lost ? ", " : "", ids[k]);
				lost++;
				break;
			}
	if (lost > 0)
		LOG_WARN("lease lost for %s %s; registering again", lost > 1 ? "ranks" : "rank",
			 names);
}

/* The registered ranks and their pins, for the beat's next heartbeats. */
static void feed_beat(evutil_socket_t fd, short what, void *arg)
{
	struct node_host *h = arg;
	struct trk_hb_node e[TRK_HOST_HEARTBEAT_MAX];
	size_t n = 0;

	for (size_t i = 0; i < h->n && n < TRK_HOST_HEARTBEAT_MAX; i++)
		n += node_agent_heartbeat_entry(h->agents[i], &e[n]);
	node_beat_feed(h->beat, e, n, h->shared.trk);
	arm_feed(h);
}

/* The tracker client's chain guard speaks for every rank it carries. */
static void on_chain_lost(void *arg, const char *why)
{
	struct node_host *h = arg;

	for (size_t i = 0; i < h->n; i++)
		node_agent_chain_lost(h->agents[i], why);
}

/* Have-pages get an endpoint of their own where connections queue (rxm:
 * a read's answer waits behind every answer before it on the connection,
 * node/fetch/pace.c); without one they share the chunk reads'. */
static int open_have_endpoint(struct node_host *h, const struct node_agent_opts *o,
			      const char *bind)
{
	struct proto_err herr;

	if (proto_param(PROTO_PARAM_HAVE_SAME_ENDPOINT) != 0 || proto_param(PROTO_PARAM_FANOUT) == 0 ||
	    strstr(fab_provider(h->shared.fab), "ofi_rxm") == NULL)
		return 0;
	if (fab_open(o->provider, bind,
		     &(struct fab_opts){.sink = FAB_SINK_DEFAULT, .flags = FAB_F_PREWARM},
		     &h->shared.hfab, &herr) != 0) {
		LOG_WARN("node: no endpoint of their own for have-pages (%s): they share the "
			 "chunk reads'", herr.msg);
		return 0;
	}
	h->shared.hfl = node_fabloop_new(h->base, h->shared.hfab, 1000);
	if (h->shared.hfl == NULL) {
		LOG_WARN("node: no loop for the have-page endpoint (out of memory): have-pages "
			 "share the chunk reads' endpoint");
		fab_close(h->shared.hfab);
		h->shared.hfab = NULL;
		return 0;
	}
	LOG_INFO("node: have-page reads get an endpoint of their own (the second fabric open; "
		 "TESSERA_HAVE_SAME_ENDPOINT=1 shares the chunk reads')");
	return 0;
}

static int open_shared(struct node_host *h, const struct node_agent_opts *o,
		       struct proto_err *err)
{
	uint8_t ckey[PROTO_CLUSTER_KEY_BYTES];
	struct node_fabiface fi;
	int rc = 0;

	if (o->cluster_key != NULL && (rc = proto_key_load_cluster(o->cluster_key, ckey, err)) != 0)
		return rc;
	rc = trk_client_new(h->base, o->tracker_url, o->cluster_key ? ckey : NULL, &h->shared.trk,
			    err);
	/* Heartbeats get a client of their own, on their thread. */
	if (rc == 0)
		rc = node_beat_new(h->base, o->tracker_url, o->cluster_key ? ckey : NULL, o->tls_ca,
				   on_gone, h, &h->beat, err);
	sodium_memzero(ckey, sizeof(ckey));
	if (rc == 0 && o->tls_ca != NULL)
		rc = trk_client_set_tls_ca(h->shared.trk, o->tls_ca, err);
	if (rc == 0 && trk_client_set_site(h->shared.trk, o->site) != 0)
		rc = proto_errf(err, EINVAL, "--site %s: want 1..%d of [A-Za-z0-9._-]", o->site,
				TRK_SITE_MAX);
	if (rc != 0)
		return rc;
	trk_client_on_chain_lost(h->shared.trk, on_chain_lost, h);
	/* A node takes no messages: drop strangers'. A GPU store registers
	 * device memory where the provider can (FI_HMEM). */
	bool gpu = o->store != NULL && strncmp(o->store, "cuda", 4) == 0;
	rc = node_fabiface_pick(o->provider ? o->provider : FAB_PROVIDER_DEFAULT, o->fabric_iface,
				o->tracker_url, &fi, err);
	if (rc != 0)
		return rc;
	rc = fab_open(o->provider, fi.addr[0] ? fi.addr : NULL,
		      &(struct fab_opts){.sink = FAB_SINK_DEFAULT, .flags = FAB_F_PREWARM | (gpu ? FAB_F_HMEM_CUDA : 0)},
		      &h->shared.fab, err);
	if (rc != 0)
		return rc;
	if (gpu)
		LOG_INFO("node: fabric %s %s", fab_provider(h->shared.fab),
			 fab_hmem_cuda(h->shared.fab)
				 ? "registers CUDA memory (FI_HMEM): device buffers can be registered directly"
				 : "has no FI_HMEM: the GPU store uploads verified chunks from host staging");
	h->shared.fl = node_fabloop_new(h->base, h->shared.fab, 1000);
	if (h->shared.fl == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	return open_have_endpoint(h, o, fi.addr[0] ? fi.addr : NULL);
}

/* The ranks of one replica share one layout (by digest: a layout file and
 * the built-in it spells are the same layout). */
static int check_layouts(const struct node_host *h, const struct node_host_ranks *ranks,
			 const char *dflt, struct proto_err *err)
{
	for (size_t i = 0; i < h->n; i++)
		for (size_t j = 0; j < i; j++) {
			const struct node_host_rank *a = &ranks->r[i], *b = &ranks->r[j];
			if (strcmp(a->replica, b->replica) != 0 ||
			    memcmp(node_agent_layout_digest(h->agents[i]),
				   node_agent_layout_digest(h->agents[j]), PROTO_HASH_BYTES) == 0)
				continue;
			return proto_errf(err, EINVAL,
					  "replica %s: rank %u has layout %s, rank %u has %s; the "
					  "ranks of a replica share one layout",
					  a->replica, b->rank, b->layout ? b->layout : dflt, a->rank,
					  a->layout ? a->layout : dflt);
		}
	return 0;
}

/* "--attach DIR/" asks for a directory of sockets even for one rank, so
 * that a deployment names every socket the same way whatever its ranks. */
static bool attach_is_dir(const char *path)
{
	size_t n = strlen(path);
	return n > 0 && path[n - 1] == '/';
}

int node_host_new(struct event_base *base, const struct node_agent_opts *o,
		  const struct node_host_ranks *ranks, struct node_host **out,
		  struct proto_err *err)
{
	struct node_host *h = calloc(1, sizeof(*h));
	int rc;

	*out = NULL;
	if (h == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	h->base = base;
	if (ranks->n == 0) {
		rc = proto_errf(err, EINVAL, "no rank to serve");
		goto fail;
	}
	h->agents = calloc(ranks->n, sizeof(*h->agents));
	h->ids = calloc(ranks->n, sizeof(*h->ids));
	if (h->agents == NULL || h->ids == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = open_shared(h, o, err)) != 0)
		goto fail;
	/* One request renews the leases of all ranks (a tenth of the
	 * heartbeats a tracker of 10 000 ranks on 1 000 hosts answers), from
	 * its own thread: a busy loop keeps them. */
	h->shared.host_heartbeat = true;
	if ((h->hb_ev = evtimer_new(base, feed_beat, h)) == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	/* Their sources queries too: one request per loop turn, not one per
	 * rank behind each other on the client's connection. */
	if (ranks->n > 1) {
		if (node_host_sources_new(base, h->shared.trk, &h->srcq) != 0) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto fail;
		}
		h->shared.sources = node_host_sources_ask;
		h->shared.sources_ctx = h->srcq;
		if (node_host_watch_new(h->shared.trk, &h->watch) != 0) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto fail;
		}
		h->shared.watch = node_host_watch_ask;
		h->shared.watch_ctx = h->watch;
	}
	for (size_t i = 0; i < ranks->n; i++) {
		const struct node_host_rank *r = &ranks->r[i];
		struct node_agent_opts ro = *o;
		char attach[PATH_MAX];
		ro.shared = &h->shared;
		ro.replica = r->replica;
		ro.rank = r->rank;
		ro.store_index = (unsigned)i;
		if (r->layout != NULL)
			ro.layout = r->layout;
		if (o->attach_path != NULL && (ranks->n > 1 || attach_is_dir(o->attach_path))) {
			/* Several ranks, or a path ending in '/': --attach names
			 * a directory, each rank listens on <replica>-<rank>.sock
			 * in it (as --expose names its records). */
			if (i == 0 && (rc = proto_mkdir_p(o->attach_path, err)) != 0)
				goto fail;
			int dlen = (int)strlen(o->attach_path);
			while (dlen > 1 && o->attach_path[dlen - 1] == '/')
				dlen--;
			if ((size_t)snprintf(attach, sizeof(attach), "%.*s/%s-%u.sock", dlen,
					     o->attach_path, r->replica, r->rank) >= sizeof(attach)) {
				rc = proto_errf(err, ENAMETOOLONG, "--attach %s: path too long",
						o->attach_path);
				goto fail;
			}
			ro.attach_path = attach;
		}
		snprintf(h->ids[i], sizeof(h->ids[i]), "%s/%u", r->replica, r->rank);
		if ((rc = node_agent_new(base, &ro, &h->agents[i], err)) != 0)
			goto fail;
		h->n++;
	}
	if ((rc = check_layouts(h, ranks, o->layout, err)) != 0)
		goto fail;
	for (size_t i = 0; i < h->n; i++)
		node_agent_start(h->agents[i]);
	arm_feed(h);
	*out = h;
	return 0;
fail:
	node_host_free(h);
	return rc;
}

int node_host_failed(const struct node_host *h, struct proto_err *err)
{
	for (size_t i = 0; i < h->n; i++) {
		struct proto_err e;
		if (node_agent_failed(h->agents[i], &e)) {
			if (err != NULL)
				proto_errf(err, EIO, "%s: %s", h->ids[i], e.msg);
			return 1;
		}
	}
	return 0;
}

uint64_t node_host_active(const struct node_host *h, size_t i)
{
	return i < h->n ? node_agent_active(h->agents[i]) : 0;
}

static void on_left(void *arg)
{
	struct node_host *h = arg;

	if (h->leaving > 0 && --h->leaving == 0 && h->leave_done != NULL)
		h->leave_done(h->leave_arg);
}

void node_host_leave(struct node_host *h, void (*done)(void *arg), void *arg)
{
	h->leave_done = done;
	h->leave_arg = arg;
	h->leaving = h->n;
	if (h->hb_ev != NULL)
		evtimer_del(h->hb_ev);
	if (h->beat != NULL)
		node_beat_feed(h->beat, NULL, 0, h->shared.trk); /* no more heartbeats */
	for (size_t i = 0; i < h->n; i++)
		node_agent_leave(h->agents[i], on_left, h);
}

void node_host_free(struct node_host *h)
{
	if (h == NULL)
		return;
	/* Every rank lets go of its timers and fetch, then the endpoint is
	 * closed (its cancelled reads call back into the ranks, which find
	 * nothing to do), then the ranks' memory, then the tracker client. */
	node_beat_free(h->beat);
	if (h->hb_ev != NULL)
		event_free(h->hb_ev);
	for (size_t i = 0; i < h->n; i++)
		node_agent_stop(h->agents[i]);
	node_fabloop_free(h->shared.fl);
	fab_close(h->shared.fab);
	node_fabloop_free(h->shared.hfl);
	fab_close(h->shared.hfab);
	for (size_t i = 0; i < h->n; i++)
		node_agent_free(h->agents[i]);
	trk_client_free(h->shared.trk);
	node_host_sources_free(h->srcq);
	node_host_watch_free(h->watch);
	free(h->agents);
	free(h->ids);
	free(h);
}
