/* `tessera cluster` without --every: versions published one at a time; each
 * waits until every replica is active on it, is checked, and gets its entry
 * in the report (bytes by source, wire cost against an anchor, timeline). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "node/cli/cluster.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

#define VERSION_TIMEOUT_MS 120000

/* What the publisher said of one export. */
struct exported {
	uint64_t v, created_ms, wire, anchor, encode_us;
	char kind[8];
};

static int control_export(struct cluster *c, struct exported *x)
{
	char line[512];
	size_t n = 0;

	if (write(c->control, "export\n", 7) != 7)
		return -EIO;
	while (n < sizeof(line) - 1) {
		ssize_t k = read(c->control, line + n, 1);
		if (k <= 0)
			return -EIO;
		if (line[n] == '\n')
			break;
		n++;
	}
	line[n] = 0;
	unsigned long long vv, cm, w, an, enc;
	if (sscanf(line, "published %llu %llu %7s %llu %llu %llu", &vv, &cm, x->kind, &w, &an,
		   &enc) != 6) {
		fprintf(stderr, "cluster: publisher said: %s\n", line);
		return -EIO;
	}
	x->v = vv;
	x->created_ms = cm;
	x->wire = w;
	x->anchor = an;
	x->encode_us = enc;
	return 0;
}

/* Waits (at most VERSION_TIMEOUT_MS) until every replica of the wave
 * (late or not) is active on v; *st is the last status seen. */
static int wait_wave(struct cluster *c, uint64_t v, uint64_t created, bool late, json_t **st)
{
	for (int waited = 0;; waited += 20) {
		bool all = true;
		json_decref(*st);
		*st = NULL;
		if (!node__cluster_children_alive(c))
			return -ECHILD;
		if (node__cluster_status(c, st) == 0) {
			for (uint32_t i = 0; i < c->nreps; i++)
				if (c->reps[i].late == late && c->reps[i].started > 0)
					node__cluster_replica_counters(*st, &c->reps[i], v);
			node__cluster_scan_activations(c, *st, v, created, late);
		}
		for (uint32_t i = 0; i < c->nreps; i++)
			all &= c->reps[i].late != late || c->reps[i].activated;
		if (all && *st != NULL)
			return 0;
		if (waited > VERSION_TIMEOUT_MS) {
			for (uint32_t i = 0; i < c->nreps; i++)
				if (c->reps[i].late == late && !c->reps[i].activated)
					fprintf(stderr, "cluster: %sreplica %s (%s) not active on v%" PRIu64
							" after %d s\n",
						late ? "late " : "", c->reps[i].name, c->reps[i].layout_arg, v,
						VERSION_TIMEOUT_MS / 1000);
			return -ETIMEDOUT;
		}
		usleep(20000);
	}
}

/* The report's entry for replica r at version v. */
static json_t *replica_entry(const struct cluster_replica *r, uint64_t v)
{
	printf("  v%" PRIu64 " %sreplica %s (%s%s%s): %s after %" PRIu64 " ms%s, %" PRIu64
	       " bytes from the trainer, %" PRIu64 " from peers, bytes %s, canary %s\n",
	       v, r->late ? "late " : "", r->name, r->layout_arg, r->site[0] ? "@" : "", r->site,
	       r->activated ? "active" : "NOT active", r->t_activate_ms,
	       r->late ? " from its registration" : "", r->from_trainer, r->from_peers,
	       r->digest_ok ? "ok" : "WRONG",
	       r->canary_ok == 1 ? "ok" : r->canary_ok == 0 ? "MISMATCH" : "unknown");
	return json_pack("{s:s,s:s,s:b,s:b,s:I,s:b,s:o,s:I,s:I,s:I,s:I,s:o,s:I}", "replica", r->name,
			 "layout", r->layout_arg, "late", r->late, "activated", r->activated,
			 "t_activate_ms", (json_int_t)r->t_activate_ms, "digest_ok", r->digest_ok,
			 "canary_ok", r->canary_ok < 0 ? json_null() : json_boolean(r->canary_ok),
			 "bytes_from_trainer", (json_int_t)r->from_trainer, "bytes_from_peers",
			 (json_int_t)r->from_peers, "duplicate_bytes", (json_int_t)r->duplicate,
			 "refetched_bytes", (json_int_t)r->refetched, "site",
			 r->site[0] ? json_string(r->site) : json_null(), "bytes_from_other_sites",
			 (json_int_t)r->from_other_sites);
}

