/* safetensors: strict header parser, read-only mapping, writer. */
#include "proto/safetensors.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/params.h"

/* One tensor entry while parsing, before sorting by offset. */
struct entry {
	const char *name; /* borrowed from the JSON */
	enum proto_dtype dt;
	uint32_t ndim;
	uint64_t shape[PROTO_MAX_DIMS];
	uint64_t begin, end;
	size_t order; /* position in the JSON, to keep ties stable */
};

static int cmp_entry(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;

	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return x->order < y->order ? -1 : x->order > y->order;
}

static int get_u64(json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int parse_entry(const char *what, const char *name, json_t *v,
		       struct entry *e, struct proto_err *err)
{
	json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
	json_t *offs = json_object_get(v, "data_offsets");
	const char *dts;

	e->name = name;
	if (!json_is_object(v))
		return proto_errf(err, EINVAL, "%s: tensor '%.80s' is not an object", what, name);
	if (json_object_size(v) != 3 || dt == NULL || shape == NULL || offs == NULL)
		return proto_errf(err, EINVAL,
				  "%s: tensor '%.80s' must have exactly dtype, shape and data_offsets",
				  what, name);
	dts = json_string_value(dt);
	if (dts == NULL || proto_dtype_parse(dts, &e->dt) != 0 ||
	    strcmp(dts, proto_dtype_st_name(e->dt)) != 0)
		return proto_errf(err, EINVAL, "%s: tensor '%.80s': unsupported dtype '%.40s'",
				  what, name, dts ? dts : "(not a string)");
	if (!json_is_array(shape) || json_array_size(shape) > PROTO_MAX_DIMS)
		return proto_errf(err, EINVAL,
				  "%s: tensor '%.80s': shape must be an array of at most %d sizes",
				  what, name, PROTO_MAX_DIMS);
	e->ndim = (uint32_t)json_array_size(shape);
	for (uint32_t d = 0; d < e->ndim; d++)
		if (get_u64(json_array_get(shape, d), &e->shape[d]) != 0)
			return proto_errf(err, EINVAL, "%s: tensor '%.80s': shape[%u] is not a size",
					  what, name, d);
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    get_u64(json_array_get(offs, 0), &e->begin) != 0 ||
	    get_u64(json_array_get(offs, 1), &e->end) != 0)
		return proto_errf(err, EINVAL,
				  "%s: tensor '%.80s': data_offsets must be [begin, end]", what, name);
	if (e->end < e->begin)
		return proto_errf(err, EINVAL, "%s: tensor '%.80s': data_offsets end %llu < begin %llu",
				  what, name, (unsigned long long)e->end,
				  (unsigned long long)e->begin);
	return 0;
}

static int check_metadata(const char *what, json_t *md, struct proto_err *err)
{
	const char *k;
	json_t *v;

	if (!json_is_object(md))
		return proto_errf(err, EINVAL, "%s: __metadata__ must be an object", what);
	json_object_foreach(md, k, v) {
		if (!json_is_string(v))
			return proto_errf(err, EINVAL, "%s: __metadata__.%.80s is not a string",
					  what, k);
	}
	return 0;
}

