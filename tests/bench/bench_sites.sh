#!/bin/bash
# make bench-sites (root): two sites in network namespaces
# (deploy/netns-cluster.sh --sites): the trainer and 4 TP1 replicas in site
# A, 8 TP1 replicas in site B, every host link at 1 Gbit/s, the wide-area
# link between the sites at 100 Mbit/s each way; one 128 MiB anchor then
# deltas, a version every 25 s. Three runs with the sites told to every
# process, three with the same hosts and links but no site told (one swarm
# across the wide-area link: tessera before sites). Prints per run, then the
# medians of each kind, beside the goals of the sites issue:
#   - bytes into B over the wide-area link per version, against S (what one
#     replica of B holds): <= 1.1 x S for the anchor ("copies crossed");
#   - the last replica of B active, from the manifest's creation, against
#     1.2 x (S / b_wan + S / b_lan) (the links' nominal rates);
#   - each delta's bytes into B against S: <= 3 % of an anchor.
#
# BENCH_SITES_MB (default 128), BENCH_SITES_RUNS (default 3),
# BENCH_SITES_VERSIONS (default 3) and BENCH_SITES_B (replicas in B, default
# 8) shrink it. Every run is bounded (its --timeout).
set -uo pipefail

BIN=${BIN:-build/bin}
MB=${BENCH_SITES_MB:-128}
RUNS=${BENCH_SITES_RUNS:-3}
VERSIONS=${BENCH_SITES_VERSIONS:-3}
NB=${BENCH_SITES_B:-8}
NA=4
LAN_BPS=$((1000 * 1000000 / 8))
WAN_BPS=$((100 * 1000000 / 8))
EVERY_MS=25000
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d -t tessera-bench-sites.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
# A trained-like model (`tessera synth`: small updates per step), so that
# versions after the first go as deltas.
"$BIN/tessera" synth -o "$OUT/model" --synthetic-mb "$MB" --steps "$VERSIONS" >"$OUT/synth.log" 2>&1 ||
	{ echo "bench-sites: tessera synth failed:"; tail -n 5 "$OUT/synth.log"; exit 1; }
# A run: the anchor across the WAN (every copy crossing, at worst one per
# replica of B), the versions' clock, and setup.
BOUND=$((NB * MB * 1048576 / WAN_BPS + VERSIONS * EVERY_MS / 1000 + 120))
echo "bench-sites: trainer + $NA TP1 replicas in A, $NB in B; links 1gbit, WAN 100mbit;" \
	"$VERSIONS versions of ${MB} MiB (an anchor, then deltas), one every $((EVERY_MS / 1000)) s;" \
	"$RUNS runs with sites named, $RUNS unnamed; each at most $BOUND s"

REPLICAS=()
for _ in $(seq "$NA"); do REPLICAS+=(--replica tp1@A); done
for _ in $(seq "$NB"); do REPLICAS+=(--replica tp1@B); done

run() { # kind (named|unnamed) k
	local kind=$1 k=$2 args=()
	[ "$kind" = named ] || args=(--unnamed-sites)
	if ! BIN=$BIN "$HERE/deploy/netns-cluster.sh" --sites 2 "${args[@]}" "${REPLICAS[@]}" \
		--rate 1gbit --wan-rate 100mbit --model-dir "$OUT/model" --versions "$VERSIONS" \
		--every "$EVERY_MS" --timeout "$BOUND" --report "$OUT/$kind-$k.json" \
		>"$OUT/$kind-$k.log" 2>&1; then
		echo "bench-sites: $kind run $k failed:"
		tail -n 15 "$OUT/$kind-$k.log"
		return 1
	fi
	# One line: the anchor's copies into B, the last B replica's time
	# against the bound, the deltas into B against S.
	python3 - "$OUT/$kind-$k.json" "$kind" "$k" "$WAN_BPS" "$LAN_BPS" >>"$OUT/$kind.tsv" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
wan, lan = int(sys.argv[4]), int(sys.argv[5])
v1 = r["versions"][0]
reps = [x for x in v1["replicas"] if not x["late"]]
S = v1["anchor_bytes"] / len(reps)          # every replica is tp1
copies = v1["wan_bytes"]["B"]["in"] / S
last_b = max(x["t_activate_ms"] for x in reps if x["site"] == "B") / 1000
bound = 1.2 * (S / wan + S / lan)
deltas = [v["wan_bytes"]["B"]["in"] / S * 100 for v in r["versions"][1:] if v["kind"] == "delta"]
dmax = max(deltas) if deltas else float("nan")
print("%s\t%s\t%.3f\t%.2f\t%.3f\t%.2f" % (sys.argv[2], sys.argv[3], copies, last_b, last_b / bound, dmax))
sys.stderr.write("")
EOF
	tail -n 1 "$OUT/$kind.tsv" | awk -F'\t' '{printf "bench-sites: %s run %s: anchor into B %.2f x S, last replica of B active %.1f s = %.2f x 1.2 x (S/b_wan + S/b_lan), deltas into B at most %.2f %% of S\n", $1, $2, $3, $4, $5, $6}'
}

for k in $(seq "$RUNS"); do
	run named "$k"
	run unnamed "$k"
done
for kind in named unnamed; do
	[ -s "$OUT/$kind.tsv" ] || { echo "bench-sites: no $kind run finished"; continue; }
	python3 - "$OUT/$kind.tsv" "$kind" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
med = lambda i: statistics.median(float(x[i]) for x in rows)
goal = lambda ok: "meets the goal" if ok else "MISSES the goal"
c, t, tb, d = med(2), med(3), med(4), med(5)
print("bench-sites: %s, median of %d: anchor into B %.2f x S (goal <= 1.1: %s); last replica "
      "of B %.1f s = %.2f x the bound 1.2 x (S/b_wan + S/b_lan) (%s); deltas into B %.2f %% "
      "of S (goal <= 3 %%: %s)" % (sys.argv[2], len(rows), c, goal(c <= 1.1), t, tb,
                                    goal(tb <= 1.0), d, goal(d <= 3)))
EOF
done
