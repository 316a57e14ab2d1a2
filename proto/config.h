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
 * 'trainer-pubkey'?", or the section that takes it ("[tracker] takes it");
 * a [params] key spelt as its environment variable is told its key. Every
 * value goes through the parser the program applies to it (a schema's
 * values): "FILE:LINE: [node] ranks = 0-x: want R, R-S or ...".
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
 * A check of one option's value: 0, or a negative errno with the reason
 * alone in err ("want HOST:PORT"); the caller names the file, line, section,
 * key and value. It must be the parser the program itself applies to the
 * value (proto/optval.h and each program's table), so that what the check
 * passes the program takes. It keeps nothing.
 */
typedef int (*proto_config_check_fn)(const char *value, struct proto_err *err);

/* One key's check, by the option's name; tables end with {NULL, NULL}. */
struct proto_config_value {
	const char *key;
	proto_config_check_fn check;
};

/* A program section: its keys (the program's getopt table; NULL: any) and
 * the checks of their values (NULL: none). */
struct proto_config_schema {
	const char *section;
	const struct option *opts;
	const struct proto_config_value *values;
};

/*
 * Reads the options every program shares out of *argv: --config FILE,
 * --log-format text|json and --log-level LEVEL (also as --opt=value; the
 * scan stops at "--"). Loads FILE if given: checks every section and key
 * (schema's section against its opts and values), sets [params] and [log],
 * and makes a new argv: argv[0], the section's options, then the remaining
 * command line. *argc and *argv are replaced (the new vector lives until
 * exit). On error returns a negative errno with a one-line message
 * "FILE:LINE: ..." in err (the file's first error); nothing is applied then.
 */
int proto_config_args(const struct proto_config_schema *schema, int *argc, char ***argv,
		      struct proto_err *err);

/* How many of the options in the vector the last proto_config_args made
 * came from the file: argv[1] .. argv[n] (each one "--key" or "--key=value"
 * element); 0 without a file. For options that accumulate (tessera-node's
 * ranks), where the command line replaces the file's rather than adds. */
int proto_config_file_args(void);

/* The same, printing "prog: message" and exiting with status 2 on error,
 * before the program opens anything. */
void proto_config_cli(const char *prog, const struct proto_config_schema *schema, int *argc,
		      char ***argv);

/*
 * Checks a file against the schemas (every program section must have one)
 * and the TESSERA_* environment without applying anything. Every error is a
 * line of its own on errs ("FILE:LINE: [node] ranks = 0-x: want ..."), all
 * of them, and the first is also in err. Valid, prints the effective values
 * to out: the log settings, every tunable with where its value comes from,
 * and each section's options. Returns 0 or the first error's negative errno.
 */
int proto_config_check(const char *path, const struct proto_config_schema *schemas,
		       size_t nschemas, FILE *out, FILE *errs, struct proto_err *err);

/* Frees what proto_config_args() allocated and forgets the file's params
 * and log settings' source. For tests; the programs leave it to exit. */
void proto_config_reset(void);

#endif
