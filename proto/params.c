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
	if (proto_param_parse(id, s, v) != 0) {
		LOG_WARN("%s=%s is not a number of at least %llu; ignored", d->env, s,
			 (unsigned long long)proto_param_min(id));
		return NULL;
	}
	return s;
}

/*
 * What the environment says, cached per thread. getenv() compares the name
 * with every variable in turn, and the swarm asks for its tunables per peer
 * and per read; the check here is a few loads (what each cost, measured:
 * proto/NOTES.md). Every tunable is a TESSERA_ variable, and setenv(),
 * unsetenv() and putenv() only replace, append or remove pointers in
 * environ (never the strings behind them):
 * adding a variable puts it last (so environ[n] or environ[n - 1] changes),
 * removing one shifts those after it (environ[n - 1] changes), and setting
 * an existing one replaces its pointer, which the cache keeps for every
 * TESSERA_ variable. What it cannot see: a variable removed and a TESSERA_
 * one added, then the last variable removed and set again to the very
 * string it had, all between two calls. An environment with more TESSERA_
 * variables than it keeps is not cached.
 */
#define ENV_TRACK_MAX 32
#define ENV_PREFIX "TESSERA_"
enum { ENV_UNKNOWN, ENV_SET, ENV_UNSET }; /* ENV_UNSET: absent or unusable */

struct env_cache {
	char **base;	/* environ when taken; NULL: nothing cached */
	size_t n;	/* its variables, at least 1 */
	char *last;	/* environ[n - 1] */
	size_t ntrack;	/* TESSERA_ variables: where, which string */
	size_t at[ENV_TRACK_MAX];
	char *ptr[ENV_TRACK_MAX];
	unsigned char state[PROTO_PARAM_COUNT];
	uint64_t value[PROTO_PARAM_COUNT];
};

static _Thread_local struct env_cache env_cache;

extern char **environ;

/* True when env_cache describes environ now; else resets it to do so
 * (false also when environ cannot be cached: empty, or too many TESSERA_
 * variables). */
static bool env_cache_valid(void)
{
	struct env_cache *c = &env_cache;
	char **e = environ;
	size_t i;

	if (c->base != NULL && c->base == e && e[c->n - 1] == c->last && e[c->n] == NULL) {
		for (i = 0; i < c->ntrack && e[c->at[i]] == c->ptr[i]; i++)
			;
		if (i == c->ntrack)
			return true;
	}
	c->base = NULL;
	c->ntrack = 0;
	if (e == NULL || e[0] == NULL)
		return false;
	for (i = 0; e[i] != NULL; i++) {
		if (strncmp(e[i], ENV_PREFIX, sizeof(ENV_PREFIX) - 1) != 0)
			continue;
		if (c->ntrack == ENV_TRACK_MAX)
			return false;
		c->at[c->ntrack] = i;
		c->ptr[c->ntrack++] = e[i];
	}
	c->n = i;
	c->last = e[i - 1];
	c->base = e;
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
	/* Those whose 0 means off or none, though they default to more. */
	return param_defs[id].def == 0 || id == PROTO_PARAM_FANOUT || id == PROTO_PARAM_DELTA_ROTATE ||
		       id == PROTO_PARAM_CHAIN_FULL || id == PROTO_PARAM_DELTA_WARM ||
		       id == PROTO_PARAM_DELTA_SCRUB || id == PROTO_PARAM_DELTA_STANDBY_QUIET_MS ||
		       id == PROTO_PARAM_HUGE_PAGES || id == PROTO_PARAM_ATTACH_FREE_GRACE_MS ||
		       id == PROTO_PARAM_SWARM_PEERS || id == PROTO_PARAM_SWARM_MEMBERS ||
		       id == PROTO_PARAM_SWARM_SLOW || id == PROTO_PARAM_HERD_READERS
		       ? 0
		       : 1;
}

int proto_param_parse(enum proto_param_id id, const char *s, uint64_t *v)
{
	return proto_parse_u64(s, proto_param_min(id), UINT64_MAX, v);
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
