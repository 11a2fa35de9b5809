#!/usr/bin/env bash
# The container images the one-node cluster (devtools/cluster, tests/node) runs, built here from their sources at
# pinned versions, since no container registry is reachable: each is written as a docker-archive that
# `ctr -n k8s.io images import FILE` takes with its names (containerd 1.6), and listed in an index.
#
#   image/node-images.sh            build what is missing or out of date (as root), check it, write the index
#   image/node-images.sh check      also import every archive into a throwaway containerd when nothing was rebuilt
#   image/node-images.sh clean      remove its archives, stamps, index, logs and the buildah storage used
#
# The images (names as the manifests and kubeadm use them; versions from tests/e2e/k8s/go.mod's k8s.io/kubernetes
# and kubeadm's constants in that module):
#   registry.k8s.io/pause:<kubeadm's PauseVersion>       kubernetes' build/pause/linux/pause.c, gcc -static -Os, as
#                                                        its Makefile builds it; also tagged :3.10 (see PAUSE_ALIASES)
#   registry.k8s.io/kube-scheduler:<version>             the kube-scheduler tests/e2e/build.sh built (CGO_ENABLED=0)
#   registry.k8s.io/coredns/coredns:<kubeadm's CoreDNSVersion>   CoreDNS from its Go module, CGO_ENABLED=0
#   localhost/gpu-workload:1                             Debian's busybox-static and an `nvidia-smi` that is not
#                                                        NVIDIA's: it prints the GPU environment the container got
#   ghcr.io/gpu-extender/gpu-extender:<version>          ours, by image/build.sh; also localhost/gpu-extender:<version>
# The first three are laid out as upstream's (distroless-like files from Debian's ca-certificates, netbase and
# tzdata packages where upstream's base is distroless), from scratch.
#
# Output: ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/node-images/: <image>.tar (docker-archive), <image>.stamp,
# and `index`, one `name<TAB>archive` line per name (an archive with two names has two lines). The buildah storage
# (--root/--runroot, never the host's default) is node-images/buildah/; logs are in node-images/logs/.
#
# Idempotent: each image is rebuilt only when its stamp (a hash of its inputs: sources, binaries, package versions,
# the toolchain and the shell function that builds it) changes. Each new image is run before it is written
# (chroot, no OCI runtime: as its user, read-only root, no network), and after a rebuild every archive is imported
# into a throwaway containerd (its own root, state and socket under /tmp, stopped at the end) to check its names.
#
# Needs root (buildah, chroot, mounts), buildah, gcc with a static libc (libc6-dev), Go, apt-get and dpkg-deb,
# setcap/getcap (libcap2-bin), python3, debootstrap and PyPI (for image/build.sh), and, for the import check,
# containerd and ctr. Not root: it says the node tier will be skipped and exits 0.
#
# Settings (environment): GPU_EXTENDER_CACHE (the cache root), STORAGE_DRIVER (overlay; vfs where overlay fails),
# SKIP_RUN (passed to image/build.sh; 1 unless set: its checks need podman, the checks here do not).
#
# The building blocks (the buildah storage, the distroless-like base, running an image, writing an archive, the
# import check) are image/lib.sh's, shared with image/cert-manager.sh.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tests/cache_dir.sh
source "$repo/tests/cache_dir.sh"
# shellcheck source=lib.sh
source "$repo/image/lib.sh"

read_action "the node tier will be skipped" "$@"

open_cache_dir node-images
use_buildah_storage "$cache/buildah"

archives=(pause kube-scheduler coredns gpu-workload gpu-extender) # <archive>.tar and <archive>.stamp in $cache

if [[ "$action" == clean ]]; then
    remove_buildah_storage
    # Only what this script wrote: other scripts keep their own files in this folder (image/cert-manager.sh).
    for archive in "${archives[@]}"; do
        rm -f "$cache/$archive.tar" "$cache/$archive.stamp"
    done
    rm -rf "$cache/logs" "$cache/index" "$cache/.lock" "$work"
    rmdir --ignore-fail-on-non-empty "$cache"
    echo "node-images: removed its archives, index and buildah storage from $cache"
    exit 0
fi

need_tools buildah gcc strip apt-get dpkg-deb setcap getcap python3 unshare
need_go CoreDNS
trap clean_up EXIT

mkdir -p "$cache/logs"
chroot_bin="$(command -v chroot)"

