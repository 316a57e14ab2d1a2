/* Per-version update timelines: when each boundary of an update passed, from
 * the export request to every replica's activation (soft, in memory). */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

struct trk_tl_rank {
	char replica[TRK_REPLICA_MAX + 1];
	uint32_t rank;
	uint64_t first_byte_ms, last_byte_ms, verified_ms, active_ms;
	uint64_t from_trainer, from_peers; /* bytes, as last reported */
};

struct trk_tl_replica {
	char name[TRK_REPLICA_MAX + 1];
	uint32_t nranks;
	uint64_t prepared_ms, activated_ms;
};

struct trk_tl_version {
	uint64_t version; /* 0: an unused slot */
	uint64_t snapshot_ms;
	bool has_publish;
	struct trk_publish_report publish; /* the publisher's report of its export */
	struct trk_tl_replica *reps;
	size_t nreps;
	struct trk_tl_rank *ranks;
	size_t nranks;
};

struct trk_timeline {
	struct trk_tl_version v[TRK__TIMELINE_VERSIONS];
};

int trk__timeline_new(struct trk_timeline **out)
{
	*out = calloc(1, sizeof(**out));
	return *out ? 0 : -ENOMEM;
}

static void slot_clear(struct trk_tl_version *s)
{
	free(s->reps);
	free(s->ranks);
	memset(s, 0, sizeof(*s));
}

void trk__timeline_free(struct trk_timeline *tl)
{
	if (tl == NULL)
		return;
	for (size_t i = 0; i < TRK__TIMELINE_VERSIONS; i++)
		slot_clear(&tl->v[i]);
	free(tl);
}

/* Version v's slot; a newer version takes over the slot of an older one.
 * NULL for a version older than the one in its slot, or when !create. */
static struct trk_tl_version *slot(struct trk_timeline *tl, uint64_t v, bool create)
{
	struct trk_tl_version *s = &tl->v[v % TRK__TIMELINE_VERSIONS];

	if (s->version == v)
		return s;
	if (!create || v < s->version)
		return NULL;
	slot_clear(s);
	s->version = v;
	return s;
}

static struct trk_tl_replica *replica_entry(struct trk_tl_version *s, const char *name,
					    uint32_t nranks)
{
	for (size_t i = 0; i < s->nreps; i++)
		if (strcmp(s->reps[i].name, name) == 0)
			return &s->reps[i];
	if (s->nreps >= TRK__TIMELINE_RANKS)
		return NULL;
	struct trk_tl_replica *n = realloc(s->reps, (s->nreps + 1) * sizeof(*n));
	if (n == NULL)
		return NULL;
	s->reps = n;
	n = &s->reps[s->nreps++];
	memset(n, 0, sizeof(*n));
	snprintf(n->name, sizeof(n->name), "%s", name);
	n->nranks = nranks;
	return n;
}

static struct trk_tl_rank *rank_entry(struct trk_tl_version *s, const char *replica,
				      uint32_t rank)
{
	for (size_t i = 0; i < s->nranks; i++)
		if (s->ranks[i].rank == rank && strcmp(s->ranks[i].replica, replica) == 0)
			return &s->ranks[i];
	if (s->nranks >= TRK__TIMELINE_RANKS)
		return NULL;
	struct trk_tl_rank *n = realloc(s->ranks, (s->nranks + 1) * sizeof(*n));
	if (n == NULL)
		return NULL;
	s->ranks = n;
	n = &s->ranks[s->nranks++];
	memset(n, 0, sizeof(*n));
	snprintf(n->replica, sizeof(n->replica), "%s", replica);
	n->rank = rank;
	return n;
}

void trk__timeline_snapshot(struct trk_timeline *tl, uint64_t v, uint64_t snapshot_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	/* Several publishers each snapshot their ranks: the version is stable
	 * once the last of them is. */
	if (s != NULL && snapshot_ms > s->snapshot_ms)
		s->snapshot_ms = snapshot_ms;
}

void trk__timeline_publish(struct trk_timeline *tl, uint64_t v,
			   const struct trk_publish_report *r)
{
	struct trk_tl_version *s = slot(tl, v, true);

	if (s == NULL)
		return;
	s->publish = *r;
	s->has_publish = true;
}

int trk__timeline_set_publish(struct trk_timeline *tl, uint64_t v, json_t *o)
{
	struct trk_tl_version *s = slot(tl, v, false);

	if (s == NULL || !s->has_publish)
		return 0;
	return trk__set(o, "publish", trk_publish_report_json(&s->publish));
}

void trk__timeline_rank(struct trk_timeline *tl, uint64_t v, const char *replica,
			uint32_t nranks, uint32_t rank, enum trk_rank_state st,
			uint64_t first_byte_ms, uint64_t last_byte_ms, uint64_t from_trainer,
			uint64_t from_peers, uint64_t now_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	struct trk_tl_rank *e;

	if (s == NULL || replica_entry(s, replica, nranks) == NULL ||
	    (e = rank_entry(s, replica, rank)) == NULL)
		return;
	if (first_byte_ms != 0 && (e->first_byte_ms == 0 || first_byte_ms < e->first_byte_ms))
		e->first_byte_ms = first_byte_ms;
	if (last_byte_ms > e->last_byte_ms)
		e->last_byte_ms = last_byte_ms;
	e->from_trainer = from_trainer;
	e->from_peers = from_peers;
	if ((st == TRK_STATE_VERIFIED || st == TRK_STATE_ACTIVE) && e->verified_ms == 0)
		e->verified_ms = now_ms;
	if (st == TRK_STATE_ACTIVE && e->active_ms == 0)
		e->active_ms = now_ms;
}