/* What replica r's ranks hold: a version's cost to it as an anchor. */
static uint64_t replica_bytes(const struct cluster_replica *r)
{
	uint64_t n = 0;

	for (uint32_t q = 0; q < r->layout.nranks; q++)
		n += r->layout.ranks[q].nbytes;
	return n;
}

/* What crossed into each site for v: its replicas' bytes from sources in
 * other sites ({} with one site). */
static json_t *site_bytes(const struct cluster *c)
{
	json_t *o = json_object();

	for (uint32_t r = 0; o != NULL && r < c->nreps; r++) {
		const struct cluster_replica *re = &c->reps[r];
		if (re->late || re->site[0] == 0)
			continue;
		json_int_t had = json_integer_value(json_object_get(o, re->site));
		json_object_set_new(o, re->site,
				    json_integer(had + (json_int_t)re->from_other_sites));
	}
	return o;
}

int node__cluster_run_version(struct cluster *c, uint64_t want_v)
{
	uint64_t v, created, published_ms;
	json_t *st = NULL;
	struct exported x;
	int rc = control_export(c, &x);

	if (rc != 0)
		return rc;
	v = x.v;
	created = x.created_ms;
	published_ms = proto_wall_ms();
	if (v != want_v)
		fprintf(stderr, "cluster: publisher exported v%" PRIu64 ", expected v%" PRIu64 "\n", v,
			want_v);
	for (uint32_t i = 0; i < c->nreps; i++)
		c->reps[i].activated = false;
	rc = wait_wave(c, v, created, false, &st);
	if (rc != 0) {
		json_decref(st);
		return rc;
	}
	uint64_t payload = 0;
	json_t *ver;
	size_t i;
	json_array_foreach(json_object_get(st, "versions"), i, ver)
	{
		if ((uint64_t)json_integer_value(json_object_get(ver, "version")) == v)
			payload = (uint64_t)json_integer_value(json_object_get(ver, "wire_bytes"));
	}
	json_decref(st);
	bool ok = node__cluster_check_digests(c, v);
	for (uint32_t r = 0; r < c->nreps; r++)
		if (!c->reps[r].late) {
			node__cluster_probe_replica(c, &c->reps[r], v);
			ok &= c->reps[r].canary_ok != 0;
		}
	/* Bytes the replicas pulled for v, by source. */
	uint64_t from_trainer = 0, from_peers = 0, dup = 0, refetched = 0;
	json_t *reps = json_array();
	for (uint32_t r = 0; r < c->nreps; r++) {
		struct cluster_replica *re = &c->reps[r];
		if (re->late)
			continue;
		from_trainer += re->from_trainer;
		from_peers += re->from_peers;
		dup += re->duplicate;
		refetched += re->refetched;
		json_array_append_new(reps, replica_entry(re, v));
	}
	/* The wire cost of the version for all replicas together, and what
	 * the same version costs as an anchor (every replica's full parcels). */
	uint64_t wire_all = 0, anchor_all = 0;
	for (uint32_t r = 0; r < c->nreps; r++) {
		if (c->reps[r].late)
			continue; /* as in wire_all */
		anchor_all += replica_bytes(&c->reps[r]);
	}
	wire_all = from_trainer + from_peers;
	printf("  v%" PRIu64 " %s: %" PRIu64 " wire bytes for all replicas, %.2f %% of an anchor"
	       " (encode %.1f ms)\n",
	       v, x.kind, wire_all, anchor_all ? 100.0 * (double)wire_all / (double)anchor_all : 0.0,
	       (double)x.encode_us / 1000.0);
	fflush(stdout); /* progress shows as it happens, into a file or a pipe too */
	json_t *entry = json_pack("{s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "version", (json_int_t)v,
				  "kind", x.kind, "payload_bytes", (json_int_t)payload,
				  "trainer_upload_bytes", (json_int_t)from_trainer,
				  "peer_upload_bytes", (json_int_t)from_peers, "duplicate_bytes",
				  (json_int_t)dup, "refetched_bytes", (json_int_t)refetched,
				  "t_published_ms", (json_int_t)(published_ms - created), "replicas", reps);
	/* Where the update spent its time, as the tracker recorded it. */
	char path[128];
	struct trk_reply tr;
	snprintf(path, sizeof(path), TRK_API "/versions/%" PRIu64 "/timeline", v);
	if (entry != NULL && trk_client_call(c->trk, "GET", path, NULL, NULL, 0, &tr) == 0 &&
	    tr.status == 200 && tr.json != NULL)
		json_object_set(entry, "timeline", tr.json);
	trk_reply_fini(&tr);
	json_object_set_new(entry, "wire_bytes", json_integer((json_int_t)wire_all));
	json_object_set_new(entry, "anchor_bytes", json_integer((json_int_t)anchor_all));
	json_object_set_new(entry, "encode_ms", json_real((double)x.encode_us / 1000.0));
	json_t *far = site_bytes(c), *fv;
	const char *site;
	json_object_foreach(far, site, fv) {
		uint64_t need = UINT64_MAX; /* what the site's smallest replica holds */
		for (uint32_t r = 0; r < c->nreps; r++)
			if (!c->reps[r].late && strcmp(c->reps[r].site, site) == 0)
				need = PROTO_MIN(need, replica_bytes(&c->reps[r]));
		if (json_integer_value(fv) > 0 && need != UINT64_MAX && need > 0)
			printf("  v%" PRIu64 " into site %s from other sites: %" PRIu64
			       " bytes, %.2f x what one of its replicas holds\n",
			       v, site, (uint64_t)json_integer_value(fv),
			       (double)json_integer_value(fv) / (double)need);
	}
	json_object_set_new(entry, "bytes_from_other_sites", far);
	json_array_append_new(c->out_versions, entry);
	return ok ? 0 : -EBADMSG;
}

