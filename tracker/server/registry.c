/* Soft state: entry lifetime, lookups, leases, and what derives from them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

#define PRUNE_LEASES 50       /* gone entries are forgotten after this many leases */

/* ---- lifetime helpers ---------------------------------------------------- */

void trk__node_free(struct trk_node *n)
{
	if (n == NULL)
		return;
	free(n->host);
	free(n->provider);
	free(n->addr);
	trk__offers_clear(&n->offers);
	free(n);
}

static void replica_free(struct trk_registry *r, struct trk_replica *rep)
{
	trk__repindex_del(r, rep);
	for (uint32_t i = 0; i < rep->nranks; i++)
		trk__node_free(rep->ranks[i]);
	free(rep->ranks);
	trk__slayout_put(r, rep->layout);
	free(rep);
}

void trk__publisher_free(struct trk_publisher *p)
{
	for (size_t i = 0; i < p->nranks; i++) {
		free(p->ranks[i].host);
		free(p->ranks[i].provider);
		free(p->ranks[i].addr);
	}
	free(p->ranks);
	trk__offers_clear(&p->offers);
	free(p);
}

static void drop_replicas(struct trk_registry *r)
{
	while (r->reps != NULL) {
		struct trk_replica *rep = r->reps;
		r->reps = rep->next;
		replica_free(r, rep);
	}
}

void trk__registry_drop_model(struct trk_registry *r)
{
	trk__registry_members_changed(r);
	trk__slayout_cache_clear(r); /* forms were parsed against the model */
	drop_replicas(r);
	if (r->have_model) {
		proto_layout_fini(&r->tlayout);
		proto_model_fini(&r->model);
	}
	json_decref(r->model_json);
	json_decref(r->tlayout_json);
	r->model_json = r->tlayout_json = NULL;
	r->have_model = false;
}

int trk__registry_new(struct trk_server *s, struct trk_registry **out)
{
	struct trk_registry *r = calloc(1, sizeof(*r));

	*out = r;
	if (r == NULL)
		return -ENOMEM;
	r->s = s;
	if (trk__repindex_init(r) != 0 || trk__srcache_new(&r->srcache) != 0 ||
	    trk__timeline_new(&r->tl) != 0) {
		trk__srcache_free(r->srcache);
		trk__repindex_fini(r);
		free(r);
		*out = NULL;
		return -ENOMEM;
	}
	return 0;
}

void trk__registry_free(struct trk_registry *r)
{
	if (r == NULL)
		return;
	trk__registry_drop_model(r);
	while (r->pubs != NULL) {
		struct trk_publisher *p = r->pubs;
		r->pubs = p->next;
		trk__publisher_free(p);
	}
	trk__timeline_free(r->tl);
	trk__srcache_free(r->srcache);
	trk__repindex_fini(r);
	free(r);
}

bool trk__registry_model(const struct trk_registry *r, uint8_t *model_digest,
			 uint8_t *layout_digest)
{
	if (!r->have_model)
		return false;
	memcpy(model_digest, r->model.digest, PROTO_HASH_BYTES);
	memcpy(layout_digest, r->tlayout.digest, PROTO_HASH_BYTES);
	return true;
}

uint64_t trk__registry_lease_ns(const struct trk_registry *r)
{
	return r->s->lease_ms * 1000000ull;
}

/* ---- lookups and derived state -------------------------------------------- */

bool trk__replica_name_valid(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > TRK_REPLICA_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
			return false;
	}
	return true;
}

/* "A/0" -> the node, alive or not; NULL if there is none. */
struct trk_node *trk__node_find(struct trk_registry *r, const char *id)
{
	const char *slash = strrchr(id, '/');
	char name[TRK_REPLICA_MAX + 1];
	struct trk_replica *rep;
	uint64_t rank;

	if (slash == NULL || (size_t)(slash - id) > TRK_REPLICA_MAX)
		return NULL;
	memcpy(name, id, (size_t)(slash - id));
	name[slash - id] = 0;
	if (proto_parse_u64(slash + 1, 0, PROTO_MAX_RANKS - 1, &rank) != 0)
		return NULL;
	rep = trk__replica_find(r, name);
	if (rep == NULL || rank >= rep->nranks)
		return NULL;
	return rep->ranks[rank];
}

