/* The replicas on the status page: each one's state in words and colour
 * (current, updating, behind, failed, gone, and why), then its ranks. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

/* "Replicas": counts by state, which of them this page shows, and links to
 * the pages before and after. */
static void heading(struct evbuffer *b, json_t *st, const struct trk_status_page *pg)
{
	static const char *const states[] = {"current", "updating", "behind", "failed",
					     "partial", "gone"};
	json_t *by = json_object_get(st, "replicas_by_state");
	uint64_t total = (uint64_t)json_integer_value(json_object_get(st, "replicas_total"));
	uint64_t shown = json_array_size(json_object_get(st, "replicas"));

	evbuffer_add_printf(b, "<h2>Replicas</h2><p>%" PRIu64 " replica%s:", total,
			    total == 1 ? "" : "s");
	for (size_t i = 0; i < PROTO_ARRAY_LEN(states); i++)
		evbuffer_add_printf(b, "%s %lld %s", i ? "," : "",
				    (long long)json_integer_value(json_object_get(by, states[i])),
				    states[i]);
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

/* The replica's state in words, in its colour: "behind: rank 1 (B/1) is
 * dead ...", with a bar of its current fetch. */
static void state_cell(struct evbuffer *b, json_t *rep, size_t rows)
{
	const char *state = json_string_value(json_object_get(rep, "state"));
	json_t *f = json_object_get(rep, "fetch");

	evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"why st-", rows);
	trk__html_esc(b, state ? state : "unknown");
	evbuffer_add_printf(b, "\"><b>");
	trk__html_esc(b, state ? state : "unknown");
	evbuffer_add_printf(b, "</b>: ");
	trk__html_json(b, json_object_get(rep, "why"));
	if (json_is_object(f) && json_integer_value(json_object_get(f, "bytes_total")) > 0)
		evbuffer_add_printf(b, "<br><progress max=\"%lld\" value=\"%lld\"></progress>",
				    (long long)json_integer_value(json_object_get(f, "bytes_total")),
				    (long long)json_integer_value(json_object_get(f, "bytes_done")));
	evbuffer_add_printf(b, "</td>");
}

/* How far a replica is behind the latest version, and why its ranks
 * disagree when they have for a while. */
static void lag_text(struct evbuffer *b, json_t *rep)
{
	trk__html_json(b, json_object_get(rep, "lag_versions"));
	evbuffer_add_printf(b, " versions, %.1f s",
			    (double)json_integer_value(json_object_get(rep, "lag_ms")) / 1000.0);
	if (json_is_string(json_object_get(rep, "disagreement"))) {
		evbuffer_add_printf(b, "<br><span class=\"failed\">ranks disagree for %.1f s: ",
				    (double)json_integer_value(json_object_get(rep, "disagree_ms")) /
					    1000.0);
		trk__html_json(b, json_object_get(rep, "disagreement"));
		evbuffer_add_printf(b, "</span>");
	}
}

/* The rank's last canary probe, against the version it serves now: a
 * match there is ok; a probe of an older version is shown as old. */
static void canary_cell(struct evbuffer *b, json_t *cn)
{
	json_t *ok = json_object_get(cn, "ok");
	long long v = (long long)json_integer_value(json_object_get(cn, "version"));

	if (!json_is_object(cn)) {
		evbuffer_add_printf(b, "<td>-</td>");
		return;
	}
	if (json_is_false(json_object_get(cn, "live"))) {
		evbuffer_add_printf(b, "<td class=\"old\">v%lld probed, not the live version%s</td>",
				    v, json_is_false(ok) ? " (it mismatched)" : "");
		return;
	}
	evbuffer_add_printf(b, "<td class=\"%s\">v%lld ",
			    json_is_false(ok) ? "failed" : json_is_true(ok) ? "active" : "", v);
	evbuffer_add_printf(b, "%s</td>", json_is_true(ok) ? "ok" :
					  json_is_false(ok) ? "<b>MISMATCH</b>" : "no expected score");
}

/* The columns of a replica that span its rank rows. */
static void replica_cells(struct evbuffer *b, json_t *v, size_t rows)
{
	const char *rcls = json_is_true(json_object_get(v, "alive")) ? "" : "gone";

	evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"%s\"><b>", rows, rcls);
	trk__html_json(b, json_object_get(v, "replica"));
	evbuffer_add_printf(b, "</b></td>");
	layout_cell(b, v, rows, rcls);
	state_cell(b, v, rows);
	evbuffer_add_printf(b, "<td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
	trk__html_json(b, json_object_get(v, "active"));
	if (json_is_true(json_object_get(v, "incomplete")))
		evbuffer_add_printf(b, " <i>incomplete</i>");
	evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
	trk__html_json(b, json_object_get(v, "target"));
	evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
	lag_text(b, v);
	evbuffer_add_printf(b, "</td><td rowspan=\"%zu\" class=\"%s\">", rows, rcls);
	trk__html_json(b, json_object_get(v, "complete"));
	evbuffer_add_printf(b, "</td>");
}

