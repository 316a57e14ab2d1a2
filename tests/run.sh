#!/bin/sh
# Runs each test binary (or script) given, TEST_JOBS at a time (default 2:
# most tests wait on processes and timers, and every test must pass next to
# another), and prints one line per test as it ends:
#   ok     test_config (3s: 41 passed, 1 skipped)
#   FAILED test_attach (11s: 2 failed)
# followed by that test's whole output when it failed (TEST_VERBOSE=1: for
# every test), so the errors that tests provoke on purpose stay out of a
# passing run. Closes with one summary line "N passed, N failed". Exit
# status is non-zero if any test binary failed. TEST_ENV holds VAR=value
# words exported to every test. Each test runs in a working directory of its
# own, removed afterwards, so that nothing it or a library writes to "."
# lands in the tree, with IPATH_NO_BACKTRACE=1 and HFI_BACKTRACE unset:
# libinfinipath and libpsm2, which libfabric's psm providers load, would
# catch an abort (ASan's, or one a test provokes), write PROG-PID,HOST.btr
# into "." and exit 1 instead. A binary still running after TEST_TIMEOUT seconds
# (default 1200) is killed and fails: a hung test (a sanitizer's report that
# never ends) must not hold the whole run.
set -u
if [ "${1:-}" = "--one" ]; then
	# One binary: $2 the binary, $3 the results directory.
	name=$(basename "$2")
	bin=$(cd "$(dirname "$2")" && pwd)/$name
	out="$3/$name.out"
	mkdir "$3/$name.cwd" || exit 1
	start=$(date +%s)
	# shellcheck disable=SC2086
	(cd "$3/$name.cwd" && timeout --kill-after=10 "${TEST_TIMEOUT:-1200}" \
		env -u HFI_BACKTRACE IPATH_NO_BACKTRACE=1 ${TEST_ENV:-} "$bin") >"$out" 2>&1
	rc=$?
	verdict=FAILED
	[ "$rc" -eq 0 ] && verdict=ok
	[ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] &&
		echo "$name: exit status $rc: killed (after TEST_TIMEOUT=${TEST_TIMEOUT:-1200} s, or by the system)" >>"$out"
	[ "$rc" -ne 0 ] && echo "$name: exit status $rc" >>"$out"
	rm -rf "$3/$name.cwd"
	# cmocka's closing lines: "[  PASSED  ] N test(s)." and the like.
	cases=$(awk '/^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test\(s\)/ {
			n[tolower($2)] += $4
		} END {
			s = ""
			if ("passed" in n) s = n["passed"] " passed"
			if ("failed" in n) s = s (s == "" ? "" : ", ") n["failed"] " failed"
			if ("skipped" in n) s = s (s == "" ? "" : ", ") n["skipped"] " skipped"
			print s
		}' "$out")
	echo "$verdict" >"$3/$name.verdict"
	# One test's lines at a time.
	# shellcheck disable=SC2016
	flock "$3/print.lock" sh -c '
		printf "%-6s %s (%ss%s)\n" "$1" "$2" "$3" "${4:+: $4}"
		if [ "$1" != ok ] || [ "${TEST_VERBOSE:-0}" = 1 ]; then
			sed "s/^/    /" "$5"
		fi' sh "$verdict" "$name" "$(( $(date +%s) - start ))" "$cases" "$out"
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
