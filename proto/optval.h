/*
 * Option values: one parser per kind of value a program option takes (rank
 * lists, HOST:PORT addresses, files that must exist, keys, numbers). A
 * program parses its flags with these at start-up, and `tessera config
 * check` and --config check a file's values with the very same functions,
 * so the check cannot drift from what the program accepts.
 *
 * The proto_optval_* functions have the shape of proto_config_check_fn:
 * (value, err) -> 0, or a negative errno with err holding the reason alone
 * ("want HOST:PORT"); the caller names where the value came from. They
 * keep nothing and cannot leave anything behind.
 */
#ifndef PROTO_OPTVAL_H
#define PROTO_OPTVAL_H

#include <stdint.h>

#include "proto/util.h"

/*
 * The next item of a rank list ("0-3,5"): R or R-S, digits only, each at
 * most max, S >= R. Reads from *p and moves it past the item and its comma.
 * Returns 1 with the item in *lo..*hi, 0 at the end of the list (an empty
 * list has no item: 0 at once), -EINVAL for a malformed item (an empty item
 * between commas or after a trailing comma included).
 */
int proto_ranks_next(const char **p, uint64_t max, uint64_t *lo, uint64_t *hi);

/* "HOST:PORT" or "[V6]:PORT", port 0..65535, host 1..hlen-1 bytes: host
 * and port filled. -EINVAL otherwise (host and port then unspecified). */
int proto_hostport_parse(const char *spec, char *host, size_t hlen, uint16_t *port);

/* A non-empty rank list, ranks 0..65535. */
int proto_optval_ranks(const char *v, struct proto_err *err);
/* HOST:PORT. */
int proto_optval_hostport(const char *v, struct proto_err *err);
/* A regular file that can be read. */
int proto_optval_file(const char *v, struct proto_err *err);
/* A directory that exists. */
int proto_optval_dir(const char *v, struct proto_err *err);
/* A trainer public key, a trainer secret key, a cluster key: each read
 * with the loader the programs use (the secret bytes are wiped). */
int proto_optval_pubkey(const char *v, struct proto_err *err);
int proto_optval_secret_key(const char *v, struct proto_err *err);
int proto_optval_cluster_key(const char *v, struct proto_err *err);
/* A serving layout: a layout file that exists, or a built-in (tpN, fsdpN). */
int proto_optval_layout(const char *v, struct proto_err *err);
/* A whole number 0 .. 2^64-1. */
int proto_optval_u64(const char *v, struct proto_err *err);

#endif
