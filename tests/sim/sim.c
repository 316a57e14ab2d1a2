/* The fanout simulator (tests/sim/sim.h): replicas' ranks run node/fetch's
 * fetchers on one simulated clock; links, CPUs, have-page reads and the
 * tracker's /sources answers are modelled here. */
#include "tests/sim/sim.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "node/fetch/fetch.h"
#include "node/fetch/picker.h"
#include "proto/have.h"
#include "proto/log.h"
#include "proto/plan.h"
#include "proto/spec.h"

/* ---- events -------------------------------------------------------------- */

enum ev_kind {
	E_VERSION,  /* a: version index: exported now */
	E_START,    /* a: rank: hears of the current version */
	E_TICK,     /* a: rank: sources, have-pages, silences */
	E_SOURCES,  /* a: rank, p: its pending /sources request */
	E_UPLINK,   /* a: rank, b: read slot: its source sent it (t0: from when) */
	E_READ,     /* a: rank, b: read slot, gen: x->gen at posting */
	E_VERIFIED, /* the same: its chunk is hashed */
	E_LEAVE,    /* a: host: the replica is gone */
	E_JOIN,     /* a: host: a replica registers */
};

struct ev {
	uint64_t t, seq;
	uint32_t kind, a, b;
	int status;
	uint64_t gen, t0;
	uint32_t len;
	void *p;
};

struct heap {
	struct ev *v;
	size_t n, cap;
};

static bool ev_before(const struct ev *x, const struct ev *y)
{
	return x->t != y->t ? x->t < y->t : x->seq < y->seq;
}

/* ---- the simulated cluster ------------------------------------------------ */

/* A replica's host: its link, shared by its ranks. */
struct host {
	double up_bps, down_bps;
	uint64_t up_free, down_free; /* when its queues are next free, ns */
	uint32_t layout, rank0;      /* its ranks: ranks[rank0 .. rank0 + tp) */
	bool alive, joined;
	bool stayed;                 /* alive through the whole current version */
	bool slow;                   /* a straggler: its link is a tenth */
	uint64_t done_ns;            /* its last rank completed the version (0: not yet) */
	uint32_t left_done;          /* ranks still fetching the version */
};

/* One rank of a replica: a node agent's fetcher. */
struct rank {
	struct fetcher x; /* first: the transport finds the rank from it */
	char id[TRK_ID_MAX];
	uint32_t host, rank, layout;
	uint64_t cpu_free;
	uint64_t tick_phase; /* ns within a tick period */
	bool fetching;       /* a fetch of the current version is under way or done */
};

/* The /sources request a rank has out (the tracker's answer comes later). */
struct sources_req {
	trk_client_cb cb;
	void *arg;
	struct trk_parcel_key k;
};

/* A serving layout's plan, and per version its manifest's parcels. */
struct layout {
	struct proto_layout l;
	struct proto_plan plan;
	struct proto_mlayout ml; /* the current version's */
	struct proto_chunk *chunks;
};

struct sim {
	const struct sim_cfg *c;
	struct sim_result *r;
	struct heap h;
	uint64_t seq, rng;
	struct proto_model model;
	struct proto_layout trainer;
	struct layout lay[SIM_LAYOUTS_MAX];
	uint32_t nlay;
	struct host *hosts;
	uint32_t nhosts, max_hosts;
	struct rank *ranks;
	uint32_t nranks, max_ranks;
	uint32_t chunk;
	uint32_t vi;         /* the current version's index */
	uint64_t v_start;    /* its export, ns */
	bool v_live;
	uint64_t tick_ns;
	struct fetch_transport tx;
	struct node_rank_metrics am;
	int failed;          /* -errno: stop */
};

static uint64_t sim_clock_ns;

static uint64_t sim_now(void)
{
	return sim_clock_ns;
}

