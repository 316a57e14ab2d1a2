#!/bin/bash
# A user's run of tessera on loopback, with ranks joining late and restarts,
# that counts the log lines of known misbehaviour. One tracker, one
# publisher (`--model-dir` of a `tessera synth` model, `--every MS
# --anchor-every 3`), replica A (tp2, both ranks in one process), replica B
# (tp1, 8 s later) and replica C (tp2, its two ranks as two processes 5 s
# apart); then B's and C's rank 1 processes are SIGKILLed and restarted in
# turn until the publisher has published every version of the model dir,
# and a few seconds more. It prints, per pattern, how many lines matched
# and where:
#   broken-chain  a rank refused a version: "broken parent chain"
#   no-chain      a rank warned "no chain to replay ... asking for an anchor"
#   no-raw-copy   a raw copy that was asked for never came (the wait ran out;
#                 "no raw copy ... will come": ended at once, a newer version
#                 is out, is not counted)
#   pub-retry     the publisher said more than once that the model dir is
#                 exhausted
# and exits 1 when any count is above zero (2 on a setup failure).
#
# usage: deploy/loopback-restarts.sh [--steps N] [--every MS] [--mb N]
#                                    [--restarts N] [--keep DIR]
# Needs `make` first. Everything it starts is stopped and its temporary
# directory removed on every exit (--keep DIR copies the logs there first);
# several runs may share a machine (ports are chosen free).
set -u
BIN=${TESSERA_BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
STEPS=20 EVERY=3000 MB=16 RESTARTS=4 KEEP=
while [ $# -gt 0 ]; do
	case $1 in
	--steps) STEPS=$2; shift 2 ;;
	--every) EVERY=$2; shift 2 ;;
	--mb) MB=$2; shift 2 ;;
	--restarts) RESTARTS=$2; shift 2 ;;
	--keep) KEEP=$2; shift 2 ;;
	*) echo "usage: $0 [--steps N] [--every MS] [--mb N] [--restarts N] [--keep DIR]" >&2; exit 2 ;;
	esac
done

D=$(mktemp -d -t tessera-handrun.XXXXXX) || exit 2
PIDS=()
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
	# Nodes first, the tracker last: nodes leave cleanly.
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
	[ -n "$KEEP" ] && mkdir -p "$KEEP" && cp "$D"/*.log "$KEEP"/ 2>/dev/null
	rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 2' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
die() { echo "loopback-restarts: $*" >&2; exit 2; }

cd "$D" || exit 2
"$BIN"/tessera keygen -o trainer >/dev/null || die "keygen"
"$BIN"/tessera keygen --cluster -o cluster.key >/dev/null || die "keygen --cluster"
"$BIN"/tessera synth -o steps --synthetic-mb "$MB" --steps "$STEPS" >synth.log 2>&1 || die "synth"
"$BIN"/tessera model --model-dir steps -o model.json >/dev/null 2>&1 || die "model"
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
"$BIN"/tessera-tracker --listen 127.0.0.1:"$PORT" --state state --cluster-key cluster.key \
	--trainer-pubkey trainer.pub >tracker.log 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do
	curl -sf "$URL/api/v1/status" >/dev/null 2>&1 && break
	sleep 0.1
done
"$BIN"/tessera publish --tracker "$URL" --key trainer.key --cluster-key cluster.key \
	--model-dir steps --layout fsdp2 --every "$EVERY" --anchor-every 3 >publish.log 2>&1 &
PIDS+=($!)

# node NAME ARGS...: starts one tessera-node, logging to NAME.log (appended).
declare -A NODE
node() {
	local name=$1
	shift
	"$BIN"/tessera-node --tracker "$URL" --model model.json --trainer-pubkey trainer.pub \
		--cluster-key cluster.key --metrics off --log-level info "$@" >>"$name".log 2>&1 &
	NODE[$name]=$!
	PIDS+=($!)
}
node A --replica A --ranks 0-1 --layout tp2
sleep 8
node B --replica B --rank 0 --layout tp1
node C0 --replica C --rank 0 --layout tp2
sleep 5
node C1 --replica C --rank 1 --layout tp2

# Restarts, a few seconds apart (not aligned with --every): C1, then B.
for i in $(seq "$RESTARTS"); do
	sleep $((3 + i % 3))
	for name in C1 B; do
		kill -KILL "${NODE[$name]}" 2>/dev/null
		wait "${NODE[$name]}" 2>/dev/null
		echo "--- restart $i" >>"$name".log
		case $name in
		C1) node C1 --replica C --rank 1 --layout tp2 ;;
		B) node B --replica B --rank 0 --layout tp1 ;;
		esac
		sleep 2
	done
done

# Until the model dir is exhausted (every version published), bounded.
deadline=$(($(date +%s) + STEPS * (EVERY / 1000 + 2) + 60))
while ! grep -q 'model dir holds only\|model dir.s .* versions' publish.log; do
	[ "$(date +%s)" -gt "$deadline" ] && die "the publisher never ran out of versions"
	sleep 1
done
sleep $((EVERY * 3 / 1000 + 1))

count() { local pat=$1; shift; cat "$@" 2>/dev/null | grep -c "$pat"; }
rc=0
report() {
	local name=$1 n=$2
	printf '%-13s %s\n' "$name" "$n"
	[ "$n" -gt 0 ] && rc=1
}
report broken-chain "$(count 'broken parent chain' A.log B.log C0.log C1.log)"
report no-chain "$(count 'no chain to replay.*asking for an anchor' A.log B.log C0.log C1.log)"
report no-raw-copy "$(count 'no raw copy of v[0-9]* came' A.log B.log C0.log C1.log)"
report pub-retry "$(($(count 'model dir holds only' publish.log) > 1 ? $(count 'model dir holds only' publish.log) - 1 : 0))"
for f in A B C0 C1; do
	grep -h 'broken parent chain\|no chain to replay\|no raw copy of' "$f".log | sed "s/^/$f: /" | head -5
done
exit $rc
