/* What a holder (a node or a publisher) offers: per version, the parcels
 * it serves from registered memory and, for a node, its whole slot; and
 * one offer as a /sources entry. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

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

void trk__offers_put(struct trk_offers *o, uint64_t v, struct trk_offer *list,
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

const struct trk_offer *trk__offers_find(struct trk_offers *o, uint64_t v, const uint8_t *layout,
					 uint32_t src, uint32_t dst)
{
	struct trk_offer_set *s = offers_get(o, v);

	for (size_t i = 0; s != NULL && i < s->n; i++)
		if (s->o[i].src_rank == src && s->o[i].dst_rank == dst &&
		    memcmp(s->o[i].layout, layout, PROTO_HASH_BYTES) == 0)
			return &s->o[i];
	return NULL;
}

json_t *trk__source_json(bool peer, const char *id, const char *site, const char *host,
			 const char *provider, const char *addr, const struct trk_offer *o)
{
	char a[24], k[24];

	json_t *j;

	snprintf(a, sizeof(a), "%llu", (unsigned long long)o->addr);
	snprintf(k, sizeof(k), "%llu", (unsigned long long)o->key);
	j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I}", "kind", peer ? "peer" : "publisher", "id",
		      id, "host", host, "provider", provider, "fabric_addr", addr, "addr", a, "key", k,
		      "len", (json_int_t)o->len);
	if (j != NULL && site[0] != 0 && json_object_set_new(j, "site", json_string(site)) != 0) {
		json_decref(j);
		return NULL;
	}
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
