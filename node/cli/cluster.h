/*
 * `tessera cluster`, the local launcher, in pieces (node/cli/cmd_cluster.c
 * reads the command line and runs them): the model and each rank's expected
 * bytes (cluster_model.c), the processes (cluster_procs.c), the tracker's
 * status as the launcher reads it (cluster_status.c), the checks of what
 * replicas serve (cluster_check.c), versions published one at a time
 * (cluster_versions.c) or on the trainer's own clock (cluster_clock.c).
 * Private to node/cli.
 */
#ifndef NODE_CLI_CLUSTER_H
#define NODE_CLI_CLUSTER_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/cli/proc.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

struct trk_client;

#define MAX_REPLICAS 16

struct cluster_replica {
	char name[8];
	char layout_arg[1024];
	char site[TRK_SITE_MAX + 1]; /* L@SITE ("": the trainer's) */
	struct proto_layout layout;
	struct node_proc *procs; /* one per rank */
	uint32_t started;        /* ranks 0..started-1 were spawned */
	bool activated;
	uint64_t t_activate_ms;
	bool digest_ok;
	/* --late-replica: started once every other replica is active on the
	 * last version; its t_activate_ms counts from its registration. */
	bool late;
	uint64_t registered_ms;
	/* Its ranks' counters for the version, from the tracker. */
	uint64_t from_trainer, from_peers, duplicate, refetched, from_other_sites;
	/* Its ranks' live canary scores against the publisher's: 1 all match,
	 * 0 one does not, -1 no verdict (node__cluster_probe_replica). */
	int canary_ok;
};

struct cluster {
	/* options */
	uint32_t trainer_ranks;
	const char *trainer_layout;
	const char *model_dir;
	uint64_t model_mb, seed, versions;
	const char *provider, *report, *keep;
	bool star; /* --mode star: nodes run with TESSERA_FANOUT=0 */
	/* --every: publish on a clock for duration_s; stagger a replica's ranks */
	uint64_t every_ms, stagger_ms, duration_s;
	uint64_t anchor_every; /* 0: the publisher's default */
	/* --trainer-site, or "A" when a replica names a site: the publisher's
	 * site, and that of replicas that name none ("": one site). */
	char trainer_site[TRK_SITE_MAX + 1];
	struct cluster_replica reps[MAX_REPLICAS];
	uint32_t nreps;
	/* running */
	char dir[4096], bindir[4096], url[256];
	struct proto_model model;
	char **ckpts; /* --model-dir: checkpoint paths in version order */
	size_t nckpts;
	struct node_proc tracker, publisher;
	struct trk_client *trk;
	int control;
	json_t *out_versions;
};

/* ---- cluster_model.c: what is published, what each rank must hold ------- */

/* Loads the model (synthetic, or the first checkpoint of --model-dir) and
 * every replica's layout; layout files are then named by absolute path. */
int node__cluster_load_model(struct cluster *c, struct proto_err *err);
/* The bytes rank `rank` of layout l must hold at version v. */
int node__cluster_expected_block(struct cluster *c, const struct proto_layout *l, uint32_t rank,
				 uint64_t v, uint8_t *block, struct proto_err *err);

/* ---- cluster_procs.c: the tracker, publisher and node processes --------- */

/* SIGINT, SIGTERM or SIGHUP, once one came: every wait gives up, the
 * children are stopped and the run ends with status 128 + the signal. */
extern volatile sig_atomic_t node__cluster_stop_signal;
void node__cluster_catch_stop_signals(void);
/* The attach socket of rank k of r, and the activation record its node
 * writes (node/serve/expose.h), in the run's directory. */
void node__cluster_attach_path(const struct cluster *c, const struct cluster_replica *r, uint32_t k,
			       char *out, size_t cap);
void node__cluster_expose_path(const struct cluster *c, const struct cluster_replica *r, uint32_t k,
			       char *out, size_t cap);
/* False once a stop signal came or a child exited (said on stderr). */
bool node__cluster_children_alive(struct cluster *c);
/* Keys, model spec, tracker, the nodes of every replica not late (only
 * rank 0 of each with --stagger), the publisher and its control socket. */
int node__cluster_start_all(struct cluster *c, struct proto_err *err);
/* Spawns the next rank of r (rank r->started). */
int node__cluster_start_rank(struct cluster *c, struct cluster_replica *r, struct proto_err *err);
/* Tells the publisher to quit and stops it. */
void node__cluster_stop_publisher(struct cluster *c);
/* Stops every process started, the tracker last. */
void node__cluster_stop_all(struct cluster *c);

/* ---- cluster_status.c: the tracker's status, read --------------------- */

/* The tracker's /status into *out (the caller's reference); a negative
 * errno when it did not answer 200 with JSON. */
int node__cluster_status(struct cluster *c, json_t **out);
/* Replica `name`'s entry in the status st (borrowed); NULL if none. */
json_t *node__cluster_find_replica(json_t *st, const char *name);
/* Marks the replicas (the late ones, or the others) that the status st
 * shows active on v, with the time it took: from the manifest's creation,
 * or for a late replica from its registration. */
void node__cluster_scan_activations(struct cluster *c, json_t *st, uint64_t v, uint64_t created,
				    bool late);
/* From the status st: when r's first rank registered, and the counters of
 * its ranks whose last report is about v. */
void node__cluster_replica_counters(json_t *st, struct cluster_replica *r, uint64_t v);

/* ---- cluster_check.c: is what replicas serve the version? -------------- */

/* Compares what rank `rank` of r serves (through the memfd its node
 * exposes) with expect, len bytes of version v; says why on stderr when
 * they differ. */
bool node__cluster_check_rank(struct cluster *c, struct cluster_replica *r, uint32_t rank,
			      uint64_t v, const uint8_t *expect, size_t len);
/* Checks every started replica's ranks at v and sets each digest_ok; the
 * expected bytes of a (layout, rank) are computed once and compared with
 * every replica of that layout. True when all match. */
bool node__cluster_check_digests(struct cluster *c, uint64_t v);
/* Probes every rank of r like a serving engine (node/cli/probe.h), reports
 * the live canary scores to the tracker, which compares them with the
 * publisher's for v, and sets r->canary_ok. */
void node__cluster_probe_replica(struct cluster *c, struct cluster_replica *r, uint64_t v);

/* ---- cluster_versions.c, cluster_clock.c: the two kinds of run ---------- */

/* Publishes one version and waits until every replica but the late ones
 * is active on it, then checks them; appends its entry to c->out_versions
 * (byte counts: those of these replicas). */
int node__cluster_run_version(struct cluster *c, uint64_t want_v);
/* After the last version v: starts the late replicas and waits until they
 * are active on v too; their entries join v's in the report. */
int node__cluster_run_late(struct cluster *c, uint64_t v);
/* --every: the publisher's own clock for --duration; *out the clock report. */
int node__cluster_run_clock(struct cluster *c, json_t **out);

#endif
