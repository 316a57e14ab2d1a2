/* Which chunk of a parcel to read next, and from whom: rarest first among
 * what peers hold, then the trainer's chunks we own, then (starved) what
 * others are late with, then the endgame (node/fetch/picker.h). */
#include "node/fetch/picker.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Per-peer queues (NOTES.md): a reader keeps on a peer what the peer's
 * measured rate to it delivers in TESSERA_PEER_TARGET_MS; among a chunk's
 * holders it asks the one whose queue of its reads empties first; ahead of
 * its swarm (p->ahead) it keeps one read per peer (with
 * TESSERA_AHEAD_PEERS, at that many peers at once), giving way on the
 * peers' uplinks to the readers behind. */
/* A swarm peer's window: one chunk to TESSERA_PEER_INFLIGHT (holders and
 * publishers keep fetch_source_window's). */
static uint64_t peer_window(const struct fetcher *x, const struct fetch_source *s)
{
	uint64_t lo = x->chunk_size;
	uint64_t hi = PROTO_MAX(lo, proto_param(PROTO_PARAM_PEER_INFLIGHT) * x->chunk_size);
	uint64_t rate = fetch_pace(s)->rate;
	uint64_t w = rate * proto_param(PROTO_PARAM_PEER_TARGET_MS) / 1000;

	return PROTO_MIN(hi, PROTO_MAX(lo, w));
}

/* A seed reader's share of the trainer: in a swarm, any reader of a parcel
 * keeps on a publisher at most TESSERA_INFLIGHT chunks over the parcel's
 * owners (WINDOW_MIN_CHUNKS at least), so that the owners move through
 * their shares at one pace and the chunks not asked for yet stay for an
 * idle reader to take (fetch_pick_steal; NOTES.md). */
static uint64_t pub_window(const struct fetcher *x, const struct fetch_parcel *p,
			   const struct fetch_source *s)
{
	uint64_t w = fetch_source_window(x, s);
	uint64_t lo = (uint64_t)WINDOW_MIN_CHUNKS * x->chunk_size;

	if (!x->fanout || p->nowners < 2)
		return w;
	return PROTO_MIN(w, PROTO_MAX(lo, (uint64_t)x->max_inflight * x->chunk_size / p->nowners));
}

/* The trainer's last wave: while one of our publisher reads has been out
 * ENDGAME_MS for a chunk no peer holds, and no more such chunks are left
 * than the parcel has owners, our peer reads stay within WINDOW_MIN_CHUNKS
 * chunks: our downlink goes to the chunk the swarm waits for (NOTES.md). */
static bool last_wave(const struct fetch_parcel *p)
{
	uint32_t left = 0;

	for (uint32_t c = 0; c < p->mp->nchunks; c++)
		if ((p->state[c] == CHUNK_TODO || p->state[c] == CHUNK_READING) && p->avail[c] == 0 &&
		    ++left > PROTO_MAX(p->nowners, 1))
			return false;
	return true;
}

static bool trainer_late(const struct fetcher *x, uint64_t *peer_bytes, uint64_t now)
{
	const struct fetch *f = x->f;
	bool late = false;

	*peer_bytes = 0;
	/* Only with a publisher read out (its host's count; publishers are
	 * a few sources) and a parcel in its last wave: otherwise none is
	 * late, and the walk over the read slots is skipped (each a few KiB:
	 * the walk missed the cache on every slot and was a quarter of
	 * fetch_pick's time, simulated N = 256; a node that reads the
	 * trainer's chunks from peers alone, as most do in a large swarm, or
	 * an owner early in its share has no such read). */
	bool pub_out = false, wave = false;
	for (uint32_t pi = 0; pi < f->nparcels && !pub_out; pi++)
		for (size_t k = 0; k < f->parcels[pi].nsrcs && !pub_out; k++)
			pub_out = !f->parcels[pi].srcs[k].info.peer &&
				  fetch_pace(&f->parcels[pi].srcs[k])->inflight_reads > 0;
	for (uint32_t pi = 0; pi < f->nparcels && pub_out && !wave; pi++)
		wave = last_wave(&f->parcels[pi]);
	if (!wave)
		return false;
	for (uint32_t i = 0; i < x->nreads; i++) {
		const struct fetch_read *rd = &x->reads[i];
		if (!rd->in_fabric || rd->abandoned || rd->gen != x->gen || rd->parcel >= f->nparcels)
			continue;
		if (rd->src_peer) {
			*peer_bytes += rd->len;
			continue;
		}
		const struct fetch_parcel *p = &f->parcels[rd->parcel];
		if (!late && !rd->xl && now - rd->started_ms >= ENDGAME_MS &&
		    p->avail[rd->chunk] == 0 && last_wave(p))
			late = true;
	}
	return late;
}

