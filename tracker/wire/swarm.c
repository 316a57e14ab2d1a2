/* Bounded swarm views: which members a large swarm's /sources answers
 * list. The tracker (server/sources.c) and the fanout simulator's model of
 * it (tests/sim/) both choose them here. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/tracker.h"

uint64_t trk_member_weight(const char *replica, const uint8_t layout[PROTO_HASH_BYTES])
{
	uint8_t h[crypto_shorthash_BYTES];
	uint64_t w;

	/* SipHash keyed by the layout: a replica ranks alike for every rank
	 * and version of the layout, differently in another. */
	_Static_assert(PROTO_HASH_BYTES >= crypto_shorthash_KEYBYTES, "layout digest as a key");
	crypto_shorthash(h, (const uint8_t *)replica, strlen(replica), layout);
	memcpy(&w, h, sizeof(w));
	return w;
}

struct ranked {
	uint64_t w;
	size_t i;
};

static int cmp_ranked(const void *x, const void *y)
{
	const struct ranked *a = x, *b = y;

	if (a->w != b->w)
		return a->w < b->w ? 1 : -1; /* heaviest first */
	return (a->i > b->i) - (a->i < b->i);
}

int trk_members_top(const uint64_t *w, size_t n, size_t m, bool *keep)
{
	struct ranked *r;

	if (m == 0 || n <= m) {
		for (size_t i = 0; i < n; i++)
			keep[i] = true;
		return 0;
	}
	if ((r = malloc(n * sizeof(*r))) == NULL)
		return -1;
	for (size_t i = 0; i < n; i++)
		r[i] = (struct ranked){w[i], i};
	qsort(r, n, sizeof(*r), cmp_ranked);
	memset(keep, 0, n * sizeof(*keep));
	for (size_t i = 0; i < m; i++)
		keep[r[i].i] = true;
	free(r);
	return 0;
}
