/* Option values: the one parser of each kind of value a flag or a
 * configuration key takes (proto/optval.h). */
#include "proto/optval.h"

#include <ctype.h>
#include <errno.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/manifest.h"
#include "proto/spec.h"

/* One number of a rank list: digits only, at most max. */
static int rank_num(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	char buf[24];

	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]))
			return -EINVAL;
	memcpy(buf, s, n);
	buf[n] = '\0';
	return proto_parse_u64(buf, 0, max, out);
}

int proto_ranks_next(const char **p, uint64_t max, uint64_t *lo, uint64_t *hi)
{
	const char *s = *p;
	size_t item, dash;

	if (s == NULL || *s == '\0')
		return 0;
	item = strcspn(s, ",");
	dash = strcspn(s, "-");
	if (dash < item) {
		if (rank_num(s, dash, max, lo) != 0 ||
		    rank_num(s + dash + 1, item - dash - 1, max, hi) != 0 || *hi < *lo)
			return -EINVAL;
	} else if (rank_num(s, item, max, lo) == 0) {
		*hi = *lo;
	} else {
		return -EINVAL;
	}
	if (s[item] == ',' && s[item + 1] == '\0')
		return -EINVAL; /* a trailing comma: an empty last item */
	*p = s[item] == ',' ? s + item + 1 : s + item;
	return 1;
}

int proto_hostport_parse(const char *spec, char *host, size_t hlen, uint16_t *port)
{
	const char *colon = strrchr(spec, ':');
	uint64_t p;
	size_t n;

	if (colon == NULL || colon == spec || proto_parse_u64(colon + 1, 0, 65535, &p) != 0)
		return -EINVAL;
	n = (size_t)(colon - spec);
	if (spec[0] == '[') {
		if (n < 3 || spec[n - 1] != ']')
			return -EINVAL;
		spec++;
		n -= 2;
	}
	if (n == 0 || n >= hlen)
		return -EINVAL;
	memcpy(host, spec, n);
	host[n] = '\0';
	*port = (uint16_t)p;
	return 0;
}

int proto_optval_ranks(const char *v, struct proto_err *err)
{
	uint64_t lo, hi;
	int rc, n = 0;

	while ((rc = proto_ranks_next(&v, 65535, &lo, &hi)) == 1)
		n++;
	if (rc < 0 || n == 0)
		return proto_errf(err, EINVAL, "want R, R-S or a comma list of those (0-3, 0,2)");
	return 0;
}

int proto_optval_hostport(const char *v, struct proto_err *err)
{
	char host[256];
	uint16_t port;

	if (proto_hostport_parse(v, host, sizeof(host), &port) != 0)
		return proto_errf(err, EINVAL, "want HOST:PORT");
	return 0;
}

int proto_optval_file(const char *v, struct proto_err *err)
{
	struct stat st;
	int fd = proto_open_regular(v, &st, err);

	if (fd < 0)
		return fd;
	close(fd);
	return 0;
}

int proto_optval_dir(const char *v, struct proto_err *err)
{
	struct stat st;

	if (stat(v, &st) != 0)
		return proto_errf(err, errno, "%s", strerror(errno));
	if (!S_ISDIR(st.st_mode))
		return proto_errf(err, ENOTDIR, "not a directory");
	return 0;
}

int proto_optval_pubkey(const char *v, struct proto_err *err)
{
	uint8_t pk[PROTO_PK_BYTES];

	return proto_key_load_public(v, pk, err);
}

int proto_optval_secret_key(const char *v, struct proto_err *err)
{
	uint8_t sk[PROTO_SK_BYTES];
	int rc = proto_key_load_secret(v, sk, err);

	sodium_memzero(sk, sizeof(sk));
	return rc;
}

int proto_optval_cluster_key(const char *v, struct proto_err *err)
{
	uint8_t k[PROTO_CLUSTER_KEY_BYTES];
	int rc = proto_key_load_cluster(v, k, err);

	sodium_memzero(k, sizeof(k));
	return rc;
}

int proto_optval_layout(const char *v, struct proto_err *err)
{
	if (proto_layout_arg_is_file(v))
		return proto_optval_file(v, err);
	if (proto_layout_builtin_parse(v, NULL, NULL) != 0)
		return proto_errf(err, EINVAL, "not a built-in (tpN, tpN:fp8 or fsdpN) nor a layout file");
	return 0;
}

int proto_optval_u64(const char *v, struct proto_err *err)
{
	uint64_t n;

	if (proto_parse_u64(v, 0, UINT64_MAX, &n) != 0)
		return proto_errf(err, EINVAL, "not a whole number");
	return 0;
}
