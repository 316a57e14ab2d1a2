/* The publisher object: lifecycle, export queue, tracker registration (design in publisher.h). */
#include "node/publisher/publisher.h"

#include <errno.h>
#include <event2/event.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "node/base/fabiface.h"
#include "node/base/fabloop.h"
#include "node/publisher/pub_internal.h"
#include "proto/delta.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"

#define REGISTER_RETRY_MS 1000
#define FABLOOP_PERIOD_US 1000

/* ---- small helpers ---------------------------------------------------------- */

static void fatal(struct node_pub *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fatal(struct node_pub *p, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (p->dead)
		return;
	p->dead = true;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->on_fatal != NULL)
		p->on_fatal(p->arg, msg);
	else
		LOG_ERR("%s", msg);
}

/* ---- registration and heartbeats ----------------------------------------------- */

#define FIX_RETRY_MAX_MS 60000 /* a registration a person must fix: asked at most this far apart */

uint64_t node__pub_needs_fix(struct node_pub *p, const char *why, bool model)
{
	p->fix_model = model;
	return node_fix_needed(&p->fix, "publisher", why, REGISTER_RETRY_MS, FIX_RETRY_MAX_MS);
}

void node__pub_fixed(struct node_pub *p, bool model)
{
	if (model || !p->fix_model)
		node_fix_over(&p->fix, "publisher");
}

/* The tracker forgot the chain this process saw: stop, loudly. */
static void on_chain_lost(void *arg, const char *why)
{
	if (why != NULL)
		fatal(arg, "%s", why);
}

