/* Logging to stderr with a level threshold taken from TESSERA_LOG. */
#include "proto/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_threshold = -1;
static const char *log_tag = "tessera";

static int level_from_env(void)
{
	const char *s = getenv("TESSERA_LOG");
	static const char *names[] = {"err", "warn", "info", "debug"};

	if (s == NULL)
		return PROTO_LOG_WARN;
	for (int i = 0; i < 4; i++)
		if (strcmp(s, names[i]) == 0)
			return i;
	return PROTO_LOG_WARN;
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

void proto_log(int level, const char *file, int line, const char *fmt, ...)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	char msg[1024];
	struct timespec ts;
	va_list ap;

	if (level > proto_log_level())
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &ts);
	const char *base = strrchr(file, '/');
	/* One fprintf per line keeps lines from different threads whole. */
	fprintf(stderr, "%s %ld.%03ld %s %s:%d: %s\n", log_tag, (long)ts.tv_sec,
		ts.tv_nsec / 1000000, names[level < 0 ? 0 : level > 3 ? 3 : level],
		base ? base + 1 : file, line, msg);
}
