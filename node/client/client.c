/* libtessera-client: attach to a node, map and pin its versions (see tessera_client.h). */
#include "node/client/tessera_client.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/client/client_internal.h"
#include "node/client/wire.h"
#include "proto/cli.h" /* PROTO_RELEASE only: the library links nothing of tessera */

#define API __attribute__((visibility("default")))
#define FDQ_MAX 16
/* Pins taken through the pin page (protocol 2) carry this bit in their id. */
#define PAGE_PIN (1ull << 63)
/* While admission is paused, the state is looked at again this often, ms. */
#define PAUSE_POLL_MS 1

struct cver {
	struct cver *next;
	struct tessera_version v;
	uint32_t pins;
	uint8_t entry; /* in the pin page; TSR_ENTRY_NONE: acquire over the socket */
	bool held;     /* the node holds it for us (protocol 3) */
	bool guarded;  /* its mapping is PROT_NONE (tessera_guard) */
};

struct tessera_client {
	int fd;
	int timeout_ms;
	char err[320];
	bool broken; /* the connection is unusable; every call fails */
	struct tessera_tensor *tensors;
	size_t ntensors;
	uint64_t block;
	int store;
	struct cver *vers;
	uint64_t active;
	uint64_t announced; /* the version active when we attached */
	int fdq[FDQ_MAX]; /* received memfds waiting for their VERSION frame */
	size_t nfdq;
	uint8_t *in;
	size_t inlen, incap, consumed;
	tessera_version_cb cb;
	void *cbarg;
	/* Protocol 2 (wire.h): the node's epoch page, read-only, and this
	 * client's pin page; NULL until the node sent them. */
	const uint8_t *epoch;
	uint8_t *page;
	uint64_t next_page_pin;
	/* Protocol 3. */
	uint16_t proto;
	bool holding, in_place, guard;
};

