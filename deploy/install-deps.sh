#!/bin/sh
# Install the Debian packages tessera builds, tests and runs with.
# Idempotent: installs only what is missing; safe to run as often as you like.
# pip, setuptools, wheel and venv: the Python package is pip-installed from
# node/python, without a registry (make install, make venv, make test).
#   --deploy-check  also what `make check-deploy` validates with: systemd's
#                   systemd-analyze, shellcheck, Node.js and npm, and the
#                   npm packages pinned in deploy/check/package-lock.json
set -eu

PKGS="build-essential pkg-config libfabric-dev libfabric-bin libsodium-dev \
libzstd-dev libevent-dev libssl-dev openssl libcmocka-dev libjansson-dev libinih-dev iproute2 curl jq \
clang libclang-rt-dev python3 python3-numpy python3-torch librust-blake3-dev \
python3-pip python3-setuptools python3-wheel python3-venv etcd-server etcd-client"

deploy_check=0
if [ "${1:-}" = "--deploy-check" ]; then
	deploy_check=1
	PKGS="$PKGS systemd shellcheck"
	# Node.js from Debian unless one is installed already (any source).
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		PKGS="$PKGS nodejs npm"
	fi
fi

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi
if [ -z "$missing" ]; then
	echo "install-deps: all dependencies present"
else
	echo "install-deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	$SUDO apt-get update -qq
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -qq --no-install-recommends $missing
fi

if [ "$deploy_check" -eq 1 ]; then
	dir=$(dirname "$0")/check
	if [ ! -d "$dir/node_modules/kubernetes-models" ] || [ ! -d "$dir/node_modules/dockerfile-utils" ] ||
		[ ! -d "$dir/node_modules/yaml" ]; then
		echo "install-deps: npm ci in $dir"
		(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
	fi
fi
