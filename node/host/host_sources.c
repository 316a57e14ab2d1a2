/* The sources queries of a host's ranks, sent together as one POST /sources. */
#include "node/host/host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "proto/proto.h"
#include "tracker/tracker.h"

/*
 * After a version lands every rank of a host asks for the sources of its
 * parcels within the same few loop turns (their fetches start from one
 * watch answer). One GET per parcel is a request per rank that the tracker
 * parses, authenticates and answers, and that waits behind the others on
 * the host's one kept connection. Queries asked during one loop turn go
 * out as one batch (at most TRK_SOURCES_BATCH_MAX parcels; more make more
 * batches) when the turn ends; each asker's callback then gets its own
 * part, shaped as the GET's answer, so the fetcher cannot tell. A
 * tracker that does not know POST /sources (405/404: an older one) is
 * asked parcel by parcel from then on. The batch asks for shared members
 * lists: the ranks of a replica are members of different swarms whose
 * lists name the same replicas, sent once per batch and expanded here
 * (trk_sources_expand); a tracker that does not share lists them whole.
 */

struct ask {
	struct trk_parcel_key k;
	trk_client_cb cb;
	void *arg;
};

struct batch {
	struct node_host_sources *hs;
	size_t n;
	struct ask a[TRK_SOURCES_BATCH_MAX];
	TAILQ_ENTRY(batch) link;
};
TAILQ_HEAD(batch_list, batch);

struct node_host_sources {
	struct trk_client *trk;
	struct event *flush_ev;
	struct batch *open;       /* being filled this loop turn, or NULL */
	struct batch_list flying; /* sent, not answered */
	bool single;              /* the tracker takes no batches: GET each */
};

static void on_batch(const struct trk_answer *ans, void *arg);

/* Sends b (taken); on failure every asker hears the error. */
static void send_batch(struct node_host_sources *hs, struct batch *b)
{
	struct trk_parcel_key keys[TRK_SOURCES_BATCH_MAX];
	int rc;

	for (size_t i = 0; i < b->n; i++)
		keys[i] = b->a[i].k;
	TAILQ_INSERT_TAIL(&hs->flying, b, link);
	rc = trk_client_sources_shared(hs->trk, keys, b->n, on_batch, b);
	if (rc == 0)
		return;
	TAILQ_REMOVE(&hs->flying, b, link);
	struct trk_answer fail = {.status = rc, .error = "could not send the sources query"};
	for (size_t i = 0; i < b->n; i++)
		b->a[i].cb(&fail, b->a[i].arg);
	free(b);
}

static void flush(evutil_socket_t fd, short what, void *arg)
{
	struct node_host_sources *hs = arg;
	struct batch *b = hs->open;

	hs->open = NULL;
	if (b != NULL)
		send_batch(hs, b);
}

/* Each asker's part of a batch's answer, as GET /sources gives it. */
static void on_batch(const struct trk_answer *ans, void *arg)
{
	struct batch *b = arg;
	struct node_host_sources *hs = b->hs;
	json_t *answers = json_object_get(ans->json, "answers");

	TAILQ_REMOVE(&hs->flying, b, link);
	if (ans->status == 404 || ans->status == 405) {
		/* An older tracker: ask parcel by parcel from now on. */
		LOG_INFO("tracker: no batched sources queries (%d %s): one query per parcel",
			 ans->status, ans->error);
		hs->single = true;
		for (size_t i = 0; i < b->n; i++) {
			const struct ask *q = &b->a[i];
			if (trk_client_sources_key(hs->trk, &q->k, q->cb, q->arg) != 0) {
				struct trk_answer fail = {.status = -EIO, .error = "could not send"};
				q->cb(&fail, q->arg);
			}
		}
		free(b);
		return;
	}
	uint32_t dst[TRK_SOURCES_BATCH_MAX];
	for (size_t i = 0; i < b->n; i++)
		dst[i] = b->a[i].k.dst_rank;
	bool whole = ans->status == 200 && json_is_array(answers) &&
		     json_array_size(answers) == b->n && trk_sources_expand(ans->json, dst, b->n) == 0;
	for (size_t i = 0; i < b->n; i++) {
		json_t *one = whole ? json_array_get(answers, i) : NULL;
		json_t *st = json_object_get(one, "status");
		struct trk_answer part = *ans;
		if (!whole) {
			if (part.status == 200) {
				part.status = -EPROTO;
				part.error = "malformed batched sources answer";
			}
			part.json = NULL;
		} else if (json_is_integer(st)) {
			part.status = (int)json_integer_value(st);
			part.error = json_string_value(json_object_get(one, "error"));
			part.json = one;
			if (part.error == NULL)
				part.error = "?";
		} else {
			part.json = one;
		}
		part.body = NULL;
		part.len = 0;
		b->a[i].cb(&part, b->a[i].arg);
	}
	free(b);
}

int node_host_sources_new(struct event_base *base, struct trk_client *trk,
			  struct node_host_sources **out)
{
	struct node_host_sources *hs = calloc(1, sizeof(*hs));

	*out = NULL;
	if (hs == NULL)
		return -ENOMEM;
	hs->trk = trk;
	TAILQ_INIT(&hs->flying);
	hs->flush_ev = event_new(base, -1, 0, flush, hs);
	if (hs->flush_ev == NULL) {
		free(hs);
		return -ENOMEM;
	}
	*out = hs;
	return 0;
}

int node_host_sources_ask(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb, void *arg)
{
	struct node_host_sources *hs = ctx;
	struct batch *b = hs->open;

	if (hs->single)
		return trk_client_sources_key(hs->trk, k, cb, arg);
	if (b == NULL) {
		if ((b = calloc(1, sizeof(*b))) == NULL)
			return -ENOMEM;
		b->hs = hs;
		hs->open = b;
		/* Sent once this loop turn's callbacks have run. */
		event_active(hs->flush_ev, 0, 0);
	}
	b->a[b->n++] = (struct ask){*k, cb, arg};
	if (b->n == TRK_SOURCES_BATCH_MAX) {
		hs->open = NULL;
		send_batch(hs, b);
	}
	return 0;
}

void node_host_sources_free(struct node_host_sources *hs)
{
	struct batch *b;

	if (hs == NULL)
		return;
	/* Nothing calls back now: the askers are gone (node_host_free). */
	while ((b = TAILQ_FIRST(&hs->flying)) != NULL) {
		TAILQ_REMOVE(&hs->flying, b, link);
		free(b);
	}
	free(hs->open);
	event_free(hs->flush_ev);
	free(hs);
}
