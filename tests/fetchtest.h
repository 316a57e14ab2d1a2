/* A parcel and its sources as the fetch layer sees them, for the tests of
 * the picker and the swarm (no fabric, no agent). */
#ifndef TESSERA_TESTS_FETCHTEST_H
#define TESSERA_TESTS_FETCHTEST_H

#include <stdio.h>
#include <string.h>

#include "node/fetch/fetch.h"

#define QN 64

/* A parcel of n chunks (QN at most) of size bytes with its per-chunk
 * state, nothing held, no owner known, read from npeers (3 at most) swarm
 * peers R2/0, R3/0, ... whose have-pages (empty) were just read. */
struct qparcel {
	struct proto_chunk chunks[QN];
	struct proto_mparcel mp;
	uint8_t st[QN], busy[QN], mine[QN], on[QN];
	uint16_t avail[QN];
	uint64_t busy_ms[QN];
	uint32_t owner[QN];
	uint8_t have[3][2 * QN / 8];
	struct fetch_source srcs[3];
	struct fetch_parcel p;
};

static inline void qparcel_init(struct qparcel *q, uint32_t n, uint32_t size, size_t npeers,
				uint64_t now)
{
	memset(q, 0, sizeof(*q));
	q->mp = (struct proto_mparcel){.nchunks = n, .chunks = q->chunks};
	for (uint32_t i = 0; i < n; i++) {
		q->chunks[i] = (struct proto_chunk){.size = size};
		q->owner[i] = UINT32_MAX;
	}
	for (size_t k = 0; k < npeers; k++) {
		struct fetch_source *s = &q->srcs[k];
		*s = (struct fetch_source){.info = {.peer = true}, .fa_valid = true,
					   .have = q->have[k], .have_ms = now, .listed_ms = now};
		snprintf(s->info.id, sizeof(s->info.id), "R%zu/0", k + 2);
	}
	q->p = (struct fetch_parcel){.mp = &q->mp, .state = q->st, .avail = q->avail,
				     .peer_busy = q->busy, .busy_ms = q->busy_ms, .mine = q->mine,
				     .owner_on = q->on, .owner = q->owner, .srcs = q->srcs,
				     .nsrcs = npeers, .progress_ms = now};
}

#endif
