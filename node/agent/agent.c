/* The node agent: setup, teardown and shared helpers (see agent.h). */
#include "node/agent/agent_internal.h"

uint64_t agent_now_ms(void)
{
	return proto_now_ns() / 1000000;
}

void agent_arm(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	event_add(ev, &tv);
}

void agent_give_up(struct node_agent *a, const char *why)
{
	a->fatal = 1;
	snprintf(a->fatal_err.msg, sizeof(a->fatal_err.msg), "%s", why);
	node_agent_metrics_health(&a->am, false, why);
	event_base_loopexit(a->base, NULL);
}

/* The name the status page shows for our layout: a built-in's own ("tp2"),
 * a file's name without directory and .json; "" when it has other
 * characters than the tracker takes ([A-Za-z0-9._-]). */
void agent_layout_name(const char *arg, char *out, size_t len)
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
		    base[i] != '.')
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
	agent_layout_name(s, a->layout_name, sizeof(a->layout_name));
	return a->layout_json ? 0 : proto_errf(err, ENOMEM, "out of memory");
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
	a->fl = o->shared->fl;
	a->hfab = o->shared->hfab != NULL ? o->shared->hfab : a->fab;
	a->hfl = o->shared->hfab != NULL ? o->shared->hfl : a->fl;
	proto_model_init(&a->model);
	if ((rc = node_agent_metrics_init(&a->am, o->metrics, o->replica, o->rank)) != 0) {
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
	/* Read slots: twice the reads in flight, so reads moved off a silent
	 * source can keep their slots while replacements go out. */
	a->chunk_size = (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_CHUNK_SIZE), PROTO_CHUNK_SIZE_MAX);
	a->max_inflight = (uint32_t)PROTO_MAX(1, PROTO_MIN(proto_param(PROTO_PARAM_INFLIGHT), 256));
	a->nreads = 2 * a->max_inflight;
	a->reads = calloc(a->nreads, sizeof(*a->reads));
	/* Read buffers are reused for every chunk: map them populated. */
	a->bounce_len = ((size_t)a->nreads * a->chunk_size + 4095) / 4096 * 4096;
	a->bounce = mmap(NULL, a->bounce_len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (a->bounce == MAP_FAILED)
		a->bounce = NULL;
	if (a->reads == NULL || a->bounce == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory for %u read buffers", a->nreads);
		goto fail;
	}
	rc = fab_mr_reg(a->fab, a->bounce, (size_t)a->nreads * a->chunk_size, FAB_MR_READ,
			&a->bounce_mr);
	if (rc != 0) {
		proto_errf(err, -rc, "fabric: cannot register read buffers");
		goto fail;
	}
	if ((rc = agent_swarm_init(a)) != 0) {
		proto_errf(err, -rc, "fabric: cannot set up have-page reads");
		goto fail;
	}
	a->ver = node_verifier_new(base, node_verifier_threads(),
				   agent_on_verified, a);
	a->rate_bps = proto_param(PROTO_PARAM_FETCH_MBPS) * 1000000ull / 8;
	a->rate_ev = evtimer_new(base, agent_on_rate, a);
	a->retry_ev = evtimer_new(base, agent_on_retry, a);
	a->heartbeat_ev = evtimer_new(base, agent_heartbeat, a);
	a->sync_ev = evtimer_new(base, agent_on_sync_timer, a);
	a->tick_ev = event_new(base, -1, EV_PERSIST, agent_on_tick, a);
	if (a->ver == NULL || a->rate_ev == NULL || a->retry_ev == NULL || a->heartbeat_ev == NULL ||
	    a->sync_ev == NULL || a->tick_ev == NULL) {
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
		};
		if ((rc = node_attach_new(base, o->attach_path, &ai, &a->attach, err)) != 0)
			goto fail;
	}
	*out = a;
	return 0;
fail:
	/* The shared endpoint stays open: close the regions we registered
	 * (node_agent_free expects the endpoint closed). */
	if (a->bounce_mr != NULL)
		fab_mr_close(a->bounce_mr);
	if (a->hpool_mr != NULL)
		fab_mr_close(a->hpool_mr);
	a->bounce_mr = a->hpool_mr = NULL;
	node_agent_stop(a);
	node_agent_free(a);
	return rc;
}

void node_agent_start(struct node_agent *a)
{
	struct timeval tick = {0, 100000};

	event_add(a->tick_ev, &tick);
	agent_start_register(a);
	agent_delta_warm(a);
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
	/* Timers first; then the fetch is detached: the read callbacks that
	 * the shared fab_close runs see no fetch and return. */
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
	if (a->rate_ev)
		event_free(a->rate_ev);
	agent_poke_close(a);
	a->tick_ev = a->sync_ev = a->heartbeat_ev = a->retry_ev = a->leave_ev = a->rate_ev = NULL;
	a->stopped_fetch = a->fetch;
	a->fetch = NULL;
}

void node_agent_free(struct node_agent *a)
{
	if (a == NULL)
		return;
	/* The host closed the shared endpoint (cancelling our reads, closing
	 * our regions) after node_agent_stop; now the memory reads could land
	 * in, the specs. The tracker client is the host's too. */
	struct agent_fetch *f = a->stopped_fetch;
	a->stopped_fetch = NULL;
	a->fab = a->hfab = NULL;
	a->fl = a->hfl = NULL;
	node_verifier_free(a->ver); /* no worker touches the fetch after this */
	a->ver = NULL;
	agent_fetch_free(a, f);
	agent_fetch_asks_fini(a);
	agent_delta_fini(a);
	agent_swarm_fini(a);
	agent_xl_fini(a);
	agent_hosts_fini(a);
	agent_warm_fini(a); /* fab_close gave its handles back, as the sources' */
	if (a->bounce != NULL)
		munmap(a->bounce, a->bounce_len);
	free(a->reads);
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
	json_decref(a->members_memo);
	proto_layout_fini(&a->layout);
	proto_model_fini(&a->model);
	free(a);
}
