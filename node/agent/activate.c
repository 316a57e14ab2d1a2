/* The switch from verified to active: the other ranks' statements checked,
 * the activation record written, the served slot switched (the decision
 * to switch is version.c's). */
#include "node/agent/internal.h"

#include <unistd.h>

#include "node/serve/expose.h"

/*
 * The activation record, <expose>/<replica>-<rank>.json: what a serving
 * process reads to find the served slot. A node is active on a version only
 * once that record names it; when it cannot be written the old version stays
 * the served one and the node reports the reason as a failure. It names
 * this process's memory: the node removes it when it stops
 * (agent_unexpose), and readers refuse one left by a node that died
 * (node/serve/expose.h).
 */
static void expose_path(const struct node_agent *a, char *path, size_t len)
{
	snprintf(path, len, "%s/%s-%u.json", a->o.expose_dir, a->o.replica, a->o.rank);
}

/* path as the record names it: absolute, so that a reader in another
 * directory finds it (a relative --attach is taken from the node's
 * working directory); path itself when that is unknown. */
static const char *absolute(const char *path, char *buf, size_t len)
{
	char cwd[4096];

	if (path[0] == '/' || getcwd(cwd, sizeof(cwd)) == NULL)
		return path;
	while (path[0] == '.' && path[1] == '/')
		path += 2;
	if ((size_t)snprintf(buf, len, "%s/%s", cwd, path) >= len)
		return path;
	return buf;
}

/* The record's text for slot serving version v (at digest): the caller
 * frees; NULL when out of memory. */
static char *record_text(struct node_agent *a, struct node_slot *slot, uint64_t v,
			 const uint8_t *digest)
{
	json_t *o, *locals;
	char *txt = NULL;

	o = node_slot_describe(&a->store, slot);
	locals = json_array();
	if (o == NULL || locals == NULL)
		goto out;
	const struct proto_rank *rk = &a->layout.ranks[a->o.rank];
	for (uint32_t i = 0; i < rk->nlocals; i++) {
		const struct proto_local *l = &rk->locals[i];
		json_t *shape = json_array();
		for (uint32_t d = 0; d < l->ndim; d++)
			json_array_append_new(shape, json_integer((json_int_t)l->shape[d]));
		json_t *e = json_pack("{s:s,s:I,s:I,s:s,s:o}", "name", l->name, "offset",
				      (json_int_t)l->offset, "nbytes", (json_int_t)l->nbytes, "dtype",
				      proto_dtype_name(l->dtype), "shape", shape);
		/* An FP8 local's block scales follow it (proto/spec.h): named. */
		if (e != NULL && i + 1 < rk->nlocals && rk->locals[i + 1].scales)
			json_object_set_new(e, "scale", json_string(rk->locals[i + 1].name));
		json_array_append_new(locals, e);
	}
	char hex[2 * PROTO_HASH_BYTES + 1], mhex[2 * PROTO_HASH_BYTES + 1];
	sodium_bin2hex(hex, sizeof(hex), a->layout.digest, PROTO_HASH_BYTES);
	sodium_bin2hex(mhex, sizeof(mhex), digest, PROTO_HASH_BYTES);
	json_object_set_new(o, "version", json_integer((json_int_t)v));
	json_object_set_new(o, "replica", json_string(a->o.replica));
	json_object_set_new(o, "rank", json_integer(a->o.rank));
	json_object_set_new(o, "pid", json_integer(getpid()));
	json_object_set_new(o, "layout_digest", json_string(hex));
	json_object_set_new(o, "manifest_digest", json_string(mhex));
	json_object_set_new(o, "activated_ms", json_integer((json_int_t)proto_wall_ms()));
	json_object_set_new(o, "locals", locals);
	locals = NULL;
	if (a->attach != NULL) {
		char abs[4096];
		json_object_set_new(o, "attach", json_string(absolute(node_attach_path(a->attach),
								      abs, sizeof(abs))));
	}
	/* For people as much as programs: one key a line. */
	txt = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
out:
	json_decref(locals);
	json_decref(o);
	return txt;
}

/* The activation record of slot (at digest), renamed into place; 0 or an
 * error in err. */
