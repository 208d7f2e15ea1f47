#!/usr/bin/env bash
# Fails when the committed bpf2go output differs from what `make generate` produces.
set -euo pipefail
cd "$(dirname "$0")/.."
make -s generate
if ! git diff --exit-code --stat -- bpf/; then
	echo "check-generate: bpf2go output is stale: run 'make generate' and commit" >&2
	exit 1
fi
untracked=$(git ls-files --others --exclude-standard -- bpf/)
if [ -n "$untracked" ]; then
	echo "check-generate: generated files not committed: $untracked" >&2
	exit 1
fi
echo "check-generate: bpf2go output is fresh"
