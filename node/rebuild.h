/*
 * Rebuilding a version slot off the event loop. A delta version is the
 * parent's bytes with a few changes: its slot starts as a copy of the parent
 * slot, then the delta is applied in place. The copy is the dense part, so a
 * worker thread starts it as soon as the fetch begins, while the delta's
 * chunks are still arriving; once they are all verified the agent hands the
 * worker the apply, which runs after the copy (on the same thread, so it
 * never reads a half-copied slot), and the loop learns the result through an
 * eventfd. The event loop owns all agent state; the worker touches only the
 * destination slot, reads the parent slot, and runs the apply it was given
 * (which must read nothing the loop may change meanwhile).
 */
#ifndef NODE_REBUILD_H
#define NODE_REBUILD_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

struct node_rebuild;

/* Runs on the worker after the copy; 0 or a negative errno with err set. */
typedef int (*node_rebuild_fn)(void *arg, struct proto_err *err);

/* What the rebuild cost: the copy's duration, how long the apply waited for
 * it (the part of the copy the fetch did not hide), and the apply's. */
struct node_rebuild_times {
	uint64_t copy_ms, wait_ms, apply_ms;
};

/* Runs on base's loop once the apply finished: rc and err as fn left them. */
typedef void (*node_rebuild_done)(int rc, const struct proto_err *err,
				  const struct node_rebuild_times *t, void *arg);

/*
 * Starts copying the first len bytes of src to dst on a worker thread. dst
 * and src are shared mappings of the files dst_fd and src_fd (offset 0),
 * which the copy uses when it can (copy_file_range); -1 for either: memcpy.
 * All must stay open and mapped, and src unchanged, until node_rebuild_free.
 * On failure *out is NULL, nothing was started and err says why.
 */
int node_rebuild_start(struct event_base *base, uint8_t *dst, int dst_fd, const uint8_t *src,
		       int src_fd, size_t len, struct node_rebuild **out, struct proto_err *err);

/*
 * Runs fn(fn_arg) on the worker once the copy is done, then done(..., arg)
 * on the loop. Called at most once per rebuild. Cannot fail.
 */
void node_rebuild_apply(struct node_rebuild *rb, node_rebuild_fn fn, void *fn_arg,
			node_rebuild_done done, void *arg);

/*
 * Stops the copy at its next block (an apply under way runs to its end),
 * joins the worker and frees everything; done is not called after this.
 * NULL is fine.
 */
void node_rebuild_free(struct node_rebuild *rb);

#endif
