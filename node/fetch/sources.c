/* The tracker's source lists (/sources), merged into each parcel's: who
 * is kept, what moves, how often a parcel asks again. */
#include "node/fetch/fetch.h"

#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/fetch/picker.h"

static void on_sources(const struct trk_answer *ans, void *arg);

struct sources_req {
	struct fetcher *x;
	uint64_t gen;
	uint32_t parcel;
};

/*
 * Members lists by swarm. Every rank of a swarm gets the same list, about
 * 11 bytes per replica of its layout, with every sources answer: at 1 000
 * replicas most of the answer, and mostly unchanged from one version to
 * the next. The last list heard per (layout, src rank, dst rank) is kept
 * with its tag; a query names the tag and an answer that says
 * "members_same" gets the kept list put back before it is read.
 */
#define MEMO_MAX 64 /* swarms remembered; past it, all are forgotten */

static void memo_name(const uint8_t *layout, uint32_t src, uint32_t dst, char *out, size_t cap)
{
	char hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(out, cap, "%s/%u/%u", hex, src, dst);
}

static void memo_tag(struct fetcher *x, struct trk_parcel_key *k)
{
	char name[2 * PROTO_HASH_BYTES + 32];

	memo_name(k->layout, k->src_rank, k->dst_rank, name, sizeof(name));
	const char *t = json_string_value(
		json_object_get(json_object_get(x->members_memo, name), "tag"));
	if (t != NULL && strlen(t) == TRK_MEMBERS_TAG_HEX)
		memcpy(k->members_tag, t, TRK_MEMBERS_TAG_HEX + 1);
}

/* Keeps the answer's members with their tag, or puts the kept ones into
 * an answer that says they are the same. */
static void memo_members(struct fetcher *x, const uint8_t *layout, uint32_t src, uint32_t dst,
			 json_t *answer)
{
	char name[2 * PROTO_HASH_BYTES + 32];
	json_t *tag = json_object_get(answer, "members_tag");
	json_t *members = json_object_get(answer, "members");

	memo_name(layout, src, dst, name, sizeof(name));
	if (json_is_true(json_object_get(answer, "members_same"))) {
		json_t *kept = json_object_get(json_object_get(x->members_memo, name), "members");
		if (kept != NULL)
			json_object_set(answer, "members", kept);
		return;
	}
	if (!json_is_string(tag) || !json_is_array(members))
		return;
	if (x->members_memo == NULL && (x->members_memo = json_object()) == NULL)
		return;
	if (json_object_size(x->members_memo) >= MEMO_MAX)
		json_object_clear(x->members_memo);
	json_object_set_new(x->members_memo, name,
			    json_pack("{s:O,s:O}", "tag", tag, "members", members));
}

/* Early in a fetch (SOURCES_EARLY_FOR_MS), a parcel whose list names no
 * publisher asks again every SOURCES_EARLY_MS: a version is announced tens
 * of ms before its publisher's offer reaches the tracker, while the nodes'
 * own offers come at once. Later (a publisher gone for good) it asks at
 * the usual periods: SOURCES_MIN_MS, or SWARM_REFRESH_MS when it knows
 * peers (NOTES.md, "Source lists"). */
/* Whether a member owns a chunk p still needs but the tracker did not list
 * it as a source: its offer reached the tracker after our /sources. (A
 * sampled answer lists most members not: no race to chase.) */
static bool owner_unlisted(const struct fetch_parcel *p)
{
	uint8_t few[MEMBERS_FEW], *listed;
	bool unlisted = false;

	if (p->owner == NULL || p->nmembers == 0 || p->sampled)
		return false;
	/* Which members are listed: once per source, not per chunk (it runs
	 * on every tick; per chunk and source it was O(chunks x N)). */
	if ((listed = fetch_members_listed(p, false, 0, few)) == NULL)
		return false; /* asked at the usual period */
	for (uint32_t c = 0; c < p->mp->nchunks && !unlisted; c++)
		unlisted = p->state[c] == CHUNK_TODO && p->owner[c] < p->nmembers && !listed[p->owner[c]];
	if (listed != few)
		free(listed);
	return unlisted;
}

/* The same race with the peers: a member's offer can reach the tracker
 * just after our first /sources, which then lists the publisher but not
 * that member, whose chunks are its own to fetch. So early in a fetch a
 * parcel that lacks an owner among its sources also asks again every
 * SOURCES_EARLY_MS (the chase timer asks too, not only the tick). */
