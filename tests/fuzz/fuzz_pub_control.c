/* libFuzzer target: the publisher's control socket (node/publisher/
 * pub_control.c): command lines from up to three connections at once
 * (export, trainer R [bytes N] [dtype D], export STEP, status, quit, and
 * anything else), as a trainer sends them. Each connection is one end of a
 * bufferevent pair handed to the control (node_pub__control_adopt), so
 * that the control reads and answers them as it does a socket's, through
 * the same callbacks, with no system call in between (a socket per
 * connection held the target near 600 executions a second); the pair
 * carries no descriptor, so "trainer R" is answered without the memfd
 * (test_publisher checks the socket's). The publisher under it is a
 * stand-in (the node_pub_* calls the control makes, defined here): a
 * trainer layout of two ranks over a small fixture model, exports queued
 * and finished when the input says.
 *
 * Input: a flags byte (bit 0: the source is the trainer; bit 1: finish the
 * oldest export after every line; bit 2: fail the exports it finishes),
 * then each connection's bytes, connections separated by NUL bytes; their
 * lines are sent in turn, one line each. The connections close at the end,
 * then the exports still queued finish (their answers owed to connections
 * that are gone). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "node/publisher/pub_control.h"
#include "proto/fixture.h"
#include "proto/log.h"
#include "tests/fuzz/fuzz_sock.h"
#include "proto/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZP_CONNS 3
#define FZP_QUEUE 16

/* An export the stand-in publisher holds. */
struct fzp_export {
	node_pub_cb cb;
	node_pub_snap_cb snap;
	void *arg;
};

static struct {
	struct event_base *base;
	struct proto_model m;
	struct proto_layout tl;
	struct node_pub_control *pc;
	int bufs[2];
	bool trainer, fail;
	struct fzp_export q[FZP_QUEUE];
	size_t nq;
	uint64_t version;
	char dir[256], sock[300];
} fzp;

/* ---- the stand-in publisher ---- */

int node_pub_export_snap(struct node_pub *p, node_pub_cb cb, node_pub_snap_cb on_snap, void *arg)
{
	if (fzp.nq == FZP_QUEUE)
		return -ENOMEM;
	fzp.q[fzp.nq++] = (struct fzp_export){cb, on_snap, arg};
	return 0;
}

int node_pub_export(struct node_pub *p, node_pub_cb cb, void *arg)
{
	return node_pub_export_snap(p, cb, NULL, arg);
}

int node_pub_export_why(const struct node_pub *p, const void *arg, struct node_pub_why *out)
{
	for (size_t i = 0; i < fzp.nq; i++)
		if (fzp.q[i].arg == arg) {
			out->cause = i == 0 ? NODE_PUB_WAIT_TRACKER : NODE_PUB_WAIT_BUSY;
			out->version = i == 0 ? fzp.version + 1 : 0;
			snprintf(out->text, sizeof(out->text), "export %zu of %zu", i + 1, fzp.nq);
			return 0;
		}
	return -ENOENT;
}

const char *node_pub_wait_name(enum node_pub_wait w)
{
	return w == NODE_PUB_WAIT_BUSY ? "busy" : w == NODE_PUB_WAIT_TRACKER ? "tracker" : "working";
}

int node_pub_trainer_buffer(const struct node_pub *p, uint32_t rank, int *fd, uint64_t *bytes)
{
	if (rank >= fzp.tl.nranks)
		abort(); /* the control checks the rank first */
	*fd = fzp.bufs[rank];
	*bytes = fzp.tl.ranks[rank].nbytes;
	return 0;
}

bool node_pub_trainer_source(const struct node_pub *p)
{
	return fzp.trainer;
}

const struct proto_layout *node_pub_trainer_layout(const struct node_pub *p)
{
	return &fzp.tl;
}

const struct proto_model *node_pub_model(const struct node_pub *p)
{
	return &fzp.m;
}

/* Finishes the oldest export: snapshot, then its result. */
static void fzp_finish(void)
{
	struct fzp_export e;
	struct node_pub_result r = {0};

	if (fzp.nq == 0)
		return;
	e = fzp.q[0];
	memmove(fzp.q, fzp.q + 1, --fzp.nq * sizeof(fzp.q[0]));
	r.version = ++fzp.version;
	if (fzp.fail) {
		r.status = -EIO;
		r.error = "the tracker refused it";
	} else {
		r.error = "";
		if (e.snap != NULL)
			e.snap(e.arg, r.version);
	}
	e.cb(e.arg, &r);
}

