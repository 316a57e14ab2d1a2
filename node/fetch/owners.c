/* Who reads which of the trainer's chunks (owners, seed readers, stand-ins),
 * what the swarm's peers hold (their have-pages counted per chunk), and
 * their upload budgets: the picker's inputs, kept per parcel. */
#include "node/fetch/picker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hrw(const char *id, uint32_t pi, uint32_t c);

uint32_t fetch_start_point(const char *id, uint32_t pi, uint32_t n)
{
	uint64_t h = fetch_fnv(FETCH_FNV_BASIS ^ pi, id);

	return n == 0 ? 0 : (uint32_t)(h % n);
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
 * STARVE_MS (fetch_pick, passes 1 and 2): a budget never strands a
 * chunk.
 */

static uint32_t id_hash32(const char *id)
{
	uint32_t h = 2166136261u;

	for (const char *q = id; *q; q++)
		h = (h ^ (uint8_t)*q) * 16777619u;
	return h;
}

/* Whether s's budget lets us in, and our share of its rate. */
void fetch_budget_share(const struct fetcher *x, const struct fetch_parcel *p,
			 struct fetch_source *s)
{
	uint32_t salt = id_hash32(s->info.id), above = 0, readers = 1; /* us */
	uint64_t me;
	bool was = s->up_refused;

	if (s->up_peers == 0 && s->up_mbps == 0) { /* no budget: nothing to weigh */
		s->up_refused = false;
		s->up_bps = 0;
		return;
	}
	me = hrw(x->o.id, 0, salt);

	for (uint32_t k = 0; k < p->nmembers; k++) {
		if (strcmp(p->members[k], s->info.id) == 0 || strcmp(p->members[k], x->o.id) == 0)
			continue;
		readers++;
		above += hrw(p->members[k], 0, salt) > me;
	}
	s->up_refused = s->up_peers != 0 && above >= s->up_peers;
	if (s->up_peers != 0)
		readers = PROTO_MIN(readers, s->up_peers);
	s->up_bps = s->up_mbps == 0 ? 0 : (uint64_t)s->up_mbps * 1000000 / 8 / readers;
	if (s->up_refused && !was) {
		proto_metrics_add(x->o.am->m, x->o.am->budget_refusals, 1);
		LOG_DEBUG("node %s: peer %s serves %u readers at once, others first: reading "
			  "its chunks elsewhere", x->o.id, s->info.id, s->up_peers);
	}
}

/* s's budget has room for a read of len bytes now (its tokens are spent
 * when the read is posted, fetch_source_posted). Its bucket holds a chunk
 * at least (chunk: our chunk size): asked for a parcel's short last chunk
 * first, it would drop what a whole chunk needs. */
bool fetch_budget_room(struct fetch_source *s, uint64_t len, uint64_t chunk)
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

int fetch_source_page(const struct fetcher *x, const struct fetch_parcel *p,
		      struct fetch_source *s, const struct proto_have *h)
{
	uint32_t bl = (p->mp->nchunks + 7) / 8;

	if (s->have == NULL && (s->have = malloc(2 * (size_t)bl)) == NULL)
		return -ENOMEM;
	memcpy(s->have, h->have, bl);
	memcpy(s->have + bl, h->busy, bl);
	s->have_page_ms = s->have_ms; /* this read's: none other was out */
	fetch_source_answered(s, s->have_ms); /* alive: congested, if its chunks are late */
	s->slot_rk = (struct fab_rkey){h->slot_addr, h->slot_key, h->slot_len};
	s->slot_ranges = h->slot_ranges;
	if (h->upload_peers != s->up_peers || h->upload_mbps != s->up_mbps) {
		s->up_peers = h->upload_peers;
		s->up_mbps = h->upload_mbps;
		fetch_budget_share(x, p, s);
	}
	return 0;
}

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;

	return a < b ? -1 : a > b;
}

#define AHEAD_CHUNKS(n) PROTO_MAX(4u, (n) / 16)