static int fail(tessera_client *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int fail(tessera_client *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return -code;
}

/* A protocol or connection failure: nothing more can be trusted. */
static int broke(tessera_client *c, int code, const char *what)
{
	c->broken = true;
	return fail(c, code, "tessera node: %s", what);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- versions ---------------------------------------------------------------- */

static struct cver *find_ver(const tessera_client *c, uint64_t version)
{
	for (struct cver *v = c->vers; v != NULL; v = v->next)
		if (v->v.version == version)
			return v;
	return NULL;
}

/* A pin of v was taken / released: the guard (tessera_guard) opens the
 * version's memory for its first pin and closes it after its last. */
static void pin_taken(struct cver *v)
{
	if (v->pins++ == 0 && v->guarded && v->v.host != NULL &&
	    mprotect((void *)v->v.host, v->v.size, PROT_READ) == 0)
		v->guarded = false;
}

static void pin_dropped(tessera_client *c, struct cver *v)
{
	if (--v->pins == 0 && c->guard && !v->guarded && v->v.host != NULL &&
	    mprotect((void *)v->v.host, v->v.size, PROT_NONE) == 0)
		v->guarded = true;
}

static void ver_free(struct cver *v)
{
	if (v->v.host != NULL)
		munmap((void *)v->v.host, v->v.size);
	if (v->v.memfd >= 0)
		close(v->v.memfd);
	free(v);
}

/* Unmaps versions that are neither active nor pinned. */
static void sweep(tessera_client *c)
{
	for (struct cver **pp = &c->vers; *pp != NULL;) {
		struct cver *v = *pp;
		if (v->v.version != c->active && v->pins == 0 && !v->held) {
			*pp = v->next;
			ver_free(v);
		} else {
			pp = &v->next;
		}
	}
}

static int on_version(tessera_client *c, const uint8_t *p, uint32_t len)
{
	struct tsr_rd r = {p, len, 0};
	struct cver *v;
	int memfd;

	size_t want = c->proto >= 3   ? TSR_WIRE_VERSION3_LEN
		      : c->proto >= 2 ? TSR_WIRE_VERSION2_LEN
				      : TSR_WIRE_VERSION_LEN;
	if (len != want && !(c->proto == 2 && len == TSR_WIRE_VERSION_LEN))
		return broke(c, EPROTO, "VERSION message of the wrong size");
	if (c->nfdq == 0)
		return broke(c, EPROTO, "VERSION message without its memfd");
	memfd = c->fdq[0];
	memmove(c->fdq, c->fdq + 1, --c->nfdq * sizeof(int));
	v = calloc(1, sizeof(*v));
	if (v == NULL) {
		close(memfd);
		return broke(c, ENOMEM, "out of memory");
	}
	v->v.memfd = memfd;
	v->v.version = tsr_take_int(&r, 8);
	v->v.size = tsr_take_int(&r, 8);
	memcpy(v->v.digest, tsr_take(&r, 32), 32);
	v->v.store = (int)tsr_take_int(&r, 1);
	v->v.cuda_device = (int)(int32_t)tsr_take_int(&r, 4);
	memcpy(v->v.cuda_ipc_handle, tsr_take(&r, 64), 64);
	v->entry = len >= TSR_WIRE_VERSION2_LEN ? (uint8_t)tsr_take_int(&r, 1) : TSR_ENTRY_NONE;
	uint8_t held = len >= TSR_WIRE_VERSION3_LEN ? (uint8_t)tsr_take_int(&r, 1) : 0;
	v->held = held == 1;
	if (v->v.version <= c->active || v->v.store > 1 || v->v.size != c->block ||
	    (v->entry >= TSR_ENTRIES && v->entry != TSR_ENTRY_NONE) || held > 1 ||
	    (held && !c->holding)) {
		ver_free(v);
		return broke(c, EPROTO, "VERSION message out of order or of the wrong size");
	}
	if (v->v.size > 0) {
		void *m = mmap(NULL, v->v.size, PROT_READ, MAP_SHARED, memfd, 0);
		if (m == MAP_FAILED) {
			int e = errno;
			ver_free(v);
			c->broken = true;
			return fail(c, e, "tessera node: cannot map a version: %s", strerror(e));
		}
		v->v.host = m;
	}
	v->next = c->vers;
	c->vers = v;
	c->active = v->v.version;
	/* The versions this one replaces are unmapped later (release, poll,
	 * wait): not inside the acquire that switches to it. */
	if (c->cb != NULL)
		c->cb(c, c->active, c->cbarg);
	return 1;
}

/* A PAGES frame (protocol 2): maps the epoch page or this client's pin page. */
static int on_pages(tessera_client *c, const uint8_t *p, uint32_t len)
{
	struct tsr_rd r = {p, len, 0};
	uint8_t kind = (uint8_t)tsr_take_int(&r, 1);
	uint32_t size = (uint32_t)tsr_take_int(&r, 4);
	int fd;
	void *m;

	if (r.bad || r.left != 0 || size != TSR_PAGE_SIZE || kind > TSR_PAGE_PINS ||
	    (kind == TSR_PAGE_EPOCH ? c->epoch != NULL : c->page != NULL))
		return broke(c, EPROTO, "malformed PAGES message");
	if (c->nfdq == 0)
		return broke(c, EPROTO, "PAGES message without its memfd");
	fd = c->fdq[0];
	memmove(c->fdq, c->fdq + 1, --c->nfdq * sizeof(int));
	m = mmap(NULL, TSR_PAGE_SIZE, kind == TSR_PAGE_EPOCH ? PROT_READ : PROT_READ | PROT_WRITE,
		 MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return broke(c, errno, "cannot map a shared page");
	if (kind == TSR_PAGE_EPOCH) {
		c->epoch = m;
		if (tsr_get64(c->epoch) != TSR_EPOCH_MAGIC)
			return broke(c, EPROTO, "the epoch page is not one");
	} else {
		c->page = m;
	}
	return 0;
}

/* ---- the socket -------------------------------------------------------------- */

/* Reads what is there (waiting up to timeout_ms for it): bytes into in,
 * memfds into fdq. 0 when something arrived, -ETIMEDOUT, or an error. */
static int recv_some(tessera_client *c, int timeout_ms)
{
	struct pollfd pfd = {c->fd, POLLIN, 0};
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(FDQ_MAX * sizeof(int))];
	} cm;
	struct iovec iov;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
			    .msg_controllen = sizeof(cm.buf)};
	ssize_t n;
	int rc;

	do
		rc = poll(&pfd, 1, timeout_ms < 0 ? 0 : timeout_ms);
	while (rc < 0 && errno == EINTR);
	if (rc == 0)
		return -ETIMEDOUT;
	if (rc < 0)
		return broke(c, errno, "poll failed");
	if (c->consumed > 0) {
		memmove(c->in, c->in + c->consumed, c->inlen - c->consumed);
		c->inlen -= c->consumed;
		c->consumed = 0;
	}
	if (c->incap - c->inlen < 4096) {
		size_t cap = c->incap ? 2 * c->incap : 65536;
		uint8_t *nb;
		if (cap > TSR_WIRE_HDR + TSR_WIRE_REPLY_MAX + 4096)
			cap = TSR_WIRE_HDR + TSR_WIRE_REPLY_MAX + 4096;
		if (cap <= c->incap || (nb = realloc(c->in, cap)) == NULL)
			return broke(c, ENOMEM, "out of memory for a reply");
		c->in = nb;
		c->incap = cap;
	}
	iov.iov_base = c->in + c->inlen;
	iov.iov_len = c->incap - c->inlen;
	do
		n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); n >= 0 && h != NULL; h = CMSG_NXTHDR(&mh, h)) {
		if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
			if (c->nfdq < FDQ_MAX) {
				c->fdq[c->nfdq++] = fd;
			} else {
				close(fd);
				c->broken = true;
			}
		}
	}
	if (n < 0)
		return broke(c, errno, "connection lost");
	if (n == 0)
		return broke(c, ECONNRESET, "the node closed the connection");
	if (c->broken || (mh.msg_flags & MSG_CTRUNC))
		return broke(c, EPROTO, "too many memfds at once");
	c->inlen += (size_t)n;
	return 0;
}

