// BLAKE3 on the device (see node/store/store_cuda.h): the chunk hash of
// bytes already in device memory, written from the BLAKE3 specification.
//
// BLAKE3 in brief: the input is cut into 1 KiB leaves (the specification's
// "chunks"; here "leaves", a tessera chunk being up to 128 of them), each
// compressed block by block (16 blocks of 64 bytes, the last one
// zero-padded, its length given) into an 8-word chaining value; the first
// block of a leaf carries CHUNK_START, the last CHUNK_END, and every
// compression of a leaf its index as the counter. Chaining values are then
// joined pairwise by parent compressions (key words as the chaining value,
// the two children as the block, counter 0, PARENT) into a left-complete
// binary tree: pairing neighbours level by level, an odd one out moved up
// unchanged, builds exactly that tree. The last compression (the top
// parent, or the single leaf's last block) carries ROOT and its first 8
// output words are the 32-byte hash. The empty input is one leaf of one
// empty block.
//
// The kernel: one thread block of LEAVES threads per tessera chunk, each
// thread compressing one leaf (its 64-byte blocks loaded as four uint4
// when aligned), then the LEAVES chaining values reduced level by level in
// shared memory. A chunk of more than LEAVES leaves is taken LEAVES leaves
// at a time: each full group is a complete subtree whose value goes onto a
// stack merged as the reference's incremental hasher merges it, and the
// last group's value is joined with the stack from the right at the end.
//
// The leaf, level and stack steps are __host__ __device__:
// node_cuda_blake3_host runs the very same steps on the CPU, thread by
// thread, so that tests check the tree logic on machines without a GPU.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "node/store/store_cuda.h"

#define LEAVES 128     // threads per block: leaves per group (a 128 KiB chunk is one)
#define LEAF 1024      // BLAKE3's chunk
#define BLOCK 64
#define STACK 54       // subtrees of 2^7 leaves: enough for 2^64 bytes

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

__host__ __device__ static inline uint32_t iv(int i)
{
	// The key words of the unkeyed hash: SHA-256's initial value.
	switch (i) {
	case 0: return 0x6A09E667u;
	case 1: return 0xBB67AE85u;
	case 2: return 0x3C6EF372u;
	case 3: return 0xA54FF53Au;
	case 4: return 0x510E527Fu;
	case 5: return 0x9B05688Cu;
	case 6: return 0x1F83D9ABu;
	default: return 0x5BE0CD19u;
	}
}

__host__ __device__ static inline uint32_t rotr(uint32_t x, int n)
{
	return x >> n | x << (32 - n);
}

// The quarter-round on state words a, b, c, d with message words x, y.
#define G(a, b, c, d, x, y)                              \
	do {                                             \
		v[a] = v[a] + v[b] + (x);                \
		v[d] = rotr(v[d] ^ v[a], 16);            \
		v[c] = v[c] + v[d];                      \
		v[b] = rotr(v[b] ^ v[c], 12);            \
		v[a] = v[a] + v[b] + (y);                \
		v[d] = rotr(v[d] ^ v[a], 8);             \
		v[c] = v[c] + v[d];                      \
		v[b] = rotr(v[b] ^ v[c], 7);             \
	} while (0)

// One round: the columns, then the diagonals.
__host__ __device__ static inline void round_fn(uint32_t v[16], const uint32_t m[16])
{
	G(0, 4, 8, 12, m[0], m[1]);
	G(1, 5, 9, 13, m[2], m[3]);
	G(2, 6, 10, 14, m[4], m[5]);
	G(3, 7, 11, 15, m[6], m[7]);
	G(0, 5, 10, 15, m[8], m[9]);
	G(1, 6, 11, 12, m[10], m[11]);
	G(2, 7, 8, 13, m[12], m[13]);
	G(3, 4, 9, 14, m[14], m[15]);
}

// The message permutation between rounds (word i takes word P[i], P =
// 2 6 3 10 7 0 4 13 1 11 12 5 9 14 15 8); unrolled, only register names move.
__host__ __device__ static inline void permute(uint32_t m[16])
{
	uint32_t t[16];
	t[0] = m[2];
	t[1] = m[6];
	t[2] = m[3];
	t[3] = m[10];
	t[4] = m[7];
	t[5] = m[0];
	t[6] = m[4];
	t[7] = m[13];
	t[8] = m[1];
	t[9] = m[11];
	t[10] = m[12];
	t[11] = m[5];
	t[12] = m[9];
	t[13] = m[14];
	t[14] = m[15];
	t[15] = m[8];
	for (int i = 0; i < 16; i++)
		m[i] = t[i];
}

