/* The address vector: peers' raw endpoint addresses to fi_addr_t handles. */
#include <errno.h>
#include <netinet/in.h>
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
	return 0;
}

int fab_av_remove(struct fab_ctx *ctx, fi_addr_t addr)
{
	fab__fail_parked_peer(ctx, addr);
	int ret = fi_av_remove(ctx->av, &addr, 1, 0);

	return ret != 0 ? FAB_FI_ERR(ret, "fi_av_remove") : 0;
}
