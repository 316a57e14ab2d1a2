/*
 * Every tunable of tessera in one table: its environment variable, default
 * and meaning. Read them with proto_param(); nothing else reads getenv() for
 * tuning. proto/PARAMS.md is this table as `tessera config params` prints it
 * (regenerate it after a change here); measurements behind the defaults are
 * in proto/NOTES.md.
 */
#ifndef PROTO_PARAMS_H
#define PROTO_PARAMS_H

#include <stdint.h>

/* X(id, environment variable, default, doc) */
#define PROTO_PARAMS(X)                                                          \
	/* Bytes per chunk: the unit of hashing, transfer and peer exchange, and \
	 * the fanout's pipeline step (a peer relays a chunk once it holds all of \
	 * it). Smaller chunks cross the swarm sooner; larger ones cost less CPU \
	 * and manifest per byte (proto/NOTES.md measures both). A node's value is \
	 * also the largest chunk it accepts: nodes need at least their publisher's. */ \
	X(CHUNK_SIZE, "TESSERA_CHUNK_SIZE", 1u << 17,                             \
	  "bytes per chunk inside a parcel")                                      \
	/* Chunk reads a node keeps in flight at most, across all its sources \
	 * (each source gets what its measured rate needs, see FETCH_TARGET_MS). \
	 * The node's read buffers are this times two times TESSERA_CHUNK_SIZE: \
	 * with larger chunks, fewer. */ \
	X(INFLIGHT, "TESSERA_INFLIGHT", 128, "most chunk transfers in flight per node") \
	/* A source's read window: its measured byte rate times this (at least \
	 * two chunks): enough to keep its link busy, little queued behind. */ \
	X(FETCH_TARGET_MS, "TESSERA_FETCH_TARGET_MS", 1000, "bytes in flight per source, as ms of its rate") \
	/* Largest manifest a decoder accepts, before any allocation. */        \
	X(MANIFEST_MAX, "TESSERA_MANIFEST_MAX", 64u << 20,                        \
	  "largest manifest accepted, bytes")                                     \
	/* Largest spec (model/layout JSON) file accepted. */                   \
	X(SPEC_MAX, "TESSERA_SPEC_MAX", 64u << 20, "largest spec file, bytes")    \
	/* Node lease at the tracker; heartbeats come at a third of it. */      \
	X(LEASE_MS, "TESSERA_LEASE_MS", 6000, "node lease at the tracker, ms")    \
	/* A node's heartbeats leave from their own thread (node/host/beat.h), so a \
	 * loop busy for seconds keeps its leases; one that has not run for \
	 * this long is taken as hung and its heartbeats stop. */              \
	X(HEARTBEAT_STALL_MS, "TESSERA_HEARTBEAT_STALL_MS", 60000,                \
	  "a node loop silent this long gets no more heartbeats, ms")             \
	/* Window in which an authenticated request's timestamp is accepted. */ \
	X(AUTH_WINDOW_S, "TESSERA_AUTH_WINDOW_S", 30,                             \
	  "accepted clock skew for signed requests, s")                           \
	/* Long-poll timeout for watching versions: a new version answers a \
	 * watch at once, so this only sets how often an idle node asks again \
	 * (the tracker ends each somewhere in its last tenth). */              \
	X(WATCH_MS, "TESSERA_WATCH_MS", 25000, "long-poll wait for new versions, ms") \
	/* Largest answer a tracker client takes to a query whose answer lists \
	 * the cluster (sources, holders, layouts, replicas, status); answers of \
	 * a fixed shape have smaller caps of their own (tracker/client/bounds.c). */ \
	X(TRACKER_ANSWER_MAX, "TESSERA_TRACKER_ANSWER_MAX", 16u << 20,            \
	  "largest tracker answer listing the cluster, bytes")                  \
	/* A source with reads in flight that completes none for this long, or \
	 * four times what its window takes at its measured rate if longer (3x \
	 * this before it delivered anything), is silent: its reads move to \
	 * another source when the parcel has one. */                          \
	X(STALL_MS, "TESSERA_STALL_MS", 3000, "least no-progress time before a source is silent, ms") \
	/* A node's cap on fetching, megabits per second (0: none), so pulling \
	 * a version leaves room for the serving traffic on the same link. */ \
	X(FETCH_MBPS, "TESSERA_FETCH_MBPS", 0, "node fetch rate cap, Mbit/s (0: none)") \
	/* Most chunks one read from a publisher takes: consecutive chunks of a \
	 * parcel that are the node's to take from it, as many as its measured \
	 * rate moves in about a millisecond (a fast link: 4 GB/s is 30 chunks \
	 * of 128 KiB), so that fewer, larger reads cost both sides less CPU per \
	 * byte. On links below about 1 GB/s a read stays one chunk, the \
	 * fanout's step. 1: one chunk a read always (node/fetch/NOTES.md). */ \
	X(READ_CHUNKS, "TESSERA_READ_CHUNKS", 8, "most chunks per read from a publisher on a fast link") \
	/* Threads a node uses to hash and place fetched chunks; 0: two where \
	 * the machine has two cores or more, else one (node/fetch/verifier.c). */ \
	X(VERIFY_THREADS, "TESSERA_VERIFY_THREADS", 0, "chunk verification threads per node (0: min(2, cores))") \
	/* A fabric post the provider keeps refusing fails after this long. */ \
	X(PARK_MS, "TESSERA_PARK_MS", 3000, "give up a post an unreachable peer refuses, ms") \
	/* A tcp fabric endpoint's port (fabric/conns.c): a connection that has \
	 * not completed the provider's handshake (we never answered it) is \
	 * closed after this long; a peer's handshake takes milliseconds. */ \
	X(FAB_HANDSHAKE_MS, "TESSERA_FAB_HANDSHAKE_MS", 10000, "a connection to a fabric port that has not completed its handshake is closed after, ms") \
	/* Connections still in the handshake an endpoint keeps at most: beyond \
	 * it the oldest of the address holding the most are closed first. */ \
	X(FAB_PENDING_MAX, "TESSERA_FAB_PENDING_MAX", 64, "most connections in the handshake per fabric endpoint") \
	/* Connections to an endpoint's port from one address at most, and in \
	 * all: beyond either, that address's (the busiest's) connections are \
	 * closed, those in the handshake first, then the longest idle. */ \
	X(FAB_CONNS_PER_ADDR, "TESSERA_FAB_CONNS_PER_ADDR", 256, "most connections to a fabric endpoint from one address") \
	X(FAB_CONNS_MAX, "TESSERA_FAB_CONNS_MAX", 4096, "most connections to a fabric endpoint in all") \
	/* Ranks of a replica holding different versions for longer than this   \
	 * (or than the replica's last fetch took, if longer) are reported on  \
	 * the status page and in the tracker's log. */                        \
	X(DISAGREE_MS, "TESSERA_DISAGREE_MS", 2000, "report replica ranks disagreeing after, ms") \
	/* A replica on its way to a version counts as updating, not behind, \
	 * until the oldest version it lacks is this old (or as old as its own \
	 * last update took, if longer); the status page says so. */          \
	X(UPDATING_MS, "TESSERA_UPDATING_MS", 5000, "a replica mid-fetch is updating, not behind, for this long, ms") \
	/* A replica whose fetching ranks' bytes have not grown for this long \
	 * is shown behind for want of progress. */                           \
	X(NO_PROGRESS_MS, "TESSERA_NO_PROGRESS_MS", 5000, "a replica fetching nothing new this long shows stalled, ms") \
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
	/* zstd level of delta streams (measurements: proto/delta.h). */ \
	X(DELTA_LEVEL, "TESSERA_DELTA_LEVEL", 1, "zstd level of delta streams") \
	/* Threads a publisher encodes each parcel's delta on (its chunks \
	 * spread over them), and gathers, hashes and scores each trainer rank's \
	 * anchor parcels on (stripes of 16 chunks); 0: the online CPUs shared \
	 * by the trainer ranks at work at once, at least one, at most 8. */ \
	X(DELTA_THREADS, "TESSERA_DELTA_THREADS", 0, "publisher: threads per trainer rank's encode or gather (0: CPUs / ranks)") \
	/* Whether the buffers a process makes once and reuses (the publisher's \
	 * snapshot blocks and export buffers, a node's swarm and staging \
	 * buffers) ask the kernel for transparent huge pages (madvise): fewer \
	 * faults and TLB misses. 0: 4 KiB pages (each first touch a fault). */ \
	X(HUGE_PAGES, "TESSERA_HUGE_PAGES", 1, "ask for huge pages in reused buffers (1) or not (0)") \
	/* A node that has waited this long (for the tracker, a first version, \
	 * the rest of its replica) says so at the default log level, then at \
	 * most once per this period while the wait lasts. */ \
	X(WAIT_NOTICE_MS, "TESSERA_WAIT_NOTICE_MS", 10000, "say what a node waits for after, ms") \
	/* Connections the tracker holds at once (lowered to its descriptor \
	 * limit); beyond it, the address holding the most loses its oldest \
	 * idle one. */ \
	X(TRACKER_CONNS, "TESSERA_TRACKER_CONNS", 4096, "tracker connection cap") \
	/* Time a client gets to send a request's whole head (request line \
	 * and headers) to the tracker, from its first byte. */ \
	X(HEADER_MS, "TESSERA_HEADER_MS", 10000, "tracker deadline for a request head, ms") \
	/* Connections the tracker holds from one peer address (an IPv6 /64 \
	 * counts as one); beyond it, that address loses its idle and \
	 * unauthenticated ones first. A host's node agents hold a few each. */ \
	X(TRACKER_CONNS_PER_ADDR, "TESSERA_TRACKER_CONNS_PER_ADDR", 1024, "tracker connections per peer address") \
	/* Time a client gets to send a request's body to the tracker, from \
	 * its head (a 64 MiB manifest at 1 MB/s); an answer not all read \
	 * this long after a held request's longest wait closes it too. */ \
	X(TRACKER_BODY_MS, "TESSERA_TRACKER_BODY_MS", 90000, "tracker deadline for a request body, ms") \
	/* Connections the kernel queues for the tracker before it accepts them \
	 * (capped at somaxconn). A long queue absorbs a large cluster's bursts but \
	 * lets a connection flood queue ahead of members (proto/NOTES.md); raise \
	 * it for thousands of nodes on a trusted control network. */ \
	X(LISTEN_BACKLOG, "TESSERA_LISTEN_BACKLOG", 128, "tracker listen backlog, connections") \
	/* Serving processes attached to one node at once (node/serve/attach.h). */ \
	X(ATTACH_CLIENTS, "TESSERA_ATTACH_CLIENTS", 256, "attached serving clients per node") \
	/* Versions one attached client may hold pinned at once (one per \
	 * running request); more is refused, the client stays attached. */ \
	X(ATTACH_PINS, "TESSERA_ATTACH_PINS", 65536, "pins one attached client may hold") \
	/* Versions a node holds for one client that asked for holds (an engine \
	 * switching its ranks together, wire.h protocol 3): each is a whole \
	 * copy of the rank; past it the oldest hold is dropped. */ \
	X(ATTACH_HOLDS, "TESSERA_ATTACH_HOLDS", 4, "versions held for one attached engine") \
	/* Retired versions a node keeps for pins and holds, all clients \
	 * together (each a whole copy of the rank): past it, the clients \
	 * pinning the oldest are dropped and its holds let go. */ \
	X(ATTACH_RETAINED, "TESSERA_ATTACH_RETAINED", 4, "retired versions kept for attached clients") \
	/* Bytes a node queues for a client that does not read; past it the \
	 * client is dropped (and its pins with it). */ \
	X(ATTACH_OUT_MAX, "TESSERA_ATTACH_OUT_MAX", 256u << 20, "unread bytes queued per attached client") \
	X(ADDENDUM_WAIT_MS, "TESSERA_ADDENDUM_WAIT_MS", 10000,                    \
	  "how long a node whose layout the latest manifest lacks waits for its addendum, ms") \
	/* Peer fanout (node/swarm/): 1, nodes serve the chunks they \
	 * verified to the others of their parcel's swarm and fetch from them; 0, \
	 * star mode: every byte comes from the trainer. The only tunable that may \
	 * be 0 while its default is not. */ \
	X(FANOUT, "TESSERA_FANOUT", 1, "peer fanout (1) or star mode (0)") \
	/* How often a node reads each swarm peer's have-page (proto/have.h) \
	 * while it still needs chunks of that parcel. */ \
	X(HAVE_POLL_MS, "TESSERA_HAVE_POLL_MS", 100, "have-page read period per swarm peer, ms") \
	/* A parcel with nothing of ours in flight and chunks left that only a \
	 * peer is on reads its peers' have-pages this often instead of every \
	 * HAVE_POLL_MS, so a chunk verified at one peer reaches the next within \
	 * about this (a delta's few chunks cross the swarm in hops). */ \
	X(HAVE_CHASE_MS, "TESSERA_HAVE_CHASE_MS", 5, "have-page read period while a parcel waits on its peers, ms") \
	/* 1: a node reads its peers' have-pages over its chunk reads' endpoint; \
	 * 0: over an endpoint of its own, so that a page does not queue behind \
	 * the chunk reads a peer is serving us (node/fetch/pace.c). */ \
	X(HAVE_SAME_ENDPOINT, "TESSERA_HAVE_SAME_ENDPOINT", 0, "have-page reads share the chunk reads' endpoint (1) or have their own (0)") \
	/* Reads a node keeps in flight to one peer at most: its upload budget as \
	 * the peer sees it, so a reader never queues more on a peer's link \
	 * (512 KiB at 128 KiB chunks). */ \
	X(PEER_INFLIGHT, "TESSERA_PEER_INFLIGHT", 4, "most chunk reads in flight to one peer") \
	/* What a node keeps queued on one peer: the bytes the peer's measured \
	 * rate to it delivers in this many ms (one chunk at least, PEER_INFLIGHT \
	 * at most). A peer answers its readers in turn: a deeper queue only makes \
	 * every other chunk wait (node/fetch/picker.c). */ \
	/* Rarest first in turns: a chunk that avail of a reader's peers hold \
	 * is read from them by about avail x this many of the readers that \
	 * list them at once, the others taking it once more hold it \
	 * (node/fetch/picker.c, herds). 0: every reader at once. */ \
	X(HERD_READERS, "TESSERA_HERD_READERS", 8, "readers of a chunk at once per peer holding it (0: all)") \
	X(PEER_TARGET_MS, "TESSERA_PEER_TARGET_MS", 500, "bytes queued per peer, as ms of its measured rate") \
	/* A reader ahead of its swarm reads from at most this many peers at once, \
	 * leaving the others' uplinks to the readers behind (node/fetch/ \
	 * picker.c); 0: no such limit (one read per peer only). */ \
	X(AHEAD_PEERS, "TESSERA_AHEAD_PEERS", 0, "peers a reader ahead of its swarm reads from at once (0: any)") \
	/* Super-seeding under a cap (node/fetch/owners.c): the members of a \
	 * parcel's swarm that read it from the trainer at once (0: every member); \
	 * the others take its chunks from peers. A member starved of a chunk no \
	 * peer can supply reads it from the trainer anyway. Reads are one-sided, \
	 * so the readers keep the cap: it must be the same on every node. */ \
	X(PUB_UPLOAD_READERS, "TESSERA_PUB_UPLOAD_READERS", 0, "swarm members of a parcel reading it from the trainer at once (0: all)") \
	/* A node's upload budget, which it announces on its have-pages \
	 * (proto/have.h) and its readers keep: the peers it serves a parcel \
	 * to at once (0: any; at most 255), and its upload rate, Mbit/s, \
	 * shared among them (0: none). A reader outside the budget takes \
	 * the chunks elsewhere; the peer does not count as bad. */ \
	X(UPLOAD_PEERS, "TESSERA_UPLOAD_PEERS", 0, "peers a node serves a parcel to at once (0: any)") \
	X(UPLOAD_MBPS, "TESSERA_UPLOAD_MBPS", 0, "node upload rate cap, Mbit/s (0: none)") \
	/* Test only: a node flips one byte of every chunk it serves to peers \
	 * (its own copy stays right; its slot is served to other layouts as a \
	 * copy with a byte flipped every 4 KiB), so that tests can see a bad \
	 * peer banned. */ \
	X(TEST_CORRUPT_SERVE, "TESSERA_TEST_CORRUPT_SERVE", 0, "test only: serve corrupt chunks (1)") \
	/* A publisher sends an anchor (full parcels) every this many versions \
	 * and deltas against the previous version in between (1: anchors \
	 * only); `tessera publish --anchor-every` overrides it. */ \
	X(ANCHOR_EVERY, "TESSERA_ANCHOR_EVERY", 10, "versions per anchor (1: no deltas)") \
	/* A delta version whose parcels would exceed this percentage of the \
	 * anchor's bytes is sent as an anchor instead: its parcels' encodes \
	 * share a budget of that many bytes and stop once their output \
	 * passes it (node/publisher/pub_delta.c). */ \
	X(DELTA_MAX_PERCENT, "TESSERA_DELTA_MAX_PERCENT", 50, "largest delta, % of the anchor") \
	/* A retired slot's pages are given back this long after its last pin \
	 * went, on a worker thread: the serving process unmaps its view first \
	 * (cheap), so neither it nor the node's loop pays for freeing them. */ \
	X(ATTACH_FREE_GRACE_MS, "TESSERA_ATTACH_FREE_GRACE_MS", 200, "delay before a retired slot is freed, ms") \
	/* An in-place install (tessera-node --install in-place) pauses \
	 * admission, then waits this long for running requests to release \
	 * their pins; clients still holding one are disconnected (their pins \
	 * dropped) and the install goes on. */ \
	X(INPLACE_DRAIN_MS, "TESSERA_INPLACE_DRAIN_MS", 2000, "in-place install: wait for pins to drain, ms") \
	/* Test only: the in-place install of this version number fails after \
	 * writing half of it (0: none), so that tests can see serving stay \
	 * blocked until a complete version is installed. */ \
	X(TEST_INPLACE_FAIL, "TESSERA_TEST_INPLACE_FAIL", 0, "test only: fail the in-place install of this version") \
	X(TEST_ADMIT_LAG_MS, "TESSERA_TEST_ADMIT_LAG_MS", 0, "test only: ms between announcing a version to attached clients and admitting requests to it") \
	X(TEST_ANNOUNCE_LAG_MS, "TESSERA_TEST_ANNOUNCE_LAG_MS", 0, "test only: ms an activated version waits before attached clients are told (one rank of a replica late)") \
	/* After an activation the node copies the new active slot into a \
	 * standby slot, so that a delta against it needs only its apply; it \
	 * waits this long first (past ATTACH_FREE_GRACE_MS, so that the \
	 * retired slot is there to be reused). */ \
	X(DELTA_STANDBY_MS, "TESSERA_DELTA_STANDBY_MS", 400, "delay before the standby copy of the active slot, ms") \
	/* The standby copy costs CPU (proto/NOTES.md): it waits until the node's \
	 * fabric has carried no peer's read for this long, so that it does not \
	 * take the CPU from peers still fetching from this node (0: made at once; \
	 * put off 60 s at most). */ \
	X(DELTA_STANDBY_QUIET_MS, "TESSERA_DELTA_STANDBY_QUIET_MS", 300, "the standby copy waits for this long without peer reads, ms (0: never waits)") \
	/* A node makes its second slot when it starts and touches every page of \
	 * it on a worker at the lowest priority, so that the first delta after \
	 * the first anchor does not pay for first-touch page faults while it \
	 * waits (proto/NOTES.md); 0: no warm slot, the first copy makes its own. */ \
	X(DELTA_WARM, "TESSERA_DELTA_WARM", 1, "make and touch the second slot when the node starts (0: off)") \
	/* Test only: the standby copy's first this many looks find peers \
	 * reading from the node, whatever its fabric carried. */ \
	X(TEST_STANDBY_BUSY, "TESSERA_TEST_STANDBY_BUSY", 0, "test only: the standby copy finds the node serving this many times") \
	/* Test only: a rotation's catch-up holds its scrub until the next \
	 * delta's apply waits for it (at most 30 s). */ \
	X(TEST_CATCHUP_HOLD, "TESSERA_TEST_CATCHUP_HOLD", 0, "test only: the catch-up's scrub waits for the next delta's apply") \
	/* A node builds the next delta version in its retired slot, patched \
	 * up to the active version by the last delta alone (no dense copy); \
	 * 0: always a copy of the whole active slot. */ \
	X(DELTA_ROTATE, "TESSERA_DELTA_ROTATE", 1, "1: build a delta version in the retired slot (sparse catch-up), 0: copy the active slot whole") \
	/* A delta is checked from its changed positions alone, against the \
	 * piece checksums the node keeps for its slot; a damaged byte where \
	 * no delta writes is found by a scrub that re-sums a rotating 1/K of \
	 * the active slot on a worker after each activation: all of it every \
	 * K versions. 0: no scrub. */ \
	X(DELTA_SCRUB, "TESSERA_DELTA_SCRUB", 8, "K: a scrub re-sums 1/K of the active slot per version (0: none)") \
	/* Clients keep their connection to the tracker open between requests \
	 * (a node sends one at least every lease/3); the tracker closes one \
	 * that has carried nothing for this long. */ \
	X(TRACKER_IDLE_MS, "TESSERA_TRACKER_IDLE_MS", 30000, "tracker closes a connection idle for, ms") \
	/* Trainer bytes across layouts (node/swarm/xl_read.c): a node whose \
	 * layout does not lead reads them from a leading layout's replicas \
	 * fetching the same version; when none of those has verified anything new \
	 * for this long, it takes them from the trainer (a loaded leader's first \
	 * block can take seconds). */ \
	X(XL_PATIENCE_MS, "TESSERA_XL_PATIENCE_MS", 6000, "a node leaving the trainer's bytes to a leading layout waits this long for its progress, ms") \
	/* A node lacking a delta's parent replays the chain from the latest \
	 * anchor (or from its active version) at most this many versions \
	 * long; a longer one waits for an anchor instead. */ \
	X(CHAIN_MAX, "TESSERA_CHAIN_MAX", 64, "longest chain of versions a node replays") \
	/* 1: a node lacking a delta's parent fetches the version whole (its \
	 * raw copy, read from replicas that hold it) when that costs fewer \
	 * bytes than the chain; 0: always the chain. */ \
	X(CHAIN_FULL, "TESSERA_CHAIN_FULL", 1, "a node lacking a delta's parent may fetch it whole when cheaper (0: always the chain)") \
	/* Test only: a chain replay step of this version number has one byte \
	 * of its delta flipped after its hashes verified (0: none), so that \
	 * tests can see the replay fail and fall back to an anchor. */ \
	X(TEST_CORRUPT_CHAIN, "TESSERA_TEST_CORRUPT_CHAIN", 0, "test only: damage this version's delta in a chain replay") \
	/* Test only: a chain replay's first step starts only once the node \
	 * has heard of this version (0: at once), so that a test can publish \
	 * versions while a replay is under way. */ \
	X(TEST_CHAIN_HOLD, "TESSERA_TEST_CHAIN_HOLD", 0, "test only: a chain replay's first step waits until this version is published") \
	/* CUDA store: verified chunks are staged in a ring of pinned host \
	 * entries of this many bytes (a chunk and its span table fit in one) \
	 * and copied to the device while the next ones arrive. */ \
	X(CUDA_RING_ENTRY, "TESSERA_CUDA_RING_ENTRY", 2u << 20, "CUDA store: bytes per pinned upload entry") \
	/* Pinned upload entries in the ring: uploads in flight at most. */ \
	X(CUDA_RING_ENTRIES, "TESSERA_CUDA_RING_ENTRIES", 16, "CUDA store: pinned upload entries") \
	/* A swarm peer (or a publisher) the tracker stops listing (lease lapsed, \
	 * tracker restarted) stays a source, a peer also a member, for this long \
	 * while it answers: it re-registers within about a heartbeat, while \
	 * dropping a peer sends its share of chunks to the trainer, and dropping \
	 * the publisher leaves no source. */ \
	X(PEER_GRACE_MS, "TESSERA_PEER_GRACE_MS", 6000, "an unlisted peer or publisher stays a source this long while it answers, ms") \
	/* Bounded swarm views (tracker/NOTES.md, "Swarms of thousands"): a \
	 * /sources answer lists at most this many of the swarm's peers, a \
	 * fresh random sample each time (and says of how many); a node keeps \
	 * the peers it has while they answer and takes new ones up to this \
	 * many. 0: all of them. */ \
	X(SWARM_PEERS, "TESSERA_SWARM_PEERS", 32, "peers per /sources answer and kept per parcel in a larger swarm (0: all)") \
	/* A swarm's members, the owners of the trainer's chunks, listed at \
	 * most: the replicas of the layout that rank highest by a hash of \
	 * their name and the layout (the same ones for every rank and version \
	 * while they live). A node the list leaves out reads the trainer's \
	 * chunks from peers only. 0: all of them. */ \
	X(SWARM_MEMBERS, "TESSERA_SWARM_MEMBERS", 256, "tracker: a swarm's members (owners of the trainer's chunks) listed at most (0: all)") \
	/* Members that keep up: a replica whose last fetch's highest rate \
	 * (its progress reports') was under 1/X of its swarm's median is \
	 * not listed as a member (it reads from peers only), so that a slow \
	 * link does not hold the trainer's chunks its peers wait for. Judged \
	 * when a version is published. 0: every replica may be a member. */ \
	X(SWARM_SLOW, "TESSERA_SWARM_SLOW", 4, "tracker: a replica whose last fetch's highest rate was under 1/X of its swarm's median is no member (0: off)") \
	/* An in-place install decodes and verifies a delta's changes on this \
	 * many threads before it pauses admission, then writes them on the \
	 * same threads while paused (0: one per online CPU, at most 8). */ \
	X(INPLACE_THREADS, "TESSERA_INPLACE_THREADS", 0, "in-place install: threads decoding and writing a delta (0: CPUs)") \
	/* A serving client releasing a pin through its pin page does not wake \
	 * the node (a wake-up at a switch would stall it); the node looks at \
	 * the pin pages this often while a retired version is still pinned. */ \
	X(ATTACH_SCAN_MS, "TESSERA_ATTACH_SCAN_MS", 20, "how often retired pinned versions are checked, ms")

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
 * "none", for FANOUT, where it means star mode, and for DELTA_ROTATE,
 * where it means a dense copy for every delta). Cannot fail. */
const char *proto_param_name(enum proto_param_id id);
const char *proto_param_env(enum proto_param_id id);
const char *proto_param_doc(enum proto_param_id id);
uint64_t proto_param_default(enum proto_param_id id);
uint64_t proto_param_min(enum proto_param_id id);
/* A value for id, from the environment or a file's [params]: a whole number
 * of at least proto_param_min(id). 0, or -EINVAL (*v unspecified). The one
 * rule both sources go through. */
int proto_param_parse(enum proto_param_id id, const char *s, uint64_t *v);
enum proto_param_source proto_param_source(enum proto_param_id id);

/* The id named name (as proto_param_name() spells it); -ENOENT if none. */
int proto_param_find(const char *name, enum proto_param_id *id);
/* Sets the file's value of a tunable (below the environment); clear drops
 * every file value. Call before starting threads. Cannot fail. */
void proto_param_set_file(enum proto_param_id id, uint64_t v);
void proto_param_clear_file(void);

#endif
