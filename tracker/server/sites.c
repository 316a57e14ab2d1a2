/* Sites: where replicas and publishers said they are (--site), summed per
 * site for the status answer, the page and /metrics. */
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

/* The entry of site name in arr (NULL: none yet; name "" is the unnamed
 * site, shown as null). */
static json_t *site_entry(json_t *arr, const char *name)
{
	json_t *e;
	size_t i;

	json_array_foreach(arr, i, e) {
		const char *s = json_string_value(json_object_get(e, "site"));
		if (strcmp(s != NULL ? s : "", name) == 0)
			return e;
	}
	e = json_pack("{s:o,s:I,s:I,s:I,s:I}", "site", name[0] ? json_string(name) : json_null(),
		      "replicas", (json_int_t)0, "replicas_alive", (json_int_t)0, "replicas_current",
		      (json_int_t)0, "publishers_alive", (json_int_t)0);
	if (e == NULL || json_array_append_new(arr, e) != 0)
		return NULL;
	return e;
}

static int bump(json_t *e, const char *key)
{
	return json_object_set_new(e, key, json_integer(json_integer_value(json_object_get(e, key)) + 1));
}

static int cmp_site(const void *a, const void *b)
{
	const char *x = json_string_value(json_object_get(*(json_t *const *)a, "site"));
	const char *y = json_string_value(json_object_get(*(json_t *const *)b, "site"));

	return strcmp(x != NULL ? x : "", y != NULL ? y : "");
}

json_t *trk__sites_json(struct trk_server *s)
{
	struct trk_registry *r = s->reg;
	uint64_t latest = trk__versions_latest(s->vs);
	json_t *arr = json_array(), *e, **v = NULL;
	int bad = arr == NULL;

	for (const struct trk_replica *rep = r->reps; !bad && rep; rep = rep->next) {
		bad |= (e = site_entry(arr, trk__replica_site(rep))) == NULL;
		bad = bad || bump(e, "replicas") != 0;
		if (!bad && trk__replica_alive(rep))
			bad |= bump(e, "replicas_alive") != 0 ||
			       (latest != 0 && rep->active == latest && bump(e, "replicas_current") != 0);
	}
	for (const struct trk_publisher *p = r->pubs; !bad && p; p = p->next) {
		if (!p->alive)
			continue;
		bad |= (e = site_entry(arr, p->site)) == NULL;
		bad = bad || bump(e, "publishers_alive") != 0;
	}
	/* By name, the unnamed site first. */
	size_t n = bad ? 0 : json_array_size(arr);
	if (n > 1 && (v = malloc(n * sizeof(*v))) == NULL)
		bad = 1;
	for (size_t i = 0; v != NULL && i < n; i++)
		v[i] = json_incref(json_array_get(arr, i));
	if (v != NULL) {
		qsort(v, n, sizeof(*v), cmp_site);
		json_array_clear(arr);
		for (size_t i = 0; i < n; i++)
			bad |= json_array_append_new(arr, v[i]) != 0;
		free(v);
	}
	if (bad) {
		json_decref(arr);
		return NULL;
	}
	return arr;
}
