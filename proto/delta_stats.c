/* Delta comparison: our codec against the usual encodings, on one pair. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "proto/delta_internal.h"

#define XOR_PIECE (1u << 20)

/* log2 of the binomial coefficient C(n, k). */
static double log2_binom(uint64_t n, uint64_t k)
{
	if (k == 0 || k == n)
		return 0;
	return (lgamma((double)n + 1) - lgamma((double)k + 1) - lgamma((double)(n - k) + 1)) /
	       log(2.0);
}

static double h0_bytes(const uint64_t *hist, size_t nsym)
{
	uint64_t total = 0;
	double bits = 0;

	for (size_t i = 0; i < nsym; i++)
		total += hist[i];
	for (size_t i = 0; i < nsym; i++)
		if (hist[i])
			bits -= (double)hist[i] * log2((double)hist[i] / (double)total);
	return bits / 8;
}

static inline uint64_t load(const uint8_t *p, uint32_t w)
{
	uint64_t x = 0;
	memcpy(&x, p, w);
	return x;
}

/* Counts, gap widths and the value histogram of one matched tensor. */
static void count_tensor(const uint8_t *a, const uint8_t *b, uint64_t n, uint32_t w,
			 struct proto_delta_report *r, uint64_t *h8, uint64_t *h16)
{
	uint64_t k = 0, prev = 0, maxgap = 0;

	for (uint64_t i = 0; i < n; i++) {
		uint64_t o = a ? load(a + i * w, w) : 0, nw = load(b + i * w, w);
		if (o == nw)
			continue;
		uint64_t z = delta__zz((nw - o) & delta__mask(w), w);
		if (w == 1)
			h8[z]++;
		else if (w == 2)
			h16[z]++;
		maxgap = PROTO_MAX(maxgap, i - prev);
		prev = i;
		k++;
	}
	r->nchanged += k;
	r->pos_bound += log2_binom(n, k) / 8;
	r->idx32_raw += k * (4 + w);
	r->gap16_raw += k * ((maxgap < 65536 ? 2 : 4) + w);
}

int proto_delta_compare(const struct proto_st *parent, const struct proto_st *child,
			const struct proto_delta_opts *o, struct proto_delta_report *r,
			struct proto_err *err)
{
	const struct proto_model *pm = &parent->model, *cm = &child->model;
	const uint8_t **pa = NULL, **pb = NULL;
	uint64_t *h8 = NULL, *h16 = NULL, maxbytes = 0;
	uint8_t *buf = NULL, *xbuf = NULL, *zout = NULL, *dst = NULL;
	ZSTD_CCtx *cx = NULL, *cp = NULL;
	bool narrow_only = true;
	size_t dlen, zcap, dcap;
	int rc;

