/* Node stores: host slots a serving process can map, and the CUDA store,
 * which needs a visible GPU (skipped, saying so, when there is none). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "node/store/store.h"
#include "proto/delta.h"
#include "proto/dpatch.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tests/cudatest.h"
#include "tests/testutil.h"

static void test_host_slot_is_mappable(void **state)
{
	struct node_store s;
	struct node_slot *slot;
	struct proto_err err;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_int_equal(node_slot_new(&s, 7, 10000, &slot, &err), 0);
	for (size_t i = 0; i < slot->len; i++)
		slot->host[i] = (uint8_t)(i * 31 + 7);
	assert_int_equal(node_slot_activate(&s, slot, &err), 0);
	/* No device copy: activating a patched slot is the plain activation. */
	assert_int_equal(node_slot_activate_patched(&s, slot, NULL, 0, &err), 0);
	assert_null(slot->dev);
	json_t *d = node_slot_describe(&s, slot);
	assert_non_null(d);
	assert_string_equal(json_string_value(json_object_get(d, "store")), "host");
	assert_int_equal(json_integer_value(json_object_get(d, "size")), 10000);
	/* Another process would open this path; so can we. */
	const char *path = json_string_value(json_object_get(d, "memfd_path"));
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	uint8_t *m = mmap(NULL, 10000, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(m != MAP_FAILED);
	assert_memory_equal(m, slot->host, 10000);
	munmap(m, 10000);
	close(fd);
	json_decref(d);
	node_slot_free(&s, slot);
}

/* A node keeps its last freed slot and makes the next one of that size
 * from it (same memory, the new version); another size gets a new slot,
 * and close frees the spare (ASan sees any leak). */
static void test_spare_slot_is_reused(void **state)
{
	struct node_store s;
	struct node_slot *a, *b, *c, *d;
	struct proto_err err;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	node_store_keep_spare(&s);
	assert_int_equal(node_slot_new(&s, 1, 8192, &a, &err), 0);
	assert_int_equal(node_slot_new(&s, 2, 8192, &b, &err), 0);
	memset(a->host, 0x11, a->len);
	assert_true(a->fresh);
	a->fresh = false; /* written through host: the spare says so */
	uint8_t *mem = a->host;
	node_slot_free(&s, a);
	node_slot_free(&s, b); /* one spare at most: this one is unmapped */
	assert_int_equal(node_slot_new(&s, 3, 8192, &c, &err), 0);
	assert_ptr_equal(c->host, mem);
	assert_int_equal(c->version, 3);
	assert_false(c->fresh);
	assert_int_equal(c->host[100], 0x11); /* the retired bytes: the caller overwrites */
	assert_int_equal(node_slot_new_blank(&s, 4, 8192, &d, &err), 0);
	assert_ptr_not_equal(d->host, mem); /* no spare left: a new, zeroed one */
	assert_true(d->fresh);
	assert_int_equal(d->host[100], 0);
	node_slot_free(&s, d);
	assert_int_equal(node_slot_new(&s, 4, 8192, &d, &err), 0);
	assert_true(d->fresh); /* a spare never written through host stays fresh */
	node_slot_free(&s, c);
	node_slot_free(&s, d);
	struct node_slot *e;
	assert_int_equal(node_slot_new(&s, 5, 4096, &e, &err), 0); /* another size */
	assert_int_equal(e->len, 4096);
	assert_int_equal(e->host[100], 0);
	node_slot_free(&s, e);
	node_store_close(&s);
	/* Without keep_spare, freeing frees. */
	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_int_equal(node_slot_new(&s, 6, 8192, &a, &err), 0);
	node_slot_free(&s, a);
	assert_null(s.spare);
	node_store_close(&s);
}

/* A blank slot's pages are touched (its first accesses taken ahead) and
 * stay zero, its bytes unchanged otherwise; a set stop flag stops the
 * touch before any page with -EINTR, and a stopped slot is still a slot. */
static void test_slot_touch(void **state)
{
	struct node_store s;
	struct node_slot *a;
	struct proto_err err;
	int stop = 0;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_int_equal(node_slot_new_blank(&s, 1, (9u << 20) + 4096, &a, &err), 0);
	stop = 1;
	assert_int_equal(node_slot_touch(a, &stop, NULL), -EINTR);
	stop = 0;
	assert_int_equal(node_slot_touch(a, &stop, NULL), 0);
	for (size_t off = 0; off < a->len; off += 4096)
		assert_int_equal(a->host[off], 0);
	memset(a->host + a->len - 10, 0x5a, 10);
	assert_int_equal(node_slot_touch(a, &stop, NULL), 0); /* again: reads, changes nothing */
	assert_int_equal(a->host[a->len - 1], 0x5a);
	node_slot_free(&s, a);
	node_store_close(&s);
}

