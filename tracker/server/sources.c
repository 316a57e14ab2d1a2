/* GET /sources and POST /sources: who serves a parcel (its swarm's members,
 * the peers and publishers that offer it), answers kept per swarm state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/params.h"
#include "tracker/server/internal.h"

int trk__query_layout_known(struct trk_call *c, uint64_t version,
			    uint8_t layout[PROTO_HASH_BYTES])
{
	const char *lhex = trk__query_str(c, "layout");

	if (lhex == NULL || proto_parse_hex(lhex, layout, PROTO_HASH_BYTES) != 0) {
		trk__fail(c, 400, "layout: want %d hex digits", 2 * PROTO_HASH_BYTES);
		return -EINVAL;
	}
	if (trk__versions_find(c->s->vs, version) == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)version);
		return -ENOENT;
	}
	return 0;
}

/* ---- GET /sources ------------------------------------------------------------ */

/* Whether a live publisher offers parcel k. */
static bool published(struct trk_registry *r, const struct trk_srckey *k)
{
	for (struct trk_publisher *p = r->pubs; p; p = p->next)
		if (p->alive && trk__offers_find(&p->offers, k->version, k->layout, k->src, k->dst) != NULL)
			return true;
	return false;
}

/* Whether a live publisher is about to offer k's version: it offers none
 * as new yet (it published the manifest and posts its offers next), or,
 * offering nothing yet (just started), it is the latest. Such a version
 * is not retired: its parcels are not listed from every site meanwhile
 * (the asker would keep reading other sites' peers it was given for the
 * grace period an unlisted peer keeps). */
static bool awaited(struct trk_registry *r, const struct trk_srckey *k)
{
	for (struct trk_publisher *p = r->pubs; p; p = p->next) {
		bool newer = false;
		for (size_t i = 0; i < p->offers.n && !newer; i++)
			newer = p->offers.sets[i].version >= k->version;
		if (p->alive && !newer &&
		    (p->offers.n > 0 || k->version >= trk__versions_latest(r->s->vs)))
			return true;
	}
	return false;
}

/* rank k->dst of replica rep, if it is a live member of k's swarm in the
 * asker's site (here) or, for a parcel no publisher offers, anywhere. */
static struct trk_node *swarm_node(const struct trk_replica *rep, const struct trk_srckey *k,
				   bool anywhere, bool *here)
{
	struct trk_node *n;

	if (k->dst >= rep->nranks || memcmp(rep->layout->digest, k->layout, PROTO_HASH_BYTES) != 0)
		return NULL;
	n = rep->ranks[k->dst];
	if (n == NULL || !n->alive)
		return NULL;
	*here = trk_site_same(n->site, k->site);
	return *here || anywhere ? n : NULL;
}

/* A replica's rate for the members rule: its last fetch's (nodes.c,
 * trk__fetch_bps), or, before it finished one, the highest its rank n's
 * reports showed in the fetch under way: a replica too slow to finish any
 * version (32 MiB every 5 s on a 5 Mbit/s link, by hand in namespaces)
 * stayed unknown, counted as keeping up, and owned trainer chunks for
 * good. 0: not known. */
static uint64_t member_rate(const struct trk_replica *rep, const struct trk_node *n)
{
	const struct trk_nver *e = n->last >= 0 ? &n->vers[n->last] : NULL;

	if (rep->fetch_bps != 0 || e == NULL || e->state != TRK_STATE_FETCHING)
		return rep->fetch_bps;
	return e->rate.peak_bps;
}

/* Which of the swarm's members (the replicas listed here, in registry
 * order) the answer lists: those that kept up in their last fetch
 * (TESSERA_SWARM_SLOW), and of a larger swarm the TESSERA_SWARM_MEMBERS
 * of highest weight (trk_member_weight). *out is NULL for all, else
 * malloc'ed, one flag per member in order. */
static int members_cut(struct trk_registry *r, const struct trk_srckey *k, bool **out)
{
	size_t cap = (size_t)proto_param(PROTO_PARAM_SWARM_MEMBERS), n = 0, i = 0;
	uint64_t *w = NULL, *bps = NULL;
	bool here, cut = false;
	int rc = -ENOMEM;

	*out = NULL;
	for (struct trk_replica *rep = r->reps; rep; rep = rep->next)
		n += swarm_node(rep, k, false, &here) != NULL;
	if (n == 0)
		return 0;
	if ((w = malloc(n * sizeof(*w))) == NULL || (bps = malloc(n * sizeof(*bps))) == NULL ||
	    (*out = malloc(n * sizeof(**out))) == NULL)
		goto out;
	for (struct trk_replica *rep = r->reps; rep; rep = rep->next) {
		const struct trk_node *node = swarm_node(rep, k, false, &here);
		if (node != NULL) {
			bps[i] = member_rate(rep, node);
			w[i++] = trk_member_weight(rep->name, k->layout);
		}
	}
	rc = trk_members_pick(w, bps, n, cap, proto_param(PROTO_PARAM_SWARM_SLOW), *out, &cut) == 0
		     ? 0
		     : -ENOMEM;
out:
	free(w);
	free(bps);
	if (rc != 0 || !cut) {
		free(*out);
		*out = NULL;
	}
	return rc;
}

