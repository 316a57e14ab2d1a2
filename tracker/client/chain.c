/* The chain guard's judgement of one X-Tessera-Chain header against the
 * chain seen (tracker.h, "The chain guard"): a pure function, so that the
 * client's use of it and its fuzz target are the same code. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "tracker/client/chain.h"

/* Exactly want lower-case hex digits, then the end. */
static bool hex_exact(const char *s, size_t n, size_t want)
{
	return n == want && strspn(s, "0123456789abcdef") == n;
}

/* The next space-delimited field of h (one space between fields, none
 * before or after): its start and length; *h moves past it. */
static size_t next_field(const char **h, const char **start)
{
	size_t n = strcspn(*h, " ");

	*start = *h;
	*h += n;
	if (**h == ' ')
		(*h)++;
	return n;
}

int trk__chain_parse(const char *h, struct trk__chain *out)
{
	const char *f[4], *p = h;
	size_t n[4];
	uint64_t latest = 0;

	if (strlen(h) >= TRK_CHAIN_MAX)
		return -EPROTO;
	for (int i = 0; i < 4; i++) {
		n[i] = next_field(&p, &f[i]);
		if (n[i] == 0)
			return -EPROTO;
	}
	if (*p != 0 || p[-1] == ' ' || !hex_exact(f[0], n[0], 2 * TRK_CLUSTER_ID_BYTES) ||
	    !hex_exact(f[1], n[1], 2 * TRK_EPOCH_BYTES) || n[2] > 20 ||
	    (n[2] > 1 && f[2][0] == '0'))
		return -EPROTO;
	/* The latest version: decimal digits only, no sign, no leading zero,
	 * no overflow. */
	for (size_t i = 0; i < n[2]; i++) {
		unsigned d = (unsigned)(f[2][i] - '0');
		if (d > 9 || latest > (UINT64_MAX - d) / 10)
			return -EPROTO;
		latest = latest * 10 + d;
	}
	if (n[3] == 1 && f[3][0] == '-' ? latest != 0 :
					   !hex_exact(f[3], n[3], 2 * PROTO_HASH_BYTES))
		return -EPROTO;
	memcpy(out->cluster, f[0], n[0]);
	out->cluster[n[0]] = 0;
	memcpy(out->instance, f[1], n[1]);
	out->instance[n[1]] = 0;
	memcpy(out->digest, f[3], n[3]);
	out->digest[n[3]] = 0;
	out->latest = latest;
	return 0;
}

int trk__chain_check(struct trk__chain_seen *seen, const char *h, const char *who,
		     char *msg, size_t cap)
{
	struct trk__chain a;

	if (h == NULL)
		return 0;
	if (trk__chain_parse(h, &a) != 0) {
		snprintf(msg, cap, "tracker %s: malformed %s header", who, TRK_CHAIN_HEADER);
		return -EPROTO;
	}
	if (!seen->have) {
		seen->have = true;
		memcpy(seen->c.cluster, a.cluster, sizeof(a.cluster));
	} else if (strcmp(a.cluster, seen->c.cluster) != 0) {
		snprintf(msg, cap,
			 "tracker %s forgot the chain: its cluster id is %s, not "
			 "%s (up to version %llu) seen before; its state was lost "
			 "or replaced (restore it, or restart this process to "
			 "accept a new chain)",
			 who, a.cluster, seen->c.cluster, (unsigned long long)seen->c.latest);
		return -ESTALE;
	}
	/* The same tracker process never goes back; answers of one process
	 * may arrive out of order, so only another process is held to it. */
	if (strcmp(a.instance, seen->c.instance) != 0 && seen->c.latest > 0 &&
	    (a.latest < seen->c.latest ||
	     (a.latest == seen->c.latest && strcmp(a.digest, seen->c.digest) != 0))) {
		snprintf(msg, cap,
			 "tracker %s forgot the chain: its latest version is %llu "
			 "%.16s, but version %llu %.16s was seen before; its state "
			 "was lost or truncated (restore it, or restart this "
			 "process to accept a new chain)",
			 who, (unsigned long long)a.latest, a.digest,
			 (unsigned long long)seen->c.latest, seen->c.digest);
		return -ESTALE;
	}
	if (a.latest >= seen->c.latest) {
		seen->c.latest = a.latest;
		memcpy(seen->c.digest, a.digest, sizeof(a.digest));
		memcpy(seen->c.instance, a.instance, sizeof(a.instance));
	}
	return 0;
}
