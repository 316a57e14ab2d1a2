/*
 * safetensors files: a strict reader of hostile input and a writer.
 *
 * Format: an 8-byte little-endian header size N, N bytes of JSON (an object
 * starting with '{', possibly padded with trailing spaces), then the data
 * region. Each JSON key other than "__metadata__" names a tensor:
 *   {"dtype":"BF16","shape":[4,4],"data_offsets":[begin,end]}
 * with offsets relative to the data region. "__metadata__" is an object of
 * strings and is kept as is.
 *
 * The reader checks, before trusting anything: N against a cap
 * (TESSERA_ST_HEADER_MAX, default 100 MB as in the reference implementation)
 * and against the file size, before allocating; the JSON (jansson, duplicate
 * keys refused); each entry has exactly dtype, shape and data_offsets; known
 * dtype (safetensors names only); at most PROTO_MAX_DIMS dims with a product
 * that does not overflow; end - begin == nelem * dtype size; and the tensors,
 * sorted by offset, cover the data region exactly: no hole, no overlap, nothing
 * past the end, nothing left over.
 *
 * The model's tensors are in data order (by begin offset; entries at the same
 * offset keep their JSON order), which is the order a reader streams them and
 * the order the digests of proto/delta.h use. The exact header bytes are kept
 * so that a copy of the file can be rebuilt byte for byte.
 */
#ifndef PROTO_SAFETENSORS_H
#define PROTO_SAFETENSORS_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/spec.h"
#include "proto/util.h"

struct proto_st {
	struct proto_model model; /* tensors in data order */
	uint64_t *offsets;        /* file offset of each tensor's first byte */
	uint8_t *header;          /* exact bytes [0, 8 + N): size and JSON */
	size_t header_len;        /* 8 + N */
	uint64_t file_size;
	json_t *metadata;         /* "__metadata__" object, or NULL */
	/* Set by proto_st_open: the whole file, mapped read-only, and kept
	 * open for proto_st_read (fd is valid while map is not NULL). */
	const uint8_t *map;
	size_t map_len;
	int fd;
};

/*
 * Parses the header of a safetensors file of file_size bytes whose first len
 * bytes are at buf (len must cover the header: 8 + N bytes; the data need not
 * be present). `what` names the file in errors. On failure *out is left empty
 * (nothing to free) and err says what is wrong in one line.
 */
int proto_st_parse(const uint8_t *buf, size_t len, uint64_t file_size,
		   const char *what, struct proto_st *out, struct proto_err *err);

/* Opens and maps a file read-only, then parses it. On failure *out is empty. */
int proto_st_open(const char *path, struct proto_st *out, struct proto_err *err);

/* Frees what parse/open allocated and unmaps the file; *st becomes empty.
 * Safe on an empty or already finished struct. */
void proto_st_fini(struct proto_st *st);

/* The data of tensor i inside the mapping (NULL when not opened from a file).
 * Not aligned: read it with memcpy. */
const uint8_t *proto_st_tensor(const struct proto_st *st, uint32_t i);

/*
 * Copies len bytes of tensor i, from byte off of its data, into out with
 * pread on the file kept open: no page of the mapping is touched (a copy
 * out of a fresh file mapping faults every page in, several times the cost
 * of the copy itself). -EINVAL when the range is outside the tensor or the
 * file was not opened; -EIO when the file ends before the range (truncated
 * since it was opened); err says which in one line, without the path. out
 * is undefined on failure.
 */
int proto_st_read(const struct proto_st *st, uint32_t i, uint64_t off, size_t len, uint8_t *out,
		  struct proto_err *err);

/*
 * Builds the header for tensors laid out back to back in model order, with
 * metadata (an object of strings, or NULL) first. The JSON is padded with
 * spaces so that the data region starts 8-byte aligned. *out is malloc'ed;
 * the caller frees it. On failure *out is NULL.
 */
int proto_st_header_build(const struct proto_model *m, const json_t *metadata,
			  uint8_t **out, size_t *len, struct proto_err *err);

/*
 * Writes a safetensors file atomically (temporary file, fsync, rename):
 * the header from proto_st_header_build, then data[i] (m->tensors[i].nbytes
 * bytes each). On failure path is unchanged.
 */
int proto_st_write(const char *path, const struct proto_model *m,
		   const json_t *metadata, const void *const *data,
		   struct proto_err *err);

#endif
