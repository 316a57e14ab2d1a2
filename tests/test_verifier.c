/* The chunk verifier (node/fetch/verifier.h): every job comes back once, on the
 * loop, with ok set by its hash; bad bytes are never placed; several
 * workers hash at once without holding up the loop; shutting down with
 * work queued finishes or drops it cleanly; a scatter through the slot's
 * file places what one through its mapping does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "node/fetch/verifier.h"
#include "proto/chunkhash.h"
#include "proto/proto.h"
#include "proto/synth.h"

#define NJOBS 64
#define JOB_LEN (64u << 10)

struct bench {
	struct event_base *base;
	struct node_verifier *v;
	struct node_vjob jobs[NJOBS];
	uint8_t *src, *dst, *keep;
	uint8_t hash[NJOBS][32];
	unsigned seen[NJOBS];
	unsigned order[NJOBS]; /* job indices in delivery order */
	unsigned ndone;
	bool loop_thread_ok;   /* every done callback ran on the loop's thread */
	pthread_t loop_thread;
};

static void on_done(struct node_vjob *job, void *arg)
{
	struct bench *b = arg;
	unsigned i = (unsigned)(job - b->jobs);

	assert_true(i < NJOBS);
	if (!pthread_equal(pthread_self(), b->loop_thread))
		b->loop_thread_ok = false;
	b->seen[i]++;
	b->order[b->ndone++] = i;
}

/* NJOBS jobs of random bytes; those named in bad (may be NULL) carry a
 * wrong hash. Nothing is submitted yet. */
static void bench_init(struct bench *b, unsigned nthreads, const bool *bad)
{
	memset(b, 0, sizeof(*b));
	assert_int_equal(sodium_init() >= 0, 1);
	b->base = event_base_new();
	assert_non_null(b->base);
	b->loop_thread = pthread_self();
	b->loop_thread_ok = true;
	b->src = malloc((size_t)NJOBS * JOB_LEN);
	b->dst = calloc(NJOBS, JOB_LEN);
	b->keep = calloc(NJOBS, JOB_LEN);
	assert_non_null(b->src);
	assert_non_null(b->dst);
	assert_non_null(b->keep);
	randombytes_buf(b->src, (size_t)NJOBS * JOB_LEN);
	for (unsigned i = 0; i < NJOBS; i++) {
		const uint8_t *buf = b->src + (size_t)i * JOB_LEN;
		proto_chunk_hash(b->hash[i], buf, JOB_LEN);
		if (bad != NULL && bad[i])
			b->hash[i][5] ^= 1;
		b->jobs[i] = (struct node_vjob){
			.buf = buf,
			.len = JOB_LEN,
			.hash = b->hash[i],
			.dst = b->dst, /* parcel NULL: copied to dst + off */
			.off = (uint64_t)i * JOB_LEN,
			.keep = b->keep + (size_t)i * JOB_LEN,
		};
	}
	b->v = node_verifier_new(b->base, nthreads, on_done, b);
	assert_non_null(b->v);
}

static void bench_fini(struct bench *b)
{
	node_verifier_free(b->v);
	event_base_free(b->base);
	free(b->src);
	free(b->dst);
	free(b->keep);
}

/* Runs the loop until want jobs came back (bounded: a lost job fails). */
static void run_until(struct bench *b, unsigned want)
{
	for (int i = 0; i < 600000 && b->ndone < want; i++) {
		struct timeval tick = {0, 100000};
		event_base_loopexit(b->base, &tick);
		event_base_dispatch(b->base);
	}
	assert_int_equal(b->ndone, want);
}

static void check_placed(const struct bench *b, const bool *bad)
{
	static const uint8_t zero[JOB_LEN];

	for (unsigned i = 0; i < NJOBS; i++) {
		const uint8_t *want = bad != NULL && bad[i] ? zero : b->src + (size_t)i * JOB_LEN;
		assert_int_equal(b->seen[i], 1);
		assert_int_equal(b->jobs[i].ok, !(bad != NULL && bad[i]));
		assert_memory_equal(b->dst + (size_t)i * JOB_LEN, want, JOB_LEN);
		assert_memory_equal(b->keep + (size_t)i * JOB_LEN, want, JOB_LEN);
	}
}