/* Fills e with the answer for parcel k: the swarm's members, its peers that
 * offer the parcel, then the publishers that do. The swarm is the asker's
 * site's (k->site): what crosses between sites is what the publishers
 * send each site, once, its members sharing the trainer's chunks among
 * themselves, and every later copy is relayed inside the site. A parcel
 * no publisher offers (retired, or its publisher gone) is listed with the
 * peers of every site (not as members), so that a version stays
 * reachable. 0 or -ENOMEM. */
static int build_sources(struct trk_registry *r, const struct trk_srckey *k,
			 struct trk_srcentry *e)
{
	json_t *members = NULL, *reps = NULL;
	bool anywhere = !published(r, k) && !awaited(r, k), *listed = NULL;
	int rc = trk__srcache_members_copy(r->srcache, e, k, r->members_gen);
	bool kept = rc == 0;
	size_t mi = 0;

	if (rc == -ENOMEM)
		return rc;
	if (!kept && members_cut(r, k, &listed) != 0)
		return -ENOMEM;
	rc = -ENOMEM;
	/* Members as kept since the last registration or node gone, else
	 * listed again below. */
	if (!kept && ((members = json_array()) == NULL || (reps = json_array()) == NULL))
		goto out;
	/* A node offers only parcels of its own layout and rank, so the only
	 * candidates are rank dst of the replicas with that layout: the
	 * parcel's swarm ("members", offered or not yet). A node
	 * offers a parcel while it is still fetching it: which chunks it
	 * holds, its peers read from its have-page (proto/have.h). */
	for (struct trk_replica *rep = r->reps; rep; rep = rep->next) {
		const struct trk_offer *o;
		bool here = false;
		struct trk_node *n = swarm_node(rep, k, anywhere, &here);
		if (n == NULL)
			continue;
		/* n->id is "<replica>/<dst>" (nodes.c): reps names the
		 * same members for a batch that shares them. */
		if (here && !kept && (listed == NULL || listed[mi]) &&
		    (json_array_append_new(members, json_string(n->id)) != 0 ||
		     json_array_append_new(reps, json_string(rep->name)) != 0))
			goto out;
		mi += here;
		o = trk__offers_find(&n->offers, k->version, k->layout, k->src, k->dst);
		if (o != NULL &&
		    trk__srcache_add_source(e, trk__source_json(true, n->id, n->site, n->host,
							   n->provider, n->addr, o), true) != 0)
			goto out;
	}
	for (struct trk_publisher *p = r->pubs; p; p = p->next) {
		const struct trk_offer *o;
		if (!p->alive)
			continue;
		o = trk__offers_find(&p->offers, k->version, k->layout, k->src, k->dst);
		if (o == NULL)
			continue;
		for (size_t i = 0; i < p->nranks; i++)
			if (p->ranks[i].rank == o->src_rank &&
			    trk__srcache_add_source(e, trk__source_json(false, p->id, p->site,
								   p->ranks[i].host,
								   p->ranks[i].provider,
								   p->ranks[i].addr, o),
						    false) != 0)
				goto out;
	}
	if (!kept) {
		if ((rc = trk__srcache_set_members(e, members, reps, listed != NULL)) != 0)
			goto out;
		trk__srcache_members_keep(r->srcache, e, k, r->members_gen);
	}
	rc = 0;
	trk__srcache_set_ready(e);
out:
	free(listed);
	json_decref(members);
	json_decref(reps);
	return rc;
}

/* The answer for parcel k as text ("{...}\n", malloc'ed), built once per
 * swarm state (srcache.c); peers shuffled per answer, to spread the swarm.
 * With reps (a batch sharing members lists) its members are named by the
 * tag of their replicas' list, *reps then that list (malloc'ed) and rtag
 * its tag, unless the asker holds the list (*reps NULL). NULL when out of
 * memory. */
