/* Peer fanout: the parcels a node serves (have-pages, offers), what its
 * swarm peers hold, which chunk to read from whom, and bad peers. */
#include "node/agent/agent_internal.h"

/*
 * Swarm model. Nodes that need the same parcel (version, layout, src and
 * dst rank) form its swarm; the tracker lists its members as "peer"
 * sources as soon as they offer it, before the publishers. A member offers
 * the parcel's have-page (proto/have.h) in a registered region of its own
 * (node/serve.h); the bytes are served straight from the version slot the
 * verifier scattered them into (registered once per fetch, its key on the
 * page), so a received chunk is copied once: a reader gathers chunk c from
 * the slot's spans (fab_readv, fab_rma_segs ranges a read, GATHER_RANGES
 * at most). A chunk lands in a read slot, is
 * hashed against the signed manifest and scattered into the version slot;
 * only then is its have bit set, so nothing unverified is ever served.
 * Where the slot cannot serve (a delta's parcels are kept encoded, an
 * in-place install writes the served slot, a chunk spans more than
 * GATHER_RANGES ranges) the bytes are copied after the page instead.
 * The slot's registration is closed before the slot can be freed or
 * written by anything else (agent_swarm_unserve, from agent_fetch_free;
 * the kept version's at the next activation, before the old slot is
 * retired).
 *
 * Members learn what the others hold by reading their have-pages over the
 * fabric every TESSERA_HAVE_POLL_MS (one-sided reads: no receive buffers,
 * nothing a stranger can push); a parcel that waits on its peers alone
 * (nothing of ours in flight, a chunk left that a peer is fetching) reads
 * the pages of the peers fetching it every TESSERA_HAVE_CHASE_MS instead,
 * on a timer of its own, so that each hop of a chunk across the swarm
 * costs a few ms, not up to a poll period and a tick (a delta's few
 * chunks cross the swarm in hops). Chunk choice, per parcel:
 *   1. rarest first among chunks some usable peer holds (fewest holders;
 *      among equals the first from our own starting point), from a holder
 *      with room (at most TESSERA_PEER_INFLIGHT reads per peer);
 *   2. else, from a publisher, a chunk no peer holds and no peer is
 *      fetching (its busy bit), among those we own. Chunk c's owner
 *      is the member (the swarm as /sources lists it, "members": also
 *      those that did not offer yet; under TESSERA_PUB_UPLOAD_READERS
 *      only the parcel's seed readers, pick_seeds) with the highest hash
 *      of (its id, parcel, c): rendezvous hashing, so members that know
 *      different subsets of the swarm still agree on most owners. Loads
 *      are bounded: in chunk order, a member that already owns its even
 *      share (chunks / owners, rounded up) passes the chunk on to the
 *      next highest. Unbounded, the shares of 8 members ranged from 11
 *      to 29 of 124 chunks: the light owners were done with the trainer
 *      early and its last seconds went to one or two readers, whose
 *      downlinks, shared with their peers' traffic, took a fraction of
 *      the trainer's link while the rest of it stood idle. The
 *      trainer's chunks go to one reader each and spread over the swarm
 *      (super-seeding done by the readers: one-sided reads give the
 *      publisher no say); have-pages are a poll old, ownership is what
 *      keeps two readers off the same chunk meanwhile;
 *   3. else, once nothing of the parcel was in flight for us and none of
 *      its chunks came for STARVE_MS (the parcel is hungry from then on),
 *      chunks whose owner does not serve the parcel (members that do not
 *      fetch this version own chunks too); while that lasts, a chunk a
 *      peer has been fetching for longer than our own reads from the
 *      trainer would take at its measured rate (busy_patience: a slow
 *      peer must not hold us up, a merely queued one must not cost the
 *      trainer a second copy; a dead one's busy bits are forgotten once
 *      its page cannot be read), and, starved that long, any chunk no
 *      peer holds;
 *   4. endgame: with nothing left to ask for, a chunk whose only read has
 *      been out ENDGAME_MS, and twice what its source's measured rate
 *      predicts for the bytes queued on it, is asked once more from
 *      another source; the later copy counts as duplicate bytes.
 * Each member starts its walk over the chunks at its own point (a hash of
 * its id), so the first chunks it takes from the trainer differ from its
 * peers' before any have-page has been read.
 * A peer's upload budget (announced on its have-page) may leave us out
 * or limit our rate from it: see "upload budgets" below.
 *
 * A chunk that fails its hash is dropped and fetched again; the second
 * one from the same peer bans it for the rest of the version (logged,
 * counted, and reported to the tracker with the node's state). A peer
 * that dies fails its reads and its have-page reads (its reads go back to
 * the pool at once, it rests, and its have and busy bits stop counting) or
 * goes silent, answering neither chunks nor have-pages (its reads move
 * after PEER_STALL_MS; one that answers its page is congested and keeps
 * them for longer, agent_fetch.c).
 *
 * Cost: choosing a chunk walks the parcel's chunks (and recounting, every
 * tick, its peers' bitmaps): fine for thousands of chunks per parcel and
 * tens of peers; bigger swarms want per-peer deltas instead.
 */

static void ignore_answer(const struct trk_answer *ans, void *arg)
{
}

/* tessera_node_offered_parcels: what the tracker holds offers of now. */
static void offered_gauge(struct node_agent *a)
{
	uint64_t n = 0;

	for (int i = 0; i < 2; i++) {
		const struct agent_fetch *f = i == 0 ? a->fetch : a->kept;
		for (uint32_t j = 0; f != NULL && f->so.offered && j < f->nparcels; j++)
			n += f->parcels[j].held != NULL;
	}
	proto_metrics_set(a->am.m, a->am.offered_parcels, n);
}

int agent_swarm_init(struct node_agent *a)
{
	size_t len = (size_t)HAVE_SLOTS * HAVE_SLOT_MAX;
	int rc;

	a->fanout = proto_param(PROTO_PARAM_FANOUT) != 0;
	if (!a->fanout)
		return 0;
	a->hpool = node_serve_map(len);
	a->hreads = calloc(HAVE_SLOTS, sizeof(*a->hreads));
	if (a->hpool == NULL || a->hreads == NULL)
		return -ENOMEM;
	if (a->hfab == NULL) /* an agent set up without a host (tests) */
		a->hfab = a->fab, a->hfl = a->fl;
	rc = fab_mr_reg(a->hfab, a->hpool, len, FAB_MR_READ, &a->hpool_mr);
	return rc;
}

void agent_swarm_fini(struct node_agent *a)
{
	if (a->chase_ev != NULL)
		event_free(a->chase_ev);
	a->chase_ev = NULL;
	agent_fetch_free(a, a->kept);
	a->kept = NULL;
	/* The endpoint is closed (it closed the pool's region). */
	node_serve_unmap(a->hpool, (size_t)HAVE_SLOTS * HAVE_SLOT_MAX);
	a->hpool = NULL;
	free(a->hreads);
	a->hreads = NULL;
}

/* ---- what we serve -------------------------------------------------------- */

void agent_swarm_mark(struct agent_parcel *p, uint32_t c, int what)
{
	if (p->held == NULL)
		return;
	proto_have_mark(p->held, c, false, what == AGENT_MARK_BUSY);
	if (what == AGENT_MARK_HAVE)
		proto_have_mark(p->held, c, true, true);
}

static uint32_t start_point(const char *id, uint32_t pi, uint32_t n)
{
	uint64_t h = 1469598103934665603ull ^ pi;

	for (const char *c = id; *c; c++)
		h = (h ^ (uint8_t)*c) * 1099511628211ull;
	return n == 0 ? 0 : (uint32_t)(h % n);
}

static void offer(struct node_agent *a, struct agent_fetch *f);

