/* Our parcels served to the swarm: have-pages in front of the bytes (or the
 * version slot itself), offered to the tracker, withdrawn, and the active
 * version kept served until the next activation. */
#include "node/swarm/swarm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "node/fetch/picker.h"

static void ignore_answer(const struct trk_answer *ans, void *arg)
{
}

/* tessera_node_offered_parcels: what the tracker holds offers of now. */
static void offered_gauge(struct swarm *sw)
{
	uint64_t n = 0;

	for (int i = 0; i < 2; i++) {
		const struct fetch *f = i == 0 ? sw->x->f : sw->kept;
		for (uint32_t j = 0; f != NULL && f->so.offered && j < f->nparcels; j++)
			n += f->parcels[j].held != NULL;
	}
	proto_metrics_set(sw->x->o.am->m, sw->x->o.am->offered_parcels, n);
}

/* Whether f's verified chunks can be served from its slot: a full version
 * scattered into a slot of its own (a delta's parcels stay encoded; an
 * in-place install writes the served slot and frees the staging one), and
 * not the test's corrupt copy. */
static bool slot_servable(const struct swarm *sw, const struct fetch *f)
{
	return !f->delta && !sw->o.install_inplace && f->slot != NULL && f->slot->host != NULL &&
	       f->slot != *sw->o.active && fetch_rank_bytes(sw->x) > 0 &&
	       proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0;
}

/* Registers f's slot for peers' reads when its parcels can be served from
 * it; failure only logs (they are copied after their pages then). */
static void serve_slot(struct swarm *sw, struct fetch *f)
{
	if (!slot_servable(sw, f))
		return;
	if (node_serve_reg(sw->x->o.fab, f->slot->host, fetch_rank_bytes(sw->x), false,
			   &f->slot_mr) != 0)
		LOG_DEBUG("node %s: v%" PRIu64 ": cannot register the slot; serving copies",
			  sw->x->o.id, f->version);
}

void swarm_serve(struct swarm *sw, struct fetch *f)
{
	uint32_t served = 0, from_slot = 0;

	for (uint32_t i = 0; i < f->nparcels; i++) {
		f->parcels[i].rot = fetch_start_point(sw->x->o.id, i, f->parcels[i].mp->nchunks);
		f->parcels[i].progress_ms = node_now_ms();
	}
	f->so = (struct node_serve_offer){.version = f->version};
	/* A delta taken whole is not served to its swarm: the swarm's
	 * readers expect the delta's encoded chunks under the same parcels. */
	if (!sw->x->fanout || f->full)
		return;
	serve_slot(sw, f);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		uint32_t n = p->mp->nchunks;
		if (n == 0)
			continue;
		if (proto_have_bytes(n) > HAVE_SLOT_MAX) {
			LOG_WARN("node %s: v%" PRIu64 ": parcel %u<-%u has %u chunks, more than a "
				 "have-page read holds (%zu bytes): its swarm does not exchange it "
				 "(a larger TESSERA_CHUNK_SIZE would)",
				 sw->x->o.id, f->version, p->mp->dst_rank, p->mp->src_rank, n,
				 (size_t)HAVE_SLOT_MAX);
			continue;
		}
		p->head = (uint32_t)proto_have_page(n);
		p->from_slot = f->slot_mr != NULL;
		/* Chunks over a gathering read's ranges are copied after the page
		 * (anonymous memory: pages never written cost nothing). */
		p->held_cap = p->head + ((p->mp->wire_bytes + 4095) / 4096) * 4096;
		p->held = node_serve_map(p->held_cap);
		/* Its have-page is written now, on the loop, before the
		 * fetch's first read: in small pages. The region asks for huge
		 * ones (node_serve_map), and with THP defrag "madvise" the first
		 * touch of a huge page compacts memory in the fault: 9-178 ms a
		 * parcel here (4 nodes on loopback, 128 MiB), 0.03-5 ms in small
		 * pages, and 16 nodes on 2 cores paid it all at once right
		 * after the watch woke them. Chunks copied after the page (on
		 * the verifier's workers) keep huge pages. */
		if (p->held != NULL)
			(void)madvise(p->held, p->head, MADV_NOHUGEPAGE); /* page-rounded */
		if (p->held == NULL ||
		    proto_have_init(p->held, p->head, f->version, n, p->mp->src_rank,
				    p->mp->dst_rank) != 0 ||
		    node_serve_reg(sw->x->o.fab, p->held, p->held_cap, false, &p->held_mr) != 0) {
			LOG_WARN("node %s: v%" PRIu64 ": cannot serve parcel %u<-%u (%zu bytes); "
				 "fetching it without serving it",
				 sw->x->o.id, f->version, p->mp->dst_rank, p->mp->src_rank, p->held_cap);
			node_serve_unmap(p->held, p->held_cap);
			p->held = NULL;
			p->from_slot = false;
			continue;
		}
		if (p->from_slot) {
			struct fab_rkey rk;
			fab_mr_rkey(f->slot_mr, &rk);
			proto_have_set_slot(p->held, rk.addr, rk.key, rk.len, GATHER_RANGES);
			from_slot++;
		}
		served++;
	}
	if (from_slot == 0 && f->slot_mr != NULL) {
		fab_mr_close(f->slot_mr);
		f->slot_mr = NULL;
	}
	uint32_t chunks = 0, copied = 0;
	for (uint32_t i = 0; i < f->nparcels && from_slot > 0; i++)
		for (uint32_t c = 0; f->parcels[i].held != NULL && c < f->parcels[i].mp->nchunks; c++) {
			chunks++;
			copied += fetch_chunk_copied(sw->x, f, &f->parcels[i], c);
		}
	LOG_DEBUG("node %s: v%" PRIu64 ": %u of %u parcels served from the slot (%u of their %u "
		  "chunks copied after the page: over GATHER_RANGES ranges)",
		  sw->x->o.id, f->version, from_slot, served, copied, chunks);
	f->served = served > 0;
	/* The node's budget on each page; its rate split over the parcels. */
	for (uint32_t i = 0; i < f->nparcels && served > 0; i++) {
		uint64_t mbps = proto_param(PROTO_PARAM_UPLOAD_MBPS);
		if (f->parcels[i].held != NULL)
			proto_have_set_budget(f->parcels[i].held,
					      proto_param(PROTO_PARAM_UPLOAD_PEERS),
					      mbps == 0 ? 0 : PROTO_MAX(mbps / served, 1));
	}
	swarm__offer(sw, f); /* before we ask for sources: the swarm sees us sooner */
}

