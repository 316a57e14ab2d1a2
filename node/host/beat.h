/*
 * Heartbeats from their own thread: leases that outlive a busy loop.
 *
 * A node agent's loop also fetches, verifies and copies; on a loaded host
 * one turn of it took longer than a lease, the heartbeat timer fired late,
 * the tracker dropped the ranks and readers went back to the trainer. The
 * beat keeps a thread with its own event loop and its own tracker client
 * (its own connection: a request queued on the loop's client waits for
 * that loop) and sends one host heartbeat for the ranks it was given every
 * third of a lease, whatever the loop does.
 *
 * It speaks for a loop that lives, not for one that hangs: the loop feeds
 * it (node_beat_feed: the ranks, their sessions and pins) from a timer of
 * its own, and the thread sends nothing once the last feed is older than
 * TESSERA_HEARTBEAT_STALL_MS; the tracker then drops the ranks a lease
 * later, as before. Ranks the tracker answers as gone are handed to the
 * loop (the eventfd below wakes it), which registers them again.
 */
#ifndef NODE_BEAT_H
#define NODE_BEAT_H

#include <event2/event.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"
#include "tracker/tracker.h"

struct node_beat;

/* Called on base's thread with the n ranks one heartbeat's answer named
 * gone (ids[0..n-1], borrowed for the call), n >= 1. */
typedef void (*node_beat_gone_cb)(void *arg, const char (*ids)[TRK_ID_MAX], size_t n);

/*
 * Starts the thread: its client speaks to url (cluster_key NULL: unsigned;
 * tls_ca NULL: the system's trust store), gone() runs on base. Sends
 * nothing until fed. On failure nothing is left and err says why.
 */
int node_beat_new(struct event_base *base, const char *url, const uint8_t *cluster_key,
		  const char *tls_ca, node_beat_gone_cb gone, void *arg, struct node_beat **out,
		  struct proto_err *err);
/*
 * The loop's word that it lives, with what the next heartbeats carry: n
 * (0..TRK_HOST_HEARTBEAT_MAX) ranks and their pins (copied), each rank's
 * session taken from trk (the client that registered it). Cannot fail.
 */
void node_beat_feed(struct node_beat *b, const struct trk_hb_node *e, size_t n,
		    const struct trk_client *trk);
/* Heartbeats the tracker answered (any status), for tests and metrics. */
uint64_t node_beat_sent(struct node_beat *b);
/* Stops and joins the thread; NULL is fine. */
void node_beat_free(struct node_beat *b);

#endif
