/* Requests the tracker holds (long-polls): nodes' and publishers' watches
 * of the versions, answered when a version lands, and waits for an
 * addendum, answered when it is posted. */
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include "tracker/server/internal.h"

/* A held request (a long-poll): a watch of the versions after `after`;
 * with `layouts`, a publisher's, also ended when a replica comes alive
 * (layouts_rev moves); with `addendum`, a node's wait for the addendum of
 * version `after` for `layout`, ended when it is posted (and, with `copy`,
 * a raw copy's, when a newer version makes sure none will come). */
TAILQ_HEAD(waiter_list, waiter);
struct waiter {
	struct trk_watches *ws;
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	struct event *timer;
	uint64_t after;
	bool layouts, addendum, copy;
	uint8_t layout[PROTO_HASH_BYTES];
	struct waiter_list *list; /* the one of ws's lists it is on */
	TAILQ_ENTRY(waiter) link;
};

struct trk_watches {
	struct trk_server *s;
	/* Nodes' watches; publishers' watches and addendum waits (few: a
	 * replica coming alive walks only these, not every node's watch). */
	struct waiter_list waiters, special;
	/* Watches a version answers, answered WAKE_SLICE per turn of the loop
	 * at the low priority (wake_slice), and the answers built for them
	 * (by the version they wait after; dropped when a version lands). */
	struct waiter_list due;
	struct event *wake_ev;
	struct {
		uint64_t after;
		char *text;
		size_t len;
	} memo[4];
	size_t nmemo, memo_at;
	size_t nheld; /* on any list */
	/* Bumped whenever a replica comes alive (a new one, or one whose
	 * ranks were all gone): its layout may be one no version covers. */
	uint64_t layouts_rev;
};

static void waiter_free(struct waiter *w)
{
	TAILQ_REMOVE(w->list, w, link);
	w->ws->nheld--;
	if (w->conn != NULL)
		evhttp_connection_set_closecb(w->conn, NULL, NULL);
	event_free(w->timer);
	free(w);
}

void trk__watches_drop(struct trk_watches *ws)
{
	struct waiter *w;

	while ((w = TAILQ_FIRST(&ws->waiters)) != NULL)
		waiter_free(w);
	while ((w = TAILQ_FIRST(&ws->special)) != NULL)
		waiter_free(w);
	while ((w = TAILQ_FIRST(&ws->due)) != NULL)
		waiter_free(w);
}

static void memo_clear(struct trk_watches *ws)
{
	for (size_t i = 0; i < ws->nmemo; i++) {
		free(ws->memo[i].text);
		ws->memo[i].text = NULL;
	}
	ws->nmemo = ws->memo_at = 0;
}

int trk__watches_new(struct trk_server *s, struct trk_watches **out)
{
	struct trk_watches *ws = calloc(1, sizeof(*ws));

	*out = ws;
	if (ws == NULL)
		return -ENOMEM;
	ws->s = s;
	TAILQ_INIT(&ws->waiters);
	TAILQ_INIT(&ws->special);
	TAILQ_INIT(&ws->due);
	return 0;
}

void trk__watches_free(struct trk_watches *ws)
{
	if (ws == NULL)
		return;
	trk__watches_drop(ws);
	memo_clear(ws);
	if (ws->wake_ev != NULL)
		event_free(ws->wake_ev);
	free(ws);
}

uint64_t trk__watches_layouts_rev(const struct trk_watches *ws)
{
	return ws->layouts_rev;
}

static void waiter_answer(struct waiter *w)
{
	struct trk_watches *ws = w->ws;
	struct trk_server *s = ws->s;
	struct evhttp_request *req = w->req;
	uint64_t after = w->after;
	uint8_t layout[PROTO_HASH_BYTES];
	bool addendum = w->addendum, copy = w->copy;

	memcpy(layout, w->layout, sizeof(layout));
	waiter_free(w);
	trk__conns_handled(s->conns, req); /* a held request is built now */
	if (addendum)
		trk__addendum_reply_req(s, req, after, layout, copy);
	else
		trk__reply_req_json(s, req, 200, trk__versions_list_json(s, after, ws->layouts_rev));
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
	waiter_answer(arg);
}

