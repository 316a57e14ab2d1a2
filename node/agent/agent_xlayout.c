/* Cross-layout sources: chunks assembled from the ranks of replicas of
 * other layouts (complete, or partial while they fetch), and our own slot
 * offered to their readers. */
#include "node/agent/agent_internal.h"

/*
 * Model. A node that holds a version complete and active offers, with the
 * parcels it keeps serving, its whole slot (its rank's memory in its own
 * layout, registered for remote read only) as the offer's "slot". The
 * tracker lists, for a version, every replica of another layout whose
 * ranks are all alive and all offer their slot for it (GET /holders: each
 * holder's layout digest and its ranks' fabric addresses and slot keys).
 *
 * A fetching node asks for holders every XL_ASK_MS while it fetches a
 * full version (a delta's parcels are encoded, so their chunks cannot be
 * assembled from anyone's memory: delta fetches never use holders). For a
 * holder layout it has not seen it reads the layout from GET /layouts,
 * plans holder -> its own layout and keeps, for its rank, the map of where
 * its bytes sit in the holder's ranks (proto/xmap.h). A chunk of one of its
 * parcels (payload [c*chunk, c*chunk+size)) then becomes pieces (holder
 * rank, offset, length, place in the chunk), grouped into reads (windows)
 * per holder rank, each gathering up to four of that rank's ranges
 * (fab_readv), so that only the chunk's own bytes cross the link; the
 * windows land in a staging slot (at most XL_POST_MAX reads of one chunk
 * in flight), the pieces are copied into
 * the chunk's bounce slot, and the chunk goes through the same path as
 * any other read: hashed against our own layout's signed chunk hash,
 * scattered into our slot, served to our swarm. Nothing from a holder
 * counts before that hash verifies.
 *
 * Choice. In agent_pump, a chunk the swarm would ask a publisher for (or
 * any chunk, when the swarm has nothing to ask) goes to a usable holder
 * with room instead: chunks same-layout peers hold still come from them
 * first, the trainer only when no holder can serve (last resort). Holders
 * are taken round-robin, the first whose reads of the chunk carry at most
 * 1.5 times its bytes (else the one with the fewest: past XL_WINS_MAX
 * reads a chunk, the gaps between ranges are read along); each is paced
 * like a source (its measured rate
 * times TESSERA_FETCH_TARGET_MS, at least two chunks) and the node keeps
 * at most XL_INFLIGHT such chunks in flight.
 *
 * Partial holders. A node fetching a full version into a slot of its own
 * offers that slot at once, partial, with a have-map (proto/xmap.h: a
 * byte per 64 KiB block, set once every byte of the block is verified and
 * scattered; a block's bytes may come from several chunks, so each block
 * counts its bytes). Readers poll each partial rank's map every
 * TESSERA_HAVE_POLL_MS (one small one-sided read) and read a chunk from a
 * partial holder only when every window it would read (gaps included)
 * lies in set blocks: nothing unverified is ever read. A map only grows
 * while its registration lasts; the node closes the registration before
 * the slot is reused (a failed or dropped fetch), and at activation the
 * same registration becomes the served slot (offered complete), so its
 * readers go on. Delta fetches and in-place writes never serve partial.
 * A holder that lies in its map sends chunks that fail our hashes: banned
 * like any bad holder (below).
 *
 * Trainer bytes across layouts. Among the layouts fetching one version,
 * one leads (leads(): more ranks, then the lower digest). Its nodes take
 * from the trainer what their swarm does not hold, as alone. A node of any
 * other layout takes a chunk from the trainer only when no replica of a
 * leading layout will have it soon: while one works toward the version
 * (/holders "fetching", or a partial holder whose map grew within
 * TESSERA_XL_PATIENCE_MS), the node reads what such holders have verified
 * and waits for the rest; once none progressed for the patience (or they
 * are banned or gone) the trainer is the last resort again. The trainer
 * so sends each byte about once per version for all layouts together.
 *
 * Bad holders. A chunk that fails its hash counts against the holder rank
 * that sent all of it, or, assembled from several ranks, against the
 * replica (its name): we cannot tell which rank lied. Two bad chunks ban
 * it for the version (agent_swarm_bad_peer), and a holder with a banned
 * name or rank is not used again for it; the chunk is fetched again from
 * elsewhere. A failed read rests the holder for BAD_SOURCE_MS; one that
 * delivers nothing for its patience has its reads moved.
 */

#define XL_HOLDERS_MAX 16
#define XL_LAYOUTS_MAX 8
#define XL_RANKS_MAX 64
#define XL_INFLIGHT 4               /* cross-layout chunk reads in flight per node */
#define XL_STAGES (2 * XL_INFLIGHT) /* staging slots (a moved read keeps its own) */
#define XL_POST_MAX 128             /* reads of one chunk in flight at once */
#define XL_PIECES_MAX 65536         /* pieces of one chunk */
/* Reads of one chunk at most. A read gathers up to four ranges of one
 * holder rank (fab_readv), so a chunk costs only its own bytes: a TP4
 * rank's 1 MiB chunk of row-parallel rows from a TP2 holder is 4096
 * pieces of 256 or 768 bytes, about 1024 reads. Past this many the gaps
 * between ranges are read along (proto_xmap_windows). With one range per
 * read and 64 reads a chunk, the gaps cost tp4 from tp2 1.26 x its bytes. */
#define XL_WINS_MAX 1024
#define XL_ASK_MS 1000              /* holders asked again while fetching */
#define XL_HV_MAX (64u << 10)       /* have-map bytes of one partial holder (all ranks) */
#define XL_SCAN 64                  /* chunks tried against partial holders per call */
#define XL_FETCHING_MAX 16          /* replicas working toward the version, remembered */
#define XL_ALONE_MS 3000            /* a whole fetch of a delta waits this long with no holder */

struct xl_layout {
	uint8_t digest[PROTO_HASH_BYTES];
	int state; /* 0: to read from /layouts, 1: ready, -1: unusable */
	bool asked; /* a /layouts request went out since it was added */
	struct proto_layout l;
	struct proto_xmap map;
};

struct xl_holder {
	bool used, listed;
	uint32_t epoch; /* bumped whenever the entry is reused */
	char replica[TRK_ID_MAX];
	uint32_t lay, nranks;
	struct agent_source *ranks; /* info: the rank's slot offer; fabric handle */
	struct agent_source pace;   /* the holder's rate, bytes in flight, progress */
	uint64_t bad_until_ms;
	/* A partial holder (a rank's slot offered while it fetches): the
	 * ranks' have-maps, read back to back into the entry's part of
	 * x->hv (rank r's at hv_off[r]), polled every TESSERA_HAVE_POLL_MS. */
	bool partial, hv_fits, hv_ready;
	uint64_t *hv_off;
	uint32_t hv_live;  /* have-map reads in flight (kept across reuse) */
	uint32_t hv_bad;   /* reads of this poll that failed */
	uint64_t hv_ms;    /* the last poll posted */
	uint64_t hv_set;   /* blocks set at the last poll */
	uint64_t grew_ms;  /* hv_set grew (or the holder was listed) */
};

/* A replica of another layout working toward the version that offers no
 * slot yet (/holders "fetching"). */
struct xl_fetching {
	char replica[TRK_ID_MAX];
	uint8_t digest[PROTO_HASH_BYTES];
	uint32_t nranks;
	uint64_t since_ms;
	bool listed;
};

struct xl_hvop {
	struct fab_op op;
	struct node_agent *a;
	uint32_t holder, epoch;
};

struct xl_read;

struct xl_op {
	struct fab_op op;
	struct xl_read *xr;
	uint32_t win;
	struct fab_seg segs[PROTO_XWIN_SEGS]; /* the window's ranges, while it is read */
};

