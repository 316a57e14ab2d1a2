/* The fabric context: one provider, domain, CQ, AV and RDM endpoint. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"

#define FAB__API_VERSION FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION)
/* mr_mode bits this layer knows how to honour. */
#define FAB__MR_MODE_HANDLED                                                  \
	(FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |    \
	 FI_MR_ENDPOINT)
#define FAB__PROVIDER_MAX 64

/* Lists the RDM providers that exist, for an error message. */
static void list_providers(char *buf, size_t cap)
{
	struct fi_info *hints = fi_allocinfo(), *all = NULL, *i;
	size_t used = 0;

	buf[0] = '\0';
	if (hints == NULL)
		return;
	hints->ep_attr->type = FI_EP_RDM;
	if (fi_getinfo(FAB__API_VERSION, NULL, NULL, 0, hints, &all) != 0)
		all = NULL;
	for (i = all; i != NULL; i = i->next) {
		const char *p = i->fabric_attr->prov_name;
		struct fi_info *j;
		bool seen = false;

		for (j = all; j != i; j = j->next)
			if (strcmp(j->fabric_attr->prov_name, p) == 0)
				seen = true;
		if (seen || used + strlen(p) + 3 >= cap)
			continue;
		used += (size_t)snprintf(buf + used, cap - used, "%s\"%s\"",
					 used ? ", " : "", p);
	}
	fi_freeinfo(all);
	fi_freeinfo(hints);
}

static struct fi_info *make_hints(const char *provider)
{
	struct fi_info *h = fi_allocinfo();

	if (h == NULL)
		return NULL;
	h->ep_attr->type = FI_EP_RDM;
	/* FI_MSG although we send only tagged messages: the sink must be
	 * able to post untagged receives, or rxm keeps every untagged
	 * message a stranger sends. */
	h->caps = FI_MSG | FI_TAGGED | FI_RMA | FI_SEND | FI_RECV | FI_READ | FI_WRITE |
		  FI_REMOTE_READ | FI_REMOTE_WRITE;
	/* We embed fi_context2 in every op, so both modes are fine. */
	h->mode = FI_CONTEXT | FI_CONTEXT2;
	h->domain_attr->mr_mode = FAB__MR_MODE_HANDLED;
	h->domain_attr->threading = FI_THREAD_DOMAIN;
	h->fabric_attr->prov_name = strdup(provider);
	if (h->fabric_attr->prov_name == NULL) {
		fi_freeinfo(h);
		return NULL;
	}
	return h;
}

static int open_cq(struct fab_ctx *ctx, bool want_fd)
{
	struct fi_cq_attr attr = {
		.format = FI_CQ_FORMAT_TAGGED,
		.wait_obj = want_fd ? FI_WAIT_FD : FI_WAIT_NONE,
	};
	int ret;

	ret = fi_cq_open(ctx->domain, &attr, &ctx->cq, NULL);
	if (ret != 0 && want_fd) {
		LOG_INFO("%s: no FI_WAIT_FD CQ (%s); callers poll on a timer",
			 ctx->info->fabric_attr->prov_name, fi_strerror(-ret));
		attr.wait_obj = FI_WAIT_NONE;
		want_fd = false;
		ret = fi_cq_open(ctx->domain, &attr, &ctx->cq, NULL);
	}
	if (ret != 0)
		return FAB_FI_ERR(ret, "fi_cq_open");
	ctx->wait_fd = -1;
	if (want_fd) {
		int fd = -1;

		ret = fi_control(&ctx->cq->fid, FI_GETWAIT, &fd);
		if (ret == 0 && fd >= 0)
			ctx->wait_fd = fd;
		else
			LOG_INFO("fi_control(FI_GETWAIT): %s; no wait fd",
				 fi_strerror(-ret));
	}
	return 0;
}

/*
 * libfabric reads its own settings once, at its first call. rxm (tcp and
 * verbs) keeps a peer's connection when the peer leaves the AV unless
 * FI_AV_REMOVE_CLEANUP is set, and notices that a connection dropped only
 * when it next reads its connection events (every 10 ms of progress). A
 * peer removed after a failed read and inserted again then got the dead
 * connection back, and the next read failed with -ENOTCONN whenever that
 * check had not run yet (a loaded machine). fab_av_remove means "forget
 * this peer", so ask for the cleanup; av.c removes an address only when its
 * last handle goes, so the cleanup never cuts a connection still in use.
 */