/* Pages of a's mapping the kernel holds. */
static size_t resident_pages(const struct node_slot *a)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE), n = (a->len + page - 1) / page, in = 0;
	unsigned char *v = malloc(n);

	assert_non_null(v);
	assert_int_equal(mincore(a->host, a->len, v), 0);
	for (size_t i = 0; i < n; i++)
		in += v[i] & 1;
	free(v);
	return in;
}

struct touch_arg {
	struct node_slot *slot;
	int stop, pause, rc;
};

static void *touch_thread(void *arg)
{
	struct touch_arg *t = arg;

	/* As the warm slot's worker: the kernel maps the pages, then each
	 * is read. */
	t->rc = node_slot_populate(t->slot, &t->stop, &t->pause);
	if (t->rc == 0 || t->rc == -ENOTSUP)
		t->rc = node_slot_touch(t->slot, &t->stop, &t->pause);
	return NULL;
}

static long thread_faults(void)
{
	struct rusage ru;

	assert_int_equal(getrusage(RUSAGE_THREAD, &ru), 0);
	return ru.ru_minflt;
}

/* A populated slot has every page in, zero, and its touch then takes no
 * page fault: a touch at the lowest priority never holds the process's
 * address space (node_slot_touch). A set stop flag stops the populate
 * before any page with -EINTR. */
static void test_slot_populate(void **state)
{
	struct node_store s;
	struct node_slot *a;
	struct proto_err err;
	int stop = 1;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_int_equal(node_slot_new_blank(&s, 1, (3u << 20) + 4096, &a, &err), 0);
	assert_int_equal(node_slot_populate(a, &stop, NULL), -EINTR);
	assert_int_equal(resident_pages(a), 0);
	stop = 0;
	int rc = node_slot_populate(a, &stop, NULL);
	if (rc == -ENOTSUP) {
		print_message("skipped: this kernel has no MADV_POPULATE_WRITE (Linux 5.14)\n");
	} else {
		assert_int_equal(rc, 0);
		assert_int_equal(resident_pages(a), a->len / (size_t)sysconf(_SC_PAGESIZE));
		/* Unpopulated, the touch faults on every page; here on none
		 * of the slot's. Under AddressSanitizer its reads fault in
		 * the shadow's pages: an eighth of the slot's, one more where
		 * they straddle (97 of these 769, measured: an eighth plus one
		 * left no room for any other fault of the thread); a quarter
		 * still tells the two apart. */
		size_t pages = a->len / (size_t)sysconf(_SC_PAGESIZE);
		long f0 = thread_faults();
		assert_int_equal(node_slot_touch(a, &stop, NULL), 0);
		assert_true((size_t)(thread_faults() - f0) <= pages / 4);
		for (size_t off = 0; off < a->len; off += 4096)
			assert_int_equal(a->host[off], 0);
	}
	node_slot_free(&s, a);
	node_store_close(&s);
}

/* A paused touch takes no page while it waits (a node's fetch keeps the
 * CPU), goes on to every page once let go, and a stop ends it while it
 * waits. */
static void test_slot_touch_pause(void **state)
{
	struct node_store s;
	struct node_slot *a;
	struct proto_err err;
	struct touch_arg t = {.pause = 1};
	pthread_t th;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_int_equal(node_slot_new_blank(&s, 1, 8u << 20, &a, &err), 0);
	assert_int_equal(resident_pages(a), 0);
	t.slot = a;
	assert_int_equal(pthread_create(&th, NULL, touch_thread, &t), 0);
	usleep(100 * 1000); /* unpaused, it would have taken pages by now */
	assert_int_equal(resident_pages(a), 0);
	__atomic_store_n(&t.pause, 0, __ATOMIC_RELAXED);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(t.rc, 0);
	assert_int_equal(resident_pages(a), a->len / (size_t)sysconf(_SC_PAGESIZE));
	node_slot_free(&s, a);

	assert_int_equal(node_slot_new_blank(&s, 2, 8u << 20, &a, &err), 0);
	t = (struct touch_arg){.slot = a, .pause = 1};
	assert_int_equal(pthread_create(&th, NULL, touch_thread, &t), 0);
	__atomic_store_n(&t.stop, 1, __ATOMIC_RELAXED);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(t.rc, -EINTR);
	assert_int_equal(resident_pages(a), 0);
	node_slot_free(&s, a);
	node_store_close(&s);
}

