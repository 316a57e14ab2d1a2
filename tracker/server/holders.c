/* GET /holders: replicas of other layouts whose ranks offer their memory
 * for a version (complete, or partial while they fetch it), so that a node
 * reads its chunks from them; and those that work toward it without
 * offering yet. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

static bool replica_alive(const struct trk_replica *rep)
{
	if (rep->nranks == 0)
		return false;
	for (uint32_t r = 0; r < rep->nranks; r++)
		if (rep->ranks[r] == NULL || !rep->ranks[r]->alive)
			return false;
	return true;
}

/* The holder entry of rep at version v, or NULL when it is not one: every
 * rank alive and offering its slot for v (a node offers its slot for a
 * version it holds complete, or, partial with its have-map, while it
 * fetches it). *oom is set on ENOMEM. */
static json_t *holder_json(const struct trk_replica *rep, uint64_t v, bool *oom)
{
	char hex[2 * PROTO_HASH_BYTES + 1];
	json_t *ranks, *h;
	bool complete = true;

	if (!replica_alive(rep))
		return NULL;
	for (uint32_t r = 0; r < rep->nranks; r++) {
		const struct trk_offer *so = trk__offers_slot(&rep->ranks[r]->offers, v);
		if (so == NULL)
			return NULL;
		complete &= !so->partial;
	}
	if ((ranks = json_array()) == NULL)
		goto oom;
	for (uint32_t r = 0; r < rep->nranks; r++) {
		const struct trk_node *n = rep->ranks[r];
		if (json_array_append_new(ranks,
					  trk__source_json(true, n->id, n->site, n->host, n->provider,
							   n->addr, trk__offers_slot(&n->offers, v))) != 0) {
			json_decref(ranks);
			goto oom;
		}
	}
	sodium_bin2hex(hex, sizeof(hex), rep->layout->digest, PROTO_HASH_BYTES);
	h = json_pack("{s:s,s:s,s:I,s:b,s:o}", "replica", rep->name, "layout", hex, "nranks",
		      (json_int_t)rep->nranks, "complete", complete, "sources", ranks);
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
	json_t *list = json_array(), *fetching = json_array();
	bool oom = false;

	if (list == NULL || fetching == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	if (trk__query_u64(c, "version", true, UINT64_MAX, &version, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (trk__query_layout_known(c, version, layout) != 0)
		goto out;
	const char *site = trk__query_str(c, "site");
	if (site != NULL && !trk_site_valid(site)) {
		trk__fail(c, 400, "site: want 1..%d of [A-Za-z0-9._-]", TRK_SITE_MAX);
		goto out;
	}
	/* The asker's own layout is left out: its peers there are its
	 * parcels' swarm (GET /sources). Not for a delta: its swarm serves
	 * the delta's encoded parcels, so a node fetching it whole (a raw
	 * copy) reads its own layout's complete holders too. */
	const struct trk_version *tv = trk__versions_find(c->s->vs, version);
	bool delta = tv != NULL && tv->kind == PROTO_KIND_DELTA;
	/* Layouts serving other bytes (FP8 against BF16) hold nothing of the
	 * asker's: only those over the same model are listed. */
	const struct proto_model *mine = &r->model;
	for (const struct trk_slayout *sl = r->layouts; sl != NULL; sl = sl->next)
		if (memcmp(sl->digest, layout, PROTO_HASH_BYTES) == 0)
			mine = proto_layout_model(&r->model, &sl->l);
	for (struct trk_replica *rep = r->reps; rep != NULL && !oom; rep = rep->next) {
		json_t *h;
		bool same = memcmp(rep->layout->digest, layout, PROTO_HASH_BYTES) == 0;
		if (same && !delta)
			continue;
		if (memcmp(proto_layout_model(&r->model, &rep->layout->l)->digest, mine->digest,
			   PROTO_HASH_BYTES) != 0)
			continue;
		/* A site reads other layouts from its own replicas: what crosses
		 * to it comes from the publishers, once (sources.c). */
		if (!trk_site_same(trk__replica_site(rep), site))
			continue;
		if (same) {
			if ((h = holder_json(rep, version, &oom)) != NULL &&
			    json_is_true(json_object_get(h, "complete")))
				oom |= json_array_append(list, h) != 0;
			json_decref(h);
			continue;
		}
		if ((h = holder_json(rep, version, &oom)) != NULL) {
			oom |= json_array_append_new(list, h) != 0;
		} else if (!oom && replica_alive(rep) && rep->target == version &&
			   rep->active < version) {
			/* It works toward V and offers nothing yet: a reader
			 * that leaves V's trainer bytes to its layout waits. */
			char hex[2 * PROTO_HASH_BYTES + 1];
			sodium_bin2hex(hex, sizeof(hex), rep->layout->digest, PROTO_HASH_BYTES);
			oom |= json_array_append_new(fetching,
						     json_pack("{s:s,s:s,s:I}", "replica", rep->name,
							       "layout", hex, "nranks",
							       (json_int_t)rep->nranks)) != 0;
		}
	}
	if (oom) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	trk__json_shuffle(list); /* spread the readers: holders in random order */
	trk__reply_json(c, 200, json_pack("{s:O,s:O}", "holders", list, "fetching", fetching));
out:
	json_decref(list);
	json_decref(fetching);
}