/* The client went away while we held its request: libevent frees the
 * request right after this. */
static void waiter_closed(struct evhttp_connection *conn, void *arg)
{
	struct waiter *w = arg;
	w->conn = NULL;
	waiter_free(w);
}

#define WAKE_SLICE 64 /* watches answered per turn of the loop */

/* The answer for a watch after `after`, built once per version landed for
 * all the watches waiting after the same version (the last few are
 * remembered): a version wakes every node at once. NULL on ENOMEM. */
static const char *memo_text(struct trk_watches *ws, uint64_t after, size_t *len)
{
	json_t *a;
	char *t;

	for (size_t i = 0; i < ws->nmemo; i++)
		if (ws->memo[i].after == after) {
			*len = ws->memo[i].len;
			return ws->memo[i].text;
		}
	a = trk__versions_list_json(ws->s, after, ws->layouts_rev);
	t = trk__json_text(a, len);
	json_decref(a);
	if (t == NULL)
		return NULL;
	if (ws->nmemo < PROTO_ARRAY_LEN(ws->memo))
		ws->memo_at = ws->nmemo++;
	else
		ws->memo_at = (ws->memo_at + 1) % PROTO_ARRAY_LEN(ws->memo);
	free(ws->memo[ws->memo_at].text);
	ws->memo[ws->memo_at].after = after;
	ws->memo[ws->memo_at].text = t;
	ws->memo[ws->memo_at].len = *len;
	return t;
}

/* Answers up to WAKE_SLICE due watches, and comes back for the rest after
 * the loop served what else was waiting: answered all in one callback, a
 * version's watches held every heartbeat and sources query behind them
 * (tracker/NOTES.md). */
static void wake_slice(evutil_socket_t fd, short what, void *arg)
{
	struct trk_watches *ws = arg;
	struct waiter *w;
	uint64_t t0 = proto_now_ns();
	size_t n = 0;

	while (n < WAKE_SLICE && (w = TAILQ_FIRST(&ws->due)) != NULL) {
		struct evhttp_request *req = w->req;
		size_t len = 0;
		const char *txt = memo_text(ws, w->after, &len);

		waiter_free(w);
		trk__reply_req_text(ws->s, req, 200, txt, len);
		n++;
	}
	if (!TAILQ_EMPTY(&ws->due))
		event_active(ws->wake_ev, EV_TIMEOUT, 1);
	else
		memo_clear(ws);
	trk__conns_trace(ws->s->conns, "wake", t0, n);
}

/* Moves every waiter a new version concerns onto the due list, answered
 * by wake_slice: node watches first, then publishers' (addendum waits
 * wait for their addendum). Answers built for an older version go. */
void trk__watches_version_landed(struct trk_watches *ws)
{
	uint64_t latest = trk__versions_latest(ws->s->vs);
	struct waiter_list *lists[] = {&ws->waiters, &ws->special};
	struct waiter *w, *next;

	memo_clear(ws);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(lists); i++)
		for (w = TAILQ_FIRST(lists[i]); w != NULL; w = next) {
			next = TAILQ_NEXT(w, link);
			/* Raw copies are made of the latest version only (the
			 * publisher keeps no other's raw parcels): a newer one
			 * ends the wait for an older one's, at once. */
			if (w->addendum && w->copy && latest > w->after) {
				waiter_answer(w);
				continue;
			}
			if (latest <= w->after || w->addendum)
				continue;
			TAILQ_REMOVE(w->list, w, link);
			w->list = &ws->due;
			TAILQ_INSERT_TAIL(w->list, w, link);
		}
	if (TAILQ_EMPTY(&ws->due))
		return;
	if (ws->wake_ev == NULL) {
		struct event_base *base = ws->s->base;
		int npri = event_base_get_npriorities(base);
		if ((ws->wake_ev = event_new(base, -1, 0, wake_slice, ws)) == NULL) {
			/* Out of memory: each due watch ends at its timer. */
			return;
		}
		/* Below heartbeats and sources queries when the base has
		 * priorities (trk_server_new gives it three). */
		event_priority_set(ws->wake_ev, npri - 1);
	}
	event_active(ws->wake_ev, EV_TIMEOUT, 1);
}