void trk__timeline_replica(struct trk_timeline *tl, uint64_t v, const char *replica,
			   uint32_t nranks, bool activated, uint64_t now_ms)
{
	struct trk_tl_version *s = slot(tl, v, true);
	struct trk_tl_replica *e = s ? replica_entry(s, replica, nranks) : NULL;

	if (e == NULL)
		return;
	if (!activated && e->prepared_ms == 0)
		e->prepared_ms = now_ms;
	if (activated && e->activated_ms == 0) {
		e->activated_ms = now_ms;
		if (e->prepared_ms == 0)
			e->prepared_ms = now_ms;
	}
}

/* A time, or null when it has not passed (yet). */
static json_t *ms_json(uint64_t ms)
{
	return ms ? json_integer((json_int_t)ms) : json_null();
}

/* Rank entries by replica name, then in the order they came. */
static int cmp_rank_entry(const void *a, const void *b)
{
	const struct trk_tl_rank *x = *(const struct trk_tl_rank *const *)a;
	const struct trk_tl_rank *y = *(const struct trk_tl_rank *const *)b;
	int c = strcmp(x->replica, y->replica);

	return c != 0 ? c : (x > y) - (x < y);
}

/* The first of n entries (sorted by cmp_rank_entry) of replica name: n
 * when there is none. */
static size_t first_of(const struct trk_tl_rank *const *by, size_t n, const char *name)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(by[mid]->replica, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

json_t *trk__timeline_json(struct trk_timeline *tl, const struct trk_version *ver)
{
	struct trk_tl_version *s = slot(tl, ver->version, false);
	json_t *reps = json_array();
	/* Each replica's ranks found by name in a sorted index, not by
	 * walking every rank per replica (thousands of each). */
	const struct trk_tl_rank **by = NULL;
	size_t nby = s != NULL ? s->nranks : 0;
	json_t *o = json_pack("{s:I,s:s,s:I,s:o,s:o,s:o}", "version", (json_int_t)ver->version,
			      "kind", ver->kind == PROTO_KIND_DELTA ? "delta" : "anchor", "wire_bytes",
			      (json_int_t)ver->wire_bytes, "export_asked_ms", ms_json(ver->created_ms),
			      "snapshot_ms", ms_json(s ? s->snapshot_ms : 0), "published_ms",
			      ms_json(ver->published_ms));

	if (nby > 0 && (by = malloc(nby * sizeof(*by))) != NULL) {
		for (size_t k = 0; k < nby; k++)
			by[k] = &s->ranks[k];
		qsort(by, nby, sizeof(*by), cmp_rank_entry);
	}
	if (o == NULL || reps == NULL || json_object_set_new(o, "replicas", reps) != 0 ||
	    (nby > 0 && by == NULL) || trk__timeline_set_publish(tl, ver->version, o) != 0) {
		free(by);
		json_decref(o);
		return NULL;
	}
	for (size_t i = 0; s != NULL && i < s->nreps; i++) {
		const struct trk_tl_replica *rp = &s->reps[i];
		json_t *ranks = json_array();
		for (size_t k = first_of(by, nby, rp->name);
		     k < nby && strcmp(by[k]->replica, rp->name) == 0; k++) {
			const struct trk_tl_rank *e = by[k];
			json_array_append_new(ranks, json_pack("{s:I,s:o,s:o,s:o,s:o,s:I,s:I}", "rank",
							       (json_int_t)e->rank, "first_byte_ms",
							       ms_json(e->first_byte_ms), "last_byte_ms",
							       ms_json(e->last_byte_ms), "verified_ms",
							       ms_json(e->verified_ms), "activated_ms",
							       ms_json(e->active_ms), "bytes_from_trainer",
							       (json_int_t)e->from_trainer,
							       "bytes_from_peers",
							       (json_int_t)e->from_peers));
		}
		json_array_append_new(reps, json_pack("{s:s,s:I,s:o,s:o,s:o}", "replica", rp->name,
						      "nranks", (json_int_t)rp->nranks, "prepared_ms",
						      ms_json(rp->prepared_ms), "activated_ms",
						      ms_json(rp->activated_ms), "ranks", ranks));
	}
	free(by);
	return o;
}

void trk__handle_timeline(struct trk_call *c, const char *num)
{
	struct trk_version *ver;
	uint64_t v;
	json_t *o;

	if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0) {
		trk__fail(c, 400, "version '%s' is not a positive integer", num);
		return;
	}
	ver = trk__versions_find(c->s->vs, v);
	if (ver == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)v);
		return;
	}
	o = trk__timeline_json(c->s->reg->tl, ver);
	if (o == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__reply_json(c, 200, o);
}