/* Whether f's verified chunks can be served from its slot: a full version
 * scattered into a slot of its own (a delta's parcels stay encoded; an
 * in-place install writes the served slot and frees the staging one), and
 * not the test's corrupt copy. */
static bool slot_servable(const struct node_agent *a, const struct agent_fetch *f)
{
	return !f->delta && !a->o.install_inplace && f->slot != NULL && f->slot->host != NULL &&
	       f->slot != a->active && a->layout.ranks[a->o.rank].nbytes > 0 &&
	       proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0;
}

uint32_t agent_chunk_spans(const struct node_agent *a, const struct agent_fetch *f,
			   const struct agent_parcel *p, uint32_t c, struct proto_span sp[GATHER_RANGES])
{
	size_t n = proto_parcel_spans(f->plan, p->pp, &a->layout, (uint64_t)c * f->man.chunk_size,
				      p->mp->chunks[c].size, sp, GATHER_RANGES);
	return (uint32_t)PROTO_MIN(n, UINT32_MAX);
}

bool agent_chunk_copied(const struct node_agent *a, const struct agent_fetch *f,
			const struct agent_parcel *p, uint32_t c)
{
	struct proto_span sp[GATHER_RANGES];

	return p->held != NULL &&
	       (!p->from_slot || agent_chunk_spans(a, f, p, c, sp) > GATHER_RANGES);
}

/* Registers f's slot for peers' reads when its parcels can be served from
 * it; failure only logs (they are copied after their pages then). */
static void serve_slot(struct node_agent *a, struct agent_fetch *f)
{
	if (!slot_servable(a, f))
		return;
	if (node_serve_reg(a->fab, f->slot->host, a->layout.ranks[a->o.rank].nbytes, false,
			   &f->slot_mr) != 0)
		LOG_DEBUG("node %s: v%" PRIu64 ": cannot register the slot; serving copies",
			  a->node_id, f->version);
}

void agent_swarm_serve(struct node_agent *a, struct agent_fetch *f)
{
	uint32_t served = 0, from_slot = 0;

	for (uint32_t i = 0; i < f->nparcels; i++) {
		f->parcels[i].rot = start_point(a->node_id, i, f->parcels[i].mp->nchunks);
		f->parcels[i].progress_ms = agent_now_ms();
	}
	f->so = (struct node_serve_offer){.version = f->version};
	/* A delta taken whole is not served to its swarm: the swarm's
	 * readers expect the delta's encoded chunks under the same parcels. */
	if (!a->fanout || f->full)
		return;
	serve_slot(a, f);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		uint32_t n = p->mp->nchunks;
		if (n == 0)
			continue;
		if (proto_have_bytes(n) > HAVE_SLOT_MAX) {
			LOG_WARN("node %s: v%" PRIu64 ": parcel %u<-%u has %u chunks, more than a "
				 "have-page read holds (%zu bytes): its swarm does not exchange it "
				 "(a larger TESSERA_CHUNK_SIZE would)",
				 a->node_id, f->version, p->mp->dst_rank, p->mp->src_rank, n,
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
		    node_serve_reg(a->fab, p->held, p->held_cap, false, &p->held_mr) != 0) {
			LOG_WARN("node %s: v%" PRIu64 ": cannot serve parcel %u<-%u (%zu bytes); "
				 "fetching it without serving it",
				 a->node_id, f->version, p->mp->dst_rank, p->mp->src_rank, p->held_cap);
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
			copied += agent_chunk_copied(a, f, &f->parcels[i], c);
		}
	LOG_DEBUG("node %s: v%" PRIu64 ": %u of %u parcels served from the slot (%u of their %u "
		  "chunks copied after the page: over GATHER_RANGES ranges)",
		  a->node_id, f->version, from_slot, served, copied, chunks);
	f->served = served > 0;
	/* The node's budget on each page; its rate split over the parcels. */
	for (uint32_t i = 0; i < f->nparcels && served > 0; i++) {
		uint64_t mbps = proto_param(PROTO_PARAM_UPLOAD_MBPS);
		if (f->parcels[i].held != NULL)
			proto_have_set_budget(f->parcels[i].held,
					      proto_param(PROTO_PARAM_UPLOAD_PEERS),
					      mbps == 0 ? 0 : PROTO_MAX(mbps / served, 1));
	}
	offer(a, f); /* before we ask for sources: the swarm sees us sooner */
}

void agent_swarm_unserve(struct node_agent *a, struct agent_fetch *f)
{
	if (f == NULL)
		return;
	if (f->served && (f->so.offered || f->so.busy) && a->registered && a->trk != NULL &&
	    trk_client_offer(a->trk, a->node_id, f->version, NULL, 0, ignore_answer, NULL) != 0)
		LOG_DEBUG("node %s: could not withdraw v%" PRIu64, a->node_id, f->version);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		if (p->held == NULL)
			continue;
		if (a->fab != NULL) /* else fab_close closed it */
			fab_mr_close(p->held_mr);
		p->held_mr = NULL;
		node_serve_unmap(p->held, p->held_cap);
		p->held = NULL;
		p->from_slot = false;
	}
	/* Before the slot is freed or retired: readers of it fail and move on. */
	if (f->slot_mr != NULL && a->fab != NULL)
		fab_mr_close(f->slot_mr);
	f->slot_mr = NULL;
	f->served = false;
	f->so.offered = false;
}

void agent_swarm_keep(struct node_agent *a, struct agent_fetch *f)
{
	struct agent_fetch *old = a->kept;

	a->kept = NULL;
	agent_fetch_free(a, old);
	if (f != NULL && !f->served) {
		agent_fetch_free(a, f);
		f = NULL;
	}
	a->kept = f;
	offered_gauge(a);
}

static struct agent_fetch *served_fetch(struct node_agent *a, uint64_t v)
{
	if (a->fetch != NULL && a->fetch->version == v && a->fetch->served)
		return a->fetch;
	if (a->kept != NULL && a->kept->version == v)
		return a->kept;
	return NULL;
}

static void on_offer(const struct trk_answer *ans, void *arg)
{
	struct agent_ticket *t = arg;
	struct node_agent *a = t->a;
	struct agent_fetch *f = served_fetch(a, t->version);
	int ok;

	t->used = false;
	if (f == NULL)
		return;
	ok = node_serve_offer_done(&f->so, ans, a->reg_gen, "node: offering");
	if (ok == 1 && f->so.gen == a->reg_gen && !f->so.offered) {
		f->so.offered = true;
		offered_gauge(a);
		LOG_DEBUG("node %s: offered v%" PRIu64, a->node_id, f->version);
	}
}

static void offer(struct node_agent *a, struct agent_fetch *f)
{
	struct agent_ticket *t = NULL;
	struct trk_offer *list;
	size_t k = 0;

	if (f == NULL || !f->served || f->so.busy || f->so.offered || !a->registered)
		return;
	for (size_t i = 0; i < sizeof(a->tickets) / sizeof(a->tickets[0]); i++)
		if (!a->tickets[i].used)
			t = &a->tickets[i];
	if (t == NULL)
		return; /* next tick */
	list = calloc(f->nparcels + 1, sizeof(*list));
	if (list == NULL)
		return;
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct agent_parcel *p = &f->parcels[i];
		if (p->held != NULL)
			node_serve_offer_fill(&list[k++], f->ml->layout_digest, p->mp->src_rank,
					      p->mp->dst_rank, p->held_mr, p->head, p->mp->wire_bytes);
	}

	*t = (struct agent_ticket){a, f->version, true};
	if (node_serve_offer_send(a->trk, a->node_id, &f->so, a->reg_gen, 0, list, k,
				  agent_xl_offer_slot(a, f), on_offer, t) != 0)
		t->used = false;
	free(list);
}