uint64_t fetch_sources_gap(const struct fetch *f, const struct fetch_parcel *p, bool peers,
			   uint64_t now)
{
	bool publisher = false;

	for (size_t k = 0; k < p->nsrcs && !publisher; k++)
		publisher = !p->srcs[k].info.peer;
	if (now - f->started_ms < SOURCES_EARLY_FOR_MS && (!publisher || owner_unlisted(p)))
		return SOURCES_EARLY_MS;
	return peers ? SWARM_REFRESH_MS : SOURCES_MIN_MS;
}

bool fetch_sources_refresh(struct fetcher *x, uint32_t pi, uint64_t now)
{
	const struct fetch_parcel *p = &x->f->parcels[pi];
	bool peers = false;

	for (size_t k = 0; k < p->nsrcs; k++)
		peers |= p->srcs[k].info.peer && !p->srcs[k].self;
	if (p->done < p->mp->nchunks && now - p->sources_ms >= fetch_sources_gap(x->f, p, peers, now))
		fetch_want_sources(x, pi);
	return peers;
}

void fetch_want_sources(struct fetcher *x, uint32_t pi)
{
	struct fetch *f = x->f;
	struct fetch_parcel *p = &f->parcels[pi];
	struct sources_req *req;
	uint64_t now = node_now_ms();

	/* Taken whole, a delta's parcels come from holders only: its swarm
	 * and its publisher serve them encoded. */
	if (f->full || p->sources_pending || now - p->sources_ms < fetch_sources_gap(f, p, false, now))
		return;
	req = malloc(sizeof(*req));
	if (req == NULL)
		return;
	*req = (struct sources_req){x, x->gen, pi};
	p->sources_pending = true;
	p->sources_ms = now;
	struct trk_parcel_key k = {.version = f->version, .src_rank = p->mp->src_rank,
				   .dst_rank = p->mp->dst_rank};
	memcpy(k.layout, f->ml->layout_digest, PROTO_HASH_BYTES);
	memo_tag(x, &k);
	if ((x->o.sources != NULL ? x->o.sources(x->o.sources_ctx, &k, on_sources, req)
				  : trk_client_sources_key(x->o.trk, &k, on_sources, req)) != 0) {
		p->sources_pending = false;
		free(req);
	}
}

/*
 * Sources the tracker stopped listing. A node or publisher whose lease
 * lapsed (heartbeats lost or late on a congested control path, a tracker
 * restarted or paused) drops out of every /sources answer until it has
 * registered and offered again, about a heartbeat later; meanwhile it
 * still serves what it holds. Dropping a peer cost the swarm its
 * have-page, its pacing and its share of the chunk owners (its chunks went
 * to the trainer); dropping the publisher left its readers with no source
 * at all, waiting in silence. So such a source stays (a peer also as a
 * member, fetch_owners) for TESSERA_PEER_GRACE_MS while it answers:
 * once one of its reads fails it rests (fetch_source_failed) and the next
 * answer drops it, so a source that left or died costs one failed read.
 * Copies the sources of p's list that the answer lacks (moved[j] == 0),
 * not resting, a peer only with its have-page read, and in grace, into ns
 * after its n listed ones (they move: the old entries give up their
 * handles; moved[j] says where); returns how many.
 */
/* Reads in flight follow their source to the new list; those whose source
 * left it no longer name one. So do have-page reads (the swarm's hook): a
 * dropped one would leave its source's page to the next poll period. */
void fetch_reads_follow(struct fetcher *x, const struct fetch_parcel *p, const uint32_t *moved,
			struct fetch_source *ns)
{
	struct fetch *f = x->f;

	for (uint32_t r = 0; r < x->nreads; r++) {
		struct fetch_read *rd = &x->reads[r];
		if (rd->in_fabric && rd->gen == x->gen && &f->parcels[rd->parcel] == p &&
		    rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs && moved[rd->src_idx] != 0) {
			rd->src_idx = moved[rd->src_idx] - 1;
			rd->src_epoch = p->src_epoch + 1;
		}
	}
	if (x->o.hooks.sources_moved != NULL)
		x->o.hooks.sources_moved(x->o.hooks.swarm, p, moved, ns);
}