/* The next whole frame already buffered: 1 (and *type, *p, *len), or 0. */
static int buffered_frame(tessera_client *c, uint16_t *type, const uint8_t **p, uint32_t *len)
{
	size_t have = c->inlen - c->consumed;
	const uint8_t *h;

	if (have < TSR_WIRE_HDR)
		return 0; /* (in is NULL until the first read) */
	h = c->in + c->consumed;
	*len = tsr_get32(h);
	*type = tsr_get16(h + 4);
	if (*len > TSR_WIRE_REPLY_MAX || tsr_get16(h + 6) != 0)
		return broke(c, EPROTO, "malformed frame header");
	if (have < TSR_WIRE_HDR + (size_t)*len)
		return 0;
	*p = h + TSR_WIRE_HDR;
	c->consumed += TSR_WIRE_HDR + *len;
	return 1;
}

static int on_error_frame(tessera_client *c, const uint8_t *p, uint32_t len)
{
	struct tsr_rd r = {p, len, 0};
	int fatal = (int)tsr_take_int(&r, 1);
	uint16_t n = (uint16_t)tsr_take_int(&r, 2);
	const uint8_t *msg = tsr_take(&r, n);

	if (r.bad)
		return broke(c, EPROTO, "malformed ERROR message");
	if (fatal == TSR_ERR_PAUSED)
		return fail(c, EBUSY, "tessera node: %.*s", (int)n, (const char *)msg);
	if (fatal)
		c->broken = true;
	return fail(c, fatal ? ECONNREFUSED : EAGAIN, "tessera node: %.*s", (int)n,
		    (const char *)msg);
}

/*
 * Reads frames until one of type want arrives (its payload in *p, valid
 * until the next read), handling VERSION notifications on the way. want 0:
 * handle what arrives within timeout_ms and return the new versions seen.
 */
static int pump(tessera_client *c, uint16_t want, int timeout_ms, const uint8_t **p, uint32_t *len)
{
	int64_t deadline = now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
	int news = 0, rc;

	if (c->broken)
		return -ENOTCONN;
	for (;;) {
		uint16_t type = 0;
		const uint8_t *fp = NULL;
		uint32_t flen = 0;
		while ((rc = buffered_frame(c, &type, &fp, &flen)) == 1) {
			if (type == TSR_MSG_VERSION) {
				if ((rc = on_version(c, fp, flen)) < 0)
					return rc;
				news++;
			} else if (type == TSR_MSG_PAGES) {
				if ((rc = on_pages(c, fp, flen)) < 0)
					return rc;
			} else if (type == TSR_MSG_DROPPED) {
				struct cver *v = flen == 8 ? find_ver(c, tsr_get64(fp)) : NULL;
				if (v == NULL || !v->held)
					return broke(c, EPROTO, "DROPPED names a version not held");
				v->held = false;
			} else if (type == TSR_MSG_ERROR) {
				return on_error_frame(c, fp, flen);
			} else if (want != 0 && type == want) {
				*p = fp;
				*len = flen;
				return 0;
			} else {
				return broke(c, EPROTO, "unexpected message");
			}
		}
		if (rc < 0)
			return rc;
		if (want == 0 && news > 0)
			return news;
		int64_t left = deadline - now_ms();
		rc = recv_some(c, left > 0 ? (int)left : 0);
		if (rc == -ETIMEDOUT && want == 0)
			return news;
		if (rc == -ETIMEDOUT)
			return fail(c, ETIMEDOUT, "tessera node: no reply within %d ms", timeout_ms);
		if (rc < 0)
			return rc;
	}
}

