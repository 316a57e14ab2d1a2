/*
 * Frees retired slots off the node's event loop. Unmapping a slot and
 * closing its memfd gives its pages back to the kernel, which takes
 * milliseconds per GiB: done on the loop it would stall every serving
 * request waiting for an acquire right after a switch. A reaper is one
 * worker thread that frees the slots it is handed, in order.
 */
#ifndef NODE_ATTACH_REAP_H
#define NODE_ATTACH_REAP_H

#include "node/store/store.h"

struct node_reaper;

/* Starts the worker. On failure (no thread) *out is NULL and slots handed
 * to a NULL reaper are freed at once by the caller's thread. */
int node_reaper_new(struct node_store *store, struct node_reaper **out);
/* Takes slot of store (NULL is fine) and frees it on the worker; with r
 * NULL, or when out of memory, frees it now. Cannot fail. */
void node_reaper_free(struct node_reaper *r, struct node_store *store, struct node_slot *slot);
/* Slots handed to r and not yet freed (waiting out the grace, or being
 * freed). NULL is fine (0). */
size_t node_reaper_pending(struct node_reaper *r);
/* Frees what is still queued, stops the worker. NULL is fine. */
void node_reaper_stop(struct node_reaper *r);

#endif
