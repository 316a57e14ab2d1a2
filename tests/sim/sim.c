/* The fanout simulator (tests/sim/sim.h): the model and its layouts,
 * replicas and their ranks' fetchers, versions, churn, and the run; what
 * it replaces (links, CPUs, have-page reads, the tracker) is sim_net.c. */
#include "tests/sim/sim_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "node/agent/internal.h" /* REPORT_MS: how often a rank reports progress */
#include "node/fetch/fetch.h"
#include "node/fetch/picker.h"
#include "proto/have.h"
#include "proto/log.h"
#include "proto/plan.h"
#include "proto/spec.h"

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

/* A parcel's bytes on the wire: the anchor's all, a delta's delta_ratio
 * of them (a byte at least). */
static uint64_t wire_of(const struct sim *s, uint64_t bytes, bool delta)
{
	return delta ? PROTO_MAX((uint64_t)llround((double)bytes * s->c->delta_ratio), 1) : bytes;
}

/* L's manifest parcels for the current version: the anchor's raw, a
 * delta's encoded. Chunk hashes are not checked here (the verifier is
 * modelled), so they stay zero. */
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
	for (uint32_t i = 0; i < pl->nparcels; i++)
		nchunks += (uint32_t)((wire_of(s, pl->parcels[i].bytes, delta) + s->chunk - 1) / s->chunk);
	L->chunks = calloc(PROTO_MAX(nchunks, 1), sizeof(*L->chunks));
	if (L->ml.parcels == NULL || L->chunks == NULL)
		return -ENOMEM;
	struct proto_chunk *ch = L->chunks;
	for (uint32_t i = 0; i < pl->nparcels; i++) {
		struct proto_mparcel *mp = &L->ml.parcels[i];
		uint64_t bytes = pl->parcels[i].bytes;
		uint64_t wire = wire_of(s, bytes, delta);
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

/* ---- a rank's version ------------------------------------------------------- */

static void hook_sources_changed(void *swarm, uint32_t pi)
{
	struct rank *rk = swarm;

	(void)pi;
	sim__read_pages((struct sim *)rk->x.o.hooks.agent, rk); /* new peers: their pages now */
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
	uint64_t age = (sim__clock_ns - s->v_start) / 1000000;
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
	rk->fetch_ns = sim__clock_ns;
	rk->rate = (struct trk_rate){0};
	trk__rate_sample(&rk->rate, node_now_ms(), 0);
	rk->report_ms = node_now_ms();
	for (uint32_t pi = 0; pi < f->nparcels; pi++)
		fetch_want_sources(&rk->x, pi);
}

static void rank_tick(struct sim *s, struct rank *rk)
{
	struct fetch *f = rk->x.f;
	uint64_t now = node_now_ms();

	if (!s->hosts[rk->host].alive)
		return; /* gone: its ticks end */
	sim__push(s, (struct ev){.t = sim__clock_ns + s->tick_ns, .kind = E_TICK,
			    .a = (uint32_t)(rk - s->ranks)});
	if (f == NULL || !rk->fetching)
		return;
	if (!f->complete && now - rk->report_ms >= REPORT_MS) {
		/* Its progress report, as tracker/server/nodes.c takes it. */
		if (trk__rate_sample(&rk->rate, now, f->bytes_done) &&
		    s->hosts[rk->host].fetch_bps == 0)
			s->rates_new = true;
		rk->report_ms = now;
	}
	/* The tracker's sweep (registry.c): members chosen again. */
	if (trk__members_rejudge(&s->rates_new, &s->rates_judged_ms, now))
		s->members_gen++;
	if (!f->complete) {
		/* As the swarm's tick: sources asked again, pages read. */
		for (uint32_t pi = 0; pi < f->nparcels && rk->x.fanout; pi++)
			fetch_sources_refresh(&rk->x, pi, now);
		if (rk->x.fanout)
			sim__read_pages(s, rk);
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
	bool slow = sim__rnd01(s) < s->c->stragglers;
	double bps = s->c->link_bps / (slow ? 10 : 1);
	*h = (struct host){.up_bps = bps, .down_bps = bps, .layout = layout, .rank0 = s->nranks,
			   .alive = true, .slow = slow,
			   .site = s->c->sites > 1 ? hi % s->c->sites : 0};
	s->members_gen++;
	for (uint32_t r = 0; r < tp; r++) {
		struct rank *rk = &s->ranks[s->nranks++];
		rk->host = hi;
		rk->rank = r;
		rk->layout = layout;
		snprintf(rk->id, sizeof(rk->id), "R%u/%u", hi, r);
		if (r == 0) { /* the replica's name, "R<host>" */
			char name[24];
			snprintf(name, sizeof(name), "R%u", hi);
			h->weight = trk_member_weight(name, s->lay[layout].l.digest);
		}
		struct fetcher_opts o = {.id = rk->id, .rank = r, .layout = &s->lay[layout].l,
					 .sources = sim__ask_sources, .sources_ctx = rk, .am = &s->am,
					 .tx = &s->tx,
					 .hooks = {.swarm = rk, .sources_changed = hook_sources_changed,
						   .agent = s}};
		rk->x.o = o;
		rk->x.fanout = !s->c->star;
		fetch_pool_size(&rk->x);
		rk->x.reads = calloc(rk->x.nreads, sizeof(*rk->x.reads));
		if (rk->x.reads == NULL)
			return -ENOMEM;
		sim__push(s, (struct ev){.t = sim__clock_ns + sim__rnd(s) % s->tick_ns, .kind = E_TICK,
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

/* Counts the copies of layout 0's parcel 0 afresh (sim_spread). */
static int spread_begin(struct sim *s)
{
	struct sim_spread *sp = &s->spread;
	uint32_t n = s->lay[0].ml.parcels[0].nchunks;

	sp->nchunks = 0;
	if (n > sp->cap) {
		struct sim_chunk_spread *c = realloc(sp->c, n * sizeof(*c));
		if (c == NULL)
			return -ENOMEM;
		sp->c = c;
		sp->cap = n;
	}
	memset(sp->c, 0, n * sizeof(*sp->c));
	sp->nchunks = n;
	sp->want = 0;
	for (uint32_t hi = 0; hi < s->nhosts; hi++)
		sp->want += s->hosts[hi].alive && s->hosts[hi].layout == 0 && !s->hosts[hi].slow;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The median over the chunks that reached half (all: every one) of the
 * replicas of the time from their first copy, in chunk times at b; 0:
 * none did. t: room for a value per chunk. */
static double spread_median(const struct sim *s, bool all, double *t)
{
	const struct sim_spread *sp = &s->spread;
	double tau = (double)s->chunk / s->c->link_bps;
	uint32_t n = 0;

	for (uint32_t c = 0; c < sp->nchunks; c++) {
		uint64_t at = all ? sp->c[c].all : sp->c[c].half;
		if (at != 0)
			t[n++] = (double)(at - sp->c[c].first) / 1e9 / tau;
	}
	if (n == 0)
		return 0;
	qsort(t, n, sizeof(*t), cmp_double);
	return t[(n - 1) / 2];
}

static void version_begin(struct sim *s, uint32_t vi)
{
	struct sim_version *sv = &s->r->v[vi];

	s->vi = vi;
	s->r->nversions = vi + 1;
	sv->delta = vi > 0 && !s->c->anchors;
	s->members_gen++; /* the tracker chooses members afresh per version */
	for (uint32_t li = 0; li < s->nlay; li++)
		if (manifest(s, &s->lay[li], sv->delta) != 0) {
			s->failed = -ENOMEM;
			return;
		}
	sv->wire_bytes = replica_wire(&s->lay[0]);
	s->v_start = sim__clock_ns;
	s->v_live = true;
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		struct host *h = &s->hosts[hi];
		h->done_ns = 0;
		h->down_busy_ns = 0;
		h->stayed = h->alive;
	}
	if (spread_begin(s) != 0) {
		s->failed = -ENOMEM;
		return;
	}
	/* Each rank hears of it within 0-20 ms (the tracker's watch answers). */
	for (uint32_t i = 0; i < s->nranks; i++)
		if (s->hosts[s->ranks[i].host].alive)
			sim__at(s, sim__clock_ns + sim__rnd(s) % 20000000, E_START, i, 0);
	/* Churn: a share leaves and as many join, spread over the expected time. */
	uint32_t moves = (uint32_t)llround(s->c->churn * s->c->replicas);
	for (uint32_t i = 0; i < moves; i++) {
		uint64_t when = sim__clock_ns + (uint64_t)(sim__rnd01(s) * sim__ns(expected_s(s)));
		sim__at(s, when, E_LEAVE, (uint32_t)(sim__rnd(s) % s->nhosts), 0);
		sim__at(s, sim__clock_ns + (uint64_t)(sim__rnd01(s) * sim__ns(expected_s(s))), E_JOIN, 0, 0);
	}
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
	if ((t = calloc(PROTO_MAX(s->nhosts, s->spread.nchunks) + 1, sizeof(*t))) == NULL) {
		s->failed = -ENOMEM;
		return;
	}
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		const struct host *h = &s->hosts[hi];
		sv->done += h->done_ns != 0;
		if (!h->stayed || !h->alive || h->done_ns == 0)
			continue;
		double ht = (double)(h->done_ns - s->v_start) / 1e9;
		sv->stayed++;
		if (h->slow) {
			sv->t_slow_s = PROTO_MAX(sv->t_slow_s, ht);
			continue;
		}
		t[n++] = ht;
		sv->down_idle += ht - (double)h->down_busy_ns / 1e9;
	}
	if (n > 0)
		sv->down_idle /= (double)n * (double)sv->wire_bytes / s->c->link_bps;
	qsort(t, n, sizeof(*t), cmp_double);
	if (n > 0) {
		sv->t_last_s = t[n - 1];
		sv->t_p50_s = t[(n - 1) / 2];
		sv->t_p99_s = t[(uint32_t)floor(0.99 * (n - 1))];
	}
	sv->span_s = (double)(sim__clock_ns - s->v_start) / 1e9;
	sv->spread_half = spread_median(s, false, t);
	sv->spread_all = spread_median(s, true, t);
	for (uint32_t i = 0; i < s->nranks; i++) {
		const struct fetch *f = s->ranks[i].x.f;
		if (f != NULL && f->version == s->vi + 1) {
			sv->duplicate_bytes += f->duplicate;
			sv->received_bytes += f->bytes_done;
		}
	}
	free(t);
	if (s->vi + 1 < s->c->versions)
		sim__at(s, sim__clock_ns + 1000000000ull, E_VERSION, s->vi + 1, 0);
}

static void rank_progress(struct sim *s, struct rank *rk)
{
	struct host *h = &s->hosts[rk->host];
	const struct fetch *f = rk->x.f;

	if (!s->v_live || f == NULL || !f->complete || f->version != s->vi + 1 || h->done_ns != 0 ||
	    rk->fetching == false)
		return;
	/* The replica is done when every rank's fetch is complete. */
	uint32_t left = 0;
	for (uint32_t r = 0; r < s->lay[h->layout].l.nranks; r++) {
		const struct fetch *g = s->ranks[h->rank0 + r].x.f;
		left += g == NULL || g->version != s->vi + 1 || !g->complete;
	}
	if (left > 0)
		return;
	h->done_ns = sim__clock_ns;
	/* The tracker's record of its rate (tracker/server/nodes.c): the last
	 * rank's, from its progress reports, its first one at its fetch's
	 * start. */
	h->fetch_bps = trk__fetch_bps(&rk->rate, f->bytes_total,
				      (sim__clock_ns - rk->fetch_ns) / 1000000);
	if (s->c->curve != NULL)
		fprintf(s->c->curve, "%u %u %.4f\n", s->vi + 1, rk->host,
			(double)(sim__clock_ns - s->v_start) / 1e9);
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
		sim__sources_due(s, e);
		break;
	case E_UPLINK:
		sim__uplink(s, e);
		break;
	case E_READ:
		sim__read_done(s, e);
		rank_progress(s, rk);
		break;
	case E_VERIFIED:
		sim__verified(s, e);
		rank_progress(s, rk);
		break;
	case E_LEAVE: {
		struct host *h = &s->hosts[e->a];
		if (!h->alive)
			break;
		h->alive = false;
		h->stayed = false;
		s->members_gen++;
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
		for (uint32_t i = first; i < s->nranks; i++)
			start_fetch(s, &s->ranks[i]);
		break;
	}
	}
}

static void sim_free(struct sim *s)
{
	while (s->h.n > 0) {
		struct ev e = sim__pop(s);
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
		fetch_reads_free(&s->ranks[i].x);
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
	sim__members_free(s);
	free(s->spread.c);
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
	    c->versions > SIM_VERSIONS_MAX || !(c->link_bps > 0) || !(c->trainer_bps > 0) ||
	    c->sites > SIM_SITES_MAX || !(c->wan_bps >= 0) || !(c->wan_latency_ms >= 0))
		return proto_errf(err, EINVAL, "sim: want replicas, 1-%d layouts, 1-%d versions, "
				  "at most %d sites and positive link rates", SIM_LAYOUTS_MAX,
				  SIM_VERSIONS_MAX, SIM_SITES_MAX);
	uint64_t t0 = proto_now_ns();
	sim__clock_ns = 1000000000ull; /* a second in: node_now_ms() - x stays positive */
	proto_clock_set(sim__now);
	s.tick_ns = proto_param(PROTO_PARAM_HAVE_POLL_MS) * 1000000ull;
	s.tx = (struct fetch_transport){.ctx = &s, .read = sim__tx_read, .verify = sim__tx_verify};
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
	s.chunk = s.ranks[0].x.chunk_size; /* every rank's read pool (fetch_pool_size) */
	sim__at(&s, sim__clock_ns, E_VERSION, 0, 0);
	uint64_t limit = sim__clock_ns + sim__ns(c->max_sim_s);
	while (s.h.n > 0 && s.failed == 0) {
		struct ev e = sim__pop(&s);
		if (e.t > limit) {
			stuck_report(&s);
			rc = proto_errf(err, ETIMEDOUT, "sim: v%u not done after %.0f s simulated "
					"(%u of %u replicas done)", s.vi + 1, c->max_sim_s,
					r->v[s.vi].done, s.nhosts);
			goto out;
		}
		sim__clock_ns = e.t;
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
	char lay[64] = "", slow[64] = "", sites[64] = "";
	size_t o = 0;

	if (sv->t_slow_s > 0)
		snprintf(slow, sizeof(slow), " stragglers=%.2f (at b/10: %.2f)", sv->t_slow_s / sb,
			 sv->t_slow_s / sb / 10);
	if (c->sites > 1) /* copies of S into each other site */
		snprintf(sites, sizeof(sites), " sites=%u wan/S=%.2f", c->sites,
			 (double)sv->wan_bytes / (double)sv->wire_bytes / (c->sites - 1));

	for (uint32_t i = 0; i < c->ntp; i++)
		o += (size_t)snprintf(lay + o, sizeof(lay) - PROTO_MIN(o, sizeof(lay)), "%stp%u",
				      i ? "/" : "", c->tp[i]);
	snprintf(out, cap,
		 "N=%u %s %s%s: T/(S/b)=%.2f p50=%.2f p99=%.2f trainer_upload/S=%.2f dup=%.1f%% "
		 "tracker_req/s=%.0f%s%s",
		 c->replicas, lay, sv->delta ? "delta" : "anchor", c->star ? " star" : "",
		 sv->t_last_s / sb, sv->t_p50_s / sb, sv->t_p99_s / sb,
		 (double)sv->trainer_bytes / (double)sv->wire_bytes,
		 sv->received_bytes ? 100.0 * (double)sv->duplicate_bytes / (double)sv->received_bytes : 0,
		 sv->span_s > 0 ? (double)sv->tracker_requests / sv->span_s : 0, sites, slow);
}
