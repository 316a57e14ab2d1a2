/*
 * The CUDA side of the node's store: device buffers, the pinned upload ring,
 * the scatter kernel, IPC handles and BLAKE3 chunk hashes of device bytes.
 * Plain C over the CUDA runtime alone (no other library, no jansson, no
 * BLAKE3 library), so that tests/gpu/gpu_check.c builds it
 * into a self-contained binary for a GPU machine without tessera's
 * dependencies. Defined in node/store_cuda*.cu (only when nvcc exists).
 *
 * Uploads while fetching. A verified chunk is a stretch of a parcel's
 * payload whose bytes land at several places (spans) of the destination
 * block. node_cuda_ring_put copies the chunk into the next entry of a ring
 * of pinned host buffers, with its span table behind it, and queues on the
 * ring's stream one host-to-device copy of the entry and one kernel that
 * moves each span to its place in the device buffer (a single span is
 * copied straight to its place, no kernel). put returns as soon as the bytes
 * are staged, so the worker that verified the chunk goes on hashing the next
 * one while the copy engine works: uploads overlap the network. An entry is
 * reused only after the event recorded behind its work has fired.
 * node_cuda_ring_wait (activation) waits for the stream and returns the
 * first error any put met since the last wait.
 *
 * Scatter (deltas on the device). node_cuda_scatter_apply applies n changes
 * (element position, new bit pattern) to a device piece of nelem elements
 * of elsize bytes. Positions must be strictly increasing (the delta codec
 * emits them so) and below nelem; a batch that breaks either is refused
 * before anything is written. The kernel reads each old value before it
 * writes the new one and folds d = (new - old) mod p into the piece's
 * position-weighted checksum (proto/wsum.h): it returns the checksum of the
 * difference vector, which the host combines with the parent's checksum
 * (proto_wsum_combine(parent, 0, delta)) and compares with the child's, as
 * the CPU apply does; node_cuda_wsum computes a whole piece's checksum on
 * the device (the parent's, taken from the block as the CPU path does).
 *
 * Every int function returns 0 or a negative errno and writes a one-line
 * reason into why.
 */
#ifndef NODE_STORE_CUDA_H
#define NODE_STORE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int node_cuda_probe(int *ndev, char *why, size_t whylen);
/* A zeroed device buffer of len bytes (1 when len is 0). */
int node_cuda_alloc(int dev, size_t len, void **out, char *why, size_t whylen);
void node_cuda_free(void *dptr);
/* Synchronous copies, host to device and device to host. */
int node_cuda_upload(int dev, void *dst, const void *src, size_t len,
		     char *why, size_t whylen);
int node_cuda_download(int dev, void *dst, const void *src, size_t len,
		       char *why, size_t whylen);
/* The 64-byte cudaIpcMemHandle_t of a cudaMalloc'ed buffer. */
int node_cuda_ipc_handle(void *dptr, uint8_t out[64], char *why, size_t whylen);
/* Opens another process's handle on dev (a serving process does this with
 * the handle the attach reply carries); close with node_cuda_ipc_close. */
int node_cuda_ipc_open(int dev, const uint8_t handle[64], void **out,
		       char *why, size_t whylen);
void node_cuda_ipc_close(void *dptr);
/* Order-independent 64-bit fold of a device buffer, equal to
 * node_host_fold of the same bytes: for checking copies. */
int node_cuda_fold(int dev, const void *dptr, size_t len, uint64_t *out,
		   char *why, size_t whylen);

/* ---- the pinned upload ring ---- */

/* Where len bytes of a staged buffer go: buf[src_off..) to dst + dst_off. */
struct node_cuda_span {
	uint64_t dst_off;
	uint64_t src_off;
	uint64_t len;
};

struct node_cuda_ring;

/* A ring of nentries pinned entries of entry_bytes each (at least 16 KiB)
 * and its stream on dev. On failure *out is NULL and nothing is held. */
int node_cuda_ring_new(int dev, size_t entry_bytes, unsigned nentries,
		       struct node_cuda_ring **out, char *why, size_t whylen);
/* Queues the upload of buf[0..len) to dst along spans (each inside buf and
 * inside the caller's device buffer; not overlapping in dst); bytes larger
 * than an entry are cut over several. Returns once buf may be reused.
 * Thread-safe: verification workers call it concurrently. */
int node_cuda_ring_put(struct node_cuda_ring *r, void *dst, const struct node_cuda_span *spans,
		       uint32_t nspans, const void *buf, size_t len, char *why, size_t whylen);
/* Waits until everything queued has reached the device; the first error of
 * a put or of the stream since the last wait (then forgotten), else 0. */
int node_cuda_ring_wait(struct node_cuda_ring *r, char *why, size_t whylen);
/* Waits for the stream, frees everything. NULL is fine. */
void node_cuda_ring_free(struct node_cuda_ring *r);

/* ---- scatter and checksums on the device ---- */

struct node_cuda_scatter;

/* Pinned and device room for batches of up to batch changes (of up to 8
 * bytes each) on dev. On failure *out is NULL. */
int node_cuda_scatter_new(int dev, uint64_t batch, struct node_cuda_scatter **out,
			  char *why, size_t whylen);