// cv = the first half of the compression of block m (seven rounds; m is
// used up) under chaining value cv, counter, block length and flags.
__host__ __device__ static inline void compress(uint32_t cv[8], uint32_t m[16], uint64_t counter,
						uint32_t blen, uint32_t flags)
{
	uint32_t v[16];
	for (int i = 0; i < 8; i++)
		v[i] = cv[i];
	for (int i = 0; i < 4; i++)
		v[8 + i] = iv(i);
	v[12] = (uint32_t)counter;
	v[13] = (uint32_t)(counter >> 32);
	v[14] = blen;
	v[15] = flags;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
	for (int r = 0; r < 7; r++) {
		round_fn(v, m);
		if (r < 6)
			permute(m);
	}
	for (int i = 0; i < 8; i++)
		cv[i] = v[i] ^ v[i + 8];
}

// The 16 little-endian message words of n bytes at p (n <= 64), zero-padded.
__host__ __device__ static inline void load_block(const uint8_t *p, uint32_t n, uint32_t m[16])
{
	if (n == BLOCK && ((uintptr_t)p & 15) == 0) {
		const uint4 *q = (const uint4 *)p;
		for (int i = 0; i < 4; i++) {
#ifdef __CUDA_ARCH__
			uint4 w = __ldg(q + i);
#else
			uint4 w = q[i];
#endif
			m[4 * i] = w.x;
			m[4 * i + 1] = w.y;
			m[4 * i + 2] = w.z;
			m[4 * i + 3] = w.w;
		}
		return;
	}
	// A short or unaligned block, byte by byte; every index into m is a
	// constant once unrolled, so m stays in registers.
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
	for (uint32_t i = 0; i < 16; i++) {
		uint32_t w = 0;
		for (uint32_t k = 0; k < 4; k++)
			if (4 * i + k < n)
				w |= (uint32_t)p[4 * i + k] << (8 * k);
		m[i] = w;
	}
}

// The chaining value of the leaf of len bytes (0..1024) at p, leaf number
// counter of its input; root when it is the whole input.
__host__ __device__ static inline void leaf_cv(const uint8_t *p, uint32_t len, uint64_t counter,
					       bool root, uint32_t cv[8])
{
	uint32_t nblocks = len == 0 ? 1 : (len + BLOCK - 1) / BLOCK;
	uint32_t m[16];

	for (int i = 0; i < 8; i++)
		cv[i] = iv(i);
	for (uint32_t b = 0; b < nblocks; b++) {
		bool last = b == nblocks - 1;
		uint32_t blen = last ? len - b * BLOCK : BLOCK;
		uint32_t flags = (b == 0 ? CHUNK_START : 0) | (last ? CHUNK_END : 0) |
				 (last && root ? ROOT : 0);
		load_block(p + b * BLOCK, blen, m);
		compress(cv, m, counter, blen, flags);
	}
}

// The parent of chaining values l and r; the root's when root. out may be
// l or r.
__host__ __device__ static inline void parent_cv(const uint32_t l[8], const uint32_t r[8], bool root,
						 uint32_t out[8])
{
	uint32_t m[16];
	for (int i = 0; i < 8; i++) {
		m[i] = l[i];
		m[8 + i] = r[i];
	}
	for (int i = 0; i < 8; i++)
		out[i] = iv(i);
	compress(out, m, 0, BLOCK, PARENT | (root ? ROOT : 0));
}

// What thread t contributes to one level of m > 1 chaining values in cvs
// (the next level has (m + 1) / 2): the parent of values 2t and 2t+1, or
// the odd last value moved up. root: this level's single parent is the
// root. False when thread t has nothing to do at this level.
__host__ __device__ static inline bool level_step(uint32_t (*cvs)[8], uint32_t m, uint32_t t, bool root,
						  uint32_t r[8])
{
	if (t < m / 2) {
		parent_cv(cvs[2 * t], cvs[2 * t + 1], root && m == 2, r);
		return true;
	}
	if (t == m / 2 && (m & 1)) {
		for (int i = 0; i < 8; i++)
			r[i] = cvs[m - 1][i];
		return true;
	}
	return false;
}

