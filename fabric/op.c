/* The life of a fab_op: issue, park on -FI_EAGAIN, reap, run its callback. */
#include <errno.h>
#include <string.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"
#include "proto/params.h"
#include "proto/util.h"

static const char *kind_call(int kind)
{
	switch (kind) {
	case FAB_OP_READ:
		return "fi_read";
	case FAB_OP_WRITE:
		return "fi_write";
	case FAB_OP_SEND:
		return "fi_tsend";
	default:
		return "fi_trecv";
	}
}

void fab__op_prepare(struct fab_ctx *ctx, struct fab_op *op, int kind,
		     fab_cb cb)
{
	memset(&op->fi, 0, sizeof(op->fi));
	op->cb = cb;
	op->status = 0;
	op->len = 0;
	op->tag = 0;
	op->ctx_ = ctx;
	op->prev_ = op->next_ = NULL;
	op->lbuf_ = op->desc_ = op->ubuf_ = NULL;
	op->ucap_ = 0;
	op->peer_ = FI_ADDR_UNSPEC;
	op->raddr_ = op->key_ = 0;
	op->segs_ = NULL;
	op->nsegs_ = 0;
	op->slot_ = -1;
	op->kind_ = (uint8_t)kind;
	op->state_ = FAB__OP_FREE;
	op->cancel_ = 0;
	op->internal_ = 0;
	op->untagged_ = 0;
}

