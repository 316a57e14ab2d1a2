/* Delta files: encode two safetensors files, rebuild a child atomically. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/delta_internal.h"

/* Data pointers of an opened file, one per tensor (caller frees). */
static const uint8_t **tensor_ptrs(const struct proto_st *st)
{
	const uint8_t **p = malloc((st->model.ntensors + 1) * sizeof(*p));

	if (p != NULL)
		for (uint32_t i = 0; i < st->model.ntensors; i++)
			p[i] = proto_st_tensor(st, i);
	return p;
}

int proto_delta_encode_files(const char *parent, const char *child, const char *out,
			     const struct proto_delta_opts *o, struct proto_delta_stats *st,
			     struct proto_err *err)
{
	struct proto_st a, b;
	const uint8_t **pa = NULL, **pb = NULL;
	uint8_t *buf = NULL;
	size_t len;
	int rc;

	rc = proto_st_open(parent, &a, err);
	if (rc != 0)
		return rc;
	rc = proto_st_open(child, &b, err);
	if (rc != 0) {
		proto_st_fini(&a);
		return rc;
	}
	pa = tensor_ptrs(&a);
	pb = tensor_ptrs(&b);
	if (pa == NULL || pb == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	{
		struct proto_delta_version va = {&a.model, a.header, a.header_len, pa, NULL};
		struct proto_delta_version vb = {&b.model, b.header, b.header_len, pb, NULL};
		rc = proto_delta_encode(&va, &vb, o, &buf, &len, st, err);
	}
	if (rc == 0)
		rc = proto_write_file_atomic(out, buf, len, 0644, err);
out:
	free(buf);
	free(pa);
	free(pb);
	proto_st_fini(&a);
	proto_st_fini(&b);
	return rc;
}

/* Maps a whole file read-only. */
static int map_file(const char *path, const uint8_t **map, size_t *len, struct proto_err *err)
{
	struct stat st;
	void *p;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
		int e = errno;
		close(fd);
		return proto_errf(err, EINVAL, "%s: %s", path,
				  S_ISREG(st.st_mode) ? (st.st_size == 0 ? "empty file" : strerror(e))
						      : "not a regular file");
	}
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return proto_errf(err, errno, "%s: mmap: %s", path, strerror(errno));
	*map = p;
	*len = (size_t)st.st_size;
	return 0;
}

int proto_delta_apply_files(const char *parent, const char *delta, const char *out,
			    unsigned threads, struct proto_err *err)
{
	struct proto_st a, c;
	struct proto_delta d;
	const uint8_t *dmap = NULL, **pa = NULL;
	size_t dlen = 0;
	uint64_t *psums = NULL, csize;
	uint8_t **bufs = NULL, *omap = NULL;
	char tmp[4096];
	bool created = false;
	int fd = -1, rc;

	memset(&c, 0, sizeof(c));
	rc = proto_st_open(parent, &a, err);
	if (rc != 0)
		return rc;
	memset(&d, 0, sizeof(d));
	rc = map_file(delta, &dmap, &dlen, err);
	if (rc != 0)
		goto out;
	rc = proto_delta_parse(dmap, dlen, &d, err);
	if (rc != 0) {
		proto_err_prefix(err, "%s", delta);
		goto out;
	}
	pa = tensor_ptrs(&a);
	psums = malloc((a.model.ntensors + 1) * sizeof(*psums));
	bufs = malloc((d.ntensors + 1) * sizeof(*bufs));
	if (pa == NULL || psums == NULL || bufs == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	proto_delta_sums(&a.model, pa, threads, psums);
	{
		struct proto_delta_parent par = {a.header, a.header_len, a.model.ntensors, psums};
		rc = proto_delta_check_parent(&d, &par, err);
		if (rc != 0) {
			proto_err_prefix(err, "%s for %s", delta, parent);
			goto out;
		}
	}
	/* The child's layout comes from its header, carried in the delta. */
	csize = d.child_header_len;
	for (uint32_t i = 0; i < d.ntensors; i++)
		csize += d.tensors[i].nelem * d.tensors[i].elsize;
	rc = proto_st_parse(d.child_header, d.child_header_len, csize, "child header", &c, err);
	if (rc != 0) {
		proto_err_prefix(err, "%s", delta);
		goto out;
	}
	if (c.header_len != d.child_header_len || c.model.ntensors != d.ntensors) {
		rc = proto_errf(err, EINVAL, "%s: child header does not describe the delta's tensors",
				delta);
		goto out;
	}
	for (uint32_t i = 0; i < d.ntensors; i++) {
		const struct proto_delta_tensor *t = &d.tensors[i];
		const struct proto_tensor *ct = &c.model.tensors[i];
		if (ct->nelem != t->nelem || proto_dtype_size(ct->dtype) != t->elsize) {
			rc = proto_errf(err, EINVAL, "%s: tensor %s: shape or dtype differs from the delta's",
					delta, ct->name);
			goto out;
		}
		if (t->parent != PROTO_DELTA_NONE &&
		    (a.model.tensors[t->parent].nelem != t->nelem ||
		     proto_dtype_size(a.model.tensors[t->parent].dtype) != t->elsize)) {
			rc = proto_errf(err, EINVAL, "%s: tensor %s does not fit parent tensor %s",
					delta, ct->name, a.model.tensors[t->parent].name);
			goto out;
		}
	}
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", out, (long)getpid()) >= (int)sizeof(tmp)) {
		rc = proto_errf(err, ENAMETOOLONG, "%s: path too long", out);
		goto out;
	}
	fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	created = true;
	if (ftruncate(fd, (off_t)csize) != 0) {
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	omap = mmap(NULL, (size_t)csize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (omap == MAP_FAILED) {
		omap = NULL;
		rc = proto_errf(err, errno, "%s: mmap: %s", tmp, strerror(errno));
		goto out;
	}
	memcpy(omap, d.child_header, d.child_header_len);
	for (uint32_t i = 0; i < d.ntensors; i++) {
		const struct proto_delta_tensor *t = &d.tensors[i];
		bufs[i] = omap + c.offsets[i];
		if (t->parent != PROTO_DELTA_NONE && t->nelem > 0)
			memcpy(bufs[i], pa[t->parent], t->nelem * t->elsize);
	}
	{
		struct proto_delta_parent par = {a.header, a.header_len, a.model.ntensors, psums};
		rc = proto_delta_apply(&d, &par, bufs, threads, err);
		if (rc != 0) {
			proto_err_prefix(err, "%s", delta);
			goto out;
		}
	}
	if (msync(omap, (size_t)csize, MS_SYNC) != 0 || fsync(fd) != 0) {
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	munmap(omap, (size_t)csize);
	omap = NULL;
	if (close(fd) != 0) {
		fd = -1;
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto out;
	}
	fd = -1;
	if (rename(tmp, out) != 0) {
		rc = proto_errf(err, errno, "%s: %s", out, strerror(errno));
		goto out;
	}
	created = false;
	rc = 0;
out:
	if (omap != NULL)
		munmap(omap, (size_t)csize);
	if (fd >= 0)
		close(fd);
	if (created)
		unlink(tmp);
	if (dmap != NULL)
		munmap((void *)dmap, dlen);
	free(pa);
	free(psums);
	free(bufs);
	proto_delta_fini(&d);
	proto_st_fini(&c);
	proto_st_fini(&a);
	return rc;
}
