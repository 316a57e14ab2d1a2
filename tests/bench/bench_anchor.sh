#!/bin/sh
# make bench-anchor: one anchor version of a 1 GiB model to one TP1 replica
# on loopback, measured against the anchor goals.
#
# usage: tests/bench/bench_anchor.sh BINDIR DIR BENCH_FABRIC
#   (make bench-anchor passes $(BUILD)/bin, $(BUILD)/bench-anchor and
#   $(BUILD)/bench/bench_fabric)
#
# Writes, once, a 1 GiB `tessera synth` model of 2 steps into DIR/model.
# Each measured run starts fresh processes, as the by-hand run of README.md
# does: a tracker, a publisher (`tessera publish --model-dir DIR/model
# --anchor-every 1`: every version an anchor; default trainer layout fsdp2,
# both trainer ranks in the process) taking orders on its control socket,
# and one tessera-node with replica A of layout tp1. It exports v1 (the
# first anchor: cold pages, connection set-up) and waits until the replica
# is active on it and v1's follow-ups are done (the node copies it into a
# standby slot: the three processes idle, at most 2 clock ticks in 0.2 s),
# then samples /proc/<pid>/stat of the three processes, exports v2 (the
# second anchor, the one measured), waits until the replica is active on
# it (its expose record, then the tracker's timeline) and samples again.
# From v2 it takes:
#   - export -> published: the publisher's `published v2 anchor ... in N ms`
#     line (snapshot, gather+hash beside it);
#   - the node's first -> last byte rate: the version's bytes over the
#     tracker's timeline first_byte_ms .. last_byte_ms of rank 0 (the node's
#     own clock, ms; the first chunk's 128 KiB land at first_byte_ms and
#     count in), against the fabric's read rate measured in the same run by
#     bench_fabric (fi_read over tcp;ofi_rxm on loopback, 1 GiB in 4 MiB
#     reads, 8 in flight, one run after a warm-up: its default shape, the
#     fabric's best) once the run's processes are stopped;
#   - export -> active: the timeline's replica activated_ms - export_asked_ms;
#   - CPU seconds per GiB of the version (utime + stime) and page faults
#     (minflt + majflt) of each process between the two samples (the
#     tracker's include the one or two timeline requests that tell this
#     script the replica is active).
# Then it checks the version: the canary score `tessera probe` computes
# through the node's attach socket must match the publisher's (the node has
# verified every chunk against the signed manifest already); a wrong score,
# a process that died or a step that did not finish fails the run (exit 1).
# Each run also prints the publisher's and the node's start-up lines for v2
# (the publisher's at info, the node's at debug: where the time went, the
# publisher's CPU by step).
#
# Three runs (BENCH_ANCHOR_RUNS) of fresh processes, each measuring the
# second anchor from the same state (the model dir holds three versions,
# so successive pairs in one set of processes would not fit, and a later
# pair would measure a warmer third anchor), medians beside the goals:
# export -> active <= 1.0 s; node rate >= 0.8 x fabric read rate; publisher
# <= 0.3 s per GiB (export -> published); <= 0.5 CPU-s per GiB per process.
# PASS or MISS per goal; the exit status is 0 either way.
#
# Every wait is bounded (BENCH_ANCHOR_WAIT_S, default 120 s per step);
# BENCH_ANCHOR_KEEP=DIR keeps the last run's logs there.
set -u

usage="usage: bench_anchor.sh BINDIR DIR BENCH_FABRIC"
BIN=${1:?$usage}
DIR=${2:?$usage}
FABRIC=${3:?$usage}
RUNS=${BENCH_ANCHOR_RUNS:-3}
WAIT_S=${BENCH_ANCHOR_WAIT_S:-120}
KEEP=${BENCH_ANCHOR_KEEP:-}
MODEL_MB=1024
POLL=0.05 # s between looks at the expose record
TICK=$(getconf CLK_TCK)

