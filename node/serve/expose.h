/*
 * The activation record a node writes into --expose at every activation,
 * <replica>-<rank>.json (node/agent/activate.c): the version served, where
 * its memory is (the slot's memfd under /proc/<pid>/fd, a CUDA IPC handle),
 * the attach socket. It names the node process's memory, so it is only
 * true while that process runs: the node removes it when it stops, and a
 * record left by a node that died (SIGKILL, a crash) is stale. Readers go
 * through node_expose_read, which refuses a stale record with one line
 * saying so instead of failing later on a missing memfd.
 */
#ifndef NODE_EXPOSE_H
#define NODE_EXPOSE_H

#include <jansson.h>
#include <sys/types.h>

#include "proto/util.h"

/*
 * Reads the record at path into *out (the caller's; json_decref). The file
 * is outside input: its size is capped, it must be a JSON object naming a
 * pid, a version and a memfd_path, and that memfd must still be a tessera
 * slot of that running process. Otherwise a negative errno, *out NULL, and
 * one line in err: no record (-ENOENT), a malformed one (-EINVAL), a
 * stale one (-ESRCH: "... is stale: node process N is not running ..."),
 * or one this process may not reach (-EACCES: another user's node).
 */
int node_expose_read(const char *path, json_t **out, struct proto_err *err);

/* Removes the record at path if it names process pid. 0 also when there
 * is none or it names another process (a node of the same rank started
 * since); else a negative errno and err says why. */
int node_expose_remove(const char *path, pid_t pid, struct proto_err *err);

#endif
