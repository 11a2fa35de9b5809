#!/usr/bin/env bash
# The scheduler extenders our users move from, for the node tier's migration tests (tests/node/test_migration.py,
# docs/migrate/): gpushare-scheduler-extender's image, built here from its source at the commit the placement bench
# measures, since no registry is reachable; and HAMi's source at v2.10.0, from which the tests build hami-scheduler
# as the placement bench does (bench/placement/peers.py: `go build`, cgo, cached by a digest of its Go files) and run
# it as its chart runs it.
#
#   image/peer-images.sh            build it when missing or out of date (as root), check it, write the index
#   image/peer-images.sh check      also import it into a throwaway containerd when nothing was rebuilt
#   image/peer-images.sh clean      remove its archive, stamp, index, source and the buildah storage used
#
# The image (its Deployment's name in config/gpushare-schd-extender.yaml is registry.cn-hangzhou.aliyuncs.com/acs/
# k8s-gpushare-schd-extender:1.11-d170d8a, which no registry here serves; the tests apply that file with this name):
#   localhost/gpushare-schd-extender:c0b6141   its Dockerfile's build: `go build -o /usr/bin/gpushare-sche-extender
#                                              cmd/*.go`, CMD gpushare-sche-extender; static (CGO_ENABLED=0) on
#                                              distroless-like files (image/lib.sh's static_base), not alpine.
#
# Its source: ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/peers/src/gpushare-scheduler-extender-c0b6141, a
# clone of GPUSHARE_EXTENDER_GIT (default https://github.com/AliyunContainerService/gpushare-scheduler-extender) at
# that commit, made once; the Go module proxy does not serve this module, so a machine that has never cloned it
# needs GitHub (or GPUSHARE_EXTENDER_GIT naming a clone or mirror) once.
#
# HAMi's source: <cache>/peers/src/HAMi-v2.10.0, a clone of HAMI_GIT (default https://github.com/Project-HAMi/HAMi)
# at v2.10.0 (commit 4707fb02), made once (the module proxy does not serve it either).
#
# Output: <cache>/node-images/gpushare-schd-extender.{tar,stamp} and index-peers (`name<TAB>archive`, read by
# devtools/cluster like node-images.sh's index). Not root: it says the node tier will be skipped and exits 0.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tests/cache_dir.sh
source "$repo/tests/cache_dir.sh"
# shellcheck source=lib.sh
source "$repo/image/lib.sh"

read_action "the node tier will be skipped" "$@"

open_cache_dir node-images
node_images="$cache"
use_buildah_storage "$cache/buildah-peers"

commit=c0b61411cddabd1b19500878ab355afeeae5589e
short="${commit:0:7}"
image="localhost/gpushare-schd-extender:$short"
archive=gpushare-schd-extender
index="$node_images/index-peers"
source_dir="$(dirname "$node_images")/peers/src/gpushare-scheduler-extender-$short"
git_url="${GPUSHARE_EXTENDER_GIT:-https://github.com/AliyunContainerService/gpushare-scheduler-extender}"

hami_commit=4707fb02c91c545bc7343ce26dba4c32919f9a3e
hami_dir="$(dirname "$node_images")/peers/src/HAMi-v2.10.0"
hami_url="${HAMI_GIT:-https://github.com/Project-HAMi/HAMi}"

if [[ "$action" == clean ]]; then
    remove_buildah_storage
    rm -rf "$node_images/$archive.tar" "$node_images/$archive.stamp" "$index" "$source_dir" "$hami_dir" "$work"
    echo "peer-images: removed $archive's archive, stamp, index and source, and HAMi's source"
    exit 0
fi

need_tools buildah git apt-get dpkg-deb unshare
need_go gpushare-scheduler-extender
trap clean_up EXIT

# --- The sources, at the pinned commits -----------------------------------------------------------------------------
# clone_at DIR URL COMMIT VARIABLE: DIR holds URL's tree at COMMIT (cloned once; VARIABLE names the override).
clone_at() {
    local dir="$1" url="$2" want="$3" variable="$4"
    if [[ "$(git -C "$dir" rev-parse HEAD 2>/dev/null || true)" == "$want" ]]; then
        return 0
    fi
    echo "peer-images: cloning $url into $dir"
    rm -rf "$dir" "$dir.partial"
    mkdir -p "$(dirname "$dir")"
    git clone --quiet "$url" "$dir.partial" || {
        echo "peer-images: cannot clone $url: set $variable to a clone of it" >&2
        exit 1
    }
    git -C "$dir.partial" checkout --quiet "$want"
    mv "$dir.partial" "$dir"
}
clone_at "$source_dir" "$git_url" "$commit" GPUSHARE_EXTENDER_GIT
clone_at "$hami_dir" "$hami_url" "$hami_commit" HAMI_GIT

# --- Build when its inputs changed --------------------------------------------------------------------------------
sha() { sha256sum | cut -d' ' -f1; }
go_version="$("$go_bin" env GOVERSION)"
build_peer() {
    local tree="$work/peer" container
    echo "peer-images: go build of $short's ./cmd (CGO_ENABLED=0; the first time downloads its modules)"
    (cd "$source_dir" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" "$go_bin" build -trimpath \
        -o "$work/gpushare-sche-extender" ./cmd)
    static_base "$tree"
    install -D -m 755 "$work/gpushare-sche-extender" "$tree/usr/bin/gpushare-sche-extender"
    container="$(from_tree "$tree")"
    static_config "$container" --cmd '["gpushare-sche-extender"]' \
        --label "org.opencontainers.image.source=https://github.com/AliyunContainerService/gpushare-scheduler-extender/tree/$commit" \
        --label "org.opencontainers.image.description=gpushare-scheduler-extender at $short, built by gpu-extender's image/peer-images.sh"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    # It starts, reads PORT, and fails only for want of a cluster: its first line names the port it would serve.
    in_image "$image" 0:0 PORT=12345 KUBECONFIG=/nonexistent -- gpushare-sche-extender >"$work/peer.out" 2>&1 || true
    grep -q . "$work/peer.out"
    export_archive "$image" "$archive"
}
value="$({ declare -f build_peer static_base static_config from_tree in_image export_archive; echo "$commit $go_version"; } | sha)"
rebuilt=0
if [[ -f "$node_images/$archive.tar" && "$(head -n 1 "$node_images/$archive.stamp" 2>/dev/null)" == "$value" ]]; then
    echo "peer-images: $image up to date"
else
    started=$SECONDS
    build_peer
    printf '%s\n' "$value" "$image" >"$node_images/$archive.stamp"
    echo "peer-images: built $image in $((SECONDS - started)) s"
    rebuilt=1
fi
printf '%s\t%s\n' "$image" "$node_images/$archive.tar" >"$index.tmp" && mv -f "$index.tmp" "$index"

if [[ $rebuilt == 1 || "$action" == check ]] && have_containerd; then
    start_containerd
    import_index "$index"
    stop_containerd
    echo "peer-images: containerd imported $image"
fi
echo "peer-images: done in $SECONDS s; index $index"
