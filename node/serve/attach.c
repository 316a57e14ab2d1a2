/* The attach server: serving processes pin and map the served slot (see attach.h). */
#include "node/serve/attach.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/serve/attach_reap.h"
#include "node/client/wire.h"
#include "proto/log.h"
#include "proto/params.h"

/* Protocol 3's table header: u32 tensors, u64 bytes, digest, u8 store, u8
 * install, u8 holding (set per client). */
#define TABLE3_HOLDING (4 + 8 + 32 + 1 + 1)

/* A slot the server knows: the active one, or a retired one still pinned. */
struct att_ver {
	struct att_ver *next;
	struct node_slot *slot;
	uint64_t version;
	uint8_t digest[32];
	uint32_t pins;    /* socket pins; pin pages hold the others */
	uint8_t entry;    /* in the pin pages (TSR_ENTRY_NONE: none) */
	bool retired;
	bool evicting;    /* its clients are being dropped: not freed meanwhile */
	/* Attribution: when it became active, requests that ran on it and the
	 * wall clock of the first and last (logged when it is forgotten). */
	uint64_t activated_ms, requests, first_pin_ms, last_pin_ms;
};

struct att_pin {
	uint64_t id;
	struct att_ver *v;
};

/* One queued frame; fd (a dup of a memfd, or -1) rides with its first byte. */
struct att_out {
	struct att_out *next;
	size_t len, off;
	int fd;
	uint8_t data[];
};

struct att_client {
	struct att_client *next, *prev;
	struct node_attach *at;
	int fd;
	struct event *rev, *wev;
	uint8_t in[TSR_WIRE_HDR + TSR_WIRE_REQ_MAX];
	size_t inlen;
	bool attached;
	bool throttled; /* its replies are unread: its requests wait (OUT_HIGH) */
	bool closing; /* reads nothing more; closed once its output is written */
	bool dead;    /* closed at the next flush, its output dropped */
	struct att_out *out_head, *out_tail;
	size_t out_bytes;
	struct att_pin *pins;
	uint32_t npins, cap;
	uint64_t next_pin;
	/* Protocol 2: its pin page (the client writes it; read here only) and
	 * each entry's request count when the entry took its version. */
	uint16_t proto;
	int page_fd;
	uint8_t *page;
	uint64_t base[TSR_ENTRIES];
	/* Protocol 3: the versions held for it (each one of v->pins), oldest
	 * first, when it attached with TSR_ATTACH_HOLD on a double-buffered node. */
	bool hold;
	struct att_ver **holds;
	uint32_t nholds;
};

struct node_attach {
	struct event_base *base;
	struct node_attach_info info;
	char *replica;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int lfd;
	struct event *lev;
	struct att_ver *vers;
	struct att_ver *active;
	struct att_client *clients;
	uint32_t nclients;
	struct node_reaper *reaper; /* frees retired host slots off the loop; NULL: inline */
	uint8_t *table; /* the ATTACHED frame, built once (protocols 1, 2) */
	size_t table_len;
	uint8_t *table3; /* and protocol 3's, with each tensor's pieces */
	size_t table3_len;
	/* Protocol 2: the epoch page (the state word clients read) and the
	 * entries given to versions (a bit each). */
	int epoch_fd;
	uint8_t *epoch;
	uint64_t entries;
	struct event *scan_ev; /* looks at the pin pages while a retired version is pinned */
	/* An in-place install: admission paused for version paused_for;
	 * drained(arg) once nothing pins the active slot (via drain_ev, from
	 * the loop, never from inside a handler). */
	bool paused;
	uint64_t paused_for;
	void (*drained)(void *arg);
	void *drained_arg;
	struct event *drain_ev;
};

static void client_close(struct att_client *c);
static void client_flush(struct att_client *c);

/*
 * Who frees a client: only client_flush() and the event handlers, as the
 * last thing they do with it. Everything in between marks it (closing,
 * dead), so no handler touches a freed client.
 */
static void client_kill(struct att_client *c)
{
	c->closing = c->dead = true;
	if (c->page != NULL) /* its page's pins stop counting now */
		__atomic_store_n((uint32_t *)(void *)(c->page + TSR_PAGE_REVOKED), 1,
				 __ATOMIC_SEQ_CST);
}

/* ---- protocol 2's pages -------------------------------------------------------- */

/* A sealed memfd of one page, mapped read-write here. future_write: clients
 * can map it read-only only. -errno on failure (nothing left open). */
