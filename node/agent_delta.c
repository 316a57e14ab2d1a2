/* Delta versions on a node: the exact-parent check, the rebuild of the new
 * slot from the active one (copy, then a sparse apply checked by wsum), and
 * asking for an anchor when the parent is missing or does not verify. */
#include "node/agent_internal.h"

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

int agent_delta_check_parent(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	char want[17], have[17];

	sodium_bin2hex(want, sizeof(want), f->man.parent_digest, 8);
	if (a->active == NULL || a->inplace_broken) {
		need_anchor(a, "a delta against v%" PRIu64 " (%s), and this node holds no %sversion",
			    f->man.parent_version, want, a->active ? "complete " : "");
		return -ENOENT;
	}
	if (a->active->version != f->man.parent_version ||
	    sodium_memcmp(a->active_digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
		sodium_bin2hex(have, sizeof(have), a->active_digest, 8);
		need_anchor(a, "a delta against v%" PRIu64 " (%s), but this node holds v%" PRIu64 " (%s)",
			    f->man.parent_version, want, a->active->version, have);
		return -ENOENT;
	}
	return 0;
}

int agent_delta_rebuild(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	struct node_slot *parent = a->active;
	unsigned threads = (unsigned)PROTO_MAX(proto_param(PROTO_PARAM_VERIFY_THREADS), 1);
	uint64_t t0 = agent_now_ms();
	struct proto_err err;

	/* The parent may have changed since the fetch began only through an
	 * activation, which needs this fetch: check anyway, cheaply. */
	if (parent == NULL || parent->version != f->man.parent_version ||
	    sodium_memcmp(a->active_digest, f->man.parent_digest, PROTO_HASH_BYTES) != 0) {
		need_anchor(a, "the parent slot changed during the fetch");
		return -ESTALE;
	}
	memcpy(f->slot->host, parent->host, PROTO_MIN(f->slot->len, parent->len));
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		struct proto_dparcel dp;
		int rc = proto_dparcel_build(&a->model, f->plan, p->pp, &a->layout, &dp, &err);
		if (rc == 0) {
			rc = proto_dparcel_apply(&dp, p->wire, p->mp->wire_bytes, f->slot->host, threads,
						 &err);
			proto_dparcel_fini(&dp);
		}
		if (rc != 0) {
			need_anchor(a, "delta parcel %u<-%u does not rebuild v%" PRIu64 " from v%" PRIu64
				       ": %s",
				    p->mp->dst_rank, p->mp->src_rank, f->version, parent->version, err.msg);
			return rc;
		}
		free(p->wire);
		p->wire = NULL;
	}
	f->rebuild_ms = agent_now_ms() - t0;
	node_metrics_add(a->am.m, a->am.delta_versions, 1);
	LOG_INFO("node %s: v%" PRIu64 " rebuilt from v%" PRIu64 " by delta (%" PRIu64
		 " wire bytes for %" PRIu64 " bytes, every piece's checksum verified, %" PRIu64 " ms)",
		 a->node_id, f->version, parent->version, f->bytes_total, f->slot->len, f->rebuild_ms);
	return 0;
}
