/* Synthetic policy versions: Adam on a Llama-shaped model, exported as BF16. */
#include "proto/synth.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/pool.h"
#include "proto/safetensors.h"

#define SLICE (1u << 18) /* elements a worker generates at a time */
#define BETA1 0.9f
#define BETA2 0.999f
#define EPS 1e-8f
#define RHO 0.5f       /* share of the persistent direction in a gradient */
#define GSCALE 1e-3f   /* gradient scale (Adam makes it irrelevant but for eps) */
#define BATCH_TOKENS 65536.0

enum kind { K_EMBED, K_PROJ, K_NORM, K_HEAD };

struct tinfo {
	enum kind kind;
	uint64_t rows, cols, nelem;
	uint64_t offset; /* of its data in every file */
};

struct synth {
	const struct proto_synth_opts *o;
	struct proto_model m;
	struct tinfo *ti;
	int *fds; /* steps + 1 */
	double harmonic; /* H_V of the vocabulary, for token frequencies */
	/* work items: (tensor, slice) in order */
	_Atomic uint64_t done_elems;
	uint64_t nitems;
	uint64_t *item_tensor, *item_start;
	unsigned nth;
	struct share *shares; /* one per thread */
	atomic_bool finished;
	pthread_mutex_t lock;
	int rc;
	struct proto_err err;
};

static inline uint64_t mix(uint64_t z)
{
	z ^= z >> 30;
	z *= 0xbf58476d1ce4e5b9ull;
	z ^= z >> 27;
	z *= 0x94d049bb133111ebull;
	z ^= z >> 31;
	return z;
}

/* A key for one (purpose, tensor, step); elements are counters under it. */
static uint64_t key(uint64_t seed, uint64_t purpose, uint64_t tensor, uint64_t step)
{
	return mix(mix(mix(seed ^ 0x7e55e7a5eedull) + purpose) + tensor * 0x100000001b3ull) + step;
}

static inline uint64_t rnd(uint64_t k, uint64_t i)
{
	return mix(k + i * 0x9e3779b97f4a7c15ull);
}

/* Irwin-Hall(4) of the four 16-bit fields, scaled to mean 0, variance 1. */
static inline float ih4(uint64_t h)
{
	uint32_t s = (uint32_t)(h & 0xffff) + (uint32_t)((h >> 16) & 0xffff) +
		     (uint32_t)((h >> 32) & 0xffff) + (uint32_t)(h >> 48);
	return ((float)s - 131070.0f) * (1.0f / 37837.23f);
}

static inline float uniform(uint64_t h)
{
	return (float)(h >> 40) * (1.0f / 16777216.0f);
}

static inline uint16_t to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return 0x7fc0;
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

static int add(struct proto_model *m, const char *name, uint64_t r, uint64_t c,
	       struct proto_err *err)
{
	uint64_t shape[2] = {r, c};
	return proto_model_add(m, name, PROTO_DT_BF16, c ? 2 : 1, shape, err);
}

