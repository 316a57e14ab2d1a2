/* Tests for the worker pool: every item once, slots apart, stops, tasks, nesting, fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/pool.h"

#define SLOTS 16

struct count {
	uint64_t n;
	_Atomic unsigned *seen;     /* per item: times run */
	_Atomic unsigned busy[SLOTS]; /* per slot: items running with it now */
	_Atomic unsigned clash;     /* a slot ran two items at once */
	_Atomic unsigned bad_slot;  /* a slot out of range */
	unsigned threads;
	uint64_t stop_at;           /* item that stops the loop (n: none) */
	_Atomic unsigned slots_used[SLOTS];
};

static void nap_us(long us)
{
	struct timespec ts = {0, us * 1000};
	nanosleep(&ts, NULL);
}

static int count_item(void *arg, unsigned slot, uint64_t i)
{
	struct count *c = arg;

	if (slot >= c->threads || slot >= SLOTS) {
		atomic_fetch_add(&c->bad_slot, 1);
		return 0;
	}
	if (atomic_fetch_add(&c->busy[slot], 1) != 0)
		atomic_fetch_add(&c->clash, 1);
	atomic_fetch_add(&c->slots_used[slot], 1);
	atomic_fetch_add(&c->seen[i], 1);
	if (i % 7 == 0)
		nap_us(50);
	atomic_fetch_sub(&c->busy[slot], 1);
	return i == c->stop_at;
}

static void count_init(struct count *c, uint64_t n, unsigned threads)
{
	memset(c, 0, sizeof(*c));
	c->n = n;
	c->threads = threads == 0 ? 1 : threads;
	c->stop_at = n;
	c->seen = calloc(n + 1, sizeof(*c->seen));
	assert_non_null(c->seen);
}

/* Every item runs exactly once, each with a slot of its own, whatever the
 * thread count (more threads than items included). */
static void test_every_item_once(void **state)
{
	static const unsigned threads[] = {0, 1, 2, 3, 8, 16};
	static const uint64_t ns[] = {0, 1, 2, 5, 1000};

	(void)state;
	for (size_t a = 0; a < sizeof(threads) / sizeof(threads[0]); a++)
		for (size_t b = 0; b < sizeof(ns) / sizeof(ns[0]); b++) {
			struct count c;
			count_init(&c, ns[b], threads[a]);
			proto_pool_for(c.n, threads[a], count_item, &c);
			for (uint64_t i = 0; i < c.n; i++)
				assert_int_equal(atomic_load(&c.seen[i]), 1);
			assert_int_equal(atomic_load(&c.clash), 0);
			assert_int_equal(atomic_load(&c.bad_slot), 0);
			free(c.seen);
		}
}

/* On one thread everything runs on the caller's, in order. */
struct order {
	uint64_t next;
	int bad;
};

static int in_order(void *arg, unsigned slot, uint64_t i)
{
	struct order *o = arg;

	o->bad |= slot != 0 || i != o->next;
	o->next++;
	return 0;
}

static void test_one_thread_in_order(void **state)
{
	struct order o = {0, 0};

	(void)state;
	proto_pool_for(500, 1, in_order, &o);
	assert_int_equal(o.next, 500);
	assert_int_equal(o.bad, 0);
}

/* A nonzero return hands out no more items: the ones before it ran, and
 * few after it (those already handed out). */
static void test_stop(void **state)
{
	struct count c;

	(void)state;
	count_init(&c, 100000, 4);
	c.stop_at = 10;
	proto_pool_for(c.n, 4, count_item, &c);
	assert_int_equal(atomic_load(&c.seen[10]), 1);
	uint64_t ran = 0;
	for (uint64_t i = 0; i < c.n; i++) {
		assert_true(atomic_load(&c.seen[i]) <= 1);
		ran += atomic_load(&c.seen[i]);
	}
	assert_true(ran < 1000);
	free(c.seen);
}

/* Items that wait for each other need that many threads at once: the
 * pool gives a loop its threads, never queues it behind other work. */
struct barrier {
	_Atomic unsigned arrived;
	unsigned want;
	_Atomic unsigned gave_up; /* waited 10 s and the others did not come */
};