/* s may take a read of len bytes of p now: usable and with room in its
 * window (a peer also within TESSERA_PEER_INFLIGHT reads, one while we
 * are ahead, and our peer reads within WINDOW_MIN_CHUNKS while the
 * trainer's last wave is late with us). */
static bool has_room(struct fetcher *x, const struct fetch_parcel *p, struct fetch_source *s,
		     uint64_t len)
{
	const struct fetch_source *h = fetch_pace(s); /* its host's (pace.c) */

	if (s->info.peer &&
	    h->inflight_reads >= (p->ahead ? 1 : proto_param(PROTO_PARAM_PEER_INFLIGHT)))
		return false;
	uint64_t ahead_peers = proto_param(PROTO_PARAM_AHEAD_PEERS);
	if (s->info.peer && p->ahead && ahead_peers != 0 && h->inflight_reads == 0) {
		uint32_t busy = 0; /* peers (their hosts) with reads of ours out */
		for (size_t k = 0; k < p->nsrcs; k++)
			busy += p->srcs[k].info.peer && fetch_pace(&p->srcs[k])->inflight_reads > 0 &&
				(p->srcs[k].hp == NULL || p->srcs[k].hp != s->hp);
		if (busy >= ahead_peers)
			return false;
	}
	if (s->info.peer && !fetch_budget_room(s, len, x->chunk_size))
		return false;
	if (s->info.peer && x->f->trainer_late &&
	    x->f->peer_bytes + len > (uint64_t)WINDOW_MIN_CHUNKS * x->chunk_size)
		return false;
	return h->inflight_reads == 0 ||
	       h->inflight_bytes + len <= (s->info.peer ? peer_window(x, s) : pub_window(x, p, s));
}

/* A usable source with room holding chunk c (publishers hold them all),
 * other than not; round-robin from the parcel's position. */
static struct fetch_source *holder(struct fetcher *x, struct fetch_parcel *p, uint32_t c,
				   bool peers, const struct fetch_source *not, uint64_t now)
{
	struct fetch *f = x->f;
	uint64_t len = p->mp->chunks[c].size;

	struct fetch_source *best = NULL;
	uint64_t best_ms = UINT64_MAX;
	size_t best_k = 0;

	for (size_t k = 0; k < p->nsrcs; k++) {
		struct fetch_source *s = &p->srcs[(p->rr + k) % p->nsrcs];
		uint64_t ms;
		if (s == not || s->info.peer != peers || !fetch_source_usable(x, f, s, now) ||
		    !has_room(x, p, s, len))
			continue;
		if (peers && (s->up_refused || !proto_have_bit(s->have, c)))
			continue;
		/* A peer whose queue of ours empties first (see per-peer queues). */
		ms = peers ? fetch_source_queue_ms(s, fetch_pace(s)->inflight_bytes) : 0;
		if (ms >= best_ms || !fetch_source_ready(x, s, now))
			continue;
		best = s;
		best_ms = ms;
		best_k = k;
		if (ms == 0)
			break;
	}
	if (best != NULL)
		p->rr = (uint32_t)((p->rr + best_k + 1) % p->nsrcs);
	return best;
}

