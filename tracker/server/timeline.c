/* Per-version update timelines: when each boundary of an update passed, from
 * the export request to every replica's activation (soft, in memory). */
#include "tracker/server/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

struct trk_tl_rank {
	char replica[TRK_REPLICA_MAX + 1];
	uint32_t rank;
	uint64_t first_byte_ms, last_byte_ms, verified_ms, active_ms;
};

struct trk_tl_replica {
	char name[TRK_REPLICA_MAX + 1];
	uint32_t nranks;
	uint64_t prepared_ms, activated_ms;
};

struct trk_tl_version {
	uint64_t version; /* 0: an unused slot */
	uint64_t snapshot_ms;
	struct trk_tl_replica *reps;
	size_t nreps;
	struct trk_tl_rank *ranks;
	size_t nranks;
};

struct trk_timeline {
	struct trk_tl_version v[TRK__TIMELINE_VERSIONS];
};

int trk__timeline_new(struct trk_timeline **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

static void slot_clear(struct trk_tl_version *s)
{
	free(s->reps);
	free(s->ranks);
	memset(s, 0, sizeof(*s));
}

void trk__timeline_free(struct trk_timeline *tl)
{
	if (tl == NULL)
		return;
	for (size_t i = 0; i < TRK__TIMELINE_VERSIONS; i++)
		slot_clear(&tl->v[i]);
	free(tl);
}

/* Version v's slot; a newer version takes over the slot of an older one.
 * NULL for a version older than the one in its slot, or when !create. */
static struct trk_tl_version *slot(struct trk_timeline *tl, uint64_t v, bool create)
{
	struct trk_tl_version *s = &tl->v[v % TRK__TIMELINE_VERSIONS];

	if (s->version == v)
		return s;
	if (!create || v < s->version)
		return NULL;
	slot_clear(s);
	s->version = v;
	return s;
}

static struct trk_tl_replica *replica_entry(struct trk_tl_version *s, const char *name,
					    uint32_t nranks)
{
	for (size_t i = 0; i < s->nreps; i++)
		if (strcmp(s->reps[i].name, name) == 0)
			return &s->reps[i];
	if (s->nreps >= TRK__TIMELINE_RANKS)
		return NULL;
	struct trk_tl_replica *n = realloc(s->reps, (s->nreps + 1) * sizeof(*n));
	if (n == NULL)
		return NULL;
	s->reps = n;
	n = &s->reps[s->nreps++];
	memset(n, 0, sizeof(*n));
	snprintf(n->name, sizeof(n->name), "%s", name);
	n->nranks = nranks;
	return n;
}

static struct trk_tl_rank *rank_entry(struct trk_tl_version *s, const char *replica,
				      uint32_t rank)
{
	for (size_t i = 0; i < s->nranks; i++)
		if (s->ranks[i].rank == rank && strcmp(s->ranks[i].replica, replica) == 0)
			return &s->ranks[i];
	if (s->nranks >= TRK__TIMELINE_RANKS)
		return NULL;
	struct trk_tl_rank *n = realloc(s->ranks, (s->nranks + 1) * sizeof(*n));
	if (n == NULL)
		return NULL;
	s->ranks = n;
	n = &s->ranks[s->nranks++];
	memset(n, 0, sizeof(*n));
	snprintf(n->replica, sizeof(n->replica), "%s", replica);
	n->rank = rank;
	return n;
}

void trk__timeline_snapshot(struct trk_timeline *tl, uint64_t v, uint64_t snapshot_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	/* Several publishers each snapshot their ranks: the version is stable
	 * once the last of them is. */
	if (s != NULL && snapshot_ms > s->snapshot_ms)
		s->snapshot_ms = snapshot_ms;
}

void trk__timeline_rank(struct trk_timeline *tl, uint64_t v, const char *replica,
			uint32_t nranks, uint32_t rank, enum trk_rank_state st,
			uint64_t first_byte_ms, uint64_t last_byte_ms, uint64_t now_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	struct trk_tl_rank *e;

	if (s == NULL || replica_entry(s, replica, nranks) == NULL ||
	    (e = rank_entry(s, replica, rank)) == NULL)
		return;
	if (first_byte_ms != 0 && (e->first_byte_ms == 0 || first_byte_ms < e->first_byte_ms))
		e->first_byte_ms = first_byte_ms;
	if (last_byte_ms > e->last_byte_ms)
		e->last_byte_ms = last_byte_ms;
	if ((st == TRK_STATE_VERIFIED || st == TRK_STATE_ACTIVE) && e->verified_ms == 0)
		e->verified_ms = now_ms;
	if (st == TRK_STATE_ACTIVE && e->active_ms == 0)
		e->active_ms = now_ms;
}

void trk__timeline_replica(struct trk_timeline *tl, uint64_t v, const char *replica,
			   uint32_t nranks, bool activated, uint64_t now_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	struct trk_tl_replica *e = s ? replica_entry(s, replica, nranks) : NULL;

	if (e == NULL)
		return;
	if (!activated && e->prepared_ms == 0)
		e->prepared_ms = now_ms;
	if (activated && e->activated_ms == 0) {
		e->activated_ms = now_ms;
		if (e->prepared_ms == 0)
			e->prepared_ms = now_ms;
	}
}

/* A time, or null when it has not passed (yet). */
static json_t *ms_json(uint64_t ms)
{
	return ms ? json_integer((json_int_t)ms) : json_null();
}

/* Rank entries by replica name, then in the order they came. */
static int cmp_rank_entry(const void *a, const void *b)
{
	const struct trk_tl_rank *x = *(const struct trk_tl_rank *const *)a;
	const struct trk_tl_rank *y = *(const struct trk_tl_rank *const *)b;
	int c = strcmp(x->replica, y->replica);

	return c != 0 ? c : (x > y) - (x < y);
}

/* The first of n entries (sorted by cmp_rank_entry) of replica name: n
 * when there is none. */
static size_t first_of(const struct trk_tl_rank *const *by, size_t n, const char *name)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(by[mid]->replica, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

json_t *trk__timeline_json(struct trk_timeline *tl, const struct trk_version *ver)
{
	struct trk_tl_version *s = slot(tl, ver->version, false);
	json_t *reps = json_array();
	/* Each replica's ranks found by name in a sorted index, not by
	 * walking every rank per replica (thousands of each). */
	const struct trk_tl_rank **by = NULL;
	size_t nby = s != NULL ? s->nranks : 0;
	json_t *o = json_pack("{s:I,s:s,s:I,s:o,s:o,s:o}", "version", (json_int_t)ver->version,
			      "kind", ver->kind == PROTO_KIND_DELTA ? "delta" : "anchor", "wire_bytes",
			      (json_int_t)ver->wire_bytes, "export_asked_ms", ms_json(ver->created_ms),
			      "snapshot_ms", ms_json(s ? s->snapshot_ms : 0), "published_ms",
			      ms_json(ver->published_ms));

	if (nby > 0 && (by = malloc(nby * sizeof(*by))) != NULL) {
		for (size_t k = 0; k < nby; k++)
			by[k] = &s->ranks[k];
		qsort(by, nby, sizeof(*by), cmp_rank_entry);
	}
	if (o == NULL || reps == NULL || json_object_set_new(o, "replicas", reps) != 0 ||
	    (nby > 0 && by == NULL)) {
		free(by);
		json_decref(o);
		return NULL;
	}
	for (size_t i = 0; s != NULL && i < s->nreps; i++) {
		const struct trk_tl_replica *rp = &s->reps[i];
		json_t *ranks = json_array();
		for (size_t k = first_of(by, nby, rp->name);
		     k < nby && strcmp(by[k]->replica, rp->name) == 0; k++) {
			const struct trk_tl_rank *e = by[k];
			json_array_append_new(ranks, json_pack("{s:I,s:o,s:o,s:o,s:o}", "rank",
							       (json_int_t)e->rank, "first_byte_ms",
							       ms_json(e->first_byte_ms), "last_byte_ms",
							       ms_json(e->last_byte_ms), "verified_ms",
							       ms_json(e->verified_ms), "activated_ms",
							       ms_json(e->active_ms)));
		}
		json_array_append_new(reps, json_pack("{s:s,s:I,s:o,s:o,s:o}", "replica", rp->name,
						      "nranks", (json_int_t)rp->nranks, "prepared_ms",
						      ms_json(rp->prepared_ms), "activated_ms",
						      ms_json(rp->activated_ms), "ranks", ranks));
	}
	free(by);
	return o;
}

void trk__handle_timeline(struct trk_call *c, const char *num)
{
	struct trk_version *ver;
	uint64_t v;
	json_t *o;

	if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0) {
		trk__fail(c, 400, "version '%s' is not a positive integer", num);
		return;
	}
	ver = trk__versions_find(c->s->vs, v);
	if (ver == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)v);
		return;
	}
	o = trk__timeline_json(c->s->reg->tl, ver);
	if (o == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__reply_json(c, 200, o);
}