# --- The pinned versions -------------------------------------------------------------------------------------
k8s_version="$(grep -oE 'k8s\.io/kubernetes v[0-9]+\.[0-9]+\.[0-9]+' "$repo/tests/e2e/k8s/go.mod" | head -n 1 | cut -d' ' -f2)"
k8s_module="$("$go_bin" env GOMODCACHE)/k8s.io/kubernetes@$k8s_version"
if [[ ! -d "$k8s_module" ]]; then
    echo "node-images: downloading k8s.io/kubernetes $k8s_version (module cache)"
    (cd "$repo/tests/e2e/k8s" && "$go_bin" mod download k8s.io/kubernetes)
fi
kubeadm_constant() {
    sed -n "s/^[[:space:]]*$1[[:space:]]*=[[:space:]]*\"\\(.*\\)\"/\\1/p" "$k8s_module/cmd/kubeadm/app/constants/constants.go"
}
pause_version="$(kubeadm_constant PauseVersion)"
coredns_version="$(kubeadm_constant CoreDNSVersion)"
if [[ -z "$pause_version" || -z "$coredns_version" ]]; then
    echo "node-images: no PauseVersion or CoreDNSVersion in kubeadm's constants of $k8s_module" >&2
    exit 1
fi
# kubelet v1.34 leaves the sandbox image to the runtime; kubeadm and the e2e images use pause 3.10.1. devtools/cluster
# configures containerd's sandbox_image as registry.k8s.io/pause:3.10, so the archive carries that name too.
PAUSE_ALIASES=(registry.k8s.io/pause:3.10)
extender_version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)"
go_version="$("$go_bin" env GOVERSION)"

# --- Helpers ---------------------------------------------------------------------------------------------------
sha() { sha256sum | cut -d' ' -f1; }
# The versions apt would fetch of the Debian packages the images hold (one apt-cache call: each takes a second).
declare -A apt_versions=()
while read -r package version; do
    apt_versions[$package]="$version"
done < <(apt-cache policy busybox-static ca-certificates netbase tzdata \
    | awk '/^[^ ].*:$/ {p = substr($0, 1, length($0) - 1)} /^  Candidate:/ {print p, $2}')
apt_version() { echo "${apt_versions[$1]:-}"; }

# --- The images: each a function; its stamp hashes its text (declare -f) with its inputs --------------------------
common="$(declare -f sha debs_into deb_version static_base static_config from_tree in_image expect_config export_archive)"

pause_source="$k8s_module/build/pause/linux/pause.c"
pause_cflags="-Os -Wall -Werror -static -DVERSION=v$pause_version-$k8s_version"
pause_inputs() { cat "$pause_source"; echo "$pause_cflags $(gcc --version | head -n 1) ${PAUSE_ALIASES[*]}"; }
build_pause() {
    local image="registry.k8s.io/pause:$pause_version" tree="$work/pause" container
    # build/pause/Makefile: CFLAGS = -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV), then strip.
    mkdir -p "$tree"
    # shellcheck disable=SC2086
    gcc $pause_cflags -o "$tree/pause" "$pause_source"
    strip "$tree/pause"
    container="$(from_tree "$tree")"
    # build/pause/Dockerfile: FROM scratch, ADD pause /pause, USER 65535:65535, ENTRYPOINT ["/pause"].
    bah config --os linux --arch amd64 --user 65535:65535 --entrypoint '["/pause"]' \
        --label "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes/tree/$k8s_version/build/pause" \
        --label "org.opencontainers.image.version=$pause_version" \
        --label "org.opencontainers.image.description=kubernetes' pause.c ($k8s_version), built by image/node-images.sh" \
        "$container"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    grep -q "pause.c v$pause_version" <<<"$(in_image "$image" 65535:65535 -- /pause -v)"
    export_archive "$image" pause "${PAUSE_ALIASES[@]}"
    names=("$image" "${PAUSE_ALIASES[@]}")
}

k8s_cache="${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/k8s-$k8s_version"
scheduler_inputs() { cat "$k8s_cache/kubernetes.stamp"; sha <"$work/kube-scheduler.bin"; apt_version ca-certificates; apt_version netbase; apt_version tzdata; }
build_kube_scheduler() {
    local image="registry.k8s.io/kube-scheduler:$k8s_version" tree="$work/kube-scheduler" container
    # build/server-image/Dockerfile: FROM go-runner (distroless static + /go-runner, run as root), COPY the binary
    # to /usr/local/bin. go-runner (k8s.io/release) is not on the Go module proxy here: no /go-runner, no
    # entrypoint, so a pod's `command: [kube-scheduler, ...]` (or args alone) runs the binary as with upstream's.
    static_base "$tree"
    install -D -m 755 "$work/kube-scheduler.bin" "$tree/usr/local/bin/kube-scheduler"
    container="$(from_tree "$tree")"
    static_config "$container" \
        --label "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes/tree/$k8s_version/cmd/kube-scheduler" \
        --label "org.opencontainers.image.version=$k8s_version" \
        --label "org.opencontainers.image.description=kube-scheduler $k8s_version (tests/e2e/build.sh, CGO_ENABLED=0), built by image/node-images.sh"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    # As manifests/second-scheduler runs it: user 65532, read-only root, found on PATH.
    grep -qx "Kubernetes $k8s_version" <<<"$(in_image "$image" 65532:65532 -- kube-scheduler --version)"
    export_archive "$image" kube-scheduler
    names=("$image")
}

