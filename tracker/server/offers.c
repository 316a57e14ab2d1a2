/* Offers of parcels in registered memory, and the /sources answer built on them. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

#define OFFER_PARCELS_MAX 65536

/* ---- offer sets ------------------------------------------------------------ */

void trk__offers_clear(struct trk_offers *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->sets[i].o);
	o->n = 0;
}

static struct trk_offer_set *offers_get(struct trk_offers *o, uint64_t v)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->sets[i].version == v)
			return &o->sets[i];
	return NULL;
}

const struct trk_offer *trk__offers_slot(const struct trk_offers *o, uint64_t v)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->sets[i].version == v)
			return o->sets[i].slot.len > 0 ? &o->sets[i].slot : NULL;
	return NULL;
}

/* Replaces the set for v (n == 0 without a slot removes it); takes list. */
static void offers_put(struct trk_offers *o, uint64_t v, struct trk_offer *list,
		       size_t n, const struct trk_offer *slot)
{
	struct trk_offer_set *s = offers_get(o, v);

	if (s != NULL) {
		free(s->o);
		*s = o->sets[--o->n];
	}
	if (n == 0 && slot->len == 0) {
		free(list);
		return;
	}
	if (o->n == TRK__OFFER_VERSIONS) {
		size_t lo = 0;
		for (size_t i = 1; i < o->n; i++)
			if (o->sets[i].version < o->sets[lo].version)
				lo = i;
		free(o->sets[lo].o);
		o->sets[lo] = o->sets[--o->n];
	}
	o->sets[o->n++] = (struct trk_offer_set){v, n, list, *slot};
}

static const struct trk_offer *offers_find(struct trk_offers *o, uint64_t v,
					   const uint8_t *layout, uint32_t src,
					   uint32_t dst)
{
	struct trk_offer_set *s = offers_get(o, v);

	for (size_t i = 0; s != NULL && i < s->n; i++)
		if (s->o[i].src_rank == src && s->o[i].dst_rank == dst &&
		    memcmp(s->o[i].layout, layout, PROTO_HASH_BYTES) == 0)
			return &s->o[i];
	return NULL;
}

/* ---- POST /offers ------------------------------------------------------------ */

static int parse_offer(struct trk_server *sv, json_t *o, size_t i,
		       const struct proto_manifest *m, struct trk_offer *out,
		       struct proto_err *err)
{
	const struct proto_mlayout *ml;
	const struct proto_mparcel *mp;
	uint64_t src = 0, dst = 0;
	int rc;

	if (!json_is_object(o))
		return proto_errf(err, EINVAL, "parcels[%zu]: must be an object", i);
	if ((rc = trk__get_hex(o, "layout", out->layout, PROTO_HASH_BYTES, err)) != 0 ||
	    (rc = trk__get_u64(o, "src_rank", true, UINT32_MAX, &src, err)) != 0 ||
	    (rc = trk__get_u64(o, "dst_rank", true, UINT32_MAX, &dst, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "addr", &out->addr, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "key", &out->key, err)) != 0 ||
	    (rc = trk__get_u64(o, "len", true, UINT64_MAX, &out->len, err)) != 0) {
		proto_err_prefix(err, "parcels[%zu]", i);
		return rc;
	}
	out->src_rank = (uint32_t)src;
	out->dst_rank = (uint32_t)dst;
	ml = trk__version_layout(sv, m->version, m, out->layout); /* or an addendum's */
	if (ml == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no such layout", i,
				  (unsigned long long)m->version);
	mp = proto_mlayout_parcel(ml, out->src_rank, out->dst_rank);
	if (mp == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no parcel %u -> %u", i,
				  (unsigned long long)m->version, out->src_rank,
				  out->dst_rank);
	if (mp->wire_bytes != out->len)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: len %llu but the parcel has %llu wire bytes",
				  i, (unsigned long long)out->len,
				  (unsigned long long)mp->wire_bytes);
	return 0;
}

/* "slot": a node's whole rank memory (its layout's bytes for its rank),
 * which holds the version complete, or, with "have", in part: the have-map
 * says which blocks are verified. */
static int parse_slot(json_t *js, const struct trk_node *n, struct trk_offer *out,
		      struct proto_err *err)
{
	int rc;

