/* GET /: the status page, HTML made from the status JSON: the replicas and
 * why each is where it is, the newest versions' update timelines at one
 * time scale, the versions, the publishers and their clock, activations.
 * The pieces are page_*.c (page.h); /versions/N is page_version.c. */
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

static void short_hex(struct evbuffer *b, json_t *o, const char *key)
{
	const char *h = json_string_value(json_object_get(o, key));
	char s[13];

	snprintf(s, sizeof(s), "%s", h ? h : "-");
	evbuffer_add_printf(b, "<td><code>");
	trk__html_esc(b, s);
	evbuffer_add_printf(b, "</code></td>");
}

static void human_bytes(struct evbuffer *b, json_t *v)
{
	evbuffer_add_printf(b, "<td>");
	trk__html_bytes(b, v);
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
	trk__html_json(b, names);
	if (n > (json_int_t)json_array_size(names))
		evbuffer_add_printf(b, "%s&hellip; (%lld in all)",
				    json_array_size(names) ? ", " : "", (long long)n);
	evbuffer_add_printf(b, "</td>");
}

/* Where the newest versions' updates spent their time: a chart each, all
 * at one scale (the longest of them, rows of late replicas cut). */
#define PAGE_TIMELINES 3
static void page_timelines(struct evbuffer *b, struct trk_server *s)
{
	size_t n = trk__versions_count(s->vs), k = 0;
	json_t *tls[PAGE_TIMELINES];
	uint64_t span = 0;

	evbuffer_add_printf(b, "<h2>Update timelines</h2>");
	for (size_t i = n; i > 0 && k < PAGE_TIMELINES; i--) {
		struct trk_version *v = trk__versions_at(s->vs, i - 1);
		if ((tls[k] = trk__timeline_json(s->reg->tl, v)) == NULL)
			continue;
		span = PROTO_MAX(span, trk__chart_span(tls[k], false));
		k++;
	}
	if (k == 0)
		evbuffer_add_printf(b, "<p>no version yet</p>");
	else
		evbuffer_add_printf(b, "<p class=\"scale\">one time scale for all: %.1f s from "
				       "each version's export request across</p>",
				    (double)span / 1000.0);
	for (size_t i = 0; i < k; i++) {
		json_int_t v = json_integer_value(json_object_get(tls[i], "version"));
		evbuffer_add_printf(b, "<div class=\"tl\"><b><a href=\"/versions/%lld\">v%lld</a>"
				       "</b> <a href=\"" TRK_API "/versions/%lld/timeline\">JSON</a><br>",
				    (long long)v, (long long)v, (long long)v);
		trk__chart_timeline(b, tls[i], span);
		evbuffer_add_printf(b, "</div>");
		json_decref(tls[i]);
	}
}

static void version_row(struct evbuffer *b, json_t *v, json_t *now, json_t *model_bytes)
{
	evbuffer_add_printf(b, "<tr>");
	evbuffer_add_printf(b, "<td><a href=\"/versions/%lld\">%lld</a></td>",
			    (long long)json_integer_value(json_object_get(v, "version")),
			    (long long)json_integer_value(json_object_get(v, "version")));
	trk__html_cell(b, v, "kind");
	/* An anchor's parent is none: "-", not 0. */
	if (json_integer_value(json_object_get(v, "parent")) > 0)
		trk__html_cell(b, v, "parent");
	else
		evbuffer_add_printf(b, "<td>-</td>");
	human_bytes(b, model_bytes);
	evbuffer_add_printf(b, "<td>");
	trk__html_bytes(b, json_object_get(v, "wire_bytes"));
	evbuffer_add_printf(b, " (");
	trk__html_json(b, json_object_get(v, "layouts"));
	evbuffer_add_printf(b, " layout%s",
			    json_integer_value(json_object_get(v, "layouts")) == 1 ? "" : "s");
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
		trk__html_cell(b, v, "retain");
	short_hex(b, v, "digest");
	evbuffer_add_printf(b, "</tr>");
}

/* The newest versions in a table, older ones folded away below it. */
#define PAGE_VERSIONS_OPEN 5
static void page_versions(struct evbuffer *b, json_t *st)
{
	static const char head[] =
		"<table><tr><th>version</th><th>kind</th><th>parent</th><th>model</th>"
		"<th>on the wire</th><th>published</th><th>complete now on</th><th>active now on</th>"
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
	json_t *st, *now, *v;
	struct evbuffer *b;
	size_t i;

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
	trk__html_head(b, "tessera tracker", 2);
	evbuffer_add_printf(b, "<h1>tessera tracker</h1><p>");
	trk__html_esc(b, c->s->url);
	evbuffer_add_printf(b, " &middot; latest version <b>");
	trk__html_json(b, json_object_get(st, "latest"));
	evbuffer_add_printf(b, "</b> &middot; model ");
	trk__html_bytes(b, json_object_get(st, "model_bytes"));
	evbuffer_add_printf(b, " &middot; nodes alive ");
	trk__html_json(b, json_object_get(st, "nodes_alive"));
	evbuffer_add_printf(b, " &middot; sent by the trainer ");
	trk__html_bytes(b, json_object_get(st, "bytes_from_trainer"));
	evbuffer_add_printf(b, ", by peers ");
	trk__html_bytes(b, json_object_get(st, "bytes_from_peers"));
	evbuffer_add_printf(b, " &middot; %s</p>",
			    c->s->auth ? "authenticated" : "<b>unauthenticated</b>");

	trk__page_replicas(b, st, &pg);
	trk__page_publishers(b, st);
	page_timelines(b, c->s);
	page_versions(b, st);

	evbuffer_add_printf(b, "<h2>Activations</h2><table><tr><th>replica</th>"
			       "<th>version</th><th>when</th></tr>");
	json_array_foreach(json_object_get(st, "activations"), i, v) {
		if (i >= 20)
			break;
		evbuffer_add_printf(b, "<tr>");
		trk__html_cell(b, v, "replica");
		trk__html_cell(b, v, "version");
		age(b, now, json_object_get(v, "wall_ms"));
		evbuffer_add_printf(b, "</tr>");
	}
	evbuffer_add_printf(b, "</table><p><a href=\"" TRK_API "/status\">JSON</a> &middot; "
			       "<a href=\"/metrics\">metrics</a></p></body></html>\n");
	trk__html_reply(c, b);
	json_decref(st);
}
