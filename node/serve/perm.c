/* Mode and group of the paths a node makes for serving processes (perm.h). */
#include "node/serve/perm.h"

#include <errno.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A group name or a numeric gid; -ENOENT for a name no group has. */
static int parse_group(const char *s, gid_t *out)
{
	uint64_t v;
	struct group gr, *res = NULL;
	char buf[16384];

	if (proto_parse_u64(s, 0, UINT32_MAX - 1, &v) == 0) {
		*out = (gid_t)v;
		return 0;
	}
	int rc = getgrnam_r(s, &gr, buf, sizeof(buf), &res);
	if (rc != 0)
		return -rc;
	if (res == NULL)
		return -ENOENT;
	*out = res->gr_gid;
	return 0;
}

int node_perm_parse(const char *mode, const char *group, const char *mode_opt,
		    const char *group_opt, struct node_perm *out, struct proto_err *err)
{
	struct node_perm p = {0};
	int rc;

	if (mode != NULL) {
		char *end;
		errno = 0;
		unsigned long m = strtoul(mode, &end, 8);
		if (mode[0] < '0' || mode[0] > '7' || *end != '\0' || errno != 0 || m > 0777)
			return proto_errf(err, EINVAL,
					  "%s %s: want octal permission bits, 0000 to 0777 (0660)",
					  mode_opt, mode);
		p.has_mode = true;
		p.mode = (mode_t)m;
	}
	if (group != NULL) {
		if (group[0] == '\0')
			return proto_errf(err, EINVAL, "%s: want a group name or a numeric gid",
					  group_opt);
		if ((rc = parse_group(group, &p.gid)) == -ENOENT)
			return proto_errf(err, ENOENT, "%s %s: no such group", group_opt, group);
		if (rc != 0)
			return proto_errf(err, -rc, "%s %s: cannot look the group up: %s",
					  group_opt, group, strerror(-rc));
		p.has_group = true;
	}
	*out = p;
	return 0;
}

int node_perm_apply(const char *path, const struct node_perm *p, struct proto_err *err)
{
	if (p == NULL)
		return 0;
	/* The group first: a mode that opens the path to the group then never
	 * opens it to the process's own group in between. */
	if (p->has_group && chown(path, (uid_t)-1, p->gid) != 0)
		return proto_errf(err, errno, "%s: cannot give it group %u: %s%s", path,
				  (unsigned)p->gid, strerror(errno),
				  errno == EPERM ? " (the node must be a member of that group)" : "");
	if (p->has_mode && chmod(path, p->mode) != 0)
		return proto_errf(err, errno, "%s: cannot make it mode %04o: %s", path,
				  (unsigned)p->mode, strerror(errno));
	return 0;
}