static int send_frame(tessera_client *c, uint16_t type, const uint8_t *payload, uint32_t len)
{
	uint8_t buf[TSR_WIRE_HDR + TSR_WIRE_REQ_MAX];
	size_t off = 0, total = TSR_WIRE_HDR + len;

	if (c->broken)
		return fail(c, ENOTCONN, "tessera client: the connection is closed");
	tsr_put_hdr(buf, len, type);
	if (len > 0)
		memcpy(buf + TSR_WIRE_HDR, payload, len);
	while (off < total) {
		ssize_t n = send(c->fd, buf + off, total - off, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return broke(c, errno, "cannot send to the node");
		off += (size_t)n;
	}
	return 0;
}

/* ---- the tensor table -------------------------------------------------------- */

/* Protocol 3: where tensor t comes from (a piece's name, flat flag, dims,
 * shape, box and base), every field checked. */
static int take_pieces(tessera_client *c, struct tsr_rd *r, struct tessera_tensor *t)
{
	uint32_t concat = (uint32_t)tsr_take_int(r, 1), n = (uint32_t)tsr_take_int(r, 2);
	struct tessera_piece *pcs;

	/* Each piece takes at least 12 bytes: bound the count first. */
	if (r->bad || n > r->left / 12 || (t->ndim > 0 && concat >= t->ndim))
		return broke(c, EPROTO, "malformed tensor pieces");
	if (n == 0)
		return 0;
	if ((pcs = calloc(n, sizeof(*pcs))) == NULL)
		return broke(c, ENOMEM, "out of memory for the tensor table");
	t->pieces = pcs;
	t->concat_dim = concat;
	for (uint32_t k = 0; k < n; k++) {
		struct tessera_piece *pc = &pcs[k];
		uint16_t nl = (uint16_t)tsr_take_int(r, 2);
		const uint8_t *name = tsr_take(r, nl);
		uint8_t flat = (uint8_t)tsr_take_int(r, 1);
		pc->ndim = (uint32_t)tsr_take_int(r, 1);
		if (r->bad || flat > 1 || pc->ndim > TESSERA_DIMS_MAX || nl == 0 ||
		    memchr(name, 0, nl) != NULL)
			return broke(c, EPROTO, "malformed tensor pieces");
		pc->flat = flat;
		for (uint32_t d = 0; d < pc->ndim; d++)
			pc->shape[d] = tsr_take_int(r, 8);
		for (uint32_t d = 0; d < pc->ndim; d++)
			pc->lo[d] = tsr_take_int(r, 8);
		for (uint32_t d = 0; d < pc->ndim; d++)
			pc->hi[d] = tsr_take_int(r, 8);
		pc->base = tsr_take_int(r, 8);
		for (uint32_t d = 0; d < pc->ndim && !r->bad; d++)
			if (pc->lo[d] > pc->hi[d] || (!flat && pc->hi[d] > pc->shape[d]))
				r->bad = 1;
		if (r->bad)
			return broke(c, EPROTO, "malformed tensor pieces");
		if ((pc->name = strndup((const char *)name, nl)) == NULL)
			return broke(c, ENOMEM, "out of memory for the tensor table");
		t->npieces = k + 1;
	}
	return 0;
}

static int on_attached(tessera_client *c, const uint8_t *p, uint32_t len)
{
	struct tsr_rd r = {p, len, 0};
	int rc;
	uint64_t active = tsr_take_int(&r, 8);
	uint32_t n = (uint32_t)tsr_take_int(&r, 4);

	c->announced = active;
	c->block = tsr_take_int(&r, 8);
	tsr_take(&r, 32);
	c->store = (int)tsr_take_int(&r, 1);
	if (c->proto >= 3) {
		uint8_t inplace = (uint8_t)tsr_take_int(&r, 1), holding = (uint8_t)tsr_take_int(&r, 1);
		if (inplace > 1 || holding > 1 || (holding && inplace))
			return broke(c, EPROTO, "malformed tensor table");
		c->in_place = inplace;
		c->holding = holding;
	}
	/* Each tensor takes at least 20 bytes: bound the count first. */
	if (r.bad || n > r.left / 20)
		return broke(c, EPROTO, "malformed tensor table");
	c->tensors = calloc(n ? n : 1, sizeof(*c->tensors));
	if (c->tensors == NULL)
		return broke(c, ENOMEM, "out of memory for the tensor table");
	for (uint32_t i = 0; i < n; i++) {
		struct tessera_tensor *t = &c->tensors[i];
		uint16_t nl = (uint16_t)tsr_take_int(&r, 2);
		const uint8_t *name = tsr_take(&r, nl);
		uint8_t dl = (uint8_t)tsr_take_int(&r, 1);
		const uint8_t *dt = tsr_take(&r, dl);
		t->ndim = (uint32_t)tsr_take_int(&r, 1);
		if (r.bad || t->ndim > TESSERA_DIMS_MAX)
			return broke(c, EPROTO, "malformed tensor table");
		for (uint32_t d = 0; d < t->ndim; d++)
			t->shape[d] = tsr_take_int(&r, 8);
		t->offset = tsr_take_int(&r, 8);
		t->nbytes = tsr_take_int(&r, 8);
		if (r.bad || t->offset > c->block || t->nbytes > c->block - t->offset ||
		    memchr(name, 0, nl) != NULL || memchr(dt, 0, dl) != NULL)
			return broke(c, EPROTO, "malformed tensor table");
		t->name = strndup((const char *)name, nl);
		t->dtype = strndup((const char *)dt, dl);
		c->ntensors = i + 1;
		if (t->name == NULL || t->dtype == NULL)
			return broke(c, ENOMEM, "out of memory for the tensor table");
		if (c->proto >= 3 && (rc = take_pieces(c, &r, t)) != 0)
			return rc;
	}
	if (r.left != 0)
		return broke(c, EPROTO, "malformed tensor table");
	/* An FP8 serving layout places each quantized tensor's scales right
	 * after it (proto/spec.h). */
	for (uint32_t i = 0; i + 1 < n; i++) {
		struct tessera_tensor *t = &c->tensors[i], *s = &c->tensors[i + 1];
		size_t nl = strlen(t->name);
		if (strcmp(t->dtype, "fp8_e4m3") == 0 && strcmp(s->dtype, "fp32") == 0 &&
		    strncmp(s->name, t->name, nl) == 0 && strcmp(s->name + nl, "_scale_inv") == 0)
			t->scale = s->name;
	}
	return 0;
}

/* ---- the API -------------------------------------------------------------------- */

/* Where a client connects: a socket path, or (tsr__attach_with) a
 * function that makes each connection. */
struct dialer {
	const char *path;
	int (*connect)(void *arg);
	void *arg;
};

/* Opens a connection to the node into c->fd; 0, or fails c saying why. */
static int dial(tessera_client *c, const struct dialer *d)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (d->connect != NULL) {
		c->fd = d->connect(d->arg);
		if (c->fd < 0)
			return fail(c, -c->fd, "tessera client: cannot connect: %s", strerror(-c->fd));
		return 0;
	}
	memcpy(sa.sun_path, d->path, strlen(d->path) + 1);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = errno;
		/* The two ways of finding no node: say which, in one line. A
		 * socket nobody listens on was left by a node that died (one
		 * that stops removes its socket and its activation record). */
		struct stat st;
		if (e == ECONNREFUSED && lstat(d->path, &st) == 0 && S_ISSOCK(st.st_mode))
			return fail(c, e, "tessera client: cannot connect to %s: no node listens there (a "
				    "socket left by a node that stopped without cleaning up; restart the "
				    "node)", d->path);
		if (e == ENOENT)
			return fail(c, e, "tessera client: cannot connect to %s: no such socket (the node "
				    "is not started, has stopped, or was given another --attach)", d->path);
		return fail(c, e, "tessera client: cannot connect to %s: %s", d->path, strerror(e));
	}
	return 0;
}

