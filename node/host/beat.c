/* Heartbeats from their own thread (see beat.h). */
#include "node/host/beat.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "proto/proto.h"

#define POLL_MS 50 /* the thread looks at its clock and stop flag this often */

struct fed {
	char id[TRK_ID_MAX];
	char session[2 * TRK_SESSION_BYTES + 1]; /* "" none */
	struct trk_pin_count pins[TRK_PIN_VERSIONS_MAX];
	size_t npins;
};

struct node_beat {
	/* The loop's side. */
	struct event *gone_ev;
	int efd;
	node_beat_gone_cb gone;
	void *arg;
	/* The thread's side: its base, client and timer. */
	struct event_base *tbase;
	struct trk_client *trk;
	struct event *tick;
	pthread_t th;
	bool started, in_flight;
	uint64_t next_ms, every_ms;
	/* Shared, under mu. */
	pthread_mutex_t mu;
	bool stop;
	struct fed fed[TRK_HOST_HEARTBEAT_MAX];
	size_t nfed;
	uint64_t fed_ms, sent;
	char lost[TRK_HOST_HEARTBEAT_MAX][TRK_ID_MAX]; /* gone, for the loop */
	size_t nlost;
};

/* ---- the thread ------------------------------------------------------------------ */

static void on_answer(const struct trk_answer *a, void *arg)
{
	struct node_beat *b = arg;
	json_t *id;
	size_t k;
	bool any = false;

	b->in_flight = false;
	pthread_mutex_lock(&b->mu);
	b->sent++;
	if (a->status == 200) {
		uint64_t lease = (uint64_t)json_integer_value(json_object_get(a->json, "lease_ms"));
		if (lease > 0)
			b->every_ms = PROTO_MAX(lease / 3, 100);
		json_array_foreach(json_object_get(a->json, "gone"), k, id) {
			if (!json_is_string(id) || strlen(json_string_value(id)) >= TRK_ID_MAX ||
			    b->nlost == TRK_HOST_HEARTBEAT_MAX)
				continue;
			snprintf(b->lost[b->nlost++], TRK_ID_MAX, "%s", json_string_value(id));
			any = true;
		}
	} else {
		LOG_DEBUG("heartbeat: %d %s", a->status, a->error);
	}
	pthread_mutex_unlock(&b->mu);
	if (any) {
		uint64_t one = 1;
		if (write(b->efd, &one, sizeof(one)) != sizeof(one))
			abort(); /* an eventfd write fails only on overflow: cannot happen */
	}
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct node_beat *b = arg;
	struct trk_hb_node e[TRK_HOST_HEARTBEAT_MAX];
	struct fed f[TRK_HOST_HEARTBEAT_MAX];
	uint64_t now = proto_now_ns() / 1000000, stall = proto_param(PROTO_PARAM_HEARTBEAT_STALL_MS);
	size_t n = 0;

	pthread_mutex_lock(&b->mu);
	if (b->stop) {
		pthread_mutex_unlock(&b->mu);
		event_base_loopbreak(b->tbase);
		return;
	}
	if (!b->in_flight && now >= b->next_ms && b->nfed > 0 && now - b->fed_ms < stall) {
		n = b->nfed;
		memcpy(f, b->fed, n * sizeof(*f));
	}
	pthread_mutex_unlock(&b->mu);
	if (n == 0)
		return;
	for (size_t i = 0; i < n; i++) {
		if (f[i].session[0] != 0)
			trk_client_keep_session(b->trk, f[i].id, f[i].session);
		e[i].id = f[i].id;
		e[i].npins = f[i].npins;
		memcpy(e[i].pins, f[i].pins, f[i].npins * sizeof(*f[i].pins));
	}
	b->next_ms = now + b->every_ms;
	if (trk_client_heartbeat_host(b->trk, e, n, on_answer, b) == 0)
		b->in_flight = true;
}

static void *beat_main(void *arg)
{
	struct node_beat *b = arg;

	event_base_dispatch(b->tbase);
	return NULL;
}

/* ---- the loop's side --------------------------------------------------------------- */

