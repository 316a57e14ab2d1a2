/* The swarm's have-pages: what each peer holds and fetches, read every
 * TESSERA_HAVE_POLL_MS, or chased every TESSERA_HAVE_CHASE_MS while a
 * parcel waits on its peers alone. */
#include "node/swarm/swarm_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/base/fabloop.h"
#include "node/fetch/picker.h"

static void poll_haves(struct swarm *sw, struct fetch *f, uint32_t pi, uint64_t now);
static void chase_arm(struct swarm *sw);

/* The fetcher's hook: parcel pi has a new source list (recounted). */
void swarm__sources_changed(void *arg, uint32_t pi)
{
	struct swarm *sw = arg;

	if (sw->x->fanout)
		poll_haves(sw, sw->x->f, pi, node_now_ms()); /* new peers: read them now */
}

static void on_have(struct fab_op *op, int status)
{
	struct swarm_have_read *hr = proto_container_of(op, struct swarm_have_read, op);
	struct swarm *sw = hr->sw;
	struct fetch *f = sw->x->f;
	struct proto_have h;
	struct proto_err err;

	hr->busy = false;
	if (f == NULL || hr->gen != sw->x->gen || f->parcels == NULL)
		return;
	struct fetch_parcel *p = &f->parcels[hr->parcel];
	if (hr->src_epoch != p->src_epoch || hr->src_idx >= p->nsrcs)
		return; /* the source list changed: the next poll asks again */
	struct fetch_source *s = &p->srcs[hr->src_idx];
	uint32_t n = p->mp->nchunks;
	s->have_busy = false;
	if (status != 0) {
		LOG_DEBUG("node %s: have-page of %s: read failed: %d", sw->x->o.id, s->info.id, status);
		fetch_source_failed(sw->x, s);
		return;
	}
	const uint8_t *buf = sw->hpool + (size_t)hr->slot * HAVE_SLOT_MAX;
	int rc = proto_have_parse(buf, proto_have_bytes(n), &h, &err);
	if (rc == 0 && (h.version != f->version || h.nchunks != n || h.src_rank != p->mp->src_rank ||
			h.dst_rank != p->mp->dst_rank)) {
		rc = -EINVAL;
		snprintf(err.msg, sizeof(err.msg), "have-page for v%" PRIu64 " parcel %u<-%u with %u chunks",
			 h.version, h.dst_rank, h.src_rank, h.nchunks);
	}
	if (rc == 0 && h.slot_len != 0 && p->wire != NULL) {
		rc = -EINVAL; /* a delta's chunks are encoded: no slot holds them */
		snprintf(err.msg, sizeof(err.msg), "have-page serves a delta parcel from a slot");
	}
	if (rc != 0) {
		LOG_WARN("node %s: v%" PRIu64 ": peer %s: %s; dropped", sw->x->o.id, f->version,
			 s->info.id, err.msg);
		fetch_source_failed(sw->x, s);
		(void)fetch_bad_peer(sw->x, f, s->info.id);
		return;
	}
	if (fetch_source_page(sw->x, p, s, &h) != 0)
		return;
	if (f->su.have == 0)
		f->su.have = proto_wall_ms();
	fetch_recount(f, p);
	fetch_pump(sw->x);
	chase_arm(sw);
}

static struct swarm_have_read *free_have_read(struct swarm *sw)
{
	for (uint32_t i = 0; i < HAVE_SLOTS; i++)
		if (!sw->hreads[i].busy)
			return &sw->hreads[i];
	return NULL;
}

/* Whether the parcel waits on its peers alone: none of our reads of it in
 * flight, and at most CHASE_LEFT_BYTES of chunks left that no peer holds
 * yet (4 chunks at least), a peer fetching or owning each (the end of a
 * parcel: all of a delta's). The pages of those peers are then read every
 * TESSERA_HAVE_CHASE_MS: the chunk is on its way to them. Bounded in bytes
 * so that a big parcel's idle readers do not read every owner's page at
 * that rate for seconds. */
#define CHASE_LEFT_BYTES (2u << 20)

static bool waits_on_peers(const struct fetch_parcel *p)
{
	uint32_t left = 0, most = 4;

	if (p->mp->nchunks > 0 && p->mp->chunks[0].size > 0)
		most = PROTO_MAX(most, CHASE_LEFT_BYTES / p->mp->chunks[0].size);
	for (uint32_t c = 0; c < p->mp->nchunks; c++) {
		if (p->state[c] == 1)
			return false;
		if (p->state[c] != 0 || p->avail[c] != 0)
			continue;
		if ((!p->peer_busy[c] && p->mine[c]) || ++left > most)
			return false; /* ours to take from a publisher, or too many */
	}
	return left > 0;
}

