/* Replicas by name: a hash index beside the registry's sorted list. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

/*
 * Every heartbeat, report and offer names its node ("A/0"), and the list of
 * replicas is sorted by name for the status views: looking a name up there
 * costs O(replicas) string compares per request. The index finds it in
 * O(1): chained buckets, SipHash (crypto_shorthash) under a random key so
 * that names chosen by a stranger cannot pile into one chain. It doubles
 * when it holds more replicas than buckets; a failed doubling only makes
 * chains longer, so adding never fails.
 */

#define BUCKETS_MIN 64

_Static_assert(sizeof(((struct trk_registry *)0)->rix_key) == crypto_shorthash_KEYBYTES,
	       "rix_key holds a crypto_shorthash key");

static size_t bucket(const struct trk_registry *r, const char *name, size_t nb)
{
	uint8_t h[crypto_shorthash_BYTES];
	uint64_t v;

	crypto_shorthash(h, (const unsigned char *)name, strlen(name), r->rix_key);
	memcpy(&v, h, sizeof(v));
	return (size_t)(v & (nb - 1));
}

int trk__repindex_init(struct trk_registry *r)
{
	r->rix = calloc(BUCKETS_MIN, sizeof(*r->rix));
	if (r->rix == NULL)
		return -ENOMEM;
	r->rix_nb = BUCKETS_MIN;
	r->rix_n = 0;
	crypto_shorthash_keygen(r->rix_key);
	return 0;
}

void trk__repindex_fini(struct trk_registry *r)
{
	free(r->rix);
	r->rix = NULL;
	r->rix_nb = r->rix_n = 0;
}

static void grow(struct trk_registry *r)
{
	size_t nb = r->rix_nb * 2;
	struct trk_replica **t = calloc(nb, sizeof(*t));

	if (t == NULL)
		return;
	for (size_t i = 0; i < r->rix_nb; i++)
		while (r->rix[i] != NULL) {
			struct trk_replica *rep = r->rix[i];
			size_t b = bucket(r, rep->name, nb);
			r->rix[i] = rep->hnext;
			rep->hnext = t[b];
			t[b] = rep;
		}
	free(r->rix);
	r->rix = t;
	r->rix_nb = nb;
}

void trk__repindex_add(struct trk_registry *r, struct trk_replica *rep)
{
	size_t b;

	if (r->rix_n >= r->rix_nb)
		grow(r);
	b = bucket(r, rep->name, r->rix_nb);
	rep->hnext = r->rix[b];
	r->rix[b] = rep;
	r->rix_n++;
}

void trk__repindex_del(struct trk_registry *r, struct trk_replica *rep)
{
	struct trk_replica **pp = &r->rix[bucket(r, rep->name, r->rix_nb)];

	while (*pp != NULL && *pp != rep)
		pp = &(*pp)->hnext;
	if (*pp == NULL)
		return;
	*pp = rep->hnext;
	rep->hnext = NULL;
	r->rix_n--;
}

struct trk_replica *trk__replica_find(struct trk_registry *r, const char *name)
{
	struct trk_replica *rep = r->rix[bucket(r, name, r->rix_nb)];

	while (rep != NULL && strcmp(rep->name, name) != 0)
		rep = rep->hnext;
	return rep;
}
