/* What the simulator replaces (tests/sim/sim.h): the fabric and the
 * verifier (links and CPUs as queues), have-page reads, and the tracker's
 * /sources answers; and its events. */
#include "tests/sim/sim_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "node/fetch/picker.h"
#include "proto/have.h"

static bool ev_before(const struct ev *x, const struct ev *y)
{
	return x->t != y->t ? x->t < y->t : x->seq < y->seq;
}

uint64_t sim__clock_ns;

uint64_t sim__now(void)
{
	return sim__clock_ns;
}

uint64_t sim__rnd(struct sim *s)
{
	uint64_t z = (s->rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

double sim__rnd01(struct sim *s)
{
	return (double)(sim__rnd(s) >> 11) / 9007199254740992.0;
}

void sim__push(struct sim *s, struct ev e)
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

struct ev sim__pop(struct sim *s)
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

void sim__at(struct sim *s, uint64_t t, uint32_t kind, uint32_t a, uint32_t b)
{
	sim__push(s, (struct ev){.t = t, .kind = kind, .a = a, .b = b});
}

uint64_t sim__ns(double seconds)
{
	return seconds <= 0 ? 0 : (uint64_t)llround(seconds * 1e9);
}

uint64_t sim__latency(const struct sim *s)
{
	return sim__ns(s->c->latency_ms / 1e3);
}

/* ---- the tracker's /sources answers ------------------------------------------ */

static json_t *source_json(bool peer, const char *id, const char *host, uint32_t addr_id,
			   uint64_t len)
{
	char fa[9], key[24];

	snprintf(fa, sizeof(fa), "%08x", addr_id);
	snprintf(key, sizeof(key), "%u", addr_id);
	return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I}", "kind", peer ? "peer" : "publisher", "id",
			 id, "host", host, "provider", "sim", "fabric_addr", fa, "addr", "4096", "key",
			 key, "len", (json_int_t)len);
}

/* A swarm's members list as the tracker keeps it until a replica joins or
 * leaves (srcache.c): rank dst of the live replicas of layout li in the
 * site, the
 * ones that kept up in their last fetch (TESSERA_SWARM_SLOW), and of a
 * larger swarm the TESSERA_SWARM_MEMBERS of highest weight, chosen by the
 * tracker's own trk_members_pick. */
struct sim_members {
	uint32_t li, dst, site;
	uint64_t gen;
	json_t *list;
	bool cut; /* the swarm has more (answers say "members_cut") */
	struct sim_members *next;
};

void sim__members_free(struct sim *s)
{
	for (struct sim_members *m = s->members, *nx; m != NULL; m = nx) {
		nx = m->next;
		json_decref(m->list);
		free(m);
	}
	s->members = NULL;
}