/* Whether we hold AHEAD_CHUNKS more of p than the median usable peer's
 * last page shows (see per-peer queues); false without such a page. */
static bool ahead_of_swarm(const struct fetch *f, const struct fetch_parcel *p, uint64_t now)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8, *held, k = 0, med;

	if (p->nsrcs == 0 || (held = calloc(p->nsrcs, sizeof(*held))) == NULL)
		return false;
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct fetch_source *s = &p->srcs[j];
		uint32_t h = 0;
		if (!s->info.peer || s->have == NULL || s->self || s->bad_until_ms > now ||
		    fetch_banned(f, s->info.id))
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

/* A byte of a have-page added to eight chunks' counts (avail[0..7]) and
 * busy flags at once: each nibble's bits spread into four lanes by one
 * multiplication (copies 15 or 7 bits apart do not overlap: no carries).
 * The lanes are little-endian words; elsewhere, bit by bit. */
static void add_byte(uint16_t *avail, uint8_t *busy, uint8_t held, uint8_t fetching)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	const uint64_t by16 = 1 | 1ull << 15 | 1ull << 30 | 1ull << 45, lane16 = 0x0001000100010001ull;
	const uint32_t by8 = 1 | 1u << 7 | 1u << 14 | 1u << 21, lane8 = 0x01010101u;
	uint64_t a[2];
	uint32_t b[2];

	memcpy(a, avail, sizeof(a));
	a[0] += ((uint64_t)(held & 15) * by16) & lane16;
	a[1] += ((uint64_t)(held >> 4) * by16) & lane16;
	memcpy(avail, a, sizeof(a));
	memcpy(b, busy, sizeof(b));
	b[0] |= ((uint32_t)(fetching & 15) * by8) & lane8;
	b[1] |= ((uint32_t)(fetching >> 4) * by8) & lane8;
	memcpy(busy, b, sizeof(b));
#else
	for (uint32_t j = 0; j < 8; j++) {
		avail[j] += (held >> j) & 1;
		busy[j] |= (fetching >> j) & 1;
	}
#endif
}

/* Counts, per chunk, the usable peers holding it and whether one is
 * fetching it, from their last have-pages. */
void fetch_recount(const struct fetch *f, struct fetch_parcel *p)
{
	uint32_t n = p->mp->nchunks, bl = (n + 7) / 8;
	uint64_t now = node_now_ms();

	memset(p->avail, 0, n * sizeof(*p->avail));
	memset(p->peer_busy, 0, n);
	memset(p->owner_on, 0, n);
	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct fetch_source *s = &p->srcs[k];
		if (s->have == NULL || s->self || s->bad_until_ms > now ||
		    fetch_banned(f, s->info.id))
			continue;
		/* A byte of each bitmap at a time, zero bytes skipped: recount
		 * runs per page read, and per chunk and source it was a fifth
		 * of a simulated node's time (N = 256, sampled swarm). */
		for (uint32_t b = 0; b < bl; b++) {
			uint8_t held = s->up_refused ? 0 : s->have[b], busy = s->have[bl + b];
			if ((held | busy) == 0)
				continue;
			if (8 * b + 8 <= n) {
				add_byte(&p->avail[8 * b], &p->peer_busy[8 * b], held, busy);
				continue;
			}
			for (uint32_t j = 0, c = 8 * b; j < 8 && c < n; j++, c++) {
				p->avail[c] += (held >> j) & 1;
				p->peer_busy[c] |= (busy >> j) & 1;
			}
		}
	}
	for (uint32_t c = 0; c < n; c++)
		p->busy_ms[c] = !p->peer_busy[c] ? 0 : p->busy_ms[c] != 0 ? p->busy_ms[c] : now;
	p->ahead = ahead_of_swarm(f, p, now);
	/* Owners that serve the parcel (their page was read) are on their
	 * chunks; the others' chunks are anyone's once we are hungry. Which
	 * members serve is found once per recount, by each source's member
	 * index (fetch_source_member), not once per chunk: recount runs on
	 * every have-page answer. (A name compared per source and member cost
	 * O(N^2) per recount: at N = 60, simulated, strcmp was 11 % of the
	 * nodes' time.) */
	uint8_t few[MEMBERS_FEW], *on = fetch_members_listed(p, true, now, few);
	if (on == NULL)
		return; /* none counts as serving until the next recount */
	/* A sampled swarm's members are mostly not our sources, and the ones
	 * that are come and go (sample_room): the tracker listing one says
	 * it lives, and its chunks stay its own unless it rests after a
	 * failed read. (Counting a member new to our list, its page not read
	 * yet, as not serving sent hungry nodes to the trainer for its
	 * chunks: 1.23 x S from the trainer, simulated N = 1 000.) */
	if (p->sampled) {
		memset(on, 1, p->nmembers);
		for (size_t j = 0; j < p->nsrcs; j++) {
			uint32_t k = fetch_source_member(p, &p->srcs[j]);
			if (k != UINT32_MAX && p->srcs[j].bad_until_ms > now)
				on[k] = 0;
		}
	}
	for (uint32_t c = 0; c < n; c++)
		p->owner_on[c] = p->owner[c] < p->nmembers && on[p->owner[c]];
	if (on != few)
		free(on);
}

