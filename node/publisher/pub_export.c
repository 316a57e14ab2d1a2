/* The publisher's export of a version: the state machine from the layouts to the offer. */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "proto/delta.h"

#define LAYOUTS_RETRY_MS 200      /* no serving layout yet: ask again */
#define WATCH_WAIT_MS 10000       /* long-poll for a version we wait for */
#define PUBLISH_TRIES 20          /* transport failures before giving up */

static uint64_t ms_of(uint64_t ns)
{
	return ns / 1000000u;
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

/* Joins the finished workers. A rank's snapshot block stays mapped after
 * its gather: the next version's snapshot is taken into the same pages
 * (faulted in once, not per version); a publisher that keeps parents holds
 * two per rank, taking turns (the other is the next delta's parent). */
static void ex_join(struct node_pub *p, struct pub_export *ex)
{
	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		if (j->running && atomic_load(&j->done)) {
			node__pub_job_join(j);
			ex->jobs_left--;
			if (j->rc != 0)
				ex_fail(p, -j->rc, "rank %u's snapshot: %s", j->rank, j->err.msg);
		}
	}
}

/* Joins the workers and frees the export, and its version unless that is
 * already among the served ones. */
void node__pub_ex_free(struct node_pub *p, struct pub_export *ex)
{
	bool listed = false;

	for (size_t i = 0; i < ex->njobs; i++) {
		struct pub_job *j = &ex->jobs[i];
		node__pub_job_join(j);
		free(j->rs);
		/* The encoder's scratch goes back to the publisher, for the next. */
		if (j->scratch != NULL && j->rank < p->tl.nranks && p->scratch[j->rank] == NULL)
			p->scratch[j->rank] = j->scratch;
		else
			proto_delta_scratch_free(j->scratch);
		j->scratch = NULL;
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
	free(ex->tl_blocks);
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
		node__pub_job_join(&ex->jobs[i]);
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
	r.faults = proto_process_faults() - ex->faults0;
	/* A fresh leader export's phases, the offer's with them. */
	struct trk_publish_report report;
	if (!ex->failed && ex->pv != NULL && ex->pv->has_report) {
		node__pub_report(ex, now, true, &report);
		r.report = &report;
	}
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
static void ex_launch(struct node_pub *p, enum pub_job_kind kind)
{
	struct pub_export *ex = p->ex;

	ex->phase_ns = proto_now_ns();
	for (size_t i = 0; i < ex->njobs; i++) {
		int rc = node__pub_job_start(&ex->jobs[i], kind);
		if (rc != 0) {
			ex_fail(p, -rc, "starting a worker thread: %s", strerror(-rc));
			return;
		}
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

/* The answer to the export's tracker request came: false when the export
 * failed meanwhile (it is stepped on to its end; the answer is dropped). */
static bool ex_answered(struct node_pub *p)
{
	p->ex->req_busy = false;
	if (!p->ex->failed)
		return true;
	node__pub_ex_step(p);
	return false;
}

static void on_ex_watch(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	struct trk_version_info *vi = NULL;
	struct proto_err err = {{0}};
	uint64_t latest = 0;
	size_t n = 0;

	if (!ex_answered(p))
		return;
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

	if (!ex_answered(p))
		return;
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

	if (!ex_answered(p))
		return;
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
	if (json_array_size(arr) > 0)
		p->layouts_seen = true;
	ex->unservable = 0;
	json_array_foreach(arr, i, e) {
		struct pub_layout *sl = node__pub_layout_absorb(p, e);
		ex->unservable += sl != NULL && sl->bad;
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
		if (!ex->verify)
			ex->waited_node = true;
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
			/* A node that had registered one and lost its lease (stopped,
			 * cut off) took its layout with it: say that, not "none
			 * registered". */
			if (ex->unservable > 0)
				LOG_WARN("the tracker lists %u serving layout%s that this publisher "
					 "cannot serve (said above, at warn) and none it can: version "
					 "%llu waits for one it can (said once)",
					 ex->unservable, ex->unservable == 1 ? "" : "s",
					 (unsigned long long)ex->version);
			else if (p->layouts_seen)
				LOG_WARN("no node alive has a serving layout for %llu s (the leases of "
					 "all that registered one lapsed): version %llu waits for one "
					 "to register (said once)",
					 (unsigned long long)(now - p->layouts_wait_ms) / 1000,
					 (unsigned long long)ex->version);
			else
				LOG_WARN("no node has registered a serving layout for %llu s: version "
					 "%llu waits for one to register (said once)",
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
		struct proto_err err = {{0}};
		int rc = node__pub_part_list(&pv->parts[i], ex->layouts, ex->nlayouts, ex->chunk_size,
					     &err);
		if (rc != 0) {
			ex_fail(p, -rc, "%s", err.msg);
			return;
		}
	}
	/* Anchor or delta: the snapshot is kept as the next export's parent
	 * (pub_delta.c). An addendum's parcels are always full: its
	 * layout has no parent. */
	const char *why = ex->verify     ? "rebuilt after a restart" :
			  ex->addendum ? "an addendum for a new layout" :
					 node__pub_delta_why_anchor(p, ex);
	if (why == NULL && !node__pub_delta_link(p, ex))
		why = "a serving layout the parent export does not have";
	ex->delta = why == NULL;
	if (ex->delta)
		node__pub_delta_begin(ex);
	if (!ex->delta && !ex->verify && !ex->addendum && p->delta_skip > 0)
		p->delta_skip--;
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
	/* FP8 layouts are quantized from every rank's memory of the version:
	 * the snapshots, or for an addendum those kept with the parent. */
	ex->tl_blocks = calloc(p->tl.nranks + 1, sizeof(*ex->tl_blocks));
	if (ex->tl_blocks == NULL) {
		ex_fail(p, ENOMEM, "out of memory");
		return;
	}
	for (uint32_t r = 0; r < p->tl.nranks; r++)
		ex->tl_blocks[r] = ex->addendum ? node__pub_parent_block(p, ex->version, r) : p->blocks[r];
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
		j->tl_blocks = ex->tl_blocks;
		j->q_keep = p->parent != NULL ? p->parent->version : 0;
		j->q_reuse = ex->addendum;
		j->chunk_size = ex->chunk_size;
		j->delta = ex->delta;
		j->sums = !ex->delta && !ex->verify && !ex->addendum && node__pub_keeps_parent(p);
		j->threads = node__pub_delta_threads(ex->njobs);
		j->budget = ex->delta ? &ex->budget : NULL;
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
		    node__pub_restore_sources(p, ex->version, j->rank, &j->rs, &j->nrs) != 0)
			LOG_WARN("version %llu: out of memory listing rank %u's served parcels; "
				 "rebuilding it from the source",
				 (unsigned long long)ex->version, j->rank);
	}
	ex->gather0_ns = proto_now_ns();
	ex_launch(p, PUB_JOB_GATHER);
}

static void ex_gathered(struct node_pub *p)
{
	struct pub_export *ex = p->ex;
	struct proto_err err = {{0}};
	int rc;

	/* (A delta found too large is gathered again as an anchor: then
	 * this runs twice, the gather's end is the second's.) */
	ex->gathered_ns = proto_now_ns();
	if (ex->delta)
		ex->encode_end_ns = ex->gathered_ns;

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
			/* Too large: gather and hash the parcels, and send an anchor;
			 * the next versions are anchors without trying (backoff). */
			p->delta_backoff = PROTO_MIN(p->delta_backoff ? 2 * p->delta_backoff : 1,
						     PROTO_MAX(p->anchor_every, 1u));
			p->delta_skip = p->delta_backoff;
			LOG_INFO("version %llu: an anchor after all: %s (no delta tried for the next %u "
				 "versions)",
				 (unsigned long long)ex->version, ex->why, p->delta_skip);
			for (size_t i = 0; i < ex->njobs; i++)
				ex->jobs[i].budget = NULL;
			for (size_t i = 0; i < ex->pv->nparts; i++) {
				struct pub_part *pt = &ex->pv->parts[i];
				if (node__pub_part_raw(pt, ex->nlayouts, ex->chunk_size) != 0) {
					ex_fail(p, ENOMEM, "out of memory");
					return;
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
			ex_launch(p, PUB_JOB_GATHER);
			return;
		}
		p->delta_backoff = 0; /* a delta that pays */
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

	ex->su.answered = proto_wall_ms();
	ex->answered_ns = proto_now_ns();
	if (!ex_answered(p))
		return;
	if (a->status == 200 || a->status == 201) {
		node__pub_fixed(p, true);
		/* Its phases so far go to the tracker with the offer. */
		if (ex->req != NULL) {
			node__pub_report(ex, 0, false, &ex->pv->report);
			ex->pv->has_report = true;
		}
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
		/* Another model's versions at the tracker: every export after
		 * this one is refused too, until a person acts. */
		if (a->status == 409 && strstr(a->error, "model digest differs") != NULL) {
			char why[512];
			snprintf(why, sizeof(why), "the tracker refused our model's versions: %s: it "
				 "holds another model's (start the tracker on an empty --state, or "
				 "this publisher with that model)", a->error);
			node__pub_needs_fix(p, why, true);
		} else if (a->fix) {
			node__pub_needs_fix(p, a->error, false);
		}
		/* A conflict (someone else published; the chain moved on): learn
		 * the latest version again before the next export. */
		if (a->status == 409) {
			p->ready = false;
			node__pub_watch_versions(p);
		}
	}
	node__pub_ex_step(p);
}

static void on_ex_addendum(const struct trk_answer *a, void *arg)
{
	struct node_pub *p = arg;
	struct pub_export *ex = p->ex;
	struct proto_err err = {{0}};
	int rc;

	if (!ex_answered(p))
		return;
	rc = node__pub_addendum_answer(p, a, &err);
	if (rc < 0) {
		ex_fail(p, -rc, "%s", err.msg);
	} else if (rc == 1) { /* all in: the version offers its new layouts */
		ex->phase = EX_OFFER;
		node__pub_sync_offers(p);
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
		rc = ex->addendum ? node__pub_addendum_post(p, on_ex_addendum) :
				    trk_client_publish(p->trk, ex->mbuf, ex->mlen, on_ex_publish, p);
	} else {
		return;
	}
	if (rc == 0) {
		ex->req_busy = true;
		if (ex->phase == EX_PUBLISH && ex->su.sent == 0) {
			ex->su.sent = proto_wall_ms();
			ex->sent_ns = proto_now_ns();
		}
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
		ex->snap_end_ns = proto_now_ns();
		ex->snapshot_ns = ex->snap_end_ns - ex->phase_ns;
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
	/* The export's own faults from here: a worker's, making buffers ahead
	 * (pub_prefault.c), are done by now. */
	ex->faults0 = proto_process_faults();
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
		j->scratch = p->scratch[r]; /* the last export's, or NULL */
		p->scratch[r] = NULL;
	}
	if (!ex->addendum) /* an addendum's gather rebuilds what it needs */
		ex_launch(p, PUB_JOB_SNAPSHOT);
	/* Ask now which served versions and layouts replicas still aim at, so
	 * those they left are freed while the snapshot is taken, before this
	 * version's buffers are mapped, not after it is published. */
	node__pub_on_check(-1, 0, p);
	node__pub_ex_step(p);
}
