/* Tests of the tracker against a real evhttp server on loopback: auth, bad
 * input (and the tests/data/tracker-bad-* corpus), registration, leases,
 * the version log and its restart, long-polls, derived replica state,
 * offers and sources, the status page and metrics, the client, the binary. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/thread.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <sodium.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

#include "proto/proto.h"
#include "tests/testutil.h"
#include "tracker/tracker.h"

/* ---- the model and layouts every test uses --------------------------------- */

static const char MODEL[] =
	"{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[8,8]},"
	"{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[8]}]}";
static const char TRAINER[] = "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"split\":0}]}";
static const char TP2[] = "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"split\":1},"
			  "{\"tensor\":\"b\",\"replicate\":true}]}";
static const char TP2_ROWS[] = "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"split\":0},"
			       "{\"tensor\":\"b\",\"replicate\":true}]}";
static const char TP1[] = "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}";
/* Half of W and no b: parses, but does not cover the model. */
static const char PARTIAL[] =
	"{\"ranks\":[{\"tensors\":[{\"name\":\"W\",\"concat_dim\":0,"
	"\"pieces\":[{\"tensor\":\"W\",\"box\":[[0,4],[0,8]]}]}]}]}";

#define HEX(b) hex_of(b, PROTO_HASH_BYTES)

static const char *hex_of(const uint8_t *b, size_t n)
{
	static char bufs[8][2 * 64 + 1];
	static int at;
	char *s = bufs[at++ % 8];
	sodium_bin2hex(s, 2 * n + 1, b, n);
	return s;
}

/* ---- a tracker on its own thread --------------------------------------------- */

struct srv {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool ready;
	int rc;
	struct proto_err err;
	struct event_base *base;
	struct trk_server *s;
	char url[300];
	char state[4096];
	char listen[64]; /* "" : 127.0.0.1:0 */
	bool with_key, with_pk;
	atomic_bool stop;
	uint8_t ckey[PROTO_CLUSTER_KEY_BYTES];
	uint8_t pk[PROTO_PK_BYTES];
};

static void *srv_main(void *arg)
{
	struct srv *v = arg;
	struct trk_server_opts o = {.listen = v->listen[0] ? v->listen : "127.0.0.1:0",
				    .state_dir = v->state};
	struct trk_server *s = NULL;
	int rc;

	o.cluster_key = v->with_key ? v->ckey : NULL;
	o.trainer_pk = v->with_pk ? v->pk : NULL;
	v->base = event_base_new();
	rc = v->base ? trk_server_new(v->base, &o, &s, &v->err) : -ENOMEM;
	pthread_mutex_lock(&v->mu);
	v->rc = rc;
	v->s = s;
	if (s != NULL)
		snprintf(v->url, sizeof(v->url), "%s", trk_server_url(s));
	v->ready = true;
	pthread_cond_signal(&v->cv);
	pthread_mutex_unlock(&v->mu);
	/* A loopbreak that lands before the loop starts is forgotten by
	 * libevent, so the stop flag is checked around every pass; the
	 * tracker's own timers bound how long one pass can block. */
	while (rc == 0 && !atomic_load(&v->stop))
		event_base_loop(v->base, EVLOOP_ONCE);
	trk_server_free(s);
	if (v->base != NULL)
		event_base_free(v->base);
	v->base = NULL;
	return NULL;
}

/* Starts a tracker on state; returns its trk_server_new result. */
static int srv_start(struct srv *v)
{
	v->ready = false;
	atomic_store(&v->stop, false);
	pthread_mutex_init(&v->mu, NULL);
	pthread_cond_init(&v->cv, NULL);
	assert_int_equal(pthread_create(&v->th, NULL, srv_main, v), 0);
	pthread_mutex_lock(&v->mu);
	while (!v->ready)
		pthread_cond_wait(&v->cv, &v->mu);
	pthread_mutex_unlock(&v->mu);
	if (v->rc != 0)
		pthread_join(v->th, NULL);
	return v->rc;
}

static void srv_stop(struct srv *v)
{
	/* Break first: the thread frees the base once it sees stop. A break
	 * that lands between passes is forgotten, and the pass after it, bounded
	 * by the tracker's timers, sees stop. */
	event_base_loopbreak(v->base); /* thread-safe: evthread_use_pthreads */
	atomic_store(&v->stop, true);
	pthread_join(v->th, NULL);
	pthread_mutex_destroy(&v->mu);
	pthread_cond_destroy(&v->cv);
}

/* ---- the fixture --------------------------------------------------------------- */

struct fx {
	char dir[4096];
	struct srv srv;
	struct trk_client *c;
	struct proto_model model;
	struct proto_layout tl, tp2, tp1;
	uint8_t sk[PROTO_SK_BYTES], pk[PROTO_PK_BYTES];
	char pub_id[TRK_ID_MAX];
	uint8_t d1[PROTO_HASH_BYTES], d2[PROTO_HASH_BYTES]; /* version digests */
};

static int fx_setup(void **state, bool with_key)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct proto_err err = {{0}};

	if (f == NULL || tu_mkdtemp(f->dir, sizeof(f->dir)) == NULL)
		return -1;
	snprintf(f->srv.state, sizeof(f->srv.state), "%s/state", f->dir);
	if (with_key) {
		crypto_auth_keygen(f->srv.ckey);
		f->srv.with_key = true;
	}
	crypto_sign_keypair(f->pk, f->sk);
	if (proto_model_parse(MODEL, strlen(MODEL), "model", &f->model, &err) != 0 ||
	    proto_layout_parse(&f->model, TRAINER, strlen(TRAINER), "tl", &f->tl, &err) != 0 ||
	    proto_layout_parse(&f->model, TP2, strlen(TP2), "tp2", &f->tp2, &err) != 0 ||
	    proto_layout_parse(&f->model, TP1, strlen(TP1), "tp1", &f->tp1, &err) != 0) {
		fprintf(stderr, "fixture: %s\n", err.msg);
		return -1;
	}
	if (srv_start(&f->srv) != 0) {
		fprintf(stderr, "tracker: %s\n", f->srv.err.msg);
		return -1;
	}
	if (trk_client_new(NULL, f->srv.url, with_key ? f->srv.ckey : NULL, &f->c, &err) != 0)
		return -1;
	*state = f;
	return 0;
}

static int setup_open(void **state)
{
	return fx_setup(state, false);
}

static int setup_keyed(void **state)
{
	return fx_setup(state, true);
}

static int teardown(void **state)
{
	struct fx *f = *state;

	trk_client_free(f->c);
	if (f->srv.base != NULL)
		srv_stop(&f->srv);
	proto_layout_fini(&f->tl);
	proto_layout_fini(&f->tp2);
	proto_layout_fini(&f->tp1);
	proto_model_fini(&f->model);
	tu_rmtree(f->dir);
	free(f);
	return 0;
}

/* ---- calls ---------------------------------------------------------------------- */

/* Every error answer is a one-line JSON object {"error":"..."}. */
static void check_error_body(const struct trk_reply *r)
{
	assert_non_null(r->json);
	assert_true(json_is_object(r->json));
	const char *e = json_string_value(json_object_get(r->json, "error"));
	assert_non_null(e);
	assert_true(strlen(e) > 0);
	assert_null(strchr(e, '\n'));
	assert_int_equal(json_object_size(r->json), 1);
}

/* POST a JSON text through the client; returns the HTTP status. */
static int post(struct fx *f, const char *path, const char *body, struct trk_reply *r)
{
	assert_int_equal(trk_client_call(f->c, "POST", path, NULL, body, strlen(body), r), 0);
	if (r->status >= 400)
		check_error_body(r);
	return r->status;
}

/* A page's (not the API's) error: one line of text, not JSON. */
static void check_error_line(const struct trk_reply *r)
{
	assert_null(r->json);
	assert_non_null(r->body);
	assert_true(r->len > 1);
	assert_null(memchr(r->body, '{', 1));
	assert_int_equal(r->body[r->len - 1], '\n');
	assert_null(memchr(r->body, '\n', r->len - 1));
}

static int get(struct fx *f, const char *path, struct trk_reply *r)
{
	assert_int_equal(trk_client_call(f->c, "GET", path, NULL, NULL, 0, r), 0);
	if (r->status >= 400 && strncmp(path, "/api/", 5) != 0 && strncmp(path, "/metrics", 8) != 0 &&
	    strncmp(path, "/healthz", 8) != 0)
		check_error_line(r);
	else if (r->status >= 400)
		check_error_body(r);
	return r->status;
}

/* Status JSON without the clock, to compare before/after a refused call. */
static char *status_snapshot(struct fx *f)
{
	struct trk_reply r;
	char *s;

	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_object_del(r.json, "now_ms");
	/* Nor how long replicas have been behind or disagreeing. */
	size_t i;
	json_t *rep;
	json_array_foreach(json_object_get(r.json, "replicas"), i, rep) {
		json_object_del(rep, "lag_ms");
		json_object_del(rep, "disagree_ms");
		/* A replica's state in words moves with the clock (updating
		 * becomes behind, rates and seconds change). */
		json_object_del(rep, "state");
		json_object_del(rep, "why");
		json_object_del(rep, "fetch");
	}
	json_object_del(r.json, "replicas_by_state");
	/* Nor how long ago a publisher's last version came. */
	json_array_foreach(json_object_get(r.json, "publishers"), i, rep) {
		json_object_del(json_object_get(rep, "clock"), "since_last_ms");
		json_object_del(json_object_get(rep, "clock"), "late");
	}
	s = json_dumps(r.json, JSON_SORT_KEYS | JSON_COMPACT);
	trk_reply_fini(&r);
	/* Lease expiry times are not in the status; replay/auth counters are
	 * not either, so equal snapshots mean nothing changed. */
	return s;
}

static uint64_t jget_u64(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	assert_true(json_is_integer(v));
	return (uint64_t)json_integer_value(v);
}

/* ---- raw HTTP for what the client will not send -------------------------------- */

static int url_port(const char *url)
{
	const char *c = strrchr(url, ':');
	return c ? atoi(c + 1) : 0;
}

static int tcp_connect(const char *url)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	sa.sin_port = htons((uint16_t)url_port(url));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

static void write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n <= 0)
			return; /* the server may close early (413) */
		p += n;
		len -= (size_t)n;
	}
}

/* Sends a request (extra headers lines end in \r\n), reads the whole answer;
 * returns the status and the parsed JSON body (or NULL). */
static int raw(struct fx *f, const char *method, const char *uri, const char *headers,
	       const void *body, size_t len, json_t **json)
{
	int fd = tcp_connect(f->srv.url);
	size_t hcap = strlen(uri) + (headers ? strlen(headers) : 0) + 256;
	char *head = malloc(hcap), *resp = NULL;
	size_t got = 0, cap = 0;
	int code = -1, n;

	assert_non_null(head);
	n = snprintf(head, hcap,
		     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s"
		     "Content-Length: %zu\r\n\r\n",
		     method, uri, headers ? headers : "", len);
	assert_true(n > 0 && (size_t)n < hcap);
	write_all(fd, head, (size_t)n);
	free(head);
	write_all(fd, body, len);
	for (;;) {
		if (got + 4096 + 1 > cap) {
			cap = cap ? 2 * cap : 16384;
			resp = realloc(resp, cap);
			assert_non_null(resp);
		}
		ssize_t k = read(fd, resp + got, cap - got - 1);
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	if (resp == NULL)
		return -1;
	resp[got] = 0;
	sscanf(resp, "HTTP/1.%*d %d", &code);
	if (json != NULL) {
		char *b = strstr(resp, "\r\n\r\n");
		*json = b ? json_loads(b + 4, 0, NULL) : NULL;
	}
	free(resp);
	return code;
}

/* The tracker's epoch, from the header of an answer. */
static void fetch_epoch(struct fx *f, char *out, size_t cap)
{
	int fd = tcp_connect(f->srv.url);
	static const char req[] = "GET " TRK_API "/status HTTP/1.1\r\nHost: x\r\n"
				  "Connection: close\r\n\r\n";
	char resp[8192];
	size_t got = 0;
	ssize_t k;
	const char *e;

	write_all(fd, req, sizeof(req) - 1);
	while (got + 1 < sizeof(resp) && (k = read(fd, resp + got, sizeof(resp) - 1 - got)) > 0)
		got += (size_t)k;
	close(fd);
	resp[got] = 0;
	e = strstr(resp, TRK_EPOCH_HEADER ": ");
	assert_non_null(e);
	e += strlen(TRK_EPOCH_HEADER ": ");
	snprintf(out, cap, "%.*s", (int)strcspn(e, "\r\n"), e);
}

static int raw_signed(struct fx *f, const char *uri, const uint8_t *key, uint64_t ts,
		      const char *body, json_t **json)
{
	char auth[256], hdr[320], ep[64];

	fetch_epoch(f, ep, sizeof(ep));
	assert_int_equal(trk_auth_header(key, "POST", uri, ts, ep, (const uint8_t *)body,
					 strlen(body), auth, sizeof(auth)),
			 0);
	snprintf(hdr, sizeof(hdr), "Authorization: %s\r\n", auth);
	return raw(f, "POST", uri, hdr, body, strlen(body), json);
}

/* ---- building requests ---------------------------------------------------------- */

static char *publisher_body(const char *model, const char *layout, const char *ranks)
{
	size_t n = strlen(model) + strlen(layout) + strlen(ranks) + 64;
	char *b = malloc(n);
	assert_non_null(b);
	snprintf(b, n, "{\"model\":%s,\"layout\":%s,\"ranks\":%s}", model, layout, ranks);
	return b;
}

static const char RANKS01[] =
	"[{\"rank\":0,\"host\":\"t0\",\"provider\":\"tcp;ofi_rxm\",\"fabric_addr\":\"aa00\"},"
	"{\"rank\":1,\"host\":\"t1\",\"provider\":\"tcp;ofi_rxm\",\"fabric_addr\":\"aa01\"}]";

static void register_publisher(struct fx *f)
{
	struct trk_reply r;
	char *b = publisher_body(MODEL, TRAINER, RANKS01);

	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 200);
	free(b);
	snprintf(f->pub_id, sizeof(f->pub_id), "%s",
		 json_string_value(json_object_get(r.json, "publisher_id")));
	assert_string_equal(json_string_value(json_object_get(r.json, "model_digest")),
			    HEX(f->model.digest));
	assert_string_equal(json_string_value(json_object_get(r.json, "layout_digest")),
			    HEX(f->tl.digest));
	assert_true(jget_u64(r.json, "lease_ms") > 0);
	trk_reply_fini(&r);
}

static char *node_body(struct fx *f, const char *replica, int rank, const char *host,
		       const char *layout, const uint8_t *model_digest)
{
	size_t n = strlen(layout) + strlen(host) + 512;
	char *b = malloc(n);
	assert_non_null(b);
	snprintf(b, n,
		 "{\"replica\":\"%s\",\"rank\":%d,\"host\":\"%s\",\"provider\":\"tcp;ofi_rxm\","
		 "\"fabric_addr\":\"%02x%02x\",\"layout\":%s,\"model_digest\":\"%s\"}",
		 replica, rank, host, (unsigned)replica[0], (unsigned)rank, layout,
		 HEX(model_digest ? model_digest : f->model.digest));
	return b;
}

static int register_node(struct fx *f, const char *replica, int rank, const char *layout,
			 struct trk_reply *r)
{
	char *b = node_body(f, replica, rank, "h", layout, NULL);
	int code = post(f, TRK_API "/nodes", b, r);
	free(b);
	return code;
}

static void register_node_ok(struct fx *f, const char *replica, int rank, const char *layout)
{
	struct trk_reply r;
	assert_int_equal(register_node(f, replica, rank, layout, &r), 200);
	trk_reply_fini(&r);
}

struct mopts {
	uint64_t version, parent;
	const uint8_t *parent_digest;
	uint64_t created_ms;
	const uint8_t *model_digest, *tl_digest; /* NULL: the fixture's */
	const uint8_t *sk;                       /* NULL: the fixture's */
	bool tp1; /* also a TP1 layout: parcels (s,0) with 200 + s wire bytes */
	bool delta; /* a delta version (parcels delta-encoded) */
};

/* A signed anchor manifest for the TP2 layout: parcels (s,d) for s,d in 0..1
 * with 100 + 2s + d wire bytes. */
static void make_manifest(struct fx *f, const struct mopts *o, uint8_t **buf, size_t *len,
			  uint8_t digest[PROTO_HASH_BYTES])
{
	struct proto_manifest m;
	struct proto_mlayout *l;
	struct proto_err err = {{0}};
	uint8_t plan[PROTO_HASH_BYTES] = {0};

	proto_manifest_init(&m);
	m.version = o->version;
	m.parent_version = o->parent;
	if (o->parent != 0)
		memcpy(m.parent_digest, o->parent_digest, PROTO_HASH_BYTES);
	m.kind = o->delta ? PROTO_KIND_DELTA : PROTO_KIND_ANCHOR;
	memcpy(m.model_digest, o->model_digest ? o->model_digest : f->model.digest,
	       PROTO_HASH_BYTES);
	memcpy(m.src_layout_digest, o->tl_digest ? o->tl_digest : f->tl.digest,
	       PROTO_HASH_BYTES);
	m.created_ms = o->created_ms ? o->created_ms : 1700000000000ull + o->version;
	m.chunk_size = 64;
	l = proto_manifest_add_layout(&m, f->tp2.digest, plan, 4);
	assert_non_null(l);
	for (uint32_t i = 0; i < 4; i++) {
		struct proto_mparcel *p = &l->parcels[i];
		p->src_rank = i / 2;
		p->dst_rank = i % 2;
		p->encoding = o->delta ? PROTO_ENC_DELTA : PROTO_ENC_RAW;
		p->bytes = 100 + i;
		assert_int_equal(proto_mparcel_alloc_chunks(&m, p, 100 + i), 0);
		for (uint32_t c = 0; c < p->nchunks; c++)
			randombytes_buf(p->chunks[c].hash, PROTO_HASH_BYTES);
	}
	if (o->tp1) {
		l = proto_manifest_add_layout(&m, f->tp1.digest, plan, 2);
		assert_non_null(l);
		for (uint32_t i = 0; i < 2; i++) {
			struct proto_mparcel *p = &l->parcels[i];
			p->src_rank = i;
			p->dst_rank = 0;
			p->encoding = PROTO_ENC_RAW;
			p->bytes = 200 + i;
			assert_int_equal(proto_mparcel_alloc_chunks(&m, p, 200 + i), 0);
			for (uint32_t c = 0; c < p->nchunks; c++)
				randombytes_buf(p->chunks[c].hash, PROTO_HASH_BYTES);
		}
	}
	if (proto_manifest_sign(&m, o->sk ? o->sk : f->sk, buf, len, &err) != 0) {
		fprintf(stderr, "sign: %s\n", err.msg);
		fail();
	}
	if (digest != NULL)
		memcpy(digest, m.digest, PROTO_HASH_BYTES);
	proto_manifest_fini(&m);
}

static int publish(struct fx *f, const uint8_t *buf, size_t len, struct trk_reply *r)
{
	assert_int_equal(trk_client_call(f->c, "POST", TRK_API "/versions",
					 "application/octet-stream", buf, len, r),
			 0);
	if (r->status >= 400)
		check_error_body(r);
	return r->status;
}

/* Publishes v1 (parent 0) and v2 (parent v1) into f->d1, f->d2. */
static void publish_two(struct fx *f)
{
	struct trk_reply r;
	uint8_t *buf;
	size_t len;

	make_manifest(f, &(struct mopts){.version = 1}, &buf, &len, f->d1);
	assert_int_equal(publish(f, buf, len, &r), 201);
	assert_int_equal(jget_u64(r.json, "version"), 1);
	trk_reply_fini(&r);
	free(buf);
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1},
		      &buf, &len, f->d2);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
}

static int report(struct fx *f, const char *id, uint64_t v, const char *state,
		  uint64_t from_trainer, struct trk_reply *r)
{
	char b[512];
	snprintf(b, sizeof(b),
		 "{\"id\":\"%s\",\"version\":%llu,\"state\":\"%s\",\"bytes_done\":50,"
		 "\"bytes_total\":100,\"bytes_from_trainer\":%llu,\"bytes_from_peers\":0}",
		 id, (unsigned long long)v, state, (unsigned long long)from_trainer);
	return post(f, TRK_API "/nodes/state", b, r);
}

static void report_ok(struct fx *f, const char *id, uint64_t v, const char *state)
{
	struct trk_reply r;
	assert_int_equal(report(f, id, v, state, 0, &r), 200);
	trk_reply_fini(&r);
}

/* One-parcel offer body. */
static void offer_body(char *b, size_t n, const char *id, int version, const char *layout,
		       int src, int dst, int len)
{
	snprintf(b, n,
		 "{\"id\":\"%s\",\"version\":%d,\"parcels\":[{\"layout\":\"%s\","
		 "\"src_rank\":%d,\"dst_rank\":%d,\"addr\":\"1\",\"key\":\"2\",\"len\":%d}]}",
		 id, version, layout, src, dst, len);
}

static void msleep(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* ---- auth ------------------------------------------------------------------------- */

static void test_auth(void **state)
{
	struct fx *f = *state;
	uint8_t wrong[PROTO_CLUSTER_KEY_BYTES];
	char *body = publisher_body(MODEL, TRAINER, RANKS01), *before, *after;
	const char *uri = TRK_API "/publishers";
	uint64_t now = (uint64_t)time(NULL);
	json_t *j = NULL;
	struct trk_reply r;
	static const char *bad_headers[] = {
		"Authorization: Basic dXNlcjpwYXNz\r\n",
		"Authorization: Tessera\r\n",
		"Authorization: Tessera ts=abc,mac=00\r\n",
		"Authorization: Tessera mac=0000000000000000000000000000000000000000000000000000000000000000\r\n",
		"Authorization: Tessera ts=1,mac=zz\r\n",
		"Authorization: Tessera ts=1,ts=2,mac=00\r\n",
		"Authorization: Tessera ts=1,mac=00,extra=1\r\n",
	};

	crypto_auth_keygen(wrong);
	before = status_snapshot(f);
	/* No header. */
	assert_int_equal(raw(f, "POST", uri, NULL, body, strlen(body), &j), 401);
	assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "authorization"));
	json_decref(j);
	/* Malformed headers. */
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad_headers); i++) {
		assert_int_equal(raw(f, "POST", uri, bad_headers[i], body, strlen(body), &j), 401);
		assert_non_null(json_object_get(j, "error"));
		json_decref(j);
	}
	/* Wrong key, stale and future timestamps, a mac over another URI. */
	assert_int_equal(raw_signed(f, uri, wrong, now, body, NULL), 401);
	assert_int_equal(raw_signed(f, uri, f->srv.ckey, now - 1000, body, &j), 401);
	assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "timestamp"));
	json_decref(j);
	assert_int_equal(raw_signed(f, uri, f->srv.ckey, now + 1000, body, NULL), 401);
	{
		char auth[256], hdr[320], ep[64];
		fetch_epoch(f, ep, sizeof(ep));
		trk_auth_header(f->srv.ckey, "POST", TRK_API "/nodes", now, ep,
				(const uint8_t *)body, strlen(body), auth, sizeof(auth));
		snprintf(hdr, sizeof(hdr), "Authorization: %s\r\n", auth);
		assert_int_equal(raw(f, "POST", uri, hdr, body, strlen(body), NULL), 401);
		/* The body is covered too. */
		assert_int_equal(raw(f, "POST", TRK_API "/nodes", hdr, "{}", 2, NULL), 401);
	}
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);

	/* A good signature is accepted once; the same request again is a replay. */
	assert_int_equal(raw_signed(f, TRK_API "/publishers?n=1", f->srv.ckey, now, body, &j), 200);
	json_decref(j);
	free(before);
	before = status_snapshot(f);
	assert_int_equal(raw_signed(f, TRK_API "/publishers?n=1", f->srv.ckey, now, body, &j), 401);
	assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "replay"));
	json_decref(j);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);

	/* Reads are open; the client signs POSTs (twice the same call in one
	 * second is no replay: the client adds a nonce). */
	assert_int_equal(raw(f, "GET", TRK_API "/status", NULL, "", 0, NULL), 200);
	/* Signed, but the ranks are the live publisher's registered above:
	 * without its session, no taking them over. */
	assert_int_equal(post(f, TRK_API "/publishers", body, &r), 409);
	assert_non_null(strstr(r.error, "is live"));
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"nobody\"}", &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"nobody\"}", &r), 404);
	trk_reply_fini(&r);

	/* A client with the wrong key is refused. */
	struct trk_client *bad;
	struct proto_err err = {{0}};
	assert_int_equal(trk_client_new(NULL, f->srv.url, wrong, &bad, &err), 0);
	assert_int_equal(trk_client_call(bad, "POST", TRK_API "/heartbeat", NULL, "{}", 2, &r), 0);
	assert_int_equal(r.status, 401);
	assert_non_null(strstr(r.error, "401"));
	trk_reply_fini(&r);
	trk_client_free(bad);

	/* Counted in the metrics. */
	assert_int_equal(get(f, "/metrics", &r), 200);
	assert_null(strstr((char *)r.body, "tessera_tracker_auth_refused_requests_total 0\n"));
	trk_reply_fini(&r);
	free(body);
}

/* GET /healthz, shaped as the node's: 200 "ok" while a version can be
 * written to the state directory; 503 with the reason in one line while it
 * cannot (moved away here: the tests run as root, whom permissions do not
 * stop); 200 again once it is back, and the probe leaves no file. */
