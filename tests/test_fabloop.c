/* The fabric loop (node/base/fabloop.c) on tcp;ofi_rxm loopback: its fallback
 * timer slows down while nothing needs it, yet the wait fd still drives
 * what peers ask of it and what it asked of them. */
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "fabric/fab.h"
#include "tests/fabtest.h"
#include "node/base/fabloop.h"
#include "proto/util.h"

#define PROV "tcp;ofi_rxm"
#define LEN (4u << 20)
#define PERIOD_US 1000u
#define BOUND_MS 60000u /* every wait below ends as soon as its condition holds */

struct side {
	struct fab_ctx *ctx;
	uint8_t *buf;
	struct fab_mr *mr;
	fi_addr_t peer;
};

struct fx {
	struct event_base *base;
	struct side loop, other; /* loop: driven by the fabric loop; other: polled here */
	struct node_fabloop *fl;
};

static void side_open(struct side *s, unsigned access, uint8_t seed)
{
	assert_int_equal(fab_open(PROV, "127.0.0.1", NULL, &s->ctx, NULL), 0);
	s->buf = malloc(LEN);
	assert_non_null(s->buf);
	for (size_t i = 0; i < LEN; i++)
		s->buf[i] = (uint8_t)(i * 31u + seed);
	assert_int_equal(fab_mr_reg(s->ctx, s->buf, LEN, access, &s->mr), 0);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	uint8_t name[FAB_ADDR_MAX];
	size_t len;

	assert_non_null(f);
	f->base = event_base_new();
	assert_non_null(f->base);
	side_open(&f->loop, FAB_MR_REMOTE_READ | FAB_MR_READ, 1);
	side_open(&f->other, FAB_MR_REMOTE_READ | FAB_MR_READ, 2);
	assert_int_equal(fab_getname(f->other.ctx, name, sizeof(name), &len), 0);
	assert_int_equal(fab_av_insert(f->loop.ctx, name, len, &f->loop.peer), 0);
	assert_int_equal(fab_getname(f->loop.ctx, name, sizeof(name), &len), 0);
	assert_int_equal(fab_av_insert(f->other.ctx, name, len, &f->other.peer), 0);
	if (fab_wait_fd(f->loop.ctx) < 0)
		skip(); /* the timer never slows down without a wait fd */
	f->fl = node_fabloop_new(f->base, f->loop.ctx, PERIOD_US);
	assert_non_null(f->fl);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	struct side *sides[] = {&f->loop, &f->other};

	node_fabloop_free(f->fl);
	for (size_t i = 0; i < 2; i++) {
		fab_mr_close(sides[i]->mr);
		fab_close(sides[i]->ctx);
		free(sides[i]->buf);
	}
	event_base_free(f->base);
	free(f);
	return 0;
}

static unsigned period(const struct fx *f)
{
	struct node_fabloop_counts c;

	node_fabloop_counts(f->fl, &c);
	return c.period_us;
}

/* Runs the loop (blocking until its next event) until its timer has
 * doubled twice: it found nothing to do for a while. Nothing else is
 * polled meanwhile. */
static void run_until_slow(struct fx *f)
{
	uint64_t end = proto_now_ns() + (uint64_t)BOUND_MS * 1000000u;

	while (period(f) < 4 * PERIOD_US) {
		assert_true(event_base_loop(f->base, EVLOOP_ONCE) >= 0);
		assert_true(proto_now_ns() < end);
	}
}

/* Runs the loop, and `other` where there is one (then neither blocks),
 * until r completes. */
static void run_until_done(struct fx *f, const struct tu_fab_req *r)
{
	uint64_t end = proto_now_ns() + (uint64_t)BOUND_MS * 1000000u;

	while (!r->done) {
		assert_true(event_base_loop(f->base, f->other.ctx ? EVLOOP_NONBLOCK : EVLOOP_ONCE) >= 0);
		assert_true(f->other.ctx == NULL || fab_poll(f->other.ctx, 0) >= 0);
		assert_true(proto_now_ns() < end);
	}
}

/* A process whose loop slowed down while idle serves a peer's read, and
 * the request woke it through the fd, not through the slow timer. */
static void test_idle_loop_answers_reads(void **state)
{
	struct fx *f = *state;
	struct fab_rkey rk;
	struct node_fabloop_counts before, after;
	struct tu_fab_req r = {0};

	run_until_slow(f);
	node_fabloop_counts(f->fl, &before);
	fab_mr_rkey(f->loop.mr, &rk);
	assert_int_equal(fab_read(f->other.ctx, &r.op, f->other.mr, 0, LEN, f->other.peer, &rk, 0,
				  tu_fab_req_cb),
			 0);
	run_until_done(f, &r);
	assert_int_equal(r.status, 0);
	assert_memory_equal(f->other.buf, f->loop.buf, LEN);
	node_fabloop_counts(f->fl, &after);
	assert_true(after.fd_polls > before.fd_polls);
}

/* A peer in a child process: serves LEN bytes until the parent closes
 * *ctl; stopped (SIGSTOP) it answers nothing, as a peer on a saturated or
 * stalled host. Its address and key come back through *info. */