/* Connects and attaches speaking protocol proto (flags: protocol 3). */
static int attach_as(tessera_client *c, const struct dialer *d, const char *replica, uint32_t rank,
		     uint16_t proto, unsigned flags)
{
	uint8_t req[8 + TSR_WIRE_NAME_MAX + 4];
	size_t rlen = strlen(replica);
	const uint8_t *p;
	uint32_t len;
	int rc;

	c->proto = proto;
	if ((rc = dial(c, d)) != 0)
		return rc;
	tsr_put16(req, proto);
	tsr_put16(req + 2, (uint16_t)rlen);
	tsr_put32(req + 4, rank);
	memcpy(req + 8, replica, rlen);
	if (proto >= 3)
		tsr_put32(req + 8 + rlen, flags);
	if ((rc = send_frame(c, TSR_MSG_ATTACH, req, (uint32_t)(8 + rlen + (proto >= 3 ? 4 : 0)))) != 0)
		return rc;
	if ((rc = pump(c, TSR_MSG_ATTACHED, c->timeout_ms, &p, &len)) != 0)
		return rc;
	return on_attached(c, p, len);
}

static int attach_new(const struct dialer *d, const char *replica, uint32_t rank, int timeout_ms,
		      unsigned flags, tessera_client **out, char *err, size_t errlen)
{
	size_t rlen = replica ? strlen(replica) : 0;
	tessera_client *c;
	int rc;

	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		snprintf(err, errlen, "tessera client: out of memory");
		return -ENOMEM;
	}
	c->fd = -1;
	c->timeout_ms = timeout_ms;
	if (d->connect == NULL &&
	    (d->path == NULL || strlen(d->path) >= sizeof(((struct sockaddr_un *)0)->sun_path))) {
		rc = fail(c, ENAMETOOLONG, "tessera client: socket path too long");
		goto fail;
	}
	if (rlen == 0 || rlen > TSR_WIRE_NAME_MAX) {
		rc = fail(c, EINVAL, "tessera client: replica name of 1..%d bytes", TSR_WIRE_NAME_MAX);
		goto fail;
	}
	if (flags & ~TESSERA_HOLD) {
		rc = fail(c, EINVAL, "tessera client: unknown attach flags 0x%x", flags & ~TESSERA_HOLD);
		goto fail;
	}
	rc = attach_as(c, d, replica, rank, TSR_WIRE_PROTOCOL, flags);
	/* A node of an earlier release speaks protocol 2: attach as such
	 * (then nothing is held and tensors have no pieces). */
	if (rc == -ECONNREFUSED && strstr(c->err, "this node speaks 1 and 2") != NULL) {
		close(c->fd);
		c->fd = -1;
		c->broken = false;
		c->inlen = c->consumed = 0;
		rc = attach_as(c, d, replica, rank, 2, 0);
	}
	if (rc != 0)
		goto fail;
	/* The version active when we attached follows at once. */
	if (c->announced > 0 && (rc = tessera_wait_version(c, c->announced, timeout_ms)) < 0)
		goto fail;
	*out = c;
	return 0;
fail:
	snprintf(err, errlen, "%s", c->err);
	tessera_detach(c);
	return rc < 0 ? rc : -EPROTO;
}

API int tessera_attach_flags(const char *path, const char *replica, uint32_t rank, int timeout_ms,
			     unsigned flags, tessera_client **out, char *err, size_t errlen)
{
	struct dialer d = {.path = path};

	return attach_new(&d, replica, rank, timeout_ms, flags, out, err, errlen);
}

