/* `tessera delta`: encode, apply and measure deltas between safetensors files. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/cli/cmd.h"
#include "proto/delta.h"
#include "proto/proto.h"

#define PROGRESS_MIN_BYTES (256ull << 20) /* files at least this big report progress */

static void delta_usage(FILE *f)
{
	fprintf(f,
		"usage: tessera delta encode --parent A.safetensors --child B.safetensors -o D\n"
		"       tessera delta apply --parent A.safetensors D -o C.safetensors\n"
		"       tessera delta stats --parent A.safetensors --child B.safetensors\n"
		"\n"
		"encode writes the changes from A to B; apply rebuilds B (byte for byte) from\n"
		"A and D, refusing any other parent and verifying every tensor's checksum,\n"
		"and leaves C untouched on failure; stats compares our size with other\n"
		"encodings and with the entropy bound, all computed on this pair.\n"
		"\n"
		"  -p, --parent FILE  the parent version\n"
		"  -c, --child FILE   the child version (encode, stats)\n"
		"  -o, --out FILE     output (encode: the delta; apply: the child)\n"
		"  -l, --level N      zstd level (default TESSERA_DELTA_LEVEL, 1)\n"
		"      --chunk N      elements per chunk (default TESSERA_DELTA_CHUNK)\n"
		"  -t, --threads N    worker threads (default: online CPUs)\n"
		"  -h, --help         this text\n");
}

struct progress {
	const char *what;
	uint64_t last_ns;
	bool on;
};

static void show_progress(void *arg, uint64_t done, uint64_t total)
{
	struct progress *p = arg;
	uint64_t now = proto_now_ns();

	/* Called from worker threads: a racy timestamp only risks a double line. */
	if (!p->on || (done != total && now - p->last_ns < 1000000000ull))
		return;
	p->last_ns = now;
	fprintf(stderr, "delta %s: %llu/%llu\n", p->what, (unsigned long long)done,
		(unsigned long long)total);
}

static bool big(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && (uint64_t)st.st_size >= PROGRESS_MIN_BYTES;
}

static double per(uint64_t bytes, uint64_t k)
{
	return k ? (double)bytes / (double)k : 0;
}

static int do_stats(const char *pa, const char *pb, const struct proto_delta_opts *o)
{
	struct proto_st a, b;
	struct proto_delta_report r;
	struct proto_err err = {{0}};
	int rc;

	if (proto_st_open(pa, &a, &err) != 0) {
		fprintf(stderr, "tessera delta stats: %s\n", err.msg);
		return 1;
	}
	if (proto_st_open(pb, &b, &err) != 0) {
		fprintf(stderr, "tessera delta stats: %s\n", err.msg);
		proto_st_fini(&a);
		return 1;
	}
	rc = proto_delta_compare(&a, &b, o, &r, &err);
	proto_st_fini(&a);
	proto_st_fini(&b);
	if (rc != 0) {
		fprintf(stderr, "tessera delta stats: %s\n", err.msg);
		return 1;
	}
	printf("pair: %s -> %s\n", pa, pb);
	printf("tensors %u, elements %llu, changed %llu (%.3f%%)\n", r.ntensors,
	       (unsigned long long)r.nelem, (unsigned long long)r.nchanged,
	       r.nelem ? 100.0 * (double)r.nchanged / (double)r.nelem : 0.0);
	printf("%-42s %14s %14s\n", "encoding", "bytes", "B/changed");
#define ROW(name, v) printf("%-42s %14.0f %14.3f\n", name, (double)(v), per((uint64_t)(v), r.nchanged))
	ROW("tessera delta (ours)", r.ours);
	ROW("int32 index + raw value", r.idx32_raw);
	ROW("uint16 gap + raw value (uint32 fallback)", r.gap16_raw);
	ROW("XOR of the bytes + zstd -1", r.xor_zstd1);
	ROW("zstd -3 --patch-from (parent as prefix)", r.zstd_patch);
	ROW("entropy bound of the positions", r.pos_bound);
	if (r.val_h0 >= 0)
		ROW("  + order-0 entropy of the values", r.pos_bound + r.val_h0);
#undef ROW
	printf("ours: positions %.3f, values %.3f, header %.3f B/changed; chunks zero %llu sparse "
	       "%llu bitmap %llu dense %llu; encode %.2f s\n",
	       per(r.st.pos_bytes, r.nchanged), per(r.st.val_bytes, r.nchanged),
	       per(r.st.header_bytes, r.nchanged), (unsigned long long)r.st.chunks[0],
	       (unsigned long long)r.st.chunks[1], (unsigned long long)r.st.chunks[2],
	       (unsigned long long)r.st.chunks[3], r.encode_s);
	return 0;
}