// Pushes the value of the complete subtree of group number g (not the
// last group): merged with the values below it as long as the groups so
// far (g + 1) make complete subtrees of twice the size.
__host__ __device__ static inline void stack_push(uint32_t (*stack)[8], uint32_t *depth, uint64_t g,
						  const uint32_t cv[8])
{
	uint32_t cur[8];
	for (int i = 0; i < 8; i++)
		cur[i] = cv[i];
	for (uint64_t n = g + 1; (n & 1) == 0; n >>= 1) {
		(*depth)--;
		parent_cv(stack[*depth], cur, false, cur);
	}
	for (int i = 0; i < 8; i++)
		stack[*depth][i] = cur[i];
	(*depth)++;
}

// The root: the last group's value joined with the stack from the right.
__host__ __device__ static inline void stack_finish(uint32_t (*stack)[8], uint32_t depth,
						    const uint32_t cv[8], uint8_t out[32])
{
	uint32_t cur[8];
	for (int i = 0; i < 8; i++)
		cur[i] = cv[i];
	while (depth > 0) {
		depth--;
		parent_cv(stack[depth], cur, depth == 0, cur);
	}
	for (int i = 0; i < 32; i++)
		out[i] = (uint8_t)(cur[i / 4] >> (8 * (i % 4)));
}

// The shape of a chunk of len bytes: its leaves and groups of LEAVES.
struct shape {
	uint64_t nleaves, ngroups;
	__host__ __device__ shape(uint64_t len)
		: nleaves(len == 0 ? 1 : (len + LEAF - 1) / LEAF),
		  ngroups((nleaves + LEAVES - 1) / LEAVES)
	{
	}
	__host__ __device__ uint32_t group_leaves(uint64_t g) const
	{
		uint64_t left = nleaves - g * LEAVES;
		return left < LEAVES ? (uint32_t)left : LEAVES;
	}
	__host__ __device__ uint32_t leaf_len(uint64_t len, uint64_t leaf) const
	{
		uint64_t left = len - leaf * LEAF;
		return left < LEAF ? (uint32_t)left : LEAF;
	}
};

// The chunks: chunk i is base[offs[i] .., lens[i] bytes) when offs is set
// (device arrays), else base[i * chunk ..) up to total bytes.
struct job {
	const uint8_t *base;
	const uint64_t *offs, *lens;
	uint64_t chunk, total, n;
	uint8_t (*out)[32];
};

__host__ __device__ static inline void chunk_at(const job &j, uint64_t c, const uint8_t **p,
						uint64_t *len)
{
	if (j.offs != nullptr) {
		*p = j.base + j.offs[c];
		*len = j.lens[c];
	} else {
		uint64_t off = c * j.chunk;
		*p = j.base + off;
		*len = j.total - off < j.chunk ? j.total - off : j.chunk;
	}
}

__global__ static void __launch_bounds__(LEAVES) blake3_kernel(job j)
{
	__shared__ uint32_t cvs[LEAVES][8];
	__shared__ uint32_t stack[STACK][8];
	const uint32_t t = threadIdx.x;

	// One chunk per block at a time; c is the same for the whole block,
	// so every thread meets every __syncthreads.
	for (uint64_t c = blockIdx.x; c < j.n; c += gridDim.x) {
		const uint8_t *p;
		uint64_t len;
		chunk_at(j, c, &p, &len);
		shape s(len);
		uint32_t depth = 0, r[8];
		for (uint64_t g = 0; g < s.ngroups; g++) {
			uint32_t m = s.group_leaves(g);
			bool last = g == s.ngroups - 1, root = last && g == 0;
			if (t < m) {
				uint64_t leaf = g * LEAVES + t;
				leaf_cv(p + leaf * LEAF, s.leaf_len(len, leaf), leaf, root && m == 1, r);
				for (int i = 0; i < 8; i++)
					cvs[t][i] = r[i];
			}
			__syncthreads();
			for (; m > 1; m = (m + 1) / 2) {
				bool act = level_step(cvs, m, t, root, r);
				__syncthreads();
				if (act)
					for (int i = 0; i < 8; i++)
						cvs[t][i] = r[i];
				__syncthreads();
			}
			if (t == 0) {
				if (!last) {
					stack_push(stack, &depth, g, cvs[0]);
				} else if (root) {
					for (int i = 0; i < 32; i++)
						j.out[c][i] = (uint8_t)(cvs[0][i / 4] >> (8 * (i % 4)));
				} else {
					stack_finish(stack, depth, cvs[0], j.out[c]);
				}
			}
			__syncthreads(); // cvs[0] read before the next group writes
		}
	}
}

