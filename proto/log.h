/* Logging: one line per event on stderr, filtered by TESSERA_LOG. */
#ifndef PROTO_LOG_H
#define PROTO_LOG_H

enum proto_log_level {
	PROTO_LOG_ERR = 0,
	PROTO_LOG_WARN = 1,
	PROTO_LOG_INFO = 2,
	PROTO_LOG_DEBUG = 3,
};

/* Prints "tag level file:line: message" when level <= the threshold
 * (TESSERA_LOG=err|warn|info|debug, default warn). Cannot fail. */
void proto_log(int level, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* Sets the threshold and the tag (program name) shown on every line. */
void proto_log_setup(const char *tag, int level);
int proto_log_level(void);

#define LOG_ERR(...) proto_log(PROTO_LOG_ERR, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...) proto_log(PROTO_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...) proto_log(PROTO_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_DEBUG(...) proto_log(PROTO_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)

#endif
