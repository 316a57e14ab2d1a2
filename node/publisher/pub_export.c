/* The publisher's export of a version: snapshot, gather/hash workers, manifest, publish/verify. */
#include "node/publisher/pub_internal.h"
#include "proto/canary.h"
#include "proto/chunkhash.h"
#include "proto/delta.h"
#include "proto/pool.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HASH_STEP (256u << 10)    /* gather then hash this much while in cache */
#define LAYOUTS_RETRY_MS 200      /* no serving layout yet: ask again */
#define WATCH_WAIT_MS 10000       /* long-poll for a version we wait for */
#define PUBLISH_TRIES 20          /* transport failures before giving up */

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
	bool delta;        /* encode against the parent's snapshot */
	bool sums;         /* an anchor kept as the parent: its piece checksums */
	/* An addendum: the block is rebuilt from the served export's raw
	 * parcels (rs), or from the source when they do not cover it (a
	 * version kept as the parent: block is its snapshot, restored). */
	bool restore, restored;
	struct pub_rsrc *rs;
	size_t nrs;
	unsigned threads;  /* for the encoder */
	uint64_t encode_ns; /* a delta's encode, with the gather it does */
	uint64_t cpu_ns;    /* the CPU time of that (this thread's; see job_delta) */
	/* The encoder's scratch, kept from parcel to parcel while the job
	 * encodes them on its own thread (proto_delta_opts.keep). */
	struct proto_delta_scratch *scratch;
	int rc;             /* the snapshot's read (node__pub_source_fill) */
	struct proto_err err;
	struct proto_pool_task task;
	bool running; /* started and not joined yet */
	atomic_bool done;
};

static uint64_t ms_of(uint64_t ns)
{
	return ns / 1000000u;
}

/* ---- worker threads -------------------------------------------------------- */

static void job_snapshot(struct pub_job *j)
{
	j->rc = node__pub_source_fill(j->p, j->rank, j->version, j->block, &j->err);
}

/*
 * The snapshot is given back while the gather goes: each RELEASE_UNIT of it
 * is unmapped from memory (MADV_DONTNEED) as soon as the gather has passed
 * the last payload byte read from it, so the snapshot shrinks while the
 * export buffer grows instead of both being whole at the end. A unit's key
 * is that position: (item << 40) | payload end.
 */
struct release {
	uint64_t *key;   /* per unit */
	uint32_t *order; /* units by key */
	size_t n, next;  /* next: first unit not given back yet */
};

#define RELEASE_UNIT (2u << 20) /* one huge page */
#define KEY(item, end) (((uint64_t)(item) << 40) | (end))

static int unit_cmp(const void *a, const void *b, void *keys)
{
	const uint64_t *k = keys;
	uint64_t x = k[*(const uint32_t *)a], y = k[*(const uint32_t *)b];
	return x < y ? -1 : x > y;
}

/* Plans the release of j's snapshot; false (nothing released early) when
 * out of memory. */
static bool release_plan(struct pub_job *j, struct release *r)
{
	const struct node_pub *p = j->p;
	const struct pub_part *pt = j->part;
	const struct proto_rank *rk = &p->tl.ranks[j->rank];

	r->n = (p->block_cap[j->rank] + RELEASE_UNIT - 1) / RELEASE_UNIT;
	r->next = 0;
	r->key = calloc(PROTO_MAX(r->n, 1), sizeof(*r->key));
	r->order = calloc(PROTO_MAX(r->n, 1), sizeof(*r->order));
	if (r->key == NULL || r->order == NULL)
		return false;
	for (size_t i = 0; i < pt->nitems; i++) {
		const struct pub_item *it = &pt->items[i];
		const struct proto_plan *pl = &it->sl->plan;
		for (uint64_t s = it->pc->seg0; s < it->pc->seg0 + it->pc->nsegs; s++) {
			const struct proto_segment *sg = &pl->segs[s];
			uint64_t base = rk->locals[sg->src_local].offset;
			for (uint64_t k = sg->run0; k < sg->run0 + sg->nruns; k++) {
				const struct proto_run *ru = &pl->runs[k];
				uint64_t key = KEY(i, ru->pay_off + ru->len);
				if (ru->len == 0)
					continue;
				for (uint64_t u = (base + ru->src_off) / RELEASE_UNIT;
				     u <= (base + ru->src_off + ru->len - 1) / RELEASE_UNIT && u < r->n; u++)
					r->key[u] = PROTO_MAX(r->key[u], key);
			}
		}
	}
	for (size_t u = 0; u < r->n; u++)
		r->order[u] = (uint32_t)u;
	qsort_r(r->order, r->n, sizeof(*r->order), unit_cmp, r->key);
	return true;
}

