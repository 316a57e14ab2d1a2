/* The node agent's tracker session: register, keep the lease, watch for
 * versions, ask for the replica's target, report progress. Tracker I/O
 * only: what a target means for a version is version.c's. */
#include "node/agent/internal.h"

static void start_watch(struct node_agent *a);

/* Registration refused for good: the agent stops, its loop exits. */
static void agent_give_up(struct node_agent *a, const char *why)
{
	a->fatal = 1;
	snprintf(a->fatal_err.msg, sizeof(a->fatal_err.msg), "%s", why);
	node_rank_metrics_health(&a->am, false, why);
	event_base_loopexit(a->base, NULL);
}


uint64_t agent_needs_fix(struct node_agent *a, const char *why, uint64_t max_ms)
{
	char who[sizeof(a->node_id) + 8];

	snprintf(who, sizeof(who), "node %s", a->node_id);
	uint64_t wait = node_fix_needed(&a->fix, who, why, FAILED_RETRY_MS, max_ms);
	node_rank_metrics_needs_fix(&a->am, a->fix.why);
	return wait;
}

void agent_fixed(struct node_agent *a)
{
	char who[sizeof(a->node_id) + 8];

	snprintf(who, sizeof(who), "node %s", a->node_id);
	if (node_fix_over(&a->fix, who))
		node_rank_metrics_needs_fix(&a->am, NULL);
}

/* The tracker forgot the chain this node saw (its answers are refused
 * until it has it again): keep serving the active version, say so. */
void agent_on_chain_lost(void *arg, const char *why)
{
	struct node_agent *a = arg;

	if (why != NULL)
		node_rank_metrics_health(&a->am, false, why);
	else if (a->registered)
		node_rank_metrics_health(&a->am, true, NULL);
}

static void ignore_answer(const struct trk_answer *ans, void *arg)
{
	if (ans->status < 0 || ans->status >= 400)
		LOG_DEBUG("tracker: %d %s", ans->status, ans->error);
}

void agent_report(struct node_agent *a, uint64_t version, enum trk_rank_state st,
		   const char *error, trk_client_cb cb)
{
	struct agent_version *v = a->ver;
	struct fetch *f = v != NULL ? v->f : NULL;
	uint8_t sig[TRK_STMT_SIG_BYTES];
	const uint8_t *digest = NULL;
	const char *banned[BANS_MAX];
	/* Replaying a chain, the steps speak for the target, with what the
	 * steps before took (chain.c). */
	const struct agent_chain *c = a->chain;
	bool step = c != NULL && f != NULL && f->version == version && version != c->target;
	if (step)
		version = c->target;
	struct trk_state_report r = {
		.id = a->node_id,
		.version = version,
		.state = st,
		.error = error,
	};
	/* Holding a version is claimed with a signed statement. */
	if (f != NULL && f->version == version && f->have_man)
		digest = f->man.digest;
	else if (a->active != NULL && a->active->version == version)
		digest = a->active_digest;
	if (digest != NULL && (st == TRK_STATE_VERIFIED || st == TRK_STATE_ACTIVE)) {
		trk_statement_sign(a->stmt_sk, a->o.replica, a->o.rank, version, digest, sig);
		r.statement = sig;
	}
	if (f != NULL && (f->version == version || step)) {
		bool chained = c != NULL && c->target == version;
		r.bytes_done = f->bytes_done + (chained ? c->done : 0);
		r.bytes_total = chained ? PROTO_MAX(c->wire, r.bytes_done) : f->bytes_total;
		r.bytes_from_trainer = f->from_trainer + (chained ? c->from_trainer : 0);
		r.bytes_from_peers = f->from_peers + (chained ? c->from_peers : 0);
		r.duplicate_bytes = f->duplicate + (chained ? c->duplicate : 0);
		r.refetched_bytes = f->refetched + (chained ? c->refetched : 0);
		r.bytes_from_other_sites = f->from_other_sites + (chained ? c->from_other_sites : 0);
		r.first_byte_ms = f->first_byte_ms;
		r.last_byte_ms = f->last_byte_ms;
		r.nbanned = fetch_bans(f, banned, BANS_MAX);
		r.banned = banned;
		if (agent_verified_stage(v))
			r.how = chained ? "chain" : f->delta ? "delta" : "full";
	} else if (a->active != NULL && a->active->version == version) {
		r.bytes_done = r.bytes_total = a->active->len;
	}
	r.need_anchor = a->need_anchor && st == TRK_STATE_FAILED;
	if (!a->registered)
		return;
	r.seq = ++a->report_seq;
	if (trk_client_report_state(a->trk, &r, cb ? cb : ignore_answer, a) != 0)
		LOG_WARN("node %s: could not report %s for v%" PRIu64, a->node_id,
			 trk_state_name(st), version);
}

