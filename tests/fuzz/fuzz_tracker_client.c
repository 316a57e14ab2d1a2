/* libFuzzer target: the tracker client (tracker/client/) on answers a
 * hostile or broken tracker sends, raw HTTP from a fake tracker on
 * loopback, and the node's readings of them through the public parsers it
 * uses: a registration (the session it keeps), /holders (each holder's
 * sources), /layouts (each layout's explicit form against a small model),
 * /replicas/R (the target's statements), /versions and /sources.
 *
 * Input: a byte that picks the request, then the tracker's raw answer
 * (status line, headers, body). The fake tracker writes it, and resets the
 * connection once the client has called back or stopped reading (no
 * TIME_WAIT left behind); a kept-open connection is reset likewise. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <jansson.h>

#include "proto/log.h"
#include "proto/spec.h"
#include "tracker/tracker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fzt_model_json[] =
	"{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]},"
	"{\"name\":\"n\",\"dtype\":\"fp32\",\"shape\":[16]}]}";

static struct {
	struct event_base *base;
	struct evconnlistener *lis;
	struct trk_client *c;
	struct proto_model m;
	int port, fd; /* the fake tracker's side of the connection (-1: none) */
	int answered;
	uint8_t pick;
} fzt;

static void fzt_on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
			  int salen, void *arg)
{
	if (fzt.fd >= 0)
		close(fzt.fd);
	fzt.fd = fd;
}

/* Resets the fake tracker's connection: RST, so no TIME_WAIT remains. */
static void fzt_reset(void)
{
	struct linger lg = {1, 0};

	if (fzt.fd < 0)
		return;
	setsockopt(fzt.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fzt.fd);
	fzt.fd = -1;
}

static void fzt_cleanup(void)
{
	fzt_reset();
	trk_client_free(fzt.c);
	evconnlistener_free(fzt.lis);
	event_base_free(fzt.base);
	proto_model_fini(&fzt.m);
}

static void fzt_setup(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	struct proto_err err;
	char url[64];

	signal(SIGPIPE, SIG_IGN);
	proto_log_setup("fuzz", PROTO_LOG_ERR);
	fzt.fd = -1;
	if ((fzt.base = event_base_new()) == NULL)
		abort();
	fzt.lis = evconnlistener_new_bind(fzt.base, fzt_on_accept, NULL,
					  LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 64,
					  (struct sockaddr *)&sa, sizeof(sa));
	if (fzt.lis == NULL ||
	    getsockname(evconnlistener_get_fd(fzt.lis), (struct sockaddr *)&sa, &sl) != 0)
		abort();
	fzt.port = ntohs(sa.sin_port);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", fzt.port);
	if (trk_client_new(fzt.base, url, NULL, &fzt.c, &err) != 0 ||
	    proto_model_parse(fzt_model_json, strlen(fzt_model_json), "model", &fzt.m, &err) != 0)
		abort();
	trk_client_set_timeout(fzt.c, 2000);
	atexit(fzt_cleanup);
}

/* The node's readings of each answer. */
static void fzt_on_answer(const struct trk_answer *a, void *arg)
{
	static const uint8_t digest[PROTO_HASH_BYTES];
	struct proto_err err;
	json_t *list, *e;
	size_t i;

	fzt.answered++;
	if (a->error == NULL || a->body == NULL || (a->status >= 400 && a->error[0] == 0))
		abort();
	if (a->json == NULL)
		return;
	switch (fzt.pick) {
	case 0: {
		const char *id = json_string_value(json_object_get(a->json, "node_id"));
		const char *ses = id ? trk_client_session(fzt.c, id) : NULL;
		if (ses != NULL && strlen(ses) != 2 * TRK_SESSION_BYTES)
			abort();
		break;
	}
	case 1:
		json_array_foreach(json_object_get(a->json, "holders"), i, e) {
			struct trk_source *s = NULL;
			size_t n = 0;
			if (trk_sources_parse(e, &s, &n, &err) == 0)
				trk_sources_free(s, n);
		}
		break;
	case 2:
		json_array_foreach(json_object_get(a->json, "layouts"), i, e) {
			struct proto_layout l;
			uint8_t d[PROTO_HASH_BYTES];
			const char *hex = json_string_value(json_object_get(e, "digest"));
			if (hex == NULL || proto_parse_hex(hex, d, sizeof(d)) != 0)
				continue;
			if (proto_layout_from_json(&fzt.m, json_object_get(e, "layout"), "holder layout",
						   &l, &err) == 0)
				proto_layout_fini(&l);
		}
		break;
	case 3:
		list = json_object_get(a->json, "target_statements");
		for (uint32_t self = 0; self < 3; self++)
			trk_statements_check(list, "A", 3, self,
					     (uint64_t)json_integer_value(json_object_get(a->json, "target")),
					     digest, &err);
		break;
	case 4: {
		struct trk_version_info *vs = NULL;
		uint64_t latest, now;
		size_t n;
		if (trk_versions_parse(a->json, &latest, &vs, &n, &err) == 0)
			free(vs);
		trk_versions_now(a->json, &now, &err);
		break;
	}
	default: {
		struct trk_source *s = NULL;
		size_t n = 0;
		if (trk_sources_parse(a->json, &s, &n, &err) == 0)
			trk_sources_free(s, n);
	}
	}
}

static int fzt_ask(uint8_t pick)
{
	static const uint8_t digest[PROTO_HASH_BYTES] = {1};
	json_t *layout;
	int rc;

	switch (pick) {
	case 0: {
		struct trk_node_reg r = {.replica = "A", .model_digest = digest,
					 .addr = {.rank = 0, .host = "h", .provider = "tcp",
						  .fabric_addr = "ab01"}};
		layout = json_pack("{s:i}", "ranks", 1);
		r.layout = layout;
		rc = trk_client_register_node(fzt.c, &r, fzt_on_answer, NULL);
		json_decref(layout);
		return rc;
	}
	case 1: return trk_client_holders(fzt.c, 2, digest, fzt_on_answer, NULL);
	case 2: return trk_client_layouts(fzt.c, fzt_on_answer, NULL);
	case 3: return trk_client_replica(fzt.c, "A", fzt_on_answer, NULL);
	case 4: return trk_client_watch(fzt.c, 1, 0, fzt_on_answer, NULL);
	default: return trk_client_sources(fzt.c, 2, digest, 0, 0, fzt_on_answer, NULL);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (fzt.base == NULL)
		fzt_setup();
	if (size < 1 || size > (256u << 10))
		return 0;
	fzt.pick = data[0] % 6;
	fzt.answered = 0;
	if (fzt_ask(fzt.pick) != 0)
		abort();
	/* The request arrives (on a new connection, or the kept one). */
	for (int i = 0; i < 1000 && fzt.fd < 0; i++)
		event_base_loop(fzt.base, EVLOOP_ONCE | EVLOOP_NONBLOCK);
	if (fzt.fd < 0)
		abort();
	(void)!send(fzt.fd, data + 1, size - 1, MSG_NOSIGNAL);
	for (int i = 0; i < 20 && !fzt.answered; i++)
		event_base_loop(fzt.base, EVLOOP_NONBLOCK);
	fzt_reset();
	for (int i = 0; i < 1000 && !fzt.answered; i++)
		event_base_loop(fzt.base, EVLOOP_ONCE);
	if (fzt.answered != 1)
		abort(); /* every request is answered exactly once */
	return 0;
}
