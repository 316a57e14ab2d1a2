/* The ranks one tessera-node process serves: --rank, --ranks and --serve. */
#include "node/host/host.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/optval.h"
#include "tracker/tracker.h"

/* As the tracker takes them: 1..TRK_REPLICA_MAX of [A-Za-z0-9._-]. */
static bool replica_ok(const char *s, size_t n)
{
	if (n == 0 || n > TRK_REPLICA_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
			return false;
	return true;
}

static bool listed(const struct node_host_rank *r, size_t n, const char *replica, uint32_t rank)
{
	for (size_t i = 0; i < n; i++)
		if (r[i].rank == rank && strcmp(r[i].replica, replica) == 0)
			return true;
	return false;
}

int node_host_ranks_add(struct node_host_ranks *l, const char *replica, const char *ranks,
			const char *layout, struct proto_err *err)
{
	size_t n0 = l->n;
	const char *p = ranks;
	int rc = 0;

	if (!replica_ok(replica, strlen(replica)))
		return proto_errf(err, EINVAL, "replica '%s': want 1..%d of [A-Za-z0-9._-]", replica,
				  TRK_REPLICA_MAX);
	for (;;) {
		uint64_t lo, hi;
		int more = proto_ranks_next(&p, 65535, &lo, &hi);
		if (more < 0 || (more == 0 && l->n == n0))
			goto bad;
		if (more == 0)
			return 0;
		for (uint64_t k = lo; k <= hi; k++) {
			if (listed(l->r, l->n, replica, (uint32_t)k)) {
				rc = proto_errf(err, EINVAL, "replica %s rank %u is given twice", replica,
						(unsigned)k);
				goto undo;
			}
			if (l->n >= NODE_HOST_RANKS_MAX) {
				rc = proto_errf(err, E2BIG, "more than %d ranks in one process",
						NODE_HOST_RANKS_MAX);
				goto undo;
			}
			struct node_host_rank *g = realloc(l->r, (l->n + 1) * sizeof(*g));
			if (g == NULL) {
				rc = proto_errf(err, ENOMEM, "out of memory");
				goto undo;
			}
			l->r = g;
			g = &l->r[l->n];
			*g = (struct node_host_rank){.rank = (uint32_t)k};
			snprintf(g->replica, sizeof(g->replica), "%s", replica);
			if (layout != NULL && (g->layout = strdup(layout)) == NULL) {
				rc = proto_errf(err, ENOMEM, "out of memory");
				goto undo;
			}
			l->n++;
		}
	}
bad:
	rc = proto_errf(err, EINVAL, "replica %s: ranks '%s': want R, R-S or a comma list of those",
			replica, ranks);
undo:
	while (l->n > n0)
		free(l->r[--l->n].layout);
	return rc;
}

int node_host_ranks_serve(struct node_host_ranks *l, const char *spec, struct proto_err *err)
{
	size_t n0 = l->n;
	const char *p = spec;
	int rc = 0;

	for (;;) {
		p += strspn(p, " \t;");
		if (*p == '\0')
			break;
		size_t item = strcspn(p, " \t;");
		char buf[1024], replica[TRK_REPLICA_MAX + 2];
		if (item >= sizeof(buf)) {
			rc = proto_errf(err, EINVAL, "--serve: an item longer than %zu bytes",
					sizeof(buf) - 1);
			break;
		}
		memcpy(buf, p, item);
		buf[item] = '\0';
		char *slash = strchr(buf, '/');
		char *at = strchr(buf, '@');
		if (slash == NULL || (at != NULL && at < slash) || (size_t)(slash - buf) >= sizeof(replica)) {
			rc = proto_errf(err, EINVAL, "--serve '%s': want REPLICA/RANKS[@LAYOUT]", buf);
			break;
		}
		memcpy(replica, buf, (size_t)(slash - buf));
		replica[slash - buf] = '\0';
		if (at != NULL)
			*at = '\0';
		if (at != NULL && at[1] == '\0') {
			rc = proto_errf(err, EINVAL, "--serve '%s@': the layout is missing", buf);
			break;
		}
		if ((rc = node_host_ranks_add(l, replica, slash + 1, at ? at + 1 : NULL, err)) != 0)
			break;
		p += item;
	}
	if (rc == 0 && l->n == n0)
		rc = proto_errf(err, EINVAL, "--serve '%s': no REPLICA/RANKS in it", spec);
	if (rc != 0)
		while (l->n > n0)
			free(l->r[--l->n].layout);
	return rc;
}

void node_host_ranks_fini(struct node_host_ranks *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->r[i].layout);
	free(l->r);
	l->r = NULL;
	l->n = 0;
}
