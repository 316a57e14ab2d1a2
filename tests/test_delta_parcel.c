/* Parcel deltas in destination-local coordinates (proto/delta_parcel.c):
 * the pieces cover each parcel exactly; a delta applied in place to a
 * destination block holding the parent gives the child bit for bit; a
 * damaged parent, a truncated or forged delta, or a delta for another
 * parcel is refused with the block unchanged. The same for a delta
 * prepared ahead and written later (proto/dpatch.c), on any number of
 * threads: preparing never writes (but maps the pages the write will
 * store to), a refusal comes before any write. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/delta.h"
#include "proto/dpatch.h"
#include "proto/fixture.h"
#include "proto/plan.h"
#include "tests/testutil.h"

struct fx {
	struct proto_model m;
	struct proto_layout src, dst;
	struct proto_plan plan;
	uint8_t *srcblk[2]; /* parent trainer ranks' blocks */
};

static void fx_init(struct fx *f, const char *dst)
{
	struct proto_err err;

	assert_int_equal(proto_fixture_model(2 << 20, &f->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&f->m, "fsdp2", &f->src, &err), 0);
	assert_int_equal(proto_layout_builtin(&f->m, dst, &f->dst, &err), 0);
	assert_int_equal(proto_plan_build(&f->m, &f->src, &f->dst, &f->plan, &err), 0);
	for (uint32_t r = 0; r < 2; r++) {
		f->srcblk[r] = malloc(f->src.ranks[r].nbytes + 1);
		proto_fixture_fill_rank(&f->m, &f->src, r, 5, 1, f->srcblk[r]);
	}
}

static void fx_fini(struct fx *f)
{
	for (uint32_t r = 0; r < 2; r++)
		free(f->srcblk[r]);
	proto_plan_fini(&f->plan);
	proto_layout_fini(&f->src);
	proto_layout_fini(&f->dst);
	proto_model_fini(&f->m);
}

/* The parcel's parent payload, and a child made from it by changing about
 * one element in 64 by one ulp (as an optimizer step does to BF16). */
static void payloads(struct fx *f, const struct proto_parcel *pc, uint8_t **parent, uint8_t **child)
{
	*parent = malloc(pc->bytes + 1);
	*child = malloc(pc->bytes + 1);
	proto_parcel_gather(&f->plan, pc, &f->src, f->srcblk[pc->src_rank], 0, pc->bytes, *parent);
	memcpy(*child, *parent, pc->bytes);
	for (uint64_t i = 0; i + 2 <= pc->bytes; i += 2 * 61)
		(*child)[i] ^= 1;
}

/* A destination block holding the payload p of every parcel of rank dst. */
static uint8_t *block_of(struct fx *f, uint32_t dst, const struct proto_parcel *pc, const uint8_t *p)
{
	uint8_t *b = calloc(1, f->dst.ranks[dst].nbytes + 1);
	proto_parcel_scatter(&f->plan, pc, &f->dst, b, 0, pc->bytes, p);
	return b;
}

/* One parcel's delta, where every case starts: its pieces, the parent and
 * child payloads (payloads(); with dense, every byte of the child
 * changed), the delta encoded, the destination block holding the child,
 * room for the pieces' checksums. */
struct pdelta {
	const struct proto_parcel *pc;
	struct proto_dparcel dp;
	struct proto_delta_stats st;
	uint8_t *par, *chi, *enc, *want;
	size_t len; /* enc's bytes */
	size_t n;   /* the destination block's bytes */
	uint64_t *sums;
};

static void pd_init(struct fx *f, uint32_t k, bool dense, struct pdelta *d)
{
	struct proto_err err;

	memset(d, 0, sizeof(*d));
	d->pc = &f->plan.parcels[k];
	d->n = f->dst.ranks[d->pc->dst_rank].nbytes;
	assert_int_equal(proto_dparcel_build(&f->m, &f->plan, d->pc, &f->dst, &d->dp, &err), 0);
	payloads(f, d->pc, &d->par, &d->chi);
	for (uint64_t i = 0; dense && i < d->pc->bytes; i++)
		d->chi[i] = (uint8_t)(d->par[i] + 3);
	assert_int_equal(proto_dparcel_encode(&d->dp, d->par, d->chi, NULL, &d->enc, &d->len, &d->st,
					      &err), 0);
	d->want = block_of(f, d->pc->dst_rank, d->pc, d->chi);
	d->sums = malloc(((size_t)d->dp.npieces + 1) * sizeof(*d->sums));
	assert_non_null(d->sums);
}

/* A destination block holding the parent (the caller frees). */
static uint8_t *pd_parent(struct fx *f, const struct pdelta *d)
{
	return block_of(f, d->pc->dst_rank, d->pc, d->par);
}

static void pd_fini(struct pdelta *d)
{
	free(d->sums);
	free(d->want);
	free(d->enc);
	free(d->par);
	free(d->chi);
	proto_dparcel_fini(&d->dp);
	proto_dparcel_fini(&d->dp); /* twice is harmless */
}

