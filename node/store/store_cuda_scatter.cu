// Deltas on the device (see node/store/store_cuda.h): a scatter kernel that
// applies (position, new value) changes and folds them into the piece's
// position-weighted checksum, and that checksum of a whole device piece.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "node/store/store_cuda.h"
#include "proto/wsum.h"

#define P ((unsigned long long)PROTO_WSUM_P)
#define THREADS 256

struct node_cuda_scatter {
	int dev;
	uint64_t batch;
	uint64_t *pos_h, *pos_d;         // batch positions, pinned / device
	uint8_t *vals_h, *vals_d;        // batch values of up to 8 bytes
	unsigned long long *acc_d, *acc_h; // the two sums (A, B)
	cudaStream_t stream;
};

__device__ static unsigned long long load(const uint8_t *p, unsigned elsize)
{
	unsigned long long x = 0;
	switch (elsize) {
	case 1: return *p;
	case 2: if (((uintptr_t)p & 1) == 0) return *(const uint16_t *)p; break;
	case 4: if (((uintptr_t)p & 3) == 0) return *(const uint32_t *)p; break;
	default: if (((uintptr_t)p & 7) == 0) return *(const unsigned long long *)p; break;
	}
	for (unsigned b = 0; b < elsize; b++)
		x |= (unsigned long long)p[b] << (8 * b);
	return x;
}

__device__ static void store(uint8_t *p, unsigned elsize, unsigned long long x)
{
	switch (elsize) {
	case 1: *p = (uint8_t)x; return;
	case 2: if (((uintptr_t)p & 1) == 0) { *(uint16_t *)p = (uint16_t)x; return; } break;
	case 4: if (((uintptr_t)p & 3) == 0) { *(uint32_t *)p = (uint32_t)x; return; } break;
	default: if (((uintptr_t)p & 7) == 0) { *(unsigned long long *)p = x; return; } break;
	}
	for (unsigned b = 0; b < elsize; b++)
		p[b] = (uint8_t)(x >> (8 * b));
}

// Adds a block's (a, b), each below p, into acc[0], acc[1]: fewer than 2^32
// blocks' worth can never wrap the 64-bit sums.
__device__ static void block_add(unsigned long long a, unsigned long long b,
				 unsigned long long *acc)
{
	__shared__ unsigned long long sa[THREADS], sb[THREADS];
	sa[threadIdx.x] = a;
	sb[threadIdx.x] = b;
	__syncthreads();
	for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
		if (threadIdx.x < s) {
			sa[threadIdx.x] = (sa[threadIdx.x] + sa[threadIdx.x + s]) % P;
			sb[threadIdx.x] = (sb[threadIdx.x] + sb[threadIdx.x + s]) % P;
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		atomicAdd(&acc[0], sa[0]);
		atomicAdd(&acc[1], sb[0]);
	}
}

__global__ static void scatter_kernel(uint8_t *piece, unsigned elsize, const uint64_t *pos,
				      const uint8_t *vals, uint64_t n, unsigned long long *acc)
{
	unsigned long long a = 0, b = 0;
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		uint8_t *at = piece + pos[i] * elsize;
		unsigned long long old = load(at, elsize), nu = load(vals + i * elsize, elsize);
		store(at, elsize, nu);
		unsigned long long d = (nu % P + P - old % P) % P;
		a = (a + d) % P;
		b = (b + ((pos[i] + 1) % P) * d % P) % P;
	}
	block_add(a, b, acc);
}

__global__ static void wsum_kernel(const uint8_t *piece, unsigned elsize, uint64_t nelem,
				   unsigned long long *acc)
{
	unsigned long long a = 0, b = 0;
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < nelem;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		unsigned long long v = load(piece + i * elsize, elsize) % P;
		a = (a + v) % P;
		b = (b + ((i + 1) % P) * v % P) % P;
	}
	block_add(a, b, acc);
}

extern "C" void node_cuda_scatter_free(node_cuda_scatter *sc)
{
	if (sc == nullptr)
		return;
	cudaSetDevice(sc->dev);
	if (sc->stream != nullptr) {
		cudaStreamSynchronize(sc->stream);
		cudaStreamDestroy(sc->stream);
	}
	cudaFreeHost(sc->pos_h);
	cudaFreeHost(sc->vals_h);
	cudaFreeHost(sc->acc_h);
	cudaFree(sc->pos_d);
	cudaFree(sc->vals_d);
	cudaFree(sc->acc_d);
	free(sc);
}

extern "C" int node_cuda_scatter_new(int dev, uint64_t batch, node_cuda_scatter **out, char *why,
				     size_t whylen)
{
	*out = nullptr;
	if (batch == 0 || batch > (1ull << 32)) {
		snprintf(why, whylen, "scatter: batch of %llu changes (want 1 to 2^32)",
			 (unsigned long long)batch);
		return -EINVAL;
	}
	node_cuda_scatter *sc = (node_cuda_scatter *)calloc(1, sizeof(*sc));
	if (sc == nullptr) {
		snprintf(why, whylen, "scatter: out of memory");
		return -ENOMEM;
	}
	sc->dev = dev;
	sc->batch = batch;
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&sc->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaHostAlloc(&sc->pos_h, batch * 8, cudaHostAllocDefault);
	if (e == cudaSuccess)
		e = cudaHostAlloc(&sc->vals_h, batch * 8, cudaHostAllocDefault);
	if (e == cudaSuccess)
		e = cudaHostAlloc(&sc->acc_h, 2 * sizeof(*sc->acc_h), cudaHostAllocDefault);
	if (e == cudaSuccess)
		e = cudaMalloc(&sc->pos_d, batch * 8);
	if (e == cudaSuccess)
		e = cudaMalloc(&sc->vals_d, batch * 8);
	if (e == cudaSuccess)
		e = cudaMalloc(&sc->acc_d, 2 * sizeof(*sc->acc_d));
	if (e != cudaSuccess) {
		int rc = node_cuda__fail(e, "scatter", why, whylen);
		node_cuda_scatter_free(sc);
		return rc;
	}
	*out = sc;
	return 0;
}

