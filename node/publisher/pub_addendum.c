/* The publisher extends a published version for layouts registered after it (signed addenda). */
#include "node/publisher/pub_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "proto/addendum.h"

/*
 * A replica may register a serving layout after the latest version was
 * published; that manifest lists no parcels for it. The tracker says so in
 * its version list (the latest's `uncovered_layouts`), which the retention
 * check reads every TESSERA_PUB_CHECK_MS and at once when the leader's
 * held watch (GET /versions?layouts_rev=R) says a replica came alive. The
 * leader then runs an export of
 * the same version in addendum mode (pub_export.c does the work):
 *   1. the tracker's manifest of the version (its digest and chunk size);
 *   2. the new layouts planned; no snapshot is taken: the version kept as
 *      the parent of the next one has its snapshot of each trainer rank's
 *      memory, read as it is; else each rank's memory is rebuilt from the
 *      raw parcels it sent in the version as served (an anchor's served
 *      buffers; pub_restore.c), which hold exactly the version's bytes
 *      (the source may have moved on: a trainer's buffers hold its next
 *      weights by now); only where those parcels do not reach every byte
 *      the new layouts read (a layout withdrawn meanwhile) is the rank
 *      rebuilt from the source (fixture or checkpoint: deterministic);
 *   3. only the new layouts' parcels gathered and hashed, on the workers;
 *   4. per layout an addendum (proto/addendum.h) signed and POSTed;
 *   5. the new parcels joined to the served version (their own slices and
 *      regions, as a layout of the original export has) and offered with it.
 * A node that lacks a delta version's parent and takes the version whole
 * asks for a raw copy of its layout (the latest's copy_wanted): the same
 * export, for a layout the version lists, signed as a copy addendum
 * (proto/addendum.h) from the same snapshot or parcels; it is only posted,
 * not offered (the version's offers of that layout are its deltas): the
 * node reads the bytes from replicas that hold the version.
 * Only a version this process still serves is extended: the newest one
 * always is, unless the publisher restarted and has not re-offered it yet.
 * Otherwise it says so and the replica waits for the next version. With
 * several publisher processes nothing is extended yet (the others would
 * have to rebuild and offer their ranks' parcels of the new layout, as
 * they do for a version): the replica waits for the next version.
 */

#define ADD_RETRY_MS 5000 /* a failed extension of a version is tried again after */
#define POST_TRIES 20     /* transport failures before giving up */

struct pub_addenda {
	size_t n, sent;
	unsigned tries;
	uint8_t **buf;
	size_t *len;
};

void node__pub_addenda_free(struct pub_addenda *a)
{
	if (a == NULL)
		return;
	for (size_t i = 0; i < a->n; i++)
		free(a->buf[i]);
	free(a->buf);
	free(a->len);
	free(a);
}

static bool serves_layout(const struct pub_version *pv, const uint8_t *digest)
{
	for (size_t li = 0; li < pv->nlayouts; li++)
		if (memcmp(pv->layouts[li].digest, digest, PROTO_HASH_BYTES) == 0)
			return true;
	return false;
}

/* Adds to the layouts the addendum export wants those of list[n] that pv
 * serves (served true), or that it does not (pv NULL: serves none). */
static void want(struct node_pub *p, const struct pub_version *pv, bool served,
		 const uint8_t (*list)[PROTO_HASH_BYTES], uint32_t n)
{
	for (uint32_t k = 0; k < n && p->nadd_want < TRK_RETAIN_LAYOUTS_MAX; k++)
		if ((pv != NULL && serves_layout(pv, list[k])) == served)
			memcpy(p->add_want[p->nadd_want++], list[k], PROTO_HASH_BYTES);
}