/* A tagged slot (what an activated version held) comes back by its tag
 * with its bytes, and only by it; of two freed slots the spare keeps the
 * larger tag (the later retired), whichever is freed first. */
static void test_spare_slot_by_tag(void **state)
{
	struct node_store s;
	struct node_slot *a, *b, *c;
	struct proto_err err;

	assert_int_equal(node_store_open("host", &s, &err), 0);
	node_store_keep_spare(&s);
	assert_int_equal(node_slot_new(&s, 1, 8192, &a, &err), 0);
	assert_int_equal(node_slot_new(&s, 2, 8192, &b, &err), 0);
	memset(a->host, 0x22, a->len);
	a->tag = 7;
	b->tag = 3;
	uint8_t *mem = a->host;
	node_slot_free(&s, b);
	node_slot_free(&s, a); /* displaces b: a larger tag */
	assert_int_equal(node_slot_reuse(&s, 3, 9, 8192, &c), -ENOENT);
	assert_null(c);
	assert_int_equal(node_slot_reuse(&s, 7, 9, 4096, &c), -ENOENT); /* another size */
	assert_int_equal(node_slot_reuse(&s, 0, 9, 8192, &c), -ENOENT);
	assert_int_equal(node_slot_reuse(&s, 7, 9, 8192, &c), 0);
	assert_ptr_equal(c->host, mem);
	assert_int_equal(c->host[100], 0x22);
	assert_int_equal(c->version, 9);
	assert_int_equal(c->tag, 0); /* the caller writes it now */
	assert_int_equal(node_slot_reuse(&s, 7, 9, 8192, &b), -ENOENT); /* taken */
	c->tag = 8;
	node_slot_free(&s, c);
	assert_int_equal(node_slot_new(&s, 10, 8192, &b, &err), 0); /* any spare as memory */
	assert_ptr_equal(b->host, mem);
	assert_int_equal(b->tag, 0);
	node_slot_free(&s, b);
	node_store_close(&s);
}

static void test_store_names(void **state)
{
	struct node_store s;
	struct proto_err err;
	assert_int_equal(node_store_open("disk", &s, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "disk"));
	const char *bad[] = {"cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cuda:99999", "cudax", "cuda1"};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		assert_int_equal(node_store_open(bad[i], &s, &err), -EINVAL);
		assert_non_null(strstr(err.msg, "want host, cuda, cuda:DEVICE or auto"));
	}
	/* A device that is not there (none, or not that many) is named. */
	assert_int_equal(node_store_open("cuda:1000", &s, &err), -ENODEV);
	assert_non_null(strstr(err.msg, "store cuda:1000: "));
	/* auto always works: CUDA when there is a GPU, else host. */
	assert_int_equal(node_store_open("auto", &s, &err), 0);
	node_store_close(&s);
}

static void test_fold_matches_on_host(void **state)
{
	uint8_t a[13] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, b[13];
	memcpy(b, a, sizeof(a));
	assert_true(node_host_fold(a, 13) == node_host_fold(b, 13));
	b[12] ^= 1;
	assert_true(node_host_fold(a, 13) != node_host_fold(b, 13));
	/* Position matters: swapping words changes the fold. */
	uint64_t w[2] = {1, 2}, v[2] = {2, 1};
	assert_true(node_host_fold(w, 16) != node_host_fold(v, 16));
}

