/* The node's loop clock: monotonic milliseconds, and timers armed in them. */
#ifndef NODE_CLOCK_H
#define NODE_CLOCK_H

#include <event2/event.h>
#include <stdint.h>

#include "proto/util.h"

/* Monotonic ms (proto_now_ns). Cannot fail. */
static inline uint64_t node_now_ms(void)
{
	return proto_now_ns() / 1000000;
}

/* Arms ev to fire once, ms from now. */
static inline void node_arm(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

	event_add(ev, &tv);
}

#endif
