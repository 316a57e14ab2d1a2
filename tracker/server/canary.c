/* Canary scores (proto/canary.h): the expected score of every rank of every
 * layout of a version, as the leading publisher computed it from its export,
 * and the live score a probe read through each rank's served memory. The
 * status shows per rank and per replica whether they match.
 *
 * Soft state: expected scores live in memory only (a restarted tracker
 * shows no verdict until the next version's scores come); the newest
 * TRK__CANARY_ENTRIES (version, layout) entries are kept.
 */
#include <errno.h>
#include <event2/buffer.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

#define CANARY_LAYOUTS_MAX 256  /* layouts one POST may carry */
#define CANARY_RANKS_MAX 65536  /* ranks of one layout */

struct trk_cexp {
	uint64_t version;
	uint8_t layout[PROTO_HASH_BYTES];
	uint32_t nranks;
	int64_t *scores;
};

struct trk_canary {
	struct trk_cexp e[TRK__CANARY_ENTRIES];
	size_t next;                             /* ring position of the next new entry */
	uint64_t reports[3];                     /* live reports: match, mismatch, unknown */
};

int trk__canary_new(struct trk_canary **out)
{
	*out = calloc(1, sizeof(**out));
	return *out == NULL ? -ENOMEM : 0;
}

void trk__canary_free(struct trk_canary *cn)
{
	if (cn == NULL)
		return;
	for (size_t i = 0; i < TRK__CANARY_ENTRIES; i++)
		free(cn->e[i].scores);
	free(cn);
}

static struct trk_cexp *find(struct trk_canary *cn, uint64_t v, const uint8_t *layout)
{
	for (size_t i = 0; cn != NULL && i < TRK__CANARY_ENTRIES; i++)
		if (cn->e[i].version == v && cn->e[i].scores != NULL &&
		    memcmp(cn->e[i].layout, layout, PROTO_HASH_BYTES) == 0)
			return &cn->e[i];
	return NULL;
}

int trk__canary_expected(struct trk_server *s, uint64_t v, const uint8_t *layout, uint32_t rank,
			 int64_t *out)
{
	struct trk_cexp *e = find(s->canary, v, layout);

	if (e == NULL || rank >= e->nranks)
		return -ENOENT;
	*out = e->scores[rank];
	return 0;
}

/* 1 match, 0 mismatch, -1 no verdict (no live score at v, or no expected). */
static int rank_verdict(struct trk_server *s, const struct trk_node *n, uint64_t v)
{
	int64_t want;

	if (n == NULL || !n->canary.have || n->canary.version != v || n->layout == NULL ||
	    trk__canary_expected(s, v, n->layout->digest, n->rank, &want) != 0)
		return -1;
	return want == n->canary.score;
}

/* ---- POST /canary/expected ------------------------------------------------------ */

void trk__handle_canary_expected(struct trk_call *c)
{
	struct trk_server *s = c->s;
	struct proto_err err = {{0}};
	uint64_t v = 0;
	json_t *layouts = json_object_get(c->json, "layouts"), *l;
	struct trk_cexp got[CANARY_LAYOUTS_MAX];
	size_t n = 0, i;

	memset(got, 0, sizeof(got));
	if (trk__get_u64(c->json, "version", true, INT64_MAX, &v, &err) != 0)
		goto bad;
	if (trk__versions_find(s->vs, v) == NULL) {
		trk__fail(c, 404, "version %" PRIu64 " is not published", v);
		return;
	}
	if (!json_is_array(layouts) || json_array_size(layouts) > CANARY_LAYOUTS_MAX) {
		proto_errf(&err, EINVAL, "layouts: must be an array of at most %d", CANARY_LAYOUTS_MAX);
		goto bad;
	}
	/* Everything is checked before anything is kept. */
	json_array_foreach(layouts, i, l) {
		json_t *sc = json_object_get(l, "scores"), *x;
		struct trk_slayout *sl;
		size_t k;
		if (trk__get_hex(l, "layout", got[n].layout, PROTO_HASH_BYTES, &err) != 0)
			goto bad;
		if (!json_is_array(sc) || json_array_size(sc) == 0 ||
		    json_array_size(sc) > CANARY_RANKS_MAX) {
			proto_errf(&err, EINVAL, "layouts[%zu].scores: must be an array of 1..%d integers",
				   i, CANARY_RANKS_MAX);
			goto bad;
		}
		sl = trk__slayout_by_digest(s->reg, got[n].layout);
		if (sl != NULL && sl->l.nranks != json_array_size(sc)) {
			proto_errf(&err, EINVAL, "layouts[%zu].scores: %zu scores for a layout of %u ranks",
				   i, json_array_size(sc), sl->l.nranks);
			trk__slayout_put(s->reg, sl);
			goto bad;
		}
		trk__slayout_put(s->reg, sl);
		got[n].version = v;
		got[n].nranks = (uint32_t)json_array_size(sc);
		got[n].scores = malloc(got[n].nranks * sizeof(int64_t));
		n++;
		if (got[n - 1].scores == NULL) {
			proto_errf(&err, ENOMEM, "out of memory");
			goto bad;
		}
		json_array_foreach(sc, k, x) {
			if (!json_is_integer(x)) {
				proto_errf(&err, EINVAL, "layouts[%zu].scores[%zu]: must be an integer", i, k);
				goto bad;
			}
			got[n - 1].scores[k] = (int64_t)json_integer_value(x);
		}
	}
	for (i = 0; i < n; i++) {
		struct trk_cexp *e = find(s->canary, v, got[i].layout);
		if (e == NULL) {
			e = &s->canary->e[s->canary->next];
			s->canary->next = (s->canary->next + 1) % TRK__CANARY_ENTRIES;
		}
		free(e->scores);
		*e = got[i];
	}
	trk__reply_json(c, 200, json_pack("{s:I,s:I}", "version", (json_int_t)v, "layouts",
					  (json_int_t)n));
	return;
bad:
	for (i = 0; i < n; i++)
		free(got[i].scores);
	trk__fail(c, 400, "%s", err.msg);
}

