/* Deltas of one parcel in destination-local coordinates (see proto/delta.h). */
#include "proto/delta.h"
#include "proto/delta_internal.h"
#include "proto/wsum.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parcel deltas carry no header bytes (a non-NULL empty one for memcpy). */
static const uint8_t no_header[1];

void proto_dparcel_fini(struct proto_dparcel *d)
{
	free(d->pieces);
	proto_model_fini(&d->model);
	memset(d, 0, sizeof(*d));
}

/* Appends a piece, growing the array. */
static int add_piece(struct proto_dparcel *d, size_t *cap, const struct proto_dpiece *pc)
{
	if (d->npieces == *cap) {
		size_t ncap = *cap ? 2 * *cap : 16;
		struct proto_dpiece *np = realloc(d->pieces, ncap * sizeof(*np));
		if (np == NULL)
			return -ENOMEM;
		d->pieces = np;
		*cap = ncap;
	}
	d->pieces[d->npieces++] = *pc;
	return 0;
}

int proto_dparcel_build(const struct proto_model *m, const struct proto_plan *p,
			const struct proto_parcel *pc, const struct proto_layout *dst,
			struct proto_dparcel *out, struct proto_err *err)
{
	const struct proto_rank *rk = &dst->ranks[pc->dst_rank];
	struct proto_dpiece cur = {0};
	bool have = false;
	size_t cap = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	m = proto_layout_model(m, dst);
	proto_model_init(&out->model);
	for (uint64_t s = pc->seg0; s < pc->seg0 + pc->nsegs; s++) {
		const struct proto_segment *sg = &p->segs[s];
		uint32_t w = (uint32_t)proto_dtype_size(m->tensors[sg->tensor].dtype);
		uint64_t base = rk->locals[sg->dst_local].offset;
		for (uint64_t k = sg->run0; k < sg->run0 + sg->nruns; k++) {
			const struct proto_run *ru = &p->runs[k];
			if (ru->len == 0)
				continue;
			if (ru->len % w != 0 || ru->dst_off % w != 0) {
				rc = proto_errf(err, EINVAL,
						"parcel %u->%u: a run of %llu bytes is not whole %u-byte elements",
						pc->src_rank, pc->dst_rank, (unsigned long long)ru->len, w);
				goto fail;
			}
			/* Runs adjacent in the payload and in the destination, of the
			 * same element width, make one piece. */
			if (have && cur.elsize == w && cur.pay_off + cur.len == ru->pay_off &&
			    cur.dst_off + cur.len == base + ru->dst_off) {
				cur.len += ru->len;
				continue;
			}
			if (have && (rc = add_piece(out, &cap, &cur)) != 0)
				goto oom;
			cur = (struct proto_dpiece){ru->pay_off, base + ru->dst_off, ru->len, w};
			have = true;
		}
	}
	if (have && (rc = add_piece(out, &cap, &cur)) != 0)
		goto oom;
	for (uint32_t i = 0; i < out->npieces; i++) {
		const struct proto_dpiece *pp = &out->pieces[i];
		enum proto_dtype dt = pp->elsize == 1 ? PROTO_DT_U8 :
				      pp->elsize == 2 ? PROTO_DT_U16 :
				      pp->elsize == 4 ? PROTO_DT_U32 : PROTO_DT_U64;
		uint64_t shape[1] = {pp->len / pp->elsize};
		char name[32];
		snprintf(name, sizeof(name), "p%u", i);
		if ((rc = proto_model_add(&out->model, name, dt, 1, shape, err)) != 0)
			goto fail;
	}
	if ((rc = proto_model_finish(&out->model, err)) != 0)
		goto fail;
	return 0;
oom:
	rc = proto_errf(err, ENOMEM, "parcel %u->%u: out of memory", pc->src_rank, pc->dst_rank);
fail:
	proto_dparcel_fini(out);
	return rc;
}

int proto_dparcel_encode_at(const struct proto_dparcel *d, const uint8_t *const *parent,
			    const uint8_t *const *child, const struct proto_delta_opts *o,
			    uint8_t **out, size_t *out_len, struct proto_delta_stats *st,
			    struct proto_err *err)
{
	struct proto_delta_version pv = {&d->model, no_header, 0, parent,
					 o ? o->parent_sums : NULL};
	struct proto_delta_version cv = {&d->model, no_header, 0, child, NULL};

	return proto_delta_encode(&pv, &cv, o, out, out_len, st, err);
}

int proto_dparcel_encode(const struct proto_dparcel *d, const uint8_t *parent,
			 const uint8_t *child, const struct proto_delta_opts *o, uint8_t **out,
			 size_t *out_len, struct proto_delta_stats *st, struct proto_err *err)
{
	const uint8_t **pd = malloc(((size_t)d->npieces + 1) * sizeof(*pd));
	const uint8_t **cd = malloc(((size_t)d->npieces + 1) * sizeof(*cd));
	int rc;

	*out = NULL;
	*out_len = 0;
	if (pd == NULL || cd == NULL) {
		free(pd);
		free(cd);
		return proto_errf(err, ENOMEM, "delta encode: out of memory");
	}
	for (uint32_t i = 0; i < d->npieces; i++) {
		pd[i] = parent + d->pieces[i].pay_off;
		cd[i] = child + d->pieces[i].pay_off;
	}
	rc = proto_dparcel_encode_at(d, pd, cd, o, out, out_len, st, err);
	free(pd);
	free(cd);
	return rc;
}

void proto_dparcel_sums(const struct proto_dparcel *d, const uint8_t *block, uint64_t *sums)
{
	for (uint32_t i = 0; i < d->npieces; i++) {
		const struct proto_dpiece *pp = &d->pieces[i];
		sums[i] = proto_wsum(pp->elsize, block + pp->dst_off, pp->len / pp->elsize);
	}
}

