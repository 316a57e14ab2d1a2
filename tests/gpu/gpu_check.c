/* make gpu-check: the CUDA store's checks and benchmark in one binary that
 * links only the CUDA runtime (static) and the store's CUDA code, so that it
 * runs on a GPU machine without tessera's other dependencies. Every check
 * compares device contents, copied back, with the bytes expected; the
 * benchmark prints ratios against a bound measured in the same run. The
 * device's BLAKE3 is checked against the CPU's (blake3.h), and its tree
 * logic run on the CPU (node_cuda_blake3_host) even without a device. Exits
 * 0 when every check passed (or no device is visible: skipped, saying so),
 * 1 when one failed. `gpu_check --ipc-child HEX LEN FOLD` is the child
 * process of the IPC check. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "blake3.h"
#include "node/store/store_cuda.h"
#include "proto/wsum.h"

static int failures;
static char why[512];

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		if (!(cond)) {                                                  \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);             \
			printf(__VA_ARGS__);                                    \
			printf("\n");                                           \
			failures++;                                             \
			return;                                                 \
		}                                                               \
	} while (0)
#define CUDA_OK(call) CHECK((call) == 0, "%s: %s", #call, why)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void fill(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd() >> 24);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	return v[n / 2];
}

/* ---- a layout: the block cut into pieces, the payload in shuffled order ---- */

struct layout {
	size_t len;             /* block bytes */
	uint64_t npieces;
	struct node_cuda_span *pieces; /* dst_off in the block, src_off in the payload */
};

/* Pieces of lo..hi bytes (some odd-sized, so both kernel paths run),
 * shuffled into the payload order. */
static int layout_make(struct layout *l, size_t len, size_t lo, size_t hi)
{
	uint64_t cap = len / lo + 1, n = 0;
	l->pieces = malloc(cap * sizeof(*l->pieces));
	if (l->pieces == NULL)
		return -1;
	for (size_t at = 0; at < len; n++) {
		size_t k = lo + (hi > lo ? rnd() % (hi - lo + 1) : 0);
		if (k > len - at)
			k = len - at;
		l->pieces[n] = (struct node_cuda_span){at, 0, k};
		at += k;
	}
	for (uint64_t i = n - 1; i > 0; i--) {
		uint64_t j = rnd() % (i + 1);
		struct node_cuda_span t = l->pieces[i];
		l->pieces[i] = l->pieces[j];
		l->pieces[j] = t;
	}
	uint64_t pay = 0;
	for (uint64_t i = 0; i < n; i++) {
		l->pieces[i].src_off = pay;
		pay += l->pieces[i].len;
	}
	l->len = len;
	l->npieces = n;
	return 0;
}

/* The spans of payload [off, off+clen) (src_off relative to off). */
static uint32_t chunk_spans(const struct layout *l, uint64_t off, uint64_t clen,
			    struct node_cuda_span *out)
{
	uint64_t lo = 0, hi = l->npieces, end = off + clen;
	uint32_t n = 0;

	while (hi - lo > 1) { /* the piece holding payload offset off */
		uint64_t mid = lo + (hi - lo) / 2;
		if (l->pieces[mid].src_off <= off)
			lo = mid;
		else
			hi = mid;
	}
	for (uint64_t i = lo; i < l->npieces && l->pieces[i].src_off < end; i++) {
		const struct node_cuda_span *p = &l->pieces[i];
		uint64_t a = p->src_off > off ? p->src_off : off;
		uint64_t b = p->src_off + p->len < end ? p->src_off + p->len : end;
		out[n++] = (struct node_cuda_span){p->dst_off + (a - p->src_off), a - off, b - a};
	}
	return n;
}

/* ---- uploads through the ring ---- */

struct put_job {
	struct node_cuda_ring *ring;
	const struct layout *l;
	const uint8_t *payload;
	void *dev;
	size_t chunk;
	unsigned t, nthreads;
	int rc;
	char why[256];
};

/* One verification worker: every nthreads-th chunk, as the node does. */
static void *put_worker(void *arg)
{
	struct put_job *j = arg;
	uint64_t nchunks = (j->l->len + j->chunk - 1) / j->chunk;
	struct node_cuda_span *sp = malloc((j->chunk + 2) * sizeof(*sp)); /* 1-byte pieces at worst */

	if (sp == NULL) {
		j->rc = -ENOMEM;
		snprintf(j->why, sizeof(j->why), "out of memory");
	}
	for (uint64_t c = j->t; c < nchunks && j->rc == 0; c += j->nthreads) {
		uint64_t off = c * j->chunk, len = j->l->len - off < j->chunk ? j->l->len - off : j->chunk;
		uint32_t n = chunk_spans(j->l, off, len, sp);
		/* As a verified chunk in the node's bounce slot (pageable memory). */
		j->rc = node_cuda_ring_put(j->ring, j->dev, sp, n, j->payload + off, len, j->why,
					   sizeof(j->why));
	}
	free(sp);
	return NULL;
}

