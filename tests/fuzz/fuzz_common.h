/*
 * The fixed parent and child the delta fuzzer and the corpus tests share, and
 * the one-input harnesses. Header-only: included by tests/fuzz/fuzz_*.c and
 * tests/test_delta.c / tests/test_safetensors.c.
 *
 * The delta harness "fixes up" its input before parsing: it writes the
 * parent's digest and a correct header hash, so that mutations reach the
 * stream decoders and the apply instead of stopping at the hash check. After
 * a failed apply it requires the buffers to hold the parent's bytes again.
 */
#ifndef TESTS_FUZZ_COMMON_H
#define TESTS_FUZZ_COMMON_H

#include <errno.h>
#include <sodium.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/delta.h"
#include "proto/safetensors.h"
#include "proto/wsum.h"

#define FZ_MAX_BYTES (1u << 20) /* largest total a fuzzed delta may ask for */

struct fz_version {
	struct proto_model m;
	uint8_t *header;
	size_t header_len;
	uint8_t **data;
	uint64_t *sums;
};

static inline uint64_t fz_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * A small version with one tensor of each width plus an empty one. The child
 * changes a few elements of each (some by one step, some arbitrarily) and
 * adds a tensor the parent lacks. Deterministic; cannot fail except ENOMEM
 * (then it aborts: this is test code).
 */
static inline void fz_make(struct fz_version *v, bool child)
{
	static const struct {
		const char *name;
		enum proto_dtype dt;
		uint64_t n;
		bool child_only;
	} ts[] = {
		{"w.bf16", PROTO_DT_BF16, 1500, false}, {"w.f32", PROTO_DT_FP32, 300, false},
		{"w.u8", PROTO_DT_U8, 200, false},      {"w.i64", PROTO_DT_I64, 40, false},
		{"w.empty", PROTO_DT_FP16, 0, false},   {"w.new", PROTO_DT_FP16, 64, true},
	};
	uint64_t seed = 42, shape[1];

	memset(v, 0, sizeof(*v));
	proto_model_init(&v->m);
	for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
		if (ts[i].child_only && !child)
			continue;
		shape[0] = ts[i].n;
		if (proto_model_add(&v->m, ts[i].name, ts[i].dt, 1, shape, NULL) != 0)
			abort();
	}
	if (proto_model_finish(&v->m, NULL) != 0 ||
	    proto_st_header_build(&v->m, NULL, &v->header, &v->header_len, NULL) != 0)
		abort();
	v->data = calloc(v->m.ntensors, sizeof(*v->data));
	v->sums = calloc(v->m.ntensors, sizeof(*v->sums));
	if (v->data == NULL || v->sums == NULL)
		abort();
	for (uint32_t i = 0; i < v->m.ntensors; i++) {
		const struct proto_tensor *t = &v->m.tensors[i];
		v->data[i] = malloc(t->nbytes + 1);
		if (v->data[i] == NULL)
			abort();
		for (uint64_t b = 0; b < t->nbytes; b++)
			v->data[i][b] = (uint8_t)fz_rand(&seed);
		if (child) {
			size_t w = proto_dtype_size(t->dtype);
			for (uint64_t e = 0; e < t->nelem; e++) {
				uint64_t r = fz_rand(&seed) % 100;
				if (r < 3)
					v->data[i][e * w] = (uint8_t)(v->data[i][e * w] + 1);
				else if (r < 5)
					v->data[i][e * w + w - 1] ^= 0x80;
			}
		}
		v->sums[i] = proto_wsum(proto_dtype_size(t->dtype), v->data[i], t->nelem);
	}
}

static inline void fz_free(struct fz_version *v)
{
	for (uint32_t i = 0; i < v->m.ntensors; i++)
		free(v->data[i]);
	free(v->data);
	free(v->sums);
	free(v->header);
	proto_model_fini(&v->m);
	memset(v, 0, sizeof(*v));
}

/* Encodes the fixed pair (chunk_elems 0 = default). *out is malloc'ed. */
static inline int fz_encode(const struct fz_version *p, const struct fz_version *c,
			    uint32_t chunk_elems, uint8_t **out, size_t *len)
{
	struct proto_delta_version vp = {&p->m, p->header, p->header_len,
					 (const uint8_t *const *)p->data, p->sums};
	struct proto_delta_version vc = {&c->m, c->header, c->header_len,
					 (const uint8_t *const *)c->data, c->sums};
	struct proto_delta_opts o = {.chunk_elems = chunk_elems, .threads = 1};
	return proto_delta_encode(&vp, &vc, &o, out, len, NULL, NULL);
}

/* The fixed parent and child (built once, never freed). */
static inline const struct fz_version *fz_fixed(bool child)
{
	static struct fz_version parent, kid;
	static bool ready;

	if (!ready) {
		fz_make(&parent, false);
		fz_make(&kid, true);
		ready = true;
	}
	return child ? &kid : &parent;
}

/* Recomputes the header hash of a delta in place (no-op if too short). */
static inline void fz_rehash(uint8_t *buf, size_t len)
{
	uint64_t hlen;

	if (len < 48)
		return;
	memcpy(&hlen, buf + 40, 8);
	if (hlen > len - 40)
		return;
	crypto_generichash(buf + 8, 32, buf + 40, hlen, NULL, 0);
}

