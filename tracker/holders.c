/* GET /holders: complete replicas of other layouts whose ranks offer their
 * memory for a version, so that a node reads its chunks from them. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/internal.h"

/* The holder entry of rep at version v, or NULL when it is not one: every
 * rank alive and offering its slot for v (a node offers its slot only for
 * a version it holds complete and verified). *oom is set on ENOMEM. */
static json_t *holder_json(const struct trk_replica *rep, uint64_t v, bool *oom)
{
	char hex[2 * PROTO_HASH_BYTES + 1];
	json_t *ranks, *h;

	if (rep->nranks == 0)
		return NULL;
	for (uint32_t r = 0; r < rep->nranks; r++) {
		const struct trk_node *n = rep->ranks[r];
		if (n == NULL || !n->alive || trk__offers_slot(&n->offers, v) == NULL)
			return NULL;
	}
	if ((ranks = json_array()) == NULL)
		goto oom;
	for (uint32_t r = 0; r < rep->nranks; r++) {
		const struct trk_node *n = rep->ranks[r];
		if (json_array_append_new(ranks, trk__source_json(true, n->id, n->host, n->provider, n->addr,
								 trk__offers_slot(&n->offers, v))) != 0) {
			json_decref(ranks);
			goto oom;
		}
	}
	sodium_bin2hex(hex, sizeof(hex), rep->layout->digest, PROTO_HASH_BYTES);
	h = json_pack("{s:s,s:s,s:I,s:o}", "replica", rep->name, "layout", hex, "nranks",
		      (json_int_t)rep->nranks, "sources", ranks);
	if (h == NULL)
		goto oom;
	return h;
oom:
	*oom = true;
	return NULL;
}

void trk__handle_holders(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	uint64_t version = 0;
	uint8_t layout[PROTO_HASH_BYTES];
	json_t *list = json_array();
	bool oom = false;

	if (list == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	if (trk__query_u64(c, "version", true, UINT64_MAX, &version, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (trk__query_layout_known(c, version, layout) != 0)
		goto out;
	/* The asker's own layout is left out: its peers there are its
	 * parcels' swarm (GET /sources). */
	for (struct trk_replica *rep = r->reps; rep != NULL && !oom; rep = rep->next) {
		json_t *h;
		if (memcmp(rep->layout->digest, layout, PROTO_HASH_BYTES) == 0)
			continue;
		if ((h = holder_json(rep, version, &oom)) != NULL && json_array_append_new(list, h) != 0)
			oom = true;
	}
	if (oom) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	trk__json_shuffle(list); /* spread the readers: holders in random order */
	trk__reply_json(c, 200, json_pack("{s:O}", "holders", list));
out:
	json_decref(list);
}