/* Uploads the payload of l through the ring from nthreads workers and
 * waits; 0 or the first error (why set). */
static int ring_upload(struct node_cuda_ring *r, const struct layout *l, const uint8_t *payload,
		       void *dev, size_t chunk, unsigned nthreads)
{
	pthread_t th[16];
	struct put_job jobs[16];
	int rc = 0;

	for (unsigned t = 0; t < nthreads; t++) {
		jobs[t] = (struct put_job){r, l, payload, dev, chunk, t, nthreads, 0, ""};
		pthread_create(&th[t], NULL, put_worker, &jobs[t]);
	}
	for (unsigned t = 0; t < nthreads; t++) {
		pthread_join(th[t], NULL);
		if (rc == 0 && jobs[t].rc != 0) {
			rc = jobs[t].rc;
			snprintf(why, sizeof(why), "%s", jobs[t].why);
		}
	}
	if (rc == 0)
		rc = node_cuda_ring_wait(r, why, sizeof(why));
	return rc;
}

/* The block the payload makes. */
static void host_place(const struct layout *l, const uint8_t *payload, uint8_t *block)
{
	for (uint64_t i = 0; i < l->npieces; i++)
		memcpy(block + l->pieces[i].dst_off, payload + l->pieces[i].src_off, l->pieces[i].len);
}

static void check_upload(const char *name, size_t len, size_t lo, size_t hi, size_t chunk,
			 size_t entry, unsigned nentries, unsigned nthreads)
{
	struct layout l = {0};
	struct node_cuda_ring *r = NULL;
	uint8_t *payload = malloc(len), *want = calloc(1, len), *got = malloc(len);
	void *dev = NULL;
	uint64_t fd = 0;

	CHECK(payload && want && got && layout_make(&l, len, lo, hi) == 0, "out of memory");
	fill(payload, len);
	host_place(&l, payload, want);
	CUDA_OK(node_cuda_alloc(0, len, &dev, why, sizeof(why)));
	CUDA_OK(node_cuda_ring_new(0, entry, nentries, &r, why, sizeof(why)));
	CUDA_OK(ring_upload(r, &l, payload, dev, chunk, nthreads));
	CUDA_OK(node_cuda_download(0, got, dev, len, why, sizeof(why)));
	CHECK(memcmp(got, want, len) == 0, "%s: the device holds other bytes than were uploaded", name);
	CUDA_OK(node_cuda_fold(0, dev, len, &fd, why, sizeof(why)));
	CHECK(fd == node_host_fold(want, len), "%s: device fold %016" PRIx64 " != host fold", name, fd);
	printf("ok   upload %s: %zu bytes, %" PRIu64 " pieces, %u threads\n", name, len, l.npieces,
	       nthreads);
	node_cuda_ring_free(r);
	node_cuda_free(dev);
	free(l.pieces);
	free(payload);
	free(want);
	free(got);
}

static void check_ring_refuses(void)
{
	struct node_cuda_ring *r = NULL;
	void *dev = NULL;
	uint8_t buf[64] = {0};
	struct node_cuda_span bad = {0, 60, 8};

	CHECK(node_cuda_ring_new(0, 1024, 4, &r, why, sizeof(why)) == -EINVAL && r == NULL,
	      "a ring of 1 KiB entries was accepted");
	CUDA_OK(node_cuda_alloc(0, 64, &dev, why, sizeof(why)));
	CUDA_OK(node_cuda_ring_new(0, 1 << 16, 2, &r, why, sizeof(why)));
	CHECK(node_cuda_ring_put(r, dev, &bad, 1, buf, sizeof(buf), why, sizeof(why)) == -EINVAL,
	      "a span past the staged bytes was accepted");
	printf("ok   ring refuses bad spans (%s)\n", why);
	CHECK(node_cuda_ring_wait(r, why, sizeof(why)) == -EINVAL, "wait forgot the failed put");
	CUDA_OK(node_cuda_ring_wait(r, why, sizeof(why))); /* and then forgets it */
	node_cuda_ring_free(r);
	node_cuda_free(dev);
}

