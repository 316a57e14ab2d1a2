/* Checkpoints (a safetensors file or a Hugging Face directory, sharded or
 * not) and model directories of one checkpoint per version. */
#include "proto/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/params.h"

static bool is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int join(char *out, size_t len, const char *dir, const char *name, struct proto_err *err)
{
	int n = snprintf(out, len, "%s/%s", dir, name);
	if (n < 0 || (size_t)n >= len)
		return proto_errf(err, ENAMETOOLONG, "%s/%s: path too long", dir, name);
	return 0;
}

bool proto_ckpt_is_hf_dir(const char *dir)
{
	char p[4096];
	return join(p, sizeof(p), dir, PROTO_CKPT_SINGLE, NULL) == 0 &&
	       (is_file(p) || (join(p, sizeof(p), dir, PROTO_CKPT_INDEX, NULL) == 0 && is_file(p)));
}

void proto_ckpt_fini(struct proto_ckpt *ck)
{
	for (uint32_t i = 0; ck->shards != NULL && i < ck->nshards; i++)
		proto_st_fini(&ck->shards[i]);
	free(ck->shards);
	free(ck->shard_of);
	free(ck->index_in);
	proto_model_fini(&ck->model);
	memset(ck, 0, sizeof(*ck));
}

const uint8_t *proto_ckpt_tensor(const struct proto_ckpt *ck, uint32_t t)
{
	return proto_st_tensor(&ck->shards[ck->shard_of[t]], ck->index_in[t]);
}

int proto_ckpt_read(const struct proto_ckpt *ck, uint32_t t, uint64_t off, size_t len,
		    uint8_t *out, struct proto_err *err)
{
	if (t >= ck->model.ntensors)
		return proto_errf(err, EINVAL, "tensor %u: the checkpoint has %u", t, ck->model.ntensors);
	return proto_st_read(&ck->shards[ck->shard_of[t]], ck->index_in[t], off, len, out, err);
}

/* A rank's fill by pread: the layout walks the rank's pieces in runs along
 * each tensor's last dimension (a row, often a few KiB); runs that continue
 * each other in the tensor and in the block are read with one pread (the
 * calls, not the bytes, would cost the most). */
struct fill {
	const struct proto_ckpt *ck;
	const uint32_t *map;
	uint32_t t;     /* the pending run: ck's tensor, first element, */
	uint64_t first; /* element count, destination */
	uint64_t count;
	uint8_t *out;
	int rc; /* the first failure; nothing more is read after it */
	struct proto_err *err;
};

static void fill_flush(struct fill *s)
{
	size_t es = proto_dtype_size(s->ck->model.tensors[s->t].dtype);

	if (s->count > 0 && s->rc == 0)
		s->rc = proto_ckpt_read(s->ck, s->t, s->first * es, s->count * es, s->out, s->err);
	s->count = 0;
}

static void fill_source(void *arg, uint32_t t, uint64_t first, uint64_t count, uint8_t *out)
{
	struct fill *s = arg;
	uint32_t i = s->map != NULL ? s->map[t] : t;
	size_t es = proto_dtype_size(s->ck->model.tensors[i].dtype);

	if (s->count > 0 && i == s->t && first == s->first + s->count &&
	    out == s->out + s->count * es) {
		s->count += count;
		return;
	}
	fill_flush(s);
	s->t = i;
	s->first = first;
	s->count = count;
	s->out = out;
}

int proto_ckpt_fill_rank(const struct proto_ckpt *ck, const struct proto_model *m,
			 const uint32_t *map, const struct proto_layout *l, uint32_t rank,
			 uint8_t *block, struct proto_err *err)
{
	struct fill s = {.ck = ck, .map = map, .err = err};

	proto_layout_fill_rank(m, l, rank, fill_source, &s, block);
	fill_flush(&s);
	return s.rc;
}

