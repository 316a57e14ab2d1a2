/* Helpers shared by the cmocka tests: temporary directories, data paths,
 * running the built programs. Header-only; each test binary includes it. */
#ifndef TESTS_TESTUTIL_H
#define TESTS_TESTUTIL_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A fresh directory under $TMPDIR (or /tmp); removed by tu_rmtree. */
static inline char *tu_mkdtemp(char *buf, size_t len)
{
	const char *t = getenv("TMPDIR");
	snprintf(buf, len, "%s/tessera-test-XXXXXX", t ? t : "/tmp");
	return mkdtemp(buf);
}

static inline void tu_rmtree(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	char p[4096];

	if (d == NULL) {
		unlink(path);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
		struct stat st;
		if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
			tu_rmtree(p);
		else
			unlink(p);
	}
	closedir(d);
	rmdir(path);
}

/* Path of a file under tests/data (TESSERA_TEST_DATA, set by `make test`). */
static inline const char *tu_data(char *buf, size_t len, const char *name)
{
	const char *d = getenv("TESSERA_TEST_DATA");
	snprintf(buf, len, "%s/%s", d ? d : "tests/data", name);
	return buf;
}

/* Path of a built program (TESSERA_BIN, set by `make test`). */
static inline const char *tu_bin(char *buf, size_t len, const char *name)
{
	const char *d = getenv("TESSERA_BIN");
	snprintf(buf, len, "%s/%s", d ? d : "build/bin", name);
	return buf;
}

/* Path of a file in the source tree (TESSERA_ROOT, set by `make test`). */
static inline const char *tu_src(char *buf, size_t len, const char *name)
{
	const char *d = getenv("TESSERA_ROOT");
	snprintf(buf, len, "%s/%s", d ? d : ".", name);
	return buf;
}

/* The python of the environment where pip installed the tessera package
 * (TESSERA_PYTHON, $(BUILD)/venv/bin/python3, set by `make test`), or NULL
 * when there is none: the caller skips, and says why. */
static inline const char *tu_python(void)
{
	const char *py = getenv("TESSERA_PYTHON");
	return py != NULL && access(py, X_OK) == 0 ? py : NULL;
}

/* Writes a string to a file; returns 0 on success. */
static inline int tu_write(const char *path, const char *s)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return -1;
	fputs(s, f);
	return fclose(f);
}

/* Runs a shell command line (printf-style), returns its exit status. */
static inline int tu_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int tu_sh(const char *fmt, ...)
{
	char cmd[8192];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	return rc == -1 ? -1 : WEXITSTATUS(rc);
}

/* method url with curl, its files in dir (http.out, http.code); returns the
 * HTTP status (-1: none) and copies the body (NUL-terminated) into body. */
static inline int tu_http_get(const char *dir, const char *method, const char *url, char *body,
			      size_t cap)
{
	char out[600], code[600];
	snprintf(out, sizeof(out), "%s/http.out", dir);
	snprintf(code, sizeof(code), "%s/http.code", dir);
	if (tu_sh("curl -s -m 10 -X %s -o %s -w '%%{http_code}' '%s' > %s", method, out, url, code) != 0)
		return -1;
	FILE *f = fopen(code, "r");
	int status = -1;
	if (f != NULL) {
		if (fscanf(f, "%d", &status) != 1)
			status = -1;
		fclose(f);
	}
	body[0] = '\0';
	f = fopen(out, "r");
	if (f != NULL) {
		size_t n = fread(body, 1, cap - 1, f);
		body[n] = '\0';
		fclose(f);
	}
	return status;
}

#endif