static void test_healthz(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char gone[4200], want[4200];

	assert_int_equal(trk_client_call(f->c, "GET", "/healthz", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	assert_string_equal((char *)r.body, "ok\n");
	trk_reply_fini(&r);

	snprintf(gone, sizeof(gone), "%s.gone", f->srv.state);
	assert_int_equal(rename(f->srv.state, gone), 0);
	assert_int_equal(trk_client_call(f->c, "GET", "/healthz", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 503);
	snprintf(want, sizeof(want), "state directory %s: cannot create a file: %s\n",
		 f->srv.state, strerror(ENOENT));
	assert_string_equal((char *)r.body, want);
	trk_reply_fini(&r);
	assert_int_equal(rename(gone, f->srv.state), 0);
	assert_int_equal(trk_client_call(f->c, "GET", "/healthz", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	assert_int_equal(tu_sh("test -z \"$(ls -A '%s/versions')\"", f->srv.state), 0);
	/* GET only. */
	assert_int_equal(post(f, "/healthz", "{}", &r), 405);
	trk_reply_fini(&r);
}

/* ---- bad input ------------------------------------------------------------------- */

/* Replaces each "@NAME@" in s by its value. Returns a new string. */
static char *subst(const char *s, const char *const *kv, size_t nkv)
{
	size_t cap = strlen(s) * 4 + 1024, at = 0;
	char *o = malloc(cap);
	assert_non_null(o);
	while (*s) {
		bool done = false;
		for (size_t i = 0; i + 1 < nkv && !done; i += 2) {
			size_t kl = strlen(kv[i]);
			if (strncmp(s, kv[i], kl) == 0) {
				size_t vl = strlen(kv[i + 1]);
				assert_true(at + vl < cap);
				memcpy(o + at, kv[i + 1], vl);
				at += vl;
				s += kl;
				done = true;
			}
		}
		if (!done) {
			assert_true(at + 1 < cap);
			o[at++] = *s++;
		}
	}
	o[at] = 0;
	return o;
}

/* A tracker with a model, two versions, replica A (TP2) and a publisher. */
static void populate(struct fx *f)
{
	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
}

/*
 * tests/data/tracker-bad-<route>-<case>.json: bodies every route must refuse
 * with 400 and a one-line error, changing nothing. <route> is publishers,
 * nodes, heartbeat, state (nodes/state) or offers. @MODEL@, @TL@, @TP2@ and
 * @PUB@ stand for the model and layout digests and the publisher id.
 */
static void test_bad_corpus(void **state)
{
	struct fx *f = *state;
	static const struct {
		const char *prefix, *path;
	} routes[] = {
		{"tracker-bad-publishers-", TRK_API "/publishers"},
		{"tracker-bad-nodes-", TRK_API "/nodes"},
		{"tracker-bad-heartbeat-", TRK_API "/heartbeat"},
		{"tracker-bad-state-", TRK_API "/nodes/state"},
		{"tracker-bad-offers-", TRK_API "/offers"},
		{"tracker-bad-sources-", TRK_API "/sources"},
	};
	char dir[4096], p[4096], *before;
	struct dirent *e;
	size_t seen[PROTO_ARRAY_LEN(routes)] = {0};
	DIR *d;

	populate(f);
	const char *kv[] = {"@MODEL@", HEX(f->model.digest), "@TL@", HEX(f->tl.digest),
			    "@TP2@", HEX(f->tp2.digest), "@PUB@", f->pub_id};
	before = status_snapshot(f);
	d = opendir(tu_data(dir, sizeof(dir), ""));
	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		for (size_t i = 0; i < PROTO_ARRAY_LEN(routes); i++) {
			uint8_t *buf;
			size_t len;
			struct proto_err err = {{0}};
			struct trk_reply r;
			char *body;
			if (strncmp(e->d_name, routes[i].prefix, strlen(routes[i].prefix)) != 0)
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			assert_int_equal(proto_read_file(p, 1 << 20, &buf, &len, &err), 0);
			body = subst((char *)buf, kv, PROTO_ARRAY_LEN(kv));
			if (post(f, routes[i].path, body, &r) != 400)
				fail_msg("%s: got %d (%s), want 400", e->d_name, r.status, r.body);
			trk_reply_fini(&r);
			free(body);
			free(buf);
			seen[i]++;
		}
	}
	closedir(d);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(routes); i++)
		if (seen[i] < 3)
			fail_msg("too few corpus files for %s", routes[i].prefix);
	char *after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);
}

/* Requests the API refuses: a POST when body is set, else a GET. */
static const struct bad_request {
	const char *path, *body;
	int status;
} bad_requests[] = {
	{TRK_API "/nope", NULL, 404},
	{TRK_API "/nodes", NULL, 405},
	{TRK_API "/status", "{}", 405},
	{TRK_API "/versions?after=abc", NULL, 400},
	{TRK_API "/versions?after=-1", NULL, 400},
	{TRK_API "/versions/abc/manifest", NULL, 400},
	{TRK_API "/versions/0/manifest", NULL, 400},
	{TRK_API "/versions/99/manifest", NULL, 404},
	{TRK_API "/versions/1/other", NULL, 404},
	{"/versions/abc", NULL, 400},
	{"/versions/0", NULL, 400},
	{"/versions/09", NULL, 400},
	{"/versions/00", NULL, 400},
	{"/versions/+9", NULL, 400},
	{"/versions/99999999999999999999", NULL, 400},
	{"/versions/99", NULL, 404},
	{"/versions/1/x", NULL, 404},
	{TRK_API "/replicas/Z", NULL, 404},
	{TRK_API "/replicas/%3Cx%3E", NULL, 404},
	{TRK_API "/sources?version=1", NULL, 400},
	{TRK_API "/sources?version=1&layout=zz&src_rank=0&dst_rank=0", NULL, 400},
};

/* Bodies that are not JSON objects, too big, or broken in transport. */
static void test_bad_bodies(void **state)
{
	struct fx *f = *state;
	static const char *bodies[] = {
		"", "not json", "[]", "[1,2]", "\"s\"", "42", "null", "{", "{\"a\":1,\"a\":2}",
		"{\"id\":\"x\"} trailing", "{\"id\":\"\xff\xfe\"}",
	};
	static const char *paths[] = {TRK_API "/publishers", TRK_API "/nodes",
				      TRK_API "/heartbeat", TRK_API "/nodes/state",
				      TRK_API "/offers"};
	char *before, *after, *big;
	struct trk_reply r;
	json_t *j;

	populate(f);
	before = status_snapshot(f);
	for (size_t p = 0; p < PROTO_ARRAY_LEN(paths); p++)
		for (size_t i = 0; i < PROTO_ARRAY_LEN(bodies); i++) {
			assert_int_equal(trk_client_call(f->c, "POST", paths[p], NULL, bodies[i],
							 strlen(bodies[i]), &r),
					 0);
			if (r.status != 400)
				fail_msg("%s %s: got %d", paths[p], bodies[i], r.status);
			check_error_body(&r);
			trk_reply_fini(&r);
		}
	/* Over the JSON cap: 413 before anything is parsed. */
	big = malloc(TRK_JSON_MAX + 2);
	assert_non_null(big);
	memset(big, ' ', TRK_JSON_MAX + 1);
	big[0] = '{';
	big[TRK_JSON_MAX] = '}';
	big[TRK_JSON_MAX + 1] = 0;
	assert_int_equal(trk_client_call(f->c, "POST", TRK_API "/nodes", NULL, big,
					 TRK_JSON_MAX + 1, &r),
			 0);
	assert_int_equal(r.status, 413);
	check_error_body(&r);
	trk_reply_fini(&r);
	free(big);
	/* Garbage instead of a manifest. */
	assert_int_equal(publish(f, (const uint8_t *)"garbage", 7, &r), 400);
	trk_reply_fini(&r);
	/* Unknown endpoints, wrong methods, bad queries and path parameters. */
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad_requests); i++) {
		const struct bad_request *q = &bad_requests[i];
		int code = q->body ? post(f, q->path, q->body, &r) : get(f, q->path, &r);
		if (code != q->status)
			fail_msg("%s %s: got %d, want %d", q->body ? "POST" : "GET", q->path, code,
				 q->status);
		trk_reply_fini(&r);
	}
	/* Raw protocol abuse: bad method, header flood; the server survives. */
	assert_int_equal(raw(f, "DELETE", TRK_API "/status", NULL, "", 0, NULL), 405);
	{
		size_t n = 40000;
		char *h = malloc(n + 32);
		assert_non_null(h);
		memcpy(h, "X-Big: ", 7);
		memset(h + 7, 'a', n);
		memcpy(h + 7 + n, "\r\n", 3);
		int code = raw(f, "GET", TRK_API "/status", h, "", 0, NULL);
		assert_true(code == -1 || code >= 400);
		free(h);
	}
	assert_int_equal(raw(f, "GET", TRK_API "/status", NULL, "", 0, &j), 200);
	json_decref(j);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);
}

/* ---- registration ----------------------------------------------------------------- */

static void test_register(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	uint8_t other[PROTO_HASH_BYTES];
	char *b;

	/* No model yet: nodes are told to retry. */
	assert_int_equal(register_node(f, "A", 0, TP2, &r), 409);
	assert_non_null(strstr(r.error, "no model"));
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/layouts", &r), 404);
	trk_reply_fini(&r);
	register_publisher(f);

	/* A layout that does not cover the model. */
	assert_int_equal(register_node(f, "A", 0, PARTIAL, &r), 400);
	assert_non_null(strstr(r.error, "does not cover"));
	trk_reply_fini(&r);
	/* Another model. */
	memset(other, 0x42, sizeof(other));
	b = node_body(f, "A", 0, "h", TP2, other);
	assert_int_equal(post(f, TRK_API "/nodes", b, &r), 409);
	assert_non_null(strstr(r.error, "model_digest"));
	trk_reply_fini(&r);
	free(b);
	/* A layout that does not parse against the model. */
	assert_int_equal(register_node(f, "A", 0, "{\"ranks\":2,\"tensors\":[{\"tensor\":\"nope\",\"split\":0}]}",
				       &r),
			 400);
	trk_reply_fini(&r);
	/* Rank out of range. */
	assert_int_equal(register_node(f, "A", 2, TP2, &r), 400);
	assert_non_null(strstr(r.error, "rank"));
	trk_reply_fini(&r);

	register_node_ok(f, "A", 0, TP2);
	assert_int_equal(register_node(f, "A", 0, TP2, &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "node_id")), "A/0");
	assert_string_equal(json_string_value(json_object_get(r.json, "layout_digest")),
			    HEX(f->tp2.digest));
	trk_reply_fini(&r);
	/* Rank 1 of A with another layout. */
	assert_int_equal(register_node(f, "A", 1, TP2_ROWS, &r), 409);
	assert_non_null(strstr(r.error, "another layout"));
	trk_reply_fini(&r);
	register_node_ok(f, "A", 1, TP2);
	register_node_ok(f, "B", 0, TP1);
	/* Shorthand and explicit forms of one layout are one layout. */
	json_t *explicit = proto_layout_to_json(&f->model, &f->tp1);
	char *etxt = json_dumps(explicit, JSON_COMPACT);
	register_node_ok(f, "C", 0, etxt);
	free(etxt);
	json_decref(explicit);

	assert_int_equal(get(f, TRK_API "/layouts", &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "model_digest")),
			    HEX(f->model.digest));
	assert_string_equal(json_string_value(json_object_get(r.json, "trainer_layout_digest")),
			    HEX(f->tl.digest));
	assert_true(json_is_object(json_object_get(r.json, "model")));
	assert_true(json_is_array(json_object_get(json_object_get(r.json, "trainer_layout"),
						  "ranks")));
	json_t *ls = json_object_get(r.json, "layouts"), *e;
	size_t i;
	assert_int_equal(json_array_size(ls), 2);
	json_array_foreach(ls, i, e) {
		const char *d = json_string_value(json_object_get(e, "digest"));
		size_t nrep = json_array_size(json_object_get(e, "replicas"));
		if (strcmp(d, HEX(f->tp2.digest)) == 0)
			assert_int_equal(nrep, 1);
		else
			assert_string_equal(d, HEX(f->tp1.digest)), assert_int_equal(nrep, 2);
		/* The layout is given in explicit form and parses back. */
		struct proto_layout back;
		struct proto_err err = {{0}};
		assert_int_equal(proto_layout_from_json(&f->model, json_object_get(e, "layout"),
							"l", &back, &err),
				 0);
		assert_string_equal(HEX(back.digest), d);
		proto_layout_fini(&back);
	}
	trk_reply_fini(&r);

	assert_int_equal(get(f, TRK_API "/replicas/A", &r), 200);
	assert_int_equal(jget_u64(r.json, "nranks"), 2);
	assert_int_equal(json_array_size(json_object_get(r.json, "ranks")), 2);
	assert_string_equal(json_string_value(json_object_get(
				    json_array_get(json_object_get(r.json, "ranks"), 1), "id")),
			    "A/1");
	trk_reply_fini(&r);

	/* A second publisher process serving other ranks of the same trainer. */
	b = publisher_body(MODEL, TRAINER,
			   "[{\"rank\":1,\"host\":\"t1b\",\"provider\":\"tcp\",\"fabric_addr\":\"bb\"}]");
	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 200);
	trk_reply_fini(&r);
	free(b);
	/* A different trainer layout while publishers are live. */
	b = publisher_body(MODEL, "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
			   "[{\"rank\":0,\"host\":\"t\",\"provider\":\"tcp\",\"fabric_addr\":\"bb\"}]");
	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 409);
	trk_reply_fini(&r);
	free(b);
	/* Publisher rank out of the trainer layout's range. */
	b = publisher_body(MODEL, TRAINER,
			   "[{\"rank\":2,\"host\":\"t\",\"provider\":\"tcp\",\"fabric_addr\":\"bb\"}]");
	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 400);
	trk_reply_fini(&r);
	free(b);
}

/* ---- the layout cache ----------------------------------------------------------- */

/* The value of one metrics line (name with labels), which must be there. */
static uint64_t metric_of(struct fx *f, const char *name)
{
	struct trk_reply r;
	char want[256];
	uint64_t v = 0;

	assert_int_equal(get(f, "/metrics", &r), 200);
	snprintf(want, sizeof(want), "\n%s ", name);
	const char *at = strstr((const char *)r.body, want);
	if (at == NULL)
		fail_msg("no metric %s", name);
	v = strtoull(at + strlen(want), NULL, 10);
	trk_reply_fini(&r);
	return v;
}

#define HITS "tessera_tracker_layout_cache_lookups_total{result=\"hit\"}"
#define MISSES "tessera_tracker_layout_cache_lookups_total{result=\"miss\"}"

/* Registers replica/0 with layout; returns the digest answered. */
static void register_digest(struct fx *f, const char *replica, const char *layout, char *out)
{
	struct trk_reply r;
	assert_int_equal(register_node(f, replica, 0, layout, &r), 200);
	snprintf(out, 2 * PROTO_HASH_BYTES + 1, "%s",
		 json_string_value(json_object_get(r.json, "layout_digest")));
	trk_reply_fini(&r);
}

static void test_layout_cache(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char d[2 * PROTO_HASH_BYTES + 1], first_err[600], name[16], form[160];
	static const char BADPARSE[] = "{\"ranks\":2,\"tensors\":[{\"tensor\":\"nope\",\"split\":0}]}";
	json_t *explicit = proto_layout_to_json(&f->model, &f->tp2);
	char *etxt = json_dumps(explicit, JSON_COMPACT), *etxt_ws = json_dumps(explicit, JSON_INDENT(3));
	uint64_t hits, misses;

	register_publisher(f);
	assert_int_equal(metric_of(f, HITS), 0);
	assert_int_equal(metric_of(f, MISSES), 0);

	/* A bad layout is refused the same way on first and on repeated use, and
	 * is never remembered. */
	const char *bad[] = {PARTIAL, BADPARSE};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++)
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "bad%zu%d", i, k);
			assert_int_equal(register_node(f, name, 0, bad[i], &r), 400);
			if (k == 0)
				snprintf(first_err, sizeof(first_err), "%s", r.error);
			else
				assert_string_equal(r.error, first_err);
			if (i == 0)
				assert_non_null(strstr(r.error, "layout does not cover the model: "));
			trk_reply_fini(&r);
		}
	assert_int_equal(metric_of(f, HITS), 0);
	assert_int_equal(metric_of(f, MISSES), 6);

	/* The same form again (even written otherwise: an equal JSON value) is a
	 * hit, and gives what a fresh parse gave. */
	register_digest(f, "A", etxt, d);
	assert_string_equal(d, HEX(f->tp2.digest));
	assert_int_equal(metric_of(f, MISSES), 7);
	register_node_ok(f, "A", 1, etxt);
	register_digest(f, "B", etxt_ws, d);
	assert_string_equal(d, HEX(f->tp2.digest));
	assert_int_equal(metric_of(f, HITS), 2);
	assert_int_equal(metric_of(f, MISSES), 7);
	/* Another form of the same layout is parsed once, then cached too. */
	register_digest(f, "C", TP2, d);
	assert_string_equal(d, HEX(f->tp2.digest));
	register_digest(f, "D", TP2, d);
	assert_string_equal(d, HEX(f->tp2.digest));
	assert_int_equal(metric_of(f, HITS), 3);
	assert_int_equal(metric_of(f, MISSES), 8);
	/* A form differing in one value is another layout. */
	register_digest(f, "E", TP2_ROWS, d);
	assert_string_not_equal(d, HEX(f->tp2.digest));
	assert_int_equal(metric_of(f, MISSES), 9);
	/* Rank checks and layout conflicts hold on a hit as on a miss. */
	assert_int_equal(register_node(f, "B", 2, etxt, &r), 400);
	assert_non_null(strstr(r.error, "rank"));
	trk_reply_fini(&r);
	assert_int_equal(register_node(f, "E", 1, TP2, &r), 409);
	assert_non_null(strstr(r.error, "another layout"));
	trk_reply_fini(&r);
	/* One shared layout for A..D, the same as before the cache. */
	assert_int_equal(get(f, TRK_API "/layouts", &r), 200);
	json_t *ls = json_object_get(r.json, "layouts"), *e;
	size_t i;
	assert_int_equal(json_array_size(ls), 2);
	json_array_foreach(ls, i, e) {
		if (strcmp(json_string_value(json_object_get(e, "digest")), HEX(f->tp2.digest)) == 0) {
			assert_int_equal(json_array_size(json_object_get(e, "replicas")), 4);
			assert_true(json_equal(json_object_get(e, "layout"), explicit));
		}
	}
	trk_reply_fini(&r);

	/* More forms than the cache holds: the least recently used goes (and is
	 * parsed again when it returns), the layouts of replicas stay. */
	for (int n = 1; n <= 20; n++) {
		snprintf(name, sizeof(name), "R%d", n);
		snprintf(form, sizeof(form),
			 "{\"ranks\":%d,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}", n);
		register_digest(f, name, form, d);
	}
	hits = metric_of(f, HITS);
	misses = metric_of(f, MISSES);
	assert_int_equal(misses, 9 + 20);
	register_digest(f, "R20b", form, d); /* the newest: cached */
	assert_int_equal(metric_of(f, HITS), hits + 1);
	register_digest(f, "A2", etxt, d); /* evicted long ago: parsed again */
	assert_string_equal(d, HEX(f->tp2.digest));
	assert_int_equal(metric_of(f, MISSES), misses + 1);
	assert_int_equal(get(f, TRK_API "/layouts", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "layouts")), 2 + 20);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/replicas/R7", &r), 200);
	assert_int_equal(jget_u64(r.json, "nranks"), 7);
	trk_reply_fini(&r);

	free(etxt);
	free(etxt_ws);
	json_decref(explicit);
}

/* A registration body naming its layout by digest instead of carrying it. */
static char *digest_body(struct fx *f, const char *replica, int rank, const char *digest_json,
			 const char *layout)
{
	size_t n = strlen(digest_json) + (layout ? strlen(layout) : 0) + 512;
	char *b = malloc(n);
	assert_non_null(b);
	snprintf(b, n,
		 "{\"replica\":\"%s\",\"rank\":%d,\"host\":\"h\",\"provider\":\"tcp;ofi_rxm\","
		 "\"fabric_addr\":\"%02x%02x\",\"layout_digest\":%s,\"model_digest\":\"%s\"%s%s}",
		 replica, rank, (unsigned)replica[0], (unsigned)rank, digest_json,
		 HEX(f->model.digest), layout ? ",\"layout\":" : "", layout ? layout : "");
	return b;
}

static int register_by_digest(struct fx *f, const char *replica, int rank,
			      const char *digest_json, const char *layout, struct trk_reply *r)
{
	char *b = digest_body(f, replica, rank, digest_json, layout);
	int code = post(f, TRK_API "/nodes", b, r);
	free(b);
	return code;
}

static int client_register(struct fx *f, const char *replica, const uint8_t *digest,
			   struct trk_reply *r)
{
	json_t *layout = json_loads(TP2, 0, NULL);
	struct trk_node_reg reg = {
		.replica = replica,
		.addr = {.rank = 0, .host = "h0", .provider = "tcp", .fabric_addr = "0a0b"},
		.layout = layout,
		.model_digest = f->model.digest,
		.layout_digest = digest,
	};
	trk_reply_init(r);
	assert_int_equal(trk_client_register_node(f->c, &reg, trk_reply_cb, r), 0);
	json_decref(layout);
	trk_client_wait(f->c, r);
	return r->status;
}

static void test_layout_by_digest(void **state)
{
	struct fx *f = *state;
	struct trk_reply r, r2;
	char want[2 * PROTO_HASH_BYTES + 3], zeros[2 * PROTO_HASH_BYTES + 3], *before;
	json_t *explicit = proto_layout_to_json(&f->model, &f->tp2);

	snprintf(want, sizeof(want), "\"%s\"", HEX(f->tp2.digest));
	snprintf(zeros, sizeof(zeros), "\"%064d\"", 0);
	register_publisher(f);

	/* A digest the tracker holds no layout for: 404, nothing changes. */
	before = status_snapshot(f);
	assert_int_equal(register_by_digest(f, "A", 0, want, NULL, &r), 404);
	assert_non_null(strstr(r.error, "send the layout itself"));
	trk_reply_fini(&r);
	/* Nor is the trainer's layout a serving layout it holds. */
	char tl[2 * PROTO_HASH_BYTES + 3];
	snprintf(tl, sizeof(tl), "\"%s\"", HEX(f->tl.digest));
	assert_int_equal(register_by_digest(f, "A", 0, tl, NULL, &r), 404);
	trk_reply_fini(&r);
	char *after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);

	/* The client sends the digest, hears 404 and sends the layout itself. */
	assert_int_equal(client_register(f, "A", f->tp2.digest, &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "layout_digest")),
			    HEX(f->tp2.digest));
	trk_reply_fini(&r);
	assert_int_equal(metric_of(f, MISSES), 1);

	/* Now the digest alone registers, with what a full registration gives. */
	assert_int_equal(register_node(f, "B", 0, TP2, &r2), 200);
	assert_int_equal(register_by_digest(f, "C", 0, want, NULL, &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "layout_digest")),
			    json_string_value(json_object_get(r2.json, "layout_digest")));
	assert_int_equal(jget_u64(r.json, "lease_ms"), jget_u64(r2.json, "lease_ms"));
	assert_string_equal(json_string_value(json_object_get(r.json, "node_id")), "C/0");
	trk_reply_fini(&r);
	trk_reply_fini(&r2);
	assert_int_equal(client_register(f, "D", f->tp2.digest, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/replicas/C", &r), 200);
	assert_int_equal(jget_u64(r.json, "nranks"), 2);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/layouts", &r), 200);
	json_t *ls = json_object_get(r.json, "layouts");
	assert_int_equal(json_array_size(ls), 1);
	assert_true(json_equal(json_object_get(json_array_get(ls, 0), "layout"), explicit));
	assert_int_equal(json_array_size(json_object_get(json_array_get(ls, 0), "replicas")), 4);
	trk_reply_fini(&r);
	assert_int_equal(metric_of(f, MISSES), 1);
	assert_int_equal(metric_of(f, HITS), 3);

	/* Refused as strictly as a full registration, and nothing changes. */
	before = status_snapshot(f);
	assert_int_equal(register_by_digest(f, "E", 0, zeros, NULL, &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(register_by_digest(f, "E", 0, "\"zz\"", NULL, &r), 400);
	assert_non_null(strstr(r.error, "layout_digest"));
	trk_reply_fini(&r);
	assert_int_equal(register_by_digest(f, "E", 0, "7", NULL, &r), 400);
	trk_reply_fini(&r);
	assert_int_equal(register_by_digest(f, "E", 2, want, NULL, &r), 400);
	assert_non_null(strstr(r.error, "rank"));
	trk_reply_fini(&r);
	/* A layout and a digest that is not its own. */
	assert_int_equal(register_by_digest(f, "E", 0, zeros, TP2, &r), 400);
	assert_non_null(strstr(r.error, "layout_digest differs"));
	trk_reply_fini(&r);
	/* null counts as absent: then no layout at all. */
	assert_int_equal(register_by_digest(f, "E", 0, "null", NULL, &r), 400);
	assert_non_null(strstr(r.error, "layout: missing"));
	trk_reply_fini(&r);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);
	/* A replica of another layout cannot take this one by digest. */
	register_node_ok(f, "F", 0, TP1);
	before = NULL;
	after = status_snapshot(f);
	assert_int_equal(register_by_digest(f, "F", 1, want, NULL, &r), 409);
	assert_non_null(strstr(r.error, "another layout"));
	trk_reply_fini(&r);
	char *after2 = status_snapshot(f);
	assert_string_equal(after, after2);
	free(after2);
	free(after);
	free(before);
	/* With its own digest, a layout registers as usual. */
	assert_int_equal(register_by_digest(f, "E", 0, want, TP2, &r), 200);
	trk_reply_fini(&r);
	json_decref(explicit);
}

/* ---- leases ------------------------------------------------------------------------- */

/* A lease ten heartbeat periods long: a heartbeat late by a loaded
 * machine's scheduling never loses it, and a node that stops still expires
 * within seconds. */
#define SHORT_LEASE_MS 2000
#define SHORT_LEASE_BEAT_MS 200

/* An open tracker started with the tunable env set to ms. */
static int fx_setup_ms(void **state, const char *env, unsigned ms)
{
	char v[16];
	int rc;

	snprintf(v, sizeof(v), "%u", ms);
	setenv(env, v, 1);
	rc = fx_setup(state, false);
	unsetenv(env);
	return rc;
}

static int setup_short_lease(void **state)
{
	return fx_setup_ms(state, "TESSERA_LEASE_MS", SHORT_LEASE_MS);
}

static void test_lease_expiry(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char hb[256], path[256];

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	report_ok(f, "A/1", 1, "verified");
	snprintf(hb, sizeof(hb), "{\"id\":\"%s\"}", f->pub_id);
	/* Heartbeats keep both alive past one lease. */
	for (int i = 0; i <= SHORT_LEASE_MS / SHORT_LEASE_BEAT_MS; i++) {
		msleep(SHORT_LEASE_BEAT_MS);
		assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/1\"}", &r), 200);
		assert_int_equal(jget_u64(r.json, "lease_ms"), SHORT_LEASE_MS);
		trk_reply_fini(&r);
		assert_int_equal(post(f, TRK_API "/heartbeat", hb, &r), 200);
		trk_reply_fini(&r);
	}
	/* A/1 and the publisher offer parcel (0 -> 1) of v1. */
	char ob[1200];
	offer_body(ob, sizeof(ob), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	offer_body(ob, sizeof(ob), f->pub_id, 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 2);
	trk_reply_fini(&r);

	/* A/0 never heartbeats: it is gone, A/1 and the publisher still alive. */
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/0\"}", &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/replicas/A", &r), 200);
	json_t *ranks = json_object_get(r.json, "ranks");
	assert_false(json_is_true(json_object_get(json_array_get(ranks, 0), "alive")));
	assert_true(json_is_true(json_object_get(json_array_get(ranks, 1), "alive")));
	trk_reply_fini(&r);
	/* A gone node's reports and offers are refused: it must register again. */
	assert_int_equal(report(f, "A/0", 1, "verified", 0, &r), 404);
	trk_reply_fini(&r);

	/* Now let everything expire. */
	msleep(SHORT_LEASE_MS + SHORT_LEASE_MS / 2);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/1\"}", &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/heartbeat", hb, &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 0);
	trk_reply_fini(&r);
	/* Gone, but shown on the status page and JSON. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	assert_int_equal(jget_u64(r.json, "nodes_alive"), 0);
	json_t *rep = json_array_get(json_object_get(r.json, "replicas"), 0);
	assert_string_equal(json_string_value(json_object_get(rep, "replica")), "A");
	assert_false(json_is_true(json_object_get(rep, "alive")));
	json_t *pub = json_array_get(json_object_get(r.json, "publishers"), 0);
	assert_false(json_is_true(json_object_get(pub, "alive")));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, "gone"));
	trk_reply_fini(&r);
	/* Re-registration brings it back. */
	register_node_ok(f, "A", 1, TP2);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/1\"}", &r), 200);
	trk_reply_fini(&r);
}

