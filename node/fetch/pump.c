/* The pump: reads posted until the windows are full; silent sources and
 * chunks without a source, judged on the tick. */
#include "node/fetch/fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "node/base/fabloop.h"
#include "node/fetch/picker.h"

static bool holders_serve(struct fetcher *x)
{
	return x->o.hooks.holders_serve != NULL && x->o.hooks.holders_serve(x->o.hooks.swarm);
}

/* Posts reads until every source's window is full, the node's reads are
 * all out, or nothing can be fetched now. */
void fetch_pump(struct fetcher *x)
{
	struct fetch *f = x->f;

	if (f == NULL || f->complete || f->parcels == NULL)
		return;
	for (uint32_t pi = 0; pi < f->nparcels && x->inflight < x->max_inflight; pi++) {
		struct fetch_parcel *p = &f->parcels[pi];
		while (p->done < p->mp->nchunks && x->inflight < x->max_inflight) {
			uint32_t c = 0;
			bool want;
			struct fetch_source *s = fetch_pick(x, pi, &c, &want);
			/* Cross-layout holders before the trainer. */
			int h = (s == NULL || !s->info.peer) && x->o.hooks.holders_post != NULL
					? x->o.hooks.holders_post(x->o.hooks.swarm, pi, s != NULL ? c : UINT32_MAX)
					: 0;
			if (h > 0)
				continue;
			if (h < 0)
				break;
			if (s == NULL) {
				if (want)
					fetch_want_sources(x, pi);
				break;
			}
			if (fetch_read_post(x, pi, c, s) == -EAGAIN)
				return; /* no read slot free, or over the rate cap */
		}
	}
	if (x->o.fl != NULL)
		node_fabloop_kick(x->o.fl);
}

/* A source is silent when none of its reads completed for its patience (a
 * peer that answers its have-page is congested, not silent: pace.c). A
 * silent source's read moves only when another usable source holds its
 * chunk (a publisher, a peer whose have-page lists it, a cross-layout
 * holder): the read is abandoned (its slot stays reserved until it
 * completes) and the source rests. A read whose chunk nobody else holds
 * stays: asking the same source again only queues the same bytes twice.
 * The tracker is asked for sources meanwhile (NOTES.md, "Silent sources"). */
static bool other_source(struct fetcher *x, const struct fetch_parcel *p,
			 const struct fetch_source *s, uint64_t now)
{
	for (size_t k = 0; k < p->nsrcs; k++)
		if (&p->srcs[k] != s && fetch_source_usable(x, x->f, &p->srcs[k], now))
			return true;
	return p->wire == NULL && holders_serve(x);
}

/* Another usable source than s holds chunk c of p. */
static bool other_holder(struct fetcher *x, const struct fetch_parcel *p,
			 const struct fetch_source *s, uint32_t c, uint64_t now)
{
	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct fetch_source *o = &p->srcs[k];
		if (o == s || !fetch_source_usable(x, x->f, o, now))
			continue;
		if (!o->info.peer || (!o->up_refused && proto_have_bit(o->have, c)))
			return true;
	}
	return p->wire == NULL && holders_serve(x);
}

/* Whether rd is a live read of parcel pi from s. */
static bool live_from(const struct fetcher *x, struct fetch *f, const struct fetch_read *rd,
		      uint32_t pi, const struct fetch_source *s)
{
	return rd->in_fabric && !rd->abandoned && rd->gen == x->gen && rd->parcel == pi &&
	       fetch_read_source(f, rd) == s;
}

void fetch_check_silent(struct fetcher *x, struct fetch *f, uint32_t pi, uint64_t now)
{
	struct fetch_parcel *p = &f->parcels[pi];

	for (size_t k = 0; k < p->nsrcs; k++) {
		struct fetch_source *s = &p->srcs[k], *h = fetch_pace(s);
		uint32_t live = 0, moved = 0;
		if (fetch_source_congested(s, now) && !h->congested_logged) {
			h->congested_logged = true;
			f->congested++;
			LOG_DEBUG("node %s: parcel %u: %s delivered nothing for %" PRIu64 " ms, but "
				  "answered a have-page asked %" PRIu64 " ms ago: congested, its %u "
				  "reads stay",
				  x->o.id, pi, s->info.id, now - h->progress_ms,
				  now - h->answered_ms, h->inflight_reads);
		}
		if (!fetch_source_silent(s, now))
			continue;
		for (uint32_t i = 0; i < x->nreads; i++)
			live += live_from(x, f, &x->reads[i], pi, s);
		if (live == 0) /* only reads already moved elsewhere */
			continue;
		bool other = other_source(x, p, s, now);
		for (uint32_t i = 0; i < x->nreads && other; i++) {
			struct fetch_read *rd = &x->reads[i];
			if (!live_from(x, f, rd, pi, s) || !other_holder(x, p, s, rd->chunk, now))
				continue;
			rd->abandoned = true;
			moved++;
			p->nlive[rd->chunk]--;
			fetch_chunk_idle(p, rd->chunk);
		}
		if (moved == 0) {
			if (!s->silent_logged && !other)
				LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
					 " ms; no other source, waiting for it",
					 x->o.id, pi, s->info.id, now - h->progress_ms);
			else if (!s->silent_logged)
				LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
					 " ms; no other source holds the chunks of its %u reads, "
					 "waiting for it",
					 x->o.id, pi, s->info.id, now - h->progress_ms, live);
			s->silent_logged = true;
			fetch_want_sources(x, pi);
			continue;
		}
		char why[80] = "";
		if (s->info.peer && h->answered_ms == 0)
			snprintf(why, sizeof(why), " (no have-page of it answered)");
		else if (s->info.peer)
			snprintf(why, sizeof(why), " (its last have-page answered was asked %" PRIu64
				 " ms ago)", now - h->answered_ms);
		LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
			 " ms%s; moving its %u reads whose chunks another source holds elsewhere "
			 "(%u stay)",
			 x->o.id, pi, s->info.id, now - h->progress_ms, why, moved, live - moved);
		f->stalls += moved;
		proto_metrics_add(x->o.am->m, x->o.am->stalled, moved);
		s->bad_until_ms = now + BAD_SOURCE_MS;
	}
}