void agent_swarm_registered(struct node_agent *a)
{
	a->reg_gen++;
	for (int i = 0; i < 2; i++) {
		struct agent_fetch *f = i == 0 ? a->fetch : a->kept;
		if (f != NULL)
			f->so.offered = false;
	}
	offered_gauge(a);
}

/* ---- bad peers ------------------------------------------------------------- */

bool agent_swarm_banned(const struct agent_fetch *f, const char *id)
{
	for (uint32_t i = 0; i < f->nbad; i++)
		if (f->bad_counts[i] >= BAN_BAD_CHUNKS && strcmp(f->bad_ids[i], id) == 0)
			return true;
	return false;
}

bool agent_swarm_bad_peer(struct node_agent *a, const char *id)
{
	struct agent_fetch *f = a->fetch;
	uint32_t i;

	for (i = 0; i < f->nbad && strcmp(f->bad_ids[i], id) != 0; i++)
		;
	if (i == f->nbad) {
		if (f->nbad == BANS_MAX)
			return false;
		if (f->bad_ids == NULL) {
			f->bad_ids = calloc(BANS_MAX, sizeof(*f->bad_ids));
			f->bad_counts = calloc(BANS_MAX, 1);
			if (f->bad_ids == NULL || f->bad_counts == NULL)
				return false;
		}
		snprintf(f->bad_ids[i], sizeof(f->bad_ids[i]), "%s", id);
		f->nbad++;
	}
	if (f->bad_counts[i] >= BAN_BAD_CHUNKS)
		return true;
	if (++f->bad_counts[i] < BAN_BAD_CHUNKS)
		return false;
	f->nbanned++;
	proto_metrics_add(a->am.m, a->am.banned, 1);
	LOG_WARN("node %s: v%" PRIu64 ": peer %s sent %d chunks that failed their hash: banned "
		 "for this version",
		 a->node_id, f->version, id, BAN_BAD_CHUNKS);
	return true;
}

/* ---- upload budgets ---------------------------------------------------------- */

/*
 * A node announces its upload budget on its have-pages: the readers it
 * serves at once and its upload rate (TESSERA_UPLOAD_PEERS, _MBPS; the
 * rate split over the parcels it serves). Reads are one-sided, so its
 * readers keep the budget; the node is never asked. The readers it serves
 * are the k members of the swarm with the highest hrw(member, its id):
 * every reader computes the same set from the same member list. A reader
 * left out counts none of the node's chunks as available (so rarest-first
 * skips them, and a chunk only it holds may come from the trainer) and
 * takes them elsewhere; the node is full, not bad, and is not counted
 * against. A reader let in takes at most its share of the rate: the rate
 * over the readers served (k, or the swarm's other members if fewer).
 * A reader no holder serves starves and reads the trainer after
 * STARVE_MS (agent_swarm_pick, passes 1 and 2): a budget never strands a
 * chunk.
 */

static uint64_t hrw(const char *id, uint32_t pi, uint32_t c);

static uint32_t id_hash32(const char *id)
{
	uint32_t h = 2166136261u;

	for (const char *q = id; *q; q++)
		h = (h ^ (uint8_t)*q) * 16777619u;
	return h;
}

/* Whether s's budget lets us in, and our share of its rate. */
static void budget_share(struct node_agent *a, const struct agent_parcel *p,
			 struct agent_source *s)
{
	uint32_t salt = id_hash32(s->info.id), above = 0, readers = 1; /* us */
	uint64_t me = hrw(a->node_id, 0, salt);
	bool was = s->up_refused;

	for (uint32_t k = 0; k < p->nmembers; k++) {
		if (strcmp(p->members[k], s->info.id) == 0 || strcmp(p->members[k], a->node_id) == 0)
			continue;
		readers++;
		above += hrw(p->members[k], 0, salt) > me;
	}
	s->up_refused = s->up_peers != 0 && above >= s->up_peers;
	if (s->up_peers != 0)
		readers = PROTO_MIN(readers, s->up_peers);
	s->up_bps = s->up_mbps == 0 ? 0 : (uint64_t)s->up_mbps * 1000000 / 8 / readers;
	if (s->up_refused && !was) {
		proto_metrics_add(a->am.m, a->am.budget_refusals, 1);
		LOG_DEBUG("node %s: peer %s serves %u readers at once, others first: reading "
			  "its chunks elsewhere", a->node_id, s->info.id, s->up_peers);
	}
}

/* s's budget has room for a read of len bytes now (its tokens are spent
 * when the read is posted, agent_source_posted). Its bucket holds a chunk
 * at least (chunk: our chunk size): asked for a parcel's short last chunk
 * first, it would drop what a whole chunk needs. */
static bool budget_room(struct agent_source *s, uint64_t len, uint64_t chunk)
{
	uint64_t now, burst, el;

	if (s->up_bps == 0)
		return true;
	now = proto_now_ns();
	burst = PROTO_MAX(PROTO_MAX(len, chunk), s->up_bps / 10);
	el = PROTO_MIN(now - s->up_ns, 1000000000ull);
	s->up_tokens = PROTO_MIN(burst, s->up_tokens + (uint64_t)((unsigned __int128)el * s->up_bps /
								1000000000u));
	s->up_ns = now;
	return s->up_tokens >= len;
}

/* ---- what peers hold -------------------------------------------------------- */

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;

	return a < b ? -1 : a > b;
}

#define AHEAD_CHUNKS(n) PROTO_MAX(4u, (n) / 16)

/* Whether we hold AHEAD_CHUNKS more of p than the median usable peer's
 * last page shows (see per-peer queues); false without such a page. */
static bool ahead_of_swarm(const struct agent_fetch *f, const struct agent_parcel *p, uint64_t now)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8, *held, k = 0, med;

	if (p->nsrcs == 0 || (held = calloc(p->nsrcs, sizeof(*held))) == NULL)
		return false;
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct agent_source *s = &p->srcs[j];
		uint32_t h = 0;
		if (!s->info.peer || s->have == NULL || s->self || s->bad_until_ms > now ||
		    agent_swarm_banned(f, s->info.id))
			continue;
		for (uint32_t b = 0; b < bl; b++)
			h += (uint32_t)__builtin_popcount(s->have[b]);
		held[k++] = h;
	}
	qsort(held, k, sizeof(*held), cmp_u32);
	med = k == 0 ? UINT32_MAX : held[k / 2];
	free(held);
	return med != UINT32_MAX && p->done > med + AHEAD_CHUNKS(n);
}

/* Counts, per chunk, the usable peers holding it and whether one is
 * fetching it, from their last have-pages. */