/* ---- scatter ---- */

static uint64_t ld(const uint8_t *p, unsigned w)
{
	uint64_t x = 0;
	memcpy(&x, p, w);
	return x;
}

/* Applies the n changes to the host piece; the checksum sum moved by them. */
static uint64_t host_apply(uint8_t *host, unsigned w, const uint64_t *pos, const uint8_t *vals,
			   uint64_t n, uint64_t sum)
{
	for (uint64_t i = 0; i < n; i++) {
		uint8_t *at = host + pos[i] * w;
		sum = proto_wsum_update(sum, pos[i], ld(at, w), ld(vals + i * w, w));
		memcpy(at, vals + i * w, w);
	}
	return sum;
}

static void check_scatter(unsigned w, uint64_t nelem, uint64_t nchanges, size_t misalign)
{
	size_t bytes = nelem * w;
	uint8_t *host = malloc(bytes), *got = malloc(bytes);
	uint64_t *pos = malloc(nchanges * 8);
	uint8_t *vals = malloc(nchanges * w);
	uint8_t *base = NULL;
	struct node_cuda_scatter *sc = NULL;
	uint64_t psum_dev = 0, delta = 0, csum_dev = 0;

	CHECK(host && got && pos && vals, "out of memory");
	fill(host, bytes);
	CUDA_OK(node_cuda_alloc(0, bytes + misalign, (void **)&base, why, sizeof(why)));
	uint8_t *dev = base + misalign;
	CUDA_OK(node_cuda_upload(0, dev, host, bytes, why, sizeof(why)));
	uint64_t parent = proto_wsum(w, host, nelem);
	CUDA_OK(node_cuda_wsum(0, dev, w, nelem, &psum_dev, why, sizeof(why)));
	CHECK(psum_dev == parent, "w%u: device parent wsum %016" PRIx64 " != host %016" PRIx64, w,
	      psum_dev, parent);
	/* Distinct sorted positions, new values; the host applies them too. */
	for (uint64_t i = 0; i < nchanges; i++)
		pos[i] = rnd() % nelem;
	qsort(pos, nchanges, 8, cmp_u64);
	uint64_t n = 0;
	for (uint64_t i = 0; i < nchanges; i++)
		if (n == 0 || pos[i] != pos[n - 1])
			pos[n++] = pos[i];
	fill(vals, n * w);
	uint64_t child = host_apply(host, w, pos, vals, n, parent);
	CHECK(child == proto_wsum(w, host, nelem), "w%u: host wsum update disagrees", w);
	/* Batches smaller than n: the apply goes through in turns. */
	CUDA_OK(node_cuda_scatter_new(0, n / 3 + 1, &sc, why, sizeof(why)));
	CUDA_OK(node_cuda_scatter_apply(sc, dev, nelem, w, pos, vals, n, &delta, why, sizeof(why)));
	CHECK(proto_wsum_combine(parent, 0, delta) == child,
	      "w%u: the device's checksum delta does not give the child's checksum", w);
	CUDA_OK(node_cuda_download(0, got, dev, bytes, why, sizeof(why)));
	CHECK(memcmp(got, host, bytes) == 0, "w%u: the device piece differs from the host apply", w);
	CUDA_OK(node_cuda_wsum(0, dev, w, nelem, &csum_dev, why, sizeof(why)));
	CHECK(csum_dev == child, "w%u: device child wsum differs", w);
	/* Refused batches write nothing. */
	if (n >= 2) {
		uint64_t keep = pos[1];
		pos[1] = pos[0];
		CHECK(node_cuda_scatter_apply(sc, dev, nelem, w, pos, vals, n, &delta, why,
					      sizeof(why)) == -EINVAL,
		      "w%u: repeated positions were accepted", w);
		pos[1] = keep;
	}
	uint64_t past = nelem;
	CHECK(node_cuda_scatter_apply(sc, dev, nelem, w, &past, vals, 1, &delta, why, sizeof(why)) ==
		      -EINVAL,
	      "w%u: a position past the piece was accepted", w);
	CHECK(node_cuda_scatter_apply(sc, dev, nelem, 3, pos, vals, 1, &delta, why, sizeof(why)) ==
		      -EINVAL,
	      "a 3-byte element was accepted");
	CUDA_OK(node_cuda_download(0, got, dev, bytes, why, sizeof(why)));
	CHECK(memcmp(got, host, bytes) == 0, "w%u: a refused batch changed the piece", w);
	/* 32-bit positions (an in-place install's prepared changes): new
	 * values at the same positions, the same agreement. */
	uint32_t *pos32 = malloc(n * 4 + 4);
	CHECK(pos32 != NULL, "out of memory");
	for (uint64_t i = 0; i < n; i++)
		pos32[i] = (uint32_t)pos[i];
	fill(vals, n * w);
	uint64_t child2 = host_apply(host, w, pos, vals, n, child);
	CUDA_OK(node_cuda_scatter_apply32(sc, dev, nelem, w, pos32, vals, n, &delta, why, sizeof(why)));
	CHECK(proto_wsum_combine(child, 0, delta) == child2,
	      "w%u: 32-bit positions: the checksum delta does not give the child's", w);
	CUDA_OK(node_cuda_download(0, got, dev, bytes, why, sizeof(why)));
	CHECK(memcmp(got, host, bytes) == 0, "w%u: 32-bit positions: the device piece differs", w);
	free(pos32);
	printf("ok   scatter %u-byte elements%s: %" PRIu64 " of %" PRIu64
	       " changed, checksums agree, bad batches refused\n",
	       w, misalign ? " (unaligned piece)" : "", n, nelem);
	node_cuda_scatter_free(sc);
	node_cuda_free(base);
	free(host);
	free(got);
	free(pos);
	free(vals);
}