static int page_new(const char *name, bool future_write, int *fd, uint8_t **map)
{
	unsigned seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
	int e;

	*fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (*fd < 0)
		return -errno;
	if (ftruncate(*fd, TSR_PAGE_SIZE) != 0)
		goto fail;
	*map = mmap(NULL, TSR_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	if (*map == MAP_FAILED)
		goto fail;
	/* Sealed against shrinking: a client cannot make our view fault. */
	if (fcntl(*fd, F_ADD_SEALS, seals | (future_write ? F_SEAL_FUTURE_WRITE : 0)) == 0)
		return 0;
	munmap(*map, TSR_PAGE_SIZE);
fail:
	e = errno;
	close(*fd);
	*fd = -1;
	*map = NULL;
	return -e;
}

static uint32_t page_pins(const struct att_client *c, uint8_t entry)
{
	return __atomic_load_n((uint32_t *)(void *)c->page + entry, __ATOMIC_SEQ_CST);
}

static uint64_t page_requests(const struct att_client *c, uint8_t entry)
{
	return __atomic_load_n((uint64_t *)(void *)(c->page + TSR_PAGE_REQUESTS) + entry,
			       __ATOMIC_RELAXED);
}

/* Publishes who admits requests now: one atomic store (the switch). */
static void epoch_publish(struct node_attach *at)
{
	uint64_t s = TSR_ENTRY_NONE;

	if (at->paused) /* an in-place install: acquires wait */
		s = (at->active != NULL ? at->active->version : at->paused_for) << 8 | TSR_ENTRY_NONE;
	else if (at->active != NULL)
		s = at->active->version << 8 |
		    (at->paused                           ? TSR_ENTRY_NONE
		     : at->active->entry == TSR_ENTRY_NONE ? TSR_ENTRY_SOCKET
							   : at->active->entry);
	if (at->epoch != NULL)
		__atomic_store_n((uint64_t *)(void *)(at->epoch + TSR_EPOCH_STATE), s,
				 __ATOMIC_SEQ_CST);
}

/* Pins on v: socket pins plus the pin pages of clients still attached.
 * Read after the state that retired v was published (see wire.h). */
static uint32_t ver_pins(const struct node_attach *at, const struct att_ver *v)
{
	uint64_t n = v->pins;

	if (v->entry != TSR_ENTRY_NONE)
		for (const struct att_client *c = at->clients; c != NULL; c = c->next)
			if (c->page != NULL && !c->closing)
				n += page_pins(c, v->entry);
	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Requests that ran on v: counted here (socket) and by each pin page. */
static uint64_t ver_requests(const struct node_attach *at, const struct att_ver *v)
{
	uint64_t n = v->requests;

	if (v->entry != TSR_ENTRY_NONE)
		for (const struct att_client *c = at->clients; c != NULL; c = c->next)
			if (c->page != NULL)
				n += page_requests(c, v->entry) - c->base[v->entry];
	return n;
}

/* ---- slots ----------------------------------------------------------------- */

static void ver_forget(struct node_attach *at, struct att_ver *v)
{
	for (struct att_ver **pp = &at->vers; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == v) {
			*pp = v->next;
			break;
		}
	}
	if (at->active == v) {
		at->active = NULL;
		epoch_publish(at);
	}
	LOG_INFO("attach: replica %s rank %u v%" PRIu64 " (active from %" PRIu64 " ms) ran %" PRIu64
		 " requests, pinned from %" PRIu64 " to %" PRIu64 " ms",
		 at->replica, at->info.rank, v->version, v->activated_ms, ver_requests(at, v),
		 v->first_pin_ms, v->last_pin_ms);
	if (v->entry != TSR_ENTRY_NONE)
		at->entries &= ~(1ull << v->entry);
	free(v);
}

/* v's pins may have gone: the drain goes on, a retired slot is freed. */
static void ver_check(struct node_attach *at, struct att_ver *v)
{
	uint32_t pins = ver_pins(at, v);

	if (v->evicting)
		return;
	if (pins == 0 && at->paused && at->drained != NULL && v == at->active)
		event_active(at->drain_ev, 0, 0);
	if (pins > 0 || !v->retired)
		return;
	LOG_INFO("attach: v%" PRIu64 " released by its last request; freeing its slot", v->version);
	node_reaper_free(at->reaper, at->info.store, v->slot);
	ver_forget(at, v);
}

static void ver_check_all(struct node_attach *at)
{
	bool retained = false;

	for (struct att_ver *v = at->vers, *next; v != NULL; v = next) {
		next = v->next;
		ver_check(at, v);
	}
	for (struct att_ver *v = at->vers; v != NULL; v = v->next)
		retained |= v->retired && v->entry != TSR_ENTRY_NONE;
	/* Releases through a pin page do not wake us (see wire.h): look again. */
	if (retained && at->scan_ev != NULL && !evtimer_pending(at->scan_ev, NULL)) {
		uint64_t ms = proto_param(PROTO_PARAM_ATTACH_SCAN_MS);
		struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
		evtimer_add(at->scan_ev, &tv);
	}
}

static void on_scan(evutil_socket_t fd, short what, void *arg)
{
	ver_check_all(arg);
}

static void ver_unpin(struct node_attach *at, struct att_ver *v)
{
	v->pins--;
	ver_check(at, v);
}

/* ---- output ------------------------------------------------------------------ */

/* Queues a frame of payload len (built by the caller into the returned
 * buffer past the header); fd is dup'ed. NULL: the client was dropped. */
static uint8_t *client_frame(struct att_client *c, uint16_t type, size_t len, int fd)
{
	struct att_out *o;

	if (c->closing)
		return NULL;
	if (c->out_bytes + len + TSR_WIRE_HDR > proto_param(PROTO_PARAM_ATTACH_OUT_MAX)) {
		LOG_WARN("attach: a client left %zu bytes unread; dropping it", c->out_bytes);
		client_kill(c);
		return NULL;
	}
	o = malloc(sizeof(*o) + TSR_WIRE_HDR + len);
	if (o == NULL) {
		client_kill(c);
		return NULL;
	}
	o->next = NULL;
	o->len = TSR_WIRE_HDR + len;
	o->off = 0;
	o->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : -1;
	if (fd >= 0 && o->fd < 0) {
		LOG_WARN("attach: cannot duplicate a slot's memfd: %s", strerror(errno));
		free(o);
		client_kill(c);
		return NULL;
	}
	tsr_put_hdr(o->data, (uint32_t)len, type);
	if (c->out_tail != NULL)
		c->out_tail->next = o;
	else
		c->out_head = o;
	c->out_tail = o;
	c->out_bytes += o->len;
	return o->data + TSR_WIRE_HDR;
}

/* Tells the client why and closes it once that is written (at the flush). */
static void client_fail(struct att_client *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void client_fail(struct att_client *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	uint8_t *p;
	size_t n;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	n = strlen(msg);
	LOG_WARN("attach: refusing a client: %s", msg);
	if ((p = client_frame(c, TSR_MSG_ERROR, 3 + n, -1)) == NULL)
		return;
	p[0] = 1;
	tsr_put16(p + 1, (uint16_t)n);
	memcpy(p + 3, msg, n);
	c->closing = true;
	event_del(c->rev);
	if (c->page != NULL) /* its page's pins stop counting now */
		__atomic_store_n((uint32_t *)(void *)(c->page + TSR_PAGE_REVOKED), 1,
				 __ATOMIC_SEQ_CST);
	/* Its pins and holds go now, not when it gets round to reading the reason. */
	for (uint32_t i = 0; i < c->npins; i++)
		ver_unpin(c->at, c->pins[i].v);
	c->npins = 0;
	for (uint32_t i = 0; i < c->nholds; i++)
		ver_unpin(c->at, c->holds[i]);
	c->nholds = 0;
}

/* A refusal the client survives (e.g. nothing active yet). */
static void client_error(struct att_client *c, const char *msg)
{
	size_t n = strlen(msg);
	uint8_t *p = client_frame(c, TSR_MSG_ERROR, 3 + n, -1);

	if (p == NULL)
		return;
	p[0] = 0;
	tsr_put16(p + 1, (uint16_t)n);
	memcpy(p + 3, msg, n);
}

static void client_flush(struct att_client *c)
{
	if (c->dead) {
		client_close(c);
		return;
	}
	while (c->out_head != NULL) {
		struct att_out *o = c->out_head;
		struct iovec iov = {o->data + o->off, o->len - o->off};
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} cm;
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		ssize_t n;

		if (o->fd >= 0 && o->off == 0) {
			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.buf;
			mh.msg_controllen = sizeof(cm.buf);
			struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(h), &o->fd, sizeof(int));
		}
		n = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
			event_add(c->wev, NULL);
			return;
		}
		if (n < 0) {
			LOG_DEBUG("attach: client gone: %s", strerror(errno));
			client_close(c);
			return;
		}
		/* The fd went with the first byte sent. */
		if (o->fd >= 0) {
			close(o->fd);
			o->fd = -1;
		}
		o->off += (size_t)n;
		c->out_bytes -= (size_t)n;
		if (o->off < o->len)
			continue;
		c->out_head = o->next;
		if (c->out_head == NULL)
			c->out_tail = NULL;
		free(o);
	}
	event_del(c->wev);
	if (c->closing) {
		client_close(c);
		return;
	}
	if (c->throttled) { /* its replies are read: read its requests again */
		c->throttled = false;
		event_add(c->rev, NULL);
		event_active(c->rev, EV_READ, 0);
	}
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	client_flush(arg);
}