static void recount(struct agent_fetch *f, struct agent_parcel *p)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8;
	uint64_t now = agent_now_ms();

	memset(p->avail, 0, n * sizeof(*p->avail));
	memset(p->peer_busy, 0, n);
	memset(p->owner_on, 0, n);
	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct agent_source *s = &p->srcs[k];
		if (s->have == NULL || s->self || s->bad_until_ms > now ||
		    agent_swarm_banned(f, s->info.id))
			continue;
		for (uint32_t c = 0; c < n; c++) {
			if (!s->up_refused && proto_have_bit(s->have, c))
				p->avail[c]++;
			if (proto_have_bit(s->have + bl, c))
				p->peer_busy[c] = 1;
		}
	}
	for (uint32_t c = 0; c < n; c++)
		p->busy_ms[c] = !p->peer_busy[c] ? 0 : p->busy_ms[c] != 0 ? p->busy_ms[c] : now;
	p->ahead = ahead_of_swarm(f, p, now);
	/* Owners that serve the parcel (their page was read) are on their
	 * chunks; the others' chunks are anyone's once we are hungry. Which
	 * members serve is found once per recount (a name compared per
	 * source and member), not once per chunk: recount runs on every
	 * have-page answer, and at N = 16 (perf, transfer window) recount and
	 * strcmp were 3.3 % of a node's loop-thread samples. */
	uint8_t few[64], *on = p->nmembers <= sizeof(few) ? few : calloc(p->nmembers, 1);
	if (on == NULL)
		return; /* none counts as serving until the next recount */
	memset(on, 0, PROTO_MIN(p->nmembers, sizeof(few)));
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct agent_source *s = &p->srcs[j];
		if (!s->info.peer || s->have == NULL || s->bad_until_ms > now)
			continue;
		for (uint32_t k = 0; k < p->nmembers; k++)
			if (!on[k] && strcmp(s->info.id, p->members[k]) == 0)
				on[k] = 1;
	}
	for (uint32_t c = 0; c < n; c++)
		p->owner_on[c] = p->owner[c] < p->nmembers && on[p->owner[c]];
	if (on != few)
		free(on);
}

static void poll_haves(struct node_agent *a, struct agent_fetch *f, uint32_t pi, uint64_t now);
static void chase_arm(struct node_agent *a);

void agent_swarm_recount(struct node_agent *a, uint32_t pi)
{
	recount(a->fetch, &a->fetch->parcels[pi]);
	if (a->fanout)
		poll_haves(a, a->fetch, pi, agent_now_ms()); /* new peers: read them now */
}

static void on_have(struct fab_op *op, int status)
{
	struct agent_have_read *hr = proto_container_of(op, struct agent_have_read, op);
	struct node_agent *a = hr->a;
	struct agent_fetch *f = a->fetch;
	struct proto_have h;
	struct proto_err err;

	hr->busy = false;
	if (f == NULL || hr->gen != a->gen || f->parcels == NULL)
		return;
	struct agent_parcel *p = &f->parcels[hr->parcel];
	if (hr->src_epoch != p->src_epoch || hr->src_idx >= p->nsrcs)
		return; /* the source list changed: the next poll asks again */
	struct agent_source *s = &p->srcs[hr->src_idx];
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8;
	s->have_busy = false;
	if (status != 0) {
		LOG_DEBUG("node %s: have-page of %s: read failed: %d", a->node_id, s->info.id, status);
		agent_source_failed(a, s);
		return;
	}
	const uint8_t *buf = a->hpool + (size_t)hr->slot * HAVE_SLOT_MAX;
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
		LOG_WARN("node %s: v%" PRIu64 ": peer %s: %s; dropped", a->node_id, f->version,
			 s->info.id, err.msg);
		agent_source_failed(a, s);
		(void)agent_swarm_bad_peer(a, s->info.id);
		return;
	}
	if (s->have == NULL && (s->have = malloc(2 * (size_t)bl)) == NULL)
		return;
	memcpy(s->have, h.have, bl);
	s->have_page_ms = s->have_ms; /* this read's: none other was out */
	agent_source_answered(s, s->have_ms); /* alive: congested, if its chunks are late */
	memcpy(s->have + bl, h.busy, bl);
	if (f->su.have == 0)
		f->su.have = proto_wall_ms();
	s->slot_rk = (struct fab_rkey){h.slot_addr, h.slot_key, h.slot_len};
	s->slot_ranges = h.slot_ranges;
	if (h.upload_peers != s->up_peers || h.upload_mbps != s->up_mbps) {
		s->up_peers = h.upload_peers;
		s->up_mbps = h.upload_mbps;
		budget_share(a, p, s);
	}
	recount(f, p);
	agent_pump(a);
	chase_arm(a);
}

static struct agent_have_read *free_have_read(struct node_agent *a)
{
	for (uint32_t i = 0; i < HAVE_SLOTS; i++)
		if (!a->hreads[i].busy)
			return &a->hreads[i];
	return NULL;
}

/* Whether the parcel waits on its peers alone: none of our reads of it in
 * flight, and at most CHASE_LEFT_BYTES of chunks left that no peer holds
 * yet (4 chunks at least), a peer fetching or owning each (the end of a
 * parcel: all of a delta's). The pages of those peers are then read every
 * HAVE_CHASE_MS: the chunk is on its way to them. Bounded so that a big
 * parcel's idle readers do not read every owner's page at that rate for
 * seconds. In bytes, not chunks: 4 chunks were 2 MiB at 512 KiB, a
 * delta's parcel on loopback whole; at 128 KiB 4 chunks left a delta's
 * 20 to the 100 ms poll, and its fetch took 60-217 ms, not 66-88
 * (bench_delta_net). */
#define CHASE_LEFT_BYTES (2u << 20)

static bool waits_on_peers(const struct agent_parcel *p)
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
static bool fetches_ours(const struct agent_parcel *p, const struct agent_source *s)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8;

	for (uint32_t c = 0; c < n; c++) {
		if (p->state[c] != 0 || p->avail[c] != 0)
			continue;
		if ((s->have != NULL && proto_have_bit(s->have + bl, c)) ||
		    (p->owner[c] < p->nmembers && strcmp(p->members[p->owner[c]], s->info.id) == 0))
			return true;
	}
	return false;
}

static void on_chase(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;
	uint64_t now = agent_now_ms();

	(void)fd;
	(void)what;
	if (!a->fanout || f == NULL || f->parcels == NULL || f->verified)
		return;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		struct agent_parcel *p = &f->parcels[pi];
		/* An owner the tracker did not list yet (agent_sources_gap). */
		if (p->done < p->mp->nchunks && now - p->sources_ms >= agent_sources_gap(f, p, true, now))
			agent_want_sources(a, pi);
		poll_haves(a, f, pi, now);
	}
	node_fabloop_kick(a->fl);
	chase_arm(a);
}

void agent_swarm_chase(struct node_agent *a)
{
	chase_arm(a);
}

/* Arms the chase timer while a parcel waits on its peers. */
static void chase_arm(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	bool waits = false;

	if (!a->fanout || f == NULL || f->parcels == NULL || f->verified)
		return;
	for (uint32_t pi = 0; pi < f->nparcels && !waits; pi++)
		waits = f->parcels[pi].done < f->parcels[pi].mp->nchunks &&
			waits_on_peers(&f->parcels[pi]);
	if (!waits)
		return;
	if (a->chase_ev == NULL && (a->chase_ev = evtimer_new(a->base, on_chase, a)) == NULL)
		return; /* the tick polls them, as ever */
	if (!evtimer_pending(a->chase_ev, NULL))
		agent_arm(a->chase_ev, proto_param(PROTO_PARAM_HAVE_CHASE_MS));
}

/* Reads the have-pages of the parcel's peers that are due. */
static void poll_haves(struct node_agent *a, struct agent_fetch *f, uint32_t pi, uint64_t now)
{
	struct agent_parcel *p = &f->parcels[pi];
	uint32_t n = p->mp->nchunks;
	uint64_t slow = proto_param(PROTO_PARAM_HAVE_POLL_MS), period;
	bool chase;

	if (p->done == n || proto_have_bytes(n) > HAVE_SLOT_MAX)
		return;
	chase = waits_on_peers(p);
	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[k];
		struct agent_have_read *hr;
		period = chase && fetches_ours(p, s)
				 ? PROTO_MIN(slow, proto_param(PROTO_PARAM_HAVE_CHASE_MS))
				 : slow;
		if (!s->info.peer || s->self || s->have_busy || now - s->have_ms < period ||
		    s->bad_until_ms > now || agent_swarm_banned(f, s->info.id))
			continue;
		fi_addr_t hfa;
		if (!agent_source_ready(a, s, now) || agent_have_addr(a, s, &hfa) != 0 ||
		    (hr = free_have_read(a)) == NULL)
			continue;
		uint64_t head = proto_have_page(n);
		struct fab_rkey rk = {s->info.addr - head, s->info.key, head};
		*hr = (struct agent_have_read){.a = a, .gen = a->gen, .parcel = pi,
					       .src_idx = (uint32_t)k, .src_epoch = p->src_epoch,
					       .slot = (uint32_t)(hr - a->hreads), .busy = true};
		s->have_ms = now;
		if (s->info.addr < head ||
		    fab_read(a->hfab, &hr->op, a->hpool_mr, (size_t)hr->slot * HAVE_SLOT_MAX,
			     proto_have_bytes(n), hfa, &rk, 0, on_have) != 0) {
			hr->busy = false;
			agent_source_failed(a, s);
			continue;
		}
		s->have_busy = true;
		if (a->hfl != a->fl)
			node_fabloop_kick(a->hfl);
	}
}

