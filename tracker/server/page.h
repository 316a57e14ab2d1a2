/* The status pages' pieces (page*.c): HTML made from the status and
 * timeline JSON. Each piece is a function of JSON alone, so that
 * tests/test_page.c renders hand-made JSON; the handlers (page.c,
 * page_version.c) build the JSON from the state and call them. Every
 * piece appends to b and cannot fail (a failed append leaves the page
 * short: evbuffer's own rule). */
#ifndef TRACKER_SERVER_PAGE_H
#define TRACKER_SERVER_PAGE_H

#include <event2/buffer.h>
#include <jansson.h>
#include <stdint.h>

struct trk_status_page;

/* ---- page_html.c: text and cells ---- */

/* s with &<>"' escaped for HTML text and attributes (and SVG). */
void trk__html_esc(struct evbuffer *b, const char *s);
/* A JSON value as escaped text: strings bare, numbers, yes/no, arrays
 * joined with ", ", anything else "-". */
void trk__html_json(struct evbuffer *b, json_t *v);
/* <td> of o[key] as trk__html_json writes it. */
void trk__html_cell(struct evbuffer *b, json_t *o, const char *key);
/* Bytes in the page's one unit style (binary, one decimal). */
void trk__html_bytes(struct evbuffer *b, json_t *v);
/* o[key] as a positive integer (ms), 0 when absent, null or not positive. */
uint64_t trk__html_ms(json_t *o, const char *key);
/* The CSS and head every page starts with; refresh: seconds, 0: none. */
void trk__html_head(struct evbuffer *b, const char *title, int refresh);
/* Answers c with the page in b (200, text/html; 500 on out of memory)
 * and frees b. */
void trk__html_reply(struct trk_call *c, struct evbuffer *b);

/* ---- page_chart.c: update timelines on one time scale ---- */

/* The ms from the export request a timeline object (GET
 * /versions/V/timeline) needs to be drawn: with all, to its last event;
 * else leaving out rows that end far past the others (a replica that came
 * late), which the chart then cuts off with their time written. */
uint64_t trk__chart_span(json_t *tl, bool all);
/* The chart of tl at span_ms across its plot (the same for every chart
 * drawn together: the same pixels per second), with an axis in seconds
 * from the export request and a link to the version's page. */
void trk__chart_timeline(struct evbuffer *b, json_t *tl, uint64_t span_ms);

/* ---- page_publish.c: the publishers and their time per version ---- */

/* The publishers' table: ranks, offers, and each one's clock against the
 * versions that got out (late in colour, with the figures). st: the
 * status object. */
void trk__page_publishers(struct evbuffer *b, json_t *st);
/* A bar per version of where its publisher's time went, by phase, in the
 * order given, at one scale; a delta encoded and thrown away is hatched,
 * with why. versions: objects with "version" and "publish" (those
 * without "publish" are left out; nothing at all when none has one). */
void trk__page_phases(struct evbuffer *b, json_t *versions);

/* ---- page_replicas.c ---- */

/* The replicas' table: each one's state in words and colour, then its
 * ranks. st: the status object, pg the page of replicas it shows. */
void trk__page_replicas(struct evbuffer *b, json_t *st, const struct trk_status_page *pg);

/* ---- page_version.c ---- */

/* The body of /versions/N: tl is the version's timeline object, with
 * "bytes_from_trainer" and "bytes_from_peers" of the version added. */
void trk__page_version(struct evbuffer *b, json_t *tl);

#endif