/* ---- messages ---------------------------------------------------------------- */

/* Lets go of c's hold i; tell: say so (DROPPED), as the node chose it. */
static void hold_remove(struct att_client *c, uint32_t i, bool tell)
{
	struct att_ver *v = c->holds[i];
	uint8_t *p;

	memmove(c->holds + i, c->holds + i + 1, (--c->nholds - i) * sizeof(*c->holds));
	if (tell && (p = client_frame(c, TSR_MSG_DROPPED, 8, -1)) != NULL)
		tsr_put64(p, v->version);
	ver_unpin(c->at, v);
}

/* Holds v for c (protocol 3): past TESSERA_ATTACH_HOLDS the oldest hold
 * goes, and c is told. false: c was dropped (out of memory). */
static bool hold_add(struct att_client *c, struct att_ver *v)
{
	uint32_t max = (uint32_t)proto_param(PROTO_PARAM_ATTACH_HOLDS);

	if (c->nholds >= max && c->nholds > 0) {
		LOG_INFO("attach: a client held %u versions (TESSERA_ATTACH_HOLDS); dropping its "
			 "hold on v%" PRIu64, max, c->holds[0]->version);
		hold_remove(c, 0, true);
	}
	if (c->holds == NULL && (c->holds = calloc(max ? max : 1, sizeof(*c->holds))) == NULL) {
		client_fail(c, "the node is out of memory for holds");
		return false;
	}
	c->holds[c->nholds++] = v;
	v->pins++;
	return true;
}

static void send_version(struct att_client *c, struct att_ver *v)
{
	const struct node_slot *s = v->slot;
	uint8_t handle[64] = {0}, store = 0;
	int32_t dev = -1;
	uint8_t *p;

#ifdef TESSERA_CUDA
	char why[256];
	if (s->dev != NULL) {
		if (node_cuda_ipc_handle(s->dev, handle, why, sizeof(why)) != 0) {
			LOG_WARN("attach: v%" PRIu64 ": no CUDA IPC handle: %s", v->version, why);
			client_fail(c, "v%" PRIu64 ": the node cannot export its CUDA buffer",
				    v->version);
			return;
		}
		store = 1;
		dev = c->at->info.store->device;
	}
#endif
	bool held = c->hold && !c->at->info.in_place;
	if (held && !hold_add(c, v))
		return;
	if ((p = client_frame(c, TSR_MSG_VERSION,
			      c->proto >= 3   ? TSR_WIRE_VERSION3_LEN
			      : c->proto >= 2 ? TSR_WIRE_VERSION2_LEN
					      : TSR_WIRE_VERSION_LEN,
			      s->memfd)) == NULL)
		return;
	if (c->proto >= 2)
		p[TSR_WIRE_VERSION_LEN] = v->entry;
	if (c->proto >= 3)
		p[TSR_WIRE_VERSION_LEN + 1] = held;
	tsr_put64(p, v->version);
	tsr_put64(p + 8, s->len);
	memcpy(p + 16, v->digest, 32);
	p[48] = store;
	tsr_put32(p + 49, (uint32_t)dev);
	memcpy(p + 53, handle, 64);
}