static json_t *members_list(struct sim *s, uint32_t li, uint32_t dst, uint32_t site, bool *cut)
{
	struct sim_members *m;
	uint32_t *hs = NULL, n = 0;
	uint64_t *w = NULL, *bps = NULL;
	bool *keep = NULL;

	for (m = s->members; m != NULL && (m->li != li || m->dst != dst || m->site != site);
	     m = m->next)
		;
	if (m != NULL && m->gen == s->members_gen) {
		*cut = m->cut;
		return m->list;
	}
	if (m == NULL) {
		if ((m = calloc(1, sizeof(*m))) == NULL)
			return NULL;
		*m = (struct sim_members){.li = li, .dst = dst, .site = site, .next = s->members};
		s->members = m;
	}
	json_decref(m->list);
	m->list = json_array();
	hs = malloc((s->nhosts + 1) * sizeof(*hs));
	w = malloc((s->nhosts + 1) * sizeof(*w));
	bps = malloc((s->nhosts + 1) * sizeof(*bps));
	keep = malloc((s->nhosts + 1) * sizeof(*keep));
	if (m->list == NULL || hs == NULL || w == NULL || bps == NULL || keep == NULL)
		goto fail;
	for (uint32_t hi = 0; hi < s->nhosts; hi++)
		if (s->hosts[hi].alive && s->hosts[hi].site == site &&
		    memcmp(s->lay[s->hosts[hi].layout].l.digest, s->lay[li].l.digest,
			   PROTO_HASH_BYTES) == 0) {
			w[n] = s->hosts[hi].weight;
			/* member_rate (tracker/server/sources.c): its last
			 * fetch's, else the highest so far of the one under way. */
			bps[n] = s->hosts[hi].fetch_bps != 0
					 ? s->hosts[hi].fetch_bps
					 : s->ranks[s->hosts[hi].rank0 + dst].rate.peak_bps;
			hs[n++] = hi;
		}
	if (trk_members_pick(w, bps, n, (size_t)proto_param(PROTO_PARAM_SWARM_MEMBERS),
			     proto_param(PROTO_PARAM_SWARM_SLOW), keep, &m->cut) != 0)
		goto fail;
	*cut = m->cut;
	for (uint32_t i = 0; i < n; i++)
		if (keep[i] && json_array_append_new(m->list, json_string(
					s->ranks[s->hosts[hs[i]].rank0 + dst].id)) != 0)
			goto fail;
	m->gen = s->members_gen;
	free(hs);
	free(w);
	free(bps);
	free(keep);
	return m->list;
fail:
	json_decref(m->list);
	m->list = NULL;
	free(hs);
	free(w);
	free(bps);
	free(keep);
	return NULL;
}

/* The tracker's answer for k asked from site, as tracker/server/sources.c
 * builds it (and srcache.c renders it: a larger swarm's peers sampled):
 * the site's swarm, the publisher wherever it is. */
static json_t *sources_answer(struct sim *s, const struct trk_parcel_key *k, uint32_t site)
{
	json_t *members = NULL, *srcs = json_array(), *out;
	uint32_t *peers = calloc(s->nhosts + 1, sizeof(*peers)), np = 0, li = UINT32_MAX, show;
	uint64_t len = 0, cap = proto_param(PROTO_PARAM_SWARM_PEERS);
	char host[32];
	bool lay[SIM_LAYOUTS_MAX] = {0}; /* the layouts that are k's (a tp given twice) */
	bool cut = false;

	for (uint32_t i = 0; i < s->nlay; i++)
		if (memcmp(s->lay[i].l.digest, k->layout, PROTO_HASH_BYTES) == 0 &&
		    k->dst_rank < s->lay[i].l.nranks) {
			lay[i] = true;
			li = li == UINT32_MAX ? i : li;
		}
	if (srcs == NULL || peers == NULL || li == UINT32_MAX ||
	    (members = json_incref(members_list(s, li, k->dst_rank, site, &cut))) == NULL)
		goto fail;
	for (uint32_t hi = 0; hi < s->nhosts; hi++) {
		const struct host *h = &s->hosts[hi];
		const struct rank *rk = &s->ranks[h->rank0 + k->dst_rank];
		if (h->alive && h->site == site && lay[h->layout] && rk->fetching && rk->x.f != NULL &&
		    rk->x.f->version == k->version)
			peers[np++] = h->rank0 + k->dst_rank;
	}
	/* A fresh random order; past TESSERA_SWARM_PEERS, a sample. */
	show = cap != 0 && np > cap ? (uint32_t)cap : np;
	for (uint32_t i = 0; i < show && i + 1 < np; i++) {
		uint32_t j = i + (uint32_t)(sim__rnd(s) % (np - i)), t = peers[i];
		peers[i] = peers[j];
		peers[j] = t;
	}
	for (uint32_t i = 0; i < s->lay[li].ml.nparcels; i++)
		if (s->lay[li].ml.parcels[i].dst_rank == k->dst_rank)
			len = s->lay[li].ml.parcels[i].wire_bytes;
	for (uint32_t i = 0; i < show; i++) {
		snprintf(host, sizeof(host), "h%u", s->ranks[peers[i]].host);
		json_array_append_new(srcs, source_json(true, s->ranks[peers[i]].id, host,
							peers[i] + 1, len));
	}
	json_array_append_new(srcs, source_json(false, "trainer", "trainer", 0, len));
	free(peers);
	out = json_pack("{s:o,s:o}", "members", members, "sources", srcs);
	if (out != NULL && show < np)
		json_object_set_new(out, "peers_of", json_integer(np));
	if (out != NULL && cut)
		json_object_set_new(out, "members_cut", json_true());
	return out;
fail:
	free(peers);
	json_decref(members);
	json_decref(srcs);
	return NULL;
}

