#!/usr/bin/env bash
# The promtool that tests/test_alert_rules.py runs `promtool test rules` with, on the alert rules of
# manifests/alerts/ and the chart: built once from Prometheus' own source at a pinned version, through the Go
# module proxy, and cached in ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/promtool-<version>/promtool.
#
# Prometheus' go.mod has replace and exclude directives, which `go install pkg@version` refuses; so the module's
# source is downloaded from the proxy (`go mod download`, checked against the checksum database) and built as the
# main module, with its own go.mod and go.sum, as Prometheus' Makefile builds it.
#
# Idempotent: built only when the binary is missing or this script changed (a stamp file holds its hash),
# through the normal Go build cache; written under a temporary name and moved into place, so an interrupted run
# leaves nothing half-built. Without a Go toolchain it says the rule tests will be skipped and exits 0
# (tests/test_alert_rules.py skips then; with Go present, a test that finds no binary runs this script, and fails
# when it fails: tests/gotools.py).
set -euo pipefail

# Pinned: Prometheus v3.15.1, whose Go module versions are v0.<major*100+minor>.<patch>. tests/test_alert_rules.py
# reads this line to find the binary.
version=v0.315.1

# shellcheck source=../cache_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cache_dir.sh"
find_go
if [[ -z "$go_bin" ]]; then
    echo "promtool: no Go toolchain (go is not on PATH): the alert rule tests (tests/test_alert_rules.py) will be skipped"
    exit 0
fi

open_cache_dir "promtool-$version"

# The stamp: this script's hash, so a new version or new link flags rebuild.
stamp_value="$(sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)"
stamp="$cache/promtool.stamp"
if [[ -x "$cache/promtool" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    echo "promtool: $version is up to date in $cache"
    exit 0
fi

# v0.315.1 -> 3.15.1, the version `promtool --version` reports (Prometheus' Makefile sets it the same way).
release="$(echo "$version" | sed -E 's/^v0\.([0-9]+)([0-9]{2})\.([0-9]+)$/\1.\2.\3/; s/\.0([0-9])\./.\1./')"
source_dir="$(cd "$work" && "$go_bin" mod download -json "github.com/prometheus/prometheus@$version" \
    | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')"
if [[ -z "$source_dir" || ! -f "$source_dir/go.mod" ]]; then
    echo "promtool: the module proxy gave no source for github.com/prometheus/prometheus@$version" >&2
    exit 1
fi
# Built from a writable copy (the module cache is read-only), with the repository's go.work turned off: it names
# modules the proxy's zip does not carry.
cp -r "$source_dir" "$work/src"
chmod -R u+w "$work/src"

echo "promtool: building Prometheus $release ($version) with $("$go_bin" version | cut -d' ' -f3)" \
    "(cold: several minutes on 2 cores with the module downloads; the Go build cache makes later builds quick)"
started=$SECONDS
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
(cd "$work/src" && GOWORK=off GOFLAGS=-buildvcs=false "$go_bin" build -trimpath -ldflags "$ldflags" \
    -o "$work/promtool" ./cmd/promtool)
rm -f "$stamp"
mv -f "$work/promtool" "$cache/promtool"
echo "$stamp_value" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
echo "promtool: built $release into $cache in $((SECONDS - started)) s"
