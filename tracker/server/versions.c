/* The version log's endpoints: POST /versions (publish), GET /versions (the
 * list, or a watch held until a version lands), GET /versions/V/manifest. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

void trk__handle_versions(struct trk_call *c)
{
	struct trk_versions *vs = c->s->vs;
	uint64_t after = 0, wait_ms = 0, rev = 0, now_rev = trk__watches_layouts_rev(c->s->w);
	struct proto_err err = {{0}};
	bool layouts = trk__query_str(c, "layouts_rev") != NULL;

	if (trk__query_u64(c, "after", false, UINT64_MAX, &after, &err) != 0 ||
	    trk__query_u64(c, "wait_ms", false, UINT64_MAX, &wait_ms, &err) != 0 ||
	    trk__query_u64(c, "layouts_rev", false, UINT64_MAX, &rev, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	wait_ms = PROTO_MIN(wait_ms, TRK_WAIT_MAX_MS);
	if (trk__versions_latest(vs) > after || wait_ms == 0 || (layouts && rev != now_rev)) {
		trk__reply_json(c, 200, trk__versions_list_json(c->s, after, now_rev));
		return;
	}
	trk__watch_versions(c, after, wait_ms, layouts);
}

void trk__handle_manifest(struct trk_call *c, const char *num)
{
	struct trk_versions *vs = c->s->vs;
	struct proto_err err = {{0}};
	struct trk_version *r;
	uint64_t v;
	uint8_t *buf;
	size_t len;

	if (proto_parse_u64(num, 1, UINT64_MAX, &v) != 0) {
		trk__fail(c, 400, "version '%s' is not a positive integer", num);
		return;
	}
	r = trk__versions_find(vs, v);
	if (r == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)v);
		return;
	}
	if (r->raw != NULL) {
		trk__reply_raw(c, 200, "application/octet-stream", r->raw, r->rawlen);
		return;
	}
	if (trk__versions_read_raw(vs, r, &buf, &len, &err) != 0) {
		LOG_ERR("%s", err.msg);
		trk__fail(c, 500, "%s", err.msg);
		return;
	}
	trk__reply_raw(c, 200, "application/octet-stream", buf, len);
	free(buf);
}

void trk__handle_publish(struct trk_call *c)
{
	struct trk_versions *vs = c->s->vs;
	struct proto_manifest *m = NULL;
	struct proto_err err = {{0}};
	const struct trk_version *old, *latest;
	uint8_t pk[PROTO_PK_BYTES], model[PROTO_HASH_BYTES], tl[PROTO_HASH_BYTES];
	char hex[2 * PROTO_HASH_BYTES + 1];
	int code;

	if (trk__versions_pk(vs) != NULL) {
		memcpy(pk, trk__versions_pk(vs), sizeof(pk));
	} else if (proto_manifest_peek_signer(c->body, c->len, pk) != 0) {
		trk__fail(c, 400, "manifest: too short to hold a signer key");
		return;
	}
	m = calloc(1, sizeof(*m));
	if (m == NULL) {
		trk__fail(c, 500, "out of memory");
		return;
	}
	if (proto_manifest_decode(c->body, c->len, pk, m, &err) != 0) {
		free(m);
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	old = trk__versions_find(vs, m->version);
	if (old != NULL) {
		if (memcmp(old->digest, m->digest, PROTO_HASH_BYTES) == 0) {
			trk__reply_json(c, 200, json_pack("{s:I,s:o}", "version",
							  (json_int_t)m->version,
							  "digest",
							  trk__json_hex(m->digest,
									PROTO_HASH_BYTES)));
		} else {
			trk__hex(old->digest, PROTO_HASH_BYTES, hex);
			trk__fail(c, 409,
				  "version %llu already exists with another digest (%s)",
				  (unsigned long long)m->version, hex);
		}
		goto out;
	}
	if ((code = trk__versions_fits(vs, m, &err)) != 0) {
		trk__fail(c, code, "%s", err.msg);
		goto out;
	}
	latest = trk__versions_find(vs, trk__versions_latest(vs));
	if (latest != NULL && memcmp(latest->model_digest, m->model_digest, PROTO_HASH_BYTES) != 0) {
		trk__fail(c, 409, "model digest differs from version %llu's",
			  (unsigned long long)latest->version);
		goto out;
	}
	if (trk__registry_model(c->s->reg, model, tl)) {
		if (memcmp(model, m->model_digest, PROTO_HASH_BYTES) != 0) {
			trk__fail(c, 409, "model digest differs from the registered publishers'");
			goto out;
		}
		if (memcmp(tl, m->src_layout_digest, PROTO_HASH_BYTES) != 0) {
			trk__fail(c, 409,
				  "trainer layout digest differs from the registered publishers'");
			goto out;
		}
	}
	if ((code = trk__versions_append(vs, m, c->body, c->len, &err)) != 0) {
		/* -EPERM: another tracker of the store leads now; -EEXIST: the
		 * store holds a version this tracker did not write (a write that
		 * timed out but landed, or one by hand). Either way its memory
		 * is not the store's: it stops, and the tracker that leads next
		 * loads the store. */
		trk__fail(c, code == -EEXIST ? 409 : code == -EPERM ? 503 : 500, "%s", err.msg);
		if (code == -EEXIST || code == -EPERM)
			trk__lead_stop(c->s, code == -EPERM ? "a write was refused: another tracker "
							      "leads the store"
							    : "the store holds a version I did not write");
		goto out;
	}
	latest = trk__versions_find(vs, m->version);
	m = NULL; /* the log's now */
	/* Its swarms' members are chosen afresh: who kept up with the last
	 * version (TESSERA_SWARM_SLOW; sources.c). */
	trk__registry_members_changed(c->s->reg);
	trk__reply_json(c, 201, json_pack("{s:I,s:o}", "version",
					  (json_int_t)latest->version, "digest",
					  trk__json_hex(latest->digest, PROTO_HASH_BYTES)));
	trk__registry_changed(c->s->reg);
	trk__watches_version_landed(c->s->w);
out:
	if (m != NULL) {
		proto_manifest_fini(m);
		free(m);
	}
}
