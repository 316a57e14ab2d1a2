#!/bin/sh
# Validates everything under deploy/ without a cluster, a container engine or
# Slurm: `make check-deploy` runs it (after `install-deps.sh --deploy-check`).
#   systemd units   systemd-analyze verify (any warning fails) and
#                   systemd-analyze security --offline, exposure <= 3.0;
#                   the node unit's engine access: --attach in its runtime
#                   directory, a mode its group connects with, that group
#                   one of the service's
#   Kubernetes      deploy/check/check-k8s.mjs: OpenAPI schemas of each kind,
#                   unknown fields refused; the ConfigMap's tessera.ini passes
#                   `tessera config check` and every program takes it;
#                   deploy/check/check-engine.mjs: attach on a shared volume
#                   for the sockets' group, no GPU without the CUDA store,
#                   image and store agree, fsGroup for the keys, an engine
#                   pod in the group (node.yaml and cuda/node.yaml)
#   Containerfile   deploy/check/check-containerfile.mjs
#   shell scripts   sh -n / bash -n and shellcheck (the Slurm batch script too)
#   Slurm           deploy/check/check-sbatch.sh: a dry run, one agent per
#                   host serving every rank, an attach socket per rank
# Each validator must also refuse every file in deploy/check/bad/ (or a
# broken copy of the file it checks).
# BIN=dir of the built binaries (default build/bin).
set -eu

cd "$(dirname "$0")/.."
BIN=$(cd "${BIN:-build/bin}" && pwd)
CHECK=deploy/check
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fails=0
ok() { echo "check-deploy: ok   $*"; }
bad() { echo "check-deploy: FAIL $*" >&2; fails=$((fails + 1)); }