/* ---- versions ------------------------------------------------------------------------ */

static void test_versions(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	uint8_t *buf, *buf1, osk[PROTO_SK_BYTES], opk[PROTO_PK_BYTES], bad_digest[32];
	size_t len, len1;
	char *before, *after;

	crypto_sign_keypair(opk, osk);
	register_publisher(f);
	/* A first version must have no parent. */
	memset(bad_digest, 0x33, sizeof(bad_digest));
	make_manifest(f, &(struct mopts){.version = 1, .parent = 0}, &buf1, &len1, f->d1);
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = bad_digest},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);

	assert_int_equal(publish(f, buf1, len1, &r), 201);
	assert_string_equal(json_string_value(json_object_get(r.json, "digest")), HEX(f->d1));
	trk_reply_fini(&r);
	/* Idempotent. */
	assert_int_equal(publish(f, buf1, len1, &r), 200);
	trk_reply_fini(&r);
	/* The manifest comes back byte for byte. */
	assert_int_equal(get(f, TRK_API "/versions/1/manifest", &r), 200);
	assert_int_equal(r.len, len1);
	assert_memory_equal(r.body, buf1, len1);
	trk_reply_fini(&r);

	before = status_snapshot(f);
	/* Another manifest for version 1. */
	make_manifest(f, &(struct mopts){.version = 1, .created_ms = 5}, &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);
	/* A bad signature: one flipped bit. */
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1},
		      &buf, &len, NULL);
	buf[len - 1] ^= 1;
	assert_int_equal(publish(f, buf, len, &r), 400);
	trk_reply_fini(&r);
	buf[len - 1] ^= 1;
	buf[40] ^= 1; /* a signed byte */
	assert_int_equal(publish(f, buf, len, &r), 400);
	trk_reply_fini(&r);
	free(buf);
	/* Another signer than the pinned one. */
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1,
					 .sk = osk},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 400);
	trk_reply_fini(&r);
	free(buf);
	/* Broken chains: wrong parent digest, unknown parent, no parent. */
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = bad_digest},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	assert_non_null(strstr(r.error, "parent digest"));
	trk_reply_fini(&r);
	free(buf);
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d1},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);
	make_manifest(f, &(struct mopts){.version = 2}, &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);
	/* Another model or trainer layout than the registered publishers'. */
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1,
					 .model_digest = bad_digest},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);
	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1,
					 .tl_digest = bad_digest},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 409);
	trk_reply_fini(&r);
	free(buf);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);

	make_manifest(f, &(struct mopts){.version = 2, .parent = 1, .parent_digest = f->d1},
		      &buf, &len, f->d2);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	/* Older than the latest. */
	assert_int_equal(publish(f, buf1, len1, &r), 200); /* identical: still fine */
	trk_reply_fini(&r);

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	assert_int_equal(jget_u64(r.json, "latest"), 2);
	json_t *vs = json_object_get(r.json, "versions");
	assert_int_equal(json_array_size(vs), 2);
	json_t *v2 = json_array_get(vs, 1);
	assert_int_equal(jget_u64(v2, "version"), 2);
	assert_int_equal(jget_u64(v2, "parent"), 1);
	assert_string_equal(json_string_value(json_object_get(v2, "kind")), "anchor");
	assert_string_equal(json_string_value(json_object_get(v2, "digest")), HEX(f->d2));
	assert_int_equal(jget_u64(v2, "wire_bytes"), 100 + 101 + 102 + 103);
	assert_int_equal(jget_u64(v2, "created_ms"), 1700000000002ull);
	assert_true(jget_u64(v2, "published_ms") > 1700000000000ull);
	assert_true(json_is_true(json_object_get(v2, "retain")));
	/* Through the typed parser too. */
	{
		uint64_t latest;
		struct trk_version_info *vi;
		size_t n;
		struct proto_err err = {{0}};
		assert_int_equal(trk_versions_parse(r.json, &latest, &vi, &n, &err), 0);
		assert_int_equal(n, 2);
		assert_int_equal(vi[1].version, 2);
		assert_memory_equal(vi[1].digest, f->d2, PROTO_HASH_BYTES);
		/* The tracker's clock at the answer, that of published_ms. */
		uint64_t now_ms;
		assert_int_equal(trk_versions_now(r.json, &now_ms, &err), 0);
		assert_true(now_ms >= vi[1].published_ms);
		free(vi);
	}
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions?after=1", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "versions")), 1);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions?after=2", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "versions")), 0);
	trk_reply_fini(&r);

	/* A publisher of another model, now that versions exist. */
	char *b = publisher_body("{\"tensors\":[{\"name\":\"X\",\"dtype\":\"fp32\",\"shape\":[4]}]}",
				 "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
				 "[{\"rank\":0,\"host\":\"t\",\"provider\":\"tcp\",\"fabric_addr\":\"bb\"}]");
	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 409);
	trk_reply_fini(&r);
	free(b);
	free(buf1);
}

/* ---- restart -------------------------------------------------------------------------- */

/* Starts the tracker again on the same port (the client keeps its URL). */
static int restart_same_port(struct fx *f)
{
	const char *port = strrchr(f->srv.url, ':');

	srv_stop(&f->srv);
	snprintf(f->srv.listen, sizeof(f->srv.listen), "127.0.0.1%s", port);
	return srv_start(&f->srv);
}

/* After a failed srv_start: nothing to stop. */
static void srv_failed(struct fx *f)
{
	f->srv.base = NULL;
	pthread_mutex_destroy(&f->srv.mu);
	pthread_cond_destroy(&f->srv.cv);
}

/* The chain guard: a client that saw the chain refuses a tracker that lost
 * it (an empty state: another cluster id; a truncated one: a lower latest
 * version), and takes it again once the state is back. A damaged cluster.id
 * stops the tracker with one line. */
static void test_state_lost_refused(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char keep[4096], idpath[4096];
	static const char *bad[] = {"", "0123\n", "zz0123456789abcdef0123456789abcdef\n",
				    "0123456789abcdef0123456789abcdef\nx",
				    "0123456789ABCDEF0123456789ABCDEF\n"};

	snprintf(idpath, sizeof(idpath), "%s/cluster.id", f->srv.state);
	register_publisher(f);
	publish_two(f);
	assert_int_equal(get(f, TRK_API "/versions", &r), 200);
	trk_reply_fini(&r);

	/* Same state, another process: taken. */
	assert_int_equal(restart_same_port(f), 0);
	assert_int_equal(get(f, TRK_API "/versions", &r), 200);
	trk_reply_fini(&r);

	/* The versions gone, the cluster id kept: latest 0 < 2, refused. */
	snprintf(keep, sizeof(keep), "%s/kept", f->dir);
	srv_stop(&f->srv);
	assert_int_equal(tu_sh("cp -a '%s' '%s'", f->srv.state, keep), 0);
	assert_int_equal(tu_sh("rm -f '%s'/versions/*", f->srv.state), 0);
	assert_int_equal(srv_start(&f->srv), 0);
	assert_int_equal(trk_client_call(f->c, "GET", TRK_API "/versions", NULL, NULL, 0, &r),
			 -ESTALE);
	assert_int_equal(r.status, -ESTALE);
	assert_non_null(strstr(r.error, "forgot the chain: its latest version is 0"));
	trk_reply_fini(&r);

	/* An empty state: a new cluster id, refused too. */
	srv_stop(&f->srv);
	assert_int_equal(tu_sh("rm -rf '%s'", f->srv.state), 0);
	assert_int_equal(srv_start(&f->srv), 0);
	assert_int_equal(trk_client_call(f->c, "GET", TRK_API "/status", NULL, NULL, 0, &r),
			 -ESTALE);
	assert_int_equal(r.status, -ESTALE);
	assert_non_null(strstr(r.error, "forgot the chain: its cluster id is"));
	trk_reply_fini(&r);

	/* The state restored: taken again. */
	srv_stop(&f->srv);
	assert_int_equal(tu_sh("rm -rf '%s' && mv '%s' '%s'", f->srv.state, keep,
			       f->srv.state), 0);
	assert_int_equal(srv_start(&f->srv), 0);
	assert_int_equal(get(f, TRK_API "/versions", &r), 200);
	assert_int_equal(jget_u64(r.json, "latest"), 2);
	trk_reply_fini(&r);

	/* A damaged cluster.id: one line, no start. */
	srv_stop(&f->srv);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		FILE *fp = fopen(idpath, "wb");
		assert_non_null(fp);
		fputs(bad[i], fp);
		fclose(fp);
		assert_int_not_equal(srv_start(&f->srv), 0);
		assert_non_null(strstr(f->srv.err.msg, "cluster.id: corrupt cluster id"));
		assert_null(strchr(f->srv.err.msg, '\n'));
		srv_failed(f);
	}
	/* Unreadable (a directory in its place): refused as well. */
	assert_int_equal(tu_sh("rm -f '%s' && mkdir '%s'", idpath, idpath), 0);
	assert_int_not_equal(srv_start(&f->srv), 0);
	srv_failed(f);
	/* Gone from a state with versions: a new one, said in the log. */
	assert_int_equal(tu_sh("rmdir '%s'", idpath), 0);
	assert_int_equal(srv_start(&f->srv), 0);
}

static void test_restart(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	uint8_t *m1, *buf, osk[PROTO_SK_BYTES], opk[PROTO_PK_BYTES];
	size_t l1, len;
	struct proto_err err = {{0}};
	char *list_before, path[4096];

	crypto_sign_keypair(opk, osk);
	register_publisher(f);
	publish_two(f);
	assert_int_equal(get(f, TRK_API "/versions/1/manifest", &r), 200);
	m1 = malloc(r.len);
	l1 = r.len;
	memcpy(m1, r.body, r.len);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions", &r), 200);
	list_before = json_dumps(json_object_get(r.json, "versions"), JSON_SORT_KEYS);
	trk_reply_fini(&r);

	/* Stop and start on the same state directory. */
	srv_stop(&f->srv);
	trk_client_free(f->c);
	assert_int_equal(srv_start(&f->srv), 0);
	assert_int_equal(trk_client_new(NULL, f->srv.url, NULL, &f->c, &err), 0);

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	assert_int_equal(jget_u64(r.json, "latest"), 2);
	char *list_after = json_dumps(json_object_get(r.json, "versions"), JSON_SORT_KEYS);
	assert_string_equal(list_before, list_after);
	free(list_after);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/1/manifest", &r), 200);
	assert_int_equal(r.len, l1);
	assert_memory_equal(r.body, m1, l1);
	trk_reply_fini(&r);
	/* Soft state is gone; the pinned key is not. */
	assert_int_equal(get(f, TRK_API "/layouts", &r), 404);
	trk_reply_fini(&r);
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2,
					 .sk = osk},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 400);
	trk_reply_fini(&r);
	free(buf);
	/* The chain goes on from the log (no publisher registered: no model check). */
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	/* A different model is refused now that versions exist. */
	char *b = publisher_body("{\"tensors\":[{\"name\":\"X\",\"dtype\":\"fp32\",\"shape\":[4]}]}",
				 "{\"ranks\":1,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}",
				 "[{\"rank\":0,\"host\":\"t\",\"provider\":\"tcp\",\"fabric_addr\":\"bb\"}]");
	assert_int_equal(post(f, TRK_API "/publishers", b, &r), 409);
	trk_reply_fini(&r);
	free(b);
	register_publisher(f);

	/* A damaged log refuses to start, saying which file. */
	srv_stop(&f->srv);
	snprintf(path, sizeof(path), "%s/versions/%020d.manifest", f->srv.state, 2);
	FILE *fp = fopen(path, "r+b");
	assert_non_null(fp);
	fseek(fp, 50, SEEK_SET);
	int byte = fgetc(fp);
	assert_true(byte != EOF);
	fseek(fp, 50, SEEK_SET);
	fputc(byte ^ 0xff, fp); /* flip it: writing a fixed value left it as it was 1 time in 256 */
	fclose(fp);
	assert_int_not_equal(srv_start(&f->srv), 0);
	assert_non_null(strstr(f->srv.err.msg, "00000000000000000002.manifest"));
	f->srv.base = NULL;
	pthread_mutex_destroy(&f->srv.mu);
	pthread_cond_destroy(&f->srv.cv);
	free(list_before);
	free(m1);
}

/* With --trainer-pubkey, only that key signs; nothing is pinned. */
static int setup_with_pk(void **state)
{
	struct fx *f;
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES];

	/* Start once to learn the fixture key, then restart with it. */
	if (fx_setup(state, false) != 0)
		return -1;
	f = *state;
	memcpy(pk, f->pk, sizeof(pk));
	memcpy(sk, f->sk, sizeof(sk));
	trk_client_free(f->c);
	srv_stop(&f->srv);
	memcpy(f->srv.pk, pk, sizeof(pk));
	f->srv.with_pk = true;
	if (srv_start(&f->srv) != 0)
		return -1;
	return trk_client_new(NULL, f->srv.url, NULL, &f->c, NULL);
}

static void test_trainer_pubkey(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	uint8_t *buf, osk[PROTO_SK_BYTES], opk[PROTO_PK_BYTES];
	size_t len;
	char pin[4096];
	struct stat st;

	crypto_sign_keypair(opk, osk);
	/* Another key's first version is refused: the key is not a pin. */
	make_manifest(f, &(struct mopts){.version = 1, .sk = osk}, &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 400);
	trk_reply_fini(&r);
	free(buf);
	make_manifest(f, &(struct mopts){.version = 1}, &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	snprintf(pin, sizeof(pin), "%s/trainer.pub", f->srv.state);
	assert_int_not_equal(stat(pin, &st), 0);
}

/* ---- long-poll --------------------------------------------------------------------------- */

struct both {
	struct trk_reply watch, pub;
	uint64_t t_watch_ns;
};

static void watch_done(const struct trk_answer *a, void *arg)
{
	struct both *b = arg;
	b->t_watch_ns = proto_now_ns();
	trk_reply_cb(a, &b->watch);
}

static void publish_later(evutil_socket_t fd, short what, void *arg)
{
	void **ctx = arg;
	struct fx *f = ctx[0];
	struct both *b = ctx[1];
	assert_int_equal(trk_client_publish(f->c, ctx[2], (size_t)(uintptr_t)ctx[3],
					    trk_reply_cb, &b->pub),
			 0);
}

static uint64_t metric_value(struct fx *f, const char *name);

static void test_longpoll(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	struct both b;
	uint8_t *buf;
	size_t len;
	uint64_t t0;

	register_publisher(f);
	publish_two(f);
	/* Versions after 0 exist: the answer is immediate. */
	t0 = proto_now_ns();
	trk_reply_init(&r);
	assert_int_equal(trk_client_watch(f->c, 0, 10000, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "versions")), 2);
	assert_true(proto_now_ns() - t0 < 2000000000ull);
	trk_reply_fini(&r);
	/* None after 2: it times out empty after wait_ms. */
	t0 = proto_now_ns();
	trk_reply_init(&r);
	assert_int_equal(trk_client_watch(f->c, 2, 200, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "versions")), 0);
	/* Held for wait_ms less up to a tenth (180-200 ms); libevent's clock
	 * may be the kernel's coarse one, up to a tick (<= 4 ms) behind ours:
	 * at 180 ms the answer came after 176-179 ms in 1 run of 30. */
	assert_true(proto_now_ns() - t0 >= 170000000ull);
	trk_reply_fini(&r);

	/* A client that hangs up during a long-poll leaves nothing behind. */
	{
		int fd = tcp_connect(f->srv.url);
		const char req[] = "GET " TRK_API "/versions?after=2&wait_ms=20000 HTTP/1.1\r\n"
				   "Host: x\r\n\r\n";
		write_all(fd, req, sizeof(req) - 1);
		msleep(50);
		close(fd);
		msleep(50);
	}

	/* Watch after 2, publish 3 100 ms later: the watch wakes at once. */
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2},
		      &buf, &len, NULL);
	trk_reply_init(&b.watch);
	trk_reply_init(&b.pub);
	void *ctx[4] = {f, &b, buf, (void *)(uintptr_t)len};
	struct event *later = evtimer_new(trk_client_base(f->c), publish_later, ctx);
	struct timeval tv = {0, 100000};
	t0 = proto_now_ns();
	assert_int_equal(trk_client_watch(f->c, 2, 20000, watch_done, &b), 0);
	evtimer_add(later, &tv);
	trk_client_wait(f->c, &b.watch);
	trk_client_wait(f->c, &b.pub);
	event_free(later);
	assert_int_equal(b.pub.status, 201);
	assert_int_equal(b.watch.status, 200);
	json_t *vs = json_object_get(b.watch.json, "versions");
	assert_int_equal(json_array_size(vs), 1);
	assert_int_equal(jget_u64(json_array_get(vs, 0), "version"), 3);
	assert_true(b.t_watch_ns - t0 < 3000000000ull);
	trk_reply_fini(&b.watch);
	trk_reply_fini(&b.pub);
	free(buf);
}

/* Watches lo..hi-1 were each answered with exactly version v. */
static void woken_with(struct trk_client **c, struct trk_reply *w, int lo, int hi, uint64_t v)
{
	for (int i = lo; i < hi; i++) {
		trk_client_wait(c[i], &w[i]);
		assert_int_equal(w[i].status, 200);
		json_t *vs = json_object_get(w[i].json, "versions");
		assert_int_equal(json_array_size(vs), 1);
		assert_int_equal(jget_u64(json_array_get(vs, 0), "version"), v);
		trk_reply_fini(&w[i]);
	}
}

/* A version wakes every watch held before it, more of them than the
 * tracker answers in one turn of its loop (versions.c: WAKE_SLICE), each
 * with the versions after the one it waited on; a watch after it stays
 * held until the next. */
static void test_longpoll_many(void **state)
{
	struct fx *f = *state;
	enum { N = 150, LATE = 20 };
	struct trk_client *c[N];
	struct trk_reply w[N], r;
	struct event_base *base = trk_client_base(f->c);
	struct proto_err err;
	uint8_t *buf, d3[PROTO_HASH_BYTES];
	size_t len;

	register_publisher(f);
	publish_two(f);
	for (int i = 0; i < N; i++) {
		assert_int_equal(trk_client_new(base, f->srv.url, NULL, &c[i], &err), 0);
		trk_reply_init(&w[i]);
		assert_int_equal(trk_client_watch(c[i], i < LATE ? 3 : 2, TRK_WAIT_MAX_MS,
						  trk_reply_cb, &w[i]),
				 0);
	}
	/* All held (the clients share f->c's loop, which metric_value runs). */
	for (int t = 0; metric_value(f, "tessera_tracker_watches_held") < N; t++) {
		assert_true(t < 2000);
		msleep(5);
	}
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2},
		      &buf, &len, d3);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	woken_with(c, w, LATE, N, 3);
	for (int i = 0; i < LATE; i++)
		assert_false(w[i].done);
	make_manifest(f, &(struct mopts){.version = 4, .parent = 3, .parent_digest = d3},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	woken_with(c, w, 0, LATE, 4);
	for (int i = 0; i < N; i++)
		trk_client_free(c[i]);
}

/* ---- keep-alive ---------------------------------------------------------------------------- */


/* A client keeps its connection open: its ordinary requests share one, a
 * long-poll holds another and nothing waits behind it, and numbered state
 * reports made at once (without waiting for answers) reach the tracker in
 * the order they were made: none is stale. */
static void test_keepalive(void **state)
{
	struct fx *f = *state;
	enum { N = 20 };
	struct trk_reply rs[N], w, r;
	uint64_t acc0;
	uint8_t *buf;
	size_t len;

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "B", 0, TP1);
	acc0 = metric_value(f, "tessera_tracker_http_accepted_total");
	/* Held: nothing after version 2 yet (the tracker ends it after 27 s
	 * at the earliest). */
	trk_reply_init(&w);
	assert_int_equal(trk_client_watch(f->c, 2, TRK_WAIT_MAX_MS, trk_reply_cb, &w), 0);
	for (int i = 0; i < N; i++) {
		char b[200];
		int n = snprintf(b, sizeof(b),
				 "{\"id\":\"B/0\",\"version\":1,\"state\":\"%s\",\"seq\":%d}",
				 i % 2 ? "verified" : "fetching", i + 1);
		trk_reply_init(&rs[i]);
		assert_int_equal(trk_client_request(f->c, "POST", TRK_API "/nodes/state", NULL, b,
						    (size_t)n, 0, trk_reply_cb, &rs[i]),
				 0);
	}
	for (int i = 0; i < N; i++) {
		trk_client_wait(f->c, &rs[i]);
		assert_int_equal(rs[i].status, 200);
		if (json_is_true(json_object_get(rs[i].json, "stale")))
			fail_msg("report %d arrived after a later one", i + 1);
		trk_reply_fini(&rs[i]);
	}
	assert_false(w.done); /* all answered while the watch is held */
	assert_int_equal(get(f, TRK_API "/replicas/B", &r), 200);
	assert_string_equal(json_string_value(json_object_get(
				    json_array_get(json_object_get(r.json, "ranks"), 0), "state")),
			    "verified");
	trk_reply_fini(&r);
	/* One connection for the watch; the ordinary one was already open.
	 * (A connection per request would have made N + 2.) */
	assert_true(metric_value(f, "tessera_tracker_http_accepted_total") - acc0 <= 2);
	/* A new version answers the held watch at once. */
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2},
		      &buf, &len, NULL);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	trk_client_wait(f->c, &w);
	assert_int_equal(w.status, 200);
	assert_int_equal(jget_u64(w.json, "latest"), 3);
	trk_reply_fini(&w);
}

#define IDLE_MS 300
static int setup_idle(void **state)
{
	return fx_setup_ms(state, "TESSERA_TRACKER_IDLE_MS", IDLE_MS);
}

/* The tracker closes a connection idle for TESSERA_TRACKER_IDLE_MS (not
 * one whose long-poll it holds). The client, whose loop did not run meanwhile, learns it only when its next
 * request meets the closed connection: that request goes again, once, on a
 * new connection, and is answered. */
static void test_idle_close(void **state)
{
	struct fx *f = *state;
	const char *idle = "tessera_tracker_http_closed_total{reason=\"idle\"}";
	uint64_t closed = 0, acc0;
	struct trk_reply r;

	/* A long-poll held past the idle bound is not idle: it ends with its
	 * wait, answered (no versions yet). */
	trk_reply_init(&r);
	assert_int_equal(trk_client_watch(f->c, 0, 4 * IDLE_MS, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "versions")), 0);
	trk_reply_fini(&r);
	acc0 = metric_value(f, "tessera_tracker_http_accepted_total");
	for (int i = 0; i < 50 && closed == 0; i++) {
		msleep(4 * IDLE_MS);
		/* Each call finds its connection closed by now. */
		closed = metric_value(f, idle);
	}
	assert_true(closed >= 1);
	msleep(4 * IDLE_MS);
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	trk_reply_fini(&r);
	/* Every call after an idle close opened a new connection. */
	assert_true(metric_value(f, "tessera_tracker_http_accepted_total") > acc0);
	assert_true(metric_value(f, idle) >= closed);
}

/* ---- replica state ----------------------------------------------------------------------- */

