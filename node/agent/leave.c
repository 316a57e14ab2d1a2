/* Leaving: a node stopped on purpose tells the tracker before it goes. */
#include "node/agent/internal.h"

/*
 * Without it a stopped node stays listed as a source until its lease runs
 * out (TESSERA_LEASE_MS): peers keep asking it for chunks and its replica
 * looks whole. POST /nodes/leave (signed with the node's session, like its
 * heartbeats) makes the tracker drop it at once. The stop does not wait on
 * an unreachable tracker longer than LEAVE_WAIT_MS: the lease then ends it.
 */
#define LEAVE_WAIT_MS 2000

static void finish(struct node_agent *a)
{
	void (*done)(void *) = a->leave_done;

	if (done == NULL)
		return;
	a->leave_done = NULL;
	if (a->leave_ev != NULL)
		evtimer_del(a->leave_ev);
	done(a->leave_arg);
}

static void on_leave(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a = arg;

	/* Not a fault either way: a tracker stopped with the node (the
	 * by-hand run's `kill $(jobs -p)`) cannot hear it, and the lease ends
	 * what the leave would have. */
	if (ans->status == 200)
		LOG_INFO("node %s: left the tracker", a->node_id);
	else
		LOG_INFO("node %s: leaving: %s (its lease will end it)", a->node_id, ans->error);
	finish(a);
}

static void on_leave_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	LOG_INFO("node %s: the tracker did not answer our leave in %d ms (its lease will end it)",
		 a->node_id, LEAVE_WAIT_MS);
	finish(a);
}

void node_agent_leave(struct node_agent *a, void (*done)(void *arg), void *arg)
{
	a->leaving = true;
	a->leave_done = done;
	a->leave_arg = arg;
	if (a->heartbeat_ev != NULL)
		evtimer_del(a->heartbeat_ev);
	if (a->retry_ev != NULL)
		evtimer_del(a->retry_ev);
	if (!a->registered || trk_client_leave(a->trk, a->node_id, on_leave, a) != 0) {
		finish(a);
		return;
	}
	a->leave_ev = evtimer_new(a->base, on_leave_timer, a);
	if (a->leave_ev == NULL) {
		finish(a);
		return;
	}
	node_arm(a->leave_ev, LEAVE_WAIT_MS);
}
