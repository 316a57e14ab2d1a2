#!/bin/sh
# Install the Debian packages tessera builds, tests and runs with.
# Idempotent: installs only what is missing; safe to run as often as you like.
set -eu

PKGS="build-essential pkg-config libfabric-dev libfabric-bin libsodium-dev \
libzstd-dev libevent-dev libcmocka-dev libjansson-dev libinih-dev iproute2 curl jq \
clang libclang-rt-dev"

missing=""
for p in $PKGS; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	echo "install-deps: all dependencies present"
	exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	SUDO="sudo"
fi
echo "install-deps: installing$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
