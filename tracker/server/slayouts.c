/* Serving layouts: one shared entry per digest, and a cache of the layout
 * forms nodes sent, so that registering with a layout already seen costs a
 * comparison of JSON values instead of a parse and a coverage check. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

static struct trk_slayout *find_digest(struct trk_registry *r, const uint8_t *digest)
{
	for (struct trk_slayout *sl = r->layouts; sl; sl = sl->next)
		if (memcmp(sl->digest, digest, PROTO_HASH_BYTES) == 0)
			return sl;
	return NULL;
}

void trk__slayout_put(struct trk_registry *r, struct trk_slayout *sl)
{
	if (sl == NULL || --sl->refs > 0)
		return;
	for (struct trk_slayout **pp = &r->layouts; *pp; pp = &(*pp)->next)
		if (*pp == sl) {
			*pp = sl->next;
			break;
		}
	proto_layout_fini(&sl->l);
	json_decref(sl->json);
	free(sl);
}

void trk__slayout_cache_clear(struct trk_registry *r)
{
	for (size_t i = 0; i < r->nforms; i++) {
		json_decref(r->forms[i].form);
		trk__slayout_put(r, r->forms[i].sl);
	}
	r->nforms = 0;
}

/* The cached form equal to jl, or NULL. Forms are kept most recent first. */
static struct trk_slayout *cache_find(struct trk_registry *r, json_t *jl)
{
	for (size_t i = 0; i < r->nforms; i++) {
		if (!json_equal(r->forms[i].form, jl))
			continue;
		struct trk_lform hit = r->forms[i];
		memmove(&r->forms[1], &r->forms[0], i * sizeof(r->forms[0]));
		r->forms[0] = hit;
		return hit.sl;
	}
	return NULL;
}

/* Remembers jl as a form of sl (a reference to each), evicting the least
 * recently used form when full. */
static void cache_add(struct trk_registry *r, json_t *jl, struct trk_slayout *sl)
{
	if (r->nforms == TRK__LAYOUT_FORMS) {
		struct trk_lform *old = &r->forms[--r->nforms];
		json_decref(old->form);
		trk__slayout_put(r, old->sl);
	}
	memmove(&r->forms[1], &r->forms[0], r->nforms * sizeof(r->forms[0]));
	r->forms[0] = (struct trk_lform){json_incref(jl), sl};
	sl->refs++;
	r->nforms++;
}

struct trk_slayout *trk__slayout_by_digest(struct trk_registry *r, const uint8_t *digest)
{
	struct trk_slayout *sl = find_digest(r, digest);

	if (sl != NULL) {
		r->forms_hits++;
		sl->refs++;
	}
	return sl;
}

int trk__slayout_get(struct trk_registry *r, json_t *jl, struct trk_slayout **out,
		     struct proto_err *err)
{
	struct proto_layout l;
	struct trk_slayout *sl;
	int rc;

	*out = NULL;
	sl = cache_find(r, jl);
	if (sl != NULL) {
		r->forms_hits++;
		sl->refs++;
		*out = sl;
		return 0;
	}
	r->forms_misses++;
	if ((rc = proto_layout_from_json(&r->model, jl, "layout", &l, err)) != 0)
		return rc;
	if ((rc = proto_layout_check_complete(&r->model, &l, err)) != 0) {
		proto_err_prefix(err, "layout does not cover the model");
		proto_layout_fini(&l);
		return rc;
	}
	sl = find_digest(r, l.digest);
	if (sl != NULL) {
		proto_layout_fini(&l);
	} else {
		sl = calloc(1, sizeof(*sl));
		if (sl == NULL || (sl->json = proto_layout_to_json(&r->model, &l)) == NULL) {
			free(sl);
			proto_layout_fini(&l);
			return proto_errf(err, ENOMEM, "out of memory");
		}
		memcpy(sl->digest, l.digest, PROTO_HASH_BYTES);
		sl->l = l;
		sl->next = r->layouts;
		r->layouts = sl;
	}
	sl->refs++;
	cache_add(r, jl, sl);
	*out = sl;
	return 0;
}
