/* The publisher's served versions: their regions, what each offers, freeing them. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

void node__pub_layout_free(struct pub_version *pv, size_t li)
{
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		struct pub_slice *sl = li < pt->nslices ? &pt->slices[li] : NULL;
		if (sl == NULL)
			continue;
		fab_mr_close(sl->mr); /* no reader reaches the pages any more */
		sl->mr = NULL;
		if (pt->buf != NULL && sl->len > 0)
			(void)madvise(pt->buf + sl->off, sl->len, MADV_DONTNEED);
	}
	pv->layouts[li].state = PUB_L_FREED;
}

void node__pub_version_free(struct node_pub *p, struct pub_version *pv)
{
	if (pv == NULL)
		return;
	for (size_t i = 0; i < pv->nparts; i++)
		node__pub_part_release(p, &pv->parts[i]);
	free(pv->parts);
	free(pv->layouts);
	free(pv->offers);
	free(pv->offer_li);
	free(pv);
}

struct pub_version *node__pub_version_served(struct node_pub *p, uint64_t v)
{
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		if (pv->version == v && !pv->releasing)
			return pv;
	return NULL;
}

void node__pub_version_unlink(struct node_pub *p, struct pub_version *pv)
{
	for (struct pub_version **pp = &p->versions; *pp; pp = &(*pp)->next)
		if (*pp == pv) {
			*pp = pv->next;
			return;
		}
}

/* Registers the hosted parts' slices for remote reads, one region per
 * layout, and lists the offers (see publisher.h for what addr/key/len mean:
 * key and addr are those of the parcel's layout slice). */
int node__pub_version_serve(struct node_pub *p, struct pub_version *pv, struct proto_err *err)
{
	size_t n = 0, k = 0;
	int rc;

	for (size_t i = 0; i < pv->nparts; i++)
		if (pv->parts[i].hosted)
			n += pv->parts[i].nitems;
	pv->offers = calloc(PROTO_MAX(n, 1), sizeof(*pv->offers));
	pv->offer_li = calloc(PROTO_MAX(n, 1), sizeof(*pv->offer_li));
	if (pv->offers == NULL || pv->offer_li == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		int hi = -1;
		if (!pt->hosted || pt->nitems == 0)
			continue;
		for (size_t h = 0; h < p->nhosted; h++)
			if (p->hosted[h].rank == pt->rank)
				hi = (int)h;
		for (size_t li = 0; li < pv->nlayouts; li++) {
			struct pub_slice *sl = &pt->slices[li];
			if (sl->len == 0)
				continue;
			rc = node_serve_reg(p->hosted[hi].fab, pt->buf + sl->off, sl->len, false,
					    &sl->mr);
			if (rc != 0)
				return proto_errf(err, -rc,
						  "registering rank %u's export buffer (%llu bytes): %s",
						  pt->rank, (unsigned long long)sl->len, strerror(-rc));
		}
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			const struct pub_slice *sl = &pt->slices[it->li];
			if (it->wire == 0)
				continue;
			node_serve_offer_fill(&pv->offers[k], it->sl->digest, pt->rank,
					      it->pc->dst_rank, sl->mr, it->off - sl->off, it->wire);
			pv->offer_li[k] = it->li;
			k++;
		}
		/* Hashes are in the manifest now; offers keep what serving needs. */
		node__pub_part_items_free(pt);
	}
	pv->noffers = k;
	return 0;
}