static char *sources_text(struct trk_registry *r, const struct trk_srckey *k, const char *tag,
			  char **reps, char rtag[TRK_MEMBERS_TAG_HEX + 1], size_t *len)
{
	struct trk_srcentry *e = trk__srcache_get(r->srcache, k, r->swarm_gen);
	bool listed = false;
	const char *t, *list;
	char *out;

	if (!trk__srcache_ready(e)) {
		uint64_t t0 = proto_now_ns();
		if (build_sources(r, k, e) != 0)
			return NULL;
		trk__conns_trace(r->s->conns, "build", t0, r->swarm_gen);
	}
	out = trk__srcache_render(e, tag, reps != NULL, &listed, len);
	if (out == NULL || !listed)
		return out;
	list = trk__srcache_replicas(e, &t);
	memcpy(rtag, t, TRK_MEMBERS_TAG_HEX + 1);
	if ((*reps = strdup(list)) == NULL) {
		free(out);
		return NULL;
	}
	return out;
}

/* A members_tag as a query sends it: NULL (absent) or 16 lower-case hex
 * digits; else -EINVAL. */
static int tag_check(const char *t)
{
	if (t == NULL)
		return 0;
	if (strlen(t) != TRK_MEMBERS_TAG_HEX)
		return -EINVAL;
	for (size_t i = 0; i < TRK_MEMBERS_TAG_HEX; i++)
		if (!((t[i] >= '0' && t[i] <= '9') || (t[i] >= 'a' && t[i] <= 'f')))
			return -EINVAL;
	return 0;
}

