/* Tagged control messages, copied through registered message slots. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"
#include "proto/util.h"

int fab__slots_init(struct fab_ctx *ctx, unsigned n)
{
	int ret;

	ctx->slab = calloc(n, FAB_MSG_MAX);
	ctx->free_slots = calloc(n, sizeof(*ctx->free_slots));
	if (ctx->slab == NULL || ctx->free_slots == NULL) {
		ret = -ENOMEM;
		goto fail;
	}
	/* Registered only where the provider needs local buffers registered
	 * (FI_MR_LOCAL): rxm gives FI_SEND regions remote read access (its
	 * read rendezvous), and message buffers are nothing a peer should
	 * read. Else the slab has no key at all. */
	if (ctx->mr_mode & FI_MR_LOCAL) {
		ret = fab__mr_reg_private(ctx, ctx->slab,
					  (size_t)n * FAB_MSG_MAX,
					  FI_SEND | FI_RECV, &ctx->slab_mr);
		if (ret != 0)
			goto fail;
	}
	for (unsigned i = 0; i < n; i++)
		ctx->free_slots[i] = (int)(n - 1 - i);
	ctx->nslots = n;
	ctx->nfree = n;
	return 0;

fail:
	free(ctx->slab);
	free(ctx->free_slots);
	ctx->slab = NULL;
	ctx->free_slots = NULL;
	return ret;
}

void fab__slots_fini(struct fab_ctx *ctx)
{
	fab__mr_close_private(ctx->slab_mr);
	ctx->slab_mr = NULL;
	free(ctx->slab);
	free(ctx->free_slots);
	ctx->slab = NULL;
	ctx->free_slots = NULL;
	ctx->nslots = ctx->nfree = 0;
}

static int slot_get(struct fab_ctx *ctx)
{
	if (ctx->nfree == 0)
		return -ENOBUFS;
	return ctx->free_slots[--ctx->nfree];
}

void fab__slot_release(struct fab_ctx *ctx, int slot)
{
	/* After fab__slots_fini (close path) there is nothing to return to. */
	if (ctx->free_slots == NULL || ctx->nfree >= ctx->nslots)
		return;
	ctx->free_slots[ctx->nfree++] = slot;
}

/* Takes a slot and fills the fields both kinds share. */
static int msg_prepare(struct fab_ctx *ctx, struct fab_op *op, int kind,
		       fab_cb cb)
{
	int slot;

	if (ctx->closing)
		return -ESHUTDOWN;
	if (op == NULL)
		return -EINVAL;
	slot = slot_get(ctx);
	if (slot < 0)
		return slot;
	fab__op_prepare(ctx, op, kind, cb);
	op->slot_ = slot;
	op->lbuf_ = ctx->slab + (size_t)slot * FAB_MSG_MAX;
	op->desc_ = ctx->slab_mr != NULL ? ctx->slab_mr->desc : NULL;
	return 0;
}

static int msg_submit(struct fab_ctx *ctx, struct fab_op *op)
{
	int ret = fab__submit(ctx, op);

	if (ret != 0) {
		fab__slot_release(ctx, op->slot_);
		op->slot_ = -1;
	}
	return ret;
}

int fab_tsend(struct fab_ctx *ctx, struct fab_op *op, fi_addr_t peer,
	      uint64_t tag, const void *buf, size_t len, fab_cb cb)
{
	int ret;

	if (len > FAB_MSG_MAX)
		return -EMSGSIZE;
	if (len > 0 && buf == NULL)
		return -EINVAL;
	ret = msg_prepare(ctx, op, FAB_OP_SEND, cb);
	if (ret != 0)
		return ret;
	if (len > 0)
		memcpy(op->lbuf_, buf, len);
	op->len = len;
	op->tag = tag;
	op->peer_ = peer;
	return msg_submit(ctx, op);
}

