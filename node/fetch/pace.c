/* Sources: pacing per source and per host, silence, fabric handles. */
#include "node/fetch/fetch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void conn_hold(struct fetcher *x, const struct fetch_source *s);
static void conn_drop(struct fetcher *x, const struct fetch_source *s);

/* A source's window: the bytes we keep in flight to its host, its measured
 * rate times TESSERA_FETCH_TARGET_MS, WINDOW_MIN_CHUNKS to TESSERA_INFLIGHT
 * chunks (NOTES.md, "Pacing"). */
uint64_t fetch_source_window(const struct fetcher *x, const struct fetch_source *s)
{
	uint64_t lo = (uint64_t)WINDOW_MIN_CHUNKS * x->chunk_size;
	uint64_t hi = PROTO_MAX(lo, (uint64_t)x->max_inflight * x->chunk_size);
	uint64_t rate = fetch_pace(s)->rate;
	uint64_t w = rate == 0 ? lo : rate * proto_param(PROTO_PARAM_FETCH_TARGET_MS) / 1000;
	return PROTO_MIN(hi, PROTO_MAX(lo, w));
}

/* How long a source on host h may deliver nothing while reads of ours are
 * queued on it: the time its window takes at its measured rate, four
 * times over, and never less than TESSERA_STALL_MS (three times that
 * before it delivered anything). */
static uint64_t window_patience(const struct fetch_source *h)
{
	uint64_t stall = proto_param(PROTO_PARAM_STALL_MS);

	if (h->rate == 0)
		return 3 * stall;
	return PROTO_MAX(stall, 4 * h->inflight_bytes * 1000 / h->rate);
}

/* How long s may deliver nothing while it has reads in flight: a
 * publisher its window's patience; a peer PEER_STALL_MS, or twice its
 * window's time if longer: its window is at most TESSERA_PEER_INFLIGHT
 * reads and the trainer (or another holder) is always there to move to,
 * so a peer that stops answering has its reads moved within about two
 * seconds. */
static uint64_t source_patience(const struct fetch_source *src)
{
	const struct fetch_source *s = fetch_pace(src);

	if (s->info.peer)
		return s->rate == 0 ? PEER_STALL_MS
				    : PROTO_MAX(PEER_STALL_MS, 2 * s->inflight_bytes * 1000 / s->rate);
	return window_patience(s);
}

uint64_t fetch_source_queue_ms(const struct fetch_source *s, uint64_t bytes)
{
	return s == NULL || fetch_pace(s)->rate == 0 ? 0 : bytes * 1000 / fetch_pace(s)->rate;
}

/* A peer that answered a have-page read posted within PEER_STALL_MS is
 * alive: its late reads are queued behind other readers' on its uplink,
 * not lost, and stay with it for a publisher's patience (NOTES.md,
 * "Congested, not dead"). */
static bool peer_answers(const struct fetch_source *h, uint64_t now)
{
	return h->answered_ms != 0 && h->answered_ms + PEER_STALL_MS > now;
}

bool fetch_source_silent(const struct fetch_source *s, uint64_t now)
{
	const struct fetch_source *h = fetch_pace(s);
	uint64_t quiet;

	/* now may predate the last progress (taken before a read landed). */
	if (h->inflight_reads == 0 || now <= h->progress_ms)
		return false;
	quiet = now - h->progress_ms;
	if (quiet < source_patience(s))
		return false;
	return !h->info.peer || !peer_answers(h, now) || quiet >= window_patience(h);
}

bool fetch_source_congested(const struct fetch_source *s, uint64_t now)
{
	const struct fetch_source *h = fetch_pace(s);

	return h->info.peer && h->inflight_reads > 0 && now > h->progress_ms &&
	       now - h->progress_ms >= source_patience(s) && !fetch_source_silent(s, now);
}

void fetch_source_answered(struct fetch_source *s, uint64_t posted_ms)
{
	struct fetch_source *h = fetch_pace(s);

	h->answered_ms = PROTO_MAX(h->answered_ms, posted_ms);
}

bool fetch_source_ready(struct fetcher *x, struct fetch_source *s, uint64_t now)
{
	if (s->fa_valid)
		return true;
	if (x->o.tx != NULL) { /* reads that do not go over the fabric need no handle */
		s->fa_valid = true;
		return true;
	}
	if (fab_av_insert(x->o.fab, s->info.fabric_addr, s->info.fabric_addr_len, &s->fa) != 0) {
		s->bad_until_ms = now + BAD_SOURCE_MS;
		return false;
	}
	s->fa_valid = true;
	conn_hold(x, s);
	return true;
}

