/* A process's metrics registry and its Prometheus text rendering. */
#include "node/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#define METRICS_MAX 128
#define BUCKETS_MAX 24

enum metric_kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };

struct metric {
	enum metric_kind kind;
	char name[96], labels[160], help[160];
	uint64_t value;
	/* histogram */
	double bounds[BUCKETS_MAX];
	uint64_t buckets[BUCKETS_MAX + 1]; /* per bucket, not cumulative; last: +Inf */
	size_t nbounds;
	double sum;
	uint64_t count;
};

struct node_metrics {
	struct metric m[METRICS_MAX];
	int n;
	bool healthy;
	char why[128];
};

struct node_metrics *node_metrics_new(void)
{
	struct node_metrics *m = calloc(1, sizeof(*m));

	if (m != NULL)
		snprintf(m->why, sizeof(m->why), "starting");
	return m;
}

void node_metrics_free(struct node_metrics *m)
{
	free(m);
}

static int add(struct node_metrics *m, enum metric_kind kind, const char *name,
	       const char *labels, const char *help)
{
	struct metric *x;

	if (m == NULL || name == NULL || help == NULL)
		return -EINVAL;
	if (m->n >= METRICS_MAX)
		return -ENOSPC;
	if (strlen(name) >= sizeof(x->name) || (labels && strlen(labels) >= sizeof(x->labels)) ||
	    strlen(help) >= sizeof(x->help))
		return -ENAMETOOLONG;
	x = &m->m[m->n];
	*x = (struct metric){.kind = kind};
	snprintf(x->name, sizeof(x->name), "%s", name);
	snprintf(x->labels, sizeof(x->labels), "%s", labels ? labels : "");
	snprintf(x->help, sizeof(x->help), "%s", help);
	return m->n++;
}

int node_metrics_counter(struct node_metrics *m, const char *name, const char *labels,
			 const char *help)
{
	return add(m, KIND_COUNTER, name, labels, help);
}

int node_metrics_gauge(struct node_metrics *m, const char *name, const char *labels,
		       const char *help)
{
	return add(m, KIND_GAUGE, name, labels, help);
}

int node_metrics_histogram(struct node_metrics *m, const char *name, const char *help,
			   const double *bounds, size_t n)
{
	if (n == 0 || n > BUCKETS_MAX)
		return -EINVAL;
	for (size_t i = 1; i < n; i++)
		if (!(bounds[i] > bounds[i - 1]))
			return -EINVAL;
	int h = add(m, KIND_HISTOGRAM, name, NULL, help);
	if (h >= 0) {
		memcpy(m->m[h].bounds, bounds, n * sizeof(*bounds));
		m->m[h].nbounds = n;
	}
	return h;
}

static struct metric *get(struct node_metrics *m, int h)
{
	return m != NULL && h >= 0 && h < m->n ? &m->m[h] : NULL;
}

void node_metrics_add(struct node_metrics *m, int h, uint64_t v)
{
	struct metric *x = get(m, h);
	if (x != NULL)
		x->value += v;
}

void node_metrics_set(struct node_metrics *m, int h, uint64_t v)
{
	struct metric *x = get(m, h);
	if (x != NULL)
		x->value = v;
}

void node_metrics_observe(struct node_metrics *m, int h, double v)
{
	struct metric *x = get(m, h);
	size_t b;

	if (x == NULL || x->kind != KIND_HISTOGRAM)
		return;
	for (b = 0; b < x->nbounds && v > x->bounds[b]; b++)
		;
	x->buckets[b]++;
	x->sum += v;
	x->count++;
}

uint64_t node_metrics_value(const struct node_metrics *m, int h)
{
	if (m == NULL || h < 0 || h >= m->n)
		return 0;
	return m->m[h].kind == KIND_HISTOGRAM ? m->m[h].count : m->m[h].value;
}

void node_metrics_set_health(struct node_metrics *m, bool ok, const char *why)
{
	if (m == NULL)
		return;
	m->healthy = ok;
	snprintf(m->why, sizeof(m->why), "%s", why ? why : "");
}

bool node_metrics_healthy(const struct node_metrics *m, const char **why)
{
	if (why != NULL)
		*why = m != NULL ? m->why : "no metrics";
	return m != NULL && m->healthy;
}

int node_metrics_render(const struct node_metrics *m, struct evbuffer *out)
{
	static const char *types[] = {"counter", "gauge", "histogram"};
	int rc = 0;

	for (int i = 0; m != NULL && i < m->n && rc >= 0; i++) {
		const struct metric *x = &m->m[i];
		if (i == 0 || strcmp(m->m[i - 1].name, x->name) != 0)
			rc = evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", x->name, x->help,
						 x->name, types[x->kind]);
		if (rc < 0)
			break;
		if (x->kind != KIND_HISTOGRAM) {
			rc = evbuffer_add_printf(out, "%s%s%s%s %" PRIu64 "\n", x->name,
						 x->labels[0] ? "{" : "", x->labels,
						 x->labels[0] ? "}" : "", x->value);
			continue;
		}
		uint64_t cum = 0;
		for (size_t b = 0; b <= x->nbounds && rc >= 0; b++) {
			cum += x->buckets[b];
			if (b < x->nbounds)
				rc = evbuffer_add_printf(out, "%s_bucket{le=\"%g\"} %" PRIu64 "\n",
							 x->name, x->bounds[b], cum);
			else
				rc = evbuffer_add_printf(out, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n",
							 x->name, cum);
		}
		if (rc >= 0)
			rc = evbuffer_add_printf(out, "%s_sum %.6f\n%s_count %" PRIu64 "\n", x->name,
						 x->sum, x->name, x->count);
	}
	return rc < 0 ? -ENOMEM : 0;
}