static void test_roundtrip(void **state)
{
	const char *dsts[] = {"tp2", "tp1", "fsdp2"};

	for (size_t d = 0; d < 3; d++) {
		struct fx f;
		fx_init(&f, dsts[d]);
		for (uint32_t k = 0; k < f.plan.nparcels; k++) {
			struct pdelta pd;
			struct proto_err err;

			pd_init(&f, k, false, &pd);
			/* The pieces cover the parcel's payload exactly, in order. */
			uint64_t covered = 0;
			for (uint32_t i = 0; i < pd.dp.npieces; i++) {
				assert_int_equal(pd.dp.pieces[i].pay_off, covered);
				covered += pd.dp.pieces[i].len;
			}
			assert_int_equal(covered, pd.pc->bytes);
			assert_true(pd.st.nchanged > 0 && pd.len < pd.pc->bytes / 4);
			uint8_t *blk = pd_parent(&f, &pd);
			assert_int_equal(proto_dparcel_apply(&pd.dp, pd.enc, pd.len, blk, 2, &err), 0);
			assert_memory_equal(blk, pd.want, pd.n);
			free(blk);
			pd_fini(&pd);
		}
		fx_fini(&f);
	}
}

/* An encode that gathers the child as it scans it (opts.fill, as the
 * publisher does from its snapshot) writes the same delta as one given the
 * child gathered beforehand, and leaves the child whole in its buffer;
 * max_changed stops an encode with one change more than it allows, and
 * lets one with exactly that many through. */
struct fill_ctx {
	struct fx *f;
	const struct pdelta *d;
	const uint8_t *blk; /* the child's source rank block */
	uint8_t *out;
};

static void fill_from_block(void *arg, uint32_t t, uint64_t base, uint64_t n)
{
	struct fill_ctx *c = arg;
	const struct proto_dpiece *pp = &c->d->dp.pieces[t];
	uint64_t off = pp->pay_off + base * pp->elsize;

	proto_parcel_gather(&c->f->plan, c->d->pc, &c->f->src, c->blk, off, n * pp->elsize,
			    c->out + off);
}

static void test_fill_and_limit(void **state)
{
	struct fx f;

	fx_init(&f, "tp2");
	for (uint32_t k = 0; k < f.plan.nparcels; k++) {
		struct pdelta pd;
		struct proto_err err;
		uint8_t *enc = NULL;
		size_t len = 0;

		pd_init(&f, k, false, &pd);
		/* The source block the child comes from: the parent's with the
		 * child payload put back into it. */
		uint32_t r = pd.pc->src_rank;
		uint8_t *blk = malloc(f.src.ranks[r].nbytes + 1), *out = malloc(pd.pc->bytes + 1);
		assert_true(blk != NULL && out != NULL);
		memcpy(blk, f.srcblk[r], f.src.ranks[r].nbytes);
		proto_parcel_ungather(&f.plan, pd.pc, &f.src, blk, 0, pd.pc->bytes, pd.chi);
		memset(out, 0xa5, pd.pc->bytes);
		struct fill_ctx c = {&f, &pd, blk, out};
		struct proto_delta_opts o = {.threads = 2, .chunk_elems = 1000,
					     .fill = fill_from_block, .fill_arg = &c};
		struct proto_delta_opts plain = {.threads = 2, .chunk_elems = 1000};
		uint8_t *enc2 = NULL;
		size_t len2 = 0;
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, out, &o, &enc, &len, NULL, &err),
				 0);
		assert_memory_equal(out, pd.chi, pd.pc->bytes);
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &plain, &enc2, &len2,
						      NULL, &err), 0);
		assert_int_equal(len, len2);
		assert_memory_equal(enc, enc2, len);
		free(enc);
		free(enc2);
		plain.max_changed = pd.st.nchanged - 1;
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &plain, &enc, &len,
						      NULL, &err), -E2BIG);
		assert_null(enc);
		plain.max_changed = pd.st.nchanged;
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &plain, &enc, &len,
						      NULL, &err), 0);
		free(enc);
		free(blk);
		free(out);
		pd_fini(&pd);
	}
	fx_fini(&f);
}

/* A budget of coded bytes shared by encodes (the publisher's: half of the
 * version's raw bytes) stops an encode once its output passes it, having
 * read only part of its child: a child that changes every byte into noise
 * codes to about its own size, so it stops near half its input, not at the
 * end. The stop is counted in bytes scanned and coded, never in time. An
 * encode that shares a budget already passed stops before it reads a
 * byte; a delta that pays is not touched by the budget (the same bytes as
 * without one, and its coded bytes counted). */
static void test_budget(void **state)
{
	struct fx f;

	fx_init(&f, "tp2");
	for (unsigned threads = 1; threads <= 2; threads++) {
		struct pdelta pd;
		struct proto_err err = {{0}};
		uint8_t *enc = NULL, *dense = NULL;
		size_t len = 0;
		uint64_t state64 = 0x9e3779b97f4a7c15ull;

		pd_init(&f, 0, false, &pd);
		uint64_t bytes = pd.pc->bytes;
		assert_true(bytes >= (256u << 10));
		dense = malloc(bytes + 1);
		assert_non_null(dense);
		for (uint64_t i = 0; i < bytes; i++) { /* noise: no coding can shrink it */
			state64 = state64 * 6364136223846793005ull + 1442695040888963407ull;
			dense[i] = (uint8_t)(state64 >> 56);
		}
		struct proto_delta_budget b = {.limit = bytes / 2};
		struct proto_delta_opts o = {.threads = threads, .chunk_elems = 1000, .budget = &b};
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, dense, &o, &enc, &len, NULL,
						      &err), -E2BIG);
		assert_null(enc);
		assert_non_null(strstr(err.msg, "passed the budget"));
		assert_true(atomic_load(&b.over));
		assert_true(atomic_load(&b.out) > b.limit);
		/* Stopped near half its input: at most a chunk (2000 bytes)
		 * per thread past it, never the whole parcel. */
		uint64_t in = atomic_load(&b.in);
		assert_true(in > 0);
		assert_true(in <= bytes / 2 + 2 * 2000 * threads);
		assert_true(in < bytes * 6 / 10);
		/* Another encode on the same budget reads nothing. */
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &o, &enc, &len, NULL,
						      &err), -E2BIG);
		assert_null(enc);
		assert_int_equal(atomic_load(&b.in), in);
		/* The sparse child (an element in 61 changed) pays: encoded
		 * whole under a fresh budget, the same bytes as without one. */
		struct proto_delta_budget fresh = {.limit = bytes / 2};
		o.budget = &fresh;
		uint8_t *enc2 = NULL;
		size_t len2 = 0;
		struct proto_delta_opts plain = {.threads = threads, .chunk_elems = 1000};
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &o, &enc, &len, NULL,
						      &err), 0);
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &plain, &enc2, &len2,
						      NULL, &err), 0);
		assert_int_equal(len, len2);
		assert_memory_equal(enc, enc2, len);
		assert_false(atomic_load(&fresh.over));
		assert_int_equal(atomic_load(&fresh.in), bytes);
		assert_true(atomic_load(&fresh.out) > 0 && atomic_load(&fresh.out) < len);
		free(enc);
		free(enc2);
		free(dense);
		pd_fini(&pd);
	}
	fx_fini(&f);
}

