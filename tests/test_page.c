/* The status pages' pieces (tracker/server/page*.c) from hand-made JSON:
 * a replica's state and colour, the canary against the live version, a
 * publisher's clock, its phases (a discarded delta hatched), timelines at
 * one scale, a version's page. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

static json_t *parse(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, 0, &e);

	if (j == NULL)
		fail_msg("bad test JSON: %s at %d", e.text, e.position);
	return j;
}

/* What fn wrote for j, as a string to free. */
static char *render(void (*fn)(struct evbuffer *, json_t *), json_t *j)
{
	struct evbuffer *b = evbuffer_new();
	assert_non_null(b);
	fn(b, j);
	size_t n = evbuffer_get_length(b);
	char *s = malloc(n + 1);
	assert_non_null(s);
	evbuffer_remove(b, s, n);
	s[n] = 0;
	evbuffer_free(b);
	return s;
}

static void has(const char *html, const char *what)
{
	if (strstr(html, what) == NULL)
		fail_msg("missing '%s' in:\n%s", what, html);
}

static void lacks(const char *html, const char *what)
{
	if (strstr(html, what) != NULL)
		fail_msg("unexpected '%s' in:\n%s", what, html);
}

/* The publish member's schema, as the publisher sends it. */
#define PUBLISH_DISCARDED                                                                        \
	"{\"total_ms\":22000,\"phases_ms\":[[\"snapshot\",700],[\"gather+hash\",4200],"      \
	"[\"delta encode\",15400],[\"sign\",100],[\"offer\",1600]],"                           \
	"\"delta\":{\"tried\":true,\"kept\":false,\"encode_ms\":15400,\"percent\":68.2,"       \
	"\"stopped_early\":true,\"why\":\"the delta would be 68.2 % of the anchor\"}}"
#define PUBLISH_KEPT                                                                             \
	"{\"total_ms\":3000,\"phases_ms\":[[\"snapshot\",500],[\"gather+hash\",1000],"       \
	"[\"delta encode\",900],[\"sign\",100],[\"offer\",500]],"                              \
	"\"delta\":{\"tried\":true,\"kept\":true,\"encode_ms\":900,\"percent\":4.5,"           \
	"\"stopped_early\":false,\"why\":\"paid\"}}"

static void test_phases(void **state)
{
	json_t *vs = parse("[{\"version\":3,\"publish\":" PUBLISH_DISCARDED "},"
			   "{\"version\":2,\"publish\":" PUBLISH_KEPT "},{\"version\":1}]");
	char *h = render(trk__page_phases, vs);

	has(h, "<svg class=\"phases\"");
	/* The phases by name, in the order given, the discarded one hatched
	 * with its why; the kept delta not. */
	const char *s = strstr(h, "<title>snapshot: 0.700 s"), *g = strstr(h, "<title>gather+hash: 4.200 s");
	const char *d = strstr(h, "<title>delta encode: 15.400 s (thrown away: delta discarded at "
				  "68.2 % of the anchor after 15.4 s of encoding (stopped early): the "
				  "delta would be 68.2 % of the anchor)");
	assert_non_null(s);
	assert_non_null(g);
	assert_non_null(d);
	assert_true(s < g && g < d);
	has(h, "class=\"discarded\"");
	has(h, "fill=\"url(#hatch)\"><title>delta encode: 15.400");
	lacks(h, "fill=\"url(#hatch)\"><title>delta encode: 0.900");
	has(h, "22.0 s, delta discarded");
	has(h, "<a href=\"/versions/3\">");
	has(h, "v2: delta kept at 4.5 % of the anchor");
	has(h, "v3: delta <b>discarded</b> at 68.2 %");
	/* One scale, 550 px for the longest (22 s): v3's snapshot (700 ms)
	 * 17.5 px, v2's (500 ms) 12.5 px. */
	has(h, "x=\"60.0\" y=\"8\" width=\"17.5\"");
	has(h, "x=\"60.0\" y=\"28\" width=\"12.5\"");
	free(h);
	json_decref(vs);

	/* No version with a publish member: nothing. */
	vs = parse("[{\"version\":1},{\"version\":2,\"publish\":null}]");
	h = render(trk__page_phases, vs);
	assert_string_equal(h, "");
	free(h);
	json_decref(vs);
}

