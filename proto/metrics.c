/* A process's metrics registry and its Prometheus text rendering. */
#include "proto/metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX 4096 /* series at most by default (a multi-rank node: its ranks' series) */
#define BUCKETS_MAX 24
#define PARTS_MAX 256    /* health parts at most (node/host/host.h: one per rank) */
#define NAME_MAX_LEN 96  /* a name, labels, a help line: shorter than these */
#define LABELS_MAX_LEN 160
#define HELP_MAX_LEN 160

enum metric_kind { KIND_COUNTER, KIND_GAUGE, KIND_HISTOGRAM };

struct histogram {
	double bounds[BUCKETS_MAX];
	uint64_t buckets[BUCKETS_MAX + 1]; /* per bucket, not cumulative; last: +Inf */
	size_t nbounds;
	double sum;
	uint64_t count;
};

struct metric {
	enum metric_kind kind;
	bool ms;          /* value holds milliseconds, rendered as seconds */
	char *name;       /* one allocation: name, labels, help, each NUL-ended */
	const char *labels, *help;
	uint64_t value;
	struct histogram *h; /* histograms only */
};

struct health_part {
	char name[128];
	bool ok;
	char why[512]; /* "name: reason" */
};

struct proto_metrics {
	struct metric *m; /* grows, up to max */
	size_t n, cap, max;
	bool healthy;
	char why[512]; /* the process's own reason: a person's fix with its flag fits */
	struct health_part *parts;
	int nparts;
};

struct proto_metrics *proto_metrics_new_max(size_t max)
{
	struct proto_metrics *m = calloc(1, sizeof(*m));

	if (m != NULL) {
		m->max = max < INT_MAX ? max : INT_MAX; /* handles are ints */
		snprintf(m->why, sizeof(m->why), "starting");
	}
	return m;
}

struct proto_metrics *proto_metrics_new(void)
{
	return proto_metrics_new_max(METRICS_MAX);
}

void proto_metrics_free(struct proto_metrics *m)
{
	if (m == NULL)
		return;
	for (size_t i = 0; i < m->n; i++) {
		free(m->m[i].name);
		free(m->m[i].h);
	}
	free(m->m);
	free(m->parts);
	free(m);
}

static int add(struct proto_metrics *m, enum metric_kind kind, const char *name,
	       const char *labels, const char *help)
{
	struct metric *x;
	size_t nl, ll, hl;

	if (m == NULL || name == NULL || help == NULL)
		return -EINVAL;
	if (m->n >= m->max)
		return -ENOSPC;
	labels = labels ? labels : "";
	nl = strlen(name);
	ll = strlen(labels);
	hl = strlen(help);
	if (nl >= NAME_MAX_LEN || ll >= LABELS_MAX_LEN || hl >= HELP_MAX_LEN)
		return -ENAMETOOLONG;
	if (m->n == m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 32;
		struct metric *g = realloc(m->m, cap * sizeof(*g));
		if (g == NULL)
			return -ENOMEM;
		m->m = g;
		m->cap = cap;
	}
	x = &m->m[m->n];
	*x = (struct metric){.kind = kind};
	if ((x->name = malloc(nl + ll + hl + 3)) == NULL)
		return -ENOMEM;
	memcpy(x->name, name, nl + 1);
	x->labels = memcpy(x->name + nl + 1, labels, ll + 1);
	x->help = memcpy(x->name + nl + ll + 2, help, hl + 1);
	if (kind == KIND_HISTOGRAM && (x->h = calloc(1, sizeof(*x->h))) == NULL) {
		free(x->name);
		return -ENOMEM;
	}
	return (int)m->n++;
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
		memcpy(m->m[h].h->bounds, bounds, n * sizeof(*bounds));
		m->m[h].h->nbounds = n;
	}
	return h;
}