struct xl_read {
	struct node_agent *a;
	bool busy;
	struct agent_read *rd;
	uint32_t holder, epoch, stage;
	struct proto_xpiece *pcs;
	size_t npcs;
	struct proto_xwin *wins;
	uint32_t nwins, next, live;
	int status;
	struct xl_op ops[XL_POST_MAX];
};

struct agent_xl {
	struct xl_layout lays[XL_LAYOUTS_MAX];
	uint32_t nlays;
	bool lays_pending;
	uint64_t version, gen; /* the fetch the holders were listed for */
	struct xl_holder hs[XL_HOLDERS_MAX];
	uint32_t rr;
	bool pending, answered; /* answered: the first /holders for this fetch came */
	uint64_t asked_ms;
	uint64_t alone_ms; /* a whole fetch of a delta found no holder left since (0: has one) */
	uint8_t *stage;
	size_t stage_len, stage_slot;
	struct fab_mr *stage_mr;
	struct xl_read reads[XL_STAGES];
	struct proto_xpiece *scratch;
	struct proto_xwin *wscratch;
	size_t npieces; /* in scratch */
	/* Partial holders' have-maps land here (XL_HV_MAX per holder entry). */
	uint8_t *hv;
	struct fab_mr *hv_mr;
	struct xl_hvop hvops[XL_HOLDERS_MAX][XL_RANKS_MAX];
	struct xl_fetching fetching[XL_FETCHING_MAX];
	/* Chunks no holder could give as of cov_gen (per parcel, by chunk). */
	uint32_t **uncov;
	uint32_t nuncov;
	uint32_t cov_gen;
	/* Our slot, served to readers of other layouts. */
	struct fab_mr *slot_mr;
	const struct node_slot *slot;
	bool slot_in_offer; /* the last offer built for it carried it */
	struct trk_offer slot_offer;
	/* Its have-map, when it was first served partial (all set now). */
	uint8_t *slot_have;
	size_t slot_have_cap;
	struct fab_mr *slot_have_mr;
	/* The fetch's slot, served while it fills (partial): its registration,
	 * its have-map (registered for remote read) and per-block byte counts. */
	const struct agent_fetch *part_f;
	struct fab_mr *part_mr, *part_have_mr;
	uint8_t *part_have;
	size_t part_have_cap;
	uint32_t *part_cnt;
	uint64_t part_nblocks;
	bool part_in_offer;
	struct trk_offer part_offer;
	/* Test only (TESSERA_TEST_CORRUPT_SERVE): a damaged copy served instead. */
	uint8_t *liar;
	size_t liar_len;
};

static struct agent_xl *xl_get(struct node_agent *a)
{
	if (a->xl == NULL)
		a->xl = calloc(1, sizeof(*a->xl));
	return a->xl;
}

static bool xl_refresh(struct node_agent *a, bool early);
static void ask_holders(struct node_agent *a, uint64_t now);

/* ---- our slot, served ------------------------------------------------------ */

static void have_free(struct node_agent *a, uint8_t **have, size_t *cap, struct fab_mr **mr)
{
	if (*mr != NULL && a->fab != NULL) /* else fab_close closed it */
		fab_mr_close(*mr);
	*mr = NULL;
	node_serve_unmap(*have, *cap);
	*have = NULL;
	*cap = 0;
}

void agent_xl_withdraw(struct node_agent *a)
{
	struct agent_xl *x = a->xl;

	if (x == NULL)
		return;
	if (x->slot_mr != NULL) /* readers of the slot now fail and move on */
		fab_mr_close(x->slot_mr);
	x->slot_mr = NULL;
	x->slot = NULL;
	have_free(a, &x->slot_have, &x->slot_have_cap, &x->slot_have_mr);
	node_serve_unmap(x->liar, x->liar_len);
	x->liar = NULL;
}

void agent_xl_unserve(struct node_agent *a, const struct agent_fetch *f)
{
	struct agent_xl *x = a->xl;

	if (x == NULL || f == NULL || x->part_f != f)
		return;
	/* Before its slot goes back to the store: readers fail and move on. */
	if (x->part_mr != NULL && a->fab != NULL)
		fab_mr_close(x->part_mr);
	x->part_mr = NULL;
	have_free(a, &x->part_have, &x->part_have_cap, &x->part_have_mr);
	free(x->part_cnt);
	x->part_cnt = NULL;
	x->part_f = NULL;
}

/* Bytes [at, at+n) of our slot are verified and in place. */
static void part_span(void *arg, uint64_t at, uint64_t n)
{
	struct node_agent *a = arg;
	struct agent_xl *x = a->xl;

	proto_xmap_have_add(x->part_cnt, x->part_have, a->layout.ranks[a->o.rank].nbytes, at, n);
}

static void part_mark(struct node_agent *a, const struct agent_fetch *f, uint32_t pi, uint32_t c)
{
	const struct agent_parcel *p = &f->parcels[pi];
	uint64_t off = (uint64_t)c * f->man.chunk_size;

	proto_parcel_dst_spans(f->plan, p->pp, &a->layout, off, p->mp->chunks[c].size, part_span, a);
}

void agent_xl_landed(struct node_agent *a, uint32_t pi, uint32_t c)
{
	struct agent_xl *x = a->xl;

	if (x != NULL && x->part_f == a->fetch && x->part_cnt != NULL &&
	    proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0)
		part_mark(a, a->fetch, pi, c);
}

/* The fetch's slot is offered while it fills (a full fetch into a slot of
 * its own, its parcels served): registered for remote read with a
 * have-map, marked with what is verified so far. Failure only logs. */
static void part_serve(struct node_agent *a, struct agent_xl *x)
{
	struct agent_fetch *f = a->fetch;
	size_t len = a->layout.ranks[a->o.rank].nbytes;

	if (f == NULL || x->part_f == f || !f->served || f->delta || f->slot == NULL ||
	    f->slot->host == NULL || f->slot == a->active || f->parcels == NULL || len == 0)
		return;
	agent_xl_unserve(a, x->part_f);
	x->part_nblocks = proto_xmap_have_len(len);
	x->part_have_cap = (x->part_nblocks + 4095) / 4096 * 4096;
	x->part_have = node_serve_map(x->part_have_cap);
	x->part_cnt = calloc(x->part_nblocks, sizeof(*x->part_cnt));
	x->part_f = f; /* unserve frees what was made if the rest fails */
	if (x->part_have == NULL || x->part_cnt == NULL ||
	    node_serve_reg(a->fab, x->part_have, x->part_have_cap, false, &x->part_have_mr) != 0 ||
	    node_serve_reg(a->fab, f->slot->host, len, false, &x->part_mr) != 0) {
		LOG_WARN("node %s: v%" PRIu64 ": cannot serve the slot while fetching; readers of "
			 "other layouts wait until it is complete",
			 a->node_id, f->version);
		agent_xl_unserve(a, f);
		x->part_f = f; /* not tried again for this fetch */
		return;
	}
	if (proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0) {
		/* Test only: a have-map that claims every block from the start. */
		memset(x->part_have, 1, x->part_nblocks);
	} else {
		/* Bytes no tensor holds (alignment, tail) come with no chunk. */
		if (proto_xmap_rank_gaps(&a->layout.ranks[a->o.rank], part_span, a) != 0)
			LOG_DEBUG("node %s: slot gaps not counted (out of memory): blocks with "
				  "alignment gaps are served once complete",
				  a->node_id);
		for (uint32_t pi = 0; pi < f->nparcels; pi++)
			for (uint32_t c = 0; c < f->parcels[pi].mp->nchunks; c++)
				if (f->parcels[pi].state[c] == 2)
					part_mark(a, f, pi, c);
	}
	x->part_in_offer = false;
	f->so.offered = false; /* offered again, with the slot */
}

