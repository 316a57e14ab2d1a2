/* Update timelines as SVG charts, all drawn at one time scale: ms from
 * each version's export request, the same pixels per second for every
 * chart, so that versions compare by eye. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

#define SVG_W 760      /* px */
#define SVG_LABEL 110  /* label column */
#define SVG_RIGHT 60   /* room right of the plot for a cut row's time */
#define SVG_ROW 20     /* row pitch */
#define SVG_BAR 12     /* bar height */
#define PLOT_W (SVG_W - SVG_LABEL - SVG_RIGHT)
/* A row ending past this times the end of the quickest quarter's last
 * row is cut: the scale follows the replicas that were there on time. */
#define LATE_FACTOR 4

struct svg {
	struct evbuffer *b;
	uint64_t t0, span; /* ms: the chart's start and length */
};

static const struct {
	const char *name, *color;
} phases[] = {
	{"snapshot", "#8e6cc0"}, {"prepare+sign+publish", "#c3b1e1"},
	{"wait for bytes", "#d8d8d8"}, {"transfer", "#4a90d9"},
	{"verify+wait for replica", "#f0a030"}, {"activate", "#3a3"},
};

static double svg_x(const struct svg *g, uint64_t t)
{
	uint64_t d = t < g->t0 ? 0 : t - g->t0;
	if (d > g->span)
		d = g->span;
	return SVG_LABEL + PLOT_W * (double)d / (double)g->span;
}

/* One phase [a, b) of a row as a bar with a tooltip; nothing when either
 * end is unknown. */
static void bar(struct svg *g, int row, uint64_t a, uint64_t b, int phase, const char *what)
{
	if (a == 0 || b == 0 || b < a || a > g->t0 + g->span)
		return;
	double x0 = svg_x(g, a), x1 = svg_x(g, b);
	evbuffer_add_printf(g->b,
			    "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\">"
			    "<title>%s: %.3f s (+%.3f s .. +%.3f s)</title></rect>",
			    x0, 8 + row * SVG_ROW, x1 - x0 < 1 ? 1 : x1 - x0, SVG_BAR,
			    phases[phase].color, what ? what : phases[phase].name,
			    (double)(b - a) / 1000.0, (double)(a - g->t0) / 1000.0,
			    (double)(b - g->t0) / 1000.0);
}

static void label(struct svg *g, int row, const char *text)
{
	evbuffer_add_printf(g->b, "<text x=\"4\" y=\"%d\">", 8 + row * SVG_ROW + SVG_BAR - 2);
	trk__html_esc(g->b, text);
	evbuffer_add_printf(g->b, "</text>");
}

static void max_of(uint64_t *m, uint64_t t)
{
	if (t > *m)
		*m = t;
}

/* The last time a replica row of tl shows. */
static uint64_t row_end(json_t *rp)
{
	uint64_t end = 0;
	size_t k;
	json_t *rk;

	max_of(&end, trk__html_ms(rp, "prepared_ms"));
	max_of(&end, trk__html_ms(rp, "activated_ms"));
	json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
		max_of(&end, trk__html_ms(rk, "last_byte_ms"));
		max_of(&end, trk__html_ms(rk, "verified_ms"));
		max_of(&end, trk__html_ms(rk, "activated_ms"));
	}
	return end;
}