/* Gives back every unit no read at or after pos needs. */
static void release_upto(struct pub_job *j, struct release *r, uint64_t pos)
{
	size_t cap = j->p->block_cap[j->rank];

	while (r->next < r->n && r->key[r->order[r->next]] <= pos) {
		uint64_t u = r->order[r->next++], off = u * RELEASE_UNIT;
		(void)madvise(j->block + off, PROTO_MIN(RELEASE_UNIT, cap - off), MADV_DONTNEED);
	}
}

/*
 * A delta's part: each item is encoded against its parent by the encoder,
 * which scans this version's snapshot against the parent's (the snapshot
 * the last version took, kept whole) where each piece lies in them, and
 * hands its changes to the canary update: one pass over the new bytes and
 * the old, nothing copied.
 */
static void job_delta(struct pub_job *j)
{
	struct pub_part *pt = j->part;
	uint64_t t0 = proto_now_ns(), c0 = proto_thread_cpu_ns();

	for (size_t i = 0; i < pt->nitems && !atomic_load(&j->p->abort); i++)
		node__pub_delta_encode_item(j->p, &pt->items[i], j->chunk_size, j->threads, j->block,
					    &j->scratch);
	proto_delta_scratch_free(j->scratch);
	j->scratch = NULL;
	j->encode_ns = proto_now_ns() - t0;
	/* With more than one encoder thread the others' CPU is not in it. */
	j->cpu_ns = proto_thread_cpu_ns() - c0;
}

/*
 * An anchor kept as the next delta's parent leaves the checksums of its
 * parcels' pieces behind (it->sums, moved into the parent export), taken
 * while the gather has each step in cache: the first delta after an anchor
 * then sums only its own side, as every later one does. False (no sums:
 * the delta sums its parent) when out of memory or the parcel has no piece.
 */
static bool item_sums_start(const struct node_pub *p, struct pub_item *it,
			    struct proto_dparcel *dp, struct proto_dparcel_summer *su)
{
	free(it->sums);
	it->sums = NULL;
	if (it->pc->bytes == 0 ||
	    proto_dparcel_build(&p->model, &it->sl->plan, it->pc, &it->sl->layout, dp, NULL) != 0)
		return false;
	it->sums = calloc((size_t)dp->npieces + 1, sizeof(*it->sums));
	if (it->sums == NULL) {
		proto_dparcel_fini(dp);
		return false;
	}
	proto_dparcel_summer_init(su, dp, it->sums);
	return true;
}

/* Gathers each chunk in cache-sized steps and hashes it as it goes, giving
 * the snapshot back behind it. */
static void job_gather(struct pub_job *j)
{
	struct node_pub *p = j->p;
	struct pub_part *pt = j->part;
	uint64_t cs = j->chunk_size;
	struct release rel = {0};

	j->encode_ns = 0;
	if (j->restore && !j->restored) {
		j->restored = p->trainer && j->nrs > 0 &&
			      node__pub_addendum_restore(p, j->rank, j->rs, j->nrs, pt, j->block,
							 p->block_cap[j->rank]);
		if (!j->restored &&
		    (j->rc = node__pub_source_fill(p, j->rank, j->version, j->block, &j->err)) != 0)
			return;
	}
	if (j->delta) {
		job_delta(j);
		return;
	}
	/* A publisher that keeps parents keeps its snapshot blocks too, so
	 * that the next snapshot writes into pages already there. */
	bool early = !node__pub_keeps_parent(p) && release_plan(j, &rel);

	/* An anchor gathers into the served buffer and hashes (the snapshot
	 * is the next delta's parent). */
	for (size_t i = 0; i < pt->nitems && !atomic_load(&p->abort); i++) {
		struct pub_item *it = &pt->items[i];
		uint64_t bytes = it->pc->bytes;
		struct proto_dparcel dp;
		struct proto_dparcel_summer su;
		bool sums = j->sums && item_sums_start(p, it, &dp, &su);
		for (uint32_t c = 0; c < it->nchunks && !atomic_load(&p->abort); c++) {
			uint64_t c0 = (uint64_t)c * cs, clen = PROTO_MIN(cs, bytes - c0);
			struct proto_chunk_hasher st;
			proto_chunk_hash_init(&st);
			for (uint64_t o = 0; o < clen; o += HASH_STEP) {
				uint64_t n = PROTO_MIN(HASH_STEP, clen - o);
				uint8_t *dst = pt->buf + it->off + c0 + o;
				proto_parcel_gather(&it->sl->plan, it->pc, &p->tl, j->block, c0 + o, n, dst);
				proto_chunk_hash_update(&st, dst, n);
				if (sums)
					proto_dparcel_summer_feed(&su, pt->buf + it->off, c0 + o + n);
			}
			proto_chunk_hash_final(&st, it->hash[c]);
			if (early)
				release_upto(j, &rel, KEY(i, c0 + clen));
		}
		if (!atomic_load(&p->abort))
			it->canary = proto_canary_parcel(&it->sl->plan, it->pc, &it->sl->layout,
							 pt->buf + it->off);
		if (sums && (atomic_load(&p->abort) || su.k < dp.npieces)) {
			free(it->sums); /* cut short: the delta sums its parent */
			it->sums = NULL;
		}
		if (sums)
			proto_dparcel_fini(&dp);
	}
	free(rel.key);
	free(rel.order);
}