static struct metric *get(struct proto_metrics *m, int h)
{
	return m != NULL && h >= 0 && (size_t)h < m->n ? &m->m[h] : NULL;
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

void proto_metrics_set_ms(struct proto_metrics *m, int h, uint64_t ms)
{
	struct metric *x = get(m, h);
	if (x != NULL && x->kind == KIND_GAUGE) {
		x->value = ms;
		x->ms = true;
	}
}

void proto_metrics_observe(struct proto_metrics *m, int h, double v)
{
	struct metric *x = get(m, h);
	size_t b;

	if (x == NULL || x->kind != KIND_HISTOGRAM)
		return;
	for (b = 0; b < x->h->nbounds && v > x->h->bounds[b]; b++)
		;
	x->h->buckets[b]++;
	x->h->sum += v;
	x->h->count++;
}

uint64_t proto_metrics_value(const struct proto_metrics *m, int h)
{
	if (m == NULL || h < 0 || (size_t)h >= m->n)
		return 0;
	return m->m[h].kind == KIND_HISTOGRAM ? m->m[h].h->count : m->m[h].value;
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

/* ---- rendering ---------------------------------------------------------- */

/* The text being made: grows by doubling; oom once an append failed. */
struct text {
	char *p;
	size_t len, cap;
	bool oom;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (t->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = true;
			return;
		}
		if ((size_t)n < t->cap - t->len) {
			t->len += (size_t)n;
			return;
		}
		size_t need = t->len + (size_t)n + 1, cap = 2 * t->cap > need ? 2 * t->cap : need;
		char *p = realloc(t->p, cap);
		if (p == NULL) {
			t->oom = true;
			return;
		}
		t->p = p;
		t->cap = cap;
	}
}

static void put_series(struct text *t, const struct metric *x)
{
	const char *l = x->labels, *open = l[0] ? "{" : "", *close = l[0] ? "}" : "";
	const char *sep = l[0] ? "," : "";
	uint64_t cum = 0;

	if (x->kind != KIND_HISTOGRAM) {
		if (x->ms)
			put(t, "%s%s%s%s %" PRIu64 ".%03" PRIu64 "\n", x->name, open, l, close,
			    x->value / 1000, x->value % 1000);
		else
			put(t, "%s%s%s%s %" PRIu64 "\n", x->name, open, l, close, x->value);
		return;
	}
	for (size_t b = 0; b <= x->h->nbounds; b++) {
		cum += x->h->buckets[b];
		if (b < x->h->nbounds)
			put(t, "%s_bucket{%s%sle=\"%g\"} %" PRIu64 "\n", x->name, l, sep,
			    x->h->bounds[b], cum);
		else
			put(t, "%s_bucket{%s%sle=\"+Inf\"} %" PRIu64 "\n", x->name, l, sep, cum);
	}
	put(t, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %" PRIu64 "\n", x->name, open, l, close,
	    x->h->sum, x->name, open, l, close, x->h->count);
}

/* Series indexes by name, then by registration (a stable grouping). */
static int by_name(const void *a, const void *b, void *arg)
{
	const struct metric *m = arg;
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	int c = strcmp(m[i].name, m[j].name);

	return c != 0 ? c : (i > j) - (i < j);
}

/* A name's series: at order[start], n of them; first: the first registered. */
struct group {
	size_t first, start, n;
};

static int by_first(const void *a, const void *b)
{
	const struct group *x = a, *y = b;

	return (x->first > y->first) - (x->first < y->first);
}

char *proto_metrics_render(const struct proto_metrics *m, size_t *len)
{
	static const char *types[] = {"counter", "gauge", "histogram"};
	struct text t = {.p = malloc(4096), .cap = 4096};
	size_t n = m != NULL ? m->n : 0, ng = 0;
	size_t *order = calloc(n ? n : 1, sizeof(*order));
	struct group *g = calloc(n ? n : 1, sizeof(*g));

	*len = 0;
	if (t.p == NULL || order == NULL || g == NULL)
		goto oom;
	t.p[0] = 0;
	/* Each name once, where its first series was registered, with every
	 * series of it in registration order (a multi-rank node registers each
	 * rank's set in turn; the tracker each replica's). */
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	qsort_r(order, n, sizeof(*order), by_name, m != NULL ? m->m : NULL);
	for (size_t i = 0; i < n; i++) {
		if (i > 0 && strcmp(m->m[order[i]].name, m->m[order[i - 1]].name) == 0) {
			g[ng - 1].n++;
			continue;
		}
		g[ng++] = (struct group){.first = order[i], .start = i, .n = 1};
	}
	qsort(g, ng, sizeof(*g), by_first);
	for (size_t k = 0; k < ng; k++) {
		const struct metric *f = &m->m[g[k].first];
		put(&t, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name, types[f->kind]);
		for (size_t i = g[k].start; i < g[k].start + g[k].n; i++)
			put_series(&t, &m->m[order[i]]);
	}
	if (t.oom)
		goto oom;
	free(order);
	free(g);
	*len = t.len;
	return t.p;
oom:
	free(t.p);
	free(order);
	free(g);
	return NULL;
}