void agent_xl_serve(struct node_agent *a, struct node_slot *old)
{
	struct agent_xl *x;

	if (!a->fanout || (x = xl_get(a)) == NULL)
		return;
	size_t len = a->layout.ranks[a->o.rank].nbytes;
	uint8_t *served;

	agent_xl_withdraw(a);
	if (x->part_f != NULL && x->part_f == a->kept && x->part_mr != NULL &&
	    a->active == a->kept->slot && proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) == 0) {
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
		x->slot = a->active;
		x->slot_in_offer = false;
		a->kept->so.offered = false;
		return;
	}
	agent_xl_unserve(a, x->part_f);
	if (a->active == NULL || a->active->host == NULL || a->kept == NULL)
		return;
	served = a->active->host;
	if (proto_param(PROTO_PARAM_TEST_CORRUPT_SERVE) != 0 && len > 0 &&
	    (x->liar = node_serve_map(len)) != NULL) {
		/* Test only: serve a copy with one byte in every 4 KiB flipped. */
		x->liar_len = len;
		memcpy(x->liar, served, len);
		for (size_t i = 0; i < len; i += 4096)
			x->liar[i] ^= 0x5a;
		served = x->liar;
	}
	if (node_serve_reg(a->fab, served, len, false, &x->slot_mr) != 0) {
		LOG_WARN("node %s: v%" PRIu64 ": cannot register the slot for readers of other "
			 "layouts; serving only our parcels",
			 a->node_id, a->active->version);
		return;
	}
	x->slot = a->active;
	x->slot_in_offer = false;
	a->kept->so.offered = false; /* offered again, with the slot */
}

const struct trk_offer *agent_xl_offer_slot(struct node_agent *a, const struct agent_fetch *f)
{
	struct agent_xl *x = a->xl;
	struct fab_rkey rk;

	if (x != NULL && x->part_mr != NULL && f == x->part_f && f == a->fetch) {
		fab_mr_rkey(x->part_mr, &rk);
		x->part_offer = (struct trk_offer){.dst_rank = a->o.rank, .addr = rk.addr,
						   .key = rk.key, .len = rk.len, .partial = true};
		fab_mr_rkey(x->part_have_mr, &rk);
		x->part_offer.have_addr = rk.addr;
		x->part_offer.have_key = rk.key;
		x->part_offer.len = a->layout.ranks[a->o.rank].nbytes;
		memcpy(x->part_offer.layout, a->layout.digest, PROTO_HASH_BYTES);
		x->part_in_offer = true;
		return &x->part_offer;
	}
	if (x == NULL || x->slot_mr == NULL || f != a->kept || x->slot->version != f->version)
		return NULL;
	fab_mr_rkey(x->slot_mr, &rk);
	x->slot_offer = (struct trk_offer){.dst_rank = a->o.rank, .addr = rk.addr, .key = rk.key,
					   .len = a->layout.ranks[a->o.rank].nbytes};
	memcpy(x->slot_offer.layout, a->layout.digest, PROTO_HASH_BYTES);
	x->slot_in_offer = true;
	return &x->slot_offer;
}

/* ---- holders ------------------------------------------------------------------ */

static void holder_drop(struct node_agent *a, struct xl_holder *h)
{
	for (uint32_t r = 0; r < h->nranks; r++) {
		if (h->ranks[r].fa_valid && a->fab != NULL)
			fab_av_remove(a->fab, h->ranks[r].fa);
		free(h->ranks[r].info.fabric_addr);
	}
	free(h->ranks);
	free(h->hv_off);
	uint32_t epoch = h->epoch + 1, live = h->hv_live;
	/* Have-map reads still in flight land in the entry's part of x->hv:
	 * it is not reused before they are back (take_holder). */
	*h = (struct xl_holder){.epoch = epoch, .hv_live = live};
}

static bool holder_banned(const struct agent_fetch *f, const struct xl_holder *h)
{
	if (agent_swarm_banned(f, h->replica))
		return true;
	for (uint32_t r = 0; r < h->nranks; r++)
		if (agent_swarm_banned(f, h->ranks[r].info.id))
			return true;
	return false;
}

/* A holder delivering nothing this long with reads in flight is silent:
 * like a publisher (a chunk needs all its reads, which share our link with
 * the other holders'), three times TESSERA_STALL_MS before it delivered
 * anything, then four times what its bytes in flight take at its rate. */
static bool holder_silent(const struct xl_holder *h, uint64_t now)
{
	uint64_t stall = proto_param(PROTO_PARAM_STALL_MS), pat;

	if (h->pace.inflight_reads == 0)
		return false;
	pat = h->pace.rate == 0 ? 3 * stall
				: PROTO_MAX(stall, 4 * h->pace.inflight_bytes * 1000 / h->pace.rate);
	return now - h->pace.progress_ms >= pat;
}

static bool holder_usable(struct node_agent *a, const struct xl_holder *h, uint64_t now)
{
	const struct agent_xl *x = a->xl;

	if (!h->used || !h->listed || x->lays[h->lay].state != 1 || h->bad_until_ms > now ||
	    holder_silent(h, now) || holder_banned(a->fetch, h) ||
	    (h->partial && (!h->hv_fits || !h->hv_ready)))
		return false;
	for (uint32_t r = 0; r < h->nranks; r++)
		if (h->ranks[r].bad_until_ms > now)
			return false;
	return true;
}

static bool holder_room(struct node_agent *a, const struct xl_holder *h, uint64_t len)
{
	return h->pace.inflight_reads == 0 ||
	       h->pace.inflight_bytes + len <= agent_source_window(a, &h->pace);
}

static void on_layouts(const struct trk_answer *ans, void *arg);

/* The layout entry for digest, added (to be read) if new; NULL when full. */
static struct xl_layout *layout_for(struct node_agent *a, const uint8_t *digest)
{
	struct agent_xl *x = a->xl;

	for (uint32_t i = 0; i < x->nlays; i++)
		if (memcmp(x->lays[i].digest, digest, PROTO_HASH_BYTES) == 0)
			return &x->lays[i];
	if (x->nlays == XL_LAYOUTS_MAX)
		return NULL;
	struct xl_layout *l = &x->lays[x->nlays++];
	memcpy(l->digest, digest, PROTO_HASH_BYTES);
	return l;
}

static void poll_have(struct node_agent *a, struct xl_holder *h, uint64_t now);

