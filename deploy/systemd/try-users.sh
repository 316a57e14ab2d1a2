#!/bin/bash
# Runs the node unit's user model without systemd (root, loopback): the
# node runs as an unprivileged uid with a supplementary group, as the unit
# runs it (DynamicUser=yes, SupplementaryGroups=tessera), with the attach
# flags of the unit's ExecStart (--attach-group given as a numeric gid, so
# that no group has to be made); a tracker and `tessera publish` give it
# a version. An engine's uid in the group must attach and read it
# (`tessera probe`); one outside the group must be refused. Stops what it
# started.
#   deploy/systemd/try-users.sh [BUILD_BIN]
set -euo pipefail

BIN=$(cd "${1:-build/bin}" && pwd)
UNIT=$(cd "$(dirname "$0")" && pwd)/tessera-node@.service
NODE_UID=61001 GROUP=61010 ENGINE_UID=61002 OTHER_UID=61003 PORT=17271
[ "$(id -u)" -eq 0 ] || { echo "try-users: run as root (it switches uids)" >&2; exit 2; }
T=$(mktemp -d)
chmod 0755 "$T"
PIDS=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

# The unit's attach flags, its directory replaced by one here.
read -r -a FLAGS <<<"$(sed -n 's/^ExecStart=.*\(--attach [^ ]* --attach-mode [0-7]* --attach-group [^ ]*\).*/\1/p' "$UNIT")"
[ "${#FLAGS[@]}" -eq 6 ] || { echo "try-users: no --attach, --attach-mode, --attach-group in $UNIT" >&2; exit 1; }
FLAGS[1]=$T/run/
FLAGS[5]=$GROUP
echo "try-users: the unit's ${FLAGS[*]}"

"$BIN/tessera" cluster --synthetic-mb 4 --keep "$T/keep" >/dev/null
chmod -R a+rX "$T/keep"
chown "$NODE_UID" "$T/keep/cluster.key" # as the unit's credential
chmod 0600 "$T/keep/cluster.key"
mkdir -m 0755 "$T/run"
chown "$NODE_UID" "$T/run" # the unit's RuntimeDirectory is its user's
"$BIN/tessera-tracker" --listen "127.0.0.1:$PORT" --state "$T/state" --trainer-pubkey "$T/keep/trainer.pub" \
	--cluster-key "$T/keep/cluster.key" >"$T/tracker.out" 2>"$T/tracker.log" &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q '^listening on ' "$T/tracker.out" && break; sleep 0.1; done
setpriv --reuid="$NODE_UID" --regid="$NODE_UID" --groups="$GROUP" \
	"$BIN/tessera-node" --tracker "http://127.0.0.1:$PORT" --replica A --rank 0 --layout tp1 \
	--model "$T/keep/model.json" --trainer-pubkey "$T/keep/trainer.pub" --cluster-key "$T/keep/cluster.key" \
	--store host --expose "$T/run" "${FLAGS[@]}" >"$T/node.out" 2>"$T/node.log" &
PIDS+=($!)
"$BIN/tessera" publish --tracker "http://127.0.0.1:$PORT" --key "$T/keep/trainer.key" \
	--cluster-key "$T/keep/cluster.key" --synthetic-mb 4 >"$T/publish.out" 2>"$T/publish.log" &
PIDS+=($!)
for _ in $(seq 1 100); do [ -S "$T/run/A-0.sock" ] && break; sleep 0.1; done

if ! setpriv --reuid="$ENGINE_UID" --regid="$ENGINE_UID" --groups="$GROUP" \
	"$BIN/tessera" probe --attach "$T/run/A-0.sock" --replica A --min-version 1 --timeout-ms 30000; then
	echo "try-users: uid $ENGINE_UID in group $GROUP could not attach; node log:" >&2
	tail -n 5 "$T/node.log" >&2
	exit 1
fi
if setpriv --reuid="$OTHER_UID" --regid="$OTHER_UID" --clear-groups \
	"$BIN/tessera" probe --attach "$T/run/A-0.sock" --replica A --timeout-ms 5000 2>"$T/other.err"; then
	echo "try-users: uid $OTHER_UID outside group $GROUP attached" >&2
	exit 1
fi
grep -q 'Permission denied' "$T/other.err" || { cat "$T/other.err" >&2; exit 1; }
echo "try-users: uid $ENGINE_UID in the sockets' group attached; uid $OTHER_UID outside it was refused"