static void on_gone(evutil_socket_t fd, short what, void *arg)
{
	struct node_beat *b = arg;
	char lost[TRK_HOST_HEARTBEAT_MAX][TRK_ID_MAX];
	uint64_t v;
	size_t n;

	if (read(b->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		LOG_DEBUG("heartbeat: eventfd: %s", strerror(errno));
	pthread_mutex_lock(&b->mu);
	n = b->nlost;
	memcpy(lost, b->lost, n * sizeof(lost[0]));
	b->nlost = 0;
	pthread_mutex_unlock(&b->mu);
	if (n > 0)
		b->gone(b->arg, (const char(*)[TRK_ID_MAX])lost, n);
}

int node_beat_new(struct event_base *base, const char *url, const uint8_t *cluster_key,
		  const char *tls_ca, node_beat_gone_cb gone, void *arg, struct node_beat **out,
		  struct proto_err *err)
{
	struct node_beat *b = calloc(1, sizeof(*b));
	struct timeval poll = {0, POLL_MS * 1000};
	int rc;

	*out = NULL;
	if (b == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	pthread_mutex_init(&b->mu, NULL);
	b->gone = gone;
	b->arg = arg;
	b->every_ms = PROTO_MAX(proto_param(PROTO_PARAM_LEASE_MS) / 3, 100);
	b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (b->efd < 0) {
		rc = proto_errf(err, errno, "heartbeat: eventfd: %s", strerror(errno));
		goto fail;
	}
	if ((b->gone_ev = event_new(base, b->efd, EV_READ | EV_PERSIST, on_gone, b)) == NULL ||
	    event_add(b->gone_ev, NULL) != 0 || (b->tbase = event_base_new()) == NULL ||
	    (b->tick = event_new(b->tbase, -1, EV_PERSIST, on_tick, b)) == NULL ||
	    event_add(b->tick, &poll) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = trk_client_new(b->tbase, url, cluster_key, &b->trk, err)) != 0 ||
	    (tls_ca != NULL && (rc = trk_client_set_tls_ca(b->trk, tls_ca, err)) != 0))
		goto fail;
	if ((rc = pthread_create(&b->th, NULL, beat_main, b)) != 0) {
		rc = proto_errf(err, rc, "heartbeat: cannot start its thread: %s", strerror(rc));
		goto fail;
	}
	b->started = true;
	*out = b;
	return 0;
fail:
	node_beat_free(b);
	return -abs(rc);
}

void node_beat_feed(struct node_beat *b, const struct trk_hb_node *e, size_t n,
		    const struct trk_client *trk)
{
	n = PROTO_MIN(n, (size_t)TRK_HOST_HEARTBEAT_MAX);
	pthread_mutex_lock(&b->mu);
	for (size_t i = 0; i < n; i++) {
		struct fed *f = &b->fed[i];
		const char *ses = trk_client_session(trk, e[i].id);
		snprintf(f->id, sizeof(f->id), "%s", e[i].id);
		snprintf(f->session, sizeof(f->session), "%s", ses != NULL ? ses : "");
		f->npins = PROTO_MIN(e[i].npins, (size_t)TRK_PIN_VERSIONS_MAX);
		memcpy(f->pins, e[i].pins, f->npins * sizeof(*f->pins));
	}
	b->nfed = n;
	b->fed_ms = proto_now_ns() / 1000000;
	pthread_mutex_unlock(&b->mu);
}

uint64_t node_beat_sent(struct node_beat *b)
{
	pthread_mutex_lock(&b->mu);
	uint64_t n = b->sent;
	pthread_mutex_unlock(&b->mu);
	return n;
}

void node_beat_free(struct node_beat *b)
{
	if (b == NULL)
		return;
	if (b->started) {
		pthread_mutex_lock(&b->mu);
		b->stop = true;
		pthread_mutex_unlock(&b->mu);
		pthread_join(b->th, NULL); /* its tick sees stop within POLL_MS */
	}
	trk_client_free(b->trk);
	if (b->tick != NULL)
		event_free(b->tick);
	if (b->tbase != NULL)
		event_base_free(b->tbase);
	if (b->gone_ev != NULL)
		event_free(b->gone_ev);
	if (b->efd >= 0)
		close(b->efd);
	pthread_mutex_destroy(&b->mu);
	free(b);
}