	memset(r, 0, sizeof(*r));
	pa = malloc((pm->ntensors + 1) * sizeof(*pa));
	pb = malloc((cm->ntensors + 1) * sizeof(*pb));
	h8 = calloc(256, sizeof(*h8));
	h16 = calloc(65536, sizeof(*h16));
	xbuf = malloc(XOR_PIECE);
	zcap = ZSTD_CStreamOutSize();
	zout = malloc(zcap);
	cx = ZSTD_createCCtx();
	cp = ZSTD_createCCtx();
	if (!pa || !pb || !h8 || !h16 || !xbuf || !zout || !cx || !cp) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < pm->ntensors; i++)
		pa[i] = proto_st_tensor(parent, i);
	for (uint32_t i = 0; i < cm->ntensors; i++) {
		pb[i] = proto_st_tensor(child, i);
		maxbytes = PROTO_MAX(maxbytes, cm->tensors[i].nbytes);
	}
	/* Ours. */
	{
		struct proto_delta_version va = {pm, parent->header, parent->header_len, pa, NULL};
		struct proto_delta_version vb = {cm, child->header, child->header_len, pb, NULL};
		uint64_t t0 = proto_now_ns();
		rc = proto_delta_encode(&va, &vb, o, &buf, &dlen, &r->st, err);
		r->encode_s = (double)(proto_now_ns() - t0) / 1e9;
		if (rc != 0)
			goto out;
		r->ours = dlen;
	}
	dcap = ZSTD_compressBound(maxbytes);
	dst = malloc(dcap ? dcap : 1);
	if (dst == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	ZSTD_CCtx_setParameter(cx, ZSTD_c_compressionLevel, 1);
	r->ntensors = cm->ntensors;
	for (uint32_t i = 0; i < cm->ntensors; i++) {
		const struct proto_tensor *ct = &cm->tensors[i];
		uint32_t w = (uint32_t)proto_dtype_size(ct->dtype);
		int64_t pi = proto_model_find(pm, ct->name);
		const uint8_t *a = NULL;
		size_t z;

		if (o != NULL && o->progress != NULL)
			o->progress(o->progress_arg, i, cm->ntensors);
		if (pi >= 0 && pm->tensors[pi].dtype == ct->dtype && pm->tensors[pi].nelem == ct->nelem)
			a = pa[pi];
		narrow_only &= w <= 2;
		r->nelem += ct->nelem;
		count_tensor(a, pb[i], ct->nelem, w, r, h8, h16);
		/* XOR of the bytes, one zstd -1 stream over all tensors. */
		for (uint64_t off = 0; off < ct->nbytes; off += XOR_PIECE) {
			size_t n = (size_t)PROTO_MIN((uint64_t)XOR_PIECE, ct->nbytes - off);
			ZSTD_inBuffer in = {xbuf, n, 0};
			for (size_t q = 0; q < n; q++)
				xbuf[q] = (uint8_t)((a ? a[off + q] : 0) ^ pb[i][off + q]);
			while (in.pos < in.size) {
				ZSTD_outBuffer ob = {zout, zcap, 0};
				size_t ret = ZSTD_compressStream2(cx, &ob, &in, ZSTD_e_continue);
				if (ZSTD_isError(ret)) {
					rc = proto_errf(err, EIO, "zstd: %s", ZSTD_getErrorName(ret));
					goto out;
				}
				r->xor_zstd1 += ob.pos;
			}
		}
		/* zstd with the parent tensor as prefix, as --patch-from does. */
		ZSTD_CCtx_reset(cp, ZSTD_reset_session_and_parameters);
		ZSTD_CCtx_setParameter(cp, ZSTD_c_compressionLevel, 3);
		if (a != NULL && ct->nbytes > 0) {
			unsigned wlog = 10, wmax = (unsigned)ZSTD_cParam_getBounds(ZSTD_c_windowLog).upperBound;
			while (wlog < wmax && (1ull << wlog) < 2 * ct->nbytes)
				wlog++;
			ZSTD_CCtx_setParameter(cp, ZSTD_c_windowLog, (int)wlog);
			ZSTD_CCtx_setParameter(cp, ZSTD_c_enableLongDistanceMatching, 1);
			ZSTD_CCtx_refPrefix(cp, a, ct->nbytes);
		}
		z = ZSTD_compress2(cp, dst, dcap, pb[i], ct->nbytes);
		if (ZSTD_isError(z)) {
			rc = proto_errf(err, EIO, "zstd: %s", ZSTD_getErrorName(z));
			goto out;
		}
		r->zstd_patch += z;
	}
	for (;;) {
		ZSTD_inBuffer in = {xbuf, 0, 0};
		ZSTD_outBuffer ob = {zout, zcap, 0};
		size_t ret = ZSTD_compressStream2(cx, &ob, &in, ZSTD_e_end);
		if (ZSTD_isError(ret)) {
			rc = proto_errf(err, EIO, "zstd: %s", ZSTD_getErrorName(ret));
			goto out;
		}
		r->xor_zstd1 += ob.pos;
		if (ret == 0)
			break;
	}
	r->val_h0 = narrow_only ? h0_bytes(h8, 256) + h0_bytes(h16, 65536) : -1;
	rc = 0;
out:
	free(buf);
	free(pa);
	free(pb);
	free(h8);
	free(h16);
	free(xbuf);
	free(zout);
	free(dst);
	ZSTD_freeCCtx(cx);
	ZSTD_freeCCtx(cp);
	return rc;
}
