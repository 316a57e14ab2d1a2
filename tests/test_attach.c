/*
 * The attach server (node/serve/attach.c) driven directly on its own event loop
 * thread, with libtessera-client and the Python package as clients: tensor
 * table, the active version's bytes, pins across a switch, a client that
 * vanishes with pins, refused replicas and ranks, garbage on the socket.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <cmocka.h>

#include "node/serve/attach.h"
#include "node/serve/attach_reap.h"
#include "node/cli/proc.h"
#include "node/client/tessera_client.h"
#include "node/client/wire.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"
#include "tests/testcluster.h"

#define NT 3

struct env {
	char dir[256], sock[300];
	struct event_base *base;
	pthread_t loop;
	struct event *keep;
	struct node_store store;
	struct proto_local locals[NT];
	struct proto_rank rank;
	/* The model the locals come from: embed whole, layers.0.wq fused from
	 * q and k (dim 0), norm the second half of a longer one. */
	struct proto_tensor mt[4];
	struct proto_model model;
	struct proto_piece pieces[4];
	struct node_attach_info ai;
	uint8_t digest[32];
	struct node_attach *at;
	struct node_slot *active;
	bool reused; /* the last activation's slot came from the store's spare */
};

/* Byte i of version v: what every check compares against. */
static uint8_t pattern(uint64_t v, size_t i)
{
	return (uint8_t)(i * 31 + v * 101 + (i >> 8));
}

/* ---- running things on the loop thread ---------------------------------------- */

struct job {
	void (*fn)(struct env *e, void *arg);
	struct env *e;
	void *arg;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
};

static void run_job(evutil_socket_t fd, short what, void *arg)
{
	struct job *j = arg;
	j->fn(j->e, j->arg);
	pthread_mutex_lock(&j->mu);
	j->done = 1;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

/* Runs fn on the loop thread (where the server's state lives) and waits. */
static void on_loop(struct env *e, void (*fn)(struct env *, void *), void *arg)
{
	struct job j = {fn, e, arg, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
	struct timeval now = {0, 0};

	assert_int_equal(event_base_once(e->base, -1, EV_TIMEOUT, run_job, &j, &now), 0);
	pthread_mutex_lock(&j.mu);
	while (!j.done)
		pthread_cond_wait(&j.cv, &j.mu);
	pthread_mutex_unlock(&j.mu);
}

static void *loop_main(void *arg)
{
	struct env *e = arg;
	event_base_loop(e->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void stop_loop(struct env *e, void *arg)
{
	event_base_loopbreak(e->base);
}

/* Activates version v (a fresh slot filled with its pattern) and retires
 * the previous one, as the agent does. */
static void activate_job(struct env *e, void *arg)
{
	uint64_t v = *(uint64_t *)arg;
	struct node_slot *s;
	uint8_t dg[32];

	assert_int_equal(node_slot_new(&e->store, v, e->rank.nbytes, &s, NULL), 0);
	for (size_t i = 0; i < s->len; i++)
		s->host[i] = pattern(v, i);
	memset(dg, (int)v, sizeof(dg));
	struct node_slot *old = e->active;
	e->active = s;
	e->reused = s->reused;
	node_attach_activate(e->at, s, dg);
	node_attach_retire(e->at, &e->store, old);
}

static void activate(struct env *e, uint64_t v)
{
	on_loop(e, activate_job, &v);
}

struct counts {
	uint64_t v;
	uint32_t pins, clients, retained;
};

static void count_job(struct env *e, void *arg)
{
	struct counts *c = arg;
	c->pins = node_attach_pins(e->at, c->v);
	c->clients = node_attach_clients(e->at);
	c->retained = node_attach_retained(e->at);
}

static struct counts counts(struct env *e, uint64_t v)
{
	struct counts c = {.v = v};
	on_loop(e, count_job, &c);
	return c;
}

/* ---- fixture -------------------------------------------------------------------- */

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	static const char *names[NT] = {"embed", "layers.0.wq", "norm"};
	static const enum proto_dtype dts[NT] = {PROTO_DT_BF16, PROTO_DT_FP32, PROTO_DT_FP16};
	static const uint64_t shapes[NT][2] = {{64, 32}, {32, 48}, {100, 1}};
	uint64_t off = 0;

	assert_non_null(e);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->sock, sizeof(e->sock), "%s/A-0.sock", e->dir);
	for (int i = 0; i < NT; i++) {
		struct proto_local *l = &e->locals[i];
		l->name = (char *)names[i];
		l->dtype = dts[i];
		l->ndim = 2;
		l->shape[0] = shapes[i][0];
		l->shape[1] = shapes[i][1];
		l->nelem = shapes[i][0] * shapes[i][1];
		l->nbytes = l->nelem * proto_dtype_size(dts[i]);
		l->offset = off;
		off += l->nbytes;
	}
	e->rank.nlocals = NT;
	e->rank.locals = e->locals;
	e->rank.nbytes = off;
	static const char *mnames[4] = {"embed", "layers.0.q", "layers.0.k", "norm"};
	static const uint64_t mshapes[4][2] = {{64, 32}, {16, 48}, {16, 48}, {200, 1}};
	for (int i = 0; i < 4; i++) {
		e->mt[i].name = (char *)mnames[i];
		e->mt[i].ndim = 2;
		e->mt[i].shape[0] = mshapes[i][0];
		e->mt[i].shape[1] = mshapes[i][1];
		struct proto_piece *pc = &e->pieces[i];
		pc->tensor = (uint32_t)i;
		pc->box.lo[0] = i == 3 ? 100 : 0;
		pc->box.hi[0] = mshapes[i][0];
		pc->box.hi[1] = mshapes[i][1];
		pc->base = i == 2 ? 16 * 48 : 0;
	}
	e->model.ntensors = 4;
	e->model.tensors = e->mt;
	e->locals[0].pieces = &e->pieces[0];
	e->locals[0].npieces = 1;
	e->locals[1].pieces = &e->pieces[1];
	e->locals[1].npieces = 2;
	e->locals[2].pieces = &e->pieces[3];
	e->locals[2].npieces = 1;
	memset(e->digest, 0x5a, sizeof(e->digest));
	assert_int_equal(node_store_open("host", &e->store, NULL), 0);
	e->base = event_base_new();
	assert_non_null(e->base);
	e->ai = (struct node_attach_info){
		.replica = "A", .rank = 0, .spec = &e->rank, .layout_digest = e->digest,
		.store = &e->store, .model = &e->model,
	};
	struct proto_err err;
	if (node_attach_new(e->base, e->sock, &e->ai, &e->at, &err) != 0)
		fail_msg("node_attach_new: %s", err.msg);
	assert_int_equal(pthread_create(&e->loop, NULL, loop_main, e), 0);
	*state = e;
	return 0;
}

static void free_job(struct env *e, void *arg)
{
	node_attach_free(e->at);
	e->at = NULL;
	node_slot_free(&e->store, e->active);
	e->active = NULL;
	node_store_close(&e->store); /* the spare, where a test kept one */
}

static void free_other_job(struct env *e, void *arg)
{
	node_attach_free(arg);
}

static int teardown(void **state)
{
	struct env *e = *state;

	on_loop(e, free_job, NULL);
	on_loop(e, stop_loop, NULL);
	pthread_join(e->loop, NULL);
	event_base_free(e->base);
	tu_rmtree(e->dir);
	free(e);
	return 0;
}

static tessera_client *attach_ok_at(const char *sock)
{
	tessera_client *c = NULL;
	char err[256];

	if (tessera_attach(sock, "A", 0, 30000, &c, err, sizeof(err)) != 0)
		fail_msg("attach: %s", err);
	return c;
}

static tessera_client *attach_ok(struct env *e)
{
	return attach_ok_at(e->sock);
}

static void assert_version_bytes(const struct tessera_pin *p, uint64_t v)
{
	assert_non_null(p->base);
	for (size_t i = 0; i < p->size; i++)
		if (p->base[i] != pattern(v, i))
			fail_msg("byte %zu of v%llu: %u, want %u", i, (unsigned long long)v,
				 p->base[i], pattern(v, i));
}

/* ---- tests ---------------------------------------------------------------------- */

static void test_table_and_bytes(void **state)
{
	struct env *e = *state;
	struct tessera_pin pin;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	/* The version active at attach is there when attach returns. */
	assert_int_equal(tessera_active(c), 1);
	assert_int_equal(tessera_ntensors(c), NT);
	assert_int_equal(tessera_block_size(c), e->rank.nbytes);
	assert_int_equal(tessera_store(c), 0);
	for (size_t i = 0; i < NT; i++) {
		const struct tessera_tensor *t = tessera_tensor(c, i);
		assert_string_equal(t->name, e->locals[i].name);
		assert_string_equal(t->dtype, proto_dtype_name(e->locals[i].dtype));
		assert_int_equal(t->ndim, 2);
		assert_int_equal(t->shape[0], e->locals[i].shape[0]);
		assert_int_equal(t->shape[1], e->locals[i].shape[1]);
		assert_int_equal(t->offset, e->locals[i].offset);
		assert_int_equal(t->nbytes, e->locals[i].nbytes);
	}
	assert_ptr_equal(tessera_find(c, "norm"), tessera_tensor(c, 2));
	assert_null(tessera_find(c, "nope"));
	assert_null(tessera_tensor(c, NT));

	const struct tessera_version *vi = tessera_version_info(c, 1);
	assert_non_null(vi);
	assert_int_equal(vi->size, e->rank.nbytes);
	assert_int_equal(vi->digest[0], 1);
	assert_int_equal(vi->cuda_device, -1);

	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 1);
	assert_int_equal(pin.size, e->rank.nbytes);
	assert_version_bytes(&pin, 1);
	assert_int_equal(counts(e, 1).pins, 1);
	assert_int_equal(tessera_release(c, &pin), 0);
	assert_int_equal(counts(e, 1).pins, 0);
	/* A pin released twice is refused by the client library itself. */
	assert_int_equal(tessera_release(c, &pin), -EINVAL);
	tessera_detach(c);
}

static void count_versions(tessera_client *c, uint64_t v, void *arg)
{
	(*(int *)arg)++;
}

static void test_wait_and_notify(void **state)
{
	struct env *e = *state;
	struct tessera_pin pin;
	int seen = 0;

	tessera_client *c = attach_ok(e);
	tessera_on_version(c, count_versions, &seen);
	assert_int_equal(tessera_active(c), 0);
	/* Nothing active: a clear refusal, and the client stays usable. */
	assert_int_equal(tessera_acquire(c, &pin), -EAGAIN);
	assert_non_null(strstr(tessera_error(c), "no version is active"));
	assert_int_equal(tessera_wait_version(c, 1, 50), -ETIMEDOUT);
	activate(e, 1);
	assert_int_equal(tessera_wait_version(c, 1, 30000), 0);
	assert_int_equal(seen, 1);
	activate(e, 2);
	/* The notification arrives without a request: poll sees it. */
	int got = 0;
	for (int i = 0; i < 300 && got == 0; i++)
		got = tessera_poll(c, 100);
	assert_int_equal(got, 1);
	assert_int_equal(tessera_active(c), 2);
	assert_int_equal(seen, 2);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 2);
	assert_version_bytes(&pin, 2);
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
}

