#!/bin/sh
# The layering, checked on the built libraries: every symbol a library
# takes from another of the project's libraries must come from one the
# layering lets it call. Each argument is "DIR=LIB:ALLOWED DIR ...", DIR the
# library's folder (node/agent), LIB its archive, ALLOWED the folders it may
# call besides its own. Prints one line per call against the layering
# (the symbol, who takes it, whose it is) and exits 1 if there is any;
# with --show, prints each library's real dependencies instead.
set -eu
show=0
if [ "${1:-}" = "--show" ]; then
	show=1
	shift
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-layers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# Who defines what: "symbol dir" lines, one per global definition.
for arg in "$@"; do
	dir=${arg%%=*}
	rest=${arg#*=}
	lib=${rest%%:*}
	nm -g --defined-only "$lib" 2>/dev/null |
		awk -v d="$dir" 'NF == 3 && $2 ~ /^[A-TV-Z]$/ { print $3, d }'
done | sort -u >"$tmp/defs"

bad=0
for arg in "$@"; do
	dir=${arg%%=*}
	rest=${arg#*=}
	lib=${rest%%:*}
	allowed=" $dir ${rest#*:} "
	# Undefined in some object of lib and defined by a project library.
	nm -g "$lib" 2>/dev/null | awk 'NF == 2 && $1 == "U" { print $2 }' | sort -u >"$tmp/undef"
	join "$tmp/undef" "$tmp/defs" >"$tmp/takes"
	if [ "$show" -eq 1 ]; then
		printf '%s:' "$dir"
		awk -v d="$dir" '$2 != d { print $2 }' "$tmp/takes" | sort -u | tr '\n' ' '
		echo
		continue
	fi
	while read -r sym owner; do
		case "$allowed" in
		*" $owner "*) ;;
		*)
			echo "layering: $dir calls $sym of $owner, which it may not (Makefile, LAYERS_*)"
			bad=1
			;;
		esac
	done <"$tmp/takes"
done
exit "$bad"
