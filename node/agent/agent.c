/* The node agent: setup and teardown of one rank, its layers wired
 * together (see agent.h). */
#include "node/agent/internal.h"

#include <ctype.h>
#include <sys/stat.h>
#include <unistd.h>

/* The name the status page shows for our layout: a built-in's own ("tp2",
 * "tp2:fp8"), a file's name without directory and .json; "" when it has
 * other characters than the tracker takes ([A-Za-z0-9._:-]). */
static void layout_name(const char *arg, char *out, size_t len)
{
	const char *base = strrchr(arg, '/');
	size_t n;

	base = base ? base + 1 : arg;
	n = strlen(base);
	if (n > 5 && strcmp(base + n - 5, ".json") == 0)
		n -= 5;
	out[0] = 0;
	if (n == 0 || n >= len)
		return;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)base[i]) && base[i] != '-' && base[i] != '_' &&
		    base[i] != '.' && base[i] != ':')
			return;
	memcpy(out, base, n);
	out[n] = 0;
}

static int load_layout(struct node_agent *a, struct proto_err *err)
{
	const char *s = a->o.layout;
	int rc = proto_layout_open(&a->model, s, &a->layout, err);
	if (rc != 0)
		return rc;
	if (a->o.rank >= a->layout.nranks)
		return proto_errf(err, EINVAL, "replica %s rank %u: layout %s has ranks 0-%u",
				  a->o.replica, a->o.rank, s, a->layout.nranks - 1);
	a->layout_json = proto_layout_to_json(&a->model, &a->layout);
	layout_name(s, a->layout_name, sizeof(a->layout_name));
	return a->layout_json ? 0 : proto_errf(err, ENOMEM, "out of memory");
}

/* ---- what the layers below tell the lifecycle ---- */

/* A delta parcel's bytes are whole before the fetch's last: its apply may
 * start while the rest arrives. */
static void on_parcel_landed(void *arg, uint32_t pi)
{
	struct node_agent *a = arg;
	const uint8_t *digest;
	struct node_slot *parent = agent_delta_parent(a, &digest);

	if (a->ver != NULL)
		delta_landed(&a->ds, &a->ver->db, pi, parent, digest);
}

/* A peer was banned for bad chunks: the state report names it. */
static void on_banned(void *arg)
{
	struct node_agent *a = arg;

	if (a->ver != NULL)
		agent_report(a, a->ver->version, TRK_STATE_FETCHING, NULL, NULL);
}

/* A version taken whole lost its last holder: refused, its chain next. */
static void on_refuse(void *arg, const char *why)
{
	struct node_agent *a = arg;

	if (a->ver == NULL)
		return;
	a->full_failed_v = a->ver->version;
	agent_version_fail(a, "%s", why);
}

int node_agent_new(struct event_base *base, const struct node_agent_opts *o,
		   struct node_agent **out, struct proto_err *err)
{
	struct node_agent *a = calloc(1, sizeof(*a));
	uint8_t addr[FAB_ADDR_MAX];
	size_t alen;
	int rc;

