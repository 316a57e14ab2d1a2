/* Delta versions on a node: the exact-parent check, the rebuild of the new
 * slot from the active one (a copy on a worker, made between versions into a
 * standby slot or else while the delta's chunks arrive, then a sparse apply
 * checked by wsum on the same worker), and asking for an anchor when the
 * parent is missing or does not verify. */
#include "node/agent_internal.h"

#include "node/rebuild.h"
#include "proto/delta.h"

/* The node cannot build v from a delta: it says why and which path it takes
 * (an anchor: the tracker passes the request on to the publisher, whose next
 * version is then full), then refuses the version; the active one stays. */
static void need_anchor(struct node_agent *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void need_anchor(struct node_agent *a, const char *fmt, ...)
{
	char msg[400];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	a->need_anchor = true;
	node_metrics_add(a->am.m, a->am.delta_refused, 1);
	agent_fetch_fail(a, "%s; falling back to a full fetch: asking for an anchor", msg);
}

/* The slot a delta of a->fetch builds on, and its manifest digest: the
 * chain's last step while replaying one, else the active slot (NULL: none). */
static struct node_slot *parent_slot(const struct node_agent *a, const uint8_t **digest)
{
	struct node_slot *s = agent_chain_parent(a, digest);

	if (s != NULL)
		return s;
	*digest = a->active_digest;
	return a->inplace_broken ? NULL : a->active;
}

int agent_delta_check_parent(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	char want[17], have[17];
	const uint8_t *digest;
	struct node_slot *parent = parent_slot(a, &digest);

	if (parent != NULL && parent->version == f->man.parent_version &&
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) == 0)
		return 0;
	/* Not the parent: replay the chain to it if one is served. */
	if (agent_chain_begin(a) == 0)
		return -ENOENT;
	sodium_bin2hex(want, sizeof(want), f->man.parent_digest, 8);
	if (a->active == NULL || a->inplace_broken) {
		need_anchor(a, "a delta against v%" PRIu64 " (%s), and this node holds no %sversion",
			    f->man.parent_version, want, a->active ? "complete " : "");
		return -ENOENT;
	}
	sodium_bin2hex(have, sizeof(have), parent != NULL ? digest : a->active_digest, 8);
	need_anchor(a, "a delta against v%" PRIu64 " (%s), but this node holds v%" PRIu64 " (%s)",
		    f->man.parent_version, want, parent != NULL ? parent->version : a->active->version,
		    have);
	return -ENOENT;
}

/* Stops and frees the standby copy (its slot may become the store's spare). */
static void standby_drop(struct node_agent *a)
{
	node_rebuild_free(a->standby_rb);
	a->standby_rb = NULL;
	if (a->standby != NULL)
		node_slot_free(&a->store, a->standby);
	a->standby = NULL;
}

/* Between versions: the active slot is copied into a standby slot on a
 * worker, so that a delta against it, when it comes, is only applied. A
 * fetch that began first made its own slot: nothing to do then. */
static void on_standby(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct proto_err err;

	(void)fd;
	(void)what;
	if (a->fetch != NULL || a->active == NULL || a->standby != NULL || a->active->len != len)
		return;
	if (node_slot_new(&a->store, a->active->version + 1, len, &a->standby, &err) != 0 ||
	    node_rebuild_start(a->base, a->standby->host, a->standby->memfd, a->active->host,
			       a->active->memfd, len, &a->standby_rb, &err) != 0) {
		LOG_WARN("node %s: no standby copy of v%" PRIu64 " (%s); a delta will copy it then",
			 a->node_id, a->active->version, err.msg);
		standby_drop(a);
		return;
	}
	LOG_INFO("node %s: copying v%" PRIu64 " into a standby slot for the next delta", a->node_id,
		 a->active->version);
}

void agent_delta_activated(struct node_agent *a)
{
	agent_chain_end(a, false); /* the target is active: the replay is over */
	standby_drop(a);
	if (a->o.install_inplace)
		return; /* memory-tight: no second copy of the rank */
	if (a->standby_ev == NULL)
		a->standby_ev = evtimer_new(a->base, on_standby, a);
	if (a->standby_ev != NULL)
		agent_arm(a->standby_ev, proto_param(PROTO_PARAM_DELTA_STANDBY_MS));
}

void agent_delta_fini(struct node_agent *a)
{
	agent_chain_end(a, false);
	standby_drop(a);
	if (a->standby_ev != NULL)
		event_free(a->standby_ev);
	a->standby_ev = NULL;
}

