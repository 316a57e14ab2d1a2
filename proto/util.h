/* Small shared helpers: one-line errors, bounded file I/O, clocks. */
#ifndef PROTO_UTIL_H
#define PROTO_UTIL_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define PROTO_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define PROTO_MIN(a, b) ((a) < (b) ? (a) : (b))
#define PROTO_MAX(a, b) ((a) > (b) ? (a) : (b))
#define proto_container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

/*
 * A one-line, human-readable error. Every parser of outside bytes fills one
 * (naming the file and field) and returns a negative errno. Functions take a
 * `struct proto_err *` that may be NULL when the caller does not care.
 */
struct proto_err {
	char msg[512];
};

/* Formats into err (if not NULL) and returns -code (code > 0, e.g. EINVAL).
 * Control characters (a newline in a quoted hostile name) become '?'. */
int proto_errf(struct proto_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prepends "prefix: " to an existing message. Returns nothing; cannot fail. */
void proto_err_prefix(struct proto_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Opens path read-only and checks it is a regular file; *st gets its stat.
 * Returns the fd (the caller closes it) or a negative errno, err filled. */
int proto_open_regular(const char *path, struct stat *st, struct proto_err *err);

/*
 * Reads a whole file of at most cap bytes into a fresh malloc'ed buffer that
 * the caller frees (a NUL is appended past len for text parsers). A larger
 * file is refused before anything is allocated. On failure *buf is NULL.
 */
int proto_read_file(const char *path, size_t cap, uint8_t **buf, size_t *len,
		    struct proto_err *err);

/*
 * Writes buf to path atomically: a temporary file beside it, fsync, rename.
 * On failure path is unchanged and no temporary file is left behind.
 */
int proto_write_file_atomic(const char *path, const void *buf, size_t len,
			    mode_t mode, struct proto_err *err);

/*
 * The same without the fsync: readers on this machine see the old bytes or
 * the new ones, never a mix, but a crash of the machine may lose either.
 * For records that describe this process's memory (a node's activation
 * record names a memfd of its own), which such a crash loses anyway, and
 * where an fsync costs milliseconds (proto/NOTES.md).
 */
int proto_write_file_replace(const char *path, const void *buf, size_t len, mode_t mode,
			     struct proto_err *err);
/* The same for a JSON value, dumped with jansson's flags (mode 0644). */
struct json_t;
int proto_write_json_atomic(const char *path, const struct json_t *j, size_t flags,
			    struct proto_err *err);
/* fsyncs path and the directory that holds it (so a rename into it too). */
int proto_sync_file(const char *path, struct proto_err *err);

/* Creates dir and its missing parents (mkdir -p, mode 0755); 0 when it
 * exists already. On failure err names the part that could not be made. */
int proto_mkdir_p(const char *dir, struct proto_err *err);

/* Monotonic clock in nanoseconds; wall clock in milliseconds since epoch. */
uint64_t proto_now_ns(void);
uint64_t proto_wall_ms(void);
/* Replaces the monotonic clock with fn (NULL: the system's again): the
 * simulator (tests/sim/) runs the node's decisions on simulated time.
 * Not for concurrent use: set it before any thread reads the clock. */
void proto_clock_set(uint64_t (*fn)(void));
/* CPU time so far, nanoseconds: the calling thread's, or the whole
 * process's (every thread's). 0 when the clock cannot be read. */
uint64_t proto_thread_cpu_ns(void);
uint64_t proto_process_cpu_ns(void);
/* Page faults the process has taken since it started (minor and major,
 * getrusage): a first touch of a fresh page is one, per 4 KiB page or per
 * huge page. */
uint64_t proto_process_faults(void);

/* One tick of a 1 ms tracing timer (*due_ns 0 before the first): writes
 * "L DUE RAN" (monotonic ns) to f when it ran over 2 ms late, i.e. its
 * event loop was busy that long, and sets the next due time. */
void proto_lag_tick(FILE *f, uint64_t *due_ns);

/* Parses a whole decimal string into [min,max]; -EINVAL otherwise. */
int proto_parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out);

/* Decodes s, exactly 2n hex digits and nothing else, into out[n]; -EINVAL
 * otherwise (out may then hold part of it). */
int proto_parse_hex(const char *s, uint8_t *out, size_t n);

#endif
