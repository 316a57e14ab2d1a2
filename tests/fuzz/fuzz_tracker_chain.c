/* libFuzzer target: the client's chain guard (tracker/client/chain.c) on the
 * X-Tessera-Chain headers a hostile or broken tracker could send: up to 16
 * headers, one per line, judged in turn against the chain seen. An
 * accepted header is exactly the canonical form of what it parsed to; the
 * chain seen never goes back. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/client/chain.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct trk__chain_seen seen = {0};
	char line[512], again[512], msg[1024];
	struct trk__chain c;

	for (int k = 0; k < 16 && size > 0; k++) {
		const uint8_t *nl = memchr(data, '\n', size);
		size_t n = nl ? (size_t)(nl - data) : size;
		uint64_t before = seen.c.latest;
		bool had = seen.have;
		int rc;

		snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) ? n : sizeof(line) - 1),
			 (const char *)data);
		data += nl ? n + 1 : size;
		size -= nl ? n + 1 : size;
		if (trk__chain_parse(line, &c) == 0) {
			snprintf(again, sizeof(again), "%s %s %" PRIu64 " %s", c.cluster, c.instance,
				 c.latest, c.digest);
			if (strcmp(again, line) != 0)
				abort();
		}
		rc = trk__chain_check(&seen, line, "fuzz", msg, sizeof(msg));
		if (rc != 0 && rc != -ESTALE && rc != -EPROTO)
			abort();
		if (rc != 0 && (msg[0] == 0 || strchr(msg, '\n') != NULL))
			abort();
		if (seen.c.latest < before || (had && !seen.have))
			abort();
		if (rc == 0 && (!seen.have || strlen(seen.c.cluster) != 32))
			abort();
		msg[0] = 0;
	}
	return 0;
}
