/* libFuzzer target: the node's attach server (node/serve/attach.c) on the
 * frames a serving process sends (node/client/wire.h), through its socket
 * as a client delivers them. One server, serving replica "A" rank 0 of tp2
 * over a small fixture model with version 1 active, lives across inputs
 * (its store keeps a retired slot for the next version, as the agent's
 * does; the process is held to one CPU, where the server's reaper thread
 * runs as soon as the harness waits for it); every input is one
 * connection.
 *
 * Input: a flags byte, then the client's bytes. Flags: bit 0 activates a
 * new version (retiring the old) when half the bytes are in, bit 2 sends
 * the bytes in pieces of 7. After the connection closes, nothing it did may remain: no
 * client, no pin, no retired slot kept. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>

#include "node/serve/attach.h"
#include "proto/fixture.h"
#include "proto/log.h"
#include "tests/fuzz/fuzz_sock.h"
#include "proto/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct {
	struct event_base *base;
	struct node_store store;
	struct proto_model m;
	struct proto_layout l;
	struct node_attach_info ai;
	struct node_attach *at;
	struct node_slot *active;
	uint64_t version;
	uint8_t digest[32];
	char dir[256], sock[300];
} fzs;

static void fzs_cleanup(void)
{
	node_attach_free(fzs.at);
	node_attach_retire(NULL, &fzs.store, fzs.active);
	rmdir(fzs.dir);
}

/* Waits until the reaper has freed what it was handed (no grace: set in
 * fzs_setup). A slot freed on the reaper's thread during a later input
 * made libFuzzer count more mallocs than frees in this one and run its
 * leak check (a scan of the whole heap) after every input that activated:
 * nine tenths of the target's time. */
static void fzs_reaped(void)
{
	while (node_attach_reaping(fzs.at) > 0)
		sched_yield();
}

/* Makes a new version active and retires the previous one, as the agent does. */
static void fzs_activate(void)
{
	struct node_slot *s, *old = fzs.active;

	if (node_slot_new(&fzs.store, ++fzs.version, fzs.l.ranks[0].nbytes, &s, NULL) != 0)
		abort();
	memset(fzs.digest, (int)fzs.version, sizeof(fzs.digest));
	fzs.active = s;
	node_attach_activate(fzs.at, s, fzs.digest);
	node_attach_retire(fzs.at, &fzs.store, old);
	fzs_reaped();
}

static void fzs_setup(void)
{
	struct proto_err err;

	fz_socket_dir("att", fzs.dir, sizeof(fzs.dir), fzs.sock, sizeof(fzs.sock));
	setenv("TESSERA_ATTACH_FREE_GRACE_MS", "0", 1); /* no grace: fzs_reaped */
	proto_log_setup("fuzz", PROTO_LOG_ERR);
	if (proto_fixture_model(64 << 10, &fzs.m, &err) != 0 ||
	    proto_layout_builtin(&fzs.m, "tp2", &fzs.l, &err) != 0 ||
	    node_store_open("host", &fzs.store, &err) != 0 || (fzs.base = event_base_new()) == NULL)
		abort();
	/* As the agent does: the retired slot makes the next one, so that an
	 * activation maps and unmaps nothing (an unmap on the reaper's thread
	 * interrupted the other CPU to flush its TLB: a third of the time). */
	node_store_keep_spare(&fzs.store);
	memset(fzs.digest, 0x5a, sizeof(fzs.digest));
	fzs.ai = (struct node_attach_info){.replica = "A", .rank = 0, .spec = &fzs.l.ranks[0],
					   .layout_digest = fzs.l.digest, .store = &fzs.store,
					   .model = &fzs.m};
	/* This thread and the reaper's (made by node_attach_new, inheriting
	 * it) on one CPU: what fzs_reaped waits for then runs as soon as this
	 * thread yields, where on another busy CPU it waited for a turn there
	 * (twice the time of the rest of an input, on two cores). */
	{
		cpu_set_t one;
		int cpu = sched_getcpu();
		CPU_ZERO(&one);
		CPU_SET(cpu >= 0 ? cpu : 0, &one);
		sched_setaffinity(0, sizeof(one), &one); /* else it merely runs slower */
	}
	if (node_attach_new(fzs.base, fzs.sock, &fzs.ai, &fzs.at, &err) != 0) {
		fprintf(stderr, "node_attach_new: %s\n", err.msg);
		abort();
	}
	atexit(fzs_cleanup);
	fzs_activate();
}

/* Writes bytes (in pieces of 7 when split), letting the server run: the
 * loop runs until nothing is active, without the last empty poll of a
 * plain non-blocking run (the server sends its answers itself, and
 * nothing else writes to it while the loop runs). */
static void fzs_send(int fd, const uint8_t *p, size_t n, bool split)
{
	while (n > 0) {
		size_t k = split && n > 7 ? 7 : n;
		ssize_t w = send(fd, p, k, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno != EAGAIN && errno != EINTR)
			return; /* the server closed it */
		if (w > 0) {
			p += w;
			n -= (size_t)w;
		}
		event_base_loop(fzs.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
		fz_drain(fd);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	uint8_t flags;
	int fd;

	if (fzs.at == NULL)
		fzs_setup();
	if (size < 1 || size > (16u << 10))
		return 0;
	flags = data[0];
	data++;
	size--;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", fzs.sock);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		abort();
	event_base_loop(fzs.base, EVLOOP_NONBLOCK); /* accepted */
	fzs_send(fd, data, size / 2, flags & 4);
	if (flags & 1)
		fzs_activate();
	fzs_send(fd, data + size / 2, size - size / 2, flags & 4);
	/* The server answers what it has read (at most 4 rounds). A round in
	 * which it sent nothing ends it: its socket was writable and nothing
	 * new came in, so a next round has nothing to run. */
	for (int i = 0; i < 4; i++) {
		event_base_loop(fzs.base, EVLOOP_NONBLOCK);
		if (fz_drain(fd) <= 0)
			break;
	}
	close(fd);
	for (int i = 0; i < 100 && node_attach_clients(fzs.at) > 0; i++)
		event_base_loop(fzs.base, EVLOOP_NONBLOCK);
	fzs_reaped(); /* what the closed client pinned */
	if (node_attach_clients(fzs.at) != 0 || node_attach_retained(fzs.at) != 0 ||
	    node_attach_pins(fzs.at, fzs.version) != 0) {
		fprintf(stderr, "fuzz_attach_server: the closed client left state behind\n");
		abort();
	}
	return 0;
}
