/*
 * Where a node keeps serving weights: one slot per (version, rank) holding
 * the rank's local tensors back to back, as the layout lays them out.
 *
 * Slots are filled in host memory that a serving process can map (a memfd,
 * shared), then activated. The host store serves straight from that memory;
 * the CUDA store (built when nvcc exists, used when a GPU is visible) keeps a
 * device buffer per slot and exports a CUDA IPC handle of it. While a fetch
 * runs, each verified chunk is uploaded as soon as it is placed in the host
 * slot (node_slot_stream_chunk, from the verification workers, through the
 * pinned ring of node/store/store_cuda.h), so the copies overlap the network and
 * activation only waits for the stream; a slot written in place with a
 * delta's prepared changes gets the same changes scattered into its device
 * copy (node_slot_activate_patched: O(changes), not O(slot)); a slot
 * written any other way (a delta rebuilt from its parent, an anchor copied
 * in place) is uploaded whole at activation. Both sit behind
 * node_store_ops so tests run without a GPU.
 */
#ifndef NODE_STORE_H
#define NODE_STORE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/store/store_cuda.h"
#include "proto/dpatch.h"
#include "proto/plan.h"
#include "proto/util.h"

struct node_slot {
	uint64_t version;
	uint8_t *host; /* len bytes, mapped shared from memfd */
	size_t len;
	int memfd;
	void *dev;     /* device copy (CUDA store), else NULL */
	/* Uploads while fetching (CUDA store): the bytes the fetch will
	 * deliver as verified chunks and those queued so far (atomic: the
	 * verification workers add). */
	bool streaming;
	uint64_t stream_expect, streamed;
	/* What its bytes are, as its owner numbers them (0: unknown). The
	 * store keeps it on the spare slot; node_slot_new clears it. */
	uint64_t tag;
	/* No page was written through host yet (a first write to each page
	 * costs microseconds, 10 in a VM): true for a new slot; whoever
	 * writes it whole through host clears it, and the spare keeps it (a
	 * slot filled through its memfd, node/fetch/verifier.h, stays fresh). */
	bool fresh;
	/* Taken from the store's spare (pages made by an earlier version), not
	 * made new: what a node says when it activates a version. */
	bool reused;
};

struct node_store;

struct node_store_ops {
	const char *name;
	/* Prepares a slot's backing (the host part is done by the caller). */
	int (*attach)(struct node_store *s, struct node_slot *slot,
		      struct proto_err *err);
	/* Makes the slot's host bytes the served ones (device copy, handles). */
	int (*activate)(struct node_store *s, struct node_slot *slot,
			struct proto_err *err);
	/* Adds what a serving process needs to reach the slot to obj. */
	int (*describe)(struct node_store *s, const struct node_slot *slot,
			json_t *obj);
	void (*detach)(struct node_store *s, struct node_slot *slot);
	/* Queues the upload of a verified chunk placed in the host slot along
	 * spans (block offsets; src_off into buf). NULL: the store does not
	 * stream. Called from verification workers. */
	int (*upload)(struct node_store *s, struct node_slot *slot,
		      const struct proto_span *spans, size_t nspans,
		      const uint8_t *buf, size_t len, struct proto_err *err);
	/* Activation of a slot whose host bytes changed only at the changes of
	 * the n patches (written into slot->host). NULL: activate. */
	int (*activate_patched)(struct node_store *s, struct node_slot *slot,
				const struct proto_dpatch *p, size_t n, struct proto_err *err);
	void (*close)(struct node_store *s);
};

struct node_store {
	const struct node_store_ops *ops;
	int device; /* CUDA device ordinal, -1 for host */
	struct node_cuda_ring *ring; /* CUDA store: the pinned upload ring */
	struct node_cuda_scatter *scatter; /* and its scatter (made when first needed) */
	/* One freed slot kept for reuse (node_store_keep_spare): its pages
	 * are allocated and already written, which a fresh memfd's are not
	 * (a first write to each page costs microseconds, more in a VM), so
	 * a node alternating between two slots never pays for new pages.
	 * Of two freed slots the one with the larger tag is kept.
	 * Slots are freed from the attach reaper's thread too: mu guards it. */
	bool keep_spare;
	struct node_slot *spare;
	pthread_mutex_t mu;
};

/* Whether name is a store node_store_open takes (host, cuda, cuda:N, auto),
 * without opening it: 0, or -EINVAL with the reason in err. */
int node_store_name_check(const char *name, struct proto_err *err);

/*
 * Opens a store by name: "host", "cuda" or "cuda:N" for device N (fails when
 * built without CUDA or no such device is visible, err says which) or "auto" (cuda when possible, else host
 * with a log line saying why). *out is a static-lifetime store.
 */
int node_store_open(const char *name, struct node_store *out,
		    struct proto_err *err);

/* For a process serving several ranks (node/host/host.h): its index-th rank
 * takes the CUDA device index places after the one its store named, modulo
 * the visible devices (the ranks of a TP8 host on its eight GPUs). Nothing
 * for a host store. */