static uint64_t rnd(struct sim *s)
{
	uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double rnd01(struct sim *s)
{
	return (double)(rnd(s) >> 11) / 9007199254740992.0;
}

static void push(struct sim *s, struct ev e)
{
	struct heap *h = &s->h;

	if (h->n == h->cap) {
		size_t cap = h->cap ? 2 * h->cap : 4096;
		struct ev *v = realloc(h->v, cap * sizeof(*v));
		if (v == NULL) {
			s->failed = -ENOMEM;
			return;
		}
		h->v = v;
		h->cap = cap;
	}
	e.seq = s->seq++;
	size_t i = h->n++;
	while (i > 0 && ev_before(&e, &h->v[(i - 1) / 2])) {
		h->v[i] = h->v[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h->v[i] = e;
}

static struct ev pop(struct sim *s)
{
	struct heap *h = &s->h;
	struct ev top = h->v[0], last = h->v[--h->n];
	size_t i = 0;

	for (;;) {
		size_t k = 2 * i + 1;
		if (k >= h->n)
			break;
		if (k + 1 < h->n && ev_before(&h->v[k + 1], &h->v[k]))
			k++;
		if (!ev_before(&h->v[k], &last))
			break;
		h->v[i] = h->v[k];
		i = k;
	}
	if (h->n > 0)
		h->v[i] = last;
	return top;
}

static void at(struct sim *s, uint64_t t, uint32_t kind, uint32_t a, uint32_t b)
{
	push(s, (struct ev){.t = t, .kind = kind, .a = a, .b = b});
}

static uint64_t ns_of(double seconds)
{
	return seconds <= 0 ? 0 : (uint64_t)llround(seconds * 1e9);
}

static uint64_t latency(const struct sim *s)
{
	return ns_of(s->c->latency_ms / 1e3);
}

/* ---- the model, its layouts, a version's manifest --------------------------- */

static int setup_model(struct sim *s, struct proto_err *err)
{
	/* One bf16 tensor of 4096 columns; rows a multiple of 8 (tp8). */
	uint64_t rows = s->c->model_bytes / (2 * 4096);
	char spec[256];

	if (rows == 0 || rows % 8 != 0 || rows * 2 * 4096 != s->c->model_bytes)
		return proto_errf(err, EINVAL, "model bytes: want a multiple of 64 KiB");
	snprintf(spec, sizeof(spec),
		 "{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[%" PRIu64 ",4096]}]}",
		 rows);
	proto_model_init(&s->model);
	if (proto_model_parse(spec, strlen(spec), "sim model", &s->model, err) != 0)
		return -EINVAL;
	const char *one = "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"split\":0}]}";
	if (proto_layout_parse(&s->model, one, strlen(one), "trainer", &s->trainer, err) != 0)
		return -EINVAL;
	s->nlay = s->c->ntp;
	for (uint32_t i = 0; i < s->nlay; i++) {
		uint32_t tp = s->c->tp[i];
		if (tp != 1 && tp != 2 && tp != 4 && tp != 8)
			return proto_errf(err, EINVAL, "layout tp%u: want tp1, tp2, tp4 or tp8", tp);
		snprintf(spec, sizeof(spec),
			 "{\"ranks\":%u,\"tensors\":[{\"match\":\"*\",\"split\":0}]}", tp);
		if (proto_layout_parse(&s->model, spec, strlen(spec), "layout", &s->lay[i].l, err) != 0 ||
		    proto_plan_build(&s->model, &s->trainer, &s->lay[i].l, &s->lay[i].plan, err) != 0)
			return -EINVAL;
	}
	return 0;
}

/* Layout li's manifest parcels for version vi: the anchor's raw, a
 * delta's encoded in delta_ratio of the bytes. Chunk hashes are not
 * checked here (the verifier is modelled), so they stay zero. */
static int manifest(struct sim *s, struct layout *L, bool delta)
{
	const struct proto_plan *pl = &L->plan;
	uint32_t nchunks = 0;

	free(L->ml.parcels);
	free(L->chunks);
	memset(&L->ml, 0, sizeof(L->ml));
	memcpy(L->ml.layout_digest, L->l.digest, PROTO_HASH_BYTES);
	L->ml.nparcels = pl->nparcels;
	L->ml.parcels = calloc(pl->nparcels, sizeof(*L->ml.parcels));
	for (uint32_t i = 0; i < pl->nparcels; i++) {
		uint64_t wire = delta ? (uint64_t)llround((double)pl->parcels[i].bytes * s->c->delta_ratio)
				      : pl->parcels[i].bytes;
		nchunks += (uint32_t)((PROTO_MAX(wire, 1) + s->chunk - 1) / s->chunk);
	}
	L->chunks = calloc(PROTO_MAX(nchunks, 1), sizeof(*L->chunks));
	if (L->ml.parcels == NULL || L->chunks == NULL)
		return -ENOMEM;
	struct proto_chunk *ch = L->chunks;
	for (uint32_t i = 0; i < pl->nparcels; i++) {
		struct proto_mparcel *mp = &L->ml.parcels[i];
		uint64_t bytes = pl->parcels[i].bytes;
		uint64_t wire = delta ? PROTO_MAX((uint64_t)llround((double)bytes * s->c->delta_ratio), 1)
				      : bytes;
		*mp = (struct proto_mparcel){.src_rank = pl->parcels[i].src_rank,
					     .dst_rank = pl->parcels[i].dst_rank, .bytes = bytes,
					     .encoding = delta ? PROTO_ENC_DELTA : PROTO_ENC_RAW,
					     .wire_bytes = wire, .chunks = ch};
		for (uint64_t off = 0; off < wire; off += s->chunk)
			ch[mp->nchunks++].size = (uint32_t)PROTO_MIN(s->chunk, wire - off);
		ch += mp->nchunks;
	}
	return 0;
}

/* ---- the tracker's /sources answers ------------------------------------------ */

static void hex_addr(uint32_t v, char out[9])
{
	snprintf(out, 9, "%08x", v);
}

static json_t *source_json(bool peer, const char *id, const char *host, uint32_t addr_id,
			   uint64_t len)
{
	char fa[9], key[24];

	hex_addr(addr_id, fa);
	snprintf(key, sizeof(key), "%u", addr_id);
	return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I}", "kind", peer ? "peer" : "publisher", "id",
			 id, "host", host, "provider", "sim", "fabric_addr", fa, "addr", "4096", "key",
			 key, "len", (json_int_t)len);
}

/* The tracker's answer for k, as tracker/server/sources.c builds it. */
static json_t *sources_answer(struct sim *s, const struct trk_parcel_key *k)
{
	json_t *members = json_array(), *srcs = json_array();
	uint32_t *peers = calloc(s->nhosts + 1, sizeof(*peers)), np = 0;
	uint64_t len = 0;
	char host[32];

	if (members == NULL || srcs == NULL || peers == NULL)
		goto fail;
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		const struct host *h = &s->hosts[hi];
		const struct layout *L = &s->lay[h->layout];
		if (!h->alive || !h->joined || memcmp(L->l.digest, k->layout, PROTO_HASH_BYTES) != 0 ||
		    k->dst_rank >= L->l.nranks)
			continue;
		const struct rank *rk = &s->ranks[h->rank0 + k->dst_rank];
		json_array_append_new(members, json_string(rk->id));
		if (rk->fetching && rk->x.f != NULL && rk->x.f->version == k->version)
			peers[np++] = h->rank0 + k->dst_rank;
	}
	for (uint32_t i = np; i > 1; i--) { /* shuffled per answer, as srcache.c does */
		uint32_t j = (uint32_t)(rnd(s) % i), t = peers[i - 1];
		peers[i - 1] = peers[j];
		peers[j] = t;
	}
	for (uint32_t li = 0; li < s->nlay; li++)
		if (memcmp(s->lay[li].l.digest, k->layout, PROTO_HASH_BYTES) == 0)
			for (uint32_t i = 0; i < s->lay[li].ml.nparcels; i++)
				if (s->lay[li].ml.parcels[i].dst_rank == k->dst_rank)
					len = s->lay[li].ml.parcels[i].wire_bytes;
	for (uint32_t i = 0; i < np; i++) {
		snprintf(host, sizeof(host), "h%u", s->ranks[peers[i]].host);
		json_array_append_new(srcs, source_json(true, s->ranks[peers[i]].id, host,
							peers[i] + 1, len));
	}
	json_array_append_new(srcs, source_json(false, "trainer", "trainer", 0, len));
	free(peers);
	return json_pack("{s:o,s:o}", "members", members, "sources", srcs);
fail:
	free(peers);
	json_decref(members);
	json_decref(srcs);
	return NULL;
}

