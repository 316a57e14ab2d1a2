#!/bin/bash
# The status page, checked by eye and by a headless browser: runs a small
# cluster on loopback (tracker, a publisher of two trainer ranks on a
# 1.5 s clock, one node per rank) with replicas that each show a view:
#   A  tp2, plain: current;
#   B  tp2, slow (TESSERA_FETCH_MBPS): behind, with its rate, sources and
#      expected finish;
#   C  tp1, its node stopped: dead;
#   F  tp1, installing in place with TESSERA_TEST_INPLACE_FAIL at the last
#      version: a rank failed for real, with its error;
#   L  tp1, started after several versions: late (cut on the shared scale).
# Once the versions are out it checks the page's parts: every replica not
# current says why, the timelines share one time scale, the publisher's
# clock shows late once it stops, the page of a version (/versions/N) and
# its bad input; then loads the status page and a version's page in
# headless Chromium, which saves screenshots outside the repository.
# Installs Chromium (Debian's `chromium`) when it is missing.
#
# usage: tests/check-page.sh [--versions V] [--out FILE.png] [--keep DIR]
#   --versions V  versions to publish (default 7: two fold away)
#   --out FILE    the screenshot of the status page (default
#                 $TMPDIR/tessera-status-page.png); the version's page goes
#                 beside it as FILE-version.png
#   --keep DIR    copy the logs and the pages' HTML to DIR
# `make check-page` runs it; it is not part of `make test`.
set -euo pipefail

BIN=${BIN:-build/bin}
VERSIONS=7
OUT=${TMPDIR:-/tmp}/tessera-status-page.png
KEEP=""
die() { echo "check-page: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--versions) VERSIONS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--keep) KEEP=$2; shift 2 ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown option '$1' (see --help)" ;;
	esac
done
for b in tessera tessera-node tessera-tracker; do
	[ -x "$BIN/$b" ] || die "$BIN/$b not built (run make)"
done
for t in curl jq; do
	command -v $t >/dev/null || die "$t not found (deploy/install-deps.sh installs it)"
done
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
	[ "$(id -u)" -eq 0 ] || die "chromium is not installed (apt-get install chromium, as root)"
	echo "check-page: installing chromium" >&2
	apt-get install -y --no-install-recommends chromium >/dev/null ||
		{ apt-get update >/dev/null && apt-get install -y --no-install-recommends chromium >/dev/null; } ||
		die "cannot install chromium"
	CHROMIUM=$(command -v chromium)
fi
BIN=$(cd "$BIN" && pwd)
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac

DIR=$(mktemp -d -t tessera-page.XXXXXX)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$DIR"/*.log "$DIR"/*.html "$DIR"/*.json "$KEEP"/ 2>/dev/null || true; fi
	rm -rf "$DIR"
}
trap cleanup EXIT
cd "$DIR"
export TESSERA_LEASE_MS=2000 # a stopped node shows dead within seconds

"$BIN/tessera" keygen -o trainer >/dev/null
"$BIN/tessera" model --synthetic-mb 32 -o model.json 2>/dev/null
"$BIN/tessera-tracker" --listen 127.0.0.1:0 --state state --trainer-pubkey trainer.pub \
	>tracker.log 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -q '^listening on ' tracker.log && break; sleep 0.1; done
URL=$(sed -n 's/^listening on //p' tracker.log)
[ -n "$URL" ] || die "the tracker did not start: $(cat tracker.log)"

declare -A NODE
start_replica() { # name layout ranks [option...]: environment from REPLICA_ENV
	local name=$1 layout=$2 n=$3
	shift 3
	for ((r = 0; r < n; r++)); do
		env $REPLICA_ENV "$BIN/tessera-node" --tracker "$URL" --replica "$name" --rank $r \
			--layout "$layout" --model model.json --trainer-pubkey trainer.pub --store host "$@" \
			>"node-$name-$r.log" 2>&1 &
		PIDS+=($!)
		NODE[$name-$r]=$!
	done
}
REPLICA_ENV="" start_replica A tp2 2
REPLICA_ENV="TESSERA_FETCH_MBPS=3" start_replica B tp2 2
REPLICA_ENV="" start_replica C tp1 1
REPLICA_ENV="TESSERA_TEST_INPLACE_FAIL=$VERSIONS" start_replica F tp1 1 --install in-place
# The publisher goes first at the tracker: nodes retry until it did.
"$BIN/tessera" publish --tracker "$URL" --key trainer.key --synthetic-mb 32 --layout fsdp2 \
	--every 1500 --versions "$VERSIONS" >publish.log 2>&1 &
