/* The server's check of request signatures (wire/sign.c makes them): the
 * tracker instance's epoch, the timestamp window and the replay cache. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

#define NBUCKETS 4096 /* power of two */

/*
 * A mac seen recently. Entries sit in a hash bucket (for lookup) and in a
 * FIFO by arrival (for expiry). A replay can only pass the timestamp check
 * until ts + window <= arrival + 2 * window, so an entry is kept that long.
 */
struct seen {
	uint8_t mac[TRK_AUTH_MAC_BYTES];
	uint64_t expires_s;
	struct seen *bucket_next;
	struct seen *fifo_next;
};

struct trk_auth {
	uint8_t key[PROTO_CLUSTER_KEY_BYTES];
	uint64_t window_s;
	struct seen *buckets[NBUCKETS];
	struct seen *head, *tail; /* FIFO, oldest first */
	char epoch[2 * TRK_EPOCH_BYTES + 1]; /* this instance's, random */
};

int trk__auth_new(const uint8_t key[PROTO_CLUSTER_KEY_BYTES], uint64_t window_s,
		  struct trk_auth **out)
{
	struct trk_auth *a = calloc(1, sizeof(*a));

	*out = NULL;
	if (a == NULL)
		return -ENOMEM;
	memcpy(a->key, key, PROTO_CLUSTER_KEY_BYTES);
	a->window_s = window_s;
	{
		uint8_t e[TRK_EPOCH_BYTES];

		randombytes_buf(e, sizeof(e));
		sodium_bin2hex(a->epoch, sizeof(a->epoch), e, sizeof(e));
	}
	*out = a;
	return 0;
}

const char *trk__auth_epoch(const struct trk_auth *a)
{
	return a != NULL ? a->epoch : NULL;
}

void trk__auth_free(struct trk_auth *a)
{
	if (a == NULL)
		return;
	trk__auth_forget(a);
	sodium_memzero(a->key, sizeof(a->key));
	free(a);
}

static size_t bucket_of(const uint8_t *mac)
{
	size_t h;
	memcpy(&h, mac, sizeof(h)); /* a mac is uniformly random */
	return h & (NBUCKETS - 1);
}

static void expire(struct trk_auth *a, uint64_t now_s)
{
	while (a->head != NULL && a->head->expires_s <= now_s) {
		struct seen *e = a->head, **pp = &a->buckets[bucket_of(e->mac)];
		while (*pp != e)
			pp = &(*pp)->bucket_next;
		*pp = e->bucket_next;
		a->head = e->fifo_next;
		if (a->head == NULL)
			a->tail = NULL;
		free(e);
	}
}

void trk__auth_forget(struct trk_auth *a)
{
	for (struct seen *e = a->head, *next; e != NULL; e = next) {
		next = e->fifo_next;
		a->buckets[bucket_of(e->mac)] = NULL; /* every entry is in the FIFO */
		free(e);
	}
	a->head = a->tail = NULL;
}

static bool seen_before(struct trk_auth *a, const uint8_t *mac)
{
	for (struct seen *e = a->buckets[bucket_of(mac)]; e; e = e->bucket_next)
		if (sodium_memcmp(e->mac, mac, TRK_AUTH_MAC_BYTES) == 0)
			return true;
	return false;
}

/* Parses `Tessera ts=<digits>,hdr=<64 hex>,mac=<64 hex>` (fields in any
 * order, optional spaces after commas). */
static int parse_header(const char *h, uint64_t *ts, char *epoch,
			uint8_t *head, uint8_t *mac, struct proto_err *err)
{
	static const char scheme[] = "Tessera ";
	bool have_ts = false, have_mac = false, have_head = false, have_ep = false;
	char buf[256];
	char *p, *save = NULL;

	if (h == NULL)
		return proto_errf(err, EACCES,
				  "authorization required (Authorization: Tessera ts=..,ep=..,hdr=..,mac=..)");
	if (strncmp(h, scheme, sizeof(scheme) - 1) != 0)
		return proto_errf(err, EACCES, "authorization: want the Tessera scheme");
	if (strlen(h) >= sizeof(buf))
		return proto_errf(err, EACCES, "authorization: header too long");
	snprintf(buf, sizeof(buf), "%s", h + sizeof(scheme) - 1);
	for (p = strtok_r(buf, ",", &save); p != NULL; p = strtok_r(NULL, ",", &save)) {
		while (*p == ' ')
			p++;
		if (strncmp(p, "ts=", 3) == 0 && !have_ts) {
			if (proto_parse_u64(p + 3, 0, UINT64_MAX / 2, ts) != 0)
				return proto_errf(err, EACCES, "authorization: bad ts");
			have_ts = true;
		} else if (strncmp(p, "mac=", 4) == 0 && !have_mac) {
			if (proto_parse_hex(p + 4, mac, TRK_AUTH_MAC_BYTES) != 0)
				return proto_errf(err, EACCES,
						  "authorization: mac must be %d hex digits",
						  2 * TRK_AUTH_MAC_BYTES);
			have_mac = true;
		} else if (strncmp(p, "ep=", 3) == 0 && !have_ep) {
			size_t n = strlen(p + 3);

			if (n > 2 * TRK_EPOCH_BYTES ||
			    strspn(p + 3, "0123456789abcdef") != n)
				return proto_errf(err, EACCES,
						  "authorization: bad ep");
			memcpy(epoch, p + 3, n + 1);
			have_ep = true;
		} else if (strncmp(p, "hdr=", 4) == 0 && !have_head) {
			if (proto_parse_hex(p + 4, head, TRK_AUTH_MAC_BYTES) != 0)
				return proto_errf(err, EACCES,
						  "authorization: hdr must be %d hex digits",
						  2 * TRK_AUTH_MAC_BYTES);
			have_head = true;
		} else {
			return proto_errf(err, EACCES,
					  "authorization: unexpected field");
		}
	}
	if (!have_ts || !have_mac || !have_head || !have_ep)
		return proto_errf(err, EACCES,
				  "authorization: want ts=, ep=, hdr= and mac=");
	return 0;
}

