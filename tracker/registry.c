/* Soft state: model, publishers, replicas and their nodes, leases, offers,
 * per-version rank states, and what derives from them. */
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/log.h"
#include "proto/params.h"
#include "proto/spec.h"
#include "tracker/internal.h"

#define NODE_VERSIONS 8       /* per-version states a node keeps */
#define OFFER_VERSIONS 16     /* versions a holder may offer at once */
#define OFFER_PARCELS_MAX 65536
#define ACTIVATIONS_MAX 1024  /* activation log entries kept */
#define PRUNE_LEASES 50       /* gone entries are forgotten after this many leases */
#define FABRIC_ADDR_MAX 1024  /* bytes */
#define HOST_MAX 255
#define PROVIDER_MAX 63
#define ERROR_MAX 255

/* A serving layout some replica uses, shared by its replicas. */
struct slayout {
	uint8_t digest[PROTO_HASH_BYTES];
	struct proto_layout l;
	json_t *json; /* explicit form */
	unsigned refs;
	struct slayout *next;
};

struct offer_set {
	uint64_t version;
	size_t n;
	struct trk_offer *o;
};

struct offers {
	struct offer_set sets[OFFER_VERSIONS];
	size_t n;
};

struct prank {
	uint32_t rank;
	char *host, *provider, *addr;
};

struct publisher {
	char id[32];
	bool alive;
	uint64_t expires_ns, registered_ms, gone_ms;
	struct prank *ranks;
	size_t nranks;
	struct offers offers;
	struct publisher *next;
};

struct nver {
	uint64_t version;
	enum trk_rank_state state;
	uint64_t done, total, from_trainer, from_peers;
};

struct replica;

struct node {
	char id[TRK_ID_MAX];
	struct replica *rep;
	uint32_t rank;
	char *host, *provider, *addr;
	struct slayout *layout;
	bool alive;
	uint64_t expires_ns, registered_ms, gone_ms, report_ms;
	uint64_t active; /* last version this rank reported active */
	struct nver vers[NODE_VERSIONS];
	size_t nvers;
	int last; /* index of the last report in vers, -1 none */
	char error[ERROR_MAX + 1];
	struct offers offers;
};

struct replica {
	char name[TRK_REPLICA_MAX + 1];
	struct slayout *layout; /* holds a reference */
	uint32_t nranks;
	struct node **ranks; /* nranks slots, NULL = never registered */
	uint64_t active;     /* the version all ranks last agreed active on */
	struct replica *next;
};

struct activation {
	char replica[TRK_REPLICA_MAX + 1];
	uint64_t version, wall_ms;
};

struct trk_registry {
	struct trk_server *s;
	bool have_model;
	struct proto_model model;
	json_t *model_json;
	struct proto_layout tlayout;
	json_t *tlayout_json;
	struct slayout *layouts;
	struct publisher *pubs;
	struct replica *reps; /* sorted by name */
	struct activation act[ACTIVATIONS_MAX];
	size_t act_n, act_next;
	uint64_t act_total;
	uint64_t bytes_from_trainer, bytes_from_peers;
};

static const char *state_names[TRK_STATE_COUNT] = {
	[TRK_STATE_FETCHING] = "fetching",
	[TRK_STATE_VERIFIED] = "verified",
	[TRK_STATE_ACTIVE] = "active",
	[TRK_STATE_FAILED] = "failed",
};

const char *trk_state_name(enum trk_rank_state s)
{
	return (unsigned)s < TRK_STATE_COUNT ? state_names[s] : "?";
}

int trk_state_parse(const char *s, enum trk_rank_state *out)
{
	for (int i = 0; i < TRK_STATE_COUNT; i++)
		if (strcmp(s, state_names[i]) == 0) {
			*out = (enum trk_rank_state)i;
			return 0;
		}
	return -EINVAL;
}

/* ---- lifetime helpers ---------------------------------------------------- */

static void offers_clear(struct offers *o)
{
	for (size_t i = 0; i < o->n; i++)
		free(o->sets[i].o);
	o->n = 0;
}

static void slayout_put(struct trk_registry *r, struct slayout *sl)
{
	if (sl == NULL || --sl->refs > 0)
		return;
	for (struct slayout **pp = &r->layouts; *pp; pp = &(*pp)->next)
		if (*pp == sl) {
			*pp = sl->next;
			break;
		}
	proto_layout_fini(&sl->l);
	json_decref(sl->json);
	free(sl);
}

static void node_free(struct node *n)
{
	if (n == NULL)
		return;
	free(n->host);
	free(n->provider);
	free(n->addr);
	offers_clear(&n->offers);
	free(n);
}

static void replica_free(struct trk_registry *r, struct replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		node_free(rep->ranks[i]);
	free(rep->ranks);
	slayout_put(r, rep->layout);
	free(rep);
}

static void publisher_free(struct publisher *p)
{
	for (size_t i = 0; i < p->nranks; i++) {
		free(p->ranks[i].host);
		free(p->ranks[i].provider);
		free(p->ranks[i].addr);
	}
	free(p->ranks);
	offers_clear(&p->offers);
	free(p);
}

static void drop_replicas(struct trk_registry *r)
{
	while (r->reps != NULL) {
		struct replica *rep = r->reps;
		r->reps = rep->next;
		replica_free(r, rep);
	}
}

static void drop_model(struct trk_registry *r)
{
	drop_replicas(r);
	if (r->have_model) {
		proto_layout_fini(&r->tlayout);
		proto_model_fini(&r->model);
	}
	json_decref(r->model_json);
	json_decref(r->tlayout_json);
	r->model_json = r->tlayout_json = NULL;
	r->have_model = false;
}

int trk__registry_new(struct trk_server *s, struct trk_registry **out)
{
	struct trk_registry *r = calloc(1, sizeof(*r));

	*out = r;
	if (r == NULL)
		return -ENOMEM;
	r->s = s;
	return 0;
}

