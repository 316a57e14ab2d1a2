#!/bin/bash
# The status page, checked by eye and by a headless browser: runs a small
# cluster on loopback (tracker, a publisher of two trainer ranks, replicas A
# and B in tp2 and C in tp1, one node per rank), publishes a few versions,
# stops C's node so that it shows dead, checks the page's parts (layout
# names, the update timeline charts, folded old versions, the dead node) and
# loads it in headless Chromium, which saves a screenshot outside the
# repository. Installs Chromium (Debian's `chromium`) when it is missing.
#
# usage: tests/check-page.sh [--versions V] [--out FILE.png] [--keep DIR]
#   --versions V  versions to publish (default 7: two fold away)
#   --out FILE    the screenshot (default $TMPDIR/tessera-status-page.png)
#   --keep DIR    copy the logs and the page's HTML to DIR
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
	if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp -r "$DIR"/*.log "$DIR"/page.html "$KEEP"/ 2>/dev/null || true; fi
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
start_replica() { # name layout ranks
	for ((r = 0; r < $3; r++)); do
		"$BIN/tessera-node" --tracker "$URL" --replica "$1" --rank $r --layout "$2" \
			--model model.json --trainer-pubkey trainer.pub --store host \
			>"node-$1-$r.log" 2>&1 &
		PIDS+=($!)
		NODE[$1-$r]=$!
	done
}
start_replica A tp2 2
start_replica B tp2 2
start_replica C tp1 1
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
	die "$3 (logs: $(ls "$DIR"/*.log | tr '\n' ' '))"
}
wait_for "[.replicas[] | select(.active == $VERSIONS)] | length == 3" 240 \
	"not every replica activated v$VERSIONS"
echo "check-page: v$VERSIONS active on A, B and C at $URL/"
kill "${NODE[C-0]}"
wait_for '[.replicas[] | select(.replica == "C") | .ranks[0].alive] == [false]' 30 \
	"C's stopped node still shows alive"

curl -sf "$URL/" >page.html
check() { grep -q -- "$1" page.html || die "the page lacks $2"; }
check '<svg class="timeline"' "the update timeline chart"
check 'tp2 (2 ranks)' "layout names"
check '>dead<' "the dead node"
check '<details><summary>' "folded old versions"
check "<title>transfer: " "transfer bars in the chart"

mkdir -p "$(dirname "$OUT")"
rm -f "$OUT"
timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync \
	--user-data-dir="$DIR/chromium-profile" --hide-scrollbars --window-size=1280,1100 \
	--screenshot="$OUT" "$URL/" >chromium.log 2>&1 || true
[ -s "$OUT" ] || die "chromium wrote no screenshot: $(tail -5 chromium.log)"
echo "check-page: ok; screenshot $OUT"
