/*
 * bench_tracker: a real tessera-tracker on loopback under a simulated
 * cluster. One load generator (one libevent loop) registers N nodes
 * (default 10 000) in N/10 replicas of a 10-rank serving layout, heartbeats
 * each at the lease rate (every lease/3), keeps one version watch
 * (long-poll) open per node, and publishes a version every few seconds;
 * after each version every node asks for the sources of its parcel, spread
 * over one second. The simulated nodes talk to the tracker as real ones do:
 * through a tracker client per host (default: the ten ranks of a replica
 * on one host, served by one tessera-node process), which keeps one
 * connection open for its requests and one for its watch, and, as the
 * multi-rank agent does (node/host*.c), renews the leases of all its ranks
 * with one host heartbeat, holds one version watch for them all and asks
 * for the sources of all their parcels in one batched query (POST
 * /sources), naming the members list each rank holds (members_tag: the
 * list comes again only when it changed) and asking for the lists shared
 * (one list of replica names per batch, not one list of ids per rank;
 * SHARED 0 asks for whole lists, as agents did before). The watches run on
 * a second thread with its own event loop and clients: each simulated host
 * is a machine of its own, and a thousand watch answers handled back to
 * back on the loop that times the other requests delayed their timing.
 * PER_CLIENT 1 is one process per rank, each with its own
 * heartbeat, watch and GET /sources (two descriptors per node on each side:
 * 10 000 nodes need more than a 20 000 descriptor limit allows). Prints requests
 * served per second (from the tracker's own counters), the connections it
 * accepted, p50/p99 of heartbeats and of sources queries, the tracker's
 * memory, and the time to render the status page and /api/v1/status while
 * under load.
 *
 *   bench_tracker [NODES [SECONDS [PER_CLIENT [SHARED]]]]
 *
 * The goals (p99 under 20 ms, status under 200 ms) are printed beside the
 * figures; nothing here asserts a time.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/event.h>

#include "node/cli/proc.h"
#include "proto/fixture.h"
#include "proto/proto.h"
#include "tracker/tracker.h"
#include "tests/testutil.h"

#define RANKS 10
#define TICK_MS 20
#define INFLIGHT_MAX 4000 /* heartbeats and sources queries in flight */
#define VERSION_EVERY_MS 5000
#define CHUNK (1u << 20)
#define REGISTER_MAX_S 120ull
/* The first version after registration sends every members list (nothing
 * is known yet): the figures are printed again for the requests sent after
 * this many seconds, the steady state. */
#define LATE_S 10

struct lat {
	uint64_t *v;
	size_t n, cap;
};

struct sim_node {
	struct trk_client *c; /* shared by PER_CLIENT nodes */
	struct trk_client *wc; /* its watch's, on the watch thread (the host's first) */
	char id[TRK_ID_MAX];
	uint32_t rank;
	bool registered, watching;
	bool watch_wanted; /* set (atomically) once it registered: the watch thread starts one */
	uint64_t seen;
	char tag[TRK_MEMBERS_TAG_HEX + 1]; /* of the members list it holds */
};

struct bench {
	struct event_base *base;  /* registration, heartbeats, sources, the publisher */
	struct event_base *wbase; /* the watches, on their own thread */
	struct event *wtick;
	bool stop;                /* (atomic) the main loop ended: so does the watch thread */
	struct trk_client *c;
	struct proto_model m;
	struct proto_layout tl, sl;
	struct proto_plan plan;
	json_t *sl_json;
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];
	char pub_id[TRK_ID_MAX];
	struct sim_node *nodes;
	bool unshared; /* batches ask for whole members lists */
	uint32_t nnodes, per_client, registered, reg_next, reg_inflight, reg_failed;
	uint32_t hb_next, src_next, src_version; /* hb_next: a node, or a host's first */
	uint64_t hb_budget; /* heartbeats owed, in thousandths */
	uint32_t inflight, skipped, errors, expired;
	uint64_t expired_first_ns, expired_last_ns; /* when leases were lost */
	uint64_t version, watch_answers;
	uint64_t src_bytes; /* sources answers' bodies, while measuring */
	uint8_t last_digest[PROTO_HASH_BYTES];
	bool measuring, publishing_ok;
	uint64_t reg_done_ns;
	uint32_t seconds;
	struct lat hb, src;
	struct lat hb_late, src_late; /* sent LATE_S or more after measuring began */
	struct event *tick, *pub_ev, *pub_hb;
	uint64_t start_ns, last_pub_ns;
	FILE *trace; /* TESSERA_BENCH_TRACE */
	struct event *lag_ev;
	uint64_t lag_due_ns;
};

struct req {
	struct bench *b;
	uint64_t t0;
	uint32_t node;
	int kind; /* 0 heartbeat, 1 sources, 2 host heartbeat, 3 host's sources (node: the host's first) */
	uint32_t nwho, who[TRK_SOURCES_BATCH_MAX]; /* sources: whose parcels, in order */
};

static void lat_add(struct lat *l, uint64_t ns)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 4096;
		uint64_t *v = realloc(l->v, cap * sizeof(*v));
		if (v == NULL)
			return;
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct_ms(struct lat *l, double p)
{
	if (l->n == 0)
		return 0;
	qsort(l->v, l->n, sizeof(*l->v), cmp_u64);
	size_t i = (size_t)(p * (double)(l->n - 1));
	return (double)l->v[i] / 1e6;
}

/* ---- nodes: register, heartbeat, watch, sources ----------------------------- */

static void start_watch(struct bench *b, uint32_t i);

