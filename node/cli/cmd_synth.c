/* `tessera synth`: writes synthetic policy versions (Adam steps, BF16). */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "node/cli/cmd.h"
#include "proto/proto.h"
#include "proto/synth.h"

static void synth_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera synth -o DIR --synthetic-mb N --steps K [--lr 1e-6] [--seed S]\n"
		"                     [--threads T]\n"
		"\n"
		"Writes DIR/v0.safetensors .. DIR/vK.safetensors: a Llama-shaped model of\n"
		"about N MiB (BF16; N may be fractional) after 0..K Adam steps of its FP32\n"
		"masters, and prints the fraction of BF16 elements each step changed.\n"
		"Reproducible from the seed whatever the thread count.\n"
		"\n"
		"  -o, --out DIR         output directory (created with its parents if missing)\n"
		"      --synthetic-mb N  size of one version in MiB (--mb: deprecated)\n"
		"      --steps K         optimizer steps (versions after v0)\n"
		"      --lr LR           Adam learning rate (default 1e-6)\n"
		"      --seed S          random seed (default 1)\n"
		"      --threads T       worker threads (default: online CPUs)\n"
		"  -h, --help            this text\n");
}

static int parse_pos_double(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != 0 || !(v > 0) || v > 1e9)
		return -EINVAL;
	*out = v;
	return 0;
}

int node_cmd_synth(int argc, char **argv)
{
	static const struct option opts[] = {
		{"out", required_argument, NULL, 'o'},
		{"synthetic-mb", required_argument, NULL, 'm'},
		{"mb", required_argument, NULL, 'M'}, /* deprecated */
		{"steps", required_argument, NULL, 's'},
		{"lr", required_argument, NULL, 'l'},
		{"seed", required_argument, NULL, 'S'},
		{"threads", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct proto_synth_opts o = {.lr = 1e-6, .seed = 1, .progress = isatty(2)};
	const char *dir = NULL;
	double mb = 0;
	uint64_t v, steps = 0, *changed = NULL, nelem = 0;
	bool have_steps = false;
	struct proto_err err = {{0}};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	int c, rc;

	o.threads = ncpu > 0 ? (unsigned)ncpu : 1;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			dir = optarg;
			break;
		case 'M':
			proto_cli_deprecated("tessera synth", "--mb", "--synthetic-mb");
			/* fall through */
		case 'm':
			if (parse_pos_double(optarg, &mb) != 0) {
				fprintf(stderr, "tessera synth: --synthetic-mb wants a positive size, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 's':
			if (proto_parse_u64(optarg, 1, 100000, &steps) != 0) {
				fprintf(stderr, "tessera synth: --steps wants 1..100000, not '%s'\n",
					optarg);
				return 2;
			}
			have_steps = true;
			break;
		case 'l':
			if (parse_pos_double(optarg, &o.lr) != 0 || o.lr >= 1) {
				fprintf(stderr, "tessera synth: --lr wants 0 < lr < 1, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 'S':
			if (proto_parse_u64(optarg, 0, UINT64_MAX, &o.seed) != 0) {
				fprintf(stderr, "tessera synth: --seed wants a number, not '%s'\n",
					optarg);
				return 2;
			}
			break;
		case 't':
			if (proto_parse_u64(optarg, 1, 1024, &v) != 0) {
				fprintf(stderr, "tessera synth: --threads wants 1..1024, not '%s'\n",
					optarg);
				return 2;
			}
			o.threads = (unsigned)v;
			break;
		case 'h':
			synth_usage(stdout);
			return 0;
		default:
			return proto_cli_bad_option("tessera synth", c, argv);
		}
	}
	if (optind < argc)
		return proto_cli_extra("tessera synth", argv[optind]);
	if (dir == NULL || mb <= 0 || !have_steps)
		return proto_cli_missing("tessera synth", dir == NULL ? "-o DIR" : mb <= 0 ? "--synthetic-mb N" : "--steps K");
	if (proto_mkdir_p(dir, &err) != 0) {
		fprintf(stderr, "tessera synth: %s\n", err.msg);
		return 1;
	}
	o.bytes = (uint64_t)(mb * 1048576.0);
	o.steps = (uint32_t)steps;
	changed = calloc(steps + 1, sizeof(*changed));
	if (changed == NULL) {
		fprintf(stderr, "tessera synth: out of memory\n");
		return 1;
	}
	rc = proto_synth_run(dir, &o, changed, &nelem, &err);
	if (rc != 0) {
		fprintf(stderr, "tessera synth: %s\n", err.msg);
		free(changed);
		return 1;
	}
	/* One line, to stderr as every command's message: the steps'
	 * changes as their range. */
	uint64_t lo = UINT64_MAX, hi = 0;
	for (uint64_t k = 1; k <= steps; k++) {
		lo = PROTO_MIN(lo, changed[k]);
		hi = PROTO_MAX(hi, changed[k]);
	}
	if (steps == 0)
		lo = 0;
	fprintf(stderr,
		"tessera synth: wrote %s/v0..v%llu.safetensors: %llu BF16 elements (%.1f MiB) each; "
		"%.3f..%.3f%% of them changed per step\n",
		dir, (unsigned long long)steps, (unsigned long long)nelem,
		(double)nelem * 2 / 1048576.0, nelem ? 100.0 * (double)lo / (double)nelem : 0.0,
		nelem ? 100.0 * (double)hi / (double)nelem : 0.0);
	free(changed);
	return 0;
}