/* Names the ranks of our replica that do not hold the version we verified. */
static void note_replica_wait(struct node_agent *a, const struct trk_answer *ans)
{
	char missing[256] = "";
	size_t n = 0, i;
	json_t *r;

	json_array_foreach(json_object_get(ans->json, "ranks"), i, r)
	{
		const char *st = json_string_value(json_object_get(r, "state"));
		uint64_t v = (uint64_t)json_integer_value(json_object_get(r, "version"));
		bool alive = json_is_true(json_object_get(r, "alive"));
		if (alive && v == a->ver->version && st != NULL &&
		    (strcmp(st, "verified") == 0 || strcmp(st, "active") == 0))
			continue;
		n += (size_t)snprintf(missing + n, n < sizeof(missing) ? sizeof(missing) - n : 0,
				      "%s%lld (%s)", n ? ", " : "",
				      (long long)json_integer_value(json_object_get(r, "rank")),
				      !alive ? (json_is_null(json_object_get(r, "id")) ? "never registered" : "dead")
					     : st ? st : "?");
	}
	node_wait_note(&a->wait, node_now_ms(), a->node_id, "replica",
		       "the rest of replica %s to verify v%" PRIu64 "%s%s", a->o.replica,
		       a->ver->version, missing[0] ? "; not yet: rank " : "",
		       ans->status == 200 ? missing : ans->error);
}

static bool in_list(json_t *arr, uint64_t v)
{
	size_t i;
	json_t *e;

	json_array_foreach(arr, i, e)
		if (json_is_integer(e) && (uint64_t)json_integer_value(e) == v)
			return true;
	return false;
}

static void on_sync(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	uint64_t t;
	bool complete;

	a->syncing = false;
	if (ans->status != 200 || !json_is_integer(json_object_get(ans->json, "target")))
		return;
	t = (uint64_t)json_integer_value(json_object_get(ans->json, "target"));
	complete = in_list(json_object_get(ans->json, "complete"), t);
	agent_rlog_sync(a, ans->json, t);
	agent_follow_target(a, t, complete, json_object_get(ans->json, "target_statements"));
	if (!complete && a->ver != NULL && agent_verified_stage(a->ver) && a->ver->version == t)
		note_replica_wait(a, ans);
}

/* Asks the tracker for the replica (its target and where it is complete). */
void agent_sync_now(struct node_agent *a)
{
	if (!a->registered || a->syncing)
		return;
	if (trk_client_replica(a->trk, a->o.replica, on_sync, a) == 0)
		a->syncing = true;
}

/*
 * How soon to ask again for the replica: a verified rank waits for its
 * siblings, who mostly verify within a few ms of it (the same delta, the
 * same bytes), so it asks after a quarter of what it has waited so far,
 * REPLICA_POLL_MIN_MS at first and REPLICA_POLL_MS at most: a switch then
 * follows the last sibling's verification by ~a quarter of the wait, not
 * by up to a whole period, and a long wait costs the tracker no more than
 * the fixed period did.
 */
uint64_t agent_sync_period(const struct node_agent *a)
{
	const struct agent_version *v = a->ver;

	if (v == NULL || !agent_verified_stage(v))
		return SYNC_MS;
	return PROTO_MAX(REPLICA_POLL_MIN_MS,
			 PROTO_MIN(REPLICA_POLL_MS, (node_now_ms() - v->verified_ms) / 4));
}

