/* Model specs: dtypes, logical tensors, parsing and the canonical digest. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/params.h"
#include "proto/spec.h"

static const struct {
	const char *name, *st_name;
	size_t size;
} dtypes[PROTO_DT_COUNT] = {
	[PROTO_DT_BF16] = {"bf16", "BF16", 2},
	[PROTO_DT_FP16] = {"fp16", "F16", 2},
	[PROTO_DT_FP32] = {"fp32", "F32", 4},
	[PROTO_DT_FP64] = {"fp64", "F64", 8},
	[PROTO_DT_FP8_E4M3] = {"fp8_e4m3", "F8_E4M3", 1},
	[PROTO_DT_FP8_E5M2] = {"fp8_e5m2", "F8_E5M2", 1},
	[PROTO_DT_BOOL] = {"bool", "BOOL", 1},
	[PROTO_DT_U8] = {"u8", "U8", 1},
	[PROTO_DT_I8] = {"i8", "I8", 1},
	[PROTO_DT_U16] = {"u16", "U16", 2},
	[PROTO_DT_I16] = {"i16", "I16", 2},
	[PROTO_DT_U32] = {"u32", "U32", 4},
	[PROTO_DT_I32] = {"i32", "I32", 4},
	[PROTO_DT_U64] = {"u64", "U64", 8},
	[PROTO_DT_I64] = {"i64", "I64", 8},
};

const char *proto_dtype_name(enum proto_dtype dt)
{
	return (unsigned)dt < PROTO_DT_COUNT ? dtypes[dt].name : "?";
}

const char *proto_dtype_st_name(enum proto_dtype dt)
{
	return (unsigned)dt < PROTO_DT_COUNT ? dtypes[dt].st_name : "?";
}

size_t proto_dtype_size(enum proto_dtype dt)
{
	return (unsigned)dt < PROTO_DT_COUNT ? dtypes[dt].size : 0;
}

int proto_dtype_parse(const char *s, enum proto_dtype *out)
{
	for (int i = 0; i < PROTO_DT_COUNT; i++) {
		if (strcmp(s, dtypes[i].name) == 0 || strcmp(s, dtypes[i].st_name) == 0) {
			*out = (enum proto_dtype)i;
			return 0;
		}
	}
	/* Common aliases. */
	static const struct {
		const char *alias;
		enum proto_dtype dt;
	} aliases[] = {{"f16", PROTO_DT_FP16}, {"f32", PROTO_DT_FP32},
		       {"f64", PROTO_DT_FP64}, {"float16", PROTO_DT_FP16},
		       {"float32", PROTO_DT_FP32}, {"bfloat16", PROTO_DT_BF16}};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(aliases); i++) {
		if (strcmp(s, aliases[i].alias) == 0) {
			*out = aliases[i].dt;
			return 0;
		}
	}
	return -EINVAL;
}

void proto_model_init(struct proto_model *m)
{
	memset(m, 0, sizeof(*m));
}

void proto_model_fini(struct proto_model *m)
{
	for (uint32_t i = 0; i < m->ntensors; i++)
		free(m->tensors[i].name);
	free(m->tensors);
	free(m->sorted);
	memset(m, 0, sizeof(*m));
}

int proto_model_add(struct proto_model *m, const char *name,
		    enum proto_dtype dt, uint32_t ndim, const uint64_t *shape,
		    struct proto_err *err)
{
	struct proto_tensor *t;
	size_t nlen = strlen(name);
	uint64_t nelem = 1;