/* Takes one holder of a /holders answer (hostile: every field checked). */
static void take_holder(struct node_agent *a, json_t *e, size_t i)
{
	struct agent_xl *x = a->xl;
	const char *name = json_string_value(json_object_get(e, "replica"));
	const char *lhex = json_string_value(json_object_get(e, "layout"));
	json_int_t nranks = json_integer_value(json_object_get(e, "nranks"));
	uint8_t digest[PROTO_HASH_BYTES];
	struct trk_source *s = NULL;
	struct proto_err err;
	size_t n = 0;

	if (name == NULL || name[0] == 0 || strlen(name) >= TRK_ID_MAX || lhex == NULL ||
	    proto_parse_hex(lhex, digest, sizeof(digest)) != 0 || nranks < 1 ||
	    nranks > XL_RANKS_MAX || trk_sources_parse(e, &s, &n, &err) != 0 ||
	    n != (size_t)nranks) {
		LOG_DEBUG("node %s: holders[%zu]: malformed; skipped", a->node_id, i);
		trk_sources_free(s, n);
		return;
	}
	struct xl_layout *l = layout_for(a, digest);
	if (l == NULL || l->state < 0) {
		trk_sources_free(s, n);
		return;
	}
	/* The same holder as before (same replica, same keys): keep it. */
	struct xl_holder *h = NULL, *free_h = NULL;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		struct xl_holder *o = &x->hs[k];
		if (!o->used) {
			if (o->hv_live == 0)
				free_h = free_h != NULL ? free_h : o;
			continue;
		}
		if (strcmp(o->replica, name) != 0)
			continue;
		bool same = o->nranks == n && o->lay == (uint32_t)(l - x->lays);
		for (uint32_t r = 0; same && r < n; r++)
			same = o->ranks[r].info.key == s[r].key && o->ranks[r].info.addr == s[r].addr &&
			       o->ranks[r].info.fabric_addr_len == s[r].fabric_addr_len &&
			       memcmp(o->ranks[r].info.fabric_addr, s[r].fabric_addr, s[r].fabric_addr_len) == 0;
		if (same) {
			h = o;
			break;
		}
		holder_drop(a, o); /* it offers anew: start afresh */
		if (o->hv_live == 0)
			free_h = free_h != NULL ? free_h : o;
	}
	if (h != NULL || free_h == NULL) {
		if (h != NULL) {
			/* The same memory: a partial rank may have become complete. */
			bool partial = false;
			for (uint32_t r = 0; r < h->nranks; r++) {
				h->ranks[r].info.partial = s[r].partial;
				h->ranks[r].info.have_addr = s[r].have_addr;
				h->ranks[r].info.have_key = s[r].have_key;
				partial |= s[r].partial;
			}
			h->partial = partial;
			if (partial && h->hv_off == NULL)
				h->hv_fits = false; /* complete before: no room laid out for maps */
			h->listed = true;
		}
		trk_sources_free(s, n);
		return;
	}
	h = free_h;
	if ((h->ranks = calloc(n, sizeof(*h->ranks))) == NULL) {
		trk_sources_free(s, n);
		return;
	}
	h->used = h->listed = true;
	snprintf(h->replica, sizeof(h->replica), "%s", name);
	h->lay = (uint32_t)(l - x->lays);
	h->nranks = (uint32_t)n;
	h->pace = (struct agent_source){.info.peer = true};
	for (size_t r = 0; r < n; r++)
		h->ranks[r].info = s[r]; /* takes the fabric address */
	free(s);
	h->grew_ms = agent_now_ms();
	h->hv_fits = true;
	for (uint32_t r = 0; r < h->nranks; r++)
		h->partial |= h->ranks[r].info.partial;
	if (h->partial && (h->hv_off = calloc(h->nranks + 1, sizeof(*h->hv_off))) != NULL) {
		for (uint32_t r = 0; r < h->nranks; r++)
			h->hv_off[r + 1] = h->hv_off[r] + proto_xmap_have_len(h->ranks[r].info.len);
		h->hv_fits = h->hv_off[h->nranks] <= XL_HV_MAX;
	} else if (h->partial) {
		h->hv_fits = false;
	}
	x->cov_gen++;
	poll_have(a, h, agent_now_ms());
}

/* Takes /holders "fetching" (hostile: malformed entries are skipped):
 * replicas of other layouts working toward the version that offer no slot
 * yet, each remembered with when it was first listed. */
static void take_fetching(struct node_agent *a, json_t *list)
{
	struct agent_xl *x = a->xl;
	uint64_t now = agent_now_ms();
	json_t *e;
	size_t i;

	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
		x->fetching[k].listed = false;
	json_array_foreach(list, i, e) {
		const char *name = json_string_value(json_object_get(e, "replica"));
		const char *lhex = json_string_value(json_object_get(e, "layout"));
		json_int_t nranks = json_integer_value(json_object_get(e, "nranks"));
		uint8_t digest[PROTO_HASH_BYTES];
		struct xl_fetching *q = NULL;
		if (name == NULL || name[0] == 0 || strlen(name) >= TRK_ID_MAX || lhex == NULL ||
		    proto_parse_hex(lhex, digest, sizeof(digest)) != 0 || nranks < 1 ||
		    nranks > XL_RANKS_MAX)
			continue;
		for (uint32_t k = 0; k < XL_FETCHING_MAX && q == NULL; k++)
			if (x->fetching[k].since_ms != 0 && strcmp(x->fetching[k].replica, name) == 0 &&
			    memcmp(x->fetching[k].digest, digest, PROTO_HASH_BYTES) == 0)
				q = &x->fetching[k];
		for (uint32_t k = 0; k < XL_FETCHING_MAX && q == NULL; k++)
			if (x->fetching[k].since_ms == 0) {
				q = &x->fetching[k];
				*q = (struct xl_fetching){.since_ms = now, .nranks = (uint32_t)nranks};
				snprintf(q->replica, sizeof(q->replica), "%s", name);
				memcpy(q->digest, digest, PROTO_HASH_BYTES);
			}
		if (q != NULL)
			q->listed = true;
	}
	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
		if (!x->fetching[k].listed)
			x->fetching[k].since_ms = 0; /* it offers now, or stopped */
}

struct xl_req {
	struct node_agent *a;
	uint64_t gen;
};

static void on_holders(const struct trk_answer *ans, void *arg)
{
	struct xl_req *req = arg;
	struct node_agent *a = req->a;
	struct agent_xl *x = a->xl;
	bool stale = req->gen != a->gen || a->fetch == NULL;
	json_t *list, *e;
	size_t i;

	free(req);
	x->pending = false;
	x->answered |= !stale;
	if (stale || ans->status != 200 || !json_is_array(list = json_object_get(ans->json, "holders"))) {
		if (!stale && ans->status != 200)
			LOG_DEBUG("node %s: holders: %s", a->node_id, ans->error);
		return;
	}
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		x->hs[k].listed = false;
	json_array_foreach(list, i, e) {
		if (i == XL_HOLDERS_MAX)
			break;
		take_holder(a, e, i);
	}
	take_fetching(a, json_object_get(ans->json, "fetching"));
	bool want = false;
	for (uint32_t k = 0; k < x->nlays; k++)
		want |= x->lays[k].state == 0;
	if (want && !x->lays_pending && trk_client_layouts(a->trk, on_layouts, a) == 0) {
		x->lays_pending = true;
		for (uint32_t k = 0; k < x->nlays; k++)
			x->lays[k].asked |= x->lays[k].state == 0;
	}
	agent_pump(a);
}

/* Makes layout l ready: parsed from its explicit form, its digest checked,
 * planned into ours, our rank's map built. */
static void layout_ready(struct node_agent *a, struct xl_layout *l, json_t *form)
{
	struct proto_plan hp;
	struct proto_err err;
	char hex[17];

	sodium_bin2hex(hex, sizeof(hex), l->digest, 8);
	if (proto_layout_from_json(&a->model, form, "holder layout", &l->l, &err) != 0) {
		LOG_WARN("node %s: holder layout %s: %s; not used", a->node_id, hex, err.msg);
		l->state = -1;
		return;
	}
	if (memcmp(l->l.digest, l->digest, PROTO_HASH_BYTES) != 0 ||
	    proto_layout_check_complete(&a->model, &l->l, &err) != 0 ||
	    proto_plan_build(&a->model, &l->l, &a->layout, &hp, &err) != 0) {
		if (memcmp(l->l.digest, l->digest, PROTO_HASH_BYTES) != 0)
			snprintf(err.msg, sizeof(err.msg), "its form has another digest");
		LOG_WARN("node %s: holder layout %s: %s; not used", a->node_id, hex, err.msg);
		proto_layout_fini(&l->l);
		l->state = -1;
		return;
	}
	int rc = proto_xmap_build(&hp, &l->l, &a->layout, a->o.rank, &l->map, &err);
	proto_plan_fini(&hp);
	if (rc != 0) {
		LOG_WARN("node %s: holder layout %s: %s; not used", a->node_id, hex, err.msg);
		proto_layout_fini(&l->l);
		l->state = -1;
		return;
	}
	l->state = 1;
	LOG_DEBUG("node %s: holder layout %s: %" PRIu64 " spans for rank %u", a->node_id, hex,
		  l->map.nspans, a->o.rank);
}