/* Where a piece lies in a source rank's memory: one stretch, or not. */
struct stretch {
	uint64_t at, end;
	bool any, ok;
};

static void stretch_span(void *arg, uint64_t at, uint64_t n)
{
	struct stretch *r = arg;

	if (!r->any)
		r->at = r->end = at;
	r->ok &= !r->any || at == r->end;
	r->any = true;
	r->end = at + n;
}

/* The publisher's encode from its two snapshots: one pair of trainer rank
 * blocks (the parent's, and the child's with an element in 61 changed)
 * serves the parcels of two layouts; each parcel's delta encoded with its
 * pieces read where they lie in the blocks (proto_dparcel_encode_at; the
 * pieces that are not one stretch there gathered on their own), or with
 * every stretch the scan reads located by opts.locate (in the blocks, or
 * gathered into the thread's room: the publisher's way), is byte for byte
 * the delta of the gathered payloads. tp1 reads every piece in place,
 * tp2 gathers its column shards' pieces (rows of a row-split trainer rank). */
struct loc_ctx {
	const struct proto_plan *plan;
	const struct proto_parcel *pc;
	const struct proto_layout *src;
	const struct proto_dparcel *dp;
	const uint8_t *pb, *cb;
	_Atomic uint64_t located, gathered;
};

static void locate_in(void *arg, uint32_t t, uint64_t base, uint64_t n, uint8_t *room,
		      const uint8_t **a, const uint8_t **b)
{
	struct loc_ctx *c = arg;
	const struct proto_dpiece *pp = &c->dp->pieces[t];
	uint64_t off = pp->pay_off + base * pp->elsize, len = n * pp->elsize;
	struct stretch st = {.ok = true};

	proto_parcel_src_spans(c->plan, c->pc, c->src, off, len, stretch_span, &st);
	if (st.ok && st.any && st.end - st.at == len) {
		*a = c->pb + st.at;
		*b = c->cb + st.at;
		atomic_fetch_add(&c->located, 1);
		return;
	}
	proto_parcel_gather(c->plan, c->pc, c->src, c->cb, off, len, room);
	proto_parcel_gather(c->plan, c->pc, c->src, c->pb, off, len, room + len);
	*b = room;
	*a = room + len;
	atomic_fetch_add(&c->gathered, 1);
}
static void test_encode_at(void **state)
{
	const char *dsts[] = {"tp1", "tp2"};
	uint64_t gathered[2] = {0, 0}, inplace[2] = {0, 0};
	struct fx f;
	uint8_t *child[2];

	fx_init(&f, "tp1");
	for (uint32_t r = 0; r < 2; r++) {
		child[r] = malloc(f.src.ranks[r].nbytes + 1);
		assert_non_null(child[r]);
		memcpy(child[r], f.srcblk[r], f.src.ranks[r].nbytes);
		for (uint64_t i = 0; i + 2 <= f.src.ranks[r].nbytes; i += 2 * 61)
			child[r][i] ^= 1;
	}
	for (size_t d = 0; d < 2; d++) {
		struct proto_layout dst;
		struct proto_plan plan;
		struct proto_err err;
		assert_int_equal(proto_layout_builtin(&f.m, dsts[d], &dst, &err), 0);
		assert_int_equal(proto_plan_build(&f.m, &f.src, &dst, &plan, &err), 0);
		for (uint32_t k = 0; k < plan.nparcels; k++) {
			const struct proto_parcel *pc = &plan.parcels[k];
			const uint8_t *pb = f.srcblk[pc->src_rank], *cb = child[pc->src_rank];
			struct proto_dparcel dp;
			uint8_t *par = malloc(pc->bytes + 1), *chi = malloc(pc->bytes + 1);
			uint8_t *enc = NULL, *enc2 = NULL;
			size_t len = 0, len2 = 0;
			assert_true(par != NULL && chi != NULL);
			assert_int_equal(proto_dparcel_build(&f.m, &plan, pc, &dst, &dp, &err), 0);
			proto_parcel_gather(&plan, pc, &f.src, pb, 0, pc->bytes, par);
			proto_parcel_gather(&plan, pc, &f.src, cb, 0, pc->bytes, chi);
			const uint8_t **pd = calloc(dp.npieces + 1, sizeof(*pd));
			const uint8_t **cd = calloc(dp.npieces + 1, sizeof(*cd));
			assert_true(pd != NULL && cd != NULL);
			for (uint32_t i = 0; i < dp.npieces; i++) {
				const struct proto_dpiece *pp = &dp.pieces[i];
				struct stretch st = {.ok = true};
				proto_parcel_src_spans(&plan, pc, &f.src, pp->pay_off, pp->len,
						       stretch_span, &st);
				if (st.ok && st.any && st.end - st.at == pp->len) {
					pd[i] = pb + st.at;
					cd[i] = cb + st.at;
					inplace[d]++;
				} else {
					pd[i] = par + pp->pay_off;
					cd[i] = chi + pp->pay_off;
					gathered[d]++;
				}
			}
			struct proto_delta_opts o = {.threads = 2, .chunk_elems = 1000};
			assert_int_equal(proto_dparcel_encode_at(&dp, pd, cd, &o, &enc, &len, NULL, &err),
					 0);
			assert_int_equal(proto_dparcel_encode(&dp, par, chi, &o, &enc2, &len2, NULL, &err),
					 0);
			assert_int_equal(len, len2);
			assert_memory_equal(enc, enc2, len);
			free(enc);
			/* Every stretch located: data[] only the blocks' bases. */
			struct loc_ctx lc = {&plan, pc, &f.src, &dp, pb, cb, 0, 0};
			for (uint32_t i = 0; i < dp.npieces; i++) {
				pd[i] = pb;
				cd[i] = cb;
			}
			o.locate = locate_in;
			o.locate_arg = &lc;
			o.threads = 1;
			assert_int_equal(proto_dparcel_encode_at(&dp, pd, cd, &o, &enc, &len, NULL, &err),
					 0);
			assert_int_equal(len, len2);
			assert_memory_equal(enc, enc2, len);
			assert_true(lc.located > 0);
			free(enc);
			free(enc2);
			free(pd);
			free(cd);
			free(par);
			free(chi);
			proto_dparcel_fini(&dp);
		}
		proto_plan_fini(&plan);
		proto_layout_fini(&dst);
	}
	assert_true(inplace[0] > 0 && gathered[0] == 0);
	assert_true(inplace[1] > 0 && gathered[1] > 0);
	for (uint32_t r = 0; r < 2; r++)
		free(child[r]);
	fx_fini(&f);
}