static void on_watch(const struct trk_answer *a, void *arg)
{
	struct req *r = arg;
	struct bench *b = r->b;
	struct sim_node *n = &b->nodes[r->node];
	json_t *v;
	size_t k;

	n->watching = false;
	b->watch_answers++; /* read after the watch thread ended */
	if (a->status == 200)
		json_array_foreach(json_object_get(a->json, "versions"), k, v)
		{
			uint64_t ver = (uint64_t)json_integer_value(json_object_get(v, "version"));
			n->seen = PROTO_MAX(n->seen, ver);
		}
	else if (b->errors++ < 3)
		fprintf(stderr, "bench_tracker: watch: %d %s\n", a->status, a->error);
	uint32_t node = r->node;
	free(r);
	start_watch(b, node);
}

static void start_watch(struct bench *b, uint32_t i)
{
	struct req *r = malloc(sizeof(*r));

	if (r == NULL)
		return;
	*r = (struct req){.b = b, .node = i};
	if (trk_client_watch(b->nodes[i].wc, b->nodes[i].seen, (uint32_t)proto_param(PROTO_PARAM_WATCH_MS),
			     on_watch, r) != 0) {
		free(r);
		return;
	}
	b->nodes[i].watching = true;
}

/* The node that holds the watch for node i: its host's first. */
static uint32_t watcher(const struct bench *b, uint32_t i)
{
	return i - i % b->per_client;
}

static void on_register(const struct trk_answer *a, void *arg)
{
	struct req *r = arg;
	struct bench *b = r->b;
	struct sim_node *n = &b->nodes[r->node];
	const char *id = json_string_value(json_object_get(a->json, "node_id"));

	b->reg_inflight--;
	if (a->status / 100 == 2 && id != NULL) {
		snprintf(n->id, sizeof(n->id), "%s", id);
		if (!n->registered)
			b->registered++;
		n->registered = true;
		__atomic_store_n(&b->nodes[watcher(b, r->node)].watch_wanted, true, __ATOMIC_RELEASE);
	} else {
		if (b->reg_failed++ < 3)
			fprintf(stderr, "bench_tracker: node %u: registration: %d %s\n", r->node,
				a->status, a->error);
	}
	free(r);
}

static void register_one(struct bench *b, uint32_t i)
{
	char replica[32], host[32], addr[40];
	struct req *r = malloc(sizeof(*r));

	if (r == NULL)
		return;
	*r = (struct req){.b = b, .node = i};
	snprintf(replica, sizeof(replica), "r%05u", i / RANKS);
	snprintf(host, sizeof(host), "host%05u", i / RANKS);
	snprintf(addr, sizeof(addr), "%032x", i + 1);
	struct trk_node_reg reg = {
		.replica = replica,
		.addr = {b->nodes[i].rank, host, "tcp;ofi_rxm", addr},
		.layout = b->sl_json,
		.model_digest = b->m.digest,
		.layout_digest = b->sl.digest,
	};
	if (trk_client_register_node(b->nodes[i].c, &reg, on_register, r) != 0) {
		free(r);
		b->reg_failed++;
		return;
	}
	b->reg_inflight++;
}

static void register_some(struct bench *b)
{
	/* Below the tracker's listen backlog: more are reset, not queued. */
	while (b->reg_next < b->nnodes && b->reg_inflight < 64)
		register_one(b, b->reg_next++);
}

/* The lease of node i ran out before its heartbeat got through: a real
 * node registers again, so does this one. */
static void lease_lost(struct bench *b, uint32_t i)
{
	if (!b->nodes[i].registered)
		return;
	if (b->expired++ == 0)
		b->expired_first_ns = proto_now_ns();
	b->expired_last_ns = proto_now_ns();
	b->nodes[i].registered = false;
	b->registered--;
	register_one(b, i);
}

/* Each sources answer in a's body (in order, one per asker) starts with
 * its members list's tag; the askers keep them, as agents do (the lists
 * themselves are not read here). */
static void keep_tags(struct bench *b, const struct req *r, const struct trk_answer *a)
{
	static const char key[] = "\"members_tag\":\"";
	const char *p = (const char *)a->body;

	for (uint32_t i = 0; i < r->nwho && p != NULL; i++) {
		if ((p = strstr(p, key)) == NULL)
			break;
		p += sizeof(key) - 1;
		if (strlen(p) > TRK_MEMBERS_TAG_HEX) {
			memcpy(b->nodes[r->who[i]].tag, p, TRK_MEMBERS_TAG_HEX);
			b->nodes[r->who[i]].tag[TRK_MEMBERS_TAG_HEX] = 0;
		}
	}
}

static void on_timed(const struct trk_answer *a, void *arg)
{
	struct req *r = arg;
	struct bench *b = r->b;
	uint64_t dt = proto_now_ns() - r->t0;
	static const char *const what[] = {"heartbeat", "sources", "host heartbeat",
					   "host sources"};
	json_t *id;
	size_t k;

	b->inflight--;
	if (r->kind == 0 && a->status == 404) {
		lease_lost(b, r->node);
	} else if (a->status != 200) {
		if (b->errors++ < 3)
			fprintf(stderr, "bench_tracker: %s: %d %s\n", what[r->kind], a->status, a->error);
	} else {
		if (r->kind == 2)
			json_array_foreach(json_object_get(a->json, "gone"), k, id)
				for (uint32_t i = r->node; i < r->node + b->per_client && i < b->nnodes; i++)
					if (strcmp(b->nodes[i].id, json_string_value(id)) == 0)
						lease_lost(b, i);
		if (b->measuring)
			lat_add(r->kind == 1 || r->kind == 3 ? &b->src : &b->hb, dt);
		if (b->measuring && r->t0 >= b->reg_done_ns + LATE_S * 1000000000ull)
			lat_add(r->kind == 1 || r->kind == 3 ? &b->src_late : &b->hb_late, dt);
		if (r->kind == 1 || r->kind == 3)
			keep_tags(b, r, a);
		if (b->measuring && (r->kind == 1 || r->kind == 3))
			b->src_bytes += a->len;
		if (b->trace != NULL && b->measuring)
			fprintf(b->trace, "T %d %" PRIu64 " %" PRIu64 " %zu\n", r->kind, r->t0,
				r->t0 + dt, a->len);
	}
	free(r);
}

