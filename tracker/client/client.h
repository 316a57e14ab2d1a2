/* What the client's files share beyond tracker.h: the typed requests
 * (requests.c) are built on these. Not included outside tracker/client/. */
#ifndef TRACKER_CLIENT_CLIENT_H
#define TRACKER_CLIENT_CLIENT_H

#include <stdint.h>

#include "tracker/tracker.h"

/* The client's default per-request timeout, ms (a long-poll adds its wait). */
uint32_t trk__client_timeout(const struct trk_client *c);
/* trk_client_post_json whose request owns arg: arg_free(arg) runs when the
 * request goes unanswered because the client is freed first; once cb is
 * called, arg is cb's. */
int trk__client_post_owned(struct trk_client *c, const char *path, json_t *body,
			   trk_client_cb cb, void *arg, void (*arg_free)(void *arg));

#endif
