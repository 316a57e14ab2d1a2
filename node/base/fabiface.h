/* Which local interface a node's or a publisher's fabric endpoint binds. */
#ifndef NODE_FABIFACE_H
#define NODE_FABIFACE_H

#include <stddef.h>

#include "proto/util.h"

/* Room for a numeric address and an interface name. */
#define NODE_FABIFACE_ADDR_MAX 64
#define NODE_FABIFACE_NAME_MAX 64

struct node_fabiface {
	char addr[NODE_FABIFACE_ADDR_MAX]; /* numeric; "" lets the provider choose */
	char name[NODE_FABIFACE_NAME_MAX]; /* the interface holding it; "" if unknown */
	const char *why;                   /* "--fabric-iface", "the route to the tracker", ... */
};

/*
 * The address an endpoint of provider binds: the first address of the
 * interface iface (IPv4 first) when iface is not NULL, else the local
 * interface FI_TCP_IFACE names (libfabric's own variable, when set, for
 * tcp providers), else the
 * address of the route to the tracker at tracker_url (a UDP socket
 * connected to it says which), so that a node whose tracker is on loopback
 * binds loopback and one whose tracker is across a network binds the
 * interface that reaches it (tcp providers; verbs binds its RDMA
 * interface, which that route need not reach, so it takes only iface).
 * Providers that take no IP address (shm, efa) get "" (their own choice); so does a tracker whose address cannot be
 * resolved yet (said at warn; the tracker client reports the host itself).
 * Returns 0, or a negative errno with a one-line err and *out = {""}:
 * -ENODEV when iface names no interface here (the line lists those that
 * exist) or one without an address, -EINVAL when iface is given for a
 * provider without IP addresses. Logs the choice at info.
 */
int node_fabiface_pick(const char *provider, const char *iface, const char *tracker_url,
		       struct node_fabiface *out, struct proto_err *err);

#endif