static unsigned grid_for(uint64_t n)
{
	uint64_t g = (n + THREADS - 1) / THREADS;
	return g == 0 ? 1 : g > 4096 ? 4096 : (unsigned)g;
}

// Reads the two sums the kernels added up as B << 32 | A.
static uint64_t sums_of(const unsigned long long *acc)
{
	return (uint64_t)(acc[1] % P) << 32 | (uint64_t)(acc[0] % P);
}

// Both position widths: 64-bit positions are copied to the pinned buffer
// as they are, 32-bit ones (a prepared in-place patch's) widened on the way.
template <typename Pos>
static int scatter_apply(node_cuda_scatter *sc, void *dptr, uint64_t nelem, unsigned elsize,
			 const Pos *pos, const void *vals, uint64_t n, uint64_t *delta, char *why,
			 size_t whylen)
{
	if (elsize != 1 && elsize != 2 && elsize != 4 && elsize != 8) {
		snprintf(why, whylen, "scatter: element size %u (want 1, 2, 4 or 8)", elsize);
		return -EINVAL;
	}
	// Every position checked before anything is written: the changes
	// come from a delta, and a refused one must leave the piece as it was.
	for (uint64_t i = 0; i < n; i++) {
		if (pos[i] >= nelem || (i > 0 && pos[i] <= pos[i - 1])) {
			snprintf(why, whylen,
				 "scatter: change %llu at position %llu (%s; the piece has %llu elements)",
				 (unsigned long long)i, (unsigned long long)pos[i],
				 pos[i] >= nelem ? "outside the piece" : "not after the one before",
				 (unsigned long long)nelem);
			return -EINVAL;
		}
	}
	// Each batch's sums come back and are reduced mod p here, so no
	// number of batches can wrap the device's 64-bit accumulators.
	unsigned long long a = 0, b = 0;
	cudaError_t e = cudaSetDevice(sc->dev);
	for (uint64_t at = 0; at < n && e == cudaSuccess; at += sc->batch) {
		uint64_t k = n - at < sc->batch ? n - at : sc->batch;
		if (sizeof(Pos) == 8)
			memcpy(sc->pos_h, pos + at, k * 8);
		else
			for (uint64_t i = 0; i < k; i++)
				sc->pos_h[i] = pos[at + i];
		memcpy(sc->vals_h, (const uint8_t *)vals + at * elsize, k * elsize);
		e = cudaMemsetAsync(sc->acc_d, 0, 2 * sizeof(*sc->acc_d), sc->stream);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(sc->pos_d, sc->pos_h, k * 8, cudaMemcpyHostToDevice,
					    sc->stream);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(sc->vals_d, sc->vals_h, k * elsize, cudaMemcpyHostToDevice,
					    sc->stream);
		if (e == cudaSuccess) {
			scatter_kernel<<<grid_for(k), THREADS, 0, sc->stream>>>(
				(uint8_t *)dptr, elsize, sc->pos_d, sc->vals_d, k, sc->acc_d);
			e = cudaGetLastError();
		}
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(sc->acc_h, sc->acc_d, 2 * sizeof(*sc->acc_h),
					    cudaMemcpyDeviceToHost, sc->stream);
		// The pinned buffers are reused by the next batch.
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(sc->stream);
		a = (a + sc->acc_h[0] % P) % P;
		b = (b + sc->acc_h[1] % P) % P;
	}
	if (e != cudaSuccess)
		return node_cuda__fail(e, "scatter", why, whylen);
	*delta = (uint64_t)b << 32 | (uint64_t)a;
	return 0;
}

extern "C" int node_cuda_scatter_apply(node_cuda_scatter *sc, void *dptr, uint64_t nelem,
				       unsigned elsize, const uint64_t *pos, const void *vals,
				       uint64_t n, uint64_t *delta, char *why, size_t whylen)
{
	return scatter_apply(sc, dptr, nelem, elsize, pos, vals, n, delta, why, whylen);
}

extern "C" int node_cuda_scatter_apply32(node_cuda_scatter *sc, void *dptr, uint64_t nelem,
					 unsigned elsize, const uint32_t *pos, const void *vals,
					 uint64_t n, uint64_t *delta, char *why, size_t whylen)
{
	return scatter_apply(sc, dptr, nelem, elsize, pos, vals, n, delta, why, whylen);
}

extern "C" int node_cuda_wsum(int dev, const void *dptr, unsigned elsize, uint64_t nelem,
			      uint64_t *out, char *why, size_t whylen)
{
	unsigned long long *acc = nullptr, host[2] = {0, 0};

	if (elsize != 1 && elsize != 2 && elsize != 4 && elsize != 8) {
		snprintf(why, whylen, "wsum: element size %u (want 1, 2, 4 or 8)", elsize);
		return -EINVAL;
	}
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaMalloc(&acc, sizeof(host));
	if (e == cudaSuccess)
		e = cudaMemset(acc, 0, sizeof(host));
	if (e == cudaSuccess) {
		wsum_kernel<<<grid_for(nelem), THREADS>>>((const uint8_t *)dptr, elsize, nelem, acc);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpy(host, acc, sizeof(host), cudaMemcpyDeviceToHost);
	if (acc != nullptr)
		cudaFree(acc);
	if (e != cudaSuccess)
		return node_cuda__fail(e, "wsum", why, whylen);
	*out = sums_of(host);
	return 0;
}
