/* The fetcher and one version's fetch: setup, the current fetch, the
 * parcels a manifest owes the rank, teardown. */
#include "node/fetch/fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fetcher_init(struct fetcher *x, const struct fetcher_opts *o, struct proto_err *err)
{
	x->o = *o;
	if (x->o.hfab == NULL) { /* have-pages over the chunks' endpoint */
		x->o.hfab = x->o.fab;
		x->o.hfl = x->o.fl;
	}
	x->fanout = proto_param(PROTO_PARAM_FANOUT) != 0;
	return fetch__pool_init(x, err);
}

void fetcher_close_regions(struct fetcher *x)
{
	if (x->bounce_mr != NULL)
		fab_mr_close(x->bounce_mr);
	x->bounce_mr = NULL;
}

void fetcher_stop(struct fetcher *x)
{
	if (x->rate_ev != NULL)
		event_free(x->rate_ev);
	x->rate_ev = NULL;
	x->f = NULL; /* reads the endpoint's close cancels find no fetch */
}

void fetcher_quiesce(struct fetcher *x)
{
	x->o.fab = x->o.hfab = NULL; /* closed: its handles and regions went with it */
	x->o.fl = x->o.hfl = NULL;
	node_verifier_free(x->verifier); /* no worker touches a fetch after this */
	x->verifier = NULL;
}

void fetcher_fini(struct fetcher *x)
{
	fetcher_quiesce(x);
	fetch__pool_fini(x);
	fetch_hosts_fini(x);
	fetch_conns_fini(x);
	fetch_wires_fini(x);
	json_decref(x->members_memo);
	x->members_memo = NULL;
}

void fetch_drain(struct fetcher *x)
{
	if (x->verifier != NULL)
		node_verifier_drain(x->verifier);
}

struct fetch *fetch_new(uint64_t v)
{
	struct fetch *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return NULL;
	f->version = v;
	f->started_ms = node_now_ms();
	f->faults0 = proto_process_faults();
	return f;
}

bool fetch_is_delta(const struct fetch *f, uint32_t rank)
{
	const struct proto_mlayout *ml = f->ml;
	bool delta = false;

	/* A delta version's parcels for our layout are deltas, unless our
	 * layout came by an addendum after it (addenda are always raw: a late
	 * layout gets the version whole). */
	for (uint32_t i = 0; i < ml->nparcels; i++)
		if (ml->parcels[i].dst_rank == rank)
			delta = f->man.kind == PROTO_KIND_DELTA &&
				ml->parcels[i].encoding == PROTO_ENC_DELTA;
	return delta;
}

int fetch_parcels(struct fetcher *x, struct fetch *f, struct proto_err *err)
{
	const struct proto_mlayout *ml = f->ml;
	uint32_t rank = x->o.rank, mine = 0, planned = 0;

	for (uint32_t i = 0; i < ml->nparcels; i++)
		mine += ml->parcels[i].dst_rank == rank;
	f->parcels = calloc(mine + 1, sizeof(*f->parcels));
	if (f->parcels == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	/* Every parcel the plan owes this rank must be in the manifest, with
	 * the plan's size, and nothing else. */
	for (uint32_t i = 0; i < f->plan->nparcels; i++)
		planned += f->plan->parcels[i].dst_rank == rank;
	if (planned != mine)
		return proto_errf(err, EBADMSG, "manifest lists %u parcels for rank %u, the plan %u",
				  mine, rank, planned);
	for (uint32_t i = 0; i < ml->nparcels; i++) {
		const struct proto_mparcel *mp = &ml->parcels[i];
		if (mp->dst_rank != rank)
			continue;
		const struct proto_parcel *pp = proto_plan_parcel(f->plan, mp->src_rank, mp->dst_rank);
		if (pp == NULL || pp->bytes != mp->bytes ||
		    mp->encoding != (f->delta ? PROTO_ENC_DELTA : PROTO_ENC_RAW) ||
		    (!f->delta && mp->wire_bytes != mp->bytes))
			return proto_errf(err, EBADMSG, "parcel %u<-%u does not match the plan",
					  mp->dst_rank, mp->src_rank);
		struct fetch_parcel *p = &f->parcels[f->nparcels++];
		p->mp = mp;
		p->pp = pp;
		p->state = calloc(mp->nchunks + 1, 1);
		p->asked = calloc(mp->nchunks + 1, 1);
		p->nlive = calloc(mp->nchunks + 1, 1);
		p->avail = calloc(mp->nchunks + 1, sizeof(*p->avail));
		p->peer_busy = calloc(mp->nchunks + 1, 1);
		p->busy_ms = calloc(mp->nchunks + 1, sizeof(*p->busy_ms));
		p->mine = malloc(mp->nchunks + 1);
		p->owner = calloc(mp->nchunks + 1, sizeof(*p->owner));
		p->owner_on = calloc(mp->nchunks + 1, 1);
		p->standin = calloc(mp->nchunks + 1, 1);
		if (p->state == NULL || p->asked == NULL || p->nlive == NULL || p->avail == NULL ||
		    p->peer_busy == NULL || p->busy_ms == NULL || p->mine == NULL || p->owner == NULL ||
		    p->owner_on == NULL || p->standin == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		memset(p->mine, 1, mp->nchunks + 1);
		if (f->delta && (p->wire = fetch_wire_get(x, mp->wire_bytes)) == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		f->bytes_total += mp->wire_bytes;
	}
	return 0;
}

void fetch_begin(struct fetcher *x, struct fetch *f)
{
	x->f = f;
	x->gen++;
}

void fetch_end(struct fetcher *x)
{
	fetch_reads_abandon(x);
	x->f = NULL;
	x->gen++;
}

void fetch_free(struct fetcher *x, struct fetch *f)
{
	if (f == NULL)
		return;
	if (f->up_free != NULL) /* first: the layer above lets go of the slot */
		f->up_free(f->up);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		for (size_t s = 0; s < p->nsrcs; s++) {
			fetch_source_release(x, &p->srcs[s]);
			free(p->srcs[s].info.fabric_addr);
			free(p->srcs[s].have);
		}
		free(p->srcs);
		free(p->state);
		free(p->asked);
		free(p->nlive);
		free(p->avail);
		free(p->peer_busy);
		free(p->busy_ms);
		free(p->mine);
		free(p->owner);
		free(p->owner_on);
		free(p->standin);
		free(p->members);
		fetch_wire_put(x, p->wire);
	}
	free(f->parcels);
	free(f->bad_ids);
	free(f->bad_counts);
	if (f->slot != NULL)
		node_slot_free(x->o.store, f->slot);
	if (f->have_man)
		proto_manifest_fini(&f->man);
	free(f);
}