static int meet(void *arg, unsigned slot, uint64_t i)
{
	struct barrier *b = arg;
	int k = 0;

	atomic_fetch_add(&b->arrived, 1);
	for (; k < 100000 && atomic_load(&b->arrived) < b->want; k++)
		nap_us(100);
	if (atomic_load(&b->arrived) < b->want)
		atomic_fetch_add(&b->gave_up, 1);
	return 0;
}

static void test_threads_at_once(void **state)
{
	struct barrier b = {0, 6, 0};

	(void)state;
	proto_pool_for(6, 6, meet, &b);
	assert_int_equal(atomic_load(&b.arrived), 6);
	assert_int_equal(atomic_load(&b.gave_up), 0);
}

/* Tasks run at once on threads of their own, and may run loops on the
 * pool themselves (as the publisher's rank workers run the encoder's). */
struct nested {
	struct count c;
	struct barrier *all; /* every task runs at the same time */
	_Atomic unsigned done;
};

static void nested_task(void *arg)
{
	struct nested *t = arg;

	meet(t->all, 0, 0);
	proto_pool_for(t->c.n, t->c.threads, count_item, &t->c);
	atomic_fetch_add(&t->done, 1);
}

static void test_tasks_nested(void **state)
{
	enum { NT = 4 };
	struct nested t[NT];
	struct proto_pool_task task[NT];
	struct barrier all = {0, NT, 0};

	(void)state;
	for (int k = 0; k < NT; k++) {
		count_init(&t[k].c, 300, 3);
		t[k].done = 0;
		t[k].all = &all;
	}
	for (int k = 0; k < NT; k++)
		assert_int_equal(proto_pool_start(&task[k], nested_task, &t[k]), 0);
	for (int k = 0; k < NT; k++) {
		proto_pool_join(&task[k]);
		proto_pool_join(&task[k]); /* twice is harmless */
		assert_int_equal(atomic_load(&t[k].done), 1);
		for (uint64_t i = 0; i < t[k].c.n; i++)
			assert_int_equal(atomic_load(&t[k].c.seen[i]), 1);
		assert_int_equal(atomic_load(&t[k].c.clash), 0);
		free(t[k].c.seen);
	}
	assert_int_equal(atomic_load(&all.arrived), NT);
	assert_int_equal(atomic_load(&all.gave_up), 0);
}

/* A task started again after its join runs again. */
static void bump(void *arg)
{
	atomic_fetch_add((_Atomic unsigned *)arg, 1);
}

static void test_task_again(void **state)
{
	struct proto_pool_task task;
	_Atomic unsigned n = 0;

	(void)state;
	for (int k = 0; k < 50; k++) {
		assert_int_equal(proto_pool_start(&task, bump, &n), 0);
		proto_pool_join(&task);
		assert_int_equal(atomic_load(&n), (unsigned)k + 1);
	}
	proto_pool_reserve(4);
	proto_pool_reserve(0);
}

/* The child of a fork has none of the parent's threads: the pool makes
 * them again there. */
static void test_fork(void **state)
{
	struct count c;

	(void)state;
	count_init(&c, 200, 4);
	proto_pool_for(c.n, 4, count_item, &c); /* threads made in the parent */
	free(c.seen);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct count d;
		int ok = 1;
		memset(&d, 0, sizeof(d));
		d.n = 200;
		d.threads = 4;
		d.stop_at = d.n;
		d.seen = calloc(d.n, sizeof(*d.seen));
		if (d.seen == NULL)
			_exit(2);
		proto_pool_for(d.n, 4, count_item, &d);
		for (uint64_t i = 0; i < d.n; i++)
			ok &= atomic_load(&d.seen[i]) == 1;
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_item_once),
		cmocka_unit_test(test_one_thread_in_order),
		cmocka_unit_test(test_stop),
		cmocka_unit_test(test_threads_at_once),
		cmocka_unit_test(test_tasks_nested),
		cmocka_unit_test(test_task_again),
		cmocka_unit_test(test_fork),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
