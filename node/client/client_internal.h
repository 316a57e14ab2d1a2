/* What libtessera-client offers tessera's own tests and fuzz targets, not
 * serving engines (tessera_client.h is their API). */
#ifndef NODE_CLIENT_INTERNAL_H
#define NODE_CLIENT_INTERNAL_H

#include <stdint.h>

#include "node/client/tessera_client.h"

/*
 * tessera_attach_flags over the connections connect(arg) makes (each a
 * connected stream socket the client then owns, or a negative errno),
 * instead of connecting to a socket path: once, and once more when the
 * node speaks only protocol 2. The fuzz target hands it socket pairs its
 * fake node has already written to, so that no thread and no listening
 * socket stand between the input and the client's frame parsers.
 */
int tsr__attach_with(int (*connect)(void *arg), void *arg, const char *replica, uint32_t rank,
		     int timeout_ms, unsigned flags, tessera_client **out, char *err, size_t errlen);

#endif
