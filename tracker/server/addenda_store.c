/* The stored addenda (layouts added to published versions): checked, kept
 * durably beside their version, loaded again at start, and looked up. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/addendum.h"
#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

/*
 * A replica that registers a layout the latest version's manifest does not
 * list is not made to wait for the next version: the publisher signs an
 * addendum for that layout (proto/addendum.h) and POSTs it here. The tracker
 * checks it against the trainer key and the version's manifest, stores it
 * durably next to the version, accepts offers of its parcels, and hands it
 * to nodes. In the store (store.h):
 *   addenda/<20-digit version>-<layout digest hex>.addendum  the signed bytes
 * durable before the publisher hears 201, every one verified again
 * (signature and binding) when the tracker loads them; a damaged one stops
 * it with the key's name, as a damaged manifest does.
 */
#define ADDENDA_DIR "addenda"
#define ADDENDA_PER_VERSION 16 /* layouts added to one version at most */
#define COPY_WANTS 8           /* raw copies asked for and not posted yet, remembered */

struct trk_addendum {
	uint64_t published_ms;
	uint8_t *raw;
	size_t rawlen;
	struct proto_addendum a;
};

/* A raw copy a node asked for (GET /addenda?...&copy=1): shown with the
 * latest version until it is posted. */
struct copy_want {
	uint64_t version;
	uint8_t layout[PROTO_HASH_BYTES];
};

struct trk_addenda {
	struct trk_addendum *e;
	size_t n, cap;
	struct copy_want wants[COPY_WANTS];
	size_t next_want; /* the slot the next new want takes (oldest first) */
};

static void entry_key(uint64_t v, const uint8_t *layout, char *buf, size_t len)
{
	char hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(buf, len, ADDENDA_DIR "/%020llu-%s.addendum", (unsigned long long)v, hex);
}

static struct trk_addendum *find(struct trk_addenda *ad, uint64_t v, const uint8_t *layout)
{
	for (size_t i = 0; ad != NULL && i < ad->n; i++)
		if (ad->e[i].a.version == v &&
		    memcmp(ad->e[i].a.layout.layout_digest, layout, PROTO_HASH_BYTES) == 0)
			return &ad->e[i];
	return NULL;
}

static size_t count_for(const struct trk_addenda *ad, uint64_t v)
{
	size_t k = 0;

	for (size_t i = 0; i < ad->n; i++)
		k += ad->e[i].a.version == v;
	return k;
}

/* Takes raw and a on success. */
static int append(struct trk_addenda *ad, uint8_t *raw, size_t len, struct proto_addendum *a,
		  uint64_t published_ms)
{
	if (ad->n == ad->cap) {
		size_t cap = ad->cap ? 2 * ad->cap : 8;
		struct trk_addendum *ne = realloc(ad->e, cap * sizeof(*ne));
		if (ne == NULL)
			return -ENOMEM;
		ad->e = ne;
		ad->cap = cap;
	}
	ad->e[ad->n].published_ms = published_ms;
	ad->e[ad->n].raw = raw;
	ad->e[ad->n].rawlen = len;
	ad->e[ad->n].a = *a;
	ad->n++;
	return 0;
}

/*
 * Decodes buf with the trainer key and checks it extends version v's
 * manifest. Returns 0 or the HTTP code to refuse it with (400 malformed or
 * badly signed, 404 unknown version, 409 bound to another manifest or a
 * layout the manifest lists, 500), err saying why; *out is empty then.
 */
static int verify(struct trk_server *s, const uint8_t *buf, size_t len,
		  struct proto_addendum *out, struct proto_err *err)
{
	const uint8_t *pk = trk__versions_pk(s->vs);
	const struct proto_manifest *m;
	struct proto_manifest *owned = NULL;
	int code = 0;

	proto_addendum_init(out);
	if (pk == NULL) {
		proto_errf(err, ENOENT, "no version is published yet");
		return 409;
	}
	if (proto_addendum_decode(buf, len, pk, out, err) != 0)
		return 400;
	if (trk__versions_manifest(s->vs, out->version, &m, &owned, err) != 0) {
		code = trk__versions_find(s->vs, out->version) == NULL ? 404 : 500;
	} else if (proto_addendum_binds(out, m, err) != 0) {
		code = 409;
	}
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
	if (code != 0)
		proto_addendum_fini(out);
	return code;
}

/* ---- lifetime ---------------------------------------------------------- */

struct load {
	struct trk_server *s;
	struct trk_addenda *ad;
	struct proto_err *err;
};