static void test_cuda_store(void **state)
{
#ifndef TESSERA_CUDA
	print_message("skipped: tessera was built without CUDA (no nvcc)\n");
	skip();
#else
	struct node_store s;
	struct node_slot *slot;
	struct proto_err err;
	char why[256];

	tu_skip_without_gpu();
	assert_int_equal(node_store_open("cuda", &s, &err), 0);
	assert_int_equal(node_slot_new(&s, 1, (64 << 20) + 5, &slot, &err), 0);
	for (size_t i = 0; i < slot->len; i++)
		slot->host[i] = (uint8_t)(i * 2654435761u >> 13);
	assert_int_equal(node_slot_activate(&s, slot, &err), 0);
	assert_non_null(slot->dev);
	uint64_t fold = 0;
	assert_int_equal(node_cuda_fold(s.device, slot->dev, slot->len, &fold, why, sizeof(why)), 0);
	assert_true(fold == node_host_fold(slot->host, slot->len));
	json_t *d = node_slot_describe(&s, slot);
	assert_non_null(d);
	assert_int_equal(strlen(json_string_value(json_object_get(d, "cuda_ipc_handle"))), 128);
	json_decref(d);
	node_slot_free(&s, slot);
	node_store_close(&s);
#endif
}

/* A tp2 rank's slot filled as a fetch fills it: payload chunks scattered by
 * the plan, each handed to node_slot_stream_chunk. */
struct stream_env {
	struct proto_model m;
	struct proto_layout src, dst;
	struct proto_plan plan;
	uint64_t expect; /* payload bytes for dst rank 0 */
};

static void stream_env_init(struct stream_env *e)
{
	/* Llama-shaped: tp2 splits rows of some tensors and columns of others. */
	const char *model =
		"{\"tensors\":["
		"{\"name\":\"model.embed_tokens.weight\",\"dtype\":\"bf16\",\"shape\":[64,256]},"
		"{\"name\":\"model.layers.0.self_attn.q_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,256]},"
		"{\"name\":\"model.layers.0.self_attn.k_proj.weight\",\"dtype\":\"bf16\",\"shape\":[128,256]},"
		"{\"name\":\"model.layers.0.self_attn.v_proj.weight\",\"dtype\":\"bf16\",\"shape\":[128,256]},"
		"{\"name\":\"model.layers.0.self_attn.o_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,256]},"
		"{\"name\":\"model.layers.0.mlp.gate_proj.weight\",\"dtype\":\"bf16\",\"shape\":[512,256]},"
		"{\"name\":\"model.layers.0.mlp.up_proj.weight\",\"dtype\":\"bf16\",\"shape\":[512,256]},"
		"{\"name\":\"model.layers.0.mlp.down_proj.weight\",\"dtype\":\"bf16\",\"shape\":[256,512]},"
		"{\"name\":\"model.layers.0.input_layernorm.weight\",\"dtype\":\"bf16\",\"shape\":[256]},"
		"{\"name\":\"model.norm.weight\",\"dtype\":\"bf16\",\"shape\":[256]},"
		"{\"name\":\"lm_head.weight\",\"dtype\":\"bf16\",\"shape\":[64,256]}]}";
	struct proto_err err;

	assert_int_equal(proto_model_parse(model, strlen(model), "model", &e->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "fsdp2", &e->src, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "tp2", &e->dst, &err), 0);
	assert_int_equal(proto_plan_build(&e->m, &e->src, &e->dst, &e->plan, &err), 0);
	e->expect = 0;
	for (uint32_t i = 0; i < e->plan.nparcels; i++)
		if (e->plan.parcels[i].dst_rank == 0)
			e->expect += e->plan.parcels[i].bytes;
}

static void stream_env_fini(struct stream_env *e)
{
	proto_plan_fini(&e->plan);
	proto_layout_fini(&e->src);
	proto_layout_fini(&e->dst);
	proto_model_fini(&e->m);
}

/* Scatters random payload into slot chunk by chunk, streaming each but
 * chunk `skip` (UINT64_MAX: none); returns the bytes handed over. */
static uint64_t stream_fill(struct stream_env *e, struct node_store *s, struct node_slot *slot,
			    uint64_t skip)
{
	const uint64_t chunk = 10000; /* odd: chunks straddle runs */
	uint64_t k = 0, handed = 0;
	uint8_t *buf = malloc(chunk);

	assert_non_null(buf);
	for (uint32_t i = 0; i < e->plan.nparcels; i++) {
		const struct proto_parcel *pc = &e->plan.parcels[i];
		if (pc->dst_rank != 0)
			continue;
		for (uint64_t off = 0; off < pc->bytes; off += chunk, k++) {
			uint64_t n = PROTO_MIN(chunk, pc->bytes - off);
			for (uint64_t j = 0; j < n; j++)
				buf[j] = (uint8_t)((k * 131 + j * 7) >> 1);
			proto_parcel_scatter(&e->plan, pc, &e->dst, slot->host, off, n, buf);
			if (k == skip)
				continue;
			node_slot_stream_chunk(s, slot, &e->plan, pc, &e->dst, off, buf, n);
			handed += n;
		}
	}
	free(buf);
	return handed;
}