/*
 * rxm over tcp shares one receive context among all connections, and sizes
 * its bounce-buffer pool from FI_OFI_RXM_MSG_RX_SIZE, 4096 by default there:
 * 64 MiB of 16 KiB buffers that fi_enable zeroes, about 0.25 s of CPU and
 * 64 MiB of memory per process (a node, a publisher, each test's context),
 * most of a node's start-up. Our messages are few and small (requests,
 * have-announcements, control) and every one is matched at once (posted
 * slots, the sink), so FAB_RXM_MSG_RX_SIZE buffers are plenty; when they are
 * all taken, tcp leaves the rest in the socket until one comes back. The
 * buffer size (the eager limit, 16 KiB) stays: a smaller one sends a
 * stranger's larger message down rxm's rendezvous path. A value set in the
 * environment wins.
 */
#define FAB_RXM_MSG_RX_SIZE "256"

static void set_provider_env(void)
{
	if (setenv("FI_AV_REMOVE_CLEANUP", "1", 1) != 0)
		LOG_WARN("fabric: cannot set FI_AV_REMOVE_CLEANUP: %s",
			 strerror(errno));
	if (setenv("FI_OFI_RXM_MSG_RX_SIZE", FAB_RXM_MSG_RX_SIZE, 0) != 0)
		LOG_WARN("fabric: cannot set FI_OFI_RXM_MSG_RX_SIZE: %s",
			 strerror(errno));
}

/*
 * FAB_F_PREWARM. rxm (over tcp or verbs) carries every read and send on a
 * bounce buffer from a per-endpoint pool it grows 1024 buffers (17 MiB) at
 * a time and zeroes whole, and it grows it first for the first transfer of
 * the endpoint, once its first connection is up. For a node that is its
 * first read from the publisher: measured on a loaded 2-core VM, 4350 page
 * faults and 85-130 ms of CPU between the connection coming up and the read
 * going out, and every node of a fanout run pays it in the same half second
 * on the same cores. A read of FAB__PREWARM_LEN bytes from our own region
 * through our own address makes rxm connect to itself and grow the pool at
 * open, while no peer waits; the pool is never shrunk, so the first read
 * from a peer then costs only its connection. fab_open waits for it at most
 * FAB__PREWARM_MS; one still out after that ends in prewarm_done.
 */
#define FAB__PREWARM_LEN 64
#define FAB__PREWARM_MS 2000

struct fab__prewarm {
	struct fab_op op;
	struct fab_mr *mr;
	fi_addr_t self;
	bool waited; /* fab_open stopped waiting: prewarm_done ends it */
	uint8_t buf[2 * FAB__PREWARM_LEN];
};

/* Gives back the self address and the region, frees w. Not while closing:
 * removing the address closes the connection, and fab_close leaves the
 * provider alone while a transfer is out; fab_close frees w then. */
static void prewarm_end(struct fab_ctx *ctx, struct fab__prewarm *w)
{
	if (ctx->closing)
		return;
	if (w->self != FI_ADDR_NOTAVAIL)
		fab_av_remove(ctx, w->self);
	fab_mr_close(w->mr);
	if (ctx->prewarm == w)
		ctx->prewarm = NULL;
	free(w);
}

static void prewarm_done(struct fab_op *op, int status)
{
	struct fab__prewarm *w = proto_container_of(op, struct fab__prewarm, op);

	if (w->waited)
		prewarm_end(op->ctx_, w);
}

