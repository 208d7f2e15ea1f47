#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a bounded time each.
# usage: scripts/fuzz.sh [duration]   (default 20s)
set -euo pipefail
cd "$(dirname "$0")/.."
t=${1:-20s}
n=0
for pkg in $(go list ./...); do
	for f in $(go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true); do
		echo "fuzz $pkg $f ($t)"
		# -parallel 1: on these 2-core machines more workers only slow the seed
		# corpus run, which then outlasts a short -fuzztime.
		go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" -parallel 1 "$pkg"
		n=$((n + 1))
	done
done
echo "fuzz: $n targets ran for $t each"
[ "$n" -gt 0 ] || { echo "fuzz: no fuzz targets found" >&2; exit 1; }
