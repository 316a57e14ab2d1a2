/* The reaper: retired slots are freed on a worker thread, not on the node's loop. */
#include "node/serve/attach_reap.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "proto/params.h"
#include "proto/util.h"

struct reap_item {
	struct reap_item *next;
	struct node_slot *slot;
	uint64_t due_ns; /* not freed before (monotonic clock) */
};

struct node_reaper {
	struct node_store *store;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct reap_item *head, **tail;
	uint64_t grace_ns;
	size_t pending; /* handed over, not yet freed */
	bool stop;
};

static void *reaper_main(void *arg)
{
	struct node_reaper *r = arg;

	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (r->head == NULL && !r->stop)
			pthread_cond_wait(&r->cv, &r->mu);
		if (r->head == NULL)
			break;
		struct reap_item *it = r->head;
		uint64_t now = proto_now_ns();
		if (!r->stop && it->due_ns > now) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			uint64_t at = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec +
				      (it->due_ns - now);
			ts.tv_sec = (time_t)(at / 1000000000u);
			ts.tv_nsec = (long)(at % 1000000000u);
			pthread_cond_timedwait(&r->cv, &r->mu, &ts);
			continue;
		}
		r->head = it->next;
		if (r->head == NULL)
			r->tail = &r->head;
		pthread_mutex_unlock(&r->mu);
		node_slot_free(r->store, it->slot);
		free(it);
		pthread_mutex_lock(&r->mu);
		r->pending--;
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

int node_reaper_new(struct node_store *store, struct node_reaper **out)
{
	struct node_reaper *r = calloc(1, sizeof(*r));
	int rc;

	*out = NULL;
	if (r == NULL)
		return -ENOMEM;
	r->store = store;
	r->tail = &r->head;
	r->grace_ns = proto_param(PROTO_PARAM_ATTACH_FREE_GRACE_MS) * 1000000u;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	if ((rc = pthread_create(&r->th, NULL, reaper_main, r)) != 0) {
		pthread_cond_destroy(&r->cv);
		pthread_mutex_destroy(&r->mu);
		free(r);
		return -rc;
	}
	*out = r;
	return 0;
}

void node_reaper_free(struct node_reaper *r, struct node_store *store, struct node_slot *slot)
{
	struct reap_item *it;

	if (slot == NULL)
		return;
	if (r == NULL || store != r->store || (it = calloc(1, sizeof(*it))) == NULL) {
		node_slot_free(store, slot);
		return;
	}
	it->slot = slot;
	it->due_ns = proto_now_ns() + r->grace_ns;
	pthread_mutex_lock(&r->mu);
	*r->tail = it;
	r->tail = &it->next;
	r->pending++;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

size_t node_reaper_pending(struct node_reaper *r)
{
	size_t n;

	if (r == NULL)
		return 0;
	pthread_mutex_lock(&r->mu);
	n = r->pending;
	pthread_mutex_unlock(&r->mu);
	return n;
}

void node_reaper_stop(struct node_reaper *r)
{
	if (r == NULL)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = true;
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
	pthread_join(r->th, NULL);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	free(r);
}
