#!/bin/sh
# Runs each test binary given, TEST_JOBS at a time (default 2: most tests
# wait on processes and timers, and every test must pass next to another),
# prints each one's output whole once it ends, and closes with one summary
# line "N passed, N failed". Exit status is non-zero if any test binary
# failed. TEST_ENV holds VAR=value words exported to every test. A binary
# still running after TEST_TIMEOUT seconds (default 1200) is killed and
# fails: a hung test (a sanitizer's report that never ends) must not hold
# the whole run.
set -u
if [ "${1:-}" = "--one" ]; then
	# One binary: $2 the binary, $3 the results directory.
	name=$(basename "$2")
	start=$(date +%s)
	# shellcheck disable=SC2086
	timeout --kill-after=10 "${TEST_TIMEOUT:-1200}" env ${TEST_ENV:-} "$2" \
		>"$3/$name.out" 2>&1
	rc=$?
	verdict=FAILED
	[ "$rc" -eq 0 ] && verdict=ok
	[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] &&
		echo "$name: exit status $rc: killed (after TEST_TIMEOUT=${TEST_TIMEOUT:-1200} s, or by the system)" >>"$3/$name.out"
	echo "== $name $verdict ($(( $(date +%s) - start ))s)" >>"$3/$name.out"
	echo "$verdict" >"$3/$name.verdict"
	# One test's output at a time, whole.
	flock "$3/print.lock" cat "$3/$name.out"
	exit 0
fi
res=$(mktemp -d "${TMPDIR:-/tmp}/tessera-run.XXXXXX") || exit 1
trap 'rm -rf "$res"' EXIT
for t in "$@"; do printf '%s\n' "$t"; done |
	xargs -P "${TEST_JOBS:-2}" -I{} "$0" --one {} "$res"
pass=0
fail=0
failed=""
for t in "$@"; do
	name=$(basename "$t")
	if [ "$(cat "$res/$name.verdict" 2>/dev/null)" = ok ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
		failed="$failed $name"
	fi
done
[ -n "$failed" ] && echo "failed test binaries:$failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