static int ask_sources(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg)
{
	struct rank *rk = ctx;
	struct sim *s = (struct sim *)rk->x.o.hooks.agent;
	struct sources_req *q = malloc(sizeof(*q));

	if (q == NULL)
		return -ENOMEM;
	*q = (struct sources_req){cb, arg, *k};
	s->r->v[s->vi].tracker_requests++;
	push(s, (struct ev){.t = sim_clock_ns + 2 * latency(s), .kind = E_SOURCES,
			    .a = (uint32_t)(rk - s->ranks), .p = q});
	return 0;
}

static void on_sources_due(struct sim *s, struct ev *e)
{
	struct sources_req *q = e->p;
	json_t *j = sources_answer(s, &q->k);
	struct trk_answer a = {.status = j != NULL ? 200 : 503, .json = j, .error = "no memory"};

	q->cb(&a, q->arg);
	json_decref(j);
	free(q);
}

/* ---- links and CPUs: the transport ----------------------------------------- */

static struct sim *sim_of(struct fetcher *x)
{
	return (struct sim *)x->o.hooks.agent;
}

/* The rank a source is (peers' ids are "R<host>/<rank>", their key the
 * rank's index + 1); UINT32_MAX: the publisher. */
static uint32_t source_rank(const struct fetch_source *src)
{
	return src->info.peer ? (uint32_t)src->info.key - 1 : UINT32_MAX;
}

/* A read crosses its source's uplink, then its reader's downlink: each a
 * queue served in order at its rate. The downlink takes reads in the order
 * their uplinks finish (E_UPLINK), and a chunk flows through both at once
 * (cut-through): it is done when its uplink is and its downlink has moved
 * it after what came before. */
static int tx_read(void *ctx, struct fetcher *x, struct fetch_read *rd, struct fetch_source *src,
		   uint32_t len)
{
	struct sim *s = ctx;
	struct rank *rk = proto_container_of(x, struct rank, x);
	uint32_t from = source_rank(src);
	uint64_t t = sim_clock_ns + latency(s);
	struct ev e = {.kind = E_UPLINK, .a = (uint32_t)(rk - s->ranks),
		       .b = (uint32_t)(rd - x->reads), .gen = x->gen, .len = len};
	struct host *up;

	if (from == UINT32_MAX) {
		up = &s->hosts[s->max_hosts]; /* the trainer */
		s->r->v[s->vi].trainer_bytes += len;
	} else {
		up = &s->hosts[s->ranks[from].host];
	}
	if (!up->alive) { /* a host that is gone: the connection fails */
		e.kind = E_READ;
		e.t = t + latency(s);
		e.status = -EIO;
		push(s, e);
		return 0;
	}
	e.t0 = PROTO_MAX(t, up->up_free);
	e.t = up->up_free = e.t0 + ns_of(len / up->up_bps);
	if (from == UINT32_MAX)
		s->r->v[s->vi].trainer_s = (double)(e.t - s->v_start) / 1e9;
	push(s, e);
	return 0;
}

