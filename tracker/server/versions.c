/* The durable version log: accepting, storing, listing and long-polling. */
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
 * On disk, under the state directory:
 *   versions/<20-digit v>.manifest  the signed manifest bytes, as published
 *   versions/<20-digit v>.json      {"published_ms":..} (tracker time)
 *   trainer.pub                     the pinned trainer key (without
 *                                   --trainer-pubkey), in the key file form
 *   cluster.id                      the chain's identity: 32 hex digits and
 *                                   a newline, random, made with a fresh state
 * Each file is written temp-fsync-rename and the directory fsynced before the
 * publisher hears 201. The chain is re-verified on every start.
 */
#define CACHE_VERSIONS 8 /* newest versions kept decoded in memory */
#define LIST_MAX 256     /* newest entries one GET /versions returns */

/* A held request (a long-poll): a watch of the versions after `after`;
 * with `layouts`, a publisher's, also ended when a replica comes alive
 * (layouts_rev moves); with `addendum`, a node's wait for the addendum of
 * version `after` for `layout`, ended when it is posted (and, with `copy`,
 * a raw copy's, when a newer version makes sure none will come). */
TAILQ_HEAD(waiter_list, waiter);
struct waiter {
	struct trk_versions *vs;
	struct evhttp_request *req;
	struct evhttp_connection *conn;
	struct event *timer;
	uint64_t after;
	bool layouts, addendum, copy;
	uint8_t layout[PROTO_HASH_BYTES];
	struct waiter_list *list; /* the one of vs's lists it is on */
	TAILQ_ENTRY(waiter) link;
};

struct trk_versions {
	struct trk_server *s; /* set when the first call arrives */
	char *dir;            /* state dir */
	char *vdir;           /* state dir/versions */
	bool have_pk, pinned; /* pinned: the key came from the pin file / first */
	uint8_t pk[PROTO_PK_BYTES];
	char cluster[2 * TRK_CLUSTER_ID_BYTES + 1]; /* cluster.id, hex */
	char instance[2 * TRK_EPOCH_BYTES + 1];     /* this process's, random */
	struct trk_version *v; /* oldest first */
	size_t n, cap;
	/* Nodes' watches; publishers' watches and addendum waits (few: a
	 * replica coming alive walks only these, not 10 000 node watches). */
	struct waiter_list waiters, special;
	/* Watches a version answers, answered WAKE_SLICE per turn of the loop
	 * at the low priority (wake_slice), and the answers built for them
	 * (by the version they wait after; dropped when a version lands). */
	struct waiter_list due;
	struct event *wake_ev;
	struct {
		uint64_t after;
		char *text;
		size_t len;
	} memo[4];
	size_t nmemo, memo_at;
	size_t nheld; /* on any list */
	/* Bumped whenever a replica comes alive (a new one, or one whose
	 * ranks were all gone): its layout may be one no version covers. */
	uint64_t layouts_rev;
	/* The newest delta version a node could not build from its parent
	 * (soft): an anchor is wanted until one newer than it is published. */
	uint64_t anchor_wanted_v;
	/* Rank builds reported, by how, and anchor requests (soft). */
	uint64_t built_delta, built_chain, built_full, anchor_requests;
};

static char *path_join(const char *a, const char *b)
{
	size_t n = strlen(a) + strlen(b) + 2;
	char *p = malloc(n);
	if (p != NULL)
		snprintf(p, n, "%s/%s", a, b);
	return p;
}

static int version_path(const struct trk_versions *vs, uint64_t v,
			const char *ext, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/%020llu.%s", vs->vdir,
			 (unsigned long long)v, ext);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = 0;
	if (fd < 0)
		return -errno;
	if (fsync(fd) != 0)
		rc = -errno;
	close(fd);
	return rc;
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

/* The chain rule for a version appended after the current log: increasing
 * numbers, parent 0 only for the very first, else an accepted version with
 * the same digest. Returns an HTTP code (0 when it fits). */