static void test_pin_across_switch(void **state)
{
	struct env *e = *state;
	struct tessera_pin old, young;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	tessera_client *other = attach_ok(e);
	assert_int_equal(tessera_acquire(c, &old), 0);
	assert_int_equal(old.version, 1);

	/* The switch is immediate; the pinned slot stays alive for its request. */
	activate(e, 2);
	struct counts k = counts(e, 1);
	assert_int_equal(k.pins, 1);
	assert_int_equal(k.retained, 1);
	assert_version_bytes(&old, 1);

	/* New requests get the new version, on this client and another. */
	assert_int_equal(tessera_acquire(c, &young), 0);
	assert_int_equal(young.version, 2);
	/* Attribution: each pin names its version and when it was granted. */
	assert_true(old.acquired_ms > 0 && old.acquired_ms <= young.acquired_ms);
	assert_true(young.acquired_ms <= proto_wall_ms());
	assert_memory_equal(tessera_version_info(c, 1)->digest, (uint8_t[32]){[0 ... 31] = 1}, 32);
	assert_version_bytes(&young, 2);
	assert_version_bytes(&old, 1);
	struct tessera_pin op;
	assert_int_equal(tessera_acquire(other, &op), 0);
	assert_int_equal(op.version, 2);
	assert_int_equal(tessera_release(other, &op), 0);

	/* Another switch while both are pinned: both old slots stay. */
	activate(e, 3);
	assert_int_equal(counts(e, 0).retained, 2);
	assert_version_bytes(&old, 1);
	assert_version_bytes(&young, 2);

	/* The last pin of v1 released: its slot is freed (the release goes
	 * through the pin page; the node notices within TESSERA_ATTACH_SCAN_MS). */
	assert_int_equal(tessera_release(c, &old), 0);
	for (int i = 0; i < 3000 && ((k = counts(e, 1)).pins != 0 || k.retained != 1); i++)
		usleep(10000);
	assert_int_equal(k.pins, 0);
	assert_int_equal(k.retained, 1);
	assert_null(tessera_version_info(c, 1)); /* unmapped by the client too */
	assert_int_equal(tessera_release(c, &young), 0);
	for (int i = 0; i < 3000 && (k = counts(e, 2)).retained != 0; i++)
		usleep(10000);
	assert_int_equal(k.retained, 0);
	/* Told of v3 once it reads the socket (acquire and release did not). */
	assert_int_equal(tessera_wait_version(c, 3, 30000), 0);
	assert_int_equal(tessera_active(c), 3);
	tessera_detach(other);
	tessera_detach(c);
}

static void test_vanishing_client(void **state)
{
	struct env *e = *state;
	struct tessera_pin p1, p2;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	assert_int_equal(tessera_acquire(c, &p1), 0);
	assert_int_equal(tessera_acquire(c, &p2), 0);
	assert_int_equal(counts(e, 1).pins, 2);
	/* Activation does not wait for the pins. */
	activate(e, 2);
	tessera_client *fresh = attach_ok(e);
	assert_int_equal(tessera_active(fresh), 2);
	assert_int_equal(counts(e, 1).retained, 1);
	/* The client goes away without releasing: its pins go with it. */
	tessera_detach(c);
	struct counts k;
	for (int i = 0; i < 3000; i++) {
		k = counts(e, 1);
		if (k.retained == 0 && k.clients == 1)
			break;
		usleep(10000);
	}
	assert_int_equal(k.pins, 0);
	assert_int_equal(k.retained, 0);
	assert_int_equal(k.clients, 1);
	tessera_detach(fresh);
}

static void test_wrong_replica_or_rank(void **state)
{
	struct env *e = *state;
	tessera_client *c = NULL;
	char err[256];

	assert_int_equal(tessera_attach(e->sock, "B", 0, 30000, &c, err, sizeof(err)), -ECONNREFUSED);
	assert_null(c);
	assert_non_null(strstr(err, "serves replica A rank 0, not replica B rank 0"));
	assert_int_equal(tessera_attach(e->sock, "A", 7, 30000, &c, err, sizeof(err)), -ECONNREFUSED);
	assert_non_null(strstr(err, "not replica A rank 7"));
	assert_int_not_equal(tessera_attach(e->dir, "A", 0, 1000, &c, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "cannot connect"));
	assert_int_equal(counts(e, 0).clients, 0);
}

static int raw_connect(struct env *e)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	memcpy(sa.sun_path, e->sock, strlen(e->sock) + 1);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Reads until the node closes (bounded); returns the bytes read. */
static size_t read_until_closed(int fd, uint8_t *buf, size_t cap)
{
	size_t n = 0;

	for (;;) {
		struct pollfd p = {fd, POLLIN, 0};
		assert_int_equal(poll(&p, 1, 30000), 1);
		ssize_t r = read(fd, buf + n, cap - n);
		if (r <= 0)
			return n;
		n += (size_t)r;
		assert_true(n < cap);
	}
}