/* ---- BLAKE3: the device's chunk hashes against the CPU's ---- */

/* Lengths around every block and leaf boundary and the tree's shapes up to
 * a whole 128 KiB chunk (BLAKE3's official test vector lengths among them). */
static const size_t b3_lens[] = {0,    1,    63,   64,   65,    1023,  1024,   1025,   2048,
				 2049, 3072, 3073, 4096, 4097,  5120,  5121,   6144,   6145,
				 7168, 7169, 8192, 8193, 16384, 31744, 102400, 131071, 131072};
#define B3_NLENS (sizeof(b3_lens) / sizeof(b3_lens[0]))

static void cpu_blake3(const uint8_t *p, size_t len, uint8_t out[32])
{
	blake3_hasher h;

	blake3_hasher_init(&h);
	blake3_hasher_update(&h, p, len);
	blake3_hasher_finalize(&h, out, 32);
}

/* Bytes i % 251 (the official test vectors' input) or random ones. */
static void b3_fill(uint8_t *p, size_t n, int random)
{
	if (random)
		fill(p, n);
	else
		for (size_t i = 0; i < n; i++)
			p[i] = (uint8_t)(i % 251);
}

/* The kernel's own steps on the CPU (runs without a device too): every
 * vector length, both inputs, aligned and not, and chunks of several
 * 128 KiB groups (the kernel's stack of subtrees). */
static void check_blake3_host(void)
{
	static const size_t more[] = {131073, 262144, 393221, 524288, 917504 + 1023,
				      1048576, 1048577, (3 << 20) + 17};
	size_t maxlen = (3 << 20) + 17;
	uint8_t *buf = malloc(maxlen + 1), want[32], got[32];
	int n = 0;

	CHECK(buf != NULL, "out of memory");
	for (int random = 0; random < 2; random++)
		for (size_t i = 0; i < B3_NLENS + sizeof(more) / sizeof(more[0]); i++)
			for (size_t mis = 0; mis < 2; mis++, n++) {
				size_t len = i < B3_NLENS ? b3_lens[i] : more[i - B3_NLENS];
				b3_fill(buf + mis, len, random);
				cpu_blake3(buf + mis, len, want);
				node_cuda_blake3_host(buf + mis, len, got);
				CHECK(memcmp(want, got, 32) == 0,
				      "blake3 host emulation: %zu bytes (%s, %s) differ from the CPU's", len,
				      random ? "random" : "i %% 251", mis ? "unaligned" : "aligned");
			}
	printf("ok   blake3 host emulation of the kernel: %d inputs of 0 to %zu bytes agree with "
	       "the CPU's BLAKE3\n", n, maxlen);
	free(buf);
}

/* Each vector as its own chunk (node_cuda_blake3_chunks), then all of them
 * at once at odd places of one buffer (node_cuda_blake3_launch). */