struct trk_publisher *trk__publisher_find(struct trk_registry *r, const char *id)
{
	for (struct trk_publisher *p = r->pubs; p; p = p->next)
		if (strcmp(p->id, id) == 0)
			return p;
	return NULL;
}

struct trk_nver *trk__node_version(struct trk_node *n, uint64_t v)
{
	for (size_t i = 0; i < n->nvers; i++)
		if (n->vers[i].version == v)
			return &n->vers[i];
	return NULL;
}

/* The node holds v whole: it reported v verified or active. */
bool trk__node_holds(struct trk_node *n, uint64_t v)
{
	struct trk_nver *e;

	if (n == NULL || !n->alive)
		return false;
	e = trk__node_version(n, v);
	return e != NULL &&
	       (e->state == TRK_STATE_VERIFIED || e->state == TRK_STATE_ACTIVE);
}

bool trk__replica_alive(const struct trk_replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (rep->ranks[i] != NULL && rep->ranks[i]->alive)
			return true;
	return false;
}

bool trk__replica_whole(const struct trk_replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (rep->ranks[i] == NULL || !rep->ranks[i]->alive)
			return false;
	return rep->nranks > 0;
}

/* Complete at v: every rank alive and holding v (model-parallel
 * consistency: a replica is only as complete as its least rank). */
bool trk__replica_complete(const struct trk_replica *rep, uint64_t v)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (!trk__node_holds(rep->ranks[i], v))
			return false;
	return rep->nranks > 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The versions a replica is complete at, ascending, into out[TRK__NODE_VERSIONS];
 * returns how many. Rank 0's versions are the candidates. */
size_t trk__replica_complete_list(const struct trk_replica *rep, uint64_t *out)
{
	struct trk_node *n0 = rep->nranks > 0 ? rep->ranks[0] : NULL;
	size_t k = 0;

	if (n0 == NULL)
		return 0;
	for (size_t i = 0; i < n0->nvers; i++)
		if (trk__replica_complete(rep, n0->vers[i].version))
			out[k++] = n0->vers[i].version;
	qsort(out, k, sizeof(*out), cmp_u64);
	return k;
}

/* ---- leases -------------------------------------------------------------- */

static void node_gone(struct trk_registry *r, struct trk_node *n, uint64_t now_ms,
		      const char *why)
{
	trk__registry_members_changed(r);
	n->alive = false;
	n->gone_ms = now_ms;
	LOG_INFO("node %s gone (%s)", n->id, why);
}

/* POST /nodes/leave: the node says it goes (SIGTERM). It is gone at once,
 * as if its lease had run out: never a source again, its replica
 * incomplete. Its offers go with it. */
void trk__handle_leave(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	struct trk_node *n;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	n = trk__node_find(r, id);
	if (n == NULL || !n->alive) {
		trk__fail(c, 404, "node %s is unknown or already gone", id);
		return;
	}
	node_gone(r, n, proto_wall_ms(), "left");
	trk__offers_clear(&n->offers);
	trk__registry_changed(r);
	trk__reply_json(c, 200, json_pack("{s:s,s:b}", "id", n->id, "left", 1));
}

uint64_t trk__registry_sweep_period_ns(const struct trk_registry *r)
{
	return PROTO_MAX(PROTO_MIN(r->s->lease_ms / 4, 500), 10) * 1000000ull;
}

void trk__registry_lease_granted(struct trk_registry *r, uint64_t exp_ns)
{
	r->sweep_due_ns = PROTO_MIN(r->sweep_due_ns, exp_ns);
}

void trk__registry_changed(struct trk_registry *r)
{
	r->sweep_due_ns = 0;
	r->targets_due_ns = 0;
	trk__registry_swarm_changed(r);
}

void trk__registry_swarm_changed(struct trk_registry *r)
{
	r->swarm_gen++;
}

void trk__registry_members_changed(struct trk_registry *r)
{
	r->members_gen++;
	r->swarm_gen++;
}

/* The monotonic time (ns) at which a gone entry is pruned. */
static uint64_t prune_at(uint64_t now, uint64_t now_ms, uint64_t gone_ms,
			 uint64_t prune_ms)
{
	uint64_t at_ms = gone_ms + prune_ms + 1; /* pruned once past it */
	return at_ms > now_ms ? now + (at_ms - now_ms) * 1000000ull : now;
}

