/* /sources answers rendered once per swarm state and reused until it changes. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/params.h"
#include "tracker/server/internal.h"

/*
 * After a version lands, every node asks for the sources of its parcel
 * within about a second, and building each answer with jansson was most of
 * the tracker's work at scale (tracker/NOTES.md). An entry keeps, per
 * parcel (version, layout, src rank, dst rank), the rendered members array
 * and each source's rendered object, stamped with the registry's swarm
 * generation (bumped by every registration, node gone, offer and publisher
 * change: trk__registry_swarm_changed). A query whose entry is current
 * costs a shuffle of the peers and one copy: peers still come in a fresh
 * random order for every query.
 *
 * The members array is most of an answer, the same for every rank of the
 * swarm and mostly the same from one version to the next. It carries a tag
 * (a short hash of its text); a query that names the tag it holds gets
 * "members_same":true instead of the array.
 *
 * A host's ranks ask together (POST /sources) for parcels of different
 * swarms: rank d of every replica is "<replica>/d", so their lists differ
 * only by that suffix. Asked with "shared_members", an answer names its
 * replicas list by its own tag ("members_of") and the batch carries each
 * list once: a host's first query of ten ranks costs one list of names
 * instead of ten lists of ids. The entry keeps that list rendered too.
 *
 * A swarm's members (rank d of every live replica of the layout) change
 * only when a node registers or goes (the registry's members generation),
 * not with a new version or an offer, which change the sources: the
 * members lists are kept apart too (struct trk_srcmembers), and an entry
 * rebuilt for a new version or after an offer copies them instead of
 * rendering them again.
 */

#define ENTRIES 32

struct trk_srcentry {
	bool used;               /* holds key's answer, or is being built */
	bool ready;              /* built completely at generation gen */
	uint64_t gen, last_use;
	struct trk_srckey key;
	char *members;           /* the JSON array */
	bool cut;                /* the swarm has more members than it lists */
	char tag[TRK_MEMBERS_TAG_HEX + 1]; /* its short hash, hex */
	char *reps;              /* the members' replica names, a JSON array */
	char rtag[TRK_MEMBERS_TAG_HEX + 1]; /* its short hash, hex */
	char **src;              /* source objects: peers, then publishers */
	size_t *srclen;
	size_t npeers, nsrc, cap;
	size_t bytes;            /* sum of the above texts */
	size_t *order;           /* scratch for the shuffle */
};

struct trk_srcmembers {
	bool used;
	uint64_t gen, last_use;
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t dst;
	char site[TRK_SITE_MAX + 1];
	char *members, *reps;
	bool cut;
	char tag[TRK_MEMBERS_TAG_HEX + 1], rtag[TRK_MEMBERS_TAG_HEX + 1];
};

struct trk_srcache {
	struct trk_srcentry e[ENTRIES];
	struct trk_srcmembers m[ENTRIES];
	uint64_t tick;
	uint64_t hits, misses;
};

static void entry_clear(struct trk_srcentry *e)
{
	for (size_t i = 0; i < e->nsrc; i++)
		free(e->src[i]);
	free(e->members);
	free(e->reps);
	e->members = e->reps = NULL;
	e->npeers = e->nsrc = 0;
	e->bytes = 0;
	e->used = e->ready = e->cut = false;
}

int trk__srcache_new(struct trk_srcache **out)
{
	*out = calloc(1, sizeof(**out));
	return *out != NULL ? 0 : -ENOMEM;
}

void trk__srcache_free(struct trk_srcache *sc)
{
	if (sc == NULL)
		return;
	for (size_t i = 0; i < ENTRIES; i++) {
		entry_clear(&sc->e[i]);
		free(sc->e[i].src);
		free(sc->e[i].srclen);
		free(sc->e[i].order);
		free(sc->m[i].members);
		free(sc->m[i].reps);
	}
	free(sc);
}

static bool key_eq(const struct trk_srckey *a, const struct trk_srckey *b)
{
	return a->version == b->version && a->src == b->src && a->dst == b->dst &&
	       memcmp(a->layout, b->layout, PROTO_HASH_BYTES) == 0 && strcmp(a->site, b->site) == 0;
}

struct trk_srcentry *trk__srcache_get(struct trk_srcache *sc, const struct trk_srckey *k,
			       uint64_t gen)
{
	struct trk_srcentry *e, *lru = &sc->e[0];

	sc->tick++;
	for (size_t i = 0; i < ENTRIES; i++) {
		e = &sc->e[i];
		if (e->used && key_eq(&e->key, k)) {
			e->last_use = sc->tick;
			if (e->ready && e->gen == gen) {
				sc->hits++;
				return e;
			}
			lru = e;
			goto rebuild;
		}
		if (!e->used || (lru->used && e->last_use < lru->last_use))
			lru = e;
	}
rebuild:
	sc->misses++;
	entry_clear(lru);
	lru->used = true;
	lru->key = *k;
	lru->gen = gen;
	lru->last_use = sc->tick;
	return lru;
}