static void check_blake3_vectors(int random)
{
	size_t total = 16;
	for (size_t i = 0; i < B3_NLENS; i++)
		total += b3_lens[i] + 3 + 15; /* its offset past a 16-byte boundary, the padding after */
	uint8_t *host = calloc(1, total), (*want)[32] = malloc(B3_NLENS * 32),
		(*got)[32] = malloc(B3_NLENS * 32);
	uint64_t offs[B3_NLENS], lens[B3_NLENS];
	struct node_cuda_blake3 *b = NULL;
	uint8_t *dev = NULL, (*out_d)[32] = NULL;
	uint64_t *offs_d = NULL, *lens_d = NULL;
	const char *what = random ? "random bytes" : "bytes i % 251";

	CHECK(host && want && got, "out of memory");
	CUDA_OK(node_cuda_blake3_new(0, 4, &b, why, sizeof(why)));
	CUDA_OK(node_cuda_alloc(0, total, (void **)&dev, why, sizeof(why)));
	size_t at = 0;
	for (size_t i = 0; i < B3_NLENS; i++) {
		at += i % 4; /* 16-byte aligned, and not */
		offs[i] = at;
		lens[i] = b3_lens[i];
		b3_fill(host + at, b3_lens[i], random);
		cpu_blake3(host + at, b3_lens[i], want[i]);
		at += b3_lens[i];
		at = (at + 15) & ~(size_t)15;
	}
	CHECK(at <= total, "vector layout");
	CUDA_OK(node_cuda_upload(0, dev, host, total, why, sizeof(why)));
	for (size_t i = 0; i < B3_NLENS; i++) {
		size_t len = b3_lens[i];
		CUDA_OK(node_cuda_blake3_chunks(b, dev + offs[i], len, len ? len : 1, got, why,
						sizeof(why)));
		CHECK(memcmp(got[0], want[i], 32) == 0,
		      "blake3 of %zu %s at offset %" PRIu64 ": the device's hash differs from the CPU's",
		      len, what, offs[i]);
	}
	CUDA_OK(node_cuda_alloc(0, sizeof(offs), (void **)&offs_d, why, sizeof(why)));
	CUDA_OK(node_cuda_alloc(0, sizeof(lens), (void **)&lens_d, why, sizeof(why)));
	CUDA_OK(node_cuda_alloc(0, B3_NLENS * 32, (void **)&out_d, why, sizeof(why)));
	CUDA_OK(node_cuda_upload(0, offs_d, offs, sizeof(offs), why, sizeof(why)));
	CUDA_OK(node_cuda_upload(0, lens_d, lens, sizeof(lens), why, sizeof(why)));
	CUDA_OK(node_cuda_blake3_launch(dev, offs_d, lens_d, B3_NLENS, out_d, NULL, why, sizeof(why)));
	CUDA_OK(node_cuda_download(0, got, out_d, B3_NLENS * 32, why, sizeof(why)));
	for (size_t i = 0; i < B3_NLENS; i++)
		CHECK(memcmp(got[i], want[i], 32) == 0,
		      "blake3 launch, chunk %zu (%zu %s): the device's hash differs from the CPU's", i,
		      b3_lens[i], what);
	printf("ok   blake3 vectors (%s): %zu lengths of 0 to 128 KiB, one by one and in one "
	       "launch, agree with the CPU's\n", what, B3_NLENS);
	node_cuda_free(out_d);
	node_cuda_free(lens_d);
	node_cuda_free(offs_d);
	node_cuda_free(dev);
	node_cuda_blake3_free(b);
	free(host);
	free(want);
	free(got);
}

/* len random bytes in chunks of chunk bytes, batches of batch chunks (fewer
 * than the chunks: the context goes through them in turns); then verify,
 * before and after one byte of chunk n/3 changes on the device. */
