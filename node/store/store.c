/* Slots in shared host memory (memfd), and the store selection. */
#include "node/store/store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "proto/log.h"

extern const struct node_store_ops node_store_host_ops;

/* What a store name asks for: 0 host or auto, 1 cuda (device *dev), -EINVAL
 * none of those. */
static int store_kind(const char *name, uint64_t *dev)
{
	*dev = 0;
	if (strcmp(name, "host") == 0 || strcmp(name, "auto") == 0)
		return 0;
	if (strncmp(name, "cuda", 4) == 0 &&
	    (name[4] == '\0' || (name[4] == ':' && proto_parse_u64(name + 5, 0, 1023, dev) == 0)))
		return 1;
	return -EINVAL;
}

int node_store_name_check(const char *name, struct proto_err *err)
{
	uint64_t dev;

	if (store_kind(name, &dev) < 0)
		return proto_errf(err, EINVAL, "want host, cuda, cuda:DEVICE or auto");
	return 0;
}

int node_store_open(const char *name, struct node_store *out, struct proto_err *err)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_init(&out->mu, NULL);
	out->device = -1;
	out->ops = &node_store_host_ops;
	if (strcmp(name, "host") == 0)
		return 0;
	/* "cuda:N": device N (checked against those visible below). */
	uint64_t dev = 0;
	int kind = store_kind(name, &dev);
	bool cuda = kind == 1;
	if (kind < 0)
		return proto_errf(err, EINVAL, "store %s: want host, cuda, cuda:DEVICE or auto", name);
#ifdef TESSERA_CUDA
	char why[256];
	int ndev = 0;
	if (node_cuda_probe(&ndev, why, sizeof(why)) == 0 && (int)dev >= ndev)
		snprintf(why, sizeof(why), "no CUDA device %d (%d visible)", (int)dev, ndev);
	else if (ndev > 0 && node_store_cuda_open(out, (int)dev, why, sizeof(why)) == 0)
		return 0;
#else
	const char *why = "tessera was built without CUDA (no nvcc)";
#endif
	if (cuda)
		return proto_errf(err, ENODEV, "store %s: %s", name, why);
	LOG_INFO("store: %s; serving weights stay in host memory", why);
	return 0;
}

void node_store_spread(struct node_store *s, unsigned index)
{
#ifdef TESSERA_CUDA
	char why[256];
	int ndev = 0;

	if (s->device < 0 || node_cuda_probe(&ndev, why, sizeof(why)) != 0 || ndev <= 0)
		return;
	int dev = (int)(((unsigned)s->device + index) % (unsigned)ndev);
	if (dev == s->device)
		return;
	struct node_cuda_ring *ring = s->ring;
	/* The upload ring is pinned for its device: make the new one first. */
	if (node_store_cuda_open(s, dev, why, sizeof(why)) != 0) {
		LOG_WARN("store cuda: rank %u stays on device %d: %s", index, s->device, why);
		return;
	}
	node_cuda_ring_free(ring);
#else
	(void)s;
	(void)index;
#endif
}

static void slot_release(struct node_store *s, struct node_slot *slot)
{
	munmap(slot->host, slot->len ? slot->len : 1);
	close(slot->memfd);
	free(slot);
}

void node_store_keep_spare(struct node_store *s)
{
	s->keep_spare = true;
}

void node_store_close(struct node_store *s)
{
	if (s->ops == NULL) /* never opened: the agent failed before its store */
		return;
	pthread_mutex_lock(&s->mu);
	struct node_slot *spare = s->spare;
	s->spare = NULL;
	s->keep_spare = false;
	pthread_mutex_unlock(&s->mu);
	if (spare != NULL)
		slot_release(s, spare);
	if (s->ops->close != NULL)
		s->ops->close(s);
}

/* The spare slot if it has len bytes (and tag, when not 0), attached
 * again, else NULL. */
static struct node_slot *take_spare(struct node_store *s, uint64_t tag, uint64_t version,
				    size_t len)
{
	struct node_slot *slot = NULL, *drop = NULL;
	struct proto_err err;

	pthread_mutex_lock(&s->mu);
	if (tag != 0 && (s->spare == NULL || s->spare->tag != tag || s->spare->len != len)) {
		pthread_mutex_unlock(&s->mu);
		return NULL; /* left for whoever wants it as memory */
	}
	if (s->spare != NULL && s->spare->len == len)
		slot = s->spare;
	else
		drop = s->spare; /* another size: the layout changed, it will not fit again */
	s->spare = NULL;
	pthread_mutex_unlock(&s->mu);
	if (drop != NULL)
		slot_release(s, drop);
	if (slot == NULL)
		return NULL;
	slot->version = version; /* fresh stays: only a write through host clears it */
	slot->reused = true;
	if (s->ops->attach != NULL && s->ops->attach(s, slot, &err) != 0) {
		LOG_WARN("store: cannot reuse a retired slot (%s); making a new one", err.msg);
		slot_release(s, slot);
		return NULL;
	}
	return slot;
}