static void job_main(void *arg)
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

void node__pub_ex_fail(struct node_pub *p, int code, const char *msg)
{
	ex_fail(p, code, "%s", msg);
}

/* Joins the finished workers; a rank whose gather is done unmaps what is
 * left of its snapshot (every layout is in its export buffer now), unless
 * the publisher keeps parents: then the snapshot is the next delta's
 * parent (at rest it holds two snapshot blocks per rank, taking turns). */
static void ex_join(struct node_pub *p, struct pub_export *ex)
{
	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		if (j->running && atomic_load(&j->done)) {
			proto_pool_join(&j->task);
			j->running = false;
			ex->jobs_left--;
			if (j->rc != 0)
				ex_fail(p, -j->rc, "rank %u's snapshot: %s", j->rank, j->err.msg);
			if (j->kind == JOB_GATHER && p->blocks[j->rank] != NULL &&
			    !node__pub_keeps_parent(p)) {
				munmap(p->blocks[j->rank], p->block_cap[j->rank]);
				p->blocks[j->rank] = NULL;
			}
		}
	}
}

/* Joins the workers and frees the export, and its version unless that is
 * already among the served ones. */
void node__pub_ex_free(struct node_pub *p, struct pub_export *ex)
{
	bool listed = false;

	for (size_t i = 0; i < ex->njobs; i++) {
		if (ex->jobs[i].running)
			proto_pool_join(&ex->jobs[i].task);
		free(ex->jobs[i].rs);
	}
	for (struct pub_version *v = p->versions; v; v = v->next)
		listed |= v == ex->pv;
	if (!listed)
		node__pub_version_free(p, ex->pv);
	if (ex->have_m)
		proto_manifest_fini(&ex->m);
	node__pub_addenda_free(ex->add);
	node__pub_parent_free(ex->next_parent);
	json_decref(ex->canary);
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
			proto_pool_join(&ex->jobs[i].task);
			ex->jobs[i].running = false;
		}
	if (ex->failed && ex->pv != NULL) {
		node__pub_version_unlink(p, ex->pv);
		node__pub_version_free(p, ex->pv);
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
	r.delta = ex->delta;
	r.encode_ns = ex->encode_ns;
	r.anchor_bytes = ex->raw_bytes;
	if (ex->addendum) {
		if (ex->failed) {
			LOG_WARN("version %llu not extended: %s", (unsigned long long)ex->version,
				 ex->error);
			p->add_failed_v = ex->version;
			p->add_failed_ms = proto_wall_ms();
		} else {
			LOG_INFO("version %llu extended by %zu %s (%llu ms)",
				 (unsigned long long)ex->version, ex->nlayouts,
				 p->add_copy ? "raw copies" : "addenda",
				 (unsigned long long)ms_of(r.total_ns));
		}
	} else if (ex->req == NULL) {
		if (ex->failed)
			LOG_ERR("version %llu not re-offered: %s", (unsigned long long)ex->version,
				ex->error);
		else
			LOG_INFO("re-offered version %llu after a restart (%llu ms)",
				 (unsigned long long)ex->version,
				 (unsigned long long)ms_of(r.total_ns));
	} else if (!ex->failed && !ex->verify) {
		uint64_t c = ex->created_ms, snap = ex->pv != NULL ? ex->pv->snapshot_ms : 0;
		/* (An addendum-free leader export: the snapshot is taken before
		 * the gather, so the stamps follow each other.) */
		uint64_t c0 = ex->cpu0, c1 = PROTO_MAX(ex->cpu_snap, c0);
		uint64_t c2 = PROTO_MAX(ex->cpu_hashed, c1), c3 = PROTO_MAX(ex->cpu_signed, c2);
		LOG_INFO("version %llu start-up, ms from its creation: snapshot %lld, hashed %lld, "
			 "signed %lld, publish sent %lld, answered %lld, offered %lld (created at %llu); "
			 "the publisher's CPU ms: snapshot %llu, %s %llu, manifest and signature %llu",
			 (unsigned long long)ex->version, (long long)(snap ? snap - c : 0),
			 (long long)(ex->su.hashed - c), (long long)(ex->su.signed_ - c),
			 (long long)(ex->su.sent - c), (long long)(ex->su.answered - c),
			 (long long)(proto_wall_ms() - c), (unsigned long long)c,
			 (unsigned long long)ms_of(c1 - c0), ex->delta ? "encode" : "gather and hash",
			 (unsigned long long)ms_of(c2 - c1), (unsigned long long)ms_of(c3 - c2));
	} else if (ex->failed && !(ex->req != NULL && ex->req->cb != NULL)) {
		/* (A caller with a callback says it, in one line: tessera
		 * publish on stderr, the control socket to its client.) */
		LOG_WARN("export of version %llu failed: %s", (unsigned long long)ex->version,
			 ex->error);
	}
	if (ex->req != NULL && ex->req->cb != NULL)
		ex->req->cb(ex->req->arg, &r);
	ex->pv = NULL;
	node__pub_ex_free(p, ex);
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
		rc = proto_pool_start(&j->task, job_main, j);
		if (rc != 0) {
			ex_fail(p, -rc, "starting a worker thread: %s", strerror(-rc));
			return;
		}
		j->running = true;
		ex->jobs_left++;
	}
}

