/* Our own slot offered to readers of other layouts: the active one, or the
 * one a full fetch fills, partial, with a have-map of its verified blocks. */
#include "node/swarm/swarm_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static void have_free(struct swarm *sw, uint8_t **have, size_t *cap, struct fab_mr **mr)
{
	if (*mr != NULL && sw->x->o.fab != NULL) /* else fab_close closed it */
		fab_mr_close(*mr);
	*mr = NULL;
	node_serve_unmap(*have, *cap);
	*have = NULL;
	*cap = 0;
}

void swarm_xl_withdraw(struct swarm *sw)
{
	struct swarm_xl *x = sw->xl;

	if (x == NULL)
		return;
	if (x->slot_mr != NULL) /* readers of the slot now fail and move on */
		fab_mr_close(x->slot_mr);
	x->slot_mr = NULL;
	x->slot = NULL;
	have_free(sw, &x->slot_have, &x->slot_have_cap, &x->slot_have_mr);
	node_serve_unmap(x->liar, x->liar_len);
	x->liar = NULL;
}

void swarm_xl_unserve(struct swarm *sw, const struct fetch *f)
{
	struct swarm_xl *x = sw->xl;

	if (x == NULL || f == NULL || x->part_f != f)
		return;
	/* Before its slot goes back to the store: readers fail and move on. */
	if (x->part_mr != NULL && sw->x->o.fab != NULL)
		fab_mr_close(x->part_mr);
	x->part_mr = NULL;
	have_free(sw, &x->part_have, &x->part_have_cap, &x->part_have_mr);
	free(x->part_cnt);
	x->part_cnt = NULL;
	x->part_f = NULL;
}

/* Bytes [at, at+n) of our slot are verified and in place. */
static void part_span(void *arg, uint64_t at, uint64_t n)
{
	struct swarm *sw = arg;
	struct swarm_xl *x = sw->xl;

	proto_xmap_have_add(x->part_cnt, x->part_have, fetch_rank_bytes(sw->x), at, n);
}

static void part_mark(struct swarm *sw, const struct fetch *f, uint32_t pi, uint32_t c)
{
	const struct fetch_parcel *p = &f->parcels[pi];
	uint64_t off = (uint64_t)c * f->man.chunk_size;

	proto_parcel_dst_spans(f->plan, p->pp, sw->x->o.layout, off, p->mp->chunks[c].size, part_span, sw);
}

void swarm__xl_landed(struct swarm *sw, uint32_t pi, uint32_t c)
{
	struct swarm_xl *x = sw->xl;

	if (x != NULL && x->part_f == sw->x->f && x->part_cnt != NULL &&
	    proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0)
		part_mark(sw, sw->x->f, pi, c);
}

/* The fetch's slot is offered while it fills (a full fetch into a slot of
 * its own, its parcels served): registered for remote read with a
 * have-map, marked with what is verified so far. Failure only logs. */
void swarm__xl_part_serve(struct swarm *sw, struct swarm_xl *x)
{
	struct fetch *f = sw->x->f;
	size_t len = fetch_rank_bytes(sw->x);

	if (f == NULL || x->part_f == f || !f->served || f->delta || f->slot == NULL ||
	    f->slot->host == NULL || f->slot == *sw->o.active || f->parcels == NULL || len == 0)
		return;
	swarm_xl_unserve(sw, x->part_f);
	x->part_nblocks = proto_xmap_have_len(len);
	x->part_have_cap = (x->part_nblocks + 4095) / 4096 * 4096;
	x->part_have = node_serve_map(x->part_have_cap);
	x->part_cnt = calloc(x->part_nblocks, sizeof(*x->part_cnt));
	x->part_f = f; /* unserve frees what was made if the rest fails */
	if (x->part_have == NULL || x->part_cnt == NULL ||
	    node_serve_reg(sw->x->o.fab, x->part_have, x->part_have_cap, false, &x->part_have_mr) != 0 ||
	    node_serve_reg(sw->x->o.fab, f->slot->host, len, false, &x->part_mr) != 0) {
		LOG_WARN("node %s: v%" PRIu64 ": cannot serve the slot while fetching; readers of "
			 "other layouts wait until it is complete",
			 sw->x->o.id, f->version);
		swarm_xl_unserve(sw, f);
		x->part_f = f; /* not tried again for this fetch */
		return;
	}
	if (proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0) {
		/* Test only: a have-map that claims every block from the start. */
		memset(x->part_have, 1, x->part_nblocks);
	} else {
		/* Bytes no tensor holds (alignment, tail) come with no chunk. */
		if (proto_xmap_rank_gaps(&sw->x->o.layout->ranks[sw->x->o.rank], part_span, sw) != 0)
			LOG_DEBUG("node %s: slot gaps not counted (out of memory): blocks with "
				  "alignment gaps are served once complete",
				  sw->x->o.id);
		for (uint32_t pi = 0; pi < f->nparcels; pi++)
			for (uint32_t c = 0; c < f->parcels[pi].mp->nchunks; c++)
				if (f->parcels[pi].state[c] == CHUNK_DONE)
					part_mark(sw, f, pi, c);
	}
	x->part_in_offer = false;
	f->so.offered = false; /* offered again, with the slot */
}

