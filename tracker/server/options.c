/* tessera-tracker's option values: the check of each [tracker] key, the
 * parser the tracker applies to its flag (trk_config_values). */
#include "proto/optval.h"
#include "tracker/tracker.h"

const struct proto_config_value trk_config_values[] = {
	{"listen", trk_listen_check},
	{"cluster-key", proto_optval_cluster_key},
	{"trainer-pubkey", proto_optval_pubkey},
	{"tls-cert", proto_optval_file},
	{"tls-key", proto_optval_file},
	{NULL, NULL},
};