/* Whether s fetches (its last page's busy bits) or owns a chunk we wait for. */
static bool fetches_ours(const struct fetch_parcel *p, const struct fetch_source *s)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8, k = fetch_source_member(p, s);

	for (uint32_t c = 0; c < n; c++) {
		if (p->state[c] != 0 || p->avail[c] != 0)
			continue;
		if ((s->have != NULL && proto_have_bit(s->have + bl, c)) ||
		    (k != UINT32_MAX && p->owner[c] == k))
			return true;
	}
	return false;
}

static void on_chase(evutil_socket_t fd, short what, void *arg)
{
	struct swarm *sw = arg;
	struct fetch *f = sw->x->f;
	uint64_t now = node_now_ms();

	(void)fd;
	(void)what;
	if (!sw->x->fanout || f == NULL || f->parcels == NULL || f->complete)
		return;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		struct fetch_parcel *p = &f->parcels[pi];
		/* An owner the tracker did not list yet (fetch_sources_gap). */
		if (p->done < p->mp->nchunks && now - p->sources_ms >= fetch_sources_gap(f, p, true, now))
			fetch_want_sources(sw->x, pi);
		poll_haves(sw, f, pi, now);
	}
	node_fabloop_kick(sw->x->o.fl);
	chase_arm(sw);
}

void swarm__chase(struct swarm *sw)
{
	chase_arm(sw);
}

/* Arms the chase timer while a parcel waits on its peers. */
static void chase_arm(struct swarm *sw)
{
	struct fetch *f = sw->x->f;
	bool waits = false;

	if (!sw->x->fanout || f == NULL || f->parcels == NULL || f->complete)
		return;
	for (uint32_t pi = 0; pi < f->nparcels && !waits; pi++)
		waits = f->parcels[pi].done < f->parcels[pi].mp->nchunks &&
			waits_on_peers(&f->parcels[pi]);
	if (!waits)
		return;
	if (sw->chase_ev == NULL && (sw->chase_ev = evtimer_new(sw->x->o.base, on_chase, sw)) == NULL)
		return; /* the tick polls them, as ever */
	if (!evtimer_pending(sw->chase_ev, NULL))
		node_arm(sw->chase_ev, proto_param(PROTO_PARAM_HAVE_CHASE_MS));
}

/* Reads the have-pages of the parcel's peers that are due. */
static void poll_haves(struct swarm *sw, struct fetch *f, uint32_t pi, uint64_t now)
{
	struct fetch_parcel *p = &f->parcels[pi];
	uint32_t n = p->mp->nchunks;
	uint64_t slow = proto_param(PROTO_PARAM_HAVE_POLL_MS), period;
	bool chase;

	if (p->done == n || proto_have_bytes(n) > HAVE_SLOT_MAX)
		return;
	chase = waits_on_peers(p);
	for (size_t k = 0; k < p->nsrcs; k++) {
		struct fetch_source *s = &p->srcs[k];
		struct swarm_have_read *hr;
		period = chase && fetches_ours(p, s)
				 ? PROTO_MIN(slow, proto_param(PROTO_PARAM_HAVE_CHASE_MS))
				 : slow;
		if (!s->info.peer || s->self || s->have_busy || now - s->have_ms < period ||
		    s->bad_until_ms > now || fetch_banned(f, s->info.id))
			continue;
		fi_addr_t hfa;
		if (!fetch_source_ready(sw->x, s, now) || fetch_have_addr(sw->x, s, &hfa) != 0 ||
		    (hr = free_have_read(sw)) == NULL)
			continue;
		uint64_t head = proto_have_page(n);
		struct fab_rkey rk = {s->info.addr - head, s->info.key, head};
		*hr = (struct swarm_have_read){.sw = sw, .gen = sw->x->gen, .parcel = pi,
					       .src_idx = (uint32_t)k, .src_epoch = p->src_epoch,
					       .slot = (uint32_t)(hr - sw->hreads), .busy = true};
		s->have_ms = now;
		if (s->info.addr < head ||
		    fab_read(sw->x->o.hfab, &hr->op, sw->hpool_mr, (size_t)hr->slot * HAVE_SLOT_MAX,
			     proto_have_bytes(n), hfa, &rk, 0, on_have) != 0) {
			hr->busy = false;
			fetch_source_failed(sw->x, s);
			continue;
		}
		s->have_busy = true;
		if (sw->x->o.hfl != sw->x->o.fl)
			node_fabloop_kick(sw->x->o.hfl);
	}
}

void swarm_tick(struct swarm *sw)
{
	struct fetch *f = sw->x->f;
	uint64_t now = node_now_ms();

	swarm__offer(sw, f);
	swarm__offer(sw, sw->kept);
	if (!sw->x->fanout || f == NULL || f->parcels == NULL || f->complete)
		return;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		struct fetch_parcel *p = &f->parcels[pi];
		bool peers = fetch_sources_refresh(sw->x, pi, now);
		if (p->done < p->mp->nchunks && peers)
			fetch_recount(f, p); /* peers that rest or were banned since */
		poll_haves(sw, f, pi, now);
	}
	node_fabloop_kick(sw->x->o.fl);
	chase_arm(sw);
}