/* In a sampled swarm (the answer lists TESSERA_SWARM_PEERS of them), a
 * peer the sample leaves out is not gone: it stays while it answers, with
 * no grace period, up to TESSERA_SWARM_PEERS peers in all (those with
 * reads of ours out first). Each answer brings a few new peers in
 * (sample_room) and as many old ones go: each node keeps a bounded random
 * set of peers, as a BitTorrent client keeps its connections, that still
 * changes, so that a peer that started late (a member whose chunks only
 * it holds yet) is found. */
static size_t keep_unlisted(struct fetcher *x, const struct fetch *f,
			    struct fetch_parcel *p, struct fetch_source *ns, size_t n, uint32_t *moved)
{
	uint64_t now = node_now_ms(), grace = proto_param(PROTO_PARAM_PEER_GRACE_MS);
	uint64_t cap = p->sampled ? proto_param(PROTO_PARAM_SWARM_PEERS) : 0, peers = 0;
	bool *over = NULL; /* sampled: unlisted peers past the cap, dropped */
	size_t k = n;

	if (cap != 0 && (over = calloc(p->nsrcs + 1, sizeof(*over))) != NULL) {
		for (size_t i = 0; i < n; i++)
			peers += ns[i].info.peer && !ns[i].self;
		for (int busy = 1; busy >= 0; busy--) /* those with reads of ours out first */
			for (size_t j = 0; j < p->nsrcs; j++) {
				const struct fetch_source *o = &p->srcs[j];
				if (moved[j] != 0 || !o->info.peer || o->self ||
				    (fetch_pace(o)->inflight_reads > 0) != busy)
					continue;
				if (peers >= cap)
					over[j] = true;
				else
					peers++;
			}
	}
	for (size_t j = 0; j < p->nsrcs; j++) {
		struct fetch_source *o = &p->srcs[j];
		if (moved[j] != 0 || (over != NULL && over[j]) || o->self || o->bad_until_ms > now ||
		    (o->info.peer && (o->have == NULL || fetch_banned(f, o->info.id))) ||
		    (o->unlisted_ms != 0 && now - o->unlisted_ms >= grace &&
		     !(over != NULL && o->info.peer)))
			continue;
		if (o->unlisted_ms == 0)
			LOG_DEBUG("node %s: %s %s no longer listed; kept while it answers", x->o.id,
				  o->info.peer ? "peer" : "publisher", o->info.id);
		ns[k] = *o;
		ns[k].unlisted_ms = o->unlisted_ms != 0 ? o->unlisted_ms : now;
		ns[k].have_busy = false; /* a read in flight is dropped (epoch) */
		o->fa_valid = false;
		o->have = NULL;
		o->info.fabric_addr = NULL;
		moved[j] = (uint32_t)++k;
	}
	free(over);
	return k - n;
}

static bool same_source(const struct fetch_source *o, const struct trk_source *s)
{
	return o->info.fabric_addr_len == s->fabric_addr_len &&
	       memcmp(o->info.fabric_addr, s->fabric_addr, s->fabric_addr_len) == 0 &&
	       o->info.key == s->key && o->info.addr == s->addr;
}

/* A sampled answer's peers we do not know yet, past TESSERA_SWARM_PEERS
 * with those we have: dropped from s (n of them), the rest kept in order;
 * but SAMPLE_NEW(cap) of them come in anyway, for as many old ones
 * (keep_unlisted). */
#define SAMPLE_NEW(cap) PROTO_MAX((cap) / 16, 1)

static size_t sample_room(struct fetcher *x, const struct fetch_parcel *p, struct trk_source *s,
			  size_t n)
{
	uint64_t now = node_now_ms(), cap = proto_param(PROTO_PARAM_SWARM_PEERS), have = 0;
	uint64_t extra = cap == 0 ? 0 : SAMPLE_NEW(cap);
	size_t w = 0;

	for (size_t j = 0; j < p->nsrcs; j++)
		have += p->srcs[j].info.peer && !p->srcs[j].self && p->srcs[j].bad_until_ms <= now &&
			!fetch_banned(x->f, p->srcs[j].info.id);
	for (size_t i = 0; i < n; i++) {
		bool known = !s[i].peer || strcmp(s[i].id, x->o.id) == 0;
		for (size_t j = 0; j < p->nsrcs && !known; j++)
			known = same_source(&p->srcs[j], &s[i]);
		if (!known && cap != 0 && have >= cap && extra == 0) {
			free(s[i].fabric_addr);
			continue;
		}
		if (!known && cap != 0 && have >= cap)
			extra--;
		have += !known;
		s[w++] = s[i];
	}
	return w;
}

