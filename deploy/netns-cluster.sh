#!/bin/bash
# A tessera cluster across hosts: one network namespace per host, each joined
# to a switch namespace's bridge by a veth pair shaped with tbf in both
# directions (the data network: the fabric). Host 0 runs the publisher
# (every trainer rank); host i (1..) runs every rank of replica i, in one
# tessera-node process (its ranks start and register together). The
# tracker runs on a host of its own, reached by every host over a second,
# unshaped management network, as a cluster's control plane sits on its
# front-end network beside the data fabric: heartbeats queued behind a
# saturated data link's backlog cost nodes their leases (--tracker-net data
# puts the tracker on host 0 behind the trainer's shaped link instead). It publishes --versions versions,
# waits for every replica to activate the last, and prints for each version
# how long each replica took and the trainer's upload rate against the link
# rate the run shaped. Late replicas (--late-replica) start only then, on
# hosts of their own, and must activate the last version too.
#
# Needs root (ip netns, tc), `make` first, iproute2, curl, jq and python3
# (deploy/install-deps.sh). Everything it makes (namespaces tsn<pid>-*,
# processes, a temporary directory) is removed on exit; it may be rerun at
# once, and several runs may share a machine.
#
# usage: deploy/netns-cluster.sh [--replica L]... [--late-replica L]...
#                                [--mode fanout|star] [--rate R]
#                                [--synthetic-mb N] [--versions V] [--every MS]
#                                [--timeout S] [--late-timeout S] [--report FILE]
#                                [--measure-link MB] [--keep DIR] [--links FILE]
#                                [--model-dir DIR] [--anchor-every K]
#                                [--tracker-net mgmt|data]
#                                [--sites N|LIST [--wan-rate R] [--wan-cut S]
#                                 [--unnamed-sites]]
#   --replica L   a replica's layout, tpN or a layout file (repeatable;
#                 default tp2 tp2 tp1); L@SITE puts it in site SITE (with
#                 --sites)
#   --late-replica L  a replica started once every other one is active on
#                 the last version (repeatable); its activation time counts
#                 from its registration
#   --mode M      fanout (default): nodes fetch from and serve peers; star:
#                 nodes fetch only from the publisher (TESSERA_FANOUT=0)
#   --rate R      tbf rate of every host link, each direction (default 1gbit)
#   --synthetic-mb N  synthetic model size in MiB (default 64; --model-mb:
#                 deprecated)
#   --versions V  versions to publish (default 3)
#   --every MS    one version every MS ms (default 8000), the first once
#                 every (not late) replica registered
#   --timeout S   give up after S seconds in all (default 240)
#   --late-timeout S  late replicas must activate within S seconds of
#                 their start (default: what is left of --timeout)
#   --report FILE write the JSON report of `tessera cluster --report`: per
#                 version kind, trainer_upload_bytes, peer_upload_bytes,
#                 duplicate_bytes and refetched_bytes (the tracker's totals
#                 for every replica but the late ones), wire_bytes (their
#                 sum), anchor_bytes (what those replicas' layouts hold: the
#                 version's cost as an anchor), encode_ms, per replica late,
#                 activated, t_activate_ms, bytes_from_trainer,
#                 bytes_from_peers, duplicate_bytes, refetched_bytes (exact
#                 for the last version, as last polled for earlier ones),
#                 leases_lost (times a rank re-registered), cpu_ms (its
#                 processes' CPU time in the run) and data_rx_bytes (what
#                 its host's data link received from its start: chunks,
#                 reads' framing, have-maps); publisher_cpu_ms,
#                 tracker_cpu_ms and loadavg_1m (the machine's, at the end)
#   --measure-link MB  first time one TCP transfer of MB MiB from host 0 to
#                 host 1 across the shaped links: b, reported as
#                 link_bytes_per_s
#   --keep DIR    copy the logs and the final status JSON to DIR
#   --links FILE  every 100 ms from the first export on, a line "ms up0
#                 down1 .. downN up1 .. upN": the wall clock (ms), the bytes
#                 host 0 (the trainer) sent on its data link so far, the
#                 bytes each replica host received on its data link so far,
#                 then those each sent (the switch ports' counters); the run
#                 also prints how full the trainer's uplink was between its
#                 first and last busy sample
#   --model-dir DIR  publish DIR's checkpoints (`tessera synth` output)
#                 instead of the synthetic model
#   --anchor-every K  an anchor every K versions, deltas between (default:
#                 the publisher's, 10)
#   --tracker-net N  mgmt (default): the tracker on its own host, on the
#                 unshaped management network; data: on host 0, behind the
#                 publisher's shaped link (control and data share it)
#   --sites N|LIST  hosts in sites: N (2..26) sites named A, B, ... or a
#                 comma list of names; the publisher (and the tracker, on
#                 the management network) in the first, replicas as named
#                 (L@SITE) or round-robin. Each site is a bridge of its own
#                 at --rate; every other site is joined to the first by a
#                 wide-area link shaped to --wan-rate each way, and every
#                 process is told its site (--site). The report gives per
#                 version wan_bytes (per site, "in" from the first site and
#                 "out" to it, from the links' counters over the version's
#                 window: its export to the next one's, or the run's end)
#                 and per replica its site and bytes_from_other_sites
#   --wan-rate R  tbf rate of the wide-area links (default 100mbit)
#   --wan-cut S   take every wide-area link down just before version 2 (or
#                 the only one) is exported, for S seconds, then up again:
#                 the sites beyond keep serving what they hold (the tracker,
#                 on the management network, stays reachable) and catch up
#                 when the link returns; the report's wan_cut gives the
#                 wall-clock ms of "down" and "up"
#   --unnamed-sites  with --sites: the same hosts and links, but no process
#                 is told its site (one swarm across the wide-area links:
#                 what tessera did before sites, for comparison)
#
# Exit status: 0 when every replica activated the last version; 3 when all
# but some late replicas did (the report and a line say which); else 1.
set -euo pipefail