/* a as compact text (malloc'ed) and its tag; NULL on ENOMEM. */
static char *dump_tagged(json_t *a, char tag[TRK_MEMBERS_TAG_HEX + 1])
{
	uint8_t h[TRK_MEMBERS_TAG_HEX / 2];
	char *t = json_dumps(a, JSON_COMPACT);

	if (t == NULL)
		return NULL;
	crypto_generichash(h, sizeof(h), (const uint8_t *)t, strlen(t), NULL, 0);
	sodium_bin2hex(tag, TRK_MEMBERS_TAG_HEX + 1, h, sizeof(h));
	return t;
}

int trk__srcache_set_members(struct trk_srcentry *e, json_t *members, json_t *reps, bool cut)
{
	e->cut = cut;
	if ((e->members = dump_tagged(members, e->tag)) == NULL ||
	    (e->reps = dump_tagged(reps, e->rtag)) == NULL)
		return -ENOMEM;
	e->bytes += strlen(e->members);
	return 0;
}

static struct trk_srcmembers *members_find(struct trk_srcache *sc, const struct trk_srckey *k)
{
	for (size_t i = 0; i < ENTRIES; i++)
		if (sc->m[i].used && sc->m[i].dst == k->dst &&
		    memcmp(sc->m[i].layout, k->layout, PROTO_HASH_BYTES) == 0 &&
		    strcmp(sc->m[i].site, k->site) == 0)
			return &sc->m[i];
	return NULL;
}

int trk__srcache_members_copy(struct trk_srcache *sc, struct trk_srcentry *e,
			      const struct trk_srckey *k, uint64_t gen)
{
	struct trk_srcmembers *m = members_find(sc, k);

	if (m == NULL || m->gen != gen)
		return -ENOENT;
	m->last_use = sc->tick;
	if ((e->members = strdup(m->members)) == NULL || (e->reps = strdup(m->reps)) == NULL)
		return -ENOMEM;
	memcpy(e->tag, m->tag, sizeof(e->tag));
	memcpy(e->rtag, m->rtag, sizeof(e->rtag));
	e->cut = m->cut;
	e->bytes += strlen(e->members);
	return 0;
}

void trk__srcache_members_keep(struct trk_srcache *sc, const struct trk_srcentry *e,
			       const struct trk_srckey *k, uint64_t gen)
{
	struct trk_srcmembers *m = members_find(sc, k);
	char *members, *reps;

	if (m == NULL) {
		m = &sc->m[0];
		for (size_t i = 1; i < ENTRIES && m->used; i++)
			if (!sc->m[i].used || sc->m[i].last_use < m->last_use)
				m = &sc->m[i];
	}
	members = strdup(e->members);
	reps = strdup(e->reps);
	free(m->members);
	free(m->reps);
	*m = (struct trk_srcmembers){.used = members != NULL && reps != NULL, .gen = gen,
				     .last_use = sc->tick, .dst = k->dst, .cut = e->cut,
				     .members = members, .reps = reps};
	if (!m->used) {
		free(members);
		free(reps);
		m->members = m->reps = NULL;
		return;
	}
	memcpy(m->layout, k->layout, PROTO_HASH_BYTES);
	memcpy(m->site, k->site, sizeof(m->site));
	memcpy(m->tag, e->tag, sizeof(m->tag));
	memcpy(m->rtag, e->rtag, sizeof(m->rtag));
}

const char *trk__srcache_replicas(const struct trk_srcentry *e, const char **rtag)
{
	*rtag = e->rtag;
	return e->reps;
}

int trk__srcache_add_source(struct trk_srcentry *e, json_t *src, bool peer)
{
	char *t;

	if (src == NULL)
		return -ENOMEM;
	t = json_dumps(src, JSON_COMPACT);
	json_decref(src);
	if (t == NULL)
		return -ENOMEM;
	if (e->nsrc == e->cap) {
		size_t cap = e->cap ? 2 * e->cap : 16;
		char **s = realloc(e->src, cap * sizeof(*s));
		if (s != NULL)
			e->src = s;
		size_t *l = s != NULL ? realloc(e->srclen, cap * sizeof(*l)) : NULL;
		if (l != NULL)
			e->srclen = l;
		size_t *o = l != NULL ? realloc(e->order, cap * sizeof(*o)) : NULL;
		if (o == NULL) {
			free(t);
			return -ENOMEM;
		}
		e->order = o;
		e->cap = cap;
	}
	if (peer && e->npeers != e->nsrc) {
		free(t); /* peers come first: the caller adds them first */
		return -EINVAL;
	}
	e->srclen[e->nsrc] = strlen(t);
	e->order[e->nsrc] = e->nsrc; /* the render shuffles the peers' part in place */
	e->src[e->nsrc++] = t;
	e->npeers += peer;
	e->bytes += strlen(t) + 1;
	return 0;
}