void node__pub_on_ex_timer(evutil_socket_t fd, short what, void *arg)
{
	node__pub_ex_step(arg);
}

static void ex_retry(struct node_pub *p, uint64_t ms)
{
	node__pub_timer_ms(p->ex_ev, ms);
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
		node__pub_ex_step(p);
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
	node__pub_ex_step(p);
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
		node__pub_ex_step(p);
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
			sodium_bin2hex(h, sizeof(h), ex->m.src_layout_digest, PROTO_HASH_BYTES);
			ex_fail(p, EINVAL, "it was published from another trainer layout (%.16s)", h);
		} else if (ex->m.kind != PROTO_KIND_ANCHOR && !ex->addendum) {
			ex_fail(p, ENOTSUP, "it is a delta; only anchors are rebuilt");
		} else {
			ex->chunk_size = ex->m.chunk_size;
			ex->need = NEED_LAYOUTS;
			ex->tries = 0;
		}
	}
	node__pub_ex_step(p);
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
		node__pub_ex_step(p);
		return;
	}
	if (a->status != 200) {
		/* 404 before any publisher registered (tracker restart). */
		if (a->status != 404)
			LOG_WARN("fetching serving layouts: %s", a->error);
		ex_retry(p, a->status == 404 ? LAYOUTS_RETRY_MS : RETRY_MS);
		node__pub_ex_step(p);
		return;
	}
	md = json_string_value(json_object_get(a->json, "model_digest"));
	sodium_bin2hex(h, sizeof(h), p->model.digest, PROTO_HASH_BYTES);
	if (md == NULL || strcmp(md, h) != 0) {
		LOG_WARN("the tracker's model is not ours (another publisher?): waiting");
		ex_retry(p, RETRY_MS);
		node__pub_ex_step(p);
		return;
	}
	arr = json_object_get(a->json, "layouts");
	json_array_foreach(arr, i, e) {
		struct pub_layout *sl = node__pub_layout_absorb(p, e);
		if (!ex->verify && sl != NULL && !sl->bad &&
		    (!ex->addendum || node__pub_addendum_wants(p, sl)) && ex_add_layout(ex, sl) != 0) {
			ex_fail(p, ENOMEM, "out of memory");
			node__pub_ex_step(p);
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
			struct pub_layout *sl = node__pub_layout_find(p, ml->layout_digest);
			sodium_bin2hex(h, sizeof(h), ml->layout_digest, PROTO_HASH_BYTES);
			if (sl == NULL || sl->bad)
				continue;
			if (memcmp(sl->plan.digest, ml->plan_digest, PROTO_HASH_BYTES) != 0) {
				ex_fail(p, EINVAL, "layout %.16s: our plan differs from the signed one", h);
				node__pub_ex_step(p);
				return;
			}
			if (ex_add_layout(ex, sl) != 0) {
				ex_fail(p, ENOMEM, "out of memory");
				node__pub_ex_step(p);
				return;
			}
		}
		/* Wait up to two leases: long enough for nodes that lost theirs
		 * (or a restarted tracker) to register their layouts again. */
		if (ex->nlayouts == 0 &&
		    ex->tries++ >= 2 * proto_param(PROTO_PARAM_LEASE_MS) / LAYOUTS_RETRY_MS)
			ex_fail(p, ENOENT, "none of its %u serving layouts is registered now",
				ex->m.nlayouts);
	}
	if (ex->failed) {
		/* nothing more to ask */
	} else if (ex->nlayouts == 0 && ex->addendum) {
		ex_fail(p, ENOENT, "none of the layouts to add is registered now");
	} else if (ex->nlayouts == 0) {
		uint64_t now = proto_now_ns() / 1000000;
		if (!ex->verify && !p->layouts_waiting) {
			p->layouts_waiting = true;
			p->layouts_wait_ms = now;
			LOG_INFO("no serving layout registered yet: waiting before exporting version %llu",
				 (unsigned long long)ex->version);
		}
		/* Said at the default level once the wait lasts: a publisher
		 * started alone is otherwise silent. */
		if (!ex->verify && !p->layouts_warned &&
		    now - p->layouts_wait_ms >= proto_param(PROTO_PARAM_WAIT_NOTICE_MS)) {
			p->layouts_warned = true;
			LOG_WARN("no node has registered a serving layout for %llu s: version %llu waits "
				 "for one to register (said once)",
				 (unsigned long long)(now - p->layouts_wait_ms) / 1000,
				 (unsigned long long)ex->version);
		}
		ex_retry(p, LAYOUTS_RETRY_MS);
	} else {
		if (p->layouts_warned)
			LOG_INFO("a serving layout is registered: exporting version %llu",
				 (unsigned long long)ex->version);
		p->layouts_waiting = false;
		p->layouts_warned = false;
		ex->need = NEED_NONE;
		ex->wait_ns = proto_now_ns() - ex->start_ns;
	}
	node__pub_ex_step(p);
}

