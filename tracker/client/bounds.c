/* What a tracker's answer may weigh, per endpoint: a client takes no more
 * than its kind of answer can hold from an honest tracker (client.h). */
#include <stdbool.h>
#include <string.h>

#include "proto/params.h"
#include "tracker/client/client.h"

/* At most 256 versions, each with its retained layouts and up to 16
 * addenda (tracker/API.md): under 2 MiB. */
#define VERSIONS_ANSWER_MAX (4u << 20)
/* A state report's answer carries the replica's statements (about 220
 * bytes a rank). */
#define STATE_ANSWER_MAX (1u << 20)
/* Every other POST is answered with a few ids and numbers. */
#define ACK_ANSWER_MAX (64u << 10)

static bool is(const char *path, const char *what)
{
	size_t n = strlen(what);

	return strncmp(path, what, n) == 0 && (path[n] == 0 || path[n] == '?');
}

static bool under(const char *path, const char *what)
{
	return strncmp(path, what, strlen(what)) == 0;
}

size_t trk__answer_max(bool post, const char *path)
{
	size_t cluster = proto_param(PROTO_PARAM_TRACKER_ANSWER_MAX);
	size_t manifest = proto_param(PROTO_PARAM_MANIFEST_MAX);

	if (post) {
		if (is(path, TRK_API "/sources"))
			return cluster;
		if (is(path, TRK_API "/nodes/state"))
			return STATE_ANSWER_MAX;
		return ACK_ANSWER_MAX;
	}
	/* Signed bytes: a manifest, an addendum (or the list of addenda). */
	if (under(path, TRK_API "/versions/") && strstr(path, "/manifest") != NULL)
		return manifest;
	if (is(path, TRK_API "/addenda"))
		return manifest;
	if (is(path, TRK_API "/versions"))
		return VERSIONS_ANSWER_MAX;
	/* Sources, holders, layouts, replicas, status, timelines: they grow
	 * with the cluster. */
	return cluster;
}
