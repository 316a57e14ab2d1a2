/* The publishers on the status page: their clock against the versions
 * that got out, and where each version's time went on the trainer. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

static double s_of(json_t *o, const char *key)
{
	return (double)json_integer_value(json_object_get(o, key)) / 1000.0;
}

/* "every 1.5 s; got out every 1.6 s (median), last 1.4 s, 0.3 s ago", a
 * late one in colour with how many clocks it missed, a slow one with how
 * many clocks its versions take. */
static void clock_cell(struct evbuffer *b, json_t *ck)
{
	bool late = json_is_true(json_object_get(ck, "late"));
	bool slow = json_is_true(json_object_get(ck, "slow"));
	json_t *every = json_object_get(ck, "every_ms");

	evbuffer_add_printf(b, "<td class=\"%s\">", late || slow ? "late" : "");
	if (!json_is_object(ck)) {
		evbuffer_add_printf(b, "-</td>");
		return;
	}
	if (json_is_integer(every))
		evbuffer_add_printf(b, "every %.1f s", s_of(ck, "every_ms"));
	else
		evbuffer_add_printf(b, "no clock");
	if (json_is_integer(json_object_get(ck, "interval_median_ms")))
		evbuffer_add_printf(b, "; versions every %.1f s (median), the last after %.1f s",
				    s_of(ck, "interval_median_ms"), s_of(ck, "interval_last_ms"));
	if (json_is_integer(json_object_get(ck, "since_last_ms")))
		evbuffer_add_printf(b, "; the last %.1f s ago", s_of(ck, "since_last_ms"));
	if (late && json_integer_value(every) > 0)
		evbuffer_add_printf(b, " &mdash; <b>late: %.1f&times; its clock</b>",
				    (double)json_integer_value(json_object_get(ck, "since_last_ms")) /
					    (double)json_integer_value(every));
	else if (late)
		evbuffer_add_printf(b, " &mdash; <b>late: no version yet</b>");
	if (slow && json_integer_value(every) > 0)
		evbuffer_add_printf(b, " &mdash; <b>slow: versions every %.1f&times; its clock</b>",
				    (double)json_integer_value(json_object_get(ck, "interval_median_ms")) /
					    (double)json_integer_value(every));
	evbuffer_add_printf(b, "</td>");
}

void trk__page_publishers(struct evbuffer *b, json_t *st)
{
	json_t *v, *e;
	size_t i, j;

	evbuffer_add_printf(b, "<h2>Publishers</h2><table><tr><th>id</th><th>alive</th>"
			       "<th>ranks</th><th>clock</th><th>offers versions</th></tr>");
	json_array_foreach(json_object_get(st, "publishers"), i, v) {
		evbuffer_add_printf(b, "<tr class=\"%s\">",
				    json_is_true(json_object_get(v, "alive")) ? "" : "gone");
		trk__html_cell(b, v, "id");
		trk__html_cell(b, v, "alive");
		evbuffer_add_printf(b, "<td>");
		json_array_foreach(json_object_get(v, "ranks"), j, e) {
			if (j > 0)
				evbuffer_add(b, ", ", 2);
			trk__html_json(b, json_object_get(e, "rank"));
			evbuffer_add(b, "@", 1);
			trk__html_json(b, json_object_get(e, "host"));
		}
		evbuffer_add_printf(b, "</td>");
		clock_cell(b, json_object_get(v, "clock"));
		trk__html_cell(b, v, "offered_versions");
		evbuffer_add_printf(b, "</tr>");
	}
	evbuffer_add_printf(b, "</table>");
	trk__page_phases(b, json_object_get(st, "versions"));
}

/* ---- time per version by phase --------------------------------------------------- */

#define PH_W 760
#define PH_LABEL 60
#define PH_RIGHT 150
#define PH_ROW 20
#define PH_BAR 12
#define PH_ROWS 8 /* versions drawn at most */

static const char *const colors[] = {"#8e6cc0", "#4a90d9", "#e0a030", "#3a3", "#c3b1e1",
				     "#d06060", "#60a0a0", "#a0a040"};

/* The publish object's delta was encoded and not kept. */
static bool delta_discarded(json_t *pub)
{
	json_t *d = json_object_get(pub, "delta");
	return json_is_true(json_object_get(d, "tried")) && json_is_false(json_object_get(d, "kept"));
}

/* One line on the delta: tried, kept or not, its size, time, and why
 * (bold where html, plain text for a tooltip). */
static void delta_text(struct evbuffer *b, json_t *d, bool html)
{
	json_t *pct = json_object_get(d, "percent");

	if (!json_is_true(json_object_get(d, "tried")))
		return;
	evbuffer_add_printf(b, "delta %s",
			    !json_is_false(json_object_get(d, "kept")) ? "kept" :
			    html ? "<b>discarded</b>" : "discarded");
	if (json_is_number(pct))
		evbuffer_add_printf(b, " at %.1f %% of the anchor", json_number_value(pct));
	if (json_is_integer(json_object_get(d, "encode_ms")))
		evbuffer_add_printf(b, " after %.1f s of encoding", s_of(d, "encode_ms"));
	if (json_is_true(json_object_get(d, "stopped_early")))
		evbuffer_add_printf(b, " (stopped early)");
	if (json_is_string(json_object_get(d, "why"))) {
		evbuffer_add_printf(b, ": ");
		trk__html_esc(b, json_string_value(json_object_get(d, "why")));
	}
}