static void pace_posted(struct fetch_source *s, uint64_t len);

/* Posted to s and to its host's record. */
void fetch_source_posted(struct fetch_source *s, uint64_t len)
{
	pace_posted(s, len);
	s->up_tokens -= PROTO_MIN(len, s->up_tokens); /* its upload budget (owners.c) */
	if (s->hp != NULL)
		pace_posted(s->hp, len);
}

static void pace_posted(struct fetch_source *s, uint64_t len)
{
	uint64_t now = node_now_ms();

	if (s->inflight_reads == 0) {
		/* Busy from now: silence and rate are measured from here. */
		s->progress_ms = now;
		s->meas_ms = now;
		s->meas_bytes = 0;
		s->silent_logged = false;
		s->congested_logged = false;
	}
	s->inflight_reads++;
	s->inflight_bytes += len;
}

/* Accounting for a read of s that completed (ok: with its bytes). The rate
 * is measured over stretches of at least RATE_SAMPLE_MS while busy, and
 * smoothed (half the old, half the new). */
void fetch_source_done(struct fetch_source *s, uint64_t len, bool ok)
{
	uint64_t now = node_now_ms();

	s->inflight_reads--;
	s->inflight_bytes -= PROTO_MIN(len, s->inflight_bytes);
	if (ok) {
		s->progress_ms = now;
		s->silent_logged = false;
		s->congested_logged = false;
		s->meas_bytes += len;
		if (now - s->meas_ms >= RATE_SAMPLE_MS) {
			uint64_t sample = s->meas_bytes * 1000 / (now - s->meas_ms);
			s->rate = s->rate == 0 ? sample : (s->rate + sample) / 2;
			s->meas_ms = now;
			s->meas_bytes = 0;
		}
	}
}

void fetch_source_failed(struct fetcher *x, struct fetch_source *s)
{
	if (s == NULL)
		return;
	s->bad_until_ms = node_now_ms() + BAD_SOURCE_MS;
	/* tcp;ofi_rxm drops the connection on an error: start afresh. */
	conn_drop(x, s);
	fetch_source_release(x, s);
}

bool fetch_source_usable(const struct fetcher *x, const struct fetch *f,
			 const struct fetch_source *s, uint64_t now)
{
	if (s->self || s->bad_until_ms > now || fetch_source_silent(s, now))
		return false;
	if (s->info.peer)
		return x->fanout && s->have != NULL && !fetch_banned(f, s->info.id);
	return true;
}

/* Pacing per host: every source on one host (a publisher hosting several
 * trainer ranks, a peer serving every parcel of its rank) shares one
 * record: the bytes in flight to the host, its measured rate and when it
 * last delivered. Records outlive source lists and versions. A host is its
 * registered host name and what runs there (the publisher's id, or the
 * peer's replica), so processes sharing a host name without sharing a link
 * (one machine's loopback) are told apart. */
#define HOSTS_MAX 256 /* hosts paced apart; the others pace per source */

static void host_group(const struct trk_source *info, char *out, size_t len)
{
	const char *slash = info->peer ? strrchr(info->id, '/') : NULL;
	int n = slash != NULL ? (int)(slash - info->id) : (int)strlen(info->id);

	snprintf(out, len, "%.*s", n, info->id);
}

struct fetch_source *fetch_host_pace(struct fetcher *x, const struct trk_source *info)
{
	char group[TRK_ID_MAX];

	host_group(info, group, sizeof(group));
	for (uint32_t i = 0; i < x->nhosts; i++) {
		struct fetch_source *h = &x->hosts[i];
		if (h->info.peer == info->peer && strcmp(h->info.host, info->host) == 0 &&
		    strcmp(h->info.id, group) == 0)
			return h;
	}
	if (x->nhosts == HOSTS_MAX)
		return NULL;
	if (x->hosts == NULL && (x->hosts = calloc(HOSTS_MAX, sizeof(*x->hosts))) == NULL)
		return NULL;
	struct fetch_source *h = &x->hosts[x->nhosts++];
	h->info.peer = info->peer;
	snprintf(h->info.host, sizeof(h->info.host), "%s", info->host);
	snprintf(h->info.id, sizeof(h->info.id), "%s", group);
	return h;
}

