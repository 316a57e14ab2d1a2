/* libFuzzer target: libtessera-client (node/client/client.c) on the frames a
 * node sends (node/client/wire.h): ATTACHED with protocol 3's tensor
 * pieces, VERSION, PAGES, ACQUIRED, RELEASED, DROPPED, ERROR. A fake node
 * writes the input's frames (each VERSION and PAGES frame with a memfd, as a
 * node passes them) into one end of a socket pair and closes its sending
 * side; the client, handed the other end (tsr__attach_with: each connection
 * it makes is such a pair, so a refused protocol 3 is retried as 2), attaches,
 * then acquires, reads the pinned bytes, releases, pins and drops what it
 * holds, and detaches. The node never reads what the client sends (it sits
 * in the pair's buffer); no thread and no listening socket are involved
 * (with them the target ran about 150 executions a second, mostly waiting
 * for the scheduler).
 *
 * Input: a flags byte (bit 0: attach with TESSERA_HOLD; bit 1: send no
 * memfds), a u64 written at the state word of every memfd (the epoch page's
 * admission state), then the node's bytes. A VERSION frame's memfd is as
 * long as the frame says (when at most 1 MiB; else one page). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "node/client/client_internal.h"
#include "node/client/tessera_client.h"
#include "node/client/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fzc_node {
	const uint8_t *p;
	size_t n;
	bool fds;
	uint64_t state;
	int ends[2]; /* the node's ends of the pairs made, closed after detach */
	int nends;
};

/* A memfd of len bytes (at least a page), with the epoch magic and state. */
static int fzc_memfd(uint64_t len, uint64_t state)
{
	uint8_t head[16];
	int fd = memfd_create("fuzz", MFD_CLOEXEC);

	if (len < TSR_PAGE_SIZE || len > (1u << 20))
		len = TSR_PAGE_SIZE;
	tsr_put64(head, TSR_EPOCH_MAGIC);
	tsr_put64(head + 8, state);
	if (fd < 0 || ftruncate(fd, (off_t)len) != 0 || pwrite(fd, head, 16, 0) != 16)
		abort();
	return fd;
}

/* Writes the input to one connection, frame by frame, then closes its
 * sending side. */
static void fzc_serve(const struct fzc_node *in, int fd)
{
	const uint8_t *p = in->p;
	size_t n = in->n;

	while (n > 0) {
		size_t k = n;
		int mfd = -1;
		if (n >= TSR_WIRE_HDR) {
			uint32_t len = tsr_get32(p);
			uint16_t type = tsr_get16(p + 4);
			k = len <= n - TSR_WIRE_HDR ? TSR_WIRE_HDR + len : n;
			if (in->fds && (type == TSR_MSG_VERSION || type == TSR_MSG_PAGES))
				mfd = fzc_memfd(type == TSR_MSG_VERSION && len >= 16 && k == TSR_WIRE_HDR + len ?
							tsr_get64(p + TSR_WIRE_HDR + 8) :
							TSR_PAGE_SIZE,
						in->state);
		}
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cm;
		struct iovec iov = {(void *)p, k};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
		if (mfd >= 0) {
			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.b;
			mh.msg_controllen = sizeof(cm.b);
			struct cmsghdr *h = CMSG_FIRSTHDR(&mh);
			h->cmsg_level = SOL_SOCKET;
			h->cmsg_type = SCM_RIGHTS;
			h->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(h), &mfd, sizeof(int));
		}
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (mfd >= 0)
			close(mfd);
		if (w <= 0)
			break;
		/* A short write of a frame with a memfd sent the fd already. */
		p += w;
		n -= (size_t)w;
	}
	shutdown(fd, SHUT_WR);
}

/* A connection of the client: a socket pair the node has written the input
 * into (at most two per input: the client retries once, as protocol 2). */
static int fzc_connect(void *arg)
{
	struct fzc_node *in = arg;
	int sv[2];

	if (in->nends == 2)
		return -ECONNREFUSED;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	/* The node's writes must not wait for the client, which reads only
	 * once they are done: a full buffer ends them (as a node gives up on
	 * a client that does not read). */
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	fzc_serve(in, sv[1]);
	in->ends[in->nends++] = sv[1];
	return sv[0];
}

/* What an engine does with an attached client. */
static void fzc_use(tessera_client *c)
{
	struct tessera_pin pin;
	uint64_t held[8];
	volatile uint8_t sink = 0;

	for (size_t i = 0; i < tessera_ntensors(c); i++) {
		const struct tessera_tensor *t = tessera_tensor(c, i);
		if (t == NULL || t->offset + t->nbytes > tessera_block_size(c) ||
		    tessera_find(c, t->name) == NULL)
			abort();
		for (uint32_t k = 0; k < t->npieces; k++)
			sink ^= (uint8_t)t->pieces[k].name[0];
	}
	tessera_poll(c, 0);
	if (tessera_acquire(c, &pin) == 0) {
		const struct tessera_version *v = tessera_version_info(c, pin.version);
		if (v == NULL || pin.size != v->size)
			abort();
		if (pin.base != NULL && pin.size > 0)
			sink ^= pin.base[0] ^ pin.base[pin.size - 1];
		tessera_release(c, &pin);
	}
	size_t n = tessera_prepared(c, held, 8);
	for (size_t i = 0; i < n && i < 8; i++) {
		if (tessera_acquire_version(c, held[i], &pin) == 0)
			tessera_release(c, &pin);
		tessera_drop(c, held[i]);
	}
	tessera_wait_version(c, tessera_active(c) + 1, 0);
	(void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fzc_node in;
	tessera_client *c = NULL;
	char err[256];

	signal(SIGPIPE, SIG_IGN);
	if (size < 9 || size > (64u << 10))
		return 0;
	in = (struct fzc_node){data + 9, size - 9, !(data[0] & 2), 0, {-1, -1}, 0};
	memcpy(&in.state, data + 1, 8);
	if (tsr__attach_with(fzc_connect, &in, "A", 0, 1000, data[0] & 1 ? TESSERA_HOLD : 0, &c,
			     err, sizeof(err)) == 0) {
		fzc_use(c);
		tessera_detach(c);
	} else if (c != NULL || err[0] == 0) {
		abort();
	}
	for (int i = 0; i < in.nends; i++)
		close(in.ends[i]);
	return 0;
}