static void prewarm(struct fab_ctx *ctx)
{
	struct fab__prewarm *w;
	struct fab_rkey rk;
	int ret;

	if (strstr(fab_provider(ctx), "ofi_rxm") == NULL)
		return;
	w = calloc(1, sizeof(*w));
	if (w == NULL)
		return;
	w->self = FI_ADDR_NOTAVAIL;
	ret = fab_mr_reg(ctx, w->buf, sizeof(w->buf), FAB_MR_REMOTE_READ | FAB_MR_READ, &w->mr);
	if (ret == 0)
		ret = fab_av_insert(ctx, ctx->name, ctx->namelen, &w->self);
	if (ret == 0) {
		fab_mr_rkey(w->mr, &rk);
		ret = fab_read(ctx, &w->op, w->mr, FAB__PREWARM_LEN, FAB__PREWARM_LEN, w->self, &rk,
			       0, prewarm_done);
	}
	if (ret != 0) {
		LOG_INFO("fabric %s: no read from ourselves at open: %s", fab_provider(ctx),
			 strerror(-ret));
		prewarm_end(ctx, w);
		return;
	}
	ret = fab_wait(ctx, &w->op, FAB__PREWARM_MS);
	/* fab_wait may also fail on the queue with the read still posted:
	 * then too it is left to prewarm_done (or fab_close), not freed. */
	if (ret == -ETIMEDOUT || w->op.state_ != FAB__OP_DONE) {
		if (ret == -ETIMEDOUT)
			LOG_INFO("fabric %s: our read from ourselves at open is still out after %d ms",
				 fab_provider(ctx), FAB__PREWARM_MS);
		else
			LOG_INFO("fabric %s: our read from ourselves at open is still out: %s",
				 fab_provider(ctx), strerror(-ret));
		w->waited = true;
		ctx->prewarm = w;
		return;
	}
	if (ret != 0)
		LOG_INFO("fabric %s: our read from ourselves at open failed: %s",
			 fab_provider(ctx), strerror(-ret));
	/* Counters start after it: it is no transfer of the caller's. */
	ctx->stats = (struct fab_stats){.prewarmed = ret == 0};
	prewarm_end(ctx, w);
}

/* The endpoint's own port and family, from its address, for the
 * connection sweep (conns.c): a tcp provider's only (port 0 otherwise). */
static void conns_port_of(struct fab_ctx *ctx)
{
	struct sockaddr_storage ss;

	ctx->conns_port = 0;
	if (strstr(fab_provider(ctx), "tcp") == NULL || ctx->namelen < sizeof(struct sockaddr_in))
		return;
	memcpy(&ss, ctx->name, PROTO_MIN(ctx->namelen, sizeof(ss)));
	if (ss.ss_family == AF_INET)
		ctx->conns_port = ntohs(((const struct sockaddr_in *)&ss)->sin_port);
	else if (ss.ss_family == AF_INET6 && ctx->namelen >= sizeof(struct sockaddr_in6))
		ctx->conns_port = ntohs(((const struct sockaddr_in6 *)&ss)->sin6_port);
	ctx->conns_family = ss.ss_family;
}

int fab_open(const char *provider, const char *node,
	     const struct fab_opts *opts, struct fab_ctx **out,
	     struct proto_err *err)
{
	struct fi_info *hints = NULL;
	struct fab_ctx *ctx = NULL;
	struct fi_av_attr av_attr = {0};
	unsigned slots;
	int ret;

	static pthread_once_t env_once = PTHREAD_ONCE_INIT;

	*out = NULL;
	pthread_once(&env_once, set_provider_env);
	if (provider == NULL)
		provider = FAB_PROVIDER_DEFAULT;
	if (provider[0] == '\0' || strlen(provider) >= FAB__PROVIDER_MAX)
		return proto_errf(err, EINVAL, "fabric provider name '%.64s' "
				  "is empty or too long", provider);
	slots = opts && opts->msg_slots ? opts->msg_slots
					: FAB__MSG_SLOTS_DEFAULT;
	if (slots > 65536)
		return proto_errf(err, EINVAL, "fabric: %u message slots is "
				  "too many (max 65536)", slots);

	ctx = calloc(1, sizeof(*ctx));
	hints = make_hints(provider);
	if (ctx == NULL || hints == NULL) {
		ret = proto_errf(err, ENOMEM, "fabric: out of memory");
		goto fail;
	}
	ctx->wait_fd = -1;
	ctx->write_dc = true;