coredns_module="github.com/coredns/coredns"
coredns_inputs() { echo "$coredns_version $go_version"; apt_version ca-certificates; apt_version netbase; apt_version tzdata; }
build_coredns() {
    local image="registry.k8s.io/coredns/coredns:$coredns_version" tree="$work/coredns" container root commit output
    local info
    (cd "$work" && "$go_bin" mod download "$coredns_module@$coredns_version")
    info="$("$go_bin" env GOMODCACHE)/cache/download/$coredns_module/@v/$coredns_version.info"
    # Its Makefile: CGO_ENABLED=0 go build -ldflags="-s -w -X .../coremain.GitCommit=$(git describe --always)".
    # go.mod has no replace directive, so `go install module@version` builds exactly that release.
    commit="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["Origin"]["Hash"][:7])' "$info")"
    (cd "$work" && CGO_ENABLED=0 GOBIN="$work/bin" "$go_bin" install \
        -ldflags="-s -w -X $coredns_module/coremain.GitCommit=$commit" "$coredns_module@$coredns_version") \
        >"$cache/logs/coredns-build.log" 2>&1 || {
        tail -n 20 "$cache/logs/coredns-build.log" >&2
        return 1
    }
    # Its Dockerfile: FROM distroless/static-debian12:nonroot; the CA bundle; /coredns with cap_net_bind_service=+ep
    # (setcap), so the nonroot user binds port 53; USER nonroot:nonroot; WORKDIR /; EXPOSE 53 53/udp;
    # ENTRYPOINT ["/coredns"].
    static_base "$tree"
    install -m 755 "$work/bin/coredns" "$tree/coredns"
    container="$(from_tree "$tree")"
    root="$(bah mount "$container")"
    setcap cap_net_bind_service=+ep "$root/coredns"
    static_config "$container" --user nonroot:nonroot --port 53 --port 53/udp --entrypoint '["/coredns"]' \
        --label "org.opencontainers.image.source=https://github.com/coredns/coredns/tree/$coredns_version" \
        --label "org.opencontainers.image.version=$coredns_version" \
        --label "org.opencontainers.image.description=CoreDNS $coredns_version ($go_version, CGO_ENABLED=0), built by image/node-images.sh"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    grep -q "CoreDNS-${coredns_version#v}" <<<"$(in_image "$image" 65532:65532 -- /coredns -version)"
    # The file capability survived the commit: as 65532, with no Corefile (its default: whoami on :53), CoreDNS
    # binds port 53 and answers on it.
    container="$(bah from --pull=never --quiet "$image")"
    root="$(bah mount "$container")"
    getcap "$root/coredns" | grep -q 'cap_net_bind_service[=+]ep'
    output="$(unshare --net -- sh -c '
        ip link set lo up
        env -i "$1" --userspec=65532:65532 --groups=65532 "$2" /coredns -dns.port 53 >"$3" 2>&1 &
        sleep 2
        busybox nslookup example.org 127.0.0.1 2>&1 || true
        kill $! 2>/dev/null; wait; cat "$3"' sh "$chroot_bin" "$root" "$work/coredns.out" || true)"
    bah umount "$container" >/dev/null
    bah rm "$container" >/dev/null
    if ! grep -q '^\.:53' <<<"$output" || grep -qi 'permission denied' <<<"$output"; then
        echo "node-images: CoreDNS as 65532 did not bind port 53:" >&2
        echo "$output" >&2
        return 1
    fi
    # Its default log plugin logs each query it answered.
    if command -v busybox >/dev/null && ! grep -q '"A IN example\.org\. udp .*NOERROR' <<<"$output"; then
        echo "node-images: CoreDNS on port 53 did not answer a query (whoami):" >&2
        echo "$output" >&2
        return 1
    fi
    export_archive "$image" coredns
    names=("$image")
}

