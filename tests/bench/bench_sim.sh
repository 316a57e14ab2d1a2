#!/bin/bash
# make bench-sim: the fanout simulator (tests/sim/, tessera-sim) on the
# scenarios of the scale issue. Prints a line per scenario and version:
#   N=100 tp1 anchor: T/(S/b)=1.30 p50=1.29 p99=1.30 trainer_upload/S=1.00 dup=0.0% tracker_req/s=106
# with the run's wall time, in three parts:
#   1. calibration: the scenarios of `make bench-fanout` (128 MiB, N = 8 and
#      16 on 100 Mbit/s links, fanout and star; N = 8 on 1 Gbit/s) and of
#      `make bench-sites` (two sites, 1 Gbit/s inside, 100 Mbit/s between) beside
#      the testbed's medians as last measured (tests/sim/README.md);
#   2. scale: T/(S/b) against N for fanout and star (fanout with where its
#      time over S/b went: downlinks idle, a chunk's spread), N in BENCH_SIM_NS
#      (default 8 16 32 64 128 256 512 1000; add 10000 for the largest,
#      about half an hour here; star to BENCH_SIM_STAR_MAX_N, default 64:
#      it is N x S/b exactly, and its simulated time grows as N), the
#      fluid bound (1.0: every downlink full from the start) and the
#      optimal chunked broadcast (C + ceil(log2 N) - 1 chunk times for C
#      chunks, every uplink the same: what an ideal BitTorrent-like swarm
#      could reach);
#   3. the model's size: the same swarm (N = BENCH_SIM_SIZE_N, default
#      256) with anchors of BENCH_SIM_SIZES MiB (default 128 512; 1024 takes
#      4 minutes here, and 20 at N = 1000): T/(S/b) and the time over
#      S/b in seconds and in chunk times, which stays about the same as S
#      grows (tests/sim/README.md, "Where the time over S/b goes"), with
#      each run's downlink idle time and chunk spread;
#   4. scenarios at N = BENCH_SIM_SCEN_N (default 256): churn (10 % leave,
#      10 % join), stragglers (5 % of links at a tenth; two anchors: the
#      second's members are the replicas that kept up with the first,
#      TESSERA_SWARM_SLOW), a trainer uplink
#      4 x a replica's, mixed layouts (tp1/tp2/tp4/tp8), two sites (the
#      replicas in turn; the trainer's link carries a copy per site: once
#      as fast as a replica's, once twice), an anchor and 3 deltas of 1 %.
# Writes into OUT (default build/bench-sim): scale.tsv, scale.svg (T/(S/b)
# against N) and curve.svg (per-replica completion of the largest fanout
# run). Simulated time is deterministic; only the wall times vary.
set -uo pipefail

SIM=${SIM:-build/sim/tessera-sim}
OUT=${OUT:-build/bench-sim}
NS=${BENCH_SIM_NS:-8 16 32 64 128 256 512 1000}
STARMAX=${BENCH_SIM_STAR_MAX_N:-64}
SCEN_N=${BENCH_SIM_SCEN_N:-256}
SIZE_N=${BENCH_SIM_SIZE_N:-256}
SIZES=${BENCH_SIM_SIZES:-128 512}
CHUNKS=1024 # 128 MiB in the node's 128 KiB chunks
mkdir -p "$OUT"
[ -x "$SIM" ] || { echo "bench-sim: $SIM is not built (make $SIM)"; exit 1; }

# run NAME ARGS...: one scenario; its lines, then its wall time.
run() {
	local name=$1 t0 t1
	shift
	t0=$(date +%s.%N)
	if ! "$SIM" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"; then
		echo "bench-sim: $name failed: $(tail -n 1 "$OUT/$name.err")"
		return 1
	fi
	t1=$(date +%s.%N)
	sed "s/\$/  [$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f s", b - a}')]/" "$OUT/$name.out"
}

ratio() { sed -n 's/.*T\/(S\/b)=\([0-9.]*\).*/\1/p' "$OUT/$1.out" | head -n 1; }

echo "== calibration: 128 MiB, as make bench-fanout (testbed medians: tests/sim/README.md)"
run cal8 --replicas 8
echo "   testbed N=8 100 Mbit/s fanout: 1.05-1.08"
run cal16 --replicas 16
echo "   testbed N=16 100 Mbit/s fanout: 1.06-1.09 (6 runs, with the herd turns and without)"
run cal8s --replicas 8 --star
run cal16s --replicas 16 --star
echo "   testbed stars: 1.00 x N (8.00 and 16.00 here)"
run cal8g --replicas 8 --link-mbps 1000
echo "   testbed N=8 1 Gbit/s fanout: 1.60 (9 processes on 2 cores: CPU-bound, not modelled)"
run calsites --replicas 12 --sites 2 --link-mbps 1000 --wan-mbps 100
echo "   testbed (make bench-sites; 4 replicas in A, 8 in B here 6 and 6): 1.01 x S into B, B's"
echo "   last active 11.4 s = 10.6 x S/b at 1 Gbit/s, the last replica here is B's"

echo "== scale: T/(S/b) against N (128 MiB, 100 Mbit/s, trainer link = replica link)"
printf 'n\tfanout\tstar\tideal\tbroadcast\n' >"$OUT/scale.tsv"
big=""
for n in $NS; do
	TESSERA_SIM_DETAIL=1 run "fan$n" --replicas "$n" --curve "$OUT/curve$n.txt" || break
	star=""
	if [ "$n" -le "$STARMAX" ]; then
		run "star$n" --replicas "$n" --star || break
		star=$(ratio "star$n")
	fi
	bc=$(python3 -c "import math; print('%.3f' % (1 + (math.ceil(math.log2($n)) - 1) / $CHUNKS))")
	printf '%s\t%s\t%s\t1.00\t%s\n' "$n" "$(ratio "fan$n")" "$star" "$bc" >>"$OUT/scale.tsv"
	big=$n
