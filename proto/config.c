/* Configuration files (INI through inih) and the options every program
 * shares: --config, --log-format, --log-level. */
#include "proto/config.h"

#include <errno.h>
#include <ini.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "proto/log.h"
#include "proto/params.h"

#define CONFIG_MAX_BYTES (1u << 20)
#define CONFIG_MAX_ENTRIES 1024

const char *const proto_config_sections[] = {"tracker", "node", "publish", NULL};

struct config_entry {
	char *section, *key, *value;
	int line;
};

struct config_file {
	const char *path;
	FILE *f;
	int line;     /* lines handed to inih so far */
	int err_line; /* where cf->rc was set */
	struct config_entry *e;
	size_t n;
	struct proto_err *err;
	int rc;
};

/* What proto_config_args() made; lives until exit or proto_config_reset(). */
static char **made_argv;
static int made_argc;
static int made_nfile; /* of made_argv[1..], the file's options */

/* Whether two keys are the same option: '-' and '_' are one character, so
 * every key takes both spellings (trainer-pubkey, trainer_pubkey). */
static bool key_eq(const char *a, const char *b)
{
	for (;; a++, b++) {
		char x = *a == '_' ? '-' : *a, y = *b == '_' ? '-' : *b;
		if (x != y)
			return false;
		if (x == '\0')
			return true;
	}
}

#define KEY_CMP_MAX 64

/* Edit distance between two keys ('-' and '_' alike), or KEY_CMP_MAX when
 * either is longer than that; past limit, only that it is past: limit + 1
 * (the rows' least value never falls, so the walk stops once it is past). */
static size_t key_distance(const char *a, const char *b, size_t limit)
{
	size_t la = strlen(a), lb = strlen(b), row[KEY_CMP_MAX + 1];

	if (la > KEY_CMP_MAX || lb > KEY_CMP_MAX)
		return KEY_CMP_MAX;
	if ((la > lb ? la - lb : lb - la) > limit)
		return limit + 1;
	for (size_t j = 0; j <= lb; j++)
		row[j] = j;
	for (size_t i = 1; i <= la; i++) {
		size_t diag = row[0], least;
		least = row[0] = i;
		for (size_t j = 1; j <= lb; j++) {
			char x = a[i - 1] == '_' ? '-' : a[i - 1], y = b[j - 1] == '_' ? '-' : b[j - 1];
			size_t sub = diag + (x != y), up = row[j] + 1, left = row[j - 1] + 1;
			diag = row[j];
			row[j] = sub < up ? (sub < left ? sub : left) : (up < left ? up : left);
			if (row[j] < least)
				least = row[j];
		}
		if (least > limit)
			return limit + 1;
	}
	return row[lb];
}

/* Keeps in *best the candidate nearest to key, if near enough to be a
 * misspelling of it (at most 2 edits, or a quarter of its length) and
 * nearer than *best. The distance is only computed up to that bound: an
 * unknown key is measured against every option and tunable, and a file
 * may hold a thousand of them. */
static void nearest(const char *key, const char *cand, const char **best, size_t *dist)
{
	size_t len = strlen(cand), cut = len / 4 > 2 ? len / 4 : 2, d;

	if (len == 0 || *dist == 0)
		return;
	if (cut > len - 1)
		cut = len - 1;
	if (cut > *dist - 1)
		cut = *dist - 1;
	d = key_distance(key, cand, cut);
	if (d <= cut) {
		*best = cand;
		*dist = d;
	}
}

/* "; did you mean 'X'?" (or "[X]" for a section), or fallback when nothing
 * is near. Static storage: use before the next call. */
static const char *suggest(const char *best, bool section, const char *fallback)
{
	static char buf[128];

	if (best == NULL)
		return fallback;
	snprintf(buf, sizeof(buf), section ? "; did you mean [%s]?" : "; did you mean '%s'?",
		 best);
	return buf;
}

