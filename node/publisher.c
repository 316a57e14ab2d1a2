/* The trainer-side publisher: snapshot, plan, gather, hash, sign, publish, serve (design in publisher.h). */
#include "node/publisher.h"

#include <dirent.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fabric/fab.h"
#include "node/fabloop.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "proto/safetensors.h"
#include "tracker/tracker.h"

#define PUB_ALIGN 4096u           /* parcels start page-aligned in a buffer */
#define HUGE_ALIGN (2u << 20)     /* large buffers: transparent huge pages */
#define HASH_STEP (256u << 10)    /* gather then hash this much while in cache */
#define LAYOUTS_RETRY_MS 200      /* no serving layout yet: ask again */
#define RETRY_MS 500              /* tracker unreachable: try again */
#define REGISTER_RETRY_MS 1000
#define WATCH_WAIT_MS 10000       /* long-poll for a version we wait for */
#define PUBLISH_TRIES 20          /* transport failures before giving up */
#define VERIFY_LAYOUT_TRIES 25    /* x LAYOUTS_RETRY_MS for a manifest's layouts */
#define FABLOOP_PERIOD_US 1000

/* A serving layout and the plan trainer layout -> it, by digest. A layout
 * that failed to parse or plan stays cached as bad (warned about once). */
struct pub_layout {
	uint8_t digest[PROTO_HASH_BYTES];
	bool bad;
	struct proto_layout layout;
	struct proto_plan plan;
	struct pub_layout *next;
};

/* One parcel a rank gathers into its export buffer. */
struct pub_item {
	const struct pub_layout *sl;
	const struct proto_parcel *pc;
	uint32_t li, pi; /* layout index in the export, parcel index in its plan */
	uint64_t off;    /* in the rank's export buffer */
	uint32_t nchunks;
	uint8_t (*hash)[PROTO_HASH_BYTES]; /* nchunks hashes, filled by a worker */
};

/* One rank's part of one version: its export buffer and what is in it. */
struct pub_part {
	uint32_t rank;
	bool hosted;
	uint8_t *buf; /* mmap'ed, cap bytes */
	size_t cap;
	uint64_t used;
	struct fab_mr *mr;
	struct pub_item *items;
	size_t nitems;
};

/* A version being served (or being built by the current export). */
struct pub_version {
	struct node_pub *p;
	uint64_t version, created_ms;
	struct pub_part *parts;
	size_t nparts;
	struct trk_offer *offers;
	size_t noffers;
	bool offered;     /* the tracker holds our offer */
	bool offer_busy;  /* an offer or withdrawal is in flight */
	bool offer_tried; /* at least one offer answer came */
	uint64_t offer_gen; /* registration the offer in flight was made under */
	bool releasing;   /* no longer needed: withdraw, then free */
	bool warned;      /* an offer failure was logged */
	struct pub_version *next;
};

enum job_kind { JOB_SNAPSHOT, JOB_GATHER };

/* One worker thread's task; the loop reads its results after joining. */
struct pub_job {
	struct node_pub *p;
	enum job_kind kind;
	uint64_t version;
	uint32_t rank;
	uint8_t *block;
	struct pub_part *part;
	uint32_t chunk_size;
	pthread_t tid;
	bool running; /* created and not joined yet */
	atomic_bool done;
};

struct pub_req {
	node_pub_cb cb;
	void *arg;
	uint64_t created_ms, t0_ns;
	struct pub_req *next;
};

enum ex_phase { EX_PREP, EX_GATHER, EX_PUBLISH, EX_OFFER };
enum ex_need { NEED_WATCH, NEED_MANIFEST, NEED_LAYOUTS, NEED_NONE };

/* The export in progress (one at a time). */
struct pub_export {
	struct pub_req *req; /* NULL: the restart re-offer */
	uint64_t version;
	bool verify; /* check against the tracker's manifest instead of publishing */
	enum ex_phase phase;
	enum ex_need need;
	bool failed;
	int status;
	char error[512];
	struct pub_job *jobs;
	size_t njobs, jobs_left;
	bool req_busy; /* a tracker request of this export is in flight */
	bool snap_done;
	unsigned tries;
	uint64_t t0_ns, start_ns, phase_ns, snapshot_ns, hash_ns, wait_ns;
	uint64_t created_ms;
	uint32_t chunk_size;
	struct pub_layout **layouts;
	size_t nlayouts;
	struct proto_manifest m; /* built and signed (leader) or decoded */
	bool have_m;
	uint8_t *mbuf; /* signed bytes (leader) */
	size_t mlen;
	struct pub_version *pv;
};

struct pub_hosted {
	uint32_t rank;
	struct fab_ctx *fab;
	struct node_fabloop *fl;
	char addr_hex[2 * FAB_ADDR_MAX + 1];
};

struct pub_file {
	uint64_t n; /* the N of vN.safetensors */
	struct proto_st st;
	uint32_t *map; /* model tensor index -> this file's tensor index */
};

struct pub_spare {
	uint8_t *buf;
	size_t cap;
};

struct node_pub {
	struct event_base *base;
	void (*on_fatal)(void *arg, const char *msg);
	void *arg;
	bool dead; /* on_fatal was called */
	char host[256];
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];

	/* Source and layouts. */
	bool synthetic;
	uint64_t seed;
	struct proto_model model;
	bool have_model;
	struct pub_file *files;
	size_t nfiles;
	struct proto_layout tl;
	bool have_tl;
	json_t *model_json, *tl_json;
	uint8_t **blocks;        /* per trainer rank: its snapshot (lazily) */
	size_t *block_cap;
	struct pub_spare *spare; /* per trainer rank: a freed export buffer */

	/* Hosted ranks. */
	struct pub_hosted *hosted;
	size_t nhosted;
	bool leader;

	/* Tracker. */
	struct trk_client *trk;
	struct event *hb_ev, *check_ev, *reg_ev, *ex_ev, *wake_ev, *kick_ev;
	evutil_socket_t wake[2];
	atomic_bool abort;
	char id[TRK_ID_MAX];
	bool registered, reg_busy, hb_busy, check_busy, init_busy, ready;
	bool reg_warned, layouts_waiting;
	uint64_t lease_ms;
	uint64_t reg_gen, hb_gen; /* registrations so far; the heartbeat's */
	uint64_t next_version, reoffer;
	uint8_t prev_digest[PROTO_HASH_BYTES];

	struct pub_layout *layouts;
	struct pub_version *versions;
	struct pub_req *queue, **queue_tail;
	size_t nqueue;
	struct pub_export *ex;
};

static void ex_step(struct node_pub *p);
static void on_init_versions(const struct trk_answer *a, void *arg);
static void pub_sync_offers(struct node_pub *p);
static void pub_register(struct node_pub *p);

/* ---- small helpers ---------------------------------------------------------- */

static void hex(const uint8_t *b, size_t n, char *out, size_t cap)
{
	sodium_bin2hex(out, cap, b, n);
}

static uint64_t ms_of(uint64_t ns)
{
	return ns / 1000000u;
}

static size_t page_round(uint64_t n)
{
	return (size_t)((PROTO_MAX(n, 1) + PUB_ALIGN - 1) & ~(uint64_t)(PUB_ALIGN - 1));
}

/* Anonymous memory for snapshots and export buffers. Large ones are aligned
 * to 2 MiB and asked for transparent huge pages: first-touch faults of 4 KiB
 * pages cost about as much as the gather itself (measured: 1.1 s vs 60 ms
 * to touch 220 MiB on a VM). Freed with munmap(b, cap). */