TMP=""
PIDS=""
cleanup() {
	stop_all
	if [ -n "$KEEP" ] && [ -n "$TMP" ] && [ -d "$TMP/run" ]; then
		mkdir -p "$KEEP" && cp -r "$TMP/run/." "$KEEP/"
	fi
	[ -z "$TMP" ] || rm -rf "$TMP"
}
# Stops every process this script started: TERM, up to 5 s, then KILL.
stop_all() {
	[ -n "$PIDS" ] || return 0
	for p in $PIDS; do kill "$p" 2>/dev/null; done
	i=0
	while [ $i -lt 50 ]; do
		alive=""
		for p in $PIDS; do ! kill -0 "$p" 2>/dev/null || alive="$alive $p"; done
		[ -n "$alive" ] || break
		sleep 0.1
		i=$((i + 1))
	done
	for p in $PIDS; do kill -KILL "$p" 2>/dev/null; done
	for p in $PIDS; do wait "$p" 2>/dev/null; done
	PIDS=""
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

fail() {
	echo "bench-anchor: FAILED: $*" >&2
	if [ -n "$TMP" ] && [ -d "$TMP/run" ]; then
		for f in tracker.log publish.log node.log; do
			[ -f "$TMP/run/$f" ] || continue
			echo "  last lines of $f:" >&2
			tail -n 5 "$TMP/run/$f" | sed 's/^/    /' >&2
		done
	fi
	exit 1
}

# The run's three processes must stay up.
check_alive() {
	for who in tracker:$TRK publisher:$PUB node:$NODE; do
		kill -0 "${who#*:}" 2>/dev/null || fail "the ${who%%:*} (pid ${who#*:}) died $1"
	done
}

# "CPU_TICKS FAULTS" of a process: utime + stime, minflt + majflt.
proc_sample() {
	read -r line <"/proc/$1/stat" || fail "cannot read /proc/$1/stat"
	# Fields after "pid (comm) ": 1 state .. 8 minflt, 10 majflt, 12 utime, 13 stime.
	# shellcheck disable=SC2086
	set -- ${line##*) }
	echo "$((${12} + ${13})) $(($8 + ${10}))"
}

# Sends "export" to the publisher's control socket; its answer ("published
# V CREATED_MS KIND WIRE ANCHOR ENCODE_US" or "error ...") goes to $2.
control_export() {
	python3 - "$1" "$WAIT_S" >"$2" 2>&1 <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(float(sys.argv[2]))
s.connect(sys.argv[1])
s.sendall(b"export\n")
print(s.makefile().readline().strip())
EOF
}

# Waits until the expose record $1 names version $2 (polled every $POLL s).
wait_expose() {
	n=0
	limit=$((WAIT_S * 20))
	while :; do
		if [ -s "$1" ]; then
			rec=""
			read -r rec <"$1" || : # no newline at its end
			case $rec in *"\"version\":$2,"*) return 0 ;; esac
		fi
		check_alive "before v$2 was active"
		n=$((n + 1))
		[ $n -lt $limit ] || fail "v$2 not active within $WAIT_S s"
		sleep "$POLL"
	done
}

# Waits until the tracker's timeline of version $1 has the replica's
# activation; prints the timeline.
wait_timeline() {
	n=0
	while :; do
		tl=$(curl -sf -m 5 "$URL/api/v1/versions/$1/timeline") &&
			[ "$(printf '%s' "$tl" | jq -r '.replicas[0].activated_ms // empty')" != "" ] &&
			{ printf '%s\n' "$tl"; return 0; }
		check_alive "before the tracker had v$1's activation"
		n=$((n + 1))
		[ $n -lt $((WAIT_S * 20)) ] || fail "the tracker has no activation of v$1 after $WAIT_S s"
		sleep "$POLL"
	done
}

# Waits (at most 30 s) until v1's follow-ups are done: the three processes
# together used at most 2 clock ticks in 0.2 s; prints the seconds waited.
settle() {
	n=0
	set -- "$(total_ticks)"
	while [ $n -lt 150 ]; do
		sleep 0.2
		n=$((n + 1))
		set -- "$1" "$(total_ticks)"
		[ $(($2 - $1)) -gt 2 ] || break
		shift
	done
	echo "$n" | awk '{ printf "%.1f", $1 * 0.2 }'
}
total_ticks() {
	t=0
	for p in $PUB $NODE $TRK; do
		read -r line <"/proc/$p/stat" || { echo 0; return; }
		# shellcheck disable=SC2086
		set -- ${line##*) }
		t=$((t + ${12} + ${13}))
	done
	echo "$t"
}

median() { # column $1 of file $2
	awk -v c="$1" '{ print $c }' "$2" | sort -g |
		awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for t in python3 curl jq; do
	command -v "$t" >/dev/null 2>&1 || fail "$t is missing (deploy/install-deps.sh installs it)"
done
for b in tessera tessera-tracker tessera-node; do
	[ -x "$BIN/$b" ] || fail "$BIN/$b is missing: make first"
done
[ -x "$FABRIC" ] || fail "$FABRIC is missing: make $FABRIC"
BIN=$(cd "$BIN" && pwd)

mkdir -p "$DIR" || fail "cannot create $DIR"
MODEL=$(cd "$DIR" && pwd)/model
if [ ! -s "$MODEL/v2.safetensors" ]; then
	echo "bench-anchor: $BIN/tessera synth -o $MODEL --synthetic-mb $MODEL_MB --steps 2"
	"$BIN/tessera" synth -o "$MODEL" --synthetic-mb "$MODEL_MB" --steps 2 || fail "tessera synth"
fi
TMP=$(mktemp -d -t tessera-bench-anchor.XXXXXX) || fail "mktemp"
RES=$TMP/results

echo "bench-anchor: a $MODEL_MB MiB model ($MODEL) to one tp1 replica on loopback, every" \
	"version an anchor; $RUNS runs of fresh processes, v2 measured in each; at most" \
	"$WAIT_S s per step"

run=1
while [ "$run" -le "$RUNS" ]; do
	W=$TMP/run
	rm -rf "$W"
	mkdir -p "$W/expose"
	if ! { "$BIN/tessera" keygen -o "$W/trainer" >/dev/null &&
		"$BIN/tessera" keygen --cluster -o "$W/cluster.key" >/dev/null &&
		"$BIN/tessera" model --model-dir "$MODEL" -o "$W/model.json" >/dev/null 2>&1; }; then
		fail "keys or model.json"
	fi

	"$BIN/tessera-tracker" --listen 127.0.0.1:0 --state "$W/state" \
		--cluster-key "$W/cluster.key" --trainer-pubkey "$W/trainer.pub" >"$W/tracker.log" 2>&1 &
	TRK=$!
	PIDS="$TRK"
	URL=""
	n=0
	while [ -z "$URL" ]; do
		URL=$(sed -n 's/^listening on //p' "$W/tracker.log" | head -n 1)
		[ -n "$URL" ] && break
		kill -0 "$TRK" 2>/dev/null || fail "the tracker did not start"
		n=$((n + 1))
		[ $n -lt 200 ] || fail "the tracker did not say where it listens within 10 s"
		sleep 0.05
	done
	"$BIN/tessera-node" --tracker "$URL" --replica A --rank 0 --layout tp1 \
		--model "$W/model.json" --trainer-pubkey "$W/trainer.pub" --cluster-key "$W/cluster.key" \
		--expose "$W/expose" --store host --attach "$W/attach.sock" --metrics off \
		--log-level debug >"$W/node.log" 2>&1 &
	NODE=$!
	PIDS="$PIDS $NODE"
	"$BIN/tessera" publish --tracker "$URL" --key "$W/trainer.key" \
		--cluster-key "$W/cluster.key" --model-dir "$MODEL" --anchor-every 1 \
		--control "$W/publisher.sock" --log-level info >"$W/publish.log" 2>&1 &
	PUB=$!
	PIDS="$PIDS $PUB"
	n=0
	while [ ! -S "$W/publisher.sock" ]; do
		check_alive "at start"
		n=$((n + 1))
		[ $n -lt $((WAIT_S * 20)) ] || fail "no control socket after $WAIT_S s"
		sleep 0.05
	done

	# v1: the first anchor, not measured.
	control_export "$W/publisher.sock" "$W/export1.out" ||
		fail "export of v1: $(cat "$W/export1.out")"
	read -r word v _ kind _ <"$W/export1.out"
	[ "$word $v $kind" = "published 1 anchor" ] || fail "export of v1: $(cat "$W/export1.out")"
	wait_expose "$W/expose/A-0.json" 1
	wait_timeline 1 >/dev/null
	settled=$(settle)
	check_alive "after v1"

	# v2: the second anchor, measured.
	s0_pub=$(proc_sample "$PUB") || exit 1
	s0_node=$(proc_sample "$NODE") || exit 1
	s0_trk=$(proc_sample "$TRK") || exit 1
	control_export "$W/publisher.sock" "$W/export2.out" &
	CTL=$!
	PIDS="$PIDS $CTL"
	wait_expose "$W/expose/A-0.json" 2
	tl=$(wait_timeline 2) || exit 1
	s1_pub=$(proc_sample "$PUB") || exit 1
	s1_node=$(proc_sample "$NODE") || exit 1
	s1_trk=$(proc_sample "$TRK") || exit 1
	read -r load _ </proc/loadavg
	wait "$CTL" || fail "export of v2: $(cat "$W/export2.out")"
	read -r word v _ kind _ <"$W/export2.out"
	[ "$word $v $kind" = "published 2 anchor" ] || fail "export of v2: $(cat "$W/export2.out")"
	line=$(grep -m 1 '^published v2 anchor ' "$W/publish.log") ||
		fail "the publisher logged no 'published v2 anchor' line"

	# The served bytes: the canary score through the attach socket.
	probe=$(timeout 60 "$BIN/tessera" probe --attach "$W/attach.sock" --replica A \
		--min-version 2 --tracker "$URL" --cluster-key "$W/cluster.key" 2>&1) ||
		fail "tessera probe: $probe"
	case $probe in *": ok") ;; *) fail "tessera probe: $probe" ;; esac
	check_alive "after v2"
	stop_all
	PIDS=""

	# The fabric's read rate, measured now that the run's processes are gone.
	fab=$(timeout "$WAIT_S" "$FABRIC" --reps 1 'tcp;ofi_rxm' 2>&1) || fail "bench_fabric: $fab"
	fab_gbs=$(printf '%s\n' "$fab" | sed -n 's/^fabric tcp;ofi_rxm: \([0-9.]*\) GB\/s median.*/\1/p')
	[ -n "$fab_gbs" ] || fail "bench_fabric said: $fab"

	# One line of figures per run (columns of $RES, in this order).
	printf '%s\n' "$tl" | jq -r '[.wire_bytes, .export_asked_ms, .published_ms,
		.replicas[0].ranks[0].first_byte_ms, .replicas[0].ranks[0].last_byte_ms,
		.replicas[0].activated_ms] | @tsv' >"$W/tl.tsv" || fail "timeline: $tl"
	read -r bytes asked published first last active <"$W/tl.tsv"
	pub_ms=$(printf '%s\n' "$line" | sed -n 's/.* in \([0-9]*\) ms (snapshot \([0-9]*\) ms, gather+hash \([0-9]*\) ms.*/\1 \2 \3/p')
	[ -n "$pub_ms" ] || fail "cannot read the publisher's line: $line"
	# shellcheck disable=SC2086
	set -- $pub_ms $s0_pub $s1_pub $s0_node $s1_node $s0_trk $s1_trk
	awk -v run="$run" -v bytes="$bytes" -v asked="$asked" -v published="$published" \
		-v first="$first" -v last="$last" -v active="$active" -v fab="$fab_gbs" -v tick="$TICK" \
		-v settled="$settled" -v load="$load" \
		-v pub="$1" -v snap="$2" -v hash="$3" \
		-v pc0="$4" -v pf0="$5" -v pc1="$6" -v pf1="$7" \
		-v nc0="$8" -v nf0="$9" -v nc1="${10}" -v nf1="${11}" \
		-v tc0="${12}" -v tf0="${13}" -v tc1="${14}" -v tf1="${15}" -v res="$RES" 'BEGIN {
		gib = bytes / 1073741824
		span = last - first; if (span < 1) span = 1
		rate = bytes / span / 1e6 # GB/s
		e2a = (active - asked) / 1000
		pcpu = (pc1 - pc0) / tick / gib; ncpu = (nc1 - nc0) / tick / gib; tcpu = (tc1 - tc0) / tick / gib
		printf "  run %d: export->published %d ms (snapshot %d, gather+hash %d; tracker %d ms), " \
		       "first->last byte %d ms = %.2f GB/s (fabric %.2f GB/s, x%.2f), export->active %d ms; " \
		       "CPU-s/GiB publisher %.2f node %.2f tracker %.3f; faults publisher %d node %d tracker %d " \
		       "[v1 follow-ups settled in %s s; load average %s]\n",
		       run, pub, snap, hash, published - asked, last - first, rate, fab, rate / fab,
		       active - asked, pcpu, ncpu, tcpu, pf1 - pf0, nf1 - nf0, tf1 - tf0, settled, load
		printf "%d %d %d %d %.4f %.4f %.4f %.3f %.4f %.4f %.4f %d %d %d %.6f\n",
		       pub, snap, hash, published - asked, rate, fab, rate / fab, e2a, pcpu, ncpu, tcpu,
		       pf1 - pf0, nf1 - nf0, tf1 - tf0, gib >> res
	}'
	# Where the time went, as the two processes log it (info level).
	sed -n 's/.*\(version 2 start-up, .*\)/         publisher: \1/p' "$W/publish.log"
	sed -n 's/.*\(v2 start-up, .*\)/         node: \1/p' "$W/node.log"
	echo "         probe: $probe"
	run=$((run + 1))
