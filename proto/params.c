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

/*
 * What the environment says, cached per thread. getenv() compares the name
 * with every variable in turn: with a shell's environment that cost a
 * fetching node about 5 % of its CPU in a fanout run (the swarm asks for
 * its tunables per peer and per read). The cache holds until the
 * environment changes: setenv(), unsetenv() and putenv() replace, add or
 * remove pointers in environ (never the strings behind them), so a copy of
 * the pointer array that still matches proves nothing changed; a
 * comparison of a few hundred bytes instead of a string search per
 * variable. An environment too large for the copy is not cached.
 */
#define ENV_SNAP_MAX 256
enum { ENV_UNKNOWN, ENV_SET, ENV_UNSET }; /* ENV_UNSET: absent or unusable */

struct env_cache {
	char **base;	/* environ when copied */
	size_t n;	/* its variables */
	char *ptrs[ENV_SNAP_MAX];
	unsigned char state[PROTO_PARAM_COUNT];
	uint64_t value[PROTO_PARAM_COUNT];
};

static _Thread_local struct env_cache env_cache;

extern char **environ;

/* True when env_cache describes environ now; else resets it to do so
 * (false also when environ is too large to copy). */
static bool env_cache_valid(void)
{
	struct env_cache *c = &env_cache;
	size_t n = 0;

	if (environ != NULL)
		while (environ[n] != NULL && n <= ENV_SNAP_MAX)
			n++;
	if (c->base == environ && c->base != NULL && c->n == n &&
	    memcmp(c->ptrs, environ, n * sizeof(*environ)) == 0)
		return true;
	c->base = NULL;
	if (environ == NULL || n > ENV_SNAP_MAX)
		return false;
	memcpy(c->ptrs, environ, n * sizeof(*environ));
	c->n = n;
	c->base = environ;
	memset(c->state, ENV_UNKNOWN, sizeof(c->state));
	return true;
}

uint64_t proto_param(enum proto_param_id id)
{
	struct env_cache *c = &env_cache;
	uint64_t v;

	if (!env_cache_valid()) {
		if (env_value(id, &v) != NULL)
			return v;
	} else {
		if (c->state[id] == ENV_UNKNOWN)
			c->state[id] = env_value(id, &c->value[id]) != NULL ? ENV_SET : ENV_UNSET;
		if (c->state[id] == ENV_SET)
			return c->value[id];
	}
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