static char *reader(char *str, int num, void *stream)
{
	struct config_file *cf = stream;
	char *s = fgets(str, num, cf->f);

	if (s == NULL)
		return NULL;
	cf->line++;
	if (strchr(s, '\n') == NULL && !feof(cf->f) && strlen(s) + 2 < (size_t)num) {
		/* fgets stopped early, yet strlen sees no newline: a NUL byte. */
		if (cf->rc == 0) {
			cf->rc = proto_errf(cf->err, EINVAL, "%s:%d: a NUL byte (not a text file)",
					    cf->path, cf->line);
			cf->err_line = cf->line;
		}
		return NULL;
	}
	if (strchr(s, '\n') == NULL && !feof(cf->f)) {
		/* inih would read the rest as further lines: refuse instead. */
		if (cf->rc == 0) {
			cf->rc = proto_errf(cf->err, EINVAL, "%s:%d: line longer than %d bytes",
					    cf->path, cf->line, num - 3);
			cf->err_line = cf->line;
		}
		return NULL;
	}
	return s;
}

static int on_entry(void *user, const char *section, const char *name, const char *value)
{
	struct config_file *cf = user;
	struct config_entry *e;

	if (name == NULL)
		return 1; /* a section header alone */
	if (section[0] == '\0') {
		cf->rc = proto_errf(cf->err, EINVAL, "%s:%d: '%s' is outside any [section]",
				    cf->path, cf->line, name);
		cf->err_line = cf->line;
		return 0;
	}
	for (size_t i = 0; i < cf->n; i++)
		if (strcmp(cf->e[i].section, section) == 0 && key_eq(cf->e[i].key, name)) {
			cf->rc = proto_errf(cf->err, EINVAL,
					    "%s:%d: [%s] %s is already set on line %d (as %s)",
					    cf->path, cf->line, section, name, cf->e[i].line,
					    cf->e[i].key);
			cf->err_line = cf->line;
			return 0;
		}
	if (cf->n >= CONFIG_MAX_ENTRIES) {
		cf->rc = proto_errf(cf->err, E2BIG, "%s:%d: more than %u settings", cf->path,
				    cf->line, CONFIG_MAX_ENTRIES);
		return 0;
	}
	e = realloc(cf->e, (cf->n + 1) * sizeof(*e));
	if (e == NULL) {
		cf->rc = proto_errf(cf->err, ENOMEM, "%s: out of memory", cf->path);
		return 0;
	}
	cf->e = e;
	e = &cf->e[cf->n];
	*e = (struct config_entry){strdup(section), strdup(name), strdup(value), cf->line};
	if (e->section == NULL || e->key == NULL || e->value == NULL) {
		free(e->section);
		free(e->key);
		free(e->value);
		cf->rc = proto_errf(cf->err, ENOMEM, "%s: out of memory", cf->path);
		return 0;
	}
	cf->n++;
	return 1;
}

static void file_free(struct config_file *cf)
{
	for (size_t i = 0; i < cf->n; i++) {
		free(cf->e[i].section);
		free(cf->e[i].key);
		free(cf->e[i].value);
	}
	free(cf->e);
	cf->e = NULL;
	cf->n = 0;
}

/* Reads every entry of path into cf; nothing is interpreted yet. */
static int file_read(const char *path, struct config_file *cf, struct proto_err *err)
{
	struct stat st;
	int fd, rc;

	*cf = (struct config_file){.path = path, .err = err};
	fd = proto_open_regular(path, &st, err);
	if (fd < 0)
		return fd;
	if ((uint64_t)st.st_size > CONFIG_MAX_BYTES) {
		close(fd);
		return proto_errf(err, EFBIG, "%s: larger than %u bytes", path, CONFIG_MAX_BYTES);
	}
	cf->f = fdopen(fd, "r");
	if (cf->f == NULL) {
		close(fd);
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	}
	rc = ini_parse_stream(reader, cf, on_entry, cf);
	fclose(cf->f);
	cf->f = NULL;
	/* The first error wins: inih's (a line it cannot parse) or ours. */
	if (rc > 0 && (cf->rc == 0 || rc < cf->err_line)) {
		file_free(cf);
		return proto_errf(err, EINVAL,
				  "%s:%d: not a 'key = value' line or a [section] header", path, rc);
	}
	if (cf->rc != 0) {
		file_free(cf);
		return cf->rc;
	}
	if (rc < 0) {
		file_free(cf);
		return proto_errf(err, ENOMEM, "%s: cannot be read", path);
	}
	return 0;
}

