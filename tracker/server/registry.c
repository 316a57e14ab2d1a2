/* The soft state: publishers and replicas of node ranks, their lifetime,
 * lookups and leases, and the counts /metrics shows. */
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

const char *trk__registry_no_model(const struct trk_registry *r)
{
	return r->model_refused[0] != 0 ? r->model_refused : "no publisher has registered one";
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

/* ---- lookups --------------------------------------------------------------- */

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

bool trk__publisher_has_rank(const struct trk_publisher *p, uint32_t rank)
{
	for (size_t i = 0; i < p->nranks; i++)
		if (p->ranks[i].rank == rank)
			return true;
	return false;
}

/* ---- leases -------------------------------------------------------------- */

void trk__node_gone(struct trk_registry *r, struct trk_node *n, uint64_t now_ms, const char *why)
{
	trk__registry_members_changed(r);
	n->alive = false;
	n->gone_ms = now_ms;
	n->gone_why = why;
	LOG_INFO("node %s gone (%s)", n->id, why);
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

	if (trk__members_rejudge(&r->rates_new, &r->rates_judged_ms, now / 1000000))
		trk__registry_members_changed(r);
	if (now < r->sweep_due_ns)
		return;
	now_ms = proto_wall_ms();
	prune_ms = PRUNE_LEASES * r->s->lease_ms;
	due = now + trk__registry_sweep_period_ns(r);
	/* Every replica's target once a period (what moves with time alone,
	 * the ranks' disagreement, is judged against TESSERA_DISAGREE_MS,
	 * seconds); between, only those of replicas this sweep changed
	 * (tracker/NOTES.md, "Sweeps"). */
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
				trk__node_gone(r, n, now_ms, "lease expired");
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
	/* Heartbeats extend leases without moving the due time, so the
	 * earliest lease end seen is always near with many nodes; sweeping at
	 * each would make every request O(nodes). A lease end is noticed
	 * within a 32nd of a lease (lease/4 at most 500 ms, over 8) instead.
	 * Changes marked by trk__registry_changed still sweep at the next
	 * request. */
	r->sweep_due_ns = PROTO_MAX(due, now + trk__registry_sweep_period_ns(r) / 8);
}

/* ---- counts ---------------------------------------------------------------- */

/* A whole replica short of the latest: updating, failed or behind. */
static void count_state(struct trk_registry *r, const struct trk_replica *rep, uint64_t now,
			struct trk_counts *out)
{
	struct trk_rs_out st;

	trk__replica_state(r->s, rep, now, &st);
	if (st.state == TRK_RSTATE_UPDATING)
		out->replicas_updating++;
	else if (st.state == TRK_RSTATE_FAILED)
		out->replicas_failed++;
	else
		out->replicas_behind++;
}

void trk__registry_counts(struct trk_registry *r, struct trk_counts *out)
{
	uint64_t latest = trk__versions_latest(r->s->vs), now = proto_wall_ms();

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
			count_state(r, rep, now, out);
	}
	out->bytes_from_trainer = r->bytes_from_trainer;
	out->bytes_from_peers = r->bytes_from_peers;
	out->bytes_from_other_sites = r->bytes_from_other_sites;
	out->activations = r->act_total;
	out->layout_cache_hits = r->forms_hits;
	out->layout_cache_misses = r->forms_misses;
}