int proto_st_parse(const uint8_t *buf, size_t len, uint64_t file_size,
		   const char *what, struct proto_st *out, struct proto_err *err)
{
	uint64_t n, data_len, at = 0;
	struct entry *ents = NULL;
	size_t nents = 0, cap;
	json_error_t jerr;
	json_t *root = NULL, *v;
	const char *k;
	int rc;

	memset(out, 0, sizeof(*out));
	proto_model_init(&out->model);
	if (len > file_size)
		len = (size_t)file_size;
	if (len < 8)
		return proto_errf(err, EINVAL, "%s: %zu bytes, too short for a safetensors header",
				  what, len);
	memcpy(&n, buf, 8);
	n = le64toh(n);
	if (n > proto_param(PROTO_PARAM_ST_HEADER_MAX))
		return proto_errf(err, EFBIG, "%s: header size %llu exceeds the %llu-byte limit",
				  what, (unsigned long long)n,
				  (unsigned long long)proto_param(PROTO_PARAM_ST_HEADER_MAX));
	if (n > file_size - 8)
		return proto_errf(err, EINVAL, "%s: header size %llu runs past the %llu-byte file",
				  what, (unsigned long long)n, (unsigned long long)file_size);
	if (n > len - 8)
		return proto_errf(err, EINVAL, "%s: header truncated (%zu of %llu bytes present)",
				  what, len - 8, (unsigned long long)n);
	if (n < 2 || buf[8] != '{')
		return proto_errf(err, EINVAL, "%s: header is not a JSON object", what);
	data_len = file_size - 8 - n;
	root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
	if (root == NULL)
		return proto_errf(err, EINVAL, "%s: header JSON, column %d: %s", what,
				  jerr.column, jerr.text);
	if (!json_is_object(root)) {
		rc = proto_errf(err, EINVAL, "%s: header is not a JSON object", what);
		goto fail;
	}
	cap = json_object_size(root);
	if (cap > PROTO_MAX_TENSORS) {
		rc = proto_errf(err, E2BIG, "%s: %zu tensors, at most %u supported", what, cap,
				PROTO_MAX_TENSORS);
		goto fail;
	}
	ents = calloc(cap ? cap : 1, sizeof(*ents));
	if (ents == NULL) {
		rc = proto_errf(err, ENOMEM, "%s: out of memory", what);
		goto fail;
	}
	json_object_foreach(root, k, v) {
		if (strcmp(k, "__metadata__") == 0) {
			rc = check_metadata(what, v, err);
			if (rc != 0)
				goto fail;
			out->metadata = json_incref(v);
			continue;
		}
		rc = parse_entry(what, k, v, &ents[nents], err);
		if (rc != 0)
			goto fail;
		ents[nents].order = nents;
		nents++;
	}
	qsort(ents, nents, sizeof(*ents), cmp_entry);
	for (size_t i = 0; i < nents; i++) {
		struct entry *e = &ents[i];
		struct proto_tensor *t;

		rc = proto_model_add(&out->model, e->name, e->dt, e->ndim, e->shape, err);
		if (rc != 0) {
			proto_err_prefix(err, "%s", what);
			goto fail;
		}
		t = &out->model.tensors[out->model.ntensors - 1];
		if (e->end - e->begin != t->nbytes) {
			rc = proto_errf(err, EINVAL,
					"%s: tensor '%.80s': data_offsets span %llu bytes, its shape needs %llu",
					what, e->name, (unsigned long long)(e->end - e->begin),
					(unsigned long long)t->nbytes);
			goto fail;
		}
		if (e->begin != at) {
			rc = proto_errf(err, EINVAL,
					"%s: tensor '%.80s' at offset %llu: %s at %llu", what, e->name,
					(unsigned long long)e->begin,
					e->begin < at ? "overlaps the tensor ending" : "leaves a hole from",
					(unsigned long long)at);
			goto fail;
		}
		if (e->end > data_len) {
			rc = proto_errf(err, EINVAL,
					"%s: tensor '%.80s' ends at %llu, past the %llu-byte data region",
					what, e->name, (unsigned long long)e->end,
					(unsigned long long)data_len);
			goto fail;
		}
		at = e->end;
	}
	if (at != data_len) {
		rc = proto_errf(err, EINVAL, "%s: tensors cover %llu of the %llu data bytes", what,
				(unsigned long long)at, (unsigned long long)data_len);
		goto fail;
	}
	rc = proto_model_finish(&out->model, err);
	if (rc != 0) {
		proto_err_prefix(err, "%s", what);
		goto fail;
	}
	out->offsets = malloc((nents ? nents : 1) * sizeof(*out->offsets));
	out->header = malloc(8 + (size_t)n);
	if (out->offsets == NULL || out->header == NULL) {
		rc = proto_errf(err, ENOMEM, "%s: out of memory", what);
		goto fail;
	}
	for (size_t i = 0; i < nents; i++)
		out->offsets[i] = 8 + n + ents[i].begin;
	memcpy(out->header, buf, 8 + (size_t)n);
	out->header_len = 8 + (size_t)n;
	out->file_size = file_size;
	free(ents);
	json_decref(root);
	return 0;
fail:
	free(ents);
	json_decref(root);
	proto_st_fini(out);
	return rc;
}

int proto_st_open(const char *path, struct proto_st *out, struct proto_err *err)
{
	struct stat st;
	void *map = NULL;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	fd = proto_open_regular(path, &st, err);
	if (fd < 0)
		return fd;
	if (st.st_size < 8) {
		rc = proto_errf(err, EINVAL, "%s: %lld bytes, too short for a safetensors header",
				path, (long long)st.st_size);
		goto fail;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		map = NULL;
		rc = proto_errf(err, errno, "%s: mmap: %s", path, strerror(errno));
		goto fail;
	}
	rc = proto_st_parse(map, (size_t)st.st_size, (uint64_t)st.st_size, path, out, err);
	if (rc != 0)
		goto fail;
	out->map = map;
	out->map_len = (size_t)st.st_size;
	out->fd = fd;
	return 0;
fail:
	if (map != NULL)
		munmap(map, (size_t)st.st_size);
	if (fd >= 0)
		close(fd);
	return rc;
}

void proto_st_fini(struct proto_st *st)
{
	proto_model_fini(&st->model);
	free(st->offsets);
	free(st->header);
	json_decref(st->metadata);
	if (st->map != NULL) {
		munmap((void *)st->map, st->map_len);
		close(st->fd);
	}
	memset(st, 0, sizeof(*st));
}

