/* Memory regions: registration under the provider's mr_mode, remote keys. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "fabric/fab_internal.h"
#include "proto/log.h"

static uint64_t fi_access(unsigned access)
{
	uint64_t a = 0;

	if (access & FAB_MR_REMOTE_READ)
		a |= FI_REMOTE_READ;
	if (access & FAB_MR_REMOTE_WRITE)
		a |= FI_REMOTE_WRITE;
	if (access & FAB_MR_READ)
		a |= FI_READ;
	if (access & FAB_MR_WRITE)
		a |= FI_WRITE;
	return a;
}

/* A random key of the provider's key size (at most 64 bits; never 0), or
 * -EIO when the system has no randomness to give. */
static int random_key(const struct fab_ctx *ctx, uint64_t *out)
{
	size_t bytes = ctx->info->domain_attr->mr_key_size;
	uint64_t k = 0;

	while (k == 0) {
		ssize_t n = getrandom(&k, sizeof(k), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(k))
			return -EIO;
		if (bytes > 0 && bytes < sizeof(k))
			k &= (1ull << (8 * bytes)) - 1;
	}
	*out = k;
	return 0;
}

int fab__mr_reg_private(struct fab_ctx *ctx, void *buf, size_t len,
			uint64_t access, struct fab_mr **out)
{
	return fab__mr_reg_iface(ctx, buf, len, access, FI_HMEM_SYSTEM, 0, out);
}

/* Registers without putting the region on ctx's list. */
int fab__mr_reg_iface(struct fab_ctx *ctx, void *buf, size_t len, uint64_t access,
		      enum fi_hmem_iface iface, int dev, struct fab_mr **out)
{
	struct fab_mr *m;
	uint64_t want_key = 0;
	int ret;

	*out = NULL;
	if (ctx->closing)
		return -ESHUTDOWN;
	if (buf == NULL || len == 0 || access == 0)
		return -EINVAL;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return -ENOMEM;
	/* Without FI_MR_PROV_KEY the keys are ours: random, so that a key
	 * cannot be guessed (a region is readable by whoever knows its key),
	 * and drawn again in the unlikely case the provider has it already. */
	for (int tries = 0;; tries++) {
		if (!(ctx->mr_mode & FI_MR_PROV_KEY) &&
		    (ret = random_key(ctx, &want_key)) != 0) {
			m->mr = NULL;
			goto fail;
		}
		if (iface == FI_HMEM_SYSTEM) {
			ret = fi_mr_reg(ctx->domain, buf, len, access, 0, want_key, 0,
					&m->mr, NULL);
		} else {
			struct iovec iov = {.iov_base = buf, .iov_len = len};
			struct fi_mr_attr attr = {.mr_iov = &iov, .iov_count = 1,
						  .access = access, .requested_key = want_key,
						  .iface = iface};
			attr.device.cuda = dev;
			ret = fi_mr_regattr(ctx->domain, &attr, 0, &m->mr);
		}
		if (ret != -FI_ENOKEY || (ctx->mr_mode & FI_MR_PROV_KEY) ||
		    tries == 8)
			break;
	}
	if (ret != 0) {
		m->mr = NULL;
		ret = FAB_FI_ERR(ret, "fi_mr_reg");
		goto fail;
	}
	/* FI_MR_ENDPOINT: a region works only once bound and enabled. */
	if (ctx->mr_mode & FI_MR_ENDPOINT) {
		ret = fi_mr_bind(m->mr, &ctx->ep->fid, 0);
		if (ret != 0) {
			ret = FAB_FI_ERR(ret, "fi_mr_bind");
			goto fail;
		}
		ret = fi_mr_enable(m->mr);
		if (ret != 0) {
			ret = FAB_FI_ERR(ret, "fi_mr_enable");
			goto fail;
		}
	}
	m->key = fi_mr_key(m->mr);
	if (m->key == FI_KEY_NOTAVAIL) {
		LOG_ERR("fabric: provider gives no 64-bit key for a region");
		ret = -ENOTSUP;
		goto fail;
	}
	m->ctx = ctx;
	m->buf = buf;
	m->len = len;
	/* Passed with every local buffer, needed or not (FI_MR_LOCAL). */
	m->desc = fi_mr_desc(m->mr);
	*out = m;
	return 0;

fail:
	if (m->mr != NULL)
		fi_close(&m->mr->fid);
	free(m);
	return ret;
}

