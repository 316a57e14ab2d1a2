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
# Then the same with N = 8 TP1 replicas on 1 Gbit/s links, fanout only, its
# T / (S/b) beside that goal (<= 1.5; b measured over those links with a
# 128 MiB transfer, S/b being about a second).
#
# BENCH_FANOUT_N (default "8 16") and BENCH_FANOUT_MB (default 128) shrink it;
# BENCH_FANOUT_RATE picks the links: 100mbit (the N = 8 and 16 runs only),
# 1gbit (the N = 8 fanout run on 1 Gbit/s links only) or all (default: both,
# 100 Mbit/s first); BENCH_FANOUT_GBIT_N (default 8) is N of the 1 Gbit/s run.
set -uo pipefail

BIN=${BIN:-build/bin}
NS=${BENCH_FANOUT_N:-8 16}
MB=${BENCH_FANOUT_MB:-128}
RATES=${BENCH_FANOUT_RATE:-all}
GBIT_N=${BENCH_FANOUT_GBIT_N:-8}
case $RATES in
all) RATES="100mbit 1gbit" ;;
100mbit | 1gbit) ;;
*) echo "bench-fanout: BENCH_FANOUT_RATE is 100mbit, 1gbit or all, not '$RATES'" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d -t tessera-bench-fanout.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

# Each rate: its bytes per second, the MiB of the lone TCP transfer that
# measures b, and the fanout goal on T / (S/b).
rate_bps() { case $1 in 100mbit) echo $((100 * 1000000 / 8)) ;; 1gbit) echo $((1000 * 1000000 / 8)) ;; esac; }
link_mb() { case $1 in 100mbit) echo 32 ;; 1gbit) echo 128 ;; esac; }
fanout_goal() { case $1 in 100mbit) echo 1.15 ;; 1gbit) echo 1.5 ;; esac; }
# Bound of one run, from the link rate (b is only measured inside it).
bound_s() { echo $((2 * $1 * MB * 1048576 / $(rate_bps "$2") + 90)); }
total=0 what=""
for rate in $RATES; do
	if [ "$rate" = 100mbit ]; then
		for n in $NS; do total=$((total + 2 * $(bound_s "$n" "$rate"))); done
		what="N in {$NS} TP1 replicas, links $rate, fanout then star"
	else
		total=$((total + $(bound_s "$GBIT_N" "$rate")))
		what="${what:+$what; then }N = $GBIT_N TP1 replicas, links $rate, fanout"
	fi
done
echo "bench-fanout: one ${MB} MiB version; $what; at most $total s in all"

declare -A T_OF CPU_OF
# The log, report and links file of a run: NAME is N-MODE at 100 Mbit/s (as
# before), N-MODE-RATE otherwise.
run_name() { if [ "$3" = 100mbit ]; then echo "$1-$2"; else echo "$1-$2-$3"; fi; }
run() { # n mode rate
	local n=$1 mode=$2 rate=$3 args=() name rc label
	name=$(run_name "$n" "$mode" "$rate")
	local rep="$OUT/report-$name.json"
	for _ in $(seq 1 "$n"); do args+=(--replica tp1); done
	BIN=$BIN "$HERE/deploy/netns-cluster.sh" "${args[@]}" --mode "$mode" --rate "$rate" \
		--synthetic-mb "$MB" --versions 1 --timeout "$(bound_s "$n" "$rate")" \
		--measure-link "$(link_mb "$rate")" \
		--report "$rep" --links "$OUT/links-$name.tsv" >"$OUT/run-$name.log" 2>&1
	rc=$?
	label=$mode
	[ "$rate" = 100mbit ] || label="$mode $rate"
	if [ $rc -ne 0 ] || [ ! -s "$rep" ]; then
		printf '  N=%-2s %-6s: did not finish within %s s (exit %s); last lines:\n' "$n" "$label" \
			"$(bound_s "$n" "$rate")" "$rc"
		grep -v '^metrics on' "$OUT/run-$name.log" | tail -n 4 | sed 's/^/    /'
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
	CPU_OF[$name]=$cpu
	T_OF[$name]=$t
	if [ "$mode" = fanout ]; then
		awk -v n="$n" -v t="$t" -v sb="$sb" -v s="$s" -v b="$b" -v up="$up" -v dup="$dup" \
			-v peers="$peers" -v ref="$refetched" -v goal="$(fanout_goal "$rate")" \
			-v label="$label" 'BEGIN {
			# The 100 Mbit/s lines as they always were; the others say met or MISSED.
			verdict = label == "fanout" ? "" : t / sb <= goal + 0 ? ": met" : ": MISSED"
			printf "  N=%-2d %s: T = %6.1f s = %5.2f x S/b (goal <= %s%s); trainer upload " \
			       "%5.2f x S (goal <= 1.05); duplicates %4.1f %% of received (goal < 2 %%); " \
			       "refetched %.1f MiB [S = %.1f MiB, b = %.2f MB/s, S/b = %.1f s]\n",
			       n, label, t, t / sb, goal, verdict, up, dup, ref / 1048576, s / 1048576,
			       b / 1e6, sb
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
phases() { # name
	grep -E '^  (phases|CPU|trainer uplink|v[0-9]+: the trainer)' "$OUT/run-$1.log" | sed 's/^  /         /'
	[ -z "${CPU_OF[$1]:-}" ] ||
		awk -v c="${CPU_OF[$1]}" 'BEGIN { printf "         CPU per replica: %.2f s per GiB received (median)\n", c }'
}
for rate in $RATES; do
	if [ "$rate" = 1gbit ]; then
		run "$GBIT_N" fanout "$rate"
		phases "$(run_name "$GBIT_N" fanout "$rate")"
		continue
	fi
	for n in $NS; do
		run "$n" fanout "$rate"
		phases "$n-fanout"
		run "$n" star "$rate"
		phases "$n-star"
	done
	if [ -n "${T_OF[8-fanout]:-}" ] && [ -n "${T_OF[16-fanout]:-}" ]; then
		awk -v a="${T_OF[8-fanout]}" -v b="${T_OF[16-fanout]}" 'BEGIN {
			printf "  fanout N=16 vs N=8: %+.1f %% (goal <= +5 %%)\n", (b / a - 1) * 100 }'
	fi
done