/* The child's piece checksums an encode hands back are the block's, and so
 * are those a summer fed with the payload in steps gives; an encode given
 * the parent's (as the publisher takes them from the encode or the anchor's
 * gather that made the parent) writes the same bytes as one that sums the
 * parent itself; given wrong ones, its delta is refused on the true parent. */
static void test_known_sums(void **state)
{
	struct fx f;

	fx_init(&f, "tp2");
	for (uint32_t k = 0; k < f.plan.nparcels; k++) {
		struct pdelta pd;
		struct proto_err err;
		uint8_t *enc2, *enc3;
		size_t len2, len3;

		pd_init(&f, k, false, &pd);
		uint64_t *csums = calloc(pd.dp.npieces + 1, sizeof(*csums));
		uint64_t *psums = calloc(pd.dp.npieces + 1, sizeof(*psums));
		assert_non_null(csums);
		assert_non_null(psums);
		uint8_t *pblk = pd_parent(&f, &pd);
		proto_dparcel_sums(&pd.dp, pblk, psums);
		proto_dparcel_sums(&pd.dp, pd.want, pd.sums);
		/* The same sums fed from the payload as a gather makes it, in
		 * steps that cut elements (an anchor's, for the first delta). */
		struct proto_dparcel_summer su;
		uint64_t *fed = malloc(((size_t)pd.dp.npieces + 1) * sizeof(*fed));
		assert_non_null(fed);
		proto_dparcel_summer_init(&su, &pd.dp, fed);
		for (uint64_t at = 0; at < pd.pc->bytes;) {
			at = PROTO_MIN(at + 7 + at % 5, pd.pc->bytes);
			proto_dparcel_summer_feed(&su, pd.par, at);
		}
		assert_int_equal(su.k, pd.dp.npieces);
		assert_memory_equal(fed, psums, pd.dp.npieces * sizeof(*fed));
		free(fed);
		struct proto_delta_opts o = {.threads = 2, .child_sums = csums, .parent_sums = psums};
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &o, &enc2, &len2, NULL,
						      &err), 0);
		assert_memory_equal(csums, pd.sums, pd.dp.npieces * sizeof(*csums));
		assert_int_equal(len2, pd.len);
		assert_memory_equal(enc2, pd.enc, len2);
		psums[0] ^= 1;
		assert_int_equal(proto_dparcel_encode(&pd.dp, pd.par, pd.chi, &o, &enc3, &len3, NULL,
						      &err), 0);
		assert_int_not_equal(proto_dparcel_apply(&pd.dp, enc3, len3, pblk, 2, &err), 0);
		assert_int_equal(proto_dparcel_apply(&pd.dp, enc2, len2, pblk, 2, &err), 0);
		assert_memory_equal(pblk, pd.want, pd.n);
		free(enc2);
		free(enc3);
		free(pblk);
		free(csums);
		free(psums);
		pd_fini(&pd);
	}
	fx_fini(&f);
}

