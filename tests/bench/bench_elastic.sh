#!/bin/bash
# make bench-elastic (root): replicas tp2, tp2, tp1, tp1 on their own hosts
# (deploy/netns-cluster.sh, links shaped to 100 Mbit/s each way) receive one
# 64 MiB version; then late replicas tp4 (a layout nobody had) and tp1 join.
# Prints the first wave's trainer upload / S, and for each late replica its
# activation time from its registration / (S/b) and the share of its bytes
# that came from peers, beside the goals of the elastic-replicas issue
# (S: the model's bytes, what a TP1 replica holds; b: one lone TCP transfer
# over the same shaped links, measured in the same run). A late replica that
# did not activate the existing version within the bound (4 x S/b + 30 s
# from its start) is said to have not, with what it received meanwhile.
#
# BENCH_ELASTIC_MB (default 64) shrinks it.
set -uo pipefail

BIN=${BIN:-build/bin}
MB=${BENCH_ELASTIC_MB:-64}
RATE=100mbit
RATE_BPS=$((100 * 1000000 / 8))
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d -t tessera-bench-elastic.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

SB=$((MB * 1048576 / RATE_BPS + 1))
LATE_S=$((4 * SB + 30))
TIMEOUT=$((6 * SB + 90 + LATE_S))
echo "bench-elastic: tp2 tp2 tp1 tp1 then late tp4 tp1, one ${MB} MiB version, links $RATE;" \
	"at most $TIMEOUT s"
BIN=$BIN "$HERE/deploy/netns-cluster.sh" --replica tp2 --replica tp2 --replica tp1 --replica tp1 \
	--late-replica tp4 --late-replica tp1 --rate "$RATE" --synthetic-mb "$MB" --versions 1 \
	--timeout "$TIMEOUT" --late-timeout "$LATE_S" --measure-link 32 --report "$OUT/report.json" \
	>"$OUT/run.log" 2>&1
rc=$?
if [ ! -s "$OUT/report.json" ]; then
	echo "bench-elastic: the first wave did not finish within $TIMEOUT s (exit $rc); last lines:"
	grep -v '^metrics on' "$OUT/run.log" | tail -n 6 | sed 's/^/    /'
	exit 1
fi
jq -r --argjson late_s "$LATE_S" '
	.link_bytes_per_s as $b | .versions[-1] as $v
	| ($v.replicas | map(select(.late | not) | select(.layout == "tp1")
	   | .bytes_from_trainer + .bytes_from_peers) | max) as $s
	| ($s / $b) as $sb
	| "  S = \($s / 1048576 * 10 | round / 10) MiB, b = \($b / 1e4 | round / 100) MB/s"
	  + " (one lone TCP transfer), S/b = \($sb * 10 | round / 10) s",
	  "  first wave (tp2 tp2 tp1 tp1): trainer upload \($v.trainer_upload_bytes / $s * 100
	   | round / 100) x S (goal <= 1.1), \($v.peer_upload_bytes / 1048576 | round) MiB from peers",
	  ($v.replicas[] | select(.late)
	   | (.bytes_from_trainer + .bytes_from_peers) as $got
	   | "  late \(.layout) (\(.replica)): "
	     + (if .activated then
		  "active after \(.t_activate_ms / 1000) s = \(.t_activate_ms / 1000 / $sb * 100
		   | round / 100) x S/b (goal <= 1.3)"
		else "DID NOT activate the existing version within \($late_s) s (goal: 1.3 x S/b)" end)
	     + "; \(if $got > 0 then .bytes_from_peers / $got * 100 | round else 0 end) % of its"
	     + " \($got / 1048576 | round) MiB from peers (goal >= 95 %)")
' "$OUT/report.json"
