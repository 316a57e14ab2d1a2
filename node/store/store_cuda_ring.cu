// The pinned upload ring of the CUDA store (see node/store/store_cuda.h): verified
// chunks are staged in pinned host entries and copied to the device on one
// stream while the network delivers the next ones.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <pthread.h>

#include "node/store/store_cuda.h"

namespace {

enum entry_state { ENTRY_FREE, ENTRY_STAGING, ENTRY_QUEUED };

struct entry {
	uint8_t *pinned; // entry_bytes of pinned host memory
	uint8_t *stage;  // entry_bytes on the device
	cudaEvent_t done; // recorded behind the entry's last work
	entry_state state;
};

} // namespace

struct node_cuda_ring {
	int dev;
	size_t entry_bytes;
	unsigned n;
	entry *e;
	cudaStream_t stream;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned next;
	int err; // first error since the last wait
	char err_why[256];
};

// Moves each span from the device staging entry to its place.
__global__ static void spans_kernel(const uint8_t *stage, const node_cuda_span *spans,
				    uint32_t nspans, uint8_t *dst)
{
	for (uint32_t s = blockIdx.x; s < nspans; s += gridDim.x) {
		const node_cuda_span sp = spans[s];
		const uint8_t *from = stage + sp.src_off;
		uint8_t *to = dst + sp.dst_off;
		if ((((uintptr_t)from | (uintptr_t)to | sp.len) & 15) == 0) {
			const uint4 *f4 = (const uint4 *)from;
			uint4 *t4 = (uint4 *)to;
			for (uint64_t i = threadIdx.x; i < sp.len / 16; i += blockDim.x)
				t4[i] = f4[i];
		} else {
			for (uint64_t i = threadIdx.x; i < sp.len; i += blockDim.x)
				to[i] = from[i];
		}
	}
}

static void ring_note(node_cuda_ring *r, int rc, const char *why)
{
	pthread_mutex_lock(&r->mu);
	if (r->err == 0) {
		r->err = rc;
		snprintf(r->err_why, sizeof(r->err_why), "%s", why);
	}
	pthread_mutex_unlock(&r->mu);
}

extern "C" void node_cuda_ring_free(node_cuda_ring *r)
{
	if (r == nullptr)
		return;
	cudaSetDevice(r->dev);
	if (r->stream != nullptr)
		cudaStreamSynchronize(r->stream);
	for (unsigned i = 0; r->e != nullptr && i < r->n; i++) {
		if (r->e[i].pinned != nullptr)
			cudaFreeHost(r->e[i].pinned);
		if (r->e[i].stage != nullptr)
			cudaFree(r->e[i].stage);
		if (r->e[i].done != nullptr)
			cudaEventDestroy(r->e[i].done);
	}
	if (r->stream != nullptr)
		cudaStreamDestroy(r->stream);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	free(r->e);
	free(r);
}

extern "C" int node_cuda_ring_new(int dev, size_t entry_bytes, unsigned nentries,
				  node_cuda_ring **out, char *why, size_t whylen)
{
	*out = nullptr;
	entry_bytes &= ~(size_t)15; // entries keep 16-byte alignment
	if (entry_bytes < 16384 || nentries == 0) {
		snprintf(why, whylen, "upload ring: %u entries of %zu bytes (want 1+ of 16 KiB+)",
			 nentries, entry_bytes);
		return -EINVAL;
	}
	node_cuda_ring *r = (node_cuda_ring *)calloc(1, sizeof(*r));
	if (r == nullptr || (r->e = (entry *)calloc(nentries, sizeof(entry))) == nullptr) {
		free(r);
		snprintf(why, whylen, "upload ring: out of memory");
		return -ENOMEM;
	}
	r->dev = dev;
	r->entry_bytes = entry_bytes;
	r->n = nentries;
	pthread_mutex_init(&r->mu, nullptr);
	pthread_cond_init(&r->cv, nullptr);
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking);
	for (unsigned i = 0; e == cudaSuccess && i < nentries; i++) {
		e = cudaHostAlloc(&r->e[i].pinned, entry_bytes, cudaHostAllocDefault);
		if (e == cudaSuccess)
			e = cudaMalloc(&r->e[i].stage, entry_bytes);
		if (e == cudaSuccess)
			e = cudaEventCreateWithFlags(&r->e[i].done, cudaEventDisableTiming);
	}
	if (e != cudaSuccess) {
		int rc = node_cuda__fail(e, "upload ring", why, whylen);
		node_cuda_ring_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

// The next entry, waited for (its previous work done) and marked staging.
static int claim(node_cuda_ring *r, entry **out, char *why, size_t whylen)
{
	pthread_mutex_lock(&r->mu);
	while (r->e[r->next].state == ENTRY_STAGING)
		pthread_cond_wait(&r->cv, &r->mu);
	entry *en = &r->e[r->next];
	bool queued = en->state == ENTRY_QUEUED;
	en->state = ENTRY_STAGING;
	r->next = (r->next + 1) % r->n;
	pthread_mutex_unlock(&r->mu);
	cudaError_t e = queued ? cudaEventSynchronize(en->done) : cudaSuccess;
	*out = en;
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "upload ring: waiting for an entry", why, whylen);
}

