/* Pulling chunks: sources from the tracker, a read window paced by each
 * source's measured rate, verification, and silent sources. */
#include "node/agent/agent_internal.h"

static void on_sources(const struct trk_answer *ans, void *arg);

struct sources_req {
	struct node_agent *a;
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

static void memo_tag(struct node_agent *a, struct trk_parcel_key *k)
{
	char name[2 * PROTO_HASH_BYTES + 32];

	memo_name(k->layout, k->src_rank, k->dst_rank, name, sizeof(name));
	const char *t = json_string_value(
		json_object_get(json_object_get(a->members_memo, name), "tag"));
	if (t != NULL && strlen(t) == TRK_MEMBERS_TAG_HEX)
		memcpy(k->members_tag, t, TRK_MEMBERS_TAG_HEX + 1);
}

/* Keeps the answer's members with their tag, or puts the kept ones into
 * an answer that says they are the same. */
static void memo_members(struct node_agent *a, const uint8_t *layout, uint32_t src, uint32_t dst,
			 json_t *answer)
{
	char name[2 * PROTO_HASH_BYTES + 32];
	json_t *tag = json_object_get(answer, "members_tag");
	json_t *members = json_object_get(answer, "members");

	memo_name(layout, src, dst, name, sizeof(name));
	if (json_is_true(json_object_get(answer, "members_same"))) {
		json_t *kept = json_object_get(json_object_get(a->members_memo, name), "members");
		if (kept != NULL)
			json_object_set(answer, "members", kept);
		return;
	}
	if (!json_is_string(tag) || !json_is_array(members))
		return;
	if (a->members_memo == NULL && (a->members_memo = json_object()) == NULL)
		return;
	if (json_object_size(a->members_memo) >= MEMO_MAX)
		json_object_clear(a->members_memo);
	json_object_set_new(a->members_memo, name,
			    json_pack("{s:O,s:O}", "tag", tag, "members", members));
}

/*
 * A version is announced (the watch wakes us) some tens of ms before its
 * publisher's offer reaches the tracker, while the nodes' own offers come
 * at once: the first /sources answer listed peers that held nothing and
 * no publisher, and the next one came with the swarm's refresh a second
 * later (first reads 0.5 to 1.3 s after publication, in an 8-node netns
 * run). So early in a fetch a parcel that lists no publisher asks again
 * every SOURCES_EARLY_MS; later (a publisher gone for good) at the usual
 * periods: SOURCES_MIN_MS, or SWARM_REFRESH_MS when it knows peers.
 */
/* Whether a member owns a chunk p still needs but the tracker did not list
 * it as a source: its offer reached the tracker after our /sources. */
static bool owner_unlisted(const struct agent_parcel *p)
{
	for (uint32_t c = 0; p->owner != NULL && c < p->mp->nchunks; c++) {
		uint32_t k = p->owner[c];
		bool listed = false;
		if (p->state[c] != 0 || k >= p->nmembers)
			continue;
		for (size_t j = 0; j < p->nsrcs && !listed; j++)
			listed = p->srcs[j].info.peer && strcmp(p->srcs[j].info.id, p->members[k]) == 0;
		if (!listed)
			return true;
	}
	return false;
}

/*
 * The same race with the peers: a member's offer can reach the tracker
 * just after our first /sources, which then lists the publisher but not
 * that member. Its chunks are its own to fetch, so we waited for it as a
 * source we did not know: until the next answer, SOURCES_MIN_MS later and
 * on the 100 ms tick (one rank of a delta version took 313-394 ms to
 * fetch instead of 60-110, its last chunks 380 ms after the owner held
 * them, in 2 of 6 versions). So early in a fetch a parcel that lacks an
 * owner among its sources also asks again every SOURCES_EARLY_MS (the
 * chase timer asks too, not only the tick).
 */
uint64_t agent_sources_gap(const struct agent_fetch *f, const struct agent_parcel *p, bool peers,
			   uint64_t now)
{
	bool publisher = false;

	for (size_t k = 0; k < p->nsrcs && !publisher; k++)
		publisher = !p->srcs[k].info.peer;
	if (now - f->started_ms < SOURCES_EARLY_FOR_MS && (!publisher || owner_unlisted(p)))
		return SOURCES_EARLY_MS;
	return peers ? SWARM_REFRESH_MS : SOURCES_MIN_MS;
}

void agent_want_sources(struct node_agent *a, uint32_t pi)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	struct sources_req *req;
	uint64_t now = agent_now_ms();

	/* Taken whole, a delta's parcels come from holders only: its swarm
	 * and its publisher serve them encoded. */
	if (f->full || p->sources_pending || now - p->sources_ms < agent_sources_gap(f, p, false, now))
		return;
	req = malloc(sizeof(*req));
	if (req == NULL)
		return;
	*req = (struct sources_req){a, a->gen, pi};
	p->sources_pending = true;
	p->sources_ms = now;
	struct trk_parcel_key k = {.version = f->version, .src_rank = p->mp->src_rank,
				   .dst_rank = p->mp->dst_rank};
	memcpy(k.layout, f->ml->layout_digest, PROTO_HASH_BYTES);
	memo_tag(a, &k);
	const struct node_agent_shared *sh = a->o.shared;
	if ((sh->sources != NULL ? sh->sources(sh->sources_ctx, &k, on_sources, req)
				 : trk_client_sources_key(a->trk, &k, on_sources, req)) != 0) {
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
 * member, agent_swarm_owners) for TESSERA_PEER_GRACE_MS while it answers:
 * once one of its reads fails it rests (agent_source_failed) and the next
 * answer drops it, so a source that left or died costs one failed read.
 * Copies the sources of p's list that the answer lacks (moved[j] == 0),
 * not resting, a peer only with its have-page read, and in grace, into ns
 * after its n listed ones (they move: the old entries give up their
 * handles; moved[j] says where); returns how many.
 */
/* Reads in flight follow their source to the new list; those whose source
 * left it no longer name one. So do have-page reads: dropped, a source's
 * page waited for the next poll period after a refresh, and refreshes come
 * every SOURCES_EARLY_MS early in a fetch, while the first pages are due
 * (agent_swarm_pick waits on them). */
void agent_reads_follow(struct node_agent *a, const struct agent_parcel *p, const uint32_t *moved,
			struct agent_source *ns)
{
	struct agent_fetch *f = a->fetch;