static bool retained(struct fx *f, uint64_t v)
{
	struct trk_reply r;
	json_t *e;
	size_t i;
	bool ret = false, found = false;

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	json_array_foreach(json_object_get(r.json, "versions"), i, e)
		if (jget_u64(e, "version") == v) {
			found = true;
			ret = json_is_true(json_object_get(e, "retain"));
		}
	trk_reply_fini(&r);
	assert_true(found);
	return ret;
}

/* A version's duplicate and refetched bytes sum what its ranks report, each
 * counting once however often it is reported; each rank shows its own. */
static void test_duplicate_and_refetched_bytes(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	static const struct {
		const char *id;
		uint64_t v, dup, refetched;
	} reports[] = {
		{"A/0", 1, 10, 100}, {"A/0", 1, 30, 100}, /* grows to 30; 100 again */
		{"A/1", 1, 5, 0},    {"B/0", 1, 0, 7},
		{"B/0", 2, 1, 2}, /* another version */
	};

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	register_node_ok(f, "B", 0, TP1);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(reports); i++) {
		char b[512];
		snprintf(b, sizeof(b),
			 "{\"id\":\"%s\",\"version\":%llu,\"state\":\"fetching\","
			 "\"duplicate_bytes\":%llu,\"refetched_bytes\":%llu}",
			 reports[i].id, (unsigned long long)reports[i].v,
			 (unsigned long long)reports[i].dup, (unsigned long long)reports[i].refetched);
		assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
		trk_reply_fini(&r);
	}
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_t *v;
	size_t i;
	int seen = 0;
	json_array_foreach(json_object_get(r.json, "versions"), i, v)
	{
		uint64_t ver = jget_u64(v, "version");
		assert_int_equal(jget_u64(v, "duplicate_bytes"), ver == 1 ? 35 : 1);
		assert_int_equal(jget_u64(v, "refetched_bytes"), ver == 1 ? 107 : 2);
		seen++;
	}
	assert_int_equal(seen, 2);
	json_t *rep, *rk;
	json_array_foreach(json_object_get(r.json, "replicas"), i, rep)
	{
		if (strcmp(json_string_value(json_object_get(rep, "replica")), "A") != 0)
			continue;
		rk = json_array_get(json_object_get(rep, "ranks"), 0);
		assert_int_equal(jget_u64(rk, "duplicate_bytes"), 30);
		assert_int_equal(jget_u64(rk, "refetched_bytes"), 100);
		seen++;
	}
	assert_int_equal(seen, 3);
	trk_reply_fini(&r);
}

/* Reports overtaking each other on their way (each travels on its own
 * connection): one numbered below a report already applied changes nothing
 * and is told so; unnumbered reports apply in arrival order. */
static void test_reports_out_of_order(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	static const struct {
		uint64_t seq; /* 0: none */
		const char *state;
		bool stale;
		const char *rank_state; /* B/0's state at v1 after it */
	} reports[] = {
		{2, "verified", false, "verified"},
		{1, "failed", true, "verified"}, /* sent before the verified */
		{2, "failed", true, "verified"}, /* the same number again */
		{3, "failed", false, "failed"},
		{0, "verified", false, "verified"},
	};

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "B", 0, TP1);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(reports); i++) {
		char b[512], seq[32] = "";
		if (reports[i].seq != 0)
			snprintf(seq, sizeof(seq), ",\"seq\":%llu", (unsigned long long)reports[i].seq);
		snprintf(b, sizeof(b), "{\"id\":\"B/0\",\"version\":1,\"state\":\"%s\"%s}",
			 reports[i].state, seq);
		assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
		assert_int_equal(json_is_true(json_object_get(r.json, "stale")), reports[i].stale);
		assert_int_equal(json_is_true(json_object_get(r.json, "replica_complete")),
				 strcmp(reports[i].rank_state, "verified") == 0);
		trk_reply_fini(&r);
		assert_int_equal(get(f, TRK_API "/replicas/B", &r), 200);
		json_t *rk = json_array_get(json_object_get(r.json, "ranks"), 0);
		assert_string_equal(json_string_value(json_object_get(rk, "state")),
				    reports[i].rank_state);
		trk_reply_fini(&r);
	}
}

static void test_replica_state(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	register_node_ok(f, "B", 0, TP1);
	/* Both replicas aim at the latest version: v1 is needed by no one. */
	assert_false(retained(f, 1));
	assert_true(retained(f, 2));

	/* A is complete at 1 only when both its ranks hold it. */
	assert_int_equal(report(f, "A/0", 1, "fetching", 40, &r), 200);
	assert_false(json_is_true(json_object_get(r.json, "replica_complete")));
	trk_reply_fini(&r);
	assert_int_equal(report(f, "A/0", 1, "verified", 100, &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "replica")), "A");
	assert_false(json_is_true(json_object_get(r.json, "replica_complete")));
	trk_reply_fini(&r);
	assert_int_equal(report(f, "A/1", 1, "verified", 30, &r), 200);
	assert_true(json_is_true(json_object_get(r.json, "replica_complete")));
	assert_int_equal(jget_u64(r.json, "replica_active"), 0);
	trk_reply_fini(&r);
	/* Activation is replica-local and all-or-nothing. */
	report_ok(f, "A/0", 1, "active");
	assert_int_equal(get(f, TRK_API "/replicas/A", &r), 200);
	assert_int_equal(jget_u64(r.json, "active"), 0);
	trk_reply_fini(&r);
	assert_int_equal(report(f, "A/1", 1, "active", 30, &r), 200);
	assert_int_equal(jget_u64(r.json, "replica_active"), 1);
	trk_reply_fini(&r);
	/* B (one rank) verified 1 and 2, active on 2; A behind on 1. */
	report_ok(f, "B/0", 1, "verified");
	report_ok(f, "B/0", 2, "verified");
	report_ok(f, "B/0", 2, "active");
	/* A live replica (A) is complete at 1 but not 2: 2 is retained (and
	 * the latest anyway); 1 is not needed by anyone. */
	assert_false(retained(f, 1));
	assert_true(retained(f, 2));
	/* A rank of A that failed v2. */
	assert_int_equal(post(f, TRK_API "/nodes/state",
			      "{\"id\":\"A/0\",\"version\":2,\"state\":\"failed\","
			      "\"error\":\"hash mismatch\\nsecond line\"}",
			      &r),
			 200);
	assert_false(json_is_true(json_object_get(r.json, "replica_complete")));
	assert_int_equal(jget_u64(r.json, "replica_active"), 1);
	trk_reply_fini(&r);

	assert_int_equal(get(f, TRK_API "/replicas/A", &r), 200);
	assert_string_equal(json_string_value(json_object_get(r.json, "layout_digest")),
			    HEX(f->tp2.digest));
	assert_int_equal(jget_u64(r.json, "active"), 1);
	json_t *complete = json_object_get(r.json, "complete");
	assert_int_equal(json_array_size(complete), 1);
	assert_int_equal(json_integer_value(json_array_get(complete, 0)), 1);
	json_t *r0 = json_array_get(json_object_get(r.json, "ranks"), 0);
	assert_string_equal(json_string_value(json_object_get(r0, "state")), "failed");
	assert_int_equal(jget_u64(r0, "version"), 2);
	trk_reply_fini(&r);

	/* Unknown node, unpublished version. */
	assert_int_equal(report(f, "Q/0", 1, "verified", 0, &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(report(f, "A/0", 9, "verified", 0, &r), 409);
	trk_reply_fini(&r);

	/* The status: per-version replicas, bytes, the activation log. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	assert_int_equal(jget_u64(r.json, "bytes_from_trainer"), 100 + 30);
	assert_int_equal(jget_u64(r.json, "latest"), 2);
	json_t *vs = json_object_get(r.json, "versions"), *v1 = json_array_get(vs, 1);
	assert_int_equal(jget_u64(v1, "version"), 1);
	assert_int_equal(jget_u64(v1, "bytes_from_trainer"), 130);
	assert_int_equal(json_array_size(json_object_get(v1, "complete")), 2);
	assert_string_equal(json_string_value(json_array_get(json_object_get(v1, "active"), 0)),
			    "A");
	json_t *acts = json_object_get(r.json, "activations");
	assert_int_equal(json_array_size(acts), 2);
	assert_string_equal(json_string_value(json_object_get(json_array_get(acts, 0), "replica")),
			    "B");
	assert_int_equal(jget_u64(json_array_get(acts, 1), "version"), 1);
	assert_true(jget_u64(json_array_get(acts, 1), "wall_ms") > 1700000000000ull);
	json_t *ra = json_array_get(json_object_get(r.json, "replicas"), 0);
	const char *err0 = json_string_value(json_object_get(
		json_array_get(json_object_get(ra, "ranks"), 0), "error"));
	assert_non_null(err0);
	assert_null(strchr(err0, '\n'));
	trk_reply_fini(&r);
}

/* ---- replica targets ------------------------------------------------------------------------ */

/* Publishes version v (parent v-1) whose digest goes into digs[v]. */
static void publish_v(struct fx *f, uint64_t v, uint8_t (*digs)[PROTO_HASH_BYTES])
{
	struct trk_reply r;
	uint8_t *buf;
	size_t len;

	make_manifest(f, &(struct mopts){.version = v, .parent = v - 1, .parent_digest = digs[v - 1]},
		      &buf, &len, digs[v]);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
}

static json_t *replica_get(struct fx *f, const char *name)
{
	struct trk_reply r;
	char path[128];
	snprintf(path, sizeof(path), TRK_API "/replicas/%s", name);
	assert_int_equal(get(f, path, &r), 200);
	json_t *j = json_incref(r.json);
	trk_reply_fini(&r);
	return j;
}

static uint64_t target_of(struct fx *f, const char *name)
{
	json_t *j = replica_get(f, name);
	uint64_t t = jget_u64(j, "target");
	json_decref(j);
	return t;
}

/* The publisher offers (n = 4) or withdraws (n = 0) its parcels of v. */
static void pub_offer(struct fx *f, uint64_t v, size_t n)
{
	struct trk_offer offers[4];
	struct trk_reply r;
	for (int i = 0; i < 4; i++) {
		memcpy(offers[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
		offers[i].src_rank = (uint32_t)(i / 2);
		offers[i].dst_rank = (uint32_t)(i % 2);
		offers[i].addr = 4096;
		offers[i].key = 7;
		offers[i].len = 100 + (uint64_t)i;
	}
	trk_reply_init(&r);
	assert_int_equal(trk_client_offer(f->c, f->pub_id, v, offers, n, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
}

static size_t retained_count(struct fx *f)
{
	struct trk_reply r;
	json_t *e;
	size_t i, k = 0;

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	json_array_foreach(json_object_get(r.json, "versions"), i, e)
		k += json_is_true(json_object_get(e, "retain"));
	trk_reply_fini(&r);
	return k;
}

static bool dropped(struct fx *f, uint64_t v)
{
	struct trk_reply r;
	json_t *e;
	size_t i;
	bool d = false;

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	json_array_foreach(json_object_get(r.json, "versions"), i, e)
		if (jget_u64(e, "version") == v)
			d = json_is_true(json_object_get(e, "dropped"));
	trk_reply_fini(&r);
	return d;
}

/* The publisher offers v's parcels of TP2 (when tp2) and of TP1 (when tp1). */
static void pub_offer_layouts(struct fx *f, uint64_t v, bool tp2, bool tp1)
{
	struct trk_offer offers[6];
	struct trk_reply r;
	size_t n = 0;

	for (int i = 0; tp2 && i < 4; i++)
		offers[n++] = (struct trk_offer){.src_rank = (uint32_t)(i / 2),
						 .dst_rank = (uint32_t)(i % 2),
						 .addr = 4096, .key = 7, .len = 100 + (uint64_t)i};
	for (size_t i = 0; i < n; i++)
		memcpy(offers[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
	for (int i = 0; tp1 && i < 2; i++) {
		offers[n] = (struct trk_offer){.src_rank = (uint32_t)i, .dst_rank = 0,
					       .addr = 8192, .key = 9, .len = 200 + (uint64_t)i};
		memcpy(offers[n++].layout, f->tp1.digest, PROTO_HASH_BYTES);
	}
	trk_reply_init(&r);
	assert_int_equal(trk_client_offer(f->c, f->pub_id, v, offers, n, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
}

/* Every version, through the typed parser (free() *vi). */
static void versions_of(struct fx *f, struct trk_version_info **vi, size_t *n)
{
	struct trk_reply r;
	struct proto_err err = {{0}};
	uint64_t latest;

	assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
	assert_int_equal(trk_versions_parse(r.json, &latest, vi, n, &err), 0);
	trk_reply_fini(&r);
}

/* v's retain_layouts, through the typed parser: which of TP2 / TP1 it names. */
static void retain_layouts_of(struct fx *f, uint64_t v, bool *tp2, bool *tp1)
{
	struct trk_version_info *vi;
	size_t n;

	*tp2 = *tp1 = false;
	versions_of(f, &vi, &n);
	for (size_t i = 0; i < n; i++) {
		if (vi[i].version != v)
			continue;
		assert_false(vi[i].all_layouts);
		for (uint32_t k = 0; k < vi[i].nlayouts; k++) {
			*tp2 |= memcmp(vi[i].layouts[k], f->tp2.digest, PROTO_HASH_BYTES) == 0;
			*tp1 |= memcmp(vi[i].layouts[k], f->tp1.digest, PROTO_HASH_BYTES) == 0;
		}
	}
	free(vi);
}

/* The chain of the latest version: its anchor and the deltas after it are
 * retained (kept whole: "chain", no retain_layouts) while it is the latest's;
 * a newer anchor releases them. A rank's "how" may be "chain", and is
 * counted in /metrics; another word is refused. */
static void test_chain_retention(void **state)
{
	struct fx *f = *state;
	uint8_t digs[8][PROTO_HASH_BYTES] = {{0}};
	struct trk_reply r;

	register_publisher(f);
	for (uint64_t v = 1; v <= 4; v++) {
		uint8_t *buf;
		size_t len;
		/* v1 anchor, v2 v3 deltas; v4 (published later) an anchor */
		if (v == 4) {
			/* Before v4: v1..v3 are the chain; nobody aims at them. */
			for (uint64_t k = 1; k <= 3; k++)
				assert_true(retained(f, k));
			assert_int_equal(get(f, TRK_API "/versions?after=0", &r), 200);
			json_t *e1 = json_array_get(json_object_get(r.json, "versions"), 0);
			assert_true(json_is_true(json_object_get(e1, "chain")));
			assert_null(json_object_get(e1, "retain_layouts"));
			trk_reply_fini(&r);
			struct trk_version_info *vi;
			size_t n;
			versions_of(f, &vi, &n);
			assert_int_equal(n, 3);
			assert_true(vi[0].chain && vi[0].all_layouts && !vi[0].dropped);
			assert_true(vi[1].chain && !vi[2].chain); /* the latest: retained as such */
			free(vi);
		}
		make_manifest(f, &(struct mopts){.version = v, .parent = v - 1,
						 .parent_digest = digs[v - 1],
						 .delta = v == 2 || v == 3},
			      &buf, &len, digs[v]);
		assert_int_equal(publish(f, buf, len, &r), 201);
		trk_reply_fini(&r);
		free(buf);
	}
	for (uint64_t k = 1; k <= 3; k++)
		assert_false(retained(f, k));
	assert_true(retained(f, 4));

	register_node_ok(f, "A", 0, TP2);
	assert_int_equal(post(f, TRK_API "/nodes/state",
			      "{\"id\":\"A/0\",\"version\":4,\"state\":\"verified\",\"how\":\"chain\"}",
			      &r),
			 200);
	trk_reply_fini(&r);
	json_t *rep = replica_get(f, "A");
	json_t *rk = json_array_get(json_object_get(rep, "ranks"), 0);
	assert_string_equal(json_string_value(json_object_get(rk, "how")), "chain");
	json_decref(rep);
	assert_int_equal(get(f, "/metrics", &r), 200);
	assert_non_null(strstr((const char *)r.body, "tessera_tracker_rank_builds_total{how=\"chain\"} 1"));
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/nodes/state",
			      "{\"id\":\"A/0\",\"version\":4,\"state\":\"verified\",\"how\":\"replay\"}",
			      &r),
			 400);
	assert_non_null(strstr(r.error, "want delta, chain or full"));
	trk_reply_fini(&r);
}

/* Per-layout retention: a version keeps, in retain_layouts, the layouts of
 * the replicas aiming at it; a publisher that withdraws one layout's parcels
 * moves the replicas of that layout on (rule 3) and no other. */
static void test_layout_retention(void **state)
{
	struct fx *f = *state;
	uint8_t digs[4][PROTO_HASH_BYTES] = {{0}};
	bool tp2, tp1;

	register_publisher(f);
	for (uint64_t v = 1; v <= 2; v++) {
		struct trk_reply r;
		uint8_t *buf;
		size_t len;
		make_manifest(f, &(struct mopts){.version = v, .parent = v - 1,
						 .parent_digest = digs[v - 1], .tp1 = true},
			      &buf, &len, digs[v]);
		assert_int_equal(publish(f, buf, len, &r), 201);
		trk_reply_fini(&r);
		free(buf);
		pub_offer_layouts(f, v, true, true);
		if (v == 1) {
			/* A (TP2) and B (TP1) start on v1. */
			register_node_ok(f, "A", 0, TP2);
			register_node_ok(f, "B", 0, TP1);
			report_ok(f, "A/0", 1, "fetching");
			report_ok(f, "B/0", 1, "fetching");
		}
	}
	assert_int_equal(target_of(f, "A"), 1);
	assert_int_equal(target_of(f, "B"), 1);
	retain_layouts_of(f, 1, &tp2, &tp1);
	assert_true(tp2 && tp1);
	retain_layouts_of(f, 2, &tp2, &tp1); /* the latest: retained, nobody aims there */
	assert_true(retained(f, 2));
	assert_false(tp2 || tp1);

	/* The publisher withdraws v1's TP1 parcels: v1 is not dropped (TP2 is
	 * still served) and A stays; B's layout is gone there, so B moves on. */
	pub_offer_layouts(f, 1, true, false);
	assert_false(dropped(f, 1));
	report_ok(f, "B/0", 1, "fetching");
	assert_int_equal(target_of(f, "B"), 2);
	assert_int_equal(target_of(f, "A"), 1);
	retain_layouts_of(f, 1, &tp2, &tp1);
	assert_true(tp2);
	assert_false(tp1);
	retain_layouts_of(f, 2, &tp2, &tp1);
	assert_false(tp2);
	assert_true(tp1);
}

/* Publishes v, a delta against v - 1 when delta, else an anchor. */
static void publish_kind(struct fx *f, uint64_t v, uint8_t (*digs)[PROTO_HASH_BYTES], bool delta)
{
	struct trk_reply r;
	uint8_t *buf;
	size_t len;

	make_manifest(f, &(struct mopts){.version = v, .parent = v - 1, .parent_digest = digs[v - 1],
					 .delta = delta},
		      &buf, &len, digs[v]);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
}

/* Rule 5 of "Replica targets": a rank that registers late (or again,
 * restarted) is not handed a delta target it cannot build. While the
 * target's chain is served it joins the target; once a newer anchor has
 * replaced that chain, the target moves to a version it can reach. */
static void test_target_late_rank_chain_gone(void **state)
{
	struct fx *f = *state;
	uint8_t digs[8][PROTO_HASH_BYTES] = {{0}};

	register_publisher(f);
	publish_kind(f, 1, digs, false);
	publish_kind(f, 2, digs, true);
	register_node_ok(f, "A", 0, TP2);
	assert_int_equal(target_of(f, "A"), 2);
	report_ok(f, "A/0", 2, "verified"); /* and waits for rank 1 */
	/* v3 extends the chain v1 (anchor), v2: A/1 can replay it to v2. */
	publish_kind(f, 3, digs, true);
	register_node_ok(f, "A", 1, TP2);
	assert_int_equal(target_of(f, "A"), 2);
	/* A/1 restarts after a new anchor (v4) replaced that chain: v2 is a
	 * delta nothing serves a way to any more; the replica moves on. */
	publish_kind(f, 4, digs, false);
	publish_kind(f, 5, digs, true);
	register_node_ok(f, "A", 1, TP2);
	assert_int_equal(target_of(f, "A"), 5);
	/* A rank active on the target's parent builds the delta itself: the
	 * target stays however the chain goes. */
	report_ok(f, "A/0", 5, "verified");
	report_ok(f, "A/1", 5, "verified");
	report_ok(f, "A/0", 5, "active");
	report_ok(f, "A/1", 5, "active");
	publish_kind(f, 6, digs, true);
	report_ok(f, "A/0", 6, "fetching");
	assert_int_equal(target_of(f, "A"), 6);
	publish_kind(f, 7, digs, false);
	report_ok(f, "A/0", 6, "fetching"); /* A/1 has not: it is active on v5 */
	assert_int_equal(target_of(f, "A"), 6);
}

struct held_get {
	const char *url;
	char path[256];
	struct trk_reply r;
	pthread_t th;
};

static void *held_get_main(void *arg)
{
	struct held_get *h = arg;
	struct trk_client *c = NULL;
	struct proto_err err = {{0}};

	trk_reply_init(&h->r);
	if (trk_client_new(NULL, h->url, NULL, &c, &err) == 0) {
		trk_client_call(c, "GET", h->path, NULL, NULL, 0, &h->r);
		trk_client_free(c);
	}
	return NULL;
}

/* Raw copies are made of the latest version only: a node's wait for the
 * copy of an older one ends (410) as soon as a newer version is published,
 * not when wait_ms runs out, and a new ask for it is answered 410 at once. */
static void test_copy_of_old_version(void **state)
{
	struct fx *f = *state;
	uint8_t digs[4][PROTO_HASH_BYTES] = {{0}};
	char lh[2 * PROTO_HASH_BYTES + 1], path[256];
	struct held_get h = {.url = f->srv.url};
	struct trk_reply r;

	register_publisher(f);
	register_node_ok(f, "A", 0, TP2);
	publish_kind(f, 1, digs, false);
	publish_kind(f, 2, digs, true);
	sodium_bin2hex(lh, sizeof(lh), f->tp2.digest, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "/addenda?version=2&layout=%s&copy=1", lh);
	assert_int_equal(get(f, path, &r), 404); /* the latest: one may come */
	trk_reply_fini(&r);
	snprintf(h.path, sizeof(h.path), "%s&wait_ms=30000", path);
	assert_int_equal(pthread_create(&h.th, NULL, held_get_main, &h), 0);
	/* Held (or, if it comes after v3, answered at once): 410 either way. */
	for (int i = 0; i < 200 && metric_value(f, "tessera_tracker_watches_held") < 1; i++)
		msleep(10);
	publish_kind(f, 3, digs, true);
	pthread_join(h.th, NULL);
	assert_int_equal(h.r.status, 410);
	assert_non_null(strstr(h.r.error, "no longer the latest"));
	trk_reply_fini(&h.r);
	assert_int_equal(get(f, path, &r), 410);
	assert_non_null(strstr(r.error, "no raw copy of it will be made"));
	trk_reply_fini(&r);
}

/* The rule of "Replica targets" in API.md, one property at a time. */
static void test_replica_target(void **state)
{
	struct fx *f = *state;
	uint8_t digs[16][PROTO_HASH_BYTES] = {{0}};
	struct trk_reply r;

	register_publisher(f);
	publish_v(f, 1, digs);
	publish_v(f, 2, digs);
	/* A new replica aims at the latest version; nobody needs v1. */
	register_node_ok(f, "A", 0, TP2);
	assert_int_equal(target_of(f, "A"), 2);
	assert_false(retained(f, 1));
	assert_true(retained(f, 2));

	/* Sticky: once a rank started on the target, newer versions do not
	 * move it (the ranks never chase different versions), and the target
	 * stays retained. */
	report_ok(f, "A/0", 2, "fetching");
	publish_v(f, 3, digs);
	publish_v(f, 4, digs);
	assert_int_equal(target_of(f, "A"), 2);
	assert_true(retained(f, 2));
	assert_false(retained(f, 3));
	assert_true(retained(f, 4));
	assert_int_equal(retained_count(f), 2);

	/* A rank that joins late joins the current target, even though newer
	 * versions exist; the replica is complete (and activates) there. */
	report_ok(f, "A/0", 2, "verified");
	register_node_ok(f, "A", 1, TP2);
	assert_int_equal(target_of(f, "A"), 2);
	/* A rank that restarts (registers again, its reports forgotten) finds
	 * the same target: A/0's verified v2 is not given up. */
	report_ok(f, "A/1", 2, "fetching");
	register_node_ok(f, "A", 1, TP2);
	assert_int_equal(target_of(f, "A"), 2);
	assert_int_equal(report(f, "A/1", 2, "verified", 0, &r), 200);
	assert_true(json_is_true(json_object_get(r.json, "replica_complete")));
	assert_int_equal(jget_u64(r.json, "replica_target"), 2);
	trk_reply_fini(&r);
	report_ok(f, "A/0", 2, "active");
	/* Half-activated: the target stays until every rank is active. */
	assert_int_equal(target_of(f, "A"), 2);
	assert_int_equal(report(f, "A/1", 2, "active", 0, &r), 200);
	assert_int_equal(jget_u64(r.json, "replica_active"), 2);
	/* Reached: the replica moves on to the latest, skipping v3. */
	assert_int_equal(jget_u64(r.json, "replica_target"), 4);
	trk_reply_fini(&r);
	json_t *j = replica_get(f, "A");
	assert_int_equal(jget_u64(j, "active"), 2);
	assert_int_equal(jget_u64(j, "lag_versions"), 2);
	assert_non_null(json_object_get(j, "lag_ms"));
	json_decref(j);

	/* Nobody started on v4 yet: a newer version moves the target for free. */
	publish_v(f, 5, digs);
	assert_int_equal(target_of(f, "A"), 5);
	assert_false(retained(f, 4));

	/* A verified rank is not stranded: A/0 holds v6 verified while the
	 * target v5 is dropped by the publisher; the replica moves to v6 (held)
	 * rather than to the latest v7. */
	pub_offer(f, 5, 4);
	report_ok(f, "A/1", 5, "fetching");
	publish_v(f, 6, digs);
	publish_v(f, 7, digs);
	report_ok(f, "A/0", 6, "verified");
	assert_int_equal(target_of(f, "A"), 5); /* v5 is still served */
	assert_false(dropped(f, 5));
	pub_offer(f, 5, 0);
	assert_true(dropped(f, 5));
	assert_int_equal(target_of(f, "A"), 6);
	assert_true(retained(f, 6));
	assert_false(retained(f, 5));

	/* A rank failed the target and something newer exists: move on. */
	report_ok(f, "A/1", 6, "failed");
	assert_int_equal(target_of(f, "A"), 7);

	/* Ranks disagree (A/0 holds v6, A/1 only v2): shown once it lasts
	 * longer than the threshold, with what each rank holds and waits for. */
	json_t *d = NULL;
	for (int w = 0; w < 20000 && d == NULL; w += 100) {
		j = replica_get(f, "A");
		if (json_is_string(json_object_get(j, "disagreement")))
			d = json_incref(j);
		json_decref(j);
		if (d == NULL)
			msleep(100);
	}
	assert_non_null(d);
	const char *why = json_string_value(json_object_get(d, "disagreement"));
	assert_non_null(strstr(why, "A/0 holds v6 verified"));
	assert_non_null(strstr(why, "A/1"));
	assert_true(jget_u64(d, "disagree_ms") > 0);
	json_decref(d);
	assert_int_equal(get(f, "/metrics", &r), 200);
	assert_non_null(strstr((char *)r.body, "tessera_tracker_replica_target_version{replica=\"A\"} 7"));
	assert_non_null(strstr((char *)r.body, "tessera_tracker_replica_lag_versions{replica=\"A\"} 5"));
	assert_non_null(strstr((char *)r.body, "tessera_tracker_replica_lag_seconds{replica=\"A\"} "));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, "ranks disagree for"));
	trk_reply_fini(&r);
	/* Both ranks reach v7: they agree again, and the replica is current. */
	report_ok(f, "A/0", 7, "verified");
	report_ok(f, "A/1", 7, "verified");
	report_ok(f, "A/0", 7, "active");
	report_ok(f, "A/1", 7, "active");
	j = replica_get(f, "A");
	assert_int_equal(jget_u64(j, "active"), 7);
	assert_int_equal(jget_u64(j, "target"), 7);
	assert_int_equal(jget_u64(j, "lag_versions"), 0);
	assert_int_equal(jget_u64(j, "lag_ms"), 0);
	assert_null(json_object_get(j, "disagreement"));
	json_decref(j);

	/* Versions keep coming while no rank fetches: every target follows the
	 * latest, and the latest is all that is retained. */
	register_node_ok(f, "B", 0, TP1);
	for (uint64_t v = 8; v <= 15; v++)
		publish_v(f, v, digs);
	assert_int_equal(target_of(f, "A"), 15);
	assert_int_equal(target_of(f, "B"), 15);
	assert_int_equal(retained_count(f), 1);
}

/* ---- offers and sources -------------------------------------------------------------------- */

/* The sources of parcel 0 -> 1 of v1 as site asks for them (NULL: no
 * site), the answer's JSON kept in r. */
static void site_sources_v(struct fx *f, uint64_t v, const char *site, struct trk_reply *r)
{
	char path[400];

	snprintf(path, sizeof(path),
		 TRK_API "/sources?version=%llu&layout=%s&src_rank=0&dst_rank=1%s%s",
		 (unsigned long long)v, HEX(f->tp2.digest), site ? "&site=" : "", site ? site : "");
	assert_int_equal(get(f, path, r), 200);
}

static void site_sources(struct fx *f, const char *site, struct trk_reply *r)
{
	site_sources_v(f, 1, site, r);
}

/* Ids of the answer's peers (kind peer), joined with spaces, in id order. */
static void peer_ids(json_t *answer, char *out, size_t cap)
{
	const char *ids[8];
	size_t n = 0, i, len = 0;
	json_t *s;

	json_array_foreach(json_object_get(answer, "sources"), i, s)
		if (strcmp(json_string_value(json_object_get(s, "kind")), "peer") == 0 && n < 8)
			ids[n++] = json_string_value(json_object_get(s, "id"));
	for (size_t a = 0; a < n; a++)
		for (size_t c = a + 1; c < n; c++)
			if (strcmp(ids[c], ids[a]) < 0) {
				const char *t = ids[a];
				ids[a] = ids[c];
				ids[c] = t;
			}
	out[0] = 0;
	for (size_t a = 0; a < n; a++)
		len += (size_t)snprintf(out + len, cap - len, "%s%s", a ? " " : "", ids[a]);
}

/* Sites: a node's /sources is its site's swarm and peers, the publishers
 * wherever they are; a parcel no publisher offers any more (retired)
 * lists every site's peers (not as members), so that it stays reachable,
 * but one a live publisher is about to offer (published, nothing of it
 * or newer offered yet) is the site's; sources say their site; /status
 * sums replicas per site. */
static void test_sources_sites(void **state)
{
	struct fx *f = *state;
	static const struct {
		const char *rep, *site;
	} nodes[] = {{"X", "east"}, {"Y", "west"}, {"Z", "west"}};
	struct trk_reply r;
	char b[2048], ids[128];

	register_publisher(f);
	publish_two(f);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(nodes); i++) {
		char *nb = node_body(f, nodes[i].rep, 1, "h", TP2, NULL), id[16];
		nb[strlen(nb) - 1] = 0; /* its closing brace: the site follows */
		snprintf(b, sizeof(b), "%s,\"site\":\"%s\"}", nb, nodes[i].site);
		free(nb);
		assert_int_equal(post(f, TRK_API "/nodes", b, &r), 200);
		trk_reply_fini(&r);
		snprintf(id, sizeof(id), "%s/1", nodes[i].rep);
		for (int v = 1; v <= 2; v++) {
			offer_body(b, sizeof(b), id, v, HEX(f->tp2.digest), 0, 1, 101);
			assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
			trk_reply_fini(&r);
		}
	}
	/* The latest version published, the publisher's offers not in yet:
	 * west's peers only (it read east's peers, and kept them a while,
	 * before: a copy crossed per replica; test_sites saw it under load).
	 * An older one it offers nothing of: as a retired one, below. */
	site_sources_v(f, 2, "west", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "Y/1 Z/1");
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 2);
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), 2);
	trk_reply_fini(&r);
	site_sources(f, "west", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "X/1 Y/1 Z/1");
	trk_reply_fini(&r);
	/* Offering version 1, version 2 is still awaited. */
	pub_offer(f, 1, 4);
	site_sources_v(f, 2, "west", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "Y/1 Z/1");
	trk_reply_fini(&r);

	/* The publisher offers it: each site's peers, and the publisher. */
	pub_offer(f, 1, 4);
	site_sources(f, "west", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "Y/1 Z/1");
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 3);
	json_t *members = json_object_get(r.json, "members");
	assert_int_equal(json_array_size(members), 2);
	assert_string_equal(json_string_value(json_array_get(members, 0)), "Y/1");
	json_t *src;
	size_t i;
	json_array_foreach(json_object_get(r.json, "sources"), i, src)
		if (json_is_string(json_object_get(src, "site")))
			assert_string_equal(json_string_value(json_object_get(src, "site")), "west");
	trk_reply_fini(&r);
	site_sources(f, "east", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "X/1");
	trk_reply_fini(&r);
	/* A node that names no site is in the unnamed one: none of these. */
	site_sources(f, NULL, &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "");
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 1);
	trk_reply_fini(&r);
	/* Retired (the publisher offers version 2, not 1 any more): west
	 * reads east's peer too, but its swarm (who splits the trainer's
	 * chunks) is west's. */
	pub_offer(f, 2, 4);
	pub_offer(f, 1, 0);
	site_sources(f, "west", &r);
	peer_ids(r.json, ids, sizeof(ids));
	assert_string_equal(ids, "X/1 Y/1 Z/1");
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), 2);
	trk_reply_fini(&r);

	/* The status sums them per site, by name. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_t *sites = json_object_get(r.json, "sites");
	assert_int_equal(json_array_size(sites), 3); /* the publisher's (unnamed), east, west */
	assert_true(json_is_null(json_object_get(json_array_get(sites, 0), "site")));
	assert_int_equal(json_integer_value(json_object_get(json_array_get(sites, 0),
							    "publishers_alive")), 1);
	assert_string_equal(json_string_value(json_object_get(json_array_get(sites, 2), "site")),
			    "west");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(sites, 2), "replicas")), 2);
	trk_reply_fini(&r);
}