/* internal: the sink's (not in fab_inflight); untagged: fi_recv. */
static int post_recv(struct fab_ctx *ctx, struct fab_op *op, uint64_t tag,
		     uint64_t ignore, void *buf, size_t cap, fab_cb cb,
		     bool internal, bool untagged)
{
	int ret;

	if (cap > 0 && buf == NULL)
		return -EINVAL;
	ret = msg_prepare(ctx, op, FAB_OP_RECV, cb);
	if (ret != 0)
		return ret;
	op->ubuf_ = buf;
	op->ucap_ = cap;
	op->tag = tag;
	op->key_ = ignore;
	op->internal_ = internal;
	op->untagged_ = untagged;
	return msg_submit(ctx, op);
}

int fab_trecv(struct fab_ctx *ctx, struct fab_op *op, uint64_t tag,
	      uint64_t ignore, void *buf, size_t cap, fab_cb cb)
{
	/* The sink takes every tag first: a receive here would never match. */
	if (ctx->nsink > 0)
		return -EBUSY;
	return post_recv(ctx, op, tag, ignore, buf, cap, cb, false, false);
}

#define SINK_LOG_MS 10000 /* one line per this long while messages come */

/* A sink receive took a message (or failed): count it, say so at most
 * once per SINK_LOG_MS, post it again. */
static void sink_cb(struct fab_op *op, int status)
{
	struct fab_ctx *ctx = op->ctx_;
	uint64_t now;

	if (status == -ECANCELED || ctx->closing)
		return;
	ctx->stats.msgs_dropped++;
	now = proto_now_ns() / 1000000u;
	if (ctx->sink_log_ms == 0 || now - ctx->sink_log_ms >= SINK_LOG_MS) {
		LOG_WARN("fabric: dropped %llu unsolicited message(s) since %s "
			 "(this process takes none: a stranger or a misconfigured "
			 "peer sends them)",
			 (unsigned long long)(ctx->stats.msgs_dropped - ctx->sink_logged),
			 ctx->sink_log_ms == 0 ? "start" : "the last such line");
		ctx->sink_logged = ctx->stats.msgs_dropped;
		ctx->sink_log_ms = now;
	}
	if (post_recv(ctx, op, 0, ~0ull, NULL, 0, sink_cb, true, op->untagged_) != 0)
		LOG_WARN("fabric: a sink receive could not be posted again");
}

/* n tagged receives and n untagged ones: a stranger chooses the kind. */
int fab__sink_start(struct fab_ctx *ctx, unsigned n)
{
	if (n == 0)
		return 0;
	if (2 * (uint64_t)n > ctx->nslots / 2)
		return -EINVAL;
	ctx->sink = calloc(2 * (size_t)n, sizeof(*ctx->sink));
	if (ctx->sink == NULL)
		return -ENOMEM;
	ctx->nsink = 2 * n;
	for (unsigned i = 0; i < 2 * n; i++) {
		int ret = post_recv(ctx, &ctx->sink[i], 0, ~0ull, NULL, 0,
				    sink_cb, true, i >= n);
		if (ret != 0)
			return ret;
	}
	return 0;
}

int fab_cancel(struct fab_ctx *ctx, struct fab_op *op)
{
	ssize_t ret;

	if (op->ctx_ != ctx ||
	    (op->state_ != FAB__OP_POSTED && op->state_ != FAB__OP_PARKED))
		return -EINVAL;
	if (op->kind_ != FAB_OP_RECV)
		return -ENOTSUP;
	op->cancel_ = FAB__CANCEL_ASKED;
	if (op->state_ == FAB__OP_PARKED) {
		/* Never reached the provider: finish it here. */
		fab__op_reap(ctx, op, -ECANCELED, 0, 0);
		return 0;
	}
	ret = fi_cancel(&ctx->ep->fid, &op->fi);
	if (ret != 0 && ret != -FI_ENOENT)
		return FAB_FI_ERR(ret, "fi_cancel");
	return 0;
}