static void on_attach(struct att_client *c, struct tsr_rd *r)
{
	struct node_attach *at = c->at;
	uint16_t proto = (uint16_t)tsr_take_int(r, 2);
	uint16_t rlen = (uint16_t)tsr_take_int(r, 2);
	uint32_t rank = (uint32_t)tsr_take_int(r, 4);
	const uint8_t *name;
	uint8_t *p;

	if (r->bad) {
		client_fail(c, "ATTACH: %zu bytes is too short", r->left);
		return;
	}
	if (proto < 1 || proto > 3) {
		client_fail(c, "ATTACH: protocol %u, this node speaks 1 to 3", proto);
		return;
	}
	size_t tail = proto >= 3 ? 4 : 0; /* the flags */
	if (rlen == 0 || rlen > TSR_WIRE_NAME_MAX || (size_t)rlen + tail != r->left) {
		client_fail(c, "ATTACH: replica name of %u bytes in %zu (want 1..%u, exactly%s)", rlen,
			    r->left, TSR_WIRE_NAME_MAX, tail ? ", then u32 flags" : "");
		return;
	}
	name = tsr_take(r, rlen);
	uint32_t flags = tail ? (uint32_t)tsr_take_int(r, 4) : 0;
	if (flags & ~TSR_ATTACH_HOLD) {
		client_fail(c, "ATTACH: unknown flags 0x%x", flags & ~TSR_ATTACH_HOLD);
		return;
	}
	if (strlen(at->replica) != rlen || memcmp(name, at->replica, rlen) != 0 ||
	    rank != at->info.rank) {
		char asked[TSR_WIRE_NAME_MAX + 1];
		for (uint16_t i = 0; i < rlen; i++)
			asked[i] = name[i] >= 0x20 && name[i] < 0x7f ? (char)name[i] : '?';
		asked[rlen] = 0;
		client_fail(c, "this node serves replica %s rank %u, not replica %s rank %u",
			    at->replica, at->info.rank, asked, rank);
		return;
	}
	if (proto >= 2 && at->epoch != NULL) {
		int rc = page_new("tessera-pins", false, &c->page_fd, &c->page);
		if (rc != 0) {
			client_fail(c, "ATTACH: no pin page: %s", strerror(-rc));
			return;
		}
		c->proto = proto;
	}
	/* Nothing is held on an in-place node: it has one copy, written over. */
	c->hold = c->proto >= 3 && (flags & TSR_ATTACH_HOLD) && !at->info.in_place;
	if (c->proto >= 3) {
		if ((p = client_frame(c, TSR_MSG_ATTACHED, 8 + at->table3_len, -1)) == NULL)
			return;
		memcpy(p + 8, at->table3, at->table3_len);
		p[8 + TABLE3_HOLDING] = c->hold;
	} else {
		if ((p = client_frame(c, TSR_MSG_ATTACHED, 8 + at->table_len, -1)) == NULL)
			return;
		memcpy(p + 8, at->table, at->table_len);
	}
	tsr_put64(p, at->active ? at->active->version : 0);
	c->attached = true;
	if (c->proto >= 2) {
		if ((p = client_frame(c, TSR_MSG_PAGES, 5, at->epoch_fd)) == NULL)
			return;
		p[0] = TSR_PAGE_EPOCH;
		tsr_put32(p + 1, TSR_PAGE_SIZE);
		if ((p = client_frame(c, TSR_MSG_PAGES, 5, c->page_fd)) == NULL)
			return;
		p[0] = TSR_PAGE_PINS;
		tsr_put32(p + 1, TSR_PAGE_SIZE);
	}
	if (at->active != NULL)
		send_version(c, at->active);
}

static void on_acquire(struct att_client *c, struct tsr_rd *r)
{
	struct node_attach *at = c->at;
	uint8_t *p;

	struct att_ver *v = at->active;

	if (r->left != 0 && (c->proto < 3 || r->left != 8)) {
		client_fail(c, "ACQUIRE carries nothing%s (got %zu bytes)",
			    c->proto >= 3 ? " or a u64 version" : "", r->left);
		return;
	}
	if (r->left == 8) { /* that version: active, or held for this client */
		char msg[96];
		uint64_t want = tsr_take_int(r, 8);
		if (v == NULL || v->version != want || at->paused)
			v = NULL;
		for (uint32_t i = 0; i < c->nholds && v == NULL; i++)
			if (c->holds[i]->version == want)
				v = c->holds[i];
		if (v == NULL) {
			snprintf(msg, sizeof(msg), "v%" PRIu64 " is neither active nor held", want);
			client_error(c, msg);
			return;
		}
	} else if (v == NULL) {
		client_error(c, "no version is active yet");
		return;
	} else if (at->paused) {
		char msg[128];
		size_t n = (size_t)snprintf(msg, sizeof(msg), "admission paused: installing v%" PRIu64
							      " in place",
					    at->paused_for);
		if ((p = client_frame(c, TSR_MSG_ERROR, 3 + n, -1)) == NULL)
			return;
		p[0] = TSR_ERR_PAUSED;
		tsr_put16(p + 1, (uint16_t)n);
		memcpy(p + 3, msg, n);
		return;
	}
	if (c->npins >= proto_param(PROTO_PARAM_ATTACH_PINS)) {
		client_error(c, "too many pins held by this client (TESSERA_ATTACH_PINS)");
		return;
	}
	if (c->npins == c->cap) {
		uint32_t cap = c->cap ? 2 * c->cap : 16;
		struct att_pin *np = realloc(c->pins, cap * sizeof(*np));
		if (np == NULL) {
			client_error(c, "the node is out of memory");
			return;
		}
		c->pins = np;
		c->cap = cap;
	}
	if ((p = client_frame(c, TSR_MSG_ACQUIRED, 16, -1)) == NULL)
		return;
	c->pins[c->npins].id = ++c->next_pin;
	c->pins[c->npins].v = v;
	c->npins++;
	v->pins++;
	v->requests++;
	v->last_pin_ms = proto_wall_ms();
	if (v->first_pin_ms == 0)
		v->first_pin_ms = v->last_pin_ms;
	tsr_put64(p, c->next_pin);
	tsr_put64(p + 8, v->version);
}

static void on_drop(struct att_client *c, struct tsr_rd *r)
{
	uint64_t version = tsr_take_int(r, 8);

	if (r->bad || r->left != 0 || c->proto < 3) {
		client_fail(c, "DROP carries exactly a u64 version (protocol 3)");
		return;
	}
	for (uint32_t i = 0; i < c->nholds; i++) {
		if (c->holds[i]->version == version) {
			hold_remove(c, i, false);
			return;
		}
	}
	client_fail(c, "DROP of v%" PRIu64 ", which is not held for this client", version);
}

static void on_release(struct att_client *c, struct tsr_rd *r)
{
	uint64_t id = tsr_take_int(r, 8);
	uint8_t *p;

	if (r->bad || r->left != 0) {
		client_fail(c, "RELEASE carries exactly a u64 pin id");
		return;
	}
	for (uint32_t i = 0; i < c->npins; i++) {
		if (c->pins[i].id != id)
			continue;
		struct att_ver *v = c->pins[i].v;
		c->pins[i] = c->pins[--c->npins];
		if ((p = client_frame(c, TSR_MSG_RELEASED, 8, -1)) != NULL)
			tsr_put64(p, id);
		ver_unpin(c->at, v);
		return;
	}
	client_fail(c, "RELEASE of pin %" PRIu64 ", which this client does not hold", id);
}