/* Options a file cannot set: the shared ones ([log] holds the log's). */
static bool is_reserved(const char *name)
{
	static const char *const reserved[] = {"config", "help", "version", "log-format",
					       "log-level"};

	for (size_t i = 0; i < PROTO_ARRAY_LEN(reserved); i++)
		if (key_eq(name, reserved[i]))
			return true;
	return false;
}

static const struct option *find_opt(const struct option *opts, const char *name)
{
	if (is_reserved(name))
		return NULL;
	for (; opts != NULL && opts->name != NULL; opts++)
		if (key_eq(opts->name, name))
			return opts;
	return NULL;
}

/* The option of opts nearest to an unknown key, or NULL. */
static const char *nearest_opt(const struct option *opts, const char *name)
{
	const char *best = NULL;
	size_t dist = SIZE_MAX;

	for (; opts != NULL && opts->name != NULL; opts++)
		if (!is_reserved(opts->name))
			nearest(name, opts->name, &best, &dist);
	return best;
}

/* A tunable by its name in either spelling (chunk_size, chunk-size). */
static int param_find(const char *name, enum proto_param_id *id)
{
	for (int i = 0; i < PROTO_PARAM_COUNT; i++)
		if (key_eq(name, proto_param_name((enum proto_param_id)i))) {
			*id = (enum proto_param_id)i;
			return 0;
		}
	return -ENOENT;
}

static const char *nearest_param(const char *name)
{
	const char *best = NULL;
	size_t dist = SIZE_MAX;

	for (int i = 0; i < PROTO_PARAM_COUNT; i++)
		nearest(name, proto_param_name((enum proto_param_id)i), &best, &dist);
	return best;
}