/* Lists every part's parcels, lays them out in its buffer, starts gathering. */
static void ex_gather_start(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct pub_version *pv = ex->pv;
	uint64_t cs = ex->chunk_size;

	ex->phase = EX_GATHER;
	pv->layouts = calloc(PROTO_MAX(ex->nlayouts, 1), sizeof(*pv->layouts));
	if (pv->layouts == NULL) {
		ex_fail(p, ENOMEM, "out of memory");
		return;
	}
	pv->nlayouts = ex->nlayouts;
	for (size_t li = 0; li < ex->nlayouts; li++)
		memcpy(pv->layouts[li].digest, ex->layouts[li]->digest, PROTO_HASH_BYTES);
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		size_t n = 0;
		uint64_t off = 0;
		for (size_t li = 0; li < ex->nlayouts; li++)
			for (uint32_t k = 0; k < ex->layouts[li]->plan.nparcels; k++)
				n += ex->layouts[li]->plan.parcels[k].src_rank == pt->rank;
		pt->items = calloc(PROTO_MAX(n, 1), sizeof(*pt->items));
		pt->slices = calloc(PROTO_MAX(ex->nlayouts, 1), sizeof(*pt->slices));
		if (pt->items == NULL || pt->slices == NULL) {
			ex_fail(p, ENOMEM, "out of memory");
			return;
		}
		pt->nslices = ex->nlayouts;
		/* Layout by layout: each layout's parcels form one page-aligned slice. */
		for (size_t li = 0; li < ex->nlayouts; li++) {
			const struct pub_layout *sl = ex->layouts[li];
			pt->slices[li].off = off;
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
				it->wire = pc->bytes;
				off = (off + pc->bytes + PUB_ALIGN - 1) & ~(uint64_t)(PUB_ALIGN - 1);
				it->hash = calloc(PROTO_MAX(nch, 1), PROTO_HASH_BYTES);
				if (it->hash == NULL) {
					ex_fail(p, ENOMEM, "out of memory");
					return;
				}
			}
			pt->slices[li].len = off - pt->slices[li].off;
		}
		pt->used = off;
	}
	/* Anchor or delta: the snapshot is kept as the next export's parent
	 * (node/pub_delta.c). An addendum's parcels are always full: its
	 * layout has no parent. */
	const char *why = ex->verify     ? "rebuilt after a restart" :
			  ex->addendum ? "an addendum for a new layout" :
					 node__pub_delta_why_anchor(p, ex);
	if (why == NULL && !node__pub_delta_link(p, ex))
		why = "a serving layout the parent export does not have";
	ex->delta = why == NULL;
	ex->since_anchor = ex->delta ? p->parent->since_anchor + 1 : 0;
	if (why != NULL && why != ex->why)
		snprintf(ex->why, sizeof(ex->why), "%s", why);
	bool keep = !ex->verify && !ex->addendum && node__pub_keeps_parent(p);
	for (size_t i = 0; i < pv->nparts; i++) {
		struct pub_part *pt = &pv->parts[i];
		if (!ex->delta && node__pub_part_alloc(p, pt) != 0) {
			ex_fail(p, ENOMEM, "cannot map a %llu-byte export buffer for rank %u",
				(unsigned long long)node__pub_page_round(pt->used), pt->rank);
			return;
		}
	}
	if (ex->addendum)
		LOG_INFO("version %llu: %s", (unsigned long long)ex->version, ex->why);
	else if (!ex->verify) {
		if (ex->delta)
			LOG_INFO("version %llu: a delta against version %llu (%u since the anchor; "
				 "%zu of %zu snapshot blocks recycled)",
				 (unsigned long long)ex->version, (unsigned long long)p->parent->version,
				 ex->since_anchor, ex->recycled, keep ? pv->nparts : 0);
		else
			LOG_INFO("version %llu: an anchor: %s (%zu of %zu snapshot blocks recycled)",
				 (unsigned long long)ex->version, ex->why, keep ? ex->recycled : 0,
				 keep ? pv->nparts : 0);
	}
	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		j->part = &pv->parts[i];
		j->chunk_size = ex->chunk_size;
		j->delta = ex->delta;
		j->sums = !ex->delta && !ex->verify && !ex->addendum && node__pub_keeps_parent(p);
		j->threads = node__pub_delta_threads(ex->njobs);
		/* An addendum takes no snapshot. A trainer's buffers hold its
		 * next weights by now, so its new parcels are gathered from
		 * the version as served; a synthetic or file source still
		 * gives the version itself, and faster (nothing to put back
		 * together from parcels), so it is read again. */
		j->restore = ex->addendum;
		/* The version kept as the parent: its snapshot is the rank's
		 * memory as it was, read where it lies. */
		uint8_t *kept = ex->addendum ? node__pub_parent_block(p, ex->version, j->rank) : NULL;
		if (kept != NULL) {
			j->block = kept;
			j->restored = true;
		} else if (j->restore && p->trainer &&
		    node__pub_addendum_sources(p, ex->version, j->rank, &j->rs, &j->nrs) != 0)
			LOG_WARN("version %llu: out of memory listing rank %u's served parcels; "
				 "rebuilding it from the source",
				 (unsigned long long)ex->version, j->rank);
	}
	ex_launch(p, JOB_GATHER);
}