static void on_uplink(struct sim *s, struct ev *e)
{
	struct host *me = &s->hosts[s->ranks[e->a].host];
	uint64_t start = PROTO_MAX(e->t0, me->down_free);

	me->down_free = PROTO_MAX(e->t, start + ns_of(e->len / me->down_bps));
	e->kind = E_READ;
	e->t = me->down_free + latency(s);
	push(s, *e);
}

static void tx_verify(void *ctx, struct fetcher *x, struct fetch_read *rd)
{
	struct sim *s = ctx;
	struct rank *rk = proto_container_of(x, struct rank, x);

	rk->cpu_free = PROTO_MAX(rk->cpu_free, sim_clock_ns) + ns_of(rd->len * s->c->cpu_ns_per_byte / 1e9);
	push(s, (struct ev){.t = rk->cpu_free, .kind = E_VERIFIED, .a = (uint32_t)(rk - s->ranks),
			    .b = (uint32_t)(rd - x->reads), .gen = rd->gen});
}

static void on_read_done(struct sim *s, const struct ev *e)
{
	struct fetcher *x = &s->ranks[e->a].x;
	struct fetch_read *rd = &x->reads[e->b];
	uint32_t n = PROTO_MAX(rd->run, 1u);

	for (uint32_t k = 0; k < n; k++) /* as reads.c's on_read: each chunk lands */
		fetch_read_landed(&x->reads[e->b + k], e->status);
}

static void on_verified(struct sim *s, const struct ev *e)
{
	struct fetcher *x = &s->ranks[e->a].x;
	struct fetch_read *rd = &x->reads[e->b];

	if (rd->busy && rd->gen == e->gen)
		fetch_read_verified(rd, true);
}

/* ---- have-pages --------------------------------------------------------------- */

/* Reads the pages of the peers rk lists for each parcel, as they are now,
 * and hands them to the fetcher as node/swarm/have.c does an answer. */
static void read_pages(struct sim *s, struct rank *rk)
{
	struct fetch *f = rk->x.f;
	uint64_t now = node_now_ms();

	for (uint32_t pi = 0; f != NULL && pi < f->nparcels; pi++) {
		struct fetch_parcel *p = &f->parcels[pi];
		uint32_t n = p->mp->nchunks, bl = (n + 7) / 8, read = 0;
		if (p->done == n)
			continue;
		for (size_t k = 0; k < p->nsrcs; k++) {
			struct fetch_source *src = &p->srcs[k];
			uint32_t from = source_rank(src);
			struct proto_have h;
			struct proto_err err;
			if (!src->info.peer || src->self || src->bad_until_ms > now ||
			    fetch_banned(f, src->info.id) || from >= s->nranks)
				continue;
			const struct rank *pr = &s->ranks[from];
			const struct fetch *pf = pr->x.f;
			if (!s->hosts[pr->host].alive || pf == NULL || pf->version != f->version ||
			    pi >= pf->nparcels || pf->parcels[pi].held == NULL) {
				fetch_source_failed(&rk->x, src);
				continue;
			}
			if (proto_have_parse(pf->parcels[pi].held, proto_have_bytes(n), &h, &err) != 0)
				continue;
			if (src->have == NULL && (src->have = malloc(2 * (size_t)bl)) == NULL)
				continue;
			memcpy(src->have, h.have, bl);
			memcpy(src->have + bl, h.busy, bl);
			src->have_ms = src->have_page_ms = now;
			fetch_source_answered(src, now);
			if (h.upload_peers != src->up_peers || h.upload_mbps != src->up_mbps) {
				src->up_peers = h.upload_peers;
				src->up_mbps = h.upload_mbps;
				fetch_budget_share(&rk->x, p, src);
			}
			read++;
		}
		if (read > 0)
			fetch_recount(f, p);
	}
}

/* ---- a rank's version ------------------------------------------------------- */

static void hook_complete(void *agent)
{
	(void)agent; /* the tick after the verdict sees f->complete */
}

static void hook_sources_changed(void *swarm, uint32_t pi)
{
	struct rank *rk = swarm;

	(void)pi;
	read_pages(sim_of(&rk->x), rk); /* new peers: their pages now */
}

static void end_fetch(struct rank *rk)
{
	struct fetch *f = rk->x.f;

	if (f == NULL)
		return;
	fetch_end(&rk->x);
	for (uint32_t i = 0; i < f->nparcels; i++) {
		free(f->parcels[i].held);
		f->parcels[i].held = NULL;
	}
	fetch_free(&rk->x, f);
	rk->fetching = false;
}

