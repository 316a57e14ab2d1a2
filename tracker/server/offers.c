/* POST /offers: a node or a publisher offers the parcels of a version it
 * serves (and a node its slot), checked against the version's manifest. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

#define OFFER_PARCELS_MAX 65536

static int parse_offer(struct trk_server *sv, json_t *o, size_t i,
		       const struct proto_manifest *m, struct trk_offer *out,
		       struct proto_err *err)
{
	const struct proto_mlayout *ml;
	const struct proto_mparcel *mp;
	uint64_t src = 0, dst = 0;
	int rc;

	if (!json_is_object(o))
		return proto_errf(err, EINVAL, "parcels[%zu]: must be an object", i);
	if ((rc = trk__get_hex(o, "layout", out->layout, PROTO_HASH_BYTES, err)) != 0 ||
	    (rc = trk__get_u64(o, "src_rank", true, UINT32_MAX, &src, err)) != 0 ||
	    (rc = trk__get_u64(o, "dst_rank", true, UINT32_MAX, &dst, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "addr", &out->addr, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "key", &out->key, err)) != 0 ||
	    (rc = trk__get_u64(o, "len", true, UINT64_MAX, &out->len, err)) != 0) {
		proto_err_prefix(err, "parcels[%zu]", i);
		return rc;
	}
	out->src_rank = (uint32_t)src;
	out->dst_rank = (uint32_t)dst;
	ml = trk__version_layout(sv, m->version, m, out->layout); /* or an addendum's */
	if (ml == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no such layout", i,
				  (unsigned long long)m->version);
	mp = proto_mlayout_parcel(ml, out->src_rank, out->dst_rank);
	if (mp == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no parcel %u -> %u", i,
				  (unsigned long long)m->version, out->src_rank,
				  out->dst_rank);
	if (mp->wire_bytes != out->len)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: len %llu but the parcel has %llu wire bytes",
				  i, (unsigned long long)out->len,
				  (unsigned long long)mp->wire_bytes);
	return 0;
}

/* "slot": a node's whole rank memory (its layout's bytes for its rank),
 * which holds the version complete, or, with "have", in part: the have-map
 * says which blocks are verified. */
static int parse_slot(json_t *js, const struct trk_node *n, struct trk_offer *out,
		      struct proto_err *err)
{
	int rc;

	if (n == NULL)
		return proto_errf(err, EINVAL, "slot: only a node offers one");
	if (!json_is_object(js))
		return proto_errf(err, EINVAL, "slot: must be an object");
	if ((rc = trk__get_u64_str(js, "addr", &out->addr, err)) != 0 ||
	    (rc = trk__get_u64_str(js, "key", &out->key, err)) != 0 ||
	    (rc = trk__get_u64(js, "len", true, UINT64_MAX, &out->len, err)) != 0) {
		proto_err_prefix(err, "slot");
		return rc;
	}
	json_t *hv = json_object_get(js, "have");
	if (hv != NULL && !json_is_object(hv))
		return proto_errf(err, EINVAL, "slot.have: must be an object");
	if (hv != NULL && ((rc = trk__get_u64_str(hv, "addr", &out->have_addr, err)) != 0 ||
			   (rc = trk__get_u64_str(hv, "key", &out->have_key, err)) != 0)) {
		proto_err_prefix(err, "slot.have");
		return rc;
	}
	out->partial = hv != NULL;
	if (out->len != n->layout->l.ranks[n->rank].nbytes)
		return proto_errf(err, EINVAL, "slot: len %llu but rank %u of its layout holds %llu bytes",
				  (unsigned long long)out->len, n->rank,
				  (unsigned long long)n->layout->l.ranks[n->rank].nbytes);
	memcpy(out->layout, n->layout->digest, PROTO_HASH_BYTES);
	out->dst_rank = n->rank;
	return 0;
}

void trk__handle_offers(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	uint64_t version = 0, snapshot_ms = 0;
	json_t *jp = json_object_get(c->json, "parcels");
	const struct proto_manifest *m = NULL;
	struct proto_manifest *owned = NULL;
	struct trk_offer *list = NULL, slot = {.len = 0};
	json_t *js = json_object_get(c->json, "slot");
	json_t *jr = json_object_get(c->json, "publish");
	struct trk_publish_report report;
	struct trk_publisher *p;
	struct trk_node *n;
	size_t cnt;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__get_u64(c->json, "snapshot_ms", false, TRK__WALL_MS_MAX, &snapshot_ms, &err) != 0 ||
	    (jr != NULL && trk_publish_report_parse(jr, &report, &err) != 0)) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (!json_is_array(jp) || json_array_size(jp) > OFFER_PARCELS_MAX) {
		trk__fail(c, 400, "parcels: must be an array of at most %d", OFFER_PARCELS_MAX);
		return;
	}
	cnt = json_array_size(jp);
	n = trk__node_find(r, id);
	p = n == NULL ? trk__publisher_find(r, id) : NULL;
	if ((n == NULL || !n->alive) && (p == NULL || !p->alive)) {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	if (jr != NULL && p == NULL) {
		trk__fail(c, 400, "publish: only a publisher reports an export");
		return;
	}
	if (trk__versions_manifest(c->s->vs, version, &m, &owned, &err) != 0) {
		trk__fail(c, trk__versions_find(c->s->vs, version) ? 500 : 409,
			  "%s", err.msg);
		return;
	}
	list = cnt > 0 ? calloc(cnt, sizeof(*list)) : NULL;
	if (cnt > 0 && list == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < cnt; i++) {
		struct trk_offer *o = &list[i];
		if (parse_offer(c->s, json_array_get(jp, i), i, m, o, &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			goto out;
		}
		if (p != NULL && !trk__publisher_has_rank(p, o->src_rank)) {
			trk__fail(c, 400, "parcels[%zu]: publisher %s does not serve rank %u",
				  i, id, o->src_rank);
			goto out;
		}
		if (n != NULL && (memcmp(o->layout, n->layout->digest, PROTO_HASH_BYTES) != 0 ||
				  o->dst_rank != n->rank)) {
			trk__fail(c, 400,
				  "parcels[%zu]: a node offers only parcels of its own layout and rank",
				  i);
			goto out;
		}
		for (size_t j = 0; j < i; j++)
			if (list[j].src_rank == o->src_rank && list[j].dst_rank == o->dst_rank &&
			    memcmp(list[j].layout, o->layout, PROTO_HASH_BYTES) == 0) {
				trk__fail(c, 400, "parcels[%zu]: listed twice", i);
				goto out;
			}
	}
	if (js != NULL && parse_slot(js, n, &slot, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (p != NULL && cnt > 0)
		trk__versions_find(c->s->vs, version)->offered = true;
	if (p != NULL) /* what publishers serve moves replica targets */
		trk__registry_changed(r);
	trk__offers_put(n != NULL ? &n->offers : &p->offers, version, list, cnt, &slot);
	trk__registry_swarm_changed(r);
	if (p != NULL && snapshot_ms != 0)
		trk__timeline_snapshot(r->tl, version, snapshot_ms);
	if (p != NULL && jr != NULL)
		trk__timeline_publish(r->tl, version, &report);
	list = NULL;
	trk__reply_json(c, 200, json_pack("{s:I,s:I}", "version", (json_int_t)version,
					  "parcels", (json_int_t)cnt));
out:
	free(list);
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
}
