/* libFuzzer target: the tracker's request handlers (every GET and POST
 * endpoint: JSON bodies, query strings, path parameters) and its checks of
 * who may ask (the cluster key's signatures, the sessions of registered
 * nodes and publishers), driven in-process through the guard's verdict on
 * the head (trk__head_verdict) and the router past evhttp's parse
 * (trk__route_request, with no connection) against a keyed tracker that
 * holds a model, two versions, a publisher and a replica of two ranks.
 *
 * Input: up to 12 requests separated by NUL bytes. In each, the first byte
 * b picks the endpoint (b % 16) and how it is signed (m = b / 16): m & 3
 * the session presented (0 none; 1 the one of the node or publisher the
 * body names; 2 node A/0's; 3 the publisher's), m >> 2 the Authorization
 * (0 signed with the cluster key; 1 none; 2 signed, then altered as the
 * next byte says: a digit of the mac or the head mac, a stale or future
 * timestamp, another epoch, a body length other than the one sent, the
 * same request sent twice, another URI; 3 the bytes up to the first
 * newline, as they are). Then the bytes up to the (next) newline are its
 * query (or path parameter), the rest its body; @MODEL@, @TL@, @TP2@,
 * @PUB@, @D1@ stand for the model and layout digests, the publisher id and
 * version 1's digest. The soft state is rebuilt before every input that
 * may have changed it, so a finding replays alone (the signatures seen are
 * forgotten after every input that sent one). A 5xx answer, no answer at
 * all to anything but a watch (which the tracker may hold: it is then
 * reported held, never waited for), or a POST or /sources query accepted
 * without a valid signature (or accepted twice) is a finding. */
#include <ftw.h>
#include <sodium.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "proto/log.h"
#include "proto/proto.h"
#include "tracker/server/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char MODEL[] = "{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[8,8]},"
			    "{\"name\":\"b\",\"dtype\":\"bf16\",\"shape\":[8]}]}";
static const char TRAINER[] = "{\"ranks\":2,\"tensors\":[{\"match\":\"*\",\"split\":0}]}";
static const char TP2[] = "{\"ranks\":2,\"tensors\":[{\"tensor\":\"W\",\"split\":1},"
			  "{\"tensor\":\"b\",\"replicate\":true}]}";
static const char RANKS[] =
	"[{\"rank\":0,\"host\":\"t0\",\"provider\":\"tcp;ofi_rxm\",\"fabric_addr\":\"aa00\"},"
	"{\"rank\":1,\"host\":\"t1\",\"provider\":\"tcp;ofi_rxm\",\"fabric_addr\":\"aa01\"}]";

static const struct {
	const char *method, *path; /* ends in '/' (but "/"): the query is its parameter */
	const char *suffix;
} routes[] = {
	{"GET", TRK_API "/versions", NULL},
	{"GET", TRK_API "/sources", NULL},
	{"GET", TRK_API "/status", NULL},
	{"GET", "/", NULL},
	{"GET", TRK_API "/replicas/", NULL},
	{"GET", TRK_API "/versions/", "/manifest"},
	{"GET", TRK_API "/versions/", "/timeline"},
	{"GET", TRK_API "/layouts", NULL},
	{"GET", "/metrics", NULL},
	{"POST", TRK_API "/publishers", NULL},
	{"POST", TRK_API "/nodes", NULL},
	{"POST", TRK_API "/heartbeat", NULL},
	{"POST", TRK_API "/nodes/state", NULL},
	{"POST", TRK_API "/offers", NULL},
	{"POST", TRK_API "/versions", NULL},
	{"HEAD", TRK_API "/status", NULL},
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))

static struct event_base *base;
static struct trk_server *srv;
static char state_dir[512];
static char hex_model[65], hex_tl[65], hex_tp2[65], hex_d1[65], pub_id[40];
static const uint8_t cluster_key[PROTO_CLUSTER_KEY_BYTES] = {'f', 'u', 'z', 'z', 7};
/* The sessions of the publisher and of nodes A/0 and A/1, as registered. */
static char ses_pub[2 * TRK_SESSION_BYTES + 1], ses_a0[2 * TRK_SESSION_BYTES + 1],
	ses_a1[2 * TRK_SESSION_BYTES + 1];
