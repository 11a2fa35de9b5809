#!/usr/bin/env bash
# The Kubernetes commands the tests run, built once and cached: kube-apiserver and kube-scheduler (the e2e tier's
# control plane), kube-controller-manager, kubelet, kube-proxy and kubectl (the node tier, tests/node) from the
# k8s.io/kubernetes release pinned in tests/e2e/k8s/go.mod, statically linked (CGO_ENABLED=0, as Kubernetes'
# own release builds are, so kube-scheduler runs in an image with nothing else in it); and etcd from Debian's
# etcd-server package (downloaded and unpacked, never installed). Everything lands in
# ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/k8s-<version>/.
#
# Idempotent: the Kubernetes binaries are rebuilt only when go.mod, go.sum or the link flags change (a stamp
# file holds their hash), through the normal Go build cache; etcd is fetched only when missing. Outputs are
# written under a temporary name and moved into place, so an interrupted run leaves nothing half-built.
# Without a Go toolchain it says the e2e tier will be skipped and exits 0 (tests/e2e/conftest.py skips then).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
module="$here/k8s"

# shellcheck source=../cache_dir.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cache_dir.sh"
find_go
if [[ -z "$go_bin" ]]; then
    echo "e2e: no Go toolchain (go is not on PATH): the e2e tier (tests/e2e) will be skipped"
    exit 0
fi

version="$(grep -oE 'k8s\.io/kubernetes v[0-9]+\.[0-9]+\.[0-9]+' "$module/go.mod" | head -n 1 | cut -d' ' -f2)"
if [[ -z "$version" ]]; then
    echo "e2e: no 'k8s.io/kubernetes vX.Y.Z' requirement in $module/go.mod" >&2
    exit 1
fi
major_minor="${version#v}"
major="${major_minor%%.*}"
minor="${major_minor#*.}"
minor="${minor%%.*}"
open_cache_dir "k8s-$version"

# What `kube-apiserver --version` and the API's /version report; the values of the official v1.34.1 build.
declare -A release_commits=([v1.34.1]=93248f9ae092f571eb870b7664c534bfc7d00f03)
ldflags="-s -w"
for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $package.gitVersion=$version -X $package.gitMajor=$major -X $package.gitMinor=$minor"
    ldflags+=" -X $package.gitCommit=${release_commits[$version]:-} -X $package.gitTreeState=clean"
done

commands=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy kubectl)
stamp_value="$(cat "$module/go.mod" "$module/go.sum" <(echo "$ldflags CGO_ENABLED=0 ${commands[*]}") \
    | sha256sum | cut -d' ' -f1)"
stamp="$cache/kubernetes.stamp"

build_kubernetes() {
    local command up_to_date=1
    for command in "${commands[@]}"; do
        [[ -x "$cache/$command" ]] || up_to_date=0
    done
    if [[ $up_to_date == 1 && -f "$stamp" ]] && [[ "$(cat "$stamp")" == "$stamp_value" ]]; then
        echo "e2e: ${commands[*]} $version are up to date in $cache"
        return
    fi
    echo "e2e: building ${commands[*]} $version with $("$go_bin" version | cut -d' ' -f3)" \
        "(cold: about 12 minutes on 2 cores; the Go build cache makes later builds quick)"
    local started=$SECONDS packages=()
    for command in "${commands[@]}"; do
        packages+=("k8s.io/kubernetes/cmd/$command")
    done
    (cd "$module" && CGO_ENABLED=0 "$go_bin" build -mod=readonly -buildvcs=false -ldflags "$ldflags" \
        -o "$work/bin/" "${packages[@]}")
    rm -f "$stamp"
    for command in "${commands[@]}"; do
        mv -f "$work/bin/$command" "$cache/$command"
    done
    echo "$stamp_value" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
    echo "e2e: built ${commands[*]} $version into $cache in $((SECONDS - started)) s"
}

fetch_etcd() {
    if [[ -x "$cache/etcd" ]]; then
        echo "e2e: etcd $(cat "$cache/etcd.version" 2>/dev/null || echo '(unknown version)') is in $cache"
        return
    fi
    local started=$SECONDS deb
    if ! command -v apt-get >/dev/null; then
        echo "e2e: apt-get is missing, so etcd cannot be fetched from Debian's etcd-server package" >&2
        return 1
    fi
    echo "e2e: fetching etcd (Debian package etcd-server)"
    mkdir -p "$work/deb"
    # As root, apt would try to download as its unprivileged user, who cannot write under $HOME/.cache.
    local apt_options=()
    if [[ $EUID -eq 0 ]]; then
        apt_options=(-o APT::Sandbox::User=root)
    fi
    if ! (cd "$work/deb" && apt-get download -q "${apt_options[@]}" etcd-server); then
        echo "e2e: apt-get download failed; running apt-get update once and retrying"
        apt-get update -q
        (cd "$work/deb" && apt-get download -q "${apt_options[@]}" etcd-server)
    fi
    deb="$(ls "$work"/deb/etcd-server_*.deb)"
    dpkg-deb -x "$deb" "$work/root"
    install -m 755 "$work/root/usr/bin/etcd" "$work/etcd"
    dpkg-deb -f "$deb" Version >"$cache/etcd.version"
    mv -f "$work/etcd" "$cache/etcd"
    echo "e2e: fetched etcd $(cat "$cache/etcd.version") into $cache in $((SECONDS - started)) s"
}

build_kubernetes
fetch_etcd
echo "e2e: control plane ready in $cache ($SECONDS s)"