/* The host store does not stream: chunks are left where they were placed. */
static void test_host_store_does_not_stream(void **state)
{
	struct stream_env e;
	struct node_store s;
	struct node_slot *slot;
	struct proto_err err;

	stream_env_init(&e);
	assert_int_equal(node_store_open("host", &s, &err), 0);
	assert_false(node_store_streams(&s));
	assert_int_equal(node_slot_new(&s, 1, e.dst.ranks[0].nbytes, &slot, &err), 0);
	node_slot_stream_begin(&s, slot, e.expect);
	assert_false(slot->streaming);
	stream_fill(&e, &s, slot, UINT64_MAX);
	assert_int_equal(slot->streamed, 0);
	assert_int_equal(node_slot_activate(&s, slot, &err), 0);
	assert_null(slot->dev);
	node_slot_free(&s, slot);
	node_store_close(&s);
	stream_env_fini(&e);
}

/* The CUDA store uploads each chunk as it is handed over; activation waits
 * for them, and the device holds the host slot's bytes. With a chunk not
 * handed over, activation uploads the slot whole. */
static void test_cuda_streamed_slot(void **state)
{
#ifndef TESSERA_CUDA
	print_message("skipped: tessera was built without CUDA (no nvcc)\n");
	skip();
#else
	struct stream_env e;
	struct node_store s;
	struct proto_err err;
	char why[256];

	tu_skip_without_gpu();
	stream_env_init(&e);
	assert_int_equal(node_store_open("cuda", &s, &err), 0);
	assert_true(node_store_streams(&s));
	for (int round = 0; round < 2; round++) {
		struct node_slot *slot;
		size_t len = e.dst.ranks[0].nbytes;
		assert_int_equal(node_slot_new(&s, 1 + round, len, &slot, &err), 0);
		node_slot_stream_begin(&s, slot, e.expect);
		uint64_t handed = stream_fill(&e, &s, slot, round == 0 ? UINT64_MAX : 3);
		assert_int_equal(slot->streamed, handed);
		assert_true(round == 0 ? handed == e.expect : handed < e.expect);
		assert_int_equal(node_slot_activate(&s, slot, &err), 0);
		uint8_t *got = malloc(len);
		assert_non_null(got);
		assert_int_equal(node_cuda_download(s.device, got, slot->dev, len, why, sizeof(why)), 0);
		assert_memory_equal(got, slot->host, len);
		free(got);
		node_slot_free(&s, slot);
	}
	node_store_close(&s);
	stream_env_fini(&e);
#endif
}

#ifdef TESSERA_CUDA
/* A tp1 rank's delta from the slot's host bytes (parent) to a child with
 * one byte in 61 changed, prepared into pt[0..np) and written into the host
 * slot, as an in-place install does. */
static uint32_t patch_slot(struct node_slot *slot, const struct proto_model *m,
			   const struct proto_layout *l, const struct proto_plan *plan,
			   struct proto_dparcel *dp, struct proto_dpatch *pt)
{
	struct proto_err err;

	for (uint32_t k = 0; k < plan->nparcels; k++) {
		const struct proto_parcel *pc = &plan->parcels[k];
		uint8_t *par = malloc(pc->bytes + 1), *chi = malloc(pc->bytes + 1), *enc;
		uint64_t *sums;
		size_t len;
		assert_int_equal(proto_dparcel_build(m, plan, pc, l, &dp[k], &err), 0);
		proto_parcel_gather(plan, pc, l, slot->host, 0, pc->bytes, par);
		memcpy(chi, par, pc->bytes);
		for (uint64_t i = k; i < pc->bytes; i += 61)
			chi[i] ^= 0x21;
		assert_int_equal(proto_dparcel_encode(&dp[k], par, chi, NULL, &enc, &len, NULL, &err), 0);
		sums = malloc(((size_t)dp[k].npieces + 1) * sizeof(*sums));
		assert_non_null(sums);
		proto_dparcel_sums(&dp[k], slot->host, sums);
		assert_int_equal(proto_dpatch_prepare(&dp[k], enc, len, slot->host, sums, NULL, &pt[k],
						      &err), 0);
		free(sums);
		free(enc);
		free(par);
		free(chi);
	}
	proto_dpatch_write(pt, plan->nparcels, NULL);
	return plan->nparcels;
}
#endif