bool node__pub_addendum_check(struct node_pub *p, const struct trk_version_info *vi, size_t n,
			      uint64_t latest)
{
	const struct trk_version_info *info = NULL;
	struct pub_version *pv;
	char h[2 * PROTO_HASH_BYTES + 1];

	for (size_t i = 0; i < n; i++)
		if (vi[i].version == latest)
			info = &vi[i];
	if (info == NULL || (info->nuncovered == 0 && info->nadded == 0 && info->ncopy_wanted == 0) ||
	    !p->leader ||
	    p->dead || !p->ready || p->ex != NULL)
		return false;
	if (p->add_failed_v == latest && proto_wall_ms() - p->add_failed_ms < ADD_RETRY_MS)
		return false;
	pv = node__pub_version_served(p, latest);
	/* Layouts no manifest or addendum lists yet, and those added by
	 * addenda that this process does not serve (it restarted): the same
	 * addendum is made again (the sources are deterministic) and offered. */
	p->nadd_want = 0;
	want(p, pv, false, info->uncovered, info->nuncovered);
	want(p, pv, false, info->added, info->nadded);
	/* Else raw copies of the delta's own layouts, if asked for. */
	p->add_copy = p->nadd_want == 0;
	if (p->add_copy && pv != NULL && pv->delta)
		want(p, pv, true, info->copy_wanted, info->ncopy_wanted);
	if (p->nadd_want == 0)
		return false; /* all served; the tracker hears of new ones with their addenda */
	sodium_bin2hex(h, sizeof(h), p->add_want[0], PROTO_HASH_BYTES);
	const char *cannot = p->nhosted != p->tl.nranks
		? "other processes host trainer ranks and do not extend versions"
		: pv == NULL ? "this publisher no longer serves it" : NULL;
	if (cannot != NULL) {
		if (p->add_gone_v != latest)
			LOG_WARN("version %llu lacks layout %.16s; %s: that replica waits for the next "
				 "version", (unsigned long long)latest, h, cannot);
		p->add_gone_v = latest;
		return false;
	}
	if (p->add_copy)
		LOG_INFO("version %llu: a raw copy of layout %.16s%s is wanted: signing it by "
			 "addendum",
			 (unsigned long long)latest, h, p->nadd_want > 1 ? " and others" : "");
	else
		LOG_INFO("version %llu lacks layout %.16s%s: extending it by addendum",
			 (unsigned long long)latest, h, p->nadd_want > 1 ? " and others" : "");
	p->add_version = latest;
	p->addendum_next = true;
	return true;
}

bool node__pub_addendum_wants(const struct node_pub *p, const struct pub_layout *sl)
{
	for (uint32_t k = 0; k < p->nadd_want; k++)
		if (memcmp(p->add_want[k], sl->digest, PROTO_HASH_BYTES) == 0)
			return true;
	return false;
}

/* ---- the addenda -------------------------------------------------------------- */

/* Addendum li from the parts' hashes (items of that layout). */
static int build_one(struct node_pub *p, size_t li, struct proto_addendum *ad,
		     struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	const struct pub_layout *sl = ex->layouts[li];
	struct proto_manifest tmp;
	struct proto_mlayout *ml;
	int rc;

	proto_addendum_init(ad);
	ad->version = ex->version;
	ad->copy = p->add_copy;
	memcpy(ad->manifest_digest, ex->m.digest, PROTO_HASH_BYTES);
	ad->chunk_size = ex->m.chunk_size;
	/* The layout block is built in a manifest (its chunk-list helpers),
	 * then moved into the addendum. */
	proto_manifest_init(&tmp);
	tmp.chunk_size = ex->m.chunk_size;
	ml = proto_manifest_add_layout(&tmp, sl->digest, sl->plan.digest, sl->plan.nparcels);
	if (ml == NULL)
		return proto_errf(err, ENOMEM, "out of memory");
	/* (An addendum's export is never a delta: its parcels are raw.) */
	if ((rc = node__pub_mlayout_fill(ex, li, &tmp, ml, err)) != 0) {
		proto_manifest_fini(&tmp);
		return rc;
	}
	ad->layout = *ml;
	ml->parcels = NULL;
	ml->nparcels = 0;
	proto_manifest_fini(&tmp);
	return 0;
}

int node__pub_addendum_build(struct node_pub *p, struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	struct pub_addenda *a = calloc(1, sizeof(*a));
	int rc = 0;

	if (a == NULL || (a->buf = calloc(ex->nlayouts, sizeof(*a->buf))) == NULL ||
	    (a->len = calloc(ex->nlayouts, sizeof(*a->len))) == NULL) {
		node__pub_addenda_free(a);
		return proto_errf(err, ENOMEM, "out of memory");
	}
	ex->add = a;
	for (size_t li = 0; li < ex->nlayouts && rc == 0; li++) {
		struct proto_addendum ad;
		rc = build_one(p, li, &ad, err);
		if (rc == 0)
			rc = proto_addendum_sign(&ad, p->sk, &a->buf[li], &a->len[li], err);
		proto_addendum_fini(&ad);
		if (rc == 0)
			a->n++;
	}
	return rc;
}

