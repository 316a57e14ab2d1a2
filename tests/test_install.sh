#!/bin/sh
# tessera installed like a library (deploy/install.mk): `make install` into a
# temporary prefix and into a DESTDIR staging of another; a C program built
# against each installed tessera-client.pc (shared and static) checks the
# version and error API; the Python package is pip-installed from the tree
# into a fresh virtual environment, imported and used, and so is the copy
# `make install` put in the prefix; a program built with the rpath runs
# without LD_LIBRARY_PATH; `make uninstall` leaves nothing behind, not the
# directories install made, but keeps one that was there before.
# Needs nothing beyond deploy/install-deps.sh (no network). `make test`
# sets TESSERA_ROOT and TESSERA_BUILD.
set -eu
root=${TESSERA_ROOT:?set by make test}
build=${TESSERA_BUILD:?set by make test}
py=/usr/bin/python3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# This runs under `make test`: its jobserver is not this make's.
unset MAKEFLAGS MFLAGS MAKELEVEL
fail() {
	echo "test_install: $*" >&2
	exit 1
}
release=$(sed -n 's/^#define PROTO_RELEASE "\(.*\)"/\1/p' "$root/proto/cli.h")
pyver=$($py -c 'import sys; print("python%d.%d" % sys.version_info[:2])')

echo "== make install PREFIX=$tmp/prefix, and PREFIX=/opt/tessera DESTDIR=$tmp/stage"
# A directory that was there before: uninstall keeps it.
mkdir -p "$tmp/prefix/share"
make -s -C "$root" BUILD="$build" install PREFIX="$tmp/prefix" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; fail "make install failed"; }
make -s -C "$root" BUILD="$build" install PREFIX=/opt/tessera DESTDIR="$tmp/stage" \
	>"$tmp/stage.log" 2>&1 || { cat "$tmp/stage.log"; fail "make install DESTDIR= failed"; }
for p in tessera tessera-node tessera-tracker; do
	"$tmp/prefix/bin/$p" --version | grep -qx "$p $release" || fail "$p --version is not '$p $release'"
done
grep -q "^ExecStart=/opt/tessera/bin/tessera-tracker " \
	"$tmp/stage/opt/tessera/lib/systemd/system/tessera-tracker.service" ||
	fail "the staged tracker unit does not start /opt/tessera/bin/tessera-tracker"
if grep -rh -v '^#' "$tmp/stage/opt/tessera/lib/systemd/system" | grep -q /usr/local; then
	fail "a staged unit still names /usr/local outside its comments"
fi

# Connects to a socket that is not there: the version and the error API.
cat >"$tmp/probe.c" <<'EOF'
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <tessera_client.h>

int main(int argc, char **argv)
{
	tessera_client *c = NULL;
	char err[512] = "";
	int rc;

	if (argc != 3 || strcmp(tessera_client_version(), argv[1]) != 0) {
		fprintf(stderr, "probe: library %s, expected %s\n", tessera_client_version(),
			argc > 1 ? argv[1] : "?");
		return 1;
	}
	rc = tessera_attach(argv[2], "A", 0, 1000, &c, err, sizeof(err));
	if (rc != -ENOENT || c != NULL || strstr(err, argv[2]) == NULL) {
		fprintf(stderr, "probe: attach to %s: rc %d, error '%s'\n", argv[2], rc, err);
		return 1;
	}
	printf("probe: %s: %s\n", tessera_client_version(), err);
	return 0;
}
EOF
for where in "$tmp/prefix" "$tmp/stage/opt/tessera"; do
	echo "== a C program against $where/lib/pkgconfig/tessera-client.pc"
	pc() { PKG_CONFIG_PATH="$where/lib/pkgconfig" pkg-config "$@" tessera-client; }
	[ "$(pc --modversion)" = "$release" ] || fail "pkg-config --modversion: $(pc --modversion)"
	libdir=$(pc --variable=libdir)
	[ "$(cd "$libdir" && pwd)" = "$where/lib" ] || fail "pkg-config's libdir $libdir is not $where/lib"
	# shellcheck disable=SC2046
	cc $(pc --cflags) "$tmp/probe.c" $(pc --libs) -o "$tmp/probe-shared" ||
		fail "cannot build against the shared library"
	readelf -d "$tmp/probe-shared" | grep -q 'NEEDED.*\[libtessera-client\.so\.0\]' ||
		fail "probe-shared does not need libtessera-client.so.0"
	LD_LIBRARY_PATH=$libdir "$tmp/probe-shared" "$release" "$tmp/no.sock"
	# As node/client/README.md says: a prefix outside the loader's path
	# runs with the rpath, no LD_LIBRARY_PATH.
	# shellcheck disable=SC2046
	cc $(pc --cflags) "$tmp/probe.c" $(pc --libs) -Wl,-rpath,"$libdir" -o "$tmp/probe-rpath" ||
		fail "cannot build with the rpath"
	env -u LD_LIBRARY_PATH "$tmp/probe-rpath" "$release" "$tmp/no.sock" ||
		fail "the program built with -Wl,-rpath,$libdir does not run"
	# shellcheck disable=SC2046
	cc $(pc --cflags) "$tmp/probe.c" -Wl,-Bstatic $(pc --libs-only-L --libs-only-l) -Wl,-Bdynamic \
		$(pc --static --libs-only-other) -o "$tmp/probe-static" ||
		fail "cannot build against the static library"
	if readelf -d "$tmp/probe-static" | grep -q libtessera-client; then
		fail "probe-static still needs the shared library"
	fi
	"$tmp/probe-static" "$release" "$tmp/no.sock"