BIN=${BIN:-build/bin}
PFX=tsn$$ # this run's namespaces: concurrent runs never meet
NET=10.77.0
PORT=7400
RATE=1gbit
MB=64
VERSIONS=3
EVERY=8000
TIMEOUT=240
KEEP=""
LINKS=""
REPORT=""
MODE=fanout
LINK_MB=0
LATE_TIMEOUT=""
MODEL_DIR=""
ANCHOR_EVERY=""
TRACKER_NET=mgmt
MGMT=10.78.0 # the management network: host i is .i+1, the tracker .254
LAYOUTS=()
LATE=()
SITES_ARG=""
WAN_RATE=100mbit
WAN_CUT=0
UNNAMED=0

die() { echo "netns-cluster: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	[ $# -ge 2 ] || case "$1" in -h|--help|--unnamed-sites) ;; *) die "$1 wants a value" ;; esac
	case "$1" in
	--replica) LAYOUTS+=("$2"); shift 2 ;;
	--late-replica) LATE+=("$2"); shift 2 ;;
	--mode) MODE=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--synthetic-mb) MB=$2; shift 2 ;;
	--model-mb) echo "netns-cluster: --model-mb is deprecated, use --synthetic-mb" >&2; MB=$2; shift 2 ;;
	--versions) VERSIONS=$2; shift 2 ;;
	--every) EVERY=$2; shift 2 ;;
	--timeout) TIMEOUT=$2; shift 2 ;;
	--late-timeout) LATE_TIMEOUT=$2; shift 2 ;;
	--report) REPORT=$2; shift 2 ;;
	--measure-link) LINK_MB=$2; shift 2 ;;
	--keep) KEEP=$2; shift 2 ;;
	--links) LINKS=$2; shift 2 ;;
	--model-dir) MODEL_DIR=$(realpath "$2"); shift 2 ;;
	--anchor-every) ANCHOR_EVERY=$2; shift 2 ;;
	--tracker-net) TRACKER_NET=$2; shift 2 ;;
	--sites) SITES_ARG=$2; shift 2 ;;
	--wan-rate) WAN_RATE=$2; shift 2 ;;
	--wan-cut) WAN_CUT=$2; shift 2 ;;
	--unnamed-sites) UNNAMED=1; shift ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
[ ${#LAYOUTS[@]} -gt 0 ] || LAYOUTS=(tp2 tp2 tp1)
case "$MODE" in
fanout) FANOUT=1 ;;
star) FANOUT=0 ;;
*) die "--mode wants fanout or star, not '$MODE'" ;;
esac
case "$TRACKER_NET" in
mgmt|data) ;;
*) die "--tracker-net wants mgmt or data, not '$TRACKER_NET'" ;;
esac
for n in "$MB" "$VERSIONS" "$EVERY" "$TIMEOUT" "$LINK_MB" "$WAN_CUT" ${LATE_TIMEOUT:+"$LATE_TIMEOUT"}; do
	[[ "$n" =~ ^[0-9]+$ ]] || die "'$n' is not a number"
done
[ "$VERSIONS" -ge 1 ] || die "--versions wants at least 1"
[ "$(id -u)" -eq 0 ] || die "needs root for ip netns and tc"
for t in ip tc curl jq python3; do
	command -v $t >/dev/null || die "$t not found (deploy/install-deps.sh installs it)"
done
for b in tessera tessera-node tessera-tracker; do
	[ -x "$BIN/$b" ] || die "$BIN/$b not built (run make)"
