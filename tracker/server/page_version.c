/* GET /versions/N: a version's page: its update timeline, every replica's
 * time to prepared and activated with its bytes by source, and where the
 * publisher's time went. */
#include <inttypes.h>
#include <stdio.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

/* "+1.234 s" after t0, or "-" when t did not pass (yet). */
static void after_cell(struct evbuffer *b, uint64_t t0, uint64_t t)
{
	if (t == 0 || t0 == 0 || t < t0)
		evbuffer_add_printf(b, "<td>-</td>");
	else
		evbuffer_add_printf(b, "<td>+%.3f s</td>", (double)(t - t0) / 1000.0);
}

static void bytes_cell(struct evbuffer *b, uint64_t n)
{
	json_t *v = json_integer((json_int_t)n);

	evbuffer_add_printf(b, "<td>");
	trk__html_bytes(b, v);
	evbuffer_add_printf(b, "</td>");
	json_decref(v);
}

static void replicas_table(struct evbuffer *b, json_t *tl, uint64_t t0)
{
	json_t *rp, *rk;
	size_t i, k;

	evbuffer_add_printf(b, "<h2>Replicas</h2><table><tr><th>replica</th><th>ranks</th>"
			       "<th>prepared</th><th>activated</th><th>from trainer</th>"
			       "<th>from peers</th><th>from peers, share</th></tr>");
	json_array_foreach(json_object_get(tl, "replicas"), i, rp) {
		uint64_t ft = 0, fp = 0;
		json_array_foreach(json_object_get(rp, "ranks"), k, rk) {
			ft += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer"));
			fp += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers"));
		}
		evbuffer_add_printf(b, "<tr>");
		trk__html_cell(b, rp, "replica");
		trk__html_cell(b, rp, "nranks");
		after_cell(b, t0, trk__html_ms(rp, "prepared_ms"));
		after_cell(b, t0, trk__html_ms(rp, "activated_ms"));
		bytes_cell(b, ft);
		bytes_cell(b, fp);
		if (ft + fp > 0)
			evbuffer_add_printf(b, "<td>%.0f %%</td>", 100.0 * (double)fp / (double)(ft + fp));
		else
			evbuffer_add_printf(b, "<td>-</td>");
		evbuffer_add_printf(b, "</tr>");
	}
	evbuffer_add_printf(b, "</table>");
}

/* The publisher's phases in words, in the order it gave them. */
static void phases_table(struct evbuffer *b, json_t *pub)
{
	json_t *ph;
	size_t k;

	if (!json_is_object(pub)) {
		evbuffer_add_printf(b, "<p>The publisher sent no phases for this version.</p>");
		return;
	}
	evbuffer_add_printf(b, "<table><tr><th>phase</th><th>time</th></tr>");
	json_array_foreach(json_object_get(pub, "phases_ms"), k, ph) {
		evbuffer_add_printf(b, "<tr><td>");
		trk__html_json(b, json_array_get(ph, 0));
		evbuffer_add_printf(b, "</td><td>%.3f s</td></tr>",
				    (double)json_integer_value(json_array_get(ph, 1)) / 1000.0);
	}
	evbuffer_add_printf(b, "<tr><th>in all, from the export request to the offer (the "
			       "publisher's clock)</th><th>%.3f s</th></tr></table>",
			    (double)json_integer_value(json_object_get(pub, "total_ms")) / 1000.0);
}

