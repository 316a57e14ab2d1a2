/* `tessera cluster --every`: versions on the trainer's own clock; samples
 * each replica's lag behind the latest version, then checks the bytes of
 * every rank once the ranks settle. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "node/cli/cluster.h"
#include "proto/proto.h"

#define CLOCK_SAMPLE_MS 100
#define CLOCK_SETTLE_MS 15000 /* after the last version, for ranks to agree */

struct lag_samples {
	uint64_t *versions, *ms;
	size_t n, cap;
};

static int lag_push(struct lag_samples *s, uint64_t v, uint64_t ms)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 1024;
		uint64_t *a = realloc(s->versions, cap * sizeof(*a));
		if (a == NULL)
			return -ENOMEM;
		s->versions = a;
		uint64_t *b = realloc(s->ms, cap * sizeof(*b));
		if (b == NULL)
			return -ENOMEM;
		s->ms = b;
		s->cap = cap;
	}
	s->versions[s->n] = v;
	s->ms[s->n++] = ms;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The p-quantile (nearest rank) of n samples; sorts them. 0 when n == 0. */
static uint64_t quantile(uint64_t *a, size_t n, double p)
{
	if (n == 0)
		return 0;
	qsort(a, n, sizeof(*a), cmp_u64);
	size_t k = (size_t)(p * (double)n + 0.999999);
	return a[k == 0 ? 0 : PROTO_MIN(k, n) - 1];
}