# ---- systemd -------------------------------------------------------------------
# verify checks ExecStart= binaries exist: point them at this build.
for u in deploy/systemd/*.service; do
	name=$(basename "$u")
	case $name in
	*@.service) name=${name%@.service}@check.service ;;
	esac
	sed "s|/usr/local/bin/|$BIN/|g" "$u" >"$T/$name"
	if systemd-analyze verify "$T/$name" >"$T/verify.log" 2>&1 && [ ! -s "$T/verify.log" ]; then
		ok "systemd-analyze verify $u"
	else
		bad "systemd-analyze verify $u: $(head -n 3 "$T/verify.log")"
	fi
	if systemd-analyze security --offline=yes --threshold=30 "$T/$name" >"$T/sec.log" 2>&1; then
		ok "systemd-analyze security $u: $(grep -o 'exposure level.*' "$T/sec.log")"
	else
		bad "systemd-analyze security $u: $(tail -n 1 "$T/sec.log")"
	fi
done
# The node unit lets an engine of the sockets' group attach. One line of
# trouble, or nothing.
unit_attach() {
	exec=$(sed -n 's/^ExecStart=//p' "$1")
	word() { printf ' %s \n' "$exec" | sed -n "s/.* $1 \([^ ]*\) .*/\1/p"; }
	dir=$(word --attach)
	mode=$(word --attach-mode)
	group=$(word --attach-group)
	rt=$(sed -n 's/^RuntimeDirectory=//p' "$1")
	if [ -z "$dir" ]; then
		echo "no --attach in ExecStart: engines cannot attach"
	elif [ -z "$rt" ] || [ "${dir#/run/"${rt%%/*}"/}" = "$dir" ]; then
		echo "--attach $dir is outside its RuntimeDirectory=$rt"
	elif [ -z "$mode" ] || [ $((0$mode & 060)) -ne $((060)) ]; then
		echo "--attach-mode ${mode:-unset}: the sockets' group cannot connect (0660)"
	elif [ -z "$group" ]; then
		echo "no --attach-group: which engines connect is not said"
	elif ! grep -Eq "^(SupplementaryGroups=(.* )?$group( .*)?|Group=$group)\$" "$1"; then
		echo "--attach-group $group is not one of the service's groups (SupplementaryGroups=)"
	fi
}
u=deploy/systemd/tessera-node@.service
if [ -z "$(unit_attach "$u")" ]; then
	ok "$u: engines in group $(sed -n 's/.*--attach-group \([^ ]*\).*/\1/p' "$u") attach"
else
	bad "$u: $(unit_attach "$u")"
fi
for broken in 's| --attach /run/tessera/%i/||' 's|--attach-mode 0660|--attach-mode 0600|' \
	's|^SupplementaryGroups=video tessera|SupplementaryGroups=video|' \
	's|^RuntimeDirectory=tessera/%i|RuntimeDirectory=tessera-node|'; do
	sed "$broken" "$u" >"$T/broken.service"
	if [ -z "$(unit_attach "$T/broken.service")" ]; then
		bad "the node unit's attach check accepted $broken"
	else
		ok "the node unit's attach check refuses $broken: $(unit_attach "$T/broken.service")"
	fi
done
sed 's/^ProtectHome=yes/ProtectHom=yes/' deploy/systemd/tessera-tracker.service |
	sed "s|/usr/local/bin/|$BIN/|g" >"$T/broken.service"
if systemd-analyze verify "$T/broken.service" >"$T/verify.log" 2>&1 && [ ! -s "$T/verify.log" ]; then
	bad "systemd-analyze verify accepted a unit with a misspelt key"
else
	ok "systemd-analyze verify refuses a misspelt key"
fi

# ---- Kubernetes ----------------------------------------------------------------------
if node "$CHECK/check-k8s.mjs" deploy/k8s/*.yaml deploy/k8s/cuda/*.yaml deploy/k8s/ha/*.yaml >"$T/k8s.log" 2>&1; then
	ok "$(tail -n 1 "$T/k8s.log")"
else
	bad "deploy/k8s: $(cat "$T/k8s.log")"
fi
for f in "$CHECK"/bad/k8s-*.yaml; do
	if node "$CHECK/check-k8s.mjs" "$f" >"$T/k8s.log" 2>&1; then
		bad "check-k8s accepted $f"
	else
		ok "check-k8s refuses $(basename "$f"): $(head -n 1 "$T/k8s.log" | sed 's/^[^:]*: //')"
	fi
done
# An engine can attach: with the host store (node.yaml), and with the CUDA
# store (cuda/node.yaml instead).
engine() { node "$CHECK/check-engine.mjs" --containerfile deploy/Containerfile "$@" >"$T/engine.log" 2>&1; }
if engine deploy/k8s/*.yaml; then
	ok "deploy/k8s: $(tail -n 1 "$T/engine.log")"
else
	bad "deploy/k8s: $(cat "$T/engine.log")"
fi
if engine deploy/k8s/config.yaml deploy/k8s/cuda/node.yaml deploy/k8s/engine.example.yaml deploy/k8s/secrets.example.yaml; then
	ok "deploy/k8s/cuda: $(tail -n 1 "$T/engine.log")"
else
	bad "deploy/k8s/cuda: $(cat "$T/engine.log")"
fi
for f in "$CHECK"/bad/engine-*.yaml; do
	if engine deploy/k8s/config.yaml "$f"; then
		bad "check-engine accepted $f"
	else
		ok "check-engine refuses $(basename "$f"): $(head -n 1 "$T/engine.log" | sed 's/^.*: container [^:]*: //; s/^[^:]*: //')"
	fi
done
# The ConfigMap's configuration is valid and every program takes it.
node -e '
const { parseAllDocuments } = await import(process.argv[1]);
const fs = await import("node:fs");
for (const d of parseAllDocuments(fs.readFileSync(process.argv[2], "utf8")))
	if (d.toJS()?.kind === "ConfigMap") process.stdout.write(d.toJS().data["tessera.ini"]);
' --input-type=module "$PWD/$CHECK/node_modules/yaml/dist/index.js" deploy/k8s/config.yaml >"$T/cm.ini"
# Its key and model files must exist to pass: made under $T/etc, which the
# file names in place of /etc (the pod's mounts).
mkdir -p "$T/etc/tessera/keys" "$T/etc/tessera/model"
"$BIN/tessera" keygen -o "$T/etc/tessera/keys/trainer" --force >/dev/null &&
	"$BIN/tessera" keygen --cluster -o "$T/etc/tessera/keys/cluster.key" --force >/dev/null
: >"$T/etc/tessera/model/model.json"
sed "s|/etc/tessera/|$T/etc/tessera/|g" "$T/cm.ini" >"$T/tessera.ini"
if "$BIN/tessera" config check "$T/tessera.ini" >/dev/null 2>"$T/cfg.log" &&
	"$BIN/tessera-tracker" --config "$T/tessera.ini" --help >/dev/null 2>>"$T/cfg.log" &&
	"$BIN/tessera-node" --config "$T/tessera.ini" --help >/dev/null 2>>"$T/cfg.log"; then
	ok "deploy/k8s/config.yaml tessera.ini: tessera config check, tracker and node take it"
else
	bad "deploy/k8s/config.yaml tessera.ini: $(cat "$T/cfg.log")"
fi

# ---- Containerfile ------------------------------------------------------------------
if node "$CHECK/check-containerfile.mjs" . deploy/Containerfile >"$T/cf.log" 2>&1; then
	ok "$(tail -n 1 "$T/cf.log")"
else
	bad "deploy/Containerfile: $(cat "$T/cf.log")"
fi
if node "$CHECK/check-containerfile.mjs" . "$CHECK/bad/Containerfile.broken" >"$T/cf.log" 2>&1; then
	bad "check-containerfile accepted $CHECK/bad/Containerfile.broken"
else
	ok "check-containerfile refuses $CHECK/bad/Containerfile.broken ($(grep -c ': ' "$T/cf.log") problems)"
fi

# ---- shell scripts (Slurm batch script included) -------------------------------------
for s in deploy/*.sh deploy/check/*.sh deploy/systemd/*.sh deploy/slurm/*.sh deploy/slurm/*.sbatch; do
	case $(head -n 1 "$s") in
	*bash*) sh="bash" ;;
	*) sh="sh" ;;
	esac
	if $sh -n "$s" 2>"$T/sh.log" && shellcheck -x "$s" >"$T/sc.log" 2>&1; then
		ok "$sh -n, shellcheck $s"
	else
		bad "$s: $(cat "$T/sh.log" "$T/sc.log" | head -n 5)"
	fi
done

# ---- Slurm: a dry run of the batch script ------------------------------------------
s=deploy/slurm/tessera.sbatch
if "$CHECK/check-sbatch.sh" "$s" >"$T/sb.log" 2>&1; then
	ok "$(tail -n 1 "$T/sb.log")"
else
	bad "$(cat "$T/sb.log")"
fi
# shellcheck disable=SC2016 # sed expressions: $ is the script's, not ours
for broken in 's/--ranks "\$RANKS"/--rank 0/' 's/ "\${ATTACH\[@\]}"//' \
	's/--attach-mode 0660 --attach-group/--attach-mode 0600 --attach-group/'; do
	sed "$broken" "$s" >"$T/broken.sbatch"
	if "$CHECK/check-sbatch.sh" "$T/broken.sbatch" >"$T/sb.log" 2>&1; then
		bad "check-sbatch accepted $s with $broken"
	else
		ok "check-sbatch refuses $broken: $(head -n 1 "$T/sb.log" | sed 's/^[^:]*: [^:]*: //')"
	fi
done

if [ "$fails" -ne 0 ]; then
	echo "check-deploy: $fails failed" >&2
	exit 1
fi
echo "check-deploy: all passed"