/* ---- the harness ---- */

static void fzp_cleanup(void)
{
	node_pub_control_free(fzp.pc);
	rmdir(fzp.dir);
}

static void fzp_setup(void)
{
	struct proto_err err;

	fz_socket_dir("ctl", fzp.dir, sizeof(fzp.dir), fzp.sock, sizeof(fzp.sock));
	proto_log_setup("fuzz", PROTO_LOG_ERR);
	if (proto_fixture_model(64 << 10, &fzp.m, &err) != 0 ||
	    proto_layout_builtin(&fzp.m, "tp2", &fzp.tl, &err) != 0 ||
	    (fzp.base = event_base_new()) == NULL)
		abort();
	for (uint32_t r = 0; r < 2; r++)
		if ((fzp.bufs[r] = memfd_create("fuzz", MFD_CLOEXEC)) < 0 ||
		    ftruncate(fzp.bufs[r], (off_t)fzp.tl.ranks[r].nbytes) != 0)
			abort();
	if (node_pub_control_new(fzp.base, fzp.sock, (struct node_pub *)&fzp, NULL, &fzp.pc, &err) != 0) {
		fprintf(stderr, "node_pub_control_new: %s\n", err.msg);
		abort();
	}
	atexit(fzp_cleanup);
}

/* Runs the loop until nothing is left to run: the pairs' callbacks are
 * deferred to it, as a socket's are. Nothing but them is ever active (no
 * socket is used; the control's listener has no client), so the loop is
 * entered only while something is, and left as soon as nothing is: each
 * turn of it polls the descriptors, a system call. */
static void fzp_spin(void)
{
	for (int i = 0; i < 64 && event_base_get_num_events(fzp.base, EVENT_BASE_COUNT_ACTIVE) > 0;
	     i++)
		event_base_loop(fzp.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
}

/* The client's side reads and drops the answers. */
static void fzp_on_answer(struct bufferevent *bev, void *arg)
{
	struct evbuffer *in = bufferevent_get_input(bev);

	evbuffer_drain(in, evbuffer_get_length(in));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *seg[FZP_CONNS];
	size_t left[FZP_CONNS];
	struct bufferevent *cl[FZP_CONNS];
	int n = 0;
	uint8_t flags;

	if (fzp.pc == NULL)
		fzp_setup();
	if (size < 1 || size > (8u << 10))
		return 0;
	flags = data[0];
	fzp.trainer = flags & 1;
	fzp.fail = flags & 4;
	data++;
	size--;
	while (n < FZP_CONNS) {
		const uint8_t *z = memchr(data, 0, size);
		seg[n] = data;
		left[n] = z && n < FZP_CONNS - 1 ? (size_t)(z - data) : size;
		n++;
		if (z == NULL || n == FZP_CONNS)
			break;
		size -= (size_t)(z + 1 - data);
		data = z + 1;
	}
	for (int i = 0; i < n; i++) {
		struct bufferevent *pair[2];
		if (bufferevent_pair_new(fzp.base, BEV_OPT_DEFER_CALLBACKS, pair) != 0 ||
		    node_pub__control_adopt(fzp.pc, pair[0]) != 0)
			abort();
		cl[i] = pair[1];
		bufferevent_setcb(cl[i], fzp_on_answer, NULL, NULL, NULL);
		bufferevent_enable(cl[i], EV_READ | EV_WRITE);
	}
	fzp_spin();
	for (bool more = true; more;) {
		more = false;
		for (int i = 0; i < n; i++) {
			if (left[i] == 0)
				continue;
			const uint8_t *nl = memchr(seg[i], '\n', left[i]);
			size_t k = nl ? (size_t)(nl + 1 - seg[i]) : left[i];
			bufferevent_write(cl[i], seg[i], k);
			seg[i] += k;
			left[i] -= k;
			more |= left[i] > 0;
			fzp_spin();
			if (flags & 2)
				fzp_finish();
		}
	}
	fzp_spin();
	/* Closed as a socket is: the control sees the end of its stream (what
	 * it has not taken in yet is lost). */
	for (int i = 0; i < n; i++) {
		bufferevent_flush(cl[i], 0, BEV_FINISHED);
		bufferevent_free(cl[i]);
	}
	fzp_spin();
	while (fzp.nq > 0)
		fzp_finish();
	fzp_spin();
	return 0;
}
