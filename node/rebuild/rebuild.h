/*
 * Rebuilding a version slot off the event loop. A delta version is the
 * parent's bytes with a few changes: its slot must first hold the parent,
 * then the delta is applied in place. The slot gets the parent in one of two
 * ways. Sparse: it is a slot that held an older version and a catch-up
 * function (the caller's) patches it up to the parent, touching only the
 * positions that changed since (node/rebuild/ re-applies the delta
 * that made the parent). Dense: a copy of the whole parent slot, the
 * fallback when there is no such slot or the catch-up fails. Either runs on
 * a worker thread as soon as the fetch begins, while the delta's chunks are
 * still arriving; once they are all verified the agent hands the worker the
 * apply, which runs after it (on the same thread, so it never reads a
 * half-made parent), and the loop learns the result through an eventfd.
 * An apply that fails after a sparse catch-up (the old slot did not hold
 * what it should: the apply's parent checksums say so) is run once more
 * after a dense copy. The event loop owns all agent state; the worker
 * touches only the destination slot, reads the parent slot, and runs the
 * functions it was given (which must read nothing the loop may change
 * meanwhile).
 */
#ifndef NODE_REBUILD_H
#define NODE_REBUILD_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

struct node_rebuild;

/* Runs on the worker (a catch-up, or the apply after the parent is in
 * place); 0 or a negative errno with err set. */
typedef int (*node_rebuild_fn)(void *arg, struct proto_err *err);

/* What the rebuild cost: the time to get the parent into the slot (the
 * catch-up, plus the dense copy when one was made), how long the apply
 * waited for it (the part the fetch did not hide), and the apply's; whether
 * a dense copy was made and, when a catch-up was tried but the copy made
 * all the same, why (else ""). */
struct node_rebuild_times {
	uint64_t copy_ms, wait_ms, apply_ms, catchup_ms;
	/* The apply's CPU time and minor page faults, the whole process's
	 * (its threads are the apply's own while it runs, and a loop that
	 * mostly waits): figures the machine's load does not stretch. */
	uint64_t apply_cpu_ms, apply_faults;
	bool dense;
	char fallback[300];
};

/* Runs on base's loop once the apply finished: rc and err as fn left them. */
typedef void (*node_rebuild_done)(int rc, const struct proto_err *err,
				  const struct node_rebuild_times *t, void *arg);

/*
 * Starts copying the first len bytes of src to dst on a worker thread. dst
 * and src are shared mappings of the files dst_fd and src_fd (offset 0),
 * which the copy of a fresh dst uses when it can (copy_file_range); -1 for
 * either, or dst not fresh (its pages touched before): memcpy.
 * dst_fresh: no page of dst was written through this mapping yet (a new
 * slot, maybe blank: node_slot_new_blank), so after a kernel copy the
 * worker writes each page once, to take the cost of a first write (a
 * fault, a trap in a VM) before the apply. All must stay open and mapped,
 * and src unchanged, until node_rebuild_free. On failure *out is NULL,
 * nothing was started and err says why. With len 0 (dst and src NULL, fds
 * -1) nothing is copied: the worker then only runs the function
 * node_rebuild_apply hands it, off the loop (the node's scrub).
 */
int node_rebuild_start(struct event_base *base, uint8_t *dst, int dst_fd, bool dst_fresh,
		       const uint8_t *src, int src_fd, size_t len, struct node_rebuild **out,
		       struct proto_err *err);

/*
 * The same, but the worker first runs catchup(catchup_arg), which should
 * make dst hold what src holds; the dense copy is made only when it fails
 * (or when the apply fails after it, see above). dst is a slot written
 * through its mapping before (not fresh). src and its fd must stay valid
 * for the fallback.
 */
int node_rebuild_start_sparse(struct event_base *base, uint8_t *dst, int dst_fd,
			      const uint8_t *src, int src_fd, size_t len, node_rebuild_fn catchup,
			      void *catchup_arg, struct node_rebuild **out, struct proto_err *err);

/*
 * Runs fn(fn_arg) on the worker once the copy is done, then done(..., arg)
 * on the loop. Called at most once per rebuild. Cannot fail.
 */
void node_rebuild_apply(struct node_rebuild *rb, node_rebuild_fn fn, void *fn_arg,
			node_rebuild_done done, void *arg);

/*
 * Feeding an apply that starts before all its input is there (the delta
 * parcels that landed while the others arrive): the loop marks what it
 * hands over where fn reads it, then calls node_rebuild_feed; fn, on the
 * worker, takes the count with node_rebuild_fed before it looks, and when
 * it has used all it found waits with node_rebuild_wait_fed for a count
 * other than the one it took. Neither can fail.
 */
void node_rebuild_feed(struct node_rebuild *rb);
uint64_t node_rebuild_fed(struct node_rebuild *rb);
/* Blocks until the count differs from seen: true, or false when the
 * rebuild is being freed (fn should then return at once). */
bool node_rebuild_wait_fed(struct node_rebuild *rb, uint64_t seen);
/*
 * Stops the copy at its next block (an apply under way runs to its end, or
 * to its next node_rebuild_wait_fed),
 * joins the worker and frees everything; done is not called after this.
 * NULL is fine.
 */
void node_rebuild_free(struct node_rebuild *rb);

#endif