done

# Medians over the runs, beside the goals.
# shellcheck disable=SC2046
set -- $(for c in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do median "$c" "$RES"; done)
awk -v pub="$1" -v snap="$2" -v hash="$3" -v trk="$4" -v rate="$5" -v fab="$6" -v ratio="$7" \
	-v e2a="$8" -v pcpu="$9" -v ncpu="${10}" -v tcpu="${11}" -v pf="${12}" -v nf="${13}" \
	-v tf="${14}" -v gib="${15}" -v runs="$RUNS" 'function v(ok) { return ok ? "PASS" : "MISS" }
	BEGIN {
	printf "medians of %d runs (each figure its own median), v2 (the second anchor, %.3f GiB):\n", runs, gib
	printf "  export -> published   %6d ms (snapshot %d ms, gather+hash %d ms; tracker accepted at %d ms)\n",
	       pub, snap, hash, trk
	printf "  node first -> last    %6.2f GB/s, fabric read (bench_fabric, tcp;ofi_rxm) %.2f GB/s\n",
	       rate, fab
	printf "  export -> active      %6.3f s\n", e2a
	printf "  CPU-s per GiB         publisher %.3f, node %.3f, tracker %.3f\n", pcpu, ncpu, tcpu
	printf "  page faults (v2)      publisher %d, node %d, tracker %d\n", pf, nf, tf
	printf "goals:\n"
	printf "  export -> active <= 1.0 s:             %.3f s = %.2f x goal   %s\n", e2a, e2a / 1.0, v(e2a <= 1.0)
	printf "  node rate >= 0.8 x fabric read rate:   %.2f x fabric = %.2f x goal   %s\n",
	       ratio, ratio / 0.8, v(ratio >= 0.8)
	printf "  publisher <= 0.3 s per GiB:            %.3f s/GiB = %.2f x goal   %s\n",
	       pub / 1000 / gib, pub / 1000 / gib / 0.3, v(pub / 1000 / gib <= 0.3)
	printf "  <= 0.5 CPU-s per GiB, publisher:       %.3f = %.2f x goal   %s\n", pcpu, pcpu / 0.5, v(pcpu <= 0.5)
	printf "  <= 0.5 CPU-s per GiB, node:            %.3f = %.2f x goal   %s\n", ncpu, ncpu / 0.5, v(ncpu <= 0.5)
	printf "  <= 0.5 CPU-s per GiB, tracker:         %.3f = %.2f x goal   %s\n", tcpu, tcpu / 0.5, v(tcpu <= 0.5)
	}'