PIDS+=($!)

status() { curl -sf --max-time 5 "$URL/api/v1/status"; }
wait_for() { # jq condition, seconds, what
	for ((i = 0; i < $2 * 5; i++)); do
		status | jq -e "$1" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	status >status-at-failure.json 2>/dev/null || true
	die "$3 (logs: $(ls "$DIR"/*.log | tr '\n' ' '))"
}
rep() { echo "(.replicas[] | select(.replica == \"$1\"))"; }

wait_for "[$(rep A) | select(.active >= 3)] | length == 1" 120 "A did not activate v3"
REPLICA_ENV="" start_replica L tp1 1
echo "check-page: v3 active on A; late replica L started"
wait_for "[$(rep A), $(rep L) | select(.active == $VERSIONS)] | length == 2" 240 \
	"A and L did not activate v$VERSIONS"
wait_for "$(rep F) | .why | test(\"failed\")" 60 "F shows no failure"
wait_for "$(rep B) | .state != \"current\" and (.why | test(\"MB/s\"))" 60 \
	"the slow replica B shows no rate"
echo "check-page: v$VERSIONS active on A and L at $URL/; B slow, F failed"
kill "${NODE[C-0]}"
wait_for "[$(rep C) | .ranks[0].alive] == [false]" 30 "C's stopped node still shows alive"
wait_for '.publishers[0].clock.late == true' 30 "the stopped publisher clock never shows late"

status >status.json
curl -sf "$URL/" >page.html
curl -sf "$URL/versions/$VERSIONS" >version.html || die "/versions/$VERSIONS did not answer 200"
check() { grep -q -- "$1" "${3:-page.html}" || die "the ${3:-page} lacks $2"; }
check '<svg class="timeline"' "the update timeline chart"
check 'tp2 (2 ranks)' "layout names"
check '>dead<' "the dead node"
check '<details><summary>' "folded old versions"
check "<title>transfer: " "transfer bars in the chart"
check 'class="why st-failed\|(F/0) failed' "F's failure"
check '<td class="late">every 1.5 s' "the late publisher's clock"
check '<a href="/versions/' "links to the versions' pages"
# Every replica not current says why, in the JSON and on the page.
jq -e '[.replicas[] | select(.state != "current") | select((.why // "") == "")] | length == 0' \
	status.json >/dev/null || die "a replica behind shows no reason: $(jq -c '[.replicas[] | {replica, state, why}]' status.json)"
shown=$(jq '.replicas | length' status.json)
said=$(grep -o 'class="why st-[a-z]*"><b>[a-z]*</b>: [^<]' page.html | wc -l)
[ "$said" -eq "$shown" ] || die "the page says why for $said of $shown replicas"
# One time scale: every timeline chart drawn at the same span.
spans=$(grep -o '<svg class="timeline" data-span-ms="[0-9]*"' page.html | sort -u | wc -l)
charts=$(grep -o '<svg class="timeline"' page.html | wc -l)
[ "$charts" -ge 2 ] && [ "$spans" -eq 1 ] || die "timelines not on one scale ($charts charts, $spans spans)"
check 'class="scale"' "the shared scale's note"
# The version's page, and its bad input.
check "<h1>version $VERSIONS</h1>" "its heading" version.html
check '<svg class="timeline"' "its timeline" version.html
check '<th>from peers</th>' "bytes by source" version.html
for bad in abc 99999999999999999999 0; do
	code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/versions/$bad")
	[ "$code" = 400 ] || die "/versions/$bad answered $code, not 400"
done
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/versions/$((VERSIONS + 100))")
[ "$code" = 404 ] || die "an unknown version's page answered $code, not 404"

shoot() { # url file
	rm -f "$2"
	timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--user-data-dir="$DIR/chromium-profile" --hide-scrollbars --window-size=1400,2000 \
		--screenshot="$2" "$1" >>chromium.log 2>&1 || true
	[ -s "$2" ] || die "chromium wrote no screenshot of $1: $(tail -5 chromium.log)"
}
mkdir -p "$(dirname "$OUT")"
VOUT=${OUT%.png}-version.png
shoot "$URL/" "$OUT"
shoot "$URL/versions/$VERSIONS" "$VOUT"
echo "check-page: ok; screenshots $OUT and $VOUT"
