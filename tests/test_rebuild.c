/* node/rebuild/rebuild.c: a slot copied from its parent on a worker, then the apply
 * handed to it, its result back on the loop; an apply fed its input as it
 * arrives; stopped rebuilds call nothing;
 * a slot caught up sparsely is not copied, unless its catch-up fails or the
 * apply finds it is not the parent (then copied, and the apply run again). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sys/mman.h>
#include <unistd.h>

#include <event2/event.h>

#include "node/rebuild/rebuild.h"
#include "tests/testutil.h"

#define LEN ((size_t)(20u << 20) + 4096 + 123) /* several copy blocks, a ragged end */

struct mem {
	int fd;
	uint8_t *p;
};

static void mem_new(struct mem *m, uint8_t seed)
{
	m->fd = memfd_create("test-rebuild", MFD_CLOEXEC);
	assert_true(m->fd >= 0);
	assert_int_equal(ftruncate(m->fd, (off_t)LEN), 0);
	m->p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
	assert_true(m->p != MAP_FAILED);
	for (size_t i = 0; i < LEN; i++)
		m->p[i] = (uint8_t)(i * 131 + seed + (i >> 12));
}

static void mem_free(struct mem *m)
{
	munmap(m->p, LEN);
	close(m->fd);
}

struct run {
	struct event_base *base;
	struct mem src, dst;
	bool copied_before_apply; /* what the apply saw */
	int fail_with;            /* the apply's result */
	int done_rc;
	char done_msg[256];
	int dones;
	struct node_rebuild_times t;
};

static int apply(void *arg, struct proto_err *err)
{
	struct run *r = arg;

	r->copied_before_apply = memcmp(r->dst.p, r->src.p, LEN) == 0;
	if (r->fail_with != 0)
		return proto_errf(err, r->fail_with, "piece 3: checksum mismatch");
	r->dst.p[5] ^= 0xff; /* the delta's change */
	r->dst.p[LEN - 1] ^= 0x0f;
	return 0;
}

static void done(int rc, const struct proto_err *err, const struct node_rebuild_times *t, void *arg)
{
	struct run *r = arg;

	r->dones++;
	r->done_rc = rc;
	r->t = *t;
	snprintf(r->done_msg, sizeof(r->done_msg), "%s", rc != 0 ? err->msg : "");
	event_base_loopbreak(r->base);
}

/* Runs the loop until done ran, or a generous bound passed (then fails). */
static void wait_done(struct run *r)
{
	struct timeval bound = {120, 0};
	event_base_loopexit(r->base, &bound);
	event_base_dispatch(r->base);
	assert_int_equal(r->dones, 1);
}

static void run_once(bool by_kernel, int fail_with)
{
	struct run r = {.fail_with = fail_with};
	struct node_rebuild *rb;
	struct proto_err err;

	r.base = event_base_new();
	assert_non_null(r.base);
	mem_new(&r.src, 1);
	mem_new(&r.dst, 2);
	assert_int_equal(node_rebuild_start(r.base, r.dst.p, by_kernel ? r.dst.fd : -1, true, r.src.p,
					    by_kernel ? r.src.fd : -1, LEN, &rb, &err),
			 0);
	node_rebuild_apply(rb, apply, &r, done, &r);
	wait_done(&r);
	assert_true(r.copied_before_apply);
	assert_int_equal(r.done_rc, fail_with != 0 ? -fail_with : 0);
	if (fail_with != 0) {
		assert_non_null(strstr(r.done_msg, "checksum mismatch"));
	} else {
		assert_int_equal(r.dst.p[5], r.src.p[5] ^ 0xff);
		assert_int_equal(r.dst.p[LEN - 1], r.src.p[LEN - 1] ^ 0x0f);
		assert_memory_equal(r.dst.p + 6, r.src.p + 6, LEN - 7);
	}
	node_rebuild_free(rb);
	mem_free(&r.src);
	mem_free(&r.dst);
	event_base_free(r.base);
}

static void test_copy_then_apply_by_kernel(void **state)
{
	run_once(true, 0);
}