/* One worker: jobs come back in the order they went in. */
static void test_one_worker_keeps_order(void **state)
{
	struct bench *b = malloc(sizeof(*b));

	assert_non_null(b);
	bench_init(b, 1, NULL);
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	run_until(b, NJOBS);
	for (unsigned i = 0; i < NJOBS; i++)
		assert_int_equal(b->order[i], i);
	check_placed(b, NULL);
	assert_true(b->loop_thread_ok);
	bench_fini(b);
	free(b);
}

/* Four workers: whatever the order, each job comes back exactly once, on
 * the loop's thread, its bytes placed and kept. */
static void test_workers_each_job_once(void **state)
{
	struct bench *b = malloc(sizeof(*b));

	assert_non_null(b);
	bench_init(b, 4, NULL);
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	run_until(b, NJOBS);
	check_placed(b, NULL);
	assert_true(b->loop_thread_ok);
	bench_fini(b);
	free(b);
}

/* A wrong hash: ok is false and nothing of it is placed or kept, while the
 * good jobs around it are. */
static void test_bad_hash_never_placed(void **state)
{
	struct bench *b = malloc(sizeof(*b));
	bool bad[NJOBS] = {0};

	assert_non_null(b);
	for (unsigned i = 0; i < NJOBS; i += 3)
		bad[i] = true;
	bench_init(b, 3, bad);
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	run_until(b, NJOBS);
	check_placed(b, bad);
	bench_fini(b);
	free(b);
}

/* A done callback may submit again (the agent refills from it). */
static void on_done_resubmit(struct node_vjob *job, void *arg)
{
	struct bench *b = arg;
	unsigned i = (unsigned)(job - b->jobs);

	on_done(job, arg);
	if (i + 1 < NJOBS)
		node_verifier_submit(b->v, &b->jobs[i + 1]);
}

static void test_submit_from_done(void **state)
{
	struct bench *b = malloc(sizeof(*b));

	assert_non_null(b);
	bench_init(b, 2, NULL);
	node_verifier_free(b->v);
	b->v = node_verifier_new(b->base, 2, on_done_resubmit, b);
	assert_non_null(b->v);
	node_verifier_submit(b->v, &b->jobs[0]);
	run_until(b, NJOBS);
	for (unsigned i = 0; i < NJOBS; i++)
		assert_int_equal(b->order[i], i);
	check_placed(b, NULL);
	bench_fini(b);
	free(b);
}

/* While a worker is held inside a job, the loop keeps running and
 * delivering the other jobs; only once all of them came back does a timer
 * on the loop let the held worker go. A verifier that blocked the loop on
 * its workers would never get there (the held worker gives up after 30 s
 * and the test fails). */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool open, timed_out;
	unsigned entered;
	const struct bench *b;
};

static void placed_wait(struct node_vjob *job, void *arg)
{
	struct gate *g = arg;
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 30;
	pthread_mutex_lock(&g->mu);
	g->entered++;
	while (!g->open && !g->timed_out)
		if (pthread_cond_timedwait(&g->cv, &g->mu, &until) != 0)
			g->timed_out = true;
	pthread_mutex_unlock(&g->mu);
}

static void open_gate(evutil_socket_t fd, short what, void *arg)
{
	struct gate *g = arg;

	pthread_mutex_lock(&g->mu);
	if (g->entered > 0 && g->b->ndone == NJOBS - 1) {
		g->open = true;
		pthread_cond_broadcast(&g->cv);
	}
	pthread_mutex_unlock(&g->mu);
}

