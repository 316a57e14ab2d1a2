/* The shared command-line conventions (see cli.h). */
#include "proto/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void proto_cli_setup(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
}

void proto_cli_version(const char *prog)
{
	printf("%s %s\n", prog, PROTO_RELEASE);
}

int proto_cli_bad_option(const char *prog, int c, char **argv)
{
	char shortopt[3] = {'-', (char)optopt, 0};
	/* An unknown long option leaves optopt 0, a long one missing its value
	 * sets it to the option's val: both sit at argv[optind - 1]. A short
	 * one is named by optopt (it may be inside a group like -xv). */
	bool islong = optind > 0 && (optopt == 0 || (c == ':' && strncmp(argv[optind - 1], "--", 2) == 0));
	const char *what = islong ? argv[optind - 1] : shortopt;
	char name[128];
	const char *eq = strchr(what, '=');
	size_t n = eq != NULL ? (size_t)(eq - what) : strlen(what);

	snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), what);
	if (c == ':')
		fprintf(stderr, "%s: option '%s' needs a value (see --help)\n", prog, name);
	else
		fprintf(stderr, "%s: unknown option '%s' (see --help)\n", prog, name);
	return 2;
}

int proto_cli_missing(const char *prog, const char *flag)
{
	fprintf(stderr, "%s: %s is required (see --help)\n", prog, flag);
	return 2;
}

int proto_cli_extra(const char *prog, const char *arg)
{
	fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, arg);
	return 2;
}

void proto_cli_deprecated(const char *prog, const char *old, const char *now)
{
	fprintf(stderr, "%s: %s is deprecated, use %s\n", prog, old, now);
}

int proto_cli_parse_mib(const char *s, uint64_t *bytes)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != 0 || !(v > 0) || v > 1e8)
		return -EINVAL;
	*bytes = (uint64_t)(v * 1048576.0);
	return *bytes > 0 ? 0 : -EINVAL;
}
