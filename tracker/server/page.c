/* GET /: the status page, HTML made from the status JSON, with a chart of
 * each recent version's update timeline. */
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

/* Appends s to b with &<>"' escaped for HTML text and attributes (and SVG). */
static void html_esc(struct evbuffer *b, const char *s)
{
	for (; s != NULL && *s; s++) {
		switch (*s) {
		case '&': evbuffer_add(b, "&amp;", 5); break;
		case '<': evbuffer_add(b, "&lt;", 4); break;
		case '>': evbuffer_add(b, "&gt;", 4); break;
		case '"': evbuffer_add(b, "&quot;", 6); break;
		case '\'': evbuffer_add(b, "&#39;", 5); break;
		default: evbuffer_add(b, s, 1);
		}
	}
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
	html_esc(g->b, text);
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

/* Draws a timeline object (GET /versions/V/timeline) as an inline SVG chart. */
static void timeline_svg(struct evbuffer *out, json_t *tl)
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

/* ---- the page ------------------------------------------------------------------ */

/* A JSON value as escaped text (strings bare, numbers as numbers). */
static void esc_json(struct evbuffer *b, json_t *v)
{
	char buf[64];

	if (json_is_string(v)) {
		html_esc(b, json_string_value(v));
	} else if (json_is_integer(v)) {
		snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		evbuffer_add(b, buf, strlen(buf));
	} else if (json_is_true(v)) {
		evbuffer_add(b, "yes", 3);
	} else if (json_is_false(v)) {
		evbuffer_add(b, "no", 2);
	} else if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			if (i > 0)
				evbuffer_add(b, ", ", 2);
			esc_json(b, e);
		}
	} else {
		evbuffer_add(b, "-", 1);
	}
}

static void cell(struct evbuffer *b, json_t *o, const char *key)
{
	evbuffer_add_printf(b, "<td>");
	esc_json(b, json_object_get(o, key));
	evbuffer_add_printf(b, "</td>");
}

static void short_hex(struct evbuffer *b, json_t *o, const char *key)
{
	const char *h = json_string_value(json_object_get(o, key));
	char s[13];

	snprintf(s, sizeof(s), "%s", h ? h : "-");
	evbuffer_add_printf(b, "<td><code>");
	html_esc(b, s);
	evbuffer_add_printf(b, "</code></td>");
}

static void bytes_text(struct evbuffer *b, json_t *v);

static void human_bytes(struct evbuffer *b, json_t *v)
{
	evbuffer_add_printf(b, "<td>");
	bytes_text(b, v);
	evbuffer_add_printf(b, "</td>");
}

static void age(struct evbuffer *b, json_t *now, json_t *then)
{
	json_int_t d = json_integer_value(now) - json_integer_value(then);

	if (!json_is_integer(then) || json_integer_value(then) == 0)
		evbuffer_add_printf(b, "<td>-</td>");
	else
		evbuffer_add_printf(b, "<td>%.1f s ago</td>", (double)d / 1000.0);
}

/* A version's replica names, with how many there are when not all are listed. */
static void names_cell(struct evbuffer *b, json_t *v, const char *key)
{
	char count[64];
	json_t *names = json_object_get(v, key);

	snprintf(count, sizeof(count), "%s_count", key);
	json_int_t n = json_integer_value(json_object_get(v, count));
	evbuffer_add_printf(b, "<td>");
	esc_json(b, names);
	if (n > (json_int_t)json_array_size(names))
		evbuffer_add_printf(b, "%s&hellip; (%lld in all)",
				    json_array_size(names) ? ", " : "", (long long)n);
	evbuffer_add_printf(b, "</td>");
}

/* "Replicas": counts by state, which of them this page shows, and links to
 * the pages before and after. */
