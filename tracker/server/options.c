/* tessera-tracker's option values: the check of each [tracker] key, the
 * parser the tracker applies to its flag (trk_config_values). */
#include <errno.h>

#include "proto/optval.h"
#include "proto/util.h"
#include "tracker/tracker.h"
#include "tracker/wire/etcd.h"

int trk_store_check(const char *v, struct proto_err *err)
{
	struct trk_etcd_opts o = {.url = v};
	struct trk_etcd *e = NULL;
	int rc = trk_etcd_new(&o, &e, err);

	trk_etcd_free(e);
	return rc;
}

int trk_leader_ttl_check(const char *v, struct proto_err *err)
{
	uint64_t s;

	if (proto_parse_u64(v, 2, 3600, &s) != 0)
		return proto_errf(err, EINVAL, "want whole seconds, 2..3600");
	return 0;
}

const struct proto_config_value trk_config_values[] = {
	{"listen", trk_listen_check},
	{"cluster-key", proto_optval_cluster_key},
	{"trainer-pubkey", proto_optval_pubkey},
	{"tls-cert", proto_optval_file},
	{"tls-key", proto_optval_file},
	{"store", trk_store_check},
	{"etcd-ca", proto_optval_file},
	{"etcd-cert", proto_optval_file},
	{"etcd-key", proto_optval_file},
	{"leader-ttl", trk_leader_ttl_check},
	{NULL, NULL},
};