static void on_layouts(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;
	struct agent_xl *x = a->xl;
	json_t *list, *e;
	size_t i;

	x->lays_pending = false;
	list = ans->status == 200 ? json_object_get(ans->json, "layouts") : NULL;
	json_array_foreach(list, i, e) {
		const char *hex = json_string_value(json_object_get(e, "digest"));
		uint8_t d[PROTO_HASH_BYTES];
		if (hex == NULL || proto_parse_hex(hex, d, sizeof(d)) != 0)
			continue;
		for (uint32_t k = 0; k < x->nlays; k++)
			if (x->lays[k].state == 0 && memcmp(x->lays[k].digest, d, PROTO_HASH_BYTES) == 0)
				layout_ready(a, &x->lays[k], json_object_get(e, "layout"));
	}
	/* Asked and not answered: not waited for again (never used). */
	for (uint32_t k = 0; k < x->nlays; k++)
		if (x->lays[k].state == 0 && x->lays[k].asked)
			x->lays[k].state = -1;
	agent_pump(a);
}

/* ---- reads ------------------------------------------------------------------- */

static int post_window(struct node_agent *a, struct xl_read *xr, struct xl_op *op);

/* All of a chunk's reads are back: its pieces go from staging into its
 * bounce slot, and the read takes the common path (agent_read_landed). */
static void xl_finish(struct node_agent *a, struct xl_read *xr)
{
	struct agent_xl *x = a->xl;
	struct agent_read *rd = xr->rd;
	struct xl_holder *h = &x->hs[xr->holder];
	int status = xr->status;

	if (status == 0) {
		uint8_t *out = a->bounce + (size_t)rd->slot * a->chunk_size;
		const uint8_t *st = x->stage + (size_t)xr->stage * x->stage_slot;
		for (size_t i = 0; i < xr->npcs; i++) {
			const struct proto_xpiece *q = &xr->pcs[i];
			memcpy(out + q->out, st + q->at, q->len);
		}
	}
	if (h->used && h->epoch == xr->epoch && rd->gen == a->gen) {
		agent_source_done(&h->pace, rd->len, status == 0);
		if (status != 0 && status != -ECANCELED)
			h->bad_until_ms = agent_now_ms() + BAD_SOURCE_MS;
	}
	free(xr->pcs);
	free(xr->wins);
	xr->pcs = NULL;
	xr->wins = NULL;
	xr->busy = false;
	agent_read_landed(rd, status);
}

static void on_window(struct fab_op *op, int status)
{
	struct xl_op *xo = proto_container_of(op, struct xl_op, op);
	struct xl_read *xr = xo->xr;
	struct node_agent *a = xr->a;
	struct agent_xl *x = a->xl;
	struct xl_holder *h = &x->hs[xr->holder];
	bool ours = h->used && h->epoch == xr->epoch;

	xr->live--;
	if (status == 0 && ours)
		h->pace.progress_ms = agent_now_ms(); /* a chunk of many reads is not silent */
	if (status != 0 && xr->status == 0) {
		xr->status = status;
		if (ours && status != -ECANCELED) {
			LOG_DEBUG("node %s: holder %s rank %u: read failed: %d", a->node_id, h->replica,
				  xr->wins[xo->win].rank, status);
			agent_source_failed(a, &h->ranks[xr->wins[xo->win].rank]);
		}
	}
	if (xr->status == 0 && xr->next < xr->nwins) {
		/* More of the chunk to read: only for the fetch it belongs to,
		 * from the holder it was planned on. */
		int rc = !ours || xr->rd->abandoned || xr->rd->gen != a->gen || a->fetch == NULL
				 ? -ECANCELED
				 : post_window(a, xr, xo);
		if (rc == 0)
			return;
		xr->status = rc;
	}
	if (xr->live > 0)
		return;
	xl_finish(a, xr);
}

static int post_window(struct node_agent *a, struct xl_read *xr, struct xl_op *op)
{
	struct agent_xl *x = a->xl;
	struct xl_holder *h = &x->hs[xr->holder];
	const struct proto_xwin *w = &xr->wins[xr->next];
	struct agent_source *s = &h->ranks[w->rank];
	int rc;

	if (!agent_source_ready(a, s, agent_now_ms()))
		return -EHOSTUNREACH;
	struct fab_rkey rk = {s->info.addr, s->info.key, s->info.len};
	size_t at = (size_t)xr->stage * x->stage_slot + w->stage;
	op->xr = xr;
	op->win = xr->next;
	if (w->nsegs == 1) {
		rc = fab_read(a->fab, &op->op, x->stage_mr, at, w->len, s->fa, &rk, w->segs[0].src,
			      on_window);
	} else {
		for (uint32_t k = 0; k < w->nsegs; k++)
			op->segs[k] = (struct fab_seg){w->segs[k].src, w->segs[k].len};
		rc = fab_readv(a->fab, &op->op, x->stage_mr, at, s->fa, &rk, op->segs, w->nsegs,
			       on_window);
	}
	if (rc != 0) {
		agent_source_failed(a, s);
		return rc;
	}
	if (a->fetch != NULL && a->fetch->su.read == 0) /* start-up line: reads from a holder */
		a->fetch->su.read = proto_wall_ms();
	xr->next++;
	xr->live++;
	return 0;
}

/* ---- partial holders: their have-maps, and who leads ------------------------ */

static void on_have_map(struct fab_op *op, int status)
{
	struct xl_hvop *ho = proto_container_of(op, struct xl_hvop, op);
	struct node_agent *a = ho->a;
	struct agent_xl *x = a->xl;
	struct xl_holder *h = &x->hs[ho->holder];

	h->hv_live--;
	if (!h->used || h->epoch != ho->epoch)
		return; /* the entry was dropped (or reused once every read was back) */
	if (status != 0) {
		h->hv_bad++;
		if (status != -ECANCELED)
			h->bad_until_ms = agent_now_ms() + BAD_SOURCE_MS;
	}
	if (h->hv_live > 0)
		return;
	if (h->hv_bad == 0) {
		const uint8_t *m = x->hv + (size_t)(h - x->hs) * XL_HV_MAX;
		uint64_t set = 0;
		for (uint64_t b = 0; b < h->hv_off[h->nranks]; b++)
			set += m[b] != 0;
		if (set > h->hv_set) {
			h->hv_set = set;
			h->grew_ms = agent_now_ms();
			x->cov_gen++;
		}
		h->hv_ready = true;
		/* The start-up line's first have-page: a holder's map. */
		if (a->fetch != NULL && a->fetch->su.have == 0)
			a->fetch->su.have = proto_wall_ms();
	}
	agent_pump(a);
}

/* Reads every rank's have-map of partial holder h (one read each), at most
 * every TESSERA_HAVE_POLL_MS and one poll at a time. Each map only grows
 * while the holder's registration lasts (a new registration is a new key,
 * a new holder entry), so a map read in place is never ahead of its slot. */
