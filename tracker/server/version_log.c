/* The durable version log: versions accepted, stored and loaded again,
 * the trainer key pinned, the chain's identity. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <event2/event.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/log.h"
#include "proto/params.h"
#include "tracker/server/internal.h"

/*
 * In the store (a state directory's files, or etcd's keys; store.h):
 *   versions/<20-digit v>.manifest  the signed manifest bytes, as published
 *   versions/<20-digit v>.json      {"published_ms":..} (tracker time)
 *   trainer.pub                     the pinned trainer key (without
 *                                   --trainer-pubkey), in the key file form
 *   cluster.id                      the chain's identity: 32 hex digits and
 *                                   a newline, random, made with a fresh state
 * Each is durable before the publisher hears 201; a version's manifest is
 * created, never overwritten (of two trackers on one etcd that both take
 * version v, one is refused). The chain is re-verified on every load.
 */
#define CACHE_VERSIONS 8 /* newest versions kept decoded in memory */

struct trk_versions {
	struct trk_store *st; /* the server's */
	bool have_pk, pinned; /* pinned: the key came from the pin file / first */
	uint8_t pk[PROTO_PK_BYTES];
	char cluster[2 * TRK_CLUSTER_ID_BYTES + 1]; /* cluster.id, hex */
	char instance[2 * TRK_EPOCH_BYTES + 1];     /* this process's, random */
	struct trk_version *v; /* oldest first */
	size_t n, cap;
	/* The newest delta version a node could not build from its parent
	 * (soft): an anchor is wanted until one newer than it is published. */
	uint64_t anchor_wanted_v;
	/* Rank builds reported, by how, and anchor requests (soft). */
	uint64_t built_delta, built_chain, built_full, anchor_requests;
};

static void version_key(uint64_t v, const char *ext, char *buf, size_t len)
{
	snprintf(buf, len, "versions/%020llu.%s", (unsigned long long)v, ext);
}

static void version_drop_cache(struct trk_version *v)
{
	free(v->raw);
	v->raw = NULL;
	v->rawlen = 0;
	if (v->m != NULL) {
		proto_manifest_fini(v->m);
		free(v->m);
		v->m = NULL;
	}
}

/* Keeps the decoded form of the newest CACHE_VERSIONS only. */
static void trim_cache(struct trk_versions *vs)
{
	for (size_t i = 0; i + CACHE_VERSIONS < vs->n; i++)
		version_drop_cache(&vs->v[i]);
}

static void fill_record(struct trk_version *r, const struct proto_manifest *m)
{
	r->version = m->version;
	r->parent = m->parent_version;
	r->kind = m->kind;
	memcpy(r->digest, m->digest, PROTO_HASH_BYTES);
	memcpy(r->model_digest, m->model_digest, PROTO_HASH_BYTES);
	memcpy(r->src_layout_digest, m->src_layout_digest, PROTO_HASH_BYTES);
	r->wire_bytes = proto_manifest_wire_bytes(m);
	r->created_ms = m->created_ms;
	r->nlayouts = m->nlayouts;
}

static int append(struct trk_versions *vs, const struct trk_version *r)
{
	if (vs->n == vs->cap) {
		size_t cap = vs->cap ? 2 * vs->cap : 16;
		struct trk_version *nv = realloc(vs->v, cap * sizeof(*nv));
		if (nv == NULL)
			return -ENOMEM;
		vs->v = nv;
		vs->cap = cap;
	}
	vs->v[vs->n++] = *r;
	trim_cache(vs);
	return 0;
}

int trk__versions_fits(struct trk_versions *vs, const struct proto_manifest *m,
		       struct proto_err *err)
{
	uint64_t latest = trk__versions_latest(vs);
	struct trk_version *p;
	char hex[2 * PROTO_HASH_BYTES + 1];

