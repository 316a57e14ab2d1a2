/* Parsers of the tracker's answers (hostile JSON): sources, versions, the
 * members lists a shared batch names once. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/tracker.h"

int trk_sources_expand(json_t *batch, const uint32_t *dst, size_t n)
{
	json_t *answers = json_object_get(batch, "answers"), *lists = json_object_get(batch, "replicas");
	char id[TRK_ID_MAX];

	for (size_t i = 0; i < n && i < json_array_size(answers); i++) {
		json_t *one = json_array_get(answers, i), *names, *v, *m;
		const char *of = json_string_value(json_object_get(one, "members_of"));
		size_t k;
		if (of == NULL)
			continue;
		if (!json_is_array(names = json_object_get(lists, of)))
			return -EPROTO;
		if ((m = json_array()) == NULL)
			return -ENOMEM;
		json_array_foreach(names, k, v) {
			int w = json_is_string(v) ? snprintf(id, sizeof(id), "%s/%u",
							     json_string_value(v), dst[i])
						  : -1;
			if (w < 0 || (size_t)w >= sizeof(id) ||
			    json_array_append_new(m, json_string(id)) != 0) {
				json_decref(m);
				return w < 0 || (size_t)w >= sizeof(id) ? -EPROTO : -ENOMEM;
			}
		}
		if (json_object_set_new(one, "members", m) != 0)
			return -ENOMEM;
		json_object_del(one, "members_of");
	}
	return 0;
}

static int jstr(json_t *o, const char *key, char *out, size_t cap,
		struct proto_err *err)
{
	const char *s = json_string_value(json_object_get(o, key));

	if (s == NULL || strlen(s) >= cap)
		return proto_errf(err, EINVAL, "%s: missing or too long", key);
	memcpy(out, s, strlen(s) + 1);
	return 0;
}

static int ju64(json_t *o, const char *key, uint64_t *out, struct proto_err *err)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return proto_errf(err, EINVAL, "%s: not a non-negative integer", key);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int ju64s(json_t *o, const char *key, uint64_t *out, struct proto_err *err)
{
	const char *s = json_string_value(json_object_get(o, key));

	if (s == NULL || proto_parse_u64(s, 0, UINT64_MAX, out) != 0)
		return proto_errf(err, EINVAL, "%s: not a decimal string", key);
	return 0;
}

int trk_versions_now(json_t *answer, uint64_t *now_ms, struct proto_err *err)
{
	*now_ms = 0;
	if (json_object_get(answer, "now_ms") == NULL)
		return 0;
	return ju64(answer, "now_ms", now_ms, err);
}

void trk_sources_free(struct trk_source *s, size_t n)
{
	for (size_t i = 0; s != NULL && i < n; i++)
		free(s[i].fabric_addr);
	free(s);
}

int trk_sources_parse(json_t *answer, struct trk_source **out, size_t *n,
		      struct proto_err *err)
{
	json_t *arr = json_object_get(answer, "sources"), *e;
	struct trk_source *s;
	size_t i, cnt;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!json_is_array(arr))
		return proto_errf(err, EINVAL, "sources: missing");
	cnt = json_array_size(arr);
	s = calloc(cnt ? cnt : 1, sizeof(*s));
	if (s == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	json_array_foreach(arr, i, e) {
		struct trk_source *x = &s[i];
		const char *kind = json_string_value(json_object_get(e, "kind"));
		const char *hex = json_string_value(json_object_get(e, "fabric_addr"));
		size_t hl = hex ? strlen(hex) : 0;
		if (kind == NULL || (strcmp(kind, "peer") != 0 &&
				     strcmp(kind, "publisher") != 0)) {
			rc = proto_errf(err, EINVAL, "sources[%zu].kind: bad", i);
			goto fail;
		}
		x->peer = strcmp(kind, "peer") == 0;
		if ((rc = jstr(e, "id", x->id, sizeof(x->id), err)) != 0 ||
		    (rc = jstr(e, "host", x->host, sizeof(x->host), err)) != 0 ||
		    (rc = jstr(e, "provider", x->provider, sizeof(x->provider), err)) != 0 ||
		    (rc = ju64s(e, "addr", &x->addr, err)) != 0 ||
		    (rc = ju64s(e, "key", &x->key, err)) != 0 ||
		    (rc = ju64(e, "len", &x->len, err)) != 0)
			goto fail;
		json_t *hv = json_object_get(e, "have");
		if (hv != NULL && (!json_is_object(hv) || ju64s(hv, "addr", &x->have_addr, err) != 0 ||
				   ju64s(hv, "key", &x->have_key, err) != 0)) {
			rc = proto_errf(err, EINVAL, "sources[%zu].have: bad", i);
			goto fail;
		}
		x->partial = hv != NULL;
		json_t *sv = json_object_get(e, "site");
		if (sv != NULL && !json_is_null(sv) &&
		    (!json_is_string(sv) || !trk_site_valid(json_string_value(sv)))) {
			rc = proto_errf(err, EINVAL, "sources[%zu].site: want 1..%d of [A-Za-z0-9._-]",
					i, TRK_SITE_MAX);
			goto fail;
		}
		if (json_is_string(sv))
			memcpy(x->site, json_string_value(sv), strlen(json_string_value(sv)) + 1);
		if (hl == 0 || hl % 2 != 0 ||
		    (x->fabric_addr = malloc(hl / 2)) == NULL ||
		    sodium_hex2bin(x->fabric_addr, hl / 2, hex, hl, NULL,
				   &x->fabric_addr_len, NULL) != 0 ||
		    x->fabric_addr_len != hl / 2) {
			rc = proto_errf(err, EINVAL, "sources[%zu].fabric_addr: bad hex", i);
			goto fail;
		}
	}
	*out = s;
	*n = cnt;
	return 0;
fail:
	trk_sources_free(s, cnt);
	return rc;
}

/* retain_layouts: absent (an older tracker) or too many to list means keep
 * every layout; anything but an array of layout digests is an error. */