static void test_sources(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char b[2048], path[256];
	struct trk_source *src;
	size_t n;
	struct proto_err err = {{0}};

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 0);
	trk_reply_fini(&r);

	/* The publisher offers all its parcels of v1 through the client. */
	struct trk_offer offers[4];
	for (int i = 0; i < 4; i++) {
		memcpy(offers[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
		offers[i].src_rank = (uint32_t)(i / 2);
		offers[i].dst_rank = (uint32_t)(i % 2);
		offers[i].addr = 0xfffffffffffff000ull + (uint64_t)i; /* above INT64_MAX */
		offers[i].key = 1000 + (uint64_t)i;
		offers[i].len = 100 + (uint64_t)i;
	}
	trk_reply_init(&r);
	assert_int_equal(trk_client_offer(f->c, f->pub_id, 1, offers, 4, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(trk_sources_parse(r.json, &src, &n, &err), 0);
	assert_int_equal(n, 1);
	assert_false(src[0].peer);
	assert_string_equal(src[0].id, f->pub_id);
	assert_string_equal(src[0].host, "t0");
	assert_string_equal(src[0].provider, "tcp;ofi_rxm");
	assert_int_equal(src[0].fabric_addr_len, 2);
	assert_int_equal(src[0].fabric_addr[0], 0xaa);
	assert_true(src[0].addr == 0xfffffffffffff001ull);
	assert_int_equal(src[0].key, 1001);
	assert_int_equal(src[0].len, 101);
	trk_sources_free(src, n);
	trk_reply_fini(&r);

	/* Refused offers: wrong length, a parcel or layout the manifest lacks,
	 * an unpublished version, an unknown id, a rank the publisher lacks,
	 * a node offering another rank's parcel. */
	struct {
		const char *id;
		int version, src, dst, len, want;
		bool other_layout;
	} bad[] = {
		{f->pub_id, 1, 0, 1, 999, 400, false}, {f->pub_id, 1, 0, 5, 101, 400, false},
		{f->pub_id, 1, 0, 1, 101, 400, true},  {f->pub_id, 9, 0, 1, 101, 409, false},
		{"nobody", 1, 0, 1, 101, 404, false},  {"A/0", 1, 0, 1, 101, 400, false},
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		offer_body(b, sizeof(b), bad[i].id, bad[i].version,
			   bad[i].other_layout ? HEX(f->tp1.digest) : HEX(f->tp2.digest), bad[i].src,
			   bad[i].dst, bad[i].len);
		if (post(f, TRK_API "/offers", b, &r) != bad[i].want)
			fail_msg("bad offer %zu: got %d (%s)", i, r.status, r.error);
		trk_reply_fini(&r);
	}
	/* A peer offers its parcel (0 -> 1) of v1: it is listed at once, also
	 * while it is still fetching (its have-page says which chunks it
	 * holds). */
	offer_body(b, sizeof(b), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);
	report_ok(f, "A/1", 1, "fetching");
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 2);
	/* The swarm of parcel 0 -> 1: rank 1 of the tp2 replica. */
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), 1);
	assert_string_equal(json_string_value(json_array_get(json_object_get(r.json, "members"), 0)),
			    "A/1");
	trk_reply_fini(&r);
	report_ok(f, "A/1", 1, "verified");
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources(f->c, 1, f->tp2.digest, 0, 1, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(trk_sources_parse(r.json, &src, &n, &err), 0);
	assert_int_equal(n, 2);
	assert_true(src[0].peer); /* peers first */
	assert_string_equal(src[0].id, "A/1");
	assert_int_equal(src[0].addr, 1);
	assert_false(src[1].peer);
	trk_sources_free(src, n);
	trk_reply_fini(&r);
	/* Other parcels are unaffected; withdrawing empties the publisher's. */
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=1&dst_rank=0",
		 HEX(f->tp2.digest));
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 1);
	trk_reply_fini(&r);
	snprintf(b, sizeof(b), "{\"id\":\"%s\",\"version\":1,\"parcels\":[]}", f->pub_id);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 0);
	trk_reply_fini(&r);
	/* Unknown version. */
	assert_int_equal(get(f, TRK_API "/sources?version=7&layout=00000000000000000000000000000000"
				    "00000000000000000000000000000000&src_rank=0&dst_rank=0",
			     &r),
			 404);
	trk_reply_fini(&r);

	/* A publisher process re-registering rank 1 replaces the old one (it
	 * served ranks 0 and 1: its offers go), and may not offer rank 0. */
	{
		char *pb = publisher_body(MODEL, TRAINER,
					  "[{\"rank\":1,\"host\":\"t1b\",\"provider\":\"tcp\","
					  "\"fabric_addr\":\"bb\"}]");
		assert_int_equal(post(f, TRK_API "/publishers", pb, &r), 200);
		char id2[TRK_ID_MAX];
		snprintf(id2, sizeof(id2), "%s",
			 json_string_value(json_object_get(r.json, "publisher_id")));
		trk_reply_fini(&r);
		free(pb);
		offer_body(b, sizeof(b), id2, 1, HEX(f->tp2.digest), 0, 1, 101);
		assert_int_equal(post(f, TRK_API "/offers", b, &r), 400);
		trk_reply_fini(&r);
		snprintf(path, sizeof(path),
			 TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
			 HEX(f->tp2.digest));
		assert_int_equal(get(f, path, &r), 200);
		json_t *only = json_object_get(r.json, "sources");
		assert_int_equal(json_array_size(only), 1);
		assert_string_equal(json_string_value(json_object_get(json_array_get(only, 0),
								       "kind")),
				    "peer");
		trk_reply_fini(&r);
	}

	/* Malformed answers are refused by the parser. */
	static const char *bad_answers[] = {
		"{}", "{\"sources\":3}", "{\"sources\":[{}]}",
		"{\"sources\":[{\"kind\":\"peer\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"zz\",\"addr\":\"1\",\"key\":\"1\",\"len\":1}]}",
		"{\"sources\":[{\"kind\":\"peer\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"aa\",\"addr\":1,\"key\":\"1\",\"len\":1}]}",
		"{\"sources\":[{\"kind\":\"alien\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"aa\",\"addr\":\"1\",\"key\":\"1\",\"len\":1}]}",
		/* a site that is not a name, or not a string */
		"{\"sources\":[{\"kind\":\"peer\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"aa\",\"addr\":\"1\",\"key\":\"1\",\"len\":1,\"site\":\"a b\"}]}",
		"{\"sources\":[{\"kind\":\"peer\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"aa\",\"addr\":\"1\",\"key\":\"1\",\"len\":1,\"site\":\"\"}]}",
		"{\"sources\":[{\"kind\":\"peer\",\"id\":\"a\",\"host\":\"h\",\"provider\":\"p\","
		"\"fabric_addr\":\"aa\",\"addr\":\"1\",\"key\":\"1\",\"len\":1,\"site\":3}]}",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad_answers); i++) {
		json_t *j = json_loads(bad_answers[i], 0, NULL);
		assert_non_null(j);
		assert_int_equal(trk_sources_parse(j, &src, &n, &err), -EINVAL);
		assert_null(src);
		json_decref(j);
	}
	static const char *bad_versions[] = {
		"{}", "{\"latest\":-1,\"versions\":[]}", "{\"latest\":1}",
		"{\"latest\":1,\"versions\":[{\"version\":1}]}",
		"{\"latest\":1,\"versions\":[{\"version\":1,\"parent\":0,\"wire_bytes\":1,"
		"\"created_ms\":1,\"published_ms\":1,\"kind\":\"anchor\",\"digest\":\"00\"}]}",
		"{\"latest\":1,\"versions\":[{\"version\":1,\"parent\":0,\"wire_bytes\":1,"
		"\"created_ms\":1,\"published_ms\":1,\"kind\":\"anchor\",\"digest\":\"0000000000000000000000000000000000000000000000000000000000000000\","
		"\"retain_layouts\":\"0000000000000000000000000000000000000000000000000000000000000000\"}]}",
		"{\"latest\":1,\"versions\":[{\"version\":1,\"parent\":0,\"wire_bytes\":1,"
		"\"created_ms\":1,\"published_ms\":1,\"kind\":\"anchor\",\"digest\":\"0000000000000000000000000000000000000000000000000000000000000000\","
		"\"retain_layouts\":[\"0000000000000000000000000000000000000000000000000000000000000000\",7]}]}",
		"{\"latest\":1,\"versions\":[{\"version\":1,\"parent\":0,\"wire_bytes\":1,"
		"\"created_ms\":1,\"published_ms\":1,\"kind\":\"anchor\",\"digest\":\"0000000000000000000000000000000000000000000000000000000000000000\","
		"\"retain_layouts\":[\"abc\"]}]}",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad_versions); i++) {
		json_t *j = json_loads(bad_versions[i], 0, NULL);
		struct trk_version_info *vi;
		uint64_t latest;
		assert_non_null(j);
		assert_int_equal(trk_versions_parse(j, &latest, &vi, &n, &err), -EINVAL);
		assert_null(vi);
		json_decref(j);
	}
	/* now_ms: absent (an older tracker) is no clock (0), not an error;
	 * anything but a non-negative integer is, with nothing kept. */
	static const struct {
		const char *json;
		int rc;
		uint64_t now_ms;
	} nows[] = {
		{"{\"latest\":0,\"versions\":[]}", 0, 0},
		{"{\"latest\":0,\"now_ms\":1700000000123,\"versions\":[]}", 0, 1700000000123ull},
		{"{\"latest\":0,\"now_ms\":-1,\"versions\":[]}", -EINVAL, 0},
		{"{\"latest\":0,\"now_ms\":\"1700000000123\",\"versions\":[]}", -EINVAL, 0},
		{"{\"latest\":0,\"now_ms\":1.5,\"versions\":[]}", -EINVAL, 0},
		{"{\"latest\":0,\"now_ms\":null,\"versions\":[]}", -EINVAL, 0},
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(nows); i++) {
		json_t *j = json_loads(nows[i].json, 0, NULL);
		uint64_t now_ms = 77;
		assert_non_null(j);
		assert_int_equal(trk_versions_now(j, &now_ms, &err), nows[i].rc);
		assert_int_equal(now_ms, nows[i].now_ms);
		if (nows[i].rc != 0)
			assert_non_null(strstr(err.msg, "now_ms"));
		json_decref(j);
	}
}

/* ---- status page and metrics ------------------------------------------------------------- */

static void test_status_outputs(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	regex_t re;
	char *b;

	register_publisher(f);
	publish_two(f);
	b = node_body(f, "A", 0, "<script>alert(1)</script>&\\\"", TP1, NULL);
	assert_int_equal(post(f, TRK_API "/nodes", b, &r), 200);
	trk_reply_fini(&r);
	free(b);
	report_ok(f, "A/0", 2, "active");

	/* JSON. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	static const char *keys[] = {"versions", "replicas", "publishers", "activations",
				     "bytes_from_trainer", "bytes_from_peers", "latest",
				     "nodes_alive", "model_digest"};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(keys); i++)
		assert_non_null(json_object_get(r.json, keys[i]));
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_status(f->c, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);

	/* The page: HTML, refreshing itself, outside text escaped. */
	assert_int_equal(get(f, "/", &r), 200);
	b = (char *)r.body;
	assert_non_null(strstr(b, "<!doctype html>"));
	assert_non_null(strstr(b, "http-equiv=\"refresh\""));
	assert_non_null(strstr(b, "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;"));
	assert_null(strstr(b, "<script>alert"));
	assert_non_null(strstr(b, "</html>"));
	trk_reply_fini(&r);

	/* Metrics: every line a comment or `name{labels} value`. */
	assert_int_equal(get(f, "/metrics", &r), 200);
	assert_int_equal(regcomp(&re, "^[a-z_]+(\\{[a-z_]+=\"[^\"]*\"\\})? [0-9]+(\\.[0-9]+)?$",
				 REG_EXTENDED | REG_NOSUB),
			 0);
	char *save = NULL;
	for (char *line = strtok_r((char *)r.body, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		if (line[0] == '#') {
			assert_true(strncmp(line, "# HELP ", 7) == 0 ||
				    strncmp(line, "# TYPE ", 7) == 0);
			continue;
		}
		if (regexec(&re, line, 0, NULL, 0) != 0)
			fail_msg("bad metrics line: %s", line);
	}
	regfree(&re);
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/metrics", &r), 200);
	b = (char *)r.body;
	assert_non_null(strstr(b, "tessera_tracker_versions 2\n"));
	assert_non_null(strstr(b, "tessera_tracker_latest_version 2\n"));
	assert_non_null(strstr(b, "tessera_tracker_replicas{state=\"current\"} 1\n"));
	assert_non_null(strstr(b, "tessera_tracker_nodes{state=\"alive\"} 1\n"));
	assert_non_null(strstr(b, "tessera_tracker_reported_fetched_bytes_total{source=\"trainer\"} 0\n"));
	assert_non_null(strstr(b, "tessera_tracker_reported_fetched_bytes_total{source=\"peer\"} 0\n"));
	trk_reply_fini(&r);
}

/* ---- status at scale: pages of replicas, capped name lists ------------------------ */

/* The replica names of a status answer, joined by ','. */
static void names_of(json_t *st, char *out, size_t n)
{
	size_t i, k = 0;
	json_t *rep;

	out[0] = 0;
	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		k += (size_t)snprintf(out + k, n - k, "%s%s", i ? "," : "",
				      json_string_value(json_object_get(rep, "replica")));
}

static void test_status_pages(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char name[16], id[24], names[512];

	register_publisher(f);
	publish_two(f);
	for (int i = 0; i < 40; i++) {
		snprintf(name, sizeof(name), "P%02d", i);
		register_node_ok(f, name, 0, TP1);
		snprintf(id, sizeof(id), "%s/0", name);
		report_ok(f, id, 2, "active");
	}
	/* All 40 by default, counted by state; version 2 lists 32 names of 40. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 40);
	assert_int_equal(jget_u64(r.json, "replicas_total"), 40);
	assert_int_equal(jget_u64(r.json, "replicas_offset"), 0);
	assert_int_equal(jget_u64(json_object_get(r.json, "replicas_by_state"), "current"), 40);
	assert_int_equal(jget_u64(json_object_get(r.json, "replicas_by_state"), "behind"), 0);
	json_t *v2 = json_array_get(json_object_get(r.json, "versions"), 0);
	assert_int_equal(jget_u64(v2, "version"), 2);
	assert_int_equal(jget_u64(v2, "complete_count"), 40);
	assert_int_equal(jget_u64(v2, "active_count"), 40);
	assert_int_equal(json_array_size(json_object_get(v2, "complete")), 32);
	assert_int_equal(json_array_size(json_object_get(v2, "active")), 32);
	assert_string_equal(json_string_value(json_array_get(json_object_get(v2, "active"), 31)),
			    "P31");
	trk_reply_fini(&r);
	/* A page from the middle, one past the end. */
	assert_int_equal(get(f, TRK_API "/status?replicas_offset=10&replicas_limit=5", &r), 200);
	names_of(r.json, names, sizeof(names));
	assert_string_equal(names, "P10,P11,P12,P13,P14");
	assert_int_equal(jget_u64(r.json, "replicas_total"), 40);
	assert_int_equal(jget_u64(r.json, "replicas_limit"), 5);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/status?replicas_offset=40", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 0);
	assert_int_equal(jget_u64(r.json, "replicas_total"), 40);
	trk_reply_fini(&r);
	/* Bad page parameters, on the JSON and on the page. */
	static const char *bad[] = {"replicas_limit=100001", "replicas_limit=x",
				    "replicas_offset=-1", "replicas_offset=1e3"};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		char path[128];
		snprintf(path, sizeof(path), TRK_API "/status?%s", bad[i]);
		assert_int_equal(get(f, path, &r), 400);
		assert_non_null(strstr(r.error, "replicas_"));
		trk_reply_fini(&r);
		snprintf(path, sizeof(path), "/?%s", bad[i]);
		assert_int_equal(get(f, path, &r), 400);
		trk_reply_fini(&r);
	}
	/* The page shows the same slice, with counts and links. */
	assert_int_equal(get(f, "/?replicas_offset=10&replicas_limit=5", &r), 200);
	char *b = (char *)r.body, *reps = strstr(b, "<h2>Replicas"),
	     *pubs = reps ? strstr(reps, "<h2>Update timelines") : NULL;
	assert_non_null(reps);
	assert_non_null(pubs);
	assert_non_null(strstr(pubs, "&hellip; (40 in all)")); /* in the versions table */
	*pubs = 0; /* look at the replicas section alone */
	assert_non_null(strstr(reps, "40 replicas: 40 current, 0 updating, 0 behind, 0 failed, 0 partial, 0 gone"));
	assert_non_null(strstr(reps, "showing 11&ndash;15"));
	assert_non_null(strstr(reps, "href=\"/?replicas_offset=5&amp;replicas_limit=5\">previous"));
	assert_non_null(strstr(reps, "href=\"/?replicas_offset=15&amp;replicas_limit=5\">next"));
	assert_non_null(strstr(reps, ">P10<"));
	assert_non_null(strstr(reps, ">P14<"));
	assert_null(strstr(reps, ">P09<"));
	assert_null(strstr(reps, ">P15<"));
	trk_reply_fini(&r);

	/* Two replicas of 150 ranks each (one registered): unasked, a page
	 * stops before its rank rows pass 200 (40 + 150 here) and says how
	 * many replicas it shows; asked for a count, it shows that many. */
	static const char W150[] = "{\"ranks\":150,\"tensors\":[{\"match\":\"*\",\"replicate\":true}]}";
	register_node_ok(f, "W0", 0, W150);
	register_node_ok(f, "W1", 0, W150);
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 41);
	assert_int_equal(jget_u64(r.json, "replicas_limit"), 41);
	assert_int_equal(jget_u64(r.json, "replicas_total"), 42);
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, "href=\"/?replicas_offset=41&amp;replicas_limit=41\">next"));
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/status?replicas_limit=100", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 42);
	trk_reply_fini(&r);
}