	for (uint32_t r = 0; r < a->nreads; r++) {
		struct agent_read *rd = &a->reads[r];
		if (rd->in_fabric && rd->gen == a->gen && &f->parcels[rd->parcel] == p &&
		    rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs && moved[rd->src_idx] != 0) {
			rd->src_idx = moved[rd->src_idx] - 1;
			rd->src_epoch = p->src_epoch + 1;
		}
	}
	for (uint32_t r = 0; a->hreads != NULL && r < HAVE_SLOTS; r++) {
		struct agent_have_read *hr = &a->hreads[r];
		if (hr->busy && hr->gen == a->gen && &f->parcels[hr->parcel] == p &&
		    hr->src_epoch == p->src_epoch && hr->src_idx < p->nsrcs && moved[hr->src_idx] != 0) {
			hr->src_idx = moved[hr->src_idx] - 1;
			hr->src_epoch = p->src_epoch + 1;
			ns[hr->src_idx].have_busy = true;
		}
	}
}

static size_t keep_unlisted(struct node_agent *a, const struct agent_fetch *f,
			    struct agent_parcel *p, struct agent_source *ns, size_t n, uint32_t *moved)
{
	uint64_t now = agent_now_ms(), grace = proto_param(PROTO_PARAM_PEER_GRACE_MS);
	size_t k = n;

