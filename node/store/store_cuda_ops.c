/* The CUDA store: a device buffer per slot, filled while the fetch runs
 * (verified chunks through the pinned upload ring) or at activation, and
 * shared with the serving process through a CUDA IPC handle. */
#include "node/store/store.h"

#ifdef TESSERA_CUDA
#include <errno.h>
#include <sodium.h>

#include "proto/log.h"
#include "proto/params.h"

_Static_assert(sizeof(struct proto_span) == sizeof(struct node_cuda_span) &&
		       offsetof(struct proto_span, dst_off) == offsetof(struct node_cuda_span, dst_off) &&
		       offsetof(struct proto_span, src_off) == offsetof(struct node_cuda_span, src_off) &&
		       offsetof(struct proto_span, len) == offsetof(struct node_cuda_span, len),
	       "a plan's spans are handed to the upload ring as they are");

/* The device buffer exists from the slot's creation, so that chunks can be
 * uploaded the moment they verify. */
static int cuda_attach(struct node_store *s, struct node_slot *slot, struct proto_err *err)
{
	char why[256];
	int rc;

	slot->streaming = false;
	if (slot->dev != NULL)
		return 0;
	rc = node_cuda_alloc(s->device, slot->len, &slot->dev, why, sizeof(why));
	return rc == 0 ? 0 : proto_errf(err, -rc, "store cuda: %s", why);
}

static int cuda_upload(struct node_store *s, struct node_slot *slot, const struct proto_span *spans,
		       size_t nspans, const uint8_t *buf, size_t len, struct proto_err *err)
{
	char why[256];
	int rc;

	if (nspans > UINT32_MAX)
		return proto_errf(err, EINVAL, "store cuda: %zu spans in one chunk", nspans);
	rc = node_cuda_ring_put(s->ring, slot->dev, (const struct node_cuda_span *)spans,
				(uint32_t)nspans, buf, len, why, sizeof(why));
	return rc == 0 ? 0 : proto_errf(err, -rc, "store cuda: %s", why);
}

/* Activation: the chunks uploaded while fetching, once the stream has
 * them all; otherwise (a slot rebuilt from its parent, written in place, or
 * a failed upload) the whole slot now. */
static int cuda_activate(struct node_store *s, struct node_slot *slot, struct proto_err *err)
{
	char why[256];
	int rc;

	if (slot->dev == NULL && (rc = cuda_attach(s, slot, err)) != 0)
		return rc;
	bool streamed = __atomic_load_n(&slot->streaming, __ATOMIC_RELAXED) &&
			__atomic_load_n(&slot->streamed, __ATOMIC_RELAXED) == slot->stream_expect;
	slot->streaming = false;
	rc = node_cuda_ring_wait(s->ring, why, sizeof(why));
	if (rc == 0 && streamed) {
		LOG_DEBUG("store cuda: v%llu: %llu bytes were uploaded while fetching",
			  (unsigned long long)slot->version, (unsigned long long)slot->stream_expect);
		return 0;
	}
	if (rc != 0)
		LOG_WARN("store cuda: v%llu: %s; uploading the slot whole",
			 (unsigned long long)slot->version, why);
	rc = node_cuda_upload(s->device, slot->dev, slot->host, slot->len, why, sizeof(why));
	return rc == 0 ? 0 : proto_errf(err, -rc, "store cuda: %s", why);
}

/* Changes scattered at a time: a delta chunk's at most at the default
 * TESSERA_DELTA_CHUNK (larger chunks go through in turns). */
#define SCATTER_BATCH (1u << 22)

/* The patches' changes into the device copy, chunk by chunk; -EAGAIN when
 * the device copy was not their parent (the checksum movement differs). */