static void test_loop_runs_while_a_worker_is_held(void **state)
{
	static const struct proto_plan plan;     /* no pieces: scatter places nothing */
	static const struct proto_parcel parcel;
	static const struct proto_layout layout;
	struct bench *b = malloc(sizeof(*b));
	struct gate g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

	assert_non_null(b);
	bench_init(b, 2, NULL);
	g.b = b;
	/* placed runs only for scattered jobs: job 0 has a parcel. */
	b->jobs[0].plan = &plan;
	b->jobs[0].parcel = &parcel;
	b->jobs[0].layout = &layout;
	b->jobs[0].placed = placed_wait;
	b->jobs[0].placed_arg = &g;
	struct event *tick = event_new(b->base, -1, EV_PERSIST, open_gate, &g);
	assert_non_null(tick);
	event_add(tick, &(struct timeval){0, 10000});
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	run_until(b, NJOBS);
	event_free(tick);
	assert_false(g.timed_out);
	assert_true(g.open);
	assert_int_equal(b->order[NJOBS - 1], 0); /* the others came back first */
	for (unsigned i = 0; i < NJOBS; i++)
		assert_true(b->jobs[i].ok);
	/* Verified bytes are kept even when the scatter places none. */
	assert_memory_equal(b->keep, b->src, JOB_LEN);
	bench_fini(b);
	free(b);
}

/* Freed with jobs queued and the loop never run again: free waits for the
 * workers (ASan sees any touch of a job after it returns), and no done
 * callback runs afterwards. Drain first: every job was done by then. */
static void test_free_with_work_queued(void **state)
{
	struct bench *b = malloc(sizeof(*b));

	assert_non_null(b);
	bench_init(b, 2, NULL);
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	node_verifier_free(b->v);
	b->v = NULL;
	event_base_loop(b->base, EVLOOP_NONBLOCK);
	assert_int_equal(b->ndone, 0);
	for (unsigned i = 0; i < NJOBS; i++)
		b->jobs[i].ok = false;

	/* Drain: nothing touches a job any more, done still comes later. */
	b->v = node_verifier_new(b->base, 3, on_done, b);
	assert_non_null(b->v);
	for (unsigned i = 0; i < NJOBS; i++)
		node_verifier_submit(b->v, &b->jobs[i]);
	node_verifier_drain(b->v);
	for (unsigned i = 0; i < NJOBS; i++)
		assert_true(b->jobs[i].ok);
	run_until(b, NJOBS);
	check_placed(b, NULL);
	bench_fini(b);
	free(b);
}

struct fd_run {
	unsigned ndone, want;
};

static void fd_done(struct node_vjob *job, void *arg)
{
	struct fd_run *r = arg;

	(void)job;
	r->ndone++;
}

/* Jobs that scatter through the slot's memfd (by_fd) place what a scatter
 * through the mapping does, chunks that straddle runs and pieces
 * included: byte for byte the expected rank block, where one chunk with a
 * wrong hash left its bytes unwritten; a job whose file write fails
 * (a bad fd) is scattered through the mapping instead. */
