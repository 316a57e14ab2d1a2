/* The publisher's control socket: commands from the trainer's side, one a line. */

/*
 * `tessera publish --control PATH` listens on a local Unix stream socket
 * taking one command per line:
 *
 *   export             exports the next version from the configured source
 *                      (synthetic, model dir); answers "published V
 *                      CREATED_MS KIND WIRE_BYTES ANCHOR_BYTES ENCODE_US"
 *                      (KIND anchor or delta) once the tracker accepted it
 *                      and it is offered, or "error WHY".
 *   trainer R [bytes N] [dtype D]
 *                      (source: the trainer) this connection is trainer
 *                      rank R. Answers "buffer R BYTES NTENSORS" with the
 *                      rank's shared buffer, a memfd sealed against resizing,
 *                      passed with SCM_RIGHTS on that line's first byte; then
 *                      NTENSORS lines "tensor DTYPE OFFSET NBYTES SHAPE START
 *                      NAME": the rank's local tensors of the trainer layout
 *                      in its block (SHAPE like 4096x512, "-" for a scalar;
 *                      START the box's first coordinates in the logical
 *                      tensor NAME, like 2048x0, or "-" when the local tensor
 *                      is not one box of it). N and D, when given, are what
 *                      the trainer holds: a size other than the rank's bytes,
 *                      or a dtype other than its tensors', is refused, as
 *                      are a rank the layout does not have and a rank another
 *                      connection holds.
 *   export STEP        (a trainer connection) the rank's shard of training
 *                      step STEP is in the buffer. Once every trainer rank
 *                      said export for the same STEP, the version is
 *                      exported; each of them is answered "snapshot STEP V"
 *                      when the publisher has copied the buffers (they may
 *                      be written again from then on), then the same
 *                      "published ..." line as export, or "error WHY".
 *   status             what this connection's oldest unanswered export
 *                      waits for: "status STEP VERSION CAUSE WHY", STEP
 *                      and VERSION numbers or "-" (a plain export has no
 *                      step; the version is "-" while the export is
 *                      queued), CAUSE one word, WHY one line for people:
 *                        ranks    other trainer ranks have not said export
 *                                 STEP ("rank 1 of 2 has not exported step
 *                                 7", naming ranks no connection holds);
 *                        busy     queued behind another version's export
 *                                 (WHY says what that one waits for);
 *                        layouts  no node has registered a serving layout;
 *                        tracker  registering, publishing or offering at the
 *                                 tracker;
 *                        working  the publisher's own work (snapshot,
 *                                 encode, hash).
 *                      "status idle" when no answer is owed. It changes
 *                      nothing, and is answered at once, after any answer
 *                      already sent: a trainer whose wait timed out asks
 *                      it to say why. A publisher older than the command
 *                      answers "error unknown command 'status' ...".
 *   quit               stops the publisher.
 *
 * Bytes on the socket are hostile: lines are capped, numbers range-checked;
 * a refused command gets "error WHY" and changes nothing. A trainer
 * connection that goes away gives its rank back and withdraws its pending
 * export. Whoever can connect can export and stop the publisher: the socket
 * is made 0600.
 */
#ifndef NODE_PUB_CONTROL_H
#define NODE_PUB_CONTROL_H

#include <event2/bufferevent.h>
#include <event2/event.h>

#include "node/publisher/publisher.h"
#include "proto/util.h"

struct node_pub_control;

struct node_pub_control_ops {
	/* Every export's result, before its answer is sent (may be NULL). */
	void (*on_result)(void *arg, const struct node_pub_result *r);
	/* "quit" (may be NULL). */
	void (*on_quit)(void *arg);
	void *arg;
};

/*
 * Listens on path (a stale socket there is replaced, anything else is an
 * error). pub must outlive every call into it: free the control after
 * node_pub_free (which drops queued exports without answers). On failure
 * *out is NULL, nothing is left open and err says why.
 */
int node_pub_control_new(struct event_base *base, const char *path, struct node_pub *pub,
			 const struct node_pub_control_ops *ops, struct node_pub_control **out,
			 struct proto_err *err);
/* Closes every connection and the socket, removes its file. NULL is fine. */
void node_pub_control_free(struct node_pub_control *pc);
/* Takes bev (connected to a client; freed with the connection) as one
 * more connection, as an accepted one is; -ENOMEM leaves bev to the
 * caller. The fuzz target hands it one end of a bufferevent pair, which
 * carries no descriptor: "trainer R" is then answered without the buffer's
 * memfd. */
int node_pub__control_adopt(struct node_pub_control *pc, struct bufferevent *bev);

#endif
