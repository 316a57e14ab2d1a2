/* A fabric context driven by a libevent loop (wait fd + fallback timer). */
#include "node/fabloop.h"

#include <errno.h>
#include <stdlib.h>

#include "proto/log.h"

struct node_fabloop {
	struct fab_ctx *ctx;
	struct event *fd_ev;    /* CQ wait fd readable, when there is one */
	struct event *timer_ev; /* periodic poll */
	struct event *kick_ev;  /* poll again soon */
	struct timeval period;
};

/* Completions handled per wake-up before other events get their turn. */
#define DRIVE_BATCH 32

static void drive(struct node_fabloop *fl)
{
	int n = fab_poll(fl->ctx, DRIVE_BATCH);

	if (n < 0) {
		LOG_WARN("fabric: poll failed: %d", n);
		return;
	}
	/* Completions came, or the provider has progress to make (a peer's
	 * one-sided reads are served only while we poll): come back after the
	 * other ready events (timers, HTTP) had their turn. Posts parked on a
	 * busy or unreachable peer do not count, so the loop never spins on
	 * them; the timer retries them. */
	if (n > 0 || fab_trywait(fl->ctx) == -EAGAIN)
		event_active(fl->kick_ev, 0, 0);
}

static void on_event(evutil_socket_t fd, short what, void *arg)
{
	drive(arg);
}

struct node_fabloop *node_fabloop_new(struct event_base *base, struct fab_ctx *ctx,
				      unsigned period_us)
{
	struct node_fabloop *fl = calloc(1, sizeof(*fl));
	int fd = fab_wait_fd(ctx);

	if (fl == NULL)
		return NULL;
	fl->ctx = ctx;
	fl->period.tv_sec = period_us / 1000000;
	fl->period.tv_usec = period_us % 1000000;
	fl->timer_ev = event_new(base, -1, EV_PERSIST, on_event, fl);
	fl->kick_ev = event_new(base, -1, 0, on_event, fl);
	if (fd >= 0)
		fl->fd_ev = event_new(base, fd, EV_READ | EV_PERSIST, on_event, fl);
	if (fl->timer_ev == NULL || fl->kick_ev == NULL || (fd >= 0 && fl->fd_ev == NULL) ||
	    event_add(fl->timer_ev, &fl->period) != 0 ||
	    (fl->fd_ev != NULL && event_add(fl->fd_ev, NULL) != 0)) {
		node_fabloop_free(fl);
		return NULL;
	}
	return fl;
}

void node_fabloop_kick(struct node_fabloop *fl)
{
	event_active(fl->kick_ev, 0, 0);
}

void node_fabloop_free(struct node_fabloop *fl)
{
	if (fl == NULL)
		return;
	if (fl->fd_ev)
		event_free(fl->fd_ev);
	if (fl->timer_ev)
		event_free(fl->timer_ev);
	if (fl->kick_ev)
		event_free(fl->kick_ev);
	free(fl);
}
