/* GET /healthz: 200 "ok" while the tracker can do its work, else 503 with
 * the reason in one line, as the node's and the publisher's /healthz
 * (node/base/metrics_http.c). What is checked: that a version can be
 * written to the store now (a state directory gone read-only, full or
 * away; etcd without a quorum). */
#include <errno.h>
#include <string.h>

#include "tracker/server/internal.h"

void trk__handle_healthz(struct trk_call *c)
{
	struct proto_err err = {{0}};
	char line[sizeof(err.msg) + 1];

	if (c->s->standby)
		proto_errf(&err, EAGAIN, "standby: the leading tracker is %s",
			   c->s->leader[0] ? c->s->leader : "not known yet");
	if (err.msg[0] != 0 || trk__store_probe(c->s->st, &err) != 0) {
		size_t n = strlen(err.msg);
		memcpy(line, err.msg, n);
		line[n] = '\n';
		trk__reply_raw(c, 503, "text/plain", line, n + 1);
		return;
	}
	trk__reply_raw(c, 200, "text/plain", "ok\n", 3);
}
