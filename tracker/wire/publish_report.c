/* A publisher's report of what a version's export cost (its "publish"
 * member of POST /offers): made, written as JSON and checked when read. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tracker/tracker.h"

bool trk_publish_report_add(struct trk_publish_report *r, const char *name, uint64_t ms)
{
	if (r->nphases >= TRK_PHASES_MAX)
		return false;
	snprintf(r->phases[r->nphases].name, sizeof(r->phases[0].name), "%s", name);
	r->phases[r->nphases++].ms = ms;
	return true;
}

json_t *trk_publish_report_json(const struct trk_publish_report *r)
{
	json_t *ph = json_array();
	json_t *o = json_object();
	bool bad = ph == NULL || o == NULL;

	for (uint32_t i = 0; !bad && i < r->nphases; i++)
		bad |= json_array_append_new(ph, json_pack("[s,I]", r->phases[i].name,
							   (json_int_t)r->phases[i].ms)) != 0;
	bad = bad || json_object_set_new(o, "total_ms", json_integer((json_int_t)r->total_ms)) != 0 ||
	      json_object_set(o, "phases_ms", ph) != 0;
	if (!bad && r->delta_tried)
		bad = json_object_set_new(
			      o, "delta",
			      json_pack("{s:b,s:b,s:I,s:f,s:b,s:s}", "tried", 1, "kept",
					(int)r->delta_kept, "encode_ms",
					(json_int_t)r->delta_encode_ms, "percent",
					round(r->delta_percent * 10.0) / 10.0, "stopped_early",
					(int)r->delta_stopped_early, "why", r->delta_why)) != 0;
	json_decref(ph);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static int get_ms(json_t *v, const char *what, uint64_t *out, struct proto_err *err)
{
	if (!json_is_integer(v))
		return proto_errf(err, EINVAL, "publish.%s: must be an integer (ms)", what);
	if (json_integer_value(v) < 0 || json_integer_value(v) > TRK_PUBLISH_MS_MAX)
		return proto_errf(err, EINVAL, "publish.%s: must be in 0..%d ms", what,
				  TRK_PUBLISH_MS_MAX);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_bool(json_t *o, const char *key, bool *out, struct proto_err *err)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_boolean(v))
		return proto_errf(err, EINVAL, "publish.delta.%s: must be true or false", key);
	*out = json_is_true(v);
	return 0;
}

/* A phase: ["name", ms], the name 1..TRK_PHASE_NAME_MAX bytes of
 * [a-z0-9 +-] (what the status page prints as it is). */
static int parse_phase(json_t *e, size_t i, struct trk_phase *out, struct proto_err *err)
{
	json_t *nm = json_array_get(e, 0);
	char what[32];
	const char *s;
	size_t n;

	if (!json_is_array(e) || json_array_size(e) != 2)
		return proto_errf(err, EINVAL, "publish.phases_ms[%zu]: must be [name, ms]", i);
	if (!json_is_string(nm))
		return proto_errf(err, EINVAL, "publish.phases_ms[%zu]: the name must be a string",
				  i);
	s = json_string_value(nm);
	n = json_string_length(nm);
	if (n == 0 || n > TRK_PHASE_NAME_MAX)
		return proto_errf(err, EINVAL, "publish.phases_ms[%zu]: the name must be 1..%d bytes",
				  i, TRK_PHASE_NAME_MAX);
	for (size_t k = 0; k < n; k++)
		if (!((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9') || s[k] == ' ' ||
		      s[k] == '+' || s[k] == '-'))
			return proto_errf(err, EINVAL,
					  "publish.phases_ms[%zu]: the name may hold only a-z, 0-9, "
					  "space, + and -", i);
	memcpy(out->name, s, n);
	out->name[n] = '\0';
	snprintf(what, sizeof(what), "phases_ms[%zu]", i);
	return get_ms(json_array_get(e, 1), what, &out->ms, err);
}

static int parse_delta(json_t *d, struct trk_publish_report *r, struct proto_err *err)
{
	json_t *pct = json_object_get(d, "percent"), *why = json_object_get(d, "why");
	int rc;

	if (!json_is_object(d))
		return proto_errf(err, EINVAL, "publish.delta: must be an object");
	if ((rc = get_bool(d, "tried", &r->delta_tried, err)) != 0 ||
	    (rc = get_bool(d, "kept", &r->delta_kept, err)) != 0 ||
	    (rc = get_bool(d, "stopped_early", &r->delta_stopped_early, err)) != 0 ||
	    (rc = get_ms(json_object_get(d, "encode_ms"), "delta.encode_ms", &r->delta_encode_ms,
			 err)) != 0)
		return rc;
	if (!r->delta_tried)
		return proto_errf(err, EINVAL,
				  "publish.delta.tried: must be true (no delta tried: leave delta out)");
	if (r->delta_kept && r->delta_stopped_early)
		return proto_errf(err, EINVAL,
				  "publish.delta: a delta stopped early cannot have been kept");
	if (r->delta_encode_ms > r->total_ms)
		return proto_errf(err, EINVAL, "publish.delta.encode_ms: more than total_ms");
	if (!json_is_number(pct) || !isfinite(json_number_value(pct)) ||
	    json_number_value(pct) < 0 || json_number_value(pct) > TRK_PUBLISH_PERCENT_MAX)
		return proto_errf(err, EINVAL, "publish.delta.percent: must be a number in 0..%d",
				  TRK_PUBLISH_PERCENT_MAX);
	r->delta_percent = json_number_value(pct);
	if (!json_is_string(why) || json_string_length(why) == 0 ||
	    json_string_length(why) > TRK_PUBLISH_WHY_MAX)
		return proto_errf(err, EINVAL, "publish.delta.why: must be a string of 1..%d bytes",
				  TRK_PUBLISH_WHY_MAX);
	for (size_t k = 0; k < json_string_length(why); k++) {
		unsigned char ch = (unsigned char)json_string_value(why)[k];
		if (ch < 0x20 || ch == 0x7f)
			return proto_errf(err, EINVAL,
					  "publish.delta.why: control characters are not allowed");
	}
	memcpy(r->delta_why, json_string_value(why), json_string_length(why) + 1);
	return 0;
}

int trk_publish_report_parse(json_t *j, struct trk_publish_report *out, struct proto_err *err)
{
	struct trk_publish_report r;
	json_t *ph = json_object_get(j, "phases_ms"), *d = json_object_get(j, "delta");
	uint64_t sum = 0;
	size_t i;
	json_t *e;
	int rc;

	memset(&r, 0, sizeof(r));
	if (!json_is_object(j))
		return proto_errf(err, EINVAL, "publish: must be an object");
	if ((rc = get_ms(json_object_get(j, "total_ms"), "total_ms", &r.total_ms, err)) != 0)
		return rc;
	if (!json_is_array(ph) || json_array_size(ph) > TRK_PHASES_MAX)
		return proto_errf(err, EINVAL, "publish.phases_ms: must be an array of at most %d "
				  "[name, ms] pairs", TRK_PHASES_MAX);
	json_array_foreach(ph, i, e) {
		if ((rc = parse_phase(e, i, &r.phases[i], err)) != 0)
			return rc;
		sum += r.phases[i].ms;
	}
	r.nphases = (uint32_t)json_array_size(ph);
	if (sum > r.total_ms)
		return proto_errf(err, EINVAL, "publish.phases_ms: the phases add up to %llu ms, more "
				  "than total_ms (%llu)", (unsigned long long)sum,
				  (unsigned long long)r.total_ms);
	if (d != NULL && (rc = parse_delta(d, &r, err)) != 0)
		return rc;
	*out = r;
	return 0;
}
