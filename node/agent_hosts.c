/* Pacing per source host: one rate, window and silence for all the reads a
 * node has out to one host, whatever parcel or version they are for. */
#include "node/agent_internal.h"

/*
 * A node reads several parcels from one host (a publisher hosting several
 * trainer ranks, a peer serving every parcel of its rank) over that host's
 * one link. Paced per parcel, each source measured a share of the link,
 * started unmeasured with every new parcel or version, and could look
 * silent while the link was busy with the host's other parcels. So every
 * source of one host shares one pacing record: the bytes in flight to the
 * host, its measured rate (hence the window and the patience,
 * agent_fetch.c) and when it last delivered. Records outlive source lists
 * and versions (the next version starts at the measured rate); reads
 * account to the record they were posted against, so a read that lands
 * after its fetch was dropped still gives its bytes back.
 *
 * A host is named by the host name the source registered with and what
 * runs there: the publisher's id, or the node's replica (one host runs
 * every rank of a replica). Processes that share a host name without
 * sharing a link (a cluster on one machine's loopback) are still told
 * apart this way.
 */
#define HOSTS_MAX 256 /* hosts paced apart; the others pace per source */

static void host_group(const struct trk_source *info, char *out, size_t len)
{
	const char *slash = info->peer ? strrchr(info->id, '/') : NULL;
	int n = slash != NULL ? (int)(slash - info->id) : (int)strlen(info->id);

	snprintf(out, len, "%.*s", n, info->id);
}

struct agent_source *agent_host_pace(struct node_agent *a, const struct trk_source *info)
{
	char group[TRK_ID_MAX];

	host_group(info, group, sizeof(group));
	for (uint32_t i = 0; i < a->nhosts; i++) {
		struct agent_source *h = &a->hosts[i];
		if (h->info.peer == info->peer && strcmp(h->info.host, info->host) == 0 &&
		    strcmp(h->info.id, group) == 0)
			return h;
	}
	if (a->nhosts == HOSTS_MAX)
		return NULL;
	if (a->hosts == NULL && (a->hosts = calloc(HOSTS_MAX, sizeof(*a->hosts))) == NULL)
		return NULL;
	struct agent_source *h = &a->hosts[a->nhosts++];
	h->info.peer = info->peer;
	snprintf(h->info.host, sizeof(h->info.host), "%s", info->host);
	snprintf(h->info.id, sizeof(h->info.id), "%s", group);
	return h;
}

void agent_hosts_fini(struct node_agent *a)
{
	free(a->hosts);
	a->hosts = NULL;
	a->nhosts = 0;
}