static void replicas_heading(struct evbuffer *b, json_t *st, const struct trk_status_page *pg)
{
	json_t *by = json_object_get(st, "replicas_by_state");
	uint64_t total = (uint64_t)json_integer_value(json_object_get(st, "replicas_total"));
	uint64_t shown = json_array_size(json_object_get(st, "replicas"));

	evbuffer_add_printf(b, "<h2>Replicas</h2><p>%" PRIu64 " replicas: %lld current, "
			       "%lld behind, %lld partial, %lld gone",
			    total, (long long)json_integer_value(json_object_get(by, "current")),
			    (long long)json_integer_value(json_object_get(by, "behind")),
			    (long long)json_integer_value(json_object_get(by, "partial")),
			    (long long)json_integer_value(json_object_get(by, "gone")));
	if (shown < total) {
		evbuffer_add_printf(b, " &middot; showing %" PRIu64 "&ndash;%" PRIu64,
				    shown ? pg->offset + 1 : 0, pg->offset + shown);
		if (pg->offset > 0)
			evbuffer_add_printf(b, " &middot; <a href=\"/?replicas_offset=%" PRIu64
					       "&amp;replicas_limit=%" PRIu64 "\">previous</a>",
					    pg->offset > pg->limit ? pg->offset - pg->limit : 0,
					    pg->limit);
		if (pg->offset + shown < total)
			evbuffer_add_printf(b, " &middot; <a href=\"/?replicas_offset=%" PRIu64
					       "&amp;replicas_limit=%" PRIu64 "\">next</a>",
					    pg->offset + shown, pg->limit);
	}
	evbuffer_add_printf(b, "</p>");
}

static const char page_head[] =
	"<!doctype html><html><head><meta charset=\"utf-8\">"
	"<meta http-equiv=\"refresh\" content=\"2\">"
	"<title>tessera tracker</title><style>"
	"body{font:14px system-ui,sans-serif;margin:1.5em}"
	"table{border-collapse:collapse;margin-bottom:1.5em}"
	"td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}"
	"th{background:#eee}.active{color:#070;font-weight:bold}"
	".gone,.gone td{color:#aaa;background:#f4f4f4;font-weight:normal}"
	".gone progress{opacity:.4}.failed{color:#b00}progress{width:8em}"
	"summary{cursor:pointer;margin-bottom:.5em}.tl{margin-bottom:.8em}"
	"</style></head><body>";

/* Where the newest versions' updates spent their time: a chart each. */
#define PAGE_TIMELINES 3
static void page_timelines(struct evbuffer *b, struct trk_server *s)
{
	size_t n = trk__versions_count(s->vs);

	evbuffer_add_printf(b, "<h2>Update timelines</h2>");
	if (n == 0)
		evbuffer_add_printf(b, "<p>no version yet</p>");
	for (size_t i = n; i > 0 && i + PAGE_TIMELINES > n; i--) {
		struct trk_version *v = trk__versions_at(s->vs, i - 1);
		json_t *tl = trk__timeline_json(s->reg->tl, v);
		if (tl == NULL)
			continue;
		evbuffer_add_printf(b, "<div class=\"tl\"><b>v%" PRIu64 "</b> <a href=\"" TRK_API
				       "/versions/%" PRIu64 "/timeline\">JSON</a><br>",
				    v->version, v->version);
		timeline_svg(b, tl);
		evbuffer_add_printf(b, "</div>");
		json_decref(tl);
	}
}

/* The bytes as text in the page's one unit style (binary, one decimal). */
static void bytes_text(struct evbuffer *b, json_t *v)
{
	double x = (double)json_integer_value(v);
	const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;

	while (x >= 1024 && u < 4) {
		x /= 1024;
		u++;
	}
	evbuffer_add_printf(b, u == 0 ? "%.0f %s" : "%.1f %s", x, unit[u]);
}

/* A replica's layout: its name ("tp2", a file's name) or, for a node that
 * gave none, the start of its digest; and its rank count. */
static void layout_cell(struct evbuffer *b, json_t *rep, size_t rows, const char *cls)
{
	const char *name = json_string_value(json_object_get(rep, "layout_name"));
	char s[13];

	evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"%s\">", rows, cls);
	if (name != NULL) {
		html_esc(b, name);
	} else {
		snprintf(s, sizeof(s), "%s", json_string_value(json_object_get(rep, "layout_digest")));
		evbuffer_add_printf(b, "<code>");
		html_esc(b, s);
		evbuffer_add_printf(b, "</code>");
	}
	json_int_t n = json_integer_value(json_object_get(rep, "nranks"));
	evbuffer_add_printf(b, " (%lld rank%s)</td>", (long long)n, n == 1 ? "" : "s");
}

