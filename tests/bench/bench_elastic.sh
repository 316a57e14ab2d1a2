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
# For each late replica it also prints what its host's data link received
# against the bytes it needed (reads' framing and any bytes read along),
# and for the late tp4 replica a timeline from its first rank's
# registration: the publisher asked to extend the version, the addendum
# posted and seen by each rank, first and last byte, activation (the
# processes log at info level for it; their logs are kept meanwhile).
#
# BENCH_ELASTIC_MB (default 64) shrinks it; BENCH_ELASTIC_KEEP=DIR keeps the
# run's logs, status and report there.
set -uo pipefail

BIN=${BIN:-build/bin}
MB=${BENCH_ELASTIC_MB:-64}
RATE=100mbit
RATE_BPS=$((100 * 1000000 / 8))
HERE=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$(mktemp -d -t tessera-bench-elastic.XXXXXX)
KEEP_DIR=${BENCH_ELASTIC_KEEP:-}
trap '[ -z "$KEEP_DIR" ] || { mkdir -p "$KEEP_DIR" && cp -r "$OUT"/. "$KEEP_DIR"/; }; rm -rf "$OUT"' EXIT

SB=$((MB * 1048576 / RATE_BPS + 1))
LATE_S=$((4 * SB + 30))
TIMEOUT=$((6 * SB + 90 + LATE_S))
echo "bench-elastic: tp2 tp2 tp1 tp1 then late tp4 tp1, one ${MB} MiB version, links $RATE;" \
	"at most $TIMEOUT s"
TESSERA_LOG=${TESSERA_LOG:-info} BIN=$BIN "$HERE/deploy/netns-cluster.sh" --replica tp2 --replica tp2 --replica tp1 --replica tp1 \
	--late-replica tp4 --late-replica tp1 --rate "$RATE" --synthetic-mb "$MB" --versions 1 \
	--timeout "$TIMEOUT" --late-timeout "$LATE_S" --measure-link 32 --report "$OUT/report.json" --keep "$OUT/keep" \
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
	     + " \($got / 1048576 | round) MiB from peers (goal >= 95 %); its link received"
	     + " \(if $got > 0 then .data_rx_bytes / $got * 100 | round / 100 else 0 end) x those bytes")
' "$OUT/report.json"
# The late tp4 replica's timeline, from its logs and the tracker's figures.
python3 - "$OUT/report.json" "$OUT/keep" <<'PY' || echo "  (no timeline: $?)"
import datetime, json, re, sys

rep = json.load(open(sys.argv[1]))
keep = sys.argv[2]
st = json.load(open(keep + "/status.json"))
v = rep["versions"][-1]
late = [r for r in v["replicas"] if r["late"] and r["layout"] == "tp4"]
if not late:
    sys.exit(0)
name = late[0]["replica"]

def stamp(line):  # the log line's wall time, ms
    t = datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp() * 1000

def first(path, pat):
    for line in open(path, errors="replace"):
        if re.search(pat, line):
            return stamp(line)
    return None

ranks = {r["rank"]: r for p in st["replicas"] if p["replica"] == name for r in p["ranks"]}
reg = {k: r.get("registered_ms") for k, r in ranks.items()}
log = keep + "/node-%s.log" % name  # the host's one process, every rank
for k in list(reg):  # first registration, not a re-registration
    t = first(log, r"node %s/%d: registered \(lease" % (name, k))
    if t is not None:
        reg[k] = t
t0 = min(t for t in reg.values() if t)
def s(t):
    return "-" if t is None else "%.2f" % ((t - t0) / 1000)
pub = keep + "/publisher.log"
asked = first(pub, r"lacks layout .*extending it by addendum")
made = first(pub, r"extended by \d+ addend")
lay = [p["layout_digest"] for p in st["replicas"] if p["replica"] == name][0]
stored = [a["published_ms"] for x in st["versions"] for a in x.get("addenda", [])
          if a["layout_digest"] == lay]
seen = {k: first(log, r"node %s/%d: v\d+ extended for our layout" % (name, k)) for k in sorted(reg)}
tl = [p for p in (v.get("timeline") or {}).get("replicas", []) if p["replica"] == name]
rk = {r["rank"]: r for r in tl[0]["ranks"]} if tl else {}
ks = sorted(reg)
print("  late tp4 (%s) timeline, s from its first rank's registration (ranks %s):"
      % (name, " ".join(map(str, ks))))
print("    registered      " + " ".join(s(reg[k]) for k in ks))
print("    addendum: the publisher extends the version at %s, posts it at %s, the tracker stores it at %s"
      % (s(asked), s(made), s(stored[0] if stored else None)))
print("    addendum seen   " + " ".join(s(seen[k]) for k in ks))
for what, key in (("first byte", "first_byte_ms"), ("last byte", "last_byte_ms"),
                  ("verified", "verified_ms"), ("active", "activated_ms")):
    print("    %-15s " % what + " ".join(s(rk.get(k, {}).get(key)) for k in ks))
print("    replica active at %s" % s(tl[0].get("activated_ms") if tl else None))
PY