/* Handles one whole frame. */
static void on_frame(struct att_client *c, uint16_t type, const uint8_t *payload, uint32_t len)
{
	struct tsr_rd r = {payload, len, 0};

	if (!c->attached && type != TSR_MSG_ATTACH) {
		client_fail(c, "message type %u before ATTACH", type);
		return;
	}
	switch (type) {
	case TSR_MSG_ATTACH:
		if (c->attached)
			client_fail(c, "ATTACH twice");
		else
			on_attach(c, &r);
		break;
	case TSR_MSG_ACQUIRE: on_acquire(c, &r); break;
	case TSR_MSG_RELEASE: on_release(c, &r); break;
	case TSR_MSG_DROP: on_drop(c, &r); break;
	case TSR_MSG_UNPIN:
		if (r.left != 0)
			client_fail(c, "UNPIN carries no payload (got %zu bytes)", r.left);
		else
			ver_check_all(c->at);
		break;
	default: client_fail(c, "unknown message type %u", type); break;
	}
}

/*
 * A client's requests are read only while its replies are read too: past
 * OUT_HIGH bytes of unread replies the node stops reading its socket until
 * they are written (client_flush), so a client that sends and never reads
 * holds the kernel's socket buffers and nothing of the node's.
 */
#define OUT_HIGH (64u << 10)

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	struct att_client *c = arg;

	if (c->inlen < sizeof(c->in)) {
		ssize_t n = read(c->fd, c->in + c->inlen, sizeof(c->in) - c->inlen);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
			LOG_DEBUG("attach: client closed (%u pins dropped)", c->npins);
			client_close(c);
			return;
		}
		if (n > 0)
			c->inlen += (size_t)n;
	}
	/* Whole frames: the header is checked before its payload is awaited. */
	while (!c->closing && c->inlen >= TSR_WIRE_HDR && c->out_bytes < OUT_HIGH) {
		uint32_t len = tsr_get32(c->in);
		uint16_t type = tsr_get16(c->in + 4), zero = tsr_get16(c->in + 6);
		if (len > TSR_WIRE_REQ_MAX || zero != 0) {
			client_fail(c, "bad frame header (payload of %u bytes, limit %u; reserved %u)",
				    len, TSR_WIRE_REQ_MAX, zero);
			break;
		}
		if (c->inlen < TSR_WIRE_HDR + len)
			break;
		size_t used = TSR_WIRE_HDR + len;
		on_frame(c, type, c->in + TSR_WIRE_HDR, len);
		memmove(c->in, c->in + used, c->inlen - used);
		c->inlen -= used;
	}
	if (!c->closing && c->out_bytes >= OUT_HIGH && !c->throttled) {
		c->throttled = true;
		event_del(c->rev);
	}
	client_flush(c);
}

/* ---- clients ---------------------------------------------------------------- */

static void client_close(struct att_client *c)
{
	struct node_attach *at = c->at;

	event_free(c->rev);
	event_free(c->wev);
	c->rev = c->wev = NULL;
	close(c->fd);
	while (c->out_head != NULL) {
		struct att_out *o = c->out_head;
		c->out_head = o->next;
		if (o->fd >= 0)
			close(o->fd);
		free(o);
	}
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		at->clients = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	at->nclients--;
	if (c->page != NULL) {
		/* Its requests stay counted; its pins go. */
		for (struct att_ver *v = at->vers; v != NULL; v = v->next)
			if (v->entry != TSR_ENTRY_NONE)
				v->requests += page_requests(c, v->entry) - c->base[v->entry];
		__atomic_store_n((uint32_t *)(void *)(c->page + TSR_PAGE_REVOKED), 1,
				 __ATOMIC_SEQ_CST);
		munmap(c->page, TSR_PAGE_SIZE);
		close(c->page_fd);
	}
	for (uint32_t i = 0; i < c->npins; i++)
		ver_unpin(at, c->pins[i].v);
	free(c->pins);
	for (uint32_t i = 0; i < c->nholds; i++)
		ver_unpin(at, c->holds[i]);
	free(c->holds);
	if (c->page != NULL)
		ver_check_all(at);
	free(c);
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
	struct node_attach *at = arg;
	int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	struct att_client *c;

	if (fd < 0)
		return;
	if (at->nclients >= proto_param(PROTO_PARAM_ATTACH_CLIENTS)) {
		LOG_WARN("attach: %u clients attached already (TESSERA_ATTACH_CLIENTS); refusing one",
			 at->nclients);
		static const char msg[] = "too many clients attached to this node";
		uint8_t buf[TSR_WIRE_HDR + 3 + sizeof(msg) - 1];
		tsr_put_hdr(buf, 3 + sizeof(msg) - 1, TSR_MSG_ERROR);
		buf[TSR_WIRE_HDR] = 1;
		tsr_put16(buf + TSR_WIRE_HDR + 1, sizeof(msg) - 1);
		memcpy(buf + TSR_WIRE_HDR + 3, msg, sizeof(msg) - 1);
		(void)!send(fd, buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT);
		close(fd);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		close(fd);
		return;
	}
	c->at = at;
	c->fd = fd;
	c->page_fd = -1;
	c->rev = event_new(at->base, fd, EV_READ | EV_PERSIST, on_readable, c);
	c->wev = event_new(at->base, fd, EV_WRITE, on_writable, c);
	if (c->rev == NULL || c->wev == NULL || event_add(c->rev, NULL) != 0) {
		if (c->rev)
			event_free(c->rev);
		if (c->wev)
			event_free(c->wev);
		close(fd);
		free(c);
		return;
	}
	c->next = at->clients;
	if (at->clients != NULL)
		at->clients->prev = c;
	at->clients = c;
	at->nclients++;
}

/* ---- the server ---------------------------------------------------------------- */