static int parse_bool(const char *s, bool *v)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};

	for (size_t i = 0; i < PROTO_ARRAY_LEN(yes); i++) {
		if (strcmp(s, yes[i]) == 0) {
			*v = true;
			return 0;
		}
		if (strcmp(s, no[i]) == 0) {
			*v = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* The decoded file: log settings and params, checked, not yet applied. */
struct config_values {
	int level;           /* -1: not set */
	int format;          /* -1: not set */
	uint64_t param[PROTO_PARAM_COUNT];
	bool param_set[PROTO_PARAM_COUNT];
};

static bool is_program_section(const char *s)
{
	for (size_t i = 0; proto_config_sections[i] != NULL; i++)
		if (strcmp(s, proto_config_sections[i]) == 0)
			return true;
	return false;
}

static const struct proto_config_schema *schema_of(const char *section,
						   const struct proto_config_schema *schemas,
						   size_t nschemas)
{
	for (size_t k = 0; k < nschemas; k++)
		if (strcmp(schemas[k].section, section) == 0)
			return &schemas[k];
	return NULL;
}

/* "; [tracker] takes it" (or "; [node] and [publish] take it") when a
 * section other than here takes key: [log], [params] or a program section
 * of schemas; else NULL. Static storage: use before the next call. */
static const char *elsewhere(const char *key, const char *here,
			     const struct proto_config_schema *schemas, size_t nschemas)
{
	static char buf[160];
	const char *sect[8];
	enum proto_param_id id;
	size_t n = 0, len;

	if (strcmp(here, "log") != 0 && (key_eq(key, "level") || key_eq(key, "format")))
		sect[n++] = "log";
	if (strcmp(here, "params") != 0 && param_find(key, &id) == 0)
		sect[n++] = "params";
	for (size_t k = 0; k < nschemas && n < PROTO_ARRAY_LEN(sect); k++)
		if (strcmp(schemas[k].section, here) != 0 && schemas[k].opts != NULL &&
		    find_opt(schemas[k].opts, key) != NULL)
			sect[n++] = schemas[k].section;
	if (n == 0)
		return NULL;
	len = (size_t)snprintf(buf, sizeof(buf), ";");
	for (size_t k = 0; k < n && len < sizeof(buf); k++)
		len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s[%s]",
					k == 0 ? " " : k + 1 == n ? " and " : ", ", sect[k]);
	if (len < sizeof(buf))
		snprintf(buf + len, sizeof(buf) - len, n == 1 ? " takes it" : " take it");
	return buf;
}

/* The [params] key of a tunable spelt as its environment variable
 * (TESSERA_CHUNK_SIZE), or NULL. */
static const char *param_by_env(const char *key)
{
	for (int i = 0; i < PROTO_PARAM_COUNT; i++)
		if (strcasecmp(key, proto_param_env((enum proto_param_id)i)) == 0)
			return proto_param_name((enum proto_param_id)i);
	return NULL;
}

/* [log] and [params]: checked and decoded into cv. */
static int entry_check_shared(const struct config_file *cf, const struct config_entry *e,
			      const struct proto_config_schema *schemas, size_t nschemas,
			      struct config_values *cv, struct proto_err *err)
{
	if (strcmp(e->section, "log") == 0) {
		enum proto_log_format fmt;
		const char *best = NULL, *other;
		size_t dist = SIZE_MAX;
		if (strcmp(e->key, "level") == 0) {
			if (proto_log_parse_level(e->value, &cv->level) != 0)
				return proto_errf(err, EINVAL,
						  "%s:%d: [log] level = %s: not one of "
						  "err, warn, note, info, debug",
						  cf->path, e->line, e->value);
			return 0;
		}
		if (strcmp(e->key, "format") == 0) {
			if (proto_log_parse_format(e->value, &fmt) != 0)
				return proto_errf(err, EINVAL,
						  "%s:%d: [log] format = %s: not text or json",
						  cf->path, e->line, e->value);
			cv->format = (int)fmt;
			return 0;
		}
		if ((other = elsewhere(e->key, "log", schemas, nschemas)) != NULL)
			return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [log]%s",
					  cf->path, e->line, e->key, other);
		nearest(e->key, "level", &best, &dist);
		nearest(e->key, "format", &best, &dist);
		return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [log]%s", cf->path,
				  e->line, e->key, suggest(best, false, " (level, format)"));
	}
	/* [params] */
	enum proto_param_id id;
	uint64_t v;
	const char *as, *other;
	if (param_find(e->key, &id) != 0) {
		if ((as = param_by_env(e->key)) != NULL)
			return proto_errf(err, EINVAL,
					  "%s:%d: unknown key '%s' in [params]; that is the "
					  "environment variable, the key here is '%s'",
					  cf->path, e->line, e->key, as);
		if ((other = elsewhere(e->key, "params", schemas, nschemas)) != NULL)
			return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [params]%s",
					  cf->path, e->line, e->key, other);
		return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [params]%s", cf->path,
				  e->line, e->key,
				  suggest(nearest_param(e->key), false,
					  " (the tunables: `tessera config params`)"));
	}
	if (proto_param_parse(id, e->value, &v) != 0)
		return proto_errf(err, EINVAL,
				  "%s:%d: [params] %s = %s: not a whole number of at least %llu",
				  cf->path, e->line, e->key, e->value,
				  (unsigned long long)proto_param_min(id));
	cv->param[id] = v;
	cv->param_set[id] = true;
	return 0;
}

/*
 * One entry: [log] and [params] fully; program sections against the schema
 * given for them (a section without one is accepted unchecked: it is
 * another program's), each value through its check.
 */
static int entry_check(const struct config_file *cf, const struct config_entry *e,
		       const struct proto_config_schema *schemas, size_t nschemas,
		       struct config_values *cv, struct proto_err *err)
{
	const struct proto_config_schema *sc;
	const struct option *o;
	struct proto_err why;
	const char *other;
	bool b;
	int rc;

