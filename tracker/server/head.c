/* A request's head (request line and headers) read from raw bytes, so the
 * tracker can judge a request before evhttp buffers its body. */
#include <string.h>

#include "tracker/server/internal.h"

bool trk__head_complete(const uint8_t *buf, size_t len)
{
	/* An empty line ends the head; evhttp takes "\n" or "\r\n". */
	if (len >= 2 && buf[len - 1] == '\n' && buf[len - 2] == '\n')
		return true;
	return len >= 3 && buf[len - 1] == '\n' && buf[len - 2] == '\r' &&
	       buf[len - 3] == '\n';
}

/* One line without its end; *at moves past it. NULL at the end. */
static const char *next_line(const uint8_t *buf, size_t len, size_t *at,
			     size_t *n)
{
	const uint8_t *p = buf + *at, *nl;

	if (*at >= len)
		return NULL;
	nl = memchr(p, '\n', len - *at);
	if (nl == NULL)
		return NULL;
	*n = (size_t)(nl - p);
	if (*n > 0 && p[*n - 1] == '\r')
		(*n)--;
	*at = (size_t)(nl - buf) + 1;
	return (const char *)p;
}

static bool name_is(const char *p, size_t n, const char *name)
{
	return n == strlen(name) && strncasecmp(p, name, n) == 0;
}

/* Copies a token of n bytes into out (cap bytes); false if it does not fit
 * or holds a control character or NUL. */
static bool copy_tok(const char *p, size_t n, char *out, size_t cap)
{
	if (n == 0 || n >= cap)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
			return false;
	memcpy(out, p, n);
	out[n] = 0;
	return true;
}

/* A header name is an HTTP token (RFC 9110 5.1): no spaces, no controls. A
 * line that starts with a space or tab (obs-fold) or names a header with
 * spaces before its colon fails here: read one way by this parser and
 * another by evhttp, it would smuggle a length or a signature past the
 * judge. */
static bool name_ok(const char *p, size_t n)
{
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)p[i] <= 0x20 || p[i] == 0x7f ||
		    strchr("\"(),/:;<=>?@[\\]{}", p[i]) != NULL)
			return false;
	return true;
}

int trk__head_parse(const uint8_t *buf, size_t len, struct trk_head *out)
{
	size_t at = 0, n, sp1, sp2;
	const char *line;

	memset(out, 0, sizeof(*out));
	out->content_length = -1;
	line = next_line(buf, len, &at, &n);
	if (line == NULL)
		return 0;
	/* METHOD SP URI SP HTTP/1.x */
	for (sp1 = 0; sp1 < n && line[sp1] != ' '; sp1++)
		;
	for (sp2 = sp1 + 1; sp2 < n && line[sp2] != ' '; sp2++)
		;
	if (sp1 >= n || sp2 >= n || !copy_tok(line, sp1, out->method,
					       sizeof(out->method)) ||
	    !copy_tok(line + sp1 + 1, sp2 - sp1 - 1, out->uri, sizeof(out->uri)) ||
	    n - sp2 - 1 != 8 || strncmp(line + sp2 + 1, "HTTP/1.", 7) != 0 ||
	    (line[n - 1] != '0' && line[n - 1] != '1'))
		return -1;
	while ((line = next_line(buf, len, &at, &n)) != NULL) {
		const char *colon, *v;
		size_t vn;

		if (n == 0)
			return 1;
		colon = memchr(line, ':', n);
		if (colon == NULL || !name_ok(line, (size_t)(colon - line)))
			return -1;
		v = colon + 1;
		vn = n - (size_t)(v - line);
		while (vn > 0 && (*v == ' ' || *v == '\t')) {
			v++;
			vn--;
		}
		while (vn > 0 && (v[vn - 1] == ' ' || v[vn - 1] == '\t'))
			vn--;
		if (name_is(line, (size_t)(colon - line), "Content-Length")) {
			uint64_t cl = 0;

			if (vn == 0 || vn > 19)
				return -1;
			for (size_t i = 0; i < vn; i++) {
				if (v[i] < '0' || v[i] > '9')
					return -1;
				cl = cl * 10 + (uint64_t)(v[i] - '0');
			}
			if (out->content_length >= 0 &&
			    (uint64_t)out->content_length != cl)
				return -1; /* two different lengths */
			out->content_length = (int64_t)cl;
		} else if (name_is(line, (size_t)(colon - line),
				   "Transfer-Encoding")) {
			out->chunked = true;
		} else if (name_is(line, (size_t)(colon - line),
				   "Authorization")) {
			if (out->has_auth)
				return -1;
			/* Longer than the tracker takes: judged as absent-ish
			 * by trk__auth_check_head ("too long"). */
			if (!copy_tok(v, PROTO_MIN(vn, sizeof(out->auth) - 1),
				      out->auth, sizeof(out->auth)))
				return -1;
			out->has_auth = true;
		}
	}
	return 0;
}
