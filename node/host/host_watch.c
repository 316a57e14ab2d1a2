/* One version watch for every rank of a host. */
#include "node/host/host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "tracker/tracker.h"

/*
 * Every rank watches the versions (a long-poll, GET /versions?after=&
 * wait_ms=), and the tracker client gives each watch a connection of its
 * own: a host of ten ranks held ten connections and ten held requests at
 * the tracker, and every version was ten answers to it. The ranks of a
 * host ask the same question (their `seen` comes from the same answers),
 * so the host holds one watch and hands its answer to every rank waiting
 * on it. A rank that knows less than the host (it saw no version yet,
 * while the host's watch waits after a newer one) asks on its own: the
 * tracker answers such a watch at once.
 */

struct sub {
	trk_client_cb cb;
	void *arg;
};

struct node_host_watch {
	struct trk_client *trk;
	struct sub *subs;     /* waiting for the held watch's answer */
	size_t n, cap;
	bool flying;          /* the held watch is out */
	bool delivering;      /* in on_answer: subscribers re-subscribe */
	uint64_t after;       /* what the held watch asks after */
	uint32_t wait_ms;
	uint64_t latest;      /* the newest version an answer named */
};

static void on_answer(const struct trk_answer *ans, void *arg);

static int send_held(struct node_host_watch *w)
{
	int rc = trk_client_watch(w->trk, w->after, w->wait_ms, on_answer, w);

	if (rc == 0) {
		w->flying = true;
	}
	return rc;
}

static void on_answer(const struct trk_answer *ans, void *arg)
{
	struct node_host_watch *w = arg;
	struct sub *subs = w->subs;
	size_t n = w->n;

	w->flying = false;
	if (ans->status == 200) {
		json_t *l = json_object_get(ans->json, "latest");
		if (json_is_integer(l) && json_integer_value(l) > 0)
			w->latest = PROTO_MAX(w->latest, (uint64_t)json_integer_value(l));
	}
	/* Each rank hears the answer; those that watch again (most, at once)
	 * wait on the next held watch. */
	w->subs = NULL;
	w->n = w->cap = 0;
	w->delivering = true;
	for (size_t i = 0; i < n; i++)
		subs[i].cb(ans, subs[i].arg);
	w->delivering = false;
	free(subs);
	if (w->n > 0 && !w->flying && send_held(w) != 0) {
		/* Every waiting rank hears it, as if its own watch failed. */
		struct trk_answer fail = {.status = -EIO, .error = "could not send the watch"};
		subs = w->subs;
		n = w->n;
		w->subs = NULL;
		w->n = w->cap = 0;
		for (size_t i = 0; i < n; i++)
			subs[i].cb(&fail, subs[i].arg);
		free(subs);
	}
}

int node_host_watch_new(struct trk_client *trk, struct node_host_watch **out)
{
	struct node_host_watch *w = calloc(1, sizeof(*w));

	*out = w;
	if (w == NULL)
		return -ENOMEM;
	w->trk = trk;
	return 0;
}

int node_host_watch_ask(void *ctx, uint64_t after, uint32_t wait_ms, trk_client_cb cb, void *arg)
{
	struct node_host_watch *w = ctx;

	/* Behind the host, or the held watch asks after something else (a
	 * rank ahead of the others: rare): the tracker answers it alone. */
	if (after < w->latest || ((w->flying || w->n > 0) && after != w->after)) {
		return trk_client_watch(w->trk, after, wait_ms, cb, arg);
	}
	if (w->n == w->cap) {
		size_t cap = w->cap ? 2 * w->cap : 8;
		struct sub *s = realloc(w->subs, cap * sizeof(*s));
		if (s == NULL)
			return -ENOMEM;
		w->subs = s;
		w->cap = cap;
	}
	w->subs[w->n++] = (struct sub){cb, arg};
	w->after = after;
	w->wait_ms = wait_ms;
	/* While answering, the held watch is sent once all ranks heard. */
	if (!w->flying && !w->delivering) {
		int rc = send_held(w);
		if (rc != 0) {
			w->n--;
			return rc;
		}
	}
	return 0;
}

void node_host_watch_free(struct node_host_watch *w)
{
	if (w == NULL)
		return;
	free(w->subs);
	free(w);
}