static size_t attach_req(uint8_t *b, const char *replica, uint32_t rank)
{
	size_t n = strlen(replica);
	tsr_put_hdr(b, (uint32_t)(8 + n + 4), TSR_MSG_ATTACH);
	tsr_put16(b + 8, TSR_WIRE_PROTOCOL);
	tsr_put16(b + 10, (uint16_t)n);
	tsr_put32(b + 12, rank);
	memcpy(b + 16, replica, n);
	tsr_put32(b + 16 + n, 0); /* flags */
	return 16 + n + 4;
}

static void test_garbage_refused(void **state)
{
	struct env *e = *state;
	struct {
		const char *what, *reason;
		uint8_t bytes[64];
		size_t len;
		bool attach_first;
	} cases[] = {
		{"http", "bad frame header", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27, false},
		{"huge frame", "bad frame header", {0xff, 0xff, 0xff, 0x7f, 1, 0, 0, 0}, 8, false},
		{"reserved bits", "bad frame header", {0, 0, 0, 0, 4, 0, 1, 0}, 8, false},
		{"acquire first", "before ATTACH", {0, 0, 0, 0, 4, 0, 0, 0}, 8, false},
		{"short attach", "too short", {2, 0, 0, 0, 1, 0, 0, 0, 1, 0}, 10, false},
		{"bad protocol", "protocol 9", {9, 0, 0, 0, 1, 0, 0, 0, 9, 0, 1, 0, 0, 0, 0, 0, 'A'}, 17, false},
		{"name overrun", "replica name", {9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 9, 0, 0, 0, 0, 0, 'A'}, 17, false},
		{"empty name", "replica name", {8, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 16, false},
		{"unknown type", "unknown message type 77", {0, 0, 0, 0, 77, 0, 0, 0}, 8, true},
		{"attach twice", "ATTACH twice", {9, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 'A'}, 17, true},
		{"acquire payload", "ACQUIRE carries nothing or a u64", {1, 0, 0, 0, 4, 0, 0, 0, 0}, 9, true},
		{"drop of nothing", "not held for this client", {8, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, 16, true},
		{"short drop", "DROP carries exactly", {4, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0}, 12, true},
		{"unknown flags", "unknown flags 0x6", {13, 0, 0, 0, 1, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 'A', 7, 0, 0, 0}, 21, false},
		{"protocol 3 without flags", "then u32 flags", {9, 0, 0, 0, 1, 0, 0, 0, 3, 0, 1, 0, 0, 0, 0, 0, 'A'}, 17, false},
		{"short release", "exactly a u64", {4, 0, 0, 0, 6, 0, 0, 0, 1, 0, 0, 0}, 12, true},
		{"foreign pin", "does not hold", {8, 0, 0, 0, 6, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0}, 16, true},
		{"unpin payload", "UNPIN carries no payload", {1, 0, 0, 0, 10, 0, 0, 0, 0}, 9, true},
	};
	static uint8_t buf[1 << 16];

	activate(e, 1);
	/* Held across the garbage: a pin of a well-behaved client survives. */
	tessera_client *good = attach_ok(e);
	struct tessera_pin pin;
	assert_int_equal(tessera_acquire(good, &pin), 0);

	for (size_t i = 0; i < PROTO_ARRAY_LEN(cases); i++) {
		int fd = raw_connect(e);
		uint8_t req[300];
		if (cases[i].attach_first) {
			size_t n = attach_req(req, "A", 0);
			assert_int_equal(write(fd, req, n), (ssize_t)n);
		}
		assert_int_equal(write(fd, cases[i].bytes, cases[i].len), (ssize_t)cases[i].len);
		size_t n = read_until_closed(fd, buf, sizeof(buf));
		close(fd);
		/* Skip ATTACHED/VERSION frames; the last frame is the fatal ERROR. */
		size_t off = 0, last = SIZE_MAX;
		while (off + TSR_WIRE_HDR <= n) {
			last = off;
			off += TSR_WIRE_HDR + tsr_get32(buf + off);
		}
		if (last == SIZE_MAX || off != n)
			fail_msg("%s: no whole reply (%zu bytes)", cases[i].what, n);
		uint8_t *f = buf + last;
		if (tsr_get16(f + 4) != TSR_MSG_ERROR || f[TSR_WIRE_HDR] != 1)
			fail_msg("%s: the last frame is not a fatal ERROR", cases[i].what);
		char reason[300];
		uint16_t rl = tsr_get16(f + TSR_WIRE_HDR + 1);
		assert_true(rl < sizeof(reason));
		memcpy(reason, f + TSR_WIRE_HDR + 3, rl);
		reason[rl] = 0;
		if (strstr(reason, cases[i].reason) == NULL)
			fail_msg("%s: reason '%s', want '%s'", cases[i].what, reason, cases[i].reason);
	}
	/* A client that pins, then misbehaves and keeps its end open without
	 * reading: the node closes its side and the pin goes with it. */
	int bad = raw_connect(e);
	uint8_t req[64];
	size_t rn = attach_req(req, "A", 0);
	tsr_put_hdr(req + rn, 0, TSR_MSG_ACQUIRE);
	assert_int_equal(write(bad, req, rn + 8), (ssize_t)(rn + 8));
	struct counts k;
	for (int i = 0; i < 3000; i++) {
		if ((k = counts(e, 1)).pins == 2)
			break;
		usleep(10000);
	}
	assert_int_equal(k.pins, 2);
	assert_int_equal(write(bad, "garbage!", 8), 8);
	for (int i = 0; i < 3000; i++) {
		if ((k = counts(e, 1)).pins == 1)
			break;
		usleep(10000);
	}
	assert_int_equal(k.pins, 1);
	close(bad);

	/* A client that half-sends a frame and vanishes. */
	int fd = raw_connect(e);
	uint8_t half[24];
	size_t n = attach_req(half, "A", 0);
	assert_int_equal(write(fd, half, n - 1), (ssize_t)(n - 1));
	close(fd);

	/* The node is unharmed: the good client's pin holds, new clients work. */
	assert_version_bytes(&pin, 1);
	for (int i = 0; i < 3000; i++) {
		k = counts(e, 1);
		if (k.clients == 1)
			break;
		usleep(10000);
	}
	assert_int_equal(k.clients, 1);
	assert_int_equal(k.pins, 1);
	tessera_client *c = attach_ok(e);
	struct tessera_pin p2;
	assert_int_equal(tessera_acquire(c, &p2), 0);
	assert_version_bytes(&p2, 1);
	assert_int_equal(tessera_release(c, &p2), 0);
	tessera_detach(c);
	assert_int_equal(tessera_release(good, &pin), 0);
	tessera_detach(good);
}

/* Reads from a raw client's socket until `want` whole frames are there
 * (bounded); the memfds that came with them in *fds, in order. Returns the
 * bytes of those frames. */
static size_t recv_frames(int fd, uint8_t *buf, size_t cap, int *fds, size_t *nfds, int want)
{
	size_t n = 0;

	*nfds = 0;
	for (;;) {
		size_t off = 0;
		int k = 0;
		while (off + TSR_WIRE_HDR <= n && off + TSR_WIRE_HDR + tsr_get32(buf + off) <= n) {
			off += TSR_WIRE_HDR + tsr_get32(buf + off);
			k++;
		}
		if (k >= want)
			return off;
		struct pollfd p = {fd, POLLIN, 0};
		assert_int_equal(poll(&p, 1, 30000), 1);
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(8 * sizeof(int))];
		} cm;
		struct iovec iov = {buf + n, cap - n};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				    .msg_controllen = sizeof(cm.b)};
		ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
		assert_true(r > 0);
		for (struct cmsghdr *h = CMSG_FIRSTHDR(&mh); h != NULL; h = CMSG_NXTHDR(&mh, h)) {
			size_t q = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			assert_true(*nfds + q <= 8);
			memcpy(fds + *nfds, CMSG_DATA(h), q * sizeof(int));
			*nfds += q;
		}
		n += (size_t)r;
	}
}

static uint64_t epoch_state(const uint8_t *epoch)
{
	return __atomic_load_n((const uint64_t *)(const void *)(epoch + TSR_EPOCH_STATE),
			       __ATOMIC_SEQ_CST);
}

