#!/usr/bin/env bash
# The helm that tests/test_chart.py lints and renders charts/gpu-extender/ with, built once from the Go module
# proxy (`go install helm.sh/helm/v3/cmd/helm@<version>`) and cached in
# ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/helm-<version>/helm.
#
# Idempotent: built only when the binary is missing or this script changed (a stamp file holds its hash),
# through the normal Go build cache; written under a temporary name and moved into place, so an interrupted run
# leaves nothing half-built. Without a Go toolchain it says the chart tests will be skipped and exits 0
# (tests/test_chart.py skips then; with Go present and no binary, they fail).
set -euo pipefail

# Pinned: a helm v3 the module proxy serves. tests/test_chart.py reads this line to find the binary.
version=v3.22.0

# shellcheck source=../cache_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cache_dir.sh"
find_go
if [[ -z "$go_bin" ]]; then
    echo "helm: no Go toolchain (go is not on PATH): the chart tests (tests/test_chart.py) will be skipped"
    exit 0
fi

open_cache_dir "helm-$version"

# The stamp: this script's hash, so a new version or new link flags rebuild.
stamp_value="$(sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)"
stamp="$cache/helm.stamp"
if [[ -x "$cache/helm" && -f "$stamp" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    echo "helm: $version is up to date in $cache"
    exit 0
fi

# The link flags of helm's own Makefile: the version `helm version` reports, and the Kubernetes version that
# `helm template` and `helm lint` assume without a cluster (Chart.yaml's kubeVersion is checked against it),
# taken from the k8s.io/client-go that helm requires (v0.37.0 -> 1.37); a plain `go install` would say 1.20.
go_mod="$(cd "$work" && "$go_bin" mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
client_go="$(grep -oE 'k8s\.io/client-go v0\.[0-9]+\.[0-9]+' "$go_mod" | cut -d' ' -f2 || true)"
if [[ -z "$client_go" ]]; then
    echo "helm: no 'k8s.io/client-go v0.X.Y' requirement in helm $version's go.mod ($go_mod)" >&2
    exit 1
fi
kube_minor="$(echo "$client_go" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for package in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $package.k8sVersionMajor=1 -X $package.k8sVersionMinor=$kube_minor"
done

echo "helm: building $version with $("$go_bin" version | cut -d' ' -f3)" \
    "(cold: about 2 minutes on 2 cores; the Go build cache makes later builds quick)"
started=$SECONDS
# Outside any module of this repository, so `go install pkg@version` resolves helm's own go.mod alone.
(cd "$work" && GOBIN="$work/bin" GOFLAGS=-buildvcs=false "$go_bin" install -trimpath -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$version")
rm -f "$stamp"
mv -f "$work/bin/helm" "$cache/helm"
echo "$stamp_value" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
echo "helm: built $version into $cache in $((SECONDS - started)) s"
