/* The worker pool (see pool.h). */
#include "proto/pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/*
 * Work waits in a list until enough threads took it. Every thread is idle
 * (waiting on `work`) or running one piece; `idle` counts the idle ones,
 * `wanted` the threads the listed work still waits for, and whoever lists
 * work makes threads until idle >= wanted: no work waits for a busy thread.
 * A thread that took work counts itself busy before it runs it.
 */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t work; /* work was listed */
	pthread_cond_t left; /* a thread finished a piece */
	struct proto_pool__work *head, *tail;
	unsigned idle, wanted;
	pthread_once_t once;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
	  NULL, NULL, 0, 0, PTHREAD_ONCE_INIT};

/* ---- threads ---------------------------------------------------------------- */

static void unlist(struct proto_pool__work *w)
{
	struct proto_pool__work **pp = &pool.head, *prev = NULL;

	for (; *pp != NULL; prev = *pp, pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			if (pool.tail == w)
				pool.tail = prev;
			w->next = NULL;
			return;
		}
}

static void *thread_main(void *unused)
{
	(void)unused;
	pthread_mutex_lock(&pool.mu);
	for (;;) {
		while (pool.head == NULL)
			pthread_cond_wait(&pool.work, &pool.mu);
		struct proto_pool__work *w = pool.head;
		w->want--;
		w->active++;
		pool.wanted--;
		pool.idle--;
		if (w->want == 0)
			unlist(w);
		pthread_mutex_unlock(&pool.mu);
		w->run(w);
		pthread_mutex_lock(&pool.mu);
		w->active--; /* w may be gone once the lock is given up */
		pool.idle++;
		pthread_cond_broadcast(&pool.left);
	}
	return NULL;
}

/* Locked: makes threads until every wanted one can be had; false when the
 * system gives no more. */
static bool grow(void)
{
	pthread_attr_t at;
	bool ok = true;

	if (pool.idle >= pool.wanted)
		return true;
	if (pthread_attr_init(&at) != 0)
		return false;
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	while (pool.idle < pool.wanted) {
		pthread_t th;
		if (pthread_create(&th, &at, thread_main, NULL) != 0) {
			ok = false;
			break;
		}
		pool.idle++; /* it counts as idle until it takes work */
	}
	pthread_attr_destroy(&at);
	return ok;
}

/* The child of a fork has none of the parent's threads, nor its work. */
static void before_fork(void)
{
	pthread_mutex_lock(&pool.mu);
}

static void after_fork_parent(void)
{
	pthread_mutex_unlock(&pool.mu);
}

static void after_fork_child(void)
{
	pthread_mutex_unlock(&pool.mu);
	pthread_cond_init(&pool.work, NULL);
	pthread_cond_init(&pool.left, NULL);
	pool.head = pool.tail = NULL;
	pool.idle = pool.wanted = 0;
}

static void pool_once(void)
{
	(void)pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* Lists w for want threads and makes threads for it; false (w listed for
 * fewer, or none) when the system gives too few. */
static bool list(struct proto_pool__work *w, unsigned want)
{
	bool ok;

	pthread_once(&pool.once, pool_once);
	pthread_mutex_lock(&pool.mu);
	w->want = want;
	w->active = 0;
	w->next = NULL;
	if (pool.tail != NULL)
		pool.tail->next = w;
	else
		pool.head = w;
	pool.tail = w;
	pool.wanted += want;
	ok = grow();
	if (!ok) { /* only the threads there are: the rest is not waited for */
		unsigned short_by = pool.wanted - pool.idle;
		unsigned drop = w->want < short_by ? w->want : short_by;
		w->want -= drop;
		pool.wanted -= drop;
		if (w->want == 0)
			unlist(w);
	}
	pthread_cond_broadcast(&pool.work);
	pthread_mutex_unlock(&pool.mu);
	return ok;
}

/* Waits for the threads running w. A loop's caller first takes w off the
 * list (the items are all handed out: threads not on it yet need not
 * come); a task waits for its thread to take it too. */
static void finish(struct proto_pool__work *w, bool unlisted)
{
	pthread_mutex_lock(&pool.mu);
	if (unlisted && w->want > 0) {
		pool.wanted -= w->want;
		w->want = 0;
		unlist(w);
	}
	while (w->want > 0 || w->active > 0)
		pthread_cond_wait(&pool.left, &pool.mu);
	pthread_mutex_unlock(&pool.mu);
}

void proto_pool_reserve(unsigned threads)
{
	if (threads <= 1)
		return;
	pthread_once(&pool.once, pool_once);
	pthread_mutex_lock(&pool.mu);
	pool.wanted += threads - 1; /* as if work wanted them: grow makes them */
	(void)grow();
	pool.wanted -= threads - 1;
	pthread_mutex_unlock(&pool.mu);
}

/* ---- the parallel-for ------------------------------------------------------- */

struct loop {
	struct proto_pool__work w;
	uint64_t n;
	proto_pool_fn fn;
	void *arg;
	_Atomic uint64_t next;
	_Atomic unsigned slots; /* slots handed to threads that joined */
	atomic_bool stop;
};

static void loop_items(struct loop *l, unsigned slot)
{
	while (!atomic_load(&l->stop)) {
		uint64_t i = atomic_fetch_add(&l->next, 1);
		if (i >= l->n)
			break;
		if (l->fn(l->arg, slot, i) != 0)
			atomic_store(&l->stop, true);
	}
}

static void loop_run(struct proto_pool__work *w)
{
	struct loop *l = (struct loop *)((char *)w - offsetof(struct loop, w));

	loop_items(l, atomic_fetch_add(&l->slots, 1) + 1);
}

void proto_pool_for(uint64_t n, unsigned threads, proto_pool_fn fn, void *arg)
{
	struct loop l = {.w.run = loop_run, .n = n, .fn = fn, .arg = arg};

	if (threads > n)
		threads = (unsigned)n;
	if (threads > 1)
		(void)list(&l.w, threads - 1);
	loop_items(&l, 0);
	if (threads > 1)
		finish(&l.w, true);
}

/* ---- tasks ------------------------------------------------------------------- */

static void task_run(struct proto_pool__work *w)
{
	struct proto_pool_task *t = (struct proto_pool_task *)((char *)w -
							      offsetof(struct proto_pool_task, w));

	t->fn(t->arg);
}

int proto_pool_start(struct proto_pool_task *t, void (*fn)(void *arg), void *arg)
{
	t->w.run = task_run;
	t->fn = fn;
	t->arg = arg;
	t->started = list(&t->w, 1); /* false: unlisted, never run */
	return t->started ? 0 : -EAGAIN;
}

void proto_pool_join(struct proto_pool_task *t)
{
	if (!t->started)
		return;
	finish(&t->w, false);
	t->started = false;
}