static uint64_t chart_t0(json_t *tl)
{
	uint64_t asked = trk__html_ms(tl, "export_asked_ms");
	return asked ? asked : trk__html_ms(tl, "published_ms");
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

uint64_t trk__chart_span(json_t *tl, bool all)
{
	json_t *reps = json_object_get(tl, "replicas"), *rp;
	size_t n = json_array_size(reps), i, k = 0;
	uint64_t t0 = chart_t0(tl), end = trk__html_ms(tl, "published_ms"), *ends;

	if (t0 == 0)
		return 0;
	ends = n > 0 ? malloc(n * sizeof(*ends)) : NULL;
	json_array_foreach(reps, i, rp) {
		uint64_t e = row_end(rp);
		if (e > t0 && ends != NULL)
			ends[k++] = e - t0;
		if (all || ends == NULL)
			max_of(&end, e);
	}
	if (!all && k > 0) {
		/* Rows far past the quick ones (a replica that started
		 * late, a slow one) do not set the scale: they are cut. */
		qsort(ends, k, sizeof(*ends), cmp_u64);
		uint64_t cap = ends[k / 4] * LATE_FACTOR;
		for (size_t j = 0; j < k; j++)
			if (ends[j] <= cap)
				max_of(&end, t0 + ends[j]);
	}
	free(ends);
	return end > t0 ? end - t0 : 0;
}

/* A round step for the axis: 1, 2 or 5 times a power of ten ms, giving
 * four to ten ticks over span. */
static uint64_t tick_step(uint64_t span)
{
	uint64_t step = 1;

	for (;;) {
		for (int m = 1; m <= 5; m += m == 1 ? 1 : 3)
			if (span / (step * (uint64_t)m) <= 10)
				return step * (uint64_t)m;
		step *= 10;
	}
}

void trk__chart_timeline(struct evbuffer *b, json_t *tl, uint64_t span_ms)
{
	struct svg g = {.b = b, .t0 = chart_t0(tl), .span = span_ms ? span_ms : 1};
	uint64_t asked = trk__html_ms(tl, "export_asked_ms"), snap = trk__html_ms(tl, "snapshot_ms");
	uint64_t pub = trk__html_ms(tl, "published_ms");
	json_t *reps = json_object_get(tl, "replicas"), *rp, *rk;
	size_t i, k;
	int rows = 1 + (int)json_array_size(reps);
	json_int_t v = json_integer_value(json_object_get(tl, "version"));

	int h = 8 + rows * SVG_ROW + 34;
	evbuffer_add_printf(b,
			    "<svg class=\"timeline\" data-span-ms=\"%" PRIu64 "\" "
			    "xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
			    "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"11\">"
			    "<a href=\"/versions/%lld\"><text x=\"%d\" y=\"%d\" fill=\"#06c\">v%lld &#8599;"
			    "</text></a>",
			    g.span, SVG_W, h, SVG_W, h, (long long)v, SVG_W - SVG_RIGHT + 8,
			    8 + SVG_BAR - 2, (long long)v);
	/* The trainer's row: from the export request to the published manifest. */
	label(&g, 0, "trainer");
	if (snap != 0 && snap <= pub) {
		bar(&g, 0, asked, snap, 0, NULL);
		bar(&g, 0, snap, pub, 1, NULL);
	} else {
		bar(&g, 0, asked, pub, 1, "export to publish");
	}
	/* A row per replica: its ranks' bytes from the first to the last, then
	 * verification until every rank holds the version, then activation;
	 * a tick where each rank verified. A row past the scale is cut at its
	 * end with its time written there. */
	json_array_foreach(reps, i, rp) {
		int row = 1 + (int)i;
		uint64_t first = 0, last = 0, end = row_end(rp);
		label(&g, row, json_string_value(json_object_get(rp, "replica")));
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			uint64_t f = trk__html_ms(rk, "first_byte_ms");
			if (f != 0 && (first == 0 || f < first))
				first = f;
			max_of(&last, trk__html_ms(rk, "last_byte_ms"));
		}
		uint64_t prep = trk__html_ms(rp, "prepared_ms"), act = trk__html_ms(rp, "activated_ms");
		bar(&g, row, pub, first, 2, NULL);
		bar(&g, row, first, last, 3, NULL);
		bar(&g, row, last, prep, 4, NULL);
		bar(&g, row, prep, act, 5, NULL);
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			uint64_t t = trk__html_ms(rk, "verified_ms");
			if (t == 0 || t > g.t0 + g.span)
				continue;
			evbuffer_add_printf(b,
					    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
					    "stroke=\"#333\"><title>rank %lld verified: +%.3f s</title></line>",
					    svg_x(&g, t), svg_x(&g, t), 6 + row * SVG_ROW,
					    10 + row * SVG_ROW + SVG_BAR,
					    (long long)json_integer_value(json_object_get(rk, "rank")),
					    (double)(t - g.t0) / 1000.0);
		}
		if (end > g.t0 + g.span)
			evbuffer_add_printf(b,
					    "<text class=\"cut\" x=\"%d\" y=\"%d\" fill=\"#b00\">"
					    "&#8594; +%.1f s</text>",
					    SVG_LABEL + PLOT_W + 3, 8 + row * SVG_ROW + SVG_BAR - 2,
					    (double)(end - g.t0) / 1000.0);
	}
	/* The time axis, from the export request, in round steps. */
	int ay = 8 + rows * SVG_ROW;
	uint64_t step = tick_step(g.span);
	evbuffer_add_printf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>",
			    SVG_LABEL, SVG_LABEL + PLOT_W, ay, ay);
	for (uint64_t t = 0; t <= g.span; t += step) {
		double x = svg_x(&g, g.t0 + t);
		evbuffer_add_printf(b,
				    "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" stroke=\"#999\"/>"
				    "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">+%g s</text>",
				    x, x, ay, ay + 4, x, ay + 15, (double)t / 1000.0);
	}
	/* The legend. */
	double lx = 4;
	for (size_t p = 0; p < PROTO_ARRAY_LEN(phases); p++) {
		evbuffer_add_printf(b,
				    "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" fill=\"%s\"/>"
				    "<text x=\"%.0f\" y=\"%d\">%s</text>",
				    lx, ay + 21, phases[p].color, lx + 13, ay + 30, phases[p].name);
		lx += 24 + 6.4 * (double)strlen(phases[p].name);
	}
	evbuffer_add_printf(b, "</svg>");
}
