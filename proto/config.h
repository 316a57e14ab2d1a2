/*
 * Configuration files: `--config FILE` for the tracker, the node agent and
 * the publisher. The format is INI, parsed by inih (Debian's libinih):
 *
 *   [log]      level = err|warn|note|info|debug, format = text|json
 *   [params]   any tunable of proto/params.h by its lower-case name
 *              (chunk_size = 4194304); the environment variable, if set,
 *              still wins
 *   [tracker] [node] [publish]
 *              the program's long options without the dashes
 *              (listen = 127.0.0.1:7070; a flag without a value takes
 *              true/false)
 *
 * Every key of every section takes '-' and '_' alike (trainer-pubkey and
 * trainer_pubkey, chunk_size and chunk-size: one key, set once). An unknown
 * key or section is refused with the nearest known one, if any is near:
 * "FILE:LINE: unknown key 'trainer_pubky' in [node]; did you mean
 * 'trainer-pubkey'?".
 *
 * One file may hold every program's section; each program reads its own.
 * The file's options go before the command line's, so a flag given on the
 * command line overrides the file (getopt keeps the last value).
 */
#ifndef PROTO_CONFIG_H
#define PROTO_CONFIG_H

#include <getopt.h>
#include <stdio.h>

#include "proto/util.h"

/* The program sections a file may hold, NULL-terminated. */
extern const char *const proto_config_sections[];

/*
 * Reads the options every program shares out of *argv: --config FILE,
 * --log-format text|json and --log-level LEVEL (also as --opt=value; the
 * scan stops at "--"). Loads FILE if given: checks every section and key
 * (section's keys against opts, which is the program's getopt table), sets
 * [params] and [log], and makes a new argv: argv[0], the section's options,
 * then the remaining command line. *argc and *argv are replaced (the new vector
 * lives until exit). On error returns a negative errno with a one-line
 * message "FILE:LINE: ..." in err; nothing is applied then.
 */
int proto_config_args(const char *section, const struct option *opts, int *argc,
		      char ***argv, struct proto_err *err);

/* How many of the options in the vector the last proto_config_args made
 * came from the file: argv[1] .. argv[n] (each one "--key" or "--key=value"
 * element); 0 without a file. For options that accumulate (tessera-node's
 * ranks), where the command line replaces the file's rather than adds. */
int proto_config_file_args(void);

/* The same, printing "prog: message" and exiting with status 2 on error. */
void proto_config_cli(const char *prog, const char *section, const struct option *opts,
		      int *argc, char ***argv);

/* A section's accepted keys for `tessera config check`, NULL opts: any. */
struct proto_config_schema {
	const char *section;
	const struct option *opts;
};

/*
 * Checks a file against the schemas (every program section must have one)
 * without applying anything, and prints the effective values to out: the
 * log settings, every tunable with where its value comes from, and each
 * section's options. Returns 0, or a negative errno with err filled.
 */
int proto_config_check(const char *path, const struct proto_config_schema *schemas,
		       size_t nschemas, FILE *out, struct proto_err *err);

/* Frees what proto_config_args() allocated and forgets the file's params
 * and log settings' source. For tests; the programs leave it to exit. */
void proto_config_reset(void);

#endif