static void unclaim(node_cuda_ring *r, entry *en, bool queued)
{
	pthread_mutex_lock(&r->mu);
	en->state = queued ? ENTRY_QUEUED : ENTRY_FREE;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

// An entry holds packed span bytes in front and, in its last TABLE_BYTES,
// the table of the spans they came from (moved to their places on the device).
#define TABLE_SPANS 256u
#define TABLE_BYTES (TABLE_SPANS * sizeof(node_cuda_span))

// Stages and queues spans[0..n) (src_off: offsets into buf).
static int send_entry(node_cuda_ring *r, entry *en, uint8_t *dst, const node_cuda_span *spans,
		      uint32_t n, const uint8_t *buf, char *why, size_t whylen)
{
	const size_t room = r->entry_bytes - TABLE_BYTES;
	node_cuda_span *t = (node_cuda_span *)(en->pinned + room);
	uint64_t at = 0;
	cudaError_t e;

	for (uint32_t i = 0; i < n; i++) {
		at = (at + 15) & ~(uint64_t)15; // the kernel's 16-byte copies
		memcpy(en->pinned + at, buf + spans[i].src_off, spans[i].len);
		t[i] = node_cuda_span{spans[i].dst_off, at, spans[i].len};
		at += spans[i].len;
	}
	if (n == 1) { // straight to its place
		e = cudaMemcpyAsync(dst + spans[0].dst_off, en->pinned, spans[0].len,
				    cudaMemcpyHostToDevice, r->stream);
	} else {
		e = cudaMemcpyAsync(en->stage, en->pinned, at, cudaMemcpyHostToDevice, r->stream);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(en->stage + room, t, n * sizeof(*t),
					    cudaMemcpyHostToDevice, r->stream);
		if (e == cudaSuccess) {
			spans_kernel<<<n, 256, 0, r->stream>>>(
				en->stage, (const node_cuda_span *)(en->stage + room), n, dst);
			e = cudaGetLastError();
		}
	}
	if (e == cudaSuccess)
		e = cudaEventRecord(en->done, r->stream);
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "upload ring: queueing a copy", why, whylen);
}

extern "C" int node_cuda_ring_put(node_cuda_ring *r, void *dst, const node_cuda_span *spans,
				  uint32_t nspans, const void *buf, size_t len, char *why,
				  size_t whylen)
{
	const size_t room = r->entry_bytes - TABLE_BYTES;
	node_cuda_span part[TABLE_SPANS];
	uint32_t i = 0;
	uint64_t in = 0; // bytes of spans[i] already sent
	int rc = 0;

	for (uint32_t k = 0; k < nspans; k++) {
		if (spans[k].src_off > len || spans[k].len > len - spans[k].src_off) {
			snprintf(why, whylen, "upload ring: span %u outside the %zu staged bytes", k, len);
			ring_note(r, -EINVAL, why);
			return -EINVAL;
		}
	}
	cudaError_t e = cudaSetDevice(r->dev);
	if (e != cudaSuccess)
		return node_cuda__fail(e, "cudaSetDevice", why, whylen);
	while (rc == 0) {
		// The next entry's worth: whole spans while they fit, then a
		// part of the next one.
		uint32_t n = 0;
		uint64_t bytes = 0;
		while (i < nspans && n < TABLE_SPANS && bytes < room) {
			bytes = (bytes + 15) & ~(uint64_t)15; // as send_entry packs them
			if (bytes >= room)
				break;
			uint64_t take = spans[i].len - in;
			if (take > room - bytes)
				take = room - bytes;
			if (take > 0)
				part[n++] = node_cuda_span{spans[i].dst_off + in, spans[i].src_off + in, take};
			bytes += take;
			in += take;
			if (in == spans[i].len) {
				i++;
				in = 0;
			}
		}
		if (n == 0)
			break;
		entry *en;
		rc = claim(r, &en, why, whylen);
		if (rc == 0)
			rc = send_entry(r, en, (uint8_t *)dst, part, n, (const uint8_t *)buf, why, whylen);
		unclaim(r, en, rc == 0);
	}
	if (rc != 0)
		ring_note(r, rc, why);
	return rc;
}

extern "C" int node_cuda_ring_wait(node_cuda_ring *r, char *why, size_t whylen)
{
	cudaError_t e = cudaSetDevice(r->dev);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(r->stream);
	if (e != cudaSuccess)
		ring_note(r, node_cuda__fail(e, "upload ring: stream", why, whylen), why);
	pthread_mutex_lock(&r->mu);
	int rc = r->err;
	if (rc != 0)
		snprintf(why, whylen, "%s", r->err_why);
	r->err = 0;
	pthread_mutex_unlock(&r->mu);
	return rc;
}
