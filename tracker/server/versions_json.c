/* The versions as JSON: one version's entry (GET /versions, the status)
 * and the list GET /versions answers. */
#include "tracker/server/internal.h"
#define LIST_MAX 256     /* newest entries one GET /versions returns */

json_t *trk__version_json(struct trk_server *s, const struct trk_version *v)
{
	json_t *o = json_object();
	bool retain = trk__version_retained(s, v->version);
	int bad = o == NULL;

	if (bad)
		return NULL;
	bad |= trk__set(o, "version", trk__jint(v->version));
	bad |= trk__set(o, "parent", trk__jint(v->parent));
	bad |= trk__set(o, "kind", json_string(v->kind == PROTO_KIND_DELTA ?
							"delta" :
							"anchor"));
	bad |= trk__set(o, "digest", trk__json_hex(v->digest, PROTO_HASH_BYTES));
	bad |= trk__set(o, "wire_bytes", trk__jint(v->wire_bytes));
	bad |= trk__set(o, "created_ms", trk__jint(v->created_ms));
	bad |= trk__set(o, "published_ms", trk__jint(v->published_ms));
	bad |= trk__set(o, "retain", json_boolean(retain));
	/* A version of the latest chain is kept in every layout (a late
	 * joiner of any layout may replay it): no retain_layouts. */
	if (trk__version_in_chain(s, v->version) && v->version != trk__versions_latest(s->vs))
		bad |= trk__set(o, "chain", json_true());
	else
		bad |= trk__set(o, "retain_layouts", trk__version_retain_layouts(s, v->version));
	bad |= trk__set(o, "dropped", json_boolean(trk__version_dropped(s, v->version)));
	bad |= trk__set(o, "addenda", trk__addenda_json(s, v->version));
	if (v->version == trk__versions_latest(s->vs)) {
		bad |= trk__set(o, "uncovered_layouts", trk__version_uncovered(s, v->version));
		bad |= trk__set(o, "copy_wanted", trk__version_copy_wanted(s, v->version));
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *trk__versions_list_json(struct trk_server *s, uint64_t after, uint64_t layouts_rev)
{
	struct trk_versions *vs = s->vs;
	json_t *o = json_object(), *arr = json_array();
	size_t n = trk__versions_count(vs), first = n;

	if (o == NULL || arr == NULL)
		goto fail;
	while (first > 0 && trk__versions_at(vs, first - 1)->version > after && n - first < LIST_MAX)
		first--;
	for (size_t i = first; i < n; i++)
		if (json_array_append_new(arr, trk__version_json(s, trk__versions_at(vs, i))) != 0)
			goto fail;
	if (trk__set(o, "latest", trk__jint(trk__versions_latest(vs))) ||
	    trk__set(o, "now_ms", trk__jint(proto_wall_ms())) ||
	    trk__set(o, "layouts_rev", trk__jint(layouts_rev)) ||
	    trk__set(o, "anchor_wanted", json_boolean(trk__versions_anchor_wanted(vs))) ||
	    json_object_set(o, "versions", arr) != 0)
		goto fail;
	json_decref(arr);
	return o;
fail:
	json_decref(arr);
	json_decref(o);
	return NULL;
}