/* Rarest first asks for a holder chunk by chunk; what holder() weighs
 * besides the chunk's have-bit does not change within a pick (nothing is
 * posted until it returns), so the peers it would take for a chunk of the
 * parcel's size are listed once, with their queue times, and each chunk
 * checks only their bits: a pick costs chunks + sources, not chunks x
 * sources. The choice is holder()'s: the least queued peer, ties to the
 * first from p->rr on. A chunk of another size (the parcel's last) asks
 * holder() itself, and the list is made again after it: holder() may set
 * a source aside or refill a budget. */
struct pick_peer {
	struct fetch_source *s; /* NULL: its address could not be inserted */
	uint64_t ms;            /* its queue of ours, at its rate */
	uint32_t k;             /* its index in p->srcs */
};

struct pick_peers {
	struct pick_peer *v; /* NULL: not listed yet (or no memory: holder() decides) */
	size_t n;
};

/* Lists the peers holder() would weigh for a chunk of len bytes. */
static void pick_peers_list(struct fetcher *x, struct fetch_parcel *p, uint64_t len,
			    uint64_t now, struct pick_peers *pp)
{
	pp->n = 0;
	if ((pp->v = malloc(PROTO_MAX(p->nsrcs, 1) * sizeof(*pp->v))) == NULL)
		return;
	for (size_t k = 0; k < p->nsrcs; k++) {
		struct fetch_source *s = &p->srcs[k];
		if (!s->info.peer || !fetch_source_usable(x, x->f, s, now) ||
		    !has_room(x, p, s, len) || s->up_refused)
			continue;
		pp->v[pp->n++] = (struct pick_peer){
			.s = s, .ms = fetch_source_queue_ms(s, fetch_pace(s)->inflight_bytes), .k = (uint32_t)k};
	}
}

/* holder(x, p, c, true, NULL, now), from the list when it fits c. */
static struct fetch_source *pick_holder(struct fetcher *x, struct fetch_parcel *p, uint32_t c,
					uint64_t now, struct pick_peers *pp)
{
	uint64_t len = p->mp->chunks[c].size, best_ms = UINT64_MAX;
	struct pick_peer *best = NULL;
	size_t first = 0;

	if (len != p->mp->chunks[0].size) {
		free(pp->v);
		pp->v = NULL;
		return holder(x, p, c, true, NULL, now);
	}
	if (pp->v == NULL)
		pick_peers_list(x, p, len, now, pp);
	if (pp->v == NULL)
		return holder(x, p, c, true, NULL, now);
	while (first < pp->n && pp->v[first].k < p->rr % p->nsrcs)
		first++;
	for (size_t i = 0; i < pp->n; i++) {
		struct pick_peer *pk = &pp->v[(first + i) % pp->n];
		if (pk->s == NULL || !proto_have_bit(pk->s->have, c) || pk->ms >= best_ms)
			continue;
		if (!fetch_source_ready(x, pk->s, now)) {
			pk->s = NULL;
			continue;
		}
		best = pk;
		best_ms = pk->ms;
		if (best_ms == 0)
			break;
	}
	if (best == NULL)
		return NULL;
	p->rr = (uint32_t)((best->k + 1) % p->nsrcs);
	return best->s;
}

/* Herds: rarest first sends every reader that lists a chunk's only holder
 * to it at once, each read queued on the holder's uplink behind the
 * others', and none moves when copies appear elsewhere: on a slow holder
 * the last of them waited 23 of its chunk times (simulated, 24 replicas,
 * two links at a tenth: the others at 8.9 x S/b), and on fast ones the
 * fresh chunks reached the swarm a queue at a time (16 replicas: 1.13 x
 * S/b). A reader takes a chunk held by avail of its peers in its turn:
 * about TESSERA_HERD_READERS readers per holder, chosen by a hash of the
 * reader and the chunk among the peers it lists (each of them lists about
 * as many readers as we list peers); the others read the chunk once more
 * hold it, or when they have nothing else to read and at most HERD_OUT
 * reads of the parcel out. */