/* node_slot_new and node_slot_new_blank: populate says whether the new
 * slot's pages are allocated (cleared) and mapped now. */
static int slot_new(struct node_store *s, uint64_t version, size_t len, bool populate,
		    struct node_slot **out, struct proto_err *err)
{
	struct node_slot *slot;
	char name[64];
	int rc;

	*out = take_spare(s, 0, version, len);
	if (*out != NULL) {
		(*out)->tag = 0; /* the caller writes it anew */
		return 0;
	}
	slot = calloc(1, sizeof(*slot));
	if (slot == NULL)
		return proto_errf(err, ENOMEM, "slot: out of memory");
	slot->version = version;
	slot->len = len;
	slot->fresh = true;
	slot->reused = false;
	snprintf(name, sizeof(name), "tessera-v%llu", (unsigned long long)version);
	slot->memfd = memfd_create(name, MFD_CLOEXEC);
	if (slot->memfd < 0) {
		rc = proto_errf(err, errno, "memfd_create: %s", strerror(errno));
		free(slot);
		return rc;
	}
	if (ftruncate(slot->memfd, (off_t)(len ? len : 1)) != 0) {
		rc = proto_errf(err, errno, "slot of %zu bytes: %s", len, strerror(errno));
		goto fail;
	}
	/* Populate now: one batched allocation instead of a fault per page
	 * while chunks land (faults cost microseconds each in a VM). */
	slot->host = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE,
			  MAP_SHARED | (populate ? MAP_POPULATE : 0), slot->memfd, 0);
	if (slot->host == MAP_FAILED) {
		slot->host = NULL;
		rc = proto_errf(err, errno, "mmap slot of %zu bytes: %s", len, strerror(errno));
		goto fail;
	}
	rc = s->ops->attach ? s->ops->attach(s, slot, err) : 0;
	if (rc != 0)
		goto fail;
	*out = slot;
	return 0;
fail:
	if (slot->host != NULL)
		munmap(slot->host, len ? len : 1);
	close(slot->memfd);
	free(slot);
	return rc;
}

int node_slot_new(struct node_store *s, uint64_t version, size_t len, struct node_slot **out,
		  struct proto_err *err)
{
	return slot_new(s, version, len, true, out, err);
}

int node_slot_new_blank(struct node_store *s, uint64_t version, size_t len,
			struct node_slot **out, struct proto_err *err)
{
	/* A store that attaches (the CUDA store pins the pages) maps them
	 * all in at once anyway: populated as usual. */
	return slot_new(s, version, len, s->ops->attach != NULL, out, err);
}

void node_slot_free(struct node_store *s, struct node_slot *slot)
{
	if (slot == NULL)
		return;
	if (s->ops->detach)
		s->ops->detach(s, slot);
	/* A slot retired later (a larger tag) displaces the spare: it is
	 * the one a delta can be built in (node/rebuild/slots.c, rotation). */
	struct node_slot *drop = slot;
	pthread_mutex_lock(&s->mu);
	if (s->keep_spare && (s->spare == NULL || slot->tag > s->spare->tag)) {
		drop = s->spare;
		s->spare = slot;
	}
	pthread_mutex_unlock(&s->mu);
	if (drop != NULL)
		slot_release(s, drop);
}

/* Waits while *pause is set; false once *stop is. */
static bool touch_may_go(const int *stop, const int *pause)
{
	const struct timespec nap = {0, 5 * 1000 * 1000};

	while (pause != NULL && __atomic_load_n(pause, __ATOMIC_RELAXED) &&
	       !__atomic_load_n(stop, __ATOMIC_RELAXED))
		nanosleep(&nap, NULL);
	return !__atomic_load_n(stop, __ATOMIC_RELAXED);
}

int node_slot_populate(struct node_slot *slot, const int *stop, const int *pause)
{
	/* 1 MiB a call: the caller's loop waits at most that long for the
	 * address space (a mmap there waits for a call under way). */
	size_t step = 1u << 20;

	for (size_t off = 0; off < slot->len; off += step) {
		size_t n = slot->len - off < step ? slot->len - off : step;
		if (!touch_may_go(stop, pause))
			return -EINTR;
		if (madvise(slot->host + off, n, MADV_POPULATE_WRITE) != 0)
			return errno == EINVAL ? -ENOTSUP : -errno;
	}
	return 0;
}

