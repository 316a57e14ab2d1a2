/* A version's report: what its export cost, phase by phase (tracker/tracker.h's trk_publish_report). */
#include "node/publisher/pub_internal.h"

#include <stdio.h>
#include <string.h>

/*
 * What a fresh export cost, phase by phase, from the request to end_ns:
 * each phase runs from the end of the one before to its own end (the
 * stamps in pub_export), counted in whole ms from the request, so that
 * the phases add up to total_ms exactly. Waits that took no time (queued
 * behind another export, for the tracker) are left out; the wait after the
 * snapshot is "wait for a node" when no node had a serving layout
 * registered (the tracker was not what it waited on); so is the gather
 * of a delta that was kept (its encode hashed it). With offer, the last
 * phase is the offer, ending at end_ns; else the report ends when the
 * publish was answered: what the offer carries to the tracker.
 */
void node__pub_report(const struct pub_export *ex, uint64_t end_ns, bool offer,
		      struct trk_publish_report *r)
{
	const struct {
		const char *name;
		uint64_t at;
		bool optional; /* left out when it took no time */
	} b[] = {
		{"queued", ex->start_ns, true},
		{"snapshot", ex->snap_end_ns, false},
		{ex->waited_node ? "wait for a node" : "wait for tracker", ex->gather0_ns, true},
		{"delta encode", ex->delta_tried ? ex->encode_end_ns : 0, false},
		{"gather+hash", ex->gathered_ns, ex->delta},
		{"sign", ex->sent_ns, false},
		{"publish", ex->answered_ns, false},
		{"offer", offer ? end_ns : 0, false},
	};
	uint64_t prev = 0;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < PROTO_ARRAY_LEN(b); i++) {
		if (b[i].at == 0)
			continue;
		uint64_t ms = PROTO_MAX(b[i].at > ex->t0_ns ? (b[i].at - ex->t0_ns) / 1000000u : 0, prev);
		uint64_t d = ms - prev;
		prev = ms;
		if (d == 0 && b[i].optional)
			continue;
		trk_publish_report_add(r, b[i].name, d);
		if (strcmp(b[i].name, "delta encode") == 0)
			r->delta_encode_ms = d;
	}
	r->total_ms = prev;
	r->delta_tried = ex->delta_tried;
	if (ex->delta_tried) {
		r->delta_kept = ex->delta;
		r->delta_stopped_early = ex->delta_stopped;
		r->delta_percent = ex->delta_percent;
		snprintf(r->delta_why, sizeof(r->delta_why), "%s", ex->delta_why);
	}
}
