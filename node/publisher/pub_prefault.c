/* Pages touched ahead: snapshot blocks and export buffers faulted in off the critical path. */
#include "node/publisher/pub_internal.h"

#include <fcntl.h>
#include <stdlib.h>

#include "proto/pool.h"

/*
 * Fresh pages fault and are zeroed on first touch. The blocks a snapshot
 * is taken into and the buffers an export serves from are mapped and
 * touched here by a worker while nothing waits on them: after an anchor
 * (which leaves no block to take turns with) and before the first export.
 * The measurements behind it: NOTES.md.
 */
enum pf_kind { PF_BLOCK, PF_SERVED };

struct pub_prefault {
	struct proto_pool_task task;
	const atomic_bool *abort;
	const struct proto_ckpt *ck; /* a checkpoint to read ahead, or NULL */
	size_t n;
	struct pub_pbuf {
		uint32_t rank;
		enum pf_kind kind;
		size_t cap;
		uint8_t *raw;
	} *bufs;
};

#define PREFAULT_STEP 4096u /* one write per page: a fault per page not yet there */

static void prefault_main(void *arg)
{
	struct pub_prefault *pf = arg;

	/* The snapshot preads the checkpoint (node__pub_source_fill): its
	 * pages need only be in the page cache, not mapped here. */
	for (uint32_t s = 0; pf->ck != NULL && s < pf->ck->nshards && !atomic_load(pf->abort); s++)
		if (pf->ck->shards[s].map != NULL)
			(void)posix_fadvise(pf->ck->shards[s].fd, 0, 0, POSIX_FADV_WILLNEED);
	for (size_t i = 0; i < pf->n && !atomic_load(pf->abort); i++) {
		struct pub_pbuf *b = &pf->bufs[i];
		if ((b->raw = node_serve_map(b->cap)) == NULL)
			continue;
		for (size_t o = 0; o < b->cap && !atomic_load(pf->abort); o += PREFAULT_STEP)
			((volatile uint8_t *)b->raw)[o] = 0;
	}
}

void node__pub_prefault_join(struct node_pub *p)
{
	struct pub_prefault *pf = p->prefault;

	if (pf == NULL)
		return;
	proto_pool_join(&pf->task);
	for (size_t i = 0; i < pf->n; i++) {
		struct pub_pbuf *b = &pf->bufs[i];
		if (b->raw == NULL)
			continue;
		if (b->kind == PF_BLOCK && p->blocks[b->rank] == NULL) {
			p->blocks[b->rank] = b->raw;
			p->block_cap[b->rank] = b->cap;
		} else if (b->kind == PF_SERVED && p->spare_buf[b->rank] == NULL) {
			p->spare_buf[b->rank] = b->raw;
			p->spare_buf_cap[b->rank] = b->cap;
		} else {
			node_serve_unmap(b->raw, b->cap);
		}
	}
	free(pf->bufs);
	free(pf);
	p->prefault = NULL;
}

/* Starts the worker on the n buffers of pf (taking pf); none: frees it. */
static void prefault_launch(struct node_pub *p, struct pub_prefault *pf)
{
	pf->abort = &p->abort;
	if ((pf->n == 0 && pf->ck == NULL) || proto_pool_start(&pf->task, prefault_main, pf) != 0) {
		free(pf->bufs);
		free(pf);
		return;
	}
	p->prefault = pf;
}

/* Version v's checkpoint when the publisher reads a model dir, else NULL. */
static const struct proto_ckpt *checkpoint_of(const struct node_pub *p, uint64_t v)
{
	return !p->synthetic && !p->trainer && v >= 1 && v <= p->nfiles ? &p->files[v - 1].ck
									  : NULL;
}

void node__pub_prefault_first(struct node_pub *p)
{
	struct pub_prefault *pf;
	uint32_t nr = p->tl.nranks;

	if (p->prefault != NULL || p->parent != NULL || (pf = calloc(1, sizeof(*pf))) == NULL)
		return;
	pf->ck = checkpoint_of(p, p->published + 1);
	if (!node__pub_keeps_parent(p) ||
	    (pf->bufs = calloc((size_t)nr * 2, sizeof(*pf->bufs))) == NULL)
		nr = 0;
	for (uint32_t r = 0; r < nr; r++) {
		size_t cap = node__pub_page_round(p->tl.ranks[r].nbytes);
		if (cap == 0)
			continue;
		if (p->blocks[r] == NULL)
			pf->bufs[pf->n++] = (struct pub_pbuf){.rank = r, .kind = PF_BLOCK, .cap = cap};
		if (p->spare_buf[r] == NULL)
			pf->bufs[pf->n++] = (struct pub_pbuf){.rank = r, .kind = PF_SERVED, .cap = cap};
	}
	prefault_launch(p, pf);
}

/* After a version is published: the next one's snapshot block (when the
 * version's own is kept as the parent) is made now, and after the first
 * version the second export buffer (the first is still served), so that
 * the next export faults no page. Later exports take the buffer a retired
 * version leaves (node__pub_part_release): none is made ahead again. */
void node__pub_prefault_start(struct node_pub *p, uint64_t next)
{
	struct pub_prefault *pf;
	uint32_t nr = p->tl.nranks;

	node__pub_prefault_join(p);
	if ((pf = calloc(1, sizeof(*pf))) == NULL)
		return;
	pf->ck = checkpoint_of(p, next);
	if (nr > 0)
		pf->bufs = calloc((size_t)nr * 2, sizeof(*pf->bufs));
	for (uint32_t r = 0; pf->bufs != NULL && r < nr; r++) {
		size_t cap = node__pub_page_round(p->tl.ranks[r].nbytes);
		if (p->blocks[r] == NULL && p->tl.ranks[r].nbytes > 0)
			pf->bufs[pf->n++] = (struct pub_pbuf){.rank = r, .kind = PF_BLOCK, .cap = cap};
		if (!p->second_made && p->spare_buf[r] == NULL && p->export_cap[r] > 0)
			pf->bufs[pf->n++] = (struct pub_pbuf){.rank = r, .kind = PF_SERVED,
							      .cap = p->export_cap[r]};
	}
	p->second_made = true;
	prefault_launch(p, pf);
}
