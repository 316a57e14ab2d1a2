/* tessera-sim: runs one scenario of the fanout simulator (tests/sim/sim.h)
 * and prints a line per version (what `make bench-sim` collects). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tests/sim/sim.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: tessera-sim [--replicas N] [--layouts tp1[,tp2,...]] [--model-mib M]\n"
		"                   [--versions V] [--delta-ratio R] [--anchors] [--link-mbps B]\n"
		"                   [--trainer-x K] [--latency-ms L] [--cpu-ns-per-byte C]\n"
		"                   [--stragglers F] [--churn F] [--sites K] [--wan-mbps W]\n"
		"                   [--wan-latency-ms L] [--star] [--seed S] [--max-sim-s T]\n"
		"                   [--curve FILE]\n"
		"  One anchor, then V-1 deltas of R of its bytes (--anchors: V anchors);\n"
		"  replicas get the layouts in turn, and the sites in turn (the trainer is in\n"
		"  the first; another site reads it over its wide-area link, W Mbit/s, 0:\n"
		"  no cap, L ms more each way); the trainer's uplink is K times a replica's\n"
		"  link (default 1).\n"
		"  Node parameters come from the environment (TESSERA_*), as for tessera-node.\n");
}

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
	char *end;
	double d;

	errno = 0;
	d = v != NULL ? strtod(v, &end) : 0;
	if (v == NULL || *v == 0 || *end != 0 || errno != 0 || !(d >= lo && d <= hi)) {
		fprintf(stderr, "tessera-sim: %s: want a number in [%g, %g], got '%s'\n", flag, lo, hi,
			v != NULL ? v : "");
		return -1;
	}
	*out = d;
	return 0;
}

static int layouts(const char *v, struct sim_cfg *c)
{
	char buf[128], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", v != NULL ? v : "");
	c->ntp = 0;
	for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
		unsigned tp;
		char extra;
		if (c->ntp == SIM_LAYOUTS_MAX || sscanf(t, "tp%u%c", &tp, &extra) != 1 ||
		    (tp != 1 && tp != 2 && tp != 4 && tp != 8)) {
			fprintf(stderr, "tessera-sim: --layouts: want up to %d of tp1, tp2, tp4, tp8 "
				"separated by commas, got '%s'\n", SIM_LAYOUTS_MAX, v != NULL ? v : "");
			return -1;
		}
		c->tp[c->ntp++] = tp;
	}
	if (c->ntp == 0) {
		fprintf(stderr, "tessera-sim: --layouts: none given\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct sim_cfg c;
	struct sim_result r;
	struct proto_err err;
	double d, trainer_x = 1, mbps = 100;
	const char *curve = NULL;

	sim_cfg_default(&c);
	proto_log_setup("sim", getenv("TESSERA_SIM_LOG") != NULL ? PROTO_LOG_DEBUG : PROTO_LOG_ERR);
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int rc = 0;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			return 0;
		} else if (strcmp(a, "--star") == 0) {
			c.star = true;
			continue;
		} else if (strcmp(a, "--anchors") == 0) {
			c.anchors = true;
			continue;
		} else if (strcmp(a, "--replicas") == 0 && (rc = num(a, v, 1, 100000, &d)) == 0) {
			c.replicas = (uint32_t)d;
		} else if (strcmp(a, "--layouts") == 0) {
			rc = layouts(v, &c);
		} else if (strcmp(a, "--model-mib") == 0 && (rc = num(a, v, 1, 1 << 20, &d)) == 0) {
			c.model_bytes = (uint64_t)(d * (1 << 20));
		} else if (strcmp(a, "--versions") == 0 && (rc = num(a, v, 1, SIM_VERSIONS_MAX, &d)) == 0) {
			c.versions = (uint32_t)d;
		} else if (strcmp(a, "--delta-ratio") == 0 && (rc = num(a, v, 1e-6, 1, &d)) == 0) {
			c.delta_ratio = d;
		} else if (strcmp(a, "--link-mbps") == 0 && (rc = num(a, v, 0.001, 1e7, &d)) == 0) {
			mbps = d;
		} else if (strcmp(a, "--trainer-x") == 0 && (rc = num(a, v, 0.01, 1e4, &d)) == 0) {
			trainer_x = d;
		} else if (strcmp(a, "--latency-ms") == 0 && (rc = num(a, v, 0, 10000, &d)) == 0) {
			c.latency_ms = d;
		} else if (strcmp(a, "--cpu-ns-per-byte") == 0 && (rc = num(a, v, 0, 1e6, &d)) == 0) {
			c.cpu_ns_per_byte = d;
		} else if (strcmp(a, "--stragglers") == 0 && (rc = num(a, v, 0, 1, &d)) == 0) {
			c.stragglers = d;
		} else if (strcmp(a, "--churn") == 0 && (rc = num(a, v, 0, 1, &d)) == 0) {
			c.churn = d;
		} else if (strcmp(a, "--sites") == 0 && (rc = num(a, v, 1, SIM_SITES_MAX, &d)) == 0) {
			c.sites = (uint32_t)d;
		} else if (strcmp(a, "--wan-mbps") == 0 && (rc = num(a, v, 0, 1e7, &d)) == 0) {
			c.wan_bps = d * 1e6 / 8;
		} else if (strcmp(a, "--wan-latency-ms") == 0 && (rc = num(a, v, 0, 10000, &d)) == 0) {
			c.wan_latency_ms = d;
		} else if (strcmp(a, "--seed") == 0 && (rc = num(a, v, 0, 1e15, &d)) == 0) {
			c.seed = (uint64_t)d;
		} else if (strcmp(a, "--max-sim-s") == 0 && (rc = num(a, v, 1, 1e7, &d)) == 0) {
			c.max_sim_s = d;
		} else if (strcmp(a, "--curve") == 0 && v != NULL) {
			curve = v;
		} else if (rc == 0) {
			fprintf(stderr, "tessera-sim: unknown option or missing value: %s (--help lists "
				"the options)\n", a);
			return 2;
		}
		if (rc != 0)
			return 2;
		i++;
	}
	if (c.model_bytes % (64u << 10) != 0) {
		fprintf(stderr, "tessera-sim: --model-mib: want a multiple of 1/16 MiB\n");
		return 2;
	}
	c.link_bps = mbps * 1e6 / 8;
	c.trainer_bps = c.link_bps * trainer_x;
	if (curve != NULL && (c.curve = fopen(curve, "w")) == NULL) {
		fprintf(stderr, "tessera-sim: %s: %s\n", curve, strerror(errno));
		return 1;
	}
	int rc = sim_run(&c, &r, &err);
	if (c.curve != NULL)
		fclose(c.curve);
	for (uint32_t v = 0; v < r.nversions; v++) {
		char line[512];
		if (r.v[v].stayed == 0)
			continue;
		sim_line(&c, &r, v, line, sizeof(line));
		printf("%s\n", line);
		if (getenv("TESSERA_SIM_DETAIL") != NULL)
			printf("  v%u: S/b %.2f s, last %.2f s, trainer's last byte %.2f s, %u replicas done;"
			       " downlinks idle %.3f x S/b (mean); a chunk from its first copy to half"
			       " the replicas %.1f, to all %.1f chunk times (median)\n",
			       v + 1, (double)r.v[v].wire_bytes / c.link_bps, r.v[v].t_last_s,
			       r.v[v].trainer_s, r.v[v].done, r.v[v].down_idle, r.v[v].spread_half,
			       r.v[v].spread_all);
	}
	fprintf(stderr, "tessera-sim: %llu events in %.1f s\n", (unsigned long long)r.events, r.wall_s);
	if (rc != 0) {
		fprintf(stderr, "tessera-sim: %s\n", err.msg);
		return 1;
	}
	return 0;
}
