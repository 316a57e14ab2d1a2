/* Bounded swarm views: which members a swarm's /sources answers list. The
 * tracker (server/sources.c) and the fanout simulator's model of it
 * (tests/sim/) both choose them here. */
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

static int cmp_u64(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;

	return (a > b) - (a < b);
}

/* The rate under which a replica is slow: 1/slow of the median known rate
 * (the upper one of an even count); 0: none is (or no memory). */
static uint64_t slow_under(const uint64_t *bps, size_t n, uint64_t slow)
{
	uint64_t *r, under = 0;
	size_t k = 0;

	if (slow == 0 || (r = malloc(PROTO_MAX(n, 1) * sizeof(*r))) == NULL)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (bps[i] != 0)
			r[k++] = bps[i];
	if (k != 0) {
		qsort(r, k, sizeof(*r), cmp_u64);
		under = r[k / 2] / slow;
	}
	free(r);
	return under;
}

int trk_members_pick(const uint64_t *w, const uint64_t *bps, size_t n, size_t m, uint64_t slow,
		     bool *keep, bool *cut)
{
	uint64_t under = slow_under(bps, n, slow); /* the median's replica is kept: k > 0 */
	struct ranked *r;
	size_t k = 0;

	if ((r = malloc(PROTO_MAX(n, 1) * sizeof(*r))) == NULL)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (bps[i] == 0 || bps[i] >= under)
			r[k++] = (struct ranked){w[i], i};
	if (m != 0 && k > m)
		qsort(r, k, sizeof(*r), cmp_ranked);
	memset(keep, 0, n * sizeof(*keep));
	*cut = false;
	for (size_t i = 0; i < k && (m == 0 || i < m); i++)
		keep[r[i].i] = true;
	for (size_t i = 0; i < n; i++)
		*cut |= !keep[i];
	free(r);
	return 0;
}
