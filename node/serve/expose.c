/* Reading and removing activation records (see expose.h). */
#include "node/serve/expose.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECORD_MAX (1u << 20) /* a record lists a rank's tensors: far below */

/* The record's pid, or 0 when it names none. */
static pid_t record_pid(const json_t *j)
{
	json_int_t p = json_integer_value(json_object_get(j, "pid"));
	return p > 0 && p <= INT32_MAX ? (pid_t)p : 0;
}

static int load(const char *path, json_t **out, struct proto_err *err)
{
	uint8_t *buf;
	size_t len;
	json_error_t je;
	int rc;

	*out = NULL;
	if ((rc = proto_read_file(path, RECORD_MAX, &buf, &len, err)) != 0) {
		if (rc == -ENOENT)
			proto_errf(err, ENOENT, "%s: no activation record (no node serves this rank "
				   "from here, or it stopped)", path);
		return rc;
	}
	*out = json_loadb((const char *)buf, len, 0, &je);
	free(buf);
	if (!json_is_object(*out)) {
		rc = proto_errf(err, EINVAL, "%s: not an activation record (%s)", path,
				*out == NULL ? je.text : "not a JSON object");
		json_decref(*out);
		*out = NULL;
		return rc;
	}
	return 0;
}

int node_expose_read(const char *path, json_t **out, struct proto_err *err)
{
	char link[256], want[64];
	json_t *j;
	int rc;

	*out = NULL;
	if ((rc = load(path, &j, err)) != 0)
		return rc;
	pid_t pid = record_pid(j);
	const char *memfd = json_string_value(json_object_get(j, "memfd_path"));
	json_int_t v = json_integer_value(json_object_get(j, "version"));
	if (pid == 0 || memfd == NULL || v <= 0) {
		rc = proto_errf(err, EINVAL, "%s: not an activation record (no pid, version or "
			       "memfd_path)", path);
		goto fail;
	}
	/* The memfd must be in the named process: a record points into the
	 * memory of the node that wrote it. */
	snprintf(want, sizeof(want), "/proc/%ld/fd/", (long)pid);
	if (strncmp(memfd, want, strlen(want)) != 0) {
		rc = proto_errf(err, EINVAL, "%s: memfd_path %s is not in process %ld", path, memfd,
				(long)pid);
		goto fail;
	}
	if (kill(pid, 0) != 0 && errno == ESRCH) {
		rc = proto_errf(err, ESRCH, "%s is stale: node process %ld is not running (it "
			       "stopped without removing its record); v%lld is not served here",
				path, (long)pid, (long long)v);
		goto fail;
	}
	/* A pid reused by another process has no tessera slot at that fd. */
	ssize_t n = readlink(memfd, link, sizeof(link) - 1);
	link[n > 0 ? n : 0] = 0;
	if (n < 0 && (errno == EACCES || errno == EPERM)) {
		rc = proto_errf(err, EACCES, "%s: cannot reach %s: %s (the node runs as another user)",
				path, memfd, strerror(errno));
		goto fail;
	}
	if (n <= 0 || strncmp(link, "/memfd:tessera-", 15) != 0) {
		rc = proto_errf(err, ESRCH, "%s is stale: %s is not a tessera slot (%s); the node "
			       "that wrote the record is gone",
				path, memfd, n > 0 ? link : strerror(errno));
		goto fail;
	}
	*out = j;
	return 0;
fail:
	json_decref(j);
	return rc;
}

int node_expose_remove(const char *path, pid_t pid, struct proto_err *err)
{
	json_t *j;
	int rc = load(path, &j, err);

	if (rc == -ENOENT)
		return 0;
	/* A record we cannot read is not ours to judge: left as it is. */
	if (rc != 0)
		return rc;
	bool ours = record_pid(j) == pid;
	json_decref(j);
	if (ours && unlink(path) != 0 && errno != ENOENT)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	return 0;
}
