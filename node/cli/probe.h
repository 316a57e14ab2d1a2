/*
 * The canary probe: attaches to a node like a serving engine
 * (libtessera-client), pins the active version, computes its canary score
 * (proto/canary.h) through the very memory a serving process reads, and
 * reports it to the tracker, which answers with the publisher's expected
 * score and the verdict.
 */
#ifndef NODE_PROBE_H
#define NODE_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "proto/util.h"
#include "tracker/tracker.h"

struct node_probe {
	uint64_t version;       /* the pinned version the score was read from */
	uint8_t digest[32];     /* its manifest digest */
	uint64_t score;         /* 32.32 fixed point (proto/canary.h) */
	/* From the tracker (node_probe_report): */
	bool have_expected;
	uint64_t expected;
	int ok;                 /* 1 match, 0 mismatch, -1 no verdict */
};

/*
 * Attaches to the node's socket as (replica, rank), waits (at most
 * timeout_ms) until a version >= min_version is active, pins it, scores it
 * and releases the pin. On failure err says why (the node's refusal, a
 * timeout, ...) and *out is unchanged.
 */
int node_probe_read(const char *sock, const char *replica, uint32_t rank, uint64_t min_version,
		    int timeout_ms, struct node_probe *out, struct proto_err *err);

/* POST /canary for node "replica/rank" with out's version and score on a
 * blocking tracker client; fills have_expected, expected and ok from the
 * answer. */
int node_probe_report(struct trk_client *trk, const char *replica, uint32_t rank,
		      struct node_probe *out, struct proto_err *err);

#endif
