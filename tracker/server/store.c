/* The tracker's durable keys in a state directory or in etcd. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/log.h"
#include "tracker/server/store.h"
#include "tracker/wire/etcd.h"

/*
 * In etcd a value is one byte of kind, then:
 *   'v' the bytes themselves, or
 *   'p' "<parts> <bytes> <BLAKE2b-256 hex>", the bytes being in the keys
 *       parts/<key>/<i> (i from 0), PART_BYTES each but the last: etcd
 *       takes at most 1.5 MiB in one request, a manifest may be more.
 * The parts are written first and the value last (created, for a version:
 * the one write that decides), so a value that exists is whole. Parts a
 * failed write left are overwritten by the next.
 */
#define PART_BYTES (512u << 10)
#define PARTS_MAX 4096

struct trk_store {
	char *dir;           /* a state directory, or */
	struct trk_etcd *e;  /* an etcd store */
	char fence_key[64];  /* writes only while this key is held under */
	int64_t fence_lease; /* this lease ("": unfenced) */
	char name[700];
};

int trk__store_open_dir(const char *dir, struct trk_store **out, struct proto_err *err)
{
	struct trk_store *st = calloc(1, sizeof(*st));
	int rc;

	*out = NULL;
	if (st == NULL || (st->dir = strdup(dir)) == NULL) {
		free(st);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	snprintf(st->name, sizeof(st->name), "state directory %s", dir);
	if ((rc = proto_mkdir_p(dir, err)) != 0) {
		trk__store_free(st);
		return rc;
	}
	*out = st;
	return 0;
}

int trk__store_open_etcd(struct trk_etcd *e, struct trk_store **out, struct proto_err *err)
{
	struct trk_store *st = calloc(1, sizeof(*st));

	*out = NULL;
	if (st == NULL) {
		trk_etcd_free(e);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	st->e = e;
	snprintf(st->name, sizeof(st->name), "%s", trk_etcd_url(e));
	*out = st;
	return 0;
}

void trk__store_free(struct trk_store *st)
{
	if (st == NULL)
		return;
	trk_etcd_free(st->e);
	free(st->dir);
	free(st);
}

const char *trk__store_name(const struct trk_store *st)
{
	return st->name;
}

struct trk_etcd *trk__store_etcd(struct trk_store *st)
{
	return st->e;
}

static int key_path(const struct trk_store *st, const char *key, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%s/%s", st->dir, key);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* fsyncs the directory that holds path. */
static int sync_parent(const char *path, struct proto_err *err)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	int fd, rc = 0;

	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0)
		rc = proto_errf(err, errno, "%s: fsync: %s", dir, strerror(errno));
	if (fd >= 0)
		close(fd);
	return rc;
}

/* ---- etcd values: inline or in parts ------------------------------------ */

static void part_key(char *buf, size_t cap, const char *key, size_t i)
{
	snprintf(buf, cap, "parts/%s/%zu", key, i);
}

static int etcd_write(struct trk_store *st, const char *key, const uint8_t *buf, size_t len,
		      bool create, struct proto_err *err)
{
	uint8_t *val, digest[crypto_generichash_BYTES];
	char hex[2 * sizeof(digest) + 1], pk[600];
	size_t vlen, parts = (len + PART_BYTES - 1) / PART_BYTES;
	int rc;

	if (len <= PART_BYTES) {
		vlen = 1 + len;
		val = malloc(vlen);
		if (val == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		val[0] = 'v';
		memcpy(val + 1, buf, len);
	} else {
		if (parts > PARTS_MAX)
			return proto_errf(err, EFBIG, "%s: %zu bytes, over what a store value holds",
					  key, len);
		for (size_t i = 0; i < parts; i++) {
			size_t n = PROTO_MIN(PART_BYTES, len - i * PART_BYTES);
			part_key(pk, sizeof(pk), key, i);
			if ((rc = trk_etcd_put(st->e, pk, buf + i * PART_BYTES, n, 0, err)) != 0)
				return rc;
		}
		crypto_generichash(digest, sizeof(digest), buf, len, NULL, 0);
		sodium_bin2hex(hex, sizeof(hex), digest, sizeof(digest));
		val = malloc(160);
		if (val == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		vlen = (size_t)snprintf((char *)val, 160, "p%zu %zu %s", parts, len, hex);
	}
	struct trk_etcd_if cond = {.absent = create,
				   .fence_key = st->fence_key[0] ? st->fence_key : NULL,
				   .fence_lease = st->fence_lease};
	rc = create || cond.fence_key != NULL ? trk_etcd_put_if(st->e, key, val, vlen, 0, &cond, err)
					      : trk_etcd_put(st->e, key, val, vlen, 0, err);
	free(val);
	return rc;
}

static int etcd_read(struct trk_store *st, const char *key, size_t cap, uint8_t **out,
		     size_t *outlen, struct proto_err *err)
{
	uint8_t *val = NULL, *buf = NULL, digest[crypto_generichash_BYTES];
	char hex[2 * sizeof(digest) + 1], want[2 * sizeof(digest) + 1], pk[600];
	size_t vlen, parts, len, at = 0;
	int rc;

	if ((rc = trk_etcd_get(st->e, key, cap + 1, &val, &vlen, err)) != 0) {
		if (rc != -ENOENT && rc != -EIO)
			proto_err_prefix(err, "%s %s", st->name, key);
		return rc;
	}
	if (vlen >= 1 && val[0] == 'v') {
		memmove(val, val + 1, vlen); /* with the NUL past the end */
		*out = val;
		*outlen = vlen - 1;
		return 0;
	}
	if (vlen < 1 || val[0] != 'p' ||
	    sscanf((char *)val + 1, "%zu %zu %64s", &parts, &len, want) != 3 ||
	    parts == 0 || parts > PARTS_MAX || len > (size_t)parts * PART_BYTES ||
	    len <= (parts - 1) * PART_BYTES) {
		free(val);
		return proto_errf(err, EPROTO, "%s %s: not a value tessera wrote", st->name, key);
	}
	free(val);
	if (len > cap)
		return proto_errf(err, EFBIG, "%s %s: %zu bytes, over %zu", st->name, key, len, cap);
	buf = malloc(len + 1);
	if (buf == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (size_t i = 0; i < parts; i++) {
		size_t n = PROTO_MIN(PART_BYTES, len - at);
		part_key(pk, sizeof(pk), key, i);
		rc = trk_etcd_get(st->e, pk, PART_BYTES, &val, &vlen, err);
		if (rc == -ENOENT || (rc == 0 && vlen != n))
			rc = proto_errf(err, EPROTO, "%s %s: part %zu is %s", st->name, key, i,
					rc == 0 ? "of another size" : "missing");
		if (rc != 0) {
			free(val);
			free(buf);
			return rc;
		}
		memcpy(buf + at, val, n);
		at += n;
		free(val);
	}
	crypto_generichash(digest, sizeof(digest), buf, len, NULL, 0);
	sodium_bin2hex(hex, sizeof(hex), digest, sizeof(digest));
	if (strcmp(hex, want) != 0) {
		free(buf);
		return proto_errf(err, EPROTO, "%s %s: its parts do not match its digest", st->name,
				  key);
	}
	buf[len] = 0;
	*out = buf;
	*outlen = len;
	return 0;
}

/* ---- the interface ------------------------------------------------------ */

void trk__store_fence(struct trk_store *st, const char *key, int64_t lease)
{
	snprintf(st->fence_key, sizeof(st->fence_key), "%s", key);
	st->fence_lease = lease;
}

int trk__store_get(struct trk_store *st, const char *key, size_t cap, uint8_t **buf,
		   size_t *len, struct proto_err *err)
{
	char path[4096];
	struct stat sb;

	*buf = NULL;
	*len = 0;
	if (st->e != NULL)
		return etcd_read(st, key, cap, buf, len, err);
	if (key_path(st, key, path, sizeof(path)) != 0)
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", key);
	if (stat(path, &sb) != 0 && errno == ENOENT)
		return -ENOENT;
	return proto_read_file(path, cap, buf, len, err);
}

static int dir_write(struct trk_store *st, const char *key, const void *buf, size_t len,
		     bool create, struct proto_err *err)
{
	char path[4096];
	struct stat sb;
	int rc;

	if (key_path(st, key, path, sizeof(path)) != 0)
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", key);
	if (strchr(key, '/') != NULL) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s", path);
		*strrchr(dir, '/') = 0;
		if ((rc = proto_mkdir_p(dir, err)) != 0)
			return rc;
	}
	/* One tracker per state directory: nothing else creates meanwhile. */
	if (create && stat(path, &sb) == 0)
		return -EEXIST;
	if ((rc = proto_write_file_atomic(path, buf, len, 0644, err)) != 0)
		return rc;
	if ((rc = sync_parent(path, err)) != 0)
		unlink(path);
	return rc;
}

int trk__store_put(struct trk_store *st, const char *key, const void *buf, size_t len,
		   struct proto_err *err)
{
	return st->e != NULL ? etcd_write(st, key, buf, len, false, err)
			     : dir_write(st, key, buf, len, false, err);
}

int trk__store_create(struct trk_store *st, const char *key, const void *buf, size_t len,
		      struct proto_err *err)
{
	return st->e != NULL ? etcd_write(st, key, buf, len, true, err)
			     : dir_write(st, key, buf, len, true, err);
}

int trk__store_remove(struct trk_store *st, const char *key, struct proto_err *err)
{
	char path[4096];

	if (st->e != NULL)
		return trk_etcd_delete(st->e, key, err);
	if (key_path(st, key, path, sizeof(path)) != 0)
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", key);
	if (unlink(path) != 0 && errno != ENOENT)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	return 0;
}

/* An etcd listing: the names under dir/ of its own (one level). */
struct list_walk {
	size_t skip;
	int (*fn)(const char *name, void *arg);
	void *arg;
};

static int list_one(const char *key, void *arg)
{
	struct list_walk *w = arg;

	if (strchr(key + w->skip, '/') != NULL)
		return 0;
	return w->fn(key + w->skip, w->arg);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int trk__store_list(struct trk_store *st, const char *dir,
		    int (*fn)(const char *name, void *arg), void *arg, struct proto_err *err)
{
	char path[4096], sub[300];
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *de;
	DIR *d;
	int rc = 0;

	snprintf(sub, sizeof(sub), "%s/", dir);
	if (st->e != NULL) {
		struct list_walk w = {strlen(sub), fn, arg};
		return trk_etcd_keys(st->e, sub, list_one, &w, err);
	}
	if (key_path(st, dir, path, sizeof(path)) != 0)
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", dir);
	if ((rc = proto_mkdir_p(path, err)) != 0)
		return rc;
	if ((d = opendir(path)) == NULL)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		if (strstr(de->d_name, ".tmp.") != NULL) {
			char p[4096 + 256];
			snprintf(p, sizeof(p), "%s/%s", path, de->d_name);
			unlink(p);
			continue;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 64;
			char **nn = realloc(names, cap * sizeof(*nn));
			if (nn == NULL) {
				rc = proto_errf(err, ENOMEM, "out of memory");
				break;
			}
			names = nn;
		}
		if ((names[n] = strdup(de->d_name)) == NULL) {
			rc = proto_errf(err, ENOMEM, "out of memory");
			break;
		}
		n++;
	}
	closedir(d);
	if (rc == 0 && n > 1)
		qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; rc == 0 && i < n; i++)
		rc = fn(names[i], arg);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	return rc;
}

int trk__store_probe(struct trk_store *st, struct proto_err *err)
{
	char path[4096];
	uint8_t *buf = NULL;
	size_t len;
	int fd, e = 0, rc;

	if (st->e != NULL) {
		/* A linearizable read: answered only with a quorum. */
		rc = trk_etcd_get(st->e, "cluster.id", 64, &buf, &len, err);
		free(buf);
		return rc == -ENOENT ? 0 : rc;
	}
	snprintf(path, sizeof(path), "%s/.healthz.tmp.XXXXXX", st->dir);
	fd = mkstemp(path);
	if (fd < 0)
		return proto_errf(err, errno, "state directory %s: cannot create a file: %s",
				  st->dir, strerror(errno));
	if (write(fd, "x", 1) != 1)
		e = errno != 0 ? errno : EIO;
	close(fd);
	unlink(path);
	if (e != 0)
		return proto_errf(err, e, "state directory %s: cannot write: %s", st->dir,
				  strerror(e));
	return 0;
}