static void start_fetch(struct sim *s, struct rank *rk)
{
	struct layout *L = &s->lay[rk->layout];
	struct sim_version *sv = &s->r->v[s->vi];
	struct proto_err err;
	struct fetch *f;

	end_fetch(rk);
	if ((f = fetch_new(s->vi + 1)) == NULL) {
		s->failed = -ENOMEM;
		return;
	}
	f->man.version = s->vi + 1;
	f->man.chunk_size = s->chunk;
	f->ml = &L->ml;
	f->plan = &L->plan;
	f->delta = sv->delta;
	/* Fresh: no peer can hold what we own before STARVE_MS (agent's rule). */
	uint64_t age = (sim_clock_ns - s->v_start) / 1000000;
	f->fresh_until_ms = age < STARVE_MS ? node_now_ms() + (STARVE_MS - age) : 0;
	if (fetch_parcels(&rk->x, f, &err) != 0) {
		LOG_ERR("sim: %s: %s", rk->id, err.msg);
		s->failed = -EINVAL;
		fetch_free(&rk->x, f);
		return;
	}
	for (uint32_t i = 0; i < f->nparcels; i++) {
		struct fetch_parcel *p = &f->parcels[i];
		size_t len = proto_have_bytes(p->mp->nchunks);
		uint64_t mbps = proto_param(PROTO_PARAM_UPLOAD_MBPS);
		if ((p->held = calloc(1, len)) == NULL ||
		    proto_have_init(p->held, len, f->version, p->mp->nchunks, p->mp->src_rank,
				    p->mp->dst_rank) != 0) {
			s->failed = -ENOMEM;
			return;
		}
		proto_have_set_budget(p->held, proto_param(PROTO_PARAM_UPLOAD_PEERS),
				      mbps == 0 ? 0 : PROTO_MAX(mbps / f->nparcels, 1));
		p->progress_ms = node_now_ms();
	}
	fetch_begin(&rk->x, f);
	rk->fetching = true;
	for (uint32_t pi = 0; pi < f->nparcels; pi++)
		fetch_want_sources(&rk->x, pi);
}

static void rank_tick(struct sim *s, struct rank *rk)
{
	struct fetch *f = rk->x.f;
	uint64_t now = node_now_ms();

	if (!s->hosts[rk->host].alive)
		return; /* gone: its ticks end */
	push(s, (struct ev){.t = sim_clock_ns + s->tick_ns, .kind = E_TICK,
			    .a = (uint32_t)(rk - s->ranks)});
	if (f == NULL || !rk->fetching)
		return;
	if (!f->complete) {
		for (uint32_t pi = 0; pi < f->nparcels; pi++) {
			struct fetch_parcel *p = &f->parcels[pi];
			bool peers = false;
			for (size_t k = 0; k < p->nsrcs; k++)
				peers |= p->srcs[k].info.peer && !p->srcs[k].self;
			if (p->done < p->mp->nchunks &&
			    now - p->sources_ms >= fetch_sources_gap(f, p, peers, now))
				fetch_want_sources(&rk->x, pi);
		}
		if (rk->x.fanout)
			read_pages(s, rk);
		fetch_tick(&rk->x);
	}
	fetch_pump(&rk->x);
}

/* ---- replicas --------------------------------------------------------------- */

static int add_replica(struct sim *s, uint32_t layout)
{
	uint32_t tp = s->lay[layout].l.nranks, hi = s->nhosts;
	struct host *h;

	if (s->nhosts == s->max_hosts || s->nranks + tp > s->max_ranks)
		return -ENOSPC;
	h = &s->hosts[s->nhosts++];
	bool slow = rnd01(s) < s->c->stragglers;
	double bps = s->c->link_bps / (slow ? 10 : 1);
	*h = (struct host){.up_bps = bps, .down_bps = bps, .layout = layout, .rank0 = s->nranks,
			   .alive = true, .joined = true, .slow = slow};
	for (uint32_t r = 0; r < tp; r++) {
		struct rank *rk = &s->ranks[s->nranks++];
		rk->host = hi;
		rk->rank = r;
		rk->layout = layout;
		snprintf(rk->id, sizeof(rk->id), "R%u/%u", hi, r);
		struct fetcher_opts o = {.id = rk->id, .rank = r, .layout = &s->lay[layout].l,
					 .sources = ask_sources, .sources_ctx = rk, .am = &s->am,
					 .tx = &s->tx,
					 .hooks = {.swarm = rk, .sources_changed = hook_sources_changed,
						   .agent = s, .complete = hook_complete}};
		rk->x.o = o;
		rk->x.fanout = !s->c->star;
		rk->x.chunk_size = s->chunk;
		rk->x.max_inflight = (uint32_t)PROTO_MAX(1, PROTO_MIN(proto_param(PROTO_PARAM_INFLIGHT), 256));
		rk->x.nreads = 2 * rk->x.max_inflight;
		rk->x.reads = calloc(rk->x.nreads, sizeof(*rk->x.reads));
		if (rk->x.reads == NULL)
			return -ENOMEM;
		rk->tick_phase = rnd(s) % s->tick_ns;
		push(s, (struct ev){.t = sim_clock_ns + rk->tick_phase, .kind = E_TICK,
				    .a = (uint32_t)(rk - s->ranks)});
	}
	return 0;
}

