/* Why an export is not done yet: the publisher's state, told to whoever waits on it. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void say(struct node_pub_why *w, enum node_pub_wait cause, uint64_t version,
		const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void say(struct node_pub_why *w, enum node_pub_wait cause, uint64_t version,
		const char *fmt, ...)
{
	va_list ap;

	w->cause = cause;
	w->version = version;
	va_start(ap, fmt);
	vsnprintf(w->text, sizeof(w->text), fmt, ap);
	va_end(ap);
}

/* What the running export waits for: the step of its state machine it is in. */
static void running_why(const struct node_pub *p, const struct pub_export *ex,
			struct node_pub_why *w)
{
	unsigned long long v = (unsigned long long)ex->version;

	if (ex->failed) {
		say(w, NODE_PUB_WAIT_WORKING, ex->version, "version %llu failed (%.200s): finishing",
		    v, ex->error);
		return;
	}
	switch (ex->phase) {
	case EX_PREP:
		if (!p->registered)
			say(w, NODE_PUB_WAIT_TRACKER, ex->version,
			    "the publisher is not registered with the tracker (it retries: is the "
			    "tracker up?)");
		else if (ex->need == NEED_WATCH || ex->need == NEED_MANIFEST)
			say(w, NODE_PUB_WAIT_TRACKER, ex->version,
			    "version %llu waits for its signed manifest at the tracker", v);
		else if (ex->need == NEED_LAYOUTS && p->layouts_waiting)
			say(w, NODE_PUB_WAIT_LAYOUTS, ex->version,
			    "%s (version %llu waits for one, %llu s so far)",
			    p->layouts_seen ? "no node alive has a serving layout: the leases of all "
					      "that registered one lapsed"
					    : "no node has registered a serving layout yet",
			    v, (unsigned long long)(proto_now_ns() / 1000000 - p->layouts_wait_ms) / 1000);
		else if (ex->need == NEED_LAYOUTS)
			say(w, NODE_PUB_WAIT_TRACKER, ex->version,
			    "asking the tracker for the serving layouts of version %llu", v);
		else if (ex->jobs_left > 0)
			say(w, NODE_PUB_WAIT_WORKING, ex->version,
			    "taking version %llu's snapshot of the trainer's buffers", v);
		else
			say(w, NODE_PUB_WAIT_TRACKER, ex->version,
			    "asking the tracker which versions replicas still hold before version %llu", v);
		break;
	case EX_GATHER:
		if (ex->delta)
			say(w, NODE_PUB_WAIT_WORKING, ex->version,
			    "encoding version %llu's parcels for %zu serving layouts as deltas", v,
			    ex->nlayouts);
		else
			say(w, NODE_PUB_WAIT_WORKING, ex->version,
			    "gathering and hashing version %llu's parcels for %zu serving layouts "
			    "(an anchor: %.128s)", v, ex->nlayouts, ex->why);
		break;
	case EX_PUBLISH:
		say(w, NODE_PUB_WAIT_TRACKER, ex->version, "publishing version %llu at the tracker%s",
		    v, ex->tries > 0 ? " (the tracker failed, retrying)" : "");
		break;
	case EX_OFFER:
		say(w, NODE_PUB_WAIT_TRACKER, ex->version,
		    "offering version %llu's parcels at the tracker", v);
		break;
	}
}

/* What an export queued behind `ahead` others waits for. */
static void queued_why(const struct node_pub *p, size_t ahead, struct node_pub_why *w)
{
	const struct pub_export *ex = p->ex;
	struct node_pub_why cur;
	char more[64] = "";

	if (ex == NULL) {
		if (!p->ready)
			say(w, NODE_PUB_WAIT_TRACKER, 0, "the publisher is starting: %s",
			    p->registered ? "reading the tracker's versions" :
					    "registering with the tracker (is the tracker up?)");
		else
			say(w, NODE_PUB_WAIT_WORKING, 0, "the export is about to start");
		return;
	}
	running_why(p, ex, &cur);
	if (ahead > 0)
		snprintf(more, sizeof(more), "; %zu more exports queued before this one", ahead);
	say(w, NODE_PUB_WAIT_BUSY, 0, "the publisher is busy %s version %llu: %s%s",
	    ex->verify ? "rebuilding" : ex->addendum ? "extending" : "exporting",
	    (unsigned long long)ex->version, cur.text, more);
}

int node_pub_export_why(const struct node_pub *p, const void *arg, struct node_pub_why *out)
{
	size_t ahead = 0;

	if (p->ex != NULL && p->ex->req != NULL && p->ex->req->arg == arg) {
		running_why(p, p->ex, out);
		return 0;
	}
	for (const struct pub_req *r = p->queue; r != NULL; r = r->next, ahead++)
		if (r->arg == arg) {
			queued_why(p, ahead, out);
			return 0;
		}
	return -ENOENT;
}

const char *node_pub_wait_name(enum node_pub_wait w)
{
	switch (w) {
	case NODE_PUB_WAIT_BUSY:
		return "busy";
	case NODE_PUB_WAIT_WORKING:
		return "working";
	case NODE_PUB_WAIT_TRACKER:
		return "tracker";
	case NODE_PUB_WAIT_LAYOUTS:
		return "layouts";
	}
	return "working";
}
