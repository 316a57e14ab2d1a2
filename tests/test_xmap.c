/* Cross-layout map tests: every chunk of every parcel of tp1, tp2 and tp4,
 * assembled from the ranks of a replica of each other layout through its
 * pieces and windows, equals what the trainer's ranks would send; and the
 * map's refusals (too many pieces, a range outside the parcel, a map that
 * lacks bytes, a staging budget too small). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proto/proto.h"
#include "proto/synth.h"
#include "tests/testutil.h"

static uint8_t elem_byte(uint32_t tensor, uint64_t idx, uint32_t b)
{
	uint64_t h = (idx + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)tensor << 40) ^ b;
	h ^= h >> 31;
	return (uint8_t)(h * 0xbf58476d1ce4e5b9ull >> 56);
}

static void elem_source(void *arg, uint32_t tensor, uint64_t first, uint64_t count, uint8_t *out)
{
	const struct proto_model *m = arg;
	size_t es = proto_dtype_size(m->tensors[tensor].dtype);
	for (uint64_t i = 0; i < count; i++)
		for (uint32_t b = 0; b < es; b++)
			out[i * es + b] = elem_byte(tensor, first + i, b);
}

static uint8_t **fill_ranks(const struct proto_model *m, const struct proto_layout *l)
{
	uint8_t **b = calloc(l->nranks, sizeof(*b));
	assert_non_null(b);
	for (uint32_t r = 0; r < l->nranks; r++) {
		b[r] = malloc(l->ranks[r].nbytes + 1);
		assert_non_null(b[r]);
		proto_layout_fill_rank(m, l, r, elem_source, (void *)m, b[r]);
	}
	return b;
}

static void free_ranks(uint8_t **b, uint32_t n)
{
	for (uint32_t r = 0; r < n; r++)
		free(b[r]);
	free(b);
}

#define PIECES_MAX 16384
#define WINS_MAX 4096

/* Assembles payload [off, off+len) of pc from the holder's rank memories
 * the way a node does: pieces, windows (up to segs ranges each, at most
 * max) read into staging, pieces copied out. Returns the ranks used (bit
 * mask) or -errno; *staged gets the bytes the windows read. */
static int assemble(const struct proto_xmap *x, const struct proto_plan *p,
		    const struct proto_parcel *pc, const struct proto_layout *dst, uint8_t **holder,
		    uint64_t off, uint64_t len, uint64_t stage_cap, uint32_t segs, size_t max,
		    uint64_t *staged, uint8_t *out)
{
	static struct proto_xpiece pcs[PIECES_MAX];
	static struct proto_xwin wins[WINS_MAX];
	size_t n = 0;
	int rc = proto_xmap_pieces(x, p, pc, dst, off, len, pcs, PIECES_MAX, &n);
	if (rc != 0)
		return rc;
	int w = proto_xmap_windows(pcs, n, stage_cap, segs, wins, PROTO_MIN(max, WINS_MAX));
	if (w < 0)
		return w;
	uint8_t *stage = malloc(stage_cap + 1);
	assert_non_null(stage);
	uint64_t sum = 0, at = 0;
	int ranks = 0;
	for (int i = 0; i < w; i++) {
		uint64_t put = wins[i].stage;
		assert_int_equal(wins[i].stage, at); /* back to back */
		assert_true(wins[i].stage + wins[i].len <= stage_cap);
		assert_true(wins[i].nsegs >= 1 && wins[i].nsegs <= segs);
		for (uint32_t k = 0; k < wins[i].nsegs; k++) {
			const struct proto_xseg *g = &wins[i].segs[k];
			assert_true(g->len > 0);
			if (k > 0) /* ranges in source order, apart */
				assert_true(g->src > wins[i].segs[k - 1].src + wins[i].segs[k - 1].len);
			memcpy(stage + put, holder[wins[i].rank] + g->src, g->len);
			put += g->len;
		}
		assert_int_equal(put - wins[i].stage, wins[i].len);
		at += wins[i].len;
		ranks |= 1 << wins[i].rank;
	}
	for (size_t i = 0; i < n; i++) {
		const struct proto_xwin *wi = &wins[pcs[i].win];
		assert_int_equal(pcs[i].rank, wi->rank);
		assert_true(pcs[i].at >= wi->stage && pcs[i].at + pcs[i].len <= wi->stage + wi->len);
		assert_true(pcs[i].out + pcs[i].len <= len);
		memcpy(out + pcs[i].out, stage + pcs[i].at, pcs[i].len);
		sum += pcs[i].len;
	}
	free(stage);
	assert_int_equal(sum, len); /* every byte exactly once */
	*staged = at;
	return ranks;
}

