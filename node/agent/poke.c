/* Waking the other ranks of a replica on the same host when this rank's
 * verification is recorded, so that they ask the tracker at once.
 *
 * A rank that verified a version waits for its siblings by polling the
 * tracker (agent_sync_period: a quarter of what it waited so far), so it
 * switched up to a poll period after the last sibling verified. Ranks of a
 * replica usually share a host: each binds an abstract unix datagram
 * socket named after the tracker, the replica and its rank, and once the
 * tracker has taken its verified report a rank sends the version to every
 * other rank's name. A rank that holds that version verified and waits
 * asks the tracker for the replica now. The poke carries no authority: the
 * switch still needs the tracker's answer and the siblings' signed
 * statements (agent_replica_backed), so a stray datagram costs one query
 * at most. Siblings on other hosts (or network namespaces) are not reached
 * and keep polling. */
#include "node/agent/internal.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The abstract name of rank's socket (length in *len). */
static void poke_name(const struct node_agent *a, uint32_t rank, struct sockaddr_un *sa,
		      socklen_t *len)
{
	uint8_t h[8];
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, sizeof(h));
	crypto_generichash_update(&st, (const uint8_t *)a->o.tracker_url,
				  strlen(a->o.tracker_url) + 1);
	crypto_generichash_update(&st, (const uint8_t *)a->o.replica, strlen(a->o.replica));
	crypto_generichash_final(&st, h, sizeof(h));
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	int n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "tessera-poke-%02x%02x%02x%02x"
			 "%02x%02x%02x%02x-%u", h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], rank);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void on_poke(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;
	const struct agent_version *cur = a->ver;
	uint8_t b[16];
	uint64_t v = 0;
	bool mine = false;
	ssize_t n;

	(void)what;
	while ((n = recv(fd, b, sizeof(b), MSG_DONTWAIT)) >= 0)
		if (n == (ssize_t)sizeof(v)) {
			memcpy(&v, b, sizeof(v));
			mine |= cur != NULL && agent_verified_stage(cur) && cur->version == v;
		}
	if (!mine)
		return;
	a->poke_asks++;
	LOG_DEBUG("node %s: a sibling rank's verification of v%" PRIu64 " was recorded: asking the "
		  "tracker for replica %s now", a->node_id, v, a->o.replica);
	if (a->syncing) /* its answer may predate the sibling's report: ask once more */
		node_arm(a->sync_ev, 1);
	else
		agent_sync_now(a);
}

/* How often, and how many times, a rank whose name another process holds
 * (a node of the same rank still going away) tries to bind it again. */
#define POKE_RETRY_MS 200u
#define POKE_TRIES 300u /* 60 s */

/* Binds and watches this rank's socket: 0, or a negative errno (nothing
 * left open). */
static int poke_bind(struct node_agent *a)
{
	struct sockaddr_un sa;
	socklen_t len;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	poke_name(a, a->o.rank, &sa, &len);
	if (bind(fd, (struct sockaddr *)&sa, len) != 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	if ((a->poke_ev = event_new(a->base, fd, EV_READ | EV_PERSIST, on_poke, a)) == NULL ||
	    event_add(a->poke_ev, NULL) != 0) {
		if (a->poke_ev != NULL)
			event_free(a->poke_ev);
		a->poke_ev = NULL;
		close(fd);
		return -ENOMEM;
	}
	return 0;
}

static void on_poke_retry(evutil_socket_t fd, short what, void *arg)
{
	struct node_agent *a = arg;

	(void)fd;
	(void)what;
	a->poke_tries++;
	int rc = poke_bind(a);
	if (rc == 0) {
		LOG_INFO("node %s: sibling wake-ups on: the name of rank %u was free after %u "
			 "tries", a->node_id, a->o.rank, a->poke_tries);
	} else if (rc == -EADDRINUSE && a->poke_tries < POKE_TRIES) {
		node_arm(a->poke_retry_ev, POKE_RETRY_MS);
	} else {
		LOG_INFO("node %s: no sibling wake-ups (%s after %u tries): this rank polls the "
			 "tracker", a->node_id, strerror(-rc), a->poke_tries);
	}
}

void agent_poke_open(struct node_agent *a)
{
	if (a->layout.nranks < 2 || a->o.tracker_url == NULL || a->o.replica == NULL)
		return;
	int rc = poke_bind(a);
	if (rc == 0 || rc != -EADDRINUSE)
		return; /* bound, or no socket at all here: it polls, as across hosts */
	/* Another process holds the name (a node of the same rank still
	 * going away): this one polls meanwhile and tries again. */
	LOG_DEBUG("node %s: the wake-up name of rank %u is taken: polling until it is free",
		  a->node_id, a->o.rank);
	a->poke_tries = 0;
	if (a->poke_retry_ev == NULL)
		a->poke_retry_ev = evtimer_new(a->base, on_poke_retry, a);
	if (a->poke_retry_ev != NULL)
		node_arm(a->poke_retry_ev, POKE_RETRY_MS);
}

void agent_poke_close(struct node_agent *a)
{
	if (a->poke_retry_ev != NULL)
		event_free(a->poke_retry_ev);
	a->poke_retry_ev = NULL;
	if (a->poke_ev == NULL)
		return;
	int fd = event_get_fd(a->poke_ev);

	event_free(a->poke_ev);
	a->poke_ev = NULL;
	close(fd);
}

void agent_poke_siblings(struct node_agent *a, uint64_t version)
{
	struct sockaddr_un sa;
	socklen_t len;

	if (a->poke_ev == NULL)
		return;
	for (uint32_t r = 0; r < a->layout.nranks; r++) {
		if (r == a->o.rank)
			continue;
		poke_name(a, r, &sa, &len);
		/* Not there (another host), or its queue full: it polls. */
		(void)sendto(event_get_fd(a->poke_ev), &version, sizeof(version), MSG_DONTWAIT,
			     (struct sockaddr *)&sa, len);
	}
}