/* One heartbeat for the registered ranks of the host whose first node is i. */
static int host_heartbeat(struct bench *b, uint32_t i, struct req *r)
{
	struct trk_hb_node e[TRK_HOST_HEARTBEAT_MAX];
	size_t n = 0;

	for (uint32_t k = i; k < i + b->per_client && k < b->nnodes && n < TRK_HOST_HEARTBEAT_MAX; k++)
		if (b->nodes[k].registered)
			e[n++] = (struct trk_hb_node){.id = b->nodes[k].id};
	return n == 0 ? -ENOENT : trk_client_heartbeat_host(b->nodes[i].c, e, n, on_timed, r);
}

/* Node i's sources query, naming the members list it holds. */
static int node_sources(struct bench *b, uint32_t i, struct req *r)
{
	struct trk_parcel_key k = {.version = b->src_version, .dst_rank = b->nodes[i].rank};

	memcpy(k.layout, b->sl.digest, PROTO_HASH_BYTES);
	memcpy(k.members_tag, b->nodes[i].tag, sizeof(k.members_tag));
	r->nwho = 1;
	r->who[0] = i;
	return trk_client_sources_key(b->nodes[i].c, &k, on_timed, r);
}

/* One sources query for the parcels of the registered ranks of the host
 * whose first node is i. */
static int host_sources(struct bench *b, uint32_t i, struct req *r)
{
	struct trk_parcel_key k[TRK_SOURCES_BATCH_MAX];
	size_t n = 0;

	r->nwho = 0;
	for (uint32_t j = i; j < i + b->per_client && j < b->nnodes && n < TRK_SOURCES_BATCH_MAX; j++)
		if (b->nodes[j].registered) {
			k[n] = (struct trk_parcel_key){.version = b->src_version,
						       .dst_rank = b->nodes[j].rank};
			memcpy(k[n].members_tag, b->nodes[j].tag, sizeof(k[n].members_tag));
			memcpy(k[n++].layout, b->sl.digest, PROTO_HASH_BYTES);
			r->who[r->nwho++] = j;
		}
	if (n == 0)
		return -ENOENT;
	return b->unshared ? trk_client_sources_batch(b->nodes[i].c, k, n, on_timed, r)
			   : trk_client_sources_shared(b->nodes[i].c, k, n, on_timed, r);
}

/* Sends node i's heartbeat (kind 0), sources query (kind 1) or its host's
 * heartbeat (kind 2) or sources query (kind 3; i its first node), timed;
 * skipped when the node is not registered or too much is in flight. */
static void send_timed(struct bench *b, uint32_t i, int kind)
{
	struct req *r;
	int rc;

	if (kind < 2 && !b->nodes[i].registered)
		return;
	if (b->inflight >= INFLIGHT_MAX) {
		b->skipped++;
		return;
	}
	r = malloc(sizeof(*r));
	if (r == NULL)
		return;
	*r = (struct req){.b = b, .t0 = proto_now_ns(), .node = i, .kind = kind};
	rc = kind == 0 ? trk_client_heartbeat(b->nodes[i].c, b->nodes[i].id, on_timed, r)
	     : kind == 1 ? node_sources(b, i, r)
	     : kind == 2 ? host_heartbeat(b, i, r)
			 : host_sources(b, i, r);
	if (rc != 0) {
		free(r);
		b->errors += rc != -ENOENT;
		return;
	}
	b->inflight++;
}

/* ---- the publisher ---------------------------------------------------------------- */

static void on_pub_answer(const struct trk_answer *a, void *arg)
{
	struct bench *b = arg;
	if (a->status / 100 != 2) {
		b->errors++;
		fprintf(stderr, "bench_tracker: publisher: %d %s\n", a->status, a->error);
	}
}

static void on_published(const struct trk_answer *a, void *arg)
{
	struct bench *b = arg;
	struct trk_offer off[RANKS];

	if (a->status / 100 != 2) {
		fprintf(stderr, "bench_tracker: publish v%" PRIu64 ": %d %s\n", b->version, a->status,
			a->error);
		b->errors++;
		return;
	}
	for (uint32_t i = 0; i < b->plan.nparcels && i < RANKS; i++) {
		off[i] = (struct trk_offer){.src_rank = b->plan.parcels[i].src_rank,
					    .dst_rank = b->plan.parcels[i].dst_rank,
					    .addr = 4096 * (i + 1), .key = i + 1,
					    .len = b->plan.parcels[i].bytes};
		memcpy(off[i].layout, b->sl.digest, PROTO_HASH_BYTES);
	}
	trk_client_offer(b->c, b->pub_id, b->version, off, PROTO_MIN(b->plan.nparcels, RANKS),
			 on_pub_answer, b);
	/* Every node asks for its parcel's sources over the next second. */
	b->src_version = (uint32_t)b->version;
	b->src_next = 0;
}