/* Every refusal leaves the block as it was and says why. */
static void test_refusals(void **state)
{
	struct fx f;
	fx_init(&f, "tp2");
	struct pdelta pd;
	struct proto_dparcel dq;
	struct proto_err err;

	pd_init(&f, 0, false, &pd);
	struct proto_dparcel *dp = &pd.dp;
	uint8_t *enc = pd.enc;
	size_t len = pd.len, n = pd.n;
	assert_int_equal(proto_dparcel_build(&f.m, &f.plan, &f.plan.parcels[1], &f.dst, &dq, &err), 0);
	uint8_t *blk = pd_parent(&f, &pd), *orig = malloc(n);
	memcpy(orig, blk, n);

	/* Truncated anywhere. */
	for (size_t cut = 0; cut < len; cut += len / 7 + 1) {
		assert_int_not_equal(proto_dparcel_apply(dp, enc, cut, blk, 1, &err), 0);
		assert_true(strlen(err.msg) > 0);
		assert_memory_equal(blk, orig, n);
	}
	/* Forged: one byte flipped in the body (zstd checksums, the checksum
	 * after apply) or in the header (its hash). */
	for (size_t at = 0; at < len; at += len / 11 + 1) {
		enc[at] ^= 0x10;
		assert_int_not_equal(proto_dparcel_apply(dp, enc, len, blk, 1, &err), 0);
		assert_memory_equal(blk, orig, n);
		enc[at] ^= 0x10;
	}
	/* A damaged parent: its checksums, taken from the block, are not the
	 * delta's parent's. */
	uint64_t mid = dp->pieces[dp->npieces / 2].dst_off + 2;
	blk[mid] ^= 0x01;
	memcpy(orig, blk, n);
	assert_int_not_equal(proto_dparcel_apply(dp, enc, len, blk, 1, &err), 0);
	assert_non_null(strstr(err.msg, "another parent"));
	assert_memory_equal(blk, orig, n);
	blk[mid] ^= 0x01;
	memcpy(orig, blk, n);
	/* A delta for another parcel's pieces. */
	if (dq.npieces != dp->npieces || dq.pieces[0].len != dp->pieces[0].len) {
		assert_int_not_equal(proto_dparcel_apply(&dq, enc, len, blk, 1, &err), 0);
		assert_memory_equal(blk, orig, n);
	}
	/* And the intact delta still applies. */
	assert_int_equal(proto_dparcel_apply(dp, enc, len, blk, 1, &err), 0);
	free(orig);
	free(blk);
	proto_dparcel_fini(&dq);
	pd_fini(&pd);
	fx_fini(&f);
}

/* The trusted apply (a rotation's catch-up): it reads only the changed
 * positions, so it patches a parent damaged elsewhere without refusing it
 * (the next apply, which takes its parent checksums from the block, does);
 * a truncated or forged delta is still refused, the block as it was. */
static void test_apply_trusted(void **state)
{
	struct fx f;
	fx_init(&f, "tp2");
	struct pdelta pd;
	struct proto_err err;

	pd_init(&f, 0, false, &pd);
	uint8_t *enc = pd.enc, *want = pd.want;
	size_t len = pd.len, n = pd.n;
	uint8_t *blk = pd_parent(&f, &pd), *orig = malloc(n);
	assert_non_null(orig);
	memcpy(orig, blk, n);
	for (size_t cut = 0; cut < len; cut += len / 5 + 1) {
		assert_int_not_equal(proto_dparcel_apply_trusted(&pd.dp, enc, cut, blk, 1, &err), 0);
		assert_memory_equal(blk, orig, n);
	}
	enc[len / 2] ^= 0x10;
	assert_int_not_equal(proto_dparcel_apply_trusted(&pd.dp, enc, len, blk, 1, &err), 0);
	assert_memory_equal(blk, orig, n);
	enc[len / 2] ^= 0x10;
	assert_int_equal(proto_dparcel_apply_trusted(&pd.dp, enc, len, blk, 2, &err), 0);
	assert_memory_equal(blk, want, n);
	/* Damaged at an odd byte (the parcel's changes are at even ones). */
	uint64_t mid = pd.dp.pieces[pd.dp.npieces / 2].dst_off + 3;
	orig[mid] ^= 0x01;
	want[mid] ^= 0x01;
	assert_int_equal(proto_dparcel_apply_trusted(&pd.dp, enc, len, orig, 1, &err), 0);
	assert_memory_equal(orig, want, n);
	free(orig);
	free(blk);
	pd_fini(&pd);
	fx_fini(&f);
}

/* The apply of a node that keeps its slot's checksums (apply_known) reads
 * nothing but the changed positions: with every page of the block that
 * holds no change made unreadable (PROT_NONE), it applies bit for bit and
 * hands back the child's checksums. Given a parent damaged at a changed
 * position it is refused (the touched checksums), the block as it was;
 * without kept checksums it reads them from the block. */