static int load_one(const char *name, void *arg)
{
	struct load *l = arg;
	char key[600], where[800];
	uint8_t *buf = NULL;
	size_t len = 0, n = strlen(name);
	struct proto_addendum a;
	int rc;

	if (n <= 9 || strcmp(name + n - 9, ".addendum") != 0)
		return 0;
	snprintf(key, sizeof(key), ADDENDA_DIR "/%s", name);
	snprintf(where, sizeof(where), "%s: %s", trk__store_name(l->s->st), key);
	if ((rc = trk__store_get(l->s->st, key, proto_param(PROTO_PARAM_MANIFEST_MAX), &buf, &len,
				 l->err)) != 0) {
		if (rc == -ENOENT)
			proto_errf(l->err, ENOENT, "%s: gone while loading", where);
		return rc;
	}
	if (verify(l->s, buf, len, &a, l->err) != 0) {
		free(buf);
		proto_err_prefix(l->err, "%s", where);
		return -EINVAL;
	}
	if (find(l->ad, a.version, a.layout.layout_digest) != NULL) {
		proto_addendum_fini(&a);
		free(buf);
		return proto_errf(l->err, EINVAL, "%s: a second addendum for its version and layout",
				  where);
	}
	/* When it came is not kept: its version's publication, a lower bound. */
	const struct trk_version *v = trk__versions_find(l->s->vs, a.version);
	if (append(l->ad, buf, len, &a, v != NULL ? v->published_ms : 0) != 0) {
		proto_addendum_fini(&a);
		free(buf);
		return proto_errf(l->err, ENOMEM, "out of memory");
	}
	return 0;
}

int trk__addenda_open(struct trk_server *s, struct trk_addenda **out, struct proto_err *err)
{
	struct trk_addenda *ad = calloc(1, sizeof(*ad));
	struct load l = {s, ad, err};
	int rc;

	*out = NULL;
	if (ad == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if ((rc = trk__store_list(s->st, ADDENDA_DIR, load_one, &l, err)) != 0) {
		trk__addenda_free(ad);
		return rc;
	}
	*out = ad;
	return 0;
}

void trk__addenda_free(struct trk_addenda *ad)
{
	if (ad == NULL)
		return;
	for (size_t i = 0; i < ad->n; i++) {
		free(ad->e[i].raw);
		proto_addendum_fini(&ad->e[i].a);
	}
	free(ad->e);
	free(ad);
}

/* ---- what the rest of the tracker asks ---------------------------------- */

const struct proto_mlayout *trk__version_layout(struct trk_server *s, uint64_t v,
						const struct proto_manifest *m,
						const uint8_t *layout)
{
	const struct proto_mlayout *ml = proto_manifest_layout(m, layout);
	const struct trk_addendum *e;

	if (ml != NULL)
		return ml;
	e = find(s->ad, v, layout);
	return e != NULL ? &e->a.layout : NULL;
}

json_t *trk__addenda_json(struct trk_server *s, uint64_t v)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr != NULL && s->ad != NULL && i < s->ad->n; i++) {
		const struct trk_addendum *e = &s->ad->e[i];
		json_t *j;
		if (e->a.version != v)
			continue;
		j = proto_addendum_to_json(&e->a);
		if (j == NULL || trk__set(j, "published_ms", trk__jint(e->published_ms)) ||
		    json_array_append_new(arr, j) != 0) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

bool trk__addenda_want_copy(struct trk_server *s, uint64_t v, const uint8_t *layout)
{
	struct trk_addenda *ad = s->ad;
	const struct proto_manifest *m;
	struct proto_manifest *owned = NULL;
	struct proto_err err = {{0}};
	bool ok;

	for (size_t i = 0; i < COPY_WANTS; i++)
		if (ad->wants[i].version == v && memcmp(ad->wants[i].layout, layout, PROTO_HASH_BYTES) == 0)
			return false;
	if (trk__versions_manifest(s->vs, v, &m, &owned, &err) != 0)
		return false;
	ok = m->kind == PROTO_KIND_DELTA && proto_manifest_layout(m, layout) != NULL;
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
	if (!ok)
		return false;
	ad->wants[ad->next_want].version = v;
	memcpy(ad->wants[ad->next_want].layout, layout, PROTO_HASH_BYTES);
	ad->next_want = (ad->next_want + 1) % COPY_WANTS;
	return true;
}

json_t *trk__version_copy_wanted(struct trk_server *s, uint64_t v)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr != NULL && s->ad != NULL && i < COPY_WANTS; i++)
		if (s->ad->wants[i].version == v && v != 0 && find(s->ad, v, s->ad->wants[i].layout) == NULL &&
		    json_array_append_new(arr, trk__json_hex(s->ad->wants[i].layout, PROTO_HASH_BYTES)) != 0)
			break;
	return arr;
}

