/* GET /healthz: 200 "ok" while the tracker can do its work, else 503 with
 * the reason in one line, as the node's and the publisher's /healthz
 * (node/base/metrics_http.c). What is checked: that a version can be
 * written to the state directory now (it went read-only, full or away). */
#include <string.h>

#include "tracker/server/internal.h"

void trk__handle_healthz(struct trk_call *c)
{
	struct proto_err err = {{0}};
	char line[sizeof(err.msg) + 1];

	if (trk__versions_probe(c->s->vs, &err) != 0) {
		size_t n = strlen(err.msg);
		memcpy(line, err.msg, n);
		line[n] = '\n';
		trk__reply_raw(c, 503, "text/plain", line, n + 1);
		return;
	}
	trk__reply_raw(c, 200, "text/plain", "ok\n", 3);
}