	ret = -FI_ENODATA;
	if (opts && (opts->flags & FAB_F_HMEM_CUDA)) {
		/* Device memory too, when the provider offers it. */
		hints->caps |= FI_HMEM;
		hints->domain_attr->mr_mode |= FI_MR_HMEM;
		ret = fi_getinfo(FAB__API_VERSION, node, NULL, node ? FI_SOURCE : 0,
				 hints, &ctx->info);
		ctx->hmem = ret == 0 && (ctx->info->caps & FI_HMEM);
		if (ret == 0 && !ctx->hmem) {
			fi_freeinfo(ctx->info);
			ctx->info = NULL;
			ret = -FI_ENODATA;
		}
		hints->caps &= ~(uint64_t)FI_HMEM;
		hints->domain_attr->mr_mode &= ~(uint64_t)FI_MR_HMEM;
	}
	if (ret != 0)
		ret = fi_getinfo(FAB__API_VERSION, node, NULL, node ? FI_SOURCE : 0,
				 hints, &ctx->info);
	if (ret != 0) {
		char avail[512];

		ctx->info = NULL;
		if (ret == -FI_ENODATA) {
			list_providers(avail, sizeof(avail));
			ret = proto_errf(err, ENODATA,
					 "fabric provider \"%s\"%s%s offers no "
					 "RDM endpoint with tagged messages and "
					 "RMA (providers here: %s)",
					 provider, node ? " on " : "",
					 node ? node : "",
					 avail[0] ? avail : "none");
		} else {
			ret = FAB_FI_ERR(ret, "fi_getinfo");
			proto_errf(err, -ret, "fabric: fi_getinfo(\"%s\"): %s",
				   provider, fi_strerror(-ret));
		}
		goto fail;
	}
	ctx->mr_mode = ctx->info->domain_attr->mr_mode;
	if (ctx->mr_mode & ~(uint64_t)(FAB__MR_MODE_HANDLED | (ctx->hmem ? FI_MR_HMEM : 0))) {
		char bits[256];

		fab_mr_mode_str(ctx->mr_mode, bits, sizeof(bits));
		ret = proto_errf(err, ENOTSUP, "fabric provider \"%s\" wants "
				 "mr_mode %s, more than we handle", provider,
				 bits);
		goto fail;
	}
	if (ctx->info->domain_attr->mr_key_size > sizeof(uint64_t)) {
		ret = proto_errf(err, ENOTSUP, "fabric provider \"%s\": %zu-byte "
				 "MR keys are not supported", provider,
				 ctx->info->domain_attr->mr_key_size);
		goto fail;
	}
	ctx->max_rma = ctx->info->ep_attr->max_msg_size;
	ctx->rma_segs = PROTO_MAX(1, PROTO_MIN(ctx->info->tx_attr->rma_iov_limit, FAB_SEGS_MAX));

	ret = fi_fabric(ctx->info->fabric_attr, &ctx->fabric, NULL);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_fabric");
		goto fail_msg;
	}
	ret = fi_domain(ctx->fabric, ctx->info, &ctx->domain, NULL);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_domain");
		goto fail_msg;
	}
	ret = open_cq(ctx, !(opts && (opts->flags & FAB_F_NO_WAIT_FD)));
	if (ret != 0)
		goto fail_msg;
	av_attr.type = ctx->info->domain_attr->av_type != FI_AV_UNSPEC
			       ? ctx->info->domain_attr->av_type
			       : FI_AV_TABLE;
	ret = fi_av_open(ctx->domain, &av_attr, &ctx->av, NULL);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_av_open");
		goto fail_msg;
	}
	ret = fi_endpoint(ctx->domain, ctx->info, &ctx->ep, NULL);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_endpoint");
		goto fail_msg;
	}
	ret = fi_ep_bind(ctx->ep, &ctx->av->fid, 0);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_ep_bind(av)");
		goto fail_msg;
	}
	ret = fi_ep_bind(ctx->ep, &ctx->cq->fid, FI_TRANSMIT | FI_RECV);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_ep_bind(cq)");
		goto fail_msg;
	}
	ret = fi_enable(ctx->ep);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_enable");
		goto fail_msg;
	}
	ctx->namelen = sizeof(ctx->name);
	ret = fi_getname(&ctx->ep->fid, ctx->name, &ctx->namelen);
	if (ret != 0) {
		ret = FAB_FI_ERR(ret, "fi_getname");
		goto fail_msg;
	}
	conns_port_of(ctx);
	/* Regions need the enabled endpoint under FI_MR_ENDPOINT. */
	ret = fab__slots_init(ctx, slots);
	if (ret != 0)
		goto fail_msg;
	ret = fab__sink_start(ctx, opts ? opts->sink : 0);
	if (ret != 0)
		goto fail_msg;
	uint64_t warm_ns = proto_now_ns();
	bool warm = opts != NULL && (opts->flags & FAB_F_PREWARM);
	if (warm)
		prewarm(ctx);
	warm_ns = proto_now_ns() - warm_ns;

	fi_freeinfo(hints);
	if (proto_log_level() >= PROTO_LOG_INFO) {
		char d[512], w[64] = "";

		fab_describe(ctx, d, sizeof(d));
		if (warm)
			snprintf(w, sizeof(w), " prewarm=%s (%llu ms)",
				 ctx->stats.prewarmed ? "done" : ctx->prewarm != NULL ? "still-out" : "none",
				 (unsigned long long)(warm_ns / 1000000));
		LOG_INFO("fabric open: %s%s", d, w);
	}
	*out = ctx;
	return 0;