static void rank_cells(struct evbuffer *b, json_t *e)
{
	bool alive = json_is_true(json_object_get(e, "alive"));
	const char *state = json_string_value(json_object_get(e, "state"));
	json_int_t done = json_integer_value(json_object_get(e, "bytes_done"));
	json_int_t total = json_integer_value(json_object_get(e, "bytes_total"));

	trk__html_cell(b, e, "rank");
	trk__html_cell(b, e, "id");
	trk__html_cell(b, e, "host");
	evbuffer_add_printf(b, "<td>");
	trk__html_esc(b, alive ? state : json_is_null(json_object_get(e, "id")) ? "absent" : "dead");
	evbuffer_add_printf(b, "</td>");
	/* The version, and how the rank built it (delta, chain, full). */
	evbuffer_add_printf(b, "<td>");
	trk__html_json(b, json_object_get(e, "version"));
	if (json_is_string(json_object_get(e, "how"))) {
		evbuffer_add_printf(b, " by ");
		trk__html_json(b, json_object_get(e, "how"));
	}
	evbuffer_add_printf(b, "</td>");
	if (total > 0 && alive) {
		evbuffer_add_printf(b, "<td><progress max=\"%lld\" value=\"%lld\"></progress> %.0f%% of ",
				    (long long)total, (long long)done,
				    100.0 * (double)done / (double)total);
		trk__html_bytes(b, json_object_get(e, "bytes_total"));
		evbuffer_add_printf(b, "</td>");
	} else {
		evbuffer_add_printf(b, "<td>-</td>");
	}
	canary_cell(b, json_object_get(e, "canary"));
	evbuffer_add_printf(b, "<td>");
	trk__html_json(b, json_object_get(e, "error"));
	if (json_is_string(json_object_get(e, "banned"))) {
		evbuffer_add_printf(b, " banned peers: ");
		trk__html_json(b, json_object_get(e, "banned"));
	}
	evbuffer_add_printf(b, "</td>");
}

/* Whether replica v is in site (NULL: the unnamed site). */
static bool in_site(json_t *v, const char *site)
{
	const char *s = json_string_value(json_object_get(v, "site"));

	return strcmp(s != NULL ? s : "", site != NULL ? site : "") == 0;
}

/* A site's heading row: its name, its replicas (alive, current) and its
 * publishers. */
static void site_row(struct evbuffer *b, json_t *site)
{
	const char *name = json_string_value(json_object_get(site, "site"));

	evbuffer_add_printf(b, "<tr class=\"site\"><th colspan=\"15\">site ");
	trk__html_esc(b, name != NULL ? name : "(unnamed)");
	evbuffer_add_printf(b, ": %lld replicas, %lld alive, %lld on the latest version; "
			       "%lld publishers</th></tr>",
			    (long long)json_integer_value(json_object_get(site, "replicas")),
			    (long long)json_integer_value(json_object_get(site, "replicas_alive")),
			    (long long)json_integer_value(json_object_get(site, "replicas_current")),
			    (long long)json_integer_value(json_object_get(site, "publishers_alive")));
}

/* The rows of the replicas in site (all of them when !only). */
static void replica_rows(struct evbuffer *b, json_t *st, bool only, const char *site)
{
	json_t *v, *e;
	size_t i, j;

	json_array_foreach(json_object_get(st, "replicas"), i, v) {
		json_t *ranks = json_object_get(v, "ranks");
		size_t rows = json_array_size(ranks);
		if (only && !in_site(v, site))
			continue;
		json_array_foreach(ranks, j, e) {
			bool alive = json_is_true(json_object_get(e, "alive"));
			const char *state = json_string_value(json_object_get(e, "state"));
			evbuffer_add_printf(b, "<tr class=\"%s\">",
					    !alive ? "gone" :
					    state && strcmp(state, "failed") == 0 ? "failed" :
					    state && strcmp(state, "active") == 0 ? "active" : "");
			if (j == 0)
				replica_cells(b, v, rows);
			rank_cells(b, e);
			evbuffer_add_printf(b, "</tr>");
		}
	}
}

void trk__page_replicas(struct evbuffer *b, json_t *st, const struct trk_status_page *pg)
{
	json_t *sites = json_object_get(st, "sites"), *site;
	size_t k;
	/* Grouped by site once one is named; else one table as before. */
	bool grouped = json_array_size(sites) > 1 ||
		       (json_array_size(sites) == 1 &&
			json_is_string(json_object_get(json_array_get(sites, 0), "site")));

	heading(b, st, pg);
	evbuffer_add_printf(b, "<table><tr><th>replica</th><th>layout</th><th>replica state</th>"
			       "<th>active</th><th>target</th><th>lag</th><th>complete at</th>"
			       "<th>rank</th><th>node</th>"
			       "<th>host</th><th>rank state</th><th>version</th><th>progress</th>"
			       "<th>canary</th><th>error</th></tr>");
	if (!grouped)
		replica_rows(b, st, false, NULL);
	json_array_foreach(grouped ? sites : NULL, k, site) {
		site_row(b, site);
		replica_rows(b, st, true, json_string_value(json_object_get(site, "site")));
	}
	evbuffer_add_printf(b, "</table>");
}