void node_store_spread(struct node_store *s, unsigned index);
#ifdef TESSERA_CUDA
/* node/store/store_cuda_ops.c: makes s the CUDA store on device dev (its upload
 * ring made); 0, or a negative errno with why set and s unchanged. */
int node_store_cuda_open(struct node_store *s, int dev, char *why, size_t whylen);
#endif

/* Keeps the next slot freed for reuse instead of unmapping it, until
 * node_store_close. Call before any slot is freed from another thread. */
void node_store_keep_spare(struct node_store *s);
/* Frees the spare slot, if any. The store may be opened again. */
void node_store_close(struct node_store *s);

/* Creates a slot of len bytes: a zeroed memfd mapping, or the spare slot
 * when it has that size (then its bytes are a retired version's: the
 * caller writes every byte before it serves them). On failure *out is
 * NULL and nothing is left open. The caller frees with node_slot_free. */
int node_slot_new(struct node_store *s, uint64_t version, size_t len,
		  struct node_slot **out, struct proto_err *err);
/* The same for a slot the caller fills whole through its memfd
 * (copy_file_range): a new one's pages are neither allocated nor mapped
 * yet (the host store), so the copy allocates them without clearing them
 * first; the caller maps them in after (slot->fresh). */
int node_slot_new_blank(struct node_store *s, uint64_t version, size_t len,
			struct node_slot **out, struct proto_err *err);
void node_slot_free(struct node_store *s, struct node_slot *slot);
/*
 * Has the kernel allocate and map every page of slot (MADV_POPULATE_WRITE),
 * 1 MiB a call: 0 when all are, -ENOTSUP where the kernel lacks it (before
 * Linux 5.14), -EINTR once *stop (atomic) is set, else a negative errno.
 * While *pause (atomic; NULL: never) is set it waits, as node_slot_touch.
 * Each call holds the process's address space: run it at the caller's
 * normal priority, not the lowest (see node_slot_touch).
 */
int node_slot_populate(struct node_slot *slot, const int *stop, const int *pause);
/*
 * Takes the first access from user space to each page of slot's mapping
 * now: a worker's job, ahead of the writes that would pay it (see
 * node/rebuild/slots.c, "The warm slot"). Each page is read once through
 * the mapping; after that a write to it costs what a write to any mapped
 * page does. A page the kernel has not mapped yet is faulted in by the
 * read, under the process's address-space lock: populate the slot first
 * (node_slot_populate), so that a touch at the lowest priority, preempted
 * for long on a busy machine, never holds that lock. Stops early, with
 * -EINTR, once *stop (atomic) is set; 0 when every page was touched. While
 * *pause (atomic; NULL: never) is set it touches nothing and waits, looking
 * at both flags every few ms. The bytes are left as they were (zero for a
 * new slot). Clears slot->fresh only when done: the caller does, on its
 * thread.
 */
int node_slot_touch(struct node_slot *slot, const int *stop, const int *pause);
/* The spare slot back with its bytes, if it has len bytes and tag (not 0):
 * 0, else -ENOENT and nothing changed. Its version becomes version, its
 * tag 0 (the caller writes it). */
int node_slot_reuse(struct node_store *s, uint64_t tag, uint64_t version, size_t len,
		    struct node_slot **out);
/* The spare slot back whatever it holds, if it has len bytes: 0, else
 * -ENOENT and nothing changed (node_slot_new would make a new one). */
int node_slot_take_spare(struct node_store *s, uint64_t version, size_t len,
			 struct node_slot **out);
int node_slot_activate(struct node_store *s, struct node_slot *slot,
		       struct proto_err *err);
/* In place: the n patches p (proto/dpatch.h) were written into slot->host,
 * which held their parent and is the served slot; nothing else changed.
 * Activates it as node_slot_activate does, a CUDA store by scattering those
 * changes into its device copy, which must hold the parent: each chunk's
 * checksum movement on the device is compared with the host's, and on any
 * difference or failure the slot is uploaded whole (logged). */
int node_slot_activate_patched(struct node_store *s, struct node_slot *slot,
			       const struct proto_dpatch *p, size_t n, struct proto_err *err);
/* Uploads while fetching: the fetch into slot delivers expect bytes as
 * verified chunks (node_slot_stream_chunk); activation then only waits for
 * them when they all came, and uploads the slot whole otherwise. Nothing
 * for a store that does not stream. Cannot fail. */
void node_slot_stream_begin(struct node_store *s, struct node_slot *slot, uint64_t expect);
/* Whether chunks should be handed to node_slot_stream_chunk. */
bool node_store_streams(const struct node_store *s);
/* A verified chunk: payload bytes buf[0..len) of parcel pc at payload
 * offset off, already placed in slot->host by the plan. Queues their
 * upload; on failure the slot is uploaded whole at activation (logged).
 * Called from verification workers. */
void node_slot_stream_chunk(struct node_store *s, struct node_slot *slot,
			    const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *dst, uint64_t off, const uint8_t *buf,
			    size_t len);
/* JSON for the activation record: {"store","memfd_path","size",...}. */
json_t *node_slot_describe(struct node_store *s, const struct node_slot *slot);



#endif