/* ---- the client on its own ----------------------------------------------------------------- */

/* GET /versions/V/timeline: the boundaries of an update as the publisher,
 * the nodes and the tracker saw them pass. */
static void timeline_report(struct fx *f, const char *id, const char *state, uint64_t first,
			    uint64_t last)
{
	struct trk_reply r;
	char b[512];
	snprintf(b, sizeof(b),
		 "{\"id\":\"%s\",\"version\":1,\"state\":\"%s\",\"bytes_done\":100,"
		 "\"bytes_total\":100,\"first_byte_ms\":%llu,\"last_byte_ms\":%llu}",
		 id, state, (unsigned long long)first, (unsigned long long)last);
	assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
	trk_reply_fini(&r);
}

static json_t *rank_of(json_t *rep, int rank)
{
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(rep, "ranks"), i, e)
		if (json_integer_value(json_object_get(e, "rank")) == rank)
			return e;
	fail_msg("rank %d not in the timeline", rank);
	return NULL;
}

static void test_timeline(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char b[1024];
	json_t *rep;

	populate(f);
	register_node_ok(f, "B", 0, TP1);
	/* Nothing but the version's own times yet. */
	assert_int_equal(get(f, TRK_API "/versions/1/timeline", &r), 200);
	assert_int_equal(jget_u64(r.json, "version"), 1);
	assert_string_equal(json_string_value(json_object_get(r.json, "kind")), "anchor");
	assert_int_equal(jget_u64(r.json, "export_asked_ms"), 1700000000001ull); /* the manifest's */
	assert_true(json_is_null(json_object_get(r.json, "snapshot_ms")));
	uint64_t published = jget_u64(r.json, "published_ms");
	assert_true(published > 1700000000001ull);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 0);
	trk_reply_fini(&r);

	/* The publisher's snapshot time comes with its offer. */
	snprintf(b, sizeof(b),
		 "{\"id\":\"%s\",\"version\":1,\"snapshot_ms\":1700000000500,\"parcels\":[]}",
		 f->pub_id);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);

	/* A's ranks: bytes, verified, active; B only starts. */
	timeline_report(f, "A/0", "fetching", 1700000001000ull, 1700000001100ull);
	timeline_report(f, "A/1", "fetching", 1700000001010ull, 1700000001010ull);
	timeline_report(f, "B/0", "fetching", 1700000001020ull, 1700000001030ull);
	assert_int_equal(get(f, TRK_API "/versions/1/timeline", &r), 200);
	rep = json_array_get(json_object_get(r.json, "replicas"), 0);
	assert_string_equal(json_string_value(json_object_get(rep, "replica")), "A");
	assert_true(json_is_null(json_object_get(rep, "prepared_ms")));
	assert_true(json_is_null(json_object_get(rank_of(rep, 0), "verified_ms")));
	trk_reply_fini(&r);
	timeline_report(f, "A/0", "verified", 1700000001000ull, 1700000002000ull);
	timeline_report(f, "A/1", "verified", 1700000001010ull, 1700000002100ull);
	timeline_report(f, "A/0", "active", 1700000001000ull, 1700000002000ull);
	timeline_report(f, "A/1", "active", 1700000001010ull, 1700000002100ull);

	assert_int_equal(get(f, TRK_API "/versions/1/timeline", &r), 200);
	assert_int_equal(jget_u64(r.json, "snapshot_ms"), 1700000000500ull);
	assert_int_equal(jget_u64(r.json, "published_ms"), published);
	json_t *reps = json_object_get(r.json, "replicas");
	assert_int_equal(json_array_size(reps), 2);
	rep = json_array_get(reps, 0);
	assert_string_equal(json_string_value(json_object_get(rep, "replica")), "A");
	assert_int_equal(jget_u64(rep, "nranks"), 2);
	uint64_t prepared = jget_u64(rep, "prepared_ms"), activated = jget_u64(rep, "activated_ms");
	assert_true(prepared >= published && activated >= prepared);
	assert_int_equal(jget_u64(rank_of(rep, 0), "first_byte_ms"), 1700000001000ull);
	assert_int_equal(jget_u64(rank_of(rep, 0), "last_byte_ms"), 1700000002000ull);
	assert_int_equal(jget_u64(rank_of(rep, 1), "first_byte_ms"), 1700000001010ull);
	assert_int_equal(jget_u64(rank_of(rep, 1), "last_byte_ms"), 1700000002100ull);
	for (int k = 0; k < 2; k++) {
		uint64_t ver = jget_u64(rank_of(rep, k), "verified_ms");
		assert_true(ver >= published && ver <= prepared);
		assert_true(jget_u64(rank_of(rep, k), "activated_ms") >= ver);
	}
	/* B: bytes so far, nothing else. */
	rep = json_array_get(reps, 1);
	assert_string_equal(json_string_value(json_object_get(rep, "replica")), "B");
	assert_true(json_is_null(json_object_get(rep, "prepared_ms")));
	assert_true(json_is_null(json_object_get(rep, "activated_ms")));
	assert_int_equal(jget_u64(rank_of(rep, 0), "first_byte_ms"), 1700000001020ull);
	assert_true(json_is_null(json_object_get(rank_of(rep, 0), "verified_ms")));
	trk_reply_fini(&r);

	/* Version 2 has its own (empty) timeline; bad and unknown versions. */
	assert_int_equal(get(f, TRK_API "/versions/2/timeline", &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "replicas")), 0);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/3/timeline", &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/0/timeline", &r), 400);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/x/timeline", &r), 400);
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/versions/1/timeline", "{}", &r), 405);
	trk_reply_fini(&r);

	/* The status page draws it. */
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, "<svg class=\"timeline\""));
	assert_non_null(strstr((char *)r.body, "<title>transfer: 1.100 s"));
	trk_reply_fini(&r);

	/* Its own page, linked from the status page; bad versions refused
	 * with one line. */
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, "<a href=\"/versions/1\">"));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/versions/1", &r), 200);
	assert_non_null(strstr((char *)r.body, "<h1>version 1</h1>"));
	assert_non_null(strstr((char *)r.body, "<svg class=\"timeline\""));
	assert_non_null(strstr((char *)r.body, "<tr><td>A</td><td>2</td><td>+"));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/versions/abc", &r), 400);
	assert_non_null(strstr((char *)r.body, "version 'abc' is not a positive integer"));
	trk_reply_fini(&r);
	/* A leading zero is not another spelling of v1. */
	assert_int_equal(get(f, "/versions/01", &r), 400);
	assert_non_null(strstr((char *)r.body, "without leading zeros"));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/versions/99999999999999999999", &r), 400);
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/versions/3", &r), 404);
	assert_non_null(strstr((char *)r.body, "version 3 is unknown"));
	trk_reply_fini(&r);

	/* Every replica's state in words: B mid-fetch, A active on v1 while
	 * v2 is out. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_t *rp;
	size_t i;
	json_array_foreach(json_object_get(r.json, "replicas"), i, rp) {
		const char *st = json_string_value(json_object_get(rp, "state"));
		const char *why = json_string_value(json_object_get(rp, "why"));
		assert_non_null(st);
		assert_non_null(why);
		assert_true(why[0] != 0);
	}
	trk_reply_fini(&r);
}

/* The publisher's report of a version's export comes with its offer
 * ("publish") and shows, as it came, in the version's timeline and its
 * entry of the status; a version without one shows none; a later offer
 * without one keeps it. A node cannot send one, and a bad one (the
 * tracker-bad-offers-publish-* corpus, each field) is refused whole with
 * one line, the offer with it. */
static void test_publish_report(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char b[2048];
	const char *pub =
		"{\"total_ms\":6120,\"phases_ms\":[[\"snapshot\",712],[\"wait\",0],"
		"[\"delta encode\",950],[\"gather+hash\",4227],[\"sign\",40],[\"publish\",12]],"
		"\"delta\":{\"tried\":true,\"kept\":false,\"encode_ms\":950,\"percent\":50.1,"
		"\"stopped_early\":true,\"why\":\"its output passed 50 % of the anchor after "
		"31 % of its bytes\"}}";

	populate(f);
	register_node_ok(f, "B", 0, TP1);
	snprintf(b, sizeof(b), "{\"id\":\"%s\",\"version\":1,\"parcels\":[],\"publish\":%s}",
		 f->pub_id, pub);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);
	json_t *want = json_loads(pub, 0, NULL);
	assert_non_null(want);
	assert_int_equal(get(f, TRK_API "/versions/1/timeline", &r), 200);
	assert_true(json_equal(json_object_get(r.json, "publish"), want));
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/2/timeline", &r), 200);
	assert_null(json_object_get(r.json, "publish"));
	trk_reply_fini(&r);
	/* The status: each version's entry, newest first. */
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_t *vs = json_object_get(r.json, "versions");
	assert_int_equal(json_array_size(vs), 2);
	assert_null(json_object_get(json_array_get(vs, 0), "publish"));
	assert_true(json_equal(json_object_get(json_array_get(vs, 1), "publish"), want));
	trk_reply_fini(&r);
	/* An anchor tried as nothing else: no delta member. */
	snprintf(b, sizeof(b),
		 "{\"id\":\"%s\",\"version\":2,\"parcels\":[],\"publish\":{\"total_ms\":5,"
		 "\"phases_ms\":[[\"snapshot\",1],[\"gather+hash\",4]]}}", f->pub_id);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/2/timeline", &r), 200);
	json_t *p2 = json_object_get(r.json, "publish");
	assert_int_equal(jget_u64(p2, "total_ms"), 5);
	assert_int_equal(json_array_size(json_object_get(p2, "phases_ms")), 2);
	assert_null(json_object_get(p2, "delta"));
	trk_reply_fini(&r);
	/* Offered again without one: the report stays. */
	snprintf(b, sizeof(b), "{\"id\":\"%s\",\"version\":1,\"parcels\":[]}", f->pub_id);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, TRK_API "/versions/1/timeline", &r), 200);
	assert_true(json_equal(json_object_get(r.json, "publish"), want));
	trk_reply_fini(&r);
	/* A node's offer with one is refused, and so are bad ones, each
	 * with the field named in one line. */
	char *before = status_snapshot(f);
	snprintf(b, sizeof(b), "{\"id\":\"B/0\",\"version\":1,\"parcels\":[],\"publish\":%s}", pub);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 400);
	assert_non_null(strstr(json_string_value(json_object_get(r.json, "error")),
			       "only a publisher"));
	trk_reply_fini(&r);
	static const struct {
		const char *publish, *says;
	} bad[] = {
		{"{\"total_ms\":-1,\"phases_ms\":[]}", "publish.total_ms: must be in 0.."},
		{"{\"total_ms\":9,\"phases_ms\":[[\"x\",1],[\"x\",1],[\"x\",1],[\"x\",1],[\"x\",1],"
		 "[\"x\",1],[\"x\",1],[\"x\",1],[\"x\",1]]}", "publish.phases_ms: must be an array of at most 8"},
		{"{\"total_ms\":9,\"phases_ms\":[[\"aaaaaaaaaaaaaaaaaaaaaaaaa\",1]]}",
		 "publish.phases_ms[0]: the name must be 1..24 bytes"},
		{"{\"total_ms\":9,\"phases_ms\":[[\"x\",1],[\"Sign\",1]]}",
		 "publish.phases_ms[1]: the name may hold only"},
		{"{\"total_ms\":9,\"phases_ms\":[[\"x\",10]]}", "add up to 10 ms, more than total_ms"},
		{"{\"total_ms\":9,\"phases_ms\":[],\"delta\":{\"tried\":true,\"kept\":true,"
		 "\"encode_ms\":1,\"percent\":\"1\",\"stopped_early\":false,\"why\":\"w\"}}",
		 "publish.delta.percent: must be a number"},
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		snprintf(b, sizeof(b), "{\"id\":\"%s\",\"version\":2,\"parcels\":[],\"publish\":%s}",
			 f->pub_id, bad[i].publish);
		assert_int_equal(post(f, TRK_API "/offers", b, &r), 400);
		const char *e = json_string_value(json_object_get(r.json, "error"));
		if (e == NULL || strstr(e, bad[i].says) == NULL)
			fail_msg("case %zu: got '%s', want '%s'", i, e ? e : "", bad[i].says);
		trk_reply_fini(&r);
	}
	char *after = status_snapshot(f);
	assert_string_equal(before, after);
	free(before);
	free(after);
	json_decref(want);
}

/* A node names its layout ("tp2", a file's name); the status shows the name
 * of the first node that gave one, the page shows it instead of a digest. */
static void test_layout_names(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char *b, *named;

	register_publisher(f);
	b = node_body(f, "A", 0, "h", TP2, NULL);
	named = malloc(strlen(b) + 64);
	assert_non_null(named);
	snprintf(named, strlen(b) + 64, "%.*s,\"layout_name\":\"tp2\"}", (int)strlen(b) - 1, b);
	assert_int_equal(post(f, TRK_API "/nodes", named, &r), 200);
	trk_reply_fini(&r);
	free(named);
	free(b);
	register_node_ok(f, "A", 1, TP2); /* no name: the first one stays */
	register_node_ok(f, "B", 0, TP1);
	assert_int_equal(get(f, TRK_API "/status", &r), 200);
	json_t *reps = json_object_get(r.json, "replicas");
	assert_string_equal(json_string_value(json_object_get(json_array_get(reps, 0), "layout_name")),
			    "tp2");
	assert_true(json_is_null(json_object_get(json_array_get(reps, 1), "layout_name")));
	trk_reply_fini(&r);
	assert_int_equal(get(f, "/", &r), 200);
	assert_non_null(strstr((char *)r.body, ">tp2 (2 ranks)</td>"));
	char code[64];
	snprintf(code, sizeof(code), "<code>%.12s</code> (1 rank)", HEX(f->tp1.digest));
	assert_non_null(strstr((char *)r.body, code));
	trk_reply_fini(&r);
}

static int cb_calls;
static void count_cb(const struct trk_answer *a, void *arg)
{
	cb_calls++;
}

