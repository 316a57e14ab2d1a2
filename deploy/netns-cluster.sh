#!/bin/bash
# A tessera cluster across hosts: one network namespace per host, each joined
# to a switch namespace's bridge by a veth pair shaped with tbf in both
# directions. Host 0 runs the tracker and the publisher (every trainer rank);
# host i (1..) runs every rank of replica i. It publishes --versions versions,
# waits for every replica to activate the last, and prints for each version
# how long each replica took and the trainer's upload rate against the link
# rate the run shaped.
#
# Needs root (ip netns, tc), `make` first, iproute2, curl and jq
# (deploy/install-deps.sh). Everything it makes (namespaces tsn-*, processes,
# a temporary directory) is removed on exit; it may be rerun at once.
#
# usage: deploy/netns-cluster.sh [--replica L]... [--rate R] [--synthetic-mb N]
#                                [--versions V] [--every MS] [--timeout S]
#                                [--keep DIR] [--model-dir DIR] [--anchor-every K]
#   --replica L   a replica's layout, tpN or a layout file (repeatable;
#                 default tp2 tp2 tp1)
#   --rate R      tbf rate of every host link, each direction (default 1gbit)
#   --synthetic-mb N  synthetic model size in MiB (default 64; --model-mb:
#                 deprecated)
#   --versions V  versions to publish (default 3)
#   --every MS    one version every MS ms (default 8000)
#   --timeout S   give up after S seconds in all (default 240)
#   --keep DIR    copy the logs and the final status JSON to DIR
#   --model-dir DIR  publish DIR's checkpoints (`tessera synth` output)
#                 instead of the synthetic model
#   --anchor-every K  an anchor every K versions, deltas between (default:
#                 the publisher's, 10)
set -euo pipefail

BIN=${BIN:-build/bin}
PFX=tsn
NET=10.77.0
PORT=7400
RATE=1gbit
MB=64
VERSIONS=3
EVERY=8000
TIMEOUT=240
KEEP=""
MODEL_DIR=""
ANCHOR_EVERY=""
LAYOUTS=()

die() { echo "netns-cluster: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--replica) LAYOUTS+=("$2"); shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--synthetic-mb) MB=$2; shift 2 ;;
	--model-mb) echo "netns-cluster: --model-mb is deprecated, use --synthetic-mb" >&2; MB=$2; shift 2 ;;
	--versions) VERSIONS=$2; shift 2 ;;
	--every) EVERY=$2; shift 2 ;;
	--timeout) TIMEOUT=$2; shift 2 ;;
	--keep) KEEP=$2; shift 2 ;;
	--model-dir) MODEL_DIR=$(realpath "$2"); shift 2 ;;
	--anchor-every) ANCHOR_EVERY=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
