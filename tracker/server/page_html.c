/* The status pages' text: escaping, values, bytes, the head and its CSS. */
#include <stdio.h>
#include <string.h>

#include "tracker/server/internal.h"
#include "tracker/server/page.h"

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

void trk__html_json(struct evbuffer *b, json_t *v)
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
			trk__html_json(b, e);
		}
	} else {
		evbuffer_add(b, "-", 1);
	}
}

void trk__html_cell(struct evbuffer *b, json_t *o, const char *key)
{
	evbuffer_add_printf(b, "<td>");
	trk__html_json(b, json_object_get(o, key));
	evbuffer_add_printf(b, "</td>");
}

void trk__html_bytes(struct evbuffer *b, json_t *v)
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

uint64_t trk__html_ms(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_integer(v) && json_integer_value(v) > 0 ? (uint64_t)json_integer_value(v) : 0;
}

/* Rows by state: green current, blue updating, amber behind, red failed,
 * grey gone; a late publisher amber. */
static const char css[] =
	"body{font:14px system-ui,sans-serif;margin:1.5em}"
	"table{border-collapse:collapse;margin-bottom:1.5em}"
	"td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}"
	"th{background:#eee}.active{color:#070;font-weight:bold}"
	".gone,.gone td{color:#aaa;background:#f4f4f4;font-weight:normal}"
	".gone progress{opacity:.4}.failed{color:#b00}tr.site th{text-align:left;background:#e8eef6}progress{width:8em}"
	"summary{cursor:pointer;margin-bottom:.5em}.tl{margin-bottom:.8em}"
	"td.st-current{background:#e3f4e3}td.st-updating{background:#e3eefa}"
	"td.st-behind{background:#fdf0d5}td.st-failed{background:#f9dcdc}"
	"td.st-gone{background:#eee;color:#888}.why{max-width:28em}"
	".late{background:#fdf0d5;color:#8a4b00;font-weight:bold}.old{color:#999}";

void trk__html_head(struct evbuffer *b, const char *title, int refresh)
{
	evbuffer_add_printf(b, "<!doctype html><html><head><meta charset=\"utf-8\">");
	if (refresh > 0)
		evbuffer_add_printf(b, "<meta http-equiv=\"refresh\" content=\"%d\">", refresh);
	evbuffer_add_printf(b, "<title>");
	trk__html_esc(b, title);
	evbuffer_add_printf(b, "</title><style>%s</style></head><body>", css);
}

void trk__html_reply(struct trk_call *c, struct evbuffer *b)
{
	size_t len = evbuffer_get_length(b);
	const uint8_t *p = evbuffer_pullup(b, -1);

	if (p == NULL)
		trk__fail(c, 500, "out of memory");
	else
		trk__reply_raw(c, 200, "text/html; charset=utf-8", p, len);
	evbuffer_free(b);
}