	*out = NULL;
	if (a == NULL || sodium_init() < 0) {
		free(a);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	a->o = *o;
	a->base = base;
	a->trk = o->shared->trk;
	a->fab = o->shared->fab;
	proto_model_init(&a->model);
	if ((rc = node_rank_metrics_init(&a->am, o->metrics, o->replica, o->rank)) != 0) {
		proto_errf(err, -rc, "metrics: cannot register the node's series");
		goto fail;
	}
	snprintf(a->node_id, sizeof(a->node_id), "%s/%u", o->replica, o->rank);
	if (o->host != NULL)
		snprintf(a->host, sizeof(a->host), "%s", o->host);
	else if (gethostname(a->host, sizeof(a->host)) != 0)
		snprintf(a->host, sizeof(a->host), "unknown");
	rc = proto_model_load(o->model, &a->model, err);
	if (rc == 0)
		rc = load_layout(a, err);
	if (rc == 0)
		rc = proto_key_load_public(o->trainer_pubkey, a->trainer_pk, err);
	if (rc == 0)
		rc = node_store_open(o->store ? o->store : "auto", &a->store, err);
	if (rc != 0)
		goto fail;
	node_store_spread(&a->store, o->store_index);
	node_store_keep_spare(&a->store); /* the retired version's slot makes the next one */
	rc = fab_getname(a->fab, addr, sizeof(addr), &alen);
	if (rc != 0) {
		proto_errf(err, -rc, "fabric: cannot read our address");
		goto fail;
	}
	sodium_bin2hex(a->fabric_hex, sizeof(a->fabric_hex), addr, alen);

	/* The layers: the fetcher reads chunks, the swarm serves them and
	 * reads peers' pages and other layouts, the rebuild builds deltas. */
	struct fetcher_opts fo = {
		.base = base,
		.id = a->node_id,
		.rank = o->rank,
		.layout = &a->layout,
		.store = &a->store,
		.trk = a->trk,
		.fab = o->shared->fab,
		.fl = o->shared->fl,
		.hfab = o->shared->hfab,
		.hfl = o->shared->hfl,
		.sources = o->shared->sources,
		.sources_ctx = o->shared->sources_ctx,
		.am = &a->am,
	};
	swarm_hooks(&a->sw, &fo.hooks);
	fo.hooks.agent = a;
	fo.hooks.parcel_landed = on_parcel_landed;
	fo.hooks.complete = agent_version_fetched;
	fo.hooks.banned = on_banned;
	if ((rc = fetcher_init(&a->fx, &fo, err)) != 0)
		goto fail;
	struct swarm_opts so = {
		.x = &a->fx,
		.model = &a->model,
		.install_inplace = o->install_inplace,
		.active = &a->active,
		.registered = &a->registered,
		.refuse = on_refuse,
		.arg = a,
	};
	if ((rc = swarm_init(&a->sw, &so, err)) != 0)
		goto fail;
	a->retry_ev = evtimer_new(base, agent_on_retry, a);
	a->heartbeat_ev = evtimer_new(base, agent_heartbeat, a);
	a->sync_ev = evtimer_new(base, agent_on_sync_timer, a);
	a->tick_ev = event_new(base, -1, EV_PERSIST, agent_on_tick, a);
	if (a->retry_ev == NULL || a->heartbeat_ev == NULL || a->sync_ev == NULL ||
	    a->tick_ev == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	agent_poke_open(a);
	if (o->expose_dir != NULL) {
		struct proto_err xerr;
		/* Not fatal: activation reports the failure until it works. */
		if (proto_mkdir_p(o->expose_dir, &xerr) != 0)
			LOG_WARN("node %s: --expose: %s", a->node_id, xerr.msg);
	}
	if (o->attach_path != NULL) {
		struct node_attach_info ai = {
			.replica = o->replica,
			.rank = o->rank,
			.spec = &a->layout.ranks[o->rank],
			.layout_digest = a->layout.digest,
			.store = &a->store,
			/* An FP8 layout's pieces index its own model. */
			.model = proto_layout_model(&a->model, &a->layout),
			.in_place = o->install_inplace,
			.perm = o->attach_perm,
		};
		if ((rc = node_attach_new(base, o->attach_path, &ai, &a->attach, err)) != 0)
			goto fail;
	}
	struct delta_opts dopts = {
		.x = &a->fx,
		.model = &a->model,
		.install_inplace = o->install_inplace,
		.attach = a->attach,
		.active = &a->active,
		.active_digest = a->active_digest,
		.plan = &a->plan,
		.plan_src = a->plan_src,
	};
	delta_init(&a->ds, &dopts);
	*out = a;
	return 0;
fail:
	/* The shared endpoint stays open: close the regions we registered
	 * (node_agent_free expects the endpoint closed). */
	fetcher_close_regions(&a->fx);
	swarm_close_regions(&a->sw);
	node_agent_stop(a);
	node_agent_free(a);
	return rc;
}

void node_agent_start(struct node_agent *a)
{
	struct timeval tick = {0, 100000};

	event_add(a->tick_ev, &tick);
	agent_start_register(a);
	delta_warm(&a->ds);
}

const uint8_t *node_agent_layout_digest(const struct node_agent *a)
{
	return a->layout.digest;
}

void node_agent_chain_lost(struct node_agent *a, const char *why)
{
	agent_on_chain_lost(a, why);
}

int node_agent_failed(const struct node_agent *a, struct proto_err *err)
{
	if (a->fatal && err != NULL)
		*err = a->fatal_err;
	return a->fatal;
}

uint64_t node_agent_active(const struct node_agent *a)
{
	return a->active ? a->active->version : 0;
}

void node_agent_stop(struct node_agent *a)
{
	if (a == NULL)
		return;
	/* Timers first; then the version is detached: the read callbacks
	 * that the shared fab_close runs see no fetch and return. */
	if (a->tick_ev)
		event_free(a->tick_ev);
	if (a->sync_ev)
		event_free(a->sync_ev);
	if (a->heartbeat_ev)
		event_free(a->heartbeat_ev);
	if (a->retry_ev)
		event_free(a->retry_ev);
	if (a->leave_ev)
		event_free(a->leave_ev);
	agent_poke_close(a);
	a->tick_ev = a->sync_ev = a->heartbeat_ev = a->retry_ev = a->leave_ev = NULL;
	fetcher_stop(&a->fx);
	a->stopped_ver = a->ver;
	a->ver = NULL;
}

void node_agent_free(struct node_agent *a)
{
	if (a == NULL)
		return;
	/* The host closed the shared endpoint (cancelling our reads, closing
	 * our regions) after node_agent_stop; now the memory reads could land
	 * in, the specs. The tracker client is the host's too. No verifier
	 * worker touches a fetch once the fetcher is quiesced. */
	struct agent_version *v = a->stopped_ver;
	a->stopped_ver = NULL;
	a->fab = NULL;
	fetcher_quiesce(&a->fx);
	if (v != NULL) {
		delta_build_fini(&v->db);
		swarm_release(&a->sw, v->f);
	}
	agent_version_asks_fini(a);
	agent_chain_end(a, false);
	delta_fini(&a->ds);
	swarm_fini(&a->sw);
	fetcher_fini(&a->fx); /* the read pool, pacing records, kept connections, wires */
	agent_inplace_fini(a);
	agent_unexpose(a); /* the memory it names goes now */
	node_attach_free(a->attach); /* frees the slots only requests kept */
	if (a->active != NULL)
		node_slot_free(&a->store, a->active);
	node_store_close(&a->store);
	a->trk = NULL;
	if (a->have_plan)
		proto_plan_fini(&a->plan);
	json_decref(a->layout_json);
	proto_layout_fini(&a->layout);
	proto_model_fini(&a->model);
	free(a);
}