/* ---- versions ----------------------------------------------------------------- */

/* The bytes a replica of layout li receives for the version. */
static uint64_t replica_wire(const struct layout *L)
{
	uint64_t b = 0;

	for (uint32_t i = 0; i < L->ml.nparcels; i++)
		b += L->ml.parcels[i].wire_bytes;
	return b;
}

static double expected_s(const struct sim *s)
{
	return (double)replica_wire(&s->lay[0]) / s->c->link_bps;
}

static void version_begin(struct sim *s, uint32_t vi)
{
	struct sim_version *sv = &s->r->v[vi];

	s->vi = vi;
	s->r->nversions = vi + 1;
	sv->delta = vi > 0;
	for (uint32_t li = 0; li < s->nlay; li++)
		if (manifest(s, &s->lay[li], sv->delta) != 0) {
			s->failed = -ENOMEM;
			return;
		}
	sv->wire_bytes = replica_wire(&s->lay[0]);
	s->v_start = sim_clock_ns;
	s->v_live = true;
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		struct host *h = &s->hosts[hi];
		h->done_ns = 0;
		h->stayed = h->alive;
		h->left_done = s->lay[h->layout].l.nranks;
	}
	/* Each rank hears of it within 0-20 ms (the tracker's watch answers). */
	for (uint32_t i = 0; i < s->nranks; i++)
		if (s->hosts[s->ranks[i].host].alive)
			at(s, sim_clock_ns + rnd(s) % 20000000, E_START, i, 0);
	/* Churn: a share leaves and as many join, spread over the expected time. */
	uint32_t moves = (uint32_t)llround(s->c->churn * s->c->replicas);
	for (uint32_t i = 0; i < moves; i++) {
		uint64_t when = sim_clock_ns + (uint64_t)(rnd01(s) * ns_of(expected_s(s)));
		at(s, when, E_LEAVE, (uint32_t)(rnd(s) % s->nhosts), 0);
		at(s, sim_clock_ns + (uint64_t)(rnd01(s) * ns_of(expected_s(s))), E_JOIN, 0, 0);
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The version ends when every live replica has it: its figures, then the
 * next version's export a second later. */
static void version_check(struct sim *s)
{
	struct sim_version *sv = &s->r->v[s->vi];
	double *t;
	uint32_t n = 0;

	if (!s->v_live)
		return;
	for (uint32_t hi = 0; hi < s->nhosts; hi++)
		if (s->hosts[hi].alive && s->hosts[hi].done_ns == 0)
			return;
	s->v_live = false;
	if ((t = calloc(s->nhosts + 1, sizeof(*t))) == NULL) {
		s->failed = -ENOMEM;
		return;
	}
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		const struct host *h = &s->hosts[hi];
		sv->done += h->done_ns != 0;
		double ht = (double)(h->done_ns - s->v_start) / 1e9;
		if (!h->stayed || !h->alive || h->done_ns == 0)
			continue;
		sv->stayed++;
		if (h->slow)
			sv->t_slow_s = PROTO_MAX(sv->t_slow_s, ht);
		else
			t[n++] = ht;
	}
	qsort(t, n, sizeof(*t), cmp_double);
	if (n > 0) {
		sv->t_last_s = t[n - 1];
		sv->t_p50_s = t[(n - 1) / 2];
		sv->t_p99_s = t[(uint32_t)floor(0.99 * (n - 1))];
	}
	sv->span_s = (double)(sim_clock_ns - s->v_start) / 1e9;
	for (uint32_t i = 0; i < s->nranks; i++) {
		const struct fetch *f = s->ranks[i].x.f;
		if (f != NULL && f->version == s->vi + 1) {
			sv->duplicate_bytes += f->duplicate;
			sv->received_bytes += f->bytes_done;
		}
	}
	free(t);
	if (s->vi + 1 < s->c->versions)
		at(s, sim_clock_ns + 1000000000ull, E_VERSION, s->vi + 1, 0);
}

static void rank_progress(struct sim *s, struct rank *rk)
{
	struct host *h = &s->hosts[rk->host];
	const struct fetch *f = rk->x.f;

	if (!s->v_live || f == NULL || !f->complete || f->version != s->vi + 1 || h->done_ns != 0 ||
	    rk->fetching == false)
		return;
	/* Counted once per rank: its ready flag is the fetch's completeness. */
	uint32_t left = 0;
	for (uint32_t r = 0; r < s->lay[h->layout].l.nranks; r++) {
		const struct fetch *g = s->ranks[h->rank0 + r].x.f;
		left += g == NULL || g->version != s->vi + 1 || !g->complete;
	}
	if (left > 0)
		return;
	h->done_ns = sim_clock_ns;
	if (s->c->curve != NULL)
		fprintf(s->c->curve, "%u %u %.4f\n", s->vi + 1, rk->host,
			(double)(sim_clock_ns - s->v_start) / 1e9);
	version_check(s);
}