// The kernel's steps on the CPU, thread by thread and level by level.
extern "C" void node_cuda_blake3_host(const void *buf, uint64_t len, uint8_t out[32])
{
	static_assert(LEAVES * LEAF == 1 << 17, "a group is a 128 KiB tessera chunk");
	const uint8_t *p = (const uint8_t *)buf;
	shape s(len);
	uint32_t cvs[LEAVES][8], next[LEAVES][8], stack[STACK][8], depth = 0;

	for (uint64_t g = 0; g < s.ngroups; g++) {
		uint32_t m = s.group_leaves(g);
		bool last = g == s.ngroups - 1, root = last && g == 0;
		for (uint32_t t = 0; t < m; t++) {
			uint64_t leaf = g * LEAVES + t;
			leaf_cv(p + leaf * LEAF, s.leaf_len(len, leaf), leaf, root && m == 1, cvs[t]);
		}
		for (; m > 1; m = (m + 1) / 2) {
			bool act[LEAVES];
			for (uint32_t t = 0; t < LEAVES; t++)
				act[t] = level_step(cvs, m, t, root, next[t]);
			for (uint32_t t = 0; t < LEAVES; t++)
				if (act[t])
					memcpy(cvs[t], next[t], sizeof(cvs[t]));
		}
		if (!last) {
			stack_push(stack, &depth, g, cvs[0]);
		} else if (root) {
			for (int i = 0; i < 32; i++)
				out[i] = (uint8_t)(cvs[0][i / 4] >> (8 * (i % 4)));
		} else {
			stack_finish(stack, depth, cvs[0], out);
		}
	}
}

static unsigned grid_for(uint64_t n)
{
	return n > (1u << 20) ? 1u << 20 : (unsigned)n;
}

extern "C" int node_cuda_blake3_launch(const void *dptr, const uint64_t *offs, const uint64_t *lens,
				       uint64_t n, uint8_t (*out)[32], void *stream, char *why,
				       size_t whylen)
{
	if (n == 0)
		return 0;
	job j = {(const uint8_t *)dptr, offs, lens, 0, 0, n, out};
	blake3_kernel<<<grid_for(n), LEAVES, 0, (cudaStream_t)stream>>>(j);
	cudaError_t e = cudaGetLastError();
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "blake3", why, whylen);
}

struct node_cuda_blake3 {
	int dev;
	uint64_t batch;
	uint8_t (*out_d)[32], (*out_h)[32]; // batch digests, device / pinned
	cudaStream_t stream;
};

extern "C" void node_cuda_blake3_free(node_cuda_blake3 *b)
{
	if (b == nullptr)
		return;
	cudaSetDevice(b->dev);
	if (b->stream != nullptr) {
		cudaStreamSynchronize(b->stream);
		cudaStreamDestroy(b->stream);
	}
	cudaFreeHost(b->out_h);
	cudaFree(b->out_d);
	free(b);
}

extern "C" int node_cuda_blake3_new(int dev, uint64_t batch, node_cuda_blake3 **out, char *why,
				    size_t whylen)
{
	*out = nullptr;
	if (batch == 0 || batch > (1ull << 26)) {
		snprintf(why, whylen, "blake3: batch of %llu chunks (want 1 to 2^26)",
			 (unsigned long long)batch);
		return -EINVAL;
	}
	node_cuda_blake3 *b = (node_cuda_blake3 *)calloc(1, sizeof(*b));
	if (b == nullptr) {
		snprintf(why, whylen, "blake3: out of memory");
		return -ENOMEM;
	}
	b->dev = dev;
	b->batch = batch;
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaHostAlloc(&b->out_h, batch * 32, cudaHostAllocDefault);
	if (e == cudaSuccess)
		e = cudaMalloc(&b->out_d, batch * 32);
	if (e != cudaSuccess) {
		int rc = node_cuda__fail(e, "blake3", why, whylen);
		node_cuda_blake3_free(b);
		return rc;
	}
	*out = b;
	return 0;
}

extern "C" uint64_t node_cuda_blake3_count(uint64_t len, uint64_t chunk)
{
	return len == 0 || chunk == 0 ? 1 : (len - 1) / chunk + 1;
}