void trk__registry_free(struct trk_registry *r)
{
	if (r == NULL)
		return;
	drop_model(r);
	while (r->pubs != NULL) {
		struct publisher *p = r->pubs;
		r->pubs = p->next;
		publisher_free(p);
	}
	free(r);
}

bool trk__registry_model(const struct trk_registry *r, uint8_t *model_digest,
			 uint8_t *layout_digest)
{
	if (!r->have_model)
		return false;
	memcpy(model_digest, r->model.digest, PROTO_HASH_BYTES);
	memcpy(layout_digest, r->tlayout.digest, PROTO_HASH_BYTES);
	return true;
}

static uint64_t lease_ns(const struct trk_registry *r)
{
	return r->s->lease_ms * 1000000ull;
}

/* ---- leases -------------------------------------------------------------- */

static void node_gone(struct node *n, uint64_t now_ms, const char *why)
{
	n->alive = false;
	n->gone_ms = now_ms;
	LOG_INFO("node %s gone (%s)", n->id, why);
}

void trk__registry_sweep(struct trk_registry *r)
{
	uint64_t now = proto_now_ns(), now_ms = proto_wall_ms();
	uint64_t prune_ms = PRUNE_LEASES * r->s->lease_ms;

	for (struct publisher **pp = &r->pubs; *pp;) {
		struct publisher *p = *pp;
		if (p->alive && now >= p->expires_ns) {
			p->alive = false;
			p->gone_ms = now_ms;
			LOG_INFO("publisher %s gone (lease expired)", p->id);
		}
		if (!p->alive && now_ms > p->gone_ms + prune_ms) {
			*pp = p->next;
			publisher_free(p);
			continue;
		}
		pp = &p->next;
	}
	for (struct replica **rp = &r->reps; *rp;) {
		struct replica *rep = *rp;
		bool any = false;
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct node *n = rep->ranks[i];
			if (n == NULL)
				continue;
			if (n->alive && now >= n->expires_ns)
				node_gone(n, now_ms, "lease expired");
			if (!n->alive && now_ms > n->gone_ms + prune_ms) {
				node_free(n);
				rep->ranks[i] = NULL;
				continue;
			}
			any = true;
		}
		if (!any) {
			*rp = rep->next;
			replica_free(r, rep);
			continue;
		}
		rp = &rep->next;
	}
}

/* ---- lookups and derived state -------------------------------------------- */

static bool valid_replica_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > TRK_REPLICA_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		      (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.'))
			return false;
	}
	return true;
}

static struct replica *find_replica(struct trk_registry *r, const char *name)
{
	for (struct replica *rep = r->reps; rep; rep = rep->next)
		if (strcmp(rep->name, name) == 0)
			return rep;
	return NULL;
}

/* "A/0" -> the node, alive or not; NULL if there is none. */
static struct node *find_node(struct trk_registry *r, const char *id)
{
	const char *slash = strrchr(id, '/');
	char name[TRK_REPLICA_MAX + 1];
	struct replica *rep;
	uint64_t rank;

	if (slash == NULL || (size_t)(slash - id) > TRK_REPLICA_MAX)
		return NULL;
	memcpy(name, id, (size_t)(slash - id));
	name[slash - id] = 0;
	if (proto_parse_u64(slash + 1, 0, PROTO_MAX_RANKS - 1, &rank) != 0)
		return NULL;
	rep = find_replica(r, name);
	if (rep == NULL || rank >= rep->nranks)
		return NULL;
	return rep->ranks[rank];
}

static struct publisher *find_publisher(struct trk_registry *r, const char *id)
{
	for (struct publisher *p = r->pubs; p; p = p->next)
		if (strcmp(p->id, id) == 0)
			return p;
	return NULL;
}

static struct nver *node_ver(struct node *n, uint64_t v)
{
	for (size_t i = 0; i < n->nvers; i++)
		if (n->vers[i].version == v)
			return &n->vers[i];
	return NULL;
}

/* The node holds v whole: it reported v verified or active. */
static bool node_holds(struct node *n, uint64_t v)
{
	struct nver *e;

	if (n == NULL || !n->alive)
		return false;
	e = node_ver(n, v);
	return e != NULL &&
	       (e->state == TRK_STATE_VERIFIED || e->state == TRK_STATE_ACTIVE);
}

static bool replica_alive(const struct replica *rep)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (rep->ranks[i] != NULL && rep->ranks[i]->alive)
			return true;
	return false;
}

/* Complete at v: every rank alive and holding v (model-parallel
 * consistency: a replica is only as complete as its least rank). */
static bool replica_complete(const struct replica *rep, uint64_t v)
{
	for (uint32_t i = 0; i < rep->nranks; i++)
		if (!node_holds(rep->ranks[i], v))
			return false;
	return rep->nranks > 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The versions a replica is complete at, ascending, into out[NODE_VERSIONS];
 * returns how many. Rank 0's versions are the candidates. */
static size_t replica_complete_list(const struct replica *rep, uint64_t *out)
{
	struct node *n0 = rep->nranks > 0 ? rep->ranks[0] : NULL;
	size_t k = 0;

	if (n0 == NULL)
		return 0;
	for (size_t i = 0; i < n0->nvers; i++)
		if (replica_complete(rep, n0->vers[i].version))
			out[k++] = n0->vers[i].version;
	qsort(out, k, sizeof(*out), cmp_u64);
	return k;
}

static uint64_t replica_max_complete(const struct replica *rep)
{
	uint64_t list[NODE_VERSIONS];
	size_t k = replica_complete_list(rep, list);
	return k > 0 ? list[k - 1] : 0;
}

uint64_t trk__registry_min_complete(struct trk_registry *r, bool *any)
{
	uint64_t min = UINT64_MAX;

	*any = false;
	for (struct replica *rep = r->reps; rep; rep = rep->next) {
		if (!replica_alive(rep))
			continue;
		*any = true;
		min = PROTO_MIN(min, replica_max_complete(rep));
	}
	return *any ? min : 0;
}

/* ---- JSON helpers ---------------------------------------------------------- */

static json_t *u64_array(const uint64_t *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; a != NULL && i < n; i++)
		if (json_array_append_new(a, trk__jint(v[i])) != 0) {
			json_decref(a);
			return NULL;
		}
	return a;
}