int tsr__attach_with(int (*connect)(void *arg), void *arg, const char *replica, uint32_t rank,
		     int timeout_ms, unsigned flags, tessera_client **out, char *err, size_t errlen)
{
	struct dialer d = {.connect = connect, .arg = arg};

	return attach_new(&d, replica, rank, timeout_ms, flags, out, err, errlen);
}

API int tessera_attach(const char *path, const char *replica, uint32_t rank, int timeout_ms,
		       tessera_client **out, char *err, size_t errlen)
{
	return tessera_attach_flags(path, replica, rank, timeout_ms, 0, out, err, errlen);
}

API void tessera_detach(tessera_client *c)
{
	if (c == NULL)
		return;
	if (c->fd >= 0)
		close(c->fd);
	if (c->epoch != NULL)
		munmap((void *)c->epoch, TSR_PAGE_SIZE);
	if (c->page != NULL)
		munmap(c->page, TSR_PAGE_SIZE);
	while (c->vers != NULL) {
		struct cver *v = c->vers;
		c->vers = v->next;
		ver_free(v);
	}
	for (size_t i = 0; i < c->nfdq; i++)
		close(c->fdq[i]);
	for (size_t i = 0; i < c->ntensors; i++) {
		struct tessera_tensor *t = &c->tensors[i];
		for (uint32_t k = 0; k < t->npieces; k++)
			free((char *)t->pieces[k].name);
		free((struct tessera_piece *)t->pieces);
		free((char *)t->name);
		free((char *)t->dtype);
	}
	free(c->tensors);
	free(c->in);
	free(c);
}

API size_t tessera_ntensors(const tessera_client *c)
{
	return c->ntensors;
}

API const struct tessera_tensor *tessera_tensor(const tessera_client *c, size_t i)
{
	return i < c->ntensors ? &c->tensors[i] : NULL;
}

API const struct tessera_tensor *tessera_find(const tessera_client *c, const char *name)
{
	for (size_t i = 0; i < c->ntensors; i++)
		if (strcmp(c->tensors[i].name, name) == 0)
			return &c->tensors[i];
	return NULL;
}

API uint64_t tessera_block_size(const tessera_client *c)
{
	return c->block;
}

API int tessera_store(const tessera_client *c)
{
	return c->store;
}

API uint64_t tessera_active(const tessera_client *c)
{
	return c->active;
}

API const struct tessera_version *tessera_version_info(const tessera_client *c, uint64_t version)
{
	struct cver *v = find_ver(c, version);
	return v ? &v->v : NULL;
}

/* ---- protocol 2: pins in shared memory ------------------------------------------- */

static uint64_t epoch_state(const tessera_client *c)
{
	return __atomic_load_n((const uint64_t *)(const void *)(c->epoch + TSR_EPOCH_STATE),
			       __ATOMIC_SEQ_CST);
}

static uint32_t *page_pin(tessera_client *c, uint8_t entry)
{
	return (uint32_t *)(void *)c->page + entry;
}

static uint64_t *page_requests(tessera_client *c, uint8_t entry)
{
	return (uint64_t *)(void *)(c->page + TSR_PAGE_REQUESTS) + entry;
}

static bool revoked(const tessera_client *c)
{
	return __atomic_load_n((const uint32_t *)(const void *)(c->page + TSR_PAGE_REVOKED),
			       __ATOMIC_SEQ_CST) != 0;
}

/* A pin on entry went that the node may be waiting for. While admission
 * is paused (an in-place install drains its pins) the node is told at once;
 * otherwise (a retired version) it looks at the pin pages by itself, every
 * TESSERA_ATTACH_SCAN_MS: waking it here, at a switch, would stall this
 * request behind it. */
static void ring(tessera_client *c)
{
	if ((uint8_t)epoch_state(c) == TSR_ENTRY_NONE)
		(void)send_frame(c, TSR_MSG_UNPIN, NULL, 0);
}

