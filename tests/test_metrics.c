/* Tests for the metrics registry (proto/metrics.c): the Prometheus text it
 * renders, series of one name grouped under one HELP and TYPE, gauges in
 * seconds from milliseconds, histograms, the cap on series, health. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/metrics.h"

static char *render(const struct proto_metrics *m)
{
	size_t len = 99;
	char *t = proto_metrics_render(m, &len);

	assert_non_null(t);
	assert_int_equal(strlen(t), len);
	return t;
}

/* Series of one name come together, at the place of the first registered,
 * in registration order, whatever came between. */
static void test_grouping(void **state)
{
	(void)state;
	struct proto_metrics *m = proto_metrics_new();
	int a0 = proto_metrics_gauge(m, "t_a", "r=\"0\"", "A by r.");
	int b = proto_metrics_counter(m, "t_b_total", NULL, "B.");
	int a1 = proto_metrics_gauge(m, "t_a", "r=\"1\"", "ignored: the first one's help is shown");
	int c = proto_metrics_gauge(m, "t_c_seconds", NULL, "C.");
	char *t;

	assert_true(a0 >= 0 && b >= 0 && a1 >= 0 && c >= 0);
	proto_metrics_set(m, a0, 7);
	proto_metrics_set(m, a1, 18446744073709551615ull);
	proto_metrics_add(m, b, 2);
	proto_metrics_add(m, b, 3);
	proto_metrics_set_ms(m, c, 1250);
	assert_int_equal(proto_metrics_value(m, b), 5);
	t = render(m);
	assert_string_equal(t, "# HELP t_a A by r.\n# TYPE t_a gauge\n"
			       "t_a{r=\"0\"} 7\nt_a{r=\"1\"} 18446744073709551615\n"
			       "# HELP t_b_total B.\n# TYPE t_b_total counter\nt_b_total 5\n"
			       "# HELP t_c_seconds C.\n# TYPE t_c_seconds gauge\nt_c_seconds 1.250\n");
	free(t);
	proto_metrics_set_ms(m, c, 7);
	t = render(m);
	assert_non_null(strstr(t, "\nt_c_seconds 0.007\n"));
	free(t);
	proto_metrics_free(m);
}

static void test_histogram(void **state)
{
	(void)state;
	static const double bounds[] = {0.5, 2};
	struct proto_metrics *m = proto_metrics_new();
	int h = proto_metrics_histogram(m, "t_h_seconds", "r=\"0\"", "H.", bounds, 2);
	char *t;

	assert_true(h >= 0);
	proto_metrics_observe(m, h, 0.25);
	proto_metrics_observe(m, h, 1);
	proto_metrics_observe(m, h, 9);
	assert_int_equal(proto_metrics_value(m, h), 3);
	t = render(m);
	assert_string_equal(t, "# HELP t_h_seconds H.\n# TYPE t_h_seconds histogram\n"
			       "t_h_seconds_bucket{r=\"0\",le=\"0.5\"} 1\n"
			       "t_h_seconds_bucket{r=\"0\",le=\"2\"} 2\n"
			       "t_h_seconds_bucket{r=\"0\",le=\"+Inf\"} 3\n"
			       "t_h_seconds_sum{r=\"0\"} 10.250000\n"
			       "t_h_seconds_count{r=\"0\"} 3\n");
	free(t);
	static const double bad[] = {2, 1};
	assert_int_equal(proto_metrics_histogram(m, "t_x", NULL, "X.", bad, 2), -EINVAL);
	proto_metrics_free(m);
}

/* Registrations past the cap, or with names too long, are refused; updates
 * through a refused handle or a NULL registry do nothing. */
static void test_limits(void **state)
{
	(void)state;
	struct proto_metrics *m = proto_metrics_new_max(2);
	char name[200];
	size_t len = 1;
	char *t;

	assert_int_equal(proto_metrics_gauge(m, "t_a", NULL, "A."), 0);
	assert_int_equal(proto_metrics_gauge(m, "t_b", NULL, "B."), 1);
	assert_int_equal(proto_metrics_gauge(m, "t_c", NULL, "C."), -ENOSPC);
	proto_metrics_set(m, -ENOSPC, 1);
	proto_metrics_free(m);
	m = proto_metrics_new();
	memset(name, 'n', 96);
	name[96] = 0;
	assert_int_equal(proto_metrics_gauge(m, name, NULL, "N."), -ENAMETOOLONG);
	name[95] = 0;
	assert_true(proto_metrics_gauge(m, name, NULL, "N.") >= 0);
	assert_int_equal(proto_metrics_gauge(NULL, "t_a", NULL, "A."), -EINVAL);
	proto_metrics_free(m);
	proto_metrics_set(NULL, 0, 1);
	t = proto_metrics_render(NULL, &len);
	assert_non_null(t);
	assert_int_equal(len, 0);
	assert_string_equal(t, "");
	free(t);
}

/* Many series of a few names render in the time of a sort (the tracker
 * shows five per replica, at thousands of replicas). */
static void test_many(void **state)
{
	(void)state;
	enum { N = 50000 };
	struct proto_metrics *m = proto_metrics_new_max(2 * N);
	char l[32], *t;

	for (int i = 0; i < N; i++) {
		snprintf(l, sizeof(l), "r=\"%d\"", i);
		proto_metrics_set(m, proto_metrics_gauge(m, "t_a", l, "A."), (uint64_t)i);
		proto_metrics_set(m, proto_metrics_gauge(m, "t_b", l, "B."), (uint64_t)i);
	}
	t = render(m);
	assert_ptr_equal(strstr(t, "# HELP t_a"), t);
	assert_non_null(strstr(t, "t_a{r=\"49999\"} 49999\n# HELP t_b B.\n# TYPE t_b gauge\n"
				  "t_b{r=\"0\"} 0\n"));
	free(t);
	proto_metrics_free(m);
}

static void test_health(void **state)
{
	(void)state;
	struct proto_metrics *m = proto_metrics_new();
	const char *why = NULL;
	int p;

	assert_false(proto_metrics_healthy(m, &why));
	assert_string_equal(why, "starting");
	proto_metrics_set_health(m, true, "ok");
	p = proto_metrics_health_part(m, "A/1");
	assert_true(p >= 0);
	assert_false(proto_metrics_healthy(m, &why));
	assert_string_equal(why, "A/1: starting");
	proto_metrics_set_part_health(m, p, true, "registered");
	assert_true(proto_metrics_healthy(m, &why));
	proto_metrics_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grouping),
		cmocka_unit_test(test_histogram),
		cmocka_unit_test(test_limits),
		cmocka_unit_test(test_many),
		cmocka_unit_test(test_health),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
