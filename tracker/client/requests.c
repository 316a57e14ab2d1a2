/* The typed requests: one function per endpoint of tracker/API.md, each
 * building its path or JSON body and sending it with trk_client_request. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tracker/client/client.h"

/* Posts obj (a reference stolen). */
static int post_new(struct trk_client *c, const char *path, json_t *obj,
		    trk_client_cb cb, void *arg)
{
	int rc;

	if (obj == NULL)
		return -ENOMEM;
	rc = trk_client_post_json(c, path, obj, cb, arg);
	json_decref(obj);
	return rc;
}

static json_t *hexj(const uint8_t *b, size_t n)
{
	char *s = malloc(2 * n + 1);
	json_t *j;

	if (s == NULL)
		return NULL;
	sodium_bin2hex(s, 2 * n + 1, b, n);
	j = json_string(s);
	free(s);
	return j;
}

static json_t *u64s(uint64_t v)
{
	char b[24];
	snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
	return json_string(b);
}

/* body with the client's site said ("site"), when it names one; NULL (body
 * freed) when out of memory. */
static json_t *with_site(const struct trk_client *c, json_t *body)
{
	const char *site = trk_client_site(c);

	if (body != NULL && site[0] != 0 &&
	    json_object_set_new(body, "site", json_string(site)) != 0) {
		json_decref(body);
		body = NULL;
	}
	return body;
}

static json_t *rank_addr(const struct trk_rank_addr *a)
{
	return json_pack("{s:I,s:s,s:s,s:s}", "rank", (json_int_t)a->rank, "host",
			 a->host, "provider", a->provider, "fabric_addr",
			 a->fabric_addr);
}