static void test_copy_then_apply_by_memcpy(void **state)
{
	run_once(false, 0);
}

static void test_apply_failure_reaches_the_loop(void **state)
{
	run_once(true, EBADMSG);
}

/* Freed while copying, or with its result not yet seen by the loop: done is
 * never called, and nothing is left running (ASan/LSan would say). */
static void test_free_stops_it(void **state)
{
	struct run r = {0};
	struct node_rebuild *rb;
	struct proto_err err;

	r.base = event_base_new();
	mem_new(&r.src, 1);
	mem_new(&r.dst, 2);
	assert_int_equal(node_rebuild_start(r.base, r.dst.p, -1, true, r.src.p, -1, LEN, &rb, &err),
			 0);
	node_rebuild_free(rb); /* mid-copy, or before the apply was asked */
	assert_int_equal(node_rebuild_start(r.base, r.dst.p, r.dst.fd, false, r.src.p, r.src.fd, LEN,
					    &rb, &err),
			 0);
	node_rebuild_apply(rb, apply, &r, done, &r);
	node_rebuild_free(rb); /* the apply may have finished: its result is dropped */
	struct timeval none = {0, 200000};
	event_base_loopexit(r.base, &none);
	event_base_dispatch(r.base);
	assert_int_equal(r.dones, 0);
	mem_free(&r.src);
	mem_free(&r.dst);
	event_base_free(r.base);
}

/* ---- an apply fed while its input arrives ----------------------------------- */

struct fed {
	struct node_rebuild *rb;
	uint8_t *dst;
	int ready[3]; /* set by the loop before each feed (atomic) */
	int applied;  /* parts the worker wrote */
};

/* Writes each part as it is handed over, waits for the others. */
static int apply_fed(void *arg, struct proto_err *err)
{
	struct fed *f = arg;
	bool done[3] = {false, false, false};

	while (f->applied < 3) {
		uint64_t seen = node_rebuild_fed(f->rb);
		bool took = false;
		for (int i = 0; i < 3; i++)
			if (!done[i] && __atomic_load_n(&f->ready[i], __ATOMIC_ACQUIRE)) {
				f->dst[i] = (uint8_t)(0xa0 + i);
				done[i] = took = true;
				f->applied++;
			}
		if (!took && !node_rebuild_wait_fed(f->rb, seen))
			return proto_errf(err, ECANCELED, "stopped");
	}
	return 0;
}

static void feed(struct fed *f, int i)
{
	__atomic_store_n(&f->ready[i], 1, __ATOMIC_RELEASE);
	node_rebuild_feed(f->rb);
}

/* Parts handed over one by one, out of order, the first before the copy
 * ended maybe: each is applied once, and done comes after the last. A
 * rebuild freed while its apply waits for input stops it at once. */
static void test_apply_fed_while_input_arrives(void **state)
{
	struct run r = {0};
	struct fed f = {0};
	struct proto_err err;

	r.base = event_base_new();
	mem_new(&r.src, 1);
	mem_new(&r.dst, 2);
	assert_int_equal(node_rebuild_start(r.base, r.dst.p, r.dst.fd, true, r.src.p, r.src.fd, LEN,
					    &f.rb, &err),
			 0);
	f.dst = r.dst.p;
	feed(&f, 2);
	node_rebuild_apply(f.rb, apply_fed, &f, done, &r);
	feed(&f, 0);
	struct timeval short_wait = {0, 50000};
	event_base_loopexit(r.base, &short_wait);
	event_base_dispatch(r.base);
	assert_int_equal(r.dones, 0); /* part 1 is not there yet */
	feed(&f, 1);
	wait_done(&r);
	assert_int_equal(r.done_rc, 0);
	assert_int_equal(f.applied, 3);
	assert_int_equal(r.dst.p[0], 0xa0);
	assert_int_equal(r.dst.p[1], 0xa1);
	assert_int_equal(r.dst.p[2], 0xa2);
	assert_memory_equal(r.dst.p + 3, r.src.p + 3, LEN - 3);
	node_rebuild_free(f.rb);

	/* Freed while the apply waits for parts that never come. */
	struct fed g = {0};
	r.dones = 0;
	assert_int_equal(node_rebuild_start(r.base, r.dst.p, -1, false, r.src.p, -1, LEN, &g.rb,
					    &err),
			 0);
	g.dst = r.dst.p;
	node_rebuild_apply(g.rb, apply_fed, &g, done, &r);
	feed(&g, 1);
	node_rebuild_free(g.rb); /* joins: the wait ends */
	event_base_loopexit(r.base, &short_wait);
	event_base_dispatch(r.base);
	assert_int_equal(r.dones, 0);
	mem_free(&r.src);
	mem_free(&r.dst);
	event_base_free(r.base);
}