static int agent_write_expose(struct node_agent *a, struct node_slot *slot,
			      const uint8_t *digest, struct proto_err *err)
{
	char path[4096], *txt;
	int rc;

	if (a->o.expose_dir == NULL)
		return 0;
	expose_path(a, path, sizeof(path));
	if ((txt = record_text(a, slot, slot->version, digest)) == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", path);
	/* Written on the way to the switch: replaced atomically, not fsync'ed.
	 * What it names (a memfd of this process) does not outlive a crash of
	 * the machine, which is all an fsync would guard against. */
	rc = proto_write_file_replace(path, txt, strlen(txt), 0644, err);
	free(txt);
	return rc;
}

/* Where a record staged for an in-place install waits: beside the record. */
static void staged_path(const struct node_agent *a, char *path, size_t len)
{
	snprintf(path, len, "%s/.%s-%u.next", a->o.expose_dir, a->o.replica, a->o.rank);
}

int agent_stage_expose(struct node_agent *a, struct node_slot *slot, uint64_t v,
		       const uint8_t *digest, struct proto_err *err)
{
	char path[4096], *txt;
	int rc;

	if (a->o.expose_dir == NULL)
		return 0;
	staged_path(a, path, sizeof(path));
	if ((txt = record_text(a, slot, v, digest)) == NULL)
		return proto_errf(err, ENOMEM, "%s: out of memory", path);
	/* On disk before the pause: renaming a file whose data is not over
	 * one that exists makes ext4 (auto_da_alloc) write it out then. */
	rc = proto_write_file_atomic(path, txt, strlen(txt), 0644, err);
	free(txt);
	return rc;
}

int agent_commit_expose(struct node_agent *a, struct proto_err *err)
{
	char staged[4096], path[4096];

	if (a->o.expose_dir == NULL)
		return 0;
	staged_path(a, staged, sizeof(staged));
	expose_path(a, path, sizeof(path));
	if (rename(staged, path) != 0)
		return proto_errf(err, errno, "%s: %s", path, strerror(errno));
	return 0;
}

void agent_unstage_expose(struct node_agent *a)
{
	char staged[4096];

	if (a->o.expose_dir == NULL)
		return;
	staged_path(a, staged, sizeof(staged));
	unlink(staged);
}

void agent_sync_expose(struct node_agent *a)
{
	char path[4096];
	struct proto_err err;

	if (a->o.expose_dir == NULL)
		return;
	expose_path(a, path, sizeof(path));
	if (proto_sync_file(path, &err) != 0)
		LOG_WARN("node %s: the activation record is in place but not on disk: %s", a->node_id,
			 err.msg);
}

void agent_unexpose(struct node_agent *a)
{
	char path[4096];
	struct proto_err err;

	if (a->o.expose_dir == NULL || a->active == NULL)
		return;
	agent_unstage_expose(a); /* an in-place install stopped in its drain */
	expose_path(a, path, sizeof(path));
	if (node_expose_remove(path, getpid(), &err) != 0)
		LOG_WARN("node %s: %s", a->node_id, err.msg);
}

/* The activation record can be written now: a probe file in the expose
 * directory (created first if missing) is written and removed. A rank that
 * could not activate does not say "verified", so its replica never becomes
 * complete and no other rank switches without it. */
int agent_probe_expose(struct node_agent *a, struct proto_err *err)
{
	char path[4096];
	int rc;

	if (a->o.expose_dir == NULL)
		return 0;
	if ((rc = proto_mkdir_p(a->o.expose_dir, err)) != 0)
		return rc;
	snprintf(path, sizeof(path), "%s/.%s-%u.probe", a->o.expose_dir, a->o.replica, a->o.rank);
	if ((rc = proto_write_file_atomic(path, "{}", 2, 0644, err)) != 0)
		return rc;
	unlink(path);
	return 0;
}

/* The node cannot activate f: it says so (once per reason) and keeps the
 * fetch; the next sync tries again. */
void agent_expose_blocked(struct node_agent *a, const char *what, const struct proto_err *err)
{
	struct agent_version *v = a->ver;
	char msg[sizeof(v->expose_error)];

	snprintf(msg, sizeof(msg), "%s: %s", what, err->msg);
	if (strcmp(msg, v->expose_error) != 0)
		LOG_ERR("node %s: v%" PRIu64 " not activated: %s", a->node_id, v->version, msg);
	snprintf(v->expose_error, sizeof(v->expose_error), "%s", msg);
	agent_report(a, v->version, TRK_STATE_FAILED, msg, NULL);
}

void agent_activate(struct node_agent *a)
{
	struct fetch *f = a->ver->f;
	struct proto_err err;

	/* Memory-tight: written into the served slot (inplace.c). */
	if (agent_inplace(a)) {
		agent_inplace_start(a);
		return;
	}
	if (node_slot_activate(&a->store, f->slot, &err) != 0) {
		agent_version_fail(a, "activation: %s", err.msg);
		return;
	}
	if (agent_write_expose(a, f->slot, f->man.digest, &err) != 0) {
		agent_expose_blocked(a, "cannot write the activation record", &err);
		return;
	}
	/* The switch: from here on the new slot is the served one. */
	struct node_slot *old = a->active;
	a->active = f->slot;
	f->slot = NULL;
	agent_activated(a, old);
}

/*
 * The tracker says the replica is complete at our verified version: that
 * holds only when every other rank's statement that it holds the version
 * (signed with the key it registered, over the manifest digest we verified)
 * comes with the claim. A tracker fooled by, or a man in the middle posing
 * as, one other node cannot make us switch without the other ranks.
 */
bool agent_replica_backed(struct node_agent *a, json_t *statements)
{
	struct agent_version *v = a->ver;
	struct proto_err err;

	if (trk_statements_check(statements, a->o.replica, a->layout.nranks, a->o.rank,
				 v->version, v->f->man.digest, &err) == 0) {
		v->unbacked[0] = 0;
		return true;
	}
	if (strcmp(err.msg, v->unbacked) != 0) {
		LOG_WARN("node %s: the tracker says replica %s holds v%" PRIu64
			 " but %s: not switching", a->node_id, a->o.replica, v->version, err.msg);
		proto_metrics_add(a->am.m, a->am.unbacked_claims, 1);
	}
	snprintf(v->unbacked, sizeof(v->unbacked), "%s", err.msg);
	return false;
}

/* After the switch: the version is active. Reported, measured, kept
 * served; the rebuild keeps what it needs of it; serving clients move to
 * it and the old slot is retired once they release it. */
void agent_activated(struct node_agent *a, struct node_slot *old)
{
	struct agent_version *v = a->ver;
	struct fetch *f = v->f;

	memcpy(a->active_digest, f->man.digest, PROTO_HASH_BYTES);
	a->need_anchor = false;
	node_wait_over(&a->wait, NULL);
	agent_stage(a, STAGE_ACTIVE);
	LOG_INFO("node %s: v%" PRIu64 " active (%" PRIu64 " bytes, %" PRIu64 " from trainer, %" PRIu64
		 " from peers, %" PRIu64 " refetched, %" PRIu64 " ms; %u stalled reads, %u times a "
		 "congested peer was waited for, %u failed reads, %u chunks failed their hash; "
		 "%" PRIu64 " page faults in the process since the fetch began, %s)",
		 a->node_id, f->version, f->bytes_done, f->from_trainer, f->from_peers, f->refetched,
		 node_now_ms() - f->started_ms, f->stalls, f->congested, f->read_failures,
		 f->bad_chunks, proto_process_faults() - f->faults0,
		 a->active->reused ? "fetched into a retired version's slot" : "fetched into a slot not used before");
	/* The replica's line (its rank 0 says it): the chain's steps count
	 * with their target, as the reports do. */
	const struct agent_chain *c = a->chain != NULL && a->chain->target == f->version ? a->chain
											   : NULL;
	agent_rlog_activated(a, f->version, c != NULL ? "chain" : f->delta ? "delta" : "full",
			     f->from_trainer + (c != NULL ? c->from_trainer : 0),
			     f->from_peers + (c != NULL ? c->from_peers : 0),
			     f->have_man ? f->man.created_ms : 0);
	proto_metrics_set(a->am.m, a->am.active_version, f->version);
	proto_metrics_set(a->am.m, a->am.serving_bytes, a->active->len);
	proto_metrics_add(a->am.m, a->am.activations, 1);
	proto_metrics_observe(a->am.m, a->am.activation_seconds,
			      (double)(node_now_ms() - f->started_ms) / 1000.0);
	agent_report(a, f->version, TRK_STATE_ACTIVE, NULL, NULL);
	/* The fetch ends; its parcels stay served (until the next
	 * activation): the swarm keeps the version, record and all. */
	a->ver = NULL;
	fetch_end(&a->fx);
	delta_warm_pause(&a->ds, false);
	/* Requests pinning the old slot keep it until they release it. In
	 * place, the same slot comes back with the new version. */
	agent_chain_end(a, false); /* the target is active: the replay is over */
	delta_activated(&a->ds, &v->db, old); /* a standby copied from old goes first */
	swarm_keep(&a->sw, f); /* may free the version (not served): last */
	swarm_xl_serve(&a->sw, a->active);
	if (old == a->active) {
		if (node_attach_paused(a->attach)) /* an in-place install resumes on its own */
			node_attach_resume(a->attach, a->active, a->active_digest);
	} else {
		node_attach_activate(a->attach, a->active, a->active_digest);
		node_attach_retire(a->attach, &a->store, old);
	}
	agent_sync_now(a); /* the replica's next target may be there already */
}
