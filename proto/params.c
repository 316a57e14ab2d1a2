/* Tunables: defaults, overridden by a configuration file, then by the
 * environment. */
#include "proto/params.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "proto/util.h"

struct param_def {
	const char *name;
	const char *env;
	uint64_t def;
	const char *doc;
};

static const struct param_def param_defs[PROTO_PARAM_COUNT] = {
#define PROTO_PARAM_DEF(id, env, def, doc) [PROTO_PARAM_##id] = {#id, env, def, doc},
	PROTO_PARAMS(PROTO_PARAM_DEF)
#undef PROTO_PARAM_DEF
};

/* Lower-case names, built once from the ids. */
static char param_names[PROTO_PARAM_COUNT][32];
static uint64_t file_value[PROTO_PARAM_COUNT];
static bool file_set[PROTO_PARAM_COUNT];

static const char *env_value(enum proto_param_id id, uint64_t *v)
{
	const struct param_def *d = &param_defs[id];
	const char *s = getenv(d->env);

	if (s == NULL)
		return NULL;
	if (proto_parse_u64(s, proto_param_min(id), UINT64_MAX, v) != 0) {
		LOG_WARN("%s=%s is not a number of at least %llu; ignored", d->env, s,
			 (unsigned long long)proto_param_min(id));
		return NULL;
	}
	return s;
}

uint64_t proto_param(enum proto_param_id id)
{
	uint64_t v;

	if (env_value(id, &v) != NULL)
		return v;
	return file_set[id] ? file_value[id] : param_defs[id].def;
}

const char *proto_param_name(enum proto_param_id id)
{
	char *n = param_names[id];

	if (n[0] == '\0') {
		size_t i;
		for (i = 0; param_defs[id].name[i] != '\0' && i + 1 < sizeof(param_names[id]); i++) {
			char c = param_defs[id].name[i];
			n[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
		}
		n[i] = '\0';
	}
	return n;
}

const char *proto_param_env(enum proto_param_id id)
{
	return param_defs[id].env;
}

const char *proto_param_doc(enum proto_param_id id)
{
	return param_defs[id].doc;
}

uint64_t proto_param_default(enum proto_param_id id)
{
	return param_defs[id].def;
}

uint64_t proto_param_min(enum proto_param_id id)
{
	return param_defs[id].def == 0 || id == PROTO_PARAM_FANOUT || id == PROTO_PARAM_DELTA_ROTATE ||
		       id == PROTO_PARAM_CHAIN_FULL
		       ? 0
		       : 1;
}

enum proto_param_source proto_param_source(enum proto_param_id id)
{
	uint64_t v;

	if (getenv(param_defs[id].env) != NULL && env_value(id, &v) != NULL)
		return PROTO_PARAM_FROM_ENV;
	return file_set[id] ? PROTO_PARAM_FROM_FILE : PROTO_PARAM_FROM_DEFAULT;
}

int proto_param_find(const char *name, enum proto_param_id *id)
{
	for (int i = 0; i < PROTO_PARAM_COUNT; i++)
		if (strcmp(name, proto_param_name((enum proto_param_id)i)) == 0) {
			*id = (enum proto_param_id)i;
			return 0;
		}
	return -ENOENT;
}

void proto_param_set_file(enum proto_param_id id, uint64_t v)
{
	file_value[id] = v;
	file_set[id] = true;
}

void proto_param_clear_file(void)
{
	memset(file_set, 0, sizeof(file_set));
}
