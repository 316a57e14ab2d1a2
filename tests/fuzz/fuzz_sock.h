/* What the socket-driven fuzz targets share: reading a peer's answers off a
 * Unix socket and closing the descriptors that came along. Header-only. */
#ifndef TESTS_FUZZ_SOCK_H
#define TESTS_FUZZ_SOCK_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Reads and drops what is there (closing passed descriptors), without
 * waiting: how many bytes it read, or -1 at the end of the stream or on
 * an error. */
static inline ssize_t fz_drain(int fd)
{
	ssize_t got = 0;

	for (;;) {
		uint8_t buf[4096];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(8 * sizeof(int))];
		} cm;
		struct iovec iov = {buf, sizeof(buf)};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				    .msg_controllen = sizeof(cm.b)};
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		for (struct cmsghdr *h = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; h != NULL;
		     h = CMSG_NXTHDR(&mh, h)) {
			size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int x;
				memcpy(&x, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
				close(x);
			}
		}
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return -1;
		if (n < 0)
			return got;
		got += n;
	}
}

/* A fresh directory under $TMPDIR for a target's socket (dir, then its
 * socket file name in sock); SIGPIPE ignored. Aborts on failure. */
static inline void fz_socket_dir(const char *tag, char *dir, size_t dcap, char *sock, size_t scap)
{
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";

	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, dcap, "%s/tessera-fuzz-%s-XXXXXX", tmp, tag);
	if (mkdtemp(dir) == NULL)
		abort();
	snprintf(sock, scap, "%s/s.sock", dir);
}

#endif
