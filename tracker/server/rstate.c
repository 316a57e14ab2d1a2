/* A replica's state in words: current, updating, behind, failed or gone,
 * and why. A pure function of plain inputs (trk__replica_state gathers
 * them from the registry), so that the rule is tested on its own. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tracker/server/internal.h"

static const char *const names[TRK_RSTATE_COUNT] = {"current", "updating", "behind", "failed",
						     "gone"};

const char *trk__rstate_name(enum trk_rstate s)
{
	return s < TRK_RSTATE_COUNT ? names[s] : "?";
}

/* Appends to out->why (truncated at its size). */
__attribute__((format(printf, 2, 3))) static void say(struct trk_rs_out *out, const char *fmt,
						       ...)
{
	size_t k = strlen(out->why);
	va_list ap;

	if (k + 1 >= sizeof(out->why))
		return;
	va_start(ap, fmt);
	vsnprintf(out->why + k, sizeof(out->why) - k, fmt, ap);
	va_end(ap);
}

static double s_of(uint64_t ms)
{
	return (double)ms / 1000.0;
}

/* The replica's current fetch of the highest version a live rank fetches
 * above the active one: every rank's share of it, so that the total does
 * not grow as ranks start reporting and "% done" only moves forward. A
 * rank that holds it whole counts as done; one that has not reported it
 * counts its size from the version (want_bytes), or leaves the total
 * unknown when the version is not sized. */
static void sum_fetch(const struct trk_rs_in *in, struct trk_rs_out *out)
{
	uint64_t f = 0;
	bool known = true, sized;

	for (uint32_t i = 0; i < in->nranks; i++) {
		const struct trk_rs_rank *r = &in->ranks[i];
		if (r->alive && r->reported && r->state == TRK_STATE_FETCHING && r->version > in->active)
			f = PROTO_MAX(f, r->version);
	}
	out->fetching = f;
	if (f == 0)
		return;
	sized = in->sized && in->want_version == f;
	for (uint32_t i = 0; i < in->nranks; i++) {
		const struct trk_rs_rank *r = &in->ranks[i];
		bool on = r->alive && r->reported && r->version == f;
		bool fetching = on && r->state == TRK_STATE_FETCHING;
		bool holds = on && (r->state == TRK_STATE_VERIFIED || r->state == TRK_STATE_ACTIVE);
		uint64_t size = on && r->total > 0 ? r->total : r->want_bytes;

		known &= (on && r->total > 0) || sized;
		out->total += size;
		if (!fetching && !holds)
			continue;
		out->reporting++;
		out->done += holds ? size : PROTO_MIN(r->done, size);
		out->from_trainer += r->from_trainer;
		out->from_peers += r->from_peers;
		if (!fetching)
			continue;
		out->rate_bps += r->rate_bps;
		if (r->still_ms > out->still_ms) {
			out->still_ms = r->still_ms;
			out->still_rank = i;
		}
	}
	if (!known)
		out->total = 0;
	if (out->total > 0 && out->rate_bps > 0)
		out->eta_ms = out->total > out->done ?
				      (out->total - out->done) * 1000 / out->rate_bps : 0;
}

/* "fetching v8 at 4.2 MB/s (30 % from the trainer, 70 % from peers), 27 %
 * done, expected in 3.1 s"; without the version's size, "1 of 2 ranks
 * reporting" instead of a share done. */
static void say_fetch(const struct trk_rs_in *in, struct trk_rs_out *out)
{
	uint64_t got = out->from_trainer + out->from_peers;

	say(out, "fetching v%" PRIu64, out->fetching);
	if (out->rate_bps > 0)
		say(out, " at %.1f MB/s", (double)out->rate_bps / 1e6);
	if (got > 0)
		say(out, " (%.0f %% from the trainer, %.0f %% from peers)",
		    100.0 * (double)out->from_trainer / (double)got,
		    100.0 * (double)out->from_peers / (double)got);
	if (out->total > 0)
		say(out, ", %.0f %% done", 100.0 * (double)out->done / (double)out->total);
	else
		say(out, ", %u of %u ranks reporting", out->reporting, in->nranks);
	if (out->eta_ms != UINT64_MAX)
		say(out, ", expected in %.1f s", s_of(out->eta_ms));
	else if (out->rate_bps == 0)
		say(out, ", no rate yet");
}

/* A time ago: tenths under ten seconds, whole seconds above. */
static void say_ago(struct trk_rs_out *out, uint64_t ms)
{
	if (ms < 10000)
		say(out, "%.1f s ago", s_of(ms));
	else
		say(out, "%.0f s ago", s_of(ms));
}

/* Why a registered rank is not alive: "left 14 s ago", ": lease expired,
 * last heartbeat 9.0 s ago". */
static void say_gone(struct trk_rs_out *out, const struct trk_rs_rank *r)
{
	if (r->gone_why != NULL && strcmp(r->gone_why, "left") == 0) {
		say(out, " left ");
		say_ago(out, r->gone_ms);
	} else if (r->gone_why != NULL && r->beat_ms > 0) {
		say(out, ": %s, last heartbeat ", r->gone_why);
		say_ago(out, r->beat_ms);
	} else {
		say(out, ": %s ", r->gone_why != NULL ? r->gone_why : "gone");
		say_ago(out, r->gone_ms);
	}
}

