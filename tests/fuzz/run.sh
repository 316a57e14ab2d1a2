#!/bin/sh
# Runs each libFuzzer binary given for FUZZ_SECONDS (default 60) on a corpus
# seeded from tests/data (seed-<target>-* and bad-<target>-*, where the
# target is the binary's name without "fuzz_"), and stores every crasher,
# leak, timeout or OOM input into tests/data as bad-<target>-<kind>-<hash>,
# which `make test` then runs as part of the bad-input corpus.
# Exit status is non-zero if any fuzzer found something or failed to run.
set -u
secs=${FUZZ_SECONDS:-60}
data=$(cd "$(dirname "$0")/../data" && pwd)
status=0
for bin in "$@"; do
	name=$(basename "$bin")
	target=${name#fuzz_}
	work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-fuzz-XXXXXX")
	mkdir -p "$work/corpus" "$work/artifacts"
	for f in "$data"/seed-"$target"-* "$data"/bad-"$target"-*; do
		[ -f "$f" ] && cp "$f" "$work/corpus/"
	done
	echo "fuzz: $name for ${secs}s, $(ls "$work/corpus" | wc -l) seeds"
	if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="$work/artifacts/" -print_final_stats=1 \
		"$work/corpus" >"$work/log" 2>&1; then
		status=1
		tail -n 40 "$work/log"
	else
		grep -E '^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)' \
			"$work/log" | sed "s/^/fuzz: $name: /"
	fi
	for a in "$work"/artifacts/*; do
		[ -f "$a" ] || continue
		kind=$(basename "$a" | cut -d- -f1)
		h=$(sha256sum "$a" | cut -c1-16)
		cp "$a" "$data/bad-$target-$kind-$h"
		echo "fuzz: $name: saved tests/data/bad-$target-$kind-$h"
		status=1
	done
	rm -rf "$work"
done
exit $status
