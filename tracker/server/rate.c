/* A rank's fetch rate over a recent window, from the byte counts its
 * progress reports carry (the tracker's clock at each report). */
#include "tracker/server/internal.h"

#define RATE_WINDOW_MS 5000 /* the rate is of the bytes of about the last this */
#define RATE_SPACING_MS 200 /* reports closer than this to the last sample replace it */
#define RATE_STALE_MS 1000  /* past this without a report, the silence counts too */

static uint32_t at(uint32_t i)
{
	return i % TRK__RATE_SAMPLES;
}

bool trk__rate_sample(struct trk_rate *r, uint64_t now_ms, uint64_t bytes)
{
	bool known;

	uint32_t last = at(r->n + TRK__RATE_SAMPLES - 1);

	/* Fewer bytes than before: the fetch started over; so does the rate. */
	if (r->n > 0 && (bytes < r->bytes[last] || now_ms < r->ms[last])) {
		r->n = 0;
		r->peak_bps = 0;
	}
	if (r->n == 0 || bytes > r->bytes[last])
		r->grew_ms = now_ms;
	if (r->n > 1 && now_ms - r->ms[last] < RATE_SPACING_MS) {
		r->ms[last] = now_ms;
		r->bytes[last] = bytes;
	} else {
		r->ms[at(r->n)] = now_ms;
		r->bytes[at(r->n)] = bytes;
		r->n++;
	}
	known = r->peak_bps != 0;
	r->peak_bps = PROTO_MAX(r->peak_bps, trk__rate_bps(r, now_ms));
	return !known && r->peak_bps != 0;
}

bool trk__members_rejudge(bool *rates_new, uint64_t *judged_ms, uint64_t now_ms)
{
	if (!*rates_new || now_ms < *judged_ms + TRK_MEMBERS_REJUDGE_MS)
		return false;
	*rates_new = false;
	*judged_ms = now_ms;
	return true;
}

uint64_t trk__fetch_bps(const struct trk_rate *r, uint64_t bytes, uint64_t ms)
{
	if (r->peak_bps != 0)
		return r->peak_bps;
	ms = PROTO_MAX(ms, 1); /* bytes * 1000 / ms, without overflow */
	return bytes / ms * 1000 + bytes % ms * 1000 / ms;
}

uint64_t trk__rate_bps(const struct trk_rate *r, uint64_t now_ms)
{
	uint32_t kept = r->n < TRK__RATE_SAMPLES ? r->n : TRK__RATE_SAMPLES;
	uint32_t newest = at(r->n + TRK__RATE_SAMPLES - 1), base;
	uint64_t span;

	if (kept < 2)
		return 0;
	/* From the newest sample at least a window old (else the oldest kept)
	 * to the newest, plus the silence since it once reports are overdue. */
	base = at(r->n - kept);
	for (uint32_t k = 0; k < kept; k++) {
		uint32_t i = at(r->n - kept + k);
		if (r->ms[i] + RATE_WINDOW_MS <= r->ms[newest])
			base = i;
	}
	span = r->ms[newest] - r->ms[base];
	if (now_ms > r->ms[newest] + RATE_STALE_MS)
		span += now_ms - r->ms[newest] - RATE_STALE_MS;
	if (span == 0)
		return 0;
	return (uint64_t)((double)(r->bytes[newest] - r->bytes[base]) * 1000.0 / (double)span);
}

uint64_t trk__rate_still_ms(const struct trk_rate *r, uint64_t now_ms)
{
	return r->n == 0 || now_ms < r->grew_ms ? 0 : now_ms - r->grew_ms;
}
