/*
 * The attach server: how serving processes on the node's host reach the
 * served weights. A local Unix stream socket speaks the protocol of
 * node/client/wire.h: a client attaches to (replica, rank), gets the tensor
 * table, is sent each version as it becomes active (the slot's memfd, and
 * the CUDA IPC handle in GPU mode), and pins the active version for a
 * request (acquire) until the request ends (release).
 *
 * Slot lifetime. The agent hands every slot it activates to
 * node_attach_activate() and every slot it stops serving to
 * node_attach_retire() instead of freeing it: a retired slot is freed at once
 * when no request pins it, else when its last pin is released. A client's
 * pins are dropped when its socket closes, so a client that goes away cannot
 * keep a slot (or block activation). The agent never waits for pins: the
 * switch to a new version is immediate; old readers keep the old slot.
 * Host slots are freed on a worker thread (node/serve/attach_reap.h) a short grace
 * after their last pin, so that neither the loop nor the serving process
 * (whose unmapping then is not the last reference) pays for their pages.
 *
 * Everything runs on the node's libevent loop. Bytes from clients are
 * hostile: every frame is length-checked before it is buffered, every field
 * range-checked; a bad one gets an ERROR naming the reason and the
 * connection is closed; nothing else changes.
 */
#ifndef NODE_ATTACH_H
#define NODE_ATTACH_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/serve/perm.h"
#include "node/store/store.h"
#include "proto/spec.h"
#include "proto/util.h"

struct node_attach_info {
	const char *replica;
	uint32_t rank;
	const struct proto_rank *spec;  /* the rank's local tensors; outlives the server */
	const uint8_t *layout_digest;   /* 32 bytes */
	struct node_store *store;       /* frees retired slots; outlives the server */
	/* The model the spec's pieces index: where each local tensor comes
	 * from, for protocol-3 clients. NULL: the table says nothing of it. */
	const struct proto_model *model;
	bool in_place; /* installs write the served slot: nothing can be held */
	const struct node_perm *perm;   /* the socket's mode and group; NULL: as made */
};

struct node_attach;

/*
 * Listens on the Unix socket path (a stale socket file there is replaced;
 * anything else there is an error). On failure *out is NULL, nothing is left
 * open and err says why.
 */
int node_attach_new(struct event_base *base, const char *path,
		    const struct node_attach_info *info, struct node_attach **out,
		    struct proto_err *err);

/*
 * slot (version slot->version, manifest digest) is the served one from now
 * on: every attached client is sent it, new acquires pin it. The caller
 * still owns slot until it hands it to node_attach_retire(). Cannot fail:
 * a client that cannot be told is dropped.
 */
void node_attach_activate(struct node_attach *at, struct node_slot *slot,
			  const uint8_t digest[32]);

/*
 * The caller stops serving slot: the server frees it (node_slot_free) now
 * if nothing pins it, else when its last pin is released. at may be NULL
 * (then slot is freed now); slot may be NULL.
 */
void node_attach_retire(struct node_attach *at, struct node_store *store,
			struct node_slot *slot);

/* One version the server holds (active, or retired and pinned): its pins
 * now and the requests that ran on it. */
struct node_attach_count {
	uint64_t version, requests;
	uint32_t pins;
};
/* Fills out with at most max held versions, newest first; returns how
 * many. at may be NULL (0). Cannot fail. */
size_t node_attach_held(const struct node_attach *at, struct node_attach_count *out, size_t max);

/*
 * In-place installs (node/agent/inplace.c). node_attach_pause: admission is
 * paused from now on (an ACQUIRE is answered "paused" and the client library
 * waits for the next VERSION, then asks again); drained(arg) is called once,
 * from the loop, when no request pins the active slot any more (soon if none
 * does). -ENOMEM: nothing changed. node_attach_evict: the drain bound
 * passed: clients still pinning the active slot are told why and closed
 * (their pins dropped); returns how many. node_attach_resume: the active
 * slot now holds slot->version (written in place): every client is sent it
 * and admission resumes. A failed install never resumes: admission stays
 * paused until a complete version is installed.
 */
int node_attach_pause(struct node_attach *at, uint64_t version, void (*drained)(void *arg),
		      void *arg);
uint32_t node_attach_evict(struct node_attach *at);
void node_attach_resume(struct node_attach *at, struct node_slot *slot, const uint8_t digest[32]);
bool node_attach_paused(const struct node_attach *at);

/* Pins held on version v across all clients; clients attached now. */
uint32_t node_attach_pins(const struct node_attach *at, uint64_t v);
uint32_t node_attach_clients(const struct node_attach *at);
/* Retired slots still alive because requests pin them. */
uint32_t node_attach_retained(const struct node_attach *at);
/* Retired slots handed to the reaper and not freed yet (attach_reap.h). */
size_t node_attach_reaping(const struct node_attach *at);
/* Reply bytes queued for clients that have not read them yet. A client
 * whose unread replies pass 64 KiB is not read until it reads them. */
size_t node_attach_queued(const struct node_attach *at);
const char *node_attach_path(const struct node_attach *at);

/* Closes every client (dropping their pins), frees every retired slot,
 * removes the socket file. The active slot stays the caller's. NULL is fine. */
void node_attach_free(struct node_attach *at);

#endif