/* ---- the run ----------------------------------------------------------------- */

/* Where a run that did not finish stands, a line per rank still fetching
 * (the first few): what it holds, reads, and could read from. */
static void stuck_report(struct sim *s)
{
	uint32_t said = 0;
	uint64_t now = node_now_ms();

	for (uint32_t i = 0; i < s->nranks && said < 8; i++) {
		struct rank *rk = &s->ranks[i];
		const struct fetch *f = rk->x.f;
		if (!s->hosts[rk->host].alive || f == NULL || f->complete)
			continue;
		for (uint32_t pi = 0; pi < f->nparcels; pi++) {
			const struct fetch_parcel *p = &f->parcels[pi];
			uint32_t st[4] = {0}, usable = 0, mine = 0;
			for (uint32_t c = 0; c < p->mp->nchunks; c++) {
				st[p->state[c] & 3]++;
				mine += p->mine[c] && p->state[c] != CHUNK_DONE;
			}
			for (size_t k = 0; k < p->nsrcs; k++)
				usable += fetch_source_usable(&rk->x, f, &p->srcs[k], now);
			LOG_ERR("sim: %s parcel %u: %u todo, %u reading, %u verifying, %u done (%u of "
				"ours left); %u reads out; %u of %zu sources usable; hungry %d seed %d",
				rk->id, pi, st[CHUNK_TODO], st[CHUNK_READING], st[CHUNK_VERIFYING],
				st[CHUNK_DONE], mine, rk->x.inflight, usable, p->nsrcs, p->hungry, p->seed);
		}
		said++;
	}
}

void sim_cfg_default(struct sim_cfg *c)
{
	*c = (struct sim_cfg){.replicas = 8, .tp = {1}, .ntp = 1, .model_bytes = 128ull << 20,
			      .versions = 1, .delta_ratio = 0.01, .link_bps = 100e6 / 8,
			      .trainer_bps = 100e6 / 8, .latency_ms = 0.1, .cpu_ns_per_byte = 1.0,
			      .seed = 1, .max_sim_s = 3600};
}

static void dispatch(struct sim *s, struct ev *e)
{
	struct rank *rk = e->kind == E_LEAVE || e->kind == E_JOIN || e->kind == E_VERSION
				  ? NULL
				  : &s->ranks[e->a];

	switch (e->kind) {
	case E_VERSION:
		version_begin(s, e->a);
		break;
	case E_START:
		if (s->hosts[rk->host].alive)
			start_fetch(s, rk);
		break;
	case E_TICK:
		rank_tick(s, rk);
		rank_progress(s, rk);
		break;
	case E_SOURCES:
		on_sources_due(s, e);
		break;
	case E_UPLINK:
		on_uplink(s, e);
		break;
	case E_READ:
		on_read_done(s, e);
		rank_progress(s, rk);
		break;
	case E_VERIFIED:
		on_verified(s, e);
		rank_progress(s, rk);
		break;
	case E_LEAVE: {
		struct host *h = &s->hosts[e->a];
		if (!h->alive)
			break;
		h->alive = false;
		h->stayed = false;
		for (uint32_t r = 0; r < s->lay[h->layout].l.nranks; r++)
			end_fetch(&s->ranks[h->rank0 + r]);
		version_check(s);
		break;
	}
	case E_JOIN: {
		uint32_t li = s->nhosts % s->nlay, first = s->nranks;
		if (add_replica(s, li) != 0)
			break;
		s->hosts[s->nhosts - 1].stayed = false; /* joined late: not in the figures */
		s->hosts[s->nhosts - 1].left_done = s->lay[li].l.nranks;
		for (uint32_t i = first; i < s->nranks; i++)
			start_fetch(s, &s->ranks[i]);
		break;
	}
	}
}

static void sim_free(struct sim *s)
{
	while (s->h.n > 0) {
		struct ev e = pop(s);
		if (e.kind != E_SOURCES)
			continue;
		/* The fetcher frees its request record on the answer. */
		struct sources_req *q = e.p;
		struct trk_answer a = {.status = 503, .error = "the simulation is over"};
		q->cb(&a, q->arg);
		free(q);
	}
	for (uint32_t i = 0; i < s->nranks; i++) {
		end_fetch(&s->ranks[i]);
		fetch_hosts_fini(&s->ranks[i].x);
		fetch_wires_fini(&s->ranks[i].x);
		json_decref(s->ranks[i].x.members_memo);
		free(s->ranks[i].x.reads);
	}
	for (uint32_t i = 0; i < s->nlay; i++) {
		free(s->lay[i].ml.parcels);
		free(s->lay[i].chunks);
		proto_plan_fini(&s->lay[i].plan);
		proto_layout_fini(&s->lay[i].l);
	}
	proto_layout_fini(&s->trainer);
	proto_model_fini(&s->model);
	free(s->h.v);
	free(s->hosts);
	free(s->ranks);
}