/* Protocol 2 as a client sees it on the wire: the epoch page names the
 * active version (old, then new after a switch, each with its VERSION sent
 * first); a pin in the client's page keeps a retired version until it is
 * cleared, which the node notices by itself; the pages cannot be misused
 * (the epoch page is not writable, the pin page cannot shrink); a pin page
 * full of garbage pins nothing once its client is gone. */
static void test_epoch_page(void **state)
{
	struct env *e = *state;
	static uint8_t buf[1 << 16];
	int fds[8];
	size_t nfds, n;
	uint8_t req[64];

	activate(e, 1);
	int fd = raw_connect(e);
	n = attach_req(req, "A", 0);
	assert_int_equal(write(fd, req, n), (ssize_t)n);
	n = recv_frames(fd, buf, sizeof(buf), fds, &nfds, 4);
	assert_int_equal(nfds, 3);
	/* ATTACHED, PAGES (epoch), PAGES (pins), VERSION (v1, its entry). */
	size_t off = TSR_WIRE_HDR + tsr_get32(buf);
	assert_int_equal(tsr_get16(buf + 4), TSR_MSG_ATTACHED);
	for (uint8_t kind = 0; kind < 2; kind++) {
		assert_int_equal(tsr_get16(buf + off + 4), TSR_MSG_PAGES);
		assert_int_equal(buf[off + TSR_WIRE_HDR], kind);
		assert_int_equal(tsr_get32(buf + off + TSR_WIRE_HDR + 1), TSR_PAGE_SIZE);
		off += TSR_WIRE_HDR + 5;
	}
	assert_int_equal(tsr_get16(buf + off + 4), TSR_MSG_VERSION);
	assert_int_equal(tsr_get32(buf + off), TSR_WIRE_VERSION3_LEN);
	assert_int_equal(tsr_get64(buf + off + TSR_WIRE_HDR), 1);
	uint8_t e1 = buf[off + TSR_WIRE_HDR + TSR_WIRE_VERSION_LEN];
	assert_true(e1 < TSR_ENTRIES);
	assert_int_equal(buf[off + TSR_WIRE_HDR + TSR_WIRE_VERSION_LEN + 1], 0); /* not held */

	uint8_t *epoch = mmap(NULL, TSR_PAGE_SIZE, PROT_READ, MAP_SHARED, fds[0], 0);
	assert_true(epoch != MAP_FAILED);
	assert_true(mmap(NULL, TSR_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0) ==
		    MAP_FAILED);
	assert_int_not_equal(ftruncate(fds[1], 0), 0);
	uint8_t *page = mmap(NULL, TSR_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
	assert_true(page != MAP_FAILED);
	uint32_t *pins = (uint32_t *)(void *)page;
	assert_int_equal(tsr_get64(epoch), TSR_EPOCH_MAGIC);
	assert_int_equal(epoch_state(epoch), 1u << 8 | e1);

	/* A pin through the page counts, and keeps v1 past the switch. */
	__atomic_store_n(&pins[e1], 1, __ATOMIC_SEQ_CST);
	assert_int_equal(counts(e, 1).pins, 1);
	activate(e, 2);
	n = recv_frames(fd, buf, sizeof(buf), fds + 3, &nfds, 1);
	assert_int_equal(nfds, 1);
	assert_int_equal(tsr_get16(buf + 4), TSR_MSG_VERSION);
	assert_int_equal(tsr_get64(buf + TSR_WIRE_HDR), 2);
	uint8_t e2 = buf[TSR_WIRE_HDR + TSR_WIRE_VERSION_LEN];
	assert_true(e2 < TSR_ENTRIES && e2 != e1);
	assert_int_equal(epoch_state(epoch), 2u << 8 | e2);
	struct counts k = counts(e, 1);
	assert_int_equal(k.retained, 1);
	assert_int_equal(k.pins, 1);
	/* Released without a word to the node: it looks by itself. */
	__atomic_store_n(&pins[e1], 0, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 3000 && (k = counts(e, 1)).retained != 0; i++)
		usleep(10000);
	assert_int_equal(k.retained, 0);

	/* Garbage pins v2 for as long as its client stays, no longer. */
	__atomic_store_n(&pins[e2], 0xffffffffu, __ATOMIC_SEQ_CST);
	assert_int_equal(counts(e, 2).pins, 0xffffffffu);
	munmap(page, TSR_PAGE_SIZE);
	for (size_t i = 0; i < 4; i++)
		close(fds[i]);
	close(fd);
	for (int i = 0; i < 3000 && ((k = counts(e, 2)).pins != 0 || k.clients != 0); i++)
		usleep(10000);
	assert_int_equal(k.pins, 0);
	assert_int_equal(k.clients, 0);
	/* The switch still goes by the page for a library client. */
	tessera_client *c = attach_ok(e);
	struct tessera_pin pin;
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 2);
	assert_int_equal(counts(e, 2).pins, 1);
	activate(e, 3);
	assert_int_equal(epoch_state(epoch), 3u << 8 | (epoch_state(epoch) & 0xff));
	assert_version_bytes(&pin, 2);
	assert_int_equal(tessera_release(c, &pin), 0);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_int_equal(pin.version, 3);
	assert_version_bytes(&pin, 3);
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
	munmap(epoch, TSR_PAGE_SIZE);
}

/* Protocol 3: where each tensor comes from. */
static void test_pieces(void **state)
{
	struct env *e = *state;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	const struct tessera_tensor *wq = tessera_find(c, "layers.0.wq");
	assert_non_null(wq);
	assert_int_equal(wq->npieces, 2);
	assert_int_equal(wq->concat_dim, 0);
	assert_string_equal(wq->pieces[0].name, "layers.0.q");
	assert_string_equal(wq->pieces[1].name, "layers.0.k");
	assert_int_equal(wq->pieces[1].base, 16 * 48);
	assert_int_equal(wq->pieces[1].hi[0], 16);
	assert_int_equal(wq->pieces[1].shape[1], 48);
	const struct tessera_tensor *norm = tessera_find(c, "norm");
	assert_int_equal(norm->npieces, 1);
	assert_int_equal(norm->pieces[0].shape[0], 200);
	assert_int_equal(norm->pieces[0].lo[0], 100);
	assert_int_equal(norm->pieces[0].hi[0], 200);
	assert_false(norm->pieces[0].flat);
	assert_int_equal(tessera_holding(c), 0);
	assert_int_equal(tessera_in_place(c), 0);
	tessera_detach(c);
}

static size_t prepared(tessera_client *c, uint64_t *out)
{
	return tessera_prepared(c, out, 8);
}

/* Holds: every version sent is held until dropped, whatever the node
 * activates meanwhile; a worker pins exactly the version its engine chose. */
