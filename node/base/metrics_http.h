/*
 * The local HTTP port of a node agent or publisher: GET /metrics (the
 * registry of proto/metrics.h in Prometheus text) and GET /healthz (200 "ok"
 * or 503 with the reason). libevent's evhttp on the program's event loop;
 * nothing else is served (404), nothing but GET and HEAD accepted (405),
 * bodies refused, idle connections closed; at most 64 connections at once,
 * each for 10 s at most, a flood's address losing its own first.
 */
#ifndef NODE_METRICS_HTTP_H
#define NODE_METRICS_HTTP_H

#include "proto/metrics.h"
#include "proto/util.h"

struct event_base;
struct node_metrics_http;

/* Whether v is what --metrics takes (HOST:PORT or off): 0, or -EINVAL with
 * the reason in err. node_metrics_http_new parses it alike. */
int node_metrics_addr_check(const char *v, struct proto_err *err);

/* Listens on listen ("HOST:PORT", "[V6]:PORT"; port 0 picks a free one) and
 * serves m, which must outlive the server. On failure *out is NULL and err
 * says why. */
int node_metrics_http_new(struct event_base *base, const char *listen, const struct proto_metrics *m,
			  struct node_metrics_http **out, struct proto_err *err);
/* Connections open now (at most 64; each lives 10 s at most). */
size_t node_metrics_http_conns(struct node_metrics_http *s);
/* "http://HOST:PORT" with the port bound. */
const char *node_metrics_http_url(const struct node_metrics_http *s);
void node_metrics_http_free(struct node_metrics_http *s);

/* The --metrics flag's default: loopback, a free port. "off" disables. */
#define NODE_METRICS_DEFAULT "127.0.0.1:0"

#endif