static void on_init_versions(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0;
	size_t n = 0;
	bool found = false, served = false;

	p->init_busy = false;
	if (a->status != 200 || trk_versions_parse(a->json, &latest, &vi, &n, &err) != 0) {
		LOG_WARN("listing versions: %s", a->status == 200 ? err.msg : a->error);
		node__pub_timer_ms(p->reg_ev, RETRY_MS);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (vi[i].version == latest) {
			memcpy(p->prev_digest, vi[i].digest, PROTO_HASH_BYTES);
			found = true;
		}
	free(vi);
	if (latest > 0 && !found) {
		LOG_WARN("the tracker lists no entry for its latest version %llu: asking again",
			 (unsigned long long)latest);
		node__pub_timer_ms(p->reg_ev, RETRY_MS);
		return;
	}
	/* Never number below what this process published: a tracker that
	 * forgot it lost its state (the chain guard of the tracker client
	 * refuses it first when its cluster id or instance changed). */
	if (latest < p->published) {
		fatal(p, "the tracker's latest version is %llu, below version %llu "
			 "this publisher published: its state was lost or replaced "
			 "(restore it, or restart the publisher to start a new chain)",
		      (unsigned long long)latest, (unsigned long long)p->published);
		return;
	}
	p->next_version = latest + 1;
	/* The tracker lost versions (a wiped state dir): stop serving them. */
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		if (pv->version > latest && !pv->releasing) {
			LOG_WARN("the tracker no longer knows version %llu: withdrawing it",
				 (unsigned long long)pv->version);
			pv->releasing = true;
		}
	node__pub_sync_offers(p);
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		served |= pv->version == latest && !pv->releasing;
	if (served) {
		/* ours already (a resync after a conflict): nothing to rebuild */
	} else if (latest > 0 && node__pub_source_has(p, latest)) {
		p->reoffer = latest;
		LOG_INFO("the tracker has versions up to %llu: rebuilding it to offer it again",
			 (unsigned long long)latest);
	} else if (latest > 0 && p->trainer) {
		LOG_INFO("the tracker has versions up to %llu: the trainer's next export follows them",
			 (unsigned long long)latest);
	} else if (latest > 0) {
		LOG_ERR("the tracker's latest version %llu is beyond the model dir's %zu versions: not offered",
			(unsigned long long)latest, p->nfiles);
	}
	p->ready = true;
	event_active(p->kick_ev, 0, 0);
}

void node__pub_watch_versions(struct node_pub *p)
{
	if (p->init_busy)
		return;
	if (trk_client_watch(p->trk, 0, 0, on_init_versions, p) == 0)
		p->init_busy = true;
	else
		node__pub_timer_ms(p->reg_ev, RETRY_MS);
}

static void on_registered(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	const char *id;
	json_t *lease;

	p->reg_busy = false;
	/* https:// to a plain tracker, a CA that does not verify it, a host
	 * that does not resolve, another cluster key than the tracker's (or
	 * none where it wants one): said once, on /healthz, asked ever more
	 * slowly (the tracker may yet be restarted with the right settings). */
	if (a->fix) {
		node__pub_timer_ms(p->reg_ev, node__pub_needs_fix(p, a->error, false));
		return;
	}
	/* A tracker down, or our previous process (killed, not yet gone)
	 * still holding the ranks until its lease there ends: again later. */
	if (a->status < 0 || a->status >= 500 ||
	    (a->status == 409 && strstr(a->error, "is live") != NULL)) {
		if (!p->reg_warned)
			LOG_WARN("registering with the tracker: %s (retrying)", a->error);
		p->reg_warned = true;
		node__pub_timer_ms(p->reg_ev, REGISTER_RETRY_MS);
		return;
	}
	if (a->status == 409 && strstr(a->error, "model digest differs") != NULL) {
		fatal(p, "the tracker refused the registration: %s: its --state directory holds the "
			 "versions of another model; start the tracker on an empty --state (or this "
			 "publisher with that model)", a->error);
		return;
	}
	if (a->status != 200) {
		fatal(p, "the tracker refused the registration: %s", a->error);
		return;
	}
	id = json_string_value(json_object_get(a->json, "publisher_id"));
	if (id == NULL || strlen(id) == 0 || strlen(id) >= sizeof(p->id)) {
		fatal(p, "the tracker answered the registration without a publisher_id");
		return;
	}
	snprintf(p->id, sizeof(p->id), "%s", id);
	lease = json_object_get(a->json, "lease_ms");
	if (json_is_integer(lease) && json_integer_value(lease) >= 30)
		p->lease_ms = (uint64_t)json_integer_value(lease);
	p->registered = true;
	p->reg_gen++;
	p->reg_warned = false;
	node__pub_fixed(p, true);
	LOG_INFO("registered as %s with %zu ranks (lease %llu ms)", p->id, p->nhosted,
		 (unsigned long long)p->lease_ms);
	event_del(p->hb_ev);
	node__pub_timer_ms(p->hb_ev, p->lease_ms / 3);
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		pv->so.offered = false;
	if (!p->ready)
		node__pub_watch_versions(p);
	node__pub_sync_offers(p);
	if (p->ex != NULL)
		node__pub_ex_step(p);
}

void node__pub_register(struct node_pub *p)
{
	struct trk_rank_addr *r;
	int rc;

	if (p->reg_busy || p->dead)
		return;
	if ((r = calloc(p->nhosted, sizeof(*r))) == NULL) {
		node__pub_timer_ms(p->reg_ev, REGISTER_RETRY_MS);
		return;
	}
	for (size_t i = 0; i < p->nhosted; i++) {
		r[i].rank = p->hosted[i].rank;
		r[i].host = p->host;
		r[i].provider = fab_provider(p->hosted[i].fab);
		r[i].fabric_addr = p->hosted[i].addr_hex;
	}
	rc = trk_client_register_publisher(p->trk, p->model_json, p->tl_json, r, p->nhosted,
					   p->every_ms, on_registered, p);
	free(r);
	if (rc == 0)
		p->reg_busy = true;
	else
		node__pub_timer_ms(p->reg_ev, REGISTER_RETRY_MS);
}

static void on_reg_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	if (!p->registered) {
		node__pub_register(p);
	} else if (!p->ready) {
		node__pub_watch_versions(p);
	}
}

/* A heartbeat that failed (status: its answer's): one line when the
 * failures start, the rest counted, one line when they end. */
