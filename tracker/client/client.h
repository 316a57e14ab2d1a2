/* What the client's files share beyond tracker.h: the typed requests
 * (requests.c) are built on these. Not included outside tracker/client/. */
#ifndef TRACKER_CLIENT_CLIENT_H
#define TRACKER_CLIENT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracker/tracker.h"

/* The client's default per-request timeout, ms (a long-poll adds its wait). */
uint32_t trk__client_timeout(const struct trk_client *c);
/* trk_client_post_json whose request owns arg: arg_free(arg) runs when the
 * request goes unanswered because the client is freed first; once cb is
 * called, arg is cb's. */
int trk__client_post_owned(struct trk_client *c, const char *path, json_t *body,
			   trk_client_cb cb, void *arg, void (*arg_free)(void *arg));
/* The largest body a client takes in answer to a request (post: a POST)
 * for path (TRK_API "/..."), bytes: what that kind of answer holds at most
 * from an honest tracker (bounds.c). Cannot fail. */
size_t trk__answer_max(bool post, const char *path);

#endif