void agent_swarm_tick(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	uint64_t now = agent_now_ms();

	offer(a, f);
	offer(a, a->kept);
	if (!a->fanout || f == NULL || f->parcels == NULL || f->verified)
		return;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		struct agent_parcel *p = &f->parcels[pi];
		bool peers = false;
		/* Members join the swarm as they offer: ask again for sources
		 * (often while we know no peer or no publisher yet, else every
		 * SWARM_REFRESH_MS: agent_sources_gap). */
		for (size_t k = 0; k < p->nsrcs; k++)
			peers |= p->srcs[k].info.peer && !p->srcs[k].self;
		if (p->done < p->mp->nchunks && now - p->sources_ms >= agent_sources_gap(f, p, peers, now))
			agent_want_sources(a, pi);
		if (p->done < p->mp->nchunks && peers)
			recount(f, p); /* peers that rest or were banned since */
		poll_haves(a, f, pi, now);
	}
	node_fabloop_kick(a->fl);
	chase_arm(a);
}

/* ---- chunk choice ---------------------------------------------------------- */

/*
 * Per-peer queues. A peer answers each reader's reads in order and shares
 * its uplink among all its readers, so what a reader queues on a peer
 * makes every later chunk from there wait, its own and, on the peer's
 * link, everyone's. Measured (8 nodes, 100 Mbit/s netns, up to
 * TESSERA_PEER_INFLIGHT reads of 512 KiB per peer): a relay hop's read
 * took 209/415/650 ms from post to verified (quartiles), and the last
 * node's reads sat queued behind other readers at six peers while its
 * downlink fell to 2-5 MB/s. So:
 *   - a reader keeps on a peer what the peer's measured rate to it
 *     delivers in TESSERA_PEER_TARGET_MS (peer_window: one chunk at
 *     least, TESSERA_PEER_INFLIGHT at most);
 *   - among the holders of a chunk it asks the one whose queue of its
 *     reads empties first at its measured rate (round-robin among equals;
 *     unmeasured peers count as empty);
 *   - a reader ahead of its swarm (it holds AHEAD_CHUNKS more of the
 *     parcel than the median peer's page shows) keeps one read per peer,
 *     and with TESSERA_AHEAD_PEERS reads from that many peers at once: it
 *     gives way on the peers' uplinks to the readers behind, whose chunks
 *     the tail waits for (p->ahead, from every recount). A peer's uplink
 *     is shared per connection with bytes queued, not per read: a reader
 *     gives its share back only by leaving the peer idle. (One run with
 *     2, on a machine at load 26, had a longer tail: off until measured
 *     on an idle one.)
 */
/* A swarm peer's window (see per-peer queues; cross-layout holders and
 * publishers keep agent_source_window's). */
static uint64_t peer_window(const struct node_agent *a, const struct agent_source *s)
{
	uint64_t lo = a->chunk_size;
	uint64_t hi = PROTO_MAX(lo, proto_param(PROTO_PARAM_PEER_INFLIGHT) * a->chunk_size);
	uint64_t rate = agent_pace(s)->rate;
	uint64_t w = rate * proto_param(PROTO_PARAM_PEER_TARGET_MS) / 1000;

	return PROTO_MIN(hi, PROTO_MAX(lo, w));
}

/*
 * A seed reader's share of the trainer. A publisher's window follows our
 * measured rate from it (agent_source_window), and the trainer's uplink
 * is shared by the bytes each reader keeps queued on it: a reader that
 * came first, alone on the link, measured all of it and kept up to
 * TESSERA_INFLIGHT reads there. Measured (16 nodes, 100 Mbit/s netns):
 * the first reader held 14 of the trainer's 40 reads in flight, took its
 * even share of the chunks by 6.4 s and the last owners theirs by
 * 11.5-13.4 s; from 10 s on the trainer's chunks went to 6-8 owners,
 * each at the trainer's share of a downlink full of peer traffic, and the
 * trainer's link fell to 4-8 MB/s. So in a swarm any reader of a parcel
 * (its owners and a stand-in alike) keeps on a publisher at most
 * TESSERA_INFLIGHT chunks over the parcel's owners (WINDOW_MIN_CHUNKS at
 * least; the owners as counted when they were last dealt out, and the
 * bytes in flight those of the publisher host, all parcels together): the
 * owners' queues there are even, they move through their shares at one
 * pace, and the chunks not asked for yet stay unstarted, for an idle
 * reader to take (agent_swarm_steal).
 */
static uint64_t pub_window(const struct node_agent *a, const struct agent_parcel *p,
			   const struct agent_source *s)
{
	uint64_t w = agent_source_window(a, s);
	uint64_t lo = (uint64_t)WINDOW_MIN_CHUNKS * a->chunk_size;

	if (!a->fanout || p->nowners < 2)
		return w;
	return PROTO_MIN(w, PROTO_MAX(lo, (uint64_t)a->max_inflight * a->chunk_size / p->nowners));
}

/*
 * The trainer's last wave. A chunk no peer holds comes from its owner's
 * trainer read, and that read shares the owner's downlink with the
 * owner's peer reads: one connection among some sixteen. Measured (16
 * nodes, 100 Mbit/s netns, debug timeline): from 11.1 s the trainer's
 * link carried 0.4-0.9 MB/s, the two reads of one owner whose downlink
 * was full of 8-16 peer reads, and they landed at 13.4 s while every
 * other node waited for those two chunks. So while one of our reads
 * from a publisher has been out ENDGAME_MS for a chunk no peer holds,
 * in the parcel's last wave (no more such chunks left than it has owners:
 * every other chunk has a copy in the swarm), we keep at most
 * WINDOW_MIN_CHUNKS chunks of peer reads in flight: the trainer's
 * connection gets our downlink, and the chunks the swarm waits for land.
 * Our peer reads go on once it is in. Elsewhere in a fetch the rule
 * never holds (a limit on peer hosts whenever a trainer-only read was
 * out, 2 of them, cut the node's own intake: 14.8-17.4 s, not 13).
 */
static bool last_wave(const struct agent_parcel *p)
{
	uint32_t left = 0;

	for (uint32_t c = 0; c < p->mp->nchunks; c++)
		if (p->state[c] < 2 && p->avail[c] == 0 && ++left > PROTO_MAX(p->nowners, 1))
			return false;
	return true;
}