int agent_delta_slot(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	struct proto_err err;

	const uint8_t *pdigest;
	struct node_slot *chain = agent_chain_parent(a, &pdigest);

	if (a->standby != NULL && a->standby->len == len && !(f->delta && chain != NULL)) {
		/* The standby copies the active slot: a delta's exact parent
		 * (checked before); for anything else it is only memory, which
		 * the fetch overwrites whole. */
		f->slot = a->standby;
		f->slot->version = f->version;
		a->standby = NULL;
		if (f->delta) {
			f->rebuild = a->standby_rb;
			f->from_standby = true;
		} else {
			node_rebuild_free(a->standby_rb);
		}
		a->standby_rb = NULL;
		return 0;
	}
	/* A chain's delta builds on the step before, not on the active slot. */
	struct node_slot *parent = chain != NULL ? chain : a->active;
	standby_drop(a);
	if (node_slot_new(&a->store, f->version, len, &f->slot, &err) != 0 ||
	    (f->delta && node_rebuild_start(a->base, f->slot->host, f->slot->memfd, parent->host,
					    parent->memfd, PROTO_MIN(f->slot->len, parent->len),
					    &f->rebuild, &err) != 0)) {
		agent_fetch_fail(a, "%s", err.msg);
		return -ENOMEM;
	}
	return 0;
}

/* On the rebuild's worker, after the copy: every parcel's delta applied to
 * the new slot, each piece's checksum checked. It reads only what the loop
 * leaves alone while the fetch lives (the model, plan and layout, the
 * parcels' manifest entries and wire bytes, the slot). */
static int apply_all(void *arg, struct proto_err *err)
{
	struct agent_fetch *f = arg; /* not a->fetch: the loop may clear that before the join */
	const struct node_agent *a = f->rebuild_agent;
	unsigned threads = node_verifier_threads();

	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		struct proto_dparcel dp;
		if (f->test_corrupt && p->mp->wire_bytes > 0) { /* test only */
			p->wire[p->mp->wire_bytes / 2] ^= 0x40;
			f->test_corrupt = false;
		}
		struct proto_err e;
		int rc = proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &dp, &e);
		if (rc == 0) {
			rc = proto_dparcel_apply(&dp, p->wire, p->mp->wire_bytes, f->slot->host, threads,
						 &e);
			proto_dparcel_fini(&dp);
		}
		if (rc != 0)
			return proto_errf(err, -rc, "delta parcel %u<-%u does not rebuild v%" PRIu64
					  " from v%" PRIu64 ": %s",
					  p->mp->dst_rank, p->mp->src_rank, f->version,
					  f->man.parent_version, e.msg);
	}
	return 0;
}

/* Back on the loop: the slot holds the new version, or the fetch is refused. */
static void rebuilt(int rc, const struct proto_err *err, const struct node_rebuild_times *t,
		    void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;

	if (rc != 0) {
		need_anchor(a, "%s", err->msg);
		return;
	}
	for (uint32_t i = 0; i < f->nparcels; i++) {
		free(f->parcels[i].wire);
		f->parcels[i].wire = NULL;
	}
	f->rebuild_ms = agent_now_ms() - f->rebuild_ms;
	node_metrics_add(a->am.m, a->am.delta_versions, 1);
	LOG_INFO("node %s: v%" PRIu64 " rebuilt from v%" PRIu64 " by delta (%" PRIu64
		 " wire bytes for %" PRIu64 " bytes, every piece's checksum verified, %" PRIu64
		 " ms after the last chunk: the parent's copy%s took %" PRIu64 " ms, %" PRIu64
		 " ms of it after the last chunk, the apply %" PRIu64 " ms)",
		 a->node_id, f->version, f->man.parent_version, f->bytes_total, f->slot->len,
		 f->rebuild_ms, f->from_standby ? " (the standby one)" : "", t->copy_ms, t->wait_ms,
		 t->apply_ms);
	agent_verified(a);
}

void agent_delta_rebuild(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	const uint8_t *digest;
	struct node_slot *parent = parent_slot(a, &digest);

	/* The parent may have changed since the fetch began only through an
	 * activation, which needs this fetch: check anyway, cheaply. */
	if (parent == NULL || parent->version != f->man.parent_version ||
	    sodium_memcmp(digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
		need_anchor(a, "the parent slot changed during the fetch");
		return;
	}
	f->rebuild_ms = agent_now_ms();
	f->rebuild_agent = a;
	f->test_corrupt = a->chain != NULL &&
			  proto_param(PROTO_PARAM_TEST_CORRUPT_CHAIN) == f->version;
	node_rebuild_apply(f->rebuild, apply_all, f, rebuilt, a);
}