int proto_synth_model(uint64_t bytes, struct proto_model *m, struct proto_err *err)
{
	double p = (double)bytes / 2;
	uint64_t d = 64 * (uint64_t)PROTO_MAX(1.0, floor(sqrt(p / 128) / 64 + 0.5));
	/* The FFN width rounded to 256, as Llama's are: two-way tensor parallel
	 * shards then start on 128-element blocks (FP8 serving layouts). */
	uint64_t ff = 256 * ((8 * d / 3 + 255) / 256), kv = d >= 256 ? d / 4 : d;
	uint64_t vocab = PROTO_MIN((uint64_t)32000, PROTO_MAX((uint64_t)256, 16 * d));
	uint64_t per_layer = 2 * d * d + 2 * kv * d + 3 * d * ff + 2 * d;
	double rest = p - 2.0 * (double)(vocab * d) - (double)d;
	uint64_t layers = (uint64_t)PROTO_MAX(1.0, floor(rest / (double)per_layer + 0.5));
	char name[PROTO_NAME_MAX];
	int rc;

	proto_model_init(m);
	if (layers > 100000)
		return proto_errf(err, EINVAL, "synthetic model of %llu bytes is too large",
				  (unsigned long long)bytes);
	rc = add(m, "model.embed_tokens.weight", vocab, d, err);
	for (uint64_t l = 0; l < layers && rc == 0; l++) {
		static const struct {
			const char *suffix;
			int r, c; /* 0 = d, 1 = kv, 2 = ff, -1 = none */
		} parts[] = {
			{"input_layernorm", 0, -1},  {"self_attn.q_proj", 0, 0},
			{"self_attn.k_proj", 1, 0},  {"self_attn.v_proj", 1, 0},
			{"self_attn.o_proj", 0, 0},  {"post_attention_layernorm", 0, -1},
			{"mlp.gate_proj", 2, 0},     {"mlp.up_proj", 2, 0},
			{"mlp.down_proj", 0, 2},
		};
		for (size_t i = 0; i < PROTO_ARRAY_LEN(parts) && rc == 0; i++) {
			uint64_t dims[3] = {d, kv, ff};
			snprintf(name, sizeof(name), "model.layers.%llu.%s.weight",
				 (unsigned long long)l, parts[i].suffix);
			rc = add(m, name, dims[parts[i].r], parts[i].c < 0 ? 0 : dims[parts[i].c],
				 err);
		}
	}
	if (rc == 0)
		rc = add(m, "model.norm.weight", d, 0, err);
	if (rc == 0)
		rc = add(m, "lm_head.weight", vocab, d, err);
	if (rc == 0)
		rc = proto_model_finish(m, err);
	if (rc != 0)
		proto_model_fini(m);
	return rc;
}

static enum kind kind_of(const char *name)
{
	if (strstr(name, "embed_tokens") != NULL)
		return K_EMBED;
	if (strstr(name, "lm_head") != NULL)
		return K_HEAD;
	if (strstr(name, "norm") != NULL)
		return K_NORM;
	return K_PROJ;
}

/* Probability that token row r appears in a batch (Zipf frequencies). */
static float seen_prob(const struct synth *s, uint64_t r)
{
	double z = 1.0 / ((double)(r + 1) * s->harmonic);
	return (float)(1.0 - exp(-BATCH_TOKENS * z));
}

struct slice {
	float *theta, *m, *v;
	uint16_t *prev, *cur;
};

/* Initial masters and optimizer state of elements [a, b) of tensor t. */
static void slice_init(struct synth *s, uint32_t t, uint64_t a, uint64_t b, struct slice *sl)
{
	const struct tinfo *ti = &s->ti[t];
	uint64_t seed = s->o->seed;
	uint64_t kw = key(seed, 1, t, 0), kw2 = key(seed, 2, t, 0);
	uint64_t kmu = key(seed, 3, t, 0), kxi = key(seed, 4, t, 0), krow = key(seed, 5, t, 0);
	const float ms = sqrtf((1 - BETA1) / (1 + BETA1)), rho2 = sqrtf(1 - RHO * RHO);

	for (uint64_t i = a; i < b;) {
		uint64_t row = i / ti->cols, end = PROTO_MIN(b, (row + 1) * ti->cols);
		float rs = GSCALE * expf(0.5f * ih4(rnd(krow, row)));
		float q = ti->kind == K_EMBED ? seen_prob(s, row) : 1.0f;
		float base = ti->kind == K_NORM ? 1.0f : 0.0f;
		float sd = ti->kind == K_NORM ? 0.05f : 0.02f;

		for (uint64_t j = i; j < end; j++) {
			size_t k = j - a;
			/* Irwin-Hall(8) from two hashes for the weights themselves. */
			float w = (ih4(rnd(kw, j)) + ih4(rnd(kw2, j))) * 0.70710678f;
			float mu = ih4(rnd(kmu, j)), xi = ih4(rnd(kxi, j));
			sl->theta[k] = base + sd * w;
			sl->m[k] = rs * (q * RHO * mu + rho2 * ms * sqrtf(q) * xi);
			sl->v[k] = q * rs * rs * (RHO * RHO * mu * mu + rho2 * rho2);
		}
		i = end;
	}
}

