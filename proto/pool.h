/* The worker pool: threads made once and kept, a parallel-for and tasks on them. */
#ifndef PROTO_POOL_H
#define PROTO_POOL_H

/*
 * One pool per process, as libuv's threadpool: a thread is made the first
 * time that many are wanted at once, and kept (blocked, idle) for the life
 * of the process, so work done every version makes no thread. Work handed
 * to the pool never queues behind other work: it gets an idle thread, or a
 * new one. So a loop on T threads runs on T threads, as when each caller
 * made its own, and work running on the pool may run loops on it.
 *
 * Two forms: proto_pool_for, a parallel-for the caller takes part in and
 * waits for (codecs, the synthetic model), and proto_pool_start/join, one
 * task on a thread of its own that the caller joins later (an event loop's
 * workers, which post their result back). After a fork the child starts
 * with no thread; the pool makes them again as they are wanted.
 */

#include <stdbool.h>
#include <stdint.h>

/* One item of a loop: 0 to go on, nonzero to hand out no more items (the
 * ones running finish). slot says which of the loop's threads runs it, in
 * [0, threads), the caller's being 0: no two items run with the same slot
 * at once, so per-slot scratch needs no lock. */
typedef int (*proto_pool_fn)(void *arg, unsigned slot, uint64_t i);

/* Runs fn(arg, slot, i) once for every i in [0, n), handed out in order to
 * up to `threads` threads at once (0 counts as 1; never more than n), the
 * caller's among them; on one thread (or n <= 1) everything runs on the
 * caller's, in order. Returns when every item handed out has run. Cannot
 * fail: a thread the pool cannot make leaves its items to the others. */
void proto_pool_for(uint64_t n, unsigned threads, proto_pool_fn fn, void *arg);

/* Makes threads ahead, so that the next loop on that many threads makes
 * none: at least threads - 1 idle ones (the caller is the other). Best
 * effort; cannot fail. */
void proto_pool_reserve(unsigned threads);

/* Private to pool.c: one piece of work waiting for, or run by, threads. */
struct proto_pool__work {
	void (*run)(struct proto_pool__work *w);
	unsigned want;   /* threads it still waits for */
	unsigned active; /* threads running it */
	struct proto_pool__work *next;
};

/* A task: fn(arg) on a pool thread of its own. The caller owns the
 * struct (embedded in its job) and keeps it until joined. */
struct proto_pool_task {
	struct proto_pool__work w; /* private */
	void (*fn)(void *arg);
	void *arg;
	bool started;
};

/* Starts fn(arg) on a thread now. 0, or -EAGAIN when no thread could be
 * had: fn then never runs (t needs no join). */
int proto_pool_start(struct proto_pool_task *t, void (*fn)(void *arg), void *arg);
/* Waits until fn has returned; t may be started again. A task never
 * started (or already joined) returns at once. */
void proto_pool_join(struct proto_pool_task *t);

#endif