/* How far a replica is behind the latest version, and why its ranks
 * disagree when they have for a while. */
static void lag_text(struct evbuffer *b, json_t *rep)
{
	esc_json(b, json_object_get(rep, "lag_versions"));
	evbuffer_add_printf(b, " versions, %.1f s",
			    (double)json_integer_value(json_object_get(rep, "lag_ms")) / 1000.0);
	if (json_is_string(json_object_get(rep, "disagreement"))) {
		evbuffer_add_printf(b, "<br><span class=\"failed\">ranks disagree for %.1f s: ",
				    (double)json_integer_value(json_object_get(rep, "disagree_ms")) /
					    1000.0);
		esc_json(b, json_object_get(rep, "disagreement"));
		evbuffer_add_printf(b, "</span>");
	}
}

/* The rank's last canary probe: the version it read and whether its score
 * is the publisher's. */
static void canary_cell(struct evbuffer *b, json_t *cn)
{
	json_t *ok = json_object_get(cn, "ok");

	if (!json_is_object(cn)) {
		evbuffer_add_printf(b, "<td>-</td>");
		return;
	}
	evbuffer_add_printf(b, "<td class=\"%s\">v%lld ", json_is_false(ok) ? "failed" : "",
			    (long long)json_integer_value(json_object_get(cn, "version")));
	evbuffer_add_printf(b, "%s</td>", json_is_true(ok) ? "ok" :
					  json_is_false(ok) ? "<b>MISMATCH</b>" : "no expected score");
}

/* Replicas first: what serves which version, rank by rank. Everything of a
 * dead node (or of a replica with none alive) is greyed out. */
static void page_replicas(struct evbuffer *b, json_t *st, const struct trk_status_page *pg)
{
	json_t *v, *e;
	size_t i, j;

	replicas_heading(b, st, pg);
	evbuffer_add_printf(b, "<table><tr><th>replica</th><th>layout</th>"
			       "<th>active</th><th>target</th><th>lag</th><th>complete at</th>"
			       "<th>rank</th><th>node</th>"
			       "<th>host</th><th>state</th><th>version</th><th>progress</th>"
			       "<th>canary</th><th>error</th></tr>");
	json_array_foreach(json_object_get(st, "replicas"), i, v) {
		json_t *ranks = json_object_get(v, "ranks");
		size_t rows = json_array_size(ranks);
		const char *rcls = json_is_true(json_object_get(v, "alive")) ? "" : "gone";
		json_array_foreach(ranks, j, e) {
			bool alive = json_is_true(json_object_get(e, "alive"));
			const char *state = json_string_value(json_object_get(e, "state"));
			json_int_t done = json_integer_value(json_object_get(e, "bytes_done"));
			json_int_t total = json_integer_value(json_object_get(e, "bytes_total"));
			evbuffer_add_printf(b, "<tr class=\"%s\">",
					    !alive ? "gone" :
					    state && strcmp(state, "failed") == 0 ? "failed" :
					    state && strcmp(state, "active") == 0 ? "active" : "");
			if (j == 0) {
				evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"%s\"><b>", rows, rcls);
				esc_json(b, json_object_get(v, "replica"));
				evbuffer_add_printf(b, "</b></td>");
				layout_cell(b, v, rows, rcls);
				evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
				esc_json(b, json_object_get(v, "active"));
				if (json_is_true(json_object_get(v, "incomplete")))
					evbuffer_add_printf(b, " <i>incomplete</i>");
				evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
				esc_json(b, json_object_get(v, "target"));
				evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
				lag_text(b, v);
				evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
				esc_json(b, json_object_get(v, "complete"));
				evbuffer_add_printf(b, "</td>");
			}
			cell(b, e, "rank");
			cell(b, e, "id");
			cell(b, e, "host");
			evbuffer_add_printf(b, "<td>");
			html_esc(b, alive ? state :
			       json_is_null(json_object_get(e, "id")) ? "absent" : "dead");
			evbuffer_add_printf(b, "</td>");
			/* The version, and how the rank built it (delta, chain, full). */
			evbuffer_add_printf(b, "<td>");
			esc_json(b, json_object_get(e, "version"));
			if (json_is_string(json_object_get(e, "how"))) {
				evbuffer_add_printf(b, " by ");
				esc_json(b, json_object_get(e, "how"));
			}
			evbuffer_add_printf(b, "</td>");
			if (total > 0 && alive) {
				evbuffer_add_printf(b, "<td><progress max=\"%lld\" value=\"%lld\">"
						       "</progress> %.0f%% of ",
						    (long long)total, (long long)done,
						    100.0 * (double)done / (double)total);
				bytes_text(b, json_object_get(e, "bytes_total"));
				evbuffer_add_printf(b, "</td>");
			} else {
				evbuffer_add_printf(b, "<td>-</td>");
			}
			canary_cell(b, json_object_get(e, "canary"));
			evbuffer_add_printf(b, "<td>");
			esc_json(b, json_object_get(e, "error"));
			if (json_is_string(json_object_get(e, "banned"))) {
				evbuffer_add_printf(b, " banned peers: ");
				esc_json(b, json_object_get(e, "banned"));
			}
			evbuffer_add_printf(b, "</td></tr>");
		}
	}
	evbuffer_add_printf(b, "</table>");
}

