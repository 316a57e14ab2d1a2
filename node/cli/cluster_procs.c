/* `tessera cluster`: its processes (a tracker, a publisher taking orders on
 * its control socket, a node agent per replica rank), started from keys and
 * a model spec it writes itself, watched, and stopped. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "node/cli/cluster.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

static int path_join(char *out, size_t len, const char *a, const char *b)
{
	int n = snprintf(out, len, "%s/%s", a, b);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

void node__cluster_attach_path(const struct cluster *c, const struct cluster_replica *r, uint32_t k,
			       char *out, size_t cap)
{
	char name[64];

	snprintf(name, sizeof(name), "attach-%s-%u.sock", r->name, k);
	path_join(out, cap, c->dir, name);
}

void node__cluster_expose_path(const struct cluster *c, const struct cluster_replica *r, uint32_t k,
			       char *out, size_t cap)
{
	char name[64];

	snprintf(name, sizeof(name), "expose/%s-%u.json", r->name, k);
	path_join(out, cap, c->dir, name);
}

volatile sig_atomic_t node__cluster_stop_signal;

static void on_stop_signal(int sig)
{
	node__cluster_stop_signal = sig;
}

/* Catches the signals that stop a run, without SA_RESTART, so that a read
 * from the publisher's control socket returns at once. */