static uint8_t *buf_map(size_t cap)
{
	size_t slop = cap >= HUGE_ALIGN ? HUGE_ALIGN : 0, head;
	uint8_t *b = mmap(NULL, cap + slop, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t a;

	if (b == MAP_FAILED)
		return NULL;
	if (slop == 0)
		return b;
	a = ((uintptr_t)b + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
	head = a - (uintptr_t)b;
	if (head > 0)
		munmap(b, head);
	if (slop > head)
		munmap((uint8_t *)a + cap, slop - head);
	(void)madvise((void *)a, cap, MADV_HUGEPAGE); /* a hint; 4 KiB pages work */
	return (uint8_t *)a;
}

static void timer_ms(struct event *ev, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
	evtimer_add(ev, &tv);
}

static void fatal(struct node_pub *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fatal(struct node_pub *p, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	if (p->dead)
		return;
	p->dead = true;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (p->on_fatal != NULL)
		p->on_fatal(p->arg, msg);
	else
		LOG_ERR("%s", msg);
}

static bool source_has(const struct node_pub *p, uint64_t v)
{
	return v >= 1 && (p->synthetic || v <= p->nfiles);
}

/* ---- the model dir --------------------------------------------------------- */

static int file_cmp(const void *a, const void *b)
{
	const struct pub_file *x = a, *y = b;
	return x->n < y->n ? -1 : x->n > y->n;
}

/* "v<N>.safetensors" -> N. */
static bool version_file(const char *name, uint64_t *n)
{
	const char *suf = ".safetensors";
	size_t len = strlen(name), sl = strlen(suf);
	char num[32];

	if (len <= sl + 1 || name[0] != 'v' || strcmp(name + len - sl, suf) != 0 ||
	    len - sl - 1 >= sizeof(num))
		return false;
	memcpy(num, name + 1, len - sl - 1);
	num[len - sl - 1] = 0;
	if (num[0] < '0' || num[0] > '9')
		return false;
	return proto_parse_u64(num, 0, UINT64_MAX, n) == 0;
}

/* Checks that file f holds exactly the model's tensors (any order) and maps
 * them. */
static int file_match(struct node_pub *p, struct pub_file *f, const char *dir,
		      const char *first, struct proto_err *err)
{
	const struct proto_model *fm = &f->st.model;

	if (fm->ntensors != p->model.ntensors)
		return proto_errf(err, EINVAL,
				  "%s/v%llu.safetensors has %u tensors but %s has %u: all versions must share the model",
				  dir, (unsigned long long)f->n, fm->ntensors, first,
				  p->model.ntensors);
	f->map = calloc(PROTO_MAX(p->model.ntensors, 1), sizeof(*f->map));
	if (f->map == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t t = 0; t < p->model.ntensors; t++) {
		const struct proto_tensor *a = &p->model.tensors[t];
		int64_t i = proto_model_find(fm, a->name);
		const struct proto_tensor *b = i >= 0 ? &fm->tensors[i] : NULL;
		if (b == NULL)
			return proto_errf(err, EINVAL,
					  "%s/v%llu.safetensors lacks tensor '%s' of %s: all versions must share the model",
					  dir, (unsigned long long)f->n, a->name, first);
		if (b->dtype != a->dtype || b->ndim != a->ndim ||
		    memcmp(b->shape, a->shape, sizeof(a->shape[0]) * a->ndim) != 0)
			return proto_errf(err, EINVAL,
					  "%s/v%llu.safetensors: tensor '%s' differs in dtype or shape from %s: all versions must share the model",
					  dir, (unsigned long long)f->n, a->name, first);
		f->map[t] = (uint32_t)i;
	}
	return 0;
}

static int load_model_dir(struct node_pub *p, const char *dir, struct proto_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t cap = 0;
	char path[4096], first[64];
	int rc = 0;

	if (d == NULL)
		return proto_errf(err, errno, "model dir %s: %s", dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		uint64_t n;
		if (!version_file(e->d_name, &n))
			continue;
		if (p->nfiles == cap) {
			size_t nc = cap ? 2 * cap : 16;
			struct pub_file *nf = realloc(p->files, nc * sizeof(*nf));
			if (nf == NULL) {
				closedir(d);
				return proto_errf(err, ENOMEM, "out of memory");
			}
			p->files = nf;
			cap = nc;
		}
		memset(&p->files[p->nfiles], 0, sizeof(p->files[0]));
		p->files[p->nfiles++].n = n;
	}
	closedir(d);
	if (p->nfiles == 0)
		return proto_errf(err, ENOENT, "model dir %s: no v<N>.safetensors file", dir);
	qsort(p->files, p->nfiles, sizeof(p->files[0]), file_cmp);
	for (size_t i = 1; i < p->nfiles; i++)
		if (p->files[i].n == p->files[i - 1].n)
			return proto_errf(err, EINVAL,
					  "model dir %s: two files are version v%llu (leading zeros?)",
					  dir, (unsigned long long)p->files[i].n);
	for (size_t i = 0; i < p->nfiles; i++) {
		struct pub_file *f = &p->files[i];
		snprintf(path, sizeof(path), "%s/v%llu.safetensors", dir, (unsigned long long)f->n);
		/* A v01.safetensors is found as v1; open what is really there. */
		if (access(path, R_OK) != 0) {
			rc = proto_errf(err, ENOENT,
					"model dir %s: name the files v<N>.safetensors without leading zeros",
					dir);
			return rc;
		}
		if ((rc = proto_st_open(path, &f->st, err)) != 0)
			return rc;
	}
	/* The model: the first file's tensors, in its data order. */
	proto_model_init(&p->model);
	p->have_model = true;
	for (uint32_t t = 0; t < p->files[0].st.model.ntensors; t++) {
		const struct proto_tensor *x = &p->files[0].st.model.tensors[t];
		if ((rc = proto_model_add(&p->model, x->name, x->dtype, x->ndim, x->shape, err)) != 0)
			return rc;
	}
	if ((rc = proto_model_finish(&p->model, err)) != 0)
		return rc;
	snprintf(first, sizeof(first), "v%llu.safetensors", (unsigned long long)p->files[0].n);
	for (size_t i = 0; i < p->nfiles; i++)
		if ((rc = file_match(p, &p->files[i], dir, first, err)) != 0)
			return rc;
	return 0;
}

struct st_src {
	const struct pub_file *f;
};

static void st_source(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct st_src *s = arg;
	uint32_t i = s->f->map[t];
	size_t es = proto_dtype_size(s->f->st.model.tensors[i].dtype);

	memcpy(out, proto_st_tensor(&s->f->st, i) + first * es, count * es);
}

/* ---- worker threads -------------------------------------------------------- */

static void job_snapshot(struct pub_job *j)
{
	struct node_pub *p = j->p;

	if (p->synthetic) {
		proto_fixture_fill_rank(&p->model, &p->tl, j->rank, p->seed, j->version, j->block);
	} else {
		struct st_src s = {&p->files[j->version - 1]};
		proto_layout_fill_rank(&p->model, &p->tl, j->rank, st_source, &s, j->block);
	}
}

/* Gathers each chunk in cache-sized steps and hashes it as it goes. */
static void job_gather(struct pub_job *j)
{
	struct node_pub *p = j->p;
	struct pub_part *pt = j->part;
	uint64_t cs = j->chunk_size;

	for (size_t i = 0; i < pt->nitems && !atomic_load(&p->abort); i++) {
		struct pub_item *it = &pt->items[i];
		uint64_t bytes = it->pc->bytes;
		for (uint32_t c = 0; c < it->nchunks && !atomic_load(&p->abort); c++) {
			uint64_t c0 = (uint64_t)c * cs, clen = PROTO_MIN(cs, bytes - c0);
			crypto_generichash_state st;
			crypto_generichash_init(&st, NULL, 0, PROTO_HASH_BYTES);
			for (uint64_t o = 0; o < clen; o += HASH_STEP) {
				uint64_t n = PROTO_MIN(HASH_STEP, clen - o);
				uint8_t *dst = pt->buf + it->off + c0 + o;
				proto_parcel_gather(&it->sl->plan, it->pc, &p->tl, j->block, c0 + o, n, dst);
				crypto_generichash_update(&st, dst, n);
			}
			crypto_generichash_final(&st, it->hash[c], PROTO_HASH_BYTES);
		}
	}
}

static void *job_main(void *arg)
{
	struct pub_job *j = arg;

	if (j->kind == JOB_SNAPSHOT)
		job_snapshot(j);
	else
		job_gather(j);
	atomic_store(&j->done, true);
	/* A full socket means a wake-up is already pending. */
	if (send(j->p->wake[1], "", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
		LOG_WARN("publisher: waking the loop: %s", strerror(errno));
	return NULL;
}

/* ---- parts and versions ------------------------------------------------------ */

static void items_free(struct pub_part *pt)
{
	for (size_t i = 0; i < pt->nitems; i++)
		free(pt->items[i].hash);
	free(pt->items);
	pt->items = NULL;
	pt->nitems = 0;
}

/* Closes the region and keeps the buffer as the rank's spare (the larger of
 * the two); cannot fail. */
static void part_release(struct node_pub *p, struct pub_part *pt)
{
	struct pub_spare *s = &p->spare[pt->rank];

	fab_mr_close(pt->mr);
	pt->mr = NULL;
	items_free(pt);
	if (pt->buf == NULL)
		return;
	if (s->buf == NULL || s->cap < pt->cap) {
		if (s->buf != NULL)
			munmap(s->buf, s->cap);
		s->buf = pt->buf;
		s->cap = pt->cap;
	} else {
		munmap(pt->buf, pt->cap);
	}
	pt->buf = NULL;
	pt->cap = 0;
}

static int part_alloc(struct node_pub *p, struct pub_part *pt)
{
	struct pub_spare *s = &p->spare[pt->rank];
	size_t need = page_round(pt->used);

	if (s->buf != NULL && s->cap >= need) {
		pt->buf = s->buf;
		pt->cap = s->cap;
		s->buf = NULL;
		s->cap = 0;
		return 0;
	}
	pt->buf = buf_map(need);
	if (pt->buf == NULL)
		return -ENOMEM;
	pt->cap = need;
	return 0;
}

static void version_free(struct node_pub *p, struct pub_version *pv)
{
	if (pv == NULL)
		return;
	for (size_t i = 0; i < pv->nparts; i++)
		part_release(p, &pv->parts[i]);
	free(pv->parts);
	free(pv->offers);
	free(pv);
}

static void version_unlink(struct node_pub *p, struct pub_version *pv)
{
	for (struct pub_version **pp = &p->versions; *pp; pp = &(*pp)->next)
		if (*pp == pv) {
			*pp = pv->next;
			return;
		}
}

static uint64_t newest_version(const struct node_pub *p)
{
	uint64_t v = 0;
	for (const struct pub_version *pv = p->versions; pv; pv = pv->next)
		v = PROTO_MAX(v, pv->version);
	return v;
}

/* Registers the hosted parts' buffers for remote reads and lists the offers
 * (see publisher.h for what addr/key/len mean). */
static int version_serve(struct node_pub *p, struct pub_version *pv, struct proto_err *err)
{
	size_t n = 0, k = 0;
	int rc;

	for (size_t i = 0; i < pv->nparts; i++)
		if (pv->parts[i].hosted)
			n += pv->parts[i].nitems;
	pv->offers = calloc(PROTO_MAX(n, 1), sizeof(*pv->offers));
	if (pv->offers == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		struct fab_rkey rk;
		int hi = -1;
		if (!pt->hosted || pt->nitems == 0)
			continue;
		for (size_t h = 0; h < p->nhosted; h++)
			if (p->hosted[h].rank == pt->rank)
				hi = (int)h;
		rc = fab_mr_reg(p->hosted[hi].fab, pt->buf, pt->cap, FAB_MR_REMOTE_READ, &pt->mr);
		if (rc != 0)
			return proto_errf(err, -rc, "registering rank %u's export buffer (%zu bytes): %s",
					  pt->rank, pt->cap, strerror(-rc));
		fab_mr_rkey(pt->mr, &rk);
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			struct trk_offer *o = &pv->offers[k];
			if (it->pc->bytes == 0)
				continue;
			memcpy(o->layout, it->sl->digest, PROTO_HASH_BYTES);
			o->src_rank = pt->rank;
			o->dst_rank = it->pc->dst_rank;
			o->addr = rk.addr + it->off;
			o->key = rk.key;
			o->len = it->pc->bytes;
			k++;
		}
		/* Hashes are in the manifest now; offers keep what serving needs. */
		items_free(pt);
	}
	pv->noffers = k;
	return 0;
}

/* ---- offers ------------------------------------------------------------------- */

static void on_offer(const struct trk_answer *a, void *arg)
{
	struct pub_version *pv = arg;
	struct node_pub *p = pv->p;

	pv->offer_busy = false;
	if (pv->releasing) {
		if (a->status < 200 || a->status >= 300)
			LOG_INFO("withdrawing version %llu: %s (freed anyway)",
				 (unsigned long long)pv->version, a->error);
		version_unlink(p, pv);
		version_free(p, pv);
		return;
	}
	pv->offer_tried = true;
	if (a->status >= 200 && a->status < 300) {
		pv->offered = pv->offer_gen == p->reg_gen;
		LOG_INFO("offered version %llu: %zu parcels", (unsigned long long)pv->version,
			 pv->noffers);
	} else if (a->status == 404) {
		/* Only an answer about the current registration says it is gone. */
		if (pv->offer_gen == p->reg_gen) {
			p->registered = false;
			pub_register(p);
		}
	} else if (!pv->warned) {
		pv->warned = true;
		LOG_WARN("offering version %llu: %s (will retry)",
			 (unsigned long long)pv->version, a->error);
	}
	if (p->ex != NULL && p->ex->pv == pv)
		ex_step(p);
}

static void pub_sync_offers(struct node_pub *p)
{
	struct pub_version *pv, *next;

	for (pv = p->versions; pv; pv = next) {
		int rc;
		next = pv->next;
		if (pv->offer_busy)
			continue;
		if (pv->releasing && !p->registered) {
			version_unlink(p, pv);
			version_free(p, pv);
			continue;
		}
		if (!p->registered || p->dead || (pv->offered && !pv->releasing))
			continue;
		rc = trk_client_offer(p->trk, p->id, pv->version, pv->releasing ? NULL : pv->offers,
				      pv->releasing ? 0 : pv->noffers, on_offer, pv);
		if (rc == 0) {
			pv->offer_busy = true;
			pv->offer_gen = p->reg_gen;
		} else
			LOG_WARN("offering version %llu: %s", (unsigned long long)pv->version,
				 strerror(-rc));
	}
}

/* ---- serving layouts ----------------------------------------------------------- */

static struct pub_layout *layout_find(struct node_pub *p, const uint8_t *digest)
{
	for (struct pub_layout *sl = p->layouts; sl; sl = sl->next)
		if (memcmp(sl->digest, digest, PROTO_HASH_BYTES) == 0)
			return sl;
	return NULL;
}

/* Parses and plans one entry of GET /layouts into the cache (once per
 * digest). NULL only on ENOMEM or a malformed entry. */
static struct pub_layout *layout_absorb(struct node_pub *p, json_t *e)
{
	const char *dh = json_string_value(json_object_get(e, "digest"));
	json_t *jl = json_object_get(e, "layout");
	uint8_t d[PROTO_HASH_BYTES];
	size_t got = 0;
	struct pub_layout *sl;
	struct proto_err err = {{0}};
	char what[96];

	if (dh == NULL || strlen(dh) != 2 * PROTO_HASH_BYTES ||
	    sodium_hex2bin(d, sizeof(d), dh, strlen(dh), NULL, &got, NULL) != 0 ||
	    got != sizeof(d) || !json_is_object(jl)) {
		LOG_WARN("tracker /layouts: an entry without a digest or layout");
		return NULL;
	}
	if ((sl = layout_find(p, d)) != NULL)
		return sl;
	sl = calloc(1, sizeof(*sl));
	if (sl == NULL)
		return NULL;
	memcpy(sl->digest, d, sizeof(d));
	snprintf(what, sizeof(what), "serving layout %.16s", dh);
	if (proto_layout_from_json(&p->model, jl, what, &sl->layout, &err) != 0) {
		LOG_WARN("%s (not served)", err.msg);
		sl->bad = true;
	} else if (memcmp(sl->layout.digest, d, sizeof(d)) != 0) {
		LOG_WARN("%s: its digest is not the one the tracker gave (not served)", what);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else if (proto_plan_build(&p->model, &p->tl, &sl->layout, &sl->plan, &err) != 0) {
		LOG_WARN("%s: cannot plan from the trainer layout: %s (not served)", what, err.msg);
		proto_layout_fini(&sl->layout);
		sl->bad = true;
	} else {
		LOG_INFO("%s: %u parcels, %llu bytes mapped", what, sl->plan.nparcels,
			 (unsigned long long)sl->plan.mapped_bytes);
	}
	sl->next = p->layouts;
	p->layouts = sl;
	return sl;
}

/* ---- the export state machine ------------------------------------------------- */

static void ex_fail(struct node_pub *p, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void ex_fail(struct node_pub *p, int code, const char *fmt, ...)
{
	struct pub_export *ex = p->ex;
	va_list ap;

	if (ex->failed)
		return;
	ex->failed = true;
	ex->status = -code;
	va_start(ap, fmt);
	vsnprintf(ex->error, sizeof(ex->error), fmt, ap);
	va_end(ap);
	evtimer_del(p->ex_ev);
}

static void ex_join(struct pub_export *ex)
{
	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		if (j->running && atomic_load(&j->done)) {
			pthread_join(j->tid, NULL);
			j->running = false;
			ex->jobs_left--;
		}
	}
}

/* Joins the workers and frees the export, and its version unless that is
 * already among the served ones. */
static void ex_free(struct node_pub *p, struct pub_export *ex)
{
	bool listed = false;

	for (size_t i = 0; i < ex->njobs; i++)
		if (ex->jobs[i].running)
			pthread_join(ex->jobs[i].tid, NULL);
	for (struct pub_version *v = p->versions; v; v = v->next)
		listed |= v == ex->pv;
	if (!listed)
		version_free(p, ex->pv);
	if (ex->have_m)
		proto_manifest_fini(&ex->m);
	free(ex->mbuf);
	free(ex->layouts);
	free(ex->jobs);
	free(ex->req);
	free(ex);
}

static void ex_finish(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct node_pub_result r = {0};
	uint64_t now = proto_now_ns();

	p->ex = NULL;
	evtimer_del(p->ex_ev);
	for (size_t i = 0; i < ex->njobs; i++)
		if (ex->jobs[i].running) {
			pthread_join(ex->jobs[i].tid, NULL);
			ex->jobs[i].running = false;
		}
	if (ex->failed && ex->pv != NULL) {
		version_unlink(p, ex->pv);
		version_free(p, ex->pv);
		ex->pv = NULL;
	}
	r.status = ex->failed ? ex->status : 0;
	r.error = ex->failed ? ex->error : "";
	r.version = ex->version;
	r.created_ms = ex->have_m ? ex->m.created_ms : ex->created_ms;
	r.leader = !ex->verify;
	r.wire_bytes = ex->have_m ? proto_manifest_wire_bytes(&ex->m) : 0;
	r.nlayouts = ex->have_m ? ex->m.nlayouts : 0;
	r.total_ns = now - ex->t0_ns;
	r.snapshot_ns = ex->snapshot_ns;
	r.hash_ns = ex->hash_ns;
	r.wait_ns = ex->wait_ns;
	if (ex->req == NULL) {
		if (ex->failed)
			LOG_ERR("version %llu not re-offered: %s", (unsigned long long)ex->version,
				ex->error);
		else
			LOG_INFO("re-offered version %llu after a restart (%llu ms)",
				 (unsigned long long)ex->version,
				 (unsigned long long)ms_of(r.total_ns));
	} else if (ex->failed) {
		LOG_WARN("export of version %llu failed: %s", (unsigned long long)ex->version,
			 ex->error);
	}
	if (ex->req != NULL && ex->req->cb != NULL)
		ex->req->cb(ex->req->arg, &r);
	ex->pv = NULL;
	ex_free(p, ex);
	event_active(p->kick_ev, 0, 0);
}

/* Starts one kind of job on every part; jobs_left counts those started. */
static void ex_launch(struct node_pub *p, enum job_kind kind)
{
	struct pub_export *ex = p->ex;

	ex->phase_ns = proto_now_ns();
	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		int rc;
		j->kind = kind;
		atomic_store(&j->done, false);
		rc = pthread_create(&j->tid, NULL, job_main, j);
		if (rc != 0) {
			ex_fail(p, rc, "starting a worker thread: %s", strerror(rc));
			return;
		}
		j->running = true;
		ex->jobs_left++;
	}
}

static void on_ex_timer(evutil_socket_t fd, short what, void *arg)
{
	ex_step(arg);
}

static void ex_retry(struct node_pub *p, uint64_t ms)
{
	timer_ms(p->ex_ev, ms);
}

static void on_ex_watch(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0;
	size_t n = 0;

	ex->req_busy = false;
	if (ex->failed) {
		ex_step(p);
		return;
	}
	if (a->status == 200 && trk_versions_parse(a->json, &latest, &vi, &n, &err) == 0) {
		if (latest >= ex->version)
			ex->need = NEED_MANIFEST;
		else if (ex->tries++ == 0)
			LOG_INFO("waiting for version %llu to be published by the rank-0 publisher",
				 (unsigned long long)ex->version);
		free(vi);
	} else {
		LOG_WARN("watching versions: %s", a->status == 200 ? err.msg : a->error);
		ex_retry(p, RETRY_MS);
	}
	ex_step(p);
}

static void on_ex_manifest(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	struct proto_err err = {{0}};
	char h[2 * PROTO_HASH_BYTES + 1];
	int rc;

	ex->req_busy = false;
	if (ex->failed) {
		ex_step(p);
		return;
	}
	if (a->status < 0 || a->status >= 500) {
		LOG_WARN("fetching manifest %llu: %s", (unsigned long long)ex->version, a->error);
		ex_retry(p, RETRY_MS);
	} else if (a->status != 200) {
		ex_fail(p, EIO, "fetching its manifest: %s", a->error);
	} else if ((rc = proto_manifest_decode(a->body, a->len, p->pk, &ex->m, &err)) != 0) {
		ex_fail(p, -rc, "its manifest does not verify with our key: %s", err.msg);
	} else {
		ex->have_m = true;
		if (ex->m.version != ex->version) {
			ex_fail(p, EBADMSG, "the tracker answered manifest %llu",
				(unsigned long long)ex->m.version);
		} else if (memcmp(ex->m.model_digest, p->model.digest, PROTO_HASH_BYTES) != 0) {
			ex_fail(p, EINVAL, "it was published for another model");
		} else if (memcmp(ex->m.src_layout_digest, p->tl.digest, PROTO_HASH_BYTES) != 0) {
			hex(ex->m.src_layout_digest, PROTO_HASH_BYTES, h, sizeof(h));
			ex_fail(p, EINVAL, "it was published from another trainer layout (%.16s)", h);
		} else if (ex->m.kind != PROTO_KIND_ANCHOR) {
			ex_fail(p, ENOTSUP, "it is a delta; only anchors are rebuilt");
		} else {
			ex->chunk_size = ex->m.chunk_size;
			ex->need = NEED_LAYOUTS;
			ex->tries = 0;
		}
	}
	ex_step(p);
}

/* Adds sl to the export's layouts unless it is bad or already there. */
static int ex_add_layout(struct pub_export *ex, struct pub_layout *sl)
{
	struct pub_layout **nl;

	for (size_t i = 0; i < ex->nlayouts; i++)
		if (ex->layouts[i] == sl)
			return 0;
	nl = realloc(ex->layouts, (ex->nlayouts + 1) * sizeof(*nl));
	if (nl == NULL)
		return -ENOMEM;
	ex->layouts = nl;
	ex->layouts[ex->nlayouts++] = sl;
	return 0;
}

static void on_ex_layouts(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	json_t *arr, *e;
	const char *md;
	char h[2 * PROTO_HASH_BYTES + 1];
	size_t i;

	ex->req_busy = false;
	if (ex->failed) {
		ex_step(p);
		return;
	}
	if (a->status != 200) {
		/* 404 before any publisher registered (tracker restart). */
		if (a->status != 404)
			LOG_WARN("fetching serving layouts: %s", a->error);
		ex_retry(p, a->status == 404 ? LAYOUTS_RETRY_MS : RETRY_MS);
		ex_step(p);
		return;
	}
	md = json_string_value(json_object_get(a->json, "model_digest"));
	hex(p->model.digest, PROTO_HASH_BYTES, h, sizeof(h));
	if (md == NULL || strcmp(md, h) != 0) {
		LOG_WARN("the tracker's model is not ours (another publisher?): waiting");
		ex_retry(p, RETRY_MS);
		ex_step(p);
		return;
	}
	arr = json_object_get(a->json, "layouts");
	json_array_foreach(arr, i, e) {
		struct pub_layout *sl = layout_absorb(p, e);
		if (!ex->verify && sl != NULL && !sl->bad && ex_add_layout(ex, sl) != 0) {
			ex_fail(p, ENOMEM, "out of memory");
			ex_step(p);
			return;
		}
	}
	if (ex->verify) {
		/* The manifest's layouts, in its order. */
		free(ex->layouts);
		ex->layouts = NULL;
		ex->nlayouts = 0;
		for (uint32_t k = 0; k < ex->m.nlayouts; k++) {
			const struct proto_mlayout *ml = &ex->m.layouts[k];
			struct pub_layout *sl = layout_find(p, ml->layout_digest);
			hex(ml->layout_digest, PROTO_HASH_BYTES, h, sizeof(h));
			if (sl == NULL || sl->bad)
				continue;
			if (memcmp(sl->plan.digest, ml->plan_digest, PROTO_HASH_BYTES) != 0) {
				ex_fail(p, EINVAL, "layout %.16s: our plan differs from the signed one", h);
				ex_step(p);
				return;
			}
			if (ex_add_layout(ex, sl) != 0) {
				ex_fail(p, ENOMEM, "out of memory");
				ex_step(p);
				return;
			}
		}
		if (ex->nlayouts == 0 && ex->tries++ >= VERIFY_LAYOUT_TRIES)
			ex_fail(p, ENOENT, "none of its %u serving layouts is registered now",
				ex->m.nlayouts);
	}
	if (ex->failed) {
		/* nothing more to ask */
	} else if (ex->nlayouts == 0) {
		if (!ex->verify && !p->layouts_waiting) {
			p->layouts_waiting = true;
			LOG_INFO("no serving layout registered yet: waiting before exporting version %llu",
				 (unsigned long long)ex->version);
		}
		ex_retry(p, LAYOUTS_RETRY_MS);
	} else {
		p->layouts_waiting = false;
		ex->need = NEED_NONE;
		ex->wait_ns = proto_now_ns() - ex->start_ns;
	}
	ex_step(p);
}

/* Lists every part's parcels, lays them out in its buffer, starts gathering. */
static void ex_gather_start(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct pub_version *pv = ex->pv;
	uint64_t cs = ex->chunk_size;

	ex->phase = EX_GATHER;
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		size_t n = 0;
		uint64_t off = 0;
		for (size_t li = 0; li < ex->nlayouts; li++)
			for (uint32_t k = 0; k < ex->layouts[li]->plan.nparcels; k++)
				n += ex->layouts[li]->plan.parcels[k].src_rank == pt->rank;
		pt->items = calloc(PROTO_MAX(n, 1), sizeof(*pt->items));
		if (pt->items == NULL) {
			ex_fail(p, ENOMEM, "out of memory");
			return;
		}
		for (size_t li = 0; li < ex->nlayouts; li++) {
			const struct pub_layout *sl = ex->layouts[li];
			for (uint32_t k = 0; k < sl->plan.nparcels; k++) {
				const struct proto_parcel *pc = &sl->plan.parcels[k];
				struct pub_item *it = &pt->items[pt->nitems];
				uint64_t nch = (pc->bytes + cs - 1) / cs;
				if (pc->src_rank != pt->rank)
					continue;
				if (nch > UINT32_MAX) {
					ex_fail(p, EOVERFLOW, "a parcel of %llu bytes has too many chunks",
						(unsigned long long)pc->bytes);
					return;
				}
				pt->nitems++;
				it->sl = sl;
				it->pc = pc;
				it->li = (uint32_t)li;
				it->pi = k;
				it->nchunks = (uint32_t)nch;
				it->off = off;
				off = (off + pc->bytes + PUB_ALIGN - 1) & ~(uint64_t)(PUB_ALIGN - 1);
				it->hash = calloc(PROTO_MAX(nch, 1), PROTO_HASH_BYTES);
				if (it->hash == NULL) {
					ex_fail(p, ENOMEM, "out of memory");
					return;
				}
			}
		}
		pt->used = off;
		if (part_alloc(p, pt) != 0) {
			ex_fail(p, ENOMEM, "cannot map a %llu-byte export buffer for rank %u",
				(unsigned long long)page_round(off), pt->rank);
			return;
		}
	}
	for (size_t i = 0; i < ex->njobs; i++) {
		ex->jobs[i].part = &pv->parts[i];
		ex->jobs[i].chunk_size = ex->chunk_size;
	}
	ex_launch(p, JOB_GATHER);
}

/* Leader: the manifest from every part's hashes, signed. */
static int ex_build_manifest(struct node_pub *p, struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	struct proto_manifest *m = &ex->m;
	int rc;

	proto_manifest_init(m);
	ex->have_m = true;
	m->version = ex->version;
	m->parent_version = ex->version - 1;
	if (m->parent_version > 0)
		memcpy(m->parent_digest, p->prev_digest, PROTO_HASH_BYTES);
	m->kind = PROTO_KIND_ANCHOR;
	memcpy(m->model_digest, p->model.digest, PROTO_HASH_BYTES);
	memcpy(m->src_layout_digest, p->tl.digest, PROTO_HASH_BYTES);
	m->created_ms = ex->created_ms;
	m->chunk_size = ex->chunk_size;
	for (size_t li = 0; li < ex->nlayouts; li++) {
		const struct pub_layout *sl = ex->layouts[li];
		struct proto_mlayout *ml = proto_manifest_add_layout(m, sl->digest, sl->plan.digest,
								     sl->plan.nparcels);
		if (ml == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
	}
	for (size_t i = 0; i < ex->pv->nparts; i++) {
		const struct pub_part *pt = &ex->pv->parts[i];
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			struct proto_mparcel *mp = &m->layouts[it->li].parcels[it->pi];
			mp->src_rank = it->pc->src_rank;
			mp->dst_rank = it->pc->dst_rank;
			mp->bytes = it->pc->bytes;
			mp->encoding = PROTO_ENC_RAW;
			if ((rc = proto_mparcel_alloc_chunks(m, mp, it->pc->bytes)) != 0)
				return proto_errf(err, -rc, "sizing parcel %u->%u's chunk list",
						  mp->src_rank, mp->dst_rank);
			for (uint32_t c = 0; c < mp->nchunks; c++)
				memcpy(mp->chunks[c].hash, it->hash[c], PROTO_HASH_BYTES);
		}
	}
	return proto_manifest_sign(m, p->sk, &ex->mbuf, &ex->mlen, err);
}

/* Verify: every hosted parcel must match the signed one, chunk by chunk. */
static int ex_compare(struct node_pub *p, struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	char h[2 * PROTO_HASH_BYTES + 1];

	for (size_t i = 0; i < ex->pv->nparts; i++) {
		const struct pub_part *pt = &ex->pv->parts[i];
		for (size_t j = 0; j < pt->nitems; j++) {
			const struct pub_item *it = &pt->items[j];
			const struct proto_mlayout *ml = proto_manifest_layout(&ex->m, it->sl->digest);
			const struct proto_mparcel *mp =
				ml ? proto_mlayout_parcel(ml, it->pc->src_rank, it->pc->dst_rank) : NULL;
			hex(it->sl->digest, PROTO_HASH_BYTES, h, sizeof(h));
			if (mp == NULL || mp->bytes != it->pc->bytes || mp->nchunks != it->nchunks ||
			    mp->encoding != PROTO_ENC_RAW)
				return proto_errf(err, EINVAL,
						  "layout %.16s parcel %u->%u: not the signed parcel",
						  h, it->pc->src_rank, it->pc->dst_rank);
			for (uint32_t c = 0; c < it->nchunks; c++)
				if (sodium_memcmp(mp->chunks[c].hash, it->hash[c], PROTO_HASH_BYTES) != 0)
					return proto_errf(err, EBADMSG,
							  "layout %.16s parcel %u->%u chunk %u: rebuilt bytes differ from the signed hash",
							  h, it->pc->src_rank, it->pc->dst_rank, c);
		}
	}
	return 0;
}

static void ex_gathered(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct proto_err err = {{0}};
	int rc;

	ex->hash_ns = proto_now_ns() - ex->phase_ns;
	if (atomic_load(&p->abort)) {
		ex_fail(p, ECANCELED, "stopped");
		return;
	}
	rc = ex->verify ? ex_compare(p, &err) : ex_build_manifest(p, &err);
	if (rc != 0) {
		ex_fail(p, -rc, "%s", err.msg);
		return;
	}
	/* Parts of ranks hosted elsewhere were only needed for their hashes. */
	for (size_t i = 0; i < ex->pv->nparts; i++)
		if (!ex->pv->parts[i].hosted)
			part_release(p, &ex->pv->parts[i]);
	if ((rc = version_serve(p, ex->pv, &err)) != 0) {
		ex_fail(p, -rc, "%s", err.msg);
		return;
	}
	if (ex->verify) {
		ex->phase = EX_OFFER;
		ex->pv->next = p->versions;
		p->versions = ex->pv;
		pub_sync_offers(p);
	} else {
		ex->phase = EX_PUBLISH;
		ex->tries = 0;
	}
}

static void on_ex_publish(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;

	ex->req_busy = false;
	if (ex->failed) {
		ex_step(p);
		return;
	}
	if (a->status == 200 || a->status == 201) {
		memcpy(p->prev_digest, ex->m.digest, PROTO_HASH_BYTES);
		p->next_version = ex->version + 1;
		ex->phase = EX_OFFER;
		ex->pv->next = p->versions;
		p->versions = ex->pv;
		pub_sync_offers(p);
	} else if ((a->status < 0 || a->status >= 500) && ++ex->tries < PUBLISH_TRIES) {
		LOG_WARN("publishing version %llu: %s (retrying)", (unsigned long long)ex->version,
			 a->error);
		ex_retry(p, RETRY_MS);
	} else {
		ex_fail(p, a->status == 409 ? EEXIST : EIO, "the tracker refused version %llu: %s",
			(unsigned long long)ex->version, a->error);
		/* A conflict (someone else published; the chain moved on): learn
		 * the latest version again before the next export. */
		if (a->status == 409) {
			p->ready = false;
			if (!p->init_busy && trk_client_watch(p->trk, 0, 0, on_init_versions, p) == 0)
				p->init_busy = true;
			else if (!p->init_busy)
				timer_ms(p->reg_ev, RETRY_MS);
		}
	}
	ex_step(p);
}

/* Issues the next tracker request the export waits for, if any. */
static void ex_request(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	int rc = 0;

	if (ex->req_busy || evtimer_pending(p->ex_ev, NULL))
		return;
	if (ex->phase == EX_PREP) {
		switch (ex->need) {
		case NEED_WATCH:
			rc = trk_client_watch(p->trk, ex->version - 1, WATCH_WAIT_MS, on_ex_watch, p);
			break;
		case NEED_MANIFEST:
			rc = trk_client_get_manifest(p->trk, ex->version, on_ex_manifest, p);
			break;
		case NEED_LAYOUTS:
			rc = trk_client_layouts(p->trk, on_ex_layouts, p);
			break;
		case NEED_NONE:
			return;
		}
	} else if (ex->phase == EX_PUBLISH) {
		rc = trk_client_publish(p->trk, ex->mbuf, ex->mlen, on_ex_publish, p);
	} else {
		return;
	}
	if (rc == 0)
		ex->req_busy = true;
	else
		ex_retry(p, RETRY_MS);
}

/* Moves the export on as far as it can go now. Last call of every callback. */
static void ex_step(struct node_pub *p)
{
	struct pub_export *ex = p->ex;

	if (ex == NULL)
		return;
	if (ex->failed) {
		if (ex->jobs_left == 0 && !ex->req_busy)
			ex_finish(p);
		return;
	}
	switch (ex->phase) {
	case EX_PREP:
		ex_request(p);
		if (ex->jobs_left == 0 && ex->need == NEED_NONE) {
			ex_gather_start(p);
			ex_step(p); /* a failure to finish, or wait for the workers */
		}
		break;
	case EX_GATHER:
		if (ex->jobs_left == 0) {
			ex_gathered(p);
			ex_step(p);
		}
		break;
	case EX_PUBLISH:
		ex_request(p);
		break;
	case EX_OFFER:
		if (!ex->pv->offer_busy && (ex->pv->offer_tried || !p->registered))
			ex_finish(p);
		break;
	}
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	char b[64];

	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
	if (ex == NULL)
		return;
	ex_join(ex);
	if (ex->jobs_left == 0 && ex->phase == EX_PREP && !ex->snap_done) {
		ex->snap_done = true;
		ex->snapshot_ns = proto_now_ns() - ex->phase_ns;
	}
	ex_step(p);
}

static void ex_start(struct node_pub *p, struct pub_req *req, uint64_t version, bool verify)
{
	struct pub_export *ex = calloc(1, sizeof(*ex));
	struct pub_version *pv;
	size_t n = 0;

	if (ex == NULL) {
		struct node_pub_result r = {.status = -ENOMEM, .error = "out of memory",
					    .version = version};
		if (req != NULL && req->cb != NULL)
			req->cb(req->arg, &r);
		free(req);
		event_active(p->kick_ev, 0, 0);
		return;
	}
	p->ex = ex;
	ex->req = req;
	ex->version = version;
	ex->verify = verify;
	ex->phase = EX_PREP;
	ex->need = verify ? NEED_WATCH : NEED_LAYOUTS;
	ex->start_ns = proto_now_ns();
	ex->t0_ns = req ? req->t0_ns : ex->start_ns;
	ex->created_ms = req ? req->created_ms : proto_wall_ms();
	ex->chunk_size = (uint32_t)proto_param(PROTO_PARAM_CHUNK_SIZE);
	if (!source_has(p, version)) {
		ex_fail(p, ERANGE, "version %llu: the model dir holds only %zu versions",
			(unsigned long long)version, p->nfiles);
		ex_step(p);
		return;
	}
	/* The leader computes every rank (for the manifest); others their own. */
	n = verify ? p->nhosted : p->tl.nranks;
	ex->pv = pv = calloc(1, sizeof(*pv));
	ex->jobs = calloc(n, sizeof(*ex->jobs));
	if (pv == NULL || ex->jobs == NULL || (pv->parts = calloc(n, sizeof(*pv->parts))) == NULL) {
		ex_fail(p, ENOMEM, "out of memory");
		ex_step(p);
		return;
	}
	pv->p = p;
	pv->version = version;
	pv->created_ms = ex->created_ms;
	pv->nparts = n;
	ex->njobs = n;
	for (size_t i = 0; i < n; i++) {
		uint32_t r = verify ? p->hosted[i].rank : (uint32_t)i;
		struct pub_job *j = &ex->jobs[i];
		pv->parts[i].rank = r;
		for (size_t h = 0; h < p->nhosted; h++)
			pv->parts[i].hosted |= p->hosted[h].rank == r;
		if (p->blocks[r] == NULL) {
			p->block_cap[r] = page_round(p->tl.ranks[r].nbytes);
			p->blocks[r] = buf_map(p->block_cap[r]);
			if (p->blocks[r] == NULL) {
				ex_fail(p, ENOMEM, "cannot map rank %u's %llu-byte snapshot", r,
					(unsigned long long)p->tl.ranks[r].nbytes);
				ex_step(p);
				return;
			}
		}
		j->p = p;
		j->version = version;
		j->rank = r;
		j->block = p->blocks[r];
	}
	ex_launch(p, JOB_SNAPSHOT);
	ex_step(p);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;
	struct pub_req *req;
	uint64_t v;

	if (p->dead || !p->ready || p->ex != NULL)
		return;
	if (p->reoffer != 0) {
		v = p->reoffer;
		p->reoffer = 0;
		ex_start(p, NULL, v, true);
		return;
	}
	req = p->queue;
	if (req == NULL)
		return;
	p->queue = req->next;
	if (p->queue == NULL)
		p->queue_tail = &p->queue;
	p->nqueue--;
	req->next = NULL;
	v = p->next_version;
	if (!p->leader)
		p->next_version++; /* the leader's number is used up once accepted */
	ex_start(p, req, v, !p->leader);
}

/* ---- registration, heartbeats, retention --------------------------------------- */

static void on_init_versions(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0;
	size_t n = 0;
	bool found = false, served = false;

	p->init_busy = false;
	if (a->status != 200 || trk_versions_parse(a->json, &latest, &vi, &n, &err) != 0) {
		LOG_WARN("listing versions: %s", a->status == 200 ? err.msg : a->error);
		timer_ms(p->reg_ev, RETRY_MS);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (vi[i].version == latest) {
			memcpy(p->prev_digest, vi[i].digest, PROTO_HASH_BYTES);
			found = true;
		}
	free(vi);
	if (latest > 0 && !found) {
		LOG_WARN("the tracker lists no entry for its latest version %llu: asking again",
			 (unsigned long long)latest);
		timer_ms(p->reg_ev, RETRY_MS);
		return;
	}
	p->next_version = latest + 1;
	/* The tracker lost versions (a wiped state dir): stop serving them. */
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		if (pv->version > latest && !pv->releasing) {
			LOG_WARN("the tracker no longer knows version %llu: withdrawing it",
				 (unsigned long long)pv->version);
			pv->releasing = true;
		}
	pub_sync_offers(p);
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		served |= pv->version == latest && !pv->releasing;
	if (served) {
		/* ours already (a resync after a conflict): nothing to rebuild */
	} else if (latest > 0 && source_has(p, latest)) {
		p->reoffer = latest;
		LOG_INFO("the tracker has versions up to %llu: rebuilding it to offer it again",
			 (unsigned long long)latest);
	} else if (latest > 0) {
		LOG_ERR("the tracker's latest version %llu is beyond the model dir's %zu versions: not offered",
			(unsigned long long)latest, p->nfiles);
	}
	p->ready = true;
	event_active(p->kick_ev, 0, 0);
}

static void on_registered(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	const char *id;
	json_t *lease;

	p->reg_busy = false;
	if (a->status < 0 || a->status >= 500) {
		if (!p->reg_warned)
			LOG_WARN("registering with the tracker: %s (retrying)", a->error);
		p->reg_warned = true;
		timer_ms(p->reg_ev, REGISTER_RETRY_MS);
		return;
	}
	if (a->status != 200) {
		fatal(p, "the tracker refused the registration: %s", a->error);
		return;
	}
	id = json_string_value(json_object_get(a->json, "publisher_id"));
	if (id == NULL || strlen(id) == 0 || strlen(id) >= sizeof(p->id)) {
		fatal(p, "the tracker answered the registration without a publisher_id");
		return;
	}
	snprintf(p->id, sizeof(p->id), "%s", id);
	lease = json_object_get(a->json, "lease_ms");
	if (json_is_integer(lease) && json_integer_value(lease) >= 30)
		p->lease_ms = (uint64_t)json_integer_value(lease);
	p->registered = true;
	p->reg_gen++;
	p->reg_warned = false;
	LOG_INFO("registered as %s with %zu ranks (lease %llu ms)", p->id, p->nhosted,
		 (unsigned long long)p->lease_ms);
	event_del(p->hb_ev);
	timer_ms(p->hb_ev, p->lease_ms / 3);
	for (struct pub_version *pv = p->versions; pv; pv = pv->next)
		pv->offered = false;
	if (!p->ready && !p->init_busy) {
		if (trk_client_watch(p->trk, 0, 0, on_init_versions, p) == 0)
			p->init_busy = true;
		else
			timer_ms(p->reg_ev, RETRY_MS);
	}
	pub_sync_offers(p);
	if (p->ex != NULL)
		ex_step(p);
}

static void pub_register(struct node_pub *p)
{
	struct trk_rank_addr *r;
	int rc;

	if (p->reg_busy || p->dead)
		return;
	if ((r = calloc(p->nhosted, sizeof(*r))) == NULL) {
		timer_ms(p->reg_ev, REGISTER_RETRY_MS);
		return;
	}
	for (size_t i = 0; i < p->nhosted; i++) {
		r[i].rank = p->hosted[i].rank;
		r[i].host = p->host;
		r[i].provider = fab_provider(p->hosted[i].fab);
		r[i].fabric_addr = p->hosted[i].addr_hex;
	}
	rc = trk_client_register_publisher(p->trk, p->model_json, p->tl_json, r, p->nhosted,
					   on_registered, p);
	free(r);
	if (rc == 0)
		p->reg_busy = true;
	else
		timer_ms(p->reg_ev, REGISTER_RETRY_MS);
}

static void on_reg_timer(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	if (!p->registered) {
		pub_register(p);
	} else if (!p->ready && !p->init_busy) {
		if (trk_client_watch(p->trk, 0, 0, on_init_versions, p) == 0)
			p->init_busy = true;
		else
			timer_ms(p->reg_ev, RETRY_MS);
	}
}

static void on_hb_answer(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;

	p->hb_busy = false;
	if (a->status == 404 && p->hb_gen == p->reg_gen && p->registered) {
		LOG_WARN("the tracker forgot publisher %s: registering again", p->id);
		p->registered = false;
		pub_register(p);
	} else if (a->status != 200) {
		LOG_WARN("heartbeat: %s", a->error);
	}
}

static void on_hb(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	timer_ms(p->hb_ev, p->lease_ms / 3);
	if (!p->registered || p->hb_busy || p->dead)
		return;
	if (trk_client_heartbeat(p->trk, p->id, on_hb_answer, p) == 0) {
		p->hb_busy = true;
		p->hb_gen = p->reg_gen;
	}
}

static void on_check_answer(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0, newest = newest_version(p);
	size_t n = 0;

	p->check_busy = false;
	if (a->status == 200 && trk_versions_parse(a->json, &latest, &vi, &n, &err) == 0) {
		for (struct pub_version *pv = p->versions; pv; pv = pv->next) {
			bool keep = pv->version == newest || (p->ex != NULL && p->ex->pv == pv);
			for (size_t i = 0; !keep && i < n; i++)
				keep = vi[i].version == pv->version && vi[i].retain;
			if (!keep && !pv->releasing) {
				LOG_INFO("version %llu is no longer needed: withdrawing it",
					 (unsigned long long)pv->version);
				pv->releasing = true;
			}
		}
		free(vi);
	} else {
		LOG_DEBUG("retain check: %s", a->status == 200 ? err.msg : a->error);
	}
	pub_sync_offers(p);
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;

	if (!p->registered || p->check_busy || p->dead || p->versions == NULL)
		return;
	if (trk_client_watch(p->trk, 0, 0, on_check_answer, p) == 0)
		p->check_busy = true;
}

/* ---- public face ------------------------------------------------------------------ */

static bool loopback_url(const char *url)
{
	struct evhttp_uri *u = evhttp_uri_parse(url);
	const char *h = u ? evhttp_uri_get_host(u) : NULL;
	bool lo = h != NULL && (strncmp(h, "127.", 4) == 0 || strcmp(h, "localhost") == 0 ||
				strcmp(h, "[::1]") == 0 || strcmp(h, "::1") == 0);

	if (u != NULL)
		evhttp_uri_free(u);
	return lo;
}

/* A built-in name (fsdpN, tpN) unless a file by that name exists or it
 * looks like a path. */
static int load_trainer_layout(struct node_pub *p, const char *name, struct proto_err *err)
{
	struct stat st;
	size_t len = strlen(name);
	bool file = stat(name, &st) == 0 || strchr(name, '/') != NULL ||
		    (len > 5 && strcmp(name + len - 5, ".json") == 0);
	int rc;

	rc = file ? proto_layout_load(&p->model, name, &p->tl, err) :
		    proto_layout_builtin(&p->model, name, &p->tl, err);
	if (rc != 0)
		return rc;
	p->have_tl = true;
	if ((rc = proto_layout_check_complete(&p->model, &p->tl, err)) != 0) {
		proto_err_prefix(err, "trainer layout %s does not hold the whole model", name);
		return rc;
	}
	return 0;
}

static int open_hosted(struct node_pub *p, const struct node_pub_opts *o, struct proto_err *err)
{
	const char *prov = o->provider ? o->provider : FAB_PROVIDER_DEFAULT;
	const char *bind = o->bind;
	int rc;

	if (bind == NULL && strstr(prov, "tcp") != NULL && loopback_url(o->tracker_url))
		bind = "127.0.0.1";
	for (size_t i = 0; i < p->nhosted; i++) {
		struct pub_hosted *h = &p->hosted[i];
		uint8_t addr[FAB_ADDR_MAX];
		size_t alen = 0;
		if ((rc = fab_open(prov, bind, NULL, &h->fab, err)) != 0) {
			proto_err_prefix(err, "rank %u", h->rank);
			return rc;
		}
		if ((rc = fab_getname(h->fab, addr, sizeof(addr), &alen)) != 0)
			return proto_errf(err, -rc, "rank %u: no fabric address: %s", h->rank,
					  strerror(-rc));
		hex(addr, alen, h->addr_hex, sizeof(h->addr_hex));
		h->fl = node_fabloop_new(p->base, h->fab, FABLOOP_PERIOD_US);
		if (h->fl == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
	}
	return 0;
}

int node_pub_new(struct event_base *base, const struct node_pub_opts *o, struct node_pub **out,
		 struct proto_err *err)
{
	struct node_pub *p;
	uint32_t nr;
	int rc;

	*out = NULL;
	if (sodium_init() < 0)
		return proto_errf(err, EIO, "libsodium failed to initialise");
	if (o->sk == NULL || o->tracker_url == NULL ||
	    (o->synthetic_bytes == 0) == (o->model_dir == NULL))
		return proto_errf(err, EINVAL,
				  "publisher: a tracker, a key and one source (synthetic or model dir) are needed");
	p = calloc(1, sizeof(*p));
	if (p == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	p->base = base;
	p->wake[0] = p->wake[1] = -1;
	p->on_fatal = o->on_fatal;
	p->arg = o->arg;
	p->queue_tail = &p->queue;
	p->lease_ms = proto_param(PROTO_PARAM_LEASE_MS);
	memcpy(p->sk, o->sk, PROTO_SK_BYTES);
	crypto_sign_ed25519_sk_to_pk(p->pk, p->sk);
	if (o->host != NULL)
		snprintf(p->host, sizeof(p->host), "%s", o->host);
	else if (gethostname(p->host, sizeof(p->host) - 1) != 0)
		snprintf(p->host, sizeof(p->host), "localhost");

	/* The model and the trainer layout. */
	if (o->synthetic_bytes > 0) {
		p->synthetic = true;
		p->seed = o->seed;
		if ((rc = proto_fixture_model(o->synthetic_bytes, &p->model, err)) != 0)
			goto fail;
		p->have_model = true;
	} else if ((rc = load_model_dir(p, o->model_dir, err)) != 0) {
		goto fail;
	}
	if ((rc = load_trainer_layout(p, o->layout ? o->layout : "fsdp2", err)) != 0)
		goto fail;
	p->model_json = proto_model_to_json(&p->model);
	p->tl_json = proto_layout_to_json(&p->model, &p->tl);
	nr = p->tl.nranks;
	p->blocks = calloc(nr, sizeof(*p->blocks));
	p->block_cap = calloc(nr, sizeof(*p->block_cap));
	p->spare = calloc(nr, sizeof(*p->spare));
	p->hosted = calloc(o->nranks ? o->nranks : nr, sizeof(*p->hosted));
	if (p->model_json == NULL || p->tl_json == NULL || p->blocks == NULL ||
	    p->block_cap == NULL || p->spare == NULL || p->hosted == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}

	/* Hosted ranks. */
	p->nhosted = o->nranks ? o->nranks : nr;
	for (size_t i = 0; i < p->nhosted; i++) {
		uint32_t r = o->nranks ? o->ranks[i] : (uint32_t)i;
		if (r >= nr) {
			rc = proto_errf(err, EINVAL, "rank %u: the trainer layout has ranks 0..%u", r,
					nr - 1);
			goto fail;
		}
		for (size_t j = 0; j < i; j++)
			if (p->hosted[j].rank == r) {
				rc = proto_errf(err, EINVAL, "rank %u listed twice", r);
				goto fail;
			}
		p->hosted[i].rank = r;
		p->leader |= r == 0;
	}
	if ((rc = open_hosted(p, o, err)) != 0)
		goto fail;

	/* The loop's side. */
	if ((rc = trk_client_new(base, o->tracker_url, o->cluster_key, &p->trk, err)) != 0)
		goto fail;
	if (evutil_socketpair(AF_UNIX, SOCK_STREAM, 0, p->wake) != 0) {
		rc = proto_errf(err, errno, "socketpair: %s", strerror(errno));
		goto fail;
	}
	evutil_make_socket_nonblocking(p->wake[0]);
	evutil_make_socket_nonblocking(p->wake[1]);
	evutil_make_socket_closeonexec(p->wake[0]);
	evutil_make_socket_closeonexec(p->wake[1]);
	p->wake_ev = event_new(base, p->wake[0], EV_READ | EV_PERSIST, on_wake, p);
	p->hb_ev = evtimer_new(base, on_hb, p);
	p->check_ev = event_new(base, -1, EV_PERSIST, on_check, p);
	p->reg_ev = evtimer_new(base, on_reg_timer, p);
	p->ex_ev = evtimer_new(base, on_ex_timer, p);
	p->kick_ev = event_new(base, -1, 0, on_kick, p);
	if (p->wake_ev == NULL || p->hb_ev == NULL || p->check_ev == NULL || p->reg_ev == NULL ||
	    p->ex_ev == NULL || p->kick_ev == NULL || event_add(p->wake_ev, NULL) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	{
		uint64_t ms = proto_param(PROTO_PARAM_PUB_CHECK_MS);
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		event_add(p->check_ev, &tv);
	}
	LOG_INFO("publisher: model %llu bytes, %u trainer ranks, hosting %zu%s",
		 (unsigned long long)proto_model_bytes(&p->model), nr, p->nhosted,
		 p->leader ? " (leader: signs and publishes)" : "");
	pub_register(p);
	*out = p;
	return 0;
fail:
	node_pub_free(p);
	return rc;
}

int node_pub_export(struct node_pub *p, node_pub_cb cb, void *arg)
{
	struct pub_req *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return -ENOMEM;
	r->cb = cb;
	r->arg = arg;
	r->created_ms = proto_wall_ms();
	r->t0_ns = proto_now_ns();
	*p->queue_tail = r;
	p->queue_tail = &r->next;
	p->nqueue++;
	event_active(p->kick_ev, 0, 0);
	return 0;
}

size_t node_pub_pending(const struct node_pub *p)
{
	return p->nqueue + (p->ex != NULL && p->ex->req != NULL);
}

size_t node_pub_nranks(const struct node_pub *p)
{
	return p->nhosted;
}

bool node_pub_leader(const struct node_pub *p)
{
	return p->leader;
}

uint64_t node_pub_model_bytes(const struct node_pub *p)
{
	return proto_model_bytes(&p->model);
}

void node_pub_free(struct node_pub *p)
{
	struct pub_req *r;

	if (p == NULL)
		return;
	atomic_store(&p->abort, true);
	if (p->ex != NULL) {
		struct pub_export *ex = p->ex;
		ex_free(p, ex); /* joins the workers */
		p->ex = NULL;
	}
	while ((r = p->queue) != NULL) {
		p->queue = r->next;
		free(r);
	}
	trk_client_free(p->trk); /* no callback runs after this */
	if (p->kick_ev)
		event_free(p->kick_ev);
	if (p->ex_ev)
		event_free(p->ex_ev);
	if (p->reg_ev)
		event_free(p->reg_ev);
	if (p->check_ev)
		event_free(p->check_ev);
	if (p->hb_ev)
		event_free(p->hb_ev);
	if (p->wake_ev)
		event_free(p->wake_ev);
	if (p->wake[0] >= 0)
		evutil_closesocket(p->wake[0]);
	if (p->wake[1] >= 0)
		evutil_closesocket(p->wake[1]);
	while (p->versions != NULL) {
		struct pub_version *pv = p->versions;
		p->versions = pv->next;
		version_free(p, pv);
	}
	for (size_t i = 0; p->hosted != NULL && i < p->nhosted; i++) {
		node_fabloop_free(p->hosted[i].fl);
		fab_close(p->hosted[i].fab);
	}
	free(p->hosted);
	while (p->layouts != NULL) {
		struct pub_layout *sl = p->layouts;
		p->layouts = sl->next;
		if (!sl->bad) {
			proto_plan_fini(&sl->plan);
			proto_layout_fini(&sl->layout);
		}
		free(sl);
	}
	for (uint32_t r2 = 0; p->have_tl && r2 < p->tl.nranks; r2++) {
		if (p->blocks != NULL && p->blocks[r2] != NULL)
			munmap(p->blocks[r2], p->block_cap[r2]);
		if (p->spare != NULL && p->spare[r2].buf != NULL)
			munmap(p->spare[r2].buf, p->spare[r2].cap);
	}
	free(p->blocks);
	free(p->block_cap);
	free(p->spare);
	json_decref(p->model_json);
	json_decref(p->tl_json);
	if (p->have_tl)
		proto_layout_fini(&p->tl);
	for (size_t i = 0; i < p->nfiles; i++) {
		proto_st_fini(&p->files[i].st);
		free(p->files[i].map);
	}
	free(p->files);
	if (p->have_model)
		proto_model_fini(&p->model);
	sodium_memzero(p->sk, sizeof(p->sk));
	free(p);
}