done

# Imports tessera, checks where it came from and uses it.
cat >"$tmp/use.py" <<'EOF'
import errno
import sys

import tessera

where, release, sock = sys.argv[1:]
if not tessera.__file__.startswith(where + "/"):
    sys.exit("use.py: tessera came from %s, not from %s" % (tessera.__file__, where))
if tessera.library_version() != release:
    sys.exit("use.py: library %s, expected %s" % (tessera.library_version(), release))
try:
    tessera.Client(sock, "A", 0, timeout_ms=1000)
    sys.exit("use.py: attached to %s" % sock)
except tessera.TesseraError as e:
    if e.errno != errno.ENOENT or sock not in str(e):
        sys.exit("use.py: %r" % e)
    print("use.py: %s: %s" % (tessera.library_version(), e))
EOF
echo "== pip install node/python into a new virtual environment"
$py -m venv --system-site-packages "$tmp/venv"
(cd "$tmp" && env -u PYTHONPATH -u TESSERA_CLIENT_LIB "$tmp/venv/bin/pip" install -q --no-index \
	--no-build-isolation --disable-pip-version-check "$root/node/python") ||
	fail "pip install failed"
(cd "$tmp" && env -u PYTHONPATH -u TESSERA_CLIENT_LIB "$tmp/venv/bin/python" use.py \
	"$tmp/venv/lib/$pyver/site-packages" "$release" "$tmp/no.sock")
echo "== the package make install put in the prefix"
(cd "$tmp" && env -u TESSERA_CLIENT_LIB PYTHONPATH="$tmp/prefix/lib/$pyver/dist-packages" $py use.py \
	"$tmp/prefix/lib/$pyver/dist-packages" "$release" "$tmp/no.sock")

echo "== make uninstall"
make -s -C "$root" BUILD="$build" uninstall PREFIX="$tmp/prefix" >"$tmp/uninstall.log" 2>&1 ||
	{ cat "$tmp/uninstall.log"; fail "make uninstall failed"; }
left=$(find "$tmp/prefix" -mindepth 1 ! -path "$tmp/prefix/share")
[ -z "$left" ] || fail "make uninstall left: $left"
[ -d "$tmp/prefix/share" ] || fail "make uninstall removed share/, which install had not made"
grep -q "^removed tessera from $tmp/prefix .* empty directories it had made$" "$tmp/uninstall.log" ||
	{ cat "$tmp/uninstall.log"; fail "make uninstall did not say what it removed in one line"; }
[ "$(wc -l <"$tmp/uninstall.log")" -eq 1 ] ||
	{ cat "$tmp/uninstall.log"; fail "make uninstall said more than one line"; }
echo "test_install: ok"