static ssize_t write_dc(struct fab_ctx *ctx, struct fab_op *op)
{
	struct iovec iov = {.iov_base = op->lbuf_, .iov_len = op->len};
	struct fi_rma_iov rma = {.addr = op->raddr_, .len = op->len,
				 .key = op->key_};
	struct fi_msg_rma msg = {
		.msg_iov = &iov,
		.desc = &op->desc_,
		.iov_count = 1,
		.addr = op->peer_,
		.rma_iov = &rma,
		.rma_iov_count = 1,
		.context = &op->fi,
	};

	return fi_writemsg(ctx->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
}

/* A gathering read (fab_readv): its ranges into one local buffer. */
static ssize_t readv_issue(struct fab_ctx *ctx, struct fab_op *op)
{
	struct iovec iov = {.iov_base = op->lbuf_, .iov_len = op->len};
	struct fi_rma_iov rma[FAB_SEGS_MAX];
	struct fi_msg_rma msg = {
		.msg_iov = &iov,
		.desc = &op->desc_,
		.iov_count = 1,
		.addr = op->peer_,
		.rma_iov = rma,
		.rma_iov_count = op->nsegs_,
		.context = &op->fi,
	};

	for (uint32_t i = 0; i < op->nsegs_; i++)
		rma[i] = (struct fi_rma_iov){.addr = op->raddr_ + op->segs_[i].roff,
					     .len = op->segs_[i].len, .key = op->key_};
	return fi_readmsg(ctx->ep, &msg, FI_COMPLETION);
}

/* One attempt to hand the op to the provider. */
static ssize_t issue(struct fab_ctx *ctx, struct fab_op *op)
{
	ssize_t ret;

	switch (op->kind_) {
	case FAB_OP_READ:
		if (op->nsegs_ > 0)
			return readv_issue(ctx, op);
		return fi_read(ctx->ep, op->lbuf_, op->len, op->desc_,
			       op->peer_, op->raddr_, op->key_, &op->fi);
	case FAB_OP_WRITE:
		if (ctx->write_dc) {
			ret = write_dc(ctx, op);
			if (ret != -FI_EBADFLAGS && ret != -FI_ENOSYS &&
			    ret != -FI_EOPNOTSUPP)
				return ret;
			LOG_INFO("fabric %s: no FI_DELIVERY_COMPLETE writes "
				 "(%s); a write completion only frees the "
				 "source", fab_provider(ctx),
				 fi_strerror((int)-ret));
			ctx->write_dc = false;
		}
		return fi_write(ctx->ep, op->lbuf_, op->len, op->desc_,
				op->peer_, op->raddr_, op->key_, &op->fi);
	case FAB_OP_SEND:
		return fi_tsend(ctx->ep, op->lbuf_, op->len, op->desc_,
				op->peer_, op->tag, &op->fi);
	case FAB_OP_RECV:
		if (op->untagged_)
			return fi_recv(ctx->ep, op->lbuf_, FAB_MSG_MAX, op->desc_, FI_ADDR_UNSPEC,
				       &op->fi);
		return fi_trecv(ctx->ep, op->lbuf_, FAB_MSG_MAX, op->desc_,
				FI_ADDR_UNSPEC, op->tag, op->key_, &op->fi);
	}
	return -FI_EINVAL;
}

static void link_posted(struct fab_ctx *ctx, struct fab_op *op)
{
	op->state_ = FAB__OP_POSTED;
	op->prev_ = NULL;
	op->next_ = ctx->posted;
	if (ctx->posted != NULL)
		ctx->posted->prev_ = op;
	ctx->posted = op;
}

static void park(struct fab_ctx *ctx, struct fab_op *op)
{
	op->state_ = FAB__OP_PARKED;
	op->parked_ns_ = proto_now_ns();
	op->prev_ = op->next_ = NULL;
	if (ctx->parked_tail != NULL)
		ctx->parked_tail->next_ = op;
	else
		ctx->parked_head = op;
	ctx->parked_tail = op;
}

/* Receives match any peer: they order against every parked receive. */
static bool same_queue(const struct fab_op *a, const struct fab_op *b)
{
	if (a->kind_ == FAB_OP_RECV || b->kind_ == FAB_OP_RECV)
		return a->kind_ == b->kind_;
	return a->peer_ == b->peer_;
}

static bool blocked(const struct fab_ctx *ctx, const struct fab_op *op)
{
	for (const struct fab_op *p = ctx->parked_head; p != NULL; p = p->next_)
		if (p != op && same_queue(p, op))
			return true;
	return false;
}

int fab__submit(struct fab_ctx *ctx, struct fab_op *op)
{
	ssize_t ret = -FI_EAGAIN;

	/* Keep order per peer: nothing overtakes that peer's parked ops. */
	if (!blocked(ctx, op)) {
		for (int tries = 0;; tries++) {
			ret = issue(ctx, op);
			if (ret != -FI_EAGAIN || tries >= FAB__EAGAIN_TRIES)
				break;
			int p = fab__progress(ctx, 0);
			if (p < 0)
				return p;
		}
	}
	if (ret == -FI_EAGAIN) {
		park(ctx, op);
	} else if (ret != 0) {
		return FAB_FI_ERR(ret, kind_call(op->kind_));
	} else {
		link_posted(ctx, op);
	}
	if (!op->internal_)
		ctx->n_posted++;
	return 0;
}

/* Fails a parked op through its callback (the caller was told it posted). */
static void fail_parked(struct fab_ctx *ctx, struct fab_op *op, int err)
{
	fab__unpark(ctx, op);
	op->state_ = FAB__OP_POSTED;
	link_posted(ctx, op);
	fab__op_reap(ctx, op, err, 0, 0);
}

void fab__retry_parked(struct fab_ctx *ctx)
{
	uint64_t now, limit;
	struct fab_op *op = ctx->parked_head, *next;

	if (op == NULL)
		return; /* every poll comes here: no clock read, no lookup */
	now = proto_now_ns();
	limit = proto_param(PROTO_PARAM_PARK_MS) * 1000000ull;
	/* One pass in FIFO order. A peer that refuses again keeps the rest of
	 * its ops parked behind it; other peers' ops go ahead. */
	for (; op != NULL && !ctx->closing; op = next) {
		next = op->next_;
		bool earlier = false;
		for (struct fab_op *p = ctx->parked_head; p != op; p = p->next_)
			earlier |= same_queue(p, op);
		if (earlier)
			continue;
		ssize_t ret = issue(ctx, op);
		if (ret == -FI_EAGAIN) {
			if (now - op->parked_ns_ > limit) {
				/* Per operation: the owner sees -EHOSTUNREACH and counts it. */
				LOG_DEBUG("fabric %s: peer refused a %s for %llu ms: giving up",
					  fab_provider(ctx), kind_call(op->kind_),
					  (unsigned long long)((now - op->parked_ns_) / 1000000));
				fail_parked(ctx, op, -EHOSTUNREACH);
			}
			continue;
		}
		fab__unpark(ctx, op);
		if (ret == 0) {
			link_posted(ctx, op);
		} else {
			link_posted(ctx, op);
			fab__op_reap(ctx, op, FAB_FI_ERR(ret, kind_call(op->kind_)), 0, 0);
		}
	}
}

void fab__fail_parked_peer(struct fab_ctx *ctx, fi_addr_t peer)
{
	struct fab_op *op = ctx->parked_head, *next;

	for (; op != NULL; op = next) {
		next = op->next_;
		if (op->kind_ != FAB_OP_RECV && op->peer_ == peer)
			fail_parked(ctx, op, -ECONNABORTED);
	}
	for (op = ctx->posted; op != NULL; op = op->next_)
		if (op->kind_ != FAB_OP_RECV && op->peer_ == peer)
			op->cancel_ = FAB__CANCEL_PEER_GONE;
}

bool fab__unpark(struct fab_ctx *ctx, struct fab_op *op)
{
	struct fab_op **pp = &ctx->parked_head, *prev = NULL;

	while (*pp != NULL && *pp != op) {
		prev = *pp;
		pp = &(*pp)->next_;
	}
	if (*pp == NULL)
		return false;
	*pp = op->next_;
	if (ctx->parked_tail == op)
		ctx->parked_tail = prev;
	op->next_ = NULL;
	return true;
}

static void count(struct fab_ctx *ctx, struct fab_op *op, size_t len)
{
	switch (op->kind_) {
	case FAB_OP_READ:
		ctx->stats.bytes_read += len;
		ctx->stats.reads++;
		break;
	case FAB_OP_WRITE:
		ctx->stats.bytes_written += len;
		ctx->stats.writes++;
		break;
	case FAB_OP_SEND:
		ctx->stats.bytes_sent += len;
		ctx->stats.msgs_sent++;
		break;
	case FAB_OP_RECV:
		ctx->stats.bytes_recv += len;
		ctx->stats.msgs_recv++;
		break;
	}
}

void fab__op_reap(struct fab_ctx *ctx, struct fab_op *op, int status,
		  size_t len, uint64_t tag)
{
	if (op->state_ == FAB__OP_POSTED) {
		if (op->prev_ != NULL)
			op->prev_->next_ = op->next_;
		else
			ctx->posted = op->next_;
		if (op->next_ != NULL)
			op->next_->prev_ = op->prev_;
	} else if (op->state_ == FAB__OP_PARKED) {
		fab__unpark(ctx, op);
	}
	op->status = status;
	op->len = len;
	op->tag = tag;
	/* A receive delivers into our slot; copy what fits out to the
	 * caller. A truncated one still hands over its first bytes. */
	if (op->kind_ == FAB_OP_RECV && (status == 0 || status == -EMSGSIZE)) {
		size_t n = PROTO_MIN(len, op->ucap_);

		if (n > 0)
			memcpy(op->ubuf_, op->lbuf_, n);
		if (len > op->ucap_)
			op->status = -EMSGSIZE;
	}
	if (op->status == 0)
		count(ctx, op, len);
	else if (op->status != -ECANCELED)
		ctx->stats.errors++;
	if (op->slot_ >= 0) {
		fab__slot_release(ctx, op->slot_);
		op->slot_ = -1;
	}
	op->state_ = FAB__OP_REAPED;
	op->prev_ = op->next_ = NULL;
	if (ctx->reaped_tail != NULL)
		ctx->reaped_tail->next_ = op;
	else
		ctx->reaped_head = op;
	ctx->reaped_tail = op;
	if (!op->internal_)
		ctx->n_posted--;
}

int fab__dispatch(struct fab_ctx *ctx)
{
	int ran = 0;

	if (ctx->dispatching)
		return 0;
	ctx->dispatching = true;
	while (ctx->reaped_head != NULL) {
		struct fab_op *op = ctx->reaped_head;

		ctx->reaped_head = op->next_;
		if (ctx->reaped_head == NULL)
			ctx->reaped_tail = NULL;
		op->next_ = NULL;
		op->state_ = FAB__OP_DONE;
		ran++;
		if (op->cb != NULL)
			op->cb(op, op->status); /* may repost or free op */
	}
	ctx->dispatching = false;
	if (ctx->av_doomed > 0)
		fab__av_reap_doomed(ctx);
	return ran;
}

void fab__cancel_all(struct fab_ctx *ctx)
{
	while (ctx->parked_head != NULL)
		fab__op_reap(ctx, ctx->parked_head, -ECANCELED, 0, 0);
	while (ctx->posted != NULL)
		fab__op_reap(ctx, ctx->posted, -ECANCELED, 0, 0);
}
