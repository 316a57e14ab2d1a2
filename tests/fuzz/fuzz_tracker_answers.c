/* libFuzzer target: the client's parsers of tracker answers (/sources and
 * /versions), on JSON a hostile or broken tracker could send. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/tracker.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_err err;
	struct trk_source *src = NULL;
	struct trk_version_info *vs = NULL;
	uint64_t latest = 0;
	size_t n = 0;
	json_t *j;

	if (size > (1u << 20))
		return 0;
	j = json_loadb((const char *)data, size, 0, NULL);
	if (j == NULL)
		return 0;
	if (trk_sources_parse(j, &src, &n, &err) == 0) {
		for (size_t i = 0; i < n; i++)
			if (src[i].fabric_addr_len > 0 && src[i].fabric_addr == NULL)
				abort();
		trk_sources_free(src, n);
	} else if (src != NULL) {
		abort(); /* documented: NULL on failure */
	}
	if (trk_versions_parse(j, &latest, &vs, &n, &err) == 0)
		free(vs);
	json_decref(j);
	return 0;
}