int sim__ask_sources(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg)
{
	struct rank *rk = ctx;
	struct sim *s = (struct sim *)rk->x.o.hooks.agent;
	struct sources_req *q = malloc(sizeof(*q));

	if (q == NULL)
		return -ENOMEM;
	*q = (struct sources_req){cb, arg, *k, s->hosts[rk->host].site};
	s->r->v[s->vi].tracker_requests++;
	sim__push(s, (struct ev){.t = sim__clock_ns + 2 * sim__latency(s), .kind = E_SOURCES,
			    .a = (uint32_t)(rk - s->ranks), .p = q});
	return 0;
}

void sim__sources_due(struct sim *s, struct ev *e)
{
	struct sources_req *q = e->p;
	json_t *j = sources_answer(s, &q->k, q->site);
	struct trk_answer a = {.status = j != NULL ? 200 : 503, .json = j, .error = "no memory"};

	q->cb(&a, q->arg);
	json_decref(j);
	free(q);
}

/* ---- links and CPUs: the transport ----------------------------------------- */

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
 * it after what came before. A read of the trainer from another site also
 * crosses that site's wide-area link between the two, in the order the
 * trainer sends, and its latency each way. */
int sim__tx_read(void *ctx, struct fetcher *x, struct fetch_read *rd, struct fetch_source *src,
		   uint32_t len)
{
	struct sim *s = ctx;
	struct rank *rk = proto_container_of(x, struct rank, x);
	uint32_t from = source_rank(src);
	uint64_t t = sim__clock_ns + sim__latency(s);
	struct ev e = {.kind = E_UPLINK, .a = (uint32_t)(rk - s->ranks),
		       .b = (uint32_t)(rd - x->reads), .gen = x->gen, .len = len};
	bool trainer = from == UINT32_MAX;
	struct host *up = &s->hosts[trainer ? s->max_hosts : s->ranks[from].host];

	if (!up->alive) { /* a host that is gone: the connection fails */
		e.kind = E_READ;
		e.t = t + sim__latency(s);
		e.status = -EIO;
		sim__push(s, e);
		return 0;
	}
	uint32_t site = s->hosts[rk->host].site;
	if (trainer && site != 0)
		t += sim__ns(s->c->wan_latency_ms / 1e3);
	e.t0 = PROTO_MAX(t, up->up_free);
	e.t = up->up_free = e.t0 + sim__ns(len / up->up_bps);
	if (trainer) {
		s->r->v[s->vi].trainer_bytes += len;
		s->r->v[s->vi].trainer_s = (double)(e.t - s->v_start) / 1e9;
	}
	if (trainer && site != 0) {
		uint64_t *wan = &s->wan_free[site];
		if (s->c->wan_bps > 0) {
			e.t0 = PROTO_MAX(e.t0, *wan);
			e.t = *wan = PROTO_MAX(e.t, e.t0 + sim__ns(len / s->c->wan_bps));
		}
		e.t0 += sim__ns(s->c->wan_latency_ms / 1e3); /* the far end's flow, later */
		e.t += sim__ns(s->c->wan_latency_ms / 1e3);
		s->r->v[s->vi].wan_bytes += len;
	}
	sim__push(s, e);
	return 0;
}