static int publish_next(struct bench *b)
{
	struct proto_manifest man;
	struct proto_err err;
	uint8_t *enc;
	size_t len;

	proto_manifest_init(&man);
	man.version = b->version + 1;
	man.parent_version = b->version;
	memcpy(man.parent_digest, b->last_digest, PROTO_HASH_BYTES);
	man.kind = PROTO_KIND_ANCHOR;
	man.chunk_size = CHUNK;
	man.created_ms = proto_wall_ms();
	memcpy(man.model_digest, b->m.digest, PROTO_HASH_BYTES);
	memcpy(man.src_layout_digest, b->tl.digest, PROTO_HASH_BYTES);
	struct proto_mlayout *ml =
		proto_manifest_add_layout(&man, b->sl.digest, b->plan.digest, b->plan.nparcels);
	if (ml == NULL)
		goto fail;
	for (uint32_t i = 0; i < b->plan.nparcels; i++) {
		struct proto_mparcel *mp = &ml->parcels[i];
		mp->src_rank = b->plan.parcels[i].src_rank;
		mp->dst_rank = b->plan.parcels[i].dst_rank;
		mp->bytes = b->plan.parcels[i].bytes;
		mp->encoding = PROTO_ENC_RAW;
		if (proto_mparcel_alloc_chunks(&man, mp, mp->bytes) != 0)
			goto fail;
		for (uint32_t c = 0; c < mp->nchunks; c++)
			randombytes_buf(mp->chunks[c].hash, PROTO_HASH_BYTES);
	}
	if (proto_manifest_sign(&man, b->sk, &enc, &len, &err) != 0)
		goto fail;
	b->version = man.version;
	memcpy(b->last_digest, man.digest, PROTO_HASH_BYTES);
	proto_manifest_fini(&man);
	int rc = trk_client_publish(b->c, enc, len, on_published, b);
	free(enc);
	return rc;
fail:
	proto_manifest_fini(&man);
	return -ENOMEM;
}

/* ---- the clock ------------------------------------------------------------------------- */

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;
	uint64_t lease = proto_param(PROTO_PARAM_LEASE_MS);
	uint64_t now = proto_now_ns();

	register_some(b);
	/* Heartbeats: every node (or host) once per lease/3, spread evenly. */
	uint32_t step = b->per_client > 1 ? b->per_client : 1;
	b->hb_budget += (uint64_t)(b->nnodes / step) * TICK_MS * 1000 / (lease / 3);
	while (b->hb_budget >= 1000) {
		b->hb_budget -= 1000;
		send_timed(b, b->hb_next, step > 1 ? 2 : 0);
		b->hb_next = (b->hb_next + step) % (b->nnodes / step * step);
	}
	/* Sources: every node (or host) once within a second of a new version. */
	if (b->src_version != 0) {
		uint32_t per_tick = PROTO_MAX(1u, b->nnodes / step * TICK_MS / 1000);
		for (uint32_t k = 0; k < per_tick && b->src_next < b->nnodes; k++, b->src_next += step)
			send_timed(b, b->src_next, step > 1 ? 3 : 1);
	}
	if (b->publishing_ok && now - b->last_pub_ns >= (uint64_t)VERSION_EVERY_MS * 1000000) {
		b->last_pub_ns = now;
		if (b->trace != NULL)
			fprintf(b->trace, "P %" PRIu64 "\n", now);
		if (publish_next(b) != 0)
			b->errors++;
	}
}

static void on_lag(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;

	proto_lag_tick(b->trace, &b->lag_due_ns);
}

/* The watch thread's clock: a host whose first rank registered gets its
 * watch. Watches (answered all at once when a version lands, and asked
 * again at once) run on their own thread and event loop: on the loop that
 * times heartbeats and sources queries, a thousand hosts' watch answers
 * were handled back to back and delayed the timing of the answers that
 * came meanwhile (each simulated host is its own machine in a cluster). */
static void on_wtick(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;

	if (__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE)) {
		event_base_loopbreak(b->wbase);
		return;
	}
	for (uint32_t i = 0; i < b->nnodes; i += b->per_client)
		if (!b->nodes[i].watching && __atomic_load_n(&b->nodes[i].watch_wanted, __ATOMIC_ACQUIRE))
			start_watch(b, i);
}

static void *watch_main(void *arg)
{
	struct bench *b = arg;

	/* The other hosts' watch handling yields to the tracker and to the
	 * timed requests' loop: in a cluster it runs on those hosts. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
		fprintf(stderr, "bench_tracker: the watch thread keeps its priority\n");
	event_base_dispatch(b->wbase);
	return NULL;
}

static void on_pub_heartbeat(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;
	trk_client_heartbeat(b->c, b->pub_id, on_pub_answer, b);
}

static void on_phase(evutil_socket_t fd, short what, void *arg)
{
	struct bench *b = arg;
	uint64_t now = proto_now_ns();

	/* Measure once every node registered, or after REGISTER_MAX_S: a
	 * tracker that cannot register them in that time is saturated, and the
	 * figures then say how it behaves so. */
	if (!b->measuring && ((b->reg_next >= b->nnodes && b->reg_inflight == 0) ||
			      now - b->start_ns >= REGISTER_MAX_S * 1000000000ull)) {
		b->reg_done_ns = now;
		__atomic_store_n(&b->measuring, true, __ATOMIC_RELEASE);
		b->publishing_ok = true;
		b->last_pub_ns = 0;
		return;
	}
	if (b->measuring && now - b->reg_done_ns >= (uint64_t)b->seconds * 1000000000ull) {
		__atomic_store_n(&b->stop, true, __ATOMIC_RELEASE);
		event_base_loopbreak(b->base);
	}
}