int trk_client_register_publisher(struct trk_client *c, json_t *model,
				  json_t *layout,
				  const struct trk_rank_addr *ranks,
				  size_t nranks, uint64_t every_ms, trk_client_cb cb, void *arg)
{
	json_t *arr = json_array(), *body;

	for (size_t i = 0; arr != NULL && i < nranks; i++)
		if (json_array_append_new(arr, rank_addr(&ranks[i])) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	if (arr == NULL)
		return -ENOMEM;
	body = json_pack("{s:O,s:O,s:o}", "model", model, "layout", layout, "ranks", arr);
	if (body != NULL && every_ms != 0 &&
	    json_object_set_new(body, "every_ms", json_integer((json_int_t)every_ms)) != 0) {
		json_decref(body);
		body = NULL;
	}
	return post_new(c, TRK_API "/publishers", with_site(c, body), cb, arg);
}

/* A registration sent by layout digest, with its full body kept for a
 * tracker that does not hold that layout. */
struct reg_retry {
	struct trk_client *c;
	json_t *full; /* the body with the layout itself */
	trk_client_cb cb;
	void *arg;
};

static void reg_retry_free(void *arg)
{
	struct reg_retry *rr = arg;

	json_decref(rr->full);
	free(rr);
}

/* A registration sent by digest came back: a tracker that holds no such
 * layout (restarted, or the layout's last rank went) gets it in full, once. */
static void on_reg_answer(const struct trk_answer *a, void *arg)
{
	struct reg_retry *rr = arg;
	struct trk_client *c = rr->c;
	trk_client_cb cb = rr->cb;
	void *cb_arg = rr->arg;
	json_t *full = rr->full;
	/* POST /nodes is answered 404 only for a layout_digest it does not
	 * hold (API.md). */
	bool resend = a->status == 404;

	free(rr);
	if (!resend || trk_client_post_json(c, TRK_API "/nodes", full, cb, cb_arg) != 0)
		cb(a, cb_arg);
	json_decref(full);
}

int trk_client_register_node(struct trk_client *c, const struct trk_node_reg *r,
			     trk_client_cb cb, void *arg)
{
	json_t *o = json_pack("{s:s,s:I,s:s,s:s,s:s,s:o}", "replica", r->replica, "rank",
			      (json_int_t)r->addr.rank, "host", r->addr.host, "provider",
			      r->addr.provider, "fabric_addr", r->addr.fabric_addr,
			      "model_digest", hexj(r->model_digest, PROTO_HASH_BYTES));
	struct reg_retry *rr;
	json_t *full;
	int rc;

	if (o != NULL && r->layout_name != NULL &&
	    json_object_set_new(o, "layout_name", json_string(r->layout_name)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->statement_key != NULL &&
	    json_object_set_new(o, "statement_key", hexj(r->statement_key, TRK_STMT_PK_BYTES)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if ((o = with_site(c, o)) == NULL)
		return -ENOMEM;
	if (r->layout_digest == NULL) {
		if (json_object_set(o, "layout", r->layout) != 0) {
			json_decref(o);
			return -ENOMEM;
		}
		return post_new(c, TRK_API "/nodes", o, cb, arg);
	}
	if (json_object_set_new(o, "layout_digest", hexj(r->layout_digest, PROTO_HASH_BYTES)) != 0 ||
	    (full = json_copy(o)) == NULL) {
		json_decref(o);
		return -ENOMEM;
	}
	rr = calloc(1, sizeof(*rr));
	if (rr == NULL || json_object_set(full, "layout", r->layout) != 0) {
		free(rr);
		json_decref(full);
		json_decref(o);
		return -ENOMEM;
	}
	*rr = (struct reg_retry){.c = c, .full = full, .cb = cb, .arg = arg};
	rc = trk__client_post_owned(c, TRK_API "/nodes", o, on_reg_answer, rr, reg_retry_free);
	json_decref(o);
	if (rc != 0)
		reg_retry_free(rr);
	return rc;
}

int trk_client_heartbeat(struct trk_client *c, const char *id, trk_client_cb cb,
			 void *arg)
{
	return post_new(c, TRK_API "/heartbeat", json_pack("{s:s}", "id", id), cb, arg);
}

static json_t *pins_json(const struct trk_pin_count *pins, size_t n)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr != NULL && i < PROTO_MIN(n, TRK_PIN_VERSIONS_MAX); i++)
		if (json_array_append_new(arr, json_pack("{s:I,s:I,s:I}", "version",
							 (json_int_t)pins[i].version, "pins",
							 (json_int_t)pins[i].pins, "requests",
							 (json_int_t)pins[i].requests)) != 0) {
			json_decref(arr);
			return NULL;
		}
	return arr;
}

int trk_client_heartbeat_pins(struct trk_client *c, const char *id,
			      const struct trk_pin_count *pins, size_t n, trk_client_cb cb,
			      void *arg)
{
	return post_new(c, TRK_API "/heartbeat",
			json_pack("{s:s,s:o}", "id", id, "pins", pins_json(pins, n)), cb, arg);
}

int trk_client_heartbeat_host(struct trk_client *c, const struct trk_hb_node *nodes, size_t n,
			      trk_client_cb cb, void *arg)
{
	json_t *o, *arr;

	if (n == 0 || n > TRK_HOST_HEARTBEAT_MAX)
		return -EINVAL;
	arr = json_array();
	for (size_t i = 0; arr != NULL && i < n; i++) {
		const char *ses = trk_client_session(c, nodes[i].id);
		json_t *e = json_pack("{s:s,s:o}", "id", nodes[i].id, "pins",
				      pins_json(nodes[i].pins, nodes[i].npins));
		if (e != NULL && ses != NULL)
			json_object_set_new(e, "session", json_string(ses));
		if (e == NULL || json_array_append_new(arr, e) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	o = arr != NULL ? json_pack("{s:o}", "nodes", arr) : NULL;
	return post_new(c, TRK_API "/heartbeat", o, cb, arg);
}

int trk_client_publish(struct trk_client *c, const uint8_t *manifest, size_t len,
		       trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "POST", TRK_API "/versions",
				  "application/octet-stream", manifest, len, 0, cb, arg);
}

int trk_client_post_addendum(struct trk_client *c, const uint8_t *addendum, size_t len,
			     trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "POST", TRK_API "/addenda", "application/octet-stream",
				  addendum, len, 0, cb, arg);
}

/* GET TRK_API what?version=V&layout=HEX. */
static int get_version_layout(struct trk_client *c, const char *what, uint64_t version,
			      const uint8_t layout[PROTO_HASH_BYTES], trk_client_cb cb, void *arg)
{
	char path[200], hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "%s?version=%llu&layout=%s", what,
		 (unsigned long long)version, hex);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

static int get_addendum(struct trk_client *c, uint64_t version, const uint8_t layout[PROTO_HASH_BYTES],
			uint32_t wait_ms, bool copy, trk_client_cb cb, void *arg)
{
	char path[280], hex[2 * PROTO_HASH_BYTES + 1];

	if (wait_ms == 0 && !copy)
		return get_version_layout(c, "/addenda", version, layout, cb, arg);
	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "/addenda?version=%llu&layout=%s&wait_ms=%u%s",
		 (unsigned long long)version, hex, wait_ms, copy ? "&copy=1" : "");
	/* A long-poll: on a connection of its own (its timeout says so). */
	return trk_client_request(c, "GET", path, NULL, NULL, 0, trk__client_timeout(c) + wait_ms, cb, arg);
}

int trk_client_get_addendum(struct trk_client *c, uint64_t version,
			    const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms,
			    trk_client_cb cb, void *arg)
{
	return get_addendum(c, version, layout, wait_ms, false, cb, arg);
}

int trk_client_get_copy(struct trk_client *c, uint64_t version,
			const uint8_t layout[PROTO_HASH_BYTES], uint32_t wait_ms, trk_client_cb cb,
			void *arg)
{
	return get_addendum(c, version, layout, wait_ms, true, cb, arg);
}

int trk_client_leave(struct trk_client *c, const char *id, trk_client_cb cb, void *arg)
{
	return post_new(c, TRK_API "/nodes/leave", json_pack("{s:s}", "id", id), cb, arg);
}

int trk_client_watch(struct trk_client *c, uint64_t after, uint32_t wait_ms,
		     trk_client_cb cb, void *arg)
{
	char path[128];

	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	snprintf(path, sizeof(path), TRK_API "/versions?after=%llu&wait_ms=%u",
		 (unsigned long long)after, wait_ms);
	return trk_client_request(c, "GET", path, NULL, NULL, 0,
				  trk__client_timeout(c) + wait_ms, cb, arg);
}

int trk_client_watch_layouts(struct trk_client *c, uint64_t after, uint64_t layouts_rev,
			     uint32_t wait_ms, trk_client_cb cb, void *arg)
{
	char path[160];

	wait_ms = wait_ms > TRK_WAIT_MAX_MS ? TRK_WAIT_MAX_MS : wait_ms;
	snprintf(path, sizeof(path), TRK_API "/versions?after=%llu&wait_ms=%u&layouts_rev=%llu",
		 (unsigned long long)after, wait_ms, (unsigned long long)layouts_rev);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, trk__client_timeout(c) + wait_ms, cb, arg);
}

