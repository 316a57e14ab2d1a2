/* `tessera cluster`: a whole tessera cluster on loopback, driven and checked
 * from the outside: tracker, publisher, node agents as separate processes.
 * This file reads the command line and runs the pieces of cluster.h. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "fabric/fab.h"
#include "node/cli/cluster.h"
#include "node/cli/cmd.h"
#include "proto/checkpoint.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: tessera cluster [--trainer-ranks K] [--trainer-layout FILE]\n"
		"                       [--replica tpN[:fp8]|FILE]... [--synthetic-mb N | --model-dir DIR]\n"
		"                       [--versions V] [--provider NAME] [--seed S]\n"
		"                       [--report FILE] [--keep DIR] [--mode fanout|star]\n"
		"                       [--late-replica tpN[:fp8]|FILE]...\n"
		"                       [--every MS [--stagger MS] [--duration S]]\n"
		"                       [--anchor-every K] [--trainer-site NAME]\n"
		"\n"
		"Starts a tracker, a publisher hosting K trainer ranks and one node agent per\n"
		"replica rank as separate processes on loopback, publishes V versions, checks\n"
		"every rank's bytes itself, stops everything and writes a JSON report.\n"
		"SIGINT, SIGTERM or SIGHUP stop the run and every process it started\n"
		"(exit status 128 + the signal).\n"
		"\n"
		"      --trainer-ranks K    trainer ranks the publisher hosts (default 2)\n"
		"      --trainer-layout L   trainer layout file or built-in (default fsdpK)\n"
		"      --replica L          one replica of layout L, tpN, tpN:fp8 or a file;\n"
		"                           repeat for more (default: tp2 tp2 tp1); L@SITE\n"
		"                           puts it in site SITE (told to its nodes)\n"
		"      --trainer-site NAME  the publisher's site, and that of replicas that\n"
		"                           name none (default A once a replica names one;\n"
		"                           the report then gives each version's\n"
		"                           bytes_from_other_sites per site)\n"
		"      --synthetic-mb N     a synthetic model of about N MiB, whole layers\n"
		"                           (default 256; --model-mb: deprecated)\n"
		"      --model-dir DIR      the weights of `tessera publish --model-dir`:\n"
		"                           v<N>.safetensors files or v<N>/ Hugging Face\n"
		"                           checkpoints, one per version, in order of N\n"
		"      --versions V         versions to publish (default 3)\n"
		"      --provider NAME      libfabric provider (default tcp;ofi_rxm)\n"
		"      --seed S             seed of the synthetic model (default 1)\n"
		"      --report FILE        write the JSON report to FILE\n"
		"      --mode fanout|star   fanout: nodes fetch from and serve peers;\n"
		"                           star: only from the publisher (nodes run\n"
		"                           with TESSERA_FANOUT=0); default: as\n"
		"                           TESSERA_FANOUT says (fanout unless 0)\n"
		"      --late-replica L     a replica of layout L started once every other\n"
		"                           one is active on the last version; it must\n"
		"                           activate that version too (repeatable; its\n"
		"                           t_activate_ms counts from its registration)\n"
		"      --keep DIR           run in DIR and keep its keys, logs and state\n"
		"                           (default: a temporary directory, removed when\n"
		"                           the run succeeds or is stopped by a signal)\n"
		"      --every MS           publish a version every MS ms whatever the\n"
		"                           replicas do (the trainer's own clock); the\n"
		"                           report then gives per replica the versions\n"
		"                           activated, the lag behind the latest (p50/p99,\n"
		"                           in versions and seconds) and the publisher's\n"
		"                           peak resident memory\n"
		"      --stagger MS         with --every: start the ranks of each replica\n"
		"                           MS ms apart (default 0)\n"
		"      --duration S         with --every: run S seconds (default 60; up to\n"
		"                           15 more until two versions are out and every\n"
		"                           replica activated one); every rank's bytes are\n"
		"                           checked at the end\n"
		"      --anchor-every K     an anchor every K versions, deltas between\n"
		"                           (default: the publisher's, 10); the report\n"
		"                           gives each version's kind, wire_bytes (all\n"
		"                           replicas together) and anchor_bytes\n"
		"  -h, --help               this text\n");
}

/* --replica L[@SITE] into r (a layout file whose name holds '@' stays
 * whole); 2 after saying why on stderr. */