static json_t *rank_json(const struct replica *rep, uint32_t rank, bool full)
{
	struct node *n = rep->ranks[rank];
	json_t *o = json_object();
	const struct nver *e;
	int bad = o == NULL;

	if (bad)
		return NULL;
	bad |= trk__set(o, "rank", json_integer(rank));
	if (n == NULL) {
		bad |= trk__set(o, "id", json_null());
		bad |= trk__set(o, "alive", json_false());
		bad |= trk__set(o, "state", json_string("absent"));
		bad |= trk__set(o, "version", json_integer(0));
		bad |= trk__set(o, "bytes_done", json_integer(0));
		bad |= trk__set(o, "bytes_total", json_integer(0));
		goto out;
	}
	e = n->last >= 0 ? &n->vers[n->last] : NULL;
	bad |= trk__set(o, "id", json_string(n->id));
	bad |= trk__set(o, "alive", json_boolean(n->alive));
	bad |= trk__set(o, "state", json_string(e ? trk_state_name(e->state) :
						    "registered"));
	bad |= trk__set(o, "version", trk__jint(e ? e->version : 0));
	bad |= trk__set(o, "bytes_done", trk__jint(e ? e->done : 0));
	bad |= trk__set(o, "bytes_total", trk__jint(e ? e->total : 0));
	bad |= trk__set(o, "active", trk__jint(n->active));
	if (full) {
		bad |= trk__set(o, "host", json_string(n->host));
		bad |= trk__set(o, "provider", json_string(n->provider));
		bad |= trk__set(o, "registered_ms", trk__jint(n->registered_ms));
		bad |= trk__set(o, "report_ms", trk__jint(n->report_ms));
		if (!n->alive)
			bad |= trk__set(o, "gone_ms", trk__jint(n->gone_ms));
		if (n->error[0])
			bad |= trk__set(o, "error", json_string(n->error));
		if (e != NULL) {
			bad |= trk__set(o, "bytes_from_trainer", trk__jint(e->from_trainer));
			bad |= trk__set(o, "bytes_from_peers", trk__jint(e->from_peers));
		}
	}
out:
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *replica_json(const struct replica *rep, bool full)
{
	json_t *o = json_object(), *ranks = json_array();
	uint64_t list[NODE_VERSIONS];
	size_t k = replica_complete_list(rep, list);
	int bad = o == NULL || ranks == NULL;

	for (uint32_t i = 0; !bad && i < rep->nranks; i++)
		bad |= json_array_append_new(ranks, rank_json(rep, i, full)) != 0;
	if (!bad) {
		bad |= trk__set(o, "replica", json_string(rep->name));
		bad |= trk__set(o, "layout_digest",
				trk__json_hex(rep->layout->digest, PROTO_HASH_BYTES));
		bad |= trk__set(o, "nranks", json_integer(rep->nranks));
		bad |= trk__set(o, "alive", json_boolean(replica_alive(rep)));
		bad |= trk__set(o, "ranks", ranks);
		ranks = NULL;
		bad |= trk__set(o, "complete", u64_array(list, k));
		bad |= trk__set(o, "active", trk__jint(rep->active));
	}
	json_decref(ranks);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* ---- POST /publishers ------------------------------------------------------- */

static int parse_rank_addr(json_t *o, const char *what, uint32_t nranks,
			   struct prank *out, struct proto_err *err)
{
	const char *host = NULL, *provider = NULL;
	uint64_t rank = 0;
	int rc;

	if (!json_is_object(o))
		return proto_errf(err, EINVAL, "%s: must be an object", what);
	if ((rc = trk__get_u64(o, "rank", true, UINT32_MAX, &rank, err)) != 0 ||
	    (rc = trk__get_str(o, "host", true, HOST_MAX, &host, err)) != 0 ||
	    (rc = trk__get_str(o, "provider", true, PROVIDER_MAX, &provider, err)) != 0 ||
	    (rc = trk__get_hexvar(o, "fabric_addr", FABRIC_ADDR_MAX, &out->addr,
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

static bool publisher_has_rank(const struct publisher *p, uint32_t rank)
{
	for (size_t i = 0; i < p->nranks; i++)
		if (p->ranks[i].rank == rank)
			return true;
	return false;
}

void trk__handle_publishers(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	struct proto_model model;
	struct proto_layout layout;
	struct publisher *p = NULL;
	json_t *jm = json_object_get(c->json, "model");
	json_t *jl = json_object_get(c->json, "layout");
	json_t *jr = json_object_get(c->json, "ranks");
	json_t *model_json = NULL, *layout_json = NULL;
	bool have_model = false, have_layout = false, same_model, same_layout;
	struct trk_version *latest;
	uint8_t rid[8];

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
		trk__fail(c, 409, "model digest differs from the published versions' model");
		goto out;
	}
	same_model = r->have_model &&
		     memcmp(r->model.digest, model.digest, PROTO_HASH_BYTES) == 0;
	same_layout = same_model &&
		      memcmp(r->tlayout.digest, layout.digest, PROTO_HASH_BYTES) == 0;
	if (r->have_model && !same_layout) {
		for (struct publisher *q = r->pubs; q; q = q->next) {
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
		drop_model(r);
		r->model = model;
		r->model_json = model_json;
		model_json = NULL;
		have_model = false;
		r->have_model = true;
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
	for (struct publisher *q = r->pubs; q; q = q->next) {
		bool overlap = false;
		for (size_t i = 0; q->alive && i < p->nranks; i++)
			overlap |= publisher_has_rank(q, p->ranks[i].rank);
		if (overlap) {
			q->alive = false;
			q->gone_ms = proto_wall_ms();
			LOG_INFO("publisher %s replaced by a new registration", q->id);
		}
	}
	randombytes_buf(rid, sizeof(rid));
	memcpy(p->id, "pub-", 4);
	trk__hex(rid, sizeof(rid), p->id + 4);
	p->alive = true;
	p->registered_ms = proto_wall_ms();
	p->expires_ns = proto_now_ns() + lease_ns(r);
	p->next = r->pubs;
	r->pubs = p;
	LOG_INFO("publisher %s registered with %zu ranks", p->id, p->nranks);
	trk__reply_json(c, 200,
			json_pack("{s:s,s:I,s:o,s:o}", "publisher_id", p->id,
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
		publisher_free(p);
}

/* ---- POST /nodes -------------------------------------------------------------- */

static struct slayout *find_slayout(struct trk_registry *r, const uint8_t *digest)
{
	for (struct slayout *sl = r->layouts; sl; sl = sl->next)
		if (memcmp(sl->digest, digest, PROTO_HASH_BYTES) == 0)
			return sl;
	return NULL;
}

/* Inserts rep keeping the list sorted by name. */
static void insert_replica(struct trk_registry *r, struct replica *rep)
{
	struct replica **pp = &r->reps;
	while (*pp != NULL && strcmp((*pp)->name, rep->name) < 0)
		pp = &(*pp)->next;
	rep->next = *pp;
	*pp = rep;
}

void trk__handle_nodes(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *replica = NULL, *host = NULL, *provider = NULL;
	uint64_t rank = 0;
	uint8_t md[PROTO_HASH_BYTES];
	char *addr = NULL, hex[2 * PROTO_HASH_BYTES + 1];
	json_t *jl = json_object_get(c->json, "layout");
	struct proto_layout l;
	bool have_l = false;
	struct slayout *sl = NULL;
	struct replica *rep, *new_rep = NULL;
	struct node *n = NULL, **new_ranks = NULL;

	memset(&l, 0, sizeof(l));
	if (trk__get_str(c->json, "replica", true, TRK_REPLICA_MAX, &replica, &err) != 0 ||
	    trk__get_u64(c->json, "rank", true, PROTO_MAX_RANKS - 1, &rank, &err) != 0 ||
	    trk__get_str(c->json, "host", true, HOST_MAX, &host, &err) != 0 ||
	    trk__get_str(c->json, "provider", true, PROVIDER_MAX, &provider, &err) != 0 ||
	    trk__get_hexvar(c->json, "fabric_addr", FABRIC_ADDR_MAX, &addr, &err) != 0 ||
	    trk__get_hex(c->json, "model_digest", md, sizeof(md), &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (!valid_replica_name(replica)) {
		trk__fail(c, 400, "replica: want 1..%d of [A-Za-z0-9._-]", TRK_REPLICA_MAX);
		goto out;
	}
	if (!json_is_object(jl)) {
		trk__fail(c, 400, "layout: missing or not an object");
		goto out;
	}
	if (!r->have_model) {
		trk__fail(c, 409, "no model known yet: no publisher has registered (retry)");
		goto out;
	}
	if (memcmp(md, r->model.digest, sizeof(md)) != 0) {
		trk__hex(r->model.digest, PROTO_HASH_BYTES, hex);
		trk__fail(c, 409, "model_digest differs from the trainer's model (%s)", hex);
		goto out;
	}
	if (proto_layout_from_json(&r->model, jl, "layout", &l, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	have_l = true;
	if (proto_layout_check_complete(&r->model, &l, &err) != 0) {
		trk__fail(c, 400, "layout does not cover the model: %s", err.msg);
		goto out;
	}
	if (rank >= l.nranks) {
		trk__fail(c, 400, "rank %llu is not below the layout's %u ranks",
			  (unsigned long long)rank, l.nranks);
		goto out;
	}
	rep = find_replica(r, replica);
	if (rep != NULL && memcmp(rep->layout->digest, l.digest, PROTO_HASH_BYTES) != 0) {
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct node *o = rep->ranks[i];
			if (o == NULL || !o->alive || i == rank)
				continue;
			trk__hex(rep->layout->digest, PROTO_HASH_BYTES, hex);
			trk__fail(c, 409,
				  "replica %s rank %u registered another layout (%s)",
				  replica, i, hex);
			goto out;
		}
	}

	/* Prepare everything that can fail, then commit. */
	sl = find_slayout(r, l.digest);
	if (sl == NULL) {
		sl = calloc(1, sizeof(*sl));
		if (sl == NULL)
			goto oom;
		sl->json = proto_layout_to_json(&r->model, &l);
		if (sl->json == NULL) {
			free(sl);
			sl = NULL;
			goto oom;
		}
		memcpy(sl->digest, l.digest, PROTO_HASH_BYTES);
		sl->l = l;
		have_l = false;
		sl->next = r->layouts;
		r->layouts = sl;
	}
	n = calloc(1, sizeof(*n));
	if (n == NULL || (n->host = strdup(host)) == NULL ||
	    (n->provider = strdup(provider)) == NULL)
		goto oom;
	if (rep == NULL && (new_rep = calloc(1, sizeof(*new_rep))) == NULL)
		goto oom;
	if ((rep == NULL || rep->layout != sl) &&
	    (new_ranks = calloc(sl->l.nranks, sizeof(*new_ranks))) == NULL)
		goto oom;

	n->addr = addr;
	addr = NULL;
	snprintf(n->id, sizeof(n->id), "%s/%llu", replica, (unsigned long long)rank);
	n->rank = (uint32_t)rank;
	n->layout = sl;
	n->alive = true;
	n->last = -1;
	n->registered_ms = proto_wall_ms();
	n->expires_ns = proto_now_ns() + lease_ns(r);
	if (rep == NULL) {
		rep = new_rep;
		new_rep = NULL;
		snprintf(rep->name, sizeof(rep->name), "%s", replica);
		insert_replica(r, rep);
	}
	if (new_ranks != NULL) {
		/* A new replica, or a new layout for one whose other ranks are
		 * all gone: the old ranks go with the old layout. */
		if (rep->layout != NULL)
			LOG_INFO("replica %s changes layout", replica);
		for (uint32_t i = 0; i < rep->nranks; i++)
			node_free(rep->ranks[i]);
		free(rep->ranks);
		rep->ranks = new_ranks;
		new_ranks = NULL;
		rep->nranks = sl->l.nranks;
		sl->refs++;
		slayout_put(r, rep->layout);
		rep->layout = sl;
		rep->active = 0;
	}
	node_free(rep->ranks[rank]); /* re-registration replaces */
	rep->ranks[rank] = n;
	n->rep = rep;
	LOG_INFO("node %s registered (%s, %s)", n->id, host, provider);
	trk__reply_json(c, 200, json_pack("{s:s,s:I,s:o}", "node_id", n->id,
					  "lease_ms", (json_int_t)r->s->lease_ms,
					  "layout_digest",
					  trk__json_hex(sl->digest, PROTO_HASH_BYTES)));
	n = NULL;
	goto out;
oom:
	trk__fail(c, 500, "out of memory");
out:
	if (sl != NULL && sl->refs == 0) { /* created here, unused */
		sl->refs = 1;
		slayout_put(r, sl);
	}
	free(new_rep);
	free(new_ranks);
	node_free(n);
	free(addr);
	if (have_l)
		proto_layout_fini(&l);
}

/* ---- POST /heartbeat ------------------------------------------------------ */

void trk__handle_heartbeat(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	struct node *n;
	struct publisher *p;
	uint64_t exp = proto_now_ns() + lease_ns(r);

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	n = find_node(r, id);
	p = n == NULL ? find_publisher(r, id) : NULL;
	if (n != NULL && n->alive)
		n->expires_ns = exp;
	else if (p != NULL && p->alive)
		p->expires_ns = exp;
	else {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	trk__reply_json(c, 200, json_pack("{s:I}", "lease_ms", (json_int_t)r->s->lease_ms));
}

/* ---- POST /nodes/state ----------------------------------------------------- */

static void log_activation(struct trk_registry *r, struct replica *rep)
{
	struct activation *a = &r->act[r->act_next];

	snprintf(a->replica, sizeof(a->replica), "%s", rep->name);
	a->version = rep->active;
	a->wall_ms = proto_wall_ms();
	r->act_next = (r->act_next + 1) % ACTIVATIONS_MAX;
	r->act_n = PROTO_MIN(r->act_n + 1, ACTIVATIONS_MAX);
	r->act_total++;
	LOG_INFO("replica %s activated version %llu", rep->name,
		 (unsigned long long)rep->active);
}

/* Replica-local activation: when every rank is alive and reports the same
 * active version, that is the replica's active version. */
static void update_active(struct trk_registry *r, struct replica *rep)
{
	uint64_t a = 0;

	for (uint32_t i = 0; i < rep->nranks; i++) {
		struct node *n = rep->ranks[i];
		if (n == NULL || !n->alive || n->active == 0)
			return;
		if (i > 0 && n->active != a)
			return;
		a = n->active;
	}
	if (a != 0 && a != rep->active) {
		rep->active = a;
		log_activation(r, rep);
	}
}

/* Adds what a report adds to the counters it reported before. A counter that
 * went down restarted (a new transfer): all of it is new. */
static uint64_t grow(uint64_t old, uint64_t now)
{
	return now >= old ? now - old : now;
}

void trk__handle_node_state(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL, *state = NULL;
	json_t *jerr = json_object_get(c->json, "error");
	/* Absent counters keep their last reported value. */
	const uint64_t ABSENT = UINT64_MAX;
	uint64_t version = 0, done = ABSENT, total = ABSENT, ft = ABSENT, fp = ABSENT;
	enum trk_rank_state st;
	struct trk_version *ver;
	struct node *n;
	struct nver *e;
	char error[ERROR_MAX + 1] = "";

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__get_str(c->json, "state", true, 16, &state, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_done", false, ABSENT - 1, &done, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_total", false, ABSENT - 1, &total, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_from_trainer", false, ABSENT - 1, &ft, &err) != 0 ||
	    trk__get_u64(c->json, "bytes_from_peers", false, ABSENT - 1, &fp, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
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
	if (version == 0) {
		trk__fail(c, 400, "version: must be >= 1");
		return;
	}
	n = find_node(r, id);
	if (n == NULL || !n->alive) {
		trk__fail(c, 404, "node %s is unknown or its lease expired: register again", id);
		return;
	}
	ver = trk__versions_find(c->s->vs, version);
	if (ver == NULL) {
		trk__fail(c, 409, "version %llu is not published", (unsigned long long)version);
		return;
	}
	e = node_ver(n, version);
	if (e == NULL) {
		if (n->nvers < NODE_VERSIONS) {
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
	}
	done = done == ABSENT ? e->done : done;
	total = total == ABSENT ? e->total : total;
	ft = ft == ABSENT ? e->from_trainer : ft;
	fp = fp == ABSENT ? e->from_peers : fp;
	ver->bytes_from_trainer += grow(e->from_trainer, ft);
	ver->bytes_from_peers += grow(e->from_peers, fp);
	r->bytes_from_trainer += grow(e->from_trainer, ft);
	r->bytes_from_peers += grow(e->from_peers, fp);
	e->state = st;
	e->done = done;
	e->total = total;
	e->from_trainer = ft;
	e->from_peers = fp;
	n->last = (int)(e - n->vers);
	n->report_ms = proto_wall_ms();
	if (st == TRK_STATE_FAILED)
		snprintf(n->error, sizeof(n->error), "v%llu: %s",
			 (unsigned long long)version, error[0] ? error : "failed");
	else if (st != TRK_STATE_FETCHING)
		n->error[0] = 0;
	if (st == TRK_STATE_ACTIVE)
		n->active = version;
	update_active(r, n->rep);
	trk__reply_json(c, 200,
			json_pack("{s:s,s:b,s:I}", "replica", n->rep->name,
				  "replica_complete", replica_complete(n->rep, version),
				  "replica_active", (json_int_t)n->rep->active));
}

/* ---- POST /offers, GET /sources -------------------------------------------- */

static struct offer_set *offers_get(struct offers *o, uint64_t v)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->sets[i].version == v)
			return &o->sets[i];
	return NULL;
}

/* Replaces the set for v (n == 0 removes it); takes list. */
static void offers_put(struct offers *o, uint64_t v, struct trk_offer *list,
		       size_t n)
{
	struct offer_set *s = offers_get(o, v);

	if (s != NULL) {
		free(s->o);
		*s = o->sets[--o->n];
	}
	if (n == 0) {
		free(list);
		return;
	}
	if (o->n == OFFER_VERSIONS) {
		size_t lo = 0;
		for (size_t i = 1; i < o->n; i++)
			if (o->sets[i].version < o->sets[lo].version)
				lo = i;
		free(o->sets[lo].o);
		o->sets[lo] = o->sets[--o->n];
	}
	o->sets[o->n++] = (struct offer_set){v, n, list};
}

static const struct trk_offer *offers_find(struct offers *o, uint64_t v,
					   const uint8_t *layout, uint32_t src,
					   uint32_t dst)
{
	struct offer_set *s = offers_get(o, v);

	for (size_t i = 0; s != NULL && i < s->n; i++)
		if (s->o[i].src_rank == src && s->o[i].dst_rank == dst &&
		    memcmp(s->o[i].layout, layout, PROTO_HASH_BYTES) == 0)
			return &s->o[i];
	return NULL;
}

static int parse_offer(json_t *o, size_t i, const struct proto_manifest *m,
		       struct trk_offer *out, struct proto_err *err)
{
	const struct proto_mlayout *ml;
	const struct proto_mparcel *mp;
	uint64_t src = 0, dst = 0;
	int rc;

	if (!json_is_object(o))
		return proto_errf(err, EINVAL, "parcels[%zu]: must be an object", i);
	if ((rc = trk__get_hex(o, "layout", out->layout, PROTO_HASH_BYTES, err)) != 0 ||
	    (rc = trk__get_u64(o, "src_rank", true, UINT32_MAX, &src, err)) != 0 ||
	    (rc = trk__get_u64(o, "dst_rank", true, UINT32_MAX, &dst, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "addr", &out->addr, err)) != 0 ||
	    (rc = trk__get_u64_str(o, "key", &out->key, err)) != 0 ||
	    (rc = trk__get_u64(o, "len", true, UINT64_MAX, &out->len, err)) != 0) {
		proto_err_prefix(err, "parcels[%zu]", i);
		return rc;
	}
	out->src_rank = (uint32_t)src;
	out->dst_rank = (uint32_t)dst;
	ml = proto_manifest_layout(m, out->layout);
	if (ml == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no such layout", i,
				  (unsigned long long)m->version);
	mp = proto_mlayout_parcel(ml, out->src_rank, out->dst_rank);
	if (mp == NULL)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: version %llu has no parcel %u -> %u", i,
				  (unsigned long long)m->version, out->src_rank,
				  out->dst_rank);
	if (mp->wire_bytes != out->len)
		return proto_errf(err, EINVAL,
				  "parcels[%zu]: len %llu but the parcel has %llu wire bytes",
				  i, (unsigned long long)out->len,
				  (unsigned long long)mp->wire_bytes);
	return 0;
}

void trk__handle_offers(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	const char *id = NULL;
	uint64_t version = 0;
	json_t *jp = json_object_get(c->json, "parcels");
	const struct proto_manifest *m = NULL;
	struct proto_manifest *owned = NULL;
	struct trk_offer *list = NULL;
	struct publisher *p;
	struct node *n;
	size_t cnt;

	if (trk__get_str(c->json, "id", true, TRK_ID_MAX - 1, &id, &err) != 0 ||
	    trk__get_u64(c->json, "version", true, UINT64_MAX, &version, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		return;
	}
	if (!json_is_array(jp) || json_array_size(jp) > OFFER_PARCELS_MAX) {
		trk__fail(c, 400, "parcels: must be an array of at most %d", OFFER_PARCELS_MAX);
		return;
	}
	cnt = json_array_size(jp);
	n = find_node(r, id);
	p = n == NULL ? find_publisher(r, id) : NULL;
	if ((n == NULL || !n->alive) && (p == NULL || !p->alive)) {
		trk__fail(c, 404, "%s is unknown or its lease expired: register again", id);
		return;
	}
	if (trk__versions_manifest(c->s->vs, version, &m, &owned, &err) != 0) {
		trk__fail(c, trk__versions_find(c->s->vs, version) ? 500 : 409,
			  "%s", err.msg);
		return;
	}
	list = cnt > 0 ? calloc(cnt, sizeof(*list)) : NULL;
	if (cnt > 0 && list == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < cnt; i++) {
		struct trk_offer *o = &list[i];
		if (parse_offer(json_array_get(jp, i), i, m, o, &err) != 0) {
			trk__fail(c, 400, "%s", err.msg);
			goto out;
		}
		if (p != NULL && !publisher_has_rank(p, o->src_rank)) {
			trk__fail(c, 400, "parcels[%zu]: publisher %s does not serve rank %u",
				  i, id, o->src_rank);
			goto out;
		}
		if (n != NULL && (memcmp(o->layout, n->layout->digest, PROTO_HASH_BYTES) != 0 ||
				  o->dst_rank != n->rank)) {
			trk__fail(c, 400,
				  "parcels[%zu]: a node offers only parcels of its own layout and rank",
				  i);
			goto out;
		}
		for (size_t j = 0; j < i; j++)
			if (list[j].src_rank == o->src_rank && list[j].dst_rank == o->dst_rank &&
			    memcmp(list[j].layout, o->layout, PROTO_HASH_BYTES) == 0) {
				trk__fail(c, 400, "parcels[%zu]: listed twice", i);
				goto out;
			}
	}
	offers_put(n != NULL ? &n->offers : &p->offers, version, list, cnt);
	list = NULL;
	trk__reply_json(c, 200, json_pack("{s:I,s:I}", "version", (json_int_t)version,
					  "parcels", (json_int_t)cnt));
out:
	free(list);
	if (owned != NULL) {
		proto_manifest_fini(owned);
		free(owned);
	}
}

static json_t *source_json(bool peer, const char *id, const char *host,
			   const char *provider, const char *addr,
			   const struct trk_offer *o)
{
	char a[24], k[24];

	snprintf(a, sizeof(a), "%llu", (unsigned long long)o->addr);
	snprintf(k, sizeof(k), "%llu", (unsigned long long)o->key);
	return json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I}", "kind",
			 peer ? "peer" : "publisher", "id", id, "host", host,
			 "provider", provider, "fabric_addr", addr, "addr", a,
			 "key", k, "len", (json_int_t)o->len);
}

void trk__handle_sources(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	struct proto_err err = {{0}};
	uint64_t version = 0, src = 0, dst = 0;
	uint8_t layout[PROTO_HASH_BYTES];
	const char *lhex = trk__query_str(c, "layout");
	json_t *peers = json_array(), *pubs = json_array();

	if (peers == NULL || pubs == NULL) {
		trk__fail(c, 500, "out of memory");
		goto out;
	}
	if (trk__query_u64(c, "version", true, UINT64_MAX, &version, &err) != 0 ||
	    trk__query_u64(c, "src_rank", true, UINT32_MAX, &src, &err) != 0 ||
	    trk__query_u64(c, "dst_rank", true, UINT32_MAX, &dst, &err) != 0) {
		trk__fail(c, 400, "%s", err.msg);
		goto out;
	}
	if (lhex == NULL || trk__unhex(lhex, layout, sizeof(layout)) != 0) {
		trk__fail(c, 400, "layout: want %d hex digits", 2 * PROTO_HASH_BYTES);
		goto out;
	}
	if (trk__versions_find(c->s->vs, version) == NULL) {
		trk__fail(c, 404, "version %llu is unknown", (unsigned long long)version);
		goto out;
	}
	for (struct replica *rep = r->reps; rep; rep = rep->next)
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct node *n = rep->ranks[i];
			const struct trk_offer *o;
			if (!node_holds(n, version))
				continue;
			o = offers_find(&n->offers, version, layout, (uint32_t)src,
					(uint32_t)dst);
			if (o != NULL &&
			    json_array_append_new(peers, source_json(true, n->id, n->host,
								     n->provider,
								     n->addr, o)) != 0)
				goto oom;
		}
	/* Spread the swarm: peers in random order. */
	for (size_t i = json_array_size(peers); i > 1; i--) {
		size_t j = randombytes_uniform((uint32_t)i);
		json_t *a = json_incref(json_array_get(peers, i - 1));
		json_t *b = json_incref(json_array_get(peers, j));
		json_array_set_new(peers, i - 1, b);
		json_array_set_new(peers, j, a);
	}
	for (struct publisher *p = r->pubs; p; p = p->next) {
		const struct trk_offer *o;
		if (!p->alive)
			continue;
		o = offers_find(&p->offers, version, layout, (uint32_t)src, (uint32_t)dst);
		if (o == NULL)
			continue;
		for (size_t i = 0; i < p->nranks; i++)
			if (p->ranks[i].rank == o->src_rank &&
			    json_array_append_new(pubs, source_json(false, p->id,
								    p->ranks[i].host,
								    p->ranks[i].provider,
								    p->ranks[i].addr, o)) != 0)
				goto oom;
	}
	if (json_array_extend(peers, pubs) != 0)
		goto oom;
	trk__reply_json(c, 200, json_pack("{s:O}", "sources", peers));
	goto out;
oom:
	trk__fail(c, 500, "out of memory");
out:
	json_decref(peers);
	json_decref(pubs);
}

/* ---- GET /layouts, /replicas/R ---------------------------------------------- */

void trk__handle_layouts(struct trk_call *c)
{
	struct trk_registry *r = c->s->reg;
	json_t *o, *arr = json_array();
	int bad = arr == NULL;

	if (!r->have_model) {
		json_decref(arr);
		trk__fail(c, 404, "no model known yet: no publisher has registered");
		return;
	}
	for (struct slayout *sl = r->layouts; !bad && sl; sl = sl->next) {
		json_t *names = json_array();
		bad |= names == NULL;
		for (struct replica *rep = r->reps; !bad && rep; rep = rep->next)
			if (rep->layout == sl && replica_alive(rep))
				bad |= json_array_append_new(names, json_string(rep->name)) != 0;
		if (!bad && json_array_size(names) > 0)
			bad |= json_array_append_new(
				       arr, json_pack("{s:o,s:O,s:O}", "digest",
						      trk__json_hex(sl->digest, PROTO_HASH_BYTES),
						      "layout", sl->json, "replicas",
						      names)) != 0;
		json_decref(names);
	}
	if (bad) {
		json_decref(arr);
		trk__fail(c, 500, "out of memory");
		return;
	}
	o = json_pack("{s:o,s:O,s:O,s:o,s:o}", "model_digest",
		      trk__json_hex(r->model.digest, PROTO_HASH_BYTES), "model",
		      r->model_json, "trainer_layout", r->tlayout_json,
		      "trainer_layout_digest",
		      trk__json_hex(r->tlayout.digest, PROTO_HASH_BYTES), "layouts", arr);
	trk__reply_json(c, 200, o);
}

void trk__handle_replica(struct trk_call *c, const char *name)
{
	struct replica *rep = valid_replica_name(name) ? find_replica(c->s->reg, name) : NULL;

	if (rep == NULL) {
		trk__fail(c, 404, "no replica named '%s'", name);
		return;
	}
	trk__reply_json(c, 200, replica_json(rep, false));
}

/* ---- status -------------------------------------------------------------------- */

json_t *trk__registry_version_replicas(struct trk_registry *r, uint64_t v,
				       bool active)
{
	json_t *a = json_array();

	for (struct replica *rep = r->reps; a != NULL && rep; rep = rep->next) {
		bool in = active ? rep->active == v && replica_alive(rep) :
				   replica_complete(rep, v);
		if (in && json_array_append_new(a, json_string(rep->name)) != 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

static json_t *publisher_json(const struct publisher *p)
{
	json_t *o = json_object(), *ranks = json_array(), *offers = json_array();
	int bad = o == NULL || ranks == NULL || offers == NULL;

	for (size_t i = 0; !bad && i < p->nranks; i++)
		bad |= json_array_append_new(
			       ranks, json_pack("{s:i,s:s,s:s}", "rank", (int)p->ranks[i].rank,
						"host", p->ranks[i].host, "provider",
						p->ranks[i].provider)) != 0;
	for (size_t i = 0; !bad && i < p->offers.n; i++)
		bad |= json_array_append_new(offers,
					     trk__jint(p->offers.sets[i].version)) != 0;
	if (!bad) {
		bad |= trk__set(o, "id", json_string(p->id));
		bad |= trk__set(o, "alive", json_boolean(p->alive));
		bad |= trk__set(o, "registered_ms", trk__jint(p->registered_ms));
		if (!p->alive)
			bad |= trk__set(o, "gone_ms", trk__jint(p->gone_ms));
		bad |= trk__set(o, "ranks", json_incref(ranks));
		bad |= trk__set(o, "offered_versions", json_incref(offers));
	}
	json_decref(ranks);
	json_decref(offers);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

json_t *trk__registry_status(struct trk_registry *r)
{
	json_t *o = json_object(), *pubs = json_array(), *reps = json_array(),
	       *acts = json_array();
	int bad = o == NULL || pubs == NULL || reps == NULL || acts == NULL;
	struct trk_counts cnt;

	for (struct publisher *p = r->pubs; !bad && p; p = p->next)
		bad |= json_array_append_new(pubs, publisher_json(p)) != 0;
	for (struct replica *rep = r->reps; !bad && rep; rep = rep->next)
		bad |= json_array_append_new(reps, replica_json(rep, true)) != 0;
	/* Newest activation first. */
	for (size_t k = 0; !bad && k < r->act_n; k++) {
		const struct activation *a =
			&r->act[(r->act_next + ACTIVATIONS_MAX - 1 - k) % ACTIVATIONS_MAX];
		bad |= json_array_append_new(
			       acts, json_pack("{s:s,s:o,s:o}", "replica", a->replica,
					       "version", trk__jint(a->version),
					       "wall_ms", trk__jint(a->wall_ms))) != 0;
	}
	trk__registry_counts(r, &cnt);
	if (!bad) {
		bad |= trk__set(o, "model_digest",
				r->have_model ? trk__json_hex(r->model.digest,
							      PROTO_HASH_BYTES) :
						json_null());
		bad |= trk__set(o, "trainer_layout_digest",
				r->have_model ? trk__json_hex(r->tlayout.digest,
							      PROTO_HASH_BYTES) :
						json_null());
		bad |= trk__set(o, "model_bytes",
				trk__jint(r->have_model ? proto_model_bytes(&r->model) : 0));
		bad |= trk__set(o, "publishers", json_incref(pubs));
		bad |= trk__set(o, "replicas", json_incref(reps));
		bad |= trk__set(o, "activations", json_incref(acts));
		bad |= trk__set(o, "activations_total", trk__jint(r->act_total));
		bad |= trk__set(o, "bytes_from_trainer", trk__jint(r->bytes_from_trainer));
		bad |= trk__set(o, "bytes_from_peers", trk__jint(r->bytes_from_peers));
		bad |= trk__set(o, "nodes_alive", trk__jint(cnt.nodes_alive));
		bad |= trk__set(o, "publishers_alive", trk__jint(cnt.publishers_alive));
	}
	json_decref(pubs);
	json_decref(reps);
	json_decref(acts);
	if (bad) {
		json_decref(o);
		return NULL;
	}
	return o;
}

void trk__registry_counts(struct trk_registry *r, struct trk_counts *out)
{
	uint64_t latest = trk__versions_latest(r->s->vs);

	memset(out, 0, sizeof(*out));
	for (struct publisher *p = r->pubs; p; p = p->next) {
		if (p->alive)
			out->publishers_alive++;
		else
			out->publishers_gone++;
	}
	for (struct replica *rep = r->reps; rep; rep = rep->next) {
		bool all = true;
		for (uint32_t i = 0; i < rep->nranks; i++) {
			struct node *n = rep->ranks[i];
			if (n != NULL && n->alive)
				out->nodes_alive++;
			else if (n != NULL)
				out->nodes_gone++;
			all &= n != NULL && n->alive;
		}
		if (!replica_alive(rep))
			out->replicas_gone++;
		else if (!all)
			out->replicas_partial++;
		else if (rep->active != 0 && rep->active == latest)
			out->replicas_current++;
		else
			out->replicas_behind++;
	}
	out->bytes_from_trainer = r->bytes_from_trainer;
	out->bytes_from_peers = r->bytes_from_peers;
	out->activations = r->act_total;
}