/* ---- what the tracker says about itself, from another thread ------------------ */

struct probe {
	const char *url;
	struct bench *b;
	pid_t tracker;
	/* CPU time (s) of the tracker and of this load generator, and the
	 * machine's run queue, at the ends of the window. */
	double trk_cpu0, trk_cpu1, gen_cpu0, gen_cpu1;
	double trk_wait0, trk_wait1; /* s the tracker waited for a CPU while runnable */
	double load1;
	double page_ms[3], status_ms[3];
	size_t page_bytes, status_bytes;
	uint64_t answers0, answers1, accepted0, accepted1;
	double window_s;
};

/* The tracker's answers (all codes) and connections accepted so far. */
static uint64_t answers_total(struct trk_client *c, uint64_t *accepted)
{
	struct trk_reply r;
	uint64_t sum = 0;
	const char *a;

	*accepted = 0;
	if (trk_client_call(c, "GET", "/metrics", NULL, NULL, 0, &r) != 0 || r.status != 200) {
		trk_reply_fini(&r);
		return 0;
	}
	for (const char *p = (const char *)r.body; (p = strstr(p, "\ntessera_tracker_http_responses_total{")) != NULL;) {
		p = strchr(p, '}');
		if (p == NULL)
			break;
		sum += strtoull(p + 2, NULL, 10);
	}
	if ((a = strstr((const char *)r.body, "\ntessera_tracker_http_accepted_total ")) != NULL)
		*accepted = strtoull(a + strlen("\ntessera_tracker_http_accepted_total "), NULL, 10);
	trk_reply_fini(&r);
	return sum;
}