static int replica_arg(struct cluster_replica *r, const char *arg)
{
	const char *at = strrchr(arg, '@');
	struct proto_err err;

	if (at != NULL && strchr(at, '/') == NULL && access(arg, F_OK) != 0) {
		if (trk_site_check(at + 1, &err) != 0) {
			fprintf(stderr, "tessera cluster: --replica %s: site %s: %s\n", arg, at + 1,
				err.msg);
			return 2;
		}
		snprintf(r->site, sizeof(r->site), "%s", at + 1);
		snprintf(r->layout_arg, sizeof(r->layout_arg), "%.*s", (int)(at - arg), arg);
		return 0;
	}
	snprintf(r->layout_arg, sizeof(r->layout_arg), "%s", arg);
	return 0;
}

static int parse_args(struct cluster *c, int argc, char **argv)
{
	static const struct option opts[] = {
		{"trainer-ranks", required_argument, NULL, 'k'},
		{"trainer-layout", required_argument, NULL, 'T'},
		{"replica", required_argument, NULL, 'r'},
		{"synthetic-mb", required_argument, NULL, 'm'},
		{"model-dir", required_argument, NULL, 'M'},
		{"model-mb", required_argument, NULL, 'B'}, /* deprecated */
		{"model", required_argument, NULL, 'x'},    /* now --model-dir */
		{"versions", required_argument, NULL, 'v'},
		{"provider", required_argument, NULL, 'p'},
		{"seed", required_argument, NULL, 's'},
		{"report", required_argument, NULL, 'o'},
		{"mode", required_argument, NULL, 'F'},
		{"late-replica", required_argument, NULL, 'L'},
		{"keep", required_argument, NULL, 'K'},
		{"every", required_argument, NULL, 'e'},
		{"stagger", required_argument, NULL, 'S'},
		{"duration", required_argument, NULL, 'd'},
		{"anchor-every", required_argument, NULL, 'A'},
		{"trainer-site", required_argument, NULL, 'W'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}};
	uint64_t k = 2;
	struct proto_err err;
	int ch;

	c->model_mb = 256;
	c->versions = 3;
	c->duration_s = 60;
	c->seed = 1;
	c->provider = FAB_PROVIDER_DEFAULT;
	optind = 1;
	opterr = 0;
	int li = 0;
	while ((ch = getopt_long(argc, argv, ":h", opts, &li)) != -1) {
		int bad = 0;
		switch (ch) {
		case 'k': bad = proto_parse_u64(optarg, 1, 1024, &k); break;
		case 'T': c->trainer_layout = optarg; break;
		case 'r':
		case 'L':
			if (c->nreps == MAX_REPLICAS) {
				fprintf(stderr, "tessera cluster: at most %d replicas\n", MAX_REPLICAS);
				return 2;
			}
			if (replica_arg(&c->reps[c->nreps], optarg) != 0)
				return 2;
			c->reps[c->nreps].late = ch == 'L';
			c->nreps++;
			break;
		case 'W':
			if (trk_site_check(optarg, &err) != 0) {
				fprintf(stderr, "tessera cluster: --trainer-site %s: %s\n", optarg,
					err.msg);
				return 2;
			}
			snprintf(c->trainer_site, sizeof(c->trainer_site), "%s", optarg);
			break;
		case 'F':
			if (strcmp(optarg, "fanout") != 0 && strcmp(optarg, "star") != 0) {
				fprintf(stderr, "tessera cluster: --mode wants fanout or star, not '%s'\n",
					optarg);
				return 2;
			}
			c->star = strcmp(optarg, "star") == 0;
			break;
		case 'B':
			proto_cli_deprecated("tessera cluster", "--model-mb", "--synthetic-mb");
			/* fall through */
		case 'm': bad = proto_parse_u64(optarg, 1, 1 << 20, &c->model_mb); break;
		case 'M': c->model_dir = optarg; break;
		case 'x':
			/* --model names a model spec JSON everywhere else. */
			fprintf(stderr, "tessera cluster: --model DIR is now --model-dir DIR\n");
			return 2;
		case 'v': bad = proto_parse_u64(optarg, 1, 1000000, &c->versions); break;
		case 'p': c->provider = optarg; break;
		case 's': bad = proto_parse_u64(optarg, 0, UINT64_MAX, &c->seed); break;
		case 'o': c->report = optarg; break;
		case 'K': c->keep = optarg; break;
		case 'e': bad = proto_parse_u64(optarg, 1, 86400000, &c->every_ms); break;
		case 'S': bad = proto_parse_u64(optarg, 0, 3600000, &c->stagger_ms); break;
		case 'd': bad = proto_parse_u64(optarg, 1, 86400, &c->duration_s); break;
		case 'A': bad = proto_parse_u64(optarg, 1, UINT32_MAX, &c->anchor_every); break;
		case 'h': usage(stdout); return 1;
		default: return proto_cli_bad_option("tessera cluster", ch, argv);
		}
		if (bad) {
			fprintf(stderr, "tessera cluster: --%s wants a number in range, not '%s'\n",
				opts[li].name, optarg);
			return 2;
		}
	}
	if (optind != argc)
		return proto_cli_extra("tessera cluster", argv[optind]);
	if (c->every_ms == 0 && c->stagger_ms > 0) {
		fprintf(stderr, "tessera cluster: --stagger needs --every\n");
		return 2;
	}
	if (c->every_ms > 0 && c->model_dir != NULL) {
		fprintf(stderr, "tessera cluster: --every publishes a synthetic model; drop --model-dir\n");
		return 2;
	}
	c->trainer_ranks = (uint32_t)k;
	uint32_t nlate = 0;
	for (uint32_t i = 0; i < c->nreps; i++)
		nlate += c->reps[i].late;
	if (nlate > 0 && c->every_ms > 0) {
		fprintf(stderr, "tessera cluster: --late-replica joins after the last version; drop --every\n");
		return 2;
	}
	if (nlate > 0 && nlate == c->nreps) {
		fprintf(stderr, "tessera cluster: --late-replica joins replicas named by --replica\n");
		return 2;
	}
	if (c->nreps == 0) {
		static const char *def[] = {"tp2", "tp2", "tp1"};
		for (; c->nreps < 3; c->nreps++)
			snprintf(c->reps[c->nreps].layout_arg, sizeof(c->reps[0].layout_arg), "%s",
				 def[c->nreps]);
	}
	for (uint32_t i = 0; i < c->nreps; i++)
		snprintf(c->reps[i].name, sizeof(c->reps[i].name), "%c", 'A' + i);
	/* Sites: once one is named, the trainer and the replicas naming none
	 * are in the trainer's. */
	for (uint32_t i = 0; i < c->nreps && c->trainer_site[0] == 0; i++)
		if (c->reps[i].site[0] != 0)
			snprintf(c->trainer_site, sizeof(c->trainer_site), "A");
	for (uint32_t i = 0; i < c->nreps; i++)
		if (c->reps[i].site[0] == 0)
			snprintf(c->reps[i].site, sizeof(c->reps[i].site), "%s", c->trainer_site);
	return 0;
}

