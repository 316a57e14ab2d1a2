/* Shared helpers: one-line errors, bounded whole-file I/O, clocks. */
#include "proto/util.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int proto_errf(struct proto_err *err, int code, const char *fmt, ...)
{
	if (err != NULL) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		/* One line, whatever hostile names it quotes. */
		for (char *c = err->msg; *c != 0; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
	}
	return -code;
}

void proto_err_prefix(struct proto_err *err, const char *fmt, ...)
{
	char old[sizeof(err->msg)];
	va_list ap;
	int n;

	if (err == NULL)
		return;
	memcpy(old, err->msg, sizeof(old));
	va_start(ap, fmt);
	n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n + 2 >= sizeof(err->msg))
		return;
	/* Append ": old", truncating to fit. */
	size_t at = (size_t)n, room = sizeof(err->msg) - at - 3;
	size_t olen = strnlen(old, sizeof(old));
	err->msg[at++] = ':';
	err->msg[at++] = ' ';
	memcpy(err->msg + at, old, PROTO_MIN(olen, room));
	err->msg[at + PROTO_MIN(olen, room)] = 0;
}

int proto_open_regular(const char *path, struct stat *st, struct proto_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

	if (fd < 0)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, st) != 0) {
		rc = proto_errf(err, errno, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		return proto_errf(err, EINVAL, "%s: not a regular file", path);
	}
	return fd;
}

int proto_read_file(const char *path, size_t cap, uint8_t **buf, size_t *len,
		    struct proto_err *err)
{
	struct stat st;
	uint8_t *p = NULL;
	size_t got = 0;
	int fd, rc;

	*buf = NULL;
	*len = 0;
	fd = proto_open_regular(path, &st, err);
	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size > cap) {
		rc = proto_errf(err, EFBIG, "%s: %lld bytes, more than the %zu allowed",
				path, (long long)st.st_size, cap);
		goto fail;
	}
	p = malloc((size_t)st.st_size + 1);
	if (p == NULL) {
		rc = proto_errf(err, ENOMEM, "%s: out of memory", path);
		goto fail;
	}
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, p + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = proto_errf(err, n < 0 ? errno : EIO, "%s: short read", path);
			goto fail;
		}
		got += (size_t)n;
	}
	p[got] = 0;
	close(fd);
	*buf = p;
	*len = got;
	return 0;
fail:
	free(p);
	close(fd);
	return rc;
}

static int write_file(const char *path, const void *buf, size_t len, mode_t mode, bool sync,
		      struct proto_err *err)
{
	char tmp[4096];
	const uint8_t *p = buf;
	int fd, rc;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >=
	    (int)sizeof(tmp))
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
			goto fail;
		}
		p += n;
		len -= (size_t)n;
	}
	if ((sync && fsync(fd) != 0) || close(fd) != 0) {
		fd = -1;
		rc = proto_errf(err, errno, "%s: %s", tmp, strerror(errno));
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) != 0) {
		rc = proto_errf(err, errno, "%s: %s", path, strerror(errno));
		goto fail;
	}
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	return rc;
}

int proto_write_file_atomic(const char *path, const void *buf, size_t len,
			    mode_t mode, struct proto_err *err)
{
	return write_file(path, buf, len, mode, true, err);
}

int proto_write_file_replace(const char *path, const void *buf, size_t len, mode_t mode,
			     struct proto_err *err)
{
	return write_file(path, buf, len, mode, false, err);
}

int proto_sync_file(const char *path, struct proto_err *err)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	int rc = 0;

	if (slash == NULL)
		snprintf(dir, sizeof(dir), ".");
	else if (snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path) >= (int)sizeof(dir))
		return proto_errf(err, ENAMETOOLONG, "%s: path too long", path);
	if (dir[0] == 0)
		snprintf(dir, sizeof(dir), "/");
	const char *which[2] = {path, dir};
	for (int i = 0; i < 2 && rc == 0; i++) {
		int fd = open(which[i], O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fsync(fd) != 0)
			rc = proto_errf(err, errno, "%s: %s", which[i], strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	return rc;
}

int proto_mkdir_p(const char *dir, struct proto_err *err)
{
	char buf[4096];
	size_t n = strlen(dir);

	if (n == 0 || n >= sizeof(buf))
		return proto_errf(err, EINVAL, "directory '%s': bad name", dir);
	memcpy(buf, dir, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != 0)
			continue;
		char c = buf[i];
		buf[i] = 0;
		if (mkdir(buf, 0755) != 0 && errno != EEXIST)
			return proto_errf(err, errno, "cannot create %s: %s", buf, strerror(errno));
		buf[i] = c;
	}
	return 0;
}

int proto_write_json_atomic(const char *path, const json_t *j, size_t flags,
			    struct proto_err *err)
{
	char *txt = json_dumps(j, flags);
	int rc = txt != NULL ? proto_write_file_atomic(path, txt, strlen(txt), 0644, err)
			     : proto_errf(err, ENOMEM, "%s: out of memory", path);

	free(txt);
	return rc;
}

static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t (*now_fn)(void);

void proto_clock_set(uint64_t (*fn)(void))
{
	now_fn = fn;
}

uint64_t proto_now_ns(void)
{
	return now_fn != NULL ? now_fn() : clock_ns(CLOCK_MONOTONIC);
}

uint64_t proto_thread_cpu_ns(void)
{
	return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

uint64_t proto_process_cpu_ns(void)
{
	return clock_ns(CLOCK_PROCESS_CPUTIME_ID);
}

uint64_t proto_process_faults(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)ru.ru_minflt + (uint64_t)ru.ru_majflt;
}

void proto_lag_tick(FILE *f, uint64_t *due_ns)
{
	uint64_t now = proto_now_ns();

	if (*due_ns != 0 && now > *due_ns + 2000000)
		fprintf(f, "L %" PRIu64 " %" PRIu64 "\n", *due_ns, now);
	*due_ns = now + 1000000;
}

uint64_t proto_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

int proto_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (s == NULL || *s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != 0 || v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

int proto_parse_hex(const char *s, uint8_t *out, size_t n)
{
	size_t got = 0;
	const char *end = NULL;

	if (s == NULL || strlen(s) != 2 * n)
		return -EINVAL;
	if (sodium_hex2bin(out, n, s, 2 * n, NULL, &got, &end) != 0 || got != n || *end != 0)
		return -EINVAL;
	return 0;
}
