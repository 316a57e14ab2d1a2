/* The address vector: peers' raw endpoint addresses to fi_addr_t handles. */
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"

/* Checks hostile address bytes against the provider's address format.
 * fi_av_insert takes no length, so the bytes must be exactly what the
 * provider will read. */
static int check_addr(const struct fab_ctx *ctx, const uint8_t *a, size_t len)
{
	sa_family_t fam;

	if (len == 0 || len > FAB_ADDR_MAX)
		return -EINVAL;
	switch (ctx->info->addr_format) {
	case FI_SOCKADDR_IN:
		if (len != sizeof(struct sockaddr_in))
			return -EINVAL;
		memcpy(&fam, a + offsetof(struct sockaddr_in, sin_family),
		       sizeof(fam));
		return fam == AF_INET ? 0 : -EINVAL;
	case FI_SOCKADDR_IN6:
		if (len != sizeof(struct sockaddr_in6))
			return -EINVAL;
		memcpy(&fam, a + offsetof(struct sockaddr_in6, sin6_family),
		       sizeof(fam));
		return fam == AF_INET6 ? 0 : -EINVAL;
	case FI_ADDR_STR:
		/* A printable string, NUL-terminated inside len. */
		for (size_t i = 0; i < len; i++) {
			if (a[i] == '\0')
				return i > 0 ? 0 : -EINVAL;
			if (a[i] < 0x20 || a[i] > 0x7e)
				return -EINVAL;
		}
		return -EINVAL;
	default:
		/* Fixed-size binary formats (verbs, efa): same size as ours. */
		return len == ctx->namelen ? 0 : -EINVAL;
	}
}

/* Counts one more handle for addr; on failure the count is unchanged. */
static int ref_handle(struct fab_ctx *ctx, fi_addr_t addr)
{
	if (addr >= FAB__AV_MAX)
		return -ENOSPC;
	if (addr >= ctx->av_refs_cap) {
		size_t cap = PROTO_MAX((size_t)addr + 1, ctx->av_refs_cap * 2);
		struct fab__av_ref *r = realloc(ctx->av_refs, cap * sizeof(*r));

		if (r == NULL)
			return -ENOMEM;
		memset(r + ctx->av_refs_cap, 0,
		       (cap - ctx->av_refs_cap) * sizeof(*r));
		ctx->av_refs = r;
		ctx->av_refs_cap = cap;
	}
	if (ctx->av_refs[addr].doomed) { /* handed out again before it went */
		ctx->av_refs[addr].doomed = false;
		ctx->av_doomed--;
	}
	ctx->av_refs[addr].handles++;
	ctx->av_refs[addr].inserts++;
	return 0;
}

static bool transfers_to(const struct fab_ctx *ctx, fi_addr_t addr)
{
	for (const struct fab_op *op = ctx->posted; op != NULL; op = op->next_)
		if (op->kind_ != FAB_OP_RECV && op->peer_ == addr)
			return true;
	return false;
}

static int forget(struct fab_ctx *ctx, fi_addr_t addr)
{
	struct fab__av_ref *r = &ctx->av_refs[addr];
	int first = 0;

	for (; r->inserts > 0; r->inserts--) {
		int ret = fi_av_remove(ctx->av, &addr, 1, 0);

		if (ret != 0 && first == 0)
			first = FAB_FI_ERR(ret, "fi_av_remove");
	}
	return first;
}

void fab__av_reap_doomed(struct fab_ctx *ctx)
{
	for (size_t a = 0; a < ctx->av_refs_cap && ctx->av_doomed > 0 && !ctx->closing; a++) {
		if (!ctx->av_refs[a].doomed || transfers_to(ctx, a))
			continue;
		ctx->av_refs[a].doomed = false;
		ctx->av_doomed--;
		forget(ctx, a);
	}
}

int fab_av_insert(struct fab_ctx *ctx, const void *addr, size_t len,
		  fi_addr_t *out)
{
	/* A zero-padded private copy: the provider never reads past it. */
	uint8_t copy[FAB_ADDR_MAX + 1] = {0};
	int ret;

	*out = FI_ADDR_NOTAVAIL;
	if (ctx->closing)
		return -ESHUTDOWN;
	ret = check_addr(ctx, addr, len);
	if (ret != 0) {
		LOG_WARN("fabric: refusing a malformed %zu-byte peer address",
			 len);
		return ret;
	}
	memcpy(copy, addr, len);
	ret = fi_av_insert(ctx->av, copy, 1, out, 0, NULL);
	if (ret != 1) {
		*out = FI_ADDR_NOTAVAIL;
		return ret < 0 ? FAB_FI_ERR(ret, "fi_av_insert") : -EINVAL;
	}
	ret = ref_handle(ctx, *out);
	if (ret != 0) {
		/* Undo this insert only: other handles keep the peer. */
		fi_av_remove(ctx->av, out, 1, 0);
		*out = FI_ADDR_NOTAVAIL;
		return ret;
	}
	return 0;
}

int fab_av_remove(struct fab_ctx *ctx, fi_addr_t addr)
{
	struct fab__av_ref *r;

	if (addr >= ctx->av_refs_cap || ctx->av_refs[addr].handles == 0)
		return -ENOENT;
	r = &ctx->av_refs[addr];
	if (--r->handles > 0)
		return 0; /* another handle still uses the peer */
	/* The last handle: forget the peer and drop its connection. The
	 * provider takes one fi_av_remove per fi_av_insert. tcp;ofi_rxm
	 * (1.17) crashes dropping a connection that still carries RMA (as in
	 * fab_close): nodes whose source list lost a peer with reads in
	 * flight died in fi_av_remove. So while transfers to the peer are
	 * with the provider, the removal waits for them (they end with
	 * -ECONNABORTED or their result; fab__av_reap_doomed). */
	fab__fail_parked_peer(ctx, addr);
	if (transfers_to(ctx, addr)) {
		r->doomed = true;
		ctx->av_doomed++;
		return 0;
	}
	return forget(ctx, addr);
}