json_t *trk__version_uncovered(struct trk_server *s, uint64_t v)
{
	const struct proto_manifest *m;
	struct proto_manifest *owned = NULL;
	struct proto_err err = {{0}};
	json_t *arr = json_array();

	if (arr == NULL || trk__versions_manifest(s->vs, v, &m, &owned, &err) != 0)
		return arr;
	for (struct trk_replica *rep = s->reg->reps; rep != NULL; rep = rep->next) {
		bool seen = false;
		if (rep->layout == NULL || !trk__replica_alive(rep) ||
		    trk__version_layout(s, v, m, rep->layout->digest) != NULL)
			continue;
		for (struct trk_replica *q = s->reg->reps; q != rep; q = q->next)
			seen |= q->layout == rep->layout && trk__replica_alive(q);
		if (!seen && json_array_append_new(arr, trk__json_hex(rep->layout->digest,
								      PROTO_HASH_BYTES)) != 0)
			break;
	}
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
	return arr;
}

/* ---- posted addenda, and the waits they answer --------------------------- */

int trk__addenda_add(struct trk_server *s, const uint8_t *buf, size_t len,
		    const struct proto_addendum **out, struct proto_err *err)
{
	struct trk_addenda *ad = s->ad;
	struct proto_addendum a;
	const struct trk_addendum *old;
	char key[600], hex[2 * PROTO_HASH_BYTES + 1];
	uint8_t *copy;
	uint64_t now = proto_wall_ms();
	int code, rc;

	*out = NULL;
	if ((code = verify(s, buf, len, &a, err)) != 0)
		return code;
	sodium_bin2hex(hex, sizeof(hex), a.layout.layout_digest, PROTO_HASH_BYTES);
	old = find(ad, a.version, a.layout.layout_digest);
	if (old != NULL) {
		code = memcmp(old->a.digest, a.digest, PROTO_HASH_BYTES) == 0 ? 200 : 409;
		if (code == 200)
			*out = &old->a;
		else
			proto_errf(err, EEXIST, "version %llu already has another addendum for layout %.16s",
				   (unsigned long long)a.version, hex);
		proto_addendum_fini(&a);
		return code;
	}
	if (count_for(ad, a.version) >= ADDENDA_PER_VERSION) {
		proto_errf(err, ENOSPC, "version %llu already has %d addenda", (unsigned long long)a.version,
			   ADDENDA_PER_VERSION);
		proto_addendum_fini(&a);
		return 409;
	}
	copy = malloc(PROTO_MAX(len, 1));
	if (copy == NULL) {
		free(copy);
		proto_addendum_fini(&a);
		proto_errf(err, ENOMEM, "out of memory");
		return 500;
	}
	memcpy(copy, buf, len);
	entry_key(a.version, a.layout.layout_digest, key, sizeof(key));
	/* Durable before the answer. */
	rc = trk__store_put(s->st, key, buf, len, err);
	if (rc != 0 || append(ad, copy, len, &a, now) != 0) {
		if (rc == 0) {
			trk__store_remove(s->st, key, NULL);
			proto_errf(err, ENOMEM, "out of memory");
		}
		LOG_ERR("storing an addendum of version %llu: %s", (unsigned long long)a.version,
			err->msg);
		proto_err_prefix(err, "cannot store the addendum");
		free(copy);
		proto_addendum_fini(&a);
		return 500;
	}
	LOG_INFO("version %llu extended for layout %.16s: %u parcels (addendum)",
		 (unsigned long long)a.version, hex, ad->e[ad->n - 1].a.layout.nparcels);
	*out = &ad->e[ad->n - 1].a;
	return 201;
}

bool trk__addenda_get(struct trk_server *s, uint64_t v, const uint8_t *layout, const uint8_t **raw,
		      size_t *len)
{
	const struct trk_addendum *e = find(s->ad, v, layout);

	if (e == NULL)
		return false;
	*raw = e->raw;
	*len = e->rawlen;
	return true;
}

bool trk__addenda_copy_gone(struct trk_server *s, uint64_t v)
{
	return v != trk__versions_latest(s->vs);
}

void trk__addendum_reply_req(struct trk_server *s, struct evhttp_request *req, uint64_t v,
			     const uint8_t *layout, bool copy)
{
	const struct trk_addendum *e = find(s->ad, v, layout);
	char msg[128];

	if (e != NULL) {
		trk__reply_req_raw(s, req, 200, "application/octet-stream", e->raw, e->rawlen);
	} else if (copy && trk__addenda_copy_gone(s, v)) {
		snprintf(msg, sizeof(msg), TRK__COPY_GONE_FMT, (unsigned long long)v);
		trk__reply_req_json(s, req, 410, json_pack("{s:s}", "error", msg));
	} else
		trk__reply_req_json(s, req, 404, json_pack("{s:s}", "error",
							  "no addendum for that layout yet"));
}