void trk__srcache_set_ready(struct trk_srcentry *e)
{
	e->ready = true;
}

bool trk__srcache_ready(const struct trk_srcentry *e)
{
	return e->ready;
}

/* A small fast generator for the shuffle, seeded per answer from libsodium:
 * the order only spreads the swarm, it protects nothing. */
static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

char *trk__srcache_render(struct trk_srcentry *e, const char *tag, bool shared, bool *listed,
			  size_t *len)
{
	/* The tag first: a reader that keeps it finds it without parsing. */
	static const char head[] = "{\"members_tag\":\"", head2[] = "\",\"sources\":[",
			  mid[] = ",\"members\":", same[] = ",\"members_same\":true",
			  of[] = ",\"members_of\":\"", tail[] = "}\n";
	bool keep = tag != NULL && strcmp(tag, e->tag) == 0;
	size_t n = sizeof(head) + sizeof(e->tag) + sizeof(head2) + sizeof(mid) + sizeof(same) +
		   sizeof(of) + sizeof(e->rtag) + sizeof(tail) + e->bytes + 48,
	       at = 0, cap = (size_t)proto_param(PROTO_PARAM_SWARM_PEERS), np = e->npeers;
	char *out = malloc(n);
	uint64_t seed;

	if (out == NULL)
		return NULL;
	randombytes_buf(&seed, sizeof(seed));
	/* The peers in a fresh random order; past TESSERA_SWARM_PEERS, a
	 * random sample of that many: the first of a partial shuffle of
	 * order, a permutation of the peers kept from the last render (any
	 * permutation shuffled gives a uniform sample), so that an answer
	 * costs the peers it lists, not the swarm's. */
	if (cap != 0 && np > cap)
		np = cap;
	for (size_t i = 0; i < np && i + 1 < e->npeers; i++) {
		size_t j = i + (size_t)(splitmix(&seed) % (e->npeers - i)), t = e->order[i];
		e->order[i] = e->order[j];
		e->order[j] = t;
	}
	memcpy(out, head, sizeof(head) - 1);
	at += sizeof(head) - 1;
	memcpy(out + at, e->tag, strlen(e->tag));
	at += strlen(e->tag);
	memcpy(out + at, head2, sizeof(head2) - 1);
	at += sizeof(head2) - 1;
	for (size_t i = 0; i < np + (e->nsrc - e->npeers); i++) {
		/* The sample, then the publishers (after the peers, in order). */
		size_t k = i < np ? e->order[i] : e->npeers + (i - np);
		if (i > 0)
			out[at++] = ',';
		memcpy(out + at, e->src[k], e->srclen[k]);
		at += e->srclen[k];
	}
	out[at++] = ']';
	if (np < e->npeers) /* how many the sample was drawn from */
		at += (size_t)snprintf(out + at, n - at, ",\"peers_of\":%zu", e->npeers);
	if (e->cut) /* with the list or without it (members_same, members_of) */
		at += (size_t)snprintf(out + at, n - at, ",\"members_cut\":true");
	*listed = !keep && shared;
	if (keep) {
		memcpy(out + at, same, sizeof(same) - 1);
		at += sizeof(same) - 1;
	} else if (shared) {
		memcpy(out + at, of, sizeof(of) - 1);
		at += sizeof(of) - 1;
		memcpy(out + at, e->rtag, strlen(e->rtag));
		at += strlen(e->rtag);
		out[at++] = '"';
	} else {
		size_t ml = strlen(e->members);
		memcpy(out + at, mid, sizeof(mid) - 1);
		at += sizeof(mid) - 1;
		memcpy(out + at, e->members, ml);
		at += ml;
	}
	memcpy(out + at, tail, sizeof(tail) - 1);
	at += sizeof(tail) - 1;
	*len = at;
	return out;
}

void trk__srcache_stats(const struct trk_srcache *sc, uint64_t *hits, uint64_t *misses)
{
	*hits = sc != NULL ? sc->hits : 0;
	*misses = sc != NULL ? sc->misses : 0;
}
