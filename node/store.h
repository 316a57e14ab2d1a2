/*
 * Where a node keeps serving weights: one slot per (version, rank) holding
 * the rank's local tensors back to back, as the layout lays them out.
 *
 * Slots are filled in host memory that a serving process can map (a memfd,
 * shared), then activated. The host store serves straight from that memory;
 * the CUDA store (built when nvcc exists, used when a GPU is visible) copies
 * the slot into GPU memory at activation and exports a CUDA IPC handle.
 * Both sit behind node_store_ops so tests run without a GPU.
 */
#ifndef NODE_STORE_H
#define NODE_STORE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/util.h"

struct node_slot {
	uint64_t version;
	uint8_t *host; /* len bytes, mapped shared from memfd */
	size_t len;
	int memfd;
	void *dev;     /* device copy (CUDA store), else NULL */
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
};

struct node_store {
	const struct node_store_ops *ops;
	int device; /* CUDA device ordinal, -1 for host */
	/* One freed slot kept for reuse (node_store_keep_spare): its pages
	 * are allocated and already written, which a fresh memfd's are not
	 * (a first write to each page costs microseconds, more in a VM), so
	 * a node alternating between two slots never pays for new pages.
	 * Slots are freed from the attach reaper's thread too: mu guards it. */
	bool keep_spare;
	struct node_slot *spare;
	pthread_mutex_t mu;
};

/*
 * Opens a store by name: "host", "cuda" (fails when built without CUDA or no
 * device is visible, err says which) or "auto" (cuda when possible, else host
 * with a log line saying why). *out is a static-lifetime store.
 */
int node_store_open(const char *name, struct node_store *out,
		    struct proto_err *err);

/* For a process serving several ranks (node/host.h): its index-th rank
 * takes CUDA device index modulo the visible devices (the ranks of a TP8
 * host on its eight GPUs). Nothing for a host store. */
void node_store_spread(struct node_store *s, unsigned index);

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
void node_slot_free(struct node_store *s, struct node_slot *slot);
int node_slot_activate(struct node_store *s, struct node_slot *slot,
		       struct proto_err *err);
/* JSON for the activation record: {"store","memfd_path","size",...}. */
json_t *node_slot_describe(struct node_store *s, const struct node_slot *slot);

#ifdef TESSERA_CUDA
/* CUDA runtime glue, in node/store_cuda.cu (C linkage). All return 0 or a
 * negative errno and write a one-line reason into why. */
int node_cuda_probe(int *ndev, char *why, size_t whylen);
int node_cuda_alloc(int dev, size_t len, void **out, char *why, size_t whylen);
int node_cuda_upload(int dev, void *dst, const void *src, size_t len,
		     char *why, size_t whylen);
int node_cuda_ipc_handle(void *dptr, uint8_t out[64], char *why, size_t whylen);
/* Order-independent 64-bit fold of a device buffer, for checking copies. */
int node_cuda_fold(int dev, const void *dptr, size_t len, uint64_t *out,
		   char *why, size_t whylen);
void node_cuda_free(void *dptr);
#endif

/* The same fold on host memory: XOR over words w_i * (2i+1) of the
 * zero-padded 8-byte words. */
uint64_t node_host_fold(const void *buf, size_t len);

#endif