[ ${#LAYOUTS[@]} -gt 0 ] || LAYOUTS=(tp2 tp2 tp1)
[ "$(id -u)" -eq 0 ] || die "needs root for ip netns and tc"
for t in ip tc curl jq; do
	command -v $t >/dev/null || die "$t not found (deploy/install-deps.sh installs it)"
done
for b in tessera tessera-node tessera-tracker; do
	[ -x "$BIN/$b" ] || die "$BIN/$b not built (run make)"
done
BIN=$(cd "$BIN" && pwd)
NREP=${#LAYOUTS[@]}
[ "$NREP" -le 200 ] || die "at most 200 replica hosts"

DIR=$(mktemp -d -t tessera-netns.XXXXXX)
PIDS=()

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	sleep 0.5
	for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
	if [ $rc -ne 0 ]; then
		for f in "$DIR"/*.log; do
			[ -f "$f" ] || continue
			echo "---- $(basename "$f") (last lines)" >&2
			tail -n 5 "$f" >&2
		done
	fi
	if [ -n "$KEEP" ]; then
		if mkdir -p "$KEEP"; then cp "$DIR"/*.log "$DIR"/*.json "$KEEP"/ 2>/dev/null || true; fi
	fi
	remove_netns
	rm -rf "$DIR"
	exit $rc
}

remove_netns() {
	local ns
	for ns in $(ip netns list | awk '{print $1}' | grep "^$PFX-" || true); do
		# Processes left in a namespace would keep it alive: end them.
		ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
}

trap cleanup EXIT
trap 'exit 130' INT TERM
remove_netns # what an interrupted earlier run may have left
DEADLINE=$((SECONDS + TIMEOUT))

# ---- hosts and links ------------------------------------------------------------
ip netns add $PFX-sw
ip -n $PFX-sw link set lo up
ip -n $PFX-sw link add br0 type bridge
ip -n $PFX-sw link set br0 up
shape() { # namespace device
	ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 1mb latency 400ms
}
for i in $(seq 0 "$NREP"); do
	ns=$PFX-h$i
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip link add eth0 netns "$ns" type veth peer name "p$i" netns $PFX-sw
	ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
	ip -n "$ns" link set eth0 up
	ip -n $PFX-sw link set "p$i" master br0
	ip -n $PFX-sw link set "p$i" up
	shape "$ns" eth0
	shape $PFX-sw "p$i"
done
on() { # host command...
	local h=$1
	shift
	ip netns exec "$PFX-h$h" "$@"
}
start() { # host log command... (in the background; $! is the command itself)
	local h=$1 log=$2
	shift 2
	ip netns exec "$PFX-h$h" "$@" >"$DIR/$log" 2>&1 &
	PIDS+=($!)
}
TRK=http://$NET.1:$PORT

wait_for() { # what test-command...
	local what=$1
	shift
	until "$@"; do
		[ $SECONDS -lt $DEADLINE ] || die "timed out waiting for $what"
		sleep 0.5
	done
}
status() { on 0 curl -sf --max-time 5 "$TRK/api/v1/status" >"$DIR/status.json"; }

# ---- tracker and publisher on host 0 -----------------------------------------------
"$BIN/tessera" keygen -o "$DIR/trainer" >/dev/null
"$BIN/tessera" keygen --cluster -o "$DIR/cluster.key" >/dev/null
start 0 tracker.log "$BIN/tessera-tracker" --listen "$NET.1:$PORT" --state "$DIR/state" \
	--cluster-key "$DIR/cluster.key" --trainer-pubkey "$DIR/trainer.pub"
wait_for "the tracker" status
SOURCE=(--synthetic-mb "$MB")
[ -z "$MODEL_DIR" ] || SOURCE=(--model-dir "$MODEL_DIR")
[ -z "$ANCHOR_EVERY" ] || SOURCE+=(--anchor-every "$ANCHOR_EVERY")
start 0 publisher.log "$BIN/tessera" publish --tracker "$TRK" --key "$DIR/trainer.key" \
	--cluster-key "$DIR/cluster.key" "${SOURCE[@]}" --layout fsdp2 \
	--versions "$VERSIONS" --every "$EVERY"
model_known() {
	on 0 curl -sf --max-time 5 "$TRK/api/v1/layouts" | jq -e '.model' >"$DIR/model.json" 2>/dev/null
}
wait_for "the publisher to register the model" model_known

# ---- one host per replica ----------------------------------------------------------
for i in $(seq 1 "$NREP"); do
	layout=${LAYOUTS[$((i - 1))]}
	case "$layout" in
	tp[0-9]*) ranks=${layout#tp} ;;
	*) ranks=$(jq '.ranks | length' "$layout") || die "$layout: not a layout file" ;;
	esac
	for r in $(seq 0 $((ranks - 1))); do
		start "$i" "node-R$i-$r.log" "$BIN/tessera-node" --tracker "$TRK" --replica "R$i" \
			--rank "$r" --layout "$layout" --model "$DIR/model.json" \
			--trainer-pubkey "$DIR/trainer.pub" --cluster-key "$DIR/cluster.key" \
			--host "host$i" --store host
	done
done
echo "netns-cluster: $((NREP + 1)) hosts on $NET.0/24, links shaped to $RATE each way;" \
	"replicas ${LAYOUTS[*]}; $VERSIONS versions of a $MB MiB model every $EVERY ms"

all_active() {
	status || return 1
	jq -e --argjson v "$VERSIONS" --argjson n "$NREP" \
		'[.replicas[] | select(.active == $v)] | length == $n' "$DIR/status.json" >/dev/null
}
wait_for "every replica to activate version $VERSIONS" all_active

# ---- report ---------------------------------------------------------------------
# Rate bits per second, from tc's notation (kbit, mbit, gbit; bare = bytes/s).
rate_bps() {
	local r=$1 n unit
	n=${r%%[a-zA-Z]*}
	unit=${r#"$n"}
	case "$unit" in
	kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;;
	gbit) echo $((n * 1000000000)) ;; bit) echo "$n" ;;
	""|bps) echo $((n * 8)) ;; *) die "rate '$r': use kbit, mbit or gbit" ;;
	esac
}
jq -r --argjson bps "$(rate_bps "$RATE")" '
	(.activations | group_by(.version) | map({key: (.[0].version | tostring), value: .})
	 | from_entries) as $act
	| .versions | sort_by(.version)[]
	| . as $v
	| ($act[$v.version | tostring] // []) as $a
	| ($a | map(.wall_ms - $v.created_ms)) as $t
	| "v\($v.version): \($v.bytes_from_trainer / 1048576 | floor) MiB from the trainer, "
	  + "\($v.bytes_from_peers / 1048576 | floor) MiB from peers; replicas active "
	  + ($a | sort_by(.replica) | map("\(.replica) \((.wall_ms - $v.created_ms) / 1000)s")
	     | join(", "))
	  + (if ($t | length) > 0 then
	       "; trainer upload \($v.bytes_from_trainer * 8 / (($t | max) / 1000) / 1e6 | floor)"
	       + " Mbit/s = \($v.bytes_from_trainer * 8 / (($t | max) / 1000) / $bps * 100
	                    | floor / 100) of the link"
	     else "" end)
' "$DIR/status.json"
echo "netns-cluster: ok in $SECONDS s (times from each manifest's creation to activation)"