static void ex_gathered(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct proto_err err = {{0}};
	int rc;

	ex->hash_ns = proto_now_ns() - ex->phase_ns;
	ex->su.hashed = proto_wall_ms();
	ex->cpu_hashed = proto_process_cpu_ns();
	if (atomic_load(&p->abort)) {
		ex_fail(p, ECANCELED, "stopped");
		return;
	}
	if (ex->addendum) {
		size_t restored = 0;
		for (size_t i = 0; i < ex->njobs; i++)
			restored += ex->jobs[i].restored;
		LOG_INFO("version %llu: new layouts gathered and hashed in %llu ms, %zu of %zu trainer "
			 "ranks from the version as served (its snapshot kept as the parent, or its served "
			 "parcels)%s",
			 (unsigned long long)ex->version, (unsigned long long)ms_of(ex->hash_ns),
			 restored, ex->njobs, restored < ex->njobs ? ", the others from the source" : "");
	}
	uint64_t cpu_ns = 0;
	for (size_t i = 0; i < ex->njobs; i++) {
		ex->encode_ns = PROTO_MAX(ex->encode_ns, ex->jobs[i].encode_ns);
		cpu_ns += ex->jobs[i].cpu_ns;
	}
	/* Load-robust where the wall time is not: the workers' CPU time. */
	uint64_t nin = 0, tot = 0;
	size_t nsums = 0, nitems = 0;
	for (size_t i = 0; ex->delta && i < ex->pv->nparts; i++)
		for (size_t j = 0; j < ex->pv->parts[i].nitems; j++) {
			nin += ex->pv->parts[i].items[j].in_place;
			tot += ex->pv->parts[i].items[j].pc->bytes;
			nsums += ex->pv->parts[i].items[j].parent_sums != NULL;
			nitems++;
		}
	/* (With more than one encoder thread a job's CPU time is not all of it.) */
	char cpu[48] = "";
	if (ex->jobs[0].threads == 1)
		snprintf(cpu, sizeof(cpu), ", %llu ms of CPU", (unsigned long long)ms_of(cpu_ns));
	if (ex->delta && !ex->verify)
		LOG_INFO("version %llu: %zu trainer ranks' parcels encoded in %llu ms%s (%.1f of %.1f "
			 "MiB read in place from the snapshots, the others gathered; the parent's "
			 "checksums known for %zu of %zu parcels, the others summed)",
			 (unsigned long long)ex->version, ex->njobs,
			 (unsigned long long)ms_of(ex->encode_ns), cpu, (double)nin / (1 << 20),
			 (double)tot / (1 << 20), nsums, nitems);
	if (ex->delta) {
		rc = node__pub_delta_place(p, ex, &err);
		if (rc < 0) {
			ex_fail(p, -rc, "%s", err.msg);
			return;
		}
		if (rc == 1) {
			/* Too large: gather and hash the parcels, and send an anchor. */
			LOG_INFO("version %llu: an anchor after all: %s", (unsigned long long)ex->version,
				 ex->why);
			for (size_t i = 0; i < ex->pv->nparts; i++) {
				struct pub_part *pt = &ex->pv->parts[i];
				node__pub_part_layout(pt, ex->nlayouts);
				for (size_t j = 0; j < pt->nitems; j++) {
					struct pub_item *it = &pt->items[j];
					free(it->hash);
					it->nchunks = (uint32_t)((it->pc->bytes + ex->chunk_size - 1) /
								 ex->chunk_size);
					it->hash = calloc(PROTO_MAX(it->nchunks, 1), PROTO_HASH_BYTES);
					if (it->hash == NULL) {
						ex_fail(p, ENOMEM, "out of memory");
						return;
					}
				}
				if (node__pub_part_alloc(p, pt) != 0) {
					ex_fail(p, ENOMEM, "cannot map a %llu-byte export buffer for rank %u",
						(unsigned long long)node__pub_page_round(pt->used), pt->rank);
					return;
				}
			}
			/* Gathered from the snapshot again, as an anchor's. */
			for (size_t i = 0; i < ex->njobs; i++)
				ex->jobs[i].delta = false;
			ex->copying = true;
			ex_launch(p, JOB_GATHER);
			return;
		}
	}
	if (ex->raw_bytes == 0)
		for (size_t i = 0; i < ex->pv->nparts; i++)
			for (size_t j = 0; j < ex->pv->parts[i].nitems; j++)
				ex->raw_bytes += ex->pv->parts[i].items[j].pc->bytes;
	if (!ex->verify && !ex->addendum)
		node__pub_parent_stage(p, ex);
	rc = ex->verify ? node__pub_manifest_compare(p, &err) :
	     ex->addendum ? node__pub_addendum_build(p, &err) : node__pub_manifest_build(p, &err);
	if (rc != 0) {
		ex_fail(p, -rc, "%s", err.msg);
		return;
	}
	ex->su.signed_ = proto_wall_ms();
	ex->cpu_signed = proto_process_cpu_ns();
	/* The added layouts' canary scores: their version is published already. */
	if (ex->addendum && !p->add_copy && (ex->canary = node__pub_canary_json(ex)) != NULL)
		node__pub_canary_post(p, ex);
	/* Parts of ranks hosted elsewhere were only needed for their hashes. */
	for (size_t i = 0; i < ex->pv->nparts; i++)
		if (!ex->pv->parts[i].hosted)
			node__pub_part_release(p, &ex->pv->parts[i]);
	if ((rc = node__pub_version_serve(p, ex->pv, &err)) != 0) {
		ex_fail(p, -rc, "%s", err.msg);
		return;
	}
	if (ex->verify) {
		ex->phase = EX_OFFER;
		ex->pv->next = p->versions;
		p->versions = ex->pv;
		node__pub_sync_offers(p);
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
	ex->su.answered = proto_wall_ms();
	if (ex->failed) {
		node__pub_ex_step(p);
		return;
	}
	if (a->status == 200 || a->status == 201) {
		memcpy(p->prev_digest, ex->m.digest, PROTO_HASH_BYTES);
		node__pub_parent_commit(p, ex);
		node__pub_canary_post(p, ex);
		ex->pv->delta = ex->delta;
		p->next_version = ex->version + 1;
		p->published = PROTO_MAX(p->published, ex->version);
		ex->phase = EX_OFFER;
		ex->pv->next = p->versions;
		p->versions = ex->pv;
		node__pub_sync_offers(p);
		/* Which older versions are still wanted: ask now, not at the next
		 * period, so versions published faster than it are freed soon. */
		node__pub_on_check(-1, 0, p);
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
			node__pub_watch_versions(p);
		}
	}
	node__pub_ex_step(p);
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
		rc = ex->addendum ? node__pub_addendum_post(p) :
				    trk_client_publish(p->trk, ex->mbuf, ex->mlen, on_ex_publish, p);
	} else {
		return;
	}
	if (rc == 0) {
		ex->req_busy = true;
		if (ex->phase == EX_PUBLISH && ex->su.sent == 0)
			ex->su.sent = proto_wall_ms();
	} else {
		ex_retry(p, RETRY_MS);
	}
}