	for (size_t j = 0; j < p->nsrcs; j++) {
		struct agent_source *o = &p->srcs[j];
		if (moved[j] != 0 || o->self || o->bad_until_ms > now ||
		    (o->info.peer && (o->have == NULL || agent_swarm_banned(f, o->info.id))) ||
		    (o->unlisted_ms != 0 && now - o->unlisted_ms >= grace))
			continue;
		if (o->unlisted_ms == 0)
			LOG_DEBUG("node %s: %s %s no longer listed; kept while it answers", a->node_id,
				  o->info.peer ? "peer" : "publisher", o->info.id);
		ns[k] = *o;
		ns[k].unlisted_ms = o->unlisted_ms != 0 ? o->unlisted_ms : now;
		ns[k].have_busy = false; /* a read in flight is dropped (epoch) */
		o->fa_valid = false;
		o->have = NULL;
		o->info.fabric_addr = NULL;
		moved[j] = (uint32_t)++k;
	}
	return k - n;
}

static void on_sources(const struct trk_answer *ans, void *arg)
{
	struct sources_req *req = arg;
	struct node_agent *a = req->a;
	struct agent_fetch *f = a->fetch;
	struct trk_source *s = NULL;
	struct proto_err err;
	size_t n = 0;

	if (f == NULL || req->gen != a->gen) {
		free(req);
		return;
	}
	uint32_t req_parcel = req->parcel;
	struct agent_parcel *p = &f->parcels[req_parcel];
	free(req);
	p->sources_pending = false;
	p->sources_ms = agent_now_ms();
	if (f->su.sources == 0)
		f->su.sources = proto_wall_ms();
	if (ans->status == 200 && ans->json != NULL)
		memo_members(a, f->ml->layout_digest, p->mp->src_rank, p->mp->dst_rank, ans->json);
	if (ans->status != 200 || trk_sources_parse(ans->json, &s, &n, &err) != 0) {
		LOG_DEBUG("node %s: sources: %s", a->node_id, ans->status != 200 ? ans->error : err.msg);
		return;
	}
	size_t npub = 0;
	for (size_t i = 0; i < n; i++)
		npub += !s[i].peer;
	LOG_DEBUG("node %s: v%" PRIu64 " parcel %u<-%u: %zu sources listed, %zu of them publishers",
		  a->node_id, f->version, p->mp->dst_rank, p->mp->src_rank, n, npub);
	/* Keep what we know of sources still listed (their rest periods and
	 * fabric handles); add new ones. */
	struct agent_source *ns = calloc(n + p->nsrcs + 1, sizeof(*ns));
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
		if (s[i].peer && !a->fanout) { /* star mode: publishers only */
			free(s[i].fabric_addr);
			continue;
		}
		s[kept++] = s[i];
	}
	n = kept;
	for (size_t i = 0; i < n; i++) {
		ns[i].info = s[i];
		ns[i].listed_ms = agent_now_ms(); /* unless known before (below) */
		ns[i].self = s[i].peer && strcmp(s[i].id, a->node_id) == 0;
		for (size_t j = 0; j < p->nsrcs; j++) {
			struct agent_source *o = &p->srcs[j];
			if (moved[j] == 0 && o->info.fabric_addr_len == s[i].fabric_addr_len &&
			    memcmp(o->info.fabric_addr, s[i].fabric_addr, s[i].fabric_addr_len) == 0 &&
			    o->info.key == s[i].key && o->info.addr == s[i].addr) {
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
	n += keep_unlisted(a, f, p, ns, n, moved);
	for (size_t i = 0; i < n; i++)
		if (ns[i].hp == NULL)
			ns[i].hp = agent_host_pace(a, &ns[i].info);
	agent_reads_follow(a, p, moved, ns);
	free(moved);
	p->src_epoch++;
	for (size_t j = 0; j < p->nsrcs; j++) {
		if (p->srcs[j].fa_valid)
			fab_av_remove(a->fab, p->srcs[j].fa);
		free(p->srcs[j].info.fabric_addr);
		free(p->srcs[j].have);
	}
	free(p->srcs);
	free(s); /* the strings moved into ns */
	p->srcs = ns;
	p->nsrcs = n;
	agent_swarm_owners(a, req_parcel, ans->json);
	agent_swarm_recount(a, req_parcel);
	agent_pump(a);
}

/*
 * Pacing. A source's window is the bytes we keep in flight to its host
 * (every source on one host shares one record, agent_hosts.c): the host's
 * measured rate times TESSERA_FETCH_TARGET_MS, at least WINDOW_MIN_CHUNKS
 * chunks (enough to keep a link busy between two completions), at most
 * TESSERA_INFLIGHT chunks. A fixed count of reads per node queued far more
 * than a shared link carries in the stall timeout, and turned congestion
 * into a refetch storm.
 */
uint64_t agent_source_window(const struct node_agent *a, const struct agent_source *s)
{
	uint64_t lo = (uint64_t)WINDOW_MIN_CHUNKS * a->chunk_size;
	uint64_t hi = PROTO_MAX(lo, (uint64_t)a->max_inflight * a->chunk_size);
	uint64_t rate = agent_pace(s)->rate;
	uint64_t w = rate == 0 ? lo : rate * proto_param(PROTO_PARAM_FETCH_TARGET_MS) / 1000;
	return PROTO_MIN(hi, PROTO_MAX(lo, w));
}

/* How long a source on host h may deliver nothing while reads of ours are
 * queued on it: the time its window takes at its measured rate, four
 * times over, and never less than TESSERA_STALL_MS (three times that
 * before it delivered anything). */
static uint64_t window_patience(const struct agent_source *h)
{
	uint64_t stall = proto_param(PROTO_PARAM_STALL_MS);

	if (h->rate == 0)
		return 3 * stall;
	return PROTO_MAX(stall, 4 * h->inflight_bytes * 1000 / h->rate);
}

/* How long s may deliver nothing while it has reads in flight: a
 * publisher its window's patience; a peer PEER_STALL_MS, or twice its
 * window's time if longer: its window is at most TESSERA_PEER_INFLIGHT
 * reads and the trainer (or another holder) is always there to move to,
 * so a peer that stops answering has its reads moved within about two
 * seconds. */
static uint64_t source_patience(const struct agent_source *src)
{
	const struct agent_source *s = agent_pace(src);

	if (s->info.peer)
		return s->rate == 0 ? PEER_STALL_MS
				    : PROTO_MAX(PEER_STALL_MS, 2 * s->inflight_bytes * 1000 / s->rate);
	return window_patience(s);
}

uint64_t agent_source_queue_ms(const struct agent_source *s, uint64_t bytes)
{
	return s == NULL || agent_pace(s)->rate == 0 ? 0 : bytes * 1000 / agent_pace(s)->rate;
}

/*
 * Congested, not dead. A peer's uplink is shared by every reader of its
 * chunks and serves each connection's queue in turn: at N = 16 (100 Mbit/s
 * netns) a reader's one 512 KiB read waited over two seconds behind the
 * other readers' bytes while the peer kept sending, and PEER_STALL_MS
 * moved 17 such reads of live peers (9.5 MiB refetched, as much again
 * received twice). Completions cannot tell a queued read from a lost one;
 * the peer's have-page can: it is read every TESSERA_HAVE_POLL_MS over an
 * endpoint of its own (agent_hosts.c), answered at once however deep the
 * chunk queue. So a peer that answered a page read posted within
 * PEER_STALL_MS is alive, and its reads stay with it for a publisher's
 * patience (window_patience: its queue at its measured rate, four times
 * over, TESSERA_STALL_MS at least), while the endgame may ask another
 * holder for a last chunk. A peer that dies fails its reads; one that
 * stops answering answers no page either, and is silent PEER_STALL_MS
 * after the last page it answered was asked for.
 */
static bool peer_answers(const struct agent_source *h, uint64_t now)
{
	return h->answered_ms != 0 && h->answered_ms + PEER_STALL_MS > now;
}

/* Its host delivered nothing for its patience while reads were out. */
bool agent_source_silent(const struct agent_source *s, uint64_t now)
{
	const struct agent_source *h = agent_pace(s);
	uint64_t quiet;

	/* now may predate the last progress (taken before a read landed). */
	if (h->inflight_reads == 0 || now <= h->progress_ms)
		return false;
	quiet = now - h->progress_ms;
	if (quiet < source_patience(s))
		return false;
	return !h->info.peer || !peer_answers(h, now) || quiet >= window_patience(h);
}

/* A peer past its patience that answers its have-page: congested, its
 * reads stay (not silent). */
static bool peer_congested(const struct agent_source *s, uint64_t now)
{
	const struct agent_source *h = agent_pace(s);

	return h->info.peer && h->inflight_reads > 0 && now > h->progress_ms &&
	       now - h->progress_ms >= source_patience(s) && !agent_source_silent(s, now);
}

void agent_source_answered(struct agent_source *s, uint64_t posted_ms)
{
	struct agent_source *h = agent_pace(s);

	h->answered_ms = PROTO_MAX(h->answered_ms, posted_ms);
}

/* s has a fabric handle (inserted now if need be); false, with s set
 * aside for a while, when its address cannot be inserted. */
bool agent_source_ready(struct node_agent *a, struct agent_source *s, uint64_t now)
{
	if (s->fa_valid)
		return true;
	if (fab_av_insert(a->fab, s->info.fabric_addr, s->info.fabric_addr_len, &s->fa) != 0) {
		s->bad_until_ms = now + BAD_SOURCE_MS;
		return false;
	}
	s->fa_valid = true;
	agent_warm_hold(a, s);
	return true;
}

static void pace_posted(struct agent_source *s, uint64_t len);

/* Accounting for a read posted to s (and to its host's record). */
void agent_source_posted(struct agent_source *s, uint64_t len)
{
	pace_posted(s, len);
	s->up_tokens -= PROTO_MIN(len, s->up_tokens); /* its upload budget (agent_swarm.c) */
	if (s->hp != NULL)
		pace_posted(s->hp, len);
}

static void pace_posted(struct agent_source *s, uint64_t len)
{
	uint64_t now = agent_now_ms();

	if (s->inflight_reads == 0) {
		/* Busy from now: silence and rate are measured from here. */
		s->progress_ms = now;
		s->meas_ms = now;
		s->meas_bytes = 0;
		s->silent_logged = false;
		s->congested_logged = false;
	}
	s->inflight_reads++;
	s->inflight_bytes += len;
}

/* Accounting for a read of s that completed (ok: with its bytes). The rate
 * is measured over stretches of at least RATE_SAMPLE_MS while busy, and
 * smoothed (half the old, half the new). */
void agent_source_done(struct agent_source *s, uint64_t len, bool ok)
{
	uint64_t now = agent_now_ms();

	s->inflight_reads--;
	s->inflight_bytes -= PROTO_MIN(len, s->inflight_bytes);
	if (ok) {
		s->progress_ms = now;
		s->silent_logged = false;
		s->congested_logged = false;
		s->meas_bytes += len;
		if (now - s->meas_ms >= RATE_SAMPLE_MS) {
			uint64_t sample = s->meas_bytes * 1000 / (now - s->meas_ms);
			s->rate = s->rate == 0 ? sample : (s->rate + sample) / 2;
			s->meas_ms = now;
			s->meas_bytes = 0;
		}
	}
}

/* The source a read went to, if the parcel's source list is still the one
 * it was picked from. */
static struct agent_source *read_source(struct agent_fetch *f, const struct agent_read *rd)
{
	struct agent_parcel *p = &f->parcels[rd->parcel];
	return rd->src_epoch == p->src_epoch && rd->src_idx < p->nsrcs ? &p->srcs[rd->src_idx] : NULL;
}

void agent_source_failed(struct node_agent *a, struct agent_source *s)
{
	if (s == NULL)
		return;
	s->bad_until_ms = agent_now_ms() + BAD_SOURCE_MS;
	/* tcp;ofi_rxm drops the connection on an error: start afresh. */
	agent_warm_drop(a, s);
	if (s->fa_valid) {
		fab_av_remove(a->fab, s->fa);
		s->fa_valid = false;
	}
}

/* A read completed: failures are retried elsewhere, data goes to a worker
 * to be hashed and scattered (on_verified picks it up). */
static void on_read(struct fab_op *op, int status)
{
	agent_read_landed(proto_container_of(op, struct agent_read, op), status);
}

/* On a verification worker: the chunk is in the host slot; the CUDA store
 * uploads it now, while the network brings the next ones. */
static void chunk_placed(struct node_vjob *job, void *arg)
{
	struct node_agent *a = arg;
	struct agent_read *rd = proto_container_of(job, struct agent_read, job);

	node_slot_stream_chunk(&a->store, rd->vslot, job->plan, job->parcel, job->layout, job->off,
			       job->buf, job->len);
}

void agent_read_landed(struct agent_read *rd, int status)
{
	struct node_agent *a = rd->a;
	struct agent_fetch *f = a->fetch;

	a->inflight--;
	rd->in_fabric = false;
	if (rd->hp != NULL) /* the host's record, whatever became of the fetch */
		agent_source_done(rd->hp, rd->len, status == 0);
	if (f != NULL && rd->gen == a->gen && read_source(f, rd) != NULL)
		agent_source_done(read_source(f, rd), rd->len, status == 0);
	if (rd->abandoned || f == NULL || rd->gen != a->gen) {
		/* Moved elsewhere (its chunk was put back then): what it brought
		 * came twice. */
		if (rd->abandoned && status == 0 && f != NULL && rd->gen == a->gen) {
			f->duplicate += rd->len;
			proto_metrics_add(a->am.m, a->am.duplicate, rd->len);
		}
		rd->abandoned = false;
		rd->busy = false;
		agent_pump(a);
		return;
	}
	struct agent_parcel *p = &f->parcels[rd->parcel];
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];

	p->nlive[rd->chunk]--;
	if (status == 0 && p->state[rd->chunk] != 1) {
		/* Another read of it (endgame) came first: a duplicate. */
		f->duplicate += rd->len;
		proto_metrics_add(a->am.m, a->am.duplicate, rd->len);
		rd->busy = false;
		agent_pump(a);
		return;
	}
	if (status != 0) {
		LOG_DEBUG("node %s: chunk %u/%u of parcel %u<-%u failed: %d", a->node_id, rd->chunk,
			  p->mp->nchunks, p->mp->dst_rank, p->mp->src_rank, status);
		f->read_failures++;
		proto_metrics_add(a->am.m, a->am.failed_read, 1);
		rd->busy = false;
		agent_source_failed(a, read_source(f, rd));
		if (p->state[rd->chunk] == 1 && p->nlive[rd->chunk] == 0) {
			p->state[rd->chunk] = 0;
			agent_swarm_mark(p, rd->chunk, AGENT_MARK_NONE);
		}
		agent_pump(a);
		return;
	}
	p->state[rd->chunk] = 3; /* verifying */
	f->last_byte_ms = proto_wall_ms();
	if (f->first_byte_ms == 0) {
		f->first_byte_ms = f->last_byte_ms;
		agent_startup_log(a, f);
	}
	rd->job = (struct node_vjob){
		.buf = a->bounce + (size_t)rd->slot * a->chunk_size,
		.len = c->size,
		.hash = c->hash,
		.plan = f->plan,
		.parcel = p->wire != NULL ? NULL : p->pp, /* a delta's bytes are kept, not scattered */
		.layout = &a->layout,
		.dst = p->wire != NULL ? p->wire : f->slot->host,
		.by_fd = p->wire == NULL && f->slot->memfd >= 0, /* see node_vjob */
		.dst_fd = p->wire == NULL ? f->slot->memfd : -1, /* an in-place delta: no slot */
		.off = (uint64_t)rd->chunk * f->man.chunk_size,
		.keep = agent_chunk_copied(a, f, p, rd->chunk)
				? p->held + p->head + (size_t)rd->chunk * f->man.chunk_size
				: NULL, /* served from the slot: the scatter is the only copy */
		.placed = p->wire == NULL && __atomic_load_n(&f->slot->streaming, __ATOMIC_RELAXED) ? chunk_placed : NULL,
		.placed_arg = a,
	};
	rd->vslot = f->slot;
	node_verifier_submit(a->ver, &rd->job);
	agent_pump(a);
}

void agent_on_verified(struct node_vjob *job, void *arg)
{
	struct agent_read *rd = proto_container_of(job, struct agent_read, job);
	struct node_agent *a = arg;
	struct agent_fetch *f = a->fetch;

	rd->busy = false;
	if (f == NULL || rd->gen != a->gen) {
		agent_pump(a);
		return;
	}
	struct agent_parcel *p = &f->parcels[rd->parcel];
	const struct proto_chunk *c = &p->mp->chunks[rd->chunk];
	if (!job->ok) {
		/* Never trust the bytes: discard, set the source aside, refetch. */
		proto_log(f->bad_chunks++ == 0 ? PROTO_LOG_WARN : PROTO_LOG_DEBUG, __FILE__, __LINE__,
			  "node %s: v%" PRIu64 " chunk %u of parcel %u<-%u from %s failed its hash; "
			  "discarded (further ones are counted)",
			  a->node_id, f->version, rd->chunk, p->mp->dst_rank, p->mp->src_rank,
			  rd->src_id);
		proto_metrics_add(a->am.m, a->am.failed_hash, 1);
		/* A peer is counted towards its ban, not rested: it answers,
		 * what it sends is the question. */
		if (!rd->src_peer)
			agent_source_failed(a, read_source(f, rd));
		if (rd->src_peer && agent_swarm_bad_peer(a, rd->src_id))
			agent_report(a, f->version, TRK_STATE_FETCHING, NULL, NULL); /* says whom */
		p->state[rd->chunk] = p->nlive[rd->chunk] > 0 ? 1 : 0;
		if (p->state[rd->chunk] == 0)
			agent_swarm_mark(p, rd->chunk, AGENT_MARK_NONE);
		agent_pump(a);
		return;
	}
	if (agent_chunk_copied(a, f, p, rd->chunk) && proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0)
		p->held[p->head + (size_t)rd->chunk * f->man.chunk_size] ^= 0x5a; /* test only */
	agent_swarm_mark(p, rd->chunk, AGENT_MARK_HAVE);
	proto_metrics_add(a->am.m, rd->src_peer ? a->am.fetched_peer : a->am.fetched_trainer, c->size);
	if (rd->gathered)
		proto_metrics_add(a->am.m, a->am.fetched_peer_slot, c->size);
	p->state[rd->chunk] = 2;
	agent_xl_landed(a, rd->parcel, rd->chunk); /* our slot's have-map, for other layouts */
	p->progress_ms = agent_now_ms();
	LOG_DEBUG("node %s: v%" PRIu64 " chunk %u of parcel %u<-%u verified, from %s", a->node_id,
		  f->version, rd->chunk, p->mp->dst_rank, p->mp->src_rank, rd->src_id);
	/* With this read done the parcel may wait on its peers alone: chase
	 * their pages now, not from the next tick (up to 100 ms later). */
	agent_swarm_chase(a);
	p->done++;
	f->bytes_done += c->size;
	if (rd->src_peer)
		f->from_peers += c->size;
	else
		f->from_trainer += c->size;
	if (!rd->src_peer && a->fanout && !p->mine[rd->chunk])
		proto_metrics_add(a->am.m, a->am.unowned_trainer, c->size);
	if (f->bytes_done == f->bytes_total) {
		agent_all_verified(a);
		return;
	}
	if (f->delta && p->done == p->mp->nchunks)
		agent_delta_landed(a, rd->parcel);
	agent_pump(a);
}

static bool take_tokens(struct node_agent *a, uint64_t n);

static int free_read_slot(struct node_agent *a)
{
	for (uint32_t i = 0; i < a->nreads; i++)
		if (!a->reads[i].busy)
			return (int)i;
	return -1;
}

/* Takes n bytes from the rate bucket; when it is short, arms a timer for
 * when it will have them and says no. */
static bool take_tokens(struct node_agent *a, uint64_t n)
{
	uint64_t now = proto_now_ns(), burst = PROTO_MAX(a->chunk_size, a->rate_bps / 10);

	if (a->rate_bps == 0)
		return true;
	a->tokens = PROTO_MIN(burst, a->tokens + (now - a->tokens_ns) * a->rate_bps / 1000000000ull);
	a->tokens_ns = now;
	if (a->tokens >= n) {
		a->tokens -= n;
		return true;
	}
	if (!evtimer_pending(a->rate_ev, NULL))
		agent_arm(a->rate_ev, (n - a->tokens) * 1000 / a->rate_bps + 1);
	return false;
}

static void give_tokens(struct node_agent *a, uint64_t n)
{
	if (a->rate_bps != 0)
		a->tokens += n;
}

void agent_on_rate(evutil_socket_t fd, short what, void *arg)
{
	agent_pump(arg);
}

int agent_read_claim(struct node_agent *a, uint32_t len)
{
	int slot = free_read_slot(a);

	return slot < 0 || !take_tokens(a, len) ? -1 : slot;
}

void agent_read_unclaim(struct node_agent *a, uint32_t len)
{
	give_tokens(a, len);
}

void agent_read_started(struct node_agent *a, uint32_t pi, uint32_t c, uint32_t len)
{
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];

	if (p->asked[c] && p->nlive[c] == 0)
		f->refetched += len;
	p->asked[c] = 1;
	a->inflight++;
	p->state[c] = 1;
	p->nlive[c]++;
	agent_swarm_mark(p, c, AGENT_MARK_BUSY);
}

static void on_gather(struct fab_op *op, int status)
{
	struct agent_gather *g = proto_container_of(op, struct agent_gather, op);
	struct agent_read *rd = g->rd;

	if (status != 0 && rd->gstatus == 0)
		rd->gstatus = status;
	if (--rd->gleft == 0)
		agent_read_landed(rd, rd->gstatus);
}

/* Posts the read rd of a chunk from peer s. One its have-page says it
 * serves from its version slot (lying in at most the page's slot ranges,
 * and in at most GATHER_RANGES) is gathered from the chunk's spans there
 * (our layout is the peer's), in payload order, into rd's bounce slot: a
 * fab_readv per fab_rma_segs ranges; any other is read from after the
 * page. 0: rd lands once (agent_read_landed); else nothing is out. */
static int post_peer(struct node_agent *a, struct agent_read *rd, const struct agent_source *s,
		     const struct agent_parcel *p)
{
	struct agent_fetch *f = a->fetch;
	struct proto_span sp[GATHER_RANGES];
	uint32_t n = s->slot_rk.len != 0 ? agent_chunk_spans(a, f, p, rd->chunk, sp) : UINT32_MAX;
	struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
	uint32_t per = (uint32_t)fab_rma_segs(a->fab), nops = 0;
	size_t at = (size_t)rd->slot * a->chunk_size;

	if (n > s->slot_ranges)
		return fab_read(a->fab, &rd->op, a->bounce_mr, at, rd->len, s->fa, &rk,
				(uint64_t)rd->chunk * f->man.chunk_size, on_read);
	if (n == 0 || n > GATHER_RANGES)
		return -EMSGSIZE; /* more ranges than we gather */
	for (uint32_t i = 0; i < n; i++)
		rd->segs[i] = (struct fab_seg){sp[i].dst_off, sp[i].len};
	rd->gstatus = 0;
	rd->gathered = true;
	rd->gleft = (n + per - 1) / per;
	for (uint32_t i = 0; i < n; i += per, nops++) {
		uint32_t k = PROTO_MIN(per, n - i);
		rd->gops[nops].rd = rd;
		int rc = fab_readv(a->fab, &rd->gops[nops].op, a->bounce_mr, at, s->fa, &s->slot_rk,
				   rd->segs + i, k, on_gather);
		if (rc != 0 && nops == 0)
			return rc;
		if (rc != 0) { /* those out land, failed */
			rd->gstatus = rc;
			rd->gleft = nops; /* callbacks run only from fab_poll */
			return 0;
		}
		for (uint32_t j = 0; j < k; j++)
			at += rd->segs[i + j].len;
	}
	return 0;
}

/* Posts reads until every source's window is full, the node's reads are
 * all out, or nothing can be fetched now. */
void agent_pump(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	if (f == NULL || f->verified || f->parcels == NULL)
		return;
	for (uint32_t pi = 0; pi < f->nparcels && a->inflight < a->max_inflight; pi++) {
		struct agent_parcel *p = &f->parcels[pi];
		while (p->done < p->mp->nchunks && a->inflight < a->max_inflight) {
			uint32_t c = 0;
			bool want;
			struct agent_source *s = agent_swarm_pick(a, pi, &c, &want);
			/* Cross-layout holders before the trainer (agent_xlayout.c). */
			int x = s == NULL || !s->info.peer ? agent_xl_post(a, pi, s != NULL ? c : UINT32_MAX) : 0;
			if (x > 0)
				continue;
			if (x < 0)
				break;
			if (s == NULL) {
				if (want)
					agent_want_sources(a, pi);
				break;
			}
			uint32_t len = p->mp->chunks[c].size;
			int slot = agent_read_claim(a, len);
			if (slot < 0)
				return;
			struct agent_read *rd = &a->reads[slot];
			struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
			*rd = (struct agent_read){.a = a, .parcel = pi, .chunk = c, .slot = (uint32_t)slot,
						  .len = len, .src_idx = (uint32_t)(s - p->srcs),
						  .src_epoch = p->src_epoch, .src_peer = s->info.peer,
						  .started_ms = agent_now_ms(), .busy = true, .in_fabric = true,
						  .gen = a->gen, .hp = s->hp};
			snprintf(rd->src_id, sizeof(rd->src_id), "%s", s->info.id);
			int rc = s->info.peer
					 ? post_peer(a, rd, s, p)
					 : fab_read(a->fab, &rd->op, a->bounce_mr, (size_t)slot * a->chunk_size,
						    len, s->fa, &rk, (uint64_t)c * f->man.chunk_size, on_read);
			if (rc != 0) {
				rd->busy = false;
				rd->in_fabric = false;
				give_tokens(a, len);
				LOG_DEBUG("node %s: read post failed: %d", a->node_id, rc);
				agent_source_failed(a, s);
				continue;
			}
			agent_source_posted(s, len);
			if (f->su.read == 0)
				f->su.read = proto_wall_ms();
			LOG_DEBUG("node %s: post %u/%u from %s", a->node_id, pi, c, s->info.id);
			agent_read_started(a, pi, c, len);
		}
	}
	node_fabloop_kick(a->fl);
}

/*
 * A source is silent when none of its reads completed for its patience
 * (source_patience; a peer that answers its have-page is congested, not
 * silent, see peer_answers). Flows on a busy shared link take turns, so
 * the age of one read says nothing; a source that delivers is never given
 * up on. A silent source's read moves only when another usable source
 * holds its chunk (a publisher, a peer whose have-page lists it, a
 * cross-layout holder): the read is abandoned (its slot stays reserved
 * until it completes or the endpoint closes) and the source rests. A read
 * whose chunk nobody else holds stays where it is, since asking the same
 * source again only queues the same bytes twice: at N = 16 a publisher
 * whose window was sized by an early, higher rate went silent for 3-4 s
 * and its 2-11 reads were put back, to be asked of it again once its rest
 * was over (the trainer's chunks nobody held yet), 7.5 MiB refetched in
 * one run. The tracker is asked for sources meanwhile.
 */
static bool other_source(struct node_agent *a, const struct agent_parcel *p,
			 const struct agent_source *s, uint64_t now)
{
	for (size_t k = 0; k < p->nsrcs; k++)
		if (&p->srcs[k] != s && agent_source_usable(a, a->fetch, &p->srcs[k], now))
			return true;
	return p->wire == NULL && agent_xl_serves(a);
}

/* Another usable source than s holds chunk c of p. */
static bool other_holder(struct node_agent *a, const struct agent_parcel *p,
			 const struct agent_source *s, uint32_t c, uint64_t now)
{
	for (size_t k = 0; k < p->nsrcs; k++) {
		const struct agent_source *o = &p->srcs[k];
		if (o == s || !agent_source_usable(a, a->fetch, o, now))
			continue;
		if (!o->info.peer || (!o->up_refused && proto_have_bit(o->have, c)))
			return true;
	}
	return p->wire == NULL && agent_xl_serves(a);
}

/* Whether rd is a live read of parcel pi from s. */
static bool live_from(const struct node_agent *a, struct agent_fetch *f, const struct agent_read *rd,
		      uint32_t pi, const struct agent_source *s)
{
	return rd->in_fabric && !rd->abandoned && rd->gen == a->gen && rd->parcel == pi &&
	       read_source(f, rd) == s;
}

void agent_check_silent(struct node_agent *a, struct agent_fetch *f, uint32_t pi, uint64_t now)
{
	struct agent_parcel *p = &f->parcels[pi];

	for (size_t k = 0; k < p->nsrcs; k++) {
		struct agent_source *s = &p->srcs[k], *h = agent_pace(s);
		uint32_t live = 0, moved = 0;
		if (peer_congested(s, now) && !h->congested_logged) {
			h->congested_logged = true;
			f->congested++;
			LOG_DEBUG("node %s: parcel %u: %s delivered nothing for %" PRIu64 " ms, but "
				  "answered a have-page asked %" PRIu64 " ms ago: congested, its %u "
				  "reads stay",
				  a->node_id, pi, s->info.id, now - h->progress_ms,
				  now - h->answered_ms, h->inflight_reads);
		}
		if (!agent_source_silent(s, now))
			continue;
		for (uint32_t i = 0; i < a->nreads; i++)
			live += live_from(a, f, &a->reads[i], pi, s);
		if (live == 0) /* only reads already moved elsewhere */
			continue;
		bool other = other_source(a, p, s, now);
		for (uint32_t i = 0; i < a->nreads && other; i++) {
			struct agent_read *rd = &a->reads[i];
			if (!live_from(a, f, rd, pi, s) || !other_holder(a, p, s, rd->chunk, now))
				continue;
			rd->abandoned = true;
			moved++;
			p->nlive[rd->chunk]--;
			if (p->state[rd->chunk] == 1 && p->nlive[rd->chunk] == 0) {
				p->state[rd->chunk] = 0;
				agent_swarm_mark(p, rd->chunk, AGENT_MARK_NONE);
			}
		}
		if (moved == 0) {
			if (!s->silent_logged && !other)
				LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
					 " ms; no other source, waiting for it",
					 a->node_id, pi, s->info.id, now - h->progress_ms);
			else if (!s->silent_logged)
				LOG_WARN("node %s: parcel %u: %s delivered nothing for %" PRIu64
					 " ms; no other source holds the chunks of its %u reads, "
					 "waiting for it",
					 a->node_id, pi, s->info.id, now - h->progress_ms, live);
			s->silent_logged = true;
			agent_want_sources(a, pi);
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
			 a->node_id, pi, s->info.id, now - h->progress_ms, why, moved, live - moved);
		f->stalls += moved;
		proto_metrics_add(a->am.m, a->am.stalled, moved);
		s->bad_until_ms = now + BAD_SOURCE_MS;
	}
}

