/* POST /heartbeat (a node's, a publisher's, or every rank of a host's at
 * once) and POST /nodes/leave: leases renewed, and given up. */
#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "tracker/server/internal.h"

/* POST /nodes/leave: the node says it goes (SIGTERM). It is gone at once,
 * as if its lease had run out: never a source again, its replica
 * incomplete. Its offers go with it. */
void trk__handle_leave(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	struct trk_node *n;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	n = trk__node_find(r, id);
	if (n == NULL || !n->alive) {
		trk__fail(c, 404, "node %s is unknown or already gone", id);
		return;
	}
	trk__node_gone(r, n, proto_wall_ms(), "left");
	trk__offers_clear(&n->offers);
	trk__registry_changed(r);
	trk__reply_json(c, 200, json_pack("{s:s,s:b}", "id", n->id, "left", 1));
}

/* A heartbeat's "pins" (absent: *npc 0, *given false): every entry is
 * checked before any is kept. 0, or -EINVAL with err saying why. */
static int parse_pins(json_t *o, struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX], size_t *npc,
		      bool *given, struct proto_err *err)
{
	json_t *pins = json_object_get(o, "pins"), *e;
	size_t i;

	*npc = 0;
	*given = pins != NULL && !json_is_null(pins);
	if (!*given)
		return 0;
	if (!json_is_array(pins) || json_array_size(pins) > TRK_PIN_VERSIONS_MAX)
		return proto_errf(err, -EINVAL, "pins: must be an array of at most %d entries",
				  TRK_PIN_VERSIONS_MAX);
	json_array_foreach(pins, i, e) {
		uint64_t v = 0, k = 0, q = 0;
		struct proto_err fe = {{0}};
		if (!json_is_object(e) ||
		    trk__get_u64(e, "version", true, INT64_MAX, &v, &fe) != 0 ||
		    trk__get_u64(e, "pins", true, UINT32_MAX, &k, &fe) != 0 ||
		    trk__get_u64(e, "requests", true, INT64_MAX, &q, &fe) != 0)
			return proto_errf(err, -EINVAL, "pins[%zu]: %s", i,
					  json_is_object(e) ? fe.msg : "must be an object");
		pc[(*npc)++] = (struct trk_pin_count){v, q, (uint32_t)k};
	}
	return 0;
}

/* Renews node n's lease (and keeps its pins when given); false when it is
 * unknown or its lease ran out. Sweeps notice a lease end a little late
 * (trk__registry_sweep): a heartbeat after it never revives the node. */
static bool node_renew(struct trk_registry *r, struct trk_node *n, uint64_t now,
		       const struct trk_pin_count *pc, size_t npc, bool pins)
{
	if (n != NULL && n->alive && now >= n->expires_ns)
		trk__node_gone(r, n, proto_wall_ms(), "lease expired");
	if (n == NULL || !n->alive)
		return false;
	if (pins) {
		memcpy(n->pins, pc, npc * sizeof(pc[0]));
		n->npins = npc;
		n->pins_ms = proto_wall_ms();
	}
	n->expires_ns = now + trk__registry_lease_ns(r);
	n->beat_ms = proto_wall_ms();
	return true;
}

/*
 * {"nodes":[{"id":"A/0","pins":[..],"session":"hex"},..]}: one host renews
 * the leases of all its ranks in one request. Every entry is checked (and,
 * on a keyed tracker, every live node's session) before any lease is
 * renewed; ids unknown or whose lease ran out are answered in "gone".
 */
static void host_heartbeat(struct trk_call *c, json_t *nodes)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	struct {
		struct trk_node *n;
		struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX];
		size_t npc;
		bool pins;
	} *e;
	size_t i, k = json_array_size(nodes);
	json_t *o, *gone;
	uint64_t now = proto_now_ns();

	if (!json_is_array(nodes) || k == 0 || k > TRK_HOST_HEARTBEAT_MAX) {
		trk__fail(c, 400, "nodes: must be an array of 1..%d entries", TRK_HOST_HEARTBEAT_MAX);
		return;
	}
	if ((e = calloc(k, sizeof(*e))) == NULL || (gone = json_array()) == NULL) {
		free(e);
		trk__fail(c, 500, "out of memory");
		return;
	}
	json_array_foreach(nodes, i, o) {
		const char *id = NULL, *ses = NULL;
		if (!json_is_object(o)) {
			trk__fail(c, 400, "nodes[%zu]: must be an object", i);
			goto out;
		}
		if (trk__get_str(o, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
		    trk__get_str(o, "session", false, 2 * TRK_SESSION_BYTES, &ses, &err) != 0 ||
		    parse_pins(o, e[i].pc, &e[i].npc, &e[i].pins, &err) != 0) {
			trk__fail(c, 400, "nodes[%zu]: %s", i, err.msg);
			goto out;
		}
		e[i].n = trk__node_find(r, id);
	}
	/* Each node speaks only for itself (as its own heartbeat's
	 * X-Tessera-Session header does): a live one needs its session. */
	json_array_foreach(nodes, i, o) {
		const char *ses = json_string_value(json_object_get(o, "session"));
		if (c->s->auth != NULL && e[i].n != NULL && e[i].n->alive &&
		    (ses == NULL || strlen(ses) != strlen(e[i].n->session) ||
		     sodium_memcmp(ses, e[i].n->session, strlen(ses)) != 0)) {
			c->s->auth_refused++;
			trk__fail(c, 403, "nodes[%zu]: node %s: wrong or missing session: a node "
				  "speaks only for itself", i, e[i].n->id);
			goto out;
		}
	}
	json_array_foreach(nodes, i, o)
		if (!node_renew(r, e[i].n, now, e[i].pc, e[i].npc, e[i].pins) &&
		    json_array_append(gone, json_object_get(o, "id")) != 0) {
			trk__fail(c, 500, "out of memory");
			goto out;
		}
	trk__reply_json(c, 200, json_pack("{s:I,s:O}", "lease_ms", (json_int_t)r->s->lease_ms,
					  "gone", gone));
out:
	json_decref(gone);
	free(e);
}

void trk__handle_heartbeat(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	struct trk_node *n;
	struct trk_publisher *p;
	uint64_t now = proto_now_ns();
	struct trk_pin_count pc[TRK_PIN_VERSIONS_MAX];
	size_t npc = 0;
	bool pins;

	if (json_object_get(c->json, "nodes") != NULL && json_object_get(c->json, "id") == NULL) {
		host_heartbeat(c, json_object_get(c->json, "nodes"));
		return;
	}
	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	/* A node says what serving processes pin on it. */
	if (parse_pins(c->json, pc, &npc, &pins, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	n = trk__node_find(r, id);
	p = n == NULL ? trk__publisher_find(r, id) : NULL;
	if (p != NULL && p->alive && now >= p->expires_ns) {
		p->alive = false;
		p->gone_ms = proto_wall_ms();
		trk__registry_changed(r);
		LOG_INFO("publisher %s gone (lease expired)", p->id);
	}
	if (p != NULL && p->alive)
		p->expires_ns = now + trk__registry_lease_ns(r);
	else if (!node_renew(r, n, now, pc, npc, pins)) {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	trk__reply_json(c, 200, json_pack("{s:I}", "lease_ms", (json_int_t)r->s->lease_ms));
}