static void version_row(struct evbuffer *b, json_t *v, json_t *now, json_t *model_bytes)
{
	evbuffer_add_printf(b, "<tr>");
	cell(b, v, "version");
	cell(b, v, "kind");
	cell(b, v, "parent");
	human_bytes(b, model_bytes);
	evbuffer_add_printf(b, "<td>");
	bytes_text(b, json_object_get(v, "wire_bytes"));
	evbuffer_add_printf(b, " (");
	esc_json(b, json_object_get(v, "layouts"));
	evbuffer_add_printf(b, " layouts");
	if (json_array_size(json_object_get(v, "addenda")) > 0)
		evbuffer_add_printf(b, ", %zu added by addenda",
				    json_array_size(json_object_get(v, "addenda")));
	if (json_array_size(json_object_get(v, "uncovered_layouts")) > 0)
		evbuffer_add_printf(b, ", %zu waiting for one",
				    json_array_size(json_object_get(v, "uncovered_layouts")));
	evbuffer_add_printf(b, ")</td>");
	age(b, now, json_object_get(v, "published_ms"));
	names_cell(b, v, "complete");
	names_cell(b, v, "active");
	human_bytes(b, json_object_get(v, "bytes_from_trainer"));
	human_bytes(b, json_object_get(v, "bytes_from_peers"));
	if (json_is_true(json_object_get(v, "dropped")))
		evbuffer_add_printf(b, "<td>dropped</td>");
	else
		cell(b, v, "retain");
	short_hex(b, v, "digest");
	evbuffer_add_printf(b, "</tr>");
}

/* The newest versions in a table, older ones folded away below it. */
#define PAGE_VERSIONS_OPEN 5
static void page_versions(struct evbuffer *b, json_t *st)
{
	static const char head[] =
		"<table><tr><th>version</th><th>kind</th><th>parent</th><th>model</th>"
		"<th>on the wire</th><th>published</th><th>complete on</th><th>active on</th>"
		"<th>from trainer</th><th>from peers</th><th>retain</th><th>digest</th></tr>";
	json_t *vs = json_object_get(st, "versions"), *now = json_object_get(st, "now_ms");
	json_t *mb = json_object_get(st, "model_bytes"), *v;
	size_t i, n = json_array_size(vs);

	evbuffer_add_printf(b, "<h2>Versions</h2>");
	evbuffer_add(b, head, sizeof(head) - 1);
	json_array_foreach(vs, i, v) {
		if (i == PAGE_VERSIONS_OPEN)
			evbuffer_add_printf(b, "</table><details><summary>%zu older version%s</summary>%s",
					    n - i, n - i == 1 ? "" : "s", head);
		version_row(b, v, now, mb);
	}
	evbuffer_add_printf(b, n > PAGE_VERSIONS_OPEN ? "</table></details>" : "</table>");
}