void fab__mr_close_private(struct fab_mr *m)
{
	int ret;

	if (m == NULL)
		return;
	ret = fi_close(&m->mr->fid);
	if (ret != 0)
		FAB_FI_ERR(ret, "fi_close(mr)");
	free(m);
}

/* Registers and puts the region on ctx's list. */
static int reg_listed(struct fab_ctx *ctx, void *buf, size_t len, unsigned access,
		      enum fi_hmem_iface iface, int dev, struct fab_mr **out)
{
	struct fab_mr *m;
	int ret;

	*out = NULL;
	if (access == 0 || access & ~(FAB_MR_REMOTE_READ | FAB_MR_REMOTE_WRITE |
				      FAB_MR_READ | FAB_MR_WRITE))
		return -EINVAL;
	ret = fab__mr_reg_iface(ctx, buf, len, fi_access(access), iface, dev, &m);
	if (ret != 0)
		return ret;
	m->access = access;
	m->next = ctx->mrs;
	if (ctx->mrs != NULL)
		ctx->mrs->prev = m;
	ctx->mrs = m;
	*out = m;
	return 0;
}

int fab_mr_reg(struct fab_ctx *ctx, void *buf, size_t len, unsigned access,
	       struct fab_mr **out)
{
	return reg_listed(ctx, buf, len, access, FI_HMEM_SYSTEM, 0, out);
}

bool fab_hmem_cuda(const struct fab_ctx *ctx)
{
	return ctx->hmem;
}

int fab_mr_reg_cuda(struct fab_ctx *ctx, void *dptr, size_t len, unsigned access, int dev,
		    struct fab_mr **out)
{
	*out = NULL;
	if (!ctx->hmem)
		return -EOPNOTSUPP;
	return reg_listed(ctx, dptr, len, access, FI_HMEM_CUDA, dev, out);
}

void fab_mr_close(struct fab_mr *m)
{
	struct fab_ctx *ctx;

	if (m == NULL)
		return;
	ctx = m->ctx;
	if (m->prev != NULL)
		m->prev->next = m->next;
	else
		ctx->mrs = m->next;
	if (m->next != NULL)
		m->next->prev = m->prev;
	fab__mr_close_private(m);
}

void fab__mr_close_all(struct fab_ctx *ctx)
{
	while (ctx->mrs != NULL)
		fab_mr_close(ctx->mrs);
}

void *fab_mr_buf(const struct fab_mr *m)
{
	return m->buf;
}

size_t fab_mr_len(const struct fab_mr *m)
{
	return m->len;
}

void fab_mr_rkey(const struct fab_mr *m, struct fab_rkey *out)
{
	out->addr = (m->ctx->mr_mode & FI_MR_VIRT_ADDR) ? (uintptr_t)m->buf : 0;
	out->key = m->key;
	out->len = m->len;
}

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

void fab_rkey_pack(const struct fab_rkey *rk, uint8_t out[FAB_RKEY_LEN])
{
	put_le64(out, rk->addr);
	put_le64(out + 8, rk->key);
	put_le64(out + 16, rk->len);
}

int fab_rkey_unpack(const uint8_t *buf, size_t len, struct fab_rkey *out)
{
	struct fab_rkey rk;

	if (len != FAB_RKEY_LEN)
		return -EINVAL;
	rk.addr = get_le64(buf);
	rk.key = get_le64(buf + 8);
	rk.len = get_le64(buf + 16);
	if (rk.len == 0 || rk.addr + rk.len < rk.addr)
		return -EINVAL;
	*out = rk;
	return 0;
}