extern "C" int node_cuda_blake3_chunks(node_cuda_blake3 *b, const void *dptr, uint64_t len,
				       uint64_t chunk, uint8_t (*out)[32], char *why, size_t whylen)
{
	if (chunk == 0) {
		snprintf(why, whylen, "blake3: chunks of 0 bytes");
		return -EINVAL;
	}
	uint64_t n = node_cuda_blake3_count(len, chunk);
	cudaError_t e = cudaSetDevice(b->dev);
	for (uint64_t at = 0; at < n && e == cudaSuccess; at += b->batch) {
		uint64_t k = n - at < b->batch ? n - at : b->batch;
		uint64_t off = at * chunk, bytes = len - off < k * chunk ? len - off : k * chunk;
		job j = {(const uint8_t *)dptr + off, nullptr, nullptr, chunk, bytes, k, b->out_d};
		blake3_kernel<<<grid_for(k), LEAVES, 0, b->stream>>>(j);
		e = cudaGetLastError();
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(b->out_h, b->out_d, k * 32, cudaMemcpyDeviceToHost, b->stream);
		// The pinned digests are reused by the next batch.
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(b->stream);
		if (e == cudaSuccess)
			memcpy(out + at, b->out_h, k * 32);
	}
	return e == cudaSuccess ? 0 : node_cuda__fail(e, "blake3", why, whylen);
}

extern "C" int node_cuda_blake3_verify(node_cuda_blake3 *b, const void *dptr, uint64_t len,
				       uint64_t chunk, const uint8_t (*want)[32], uint8_t *bad,
				       char *why, size_t whylen)
{
	if (chunk == 0) {
		snprintf(why, whylen, "blake3: chunks of 0 bytes");
		return -EINVAL;
	}
	uint64_t n = node_cuda_blake3_count(len, chunk), nbad = 0, first = 0;
	uint8_t (*got)[32] = (uint8_t (*)[32])malloc(n * 32);
	if (got == nullptr) {
		snprintf(why, whylen, "blake3: out of memory");
		return -ENOMEM;
	}
	int rc = node_cuda_blake3_chunks(b, dptr, len, chunk, got, why, whylen);
	for (uint64_t i = 0; rc == 0 && i < n; i++) {
		bool differs = memcmp(got[i], want[i], 32) != 0;
		if (differs && nbad++ == 0)
			first = i;
		if (bad != nullptr)
			bad[i] = differs;
	}
	free(got);
	if (rc != 0)
		return rc;
	if (nbad > 0)
		snprintf(why, whylen, "blake3: %llu of %llu chunks differ from their hashes (the first: %llu)",
			 (unsigned long long)nbad, (unsigned long long)n, (unsigned long long)first);
	return nbad > INT32_MAX ? INT32_MAX : (int)nbad;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

extern "C" int node_cuda_mem_bandwidth(int dev, size_t len, double *peak, double *copy, char *why,
				       size_t whylen)
{
	int khz = 0, bits = 0;
	void *a = nullptr, *b = nullptr;
	cudaEvent_t e0 = nullptr, e1 = nullptr;
	float ms[5] = {0, 0, 0, 0, 0};

	*peak = *copy = 0;
	cudaError_t e = cudaSetDevice(dev);
	if (e == cudaSuccess) {
		// Double data rate: two transfers per memory clock.
		if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
		    cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
			*peak = 2.0 * khz * 1e3 * bits / 8;
		cudaGetLastError(); // a device that does not say is no error
	}
	if (e == cudaSuccess)
		e = cudaMalloc(&a, len);
	if (e == cudaSuccess)
		e = cudaMalloc(&b, len);
	if (e == cudaSuccess)
		e = cudaMemset(a, 1, len);
	if (e == cudaSuccess)
		e = cudaMemcpy(b, a, len, cudaMemcpyDeviceToDevice); // warm
	if (e == cudaSuccess)
		e = cudaEventCreate(&e0);
	if (e == cudaSuccess)
		e = cudaEventCreate(&e1);
	for (int i = 0; i < 5 && e == cudaSuccess; i++) {
		e = cudaEventRecord(e0, cudaStreamLegacy);
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(b, a, len, cudaMemcpyDeviceToDevice, cudaStreamLegacy);
		if (e == cudaSuccess)
			e = cudaEventRecord(e1, cudaStreamLegacy);
		if (e == cudaSuccess)
			e = cudaEventSynchronize(e1);
		if (e == cudaSuccess)
			e = cudaEventElapsedTime(&ms[i], e0, e1);
	}
	if (e0 != nullptr)
		cudaEventDestroy(e0);
	if (e1 != nullptr)
		cudaEventDestroy(e1);
	if (a != nullptr)
		cudaFree(a);
	if (b != nullptr)
		cudaFree(b);
	if (e != cudaSuccess)
		return node_cuda__fail(e, "memory bandwidth", why, whylen);
	qsort(ms, 5, sizeof(ms[0]), cmp_float);
	*copy = ms[2] > 0 ? 2.0 * len / (ms[2] * 1e-3) : 0;
	return 0;
}
