/* The canary probe (node/cli/probe.h): score what a serving process sees. */
#include "node/cli/probe.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node/client/tessera_client.h"
#include "proto/canary.h"
#include "proto/spec.h"

/* The score of a pinned version: every local tensor of the table, in its
 * order (the rank's), as proto_canary_rank() reads a block. */
static int score_pin(tessera_client *c, const struct tessera_pin *pin, uint64_t *out,
		     struct proto_err *err)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < tessera_ntensors(c); i++) {
		const struct tessera_tensor *t = tessera_tensor(c, i);
		enum proto_dtype dt;
		if (proto_dtype_parse(t->dtype, &dt) != 0)
			return proto_errf(err, EPROTO, "tensor %s: unknown dtype %s", t->name,
					  t->dtype);
		size_t es = proto_dtype_size(dt);
		uint64_t nelem = es ? t->nbytes / es : 0;
		if (t->offset > pin->size || t->nbytes > pin->size - t->offset ||
		    (t->nbytes && pin->base == NULL))
			return proto_errf(err, EPROTO, "tensor %s: outside the version's %" PRIu64
					  " bytes", t->name, pin->size);
		uint64_t cols = t->ndim ? t->shape[t->ndim - 1] : 1;
		sum += proto_canary_elems(dt, (uint32_t)i, cols, 0, nelem, pin->base + t->offset);
	}
	*out = sum;
	return 0;
}

int node_probe_read(const char *sock, const char *replica, uint32_t rank, uint64_t min_version,
		    int timeout_ms, struct node_probe *out, struct proto_err *err)
{
	char why[256];
	tessera_client *c = NULL;
	struct tessera_pin pin;
	struct node_probe r = {0};
	int rc;

	if (tessera_attach(sock, replica, rank, timeout_ms, &c, why, sizeof(why)) != 0)
		return proto_errf(err, EIO, "attaching to %s: %s", sock, why);
	if ((rc = tessera_wait_version(c, min_version ? min_version : 1, timeout_ms)) != 0) {
		proto_errf(err, -rc, "%s/%u: no version >= %" PRIu64 " active: %s", replica, rank,
			   min_version ? min_version : 1,
			   rc == -ETIMEDOUT ? "timed out" : tessera_error(c));
		goto out;
	}
	if ((rc = tessera_acquire(c, &pin)) != 0) {
		proto_errf(err, -rc, "%s/%u: acquire: %s", replica, rank, tessera_error(c));
		goto out;
	}
	r.version = pin.version;
	const struct tessera_version *vi = tessera_version_info(c, pin.version);
	if (vi != NULL)
		memcpy(r.digest, vi->digest, sizeof(r.digest));
	rc = score_pin(c, &pin, &r.score, err);
	tessera_release(c, &pin);
	if (rc == 0) {
		r.ok = -1;
		*out = r;
	}
out:
	tessera_detach(c);
	return rc;
}

int node_probe_report(struct trk_client *trk, const char *replica, uint32_t rank,
		      struct node_probe *out, struct proto_err *err)
{
	char id[TRK_ID_MAX];
	struct trk_reply tr;
	json_t *body;
	char *text;
	int rc;

	snprintf(id, sizeof(id), "%s/%u", replica, rank);
	body = json_pack("{s:s,s:I,s:I}", "id", id, "version", (json_int_t)out->version, "score",
			 (json_int_t)(int64_t)out->score);
	text = body ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (text == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	rc = trk_client_call(trk, "POST", TRK_API "/canary", NULL, text, strlen(text), &tr);
	free(text);
	if (rc == 0 && tr.status != 200)
		rc = proto_errf(err, EIO, "the tracker refused the canary of %s: %s", id, tr.error);
	else if (rc != 0)
		proto_errf(err, -rc, "reporting the canary of %s: %s", id, tr.error);
	if (rc == 0) {
		json_t *e = json_object_get(tr.json, "expected"), *ok = json_object_get(tr.json, "ok");
		out->have_expected = json_is_integer(e);
		out->expected = out->have_expected ? (uint64_t)json_integer_value(e) : 0;
		out->ok = json_is_boolean(ok) ? json_is_true(ok) : -1;
	}
	trk_reply_fini(&tr);
	return rc;
}
