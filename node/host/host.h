/*
 * One tessera-node process for every rank its host holds.
 *
 * A rollout host with eight GPUs holds eight serving ranks: all ranks of a
 * TP8 replica, eight TP1 replicas, or anything between. One process serves
 * them all. The host owns what they share: the event loop (the caller's),
 * one tracker client (it keeps every rank's session), one fabric endpoint
 * (one provider per process, as in the one-rank agent) with the loop that
 * drives it, the metrics registry (the caller's: each rank's series carry
 * replica and rank labels, and each rank is a part of /healthz). Each rank
 * is a full node agent (node/agent/agent.h) with its own identity at the tracker
 * (replica, rank, node id, lease, statement key), its own store (a CUDA
 * store puts the i-th rank given on device i modulo the visible ones), memory
 * registrations, fetches, expose record and attach socket; the tracker
 * protocol is the one-rank agent's, so two-phase activation is unchanged:
 * a replica switches when all its ranks, in this process or in others,
 * hold the version verified, and none switches otherwise.
 *
 * Fabric completions reach the rank that posted them through the operation
 * (struct fab_op in the rank's own read structs). Two ranks of one process
 * share an endpoint address: a rank may read from another rank of the same
 * process like from any peer.
 */
#ifndef NODE_HOST_H
#define NODE_HOST_H

#include <event2/event.h>
#include <stdbool.h>
#include <stdint.h>

#include "node/agent/agent.h"
#include "proto/config.h"
#include "proto/util.h"

/* Ranks one process serves at most: the tracker client remembers 64 node
 * sessions (tracker/client/client.c), and a host holds far fewer GPUs. */
#define NODE_HOST_RANKS_MAX 64

/* One rank to serve. layout NULL: the process's --layout. */
struct node_host_rank {
	char replica[65]; /* TRK_REPLICA_MAX + 1 */
	uint32_t rank;
	char *layout;     /* owned; NULL: the default */
};

/* The ranks of a process, in the order given (node/host/host_ranks.c). */
struct node_host_ranks {
	struct node_host_rank *r;
	size_t n;
};

/*
 * Adds ranks of one replica: ranks is "R", "R-S" or a comma list of those
 * ("0,2-3"); layout NULL: the default. A bad replica name, a bad rank list,
 * more than NODE_HOST_RANKS_MAX ranks or a rank already listed for the
 * replica is refused with a one-line error; nothing is added then.
 */
int node_host_ranks_add(struct node_host_ranks *l, const char *replica, const char *ranks,
			const char *layout, struct proto_err *err);
/*
 * Adds a --serve list: items REPLICA/RANKS[@LAYOUT] separated by spaces or
 * semicolons ("A/0-3@tp4 B/0@tp1"), each as node_host_ranks_add. All or
 * nothing.
 */
int node_host_ranks_serve(struct node_host_ranks *l, const char *spec, struct proto_err *err);
/* Forgets every rank. */
void node_host_ranks_fini(struct node_host_ranks *l);

struct node_host;

/*
 * Opens the shared tracker client (tracker URL, cluster key, TLS CA of o)
 * and fabric endpoint (o->provider), makes one agent per rank of ranks
 * (o gives everything else; o->replica, o->rank, o->layout and
 * o->attach_path are replaced per rank: layout by the rank's own when it
 * has one, attach_path by o->attach_path itself for a single rank, else,
 * or when it ends in '/', by o->attach_path/<replica>-<rank>.sock), checks that the ranks of each
 * replica agree on their layout, then starts them all. On failure nothing
 * is left and err says why in one line.
 */
int node_host_new(struct event_base *base, const struct node_agent_opts *o,
		  const struct node_host_ranks *ranks, struct node_host **out,
		  struct proto_err *err);
/* Non-zero once a rank gave up (the host's base is then asked to exit);
 * err says which and why. */
int node_host_failed(const struct node_host *h, struct proto_err *err);
/* The version rank i (in the order given) serves now (0: none yet). */
uint64_t node_host_active(const struct node_host *h, size_t i);
/* Every rank tells the tracker it leaves (node_agent_leave); done(arg)
 * runs once, from the loop, when all have. */
void node_host_leave(struct node_host *h, void (*done)(void *arg), void *arg);
/* Stops every rank, closes the endpoint, frees the ranks, then the tracker
 * client. NULL is fine. */
void node_host_free(struct node_host *h);

/*
 * Sources queries of a host's ranks, batched (node/host/host_sources.c): those
 * asked during one loop turn leave as one POST /sources when it ends (an
 * older tracker is asked parcel by parcel). node_host_sources_ask has
 * trk_client_sources' contract (cb once, with the parcel's answer shaped as
 * the GET's, unless it fails). Free after the askers are gone: nothing
 * queued or in flight calls back then.
 */
struct node_host_sources;
struct trk_parcel_key;
int node_host_sources_new(struct event_base *base, struct trk_client *trk,
			  struct node_host_sources **out);
int node_host_sources_ask(void *ctx, const struct trk_parcel_key *k, trk_client_cb cb,
			  void *arg);
void node_host_sources_free(struct node_host_sources *hs);

/*
 * One version watch for a host's ranks (node/host/host_watch.c): ranks that ask
 * after the same version wait on one held watch and each hears its answer;
 * a rank behind the host asks alone. node_host_watch_ask has
 * trk_client_watch's contract. Free after the askers are gone.
 */
struct node_host_watch;
int node_host_watch_new(struct trk_client *trk, struct node_host_watch **out);
int node_host_watch_ask(void *ctx, uint64_t after, uint32_t wait_ms, trk_client_cb cb, void *arg);
void node_host_watch_free(struct node_host_watch *w);

/* tessera-node's values: --rank R (0..65535) and --install double|in-place.
 * 0, or -EINVAL with the reason in err (*rank, *inplace unchanged). */
int node_host_rank_parse(const char *v, uint64_t *rank, struct proto_err *err);
int node_host_install_parse(const char *v, bool *inplace, struct proto_err *err);

/* The checks of [node]'s values: the parsers tessera-node applies. */
extern const struct proto_config_value node_host_config_values[];

#endif