void trk__registry_sweep(struct trk_registry *r)
{
	uint64_t now = proto_now_ns(), now_ms, prune_ms, due;

	if (now < r->sweep_due_ns)
		return;
	now_ms = proto_wall_ms();
	prune_ms = PRUNE_LEASES * r->s->lease_ms;
	due = now + trk__registry_sweep_period_ns(r);
	/* Every replica's target once a period (what moves with time alone,
	 * the ranks' disagreement, is judged against TESSERA_DISAGREE_MS,
	 * seconds); between,
	 * only those of replicas this sweep changed: at 1 000 replicas
	 * looking at all of them 16 times a second cost more than ending the
	 * leases. */
	bool targets = now >= r->targets_due_ns;
	if (targets)
		r->targets_due_ns = due;
	for (struct trk_publisher **pp = &r->pubs; *pp;) {
		struct trk_publisher *p = *pp;
		if (p->alive && now >= p->expires_ns) {
			p->alive = false;
			p->gone_ms = now_ms;
			trk__registry_swarm_changed(r);
			LOG_INFO("publisher %s gone (lease expired)", p->id);
		}
		if (!p->alive && now_ms > p->gone_ms + prune_ms) {
			*pp = p->next;
			trk__publisher_free(p);
			continue;
		}
		due = PROTO_MIN(due, p->alive ? p->expires_ns :
						prune_at(now, now_ms, p->gone_ms, prune_ms));
		pp = &p->next;
	}
	for (struct trk_replica **rp = &r->reps; *rp;) {
		struct trk_replica *rep = *rp;
		bool any = false, changed = targets;
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct trk_node *n = rep->ranks[i];
			if (n == NULL)
				continue;
			if (n->alive && now >= n->expires_ns) {
				node_gone(r, n, now_ms, "lease expired");
				changed = true;
			}
			if (!n->alive && now_ms > n->gone_ms + prune_ms) {
				trk__node_free(n);
				rep->ranks[i] = NULL;
				changed = true;
				continue;
			}
			due = PROTO_MIN(due, n->alive ? n->expires_ns :
							prune_at(now, now_ms, n->gone_ms, prune_ms));
			any = true;
		}
		if (!any) {
			*rp = rep->next;
			replica_free(r, rep);
			continue;
		}
		if (changed)
			trk__replica_update_target(r->s, rep);
		rp = &rep->next;
	}
	/* Heartbeats extend leases without moving the due time, so with
	 * thousands of nodes the earliest lease end seen is always a few ms
	 * away: walking at every one of them made each request O(nodes). A
	 * lease end is noticed within a 32nd of a lease (lease/4 at most
	 * 500 ms, over 8) instead. Changes marked by trk__registry_changed
	 * still sweep at the next request. */
	r->sweep_due_ns = PROTO_MAX(due, now + trk__registry_sweep_period_ns(r) / 8);
}

/* ---- POST /heartbeat ------------------------------------------------------ */

/* A heartbeat's "pins" (absent: *npc 0, *given false): every entry is
 * checked before any is kept. 0, or -EINVAL with err saying why. */
static int parse_pins(json_t *o, struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX], size_t *npc,
		      bool *given, struct proto_err *err)
{
	json_t *pins = json_object_get(o, "pins"), *e;
	size_t i;

	*npc = 0;
	*given = pins != NULL && !json_is_null(pins);
	if (!*given)
		return 0;
	if (!json_is_array(pins) || json_array_size(pins) > TRK_PIN_VERSIONS_MAX)
		return proto_errf(err, -EINVAL, "pins: must be an array of at most %d entries",
				  TRK_PIN_VERSIONS_MAX);
	json_array_foreach(pins, i, e) {
		uint64_t v = 0, k = 0, q = 0;
		struct proto_err fe = {{0}};
		if (!json_is_object(e) ||
		    trk__get_u64(e, "version", true, INT64_MAX, &v, &fe) != 0 ||
		    trk__get_u64(e, "pins", true, UINT32_MAX, &k, &fe) != 0 ||
		    trk__get_u64(e, "requests", true, INT64_MAX, &q, &fe) != 0)
			return proto_errf(err, -EINVAL, "pins[%zu]: %s", i,
					  json_is_object(e) ? fe.msg : "must be an object");
		pc[(*npc)++] = (struct trk_pin_count){v, q, (uint32_t)k};
	}
	return 0;
}

