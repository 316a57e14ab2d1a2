/* FP8 serving layouts as parsed: the transformed model, the scale locals,
 * the checks on splits (their quantized source: proto/fp8_source.c). */
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/fp8.h"
#include "proto/layout_fp8.h"
#include "proto/spec.h"

#define QUANTIZE_MAX 1024 /* entries of "quantize" */
#define SCALE_SUFFIX "_scale_inv"

static bool is_glob(const char *s)
{
	return strpbrk(s, "*?[") != NULL;
}

static bool quantizable(const struct proto_tensor *t)
{
	return t->dtype == PROTO_DT_BF16 && t->ndim == 2 && t->nelem > 0;
}

/* Marks in q the tensors "quantize" names (default: the projections). */
static int pick(const struct proto_model *m, json_t *list, const char *what, bool *q,
		struct proto_err *err)
{
	static const char *const dflt[] = {"*_proj.weight"};
	size_t n = list != NULL ? json_array_size(list) : 1;

	if (list != NULL && (!json_is_array(list) || n == 0 || n > QUANTIZE_MAX))
		return proto_errf(err, EINVAL, "%s.quantize: want 1..%d tensor names or globs", what,
				  QUANTIZE_MAX);
	for (size_t i = 0; i < n; i++) {
		const char *s = list != NULL ? json_string_value(json_array_get(list, i)) : dflt[0];
		if (s == NULL || s[0] == 0 || strlen(s) >= PROTO_NAME_MAX)
			return proto_errf(err, EINVAL, "%s.quantize[%zu]: not a tensor name", what, i);
		if (!is_glob(s)) {
			int64_t t = proto_model_find(m, s);
			if (t < 0)
				return proto_errf(err, EINVAL, "%s.quantize[%zu]: %s is not in the model",
						  what, i, s);
			if (!quantizable(&m->tensors[t]))
				return proto_errf(err, EINVAL,
						  "%s.quantize[%zu]: %s is %s with %u dims; "
						  PROTO_FP8_TRANSFORM " takes 2-D bf16 tensors",
						  what, i, s, proto_dtype_name(m->tensors[t].dtype),
						  m->tensors[t].ndim);
			q[t] = true;
			continue;
		}
		bool any = false;
		for (uint32_t t = 0; t < m->ntensors; t++)
			if (quantizable(&m->tensors[t]) && fnmatch(s, m->tensors[t].name, 0) == 0)
				any = q[t] = true;
		/* A typo is not quietly a smaller set (the default's own
		 * pattern may match nothing: then no tensor is, below). */
		if (!any && list != NULL)
			return proto_errf(err, EINVAL, "%s.quantize[%zu]: %s matches none of the model's "
					  "2-D bf16 tensors", what, i, s);
	}
	return 0;
}

int proto__layout_fp8_model(const struct proto_model *m, json_t *root, const char *what,
			    struct proto_layout *l, struct proto_err *err)
{
	json_t *tr = json_object_get(root, "transform"), *list = json_object_get(root, "quantize");
	struct proto_model *m8;
	bool *q;
	uint32_t nq = 0;
	int rc;

