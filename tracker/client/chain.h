/* The chain guard's judgement of one X-Tessera-Chain header (tracker.h,
 * "The chain guard"): what the client keeps of the chain it has seen. */
#ifndef TRACKER_CLIENT_CHAIN_H
#define TRACKER_CLIENT_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracker/tracker.h"

struct trk__chain {
	char cluster[2 * TRK_CLUSTER_ID_BYTES + 1];
	char instance[2 * TRK_EPOCH_BYTES + 1];
	uint64_t latest;
	char digest[2 * PROTO_HASH_BYTES + 1]; /* or "-" with latest 0 */
};
struct trk__chain_seen {
	bool have;          /* a chain was seen: its cluster id is c.cluster */
	struct trk__chain c; /* the highest version seen, from which instance */
};
/* Parses "CLUSTER INSTANCE LATEST DIGEST" exactly (lower-case hex of the
 * right lengths, one space apart, LATEST in decimal without sign, leading
 * zero or overflow, DIGEST "-" only with LATEST 0). 0, or -EPROTO. */
int trk__chain_parse(const char *h, struct trk__chain *out);
/* Judges header h (NULL: none, fine) of an answer from tracker who against
 * seen: 0 when it fits (seen then remembers it), -ESTALE when the tracker
 * forgot the chain, -EPROTO when h is malformed (msg says why). */
int trk__chain_check(struct trk__chain_seen *seen, const char *h, const char *who,
		     char *msg, size_t cap);

#endif