/*
 * Chunks no source can give: every source of their parcel is resting,
 * silent, banned or gone (a publisher that left, a tracker that lists
 * none), and none of their reads is out. Said once when it has lasted
 * NO_SOURCE_MS, with counts, and once when a source is back (at the same
 * level, so that the default log pairs them); the tracker is asked for
 * sources meanwhile (fetch_pump).
 */
static void check_sourceless(struct fetcher *x, struct fetch *f, uint64_t now)
{
	uint32_t chunks = 0, parcels = 0, listed = 0, resting = 0;

	if (!x->nosrc_said && x->nosrc_gen != x->gen)
		x->nosrc_ms = 0; /* an unsaid wait of an earlier fetch: a new one starts afresh */
	x->nosrc_gen = x->gen;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		const struct fetch_parcel *p = &f->parcels[pi];
		uint32_t todo = 0, live = 0;
		bool usable = p->wire == NULL && holders_serve(x);
		for (size_t k = 0; k < p->nsrcs && !usable; k++)
			usable = fetch_source_usable(x, f, &p->srcs[k], now);
		for (uint32_t c = 0; c < p->mp->nchunks && !usable; c++) {
			todo += p->state[c] == CHUNK_TODO;
			live += p->state[c] == CHUNK_READING || p->state[c] == CHUNK_VERIFYING;
		}
		if (usable || todo == 0 || live > 0)
			continue;
		parcels++;
		chunks += todo;
		for (size_t k = 0; k < p->nsrcs; k++) {
			listed += !p->srcs[k].self;
			resting += !p->srcs[k].self && p->srcs[k].bad_until_ms > now;
		}
	}
	if (parcels == 0) {
		if (x->nosrc_said)
			LOG_WARN("node %s: v%" PRIu64 ": a source is back after %" PRIu64 " ms without one",
				 x->o.id, f->version, now - x->nosrc_ms);
		x->nosrc_ms = 0;
		x->nosrc_said = false;
		return;
	}
	if (x->nosrc_ms == 0)
		x->nosrc_ms = now;
	if (!x->nosrc_said && now - x->nosrc_ms >= NO_SOURCE_MS) {
		LOG_WARN("node %s: v%" PRIu64 ": no source for %u chunks of %u parcels for %" PRIu64
			 " ms (%u sources known for them, %u resting after a failure); waiting for "
			 "the tracker to list one",
			 x->o.id, f->version, chunks, parcels, now - x->nosrc_ms, listed, resting);
		x->nosrc_said = true;
	}
}

/* A loop that ran late judges nothing: a tick that comes PEER_STALL_MS / 2
 * or more after the last finds every source silent, their completions
 * still waiting in our own queues. It waits one tick, for those to be
 * taken first; one only (silence_ms 0 after it), so that a loop late on
 * every tick still judges every other one (NOTES.md). */
bool fetch_silence_due(struct fetcher *x, uint64_t now)
{
	bool late = x->silence_ms != 0 && now > x->silence_ms &&
		    now - x->silence_ms >= PEER_STALL_MS / 2;

	x->silence_ms = late ? 0 : now;
	return !late;
}

void fetch_tick(struct fetcher *x)
{
	struct fetch *f = x->f;
	uint64_t now = node_now_ms();

	if (f == NULL || f->parcels == NULL)
		return;
	if (!f->complete && fetch_silence_due(x, now)) {
		for (uint32_t pi = 0; pi < f->nparcels; pi++)
			fetch_check_silent(x, f, pi, now);
		check_sourceless(x, f, now);
	}
}