/* Rendezvous weight of member id for chunk c of parcel pi. */
static uint64_t hrw(const char *id, uint32_t pi, uint32_t c)
{
	uint64_t h = fetch_fnv(FETCH_FNV_BASIS ^ ((uint64_t)pi << 32 | c), id);

	h ^= h >> 29; /* FNV's low bits mix poorly: finish like splitmix */
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 32);
}

uint32_t fetch_source_member(const struct fetch_parcel *p, const struct fetch_source *s)
{
	if (p->members_epoch != 0 && s->member_epoch == p->members_epoch)
		return s->member;
	for (uint32_t k = 0; s->info.peer && k < p->nmembers; k++)
		if (strcmp(s->info.id, p->members[k]) == 0)
			return k;
	return UINT32_MAX;
}

uint8_t *fetch_members_listed(const struct fetch_parcel *p, bool serving, uint64_t now,
			      uint8_t few[MEMBERS_FEW])
{
	uint8_t *on = p->nmembers <= MEMBERS_FEW ? few : calloc(p->nmembers, 1);

	if (on == NULL)
		return NULL;
	memset(on, 0, PROTO_MIN(p->nmembers, MEMBERS_FEW));
	for (size_t j = 0; j < p->nsrcs; j++) {
		const struct fetch_source *s = &p->srcs[j];
		uint32_t k;
		if ((!serving || (s->have != NULL && s->bad_until_ms <= now)) &&
		    (k = fetch_source_member(p, s)) != UINT32_MAX)
			on[k] = 1;
	}
	return on;
}

static int cmp_member(const void *x, const void *y, void *arg)
{
	const char(*m)[TRK_ID_MAX] = arg;
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	int c = strcmp(m[a], m[b]);

	return c != 0 ? c : (a > b) - (a < b); /* equal names: the first member first */
}

/* Matches p's sources to its members by name: members sorted once, each
 * source found by binary search (the first of equal names), O((members +
 * sources) log members). Without memory, none is matched: lookups go by
 * name (fetch_source_member). */
static void match_members(struct fetch_parcel *p)
{
	uint32_t *ix = p->nmembers > 0 ? malloc(p->nmembers * sizeof(*ix)) : NULL;

	if (++p->members_epoch == 0)
		p->members_epoch = 1;
	if (ix == NULL && p->nmembers > 0) {
		p->members_epoch = 0;
		return;
	}
	for (uint32_t k = 0; k < p->nmembers; k++)
		ix[k] = k;
	qsort_r(ix, p->nmembers, sizeof(*ix), cmp_member, p->members);
	for (size_t j = 0; j < p->nsrcs; j++) {
		struct fetch_source *s = &p->srcs[j];
		uint32_t lo = 0, hi = p->nmembers;
		while (s->info.peer && lo < hi) {
			uint32_t mid = lo + (hi - lo) / 2;
			if (strcmp(p->members[ix[mid]], s->info.id) < 0)
				lo = mid + 1;
			else
				hi = mid;
		}
		s->member = s->info.peer && lo < p->nmembers &&
					    strcmp(p->members[ix[lo]], s->info.id) == 0
				    ? ix[lo]
				    : UINT32_MAX;
		s->member_epoch = p->members_epoch;
	}
	free(ix);
}