/* ---- sparse catch-up ------------------------------------------------------ */

/* dst holds what src held before two changes (at 7 and LEN - 2); the
 * catch-up writes them (or fails, or forgets one: how says). */
struct sparse {
	struct run r;
	int how; /* 0 right, 1 fails, 2 forgets the second change */
	int applies;
};

static int catch_up(void *arg, struct proto_err *err)
{
	struct sparse *sp = arg;

	if (sp->how == 1)
		return proto_errf(err, EBADMSG, "catch-up: damaged delta");
	sp->r.dst.p[7] = sp->r.src.p[7];
	if (sp->how != 2)
		sp->r.dst.p[LEN - 2] = sp->r.src.p[LEN - 2];
	return 0;
}

/* Refuses a slot that is not the parent (as the parent checksums would). */
static int apply_checked(void *arg, struct proto_err *err)
{
	struct sparse *sp = arg;

	sp->applies++;
	if (memcmp(sp->r.dst.p, sp->r.src.p, LEN) != 0)
		return proto_errf(err, EBADMSG, "delta is for another parent");
	sp->r.dst.p[5] ^= 0xff;
	return 0;
}

static void run_sparse(int how)
{
	struct sparse sp = {.how = how};
	struct run *r = &sp.r;
	struct node_rebuild *rb;
	struct proto_err err;

	r->base = event_base_new();
	assert_non_null(r->base);
	mem_new(&r->src, 1);
	mem_new(&r->dst, 1);
	r->dst.p[7] ^= 0x11;
	r->dst.p[LEN - 2] ^= 0x22;
	assert_int_equal(node_rebuild_start_sparse(r->base, r->dst.p, r->dst.fd, r->src.p, r->src.fd,
						   LEN, catch_up, &sp, &rb, &err),
			 0);
	node_rebuild_apply(rb, apply_checked, &sp, done, r);
	wait_done(r);
	assert_int_equal(r->done_rc, 0);
	assert_int_equal(r->dst.p[5], r->src.p[5] ^ 0xff);
	assert_memory_equal(r->dst.p + 6, r->src.p + 6, LEN - 6);
	assert_int_equal(r->t.dense, how != 0);
	assert_int_equal(sp.applies, how == 2 ? 2 : 1);
	if (how == 0)
		assert_string_equal(r->t.fallback, "");
	else
		assert_non_null(strstr(r->t.fallback, how == 1 ? "damaged delta" : "another parent"));
	node_rebuild_free(rb);
	mem_free(&r->src);
	mem_free(&r->dst);
	event_base_free(r->base);
}

static void test_sparse_catch_up_no_copy(void **state)
{
	run_sparse(0);
}

static void test_sparse_catch_up_fails_copies(void **state)
{
	run_sparse(1);
}

static void test_sparse_wrong_parent_copies_and_applies_again(void **state)
{
	run_sparse(2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_then_apply_by_kernel),
		cmocka_unit_test(test_copy_then_apply_by_memcpy),
		cmocka_unit_test(test_apply_failure_reaches_the_loop),
		cmocka_unit_test(test_free_stops_it),
		cmocka_unit_test(test_apply_fed_while_input_arrives),
		cmocka_unit_test(test_sparse_catch_up_no_copy),
		cmocka_unit_test(test_sparse_catch_up_fails_copies),
		cmocka_unit_test(test_sparse_wrong_parent_copies_and_applies_again),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
