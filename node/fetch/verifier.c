/* Worker threads that hash and scatter fetched chunks (see verifier.h). */
#include "node/fetch/verifier.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proto/chunkhash.h"
#include "proto/log.h"
#include "proto/params.h"
#include "proto/util.h"

struct node_verifier {
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	struct node_vjob *todo_head, *todo_tail, *done_head, *done_tail;
	unsigned busy; /* workers inside a job */
	bool stop;
	pthread_t *threads;
	unsigned nthreads;
	int efd;
	struct event *ev;
	void (*done)(struct node_vjob *, void *);
	void *arg;
};

static void push(struct node_vjob **head, struct node_vjob **tail, struct node_vjob *j)
{
	j->next_ = NULL;
	if (*tail != NULL)
		(*tail)->next_ = j;
	else
		*head = j;
	*tail = j;
}

/* Writes all of b[0..n) at file offset at: 0, or a negative errno. */
static int pwrite_all(int fd, const uint8_t *b, size_t n, uint64_t at)
{
	while (n > 0) {
		ssize_t w = pwrite(fd, b, n, (off_t)at);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		b += w;
		n -= (size_t)w;
		at += (uint64_t)w;
	}
	return 0;
}

/* The job's scatter through dst_fd: 0, or a negative errno (then the
 * caller scatters through the mapping: the same bytes, wherever this
 * stopped). */
static int scatter_by_fd(const struct node_vjob *j)
{
	struct proto_span few[64], *sp = few;
	size_t n = proto_parcel_spans(j->plan, j->parcel, j->layout, j->off, j->len, few,
				      PROTO_ARRAY_LEN(few));
	int rc = 0;

	if (n > PROTO_ARRAY_LEN(few)) {
		sp = malloc(n * sizeof(*sp));
		if (sp == NULL)
			return -ENOMEM;
		n = proto_parcel_spans(j->plan, j->parcel, j->layout, j->off, j->len, sp, n);
	}
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = pwrite_all(j->dst_fd, j->buf + sp[i].src_off, sp[i].len, sp[i].dst_off);
	if (sp != few)
		free(sp);
	return rc;
}

static void *worker(void *arg)
{
	struct node_verifier *v = arg;
	uint8_t h[32];

	/* Named, so that per-thread CPU (/proc/PID/task, top -H, perf's comm)
	 * tells hashing from the loop: at N = 16 on 2 cores the workers took
	 * 0.43 s of a node's ~1.0 s in the transfer window, the loop thread
	 * 0.46-0.82 s. Best effort. */
	(void)pthread_setname_np(pthread_self(), NODE_VERIFIER_THREAD_NAME);
	pthread_mutex_lock(&v->mu);
	for (;;) {
		while (v->todo_head == NULL && !v->stop)
			pthread_cond_wait(&v->work, &v->mu);
		if (v->todo_head == NULL)
			break;
		struct node_vjob *j = v->todo_head;
		v->todo_head = j->next_;
		if (v->todo_head == NULL)
			v->todo_tail = NULL;
		v->busy++;
		pthread_mutex_unlock(&v->mu);

		proto_chunk_hash(h, j->buf, j->len);
		j->ok = sodium_memcmp(h, j->hash, sizeof(h)) == 0;
		if (j->ok) {
			if (j->parcel != NULL) {
				if (!j->by_fd || scatter_by_fd(j) != 0)
					proto_parcel_scatter(j->plan, j->parcel, j->layout, j->dst,
							     j->off, j->len, j->buf);
				if (j->placed != NULL)
					j->placed(j, j->placed_arg);
			} else
				memcpy(j->dst + j->off, j->buf, j->len);
			if (j->keep != NULL)
				memcpy(j->keep, j->buf, j->len);
		}

		pthread_mutex_lock(&v->mu);
		push(&v->done_head, &v->done_tail, j);
		v->busy--;
		if (v->busy == 0 && v->todo_head == NULL)
			pthread_cond_broadcast(&v->idle);
		uint64_t one = 1;
		if (write(v->efd, &one, sizeof(one)) != sizeof(one))
			LOG_WARN("verifier: cannot wake the loop");
	}
	pthread_mutex_unlock(&v->mu);
	return NULL;
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
	struct node_verifier *v = arg;
	uint64_t n;
	struct node_vjob *list;

	if (read(v->efd, &n, sizeof(n)) < 0)
		return;
	pthread_mutex_lock(&v->mu);
	list = v->done_head;
	v->done_head = v->done_tail = NULL;
	pthread_mutex_unlock(&v->mu);
	while (list != NULL) {
		struct node_vjob *j = list;
		list = j->next_;
		v->done(j, v->arg); /* may submit more */
	}
}

unsigned node_verifier_threads(void)
{
	uint64_t n = proto_param(PROTO_PARAM_VERIFY_THREADS);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);

	if (n == 0)
		return cores >= 2 ? 2 : 1;
	return (unsigned)PROTO_MIN(n, 64);
}

struct node_verifier *node_verifier_new(struct event_base *base, unsigned nthreads,
					void (*done)(struct node_vjob *, void *), void *arg)
{
	struct node_verifier *v = calloc(1, sizeof(*v));

	if (v == NULL)
		return NULL;
	pthread_mutex_init(&v->mu, NULL);
	pthread_cond_init(&v->work, NULL);
	pthread_cond_init(&v->idle, NULL);
	v->done = done;
	v->arg = arg;
	v->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	v->threads = calloc(nthreads ? nthreads : 1, sizeof(*v->threads));
	if (v->efd < 0 || v->threads == NULL)
		goto fail;
	v->ev = event_new(base, v->efd, EV_READ | EV_PERSIST, on_done, v);
	if (v->ev == NULL || event_add(v->ev, NULL) != 0)
		goto fail;
	for (; v->nthreads < (nthreads ? nthreads : 1); v->nthreads++)
		if (pthread_create(&v->threads[v->nthreads], NULL, worker, v) != 0)
			goto fail;
	return v;
fail:
	node_verifier_free(v);
	return NULL;
}

void node_verifier_submit(struct node_verifier *v, struct node_vjob *job)
{
	pthread_mutex_lock(&v->mu);
	push(&v->todo_head, &v->todo_tail, job);
	pthread_cond_signal(&v->work);
	pthread_mutex_unlock(&v->mu);
}

void node_verifier_drain(struct node_verifier *v)
{
	pthread_mutex_lock(&v->mu);
	while (v->busy > 0 || v->todo_head != NULL)
		pthread_cond_wait(&v->idle, &v->mu);
	pthread_mutex_unlock(&v->mu);
}

void node_verifier_free(struct node_verifier *v)
{
	if (v == NULL)
		return;
	pthread_mutex_lock(&v->mu);
	v->stop = true;
	pthread_cond_broadcast(&v->work);
	pthread_mutex_unlock(&v->mu);
	for (unsigned i = 0; i < v->nthreads; i++)
		pthread_join(v->threads[i], NULL);
	if (v->ev != NULL)
		event_free(v->ev);
	if (v->efd >= 0)
		close(v->efd);
	free(v->threads);
	pthread_cond_destroy(&v->idle);
	pthread_cond_destroy(&v->work);
	pthread_mutex_destroy(&v->mu);
	free(v);
}