/* Room for the model's per-tensor tables, grown as shards are added. */
static int add_tensors(struct proto_ckpt *ck, uint32_t s, const char *const *owner_of,
		       const char *shard_name, const char *what, struct proto_err *err)
{
	const struct proto_model *sm = &ck->shards[s].model;
	uint32_t base = ck->model.ntensors;
	uint32_t *so = realloc(ck->shard_of, ((size_t)base + sm->ntensors + 1) * sizeof(*so));
	if (so == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	ck->shard_of = so;
	uint32_t *ii = realloc(ck->index_in, ((size_t)base + sm->ntensors + 1) * sizeof(*ii));
	if (ii == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	ck->index_in = ii;
	for (uint32_t i = 0; i < sm->ntensors; i++) {
		const struct proto_tensor *t = &sm->tensors[i];
		/* Sharded: the index must put this tensor in this very shard. */
		if (owner_of != NULL && (owner_of[i] == NULL || strcmp(owner_of[i], shard_name) != 0))
			return proto_errf(err, EINVAL, "%s: shard %s holds tensor '%s', which the index %s",
					  what, shard_name, t->name,
					  owner_of[i] == NULL ? "does not name" : "puts in another shard");
		int rc = proto_model_add(&ck->model, t->name, t->dtype, t->ndim, t->shape, err);
		if (rc != 0)
			return rc;
		ck->shard_of[base + i] = s;
		ck->index_in[base + i] = i;
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A weight_map value: a plain safetensors file name beside the index. */
static bool shard_name_ok(const char *s)
{
	size_t n = strlen(s), suf = strlen(".safetensors");
	return n > suf && n < 256 && s[0] != '.' && strchr(s, '/') == NULL &&
	       strcmp(s + n - suf, ".safetensors") == 0;
}

static int open_sharded(const char *dir, const char *index, struct proto_ckpt *ck,
			struct proto_err *err)
{
	uint8_t *buf = NULL;
	size_t len, nnames = 0;
	json_error_t je;
	json_t *root = NULL, *map, *v;
	const char *key, **names = NULL, **owner = NULL;
	char path[4096];
	int rc;

	rc = proto_read_file(index, proto_param(PROTO_PARAM_SPEC_MAX), &buf, &len, err);
	if (rc != 0)
		return rc;
	root = json_loadb((const char *)buf, len, JSON_REJECT_DUPLICATES, &je);
	free(buf);
	if (root == NULL) {
		rc = proto_errf(err, EINVAL, "%s: not JSON: %s (line %d)", index, je.text, je.line);
		goto out;
	}
	map = json_object_get(root, "weight_map");
	if (!json_is_object(root) || !json_is_object(map) || json_object_size(map) == 0) {
		rc = proto_errf(err, EINVAL, "%s: no \"weight_map\" object of tensor names", index);
		goto out;
	}
	/* The distinct shard names, checked, in name order. */
	names = calloc(json_object_size(map), sizeof(*names));
	if (names == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	json_object_foreach(map, key, v)
	{
		const char *s = json_string_value(v);
		if (s == NULL || !shard_name_ok(s)) {
			rc = proto_errf(err, EINVAL,
					"%s: tensor '%s' maps to %s, not a .safetensors file name beside the index",
					index, key, s ? s : "a non-string");
			goto out;
		}
		names[nnames++] = s;
	}
	qsort(names, nnames, sizeof(*names), cmp_str);
	size_t k = 0;
	for (size_t i = 0; i < nnames; i++)
		if (k == 0 || strcmp(names[k - 1], names[i]) != 0)
			names[k++] = names[i];
	nnames = k;
	if (nnames > PROTO_CKPT_SHARDS_MAX) {
		rc = proto_errf(err, EINVAL, "%s: %zu shard files, at most %d", index, nnames,
				PROTO_CKPT_SHARDS_MAX);
		goto out;
	}
	ck->shards = calloc(nnames, sizeof(*ck->shards));
	if (ck->shards == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	for (size_t s = 0; s < nnames; s++) {
		if ((rc = join(path, sizeof(path), dir, names[s], err)) != 0 ||
		    (rc = proto_st_open(path, &ck->shards[s], err)) != 0)
			goto out;
		ck->nshards = (uint32_t)s + 1;
		const struct proto_model *sm = &ck->shards[s].model;
		free(owner);
		owner = calloc(sm->ntensors + 1, sizeof(*owner));
		if (owner == NULL) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto out;
		}
		for (uint32_t i = 0; i < sm->ntensors; i++)
			owner[i] = json_string_value(json_object_get(map, sm->tensors[i].name));
		if ((rc = add_tensors(ck, (uint32_t)s, owner, names[s], index, err)) != 0)
			goto out;
	}
	/* Every tensor the index names is in the shard it names (each shard's
	 * tensors were checked against the index above). */
	json_object_foreach(map, key, v)
	{
		const char *want = json_string_value(v);
		const char **at = bsearch(&want, names, nnames, sizeof(*names), cmp_str);
		if (at == NULL || proto_model_find(&ck->shards[at - names].model, key) < 0) {
			rc = proto_errf(err, EINVAL, "%s: tensor '%s' is not in %s", index, key, want);
			goto out;
		}
	}
	rc = proto_model_finish(&ck->model, err);
	if (rc != 0)
		proto_err_prefix(err, "%s", index);
out:
	free(owner);
	free(names);
	json_decref(root);
	return rc;
}

static int open_single(const char *path, struct proto_ckpt *ck, struct proto_err *err)
{
	int rc;

	ck->shards = calloc(1, sizeof(*ck->shards));
	if (ck->shards == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if ((rc = proto_st_open(path, &ck->shards[0], err)) != 0)
		return rc;
	ck->nshards = 1;
	if ((rc = add_tensors(ck, 0, NULL, NULL, path, err)) != 0)
		return rc;
	return proto_model_finish(&ck->model, err);
}

int proto_ckpt_open(const char *path, struct proto_ckpt *ck, struct proto_err *err)
{
	char p[4096];
	int rc;

	memset(ck, 0, sizeof(*ck));
	proto_model_init(&ck->model);
	if (!is_dir(path)) {
		rc = open_single(path, ck, err);
	} else if ((rc = join(p, sizeof(p), path, PROTO_CKPT_SINGLE, err)) == 0 && is_file(p)) {
		/* As transformers does: a whole model.safetensors first. */
		rc = open_single(p, ck, err);
	} else if (rc == 0 && (rc = join(p, sizeof(p), path, PROTO_CKPT_INDEX, err)) == 0) {
		if (is_file(p))
			rc = open_sharded(path, p, ck, err);
		else
			rc = proto_errf(err, ENOENT, "%s: neither %s nor %s: not a checkpoint directory",
					path, PROTO_CKPT_SINGLE, PROTO_CKPT_INDEX);
	}
	if (rc != 0)
		proto_ckpt_fini(ck);
	return rc;
}

/* ---- model directories --------------------------------------------------- */

struct ventry {
	uint64_t n;
	char *name;
};

static int cmp_ventry(const void *a, const void *b)
{
	const struct ventry *x = a, *y = b;
	return x->n < y->n ? -1 : x->n > y->n;
}

/* "v<N>.safetensors" (a file) or "v<N>" (a directory) -> N; digits only,
 * no leading zeros (1 for v01 would be ambiguous with v1). */
static int version_entry(const char *dir, const char *name, uint64_t *n, bool *zeros)
{
	const char *suf = ".safetensors";
	size_t len = strlen(name), sl = strlen(suf), digits;
	char path[4096], num[24];
	bool file;

	*zeros = false;
	if (name[0] != 'v')
		return -1;
	file = len > sl && strcmp(name + len - sl, suf) == 0;
	digits = (file ? len - sl : len) - 1;
	if (digits == 0 || digits >= sizeof(num))
		return -1;
	for (size_t i = 0; i < digits; i++)
		if (name[1 + i] < '0' || name[1 + i] > '9')
			return -1;
	memcpy(num, name + 1, digits);
	num[digits] = 0;
	if (join(path, sizeof(path), dir, name, NULL) != 0 || (file ? !is_file(path) : !is_dir(path)))
		return -1;
	*zeros = digits > 1 && num[0] == '0';
	return proto_parse_u64(num, 0, UINT64_MAX, n) == 0 ? 0 : -1;
}

void proto_ckpt_list_free(char **paths, size_t n)
{
	for (size_t i = 0; paths != NULL && i < n; i++)
		free(paths[i]);
	free(paths);
}

int proto_ckpt_dir_list(const char *dir, char ***paths, size_t *n, struct proto_err *err)
{
	struct ventry *v = NULL;
	size_t nv = 0, cap = 0;
	struct dirent *e;
	char path[4096];
	DIR *d;
	int rc = 0;

	*paths = NULL;
	*n = 0;
	if (proto_ckpt_is_hf_dir(dir)) {
		/* The directory is one checkpoint: one version. */
		*paths = calloc(1, sizeof(**paths));
		if (*paths == NULL || ((*paths)[0] = strdup(dir)) == NULL) {
			free(*paths);
			*paths = NULL;
			return proto_errf(err, ENOMEM, "out of memory");
		}
		*n = 1;
		return 0;
	}
	if ((d = opendir(dir)) == NULL)
		return proto_errf(err, errno, "model dir %s: %s", dir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		uint64_t k;
		bool zeros;
		if (version_entry(dir, e->d_name, &k, &zeros) != 0)
			continue;
		if (zeros) {
			rc = proto_errf(err, EINVAL, "model dir %s: %s: name versions without leading zeros",
					dir, e->d_name);
			goto out;
		}
		if (nv == cap) {
			size_t nc = cap ? 2 * cap : 16;
			struct ventry *nvv = realloc(v, nc * sizeof(*nvv));
			if (nvv == NULL) {
				rc = proto_errf(err, ENOMEM, "out of memory");
				goto out;
			}
			v = nvv;
			cap = nc;
		}
		v[nv].n = k;
		if ((v[nv].name = strdup(e->d_name)) == NULL) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			goto out;
		}
		nv++;
	}
	if (nv == 0) {
		rc = proto_errf(err, ENOENT,
				"model dir %s: no v<N>.safetensors or v<N>/ checkpoint, and not a Hugging Face checkpoint itself",
				dir);
		goto out;
	}
	qsort(v, nv, sizeof(*v), cmp_ventry);
	for (size_t i = 1; i < nv; i++)
		if (v[i].n == v[i - 1].n) {
			rc = proto_errf(err, EINVAL, "model dir %s: both %s and %s are version v%llu", dir,
					v[i - 1].name, v[i].name, (unsigned long long)v[i].n);
			goto out;
		}
	*paths = calloc(nv, sizeof(**paths));
	if (*paths == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < nv; i++) {
		if ((rc = join(path, sizeof(path), dir, v[i].name, err)) != 0 ||
		    ((*paths)[i] = strdup(path)) == NULL) {
			rc = rc ? rc : proto_errf(err, ENOMEM, "out of memory");
			proto_ckpt_list_free(*paths, nv);
			*paths = NULL;
			goto out;
		}
	}
	*n = nv;
out:
	if (d != NULL)
		closedir(d);
	for (size_t i = 0; i < nv; i++)
		free(v[i].name);
	free(v);
	return rc;
}
