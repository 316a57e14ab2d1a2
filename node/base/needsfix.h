/* A failure only a person can fix (a wrong key or URL, another model's
 * state), as a node agent's rank or a publisher keeps it: said once at
 * warn, kept for /healthz until a try succeeds, tried again ever more
 * slowly. Event-loop thread only. */
#ifndef NODE_NEEDSFIX_H
#define NODE_NEEDSFIX_H

#include <stdbool.h>
#include <stdint.h>

struct node_fix {
	char why[512];  /* what failed and what to change; "" when none */
	uint32_t times; /* tries failed so in a row */
};

/*
 * The try failed for why (what failed and what to change). Logs at warn
 * "<who>: <why> (asking again ever more slowly, every <max_ms> s at most)"
 * the first time and when why changes; the repeats at debug. Returns how
 * long to wait before trying again: first_ms doubling up to max_ms. Cannot
 * fail.
 */
uint64_t node_fix_needed(struct node_fix *f, const char *who, const char *why, uint64_t first_ms,
			 uint64_t max_ms);
/* A try succeeded: says at info what is over. Returns whether a failure
 * was held (f is then empty). Cannot fail. */
bool node_fix_over(struct node_fix *f, const char *who);

#endif