	if (n == NULL)
		return proto_errf(err, EINVAL, "slot: only a node offers one");
	if (!json_is_object(js))
		return proto_errf(err, EINVAL, "slot: must be an object");
	if ((rc = trk__get_u64_str(js, "addr", &out->addr, err)) != 0 ||
	    (rc = trk__get_u64_str(js, "key", &out->key, err)) != 0 ||
	    (rc = trk__get_u64(js, "len", true, UINT64_MAX, &out->len, err)) != 0) {
		proto_err_prefix(err, "slot");
		return rc;
	}
	json_t *hv = json_object_get(js, "have");
	if (hv != NULL && !json_is_object(hv))
		return proto_errf(err, EINVAL, "slot.have: must be an object");
	if (hv != NULL && ((rc = trk__get_u64_str(hv, "addr", &out->have_addr, err)) != 0 ||
			   (rc = trk__get_u64_str(hv, "key", &out->have_key, err)) != 0)) {
		proto_err_prefix(err, "slot.have");
		return rc;
	}
	out->partial = hv != NULL;
	if (out->len != n->layout->l.ranks[n->rank].nbytes)
		return proto_errf(err, EINVAL, "slot: len %llu but rank %u of its layout holds %llu bytes",
				  (unsigned long long)out->len, n->rank,
				  (unsigned long long)n->layout->l.ranks[n->rank].nbytes);
	memcpy(out->layout, n->layout->digest, PROTO_HASH_BYTES);
	out->dst_rank = n->rank;
	return 0;
}

