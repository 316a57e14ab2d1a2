/* One request being handled: its query's fields and its answer, and the
 * answers to requests held past their call (long-polls). Every answer goes
 * out here, with the headers every answer carries. */
#include <errno.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

const char *trk__reason(int code)
{
	switch (code) {
	case 200: return "OK";
	case 201: return "Created";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 411: return "Length Required";
	case 413: return "Payload Too Large";
	case 503: return "Service Unavailable";
	default: return code < 400 ? "OK" : "Internal Server Error";
	}
}

static void count_answer(struct trk_server *s, int code)
{
	int cls = code / 100;
	if (cls >= 1 && cls <= 5)
		s->answers[cls]++;
}

/* Sends an answer with the headers every answer carries: through evhttp
 * on req, or (req NULL: a request with no connection) into *out. */
static void send_buf(struct trk_server *s, struct evhttp_request *req, struct trk_outcome *out,
		     int code, const char *ctype, const void *buf, size_t len)
{
	struct evkeyvalq *h;
	struct evbuffer *buffer;

	if (req == NULL) {
		out->body = len > 0 ? malloc(len) : NULL;
		if (out->body != NULL)
			memcpy(out->body, buf, len);
		else if (len > 0)
			code = 500;
		out->len = out->body != NULL ? len : 0;
		snprintf(out->ctype, sizeof(out->ctype), "%s", ctype);
		if (s->vs != NULL && !s->standby)
			trk__versions_chain(s->vs, out->chain, sizeof(out->chain));
		count_answer(s, code);
		out->code = code;
		return;
	}
	h = evhttp_request_get_output_headers(req);
	buffer = evbuffer_new();
	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Cache-Control", "no-store");
	if (s->auth != NULL && !s->standby)
		evhttp_add_header(h, TRK_EPOCH_HEADER, trk__auth_epoch(s->auth));
	if (s->standby)
		evhttp_add_header(h, TRK_STANDBY_HEADER, s->leader);
	else if (s->vs != NULL) {
		/* A standby's chain may be behind the leader's: never shown. */
		char chain[TRK_CHAIN_MAX];
		trk__versions_chain(s->vs, chain, sizeof(chain));
		evhttp_add_header(h, TRK_CHAIN_HEADER, chain);
	}
	if (buffer != NULL && len > 0 && evbuffer_add(buffer, buf, len) != 0) {
		evbuffer_free(buffer);
		buffer = NULL;
	}
	if (buffer == NULL && len > 0)
		code = 500;
	count_answer(s, code);
	evhttp_send_reply(req, code, trk__reason(code), buffer);
	if (buffer != NULL)
		evbuffer_free(buffer);
}

void trk__outcome_fini(struct trk_outcome *a)
{
	free(a->body);
	memset(a, 0, sizeof(*a));
}

char *trk__json_text(const json_t *obj, size_t *len)
{
	char *txt = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;

	if (txt == NULL)
		return NULL;
	size_t n = strlen(txt);
	/* One trailing newline makes curl output readable. */
	char *t = realloc(txt, n + 2);
	if (t != NULL) {
		txt = t;
		txt[n++] = '\n';
		txt[n] = 0;
	}
	*len = n;
	return txt;
}

/* Sends JSON text already made (txt NULL: out of memory, a 500). */
static void send_text(struct trk_server *s, struct evhttp_request *req, struct trk_outcome *out,
		      int code, const char *txt, size_t len)
{
	static const char oom[] = "{\"error\":\"out of memory\"}\n";

	if (txt == NULL)
		send_buf(s, req, out, 500, "application/json", oom, sizeof(oom) - 1);
	else
		send_buf(s, req, out, code, "application/json", txt, len);
}

void trk__reply_req_text(struct trk_server *s, struct evhttp_request *req, int code,
			 const char *txt, size_t len)
{
	send_text(s, req, NULL, code, txt, len);
}

void trk__reply_req_json(struct trk_server *s, struct evhttp_request *req,
			 int code, json_t *obj)
{
	size_t n = 0;
	char *txt = trk__json_text(obj, &n);

	json_decref(obj);
	trk__reply_req_text(s, req, code, txt, n);
	free(txt);
}

void trk__reply_json(struct trk_call *c, int code, json_t *obj)
{
	size_t n = 0;
	char *txt;

	if (c->answered) {
		json_decref(obj);
		return;
	}
	c->answered = true;
	txt = trk__json_text(obj, &n);
	json_decref(obj);
	send_text(c->s, c->req, c->out, code, txt, n);
	free(txt);
}

void trk__reply_req_raw(struct trk_server *s, struct evhttp_request *req, int code,
			const char *ctype, const void *buf, size_t len)
{
	send_buf(s, req, NULL, code, ctype, buf, len);
}

void trk__reply_raw(struct trk_call *c, int code, const char *ctype,
		    const void *buf, size_t len)
{
	if (c->answered)
		return;
	c->answered = true;
	send_buf(c->s, c->req, c->out, code, ctype, buf, len);
}

/* The pages a browser asks for (the status page, a version's page): their
 * errors are one line of text, not JSON. */
static bool html_route(const char *path)
{
	return path != NULL && (strcmp(path, "/") == 0 || strncmp(path, "/versions/", 10) == 0);
}

static void vfail(struct trk_call *c, int level, int code, const char *fmt, va_list ap)
{
	char msg[600];

	vsnprintf(msg, sizeof(msg), fmt, ap);
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = ' ';
	proto_log(level, __FILE__, __LINE__, "%s %s -> %d %s", c->post ? "POST" : "GET", c->path,
		  code, msg);
	if (html_route(c->path)) {
		size_t n = strlen(msg);
		if (n + 1 < sizeof(msg))
			msg[n++] = '\n';
		trk__reply_raw(c, code, "text/plain; charset=utf-8", (const uint8_t *)msg, n);
		return;
	}
	trk__reply_json(c, code, json_pack("{s:s}", "error", msg));
}

void trk__fail(struct trk_call *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, PROTO_LOG_INFO, code, fmt, ap);
	va_end(ap);
}

void trk__fail_routine(struct trk_call *c, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, PROTO_LOG_DEBUG, code, fmt, ap);
	va_end(ap);
}

const char *trk__query_str(struct trk_call *c, const char *key)
{
	return evhttp_find_header(&c->query, key);
}

int trk__query_u64(struct trk_call *c, const char *key, bool required,
		   uint64_t max, uint64_t *out, struct proto_err *err)
{
	const char *s = trk__query_str(c, key);

	if (s == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (proto_parse_u64(s, 0, max, out) != 0)
		return proto_errf(err, EINVAL, "%s: must be an integer in 0..%llu",
				  key, (unsigned long long)max);
	return 0;
}