void trk__page_phases(struct evbuffer *b, json_t *versions)
{
	json_t *v, *pub, *ph, *legend = NULL;
	size_t i, k, rows = 0;
	uint64_t span = 1;

	json_array_foreach(versions, i, v) {
		pub = json_object_get(v, "publish");
		if (!json_is_object(pub) || rows >= PH_ROWS)
			continue;
		rows++;
		if (trk__html_ms(pub, "total_ms") > span)
			span = trk__html_ms(pub, "total_ms");
		if (legend == NULL)
			legend = json_object_get(pub, "phases_ms");
	}
	if (rows == 0)
		return;
	int h = 8 + (int)rows * PH_ROW + 22;
	double pw = PH_W - PH_LABEL - PH_RIGHT;
	evbuffer_add_printf(b, "<h3>Time per version on the trainer, by phase</h3>"
			       "<svg class=\"phases\" xmlns=\"http://www.w3.org/2000/svg\" "
			       "width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
			       "font-family=\"sans-serif\" font-size=\"11\"><defs>"
			       "<pattern id=\"hatch\" width=\"6\" height=\"6\" "
			       "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
			       "<rect width=\"6\" height=\"6\" fill=\"#f3d9a0\"/>"
			       "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#b07000\" "
			       "stroke-width=\"3\"/></pattern></defs>",
			    PH_W, h, PH_W, h);
	rows = 0;
	json_array_foreach(versions, i, v) {
		pub = json_object_get(v, "publish");
		if (!json_is_object(pub) || rows >= PH_ROWS)
			continue;
		int y = 8 + (int)rows * PH_ROW;
		double x = PH_LABEL;
		bool gone = delta_discarded(pub);
		rows++;
		evbuffer_add_printf(b, "<a href=\"/versions/%lld\"><text x=\"4\" y=\"%d\" "
				       "fill=\"#06c\">v%lld</text></a>",
				    (long long)json_integer_value(json_object_get(v, "version")),
				    y + PH_BAR - 2,
				    (long long)json_integer_value(json_object_get(v, "version")));
		json_array_foreach(json_object_get(pub, "phases_ms"), k, ph) {
			const char *name = json_string_value(json_array_get(ph, 0));
			json_t *ms = json_array_get(ph, 1);
			if (name == NULL || !json_is_integer(ms) || json_integer_value(ms) < 0)
				continue;
			double w = pw * (double)json_integer_value(ms) / (double)span;
			bool hatch = gone && strcmp(name, "delta encode") == 0;
			evbuffer_add_printf(b, "<rect class=\"%s\" x=\"%.1f\" y=\"%d\" width=\"%.1f\" "
					       "height=\"%d\" fill=\"%s\"><title>",
					    hatch ? "discarded" : "phase", x, y, w, PH_BAR,
					    hatch ? "url(#hatch)" : colors[k % PROTO_ARRAY_LEN(colors)]);
			trk__html_esc(b, name);
			evbuffer_add_printf(b, ": %.3f s", (double)json_integer_value(ms) / 1000.0);
			if (hatch) {
				evbuffer_add_printf(b, " (thrown away: ");
				delta_text(b, json_object_get(pub, "delta"), false);
				evbuffer_add_printf(b, ")");
			}
			evbuffer_add_printf(b, "</title></rect>");
			x += w;
		}
		evbuffer_add_printf(b, "<text x=\"%.1f\" y=\"%d\">%.1f s%s</text>", x + 4,
				    y + PH_BAR - 2, s_of(pub, "total_ms"),
				    gone ? ", delta discarded" : "");
	}
	/* The legend: the phases' names as the first version gives them. */
	double lx = 4;
	int ly = 8 + (int)rows * PH_ROW + 4;
	json_array_foreach(legend, k, ph) {
		const char *name = json_string_value(json_array_get(ph, 0));
		if (name == NULL)
			continue;
		evbuffer_add_printf(b, "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" "
				       "fill=\"%s\"/><text x=\"%.0f\" y=\"%d\">",
				    lx, ly, colors[k % PROTO_ARRAY_LEN(colors)], lx + 13, ly + 9);
		trk__html_esc(b, name);
		evbuffer_add_printf(b, "</text>");
		lx += 24 + 6.4 * (double)strlen(name);
	}
	evbuffer_add_printf(b, "<rect x=\"%.0f\" y=\"%d\" width=\"10\" height=\"10\" "
			       "fill=\"url(#hatch)\"/><text x=\"%.0f\" y=\"%d\">delta encoded, "
			       "thrown away</text></svg>",
			    lx, ly, lx + 13, ly + 9);
	/* The deltas tried in words, newest first. */
	rows = 0;
	json_array_foreach(versions, i, v) {
		pub = json_object_get(v, "publish");
		if (!json_is_object(pub) || rows++ >= PH_ROWS ||
		    !json_is_true(json_object_get(json_object_get(pub, "delta"), "tried")))
			continue;
		evbuffer_add_printf(b, "<div class=\"%s\">v%lld: ",
				    delta_discarded(pub) ? "late" : "",
				    (long long)json_integer_value(json_object_get(v, "version")));
		delta_text(b, json_object_get(pub, "delta"), true);
		evbuffer_add_printf(b, "</div>");
	}
}
