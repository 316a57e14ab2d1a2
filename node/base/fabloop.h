/* Drives a fabric context from a libevent loop: polls on the CQ's wait fd
 * when the provider has one, and on a short timer in any case, so both sides
 * of a one-sided transfer make progress; the timer slows down while nothing
 * of ours is in flight and polls find nothing (see fabloop.c). */
#ifndef NODE_FABLOOP_H
#define NODE_FABLOOP_H

#include <event2/event.h>
#include <stdint.h>

#include "fabric/fab.h"

struct node_fabloop;

/* Starts driving ctx on base (ctx stays the caller's). period_us bounds the
 * wait between polls when nothing wakes the loop while transfers of ours
 * are in flight (idle, up to 8 ms). NULL on ENOMEM. */
struct node_fabloop *node_fabloop_new(struct event_base *base,
				      struct fab_ctx *ctx, unsigned period_us);
/* Polls now (e.g. right after posting). */
void node_fabloop_kick(struct node_fabloop *fl);
/* What the loop did so far (tests, diagnostics). Cannot fail. */
struct node_fabloop_counts {
	unsigned period_us;  /* the timer's period now */
	uint64_t timer_polls, fd_polls, kick_polls; /* polls by what woke them */
};
void node_fabloop_counts(const struct node_fabloop *fl, struct node_fabloop_counts *out);
/* Stops driving; the context is not closed. NULL is fine. */
void node_fabloop_free(struct node_fabloop *fl);

#endif