static void fill_pin(struct tessera_pin *out, uint64_t id, const struct cver *v)
{
	struct timespec ts;

	out->id = id;
	out->version = v->v.version;
	out->base = v->v.host;
	out->size = v->v.size;
	clock_gettime(CLOCK_REALTIME, &ts);
	out->acquired_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/*
 * Pins the admitted version through the pin page: 1 when pinned, 0 when it
 * must be acquired over the socket (no entry), or an error. No syscall
 * unless the version's VERSION frame is still unread or admission is
 * paused (then the state is looked at again every PAUSE_POLL_MS, reading
 * the socket meanwhile, until deadline).
 */
static int acquire_page(tessera_client *c, struct tessera_pin *out, int64_t deadline)
{
	for (;;) {
		if (revoked(c)) {
			int rc = pump(c, 0, 0, NULL, NULL); /* the reason, if it came */
			return rc < 0 ? rc : broke(c, ECONNREFUSED, "the node dropped this client");
		}
		uint64_t s = epoch_state(c), ver = s >> 8;
		uint8_t e = (uint8_t)s;
		struct cver *v = e < TSR_ENTRIES ? find_ver(c, ver) : NULL;
		if (e == TSR_ENTRY_SOCKET)
			return 0;
		/* Sent a version's VERSION frame, a client sees an older state
		 * until the node stores the one naming it (just after): the
		 * socket answers then, once the switch is done, so that an
		 * acquire never returns a version older than the one announced. */
		if (ver < c->active)
			return 0;
		if (e == TSR_ENTRY_NONE && ver == 0)
			return fail(c, EAGAIN, "tessera node: no version is active yet");
		if (v == NULL || v->entry != e) {
			/* Paused, or the version's VERSION frame not read yet. */
			int64_t left = deadline - now_ms();
			if (left <= 0 && e == TSR_ENTRY_NONE)
				return fail(c, EBUSY, "tessera node: admission paused (a version is being "
						      "installed in place) for more than %d ms",
					    c->timeout_ms);
			if (left <= 0)
				return fail(c, ETIMEDOUT, "tessera node: v%llu announced but not sent "
							  "within %d ms",
					    (unsigned long long)ver, c->timeout_ms);
			int rc = pump(c, 0, (int)(left < PAUSE_POLL_MS ? left : PAUSE_POLL_MS), NULL,
				      NULL);
			if (rc < 0)
				return rc;
			continue;
		}
		__atomic_fetch_add(page_pin(c, e), 1, __ATOMIC_SEQ_CST);
		if (epoch_state(c) != s) { /* switched meanwhile: not pinned */
			__atomic_fetch_sub(page_pin(c, e), 1, __ATOMIC_SEQ_CST);
			ring(c);
			continue;
		}
		__atomic_fetch_add(page_requests(c, e), 1, __ATOMIC_RELAXED);
		pin_taken(v);
		fill_pin(out, PAGE_PIN | ++c->next_page_pin, v);
		return 1;
	}
}

API int tessera_acquire(tessera_client *c, struct tessera_pin *out)
{
	const uint8_t *p;
	uint32_t len;
	struct cver *v;
	int rc;

	int64_t deadline = now_ms() + c->timeout_ms;

	memset(out, 0, sizeof(*out));
	if (c->broken)
		return fail(c, ENOTCONN, "tessera client: the connection is closed");
	if (c->epoch != NULL && c->page != NULL && (rc = acquire_page(c, out, deadline)) != 0)
		return rc < 0 ? rc : 0;
	/* Admission paused (a version being installed in place): the request
	 * waits for the next version, then asks again, within the timeout. */
	for (;;) {
		if ((rc = send_frame(c, TSR_MSG_ACQUIRE, NULL, 0)) != 0)
			return rc;
		rc = pump(c, TSR_MSG_ACQUIRED, c->timeout_ms, &p, &len);
		if (rc != -EBUSY)
			break;
		int news = 0;
		while (news == 0) {
			int64_t left = deadline - now_ms();
			if (left <= 0)
				return fail(c, EBUSY, "tessera node: admission paused (a version is being "
						      "installed in place) for more than %d ms",
					    c->timeout_ms);
			if ((news = pump(c, 0, (int)left, NULL, NULL)) < 0)
				return news;
		}
	}
	if (rc != 0)
		return rc;
	if (len != 16)
		return broke(c, EPROTO, "malformed ACQUIRED message");
	out->id = tsr_get64(p);
	out->version = tsr_get64(p + 8);
	/* The node sends a version before any reply naming it. */
	if ((v = find_ver(c, out->version)) == NULL)
		return broke(c, EPROTO, "ACQUIRED names a version never sent");
	pin_taken(v);
	fill_pin(out, out->id, v);
	return 0;
}

API int tessera_release(tessera_client *c, const struct tessera_pin *pin)
{
	uint8_t req[8];
	const uint8_t *p;
	uint32_t len;
	struct cver *v = find_ver(c, pin->version);
	int rc;

	if (v == NULL || v->pins == 0)
		return fail(c, EINVAL, "tessera client: pin %llu is not held",
			    (unsigned long long)pin->id);
	if (pin->id & PAGE_PIN) {
		/* A page pin needs both pages (a node may have sent only one). */
		if (v->entry == TSR_ENTRY_NONE || c->page == NULL || c->epoch == NULL)
			return fail(c, EINVAL, "tessera client: pin %llu is not held",
				    (unsigned long long)pin->id);
		__atomic_fetch_sub(page_pin(c, v->entry), 1, __ATOMIC_SEQ_CST);
		/* Not the admitted version any more: the node may be waiting. */
		if (epoch_state(c) != (v->v.version << 8 | v->entry))
			ring(c);
		pin_dropped(c, v);
		sweep(c);
		/* Dropped meanwhile (e.g. past an in-place drain bound): the pin
		 * stopped counting, so the request may have read a mix. */
		if (revoked(c)) {
			rc = pump(c, 0, 0, NULL, NULL); /* the reason, if it came */
			return rc < 0 ? rc : broke(c, ECONNREFUSED, "the node dropped this client");
		}
		return 0;
	}
	tsr_put64(req, pin->id);
	if ((rc = send_frame(c, TSR_MSG_RELEASE, req, 8)) != 0)
		return rc;
	if ((rc = pump(c, TSR_MSG_RELEASED, c->timeout_ms, &p, &len)) != 0)
		return rc;
	if (len != 8 || tsr_get64(p) != pin->id)
		return broke(c, EPROTO, "malformed RELEASED message");
	pin_dropped(c, v);
	sweep(c);
	return 0;
}

API int tessera_wait_version(tessera_client *c, uint64_t min, int timeout_ms)
{
	int64_t deadline = now_ms() + timeout_ms;

	while (c->active < min) {
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return fail(c, ETIMEDOUT, "tessera client: no version >= %llu within %d ms",
				    (unsigned long long)min, timeout_ms);
		int rc = pump(c, 0, (int)left, NULL, NULL);
		if (rc < 0)
			return rc;
	}
	sweep(c);
	return 0;
}

API int tessera_poll(tessera_client *c, int timeout_ms)
{
	int rc = pump(c, 0, timeout_ms, NULL, NULL);

	sweep(c);
	return rc;
}

API int tessera_fd(const tessera_client *c)
{
	return c->fd;
}

API void tessera_on_version(tessera_client *c, tessera_version_cb cb, void *arg)
{
	c->cb = cb;
	c->cbarg = arg;
}

API const char *tessera_error(const tessera_client *c)
{
	return c->err;
}

/* ---- protocol 3: holds, pins by version, the guard ---------------------------------- */

API int tessera_holding(const tessera_client *c)
{
	return c->holding;
}

API int tessera_in_place(const tessera_client *c)
{
	return c->in_place;
}

API size_t tessera_prepared(const tessera_client *c, uint64_t *out, size_t max)
{
	size_t n = 0;

	/* c->vers is newest first: fill from the back for ascending order. */
	for (const struct cver *v = c->vers; v != NULL; v = v->next)
		n += v->held || v->v.version == c->active;
	size_t i = n;
	for (const struct cver *v = c->vers; v != NULL; v = v->next)
		if (v->held || v->v.version == c->active)
			if (--i < max)
				out[i] = v->v.version;
	return n;
}

API int tessera_acquire_version(tessera_client *c, uint64_t version, struct tessera_pin *out)
{
	struct cver *v = find_ver(c, version);
	const uint8_t *p;
	uint32_t len;
	uint8_t req[8];
	int rc;

	memset(out, 0, sizeof(*out));
	if (c->broken)
		return fail(c, ENOTCONN, "tessera client: the connection is closed");
	/* Held with an entry: the hold keeps it, so the page pin needs no look
	 * at the state (wire.h, protocol 3). */
	if (v != NULL && v->held && v->entry != TSR_ENTRY_NONE && c->page != NULL && !revoked(c)) {
		__atomic_fetch_add(page_pin(c, v->entry), 1, __ATOMIC_SEQ_CST);
		__atomic_fetch_add(page_requests(c, v->entry), 1, __ATOMIC_RELAXED);
		pin_taken(v);
		fill_pin(out, PAGE_PIN | ++c->next_page_pin, v);
		return 0;
	}
	if (v == NULL || c->proto < 3) {
		/* The active one is the only other: a plain acquire, if it is that. */
		if (version != c->active)
			return fail(c, ENOENT, "tessera client: v%llu is neither held nor active",
				    (unsigned long long)version);
		if ((rc = tessera_acquire(c, out)) < 0)
			return rc;
		if (out->version == version)
			return 0;
		(void)tessera_release(c, out);
		memset(out, 0, sizeof(*out));
		return fail(c, ENOENT, "tessera client: v%llu is no longer active",
			    (unsigned long long)version);
	}
	tsr_put64(req, version);
	if ((rc = send_frame(c, TSR_MSG_ACQUIRE, req, 8)) != 0)
		return rc;
	rc = pump(c, TSR_MSG_ACQUIRED, c->timeout_ms, &p, &len);
	if (rc == -EAGAIN)
		return -ENOENT; /* the node's reason is in c->err */
	if (rc != 0)
		return rc;
	if (len != 16 || tsr_get64(p + 8) != version)
		return broke(c, EPROTO, "malformed ACQUIRED message");
	pin_taken(v);
	fill_pin(out, tsr_get64(p), v);
	return 0;
}

API int tessera_drop(tessera_client *c, uint64_t version)
{
	struct cver *v = find_ver(c, version);
	uint8_t req[8];
	int rc;

	if (v == NULL || !v->held)
		return fail(c, EINVAL, "tessera client: v%llu is not held", (unsigned long long)version);
	tsr_put64(req, version);
	if ((rc = send_frame(c, TSR_MSG_DROP, req, 8)) != 0)
		return rc;
	v->held = false;
	sweep(c);
	return 0;
}

API void tessera_guard(tessera_client *c, int on)
{
	c->guard = on != 0;
	if (!c->guard)
		for (struct cver *v = c->vers; v != NULL; v = v->next)
			if (v->guarded && mprotect((void *)v->v.host, v->v.size, PROT_READ) == 0)
				v->guarded = false;
}

API const char *tessera_client_version(void)
{
	return PROTO_RELEASE;
}