void node__cluster_catch_stop_signals(void)
{
	struct sigaction sa = {.sa_handler = on_stop_signal};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

bool node__cluster_children_alive(struct cluster *c)
{
	if (node__cluster_stop_signal)
		return false;
	bool ok = node_proc_alive(&c->tracker) && node_proc_alive(&c->publisher);
	for (uint32_t i = 0; i < c->nreps; i++)
		for (uint32_t k = 0; k < c->reps[i].started; k++)
			if (!node_proc_alive(&c->reps[i].procs[k])) {
				fprintf(stderr, "cluster: node %s/%u exited (log %s)\n", c->reps[i].name, k,
					c->reps[i].procs[k].log);
				ok = false;
			}
	if (!ok && c->publisher.pid == 0)
		fprintf(stderr, "cluster: publisher exited (log %s)\n", c->publisher.log);
	return ok;
}

/* Waits until every node registered (the publisher exports only for
 * layouts it knows of). */
static int wait_registered(struct cluster *c)
{
	uint32_t want = 0;
	for (uint32_t i = 0; i < c->nreps; i++)
		want += c->reps[i].started;
	for (int waited = 0; waited < 30000; waited += 50) {
		json_t *st;
		if (!node__cluster_children_alive(c))
			return -ECHILD;
		if (node__cluster_status(c, &st) == 0) {
			uint64_t alive = (uint64_t)json_integer_value(json_object_get(st, "nodes_alive"));
			json_decref(st);
			if (alive >= want)
				return 0;
		}
		usleep(50000);
	}
	return -ETIMEDOUT;
}

int node__cluster_start_rank(struct cluster *c, struct cluster_replica *r, struct proto_err *err)
{
	char bin[4200], log[4200], pub[4200], ckey[4200], model[4200], expose[4200];
	char rank[16], name[32], sock[4200];
	uint32_t k = r->started;
	int rc;

	path_join(bin, sizeof(bin), c->bindir, "tessera-node");
	path_join(pub, sizeof(pub), c->dir, "trainer.pub");
	path_join(ckey, sizeof(ckey), c->dir, "cluster.key");
	path_join(model, sizeof(model), c->dir, "model.json");
	path_join(expose, sizeof(expose), c->dir, "expose");
	snprintf(rank, sizeof(rank), "%u", k);
	snprintf(name, sizeof(name), "node-%s-%u.log", r->name, k);
	path_join(log, sizeof(log), c->dir, name);
	node__cluster_attach_path(c, r, k, sock, sizeof(sock));
	char *nargv[] = {bin, "--tracker", c->url, "--replica", r->name, "--rank", rank,
			 "--layout", r->layout_arg, "--model", model, "--trainer-pubkey", pub,
			 "--cluster-key", ckey, "--provider", (char *)c->provider, "--expose",
			 expose, "--store", "host", "--attach", sock, NULL, NULL, NULL};
	if (r->site[0] != 0) {
		nargv[PROTO_ARRAY_LEN(nargv) - 3] = "--site";
		nargv[PROTO_ARRAY_LEN(nargv) - 2] = r->site;
	}
	/* The mode is the nodes' alone: set for the spawn, then put back. */
	const char *was = getenv("TESSERA_FANOUT");
	char *saved = was ? strdup(was) : NULL;
	setenv("TESSERA_FANOUT", c->star ? "0" : "1", 1);
	rc = node_proc_spawn(&r->procs[k], name, nargv, log);
	if (saved != NULL)
		setenv("TESSERA_FANOUT", saved, 1);
	else
		unsetenv("TESSERA_FANOUT");
	free(saved);
	if (rc != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	r->started++;
	return 0;
}

int node__cluster_start_all(struct cluster *c, struct proto_err *err)
{
	char key[4200], pub[4200], ckey[4200], state[4200], model[4200], expose[4200],
		sock[4200], log[4200], bin[4200], line[512], tlayout[4200];
	int rc;

	path_join(key, sizeof(key), c->dir, "trainer.key");
	path_join(pub, sizeof(pub), c->dir, "trainer.pub");
	path_join(ckey, sizeof(ckey), c->dir, "cluster.key");
	path_join(state, sizeof(state), c->dir, "tracker-state");
	path_join(model, sizeof(model), c->dir, "model.json");
	path_join(expose, sizeof(expose), c->dir, "expose");
	path_join(sock, sizeof(sock), c->dir, "publisher.sock");
	if ((rc = proto_keygen(key, pub, err)) != 0 || (rc = proto_cluster_keygen(ckey, err)) != 0)
		return rc;
	json_t *mj = proto_model_to_json(&c->model);
	rc = proto_write_json_atomic(model, mj, JSON_INDENT(1), err);
	json_decref(mj);
	if (rc != 0)
		return rc;
	mkdir(expose, 0755);

	/* Tracker first; it prints where it listens. */
	path_join(bin, sizeof(bin), c->bindir, "tessera-tracker");
	path_join(log, sizeof(log), c->dir, "tracker.log");
	char *targv[] = {bin, "--listen", "127.0.0.1:0", "--state", state, "--cluster-key", ckey,
			 "--trainer-pubkey", pub, NULL};
	if ((rc = node_proc_spawn(&c->tracker, "tracker", targv, log)) != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	if (node_proc_wait_line(&c->tracker, "listening on ", line, sizeof(line), 10000) != 0)
		return proto_errf(err, EIO, "the tracker did not start (log %s)", log);
	snprintf(c->url, sizeof(c->url), "%s", line);
	uint8_t ck[PROTO_CLUSTER_KEY_BYTES];
	if ((rc = proto_key_load_cluster(ckey, ck, err)) != 0 ||
	    (rc = trk_client_new(NULL, c->url, ck, &c->trk, err)) != 0)
		return rc;
	printf("tessera cluster: status page %s/\n", c->url);
	fflush(stdout);

	/* Node agents, one per replica rank (with --stagger only rank 0 now). */
	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		r->procs = calloc(r->layout.nranks, sizeof(*r->procs));
		if (r->procs == NULL)
			return proto_errf(err, ENOMEM, "out of memory");
		while (!r->late && r->started < (c->stagger_ms > 0 ? 1 : r->layout.nranks))
			if ((rc = node__cluster_start_rank(c, r, err)) != 0)
				return rc;
	}

	/* The publisher hosts every trainer rank and takes orders on a socket. */
	path_join(bin, sizeof(bin), c->bindir, "tessera");
	path_join(log, sizeof(log), c->dir, "publisher.log");
	char seed[32], mb[32], tl[64];
	snprintf(seed, sizeof(seed), "%" PRIu64, c->seed);
	snprintf(mb, sizeof(mb), "%" PRIu64, c->model_mb);
	snprintf(tl, sizeof(tl), "fsdp%u", c->trainer_ranks);
	snprintf(tlayout, sizeof(tlayout), "%s", c->trainer_layout ? c->trainer_layout : tl);
	char *pargv[24] = {bin, "publish", "--tracker", c->url, "--key", key, "--cluster-key", ckey,
			   "--layout", tlayout, "--provider", (char *)c->provider, "--control", sock};
	int n = 14;
	char every[32], anchors[32];
	if (c->anchor_every > 0) {
		snprintf(anchors, sizeof(anchors), "%" PRIu64, c->anchor_every);
		pargv[n++] = "--anchor-every";
		pargv[n++] = anchors;
	}
	if (c->every_ms > 0) {
		snprintf(every, sizeof(every), "%" PRIu64, c->every_ms);
		pargv[n++] = "--every";
		pargv[n++] = every;
	}
	if (c->trainer_site[0] != 0) {
		pargv[n++] = "--site";
		pargv[n++] = c->trainer_site;
	}
	if (c->model_dir) {
		pargv[n++] = "--model-dir";
		pargv[n++] = (char *)c->model_dir;
	} else {
		pargv[n++] = "--synthetic-mb";
		pargv[n++] = mb;
		pargv[n++] = "--seed";
		pargv[n++] = seed;
	}
	pargv[n] = NULL;
	if ((rc = node_proc_spawn(&c->publisher, "publisher", pargv, log)) != 0)
		return proto_errf(err, -rc, "cannot start %s", bin);
	rc = wait_registered(c);
	if (rc != 0)
		return proto_errf(err, -rc, "nodes did not register (logs in %s)", c->dir);
	/* Connect to the publisher's control socket once it is there. */
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(sock) >= sizeof(sa.sun_path))
		return proto_errf(err, ENAMETOOLONG, "%s: path too long for a socket", sock);
	memcpy(sa.sun_path, sock, strlen(sock) + 1);
	for (int waited = 0;; waited += 50) {
		c->control = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (c->control >= 0 && connect(c->control, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if (c->control >= 0)
			close(c->control);
		c->control = -1;
		if (!node__cluster_children_alive(c) || waited > 30000)
			return proto_errf(err, EIO, "the publisher did not open %s (log %s)", sock,
					  c->publisher.log);
		usleep(50000);
	}
	return 0;
}

void node__cluster_stop_publisher(struct cluster *c)
{
	if (c->control >= 0) {
		if (write(c->control, "quit\n", 5) < 0)
			LOG_DEBUG("cluster: publisher gone before quit");
		close(c->control);
		c->control = -1;
	}
	node_proc_stop(&c->publisher, 5000);
}

void node__cluster_stop_all(struct cluster *c)
{
	node__cluster_stop_publisher(c);
	for (uint32_t i = 0; i < c->nreps; i++) {
		for (uint32_t k = 0; c->reps[i].procs && k < c->reps[i].layout.nranks; k++)
			node_proc_stop(&c->reps[i].procs[k], 5000);
		free(c->reps[i].procs);
		c->reps[i].procs = NULL;
	}
	node_proc_stop(&c->tracker, 5000);
}
