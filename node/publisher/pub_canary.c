/* The expected canary scores of a version (proto/canary.h), posted for the probes to match. */
#include "node/publisher/pub_internal.h"

#include <inttypes.h>

json_t *node__pub_canary_json(const struct pub_export *ex)
{
	json_t *o = json_object(), *layouts = json_array();
	uint64_t *sums = NULL;
	int bad = o == NULL || layouts == NULL;

	for (size_t li = 0; !bad && li < ex->nlayouts; li++) {
		const struct pub_layout *sl = ex->layouts[li];
		uint32_t n = sl->layout.nranks;
		char hex[2 * PROTO_HASH_BYTES + 1];
		json_t *scores = json_array(), *e;

		free(sums);
		sums = calloc(PROTO_MAX(n, 1), sizeof(*sums));
		bad |= sums == NULL || scores == NULL;
		for (size_t i = 0; !bad && i < ex->pv->nparts; i++) {
			const struct pub_part *pt = &ex->pv->parts[i];
			for (size_t j = 0; j < pt->nitems; j++)
				if (pt->items[j].li == li)
					sums[pt->items[j].pc->dst_rank] += pt->items[j].canary;
		}
		/* As signed integers: JSON's (and jansson's) integers are 64-bit. */
		for (uint32_t r = 0; !bad && r < n; r++)
			bad |= json_array_append_new(scores, json_integer((json_int_t)(int64_t)sums[r]));
		sodium_bin2hex(hex, sizeof(hex), sl->digest, PROTO_HASH_BYTES);
		e = bad ? NULL : json_pack("{s:s,s:o}", "layout", hex, "scores", scores);
		if (e == NULL)
			json_decref(scores);
		bad |= e == NULL || json_array_append_new(layouts, e) != 0;
	}
	free(sums);
	if (!bad) {
		bad |= json_object_set_new(o, "version", json_integer((json_int_t)ex->version)) != 0;
		bad |= json_object_set(o, "layouts", layouts) != 0;
	}
	json_decref(layouts);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static void on_posted(const struct trk_answer *a, void *arg)
{
	(void)arg;
	if (a->status != 200)
		LOG_WARN("posting a version's canary scores: %s", a->error);
}

void node__pub_canary_post(struct node_pub *p, struct pub_export *ex)
{
	if (ex->canary == NULL)
		return;
	if (trk_client_post_json(p->trk, TRK_API "/canary/expected", ex->canary, on_posted, p) != 0)
		LOG_WARN("version %" PRIu64 ": cannot post its canary scores", ex->version);
}