static void check_blake3_batch(size_t len, size_t chunk, uint64_t batch, size_t misalign)
{
	uint64_t n = node_cuda_blake3_count(len, chunk);
	uint8_t *host = malloc(len + 1), (*want)[32] = malloc(n * 32), (*got)[32] = malloc(n * 32);
	uint8_t *bad = malloc(n), *base = NULL;
	struct node_cuda_blake3 *b = NULL;

	CHECK(host && want && got && bad, "out of memory");
	fill(host, len);
	for (uint64_t i = 0; i < n; i++) {
		size_t off = i * chunk;
		cpu_blake3(host + off, len - off < chunk ? len - off : chunk, want[i]);
	}
	CUDA_OK(node_cuda_alloc(0, len + misalign, (void **)&base, why, sizeof(why)));
	uint8_t *dev = base + misalign;
	CUDA_OK(node_cuda_upload(0, dev, host, len, why, sizeof(why)));
	CUDA_OK(node_cuda_blake3_new(0, batch, &b, why, sizeof(why)));
	CUDA_OK(node_cuda_blake3_chunks(b, dev, len, chunk, got, why, sizeof(why)));
	for (uint64_t i = 0; i < n; i++)
		CHECK(memcmp(got[i], want[i], 32) == 0,
		      "blake3 batch: chunk %" PRIu64 " of %" PRIu64 " (%zu-byte chunks): the device's "
		      "hash differs from the CPU's", i, n, chunk);
	CHECK(node_cuda_blake3_verify(b, dev, len, chunk, (const uint8_t (*)[32])want, bad, why,
				      sizeof(why)) == 0,
	      "blake3 verify: untouched chunks refused: %s", why);
	uint64_t hit = n / 3;
	uint8_t x = host[hit * chunk] ^ 0x40;
	CUDA_OK(node_cuda_upload(0, dev + hit * chunk, &x, 1, why, sizeof(why)));
	CHECK(node_cuda_blake3_verify(b, dev, len, chunk, (const uint8_t (*)[32])want, bad, why,
				      sizeof(why)) == 1,
	      "blake3 verify: a changed byte in chunk %" PRIu64 " was not the one mismatch", hit);
	for (uint64_t i = 0; i < n; i++)
		CHECK(bad[i] == (i == hit), "blake3 verify: chunk %" PRIu64 " flagged wrongly", i);
	printf("ok   blake3 %" PRIu64 " chunks of %zu bytes (%zu in all%s, batches of %" PRIu64
	       "): agree with the CPU's; verify finds the one changed chunk (%s)\n",
	       n, chunk, len, misalign ? ", unaligned" : "", batch, why);
	node_cuda_blake3_free(b);
	node_cuda_free(base);
	free(host);
	free(want);
	free(got);
	free(bad);
}

/* 1 GiB of 128 KiB chunks already on the device: the kernel's rate against
 * the device's memory bandwidth (a hash reads each byte once). */
static void bench_blake3(void)
{
	const size_t len = 1ull << 30, chunk = 1 << 17;
	uint64_t n = len / chunk;
	uint8_t *dev = NULL, (*got)[32] = malloc(n * 32), *host = malloc(64 << 20), h[32];
	struct node_cuda_blake3 *b = NULL;
	double t[5], peak = 0, copy = 0;

	CHECK(got && host, "out of memory");
	CUDA_OK(node_cuda_alloc(0, len, (void **)&dev, why, sizeof(why)));
	fill(host, 64 << 20);
	for (size_t at = 0; at < len; at += 64 << 20)
		CUDA_OK(node_cuda_upload(0, dev + at, host, 64 << 20, why, sizeof(why)));
	CUDA_OK(node_cuda_blake3_new(0, n, &b, why, sizeof(why)));
	CUDA_OK(node_cuda_blake3_chunks(b, dev, len, chunk, got, why, sizeof(why))); /* warm */
	cpu_blake3(host, chunk, h);
	CHECK(memcmp(h, got[0], 32) == 0, "blake3 bench: chunk 0's hash differs from the CPU's");
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		CUDA_OK(node_cuda_blake3_chunks(b, dev, len, chunk, got, why, sizeof(why)));
		t[i] = now_s() - t0;
	}
	double d = median(t, 5);
	double c0 = now_s();
	for (size_t at = 0; at < (64 << 20); at += chunk)
		cpu_blake3(host + at, chunk, got[at / chunk]);
	double c = now_s() - c0;
	node_cuda_free(dev);
	dev = NULL;
	CUDA_OK(node_cuda_mem_bandwidth(0, 512 << 20, &peak, &copy, why, sizeof(why)));
	double rate = len / d;
	printf("bench blake3: 1024 MiB of 128 KiB chunks on the device: %.1f GB/s (digests to the "
	       "host included; median of 5); memory bandwidth: D2D cudaMemcpy %.1f GB/s read+written, "
	       "peak %.1f GB/s (memory clock x bus width); ratio hash/D2D %.2f, hash/peak %.2f; "
	       "host BLAKE3 one core %.2f GB/s\n",
	       rate / 1e9, copy / 1e9, peak / 1e9, copy > 0 ? rate / copy : 0,
	       peak > 0 ? rate / peak : 0, (64 << 20) / c / 1e9);
	node_cuda_blake3_free(b);
	free(got);
	free(host);
}