fail_msg:
	proto_errf(err, -ret, "fabric provider \"%s\"%s%s: setup failed: %s",
		   provider, node ? " on " : "", node ? node : "",
		   strerror(-ret));
fail:
	fi_freeinfo(hints);
	fab_close(ctx);
	return ret;
}

static void close_fid(struct fid *fid, const char *what)
{
	int ret = fi_close(fid);

	if (ret != 0)
		FAB_FI_ERR(ret, what);
}

/* Transfers (reads, writes, sends) the provider accepted and has not
 * completed. Posted receives do not count: closing cancels them cleanly. */
static size_t transfers_pending(const struct fab_ctx *ctx)
{
	size_t n = 0;

	for (const struct fab_op *op = ctx->posted; op != NULL; op = op->next_)
		n += op->kind_ != FAB_OP_RECV;
	return n;
}

/* Contexts closed with transfers pending: their libfabric objects stay
 * open, and reachable, until the process exits. Two threads may close
 * their contexts at once. */
static struct fab_ctx *abandoned;
static pthread_mutex_t abandoned_mu = PTHREAD_MUTEX_INITIALIZER;

void fab_close(struct fab_ctx *ctx)
{
	size_t pending;

	if (ctx == NULL)
		return;
	/* No last progress: it could start serving a peer we are leaving
	 * (shm 1.17 crashes on requests from a peer that has gone). Ops
	 * still in flight report -ECANCELED even if they just finished. */
	ctx->closing = true;
	/*
	 * tcp;ofi_rxm (1.17) crashes closing an endpoint whose connections
	 * still carry RMA: closing a connection flushes its half-received
	 * read response as a cancelled completion with no context, and rxm
	 * dereferences that context (rxm_handle_comp_error). A node stopped
	 * while its reads crawl over a congested link died that way. So an
	 * endpoint with transfers pending is not closed: its ops complete
	 * here with -ECANCELED and the provider objects are left, untouched
	 * (nothing progresses them again), to the process's exit.
	 */
	if (ctx->ep != NULL && (pending = transfers_pending(ctx)) > 0) {
		LOG_INFO("fabric close: %zu transfers still with the provider; "
			 "the endpoint stays open until the process exits",
			 pending);
		fab__cancel_all(ctx);
		fab__dispatch(ctx);
		pthread_mutex_lock(&abandoned_mu);
		ctx->abandoned_next = abandoned;
		abandoned = ctx;
		pthread_mutex_unlock(&abandoned_mu);
		return;
	}
	if (ctx->ep != NULL) {
		int ret = fi_close(&ctx->ep->fid);

		if (ret == -FI_EBUSY) {
			/* FI_MR_ENDPOINT regions may pin the endpoint. */
			fab__slots_fini(ctx);
			fab__mr_close_all(ctx);
			ret = fi_close(&ctx->ep->fid);
		}
		if (ret != 0)
			FAB_FI_ERR(ret, "fi_close(ep)");
		ctx->ep = NULL;
	}
	/* The endpoint is gone: the provider no longer touches op buffers. */
	fab__cancel_all(ctx);
	fab__dispatch(ctx);
	fab__slots_fini(ctx);
	if (ctx->mrs != NULL)
		LOG_DEBUG("fabric close: freeing regions left open");
	fab__mr_close_all(ctx);
	if (ctx->av != NULL)
		close_fid(&ctx->av->fid, "fi_close(av)");
	ctx->av = NULL;
	if (ctx->cq != NULL)
		close_fid(&ctx->cq->fid, "fi_close(cq)");
	ctx->cq = NULL;
	if (ctx->domain != NULL)
		close_fid(&ctx->domain->fid, "fi_close(domain)");
	ctx->domain = NULL;
	if (ctx->fabric != NULL)
		close_fid(&ctx->fabric->fid, "fi_close(fabric)");
	ctx->fabric = NULL;
	fi_freeinfo(ctx->info);
	free(ctx->av_refs);
	free(ctx->sink);
	free(ctx->prewarm);
	free(ctx);
}