struct child {
	pid_t pid;
	int ctl; /* closing it ends the child */
	uint8_t name[FAB_ADDR_MAX];
	size_t namelen;
	struct fab_rkey rk;
};

static pid_t child_pid; /* a child left behind by a failed case */

/* Ends a child that a failed case left stopped. */
static int kill_child(void **state)
{
	(void)state;
	if (child_pid > 0) {
		kill(child_pid, SIGKILL);
		waitpid(child_pid, NULL, 0);
		child_pid = 0;
	}
	return 0;
}

static void child_main(int info_fd, int ctl_fd)
{
	struct side s;
	struct pollfd p = {.fd = ctl_fd, .events = POLLIN};

	if (fab_open(PROV, "127.0.0.1", NULL, &s.ctx, NULL) != 0 || (s.buf = malloc(LEN)) == NULL)
		_exit(2);
	for (size_t i = 0; i < LEN; i++)
		s.buf[i] = (uint8_t)(i * 7u + 3);
	struct fab_rkey rk;
	uint8_t name[FAB_ADDR_MAX];
	size_t len;
	if (fab_mr_reg(s.ctx, s.buf, LEN, FAB_MR_REMOTE_READ, &s.mr) != 0 ||
	    fab_getname(s.ctx, name, sizeof(name), &len) != 0)
		_exit(2);
	fab_mr_rkey(s.mr, &rk);
	if (write(info_fd, &len, sizeof(len)) != sizeof(len) || write(info_fd, name, len) != (ssize_t)len ||
	    write(info_fd, &rk, sizeof(rk)) != sizeof(rk))
		_exit(2);
	while (poll(&p, 1, 1) == 0)
		fab_poll(s.ctx, 0);
	_exit(0);
}

static void child_start(struct child *c)
{
	int info[2], ctl[2];

	assert_int_equal(pipe(info), 0);
	assert_int_equal(pipe(ctl), 0);
	c->pid = fork();
	assert_true(c->pid >= 0);
	if (c->pid == 0) {
		close(info[0]);
		close(ctl[1]);
		child_main(info[1], ctl[0]);
	}
	close(info[1]);
	close(ctl[0]);
	c->ctl = ctl[1];
	assert_int_equal(read(info[0], &c->namelen, sizeof(c->namelen)), sizeof(c->namelen));
	assert_true(c->namelen <= sizeof(c->name));
	assert_int_equal(read(info[0], c->name, c->namelen), (ssize_t)c->namelen);
	assert_int_equal(read(info[0], &c->rk, sizeof(c->rk)), sizeof(c->rk));
	close(info[0]);
}

/* A read of ours that waits on a silent peer does not keep the timer
 * fast (the fd will say when its bytes come), and completes once the
 * peer answers. The peer is forked before any fabric opens here. */
static void test_read_in_flight_lets_timer_slow(void **state)
{
	struct child c;
	struct fx f = {0};
	struct tu_fab_req r = {0};
	fi_addr_t peer;
	int status;

	(void)state;
	child_start(&c);
	child_pid = c.pid;
	f.base = event_base_new();
	assert_non_null(f.base);
	side_open(&f.loop, FAB_MR_READ, 1);
	assert_int_equal(fab_av_insert(f.loop.ctx, c.name, c.namelen, &peer), 0);
	f.fl = node_fabloop_new(f.base, f.loop.ctx, PERIOD_US);
	assert_non_null(f.fl);

	/* Connected first (a stopped peer's connection would fail), then
	 * stopped: our read's request sits in its socket, unanswered. */
	assert_int_equal(fab_read(f.loop.ctx, &r.op, f.loop.mr, 0, 4096, peer, &c.rk, 0, tu_fab_req_cb), 0);
	node_fabloop_kick(f.fl);
	run_until_done(&f, &r);
	assert_int_equal(r.status, 0);
	assert_int_equal(kill(c.pid, SIGSTOP), 0);
	r = (struct tu_fab_req){0};
	assert_int_equal(fab_read(f.loop.ctx, &r.op, f.loop.mr, 0, LEN, peer, &c.rk, 0, tu_fab_req_cb), 0);
	node_fabloop_kick(f.fl);
	run_until_slow(&f);
	if (r.done)
		fail_msg("the read of a stopped peer ended: %d", r.status);
	assert_false(fab_quiet(f.loop.ctx));

	assert_int_equal(kill(c.pid, SIGCONT), 0);
	run_until_done(&f, &r);
	assert_int_equal(r.status, 0);
	for (size_t i = 0; i < LEN; i++)
		if (f.loop.buf[i] != (uint8_t)(i * 7u + 3))
			fail_msg("byte %zu differs", i);
	assert_int_equal(period(&f), PERIOD_US); /* the completion brought it back */

	close(c.ctl);
	assert_int_equal(waitpid(c.pid, &status, 0), c.pid);
	child_pid = 0;
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	node_fabloop_free(f.fl);
	fab_mr_close(f.loop.mr);
	fab_close(f.loop.ctx);
	free(f.loop.buf);
	event_base_free(f.base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		/* First: it forks, before this process opens any fabric. */
		cmocka_unit_test_teardown(test_read_in_flight_lets_timer_slow, kill_child),
		cmocka_unit_test_setup_teardown(test_idle_loop_answers_reads, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
