/* libFuzzer target: configuration files (proto/config.c over inih), through
 * `tessera config check` (proto_config_check) and the start-up path
 * (proto_config_args, which applies [params] and [log]; reset after). The
 * input is written to a file, as the programs read one. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/config.h"
#include "proto/log.h"
#include "proto/optval.h"
#include "proto/params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct option fzf_opts[] = {
	{"listen", required_argument, NULL, 'l'},
	{"state-dir", required_argument, NULL, 's'},
	{"rank", required_argument, NULL, 'r'},
	{"tls", no_argument, NULL, 't'},
	{"verbose", optional_argument, NULL, 'v'},
	{NULL, 0, NULL, 0},
};

static char fzf_path[512];
static FILE *fzf_null;

static void fzf_cleanup(void)
{
	unlink(fzf_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct proto_config_value values[] = {
		{"listen", proto_optval_hostport}, {"rank", proto_optval_ranks}, {NULL, NULL}};
	static const struct proto_config_schema schemas[] = {
		{"tracker", fzf_opts, values}, {"node", fzf_opts, values}, {"publish", NULL, NULL}};
	struct proto_err err;
	FILE *f;

	if (fzf_null == NULL) {
		const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		snprintf(fzf_path, sizeof(fzf_path), "%s/tessera-fuzz-config-%d.ini", dir, (int)getpid());
		fzf_null = fopen("/dev/null", "w");
		if (fzf_null == NULL)
			abort();
		atexit(fzf_cleanup);
		proto_log_setup("fuzz", PROTO_LOG_ERR);
	}
	if (size > (1u << 20) + 16)
		return 0;
	f = fopen(fzf_path, "w");
	if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0)
		abort();
	if (proto_config_check(fzf_path, schemas, 3, fzf_null, fzf_null, &err) != 0 &&
	    (err.msg[0] == 0 || strchr(err.msg, '\n') != NULL))
		abort(); /* a refusal says why in one line */
	{
		char *args[] = {"fuzz", "--config", fzf_path, "--listen", "x", NULL};
		char **argv = args;
		int argc = 5;
		if (proto_config_args(&schemas[1], &argc, &argv, &err) == 0) {
			if (argc < 3 || strcmp(argv[0], "fuzz") != 0 ||
			    strcmp(argv[argc - 1], "x") != 0 || argv[argc] != NULL)
				abort();
		} else if (argc != 5 || argv != args) {
			abort(); /* nothing applied on failure */
		}
		proto_config_reset();
		proto_log_set_level(PROTO_LOG_ERR);
	}
	return 0;
}