static void test_apply_known(void **state)
{
	struct fx f;
	struct proto_dparcel dp;
	struct proto_err err;
	uint8_t *par, *chi, *enc;
	size_t len;

	fx_init(&f, "tp2");
	const struct proto_parcel *pc = &f.plan.parcels[0];
	size_t n = f.dst.ranks[pc->dst_rank].nbytes, page = (size_t)sysconf(_SC_PAGESIZE);
	size_t mapped = (n + page - 1) / page * page;
	assert_int_equal(proto_dparcel_build(&f.m, &f.plan, pc, &f.dst, &dp, &err), 0);
	payloads(&f, pc, &par, &chi);
	memcpy(chi, par, pc->bytes);
	for (uint64_t i = 4096; i + 2 <= pc->bytes; i += 64 << 10) /* one change in 64 KiB */
		chi[i] ^= 1;
	assert_int_equal(proto_dparcel_encode(&dp, par, chi, NULL, &enc, &len, NULL, &err), 0);
	uint8_t *orig = block_of(&f, pc->dst_rank, pc, par), *want = block_of(&f, pc->dst_rank, pc, chi);
	uint64_t *psums = calloc(dp.npieces + 1, sizeof(*psums));
	uint64_t *csums = calloc(dp.npieces + 1, sizeof(*csums));
	uint64_t *wsums = calloc(dp.npieces + 1, sizeof(*wsums));
	assert_true(psums != NULL && csums != NULL && wsums != NULL);
	proto_dparcel_sums(&dp, orig, psums);
	proto_dparcel_sums(&dp, want, wsums);
	uint8_t *blk = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	assert_true(blk != MAP_FAILED);
	memcpy(blk, orig, n);
	size_t hidden = 0, open = 0;
	for (size_t at = 0; at < mapped; at += page) {
		size_t k = PROTO_MIN(page, n > at ? n - at : 0);
		if (k > 0 && memcmp(orig + at, want + at, k) != 0) {
			open++;
			continue;
		}
		assert_int_equal(mprotect(blk + at, page, PROT_NONE), 0);
		hidden++;
	}
	print_message("apply_known: %zu pages readable (changed), %zu not\n", open, hidden);
	assert_true(open >= 4 && hidden > 8 * open);
	assert_int_equal(proto_dparcel_apply_known(&dp, enc, len, blk, psums, csums, 2, &err), 0);
	assert_int_equal(mprotect(blk, mapped, PROT_READ | PROT_WRITE), 0);
	assert_memory_equal(blk, want, n);
	assert_memory_equal(csums, wsums, dp.npieces * sizeof(*csums));
	/* Damaged at a changed position: refused, the block as it was. */
	memcpy(blk, orig, n);
	size_t at = 0;
	while (blk[at] == want[at])
		at++;
	blk[at] ^= 0x80;
	memcpy(orig, blk, n);
	assert_int_not_equal(proto_dparcel_apply_known(&dp, enc, len, blk, psums, NULL, 1, &err), 0);
	assert_non_null(strstr(err.msg, "the parent differs where the delta writes"));
	assert_memory_equal(blk, orig, n);
	/* No kept checksums: read from the (damaged) block, which is refused. */
	assert_int_not_equal(proto_dparcel_apply_known(&dp, enc, len, blk, NULL, NULL, 1, &err), 0);
	assert_non_null(strstr(err.msg, "another parent"));
	assert_memory_equal(blk, orig, n);
	munmap(blk, mapped);
	free(psums);
	free(csums);
	free(wsums);
	free(orig);
	free(want);
	free(enc);
	free(par);
	free(chi);
	proto_dparcel_fini(&dp);
	fx_fini(&f);
}

/* Prepared ahead, written later: the blocks are untouched until the write,
 * then equal the child, for sparse and dense changes and any pool size.
 * Every parcel of a destination rank is prepared on one pool and all are
 * written in one run of it (as an install writes them), into one block. */
static void test_dpatch_roundtrip(void **state)
{
	struct fx f;
	fx_init(&f, "tp2");
	uint32_t np = f.plan.nparcels;
	struct pdelta *pd = calloc(np, sizeof(*pd));
	struct proto_dpatch *pt = calloc(np, sizeof(*pt));
	struct proto_err err;

	for (uint32_t k = 0; k < np; k++)
		pd_init(&f, k, k == 1 /* every element changed: dense chunks */, &pd[k]);
	for (uint32_t r = 0; r < f.dst.nranks; r++) {
		size_t n = f.dst.ranks[r].nbytes;
		uint8_t *blk = calloc(1, n + 1), *orig = malloc(n + 1), *want = calloc(1, n + 1);
		for (uint32_t k = 0; k < np; k++)
			if (pd[k].pc->dst_rank == r) {
				proto_parcel_scatter(&f.plan, pd[k].pc, &f.dst, want, 0, pd[k].pc->bytes,
						     pd[k].chi);
				proto_parcel_scatter(&f.plan, pd[k].pc, &f.dst, orig, 0, pd[k].pc->bytes,
						     pd[k].par);
			}
		for (unsigned threads = 1; threads <= 3; threads++) {
			struct proto_dpatch_pool *pool = proto_dpatch_pool_new(threads);
			size_t m = 0;
			assert_non_null(pool);
			assert_int_equal(proto_dpatch_pool_size(pool), threads);
			memcpy(blk, orig, n);
			for (uint32_t k = 0; k < np; k++) {
				if (pd[k].pc->dst_rank != r)
					continue;
				proto_dparcel_sums(&pd[k].dp, blk, pd[k].sums);
				assert_int_equal(proto_dpatch_prepare(&pd[k].dp, pd[k].enc, pd[k].len, blk,
								      pd[k].sums, pool, &pt[m], &err), 0);
				assert_true(pt[m].nchanges > 0);
				m++;
			}
			assert_true(m > 0);
			assert_memory_equal(blk, orig, n);
			proto_dpatch_write(pt, m, pool);
			assert_memory_equal(blk, want, n);
			for (size_t i = 0; i < m; i++) {
				proto_dpatch_fini(&pt[i]);
				proto_dpatch_fini(&pt[i]); /* twice is harmless */
			}
			proto_dpatch_pool_free(pool);
		}
		free(want);
		free(orig);
		free(blk);
	}
	/* Without a pool: on the caller's thread alone. */
	uint8_t *blk = pd_parent(&f, &pd[0]);
	proto_dparcel_sums(&pd[0].dp, blk, pd[0].sums);
	assert_int_equal(proto_dpatch_prepare(&pd[0].dp, pd[0].enc, pd[0].len, blk, pd[0].sums, NULL,
					      &pt[0], &err), 0);
	proto_dpatch_write(pt, 1, NULL);
	assert_memory_equal(blk, pd[0].want, pd[0].n);
	proto_dpatch_fini(&pt[0]);
	free(blk);
	for (uint32_t k = 0; k < np; k++)
		pd_fini(&pd[k]);
	free(pt);
	free(pd);
	fx_fini(&f);
}

