/* libFuzzer target: the tracker's request-head parser (tracker/server/head.c), fed
 * raw bytes as a connection would deliver them, a byte at a time. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct trk_head h;
	size_t end = 0;
	int rc;

	if (size > (20u << 10))
		return 0; /* the guard copies at most 20 KiB of a head */
	/* As conns.c does: find the first complete prefix. */
	while (end < size && !trk__head_complete(data, end))
		end++;
	if (!trk__head_complete(data, end))
		end = size;
	rc = trk__head_parse(data, end, &h);
	if (rc < -1 || rc > 1)
		abort();
	if (rc == 1) {
		/* Accepted heads hold printable, terminated fields. */
		if (h.method[0] == 0 || h.uri[0] == 0 ||
		    strlen(h.method) >= sizeof(h.method) ||
		    strlen(h.uri) >= sizeof(h.uri) ||
		    strlen(h.auth) >= sizeof(h.auth) || h.content_length < -1)
			abort();
		for (const char *p = h.uri; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				abort();
	}
	return 0;
}