static int parse_retain_layouts(json_t *e, size_t i, struct trk_version_info *v,
				struct proto_err *err)
{
	json_t *a = json_object_get(e, "retain_layouts"), *d;
	size_t k;

	v->all_layouts = a == NULL || json_array_size(a) > TRK_RETAIN_LAYOUTS_MAX;
	if (a == NULL)
		return 0;
	if (!json_is_array(a))
		return proto_errf(err, EINVAL, "versions[%zu].retain_layouts: not an array", i);
	json_array_foreach(a, k, d) {
		uint8_t tmp[PROTO_HASH_BYTES];
		if (proto_parse_hex(json_string_value(d), tmp, PROTO_HASH_BYTES) != 0)
			return proto_errf(err, EINVAL, "versions[%zu].retain_layouts[%zu]: bad digest",
					  i, k);
		if (!v->all_layouts)
			memcpy(v->layouts[v->nlayouts++], tmp, PROTO_HASH_BYTES);
	}
	return 0;
}

/* uncovered_layouts (the latest version's only; digests) and addenda
 * (objects with layout_digest): absent means none; past
 * TRK_RETAIN_LAYOUTS_MAX the first ones are kept. */
static int parse_layout_list(json_t *e, size_t i, const char *key, const char *field,
			     uint8_t (*out)[PROTO_HASH_BYTES], uint32_t *n,
			     struct proto_err *err)
{
	json_t *a = json_object_get(e, key), *d;
	size_t k;

	if (a == NULL)
		return 0;
	if (!json_is_array(a))
		return proto_errf(err, EINVAL, "versions[%zu].%s: not an array", i, key);
	json_array_foreach(a, k, d) {
		if (*n == TRK_RETAIN_LAYOUTS_MAX)
			break;
		if (field != NULL && json_is_true(json_object_get(d, "copy")))
			continue; /* a raw copy of a listed layout adds none */
		if (field != NULL)
			d = json_object_get(d, field);
		if (proto_parse_hex(json_string_value(d), out[*n], PROTO_HASH_BYTES) != 0)
			return proto_errf(err, EINVAL, "versions[%zu].%s[%zu]: bad digest", i, key,
					  k);
		(*n)++;
	}
	return 0;
}

int trk_versions_parse(json_t *answer, uint64_t *latest,
		       struct trk_version_info **out, size_t *n,
		       struct proto_err *err)
{
	json_t *arr = json_object_get(answer, "versions"), *e;
	struct trk_version_info *v;
	size_t i, cnt;
	int rc;

	*out = NULL;
	*n = 0;
	if ((rc = ju64(answer, "latest", latest, err)) != 0)
		return rc;
	if (!json_is_array(arr))
		return proto_errf(err, EINVAL, "versions: missing");
	cnt = json_array_size(arr);
	v = calloc(cnt ? cnt : 1, sizeof(*v));
	if (v == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	json_array_foreach(arr, i, e) {
		const char *kind = json_string_value(json_object_get(e, "kind"));
		const char *d = json_string_value(json_object_get(e, "digest"));
		if ((rc = ju64(e, "version", &v[i].version, err)) != 0 ||
		    (rc = ju64(e, "parent", &v[i].parent, err)) != 0 ||
		    (rc = ju64(e, "wire_bytes", &v[i].wire_bytes, err)) != 0 ||
		    (rc = ju64(e, "created_ms", &v[i].created_ms, err)) != 0 ||
		    (rc = ju64(e, "published_ms", &v[i].published_ms, err)) != 0)
			goto fail;
		if (kind == NULL || (strcmp(kind, "anchor") != 0 && strcmp(kind, "delta") != 0)) {
			rc = proto_errf(err, EINVAL, "versions[%zu].kind: bad", i);
			goto fail;
		}
		v[i].kind = strcmp(kind, "delta") == 0 ? PROTO_KIND_DELTA : PROTO_KIND_ANCHOR;
		if (proto_parse_hex(d, v[i].digest, PROTO_HASH_BYTES) != 0) {
			rc = proto_errf(err, EINVAL, "versions[%zu].digest: bad", i);
			goto fail;
		}
		v[i].retain = json_is_true(json_object_get(e, "retain"));
		v[i].chain = json_is_true(json_object_get(e, "chain"));
		v[i].dropped = json_is_true(json_object_get(e, "dropped"));
		if ((rc = parse_retain_layouts(e, i, &v[i], err)) != 0 ||
		    (rc = parse_layout_list(e, i, "uncovered_layouts", NULL, v[i].uncovered,
					       &v[i].nuncovered, err)) != 0 ||
		    (rc = parse_layout_list(e, i, "addenda", "layout_digest", v[i].added,
					       &v[i].nadded, err)) != 0 ||
		    (rc = parse_layout_list(e, i, "copy_wanted", NULL, v[i].copy_wanted,
					       &v[i].ncopy_wanted, err)) != 0)
			goto fail;
	}
	*out = v;
	*n = cnt;
	return 0;
fail:
	free(v);
	return rc;
}