/* A delta that is truncated, forged, for another parent or another
 * parcel is refused by prepare, which writes nothing. */
static void test_dpatch_refusals(void **state)
{
	struct fx f;
	fx_init(&f, "tp2");
	struct pdelta pd;
	struct proto_dparcel dq;
	struct proto_dpatch pt;
	struct proto_err err;
	struct proto_dpatch_pool *pool = proto_dpatch_pool_new(2);

	pd_init(&f, 0, false, &pd);
	struct proto_dparcel *dp = &pd.dp;
	uint8_t *enc = pd.enc;
	uint64_t *sums = pd.sums;
	size_t len = pd.len, n = pd.n;
	assert_int_equal(proto_dparcel_build(&f.m, &f.plan, &f.plan.parcels[1], &f.dst, &dq, &err), 0);
	uint8_t *blk = pd_parent(&f, &pd), *orig = malloc(n);
	memcpy(orig, blk, n);
	proto_dparcel_sums(dp, blk, sums);

	for (size_t cut = 0; cut < len; cut += len / 7 + 1) {
		assert_int_not_equal(proto_dpatch_prepare(dp, enc, cut, blk, sums, pool, &pt, &err), 0);
		assert_true(strlen(err.msg) > 0);
		assert_null(pt.chunks);
	}
	for (size_t at = 0; at < len; at += len / 11 + 1) {
		enc[at] ^= 0x10;
		assert_int_not_equal(proto_dpatch_prepare(dp, enc, len, blk, sums, pool, &pt, &err), 0);
		assert_true(strlen(err.msg) > 0);
		enc[at] ^= 0x10;
	}
	/* The served block is not the delta's parent: checksums differ. */
	uint64_t mid = dp->pieces[dp->npieces / 2].dst_off + 2;
	blk[mid] ^= 0x01;
	uint64_t keep = sums[dp->npieces / 2];
	proto_dparcel_sums(dp, blk, sums);
	assert_int_not_equal(proto_dpatch_prepare(dp, enc, len, blk, sums, pool, &pt, &err), 0);
	assert_non_null(strstr(err.msg, "parent"));
	blk[mid] ^= 0x01;
	sums[dp->npieces / 2] = keep;
	/* Another parcel's pieces. */
	if (dq.npieces != dp->npieces || dq.pieces[0].len != dp->pieces[0].len)
		assert_int_not_equal(proto_dpatch_prepare(&dq, enc, len, blk, sums, pool, &pt, &err), 0);
	assert_memory_equal(blk, orig, n);
	/* And the intact delta still prepares and writes the child. */
	assert_int_equal(proto_dpatch_prepare(dp, enc, len, blk, sums, pool, &pt, &err), 0);
	proto_dpatch_write(&pt, 1, pool);
	proto_dpatch_fini(&pt);
	assert_memory_equal(blk, pd.want, n);
	proto_dpatch_pool_free(pool);
	free(orig);
	free(blk);
	proto_dparcel_fini(&dq);
	pd_fini(&pd);
	fx_fini(&f);
}

/*
 * Odd sizes and boundaries: tensors of 1, 2, 4 and 8 bytes an element whose
 * lengths are no multiple of the delta's chunk (an odd 4099 elements),
 * changed at the first and last element of every chunk and tensor and here
 * and there between (a piece's chunks start at its first element). Written
 * on 1 to 8 threads (more threads than some pieces have chunks), the block is the child bit for bit each time, so
 * the same as a serial write.
 */