/* Moves the export on as far as it can go now. Last call of every callback. */
void node__pub_ex_step(struct node_pub *p)
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
		/* The retention check asked at the start also says whether a
		 * node wants an anchor: its answer decides this export's kind. */
		if (ex->jobs_left == 0 && ex->need == NEED_NONE && !(p->check_busy && !ex->verify)) {
			ex_gather_start(p);
			node__pub_ex_step(p); /* a failure to finish, or wait for the workers */
		}
		break;
	case EX_GATHER:
		if (ex->jobs_left == 0) {
			ex_gathered(p);
			if (ex->jobs_left == 0) /* else the anchor's copy runs */
				node__pub_ex_step(p);
		}
		break;
	case EX_PUBLISH:
		ex_request(p);
		break;
	case EX_OFFER:
		if (!ex->pv->so.busy && (ex->pv->so.tried || !p->registered))
			ex_finish(p);
		break;
	}
}

void node__pub_on_wake(evutil_socket_t fd, short what, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	char b[64];

	while (recv(fd, b, sizeof(b), MSG_DONTWAIT) > 0)
		;
	if (ex == NULL)
		return;
	ex_join(p, ex);
	if (ex->jobs_left == 0 && ex->phase == EX_PREP && !ex->snap_done) {
		ex->snap_done = true;
		ex->snapshot_ns = proto_now_ns() - ex->phase_ns;
		ex->cpu_snap = proto_process_cpu_ns();
		/* For the version's timeline: the leader's fresh exports only
		 * (not a rebuild after a restart). */
		if (ex->pv != NULL && ex->req != NULL && !ex->verify)
			ex->pv->snapshot_ms = proto_wall_ms();
		if (!ex->failed && ex->req != NULL && ex->req->on_snap != NULL)
			ex->req->on_snap(ex->req->arg, ex->version);
	}
	node__pub_ex_step(p);
}