void agent_on_sync_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	agent_sync_now(a);
	agent_ready_ahead(a);
	node_arm(a->sync_ev, agent_sync_period(a));
}

static void on_watch(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct trk_version_info *vs = NULL;
	struct proto_err err;
	uint64_t latest = 0, now_ms = 0;
	size_t n = 0;

	a->watching = false;
	if (ans->status == 200 && trk_versions_now(ans->json, &now_ms, &err) == 0 &&
	    trk_versions_parse(ans->json, &latest, &vs, &n, &err) == 0) {
		if (latest > a->seen) {
			a->seen_wall_ms = proto_wall_ms();
			agent_note_fresh(a, latest, now_ms, vs, n);
			agent_rlog_published(a, vs, n, now_ms);
		}
		free(vs);
		a->seen = PROTO_MAX(a->seen, latest);
		node_wait_over(&a->wait, "tracker");
	} else {
		LOG_DEBUG("node %s: watch: %s", a->node_id, ans->status == 200 ? err.msg : ans->error);
		node_wait_note(&a->wait, node_now_ms(), a->node_id, "tracker", "the tracker at %s (%s)",
			       a->o.tracker_url, ans->status == 200 ? err.msg : ans->error);
		node_arm(a->retry_ev, RETRY_MS);
		return;
	}
	if (a->seen == 0)
		node_wait_note(&a->wait, node_now_ms(), a->node_id, "version",
			       "a first version (registered; the tracker has none yet)");
	else
		node_wait_over(&a->wait, "version");
	/* A new version may move the replica's target: ask now; it may
	 * withdraw the steps of a chain being replayed. */
	agent_sync_now(a);
	agent_chain_check(a);
	start_watch(a);
}

static void start_watch(struct node_agent *a)
{
	if (!a->registered || a->watching)
		return;
	const struct node_agent_shared *sh = a->o.shared;
	uint32_t wait_ms = (uint32_t)proto_param(PROTO_PARAM_WATCH_MS);
	if ((sh->watch != NULL ? sh->watch(sh->watch_ctx, a->seen, wait_ms, on_watch, a)
			       : trk_client_watch(a->trk, a->seen, wait_ms, on_watch, a)) != 0)
		node_arm(a->retry_ev, RETRY_MS);
	else
		a->watching = true;
}

/* The next heartbeat in a third of a lease, unless the host sends it. */
static void arm_heartbeat(struct node_agent *a)
{
	if (!a->o.shared->host_heartbeat)
		node_arm(a->heartbeat_ev, PROTO_MAX(a->lease_ms / 3, 100));
}

bool node_agent_lease_lost(struct node_agent *a)
{
	/* Expired or the tracker restarted: register again. */
	if (a->leaving || !a->registered)
		return false;
	a->registered = false;
	proto_metrics_set(a->am.m, a->am.registered, 0);
	node_rank_metrics_health(&a->am, false, "lease lost; registering again");
	agent_start_register(a);
	return true;
}

static void on_heartbeat(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;

	if (ans->status == 404) {
		if (node_agent_lease_lost(a))
			LOG_WARN("lease lost for rank %s; registering again", a->node_id);
		return;
	}
	arm_heartbeat(a);
}

/* What serving processes pin here, per version (the tracker shows it per
 * rank: which versions requests are running on). */
static size_t held_pins(struct node_agent *a, struct trk_pin_count pins[TRK_PIN_VERSIONS_MAX])
{
	struct node_attach_count held[TRK_PIN_VERSIONS_MAX];
	size_t n = node_attach_held(a->attach, held, TRK_PIN_VERSIONS_MAX);

	for (size_t i = 0; i < n; i++)
		pins[i] = (struct trk_pin_count){held[i].version, held[i].requests, held[i].pins};
	return n;
}

bool node_agent_heartbeat_entry(struct node_agent *a, struct trk_hb_node *e)
{
	if (a->leaving || !a->registered)
		return false;
	e->id = a->node_id;
	e->npins = held_pins(a, e->pins);
	return true;
}

