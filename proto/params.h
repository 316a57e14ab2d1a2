/*
 * Every tunable of tessera in one table: its environment variable, default
 * and meaning. Read them with proto_param(); nothing else reads getenv() for
 * tuning.
 */
#ifndef PROTO_PARAMS_H
#define PROTO_PARAMS_H

#include <stdint.h>

/* X(id, environment variable, default, doc) */
#define PROTO_PARAMS(X)                                                          \
	/* Bytes per chunk: the unit of hashing, transfer and peer exchange. */ \
	X(CHUNK_SIZE, "TESSERA_CHUNK_SIZE", 4u << 20,                             \
	  "bytes per chunk inside a parcel")                                      \
	/* Chunk reads a node keeps in flight across all its sources. */        \
	X(INFLIGHT, "TESSERA_INFLIGHT", 16, "chunk transfers in flight per node") \
	/* Largest manifest a decoder accepts, before any allocation. */        \
	X(MANIFEST_MAX, "TESSERA_MANIFEST_MAX", 64u << 20,                        \
	  "largest manifest accepted, bytes")                                     \
	/* Largest spec (model/layout JSON) file accepted. */                   \
	X(SPEC_MAX, "TESSERA_SPEC_MAX", 64u << 20, "largest spec file, bytes")    \
	/* Node lease at the tracker; heartbeats come at a third of it. */      \
	X(LEASE_MS, "TESSERA_LEASE_MS", 6000, "node lease at the tracker, ms")    \
	/* Window in which an authenticated request's timestamp is accepted. */ \
	X(AUTH_WINDOW_S, "TESSERA_AUTH_WINDOW_S", 30,                             \
	  "accepted clock skew for signed requests, s")                           \
	/* Long-poll timeout for watching versions. */                          \
	X(WATCH_MS, "TESSERA_WATCH_MS", 2000, "long-poll wait for new versions, ms") \
	/* A node that has received nothing for this long since a read was    \
	 * posted abandons it and fetches it elsewhere (3x before a version's \
	 * first bytes). On slow congested TCP links a flow can be silent for \
	 * seconds (retransmission backoff): raise it there. */                \
	X(STALL_MS, "TESSERA_STALL_MS", 3000, "no-progress timeout for in-flight reads, ms") \
	/* A node's cap on fetching, megabits per second (0: none), so pulling \
	 * a version leaves room for the serving traffic on the same link. */ \
	X(FETCH_MBPS, "TESSERA_FETCH_MBPS", 0, "node fetch rate cap, Mbit/s (0: none)") \
	/* Threads a node uses to hash and place fetched chunks. */ \
	X(VERIFY_THREADS, "TESSERA_VERIFY_THREADS", 1, "chunk verification threads per node") \
	/* A fabric post the provider keeps refusing fails after this long. */ \
	X(PARK_MS, "TESSERA_PARK_MS", 3000, "give up a post an unreachable peer refuses, ms") \
	/* Ranks of a replica holding different versions for longer than this   \
	 * (or than the replica's last fetch took, if longer) are reported on  \
	 * the status page and in the tracker's log. */                        \
	X(DISAGREE_MS, "TESSERA_DISAGREE_MS", 2000, "report replica ranks disagreeing after, ms") \
	/* Versions a publisher serves at most: the newest, then the newest of  \
	 * those the tracker still lists as retained (replica targets). Older \
	 * ones are withdrawn and freed; replicas aiming at them retarget. */  \
	X(PUB_RETAIN, "TESSERA_PUB_RETAIN", 4, "versions a publisher serves at most") \
	/* How often a publisher asks the tracker which versions to keep serving. */ \
	X(PUB_CHECK_MS, "TESSERA_PUB_CHECK_MS", 1000, "publisher retain check period, ms") \
	/* Largest safetensors header (JSON) accepted, before any allocation. */ \
	X(ST_HEADER_MAX, "TESSERA_ST_HEADER_MAX", 100000000, "largest safetensors header, bytes") \
	/* Largest delta header (tables and child header) accepted. */ \
	X(DELTA_HEADER_MAX, "TESSERA_DELTA_HEADER_MAX", 256u << 20, "largest delta header, bytes") \
	/* Elements per delta chunk: the unit of zstd frames and apply threads. */ \
	X(DELTA_CHUNK, "TESSERA_DELTA_CHUNK", 1u << 22, "elements per delta chunk") \
	/* zstd level of delta streams (see proto/delta.h for the measurements). */ \
	X(DELTA_LEVEL, "TESSERA_DELTA_LEVEL", 1, "zstd level of delta streams") \
	/* Serving processes attached to one node at once (node/attach.h). */ \
	X(ATTACH_CLIENTS, "TESSERA_ATTACH_CLIENTS", 256, "attached serving clients per node") \
	/* Versions one attached client may hold pinned at once (one per \
	 * running request); more is refused, the client stays attached. */ \
	X(ATTACH_PINS, "TESSERA_ATTACH_PINS", 65536, "pins one attached client may hold") \
	/* Bytes a node queues for a client that does not read; past it the \
	 * client is dropped (and its pins with it). */ \
	X(ATTACH_OUT_MAX, "TESSERA_ATTACH_OUT_MAX", 256u << 20, "unread bytes queued per attached client")

enum proto_param_id {
#define PROTO_PARAM_ENUM(id, env, def, doc) PROTO_PARAM_##id,
	PROTO_PARAMS(PROTO_PARAM_ENUM)
#undef PROTO_PARAM_ENUM
	PROTO_PARAM_COUNT
};

/* The value of a tunable: the environment's if set and a valid number, else
 * the configuration file's ([params], see proto/config.h) if it named it,
 * else the default. Cannot fail. */
uint64_t proto_param(enum proto_param_id id);

/* Where proto_param() takes a value from. */
enum proto_param_source {
	PROTO_PARAM_FROM_DEFAULT,
	PROTO_PARAM_FROM_FILE,
	PROTO_PARAM_FROM_ENV,
};

/* The tunable's name in a configuration file: its id in lower case
 * ("chunk_size"); its environment variable; its one-line doc; its default;
 * the least value accepted (0 only where the default is 0, which means
 * "none"). Cannot fail. */
const char *proto_param_name(enum proto_param_id id);
const char *proto_param_env(enum proto_param_id id);
const char *proto_param_doc(enum proto_param_id id);
uint64_t proto_param_default(enum proto_param_id id);
uint64_t proto_param_min(enum proto_param_id id);
enum proto_param_source proto_param_source(enum proto_param_id id);

/* The id named name (as proto_param_name() spells it); -ENOENT if none. */
int proto_param_find(const char *name, enum proto_param_id *id);
/* Sets the file's value of a tunable (below the environment); clear drops
 * every file value. Call before starting threads. Cannot fail. */
void proto_param_set_file(enum proto_param_id id, uint64_t v);
void proto_param_clear_file(void);

#endif