/* ---- the chart ------------------------------------------------------------------ */

#define SVG_W 720      /* px */
#define SVG_LABEL 110  /* label column */
#define SVG_ROW 20     /* row pitch */
#define SVG_BAR 12     /* bar height */

struct svg {
	struct evbuffer *b;
	uint64_t t0, span; /* ms: the chart's start and length */
	double pw;         /* plot width, px */
};

static uint64_t jms(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

static double svg_x(const struct svg *g, uint64_t t)
{
	if (t < g->t0)
		t = g->t0;
	return SVG_LABEL + g->pw * (double)(t - g->t0) / (double)g->span;
}

/* One phase [a, b) of a row as a bar with a tooltip; nothing when either
 * end is unknown. */
static void svg_bar(struct svg *g, int row, uint64_t a, uint64_t b, const char *color,
		    const char *what)
{
	if (a == 0 || b == 0 || b < a)
		return;
	double x0 = svg_x(g, a), x1 = svg_x(g, b);
	evbuffer_add_printf(g->b,
			    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\">"
			    "<title>%s: %.3f s (+%.3f s .. +%.3f s)</title></rect>",
			    x0, 8 + row * SVG_ROW, x1 - x0 < 1 ? 1 : x1 - x0, SVG_BAR, color, what,
			    (double)(b - a) / 1000.0, (double)(a - g->t0) / 1000.0,
			    (double)(b - g->t0) / 1000.0);
}

static void svg_label(struct svg *g, int row, const char *text)
{
	evbuffer_add_printf(g->b, "<text x=\"4\" y=\"%d\">", 8 + row * SVG_ROW + SVG_BAR - 2);
	trk__html_esc(g->b, text);
	evbuffer_add_printf(g->b, "</text>");
}

static const struct {
	const char *name, *color;
} svg_phases[] = {
	{"snapshot", "#8e6cc0"}, {"prepare+sign+publish", "#c3b1e1"},
	{"wait for bytes", "#d8d8d8"}, {"transfer", "#4a90d9"},
	{"verify+wait for replica", "#f0a030"}, {"activate", "#3a3"},
};

static void svg_max(uint64_t *m, uint64_t t)
{
	if (t > *m)
		*m = t;
}

void trk__timeline_svg(struct evbuffer *out, json_t *tl)
{
	struct svg g = {.b = out, .pw = SVG_W - SVG_LABEL - 12};
	uint64_t asked = jms(tl, "export_asked_ms"), snap = jms(tl, "snapshot_ms");
	uint64_t pub = jms(tl, "published_ms"), end = pub;
	json_t *reps = json_object_get(tl, "replicas"), *rp, *rk;
	size_t i, k;
	int rows = 1 + (int)json_array_size(reps);

	g.t0 = asked ? asked : pub;
	json_array_foreach(reps, i, rp) {
		svg_max(&end, jms(rp, "prepared_ms"));
		svg_max(&end, jms(rp, "activated_ms"));
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			svg_max(&end, jms(rk, "last_byte_ms"));
			svg_max(&end, jms(rk, "verified_ms"));
			svg_max(&end, jms(rk, "activated_ms"));
		}
	}
	g.span = end > g.t0 ? end - g.t0 : 1;
	int h = 8 + rows * SVG_ROW + 34;
	evbuffer_add_printf(out,
			    "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" "
			    "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
			    "font-family=\"sans-serif\" font-size=\"11\">",
			    SVG_W, h, SVG_W, h);
	/* The trainer's row: from the export request to the published manifest. */
	svg_label(&g, 0, "trainer");
	if (snap != 0 && snap <= pub) {
		svg_bar(&g, 0, asked, snap, svg_phases[0].color, svg_phases[0].name);
		svg_bar(&g, 0, snap, pub, svg_phases[1].color, svg_phases[1].name);
	} else {
		svg_bar(&g, 0, asked, pub, svg_phases[1].color, "export to publish");
	}
	/* A row per replica: its ranks' bytes from the first to the last, then
	 * verification until every rank holds the version, then activation;
	 * a tick where each rank verified. */
	json_array_foreach(reps, i, rp) {
		int row = 1 + (int)i;
		uint64_t first = 0, last = 0;
		svg_label(&g, row, json_string_value(json_object_get(rp, "replica")));
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			uint64_t f = jms(rk, "first_byte_ms");
			if (f != 0 && (first == 0 || f < first))
				first = f;
			svg_max(&last, jms(rk, "last_byte_ms"));
		}
		uint64_t prep = jms(rp, "prepared_ms"), act = jms(rp, "activated_ms");
		svg_bar(&g, row, pub, first, svg_phases[2].color, svg_phases[2].name);
		svg_bar(&g, row, first, last, svg_phases[3].color, svg_phases[3].name);
		svg_bar(&g, row, last, prep, svg_phases[4].color, svg_phases[4].name);
		svg_bar(&g, row, prep, act, svg_phases[5].color, svg_phases[5].name);
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			uint64_t v = jms(rk, "verified_ms");
			if (v == 0)
				continue;
			evbuffer_add_printf(out,
					    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
					    "stroke=\"#333\"><title>rank %lld verified: +%.3f s</title></line>",
					    svg_x(&g, v), svg_x(&g, v), 6 + row * SVG_ROW,
					    10 + row * SVG_ROW + SVG_BAR,
					    (long long)json_integer_value(json_object_get(rk, "rank")),
					    (double)(v - g.t0) / 1000.0);
		}
	}
	/* The time axis, from the export request. */
	int ay = 8 + rows * SVG_ROW;
	evbuffer_add_printf(out, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
			    SVG_LABEL, SVG_LABEL + g.pw, ay, ay);
	for (int q = 0; q <= 4; q++) {
		double x = SVG_LABEL + g.pw * q / 4.0;
		evbuffer_add_printf(out,
				    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
				    "<text x=\"%.1f\" y=\"%d\" text-anchor=\"%s\">+%.2f s</text>",
				    x, x, ay, ay + 4, x, ay + 15, q == 0 ? "start" : q == 4 ? "end" : "middle",
				    (double)g.span * q / 4.0 / 1000.0);
	}
	/* The legend. */
	double lx = 4;
	for (size_t p = 0; p < PROTO_ARRAY_LEN(svg_phases); p++) {
		evbuffer_add_printf(out,
				    "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
				    "<text x=\"%.0f\" y=\"%d\">%s</text>",
				    lx, ay + 21, svg_phases[p].color, lx + 13, ay + 30, svg_phases[p].name);
		lx += 24 + 6.4 * (double)strlen(svg_phases[p].name);
	}
	evbuffer_add_printf(out, "</svg>");
}