static void test_publisher_clock(void **state)
{
	json_t *st = parse(
		"{\"publishers\":[{\"id\":\"pub-1\",\"alive\":true,\"ranks\":[{\"rank\":0,"
		"\"host\":\"t0\"}],\"offered_versions\":[3],\"clock\":{\"every_ms\":1500,"
		"\"interval_median_ms\":1600,\"interval_last_ms\":1400,\"since_last_ms\":10500,"
		"\"late\":true}},{\"id\":\"pub-2\",\"alive\":true,\"ranks\":[],\"offered_versions\":[],"
		"\"clock\":{\"every_ms\":1500,\"interval_median_ms\":1500,\"interval_last_ms\":1500,"
		"\"since_last_ms\":700,\"late\":false}},{\"id\":\"pub-3\",\"alive\":true,"
		"\"ranks\":[],\"offered_versions\":[],\"clock\":{\"every_ms\":8000,"
		"\"interval_median_ms\":24300,\"interval_last_ms\":24000,\"since_last_ms\":3000,"
		"\"late\":false,\"slow\":true}}],\"versions\":[]}");
	char *h = render((void (*)(struct evbuffer *, json_t *))trk__page_publishers, st);

	has(h, "<td class=\"late\">every 1.5 s; versions every 1.6 s (median), the last after 1.4 s; "
	       "the last 10.5 s ago &mdash; <b>late: 7.0&times; its clock</b></td>");
	has(h, "<td class=\"\">every 1.5 s; versions every 1.5 s (median), the last after 1.5 s; "
	       "the last 0.7 s ago</td>");
	/* Versions that come, but three clocks apart: slow, with the figure. */
	has(h, "<td class=\"late\">every 8.0 s; versions every 24.3 s (median), the last after "
	       "24.0 s; the last 3.0 s ago &mdash; <b>slow: versions every 3.0&times; its "
	       "clock</b></td>");
	free(h);
	json_decref(st);
}

static void render_replicas(struct evbuffer *b, json_t *st)
{
	struct trk_status_page pg = {.offset = 0, .limit = 100};
	trk__page_replicas(b, st, &pg);
}

static void test_replica_state(void **state)
{
	json_t *st = parse(
		"{\"replicas_total\":2,\"replicas_by_state\":{\"current\":1,\"behind\":1},"
		"\"replicas\":[{\"replica\":\"A\",\"alive\":true,\"nranks\":1,\"layout_name\":\"tp1\","
		"\"state\":\"current\",\"why\":\"active on v2, the latest\",\"active\":2,"
		"\"ranks\":[{\"rank\":0,\"id\":\"A/0\",\"alive\":true,\"state\":\"active\","
		"\"version\":2,\"canary\":{\"version\":2,\"ok\":true,\"live\":true}}]},"
		"{\"replica\":\"B\",\"alive\":true,\"nranks\":1,\"layout_name\":\"tp1\","
		"\"state\":\"behind\",\"why\":\"rank 0 <B/0> no progress\",\"active\":1,"
		"\"fetch\":{\"version\":2,\"bytes_done\":25,\"bytes_total\":100},"
		"\"ranks\":[{\"rank\":0,\"id\":\"B/0\",\"alive\":true,\"state\":\"fetching\","
		"\"version\":2,\"canary\":{\"version\":1,\"ok\":true,\"live\":false}}]}]}");
	char *h = render(render_replicas, st);

	has(h, "class=\"why st-current\"><b>current</b>: active on v2, the latest");
	/* Outside text escaped; the fetch's bar. */
	has(h, "class=\"why st-behind\"><b>behind</b>: rank 0 &lt;B/0&gt; no progress"
	       "<br><progress max=\"100\" value=\"25\">");
	/* A's canary matches its live version; B's probe was of v1, no ok. */
	has(h, "<td class=\"active\">v2 ok</td>");
	has(h, "<td class=\"old\">v1 probed, not the live version</td>");
	lacks(h, "v1 ok");
	has(h, "2 replicas: 1 current, 0 updating, 1 behind");
	/* The replica's state and its ranks' are two columns, named apart. */
	has(h, "<th>replica state</th>");
	has(h, "<th>rank state</th>");
	lacks(h, "<th>state</th>");
	free(h);
	json_decref(st);
	/* One replica is one, not "1 replicas". */
	st = parse("{\"replicas_total\":1,\"replicas_by_state\":{\"current\":1},\"replicas\":[]}");
	h = render(render_replicas, st);
	has(h, "1 replica: 1 current");
	free(h);
	json_decref(st);
}

/* A timeline: export at 1000000, published 1000500, replicas ending at the
 * given ms after the export. */
