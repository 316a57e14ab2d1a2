/* Layouts: parsing (explicit and shorthand), validation, digests, built-ins. */
#include <errno.h>
#include <fnmatch.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto/box.h"
#include "proto/fp8.h"
#include "proto/layout_fp8.h"
#include "proto/params.h"
#include "proto/spec.h"

#define LOCAL_ALIGN 256 /* byte alignment of local tensors in a rank block */

/* ---- building blocks ---------------------------------------------------- */

static void local_fini(struct proto_local *l)
{
	free(l->name);
	free(l->pieces);
}

void proto_layout_fini(struct proto_layout *l)
{
	for (uint32_t r = 0; r < l->nranks; r++) {
		for (uint32_t i = 0; i < l->ranks[r].nlocals; i++)
			local_fini(&l->ranks[r].locals[i]);
		free(l->ranks[r].locals);
	}
	free(l->ranks);
	if (l->model != NULL) {
		proto_model_fini(l->model);
		free(l->model);
	}
	memset(l, 0, sizeof(*l));
}

static int layout_alloc_ranks(struct proto_layout *l, uint64_t nranks,
			      const char *what, struct proto_err *err)
{
	if (nranks == 0 || nranks > PROTO_MAX_RANKS)
		return proto_errf(err, EINVAL, "%s: ranks: %llu ranks, want 1..%d", what,
				  (unsigned long long)nranks, PROTO_MAX_RANKS);
	l->ranks = calloc(nranks, sizeof(*l->ranks));
	if (l->ranks == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", what);
	l->nranks = (uint32_t)nranks;
	return 0;
}

/* Appends an empty local tensor to a rank; NULL on ENOMEM. */
static struct proto_local *rank_add_local(struct proto_rank *r, const char *name,
					  uint32_t concat_dim)
{
	struct proto_local *l;

	if ((r->nlocals & (r->nlocals - 1)) == 0) {
		size_t cap = r->nlocals ? 2 * (size_t)r->nlocals : 4;
		l = realloc(r->locals, cap * sizeof(*l));
		if (l == NULL)
			return NULL;
		r->locals = l;
	}
	l = &r->locals[r->nlocals];
	memset(l, 0, sizeof(*l));
	l->name = strdup(name);
	if (l->name == NULL)
		return NULL;
	l->concat_dim = concat_dim;
	r->nlocals++;
	return l;
}

static int local_add_piece(struct proto_local *l, const struct proto_piece *p)
{
	if ((l->npieces & (l->npieces - 1)) == 0) {
		size_t cap = l->npieces ? 2 * (size_t)l->npieces : 2;
		struct proto_piece *v = realloc(l->pieces, cap * sizeof(*v));
		if (v == NULL)
			return -ENOMEM;
		l->pieces = v;
	}
	l->pieces[l->npieces++] = *p;
	return 0;
}

static uint64_t piece_nelem(const struct proto_model *m, const struct proto_piece *p)
{
	if (p->flat)
		return p->box.hi[0] - p->box.lo[0];
	return proto_box_nelem(&p->box, m->tensors[p->tensor].ndim);
}

static bool pieces_overlap(const struct proto_model *m, const struct proto_piece *a,
			   const struct proto_piece *b)
{
	struct proto_box x;

	if (a->tensor != b->tensor)
		return false;
	if (a->flat)
		return a->box.lo[0] < b->box.hi[0] && b->box.lo[0] < a->box.hi[0];
	return proto_box_intersect(&a->box, &b->box, m->tensors[a->tensor].ndim, &x);
}

/*
 * Validates one local tensor and derives its dtype, shape, size and each
 * piece's base. `where` names it in errors ("file: ranks[1].tensors[2] (W)").
 */
static int local_finish(const struct proto_model *m, struct proto_local *l,
			const char *where, struct proto_err *err)
{
	const struct proto_tensor *t0;
	uint64_t cpos = 0;

	if (l->npieces == 0)
		return proto_errf(err, EINVAL, "%s: no pieces", where);
	t0 = &m->tensors[l->pieces[0].tensor];
	l->dtype = t0->dtype;
	l->ndim = l->pieces[0].flat ? 1 : t0->ndim;
	if (!l->pieces[0].flat && l->ndim > 0 && l->concat_dim >= l->ndim)
		return proto_errf(err, EINVAL, "%s.concat_dim: %u but the pieces have %u dims",
				  where, l->concat_dim, l->ndim);
	if (l->pieces[0].flat && l->concat_dim != 0)
		return proto_errf(err, EINVAL, "%s.concat_dim: flat pieces concatenate on dim 0",
				  where);
	if (l->ndim == 0 && l->npieces != 1)
		return proto_errf(err, EINVAL, "%s: a scalar local tensor holds one piece",
				  where);
	for (uint32_t i = 0; i < l->npieces; i++) {
		struct proto_piece *p = &l->pieces[i];
		const struct proto_tensor *t = &m->tensors[p->tensor];

		if (t->dtype != l->dtype)
			return proto_errf(err, EINVAL,
					  "%s.pieces[%u]: dtype %s of %s differs from %s of %s",
					  where, i, proto_dtype_name(t->dtype), t->name,
					  proto_dtype_name(l->dtype), t0->name);
		if (p->flat != l->pieces[0].flat)
			return proto_errf(err, EINVAL,
					  "%s.pieces[%u]: flat and box pieces cannot mix", where, i);
		if (!p->flat && t->ndim != l->ndim)
			return proto_errf(err, EINVAL,
					  "%s.pieces[%u]: %s has %u dims, the first piece %u",
					  where, i, t->name, t->ndim, l->ndim);
		for (uint32_t d = 0; !p->flat && d < l->ndim; d++) {
			uint64_t ext = p->box.hi[d] - p->box.lo[d];
			if (d == l->concat_dim)
				continue;
			if (i == 0)
				l->shape[d] = ext;
			else if (ext != l->shape[d])
				return proto_errf(err, EINVAL,
						  "%s.pieces[%u]: extent %llu on dim %u, the first piece has %llu",
						  where, i, (unsigned long long)ext, d,
						  (unsigned long long)l->shape[d]);
		}
		for (uint32_t j = 0; j < i; j++)
			if (pieces_overlap(m, &l->pieces[j], p))
				return proto_errf(err, EINVAL, "%s.pieces[%u] overlaps pieces[%u] of %s",
						  where, i, j, t->name);
	}
	/* Bases: concatenation offsets times the concat dim's stride. */
	uint64_t cstride = 1;
	for (uint32_t d = l->concat_dim + 1; !l->pieces[0].flat && d < l->ndim; d++)
		cstride *= l->shape[d];
	for (uint32_t i = 0; i < l->npieces; i++) {
		struct proto_piece *p = &l->pieces[i];
		if (p->flat) {
			p->base = cpos;
			cpos += p->box.hi[0] - p->box.lo[0];
		} else if (l->ndim == 0) {
			p->base = 0;
			cpos = 1;
		} else {
			p->base = cpos * cstride;
			cpos += p->box.hi[l->concat_dim] - p->box.lo[l->concat_dim];
		}
	}
	if (l->ndim > 0)
		l->shape[l->concat_dim] = cpos;
	l->nelem = 0;
	for (uint32_t i = 0; i < l->npieces; i++)
		l->nelem += piece_nelem(m, &l->pieces[i]);
	l->nbytes = l->nelem * proto_dtype_size(l->dtype);
	/* One piece concatenates with nothing: canonical form says dim 0, so
	 * equal layouts get equal digests however they were written. */
	if (l->npieces == 1)
		l->concat_dim = 0;
	return 0;
}

static json_t *rank_json(const struct proto_model *m, const struct proto_layout *l, uint32_t r);

/* Hashes what json_dumps(proto_layout_to_json(m, l), JSON_COMPACT |
 * JSON_SORT_KEYS) writes, a rank at a time: a layout of many ranks never
 * holds its whole JSON (tens of times its own size) at once. Keys sorted:
 * "quantize", "ranks", "transform". */
static int layout_digest(const struct proto_model *m, struct proto_layout *l, const char *what,
			 struct proto_err *err)
{
	crypto_generichash_state st;
	char *txt = NULL;
	json_t *j;

	crypto_generichash_init(&st, NULL, 0, sizeof(l->digest));
	if (l->model != NULL) {
		j = proto__layout_fp8_json(l);
		txt = j != NULL ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
		json_decref(j);
		if (txt == NULL)
			return proto_errf(err, ENOMEM, "%s: out of memory", what);
		crypto_generichash_update(&st, (const uint8_t *)"{\"quantize\":", 12);
		crypto_generichash_update(&st, (const uint8_t *)txt, strlen(txt));
		crypto_generichash_update(&st, (const uint8_t *)",\"ranks\":[", 10);
		free(txt);
	} else {
		crypto_generichash_update(&st, (const uint8_t *)"{\"ranks\":[", 10);
	}
	for (uint32_t r = 0; r < l->nranks; r++) {
		j = rank_json(m, l, r);
		txt = j != NULL ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
		json_decref(j);
		if (txt == NULL)
			return proto_errf(err, ENOMEM, "%s: out of memory", what);
		if (r > 0)
			crypto_generichash_update(&st, (const uint8_t *)",", 1);
		crypto_generichash_update(&st, (const uint8_t *)txt, strlen(txt));
		free(txt);
	}
	if (l->model != NULL) {
		static const char tail[] = "],\"transform\":\"" PROTO_FP8_TRANSFORM "\"}";
		crypto_generichash_update(&st, (const uint8_t *)tail, sizeof(tail) - 1);
	} else {
		crypto_generichash_update(&st, (const uint8_t *)"]}", 2);
	}
	crypto_generichash_final(&st, l->digest, sizeof(l->digest));
	return 0;
}

static const struct proto_layout *sort_layout_rank;
static uint32_t sort_rank;

static int cmp_local_name(const void *a, const void *b)
{
	const struct proto_rank *r = &sort_layout_rank->ranks[sort_rank];
	return strcmp(r->locals[*(const uint32_t *)a].name, r->locals[*(const uint32_t *)b].name);
}

/* Validates every local, checks names are unique per rank, assigns byte
 * offsets and the digest. */
static int layout_finish(const struct proto_model *m, struct proto_layout *l,
			 const char *what, struct proto_err *err)
{
	char where[PROTO_NAME_MAX + 256];
	int rc;

	for (uint32_t r = 0; r < l->nranks; r++) {
		struct proto_rank *rk = &l->ranks[r];
		uint64_t off = 0;
		uint32_t *idx;

		for (uint32_t i = 0; i < rk->nlocals; i++) {
			snprintf(where, sizeof(where), "%s: ranks[%u].tensors[%u] (%s)", what, r, i,
				 rk->locals[i].name);
			rc = local_finish(m, &rk->locals[i], where, err);
			if (rc != 0)
				return rc;
			rk->locals[i].offset = off;
			off += (rk->locals[i].nbytes + LOCAL_ALIGN - 1) / LOCAL_ALIGN * LOCAL_ALIGN;
		}
		rk->nbytes = off;
		idx = malloc((rk->nlocals + 1) * sizeof(*idx));
		if (idx == NULL)
			return proto_errf(err, ENOMEM, "%s: out of memory", what);
		for (uint32_t i = 0; i < rk->nlocals; i++)
			idx[i] = i;
		sort_layout_rank = l;
		sort_rank = r;
		qsort(idx, rk->nlocals, sizeof(*idx), cmp_local_name);
		for (uint32_t i = 1; i < rk->nlocals; i++) {
			if (strcmp(rk->locals[idx[i]].name, rk->locals[idx[i - 1]].name) == 0) {
				rc = proto_errf(err, EINVAL, "%s: ranks[%u]: local tensor name %s is used twice",
						what, r, rk->locals[idx[i]].name);
				free(idx);
				return rc;
			}
		}
		free(idx);
	}
	return layout_digest(m, l, what, err);
}

/* ---- explicit form ------------------------------------------------------ */

static int get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_piece(const struct proto_model *m, json_t *jp, const char *where,
		       struct proto_piece *p, struct proto_err *err)
{
	const char *tname = json_string_value(json_object_get(jp, "tensor"));
	json_t *box = json_object_get(jp, "box"), *flat = json_object_get(jp, "flat");
	const struct proto_tensor *t;
	int64_t ti;

	memset(p, 0, sizeof(*p));
	if (!json_is_object(jp))
		return proto_errf(err, EINVAL, "%s: must be an object", where);
	if (tname == NULL)
		return proto_errf(err, EINVAL, "%s.tensor: missing or not a string", where);
	ti = proto_model_find(m, tname);
	if (ti < 0)
		return proto_errf(err, EINVAL, "%s.tensor: %s is not in the model", where, tname);
	p->tensor = (uint32_t)ti;
	t = &m->tensors[ti];
	if ((box == NULL) == (flat == NULL))
		return proto_errf(err, EINVAL, "%s: needs exactly one of \"box\" and \"flat\"",
				  where);
	if (flat != NULL) {
		uint64_t s, e;
		if (!json_is_array(flat) || json_array_size(flat) != 2 ||
		    get_u64(json_array_get(flat, 0), &s) != 0 ||
		    get_u64(json_array_get(flat, 1), &e) != 0)
			return proto_errf(err, EINVAL, "%s.flat: want [start, end]", where);
		if (s >= e || e > t->nelem)
			return proto_errf(err, EINVAL,
					  "%s.flat: [%llu, %llu) is empty or outside %s's %llu elements",
					  where, (unsigned long long)s, (unsigned long long)e,
					  t->name, (unsigned long long)t->nelem);
		p->flat = true;
		p->box.lo[0] = s;
		p->box.hi[0] = e;
		return 0;
	}
	if (!json_is_array(box) || json_array_size(box) != t->ndim)
		return proto_errf(err, EINVAL, "%s.box: want %u [start, end] pairs for %s",
				  where, t->ndim, t->name);
	for (uint32_t d = 0; d < t->ndim; d++) {
		json_t *r = json_array_get(box, d);
		uint64_t lo, hi;
		if (!json_is_array(r) || json_array_size(r) != 2 ||
		    get_u64(json_array_get(r, 0), &lo) != 0 ||
		    get_u64(json_array_get(r, 1), &hi) != 0)
			return proto_errf(err, EINVAL, "%s.box[%u]: want [start, end]", where, d);
		if (lo >= hi || hi > t->shape[d])
			return proto_errf(err, EINVAL,
					  "%s.box[%u]: [%llu, %llu) is empty or outside %s's dim of %llu",
					  where, d, (unsigned long long)lo, (unsigned long long)hi,
					  t->name, (unsigned long long)t->shape[d]);
		p->box.lo[d] = lo;
		p->box.hi[d] = hi;
	}
	return 0;
}

/* Checks the optional "dtype" and "shape" a local tensor may declare. */
static int check_declared(json_t *jl, const struct proto_local *l, const char *where,
			  struct proto_err *err)
{
	json_t *dt = json_object_get(jl, "dtype"), *shape = json_object_get(jl, "shape");
	enum proto_dtype d;

	if (dt != NULL) {
		if (!json_is_string(dt) || proto_dtype_parse(json_string_value(dt), &d) != 0)
			return proto_errf(err, EINVAL, "%s.dtype: not a known dtype", where);
		if (d != l->dtype)
			return proto_errf(err, EINVAL, "%s.dtype: says %s but the pieces are %s",
					  where, proto_dtype_name(d), proto_dtype_name(l->dtype));
	}
	if (shape != NULL) {
		bool ok = json_is_array(shape) && json_array_size(shape) == l->ndim;
		for (uint32_t i = 0; ok && i < l->ndim; i++) {
			uint64_t v;
			ok = get_u64(json_array_get(shape, i), &v) == 0 && v == l->shape[i];
		}
		if (!ok) {
			char got[256];
			int n = 0;
			for (uint32_t i = 0; i < l->ndim && n < (int)sizeof(got) - 24; i++)
				n += snprintf(got + n, sizeof(got) - (size_t)n, "%s%llu", i ? "," : "",
					      (unsigned long long)l->shape[i]);
			if (n == 0)
				got[0] = 0;
			return proto_errf(err, EINVAL, "%s.shape: does not match the pieces' [%s]",
					  where, got);
		}
	}
	return 0;
}

static int parse_explicit(const struct proto_model *m, json_t *ranks, const char *what,
			  struct proto_layout *l, struct proto_err *err)
{
	char where[PROTO_NAME_MAX + 256], pwhere[PROTO_NAME_MAX + 300];
	int rc = layout_alloc_ranks(l, json_array_size(ranks), what, err);

	if (rc != 0)
		return rc;
	for (uint32_t r = 0; r < l->nranks; r++) {
		json_t *locals = json_object_get(json_array_get(ranks, r), "tensors");
		if (!json_is_array(locals))
			return proto_errf(err, EINVAL, "%s: ranks[%u].tensors must be an array", what, r);
		for (uint32_t i = 0; i < json_array_size(locals); i++) {
			json_t *jl = json_array_get(locals, i), *pieces = json_object_get(jl, "pieces");
			const char *name = json_string_value(json_object_get(jl, "name"));
			json_t *cd = json_object_get(jl, "concat_dim");
			uint64_t concat = 0;
			struct proto_local *lt;

			snprintf(where, sizeof(where), "%s: ranks[%u].tensors[%u]", what, r, i);
			if (name == NULL || name[0] == 0 || strlen(name) >= PROTO_NAME_MAX)
				return proto_errf(err, EINVAL, "%s.name: missing, empty or too long", where);
			snprintf(where, sizeof(where), "%s: ranks[%u].tensors[%u] (%s)", what, r, i, name);
			if (cd != NULL && (get_u64(cd, &concat) != 0 || concat >= PROTO_MAX_DIMS))
				return proto_errf(err, EINVAL, "%s.concat_dim: not a dimension", where);
			if (!json_is_array(pieces) || json_array_size(pieces) == 0)
				return proto_errf(err, EINVAL, "%s.pieces: must be a non-empty array", where);
			lt = rank_add_local(&l->ranks[r], name, (uint32_t)concat);
			if (lt == NULL)
				return proto_errf(err, ENOMEM, "%s: out of memory", what);
			for (uint32_t k = 0; k < json_array_size(pieces); k++) {
				struct proto_piece p;
				snprintf(pwhere, sizeof(pwhere), "%s.pieces[%u]", where, k);
				rc = parse_piece(m, json_array_get(pieces, k), pwhere, &p, err);
				if (rc != 0)
					return rc;
				if (local_add_piece(lt, &p) != 0)
					return proto_errf(err, ENOMEM, "%s: out of memory", what);
			}
			rc = local_finish(m, lt, where, err);
			if (rc == 0)
				rc = check_declared(jl, lt, where, err);
			if (rc != 0)
				return rc;
		}
	}
	return 0;
}

/* ---- shorthand form ----------------------------------------------------- */

/* torch.chunk: each rank ceil(n/P), the last ones shorter or empty. */
static void chunk_range(uint64_t n, uint32_t nranks, uint32_t r, uint64_t *lo, uint64_t *hi)
{
	uint64_t share = (n + nranks - 1) / nranks;
	*lo = PROTO_MIN(n, (uint64_t)r * share);
	*hi = PROTO_MIN(n, (uint64_t)(r + 1) * share);
}

static void full_box(const struct proto_tensor *t, struct proto_box *b)
{
	memset(b, 0, sizeof(*b));
	for (uint32_t d = 0; d < t->ndim; d++)
		b->hi[d] = t->shape[d];
}

/* Replaces the single '*' of tmpl with cap. */
static int subst(char *out, size_t len, const char *tmpl, const char *cap)
{
	const char *star = strchr(tmpl, '*');
	int n = star ? snprintf(out, len, "%.*s%s%s", (int)(star - tmpl), tmpl, cap, star + 1)
		     : snprintf(out, len, "%s", tmpl);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

struct rule_ctx {
	const struct proto_model *m;
	struct proto_layout *l;
	uint32_t nbase; /* tensors a rule may place (an FP8 layout's scales follow) */
	bool *placed;
	const char *where; /* "file: tensors[i]" */
	struct proto_err *err;
};

/* Places tensor ti (or the fused group names[]) by one rule, on every rank. */
static int apply_rule(struct rule_ctx *c, json_t *rule, const uint32_t *group, uint32_t ngroup,
		      const char *local_name)
{
	const struct proto_model *m = c->m;
	const struct proto_tensor *t0 = &m->tensors[group[0]];
	json_t *split = json_object_get(rule, "split"), *experts = json_object_get(rule, "experts");
	bool replicate = json_is_true(json_object_get(rule, "replicate"));
	bool flat = json_is_true(json_object_get(rule, "flat"));
	bool fuse = json_object_get(rule, "fuse") != NULL;
	uint64_t dim = 0, concat = 0;
	int kinds = (split != NULL) + (experts != NULL) + replicate + flat;

	if (kinds > 1 || (kinds == 0 && !fuse))
		return proto_errf(c->err, EINVAL,
				  "%s: needs exactly one of replicate, split, flat, experts", c->where);
	if (split != NULL && (get_u64(split, &dim) != 0 || dim >= PROTO_MAX_DIMS))
		return proto_errf(c->err, EINVAL, "%s.split: not a dimension", c->where);
	if (experts != NULL) {
		json_t *jd = json_object_get(rule, "dim");
		if (jd != NULL && (get_u64(jd, &dim) != 0 || dim >= PROTO_MAX_DIMS))
			return proto_errf(c->err, EINVAL, "%s.dim: not a dimension", c->where);
		if (!json_is_array(experts) || json_array_size(experts) != c->l->nranks)
			return proto_errf(c->err, EINVAL, "%s.experts: want one index list per rank (%u)",
					  c->where, c->l->nranks);
	}
	if (fuse && (flat || experts != NULL))
		return proto_errf(c->err, EINVAL, "%s: fuse goes with split or nothing", c->where);
	if (json_object_get(rule, "concat_dim") != NULL &&
	    (get_u64(json_object_get(rule, "concat_dim"), &concat) != 0 || concat >= PROTO_MAX_DIMS))
		return proto_errf(c->err, EINVAL, "%s.concat_dim: not a dimension", c->where);
	if (split != NULL || experts != NULL)
		concat = dim;
	for (uint32_t g = 0; g < ngroup; g++) {
		const struct proto_tensor *t = &m->tensors[group[g]];
		if ((split != NULL || experts != NULL) && dim >= t->ndim)
			return proto_errf(c->err, EINVAL, "%s: %s has %u dims, cannot split dim %llu",
					  c->where, t->name, t->ndim, (unsigned long long)dim);
	}
	for (uint32_t r = 0; r < c->l->nranks; r++) {
		struct proto_local *lt = NULL;
		for (uint32_t g = 0; g < ngroup; g++) {
			const struct proto_tensor *t = &m->tensors[group[g]];
			struct proto_piece p;
			uint64_t lo, hi;

			if (t->nelem == 0)
				continue;
			memset(&p, 0, sizeof(p));
			p.tensor = group[g];
			full_box(t, &p.box);
			if (flat) {
				chunk_range(t->nelem, c->l->nranks, r, &lo, &hi);
				if (lo == hi)
					continue;
				p.flat = true;
				memset(&p.box, 0, sizeof(p.box));
				p.box.lo[0] = lo;
				p.box.hi[0] = hi;
			} else if (split != NULL) {
				chunk_range(t->shape[dim], c->l->nranks, r, &lo, &hi);
				if (lo == hi)
					continue;
				p.box.lo[dim] = lo;
				p.box.hi[dim] = hi;
			}
			if (lt == NULL) {
				lt = rank_add_local(&c->l->ranks[r], local_name ? local_name : t0->name,
						    (uint32_t)concat);
				if (lt == NULL)
					return proto_errf(c->err, ENOMEM, "out of memory");
			}
			if (experts == NULL) {
				if (local_add_piece(lt, &p) != 0)
					return proto_errf(c->err, ENOMEM, "out of memory");
				continue;
			}
			json_t *list = json_array_get(experts, r);
			if (!json_is_array(list))
				return proto_errf(c->err, EINVAL, "%s.experts[%u]: not an array", c->where, r);
			/* Consecutive ascending indices become one piece. */
			for (size_t k = 0; k < json_array_size(list);) {
				uint64_t e, next;
				if (get_u64(json_array_get(list, k), &e) != 0 || e >= t->shape[dim])
					return proto_errf(c->err, EINVAL,
							  "%s.experts[%u][%zu]: not an index below %llu",
							  c->where, r, k, (unsigned long long)t->shape[dim]);
				size_t run = 1;
				while (k + run < json_array_size(list) &&
				       get_u64(json_array_get(list, k + run), &next) == 0 && next == e + run)
					run++;
				p.box.lo[dim] = e;
				p.box.hi[dim] = e + run;
				if (local_add_piece(lt, &p) != 0)
					return proto_errf(c->err, ENOMEM, "out of memory");
				k += run;
			}
			if (lt->npieces == 0) {
				/* An empty expert list: the rank holds none of it. */
				local_fini(lt);
				c->l->ranks[r].nlocals--;
				lt = NULL;
			}
		}
	}
	for (uint32_t g = 0; g < ngroup; g++)
		c->placed[group[g]] = true;
	return 0;
}

/* The text a one-'*' glob's star stands for in name; false if no match. */
static bool glob_capture(const char *pat, const char *name, char *cap, size_t len)
{
	const char *star = strchr(pat, '*');
	size_t pre, post, n = strlen(name);

	if (star == NULL || strchr(star + 1, '*') != NULL)
		return false;
	pre = (size_t)(star - pat);
	post = strlen(star + 1);
	if (n < pre + post || strncmp(name, pat, pre) != 0 ||
	    strcmp(name + n - post, star + 1) != 0 || n - pre - post >= len)
		return false;
	memcpy(cap, name + pre, n - pre - post);
	cap[n - pre - post] = 0;
	return true;
}

static int apply_fuse(struct rule_ctx *c, json_t *rule, uint32_t ti, const char *pat)
{
	json_t *fuse = json_object_get(rule, "fuse");
	const char *ntmpl = json_string_value(json_object_get(rule, "name"));
	char cap[PROTO_NAME_MAX] = "", name[PROTO_NAME_MAX], local[PROTO_NAME_MAX];
	uint32_t group[16];
	size_t n = json_array_size(fuse);

	if (!json_is_array(fuse) || n == 0 || n > PROTO_ARRAY_LEN(group))
		return proto_errf(c->err, EINVAL, "%s.fuse: want 1..16 tensor names", c->where);
	if (ntmpl == NULL)
		return proto_errf(c->err, EINVAL, "%s.name: a fused local tensor needs a name",
				  c->where);
	if (pat != NULL && strchr(pat, '*') != NULL &&
	    !glob_capture(pat, c->m->tensors[ti].name, cap, sizeof(cap)))
		return proto_errf(c->err, EINVAL, "%s.match: a fuse rule's pattern has at most one '*'",
				  c->where);
	for (size_t k = 0; k < n; k++) {
		const char *tmpl = json_string_value(json_array_get(fuse, k));
		int64_t idx;
		if (tmpl == NULL || subst(name, sizeof(name), tmpl, cap) != 0)
			return proto_errf(c->err, EINVAL, "%s.fuse[%zu]: not a tensor name", c->where, k);
		idx = proto_model_find(c->m, name);
		if (idx < 0 || idx >= c->nbase)
			return proto_errf(c->err, EINVAL, "%s.fuse[%zu]: %s is not in the model",
					  c->where, k, name);
		if (c->placed[idx])
			return proto_errf(c->err, EINVAL, "%s.fuse[%zu]: %s is already placed",
					  c->where, k, name);
		group[k] = (uint32_t)idx;
	}
	if (subst(local, sizeof(local), ntmpl, cap) != 0)
		return proto_errf(c->err, EINVAL, "%s.name: too long", c->where);
	return apply_rule(c, rule, group, (uint32_t)n, local);
}

static int parse_shorthand(const struct proto_model *m, json_t *root, const char *what,
			   struct proto_layout *l, struct proto_err *err)
{
	json_t *rules = json_object_get(root, "tensors");
	char where[512];
	uint64_t nranks;
	struct rule_ctx c = {.m = m, .l = l, .nbase = l->nbase, .where = where, .err = err};
	int rc;

	if (get_u64(json_object_get(root, "ranks"), &nranks) != 0)
		return proto_errf(err, EINVAL, "%s: ranks must be a count or an array", what);
	rc = layout_alloc_ranks(l, nranks, what, err);
	if (rc != 0)
		return rc;
	if (!json_is_array(rules))
		return proto_errf(err, EINVAL, "%s: tensors must be an array of rules", what);
	c.placed = calloc(m->ntensors + 1, sizeof(*c.placed));
	if (c.placed == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", what);
	for (size_t i = 0; i < json_array_size(rules); i++) {
		json_t *rule = json_array_get(rules, i);
		const char *exact = json_string_value(json_object_get(rule, "tensor"));
		const char *pat = json_string_value(json_object_get(rule, "match"));
		bool fuse = json_object_get(rule, "fuse") != NULL;

		snprintf(where, sizeof(where), "%s: tensors[%zu]", what, i);
		if (!json_is_object(rule) || (exact == NULL) == (pat == NULL)) {
			rc = proto_errf(err, EINVAL, "%s: needs exactly one of \"tensor\" and \"match\"",
					where);
			goto out;
		}
		if (exact != NULL) {
			int64_t ti = proto_model_find(m, exact);
			if (ti < 0 || ti >= c.nbase) {
				rc = proto_errf(err, EINVAL, "%s.tensor: %s is not in the model", where, exact);
				goto out;
			}
			if (c.placed[ti])
				continue;
			uint32_t g = (uint32_t)ti;
			rc = fuse ? apply_fuse(&c, rule, g, NULL) : apply_rule(&c, rule, &g, 1, NULL);
			if (rc != 0)
				goto out;
			continue;
		}
		for (uint32_t ti = 0; ti < c.nbase; ti++) {
			if (c.placed[ti] || fnmatch(pat, m->tensors[ti].name, 0) != 0)
				continue;
			rc = fuse ? apply_fuse(&c, rule, ti, pat) : apply_rule(&c, rule, &ti, 1, NULL);
			if (rc != 0)
				goto out;
		}
	}
	for (uint32_t ti = 0; ti < c.nbase; ti++) {
		if (!c.placed[ti] && m->tensors[ti].nelem > 0) {
			rc = proto_errf(err, EINVAL, "%s: tensor %s is placed by no rule", what,
					m->tensors[ti].name);
			goto out;
		}
	}
	rc = 0;
out:
	free(c.placed);
	return rc;
}

/* ---- entry points ------------------------------------------------------- */

int proto_layout_from_json(const struct proto_model *m, json_t *root, const char *what,
			   struct proto_layout *out, struct proto_err *err)
{
	json_t *ranks = json_object_get(root, "ranks");
	int rc;

	memset(out, 0, sizeof(*out));
	if (!json_is_object(root))
		return proto_errf(err, EINVAL, "%s: a layout must be a JSON object", what);
	rc = proto__layout_fp8_model(m, root, what, out, err);
	m = proto_layout_model(m, out);
	if (rc == 0 && json_is_array(ranks))
		rc = parse_explicit(m, ranks, what, out, err);
	else if (rc == 0 && json_is_integer(ranks))
		rc = parse_shorthand(m, root, what, out, err);
	else if (rc == 0)
		rc = proto_errf(err, EINVAL, "%s: ranks must be a count or an array", what);
	if (rc == 0)
		rc = proto__layout_fp8_scales(out, what, err);
	if (rc == 0)
		rc = layout_finish(m, out, what, err);
	if (rc != 0)
		proto_layout_fini(out);
	return rc;
}

int proto_layout_parse(const struct proto_model *m, const char *json, size_t len,
		       const char *what, struct proto_layout *out, struct proto_err *err)
{
	json_error_t jerr;
	json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	int rc;

	memset(out, 0, sizeof(*out));
	if (root == NULL)
		return proto_errf(err, EINVAL, "%s: line %d: %s", what, jerr.line, jerr.text);
	rc = proto_layout_from_json(m, root, what, out, err);
	json_decref(root);
	return rc;
}

int proto_layout_load(const struct proto_model *m, const char *path,
		      struct proto_layout *out, struct proto_err *err)
{
	uint8_t *buf;
	size_t len;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = proto_read_file(path, proto_param(PROTO_PARAM_SPEC_MAX), &buf, &len, err);
	if (rc != 0)
		return rc;
	rc = proto_layout_parse(m, (const char *)buf, len, path, out, err);
	free(buf);
	return rc;
}

static json_t *box_json(const struct proto_box *b, uint32_t ndim)
{
	json_t *a = json_array();
	for (uint32_t d = 0; d < ndim; d++)
		json_array_append_new(a, json_pack("[I,I]", (json_int_t)b->lo[d], (json_int_t)b->hi[d]));
	return a;
}

/* Rank r's element of the explicit form: {"tensors": [...]}. m: l's model. */
static json_t *rank_json(const struct proto_model *m, const struct proto_layout *l, uint32_t r)
{
	json_t *locals = json_array();
	for (uint32_t i = 0; i < l->ranks[r].nlocals; i++) {
		const struct proto_local *lt = &l->ranks[r].locals[i];
		json_t *pieces, *shape;
		if (lt->scales)
			continue; /* derived from the local before */
		pieces = json_array();
		shape = json_array();
		for (uint32_t k = 0; k < lt->npieces; k++) {
			const struct proto_piece *p = &lt->pieces[k];
			const char *tn = m->tensors[p->tensor].name;
			json_array_append_new(
				pieces, p->flat ? json_pack("{s:s,s:[I,I]}", "tensor", tn, "flat",
							    (json_int_t)p->box.lo[0],
							    (json_int_t)p->box.hi[0])
						: json_pack("{s:s,s:o}", "tensor", tn, "box",
							    box_json(&p->box, m->tensors[p->tensor].ndim)));
		}
		for (uint32_t d = 0; d < lt->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)lt->shape[d]));
		json_array_append_new(locals, json_pack("{s:s,s:i,s:s,s:o,s:o}", "name", lt->name,
							"concat_dim", (int)lt->concat_dim, "dtype",
							proto_dtype_name(lt->dtype), "shape", shape,
							"pieces", pieces));
	}
	return json_pack("{s:o}", "tensors", locals);
}

json_t *proto_layout_to_json(const struct proto_model *m, const struct proto_layout *l)
{
	json_t *ranks = json_array();

	m = proto_layout_model(m, l);
	for (uint32_t r = 0; r < l->nranks; r++)
		json_array_append_new(ranks, rank_json(m, l, r));
	if (l->model != NULL)
		return json_pack("{s:o,s:s,s:o}", "ranks", ranks, "transform", PROTO_FP8_TRANSFORM,
				 "quantize", proto__layout_fp8_json(l));
	return json_pack("{s:o}", "ranks", ranks);
}

/* ---- completeness ------------------------------------------------------- */

int proto_layout_check_complete(const struct proto_model *m, const struct proto_layout *l,
				struct proto_err *err)
{
	struct proto_boxes unc = {0}, next = {0}, pb = {0};
	int rc = 0;

	m = proto_layout_model(m, l);
	for (uint32_t ti = 0; ti < m->ntensors && rc == 0; ti++) {
		const struct proto_tensor *t = &m->tensors[ti];
		struct proto_box full;

		if (t->nelem == 0)
			continue;
		full_box(t, &full);
		unc.n = 0;
		if (proto_boxes_push(&unc, &full) != 0) {
			rc = -ENOMEM;
			break;
		}
		for (uint32_t r = 0; r < l->nranks && unc.n > 0 && rc == 0; r++) {
			for (uint32_t i = 0; i < l->ranks[r].nlocals && unc.n > 0 && rc == 0; i++) {
				const struct proto_local *lt = &l->ranks[r].locals[i];
				for (uint32_t k = 0; k < lt->npieces && unc.n > 0 && rc == 0; k++) {
					if (lt->pieces[k].tensor != ti)
						continue;
					pb.n = 0;
					rc = proto_piece_boxes(m, &lt->pieces[k], &pb);
					for (uint32_t b = 0; b < pb.n && rc == 0; b++)
						rc = proto_boxes_cut(&unc, &pb.v[b], t->ndim, &next, NULL, NULL);
				}
			}
		}
		if (rc == 0 && unc.n > 0) {
			char box[256];
			proto_box_str(box, sizeof(box), &unc.v[0], t->ndim);
			rc = proto_errf(err, EINVAL, "layout does not cover the model: %s elements %s are held by no rank",
					t->name, box);
		}
	}
	if (rc == -ENOMEM)
		proto_errf(err, ENOMEM, "out of memory");
	proto_boxes_fini(&unc);
	proto_boxes_fini(&next);
	proto_boxes_fini(&pb);
	return rc;
}

/* ---- built-ins ---------------------------------------------------------- */

static const char tp_rules[] =
	"[{\"match\":\"*.self_attn.q_proj.weight\",\"fuse\":[\"*.self_attn.q_proj.weight\","
	"\"*.self_attn.k_proj.weight\",\"*.self_attn.v_proj.weight\"],"
	"\"name\":\"*.self_attn.qkv_proj.weight\",\"split\":0},"
	"{\"match\":\"*.mlp.gate_proj.weight\",\"fuse\":[\"*.mlp.gate_proj.weight\","
	"\"*.mlp.up_proj.weight\"],\"name\":\"*.mlp.gate_up_proj.weight\",\"split\":0},"
	"{\"match\":\"*.o_proj.weight\",\"split\":1},"
	"{\"match\":\"*.down_proj.weight\",\"split\":1},"
	"{\"match\":\"*embed_tokens.weight\",\"split\":0},"
	"{\"match\":\"lm_head.weight\",\"split\":0},"
	"{\"match\":\"*\",\"replicate\":true}]";

/* "tpN" or "fsdpN", and whether ":fp8" follows (tpN only). */
static int builtin_split(const char *name, uint64_t *ranks, bool *fp8, struct proto_err *err)
{
	char base[32];
	const char *colon = strchr(name, ':');
	size_t len = colon != NULL ? (size_t)(colon - name) : strlen(name);
	uint64_t n;

	*fp8 = colon != NULL && strcmp(colon, ":fp8") == 0 && strncmp(name, "tp", 2) == 0;
	if (len >= sizeof(base) || (colon != NULL && !*fp8))
		goto bad;
	memcpy(base, name, len);
	base[len] = 0;
	if (!(strncmp(base, "tp", 2) == 0 && proto_parse_u64(base + 2, 1, 4096, &n) == 0) &&
	    !(strncmp(base, "fsdp", 4) == 0 && proto_parse_u64(base + 4, 1, 65536, &n) == 0))
		goto bad;
	*ranks = n;
	return 0;
bad:
	return proto_errf(err, EINVAL,
			  "layout %s: not a built-in (tpN, tpN:fp8 or fsdpN) nor a layout file", name);
}

int proto_layout_builtin_parse(const char *name, uint64_t *ranks, struct proto_err *err)
{
	uint64_t n;
	bool fp8;
	int rc = builtin_split(name, &n, &fp8, err);

	if (rc == 0 && ranks != NULL)
		*ranks = n;
	return rc;
}

int proto_layout_builtin(const struct proto_model *m, const char *name,
			 struct proto_layout *out, struct proto_err *err)
{
	uint64_t n;
	bool fp8;
	json_t *root, *rules;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = builtin_split(name, &n, &fp8, err)) != 0)
		return rc;
	if (name[0] == 't')
		rules = json_loads(tp_rules, 0, NULL);
	else
		rules = json_pack("[{s:s,s:i}]", "match", "*", "split", 0);
	root = json_pack("{s:I,s:o}", "ranks", (json_int_t)n, "tensors", rules);
	if (root != NULL && fp8 && json_object_set_new(root, "transform", json_string(PROTO_FP8_TRANSFORM)) != 0) {
		json_decref(root);
		root = NULL;
	}
	if (root == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	rc = proto_layout_from_json(m, root, name, out, err);
	json_decref(root);
	return rc;
}