int node__cluster_run_late(struct cluster *c, uint64_t v)
{
	struct proto_err err;
	json_t *st = NULL;
	bool any = false;
	int rc = 0;

	for (uint32_t i = 0; i < c->nreps; i++) {
		struct cluster_replica *r = &c->reps[i];
		if (!r->late)
			continue;
		any = true;
		while (r->started < r->layout.nranks)
			if ((rc = node__cluster_start_rank(c, r, &err)) != 0) {
				fprintf(stderr, "cluster: %s\n", err.msg);
				return rc;
			}
	}
	if (!any)
		return 0;
	printf("tessera cluster: late replicas started after v%" PRIu64 "\n", v);
	fflush(stdout);
	rc = wait_wave(c, v, 0, true, &st);
	json_decref(st);
	bool ok = node__cluster_check_digests(c, v) && rc == 0;
	for (uint32_t i = 0; i < c->nreps && rc == 0; i++)
		if (c->reps[i].late) {
			node__cluster_probe_replica(c, &c->reps[i], v);
			ok &= c->reps[i].canary_ok != 0;
		}
	json_t *entry = json_array_get(c->out_versions, json_array_size(c->out_versions) - 1);
	json_t *reps = json_object_get(entry, "replicas");
	for (uint32_t i = 0; i < c->nreps; i++)
		if (c->reps[i].late)
			json_array_append_new(reps, replica_entry(&c->reps[i], v));
	return rc != 0 ? rc : ok ? 0 : -EBADMSG;
}
