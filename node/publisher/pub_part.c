/* A trainer rank's part of a version: its parcels, their place in its export buffer, the buffer. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>

int node__pub_part_list(struct pub_part *pt, struct pub_layout *const *layouts, size_t nlayouts,
			uint32_t chunk_size, struct proto_err *err)
{
	uint64_t cs = chunk_size;
	size_t n = 0;

	for (size_t li = 0; li < nlayouts; li++)
		for (uint32_t k = 0; k < layouts[li]->plan.nparcels; k++)
			n += layouts[li]->plan.parcels[k].src_rank == pt->rank;
	pt->items = calloc(PROTO_MAX(n, 1), sizeof(*pt->items));
	pt->slices = calloc(PROTO_MAX(nlayouts, 1), sizeof(*pt->slices));
	if (pt->items == NULL || pt->slices == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	pt->nslices = nlayouts;
	for (size_t li = 0; li < nlayouts; li++) {
		const struct pub_layout *sl = layouts[li];
		for (uint32_t k = 0; k < sl->plan.nparcels; k++) {
			const struct proto_parcel *pc = &sl->plan.parcels[k];
			struct pub_item *it = &pt->items[pt->nitems];
			uint64_t nch = (pc->bytes + cs - 1) / cs;
			if (pc->src_rank != pt->rank)
				continue;
			if (nch > UINT32_MAX)
				return proto_errf(err, EOVERFLOW, "a parcel of %llu bytes has too many chunks",
						  (unsigned long long)pc->bytes);
			pt->nitems++;
			it->sl = sl;
			it->pc = pc;
			it->li = (uint32_t)li;
			it->pi = k;
			it->nchunks = (uint32_t)nch;
			it->wire = pc->bytes;
			it->hash = calloc(PROTO_MAX(nch, 1), PROTO_HASH_BYTES);
			if (it->hash == NULL)
				return proto_errf(err, ENOMEM, "out of memory");
		}
	}
	node__pub_part_layout(pt, nlayouts);
	return 0;
}

void node__pub_part_layout(struct pub_part *pt, size_t nlayouts)
{
	uint64_t off = 0;
	size_t j = 0;

	for (size_t li = 0; li < nlayouts; li++) {
		pt->slices[li].off = off;
		for (; j < pt->nitems && pt->items[j].li == li; j++) {
			pt->items[j].off = off;
			off = (off + pt->items[j].wire + PUB_ALIGN - 1) & ~(uint64_t)(PUB_ALIGN - 1);
		}
		pt->slices[li].len = off - pt->slices[li].off;
	}
	pt->used = off;
}

int node__pub_part_raw(struct pub_part *pt, size_t nlayouts, uint32_t chunk_size)
{
	node__pub_part_layout(pt, nlayouts);
	for (size_t j = 0; j < pt->nitems; j++) {
		struct pub_item *it = &pt->items[j];
		free(it->hash);
		it->nchunks = (uint32_t)((it->pc->bytes + chunk_size - 1) / chunk_size);
		it->hash = calloc(PROTO_MAX(it->nchunks, 1), PROTO_HASH_BYTES);
		if (it->hash == NULL)
			return -ENOMEM;
	}
	return 0;
}

void node__pub_part_items_free(struct pub_part *pt)
{
	for (size_t i = 0; i < pt->nitems; i++) {
		free(pt->items[i].hash);
		free(pt->items[i].sums);
	}
	free(pt->items);
	pt->items = NULL;
	pt->nitems = 0;
}

/* Export buffers of rank r other than pt's: those of served versions and
 * of the export in progress. */
static size_t rank_buffers(const struct node_pub *p, uint32_t r, const struct pub_part *pt)
{
	size_t n = 0;

	for (const struct pub_version *v = p->versions; v != NULL; v = v->next)
		for (size_t i = 0; i < v->nparts; i++)
			n += v->parts[i].rank == r && v->parts[i].buf != NULL && &v->parts[i] != pt;
	const struct pub_version *ev = p->ex != NULL ? p->ex->pv : NULL;
	for (const struct pub_version *v = p->versions; ev != NULL && v != NULL; v = v->next)
		if (v == ev)
			ev = NULL; /* counted above */
	for (size_t i = 0; ev != NULL && i < ev->nparts; i++)
		n += ev->parts[i].rank == r && ev->parts[i].buf != NULL && &ev->parts[i] != pt;
	return n;
}

/* The buffer is kept as the rank's spare, the next export's buffer, when
 * the rank has none or a smaller one and at most one other buffer of the
 * rank is in use (versions published one after another: the retired one
 * takes the next): its pages are faulted in once, not per version (a
 * fresh page's first touch costs more than the network moving it,
 * NOTES.md). With more versions served at once (a fast clock) it goes
 * back, as the others do: a spare then would only add to what is held. */
void node__pub_part_release(struct node_pub *p, struct pub_part *pt)
{
	uint32_t r = pt->rank;
	bool keep = pt->buf != NULL && r < p->tl.nranks && p->spare_buf_cap[r] < pt->cap &&
		    rank_buffers(p, r, pt) <= 1;

	for (size_t li = 0; li < pt->nslices; li++)
		fab_mr_close(pt->slices[li].mr);
	free(pt->slices);
	pt->slices = NULL;
	pt->nslices = 0;
	node__pub_part_items_free(pt);
	if (keep) {
		node_serve_unmap(p->spare_buf[r], p->spare_buf_cap[r]);
		p->spare_buf[r] = pt->buf;
		p->spare_buf_cap[r] = pt->cap;
	} else {
		node_serve_unmap(pt->buf, pt->cap);
	}
	pt->buf = NULL;
	pt->cap = 0;
}

int node__pub_part_alloc(struct node_pub *p, struct pub_part *pt)
{
	size_t need = node__pub_page_round(pt->used);

	node__pub_prefault_join(p);
	p->export_cap[pt->rank] = need;
	if (p->spare_buf[pt->rank] != NULL && p->spare_buf_cap[pt->rank] >= need) {
		pt->buf = p->spare_buf[pt->rank];
		pt->cap = p->spare_buf_cap[pt->rank];
		p->spare_buf[pt->rank] = NULL;
		p->spare_buf_cap[pt->rank] = 0;
		return 0;
	}
	pt->buf = node_serve_map(need);
	if (pt->buf == NULL)
		return -ENOMEM;
	pt->cap = need;
	return 0;
}
