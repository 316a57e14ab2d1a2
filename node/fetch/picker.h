/*
 * The picker: which chunk of a parcel a node reads next, and from whom
 * among the sources the tracker listed (publishers, swarm peers).
 * Policy alone: its inputs are the fetch's state (each chunk's state and
 * reads in flight, what the swarm's peers hold and fetch by their last
 * have-pages, who owns which of the trainer's chunks), its sources' pacing
 * and upload budgets, the node's reads in flight and the clock; its output
 * is the next read. It posts nothing (the pump does, pump.c) and keeps
 * only its own bookkeeping (a parcel's round-robin position and hunger,
 * the judgement of the trainer's last wave, a peer's budget tokens). Its
 * one step outside policy is a source's fabric handle, made when the pick
 * lands on a source without one (fetch_source_ready). Tested directly,
 * without an agent, in tests/test_picker.c. Cross-layout holders are
 * asked before a publisher's chunk by the pump (node/swarm/xl_read.c).
 *
 * Per parcel, in order:
 *   1. rarest first among chunks some usable peer holds (fewest holders;
 *      among equals the first from our own starting point), each in our
 *      turn (about TESSERA_HERD_READERS readers per holder at once, in
 *      parcels of HERD_MIN_CHUNKS or more; out of turn only with nothing
 *      else to read and at most HERD_OUT reads out), from the
 *      holder whose queue of our reads empties first, within its window
 *      and its upload budget;
 *   2. from a publisher, a chunk no peer holds or fetches, among those we
 *      own: chunk c's owner is the member with the highest hash of (its
 *      id, parcel, c), loads bounded to an even share (owners.c); with our
 *      own all gone, one an idle owner would reach last (fetch_pick_steal);
 *   3. starved (nothing of the parcel came for STARVE_MS), chunks whose
 *      owner does not serve the parcel, then what a peer has been fetching
 *      for longer than our own trainer window takes, then any chunk no
 *      peer holds;
 *   4. the endgame: a chunk whose only read is late, asked once more of
 *      another source.
 * The whole model, and the measurements behind each rule, are in
 * node/fetch/NOTES.md.
 */
#ifndef NODE_FETCH_PICKER_H
#define NODE_FETCH_PICKER_H

#include "node/fetch/fetch.h"

/* The next read of parcel pi of x->f: its chunk (*chunk) and source, or
 * NULL for none now (*want_sources: no source is usable, ask the tracker).
 * Updates the parcel's round-robin position and hunger, and the fetch's
 * judgement of the trainer's last wave. */
struct fetch_source *fetch_pick(struct fetcher *x, uint32_t pi, uint32_t *chunk,
				bool *want_sources);
/* A chunk of parcel pi that another seed reader owns and would reach
 * last, for us to read from the trainer once our own chunks have all left
 * it; UINT32_MAX: none. Cannot fail. */
uint32_t fetch_pick_steal(const struct fetcher *x, uint32_t pi);

/* ---- owners.c: the picker's inputs ---- */

/* Takes the swarm's members from a /sources answer (hostile: at most
 * MEMBERS_MAX ids, each shorter than TRK_ID_MAX; others are skipped) and
 * decides which chunks of parcel pi of f we own among them (or among the
 * peers listed, when the answer names none), who reads from the trainer
 * (seed readers) and for whom we stand in. */
void fetch_owners(const struct fetcher *x, struct fetch *f, uint32_t pi, json_t *answer);
/* Takes peer s's have-page h (parsed, and checked against p: version,
 * chunks, ranks), answer to the read posted at s->have_ms: its have and
 * busy bits, that it was alive then, where it serves its chunks from, its
 * upload budget. 0, or -ENOMEM (the page is not taken). The recount is
 * the caller's. */
int fetch_source_page(const struct fetcher *x, const struct fetch_parcel *p,
		      struct fetch_source *s, const struct proto_have *h);
/* Counts, per chunk of p, the usable peers holding it and whether one is
 * fetching it, from their last have-pages; whether we are ahead of them. */
void fetch_recount(const struct fetch *f, struct fetch_parcel *p);
/* Whether peer s's upload budget lets us in, and our share of its rate,
 * from p's members. */
void fetch_budget_share(const struct fetcher *x, const struct fetch_parcel *p,
			struct fetch_source *s);
/* s's budget has room for a read of len bytes now (chunk: our chunk size). */
bool fetch_budget_room(struct fetch_source *s, uint64_t len, uint64_t chunk);
/* The index in p's members of source s (a peer listed under a member's
 * id), or UINT32_MAX: as fetch_owners matched them (members sorted once,
 * not a name compared per member and source), else by name. */
uint32_t fetch_source_member(const struct fetch_parcel *p, const struct fetch_source *s);
/* Which of p's members have a source in its list (serving: one whose
 * have-page was read and that does not rest at now), a byte each, in few
 * when they fit (MEMBERS_FEW), else allocated: the caller frees a result
 * that is not few. NULL when out of memory. */
#define MEMBERS_FEW 64
uint8_t *fetch_members_listed(const struct fetch_parcel *p, bool serving, uint64_t now,
			      uint8_t few[MEMBERS_FEW]);
/* Where member id's walk over the n chunks of parcel pi starts. */
uint32_t fetch_start_point(const char *id, uint32_t pi, uint32_t n);

#endif