static void poll_have(struct node_agent *a, struct xl_holder *h, uint64_t now)
{
	struct agent_xl *x = a->xl;
	uint32_t k = (uint32_t)(h - x->hs);

	if (!h->used || !h->listed || !h->partial || !h->hv_fits || h->hv_live > 0 ||
	    h->bad_until_ms > now || holder_banned(a->fetch, h) || x->hv == NULL ||
	    now - h->hv_ms < proto_param(PROTO_PARAM_HAVE_POLL_MS))
		return;
	h->hv_ms = now;
	h->hv_bad = 0;
	for (uint32_t r = 0; r < h->nranks; r++) {
		struct agent_source *rs = &h->ranks[r];
		uint64_t nb = h->hv_off[r + 1] - h->hv_off[r];
		uint8_t *m = x->hv + (size_t)k * XL_HV_MAX + h->hv_off[r];
		if (!rs->info.partial) { /* complete: every block is there */
			memset(m, 1, nb);
			continue;
		}
		struct xl_hvop *ho = &x->hvops[k][r];
		struct fab_rkey rk = {rs->info.have_addr, rs->info.have_key, nb};
		*ho = (struct xl_hvop){.a = a, .holder = k, .epoch = h->epoch};
		if (!agent_source_ready(a, rs, now) ||
		    fab_read(a->fab, &ho->op, x->hv_mr, (size_t)k * XL_HV_MAX + h->hv_off[r], nb, rs->fa,
			     &rk, 0, on_have_map) != 0) {
			h->hv_bad++;
			h->bad_until_ms = now + BAD_SOURCE_MS;
			break;
		}
		h->hv_live++;
	}
	node_fabloop_kick(a->fl);
}

/* Layout (nranks, digest) leads ours for the trainer's bytes: more ranks
 * (more uplinks to relay from), then the lower digest. */
static bool leads(const struct node_agent *a, uint32_t nranks, const uint8_t *digest)
{
	if (nranks != a->layout.nranks)
		return nranks > a->layout.nranks;
	return memcmp(digest, a->layout.digest, PROTO_HASH_BYTES) < 0;
}

static bool replica_banned(const struct agent_fetch *f, const char *name)
{
	size_t n = strlen(name);

	if (agent_swarm_banned(f, name))
		return true;
	for (uint32_t i = 0; i < f->nbad; i++)
		if (f->bad_counts[i] >= BAN_BAD_CHUNKS && strncmp(f->bad_ids[i], name, n) == 0 &&
		    f->bad_ids[i][n] == '/')
			return true;
	return false;
}

/*
 * Trainer chunks across layouts. Replicas of several layouts fetching one
 * version would each take it all from the trainer. The rule: one layout
 * leads (leads()); its nodes take from the trainer what their own swarm
 * does not hold, as alone. A node of any other layout takes a byte range
 * from the trainer only when no replica of a leading layout will have it
 * soon: while a leading replica works toward the version (listed as
 * fetching, or as a partial holder whose have-map still grows), its chunks
 * are awaited and read from that replica's verified blocks; once none of
 * them has progressed for TESSERA_XL_PATIENCE_MS (or they are banned, or
 * gone), the trainer is the last resort again. True: wait.
 */
static bool wait_for_lead(struct node_agent *a, uint64_t now)
{
	struct agent_xl *x = a->xl;
	uint64_t patience = proto_param(PROTO_PARAM_XL_PATIENCE_MS);

	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		const struct xl_holder *h = &x->hs[k];
		if (h->used && h->listed && h->partial && h->hv_fits &&
		    x->lays[h->lay].state >= 0 && !holder_banned(a->fetch, h) &&
		    leads(a, h->nranks, x->lays[h->lay].digest) && now - h->grew_ms < patience)
			return true;
	}
	for (uint32_t k = 0; k < XL_FETCHING_MAX; k++) {
		const struct xl_fetching *q = &x->fetching[k];
		if (q->since_ms != 0 && q->listed && !replica_banned(a->fetch, q->replica) &&
		    leads(a, q->nranks, q->digest) && now - q->since_ms < patience)
			return true;
	}
	return false;
}

/* Partial holder h has every window's bytes verified (its have-maps). */
static bool have_covers(const struct agent_xl *x, const struct xl_holder *h, int nwins)
{
	const uint8_t *m = x->hv + (size_t)(h - x->hs) * XL_HV_MAX;

	for (int i = 0; i < nwins; i++) {
		const struct proto_xwin *w = &x->wscratch[i];
		for (uint32_t k = 0; k < w->nsegs; k++)
			if (!proto_xmap_have_covers(m + h->hv_off[w->rank],
						    h->hv_off[w->rank + 1] - h->hv_off[w->rank],
						    w->segs[k].src, w->segs[k].len))
				return false;
	}
	return true;
}

/* Staging and scratch, made on first use; false when out of memory. */
static bool xl_buffers(struct node_agent *a)
{
	struct agent_xl *x = a->xl;

	if (x->stage != NULL)
		return true;
	x->stage_slot = ((size_t)2 * a->chunk_size + 4095) / 4096 * 4096;
	x->stage_len = XL_STAGES * x->stage_slot;
	x->scratch = malloc(XL_PIECES_MAX * sizeof(*x->scratch));
	x->wscratch = malloc(XL_WINS_MAX * sizeof(*x->wscratch));
	x->stage = node_serve_map(x->stage_len);
	x->hv = node_serve_map((size_t)XL_HOLDERS_MAX * XL_HV_MAX);
	if (x->scratch == NULL || x->wscratch == NULL || x->stage == NULL || x->hv == NULL ||
	    fab_mr_reg(a->fab, x->stage, x->stage_len, FAB_MR_READ, &x->stage_mr) != 0 ||
	    fab_mr_reg(a->fab, x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX, FAB_MR_READ, &x->hv_mr) != 0) {
		if (x->stage_mr != NULL)
			fab_mr_close(x->stage_mr);
		x->stage_mr = NULL;
		node_serve_unmap(x->stage, x->stage_len);
		node_serve_unmap(x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX);
		x->stage = x->hv = NULL;
		free(x->scratch);
		free(x->wscratch);
		x->scratch = NULL;
		x->wscratch = NULL;
		return false;
	}
	for (uint32_t i = 0; i < XL_STAGES; i++)
		x->reads[i] = (struct xl_read){.a = a, .stage = i};
	return true;
}

/* The chunk of parcel p to read from a holder: hint if still to fetch,
 * else the first from our starting point that no peer holds or fetches
 * and that no holder could give as of gen (uncov, when not NULL). */
static uint32_t xl_chunk(const struct agent_parcel *p, uint32_t hint, const uint32_t *uncov,
			 uint32_t gen)
{
	uint32_t n = p->mp->nchunks;

	if (hint < n && p->state[hint] == 0 && (uncov == NULL || uncov[hint] != gen))
		return hint;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t c = (p->rot + k) % n;
		if (p->state[c] == 0 && p->avail[c] == 0 && !p->peer_busy[c] &&
		    (uncov == NULL || uncov[c] != gen))
			return c;
	}
	return UINT32_MAX;
}

/* Chunk c of parcel pi from holder h: pieces into scratch (npieces),
 * windows into wscratch; the count of windows and their bytes, or <= 0
 * when the holder cannot give it in XL_WINS_MAX reads within staging. */
