/* The canary score: deterministic, sums of parcel parts equal the rank's
 * score in every layout pair, moved by one changed element, finite on
 * random bit patterns in every dtype; a delta's part from the encoder's
 * changes equals the full compare's. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "proto/canary.h"
#include "proto/delta.h"
#include "proto/fixture.h"
#include "proto/proto.h"

struct env {
	struct proto_model m;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	struct proto_err err;

	assert_non_null(e);
	assert_int_equal(proto_fixture_model(2 << 20, &e->m, &err), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	proto_model_fini(&e->m);
	free(e);
	return 0;
}

/* For src -> dst: the rank score of every destination rank (from the
 * fixture's block) equals the sum of its parcels' parts (from payloads
 * gathered out of the source blocks, as the publisher does). */
static void check_pair(const struct proto_model *m, const char *src_name, const char *dst_name)
{
	struct proto_layout src, dst;
	struct proto_plan plan;
	struct proto_err err;

	assert_int_equal(proto_layout_builtin(m, src_name, &src, &err), 0);
	assert_int_equal(proto_layout_builtin(m, dst_name, &dst, &err), 0);
	assert_int_equal(proto_plan_build(m, &src, &dst, &plan, &err), 0);
	uint8_t **sblk = calloc(src.nranks, sizeof(*sblk));
	assert_non_null(sblk);
	for (uint32_t r = 0; r < src.nranks; r++) {
		sblk[r] = malloc(src.ranks[r].nbytes + 1);
		assert_non_null(sblk[r]);
		proto_fixture_fill_rank(m, &src, r, 7, 3, sblk[r]);
	}
	for (uint32_t d = 0; d < dst.nranks; d++) {
		uint8_t *blk = malloc(dst.ranks[d].nbytes + 1);
		uint64_t want, sum = 0;
		assert_non_null(blk);
		proto_fixture_fill_rank(m, &dst, d, 7, 3, blk);
		assert_int_equal(proto_canary_rank(&dst.ranks[d], blk, dst.ranks[d].nbytes, &want), 0);
		for (uint32_t i = 0; i < plan.nparcels; i++) {
			const struct proto_parcel *pc = &plan.parcels[i];
			if (pc->dst_rank != d)
				continue;
			uint8_t *pay = malloc(pc->bytes + 1);
			assert_non_null(pay);
			proto_parcel_gather(&plan, pc, &src, sblk[pc->src_rank], 0, pc->bytes, pay);
			sum += proto_canary_parcel(&plan, pc, &dst, pay);
			free(pay);
		}
		assert_true(sum == want);
		assert_true(isfinite(proto_canary_value(want)));
		free(blk);
	}
	for (uint32_t r = 0; r < src.nranks; r++)
		free(sblk[r]);
	free(sblk);
	proto_plan_fini(&plan);
	proto_layout_fini(&src);
	proto_layout_fini(&dst);
}

static void test_parcels_add_up(void **state)
{
	struct env *e = *state;

	check_pair(&e->m, "fsdp2", "tp2");
	check_pair(&e->m, "fsdp2", "tp1");
	check_pair(&e->m, "tp2", "fsdp4");
	check_pair(&e->m, "fsdp4", "tp4");
}

/* A model of tensor "a" (rows x cols of dta) and, when nb > 0, "b" (nb of
 * dtb), planned from layout src to dst: what the tests below score. */
struct pair {
	struct proto_model m;
	struct proto_layout src, dst;
	struct proto_plan plan;
};

static void pair_make(struct pair *q, enum proto_dtype dta, uint64_t rows, uint64_t cols,
		      enum proto_dtype dtb, uint64_t nb, const char *src, const char *dst)
{
	struct proto_err err;
	uint64_t sa[2] = {rows, cols}, sb[1] = {nb};