/* utime + stime of process pid, in seconds (0 when unreadable). */
static double proc_cpu_s(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long long ut = 0, st = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* Fields 14 and 15, counted after the command name's closing ')'. */
	const char *p = strrchr(buf, ')');
	if (p == NULL || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
				&ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* Time (s) process pid spent runnable but not running: what the machine's
 * other work cost it (0 when unreadable). */
static double proc_wait_s(pid_t pid)
{
	char path[64];
	unsigned long long run = 0, wait = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	if (fscanf(f, "%llu %llu", &run, &wait) != 2)
		wait = 0;
	fclose(f);
	return (double)wait / 1e9;
}

static double self_cpu_s(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
	       (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double timed_get(struct trk_client *c, const char *path, size_t *bytes)
{
	struct trk_reply r;
	uint64_t t0 = proto_now_ns();

	if (trk_client_call(c, "GET", path, NULL, NULL, 0, &r) != 0 || r.status != 200) {
		trk_reply_fini(&r);
		return -1;
	}
	double ms = (double)(proto_now_ns() - t0) / 1e6;
	*bytes = r.len;
	trk_reply_fini(&r);
	return ms;
}

static void *probe_main(void *arg)
{
	struct probe *p = arg;
	struct trk_client *c;
	struct proto_err err;

	if (trk_client_new(NULL, p->url, NULL, &c, &err) != 0)
		return NULL;
	trk_client_set_timeout(c, 60000);
	while (!__atomic_load_n(&p->b->measuring, __ATOMIC_ACQUIRE))
		usleep(20000);
	usleep(2000000); /* let the heartbeat wave settle */
	uint64_t t0 = proto_now_ns();
	p->answers0 = answers_total(c, &p->accepted0);
	p->trk_cpu0 = proc_cpu_s(p->tracker);
	p->trk_wait0 = proc_wait_s(p->tracker);
	p->gen_cpu0 = self_cpu_s();
	for (int i = 0; i < 3; i++) {
		p->page_ms[i] = timed_get(c, "/", &p->page_bytes);
		p->status_ms[i] = timed_get(c, TRK_API "/status", &p->status_bytes);
		usleep(1000000);
	}
	while (proto_now_ns() - t0 < (uint64_t)(p->b->seconds - 4) * 1000000000ull)
		usleep(100000);
	p->answers1 = answers_total(c, &p->accepted1);
	p->trk_cpu1 = proc_cpu_s(p->tracker);
	p->trk_wait1 = proc_wait_s(p->tracker);
	p->gen_cpu1 = self_cpu_s();
	p->window_s = (double)(proto_now_ns() - t0) / 1e9;
	if (getloadavg(&p->load1, 1) != 1)
		p->load1 = -1;
	trk_client_free(c);
	return NULL;
}

static uint64_t rss_kib(pid_t pid)
{
	char path[64], line[256];
	uint64_t kib = 0;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %" SCNu64, &kib) == 1)
			break;
	fclose(f);
	return kib;
}

#define IDLE_RENDERS 15

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double median3(const double *v)
{
	double a = v[0], b = v[1], c = v[2];
	return a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
}

int main(int argc, char **argv)
{
	struct bench b = {.nnodes = 10000, .seconds = 30, .per_client = RANKS};
	struct proto_err err;
	struct node_proc tracker = {0};
	char dir[256], state[300], log[300], url[256], bin[512];
	struct rlimit rl;
	uint64_t v;

	/* Thousands of nodes reconnect at once after every version: the
	 * tracker this bench starts gets a long listen queue (see params.h). */
	setenv("TESSERA_LISTEN_BACKLOG", "4096", 0);
	/* Every client keeps a connection open for its requests and one for
	 * its watch: the tracker needs two per client (its cap also stops at
	 * the fd limit). */
	setenv("TESSERA_TRACKER_CONNS", "65536", 0);
	if (argc > 1 && (proto_parse_u64(argv[1], RANKS, 1000000, &v) != 0 || v % RANKS != 0)) {
		fprintf(stderr, "usage: bench_tracker [NODES (a multiple of %d) [SECONDS >= 10 "
			"[PER_CLIENT [SHARED 0|1]]]]\n", RANKS);
		return 2;
	}
	if (argc > 1)
		b.nnodes = (uint32_t)v;
	if (argc > 2) {
		if (proto_parse_u64(argv[2], 10, 3600, &v) != 0) {
			fprintf(stderr, "bench_tracker: SECONDS is 10..3600\n");
			return 2;
		}
		b.seconds = (uint32_t)v;
	}
	if (argc > 3) {
		if (proto_parse_u64(argv[3], 1, PROTO_MIN(b.nnodes, TRK_HOST_HEARTBEAT_MAX), &v) != 0 ||
		    b.nnodes % v != 0) {
			fprintf(stderr, "bench_tracker: PER_CLIENT is 1..%d and divides NODES\n",
				TRK_HOST_HEARTBEAT_MAX);
			return 2;
		}
		b.per_client = (uint32_t)v;
	}
	b.unshared = argc > 4 && strcmp(argv[4], "0") == 0;
	/* Per client one connection for requests and one per node's watch, on
	 * both sides (the tracker inherits the limit), and slack: raised past
	 * the hard limit when allowed (CAP_SYS_RESOURCE), else up to it. */
	uint64_t want_fds = (uint64_t)(b.nnodes / b.per_client) * (b.per_client + 1) + 4096;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want_fds) {
		struct rlimit more = {want_fds, PROTO_MAX(want_fds, rl.rlim_max)};
		if (setrlimit(RLIMIT_NOFILE, &more) != 0) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
			if (rl.rlim_cur < want_fds)
				fprintf(stderr, "bench_tracker: descriptor limit %llu (hard), below the "
					"%llu this run wants: connections will be refused (run with "
					"more nodes per client, or a higher hard limit)\n",
					(unsigned long long)rl.rlim_cur, (unsigned long long)want_fds);
		}
	}
	signal(SIGPIPE, SIG_IGN);
	if (sodium_init() < 0 || tu_mkdtemp(dir, sizeof(dir)) == NULL)
		return 1;
	snprintf(state, sizeof(state), "%s/state", dir);
	snprintf(log, sizeof(log), "%s/tracker.log", dir);

	/* The model, the trainer's layout (one rank) and the serving layout. */
	char lname[16];
	snprintf(lname, sizeof(lname), "fsdp%d", RANKS);
	if (proto_fixture_model(4u << 20, &b.m, &err) != 0 ||
	    proto_layout_builtin(&b.m, "fsdp1", &b.tl, &err) != 0 ||
	    proto_layout_builtin(&b.m, lname, &b.sl, &err) != 0 ||
	    proto_plan_build(&b.m, &b.tl, &b.sl, &b.plan, &err) != 0) {
		fprintf(stderr, "bench_tracker: %s\n", err.msg);
		return 1;
	}
	crypto_sign_keypair(b.pk, b.sk);
	b.sl_json = proto_layout_to_json(&b.m, &b.sl);

	/* The tracker, as deployed (the rel build), with its own fd limit. */
	tu_bin(bin, sizeof(bin), "tessera-tracker");
	char *targv[] = {bin, "--listen", "127.0.0.1:0", "--state", state, NULL};
	if (node_proc_spawn(&tracker, "tracker", targv, log) != 0 ||
	    node_proc_wait_line(&tracker, "listening on ", url, sizeof(url), 10000) != 0) {
		fprintf(stderr, "bench_tracker: the tracker did not start (%s)\n", log);
		return 1;
	}
	b.base = event_base_new();
	b.wbase = event_base_new();
	if (b.base == NULL || b.wbase == NULL || trk_client_new(b.base, url, NULL, &b.c, &err) != 0)
		return 1;
	trk_client_set_timeout(b.c, 30000);

	/* The publisher registers first: nodes are checked against its model. */
	struct trk_client *sync;
	struct trk_reply r;
	if (trk_client_new(NULL, url, NULL, &sync, &err) != 0)
		return 1;
	json_t *mj = proto_model_to_json(&b.m), *tj = proto_layout_to_json(&b.m, &b.tl);
	struct trk_rank_addr ra = {0, "trainer", "tcp;ofi_rxm", "00112233445566778899aabbccddeeff"};
	trk_reply_init(&r);
	if (trk_client_register_publisher(sync, mj, tj, &ra, 1, 0, trk_reply_cb, &r) != 0)
		return 1;
	trk_client_wait(sync, &r);
	if (r.status / 100 != 2) {
		fprintf(stderr, "bench_tracker: publisher registration: %d %s\n", r.status, r.error);
		return 1;
	}
	snprintf(b.pub_id, sizeof(b.pub_id), "%s",
		 json_string_value(json_object_get(r.json, "publisher_id")));
	trk_reply_fini(&r);
	json_decref(mj);
	json_decref(tj);
	trk_client_free(sync);

	b.nodes = calloc(b.nnodes, sizeof(*b.nodes));
	if (b.nodes == NULL)
		return 1;
	for (uint32_t i = 0; i < b.nnodes; i++) {
		b.nodes[i].rank = i % RANKS;
		if (i % b.per_client == 0) {
			if (trk_client_new(b.base, url, NULL, &b.nodes[i].c, &err) != 0)
				return 1;
			trk_client_set_timeout(b.nodes[i].c, 30000);
			/* Sources answers (a member list of 1 000 ids per parcel)
			 * are not read here: parsing them was most of this
			 * process's work, which would then measure itself. */
			trk_client_set_parse_max(b.nodes[i].c, 4096);
			if (trk_client_new(b.wbase, url, NULL, &b.nodes[i].wc, &err) != 0)
				return 1;
			trk_client_set_timeout(b.nodes[i].wc, 30000);
		} else {
			b.nodes[i].c = b.nodes[i - i % b.per_client].c;
		}
	}
	struct timeval tick = {0, TICK_MS * 1000}, phase = {0, 100000};
	b.tick = event_new(b.base, -1, EV_PERSIST, on_tick, &b);
	b.pub_ev = event_new(b.base, -1, EV_PERSIST, on_phase, &b);
	event_add(b.tick, &tick);
	event_add(b.pub_ev, &phase);
	struct timeval pub_every = {(time_t)(proto_param(PROTO_PARAM_LEASE_MS) / 3000),
				    (suseconds_t)(proto_param(PROTO_PARAM_LEASE_MS) / 3 % 1000) * 1000};
	b.pub_hb = event_new(b.base, -1, EV_PERSIST, on_pub_heartbeat, &b);
	event_add(b.pub_hb, &pub_every);

	if (getenv("TESSERA_BENCH_TRACE") != NULL &&
	    (b.trace = fopen(getenv("TESSERA_BENCH_TRACE"), "w")) != NULL) {
		struct timeval ms = {0, 1000};
		b.lag_ev = event_new(b.base, -1, EV_PERSIST, on_lag, &b);
		event_add(b.lag_ev, &ms);
	}
	b.wtick = event_new(b.wbase, -1, EV_PERSIST, on_wtick, &b);
	event_add(b.wtick, &tick);
	pthread_t wthr;
	pthread_create(&wthr, NULL, watch_main, &b);
	struct probe pr = {.url = url, .b = &b, .tracker = tracker.pid};
	pthread_t thr;
	pthread_create(&thr, NULL, probe_main, &pr);
	printf("bench_tracker: %u nodes in %u replicas of %s, %u node(s) per tracker client (%s), lease %" PRIu64
	       " ms (heartbeat every %" PRIu64 " ms), watch %" PRIu64 " ms, a version every %d ms, %u s "
	       "measured\n",
	       b.nnodes, b.nnodes / RANKS, lname, b.per_client,
	       b.per_client > 1 ? "one heartbeat per host" : "one heartbeat per node",
	       proto_param(PROTO_PARAM_LEASE_MS),
	       proto_param(PROTO_PARAM_LEASE_MS) / 3, proto_param(PROTO_PARAM_WATCH_MS),
	       VERSION_EVERY_MS, b.seconds);
	fflush(stdout);
	b.start_ns = proto_now_ns();
	event_base_dispatch(b.base);
	pthread_join(thr, NULL);
	pthread_join(wthr, NULL);

	/* The status outputs again with the load stopped (the nodes' leases
	 * still run): their own cost, as the tracker's CPU time per render,
	 * apart from the queue they wait in under load. */
	double idle_page[IDLE_RENDERS], idle_status[IDLE_RENDERS], cpu_page = 0, cpu_status = 0;
	size_t idle_bytes;
	struct trk_client *q;
	if (trk_client_new(NULL, url, NULL, &q, &err) != 0)
		return 1;
	trk_client_set_timeout(q, 60000);
	for (int i = 0; i < IDLE_RENDERS; i++) {
		double c0 = proc_cpu_s(tracker.pid);
		idle_page[i] = timed_get(q, "/", &idle_bytes);
		double c1 = proc_cpu_s(tracker.pid);
		idle_status[i] = timed_get(q, TRK_API "/status", &idle_bytes);
		cpu_page += c1 - c0;
		cpu_status += proc_cpu_s(tracker.pid) - c1;
	}
	trk_client_free(q);

	uint64_t rss = rss_kib(tracker.pid);
	double reg_s = (double)(b.reg_done_ns - b.start_ns) / 1e9;
	uint64_t watching = 0;
	for (uint32_t i = 0; i < b.nnodes; i++)
		watching += b.nodes[i].watching;
	printf("registration: %u of %u nodes in %.2f s (%.0f/s), %u refused%s\n", b.registered,
	       b.nnodes, reg_s, b.registered / (reg_s > 0 ? reg_s : 1), b.reg_failed,
	       b.reg_next < b.nnodes || b.registered < b.nnodes
		       ? " (incomplete when measuring began: saturated)"
		       : "");
	double served = pr.window_s > 0 ? (double)(pr.answers1 - pr.answers0) / pr.window_s : 0;
	double trk_cpu = pr.trk_cpu1 - pr.trk_cpu0, gen_cpu = pr.gen_cpu1 - pr.gen_cpu0;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	printf("served: %.0f requests/s over %.1f s (the tracker's own answer counters); "
	       "connections accepted: %.1f/s\n",
	       served, pr.window_s,
	       pr.window_s > 0 ? (double)(pr.accepted1 - pr.accepted0) / pr.window_s : 0);
	/* CPU time per request does not depend on how much of the machine the
	 * tracker got: the figure to compare between runs on a shared host. */
	printf("tracker CPU: %.0f%% of one core, %.1f us per request served (at most %.0f "
	       "requests/s per core at this mix)\n",
	       pr.window_s > 0 ? 100 * trk_cpu / pr.window_s : 0,
	       served > 0 ? 1e6 * trk_cpu / (served * pr.window_s) : 0,
	       trk_cpu > 0 ? served * pr.window_s / trk_cpu : 0);
	/* Time the tracker was ready to run but had no CPU: on a shared
	 * machine, what other work added to every figure below. */
	printf("tracker waited for a CPU: %.2f s of the %.1f s (%.1f ms per second)\n",
	       pr.trk_wait1 - pr.trk_wait0, pr.window_s,
	       pr.window_s > 0 ? 1e3 * (pr.trk_wait1 - pr.trk_wait0) / pr.window_s : 0);
	printf("load generator CPU: %.0f%% of one core (%.1f us per request); machine: %ld cores, "
	       "load average %.1f\n",
	       pr.window_s > 0 ? 100 * gen_cpu / pr.window_s : 0,
	       served > 0 ? 1e6 * gen_cpu / (served * pr.window_s) : 0, ncpu, pr.load1);
	/* None answered in the window is no evidence of speed. */
	printf("%s: %zu, p50 %.2f ms, p99 %.2f ms (goal p99 < 20 ms: %s)\n",
	       b.per_client > 1 ? "host heartbeats" : "heartbeats", b.hb.n,
	       pct_ms(&b.hb, 0.5), pct_ms(&b.hb, 0.99),
	       b.hb.n == 0 ? "MISSED, none answered" : pct_ms(&b.hb, 0.99) < 20 ? "met" : "MISSED");
	printf("%s: %zu, p50 %.2f ms, p99 %.2f ms (goal p99 < 20 ms: %s)\n",
	       b.per_client > 1 ? "sources (one query per host)" : "sources", b.src.n,
	       pct_ms(&b.src, 0.5), pct_ms(&b.src, 0.99),
	       b.src.n == 0 ? "MISSED, none answered" : pct_ms(&b.src, 0.99) < 20 ? "met" : "MISSED");
	printf("after the first %d s: heartbeats %zu, p50 %.2f ms, p99 %.2f ms; sources %zu, p50 %.2f "
	       "ms, p99 %.2f ms\n",
	       LATE_S, b.hb_late.n, pct_ms(&b.hb_late, 0.5), pct_ms(&b.hb_late, 0.99), b.src_late.n,
	       pct_ms(&b.src_late, 0.5), pct_ms(&b.src_late, 0.99));
	printf("sources answers: %.1f MB in all, %.1f KB each (members lists %s, sent only when "
	       "the asker's tag is not current)\n",
	       (double)b.src_bytes / 1e6, b.src.n ? (double)b.src_bytes / 1e3 / (double)b.src.n : 0,
	       b.unshared ? "whole per rank" : "shared per batch");
	printf("watches (%s): %" PRIu64 " answered, %" PRIu64 " open at the end; versions published: %" PRIu64 "\n",
	       b.per_client > 1 ? "one per host" : "one per node",
	       b.watch_answers, watching, b.version);
	printf("leases lost (heartbeat answered 404, node registered again): %u", b.expired);
	if (b.expired > 0)
		printf(" (the first %.1f s, the last %.1f s after measuring began)",
		       ((double)b.expired_first_ns - (double)b.reg_done_ns) / 1e9,
		       ((double)b.expired_last_ns - (double)b.reg_done_ns) / 1e9);
	printf("\n");
	printf("load generator: %u requests skipped (more than %d in flight), %u errors\n", b.skipped,
	       INFLIGHT_MAX, b.errors);
	printf("tracker memory: %.1f MiB RSS\n", (double)rss / 1024.0);
	printf("status page: %.1f ms median of 3 (%zu bytes); /api/v1/status: %.1f ms (%zu bytes) "
	       "(goal < 200 ms: %s)\n",
	       median3(pr.page_ms), pr.page_bytes, median3(pr.status_ms), pr.status_bytes,
	       median3(pr.page_ms) < 200 && median3(pr.status_ms) < 200 && pr.page_ms[0] >= 0 &&
			       pr.status_ms[0] >= 0
		       ? "met"
		       : "MISSED");

	qsort(idle_page, IDLE_RENDERS, sizeof(double), cmp_double);
	qsort(idle_status, IDLE_RENDERS, sizeof(double), cmp_double);
	printf("status, load stopped: page %.1f ms, /api/v1/status %.1f ms (medians of %d); tracker CPU "
	       "%.1f ms and %.1f ms per render (averaged: clock ticks of 10 ms)\n",
	       idle_page[IDLE_RENDERS / 2], idle_status[IDLE_RENDERS / 2], IDLE_RENDERS,
	       1e3 * cpu_page / IDLE_RENDERS, 1e3 * cpu_status / IDLE_RENDERS);

	event_free(b.tick);
	event_free(b.pub_ev);
	event_free(b.pub_hb);
	if (b.lag_ev != NULL)
		event_free(b.lag_ev);
	if (b.trace != NULL)
		fclose(b.trace);
	event_free(b.wtick);
	for (uint32_t i = 0; i < b.nnodes; i += b.per_client) {
		trk_client_free(b.nodes[i].c);
		trk_client_free(b.nodes[i].wc);
	}
	trk_client_free(b.c);
	event_base_free(b.base);
	event_base_free(b.wbase);
	node_proc_stop(&tracker, 5000);
	free(b.nodes);
	free(b.hb.v);
	free(b.src.v);
	free(b.hb_late.v);
	free(b.src_late.v);
	json_decref(b.sl_json);
	proto_plan_fini(&b.plan);
	proto_layout_fini(&b.tl);
	proto_layout_fini(&b.sl);
	proto_model_fini(&b.m);
	sodium_memzero(b.sk, sizeof(b.sk));
	if (getenv("TESSERA_BENCH_KEEP") == NULL)
		tu_rmtree(dir);
	else
		printf("kept %s\n", dir);
	return 0;
}