void node_cuda_scatter_free(struct node_cuda_scatter *sc);
/* Applies n changes to the piece at dptr (nelem elements of elsize = 1, 2,
 * 4 or 8 bytes): element pos[i] becomes the elsize-byte little-endian
 * pattern vals[i] (vals packed, elsize bytes each). *delta gets the wsum of
 * the difference vector. -EINVAL (nothing written) for positions not
 * strictly increasing or not below nelem, or a bad elsize. Batches larger
 * than the context's go through it in turns. Synchronous. */
int node_cuda_scatter_apply(struct node_cuda_scatter *sc, void *dptr, uint64_t nelem,
			    unsigned elsize, const uint64_t *pos, const void *vals, uint64_t n,
			    uint64_t *delta, char *why, size_t whylen);
/* The same with 32-bit positions (an in-place patch's chunk, proto/dpatch.h). */
int node_cuda_scatter_apply32(struct node_cuda_scatter *sc, void *dptr, uint64_t nelem,
			      unsigned elsize, const uint32_t *pos, const void *vals, uint64_t n,
			      uint64_t *delta, char *why, size_t whylen);
/* The wsum (proto/wsum.h) of nelem elements of elsize bytes at dptr. */
int node_cuda_wsum(int dev, const void *dptr, unsigned elsize, uint64_t nelem, uint64_t *out,
		   char *why, size_t whylen);

/* ---- BLAKE3 on the device (store_cuda_blake3.cu) ---- */

/* Chunk hashes of bytes already in device memory (a fabric that reads into
 * device memory, FI_HMEM, never shows them to the CPU): each chunk's plain
 * unkeyed 32-byte BLAKE3, equal to proto_chunk_hash of the same bytes. One
 * thread block per chunk, a thread per 1 KiB BLAKE3 leaf, the tree reduced
 * in shared memory; any chunk length works (0 too: the empty input's
 * hash), 128 KiB and less fastest. */
struct node_cuda_blake3;

/* Pinned and device room for the digests of up to batch chunks, and a
 * stream, on dev. On failure *out is NULL. */
int node_cuda_blake3_new(int dev, uint64_t batch, struct node_cuda_blake3 **out, char *why,
			 size_t whylen);
void node_cuda_blake3_free(struct node_cuda_blake3 *b);
/* How many chunks len bytes cut into chunk-byte chunks make: the last one
 * shorter, and one (empty) chunk when len is 0. */
uint64_t node_cuda_blake3_count(uint64_t len, uint64_t chunk);
/* out[i] = BLAKE3 of chunk i of the len device bytes at dptr cut into
 * chunks of chunk bytes (node_cuda_blake3_count of them; out in host
 * memory). More chunks than the batch go through in turns. Synchronous. */
int node_cuda_blake3_chunks(struct node_cuda_blake3 *b, const void *dptr, uint64_t len,
			    uint64_t chunk, uint8_t (*out)[32], char *why, size_t whylen);
/* Hashes the same chunks and compares with want[i]: the number of chunks
 * whose hash differs (0: all verified; why names the first otherwise), or
 * a negative errno. bad (NULL or one byte per chunk) gets 1 where chunk i
 * differs, else 0. */
int node_cuda_blake3_verify(struct node_cuda_blake3 *b, const void *dptr, uint64_t len,
			    uint64_t chunk, const uint8_t (*want)[32], uint8_t *bad, char *why,
			    size_t whylen);
/* The kernel alone, queued on stream (a cudaStream_t; NULL: the legacy
 * default stream) of the current device: out[i] = BLAKE3 of
 * dptr[offs[i] .. offs[i] + lens[i]). offs, lens and out are device
 * memory. Returns the launch's error; the run's surfaces on the stream. */
int node_cuda_blake3_launch(const void *dptr, const uint64_t *offs, const uint64_t *lens,
			    uint64_t n, uint8_t (*out)[32], void *stream, char *why, size_t whylen);
/* The kernel's own steps (leaves, levels, the stack of subtrees) run on
 * the CPU, thread by thread: the BLAKE3 of len host bytes. Lets tests
 * check the kernel's tree logic where no device is visible. */
void node_cuda_blake3_host(const void *buf, uint64_t len, uint8_t out[32]);
/* The device's memory bandwidth in bytes/s: the peak its memory clock
 * and bus width give (0 when the device does not say), and the rate a
 * device-to-device cudaMemcpy of len bytes reaches, counting each byte
 * read and written (median of 5). */
int node_cuda_mem_bandwidth(int dev, size_t len, double *peak, double *copy, char *why,
			    size_t whylen);

#ifdef __cplusplus
}
#endif

/* The host's fold (node/store/store_fold.c, built with or without CUDA): XOR over
 * words w_i * (2i+1) of the zero-padded 8-byte words. */
#ifdef __cplusplus
extern "C"
#endif
uint64_t node_host_fold(const void *buf, size_t len);

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* Writes "what: CUDA's reason" into why; -ENOMEM or -EIO. */
int node_cuda__fail(cudaError_t e, const char *what, char *why, size_t whylen);
#endif

#endif