/* Writes the tensor table (after ATTACHED's u64 version) to p, or only
 * measures it when p is NULL; pieces: protocol 3's. Returns its length, 0
 * when a tensor cannot be described. */
static size_t table_put(const struct node_attach *at, bool pieces, uint8_t *p)
{
	const struct proto_rank *rk = at->info.spec;
	const struct proto_model *m = at->info.model;
	size_t len = 0;

#define PUT(n, stmt)          \
	do {                  \
		if (p != NULL) { \
			stmt;    \
			p += (n); \
		}                \
		len += (n);      \
	} while (0)
	PUT(4, tsr_put32(p, rk->nlocals));
	PUT(8, tsr_put64(p, rk->nbytes));
	PUT(32, memcpy(p, at->info.layout_digest, 32));
	PUT(1, *p = at->info.store->device >= 0 ? 1 : 0);
	if (pieces) {
		PUT(1, *p = at->info.in_place);
		PUT(1, *p = 0); /* holding: per client */
	}
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct proto_local *l = &rk->locals[i];
		const char *dt = proto_dtype_name(l->dtype);
		size_t nl = strlen(l->name), dl = strlen(dt);
		uint32_t np = pieces && m != NULL ? l->npieces : 0;
		if (nl > UINT16_MAX || dl > UINT8_MAX || l->ndim > TSR_WIRE_DIMS_MAX || np > UINT16_MAX)
			return 0;
		PUT(2, tsr_put16(p, (uint16_t)nl));
		PUT(nl, memcpy(p, l->name, nl));
		PUT(1, *p = (uint8_t)dl);
		PUT(dl, memcpy(p, dt, dl));
		PUT(1, *p = (uint8_t)l->ndim);
		for (uint32_t d = 0; d < l->ndim; d++)
			PUT(8, tsr_put64(p, l->shape[d]));
		PUT(8, tsr_put64(p, l->offset));
		PUT(8, tsr_put64(p, l->nbytes));
		if (!pieces)
			continue;
		PUT(1, *p = (uint8_t)l->concat_dim);
		PUT(2, tsr_put16(p, (uint16_t)np));
		for (uint32_t k = 0; k < np; k++) {
			const struct proto_piece *pc = &l->pieces[k];
			const struct proto_tensor *t = &m->tensors[pc->tensor];
			size_t tl = strlen(t->name);
			if (tl > UINT16_MAX || t->ndim > TSR_WIRE_DIMS_MAX)
				return 0;
			PUT(2, tsr_put16(p, (uint16_t)tl));
			PUT(tl, memcpy(p, t->name, tl));
			PUT(1, *p = pc->flat);
			PUT(1, *p = (uint8_t)t->ndim);
			for (uint32_t d = 0; d < t->ndim; d++)
				PUT(8, tsr_put64(p, t->shape[d]));
			for (uint32_t d = 0; d < t->ndim; d++)
				PUT(8, tsr_put64(p, pc->box.lo[d]));
			for (uint32_t d = 0; d < t->ndim; d++)
				PUT(8, tsr_put64(p, pc->box.hi[d]));
			PUT(8, tsr_put64(p, pc->base));
		}
	}
#undef PUT
	return len;
}

static int build_table(struct node_attach *at, struct proto_err *err)
{
	for (int pieces = 0; pieces <= 1; pieces++) {
		size_t len = table_put(at, pieces, NULL);
		uint8_t *t;
		if (len == 0)
			return proto_errf(err, EINVAL, "attach: a tensor of the rank cannot be described "
						       "(name, dtype, dims or pieces past the wire's limits)");
		if (8 + len > TSR_WIRE_REPLY_MAX)
			return proto_errf(err, EINVAL, "attach: the tensor table (%zu bytes) is too big",
					  len);
		if ((t = malloc(len)) == NULL)
			return proto_errf(err, ENOMEM, "attach: out of memory");
		table_put(at, pieces, t);
		if (pieces) {
			at->table3 = t;
			at->table3_len = len;
		} else {
			at->table = t;
			at->table_len = len;
		}
	}
	return 0;
}

int node_attach_new(struct event_base *base, const char *path, const struct node_attach_info *info,
		    struct node_attach **out, struct proto_err *err)
{
	struct node_attach *at = calloc(1, sizeof(*at));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int rc;

	*out = NULL;
	if (at == NULL)
		return proto_errf(err, ENOMEM, "attach: out of memory");
	at->base = base;
	at->info = *info;
	at->lfd = -1;
	at->epoch_fd = -1;
	at->replica = strdup(info->replica);
	if (at->replica == NULL) {
		rc = proto_errf(err, ENOMEM, "attach: out of memory");
		goto fail;
	}
	if (strlen(path) == 0 || strlen(path) >= sizeof(sa.sun_path)) {
		rc = proto_errf(err, ENAMETOOLONG, "attach socket %s: want 1..%zu bytes", path,
				sizeof(sa.sun_path) - 1);
		goto fail;
	}
	if ((rc = build_table(at, err)) != 0)
		goto fail;
	/* Without it clients acquire over the socket (protocol 1). */
	if ((rc = page_new("tessera-epoch", true, &at->epoch_fd, &at->epoch)) != 0)
		LOG_WARN("attach: no epoch page (%s); clients acquire over the socket",
			 strerror(-rc));
	else
		tsr_put64(at->epoch, TSR_EPOCH_MAGIC);
	epoch_publish(at);
	/* A socket left by an earlier node is replaced; anything else stays. */
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			rc = proto_errf(err, EEXIST, "attach socket %s: exists and is not a socket",
					path);
			goto fail;
		}
		unlink(path);
	}
	memcpy(sa.sun_path, path, strlen(path) + 1);
	at->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (at->lfd < 0 || bind(at->lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		rc = proto_errf(err, errno, "attach socket %s: %s", path, strerror(errno));
		goto fail;
	}
	snprintf(at->path, sizeof(at->path), "%s", path);
	/* Before listen: no client connects under the umask's mode. */
	if ((rc = node_perm_apply(path, info->perm, err)) != 0)
		goto fail;
	if (listen(at->lfd, 64) != 0) {
		rc = proto_errf(err, errno, "attach socket %s: listen: %s", path, strerror(errno));
		goto fail;
	}
	at->lev = event_new(base, at->lfd, EV_READ | EV_PERSIST, on_accept, at);
	at->scan_ev = evtimer_new(base, on_scan, at);
	if (at->lev == NULL || at->scan_ev == NULL || event_add(at->lev, NULL) != 0) {
		rc = proto_errf(err, ENOMEM, "attach: out of memory");
		goto fail;
	}
	/* Host slots are freed on a worker (CUDA ones where they were made);
	 * without the worker they are freed inline, as before. */
	if (info->store->device < 0 && node_reaper_new(info->store, &at->reaper) != 0)
		LOG_WARN("attach: no reaper thread; retired slots are freed on the loop");
	LOG_INFO("attach: serving replica %s rank %u on %s", at->replica, at->info.rank, path);
	*out = at;
	return 0;
fail:
	node_attach_free(at);
	return rc;
}

