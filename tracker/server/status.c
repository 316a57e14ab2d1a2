/* GET /api/v1/status: the registry and the newest versions as one JSON
 * object, in pages of replicas (what the status page is made from). */
#include <errno.h>

#include "tracker/server/internal.h"

#define STATUS_VERSIONS 64 /* newest versions the status shows */
#define STATUS_NAMES 32     /* replica names a version entry lists */
#define STATUS_REPLICAS 100 /* replicas a status shows unless asked for more */
#define STATUS_REPLICAS_MAX 100000
#define STATUS_RANKS 200    /* rank rows a status shows unless asked for a count of
			     * replicas (tracker/NOTES.md) */

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
		bad |= trk__set(e, "bytes_from_other_sites", trk__jint(v->bytes_from_other_sites));
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
		bad |= trk__timeline_set_publish(s->reg->tl, v->version, e);
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

int trk__status_page(struct trk_call *c, struct trk_status_page *pg)
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

	if (trk__status_page(c, &pg) == 0)
		trk__reply_json(c, 200, trk__status_json(c->s, &pg));
}
