/* `tessera cluster`: the tracker's status (GET /api/v1/status) as the
 * launcher reads it: which replicas activated a version, when, and with
 * how many bytes from which source. */
#include <errno.h>
#include <string.h>

#include "node/cli/cluster.h"
#include "proto/proto.h"
#include "tracker/tracker.h"

int node__cluster_status(struct cluster *c, json_t **out)
{
	struct trk_reply r;
	int rc = trk_client_call(c->trk, "GET", TRK_API "/status", NULL, NULL, 0, &r);
	if (rc == 0 && r.status == 200 && r.json != NULL) {
		*out = json_incref(r.json);
		trk_reply_fini(&r);
		return 0;
	}
	trk_reply_fini(&r);
	return rc ? rc : -EIO;
}

json_t *node__cluster_find_replica(json_t *st, const char *name)
{
	json_t *rep;
	size_t i;
	json_array_foreach(json_object_get(st, "replicas"), i, rep)
		if (strcmp(json_string_value(json_object_get(rep, "replica")), name) == 0)
			return rep;
	return NULL;
}

void node__cluster_scan_activations(struct cluster *c, json_t *st, uint64_t v, uint64_t created,
				    bool late)
{
	json_t *a;
	size_t k;

	json_array_foreach(json_object_get(st, "activations"), k, a)
	{
		const char *name = json_string_value(json_object_get(a, "replica"));
		uint64_t wall = (uint64_t)json_integer_value(json_object_get(a, "wall_ms"));
		if ((uint64_t)json_integer_value(json_object_get(a, "version")) != v || name == NULL)
			continue;
		for (uint32_t i = 0; i < c->nreps; i++) {
			struct cluster_replica *r = &c->reps[i];
			if (r->late != late || r->activated || strcmp(name, r->name) != 0)
				continue;
			if (late && r->registered_ms == 0)
				continue; /* not known to have registered yet */
			r->activated = true;
			r->t_activate_ms = wall - PROTO_MIN(wall, late ? r->registered_ms : created);
		}
	}
}

void node__cluster_replica_counters(json_t *st, struct cluster_replica *r, uint64_t v)
{
	json_t *rk;
	size_t k;

	r->from_trainer = r->from_peers = r->duplicate = r->refetched = r->from_other_sites = 0;
	json_t *rep = node__cluster_find_replica(st, r->name);
	json_array_foreach(json_object_get(rep, "ranks"), k, rk)
	{
		uint64_t reg = (uint64_t)json_integer_value(json_object_get(rk, "registered_ms"));
		if (reg != 0 && (r->registered_ms == 0 || reg < r->registered_ms))
			r->registered_ms = reg;
		if ((uint64_t)json_integer_value(json_object_get(rk, "version")) != v)
			continue;
		r->from_trainer += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_trainer"));
		r->from_peers += (uint64_t)json_integer_value(json_object_get(rk, "bytes_from_peers"));
		r->duplicate += (uint64_t)json_integer_value(json_object_get(rk, "duplicate_bytes"));
		r->refetched += (uint64_t)json_integer_value(json_object_get(rk, "refetched_bytes"));
		r->from_other_sites +=
			(uint64_t)json_integer_value(json_object_get(rk, "bytes_from_other_sites"));
	}
}