/* Out of turn with at most this many reads of the parcel out: with none
 * (waiting for the last read to land first), a 1 % delta took 2.5 s
 * where it took 1.3 s without turns (simulated, N = 256, S/b 0.11 s);
 * with one, 1.1 s; with any number, N = 16 gave 1.06 instead of 1.05,
 * N = 32 1.08 instead of 1.05. */
#define HERD_OUT 1
/* Parcels of fewer chunks are read without turns: a 1 % delta's parcels
 * hold a few chunks, every reader wants them all, and turns only delayed
 * them (simulated, N = 16: 2.92, 2.19, 3.08 x S/b with them, 2.27, 2.54,
 * 2.45 without; 2.33, 2.36, 2.32 with turns from 32 chunks on). */
#define HERD_MIN_CHUNKS 32

static bool herd_turn(uint64_t seed, uint32_t c, uint32_t avail, uint32_t npeers, uint64_t herd)
{
	uint64_t share = (uint64_t)avail * herd;
	uint64_t h = seed ^ ((uint64_t)c * 0x9e3779b97f4a7c15ull);

	if (share == 0 || share >= npeers)
		return true;
	h ^= h >> 31; /* splitmix's finish: FNV's low bits mix poorly */
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 29;
	return h % npeers < share;
}

/* The source of chunk c's one read in flight, if known. */
static const struct fetch_source *reading_from(struct fetcher *x, uint32_t pi, uint32_t c,
					       uint64_t *started)
{
	struct fetch *f = x->f;
	struct fetch_parcel *p = &f->parcels[pi];

	for (uint32_t i = 0; i < x->nreads; i++) {
		const struct fetch_read *rd = &x->reads[i];
		if (rd->in_fabric && !rd->abandoned && rd->gen == x->gen && rd->parcel == pi &&
		    rd->chunk == c) {
			*started = rd->started_ms;
			return rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs
				       ? &p->srcs[rd->src_idx]
				       : NULL;
		}
	}
	return NULL;
}

/* Whether the publisher pass may ask for chunk c: no peer holds it and
 * none is fetching it; late (the starved pass), only one a peer has been
 * fetching since before busy_before, or (idle_too) also one nobody is. */
static bool pub_wanted(const struct fetch_parcel *p, uint32_t c, bool late, uint64_t busy_before,
		       bool idle_too)
{
	if (p->state[c] != CHUNK_TODO || p->avail[c] != 0)
		return false;
	if (!late)
		return !p->peer_busy[c];
	return p->peer_busy[c] ? p->busy_ms[c] < busy_before : idle_too;
}

/* The chunk to ask a publisher for next, UINT32_MAX if none, from our own
 * starting point on: pass 0, a chunk we own (p->mine; all of them while we
 * know no other member); pass 1, once the parcel went hungry (p->hungry),
 * also chunks whose owner does not serve the parcel (a member that does
 * not fetch this version owns chunks nobody would get); pass 2, starved
 * now, a chunk a peer has been fetching for longer than busy_patience(),
 * and, starved that long ourselves, any chunk no peer holds (owners that
 * disagree on who owns what). Others' chunks are not taken early: their
 * owners are on them, and helpers grabbing them meet the owners on the
 * trainer's link (measured: 8 nodes on loopback, 2 to 4 copies with
 * helpers, about one without). */
static uint32_t pub_next(const struct fetch_parcel *p, int pass, uint64_t busy_before,
			 bool idle_too)
{
	uint32_t n = p->mp->nchunks;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t c = (p->rot + k) % n;
		if ((p->mine[c] || (pass == 1 && !p->owner_on[c]) || pass == 2) &&
		    pub_wanted(p, c, pass == 2, busy_before, idle_too))
			return c;
	}
	return UINT32_MAX;
}

/* A peer fetching a chunk from the trainer is late once it has been at it
 * for four times what our own window to the trainer takes at our measured
 * rate (it shares the trainer's link with us), and TESSERA_STALL_MS at
 * least: only then may a starved node take the chunk from the trainer too.
 * A fixed STARVE_MS sent the trainer's link a second copy of chunks that
 * were merely queued behind the others on it. */