	if (strcmp(e->section, "log") == 0 || strcmp(e->section, "params") == 0)
		return entry_check_shared(cf, e, schemas, nschemas, cv, err);
	if (!is_program_section(e->section)) {
		const char *best = NULL;
		size_t dist = SIZE_MAX;
		nearest(e->section, "log", &best, &dist);
		nearest(e->section, "params", &best, &dist);
		for (size_t k = 0; proto_config_sections[k] != NULL; k++)
			nearest(e->section, proto_config_sections[k], &best, &dist);
		return proto_errf(err, EINVAL, "%s:%d: unknown section [%s]%s", cf->path, e->line,
				  e->section,
				  suggest(best, true, " (log, params, tracker, node, publish)"));
	}
	if ((sc = schema_of(e->section, schemas, nschemas)) == NULL)
		return 0;
	if (is_reserved(e->key))
		return proto_errf(err, EINVAL,
				  "%s:%d: [%s] cannot set '%s' (the log's settings go in [log]; "
				  "--config, --help and --version only on the command line)",
				  cf->path, e->line, e->section, e->key);
	o = find_opt(sc->opts, e->key);
	if (o == NULL) {
		if ((other = elsewhere(e->key, e->section, schemas, nschemas)) != NULL)
			return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [%s]%s",
					  cf->path, e->line, e->key, e->section, other);
		return proto_errf(err, EINVAL, "%s:%d: unknown key '%s' in [%s]%s", cf->path,
				  e->line, e->key, e->section,
				  suggest(nearest_opt(sc->opts, e->key), false,
					  " (the program's long options: --help)"));
	}
	if (o->has_arg == no_argument && parse_bool(e->value, &b) != 0)
		return proto_errf(err, EINVAL, "%s:%d: [%s] %s takes true or false, not '%s'",
				  cf->path, e->line, e->section, e->key, e->value);
	if (o->has_arg == required_argument && e->value[0] == '\0')
		return proto_errf(err, EINVAL, "%s:%d: [%s] %s needs a value", cf->path, e->line,
				  e->section, e->key);
	for (const struct proto_config_value *v = sc->values; v != NULL && v->key != NULL; v++) {
		if (!key_eq(v->key, o->name) || o->has_arg == no_argument)
			continue;
		if ((rc = v->check(e->value, &why)) != 0)
			return proto_errf(err, rc < 0 ? -rc : EINVAL, "%s:%d: [%s] %s = %s: %s",
					  cf->path, e->line, e->section, e->key, e->value, why.msg);
	}
	return 0;
}

/* Checks every entry into cv. Without report, stops at the first error;
 * with it, prints every error there, one line each. Returns the first. */
static int file_check(const struct config_file *cf, const struct proto_config_schema *schemas,
		      size_t nschemas, struct config_values *cv, FILE *report,
		      struct proto_err *err)
{
	struct proto_err one;
	int rc, first = 0;

	*cv = (struct config_values){.level = -1, .format = -1};
	for (size_t i = 0; i < cf->n; i++) {
		if ((rc = entry_check(cf, &cf->e[i], schemas, nschemas, cv, &one)) == 0)
			continue;
		if (first == 0) {
			first = rc;
			if (err != NULL)
				*err = one;
		}
		if (report == NULL)
			break;
		fprintf(report, "%s\n", one.msg);
	}
	return first;
}

void proto_config_reset(void)
{
	for (int i = 0; made_argv != NULL && i < made_argc; i++)
		free(made_argv[i]);
	free(made_argv);
	made_argv = NULL;
	made_argc = 0;
	made_nfile = 0;
	proto_param_clear_file();
}

/* Takes "--name VALUE" or "--name=VALUE" at argv[*i]; *i moves past it. */
static int take_value(int argc, char **argv, int *i, const char *name, const char **value,
		      struct proto_err *err)
{
	size_t n = strlen(name);
	const char *a = argv[*i];

	if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
		return 0;
	if (a[n] == '=') {
		*value = a + n + 1;
	} else {
		if (*i + 1 >= argc)
			return proto_errf(err, EINVAL, "%s needs a value", name);
		*value = argv[++*i];
	}
	return 1;
}

static int push(char ***v, int *n, char *s)
{
	char **nv;

	if (s == NULL)
		return -ENOMEM;
	nv = realloc(*v, (size_t)(*n + 2) * sizeof(*nv));
	if (nv == NULL) {
		free(s);
		return -ENOMEM;
	}
	*v = nv;
	nv[(*n)++] = s;
	nv[*n] = NULL;
	return 0;
}

static char *format_opt(const char *key, const char *value)
{
	char *s = NULL;

	if (value == NULL)
		return asprintf(&s, "--%s", key) < 0 ? NULL : s;
	return asprintf(&s, "--%s=%s", key, value) < 0 ? NULL : s;
}

int proto_config_args(const struct proto_config_schema *schema, int *argc, char ***argv,
		      struct proto_err *err)
{
	const char *path = NULL, *fmt_s = NULL, *level_s = NULL;
	const char *section = schema->section;
	const struct option *opts = schema->opts;
	struct config_file cf = {0};
	struct config_values cv = {.level = -1, .format = -1};
	char **nv = NULL;
	int nc = 0, rc, level = -1;
	enum proto_log_format fmt = PROTO_LOG_TEXT;
	bool *keep = calloc((size_t)*argc + 1, sizeof(*keep));