/* Every chunk of every parcel (fsdp2 trainer -> dst) from a holder replica. */
static void check_pair(const struct proto_model *m, const struct proto_layout *tl,
		       uint8_t **trainer, const char *dname, const char *hname, uint64_t chunk,
		       int *ranks_seen)
{
	struct proto_layout dst, hol;
	struct proto_plan tp, hp;
	struct proto_err err;

	assert_int_equal(proto_layout_builtin(m, dname, &dst, &err), 0);
	assert_int_equal(proto_layout_builtin(m, hname, &hol, &err), 0);
	assert_int_equal(proto_plan_build(m, tl, &dst, &tp, &err), 0);
	assert_int_equal(proto_plan_build(m, &hol, &dst, &hp, &err), 0);
	uint8_t **holder = fill_ranks(m, &hol);
	uint8_t *want = malloc(chunk), *got = malloc(chunk);
	assert_non_null(want);
	assert_non_null(got);
	*ranks_seen = 0;
	for (uint32_t d = 0; d < dst.nranks; d++) {
		struct proto_xmap x;
		assert_int_equal(proto_xmap_build(&hp, &hol, &dst, d, &x, &err), 0);
		assert_int_equal(x.nranks, hol.nranks);
		for (uint32_t i = 0; i < tp.nparcels; i++) {
			const struct proto_parcel *pc = &tp.parcels[i];
			if (pc->dst_rank != d)
				continue;
			for (uint64_t off = 0; off < pc->bytes; off += chunk) {
				uint64_t len = PROTO_MIN(chunk, pc->bytes - off);
				proto_parcel_gather(&tp, pc, tl, trainer[pc->src_rank], off, len, want);
				memset(got, 0xee, len);
				uint64_t staged;
				int r = assemble(&x, &tp, pc, &dst, holder, off, len, 2 * chunk,
						 PROTO_XWIN_SEGS, WINS_MAX, &staged, got);
				if (r <= 0)
					print_error("%s from %s: parcel %u off %llu: %d\n", dname, hname, i, (unsigned long long)off, r);
				assert_true(r > 0);
				*ranks_seen |= r;
				assert_memory_equal(want, got, len);
				assert_int_equal(staged, len); /* no byte read twice or in vain */
			}
		}
		proto_xmap_fini(&x);
	}
	free(want);
	free(got);
	free_ranks(holder, hol.nranks);
	proto_plan_fini(&tp);
	proto_plan_fini(&hp);
	proto_layout_fini(&dst);
	proto_layout_fini(&hol);
}

static void test_every_pair(void **state)
{
	const char *names[] = {"tp1", "tp2", "tp4"};
	struct proto_model m;
	struct proto_layout tl;
	struct proto_err err;
	int seen;

	assert_int_equal(proto_synth_model(2u << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &tl, &err), 0);
	uint8_t **trainer = fill_ranks(&m, &tl);
	for (int d = 0; d < 3; d++)
		for (int h = 0; h < 3; h++) {
			check_pair(&m, &tl, trainer, names[d], names[h], 64u << 10, &seen);
			/* A TP1 rank gathers from both ranks of a TP2 replica (from
			 * all four of a TP4's); every holder rank serves someone. */
			assert_int_equal(seen, (1 << (1 << h)) - 1);
		}
	/* Odd chunk sizes cut rows anywhere. */
	check_pair(&m, &tl, trainer, "tp1", "tp2", 12345, &seen);
	check_pair(&m, &tl, trainer, "tp4", "tp2", 777, &seen);
	free_ranks(trainer, tl.nranks);
	proto_layout_fini(&tl);
	proto_model_fini(&m);
}

/* A TP4 rank reading a TP2 holder: a row-parallel tensor's rows give one
 * short piece each, half of every holder row. Gathering reads take only
 * those bytes in a quarter of the reads; one range per read within the old
 * cap of 64 reads had to read the other half of the rows along. */
