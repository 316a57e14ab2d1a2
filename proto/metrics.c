/* A process's metrics registry and its Prometheus text rendering. */
#include "proto/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#define METRICS_MAX 4096 /* series at most (a multi-rank node: its ranks' series) */
#define BUCKETS_MAX 24
#define PARTS_MAX 256    /* health parts at most (node/host.h: one per rank) */

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

struct health_part {
	char name[128];
	bool ok;
	char why[256]; /* "name: reason" */
};

struct proto_metrics {
	struct metric *m; /* grows, up to METRICS_MAX */
	int n, cap;
	bool healthy;
	char why[128];
	struct health_part *parts;
	int nparts;
};

struct proto_metrics *proto_metrics_new(void)
{
	struct proto_metrics *m = calloc(1, sizeof(*m));

	if (m != NULL)
		snprintf(m->why, sizeof(m->why), "starting");
	return m;
}

void proto_metrics_free(struct proto_metrics *m)
{
	if (m == NULL)
		return;
	free(m->m);
	free(m->parts);
	free(m);
}

static int add(struct proto_metrics *m, enum metric_kind kind, const char *name,
	       const char *labels, const char *help)
{
	struct metric *x;

	if (m == NULL || name == NULL || help == NULL)
		return -EINVAL;
	if (m->n >= METRICS_MAX)
		return -ENOSPC;
	if (m->n == m->cap) {
		int cap = m->cap ? 2 * m->cap : 32;
		struct metric *g = realloc(m->m, (size_t)cap * sizeof(*g));
		if (g == NULL)
			return -ENOMEM;
		m->m = g;
		m->cap = cap;
	}
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

int proto_metrics_counter(struct proto_metrics *m, const char *name, const char *labels,
			 const char *help)
{
	return add(m, KIND_COUNTER, name, labels, help);
}

int proto_metrics_gauge(struct proto_metrics *m, const char *name, const char *labels,
		       const char *help)
{
	return add(m, KIND_GAUGE, name, labels, help);
}

int proto_metrics_histogram(struct proto_metrics *m, const char *name, const char *labels,
			   const char *help, const double *bounds, size_t n)
{
	if (n == 0 || n > BUCKETS_MAX)
		return -EINVAL;
	for (size_t i = 1; i < n; i++)
		if (!(bounds[i] > bounds[i - 1]))
			return -EINVAL;
	int h = add(m, KIND_HISTOGRAM, name, labels, help);
	if (h >= 0) {
		memcpy(m->m[h].bounds, bounds, n * sizeof(*bounds));
		m->m[h].nbounds = n;
	}
	return h;
}

static struct metric *get(struct proto_metrics *m, int h)
{
	return m != NULL && h >= 0 && h < m->n ? &m->m[h] : NULL;
}

void proto_metrics_add(struct proto_metrics *m, int h, uint64_t v)
{
	struct metric *x = get(m, h);
	if (x != NULL)
		x->value += v;
}

void proto_metrics_set(struct proto_metrics *m, int h, uint64_t v)
{
	struct metric *x = get(m, h);
	if (x != NULL)
		x->value = v;
}

void proto_metrics_observe(struct proto_metrics *m, int h, double v)
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

uint64_t proto_metrics_value(const struct proto_metrics *m, int h)
{
	if (m == NULL || h < 0 || h >= m->n)
		return 0;
	return m->m[h].kind == KIND_HISTOGRAM ? m->m[h].count : m->m[h].value;
}

void proto_metrics_set_health(struct proto_metrics *m, bool ok, const char *why)
{
	if (m == NULL)
		return;
	m->healthy = ok;
	snprintf(m->why, sizeof(m->why), "%s", why ? why : "");
}

int proto_metrics_health_part(struct proto_metrics *m, const char *name)
{
	struct health_part *p;

	if (m == NULL || name == NULL || strlen(name) >= sizeof(p->name))
		return -EINVAL;
	if (m->nparts >= PARTS_MAX)
		return -ENOSPC;
	p = realloc(m->parts, (size_t)(m->nparts + 1) * sizeof(*p));
	if (p == NULL)
		return -ENOMEM;
	m->parts = p;
	p = &m->parts[m->nparts];
	*p = (struct health_part){.ok = false};
	snprintf(p->name, sizeof(p->name), "%s", name);
	snprintf(p->why, sizeof(p->why), "%s: starting", name);
	return m->nparts++;
}

void proto_metrics_set_part_health(struct proto_metrics *m, int h, bool ok, const char *why)
{
	if (m == NULL || h < 0 || h >= m->nparts)
		return;
	m->parts[h].ok = ok;
	snprintf(m->parts[h].why, sizeof(m->parts[h].why), "%s: %s", m->parts[h].name,
		 why ? why : "");
}

bool proto_metrics_healthy(const struct proto_metrics *m, const char **why)
{
	if (why != NULL)
		*why = m != NULL ? m->why : "no metrics";
	if (m == NULL || !m->healthy)
		return false;
	for (int i = 0; i < m->nparts; i++)
		if (!m->parts[i].ok) {
			if (why != NULL)
				*why = m->parts[i].why;
			return false;
		}
	return true;
}

/* Series i and those of its name registered after it, HELP and TYPE once. */
static int render_name(const struct proto_metrics *m, int first, struct evbuffer *out)
{
	static const char *types[] = {"counter", "gauge", "histogram"};
	const struct metric *f = &m->m[first];
	int rc = evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help,
				     f->name, types[f->kind]);

	for (int i = first; i < m->n && rc >= 0; i++) {
		const struct metric *x = &m->m[i];
		if (strcmp(x->name, f->name) != 0)
			continue;
		if (x->kind != KIND_HISTOGRAM) {
			rc = evbuffer_add_printf(out, "%s%s%s%s %" PRIu64 "\n", x->name,
						 x->labels[0] ? "{" : "", x->labels,
						 x->labels[0] ? "}" : "", x->value);
			continue;
		}
		const char *sep = x->labels[0] ? "," : "";
		uint64_t cum = 0;
		for (size_t b = 0; b <= x->nbounds && rc >= 0; b++) {
			cum += x->buckets[b];
			if (b < x->nbounds)
				rc = evbuffer_add_printf(out, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n",
							 x->name, x->labels, sep, x->bounds[b], cum);
			else
				rc = evbuffer_add_printf(out, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n",
							 x->name, x->labels, sep, cum);
		}
		if (rc >= 0)
			rc = evbuffer_add_printf(out, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %" PRIu64 "\n",
						 x->name, x->labels[0] ? "{" : "", x->labels,
						 x->labels[0] ? "}" : "", x->sum, x->name,
						 x->labels[0] ? "{" : "", x->labels,
						 x->labels[0] ? "}" : "", x->count);
	}
	return rc;
}

int proto_metrics_render(const struct proto_metrics *m, struct evbuffer *out)
{
	int rc = 0;

	/* Each name once, at its first series, with every series of it (a
	 * multi-rank node registers each rank's set in turn). */
	for (int i = 0; m != NULL && i < m->n && rc >= 0; i++) {
		int j;
		for (j = 0; j < i && strcmp(m->m[j].name, m->m[i].name) != 0; j++)
			;
		if (j == i)
			rc = render_name(m, i, out);
	}
	return rc < 0 ? -ENOMEM : 0;
}