done
BIN=$(cd "$BIN" && pwd)
[ -z "$REPORT" ] || REPORT=$(realpath -m "$REPORT")
[ -z "$LINKS" ] || LINKS=$(realpath -m "$LINKS")
NREP=${#LAYOUTS[@]}
NLATE=${#LATE[@]}
ALL=("${LAYOUTS[@]}" "${LATE[@]}")
NHOST=$((NREP + NLATE)) # replica hosts: 1..NREP, then the late ones
[ "$NHOST" -le 200 ] || die "at most 200 replica hosts"
# Sites: SITES[k] the names (the first the trainer's), SITE_OF[host].
SITES=()
declare -A SITE_OF
if [ -n "$SITES_ARG" ]; then
	if [[ "$SITES_ARG" =~ ^[0-9]+$ ]]; then
		if [ "$SITES_ARG" -lt 2 ] || [ "$SITES_ARG" -gt 26 ]; then die "--sites N wants 2..26"; fi
		LETTERS=ABCDEFGHIJKLMNOPQRSTUVWXYZ
		for k in $(seq 0 $((SITES_ARG - 1))); do SITES+=("${LETTERS:k:1}"); done
	else
		IFS=, read -r -a SITES <<<"$SITES_ARG"
	fi
	for sname in "${SITES[@]}"; do
		[[ "$sname" =~ ^[A-Za-z0-9._-]{1,8}$ ]] || die "site '$sname': want 1..8 of [A-Za-z0-9._-]"
	done
	[ ${#SITES[@]} -ge 2 ] || die "--sites wants two sites or more"
	SITE_OF[0]=${SITES[0]}
	for i in $(seq 1 "$NHOST"); do
		l=${ALL[$((i - 1))]}
		if [[ "$l" == *@* ]]; then
			SITE_OF[$i]=${l##*@}
			ALL[i - 1]=${l%@*}
			printf '%s\n' "${SITES[@]}" | grep -qx "${SITE_OF[$i]}" ||
				die "replica $l: no site '${SITE_OF[$i]}' in --sites"
		else
			SITE_OF[$i]=${SITES[$(((i - 1) % ${#SITES[@]}))]}
		fi
	done
	LAYOUTS=("${ALL[@]:0:$NREP}")
	LATE=("${ALL[@]:$NREP}")
else
	for l in "${ALL[@]}"; do [[ "$l" != *@* ]] || die "replica $l: a site needs --sites"; done
	[ "$WAN_CUT" -eq 0 ] || die "--wan-cut needs --sites"
fi
# The --site a process is given (none without sites, or with --unnamed-sites).
site_args() { # host: SITE_ARGS, the flag that names its site (none unnamed)
	SITE_ARGS=()
	if [ -n "$SITES_ARG" ] && [ "$UNNAMED" -eq 0 ]; then SITE_ARGS=(--site "${SITE_OF[$1]}"); fi
}

DIR=$(mktemp -d -t tessera-netns.XXXXXX)
PIDS=()
TRK_PID=""
PUB_PID=""

# SIGTERM to the processes, then SIGKILL to those still there after 5 s.
stop_pids() { # pid...
	local p n alive
	for p in "$@"; do kill "$p" 2>/dev/null || true; done
	for _ in $(seq 50); do
		alive=0
		for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
		[ $alive -eq 1 ] || break
		sleep 0.1
	done
	for p in "$@"; do kill -9 "$p" 2>/dev/null || true; done
}

cleanup() {
	local rc=$? p rest=()
	trap - EXIT INT TERM
	# The nodes first: stopped, they tell the tracker they leave, so it
	# must still be up; then the publisher; the tracker last.
	for p in "${PIDS[@]}"; do
		[ "$p" = "$TRK_PID" ] || [ "$p" = "$PUB_PID" ] || rest+=("$p")
	done
	[ ${#rest[@]} -eq 0 ] || stop_pids "${rest[@]}"
	[ -z "$PUB_PID" ] || stop_pids "$PUB_PID"
	[ -z "$TRK_PID" ] || stop_pids "$TRK_PID"
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

del_netns() { # namespace
	# Processes left in a namespace would keep it alive: end them.
	ip netns pids "$1" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
	ip netns del "$1" 2>/dev/null || true
}
remove_netns() {
	local ns
	for ns in $(ip netns list | awk '{print $1}' | grep "^$PFX-" || true); do
		del_netns "$ns"
	done
}
# What runs killed too hard to clean up left behind: namespaces named after
# a pid that no longer runs (plain tsn-: older versions of this script).
remove_stale() {
	local ns pid
	for ns in $(ip netns list | awk '{print $1}' | grep -E '^tsn[0-9]*-' || true); do
		pid=${ns%%-*}
		pid=${pid#tsn}
		if [ -z "$pid" ] || ! kill -0 "$pid" 2>/dev/null; then del_netns "$ns"; fi
	done
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
remove_stale
DEADLINE=$((SECONDS + TIMEOUT))

# ---- hosts and links ------------------------------------------------------------
ip netns add $PFX-sw
ip -n $PFX-sw link set lo up
ip -n $PFX-sw link add br0 type bridge
ip -n $PFX-sw link set br0 up
ip -n $PFX-sw link add br1 type bridge # management: not shaped
ip -n $PFX-sw link set br1 up
shape() { # namespace device [rate]
	ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "${3:-$RATE}" burst 1mb latency 400ms
}
# Sites: the first is br0; each other site k a bridge bs<k>, joined to br0
# by the veth pair wa<k> (in br0) - wb<k> (in bs<k>), both ends shaped to
# the wide-area rate: wa<k>'s sent bytes crossed into site k, wb<k>'s out.
site_bridge() { # site name -> its bridge
	local k
	for k in "${!SITES[@]}"; do
		[ "${SITES[$k]}" != "$1" ] || { [ "$k" -eq 0 ] && echo br0 || echo "bs$k"; return; }
	done
}
for k in $(seq 1 $((${#SITES[@]} - 1))); do
	ip -n $PFX-sw link add "bs$k" type bridge
	ip -n $PFX-sw link set "bs$k" up
	ip -n $PFX-sw link add "wa$k" type veth peer name "wb$k"
	ip -n $PFX-sw link set "wa$k" master br0
	ip -n $PFX-sw link set "wb$k" master "bs$k"
	ip -n $PFX-sw link set "wa$k" up
	ip -n $PFX-sw link set "wb$k" up
	shape $PFX-sw "wa$k" "$WAN_RATE"
	shape $PFX-sw "wb$k" "$WAN_RATE"
done
for i in $(seq 0 "$NHOST"); do
	ns=$PFX-h$i
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip link add eth0 netns "$ns" type veth peer name "p$i" netns $PFX-sw
	ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
	ip -n "$ns" link set eth0 up
	if [ -z "$SITES_ARG" ]; then bridge=br0; else bridge=$(site_bridge "${SITE_OF[$i]}"); fi
	ip -n $PFX-sw link set "p$i" master "$bridge"
	ip -n $PFX-sw link set "p$i" up
	shape "$ns" eth0
	shape $PFX-sw "p$i"
	ip link add mgmt0 netns "$ns" type veth peer name "m$i" netns $PFX-sw
	ip -n "$ns" addr add "$MGMT.$((i + 1))/24" dev mgmt0
	ip -n "$ns" link set mgmt0 up
	ip -n $PFX-sw link set "m$i" master br1
	ip -n $PFX-sw link set "m$i" up
done
# The tracker's host: on the management network only.
ip netns add $PFX-ht
ip -n $PFX-ht link set lo up
ip link add mgmt0 netns $PFX-ht type veth peer name mt netns $PFX-sw
ip -n $PFX-ht addr add "$MGMT.254/24" dev mgmt0
ip -n $PFX-ht link set mgmt0 up
ip -n $PFX-sw link set mt master br1
ip -n $PFX-sw link set mt up
# The wide-area links' byte counters, every 100 ms from here on (before
# anything crosses, so that a version's window starts before its bytes):
# "ms in1 out1 in2 out2 ..." for sites 1.. (into the site from the first,
# out of it).
# Counters of the switch's ports, read from the switch namespace's sysfs by
# one process (a tc per sample fell behind on a loaded machine): a line
# "ms c1 c2 ..." every 100 ms, forever.
sample_counters() { # sysfs file...
	exec ip netns exec "$PFX-sw" python3 -c '
import sys, time
while True:
	row = [str(int(time.time() * 1000))]
	for f in sys.argv[1:]:
		with open(f) as fd:
			row.append(fd.read().strip())
	print(" ".join(row), flush=True)
	time.sleep(0.1)' "$@"
}
if [ -n "$SITES_ARG" ]; then
	WAN_FILES=()
	for k in $(seq 1 $((${#SITES[@]} - 1))); do
		WAN_FILES+=("/sys/class/net/wa$k/statistics/tx_bytes" "/sys/class/net/wb$k/statistics/tx_bytes")
	done
	sample_counters "${WAN_FILES[@]}" >"$DIR/wan.tsv" 2>/dev/null &
	PIDS+=($!)
fi
on() { # host command...
	local h=$1
	shift
	ip netns exec "$PFX-h$h" "$@"
}
start() { # host log command... (in the background; $! is the command itself)
	local h=$1 log=$2
	shift 2
	# The fabric takes the data network's interface, never mgmt0.
	ip netns exec "$PFX-h$h" env FI_TCP_IFACE=eth0 "$@" >"$DIR/$log" 2>&1 &
	PIDS+=($!)
}
if [ "$TRACKER_NET" = mgmt ]; then
	TRK_HOST=t
	TRK_ADDR=$MGMT.254
else
	TRK_HOST=0
	TRK_ADDR=$NET.1
fi
TRK=http://$TRK_ADDR:$PORT

# The activation waits poll the tracker every ACTIVE_POLL_S, not 0.5 s: a
# poll (ip netns exec, curl, mv, two jq runs over a 16-replica status) cost
# 0.18 s of CPU on the 2-core VM (20 polls timed at load 20), taken from the
# hosts under test: at N = 16 they keep both cores busy, and perf put the
# polls' processes at about 4.5 % of the machine's samples while the
# version was fetched (more than the publisher's 3.4 %). The times
# reported are the tracker's, not the polls', so polling less only ends
# the script up to ACTIVE_POLL_S later.
ACTIVE_POLL_S=2
wait_for() { # what test-command... (every WAIT_S, 0.5 s unless set)
	local what=$1
	shift
	until "$@"; do
		[ $SECONDS -lt $DEADLINE ] || die "timed out waiting for $what"
		sleep "${WAIT_S:-0.5}"
	done
}
status() {
	on 0 curl -sf --max-time 5 "$TRK/api/v1/status?replicas_limit=1000" >"$DIR/status.json.new" &&
		mv "$DIR/status.json.new" "$DIR/status.json"
}

# ---- b: one lone TCP transfer over the shaped links ---------------------------------
LINK_BPS=0
if [ "$LINK_MB" -gt 0 ]; then
	start 0 link-send.log python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7399)); s.listen(1); c, _ = s.accept()
buf = bytes(1 << 20)
for _ in range(int(sys.argv[2])): c.sendall(buf)
c.close()' "$NET.1" "$LINK_MB"
	LINK_BPS=$(on 1 timeout $((DEADLINE - SECONDS)) python3 -c '
import socket, sys, time
for _ in range(100):
    try:
        c = socket.create_connection((sys.argv[1], 7399)); break
    except OSError: time.sleep(0.1)
# The first quarter fills the tbf burst and the socket buffers: not timed.
total = int(sys.argv[2]) << 20; n = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    n += len(b)
    if t0 is None and n >= total // 4: t0, n0 = time.monotonic(), n
print(int((n - n0) / (time.monotonic() - t0)))' "$NET.1" "$LINK_MB") || die "the link measurement failed"
	echo "netns-cluster: b = $LINK_BPS bytes/s ($((LINK_BPS * 8 / 1000000)) Mbit/s of payload)" \
		"from one $LINK_MB MiB TCP transfer, host 0 -> host 1, its first quarter not timed"
fi

# ---- tracker (its own host, or host 0) and publisher (host 0) -----------------------
"$BIN/tessera" keygen -o "$DIR/trainer" >/dev/null
"$BIN/tessera" keygen --cluster -o "$DIR/cluster.key" >/dev/null
start $TRK_HOST tracker.log "$BIN/tessera-tracker" --listen "$TRK_ADDR:$PORT" --state "$DIR/state" \
	--cluster-key "$DIR/cluster.key" --trainer-pubkey "$DIR/trainer.pub"
TRK_PID=$!
wait_for "the tracker" status
# Versions are exported on order (below), once every replica registered:
# a version covers only the layouts registered when it is made.
SOURCE=(--synthetic-mb "$MB")
[ -z "$MODEL_DIR" ] || SOURCE=(--model-dir "$MODEL_DIR")
[ -z "$ANCHOR_EVERY" ] || SOURCE+=(--anchor-every "$ANCHOR_EVERY")
site_args 0
start 0 publisher.log "$BIN/tessera" publish --tracker "$TRK" --key "$DIR/trainer.key" \
	--cluster-key "$DIR/cluster.key" "${SOURCE[@]}" --layout fsdp2 \
	--control "$DIR/publisher.sock" "${SITE_ARGS[@]}"
PUB_PID=$!
model_known() {
	on 0 curl -sf --max-time 5 "$TRK/api/v1/layouts" | jq -e '.model' >"$DIR/model.json" 2>/dev/null
}
wait_for "the publisher to register the model" model_known

# ---- one host per replica ----------------------------------------------------------
declare -A NODE_PIDS # host -> its node processes (for their CPU time)
# CPU seconds (user + system) the processes used so far, from /proc.
cpu_ms() {
	local p t=0 hz
	hz=$(getconf CLK_TCK)
	for p in "$@"; do
		[ -r "/proc/$p/stat" ] || continue
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo $((t * 1000 / hz))
}
# Bytes the host's data link received so far (everything its ranks read).
rx_bytes() { # host
	ip -n "$PFX-h$1" -s -j link show eth0 | jq '.[0].stats64.rx.bytes'
}
declare -A RX0 # host -> rx_bytes when its replica started
start_replica() { # host (replica R<host>, layout ALL[host-1])
	local i=$1 layout=${ALL[$(($1 - 1))]} ranks r
	RX0[$i]=$(rx_bytes "$i")
	case "$layout" in
	tp[0-9]*) ranks=${layout#tp} ;;
	*) ranks=$(jq '.ranks | length' "$layout") || die "$layout: not a layout file" ;;
	esac
	# One process for every rank of the host, as a host is deployed: its
	# ranks register together (one process per rank would start them
	# seconds apart on a loaded machine, each opening its own fabric).
	site_args "$i"
	start "$i" "node-R$i.log" env TESSERA_FANOUT=$FANOUT "$BIN/tessera-node" \
		--tracker "$TRK" --replica "R$i" --ranks "0-$((ranks - 1))" --layout "$layout" \
		--model "$DIR/model.json" --trainer-pubkey "$DIR/trainer.pub" \
		--cluster-key "$DIR/cluster.key" --host "host$i" --store host "${SITE_ARGS[@]}"
	NODE_PIDS[$i]+=" $!"
}
for i in $(seq 1 "$NREP"); do start_replica "$i"; done
echo "netns-cluster: $((NHOST + 1)) hosts on $NET.0/24, links shaped to $RATE each way;" \
	"replicas ${LAYOUTS[*]}${LATE[*]:+, late ${LATE[*]}}; $MODE;" \
	"$VERSIONS versions of $([ -n "$MODEL_DIR" ] && echo "the model in $MODEL_DIR" || echo "a $MB MiB model") every $EVERY ms"
if [ -n "$SITES_ARG" ]; then
	echo "netns-cluster: sites ${SITES[*]} (trainer in ${SITES[0]}$([ "$UNNAMED" -eq 0 ] ||
		echo ", sites not told to the processes")); replicas" \
		"$(for i in $(seq 1 "$NHOST"); do printf 'R%s@%s ' "$i" "${SITE_OF[$i]}"; done)-" \
		"wide-area links $WAN_RATE each way"
fi

# Each poll keeps every rank's counters, so that versions the ranks have
# moved past still have theirs: replica rank version trainer peers
# duplicate refetched registered_ms, one line per rank.
poll() {
	status || return 1
	jq -r '.replicas[] | .replica as $r | .ranks[] | select(.version > 0)
		| [$r, .rank, .version, .bytes_from_trainer // 0, .bytes_from_peers // 0,
		   .duplicate_bytes // 0, .refetched_bytes // 0, .registered_ms // 0,
		   .bytes_from_other_sites // 0] | @tsv' \
		"$DIR/status.json" >>"$DIR/counters.tsv"
}
active_count() { # version, replicas named in the rest
	local v=$1
	shift
	jq --argjson v "$v" --args '[.activations[] | select(.version == $v) | .replica]
		| unique | map(select(IN($ARGS.positional[]))) | length' "$@" <"$DIR/status.json"
}
RANKS=0
for i in $(seq 1 "$NREP"); do
	case "${ALL[$((i - 1))]}" in
	tp[0-9]*) RANKS=$((RANKS + ${ALL[$((i - 1))]#tp})) ;;
	*) RANKS=$((RANKS + $(jq '.ranks | length' "${ALL[$((i - 1))]}"))) ;;
	esac
done
registered() {
	status && jq -e --argjson n "$RANKS" '.nodes_alive >= $n' "$DIR/status.json" >/dev/null
}
wait_for "the nodes to register" registered
# One version every --every ms (each once the previous one was accepted).
export_version() {
	python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"export\n")
line = s.makefile().readline().strip()
print(line)
sys.exit(0 if line.startswith("published ") else 1)' "$DIR/publisher.sock"
}
# Bytes through the switch's ports: received from host 0 (the trainer's
# uplink, after its shaping), sent toward each replica host (its downlink),
# received from each (its uplink).
sample_links() {
	local i files=(/sys/class/net/p0/statistics/rx_bytes)
	for i in $(seq 1 "$NHOST"); do files+=("/sys/class/net/p$i/statistics/tx_bytes"); done
	for i in $(seq 1 "$NHOST"); do files+=("/sys/class/net/p$i/statistics/rx_bytes"); done
	sample_counters "${files[@]}"
}
if [ -n "$LINKS" ]; then
	sample_links >"$LINKS" 2>/dev/null &
	PIDS+=($!)
fi
# --wan-cut: every wide-area link down just before version 2 (or 1) is
# exported, for WAN_CUT s: the fabric's traffic across it stops, the tracker
# (on the management network) stays reachable.
CUT_V=$([ "$VERSIONS" -ge 2 ] && echo 2 || echo 1)
wan_links() { # up|down
	local k
	for k in $(seq 1 $((${#SITES[@]} - 1))); do ip -n "$PFX-sw" link set "wa$k" "$1"; done
}
(
	for v in $(seq 1 "$VERSIONS"); do
		[ "$v" -eq 1 ] || sleep "$(awk -v ms="$EVERY" 'BEGIN { print ms / 1000 }')"
		if [ "$WAN_CUT" -gt 0 ] && [ "$v" -eq "$CUT_V" ]; then
			wan_links down
			echo "down $(date +%s%3N)" >>"$DIR/cut.log"
			(sleep "$WAN_CUT"; wan_links up; echo "up $(date +%s%3N)" >>"$DIR/cut.log") &
		fi
		export_version || exit 1
	done
	wait
) >"$DIR/exports.log" 2>&1 &
PIDS+=($!)
INITIAL=()
for i in $(seq 1 "$NREP"); do INITIAL+=("R$i"); done
all_active() {
	poll || return 1
	[ "$(active_count "$VERSIONS" "${INITIAL[@]}")" -eq "$NREP" ]
}
WAIT_S=$ACTIVE_POLL_S wait_for "every replica to activate version $VERSIONS" all_active
cp "$DIR/status.json" "$DIR/first-wave.json"

# ---- late replicas ----------------------------------------------------------------
LATE_RC=0
if [ "$NLATE" -gt 0 ]; then
	LATE_NAMES=()
	for i in $(seq $((NREP + 1)) "$NHOST"); do
		start_replica "$i"
		LATE_NAMES+=("R$i")
	done
	echo "netns-cluster: every replica is active on v$VERSIONS; late replicas" \
		"${LATE_NAMES[*]} (${LATE[*]}) started"
	late_active() {
		poll || return 1
		[ "$(active_count "$VERSIONS" "${LATE_NAMES[@]}")" -eq "$NLATE" ]
	}
	LATE_DEADLINE=$DEADLINE
	if [ -n "$LATE_TIMEOUT" ] && [ $((SECONDS + LATE_TIMEOUT)) -lt "$DEADLINE" ]; then
		LATE_DEADLINE=$((SECONDS + LATE_TIMEOUT))
	fi
	until late_active; do
		if [ $SECONDS -ge $LATE_DEADLINE ]; then
			LATE_RC=3
			break
		fi
		sleep "$ACTIVE_POLL_S"
	done
	poll || true
fi
for v in $(seq 1 "$VERSIONS"); do
	on 0 curl -sf --max-time 5 "$TRK/api/v1/versions/$v/timeline" >"$DIR/timeline-$v.json" ||
		echo null >"$DIR/timeline-$v.json"
done

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
# leases_lost: how often its ranks found their lease gone (their logs);
# cpu_ms: the CPU time its node processes used in the whole run.
REPS=$(for i in $(seq 1 "$NHOST"); do
	# shellcheck disable=SC2086 # a list of pids
	jq -cn --arg r "R$i" --arg l "${ALL[$((i - 1))]}" --argjson late "$([ "$i" -gt "$NREP" ] &&
		echo true || echo false)" --argjson lost "$(cat "$DIR"/node-R$i.log 2>/dev/null |
		grep -c 'lease lost' || true)" --argjson cpu "$(cpu_ms ${NODE_PIDS[$i]:-})" \
		--argjson rx "$(($(rx_bytes "$i") - ${RX0[$i]:-0}))" --arg site "${SITE_OF[$i]:-}" \
		'{replica: $r, layout: $l, late: $late, leases_lost: $lost, cpu_ms: $cpu,
		  data_rx_bytes: $rx, site: (if $site == "" then null else $site end)}'
done | jq -cs .)
# What crossed each wide-area link per version: its window runs from its
# export (the manifest's creation) to the next version's, the last to the
# run's end. {} without sites.
python3 -c '
import json, sys
sites = sys.argv[3].split()
rows = []
try:
	rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
except OSError:
	pass
created = {}
for l in open(sys.argv[2]):
	f = l.split()
	if len(f) >= 3 and f[0] == "published":
		created[int(f[1])] = int(f[2])
def at(ms):  # the counters of the last sample at or before ms (else the first)
	best = rows[0]
	for r in rows:
		if r[0] > ms:
			break
		best = r
	return best
out = {}
vs = sorted(created)
for j, v in enumerate(vs):
	if not rows or len(sites) < 2:
		out[str(v)] = {}
		continue
	a = at(created[v])
	b = at(created[vs[j + 1]]) if j + 1 < len(vs) else rows[-1]
	out[str(v)] = {sites[k]: {"in": b[2 * k - 1] - a[2 * k - 1], "out": b[2 * k] - a[2 * k]}
		       for k in range(1, len(sites))}
print(json.dumps(out))' "$DIR/wan.tsv" "$DIR/exports.log" "${SITES[*]:-}" >"$DIR/wan.json"
PUB_CPU=$(cpu_ms "$PUB_PID")
TRK_CPU=$(cpu_ms "$TRK_PID")
LOAD=$(cut -d' ' -f1 /proc/loadavg)
# What each replica's layout holds, i.e. what a version costs it as an anchor:
# the planner's retained bytes, as `tessera cluster` counts them.
ANCHORS=$(for l in "${ALL[@]}"; do
	"$BIN/tessera" plan --model "$DIR/model.json" --from fsdp2 --to "$l" --json |
		jq '.retained_bytes'
done | jq -cs .)
jq -n --slurpfile st "$DIR/status.json" --slurpfile w1 "$DIR/first-wave.json" \
	--rawfile cnt "$DIR/counters.tsv" --argjson reps "$REPS" --arg mode "$MODE" \
	--argjson anchors "$ANCHORS" --rawfile exports "$DIR/exports.log" \
	--argjson ok "$([ $LATE_RC -eq 0 ] && echo true || echo false)" \
	--argjson vmax "$VERSIONS" --argjson wall "$((SECONDS * 1000))" \
	--argjson bps "$(rate_bps "$RATE")" --argjson link "$LINK_BPS" \
	--argjson pubcpu "$PUB_CPU" --argjson trkcpu "$TRK_CPU" --argjson load "$LOAD" \
	--slurpfile wan "$DIR/wan.json" --argjson unnamed "$UNNAMED" \
	--arg wanrate "$([ -z "$SITES_ARG" ] || rate_bps "$WAN_RATE")" \
	--rawfile cut "$( [ -f "$DIR/cut.log" ] || : >"$DIR/cut.log"; echo "$DIR/cut.log")" \
	--slurpfile tl <(for v in $(seq 1 "$VERSIONS"); do cat "$DIR/timeline-$v.json"; echo; done) '
	# rank counters: the highest seen per (replica, rank, version)
	($cnt | split("\n") | map(select(length > 0) | split("\t")
		| {r: .[0], k: .[1], v: (.[2] | tonumber), ft: (.[3] | tonumber),
		   fp: (.[4] | tonumber), dup: (.[5] | tonumber), ref: (.[6] | tonumber),
		   reg: (.[7] | tonumber), far: ((.[8] // "0") | tonumber)})) as $rows
	| ($rows | group_by([.r, .k, .v]) | map({r: .[0].r, k: .[0].k, v: .[0].v,
		ft: (map(.ft) | max), fp: (map(.fp) | max), dup: (map(.dup) | max),
		ref: (map(.ref) | max), far: (map(.far) | max)})) as $ranks
	| ($rows | map(select(.reg > 0)) | group_by(.r)
		| map({key: .[0].r, value: (map(.reg) | min)}) | from_entries) as $reg
	# the lines "published V CREATED KIND WIRE ANCHOR ENCODE_US" of the exports
	| ($exports | split("\n") | map(select(startswith("published ")) | split(" ")
		| {key: .[1], value: ((.[6] | tonumber) / 1000)}) | from_entries) as $encode
	| ([range(0; $reps | length) | select($reps[.].late | not) | $anchors[.]] | add // 0)
		as $anchor_all
	| $st[0] as $s
	| {ok: $ok, mode: $mode, wall_ms: $wall, link_rate_bps: $bps,
	   link_bytes_per_s: $link, publisher_cpu_ms: $pubcpu, tracker_cpu_ms: $trkcpu,
	   loadavg_1m: $load,
	   sites_named: ($wan[0] | length > 0 and $unnamed == 0),
	   wan_rate_bps: (if $wanrate == "" then null else ($wanrate | tonumber) end),
	   wan_cut: ($cut | split("\n") | map(select(length > 0) | split(" ")
		| {key: .[0], value: (.[1] | tonumber)}) | from_entries),
	   versions: [range(1; $vmax + 1) as $v
		| (($s.versions | map(select(.version == $v)) | .[0]) // {}) as $sv
		| ((if $v == $vmax then $w1[0] else $s end).versions
		   | map(select(.version == $v)) | .[0] // {}) as $tot
		| {version: $v, kind: ($sv.kind // "anchor"), payload_bytes: ($sv.wire_bytes // 0),
		   created_ms: ($sv.created_ms // null),
		   trainer_upload_bytes: ($tot.bytes_from_trainer // 0),
		   peer_upload_bytes: ($tot.bytes_from_peers // 0),
		   duplicate_bytes: ($tot.duplicate_bytes // 0),
		   refetched_bytes: ($tot.refetched_bytes // 0),
		   wire_bytes: (($tot.bytes_from_trainer // 0) + ($tot.bytes_from_peers // 0)),
		   anchor_bytes: $anchor_all, encode_ms: ($encode[$v | tostring] // 0),
		   t_published_ms: (($sv.published_ms // 0) - ($sv.created_ms // 0)),
		   replicas: [$reps[] | select(.late == false or $v == $vmax) | . as $p
			| ($s.activations | map(select(.replica == $p.replica and .version == $v))
			   | .[0]) as $a
			| ($ranks | map(select(.r == $p.replica and .v == $v))) as $rk
			| $p + {activated: ($a != null),
				t_activate_ms: (if $a == null then null
					elif $p.late then $a.wall_ms - ($reg[$p.replica] // $a.wall_ms)
					else $a.wall_ms - $sv.created_ms end),
				bytes_from_trainer: ($rk | map(.ft) | add // 0),
				bytes_from_peers: ($rk | map(.fp) | add // 0),
				duplicate_bytes: ($rk | map(.dup) | add // 0),
				refetched_bytes: ($rk | map(.ref) | add // 0),
				bytes_from_other_sites: ($rk | map(.far) | add // 0)}],
		   wan_bytes: ($wan[0][$v | tostring] // {}),
		   timeline: $tl[$v - 1]}]}' >"$DIR/report.json"
[ -z "$REPORT" ] || cp "$DIR/report.json" "$REPORT"

# What one replica of each site holds (its layout's bytes, the smallest).
ANCHORSITE=$(for i in $(seq 1 "$NHOST"); do
	jq -cn --arg s "${SITE_OF[$i]:-}" --argjson n "$(echo "$ANCHORS" | jq ".[$((i - 1))]")" \
		'{site: $s, need: $n}'
done | jq -cs 'group_by(.site) | map({site: .[0].site, need: (map(.need) | min)})')
jq -r --argjson vmax "$VERSIONS" --argjson pub "$PUB_CPU" --argjson trk "$TRK_CPU" \
	--argjson load "$LOAD" --argjson anchorsite "$ANCHORSITE" \
	--argjson ncpu "$(nproc)" '.link_rate_bps as $bps | .versions[] | . as $v
	| ([.replicas[] | select(.late | not) | .t_activate_ms // empty]) as $t
	| "v\(.version): \(.trainer_upload_bytes / 1048576 | floor) MiB from the trainer, "
	  + "\(.peer_upload_bytes / 1048576 | floor) MiB from peers, "
	  + "\(.duplicate_bytes / 1048576 | floor) MiB duplicate, "
	  + "\(.refetched_bytes / 1048576 | floor) MiB refetched; replicas active "
	  + ([.replicas[] | select(.late | not)]
	     | map("\(.replica) \(if .activated then "\(.t_activate_ms / 1000)s" else "-" end)")
	     | join(", "))
	  + (if ($t | length) > 0 and ($t | max) > 0 then
	       "; trainer upload \(.trainer_upload_bytes * 8 / (($t | max) / 1000) / 1e6 | floor)"
	       + " Mbit/s = \(.trainer_upload_bytes * 8 / (($t | max) / 1000) / $bps * 100
	                    | floor / 100) of the link"
	     else "" end),
	  (.wan_bytes | to_entries[] | . as $w
	   | ([$anchorsite[] | select(.site == $w.key)] | .[0].need // 0) as $need
	   | "  wide-area link to \($w.key): \($w.value.in / 1048576 * 100 | floor / 100) MiB in,"
	   + " \($w.value.out / 1048576 * 100 | floor / 100) MiB out"
	   + (if $need > 0 then " (\($w.value.in / $need * 100 | floor / 100) x what one replica of"
	      + " \($w.key) holds)" else "" end)),
	  (.replicas[] | select(.late) | "  late \(.replica) (\(.layout)): "
	   + (if .activated then "active on v\($v.version) \(.t_activate_ms / 1000)s after it registered"
	      else "DID NOT activate v\($v.version) within the time bound" end)
	   + ", \(.bytes_from_trainer / 1048576 | floor) MiB from the trainer,"
	   + " \(.bytes_from_peers / 1048576 | floor) MiB from peers"),
	  # Where the time went: the median of each phase over the ranks, from the
	  # timeline of the version (publisher: asked, snapshot, published; ranks:
	  # first and last byte, verified, active).
	  (.timeline | select(type == "object") | . as $tl
	   | [.replicas[]?.ranks[]?] as $rk
	   | def med(f): [$rk[] | f | select(. != null and . >= 0)] | sort
		| if length == 0 then "-" else .[length / 2 | floor] / 1000 | tostring end;
	   "  phases, median over ranks (s): export -> published "
	   + "\((($tl.published_ms // 0) - ($tl.export_asked_ms // 0)) / 1000), published -> first byte "
	   + med(.first_byte_ms - $tl.published_ms) + ", first -> last byte "
	   + med(.last_byte_ms - .first_byte_ms) + ", last byte -> verified "
	   + med(.verified_ms - .last_byte_ms) + ", verified -> active " + med(.activated_ms - .verified_ms)
	   + "; leases lost \([$v.replicas[].leases_lost] | add // 0)"),
	  (select(.version == $vmax) | "  CPU: nodes \([$v.replicas[].cpu_ms] | sort | .[length / 2 | floor] / 1000) s"
	   + " each (median, whole run), publisher \($pub / 1000) s, tracker \($trk / 1000) s;"
	   + " load average \($load) on"
	   + " \($ncpu) CPUs")
' "$DIR/report.json"
# How full the trainer's uplink was: each 100 ms sample's bytes against
# the shaped rate, from the first to the last sample that sent more than
# 64 KiB (have-page reads and control traffic stay under it).
if [ -n "$LINKS" ] && [ -s "$LINKS" ]; then
	python3 -c '
import json, sys
bps = int(sys.argv[2])
rows = [list(map(int, l.split()[:2])) for l in open(sys.argv[1]) if len(l.split()) >= 2]
busy = [i for i in range(1, len(rows)) if rows[i][1] - rows[i - 1][1] > 65536]
if not busy:
    print("  trainer uplink: idle"); sys.exit()
f, l = busy[0], busy[-1]
use = lambda i, j: (rows[j][1] - rows[i][1]) * 8 / bps / ((rows[j][0] - rows[i][0]) / 1000)
u = sorted(min(use(i - 1, i), 1.2) for i in range(f, l + 1))
q = lambda x: u[int(x * (len(u) - 1))]
print("  trainer uplink: %.2f of the link from its first to its last busy sample (%.1f s);"
      " per 100 ms: quartiles %.2f %.2f %.2f" % (use(f - 1, l), (rows[l][0] - rows[f - 1][0]) / 1000,
                                                  q(0.25), q(0.5), q(0.75)))
# The tail: every byte a replica lacks when the trainer sends its last one
# (the chunks still crossing the swarm, and what a replica fell behind by)
# comes at its downlink rate after it. Not with late replicas: the
# last bytes the trainer sent may be theirs.
vs = json.load(open(sys.argv[3]))["versions"]
v = vs[-1]
t = [r["t_activate_ms"] for r in v["replicas"] if r["activated"] and not r["late"]]
late = any(r["late"] for r in v["replicas"])
if t and not late and isinstance(v.get("timeline"), dict) and v["timeline"].get("export_asked_ms"):
    created = v["timeline"]["export_asked_ms"]
    first = ("its first bytes %.1f s and " % ((rows[f - 1][0] - created) / 1000)) if len(vs) == 1 else ""
    # Each from the start of its 100 ms sample: the last bytes left in
    # the 100 ms after the time given.
    print("  v%d: the trainer sent %sits last %.1f s after the manifest'"'"'s creation; the last"
          " replica was active %.1f s after that (100 ms samples)" %
          (v["version"], first, (rows[l - 1][0] - created) / 1000,
           (created + max(t) - rows[l - 1][0]) / 1000))' "$LINKS" "$(rate_bps "$RATE")" "$DIR/report.json"
fi
if [ $LATE_RC -ne 0 ]; then
	echo "netns-cluster: late replicas did not all activate v$VERSIONS within the time bound" \
		"($SECONDS s)${REPORT:+; report $REPORT}"
	exit 3
fi
echo "netns-cluster: ok in $SECONDS s (times from each manifest's creation to activation;" \
	"late replicas from their registration)${REPORT:+; report $REPORT}"
