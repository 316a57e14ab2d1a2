/* A version whose manifest lacks our layout: its signed addendum, checked and spliced in. */
#include "node/agent/agent_internal.h"

#include "proto/addendum.h"

/*
 * A replica that registers a layout after the latest version was published
 * finds no parcels for it in that manifest. The publisher, told by the
 * tracker, plans and hashes the layout's parcels of that version and posts
 * an addendum signed by the trainer key (proto/addendum.h). We ask the
 * tracker for it with a long-poll it answers when the addendum is posted
 * (asked again after a failure, TESSERA_ADDENDUM_WAIT_MS in all),
 * check its signature with the trainer key and its binding to the manifest
 * we verified (same version and manifest digest), and splice its layout
 * into our copy of the manifest: from there on the fetch is the one every
 * layout gets, every chunk checked against the addendum's hashes. A bad
 * addendum refuses the version like a bad manifest does.
 */

static void ask(struct node_agent *a);

/* No addendum came: the old rule, wait for the next version. The tracker
 * hears the failure, so the replica's target moves past this version. No
 * raw copy came: the version is refused here, and tried again by its chain. */
static void no_cover(struct node_agent *a)
{
	struct agent_fetch *f = a->fetch;

	if (f->full) {
		a->full_failed_v = f->version;
		agent_fetch_fail(a, "no raw copy of v%" PRIu64 " came; its chain is replayed next",
				 f->version);
		return;
	}
	LOG_INFO("node %s: v%" PRIu64 " has no parcels for our layout and no addendum came; "
		 "waiting for a newer version",
		 a->node_id, f->version);
	agent_report(a, f->version, TRK_STATE_FAILED,
		     "no parcels for our layout (published before it registered, no addendum)", NULL);
	a->failed = f->version;
	a->failed_ms = agent_now_ms();
	agent_fetch_drop(a);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	if (a->fetch != NULL && a->fetch->want_addendum)
		ask(a);
}

/* Not there yet (or the tracker did not answer): ask again soon, until the
 * wait is over. */
static void again(struct node_agent *a, const char *why)
{
	struct agent_fetch *f = a->fetch;

	if (agent_now_ms() - f->started_ms >= proto_param(PROTO_PARAM_ADDENDUM_WAIT_MS)) {
		no_cover(a);
		return;
	}
	if (f->addendum_ev == NULL)
		f->addendum_ev = evtimer_new(a->base, on_timer, a);
	if (f->addendum_ev == NULL) {
		no_cover(a);
		return;
	}
	node_wait_note(&a->wait, agent_now_ms(), a->node_id, "addendum",
		       "the %s of v%" PRIu64 " for our layout (%s)",
		       f->full ? "raw copy" : "addendum", f->version, why);
	agent_arm(f->addendum_ev, RETRY_MS);
}

static void on_addendum(const struct trk_answer *ans, void *arg)
{
	struct node_agent *a;
	struct agent_fetch *f = agent_fetch_answered(arg, &a);
	struct proto_addendum ad;
	struct proto_err err = {{0}};

	if (f == NULL || !f->want_addendum)
		return;
	if (ans->status == 410 && f->full) { /* a newer version came: none will */
		a->full_failed_v = f->version;
		agent_fetch_fail(a, "no raw copy of v%" PRIu64 " will come: a newer version is out "
				 "(only the latest is copied); the replica moves on",
				 f->version);
		return;
	}
	if (ans->status != 200) {
		again(a, ans->error);
		return;
	}
	if (proto_addendum_decode(ans->body, ans->len, a->trainer_pk, &ad, &err) != 0 ||
	    (ad.copy != f->full &&
	     proto_errf(&err, EINVAL, "the tracker sent %s", f->full ? "an addendum, not a raw copy" :
								       "a raw copy, not an addendum")) ||
	    proto_addendum_binds(&ad, &f->man, &err) != 0) {
		if (ad.version != 0)
			proto_addendum_fini(&ad);
		agent_fetch_fail(a, "%s", err.msg);
		return;
	}
	if (sodium_memcmp(ad.layout.layout_digest, a->layout.digest, PROTO_HASH_BYTES) != 0) {
		proto_addendum_fini(&ad);
		agent_fetch_fail(a, "the tracker sent the addendum of another layout");
		return;
	}
	if (proto_addendum_extend(&f->man, &ad) != 0) {
		proto_addendum_fini(&ad);
		agent_fetch_fail(a, "out of memory");
		return;
	}
	proto_addendum_fini(&ad);
	f->want_addendum = false;
	node_wait_over(&a->wait, "addendum");
	LOG_INFO("node %s: v%" PRIu64 " %s", a->node_id, f->version,
		 f->full ? "taken whole: its signed raw copy of our layout is in" :
			   "extended for our layout by its signed addendum");
	agent_with_addendum(a);
}

/* A long-poll for what is left of the wait: the tracker answers as soon
 * as the publisher posts the addendum. */
static void ask(struct node_agent *a)
{
	uint64_t waited = agent_now_ms() - a->fetch->started_ms;
	uint64_t wait = proto_param(PROTO_PARAM_ADDENDUM_WAIT_MS);
	uint32_t left = waited < wait ? (uint32_t)PROTO_MIN(wait - waited, TRK_WAIT_MAX_MS) : 1;
	struct agent_fetch_ask *t = agent_fetch_ask_new(a);

	if (t == NULL || (a->fetch->full ? trk_client_get_copy : trk_client_get_addendum)(
				 a->trk, a->fetch->version, a->layout.digest, left, on_addendum, t) != 0) {
		agent_fetch_ask_cancel(t);
		again(a, "cannot ask the tracker");
	}
}

void agent_addendum_wait(struct node_agent *a)
{
	a->fetch->want_addendum = true;
	ask(a);
}

void agent_copy_wait(struct node_agent *a)
{
	a->fetch->full = true;
	agent_addendum_wait(a);
}
