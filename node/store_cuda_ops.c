/* The CUDA store: slots are copied into GPU memory at activation and shared
 * with the serving process through a CUDA IPC handle. */
#include "node/store.h"

#ifdef TESSERA_CUDA
#include <errno.h>
#include <sodium.h>

static int cuda_activate(struct node_store *s, struct node_slot *slot, struct proto_err *err)
{
	char why[256];
	int rc;

	if (slot->dev == NULL) {
		rc = node_cuda_alloc(s->device, slot->len, &slot->dev, why, sizeof(why));
		if (rc != 0)
			return proto_errf(err, -rc, "store cuda: %s", why);
	}
	rc = node_cuda_upload(s->device, slot->dev, slot->host, slot->len, why, sizeof(why));
	if (rc != 0)
		return proto_errf(err, -rc, "store cuda: %s", why);
	return 0;
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

static void cuda_detach(struct node_store *s, struct node_slot *slot)
{
	node_cuda_free(slot->dev);
	slot->dev = NULL;
}

const struct node_store_ops node_store_cuda_ops = {
	.name = "cuda",
	.activate = cuda_activate,
	.describe = cuda_describe,
	.detach = cuda_detach,
};
#endif