/*
 * Chunks no source can give: every source of their parcel is resting,
 * silent, banned or gone (a publisher that left, a tracker that lists
 * none), and none of their reads is out. Said once when it has lasted
 * NO_SOURCE_MS, with counts, and once when a source is back (at the same
 * level, so that the default log pairs them); the tracker is asked for
 * sources meanwhile (agent_pump).
 */
static void check_sourceless(struct node_agent *a, struct agent_fetch *f, uint64_t now)
{
	uint32_t chunks = 0, parcels = 0, listed = 0, resting = 0;

	if (!a->nosrc_said && a->nosrc_gen != a->gen)
		a->nosrc_ms = 0; /* an unsaid wait of an earlier fetch: a new one starts afresh */
	a->nosrc_gen = a->gen;
	for (uint32_t pi = 0; pi < f->nparcels; pi++) {
		const struct agent_parcel *p = &f->parcels[pi];
		uint32_t todo = 0, live = 0;
		bool usable = p->wire == NULL && agent_xl_serves(a);
		for (size_t k = 0; k < p->nsrcs && !usable; k++)
			usable = agent_source_usable(a, f, &p->srcs[k], now);
		for (uint32_t c = 0; c < p->mp->nchunks && !usable; c++) {
			todo += p->state[c] == 0;
			live += p->state[c] == 1 || p->state[c] == 3;
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
		if (a->nosrc_said)
			LOG_WARN("node %s: v%" PRIu64 ": a source is back after %" PRIu64 " ms without one",
				 a->node_id, f->version, now - a->nosrc_ms);
		a->nosrc_ms = 0;
		a->nosrc_said = false;
		return;
	}
	if (a->nosrc_ms == 0)
		a->nosrc_ms = now;
	if (!a->nosrc_said && now - a->nosrc_ms >= NO_SOURCE_MS) {
		LOG_WARN("node %s: v%" PRIu64 ": no source for %u chunks of %u parcels for %" PRIu64
			 " ms (%u sources known for them, %u resting after a failure); waiting for "
			 "the tracker to list one",
			 a->node_id, f->version, chunks, parcels, now - a->nosrc_ms, listed, resting);
		a->nosrc_said = true;
	}
}

/*
 * A loop that ran late judges nothing. The tick comes every 100 ms; on a
 * machine at load 35 (16 nodes on 2 cores) a node's loop did not run for
 * 2.7 s, and its first tick after found every peer it read from silent,
 * their completions and have-pages still waiting in its own queues: it
 * moved 6 reads of live peers at once. So a tick that comes PEER_STALL_MS
 * / 2 or more after the last judges nothing and waits one tick, for the
 * completions to be taken first; one tick only (silence_ms 0 after it), so
 * that a loop late on every tick still judges every other one.
 */
bool agent_silence_due(struct node_agent *a, uint64_t now)
{
	bool late = a->silence_ms != 0 && now > a->silence_ms &&
		    now - a->silence_ms >= PEER_STALL_MS / 2;

	a->silence_ms = late ? 0 : now;
	return !late;
}

void agent_on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	struct agent_fetch *f;
	uint64_t now = agent_now_ms();

	agent_swarm_tick(a);
	agent_xl_tick(a); /* may refuse the fetch (a whole one with no holder left) */
	f = a->fetch;
	if (f == NULL || f->parcels == NULL)
		return;
	if (!f->verified && agent_silence_due(a, now)) {
		for (uint32_t pi = 0; pi < f->nparcels; pi++)
			agent_check_silent(a, f, pi, now);
		check_sourceless(a, f, now);
	}
	if (f->verified && !f->reported_verified) {
		f->reported_verified = true;
		agent_report(a, f->version, TRK_STATE_VERIFIED, NULL, agent_on_verified_report);
	} else if (!f->verified && now - a->last_report_ms >= REPORT_MS) {
		a->last_report_ms = now;
		agent_report(a, f->version, TRK_STATE_FETCHING, NULL, NULL);
	}
	agent_pump(a);
}