static void test_scatter_by_fd(void **state)
{
	struct proto_model m;
	struct proto_layout src, dst;
	struct proto_plan plan;
	struct proto_err err;
	const uint64_t chunk = 10000; /* odd: chunks straddle runs */

	assert_int_equal(sodium_init() >= 0, 1);
	assert_int_equal(proto_synth_model(4u << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &src, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &dst, &err), 0);
	assert_int_equal(proto_plan_build(&m, &src, &dst, &plan, &err), 0);
	size_t n = dst.ranks[0].nbytes, njobs = 0;
	for (uint32_t i = 0; i < plan.nparcels; i++)
		if (plan.parcels[i].dst_rank == 0)
			njobs += (plan.parcels[i].bytes + chunk - 1) / chunk;
	int fd = memfd_create("test-verifier", MFD_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)n), 0);
	uint8_t *slot = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(slot != MAP_FAILED);
	uint8_t *want = calloc(1, n), *bufs = malloc(njobs * chunk);
	struct node_vjob *jobs = calloc(njobs, sizeof(*jobs));
	uint8_t(*hash)[32] = calloc(njobs, 32);
	assert_non_null(want);
	assert_non_null(bufs);
	assert_non_null(jobs);
	assert_non_null(hash);
	randombytes_buf(bufs, njobs * chunk);
	size_t k = 0, bad = njobs / 3, nofd = njobs / 2;
	for (uint32_t i = 0; i < plan.nparcels; i++) {
		const struct proto_parcel *pc = &plan.parcels[i];
		if (pc->dst_rank != 0)
			continue;
		for (uint64_t off = 0; off < pc->bytes; off += chunk, k++) {
			uint64_t len = PROTO_MIN(chunk, pc->bytes - off);
			const uint8_t *buf = bufs + k * chunk;
			proto_chunk_hash(hash[k], buf, len);
			if (k == bad)
				hash[k][3] ^= 1;
			else
				proto_parcel_scatter(&plan, pc, &dst, want, off, len, buf);
			jobs[k] = (struct node_vjob){.buf = buf, .len = len, .hash = hash[k],
						     .plan = &plan, .parcel = pc, .layout = &dst,
						     .dst = slot, .off = off, .by_fd = true,
						     .dst_fd = k == nofd ? -1 : fd};
		}
	}
	struct fd_run r = {0, (unsigned)njobs};
	struct event_base *base = event_base_new();
	assert_non_null(base);
	struct node_verifier *v = node_verifier_new(base, 2, fd_done, &r);
	assert_non_null(v);
	for (k = 0; k < njobs; k++)
		node_verifier_submit(v, &jobs[k]);
	for (int i = 0; i < 6000 && r.ndone < r.want; i++) {
		struct timeval tick = {0, 100000};
		event_base_loopexit(base, &tick);
		event_base_dispatch(base);
	}
	assert_int_equal(r.ndone, r.want);
	for (k = 0; k < njobs; k++)
		assert_int_equal(jobs[k].ok, k != bad);
	assert_memory_equal(slot, want, n);
	node_verifier_free(v);
	event_base_free(base);
	munmap(slot, n);
	close(fd);
	free(want);
	free(bufs);
	free(jobs);
	free(hash);
	proto_plan_fini(&plan);
	proto_layout_fini(&src);
	proto_layout_fini(&dst);
	proto_model_fini(&m);
}

static void test_thread_count(void **state)
{
	setenv("TESSERA_VERIFY_THREADS", "3", 1);
	assert_int_equal(node_verifier_threads(), 3);
	setenv("TESSERA_VERIFY_THREADS", "0", 1);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	assert_int_equal(node_verifier_threads(), cores >= 2 ? 2 : 1);
	unsetenv("TESSERA_VERIFY_THREADS");
	assert_int_equal(node_verifier_threads(), cores >= 2 ? 2 : 1);
}

/* Threads of this process named comm (/proc/self/task/N/comm). */
static unsigned threads_named(const char *comm)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	char path[300], name[32];
	unsigned n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue; /* the thread ended meanwhile */
		if (fgets(name, sizeof(name), f) != NULL) {
			name[strcspn(name, "\n")] = '\0';
			n += strcmp(name, comm) == 0;
		}
		fclose(f);
	}
	closedir(d);
	return n;
}

/* Each worker carries the verifier's name, so that per-thread CPU tells
 * hashing from the loop; none is left once the verifier is freed. */
static void test_workers_named(void **state)
{
	struct event_base *base = event_base_new();
	struct node_verifier *v;

	assert_non_null(base);
	assert_int_equal(threads_named(NODE_VERIFIER_THREAD_NAME), 0);
	v = node_verifier_new(base, 3, on_done, NULL);
	assert_non_null(v);
	/* pthread_setname_np runs first thing in each worker: drain waits for
	 * none of it, so wait (bounded) for the three names. */
	for (int i = 0; i < 5000 && threads_named(NODE_VERIFIER_THREAD_NAME) < 3; i++)
		usleep(1000);
	assert_int_equal(threads_named(NODE_VERIFIER_THREAD_NAME), 3);
	node_verifier_free(v);
	assert_int_equal(threads_named(NODE_VERIFIER_THREAD_NAME), 0);
	event_base_free(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_one_worker_keeps_order),
		cmocka_unit_test(test_workers_each_job_once),
		cmocka_unit_test(test_bad_hash_never_placed),
		cmocka_unit_test(test_submit_from_done),
		cmocka_unit_test(test_loop_runs_while_a_worker_is_held),
		cmocka_unit_test(test_free_with_work_queued),
		cmocka_unit_test(test_scatter_by_fd),
		cmocka_unit_test(test_thread_count),
		cmocka_unit_test(test_workers_named),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