static void test_client(void **state)
{
	struct fx *f = *state;
	struct trk_client *c;
	struct trk_reply r;
	struct proto_err err = {{0}};
	int fd, port;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	char url[64];

	/* Bad URLs. */
	assert_int_equal(trk_client_new(NULL, "ftp://x:1", NULL, &c, &err), -EINVAL);
	assert_null(c);
	assert_int_equal(trk_client_new(NULL, "not a url", NULL, &c, &err), -EINVAL);
	/* A request that cannot be sent never calls back. */
	cb_calls = 0;
	assert_int_equal(trk_client_request(f->c, "PUT", "/x", NULL, NULL, 0, 0, count_cb, NULL),
			 -EINVAL);
	assert_int_equal(trk_client_request(f->c, "GET", "no-slash", NULL, NULL, 0, 0, count_cb,
					    NULL),
			 -EINVAL);
	assert_int_equal(trk_client_replica(f->c, "a/b", count_cb, NULL), -EINVAL);
	assert_int_equal(cb_calls, 0);

	/* Nobody listening: a transport error, not an HTTP status. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	assert_int_equal(trk_client_new(NULL, url, NULL, &c, &err), 0);
	assert_true(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r) < 0);
	assert_true(r.status < 0);
	assert_true(strlen(r.error) > 0);
	trk_reply_fini(&r);
	/* Freeing with requests pending calls no callback. */
	cb_calls = 0;
	assert_int_equal(trk_client_status(c, count_cb, NULL), 0);
	trk_client_free(c);
	assert_int_equal(cb_calls, 0);

	/* A timeout: a listener that never answers. */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_port = 0;
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(fd, 4), 0);
	sl = sizeof(sa);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(sa.sin_port));
	assert_int_equal(trk_client_new(NULL, url, NULL, &c, &err), 0);
	trk_client_set_timeout(c, 200);
	assert_int_equal(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r),
			 -ETIMEDOUT);
	trk_reply_fini(&r);
	trk_client_free(c);
	close(fd);

	/* Typed helpers against the real tracker. */
	register_publisher(f);
	publish_two(f);
	json_t *layout = json_loads(TP2, 0, NULL);
	struct trk_node_reg reg = {
		.replica = "A",
		.addr = {.rank = 0, .host = "h0", .provider = "tcp", .fabric_addr = "0a0b"},
		.layout = layout,
		.model_digest = f->model.digest,
	};
	trk_reply_init(&r);
	assert_int_equal(trk_client_register_node(f->c, &reg, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	json_decref(layout);
	trk_reply_init(&r);
	assert_int_equal(trk_client_heartbeat(f->c, "A/0", trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	struct trk_state_report rep = {.id = "A/0", .version = 1, .state = TRK_STATE_VERIFIED,
				       .bytes_done = 5, .bytes_total = 5, .bytes_from_trainer = 5};
	trk_reply_init(&r);
	assert_int_equal(trk_client_report_state(f->c, &rep, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_false(json_is_true(json_object_get(r.json, "replica_complete")));
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_get_manifest(f->c, 2, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	uint8_t d[PROTO_HASH_BYTES];
	crypto_generichash(d, sizeof(d), r.body, r.len, NULL, 0);
	assert_memory_equal(d, f->d2, PROTO_HASH_BYTES);
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_layouts(f->c, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_replica(f->c, "A", trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	/* Register a publisher through the typed helper. */
	json_t *jm = proto_model_to_json(&f->model), *jl = proto_layout_to_json(&f->model, &f->tl);
	struct trk_rank_addr ra = {.rank = 0, .host = "t", .provider = "tcp", .fabric_addr = "ff"};
	trk_reply_init(&r);
	assert_int_equal(trk_client_register_publisher(f->c, jm, jl, &ra, 1, 0, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	json_decref(jm);
	json_decref(jl);
}

/* ---- the program ------------------------------------------------------------------------ */

static void test_binary(void **state)
{
	struct fx *f = *state;
	char bin[4096], sdir[4096], line[512] = "";
	int out[2], status;
	pid_t pid;
	FILE *fp;

	tu_bin(bin, sizeof(bin), "tessera-tracker");
	if (access(bin, X_OK) != 0) {
		fprintf(stderr, "skipping: %s not built\n", bin);
		skip();
	}
	snprintf(sdir, sizeof(sdir), "%s/bin-state", f->dir);
	assert_int_equal(pipe(out), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(out[1], 1);
		close(out[0]);
		close(out[1]);
		execl(bin, bin, "--listen", "127.0.0.1:0", "--state", sdir, (char *)NULL);
		_exit(127);
	}
	close(out[1]);
	fp = fdopen(out[0], "r");
	assert_non_null(fp);
	assert_non_null(fgets(line, sizeof(line), fp));
	assert_true(strncmp(line, "listening on http://127.0.0.1:", 30) == 0);
	line[strcspn(line, "\n")] = 0;

	struct trk_client *c;
	struct trk_reply r;
	assert_int_equal(trk_client_new(NULL, line + strlen("listening on "), NULL, &c, NULL), 0);
	assert_int_equal(trk_client_call(c, "GET", TRK_API "/status", NULL, NULL, 0, &r), 0);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	trk_client_free(c);

	/* A second tracker on the port the first holds fails to bind and
	 * leaves no state directory behind (it binds before it opens one). */
	char taken[4096];
	struct stat st;
	snprintf(taken, sizeof(taken), "%s/taken-state", f->dir);
	assert_int_equal(tu_sh("'%s' --listen '%s' --state '%s' 2>/dev/null", bin,
			       line + strlen("listening on http://"), taken),
			 1);
	assert_int_equal(stat(taken, &st), -1);
	assert_int_equal(errno, ENOENT);

	assert_int_equal(kill(pid, SIGTERM), 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	fclose(fp);

	/* Bad arguments fail with a message, not a crash. */
	assert_int_equal(tu_sh("'%s' --listen nowhere --state '%s' 2>/dev/null", bin, sdir), 1);
	assert_int_equal(tu_sh("'%s' --state '%s' 2>/dev/null", bin, sdir), 2);
	assert_int_equal(tu_sh("'%s' --listen 127.0.0.1:0 --state '%s' --cluster-key /nonexistent "
			       "2>/dev/null",
			       bin, sdir),
			 1);
}

/* The ids of a /sources answer's sources, sorted, as "A/1,pub-..". */
static void source_ids(json_t *answer, char *out, size_t cap)
{
	struct trk_source *src;
	struct proto_err err = {{0}};
	size_t n, at = 0;

	assert_int_equal(trk_sources_parse(answer, &src, &n, &err), 0);
	for (size_t i = 0; i < n; i++)
		for (size_t j = i + 1; j < n; j++)
			if (strcmp(src[j].id, src[i].id) < 0) {
				struct trk_source t = src[i];
				src[i] = src[j];
				src[j] = t;
			}
	out[0] = 0;
	for (size_t i = 0; i < n; i++)
		at += (size_t)snprintf(out + at, cap - at, "%s%s", i ? "," : "", src[i].id);
	trk_sources_free(src, n);
}

/* POST /sources answers several parcels at once, each as GET /sources
 * answers it, an unknown version as that parcel's 404; a malformed batch
 * is refused whole (the corpus: tracker-bad-sources-*). */
static void test_sources_batch(void **state)
{
	struct fx *f = *state;
	struct trk_reply r, g;
	struct trk_offer offers[4];
	struct trk_parcel_key k[4] = {{0}};
	char path[256], want[512], got[512];

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	for (int i = 0; i < 4; i++) {
		memcpy(offers[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
		offers[i].src_rank = (uint32_t)(i / 2);
		offers[i].dst_rank = (uint32_t)(i % 2);
		offers[i].addr = 4096 * (uint64_t)(i + 1);
		offers[i].key = 1000 + (uint64_t)i;
		offers[i].len = 100 + (uint64_t)i;
	}
	trk_reply_init(&r);
	assert_int_equal(trk_client_offer(f->c, f->pub_id, 1, offers, 4, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	trk_reply_fini(&r);
	char b[512];
	offer_body(b, sizeof(b), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
	trk_reply_fini(&r);

	for (int i = 0; i < 4; i++) {
		memcpy(k[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
		k[i].version = i == 3 ? 99 : 1;
		k[i].src_rank = (uint32_t)(i / 2);
		k[i].dst_rank = (uint32_t)(i % 2);
	}
	assert_int_equal(trk_client_sources_batch(f->c, k, 0, trk_reply_cb, &r), -EINVAL);
	assert_int_equal(trk_client_sources_batch(f->c, k, TRK_SOURCES_BATCH_MAX + 1, trk_reply_cb, &r),
			 -EINVAL);
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources_batch(f->c, k, 4, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	json_t *answers = json_object_get(r.json, "answers");
	assert_int_equal(json_array_size(answers), 4);
	for (size_t i = 0; i < 3; i++) {
		json_t *one = json_array_get(answers, i);
		snprintf(path, sizeof(path),
			 TRK_API "/sources?version=1&layout=%s&src_rank=%u&dst_rank=%u",
			 HEX(f->tp2.digest), k[i].src_rank, k[i].dst_rank);
		assert_int_equal(get(f, path, &g), 200);
		source_ids(g.json, want, sizeof(want));
		source_ids(one, got, sizeof(got));
		assert_string_equal(got, want);
		assert_true(json_equal(json_object_get(one, "members"),
				       json_object_get(g.json, "members")));
		trk_reply_fini(&g);
	}
	/* Parcel 0 -> 1 has the peer and the publisher; 99 is unknown. */
	source_ids(json_array_get(answers, 1), got, sizeof(got));
	snprintf(want, sizeof(want), "A/1,%s", f->pub_id);
	assert_string_equal(got, want);
	json_t *unknown = json_array_get(answers, 3);
	assert_int_equal(json_integer_value(json_object_get(unknown, "status")), 404);
	assert_non_null(json_string_value(json_object_get(unknown, "error")));

	/* A query naming the members list it holds gets "members_same"
	 * instead of the list; another tag (the list changed) gets it. */
	char tag[TRK_MEMBERS_TAG_HEX + 1];
	const char *t = json_string_value(json_object_get(json_array_get(answers, 1), "members_tag"));
	assert_non_null(t);
	assert_int_equal(strlen(t), TRK_MEMBERS_TAG_HEX);
	memcpy(tag, t, sizeof(tag));
	memcpy(k[1].members_tag, tag, TRK_MEMBERS_TAG_HEX + 1);
	snprintf(k[0].members_tag, sizeof(k[0].members_tag), "%s", "0123456789abcdef");
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources_batch(f->c, k, 2, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	answers = json_object_get(r.json, "answers");
	assert_true(json_is_array(json_object_get(json_array_get(answers, 0), "members")));
	assert_null(json_object_get(json_array_get(answers, 0), "members_same"));
	assert_null(json_object_get(json_array_get(answers, 1), "members"));
	assert_true(json_is_true(json_object_get(json_array_get(answers, 1), "members_same")));
	source_ids(json_array_get(answers, 1), got, sizeof(got));
	assert_string_equal(got, want);
	trk_reply_fini(&r);
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources_key(f->c, &k[1], trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_null(json_object_get(r.json, "members"));
	assert_true(json_is_true(json_object_get(r.json, "members_same")));
	assert_string_equal(json_string_value(json_object_get(r.json, "members_tag")), tag);
	trk_reply_fini(&r);
	/* A tag that is not 16 lower-case hex digits is refused. */
	static const char *const bad_tags[] = {"xyz", "ABCDEF0123456789", "0123456789abcdef0", ""};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad_tags); i++) {
		snprintf(path, sizeof(path),
			 TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1&members_tag=%s",
			 HEX(f->tp2.digest), bad_tags[i]);
		assert_int_equal(get(f, path, &g), 400);
		trk_reply_fini(&g);
	}
	assert_int_equal(get(f, "/metrics", &r), 200);
	assert_non_null(strstr((char *)r.body, "\ntessera_tracker_sources_batches_total 2\n"));
	assert_non_null(strstr((char *)r.body, "\ntessera_tracker_sources_batched_parcels_total 6\n"));
	trk_reply_fini(&r);
}

/* A batch asking for shared members lists carries each list of replica
 * names once; expanded, every answer's members are GET /sources' own. */
static void test_sources_shared(void **state)
{
	struct fx *f = *state;
	struct trk_reply r, g;
	struct trk_parcel_key k[3] = {{0}};
	uint32_t dst[3];
	char path[256];

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 0, TP2);
	register_node_ok(f, "A", 1, TP2);
	register_node_ok(f, "B", 0, TP2);
	register_node_ok(f, "B", 1, TP2);
	register_node_ok(f, "C", 0, TP2); /* C/1 never came: dst 1's list lacks C */
	for (int i = 0; i < 3; i++) {
		memcpy(k[i].layout, f->tp2.digest, PROTO_HASH_BYTES);
		k[i].version = 1;
		k[i].src_rank = (uint32_t)(i / 2);
		k[i].dst_rank = dst[i] = (uint32_t)(i % 2);
	}
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources_shared(f->c, k, 3, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	/* dst 0 (twice, two src ranks) and dst 1: two lists. */
	assert_int_equal(json_object_size(json_object_get(r.json, "replicas")), 2);
	json_t *answers = json_object_get(r.json, "answers");
	for (size_t i = 0; i < 3; i++) {
		json_t *one = json_array_get(answers, i);
		assert_null(json_object_get(one, "members"));
		assert_non_null(json_string_value(json_object_get(one, "members_of")));
	}
	assert_int_equal(trk_sources_expand(r.json, dst, 3), 0);
	for (size_t i = 0; i < 3; i++) {
		json_t *one = json_array_get(answers, i);
		snprintf(path, sizeof(path),
			 TRK_API "/sources?version=1&layout=%s&src_rank=%u&dst_rank=%u",
			 HEX(f->tp2.digest), k[i].src_rank, k[i].dst_rank);
		assert_int_equal(get(f, path, &g), 200);
		assert_true(json_equal(json_object_get(one, "members"),
				       json_object_get(g.json, "members")));
		assert_int_equal(json_array_size(json_object_get(one, "members")), i % 2 ? 2 : 3);
		assert_null(json_object_get(one, "members_of"));
		if (i == 1)
			snprintf(k[1].members_tag, sizeof(k[1].members_tag), "%s",
				 json_string_value(json_object_get(g.json, "members_tag")));
		trk_reply_fini(&g);
	}
	trk_reply_fini(&r);

	/* A rank that holds its list gets "members_same" and no list. */
	trk_reply_init(&r);
	assert_int_equal(trk_client_sources_shared(f->c, &k[1], 1, trk_reply_cb, &r), 0);
	trk_client_wait(f->c, &r);
	assert_int_equal(r.status, 200);
	assert_true(json_is_true(json_object_get(json_array_get(json_object_get(r.json, "answers"), 0),
						 "members_same")));
	assert_int_equal(json_object_size(json_object_get(r.json, "replicas")), 0);
	trk_reply_fini(&r);

	/* Expanding a batch that lacks the list named, or names no string:
	 * -EPROTO. */
	static const char *const bad[] = {
		"{\"answers\":[{\"members_of\":\"0123456789abcdef\"}],\"replicas\":{}}",
		"{\"answers\":[{\"members_of\":\"0123456789abcdef\"}]}",
		"{\"answers\":[{\"members_of\":\"t\"}],\"replicas\":{\"t\":[\"A\",7]}}",
		"{\"answers\":[{\"members_of\":\"t\"}],\"replicas\":{\"t\":{}}}",
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(bad); i++) {
		json_t *j = json_loads(bad[i], 0, NULL);
		assert_non_null(j);
		assert_int_equal(trk_sources_expand(j, dst, 1), -EPROTO);
		json_decref(j);
	}
}

/* Sources hand out fabric addresses and memory keys: with a cluster key,
 * only signed reads get them, and the status outputs show no keys. */
#define SRC_HITS "tessera_tracker_sources_cache_answers_total{result=\"hit\"}"
#define SRC_MISSES "tessera_tracker_sources_cache_answers_total{result=\"miss\"}"

/* The members of the /sources answer at path, as "A/1,B/1" (name order). */
static void members_of(struct fx *f, const char *path, char *out, size_t cap)
{
	struct trk_reply r;
	json_t *m, *v;
	size_t i, at = 0;

	assert_int_equal(get(f, path, &r), 200);
	m = json_object_get(r.json, "members");
	assert_true(json_is_array(m));
	out[0] = 0;
	json_array_foreach(m, i, v)
		at += (size_t)snprintf(out + at, cap - at, "%s%s", i ? "," : "",
				       json_string_value(v));
	trk_reply_fini(&r);
}

/* /sources answers are kept per parcel until the swarm changes: repeated
 * queries are served from the kept answer, and every change (a node
 * registering, offering, leaving; a publisher offering) shows at once.
 * Members lists are kept across versions (srcache.c): another version's
 * answer lists the same members, and a node leaving or registering shows
 * in every version's. */
static void test_sources_kept(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char ob[1200], path[300], path2[300], got[256];
	uint64_t hits, misses;
	bool seen[2] = {false, false};

	register_publisher(f);
	publish_two(f);
	register_node_ok(f, "A", 1, TP2);
	register_node_ok(f, "B", 1, TP2);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	members_of(f, path, got, sizeof(got));
	assert_string_equal(got, "A/1,B/1");
	hits = metric_of(f, SRC_HITS);
	misses = metric_of(f, SRC_MISSES);
	members_of(f, path, got, sizeof(got));
	assert_string_equal(got, "A/1,B/1");
	assert_int_equal(metric_of(f, SRC_HITS), hits + 1);
	assert_int_equal(metric_of(f, SRC_MISSES), misses);
	snprintf(path2, sizeof(path2), TRK_API "/sources?version=2&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	members_of(f, path2, got, sizeof(got));
	assert_string_equal(got, "A/1,B/1");

	/* Both nodes and the publisher offer: peers (in some order) first. */
	offer_body(ob, sizeof(ob), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	offer_body(ob, sizeof(ob), "B/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	offer_body(ob, sizeof(ob), f->pub_id, 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	/* Kept answers still list peers in a fresh order each time: both
	 * orders show up within a few hundred queries. */
	for (int i = 0; i < 400 && !(seen[0] && seen[1]); i++) {
		struct trk_source *src;
		size_t n;
		struct proto_err err = {{0}};

		assert_int_equal(get(f, path, &r), 200);
		assert_int_equal(trk_sources_parse(r.json, &src, &n, &err), 0);
		assert_int_equal(n, 3);
		assert_true(src[0].peer && src[1].peer);
		assert_false(src[2].peer);
		assert_string_equal(src[2].id, f->pub_id);
		seen[strcmp(src[0].id, "A/1") == 0] = true;
		trk_sources_free(src, n);
		trk_reply_fini(&r);
	}
	assert_true(seen[0] && seen[1]);

	/* A node that leaves is gone from the next answer, with its offer. */
	assert_int_equal(post(f, TRK_API "/nodes/leave", "{\"id\":\"A/1\"}", &r), 200);
	trk_reply_fini(&r);
	members_of(f, path, got, sizeof(got));
	assert_string_equal(got, "B/1");
	members_of(f, path2, got, sizeof(got));
	assert_string_equal(got, "B/1");
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 2);
	trk_reply_fini(&r);
	/* Registering again brings it back (without its offer). */
	register_node_ok(f, "A", 1, TP2);
	members_of(f, path2, got, sizeof(got));
	assert_string_equal(got, "A/1,B/1");
	members_of(f, path, got, sizeof(got));
	assert_string_equal(got, "A/1,B/1");
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 2);
	trk_reply_fini(&r);
	/* The publisher withdraws: only B/1's offer remains. */
	snprintf(ob, sizeof(ob), "{\"id\":\"%s\",\"version\":1,\"parcels\":[]}", f->pub_id);
	assert_int_equal(post(f, TRK_API "/offers", ob, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), 1);
	trk_reply_fini(&r);
	/* Another parcel of the same version is its own entry. */
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=0",
		 HEX(f->tp2.digest));
	members_of(f, path, got, sizeof(got));
	assert_string_equal(got, "");
}

static void test_sources_members_only(void **state)
{
	struct fx *f = *state;
	struct trk_reply r;
	char ob[1200], path[300], *key;
	const char *outputs[] = {"/", TRK_API "/status", "/metrics"};
	json_t *j = NULL;

	populate(f);
	report_ok(f, "A/1", 1, "verified");
	offer_body(ob, sizeof(ob), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	/* A key no other number in the outputs would match. */
	key = subst(ob, (const char *[]){"\"key\":\"2\"", "\"key\":\"9876543210987654321\""}, 2);
	assert_int_equal(post(f, TRK_API "/offers", key, &r), 200);
	trk_reply_fini(&r);
	free(key);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	/* The client signs it: the peer and its key. */
	assert_int_equal(get(f, path, &r), 200);
	assert_non_null(strstr((const char *)r.body, "9876543210987654321"));
	trk_reply_fini(&r);
	/* A stranger's read is refused. */
	assert_int_equal(raw(f, "GET", path, NULL, "", 0, &j), 401);
	assert_non_null(json_object_get(j, "error"));
	json_decref(j);
	/* No output anyone may read carries it. */
	for (size_t i = 0; i < PROTO_ARRAY_LEN(outputs); i++) {
		assert_int_equal(raw(f, "GET", outputs[i], NULL, "", 0, NULL), 200);
		assert_int_equal(get(f, outputs[i], &r), 200);
		assert_null(strstr((const char *)r.body, "9876543210987654321"));
		trk_reply_fini(&r);
	}
}

/*
 * Bounded swarm views (TESSERA_SWARM_PEERS, TESSERA_SWARM_MEMBERS): six
 * replicas offer a parcel. With a cap of two peers an answer lists two, a
 * fresh sample each time (sixty answers see all six), and says
 * "peers_of":6; with a cap of three members it lists the three replicas of
 * highest weight, the same in every answer. Without the caps, all.
 */
static void test_sources_bounded(void **state)
{
	struct fx *f = *state;
	enum { N = 6 };
	struct trk_reply r;
	char b[1200], path[300], id[16];
	uint64_t w[N], bps[N] = {0};
	bool top[N], seen[N] = {false}, cut = false;

	register_publisher(f);
	publish_two(f);
	for (int i = 0; i < N; i++) {
		snprintf(id, sizeof(id), "R%d", i);
		register_node_ok(f, id, 1, TP2);
		snprintf(id, sizeof(id), "R%d/1", i);
		offer_body(b, sizeof(b), id, 1, HEX(f->tp2.digest), 0, 1, 101);
		assert_int_equal(post(f, TRK_API "/offers", b, &r), 200);
		trk_reply_fini(&r);
		snprintf(id, sizeof(id), "R%d", i);
		w[i] = trk_member_weight(id, f->tp2.digest);
	}
	assert_int_equal(trk_members_pick(w, bps, N, 3, 4, top, &cut), 0);
	assert_true(cut);
	snprintf(path, sizeof(path), TRK_API "/sources?version=1&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	setenv("TESSERA_SWARM_PEERS", "2", 1);
	setenv("TESSERA_SWARM_MEMBERS", "3", 1);
	for (int k = 0; k < 60; k++) {
		json_t *srcs, *members, *v;
		size_t i;
		assert_int_equal(get(f, path, &r), 200);
		srcs = json_object_get(r.json, "sources");
		members = json_object_get(r.json, "members");
		assert_int_equal(json_array_size(srcs), 2);
		assert_int_equal(json_integer_value(json_object_get(r.json, "peers_of")), N);
		json_array_foreach(srcs, i, v) {
			int at = -1;
			assert_int_equal(sscanf(json_string_value(json_object_get(v, "id")), "R%d/1", &at), 1);
			assert_true(at >= 0 && at < N);
			seen[at] = true;
		}
		assert_int_equal(json_array_size(members), 3);
		assert_true(json_is_true(json_object_get(r.json, "members_cut")));
		json_array_foreach(members, i, v) {
			int at = -1;
			assert_int_equal(sscanf(json_string_value(v), "R%d/1", &at), 1);
			assert_true(at >= 0 && at < N && top[at]);
		}
		trk_reply_fini(&r);
	}
	for (int i = 0; i < N; i++)
		assert_true(seen[i]);
	/* Uncapped (the members list is built again when one joins). */
	unsetenv("TESSERA_SWARM_PEERS");
	unsetenv("TESSERA_SWARM_MEMBERS");
	register_node_ok(f, "R6", 1, TP2);
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "sources")), N);
	assert_null(json_object_get(r.json, "peers_of"));
	assert_null(json_object_get(r.json, "members_cut"));
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), N + 1);
	trk_reply_fini(&r);
}

/*
 * Members that keep up (TESSERA_SWARM_SLOW): five replicas fetched version
 * 1, one of them at a millionth of the others' rate (its report's bytes
 * over the same wall time); a sixth, Q, finished none, its fetch under
 * way slower still. Once version 3 is published, its swarm's members are
 * the four others, and answers say "members_cut": the slow ones read
 * from peers only. Off (0), all five again. trk_members_pick
 * alone: unknown rates count as keeping up, the cap applies to the rest.
 */
static void state_body(char *b, size_t n, const char *id, uint64_t v, const char *state,
		       uint64_t total)
{
	snprintf(b, n,
		 "{\"id\":\"%s\",\"version\":%llu,\"state\":\"%s\",\"bytes_done\":%llu,"
		 "\"bytes_total\":%llu,\"bytes_from_trainer\":0,\"bytes_from_peers\":0}",
		 id, (unsigned long long)v, state, (unsigned long long)total,
		 (unsigned long long)total);
}

static void test_sources_slow_members(void **state)
{
	struct fx *f = *state;
	enum { N = 5 };
	struct trk_reply r;
	char b[1200], path[300], id[16];
	uint8_t *buf, d3[PROTO_HASH_BYTES];
	size_t len;
	json_t *members, *v;
	size_t i;

	register_publisher(f);
	publish_two(f);
	for (int k = 0; k < N; k++) {
		snprintf(id, sizeof(id), "R%d", k);
		register_node_ok(f, id, 1, TP2);
		snprintf(id, sizeof(id), "R%d/1", k);
		/* R4's fetch moved a millionth of the others' bytes. */
		uint64_t total = k == N - 1 ? 1000 : 1000000000;
		state_body(b, sizeof(b), id, 1, "fetching", total);
		assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
		trk_reply_fini(&r);
		state_body(b, sizeof(b), id, 1, "verified", total);
		assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
		trk_reply_fini(&r);
	}
	/* Q finished nothing yet: its fetch under way moved 1000 bytes in a
	 * quarter of a second or more (its reports' samples), a rate the
	 * others' dwarf. */
	register_node_ok(f, "Q", 1, TP2);
	for (int k = 0; k < 2; k++) {
		snprintf(b, sizeof(b),
			 "{\"id\":\"Q/1\",\"version\":1,\"state\":\"fetching\",\"bytes_done\":%d,"
			 "\"bytes_total\":1000000000,\"bytes_from_trainer\":0,\"bytes_from_peers\":0}",
			 k * 1000);
		assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
		trk_reply_fini(&r);
		if (k == 0)
			usleep(250 * 1000); /* the tracker's samples are 200 ms apart at least */
	}
	/* Judged when a version is published. */
	make_manifest(f, &(struct mopts){.version = 3, .parent = 2, .parent_digest = f->d2}, &buf,
		      &len, d3);
	assert_int_equal(publish(f, buf, len, &r), 201);
	trk_reply_fini(&r);
	free(buf);
	snprintf(path, sizeof(path), TRK_API "/sources?version=3&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	assert_int_equal(get(f, path, &r), 200);
	members = json_object_get(r.json, "members");
	assert_int_equal(json_array_size(members), N - 1);
	json_array_foreach(members, i, v) {
		assert_string_not_equal(json_string_value(v), "R4/1");
		assert_string_not_equal(json_string_value(v), "Q/1");
	}
	assert_true(json_is_true(json_object_get(r.json, "members_cut")));
	trk_reply_fini(&r);
	/* Off: all of them (the list is built again when one joins). */
	setenv("TESSERA_SWARM_SLOW", "0", 1);
	register_node_ok(f, "R5", 1, TP2);
	assert_int_equal(get(f, path, &r), 200);
	unsetenv("TESSERA_SWARM_SLOW");
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), N + 2);
	assert_null(json_object_get(r.json, "members_cut"));
	trk_reply_fini(&r);

	/* Unknown rates (0) keep up; of those that do, the heaviest two. */
	uint64_t w[6] = {60, 50, 40, 30, 20, 10}, bps[6] = {0, 100, 1, 100, 0, 100};
	bool keep[6], cut = false;
	assert_int_equal(trk_members_pick(w, bps, 6, 0, 4, keep, &cut), 0);
	assert_true(cut);
	for (int k = 0; k < 6; k++)
		assert_int_equal(keep[k], k != 2);
	assert_int_equal(trk_members_pick(w, bps, 6, 2, 4, keep, &cut), 0);
	for (int k = 0; k < 6; k++)
		assert_int_equal(keep[k], k < 2);
	assert_int_equal(trk_members_pick(w, bps, 6, 0, 0, keep, &cut), 0);
	assert_false(cut);
	assert_int_equal(trk_members_pick(w, bps, 6, 0, 200, keep, &cut), 0); /* under 1/2 */
	assert_false(cut);
}

/*
 * Members judged by their first reports (TRK_MEMBERS_REJUDGE_MS): five
 * replicas that never finished a fetch are all members of version 2's
 * swarm; they report their fetch of it, S at a millionth of the others'
 * rate. With no version published, joined or left since, the members are
 * chosen again once those rates are known: S is left out.
 */
static void test_sources_first_rates(void **state)
{
	struct fx *f = *state;
	enum { N = 5 };
	const char *ids[N] = {"R0", "R1", "R2", "R3", "S"};
	struct trk_reply r;
	char b[1200], path[300], id[16];
	size_t n = 0;
	bool s_listed = true;

	register_publisher(f);
	publish_two(f);
	for (int k = 0; k < N; k++)
		register_node_ok(f, ids[k], 1, TP2);
	snprintf(path, sizeof(path), TRK_API "/sources?version=2&layout=%s&src_rank=0&dst_rank=1",
		 HEX(f->tp2.digest));
	assert_int_equal(get(f, path, &r), 200);
	assert_int_equal(json_array_size(json_object_get(r.json, "members")), N);
	trk_reply_fini(&r);
	for (int t = 0; t < 2; t++) {
		for (int k = 0; k < N; k++) {
			snprintf(id, sizeof(id), "%s/1", ids[k]);
			snprintf(b, sizeof(b),
				 "{\"id\":\"%s\",\"version\":2,\"state\":\"fetching\",\"bytes_done\":%d,"
				 "\"bytes_total\":1000000000,\"bytes_from_trainer\":0,"
				 "\"bytes_from_peers\":0}",
				 id, t * (k == N - 1 ? 1000 : 100000000));
			assert_int_equal(post(f, TRK_API "/nodes/state", b, &r), 200);
			trk_reply_fini(&r);
		}
		if (t == 0)
			usleep(250 * 1000); /* the tracker's samples are 200 ms apart at least */
	}
	/* The tracker's sweep chooses them again (every few hundred ms). */
	for (int tries = 0; tries < 100 && s_listed; tries++) {
		json_t *v;
		size_t i;
		usleep(50 * 1000);
		assert_int_equal(get(f, path, &r), 200);
		n = json_array_size(json_object_get(r.json, "members"));
		s_listed = false;
		json_array_foreach(json_object_get(r.json, "members"), i, v)
			s_listed |= strcmp(json_string_value(v), "S/1") == 0;
		if (!s_listed)
			assert_true(json_is_true(json_object_get(r.json, "members_cut")));
		trk_reply_fini(&r);
	}
	assert_false(s_listed);
	assert_int_equal(n, N - 1);
}

/* A signed request captured before a restart is refused after it: the
 * signature covers the instance's epoch. A client learns the new epoch from
 * the refusal and signs again. */
static void test_replay_after_restart(void **state)
{
	struct fx *f = *state;
	char *body = publisher_body(MODEL, TRAINER, RANKS01), *before, *after;
	const char *uri = TRK_API "/publishers?n=7";
	char auth[256], hdr[320], ep1[64], ep2[64];
	uint64_t now = (uint64_t)time(NULL);
	struct trk_reply r;
	json_t *j = NULL;

	fetch_epoch(f, ep1, sizeof(ep1));
	assert_int_equal(trk_auth_header(f->srv.ckey, "POST", uri, now, ep1,
					 (const uint8_t *)body, strlen(body), auth,
					 sizeof(auth)), 0);
	snprintf(hdr, sizeof(hdr), "Authorization: %s\r\n", auth);
	assert_int_equal(raw(f, "POST", uri, hdr, body, strlen(body), &j), 200);
	json_decref(j);

	/* Restart on the same state and key; replay within the ts window. */
	srv_stop(&f->srv);
	assert_int_equal(srv_start(&f->srv), 0);
	/* A new port: a new client, which knows no epoch yet. */
	trk_client_free(f->c);
	assert_int_equal(trk_client_new(NULL, f->srv.url, f->srv.ckey, &f->c, NULL), 0);
	fetch_epoch(f, ep2, sizeof(ep2));
	assert_string_not_equal(ep1, ep2);
	before = status_snapshot(f);
	assert_int_equal(raw(f, "POST", uri, hdr, body, strlen(body), &j), 401);
	assert_non_null(strstr(json_string_value(json_object_get(j, "error")), "epoch"));
	json_decref(j);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);

	/* The client's first signed call is refused for its epoch, signed
	 * again, and passes. */
	register_publisher(f);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"nobody\"}", &r), 404);
	trk_reply_fini(&r);
	free(body);
}

/* Each node speaks only for itself: another cluster member (same key, its
 * own client) can neither report, heartbeat nor offer for A/1, nor take
 * over its live id by registering it again. */
static void test_forged_report(void **state)
{
	struct fx *f = *state;
	struct trk_client *other;
	struct trk_reply r;
	char rb[512], ob[1200], *before, *after, *nb;

	populate(f);
	assert_int_equal(trk_client_new(NULL, f->srv.url, f->srv.ckey, &other, NULL), 0);
	before = status_snapshot(f);
	snprintf(rb, sizeof(rb), "{\"id\":\"A/1\",\"version\":2,\"state\":\"verified\"}");
	assert_int_equal(trk_client_call(other, "POST", TRK_API "/nodes/state", NULL, rb,
					 strlen(rb), &r), 0);
	assert_int_equal(r.status, 403);
	check_error_body(&r);
	trk_reply_fini(&r);
	assert_int_equal(trk_client_call(other, "POST", TRK_API "/heartbeat", NULL,
					 "{\"id\":\"A/1\"}", 12, &r), 0);
	assert_int_equal(r.status, 403);
	trk_reply_fini(&r);
	offer_body(ob, sizeof(ob), "A/1", 1, HEX(f->tp2.digest), 0, 1, 101);
	assert_int_equal(trk_client_call(other, "POST", TRK_API "/offers", NULL, ob,
					 strlen(ob), &r), 0);
	assert_int_equal(r.status, 403);
	trk_reply_fini(&r);
	nb = node_body(f, "A", 1, "elsewhere", TP2, NULL);
	assert_int_equal(trk_client_call(other, "POST", TRK_API "/nodes", NULL, nb,
					 strlen(nb), &r), 0);
	assert_int_equal(r.status, 409);
	trk_reply_fini(&r);
	free(nb);
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);
	/* The node itself still can. */
	report_ok(f, "A/1", 2, "verified");
	assert_int_equal(register_node(f, "A", 1, TP2, &r), 200);
	trk_reply_fini(&r);
	report_ok(f, "A/1", 2, "active");
	trk_client_free(other);
}

/* A host heartbeat for ids through client c; its answer in *r (caller finis). */
static void host_hb(struct trk_client *c, const struct trk_hb_node *e, size_t n,
		    struct trk_reply *r)
{
	trk_reply_init(r);
	assert_int_equal(trk_client_heartbeat_host(c, e, n, trk_reply_cb, r), 0);
	trk_client_wait(c, r);
}

/* One request renews every rank a host holds and names those the tracker
 * does not know; on a keyed tracker only the client that registered them
 * (it sends their sessions) may, and a refused one renews none. */
static void test_host_heartbeat(void **state)
{
	struct fx *f = *state;
	struct trk_client *other;
	struct trk_reply r;
	struct trk_hb_node e[3] = {{.id = "A/0"}, {.id = "Z/7"}, {.id = "A/1"}};
	json_t *rk;

	populate(f);
	e[2].pins[0] = (struct trk_pin_count){.version = 2, .requests = 9, .pins = 1};
	e[2].npins = 1;
	host_hb(f->c, e, 3, &r);
	assert_int_equal(r.status, 200);
	assert_int_equal(json_integer_value(json_object_get(r.json, "lease_ms")),
			 (json_int_t)proto_param(PROTO_PARAM_LEASE_MS));
	assert_int_equal(json_array_size(json_object_get(r.json, "gone")), 1);
	assert_string_equal(json_string_value(json_array_get(json_object_get(r.json, "gone"), 0)),
			    "Z/7");
	trk_reply_fini(&r);
	/* A/1's pins are kept, as its own heartbeat's would be. */
	assert_int_equal(get(f, TRK_API "/replicas/A", &r), 200);
	rk = json_array_get(json_object_get(r.json, "ranks"), 1);
	assert_int_equal(json_integer_value(json_object_get(
				 json_array_get(json_object_get(rk, "pins"), 0), "requests")), 9);
	trk_reply_fini(&r);

	/* Another member (same key, no sessions of these nodes) is refused. */
	assert_int_equal(trk_client_new(NULL, f->srv.url, f->srv.ckey, &other, NULL), 0);
	host_hb(other, e, 1, &r);
	assert_int_equal(r.status, 403);
	check_error_body(&r);
	trk_reply_fini(&r);
	trk_client_free(other);
	assert_int_equal(trk_client_heartbeat_host(f->c, e, 0, trk_reply_cb, &r), -EINVAL);
	assert_int_equal(trk_client_heartbeat_host(f->c, e, TRK_HOST_HEARTBEAT_MAX + 1,
						   trk_reply_cb, &r), -EINVAL);
}

/* A publisher speaks only for itself: another holder of the cluster key
 * cannot renew its lease, withdraw its offers or take its ranks by
 * registering them again (its session, from its registration, is what
 * its own calls carry); the real publisher keeps working, and across a
 * tracker restart registers again with a new session. */
static void test_publisher_session(void **state)
{
	struct fx *f = *state;
	struct proto_err err = {{0}};
	struct trk_client *other = NULL;
	struct trk_reply r;
	char hb[200], off[300], *reg = publisher_body(MODEL, TRAINER, RANKS01);
	int accepted = 0, code;

	register_publisher(f);
	publish_two(f);
	assert_int_equal(trk_client_new(NULL, f->srv.url, f->srv.ckey, &other, &err), 0);
	snprintf(hb, sizeof(hb), "{\"id\":\"%s\"}", f->pub_id);
	snprintf(off, sizeof(off), "{\"id\":\"%s\",\"version\":2,\"parcels\":[]}", f->pub_id);
	const char *const paths[] = {TRK_API "/heartbeat", TRK_API "/offers", TRK_API "/publishers"};
	const char *const bodies[] = {hb, off, reg};
	const int want[] = {403, 403, 409};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(paths); i++) {
		assert_int_equal(trk_client_call(other, "POST", paths[i], NULL, bodies[i],
						 strlen(bodies[i]), &r), 0);
		code = r.status;
		accepted += code == 200;
		if (code != want[i])
			fail_msg("%s by another key holder: %d (%s), want %d", paths[i], code,
				 r.error, want[i]);
		trk_reply_fini(&r);
	}
	/* The real one is still live and speaks for itself. */
	assert_int_equal(post(f, TRK_API "/heartbeat", hb, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/offers", off, &r), 200);
	trk_reply_fini(&r);
	fprintf(stderr, "# another cluster-key holder: %d of %zu changes to publisher %s "
		"accepted; the publisher stays live\n", accepted, PROTO_ARRAY_LEN(paths), f->pub_id);

	/* A restarted tracker forgot it: it registers again (new id, new
	 * session) and goes on; the other still cannot speak for it. */
	assert_int_equal(restart_same_port(f), 0);
	assert_int_equal(post(f, TRK_API "/heartbeat", hb, &r), 404);
	trk_reply_fini(&r);
	register_publisher(f);
	snprintf(hb, sizeof(hb), "{\"id\":\"%s\"}", f->pub_id);
	assert_int_equal(post(f, TRK_API "/heartbeat", hb, &r), 200);
	trk_reply_fini(&r);
	assert_int_equal(trk_client_call(other, "POST", TRK_API "/heartbeat", NULL, hb, strlen(hb),
					 &r), 0);
	assert_int_equal(r.status, 403);
	trk_reply_fini(&r);
	trk_client_free(other);
	free(reg);
}

/* ---- floods: slow heads, unread bodies, connection floods ------------------------- */

/* A keyed tracker with a small connection cap, a short head deadline and a
 * short lease, so the guard's limits show within seconds. The lease is ten
 * heartbeat periods and long enough that a heartbeat slowed by a loaded
 * machine on top of the flood (3.1 s seen) still lands within it. */
#define GUARD_CONNS 40
#define GUARD_LEASE_MS 6000
static int setup_guarded(void **state)
{
	char lease[16];
	int rc;

	snprintf(lease, sizeof(lease), "%d", GUARD_LEASE_MS);
	setenv("TESSERA_TRACKER_CONNS", "40", 1);
	setenv("TESSERA_HEADER_MS", "600", 1);
	setenv("TESSERA_LEASE_MS", lease, 1);
	rc = fx_setup(state, true);
	unsetenv("TESSERA_TRACKER_CONNS");
	unsetenv("TESSERA_HEADER_MS");
	unsetenv("TESSERA_LEASE_MS");
	return rc;
}

/* A counter from /metrics ("name{labels}" exactly as printed). */
static uint64_t metric_value(struct fx *f, const char *name)
{
	struct trk_reply r;
	char key[200];
	const char *at;
	uint64_t v = 0;

	assert_int_equal(get(f, "/metrics", &r), 200);
	snprintf(key, sizeof(key), "\n%s ", name);
	at = strstr((const char *)r.body, key);
	assert_non_null(at);
	v = strtoull(at + strlen(key), NULL, 10);
	trk_reply_fini(&r);
	return v;
}

/* True once the tracker has closed fd (end of file or reset); false if it
 * is still open after ms. Throws away what it reads. */
static bool still_open(int fd);
static bool closed_within(int fd, unsigned ms)
{
	uint64_t end = proto_now_ns() + (uint64_t)ms * 1000000u;
	char buf[4096];

	while (proto_now_ns() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};

		if (poll(&p, 1, 50) > 0) {
			ssize_t n = read(fd, buf, sizeof(buf));
			if (n <= 0)
				return true;
		}
	}
	return false;
}

/* Slowloris: heads that trickle in one byte at a time (each byte would
 * restart libevent's 60 s idle timeout) are closed at the head deadline. */
static void test_slow_heads(void **state)
{
	struct fx *f = *state;
	enum { N = 6 };
	int fds[N];
	bool gone[N] = {false};
	size_t left = N;
	uint64_t end = proto_now_ns() + 20000ull * 1000000u;
	json_t *j;

	for (int i = 0; i < N; i++) {
		fds[i] = tcp_connect(f->srv.url);
		write_all(fds[i], "GET " TRK_API "/status HTTP/1.1\r\nHo", 32);
	}
	/* One byte per connection every 100 ms until each is closed; bounded
	 * well below the idle timeout, so only the deadline can close them. */
	while (left > 0 && proto_now_ns() < end) {
		for (int i = 0; i < N; i++) {
			if (gone[i])
				continue;
			if (send(fds[i], "x", 1, MSG_NOSIGNAL) != 1 ||
			    closed_within(fds[i], 100)) {
				gone[i] = true;
				left--;
			}
		}
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	assert_int_equal(left, 0);
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"slow_head\"}") >= N);
	/* A prompt request is served. */
	assert_int_equal(raw(f, "GET", TRK_API "/status", NULL, "", 0, &j), 200);
	json_decref(j);
}

/* A POST declaring a huge body without (or with a forged) signature is
 * refused from its head: the body is never buffered, and a client that does
 * not send it all is cut off long before the idle timeout. */
static void test_unauthenticated_body(void **state)
{
	struct fx *f = *state;
	static const char *auths[] = {
		"",
		"Authorization: Tessera ts=@TS@,hdr=0000000000000000000000000000000000000000000000000000000000000000,"
		"mac=0000000000000000000000000000000000000000000000000000000000000000\r\n",
	};
	uint64_t refused0 = metric_value(f, "tessera_tracker_http_closed_total{reason=\"refused_head\"}");
	uint64_t auth0 = metric_value(f, "tessera_tracker_auth_refused_requests_total");
	char *chunk = calloc(1, 256u << 10), *before, *after;
	const char *kv[2];
	char ts[32];

	assert_non_null(chunk);
	before = status_snapshot(f);
	snprintf(ts, sizeof(ts), "%llu", (unsigned long long)time(NULL));
	kv[0] = "@TS@";
	kv[1] = ts;
	for (size_t i = 0; i < PROTO_ARRAY_LEN(auths); i++) {
		char *a = subst(auths[i], kv, 2), head[600];
		int fd = tcp_connect(f->srv.url), n;

		n = snprintf(head, sizeof(head),
			     "POST " TRK_API "/versions HTTP/1.1\r\nHost: x\r\n%s"
			     "Content-Length: 60000000\r\n\r\n", a);
		assert_true(n > 0 && (size_t)n < sizeof(head));
		write_all(fd, head, (size_t)n);
		write_all(fd, chunk, 256u << 10);
		/* Linger (5 s) plus slack; libevent's own timeout is 60 s. */
		assert_true(closed_within(fd, 20000));
		close(fd);
		free(a);
	}
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"refused_head\"}") >=
		    refused0 + PROTO_ARRAY_LEN(auths));
	assert_true(metric_value(f, "tessera_tracker_auth_refused_requests_total") >=
		    auth0 + PROTO_ARRAY_LEN(auths));

	/* Hostile heads: refused (or closed), never crash, change nothing. */
	static const struct {
		const char *head;
		int want; /* 0: any 4xx, or closed (a body declared and not sent
			   * gets no answer) */
	} heads[] = {
		{"POST " TRK_API "/nodes HTTP/1.1\r\nContent-Length: 12a\r\n\r\n", 0},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n", 0},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", 0},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nno colon here\r\n\r\n", 0},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nAuthorization: a\r\nAuthorization: b\r\n\r\n", 0},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411},
		{"POST " TRK_API "/nodes HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n", 0},
		{"POST\r\n\r\n", 0},
		{"\r\n\r\n", 0},
		{"GET " TRK_API "/status HTTP/1.1\r\nContent-Length: 5000000\r\n\r\n", 0},
	};
	for (size_t i = 0; i < PROTO_ARRAY_LEN(heads); i++) {
		int fd = tcp_connect(f->srv.url), code = -1;
		char resp[512] = "";
		ssize_t n;

		write_all(fd, heads[i].head, strlen(heads[i].head));
		shutdown(fd, SHUT_WR);
		n = read(fd, resp, sizeof(resp) - 1);
		if (n > 0) {
			resp[n] = 0;
			sscanf(resp, "HTTP/1.%*d %d", &code);
		}
		close(fd);
		if (heads[i].want != 0 ? code != heads[i].want
				       : !(code == -1 || (code >= 400 && code < 500)))
			fail_msg("head %zu: got %d", i, code);
	}
	after = status_snapshot(f);
	assert_string_equal(before, after);
	free(after);
	free(before);
	free(chunk);
}

/* A connection to port from 127.0.0.<last> (another peer address than
 * the fixture's client); -1 when it fails. Sends time out after 200 ms. */
static int connect_from(int port, int last)
{
	struct sockaddr_in src = {.sin_family = AF_INET};
	struct sockaddr_in dst = {.sin_family = AF_INET};
	struct timeval tv = {0, 200000};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		return -1;
	src.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)last);
	dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	dst.sin_port = htons((uint16_t)port);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (bind(fd, (struct sockaddr *)&src, sizeof(src)) != 0 ||
	    connect(fd, (struct sockaddr *)&dst, sizeof(dst)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Opens connections from 127.0.0.2 as fast as it can, holding up to
 * FLOOD_HOLD (the oldest closed first), until stopped; each sends
 * says[i % 2] when given (else nothing). With keep, once it holds
 * FLOOD_HOLD it reopens those the tracker closed instead, and leaves them
 * open in held[0..n) when stopped (the caller closes them). */
#define FLOOD_HOLD 300
struct flood {
	pthread_t th;
	int port;
	atomic_bool stop;
	atomic_long opened;
	const char *says[2];
	bool keep;
	int held[FLOOD_HOLD];
	size_t n;
};

static void *flood_main(void *arg)
{
	struct flood *fl = arg;
	size_t at = 0;

	while (!atomic_load(&fl->stop)) {
		const char *say = fl->says[fl->opened % 2];
		int fd;

		if (fl->keep && fl->n == FLOOD_HOLD) {
			if (still_open(fl->held[at])) {
				at = (at + 1) % FLOOD_HOLD;
				if (at == 0)
					usleep(1000);
				continue;
			}
		}
		fd = connect_from(fl->port, 2);
		if (fd < 0)
			continue;
		if (say != NULL)
			send(fd, say, strlen(say), MSG_NOSIGNAL);
		fl->opened++;
		if (fl->n == FLOOD_HOLD)
			close(fl->held[at]);
		else
			fl->n++;
		fl->held[at] = fd;
		at = (at + 1) % FLOOD_HOLD;
	}
	for (size_t i = 0; !fl->keep && i < fl->n; i++)
		close(fl->held[i]);
	return NULL;
}

/* A flood of idle connections far over the cap: a registered node keeps
 * heartbeating (every heartbeat answered) and so keeps its lease. */
static void test_connection_flood(void **state)
{
	struct fx *f = *state;
	struct flood fl = {.port = url_port(f->srv.url)};
	struct trk_reply r;
	uint64_t end, over0;
	int beats = 0;

	populate(f);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/0\"}", &r), 200);
	trk_reply_fini(&r);
	over0 = metric_value(f, "tessera_tracker_http_closed_total{reason=\"over_cap\"}");
	assert_int_equal(pthread_create(&fl.th, NULL, flood_main, &fl), 0);
	/* Until the flood has gone well past the cap, and for two leases. */
	end = proto_now_ns() + 2ull * GUARD_LEASE_MS * 1000000u;
	while (proto_now_ns() < end || fl.opened < 10 * GUARD_CONNS) {
		if (proto_now_ns() > end + 30000ull * 1000000u)
			break; /* a machine too slow to flood: checked below */
		uint64_t t0;
		int code;

		msleep(GUARD_LEASE_MS / 10);
		t0 = proto_now_ns();
		code = post(f, TRK_API "/heartbeat", "{\"id\":\"A/0\"}", &r);
		if (code != 200)
			fail_msg("heartbeat %d: %d after %llu ms (%s); flood at %ld", beats,
				 code, (unsigned long long)((proto_now_ns() - t0) / 1000000u),
				 r.error, fl.opened);
		trk_reply_fini(&r);
		beats++;
	}
	atomic_store(&fl.stop, true);
	pthread_join(fl.th, NULL);
	fprintf(stderr, "# flood: %ld connections over a cap of %d; %d heartbeats "
		"all answered\n", fl.opened, GUARD_CONNS, beats);
	assert_true(fl.opened >= 10 * GUARD_CONNS);
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"over_cap\"}") > over0);
	/* A/1 sent nothing for longer than its lease: gone; A/0 lives. */
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/1\"}", &r), 404);
	trk_reply_fini(&r);
	assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/0\"}", &r), 200);
	trk_reply_fini(&r);
}