void agent_heartbeat(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	struct trk_pin_count pins[TRK_PIN_VERSIONS_MAX];

	if (a->leaving)
		return;
	size_t n = held_pins(a, pins);
	if (trk_client_heartbeat_pins(a->trk, a->node_id, pins, n, on_heartbeat, a) != 0)
		arm_heartbeat(a);
}

/*
 * The tracker serves another model than ours: nothing changes that until a
 * person starts this node with the trainer's model (or the trainer is
 * restarted with this one, on a tracker without versions). Say what to do,
 * once, at the default level; ask again ever more slowly (doubling from
 * RETRY_MS up to MODEL_RETRY_MAX_MS), not every RETRY_MS.
 */
#define MODEL_RETRY_MAX_MS 10000
static void model_refused(struct node_agent *a, const char *error)
{
	uint64_t every = RETRY_MS << PROTO_MIN(a->model_refusals, 5u);
	char ours[2 * PROTO_HASH_BYTES + 1];

	every = PROTO_MIN(every, (uint64_t)MODEL_RETRY_MAX_MS);
	if (a->model_refusals++ == 0) {
		sodium_bin2hex(ours, sizeof(ours), a->model.digest, PROTO_HASH_BYTES);
		LOG_WARN("node %s: the tracker at %s serves a different model than this node's "
			 "(%s; ours is %s): start the node with the trainer's model; "
			 "`tessera model --tracker %s` prints it. Asking again every %u s at most",
			 a->node_id, a->o.tracker_url, error, ours, a->o.tracker_url,
			 MODEL_RETRY_MAX_MS / 1000);
	}
	node_wait_note(&a->wait, node_now_ms(), a->node_id, "tracker",
		       "the tracker to accept our model (it serves another: `tessera model "
		       "--tracker %s` prints it)",
		       a->o.tracker_url);
	node_arm(a->retry_ev, every);
}

/*
 * No model known yet at the tracker: a publisher starting heals it, so at
 * first the node only waits; after TESSERA_WAIT_NOTICE_MS a person should
 * look (no publisher running, or the tracker refused its model: another
 * model's versions in its --state): said once on /healthz and at warn,
 * asked again ever more slowly, up to MODEL_RETRY_MAX_MS (the node joins
 * soon after a publisher does). Returns whether it was said so.
 */
#define NO_MODEL "no model known yet"
static bool no_model(struct node_agent *a, const struct trk_answer *ans)
{
	const char *refused = strstr(ans->error, "the tracker refused");
	uint64_t now = node_now_ms();
	char why[512];

	if (a->no_model_ms == 0)
		a->no_model_ms = now;
	if (now - a->no_model_ms < proto_param(PROTO_PARAM_WAIT_NOTICE_MS))
		return false;
	if (refused != NULL) { /* its words, less " (retry)" */
		size_t n = strlen(refused), r = strlen(" (retry)");
		if (n >= r && strcmp(refused + n - r, " (retry)") == 0)
			n -= r;
		snprintf(why, sizeof(why), NO_MODEL ": %.*s: start the tracker on an empty --state, "
			 "or the publisher with the model of its versions (tracker %s)",
			 (int)PROTO_MIN(n, 300u), refused, a->o.tracker_url);
	} else {
		snprintf(why, sizeof(why), NO_MODEL ": no publisher has registered one at the "
			 "tracker %s (is the publisher running? its log says why it was refused)",
			 a->o.tracker_url);
	}
	node_arm(a->retry_ev, agent_needs_fix(a, why, MODEL_RETRY_MAX_MS));
	return true;
}