static void say_rank(struct trk_rs_out *out, const struct trk_rs_in *in, uint32_t i)
{
	const struct trk_rs_rank *r = &in->ranks[i];

	if (r->id != NULL && r->id[0])
		say(out, "rank %u (%s)", i, r->id);
	else
		say(out, "rank %u", i);
}

void trk__rstate_judge(const struct trk_rs_in *in, struct trk_rs_out *out)
{
	int dead = -1, failed = -1, erred = -1, holds = 0, started = 0;
	uint64_t grace;

	memset(out, 0, sizeof(*out));
	out->eta_ms = UINT64_MAX;
	for (uint32_t i = 0; i < in->nranks; i++) {
		const struct trk_rs_rank *r = &in->ranks[i];
		if (!r->alive) {
			if (dead < 0)
				dead = (int)i;
			continue;
		}
		if (r->reported && r->state == TRK_STATE_FAILED && failed < 0)
			failed = (int)i;
		if (r->error != NULL && r->error[0] && erred < 0)
			erred = (int)i;
		if (r->reported && r->version > in->active) {
			started++;
			holds += r->state == TRK_STATE_VERIFIED || r->state == TRK_STATE_ACTIVE;
		}
	}
	sum_fetch(in, out);

	if (in->nranks == 0 || dead >= 0) {
		bool none = true;
		for (uint32_t i = 0; i < in->nranks; i++)
			none &= !in->ranks[i].alive;
		out->state = none ? TRK_RSTATE_GONE : TRK_RSTATE_BEHIND;
		if (none && in->nranks > 1)
			say(out, "no rank alive: ");
		say_rank(out, in, (uint32_t)PROTO_MAX(dead, 0));
		if (in->nranks == 0 || !in->ranks[dead].present)
			say(out, " has not registered");
		else
			say_gone(out, &in->ranks[dead]);
		if (!none && out->fetching != 0) {
			say(out, "; ");
			say_fetch(in, out);
		}
		return;
	}
	if (failed >= 0) {
		out->state = TRK_RSTATE_FAILED;
		say_rank(out, in, (uint32_t)failed);
		say(out, " failed v%" PRIu64 ": %s", in->ranks[failed].version,
		    in->ranks[failed].error && in->ranks[failed].error[0] ?
			    in->ranks[failed].error :
			    "no reason given");
		return;
	}
	if (in->latest == 0) {
		/* Nothing to be behind: the publisher has not published. */
		out->state = TRK_RSTATE_CURRENT;
		say(out, "no version published yet");
		return;
	}
	if (in->active != 0 && in->active >= in->latest) {
		out->state = TRK_RSTATE_CURRENT;
		say(out, "active on v%" PRIu64 ", the latest", in->active);
		return;
	}
	out->state = TRK_RSTATE_BEHIND;
	if (in->uncovered) {
		say(out, "no version covers its layout yet: waiting for the publisher to add it");
		return;
	}
	if (holds == (int)in->nranks) {
		out->state = TRK_RSTATE_UPDATING;
		say(out, "every rank holds v%" PRIu64 ", activating", in->target);
		return;
	}
	if (started == 0) {
		if (in->active == 0)
			say(out, "none active yet; ");
		say(out, "waiting for sources: no rank has started v%" PRIu64 " yet",
		    in->target ? in->target : in->latest);
		if (in->lag_ms > 0)
			say(out, " (%.1f s since a newer version came)", s_of(in->lag_ms));
		return;
	}
	if (out->fetching == 0) {
		/* Some ranks hold the target, the others have not started it. */
		for (uint32_t i = 0; i < in->nranks; i++) {
			const struct trk_rs_rank *r = &in->ranks[i];
			if (r->reported && r->version > in->active)
				continue;
			say(out, "waiting for ");
			say_rank(out, in, i);
			say(out, " to start v%" PRIu64, in->target ? in->target : in->latest);
			break;
		}
		return;
	}
	if (erred >= 0) {
		/* A rank that failed and is trying again is not on its usual way. */
		say_rank(out, in, (uint32_t)erred);
		say(out, " failed: %s; trying again: ", in->ranks[erred].error);
		say_fetch(in, out);
		return;
	}
	if (out->still_ms >= in->stall_ms) {
		say(out, "no progress for %.1f s (", s_of(out->still_ms));
		say_rank(out, in, out->still_rank);
		say(out, "); ");
		say_fetch(in, out);
		return;
	}
	grace = PROTO_MAX(in->grace_ms, in->usual_ms);
	if (in->lag_ms <= grace) {
		out->state = TRK_RSTATE_UPDATING;
		say_fetch(in, out);
	} else {
		say(out, "slower than the versions come: v%" PRIu64 " came %.1f s ago",
		    in->active + 1, s_of(in->lag_ms));
		if (in->usual_ms > 0)
			say(out, ", its last update took %.1f s", s_of(in->usual_ms));
		say(out, "; ");
		say_fetch(in, out);
	}
}