int trk_client_get_manifest(struct trk_client *c, uint64_t version,
			    trk_client_cb cb, void *arg)
{
	char path[128];

	snprintf(path, sizeof(path), TRK_API "/versions/%llu/manifest",
		 (unsigned long long)version);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

int trk_client_report_state(struct trk_client *c,
			    const struct trk_state_report *r, trk_client_cb cb,
			    void *arg)
{
	json_t *o = json_pack("{s:s,s:I,s:s,s:I,s:I,s:I,s:I,s:I,s:I}", "id", r->id, "version",
			      (json_int_t)r->version, "state", trk_state_name(r->state),
			      "bytes_done", (json_int_t)r->bytes_done, "bytes_total",
			      (json_int_t)r->bytes_total, "bytes_from_trainer",
			      (json_int_t)r->bytes_from_trainer, "bytes_from_peers",
			      (json_int_t)r->bytes_from_peers, "duplicate_bytes",
			      (json_int_t)r->duplicate_bytes, "refetched_bytes",
			      (json_int_t)r->refetched_bytes);

	if (o != NULL && r->bytes_from_other_sites != 0 &&
	    json_object_set_new(o, "bytes_from_other_sites",
				json_integer((json_int_t)r->bytes_from_other_sites)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->error != NULL &&
	    json_object_set_new(o, "error", json_string(r->error)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->first_byte_ms != 0 &&
	    (json_object_set_new(o, "first_byte_ms", json_integer((json_int_t)r->first_byte_ms)) != 0 ||
	     json_object_set_new(o, "last_byte_ms", json_integer((json_int_t)r->last_byte_ms)) != 0)) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->statement != NULL &&
	    json_object_set_new(o, "statement", hexj(r->statement, TRK_STMT_SIG_BYTES)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && r->nbanned > 0) {
		json_t *ban = json_array();
		for (size_t i = 0; ban != NULL && i < r->nbanned; i++)
			if (json_array_append_new(ban, json_string(r->banned[i])) != 0) {
				json_decref(ban);
				ban = NULL;
			}
		if (ban == NULL || json_object_set_new(o, "banned", ban) != 0) {
			json_decref(o);
			o = NULL;
		}
	}
	if (o != NULL && ((r->how != NULL && json_object_set_new(o, "how", json_string(r->how)) != 0) ||
			  (r->need_anchor && json_object_set_new(o, "need_anchor", json_true()) != 0) ||
			  (r->seq != 0 && json_object_set_new(o, "seq", json_integer((json_int_t)r->seq)) != 0))) {
		json_decref(o);
		o = NULL;
	}
	return post_new(c, TRK_API "/nodes/state", o, cb, arg);
}

int trk_client_offer(struct trk_client *c, const char *id, uint64_t version,
		     const struct trk_offer *parcels, size_t n, trk_client_cb cb,
		     void *arg)
{
	return trk_client_offer_timed(c, id, version, 0, parcels, n, cb, arg);
}

int trk_client_offer_timed(struct trk_client *c, const char *id, uint64_t version,
			   uint64_t snapshot_ms, const struct trk_offer *parcels, size_t n,
			   trk_client_cb cb, void *arg)
{
	return trk_client_offer_slot(c, id, version, snapshot_ms, NULL, parcels, n, NULL, cb, arg);
}

int trk_client_offer_slot(struct trk_client *c, const char *id, uint64_t version,
			  uint64_t snapshot_ms, const struct trk_publish_report *report,
			  const struct trk_offer *parcels, size_t n, const struct trk_offer *so,
			  trk_client_cb cb, void *arg)
{
	json_t *arr = json_array(), *slot = NULL;

	if (so != NULL &&
	    (slot = json_pack("{s:o,s:o,s:I}", "addr", u64s(so->addr), "key", u64s(so->key), "len",
			      (json_int_t)so->len)) == NULL) {
		json_decref(arr);
		return -ENOMEM;
	}
	if (slot != NULL && so->partial &&
	    json_object_set_new(slot, "have", json_pack("{s:o,s:o}", "addr", u64s(so->have_addr),
							  "key", u64s(so->have_key))) != 0) {
		json_decref(slot);
		json_decref(arr);
		return -ENOMEM;
	}
	for (size_t i = 0; arr != NULL && i < n; i++) {
		const struct trk_offer *o = &parcels[i];
		if (json_array_append_new(
			    arr, json_pack("{s:o,s:I,s:I,s:o,s:o,s:I}", "layout",
					   hexj(o->layout, PROTO_HASH_BYTES), "src_rank",
					   (json_int_t)o->src_rank, "dst_rank",
					   (json_int_t)o->dst_rank, "addr", u64s(o->addr),
					   "key", u64s(o->key), "len", (json_int_t)o->len)) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	if (arr == NULL) {
		json_decref(slot);
		return -ENOMEM;
	}
	json_t *o = json_pack("{s:s,s:I,s:o}", "id", id, "version", (json_int_t)version, "parcels",
			      arr);
	if (o != NULL && slot != NULL && json_object_set(o, "slot", slot) != 0) {
		json_decref(o);
		o = NULL;
	}
	json_decref(slot);
	if (o != NULL && snapshot_ms != 0 &&
	    json_object_set_new(o, "snapshot_ms", json_integer((json_int_t)snapshot_ms)) != 0) {
		json_decref(o);
		o = NULL;
	}
	if (o != NULL && report != NULL &&
	    json_object_set_new(o, "publish", trk_publish_report_json(report)) != 0) {
		json_decref(o);
		o = NULL;
	}
	return post_new(c, TRK_API "/offers", o, cb, arg);
}

int trk_client_sources(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], uint32_t src_rank,
		       uint32_t dst_rank, trk_client_cb cb, void *arg)
{
	struct trk_parcel_key k = {.version = version, .src_rank = src_rank, .dst_rank = dst_rank};

	memcpy(k.layout, layout, PROTO_HASH_BYTES);
	return trk_client_sources_key(c, &k, cb, arg);
}

int trk_client_sources_key(struct trk_client *c, const struct trk_parcel_key *k, trk_client_cb cb,
			   void *arg)
{
	char path[320], hex[2 * PROTO_HASH_BYTES + 1];

	sodium_bin2hex(hex, sizeof(hex), k->layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path),
		 TRK_API "/sources?version=%llu&layout=%s&src_rank=%u&dst_rank=%u%s%.*s%s%s",
		 (unsigned long long)k->version, hex, k->src_rank, k->dst_rank,
		 k->members_tag[0] ? "&members_tag=" : "", TRK_MEMBERS_TAG_HEX, k->members_tag,
		 trk_client_site(c)[0] ? "&site=" : "", trk_client_site(c));
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

static int sources_batch(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			 bool shared, trk_client_cb cb, void *arg)
{
	char hex[2 * PROTO_HASH_BYTES + 1];
	json_t *arr;

	if (n == 0 || n > TRK_SOURCES_BATCH_MAX)
		return -EINVAL;
	arr = json_array();
	for (size_t i = 0; arr != NULL && i < n; i++) {
		sodium_bin2hex(hex, sizeof(hex), keys[i].layout, PROTO_HASH_BYTES);
		json_t *e = json_pack("{s:I,s:s,s:I,s:I}", "version", (json_int_t)keys[i].version,
				      "layout", hex, "src_rank", (json_int_t)keys[i].src_rank,
				      "dst_rank", (json_int_t)keys[i].dst_rank);
		if (e != NULL && keys[i].members_tag[0] != 0 &&
		    json_object_set_new(e, "members_tag", json_stringn(keys[i].members_tag,
								       strnlen(keys[i].members_tag,
									       TRK_MEMBERS_TAG_HEX))) != 0) {
			json_decref(e);
			e = NULL;
		}
		if (json_array_append_new(arr, e) != 0) {
			json_decref(arr);
			arr = NULL;
		}
	}
	json_t *body = arr != NULL ? json_pack("{s:o}", "parcels", arr) : NULL;
	if (body != NULL && shared && json_object_set_new(body, "shared_members", json_true()) != 0) {
		json_decref(body);
		body = NULL;
	}
	return post_new(c, TRK_API "/sources", with_site(c, body), cb, arg);
}

int trk_client_sources_batch(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			     trk_client_cb cb, void *arg)
{
	return sources_batch(c, keys, n, false, cb, arg);
}

int trk_client_sources_shared(struct trk_client *c, const struct trk_parcel_key *keys, size_t n,
			      trk_client_cb cb, void *arg)
{
	return sources_batch(c, keys, n, true, cb, arg);
}

int trk_client_holders(struct trk_client *c, uint64_t version,
		       const uint8_t layout[PROTO_HASH_BYTES], trk_client_cb cb, void *arg)
{
	char path[240], hex[2 * PROTO_HASH_BYTES + 1];
	const char *site = trk_client_site(c);

	sodium_bin2hex(hex, sizeof(hex), layout, PROTO_HASH_BYTES);
	snprintf(path, sizeof(path), TRK_API "/holders?version=%llu&layout=%s%s%s",
		 (unsigned long long)version, hex, site[0] ? "&site=" : "", site);
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

int trk_client_layouts(struct trk_client *c, trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "GET", TRK_API "/layouts", NULL, NULL, 0, 0, cb, arg);
}

int trk_client_replica(struct trk_client *c, const char *replica, trk_client_cb cb,
		       void *arg)
{
	char path[256];
	int n = snprintf(path, sizeof(path), TRK_API "/replicas/%s", replica);

	if (n < 0 || (size_t)n >= sizeof(path) || strpbrk(replica, "/?#%") != NULL)
		return -EINVAL;
	return trk_client_request(c, "GET", path, NULL, NULL, 0, 0, cb, arg);
}

int trk_client_status(struct trk_client *c, trk_client_cb cb, void *arg)
{
	return trk_client_request(c, "GET", TRK_API "/status", NULL, NULL, 0, 0, cb, arg);
}
