/* Request signatures with the cluster key: the two macs and the
 * Authorization header that carries them (tracker.h), made by the client
 * and checked by the server alike. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "tracker/tracker.h"

/* Adds METHOD "\n" URI "\n" ts "\n" epoch "\n" to st. */
static void mac_state_update(crypto_auth_hmacsha512256_state *st,
			     const char *method, const char *uri, uint64_t ts,
			     const char *epoch)
{
	char tsbuf[32];
	int n = snprintf(tsbuf, sizeof(tsbuf), "%llu", (unsigned long long)ts);

	crypto_auth_hmacsha512256_update(st, (const uint8_t *)method, strlen(method));
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)"\n", 1);
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)uri, strlen(uri));
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)"\n", 1);
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)tsbuf, (size_t)n);
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)"\n", 1);
	if (epoch != NULL)
		crypto_auth_hmacsha512256_update(st, (const uint8_t *)epoch,
						 strlen(epoch));
	crypto_auth_hmacsha512256_update(st, (const uint8_t *)"\n", 1);
}

static void mac_state(crypto_auth_hmacsha512256_state *st,
		      const uint8_t key[PROTO_CLUSTER_KEY_BYTES],
		      const char *method, const char *uri, uint64_t ts,
		      const char *epoch, const uint8_t *body, size_t len)
{
	crypto_auth_hmacsha512256_init(st, key, PROTO_CLUSTER_KEY_BYTES);
	mac_state_update(st, method, uri, ts, epoch);
	if (len > 0)
		crypto_auth_hmacsha512256_update(st, body, len);
}

/* crypto_auth is HMAC-SHA-512-256; the streaming form avoids a copy. */
void trk_auth_mac(const uint8_t key[PROTO_CLUSTER_KEY_BYTES], const char *method,
		  const char *uri, uint64_t ts, const char *epoch,
		  const uint8_t *body, size_t len, uint8_t mac[TRK_AUTH_MAC_BYTES])
{
	crypto_auth_hmacsha512256_state st;

	mac_state(&st, key, method, uri, ts, epoch, body, len);
	crypto_auth_hmacsha512256_final(&st, mac);
	sodium_memzero(&st, sizeof(st));
}

void trk_auth_head_mac(const uint8_t key[PROTO_CLUSTER_KEY_BYTES],
		       const char *method, const char *uri, uint64_t ts,
		       const char *epoch, uint64_t len,
		       uint8_t mac[TRK_AUTH_MAC_BYTES])
{
	crypto_auth_hmacsha512256_state st;
	char lenbuf[32];
	int n = snprintf(lenbuf, sizeof(lenbuf), "%llu", (unsigned long long)len);

	/* "head\n" METHOD "\n" URI "\n" ts "\n" epoch "\n" len: the body
	 * mac's message never starts with a lower-case line. */
	crypto_auth_hmacsha512256_init(&st, key, PROTO_CLUSTER_KEY_BYTES);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)"head\n", 5);
	mac_state_update(&st, method, uri, ts, epoch);
	crypto_auth_hmacsha512256_update(&st, (const uint8_t *)lenbuf, (size_t)n);
	crypto_auth_hmacsha512256_final(&st, mac);
	sodium_memzero(&st, sizeof(st));
}

int trk_auth_header(const uint8_t key[PROTO_CLUSTER_KEY_BYTES],
		    const char *method, const char *uri, uint64_t ts,
		    const char *epoch, const uint8_t *body, size_t len,
		    char *buf, size_t buflen)
{
	uint8_t mac[TRK_AUTH_MAC_BYTES], head[TRK_AUTH_MAC_BYTES];
	char hex[2 * TRK_AUTH_MAC_BYTES + 1], hhex[2 * TRK_AUTH_MAC_BYTES + 1];
	int n;

	if (epoch == NULL)
		epoch = "";
	if (strlen(epoch) > 2 * TRK_EPOCH_BYTES)
		return -EINVAL;
	trk_auth_mac(key, method, uri, ts, epoch, body, len, mac);
	trk_auth_head_mac(key, method, uri, ts, epoch, len, head);
	sodium_bin2hex(hex, sizeof(hex), mac, sizeof(mac));
	sodium_bin2hex(hhex, sizeof(hhex), head, sizeof(head));
	n = snprintf(buf, buflen, "Tessera ts=%llu,ep=%s,hdr=%s,mac=%s",
		     (unsigned long long)ts, epoch, hhex, hex);
	return n < 0 || (size_t)n >= buflen ? -ENOSPC : 0;
}