/* A free entry for a new version (TSR_ENTRY_NONE: protocol-2 clients
 * then acquire it over the socket). When all are held by retired versions
 * still pinned, the clients pinning the oldest are dropped. */
static uint8_t entry_take(struct node_attach *at)
{
	if (at->epoch == NULL)
		return TSR_ENTRY_NONE;
	if (at->entries == ~0ull) {
		struct att_ver *old = NULL;
		for (struct att_ver *v = at->vers; v != NULL; v = v->next)
			if (v->retired && v->entry != TSR_ENTRY_NONE)
				old = v; /* newest first: the last is the oldest */
		for (struct att_client *c = at->clients; old != NULL && c != NULL; c = c->next)
			if (c->page != NULL && !c->closing && page_pins(c, old->entry) > 0)
				client_fail(c, "v%" PRIu64 " pinned while %d newer versions came",
					    old->version, TSR_ENTRIES);
		if (old != NULL)
			ver_check(at, old);
		for (struct att_client *c = at->clients, *next; c != NULL; c = next) {
			next = c->next;
			if (c->closing)
				client_flush(c);
		}
	}
	if (at->entries == ~0ull)
		return TSR_ENTRY_NONE;
	uint8_t e = (uint8_t)__builtin_ctzll(~at->entries);
	at->entries |= 1ull << e;
	for (struct att_client *c = at->clients; c != NULL; c = c->next)
		if (c->page != NULL)
			c->base[e] = page_requests(c, e);
	return e;
}

void node_attach_activate(struct node_attach *at, struct node_slot *slot, const uint8_t digest[32])
{
	struct att_ver *v = NULL;

	if (at == NULL || slot == NULL)
		return;
	/* Test only: this rank's engine hears of every version late, as if
	 * its node had activated it later than the replica's other ranks. */
	uint64_t late = proto_param(PROTO_PARAM_TEST_ANNOUNCE_LAG_MS);
	if (late > 0)
		usleep((useconds_t)(late > 2000 ? 2000 : late) * 1000u);
	for (v = at->vers; v != NULL && v->slot != slot; v = v->next)
		;
	if (v == NULL) {
		v = calloc(1, sizeof(*v));
		if (v == NULL) {
			/* Nothing can pin it then: clients keep the old one. */
			LOG_ERR("attach: out of memory; v%" PRIu64 " not offered to clients",
				slot->version);
			return;
		}
		v->slot = slot;
		v->entry = entry_take(at);
		v->next = at->vers;
		at->vers = v;
	}
	v->version = slot->version;
	memcpy(v->digest, digest, 32);
	v->retired = false;
	v->activated_ms = proto_wall_ms();
	at->active = v;
	for (struct att_client *c = at->clients, *next; c != NULL; c = next) {
		next = c->next; /* c may be dropped */
		if (!c->attached || c->closing)
			continue;
		send_version(c, v);
		client_flush(c);
	}
	/* Test only: widen the window in which clients know the version but
	 * may not pin it yet through the epoch page. */
	uint64_t lag = proto_param(PROTO_PARAM_TEST_ADMIT_LAG_MS);
	if (lag > 0)
		usleep((useconds_t)(lag > 10000 ? 10000 : lag) * 1000u);
	/* Every client has been sent the version: now admit requests to it. */
	epoch_publish(at);
}

/* Drops every client that pins v (with the reason) and every hold on it
 * (DROPPED), then frees it: v stays in the list until the end. */
static void ver_evict(struct node_attach *at, struct att_ver *v, uint32_t max)
{
	v->evicting = true;
	for (struct att_client *c = at->clients, *next; c != NULL; c = next) {
		next = c->next;
		if (c->closing)
			continue;
		bool pinned = c->page != NULL && v->entry != TSR_ENTRY_NONE && page_pins(c, v->entry) > 0;
		for (uint32_t i = 0; i < c->npins && !pinned; i++)
			pinned = c->pins[i].v == v;
		if (pinned) {
			client_fail(c, "v%" PRIu64 " still pinned while %u later versions are retired "
				       "(TESSERA_ATTACH_RETAINED): release pins when requests end",
				    v->version, max);
		} else {
			for (uint32_t i = 0; i < c->nholds; i++)
				if (c->holds[i] == v) { /* freed below: v is evicting */
					hold_remove(c, i, true);
					break;
				}
		}
		client_flush(c);
	}
	v->evicting = false;
	ver_check(at, v);
}

/* At most TESSERA_ATTACH_RETAINED retired versions stay for their pins and
 * holds (each is a whole copy of the rank): past it the oldest goes. */
static void retained_trim(struct node_attach *at)
{
	uint32_t max = (uint32_t)proto_param(PROTO_PARAM_ATTACH_RETAINED);

	for (;;) {
		struct att_ver *oldest = NULL;
		uint32_t n = 0;
		for (struct att_ver *v = at->vers; v != NULL; v = v->next)
			if (v->retired) {
				n++;
				oldest = v; /* newest first: the last is the oldest */
			}
		if (n <= max || oldest == NULL)
			return;
		LOG_WARN("attach: %u retired versions pinned or held (TESSERA_ATTACH_RETAINED %u); "
			 "dropping the clients of v%" PRIu64,
			 n, max, oldest->version);
		ver_evict(at, oldest, max);
	}
}

