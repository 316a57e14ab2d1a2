/* Pacing per source host: one rate, window and silence for all the reads a
 * node has out to one host, whatever parcel or version they are for. */
#include "node/agent/agent_internal.h"

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

/*
 * Warm connections. A source's fabric handle lived as long as its source
 * list: every version's first read to the publisher and to each peer
 * opened a new connection (tcp;ofi_rxm connects on the first message, a
 * handshake each way; behind a busy link's queue it waits with the data),
 * and a delta of a few MB paid those round trips again every version. So
 * the node holds one more handle per source address it reached (the same
 * peer, the same connection), kept across versions and given back when a
 * read from that address fails (the provider dropped the connection: the
 * next insert must connect afresh), when WARM_MAX addresses are held (the
 * least recently reached one), and with the endpoint (fab_close).
 */
#define WARM_MAX 64

struct agent_warm {
	uint8_t addr[FAB_ADDR_MAX];
	size_t len;
	fi_addr_t fa;
	fi_addr_t hfa;  /* on a->hfab (have-pages), when hfa_ok */
	bool hfa_ok;
	uint64_t used; /* a->warm_clock when last reached */
};

static struct agent_warm *warm_find(const struct node_agent *a, const struct agent_source *s)
{
	for (uint32_t i = 0; i < a->nwarm; i++)
		if (a->warm[i].len == s->info.fabric_addr_len &&
		    memcmp(a->warm[i].addr, s->info.fabric_addr, a->warm[i].len) == 0)
			return &a->warm[i];
	return NULL;
}

static void warm_remove(struct node_agent *a, struct agent_warm *w)
{
	if (a->fab != NULL)
		fab_av_remove(a->fab, w->fa);
	if (w->hfa_ok && a->hfab != NULL)
		fab_av_remove(a->hfab, w->hfa);
	*w = a->warm[--a->nwarm];
}

void agent_warm_hold(struct node_agent *a, const struct agent_source *s)
{
	struct agent_warm *w;

	if (a->fab == NULL || s->info.fabric_addr == NULL || s->info.fabric_addr_len == 0 ||
	    s->info.fabric_addr_len > FAB_ADDR_MAX)
		return;
	if ((w = warm_find(a, s)) != NULL) {
		w->used = ++a->warm_clock;
		return;
	}
	if (a->warm == NULL && (a->warm = calloc(WARM_MAX, sizeof(*a->warm))) == NULL)
		return;
	if (a->nwarm == WARM_MAX) {
		struct agent_warm *old = &a->warm[0];
		for (uint32_t i = 1; i < a->nwarm; i++)
			if (a->warm[i].used < old->used)
				old = &a->warm[i];
		warm_remove(a, old);
	}
	w = &a->warm[a->nwarm];
	if (fab_av_insert(a->fab, s->info.fabric_addr, s->info.fabric_addr_len, &w->fa) != 0)
		return;
	memcpy(w->addr, s->info.fabric_addr, s->info.fabric_addr_len);
	w->len = s->info.fabric_addr_len;
	w->hfa_ok = false;
	w->used = ++a->warm_clock;
	a->nwarm++;
}

/*
 * Have-pages over an endpoint of their own. tcp;ofi_rxm answers the reads
 * of one connection in order, so a peer's have-page waited behind every
 * chunk it was serving us on that connection: up to TESSERA_PEER_INFLIGHT
 * chunks, drained at our share of the peer's uplink. Measured (8 nodes,
 * 100 Mbit/s netns): a chunk verified at a peer was posted by its readers
 * 103/230/496 ms later (quartiles), most of it such waits. So the host
 * opens a second endpoint (node/host.c) and every peer address we reach
 * gets a handle on it too, kept with the address's warm handle (given back
 * with it: a failure, the least recently used going, the endpoint): a
 * connection per peer that carries nothing but pages. The peer serves both
 * connections from its one endpoint; what is left shared is the links'
 * queues.
 */
int agent_have_addr(struct node_agent *a, struct agent_source *s, fi_addr_t *out)
{
	struct agent_warm *w;

	if (a->hfab == NULL || a->hfab == a->fab) {
		*out = s->fa;
		return 0;
	}
	if ((w = warm_find(a, s)) == NULL) {
		agent_warm_hold(a, s);
		w = warm_find(a, s);
	}
	if (w == NULL || (!w->hfa_ok && fab_av_insert(a->hfab, w->addr, w->len, &w->hfa) != 0)) {
		s->bad_until_ms = agent_now_ms() + BAD_SOURCE_MS;
		return w == NULL ? -ENOMEM : -EINVAL;
	}
	w->hfa_ok = true;
	w->used = ++a->warm_clock;
	*out = w->hfa;
	return 0;
}

void agent_warm_drop(struct node_agent *a, const struct agent_source *s)
{
	struct agent_warm *w = s->info.fabric_addr != NULL ? warm_find(a, s) : NULL;

	if (w != NULL)
		warm_remove(a, w);
}

void agent_warm_fini(struct node_agent *a)
{
	while (a->nwarm > 0)
		warm_remove(a, &a->warm[a->nwarm - 1]);
	free(a->warm);
	a->warm = NULL;
}

uint32_t agent_warm_count(const struct node_agent *a)
{
	return a->nwarm;
}

void agent_hosts_fini(struct node_agent *a)
{
	free(a->hosts);
	a->hosts = NULL;
	a->nhosts = 0;
}
