/* JSON helpers of the handlers: the fields of a request body, checked, and
 * the values answers are made of. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/server/internal.h"

void trk__hex(const uint8_t *b, size_t n, char *out)
{
	sodium_bin2hex(out, 2 * n + 1, b, n);
}

json_t *trk__json_hex(const uint8_t *b, size_t n)
{
	char *s = malloc(2 * n + 1);
	json_t *j;

	if (s == NULL)
		return NULL;
	trk__hex(b, n, s);
	j = json_string(s);
	free(s);
	return j;
}

int trk__set(json_t *o, const char *key, json_t *v)
{
	return v == NULL || json_object_set_new(o, key, v) != 0;
}

json_t *trk__jint(uint64_t v)
{
	return json_integer(v > INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *field(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_null(v) ? NULL : v;
}

int trk__get_str(json_t *o, const char *key, bool required, size_t maxlen,
		 const char **out, struct proto_err *err)
{
	json_t *v = field(o, key);
	const char *s;
	size_t n;

	if (v == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (!json_is_string(v))
		return proto_errf(err, EINVAL, "%s: must be a string", key);
	s = json_string_value(v);
	n = json_string_length(v);
	if (n == 0 || n > maxlen || strlen(s) != n)
		return proto_errf(err, EINVAL, "%s: must be 1..%zu bytes, no NUL",
				  key, maxlen);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
			return proto_errf(err, EINVAL,
					  "%s: control characters are not allowed",
					  key);
	*out = s;
	return 0;
}

int trk__get_u64(json_t *o, const char *key, bool required, uint64_t max,
		 uint64_t *out, struct proto_err *err)
{
	json_t *v = field(o, key);
	json_int_t i;

	if (v == NULL)
		return required ? proto_errf(err, EINVAL, "%s: missing", key) : 0;
	if (!json_is_integer(v))
		return proto_errf(err, EINVAL, "%s: must be an integer", key);
	i = json_integer_value(v);
	if (i < 0 || (uint64_t)i > max)
		return proto_errf(err, EINVAL, "%s: must be in 0..%llu", key,
				  (unsigned long long)max);
	*out = (uint64_t)i;
	return 0;
}

int trk__get_u64_str(json_t *o, const char *key, uint64_t *out,
		     struct proto_err *err)
{
	json_t *v = field(o, key);

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v) ||
	    proto_parse_u64(json_string_value(v), 0, UINT64_MAX, out) != 0)
		return proto_errf(err, EINVAL,
				  "%s: must be a decimal u64 in a string", key);
	return 0;
}

int trk__get_hex(json_t *o, const char *key, uint8_t *out, size_t n,
		 struct proto_err *err)
{
	json_t *v = field(o, key);

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v) || proto_parse_hex(json_string_value(v), out, n) != 0)
		return proto_errf(err, EINVAL, "%s: must be %zu hex digits", key,
				  2 * n);
	return 0;
}

int trk__get_hexvar(json_t *o, const char *key, size_t max, char **out,
		    struct proto_err *err)
{
	json_t *v = field(o, key);
	const char *s;
	size_t n;
	char *copy;

	if (v == NULL)
		return proto_errf(err, EINVAL, "%s: missing", key);
	if (!json_is_string(v))
		return proto_errf(err, EINVAL, "%s: must be a hex string", key);
	s = json_string_value(v);
	n = strlen(s);
	if (n == 0 || n % 2 != 0 || n / 2 > max || n != json_string_length(v))
		return proto_errf(err, EINVAL,
				  "%s: must be an even number of hex digits, 2..%zu",
				  key, 2 * max);
	copy = malloc(n + 1);
	if (copy == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", key);
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (ch >= 'A' && ch <= 'F')
			ch = (char)(ch - 'A' + 'a');
		if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) {
			free(copy);
			return proto_errf(err, EINVAL, "%s: not hex", key);
		}
		copy[i] = ch;
	}
	copy[n] = 0;
	*out = copy;
	return 0;
}

void trk__json_shuffle(json_t *a)
{
	for (size_t i = json_array_size(a); i > 1; i--) {
		size_t j = randombytes_uniform((uint32_t)i);
		json_t *x = json_incref(json_array_get(a, i - 1));
		json_t *y = json_incref(json_array_get(a, j));
		json_array_set_new(a, i - 1, y);
		json_array_set_new(a, j, x);
	}
}