/* Joins the export's parts (its new layouts' slices, regions and offers)
 * to the served version pv, which offers them with its own from now on. */
static int join(struct node_pub *p, struct pub_version *pv, struct pub_version *add)
{
	size_t base = pv->nlayouts, k = add->nlayouts;
	struct pub_vlayout *ls = realloc(pv->layouts, (base + k) * sizeof(*ls));
	struct pub_part *parts;
	struct trk_offer *offers;
	uint32_t *oli;

	if (ls == NULL)
		return -ENOMEM;
	pv->layouts = ls;
	parts = realloc(pv->parts, (pv->nparts + add->nparts) * sizeof(*parts));
	if (parts == NULL)
		return -ENOMEM;
	pv->parts = parts;
	offers = realloc(pv->offers, PROTO_MAX(pv->noffers + add->noffers, 1) * sizeof(*offers));
	if (offers == NULL)
		return -ENOMEM;
	pv->offers = offers;
	oli = realloc(pv->offer_li, PROTO_MAX(pv->noffers + add->noffers, 1) * sizeof(*oli));
	if (oli == NULL)
		return -ENOMEM;
	pv->offer_li = oli;
	/* Each new part's slices, re-indexed past the version's layouts. */
	for (size_t i = 0; i < add->nparts; i++) {
		struct pub_part *pt = &add->parts[i];
		struct pub_slice *sl;
		if (pt->buf == NULL)
			continue;
		sl = calloc(base + k, sizeof(*sl));
		if (sl == NULL)
			return -ENOMEM;
		memcpy(sl + base, pt->slices, pt->nslices * sizeof(*sl));
		free(pt->slices);
		pt->slices = sl;
		pt->nslices = base + k;
	}
	/* Nothing can fail from here: move everything over. */
	memcpy(pv->layouts + base, add->layouts, k * sizeof(*ls));
	pv->nlayouts = base + k;
	for (size_t i = 0; i < add->nparts; i++) {
		if (add->parts[i].buf == NULL)
			continue;
		pv->parts[pv->nparts++] = add->parts[i];
		memset(&add->parts[i], 0, sizeof(add->parts[i]));
	}
	for (size_t i = 0; i < add->noffers; i++) {
		pv->offers[pv->noffers] = add->offers[i];
		pv->offer_li[pv->noffers++] = (uint32_t)(add->offer_li[i] + base);
	}
	pv->so.offered = false;
	pv->so.tried = false;
	return 0;
}

int node__pub_addendum_answer(struct node_pub *p, const struct trk_answer *ans,
			       struct proto_err *err)
{
	struct pub_export *ex = p->ex;
	struct pub_addenda *a = ex->add;
	struct pub_version *pv;

	if (ans->status == 200 || ans->status == 201) {
		a->sent++;
		a->tries = 0;
	} else if ((ans->status < 0 || ans->status >= 500) && ++a->tries < POST_TRIES) {
		LOG_WARN("posting an addendum of version %llu: %s (retrying)",
			 (unsigned long long)ex->version, ans->error);
		node__pub_timer_ms(p->ex_ev, RETRY_MS);
	} else {
		return proto_errf(err, EIO, "the tracker refused its addendum: %s", ans->error);
	}
	if (a->sent < a->n)
		return 0;
	pv = node__pub_version_served(p, ex->version);
	if (pv == NULL)
		return proto_errf(err, ENOENT, "the version stopped being served meanwhile");
	if (!p->add_copy && join(p, pv, ex->pv) != 0)
		return proto_errf(err, ENOMEM, "out of memory joining the new layouts");
	node__pub_version_free(p, ex->pv);
	ex->pv = pv;
	return 1;
}

int node__pub_addendum_post(struct node_pub *p, trk_client_cb cb)
{
	struct pub_addenda *a = p->ex->add;

	return trk_client_post_addendum(p->trk, a->buf[a->sent], a->len[a->sent], cb, p);
}