int node_cmd_delta(int argc, char **argv)
{
	static const struct option opts[] = {
		{"parent", required_argument, NULL, 'p'},
		{"child", required_argument, NULL, 'c'},
		{"out", required_argument, NULL, 'o'},
		{"level", required_argument, NULL, 'l'},
		{"chunk", required_argument, NULL, 'C'},
		{"threads", required_argument, NULL, 't'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *sub, *parent = NULL, *child = NULL, *out = NULL, *delta = NULL;
	struct proto_delta_opts o = {0};
	struct progress pg = {0};
	struct proto_err err = {{0}};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t v;
	int c;

	if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
		delta_usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	sub = argv[1];
	if (strcmp(sub, "encode") != 0 && strcmp(sub, "apply") != 0 && strcmp(sub, "stats") != 0) {
		fprintf(stderr, "tessera delta: unknown %s '%s' (see --help)\n",
			sub[0] == '-' ? "option" : "subcommand", sub);
		return 2;
	}
	o.threads = ncpu > 0 ? (unsigned)ncpu : 1;
	optind = 1;
	opterr = 0;
	argc--;
	argv++;
	while ((c = getopt_long(argc, argv, ":p:c:o:l:t:h", opts, NULL)) != -1) {
		switch (c) {
		case 'p':
			parent = optarg;
			break;
		case 'c':
			child = optarg;
			break;
		case 'o':
			out = optarg;
			break;
		case 'l':
			if (proto_parse_u64(optarg, 1, 22, &v) != 0) {
				fprintf(stderr, "tessera delta: --level wants 1..22, not '%s'\n", optarg);
				return 2;
			}
			o.level = (int)v;
			break;
		case 'C':
			if (proto_parse_u64(optarg, 64, PROTO_DELTA_CHUNK_MAX, &v) != 0) {
				fprintf(stderr, "tessera delta: --chunk wants 64..%u, not '%s'\n",
					PROTO_DELTA_CHUNK_MAX, optarg);
				return 2;
			}
			o.chunk_elems = (uint32_t)v;
			break;
		case 't':
			if (proto_parse_u64(optarg, 1, 1024, &v) != 0) {
				fprintf(stderr, "tessera delta: --threads wants 1..1024, not '%s'\n",
					optarg);
				return 2;
			}
			o.threads = (unsigned)v;
			break;
		case 'h':
			delta_usage(stdout);
			return 0;
		default:
			return proto_cli_bad_option("tessera delta", c, argv);
		}
	}
	if (strcmp(sub, "apply") == 0 && optind < argc)
		delta = argv[optind++];
	if (optind < argc)
		return proto_cli_extra("tessera delta", argv[optind]);
	if (parent == NULL)
		return proto_cli_missing("tessera delta", "--parent");
	pg.what = sub;
	o.progress = show_progress;
	o.progress_arg = &pg;
	if (strcmp(sub, "encode") == 0) {
		struct proto_delta_stats st;
		if (child == NULL || out == NULL)
			return proto_cli_missing("tessera delta encode", child == NULL ? "--child" : "-o");
		pg.on = big(child);
		if (proto_delta_encode_files(parent, child, out, &o, &st, &err) != 0) {
			fprintf(stderr, "tessera delta encode: %s\n", err.msg);
			return 1;
		}
		fprintf(stderr,
			"tessera delta encode: wrote %s: %llu bytes; %llu of %llu elements changed "
			"(%.3f%%), %.3f bytes per changed element\n",
			out, (unsigned long long)st.bytes, (unsigned long long)st.nchanged,
		       (unsigned long long)st.nelem,
		       st.nelem ? 100.0 * (double)st.nchanged / (double)st.nelem : 0.0,
		       per(st.bytes, st.nchanged));
		return 0;
	}
	if (strcmp(sub, "apply") == 0) {
		if (delta == NULL || out == NULL)
			return proto_cli_missing("tessera delta apply", delta == NULL ? "a delta file" : "-o");
		if (proto_delta_apply_files(parent, delta, out, o.threads, &err) != 0) {
			fprintf(stderr, "tessera delta apply: %s\n", err.msg);
			return 1;
		}
		fprintf(stderr, "tessera delta apply: wrote %s (%s on %s)\n", out, delta, parent);
		return 0;
	}
	if (child == NULL)
		return proto_cli_missing("tessera delta stats", "--child");
	pg.on = big(child);
	pg.what = "stats";
	return do_stats(parent, child, &o);
}
