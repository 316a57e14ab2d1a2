/* FP8 serving layouts' quantized source: the layout a plan into one is made
 * from, and its bytes quantized from the logical BF16 tensors. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "proto/fp8.h"
#include "proto/layout_fp8.h"
#include "proto/pool.h"
#include "proto/spec.h"

int proto_layout_fp8_source(const struct proto_model *m, const struct proto_layout *dst,
			    struct proto_layout *out, struct proto_err *err)
{
	json_t *root;
	int rc;

	memset(out, 0, sizeof(*out));
	if (dst->model == NULL)
		return proto_errf(err, EINVAL, "the layout transforms nothing");
	root = json_pack("{s:i,s:s,s:o,s:[{s:s,s:b}]}", "ranks", 1, "transform", PROTO_FP8_TRANSFORM,
			 "quantize", proto__layout_fp8_json(dst), "tensors", "match", "*", "replicate",
			 1);
	if (root == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	rc = proto_layout_from_json(m, root, "the FP8 source", out, err);
	json_decref(root);
	if (rc == 0 && memcmp(out->model->digest, dst->model->digest, sizeof(out->model->digest)) != 0) {
		proto_layout_fini(out);
		rc = proto_errf(err, EINVAL, "the FP8 source's model differs from the layout's");
	}
	return rc;
}

struct qjob {
	const uint8_t *src;
	uint64_t rows, cols;
	uint8_t *q;
	float *scale;
	_Atomic int rc;
	_Atomic uint64_t bad;
};

static int quant_rows(void *arg, unsigned slot, uint64_t br)
{
	struct qjob *j = arg;
	uint64_t bad;

	(void)slot;
	if (proto_fp8_quantize_rows(j->src, j->rows, j->cols, br, j->q, j->scale, &bad) != 0) {
		atomic_store(&j->bad, bad);
		atomic_store(&j->rc, -EDOM);
		return 1;
	}
	return 0;
}

int proto_layout_fp8_fill(const struct proto_model *m, const struct proto_layout *src8,
			  proto_tensor_bytes bytes, void *arg, unsigned threads,
			  const _Atomic bool *abort, struct proto_fp8_scratch *keep, uint8_t *block,
			  struct proto_err *err)
{
	const struct proto_rank *rk = &src8->ranks[0];
	struct proto_fp8_scratch once = {0}, *sk = keep != NULL ? keep : &once;
	uint64_t most = 1;
	uint8_t *scratch;
	int rc = 0;

	for (uint32_t t = 0; t < m->ntensors; t++)
		most = most > m->tensors[t].nbytes ? most : m->tensors[t].nbytes;
	if (sk->cap < most) {
		free(sk->p);
		sk->cap = 0;
		if ((sk->p = malloc(most)) == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		sk->cap = most;
	}
	scratch = sk->p;
	for (uint32_t i = 0; i < rk->nlocals && rc == 0; i++) {
		const struct proto_local *lt = &rk->locals[i];
		const struct proto_local *sc =
			i + 1 < rk->nlocals && rk->locals[i + 1].scales ? &rk->locals[i + 1] : NULL;
		uint32_t t = lt->pieces[0].tensor;
		const struct proto_tensor *x = &m->tensors[t];
		const uint8_t *b;

		if (abort != NULL && atomic_load(abort)) {
			rc = proto_errf(err, ECANCELED, "stopped");
			break;
		}
		if (lt->scales)
			continue;
		if (sc == NULL) { /* served as it is */
			if ((b = bytes(arg, t, block + lt->offset)) != block + lt->offset)
				memcpy(block + lt->offset, b, x->nbytes);
			continue;
		}
		struct qjob j = {.src = bytes(arg, t, scratch), .rows = x->shape[0],
				 .cols = x->shape[1], .q = block + lt->offset,
				 .scale = (float *)(void *)(block + sc->offset)};
		proto_pool_for(proto_fp8_blocks(x->shape[0]), threads, quant_rows, &j);
		if (atomic_load(&j.rc) != 0) {
			uint64_t bad = atomic_load(&j.bad);
			rc = proto_errf(err, EDOM,
					"tensor %s: element [%llu, %llu] is %s; it cannot be quantized to FP8 "
					"(" PROTO_FP8_TRANSFORM ")",
					x->name, (unsigned long long)(bad / x->shape[1]),
					(unsigned long long)(bad % x->shape[1]),
					proto_fp8_nonfinite_name(j.src + bad * 2));
		}
	}
	free(once.p);
	return rc;
}

struct from_src {
	const struct proto_model *m8;
	const uint64_t *at; /* per tensor: its local's offset in block */
	const uint8_t *block;
};

static void from_src(void *arg, uint32_t tensor, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct from_src *f = arg;
	size_t es = proto_dtype_size(f->m8->tensors[tensor].dtype);

	memcpy(out, f->block + f->at[tensor] + first * es, count * es);
}

int proto_layout_fp8_fill_rank(const struct proto_model *m, const struct proto_layout *l,
			       uint32_t rank, proto_tensor_bytes bytes, void *arg, uint8_t *block,
			       struct proto_err *err)
{
	struct proto_layout src;
	uint8_t *sb;
	int rc = proto_layout_fp8_source(m, l, &src, err);

	if (rc != 0)
		return rc;
	sb = calloc(1, src.ranks[0].nbytes + 1);
	uint64_t *at = calloc(l->model->ntensors + 1, sizeof(*at));
	if (sb == NULL || at == NULL) {
		free(sb);
		free(at);
		proto_layout_fini(&src);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	/* The source holds every tensor whole, one local each. */
	for (uint32_t i = 0; i < src.ranks[0].nlocals; i++)
		at[src.ranks[0].locals[i].pieces[0].tensor] = src.ranks[0].locals[i].offset;
	rc = proto_layout_fp8_fill(m, &src, bytes, arg, 1, NULL, NULL, sb, err);
	if (rc == 0) {
		struct from_src f = {.m8 = l->model, .at = at, .block = sb};
		proto_layout_fill_rank(m, l, rank, from_src, &f, block);
	}
	free(at);
	free(sb);
	proto_layout_fini(&src);
	return rc;
}
