#!/usr/bin/env bash
# The floor of `make bench-e2e` (bench/floor/main.go: a do-nothing extender that binds), built with the local Go
# toolchain and cached in ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/floor/floor. bench/e2e_run.py runs it
# before each floor run; its stdout is the binary's path and nothing else, its messages go to stderr.
#
# Idempotent: rebuilt only when main.go, go.mod or this script change (a stamp file holds their hash), through
# the normal Go build cache (a few seconds cold); written under a temporary name and moved into place, so an
# interrupted run leaves nothing half-built. Standard library only, so no network: GOPROXY=off, -mod=readonly,
# GOTOOLCHAIN=local (never a toolchain download). Without a Go toolchain it fails with one line: the floor
# wirings need it, the others do not.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"

# shellcheck source=../../tests/cache_dir.sh
source "$here/../../tests/cache_dir.sh"
find_go
if [[ -z "$go_bin" ]]; then
    echo "floor: no Go toolchain (go is neither on PATH nor in /usr/local/go/bin): the floor wirings need one" >&2
    exit 1
fi

open_cache_dir floor

stamp_value="$(cat "$here/main.go" "$here/go.mod" "${BASH_SOURCE[0]}" | sha256sum | cut -d' ' -f1)"
stamp="$cache/floor.stamp"
if [[ -x "$cache/floor" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    echo "$cache/floor"
    exit 0
fi

echo "floor: building bench/floor with $("$go_bin" version | cut -d' ' -f3)" >&2
(cd "$here" && GOFLAGS=-mod=readonly GOPROXY=off GOTOOLCHAIN=local GOWORK=off \
    "$go_bin" build -trimpath -buildvcs=false -ldflags "-s -w" -o "$work/floor" .) >&2
rm -f "$stamp"
mv -f "$work/floor" "$cache/floor"
echo "$stamp_value" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
echo "$cache/floor"
