/* What the tracker shows: status JSON, the status page, Prometheus metrics. */
#include <errno.h>
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

#define STATUS_VERSIONS 64 /* newest versions the status shows */
#define STATUS_NAMES 32     /* replica names a version entry lists */
#define STATUS_REPLICAS 100 /* replicas a status shows unless asked for more */
#define STATUS_REPLICAS_MAX 100000
#define STATUS_RANKS 200    /* rank rows a status shows unless asked for a count of
			     * replicas: a page of 100 ten-rank replicas took the
			     * tracker longer to make than a person to scroll */

json_t *trk__status_json(struct trk_server *s, struct trk_status_page *pg)
{
	struct trk_versions *vs = s->vs;
	size_t n = trk__versions_count(vs), first = n > STATUS_VERSIONS ?
							    n - STATUS_VERSIONS :
							    0;
	json_t *o = trk__registry_status(s->reg, pg), *arr = json_array();
	int bad = o == NULL || arr == NULL;

	for (size_t i = n; !bad && i > first; i--) {
		struct trk_version *v = trk__versions_at(vs, i - 1);
		json_t *e = trk__version_json(s, v);
		bad |= e == NULL;
		if (bad)
			break;
		bad |= trk__set(e, "bytes_from_trainer", trk__jint(v->bytes_from_trainer));
		bad |= trk__set(e, "bytes_from_peers", trk__jint(v->bytes_from_peers));
		bad |= trk__set(e, "duplicate_bytes", trk__jint(v->duplicate_bytes));
		bad |= trk__set(e, "refetched_bytes", trk__jint(v->refetched_bytes));
		bad |= trk__set(e, "layouts", json_integer(v->nlayouts));
		uint64_t nc, na;
		bad |= trk__set(e, "complete",
				trk__registry_version_replicas(s->reg, v->version, false,
							       STATUS_NAMES, &nc));
		bad |= trk__set(e, "complete_count", trk__jint(nc));
		bad |= trk__set(e, "active",
				trk__registry_version_replicas(s->reg, v->version, true,
							       STATUS_NAMES, &na));
		bad |= trk__set(e, "active_count", trk__jint(na));
		bad |= json_array_append_new(arr, e) != 0;
	}
	if (!bad) {
		bad |= trk__set(o, "now_ms", trk__jint(proto_wall_ms()));
		bad |= trk__set(o, "started_ms", trk__jint(s->started_ms));
		bad |= trk__set(o, "url", json_string(s->url));
		bad |= trk__set(o, "authenticated", json_boolean(s->auth != NULL));
		bad |= trk__set(o, "lease_ms", trk__jint(s->lease_ms));
		bad |= trk__set(o, "latest", trk__jint(trk__versions_latest(vs)));
		bad |= trk__set(o, "versions_total", trk__jint(n));
		bad |= trk__set(o, "versions", json_incref(arr));
	}
	json_decref(arr);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ?replicas_offset=N&replicas_limit=M; 0 and a failed answer when bad. */
static int status_page(struct trk_call *c, struct trk_status_page *pg)
{
	struct proto_err err = {{0}};

	pg->offset = 0;
	pg->limit = STATUS_REPLICAS;
	pg->ranks_max = trk__query_str(c, "replicas_limit") == NULL ? STATUS_RANKS : 0;
	if (trk__query_u64(c, "replicas_offset", false, UINT64_MAX, &pg->offset, &err) != 0 ||
	    trk__query_u64(c, "replicas_limit", false, STATUS_REPLICAS_MAX, &pg->limit,
			   &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return -EINVAL;
	}
	return 0;
}

void trk__handle_status(struct trk_call *c)
{
	struct trk_status_page pg;

	if (status_page(c, &pg) == 0)
		trk__reply_json(c, 200, trk__status_json(c->s, &pg));
}

/* ---- the page ------------------------------------------------------------------ */

void trk__html_esc(struct evbuffer *b, const char *s)
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

/* A JSON value as escaped text (strings bare, numbers as numbers). */
static void esc_json(struct evbuffer *b, json_t *v)
{
	char buf[64];

	if (json_is_string(v)) {
		trk__html_esc(b, json_string_value(v));
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
	trk__html_esc(b, s);
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
		trk__timeline_svg(b, tl);
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
		trk__html_esc(b, name);
	} else {
		snprintf(s, sizeof(s), "%s", json_string_value(json_object_get(rep, "layout_digest")));
		evbuffer_add_printf(b, "<code>");
		trk__html_esc(b, s);
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
			trk__html_esc(b, alive ? state :
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

	if (status_page(c, &pg) != 0)
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
	trk__html_esc(b, c->s->url);
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

/* ---- metrics --------------------------------------------------------------------- */

static void metric(struct evbuffer *b, const char *name, const char *type,
		   const char *help, uint64_t v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name,
			    help, name, type, name, v);
}

/* Per live replica: active version, target, lag (versions and seconds) and
 * how long its ranks have disagreed. Replica names need no escaping. */
static void replica_metrics(struct evbuffer *b, struct trk_server *s)
{
	static const char *const names[][2] = {
		{"tessera_tracker_replica_active_version", "Version the replica serves."},
		{"tessera_tracker_replica_target_version", "Version the replica's ranks work toward."},
		{"tessera_tracker_replica_lag_versions", "Versions the replica is behind the latest."},
		{"tessera_tracker_replica_lag_seconds", "Seconds since the first version newer than the active one was published."},
		{"tessera_tracker_replica_disagree_seconds", "Seconds the replica's ranks have held different versions."},
	};
	uint64_t now = proto_wall_ms();

	for (size_t m = 0; m < PROTO_ARRAY_LEN(names); m++) {
		evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", names[m][0], names[m][1],
				    names[m][0]);
		for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next) {
			uint64_t lv, lms, dms = rep->disagree_ms ? now - rep->disagree_ms : 0;
			if (!trk__replica_alive(rep))
				continue;
			trk__replica_lag(s, rep, now, &lv, &lms);
			evbuffer_add_printf(b, "%s{replica=\"%s\"} ", names[m][0], rep->name);
			if (m == 0)
				evbuffer_add_printf(b, "%" PRIu64 "\n", rep->active);
			else if (m == 1)
				evbuffer_add_printf(b, "%" PRIu64 "\n", rep->target);
			else if (m == 2)
				evbuffer_add_printf(b, "%" PRIu64 "\n", lv);
			else if (m == 3)
				evbuffer_add_printf(b, "%.3f\n", (double)lms / 1000.0);
			else
				evbuffer_add_printf(b, "%.3f\n", (double)dms / 1000.0);
		}
	}
}

void trk__handle_metrics(struct trk_call *c)
{
	struct trk_server *s = c->s;
	struct evbuffer *b = evbuffer_new();
	struct trk_counts k;
	static const char *classes[] = {NULL, "1xx", "2xx", "3xx", "4xx", "5xx"};

	if (b == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__registry_counts(s->reg, &k);
	/* Names: tessera_tracker_*, base units in the name, _total only on
	 * counters; a state or kind is a label (see tracker/API.md). */
	metric(b, "tessera_tracker_versions", "gauge", "Versions in the log.",
	       trk__versions_count(s->vs));
	metric(b, "tessera_tracker_latest_version", "gauge", "Newest version number.",
	       trk__versions_latest(s->vs));
	trk__versions_metrics(s->vs, b);
	evbuffer_add_printf(b, "# HELP tessera_tracker_replicas Replicas by state (current: "
			       "active on the latest version).\n# TYPE tessera_tracker_replicas gauge\n");
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"current\"} %" PRIu64 "\n",
			    k.replicas_current);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"behind\"} %" PRIu64 "\n",
			    k.replicas_behind);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"partial\"} %" PRIu64 "\n",
			    k.replicas_partial);
	evbuffer_add_printf(b, "tessera_tracker_replicas{state=\"gone\"} %" PRIu64 "\n",
			    k.replicas_gone);
	replica_metrics(b, s);
	evbuffer_add_printf(b, "# HELP tessera_tracker_nodes Node ranks by lease state.\n"
			       "# TYPE tessera_tracker_nodes gauge\n"
			       "tessera_tracker_nodes{state=\"alive\"} %" PRIu64 "\n"
			       "tessera_tracker_nodes{state=\"gone\"} %" PRIu64 "\n",
			    k.nodes_alive, k.nodes_gone);
	metric(b, "tessera_tracker_publishers", "gauge", "Publishers with a live lease.",
	       k.publishers_alive);
	evbuffer_add_printf(b, "# HELP tessera_tracker_reported_fetched_bytes_total Bytes nodes "
			       "reported fetching, by source kind.\n"
			       "# TYPE tessera_tracker_reported_fetched_bytes_total counter\n"
			       "tessera_tracker_reported_fetched_bytes_total{source=\"trainer\"} %" PRIu64 "\n"
			       "tessera_tracker_reported_fetched_bytes_total{source=\"peer\"} %" PRIu64 "\n",
			    k.bytes_from_trainer, k.bytes_from_peers);
	metric(b, "tessera_tracker_activations_total", "counter",
	       "Replica activations since start.", k.activations);
	trk__canary_metrics(s, b);
	evbuffer_add_printf(b, "# HELP tessera_tracker_layout_cache_lookups_total Node "
			       "registrations by whether their layout was a form already parsed.\n"
			       "# TYPE tessera_tracker_layout_cache_lookups_total counter\n"
			       "tessera_tracker_layout_cache_lookups_total{result=\"hit\"} %" PRIu64 "\n"
			       "tessera_tracker_layout_cache_lookups_total{result=\"miss\"} %" PRIu64 "\n",
			    k.layout_cache_hits, k.layout_cache_misses);
	uint64_t sh, sm;
	trk__srcache_stats(s->reg->srcache, &sh, &sm);
	evbuffer_add_printf(b, "# HELP tessera_tracker_sources_cache_answers_total Sources "
			       "queries answered from a kept answer (hit) or that built one (miss).\n"
			       "# TYPE tessera_tracker_sources_cache_answers_total counter\n"
			       "tessera_tracker_sources_cache_answers_total{result=\"hit\"} %" PRIu64 "\n"
			       "tessera_tracker_sources_cache_answers_total{result=\"miss\"} %" PRIu64 "\n",
			    sh, sm);
	metric(b, "tessera_tracker_sources_batches_total", "counter",
	       "Batched sources queries (POST /sources) answered.", s->reg->src_batches);
	metric(b, "tessera_tracker_sources_batched_parcels_total", "counter",
	       "Parcels asked for in batched sources queries.", s->reg->src_batched);
	metric(b, "tessera_tracker_watches_held", "gauge",
	       "Long-polls held now (version watches, addendum waits).",
	       (uint64_t)trk__versions_held(s->vs));
	metric(b, "tessera_tracker_auth_refused_requests_total", "counter",
	       "POSTs refused by authentication.", s->auth_refused);
	trk__conns_metrics(s, b);
	evbuffer_add_printf(b, "# HELP tessera_tracker_http_responses_total Answers by status class.\n"
			       "# TYPE tessera_tracker_http_responses_total counter\n");
	for (int i = 1; i <= 5; i++)
		evbuffer_add_printf(b, "tessera_tracker_http_responses_total{code=\"%s\"} %" PRIu64 "\n",
				    classes[i], s->answers[i]);

	size_t len = evbuffer_get_length(b);
	const uint8_t *p = evbuffer_pullup(b, -1);
	if (p == NULL)
		trk__fail(c, 500, "out of memory");
	else
		trk__reply_raw(c, 200, "text/plain; version=0.0.4", p, len);
	evbuffer_free(b);
}