static void test_holds(void **state)
{
	struct env *e = *state;
	tessera_client *c = NULL, *plain = NULL;
	struct tessera_pin pin;
	uint64_t got[8];
	char err[256];

	activate(e, 1);
	if (tessera_attach_flags(e->sock, "A", 0, 30000, TESSERA_HOLD, &c, err, sizeof(err)) != 0)
		fail_msg("attach: %s", err);
	plain = attach_ok(e);
	assert_int_equal(tessera_holding(c), 1);
	activate(e, 2);
	activate(e, 3);
	assert_int_equal(tessera_wait_version(c, 3, 30000), 0);
	assert_int_equal(prepared(c, got), 3);
	assert_int_equal(got[0], 1);
	assert_int_equal(got[2], 3);
	/* v1 and v2 retired but held: their slots stay, their bytes too. */
	assert_int_equal(counts(e, 0).retained, 2);
	assert_int_equal(tessera_acquire_version(c, 1, &pin), 0);
	assert_int_equal(pin.version, 1);
	assert_version_bytes(&pin, 1);
	/* A plain client holds nothing: only the active version. */
	assert_int_equal(tessera_wait_version(plain, 3, 30000), 0);
	assert_int_equal(tessera_acquire_version(plain, 1, &(struct tessera_pin){0}), -ENOENT);
	assert_non_null(strstr(tessera_error(plain), "neither held nor active"));
	assert_int_equal(prepared(plain, got), 1);

	/* Dropped: v1 stays for its running pin only; v2 goes at once. */
	assert_int_equal(tessera_drop(c, 1), 0);
	assert_int_equal(tessera_drop(c, 2), 0);
	assert_int_equal(tessera_drop(c, 2), -EINVAL);
	assert_version_bytes(&pin, 1);
	assert_int_equal(tessera_release(c, &pin), 0);
	struct counts k;
	for (int i = 0; i < 3000 && (k = counts(e, 0)).retained != 0; i++)
		usleep(10000);
	assert_int_equal(k.retained, 0);
	assert_int_equal(tessera_acquire_version(c, 2, &pin), -ENOENT);
	/* The node's own answer, over the socket, for a version it forgot. */
	assert_int_equal(prepared(c, got), 1);

	/* Past TESSERA_ATTACH_HOLDS (4) the oldest hold goes, and we are told. */
	for (uint64_t v = 4; v <= 7; v++)
		activate(e, v);
	assert_int_equal(tessera_wait_version(c, 7, 30000), 0);
	assert_int_equal(prepared(c, got), 4);
	assert_int_equal(got[0], 4);
	assert_int_equal(got[3], 7);
	for (int i = 0; i < 3000 && (k = counts(e, 0)).retained != 3; i++)
		usleep(10000);
	assert_int_equal(k.retained, 3);
	assert_int_equal(tessera_acquire_version(c, 4, &pin), 0);
	assert_version_bytes(&pin, 4);
	assert_int_equal(tessera_release(c, &pin), 0);
	/* Closing drops every hold. */
	tessera_detach(c);
	for (int i = 0; i < 3000 && (k = counts(e, 0)).retained != 0; i++)
		usleep(10000);
	assert_int_equal(k.retained, 0);
	tessera_detach(plain);
}

/* An in-place node has one copy: it grants no holds. */
static void test_in_place_holds_nothing(void **state)
{
	struct env *e = *state;
	struct node_attach_info ai = e->ai;
	struct node_attach *at = NULL;
	tessera_client *c = NULL;
	char path[400], err[256];

	ai.in_place = true;
	snprintf(path, sizeof(path), "%s/inplace.sock", e->dir);
	assert_int_equal(node_attach_new(e->base, path, &ai, &at, NULL), 0);
	/* Nothing active: the attach needs no loop to answer ATTACHED... but
	 * the server lives on the loop thread: run it there. */
	struct node_attach *keep = e->at;
	e->at = at;
	if (tessera_attach_flags(path, "A", 0, 30000, TESSERA_HOLD, &c, err, sizeof(err)) != 0)
		fail_msg("attach: %s", err);
	assert_int_equal(tessera_holding(c), 0);
	assert_int_equal(tessera_in_place(c), 1);
	tessera_detach(c);
	e->at = keep;
	on_loop(e, free_other_job, at);
}

/* The guard: a pointer kept past release faults instead of reading on. */
static void test_guard(void **state)
{
	struct env *e = *state;
	struct tessera_pin pin;
	int status;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	tessera_guard(c, 1);
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_version_bytes(&pin, 1);
	const volatile uint8_t *kept = pin.base;
	assert_int_equal(tessera_release(c, &pin), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL);
		_exit(kept[0] == 0xee ? 3 : 4); /* must not get here */
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
	/* Pinned again, the same version reads again. */
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_version_bytes(&pin, 1);
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
}

static void queued_job(struct env *e, void *arg)
{
	*(size_t *)arg = node_attach_queued(e->at);
}

/*
 * A client that sends requests and never reads the replies holds none of
 * the node's memory: past 64 KiB of unread replies the node stops reading
 * it (the kernel's socket buffers fill, its sends block). Before, every
 * reply was queued (40 000 ACQUIRE/RELEASE pairs: 1.6 MB; the attack in
 * the issue: +1.38 GiB).
 */
static void test_unread_replies_bounded(void **state)
{
	struct env *e = *state;
	uint8_t req[64], pair[8 + 8 + 8];
	size_t queued = 0, sent = 0;
	int idle_ms = 0;

	activate(e, 1);
	int fd = raw_connect(e);
	size_t n = attach_req(req, "A", 0);
	assert_int_equal(write(fd, req, n), (ssize_t)n);
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	/* ACQUIRE (pin k), RELEASE k: until the node stops reading, 40 000 at most. */
	for (uint64_t k = 1; k <= 40000 && idle_ms < 2000;) {
		tsr_put_hdr(pair, 0, TSR_MSG_ACQUIRE);
		tsr_put_hdr(pair + 8, 8, TSR_MSG_RELEASE);
		tsr_put64(pair + 16, k);
		ssize_t w = send(fd, pair, sizeof(pair), MSG_NOSIGNAL);
		if (w == (ssize_t)sizeof(pair)) {
			k++;
			sent++;
			idle_ms = 0;
			continue;
		}
		assert_true(w < 0 && errno == EAGAIN); /* frames are small: all or nothing */
		struct pollfd p = {fd, POLLOUT, 0};
		if (poll(&p, 1, 100) == 0)
			idle_ms += 100;
	}
	on_loop(e, queued_job, &queued);
	print_message("sent %zu request pairs; the node holds %zu bytes of replies for them\n", sent,
		      queued);
	assert_true(queued <= (64u << 10) + 64);
	assert_true(sent < 40000); /* it stopped reading */
	/* Others are served meanwhile. */
	tessera_client *c = attach_ok(e);
	struct tessera_pin pin;
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_version_bytes(&pin, 1);
	assert_int_equal(tessera_release(c, &pin), 0);
	/* Read by its client, the rest goes through; closed, its pins go. */
	close(fd);
	struct counts k;
	for (int i = 0; i < 3000 && ((k = counts(e, 1)).clients != 1 || k.pins != 0); i++)
		usleep(10000);
	assert_int_equal(k.clients, 1);
	assert_int_equal(k.pins, 0);
	tessera_detach(c);
}

/*
 * A client that pins every version and never releases: at most
 * TESSERA_ATTACH_RETAINED (4) retired versions stay; the client is dropped
 * with the reason. Before, every version stayed (+31 MiB each in the issue).
 */
/* The reaper counts the slots it was handed until it has freed them: one
 * waiting out a grace stays counted (a minute: never reached here), is
 * freed at stop; with TESSERA_ATTACH_FREE_GRACE_MS=0 (no grace, taken
 * since 0 means none) the count drops to 0 once the worker has run. */
static void test_reaper_pending(void **state)
{
	struct node_store store;
	struct node_reaper *r;
	struct node_slot *s;

	assert_int_equal(node_store_open("host", &store, NULL), 0);
	assert_int_equal(node_reaper_pending(NULL), 0);
	setenv("TESSERA_ATTACH_FREE_GRACE_MS", "60000", 1);
	assert_int_equal(node_reaper_new(&store, &r), 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(node_slot_new(&store, 1 + (uint64_t)i, 4096, &s, NULL), 0);
		node_reaper_free(r, &store, s);
	}
	assert_int_equal(node_reaper_pending(r), 2);
	node_reaper_stop(r); /* frees both now (ASan finds them otherwise) */

	setenv("TESSERA_ATTACH_FREE_GRACE_MS", "0", 1);
	assert_int_equal(proto_param(PROTO_PARAM_ATTACH_FREE_GRACE_MS), 0);
	assert_int_equal(node_reaper_new(&store, &r), 0);
	assert_int_equal(node_slot_new(&store, 3, 4096, &s, NULL), 0);
	node_reaper_free(r, &store, s);
	for (int i = 0; i < 30000 && node_reaper_pending(r) > 0; i++)
		usleep(1000);
	assert_int_equal(node_reaper_pending(r), 0);
	node_reaper_stop(r);
	unsetenv("TESSERA_ATTACH_FREE_GRACE_MS");
}