	proto_model_init(&q->m);
	assert_int_equal(proto_model_add(&q->m, "a", dta, 2, sa, &err), 0);
	if (nb > 0)
		assert_int_equal(proto_model_add(&q->m, "b", dtb, 1, sb, &err), 0);
	assert_int_equal(proto_model_finish(&q->m, &err), 0);
	assert_int_equal(proto_layout_builtin(&q->m, src, &q->src, &err), 0);
	assert_int_equal(proto_layout_builtin(&q->m, dst, &q->dst, &err), 0);
	assert_int_equal(proto_plan_build(&q->m, &q->src, &q->dst, &q->plan, &err), 0);
}

static void pair_fini(struct pair *q)
{
	proto_plan_fini(&q->plan);
	proto_layout_fini(&q->src);
	proto_layout_fini(&q->dst);
	proto_model_fini(&q->m);
}

/* A parcel's part updated from its parent's part and the changed elements
 * alone equals the part computed from scratch, in every parcel of a layout
 * pair: a few scattered bytes changed, none, or every byte. */
static void test_update_from_changes(void **state)
{
	struct env *e = *state;
	struct proto_layout src, dst;
	struct proto_plan plan;
	struct proto_err err;

	assert_int_equal(proto_layout_builtin(&e->m, "fsdp2", &src, &err), 0);
	assert_int_equal(proto_layout_builtin(&e->m, "tp2", &dst, &err), 0);
	assert_int_equal(proto_plan_build(&e->m, &src, &dst, &plan, &err), 0);
	srand(11);
	for (uint32_t i = 0; i < plan.nparcels; i++) {
		const struct proto_parcel *pc = &plan.parcels[i];
		uint8_t *blk = malloc(src.ranks[pc->src_rank].nbytes + 1);
		uint8_t *par = malloc(pc->bytes + 1), *child = malloc(pc->bytes + 1);
		assert_true(blk != NULL && par != NULL && child != NULL);
		proto_fixture_fill_rank(&e->m, &src, pc->src_rank, 7, 3, blk);
		proto_parcel_gather(&plan, pc, &src, blk, 0, pc->bytes, par);
		uint64_t pp = proto_canary_parcel(&plan, pc, &dst, par);
		for (int round = 0; round < 3; round++) {
			memcpy(child, par, pc->bytes);
			for (uint64_t b = 0; round == 1 && b < pc->bytes; b++)
				if (rand() % 50 == 0)
					child[b] ^= (uint8_t)(1u << (rand() % 8));
			for (uint64_t b = 0; round == 2 && b < pc->bytes; b++)
				child[b] = (uint8_t)rand();
			uint64_t want = proto_canary_parcel(&plan, pc, &dst, child);
			assert_true(proto_canary_parcel_update(&plan, pc, &dst, pp, par, child) == want);
			if (round == 1 && pc->bytes > 0)
				assert_true(want != pp);
		}
		free(blk);
		free(par);
		free(child);
	}
	proto_plan_fini(&plan);
	proto_layout_fini(&src);
	proto_layout_fini(&dst);
}

/* Same bytes, same score; one changed element (even one low bit of a bf16
 * weight) moves it; another version differs; too short a block is refused. */
static void test_sensitive(void **state)
{
	struct env *e = *state;
	struct proto_layout l;
	struct proto_err err;
	uint64_t a, b, c;

	assert_int_equal(proto_layout_builtin(&e->m, "tp2", &l, &err), 0);
	const struct proto_rank *rk = &l.ranks[1];
	uint8_t *blk = malloc(rk->nbytes);
	assert_non_null(blk);
	proto_fixture_fill_rank(&e->m, &l, 1, 7, 3, blk);
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes, &a), 0);
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes, &b), 0);
	assert_true(a == b);
	/* The middle element of the last tensor: its low mantissa bit. */
	const struct proto_local *lt = &rk->locals[rk->nlocals - 1];
	uint64_t at = lt->offset + (lt->nelem / 2) * 2;
	blk[at] ^= 1;
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes, &c), 0);
	assert_true(c != a);
	blk[at] ^= 1;
	/* A sign flip of a first element. */
	blk[rk->locals[0].offset + 1] ^= 0x80;
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes, &c), 0);
	assert_true(c != a);
	proto_fixture_fill_rank(&e->m, &l, 1, 7, 4, blk);
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes, &c), 0);
	assert_true(c != a);
	c = 42;
	assert_int_equal(proto_canary_rank(rk, blk, rk->nbytes - 1, &c), -ERANGE);
	assert_true(c == 42);
	free(blk);
	proto_layout_fini(&l);
}

