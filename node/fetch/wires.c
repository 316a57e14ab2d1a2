/* Buffers for delta parcels' encoded bytes, kept across versions. */
#include "node/fetch/fetch.h"

#include <inttypes.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

/* A delta parcel's bytes land in a buffer of their own, kept after the
 * activation for the next rotation's catch-up (node/rebuild/) and given
 * back at the activation after that. Buffers given back are kept
 * (WIRES_MAX at most) and handed out again, the smallest large enough
 * first: a new buffer's pages each cost a fault when first written, paid
 * on the loop as the chunks land (NOTES.md, "Wire buffers"). */
#define WIRES_MAX 16u

struct fetch_wires {
	uint32_t n;
	uint8_t *buf[WIRES_MAX];
	size_t cap[WIRES_MAX];
};

uint8_t *fetch_wire_get(struct fetcher *x, size_t len)
{
	struct fetch_wires *w = x->wires;
	uint32_t best = UINT32_MAX;

	for (uint32_t i = 0; w != NULL && i < w->n; i++)
		if (w->cap[i] >= len && (best == UINT32_MAX || w->cap[i] < w->cap[best]))
			best = i;
	if (best == UINT32_MAX)
		return malloc(PROTO_MAX(len, 1));
	uint8_t *b = w->buf[best];
	w->n--;
	w->buf[best] = w->buf[w->n];
	w->cap[best] = w->cap[w->n];
	return b;
}

void fetch_wire_put(struct fetcher *x, uint8_t *buf)
{
	struct fetch_wires *w = x != NULL ? x->wires : NULL;

	if (buf == NULL)
		return;
	if (x != NULL && w == NULL && !x->wires_closed)
		w = x->wires = calloc(1, sizeof(*w));
	if (w == NULL) {
		free(buf);
		return;
	}
	size_t cap = malloc_usable_size(buf);
	if (w->n == WIRES_MAX) { /* full: the smallest goes, maybe this one */
		uint32_t small = 0;
		for (uint32_t i = 1; i < w->n; i++)
			if (w->cap[i] < w->cap[small])
				small = i;
		if (w->cap[small] >= cap) {
			free(buf);
			return;
		}
		free(w->buf[small]);
		w->buf[small] = w->buf[--w->n];
		w->cap[small] = w->cap[w->n];
	}
	w->buf[w->n] = buf;
	w->cap[w->n++] = cap;
}

/* Before the first delta the pool is empty: the first standby copy, between
 * versions, makes a buffer of WIRE_READY_PERMILLE of each of our parcels'
 * bytes and writes it once (2 %: twice what 1.6 % of BF16 elements changed
 * cost on the wire). */
#define WIRE_READY_PERMILLE 20u

void fetch_wires_ready(struct fetcher *x, const struct proto_plan *plan)
{
	uint32_t mine = 0, made = 0;
	uint64_t t0 = node_now_ms(), bytes = 0;

	for (uint32_t i = 0; i < plan->nparcels; i++)
		mine += plan->parcels[i].dst_rank == x->o.rank;
	if (mine == 0 || x->wires != NULL || x->wires_closed)
		return; /* once: later deltas find the buffers of earlier ones */
	for (uint32_t i = 0; i < plan->nparcels; i++) {
		const struct proto_parcel *pp = &plan->parcels[i];
		size_t len = (size_t)(pp->bytes * WIRE_READY_PERMILLE / 1000);
		if (pp->dst_rank != x->o.rank || len == 0)
			continue;
		uint8_t *b = malloc(len);
		if (b == NULL)
			break;
		/* Each page's first write, now (not 0: malloc and a memset to 0
		 * may be made a calloc, which writes nothing). */
		memset(b, 0xa5, len);
		fetch_wire_put(x, b);
		made++;
		bytes += len;
	}
	LOG_DEBUG("node %s: %u delta wire buffers (%" PRIu64 " bytes) made ready in %" PRIu64 " ms",
		  x->o.id, made, bytes, node_now_ms() - t0);
}

void fetch_wires_fini(struct fetcher *x)
{
	struct fetch_wires *w = x->wires;

	x->wires_closed = true;
	x->wires = NULL;
	for (uint32_t i = 0; w != NULL && i < w->n; i++)
		free(w->buf[i]);
	free(w);
}
