/* The publisher's manifests: built from the parts' chunk hashes; a rebuild checked against one. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <string.h>

int node__pub_mlayout_fill(const struct pub_export *ex, size_t li, const struct proto_manifest *m,
			   struct proto_mlayout *ml, struct proto_err *err)
{
	for (size_t i = 0; i < ex->pv->nparts; i++) {
		const struct pub_part *pt = &ex->pv->parts[i];
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			struct proto_mparcel *mp = &ml->parcels[it->pi];
			int rc;
			if (it->li != li)
				continue;
			mp->src_rank = it->pc->src_rank;
			mp->dst_rank = it->pc->dst_rank;
			mp->bytes = it->pc->bytes;
			mp->encoding = ex->delta ? PROTO_ENC_DELTA : PROTO_ENC_RAW;
			if ((rc = proto_mparcel_alloc_chunks(m, mp, it->wire)) != 0)
				return proto_errf(err, -rc, "sizing parcel %u->%u's chunk list",
						  mp->src_rank, mp->dst_rank);
			for (uint32_t c = 0; c < mp->nchunks; c++)
				memcpy(mp->chunks[c].hash, it->hash[c], PROTO_HASH_BYTES);
		}
	}
	return 0;
}

int node__pub_manifest_build(struct node_pub *p, struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	struct proto_manifest *m = &ex->m;
	int rc;

	proto_manifest_init(m);
	ex->have_m = true;
	m->version = ex->version;
	m->parent_version = ex->version - 1;
	if (m->parent_version > 0)
		memcpy(m->parent_digest, p->prev_digest, PROTO_HASH_BYTES);
	m->kind = ex->delta ? PROTO_KIND_DELTA : PROTO_KIND_ANCHOR;
	memcpy(m->model_digest, p->model.digest, PROTO_HASH_BYTES);
	memcpy(m->src_layout_digest, p->tl.digest, PROTO_HASH_BYTES);
	m->created_ms = ex->created_ms;
	m->chunk_size = ex->chunk_size;
	for (size_t li = 0; li < ex->nlayouts; li++) {
		const struct pub_layout *sl = ex->layouts[li];
		if (proto_manifest_add_layout(m, sl->digest, sl->plan.digest, sl->plan.nparcels) == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
	}
	for (size_t li = 0; li < ex->nlayouts; li++)
		if ((rc = node__pub_mlayout_fill(ex, li, m, &m->layouts[li], err)) != 0)
			return rc;
	if ((ex->canary = node__pub_canary_json(ex)) == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	return proto_manifest_sign(m, p->sk, &ex->mbuf, &ex->mlen, err);
}

int node__pub_manifest_compare(struct node_pub *p, struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	char h[2 * PROTO_HASH_BYTES + 1];

	for (size_t i = 0; i < ex->pv->nparts; i++) {
		const struct pub_part *pt = &ex->pv->parts[i];
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			const struct proto_mlayout *ml = proto_manifest_layout(&ex->m, it->sl->digest);
			const struct proto_mparcel *mp =
				ml ? proto_mlayout_parcel(ml, it->pc->src_rank, it->pc->dst_rank) : NULL;
			sodium_bin2hex(h, sizeof(h), it->sl->digest, PROTO_HASH_BYTES);
			if (mp == NULL || mp->bytes != it->pc->bytes || mp->nchunks != it->nchunks ||
			    mp->encoding != PROTO_ENC_RAW)
				return proto_errf(err, EINVAL,
						  "layout %.16s parcel %u->%u: not the signed parcel",
						  h, it->pc->src_rank, it->pc->dst_rank);
			for (uint32_t c = 0; c < it->nchunks; c++)
				if (sodium_memcmp(mp->chunks[c].hash, it->hash[c], PROTO_HASH_BYTES) != 0)
					return proto_errf(err, EBADMSG,
							  "layout %.16s parcel %u->%u chunk %u: rebuilt bytes differ from the signed hash",
							  h, it->pc->src_rank, it->pc->dst_rank, c);
		}
	}
	return 0;
}