/* Random bit patterns (NaN, infinities, huge values) in every dtype give a
 * finite score that still depends on the order of rows and columns. */
/* The same for a tensor of every dtype whose rows (197 columns) do not
 * line up with the 64-byte blocks the update compares: changes scattered
 * over many rows, a run of them across a row's end, none. */
static void test_update_every_dtype(void **state)
{
	(void)state;
	for (int dt = PROTO_DT_BF16; dt <= PROTO_DT_I64; dt++) {
		struct pair q;
		pair_make(&q, (enum proto_dtype)dt, 64, 197, 0, 0, "fsdp2", "tp2");
		srand(13 + dt);
		for (uint32_t i = 0; i < q.plan.nparcels; i++) {
			const struct proto_parcel *pc = &q.plan.parcels[i];
			uint8_t *par = malloc(pc->bytes + 1), *child = malloc(pc->bytes + 1);
			assert_true(par != NULL && child != NULL);
			for (uint64_t b = 0; b < pc->bytes; b++)
				par[b] = (uint8_t)rand();
			uint64_t pp = proto_canary_parcel(&q.plan, pc, &q.dst, par);
			for (int round = 0; round < 3; round++) {
				memcpy(child, par, pc->bytes);
				for (uint64_t b = 0; round == 1 && b < pc->bytes; b++)
					if (rand() % 40 == 0)
						child[b] ^= (uint8_t)(1u << (rand() % 8));
				for (uint64_t b = 190; round == 2 && b < PROTO_MIN(pc->bytes, 900u); b++)
					child[b] ^= 0x10;
				uint64_t want = proto_canary_parcel(&q.plan, pc, &q.dst, child);
				assert_true(proto_canary_parcel_update(&q.plan, pc, &q.dst, pp, par, child) ==
					    want);
			}
			free(par);
			free(child);
		}
		pair_fini(&q);
	}
}

/* The vectorized BF16 row (proto_canary_elems) against the scalar terms:
 * a payload scored from scratch equals its update from an all-zero parent
 * (a zero's term is 0, so that is every element's term, each taken by the
 * scalar walk), for random bit patterns (NaN, infinities, subnormals) and
 * rows of every length around the vector widths. */
static void test_bf16_rows_match_scalar(void **state)
{
	(void)state;
	for (uint64_t cols = 1; cols <= 67; cols += 3) {
		struct pair q;
		pair_make(&q, PROTO_DT_BF16, 29, cols, 0, 0, "fsdp1", "tp1");
		srand((unsigned)(41 + cols));
		for (uint32_t i = 0; i < q.plan.nparcels; i++) {
			const struct proto_parcel *pc = &q.plan.parcels[i];
			uint8_t *pay = malloc(pc->bytes + 1), *zero = calloc(1, pc->bytes + 1);
			assert_true(pay != NULL && zero != NULL);
			for (uint64_t b = 0; b < pc->bytes; b++)
				pay[b] = (uint8_t)rand();
			assert_true(proto_canary_parcel(&q.plan, pc, &q.dst, pay) ==
				    proto_canary_parcel_update(&q.plan, pc, &q.dst, 0, zero, pay));
			free(pay);
			free(zero);
		}
		pair_fini(&q);
	}
}

/* A payload scored in spans cut anywhere at least an element apart
 * (mid-element too, as the publisher's stripes of chunks cut it), plus
 * the straddlers at each cut,
 * equals the whole parcel's part, in every dtype and parcel. */