/* A process's peak resident memory (VmHWM), bytes; 0 when unknown. */
static uint64_t peak_rss(pid_t pid)
{
	char path[64], line[256];
	unsigned long long kb = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	if ((f = fopen(path, "r")) == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* With the publisher stopped no version arrives: waits until every rank of
 * every replica exposes the replica's active version, then checks the
 * bytes of each rank. */
static bool settle_and_check(struct cluster *c)
{
	bool all = true;

	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		uint64_t v = 0;
		r->digest_ok = false;
		for (int w = 0; w < CLOCK_SETTLE_MS && !node__cluster_stop_signal; w += CLOCK_SAMPLE_MS) {
			json_t *st = NULL, *rep;
			bool agree = node__cluster_status(c, &st) == 0 && (rep = node__cluster_find_replica(st, r->name)) != NULL;
			if (agree) {
				v = (uint64_t)json_integer_value(json_object_get(rep, "active"));
				json_t *rk;
				size_t k;
				json_array_foreach(json_object_get(rep, "ranks"), k, rk)
					agree &= (uint64_t)json_integer_value(json_object_get(rk, "active")) == v;
				/* Ranks that agree on v while their target is newer are
				 * about to move: wait for it (or the end of the settle
				 * time, if the target can no longer be fetched). */
				agree &= v >= (uint64_t)json_integer_value(json_object_get(rep, "target"));
			}
			json_decref(st);
			if (agree && v > 0)
				break;
			usleep(CLOCK_SAMPLE_MS * 1000);
		}
		if (v == 0) {
			fprintf(stderr, "cluster: replica %s activated nothing\n", r->name);
			all = false;
			continue;
		}
		r->digest_ok = true;
		for (uint32_t k = 0; k < r->layout.nranks; k++) {
			struct proto_err err;
			size_t len = r->layout.ranks[k].nbytes;
			uint8_t *block = malloc(PROTO_MAX(len, 1));
			if (block == NULL || node__cluster_expected_block(c, &r->layout, k, v, block, &err) != 0)
				r->digest_ok = false;
			else
				r->digest_ok &= node__cluster_check_rank(c, r, k, v, block, len);
			free(block);
		}
		all &= r->digest_ok;
	}
	return all;
}

/*
 * The publisher exports a version every --every ms on its own; ranks start
 * --stagger ms apart. Every CLOCK_SAMPLE_MS the tracker's status is sampled:
 * per replica, once all its ranks run and it activated a first version, its
 * lag behind the latest in versions and in ms. At the end: the versions each
 * replica activated, the lag quantiles and the publisher's peak memory.
 */
int node__cluster_run_clock(struct cluster *c, json_t **out)
{
	struct lag_samples lag[MAX_REPLICAS];
	uint64_t first_ms[MAX_REPLICAS] = {0}, t0 = proto_now_ns(), latest = 0, peak;
	uint64_t model_bytes = proto_model_bytes(&c->model);
	struct proto_err err;
	json_t *reps = json_array(), *st = NULL;
	bool ok = true;
	int rc = 0;

	memset(lag, 0, sizeof(lag));
	printf("tessera cluster: a version every %" PRIu64 " ms for %" PRIu64 " s, ranks %" PRIu64
	       " ms apart\n",
	       c->every_ms, c->duration_s, c->stagger_ms);
	fflush(stdout);
	for (;;) {
		uint64_t el = (proto_now_ns() - t0) / 1000000;
		/* A machine too slow to publish twice and activate a version on
		 * every replica within the duration gets up to CLOCK_SETTLE_MS
		 * more for it: a report without them measures nothing. */
		bool seen = latest >= 2;
		for (uint32_t i = 0; i < c->nreps; i++)
			seen &= first_ms[i] > 0;
		if (el >= c->duration_s * 1000 && (seen || el >= c->duration_s * 1000 + CLOCK_SETTLE_MS))
			break;
		for (uint32_t i = 0; i < c->nreps; i++) {
			struct cluster_replica *r = &c->reps[i];
			while (r->started < r->layout.nranks && el >= r->started * c->stagger_ms)
				if ((rc = node__cluster_start_rank(c, r, &err)) != 0) {
					fprintf(stderr, "cluster: %s\n", err.msg);
					goto out;
				}
		}
		if (!node__cluster_children_alive(c)) {
			rc = -ECHILD;
			goto out;
		}
		if (node__cluster_status(c, &st) == 0) {
			latest = (uint64_t)json_integer_value(json_object_get(st, "latest"));
			for (uint32_t i = 0; i < c->nreps; i++) {
				struct cluster_replica *r = &c->reps[i];
				json_t *rep = node__cluster_find_replica(st, r->name);
				if (rep == NULL || r->started < r->layout.nranks)
					continue;
				if (json_integer_value(json_object_get(rep, "active")) == 0)
					continue;
				if (first_ms[i] == 0)
					first_ms[i] = PROTO_MAX(el, 1);
				if (lag_push(&lag[i],
					     (uint64_t)json_integer_value(json_object_get(rep, "lag_versions")),
					     (uint64_t)json_integer_value(json_object_get(rep, "lag_ms"))) != 0) {
					rc = -ENOMEM;
					goto out;
				}
			}
			json_decref(st);
			st = NULL;
		}
		usleep(CLOCK_SAMPLE_MS * 1000);
	}
	peak = peak_rss(c->publisher.pid);
	/* Count each replica's activations before anything stops. */
	uint64_t nact[MAX_REPLICAS] = {0};
	if (node__cluster_status(c, &st) == 0) {
		json_t *a;
		size_t k;
		latest = (uint64_t)json_integer_value(json_object_get(st, "latest"));
		json_array_foreach(json_object_get(st, "activations"), k, a)
			for (uint32_t i = 0; i < c->nreps; i++)
				nact[i] += strcmp(json_string_value(json_object_get(a, "replica")),
						  c->reps[i].name) == 0;
		json_decref(st);
		st = NULL;
	}
	/* No more versions: the ranks settle on their replica's version. */
	node__cluster_stop_publisher(c);
	ok = settle_and_check(c);
	printf("tessera cluster: %" PRIu64 " versions published; publisher peak memory %.1f MiB = %.2f x the model\n",
	       latest, (double)peak / (1 << 20), (double)peak / (double)PROTO_MAX(model_bytes, 1));
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		uint64_t v50 = quantile(lag[i].versions, lag[i].n, 0.50);
		uint64_t v99 = quantile(lag[i].versions, lag[i].n, 0.99);
		uint64_t m50 = quantile(lag[i].ms, lag[i].n, 0.50);
		uint64_t m99 = quantile(lag[i].ms, lag[i].n, 0.99);
		ok &= nact[i] > 0;
		printf("  replica %s (%s): %" PRIu64 " versions activated, first after %.1f s; lag p50 %" PRIu64
		       " versions / %.2f s, p99 %" PRIu64 " versions / %.2f s; bytes %s\n",
		       r->name, r->layout_arg, nact[i], (double)first_ms[i] / 1000.0, v50,
		       (double)m50 / 1000.0, v99, (double)m99 / 1000.0, r->digest_ok ? "ok" : "WRONG");
		json_array_append_new(reps, json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b}",
						      "replica", r->name, "layout", r->layout_arg,
						      "ranks", (json_int_t)r->layout.nranks,
						      "activated", (json_int_t)nact[i],
						      "first_activation_ms", (json_int_t)first_ms[i],
						      "samples", (json_int_t)lag[i].n,
						      "lag_versions_p50", (json_int_t)v50,
						      "lag_versions_p99", (json_int_t)v99,
						      "lag_ms_p50", (json_int_t)m50,
						      "lag_ms_p99", (json_int_t)m99,
						      "digest_ok", r->digest_ok));
	}
	*out = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:O}", "every_ms", (json_int_t)c->every_ms,
			 "stagger_ms", (json_int_t)c->stagger_ms, "duration_s",
			 (json_int_t)c->duration_s, "model_bytes", (json_int_t)model_bytes,
			 "published", (json_int_t)latest, "publisher_peak_rss_bytes", (json_int_t)peak,
			 "publisher_peak_over_model", (double)peak / (double)PROTO_MAX(model_bytes, 1),
			 "replicas", reps);
	rc = ok ? 0 : -EBADMSG;
out:
	json_decref(st);
	json_decref(reps);
	for (uint32_t i = 0; i < MAX_REPLICAS; i++) {
		free(lag[i].versions);
		free(lag[i].ms);
	}
	return rc;
}