done

echo "== the model's size: N=$SIZE_N, 100 Mbit/s; the time over S/b (128 KiB chunk times)"
for mib in $SIZES; do
	TESSERA_SIM_DETAIL=1 run "size$mib" --replicas "$SIZE_N" --model-mib "$mib" || break
	awk -v mib="$mib" '/^  v1:/ { over = $6 - $3;
			printf "   %s MiB: T - S/b = %.2f s = %.0f chunk times\n", mib, over,
				over / (131072 * 8 / 100e6) }' "$OUT/size$mib.out"
done

echo "== scenarios at N=$SCEN_N (128 MiB, 100 Mbit/s)"
run churn --replicas "$SCEN_N" --churn 0.1
run stragglers --replicas "$SCEN_N" --stragglers 0.05 --anchors --versions 2
run trainer4x --replicas "$SCEN_N" --trainer-x 4
run mixed --replicas "$SCEN_N" --layouts tp1,tp2,tp4,tp8
run sites --replicas "$SCEN_N" --sites 2
run sites-trainer2x --replicas "$SCEN_N" --sites 2 --trainer-x 2
run deltas --replicas "$SCEN_N" --versions 4 --delta-ratio 0.01

python3 - "$OUT" "$big" <<'EOF'
import sys
out, big = sys.argv[1], sys.argv[2]
rows = [l.rstrip("\n").split("\t") for l in open(f"{out}/scale.tsv")][1:]
W, H, L, B, T, R = 640, 400, 70, 50, 30, 20
def svg(path, title, xlabel, ylabel, series, xlog, ylog=False):
    import math
    xs = [x for _, pts, _ in series for x, _ in pts]
    ys = [y for _, pts, _ in series for _, y in pts]
    if not xs:
        return
    fx = (lambda v: math.log2(v)) if xlog else (lambda v: v)
    fy = (lambda v: math.log10(v)) if ylog else (lambda v: v)
    x0, x1 = fx(min(xs)), fx(max(xs)) if max(xs) > min(xs) else fx(min(xs)) + 1
    y0, y1 = (fy(min(ys)) - 0.05, fy(max(ys)) + 0.05) if ylog else (0.0, max(ys) * 1.1 or 1)
    px = lambda v: L + (fx(v) - x0) / ((x1 - x0) or 1) * (W - L - R)
    py = lambda v: H - B - (fy(v) - y0) / (y1 - y0) * (H - B - T)
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W/2}" y="18" text-anchor="middle" font-size="14">{title}</text>',
         f'<line x1="{L}" y1="{H-B}" x2="{W-R}" y2="{H-B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H-B}" stroke="black"/>',
         f'<text x="{W/2}" y="{H-12}" text-anchor="middle">{xlabel}</text>',
         f'<text x="16" y="{H/2}" text-anchor="middle" transform="rotate(-90 16 {H/2})">{ylabel}</text>']
    xt = sorted(set(xs)) if xlog else [x0 + (x1 - x0) * k / 5 for k in range(6)]
    for x in xt:
        lab = f"{int(x)}" if float(x).is_integer() else f"{x:.3g}"
        o.append(f'<text x="{px(x):.1f}" y="{H-B+16}" text-anchor="middle">{lab}</text>')
    for k in range(6):
        v = y0 + (y1 - y0) * k / 5
        v = 10 ** v if ylog else v
        o.append(f'<text x="{L-6}" y="{py(v)+4:.1f}" text-anchor="end">{v:.2f}</text>')
        o.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W-R}" y2="{py(v):.1f}" stroke="#ddd"/>')
    for i, (name, pts, color) in enumerate(series):
        d = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        o.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{d}"/>')
        for x, y in pts if len(pts) == 1 else []:
            o.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{color}"/>')
        # The legend in the lower middle, clear of the star's line.
        o.append(f'<text x="{L+(W-L-R)*0.36:.0f}" y="{T+(H-B-T)*0.42+16*i:.0f}" fill="{color}">{name}</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")
num = lambda s: float(s) if s else None
fan = [(int(r[0]), num(r[1])) for r in rows if num(r[1]) is not None]
star = [(int(r[0]), num(r[2])) for r in rows if num(r[2]) is not None]
ideal = [(int(r[0]), 1.0) for r in rows]
bcast = [(int(r[0]), num(r[4])) for r in rows]
# BitTorrent: the testbed's measurement at N = 8 (100 Mbit/s, 128 MiB), a point.
svg(f"{out}/scale.svg", "last replica, T / (S/b), 128 MiB anchor, 100 Mbit/s links",
    "replicas (N)", "T / (S/b), log scale", [("fanout (simulated)", fan, "#1f77b4"),
    ("star (simulated)", star, "#d62728"), ("fluid bound (every downlink full)", ideal, "#2ca02c"),
    ("optimal chunked broadcast (C + log2 N - 1 chunk times)", bcast, "#ff7f0e"),
    ("BitTorrent, testbed N = 8 (measured)", [(8, 1.80)], "#9467bd")], True, True)
if big:
    t = sorted(float(l.split()[2]) for l in open(f"{out}/curve{big}.txt"))
    pts = [(x, (i + 1) / len(t) * 100) for i, x in enumerate(t)]
    svg(f"{out}/curve.svg", f"replicas done against time, N = {big} fanout",
        "seconds after export", "% of replicas done", [("fanout", pts, "#1f77b4")], False)
print(f"bench-sim: wrote {out}/scale.tsv, scale.svg" + (", curve.svg" if big else ""))
EOF