/* ---- POST /canary ---------------------------------------------------------------- */

void trk__handle_canary_live(struct trk_call *c)
{
	struct trk_server *s = c->s;
	struct proto_err err = {{0}};
	const char *id = NULL;
	uint64_t v = 0;
	json_t *score = json_object_get(c->json, "score");
	struct trk_node *n;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, INT64_MAX, &v, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (!json_is_integer(score)) {
		trk__fail(c, 400, "score: must be an integer");
		return;
	}
	n = trk__node_find(s->reg, id);
	if (n == NULL) {
		trk__fail(c, 404, "no node %s", id);
		return;
	}
	if (v == 0 || trk__versions_find(s->vs, v) == NULL) {
		trk__fail(c, 404, "version %" PRIu64 " is not published", v);
		return;
	}
	n->canary.have = true;
	n->canary.version = v;
	n->canary.score = (int64_t)json_integer_value(score);
	n->canary.ms = proto_wall_ms();
	int verdict = rank_verdict(s, n, v);
	s->canary->reports[verdict == 1 ? 0 : verdict == 0 ? 1 : 2]++;
	if (verdict == 0)
		LOG_WARN("canary: node %s serves v%" PRIu64 " with score %" PRId64
			 ", expected another: its live weights are not the version's", n->id, v,
			 n->canary.score);
	trk__reply_json(c, 200, trk__canary_rank_json(s, n));
}

/* ---- what the status shows -------------------------------------------------------- */

json_t *trk__canary_rank_json(struct trk_server *s, const struct trk_node *n)
{
	int64_t want;
	int verdict;
	bool have_want;

	if (n == NULL || !n->canary.have)
		return json_null();
	verdict = rank_verdict(s, n, n->canary.version);
	have_want = n->layout != NULL &&
		    trk__canary_expected(s, n->canary.version, n->layout->digest, n->rank, &want) == 0;
	/* live: the probe read the version the rank serves now (an older
	 * probe's verdict says nothing of what it serves). */
	return json_pack("{s:s,s:I,s:I,s:f,s:o,s:o,s:I,s:b}", "id", n->id, "version",
			 (json_int_t)n->canary.version, "score", (json_int_t)n->canary.score,
			 "value", (double)n->canary.score / 4294967296.0, "expected",
			 have_want ? json_integer((json_int_t)want) : json_null(), "ok",
			 verdict < 0 ? json_null() : json_boolean(verdict == 1), "probed_ms",
			 (json_int_t)n->canary.ms, "live", n->canary.version == n->active);
}

json_t *trk__canary_replica_ok(struct trk_server *s, const struct trk_replica *rep, uint64_t v)
{
	bool all = v != 0;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		int verdict = rank_verdict(s, rep->ranks[i], v);
		if (verdict == 0)
			return json_false();
		all &= verdict == 1;
	}
	return all ? json_true() : json_null();
}

void trk__canary_stats(const struct trk_server *s, uint64_t reports[3], uint64_t *mismatched)
{
	*mismatched = 0;
	memcpy(reports, s->canary->reports, 3 * sizeof(reports[0]));
	for (struct trk_replica *rep = s->reg->reps; rep; rep = rep->next)
		for (uint32_t i = 0; i < rep->nranks; i++) {
			const struct trk_node *n = rep->ranks[i];
			if (n != NULL && n->alive && n->canary.have &&
			    rank_verdict((struct trk_server *)s, n, n->canary.version) == 0)
				(*mismatched)++;
		}
}