static void test_spans_add_up(void **state)
{
	(void)state;
	for (int dt = PROTO_DT_BF16; dt <= PROTO_DT_I64; dt++) {
		struct pair q;
		pair_make(&q, (enum proto_dtype)dt, 64, 197, PROTO_DT_BF16, 333, "fsdp2", "tp2");
		srand(29 + dt);
		for (uint32_t i = 0; i < q.plan.nparcels; i++) {
			const struct proto_parcel *pc = &q.plan.parcels[i];
			struct proto_canary_map *map = proto_canary_map_new(&q.plan, pc, &q.dst);
			uint8_t *pay = malloc(pc->bytes + 1);
			assert_true(map != NULL && pay != NULL);
			for (uint64_t b = 0; b < pc->bytes; b++)
				pay[b] = (uint8_t)rand();
			uint64_t want = proto_canary_parcel(&q.plan, pc, &q.dst, pay);
			for (uint64_t step = 8; step < 4096; step = step * 3 + 1) {
				uint64_t sum = 0;
				for (uint64_t a = 0; a < pc->bytes; a += step) {
					sum += proto_canary_map_span(map, a, PROTO_MIN(step, pc->bytes - a),
								     pay);
					if (a > 0)
						sum += proto_canary_map_straddler(map, a, pay);
				}
				assert_true(sum == want);
			}
			proto_canary_map_free(map);
			free(pay);
		}
		pair_fini(&q);
	}
}

/* The encoder's changes (proto/delta.h's on_changes), summed through a
 * parcel map, as the publisher takes a delta's canary part. */
struct enc_sum {
	const struct proto_dparcel *dp;
	const struct proto_canary_map *map;
	_Atomic uint64_t sum;
	_Atomic uint64_t calls;
};

static void on_changes(void *arg, uint32_t t, uint64_t base, const uint32_t *pos, size_t k,
		       const uint8_t *parent, const uint8_t *child)
{
	struct enc_sum *c = arg;
	const struct proto_dpiece *pp = &c->dp->pieces[t];

	atomic_fetch_add(&c->sum, proto_canary_map_changes(c->map, pp->pay_off + base * pp->elsize,
							   pp->elsize, pos, k, parent, child));
	atomic_fetch_add(&c->calls, 1);
}

/* The part from the encoder's changes equals the full compare's (and the
 * score from scratch) for every dtype, in every parcel of fsdp2 -> tp2, with
 * nothing changed, a few scattered changes, one tensor changed whole and
 * the other untouched, and everything changed; on several threads over
 * small chunks, so that a piece's changes come in many calls. */