/* ---- IPC: a child process opens the handle and folds what it sees ---- */

static void hex(const uint8_t *b, size_t n, char *out)
{
	for (size_t i = 0; i < n; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int ipc_child(const char *hx, const char *lens, const char *folds)
{
	uint8_t h[64];
	void *p = NULL;
	uint64_t fold = 0;
	size_t len = strtoull(lens, NULL, 10);
	uint64_t want = strtoull(folds, NULL, 16);

	if (strlen(hx) != 128)
		return 2;
	for (int i = 0; i < 64; i++)
		if (sscanf(hx + 2 * i, "%2hhx", &h[i]) != 1)
			return 2;
	if (node_cuda_ipc_open(0, h, &p, why, sizeof(why)) != 0 ||
	    node_cuda_fold(0, p, len, &fold, why, sizeof(why)) != 0) {
		fprintf(stderr, "ipc child: %s\n", why);
		return 1;
	}
	node_cuda_ipc_close(p);
	return fold == want ? 0 : 3;
}

static void check_ipc(void)
{
	size_t len = (8 << 20) + 3;
	uint8_t *b = malloc(len), h[64];
	char hx[129], lens[32], folds[32];
	void *dev = NULL;
	int status = 0;

	CHECK(b != NULL, "out of memory");
	fill(b, len);
	CUDA_OK(node_cuda_alloc(0, len, &dev, why, sizeof(why)));
	CUDA_OK(node_cuda_upload(0, dev, b, len, why, sizeof(why)));
	CUDA_OK(node_cuda_ipc_handle(dev, h, why, sizeof(why)));
	hex(h, 64, hx);
	snprintf(lens, sizeof(lens), "%zu", len);
	snprintf(folds, sizeof(folds), "%" PRIx64, node_host_fold(b, len));
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		execl("/proc/self/exe", "gpu_check", "--ipc-child", hx, lens, folds, (char *)NULL);
		_exit(127);
	}
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child process could not read the exported buffer (status %d: %s)", status,
	      WIFEXITED(status) && WEXITSTATUS(status) == 3 ? "other bytes" : "could not open it");
	printf("ok   IPC: a child process opened the handle and saw the %zu bytes\n", len);
	node_cuda_free(dev);
	free(b);
}

/* ---- benchmark ---- */

static void bench_upload(size_t len, size_t lo, size_t hi, const char *what)
{
	struct layout l = {0};
	struct node_cuda_ring *r = NULL;
	uint8_t *payload = malloc(len), *block = malloc(len);
	void *dev = NULL;
	double tm[5], tr[5];
	const size_t chunk = 1 << 17; /* TESSERA_CHUNK_SIZE's default */

	CHECK(payload && block && layout_make(&l, len, lo, hi) == 0, "out of memory");
	fill(payload, len);
	host_place(&l, payload, block);
	CUDA_OK(node_cuda_alloc(0, len, &dev, why, sizeof(why)));
	CUDA_OK(node_cuda_ring_new(0, 2 << 20, 16, &r, why, sizeof(why)));
	CUDA_OK(node_cuda_upload(0, dev, block, len, why, sizeof(why))); /* warm */
	CUDA_OK(ring_upload(r, &l, payload, dev, chunk, 2));
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		CUDA_OK(node_cuda_upload(0, dev, block, len, why, sizeof(why)));
		double t1 = now_s();
		CUDA_OK(ring_upload(r, &l, payload, dev, chunk, 2));
		tr[i] = now_s() - t1;
		tm[i] = t1 - t0;
	}
	double m = median(tm, 5), p = median(tr, 5);
	printf("bench H2D %s, %zu MiB: cudaMemcpy of the block %.2f GB/s; pipelined ring "
	       "(1 MiB chunks, 2 workers) %.2f GB/s; ratio ring/cudaMemcpy %.2f (median of 5)\n",
	       what, len >> 20, len / m / 1e9, len / p / 1e9, m / p);
	node_cuda_ring_free(r);
	node_cuda_free(dev);
	free(l.pieces);
	free(payload);
	free(block);
}

