/* Blocking use of the client, for command-line tools: one answer collected
 * (struct trk_reply) while the client's private base runs. */
#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/tracker.h"

void trk_reply_init(struct trk_reply *r)
{
	memset(r, 0, sizeof(*r));
}

void trk_reply_fini(struct trk_reply *r)
{
	json_decref(r->json);
	free(r->body);
	memset(r, 0, sizeof(*r));
}

void trk_reply_cb(const struct trk_answer *a, void *arg)
{
	struct trk_reply *r = arg;

	r->done = true;
	r->status = a->status;
	r->json = json_incref(a->json);
	r->body = malloc(a->len + 1);
	if (r->body != NULL) {
		memcpy(r->body, a->body, a->len);
		r->body[a->len] = 0;
		r->len = a->len;
	}
	snprintf(r->error, sizeof(r->error), "%s", a->error ? a->error : "");
}

void trk_client_wait(struct trk_client *c, struct trk_reply *r)
{
	while (!r->done)
		if (event_base_loop(trk_client_base(c), EVLOOP_ONCE) != 0)
			break;
}

int trk_client_call(struct trk_client *c, const char *method,
		    const char *path_query, const char *ctype, const void *body,
		    size_t len, struct trk_reply *r)
{
	int rc;

	trk_reply_init(r);
	rc = trk_client_request(c, method, path_query, ctype, body, len, 0,
				trk_reply_cb, r);
	if (rc != 0) {
		snprintf(r->error, sizeof(r->error), "request not sent: %s", strerror(-rc));
		return rc;
	}
	trk_client_wait(c, r);
	if (!r->done)
		return -EIO;
	return r->status < 0 ? r->status : 0;
}
