/* The swarm of one rank: setup, teardown, and the hooks the fetcher calls. */
#include "node/swarm/swarm_internal.h"

#include <errno.h>
#include <stdlib.h>

int swarm_init(struct swarm *sw, const struct swarm_opts *o, struct proto_err *err)
{
	size_t len = (size_t)HAVE_SLOTS * HAVE_SLOT_MAX;
	int rc;

	sw->o = *o;
	sw->x = o->x;
	if (!sw->x->fanout)
		return 0;
	sw->hpool = node_serve_map(len);
	sw->hreads = calloc(HAVE_SLOTS, sizeof(*sw->hreads));
	if (sw->hpool == NULL || sw->hreads == NULL)
		return proto_errf(err, ENOMEM, "out of memory for have-page reads");
	rc = fab_mr_reg(sw->x->o.hfab, sw->hpool, len, FAB_MR_READ, &sw->hpool_mr);
	if (rc != 0)
		return proto_errf(err, -rc, "fabric: cannot set up have-page reads");
	return 0;
}

void swarm_close_regions(struct swarm *sw)
{
	if (sw->hpool_mr != NULL)
		fab_mr_close(sw->hpool_mr);
	sw->hpool_mr = NULL;
}

void swarm_fini(struct swarm *sw)
{
	if (sw->chase_ev != NULL)
		event_free(sw->chase_ev);
	sw->chase_ev = NULL;
	swarm_release(sw, sw->kept);
	sw->kept = NULL;
	swarm_xl_fini(sw);
	/* The endpoint is closed (it closed the pool's region). */
	node_serve_unmap(sw->hpool, (size_t)HAVE_SLOTS * HAVE_SLOT_MAX);
	sw->hpool = NULL;
	free(sw->hreads);
	sw->hreads = NULL;
}

/* Have-page reads in flight follow their source to its new place in the
 * list (a dropped one would leave the page to the next poll period). */
static void sources_moved(void *arg, const struct fetch_parcel *p, const uint32_t *moved,
			  struct fetch_source *ns)
{
	struct swarm *sw = arg;
	struct fetch *f = sw->x->f;

	for (uint32_t r = 0; sw->hreads != NULL && r < HAVE_SLOTS; r++) {
		struct swarm_have_read *hr = &sw->hreads[r];
		if (hr->busy && hr->gen == sw->x->gen && &f->parcels[hr->parcel] == p &&
		    hr->src_epoch == p->src_epoch && hr->src_idx < p->nsrcs && moved[hr->src_idx] != 0) {
			hr->src_idx = moved[hr->src_idx] - 1;
			hr->src_epoch = p->src_epoch + 1;
			ns[hr->src_idx].have_busy = true;
		}
	}
}

/* A chunk verified: our partial slot's have-map (for other layouts), and
 * the parcel may now wait on its peers alone: chase their pages at once,
 * not from the next tick. */
static void chunk_verified(void *arg, uint32_t pi, uint32_t c)
{
	struct swarm *sw = arg;

	swarm__xl_landed(sw, pi, c);
	swarm__chase(sw);
}

void swarm_hooks(struct swarm *sw, struct fetch_hooks *h)
{
	h->swarm = sw;
	h->sources_changed = swarm__sources_changed;
	h->sources_moved = sources_moved;
	h->chunk_verified = chunk_verified;
	h->holders_post = swarm__xl_post;
	h->holders_serve = swarm__xl_serves;
}
