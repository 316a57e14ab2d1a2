/* Serving parcels to peers: memory, registration, offers (see serve.h). */
#include "node/serve/serve.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>

#include "proto/log.h"
#include "proto/params.h"

#define HUGE_ALIGN (2u << 20) /* large buffers: transparent huge pages */

/* Large buffers are aligned to 2 MiB and asked for transparent huge pages:
 * first-touch faults of 4 KiB pages cost about as much as a gather itself
 * (measured: 1.1 s vs 60 ms to touch 220 MiB on a VM). */
uint8_t *node_serve_map(size_t cap)
{
	size_t slop = cap >= HUGE_ALIGN ? HUGE_ALIGN : 0, head;
	uint8_t *b = mmap(NULL, cap + slop, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uintptr_t a;

	if (b == MAP_FAILED)
		return NULL;
	if (slop == 0)
		return b;
	a = ((uintptr_t)b + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
	head = a - (uintptr_t)b;
	if (head > 0)
		munmap(b, head);
	if (slop > head)
		munmap((uint8_t *)a + cap, slop - head);
	if (proto_param(PROTO_PARAM_HUGE_PAGES) != 0)
		(void)madvise((void *)a, cap, MADV_HUGEPAGE); /* a hint; 4 KiB pages work */
	return (uint8_t *)a;
}

void node_serve_unmap(uint8_t *b, size_t cap)
{
	if (b != NULL)
		munmap(b, cap);
}

int node_serve_reg(struct fab_ctx *fab, void *buf, size_t len, bool also_land,
		   struct fab_mr **out)
{
	return fab_mr_reg(fab, buf, len, FAB_MR_REMOTE_READ | (also_land ? FAB_MR_READ : 0), out);
}

void node_serve_offer_fill(struct trk_offer *o, const uint8_t *layout, uint32_t src_rank,
			   uint32_t dst_rank, const struct fab_mr *mr, uint64_t off, uint64_t len)
{
	struct fab_rkey rk;

	fab_mr_rkey(mr, &rk);
	memcpy(o->layout, layout, sizeof(o->layout));
	o->src_rank = src_rank;
	o->dst_rank = dst_rank;
	o->addr = rk.addr + off;
	o->key = rk.key;
	o->len = len;
}

int node_serve_offer_send(struct trk_client *trk, const char *id, struct node_serve_offer *so,
			  uint64_t gen, uint64_t snapshot_ms, const struct trk_publish_report *report,
			  const struct trk_offer *list, size_t n, const struct trk_offer *slot,
			  trk_client_cb cb, void *arg)
{
	int rc;

	if (so->busy)
		return -EBUSY;
	rc = trk_client_offer_slot(trk, id, so->version, snapshot_ms, report, list, n, slot, cb,
				   arg);
	if (rc == 0) {
		so->busy = true;
		so->gen = gen;
	}
	return rc;
}

int node_serve_offer_done(struct node_serve_offer *so, const struct trk_answer *a,
			  uint64_t cur_gen, const char *what)
{
	so->busy = false;
	so->tried = true;
	if (a->status >= 200 && a->status < 300)
		return 1;
	if (a->status == 404 && so->gen == cur_gen)
		return 0;
	if (!so->warned) {
		so->warned = true;
		LOG_WARN("%s version %" PRIu64 ": %s (will retry)", what, so->version, a->error);
	}
	return -1;
}