void node_attach_retire(struct node_attach *at, struct node_store *store, struct node_slot *slot)
{
	struct att_ver *v = NULL;

	if (slot == NULL)
		return;
	if (at != NULL)
		for (v = at->vers; v != NULL && v->slot != slot; v = v->next)
			;
	if (v == NULL) {
		node_slot_free(store, slot);
		return;
	}
	if (at->active == v) {
		at->active = NULL;
		epoch_publish(at);
	}
	if (ver_pins(at, v) == 0) {
		node_reaper_free(at->reaper, store, slot);
		ver_forget(at, v);
		return;
	}
	LOG_INFO("attach: v%" PRIu64 " retired; %u requests still pin it", v->version,
		 ver_pins(at, v));
	v->retired = true;
	retained_trim(at);
	ver_check_all(at); /* arms the scan */
}

size_t node_attach_reaping(const struct node_attach *at)
{
	return node_reaper_pending(at->reaper);
}

size_t node_attach_queued(const struct node_attach *at)
{
	size_t n = 0;

	for (const struct att_client *c = at ? at->clients : NULL; c != NULL; c = c->next)
		n += c->out_bytes;
	return n;
}

static void on_drain(evutil_socket_t fd, short what, void *arg)
{
	struct node_attach *at = arg;

	if (at->paused && at->drained != NULL &&
	    (at->active == NULL || ver_pins(at, at->active) == 0)) {
		void (*cb)(void *) = at->drained;
		at->drained = NULL;
		cb(at->drained_arg);
	}
}

int node_attach_pause(struct node_attach *at, uint64_t version, void (*drained)(void *arg),
		      void *arg)
{
	if (at->drain_ev == NULL && (at->drain_ev = event_new(at->base, -1, 0, on_drain, at)) == NULL)
		return -ENOMEM;
	at->paused = true;
	at->paused_for = version;
	at->drained = drained;
	at->drained_arg = arg;
	epoch_publish(at);
	LOG_INFO("attach: admission paused for v%" PRIu64 " (installed in place); %u requests "
		 "running on v%" PRIu64,
		 version, at->active ? ver_pins(at, at->active) : 0,
		 at->active ? at->active->version : 0);
	event_active(at->drain_ev, 0, 0);
	return 0;
}

uint32_t node_attach_evict(struct node_attach *at)
{
	uint32_t n = 0;

	if (at == NULL || at->active == NULL)
		return 0;
	for (struct att_client *c = at->clients, *next; c != NULL; c = next) {
		next = c->next;
		bool pins = c->page != NULL && at->active->entry != TSR_ENTRY_NONE &&
			    page_pins(c, at->active->entry) > 0;
		for (uint32_t i = 0; i < c->npins && !pins; i++)
			pins = c->pins[i].v == at->active;
		if (!pins || c->closing)
			continue;
		n++;
		client_fail(c, "v%" PRIu64 " is installed in place: requests pinning v%" PRIu64
			       " past the drain bound (TESSERA_INPLACE_DRAIN_MS) are dropped",
			    at->paused_for, at->active->version);
		client_flush(c);
	}
	return n;
}

bool node_attach_paused(const struct node_attach *at)
{
	return at != NULL && at->paused;
}

void node_attach_resume(struct node_attach *at, struct node_slot *slot, const uint8_t digest[32])
{
	if (at == NULL)
		return;
	at->drained = NULL;
	/* The slot's old version goes (nothing pins it: drained or evicted);
	 * the same memory comes back as the new one. Still paused meanwhile. */
	if (at->active != NULL && at->active->slot == slot && ver_pins(at, at->active) == 0)
		ver_forget(at, at->active);
	at->paused = false;
	node_attach_activate(at, slot, digest);
}

size_t node_attach_held(const struct node_attach *at, struct node_attach_count *out, size_t max)
{
	size_t n = 0;

	/* at->vers is newest first (each activation is pushed in front). */
	for (const struct att_ver *v = at ? at->vers : NULL; v != NULL && n < max; v = v->next)
		out[n++] = (struct node_attach_count){v->version, ver_requests(at, v), ver_pins(at, v)};
	return n;
}

uint32_t node_attach_pins(const struct node_attach *at, uint64_t version)
{
	uint32_t n = 0;

	for (const struct att_ver *v = at ? at->vers : NULL; v != NULL; v = v->next)
		if (v->version == version)
			n += ver_pins(at, v);
	return n;
}

uint32_t node_attach_clients(const struct node_attach *at)
{
	return at ? at->nclients : 0;
}

uint32_t node_attach_retained(const struct node_attach *at)
{
	uint32_t n = 0;

	for (const struct att_ver *v = at ? at->vers : NULL; v != NULL; v = v->next)
		n += v->retired;
	return n;
}

const char *node_attach_path(const struct node_attach *at)
{
	return at->path;
}

void node_attach_free(struct node_attach *at)
{
	if (at == NULL)
		return;
	at->drained = NULL;
	while (at->clients != NULL)
		client_close(at->clients);
	if (at->drain_ev != NULL)
		event_free(at->drain_ev);
	if (at->scan_ev != NULL)
		event_free(at->scan_ev);
	/* Retired slots die with the server; the active one is the caller's. */
	while (at->vers != NULL) {
		struct att_ver *v = at->vers;
		if (v->retired)
			node_reaper_free(at->reaper, at->info.store, v->slot);
		ver_forget(at, v);
	}
	node_reaper_stop(at->reaper); /* frees what it still holds */
	if (at->lev != NULL)
		event_free(at->lev);
	if (at->lfd >= 0) {
		close(at->lfd);
		if (at->path[0] != 0)
			unlink(at->path);
	}
	if (at->epoch != NULL)
		munmap(at->epoch, TSR_PAGE_SIZE);
	if (at->epoch_fd >= 0)
		close(at->epoch_fd);
	free(at->table);
	free(at->table3);
	free(at->replica);
	free(at);
}
