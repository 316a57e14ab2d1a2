/* Serving parcels to peers: one module for the publisher and the node agent. */
#ifndef NODE_SERVE_H
#define NODE_SERVE_H

/*
 * Every holder is a server (DESIGN.md, decision 9). A holder keeps parcels
 * in memory it maps here, registers that memory for remote read only on its
 * fabric endpoint, and offers each parcel to the tracker (POST /offers) as
 * (layout, src_rank, dst_rank, addr, key, len): readers fetch chunk c with
 * a one-sided fab_read at addr + c * chunk_size + head (publisher.h says
 * what addr means). The publisher offers its export buffers (head 0); a
 * node offers the parcels it is fetching, each in its own region that
 * starts with its have-page (proto/have.h, head = the page's size), so a
 * peer learns which chunks the node holds by reading that page, and reads
 * only those.
 *
 * What differs between holders is only what they hold and when they offer:
 * the mapping, the registration, the offer's fields and the tracker
 * exchange (one offer or withdrawal in flight per version, registration
 * generations) are here.
 *
 * Reads are one-sided: a server sees none of them, so it cannot count or
 * pace what it uploads. Readers count what they took from peers and from
 * publishers (reported to the tracker per rank) and pace themselves
 * (proto/params.h: FETCH_TARGET_MS, PEER_INFLIGHT, and the rules in
 * node/fetch/picker.c that leave the trainer's chunks to one reader each,
 * to at most PUB_UPLOAD_READERS members per parcel, and keep the upload
 * budget a node announces on its have-pages: UPLOAD_PEERS, UPLOAD_MBPS).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fabric/fab.h"
#include "tracker/tracker.h"

/* Anonymous memory of cap bytes, page-aligned (2 MiB-aligned with huge
 * pages asked for when large); NULL when out of memory. Free it with
 * node_serve_unmap(b, cap). */
uint8_t *node_serve_map(size_t cap);
void node_serve_unmap(uint8_t *b, size_t cap);

/* Registers [buf, buf+len) on fab for remote reads by peers (and, with
 * also_land, as the destination of our own reads). On failure *out is
 * NULL and nothing is registered; close it with fab_mr_close. */
int node_serve_reg(struct fab_ctx *fab, void *buf, size_t len, bool also_land,
		   struct fab_mr **out);

/* Fills o for the parcel (layout, src, dst) whose served bytes start off
 * bytes into mr and run len bytes. Cannot fail. */
void node_serve_offer_fill(struct trk_offer *o, const uint8_t *layout, uint32_t src_rank,
			   uint32_t dst_rank, const struct fab_mr *mr, uint64_t off, uint64_t len);

/* One version's offer at the tracker. */
struct node_serve_offer {
	uint64_t version;
	bool busy;    /* an offer or withdrawal is in flight */
	bool offered; /* the tracker holds our offer (as of gen) */
	bool tried;   /* at least one answer came */
	bool warned;  /* a failure was logged */
	uint64_t gen; /* the holder's registration the request in flight was made under */
};

/* Sends so's offer (n parcels; n == 0 and no slot withdraws it; slot: a
 * node's whole rank memory, NULL: none, see trk_client_offer_slot) with the
 * snapshot time (0: none) and a publisher's report (NULL: none) under
 * registration gen; cb runs once with the answer. -EBUSY when one is in
 * flight; other negative errno when it could not start (cb
 * is then not called). */
int node_serve_offer_send(struct trk_client *trk, const char *id, struct node_serve_offer *so,
			  uint64_t gen, uint64_t snapshot_ms, const struct trk_publish_report *report,
			  const struct trk_offer *list, size_t n, const struct trk_offer *slot,
			  trk_client_cb cb, void *arg);

/* What an answer to so's request means, to be called first in its
 * callback: clears busy; returns 1 when accepted, 0 when the tracker no
 * longer knows the holder under the current registration (404 for
 * cur_gen: register again), -1 for any other failure (warned about once
 * as "what"). */
int node_serve_offer_done(struct node_serve_offer *so, const struct trk_answer *a,
			  uint64_t cur_gen, const char *what);

#endif