static bool is_member(const struct fetch_parcel *p, const char *id)
{
	for (uint32_t k = 0; k < p->nmembers; k++)
		if (strcmp(p->members[k], id) == 0)
			return true;
	return false;
}

/* The members the answer lists, and the peers kept while unlisted
 * (sources.c, keep_unlisted): their chunks stay theirs. Not when the
 * answer lists a sample of the peers or some of the members: a peer left
 * out of it is not gone, and the members are the tracker's list alone,
 * the same at every node. */
static void take_members(struct fetch_parcel *p, json_t *answer)
{
	json_t *list = json_object_get(answer, "members"), *v;
	size_t i, n = json_array_size(list);

	free(p->members);
	p->members = NULL;
	p->nmembers = 0;
	p->members_cut = json_is_true(json_object_get(answer, "members_cut"));
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
	for (size_t k = 0; k < p->nsrcs && p->nmembers < MEMBERS_MAX && !p->sampled && !p->members_cut;
	     k++)
		if (p->srcs[k].unlisted_ms != 0 && !is_member(p, p->srcs[k].info.id))
			snprintf(p->members[p->nmembers++], TRK_ID_MAX, "%s", p->srcs[k].info.id);
}

static int cmp_desc(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return a < b ? 1 : a > b ? -1 : 0;
}

static void seed_gauge(const struct fetcher *x, const struct fetch *f)
{
	uint64_t n = 0;

	for (uint32_t i = 0; i < f->nparcels; i++)
		n += f->parcels[i].seed;
	proto_metrics_set(x->o.am->m, x->o.am->seed_parcels, n);
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
 * fetch_pick), and once the tracker stops listing it, to the next
 * member in line. The cap is kept by the readers, not the trainer: reads
 * are one-sided.
 *
 * A node a cut members list leaves out (a swarm larger than
 * TESSERA_SWARM_MEMBERS: the tracker lists the members of highest
 * weight and says "members_cut") reads none of the trainer's chunks as
 * their owner: the others do not count it among the owners. Out of a
 * whole list (its lease lapsed, its peers keep it as a member for a
 * grace period: keep_unlisted) it still does.
 */
#define SEED_SALT UINT32_MAX

static void pick_seeds(const struct fetcher *x, const struct fetch *f, uint32_t pi, uint8_t *seed)
{
	struct fetch_parcel *p = &f->parcels[pi];
	uint64_t cap = proto_param(PROTO_PARAM_PUB_UPLOAD_READERS), *sc, cut, me;
	uint32_t n = 0;

	bool member = p->nmembers == 0 || !p->members_cut || is_member(p, x->o.id);

	memset(seed, 1, PROTO_MAX(p->nmembers, 1));
	p->seed = member;
	if (cap == 0 || p->nmembers < cap || (sc = malloc((p->nmembers + 1) * sizeof(*sc))) == NULL)
		return;
	me = hrw(x->o.id, pi, SEED_SALT);
	if (member)
		sc[n++] = me;
	for (uint32_t k = 0; k < p->nmembers; k++)
		if (strcmp(p->members[k], x->o.id) != 0 && !fetch_banned(f, p->members[k]))
			sc[n++] = hrw(p->members[k], pi, SEED_SALT);
	if (n > cap) {
		qsort(sc, n, sizeof(*sc), cmp_desc);
		cut = sc[cap - 1];
		for (uint32_t k = 0; k < p->nmembers; k++)
			seed[k] = hrw(p->members[k], pi, SEED_SALT) >= cut;
		p->seed = member && me >= cut;
	}
	free(sc);
}

