/* /metrics and /healthz on a local port, with libevent's evhttp. */
#include "node/base/metrics_http.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "proto/proto.h"

struct node_metrics_http {
	struct evhttp *http;
	const struct proto_metrics *m;
	char url[300];
};

static void reply(struct evhttp_request *req, int code, const char *reason, const char *ctype,
		  struct evbuffer *body)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);

	evhttp_add_header(h, "Content-Type", ctype);
	evhttp_add_header(h, "Cache-Control", "no-store");
	evhttp_send_reply(req, code, reason, body);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct node_metrics_http *s = arg;
	const char *uri = evhttp_request_get_uri(req);
	enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
	struct evbuffer *b = evbuffer_new();
	const char *why;
	size_t plen;

	if (b == NULL) {
		evhttp_send_error(req, 500, "out of memory");
		return;
	}
	/* The path without its query string. */
	plen = strcspn(uri, "?");
	if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
		evbuffer_add_printf(b, "only GET\n");
		reply(req, 405, "Method Not Allowed", "text/plain", b);
	} else if (plen == 8 && strncmp(uri, "/metrics", plen) == 0) {
		size_t len;
		char *text = proto_metrics_render(s->m, &len);

		if (text == NULL || evbuffer_add(b, text, len) != 0) {
			evbuffer_drain(b, evbuffer_get_length(b));
			evbuffer_add_printf(b, "out of memory\n");
			reply(req, 500, "Internal Server Error", "text/plain", b);
		} else {
			reply(req, 200, "OK", "text/plain; version=0.0.4", b);
		}
		free(text);
	} else if (plen == 8 && strncmp(uri, "/healthz", plen) == 0) {
		if (proto_metrics_healthy(s->m, &why)) {
			evbuffer_add_printf(b, "ok\n");
			reply(req, 200, "OK", "text/plain", b);
		} else {
			evbuffer_add_printf(b, "%s\n", why);
			reply(req, 503, "Service Unavailable", "text/plain", b);
		}
	} else {
		evbuffer_add_printf(b, "not found: /metrics and /healthz are served here\n");
		reply(req, 404, "Not Found", "text/plain", b);
	}
	evbuffer_free(b);
}

/* "host:port" or "[v6]:port" into host (without brackets) and port. */
static int split(const char *listen, char *host, size_t hlen, uint16_t *port)
{
	const char *colon = strrchr(listen, ':');
	uint64_t p;

	if (colon == NULL || colon == listen || proto_parse_u64(colon + 1, 0, 65535, &p) != 0)
		return -EINVAL;
	size_t n = (size_t)(colon - listen);
	if (listen[0] == '[') {
		if (n < 3 || listen[n - 1] != ']')
			return -EINVAL;
		listen++;
		n -= 2;
	}
	if (n >= hlen)
		return -EINVAL;
	memcpy(host, listen, n);
	host[n] = '\0';
	*port = (uint16_t)p;
	return 0;
}

int node_metrics_http_new(struct event_base *base, const char *listen, const struct proto_metrics *m,
			  struct node_metrics_http **out, struct proto_err *err)
{
	struct node_metrics_http *s = NULL;
	struct evhttp_bound_socket *sock;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256];
	uint16_t port;
	int rc;

	*out = NULL;
	if (split(listen, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "--metrics %s is not HOST:PORT (or off)", listen);
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	s->m = m;
	s->http = evhttp_new(base);
	if (s->http == NULL) {
		rc = proto_errf(err, ENOMEM, "evhttp_new failed");
		goto fail;
	}
	/* Scrapers send small GETs: tight caps, short idle time. */
	evhttp_set_max_body_size(s->http, 0);
	evhttp_set_max_headers_size(s->http, 8192);
	evhttp_set_timeout(s->http, 10);
	evhttp_set_allowed_methods(s->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
						    EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
	evhttp_set_gencb(s->http, on_request, s);
	sock = evhttp_bind_socket_with_handle(s->http, host, port);
	if (sock == NULL) {
		rc = proto_errf(err, EADDRNOTAVAIL, "metrics: cannot listen on %s: %s", listen,
				strerror(errno));
		goto fail;
	}
	if (getsockname(evhttp_bound_socket_get_fd(sock), (struct sockaddr *)&ss, &sl) != 0) {
		rc = proto_errf(err, EIO, "metrics: cannot read the bound port");
		goto fail;
	}
	port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
					: ntohs(((struct sockaddr_in *)&ss)->sin_port);
	snprintf(s->url, sizeof(s->url), strchr(host, ':') ? "http://[%s]:%u" : "http://%s:%u", host,
		 (unsigned)port);
	*out = s;
	return 0;
fail:
	node_metrics_http_free(s);
	return rc;
}

const char *node_metrics_http_url(const struct node_metrics_http *s)
{
	return s->url;
}

void node_metrics_http_free(struct node_metrics_http *s)
{
	if (s == NULL)
		return;
	if (s->http != NULL)
		evhttp_free(s->http);
	free(s);
}