	if (vs->n > 0 && m->version <= latest) {
		proto_errf(err, EINVAL, "version %llu is not above the latest, %llu",
			   (unsigned long long)m->version,
			   (unsigned long long)latest);
		return 409;
	}
	if (m->parent_version == 0) {
		if (vs->n > 0) {
			proto_errf(err, EINVAL,
				   "version %llu has no parent; only the first version may",
				   (unsigned long long)m->version);
			return 409;
		}
		return 0;
	}
	p = trk__versions_find(vs, m->parent_version);
	if (p == NULL) {
		proto_errf(err, EINVAL, "parent version %llu is not an accepted version",
			   (unsigned long long)m->parent_version);
		return 409;
	}
	if (memcmp(p->digest, m->parent_digest, PROTO_HASH_BYTES) != 0) {
		trk__hex(p->digest, PROTO_HASH_BYTES, hex);
		proto_errf(err, EINVAL,
			   "parent digest does not match version %llu (digest %s)",
			   (unsigned long long)p->version, hex);
		return 409;
	}
	return 0;
}

static int write_pin(struct trk_versions *vs, const uint8_t *pk,
		     struct proto_err *err)
{
	char line[128], hex[2 * PROTO_PK_BYTES + 1];

	trk__hex(pk, PROTO_PK_BYTES, hex);
	snprintf(line, sizeof(line), "tessera-ed25519-public %s\n", hex);
	return trk__store_put(vs->st, "trainer.pub", line, strlen(line), err);
}

