#!/bin/sh
# Regenerates the tests/data/bad-manifest-* corpus, deterministically, with the
# generator built into tests/test_manifest.c (its `corpus` table says what each
# file is and why it must be refused). The properly signed cases are signed by
# tests/data/test-trainer.key, a TEST key committed for this purpose only;
# never trust it anywhere else. Commit the regenerated files.
# Usage: tests/data/gen-bad-manifests.sh   (BUILD=dir to pick the build dir)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
make --no-print-directory BUILD="$BUILD" "$BUILD/asan/tests/test_manifest"
rm -f tests/data/bad-manifest-*
TESSERA_TEST_DATA="$PWD/tests/data" ASAN_OPTIONS=detect_leaks=1 \
	"$BUILD/asan/tests/test_manifest" --gen-bad-manifests tests/data