static json_t *timeline(int v, const uint64_t *ends, size_t n)
{
	json_t *tl = json_pack("{s:i,s:s,s:I,s:I,s:I,s:[]}", "version", v, "kind", "anchor",
			       "wire_bytes", (json_int_t)1000, "export_asked_ms",
			       (json_int_t)1000000, "published_ms", (json_int_t)1000500,
			       "replicas");
	char name[8];

	for (size_t i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "R%zu", i);
		json_array_append_new(
			json_object_get(tl, "replicas"),
			json_pack("{s:s,s:i,s:I,s:I,s:[{s:i,s:I,s:I,s:I,s:I,s:I}]}", "replica", name,
				  "nranks", 1, "prepared_ms", (json_int_t)(1000000 + ends[i] - 100),
				  "activated_ms", (json_int_t)(1000000 + ends[i]), "ranks", "rank",
				  0, "first_byte_ms", (json_int_t)1000600, "last_byte_ms",
				  (json_int_t)(1000000 + ends[i] - 200), "verified_ms",
				  (json_int_t)(1000000 + ends[i] - 100), "bytes_from_trainer",
				  (json_int_t)3 * 1024 * 1024, "bytes_from_peers",
				  (json_int_t)1024 * 1024));
	}
	return tl;
}

static uint64_t chart_span;
static void render_chart(struct evbuffer *b, json_t *tl)
{
	trk__chart_timeline(b, tl, chart_span);
}

static void test_shared_scale(void **state)
{
	const uint64_t ends1[] = {2000, 2200, 196000}, ends2[] = {4000};
	json_t *t1 = timeline(1, ends1, 3), *t2 = timeline(2, ends2, 1);

	/* A replica that came late does not set the scale; all of it does. */
	assert_int_equal(trk__chart_span(t1, false), 2200);
	assert_int_equal(trk__chart_span(t1, true), 196000);
	assert_int_equal(trk__chart_span(t2, false), 4000);

	/* Both at 4 s: the same pixels per second (590 px over 4 s); the
	 * late row cut with its time; an axis in round seconds; links. */
	chart_span = 4000;
	char *h1 = render(render_chart, t1), *h2 = render(render_chart, t2);
	has(h1, "data-span-ms=\"4000\"");
	has(h2, "data-span-ms=\"4000\"");
	/* The trainer's bar: 500 ms = 73.8 px on both. */
	has(h1, "width=\"73.8\" height=\"12\" fill=\"#c3b1e1\"><title>export to publish: 0.500 s");
	has(h2, "width=\"73.8\" height=\"12\" fill=\"#c3b1e1\"><title>export to publish: 0.500 s");
	has(h1, "&#8594; +196.0 s");
	lacks(h2, "&#8594;");
	has(h1, ">+0.5 s</text>");
	has(h1, ">+4 s</text>");
	has(h1, "<a href=\"/versions/1\">");
	free(h1);
	free(h2);

	/* The version's page: its chart at its own full span, every replica's
	 * times and bytes by source, and the publisher's phases. */
	json_object_set_new(t1, "bytes_from_trainer", json_integer(9 * 1024 * 1024));
	json_object_set_new(t1, "bytes_from_peers", json_integer(3 * 1024 * 1024));
	json_object_set_new(t1, "publish", parse(PUBLISH_DISCARDED));
	char *p = render(trk__page_version, t1);
	has(p, "<h1>version 1</h1>");
	has(p, "from the trainer 9.0 MiB, from peers 3.0 MiB");
	has(p, "data-span-ms=\"196000\"");
	lacks(p, "&#8594;");
	has(p, "<tr><td>R2</td><td>1</td><td>+195.900 s</td><td>+196.000 s</td><td>3.0 MiB</td>"
	       "<td>1.0 MiB</td><td>25 %</td></tr>");
	has(p, "<svg class=\"phases\"");
	has(p, "<tr><td>delta encode</td><td>15.400 s</td></tr>");
	free(p);
	/* Without phases it says so. */
	json_object_del(t1, "publish");
	p = render(trk__page_version, t1);
	has(p, "The publisher sent no phases for this version.");
	lacks(p, "<svg class=\"phases\"");
	/* Its parent (an anchor has none: "-", never 0), digest, whether dropped;
	 * each clock said. */
	has(p, "parent - (none)");
	lacks(p, "parent 0");
	has(p, "&middot; served");
	has(p, "on the publisher's clock, to the tracker's acceptance");
	free(p);
	json_object_set_new(t1, "parent", json_integer(3));
	json_object_set_new(t1, "digest", json_string("ab12"));
	json_object_set_new(t1, "dropped", json_true());
	json_object_set_new(t1, "publish", parse(PUBLISH_KEPT));
	p = render(trk__page_version, t1);
	has(p, "parent <a href=\"/versions/3\">v3</a>");
	has(p, "digest <code>ab12</code>");
	has(p, "<b>dropped</b>");
	has(p, "<th>in all, from the export request to the offer (the publisher's clock)</th>");
	free(p);
	json_decref(t1);
	json_decref(t2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_phases),
		cmocka_unit_test(test_publisher_clock),
		cmocka_unit_test(test_replica_state),
		cmocka_unit_test(test_shared_scale),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
