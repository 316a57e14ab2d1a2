/* The completion queue: reaping completions, polling, blocking waits. */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"

static struct fab_op *op_of(void *fi_context)
{
	return proto_container_of(fi_context, struct fab_op, fi);
}

static const char *kind_name(int kind)
{
	return kind == FAB_OP_READ    ? "read"
	       : kind == FAB_OP_WRITE ? "write"
	       : kind == FAB_OP_SEND  ? "send"
				      : "recv";
}

static void reap_error(struct fab_ctx *ctx)
{
	struct fi_cq_err_entry e;
	char pbuf[256];
	const char *pstr;
	struct fab_op *op;
	ssize_t ret;
	int status;

	memset(&e, 0, sizeof(e));
	ret = fi_cq_readerr(ctx->cq, &e, 0);
	if (ret != 1) {
		if (ret != -FI_EAGAIN)
			FAB_FI_ERR(ret, "fi_cq_readerr");
		return;
	}
	status = -fab__errno(e.err);
	if (status == 0)
		status = -EIO;
	if (e.op_context == NULL) {
		LOG_WARN("fabric: error completion without context: %s",
			 fi_strerror(e.err));
		return;
	}
	op = op_of(e.op_context);
	/* -ECANCELED means we cancelled it; a provider that cancels on its
	 * own (tcp does when the peer refuses a key or range) means the
	 * remote side failed it. */
	if (e.err == FI_ECANCELED && !op->cancel_)
		status = -EREMOTEIO;
	/* fab_av_remove closed the peer's connection under it. */
	if (e.err == FI_ECANCELED && op->cancel_ == FAB__CANCEL_PEER_GONE)
		status = -ECONNABORTED;
	if (op->internal_) {
		/* The sink: strangers' messages, truncated or not, are
		 * dropped without a line each (they choose how many). */
		LOG_DEBUG("fabric: sink dropped a message: %s",
			  fi_strerror(e.err));
	} else if (e.err == FI_ECANCELED && op->cancel_) {
		LOG_DEBUG("fabric: %s op %p cancelled", kind_name(op->kind_),
			  (void *)op);
	} else {
		pstr = fi_cq_strerror(ctx->cq, e.prov_errno, e.err_data, pbuf,
				      sizeof(pbuf));
		/* Per operation, so per chunk: the owner tallies failures and
		 * logs them once; the provider's words are here at debug. */
		LOG_DEBUG("fabric: %s op failed: %s (provider errno %d: %s)",
			 kind_name(op->kind_), fi_strerror(e.err), e.prov_errno,
			 pstr ? pstr : "?");
	}
	/* A truncated receive still delivered its first bytes. */
	fab__op_reap(ctx, op, status,
		     op->kind_ == FAB_OP_RECV && e.err == FI_ETRUNC
			     ? PROTO_MIN(e.len, (size_t)FAB_MSG_MAX)
			     : 0,
		     e.tag);
}

int fab__progress(struct fab_ctx *ctx, int max)
{
	struct fi_cq_tagged_entry e[FAB__CQ_BATCH];
	size_t want = max > 0 && max < FAB__CQ_BATCH ? (size_t)max
						     : FAB__CQ_BATCH;
	ssize_t n;

	if (ctx->cq == NULL)
		return 0;
	n = fi_cq_read(ctx->cq, e, want);
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++) {
			struct fab_op *op = op_of(e[i].op_context);
			size_t len = op->kind_ == FAB_OP_RECV ? e[i].len
							      : op->len;

			fab__op_reap(ctx, op, 0, len,
				     op->kind_ == FAB_OP_RECV ? e[i].tag
							      : op->tag);
		}
		return (int)n;
	}
	if (n == -FI_EAGAIN)
		return 0;
	if (n == -FI_EAVAIL) {
		reap_error(ctx);
		return 1;
	}
	return FAB_FI_ERR(n, "fi_cq_read");
}

int fab_poll(struct fab_ctx *ctx, int max)
{
	int got = 0, ret;

	/* Whole batches until the CQ is empty or max is reached (a cap keeps
	 * one call from starving the caller's loop). */
	do {
		ret = fab__progress(ctx, max > 0 ? max - got : 0);
		if (ret < 0)
			return ret;
		got += ret;
	} while (ret > 0 && (max <= 0 || got < max) && got < 4096);
	fab__retry_parked(ctx);
	if (!ctx->closing) {
		uint64_t now = proto_now_ns();

		if (now >= ctx->conns_next_ns) {
			ctx->conns_next_ns = now + FAB__CONNS_SWEEP_MS * 1000000ull;
			fab__conns_sweep(ctx);
		}
	}
	return fab__dispatch(ctx);
}

int fab_wait(struct fab_ctx *ctx, struct fab_op *op, int timeout_ms)
{
	uint64_t deadline = timeout_ms >= 0
				    ? proto_now_ns() +
					      (uint64_t)timeout_ms * 1000000ull
				    : UINT64_MAX;
	int ret;

	if (op != NULL && op->state_ == FAB__OP_FREE)
		return -EINVAL;
	for (;;) {
		ret = fab_poll(ctx, 0);
		if (ret < 0)
			return ret;
		if (op != NULL ? op->state_ == FAB__OP_DONE
			       : ctx->n_posted == 0 && ctx->reaped_head == NULL)
			return op != NULL ? op->status : 0;
		if (proto_now_ns() >= deadline)
			return -ETIMEDOUT;
		if (ret > 0)
			continue;
		if (ctx->parked_head == NULL && fab_trywait(ctx) == 0) {
			struct pollfd p = {.fd = ctx->wait_fd, .events = POLLIN};

			/* Short naps: a manual-progress provider may need
			 * polling even while the fd stays quiet. */
			poll(&p, 1, 1);
		} else {
			sched_yield();
		}
	}
}
