/* `tessera plan`: print the parcels between a trainer and a serving layout. */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "node/cli/cmd.h"
#include "proto/proto.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: tessera plan --model M.json --from L --to L [--json]\n"
		   "\n"
		   "Prints the parcels that carry the model from one layout to another: per\n"
		   "(source rank, destination rank) the bytes, segments and copy runs.\n"
		   "\n"
		   "      --model M.json   the model spec JSON (`tessera model` writes one)\n"
		   "      --from L         source (trainer) layout: a layout file or a\n"
		   "                       built-in (tpN, tpN:fp8, fsdpN)\n"
		   "      --to L           destination (serving) layout, the same forms\n"
		   "      --json           the whole plan as JSON instead of a table\n"
		   "  -h, --help           this text\n");
}

static void print_text(const struct proto_plan *p)
{
	printf("%-8s %-8s %14s %10s %10s\n", "src_rank", "dst_rank", "bytes", "segments", "runs");
	for (uint32_t i = 0; i < p->nparcels; i++) {
		const struct proto_parcel *pc = &p->parcels[i];
		printf("%-8u %-8u %14" PRIu64 " %10" PRIu64 " %10" PRIu64 "\n", pc->src_rank,
		       pc->dst_rank, pc->bytes, pc->nsegs, pc->nruns);
	}
	printf("parcels %u, segments %" PRIu64 ", runs %" PRIu64 "\n", p->nparcels, p->nsegs,
	       p->nruns);
	printf("retained %" PRIu64 " B, mapped %" PRIu64 " B, broadcast %" PRIu64 " B\n",
	       p->retained_bytes, p->mapped_bytes, p->broadcast_bytes);
}

int node_cmd_plan(int argc, char **argv)
{
	static const struct option opts[] = {
		{"model", required_argument, NULL, 'm'}, {"from", required_argument, NULL, 'f'},
		{"to", required_argument, NULL, 't'},    {"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},        {NULL, 0, NULL, 0}};
	const char *model = NULL, *from = NULL, *to = NULL;
	struct proto_model m;
	struct proto_layout src = {0}, dst = {0};
	struct proto_plan plan = {0};
	struct proto_err err;
	bool as_json = false;
	int c, rc = 1;

	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":m:f:t:jh", opts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'f': from = optarg; break;
		case 't': to = optarg; break;
		case 'j': as_json = true; break;
		case 'h': usage(stdout); return 0;
		default: return proto_cli_bad_option("tessera plan", c, argv);
		}
	}
	if (optind != argc)
		return proto_cli_extra("tessera plan", argv[optind]);
	if (model == NULL || from == NULL || to == NULL)
		return proto_cli_missing("tessera plan", model == NULL ? "--model" : from == NULL ? "--from" : "--to");
	proto_model_init(&m);
	if (proto_model_load(model, &m, &err) != 0 || proto_layout_open(&m, from, &src, &err) != 0 ||
	    proto_layout_open(&m, to, &dst, &err) != 0) {
		fprintf(stderr, "tessera plan: %s\n", err.msg);
		goto out;
	}
	/* Into an FP8 layout from a trainer's: its parcels come from the
	 * publisher's quantized source, as the publisher plans them. */
	if (proto_layout_transformed(&dst) && !proto_layout_transformed(&src)) {
		proto_layout_fini(&src);
		if (proto_layout_fp8_source(&m, &dst, &src, &err) != 0) {
			fprintf(stderr, "tessera plan: %s\n", err.msg);
			goto out;
		}
		fprintf(stderr, "tessera plan: %s serves FP8: planned from the publisher's quantized "
			"source (one rank, every tensor whole), as it serves it\n", to);
	}
	if (proto_plan_build(&m, &src, &dst, &plan, &err) != 0) {
		fprintf(stderr, "tessera plan: %s\n", err.msg);
		goto out;
	}
	if (as_json) {
		json_t *j = proto_plan_to_json(&plan, &m, &src, &dst);
		if (j == NULL || json_dumpf(j, stdout, JSON_COMPACT) != 0) {
			fprintf(stderr, "tessera plan: out of memory\n");
			json_decref(j);
			goto out;
		}
		json_decref(j);
		putchar('\n');
	} else {
		print_text(&plan);
	}
	rc = 0;
out:
	proto_plan_fini(&plan);
	proto_layout_fini(&src);
	proto_layout_fini(&dst);
	proto_model_fini(&m);
	return rc;
}