/* Renews node n's lease (and keeps its pins when given); false when it is
 * unknown or its lease ran out. Sweeps notice a lease end a little late
 * (trk__registry_sweep): a heartbeat after it never revives the node. */
static bool node_renew(struct trk_registry *r, struct trk_node *n, uint64_t now,
		       const struct trk_pin_count *pc, size_t npc, bool pins)
{
	if (n != NULL && n->alive && now >= n->expires_ns)
		node_gone(r, n, proto_wall_ms(), "lease expired");
	if (n == NULL || !n->alive)
		return false;
	if (pins) {
		memcpy(n->pins, pc, npc * sizeof(pc[0]));
		n->npins = npc;
		n->pins_ms = proto_wall_ms();
	}
	n->expires_ns = now + trk__registry_lease_ns(r);
	return true;
}

/*
 * {"nodes":[{"id":"A/0","pins":[..],"session":"hex"},..]}: one host renews
 * the leases of all its ranks in one request. Every entry is checked (and,
 * on a keyed tracker, every live node's session) before any lease is
 * renewed; ids unknown or whose lease ran out are answered in "gone".
 */
static void host_heartbeat(struct trk_call *c, json_t *nodes)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	struct {
		struct trk_node *n;
		struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX];
		size_t npc;
		bool pins;
	} *e;
	size_t i, k = json_array_size(nodes);
	json_t *o, *gone;
	uint64_t now = proto_now_ns();

	if (!json_is_array(nodes) || k == 0 || k > TRK_HOST_HEARTBEAT_MAX) {
		trk__fail(c, 400, "nodes: must be an array of 1..%d entries", TRK_HOST_HEARTBEAT_MAX);
		return;
	}
	if ((e = calloc(k, sizeof(*e))) == NULL || (gone = json_array()) == NULL) {
		free(e);
		trk__fail(c, 500, "out of memory");
		return;
	}
	json_array_foreach(nodes, i, o) {
		const char *id = NULL, *ses = NULL;
		if (!json_is_object(o)) {
			trk__fail(c, 400, "nodes[%zu]: must be an object", i);
			goto out;
		}
		if (trk__get_str(o, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
		    trk__get_str(o, "session", false, 2 * TRK_SESSION_BYTES, &ses, &err) != 0 ||
		    parse_pins(o, e[i].pc, &e[i].npc, &e[i].pins, &err) != 0) {
			trk__fail(c, 400, "nodes[%zu]: %s", i, err.msg);
			goto out;
		}
		e[i].n = trk__node_find(r, id);
	}
	/* Each node speaks only for itself (as its own heartbeat's
	 * X-Tessera-Session header does): a live one needs its session. */
	json_array_foreach(nodes, i, o) {
		const char *ses = json_string_value(json_object_get(o, "session"));
		if (c->s->auth != NULL && e[i].n != NULL && e[i].n->alive &&
		    (ses == NULL || strlen(ses) != strlen(e[i].n->session) ||
		     sodium_memcmp(ses, e[i].n->session, strlen(ses)) != 0)) {
			c->s->auth_refused++;
			trk__fail(c, 403, "nodes[%zu]: node %s: wrong or missing session: a node "
				  "speaks only for itself", i, e[i].n->id);
			goto out;
		}
	}
	json_array_foreach(nodes, i, o)
		if (!node_renew(r, e[i].n, now, e[i].pc, e[i].npc, e[i].pins) &&
		    json_array_append(gone, json_object_get(o, "id")) != 0) {
			trk__fail(c, 500, "out of memory");
			goto out;
		}
	trk__reply_json(c, 200, json_pack("{s:I,s:O}", "lease_ms", (json_int_t)r->s->lease_ms,
					  "gone", gone));
out:
	json_decref(gone);
	free(e);
}