workload_image="localhost/gpu-workload:1"
workload_inputs() { apt_version busybox-static; }
build_workload() {
    local image="$workload_image" tree="$work/workload" unpacked="$work/busybox" applet container
    debs_into "$unpacked" busybox-static
    install -d -m 755 "$tree/bin" "$tree/sbin" "$tree/usr/bin" "$tree/usr/sbin" "$tree/usr/local/bin" "$tree/etc"
    install -d -m 1777 "$tree/tmp"
    install -d -m 700 "$tree/root"
    install -m 755 "$unpacked/bin/busybox" "$tree/bin/busybox"
    # Its applets (sh, sleep, env, cat, grep, sort, ...) as links, where busybox itself would install them.
    for applet in $("$tree/bin/busybox" --list-full); do
        [[ -e "$tree/$applet" || -L "$tree/$applet" ]] || ln -s /bin/busybox "$tree/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$tree/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' >"$tree/etc/group"
    cat >"$tree/usr/local/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# Not NVIDIA's nvidia-smi: there is no GPU and no NVIDIA driver where this image runs (localhost/gpu-workload, made
# by gpu-extender's image/node-images.sh for its one-node test cluster). It prints the GPU environment the device
# plugin gave this container at kubelet's Allocate, one NAME=value line each, sorted.
echo "nvidia-smi: this is not NVIDIA's nvidia-smi (no GPU, no driver here): the GPU environment of this container:"
env | grep -E '^(NVIDIA_|CUDA_|ALIYUN_COM_GPU_|GPU_|LIBCUDA_|HAMI_)[A-Za-z0-9_]*=' | sort
env | grep -qE '^(NVIDIA_|CUDA_|ALIYUN_COM_GPU_|GPU_|LIBCUDA_|HAMI_)[A-Za-z0-9_]*=' \
    || echo "nvidia-smi: (none: no GPU was allocated to this container)"
exit 0
EOF
    chmod 755 "$tree/usr/local/bin/nvidia-smi"
    container="$(from_tree "$tree")"
    bah config --os linux --arch amd64 --workingdir / --cmd '["sh"]' \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --label "org.opencontainers.image.description=busybox (Debian busybox-static $(apt_version busybox-static)) and an nvidia-smi that is not NVIDIA's: it prints the GPU environment; by gpu-extender's image/node-images.sh" \
        "$container"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    # As the example pods run it: user 1000 (no entry in /etc/passwd), `sh -c "nvidia-smi; sleep ..."`.
    in_image "$image" 1000:1000 ALIYUN_COM_GPU_MEM_IDX=0 NVIDIA_VISIBLE_DEVICES=GPU-0 -- \
        sh -c 'nvidia-smi; sleep 0; id -u' >"$work/workload.out"
    grep -qx 'ALIYUN_COM_GPU_MEM_IDX=0' "$work/workload.out"
    grep -qx 'NVIDIA_VISIBLE_DEVICES=GPU-0' "$work/workload.out"
    grep -qx 1000 "$work/workload.out"
    export_archive "$image" gpu-workload
    names=("$image")
}

