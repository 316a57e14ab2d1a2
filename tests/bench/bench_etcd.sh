#!/bin/bash
# make bench-etcd: trackers on etcd, on loopback, with a real three-member
# etcd cluster (Debian's etcd-server).
#   1. What a version costs to store: a publisher exports BENCH_ETCD_VERSIONS
#      versions of a 4 MiB model to one tp1 replica, once through a tracker
#      on a state directory and once through a tracker on etcd; the median
#      of the publisher's "publish N ms" (the POST of the manifest until its
#      201, durable in the store) of each, and their ratio.
#   2. Takeover: two trackers on the store, lease BENCH_ETCD_TTL s; the
#      leader is killed (SIGKILL) BENCH_ETCD_KILLS times, each time started
#      again as a standby; the time from the kill until the other answers
#      /healthz 200, its median against the lease (the goal: a standby leads
#      within a lease of the leader's death). The same
#      with SIGTERM (a clean stop revokes the lease: no lease to wait out).
# Every wait is bounded; everything started is stopped on exit.
set -uo pipefail

BIN=${BIN:-build/bin}
VERSIONS=${BENCH_ETCD_VERSIONS:-30}
KILLS=${BENCH_ETCD_KILLS:-7}
TTL=${BENCH_ETCD_TTL:-2}
ETCD=$(command -v etcd) || { echo "bench-etcd: etcd is not installed (deploy/install-deps.sh)"; exit 1; }
OUT=$(mktemp -d -t tessera-bench-etcd.XXXXXX)
PIDS=()
cleanup() {
	exec 2>/dev/null # not the shell's "Killed" for each
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	rm -rf "$OUT"
}
trap cleanup EXIT

