/*
 * Chunk verification off the event loop: worker threads hash each fetched
 * chunk against its manifest hash and, when it matches, scatter it into the
 * version slot; the loop learns of finished jobs through an eventfd and runs
 * the done callback there. The event loop owns all agent state; workers touch
 * only the job's buffer and its (disjoint) destination range.
 */
#ifndef NODE_VERIFIER_H
#define NODE_VERIFIER_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "proto/plan.h"

struct node_vjob {
	/* in: the bytes, the hash they must have, where they go */
	const uint8_t *buf;
	size_t len;
	const uint8_t *hash;
	const struct proto_plan *plan;
	const struct proto_parcel *parcel;
	const struct proto_layout *layout;
	uint8_t *dst;  /* the destination rank's block; with parcel NULL, a
			* buffer the bytes are copied into at off */
	/* by_fd: dst maps dst_fd from offset 0 (a slot's memfd), and the
	 * scatter writes through the file (pwrite) rather than the mapping.
	 * The kernel's copy goes through its own mapping of the pages: on a
	 * fresh slot, the first write to each page through ours cost about
	 * 10 us in a VM (0.35 s of CPU per 128 MiB, 15 times the copy). */
	bool by_fd;
	int dst_fd;
	uint64_t off;  /* payload offset of buf inside the parcel */
	uint8_t *keep; /* not NULL: verified bytes are also copied here (served to peers) */
	/* Not NULL: called on the worker once the bytes were scattered (the
	 * CUDA store queues their upload). */
	void (*placed)(struct node_vjob *job, void *arg);
	void *placed_arg;
	/* out */
	bool ok;       /* hash matched and the bytes were scattered */
	struct node_vjob *next_; /* private */
};

struct node_verifier;

/* Workers a node's verifier runs: TESSERA_VERIFY_THREADS, or when that is 0
 * two where the machine has two cores or more, else one. Hashing a chunk
 * takes a few milliseconds of one core; two workers keep a chunk that lands
 * while another is hashed from waiting behind it. Cannot fail. */
unsigned node_verifier_threads(void);
/* What the workers are called (their comm, as /proc and perf show it). */
#define NODE_VERIFIER_THREAD_NAME "tessera-verify"

/* Starts nthreads workers; done(job, arg) runs on base's loop for each
 * finished job. NULL on failure (nothing started). */
struct node_verifier *node_verifier_new(struct event_base *base, unsigned nthreads,
					void (*done)(struct node_vjob *job, void *arg),
					void *arg);
/* Queues a job; the caller keeps it (and what it points to) alive until done
 * runs for it or node_verifier_drain returns. Cannot fail. */
void node_verifier_submit(struct node_verifier *v, struct node_vjob *job);
/* Blocks until no worker is touching any job; queued jobs are finished
 * first. Their done callbacks still run later, from the loop. */
void node_verifier_drain(struct node_verifier *v);
/* Drains, stops the workers, drops undelivered results. NULL is fine. */
void node_verifier_free(struct node_verifier *v);

#endif
