/* A version slot rebuilt from its parent on a worker thread (see rebuild.h). */
#include "node/rebuild/rebuild.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define COPY_BLOCK (8u << 20) /* the copy checks for a stop between blocks */

struct node_rebuild {
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool stop;       /* node_rebuild_free: also read between copy blocks */
	bool have_apply; /* node_rebuild_apply was called */
	uint64_t fed;    /* node_rebuild_feed calls */
	node_rebuild_fn fn;
	void *fn_arg;
	node_rebuild_fn catchup; /* NULL: the dense copy only */
	void *catchup_arg;
	node_rebuild_done done;
	void *arg;
	uint64_t asked_ns; /* when the apply was handed over */
	uint8_t *dst;
	const uint8_t *src;
	int dst_fd, src_fd;
	size_t len;
	bool fresh; /* dst's pages were never written through its mapping */
	int efd;
	struct event *ev;
	/* The worker's result, read by the loop after the eventfd fires. */
	int rc;
	struct proto_err err;
	struct node_rebuild_times t;
};

static uint64_t ms_between(uint64_t from_ns, uint64_t to_ns)
{
	return to_ns > from_ns ? (to_ns - from_ns) / 1000000 : 0;
}

/* The process's CPU time (us) and minor faults so far. */
static void usage_now(uint64_t *cpu_us, uint64_t *faults)
{
	struct rusage ru;

	*cpu_us = *faults = 0;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return;
	*cpu_us = (uint64_t)ru.ru_utime.tv_sec * 1000000 + (uint64_t)ru.ru_utime.tv_usec +
		  (uint64_t)ru.ru_stime.tv_sec * 1000000 + (uint64_t)ru.ru_stime.tv_usec;
	*faults = (uint64_t)ru.ru_minflt;
}

/* Copies src to dst whole: true, or false when stopped. */
static bool dense_copy(struct node_rebuild *rb)
{
	/* Into a fresh slot the kernel copies page cache to page cache several
	 * times faster than a memcpy, which would take a fault (and in a VM a
	 * trap) for every page of dst. Into pages touched before (the warm
	 * slot, a retired one), a memcpy is faster: measured on a 2-core VM,
	 * 0.5-1.1 us a page against 3.6-4.1 for copy_file_range. */
	bool by_kernel = rb->fresh && rb->src_fd >= 0 && rb->dst_fd >= 0;

	rb->t.dense = true;
	for (size_t off = 0; off < rb->len;) {
		if (!by_kernel && off == 0 && rb->fresh) /* a blank slot: batched, not a fault a page */
			(void)madvise(rb->dst, rb->len, MADV_POPULATE_WRITE);
		if (__atomic_load_n(&rb->stop, __ATOMIC_RELAXED))
			return false;
		size_t n = rb->len - off < COPY_BLOCK ? rb->len - off : COPY_BLOCK;
		if (by_kernel) {
			loff_t in = (loff_t)off, to = (loff_t)off;
			ssize_t got = copy_file_range(rb->src_fd, &in, rb->dst_fd, &to, n, 0);
			if (got > 0) {
				off += (size_t)got;
				continue;
			}
			by_kernel = false; /* not supported here: memcpy the rest */
		}
		memcpy(rb->dst + off, rb->src + off, n);
		off += n;
	}
	/* After a kernel copy, the first write through our mapping to each
	 * page of a fresh slot still costs a fault, or in a VM a trap to the
	 * host even when the page is mapped (about 10 us a page here: 0.33 s
	 * of CPU per 128 MiB): pay it now, between versions or while the
	 * fetch runs, rather than in the apply. A reused slot's pages were
	 * written through its mapping before: nothing to do. */
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	for (size_t off = 0; by_kernel && rb->fresh && off < rb->len; off += page) {
		if ((off & (COPY_BLOCK - 1)) == 0 && __atomic_load_n(&rb->stop, __ATOMIC_RELAXED))
			return false;
		volatile uint8_t *b = rb->dst + off;
		*b = *b;
	}
	return true;
}