static int scatter_patches(struct node_store *s, struct node_slot *slot,
			   const struct proto_dpatch *p, size_t n, char *why, size_t whylen)
{
	int rc;

	if (s->scatter == NULL &&
	    (rc = node_cuda_scatter_new(s->device, SCATTER_BATCH, &s->scatter, why, whylen)) != 0)
		return rc;
	for (size_t k = 0; k < n; k++) {
		for (uint32_t ci = 0; ci < p[k].nchunks; ci++) {
			const struct proto_dpatch_chunk *pc = &p[k].chunks[ci];
			uint64_t moved;
			if (pc->n == 0)
				continue;
			size_t off = (size_t)(pc->dst - slot->host);
			if (pc->dst < slot->host || off >= slot->len) {
				snprintf(why, whylen, "a change outside the slot");
				return -EINVAL;
			}
			rc = node_cuda_scatter_apply32(s->scatter, (uint8_t *)slot->dev + off,
						       (slot->len - off) / pc->w, pc->w, pc->pos, pc->val,
						       pc->n, &moved, why, whylen);
			if (rc != 0)
				return rc;
			if (moved != pc->part) {
				snprintf(why, whylen, "the device copy was not the delta's parent (patch %zu "
					 "chunk %u)", k, ci);
				return -EAGAIN;
			}
		}
	}
	return 0;
}

/* In place: the prepared changes scattered into the device copy, which
 * still holds the parent (its checksum movement on the device equals the
 * host's chunk by chunk); otherwise the slot uploaded whole. */
static int cuda_activate_patched(struct node_store *s, struct node_slot *slot,
				 const struct proto_dpatch *p, size_t n, struct proto_err *err)
{
	char why[256];
	int rc;

	if (slot->dev == NULL)
		return cuda_activate(s, slot, err);
	rc = node_cuda_ring_wait(s->ring, why, sizeof(why));
	if (rc == 0)
		rc = scatter_patches(s, slot, p, n, why, sizeof(why));
	if (rc == 0)
		return 0;
	LOG_WARN("store cuda: v%llu: %s; uploading the slot whole", (unsigned long long)slot->version,
		 why);
	rc = node_cuda_upload(s->device, slot->dev, slot->host, slot->len, why, sizeof(why));
	return rc == 0 ? 0 : proto_errf(err, -rc, "store cuda: %s", why);
}

static int cuda_describe(struct node_store *s, const struct node_slot *slot, json_t *obj)
{
	uint8_t h[64];
	char hex[129], why[256];

	if (slot->dev == NULL)
		return 0;
	if (node_cuda_ipc_handle(slot->dev, h, why, sizeof(why)) != 0)
		return -EIO;
	sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
	json_object_set_new(obj, "cuda_device", json_integer(s->device));
	json_object_set_new(obj, "cuda_ipc_handle", json_string(hex));
	return 0;
}

/* Uploads queued into the buffer finish before it goes. */
static void cuda_detach(struct node_store *s, struct node_slot *slot)
{
	char why[256];

	if (slot->streaming && node_cuda_ring_wait(s->ring, why, sizeof(why)) != 0)
		LOG_DEBUG("store cuda: v%llu dropped: %s", (unsigned long long)slot->version, why);
	slot->streaming = false;
	node_cuda_free(slot->dev);
	slot->dev = NULL;
}

static void cuda_close(struct node_store *s)
{
	node_cuda_scatter_free(s->scatter);
	s->scatter = NULL;
	node_cuda_ring_free(s->ring);
	s->ring = NULL;
}

static const struct node_store_ops node_store_cuda_ops = {
	.name = "cuda",
	.attach = cuda_attach,
	.activate = cuda_activate,
	.describe = cuda_describe,
	.detach = cuda_detach,
	.upload = cuda_upload,
	.activate_patched = cuda_activate_patched,
	.close = cuda_close,
};

int node_store_cuda_open(struct node_store *s, int dev, char *why, size_t whylen)
{
	struct node_cuda_ring *ring;
	int rc = node_cuda_ring_new(dev, proto_param(PROTO_PARAM_CUDA_RING_ENTRY),
				    (unsigned)proto_param(PROTO_PARAM_CUDA_RING_ENTRIES), &ring, why,
				    whylen);
	if (rc != 0)
		return rc;
	s->ops = &node_store_cuda_ops;
	s->device = dev;
	s->ring = ring;
	LOG_INFO("store cuda: device %d, uploads while fetching through %llu pinned entries of %llu KiB",
		 dev, (unsigned long long)proto_param(PROTO_PARAM_CUDA_RING_ENTRIES),
		 (unsigned long long)proto_param(PROTO_PARAM_CUDA_RING_ENTRY) >> 10);
	return 0;
}
#endif