/* Holds c's request for wait_ms (ended in its last tenth) as a waiter;
 * NULL when out of memory (c then answered). */
static struct waiter *hold(struct trk_call *c, uint64_t after, uint64_t wait_ms)
{
	struct trk_watches *ws = c->s->w;
	struct waiter *w = calloc(1, sizeof(*w));

	if (w == NULL || (w->timer = evtimer_new(c->s->base, waiter_timeout, w)) == NULL) {
		free(w);
		trk__fail(c, 500, "out of memory");
		return NULL;
	}
	w->ws = ws;
	w->req = c->req;
	w->after = after;
	w->conn = evhttp_request_get_connection(c->req);
	w->list = &ws->waiters;
	TAILQ_INSERT_TAIL(w->list, w, link);
	ws->nheld++;
	if (w->conn != NULL)
		evhttp_connection_set_closecb(w->conn, waiter_closed, w);
	trk__conns_background(c->s->conns, c->req);
	/* Watches that a version answered together come back together; held
	 * for exactly wait_ms they would all time out together again, every
	 * time. Ending each somewhere in the last tenth spreads them out. */
	wait_ms -= randombytes_uniform((uint32_t)(wait_ms / 10 + 1));
	struct timeval tv = {(time_t)(wait_ms / 1000),
			     (suseconds_t)(wait_ms % 1000) * 1000};
	evtimer_add(w->timer, &tv);
	c->answered = true; /* later, by the waiter */
	return w;
}

size_t trk__watches_held(const struct trk_watches *ws)
{
	return ws->nheld;
}

/* w is a publisher's watch or an addendum wait: onto the short list. */
static void special(struct waiter *w)
{
	TAILQ_REMOVE(w->list, w, link);
	w->list = &w->ws->special;
	TAILQ_INSERT_TAIL(w->list, w, link);
}

/* c has no connection to hold (trk__route_request without one): it is
 * reported held, and nothing waits. */
static int held_unconnected(struct trk_call *c)
{
	c->out->code = 0;
	c->answered = true;
	return 0;
}

int trk__watch_versions(struct trk_call *c, uint64_t after, uint64_t wait_ms, bool layouts)
{
	struct waiter *w;

	if (c->req == NULL)
		return held_unconnected(c);
	w = hold(c, after, wait_ms);
	if (w == NULL)
		return -ENOMEM;
	if (layouts) {
		w->layouts = true;
		special(w);
	}
	return 0;
}

int trk__watch_addendum(struct trk_call *c, uint64_t v, const uint8_t *layout, uint64_t wait_ms,
			bool copy)
{
	struct waiter *w;

	if (c->req == NULL)
		return held_unconnected(c);
	w = hold(c, v, PROTO_MIN(wait_ms, TRK_WAIT_MAX_MS));
	if (w == NULL)
		return -ENOMEM;
	w->addendum = true;
	w->copy = copy;
	memcpy(w->layout, layout, PROTO_HASH_BYTES);
	special(w);
	return 0;
}

/* Answers the waiters that match (each answer built anew: they are few). */
static void wake_matching(struct trk_watches *ws, bool (*match)(const struct waiter *, const void *),
			  const void *arg)
{
	struct waiter *w, *next;

	for (w = TAILQ_FIRST(&ws->special); w != NULL; w = next) {
		next = TAILQ_NEXT(w, link);
		if (match(w, arg))
			waiter_answer(w);
	}
}

static bool is_publisher_watch(const struct waiter *w, const void *arg)
{
	return w->layouts;
}

void trk__watches_replica_alive(struct trk_watches *ws)
{
	ws->layouts_rev++;
	wake_matching(ws, is_publisher_watch, NULL);
}

struct addendum_key {
	uint64_t v;
	const uint8_t *layout;
};

static bool waits_for(const struct waiter *w, const void *arg)
{
	const struct addendum_key *k = arg;
	return w->addendum && w->after == k->v &&
	       memcmp(w->layout, k->layout, PROTO_HASH_BYTES) == 0;
}

void trk__watches_addendum_posted(struct trk_watches *ws, uint64_t v, const uint8_t *layout)
{
	struct addendum_key k = {v, layout};

	wake_matching(ws, waits_for, &k);
}