static void test_retained_bounded(void **state)
{
	struct env *e = *state;
	struct tessera_pin pin;
	struct counts k;
	int rc = 0;

	activate(e, 1);
	tessera_client *c = attach_ok(e);
	for (uint64_t v = 1; v <= 8 && rc == 0; v++) {
		if (v > 1) {
			activate(e, v);
			assert_true(counts(e, 0).retained <= 4);
			if (tessera_wait_version(c, v, 30000) != 0)
				break;
		}
		rc = tessera_acquire(c, &pin);
	}
	k = counts(e, 0);
	print_message("retired versions kept: %u\n", k.retained);
	assert_true(k.retained <= 4);
	assert_true(rc != 0 || tessera_acquire(c, &pin) != 0);
	assert_non_null(strstr(tessera_error(c), "TESSERA_ATTACH_RETAINED"));
	tessera_detach(c);
	for (int i = 0; i < 3000 && (k = counts(e, 0)).retained != 0; i++)
		usleep(10000);
	assert_int_equal(k.retained, 0);
}

static void test_socket_path_checked(void **state)
{
	struct env *e = *state;
	struct node_attach_info ai = e->ai;
	struct node_attach *at = NULL;
	struct proto_err err;
	char path[400];

	/* Not a socket there: left alone, refused. */
	snprintf(path, sizeof(path), "%s/file", e->dir);
	assert_int_equal(tu_write(path, "x"), 0);
	assert_int_equal(node_attach_new(e->base, path, &ai, &at, &err), -EEXIST);
	assert_null(at);
	assert_non_null(strstr(err.msg, "not a socket"));
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	/* Longer than a Unix socket name can be. */
	memset(path, 'x', sizeof(path) - 1);
	path[sizeof(path) - 1] = 0;
	assert_int_equal(node_attach_new(e->base, path, &ai, &at, &err), -ENAMETOOLONG);
	assert_null(at);
}

/* GPU mode: clients get the CUDA IPC handle of the device copy with each
 * version (skips without a visible GPU). */
struct cuda_job {
	struct node_store store;
	struct node_attach *at;
	struct node_slot *slot;
	char sock[400];
	int rc;
};

static void cuda_up(struct env *e, void *arg)
{
	struct cuda_job *j = arg;
	struct node_attach_info ai = e->ai;
	ai.store = &j->store;
	uint8_t dg[32] = {0};

	j->rc = node_attach_new(e->base, j->sock, &ai, &j->at, NULL);
	if (j->rc == 0)
		j->rc = node_slot_new(&j->store, 1, e->rank.nbytes, &j->slot, NULL);
	if (j->rc == 0) {
		for (size_t i = 0; i < j->slot->len; i++)
			j->slot->host[i] = pattern(1, i);
		j->rc = node_slot_activate(&j->store, j->slot, NULL);
	}
	if (j->rc == 0)
		node_attach_activate(j->at, j->slot, dg);
}

static void cuda_down(struct env *e, void *arg)
{
	struct cuda_job *j = arg;
	node_attach_free(j->at);
	node_slot_free(&j->store, j->slot);
}

static void test_cuda_handle(void **state)
{
	struct env *e = *state;
	struct cuda_job j = {0};
	struct proto_err err;

	if (node_store_open("cuda", &j.store, &err) != 0) {
		print_message("skipped: %s\n", err.msg);
		skip();
	}
	snprintf(j.sock, sizeof(j.sock), "%s/gpu.sock", e->dir);
	on_loop(e, cuda_up, &j);
	assert_int_equal(j.rc, 0);
	tessera_client *c = attach_ok_at(j.sock);
	assert_int_equal(tessera_store(c), 1);
	const struct tessera_version *vi = tessera_version_info(c, 1);
	assert_non_null(vi);
	assert_int_equal(vi->store, 1);
	assert_int_equal(vi->cuda_device, j.store.device);
#ifdef TESSERA_CUDA
	uint8_t h[64];
	char why[256];
	assert_int_equal(node_cuda_ipc_handle(j.slot->dev, h, why, sizeof(why)), 0);
	assert_memory_equal(vi->cuda_ipc_handle, h, 64);
#endif
	/* The host copy is what the device copy was made from. */
	struct tessera_pin pin;
	assert_int_equal(tessera_acquire(c, &pin), 0);
	assert_version_bytes(&pin, 1);
	assert_int_equal(tessera_release(c, &pin), 0);
	tessera_detach(c);
	on_loop(e, cuda_down, &j);
}

/* The client library's side: a fake node answering ATTACH with bad bytes. */
struct fake_node {
	int lfd;
	const uint8_t *reply;
	size_t len;
};

static void *fake_node_main(void *arg)
{
	struct fake_node *f = arg;
	uint8_t req[512];
	int fd = accept(f->lfd, NULL, NULL);

	if (fd < 0)
		return NULL;
	(void)!read(fd, req, sizeof(req));
	(void)!write(fd, f->reply, f->len);
	close(fd);
	return NULL;
}

static void test_client_refuses_bad_node(void **state)
{
	struct env *e = *state;
	static uint8_t huge[] = {0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0};
	/* ATTACHED (protocol 3's 55-byte head: active, count, block, digest,
	 * store, install, holding): a billion tensors and nothing after. */
	static uint8_t many[8 + 55] = {55, 0, 0, 0, 2, 0, 0, 0, [16] = 0x00, 0xca, 0x9a, 0x3b};
	/* ATTACHED: one tensor "w" at offset 8 of 8 bytes in a 4-byte block
	 * (no pieces). */
	static uint8_t past[8 + 55 + 28] = {
		83, 0, 0, 0, 2, 0, 0, 0, [16] = 1, [20] = 4,
		[63] = 1, 0, 'w', 4, 'f', 'p', '3', '2', 0, 8, [80] = 8};
	/* ATTACHED: "w" said to have two pieces, and no bytes of them. */
	static uint8_t pieces[8 + 55 + 28] = {
		83, 0, 0, 0, 2, 0, 0, 0, [16] = 1, [20] = 4,
		[63] = 1, 0, 'w', 4, 'f', 'p', '3', '2', 0, 0, [80] = 4, [89] = 2};
	/* ATTACHED: a holding node that installs in place. */
	static uint8_t holdinplace[8 + 55] = {55, 0, 0, 0, 2, 0, 0, 0, [61] = 1, 1};
	/* ATTACHED (no tensors, v1 active) then a VERSION without its memfd. */
	static uint8_t nofd[8 + 55 + 8 + TSR_WIRE_VERSION3_LEN] = {
		55, 0, 0, 0, 2, 0, 0, 0, 1, [63] = TSR_WIRE_VERSION3_LEN, 0, 0, 0, 3, 0, 0, 0, 1};
	/* ATTACHED (v1 active) then DROPPED of a version never held. */
	static uint8_t nodrop[8 + 55 + 8 + 8] = {
		55, 0, 0, 0, 2, 0, 0, 0, 1, [63] = 8, 0, 0, 0, 12, 0, 0, 0, 1};
	static uint8_t wrong[] = {16, 0, 0, 0, 5, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
				  1, 0, 0, 0, 0, 0, 0, 0};
	static uint8_t badmsg[] = {3, 0, 0, 0, 8, 0, 0, 0, 1, 9, 0};
	/* ATTACHED (v1 active) then PAGES without its memfd, or of a wrong size. */
	static uint8_t nopage[8 + 55 + 8 + 5] = {
		55, 0, 0, 0, 2, 0, 0, 0, 1, [63] = 5, 0, 0, 0, 9, 0, 0, 0, 0, 0, 16, 0, 0};
	static uint8_t badpage[8 + 55 + 8 + 5] = {
		55, 0, 0, 0, 2, 0, 0, 0, 1, [63] = 5, 0, 0, 0, 9, 0, 0, 0, 0, 1, 0, 0, 0};
	struct {
		const char *what, *reason;
		const uint8_t *bytes;
		size_t len;
	} cases[] = {
		{"closed at once", "closed the connection", NULL, 0},
		{"huge frame", "malformed frame header", huge, sizeof(huge)},
		{"billion tensors", "malformed tensor table", many, sizeof(many)},
		{"tensor past the block", "malformed tensor table", past, sizeof(past)},
		{"pieces missing", "malformed tensor pieces", pieces, sizeof(pieces)},
		{"holding in place", "malformed tensor table", holdinplace, sizeof(holdinplace)},
		{"dropped never held", "DROPPED names a version not held", nodrop, sizeof(nodrop)},
		{"version without memfd", "without its memfd", nofd, sizeof(nofd)},
		{"unexpected reply", "unexpected message", wrong, sizeof(wrong)},
		{"truncated error", "malformed ERROR", badmsg, sizeof(badmsg)},
		{"pages without memfd", "PAGES message without its memfd", nopage, sizeof(nopage)},
		{"page of a wrong size", "malformed PAGES", badpage, sizeof(badpage)},
	};
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/fake.sock", e->dir);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(cases); i++) {
		struct fake_node f = {socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), cases[i].bytes,
				      cases[i].len};
		pthread_t t;
		tessera_client *c = NULL;
		char err[256] = "";

		unlink(sa.sun_path);
		assert_int_equal(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		assert_int_equal(listen(f.lfd, 1), 0);
		assert_int_equal(pthread_create(&t, NULL, fake_node_main, &f), 0);
		int rc = tessera_attach(sa.sun_path, "A", 0, 30000, &c, err, sizeof(err));
		pthread_join(t, NULL);
		close(f.lfd);
		assert_null(c);
		if (rc >= 0 || strstr(err, cases[i].reason) == NULL)
			fail_msg("%s: rc %d, '%s', want '%s'", cases[i].what, rc, err, cases[i].reason);
	}
	/* The control: the same table with "w" inside its block is accepted. */
	past[72] = 0;
	past[80] = 4;
	struct fake_node f = {socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), past, sizeof(past)};
	pthread_t t;
	tessera_client *c = NULL;
	char err[256] = "";
	unlink(sa.sun_path);
	assert_int_equal(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f.lfd, 1), 0);
	assert_int_equal(pthread_create(&t, NULL, fake_node_main, &f), 0);
	if (tessera_attach(sa.sun_path, "A", 0, 30000, &c, err, sizeof(err)) != 0)
		fail_msg("control: %s", err);
	pthread_join(t, NULL);
	close(f.lfd);
	assert_int_equal(tessera_ntensors(c), 1);
	assert_string_equal(tessera_tensor(c, 0)->name, "w");
	assert_string_equal(tessera_tensor(c, 0)->dtype, "fp32");
	assert_int_equal(tessera_tensor(c, 0)->nbytes, 4);
	tessera_detach(c);
}