int node_slot_touch(struct node_slot *slot, const int *stop, const int *pause)
{
	/* Small steps: whoever stops the touch (warm_take, on the node's
	 * loop) joins this worker, which runs at the lowest priority and on a
	 * busy machine gets a sliver of a CPU: it sees the flag every 16
	 * pages: at the lowest priority on a loaded machine, a 1 MiB step's
	 * traps held the loop's join of this worker for 60-600 ms (measured,
	 * 5 nodes on 2 cores). */
	size_t page = (size_t)sysconf(_SC_PAGESIZE);

	for (size_t at = 0, k = 0; at < slot->len; at += page, k++) {
		if ((k & 15) == 0 && !touch_may_go(stop, pause))
			return -EINTR;
		(void)*(volatile const uint8_t *)(slot->host + at);
	}
	return 0;
}

int node_slot_reuse(struct node_store *s, uint64_t tag, uint64_t version, size_t len,
		    struct node_slot **out)
{
	*out = tag != 0 ? take_spare(s, tag, version, len) : NULL;
	if (*out == NULL)
		return -ENOENT;
	(*out)->tag = 0; /* the caller writes it: what it holds is the caller's to say */
	return 0;
}

int node_slot_take_spare(struct node_store *s, uint64_t version, size_t len,
			 struct node_slot **out)
{
	*out = take_spare(s, 0, version, len);
	if (*out == NULL)
		return -ENOENT;
	(*out)->tag = 0;
	return 0;
}

int node_slot_activate(struct node_store *s, struct node_slot *slot, struct proto_err *err)
{
	return s->ops->activate ? s->ops->activate(s, slot, err) : 0;
}

int node_slot_activate_patched(struct node_store *s, struct node_slot *slot,
			       const struct proto_dpatch *p, size_t n, struct proto_err *err)
{
	if (s->ops->activate_patched != NULL)
		return s->ops->activate_patched(s, slot, p, n, err);
	return node_slot_activate(s, slot, err);
}

bool node_store_streams(const struct node_store *s)
{
	return s->ops->upload != NULL;
}

void node_slot_stream_begin(struct node_store *s, struct node_slot *slot, uint64_t expect)
{
	slot->streaming = node_store_streams(s);
	slot->stream_expect = expect;
	__atomic_store_n(&slot->streamed, 0, __ATOMIC_RELAXED);
}

void node_slot_stream_chunk(struct node_store *s, struct node_slot *slot,
			    const struct proto_plan *p, const struct proto_parcel *pc,
			    const struct proto_layout *dst, uint64_t off, const uint8_t *buf,
			    size_t len)
{
	struct proto_span few[64], *spans = few;
	struct proto_err err;
	size_t n;

	if (!__atomic_load_n(&slot->streaming, __ATOMIC_RELAXED))
		return;
	n = proto_parcel_spans(p, pc, dst, off, len, few, PROTO_ARRAY_LEN(few));
	if (n > PROTO_ARRAY_LEN(few)) {
		spans = malloc(n * sizeof(*spans));
		if (spans == NULL) {
			proto_errf(&err, ENOMEM, "no memory for %zu spans", n);
			goto fail;
		}
		n = proto_parcel_spans(p, pc, dst, off, len, spans, n);
	}
	if (s->ops->upload(s, slot, spans, n, buf, len, &err) != 0)
		goto fail;
	__atomic_add_fetch(&slot->streamed, len, __ATOMIC_RELAXED);
	if (spans != few)
		free(spans);
	return;
fail:
	/* The first failure stops streaming this slot; the others are quiet. */
	if (__atomic_exchange_n(&slot->streaming, false, __ATOMIC_RELAXED))
		LOG_WARN("store %s: v%llu: %s; the slot is uploaded whole at activation",
			 s->ops->name, (unsigned long long)slot->version, err.msg);
	if (spans != few)
		free(spans);
}

json_t *node_slot_describe(struct node_store *s, const struct node_slot *slot)
{
	char path[64];
	json_t *o;

	snprintf(path, sizeof(path), "/proc/%ld/fd/%d", (long)getpid(), slot->memfd);
	o = json_pack("{s:s,s:s,s:I,s:I}", "store", s->ops->name, "memfd_path", path, "size",
		      (json_int_t)slot->len, "version", (json_int_t)slot->version);
	if (o != NULL && s->ops->describe != NULL && s->ops->describe(s, slot, o) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* The host store: the memfd slot is what serving maps; nothing more to do. */
const struct node_store_ops node_store_host_ops = {
	.name = "host",
};