static void test_exact_reads(void **state)
{
	struct proto_model m;
	struct proto_layout tl, dst, hol;
	struct proto_plan tp, hp;
	struct proto_xmap x;
	struct proto_err err;
	const uint64_t chunk = 256u << 10;
	uint64_t need = 0, exact = 0, capped = 0, single = 0;

	assert_int_equal(proto_synth_model(4u << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &tl, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp4", &dst, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &hol, &err), 0);
	assert_int_equal(proto_plan_build(&m, &tl, &dst, &tp, &err), 0);
	assert_int_equal(proto_plan_build(&m, &hol, &dst, &hp, &err), 0);
	uint8_t **trainer = fill_ranks(&m, &tl), **holder = fill_ranks(&m, &hol);
	uint8_t *want = malloc(chunk), *got = malloc(chunk);
	assert_non_null(want);
	assert_non_null(got);
	assert_int_equal(proto_xmap_build(&hp, &hol, &dst, 1, &x, &err), 0);
	for (uint32_t i = 0; i < tp.nparcels; i++) {
		const struct proto_parcel *pc = &tp.parcels[i];
		if (pc->dst_rank != 1)
			continue;
		for (uint64_t off = 0; off < pc->bytes; off += chunk) {
			uint64_t len = PROTO_MIN(chunk, pc->bytes - off), st;
			proto_parcel_gather(&tp, pc, &tl, trainer[pc->src_rank], off, len, want);
			assert_true(assemble(&x, &tp, pc, &dst, holder, off, len, 2 * chunk,
					     PROTO_XWIN_SEGS, 1024, &st, got) > 0);
			assert_memory_equal(want, got, len);
			exact += st;
			assert_true(assemble(&x, &tp, pc, &dst, holder, off, len, 2 * chunk, 1, 64,
					     &st, got) > 0);
			assert_memory_equal(want, got, len);
			capped += st;
			assert_true(assemble(&x, &tp, pc, &dst, holder, off, len, 2 * chunk, 1, 4096,
					     &st, got) > 0);
			single += st;
			need += len;
		}
	}
	assert_int_equal(exact, need);
	assert_int_equal(single, need);
	assert_true(capped > need + need / 10); /* the gaps the cap read along */
	proto_xmap_fini(&x);
	free(want);
	free(got);
	free_ranks(trainer, tl.nranks);
	free_ranks(holder, hol.nranks);
	proto_plan_fini(&tp);
	proto_plan_fini(&hp);
	proto_layout_fini(&tl);
	proto_layout_fini(&dst);
	proto_layout_fini(&hol);
	proto_model_fini(&m);
}

struct truth {
	uint8_t *byte; /* per byte of the rank: counted */
	uint64_t total;
};

struct have_arg {
	uint32_t *cnt;
	uint8_t *map;
	uint64_t len;
};

static void have_span(void *arg, uint64_t at, uint64_t n)
{
	struct have_arg *h = arg;
	proto_xmap_have_add(h->cnt, h->map, h->len, at, n);
}

static void truth_span(void *arg, uint64_t at, uint64_t n)
{
	struct truth *t = arg;
	for (uint64_t k = 0; k < n; k++) {
		assert_int_equal(t->byte[at + k], 0); /* every byte from one chunk only */
		t->byte[at + k] = 1;
	}
	t->total += n;
}

/* A partial holder's have-map (tp2 rank 1 filled chunk by chunk): a block
 * is set only once every byte of it came (never ahead of its bytes), all
 * are set at the end, and covers() refuses ranges past the map. */
static void test_have_map(void **state)
{
	struct proto_model m;
	struct proto_layout tl, dst;
	struct proto_plan tp;
	struct proto_err err;
	const uint64_t chunk = 50000; /* cuts blocks anywhere */

	assert_int_equal(proto_synth_model(2u << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &tl, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &dst, &err), 0);
	assert_int_equal(proto_plan_build(&m, &tl, &dst, &tp, &err), 0);
	uint64_t len = dst.ranks[1].nbytes, nb = proto_xmap_have_len(len);
	assert_int_equal(nb, (len + PROTO_XMAP_HAVE_BLOCK - 1) / PROTO_XMAP_HAVE_BLOCK);
	uint32_t *cnt = calloc(nb, sizeof(*cnt));
	uint8_t *map = calloc(nb, 1);
	struct truth t = {calloc(len, 1), 0};
	assert_non_null(cnt);
	assert_non_null(map);
	assert_non_null(t.byte);
	/* Alignment gaps and the tail first (no chunk brings them), then chunk
	 * by chunk, the map beside the truth. */
	assert_int_equal(proto_xmap_rank_gaps(&dst.ranks[1], truth_span, &t), 0);
	assert_int_equal(proto_xmap_rank_gaps(&dst.ranks[1], have_span,
					      &(struct have_arg){cnt, map, len}), 0);
	assert_true(t.total > 0); /* this model's rank has some */
	for (uint32_t i = 0; i < tp.nparcels; i++) {
		const struct proto_parcel *pc = &tp.parcels[i];
		if (pc->dst_rank != 1)
			continue;
		for (uint64_t off = 0; off < pc->bytes; off += chunk) {
			uint64_t n = PROTO_MIN(chunk, pc->bytes - off);
			proto_parcel_dst_spans(&tp, pc, &dst, off, n, truth_span, &t);
			proto_parcel_dst_spans(&tp, pc, &dst, off, n, have_span,
					       &(struct have_arg){cnt, map, len});
			/* Never ahead of the bytes: a set block has all its bytes. */
			for (uint64_t b = 0; b < nb; b++) {
				uint64_t lo = b * PROTO_XMAP_HAVE_BLOCK;
				uint64_t hi = PROTO_MIN(lo + PROTO_XMAP_HAVE_BLOCK, len);
				bool all = true;
				for (uint64_t k = lo; k < hi && all; k++)
					all = t.byte[k] == 1;
				assert_int_equal(map[b] != 0, all);
				assert_int_equal(proto_xmap_have_covers(map, nb, lo, hi - lo), all);
			}
		}
	}
	assert_int_equal(t.total, len); /* gaps and parcels fill the rank exactly once */
	assert_true(proto_xmap_have_covers(map, nb, 0, len));
	assert_true(proto_xmap_have_covers(map, nb, len - 1, 1));
	assert_false(proto_xmap_have_covers(map, nb, 0, nb * PROTO_XMAP_HAVE_BLOCK + 1));
	assert_false(proto_xmap_have_covers(map, nb, UINT64_MAX - 5, 10));
	assert_true(proto_xmap_have_covers(map, nb, 12, 0));
	free(cnt);
	free(map);
	free(t.byte);
	proto_plan_fini(&tp);
	proto_layout_fini(&dst);
	proto_layout_fini(&tl);
	proto_model_fini(&m);
}

/* The refusals: each one a clean error, nothing half-written. */
static void test_refusals(void **state)
{
	struct proto_model m;
	struct proto_layout tl, t1, t2;
	struct proto_plan tp, hp;
	struct proto_xmap x;
	struct proto_err err;
	struct proto_xpiece pcs[8];
	struct proto_xwin wins[2];
	size_t n = 99;

	assert_int_equal(proto_synth_model(1u << 20, &m, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "fsdp2", &tl, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp1", &t1, &err), 0);
	assert_int_equal(proto_layout_builtin(&m, "tp2", &t2, &err), 0);
	assert_int_equal(proto_plan_build(&m, &tl, &t1, &tp, &err), 0);
	assert_int_equal(proto_plan_build(&m, &t2, &t1, &hp, &err), 0);
	/* A plan into another layout than the map's. */
	assert_int_equal(proto_xmap_build(&hp, &t2, &t2, 0, &x, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "differ"));
	assert_int_equal(x.nspans, 0);
	assert_int_equal(proto_xmap_build(&hp, &t2, &t1, 1, &x, &err), -EINVAL);
	assert_int_equal(proto_xmap_build(&hp, &t2, &t1, 0, &x, &err), 0);
	const struct proto_parcel *pc = &tp.parcels[0];
	/* Outside the parcel. */
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, pc->bytes - 1, 2, pcs, 8, &n), -ERANGE);
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, UINT64_MAX, 2, pcs, 8, &n), -ERANGE);
	/* The whole parcel needs more than 8 pieces (o_proj rows alternate). */
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, 0, pc->bytes, pcs, 8, &n), -ENOSPC);
	/* Nothing asked, nothing given. */
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, 0, 0, pcs, 8, &n), 0);
	assert_int_equal(n, 0);
	/* A map that lacks the bytes (a holder that does not cover them). */
	uint64_t keep = x.nspans;
	x.nspans = 0;
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, 0, 16, pcs, 8, &n), -ENOENT);
	x.nspans = keep;
	/* Windows: no room for any, a staging budget below the bytes. */
	assert_int_equal(proto_xmap_pieces(&x, &tp, pc, &t1, 0, 16, pcs, 8, &n), 0);
	assert_true(n >= 1);
	assert_int_equal(proto_xmap_windows(pcs, n, 1u << 20, 1, wins, 0), -ENOSPC);
	assert_int_equal(proto_xmap_windows(pcs, n, 15, 1, wins, 2), -ENOSPC);
	assert_true(proto_xmap_windows(pcs, n, 16, 1, wins, 2) >= 1);
	assert_int_equal(proto_xmap_windows(pcs, n, 16, 0, wins, 2), -EINVAL);
	assert_int_equal(proto_xmap_windows(pcs, n, 16, PROTO_XWIN_SEGS + 1, wins, 2), -EINVAL);
	proto_xmap_fini(&x);
	proto_xmap_fini(&x); /* twice is harmless */
	proto_plan_fini(&tp);
	proto_plan_fini(&hp);
	proto_layout_fini(&tl);
	proto_layout_fini(&t1);
	proto_layout_fini(&t2);
	proto_model_fini(&m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_pair),
		cmocka_unit_test(test_exact_reads),
		cmocka_unit_test(test_refusals),
		cmocka_unit_test(test_have_map),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