void trk__handle_offers(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	uint64_t version = 0, snapshot_ms = 0;
	json_t *jp = json_object_get(c->json, "parcels");
	const struct proto_manifest *m = NULL;
	struct proto_manifest *owned = NULL;
	struct trk_offer *list = NULL, slot = {.len = 0};
	json_t *js = json_object_get(c->json, "slot");
	struct trk_publisher *p;
	struct trk_node *n;
	size_t cnt;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__get_u64(c->json, "snapshot_ms", false, TRK__WALL_MS_MAX, &snapshot_ms, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (!json_is_array(jp) || json_array_size(jp) > OFFER_PARCELS_MAX) {
		trk__fail(c, 400, "parcels: must be an array of at most %d", OFFER_PARCELS_MAX);
		return;
	}
	cnt = json_array_size(jp);
	n = trk__node_find(r, id);
	p = n == NULL ? trk__publisher_find(r, id) : NULL;
	if ((n == NULL || !n->alive) && (p == NULL || !p->alive)) {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	if (trk__versions_manifest(c->s->vs, version, &m, &owned, &err) != 0) {
		trk__fail(c, trk__versions_find(c->s->vs, version) ? 500 : 409,
			  "%s", err.msg);
		return;
	}
	list = cnt > 0 ? calloc(cnt, sizeof(*list)) : NULL;
	if (cnt > 0 && list == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < cnt; i++) {
		struct trk_offer *o = &list[i];
		if (parse_offer(c->s, json_array_get(jp, i), i, m, o, &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			goto out;
		}
		if (p != NULL && !trk__publisher_has_rank(p, o->src_rank)) {
			trk__fail(c, 400, "parcels[%zu]: publisher %s does not serve rank %u",
				  i, id, o->src_rank);
			goto out;
		}
		if (n != NULL && (memcmp(o->layout, n->layout->digest, PROTO_HASH_BYTES) != 0 ||
				  o->dst_rank != n->rank)) {
			trk__fail(c, 400,
				  "parcels[%zu]: a node offers only parcels of its own layout and rank",
				  i);
			goto out;
		}
		for (size_t j = 0; j < i; j++)
			if (list[j].src_rank == o->src_rank && list[j].dst_rank == o->dst_rank &&
			    memcmp(list[j].layout, o->layout, PROTO_HASH_BYTES) == 0) {
				trk__fail(c, 400, "parcels[%zu]: listed twice", i);
				goto out;
			}
	}
	if (js != NULL && parse_slot(js, n, &slot, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (p != NULL && cnt > 0)
		trk__versions_find(c->s->vs, version)->offered = true;
	if (p != NULL) /* what publishers serve moves replica targets */
		trk__registry_changed(r);
	offers_put(n != NULL ? &n->offers : &p->offers, version, list, cnt, &slot);
	trk__registry_swarm_changed(r);
	if (p != NULL && snapshot_ms != 0)
		trk__timeline_snapshot(r->tl, version, snapshot_ms);
	list = NULL;
	trk__reply_json(c, 200, json_pack("{s:I,s:I}", "version", (json_int_t)version,
					  "parcels", (json_int_t)cnt));
out:
	free(list);
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
}

/* ---- GET /sources ------------------------------------------------------------ */

json_t *trk__source_json(bool peer, const char *id, const char *host,
			   const char *provider, const char *addr,
			   const struct trk_offer *o)
{
	char a[24], k[24];

	json_t *j;

	snprintf(a, sizeof(a), "%llu", (unsigned long long)o->addr);
	snprintf(k, sizeof(k), "%llu", (unsigned long long)o->key);
	j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I}", "kind", peer ? "peer" : "publisher", "id",
		      id, "host", host, "provider", provider, "fabric_addr", addr, "addr", a, "key", k,
		      "len", (json_int_t)o->len);
	if (j != NULL && o->partial) {
		snprintf(a, sizeof(a), "%llu", (unsigned long long)o->have_addr);
		snprintf(k, sizeof(k), "%llu", (unsigned long long)o->have_key);
		if (json_object_set_new(j, "have", json_pack("{s:s,s:s}", "addr", a, "key", k)) != 0) {
			json_decref(j);
			j = NULL;
		}
	}
	return j;
}

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

void trk__json_shuffle(json_t *a)
{
	for (size_t i = json_array_size(a); i > 1; i--) {
		size_t j = randombytes_uniform((uint32_t)i);
		json_t *x = json_incref(json_array_get(a, i - 1));
		json_t *y = json_incref(json_array_get(a, j));
		json_array_set_new(a, i - 1, y);
		json_array_set_new(a, j, x);
	}
}

/* Fills e with the answer for parcel k: the swarm's members, its peers that
 * offer the parcel, then the publishers that do. 0 or -ENOMEM. */
static int build_sources(struct trk_registry *r, const struct trk_srckey *k,
			 struct trk_srcentry *e)
{
	json_t *members = NULL, *reps = NULL;
	int rc = trk__srcache_members_copy(r->srcache, e, k->layout, k->dst, r->members_gen);
	bool kept = rc == 0;

	if (rc == -ENOMEM)
		return rc;
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
		struct trk_node *n;
		const struct trk_offer *o;
		if (k->dst >= rep->nranks ||
		    memcmp(rep->layout->digest, k->layout, PROTO_HASH_BYTES) != 0)
			continue;
		n = rep->ranks[k->dst];
		if (n == NULL || !n->alive)
			continue;
		/* n->id is "<replica>/<dst>" (nodes.c): reps names the
		 * same members for a batch that shares them. */
		if (!kept && (json_array_append_new(members, json_string(n->id)) != 0 ||
			      json_array_append_new(reps, json_string(rep->name)) != 0))
			goto out;
		o = offers_find(&n->offers, k->version, k->layout, k->src, k->dst);
		if (o != NULL &&
		    trk__srcache_add_source(e, trk__source_json(true, n->id, n->host, n->provider,
							   n->addr, o), true) != 0)
			goto out;
	}
	for (struct trk_publisher *p = r->pubs; p; p = p->next) {
		const struct trk_offer *o;
		if (!p->alive)
			continue;
		o = offers_find(&p->offers, k->version, k->layout, k->src, k->dst);
		if (o == NULL)
			continue;
		for (size_t i = 0; i < p->nranks; i++)
			if (p->ranks[i].rank == o->src_rank &&
			    trk__srcache_add_source(e, trk__source_json(false, p->id, p->ranks[i].host,
								   p->ranks[i].provider,
								   p->ranks[i].addr, o),
						    false) != 0)
				goto out;
	}
	if (!kept) {
		if ((rc = trk__srcache_set_members(e, members, reps)) != 0)
			goto out;
		trk__srcache_members_keep(r->srcache, e, k->layout, k->dst, r->members_gen);
	}
	rc = 0;
	trk__srcache_set_ready(e);
out:
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
	if (trk__query_layout_known(c, version, k.layout) != 0)
		return;
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
	n = json_array_size(arr);
	json_array_foreach(arr, at, p) {
		memset(&keys[at], 0, sizeof(keys[at]));
		if (batch_key(p, at, &keys[at], &tags[at], &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			return;
		}
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