int node_cmd_cluster(int argc, char **argv)
{
	/* Without --mode, the nodes' mode is what TESSERA_FANOUT says. */
	struct cluster c = {.control = -1, .star = proto_param(PROTO_PARAM_FANOUT) == 0};
	struct proto_err err;
	uint64_t t0 = proto_now_ns();
	int rc = parse_args(&c, argc, argv), status = 1;
	json_t *report, *clock = NULL;

	if (rc != 0)
		return rc == 1 ? 0 : rc;
	signal(SIGPIPE, SIG_IGN);
	node__cluster_catch_stop_signals();
	proto_model_init(&c.model);
	c.out_versions = json_array();
	if (node_self_dir(c.bindir, sizeof(c.bindir)) != 0) {
		fprintf(stderr, "tessera cluster: cannot find my own directory\n");
		goto out;
	}
	if (node__cluster_load_model(&c, &err) != 0) {
		fprintf(stderr, "tessera cluster: %s\n", err.msg);
		goto out; /* before making a directory: nothing to remove */
	}
	if (c.keep != NULL) {
		mkdir(c.keep, 0755);
		snprintf(c.dir, sizeof(c.dir), "%s", c.keep);
	} else {
		const char *t = getenv("TMPDIR");
		snprintf(c.dir, sizeof(c.dir), "%s/tessera-cluster-XXXXXX", t ? t : "/tmp");
		if (mkdtemp(c.dir) == NULL) {
			fprintf(stderr, "tessera cluster: %s: %s\n", c.dir, strerror(errno));
			goto out;
		}
	}
	printf("tessera cluster: model %.1f MiB (%u tensors), %u trainer ranks, %u replicas, %" PRIu64
	       " versions, provider %s, %s\n",
	       (double)proto_model_bytes(&c.model) / (1 << 20), c.model.ntensors, c.trainer_ranks,
	       c.nreps, c.every_ms ? 0 : c.versions, c.provider, c.star ? "star" : "fanout");
	fflush(stdout);
	if (node__cluster_start_all(&c, &err) != 0) {
		if (!node__cluster_stop_signal)
			fprintf(stderr, "tessera cluster: %s\n", err.msg);
		goto stop;
	}
	status = 0;
	if (c.every_ms > 0) {
		rc = node__cluster_run_clock(&c, &clock);
		if (rc != 0 && !node__cluster_stop_signal) {
			fprintf(stderr, "tessera cluster: the clock run failed (logs in %s)\n", c.dir);
			status = 1;
		}
	}
	for (uint64_t v = 1; c.every_ms == 0 && v <= c.versions; v++) {
		rc = node__cluster_run_version(&c, v);
		if (rc != 0) {
			if (!node__cluster_stop_signal)
				fprintf(stderr, "tessera cluster: v%" PRIu64 " failed (logs in %s)\n", v,
					c.dir);
			status = 1;
			break;
		}
	}
	if (status == 0 && c.every_ms == 0 && (rc = node__cluster_run_late(&c, c.versions)) != 0) {
		if (!node__cluster_stop_signal)
			fprintf(stderr, "tessera cluster: the late replicas failed (logs in %s)\n", c.dir);
		status = 1;
	}
stop:
	node__cluster_stop_all(&c);
	if (node__cluster_stop_signal) {
		/* Stopped on purpose: no run to look into, nothing left behind. */
		fprintf(stderr, "tessera cluster: stopped by SIG%s; every process it started has exited\n",
			sigabbrev_np(node__cluster_stop_signal));
		status = 128 + node__cluster_stop_signal;
	}
	report = json_pack("{s:b,s:s,s:I,s:o}", "ok", status == 0, "mode",
			   c.star ? "star" : "fanout", "wall_ms",
			   (json_int_t)((proto_now_ns() - t0) / 1000000), "versions",
			   json_incref(c.out_versions));
	if (clock != NULL)
		json_object_set(report, "clock", clock);
	if (c.report != NULL && proto_write_json_atomic(c.report, report, JSON_INDENT(1), &err) != 0) {
		fprintf(stderr, "tessera cluster: %s\n", err.msg);
		status = 1;
	}
	printf("tessera cluster: %s in %.1f s%s%s\n",
	       status == 0 ? "ok" : node__cluster_stop_signal ? "stopped" : "FAILED",
	       (double)(proto_now_ns() - t0) / 1e9, c.report ? ", report " : "",
	       c.report ? c.report : "");
	json_decref(report);
	if ((status == 0 || node__cluster_stop_signal) && c.keep == NULL) {
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c.dir);
		if (system(cmd) != 0)
			LOG_WARN("cluster: could not remove %s", c.dir);
	}
out:
	json_decref(clock);
	trk_client_free(c.trk);
	json_decref(c.out_versions);
	for (uint32_t i = 0; i < c.nreps; i++)
		proto_layout_fini(&c.reps[i].layout);
	proto_ckpt_list_free(c.ckpts, c.nckpts);
	proto_model_fini(&c.model);
	return status;
}
