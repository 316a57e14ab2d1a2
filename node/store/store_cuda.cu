// CUDA runtime glue for the CUDA store: device memory, copies, IPC handles
// and a fold kernel that lets tests check a copy on the device.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

#include "node/store/store_cuda.h"

int node_cuda__fail(cudaError_t e, const char *what, char *why, size_t whylen)
{
	snprintf(why, whylen, "%s: %s", what, cudaGetErrorString(e));
	return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

extern "C" int node_cuda_probe(int *ndev, char *why, size_t whylen)
{
	cudaError_t e = cudaGetDeviceCount(ndev);
	if (e != cudaSuccess) {
		*ndev = 0;
		snprintf(why, whylen, "no CUDA device visible (%s)", cudaGetErrorString(e));
		return -ENODEV;
	}
	if (*ndev == 0) {
		snprintf(why, whylen, "no CUDA device visible");
		return -ENODEV;
	}
	return 0;
}

extern "C" int node_cuda_alloc(int dev, size_t len, void **out, char *why, size_t whylen)
{
	void *p = nullptr;
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaMalloc(&p, len ? len : 1);
	/* Zeroed: bytes between local tensors are never uploaded, and a
	 * fold of the whole buffer must match the host's zeroed memfd. The
	 * ring's stream does not wait for the default one: wait here. */
	if (e == cudaSuccess)
		e = cudaMemset(p, 0, len ? len : 1);
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(cudaStreamLegacy);
	if (e != cudaSuccess) {
		if (p != nullptr)
			cudaFree(p);
		return node_cuda__fail(e, "cudaMalloc", why, whylen);
	}
	*out = p;
	return 0;
}

extern "C" int node_cuda_upload(int dev, void *dst, const void *src, size_t len, char *why,
				size_t whylen)
{
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaMemcpy(dst, src, len, cudaMemcpyHostToDevice);
	/* From pageable memory cudaMemcpy may return before the last DMA
	 * lands: the bytes must be there for the serving process. */
	if (e == cudaSuccess)
		e = cudaStreamSynchronize(cudaStreamLegacy);
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "cudaMemcpy H2D", why, whylen);
}

extern "C" int node_cuda_download(int dev, void *dst, const void *src, size_t len, char *why,
				  size_t whylen)
{
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaMemcpy(dst, src, len, cudaMemcpyDeviceToHost);
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "cudaMemcpy D2H", why, whylen);
}

extern "C" int node_cuda_ipc_handle(void *dptr, uint8_t out[64], char *why, size_t whylen)
{
	cudaIpcMemHandle_t h;
	static_assert(sizeof(h) == 64, "CUDA IPC handles are 64 bytes");
	cudaError_t e = cudaIpcGetMemHandle(&h, dptr);
	if (e != cudaSuccess)
		return node_cuda__fail(e, "cudaIpcGetMemHandle", why, whylen);
	memcpy(out, &h, sizeof(h));
	return 0;
}

extern "C" int node_cuda_ipc_open(int dev, const uint8_t handle[64], void **out, char *why,
				  size_t whylen)
{
	cudaIpcMemHandle_t h;
	cudaError_t e = cudaSetDevice(dev);

	memcpy(&h, handle, sizeof(h));
	if (e == cudaSuccess)
		e = cudaIpcOpenMemHandle(out, h, cudaIpcMemLazyEnablePeerAccess);
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "cudaIpcOpenMemHandle", why, whylen);
}

extern "C" void node_cuda_ipc_close(void *dptr)
{
	if (dptr != nullptr)
		cudaIpcCloseMemHandle(dptr);
}

// acc ^= word_i * (2i+1) over zero-padded 8-byte words, like node_host_fold.
__global__ static void fold_kernel(const uint8_t *p, size_t len, unsigned long long *acc)
{
	unsigned long long local = 0;
	size_t nwords = (len + 7) / 8;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nwords;
	     i += (size_t)gridDim.x * blockDim.x) {
		unsigned long long w = 0;
		size_t n = len - i * 8 < 8 ? len - i * 8 : 8;
		for (size_t b = 0; b < n; b++)
			w |= (unsigned long long)p[i * 8 + b] << (8 * b);
		local ^= w * (2ull * i + 1);
	}
	atomicXor(acc, local);
}

extern "C" int node_cuda_fold(int dev, const void *dptr, size_t len, uint64_t *out, char *why,
			      size_t whylen)
{
	unsigned long long *acc = nullptr, host = 0;
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaMalloc(&acc, sizeof(*acc));
	if (e == cudaSuccess)
		e = cudaMemset(acc, 0, sizeof(*acc));
	if (e == cudaSuccess) {
		fold_kernel<<<256, 256>>>((const uint8_t *)dptr, len, acc);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpy(&host, acc, sizeof(host), cudaMemcpyDeviceToHost);
	if (acc != nullptr)
		cudaFree(acc);
	if (e != cudaSuccess)
		return node_cuda__fail(e, "fold", why, whylen);
	*out = host;
	return 0;
}

extern "C" void node_cuda_free(void *dptr)
{
	if (dptr != nullptr)
		cudaFree(dptr);
}
