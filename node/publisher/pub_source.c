/* The publisher's weights: the synthetic fixture or a model dir of one checkpoint per version. */
#include "node/publisher/pub_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "proto/fixture.h"

bool node__pub_source_has(const struct node_pub *p, uint64_t v)
{
	/* The trainer's buffers hold the version a trainer asked to export,
	 * nothing that could be rebuilt after a restart. */
	if (p->trainer)
		return v >= 1 && p->ex != NULL && p->ex->req != NULL && !p->ex->verify;
	return v >= 1 && (p->synthetic || v <= p->nfiles);
}

/* ---- the model dir --------------------------------------------------------- */

/* Checks that checkpoint f holds exactly the model's tensors (any order) and
 * maps them. */
static int file_match(struct node_pub *p, struct pub_file *f, const char *first,
		      struct proto_err *err)
{
	const struct proto_model *fm = &f->ck.model;

	if (fm->ntensors != p->model.ntensors)
		return proto_errf(err, EINVAL,
				  "%s has %u tensors but %s has %u: all versions must share the model",
				  f->path, fm->ntensors, first, p->model.ntensors);
	f->map = calloc(PROTO_MAX(p->model.ntensors, 1), sizeof(*f->map));
	if (f->map == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t t = 0; t < p->model.ntensors; t++) {
		const struct proto_tensor *a = &p->model.tensors[t];
		int64_t i = proto_model_find(fm, a->name);
		const struct proto_tensor *b = i >= 0 ? &fm->tensors[i] : NULL;
		if (b == NULL)
			return proto_errf(err, EINVAL,
					  "%s lacks tensor '%s' of %s: all versions must share the model",
					  f->path, a->name, first);
		if (b->dtype != a->dtype || b->ndim != a->ndim ||
		    memcmp(b->shape, a->shape, sizeof(a->shape[0]) * a->ndim) != 0)
			return proto_errf(err, EINVAL,
					  "%s: tensor '%s' differs in dtype or shape from %s: all versions must share the model",
					  f->path, a->name, first);
		f->map[t] = (uint32_t)i;
	}
	return 0;
}

int node__pub_load_model_dir(struct node_pub *p, const char *dir, struct proto_err *err)
{
	char **paths = NULL;
	size_t n = 0;
	int rc;

	if ((rc = proto_ckpt_dir_list(dir, &paths, &n, err)) != 0)
		return rc;
	/* Every shard of every version stays open for the snapshot's pread
	 * (proto_st_read): a long run's directory can hold more files than
	 * the usual soft limit of 1024, so take the hard limit. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			LOG_DEBUG("model dir %s: the open-file limit stays: %s", dir, strerror(errno));
	}
	p->files = calloc(n, sizeof(*p->files));
	if (p->files == NULL) {
		proto_ckpt_list_free(paths, n);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	/* The paths move into p->files. */
	p->nfiles = n;
	for (size_t i = 0; i < n; i++)
		p->files[i].path = paths[i];
	free(paths);
	for (size_t i = 0; i < p->nfiles; i++)
		if ((rc = proto_ckpt_open(p->files[i].path, &p->files[i].ck, err)) != 0)
			return rc;
	/* The model: the first version's tensors, in its order. */
	proto_model_init(&p->model);
	p->have_model = true;
	const struct proto_model *m0 = &p->files[0].ck.model;
	for (uint32_t t = 0; t < m0->ntensors; t++) {
		const struct proto_tensor *x = &m0->tensors[t];
		if ((rc = proto_model_add(&p->model, x->name, x->dtype, x->ndim, x->shape, err)) != 0)
			return rc;
	}
	if ((rc = proto_model_finish(&p->model, err)) != 0)
		return rc;
	for (size_t i = 0; i < p->nfiles; i++)
		if ((rc = file_match(p, &p->files[i], p->files[0].path, err)) != 0)
			return rc;
	return 0;
}

/* ---- snapshots --------------------------------------------------------------- */

int node__pub_source_fill(struct node_pub *p, uint32_t rank, uint64_t version, uint8_t *block,
			  struct proto_err *err)
{
	if (p->synthetic) {
		proto_fixture_fill_rank(&p->model, &p->tl, rank, p->seed, version, block);
	} else if (p->trainer) {
		if (p->tl.ranks[rank].nbytes > 0)
			memcpy(block, p->tr_map[rank], p->tl.ranks[rank].nbytes);
	} else {
		const struct pub_file *f = &p->files[version - 1];
		int rc = proto_ckpt_fill_rank(&f->ck, &p->model, f->map, &p->tl, rank, block, err);
		if (rc != 0)
			proto_err_prefix(err, "%s", f->path);
		return rc;
	}
	return 0;
}