bool proto_layout_arg_is_file(const char *arg)
{
	struct stat st;
	size_t len = strlen(arg);

	return stat(arg, &st) == 0 || strchr(arg, '/') != NULL ||
	       (len > 5 && strcmp(arg + len - 5, ".json") == 0);
}

int proto_layout_open(const struct proto_model *m, const char *arg, struct proto_layout *out,
		      struct proto_err *err)
{
	return proto_layout_arg_is_file(arg) ? proto_layout_load(m, arg, out, err)
					     : proto_layout_builtin(m, arg, out, err);
}

uint64_t proto_local_elem_offset(const struct proto_model *m, const struct proto_local *l,
				 const struct proto_piece *p, const uint64_t *coord)
{
	const struct proto_tensor *t = &m->tensors[p->tensor];
	uint64_t off = 0;

	if (p->flat) {
		for (uint32_t d = 0; d < t->ndim; d++)
			off = off * t->shape[d] + coord[d];
		return p->base + off - p->box.lo[0];
	}
	for (uint32_t d = 0; d < l->ndim; d++)
		off = off * l->shape[d] + (coord[d] - p->box.lo[d]);
	return p->base + off;
}

void proto_layout_walk_rank(const struct proto_model *m, const struct proto_layout *l,
			    uint32_t rank, int64_t only, proto_layout_walk_fn fn, void *arg)
{
	const struct proto_rank *rk = &l->ranks[rank];
	struct proto_boxes bx = {0};

	m = proto_layout_model(m, l);
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct proto_local *lt = &rk->locals[i];
		size_t es = proto_dtype_size(lt->dtype);
		for (uint32_t k = 0; k < lt->npieces; k++) {
			const struct proto_piece *p = &lt->pieces[k];
			const struct proto_tensor *t = &m->tensors[p->tensor];
			uint32_t n = t->ndim;
			uint64_t x[PROTO_MAX_DIMS];

			if (only >= 0 && p->tensor != (uint64_t)only)
				continue;
			/* Each box, walked in runs along its last dimension: those
			 * are contiguous in the logical tensor and in the local. */
			bx.n = 0;
			if (p->flat)
				proto_flat_to_boxes(t->shape, n, p->box.lo[0], p->box.hi[0], &bx);
			else
				proto_boxes_push(&bx, &p->box);
			for (uint32_t b = 0; b < bx.n; b++) {
				const struct proto_box *bb = &bx.v[b];
				uint64_t run = n ? bb->hi[n - 1] - bb->lo[n - 1] : 1;
				for (uint32_t d = 0; d < n; d++)
					x[d] = bb->lo[d];
				for (;;) {
					uint64_t flat = 0;
					for (uint32_t d = 0; d < n; d++)
						flat = flat * t->shape[d] + x[d];
					fn(arg, p->tensor, flat, run,
					   lt->offset + proto_local_elem_offset(m, lt, p, x) * es);
					uint32_t d = n ? n - 1 : 0;
					bool done = true;
					while (d > 0) {
						d--;
						if (++x[d] < bb->hi[d]) {
							done = false;
							break;
						}
						x[d] = bb->lo[d];
					}
					if (done)
						break;
				}
			}
		}
	}
	proto_boxes_fini(&bx);
}

struct fill {
	proto_tensor_source source;
	void *arg;
	uint8_t *block;
};

static void fill_run(void *arg, uint32_t tensor, uint64_t first, uint64_t count, uint64_t at)
{
	struct fill *f = arg;
	f->source(f->arg, tensor, first, count, f->block + at);
}

void proto_layout_fill_rank(const struct proto_model *m, const struct proto_layout *l,
			    uint32_t rank, proto_tensor_source source, void *arg, uint8_t *block)
{
	struct fill f = {.source = source, .arg = arg, .block = block};

	memset(block, 0, l->ranks[rank].nbytes);
	proto_layout_walk_rank(m, l, rank, -1, fill_run, &f);
}
