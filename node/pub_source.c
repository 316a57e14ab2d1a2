/* The publisher's weights: the synthetic fixture or a model dir of v<N>.safetensors files. */
#include "node/pub_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/fixture.h"

bool node__pub_source_has(const struct node_pub *p, uint64_t v)
{
	return v >= 1 && (p->synthetic || v <= p->nfiles);
}

/* ---- the model dir --------------------------------------------------------- */

static int file_cmp(const void *a, const void *b)
{
	const struct pub_file *x = a, *y = b;
	return x->n < y->n ? -1 : x->n > y->n;
}

/* "v<N>.safetensors" -> N. */
static bool version_file(const char *name, uint64_t *n)
{
	const char *suf = ".safetensors";
	size_t len = strlen(name), sl = strlen(suf);
	char num[32];

	if (len <= sl + 1 || name[0] != 'v' || strcmp(name + len - sl, suf) != 0 ||
	    len - sl - 1 >= sizeof(num))
		return false;
	memcpy(num, name + 1, len - sl - 1);
	num[len - sl - 1] = 0;
	if (num[0] < '0' || num[0] > '9')
		return false;
	return proto_parse_u64(num, 0, UINT64_MAX, n) == 0;
}

/* Checks that file f holds exactly the model's tensors (any order) and maps
 * them. */
static int file_match(struct node_pub *p, struct pub_file *f, const char *dir,
		      const char *first, struct proto_err *err)
{
	const struct proto_model *fm = &f->st.model;

	if (fm->ntensors != p->model.ntensors)
		return proto_errf(err, EINVAL,
				  "%s/v%llu.safetensors has %u tensors but %s has %u: all versions must share the model",
				  dir, (unsigned long long)f->n, fm->ntensors, first,
				  p->model.ntensors);
	f->map = calloc(PROTO_MAX(p->model.ntensors, 1), sizeof(*f->map));
	if (f->map == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (uint32_t t = 0; t < p->model.ntensors; t++) {
		const struct proto_tensor *a = &p->model.tensors[t];
		int64_t i = proto_model_find(fm, a->name);
		const struct proto_tensor *b = i >= 0 ? &fm->tensors[i] : NULL;
		if (b == NULL)
			return proto_errf(err, EINVAL,
					  "%s/v%llu.safetensors lacks tensor '%s' of %s: all versions must share the model",
					  dir, (unsigned long long)f->n, a->name, first);
		if (b->dtype != a->dtype || b->ndim != a->ndim ||
		    memcmp(b->shape, a->shape, sizeof(a->shape[0]) * a->ndim) != 0)
			return proto_errf(err, EINVAL,
					  "%s/v%llu.safetensors: tensor '%s' differs in dtype or shape from %s: all versions must share the model",
					  dir, (unsigned long long)f->n, a->name, first);
		f->map[t] = (uint32_t)i;
	}
	return 0;
}

int node__pub_load_model_dir(struct node_pub *p, const char *dir, struct proto_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t cap = 0;
	char path[4096], first[64];
	int rc = 0;

	if (d == NULL)
		return proto_errf(err, errno, "model dir %s: %s", dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		uint64_t n;
		if (!version_file(e->d_name, &n))
			continue;
		if (p->nfiles == cap) {
			size_t nc = cap ? 2 * cap : 16;
			struct pub_file *nf = realloc(p->files, nc * sizeof(*nf));
			if (nf == NULL) {
				closedir(d);
				return proto_errf(err, ENOMEM, "out of memory");
			}
			p->files = nf;
			cap = nc;
		}
		memset(&p->files[p->nfiles], 0, sizeof(p->files[0]));
		p->files[p->nfiles++].n = n;
	}
	closedir(d);
	if (p->nfiles == 0)
		return proto_errf(err, ENOENT, "model dir %s: no v<N>.safetensors file", dir);
	qsort(p->files, p->nfiles, sizeof(p->files[0]), file_cmp);
	for (size_t i = 1; i < p->nfiles; i++)
		if (p->files[i].n == p->files[i - 1].n)
			return proto_errf(err, EINVAL,
					  "model dir %s: two files are version v%llu (leading zeros?)",
					  dir, (unsigned long long)p->files[i].n);
	for (size_t i = 0; i < p->nfiles; i++) {
		struct pub_file *f = &p->files[i];
		snprintf(path, sizeof(path), "%s/v%llu.safetensors", dir, (unsigned long long)f->n);
		/* A v01.safetensors is found as v1; open what is really there. */
		if (access(path, R_OK) != 0) {
			rc = proto_errf(err, ENOENT,
					"model dir %s: name the files v<N>.safetensors without leading zeros",
					dir);
			return rc;
		}
		if ((rc = proto_st_open(path, &f->st, err)) != 0)
			return rc;
	}
	/* The model: the first file's tensors, in its data order. */
	proto_model_init(&p->model);
	p->have_model = true;
	for (uint32_t t = 0; t < p->files[0].st.model.ntensors; t++) {
		const struct proto_tensor *x = &p->files[0].st.model.tensors[t];
		if ((rc = proto_model_add(&p->model, x->name, x->dtype, x->ndim, x->shape, err)) != 0)
			return rc;
	}
	if ((rc = proto_model_finish(&p->model, err)) != 0)
		return rc;
	snprintf(first, sizeof(first), "v%llu.safetensors", (unsigned long long)p->files[0].n);
	for (size_t i = 0; i < p->nfiles; i++)
		if ((rc = file_match(p, &p->files[i], dir, first, err)) != 0)
			return rc;
	return 0;
}

struct st_src {
	const struct pub_file *f;
};

static void st_source(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct st_src *s = arg;
	uint32_t i = s->f->map[t];
	size_t es = proto_dtype_size(s->f->st.model.tensors[i].dtype);

	memcpy(out, proto_st_tensor(&s->f->st, i) + first * es, count * es);
}

/* ---- snapshots --------------------------------------------------------------- */

void node__pub_source_fill(struct node_pub *p, uint32_t rank, uint64_t version, uint8_t *block)
{
	if (p->synthetic) {
		proto_fixture_fill_rank(&p->model, &p->tl, rank, p->seed, version, block);
	} else {
		struct st_src s = {&p->files[version - 1]};
		proto_layout_fill_rank(&p->model, &p->tl, rank, st_source, &s, block);
	}
}