/* Loads one stored version: its manifest (verified with the key) and meta. */
static int load_one(struct trk_versions *vs, uint64_t v, struct proto_err *err)
{
	char path[600], key[64];
	uint8_t *buf = NULL, *meta = NULL;
	size_t len = 0, mlen = 0;
	struct trk_version r = {0};
	struct proto_manifest *m = calloc(1, sizeof(*m));
	int rc;

	if (m == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	version_key(v, "manifest", key, sizeof(key));
	snprintf(path, sizeof(path), "%s: %s", trk__store_name(vs->st), key);
	if ((rc = trk__store_get(vs->st, key, proto_param(PROTO_PARAM_MANIFEST_MAX), &buf, &len,
				 err)) != 0) {
		if (rc == -ENOENT)
			proto_errf(err, ENOENT, "%s: gone while loading", path);
		goto fail;
	}
	if (!vs->have_pk) {
		/* Stored versions but no pin (a crash between the first version
		 * and its pin): the first version's signer is the pin. */
		if (proto_manifest_peek_signer(buf, len, vs->pk) != 0) {
			rc = proto_errf(err, EINVAL, "%s: too short", path);
			goto fail;
		}
		if ((rc = write_pin(vs, vs->pk, err)) != 0)
			goto fail;
		vs->have_pk = vs->pinned = true;
	}
	if ((rc = proto_manifest_decode(buf, len, vs->pk, m, err)) != 0) {
		proto_err_prefix(err, "%s", path);
		goto fail;
	}
	if (m->version != v) {
		rc = proto_errf(err, EINVAL, "%s: holds version %llu", path,
				(unsigned long long)m->version);
		goto fail;
	}
	if (trk__versions_fits(vs, m, err) != 0) {
		proto_err_prefix(err, "%s: broken chain", path);
		rc = -EINVAL;
		goto fail;
	}
	fill_record(&r, m);
	r.published_ms = m->created_ms; /* without its record: the trainer's time */
	version_key(v, "json", key, sizeof(key));
	if (trk__store_get(vs->st, key, 4096, &meta, &mlen, NULL) == 0) {
		json_t *j = json_loadb((const char *)meta, mlen, 0, NULL);
		json_t *p = json_object_get(j, "published_ms");
		if (json_is_integer(p) && json_integer_value(p) > 0)
			r.published_ms = (uint64_t)json_integer_value(p);
		json_decref(j);
		free(meta);
	}
	r.raw = buf;
	r.rawlen = len;
	r.m = m;
	if ((rc = append(vs, &r)) != 0) {
		proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	return 0;
fail:
	free(buf);
	proto_manifest_fini(m);
	free(m);
	return rc;
}

/* The versions of a store listing: versions/<20 digits>.manifest. */
struct scan {
	uint64_t *list;
	size_t n, cap;
};

static int scan_one(const char *name, void *arg)
{
	struct scan *sc = arg;
	char num[21];
	uint64_t v;

	if (strlen(name) != 20 + strlen(".manifest") || strcmp(name + 20, ".manifest") != 0)
		return 0;
	memcpy(num, name, 20);
	num[20] = 0;
	if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0)
		return 0;
	if (sc->n == sc->cap) {
		size_t cap = sc->cap ? 2 * sc->cap : 64;
		uint64_t *nl = realloc(sc->list, cap * sizeof(*nl));
		if (nl == NULL)
			return -ENOMEM;
		sc->list = nl;
		sc->cap = cap;
	}
	sc->list[sc->n++] = v; /* in name order: increasing */
	return 0;
}

/* Loads the cluster id, or makes one when absent (fresh is true when the
 * store holds no versions either). A malformed one is refused. */
static int load_cluster_id(struct trk_versions *vs, bool fresh, struct proto_err *err)
{
	const size_t hex = 2 * TRK_CLUSTER_ID_BYTES;
	const char *where = trk__store_name(vs->st);
	uint8_t *buf = NULL, id[TRK_CLUSTER_ID_BYTES];
	size_t len = 0;
	int rc;

	for (int tries = 0; tries < 2; tries++) {
		rc = trk__store_get(vs->st, "cluster.id", 64, &buf, &len, err);
		if (rc == 0) {
			if (len < hex || len > hex + 1 ||
			    strspn((char *)buf, "0123456789abcdef") != hex ||
			    (len == hex + 1 && buf[hex] != '\n')) {
				rc = proto_errf(err, EINVAL,
						"%s: cluster.id: corrupt cluster id (want %zu hex digits and a "
						"newline); restore it, or start a new chain on an "
						"empty store", where, hex);
			} else {
				memcpy(vs->cluster, buf, hex);
				vs->cluster[hex] = 0;
			}
			free(buf);
			return rc;
		}
		if (rc != -ENOENT)
			return rc;
		/* Shared by trackers that each remember it: a store with
		 * versions and no id lost it; a new one would fork the chain. */
		if (!fresh && trk__store_etcd(vs->st) != NULL)
			return proto_errf(err, EINVAL, "%s holds versions but no cluster.id: restore "
					  "it (etcdctl put), or start a new chain on an empty store",
					  where);
		randombytes_buf(id, sizeof(id));
		sodium_bin2hex(vs->cluster, sizeof(vs->cluster), id, sizeof(id));
		vs->cluster[hex] = '\n';
		rc = trk__store_create(vs->st, "cluster.id", vs->cluster, hex + 1, err);
		vs->cluster[hex] = 0;
		if (rc == -EEXIST)
			continue; /* another tracker on the store made it first */
		if (rc != 0)
			return rc;
		if (fresh)
			LOG_NOTE("new state in %s: cluster id %s, no versions (a new chain: "
				 "publishers and nodes that saw another refuse this tracker "
				 "until restarted)", where, vs->cluster);
		else
			LOG_WARN("state in %s has versions but no cluster id: new cluster id %s",
				 where, vs->cluster);
		return 0;
	}
	return proto_errf(err, EIO, "%s: cluster.id: made and gone again", where);
}

int trk__versions_open(struct trk_store *st, const uint8_t *trainer_pk,
		       struct trk_versions **out, struct proto_err *err)
{
	struct trk_versions *vs = calloc(1, sizeof(*vs));
	struct scan sc = {0};
	uint8_t *pin = NULL;
	size_t pinlen = 0;
	char name[700];
	int rc;

	*out = NULL;
	if (vs == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	vs->st = st;
	if (trainer_pk != NULL) {
		memcpy(vs->pk, trainer_pk, PROTO_PK_BYTES);
		vs->have_pk = true;
	} else if ((rc = trk__store_get(st, "trainer.pub", 4096, &pin, &pinlen, err)) == 0) {
		snprintf(name, sizeof(name), "%s: trainer.pub", trk__store_name(st));
		rc = proto_key_parse_public(pin, pinlen, name, vs->pk, err);
		free(pin);
		if (rc != 0)
			goto fail;
		vs->have_pk = vs->pinned = true;
	} else if (rc != -ENOENT) {
		goto fail;
	}
	if ((rc = trk__store_list(st, "versions", scan_one, &sc, err)) != 0) {
		if (rc == -ENOMEM)
			proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < sc.n; i++)
		if ((rc = load_one(vs, sc.list[i], err)) != 0)
			goto fail;
	if ((rc = load_cluster_id(vs, sc.n == 0, err)) != 0)
		goto fail;
	{
		uint8_t inst[TRK_EPOCH_BYTES];
		randombytes_buf(inst, sizeof(inst));
		sodium_bin2hex(vs->instance, sizeof(vs->instance), inst, sizeof(inst));
	}
	free(sc.list);
	if (!vs->have_pk)
		LOG_WARN("no --trainer-pubkey: the signer of the first version will be pinned");
	*out = vs;
	return 0;
fail:
	free(sc.list);
	trk__versions_free(vs);
	return rc;
}

void trk__versions_free(struct trk_versions *vs)
{
	if (vs == NULL)
		return;
	for (size_t i = 0; i < vs->n; i++)
		version_drop_cache(&vs->v[i]);
	free(vs->v);
	free(vs);
}

bool trk__versions_pinned(const struct trk_versions *vs)
{
	return vs->pinned;
}

const uint8_t *trk__versions_pk(const struct trk_versions *vs)
{
	return vs->have_pk ? vs->pk : NULL;
}

size_t trk__versions_count(const struct trk_versions *vs)
{
	return vs->n;
}

struct trk_version *trk__versions_at(struct trk_versions *vs, size_t i)
{
	return i < vs->n ? &vs->v[i] : NULL;
}

struct trk_version *trk__versions_find(struct trk_versions *vs, uint64_t v)
{
	size_t lo = 0, hi = vs->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (vs->v[mid].version == v)
			return &vs->v[mid];
		if (vs->v[mid].version < v)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

void trk__versions_want_anchor(struct trk_versions *vs, uint64_t v)
{
	vs->anchor_wanted_v = PROTO_MAX(vs->anchor_wanted_v, v);
	vs->anchor_requests++;
}

void trk__versions_note_built(struct trk_versions *vs, const char *how)
{
	if (strcmp(how, "delta") == 0)
		vs->built_delta++;
	else if (strcmp(how, "chain") == 0)
		vs->built_chain++;
	else
		vs->built_full++;
}

void trk__versions_stats(const struct trk_versions *vs, struct trk_versions_stats *out)
{
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < vs->n; i++) {
		bool delta = vs->v[i].kind == PROTO_KIND_DELTA;
		*(delta ? &out->deltas : &out->anchors) += 1;
		*(delta ? &out->delta_wire_bytes : &out->anchor_wire_bytes) += vs->v[i].wire_bytes;
	}
	out->built_delta = vs->built_delta;
	out->built_chain = vs->built_chain;
	out->built_full = vs->built_full;
	out->anchor_requests = vs->anchor_requests;
}

bool trk__versions_anchor_wanted(const struct trk_versions *vs)
{
	if (vs->anchor_wanted_v == 0)
		return false;
	for (size_t i = vs->n; i > 0; i--)
		if (vs->v[i - 1].kind == PROTO_KIND_ANCHOR)
			return vs->v[i - 1].version <= vs->anchor_wanted_v;
	return true;
}

uint64_t trk__versions_latest(const struct trk_versions *vs)
{
	return vs->n > 0 ? vs->v[vs->n - 1].version : 0;
}

const char *trk__versions_cluster(const struct trk_versions *vs)
{
	return vs->cluster;
}

void trk__versions_chain(const struct trk_versions *vs, char *buf, size_t len)
{
	char hex[2 * PROTO_HASH_BYTES + 1] = "-";

	if (vs->n > 0)
		sodium_bin2hex(hex, sizeof(hex), vs->v[vs->n - 1].digest,
			       PROTO_HASH_BYTES);
	snprintf(buf, len, "%s %s %llu %s", vs->cluster, vs->instance,
		 (unsigned long long)trk__versions_latest(vs), hex);
}

int trk__versions_read_raw(struct trk_versions *vs, const struct trk_version *r, uint8_t **buf,
			   size_t *len, struct proto_err *err)
{
	char key[64];
	uint8_t d[PROTO_HASH_BYTES];
	int rc;

	version_key(r->version, "manifest", key, sizeof(key));
	rc = trk__store_get(vs->st, key, proto_param(PROTO_PARAM_MANIFEST_MAX), buf, len, err);
	if (rc == -ENOENT)
		return proto_errf(err, ENOENT, "%s: %s: gone", trk__store_name(vs->st), key);
	if (rc != 0)
		return rc;
	crypto_generichash(d, sizeof(d), *buf, *len, NULL, 0);
	if (memcmp(d, r->digest, sizeof(d)) != 0) {
		free(*buf);
		*buf = NULL;
		return proto_errf(err, EIO, "%s: %s: digest changed in the store",
				  trk__store_name(vs->st), key);
	}
	return 0;
}

int trk__versions_manifest(struct trk_versions *vs, uint64_t v,
			   const struct proto_manifest **m,
			   struct proto_manifest **owned, struct proto_err *err)
{
	struct trk_version *r = trk__versions_find(vs, v);
	struct proto_manifest *mm;
	uint8_t *buf;
	size_t len;
	int rc;

	*m = NULL;
	*owned = NULL;
	if (r == NULL)
		return proto_errf(err, ENOENT, "version %llu is unknown",
				  (unsigned long long)v);
	if (r->m != NULL) {
		*m = r->m;
		return 0;
	}
	if ((rc = trk__versions_read_raw(vs, r, &buf, &len, err)) != 0)
		return rc;
	mm = calloc(1, sizeof(*mm));
	if (mm == NULL) {
		free(buf);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	rc = proto_manifest_decode(buf, len, vs->pk, mm, err);
	free(buf);
	if (rc != 0) {
		free(mm);
		return rc;
	}
	*m = *owned = mm;
	return 0;
}

/* Writes the manifest (created: -EEXIST when the version is taken) and
 * its meta record; on failure neither is left. */
static int store(struct trk_versions *vs, const struct proto_manifest *m,
		 const uint8_t *buf, size_t len, uint64_t published_ms,
		 struct proto_err *err)
{
	char mkey[64], jkey[64], meta[64];
	int rc;

	version_key(m->version, "manifest", mkey, sizeof(mkey));
	version_key(m->version, "json", jkey, sizeof(jkey));
	snprintf(meta, sizeof(meta), "{\"published_ms\":%llu}\n",
		 (unsigned long long)published_ms);
	if ((rc = trk__store_create(vs->st, mkey, buf, len, err)) != 0) {
		if (rc == -EEXIST)
			proto_errf(err, EEXIST, "version %llu was stored meanwhile by another "
				   "tracker of %s", (unsigned long long)m->version,
				   trk__store_name(vs->st));
		return rc;
	}
	if ((rc = trk__store_put(vs->st, jkey, meta, strlen(meta), err)) != 0 ||
	    (!vs->have_pk && (rc = write_pin(vs, m->signer, err)) != 0)) {
		trk__store_remove(vs->st, jkey, NULL);
		trk__store_remove(vs->st, mkey, NULL);
		return rc;
	}
	return 0;
}

int trk__versions_append(struct trk_versions *vs, struct proto_manifest *m, const uint8_t *raw,
			 size_t len, struct proto_err *err)
{
	struct trk_version r = {0};
	char hex[2 * PROTO_PK_BYTES + 1];
	uint8_t *copy;

	fill_record(&r, m);
	r.published_ms = proto_wall_ms();
	copy = malloc(len ? len : 1);
	if (copy == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	memcpy(copy, raw, len);
	/* Durable before the answer. */
	int rc = store(vs, m, raw, len, r.published_ms, err);
	if (rc != 0) {
		LOG_ERR("storing version %llu: %s", (unsigned long long)m->version, err->msg);
		proto_err_prefix(err, "cannot store the version");
		free(copy);
		return rc == -EEXIST || rc == -EPERM ? rc : -EIO;
	}
	r.raw = copy;
	r.rawlen = len;
	r.m = m;
	if (append(vs, &r) != 0) {
		/* Stored but not in memory: the next start will load it. */
		free(copy);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	if (!vs->have_pk) {
		memcpy(vs->pk, m->signer, sizeof(vs->pk));
		vs->have_pk = vs->pinned = true;
		trk__hex(vs->pk, PROTO_PK_BYTES, hex);
		LOG_INFO("pinned trainer key %s", hex);
	}
	LOG_INFO("version %llu accepted (%s, parent %llu, %llu wire bytes)",
		 (unsigned long long)r.version, r.kind == PROTO_KIND_DELTA ? "delta" : "anchor",
		 (unsigned long long)r.parent, (unsigned long long)r.wire_bytes);
	return 0;
}