void trk__handle_heartbeat(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	struct trk_node *n;
	struct trk_publisher *p;
	uint64_t now = proto_now_ns();
	struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX];
	size_t npc = 0;
	bool pins;

	if (json_object_get(c->json, "nodes") != NULL && json_object_get(c->json, "id") == NULL) {
		host_heartbeat(c, json_object_get(c->json, "nodes"));
		return;
	}
	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	/* A node says what serving processes pin on it. */
	if (parse_pins(c->json, pc, &npc, &pins, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	n = trk__node_find(r, id);
	p = n == NULL ? trk__publisher_find(r, id) : NULL;
	if (p != NULL && p->alive && now >= p->expires_ns) {
		p->alive = false;
		p->gone_ms = proto_wall_ms();
		trk__registry_changed(r);
		LOG_INFO("publisher %s gone (lease expired)", p->id);
	}
	if (p != NULL && p->alive)
		p->expires_ns = now + trk__registry_lease_ns(r);
	else if (!node_renew(r, n, now, pc, npc, pins)) {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	trk__reply_json(c, 200, json_pack("{s:I}", "lease_ms", (json_int_t)r->s->lease_ms));
}

/* ---- activation ------------------------------------------------------------ */

static void log_activation(struct trk_registry *r, struct trk_replica *rep)
{
	struct trk_activation *a = &r->act[r->act_next];

	snprintf(a->replica, sizeof(a->replica), "%s", rep->name);
	a->version = rep->active;
	a->wall_ms = proto_wall_ms();
	r->act_next = (r->act_next + 1) % TRK__ACTIVATIONS_MAX;
	r->act_n = PROTO_MIN(r->act_n + 1, TRK__ACTIVATIONS_MAX);
	r->act_total++;
	LOG_INFO("replica %s activated version %llu", rep->name,
		 (unsigned long long)rep->active);
}

/* Replica-local activation: when every rank is alive and reports the same
 * active version, that is the replica's active version. */
void trk__replica_update_active(struct trk_registry *r, struct trk_replica *rep)
{
	uint64_t a = 0;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		struct trk_node *n = rep->ranks[i];
		if (n == NULL || !n->alive || n->active == 0)
			return;
		if (i > 0 && n->active != a)
			return;
		a = n->active;
	}
	if (a != 0 && a != rep->active) {
		rep->active = a;
		log_activation(r, rep);
	}
}

/* ---- counts ---------------------------------------------------------------- */

void trk__registry_counts(struct trk_registry *r, struct trk_counts *out)
{
	uint64_t latest = trk__versions_latest(r->s->vs);

	memset(out, 0, sizeof(*out));
	for (struct trk_publisher *p = r->pubs; p; p = p->next) {
		if (p->alive)
			out->publishers_alive++;
		else
			out->publishers_gone++;
	}
	for (struct trk_replica *rep = r->reps; rep; rep = rep->next) {
		bool all = true;
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct trk_node *n = rep->ranks[i];
			if (n != NULL && n->alive)
				out->nodes_alive++;
			else if (n != NULL)
				out->nodes_gone++;
			all &= n != NULL && n->alive;
		}
		if (!trk__replica_alive(rep))
			out->replicas_gone++;
		else if (!all)
			out->replicas_partial++;
		else if (rep->active != 0 && rep->active == latest)
			out->replicas_current++;
		else
			out->replicas_behind++;
	}
	out->bytes_from_trainer = r->bytes_from_trainer;
	out->bytes_from_peers = r->bytes_from_peers;
	out->activations = r->act_total;
	out->layout_cache_hits = r->forms_hits;
	out->layout_cache_misses = r->forms_misses;
}

/* ---- statements ------------------------------------------------------------ */

json_t *trk__replica_statements(const struct trk_replica *rep, uint64_t v)
{
	json_t *arr = json_array();

	for (uint32_t i = 0; arr != NULL && i < rep->nranks; i++) {
		struct trk_node *n = rep->ranks[i];
		struct trk_nver *e;

		if (!trk__node_holds(n, v) || !n->has_stmt_key ||
		    (e = trk__node_version(n, v)) == NULL || !e->has_sig)
			continue;
		if (json_array_append_new(arr, json_pack("{s:I,s:o,s:o}", "rank", (json_int_t)i,
							 "key",
							 trk__json_hex(n->stmt_key,
								       TRK_STMT_PK_BYTES),
							 "sig",
							 trk__json_hex(e->sig,
								       TRK_STMT_SIG_BYTES))) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	return arr;
}