/* Kept connections: one more fabric handle per source address reached, kept
 * across versions (the same peer, the same connection: no handshake per
 * version), given back when a read from it fails, when CONNS_MAX are held
 * (the least recently reached), and with the endpoint (NOTES.md). */
#define CONNS_MAX 64

struct fetch_conn {
	uint8_t addr[FAB_ADDR_MAX];
	size_t len;
	fi_addr_t fa;
	fi_addr_t hfa;  /* on x->o.hfab (have-pages), when hfa_ok */
	bool hfa_ok;
	uint64_t used; /* x->conns_clock when last reached */
};

static struct fetch_conn *conn_find(const struct fetcher *x, const struct fetch_source *s)
{
	for (uint32_t i = 0; i < x->nconns; i++)
		if (x->conns[i].len == s->info.fabric_addr_len &&
		    memcmp(x->conns[i].addr, s->info.fabric_addr, x->conns[i].len) == 0)
			return &x->conns[i];
	return NULL;
}

static void conn_remove(struct fetcher *x, struct fetch_conn *w)
{
	if (x->o.fab != NULL)
		fab_av_remove(x->o.fab, w->fa);
	if (w->hfa_ok && x->o.hfab != NULL)
		fab_av_remove(x->o.hfab, w->hfa);
	*w = x->conns[--x->nconns];
}

static void conn_hold(struct fetcher *x, const struct fetch_source *s)
{
	struct fetch_conn *w;

	if (x->o.fab == NULL || s->info.fabric_addr == NULL || s->info.fabric_addr_len == 0 ||
	    s->info.fabric_addr_len > FAB_ADDR_MAX)
		return;
	if ((w = conn_find(x, s)) != NULL) {
		w->used = ++x->conns_clock;
		return;
	}
	if (x->conns == NULL && (x->conns = calloc(CONNS_MAX, sizeof(*x->conns))) == NULL)
		return;
	if (x->nconns == CONNS_MAX) {
		struct fetch_conn *old = &x->conns[0];
		for (uint32_t i = 1; i < x->nconns; i++)
			if (x->conns[i].used < old->used)
				old = &x->conns[i];
		conn_remove(x, old);
	}
	w = &x->conns[x->nconns];
	if (fab_av_insert(x->o.fab, s->info.fabric_addr, s->info.fabric_addr_len, &w->fa) != 0)
		return;
	memcpy(w->addr, s->info.fabric_addr, s->info.fabric_addr_len);
	w->len = s->info.fabric_addr_len;
	w->hfa_ok = false;
	w->used = ++x->conns_clock;
	x->nconns++;
}

/* Have-pages over an endpoint of their own (the host's second one): a
 * connection's reads are answered in order, and a page must not wait
 * behind the chunks queued for us on the same connection (NOTES.md). */
int fetch_have_addr(struct fetcher *x, struct fetch_source *s, fi_addr_t *out)
{
	struct fetch_conn *w;

	if (x->o.hfab == NULL || x->o.hfab == x->o.fab) {
		*out = s->fa;
		return 0;
	}
	if ((w = conn_find(x, s)) == NULL) {
		conn_hold(x, s);
		w = conn_find(x, s);
	}
	if (w == NULL || (!w->hfa_ok && fab_av_insert(x->o.hfab, w->addr, w->len, &w->hfa) != 0)) {
		s->bad_until_ms = node_now_ms() + BAD_SOURCE_MS;
		return w == NULL ? -ENOMEM : -EINVAL;
	}
	w->hfa_ok = true;
	w->used = ++x->conns_clock;
	*out = w->hfa;
	return 0;
}

static void conn_drop(struct fetcher *x, const struct fetch_source *s)
{
	struct fetch_conn *w = s->info.fabric_addr != NULL ? conn_find(x, s) : NULL;

	if (w != NULL)
		conn_remove(x, w);
}

void fetch_conns_fini(struct fetcher *x)
{
	while (x->nconns > 0)
		conn_remove(x, &x->conns[x->nconns - 1]);
	free(x->conns);
	x->conns = NULL;
}

uint32_t fetch_conns_count(const struct fetcher *x)
{
	return x->nconns;
}

void fetch_hosts_fini(struct fetcher *x)
{
	free(x->hosts);
	x->hosts = NULL;
	x->nhosts = 0;
}

void fetch_source_release(struct fetcher *x, struct fetch_source *s)
{
	if (s->fa_valid && x->o.fab != NULL)
		fab_av_remove(x->o.fab, s->fa);
	s->fa_valid = false;
}