static int check_chain(struct trk_versions *vs, const struct proto_manifest *m,
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
	char *path = path_join(vs->dir, "trainer.pub");
	int rc;

	if (path == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	trk__hex(pk, PROTO_PK_BYTES, hex);
	snprintf(line, sizeof(line), "tessera-ed25519-public %s\n", hex);
	rc = proto_write_file_atomic(path, line, strlen(line), 0644, err);
	if (rc == 0)
		rc = fsync_dir(vs->dir);
	free(path);
	return rc;
}

/* Loads one stored version: its manifest (verified with the key) and meta. */
static int load_one(struct trk_versions *vs, uint64_t v, struct proto_err *err)
{
	char path[4096];
	uint8_t *buf = NULL, *meta = NULL;
	size_t len = 0, mlen = 0;
	struct trk_version r = {0};
	struct proto_manifest *m = calloc(1, sizeof(*m));
	struct stat st;
	int rc;

	if (m == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if ((rc = version_path(vs, v, "manifest", path, sizeof(path))) != 0 ||
	    (rc = proto_read_file(path, proto_param(PROTO_PARAM_MANIFEST_MAX), &buf,
				  &len, err)) != 0)
		goto fail;
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
	if (check_chain(vs, m, err) != 0) {
		proto_err_prefix(err, "%s: broken chain", path);
		rc = -EINVAL;
		goto fail;
	}
	fill_record(&r, m);
	r.published_ms = stat(path, &st) == 0 ? (uint64_t)st.st_mtime * 1000 : 0;
	if (version_path(vs, v, "json", path, sizeof(path)) == 0 &&
	    proto_read_file(path, 4096, &meta, &mlen, NULL) == 0) {
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

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Lists versions/<20 digits>.manifest in increasing order; stray temporary
 * files of an interrupted write are removed. */
static int scan(struct trk_versions *vs, uint64_t **out, size_t *n,
		struct proto_err *err)
{
	DIR *d = opendir(vs->vdir);
	struct dirent *e;
	uint64_t *list = NULL;
	size_t cnt = 0, cap = 0;

	*out = NULL;
	*n = 0;
	if (d == NULL)
		return proto_errf(err, errno, "%s: %s", vs->vdir, strerror(errno));
	while ((e = readdir(d)) != NULL) {
		char num[21];
		uint64_t v;
		if (strstr(e->d_name, ".tmp.") != NULL) {
			char p[4096];
			snprintf(p, sizeof(p), "%s/%s", vs->vdir, e->d_name);
			unlink(p);
			continue;
		}
		if (strlen(e->d_name) != 20 + strlen(".manifest") ||
		    strcmp(e->d_name + 20, ".manifest") != 0)
			continue;
		memcpy(num, e->d_name, 20);
		num[20] = 0;
		if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0)
			continue;
		if (cnt == cap) {
			cap = cap ? 2 * cap : 64;
			uint64_t *nl = realloc(list, cap * sizeof(*nl));
			if (nl == NULL) {
				free(list);
				closedir(d);
				return proto_errf(err, ENOMEM, "out of memory");
			}
			list = nl;
		}
		list[cnt++] = v;
	}
	closedir(d);
	if (cnt > 1)
		qsort(list, cnt, sizeof(*list), cmp_u64);
	*out = list;
	*n = cnt;
	return 0;
}

/* Loads state_dir/cluster.id, or makes one when absent (fresh is true when
 * the state holds no versions either). A malformed file is refused. */
static int load_cluster_id(struct trk_versions *vs, bool fresh,
			   struct proto_err *err)
{
	char *path = path_join(vs->dir, "cluster.id");
	const size_t hex = 2 * TRK_CLUSTER_ID_BYTES;
	uint8_t *buf = NULL, id[TRK_CLUSTER_ID_BYTES];
	size_t len = 0;
	struct stat st;
	int rc = 0;

	if (path == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	if (stat(path, &st) == 0) {
		if ((rc = proto_read_file(path, 64, &buf, &len, err)) != 0)
			goto out;
		if (len < hex || len > hex + 1 ||
		    strspn((char *)buf, "0123456789abcdef") != hex ||
		    (len == hex + 1 && buf[hex] != '\n')) {
			rc = proto_errf(err, EINVAL,
					"%s: corrupt cluster id (want %zu hex digits "
					"and a newline); restore it, or start a new "
					"chain on an empty state directory",
					path, hex);
			goto out;
		}
		memcpy(vs->cluster, buf, hex);
		vs->cluster[hex] = 0;
		goto out;
	}
	randombytes_buf(id, sizeof(id));
	sodium_bin2hex(vs->cluster, sizeof(vs->cluster), id, sizeof(id));
	vs->cluster[hex] = '\n';
	rc = proto_write_file_atomic(path, vs->cluster, hex + 1, 0644, err);
	vs->cluster[hex] = 0;
	if (rc != 0)
		goto out;
	if ((rc = fsync_dir(vs->dir)) != 0) {
		rc = proto_errf(err, -rc, "%s: %s", vs->dir, strerror(-rc));
		goto out;
	}
	if (fresh)
		LOG_WARN("new state in %s: cluster id %s, no versions (a new "
			 "chain: publishers and nodes that saw another refuse "
			 "this tracker until restarted)",
			 vs->dir, vs->cluster);
	else
		LOG_WARN("state in %s has versions but no cluster id: new "
			 "cluster id %s", vs->dir, vs->cluster);
out:
	free(buf);
	free(path);
	return rc;
}

int trk__versions_open(const char *state_dir, const uint8_t *trainer_pk,
		       struct trk_versions **out, struct proto_err *err)
{
	struct trk_versions *vs = calloc(1, sizeof(*vs));
	uint64_t *list = NULL;
	size_t nlist = 0;
	char *pin = NULL;
	struct stat st;
	int rc;

	*out = NULL;
	if (vs == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	TAILQ_INIT(&vs->waiters);
	TAILQ_INIT(&vs->special);
	TAILQ_INIT(&vs->due);
	vs->dir = strdup(state_dir);
	vs->vdir = path_join(state_dir, "versions");
	pin = path_join(state_dir, "trainer.pub");
	if (vs->dir == NULL || vs->vdir == NULL || pin == NULL) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto fail;
	}
	if ((rc = proto_mkdir_p(vs->vdir, err)) != 0)
		goto fail;
	if (trainer_pk != NULL) {
		memcpy(vs->pk, trainer_pk, PROTO_PK_BYTES);
		vs->have_pk = true;
	} else if (stat(pin, &st) == 0) {
		if ((rc = proto_key_load_public(pin, vs->pk, err)) != 0)
			goto fail;
		vs->have_pk = vs->pinned = true;
	}
	if ((rc = scan(vs, &list, &nlist, err)) != 0)
		goto fail;
	for (size_t i = 0; i < nlist; i++)
		if ((rc = load_one(vs, list[i], err)) != 0)
			goto fail;
	if ((rc = load_cluster_id(vs, nlist == 0, err)) != 0)
		goto fail;
	{
		uint8_t inst[TRK_EPOCH_BYTES];
		randombytes_buf(inst, sizeof(inst));
		sodium_bin2hex(vs->instance, sizeof(vs->instance), inst, sizeof(inst));
	}
	free(list);
	free(pin);
	if (!vs->have_pk)
		LOG_WARN("no --trainer-pubkey: the signer of the first version will be pinned");
	*out = vs;
	return 0;
fail:
	free(list);
	free(pin);
	trk__versions_free(vs);
	return rc;
}

static void waiter_free(struct waiter *w)
{
	TAILQ_REMOVE(w->list, w, link);
	w->vs->nheld--;
	if (w->conn != NULL)
		evhttp_connection_set_closecb(w->conn, NULL, NULL);
	event_free(w->timer);
	free(w);
}

void trk__versions_drop_waiters(struct trk_versions *vs)
{
	struct waiter *w;

	while ((w = TAILQ_FIRST(&vs->waiters)) != NULL)
		waiter_free(w);
	while ((w = TAILQ_FIRST(&vs->special)) != NULL)
		waiter_free(w);
	while ((w = TAILQ_FIRST(&vs->due)) != NULL)
		waiter_free(w);
}

static void memo_clear(struct trk_versions *vs)
{
	for (size_t i = 0; i < vs->nmemo; i++) {
		free(vs->memo[i].text);
		vs->memo[i].text = NULL;
	}
	vs->nmemo = vs->memo_at = 0;
}

void trk__versions_free(struct trk_versions *vs)
{
	if (vs == NULL)
		return;
	trk__versions_drop_waiters(vs);
	memo_clear(vs);
	if (vs->wake_ev != NULL)
		event_free(vs->wake_ev);
	for (size_t i = 0; i < vs->n; i++)
		version_drop_cache(&vs->v[i]);
	free(vs->v);
	free(vs->dir);
	free(vs->vdir);
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

void trk__versions_metrics(const struct trk_versions *vs, struct evbuffer *b)
{
	uint64_t n[3] = {0}, wire[3] = {0};

	for (size_t i = 0; i < vs->n; i++) {
		int k = vs->v[i].kind == PROTO_KIND_DELTA ? 2 : 1;
		n[k]++;
		wire[k] += vs->v[i].wire_bytes;
	}
	evbuffer_add_printf(b,
			    "# HELP tessera_tracker_versions_by_kind Versions in the log, by kind.\n"
			    "# TYPE tessera_tracker_versions_by_kind gauge\n"
			    "tessera_tracker_versions_by_kind{kind=\"anchor\"} %" PRIu64 "\n"
			    "tessera_tracker_versions_by_kind{kind=\"delta\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_version_wire_bytes Wire bytes of the versions in the log (once per layout), by kind.\n"
			    "# TYPE tessera_tracker_version_wire_bytes gauge\n"
			    "tessera_tracker_version_wire_bytes{kind=\"anchor\"} %" PRIu64 "\n"
			    "tessera_tracker_version_wire_bytes{kind=\"delta\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_rank_builds_total Versions ranks reported built, by how: from the parent by delta, by replaying the chain from an anchor, or full.\n"
			    "# TYPE tessera_tracker_rank_builds_total counter\n"
			    "tessera_tracker_rank_builds_total{how=\"delta\"} %" PRIu64 "\n"
			    "tessera_tracker_rank_builds_total{how=\"chain\"} %" PRIu64 "\n"
			    "tessera_tracker_rank_builds_total{how=\"full\"} %" PRIu64 "\n"
			    "# HELP tessera_tracker_anchor_requests_total Delta versions a node could not build and asked an anchor for.\n"
			    "# TYPE tessera_tracker_anchor_requests_total counter\n"
			    "tessera_tracker_anchor_requests_total %" PRIu64 "\n",
			    n[1], n[2], wire[1], wire[2], vs->built_delta, vs->built_chain, vs->built_full,
			    vs->anchor_requests);
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

/* Reads v's bytes from disk, checking them against the recorded digest. */
static int read_raw(struct trk_versions *vs, const struct trk_version *r,
		    uint8_t **buf, size_t *len, struct proto_err *err)
{
	char path[4096];
	uint8_t d[PROTO_HASH_BYTES];
	int rc;

	if ((rc = version_path(vs, r->version, "manifest", path, sizeof(path))) != 0)
		return proto_errf(err, -rc, "path too long");
	if ((rc = proto_read_file(path, proto_param(PROTO_PARAM_MANIFEST_MAX), buf,
				  len, err)) != 0)
		return rc;
	crypto_generichash(d, sizeof(d), *buf, *len, NULL, 0);
	if (memcmp(d, r->digest, sizeof(d)) != 0) {
		free(*buf);
		*buf = NULL;
		return proto_errf(err, EIO, "%s: digest changed on disk", path);
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
	if ((rc = read_raw(vs, r, &buf, &len, err)) != 0)
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

json_t *trk__version_json(struct trk_server *s, const struct trk_version *v)
{
	json_t *o = json_object();
	bool retain = trk__version_retained(s, v->version);
	int bad = o == NULL;

	if (bad)
		return NULL;
	bad |= trk__set(o, "version", trk__jint(v->version));
	bad |= trk__set(o, "parent", trk__jint(v->parent));
	bad |= trk__set(o, "kind", json_string(v->kind == PROTO_KIND_DELTA ?
							"delta" :
							"anchor"));
	bad |= trk__set(o, "digest", trk__json_hex(v->digest, PROTO_HASH_BYTES));
	bad |= trk__set(o, "wire_bytes", trk__jint(v->wire_bytes));
	bad |= trk__set(o, "created_ms", trk__jint(v->created_ms));
	bad |= trk__set(o, "published_ms", trk__jint(v->published_ms));
	bad |= trk__set(o, "retain", json_boolean(retain));
	/* A version of the latest chain is kept in every layout (a late
	 * joiner of any layout may replay it): no retain_layouts. */
	if (trk__version_in_chain(s, v->version) && v->version != trk__versions_latest(s->vs))
		bad |= trk__set(o, "chain", json_true());
	else
		bad |= trk__set(o, "retain_layouts", trk__version_retain_layouts(s, v->version));
	bad |= trk__set(o, "dropped", json_boolean(trk__version_dropped(s, v->version)));
	bad |= trk__set(o, "addenda", trk__addenda_json(s, v->version));
	if (v->version == trk__versions_latest(s->vs)) {
		bad |= trk__set(o, "uncovered_layouts", trk__version_uncovered(s, v->version));
		bad |= trk__set(o, "copy_wanted", trk__version_copy_wanted(s, v->version));
	}
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* {"latest":L,"versions":[...]} for versions > after (the newest LIST_MAX). */
static json_t *list_after(struct trk_server *s, uint64_t after)
{
	struct trk_versions *vs = s->vs;
	json_t *o = json_object(), *arr = json_array();
	size_t first = vs->n;

	if (o == NULL || arr == NULL)
		goto fail;
	while (first > 0 && vs->v[first - 1].version > after &&
	       vs->n - first < LIST_MAX)
		first--;
	for (size_t i = first; i < vs->n; i++)
		if (json_array_append_new(arr, trk__version_json(s, &vs->v[i])) != 0)
			goto fail;
	if (trk__set(o, "latest", trk__jint(trk__versions_latest(vs))) ||
	    trk__set(o, "now_ms", trk__jint(proto_wall_ms())) ||
	    trk__set(o, "layouts_rev", trk__jint(vs->layouts_rev)) ||
	    trk__set(o, "anchor_wanted", json_boolean(trk__versions_anchor_wanted(vs))) ||
	    json_object_set(o, "versions", arr) != 0)
		goto fail;
	json_decref(arr);
	return o;
fail:
	json_decref(arr);
	json_decref(o);
	return NULL;
}

static void waiter_answer(struct waiter *w)
{
	struct trk_server *s = w->vs->s;
	struct evhttp_request *req = w->req;
	uint64_t after = w->after;
	uint8_t layout[PROTO_HASH_BYTES];
	bool addendum = w->addendum, copy = w->copy;

	memcpy(layout, w->layout, sizeof(layout));
	waiter_free(w);
	trk__conns_handled(s->conns, req); /* a held request is built now */
	if (addendum)
		trk__addendum_reply_req(s, req, after, layout, copy);
	else
		trk__reply_req_json(s, req, 200, list_after(s, after));
}

static void waiter_timeout(evutil_socket_t fd, short what, void *arg)
{
	waiter_answer(arg);
}

/* The client went away while we held its request: libevent frees the
 * request right after this. */
static void waiter_closed(struct evhttp_connection *conn, void *arg)
{
	struct waiter *w = arg;
	w->conn = NULL;
	waiter_free(w);
}

#define WAKE_SLICE 64 /* watches answered per turn of the loop */

/* The answer for a watch after `after`, built once per version landed for
 * all the watches waiting after the same version (the last few are
 * remembered): a version wakes every node at once. NULL on ENOMEM. */
static const char *memo_text(struct trk_versions *vs, uint64_t after, size_t *len)
{
	json_t *a;
	char *t;

	for (size_t i = 0; i < vs->nmemo; i++)
		if (vs->memo[i].after == after) {
			*len = vs->memo[i].len;
			return vs->memo[i].text;
		}
	a = list_after(vs->s, after);
	t = trk__json_text(a, len);
	json_decref(a);
	if (t == NULL)
		return NULL;
	if (vs->nmemo < PROTO_ARRAY_LEN(vs->memo))
		vs->memo_at = vs->nmemo++;
	else
		vs->memo_at = (vs->memo_at + 1) % PROTO_ARRAY_LEN(vs->memo);
	free(vs->memo[vs->memo_at].text);
	vs->memo[vs->memo_at].after = after;
	vs->memo[vs->memo_at].text = t;
	vs->memo[vs->memo_at].len = *len;
	return t;
}

/* Answers up to WAKE_SLICE due watches, and comes back for the rest after
 * the loop served what else was waiting: at 1 000 nodes, answering every
 * watch in one callback held every heartbeat and sources query behind it
 * for several ms. */
static void wake_slice(evutil_socket_t fd, short what, void *arg)
{
	struct trk_versions *vs = arg;
	struct waiter *w;
	uint64_t t0 = proto_now_ns();
	size_t n = 0;

	while (n < WAKE_SLICE && (w = TAILQ_FIRST(&vs->due)) != NULL) {
		struct evhttp_request *req = w->req;
		size_t len = 0;
		const char *txt = memo_text(vs, w->after, &len);

		waiter_free(w);
		trk__reply_req_text(vs->s, req, 200, txt, len);
		n++;
	}
	if (!TAILQ_EMPTY(&vs->due))
		event_active(vs->wake_ev, EV_TIMEOUT, 1);
	else
		memo_clear(vs);
	trk__conns_trace(vs->s->conns, "wake", t0, n);
}

/* Moves every waiter a new version concerns onto the due list, answered
 * by wake_slice: node watches first, then publishers' (addendum waits
 * wait for their addendum). Answers built for an older version go. */
static void wake_waiters(struct trk_versions *vs)
{
	uint64_t latest = trk__versions_latest(vs);
	struct waiter_list *lists[] = {&vs->waiters, &vs->special};
	struct waiter *w, *next;

	memo_clear(vs);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(lists); i++)
		for (w = TAILQ_FIRST(lists[i]); w != NULL; w = next) {
			next = TAILQ_NEXT(w, link);
			/* Raw copies are made of the latest version only (the
			 * publisher keeps no other's raw parcels): a newer one
			 * ends the wait for an older one's, at once. */
			if (w->addendum && w->copy && latest > w->after) {
				waiter_answer(w);
				continue;
			}
			if (latest <= w->after || w->addendum)
				continue;
			TAILQ_REMOVE(w->list, w, link);
			w->list = &vs->due;
			TAILQ_INSERT_TAIL(w->list, w, link);
		}
	if (TAILQ_EMPTY(&vs->due))
		return;
	if (vs->wake_ev == NULL) {
		struct event_base *base = vs->s->base;
		int npri = event_base_get_npriorities(base);
		if ((vs->wake_ev = event_new(base, -1, 0, wake_slice, vs)) == NULL) {
			/* Out of memory: each due watch ends at its timer. */
			return;
		}
		/* Below heartbeats and sources queries when the base has
		 * priorities (trk_server_new gives it three). */
		event_priority_set(vs->wake_ev, npri - 1);
	}
	event_active(vs->wake_ev, EV_TIMEOUT, 1);
}

/* Holds c's request for wait_ms (ended in its last tenth) as a waiter;
 * NULL when out of memory (c then answered). */
static struct waiter *hold(struct trk_call *c, uint64_t after, uint64_t wait_ms)
{
	struct trk_versions *vs = c->s->vs;
	struct waiter *w = calloc(1, sizeof(*w));

	vs->s = c->s;
	if (w == NULL || (w->timer = evtimer_new(c->s->base, waiter_timeout, w)) == NULL) {
		free(w);
		trk__fail(c, 500, "out of memory");
		return NULL;
	}
	w->vs = vs;
	w->req = c->req;
	w->after = after;
	w->conn = evhttp_request_get_connection(c->req);
	w->list = &vs->waiters;
	TAILQ_INSERT_TAIL(w->list, w, link);
	vs->nheld++;
	if (w->conn != NULL)
		evhttp_connection_set_closecb(w->conn, waiter_closed, w);
	trk__conns_background(c->s->conns, c->req);
	/* Watches that a version answered together come back together; held
	 * for exactly wait_ms they would all time out together again, every
	 * time. Ending each somewhere in the last tenth spreads them out. */
	wait_ms -= randombytes_uniform((uint32_t)(wait_ms / 10 + 1));
	struct timeval tv = {(time_t)(wait_ms / 1000),
			     (suseconds_t)(wait_ms % 1000) * 1000};
	evtimer_add(w->timer, &tv);
	c->answered = true; /* later, by the waiter */
	return w;
}

size_t trk__versions_held(const struct trk_versions *vs)
{
	return vs->nheld;
}

/* w is a publisher's watch or an addendum wait: onto the short list. */
static void special(struct waiter *w)
{
	TAILQ_REMOVE(w->list, w, link);
	w->list = &w->vs->special;
	TAILQ_INSERT_TAIL(w->list, w, link);
}

void trk__handle_versions(struct trk_call *c)
{
	struct trk_versions *vs = c->s->vs;
	uint64_t after = 0, wait_ms = 0, rev = 0;
	struct proto_err err = {{0}};
	bool layouts = trk__query_str(c, "layouts_rev") != NULL;
	struct waiter *w;

	vs->s = c->s;
	if (trk__query_u64(c, "after", false, UINT64_MAX, &after, &err) != 0 ||
	    trk__query_u64(c, "wait_ms", false, UINT64_MAX, &wait_ms, &err) != 0 ||
	    trk__query_u64(c, "layouts_rev", false, UINT64_MAX, &rev, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	wait_ms = PROTO_MIN(wait_ms, TRK_WAIT_MAX_MS);
	if (trk__versions_latest(vs) > after || wait_ms == 0 || (layouts && rev != vs->layouts_rev)) {
		trk__reply_json(c, 200, list_after(c->s, after));
		return;
	}
	if ((w = hold(c, after, wait_ms)) != NULL && layouts) {
		w->layouts = true;
		special(w);
	}
}

int trk__versions_hold_addendum(struct trk_call *c, uint64_t v, const uint8_t *layout,
				uint64_t wait_ms, bool copy)
{
	struct waiter *w = hold(c, v, PROTO_MIN(wait_ms, TRK_WAIT_MAX_MS));

	if (w == NULL)
		return -ENOMEM;
	w->addendum = true;
	w->copy = copy;
	memcpy(w->layout, layout, PROTO_HASH_BYTES);
	special(w);
	return 0;
}

/* Answers the waiters that match (each answer built anew: they are few). */
static void wake_matching(struct trk_versions *vs, bool (*match)(const struct waiter *, const void *),
			  const void *arg)
{
	struct waiter *w, *next;

	for (w = TAILQ_FIRST(&vs->special); w != NULL; w = next) {
		next = TAILQ_NEXT(w, link);
		if (match(w, arg))
			waiter_answer(w);
	}
}

static bool is_publisher_watch(const struct waiter *w, const void *arg)
{
	return w->layouts;
}

void trk__versions_replica_alive(struct trk_versions *vs)
{
	vs->layouts_rev++;
	if (vs->s != NULL)
		wake_matching(vs, is_publisher_watch, NULL);
}

struct addendum_key {
	uint64_t v;
	const uint8_t *layout;
};

static bool waits_for(const struct waiter *w, const void *arg)
{
	const struct addendum_key *k = arg;
	return w->addendum && w->after == k->v &&
	       memcmp(w->layout, k->layout, PROTO_HASH_BYTES) == 0;
}

void trk__versions_addendum_posted(struct trk_versions *vs, uint64_t v, const uint8_t *layout)
{
	struct addendum_key k = {v, layout};

	if (vs->s != NULL)
		wake_matching(vs, waits_for, &k);
}

void trk__handle_manifest(struct trk_call *c, const char *num)
{
	struct trk_versions *vs = c->s->vs;
	struct proto_err err = {{0}};
	struct trk_version *r;
	uint64_t v;
	uint8_t *buf;
	size_t len;

	if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0) {
		trk__fail(c, 400, "version '%s' is not a positive integer", num);
		return;
	}
	r = trk__versions_find(vs, v);
	if (r == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)v);
		return;
	}
	if (r->raw != NULL) {
		trk__reply_raw(c, 200, "application/octet-stream", r->raw, r->rawlen);
		return;
	}
	if (read_raw(vs, r, &buf, &len, &err) != 0) {
		LOG_ERR("%s", err.msg);
		trk__fail(c, 500, "%s", err.msg);
		return;
	}
	trk__reply_raw(c, 200, "application/octet-stream", buf, len);
	free(buf);
}

/* Writes the manifest and its meta record; on failure neither is left. */
static int store(struct trk_versions *vs, const struct proto_manifest *m,
		 const uint8_t *buf, size_t len, uint64_t published_ms,
		 struct proto_err *err)
{
	char mpath[4096], jpath[4096], meta[64];
	int rc;

	if ((rc = version_path(vs, m->version, "manifest", mpath, sizeof(mpath))) != 0 ||
	    (rc = version_path(vs, m->version, "json", jpath, sizeof(jpath))) != 0)
		return proto_errf(err, -rc, "state path too long");
	snprintf(meta, sizeof(meta), "{\"published_ms\":%llu}\n",
		 (unsigned long long)published_ms);
	if ((rc = proto_write_file_atomic(mpath, buf, len, 0644, err)) != 0)
		return rc;
	if ((rc = proto_write_file_atomic(jpath, meta, strlen(meta), 0644, err)) != 0)
		goto fail;
	if ((rc = fsync_dir(vs->vdir)) != 0) {
		proto_errf(err, -rc, "%s: fsync: %s", vs->vdir, strerror(-rc));
		goto fail;
	}
	if (!vs->have_pk && (rc = write_pin(vs, m->signer, err)) != 0)
		goto fail;
	return 0;
fail:
	unlink(jpath);
	unlink(mpath);
	return rc;
}

void trk__handle_publish(struct trk_call *c)
{
	struct trk_versions *vs = c->s->vs;
	struct proto_manifest *m = NULL;
	struct proto_err err = {{0}};
	struct trk_version r = {0}, *old;
	uint8_t pk[PROTO_PK_BYTES], model[PROTO_HASH_BYTES], tl[PROTO_HASH_BYTES];
	char hex[2 * PROTO_HASH_BYTES + 1];
	uint8_t *copy = NULL;
	int code;

	vs->s = c->s;
	if (vs->have_pk) {
		memcpy(pk, vs->pk, sizeof(pk));
	} else if (proto_manifest_peek_signer(c->body, c->len, pk) != 0) {
		trk__fail(c, 400, "manifest: too short to hold a signer key");
		return;
	}
	m = calloc(1, sizeof(*m));
	if (m == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	if (proto_manifest_decode(c->body, c->len, pk, m, &err) != 0) {
		free(m);
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	old = trk__versions_find(vs, m->version);
	if (old != NULL) {
		if (memcmp(old->digest, m->digest, PROTO_HASH_BYTES) == 0) {
			trk__reply_json(c, 200, json_pack("{s:I,s:o}", "version",
							  (json_int_t)m->version,
							  "digest",
							  trk__json_hex(m->digest,
									PROTO_HASH_BYTES)));
		} else {
			trk__hex(old->digest, PROTO_HASH_BYTES, hex);
			trk__fail(c, 409,
				  "version %llu already exists with another digest (%s)",
				  (unsigned long long)m->version, hex);
		}
		goto out;
	}
	if ((code = check_chain(vs, m, &err)) != 0) {
		trk__fail(c, code, "%s", err.msg);
		goto out;
	}
	if (vs->n > 0 && memcmp(vs->v[vs->n - 1].model_digest, m->model_digest,
				PROTO_HASH_BYTES) != 0) {
		trk__fail(c, 409, "model digest differs from version %llu's",
			  (unsigned long long)trk__versions_latest(vs));
		goto out;
	}
	if (trk__registry_model(c->s->reg, model, tl)) {
		if (memcmp(model, m->model_digest, PROTO_HASH_BYTES) != 0) {
			trk__fail(c, 409, "model digest differs from the registered publishers'");
			goto out;
		}
		if (memcmp(tl, m->src_layout_digest, PROTO_HASH_BYTES) != 0) {
			trk__fail(c, 409,
				  "trainer layout digest differs from the registered publishers'");
			goto out;
		}
	}
	fill_record(&r, m);
	r.published_ms = proto_wall_ms();
	copy = malloc(c->len ? c->len : 1);
	if (copy == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	memcpy(copy, c->body, c->len);
	/* Durable before the answer. */
	if (store(vs, m, c->body, c->len, r.published_ms, &err) != 0) {
		LOG_ERR("storing version %llu: %s", (unsigned long long)m->version,
			err.msg);
		trk__fail(c, 500, "cannot store the version: %s", err.msg);
		goto out;
	}
	r.raw = copy;
	r.rawlen = c->len;
	r.m = m;
	if (append(vs, &r) != 0) {
		/* Stored but not in memory: the next start will load it. */
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	copy = NULL;
	m = NULL;
	if (!vs->have_pk) {
		memcpy(vs->pk, pk, sizeof(pk));
		vs->have_pk = vs->pinned = true;
		trk__hex(pk, PROTO_PK_BYTES, hex);
		LOG_INFO("pinned trainer key %s", hex);
	}
	r = vs->v[vs->n - 1];
	LOG_INFO("version %llu accepted (%s, parent %llu, %llu wire bytes)",
		 (unsigned long long)r.version,
		 r.kind == PROTO_KIND_DELTA ? "delta" : "anchor",
		 (unsigned long long)r.parent, (unsigned long long)r.wire_bytes);
	trk__reply_json(c, 201, json_pack("{s:I,s:o}", "version",
					  (json_int_t)r.version, "digest",
					  trk__json_hex(r.digest, PROTO_HASH_BYTES)));
	trk__registry_changed(c->s->reg);
	wake_waiters(vs);
out:
	free(copy);
	if (m != NULL) {
		proto_manifest_fini(m);
		free(m);
	}
}