static void on_register(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	const char *id;

	if (ans->status == 200 || ans->status == 201) {
		a->model_refusals = 0;
		a->no_model_ms = 0;
		agent_fixed(a);
		id = json_string_value(json_object_get(ans->json, "node_id"));
		if (id != NULL) /* the tracker's name for us (never onto itself) */
			snprintf(a->node_id, sizeof(a->node_id), "%s", id);
		a->lease_ms = (uint64_t)json_integer_value(json_object_get(ans->json, "lease_ms"));
		if (a->lease_ms == 0)
			a->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
		a->registered = true;
		a->said_live = false;
		swarm_registered(&a->sw);
		proto_metrics_set(a->am.m, a->am.registered, 1);
		node_rank_metrics_health(&a->am, true, NULL);
		node_wait_over(&a->wait, "tracker");
		LOG_INFO("node %s: registered (lease %" PRIu64 " ms)", a->node_id, a->lease_ms);
		agent_ready_ahead(a);
		arm_heartbeat(a);
		/* What we hold is still good: say so again after a re-register. */
		if (a->active != NULL)
			agent_report(a, a->active->version, TRK_STATE_ACTIVE, NULL, NULL);
		/* The tracker forgot our reports: a verified version says so again. */
		if (a->ver != NULL)
			a->ver->reported_verified = false;
		start_watch(a);
		if (!evtimer_pending(a->sync_ev, NULL))
			node_arm(a->sync_ev, 0);
		return;
	}
	/* https:// to a plain tracker, a CA that does not verify it, a host
	 * that does not resolve, another cluster key than the tracker's (or
	 * none where it wants one): said once, on /healthz, asked ever more
	 * slowly (the tracker may yet be restarted with the right settings). */
	if (ans->fix) {
		node_arm(a->retry_ev, agent_needs_fix(a, ans->error, FIX_RETRY_MAX_MS));
		return;
	}
	if (ans->status == 400 || ans->status == 401 || ans->status == 403) {
		char why[600];
		snprintf(why, sizeof(why), "registration refused: %s", ans->error);
		agent_give_up(a, why);
		return;
	}
	if (ans->status == 409 && strstr(ans->error, NO_MODEL) != NULL) {
		if (no_model(a, ans))
			return;
	} else {
		a->no_model_ms = 0;
		if (strncmp(a->fix.why, NO_MODEL, strlen(NO_MODEL)) == 0)
			agent_fixed(a); /* a model is known now */
	}
	if (ans->status == 409 && strstr(ans->error, "model_digest differs") != NULL) {
		model_refused(a, ans->error);
		return;
	}
	a->model_refusals = 0;
	/* Killed without leaving (SIGKILL), the previous process of this rank
	 * still holds the id until its lease ends: said once, not after
	 * TESSERA_WAIT_NOTICE_MS (a lease is shorter). */
	if (ans->status == 409 && strstr(ans->error, "is live") != NULL && !a->said_live) {
		a->said_live = true;
		LOG_WARN("node %s: the tracker still holds %s live (a previous process that did not "
			 "leave): registering once its lease there ends",
			 a->node_id, a->node_id);
	}
	/* 409 (no model yet) or the tracker is not up: try again. */
	LOG_DEBUG("node %s: registration: %d %s; retrying", a->node_id, ans->status, ans->error);
	if (ans->status <= 0)
		node_wait_note(&a->wait, node_now_ms(), a->node_id, "tracker", "the tracker at %s (%s)",
			       a->o.tracker_url, ans->error);
	else
		node_wait_note(&a->wait, node_now_ms(), a->node_id, "tracker",
			       "the tracker to accept our registration (%s)", ans->error);
	node_arm(a->retry_ev, RETRY_MS);
}

void agent_start_register(struct node_agent *a)
{
	struct trk_node_reg r = {
		.replica = a->o.replica,
		.addr = {.rank = a->o.rank, .host = a->host, .provider = fab_provider(a->fab),
			 .fabric_addr = a->fabric_hex},
		.layout = a->layout_json,
		.model_digest = a->model.digest,
		.layout_name = a->layout_name[0] ? a->layout_name : NULL,
		.layout_digest = a->layout.digest,
		.statement_key = a->stmt_pk,
	};
	if (a->leaving)
		return;
	/* A key per registration: statements speak for this session only. */
	crypto_sign_keypair(a->stmt_pk, a->stmt_sk);
	if (trk_client_register_node(a->trk, &r, on_register, a) != 0)
		node_arm(a->retry_ev, RETRY_MS);
}

void agent_on_retry(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	if (!a->registered)
		agent_start_register(a);
	else
		start_watch(a);
}