static int xl_plan(struct node_agent *a, const struct xl_holder *h, uint32_t pi, uint32_t c,
		   uint64_t *staged)
{
	struct agent_xl *x = a->xl;
	struct agent_fetch *f = a->fetch;
	const struct agent_parcel *p = &f->parcels[pi];
	const struct xl_layout *l = &x->lays[h->lay];
	size_t n = 0;
	int rc = proto_xmap_pieces(&l->map, f->plan, p->pp, &a->layout, (uint64_t)c * f->man.chunk_size,
				   p->mp->chunks[c].size, x->scratch, XL_PIECES_MAX, &n);

	for (size_t i = 0; rc == 0 && i < n; i++)
		if (x->scratch[i].rank >= h->nranks ||
		    x->scratch[i].src + x->scratch[i].len > h->ranks[x->scratch[i].rank].info.len)
			rc = -ERANGE; /* the holder offered less than its layout holds */
	uint32_t segs = (uint32_t)PROTO_MIN(fab_rma_segs(a->fab), PROTO_XWIN_SEGS);
	int w = rc == 0 ? proto_xmap_windows(x->scratch, n, x->stage_slot, segs, x->wscratch, XL_WINS_MAX)
			: rc;
	if (w > 0 && h->partial && !have_covers(x, h, w))
		w = -ENODATA; /* not all verified there yet: nothing of it is read */
	x->npieces = n;
	*staged = 0;
	for (int i = 0; i < w; i++)
		*staged += x->wscratch[i].len;
	if (w <= 0 && w != -ENODATA)
		LOG_DEBUG("node %s: parcel %u chunk %u: not from holder %s (%d)", a->node_id, pi, c,
			  h->replica, w);
	return w;
}

int agent_xl_post(struct node_agent *a, uint32_t pi, uint32_t hint)
{
	struct agent_xl *x = a->xl;
	struct agent_fetch *f = a->fetch;
	struct agent_parcel *p = &f->parcels[pi];
	struct xl_holder *h = NULL;
	struct xl_read *xr = NULL;
	uint64_t now = agent_now_ms();
	uint32_t live = 0, c = UINT32_MAX;
	bool any = false;

	if (p->wire != NULL || !xl_refresh(a, false))
		return 0;
	x = a->xl;
	ask_holders(a, now);
	/* Not from the trainer before we know whether holders exist (one
	 * round trip at the start of a fetch). */
	if (!x->answered)
		return -1;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX && !any; k++)
		any = holder_usable(a, &x->hs[k], now);
	if (!any) {
		/* A holder whose layout is being read: wait for it, not the trainer. */
		for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
			if (x->hs[k].used && x->hs[k].listed && x->lays[x->hs[k].lay].state == 0)
				return -1;
		return wait_for_lead(a, now) ? -1 : 0;
	}
	/* The swarm's endgame (a chunk already out, asked again): not from
	 * the trainer while holders deliver; a silent one's reads move. */
	if (hint < p->mp->nchunks && p->state[hint] == 1)
		return -1;
	for (uint32_t i = 0; i < XL_STAGES; i++) {
		live += x->reads[i].busy && !x->reads[i].rd->abandoned;
		if (!x->reads[i].busy && xr == NULL)
			xr = &x->reads[i];
	}
	if (xr == NULL) /* every staging slot held by reads that never came back */
		return 0;
	if (live >= XL_INFLIGHT)
		return -1;
	/* The chunk: the hint, else ones no peer of our swarm holds or
	 * fetches, from our starting point; partial holders give only those
	 * whose every read is verified there (chunks none could give are not
	 * tried again before something changes: cov_gen). */
	const struct proto_chunk *ch = NULL;
	uint64_t staged;
	int w = 0;
	uint32_t *uncov = pi < x->nuncov ? x->uncov[pi] : NULL;
	for (uint32_t tries = 0; h == NULL && tries < XL_SCAN; tries++) {
		if ((c = xl_chunk(p, tries == 0 ? hint : UINT32_MAX, uncov, x->cov_gen)) == UINT32_MAX)
			break;
		ch = &p->mp->chunks[c];
		/* Round-robin over the holders with room (readers spread over
		 * their uplinks): the first whose reads of the chunk carry at
		 * most half as many bytes again (gaps read along), else the one
		 * with the fewest. */
		uint64_t best = UINT64_MAX;
		bool room = false;
		for (uint32_t k = 0; k < XL_HOLDERS_MAX && best > ch->size + ch->size / 2; k++) {
			struct xl_holder *o = &x->hs[(x->rr + k) % XL_HOLDERS_MAX];
			if (!holder_usable(a, o, now) || !holder_room(a, o, ch->size))
				continue;
			room = true;
			if (xl_plan(a, o, pi, c, &staged) > 0 && staged < best) {
				best = staged;
				h = o;
			}
		}
		if (!room)
			return -1; /* holders, all busy: wait for them, not the trainer */
		if (h == NULL && uncov != NULL)
			uncov[c] = x->cov_gen;
	}
	if (h == NULL) /* no holder can give one now: a leading layout's, or the trainer */
		return wait_for_lead(a, now) ? -1 : 0;
	x->rr = (uint32_t)(h - x->hs + 1) % XL_HOLDERS_MAX;
	w = xl_plan(a, h, pi, c, &staged);
	if (w <= 0)
		return 0;
	size_t n = x->npieces;
	int slot = agent_read_claim(a, ch->size);
	if (slot < 0)
		return -1;
	xr->pcs = malloc(n * sizeof(*xr->pcs));
	xr->wins = malloc((size_t)w * sizeof(*xr->wins));
	if (xr->pcs == NULL || xr->wins == NULL) {
		free(xr->pcs);
		free(xr->wins);
		xr->pcs = NULL;
		xr->wins = NULL;
		agent_read_unclaim(a, ch->size);
		return -1;
	}
	memcpy(xr->pcs, x->scratch, n * sizeof(*xr->pcs));
	memcpy(xr->wins, x->wscratch, (size_t)w * sizeof(*xr->wins));
	xr->npcs = n;
	xr->nwins = (uint32_t)w;
	xr->next = xr->live = 0;
	xr->status = 0;
	xr->holder = (uint32_t)(h - x->hs);
	xr->epoch = h->epoch;
	struct agent_read *rd = &a->reads[slot];
	*rd = (struct agent_read){.a = a, .parcel = pi, .chunk = c, .slot = (uint32_t)slot,
				  .len = ch->size, .src_idx = UINT32_MAX, .src_peer = true, .xl = true,
				  .started_ms = now, .busy = true, .in_fabric = true, .gen = a->gen};
	/* Whom a bad chunk counts against: the one rank that sent it all, else
	 * the replica. */
	bool one = true;
	for (int i = 1; i < w; i++)
		one &= xr->wins[i].rank == xr->wins[0].rank;
	snprintf(rd->src_id, sizeof(rd->src_id), "%s",
		 one ? h->ranks[xr->wins[0].rank].info.id : h->replica);
	xr->rd = rd;
	int rc = 0;
	for (uint32_t i = 0; i < XL_POST_MAX && xr->next < xr->nwins; i++)
		if ((rc = post_window(a, xr, &xr->ops[i])) != 0)
			break;
	if (xr->live == 0) { /* nothing went out: as if never tried */
		rd->busy = rd->in_fabric = false;
		free(xr->pcs);
		free(xr->wins);
		xr->pcs = NULL;
		xr->wins = NULL;
		agent_read_unclaim(a, ch->size);
		h->bad_until_ms = now + BAD_SOURCE_MS;
		return 0;
	}
	if (rc != 0)
		xr->status = rc; /* the rest is not asked; what went out comes back first */
	xr->busy = true;
	if (f->first_post_ms == 0) {
		f->first_post_ms = now;
		LOG_DEBUG("node %s: v%" PRIu64 ": first read posted, to holder %s", a->node_id,
			  f->version, h->replica);
	}
	agent_source_posted(&h->pace, ch->size);
	agent_read_started(a, pi, c, ch->size);
	return 1;
}