	if (keep == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	for (int i = 1; i < *argc; i++) {
		int at = i;
		if (strcmp((*argv)[i], "--") == 0) {
			for (; i < *argc; i++)
				keep[i] = true;
			break;
		}
		if ((rc = take_value(*argc, *argv, &i, "--config", &path, err)) == 0 &&
		    (rc = take_value(*argc, *argv, &i, "--log-format", &fmt_s, err)) == 0 &&
		    (rc = take_value(*argc, *argv, &i, "--log-level", &level_s, err)) == 0)
			keep[at] = true;
		if (rc < 0)
			goto out;
	}
	if (fmt_s != NULL && proto_log_parse_format(fmt_s, &fmt) != 0) {
		rc = proto_errf(err, EINVAL, "--log-format %s is not text or json", fmt_s);
		goto out;
	}
	if (level_s != NULL && proto_log_parse_level(level_s, &level) != 0) {
		rc = proto_errf(err, EINVAL, "--log-level %s is not one of err, warn, note, info, debug",
				level_s);
		goto out;
	}
	if (path != NULL) {
		rc = file_read(path, &cf, err);
		if (rc == 0)
			rc = file_check(&cf, schema, 1, &cv, NULL, err);
		if (rc != 0)
			goto out;
	}
	/* The new vector: argv[0], the file's options, the rest of the line. */
	rc = push(&nv, &nc, strdup((*argv)[0]));
	for (size_t i = 0; rc == 0 && i < cf.n; i++) {
		const struct config_entry *e = &cf.e[i];
		const struct option *o;
		bool b = true;
		if (strcmp(e->section, section) != 0)
			continue;
		o = find_opt(opts, e->key);
		if (o->has_arg == no_argument) {
			parse_bool(e->value, &b);
			if (b)
				rc = push(&nv, &nc, format_opt(o->name, NULL));
		} else {
			rc = push(&nv, &nc, format_opt(o->name, e->value));
		}
	}
	int nfile = nc - 1;
	for (int i = 1; rc == 0 && i < *argc; i++)
		if (keep[i])
			rc = push(&nv, &nc, strdup((*argv)[i]));
	if (rc != 0) {
		rc = proto_errf(err, ENOMEM, "out of memory");
		goto out;
	}
	/* Everything checked: apply. Flags and the environment beat the file. */
	for (int id = 0; id < PROTO_PARAM_COUNT; id++)
		if (cv.param_set[id])
			proto_param_set_file((enum proto_param_id)id, cv.param[id]);
	if (level >= 0)
		proto_log_set_level(level);
	else if (cv.level >= 0 && getenv("TESSERA_LOG") == NULL)
		proto_log_set_level(cv.level);
	if (fmt_s != NULL)
		proto_log_set_format(fmt);
	else if (cv.format >= 0)
		proto_log_set_format((enum proto_log_format)cv.format);
	for (int i = 0; made_argv != NULL && i < made_argc; i++)
		free(made_argv[i]);
	free(made_argv);
	made_argv = nv;
	made_argc = nc;
	made_nfile = nfile;
	nv = NULL;
	*argc = made_argc;
	*argv = made_argv;
out:
	for (int i = 0; nv != NULL && i < nc; i++)
		free(nv[i]);
	free(nv);
	file_free(&cf);
	free(keep);
	return rc;
}

int proto_config_file_args(void)
{
	return made_nfile;
}

void proto_config_cli(const char *prog, const struct proto_config_schema *schema, int *argc,
		      char ***argv)
{
	struct proto_err err;

	if (proto_config_args(schema, argc, argv, &err) != 0) {
		fprintf(stderr, "%s: %s\n", prog, err.msg);
		exit(2);
	}
}

static const char *source_name(enum proto_param_source s)
{
	return s == PROTO_PARAM_FROM_ENV ? "environment" : s == PROTO_PARAM_FROM_FILE ? "file" : "default";
}

/* Every TESSERA_ tunable the environment sets to what the programs ignore,
 * as they warn of it; one line each on errs. Returns the first error. */
static int env_check(FILE *errs, struct proto_err *err)
{
	int first = 0;

	for (int i = 0; i < PROTO_PARAM_COUNT; i++) {
		enum proto_param_id id = (enum proto_param_id)i;
		const char *s = getenv(proto_param_env(id));
		struct proto_err one;
		uint64_t v;
		if (s == NULL || proto_param_parse(id, s, &v) == 0)
			continue;
		proto_errf(&one, EINVAL,
			   "environment: %s=%s is not a number of at least %llu (the programs "
			   "ignore it)",
			   proto_param_env(id), s, (unsigned long long)proto_param_min(id));
		if (first == 0) {
			first = -EINVAL;
			if (err != NULL)
				*err = one;
		}
		if (errs != NULL)
			fprintf(errs, "%s\n", one.msg);
	}
	return first;
}

int proto_config_check(const char *path, const struct proto_config_schema *schemas,
		       size_t nschemas, FILE *out, FILE *errs, struct proto_err *err)
{
	struct config_file cf;
	struct config_values cv;
	int rc, erc, level = PROTO_LOG_NOTE;

	for (size_t i = 0; proto_config_sections[i] != NULL; i++) {
		bool have = false;
		for (size_t k = 0; k < nschemas; k++)
			have |= strcmp(schemas[k].section, proto_config_sections[i]) == 0;
		if (!have) {
			rc = proto_errf(err, EINVAL, "no schema for [%s]", proto_config_sections[i]);
			if (errs != NULL)
				fprintf(errs, "%s\n", err->msg);
			return rc;
		}
	}
	rc = file_read(path, &cf, err);
	if (rc != 0) {
		if (errs != NULL)
			fprintf(errs, "%s\n", err->msg);
		return rc;
	}
	rc = file_check(&cf, schemas, nschemas, &cv, errs, err);
	erc = env_check(errs, rc == 0 ? err : NULL);
	if (rc == 0)
		rc = erc;
	if (rc != 0)
		goto out;
	if (getenv("TESSERA_LOG") != NULL)
		proto_log_parse_level(getenv("TESSERA_LOG"), &level);
	else if (cv.level >= 0)
		level = cv.level;
	fprintf(out, "# %s: valid; effective values (flags given at start-up still override)\n",
		path);
	fprintf(out, "[log]\nlevel = %s\nformat = %s\n\n[params]\n", proto_log_level_name(level),
		proto_log_format_name(cv.format == PROTO_LOG_JSON ? PROTO_LOG_JSON : PROTO_LOG_TEXT));
	for (int id = 0; id < PROTO_PARAM_COUNT; id++) {
		enum proto_param_id p = (enum proto_param_id)id;
		uint64_t v = cv.param_set[id] ? cv.param[id] : proto_param_default(p);
		enum proto_param_source src =
			cv.param_set[id] ? PROTO_PARAM_FROM_FILE : PROTO_PARAM_FROM_DEFAULT;
		const char *env = getenv(proto_param_env(p));
		uint64_t ev;
		if (env != NULL && proto_param_parse(p, env, &ev) == 0) {
			v = ev;
			src = PROTO_PARAM_FROM_ENV;
		}
		fprintf(out, "%s = %llu  ; %s (%s; %s)\n", proto_param_name(p), (unsigned long long)v,
			proto_param_doc(p), source_name(src), proto_param_env(p));
	}
	for (size_t s = 0; proto_config_sections[s] != NULL; s++) {
		bool any = false;
		for (size_t i = 0; i < cf.n; i++) {
			if (strcmp(cf.e[i].section, proto_config_sections[s]) != 0)
				continue;
			if (!any)
				fprintf(out, "\n[%s]\n", proto_config_sections[s]);
			any = true;
			const struct option *o = NULL;
			for (size_t k = 0; k < nschemas; k++)
				if (strcmp(schemas[k].section, proto_config_sections[s]) == 0)
					o = find_opt(schemas[k].opts, cf.e[i].key);
			/* Each key under its option's name (dashes). */
			fprintf(out, "%s = %s\n", o != NULL ? o->name : cf.e[i].key, cf.e[i].value);
		}
	}
out:
	file_free(&cf);
	return rc;
}
