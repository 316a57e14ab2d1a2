#!/bin/sh
# Runs each test binary given, prints its output, and closes with one summary
# line "N passed, N failed". Exit status is non-zero if any test binary failed.
# TEST_ENV holds VAR=value words exported to every test.
set -u
pass=0
fail=0
failed=""
for t in "$@"; do
	name=$(basename "$t")
	start=$(date +%s)
	# shellcheck disable=SC2086
	if env ${TEST_ENV:-} "$t"; then
		pass=$((pass + 1))
		echo "== $name ok ($(( $(date +%s) - start ))s)"
	else
		fail=$((fail + 1))
		failed="$failed $name"
		echo "== $name FAILED ($(( $(date +%s) - start ))s)"
	fi
done
[ -n "$failed" ] && echo "failed test binaries:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