static void bench_scatter(uint64_t nelem, uint64_t nchanges)
{
	const unsigned w = 2; /* BF16 */
	uint8_t *host = malloc(nelem * w), *dev = NULL;
	uint64_t *pos = malloc(nchanges * 8);
	uint8_t *vals = malloc(nchanges * w);
	struct node_cuda_scatter *sc = NULL;
	double td[5], th[5];
	uint64_t delta = 0;

	CHECK(host && pos && vals, "out of memory");
	memset(host, 0, nelem * w);
	uint64_t step = nelem / nchanges;
	for (uint64_t i = 0; i < nchanges; i++)
		pos[i] = i * step + rnd() % step;
	fill(vals, nchanges * w);
	CUDA_OK(node_cuda_alloc(0, nelem * w, (void **)&dev, why, sizeof(why)));
	CUDA_OK(node_cuda_scatter_new(0, 1 << 22, &sc, why, sizeof(why)));
	CUDA_OK(node_cuda_scatter_apply(sc, dev, nelem, w, pos, vals, nchanges, &delta, why,
					sizeof(why)));
	for (int i = 0; i < 5; i++) {
		double t0 = now_s();
		CUDA_OK(node_cuda_scatter_apply(sc, dev, nelem, w, pos, vals, nchanges, &delta, why,
						sizeof(why)));
		double t1 = now_s();
		uint64_t sum = 0;
		for (uint64_t k = 0; k < nchanges; k++) { /* the host's sparse apply, one core */
			uint8_t *at = host + pos[k] * w;
			sum = proto_wsum_update(sum, pos[k], ld(at, w), ld(vals + k * w, w));
			memcpy(at, vals + k * w, w);
		}
		th[i] = now_s() - t1;
		td[i] = t1 - t0;
		if (sum == 1)
			printf(" "); /* keeps the loop */
	}
	double d = median(td, 5), h = median(th, 5);
	printf("bench scatter: %" PRIu64 " changes into %" PRIu64 " BF16 elements: device %.0f M "
	       "changes/s (host staging and checks included); host apply one core %.0f M changes/s; "
	       "ratio %.1f (median of 5)\n",
	       nchanges, nelem, nchanges / d / 1e6, nchanges / h / 1e6, h / d);
	node_cuda_scatter_free(sc);
	node_cuda_free(dev);
	free(host);
	free(pos);
	free(vals);
}

int main(int argc, char **argv)
{
	int ndev = 0;

	if (argc == 5 && strcmp(argv[1], "--ipc-child") == 0)
		return ipc_child(argv[2], argv[3], argv[4]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	check_blake3_host(); /* the CPU alone */
	if (node_cuda_probe(&ndev, why, sizeof(why)) != 0) {
		printf("gpu-check: %s: device checks skipped%s\n", why,
		       failures ? " (the BLAKE3 host emulation FAILED)" : "");
		return failures ? 1 : 0;
	}
	printf("gpu-check: %d CUDA device(s); checks on device 0\n", ndev);
	check_ring_refuses();
	check_upload("one piece", (16 << 20) + 5, (16 << 20) + 5, (16 << 20) + 5, 1 << 20, 2 << 20, 4, 1);
	check_upload("large pieces", 64 << 20, 64 << 10, 3 << 20, 1 << 20, 2 << 20, 16, 4);
	check_upload("small odd pieces", 32 << 20, 1, 9000, 1 << 20, 2 << 20, 16, 4);
	check_upload("chunks larger than entries", 24 << 20, 4096, 1 << 20, 4 << 20, 1 << 20, 3, 2);
	check_scatter(2, (64 << 20) + 7, 1 << 20, 0);
	check_scatter(2, 100003, 5000, 1);
	check_scatter(1, 100003, 5000, 0);
	check_scatter(4, 1 << 20, 30000, 0);
	check_scatter(8, 1 << 20, 30000, 4);
	check_ipc();
	check_blake3_vectors(0);
	check_blake3_vectors(1);
	check_blake3_batch((64 << 17) + 1000, 1 << 17, 10, 0); /* full 128 KiB chunks, a short tail */
	check_blake3_batch((64 << 17) + 1000, 1 << 17, 100, 5);
	check_blake3_batch((10 << 20) + 3, (3 << 20) + 5, 2, 0); /* several 128-leaf groups a chunk */
	check_blake3_batch(1 << 20, 1000, 300, 0);               /* chunks shorter than a leaf */
	if (failures == 0) {
		bench_upload(512 << 20, 512 << 20, 512 << 20, "contiguous");
		bench_upload(512 << 20, 4096, 65536, "4-64 KiB pieces");
		bench_scatter(512ull << 20, 16 << 20);
		bench_blake3();
	}
	printf("gpu-check: %s (%d failed)\n", failures ? "FAILED" : "all checks passed", failures);
	return failures ? 1 : 0;
}
