/* Failures only a person can fix, said once and backed off (see needsfix.h). */
#include "node/base/needsfix.h"

#include <stdio.h>
#include <string.h>

#include "proto/proto.h"

uint64_t node_fix_needed(struct node_fix *f, const char *who, const char *why, uint64_t first_ms,
			 uint64_t max_ms)
{
	uint64_t wait = first_ms << PROTO_MIN(f->times, 16u);

	if (f->times++ == 0 || strcmp(f->why, why) != 0) {
		snprintf(f->why, sizeof(f->why), "%s", why);
		LOG_WARN("%s: %s (asking again ever more slowly, every %llu s at most)", who, why,
			 (unsigned long long)(max_ms / 1000));
	} else {
		LOG_DEBUG("%s: still failing (%u in a row), asking again in %llu ms", who, f->times,
			  (unsigned long long)PROTO_MIN(wait, max_ms));
	}
	return PROTO_MIN(wait, max_ms);
}

bool node_fix_over(struct node_fix *f, const char *who)
{
	if (f->times == 0)
		return false;
	LOG_INFO("%s: no longer failing: %s", who, f->why);
	f->why[0] = 0;
	f->times = 0;
	return true;
}