static void test_dpatch_threads_odd_sizes(void **state)
{
	static const enum proto_dtype dt[] = {PROTO_DT_U8, PROTO_DT_BF16, PROTO_DT_FP32, PROTO_DT_I64};
	static const uint64_t rows[] = {3, 1001, 333, 7};
	static const uint64_t cols[] = {4099, 37, 29, 1};
	const uint32_t ce = 4099;
	struct proto_model m;
	struct proto_layout l;
	struct proto_plan plan;
	struct proto_err err;
	char name[8];

	proto_model_init(&m);
	for (size_t i = 0; i < PROTO_ARRAY_LEN(dt); i++) {
		uint64_t shape[2] = {rows[i], cols[i]};
		snprintf(name, sizeof(name), "t%zu", i);
		assert_int_equal(proto_model_add(&m, name, dt[i], 2, shape, &err), 0);
	}
	assert_int_equal(proto_model_finish(&m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp1", &l, &err), 0);
	assert_int_equal(proto_plan_build(&m, &l, &l, &plan, &err), 0);
	for (uint32_t k = 0; k < plan.nparcels; k++) {
		const struct proto_parcel *pc = &plan.parcels[k];
		struct proto_dparcel dp;
		struct proto_delta_opts o = {.chunk_elems = ce};
		uint8_t *par = malloc(pc->bytes), *chi = malloc(pc->bytes), *enc;
		size_t len, n = l.ranks[pc->dst_rank].nbytes;
		uint64_t x = 0x9e3779b97f4a7c15ull;

		assert_int_equal(proto_dparcel_build(&m, &plan, pc, &l, &dp, &err), 0);
		for (uint64_t i = 0; i < pc->bytes; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			par[i] = (uint8_t)x;
		}
		memcpy(chi, par, pc->bytes);
		for (uint32_t i = 0; i < dp.npieces; i++) {
			const struct proto_dpiece *pp = &dp.pieces[i];
			uint32_t w = pp->elsize;
			uint64_t ne = pp->len / w;
			for (uint64_t e = 0; e < ne; e++)
				if (e % ce == 0 || e % ce == ce - 1 || e == ne - 1 || e % 97 == 5)
					chi[pp->pay_off + e * w + (e % w)] ^= 0x40;
		}
		assert_int_equal(proto_dparcel_encode(&dp, par, chi, &o, &enc, &len, NULL, &err), 0);
		uint8_t *want = calloc(1, n), *blk = malloc(n);
		uint64_t *sums = malloc((dp.npieces + 1) * sizeof(*sums));
		proto_parcel_scatter(&plan, pc, &l, want, 0, pc->bytes, chi);
		for (unsigned threads = 1; threads <= 8; threads++) {
			struct proto_dpatch pt;
			struct proto_dpatch_pool *pool = proto_dpatch_pool_new(threads);
			assert_non_null(pool);
			memset(blk, 0, n);
			proto_parcel_scatter(&plan, pc, &l, blk, 0, pc->bytes, par);
			proto_dparcel_sums(&dp, blk, sums);
			assert_int_equal(proto_dpatch_prepare(&dp, enc, len, blk, sums, pool, &pt, &err), 0);
			proto_dpatch_write(&pt, 1, pool);
			assert_memory_equal(blk, want, n);
			proto_dpatch_fini(&pt);
			proto_dpatch_pool_free(pool);
		}
		free(sums);
		free(blk);
		free(want);
		free(enc);
		free(par);
		free(chi);
		proto_dparcel_fini(&dp);
	}
	proto_plan_fini(&plan);
	proto_layout_fini(&l);
	proto_model_fini(&m);
}

/*
 * Prepare maps the pages the write stores to as writable
 * (MADV_POPULATE_WRITE), so that the write takes no page fault. Here the
 * block's pages are shared copy-on-write with a child process (as after a
 * fork), so that a store to any of them would fault: after prepare the
 * write takes none, the block is the child version, and prepare itself
 * changed no byte.
 */
static void test_dpatch_pretouch(void **state)
{
#ifdef MADV_POPULATE_WRITE
	struct fx f;
	fx_init(&f, "tp2");
	struct pdelta pd;
	struct proto_dpatch pt;
	struct proto_err err;
	int fds[2];

	pd_init(&f, 0, false, &pd);
	size_t n = pd.n;
	uint8_t *blk = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	uint8_t *orig = pd_parent(&f, &pd);
	assert_true(blk != MAP_FAILED);
	memcpy(blk, orig, n);
	assert_int_equal(pipe(fds), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) { /* holds the pages until the test is done */
		char c;
		close(fds[1]);
		_exit(read(fds[0], &c, 1) < 0);
	}
	close(fds[0]);
	proto_dparcel_sums(&pd.dp, blk, pd.sums);
	assert_int_equal(proto_dpatch_prepare(&pd.dp, pd.enc, pd.len, blk, pd.sums, NULL, &pt, &err), 0);
	assert_memory_equal(blk, orig, n);
	struct rusage r0, r1;
	getrusage(RUSAGE_SELF, &r0);
	proto_dpatch_write(&pt, 1, NULL);
	getrusage(RUSAGE_SELF, &r1);
	assert_memory_equal(blk, pd.want, n);
	/* Without the pre-touch each changed page faults once (copy-on-write
	 * after the fork); with it, none should. The kernel may still fault a
	 * page now and then on its own (compaction migrating it, on a busy
	 * machine), so the test allows an eighth of them. */
	long page = sysconf(_SC_PAGESIZE), faults = (long)(r1.ru_minflt + r1.ru_majflt) -
						     (long)(r0.ru_minflt + r0.ru_majflt);
	size_t changed = 0;
	for (size_t at = 0; at < n; at += (size_t)page)
		changed += memcmp(orig + at, pd.want + at, PROTO_MIN((size_t)page, n - at)) != 0;
	print_message("pre-touched write: %ld page faults, %zu pages changed\n", faults, changed);
	assert_true(changed >= 16);
	assert_true(faults <= (long)changed / 8);
	close(fds[1]);
	assert_int_equal(waitpid(child, NULL, 0), child);
	proto_dpatch_fini(&pt);
	munmap(blk, n);
	free(orig);
	pd_fini(&pd);
	fx_fini(&f);
#else
	print_message("skipped: built without MADV_POPULATE_WRITE\n");
#endif
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_known_sums),
		cmocka_unit_test(test_fill_and_limit),
		cmocka_unit_test(test_budget),
		cmocka_unit_test(test_encode_at),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_apply_trusted),
		cmocka_unit_test(test_apply_known),
		cmocka_unit_test(test_dpatch_roundtrip),
		cmocka_unit_test(test_dpatch_refusals),
		cmocka_unit_test(test_dpatch_threads_odd_sizes),
		cmocka_unit_test(test_dpatch_pretouch),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
