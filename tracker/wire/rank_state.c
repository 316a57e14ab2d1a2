/* A rank's state for a version as the API writes it ("fetching",
 * "verified", "active", "failed"): what nodes report and the tracker shows. */
#include <errno.h>
#include <string.h>

#include "tracker/tracker.h"

static const char *state_names[TRK_STATE_COUNT] = {
	[TRK_STATE_FETCHING] = "fetching",
	[TRK_STATE_VERIFIED] = "verified",
	[TRK_STATE_ACTIVE] = "active",
	[TRK_STATE_FAILED] = "failed",
};

const char *trk_state_name(enum trk_rank_state s)
{
	return (unsigned)s < TRK_STATE_COUNT ? state_names[s] : "?";
}

int trk_state_parse(const char *s, enum trk_rank_state *out)
{
	for (int i = 0; i < TRK_STATE_COUNT; i++)
		if (strcmp(s, state_names[i]) == 0) {
			*out = (enum trk_rank_state)i;
			return 0;
		}
	return -EINVAL;
}