/* One Adam step on elements [a, b) of tensor t. */
static void slice_step(struct synth *s, uint32_t t, uint32_t step, uint64_t a, uint64_t b,
		       struct slice *sl)
{
	const struct tinfo *ti = &s->ti[t];
	uint64_t seed = s->o->seed;
	uint64_t kmu = key(seed, 3, t, 0), krow = key(seed, 5, t, 0);
	uint64_t keps = key(seed, 6, t, step), kseen = key(seed, 7, t, step);
	const float lr = (float)s->o->lr, rho2 = sqrtf(1 - RHO * RHO);

	for (uint64_t i = a; i < b;) {
		uint64_t row = i / ti->cols, end = PROTO_MIN(b, (row + 1) * ti->cols);
		float gs = GSCALE * expf(0.5f * ih4(rnd(krow, row)));

		if (ti->kind == K_EMBED && uniform(rnd(kseen, row)) >= seen_prob(s, row))
			gs = 0; /* token not in this batch: no gradient */
		for (uint64_t j = i; j < end; j++) {
			size_t k = j - a;
			float g = gs * (RHO * ih4(rnd(kmu, j)) + rho2 * ih4(rnd(keps, j)));
			float m = BETA1 * sl->m[k] + (1 - BETA1) * g;
			float v = BETA2 * sl->v[k] + (1 - BETA2) * g * g;
			sl->m[k] = m;
			sl->v[k] = v;
			sl->theta[k] -= lr * m / (sqrtf(v) + EPS);
		}
		i = end;
	}
}