void swarm_xl_serve(struct swarm *sw, const struct node_slot *active)
{
	struct swarm_xl *x;

	if (!sw->x->fanout || (x = swarm__xl_get(sw)) == NULL)
		return;
	size_t len = fetch_rank_bytes(sw->x);
	uint8_t *served;

	swarm_xl_withdraw(sw);
	if (x->part_f != NULL && x->part_f == sw->kept && x->part_mr != NULL &&
	    active == sw->kept->slot && proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0) {
		/* The slot served while it filled is the active one now: the
		 * same registration goes on (its readers keep reading), offered
		 * complete. */
		x->slot_mr = x->part_mr;
		x->slot_have = x->part_have;
		x->slot_have_cap = x->part_have_cap;
		x->slot_have_mr = x->part_have_mr;
		x->part_mr = x->part_have_mr = NULL;
		x->part_have = NULL;
		x->part_have_cap = 0;
		free(x->part_cnt);
		x->part_cnt = NULL;
		x->part_f = NULL;
		x->slot = active;
		x->slot_in_offer = false;
		sw->kept->so.offered = false;
		return;
	}
	swarm_xl_unserve(sw, x->part_f);
	if (active == NULL || active->host == NULL || sw->kept == NULL)
		return;
	served = active->host;
	if (proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0 && len > 0 &&
	    (x->liar = node_serve_map(len)) != NULL) {
		/* Test only: serve a copy with one byte in every 4 KiB flipped. */
		x->liar_len = len;
		memcpy(x->liar, served, len);
		for (size_t i = 0; i < len; i += 4096)
			x->liar[i] ^= 0x5a;
		served = x->liar;
	}
	if (node_serve_reg(sw->x->o.fab, served, len, false, &x->slot_mr) != 0) {
		LOG_WARN("node %s: v%" PRIu64 ": cannot register the slot for readers of other "
			 "layouts; serving only our parcels",
			 sw->x->o.id, active->version);
		return;
	}
	x->slot = active;
	x->slot_in_offer = false;
	sw->kept->so.offered = false; /* offered again, with the slot */
}

const struct trk_offer *swarm_xl_offer_slot(struct swarm *sw, const struct fetch *f)
{
	struct swarm_xl *x = sw->xl;
	struct fab_rkey rk;

	if (x != NULL && x->part_mr != NULL && f == x->part_f && f == sw->x->f) {
		fab_mr_rkey(x->part_mr, &rk);
		x->part_offer = (struct trk_offer){.dst_rank = sw->x->o.rank, .addr = rk.addr,
						   .key = rk.key, .len = rk.len, .partial = true};
		fab_mr_rkey(x->part_have_mr, &rk);
		x->part_offer.have_addr = rk.addr;
		x->part_offer.have_key = rk.key;
		x->part_offer.len = fetch_rank_bytes(sw->x);
		memcpy(x->part_offer.layout, sw->x->o.layout->digest, PROTO_HASH_BYTES);
		x->part_in_offer = true;
		return &x->part_offer;
	}
	if (x == NULL || x->slot_mr == NULL || f != sw->kept || x->slot->version != f->version)
		return NULL;
	fab_mr_rkey(x->slot_mr, &rk);
	x->slot_offer = (struct trk_offer){.dst_rank = sw->x->o.rank, .addr = rk.addr, .key = rk.key,
					   .len = fetch_rank_bytes(sw->x)};
	memcpy(x->slot_offer.layout, sw->x->o.layout->digest, PROTO_HASH_BYTES);
	x->slot_in_offer = true;
	return &x->slot_offer;
}


/* What serving our slot holds, freed with the rest (after fab_close). */
void swarm__xl_serve_fini(struct swarm *sw, struct swarm_xl *x)
{
	node_serve_unmap(x->liar, x->liar_len);
	x->liar = NULL;
	swarm_xl_unserve(sw, x->part_f);
	have_free(sw, &x->slot_have, &x->slot_have_cap, &x->slot_have_mr);
}
