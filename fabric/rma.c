/* One-sided reads and writes of registered ranges. */
#include <errno.h>

#include "fabric/fab_internal.h"

/* Posts an op of kind: the remote ranges segs[0..n) of rk, back to back
 * at lmr + loff. One range is a plain read or write (segs not kept); a
 * gathering read keeps segs (fab_readv). */
static int rma_post(struct fab_ctx *ctx, struct fab_op *op, int kind,
		    struct fab_mr *lmr, size_t loff, fi_addr_t peer,
		    const struct fab_rkey *rk, const struct fab_seg *segs,
		    size_t n, bool gather, fab_cb cb)
{
	unsigned need = kind == FAB_OP_READ ? FAB_MR_READ : FAB_MR_WRITE;
	size_t len = 0;

	if (ctx->closing)
		return -ESHUTDOWN;
	if (op == NULL || lmr == NULL || rk == NULL || segs == NULL ||
	    lmr->ctx != ctx || n == 0 || (gather && n > ctx->rma_segs))
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (segs[i].len == 0)
			return -EINVAL;
		len += segs[i].len;
	}
	if (!(lmr->access & need))
		return -EACCES;
	if (len > ctx->max_rma)
		return -EMSGSIZE;
	if (loff > lmr->len || len > lmr->len - loff)
		return -ERANGE;
	for (size_t i = 0; i < n; i++)
		if (segs[i].roff > rk->len || segs[i].len > rk->len - segs[i].roff ||
		    rk->addr + segs[i].roff < rk->addr)
			return -ERANGE;

	fab__op_prepare(ctx, op, kind, cb);
	op->len = len;
	op->lbuf_ = (uint8_t *)lmr->buf + loff;
	op->desc_ = lmr->desc;
	op->peer_ = peer;
	op->raddr_ = rk->addr + (gather ? 0 : segs[0].roff);
	op->key_ = rk->key;
	if (gather) {
		op->segs_ = segs;
		op->nsegs_ = (uint32_t)n;
	}
	return fab__submit(ctx, op);
}

int fab_read(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	     size_t loff, size_t len, fi_addr_t peer,
	     const struct fab_rkey *rk, uint64_t roff, fab_cb cb)
{
	struct fab_seg one = {roff, len};

	return rma_post(ctx, op, FAB_OP_READ, lmr, loff, peer, rk, &one, 1,
			false, cb);
}

int fab_write(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, size_t len, fi_addr_t peer,
	      const struct fab_rkey *rk, uint64_t roff, fab_cb cb)
{
	struct fab_seg one = {roff, len};

	return rma_post(ctx, op, FAB_OP_WRITE, lmr, loff, peer, rk, &one, 1,
			false, cb);
}

int fab_readv(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, fi_addr_t peer, const struct fab_rkey *rk,
	      const struct fab_seg *segs, size_t n, fab_cb cb)
{
	return rma_post(ctx, op, FAB_OP_READ, lmr, loff, peer, rk, segs, n,
			true, cb);
}
