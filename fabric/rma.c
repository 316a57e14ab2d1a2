/* One-sided reads and writes of registered ranges. */
#include <errno.h>

#include "fabric/fab_internal.h"

static int rma_post(struct fab_ctx *ctx, struct fab_op *op, int kind,
		    struct fab_mr *lmr, size_t loff, size_t len, fi_addr_t peer,
		    const struct fab_rkey *rk, uint64_t roff, fab_cb cb)
{
	unsigned need = kind == FAB_OP_READ ? FAB_MR_READ : FAB_MR_WRITE;

	if (ctx->closing)
		return -ESHUTDOWN;
	if (op == NULL || lmr == NULL || rk == NULL || lmr->ctx != ctx ||
	    len == 0)
		return -EINVAL;
	if (!(lmr->access & need))
		return -EACCES;
	if (len > ctx->max_rma)
		return -EMSGSIZE;
	if (loff > lmr->len || len > lmr->len - loff)
		return -ERANGE;
	if (roff > rk->len || len > rk->len - roff ||
	    rk->addr + roff < rk->addr)
		return -ERANGE;

	fab__op_prepare(ctx, op, kind, cb);
	op->len = len;
	op->lbuf_ = (uint8_t *)lmr->buf + loff;
	op->desc_ = lmr->desc;
	op->peer_ = peer;
	op->raddr_ = rk->addr + roff;
	op->key_ = rk->key;
	return fab__submit(ctx, op);
}

int fab_read(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	     size_t loff, size_t len, fi_addr_t peer,
	     const struct fab_rkey *rk, uint64_t roff, fab_cb cb)
{
	return rma_post(ctx, op, FAB_OP_READ, lmr, loff, len, peer, rk, roff,
			cb);
}

int fab_write(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, size_t len, fi_addr_t peer,
	      const struct fab_rkey *rk, uint64_t roff, fab_cb cb)
{
	return rma_post(ctx, op, FAB_OP_WRITE, lmr, loff, len, peer, rk, roff,
			cb);
}

int fab_readv(struct fab_ctx *ctx, struct fab_op *op, struct fab_mr *lmr,
	      size_t loff, fi_addr_t peer, const struct fab_rkey *rk,
	      const struct fab_seg *segs, size_t n, fab_cb cb)
{
	size_t len = 0;

	if (ctx->closing)
		return -ESHUTDOWN;
	if (op == NULL || lmr == NULL || rk == NULL || segs == NULL ||
	    lmr->ctx != ctx || n == 0 || n > ctx->rma_segs)
		return -EINVAL;
	if (!(lmr->access & FAB_MR_READ))
		return -EACCES;
	for (size_t i = 0; i < n; i++) {
		if (segs[i].len == 0)
			return -EINVAL;
		if (segs[i].roff > rk->len || segs[i].len > rk->len - segs[i].roff ||
		    rk->addr + segs[i].roff < rk->addr)
			return -ERANGE;
		len += segs[i].len;
	}
	if (len > ctx->max_rma)
		return -EMSGSIZE;
	if (loff > lmr->len || len > lmr->len - loff)
		return -ERANGE;
	fab__op_prepare(ctx, op, FAB_OP_READ, cb);
	op->len = len;
	op->lbuf_ = (uint8_t *)lmr->buf + loff;
	op->desc_ = lmr->desc;
	op->peer_ = peer;
	op->raddr_ = rk->addr;
	op->key_ = rk->key;
	op->segs_ = segs;
	op->nsegs_ = (uint32_t)n;
	return fab__submit(ctx, op);
}
