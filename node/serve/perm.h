/*
 * The mode and group of a path a node makes for serving processes of other
 * users: the attach socket (--attach-mode, --attach-group). connect(2) on a
 * Unix socket needs write permission on the socket file, so an engine that
 * runs as another user reaches the node only through a group (or other)
 * write bit the node sets after bind.
 */
#ifndef NODE_PERM_H
#define NODE_PERM_H

#include <stdbool.h>
#include <sys/types.h>

#include "proto/util.h"

struct node_perm {
	bool has_mode, has_group;
	mode_t mode;  /* permission bits only, 0..0777 */
	gid_t gid;
};

/*
 * Fills *out from mode (octal permission bits, "0660"; NULL: leave the mode
 * as the umask makes it) and group (a group name, or a numeric gid; NULL:
 * the group it is made with, the process's). On a bad value a negative errno, one line in err
 * naming the option (mode_opt or group_opt, e.g. "--attach-mode") and *out
 * unchanged.
 */
int node_perm_parse(const char *mode, const char *group, const char *mode_opt,
		    const char *group_opt, struct node_perm *out, struct proto_err *err);

/*
 * Gives path the group, then the mode, p asks for. p may be NULL (nothing to
 * do). A negative errno and err naming path on failure (chown to a group the
 * process is not a member of: -EPERM); the path is left as it was or with
 * only its group changed.
 */
int node_perm_apply(const char *path, const struct node_perm *p, struct proto_err *err);

#endif
