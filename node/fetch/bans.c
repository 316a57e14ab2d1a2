/* Bans: peers that sent chunks failing their hash, counted per version; the
 * second bad chunk bans a peer until the version is done. */
#include "node/fetch/fetch.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool fetch_banned(const struct fetch *f, const char *id)
{
	for (uint32_t i = 0; i < f->nbad; i++)
		if (f->bad_counts[i] >= BAN_BAD_CHUNKS && strcmp(f->bad_ids[i], id) == 0)
			return true;
	return false;
}

bool fetch_bad_peer(struct fetcher *x, struct fetch *f, const char *id)
{
	uint32_t i;

	for (i = 0; i < f->nbad && strcmp(f->bad_ids[i], id) != 0; i++)
		;
	if (i == f->nbad) {
		if (f->nbad == BANS_MAX)
			return false;
		if (f->bad_ids == NULL) {
			f->bad_ids = calloc(BANS_MAX, sizeof(*f->bad_ids));
			f->bad_counts = calloc(BANS_MAX, 1);
			if (f->bad_ids == NULL || f->bad_counts == NULL)
				return false;
		}
		snprintf(f->bad_ids[i], sizeof(f->bad_ids[i]), "%s", id);
		f->nbad++;
	}
	if (f->bad_counts[i] >= BAN_BAD_CHUNKS)
		return true;
	if (++f->bad_counts[i] < BAN_BAD_CHUNKS)
		return false;
	f->nbanned++;
	proto_metrics_add(x->o.am->m, x->o.am->banned, 1);
	LOG_WARN("node %s: v%" PRIu64 ": peer %s sent %d chunks that failed their hash: banned "
		 "for this version",
		 x->o.id, f->version, id, BAN_BAD_CHUNKS);
	return true;
}

uint32_t fetch_bans(const struct fetch *f, const char **ids, uint32_t max)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < f->nbad && n < max; i++)
		if (f->bad_counts[i] >= BAN_BAD_CHUNKS)
			ids[n++] = f->bad_ids[i];
	return n;
}