static uint64_t busy_patience(struct fetcher *x, const struct fetch_parcel *p)
{
	uint64_t ms = 3 * proto_param(PROTO_PARAM_STALL_MS);

	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct fetch_source *s = &p->srcs[k];
		if (!s->info.peer && fetch_pace(s)->rate != 0)
			ms = PROTO_MAX(proto_param(PROTO_PARAM_STALL_MS),
				       4 * fetch_source_queue_ms(s, fetch_source_window(x, s)));
	}
	return ms;
}

/* Stealing from the slowest owner: a seed reader whose own chunks have all
 * left the trainer takes one of an owner with STEAL_LEFT or more chunks not
 * started (the most such first), from the back half of the owner's walk,
 * and only a chunk it stands in for (p->standin: two idle readers never
 * take the same one) of an owner whose have-page was asked for within
 * STEAL_FRESH_MS (NOTES.md). UINT32_MAX when there is none. */
/* An owner with two chunks not started gives up the second: with its
 * window on the trainer at its share (pub_window), an owner at the end of
 * a slow walk has two or three chunks left, not four, and at four the
 * idle readers stole nothing from 10 s on (16 nodes, 100 Mbit/s netns). */
#define STEAL_LEFT 2
#define STEAL_FRESH_MS(poll) (3 * (poll))

/* Whether the page of member k, as we hold it, was asked for since after. */
static bool page_since(const struct fetch_parcel *p, uint32_t k, uint64_t after)
{
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct fetch_source *s = &p->srcs[j];
		if (s->info.peer && s->have != NULL && fetch_source_member(p, s) == k)
			return s->have_page_ms >= after;
	}
	return false;
}

uint32_t fetch_pick_steal(const struct fetcher *x, uint32_t pi)
{
	const struct fetch_parcel *p = &x->f->parcels[pi];
	uint32_t n = p->mp->nchunks, best = UINT32_MAX, *left;
	uint64_t now = node_now_ms(), fresh = STEAL_FRESH_MS(proto_param(PROTO_PARAM_HAVE_POLL_MS));
	uint8_t *ours; /* per member: we stand in for one of its chunks */

	/* No owner holds STEAL_LEFT chunks when the even split gives each
	 * fewer (fetch_owners caps every owner's load at it): a swarm with
	 * more members than chunks, where the walk below over the members at
	 * every pick was a third of a simulated node's time (N = 256). */
	if (!x->fanout || !p->seed || p->nmembers == 0 || p->standin == NULL ||
	    (n + PROTO_MAX(p->nowners, 1) - 1) / PROTO_MAX(p->nowners, 1) < STEAL_LEFT ||
	    (left = calloc(p->nmembers, sizeof(*left))) == NULL)
		return UINT32_MAX;
	if ((ours = calloc(p->nmembers, 1)) == NULL) {
		free(left);
		return UINT32_MAX;
	}
	for (uint32_t c = 0; c < n; c++)
		if (!p->mine[c] && p->owner[c] < p->nmembers && p->owner_on[c] &&
		    pub_wanted(p, c, false, 0, false)) {
			left[p->owner[c]]++;
			ours[p->owner[c]] |= p->standin[c];
		}
	/* The owners with the most left first (the first of them in members
	 * on a tie): the first walk that finds a chunk ends it, not one walk
	 * of the chunks per owner. Only owners we stand in for are walked
	 * (no other walk can find one: with hundreds of members, walking
	 * every owner was most of a simulated node's time). Each pass sets
	 * one owner's count to 0, below STEAL_LEFT: the loop ends. */
	while (best == UINT32_MAX) {
		uint32_t k = UINT32_MAX, skip, rot;
		for (uint32_t j = 0; j < p->nmembers; j++)
			if (ours[j] && left[j] >= STEAL_LEFT && (k == UINT32_MAX || left[j] > left[k]))
				k = j;
		if (k == UINT32_MAX)
			break;
		skip = (left[k] + 1) / 2; /* its next ones are left to it */
		left[k] = 0;              /* walked */
		if (!page_since(p, k, now > fresh ? now - fresh : 0))
			continue;
		rot = fetch_start_point(p->members[k], pi, n);
		for (uint32_t j = 0; j < n; j++) { /* the last one it would reach */
			uint32_t c = (rot + j) % n;
			if (p->mine[c] || p->owner[c] != k || !p->owner_on[c] ||
			    !pub_wanted(p, c, false, 0, false))
				continue;
			if (skip > 0) {
				skip--;
				continue;
			}
			if (p->standin[c])
				best = c;
		}
	}
	free(ours);
	free(left);
	return best;
}