/*
 * Parses and applies one delta to the fixed parent. With fixup, the parent
 * digest and the header hash are rewritten first. Returns the result of
 * parse or apply (0 = applied); *matches (may be NULL) tells whether the
 * output equals the fixed child; err (may be NULL) gets the error. Aborts if
 * a failed apply leaves the buffers changed.
 */
static inline int fz_delta_one(const uint8_t *in, size_t len, bool fixup, bool *matches,
				struct proto_err *err)
{
	const struct fz_version *pp = fz_fixed(false), *cp = fz_fixed(true);
	struct proto_delta d;
	uint8_t *buf = malloc(len ? len : 1), **bufs = NULL, **snap = NULL;
	uint64_t total = 0;
	int rc;

	if (matches != NULL)
		*matches = false;
	if (buf == NULL)
		abort();
	memcpy(buf, in, len);
	if (fixup && len >= 120) {
		proto_delta_digest(pp->header, pp->header_len, pp->sums, pp->m.ntensors,
				   buf + 56);
		fz_rehash(buf, len);
	}
	rc = proto_delta_parse(buf, len, &d, err);
	if (rc != 0) {
		free(buf);
		return rc;
	}
	if (d.parent_ntensors != pp->m.ntensors) {
		rc = -EINVAL; /* apply refuses it; check before indexing the parent */
		goto out;
	}
	for (uint32_t i = 0; i < d.ntensors; i++) {
		uint64_t nb = d.tensors[i].nelem * d.tensors[i].elsize;
		total += nb;
		if (total > FZ_MAX_BYTES) {
			rc = -E2BIG;
			goto out;
		}
		if (d.tensors[i].parent != PROTO_DELTA_NONE &&
		    pp->m.tensors[d.tensors[i].parent].nbytes != nb) {
			rc = -EINVAL; /* the file layer refuses this before apply */
			goto out;
		}
	}
	bufs = calloc(d.ntensors + 1, sizeof(*bufs));
	snap = calloc(d.ntensors + 1, sizeof(*snap));
	if (bufs == NULL || snap == NULL)
		abort();
	for (uint32_t i = 0; i < d.ntensors; i++) {
		uint64_t nb = d.tensors[i].nelem * d.tensors[i].elsize;
		bufs[i] = calloc(1, nb + 1);
		snap[i] = malloc(nb + 1);
		if (bufs[i] == NULL || snap[i] == NULL)
			abort();
		if (d.tensors[i].parent != PROTO_DELTA_NONE)
			memcpy(bufs[i], pp->data[d.tensors[i].parent], nb);
		memcpy(snap[i], bufs[i], nb);
	}
	{
		struct proto_delta_parent par = {pp->header, pp->header_len, pp->m.ntensors,
						 pp->sums};
		rc = proto_delta_apply(&d, &par, bufs, 1, err);
	}
	for (uint32_t i = 0; i < d.ntensors; i++) {
		uint64_t nb = d.tensors[i].nelem * d.tensors[i].elsize;
		if (rc != 0 && memcmp(bufs[i], snap[i], nb) != 0) {
			fprintf(stderr, "fz_delta_one: failed apply changed tensor %u\n", i);
			abort();
		}
	}
	if (rc == 0 && matches != NULL && d.ntensors == cp->m.ntensors) {
		*matches = true;
		for (uint32_t i = 0; i < d.ntensors; i++)
			if (d.tensors[i].nelem != cp->m.tensors[i].nelem ||
			    memcmp(bufs[i], cp->data[i], cp->m.tensors[i].nbytes) != 0)
				*matches = false;
	}
out:
	for (uint32_t i = 0; bufs != NULL && i < d.ntensors; i++) {
		free(bufs[i]);
		free(snap[i]);
	}
	free(bufs);
	free(snap);
	proto_delta_fini(&d);
	free(buf);
	return rc;
}

/* Parses one safetensors file held in memory; checks the invariants of a
 * successful parse (aborts if one fails). Returns the parse result. */
static inline int fz_safetensors_one(const uint8_t *in, size_t len)
{
	struct proto_st st;
	uint64_t covered = 0;
	int rc = proto_st_parse(in, len, len, "fuzz", &st, NULL);

	if (rc != 0)
		return rc;
	for (uint32_t i = 0; i < st.model.ntensors; i++) {
		if (st.offsets[i] < st.header_len || st.offsets[i] + st.model.tensors[i].nbytes > len)
			abort();
		covered += st.model.tensors[i].nbytes;
	}
	if (covered != len - st.header_len || memcmp(st.header, in, st.header_len) != 0)
		abort();
	proto_st_fini(&st);
	return 0;
}

/* The input's body (all but a trailing signer and signature when it is long
 * enough for them) with pk appended and signed by sk, as a manifest or an
 * addendum ends: so that mutations reach the checks behind the signature.
 * *out is malloc'ed (NULL on ENOMEM). */
static inline void fz_resign(const uint8_t *in, size_t len, const uint8_t *pk, const uint8_t *sk,
			     uint8_t **out, size_t *outlen)
{
	const size_t tail = crypto_sign_PUBLICKEYBYTES + crypto_sign_BYTES;
	size_t body = len >= tail ? len - tail : len;

	*outlen = body + tail;
	if ((*out = malloc(body + tail)) == NULL)
		return;
	memcpy(*out, in, body);
	memcpy(*out + body, pk, crypto_sign_PUBLICKEYBYTES);
	crypto_sign_detached(*out + body + crypto_sign_PUBLICKEYBYTES, NULL, *out,
			     body + crypto_sign_PUBLICKEYBYTES, sk);
}

#endif