/* ---- the Python package ------------------------------------------------------------ */

/* Reads one line from fd into buf (bounded wait). */
static void read_line(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		struct pollfd p = {fd, POLLIN, 0};
		if (poll(&p, 1, 60000) != 1)
			fail_msg("no line from the python client within 60 s");
		char ch;
		if (read(fd, &ch, 1) != 1)
			break;
		if (ch == '\n')
			break;
		buf[n++] = ch;
	}
	buf[n] = 0;
}

/* Starts tests/py/<name> with args (NULL-terminated) and numpy or not;
 * *to is its stdin, *from its stdout. Skips where python is missing. */
static pid_t py_start(const char *name, bool numpy, const char *const *args, int *to, int *from)
{
	const char *py = tu_python();
	char script[512], rel[128];
	const char *argv[16] = {py, script};
	int in[2], out[2];

	if (py == NULL) {
		print_message("skipped: needs TESSERA_PYTHON, the python where pip installed "
			      "tessera (make test makes it)\n");
		skip();
	}
	if (numpy && tu_sh("%s -c 'import numpy' 2>/dev/null", py) != 0) {
		print_message("skipped: numpy is not installed for %s\n", py);
		skip();
	}
	snprintf(rel, sizeof(rel), "tests/py/%s", name);
	tu_src(script, sizeof(script), rel);
	for (size_t i = 0; args[i] != NULL && i + 3 < PROTO_ARRAY_LEN(argv); i++)
		argv[2 + i] = args[i];
	assert_int_equal(pipe(in), 0);
	assert_int_equal(pipe(out), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		if (!numpy)
			setenv("TESSERA_NO_NUMPY", "1", 1);
		/* The library is a plain build: keep ASan's runtime out of python. */
		unsetenv("LD_PRELOAD");
		execv(py, (char *const *)argv);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	*to = in[1];
	*from = out[0];
	return pid;
}

/* Reads the script's next line; fails the test (killing it) unless it is want. */
static void py_expect(pid_t pid, int from, const char *want)
{
	char line[256];

	read_line(from, line, sizeof(line));
	if (strcmp(line, want) != 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		fail_msg("python said '%s', want '%s'", line, want);
	}
}

static void run_python(struct env *e, bool numpy)
{
	char table[1024], line[256];
	int to, from, status;
	size_t off = 0;
	off += (size_t)snprintf(table + off, sizeof(table) - off, "[");
	for (int i = 0; i < NT; i++) {
		const struct proto_local *l = &e->locals[i];
		off += (size_t)snprintf(table + off, sizeof(table) - off,
					"%s[\"%s\",\"%s\",[%llu,%llu],%llu]", i ? "," : "", l->name,
					proto_dtype_name(l->dtype), (unsigned long long)l->shape[0],
					(unsigned long long)l->shape[1],
					(unsigned long long)l->offset);
	}
	snprintf(table + off, sizeof(table) - off, "]");

	activate(e, 1);
	pid_t pid = py_start("attach_client.py", numpy,
			     (const char *[]){e->sock, "A", "0", table, NULL}, &to, &from);
	py_expect(pid, from, "pinned 1");
	assert_int_equal(counts(e, 1).pins, 1);
	activate(e, 2);
	assert_int_equal(write(to, "go\n", 3), 3);
	read_line(from, line, sizeof(line));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	close(to);
	close(from);
	if (strcmp(line, numpy ? "ok numpy" : "ok memoryview") != 0)
		fail_msg("python client said '%s' (exit status %d)", line, status);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	/* Its pins were released; its old version is gone. */
	struct counts k = counts(e, 1);
	assert_int_equal(k.pins, 0);
	assert_int_equal(k.retained, 0);
}

static void test_python_numpy(void **state)
{
	run_python(*state, true);
}

static void test_python_memoryview(void **state)
{
	run_python(*state, false);
}

static void spare_job(struct env *e, void *arg)
{
	pthread_mutex_lock(&e->store.mu);
	*(bool *)arg = e->store.spare != NULL;
	pthread_mutex_unlock(&e->store.mu);
}

static void keep_spare_job(struct env *e, void *arg)
{
	node_store_keep_spare(&e->store);
}

/* An in-place install of version *arg over the active slot, as
 * node/agent/inplace.c does it: pause, drain, write, resume. */
static void drained(void *arg)
{
	struct env *e = arg;
	uint64_t v = e->active->version + 1;
	uint8_t dg[32];

	for (size_t i = 0; i < e->active->len; i++)
		e->active->host[i] = pattern(v, i);
	e->active->version = v;
	memset(dg, (int)v, sizeof(dg));
	node_attach_resume(e->at, e->active, dg);
}

static void in_place_job(struct env *e, void *arg)
{
	assert_int_equal(node_attach_pause(e->at, e->active->version + 1, drained, e), 0);
}

/* A numpy view kept past its pin faults rather than read the version the
 * node writes into that memory next (tests/py/attach_views.py). */
static void run_kept_views(struct env *e, const char *mode)
{
	int to, from, status;
	char line[256];
	bool spare = false;

	on_loop(e, keep_spare_job, NULL);
	activate(e, 1);
	pid_t pid = py_start("attach_views.py", true, (const char *[]){e->sock, mode, NULL}, &to,
			     &from);
	py_expect(pid, from, "kept 1");
	assert_int_equal(counts(e, 1).pins, 0);
	if (strcmp(mode, "rotation") == 0) {
		/* v2 in a fresh slot; v1's slot, once freed, is the spare that v3 takes. */
		activate(e, 2);
		for (int i = 0; i < 3000 && !spare; i++) {
			usleep(10000);
			on_loop(e, spare_job, &spare);
		}
		assert_true(spare);
		activate(e, 3);
		assert_true(e->reused);
	} else {
		on_loop(e, in_place_job, NULL);
	}
	assert_int_equal(write(to, "go\n", 3), 3);
	read_line(from, line, sizeof(line));
	assert_int_equal(waitpid(pid, &status, 0), pid);
	close(to);
	close(from);
	if (strcmp(line, "ok") != 0)
		fail_msg("python said '%s' (exit status %d)", line, status);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_python_kept_view_rotation(void **state)
{
	run_kept_views(*state, "rotation");
}

static void test_python_kept_view_in_place(void **state)
{
	run_kept_views(*state, "in-place");
}

/* ---- the real programs ------------------------------------------------------------ */

struct cl {
	char dir[256], url[256], ctl[512], sock[512], expose[512], model[512], key[512], pub[512];
	struct node_proc tracker, node, publisher;
	struct proto_model m;
	struct proto_layout tp1;
	tessera_client *c;
};

static void cl_export(struct cl *e, uint64_t v)
{
	tu_control_export(e->ctl, v);
}

static void assert_rank_bytes(struct cl *e, const struct tessera_pin *p, uint64_t v)
{
	size_t n = e->tp1.ranks[0].nbytes;
	uint8_t *expect = malloc(n);

	assert_non_null(expect);
	assert_int_equal(p->version, v);
	assert_int_equal(p->size, n);
	proto_fixture_fill_rank(&e->m, &e->tp1, 0, 7, v, expect);
	assert_memory_equal(p->base, expect, n);
	free(expect);
}

/* Waits (bounded) until the node's log holds text. */
static bool log_has(struct cl *e, const char *text)
{
	for (int i = 0; i < 600; i++) {
		if (tu_sh("grep -qF '%s' '%s'", text, e->node.log) == 0)
			return true;
		usleep(50000);
	}
	return false;
}

/*
 * Tracker, a tp1 node with --attach and a publisher on loopback: a client
 * of the node binary reads the table and v1's exact bytes, a request pinned
 * on v1 keeps it across the switch to v2 (the node logs that it keeps the
 * slot, then frees it at release), new requests get v2; the activation
 * record names the socket.
 */
static void test_real_node(void **state)
{
	struct cl *e = calloc(1, sizeof(*e));
	char bin[512], log[600], state_dir[600], buf[512];
	struct proto_err err;
	tessera_client *c = NULL;

	assert_non_null(e);
	*state = e;
	setenv("TESSERA_CHUNK_SIZE", "65536", 1);
	assert_non_null(tu_mkdtemp(e->dir, sizeof(e->dir)));
	snprintf(e->ctl, sizeof(e->ctl), "%s/ctl.sock", e->dir);
	snprintf(e->sock, sizeof(e->sock), "%s/A-0.sock", e->dir);
	snprintf(e->expose, sizeof(e->expose), "%s/expose", e->dir);
	snprintf(e->model, sizeof(e->model), "%s/model.json", e->dir);
	snprintf(state_dir, sizeof(state_dir), "%s/state", e->dir);
	tu_trainer_keys(e->key, sizeof(e->key), e->pub, sizeof(e->pub));
	assert_int_equal(proto_fixture_model(8 << 20, &e->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "tp1", &e->tp1, &err), 0);
	tu_write_model(&e->m, e->model);

	tu_start_tracker(&e->tracker, e->dir, state_dir, e->pub, e->url, sizeof(e->url));

	/* The node announces each version 300 ms before it admits requests to
	 * it: an acquire right after the wait must still get that version. */
	setenv("TESSERA_TEST_ADMIT_LAG_MS", "300", 1);
	tu_start_node(&e->node, e->dir, e->url, "A", "0", "tp1", e->model, e->pub, e->expose, e->sock,
		      "node");
	unsetenv("TESSERA_TEST_ADMIT_LAG_MS");
	tu_bin(bin, sizeof(bin), "tessera");
	snprintf(log, sizeof(log), "%s/publisher.log", e->dir);
	char *pargv[] = {bin, "publish", "--tracker", e->url, "--key", e->key, "--synthetic-mb", "8",
			 "--seed", "7", "--layout", "fsdp2", "--control", e->ctl, NULL};
	assert_int_equal(node_proc_spawn(&e->publisher, "publisher", pargv, log), 0);

	/* The node listens from its start, before any version. */
	char cerr[256] = "";
	for (int i = 0; i < 600 && c == NULL; i++)
		if (tessera_attach(e->sock, "A", 0, 30000, &c, cerr, sizeof(cerr)) != 0)
			usleep(50000);
	e->c = c;
	if (c == NULL)
		fail_msg("attach to the node: %s", cerr);
	const struct proto_rank *rk = &e->tp1.ranks[0];
	assert_int_equal(tessera_ntensors(c), rk->nlocals);
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct tessera_tensor *t = tessera_tensor(c, i);
		assert_string_equal(t->name, rk->locals[i].name);
		assert_int_equal(t->offset, rk->locals[i].offset);
		assert_int_equal(t->nbytes, rk->locals[i].nbytes);
	}

	cl_export(e, 1);
	assert_int_equal(tessera_wait_version(c, 1, 60000), 0);
	struct tessera_pin old, young;
	assert_int_equal(tessera_acquire(c, &old), 0);
	assert_rank_bytes(e, &old, 1);

	cl_export(e, 2);
	assert_int_equal(tessera_wait_version(c, 2, 60000), 0);
	assert_int_equal(tessera_acquire(c, &young), 0); /* announced: never older */
	assert_rank_bytes(e, &young, 2);
	assert_true(log_has(e, "attach: v1 retired; 1 requests still pin it"));
	assert_rank_bytes(e, &old, 1);
	assert_int_equal(tessera_release(c, &old), 0);
	assert_true(log_has(e, "attach: v1 released by its last request; freeing its slot"));
	assert_int_equal(tessera_release(c, &young), 0);

	/* The activation record names the socket. */
	uint8_t *rec;
	size_t len;
	snprintf(buf, sizeof(buf), "%s/A-0.json", e->expose);
	assert_int_equal(proto_read_file(buf, 1 << 20, &rec, &len, &err), 0);
	json_t *j = json_loadb((char *)rec, len, 0, NULL);
	free(rec);
	assert_string_equal(json_string_value(json_object_get(j, "attach")), e->sock);
	assert_int_equal(json_integer_value(json_object_get(j, "version")), 2);
	json_decref(j);
	tessera_detach(c);
	e->c = NULL;
	assert_true(node_proc_alive(&e->node));
}

static int cl_teardown(void **state)
{
	struct cl *e = *state;

	if (e == NULL)
		return 0;
	tessera_detach(e->c);
	node_proc_stop(&e->publisher, 5000);
	node_proc_stop(&e->node, 5000);
	node_proc_stop(&e->tracker, 5000);
	proto_layout_fini(&e->tp1);
	proto_model_fini(&e->m);
	if (getenv("TESSERA_TEST_KEEP") != NULL)
		print_message("kept %s\n", e->dir);
	else if (e->dir[0] != 0)
		tu_rmtree(e->dir);
	unsetenv("TESSERA_CHUNK_SIZE");
	free(e);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_table_and_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wait_and_notify, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pin_across_switch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_vanishing_client, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrong_replica_or_rank, setup, teardown),
		cmocka_unit_test_setup_teardown(test_garbage_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_epoch_page, setup, teardown),
		cmocka_unit_test_setup_teardown(test_socket_path_checked, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pieces, setup, teardown),
		cmocka_unit_test_setup_teardown(test_holds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_in_place_holds_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_guard, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unread_replies_bounded, setup, teardown),
		cmocka_unit_test(test_reaper_pending),
		cmocka_unit_test_setup_teardown(test_retained_bounded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cuda_handle, setup, teardown),
		cmocka_unit_test_setup_teardown(test_client_refuses_bad_node, setup, teardown),
		cmocka_unit_test_setup_teardown(test_python_numpy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_python_memoryview, setup, teardown),
		cmocka_unit_test_setup_teardown(test_python_kept_view_rotation, setup, teardown),
		cmocka_unit_test_setup_teardown(test_python_kept_view_in_place, setup, teardown),
		cmocka_unit_test_teardown(test_real_node, cl_teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	evthread_use_pthreads();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