const uint8_t *proto_st_tensor(const struct proto_st *st, uint32_t i)
{
	if (st->map == NULL || i >= st->model.ntensors)
		return NULL;
	return st->map + st->offsets[i];
}

int proto_st_read(const struct proto_st *st, uint32_t i, uint64_t off, size_t len, uint8_t *out,
		  struct proto_err *err)
{
	if (st->map == NULL || i >= st->model.ntensors)
		return proto_errf(err, EINVAL, "tensor %u: not in an opened file", i);
	const struct proto_tensor *t = &st->model.tensors[i];
	if (off > t->nbytes || len > t->nbytes - off)
		return proto_errf(err, EINVAL, "tensor '%s': bytes [%llu, +%zu) are outside its %llu",
				  t->name, (unsigned long long)off, len, (unsigned long long)t->nbytes);
	uint64_t at = st->offsets[i] + off;
	for (size_t got = 0; got < len;) {
		ssize_t n = pread(st->fd, out + got, len - got, (off_t)(at + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return proto_errf(err, errno, "tensor '%s': reading %zu bytes at file offset %llu: %s",
					  t->name, len - got, (unsigned long long)(at + got), strerror(errno));
		if (n == 0) {
			struct stat now;
			long long size = fstat(st->fd, &now) == 0 ? (long long)now.st_size : -1;
			return proto_errf(err, EIO,
					  "tensor '%s': the file is %lld bytes now, %llu when opened "
					  "(truncated since): byte %llu is past its end",
					  t->name, size, (unsigned long long)st->file_size,
					  (unsigned long long)(at + got));
		}
		got += (size_t)n;
	}
	return 0;
}

int proto_st_header_build(const struct proto_model *m, const json_t *metadata,
			  uint8_t **out, size_t *len, struct proto_err *err)
{
	json_t *root = json_object();
	uint64_t at = 0, n;
	size_t jlen, padded;
	char *txt = NULL;
	uint8_t *buf;
	int rc;

	*out = NULL;
	*len = 0;
	if (root == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if (metadata != NULL &&
	    json_object_set_new(root, "__metadata__", json_deep_copy(metadata)) != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	for (uint32_t i = 0; i < m->ntensors; i++) {
		const struct proto_tensor *t = &m->tensors[i];
		json_t *shape = json_array(), *e;

		for (uint32_t d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
		e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", proto_dtype_st_name(t->dtype),
			      "shape", shape, "data_offsets", (json_int_t)at,
			      (json_int_t)(at + t->nbytes));
		if (e == NULL || json_object_set_new(root, t->name, e) != 0) {
			rc = proto_errf(err, ENOMEM, "tensor %s: cannot build its header entry",
					t->name);
			goto fail;
		}
		at += t->nbytes;
	}
	txt = json_dumps(root, JSON_COMPACT);
	if (txt == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	jlen = strlen(txt);
	padded = (8 + jlen + 7) / 8 * 8;
	buf = malloc(padded);
	if (buf == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	n = htole64((uint64_t)(padded - 8));
	memcpy(buf, &n, 8);
	memcpy(buf + 8, txt, jlen);
	memset(buf + 8 + jlen, ' ', padded - 8 - jlen);
	*out = buf;
	*len = padded;
	rc = 0;
fail:
	free(txt);
	json_decref(root);
	return rc;
}

int proto_st_write(const char *path, const struct proto_model *m,
		   const json_t *metadata, const void *const *data,
		   struct proto_err *err)
{
	char tmp[4096];
	uint8_t *hdr = NULL;
	size_t hlen;
	FILE *f = NULL;
	int rc;

	rc = proto_st_header_build(m, metadata, &hdr, &hlen, err);
	if (rc != 0)
		return rc;
	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp)) {
		rc = proto_errf(err, ENAMETOOLONG, "%s: path too long", path);
		goto fail;
	}
	f = fopen(tmp, "wbx");
	if (f == NULL) {
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	if (fwrite(hdr, 1, hlen, f) != hlen)
		goto io;
	for (uint32_t i = 0; i < m->ntensors; i++)
		if (m->tensors[i].nbytes > 0 &&
		    fwrite(data[i], 1, m->tensors[i].nbytes, f) != m->tensors[i].nbytes)
			goto io;
	if (fflush(f) != 0 || fsync(fileno(f)) != 0)
		goto io;
	if (fclose(f) != 0) {
		f = NULL;
		goto io;
	}
	f = NULL;
	if (rename(tmp, path) != 0) {
		rc = proto_errf(err, errno, "%s: %s", path, strerror(errno));
		unlink(tmp);
		goto fail;
	}
	free(hdr);
	return 0;
io:
	rc = proto_errf(err, errno ? errno : EIO, "%s: %s", tmp, strerror(errno ? errno : EIO));
	if (f != NULL)
		fclose(f);
	unlink(tmp);
fail:
	free(hdr);
	return rc;
}