static bool trainer_late(const struct node_agent *a, uint64_t *peer_bytes, uint64_t now)
{
	const struct agent_fetch *f = a->fetch;
	bool late = false;

	*peer_bytes = 0;
	for (uint32_t i = 0; i < a->nreads; i++) {
		const struct agent_read *rd = &a->reads[i];
		if (!rd->in_fabric || rd->abandoned || rd->gen != a->gen || rd->parcel >= f->nparcels)
			continue;
		if (rd->src_peer) {
			*peer_bytes += rd->len;
			continue;
		}
		const struct agent_parcel *p = &f->parcels[rd->parcel];
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
static bool has_room(struct node_agent *a, const struct agent_parcel *p, struct agent_source *s,
		     uint64_t len)
{
	const struct agent_source *h = agent_pace(s); /* its host's (agent_hosts.c) */

	if (s->info.peer &&
	    h->inflight_reads >= (p->ahead ? 1 : proto_param(PROTO_PARAM_PEER_INFLIGHT)))
		return false;
	uint64_t ahead_peers = proto_param(PROTO_PARAM_AHEAD_PEERS);
	if (s->info.peer && p->ahead && ahead_peers != 0 && h->inflight_reads == 0) {
		uint32_t busy = 0; /* peers (their hosts) with reads of ours out */
		for (size_t k = 0; k < p->nsrcs; k++)
			busy += p->srcs[k].info.peer && agent_pace(&p->srcs[k])->inflight_reads > 0 &&
				(p->srcs[k].hp == NULL || p->srcs[k].hp != s->hp);
		if (busy >= ahead_peers)
			return false;
	}
	if (s->info.peer && !budget_room(s, len, a->chunk_size))
		return false;
	if (s->info.peer && a->fetch->trainer_late &&
	    a->fetch->peer_bytes + len > (uint64_t)WINDOW_MIN_CHUNKS * a->chunk_size)
		return false;
	return h->inflight_reads == 0 ||
	       h->inflight_bytes + len <= (s->info.peer ? peer_window(a, s) : pub_window(a, p, s));
}

bool agent_source_usable(struct node_agent *a, const struct agent_fetch *f,
			 const struct agent_source *s, uint64_t now)
{
	if (s->self || s->bad_until_ms > now || agent_source_silent(s, now))
		return false;
	if (s->info.peer)
		return a->fanout && s->have != NULL && !agent_swarm_banned(f, s->info.id);
	return true;
}

/* A usable source with room holding chunk c (publishers hold them all),
 * other than not; round-robin from the parcel's position. */
static struct agent_source *holder(struct node_agent *a, struct agent_parcel *p, uint32_t c,
				   bool peers, const struct agent_source *not, uint64_t now)
{
	struct agent_fetch *f = a->fetch;
	uint64_t len = p->mp->chunks[c].size;

	struct agent_source *best = NULL;
	uint64_t best_ms = UINT64_MAX;
	size_t best_k = 0;

	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[(p->rr + k) % p->nsrcs];
		uint64_t ms;
		if (s == not || s->info.peer != peers || !agent_source_usable(a, f, s, now) ||
		    !has_room(a, p, s, len))
			continue;
		if (peers && (s->up_refused || !proto_have_bit(s->have, c)))
			continue;
		/* A peer whose queue of ours empties first (see per-peer queues). */
		ms = peers ? agent_source_queue_ms(s, agent_pace(s)->inflight_bytes) : 0;
		if (ms >= best_ms || !agent_source_ready(a, s, now))
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

/*
 * Rarest first asks for a holder chunk by chunk, and holder() weighs every
 * source each time: a pick cost chunks x sources, and with 128 KiB chunks
 * (1024 a 128 MiB parcel) it was most of a node loop's CPU (perf, 4
 * replicas of 256 MiB on loopback: agent_swarm_pick with holder() and the
 * tunables they read 6.6 % of the machine's samples, against 0.3 % at 512
 * KiB; 1.0 % with the list below, and an anchor there 2.7-3.0 s, not
 * 3.5-3.7). What holder() weighs besides the chunk's have-bit does not change
 * within a pick (nothing is posted until it returns), so the peers it
 * would take for a chunk of the parcel's size are listed once, with their
 * queue times, and each chunk checks only their bits. The choice is
 * holder()'s: the least queued peer, ties to the first from p->rr on,
 * p->rr moved past it. Only holder() itself changes what it weighs: an
 * address it fails to insert sets the source aside, and a budget it looks
 * at is refilled. So a chunk of another size (the parcel's last) asks
 * holder(), and the list is made again after it.
 */
struct pick_peer {
	struct agent_source *s; /* NULL: its address could not be inserted */
	uint64_t ms;            /* its queue of ours, at its rate */
	uint32_t k;             /* its index in p->srcs */
};

struct pick_peers {
	struct pick_peer *v; /* NULL: not listed yet (or no memory: holder() decides) */
	size_t n;
};

/* Lists the peers holder() would weigh for a chunk of len bytes. */
static void pick_peers_list(struct node_agent *a, struct agent_parcel *p, uint64_t len,
			    uint64_t now, struct pick_peers *pp)
{
	pp->n = 0;
	if ((pp->v = malloc(PROTO_MAX(p->nsrcs, 1) * sizeof(*pp->v))) == NULL)
		return;
	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[k];
		if (!s->info.peer || !agent_source_usable(a, a->fetch, s, now) ||
		    !has_room(a, p, s, len) || s->up_refused)
			continue;
		pp->v[pp->n++] = (struct pick_peer){
			.s = s, .ms = agent_source_queue_ms(s, agent_pace(s)->inflight_bytes), .k = (uint32_t)k};
	}
}

/* holder(a, p, c, true, NULL, now), from the list when it fits c. */
static struct agent_source *pick_holder(struct node_agent *a, struct agent_parcel *p, uint32_t c,
					uint64_t now, struct pick_peers *pp)
{
	uint64_t len = p->mp->chunks[c].size, best_ms = UINT64_MAX;
	struct pick_peer *best = NULL;
	size_t first = 0;

	if (len != p->mp->chunks[0].size) {
		free(pp->v);
		pp->v = NULL;
		return holder(a, p, c, true, NULL, now);
	}
	if (pp->v == NULL)
		pick_peers_list(a, p, len, now, pp);
	if (pp->v == NULL)
		return holder(a, p, c, true, NULL, now);
	while (first < pp->n && pp->v[first].k < p->rr % p->nsrcs)
		first++;
	for (size_t i = 0; i < pp->n; i++) {
		struct pick_peer *x = &pp->v[(first + i) % pp->n];
		if (x->s == NULL || !proto_have_bit(x->s->have, c) || x->ms >= best_ms)
			continue;
		if (!agent_source_ready(a, x->s, now)) {
			x->s = NULL;
			continue;
		}
		best = x;
		best_ms = x->ms;
		if (best_ms == 0)
			break;
	}
	if (best == NULL)
		return NULL;
	p->rr = (uint32_t)((best->k + 1) % p->nsrcs);
	return best->s;
}

/* The source of chunk c's one read in flight, if known. */
static const struct agent_source *reading_from(struct node_agent *a, uint32_t pi, uint32_t c,
					       uint64_t *started)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];

	for (uint32_t i = 0; i < a->nreads; i++) {
		const struct agent_read *rd = &a->reads[i];
		if (rd->in_fabric && !rd->abandoned && rd->gen == a->gen && rd->parcel == pi &&
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
static bool pub_wanted(const struct agent_parcel *p, uint32_t c, bool late, uint64_t busy_before,
		       bool idle_too)
{
	if (p->state[c] != 0 || p->avail[c] != 0)
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
static uint32_t pub_next(const struct agent_parcel *p, int pass, uint64_t busy_before, bool idle_too)
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
static uint64_t busy_patience(struct node_agent *a, const struct agent_parcel *p)
{
	uint64_t ms = 3 * proto_param(PROTO_PARAM_STALL_MS);

	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct agent_source *s = &p->srcs[k];
		if (!s->info.peer && agent_pace(s)->rate != 0)
			ms = PROTO_MAX(proto_param(PROTO_PARAM_STALL_MS),
				       4 * agent_source_queue_ms(s, agent_source_window(a, s)));
	}
	return ms;
}

static uint64_t hrw(const char *id, uint32_t pi, uint32_t c)
{
	uint64_t h = 1469598103934665603ull ^ ((uint64_t)pi << 32 | c);

	for (const char *q = id; *q; q++)
		h = (h ^ (uint8_t)*q) * 1099511628211ull;
	h ^= h >> 29; /* FNV's low bits mix poorly: finish like splitmix */
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

/*
 * Stealing from the slowest owner. Owners take their even share of the
 * trainer's chunks, but not at one pace: the trainer's link is shared
 * per connection, and a reader whose rate was measured high early keeps a
 * deep window that it drains at its share. Measured (8 nodes, 100 Mbit/s
 * netns): readers finished their shares between 6.5 and 11.0 s, the last
 * two alone on the trainer's link for its last 0.7 s (half of it idle,
 * their windows sized for an eighth of it) and then alone relaying the
 * last chunks to seven peers each. So a seed reader whose own chunks have
 * all left the trainer takes one of an owner with chunks not started (at
 * least STEAL_LEFT), the most such first, from the back half of its walk
 * (which starts at start_point(owner), as ours does), and only:
 *   - a chunk it stands in for (p->standin): it has the highest hrw among
 *     the seed readers but the owner, so that two idle readers never take
 *     the same one (unbounded, up to five did: the trainer sent 1.11 S);
 *   - from an owner whose have-page we asked for within STEAL_FRESH_MS:
 *     one read behind a peer's queued chunks is seconds old, and a chunk
 *     its owner took long ago looked not started.
 * The owner sees our busy bit on its next page of ours, before its walk
 * gets there; if it got there first, the trainer sends a chunk twice
 * (counted in its upload). Returns UINT32_MAX when there is none.
 */
/* An owner with two chunks not started gives up the second: with its
 * window on the trainer at its share (pub_window), an owner at the end of
 * a slow walk has two or three chunks left, not four, and at four the
 * idle readers stole nothing from 10 s on (16 nodes, 100 Mbit/s netns). */
#define STEAL_LEFT 2
#define STEAL_FRESH_MS(poll) (3 * (poll))

/* Whether the page of member k, as we hold it, was asked for since after. */
static bool page_since(const struct agent_parcel *p, uint32_t k, uint64_t after)
{
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct agent_source *s = &p->srcs[j];
		if (s->info.peer && s->have != NULL && strcmp(s->info.id, p->members[k]) == 0)
			return s->have_page_ms >= after;
	}
	return false;
}

uint32_t agent_swarm_steal(const struct node_agent *a, uint32_t pi)
{
	const struct agent_parcel *p = &a->fetch->parcels[pi];
	uint32_t n = p->mp->nchunks, best = UINT32_MAX, *left;
	uint64_t now = agent_now_ms(), fresh = STEAL_FRESH_MS(proto_param(PROTO_PARAM_HAVE_POLL_MS));

	if (!a->fanout || !p->seed || p->nmembers == 0 || p->standin == NULL ||
	    (left = calloc(p->nmembers, sizeof(*left))) == NULL)
		return UINT32_MAX;
	for (uint32_t c = 0; c < n; c++)
		if (!p->mine[c] && p->owner[c] < p->nmembers && p->owner_on[c] &&
		    pub_wanted(p, c, false, 0, false))
			left[p->owner[c]]++;
	/* The owners with the most left first (the first of them in members
	 * on a tie): the first walk that finds a chunk ends it, not one walk
	 * of the chunks per owner. Each pass sets one owner's count to 0,
	 * below STEAL_LEFT: the loop ends. */
	while (best == UINT32_MAX) {
		uint32_t k = UINT32_MAX, skip, rot;
		for (uint32_t j = 0; j < p->nmembers; j++)
			if (left[j] >= STEAL_LEFT && (k == UINT32_MAX || left[j] > left[k]))
				k = j;
		if (k == UINT32_MAX)
			break;
		skip = (left[k] + 1) / 2; /* its next ones are left to it */
		left[k] = 0;              /* walked */
		if (!page_since(p, k, now > fresh ? now - fresh : 0))
			continue;
		rot = start_point(p->members[k], pi, n);
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
	free(left);
	return best;
}

static bool is_member(const struct agent_parcel *p, const char *id)
{
	for (uint32_t k = 0; k < p->nmembers; k++)
		if (strcmp(p->members[k], id) == 0)
			return true;
	return false;
}

/* The members the answer lists, and the peers kept while unlisted
 * (agent_fetch.c, keep_unlisted): their chunks stay theirs. */
static void take_members(struct agent_parcel *p, json_t *answer)
{
	json_t *list = json_object_get(answer, "members"), *v;
	size_t i, n = json_array_size(list);

	free(p->members);
	p->members = NULL;
	p->nmembers = 0;
	if (n == 0 || (p->members = calloc(PROTO_MIN(n + p->nsrcs, MEMBERS_MAX),
					   sizeof(*p->members))) == NULL)
		return;
	json_array_foreach(list, i, v) {
		const char *id = json_string_value(v);
		if (p->nmembers == MEMBERS_MAX)
			break;
		if (id != NULL && id[0] != 0 && strlen(id) < TRK_ID_MAX)
			snprintf(p->members[p->nmembers++], TRK_ID_MAX, "%s", id);
	}
	for (size_t k = 0; k < p->nsrcs && p->nmembers < MEMBERS_MAX; k++)
		if (p->srcs[k].unlisted_ms != 0 && !is_member(p, p->srcs[k].info.id))
			snprintf(p->members[p->nmembers++], TRK_ID_MAX, "%s", p->srcs[k].info.id);
}

static int cmp_desc(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? 1 : a > b ? -1 : 0;
}

static void seed_gauge(struct node_agent *a)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < a->fetch->nparcels; i++)
		n += a->fetch->parcels[i].seed;
	proto_metrics_set(a->am.m, a->am.seed_parcels, n);
}

/*
 * Super-seeding under a cap (TESSERA_PUB_UPLOAD_READERS = k): the members
 * that read the parcel from the trainer (its seed readers) are the k with
 * the highest hrw(member, parcel, SEED_SALT) among the members not banned
 * and us; every member computes the same set from the same list, and the
 * trainer's chunks are owned among them only (the others take them from
 * peers). Sets seed[k] per member (nmembers bytes, at least one) and
 * p->seed for us; without a cap, or with k members or fewer, everyone.
 * A reader that dies or leaves stops being an owner that serves
 * (owner_on): its chunks go to whoever starves first (passes 1 and 2 of
 * agent_swarm_pick), and once the tracker stops listing it, to the next
 * member in line. The cap is kept by the readers, not the trainer: reads
 * are one-sided.
 */
#define SEED_SALT UINT32_MAX

static void pick_seeds(struct node_agent *a, uint32_t pi, uint8_t *seed)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	uint64_t cap = proto_param(PROTO_PARAM_PUB_UPLOAD_READERS), *sc, cut, me;
	uint32_t n = 0;

	memset(seed, 1, PROTO_MAX(p->nmembers, 1));
	p->seed = true;
	if (cap == 0 || p->nmembers < cap || (sc = malloc((p->nmembers + 1) * sizeof(*sc))) == NULL)
		return;
	me = hrw(a->node_id, pi, SEED_SALT);
	sc[n++] = me;
	for (uint32_t k = 0; k < p->nmembers; k++)
		if (strcmp(p->members[k], a->node_id) != 0 && !agent_swarm_banned(f, p->members[k]))
			sc[n++] = hrw(p->members[k], pi, SEED_SALT);
	if (n > cap) {
		qsort(sc, n, sizeof(*sc), cmp_desc);
		cut = sc[cap - 1];
		for (uint32_t k = 0; k < p->nmembers; k++)
			seed[k] = hrw(p->members[k], pi, SEED_SALT) >= cut;
		p->seed = me >= cut;
	}
	free(sc);
}

void agent_swarm_owners(struct node_agent *a, uint32_t pi, json_t *answer)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	uint8_t *seed;

	take_members(p, answer);
	for (size_t k = 0; k < p->nsrcs; k++)
		if (p->srcs[k].info.peer && !p->srcs[k].self)
			budget_share(a, p, &p->srcs[k]); /* the members changed */
	if (!a->fanout) { /* star: every chunk is ours to ask the trainer for */
		memset(p->mine, 1, p->mp->nchunks);
		return;
	}
	if ((seed = malloc(PROTO_MAX(p->nmembers, 1))) == NULL)
		return; /* the owners stay as they were */
	pick_seeds(a, pi, seed);
	/* Owners' loads, to keep the trainer's chunks even (see above);
	 * without room for them, unbounded rendezvous as before. */
	uint32_t nown = p->seed, cap = UINT32_MAX, *load = calloc(p->nmembers + 1, sizeof(*load));
	for (uint32_t k = 0; k < p->nmembers; k++)
		nown += strcmp(p->members[k], a->node_id) != 0 && seed[k] &&
			!agent_swarm_banned(f, p->members[k]);
	if (load != NULL && nown > 0)
		cap = (p->mp->nchunks + nown - 1) / nown;
	p->nowners = nown;
	for (uint32_t c = 0; c < p->mp->nchunks; c++) {
		uint64_t me = hrw(a->node_id, pi, c), best = 0;
		bool mine = p->seed && (load == NULL || load[p->nmembers] < cap);
		if (mine)
			best = me;
		p->owner[c] = UINT32_MAX;
		/* The swarm as the tracker knows it (members that did not offer
		 * yet included: they are about to); else the peers listed. */
		for (uint32_t k = 0; k < p->nmembers; k++) {
			uint64_t h;
			if (strcmp(p->members[k], a->node_id) == 0 || !seed[k] ||
			    agent_swarm_banned(f, p->members[k]) ||
			    (load != NULL && load[k] >= cap) ||
			    (h = hrw(p->members[k], pi, c)) < best)
				continue;
			best = h;
			mine = false;
			p->owner[c] = k;
		}
		if (load != NULL)
			load[mine ? p->nmembers : p->owner[c] < p->nmembers ? p->owner[c] : p->nmembers]++;
		for (size_t k = 0; k < p->nsrcs && mine && p->nmembers == 0; k++) {
			const struct agent_source *o = &p->srcs[k];
			if (o->info.peer && !o->self && !agent_swarm_banned(f, o->info.id))
				mine = hrw(o->info.id, pi, c) < me;
		}
		p->mine[c] = mine;
		/* Its stand-in: the highest of the other seed readers. */
		uint64_t top = 0;
		bool me_top = !mine && p->seed && p->owner[c] < p->nmembers && p->standin != NULL;
		for (uint32_t k = 0; k < p->nmembers && me_top; k++)
			if (k != p->owner[c] && seed[k] && strcmp(p->members[k], a->node_id) != 0 &&
			    !agent_swarm_banned(f, p->members[k]))
				top = PROTO_MAX(top, hrw(p->members[k], pi, c));
		if (p->standin != NULL)
			p->standin[c] = me_top && me > top;
	}
	free(load);
	free(seed);
	seed_gauge(a);
}