void trk__page_version(struct evbuffer *b, json_t *tl)
{
	long long v = (long long)json_integer_value(json_object_get(tl, "version"));
	uint64_t asked = trk__html_ms(tl, "export_asked_ms"), pub = trk__html_ms(tl, "published_ms");
	uint64_t t0 = asked ? asked : pub;
	json_t *one = json_array();

	evbuffer_add_printf(b, "<h1>version %lld</h1><p>", v);
	trk__html_json(b, json_object_get(tl, "kind"));
	evbuffer_add_printf(b, ", ");
	trk__html_bytes(b, json_object_get(tl, "wire_bytes"));
	evbuffer_add_printf(b, " on the wire &middot; from the trainer ");
	trk__html_bytes(b, json_object_get(tl, "bytes_from_trainer"));
	evbuffer_add_printf(b, ", from peers ");
	trk__html_bytes(b, json_object_get(tl, "bytes_from_peers"));
	if (asked != 0 && pub >= asked)
		evbuffer_add_printf(b, " &middot; published %.3f s after its export was asked "
				       "(from the manifest's time, on the publisher's clock, to the "
				       "tracker's acceptance, on its own)",
				    (double)(pub - asked) / 1000.0);
	/* Its place in the chain, its identity, and whether it is still served. */
	evbuffer_add_printf(b, "</p><p>parent ");
	if (json_integer_value(json_object_get(tl, "parent")) > 0)
		evbuffer_add_printf(b, "<a href=\"/versions/%lld\">v%lld</a>",
				    (long long)json_integer_value(json_object_get(tl, "parent")),
				    (long long)json_integer_value(json_object_get(tl, "parent")));
	else
		evbuffer_add_printf(b, "- (none)");
	evbuffer_add_printf(b, " &middot; digest <code>");
	trk__html_json(b, json_object_get(tl, "digest"));
	evbuffer_add_printf(b, "</code> &middot; %s",
			    json_is_true(json_object_get(tl, "dropped")) ?
				    "<b>dropped</b>: no live publisher serves its parcels" :
				    "served");
	evbuffer_add_printf(b, " &middot; <a href=\"/\">status page</a> &middot; "
			       "<a href=\"" TRK_API "/versions/%lld/timeline\">JSON</a></p>", v);
	evbuffer_add_printf(b, "<h2>Timeline</h2>");
	trk__chart_timeline(b, tl, trk__chart_span(tl, true));
	replicas_table(b, tl, t0);
	evbuffer_add_printf(b, "<h2>The publisher</h2>");
	if (one != NULL && json_array_append(one, tl) == 0)
		trk__page_phases(b, one);
	json_decref(one);
	phases_table(b, json_object_get(tl, "publish"));
}

void trk__handle_version_page(struct trk_call *c, const char *num)
{
	struct trk_version *ver;
	struct evbuffer *b;
	uint64_t v;
	json_t *tl;
	char title[64];

	if (num[0] == '0' || proto_parse_u64(num, 1, UINT64_MAX, &v) != 0) {
		trk__fail(c, 400, "version '%.40s' is not a positive integer without leading zeros",
			  num);
		return;
	}
	ver = trk__versions_find(c->s->vs, v);
	if (ver == NULL) {
		trk__fail(c, 404, "version %" PRIu64 " is unknown", v);
		return;
	}
	tl = trk__timeline_json(c->s->reg->tl, ver);
	b = evbuffer_new();
	if (tl == NULL || b == NULL ||
	    trk__set(tl, "bytes_from_trainer", trk__jint(ver->bytes_from_trainer)) ||
	    trk__set(tl, "bytes_from_peers", trk__jint(ver->bytes_from_peers)) ||
	    trk__set(tl, "parent", trk__jint(ver->parent)) ||
	    trk__set(tl, "digest", trk__json_hex(ver->digest, PROTO_HASH_BYTES)) ||
	    trk__set(tl, "dropped", json_boolean(trk__version_dropped(c->s, v)))) {
		json_decref(tl);
		if (b != NULL)
			evbuffer_free(b);
		trk__fail(c, 500, "out of memory");
		return;
	}
	snprintf(title, sizeof(title), "tessera: version %" PRIu64, v);
	trk__html_head(b, title, 2);
	trk__page_version(b, tl);
	evbuffer_add_printf(b, "</body></html>\n");
	trk__html_reply(c, b);
	json_decref(tl);
}