static void *rebuild_thread(void *arg)
{
	struct node_rebuild *rb = arg;
	uint64_t t0 = proto_now_ns();
	struct proto_err cerr = {{0}};

	if (rb->catchup != NULL && rb->catchup(rb->catchup_arg, &cerr) != 0)
		snprintf(rb->t.fallback, sizeof(rb->t.fallback), "%s", cerr.msg);
	rb->t.catchup_ms = ms_between(t0, proto_now_ns());
	if ((rb->catchup == NULL || rb->t.fallback[0] != 0) && !dense_copy(rb))
		return NULL;
	uint64_t copied = proto_now_ns();
	rb->t.copy_ms = ms_between(t0, copied);

	pthread_mutex_lock(&rb->mu);
	while (!rb->have_apply && !rb->stop)
		pthread_cond_wait(&rb->cv, &rb->mu);
	bool stop = rb->stop;
	pthread_mutex_unlock(&rb->mu);
	if (stop)
		return NULL;
	rb->t.wait_ms = ms_between(rb->asked_ns, copied);
	uint64_t t1 = proto_now_ns(), cpu0, flt0, cpu1, flt1;
	usage_now(&cpu0, &flt0);
	rb->rc = rb->fn(rb->fn_arg, &rb->err);
	if (rb->rc != 0 && !rb->t.dense) {
		/* The caught-up slot is not the parent (the apply's parent
		 * checksums say so): the parent whole, then the apply again. */
		snprintf(rb->t.fallback, sizeof(rb->t.fallback), "%s", rb->err.msg);
		uint64_t t2 = proto_now_ns();
		if (!dense_copy(rb))
			return NULL;
		rb->t.copy_ms += ms_between(t2, proto_now_ns());
		memset(&rb->err, 0, sizeof(rb->err));
		rb->rc = rb->fn(rb->fn_arg, &rb->err);
	}
	rb->t.apply_ms = ms_between(t1, proto_now_ns());
	usage_now(&cpu1, &flt1);
	rb->t.apply_cpu_ms = (cpu1 - cpu0) / 1000;
	rb->t.apply_faults = flt1 - flt0;
	uint64_t one = 1;
	if (write(rb->efd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		abort(); /* an eventfd write fails only on overflow: cannot happen */
	return NULL;
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	struct node_rebuild *rb = arg;
	uint64_t n;

	(void)what;
	if (read(fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
		return;
	/* done may free rb (the fetch it belongs to): nothing after it. */
	rb->done(rb->rc, &rb->err, &rb->t, rb->arg);
}

static int rebuild_start(struct event_base *base, uint8_t *dst, int dst_fd, bool fresh,
			 const uint8_t *src, int src_fd, size_t len, node_rebuild_fn catchup,
			 void *catchup_arg, struct node_rebuild **out, struct proto_err *err);

int node_rebuild_start(struct event_base *base, uint8_t *dst, int dst_fd, bool dst_fresh,
		       const uint8_t *src, int src_fd, size_t len, struct node_rebuild **out,
		       struct proto_err *err)
{
	return rebuild_start(base, dst, dst_fd, dst_fresh, src, src_fd, len, NULL, NULL, out, err);
}

int node_rebuild_start_sparse(struct event_base *base, uint8_t *dst, int dst_fd,
			      const uint8_t *src, int src_fd, size_t len, node_rebuild_fn catchup,
			      void *catchup_arg, struct node_rebuild **out, struct proto_err *err)
{
	return rebuild_start(base, dst, dst_fd, false, src, src_fd, len, catchup, catchup_arg, out, err);
}

static int rebuild_start(struct event_base *base, uint8_t *dst, int dst_fd, bool fresh,
			 const uint8_t *src, int src_fd, size_t len, node_rebuild_fn catchup,
			 void *catchup_arg, struct node_rebuild **out, struct proto_err *err)
{
	struct node_rebuild *rb = calloc(1, sizeof(*rb));
	int rc;

	*out = NULL;
	if (rb == NULL)
		return proto_errf(err, ENOMEM, "rebuild: out of memory");
	pthread_mutex_init(&rb->mu, NULL);
	pthread_cond_init(&rb->cv, NULL);
	rb->dst = dst;
	rb->dst_fd = dst_fd;
	rb->fresh = fresh;
	rb->src = src;
	rb->src_fd = src_fd;
	rb->len = len;
	rb->catchup = catchup;
	rb->catchup_arg = catchup_arg;
	rb->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (rb->efd < 0) {
		rc = proto_errf(err, errno, "rebuild: eventfd: %s", strerror(errno));
		goto fail;
	}
	rb->ev = event_new(base, rb->efd, EV_READ, on_done, rb);
	if (rb->ev == NULL || event_add(rb->ev, NULL) != 0) {
		rc = proto_errf(err, ENOMEM, "rebuild: cannot watch its eventfd");
		goto fail;
	}
	if ((rc = pthread_create(&rb->th, NULL, rebuild_thread, rb)) != 0) {
		rc = proto_errf(err, rc, "rebuild: cannot start its thread: %s", strerror(rc));
		goto fail;
	}
	rb->started = true;
	*out = rb;
	return 0;
fail:
	node_rebuild_free(rb);
	return rc;
}

void node_rebuild_apply(struct node_rebuild *rb, node_rebuild_fn fn, void *fn_arg,
			node_rebuild_done done, void *arg)
{
	pthread_mutex_lock(&rb->mu);
	rb->fn = fn;
	rb->fn_arg = fn_arg;
	rb->done = done;
	rb->arg = arg;
	rb->asked_ns = proto_now_ns();
	rb->have_apply = true;
	pthread_cond_signal(&rb->cv);
	pthread_mutex_unlock(&rb->mu);
}

void node_rebuild_feed(struct node_rebuild *rb)
{
	pthread_mutex_lock(&rb->mu);
	rb->fed++;
	pthread_cond_broadcast(&rb->cv);
	pthread_mutex_unlock(&rb->mu);
}

uint64_t node_rebuild_fed(struct node_rebuild *rb)
{
	pthread_mutex_lock(&rb->mu);
	uint64_t n = rb->fed;
	pthread_mutex_unlock(&rb->mu);
	return n;
}

bool node_rebuild_wait_fed(struct node_rebuild *rb, uint64_t seen)
{
	pthread_mutex_lock(&rb->mu);
	while (rb->fed == seen && !rb->stop)
		pthread_cond_wait(&rb->cv, &rb->mu);
	bool stop = rb->stop;
	pthread_mutex_unlock(&rb->mu);
	return !stop;
}

void node_rebuild_free(struct node_rebuild *rb)
{
	if (rb == NULL)
		return;
	if (rb->started) {
		pthread_mutex_lock(&rb->mu);
		__atomic_store_n(&rb->stop, true, __ATOMIC_RELAXED);
		pthread_cond_broadcast(&rb->cv);
		pthread_mutex_unlock(&rb->mu);
		pthread_join(rb->th, NULL);
	}
	if (rb->ev != NULL)
		event_free(rb->ev);
	if (rb->efd >= 0)
		close(rb->efd);
	pthread_cond_destroy(&rb->cv);
	pthread_mutex_destroy(&rb->mu);
	free(rb);
}