void trk__handle_sources(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	uint64_t version = 0, src = 0, dst = 0;
	struct trk_srckey k = {0};
	char *body;
	size_t len;

	if (trk__query_u64(c, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__query_u64(c, "src_rank", true, UINT32_MAX, &src, &err) != 0 ||
	    trk__query_u64(c, "dst_rank", true, UINT32_MAX, &dst, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	const char *tag = trk__query_str(c, "members_tag");
	if (tag_check(tag) != 0) {
		trk__fail(c, 400, "members_tag: want %d hex digits", TRK_MEMBERS_TAG_HEX);
		return;
	}
	const char *site = trk__query_str(c, "site");
	if (site != NULL && !trk_site_valid(site)) {
		trk__fail(c, 400, "site: want 1..%d of [A-Za-z0-9._-]", TRK_SITE_MAX);
		return;
	}
	if (trk__query_layout_known(c, version, k.layout) != 0)
		return;
	snprintf(k.site, sizeof(k.site), "%s", site != NULL ? site : "");
	k.version = version;
	k.src = (uint32_t)src;
	k.dst = (uint32_t)dst;
	if ((body = sources_text(r, &k, tag, NULL, NULL, &len)) == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__reply_raw(c, 200, "application/json", body, len);
	free(body);
}

/* ---- POST /sources: the parcels of every rank of a host at once ------------ */

/* parcels[i] of a batched query into k and its members tag (*tag, NULL:
 * none); 400-worthy errors in err. */
static int batch_key(json_t *p, size_t i, struct trk_srckey *k, const char **tag,
		     struct proto_err *err)
{
	json_t *v = json_object_get(p, "version"), *l = json_object_get(p, "layout");
	json_t *t = json_object_get(p, "members_tag");
	json_t *sr = json_object_get(p, "src_rank"), *dr = json_object_get(p, "dst_rank");

	if (!json_is_object(p))
		return proto_errf(err, EINVAL, "parcels[%zu]: want an object", i);
	if (!json_is_integer(v) || json_integer_value(v) < 1)
		return proto_errf(err, EINVAL, "parcels[%zu].version: want an integer >= 1", i);
	if (!json_is_integer(sr) || json_integer_value(sr) < 0 ||
	    json_integer_value(sr) > UINT32_MAX || !json_is_integer(dr) ||
	    json_integer_value(dr) < 0 || json_integer_value(dr) > UINT32_MAX)
		return proto_errf(err, EINVAL, "parcels[%zu]: src_rank and dst_rank: want integers "
				  "in 0..%u", i, UINT32_MAX);
	if (!json_is_string(l) ||
	    proto_parse_hex(json_string_value(l), k->layout, PROTO_HASH_BYTES) != 0)
		return proto_errf(err, EINVAL, "parcels[%zu].layout: want %d hex digits", i,
				  2 * PROTO_HASH_BYTES);
	*tag = t == NULL || json_is_null(t) ? NULL : json_is_string(t) ? json_string_value(t) : "";
	if (tag_check(*tag) != 0)
		return proto_errf(err, EINVAL, "parcels[%zu].members_tag: want %d hex digits", i,
				  TRK_MEMBERS_TAG_HEX);
	k->version = (uint64_t)json_integer_value(v);
	k->src = (uint32_t)json_integer_value(sr);
	k->dst = (uint32_t)json_integer_value(dr);
	return 0;
}

void trk__handle_sources_batch(struct trk_call *c)
{
	static const char head[] = "{\"answers\":[", tail[] = "]}\n", mid[] = "],\"replicas\":{";
	struct trk_registry *r = c->s->reg;
	struct trk_srckey keys[TRK_SOURCES_BATCH_MAX];
	const char *tags[TRK_SOURCES_BATCH_MAX];
	char *text[TRK_SOURCES_BATCH_MAX] = {0}, *lists[TRK_SOURCES_BATCH_MAX] = {0};
	char ltag[TRK_SOURCES_BATCH_MAX][TRK_MEMBERS_TAG_HEX + 1];
	size_t tlen[TRK_SOURCES_BATCH_MAX], n, nlists = 0, at = 0;
	size_t total = sizeof(head) + sizeof(tail) + sizeof(mid) + 3;
	json_t *arr = json_object_get(c->json, "parcels"), *p;
	json_t *shared = json_object_get(c->json, "shared_members");
	struct proto_err err = {{0}};
	char *body = NULL;

	if (!json_is_array(arr) || json_array_size(arr) == 0 ||
	    json_array_size(arr) > TRK_SOURCES_BATCH_MAX) {
		trk__fail(c, 400, "parcels: want an array of 1..%d parcels", TRK_SOURCES_BATCH_MAX);
		return;
	}
	if (shared != NULL && !json_is_boolean(shared)) {
		trk__fail(c, 400, "shared_members: want true or false");
		return;
	}
	json_t *site = json_object_get(c->json, "site");
	if (site != NULL && !json_is_null(site) &&
	    (!json_is_string(site) || !trk_site_valid(json_string_value(site)))) {
		trk__fail(c, 400, "site: want 1..%d of [A-Za-z0-9._-]", TRK_SITE_MAX);
		return;
	}
	n = json_array_size(arr);
	json_array_foreach(arr, at, p) {
		memset(&keys[at], 0, sizeof(keys[at]));
		if (batch_key(p, at, &keys[at], &tags[at], &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			return;
		}
		if (json_is_string(site))
			snprintf(keys[at].site, sizeof(keys[at].site), "%s", json_string_value(site));
	}
	/* Each answer as GET /sources gives it; an unknown version is that
	 * parcel's error, not the request's. Shared, each replicas list once. */
	for (size_t i = 0; i < n; i++) {
		char *list = NULL, t[TRK_MEMBERS_TAG_HEX + 1];
		if (trk__versions_find(c->s->vs, keys[i].version) == NULL) {
			char msg[96];
			int m = snprintf(msg, sizeof(msg),
					 "{\"status\":404,\"error\":\"version %llu is unknown\"}\n",
					 (unsigned long long)keys[i].version);
			text[i] = strdup(msg);
			tlen[i] = (size_t)m;
		} else {
			text[i] = sources_text(r, &keys[i], tags[i], json_is_true(shared) ? &list : NULL,
					       t, &tlen[i]);
		}
		if (text[i] == NULL)
			goto oom;
		total += tlen[i];
		if (list == NULL)
			continue;
		size_t j = 0;
		while (j < nlists && strcmp(ltag[j], t) != 0)
			j++;
		if (j < nlists) {
			free(list);
			continue;
		}
		lists[nlists] = list;
		memcpy(ltag[nlists++], t, sizeof(t));
		total += strlen(list) + TRK_MEMBERS_TAG_HEX + 4;
	}
	if ((body = malloc(total)) == NULL)
		goto oom;
	r->src_batches++;
	r->src_batched += n;
	memcpy(body, head, sizeof(head) - 1);
	at = sizeof(head) - 1;
	for (size_t i = 0; i < n; i++) {
		if (i > 0)
			body[at++] = ',';
		memcpy(body + at, text[i], tlen[i] - 1); /* without its newline */
		at += tlen[i] - 1;
	}
	if (json_is_true(shared)) {
		memcpy(body + at, mid, sizeof(mid) - 1);
		at += sizeof(mid) - 1;
		for (size_t j = 0; j < nlists; j++) {
			size_t l = strlen(lists[j]);
			at += (size_t)snprintf(body + at, total - at, "%s\"%s\":", j ? "," : "", ltag[j]);
			memcpy(body + at, lists[j], l);
			at += l;
		}
		memcpy(body + at, "}}\n", 3); /* the lists, the answer */
		at += 3;
	} else {
		memcpy(body + at, tail, sizeof(tail) - 1);
		at += sizeof(tail) - 1;
	}
	trk__reply_raw(c, 200, "application/json", body, at);
	goto out;
oom:
	trk__fail(c, 500, "out of memory");
out:
	free(body);
	for (size_t i = 0; i < n; i++)
		free(text[i]);
	for (size_t j = 0; j < nlists; j++)
		free(lists[j]);
}
