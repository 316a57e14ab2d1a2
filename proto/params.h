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
	/* Connections the tracker holds at once (lowered to its descriptor \
	 * limit); beyond it, the address holding the most loses its oldest \
	 * idle one. */ \
	X(TRACKER_CONNS, "TESSERA_TRACKER_CONNS", 4096, "tracker connection cap") \
	/* Time a client gets to send a request's whole head (request line \
	 * and headers) to the tracker, from its first byte. */ \
	X(HEADER_MS, "TESSERA_HEADER_MS", 10000, "tracker deadline for a request head, ms")

enum proto_param_id {
#define PROTO_PARAM_ENUM(id, env, def, doc) PROTO_PARAM_##id,
	PROTO_PARAMS(PROTO_PARAM_ENUM)
#undef PROTO_PARAM_ENUM
	PROTO_PARAM_COUNT
};

/* The value of a tunable: the environment's if set and a valid number, else
 * the default. Cheap after the first call; cannot fail. */
uint64_t proto_param(enum proto_param_id id);

#endif