void node__pub_ex_start(struct node_pub *p, struct pub_req *req, uint64_t version, bool verify)
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
	ex->addendum = p->addendum_next && !verify;
	p->addendum_next = false;
	ex->phase = EX_PREP;
	/* An addendum starts from the tracker's manifest of the version. */
	ex->need = verify ? NEED_WATCH : ex->addendum ? NEED_MANIFEST : NEED_LAYOUTS;
	ex->start_ns = proto_now_ns();
	ex->t0_ns = req ? req->t0_ns : ex->start_ns;
	ex->created_ms = req ? req->created_ms : proto_wall_ms();
	ex->chunk_size = (uint32_t)proto_param(PROTO_PARAM_CHUNK_SIZE);
	ex->cpu0 = proto_process_cpu_ns();
	if (!node__pub_source_has(p, version)) {
		if (p->trainer)
			ex_fail(p, ERANGE, "only a trainer's export can be published");
		else
			ex_fail(p, ERANGE, "the model dir holds only %zu versions", p->nfiles);
		node__pub_ex_step(p);
		return;
	}
	/* The leader computes every rank (for the manifest); others their own. */
	n = verify ? p->nhosted : p->tl.nranks;
	ex->pv = pv = calloc(1, sizeof(*pv));
	ex->jobs = calloc(n, sizeof(*ex->jobs));
	if (pv == NULL || ex->jobs == NULL || (pv->parts = calloc(n, sizeof(*pv->parts))) == NULL) {
		ex_fail(p, ENOMEM, "out of memory");
		node__pub_ex_step(p);
		return;
	}
	pv->p = p;
	pv->version = version;
	pv->so.version = version;
	pv->created_ms = ex->created_ms;
	pv->nparts = n;
	ex->njobs = n;
	node__pub_prefault_join(p); /* the first export's blocks, if touched before it */
	for (size_t i = 0; i < n; i++) {
		uint32_t r = verify ? p->hosted[i].rank : (uint32_t)i;
		struct pub_job *j = &ex->jobs[i];
		pv->parts[i].rank = r;
		for (size_t h = 0; h < p->nhosted; h++)
			pv->parts[i].hosted |= p->hosted[h].rank == r;
		ex->recycled += p->blocks[r] != NULL;
		if (p->blocks[r] == NULL) {
			p->block_cap[r] = node__pub_page_round(p->tl.ranks[r].nbytes);
			p->blocks[r] = node_serve_map(p->block_cap[r]);
			if (p->blocks[r] == NULL) {
				ex_fail(p, ENOMEM, "cannot map rank %u's %llu-byte snapshot", r,
					(unsigned long long)p->tl.ranks[r].nbytes);
				node__pub_ex_step(p);
				return;
			}
		}
		j->p = p;
		j->version = version;
		j->rank = r;
		j->block = p->blocks[r];
	}
	if (!ex->addendum) /* an addendum's gather rebuilds what it needs */
		ex_launch(p, JOB_SNAPSHOT);
	/* Ask now which served versions and layouts replicas still aim at, so
	 * those they left are freed while the snapshot is taken, before this
	 * version's buffers are mapped, not after it is published. */
	node__pub_on_check(-1, 0, p);
	node__pub_ex_step(p);
}