struct fetch_source *fetch_pick(struct fetcher *x, uint32_t pi, uint32_t *chunk,
				      bool *want_sources)
{
	struct fetch *f = x->f;
	struct fetch_parcel *p = &f->parcels[pi];
	uint32_t n = p->mp->nchunks, best = UINT32_MAX, live = 0;
	uint64_t now = node_now_ms();
	struct fetch_source *s, *best_s = NULL;
	bool todo = false, any = false;

	for (size_t k = 0; k < p->nsrcs; k++)
		any |= fetch_source_usable(x, f, &p->srcs[k], now);
	*want_sources = !any;
	/* A pump picks once per read it posts: judged at each pick while
	 * late (each peer read posted counts), else once per ms (no read
	 * becomes late within the ms it was judged not to be). */
	if (!x->fanout) {
		f->trainer_late = false;
	} else if (f->trainer_late || f->late_judged_ms != now) {
		f->trainer_late = trainer_late(x, &f->peer_bytes, now);
		f->late_judged_ms = now;
	}
	/* 1. Rarest first among chunks peers hold: only peers with a have-page
	 * hold any (avail counts them; pick_holder takes only those). Without
	 * one the walk would find nothing: what else it counts is two scans
	 * of the state bytes (a walk per pick, over every chunk, was as much
	 * of a lone node's CPU as hashing what it fetched). */
	uint32_t npeers = 0;
	bool later = false; /* a chunk passed over: not our turn */
	for (size_t k = 0; k < p->nsrcs; k++)
		npeers += p->srcs[k].info.peer && p->srcs[k].have != NULL && !p->srcs[k].self;
	bool paged = npeers > 0;
	uint64_t seed = paged ? fetch_fnv(0x9e3779b97f4a7c15ull ^ pi, x->o.id) : 0;
	uint64_t herd = proto_param(PROTO_PARAM_HERD_READERS);
	if (n < HERD_MIN_CHUNKS)
		herd = 0; /* every reader wants the same few chunks: no turns */
	if (!paged) {
		todo = memchr(p->state, CHUNK_TODO, n) != NULL;
		live = memchr(p->state, CHUNK_READING, n) != NULL;
	}
	struct pick_peers pp = {0};
	/* In turns; then, with nothing else to read and at most HERD_OUT
	 * reads of the parcel out, the chunks passed over, rarest first all
	 * the same. */
	for (int pass = 0; paged && pass < 2; pass++) {
		if (pass == 1 && (best_s != NULL || !later || live > HERD_OUT))
			break;
		for (uint32_t k = 0; k < n; k++) {
			uint32_t c = (p->rot + k) % n;
			if (pass == 0 && p->state[c] == CHUNK_READING)
				live++;
			if (p->state[c] != CHUNK_TODO)
				continue;
			todo = true;
			if (p->avail[c] == 0 || p->avail[c] >= best)
				continue;
			if (pass == 0 && !herd_turn(seed, c, p->avail[c], npeers, herd)) {
				later = true;
				continue;
			}
			if ((s = pick_holder(x, p, c, now, &pp)) != NULL) {
				best = p->avail[c];
				best_s = s;
				*chunk = c;
				if (best == 1)
					break; /* none rarer: what the walk counts besides is not needed */
			}
		}
	}
	free(pp.v);
	if (best_s != NULL)
		return best_s;
	/* Not from a publisher while a peer's have-page is still to come: it
	 * may hold what we would ask the trainer for (a member that started
	 * late would otherwise take its whole share from the trainer again);
	 * for HAVE_WAIT_MS after the tracker listed it at most: at a version's
	 * start nobody holds anything, and waiting on every peer's first page
	 * (a connection each) left the trainer's link idle for seconds. Not at
	 * all while the version is fresh (fetch->fresh_until_ms): no peer can hold
	 * a chunk we own yet, and passes 1 and 2 wait STARVE_MS anyway. */
	for (size_t k = 0; k < p->nsrcs && now >= f->fresh_until_ms; k++) {
		const struct fetch_source *o = &p->srcs[k];
		if (x->fanout && o->info.peer && !o->self && o->have == NULL &&
		    o->bad_until_ms <= now && !fetch_banned(f, o->info.id) &&
		    now - o->listed_ms < HAVE_WAIT_MS)
			return NULL;
	}
	/* 2. From a publisher: what no peer holds or fetches, ours first
	 * (then, hungry, what nobody serving owns); 3. when starved, what a
	 * peer is late with. */
	bool starved = live == 0 && now - p->progress_ms >= STARVE_MS;
	p->hungry |= starved;
	for (int pass = 0; pass < 3 && todo; pass++) {
		uint32_t c;
		if ((pass == 1 && !p->hungry) || (pass == 2 && !starved))
			break;
		uint64_t patience = pass == 2 ? busy_patience(x, p) : 0;
		bool stolen = false;
		c = pub_next(p, pass, now > patience ? now - patience : 1, now - p->progress_ms >= patience);
		if (c == UINT32_MAX && pass == 0 && (c = fetch_pick_steal(x, pi)) != UINT32_MAX)
			stolen = true;
		if (c == UINT32_MAX)
			continue;
		if ((s = holder(x, p, c, false, NULL, now)) == NULL)
			return NULL; /* no publisher with room */
		if (stolen)
			LOG_DEBUG("node %s: parcel %u: our chunks have left the trainer: chunk %u of "
				  "%s's from %s", x->o.id, pi, c, p->members[p->owner[c]], s->info.id);
		if (pass == 2)
			LOG_DEBUG("node %s: parcel %u: starved for %" PRIu64 " ms: chunk %u from %s",
				  x->o.id, pi, now - p->progress_ms, c, s->info.id);
		*chunk = c;
		return s;
	}
	/* 4. Endgame. */
	if (todo)
		return NULL;
	for (uint32_t c = 0; c < n; c++) {
		uint64_t started = now;
		const struct fetch_source *cur;
		if (p->state[c] != CHUNK_READING || p->nlive[c] != 1)
			continue;
		cur = reading_from(x, pi, c, &started);
		/* Late only against what its source's measured rate predicts
		 * for the bytes queued on it: a read that is merely queued
		 * behind others is not asked for twice. */
		if (now - started < PROTO_MAX(ENDGAME_MS, 2 * fetch_source_queue_ms(
								  cur, cur != NULL ? fetch_pace(cur)->inflight_bytes : 0)))
			continue;
		/* From the trainer too, unless we are one of many that read it
		 * only from peers (a sampled swarm's non-member): there every
		 * late tail read went to the trainer as well (N = 500,
		 * simulated: 9 % of S more from the trainer, none of it
		 * needed); a read whose source fails comes back to the passes
		 * above. */
		if ((s = holder(x, p, c, true, cur, now)) != NULL ||
		    ((!p->sampled || p->seed) && (s = holder(x, p, c, false, cur, now)) != NULL)) {
			LOG_DEBUG("node %s: parcel %u: endgame: chunk %u out %" PRIu64 " ms, also from %s",
				  x->o.id, pi, c, now - started, s->info.id);
			*chunk = c;
			return s;
		}
	}
	return NULL;
}
