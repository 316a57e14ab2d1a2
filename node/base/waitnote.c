/* Rate-limited notices of what a node waits for (see waitnote.h). */
#include "node/base/waitnote.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/proto.h"

void node_wait_note(struct node_wait *w, uint64_t now_ms, const char *who, const char *key,
		    const char *fmt, ...)
{
	uint64_t every = proto_param(PROTO_PARAM_WAIT_NOTICE_MS);
	char what[512];
	va_list ap;

	if (strncmp(w->key, key, sizeof(w->key)) != 0) {
		snprintf(w->key, sizeof(w->key), "%s", key);
		w->since_ms = now_ms;
		w->said_ms = 0;
	}
	if (now_ms - w->since_ms < every || (w->said_ms != 0 && now_ms - w->said_ms < every))
		return;
	w->said_ms = now_ms;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	/* No version yet is the trainer's pace, not a fault: said, not warned. */
	proto_log(strcmp(w->key, "version") == 0 ? PROTO_LOG_NOTE : PROTO_LOG_WARN, __FILE__,
		  __LINE__, "%s: waiting %llu s for %s", who,
		  (unsigned long long)((now_ms - w->since_ms) / 1000), what);
}

void node_wait_over(struct node_wait *w, const char *key)
{
	if (key != NULL && strncmp(w->key, key, sizeof(w->key)) != 0)
		return;
	w->key[0] = 0;
	w->said_ms = 0;
}
