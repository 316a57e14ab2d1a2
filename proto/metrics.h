/*
 * Metrics of one process in Prometheus text format (version 0.0.4): counters
 * (names end in _total), gauges and histograms (seconds), each with an
 * optional fixed label set. A program registers what it measures once, then
 * updates by handle from its event loop thread (no locking: the HTTP server
 * that serves the text renders on the same loop, node/base/metrics_http.c
 * for nodes and publishers); the tracker fills a registry afresh for each
 * scrape. Handles are small ints; a NULL registry or a negative handle makes
 * every update a no-op, so code that measures runs unchanged where nobody
 * scrapes it.
 */
#ifndef PROTO_METRICS_H
#define PROTO_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct proto_metrics;

/* An empty registry of at most 4096 series; NULL when out of memory.
 * proto_metrics_free(NULL) is fine. */
struct proto_metrics *proto_metrics_new(void);
/* The same holding at most max series. */
struct proto_metrics *proto_metrics_new_max(size_t max);
void proto_metrics_free(struct proto_metrics *m);

/* Registers one series: name (Prometheus conventions: base unit in the name,
 * _total for counters), labels as `key="value",...` or NULL, a help line.
 * Series of one name are rendered together, under one HELP and TYPE (the
 * first one's), whatever the order they were registered in. Returns the
 * handle or a negative errno (m NULL: -EINVAL; past the registry's series:
 * -ENOSPC; a name of 96 bytes or more, labels or help of 160: -ENAMETOOLONG). */
int proto_metrics_counter(struct proto_metrics *m, const char *name, const char *labels,
			 const char *help);
int proto_metrics_gauge(struct proto_metrics *m, const char *name, const char *labels,
		       const char *help);
/* bounds: n ascending upper bounds (+Inf is added); labels as above. */
int proto_metrics_histogram(struct proto_metrics *m, const char *name, const char *labels,
			   const char *help, const double *bounds, size_t n);

/* Updates; no-ops for a NULL registry or a negative handle. */
void proto_metrics_add(struct proto_metrics *m, int h, uint64_t v);
void proto_metrics_set(struct proto_metrics *m, int h, uint64_t v);
/* A gauge in seconds set from milliseconds: rendered as seconds with three
 * decimals ("1.250"). */
void proto_metrics_set_ms(struct proto_metrics *m, int h, uint64_t ms);
void proto_metrics_observe(struct proto_metrics *m, int h, double v);
uint64_t proto_metrics_value(const struct proto_metrics *m, int h);

/* Health for /healthz: ok, or not with a short reason (copied). */
void proto_metrics_set_health(struct proto_metrics *m, bool ok, const char *why);
/* A part of the process with its own health (a rank of a multi-rank node),
 * named in the reason it gives; not ok ("starting") until set. Returns the
 * handle or a negative errno. */
int proto_metrics_health_part(struct proto_metrics *m, const char *name);
void proto_metrics_set_part_health(struct proto_metrics *m, int h, bool ok, const char *why);
/* Healthy when the process is and every part is; *why (borrowed) the
 * process's reason, else the first unhealthy part's ("A/1: lease lost"). */
bool proto_metrics_healthy(const struct proto_metrics *m, const char **why);

/* The exposition text, malloc'ed (the caller frees it), its length in
 * *len; NULL when out of memory. A NULL m renders as "". */
char *proto_metrics_render(const struct proto_metrics *m, size_t *len);

#endif