/* The status code of the answer that comes on fd within ms (-1: none, or
 * closed without one). Reads only the first bytes. */
static int answer_within(int fd, unsigned ms)
{
	uint64_t end = proto_now_ns() + (uint64_t)ms * 1000000u;
	char resp[256];
	int code = -1;

	while (proto_now_ns() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 50) <= 0)
			continue;
		n = recv(fd, resp, sizeof(resp) - 1, 0);
		if (n <= 0)
			return -1;
		resp[n] = 0;
		sscanf(resp, "HTTP/1.%*d %d", &code);
		return code;
	}
	return -1;
}

/* True while the tracker keeps fd open (nothing to read, no end of file). */
static bool still_open(int fd)
{
	char c;
	ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);

	return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* Auth before the body, whatever the head: a head the judge cannot read
 * (a space after the version, an obs-fold line, a space before a colon)
 * is answered 400 by the tracker itself, never handed to evhttp (which
 * reads the first two and buffers their body); and nothing but a signed
 * POST carries a body (PUT, PATCH, a GET with one are refused unread).
 * Each sends part of its declared body: the answer must come before the
 * rest, and the connection be closed. */
static void test_body_smuggling(void **state)
{
	struct fx *f = *state;
	static const struct {
		const char *head;
		size_t declared;
		int want;
	} heads[] = {
		{"POST " TRK_API "/versions HTTP/1.1 \r\nHost: x\r\nContent-Length: 60000000\r\n\r\n",
		 60000000, 400},
		{"POST " TRK_API "/versions HTTP/1.1\r\nHost: x\r\nX-Pad: a\r\n b\r\n"
		 "Content-Length: 60000000\r\n\r\n", 60000000, 400},
		{"POST " TRK_API "/versions HTTP/1.1\r\nHost: x\r\nContent-Length : 60000000\r\n\r\n",
		 60000000, 400},
		{"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n", 1048576, 405},
		{"PATCH " TRK_API "/nodes HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
		 1048576, 405},
		{"GET " TRK_API "/status HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n", 1000, 413},
	};
	uint64_t refused0 = metric_value(f, "tessera_tracker_http_closed_total{reason=\"refused_head\"}");
	char *chunk = calloc(1, 256u << 10), *before, *after;
	size_t sent = 0, declared = 0;

	assert_non_null(chunk);
	before = status_snapshot(f);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(heads); i++) {
		int fd = tcp_connect(f->srv.url), code;
		size_t part = PROTO_MIN(heads[i].declared / 2, (size_t)256u << 10);

		write_all(fd, heads[i].head, strlen(heads[i].head));
		write_all(fd, chunk, part);
		sent += part;
		declared += heads[i].declared;
		code = answer_within(fd, 20000);
		if (code != heads[i].want)
			fail_msg("head %zu: %d before the rest of its body, want %d", i, code,
				 heads[i].want);
		assert_true(closed_within(fd, 20000));
		close(fd);
	}
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"refused_head\"}") >=
		    refused0 + PROTO_ARRAY_LEN(heads));
	after = status_snapshot(f);
	assert_string_equal(before, after);
	fprintf(stderr, "# %zu heads answered 4xx and closed after %zu body bytes of the "
		"%zu they declared; none read on\n", PROTO_ARRAY_LEN(heads), sent, declared);
	free(after);
	free(before);
	free(chunk);
}

/* A guarded tracker that bounds each peer address to PER_ADDR
 * connections (keyed or not). */
#define PER_ADDR 16
static int setup_per_addr(void **state, bool keyed)
{
	int rc;

	setenv("TESSERA_TRACKER_CONNS_PER_ADDR", "16", 1);
	setenv("TESSERA_TRACKER_BODY_MS", "600", 1);
	rc = keyed ? setup_guarded(state) : 0;
	if (!keyed) {
		setenv("TESSERA_TRACKER_CONNS", "40", 1);
		setenv("TESSERA_HEADER_MS", "600", 1);
		rc = fx_setup(state, false);
		unsetenv("TESSERA_TRACKER_CONNS");
		unsetenv("TESSERA_HEADER_MS");
	}
	unsetenv("TESSERA_TRACKER_CONNS_PER_ADDR");
	unsetenv("TESSERA_TRACKER_BODY_MS");
	return rc;
}

static int setup_per_addr_keyed(void **state)
{
	return setup_per_addr(state, true);
}

static int setup_per_addr_open(void **state)
{
	return setup_per_addr(state, false);
}

/* An outsider locking clients out: hundreds of connections from one
 * address, each holding an unauthenticated watch (pipelined twice) or
 * sending part of a PUT body, on a tracker whose cap (40) they could fill
 * ten times over, while nodes of another address hold their watches. The
 * address keeps at most PER_ADDR; every fresh GET of another client is
 * answered, the nodes' watches stay and their heartbeats keep the lease. */
static void test_held_flood(void **state)
{
	struct fx *f = *state;
	enum { GETS = 40, NODES = 4 };
	static const char watch[] = "GET " TRK_API "/versions?after=999999999&wait_ms=30000 HTTP/1.1\r\n"
				    "Host: x\r\n\r\n";
	static const char watch2[] = "GET " TRK_API "/versions?after=999999999&wait_ms=30000 HTTP/1.1\r\n"
				     "Host: x\r\n\r\nGET " TRK_API "/versions?after=999999999&wait_ms=30000 "
				     "HTTP/1.1\r\nHost: x\r\n\r\n";
	static const char put[] = "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
				  "0123456789abcdef0123456789abcdef";
	struct flood *fl = calloc(1, sizeof(*fl));
	int nodes[NODES], port = url_port(f->srv.url), served = 0, open = 0;
	struct trk_reply r;

	assert_non_null(fl);
	populate(f);
	for (int i = 0; i < NODES; i++) {
		nodes[i] = connect_from(port, 1);
		assert_true(nodes[i] >= 0);
		write_all(nodes[i], watch, sizeof(watch) - 1);
	}
	fl->port = port;
	fl->says[0] = watch2;
	fl->says[1] = put;
	fl->keep = true;
	assert_int_equal(pthread_create(&fl->th, NULL, flood_main, fl), 0);
	/* The flood goes on all along: any room made is taken at once. */
	for (int w = 0; w < 30000 && atomic_load(&fl->opened) < FLOOD_HOLD; w += 10)
		msleep(10);
	for (int i = 0; i < GETS; i++) {
		json_t *j = NULL;
		int code = raw(f, "GET", TRK_API "/status", NULL, "", 0, &j);

		json_decref(j);
		served += code == 200;
		if (i % 10 == 0) {
			assert_int_equal(post(f, TRK_API "/heartbeat", "{\"id\":\"A/0\"}", &r), 200);
			trk_reply_fini(&r);
		}
	}
	atomic_store(&fl->stop, true);
	pthread_join(fl->th, NULL);
	/* What the tracker holds of the flood once it has judged it all (the
	 * sweep visits every connection within a second). */
	msleep(2000);
	for (size_t i = 0; i < fl->n; i++)
		open += still_open(fl->held[i]);
	for (int i = 0; i < NODES; i++)
		open -= !still_open(nodes[i]) * 1000; /* a node's watch lost: fails below */
	uint64_t conns = metric_value(f, "tessera_tracker_http_connections");
	fprintf(stderr, "# %ld flood connections (watches, PUT bodies): %d of the last %zu held by "
		"the tracker (bound %d); %d of %d fresh GETs served; %llu connections open (cap %d)\n",
		(long)atomic_load(&fl->opened), open, fl->n, PER_ADDR, served, GETS,
		(unsigned long long)conns, GUARD_CONNS);
	for (size_t i = 0; i < fl->n; i++)
		close(fl->held[i]);
	for (int i = 0; i < NODES; i++)
		close(nodes[i]);
	free(fl);
	assert_int_equal(served, GETS);
	assert_true(open >= 0 && open <= PER_ADDR);
	assert_true(conns <= GUARD_CONNS);
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"per_addr\"}") >=
		    (uint64_t)(FLOOD_HOLD - PER_ADDR));
}

/* Slow bodies: POSTs that declare 1 MiB and trickle it (each byte would
 * restart libevent's idle timeout) are closed at the body deadline (600
 * ms here), an unkeyed tracker's bodies being unauthenticated ones. */
static void test_slow_bodies(void **state)
{
	struct fx *f = *state;
	enum { N = 12 };
	static const char head[] = "POST " TRK_API "/nodes HTTP/1.1\r\nHost: x\r\n"
				   "Content-Length: 1048576\r\n\r\n{";
	int fds[N], port = url_port(f->srv.url);
	bool gone[N] = {false};
	size_t left = N;
	uint64_t end = proto_now_ns() + 20000ull * 1000000u, t0 = proto_now_ns();
	json_t *j;

	for (int i = 0; i < N; i++) {
		fds[i] = connect_from(port, 2);
		assert_true(fds[i] >= 0);
		write_all(fds[i], head, sizeof(head) - 1);
	}
	while (left > 0 && proto_now_ns() < end) {
		for (int i = 0; i < N; i++) {
			if (gone[i])
				continue;
			if (send(fds[i], " ", 1, MSG_NOSIGNAL) != 1 || closed_within(fds[i], 100)) {
				gone[i] = true;
				left--;
			}
		}
	}
	for (int i = 0; i < N; i++)
		close(fds[i]);
	fprintf(stderr, "# %d slow bodies: %zu left open after %llu ms\n", N, left,
		(unsigned long long)((proto_now_ns() - t0) / 1000000u));
	assert_int_equal(left, 0);
	assert_true(metric_value(f, "tessera_tracker_http_closed_total{reason=\"slow_body\"}") >= N);
	assert_int_equal(raw(f, "GET", TRK_API "/status", NULL, "", 0, &j), 200);
	json_decref(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_auth, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_healthz, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_bad_corpus, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_bad_bodies, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_register, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_layout_cache, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_layout_by_digest, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_lease_expiry, setup_short_lease, teardown),
		cmocka_unit_test_setup_teardown(test_versions, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_restart, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_state_lost_refused, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_trainer_pubkey, setup_with_pk, teardown),
		cmocka_unit_test_setup_teardown(test_longpoll, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_longpoll_many, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_keepalive, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_idle_close, setup_idle, teardown),
		cmocka_unit_test_setup_teardown(test_replica_state, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_duplicate_and_refetched_bytes, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_reports_out_of_order, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_replica_target, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_target_late_rank_chain_gone, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_copy_of_old_version, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_layout_retention, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_chain_retention, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_kept, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_sites, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_batch, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_shared, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_status_outputs, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_timeline, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_publish_report, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_layout_names, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_status_pages, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_client, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_binary, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_bounded, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_slow_members, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_first_rates, setup_open, teardown),
		cmocka_unit_test_setup_teardown(test_sources_members_only, setup_keyed,
						teardown),
		cmocka_unit_test_setup_teardown(test_replay_after_restart, setup_keyed,
						teardown),
		cmocka_unit_test_setup_teardown(test_forged_report, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_host_heartbeat, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_publisher_session, setup_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_slow_heads, setup_guarded, teardown),
		cmocka_unit_test_setup_teardown(test_unauthenticated_body, setup_guarded,
						teardown),
		cmocka_unit_test_setup_teardown(test_connection_flood, setup_guarded, teardown),
		cmocka_unit_test_setup_teardown(test_body_smuggling, setup_guarded, teardown),
		cmocka_unit_test_setup_teardown(test_held_flood, setup_per_addr_keyed, teardown),
		cmocka_unit_test_setup_teardown(test_slow_bodies, setup_per_addr_open, teardown),
	};

	if (sodium_init() < 0 || evthread_use_pthreads() != 0)
		return 1;
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