/*
 * In place on the CUDA store: a delta's changes, prepared on the host and
 * written into the served slot, are scattered into the device copy, which
 * then equals the host slot. When the device copy is not the delta's
 * parent (here two bytes changed behind the store's back: one where the
 * delta changes an element, one where it does not), the checksums the
 * scatter computes disagree with the host's and the slot is uploaded
 * whole: the device equals the host all the same, both bytes included.
 */
static void test_cuda_patched_slot(void **state)
{
#ifndef TESSERA_CUDA
	print_message("skipped: tessera was built without CUDA (no nvcc)\n");
	skip();
#else
	struct node_store s;
	struct node_slot *slot;
	struct proto_model m;
	struct proto_layout l;
	struct proto_plan plan;
	struct proto_err err;
	char why[256];

	tu_skip_without_gpu();
	assert_int_equal(proto_fixture_model(3 << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp1", &l, &err), 0);
	assert_int_equal(proto_plan_build(&m, &l, &l, &plan, &err), 0);
	size_t len = l.ranks[0].nbytes;
	struct proto_dparcel *dp = calloc(plan.nparcels + 1, sizeof(*dp));
	struct proto_dpatch *pt = calloc(plan.nparcels + 1, sizeof(*pt));
	uint8_t *got = malloc(len);
	assert_true(dp != NULL && pt != NULL && got != NULL);
	assert_int_equal(node_store_open("cuda", &s, &err), 0);
	assert_int_equal(node_slot_new(&s, 1, len, &slot, &err), 0);
	proto_fixture_fill_rank(&m, &l, 0, 9, 1, slot->host);
	assert_int_equal(node_slot_activate(&s, slot, &err), 0);
	for (int round = 0; round < 2; round++) {
		uint32_t np = patch_slot(slot, &m, &l, &plan, dp, pt);
		if (round == 1) {
			/* The first change of a chunk whose first element is
			 * not changed, and that first element, each made
			 * different on the device. */
			const struct proto_dpatch_chunk *pc = NULL;
			for (uint32_t k = 0; pc == NULL && k < np; k++)
				for (uint32_t ci = 0; pc == NULL && ci < pt[k].nchunks; ci++)
					if (pt[k].chunks[ci].n > 0 && pt[k].chunks[ci].pos[0] > 0)
						pc = &pt[k].chunks[ci];
			assert_non_null(pc);
			uint32_t u = 0;
			size_t at[2] = {(size_t)(pc->dst - slot->host) + (size_t)pc->pos[0] * pc->w,
					(size_t)(pc->dst - slot->host) + (size_t)u * pc->w};
			for (int i = 0; i < 2; i++) {
				uint8_t b = (uint8_t)(slot->host[at[i]] ^ 0x5a);
				assert_int_equal(node_cuda_upload(s.device, (uint8_t *)slot->dev + at[i], &b,
								  1, why, sizeof(why)), 0);
			}
		}
		assert_int_equal(node_slot_activate_patched(&s, slot, pt, np, &err), 0);
		assert_int_equal(node_cuda_download(s.device, got, slot->dev, len, why, sizeof(why)), 0);
		assert_memory_equal(got, slot->host, len);
		for (uint32_t k = 0; k < np; k++) {
			proto_dpatch_fini(&pt[k]);
			proto_dparcel_fini(&dp[k]);
		}
	}
	node_slot_free(&s, slot);
	node_store_close(&s);
	free(got);
	free(pt);
	free(dp);
	proto_plan_fini(&plan);
	proto_layout_fini(&l);
	proto_model_fini(&m);
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_host_slot_is_mappable),
		cmocka_unit_test(test_spare_slot_is_reused),
		cmocka_unit_test(test_spare_slot_by_tag),
		cmocka_unit_test(test_slot_touch),
		cmocka_unit_test(test_slot_populate),
		cmocka_unit_test(test_slot_touch_pause),
		cmocka_unit_test(test_store_names),
		cmocka_unit_test(test_fold_matches_on_host),
		cmocka_unit_test(test_cuda_store),
		cmocka_unit_test(test_host_store_does_not_stream),
		cmocka_unit_test(test_cuda_streamed_slot),
		cmocka_unit_test(test_cuda_patched_slot),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