	if (nlen == 0 || nlen >= PROTO_NAME_MAX)
		return proto_errf(err, EINVAL, "tensor name '%.40s' is empty or longer than %d bytes",
				  name, PROTO_NAME_MAX - 1);
	if ((unsigned)dt >= PROTO_DT_COUNT)
		return proto_errf(err, EINVAL, "tensor %s: bad dtype", name);
	if (ndim > PROTO_MAX_DIMS)
		return proto_errf(err, EINVAL, "tensor %s: %u dims, at most %d supported",
				  name, ndim, PROTO_MAX_DIMS);
	if (m->ntensors >= PROTO_MAX_TENSORS)
		return proto_errf(err, E2BIG, "more than %u tensors", PROTO_MAX_TENSORS);
	for (uint32_t d = 0; d < ndim; d++) {
		if (shape[d] > (1ull << 48) ||
		    __builtin_mul_overflow(nelem, shape[d], &nelem) || nelem > (1ull << 56))
			return proto_errf(err, EINVAL, "tensor %s: shape too large", name);
	}
	/* Grow by doubling: capacity is the next power of two above ntensors. */
	if ((m->ntensors & (m->ntensors - 1)) == 0) {
		size_t cap = m->ntensors ? 2 * (size_t)m->ntensors : 8;
		t = realloc(m->tensors, cap * sizeof(*t));
		if (t == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		m->tensors = t;
	}
	t = &m->tensors[m->ntensors];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (t->name == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	t->dtype = dt;
	t->ndim = ndim;
	memcpy(t->shape, shape, ndim * sizeof(*shape));
	t->nelem = nelem;
	t->nbytes = nelem * proto_dtype_size(dt);
	m->ntensors++;
	return 0;
}

static int cmp_by_name(const void *a, const void *b, void *model)
{
	const struct proto_model *m = model;
	return strcmp(m->tensors[*(const uint32_t *)a].name, m->tensors[*(const uint32_t *)b].name);
}

int proto_model_finish(struct proto_model *m, struct proto_err *err)
{
	uint32_t *idx = malloc((m->ntensors ? m->ntensors : 1) * sizeof(*idx));
	json_t *j;
	char *txt;

	if (idx == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t i = 0; i < m->ntensors; i++)
		idx[i] = i;
	/* Models are finished on several threads at once (the publisher's
	 * and a node's delta workers build parcel models): no global. */
	qsort_r(idx, m->ntensors, sizeof(*idx), cmp_by_name, m);
	for (uint32_t i = 1; i < m->ntensors; i++) {
		if (strcmp(m->tensors[idx[i - 1]].name, m->tensors[idx[i]].name) == 0) {
			int rc = proto_errf(err, EINVAL, "tensor %s is defined twice",
					    m->tensors[idx[i]].name);
			free(idx);
			return rc;
		}
	}
	free(m->sorted);
	m->sorted = idx;
	j = proto_model_to_json(m);
	txt = j ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (txt == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	crypto_generichash(m->digest, sizeof(m->digest), (const uint8_t *)txt,
			   strlen(txt), NULL, 0);
	free(txt);
	return 0;
}

int64_t proto_model_find(const struct proto_model *m, const char *name)
{
	size_t lo = 0, hi = m->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, m->tensors[m->sorted[mid]].name);
		if (c == 0)
			return m->sorted[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return -1;
}

uint64_t proto_model_bytes(const struct proto_model *m)
{
	uint64_t n = 0;
	for (uint32_t i = 0; i < m->ntensors; i++)
		n += m->tensors[i].nbytes;
	return n;
}

json_t *proto_model_to_json(const struct proto_model *m)
{
	json_t *root = json_object(), *arr = json_array();

	if (root == NULL || arr == NULL)
		goto fail;
	for (uint32_t i = 0; i < m->ntensors; i++) {
		const struct proto_tensor *t = &m->tensors[i];
		json_t *shape = json_array();
		for (uint32_t d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
		json_array_append_new(arr, json_pack("{s:s,s:s,s:o}", "name", t->name,
						     "dtype", proto_dtype_name(t->dtype),
						     "shape", shape));
	}
	json_object_set_new(root, "tensors", arr);
	return root;
fail:
	json_decref(root);
	json_decref(arr);
	return NULL;
}

int proto_model_parse(const char *json, size_t len, const char *what,
		      struct proto_model *out, struct proto_err *err)
{
	json_error_t jerr;
	json_t *root;
	int rc;

	proto_model_init(out);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return proto_errf(err, EINVAL, "%s: line %d: %s", what, jerr.line, jerr.text);
	rc = proto_model_from_json(root, what, out, err);
	json_decref(root);
	return rc;
}

int proto_model_from_json(json_t *root, const char *what,
			  struct proto_model *out, struct proto_err *err)
{
	json_t *tensors;
	int rc;

	proto_model_init(out);
	tensors = json_object_get(root, "tensors");
	if (!json_is_array(tensors)) {
		rc = proto_errf(err, EINVAL, "%s: \"tensors\" must be an array", what);
		goto fail;
	}
	for (size_t i = 0; i < json_array_size(tensors); i++) {
		json_t *t = json_array_get(tensors, i), *shape;
		const char *name, *dts;
		uint64_t dims[PROTO_MAX_DIMS];
		enum proto_dtype dt;

		name = json_string_value(json_object_get(t, "name"));
		dts = json_string_value(json_object_get(t, "dtype"));
		shape = json_object_get(t, "shape");
		if (name == NULL) {
			rc = proto_errf(err, EINVAL, "%s: tensors[%zu].name missing or not a string",
					what, i);
			goto fail;
		}
		if (dts == NULL || proto_dtype_parse(dts, &dt) != 0) {
			rc = proto_errf(err, EINVAL, "%s: tensors[%zu] (%s).dtype: unknown dtype '%s'",
					what, i, name, dts ? dts : "(missing)");
			goto fail;
		}
		if (!json_is_array(shape) || json_array_size(shape) > PROTO_MAX_DIMS) {
			rc = proto_errf(err, EINVAL,
					"%s: tensors[%zu] (%s).shape must be an array of at most %d sizes",
					what, i, name, PROTO_MAX_DIMS);
			goto fail;
		}
		for (size_t d = 0; d < json_array_size(shape); d++) {
			json_t *v = json_array_get(shape, d);
			if (!json_is_integer(v) || json_integer_value(v) < 0) {
				rc = proto_errf(err, EINVAL,
						"%s: tensors[%zu] (%s).shape[%zu] is not a size",
						what, i, name, d);
				goto fail;
			}
			dims[d] = (uint64_t)json_integer_value(v);
		}
		rc = proto_model_add(out, name, dt, (uint32_t)json_array_size(shape), dims, err);
		if (rc != 0) {
			proto_err_prefix(err, "%s: tensors[%zu]", what, i);
			goto fail;
		}
	}
	rc = proto_model_finish(out, err);
	if (rc != 0) {
		proto_err_prefix(err, "%s", what);
		goto fail;
	}
	return 0;
fail:
	proto_model_fini(out);
	return rc;
}

int proto_model_load(const char *path, struct proto_model *out,
		     struct proto_err *err)
{
	uint8_t *buf;
	size_t len;
	int rc;

	proto_model_init(out);
	rc = proto_read_file(path, proto_param(PROTO_PARAM_SPEC_MAX), &buf, &len, err);
	if (rc != 0)
		return rc;
	rc = proto_model_parse((const char *)buf, len, path, out, err);
	free(buf);
	return rc;
}
