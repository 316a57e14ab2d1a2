/* tessera-node's option values: the parser of each, shared by its flag and
 * its [node] key (node_host_config_values). */
#include <errno.h>
#include <string.h>

#include "node/base/metrics_http.h"
#include "node/host/host.h"
#include "node/serve/perm.h"
#include "node/store/store.h"
#include "proto/optval.h"
#include "tracker/tracker.h"

int node_host_rank_parse(const char *v, uint64_t *rank, struct proto_err *err)
{
	if (proto_parse_u64(v, 0, 65535, rank) != 0)
		return proto_errf(err, EINVAL, "not a rank (0..65535)");
	return 0;
}

int node_host_install_parse(const char *v, bool *inplace, struct proto_err *err)
{
	if (strcmp(v, "double") != 0 && strcmp(v, "in-place") != 0)
		return proto_errf(err, EINVAL, "want double or in-place");
	*inplace = strcmp(v, "in-place") == 0;
	return 0;
}

static int rank_check(const char *v, struct proto_err *err)
{
	uint64_t r;

	return node_host_rank_parse(v, &r, err);
}

static int install_check(const char *v, struct proto_err *err)
{
	bool b;

	return node_host_install_parse(v, &b, err);
}

/* A replica's name, as node_host_ranks_add takes it. */
static int replica_check(const char *v, struct proto_err *err)
{
	struct node_host_ranks l = {0};
	int rc = node_host_ranks_add(&l, v, "0", NULL, err);

	node_host_ranks_fini(&l);
	return rc;
}

static int serve_check(const char *v, struct proto_err *err)
{
	struct node_host_ranks l = {0};
	int rc = node_host_ranks_serve(&l, v, err);

	node_host_ranks_fini(&l);
	return rc;
}

/* --attach-mode and --attach-group through node_perm_parse; the reason
 * without its "--attach-mode VALUE: ", which the caller says. */
static int perm_check(const char *mode, const char *group, struct proto_err *err)
{
	struct node_perm p;
	struct proto_err why;
	int rc = node_perm_parse(mode, group, "--attach-mode", "--attach-group", &p, &why);
	const char *reason = strstr(why.msg, ": ");

	if (rc == 0)
		return 0;
	return proto_errf(err, -rc, "%s", reason != NULL ? reason + 2 : why.msg);
}

static int attach_mode_check(const char *v, struct proto_err *err)
{
	return perm_check(v, NULL, err);
}

static int attach_group_check(const char *v, struct proto_err *err)
{
	return perm_check(NULL, v, err);
}

const struct proto_config_value node_host_config_values[] = {
	{"tracker", trk_url_check},
	{"replica", replica_check},
	{"rank", rank_check},
	{"ranks", proto_optval_ranks},
	{"serve", serve_check},
	{"layout", proto_optval_layout},
	{"model", proto_optval_file},
	{"trainer-pubkey", proto_optval_pubkey},
	{"cluster-key", proto_optval_cluster_key},
	{"tls-ca", proto_optval_file},
	{"site", trk_site_check},
	{"store", node_store_name_check},
	{"attach-mode", attach_mode_check},
	{"attach-group", attach_group_check},
	{"install", install_check},
	{"metrics", node_metrics_addr_check},
	{NULL, NULL},
};
