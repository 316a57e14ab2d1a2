/* Tunables: defaults overridden by environment variables, read once. */
#include "proto/params.h"

#include <stdlib.h>

#include "proto/log.h"
#include "proto/util.h"

struct param_def {
	const char *env;
	uint64_t def;
};

static const struct param_def param_defs[PROTO_PARAM_COUNT] = {
#define PROTO_PARAM_DEF(id, env, def, doc) [PROTO_PARAM_##id] = {env, def},
	PROTO_PARAMS(PROTO_PARAM_DEF)
#undef PROTO_PARAM_DEF
};

uint64_t proto_param(enum proto_param_id id)
{
	const struct param_def *d = &param_defs[id];
	const char *s = getenv(d->env);
	uint64_t v;

	if (s == NULL)
		return d->def;
	if (proto_parse_u64(s, 1, UINT64_MAX, &v) != 0) {
		LOG_WARN("%s=%s is not a positive number; using %llu", d->env, s,
			 (unsigned long long)d->def);
		return d->def;
	}
	return v;
}
