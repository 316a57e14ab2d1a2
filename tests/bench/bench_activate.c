/*
 * bench_activate: the pause a serving process sees when its node activates a
 * new version (double-buffered install), against a memcpy of the model
 * measured in the same run.
 *
 * A node's attach server (node/serve/attach.c) runs on its own loop thread, as in
 * tessera-node; a serving probe (libtessera-client) acquires, reads and
 * releases the active version in a tight loop. The main thread builds each
 * next version in a fresh slot while the old one serves (as the agent
 * does), then asks the loop to switch (activate the new slot, retire the
 * old one). For each switch the pause is the gap between the probe's last
 * acquire before the switch reached it and its first acquire of the new
 * version, less the request's own time: what the release of the last
 * request on the old version and the acquire of the first on the new one
 * took (each request holds its pin about REQUEST_US, asleep): everything the switch costs the serving side (the flip, the
 * notification, mapping the new memory). The switch also reports how long
 * until the probe first runs on the new version.
 *
 * Then the in-place install (tessera-node --install in-place) of a 1 %
 * delta of an INPLACE_MIB model (default 1024), as node/agent/inplace.c does
 * it: while the old version serves, the parent's checksums are read and the
 * delta decoded and verified (proto_dpatch_prepare); then on the loop
 * admission is paused, the pins drained (the probe's request in flight
 * ends), the prepared changes written into the served memory
 * (proto_dpatch_write, TESSERA_INPLACE_THREADS threads), admission resumed.
 * Its pause is the probe's gap around the install, against a memcpy of that
 * model in the same run; installs alternate between two deltas (forward,
 * back). The pause is broken down (drain, write, resume; page faults) and
 * the write is set against its store floor, measured beside each install
 * with the same threads: the cache lines it touches, each read and written
 * back whole, at the rate a dense read-and-write sweep of the model runs.
 *
 * usage: bench_activate [MODEL_MIB (default 128)] [SWITCHES (default 100)]
 *                       [INPLACE_MIB (default 1024; 0: skip)]
 * Goals (issue 11): p99 pause <= 1 ms double-buffered; in place, <= 50 ms
 * for a 1 % delta of 1 GiB. Not a test: it prints figures.
 */
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "node/serve/attach.h"
#include "node/client/tessera_client.h"
#include "proto/delta.h"
#include "proto/dpatch.h"
#include "proto/proto.h"

#define PROBE_MAX (1u << 22) /* acquires recorded */
#define REQUEST_US 20        /* how long the probe's request holds its pin */

struct bench {
	struct event_base *base;
	struct node_store store;
	struct proto_local local;
	struct proto_rank rank;
	uint8_t digest[32];
	struct node_attach *at;
	struct node_slot *active;
	char sock[128];

	/* The probe's record: completion time and version of each acquire. */
	uint64_t *t_ns, *cost_ns, *ver;
	atomic_size_t n;
	atomic_bool stop;
	tessera_client *c;
};

struct job {
	struct bench *b;
	struct node_slot *slot;
	uint64_t switched_ns;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
};