bool agent_xl_serves(struct node_agent *a)
{
	uint64_t now = agent_now_ms();

	if (a->xl == NULL || a->fetch == NULL || a->xl->version != a->fetch->version ||
	    a->xl->gen != a->gen)
		return false;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		if (holder_usable(a, &a->xl->hs[k], now))
			return true;
	return false;
}

/* ---- periodic work -------------------------------------------------------------- */


/* A silent holder's reads go back to the pool (their slots stay reserved
 * until they complete) and it rests. */
static void move_silent(struct node_agent *a, struct agent_fetch *f, uint64_t now)
{
	struct agent_xl *x = a->xl;

	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++) {
		struct xl_holder *h = &x->hs[k];
		uint32_t moved = 0;
		if (!h->used || !holder_silent(h, now) || h->bad_until_ms > now)
			continue;
		for (uint32_t i = 0; i < XL_STAGES; i++) {
			struct xl_read *xr = &x->reads[i];
			struct agent_read *rd = xr->rd;
			if (!xr->busy || xr->holder != k || xr->epoch != h->epoch || rd->abandoned ||
			    rd->gen != a->gen || !rd->in_fabric)
				continue;
			struct agent_parcel *p = &f->parcels[rd->parcel];
			rd->abandoned = true;
			p->nlive[rd->chunk]--;
			if (p->state[rd->chunk] == 1 && p->nlive[rd->chunk] == 0) {
				p->state[rd->chunk] = 0;
				agent_swarm_mark(p, rd->chunk, AGENT_MARK_NONE);
			}
			moved++;
		}
		if (moved == 0)
			continue;
		LOG_WARN("node %s: holder %s delivered nothing for %" PRIu64 " ms; moving its %u reads "
			 "elsewhere",
			 a->node_id, h->replica, now - h->pace.progress_ms, moved);
		f->stalls += moved;
		proto_metrics_add(a->am.m, a->am.stalled, moved);
		h->bad_until_ms = now + BAD_SOURCE_MS;
	}
}

/* A delta taken whole has no source but holders: once none is left for
 * XL_ALONE_MS (none listed, or each banned for chunks that failed the raw
 * copy's hashes), the fetch is refused and the version's next try replays
 * the chain. True when the fetch is gone. */
static bool full_alone(struct node_agent *a, struct agent_xl *x, struct agent_fetch *f,
		       uint64_t now)
{
	bool left = false;

	if (!f->full || !x->answered)
		return false;
	for (uint32_t k = 0; k < XL_HOLDERS_MAX && !left; k++)
		left = x->hs[k].used && x->hs[k].listed && x->lays[x->hs[k].lay].state >= 0 &&
		       !holder_banned(f, &x->hs[k]);
	if (left || x->alone_ms == 0) {
		x->alone_ms = left ? 0 : now;
		return false;
	}
	if (now - x->alone_ms < XL_ALONE_MS)
		return false;
	a->full_failed_v = f->version;
	agent_fetch_fail(a, "no replica left to read v%" PRIu64 " whole from (%u chunks failed "
			 "their hash); its chain is replayed next",
			 f->version, f->bad_chunks);
	return true;
}

void agent_xl_tick(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;
	struct agent_xl *x = a->xl;
	uint64_t now = agent_now_ms();

	/* An offer without our slot was accepted: offer again, with it. */
	if (x != NULL && x->slot_mr != NULL && a->kept != NULL && a->kept->so.offered &&
	    !a->kept->so.busy && !x->slot_in_offer)
		a->kept->so.offered = false;
	if (!xl_refresh(a, false))
		return;
	x = a->xl;
	part_serve(a, x);
	if (x->part_mr != NULL && x->part_f == f && f->so.offered && !f->so.busy && !x->part_in_offer)
		f->so.offered = false;
	move_silent(a, f, now);
	ask_holders(a, now);
	if (full_alone(a, x, f, now))
		return;
	x->cov_gen++; /* holders rest and come back: chunks are tried again */
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		poll_have(a, &x->hs[k], now);
}

static void uncov_free(struct agent_xl *x)
{
	for (uint32_t i = 0; i < x->nuncov; i++)
		free(x->uncov[i]);
	free(x->uncov);
	x->uncov = NULL;
	x->nuncov = 0;
}

/* Holders are for the fetch under way (dropped when it changed); asked
 * again every XL_ASK_MS. False when there is nothing to do for this fetch.
 * early: its parcels are not known yet (the addendum is awaited); holders
 * and their layouts are made ready meanwhile. */
static bool xl_refresh(struct node_agent *a, bool early)
{
	struct agent_fetch *f = a->fetch;
	struct agent_xl *x;

	if (!a->fanout || f == NULL || (f->parcels == NULL && !early) || !f->have_man ||
	    f->verified || f->delta || (x = xl_get(a)) == NULL || !xl_buffers(a))
		return false;
	if (x->version != f->version || x->gen != a->gen) {
		for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
			if (x->hs[k].used)
				holder_drop(a, &x->hs[k]);
		for (uint32_t k = 0; k < XL_FETCHING_MAX; k++)
			x->fetching[k] = (struct xl_fetching){.since_ms = 0};
		uncov_free(x);
		x->cov_gen = 1;
		x->version = f->version;
		x->gen = a->gen;
		x->asked_ms = 0;
		x->alone_ms = 0;
		x->answered = false;
	}
	if (x->uncov == NULL && f->parcels != NULL &&
	    (x->uncov = calloc(f->nparcels, sizeof(*x->uncov))) != NULL) {
		x->nuncov = f->nparcels;
		for (uint32_t i = 0; i < f->nparcels; i++)
			x->uncov[i] = calloc(f->parcels[i].mp->nchunks + 1, sizeof(**x->uncov));
	}
	return true;
}

void agent_xl_prefetch(struct node_agent *a)
{
	if (xl_refresh(a, true))
		ask_holders(a, agent_now_ms());
}

static void ask_holders(struct node_agent *a, uint64_t now)
{
	struct agent_fetch *f = a->fetch;
	struct agent_xl *x = a->xl;

	if (x->pending || now - x->asked_ms < XL_ASK_MS)
		return;
	struct xl_req *req = malloc(sizeof(*req));
	x->asked_ms = now;
	if (req != NULL)
		*req = (struct xl_req){a, a->gen};
	if (req == NULL ||
	    trk_client_holders(a->trk, f->version, a->layout.digest, on_holders, req) != 0) {
		free(req);
		x->answered = true; /* not waiting for an answer that will not come */
	} else {
		x->pending = true;
	}
}

void agent_xl_fini(struct node_agent *a)
{
	struct agent_xl *x = a->xl;

	if (x == NULL)
		return;
	/* The endpoint is closed (it closed the regions and cancelled reads). */
	for (uint32_t k = 0; k < XL_HOLDERS_MAX; k++)
		if (x->hs[k].used)
			holder_drop(a, &x->hs[k]);
	for (uint32_t i = 0; i < x->nlays; i++)
		if (x->lays[i].state == 1) {
			proto_xmap_fini(&x->lays[i].map);
			proto_layout_fini(&x->lays[i].l);
		}
	for (uint32_t i = 0; i < XL_STAGES; i++) {
		free(x->reads[i].pcs);
		free(x->reads[i].wins);
	}
	node_serve_unmap(x->stage, x->stage_len);
	node_serve_unmap(x->hv, (size_t)XL_HOLDERS_MAX * XL_HV_MAX);
	node_serve_unmap(x->liar, x->liar_len);
	agent_xl_unserve(a, x->part_f);
	have_free(a, &x->slot_have, &x->slot_have_cap, &x->slot_have_mr);
	uncov_free(x);
	free(x->scratch);
	free(x->wscratch);
	free(x);
	a->xl = NULL;
}