/* What the owner split below depends on, hashed: the members in order,
 * which of them are banned, the seed readers' cap. 0: nothing to go by
 * (no members: the split follows the sources). */
static uint64_t owners_key(const struct fetch *f, const struct fetch_parcel *p)
{
	uint64_t h = FETCH_FNV_BASIS ^ proto_param(PROTO_PARAM_PUB_UPLOAD_READERS);

	if (p->nmembers == 0)
		return 0;
	for (uint32_t k = 0; k < p->nmembers; k++) /* a name, then whether it is banned */
		h = fetch_fnv(fetch_fnv(h, p->members[k]), fetch_banned(f, p->members[k]) ? "b" : "-");
	return h | 1;
}

void fetch_owners(const struct fetcher *x, struct fetch *f, uint32_t pi, json_t *answer)
{
	struct fetch_parcel *p = &f->parcels[pi];
	uint8_t *seed;
	uint64_t key;

	take_members(p, answer);
	match_members(p);
	for (size_t k = 0; k < p->nsrcs; k++)
		if (p->srcs[k].info.peer && !p->srcs[k].self)
			fetch_budget_share(x, p, &p->srcs[k]); /* the members changed */
	if (!x->fanout) { /* star: every chunk is ours to ask the trainer for */
		memset(p->mine, 1, p->mp->nchunks);
		return;
	}
	/* The same members as last time (most answers: they change when a
	 * replica joins or leaves): the same owners. The split is chunks x
	 * members hashes; per answer, every second, it was a tenth of a
	 * simulated node's time at 256 members. */
	if ((key = owners_key(f, p)) != 0 && key == p->owners_key)
		return;
	if ((seed = malloc(PROTO_MAX(p->nmembers, 1))) == NULL)
		return; /* the owners stay as they were */
	p->owners_key = key;
	pick_seeds(x, f, pi, seed);
	/* Owners' loads, to keep the trainer's chunks even (see above);
	 * without room for them, unbounded rendezvous as before. */
	uint32_t nown = p->seed, cap = UINT32_MAX, *load = calloc(p->nmembers + 1, sizeof(*load));
	for (uint32_t k = 0; k < p->nmembers; k++)
		nown += strcmp(p->members[k], x->o.id) != 0 && seed[k] &&
			!fetch_banned(f, p->members[k]);
	if (load != NULL && nown > 0)
		cap = (p->mp->nchunks + nown - 1) / nown;
	p->nowners = nown;
	for (uint32_t c = 0; c < p->mp->nchunks; c++) {
		uint64_t me = hrw(x->o.id, pi, c), best = 0;
		bool mine = p->seed && (load == NULL || load[p->nmembers] < cap);
		if (mine)
			best = me;
		p->owner[c] = UINT32_MAX;
		/* The swarm as the tracker knows it (members that did not offer
		 * yet included: they are about to); else the peers listed. */
		for (uint32_t k = 0; k < p->nmembers; k++) {
			uint64_t h;
			if (strcmp(p->members[k], x->o.id) == 0 || !seed[k] ||
			    fetch_banned(f, p->members[k]) ||
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
			const struct fetch_source *o = &p->srcs[k];
			if (o->info.peer && !o->self && !fetch_banned(f, o->info.id))
				mine = hrw(o->info.id, pi, c) < me;
		}
		p->mine[c] = mine;
		/* Its stand-in: the highest of the other seed readers. */
		uint64_t top = 0;
		bool me_top = !mine && p->seed && p->owner[c] < p->nmembers && p->standin != NULL;
		for (uint32_t k = 0; k < p->nmembers && me_top; k++)
			if (k != p->owner[c] && seed[k] && strcmp(p->members[k], x->o.id) != 0 &&
			    !fetch_banned(f, p->members[k]))
				top = PROTO_MAX(top, hrw(p->members[k], pi, c));
		if (p->standin != NULL)
			p->standin[c] = me_top && me > top;
	}
	free(load);
	free(seed);
	seed_gauge(x, f);
}