void sim__uplink(struct sim *s, struct ev *e)
{
	struct host *me = &s->hosts[s->ranks[e->a].host];
	uint64_t start = PROTO_MAX(e->t0, me->down_free), busy = sim__ns(e->len / me->down_bps);

	me->down_free = PROTO_MAX(e->t, start + busy);
	me->down_busy_ns += busy;
	e->kind = E_READ;
	e->t = me->down_free + sim__latency(s);
	sim__push(s, *e);
}

void sim__tx_verify(void *ctx, struct fetcher *x, struct fetch_read *rd)
{
	struct sim *s = ctx;
	struct rank *rk = proto_container_of(x, struct rank, x);

	rk->cpu_free = PROTO_MAX(rk->cpu_free, sim__clock_ns) +
		       sim__ns(rd->len * s->c->cpu_ns_per_byte / 1e9);
	sim__push(s, (struct ev){.t = rk->cpu_free, .kind = E_VERIFIED, .a = (uint32_t)(rk - s->ranks),
			    .b = (uint32_t)(rd - x->reads), .gen = rd->gen});
}

void sim__read_done(struct sim *s, const struct ev *e)
{
	struct fetcher *x = &s->ranks[e->a].x;
	struct fetch_read *rd = &x->reads[e->b];
	uint32_t n = PROTO_MAX(rd->run, 1u);

	for (uint32_t k = 0; k < n; k++) /* as reads.c's on_read: each chunk lands */
		fetch_read_landed(&x->reads[e->b + k], e->status);
}

/* A copy of chunk c of layout 0's parcel 0 verified now (sim_spread). */
static void spread_copy(struct sim *s, uint32_t c)
{
	struct sim_spread *sp = &s->spread;

	if (c >= sp->nchunks)
		return;
	struct sim_chunk_spread *cs = &sp->c[c];
	uint32_t k = ++cs->copies;
	if (k == 1)
		cs->first = sim__clock_ns;
	if (k == (sp->want + 1) / 2)
		cs->half = sim__clock_ns;
	if (k == sp->want)
		cs->all = sim__clock_ns;
}

void sim__verified(struct sim *s, const struct ev *e)
{
	const struct rank *rk = &s->ranks[e->a];
	struct fetcher *x = &s->ranks[e->a].x;
	struct fetch_read *rd = &x->reads[e->b];

	if (!rd->busy || rd->gen != e->gen)
		return;
	/* A duplicate (endgame) is no new copy. */
	if (rk->layout == 0 && rk->rank == 0 && !s->hosts[rk->host].slow && rd->parcel == 0 &&
	    x->f != NULL && x->f->version == s->vi + 1 &&
	    x->f->parcels[0].state[rd->chunk] != CHUNK_DONE)
		spread_copy(s, rd->chunk);
	fetch_read_verified(rd, true);
}

/* ---- have-pages --------------------------------------------------------------- */

/* Reads the pages of the peers rk lists for each parcel, as they are now,
 * and hands them to the fetcher as node/swarm/have.c does an answer
 * (fetch_source_page, then one recount per parcel). */
void sim__read_pages(struct sim *s, struct rank *rk)
{
	struct fetch *f = rk->x.f;
	uint64_t now = node_now_ms();

	for (uint32_t pi = 0; f != NULL && pi < f->nparcels; pi++) {
		struct fetch_parcel *p = &f->parcels[pi];
		uint32_t n = p->mp->nchunks, read = 0;
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
			src->have_ms = now; /* read and answered at once */
			if (proto_have_parse(pf->parcels[pi].held, proto_have_bytes(n), &h, &err) == 0 &&
			    fetch_source_page(&rk->x, p, src, &h) == 0)
				read++;
		}
		if (read > 0)
			fetch_recount(f, p);
	}
}