extender_image="ghcr.io/gpu-extender/gpu-extender:$extender_version"
extender_alias="localhost/gpu-extender:$extender_version"
extender_inputs() {
    # What the build reads (.dockerignore lets in pyproject.toml, README.md, extender/, image/runtime-rootfs.sh).
    (cd "$repo" && find Dockerfile .dockerignore pyproject.toml README.md image/build.sh image/runtime-rootfs.sh extender \
        -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
}
build_extender() {
    local deployment="$repo/manifests/base/deployment.yaml"
    echo "node-images: image/build.sh (buildah bud of the Dockerfile; log: $cache/logs/extender-build.log)"
    WORK="$buildah_dir" IMAGE=localhost/gpu-extender SKIP_RUN="${SKIP_RUN:-1}" STORAGE_DRIVER="${STORAGE_DRIVER:-overlay}" \
        bash "$repo/image/build.sh" >"$cache/logs/extender-build.log" 2>&1 9>&- || {
        tail -n 30 "$cache/logs/extender-build.log" >&2
        return 1
    }
    # What manifests/base/deployment.yaml runs: this image, `command: ["extender"]`, uid 65532, a read-only root.
    grep -q "image: $extender_image\$" "$deployment"
    grep -q 'command: \["extender"\]' "$deployment"
    grep -q 'runAsUser: 65532' "$deployment"
    grep -q 'readOnlyRootFilesystem: true' "$deployment"
    expect_config "$extender_alias" '{{.OCIv1.Config.Entrypoint}}' '[extender]'
    expect_config "$extender_alias" '{{.OCIv1.Config.User}}' '65532:65532'
    in_image "$extender_alias" 65532:65532 -- extender --help >/dev/null
    grep -q 'KubeSchedulerConfiguration' <<<"$(in_image "$extender_alias" 65532:65532 -- extender scheduler-config \
        --k8s-version 1.34 --url https://gpu-extender.gpu-extender.svc:8443 \
        --scheduler-ca-file /etc/kubernetes/extender/ca.crt --scheduler-cert-file /etc/kubernetes/extender/tls.crt \
        --scheduler-key-file /etc/kubernetes/extender/tls.key)"
    bah tag "$extender_alias" "$extender_image"
    export_archive "$extender_image" gpu-extender "$extender_alias"
    names=("$extender_image" "$extender_alias")
}

# kube-scheduler comes from tests/e2e/build.sh: wait while a build holds its cache's lock, never start one here.
take_kube_scheduler() {
    mkdir -p "$k8s_cache"
    exec 8>"$k8s_cache/.lock"
    if ! flock -n 8; then
        echo "node-images: waiting for tests/e2e/build.sh to finish ($k8s_cache is locked)"
        flock 8
    fi
    if [[ ! -x "$k8s_cache/kube-scheduler" || ! -f "$k8s_cache/kubernetes.stamp" ]]; then
        echo "node-images: no kube-scheduler in $k8s_cache: run tests/e2e/build.sh (make e2e-build) first" >&2
        exit 1
    fi
    cp "$k8s_cache/kube-scheduler" "$work/kube-scheduler.bin"
    exec 8>&-
}

# --- Build what changed ----------------------------------------------------------------------------------------
summary=()
index_lines=()
rebuilt=0
# build_image <archive name> <build function> <inputs function>
build_image() {
    local archive="$1" build="$2" inputs="$3" stamp value started=$SECONDS size names=()
    stamp="$cache/$archive.stamp"
    value="$({ declare -f "$build" "$inputs"; echo "$common"; "$inputs"; } | sha)"
    if [[ -f "$cache/$archive.tar" && -f "$stamp" && "$(head -n 1 "$stamp")" == "$value" ]]; then
        mapfile -t names < <(tail -n +2 "$stamp")
        summary+=("$(printf '%-14s %-52s %8s  up to date' "$archive" "${names[0]}" "$(du -h "$cache/$archive.tar" | cut -f1)")")
    else
        echo "node-images: building $archive"
        rm -f "$stamp"
        "$build"
        printf '%s\n' "$value" "${names[@]}" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
        size="$(du -h "$cache/$archive.tar" | cut -f1)"
        summary+=("$(printf '%-14s %-52s %8s  built in %d s' "$archive" "${names[0]}" "$size" $((SECONDS - started)))")
        echo "node-images: built $archive (${names[*]}, $size) in $((SECONDS - started)) s"
        rebuilt=1
    fi
    local name
    for name in "${names[@]}"; do
        index_lines+=("$name"$'\t'"$cache/$archive.tar")
    done
}

build_image pause build_pause pause_inputs
take_kube_scheduler
build_image kube-scheduler build_kube_scheduler scheduler_inputs
build_image coredns build_coredns coredns_inputs
build_image gpu-workload build_workload workload_inputs
build_image gpu-extender build_extender extender_inputs

printf '%s\n' "${index_lines[@]}" >"$cache/index.tmp" && mv -f "$cache/index.tmp" "$cache/index"

# --- Import every archive into a throwaway containerd: the names must be there as the index says ------------------
check_imports() {
    local started=$SECONDS mnt
    have_containerd || return 0
    start_containerd
    import_index "$cache/index"
    # CoreDNS' file capability, as containerd unpacked it (the layer's security.capability xattr).
    mnt="$containerd_dir/mnt"
    mkdir -p "$mnt"
    "${ctr_k8s[@]}" images mount "registry.k8s.io/coredns/coredns:$coredns_version" "$mnt" >/dev/null
    getcap "$mnt/coredns" | grep -q 'cap_net_bind_service[=+]ep' || {
        echo "node-images: containerd unpacked /coredns without its cap_net_bind_service" >&2
        return 1
    }
    "${ctr_k8s[@]}" images unmount --rm "$mnt" >/dev/null
    stop_containerd
    echo "node-images: containerd $(containerd --version | cut -d' ' -f3) imported all $(wc -l <"$cache/index") names" \
        "in $((SECONDS - started)) s"
}
if [[ $rebuilt == 1 || "$action" == check ]]; then
    check_imports
fi

echo "node-images: done in $SECONDS s; index $cache/index:"
printf '  %s\n' "${summary[@]}"
