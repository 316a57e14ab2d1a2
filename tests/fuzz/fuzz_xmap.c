/* libFuzzer target: cross-layout maps (proto/xmap.c) from a holder layout
 * as a tracker's /layouts answer gives it (JSON, hostile), over a small
 * fixed model, into a fixed tp2 destination: the layout is parsed, checked
 * complete and planned as a node does, then each destination rank's map is
 * built and asked for the pieces and windows of a chunk of each parcel of
 * the trainer's (tp1) plan. Every piece lies in its holder rank's memory
 * and every window in the staging area.
 *
 * Input: 8 bytes (u32 chunk offset, u16 chunk length, u8 window segments,
 * u8 staging cap in KiB), then the holder layout's JSON. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/plan.h"
#include "proto/spec.h"
#include "proto/xmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char fzx_model_json[] =
	"{\"tensors\":[{\"name\":\"W\",\"dtype\":\"bf16\",\"shape\":[4,4]},"
	"{\"name\":\"q\",\"dtype\":\"bf16\",\"shape\":[8,6]},"
	"{\"name\":\"k\",\"dtype\":\"bf16\",\"shape\":[4,6]},"
	"{\"name\":\"e\",\"dtype\":\"fp32\",\"shape\":[8,4,6]},"
	"{\"name\":\"n\",\"dtype\":\"fp32\",\"shape\":[16]}]}";

#define FZX_PIECES 256
#define FZX_WINS 64

/* Pieces and windows of payload [off, off+len) of parcel pc. */
static void fzx_chunk(const struct proto_xmap *x, const struct proto_plan *tp,
		      const struct proto_parcel *pc, const struct proto_layout *dst,
		      const struct proto_layout *hol, uint64_t off, uint64_t len, uint32_t segs,
		      uint64_t stage_cap)
{
	static struct proto_xpiece pcs[FZX_PIECES];
	static struct proto_xwin wins[FZX_WINS];
	uint64_t total = 0;
	size_t n = 0;
	int w;

	if (proto_xmap_pieces(x, tp, pc, dst, off, len, pcs, FZX_PIECES, &n) != 0)
		return;
	for (size_t i = 0; i < n; i++) {
		if (pcs[i].rank >= hol->nranks || pcs[i].len == 0 ||
		    pcs[i].src + pcs[i].len > hol->ranks[pcs[i].rank].nbytes ||
		    pcs[i].out + pcs[i].len > len)
			abort();
		total += pcs[i].len;
	}
	if (total != len)
		abort();
	w = proto_xmap_windows(pcs, n, stage_cap, segs, wins, FZX_WINS);
	if (w < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if ((int)pcs[i].win >= w || pcs[i].at + pcs[i].len > stage_cap)
			abort();
	for (int i = 0; i < w; i++)
		if (wins[i].nsegs == 0 || wins[i].nsegs > PROTO_XWIN_SEGS ||
		    wins[i].stage + wins[i].len > stage_cap || wins[i].rank >= hol->nranks)
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct proto_model m;
	static struct proto_layout tl, dst;
	static struct proto_plan tp;
	static int ready;
	struct proto_layout hol;
	struct proto_plan hp;
	struct proto_err err;
	json_t *root;

	if (!ready) {
		if (proto_model_parse(fzx_model_json, strlen(fzx_model_json), "model", &m, &err) != 0 ||
		    proto_layout_builtin(&m, "tp1", &tl, &err) != 0 ||
		    proto_layout_builtin(&m, "tp2", &dst, &err) != 0 ||
		    proto_plan_build(&m, &tl, &dst, &tp, &err) != 0)
			abort();
		ready = 1;
	}
	if (size < 8 || size > 4096) /* bound the work: rank counts come from the input */
		return 0;
	uint32_t off = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
		       (uint32_t)data[3] << 24;
	uint32_t len = (uint32_t)data[4] | (uint32_t)data[5] << 8;
	uint32_t segs = data[6] % (PROTO_XWIN_SEGS + 2);
	uint64_t stage_cap = (uint64_t)data[7] << 10;
	root = json_loadb((const char *)data + 8, size - 8, 0, NULL);
	if (root == NULL)
		return 0;
	/* Only layouts this target maps (at most 64 ranks) are parsed: the
	 * parser's cost grows with the ranks declared (a layout of 8192 ranks
	 * takes seconds under ASan), and the fuzzer, finding each count new,
	 * filled its corpus with them. fuzz_layout covers large counts. */
	json_t *nr = json_object_get(root, "ranks");
	if ((json_is_integer(nr) && (json_integer_value(nr) < 0 || json_integer_value(nr) > 64)) ||
	    json_array_size(nr) > 64) {
		json_decref(root);
		return 0;
	}
	if (proto_layout_from_json(&m, root, "holder layout", &hol, &err) != 0) {
		json_decref(root);
		return 0;
	}
	json_decref(root);
	if (hol.nranks <= 64 && proto_layout_check_complete(&m, &hol, &err) == 0 &&
	    proto_plan_build(&m, &hol, &dst, &hp, &err) == 0) {
		for (uint32_t d = 0; d < dst.nranks; d++) {
			struct proto_xmap x;
			if (proto_xmap_build(&hp, &hol, &dst, d, &x, &err) != 0)
				continue;
			for (uint64_t s = 0; s < x.nspans; s++)
				if (x.spans[s].rank >= hol.nranks ||
				    x.spans[s].src + x.spans[s].len > hol.ranks[x.spans[s].rank].nbytes ||
				    x.spans[s].dst + x.spans[s].len > dst.ranks[d].nbytes)
					abort();
			for (uint32_t i = 0; i < tp.nparcels; i++) {
				const struct proto_parcel *pc = &tp.parcels[i];
				if (pc->dst_rank != d || pc->bytes == 0)
					continue;
				uint64_t o = off % pc->bytes;
				fzx_chunk(&x, &tp, pc, &dst, &hol, o, PROTO_MIN(len, pc->bytes - o),
					  segs, stage_cap);
			}
			proto_xmap_fini(&x);
		}
		proto_plan_fini(&hp);
	}
	proto_layout_fini(&hol);
	return 0;
}