static void hb_failed(struct node_pub *p, const struct trk_answer *a)
{
	if (p->hb_fails++ == 0) {
		p->hb_fail_ms = proto_now_ns() / 1000000;
		LOG_WARN("heartbeat: %s (the tracker may be down: heartbeats go on every %llu ms, "
			 "said again when one is answered)",
			 a->error, (unsigned long long)(p->lease_ms / 3));
	} else {
		LOG_DEBUG("heartbeat: %s (%llu failed in a row)", a->error,
			  (unsigned long long)p->hb_fails);
	}
}

static void hb_answered(struct node_pub *p)
{
	if (p->hb_fails > 0) /* at the level of the first line: the default log pairs them */
		LOG_WARN("heartbeat: the tracker answers again, after %llu failed heartbeats "
			 "(%llu ms)",
			 (unsigned long long)p->hb_fails,
			 (unsigned long long)(proto_now_ns() / 1000000 - p->hb_fail_ms));
	p->hb_fails = 0;
}

static void on_hb_answer(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;

	p->hb_busy = false;
	if (a->status == 404 && p->hb_gen == p->reg_gen && p->registered) {
		hb_answered(p);
		LOG_WARN("the tracker forgot publisher %s: registering again", p->id);
		p->registered = false;
		node__pub_register(p);
	} else if (a->status != 200 && a->fix) {
		/* a key or certificate changed at the tracker: the lease runs out */
		node__pub_needs_fix(p, a->error, false);
	} else if (a->status != 200) {
		hb_failed(p, a);
	} else {
		hb_answered(p);
		node__pub_fixed(p, false);
	}
}

static void on_hb(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	node__pub_timer_ms(p->hb_ev, p->lease_ms / 3);
	if (!p->registered || p->hb_busy || p->dead)
		return;
	if (trk_client_heartbeat(p->trk, p->id, on_hb_answer, p) == 0) {
		p->hb_busy = true;
		p->hb_gen = p->reg_gen;
	}
}

/* ---- the export queue ------------------------------------------------------------ */

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;
	struct pub_req *req;
	uint64_t v;

	if (p->dead || !p->ready || p->ex != NULL)
		return;
	if (p->reoffer != 0) {
		v = p->reoffer;
		p->reoffer = 0;
		node__pub_ex_start(p, NULL, v, true);
		return;
	}
	req = p->queue;
	if (req == NULL)
		return;
	p->queue = req->next;
	if (p->queue == NULL)
		p->queue_tail = &p->queue;
	p->nqueue--;
	req->next = NULL;
	v = p->next_version;
	if (!p->leader)
		p->next_version++; /* the leader's number is used up once accepted */
	node__pub_ex_start(p, req, v, !p->leader);
}

/* ---- public face ------------------------------------------------------------------ */

/* The trainer layout: a file or a built-in (fsdpN, tpN). */
static int load_trainer_layout(struct node_pub *p, const char *name, struct proto_err *err)
{
	int rc = proto_layout_open(&p->model, name, &p->tl, err);

	if (rc != 0)
		return rc;
	p->have_tl = true;
	if ((rc = proto_layout_check_complete(&p->model, &p->tl, err)) != 0) {
		proto_err_prefix(err, "trainer layout %s does not hold the whole model", name);
		return rc;
	}
	return 0;
}