static void on_sources(const struct trk_answer *ans, void *arg)
{
	struct sources_req *req = arg;
	struct fetcher *x = req->x;
	struct fetch *f = x->f;
	struct trk_source *s = NULL;
	struct proto_err err;
	size_t n = 0;

	if (f == NULL || req->gen != x->gen) {
		free(req);
		return;
	}
	uint32_t req_parcel = req->parcel;
	struct fetch_parcel *p = &f->parcels[req_parcel];
	free(req);
	p->sources_pending = false;
	p->sources_ms = node_now_ms();
	if (f->su.sources == 0)
		f->su.sources = proto_wall_ms();
	if (ans->status == 200 && ans->json != NULL)
		memo_members(x, f->ml->layout_digest, p->mp->src_rank, p->mp->dst_rank, ans->json);
	if (ans->status != 200 || trk_sources_parse(ans->json, &s, &n, &err) != 0) {
		LOG_DEBUG("node %s: sources: %s", x->o.id, ans->status != 200 ? ans->error : err.msg);
		return;
	}
	size_t npub = 0;
	for (size_t i = 0; i < n; i++)
		npub += !s[i].peer;
	LOG_DEBUG("node %s: v%" PRIu64 " parcel %u<-%u: %zu sources listed, %zu of them publishers",
		  x->o.id, f->version, p->mp->dst_rank, p->mp->src_rank, n, npub);
	/* Keep what we know of sources still listed (their rest periods and
	 * fabric handles); add new ones. */
	struct fetch_source *ns = calloc(n + p->nsrcs + 1, sizeof(*ns));
	if (ns == NULL) {
		trk_sources_free(s, n);
		return;
	}
	uint32_t *moved = calloc(p->nsrcs + 1, sizeof(*moved)); /* old index -> new + 1 */
	if (moved == NULL) {
		free(ns);
		trk_sources_free(s, n);
		return;
	}
	size_t kept = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i].peer && !x->fanout) { /* star mode: publishers only */
			free(s[i].fabric_addr);
			continue;
		}
		s[kept++] = s[i];
	}
	n = kept;
	p->sampled = json_integer_value(json_object_get(ans->json, "peers_of")) > 0;
	if (p->sampled)
		n = sample_room(x, p, s, n);
	for (size_t i = 0; i < n; i++) {
		ns[i].info = s[i];
		ns[i].listed_ms = node_now_ms(); /* unless known before (below) */
		ns[i].self = s[i].peer && strcmp(s[i].id, x->o.id) == 0;
		for (size_t j = 0; j < p->nsrcs; j++) {
			struct fetch_source *o = &p->srcs[j];
			if (moved[j] == 0 && same_source(o, &s[i])) {
				struct trk_source info = ns[i].info;
				ns[i] = *o; /* handle, rest period, pacing, have-page */
				ns[i].info = info;
				ns[i].unlisted_ms = 0;
				ns[i].have_busy = false; /* unless its read follows it (below) */
				o->fa_valid = false;
				o->have = NULL;
				moved[j] = (uint32_t)i + 1;
			}
		}
	}
	n += keep_unlisted(x, f, p, ns, n, moved);
	for (size_t i = 0; i < n; i++)
		if (ns[i].hp == NULL)
			ns[i].hp = fetch_host_pace(x, &ns[i].info);
	fetch_reads_follow(x, p, moved, ns);
	free(moved);
	p->src_epoch++;
	for (size_t j = 0; j < p->nsrcs; j++) {
		fetch_source_release(x, &p->srcs[j]);
		free(p->srcs[j].info.fabric_addr);
		free(p->srcs[j].have);
	}
	free(p->srcs);
	free(s); /* the strings moved into ns */
	p->srcs = ns;
	p->nsrcs = n;
	fetch_owners(x, f, req_parcel, ans->json);
	fetch_recount(f, p);
	if (x->o.hooks.sources_changed != NULL) /* new peers: their pages read now */
		x->o.hooks.sources_changed(x->o.hooks.swarm, req_parcel);
	fetch_pump(x);
}
