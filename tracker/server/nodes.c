/* Node ranks: registration into replicas, and their per-version state reports. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

void trk__session_new(char out[2 * TRK_SESSION_BYTES + 1])
{
	uint8_t b[TRK_SESSION_BYTES];

	randombytes_buf(b, sizeof(b));
	sodium_bin2hex(out, 2 * TRK_SESSION_BYTES + 1, b, sizeof(b));
}

/* An optional field of exactly n bytes as hex: *have says whether it was
 * there (absent or null: not). */
static int get_opt_hex(json_t *o, const char *key, uint8_t *out, size_t n, bool *have,
		       struct proto_err *err)
{
	json_t *v = json_object_get(o, key);

	*have = v != NULL && !json_is_null(v);
	return *have ? trk__get_hex(o, key, out, n, err) : 0;
}

/* ---- POST /nodes -------------------------------------------------------------- */

/* Inserts rep keeping the list sorted by name. */
static void insert_replica(struct trk_registry *r, struct trk_replica *rep)
{
	struct trk_replica **pp = &r->reps;
	while (*pp != NULL && strcmp((*pp)->name, rep->name) < 0)
		pp = &(*pp)->next;
	rep->next = *pp;
	*pp = rep;
	trk__repindex_add(r, rep);
}

void trk__handle_nodes(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *replica = NULL, *host = NULL, *provider = NULL, *lname = NULL, *site = NULL;
	uint64_t rank = 0;
	uint8_t md[PROTO_HASH_BYTES], ld[PROTO_HASH_BYTES], sk[TRK_STMT_PK_BYTES];
	bool have_ld = false, have_sk = false;
	char *addr = NULL, hex[2 * PROTO_HASH_BYTES + 1];
	json_t *jl = json_object_get(c->json, "layout");
	struct trk_slayout *sl = NULL; /* holds a reference while here */
	struct trk_replica *rep, *new_rep = NULL;
	bool was_alive = false;
	struct trk_node *n = NULL, **new_ranks = NULL;
	int rc;

	if (trk__get_str(c->json, "replica", true, TRK_REPLICA_MAX, &replica, &err) != 0 ||
	    trk__get_u64(c->json, "rank", true, PROTO_MAX_RANKS - 1, &rank, &err) != 0 ||
	    trk__get_str(c->json, "host", true, TRK__HOST_MAX, &host, &err) != 0 ||
	    trk__get_str(c->json, "provider", true, TRK__PROVIDER_MAX, &provider,
			 &err) != 0 ||
	    trk__get_hexvar(c->json, "fabric_addr", TRK__FABRIC_ADDR_MAX, &addr,
			    &err) != 0 ||
	    trk__get_hex(c->json, "model_digest", md, sizeof(md), &err) != 0 ||
	    trk__get_str(c->json, "layout_name", false, TRK_REPLICA_MAX, &lname, &err) != 0 ||
	    trk__get_str(c->json, "site", false, TRK_SITE_MAX, &site, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (site != NULL && !trk_site_valid(site)) {
		trk__fail(c, 400, "site: want 1..%d of [A-Za-z0-9._-]", TRK_SITE_MAX);
		goto out;
	}
	if (!trk__replica_name_valid(replica)) {
		trk__fail(c, 400, "replica: want 1..%d of [A-Za-z0-9._-]", TRK_REPLICA_MAX);
		goto out;
	}
	if (lname != NULL && !trk__layout_name_valid(lname)) {
		trk__fail(c, 400, "layout_name: want 1..%d of [A-Za-z0-9._:-]", TRK_REPLICA_MAX);
		goto out;
	}
	if (get_opt_hex(c->json, "layout_digest", ld, sizeof(ld), &have_ld, &err) != 0 ||
	    get_opt_hex(c->json, "statement_key", sk, sizeof(sk), &have_sk, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (json_is_null(jl))
		jl = NULL;
	if (jl != NULL ? !json_is_object(jl) : !have_ld) {
		trk__fail(c, 400, "layout: missing or not an object");
		goto out;
	}
	if (!r->have_model) {
		trk__fail_routine(c, 409, "no model known yet: %s (retry)",
				  trk__registry_no_model(r));
		goto out;
	}
	if (memcmp(md, r->model.digest, sizeof(md)) != 0) {
		trk__hex(r->model.digest, PROTO_HASH_BYTES, hex);
		trk__fail(c, 409, "model_digest differs from the trainer's model (%s)", hex);
		goto out;
	}
	if (jl == NULL) {
		/* By digest: a layout this tracker holds was parsed and checked
		 * when it was first registered in full. */
		sl = trk__slayout_by_digest(r, ld);
		if (sl == NULL) {
			trk__hex(ld, PROTO_HASH_BYTES, hex);
			trk__fail_routine(c, 404, "layout_digest %s: this tracker holds no such "
					  "layout: send the layout itself", hex);
			goto out;
		}
	} else if ((rc = trk__slayout_get(r, jl, &sl, &err)) != 0) {
		trk__fail(c, rc == -ENOMEM ? 500 : 400, "%s", err.msg);
		goto out;
	} else if (have_ld && memcmp(ld, sl->digest, PROTO_HASH_BYTES) != 0) {
		trk__hex(sl->digest, PROTO_HASH_BYTES, hex);
		trk__fail(c, 400, "layout_digest differs from the layout's (%s)", hex);
		goto out;
	}
	if (rank >= sl->l.nranks) {
		trk__fail(c, 400, "rank %llu is not below the layout's %u ranks",
			  (unsigned long long)rank, sl->l.nranks);
		goto out;
	}
	rep = trk__replica_find(r, replica);
	if (rep != NULL && rep->layout != sl) {
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct trk_node *o = rep->ranks[i];
			if (o == NULL || !o->alive || i == rank)
				continue;
			trk__hex(rep->layout->digest, PROTO_HASH_BYTES, hex);
			trk__fail(c, 409,
				  "replica %s rank %u registered another layout (%s)",
				  replica, i, hex);
			goto out;
		}
	}

	was_alive = rep != NULL && trk__replica_alive(rep);

	/* Prepare everything that can fail, then commit. */
	n = calloc(1, sizeof(*n));
	if (n == NULL || (n->host = strdup(host)) == NULL ||
	    (n->provider = strdup(provider)) == NULL)
		goto oom;
	if (rep == NULL && (new_rep = calloc(1, sizeof(*new_rep))) == NULL)
		goto oom;
	if ((rep == NULL || rep->layout != sl) &&
	    (new_ranks = calloc(sl->l.nranks, sizeof(*new_ranks))) == NULL)
		goto oom;

	if (sl->name[0] == 0 && lname != NULL)
		snprintf(sl->name, sizeof(sl->name), "%s", lname);
	n->addr = addr;
	addr = NULL;
	snprintf(n->id, sizeof(n->id), "%s/%llu", replica, (unsigned long long)rank);
	snprintf(n->site, sizeof(n->site), "%s", site != NULL ? site : "");
	n->rank = (uint32_t)rank;
	n->layout = sl;
	n->alive = true;
	n->gone_why = NULL;
	n->last = -1;
	n->registered_ms = proto_wall_ms();
	trk__session_new(n->session);
	n->has_stmt_key = have_sk;
	memcpy(n->stmt_key, sk, have_sk ? sizeof(sk) : 0);
	n->expires_ns = proto_now_ns() + trk__registry_lease_ns(r);
	n->beat_ms = proto_wall_ms();
	trk__registry_lease_granted(r, n->expires_ns);
	if (rep == NULL) {
		rep = new_rep;
		new_rep = NULL;
		snprintf(rep->name, sizeof(rep->name), "%s", replica);
		rep->created_ms = proto_wall_ms();
		insert_replica(r, rep);
	}
	if (new_ranks != NULL) {
		/* A new replica, or a new layout for one whose other ranks are
		 * all gone: the old ranks go with the old layout. */
		if (rep->layout != NULL)
			LOG_INFO("replica %s changes layout", replica);
		for (uint32_t i = 0; i < rep->nranks; i++)
			trk__node_free(rep->ranks[i]);
		free(rep->ranks);
		rep->ranks = new_ranks;
		new_ranks = NULL;
		rep->nranks = sl->l.nranks;
		sl->refs++;
		trk__slayout_put(r, rep->layout);
		rep->layout = sl;
		rep->active = 0;
		rep->target = 0;
	}
	trk__node_free(rep->ranks[rank]); /* re-registration replaces */
	rep->ranks[rank] = n;
	n->rep = rep;
	trk__registry_members_changed(r);
	trk__replica_update_target(c->s, rep);
	if (!was_alive) /* its layout may be one the latest version lacks */
		trk__watches_replica_alive(c->s->w);
	LOG_INFO("node %s registered (%s, %s)", n->id, host, provider);
	trk__reply_json(c, 200, json_pack("{s:s,s:I,s:o,s:s}", "node_id", n->id,
					  "lease_ms", (json_int_t)r->s->lease_ms,
					  "layout_digest",
					  trk__json_hex(sl->digest, PROTO_HASH_BYTES),
					  "session", n->session));
	n = NULL;
	goto out;
oom:
	trk__fail(c, 500, "out of memory");
out:
	trk__slayout_put(r, sl);
	free(new_rep);
	free(new_ranks);
	trk__node_free(n);
	free(addr);
}

/* ---- POST /nodes/state ----------------------------------------------------- */

/* Adds what a report adds to the counters it reported before. A counter that
 * went down restarted (a new transfer): all of it is new. */
static uint64_t grow(uint64_t old, uint64_t now)
{
	return now >= old ? now - old : now;
}

/* "banned": peers the node banned for this version (hostile: at most
 * BANNED_MAX ids, each a printable word shorter than TRK_ID_MAX), joined
 * with spaces into out. Absent or null: out stays empty. */
#define BANNED_MAX 16
static int banned_parse(json_t *j, char *out, size_t cap, struct proto_err *err)
{
	size_t i, len = 0;
	json_t *v;

	if (j == NULL || json_is_null(j))
		return 0;
	if (!json_is_array(j) || json_array_size(j) > BANNED_MAX)
		return proto_errf(err, EINVAL, "banned: want an array of at most %d node ids",
				  BANNED_MAX);
	json_array_foreach(j, i, v) {
		const char *id = json_string_value(v);
		size_t n = id ? strlen(id) : 0;
		if (n == 0 || n >= TRK_ID_MAX || len + n + 2 > cap)
			return proto_errf(err, EINVAL, "banned[%zu]: want a node id", i);
		for (size_t k = 0; k < n; k++)
			if ((unsigned char)id[k] <= 0x20 || id[k] == 0x7f)
				return proto_errf(err, EINVAL, "banned[%zu]: want a node id", i);
		len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? " " : "", id);
	}
	return 0;
}

/* The answer to a state report: where the replica stands at version. */
static void reply_state(struct trk_call *c, struct trk_replica *rep, uint64_t version, bool stale)
{
	bool complete = trk__replica_complete(rep, version);
	json_t *stmts = NULL;

	/* A claim of completeness comes with what backs it. */
	if (complete && (stmts = trk__replica_statements(rep, version)) == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	trk__reply_json(c, 200,
			json_pack("{s:s,s:b,s:I,s:I,s:o*,s:b}", "replica", rep->name,
				  "replica_complete", complete,
				  "replica_active", (json_int_t)rep->active,
				  "replica_target", (json_int_t)rep->target,
				  "statements", stmts, "stale", stale));
}

void trk__handle_node_state(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL, *state = NULL, *how = NULL;
	json_t *jerr = json_object_get(c->json, "error");
	json_t *jneed = json_object_get(c->json, "need_anchor");
	/* Absent counters keep their last reported value. */
	const uint64_t ABSENT = UINT64_MAX;
	uint64_t version = 0, done = ABSENT, total = ABSENT, ft = ABSENT, fp = ABSENT;
	uint64_t dup = ABSENT, refetched = ABSENT, far = ABSENT, seq = 0;
	uint64_t first_ms = 0, last_ms = 0; /* the node's clock; 0: not yet */
	char banned[TRK__ERROR_MAX + 1] = "";
	json_t *jban = json_object_get(c->json, "banned");
	enum trk_rank_state st;
	struct trk_version *ver;
	struct trk_node *n;
	struct trk_nver *e;
	char error[TRK__ERROR_MAX + 1] = "";
	uint8_t sig[TRK_STMT_SIG_BYTES];
	bool have_sig = false;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__get_str(c->json, "state", true, 16, &state, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_done", false, ABSENT - 1, &done, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_total", false, ABSENT - 1, &total, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_from_trainer", false, ABSENT - 1, &ft, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_from_peers", false, ABSENT - 1, &fp, &err) != 0 ||
	    trk__get_u64(c->json, "duplicate_bytes", false, ABSENT - 1, &dup, &err) != 0 ||
	    trk__get_u64(c->json, "refetched_bytes", false, ABSENT - 1, &refetched, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_from_other_sites", false, ABSENT - 1, &far, &err) != 0 ||
	    trk__get_u64(c->json, "first_byte_ms", false, TRK__WALL_MS_MAX, &first_ms, &err) != 0 ||
	    trk__get_u64(c->json, "last_byte_ms", false, TRK__WALL_MS_MAX, &last_ms, &err) != 0 ||
	    trk__get_str(c->json, "how", false, 7, &how, &err) != 0 ||
	    trk__get_u64(c->json, "seq", false, TRK__WALL_MS_MAX, &seq, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (banned_parse(jban, banned, sizeof(banned), &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (how != NULL && strcmp(how, "delta") != 0 && strcmp(how, "chain") != 0 &&
	    strcmp(how, "full") != 0) {
		trk__fail(c, 400, "how: want delta, chain or full");
		return;
	}
	if (jneed != NULL && !json_is_boolean(jneed)) {
		trk__fail(c, 400, "need_anchor: must be true or false");
		return;
	}
	if (jerr != NULL && !json_is_null(jerr)) {
		if (!json_is_string(jerr)) {
			trk__fail(c, 400, "error: must be a string");
			return;
		}
		/* A node's error is shown, not parsed: made one short line. */
		snprintf(error, sizeof(error), "%s", json_string_value(jerr));
		for (char *q = error; *q; q++)
			if ((unsigned char)*q < 0x20 || *q == 0x7f)
				*q = ' ';
	}
	if (trk_state_parse(state, &st) != 0) {
		trk__fail(c, 400, "state: want fetching, verified, active or failed");
		return;
	}
	if (get_opt_hex(c->json, "statement", sig, sizeof(sig), &have_sig, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (version == 0) {
		trk__fail(c, 400, "version: must be >= 1");
		return;
	}
	n = trk__node_find(r, id);
	if (n == NULL || !n->alive) {
		trk__fail(c, 404, "node %s is unknown or its lease expired: register again", id);
		return;
	}
	ver = trk__versions_find(c->s->vs, version);
	if (ver == NULL) {
		trk__fail(c, 409, "version %llu is not published", (unsigned long long)version);
		return;
	}
	/* A rank that registered a statement key backs every claim that it
	 * holds a version with its signature (wire/statement.c). */
	if (st == TRK_STATE_VERIFIED || st == TRK_STATE_ACTIVE) {
		if (n->has_stmt_key && !have_sig) {
			trk__fail(c, 400, "statement: missing (node %s registered a "
				  "statement_key)", id);
			return;
		}
		if (have_sig && !n->has_stmt_key) {
			trk__fail(c, 400, "statement: node %s registered no statement_key", id);
			return;
		}
		if (have_sig && !trk_statement_verify(n->stmt_key, n->rep->name, n->rank,
						      version, ver->digest, sig)) {
			trk__fail(c, 400, "statement: does not verify for %s at v%llu",
				  id, (unsigned long long)version);
			return;
		}
	}
	/* Each report travels on its own connection: an older one that arrives
	 * after a newer one (a "failed" overtaking the "verified" that followed
	 * it) changes nothing; its sender is told where the replica stands. */
	if (seq != 0 && seq <= n->report_seq) {
		LOG_DEBUG("tracker: %s's report %llu (%s v%llu) arrived after its report %llu: "
			  "ignored", id, (unsigned long long)seq, state,
			  (unsigned long long)version, (unsigned long long)n->report_seq);
		reply_state(c, n->rep, version, true);
		return;
	}
	if (seq != 0)
		n->report_seq = seq;
	e = trk__node_version(n, version);
	if (e == NULL) {
		if (n->nvers < TRK__NODE_VERSIONS) {
			e = &n->vers[n->nvers++];
		} else {
			/* Forget the oldest version that is not the active one. */
			size_t lo = SIZE_MAX;
			for (size_t i = 0; i < n->nvers; i++)
				if (n->vers[i].version != n->active &&
				    (lo == SIZE_MAX || n->vers[i].version < n->vers[lo].version))
					lo = i;
			e = &n->vers[lo];
		}
		memset(e, 0, sizeof(*e));
		e->version = version;
		e->first_ms = proto_wall_ms();
	}
	done = done == ABSENT ? e->done : done;
	total = total == ABSENT ? e->total : total;
	/* How long a rank takes to fetch a version, for the disagreement
	 * note, and at what rate, for whether it keeps up with its swarm
	 * (members_cut in sources.c). */
	if (st == TRK_STATE_VERIFIED && e->state != TRK_STATE_VERIFIED &&
	    e->state != TRK_STATE_ACTIVE) {
		n->rep->fetch_ms = proto_wall_ms() - e->first_ms;
		n->rep->fetch_bps = trk__fetch_bps(&e->rate, total, n->rep->fetch_ms);
	}
	ft = ft == ABSENT ? e->from_trainer : ft;
	fp = fp == ABSENT ? e->from_peers : fp;
	dup = dup == ABSENT ? e->duplicate : dup;
	refetched = refetched == ABSENT ? e->refetched : refetched;
	far = far == ABSENT ? e->from_other_sites : far;
	ver->bytes_from_trainer += grow(e->from_trainer, ft);
	ver->bytes_from_peers += grow(e->from_peers, fp);
	ver->duplicate_bytes += grow(e->duplicate, dup);
	ver->refetched_bytes += grow(e->refetched, refetched);
	ver->bytes_from_other_sites += grow(e->from_other_sites, far);
	r->bytes_from_trainer += grow(e->from_trainer, ft);
	r->bytes_from_peers += grow(e->from_peers, fp);
	r->bytes_from_other_sites += grow(e->from_other_sites, far);
	e->state = st;
	e->has_sig = have_sig && (st == TRK_STATE_VERIFIED || st == TRK_STATE_ACTIVE);
	memcpy(e->sig, sig, e->has_sig ? sizeof(sig) : 0);
	if (how != NULL && e->how[0] == 0)
		trk__versions_note_built(c->s->vs, how);
	if (how != NULL)
		snprintf(e->how, sizeof(e->how), "%s", how);
	if (json_is_true(jneed))
		trk__versions_want_anchor(c->s->vs, version);
	/* Its first rate, where none judged it before (members_cut). */
	if (st == TRK_STATE_FETCHING && trk__rate_sample(&e->rate, proto_wall_ms(), done) &&
	    n->rep->fetch_bps == 0)
		c->s->reg->rates_new = true;
	e->done = done;
	e->total = total;
	e->from_trainer = ft;
	e->from_peers = fp;
	e->duplicate = dup;
	e->refetched = refetched;
	e->from_other_sites = far;
	if (jban != NULL && !json_is_null(jban))
		snprintf(e->banned, sizeof(e->banned), "%s", banned);
	n->last = (int)(e - n->vers);
	n->report_ms = proto_wall_ms();
	if (st == TRK_STATE_FAILED)
		snprintf(n->error, sizeof(n->error), "v%llu: %s",
			 (unsigned long long)version, error[0] ? error : "failed");
	else if (st != TRK_STATE_FETCHING)
		n->error[0] = 0;
	if (st == TRK_STATE_ACTIVE)
		n->active = version;
	uint64_t was_active = n->rep->active;
	trk__replica_update_active(r, n->rep);
	trk__replica_update_target(c->s, n->rep);
	bool complete = trk__replica_complete(n->rep, version);
	trk__timeline_rank(r->tl, version, n->rep->name, n->rep->nranks, n->rank, st, first_ms,
			   last_ms, e->from_trainer, e->from_peers, n->report_ms);
	if (complete)
		trk__timeline_replica(r->tl, version, n->rep->name, n->rep->nranks, false,
				      n->report_ms);
	if (n->rep->active != was_active)
		trk__timeline_replica(r->tl, n->rep->active, n->rep->name, n->rep->nranks, true,
				      n->report_ms);
	reply_state(c, n->rep, version, false);
}
