/* Where a node is: site names as registrations, source lists and queries
 * carry them (tracker/API.md, "Sites"). */
#include <errno.h>
#include <string.h>

#include "tracker/tracker.h"

bool trk_site_valid(const char *s)
{
	size_t n = s != NULL ? strlen(s) : 0;

	if (n == 0 || n > TRK_SITE_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
		      (ch >= '0' && ch <= '9') || ch == '.' || ch == '_' || ch == '-'))
			return false;
	}
	return true;
}

int trk_site_check(const char *v, struct proto_err *err)
{
	if (!trk_site_valid(v))
		return proto_errf(err, EINVAL, "want a site name: 1..%d of [A-Za-z0-9._-]",
				  TRK_SITE_MAX);
	return 0;
}

bool trk_site_same(const char *a, const char *b)
{
	return strcmp(a != NULL ? a : "", b != NULL ? b : "") == 0;
}