int sim_run(const struct sim_cfg *c, struct sim_result *r, struct proto_err *err)
{
	struct sim s = {.c = c, .r = r, .rng = c->seed};
	uint32_t tpmax = 1;
	int rc;

	memset(r, 0, sizeof(*r));
	if (c->replicas == 0 || c->ntp == 0 || c->ntp > SIM_LAYOUTS_MAX || c->versions == 0 ||
	    c->versions > SIM_VERSIONS_MAX || !(c->link_bps > 0) || !(c->trainer_bps > 0))
		return proto_errf(err, EINVAL, "sim: want replicas, 1-%d layouts, 1-%d versions and "
				  "positive link rates", SIM_LAYOUTS_MAX, SIM_VERSIONS_MAX);
	uint64_t t0 = proto_now_ns();
	sim_clock_ns = 1000000000ull; /* a second in: node_now_ms() - x stays positive */
	proto_clock_set(sim_now);
	s.chunk = (uint32_t)PROTO_MIN(proto_param(PROTO_PARAM_CHUNK_SIZE), PROTO_CHUNK_SIZE_MAX);
	s.tick_ns = proto_param(PROTO_PARAM_HAVE_POLL_MS) * 1000000ull;
	s.tx = (struct fetch_transport){.ctx = &s, .read = tx_read, .verify = tx_verify};
	for (uint32_t i = 0; i < c->ntp; i++)
		tpmax = PROTO_MAX(tpmax, c->tp[i]);
	uint32_t joins = (uint32_t)llround(c->churn * c->replicas) * c->versions;
	s.max_hosts = c->replicas + joins;
	s.max_ranks = s.max_hosts * tpmax;
	s.hosts = calloc(s.max_hosts + 1, sizeof(*s.hosts)); /* + the trainer */
	s.ranks = calloc(s.max_ranks, sizeof(*s.ranks));
	if (s.hosts == NULL || s.ranks == NULL) {
		rc = proto_errf(err, ENOMEM, "sim: no memory for %u replicas", s.max_hosts);
		goto out;
	}
	s.hosts[s.max_hosts] = (struct host){.up_bps = c->trainer_bps, .alive = true};
	if ((rc = setup_model(&s, err)) != 0)
		goto out;
	for (uint32_t i = 0; i < c->replicas; i++)
		if ((rc = add_replica(&s, i % s.nlay)) != 0) {
			proto_errf(err, ENOMEM, "sim: no memory for replica %u", i);
			goto out;
		}
	at(&s, sim_clock_ns, E_VERSION, 0, 0);
	uint64_t limit = sim_clock_ns + ns_of(c->max_sim_s);
	while (s.h.n > 0 && s.failed == 0) {
		struct ev e = pop(&s);
		if (e.t > limit) {
			stuck_report(&s);
			rc = proto_errf(err, ETIMEDOUT, "sim: v%u not done after %.0f s simulated "
					"(%u of %u replicas done)", s.vi + 1, c->max_sim_s,
					r->v[s.vi].done, s.nhosts);
			goto out;
		}
		sim_clock_ns = e.t;
		r->events++;
		dispatch(&s, &e);
		if (!s.v_live && s.vi + 1 == c->versions && r->nversions == c->versions)
			break;
	}
	rc = s.failed != 0 ? proto_errf(err, -s.failed, "sim: out of memory") : 0;
	if (rc == 0 && (r->nversions != c->versions || s.v_live))
		rc = proto_errf(err, EPROTO, "sim: stopped at v%u", s.vi + 1);
out:
	sim_free(&s);
	proto_clock_set(NULL);
	r->wall_s = (double)(proto_now_ns() - t0) / 1e9;
	return rc;
}

void sim_line(const struct sim_cfg *c, const struct sim_result *r, uint32_t v, char *out,
	      size_t cap)
{
	const struct sim_version *sv = &r->v[v];
	double sb = (double)sv->wire_bytes / c->link_bps;
	char lay[64] = "", slow[64] = "";
	size_t o = 0;

	if (sv->t_slow_s > 0)
		snprintf(slow, sizeof(slow), " stragglers=%.2f (at b/10: %.2f)", sv->t_slow_s / sb,
			 sv->t_slow_s / sb / 10);

	for (uint32_t i = 0; i < c->ntp; i++)
		o += (size_t)snprintf(lay + o, sizeof(lay) - PROTO_MIN(o, sizeof(lay)), "%stp%u",
				      i ? "/" : "", c->tp[i]);
	snprintf(out, cap,
		 "N=%u %s %s%s: T/(S/b)=%.2f p50=%.2f p99=%.2f trainer_upload/S=%.2f dup=%.1f%% "
		 "tracker_req/s=%.0f%s",
		 c->replicas, lay, sv->delta ? "delta" : "anchor", c->star ? " star" : "",
		 sv->t_last_s / sb, sv->t_p50_s / sb, sv->t_p99_s / sb,
		 (double)sv->trainer_bytes / (double)sv->wire_bytes,
		 sv->received_bytes ? 100.0 * (double)sv->duplicate_bytes / (double)sv->received_bytes : 0,
		 sv->span_s > 0 ? (double)sv->tracker_requests / sv->span_s : 0, slow);
}