/* Frees f's served regions, withdrawing its offer. */
static void unserve(struct swarm *sw, struct fetch *f)
{
	if (f == NULL)
		return;
	if (f->served && (f->so.offered || f->so.busy) && (*sw->o.registered) && sw->x->o.trk != NULL &&
	    trk_client_offer(sw->x->o.trk, sw->x->o.id, f->version, NULL, 0, ignore_answer, NULL) != 0)
		LOG_DEBUG("node %s: could not withdraw v%" PRIu64, sw->x->o.id, f->version);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		if (p->held == NULL)
			continue;
		if (sw->x->o.fab != NULL) /* else fab_close closed it */
			fab_mr_close(p->held_mr);
		p->held_mr = NULL;
		node_serve_unmap(p->held, p->held_cap);
		p->held = NULL;
		p->from_slot = false;
	}
	/* Before the slot is freed or retired: readers of it fail and move on. */
	if (f->slot_mr != NULL && sw->x->o.fab != NULL)
		fab_mr_close(f->slot_mr);
	f->slot_mr = NULL;
	f->served = false;
	f->so.offered = false;
}

void swarm_release(struct swarm *sw, struct fetch *f)
{
	if (f == NULL)
		return;
	fetch_drain(sw->x); /* no worker copies into its served pages any more */
	unserve(sw, f);
	swarm_xl_unserve(sw, f); /* before its slot goes back to the store */
	fetch_free(sw->x, f);
}

void swarm_keep(struct swarm *sw, struct fetch *f)
{
	struct fetch *old = sw->kept;

	sw->kept = NULL;
	swarm_release(sw, old);
	if (f != NULL && !f->served) {
		swarm_release(sw, f);
		f = NULL;
	}
	sw->kept = f;
	offered_gauge(sw);
}

static struct fetch *served_fetch(struct swarm *sw, uint64_t v)
{
	if (sw->x->f != NULL && sw->x->f->version == v && sw->x->f->served)
		return sw->x->f;
	if (sw->kept != NULL && sw->kept->version == v)
		return sw->kept;
	return NULL;
}

static void on_offer(const struct trk_answer *ans, void *arg)
{
	struct swarm_ticket *t = arg;
	struct swarm *sw = t->sw;
	struct fetch *f = served_fetch(sw, t->version);
	int ok;

	t->used = false;
	if (f == NULL)
		return;
	ok = node_serve_offer_done(&f->so, ans, sw->reg_gen, "node: offering");
	if (ok == 1 && f->so.gen == sw->reg_gen && !f->so.offered) {
		f->so.offered = true;
		offered_gauge(sw);
		LOG_DEBUG("node %s: offered v%" PRIu64, sw->x->o.id, f->version);
	}
}

void swarm__offer(struct swarm *sw, struct fetch *f)
{
	struct swarm_ticket *t = NULL;
	struct trk_offer *list;
	size_t k = 0;

	if (f == NULL || !f->served || f->so.busy || f->so.offered || !(*sw->o.registered))
		return;
	for (size_t i = 0; i < sizeof(sw->tickets) / sizeof(sw->tickets[0]); i++)
		if (!sw->tickets[i].used)
			t = &sw->tickets[i];
	if (t == NULL)
		return; /* next tick */
	list = calloc(f->nparcels + 1, sizeof(*list));
	if (list == NULL)
		return;
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		if (p->held != NULL)
			node_serve_offer_fill(&list[k++], f->ml->layout_digest, p->mp->src_rank,
					      p->mp->dst_rank, p->held_mr, p->head, p->mp->wire_bytes);
	}

	*t = (struct swarm_ticket){sw, f->version, true};
	if (node_serve_offer_send(sw->x->o.trk, sw->x->o.id, &f->so, sw->reg_gen, 0, NULL, list, k,
				  swarm_xl_offer_slot(sw, f), on_offer, t) != 0)
		t->used = false;
	free(list);
}

void swarm_registered(struct swarm *sw)
{
	sw->reg_gen++;
	for (int i = 0; i < 2; i++) {
		struct fetch *f = i == 0 ? sw->x->f : sw->kept;
		if (f != NULL)
			f->so.offered = false;
	}
	offered_gauge(sw);
}
