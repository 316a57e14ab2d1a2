/* Logging to stderr: UTC ISO 8601 stamps, level, component and identity. */
#include "proto/log.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_threshold = -1;
static enum proto_log_format log_format = PROTO_LOG_TEXT;
static const char *log_tag = "tessera";
static char log_id[128];

static const char *level_names[] = {"error", "warn", "note", "info", "debug"};
#define NLEVELS ((int)(sizeof(level_names) / sizeof(level_names[0])))

int proto_log_parse_level(const char *s, int *level)
{
	static const char *short_names[] = {"err", "warn", "notice", "info", "debug"};

	for (int i = 0; s != NULL && i < NLEVELS; i++)
		if (strcmp(s, short_names[i]) == 0 || strcmp(s, level_names[i]) == 0) {
			*level = i;
			return 0;
		}
	return -EINVAL;
}

int proto_log_parse_format(const char *s, enum proto_log_format *fmt)
{
	if (s != NULL && strcmp(s, "text") == 0)
		*fmt = PROTO_LOG_TEXT;
	else if (s != NULL && strcmp(s, "json") == 0)
		*fmt = PROTO_LOG_JSON;
	else
		return -EINVAL;
	return 0;
}

const char *proto_log_level_name(int level)
{
	return level_names[level < 0 ? 0 : level >= NLEVELS ? NLEVELS - 1 : level];
}

const char *proto_log_format_name(enum proto_log_format fmt)
{
	return fmt == PROTO_LOG_JSON ? "json" : "text";
}

static int level_from_env(void)
{
	int level;

	if (proto_log_parse_level(getenv("TESSERA_LOG"), &level) != 0)
		return PROTO_LOG_NOTE;
	return level;
}

void proto_log_setup(const char *tag, int level)
{
	if (tag != NULL)
		log_tag = tag;
	log_threshold = level >= 0 ? level : level_from_env();
}

int proto_log_level(void)
{
	if (log_threshold < 0)
		log_threshold = level_from_env();
	return log_threshold;
}

void proto_log_set_level(int level)
{
	log_threshold = level < 0 ? 0 : level >= NLEVELS ? NLEVELS - 1 : level;
}

void proto_log_set_identity(const char *id)
{
	snprintf(log_id, sizeof(log_id), "%s", id != NULL ? id : "");
}

void proto_log_set_format(enum proto_log_format fmt)
{
	log_format = fmt;
}

void proto_log_format_line(char *buf, size_t len, unsigned long long wall_ms, int level,
			   const char *file, int line, const char *msg)
{
	time_t secs = (time_t)(wall_ms / 1000);
	char ts[40], src[160];
	struct tm tm;

	gmtime_r(&secs, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%03uZ", tm.tm_year + 1900,
		 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		 (unsigned)(wall_ms % 1000));
	const char *base = strrchr(file, '/');
	snprintf(src, sizeof(src), "%s:%d", base ? base + 1 : file, line);
	if (log_format == PROTO_LOG_JSON) {
		json_t *o = json_pack("{s:s,s:s,s:s}", "ts", ts, "level", proto_log_level_name(level),
				      "component", log_tag);
		char *s = NULL;
		if (o != NULL && log_id[0] != '\0')
			json_object_set_new(o, "id", json_string(log_id));
		if (o != NULL) {
			json_object_set_new(o, "src", json_string(src));
			/* Not UTF-8 (a peer's bytes): say so rather than drop it. */
			json_t *m = json_string(msg);
			json_object_set_new(o, "msg", m != NULL ? m : json_string("(not UTF-8)"));
		}
		if (o != NULL)
			s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
		/* A message that is not UTF-8 still makes one line. */
		snprintf(buf, len, "%s\n",
			 s != NULL ? s : "{\"level\":\"error\",\"msg\":\"unloggable message\"}");
		free(s);
		json_decref(o);
		return;
	}
	snprintf(buf, len, "%s %s %s%s%s%s %s: %s\n", ts, proto_log_level_name(level), log_tag,
		 log_id[0] ? "[" : "", log_id, log_id[0] ? "]" : "", src, msg);
}

void proto_log(int level, const char *file, int line, const char *fmt, ...)
{
	char msg[1024], out[2048];
	struct timespec ts;
	va_list ap;

	if (level > proto_log_level())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* One event, one line: a message never breaks the line it is on. */
	for (char *p = msg; *p != '\0'; p++)
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	clock_gettime(CLOCK_REALTIME, &ts);
	proto_log_format_line(out, sizeof(out),
			      (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000,
			      level, file, line, msg);
	size_t n = strlen(out);
	if (n > 0 && out[n - 1] != '\n')
		out[n - 1] = '\n'; /* truncated: keep it one line */
	/* One write per line keeps lines from different threads whole. */
	fputs(out, stderr);
}