	l->nbase = m->ntensors;
	if (tr == NULL && list == NULL)
		return 0;
	/* A misspelt key would quietly serve other tensors than asked. */
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (strcmp(key, "ranks") != 0 && strcmp(key, "tensors") != 0 &&
		    strcmp(key, "transform") != 0 && strcmp(key, "quantize") != 0)
			return proto_errf(err, EINVAL, "%s.%s: not a layout key (ranks, tensors, "
					  "transform, quantize)", what, key);
	}
	if (tr == NULL)
		return proto_errf(err, EINVAL, "%s.quantize: goes with \"transform\": \"" PROTO_FP8_TRANSFORM "\"",
				  what);
	if (!json_is_string(tr) || strcmp(json_string_value(tr), PROTO_FP8_TRANSFORM) != 0)
		return proto_errf(err, EINVAL, "%s.transform: the only one is \"" PROTO_FP8_TRANSFORM "\"",
				  what);
	q = calloc(m->ntensors + 1, sizeof(*q));
	m8 = calloc(1, sizeof(*m8));
	if (q == NULL || m8 == NULL) {
		free(q);
		free(m8);
		return proto_errf(err, ENOMEM, "%s: out of memory", what);
	}
	proto_model_init(m8);
	if ((rc = pick(m, list, what, q, err)) != 0)
		goto out;
	for (uint32_t t = 0; t < m->ntensors && rc == 0; t++) {
		const struct proto_tensor *x = &m->tensors[t];
		nq += q[t];
		rc = proto_model_add(m8, x->name, q[t] ? PROTO_DT_FP8_E4M3 : x->dtype, x->ndim,
				     x->shape, err);
	}
	if (rc == 0 && nq == 0)
		rc = proto_errf(err, EINVAL, "%s: " PROTO_FP8_TRANSFORM " quantizes no tensor "
				"(quantize names none of the model's 2-D bf16 tensors)", what);
	for (uint32_t t = 0; t < m->ntensors && rc == 0; t++) {
		char name[PROTO_NAME_MAX + sizeof(SCALE_SUFFIX)];
		const struct proto_tensor *x = &m->tensors[t];
		uint64_t shape[2] = {proto_fp8_blocks(x->shape[0]), proto_fp8_blocks(x->shape[1])};
		if (!q[t])
			continue;
		snprintf(name, sizeof(name), "%s" SCALE_SUFFIX, x->name);
		if (proto_model_find(m, name) >= 0)
			rc = proto_errf(err, EINVAL, "%s: cannot quantize %s: the model has a tensor %s already",
					what, x->name, name);
		else
			rc = proto_model_add(m8, name, PROTO_DT_FP32, 2, shape, err);
	}
	if (rc == 0)
		rc = proto_model_finish(m8, err);
	if (rc == 0) {
		l->model = m8;
		m8 = NULL;
	}
out:
	if (m8 != NULL) {
		proto_model_fini(m8);
		free(m8);
	}
	free(q);
	return rc;
}

/* The scale tensor of tensor t of l's model, or -1: t is not quantized. */
static int64_t scale_of(const struct proto_layout *l, uint32_t t)
{
	char name[PROTO_NAME_MAX + sizeof(SCALE_SUFFIX)];
	int64_t s;

	if (l->model == NULL || t >= l->nbase)
		return -1;
	snprintf(name, sizeof(name), "%s" SCALE_SUFFIX, l->model->tensors[t].name);
	s = proto_model_find(l->model, name);
	return s >= (int64_t)l->nbase ? s : -1;
}

/* Whether a piece of a quantized tensor splits it on block edges; else
 * says which split cuts a block. */
static int check_piece(const struct proto_layout *l, const struct proto_local *lt, uint32_t k,
		       const char *where, struct proto_err *err)
{
	const struct proto_piece *p = &lt->pieces[k];
	const struct proto_tensor *t = &l->model->tensors[p->tensor];

	if (p->flat)
		return proto_errf(err, EINVAL,
				  "%s: %s is split flat; " PROTO_FP8_TRANSFORM " needs box splits on "
				  "multiples of 128", where, t->name);
	for (uint32_t d = 0; d < 2; d++) {
		uint64_t lo = p->box.lo[d], hi = p->box.hi[d];
		bool last = k + 1 == lt->npieces || d != lt->concat_dim;
		if (lo % PROTO_FP8_BLOCK == 0 && hi == t->shape[d] && hi % PROTO_FP8_BLOCK != 0 && !last)
			return proto_errf(err, EINVAL,
					  "%s: %s ends on a partial 128-block (%llu on dim %u) and more "
					  "tensors are fused after it: the fused tensor's blocks would mix "
					  "two tensors; serve it unfused (a layout file without that fuse "
					  "rule) or leave it out of \"quantize\"",
					  where, t->name, (unsigned long long)t->shape[d], d);
		if (lo % PROTO_FP8_BLOCK != 0 || (hi % PROTO_FP8_BLOCK != 0 && !(last && hi == t->shape[d])))
			return proto_errf(err, EINVAL,
					  "%s: %s split [%llu, %llu) on dim %u (of %llu) cuts a 128-block; "
					  PROTO_FP8_TRANSFORM " needs splits on multiples of 128 (fewer "
					  "ranks, that tensor replicated, or left out of \"quantize\")",
					  where, t->name, (unsigned long long)lo, (unsigned long long)hi, d,
					  (unsigned long long)t->shape[d]);
	}
	return 0;
}