# Ports: a random base, each one checked free.
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 30000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}
median() { sort -n | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
now_ms() { date +%s%3N; }
healthz() { curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$1/healthz"; }

"$BIN/tessera" keygen -o "$OUT/trainer" >/dev/null 2>&1
"$BIN/tessera" keygen --cluster -o "$OUT/cluster.key" >/dev/null 2>&1

# ---- a three-member etcd on loopback --------------------------------------------
CP=() PP=() cluster="" endpoints=""
for i in 0 1 2; do
	CP[i]=$(port) PP[i]=$(port)
	cluster="$cluster${cluster:+,}e$i=http://127.0.0.1:${PP[i]}"
	endpoints="$endpoints${endpoints:+,}127.0.0.1:${CP[i]}"
done
for i in 0 1 2; do
	"$ETCD" --name "e$i" --data-dir "$OUT/etcd-$i" \
		--listen-client-urls "http://127.0.0.1:${CP[i]}" --advertise-client-urls "http://127.0.0.1:${CP[i]}" \
		--listen-peer-urls "http://127.0.0.1:${PP[i]}" --initial-advertise-peer-urls "http://127.0.0.1:${PP[i]}" \
		--initial-cluster "$cluster" --initial-cluster-state new --logger zap --log-level warn \
		>"$OUT/etcd-$i.log" 2>&1 &
	PIDS+=($!)
done
for _ in $(seq 300); do
	ok=0
	for i in 0 1 2; do
		curl -s --max-time 1 "http://127.0.0.1:${CP[i]}/health" | grep -q '"health":"true"' && ok=$((ok + 1))
	done
	[ $ok = 3 ] && break
	sleep 0.1
done
[ "$ok" = 3 ] || { echo "bench-etcd: etcd did not become healthy"; tail -n 5 "$OUT"/etcd-*.log; exit 1; }

tracker() { # name listen args...: starts a tracker, prints its pid
	local name=$1 listen=$2
	shift 2
	"$BIN/tessera-tracker" --listen "$listen" --cluster-key "$OUT/cluster.key" \
		--trainer-pubkey "$OUT/trainer.pub" --log-level note "$@" >"$OUT/$name.log" 2>&1 &
	echo $!
}
wait_line() { # file pattern
	for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
	return 1
}

# ---- 1. a version's store cost ----------------------------------------------------
store_run() { # kind tracker-args...: the publisher's publish ms, one per version
	local kind=$1 listen
	shift
	listen=127.0.0.1:$(port)
	local t n p got
	t=$(tracker "t-$kind" "$listen" "$@")
	PIDS+=("$t")
	wait_line "$OUT/t-$kind.log" "listening on" ||
		{ echo "bench-etcd: tracker ($kind) did not start:" >&2; tail -n 3 "$OUT/t-$kind.log" >&2; exit 1; }
	mkdir -p "$OUT/expose-$kind"
	"$BIN/tessera" publish --tracker "http://$listen" --key "$OUT/trainer.key" --cluster-key "$OUT/cluster.key" \
		--synthetic-mb 4 --layout fsdp2 --every 300 --versions "$VERSIONS" --log-level warn \
		>"$OUT/pub-$kind.log" 2>&1 &
	p=$!
	PIDS+=("$p")
	"$BIN/tessera-node" --tracker "http://$listen" --replica A --rank 0 --layout tp1 \
		--model "$OUT/model.json" --trainer-pubkey "$OUT/trainer.pub" --cluster-key "$OUT/cluster.key" \
		--expose "$OUT/expose-$kind" --store host --log-level warn >"$OUT/node-$kind.log" 2>&1 &
	n=$!
	PIDS+=("$n")
	for _ in $(seq 1200); do
		got=$(grep -c '^published v' "$OUT/pub-$kind.log" 2>/dev/null)
		[ "${got:-0}" -ge "$VERSIONS" ] && break
		sleep 0.1
	done
	kill "$n" "$p" "$t" 2>/dev/null
	wait "$n" "$p" "$t" 2>/dev/null
	sed -n 's/^published v[0-9]* .*[(,] publish \([0-9]*\) ms.*/\1/p' "$OUT/pub-$kind.log"
}
"$BIN/tessera" model --synthetic-mb 4 -o "$OUT/model.json" >"$OUT/model.log" 2>&1 ||
	{ echo "bench-etcd: tessera model failed"; cat "$OUT/model.log"; exit 1; }
store_run dir --state "$OUT/state" >"$OUT/dir.ms" || exit 1
store_run etcd --store "etcd://$endpoints/bench" >"$OUT/etcd.ms" || exit 1
dir_ms=$(median <"$OUT/dir.ms")
etcd_ms=$(median <"$OUT/etcd.ms")
echo "bench-etcd: a version stored, median of $VERSIONS: state directory ${dir_ms} ms, etcd (3 members) ${etcd_ms} ms; ratio $(awk -v a="$etcd_ms" -v b="$dir_ms" 'BEGIN {printf "%.2f", (b > 0 ? a / b : 0)}')"

# ---- 2. takeover --------------------------------------------------------------------
L=("127.0.0.1:$(port)" "127.0.0.1:$(port)")
declare -A TP
for i in 0 1; do
	TP[$i]=$(tracker "ha-$i" "${L[i]}" --store "etcd://$endpoints/ha" --leader-ttl "$TTL")
	PIDS+=("${TP[$i]}")
	wait_line "$OUT/ha-$i.log" "listening on" || { echo "bench-etcd: tracker ha-$i did not start"; exit 1; }
done
takeover() { # signal: one takeover per line, ms, into $OUT/SIGNAL.ms (run in
	# this shell, not a subshell: it restarts the trackers in TP)
	local sig=$1 k lead other t0 t1 ok
	for k in $(seq "$KILLS"); do
		lead=-1
		for i in 0 1; do [ "$(healthz "http://${L[i]}")" = 200 ] && lead=$i; done
		[ $lead -ge 0 ] || { echo "bench-etcd: no leader" >&2; return 1; }
		other=$((1 - lead))
		t0=$(now_ms)
		kill "-$sig" "${TP[$lead]}"
		ok=0
		for _ in $(seq 1000); do
			[ "$(healthz "http://${L[other]}")" = 200 ] && { ok=1; break; }
			sleep 0.02
		done
		t1=$(now_ms)
		[ $ok = 1 ] || { echo "bench-etcd: no takeover after $sig" >&2; return 1; }
		echo $((t1 - t0)) >>"$OUT/$sig.ms"
		wait "${TP[$lead]}" 2>/dev/null
		TP[$lead]=$(tracker "ha-$lead-$sig-$k" "${L[lead]}" --store "etcd://$endpoints/ha" --leader-ttl "$TTL")
		PIDS+=("${TP[$lead]}")
		wait_line "$OUT/ha-$lead-$sig-$k.log" "listening on" || return 1
	done
}
takeover KILL || exit 1
takeover TERM || exit 1
kill_ms=$(cat "$OUT/KILL.ms")
term_ms=$(cat "$OUT/TERM.ms")
kmed=$(echo "$kill_ms" | median)
tmed=$(echo "$term_ms" | median)
bound=$((TTL * 1000))
echo "bench-etcd: takeover after SIGKILL (lease ${TTL} s), $KILLS kills: $(echo "$kill_ms" | tr '\n' ' ')ms; median ${kmed} ms = $(awk -v a="$kmed" -v b="$bound" 'BEGIN {printf "%.2f", a / b}') x the lease (${bound} ms)"
echo "bench-etcd: takeover after SIGTERM (lease revoked), $KILLS stops: $(echo "$term_ms" | tr '\n' ' ')ms; median ${tmed} ms"
