/* The publisher's serving layouts and their plans from the trainer layout, cached by digest. */
#include "node/publisher/pub_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pub_layout *node__pub_layout_find(struct node_pub *p, const uint8_t *digest)
{
	for (struct pub_layout *sl = p->layouts; sl; sl = sl->next)
		if (memcmp(sl->digest, digest, PROTO_HASH_BYTES) == 0)
			return sl;
	return NULL;
}

/* Parses and plans one entry of GET /layouts into the cache (once per
 * digest). NULL only on ENOMEM or a malformed entry. */
struct pub_layout *node__pub_layout_absorb(struct node_pub *p, json_t *e)
{
	const char *dh = json_string_value(json_object_get(e, "digest"));
	json_t *jl = json_object_get(e, "layout");
	uint8_t d[PROTO_HASH_BYTES];
	struct pub_layout *sl;
	struct proto_err err = {{0}};
	char what[200];

	if (proto_parse_hex(dh, d, sizeof(d)) != 0 || !json_is_object(jl)) {
		LOG_WARN("tracker /layouts: an entry without a digest or layout");
		return NULL;
	}
	if ((sl = node__pub_layout_find(p, d)) != NULL)
		return sl;
	sl = calloc(1, sizeof(*sl));
	if (sl == NULL)
		return NULL;
	memcpy(sl->digest, d, sizeof(d));
	/* Named by the replicas on it, as people know them. */
	json_t *names = json_object_get(e, "replicas"), *nv;
	size_t k;
	int n = snprintf(what, sizeof(what), "serving layout %.16s", dh);
	json_array_foreach(names, k, nv) {
		const char *rn = json_string_value(nv);
		if (rn == NULL || n >= (int)sizeof(what) - 40)
			break;
		n += snprintf(what + n, sizeof(what) - (size_t)n, "%s%.32s", k ? ", " : " (replica ", rn);
	}
	if (json_array_size(names) > 0 && n < (int)sizeof(what) - 2)
		snprintf(what + n, sizeof(what) - (size_t)n, ")");
	if (proto_layout_from_json(&p->model, jl, what, &sl->layout, &err) != 0) {
		LOG_WARN("%s (not served)", err.msg);
		sl->bad = true;
	} else if (memcmp(sl->layout.digest, d, sizeof(d)) != 0) {
		LOG_WARN("%s: its digest is not the one the tracker gave (not served)", what);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else if (proto_layout_transformed(&sl->layout) && p->nhosted != p->tl.nranks) {
		LOG_WARN("%s: serves FP8, which this publisher quantizes only when it hosts every "
			 "trainer rank (not served)", what);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else if (proto_layout_transformed(&sl->layout) &&
		   (sl->q = node__pub_q_get(p, &sl->layout, &err)) == NULL) {
		LOG_WARN("%s: its FP8 source: %s (not served)", what, err.msg);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else if (proto_plan_build(&p->model, sl->q != NULL ? &sl->q->src : &p->tl, &sl->layout,
				    &sl->plan, &err) != 0) {
		LOG_WARN("%s: cannot plan from the trainer layout: %s (not served)", what, err.msg);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else {
		sl->src = sl->q != NULL ? &sl->q->src : &p->tl;
		LOG_INFO("%s: %u parcels, %llu bytes mapped", what, sl->plan.nparcels,
			 (unsigned long long)sl->plan.mapped_bytes);
	}
	sl->next = p->layouts;
	p->layouts = sl;
	return sl;
}
