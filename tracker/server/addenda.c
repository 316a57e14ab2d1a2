/* POST /addenda (a publisher adds a layout to a published version) and
 * GET /addenda (a version's addenda, one addendum's bytes, or a wait for
 * one; copy=1 asks for a raw copy of a layout a delta lists). */
#include <errno.h>
#include <sodium.h>

#include "proto/addendum.h"
#include "tracker/server/internal.h"

void trk__handle_addendum_post(struct trk_call *c)
{
	struct proto_err err = {{0}};
	const struct proto_addendum *a;
	char hex[2 * PROTO_HASH_BYTES + 1];
	int code = trk__addenda_add(c->s, c->body, c->len, &a, &err);

	if (code >= 400) {
		trk__fail(c, code, "%s", err.msg);
		return;
	}
	sodium_bin2hex(hex, sizeof(hex), a->layout.layout_digest, PROTO_HASH_BYTES);
	trk__reply_json(c, code, json_pack("{s:I,s:s,s:o}", "version", (json_int_t)a->version,
					   "layout_digest", hex, "digest",
					   trk__json_hex(a->digest, PROTO_HASH_BYTES)));
	if (code != 201)
		return;
	trk__registry_changed(c->s->reg);
	/* The nodes waiting for it (the entry stays until shutdown). */
	trk__watches_addendum_posted(c->s->w, a->version, a->layout.layout_digest);
}

void trk__handle_addendum_get(struct trk_call *c)
{
	struct proto_err err = {{0}};
	const char *lhex = trk__query_str(c, "layout");
	uint8_t layout[PROTO_HASH_BYTES];
	const uint8_t *raw = NULL;
	size_t len = 0;
	bool have;
	uint64_t v = 0, wait_ms = 0, copy = 0;

	if (trk__query_u64(c, "wait_ms", false, UINT64_MAX, &wait_ms, &err) != 0 ||
	    trk__query_u64(c, "copy", false, 1, &copy, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (trk__query_u64(c, "version", true, UINT64_MAX, &v, &err) != 0 || v == 0) {
		trk__fail(c, 400, "%s", v == 0 && err.msg[0] == 0 ? "version: must be >= 1" : err.msg);
		return;
	}
	if (trk__versions_find(c->s->vs, v) == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)v);
		return;
	}
	if (lhex == NULL) {
		json_t *arr = trk__addenda_json(c->s, v);
		trk__reply_json(c, 200, arr == NULL ? NULL :
				json_pack("{s:I,s:o}", "version", (json_int_t)v, "addenda", arr));
		return;
	}
	if (proto_parse_hex(lhex, layout, sizeof(layout)) != 0) {
		trk__fail(c, 400, "layout: want %d hex digits", 2 * PROTO_HASH_BYTES);
		return;
	}
	have = trk__addenda_get(c->s, v, layout, &raw, &len);
	if (!have && copy && trk__addenda_copy_gone(c->s, v)) {
		trk__fail(c, 410, TRK__COPY_GONE_FMT, (unsigned long long)v);
		return;
	}
	/* The publishers hear at once (their held watches of layouts_rev). */
	if (!have && copy && trk__addenda_want_copy(c->s, v, layout))
		trk__watches_replica_alive(c->s->w);
	if (!have && wait_ms > 0) { /* answered when it is posted */
		trk__watch_addendum(c, v, layout, wait_ms, copy);
		return;
	}
	if (!have) {
		trk__fail(c, 404, "version %llu has no addendum for layout %.16s", (unsigned long long)v,
			  lhex);
		return;
	}
	trk__reply_raw(c, 200, "application/octet-stream", raw, len);
}
