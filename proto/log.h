/*
 * Logging: one line per event on stderr. Each line carries a UTC ISO 8601
 * timestamp with milliseconds, the level, the component (program) and its
 * identity (e.g. the node's replica/rank), the source position and the
 * message; as text for people or as one JSON object per line for log
 * shippers (--log-format json). The threshold comes from TESSERA_LOG or
 * proto_log_set_level() (the --config file's [log] level).
 *
 * Levels: err and warn are faults (something failed, or will unless a
 * person acts); note is what a person running tessera wants to see at the
 * default level, once per event (a replica activated a version, fell
 * behind, caught up); info adds the detail of each rank and request; debug
 * what repeats per chunk (callers tally it and log one line with counts
 * per version). A clean start and a normal run say nothing at warn.
 */
#ifndef PROTO_LOG_H
#define PROTO_LOG_H

#include <stddef.h>

enum proto_log_level {
	PROTO_LOG_ERR = 0,
	PROTO_LOG_WARN = 1,
	PROTO_LOG_NOTE = 2,
	PROTO_LOG_INFO = 3,
	PROTO_LOG_DEBUG = 4,
};

enum proto_log_format {
	PROTO_LOG_TEXT = 0,
	PROTO_LOG_JSON = 1,
};

/* Prints one line when level <= the threshold
 * (TESSERA_LOG=err|warn|note|info|debug, default note):
 *   2026-11-30T19:29:20.123Z warn tessera-node[r0/3] agent.c:552: message
 * or, in JSON, {"ts":..,"level":..,"component":..,"id":..,"src":..,"msg":..}.
 * Cannot fail. */
void proto_log(int level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Sets the threshold (level < 0: from TESSERA_LOG) and the component (program
 * name) shown on every line. Call before starting threads. */
void proto_log_setup(const char *tag, int level);
int proto_log_level(void);
void proto_log_set_level(int level);
/* The identity shown beside the component, e.g. "r0/3" (copied; NULL: none). */
void proto_log_set_identity(const char *id);
void proto_log_set_format(enum proto_log_format fmt);

/* "err|error|warn|note|notice|info|debug" -> level; "text|json" -> format. -EINVAL when
 * the name is none of them. */
int proto_log_parse_level(const char *s, int *level);
int proto_log_parse_format(const char *s, enum proto_log_format *fmt);
const char *proto_log_level_name(int level);
const char *proto_log_format_name(enum proto_log_format fmt);

/* Formats one line for the given wall-clock time (ms since the epoch) into
 * buf (NUL-terminated, newline included, truncated to fit). For tests. */
void proto_log_format_line(char *buf, size_t len, unsigned long long wall_ms, int level,
			   const char *file, int line, const char *msg);

#define LOG_ERR(...) proto_log(PROTO_LOG_ERR, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) proto_log(PROTO_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_NOTE(...) proto_log(PROTO_LOG_NOTE, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...) proto_log(PROTO_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_DEBUG(...) proto_log(PROTO_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#endif
