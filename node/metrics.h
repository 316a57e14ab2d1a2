/*
 * Metrics of one process in Prometheus text format (version 0.0.4): counters
 * (names end in _total), gauges and histograms (seconds), each with an
 * optional fixed label set. A program registers what it measures once, then
 * updates by handle from its event loop thread (no locking: the HTTP server
 * in node/metrics_http.h renders on the same loop). Handles are small ints;
 * a NULL registry or a negative handle makes every update a no-op, so code
 * that measures runs unchanged where nobody scrapes it.
 */
#ifndef NODE_METRICS_H
#define NODE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct node_metrics;

/* An empty registry; NULL when out of memory. node_metrics_free(NULL) is fine. */
struct node_metrics *node_metrics_new(void);
void node_metrics_free(struct node_metrics *m);

/* Registers one series: name (Prometheus conventions: base unit in the name,
 * _total for counters), labels as `key="value",...` or NULL, a help line.
 * Series of one name are rendered together, under one HELP and TYPE (the
 * first one's), whatever the order they were registered in. Returns the
 * handle or a negative errno (m NULL: -EINVAL). */
int node_metrics_counter(struct node_metrics *m, const char *name, const char *labels,
			 const char *help);
int node_metrics_gauge(struct node_metrics *m, const char *name, const char *labels,
		       const char *help);
/* bounds: n ascending upper bounds (+Inf is added); labels as above. */
int node_metrics_histogram(struct node_metrics *m, const char *name, const char *labels,
			   const char *help, const double *bounds, size_t n);

/* Updates; no-ops for a NULL registry or a negative handle. */
void node_metrics_add(struct node_metrics *m, int h, uint64_t v);
void node_metrics_set(struct node_metrics *m, int h, uint64_t v);
void node_metrics_observe(struct node_metrics *m, int h, double v);
uint64_t node_metrics_value(const struct node_metrics *m, int h);

/* Health for /healthz: ok, or not with a short reason (copied). */
void node_metrics_set_health(struct node_metrics *m, bool ok, const char *why);
/* A part of the process with its own health (a rank of a multi-rank node),
 * named in the reason it gives; not ok ("starting") until set. Returns the
 * handle or a negative errno. */
int node_metrics_health_part(struct node_metrics *m, const char *name);
void node_metrics_set_part_health(struct node_metrics *m, int h, bool ok, const char *why);
/* Healthy when the process is and every part is; *why (borrowed) the
 * process's reason, else the first unhealthy part's ("A/1: lease lost"). */
bool node_metrics_healthy(const struct node_metrics *m, const char **why);

/* Appends the exposition text to out. Returns 0 or -ENOMEM. */
int node_metrics_render(const struct node_metrics *m, struct evbuffer *out);

#endif