static void switch_job(evutil_socket_t fd, short what, void *arg)
{
	struct job *j = arg;
	struct bench *b = j->b;
	struct node_slot *old = b->active;

	j->switched_ns = proto_now_ns();
	b->active = j->slot;
	node_attach_activate(b->at, j->slot, b->digest);
	node_attach_retire(b->at, &b->store, old);
	pthread_mutex_lock(&j->mu);
	j->done = 1;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

/* Switches to slot on the loop thread; returns when it did, and when. */
static uint64_t switch_to(struct bench *b, struct node_slot *slot)
{
	struct job j = {b, slot, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
	struct timeval now = {0, 0};

	if (event_base_once(b->base, -1, EV_TIMEOUT, switch_job, &j, &now) != 0) {
		fprintf(stderr, "bench_activate: event_base_once failed\n");
		exit(1);
	}
	pthread_mutex_lock(&j.mu);
	while (!j.done)
		pthread_cond_wait(&j.cv, &j.mu);
	pthread_mutex_unlock(&j.mu);
	return j.switched_ns;
}

static void *loop_main(void *arg)
{
	struct bench *b = arg;
	event_base_loop(b->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

/*
 * The serving probe: one request after another, each reading its version
 * and holding its pin for about REQUEST_US (asleep: a request's compute).
 * What serving waits for is recorded per request: the release of the
 * previous request plus this acquire (cost_ns), and when it got its pin.
 */
static void *probe_main(void *arg)
{
	struct bench *b = arg;
	volatile uint8_t sink = 0;
	struct tessera_pin pin, prev;
	bool held = false;

	while (!atomic_load(&b->stop)) {
		uint64_t t0 = proto_now_ns();
		if (held && tessera_release(b->c, &prev) != 0) {
			fprintf(stderr, "bench_activate: release: %s\n", tessera_error(b->c));
			exit(1);
		}
		if (tessera_acquire(b->c, &pin) != 0) {
			fprintf(stderr, "bench_activate: acquire: %s\n", tessera_error(b->c));
			exit(1);
		}
		uint64_t t1 = proto_now_ns();
		sink ^= pin.base[0] ^ pin.base[pin.size - 1]; /* the request reads */
		size_t i = atomic_load(&b->n);
		if (i < PROBE_MAX) {
			b->t_ns[i] = t1;
			b->cost_ns[i] = t1 - t0;
			b->ver[i] = pin.version;
			atomic_store(&b->n, i + 1);
		}
		prev = pin;
		held = true;
		usleep(REQUEST_US);
	}
	if (held)
		(void)tessera_release(b->c, &prev);
	(void)sink;
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct_us(const uint64_t *sorted, size_t n, double p)
{
	size_t i = (size_t)(p * (double)(n - 1) + 0.5);
	return (double)sorted[i] / 1000.0;
}

static struct node_slot *build(struct bench *b, uint64_t v)
{
	struct node_slot *s;
	struct proto_err err;

	if (node_slot_new(&b->store, v, b->rank.nbytes, &s, &err) != 0) {
		fprintf(stderr, "bench_activate: slot: %s\n", err.msg);
		exit(1);
	}
	memset(s->host, (int)(v & 0xff), s->len); /* the new version, built aside */
	return s;
}

/* ---- in place -------------------------------------------------------------------- */

struct ip_job {
	struct bench *b;
	const struct proto_dpatch *patch; /* prepared before the pause */
	struct proto_dpatch_pool *pool;   /* that writes it */
	uint64_t version;
	uint64_t t_pause, t_drained, t_written, t_resume;
	long flt0, flt; /* page faults (minor and major) from pause to resume */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
};

/* Page faults of the process so far. */
static long faults(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_minflt + ru.ru_majflt;
}

/*
 * The store floor: what the write costs at least on this machine. Memory
 * moves in cache lines; a line the patch changes is read (for ownership)
 * and written back whole, whatever number of its bytes change. So the write
 * moves at least 2 x 64 bytes per line touched. Its rate is measured with
 * the same number of threads on a buffer as large as the model: each reads
 * and writes one byte of every line of its share (dense: the best case of
 * the same traffic).
 */
struct sweep {
	uint8_t *buf;
	size_t len;
	unsigned n, t;
};

static void *sweep_main(void *arg)
{
	struct sweep *w = arg;
	size_t lo = w->len / w->n * w->t / 64 * 64, hi = w->len / w->n * (w->t + 1);
	volatile uint8_t *p = w->buf;

	for (size_t i = lo; i < hi; i += 64)
		p[i] = (uint8_t)(p[i] + 1);
	return NULL;
}

/* ns to read and write every line of buf on n threads. */
static uint64_t sweep_ns(uint8_t *buf, size_t len, unsigned n)
{
	pthread_t th[16];
	struct sweep w[16];
	uint64_t t0 = proto_now_ns();

	n = PROTO_MIN(n, 16u);
	for (unsigned i = 0; i < n; i++)
		w[i] = (struct sweep){buf, len, n, i};
	for (unsigned i = 1; i < n; i++)
		pthread_create(&th[i], NULL, sweep_main, &w[i]);
	sweep_main(&w[0]);
	for (unsigned i = 1; i < n; i++)
		pthread_join(th[i], NULL);
	return proto_now_ns() - t0;
}

/* Cache lines the patch stores to. */
static uint64_t lines_touched(const struct proto_dpatch *p)
{
	uint64_t n = 0;

	for (uint32_t ci = 0; ci < p->nchunks; ci++) {
		const struct proto_dpatch_chunk *pc = &p->chunks[ci];
		uintptr_t last = UINTPTR_MAX;
		for (uint32_t j = 0; j < pc->n; j++) {
			uintptr_t a = (uintptr_t)(pc->dst + (size_t)pc->pos[j] * pc->w);
			for (uintptr_t l = a >> 6; l <= (a + pc->w - 1) >> 6; l++)
				if (l != last)
					n++, last = l;
		}
	}
	return n;
}

static void ip_drained(void *arg)
{
	struct ip_job *j = arg;
	struct bench *b = j->b;

	j->t_drained = proto_now_ns();
	proto_dpatch_write(j->patch, 1, j->pool);
	j->t_written = proto_now_ns();
	b->active->version = j->version;
	node_attach_resume(b->at, b->active, b->digest);
	j->t_resume = proto_now_ns();
	j->flt = faults() - j->flt0;
	pthread_mutex_lock(&j->mu);
	j->done = 1;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
}

static void ip_start(evutil_socket_t fd, short what, void *arg)
{
	struct ip_job *j = arg;

	j->flt0 = faults();
	j->t_pause = proto_now_ns();
	if (node_attach_pause(j->b->at, j->version, ip_drained, j) != 0) {
		fprintf(stderr, "bench_activate: pause failed\n");
		exit(1);
	}
}

#define INSTALLS 6

/* The in-place phase: its own attach server, slot and probe. */
static void run_inplace(uint64_t mib)
{
	struct bench b = {0};
	struct proto_model m;
	struct proto_layout l;
	struct proto_plan plan;
	struct proto_dparcel dp;
	struct proto_err err = {{0}};
	pthread_t loop, probe;
	char dir[] = "/tmp/tessera-bench-inplace-XXXXXX", cerr[256];
	uint64_t shape[2] = {mib * 512, 1024}; /* bf16: 1024 elements a row, 2 KiB */

	proto_model_init(&m);
	if (mkdtemp(dir) == NULL || proto_model_add(&m, "w", PROTO_DT_BF16, 2, shape, &err) != 0 ||
	    proto_model_finish(&m, &err) != 0 || proto_layout_builtin(&m, "tp1", &l, &err) != 0 ||
	    proto_plan_build(&m, &l, &l, &plan, &err) != 0 || plan.nparcels != 1 ||
	    proto_dparcel_build(&m, &plan, &plan.parcels[0], &l, &dp, &err) != 0) {
		fprintf(stderr, "bench_activate: in-place setup: %s\n", err.msg);
		exit(1);
	}
	size_t n = l.ranks[0].nbytes;
	b.rank = l.ranks[0];
	b.t_ns = calloc(PROBE_MAX, sizeof(*b.t_ns));
	b.cost_ns = calloc(PROBE_MAX, sizeof(*b.cost_ns));
	b.ver = calloc(PROBE_MAX, sizeof(*b.ver));
	snprintf(b.sock, sizeof(b.sock), "%s/A-0.sock", dir);
	if (b.t_ns == NULL || b.cost_ns == NULL || b.ver == NULL || node_store_open("host", &b.store, &err) != 0 ||
	    (b.base = event_base_new()) == NULL) {
		fprintf(stderr, "bench_activate: setup failed\n");
		exit(1);
	}
	/* Version 1: bf16 values near +-1; the next changes 1 % of the
	 * elements (at random, by 1 to 3 ulp), as an RL step does. */
	if (node_slot_new(&b.store, 1, n, &b.active, &err) != 0) {
		fprintf(stderr, "bench_activate: slot: %s\n", err.msg);
		exit(1);
	}
	uint16_t *w = (uint16_t *)b.active->host;
	uint64_t x = 88172645463325252ull;
	for (size_t i = 0; i < n / 2; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		w[i] = (uint16_t)((0x3c00 + (x & 0x3ff)) | ((x >> 20 & 1) << 15));
	}
	uint8_t *v1 = malloc(n), *v2 = malloc(n), *fwd = NULL, *back = NULL;
	size_t fwd_len = 0, back_len = 0;
	if (v1 == NULL || v2 == NULL) {
		fprintf(stderr, "bench_activate: out of memory\n");
		exit(1);
	}
	memcpy(v1, b.active->host, n);
	memcpy(v2, v1, n);
	for (size_t i = 0; i < n / 2; i++) { /* 1 % of the elements, at random */
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		if (x % 100 == 0)
			((uint16_t *)v2)[i] += (uint16_t)(1 + (x >> 40) % 3);
	}
	struct proto_delta_opts o = {.threads = 2};
	if (proto_dparcel_encode(&dp, v1, v2, &o, &fwd, &fwd_len, NULL, &err) != 0 ||
	    proto_dparcel_encode(&dp, v2, v1, &o, &back, &back_len, NULL, &err) != 0) {
		fprintf(stderr, "bench_activate: encode: %s\n", err.msg);
		exit(1);
	}
	free(v2);

	/* The bound: one memcpy of this model, best of 3. */
	uint64_t memcpy_ns = UINT64_MAX;
	for (int i = 0; i < 3; i++) {
		uint64_t t0 = proto_now_ns();
		memcpy(v1, b.active->host, n);
		__asm__ volatile("" : : "r"(v1) : "memory");
		memcpy_ns = PROTO_MIN(memcpy_ns, proto_now_ns() - t0);
	}

	struct node_attach_info ai = {
		.replica = "A", .spec = &b.rank, .layout_digest = b.digest, .store = &b.store};
	if (node_attach_new(b.base, b.sock, &ai, &b.at, &err) != 0) {
		fprintf(stderr, "bench_activate: %s\n", err.msg);
		exit(1);
	}
	node_attach_activate(b.at, b.active, b.digest);
	pthread_create(&loop, NULL, loop_main, &b);
	if (tessera_attach(b.sock, "A", 0, 30000, &b.c, cerr, sizeof(cerr)) != 0 ||
	    tessera_wait_version(b.c, 1, 30000) != 0) {
		fprintf(stderr, "bench_activate: attach: %s\n", cerr);
		exit(1);
	}
	pthread_create(&probe, NULL, probe_main, &b);
	uint64_t install_ns[INSTALLS], write_ns[INSTALLS], drain_ns[INSTALLS], prep_ns[INSTALLS];
	uint64_t resume_ns[INSTALLS], sweep[INSTALLS], lines = 0, nchanges = 0;
	long flt_max = 0;
	unsigned threads = (unsigned)proto_param(PROTO_PARAM_INPLACE_THREADS);
	uint64_t *sums = malloc(((size_t)dp.npieces + 1) * sizeof(*sums));
	if (sums == NULL) {
		fprintf(stderr, "bench_activate: out of memory\n");
		exit(1);
	}
	for (int k = 0; k < INSTALLS; k++) {
		struct proto_dpatch patch;
		/* One pool per install, as the node makes. */
		struct proto_dpatch_pool *pool = proto_dpatch_pool_new(threads);
		struct ip_job j = {.b = &b, .patch = &patch, .pool = pool, .version = (uint64_t)k + 2,
				   .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
		struct timeval now = {0, 0};
		/* Before the pause, as the node: the parent's checksums, the
		 * delta decoded and verified against the served bytes. */
		uint64_t t0 = proto_now_ns();
		proto_dparcel_sums(&dp, b.active->host, sums);
		if (pool == NULL) {
			fprintf(stderr, "bench_activate: out of memory\n");
			exit(1);
		}
		if (proto_dpatch_prepare(&dp, k % 2 ? back : fwd, k % 2 ? back_len : fwd_len,
					 b.active->host, sums, pool, &patch, &err) != 0) {
			fprintf(stderr, "bench_activate: in-place prepare: %s\n", err.msg);
			exit(1);
		}
		prep_ns[k] = proto_now_ns() - t0;
		lines = lines_touched(&patch);
		nchanges = patch.nchanges;
		/* The floor, measured beside each install (v1 is scratch now). */
		sweep[k] = sweep_ns(v1, n, proto_dpatch_threads(threads));
		usleep(20000); /* the probe runs steadily on the old version */
		if (event_base_once(b.base, -1, EV_TIMEOUT, ip_start, &j, &now) != 0) {
			fprintf(stderr, "bench_activate: event_base_once failed\n");
			exit(1);
		}
		pthread_mutex_lock(&j.mu);
		while (!j.done)
			pthread_cond_wait(&j.cv, &j.mu);
		pthread_mutex_unlock(&j.mu);
		proto_dpatch_fini(&patch);
		proto_dpatch_pool_free(pool);
		install_ns[k] = j.t_resume - j.t_pause;
		write_ns[k] = j.t_written - j.t_drained;
		resume_ns[k] = j.t_resume - j.t_written;
		drain_ns[k] = j.t_drained - j.t_pause;
		flt_max = j.flt > flt_max ? j.flt : flt_max;
		for (int wt = 0; wt < 100000; wt++) {
			size_t i = atomic_load(&b.n);
			if (i > 0 && b.ver[i - 1] >= (uint64_t)k + 2)
				break;
			usleep(100);
		}
	}
	usleep(20000);
	atomic_store(&b.stop, true);
	pthread_join(probe, NULL);

	/* The probe's gap around each install: its pause. */
	uint64_t pause[INSTALLS];
	size_t got = 0, cnt = atomic_load(&b.n);
	for (size_t i = 1; i < cnt && got < INSTALLS; i++)
		if (b.ver[i] != b.ver[i - 1] && b.ver[i] >= 2)
			pause[got++] = b.cost_ns[i];
	if (got == 0) {
		fprintf(stderr, "bench_activate: the probe saw no in-place install\n");
		exit(1);
	}
	qsort(pause, got, sizeof(*pause), cmp_u64);
	qsort(install_ns, INSTALLS, sizeof(*install_ns), cmp_u64);
	qsort(write_ns, INSTALLS, sizeof(*write_ns), cmp_u64);
	qsort(drain_ns, INSTALLS, sizeof(*drain_ns), cmp_u64);
	qsort(prep_ns, INSTALLS, sizeof(*prep_ns), cmp_u64);
	qsort(resume_ns, INSTALLS, sizeof(*resume_ns), cmp_u64);
	qsort(sweep, INSTALLS, sizeof(*sweep), cmp_u64);
	double mc = (double)memcpy_ns / 1e6, p50 = (double)pause[got / 2] / 1e6,
	       pmax = (double)pause[got - 1] / 1e6;
	printf("bench_activate: in place, a 1 %% delta (%zu and %zu wire bytes) of a %llu MiB model, "
	       "%d installs, %u write threads\n",
	       fwd_len, back_len, (unsigned long long)mib, INSTALLS, proto_dpatch_threads(threads));
	printf("  memcpy of the model (bound, same run): %.2f ms (%.2f GB/s)\n", mc,
	       (double)n / (double)memcpy_ns);
	printf("  in-place pause the probe saw: p50 %.2f ms, max %.2f ms (p50 = %.3f x memcpy; "
	       "goal <= 50 ms: %s)\n",
	       p50, pmax, p50 / mc, p50 <= 50.0 ? "met" : "NOT met");
	printf("  install (pause -> resume) p50 %.2f ms: drain %.3f ms, write %.2f ms, resume %.3f ms; "
	       "page faults in the pause: at most %ld\n",
	       (double)install_ns[INSTALLS / 2] / 1e6, (double)drain_ns[INSTALLS / 2] / 1e6,
	       (double)write_ns[INSTALLS / 2] / 1e6, (double)resume_ns[INSTALLS / 2] / 1e6, flt_max);
	double sw = (double)sweep[INSTALLS / 2], nl = (double)(n / 64),
	       floor_ms = sw / 1e6 * (double)lines / nl;
	printf("  store floor: the write changes %llu elements on %llu cache lines (%.1f %% of the "
	       "model's), %.0f MB read and written back; reading and writing every line of the "
	       "model on %u threads takes p50 %.1f ms (%.2f GB/s each way), so the write costs at "
	       "least %.1f ms (write p50 = %.2f x floor)\n",
	       (unsigned long long)nchanges, (unsigned long long)lines,
	       100.0 * (double)lines / nl, (double)lines * 64 / 1e6, proto_dpatch_threads(threads),
	       sw / 1e6, (double)n / sw, floor_ms,
	       (double)write_ns[INSTALLS / 2] / 1e6 / floor_ms);
	printf("  prepared before the pause (parent checksums, decode, verify) p50 %.1f ms\n",
	       (double)prep_ns[INSTALLS / 2] / 1e6);

	tessera_detach(b.c);
	event_base_loopbreak(b.base);
	pthread_join(loop, NULL);
	node_attach_free(b.at);
	node_slot_free(&b.store, b.active);
	event_base_free(b.base);
	rmdir(dir);
	free(fwd);
	free(back);
	free(sums);
	free(v1);
	free(b.t_ns);
	free(b.cost_ns);
	free(b.ver);
	proto_dparcel_fini(&dp);
	proto_plan_fini(&plan);
	proto_layout_fini(&l);
	proto_model_fini(&m);
}

int main(int argc, char **argv)
{
	uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 128;
	uint64_t switches = argc > 2 ? strtoull(argv[2], NULL, 10) : 100;
	uint64_t inplace_mib = argc > 3 ? strtoull(argv[3], NULL, 10) : 1024;
	struct bench b = {0};
	struct proto_err err;
	pthread_t loop, probe;
	char dir[] = "/tmp/tessera-bench-activate-XXXXXX", cerr[256];

	if (mib == 0 || switches == 0 || mib > (1u << 20) || inplace_mib > (1u << 20)) {
		fprintf(stderr, "usage: bench_activate [MODEL_MIB] [SWITCHES] [INPLACE_MIB]\n");
		return 2;
	}
	evthread_use_pthreads();
	if (mkdtemp(dir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(b.sock, sizeof(b.sock), "%s/A-0.sock", dir);
	b.local = (struct proto_local){.name = "weights", .dtype = PROTO_DT_BF16, .ndim = 1};
	b.local.shape[0] = b.local.nelem = (mib << 20) / 2;
	b.local.nbytes = mib << 20;
	b.rank = (struct proto_rank){1, &b.local, mib << 20};
	b.t_ns = calloc(PROBE_MAX, sizeof(*b.t_ns));
	b.cost_ns = calloc(PROBE_MAX, sizeof(*b.cost_ns));
	b.ver = calloc(PROBE_MAX, sizeof(*b.ver));
	if (b.t_ns == NULL || b.cost_ns == NULL || b.ver == NULL || node_store_open("host", &b.store, &err) != 0 ||
	    (b.base = event_base_new()) == NULL) {
		fprintf(stderr, "bench_activate: setup failed\n");
		return 1;
	}
	struct node_attach_info ai = {
		.replica = "A", .spec = &b.rank, .layout_digest = b.digest, .store = &b.store};
	if (node_attach_new(b.base, b.sock, &ai, &b.at, &err) != 0) {
		fprintf(stderr, "bench_activate: %s\n", err.msg);
		return 1;
	}
	b.active = build(&b, 1);
	node_attach_activate(b.at, b.active, b.digest);
	pthread_create(&loop, NULL, loop_main, &b);
	if (tessera_attach(b.sock, "A", 0, 30000, &b.c, cerr, sizeof(cerr)) != 0 ||
	    tessera_wait_version(b.c, 1, 30000) != 0) {
		fprintf(stderr, "bench_activate: attach: %s\n", cerr);
		return 1;
	}

	/* The bound: one memcpy of the model (what a reload by copy costs at
	 * least), best of 3, into memory already touched. */
	uint8_t *dst = malloc(b.rank.nbytes);
	uint64_t memcpy_ns = UINT64_MAX;
	if (dst == NULL) {
		fprintf(stderr, "bench_activate: out of memory\n");
		return 1;
	}
	memset(dst, 1, b.rank.nbytes);
	for (int i = 0; i < 3; i++) {
		uint64_t t0 = proto_now_ns();
		memcpy(dst, b.active->host, b.rank.nbytes);
		__asm__ volatile("" : : "r"(dst) : "memory"); /* the copy is used */
		memcpy_ns = PROTO_MIN(memcpy_ns, proto_now_ns() - t0);
	}
	if (dst[b.rank.nbytes - 1] != b.active->host[b.rank.nbytes - 1])
		fprintf(stderr, "bench_activate: memcpy check failed\n");
	free(dst);

	pthread_create(&probe, NULL, probe_main, &b);
	uint64_t *sw = calloc(switches, sizeof(*sw));
	for (uint64_t k = 0; k < switches; k++) {
		struct node_slot *s = build(&b, k + 2);
		usleep(2000); /* the probe runs steadily on the old version */
		sw[k] = switch_to(&b, s);
		/* Wait (bounded) until the probe ran on it. */
		for (int w = 0; w < 10000; w++) {
			size_t n = atomic_load(&b.n);
			if (n > 0 && b.ver[n - 1] >= k + 2)
				break;
			usleep(100);
		}
	}
	usleep(2000);
	atomic_store(&b.stop, true);
	pthread_join(probe, NULL);

	/* Per switch: the pause (gap before the first acquire of the new
	 * version) and the delay from the switch to that acquire. */
	size_t n = atomic_load(&b.n), got = 0;
	uint64_t *pause = calloc(switches, sizeof(*pause)), *delay = calloc(switches, sizeof(*delay));
	uint64_t *steady = calloc(n, sizeof(*steady));
	size_t nsteady = 0;
	for (size_t i = 1; i < n; i++) {
		uint64_t gap = b.cost_ns[i];
		if (b.ver[i] != b.ver[i - 1] && b.ver[i] >= 2 && b.ver[i] - 2 < switches) {
			uint64_t k = b.ver[i] - 2;
			pause[got] = gap;
			delay[got] = b.t_ns[i] > sw[k] ? b.t_ns[i] - sw[k] : 0;
			got++;
		} else {
			steady[nsteady++] = gap;
		}
	}
	if (got == 0 || nsteady == 0) {
		fprintf(stderr, "bench_activate: the probe saw no switch\n");
		return 1;
	}
	qsort(pause, got, sizeof(*pause), cmp_u64);
	qsort(delay, got, sizeof(*delay), cmp_u64);
	qsort(steady, nsteady, sizeof(*steady), cmp_u64);
	double mc_ms = (double)memcpy_ns / 1e6, p99 = pct_us(pause, got, 0.99);
	printf("bench_activate: model %llu MiB, %zu switches seen of %llu, %zu probe requests\n",
	       (unsigned long long)mib, got, (unsigned long long)switches, n);
	printf("  memcpy of the model (bound, same run): %.2f ms (%.2f GB/s)\n", mc_ms,
	       (double)b.rank.nbytes / (double)memcpy_ns);
	printf("  probe acquire+release between requests, no switch: p50 %.1f us, p99 %.1f us\n", pct_us(steady, nsteady, 0.5),
	       pct_us(steady, nsteady, 0.99));
	printf("  double-buffered pause at a switch: p50 %.1f us, p99 %.1f us, max %.1f us "
	       "(p99 = %.4f x memcpy; goal p99 <= 1 ms: %s)\n",
	       pct_us(pause, got, 0.5), p99, pct_us(pause, got, 1.0), p99 / 1000.0 / mc_ms,
	       p99 <= 1000.0 ? "met" : "NOT met");
	printf("  switch -> first request on the new version: p50 %.1f us, p99 %.1f us\n",
	       pct_us(delay, got, 0.5), pct_us(delay, got, 0.99));

	tessera_detach(b.c);
	event_base_loopbreak(b.base);
	pthread_join(loop, NULL);
	node_attach_free(b.at);
	node_slot_free(&b.store, b.active);
	event_base_free(b.base);
	rmdir(dir);
	free(sw);
	free(pause);
	free(delay);
	free(steady);
	free(b.t_ns);
	free(b.cost_ns);
	free(b.ver);
	if (inplace_mib > 0)
		run_inplace(inplace_mib);
	return 0;
}
