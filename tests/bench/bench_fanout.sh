#!/bin/bash
# make bench-fanout (root): one publisher host and N TP1 replica hosts in
# network namespaces (deploy/netns-cluster.sh), every link shaped to
# 100 Mbit/s each way, one 128 MiB version; for N = 8 then 16, fanout then
# star. Prints per run T / (S/b) (T: the last replica's activation, from the
# manifest's creation; S: the bytes a replica holds; b: one lone TCP
# transfer over the same shaped links, measured in the same run), the
# trainer's upload / S and duplicates / bytes received, each beside the goal
# of the fanout issue. Every run is bounded (2 x N x S/b + 90 s); a run that
# does not finish says so.
#
# BENCH_FANOUT_N (default "8 16") and BENCH_FANOUT_MB (default 128) shrink it.
set -uo pipefail

BIN=${BIN:-build/bin}
NS=${BENCH_FANOUT_N:-8 16}
MB=${BENCH_FANOUT_MB:-128}
RATE=100mbit
RATE_BPS=$((100 * 1000000 / 8))
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d -t tessera-bench-fanout.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# Bound of one run, from the link rate (b is only measured inside it).
bound_s() { echo $((2 * $1 * MB * 1048576 / RATE_BPS + 90)); }
total=0
for n in $NS; do total=$((total + 2 * $(bound_s "$n"))); done
echo "bench-fanout: N in {$NS} TP1 replicas, one ${MB} MiB version, links $RATE;" \
	"fanout then star; at most $total s in all"

declare -A T_OF CPU_OF
run() { # n mode
	local n=$1 mode=$2 args=() i rep="$OUT/report-$1-$2.json" rc
	for i in $(seq 1 "$n"); do args+=(--replica tp1); done
	BIN=$BIN "$HERE/deploy/netns-cluster.sh" "${args[@]}" --mode "$mode" --rate "$RATE" \
		--synthetic-mb "$MB" --versions 1 --timeout "$(bound_s "$n")" --measure-link 32 \
		--report "$rep" --links "$OUT/links-$n-$mode.tsv" >"$OUT/run-$n-$mode.log" 2>&1
	rc=$?
	if [ $rc -ne 0 ] || [ ! -s "$rep" ]; then
		printf '  N=%-2s %-6s: did not finish within %s s (exit %s); last lines:\n' "$n" "$mode" \
			"$(bound_s "$n")" "$rc"
		grep -v '^metrics on' "$OUT/run-$n-$mode.log" | tail -n 4 | sed 's/^/    /'
		return
	fi
	# S: what a replica holds (trainer + peers); T: the last activation.
	jq -r --argjson n "$n" --arg mode "$mode" '
		.link_bytes_per_s as $b | .versions[-1] as $v
		| ($v.replicas | map(.bytes_from_trainer + .bytes_from_peers) | max) as $s
		| ($v.replicas | map(.t_activate_ms) | max / 1000) as $t
		| ($s / $b) as $sb
		| ($v.trainer_upload_bytes + $v.peer_upload_bytes + $v.duplicate_bytes) as $recv
		| "\($t) \($sb) \($s) \($b) \($v.trainer_upload_bytes / $s) \($v.peer_upload_bytes)"
		  + " \(if $recv > 0 then $v.duplicate_bytes / $recv * 100 else 0 end)"
		  + " \($v.refetched_bytes)"
		  + " \($v.replicas | map(.cpu_ms / 1000 / ((.bytes_from_trainer + .bytes_from_peers)
			/ 1073741824)) | sort | .[length / 2 | floor])"' "$rep" >"$OUT/fig"
	local t sb s b up peers dup refetched cpu
	read -r t sb s b up peers dup refetched cpu <"$OUT/fig"
	CPU_OF[$n-$mode]=$cpu
	T_OF[$n-$mode]=$t
	if [ "$mode" = fanout ]; then
		awk -v n="$n" -v t="$t" -v sb="$sb" -v s="$s" -v b="$b" -v up="$up" -v dup="$dup" \
			-v peers="$peers" -v ref="$refetched" 'BEGIN {
			printf "  N=%-2d fanout: T = %6.1f s = %5.2f x S/b (goal <= 1.15); trainer upload " \
			       "%5.2f x S (goal <= 1.05); duplicates %4.1f %% of received (goal < 2 %%); " \
			       "refetched %.1f MiB [S = %.1f MiB, b = %.2f MB/s, S/b = %.1f s]\n",
			       n, t, t / sb, up, dup, ref / 1048576, s / 1048576, b / 1e6, sb
			if (peers == 0)
				printf "         no byte came from a peer: nodes of this build do not serve " \
				       "peers, so this is a star run\n"
		}'
	else
		awk -v n="$n" -v t="$t" -v sb="$sb" -v s="$s" -v b="$b" -v up="$up" -v dup="$dup" \
			-v ref="$refetched" 'BEGIN {
			printf "  N=%-2d star:   T = %6.1f s = %5.2f x N*S/b (goal <= 1.1); trainer upload " \
			       "%5.2f x S; duplicates %4.1f %% of received; refetched %.1f MiB " \
			       "[S = %.1f MiB, b = %.2f MB/s, S/b = %.1f s]\n",
			       n, t, t / (n * sb), up, dup, ref / 1048576, s / 1048576, b / 1e6, sb
		}'
	fi
}

# Where the time went: the run's phase medians, CPU and how full the
# trainer's uplink was (netns-cluster.sh), and a replica's CPU time per GiB
# it received (median; its whole run, idle start included), steadier than
# wall time on a shared machine.
phases() { # n mode
	grep -E '^  (phases|CPU|trainer uplink|v[0-9]+: the trainer)' "$OUT/run-$1-$2.log" | sed 's/^  /         /'
	[ -z "${CPU_OF[$1-$2]:-}" ] ||
		awk -v c="${CPU_OF[$1-$2]}" 'BEGIN { printf "         CPU per replica: %.2f s per GiB received (median)\n", c }'
}
for n in $NS; do
	run "$n" fanout
	phases "$n" fanout
	run "$n" star
	phases "$n" star
done
if [ -n "${T_OF[8-fanout]:-}" ] && [ -n "${T_OF[16-fanout]:-}" ]; then
	awk -v a="${T_OF[8-fanout]}" -v b="${T_OF[16-fanout]}" 'BEGIN {
		printf "  fanout N=16 vs N=8: %+.1f %% (goal <= +5 %%)\n", (b / a - 1) * 100 }'
fi
