/* Command-line conventions every tessera program and subcommand follows:
 * one wording for a bad option, a missing flag and a deprecated spelling,
 * `--version`, and progress lines that reach a pipe as they are printed. */
#ifndef PROTO_CLI_H
#define PROTO_CLI_H

#include <stdint.h>

/* The release every binary reports with --version. */
#define PROTO_RELEASE "0.1.0"

/* Makes stdout line-buffered even when it is a pipe or a file, so that every
 * progress line is seen when it is printed. Call first in main(). Cannot fail. */
void proto_cli_setup(void);

/* Prints "PROG RELEASE" on stdout. Cannot fail. */
void proto_cli_version(const char *prog);

/*
 * After getopt_long returned '?' or ':' (the option string must start with
 * ':' so that a missing value is told apart): prints
 *   PROG: unknown option 'X' (see --help)
 *   PROG: option 'X' needs a value (see --help)
 * on stderr and returns 2, the exit status for a usage error.
 */
int proto_cli_bad_option(const char *prog, int c, char **argv);

/* Prints "PROG: FLAG is required (see --help)" and returns 2. */
int proto_cli_missing(const char *prog, const char *flag);

/* Prints "PROG: unexpected argument 'ARG' (see --help)" and returns 2. */
int proto_cli_extra(const char *prog, const char *arg);

/* Parses a size in MiB (fractional allowed, > 0, at most 1e8) into bytes,
 * as every --synthetic-mb takes it; -EINVAL otherwise. */
int proto_cli_parse_mib(const char *s, uint64_t *bytes);

/* Prints "PROG: OLD is deprecated, use NEW" once per call. Cannot fail. */
void proto_cli_deprecated(const char *prog, const char *old, const char *now);

#endif
