/* Which local interface a fabric endpoint binds: the one named, else the route to the tracker. */
#include "node/base/fabiface.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/http.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/log.h"

/* Providers that bind an IP address (fi_getinfo's node, FI_SOURCE). */
static bool takes_ip(const char *provider)
{
	return strstr(provider, "tcp") != NULL || strstr(provider, "verbs") != NULL ||
	       strstr(provider, "udp") != NULL || strstr(provider, "sockets") != NULL;
}

static bool ntop(const struct sockaddr *sa, char *buf, size_t cap)
{
	const void *a = sa->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
						 : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;

	return inet_ntop(sa->sa_family, a, buf, (socklen_t)cap) != NULL;
}

static bool same_addr(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
			      &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr)) == 0;
	return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
		      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
}

static bool ip_family(const struct ifaddrs *i)
{
	return i->ifa_addr != NULL &&
	       (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6);
}

/* The address of the interface named iface: its first IPv4 one, else its
 * first IPv6 one that is not link-local. */
static int by_name(const char *iface, struct node_fabiface *out, struct proto_err *err)
{
	struct ifaddrs *all = NULL, *best = NULL;
	char names[256] = "";
	size_t used = 0;
	bool exists = false;

	if (getifaddrs(&all) != 0)
		return proto_errf(err, errno, "--fabric-iface %s: cannot list interfaces: %s", iface,
				  strerror(errno));
	for (struct ifaddrs *i = all; i != NULL; i = i->ifa_next) {
		if (i->ifa_name == NULL)
			continue;
		if (strcmp(i->ifa_name, iface) != 0) {
			if (ip_family(i) && strstr(names, i->ifa_name) == NULL && used + 32 < sizeof(names))
				used += (size_t)snprintf(names + used, sizeof(names) - used, "%s%s",
							 used ? ", " : "", i->ifa_name);
			continue;
		}
		exists = true;
		if (!ip_family(i))
			continue;
		if (i->ifa_addr->sa_family == AF_INET6 &&
		    IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr))
			continue;
		if (best == NULL || (best->ifa_addr->sa_family == AF_INET6 &&
				     i->ifa_addr->sa_family == AF_INET))
			best = i;
	}
	int rc = 0;
	if (best == NULL)
		rc = exists ? proto_errf(err, ENODEV, "--fabric-iface %s: the interface has no IP address",
					 iface)
			    : proto_errf(err, ENODEV,
					 "--fabric-iface %s: no such network interface here (those with an "
					 "address: %s)",
					 iface, names[0] ? names : "none");
	else if (!ntop(best->ifa_addr, out->addr, sizeof(out->addr)))
		rc = proto_errf(err, EINVAL, "--fabric-iface %s: an address that cannot be printed", iface);
	else
		snprintf(out->name, sizeof(out->name), "%s", iface);
	freeifaddrs(all);
	return rc;
}

/* The interface holding the address sa; "" when none does. */
static void name_of(const struct sockaddr *sa, char *name, size_t cap)
{
	struct ifaddrs *all = NULL;

	name[0] = '\0';
	if (getifaddrs(&all) != 0)
		return;
	for (struct ifaddrs *i = all; i != NULL; i = i->ifa_next)
		if (ip_family(i) && i->ifa_name != NULL && same_addr(i->ifa_addr, sa)) {
			snprintf(name, cap, "%s", i->ifa_name);
			break;
		}
	freeifaddrs(all);
}

/* The local address of the route to the tracker's host (the first of a
 * list): a UDP socket connected to it sends nothing, the kernel only picks
 * the source. */
static bool by_route(const char *tracker_url, struct node_fabiface *out)
{
	char first[1024];

	snprintf(first, sizeof(first), "%.*s", (int)strcspn(tracker_url, ","), tracker_url);
	struct evhttp_uri *u = evhttp_uri_parse(first);
	const char *host = u ? evhttp_uri_get_host(u) : NULL;
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM}, *res = NULL;
	struct sockaddr_storage local;
	char h[256];
	bool found = false;

	if (host == NULL || host[0] == '\0' || strlen(host) >= sizeof(h)) {
		if (u != NULL)
			evhttp_uri_free(u);
		return false;
	}
	/* An IPv6 literal comes in brackets. */
	snprintf(h, sizeof(h), "%s", host[0] == '[' ? host + 1 : host);
	if (host[0] == '[' && strlen(h) > 0)
		h[strlen(h) - 1] = '\0';
	evhttp_uri_free(u);
	if (getaddrinfo(h, "9", &hints, &res) != 0)
		return false;
	for (struct addrinfo *a = res; a != NULL && !found; a = a->ai_next) {
		socklen_t len = sizeof(local);
		int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			continue;
		found = connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
			getsockname(fd, (struct sockaddr *)&local, &len) == 0 &&
			(local.ss_family == AF_INET || local.ss_family == AF_INET6) &&
			ntop((struct sockaddr *)&local, out->addr, sizeof(out->addr));
		close(fd);
	}
	freeaddrinfo(res);
	if (found)
		name_of((struct sockaddr *)&local, out->name, sizeof(out->name));
	return found;
}

int node_fabiface_pick(const char *provider, const char *iface, const char *tracker_url,
		       struct node_fabiface *out, struct proto_err *err)
{
	int rc;

	*out = (struct node_fabiface){.why = "the provider's choice"};
	if (!takes_ip(provider)) {
		if (iface != NULL)
			return proto_errf(err, EINVAL,
					  "--fabric-iface %s: fabric provider \"%s\" binds no IP "
					  "interface",
					  iface, provider);
		return 0;
	}
	/* verbs and the like bind their RDMA interface's address, which the
	 * route to the tracker (often over ethernet) need not be. */
	if (iface == NULL && strstr(provider, "tcp") == NULL)
		return 0;
	/* libfabric's own choice of a tcp interface, when someone set it,
	 * outranks the route to the tracker (a cluster whose tracker sits on a
	 * management network sets it, or --fabric-iface, to the data one). */
	const char *why = "--fabric-iface";
	if (iface == NULL && strstr(provider, "tcp") != NULL && getenv("FI_TCP_IFACE") != NULL &&
	    getenv("FI_TCP_IFACE")[0] != 0) {
		iface = getenv("FI_TCP_IFACE");
		why = "FI_TCP_IFACE";
	}
	if (iface != NULL) {
		if ((rc = by_name(iface, out, err)) != 0) {
			*out = (struct node_fabiface){.why = "the provider's choice"};
			return rc;
		}
		out->why = why;
	} else if (by_route(tracker_url, out)) {
		out->why = "the route to the tracker";
	} else {
		*out = (struct node_fabiface){.why = "the provider's choice"};
		LOG_WARN("fabric: no route to the tracker %s found yet: the endpoint binds the "
			 "provider's first interface (--fabric-iface NAME chooses one)",
			 tracker_url);
		return 0;
	}
	LOG_NOTE("fabric: binding %s (%s, %s)", out->addr, out->name[0] ? out->name : "?",
		 out->why);
	return 0;
}