struct agent_source *agent_swarm_pick(struct node_agent *a, uint32_t pi, uint32_t *chunk,
				      bool *want_sources)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	uint32_t n = p->mp->nchunks, best = UINT32_MAX, live = 0;
	uint64_t now = agent_now_ms();
	struct agent_source *s, *best_s = NULL;
	bool todo = false, any = false;

	for (size_t k = 0; k < p->nsrcs; k++)
		any |= agent_source_usable(a, f, &p->srcs[k], now);
	*want_sources = !any;
	/* A pump picks once per read it posts: judged at each pick while
	 * late (each peer read posted counts), else once per ms (no read
	 * becomes late within the ms it was judged not to be). */
	if (!a->fanout) {
		f->trainer_late = false;
	} else if (f->trainer_late || f->late_judged_ms != now) {
		f->trainer_late = trainer_late(a, &f->peer_bytes, now);
		f->late_judged_ms = now;
	}
	/* 1. Rarest first among chunks peers hold. */
	struct pick_peers pp = {0};
	for (uint32_t k = 0; k < n; k++) {
		uint32_t c = (p->rot + k) % n;
		if (p->state[c] == 1)
			live++;
		if (p->state[c] != 0)
			continue;
		todo = true;
		if (p->avail[c] == 0 || p->avail[c] >= best)
			continue;
		if ((s = pick_holder(a, p, c, now, &pp)) != NULL) {
			best = p->avail[c];
			best_s = s;
			*chunk = c;
			if (best == 1)
				break; /* none rarer: what else the walk counts is not needed then */
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
	 * all while the version is fresh (agent_note_fresh): no peer can hold
	 * a chunk we own yet, and passes 1 and 2 wait STARVE_MS anyway. */
	for (size_t k = 0; k < p->nsrcs && now >= f->fresh_until_ms; k++) {
		const struct agent_source *o = &p->srcs[k];
		if (a->fanout && o->info.peer && !o->self && o->have == NULL &&
		    o->bad_until_ms <= now && !agent_swarm_banned(f, o->info.id) &&
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
		uint64_t patience = pass == 2 ? busy_patience(a, p) : 0;
		bool stolen = false;
		c = pub_next(p, pass, now > patience ? now - patience : 1, now - p->progress_ms >= patience);
		if (c == UINT32_MAX && pass == 0 && (c = agent_swarm_steal(a, pi)) != UINT32_MAX)
			stolen = true;
		if (c == UINT32_MAX)
			continue;
		if ((s = holder(a, p, c, false, NULL, now)) == NULL)
			return NULL; /* no publisher with room */
		if (stolen)
			LOG_DEBUG("node %s: parcel %u: our chunks have left the trainer: chunk %u of "
				  "%s's from %s", a->node_id, pi, c, p->members[p->owner[c]], s->info.id);
		if (pass == 2)
			LOG_DEBUG("node %s: parcel %u: starved for %" PRIu64 " ms: chunk %u from %s",
				  a->node_id, pi, now - p->progress_ms, c, s->info.id);
		*chunk = c;
		return s;
	}
	/* 4. Endgame. */
	if (todo)
		return NULL;
	for (uint32_t c = 0; c < n; c++) {
		uint64_t started = now;
		const struct agent_source *cur;
		if (p->state[c] != 1 || p->nlive[c] != 1)
			continue;
		cur = reading_from(a, pi, c, &started);
		/* Late only against what its source's measured rate predicts
		 * for the bytes queued on it: a read that is merely queued
		 * behind others is not asked for twice. */
		if (now - started < PROTO_MAX(ENDGAME_MS, 2 * agent_source_queue_ms(
								  cur, cur != NULL ? agent_pace(cur)->inflight_bytes : 0)))
			continue;
		if ((s = holder(a, p, c, true, cur, now)) != NULL ||
		    (s = holder(a, p, c, false, cur, now)) != NULL) {
			LOG_DEBUG("node %s: parcel %u: endgame: chunk %u out %" PRIu64 " ms, also from %s",
				  a->node_id, pi, c, now - started, s->info.id);
			*chunk = c;
			return s;
		}
	}
	return NULL;
}