static void test_update_from_encoder(void **state)
{
	(void)state;
	for (int dt = PROTO_DT_BF16; dt <= PROTO_DT_I64; dt++) {
		struct pair q;
		struct proto_err err;
		pair_make(&q, (enum proto_dtype)dt, 48, 197, (enum proto_dtype)dt, 301, "fsdp2", "tp2");
		srand(17 + dt);
		for (uint32_t i = 0; i < q.plan.nparcels; i++) {
			const struct proto_parcel *pc = &q.plan.parcels[i];
			struct proto_dparcel dp;
			uint8_t *par = malloc(pc->bytes + 1), *child = malloc(pc->bytes + 1);
			assert_true(par != NULL && child != NULL);
			assert_int_equal(proto_dparcel_build(&q.m, &q.plan, pc, &q.dst, &dp, &err), 0);
			for (uint64_t b = 0; b < pc->bytes; b++)
				par[b] = (uint8_t)rand();
			uint64_t pp = proto_canary_parcel(&q.plan, pc, &q.dst, par);
			for (int round = 0; round < 4; round++) {
				memcpy(child, par, pc->bytes);
				for (uint64_t b = 0; round == 1 && b < pc->bytes; b++)
					if (rand() % 40 == 0)
						child[b] ^= (uint8_t)(1u << (rand() % 8));
				/* The parcel's first piece changed whole, the rest not. */
				for (uint64_t b = 0; round == 2 && b < dp.pieces[0].len; b++)
					child[dp.pieces[0].pay_off + b] ^= 0x21;
				for (uint64_t b = 0; round == 3 && b < pc->bytes; b++)
					child[b] = (uint8_t)~par[b];
				struct proto_canary_map *map = proto_canary_map_new(&q.plan, pc, &q.dst);
				struct enc_sum c = {.dp = &dp, .map = map};
				struct proto_delta_opts o = {.threads = 3, .chunk_elems = 100,
							     .on_changes = on_changes,
							     .changes_arg = &c};
				uint8_t *enc = NULL;
				size_t len = 0;
				assert_non_null(map);
				assert_int_equal(proto_dparcel_encode(&dp, par, child, &o, &enc, &len,
								      NULL, &err), 0);
				uint64_t want = proto_canary_parcel(&q.plan, pc, &q.dst, child);
				assert_true(proto_canary_parcel_update(&q.plan, pc, &q.dst, pp, par, child) ==
					    want);
				assert_true(pp + atomic_load(&c.sum) == want);
				if (round == 0)
					assert_true(atomic_load(&c.calls) == 0);
				else
					assert_true(atomic_load(&c.calls) > 0);
				free(enc);
				proto_canary_map_free(map);
			}
			proto_dparcel_fini(&dp);
			free(par);
			free(child);
		}
		pair_fini(&q);
	}
}

static void test_every_dtype(void **state)
{
	(void)state;
	uint8_t buf[8 * 64];
	uint64_t x = 0x1234567;

	for (size_t i = 0; i < sizeof(buf); i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		buf[i] = (uint8_t)(x >> 56);
	}
	for (int dt = PROTO_DT_BF16; dt <= PROTO_DT_I64; dt++) {
		size_t es = proto_dtype_size((enum proto_dtype)dt);
		uint64_t s = proto_canary_elems((enum proto_dtype)dt, 0, 8, 0, 64, buf);
		assert_true(isfinite(proto_canary_value(s)));
		/* Split in two, any way: the same sum. */
		uint64_t s1 = proto_canary_elems((enum proto_dtype)dt, 0, 8, 0, 13, buf);
		uint64_t s2 = proto_canary_elems((enum proto_dtype)dt, 0, 8, 13, 51, buf + 13 * es);
		assert_true(s1 + s2 == s);
		if (dt != PROTO_DT_BOOL) {
			/* Another tensor index or shape reads the same bytes otherwise. */
			assert_true(proto_canary_elems((enum proto_dtype)dt, 1, 8, 0, 64, buf) != s);
			assert_true(proto_canary_elems((enum proto_dtype)dt, 0, 16, 0, 64, buf) != s);
		}
	}
	/* NaN and infinities are clamped: finite, the same on every call, and
	 * +inf differs from -inf. */
	float nan[4] = {NAN, NAN, INFINITY, -INFINITY}, flip[4] = {NAN, NAN, -INFINITY, -INFINITY};
	uint64_t a = proto_canary_elems(PROTO_DT_FP32, 0, 2, 0, 4, (const uint8_t *)nan);
	assert_true(isfinite(proto_canary_value(a)));
	assert_true(a == proto_canary_elems(PROTO_DT_FP32, 0, 2, 0, 4, (const uint8_t *)nan));
	assert_true(a != proto_canary_elems(PROTO_DT_FP32, 0, 2, 0, 4, (const uint8_t *)flip));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parcels_add_up),
		cmocka_unit_test(test_update_from_changes),
		cmocka_unit_test(test_update_every_dtype),
		cmocka_unit_test(test_spans_add_up),
		cmocka_unit_test(test_bf16_rows_match_scalar),
		cmocka_unit_test(test_update_from_encoder),
		cmocka_unit_test(test_sensitive),
		cmocka_unit_test(test_every_dtype),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