/* A request was signed in this input: its mac is remembered. */
static bool signed_any;

/* How a request is signed (the input's m, above). */
enum { SIGN_OK, SIGN_NONE, SIGN_ALTERED, SIGN_RAW };
enum { SES_NONE, SES_NAMED, SES_A0, SES_PUB };
struct sig {
	int how, session;
	uint8_t alter;       /* SIGN_ALTERED: which change */
	const char *raw;     /* SIGN_RAW: the header's value */
	size_t raw_len;
};
static const struct sig signed_named = {SIGN_OK, SES_NAMED, 0, NULL, 0};

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(p);
}

static void cleanup(void)
{
	trk_server_free(srv);
	srv = NULL;
	if (base != NULL)
		event_base_free(base);
	base = NULL;
	if (state_dir[0])
		nftw(state_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A request's answer: its status (0: held, a long-poll) and body. */
struct answer {
	int status;
	char body[4096];
};

/* What the connection guard answers the head of this request before its
 * body (trk__head_verdict: 0 to read on); a head too long for the guard
 * is answered 400 there. */
static int head_verdict(const char *method, const char *uri, size_t blen, const char *auth)
{
	struct trk_head h = {.content_length = strcmp(method, "POST") == 0 ? (int64_t)blen : -1};
	char msg[300];
	bool authed, routine;

	if (strlen(uri) >= sizeof(h.uri))
		return 400;
	snprintf(h.method, sizeof(h.method), "%s", method);
	snprintf(h.uri, sizeof(h.uri), "%s", uri);
	if (auth != NULL) {
		h.has_auth = true;
		snprintf(h.auth, sizeof(h.auth), "%s", auth); /* truncated as the guard does */
	}
	return trk__head_verdict(srv, &h, &authed, &routine, msg, sizeof(msg));
}

/* The session sig presents for a request with this body (NULL: none). */
static const char *session_for(const struct sig *sig, const char *body, size_t n)
{
	switch (sig->session) {
	case SES_A0: return ses_a0;
	case SES_PUB: return ses_pub;
	case SES_NAMED:
		if (pub_id[0] != 0 && memmem(body, n, pub_id, strlen(pub_id)) != NULL)
			return ses_pub;
		if (memmem(body, n, "A/1", 3) != NULL ||
		    (memmem(body, n, "\"replica\":\"A\"", 13) != NULL &&
		     memmem(body, n, "\"rank\":1", 8) != NULL))
			return ses_a1;
		return ses_a0;
	default: return NULL;
	}
}

/* The Authorization value sig gives the request (false: none) into buf. */
static bool authorization(const struct sig *sig, const char *method, const char *uri,
			  const void *body, size_t blen, char *buf, size_t cap)
{
	uint64_t now = proto_wall_ms() / 1000, win = proto_param(PROTO_PARAM_AUTH_WINDOW_S);
	const char *epoch = trk__auth_epoch(srv->auth);
	unsigned kind = sig->alter % 8, at = sig->alter / 8;
	char *p;

	switch (sig->how) {
	case SIGN_NONE: return false;
	case SIGN_RAW:
		snprintf(buf, cap, "%.*s", (int)PROTO_MIN(sig->raw_len, cap - 1), sig->raw);
		return true;
	case SIGN_OK: break;
	default:
		if (kind == 2)
			now -= 2 * win + 1;
		else if (kind == 3)
			now += 2 * win + 1;
		else if (kind == 4)
			epoch = "0000000000000000"; /* another instance's */
		else if (kind == 5 && blen > 0)
			blen--;
		else if (kind == 5)
			body = "x", blen = 1;
		else if (kind == 7)
			uri = TRK_API "/other";
	}
	signed_any = true;
	if (trk_auth_header(cluster_key, method, uri, now, epoch, body, blen, buf, cap) != 0)
		abort();
	if (sig->how == SIGN_ALTERED && kind < 2) { /* a digit of the mac, or of hdr */
		p = strstr(buf, kind == 0 ? "mac=" : "hdr=") + 4 + at % (2 * TRK_AUTH_MAC_BYTES);
		*p = *p == '0' ? '1' : '0';
	}
	return true;
}

/* Hands one request to the router as evhttp would after parsing it (the
 * URI parsed with evhttp's flags; one it cannot parse reaches the router
 * as NULL, and is answered 400 there as evhttp would). The body is copied
 * to a buffer of its exact size, so that a read past it is caught. */
static void route(const char *method, const char *uri, const char *ctype, const void *body,
		  size_t blen, const char *auth, const char *ses, struct answer *a)
{
	struct evkeyvalq headers;
	struct evhttp_uri *u = evhttp_uri_parse_with_flags(uri, EVHTTP_URI_NONCONFORMANT);
	struct evbuffer *in = evbuffer_new();
	uint8_t *copy = malloc(blen ? blen : 1);
	struct trk_outcome out;
	struct trk_request r = {
		.cmd = strcmp(method, "POST") == 0 ? EVHTTP_REQ_POST :
		       strcmp(method, "HEAD") == 0 ? EVHTTP_REQ_HEAD :
						     EVHTTP_REQ_GET,
		.raw_uri = uri,
		.uri = u,
		.headers = &headers,
		.body = in,
	};

	if (in == NULL || copy == NULL)
		abort();
	TAILQ_INIT(&headers);
	if (evhttp_add_header(&headers, "Host", "t") != 0 ||
	    evhttp_add_header(&headers, "Content-Type", ctype) != 0 ||
	    (ses != NULL && evhttp_add_header(&headers, TRK_SESSION_HEADER, ses) != 0) ||
	    (auth != NULL && evhttp_add_header(&headers, "Authorization", auth) != 0))
		abort();
	memcpy(copy, body, blen);
	if (blen > 0 && evbuffer_add_reference(in, copy, blen, NULL, NULL) != 0)
		abort();
	trk__route_request(srv, &r, &out);
	a->status = out.code;
	snprintf(a->body, sizeof(a->body), "%.*s", (int)PROTO_MIN(out.len, sizeof(a->body) - 1),
		 out.body != NULL ? (const char *)out.body : "");
	trk__outcome_fini(&out);
	evbuffer_free(in);
	free(copy);
	evhttp_clear_headers(&headers);
	if (u != NULL)
		evhttp_uri_free(u);
}

/* One request as the tracker takes it: judged by its head, then routed. */
static void request(const char *method, const char *uri, const char *ctype, const void *body,
		    size_t blen, const struct sig *sig, struct answer *a)
{
	char auth[400];
	bool has_auth = authorization(sig, method, uri, body, blen, auth, sizeof(auth));
	const char *ses = session_for(sig, body, blen);

	a->status = head_verdict(method, uri, blen, has_auth ? auth : NULL);
	if (a->status != 0)
		snprintf(a->body, sizeof(a->body), "refused before the body");
	else
		route(method, uri, ctype, body, blen, has_auth ? auth : NULL, ses, a);
}

static void post_ok(const char *path, const char *ctype, const void *body, size_t len,
		    struct answer *a)
{
	request("POST", path, ctype, body, len, &signed_named, a);
	if (a->status / 100 != 2) {
		fprintf(stderr, "setup: POST %s: %d %s\n", path, a->status, a->body);
		abort();
	}
}

static void json_hex_field(const char *body, const char *key, char *out, size_t cap)
{
	json_t *j = json_loads(body, 0, NULL);
	const char *s = json_string_value(json_object_get(j, key));

	if (s == NULL)
		abort();
	snprintf(out, cap, "%s", s);
	json_decref(j);
}

/* A signed anchor for TP2 (parcels (s,d), 100 + 2s + d bytes). */
static void publish(struct proto_model *m, struct proto_layout *tl, struct proto_layout *tp2,
		    const uint8_t *sk, uint64_t v, const uint8_t *parent, uint8_t digest[32])
{
	struct proto_manifest man;
	struct proto_err err;
	uint8_t plan[PROTO_HASH_BYTES] = {0}, *buf;
	size_t len;
	struct answer a;

	proto_manifest_init(&man);
	man.version = v;
	man.parent_version = v - 1;
	if (parent != NULL)
		memcpy(man.parent_digest, parent, PROTO_HASH_BYTES);
	man.kind = PROTO_KIND_ANCHOR;
	memcpy(man.model_digest, m->digest, PROTO_HASH_BYTES);
	memcpy(man.src_layout_digest, tl->digest, PROTO_HASH_BYTES);
	man.created_ms = 1700000000000ull + v;
	man.chunk_size = 64;
	struct proto_mlayout *l = proto_manifest_add_layout(&man, tp2->digest, plan, 4);
	for (uint32_t i = 0; i < 4; i++) {
		struct proto_mparcel *p = &l->parcels[i];
		p->src_rank = i / 2;
		p->dst_rank = i % 2;
		p->encoding = PROTO_ENC_RAW;
		p->bytes = 100 + i;
		if (proto_mparcel_alloc_chunks(&man, p, 100 + i) != 0)
			abort();
		for (uint32_t c = 0; c < p->nchunks; c++)
			memset(p->chunks[c].hash, (int)(v * 16 + i + c), PROTO_HASH_BYTES);
	}
	if (proto_manifest_sign(&man, sk, &buf, &len, &err) != 0)
		abort();
	memcpy(digest, man.digest, PROTO_HASH_BYTES);
	post_ok(TRK_API "/versions", "application/octet-stream", buf, len, &a);
	free(buf);
	proto_manifest_fini(&man);
}

static void register_publisher(void)
{
	char body[2048];
	struct answer a;

	snprintf(body, sizeof(body), "{\"model\":%s,\"layout\":%s,\"ranks\":%s}", MODEL, TRAINER,
		 RANKS);
	post_ok(TRK_API "/publishers", "application/json", body, strlen(body), &a);
	json_hex_field(a.body, "publisher_id", pub_id, sizeof(pub_id));
	json_hex_field(a.body, "session", ses_pub, sizeof(ses_pub));
}

static void setup_once(void)
{
	struct proto_model m;
	struct proto_layout tl, tp2;
	struct proto_err err;
	uint8_t pk[PROTO_PK_BYTES], sk[PROTO_SK_BYTES], d1[32], d2[32];
	struct trk_server_opts o = {.listen = "127.0.0.1:0", .state_dir = state_dir,
				    .cluster_key = cluster_key};

	if (sodium_init() < 0)
		abort();
	proto_log_setup("fuzz", PROTO_LOG_ERR);
	snprintf(state_dir, sizeof(state_dir), "%s/tessera-fuzz-trk-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (mkdtemp(state_dir) == NULL)
		abort();
	atexit(cleanup);
	base = event_base_new();
	/* The loop never runs: no request is held, nothing is waited for. */
	if (base == NULL || trk_server_new(base, &o, &srv, &err) != 0) {
		fprintf(stderr, "tracker: %s\n", err.msg);
		abort();
	}
	proto_model_init(&m);
	if (proto_model_parse(MODEL, strlen(MODEL), "model", &m, &err) != 0 ||
	    proto_layout_parse(&m, TRAINER, strlen(TRAINER), "tl", &tl, &err) != 0 ||
	    proto_layout_parse(&m, TP2, strlen(TP2), "tp2", &tp2, &err) != 0)
		abort();
	crypto_sign_keypair(pk, sk);
	register_publisher();
	publish(&m, &tl, &tp2, sk, 1, NULL, d1);
	publish(&m, &tl, &tp2, sk, 2, d1, d2);
	trk__hex(m.digest, 32, hex_model);
	trk__hex(tl.digest, 32, hex_tl);
	trk__hex(tp2.digest, 32, hex_tp2);
	trk__hex(d1, 32, hex_d1);
	proto_layout_fini(&tl);
	proto_layout_fini(&tp2);
	proto_model_fini(&m);
}

/* The soft state every input starts from, and what tells whether an input
 * left it as it was: no POST was accepted, the registry's generations did
 * not move, and its leases are still fresh (a rebuild costs about as much
 * as ten requests, and most inputs change nothing). */
static struct {
	bool dirty;
	uint64_t swarm_gen, members_gen, at_ns;
} base_state;

/* An empty replay cache: the macs sent so far are forgotten (in place: a
 * new cache would cost a large calloc per input). */
static void forget_signatures(void)
{
	trk__auth_forget(srv->auth);
	signed_any = false;
}

static void reset(void)
{
	char body[2048];
	struct answer a;

	forget_signatures(); /* its requests are the same every time */

	trk__registry_free(srv->reg);
	if (trk__registry_new(srv, &srv->reg) != 0)
		abort();
	register_publisher();
	for (int r = 0; r < 2; r++) {
		snprintf(body, sizeof(body),
			 "{\"replica\":\"A\",\"rank\":%d,\"host\":\"h\",\"provider\":\"tcp\","
			 "\"fabric_addr\":\"ab0%d\",\"layout\":%s,\"model_digest\":\"%s\"}",
			 r, r, TP2, hex_model);
		post_ok(TRK_API "/nodes", "application/json", body, strlen(body), &a);
		json_hex_field(a.body, "session", r ? ses_a1 : ses_a0, sizeof(ses_a0));
	}
	snprintf(body, sizeof(body),
		 "{\"id\":\"%s\",\"version\":1,\"parcels\":[{\"layout\":\"%s\",\"src_rank\":0,"
		 "\"dst_rank\":0,\"addr\":\"1\",\"key\":\"2\",\"len\":100}]}",
		 pub_id, hex_tp2);
	post_ok(TRK_API "/offers", "application/json", body, strlen(body), &a);
	snprintf(body, sizeof(body), "{\"id\":\"A/0\",\"version\":1,\"state\":\"verified\"}");
	post_ok(TRK_API "/nodes/state", "application/json", body, strlen(body), &a);
	base_state.dirty = false;
	base_state.swarm_gen = srv->reg->swarm_gen;
	base_state.members_gen = srv->reg->members_gen;
	base_state.at_ns = proto_now_ns();
}

static bool base_state_changed(void)
{
	return base_state.dirty || srv->reg->swarm_gen != base_state.swarm_gen ||
	       srv->reg->members_gen != base_state.members_gen ||
	       proto_now_ns() - base_state.at_ns > 1000000000ull;
}

/* Copies in[0..n) with the placeholders replaced; malloc'ed, *outn set.
 * Only an '@' can start one, so the bytes between are copied in runs. */
static char *subst(const uint8_t *in, size_t n, size_t *outn)
{
	const char *kv[][2] = {{"@MODEL@", hex_model}, {"@TL@", hex_tl}, {"@TP2@", hex_tp2},
			       {"@PUB@", pub_id},      {"@D1@", hex_d1}};
	size_t cap = n + 1, o = 0;
	const uint8_t *at;
	char *out;

	for (size_t i = 0; (at = memchr(in + i, '@', n - i)) != NULL; i = (size_t)(at - in) + 1)
		cap += 64; /* a value is at most 64 bytes */
	if ((out = malloc(cap)) == NULL)
		abort();
	for (size_t i = 0; i < n;) {
		size_t k, run;

		at = memchr(in + i, '@', n - i);
		run = at != NULL ? (size_t)(at - (in + i)) : n - i;
		memcpy(out + o, in + i, run);
		o += run;
		i += run;
		if (i == n)
			break;
		for (k = 0; k < sizeof(kv) / sizeof(kv[0]); k++) {
			size_t kl = strlen(kv[k][0]), vl = strlen(kv[k][1]);
			if (n - i >= kl && memcmp(in + i, kv[k][0], kl) == 0) {
				memcpy(out + o, kv[k][1], vl);
				o += vl;
				i += kl;
				break;
			}
		}
		if (k == sizeof(kv) / sizeof(kv[0]))
			out[o++] = (char)in[i++];
	}
	out[o] = 0;
	*outn = o;
	return out;
}

/* The query as it may stand on a request line: unreserved bytes and
 * & = % + , ; : / stay, others are percent-encoded. */
static void encode(const char *q, size_t n, char *out, size_t cap)
{
	size_t o = 0;
	for (size_t i = 0; i < n && o + 4 < cap; i++) {
		unsigned char ch = (unsigned char)q[i];
		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || strchr("-._~&=%+,;:/", ch) != NULL) {
			out[o++] = (char)ch;
		} else {
			snprintf(out + o, cap - o, "%%%02X", ch);
			o += 3;
		}
	}
	out[o] = 0;
}

/* Whether a request signed as sig must be refused: a POST, or a query
 * of memory keys, without a valid signature. */
static bool must_refuse(unsigned r, const struct sig *sig)
{
	return (strcmp(routes[r].method, "POST") == 0 || r == 1) &&
	       (sig->how == SIGN_NONE || sig->how == SIGN_RAW ||
		(sig->how == SIGN_ALTERED && sig->alter % 8 != 6));
}

static void one(const uint8_t *rec, size_t n)
{
	char uri[4096], q[2048];
	const uint8_t *nl;
	size_t qn, bn;
	struct answer a;
	struct sig sig = {0};

	if (n == 0)
		return;
	unsigned r = rec[0] % NROUTES, m = rec[0] / NROUTES;
	sig.how = (int)(m >> 2);
	sig.session = (int)(m & 3);
	rec++;
	n--;
	if (sig.how == SIGN_ALTERED && n > 0) {
		sig.alter = rec[0];
		rec++;
		n--;
	} else if (sig.how == SIGN_RAW) {
		nl = memchr(rec, '\n', n);
		sig.raw = (const char *)rec;
		sig.raw_len = nl ? (size_t)(nl - rec) : n;
		/* evhttp takes no header value holding a CR (nor a NUL) */
		if (memchr(rec, '\r', sig.raw_len) != NULL)
			return;
		rec += nl ? sig.raw_len + 1 : n;
		n -= nl ? sig.raw_len + 1 : n;
	}
	nl = memchr(rec, '\n', n);
	qn = nl ? (size_t)(nl - rec) : n;
	char *qs = subst(rec, PROTO_MIN(qn, 1024), &qn);
	char *body = subst(nl ? nl + 1 : rec + n, nl ? n - (size_t)(nl + 1 - rec) : 0, &bn);
	encode(qs, qn, q, sizeof(q));
	if (strcmp(routes[r].path, "/") != 0 && routes[r].path[strlen(routes[r].path) - 1] == '/')
		snprintf(uri, sizeof(uri), "%s%s%s", routes[r].path, q,
			 routes[r].suffix ? routes[r].suffix : "");
	else
		snprintf(uri, sizeof(uri), "%s%s%s", routes[r].path, qn ? "?" : "", q);
	const char *ctype = strcmp(routes[r].path, TRK_API "/versions") == 0 ?
				    "application/octet-stream" :
				    "application/json";
	size_t blen = strcmp(routes[r].method, "POST") == 0 ? bn : 0;
	bool replay = sig.how == SIGN_ALTERED && sig.alter % 8 == 6;
	if (replay)
		sig.how = SIGN_OK; /* the same request, twice */
	uint64_t s0 = proto_wall_ms() / 1000;
	request(routes[r].method, uri, ctype, body, blen, &sig, &a);
	if (strcmp(routes[r].method, "POST") == 0 && a.status / 100 == 2)
		base_state.dirty = true;
	if (a.status >= 500 || (a.status == 0 && r != 0) ||
	    (must_refuse(r, &sig) && a.status / 100 == 2)) {
		fprintf(stderr, "%s %s (signed %d/%u): %d %s\n", routes[r].method, uri, sig.how,
			sig.alter, a.status, a.body);
		abort();
	}
	if (replay && (strcmp(routes[r].method, "POST") == 0 || r == 1)) {
		/* Within the same second the header is the same: a replay. */
		request(routes[r].method, uri, ctype, body, blen, &sig, &a);
		if (a.status / 100 == 2 && proto_wall_ms() / 1000 == s0) {
			fprintf(stderr, "%s %s: a replayed signature was accepted: %d %s\n",
				routes[r].method, uri, a.status, a.body);
			abort();
		}
		if (a.status >= 500)
			abort();
	}
	free(qs);
	free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (srv == NULL) {
		setup_once();
		reset();
	}
	if (size > (64u << 10))
		return 0;
	for (int k = 0; k < 12 && size > 0; k++) {
		const uint8_t *z = memchr(data, 0, size);
		size_t n = z ? (size_t)(z - data) : size;
		one(data, n);
		data += z ? n + 1 : size;
		size -= z ? n + 1 : size;
	}
	/* Restored after the input rather than before the next: what the
	 * input added is freed in its own run, which libFuzzer's leak check
	 * (more mallocs than frees) would otherwise take for a leak. */
	if (base_state_changed())
		reset();
	if (signed_any) /* each input replays alone */
		forget_signatures();
	return 0;
}