int fab_getname(const struct fab_ctx *ctx, void *buf, size_t cap, size_t *len)
{
	*len = ctx->namelen;
	if (cap < ctx->namelen)
		return -ENOBUFS;
	memcpy(buf, ctx->name, ctx->namelen);
	return 0;
}

const char *fab_provider(const struct fab_ctx *ctx)
{
	return ctx->info->fabric_attr->prov_name;
}

uint64_t fab_mr_mode(const struct fab_ctx *ctx)
{
	return ctx->mr_mode;
}

size_t fab_max_rma(const struct fab_ctx *ctx)
{
	return ctx->max_rma;
}

size_t fab_rma_segs(const struct fab_ctx *ctx)
{
	return ctx->rma_segs;
}

void fab_stats(const struct fab_ctx *ctx, struct fab_stats *out)
{
	*out = ctx->stats;
}

size_t fab_inflight(const struct fab_ctx *ctx)
{
	return ctx->n_posted;
}

bool fab_quiet(const struct fab_ctx *ctx)
{
	return ctx->parked_head == NULL && ctx->reaped_head == NULL && transfers_pending(ctx) == 0;
}

bool fab_parked(const struct fab_ctx *ctx)
{
	return ctx->parked_head != NULL;
}

void fab_mr_mode_str(uint64_t mode, char *buf, size_t cap)
{
	static const struct {
		uint64_t bit;
		const char *name;
	} bits[] = {
		{FI_MR_LOCAL, "FI_MR_LOCAL"},
		{FI_MR_RAW, "FI_MR_RAW"},
		{FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR"},
		{FI_MR_ALLOCATED, "FI_MR_ALLOCATED"},
		{FI_MR_PROV_KEY, "FI_MR_PROV_KEY"},
		{FI_MR_MMU_NOTIFY, "FI_MR_MMU_NOTIFY"},
		{FI_MR_RMA_EVENT, "FI_MR_RMA_EVENT"},
		{FI_MR_ENDPOINT, "FI_MR_ENDPOINT"},
		{FI_MR_HMEM, "FI_MR_HMEM"},
		{FI_MR_COLLECTIVE, "FI_MR_COLLECTIVE"},
	};
	size_t used = 0;

	if (cap == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bits); i++) {
		int n;

		if (!(mode & bits[i].bit))
			continue;
		n = snprintf(buf + used, cap - used, "%s%s", used ? "|" : "",
			     bits[i].name);
		if (n < 0 || (size_t)n >= cap - used)
			return;
		used += (size_t)n;
	}
	if (used == 0)
		snprintf(buf, cap, "none");
}

void fab_describe(const struct fab_ctx *ctx, char *buf, size_t cap)
{
	const struct fi_info *i = ctx->info;
	char mr[256];

	fab_mr_mode_str(ctx->mr_mode, mr, sizeof(mr));
	snprintf(buf, cap,
		 "provider=%s fabric=%s domain=%s mr_mode=%s av=%s "
		 "data_progress=%s addrlen=%zu max_rma=%zu wait_fd=%s",
		 i->fabric_attr->prov_name, i->fabric_attr->name,
		 i->domain_attr->name, mr,
		 i->domain_attr->av_type == FI_AV_MAP ? "map" : "table",
		 i->domain_attr->data_progress == FI_PROGRESS_AUTO ? "auto"
								   : "manual",
		 ctx->namelen, ctx->max_rma, ctx->wait_fd >= 0 ? "yes" : "no");
}

int fab_wait_fd(const struct fab_ctx *ctx)
{
	return ctx->wait_fd >= 0 ? ctx->wait_fd : -ENOSYS;
}

int fab_trywait(struct fab_ctx *ctx)
{
	struct fid *fids[1] = {&ctx->cq->fid};
	int ret;

	if (ctx->wait_fd < 0)
		return -ENOSYS;
	/* Parked posts are not counted: they wait for a peer, not for us,
	 * and fab_poll retries them; a loop that blocks on the fd keeps a
	 * timer for them (fab_wait does). */
	if (ctx->reaped_head != NULL)
		return -EAGAIN;
	ret = fi_trywait(ctx->fabric, fids, 1);
	if (ret == 0)
		return 0;
	if (ret == -FI_EAGAIN)
		return -EAGAIN;
	return FAB_FI_ERR(ret, "fi_trywait");
}
