/* Publishers: registration (POST /publishers) with the model they serve. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

/* ---- POST /publishers ------------------------------------------------------- */

static int parse_rank_addr(json_t *o, const char *what, uint32_t nranks,
			   struct trk_prank *out, struct proto_err *err)
{
	const char *host = NULL, *provider = NULL;
	uint64_t rank = 0;
	int rc;

	if (!json_is_object(o))
		return proto_errf(err, EINVAL, "%s: must be an object", what);
	if ((rc = trk__get_u64(o, "rank", true, UINT32_MAX, &rank, err)) != 0 ||
	    (rc = trk__get_str(o, "host", true, TRK__HOST_MAX, &host, err)) != 0 ||
	    (rc = trk__get_str(o, "provider", true, TRK__PROVIDER_MAX, &provider,
			       err)) != 0 ||
	    (rc = trk__get_hexvar(o, "fabric_addr", TRK__FABRIC_ADDR_MAX, &out->addr,
				  err)) != 0) {
		proto_err_prefix(err, "%s", what);
		return rc;
	}
	if (rank >= nranks) {
		free(out->addr);
		out->addr = NULL;
		return proto_errf(err, EINVAL,
				  "%s: rank %llu is not below the layout's %u ranks",
				  what, (unsigned long long)rank, nranks);
	}
	out->rank = (uint32_t)rank;
	out->host = strdup(host);
	out->provider = strdup(provider);
	if (out->host == NULL || out->provider == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	return 0;
}

void trk__handle_publishers(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	struct proto_model model;
	struct proto_layout layout;
	struct trk_publisher *p = NULL;
	json_t *jm = json_object_get(c->json, "model");
	json_t *jl = json_object_get(c->json, "layout");
	json_t *jr = json_object_get(c->json, "ranks");
	json_t *model_json = NULL, *layout_json = NULL;
	bool have_model = false, have_layout = false, same_model, same_layout;
	struct trk_version *latest;
	uint8_t rid[8];
	uint64_t every_ms = 0;
	const char *site = NULL;

	proto_model_init(&model);
	memset(&layout, 0, sizeof(layout));
	if (!json_is_object(jm)) {
		trk__fail(c, 400, "model: missing or not an object");
		goto out;
	}
	if (!json_is_object(jl)) {
		trk__fail(c, 400, "layout: missing or not an object");
		goto out;
	}
	if (!json_is_array(jr) || json_array_size(jr) == 0 ||
	    json_array_size(jr) > PROTO_MAX_RANKS) {
		trk__fail(c, 400, "ranks: must be a non-empty array");
		goto out;
	}
	/* Its clock, when it publishes on one: what the page holds its
	 * versions against. */
	if (trk__get_u64(c->json, "every_ms", false, TRK__EVERY_MS_MAX, &every_ms, &err) != 0 ||
	    (json_object_get(c->json, "every_ms") != NULL &&
	     !json_is_null(json_object_get(c->json, "every_ms")) && every_ms == 0)) {
		trk__fail(c, 400, "every_ms: want 1..%u ms", TRK__EVERY_MS_MAX);
		goto out;
	}
	if (trk__get_str(c->json, "site", false, TRK_SITE_MAX, &site, &err) != 0 ||
	    (site != NULL && !trk_site_valid(site))) {
		trk__fail(c, 400, "site: want 1..%d of [A-Za-z0-9._-]", TRK_SITE_MAX);
		goto out;
	}
	if (proto_model_from_json(jm, "model", &model, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	have_model = true;
	if (proto_layout_from_json(&model, jl, "layout", &layout, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	have_layout = true;
	p = calloc(1, sizeof(*p));
	if (p == NULL || (p->ranks = calloc(json_array_size(jr), sizeof(*p->ranks))) == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < json_array_size(jr); i++) {
		char what[32];
		snprintf(what, sizeof(what), "ranks[%zu]", i);
		p->nranks = i + 1;
		if (parse_rank_addr(json_array_get(jr, i), what, layout.nranks,
				    &p->ranks[i], &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			goto out;
		}
		for (size_t j = 0; j < i; j++)
			if (p->ranks[j].rank == p->ranks[i].rank) {
				trk__fail(c, 400, "ranks: rank %u listed twice",
					  p->ranks[i].rank);
				goto out;
			}
	}

	/* Conflicts: nothing has changed yet. */
	latest = trk__versions_count(c->s->vs) > 0 ?
			 trk__versions_at(c->s->vs, trk__versions_count(c->s->vs) - 1) :
			 NULL;
	if (latest != NULL &&
	    memcmp(latest->model_digest, model.digest, PROTO_HASH_BYTES) != 0) {
		/* Nodes waiting for a model are told why none comes. */
		snprintf(r->model_refused, sizeof(r->model_refused),
			 "the tracker refused a publisher's model: model digest differs from the "
			 "versions in its --state directory (another model's)");
		trk__fail(c, 409, "model digest differs from the published versions' model");
		goto out;
	}
	same_model = r->have_model &&
		     memcmp(r->model.digest, model.digest, PROTO_HASH_BYTES) == 0;
	same_layout = same_model &&
		      memcmp(r->tlayout.digest, layout.digest, PROTO_HASH_BYTES) == 0;
	/* A live publisher's ranks are its own: only it (its session) takes
	 * them again; another waits for its lease to end. */
	for (struct trk_publisher *q = r->pubs; c->s->auth != NULL && q; q = q->next) {
		for (size_t i = 0; q->alive && i < p->nranks; i++) {
			if (!trk__publisher_has_rank(q, p->ranks[i].rank) ||
			    trk__session_presented(c->headers, q->session))
				continue;
			c->s->auth_refused++;
			trk__fail(c, 409, "publisher %s is live and serves rank %u: a second "
				  "registration cannot take it over (wait for its lease to end)",
				  q->id, p->ranks[i].rank);
			goto out;
		}
	}
	if (r->have_model && !same_layout) {
		for (struct trk_publisher *q = r->pubs; q; q = q->next) {
			if (!q->alive)
				continue;
			trk__fail(c, 409,
				  "live publisher %s registered another %s; wait for its lease to end",
				  q->id, same_model ? "trainer layout" : "model");
			goto out;
		}
	}
	model_json = proto_model_to_json(&model);
	layout_json = proto_layout_to_json(&model, &layout);
	if (model_json == NULL || layout_json == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}

	/* Commit. */
	if (!same_model) {
		if (r->have_model)
			LOG_WARN("model replaced; replicas registered against the old one are dropped");
		trk__registry_drop_model(r);
		r->model = model;
		r->model_json = model_json;
		model_json = NULL;
		have_model = false;
		r->have_model = true;
		r->model_refused[0] = 0;
	} else {
		json_decref(model_json);
		model_json = NULL;
	}
	if (!same_layout) {
		if (same_model)
			proto_layout_fini(&r->tlayout);
		json_decref(r->tlayout_json);
		r->tlayout = layout;
		r->tlayout_json = layout_json;
		layout_json = NULL;
		have_layout = false;
	}
	for (struct trk_publisher *q = r->pubs; q; q = q->next) {
		bool overlap = false;
		for (size_t i = 0; q->alive && i < p->nranks; i++)
			overlap |= trk__publisher_has_rank(q, p->ranks[i].rank);
		if (overlap) {
			q->alive = false;
			q->gone_ms = proto_wall_ms();
			LOG_INFO("publisher %s replaced by a new registration", q->id);
		}
	}
	randombytes_buf(rid, sizeof(rid));
	memcpy(p->id, "pub-", 4);
	trk__hex(rid, sizeof(rid), p->id + 4);
	trk__session_new(p->session);
	p->alive = true;
	p->registered_ms = proto_wall_ms();
	p->every_ms = every_ms;
	snprintf(p->site, sizeof(p->site), "%s", site != NULL ? site : "");
	p->expires_ns = proto_now_ns() + trk__registry_lease_ns(r);
	trk__registry_lease_granted(r, p->expires_ns);
	trk__registry_changed(r);
	p->next = r->pubs;
	r->pubs = p;
	LOG_INFO("publisher %s registered with %zu ranks", p->id, p->nranks);
	trk__reply_json(c, 200,
			json_pack("{s:s,s:s,s:I,s:o,s:o}", "publisher_id", p->id, "session",
				  p->session,
				  "lease_ms", (json_int_t)r->s->lease_ms,
				  "model_digest",
				  trk__json_hex(r->model.digest, PROTO_HASH_BYTES),
				  "layout_digest",
				  trk__json_hex(r->tlayout.digest, PROTO_HASH_BYTES)));
	p = NULL;
out:
	json_decref(model_json);
	json_decref(layout_json);
	if (have_layout)
		proto_layout_fini(&layout);
	if (have_model)
		proto_model_fini(&model);
	if (p != NULL)
		trk__publisher_free(p);
}