static int put(struct synth *s, uint32_t k, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;

	while (len > 0) {
		ssize_t n = pwrite(s->fds[k], p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -(n < 0 ? errno : EIO);
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* One thread's share: its slice buffers, made at its first item, and the
 * elements it saw change per version (steps + 1). */
struct share {
	struct slice sl;
	uint64_t *changed;
	bool ready;
};

static void share_fini(struct share *sh)
{
	free(sh->changed);
	free(sh->sl.theta);
	free(sh->sl.m);
	free(sh->sl.v);
	free(sh->sl.prev);
	free(sh->sl.cur);
}

/* Generates work item it (a slice of one tensor) in every version. */
static int gen_item(void *arg, unsigned slot, uint64_t it)
{
	struct synth *s = arg;
	struct share *sh = &s->shares[slot];
	struct slice *sl = &sh->sl;
	uint32_t steps = s->o->steps;
	int rc;

	if (!sh->ready) {
		sh->changed = calloc(steps + 1, sizeof(*sh->changed));
		sl->theta = malloc(SLICE * sizeof(float));
		sl->m = malloc(SLICE * sizeof(float));
		sl->v = malloc(SLICE * sizeof(float));
		sl->prev = malloc(SLICE * sizeof(uint16_t));
		sl->cur = malloc(SLICE * sizeof(uint16_t));
		sh->ready = true;
		if (sh->changed == NULL || !sl->theta || !sl->m || !sl->v || !sl->prev || !sl->cur) {
			rc = -ENOMEM;
			goto fail;
		}
	}
	uint32_t t = (uint32_t)s->item_tensor[it];
	const struct tinfo *ti = &s->ti[t];
	uint64_t a = s->item_start[it], b = PROTO_MIN(a + SLICE, ti->nelem), n = b - a;

	slice_init(s, t, a, b, sl);
	for (uint64_t k = 0; k < n; k++)
		sl->prev[k] = to_bf16(sl->theta[k]);
	rc = put(s, 0, sl->prev, n * 2, ti->offset + a * 2);
	for (uint32_t k = 1; k <= steps && rc == 0; k++) {
		uint64_t c = 0;
		uint16_t *tmp;
		if (ti->kind != K_HEAD)
			slice_step(s, t, k, a, b, sl);
		for (uint64_t j = 0; j < n; j++) {
			sl->cur[j] = to_bf16(sl->theta[j]);
			c += sl->cur[j] != sl->prev[j];
		}
		sh->changed[k] += c;
		rc = put(s, k, sl->cur, n * 2, ti->offset + a * 2);
		tmp = sl->prev;
		sl->prev = sl->cur;
		sl->cur = tmp;
	}
	if (rc != 0)
		goto fail;
	atomic_fetch_add(&s->done_elems, n);
	return 0;
fail:
	pthread_mutex_lock(&s->lock);
	if (s->rc == 0)
		s->rc = proto_errf(&s->err, -rc, "writing a version: %s", strerror(-rc));
	pthread_mutex_unlock(&s->lock);
	return 1;
}

/* Every work item, on the pool; runs as a task while the caller reports
 * progress. */
static void gen_all(void *arg)
{
	struct synth *s = arg;

	proto_pool_for(s->nitems, s->nth, gen_item, s);
	atomic_store(&s->finished, true);
}

static void path_of(char *buf, size_t len, const char *dir, uint32_t k, int tmp)
{
	snprintf(buf, len, "%s/v%u.safetensors%s", dir, k, tmp ? ".tmp" : "");
}

int proto_synth_run(const char *dir, const struct proto_synth_opts *o,
		    uint64_t *changed, uint64_t *nelem, struct proto_err *err)
{
	struct synth s;
	struct proto_pool_task task;
	uint64_t total = 0;
	char path[4096], final[4096];
	int rc;

	memset(&s, 0, sizeof(s));
	s.o = o;
	pthread_mutex_init(&s.lock, NULL);
	if (o->steps > 100000 || !(o->lr > 0 && o->lr < 1)) {
		rc = proto_errf(err, EINVAL, "synth: steps must be <= 100000 and 0 < lr < 1");
		pthread_mutex_destroy(&s.lock);
		return rc;
	}
	rc = proto_synth_model(o->bytes, &s.m, err);
	if (rc != 0) {
		pthread_mutex_destroy(&s.lock);
		return rc;
	}
	s.nth = o->threads ? o->threads : 1;
	s.ti = calloc(s.m.ntensors, sizeof(*s.ti));
	s.fds = malloc((o->steps + 1) * sizeof(int));
	s.shares = calloc(s.nth, sizeof(*s.shares));
	if (s.ti == NULL || s.fds == NULL || s.shares == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	for (uint32_t k = 0; k <= o->steps; k++)
		s.fds[k] = -1;
	/* Every version has the same header: the same tensors and metadata. */
	for (uint32_t k = 0; k <= o->steps; k++) {
		char desc[96];
		uint8_t *hdr;
		size_t hlen;
		json_t *md;

		snprintf(desc, sizeof(desc), "seed=%llu lr=%g", (unsigned long long)o->seed,
			 o->lr);
		md = json_pack("{s:s,s:s}", "format", "pt", "tessera.synth", desc);
		rc = proto_st_header_build(&s.m, md, &hdr, &hlen, err);
		json_decref(md);
		if (rc != 0)
			goto fail;
		if (k == 0) {
			uint64_t at = hlen;
			for (uint32_t t = 0; t < s.m.ntensors; t++) {
				struct proto_tensor *pt = &s.m.tensors[t];
				s.ti[t].kind = kind_of(pt->name);
				s.ti[t].nelem = pt->nelem;
				s.ti[t].cols = pt->ndim == 2 ? pt->shape[1] : pt->nelem;
				s.ti[t].rows = pt->ndim == 2 ? pt->shape[0] : 1;
				s.ti[t].offset = at;
				if (s.ti[t].kind == K_EMBED)
					s.harmonic = log((double)s.ti[t].rows) + 0.5772;
				at += pt->nbytes;
				s.nitems += (pt->nelem + SLICE - 1) / SLICE;
			}
			total = at;
		}
		path_of(path, sizeof(path), dir, k, 1);
		s.fds[k] = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (s.fds[k] < 0 || ftruncate(s.fds[k], (off_t)total) != 0) {
			rc = proto_errf(err, errno, "%s: %s", path, strerror(errno));
			free(hdr);
			goto fail;
		}
		rc = put(&s, k, hdr, hlen, 0);
		free(hdr);
		if (rc != 0) {
			rc = proto_errf(err, -rc, "%s: %s", path, strerror(-rc));
			goto fail;
		}
	}
	s.item_tensor = malloc(s.nitems * sizeof(uint64_t));
	s.item_start = malloc(s.nitems * sizeof(uint64_t));
	if (s.item_tensor == NULL || s.item_start == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	for (uint64_t t = 0, it = 0; t < s.m.ntensors; t++)
		for (uint64_t a = 0; a < s.ti[t].nelem; a += SLICE, it++) {
			s.item_tensor[it] = t;
			s.item_start[it] = a;
		}
	if (!o->progress || proto_pool_start(&task, gen_all, &s) != 0) {
		gen_all(&s);
	} else {
		uint64_t all = proto_model_bytes(&s.m) / 2, last = 0;
		while (atomic_load(&s.done_elems) < all && !atomic_load(&s.finished)) {
			struct timespec ts = {0, 200000000};
			nanosleep(&ts, NULL);
			pthread_mutex_lock(&s.lock);
			rc = s.rc;
			pthread_mutex_unlock(&s.lock);
			if (rc != 0)
				break;
			uint64_t now = proto_now_ns();
			if (now - last > 1000000000ull) {
				fprintf(stderr, "\rsynth: %5.1f%%",
					100.0 * (double)atomic_load(&s.done_elems) / (double)all);
				last = now;
			}
		}
		proto_pool_join(&task);
	}
	if (o->progress)
		fprintf(stderr, "\rsynth: done   \n");
	if (s.rc != 0) {
		rc = s.rc;
		if (err != NULL)
			*err = s.err;
		goto fail;
	}
	for (uint32_t k = 0; k <= o->steps; k++) {
		path_of(path, sizeof(path), dir, k, 1);
		path_of(final, sizeof(final), dir, k, 0);
		if (fsync(s.fds[k]) != 0 || close(s.fds[k]) != 0) {
			s.fds[k] = -1;
			rc = proto_errf(err, errno, "%s: %s", path, strerror(errno));
			goto fail;
		}
		s.fds[k] = -1;
		if (rename(path, final) != 0) {
			rc = proto_errf(err, errno, "%s: %s", final, strerror(errno));
			goto fail;
		}
	}
	if (changed != NULL) {
		memset(changed, 0, (o->steps + 1) * sizeof(uint64_t));
		for (unsigned i = 0; i < s.nth; i++)
			for (uint32_t k = 0; k <= o->steps && s.shares[i].changed != NULL; k++)
				changed[k] += s.shares[i].changed[k];
	}
	if (nelem != NULL)
		*nelem = proto_model_bytes(&s.m) / 2;
	rc = 0;
fail:
	if (s.fds != NULL)
		for (uint32_t k = 0; k <= o->steps; k++) {
			if (s.fds[k] >= 0) {
				close(s.fds[k]);
				path_of(path, sizeof(path), dir, k, 1);
				unlink(path);
			}
		}
	for (unsigned i = 0; s.shares != NULL && i < s.nth; i++)
		share_fini(&s.shares[i]);
	free(s.shares);
	free(s.item_tensor);
	free(s.item_start);
	free(s.ti);
	free(s.fds);
	proto_model_fini(&s.m);
	pthread_mutex_destroy(&s.lock);
	return rc;
}