/* The checks that need no body: the header parses, its head mac matches
 * (method, URI, ts, body length) and ts is fresh. */
static int check_head(struct trk_auth *a, const char *method, const char *uri,
		      const char *header, uint64_t len, uint64_t now_s,
		      uint64_t *ts, uint8_t *mac, struct proto_err *err)
{
	uint8_t head[TRK_AUTH_MAC_BYTES], want[TRK_AUTH_MAC_BYTES];
	char epoch[2 * TRK_EPOCH_BYTES + 1] = "";
	int rc;

	if ((rc = parse_header(header, ts, epoch, head, mac, err)) != 0)
		return rc;
	trk_auth_head_mac(a->key, method, uri, *ts, epoch, len, want);
	if (sodium_memcmp(head, want, sizeof(head)) != 0)
		return proto_errf(err, EACCES, "authorization: bad mac");
	/* A client's first signed request: it has not seen an epoch yet,
	 * learns this one from the answer and signs again (normal, -EAGAIN). */
	if (epoch[0] == 0)
		return proto_errf(err, EAGAIN,
				  "authorization: no epoch yet (a client's first request): this "
				  "tracker's is %s, in X-Tessera-Epoch; it signs again",
				  a->epoch);
	/* Signed for another instance: captured before a restart. */
	if (strcmp(epoch, a->epoch) != 0)
		return proto_errf(err, EACCES,
				  "authorization: epoch '%s' is not this tracker's "
				  "(%s, see X-Tessera-Epoch): it restarted",
				  epoch, a->epoch);
	if ((*ts > now_s ? *ts - now_s : now_s - *ts) > a->window_s)
		return proto_errf(err, EACCES,
				  "authorization: timestamp %llu is more than %llu s from now (%llu)",
				  (unsigned long long)*ts,
				  (unsigned long long)a->window_s,
				  (unsigned long long)now_s);
	return 0;
}

int trk__auth_check_head(struct trk_auth *a, const char *method,
			 const char *uri, const char *header, uint64_t len,
			 uint64_t now_s, struct proto_err *err)
{
	uint8_t mac[TRK_AUTH_MAC_BYTES];
	uint64_t ts = 0;

	return check_head(a, method, uri, header, len, now_s, &ts, mac, err);
}

int trk__auth_check(struct trk_auth *a, const char *method, const char *uri,
		    const char *header, const uint8_t *body, size_t len,
		    uint64_t now_s, struct proto_err *err)
{
	uint8_t mac[TRK_AUTH_MAC_BYTES], want[TRK_AUTH_MAC_BYTES];
	uint64_t ts = 0;
	struct seen *e;
	int rc;

	if ((rc = check_head(a, method, uri, header, len, now_s, &ts, mac,
			     err)) != 0)
		return rc;
	trk_auth_mac(a->key, method, uri, ts, a->epoch, body, len, want);
	if (sodium_memcmp(mac, want, sizeof(mac)) != 0)
		return proto_errf(err, EACCES, "authorization: bad mac");
	expire(a, now_s);
	if (seen_before(a, mac))
		return proto_errf(err, EACCES, "authorization: replayed request");
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return proto_errf(err, EACCES, "authorization: out of memory");
	memcpy(e->mac, mac, sizeof(mac));
	e->expires_s = now_s + 2 * a->window_s + 1;
	e->bucket_next = a->buckets[bucket_of(mac)];
	a->buckets[bucket_of(mac)] = e;
	if (a->tail != NULL)
		a->tail->fifo_next = e;
	else
		a->head = e;
	a->tail = e;
	return 0;
}