static int open_hosted(struct node_pub *p, const struct node_pub_opts *o, struct proto_err *err)
{
	const char *prov = o->provider ? o->provider : FAB_PROVIDER_DEFAULT;
	const char *bind = o->bind;
	struct node_fabiface fi;
	int rc;

	if (bind == NULL) {
		if ((rc = node_fabiface_pick(prov, o->fabric_iface, o->tracker_url, &fi, err)) != 0)
			return rc;
		bind = fi.addr[0] ? fi.addr : NULL;
	}
	for (size_t i = 0; i < p->nhosted; i++) {
		struct pub_hosted *h = &p->hosted[i];
		uint8_t addr[FAB_ADDR_MAX];
		size_t alen = 0;
		/* A publisher takes no messages: the sink drops strangers'. */
		if ((rc = fab_open(prov, bind,
				   &(struct fab_opts){.sink = FAB_SINK_DEFAULT},
				   &h->fab, err)) != 0) {
			proto_err_prefix(err, "rank %u", h->rank);
			return rc;
		}
		if ((rc = fab_getname(h->fab, addr, sizeof(addr), &alen)) != 0)
			return proto_errf(err, -rc, "rank %u: no fabric address: %s", h->rank,
					  strerror(-rc));
		sodium_bin2hex(h->addr_hex, sizeof(h->addr_hex), addr, alen);
		h->fl = node_fabloop_new(p->base, h->fab, FABLOOP_PERIOD_US);
		if (h->fl == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
	}
	return 0;
}

int node_pub_new(struct event_base *base, const struct node_pub_opts *o, struct node_pub **out,
		 struct proto_err *err)
{
	struct node_pub *p;
	uint32_t nr;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	if (o->sk == NULL || o->tracker_url == NULL ||
	    (o->synthetic_bytes > 0) + (o->model_dir != NULL) + (o->trainer_model != NULL) != 1)
		return proto_errf(err, EINVAL,
				  "publisher: a tracker, a key and one source (synthetic, model dir or trainer) are needed");
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	p->base = base;
	p->wake[0] = p->wake[1] = -1;
	p->on_fatal = o->on_fatal;
	p->anchor_every = o->anchor_every ? o->anchor_every
					  : (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_ANCHOR_EVERY),
								(uint64_t)UINT32_MAX);
	p->arg = o->arg;
	p->queue_tail = &p->queue;
	p->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
	p->every_ms = o->every_ms;
	memcpy(p->sk, o->sk, PROTO_SK_BYTES);
	crypto_sign_ed25519_sk_to_pk(p->pk, p->sk);
	if (o->host != NULL)
		snprintf(p->host, sizeof(p->host), "%s", o->host);
	else if (gethostname(p->host, sizeof(p->host) - 1) != 0)
		snprintf(p->host, sizeof(p->host), "localhost");

	/* The model and the trainer layout. */
	if (o->synthetic_bytes > 0) {
		p->synthetic = true;
		p->seed = o->seed;
		if ((rc = proto_fixture_model(o->synthetic_bytes, &p->model, err)) != 0)
			goto fail;
		p->have_model = true;
	} else if (o->trainer_model != NULL) {
		if ((rc = node__pub_trainer_model(p, o->trainer_model, err)) != 0)
			goto fail;
	} else if ((rc = node__pub_load_model_dir(p, o->model_dir, err)) != 0) {
		goto fail;
	}
	if ((rc = load_trainer_layout(p, o->layout ? o->layout : "fsdp2", err)) != 0)
		goto fail;
	p->model_json = proto_model_to_json(&p->model);
	p->tl_json = proto_layout_to_json(&p->model, &p->tl);
	nr = p->tl.nranks;
	p->blocks = calloc(nr, sizeof(*p->blocks));
	p->block_cap = calloc(nr, sizeof(*p->block_cap));
	p->spare_buf = calloc(nr, sizeof(*p->spare_buf));
	p->spare_buf_cap = calloc(nr, sizeof(*p->spare_buf_cap));
	p->export_cap = calloc(nr, sizeof(*p->export_cap));
	p->scratch = calloc(nr, sizeof(*p->scratch));
	p->hosted = calloc(o->nranks ? o->nranks : nr, sizeof(*p->hosted));
	if (p->model_json == NULL || p->tl_json == NULL || p->blocks == NULL ||
	    p->block_cap == NULL || p->spare_buf == NULL || p->spare_buf_cap == NULL || p->export_cap == NULL || p->scratch == NULL ||
	    p->hosted == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}

	/* Hosted ranks. */
	p->nhosted = o->nranks ? o->nranks : nr;
	for (size_t i = 0; i < p->nhosted; i++) {
		uint32_t r = o->nranks ? o->ranks[i] : (uint32_t)i;
		if (r >= nr) {
			rc = proto_errf(err, EINVAL, "rank %u: the trainer layout has ranks 0..%u", r,
					nr - 1);
			goto fail;
		}
		for (size_t j = 0; j < i; j++)
			if (p->hosted[j].rank == r) {
				rc = proto_errf(err, EINVAL, "rank %u listed twice", r);
				goto fail;
			}
		p->hosted[i].rank = r;
		p->leader |= r == 0;
	}
	if (p->trainer) {
		/* The leader needs every rank's bytes, which only the trainer has. */
		if (p->nhosted != nr) {
			rc = proto_errf(err, EINVAL,
					"the trainer source needs every trainer rank (0..%u) in this process",
					nr - 1);
			goto fail;
		}
		if ((rc = node__pub_trainer_open(p, err)) != 0)
			goto fail;
	}
	if ((rc = open_hosted(p, o, err)) != 0)
		goto fail;

	/* The loop's side. */
	if ((rc = trk_client_new(base, o->tracker_url, o->cluster_key, &p->trk, err)) != 0)
		goto fail;
	if (trk_client_set_site(p->trk, o->site) != 0) {
		rc = proto_errf(err, EINVAL, "--site %s: want 1..%d of [A-Za-z0-9._-]", o->site,
				TRK_SITE_MAX);
		goto fail;
	}
	if (o->tls_ca != NULL && (rc = trk_client_set_tls_ca(p->trk, o->tls_ca, err)) != 0)
		goto fail;
	trk_client_on_chain_lost(p->trk, on_chain_lost, p);
	if (evutil_socketpair(AF_UNIX, SOCK_STREAM, 0, p->wake) != 0) {
		rc = proto_errf(err, errno, "socketpair: %s", strerror(errno));
		goto fail;
	}
	evutil_make_socket_nonblocking(p->wake[0]);
	evutil_make_socket_nonblocking(p->wake[1]);
	evutil_make_socket_closeonexec(p->wake[0]);
	evutil_make_socket_closeonexec(p->wake[1]);
	p->wake_ev = event_new(base, p->wake[0], EV_READ | EV_PERSIST, node__pub_on_wake, p);
	p->hb_ev = evtimer_new(base, on_hb, p);
	p->check_ev = event_new(base, -1, EV_PERSIST, node__pub_on_check, p);
	p->reg_ev = evtimer_new(base, on_reg_timer, p);
	p->ex_ev = evtimer_new(base, node__pub_on_ex_timer, p);
	p->kick_ev = event_new(base, -1, 0, on_kick, p);
	if (p->wake_ev == NULL || p->hb_ev == NULL || p->check_ev == NULL || p->reg_ev == NULL ||
	    p->ex_ev == NULL || p->kick_ev == NULL || event_add(p->wake_ev, NULL) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	{
		uint64_t ms = proto_param(PROTO_PARAM_PUB_CHECK_MS);
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		event_add(p->check_ev, &tv);
	}
	LOG_INFO("publisher: model %llu bytes, %u trainer ranks, hosting %zu%s",
		 (unsigned long long)proto_model_bytes(&p->model), nr, p->nhosted,
		 p->leader ? " (leader: signs and publishes)" : "");
	node__pub_prefault_first(p); /* while no export is asked for yet */
	node__pub_register(p);
	*out = p;
	return 0;
fail:
	node_pub_free(p);
	return rc;
}

int node_pub_export(struct node_pub *p, node_pub_cb cb, void *arg)
{
	return node_pub_export_snap(p, cb, NULL, arg);
}

int node_pub_export_snap(struct node_pub *p, node_pub_cb cb, node_pub_snap_cb on_snap, void *arg)
{
	struct pub_req *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return -ENOMEM;
	r->cb = cb;
	r->on_snap = on_snap;
	r->arg = arg;
	r->created_ms = proto_wall_ms();
	r->t0_ns = proto_now_ns();
	*p->queue_tail = r;
	p->queue_tail = &r->next;
	p->nqueue++;
	event_active(p->kick_ev, 0, 0);
	return 0;
}

size_t node_pub_pending(const struct node_pub *p)
{
	return p->nqueue + (p->ex != NULL && p->ex->req != NULL);
}

bool node_pub_registered(const struct node_pub *p)
{
	return p->registered;
}

const char *node_pub_needs_fix(const struct node_pub *p)
{
	return p->fix.why[0] != 0 ? p->fix.why : NULL;
}

size_t node_pub_nranks(const struct node_pub *p)
{
	return p->nhosted;
}

bool node_pub_leader(const struct node_pub *p)
{
	return p->leader;
}

uint64_t node_pub_model_bytes(const struct node_pub *p)
{
	return proto_model_bytes(&p->model);
}

uint64_t node_pub_served_bytes(const struct node_pub *p)
{
	uint64_t n = 0;

	for (const struct pub_version *pv = p->versions; pv; pv = pv->next)
		for (size_t i = 0; i < pv->nparts; i++)
			for (size_t li = 0; pv->parts[i].buf != NULL && li < pv->parts[i].nslices; li++)
				if (pv->layouts[li].state != PUB_L_FREED)
					n += pv->parts[i].slices[li].len;
	return n;
}

void node_pub_free(struct node_pub *p)
{
	struct pub_req *r;

	if (p == NULL)
		return;
	atomic_store(&p->abort, true);
	if (p->ex != NULL) {
		struct pub_export *ex = p->ex;
		node__pub_ex_free(p, ex); /* joins the workers */
		p->ex = NULL;
	}
	node__pub_prefault_join(p); /* stops early: abort is set */
	while ((r = p->queue) != NULL) {
		p->queue = r->next;
		free(r);
	}
	trk_client_free(p->trk); /* no callback runs after this */
	if (p->kick_ev)
		event_free(p->kick_ev);
	if (p->ex_ev)
		event_free(p->ex_ev);
	if (p->reg_ev)
		event_free(p->reg_ev);
	if (p->check_ev)
		event_free(p->check_ev);
	if (p->hb_ev)
		event_free(p->hb_ev);
	if (p->wake_ev)
		event_free(p->wake_ev);
	if (p->wake[0] >= 0)
		evutil_closesocket(p->wake[0]);
	if (p->wake[1] >= 0)
		evutil_closesocket(p->wake[1]);
	while (p->versions != NULL) {
		struct pub_version *pv = p->versions;
		p->versions = pv->next;
		node__pub_version_free(p, pv);
	}
	node__pub_parent_free(p->parent);
	for (size_t i = 0; p->hosted != NULL && i < p->nhosted; i++) {
		node_fabloop_free(p->hosted[i].fl);
		fab_close(p->hosted[i].fab);
	}
	free(p->hosted);
	while (p->layouts != NULL) {
		struct pub_layout *sl = p->layouts;
		p->layouts = sl->next;
		if (!sl->bad) {
			proto_plan_fini(&sl->plan);
			proto_layout_fini(&sl->layout);
		}
		free(sl);
	}
	node__pub_q_free_all(p);
	for (uint32_t r2 = 0; p->have_tl && r2 < p->tl.nranks; r2++) {
		if (p->blocks != NULL && p->blocks[r2] != NULL)
			munmap(p->blocks[r2], p->block_cap[r2]);
		if (p->spare_buf != NULL)
			node_serve_unmap(p->spare_buf[r2], p->spare_buf_cap[r2]);
	}
	free(p->spare_buf);
	free(p->spare_buf_cap);
	for (uint32_t r2 = 0; p->scratch != NULL && r2 < p->tl.nranks; r2++)
		proto_delta_scratch_free(p->scratch[r2]);
	free(p->scratch);
	free(p->export_cap);
	free(p->blocks);
	free(p->block_cap);
	node__pub_trainer_free(p);
	json_decref(p->model_json);
	json_decref(p->tl_json);
	if (p->have_tl)
		proto_layout_fini(&p->tl);
	for (size_t i = 0; i < p->nfiles; i++) {
		proto_ckpt_fini(&p->files[i].ck);
		free(p->files[i].path);
		free(p->files[i].map);
	}
	free(p->files);
	if (p->have_model)
		proto_model_fini(&p->model);
	sodium_memzero(p->sk, sizeof(p->sk));
	free(p);
}
