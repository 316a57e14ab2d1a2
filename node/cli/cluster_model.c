/* `tessera cluster`: the model it publishes (synthetic, or --model-dir's
 * checkpoints) and the bytes each rank must hold at each version. */
#include <errno.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>

#include "node/cli/cluster.h"
#include "proto/checkpoint.h"
#include "proto/fixture.h"
#include "proto/proto.h"

/* A version's logical tensors, for an FP8 layout's expected bytes. */
struct logical {
	struct cluster *c;
	const struct proto_ckpt *ck; /* NULL: the synthetic model */
	uint64_t v;
	int rc;
	struct proto_err *err;
};

static const uint8_t *logical_bytes(void *arg, uint32_t t, uint8_t *scratch)
{
	struct logical *g = arg;
	const struct proto_tensor *x = &g->c->model.tensors[t];

	if (g->ck == NULL)
		proto_fixture_fill(&g->c->model, g->c->seed, g->v, t, 0, x->nelem, scratch);
	else if (g->rc == 0)
		g->rc = proto_ckpt_read(g->ck, t, 0, x->nbytes, scratch, g->err);
	return scratch;
}

int node__cluster_expected_block(struct cluster *c, const struct proto_layout *l, uint32_t rank,
				 uint64_t v, uint8_t *block, struct proto_err *err)
{
	struct logical g = {.c = c, .v = v, .err = err};

	if (c->model_dir == NULL && proto_layout_transformed(l))
		return proto_layout_fp8_fill_rank(&c->model, l, rank, logical_bytes, &g, block, err);
	if (c->model_dir == NULL) {
		proto_fixture_fill_rank(&c->model, l, rank, c->seed, v, block);
		return 0;
	}
	struct proto_ckpt ck;
	int rc = proto_ckpt_open(c->ckpts[v - 1], &ck, err);
	if (rc != 0)
		return rc;
	/* Same names, dtypes and shapes, in the same order, as the model the
	 * nodes use. */
	if (sodium_memcmp(ck.model.digest, c->model.digest, PROTO_HASH_BYTES) != 0) {
		proto_ckpt_fini(&ck);
		return proto_errf(err, EINVAL, "%s: a different model than the first version",
				  c->ckpts[v - 1]);
	}
	/* By pread, as the publisher reads it: a file cut short since is an
	 * error here, not a SIGBUS from its mapping. */
	g.ck = &ck;
	if (proto_layout_transformed(l)) {
		rc = proto_layout_fp8_fill_rank(&c->model, l, rank, logical_bytes, &g, block, err);
		if (rc == 0)
			rc = g.rc;
	} else {
		rc = proto_ckpt_fill_rank(&ck, &ck.model, NULL, l, rank, block, err);
	}
	if (rc != 0)
		proto_err_prefix(err, "%s", c->ckpts[v - 1]);
	proto_ckpt_fini(&ck);
	return rc;
}

int node__cluster_load_model(struct cluster *c, struct proto_err *err)
{
	int rc;

	if (c->model_dir != NULL) {
		struct proto_ckpt ck;
		if ((rc = proto_ckpt_dir_list(c->model_dir, &c->ckpts, &c->nckpts, err)) != 0)
			return rc;
		if (c->versions > c->nckpts)
			return proto_errf(err, EINVAL, "%s holds %zu versions, --versions asks for %" PRIu64,
					  c->model_dir, c->nckpts, c->versions);
		if ((rc = proto_ckpt_open(c->ckpts[0], &ck, err)) != 0)
			return rc;
		/* Keep a copy of the model (the files are closed again). */
		json_t *mj = proto_model_to_json(&ck.model);
		proto_ckpt_fini(&ck);
		rc = proto_model_from_json(mj, c->ckpts[0], &c->model, err);
		json_decref(mj);
		if (rc != 0)
			return rc;
	} else if ((rc = proto_fixture_model(c->model_mb << 20, &c->model, err)) != 0) {
		return rc;
	}
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		const char *s = r->layout_arg;
		rc = proto_layout_open(&c->model, s, &r->layout, err);
		if (rc == 0)
			rc = proto_layout_check_complete(&c->model, &r->layout, err);
		if (rc != 0)
			return rc;
		/* Layout files are handed to the nodes by absolute path. */
		if (proto_layout_arg_is_file(s)) {
			char abs[4096];
			if (realpath(s, abs) != NULL)
				snprintf(r->layout_arg, sizeof(r->layout_arg), "%s", abs);
		}
	}
	return 0;
}
