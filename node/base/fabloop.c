/* A fabric context driven by a libevent loop (wait fd + fallback timer). */
#include "node/base/fabloop.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "proto/log.h"
#include "proto/util.h"

/*
 * The fallback timer costs a process a wake-up per period: at 1 ms, about
 * 16 ms of CPU a second on a loaded 2-core host (in a VM more: each poll is
 * a few system calls), more than a node spends hashing a 128 MiB version in
 * a minute-long run, taken from the processes that are fetching. Where the
 * provider gives a wait fd (tcp;ofi_rxm: it covers the provider's sockets,
 * so bytes of our reads arriving, a peer's request and a socket that can
 * take more of what we serve all wake it), the fd drives progress and the
 * timer is only a fallback: the period doubles every QUIET_POLLS timer
 * polls that found nothing up to IDLE_PERIOD_US (rxm's own connection
 * checks run every 10 ms of progress), whether or not reads of ours are in
 * flight. A post (node_fabloop_kick), a completion or pending progress bring
 * it back to period_us at once; posts parked on a busy peer keep it there
 * (only a poll retries them). A node waiting on a slow source (a star run's
 * trainer) so polls about 125 times a second instead of 1000. Without a
 * wait fd the period never grows.
 */
#define QUIET_POLLS 100
#define IDLE_PERIOD_US 8000u

struct node_fabloop {
	struct fab_ctx *ctx;
	struct event *fd_ev;    /* CQ wait fd readable, when there is one */
	struct event *timer_ev; /* periodic poll */
	struct event *kick_ev;  /* poll again soon */
	unsigned period_us;     /* the busy period */
	unsigned now_us;        /* the timer's period now */
	unsigned quiet;         /* timer polls that found nothing at now_us */
	uint64_t polls[3];      /* by enum wake */
};

static void set_period(struct node_fabloop *fl, unsigned us)
{
	struct timeval tv = {us / 1000000, us % 1000000};

	fl->now_us = us;
	fl->quiet = 0;
	if (event_add(fl->timer_ev, &tv) != 0)
		LOG_WARN("fabric: cannot rearm the poll timer");
}

/* Completions handled per wake-up before other events get their turn. */
#define DRIVE_BATCH 32

enum wake { WAKE_TIMER, WAKE_FD, WAKE_KICK };

static void drive(struct node_fabloop *fl, enum wake why)
{
	int n = fab_poll(fl->ctx, DRIVE_BATCH);
	bool busy;

	fl->polls[why]++;
	if (n < 0) {
		LOG_WARN("fabric: poll failed: %d", n);
		return;
	}
	/* Completions came, or the provider has progress to make (a peer's
	 * one-sided reads are served only while we poll): come back after the
	 * other ready events (timers, HTTP) had their turn. Posts parked on a
	 * busy or unreachable peer do not count, so the loop never spins on
	 * them; the timer retries them. */
	busy = n > 0 || fab_trywait(fl->ctx) == -EAGAIN;
	if (busy)
		event_active(fl->kick_ev, 0, 0);
	if (busy || why == WAKE_KICK || fl->fd_ev == NULL || fab_parked(fl->ctx)) {
		if (fl->now_us != fl->period_us)
			set_period(fl, fl->period_us);
		fl->quiet = 0;
	} else if (why == WAKE_TIMER && ++fl->quiet >= QUIET_POLLS &&
		   fl->now_us < IDLE_PERIOD_US) {
		set_period(fl, PROTO_MIN(2 * fl->now_us, IDLE_PERIOD_US));
	}
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	drive(arg, WAKE_KICK);
}

static void on_fd(evutil_socket_t fd, short what, void *arg)
{
	drive(arg, WAKE_FD);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	drive(arg, WAKE_TIMER);
}

struct node_fabloop *node_fabloop_new(struct event_base *base, struct fab_ctx *ctx,
				      unsigned period_us)
{
	struct node_fabloop *fl = calloc(1, sizeof(*fl));
	int fd = fab_wait_fd(ctx);

	if (fl == NULL)
		return NULL;
	fl->ctx = ctx;
	fl->period_us = fl->now_us = period_us;
	fl->timer_ev = event_new(base, -1, EV_PERSIST, on_timer, fl);
	fl->kick_ev = event_new(base, -1, 0, on_kick, fl);
	if (fd >= 0)
		fl->fd_ev = event_new(base, fd, EV_READ | EV_PERSIST, on_fd, fl);
	if (fl->timer_ev == NULL || fl->kick_ev == NULL || (fd >= 0 && fl->fd_ev == NULL) ||
	    event_add(fl->timer_ev, &(struct timeval){period_us / 1000000, period_us % 1000000}) != 0 ||
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

void node_fabloop_counts(const struct node_fabloop *fl, struct node_fabloop_counts *out)
{
	*out = (struct node_fabloop_counts){
		.period_us = fl->now_us,
		.timer_polls = fl->polls[WAKE_TIMER],
		.fd_polls = fl->polls[WAKE_FD],
		.kick_polls = fl->polls[WAKE_KICK],
	};
}

void node_fabloop_free(struct node_fabloop *fl)
{
	if (fl == NULL)
		return;
	LOG_DEBUG("fabric loop: %" PRIu64 " polls woken by the fd, %" PRIu64 " by the timer, %" PRIu64
		 " kicked", fl->polls[WAKE_FD], fl->polls[WAKE_TIMER], fl->polls[WAKE_KICK]);
	if (fl->fd_ev)
		event_free(fl->fd_ev);
	if (fl->timer_ev)
		event_free(fl->timer_ev);
	if (fl->kick_ev)
		event_free(fl->kick_ev);
	free(fl);
}
