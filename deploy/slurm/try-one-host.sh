#!/bin/bash
# Tries deploy/slurm/tessera.sbatch on a one-host Slurm cluster (Debian's
# slurm-wlm and munge, as root): starts munged, slurmctld and slurmd with a
# private slurm.conf, submits the batch script for this host (one agent
# serving both ranks of a tp2 replica), publishes one version with `tessera
# publish`, and passes when this host's agent reports it active on /metrics
# for both ranks and an engine-like client (`tessera probe`) attached to
# each rank's socket reads it. Stops what it started.
#   deploy/slurm/try-one-host.sh [BUILD_BIN]
set -euo pipefail

BIN=$(cd "${1:-build/bin}" && pwd)
SBATCH_SCRIPT=$(cd "$(dirname "$0")" && pwd)/tessera.sbatch
T=$(mktemp -d)
H=$(hostname)
PIDS=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	if [ -n "${JOB:-}" ]; then
		scancel --quiet "$JOB" || true
		# The job's steps end before the daemons that run them.
		for _ in $(seq 1 100); do
			[ -z "$(squeue -h -j "$JOB" 2>/dev/null)" ] && break
			sleep 0.2
		done
	fi
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$T"
}
trap cleanup EXIT

for c in slurmctld slurmd sbatch munged; do
	command -v "$c" >/dev/null || { echo "try-one-host: $c missing (apt-get install slurm-wlm munge)" >&2; exit 2; }
done
mkdir -p "$T/ctld" "$T/d" /run/munge
chmod 0755 "$T" # munged writes its pid file there as munge
chown munge: /run/munge
if ! munge -n >/dev/null 2>&1; then
	runuser -u munge -- /usr/sbin/munged --pid-file="$T/munged.pid"
	sleep 1
	PIDS+=("$(cat "$T/munged.pid")")
fi
cat >"$T/slurm.conf" <<CONF
ClusterName=tessera-try
SlurmctldHost=$H
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=$T/ctld
SlurmdSpoolDir=$T/d
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldPort=16817
SlurmdPort=16818
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName=$H CPUs=$(nproc) State=UNKNOWN
PartitionName=try Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$T/slurm.conf
slurmctld -D -L "$T/slurmctld.log" >/dev/null 2>&1 &
PIDS+=($!)
slurmd -D -L "$T/slurmd.log" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.2; done

# Keys and a model spec from a local run, then the job.
"$BIN/tessera" cluster --synthetic-mb 4 --keep "$T/keep" >/dev/null
mkdir -p "$T/job"
cp "$T/keep/trainer.pub" "$T/keep/model.json" "$T/keep/cluster.key" "$T/job/"
JOB=$(cd "$T" && TESSERA_BIN=$BIN TESSERA_DIR=$T/job TESSERA_PORT=17170 \
	TESSERA_LAYOUT=tp2 TESSERA_RUN=$T/run sbatch --parsable --nodes=1 --time=5 "$SBATCH_SCRIPT")
for _ in $(seq 1 300); do [ -s "$T/job/tracker.url" ] && break; sleep 0.1; done
URL=$(cat "$T/job/tracker.url")
echo "try-one-host: job $JOB, tracker $URL"
"$BIN/tessera" publish --tracker "$URL" --key "$T/keep/trainer.key" \
	--cluster-key "$T/keep/cluster.key" --synthetic-mb 4 >"$T/publish.out" 2>"$T/publish.err" &
PIDS+=($!)
for _ in $(seq 1 600); do
	if [ "$(curl -s http://127.0.0.1:9464/metrics | grep -c '^tessera_node_active_version{.*} 1$')" -eq 2 ]; then
		echo "try-one-host: the agent of job $JOB on $H activated v1 on ranks 0 and 1"
		for r in 0 1; do
			"$BIN/tessera" probe --attach "$T/run/$H-$r.sock" --replica "$H" --rank "$r"
		done
		exit 0
	fi
	sleep 0.1
done
echo "try-one-host: no activation; logs in $T/job/logs" >&2
exit 1
