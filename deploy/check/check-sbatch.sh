#!/bin/bash
# Runs the Slurm batch script dry, with srun and scontrol stubbed (no Slurm
# needed), for a one-host tp2 job, and checks the node agent it starts:
# one task per node serving both ranks of the host (--ranks 0-1), attach
# sockets in a directory (--attach DIR/), the group's bits and group when
# TESSERA_ATTACH_GROUP names one. Prints one line per problem.
#   deploy/check/check-sbatch.sh SCRIPT      exit 0 when it holds, else 1
set -euo pipefail

SCRIPT=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/stub" "$T/dir"
: >"$T/dir/trainer.pub"
: >"$T/dir/model.json"
cat >"$T/stub/scontrol" <<'STUB'
#!/bin/sh
echo host0
STUB
# The tracker's step says it listens and waits; the agents' step records
# its command line, one word a line.
cat >"$T/stub/srun" <<'STUB'
#!/bin/bash
for a in "$@"; do
	case $a in
	*tessera-tracker) echo "listening on 0.0.0.0:7070"; exec sleep 30 ;;
	esac
done
printf '%s\n' "$@" >"$STUB_OUT"
STUB
chmod +x "$T/stub/scontrol" "$T/stub/srun"

fails=0
problem() { echo "check-sbatch: $1: $2" >&2; fails=$((fails + 1)); }
# The word after $1 in the recorded command line.
after() { grep -A1 -x -- "$1" "$2" | sed -n 2p || true; }

for group in "" tessera; do
	out=$T/node-${group:-user}.args
	PATH=$T/stub:$PATH STUB_OUT=$out TESSERA_BIN=$T/stub TESSERA_DIR=$T/dir \
		TESSERA_LAYOUT=tp2 TESSERA_RUN=/run/x TESSERA_ATTACH_GROUP=$group \
		SLURM_JOB_ID=1 bash "$SCRIPT" >"$T/out" 2>&1 || {
		problem "$1" "exited non-zero: $(tail -n 1 "$T/out")"
		continue
	}
	what="the agent's step${group:+ with TESSERA_ATTACH_GROUP=$group}"
	[ -s "$out" ] || { problem "$1" "$what never ran"; continue; }
	grep -qx -- '--ntasks-per-node=1' "$out" || problem "$1" "$what is not one task per node"
	[ "$(after --ranks "$out")" = 0-1 ] || problem "$1" "$what does not serve ranks 0-1 of a tp2 host (--ranks)"
	case $(after --attach "$out") in
	/run/x/) ;;
	*) problem "$1" "$what has no --attach TESSERA_RUN/ (one socket per rank)" ;;
	esac
	mode=$(after --attach-mode "$out")
	if [ -n "$group" ]; then
		[ "$(after --attach-group "$out")" = "$group" ] || problem "$1" "$what gives the sockets no --attach-group"
		if [ -z "$mode" ] || [ $((0$mode & 060)) -ne $((060)) ]; then
			problem "$1" "$what: --attach-mode ${mode:-unset} shuts the group out (0660)"
		fi
	fi
done
[ "$fails" -eq 0 ] || exit 1
echo "check-sbatch: $1: one agent per host serving every rank, attach sockets per rank"