/* The scale local of quantized local lt (name and pieces; finished later). */
static int scale_local(const struct proto_layout *l, const struct proto_local *lt,
		       struct proto_local *out, struct proto_err *err)
{
	char name[PROTO_NAME_MAX + sizeof(SCALE_SUFFIX)];

	memset(out, 0, sizeof(*out));
	snprintf(name, sizeof(name), "%s" SCALE_SUFFIX, lt->name);
	if (strlen(name) >= PROTO_NAME_MAX)
		return proto_errf(err, EINVAL, "%s: the name of its scales is too long", lt->name);
	out->name = strdup(name);
	out->pieces = calloc(lt->npieces, sizeof(*out->pieces));
	if (out->name == NULL || out->pieces == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	out->concat_dim = lt->concat_dim;
	out->scales = true;
	out->npieces = lt->npieces;
	for (uint32_t k = 0; k < lt->npieces; k++) {
		const struct proto_piece *p = &lt->pieces[k];
		struct proto_piece *s = &out->pieces[k];
		s->tensor = (uint32_t)scale_of(l, p->tensor);
		for (uint32_t d = 0; d < 2; d++) {
			s->box.lo[d] = p->box.lo[d] / PROTO_FP8_BLOCK;
			s->box.hi[d] = proto_fp8_blocks(p->box.hi[d]);
		}
	}
	return 0;
}

int proto__layout_fp8_scales(struct proto_layout *l, const char *what, struct proto_err *err)
{
	char where[PROTO_NAME_MAX + 256];

	for (uint32_t r = 0; r < l->nranks && l->model != NULL; r++) {
		struct proto_rank *rk = &l->ranks[r];
		uint32_t nq = 0, n = 0;
		struct proto_local *v;

		for (uint32_t i = 0; i < rk->nlocals; i++) {
			const struct proto_local *lt = &rk->locals[i];
			bool q = lt->npieces > 0 && scale_of(l, lt->pieces[0].tensor) >= 0;
			snprintf(where, sizeof(where), "%s: ranks[%u].tensors[%u] (%s)", what, r, i, lt->name);
			for (uint32_t k = 0; k < lt->npieces; k++) {
				if (lt->pieces[k].tensor >= l->nbase)
					return proto_errf(err, EINVAL,
							  "%s: %s is derived (scales follow their tensor), "
							  "a layout does not place it", where,
							  l->model->tensors[lt->pieces[k].tensor].name);
				if ((scale_of(l, lt->pieces[k].tensor) >= 0) != q)
					return proto_errf(err, EINVAL,
							  "%s: joins %s (%s) and %s (%s); quantize both or "
							  "neither", where,
							  l->model->tensors[lt->pieces[0].tensor].name,
							  q ? "quantized" : "not quantized",
							  l->model->tensors[lt->pieces[k].tensor].name,
							  q ? "not quantized" : "quantized");
				if (q && check_piece(l, lt, k, where, err) != 0)
					return -EINVAL;
			}
			nq += q;
		}
		v = calloc((size_t)rk->nlocals + nq + 1, sizeof(*v));
		if (v == NULL)
			return proto_errf(err, ENOMEM, "%s: out of memory", what);
		for (uint32_t i = 0; i < rk->nlocals; i++) {
			const struct proto_local *lt = &rk->locals[i];
			v[n++] = *lt;
			if (lt->npieces > 0 && scale_of(l, lt->pieces[0].tensor) >= 0 &&
			    scale_local(l, lt, &v[n++], err) != 0) {
				/* The locals moved to v are rk's still: free only v's own. */
				free(v[n - 1].name);
				free(v[n - 1].pieces);
				free(v);
				return -ENOMEM;
			}
		}
		free(rk->locals);
		rk->locals = v;
		rk->nlocals = n;
	}
	return 0;
}

json_t *proto__layout_fp8_json(const struct proto_layout *l)
{
	json_t *names = json_array();

	for (uint32_t t = 0; t < l->nbase && names != NULL; t++)
		if (scale_of(l, t) >= 0)
			json_array_append_new(names, json_string(l->model->tensors[t].name));
	return names;
}