void proto_dparcel_summer_init(struct proto_dparcel_summer *s, const struct proto_dparcel *d,
			       uint64_t *sums)
{
	*s = (struct proto_dparcel_summer){.d = d, .sums = sums};
	for (uint32_t i = 0; i < d->npieces; i++)
		sums[i] = 0; /* the empty piece's */
}

void proto_dparcel_summer_feed(struct proto_dparcel_summer *s, const uint8_t *payload,
			       uint64_t upto)
{
	while (s->k < s->d->npieces) {
		const struct proto_dpiece *pp = &s->d->pieces[s->k];
		if (upto <= pp->pay_off)
			return;
		uint64_t avail = PROTO_MIN(upto - pp->pay_off, pp->len);
		avail -= avail % pp->elsize; /* an element cut by upto waits */
		if (avail > s->done) {
			uint64_t part = proto_wsum(pp->elsize, payload + pp->pay_off + s->done,
						   (avail - s->done) / pp->elsize);
			s->sums[s->k] = proto_wsum_combine(s->sums[s->k], s->done / pp->elsize, part);
			s->done = avail;
		}
		if (s->done < pp->len)
			return;
		s->k++;
		s->done = 0;
	}
}

/* dl speaks of parcel d's pieces, one tensor per piece in order, with
 * their element sizes and counts: 0, or -EINVAL with err set. */
int delta__match_parcel(const struct proto_dparcel *d, const struct proto_delta *dl,
			struct proto_err *err)
{
	if (dl->ntensors != d->npieces || dl->parent_ntensors != d->npieces)
		return proto_errf(err, EINVAL, "delta has %u pieces, the parcel %u", dl->ntensors,
				  d->npieces);
	for (uint32_t i = 0; i < d->npieces; i++) {
		const struct proto_dpiece *pp = &d->pieces[i];
		const struct proto_delta_tensor *t = &dl->tensors[i];
		if (t->parent != i || t->elsize != pp->elsize || t->nelem != pp->len / pp->elsize)
			return proto_errf(err, EINVAL, "delta piece %u does not match the parcel's", i);
	}
	return 0;
}

/* apply_sums, with the parent's checksums from the delta itself when sums
 * is NULL; child_sums (may be NULL) receives the verified child's. */
static int apply_with(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
		      uint8_t *block, const uint64_t *sums, uint64_t *child_sums, bool touched,
		      unsigned threads, struct proto_err *err)
{
	struct proto_delta dl;
	uint8_t **bufs = NULL;
	uint64_t *own = NULL;
	int rc;

	rc = proto_delta_parse(delta, len, &dl, err);
	if (rc != 0)
		return rc;
	if ((rc = delta__match_parcel(d, &dl, err)) != 0)
		goto out;
	if (touched && !(dl.flags & PROTO_DELTA_F_TOUCHED)) {
		rc = proto_errf(err, ENOTSUP, "delta carries no touched checksums");
		goto out;
	}
	bufs = malloc(((size_t)d->npieces + 1) * sizeof(*bufs));
	if (sums == NULL && (own = malloc(((size_t)d->npieces + 1) * sizeof(*own))) != NULL) {
		for (uint32_t i = 0; i < d->npieces; i++)
			own[i] = dl.tensors[i].parent_sum;
		sums = own;
	}
	if (bufs == NULL || sums == NULL) {
		rc = proto_errf(err, ENOMEM, "delta apply: out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < d->npieces; i++)
		bufs[i] = block + d->pieces[i].dst_off;
	struct proto_delta_parent par = {no_header, 0, d->npieces, sums};
	rc = proto_delta_apply(&dl, &par, bufs, threads, err);
	for (uint32_t i = 0; rc == 0 && child_sums != NULL && i < d->npieces; i++)
		child_sums[i] = dl.tensors[i].child_sum;
out:
	free(own);
	free(bufs);
	proto_delta_fini(&dl);
	return rc;
}

int proto_dparcel_apply_sums(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			     uint8_t *block, const uint64_t *sums, unsigned threads,
			     struct proto_err *err)
{
	return apply_with(d, delta, len, block, sums, NULL, false, threads, err);
}

int proto_dparcel_apply_trusted(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
				uint8_t *block, unsigned threads, struct proto_err *err)
{
	return apply_with(d, delta, len, block, NULL, NULL, false, threads, err);
}

int proto_dparcel_apply_known(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			      uint8_t *block, const uint64_t *sums, uint64_t *child_sums,
			      unsigned threads, struct proto_err *err)
{
	uint64_t *own = NULL;
	int rc;

	if (sums == NULL) {
		own = malloc(((size_t)d->npieces + 1) * sizeof(*own));
		if (own == NULL)
			return proto_errf(err, ENOMEM, "delta apply: out of memory");
		proto_dparcel_sums(d, block, own);
	}
	rc = apply_with(d, delta, len, block, own != NULL ? own : sums, child_sums, own == NULL,
			threads, err);
	free(own);
	return rc;
}

int proto_dparcel_apply(const struct proto_dparcel *d, const uint8_t *delta, size_t len,
			uint8_t *block, unsigned threads, struct proto_err *err)
{
	uint64_t *sums = malloc(((size_t)d->npieces + 1) * sizeof(*sums));
	int rc;

	if (sums == NULL)
		return proto_errf(err, ENOMEM, "delta apply: out of memory");
	/* The parent's checksums come from the bytes the child is built on,
	 * so a damaged parent is refused, not patched. */
	proto_dparcel_sums(d, block, sums);
	rc = proto_dparcel_apply_sums(d, delta, len, block, sums, threads, err);
	free(sums);
	return rc;
}