void trk__handle_page(struct trk_call *c)
{
	struct trk_status_page pg;
	json_t *st, *now, *v, *e;
	struct evbuffer *b;
	size_t i, j;

	if (trk__status_page(c, &pg) != 0)
		return;
	st = trk__status_json(c->s, &pg);
	b = evbuffer_new();
	if (st == NULL || b == NULL) {
		json_decref(st);
		if (b != NULL)
			evbuffer_free(b);
		trk__fail(c, 500, "out of memory");
		return;
	}
	now = json_object_get(st, "now_ms");
	evbuffer_add(b, page_head, sizeof(page_head) - 1);
	evbuffer_add_printf(b, "<h1>tessera tracker</h1><p>");
	html_esc(b, c->s->url);
	evbuffer_add_printf(b, " &middot; latest version <b>");
	esc_json(b, json_object_get(st, "latest"));
	evbuffer_add_printf(b, "</b> &middot; model ");
	bytes_text(b, json_object_get(st, "model_bytes"));
	evbuffer_add_printf(b, " &middot; nodes alive ");
	esc_json(b, json_object_get(st, "nodes_alive"));
	evbuffer_add_printf(b, " &middot; sent by the trainer ");
	bytes_text(b, json_object_get(st, "bytes_from_trainer"));
	evbuffer_add_printf(b, ", by peers ");
	bytes_text(b, json_object_get(st, "bytes_from_peers"));
	evbuffer_add_printf(b, " &middot; %s</p>",
			    c->s->auth ? "authenticated" : "<b>unauthenticated</b>");

	page_replicas(b, st, &pg);
	page_timelines(b, c->s);
	page_versions(b, st);

	evbuffer_add_printf(b, "<h2>Publishers</h2><table><tr><th>id</th><th>alive</th>"
			       "<th>ranks</th><th>offers versions</th></tr>");
	json_array_foreach(json_object_get(st, "publishers"), i, v) {
		evbuffer_add_printf(b, "<tr class=\"%s\">",
				    json_is_true(json_object_get(v, "alive")) ? "" : "gone");
		cell(b, v, "id");
		cell(b, v, "alive");
		evbuffer_add_printf(b, "<td>");
		json_array_foreach(json_object_get(v, "ranks"), j, e) {
			if (j > 0)
				evbuffer_add(b, ", ", 2);
			esc_json(b, json_object_get(e, "rank"));
			evbuffer_add(b, "@", 1);
			esc_json(b, json_object_get(e, "host"));
		}
		evbuffer_add_printf(b, "</td>");
		cell(b, v, "offered_versions");
		evbuffer_add_printf(b, "</tr>");
	}
	evbuffer_add_printf(b, "</table>");

	evbuffer_add_printf(b, "<h2>Activations</h2><table><tr><th>replica</th>"
			       "<th>version</th><th>when</th></tr>");
	json_array_foreach(json_object_get(st, "activations"), i, v) {
		if (i >= 20)
			break;
		evbuffer_add_printf(b, "<tr>");
		cell(b, v, "replica");
		cell(b, v, "version");
		age(b, now, json_object_get(v, "wall_ms"));
		evbuffer_add_printf(b, "</tr>");
	}
	evbuffer_add_printf(b, "</table><p><a href=\"" TRK_API "/status\">JSON</a> &middot; "
			       "<a href=\"/metrics\">metrics</a></p></body></html>\n");

	size_t len = evbuffer_get_length(b);
	const uint8_t *p = evbuffer_pullup(b, -1);
	if (p == NULL)
		trk__fail(c, 500, "out of memory");
	else
		trk__reply_raw(c, 200, "text/html; charset=utf-8", p, len);
	evbuffer_free(b);
	json_decref(st);
}
