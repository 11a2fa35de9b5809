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
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tests/cache_dir.sh
source "$repo/tests/cache_dir.sh"

action="${1:-build}"
case "$action" in
build | check | clean) ;;
*)
    echo "usage: $0 [build|check|clean]" >&2
    exit 2
    ;;
esac
if [[ $EUID -ne 0 ]]; then
    echo "node-images: not root: the images are built with buildah and chroot as root; the node tier will be skipped"
    exit 0
fi

open_cache_dir node-images
buildah_dir="$cache/buildah"
storage=(--root "$buildah_dir/storage" --runroot "$buildah_dir/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
bah() { buildah "${storage[@]}" "$@"; }

archives=(pause kube-scheduler coredns gpu-workload gpu-extender) # <archive>.tar and <archive>.stamp in $cache

unmount_under() { # every mount below $1, deepest first
    awk -v dir="$1/" 'index($2, dir) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n 1 umount -l
}

if [[ "$action" == clean ]]; then
    if [[ -d "$buildah_dir" ]]; then
        bah rm --all >/dev/null 2>&1 || true
        bah rmi --all --force >/dev/null 2>&1 || true
        unmount_under "$buildah_dir"
    fi
    # Only what this script wrote: other scripts keep their own files in this folder (image/cert-manager.sh).
    for archive in "${archives[@]}"; do
        rm -f "$cache/$archive.tar" "$cache/$archive.stamp"
    done
    rm -rf "$buildah_dir" "$cache/logs" "$cache/index" "$cache/.lock" "$work"
    rmdir --ignore-fail-on-non-empty "$cache"
    echo "node-images: removed its archives, index and buildah storage from $cache"
    exit 0
fi

for tool in buildah gcc strip apt-get dpkg-deb setcap getcap python3 unshare; do
    command -v "$tool" >/dev/null || {
        echo "node-images: $tool is missing" >&2
        exit 2
    }
done
find_go
if [[ -z "$go_bin" ]]; then
    echo "node-images: no Go toolchain (go is not on PATH): CoreDNS cannot be built" >&2
    exit 2
fi

containerd_dir=""
containerd_pid=""
cleanup() {
    if [[ -n "$containerd_pid" ]]; then
        kill "$containerd_pid" 2>/dev/null || true
        wait "$containerd_pid" 2>/dev/null || true
    fi
    if [[ -n "$containerd_dir" ]]; then
        unmount_under "$containerd_dir"
        rm -rf "$containerd_dir"
    fi
    # A build that failed leaves its working containers (and their mounts) behind.
    bah rm --all >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

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

# Unpack Debian packages (downloaded, never installed) into $1.
debs_into() {
    local into="$1" package deb apt_options=(-o APT::Sandbox::User=root)
    shift
    mkdir -p "$work/deb"
    for package in "$@"; do
        if ! compgen -G "$work/deb/${package}_*.deb" >/dev/null; then
            if ! (cd "$work/deb" && apt-get download -q "${apt_options[@]}" "$package" >/dev/null 2>&1); then
                echo "node-images: apt-get download $package failed; running apt-get update once and retrying"
                apt-get update -q >/dev/null
                (cd "$work/deb" && apt-get download -q "${apt_options[@]}" "$package" >/dev/null)
            fi
        fi
        deb="$(compgen -G "$work/deb/${package}_*.deb" | head -n 1)"
        dpkg-deb -x "$deb" "$into"
    done
}

# What upstream's distroless static base (gcr.io/distroless/static-debian12) holds, from the same Debian packages:
# /etc/passwd and /etc/group with root, nobody and nonroot (65532), the CA bundle (ca-certificates), /etc/services
# and friends (netbase), /usr/share/zoneinfo (tzdata), /tmp (1777), /home/nonroot and /root.
static_base() {
    local root="$1" unpacked="$work/static-base-debs" cert
    rm -rf "$unpacked"
    debs_into "$unpacked" ca-certificates netbase tzdata
    install -d -m 755 "$root/etc/ssl/certs" "$root/usr/share"
    install -d -m 1777 "$root/tmp"
    install -d -m 700 "$root/root"
    install -d -m 700 -o 65532 -g 65532 "$root/home/nonroot"
    # The bundle update-ca-certificates would write: every Mozilla certificate the package ships, in its order.
    (cd "$unpacked/usr/share/ca-certificates" && find mozilla -name '*.crt' | LC_ALL=C sort) | while read -r cert; do
        sed -e '$a\' "$unpacked/usr/share/ca-certificates/$cert"
    done >"$root/etc/ssl/certs/ca-certificates.crt"
    chmod 644 "$root/etc/ssl/certs/ca-certificates.crt"
    cp -a "$unpacked/etc/services" "$unpacked/etc/protocols" "$unpacked/etc/rpc" "$unpacked/etc/ethertypes" "$root/etc/"
    cp -a "$unpacked/usr/share/zoneinfo" "$root/usr/share/"
    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
tty:x:5:
staff:x:50:
nobody:x:65534:
nonroot:x:65532:
EOF
    echo "hosts: files dns" >"$root/etc/nsswitch.conf"
    chmod 644 "$root/etc/passwd" "$root/etc/group" "$root/etc/nsswitch.conf"
}

# A working container from scratch holding the tree $1; prints its id.
from_tree() {
    local tree="$1" container mountpoint
    container="$(bah from scratch)"
    mountpoint="$(bah mount "$container")"
    tar -C "$tree" -cf - . | tar -C "$mountpoint" -xpf -
    echo "$container"
}

# Run argv in image $1's root filesystem without an OCI runtime: chroot as $2 (uid:gid), with the image's
# environment plus any VAR=value before `--`, its root read-only (readOnlyRootFilesystem), in private mount and
# network namespaces (only a loopback, down). The working container is removed afterwards.
in_image() {
    local image="$1" user="$2" container root status=0 env=()
    shift 2
    mapfile -t env < <(bah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$image" \
        | sed '/^$/d')
    while [[ $# -gt 0 && "$1" != -- ]]; do
        env+=("$1")
        shift
    done
    shift
    container="$(bah from --pull=never --quiet "$image")"
    root="$(bah mount "$container")"
    unshare --mount --net --propagation private -- sh -c \
        'root="$1"; shift; mount --bind "$root" "$root" && mount -o remount,bind,ro "$root" && exec "$@"' sh "$root" \
        env -i "${env[@]}" "$chroot_bin" --userspec="$user" --groups="${user#*:}" "$root" "$@" || status=$?
    bah umount "$container" >/dev/null
    bah rm "$container" >/dev/null
    return "$status"
}

# Check one field of image $1's configuration (a Go template on buildah inspect) against $2.
expect_config() {
    local image="$1" template="$2" want="$3" got
    got="$(bah inspect --type image --format "$template" "$image")"
    if [[ "$got" != "$want" ]]; then
        echo "node-images: $image: $template is $got, not $want" >&2
        return 1
    fi
}

# Write image $1 as the docker-archive $cache/$2.tar under its name and the further names $3...; buildah push
# writes one name, so the others are added to the archive's manifest.json (and its legacy `repositories`).
export_archive() {
    local image="$1" file="$cache/$2.tar" unpacked="$work/archive-$2"
    shift 2
    rm -rf "$unpacked" "$work/$(basename "$file")"
    bah push --quiet "$image" "docker-archive:$work/$(basename "$file"):$image" >/dev/null
    if [[ $# -gt 0 ]]; then
        mkdir -p "$unpacked"
        tar -C "$unpacked" -xf "$work/$(basename "$file")"
        python3 - "$unpacked" "$image" "$@" <<'EOF'
import json, sys
from pathlib import Path
root, first, more = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
manifest = json.loads((root / "manifest.json").read_text())
assert len(manifest) == 1 and manifest[0]["RepoTags"] == [first], manifest
manifest[0]["RepoTags"] += more
(root / "manifest.json").write_text(json.dumps(manifest, separators=(",", ":")))
repositories = json.loads((root / "repositories").read_text())
repository, tag = first.rsplit(":", 1)
layer = repositories[repository][tag]
for name in more:
    repository, tag = name.rsplit(":", 1)
    repositories.setdefault(repository, {})[tag] = layer
(root / "repositories").write_text(json.dumps(repositories, separators=(",", ":")))
EOF
        (cd "$unpacked" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
            -cf "$work/$(basename "$file")" -- *)
        rm -rf "$unpacked"
    fi
    mv -f "$work/$(basename "$file")" "$file"
}

# --- The images: each a function; its stamp hashes its text (declare -f) with its inputs --------------------------
common="$(declare -f sha debs_into static_base from_tree in_image expect_config export_archive)"

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
    bah config --os linux --arch amd64 --workingdir / \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        --label "org.opencontainers.image.source=https://github.com/kubernetes/kubernetes/tree/$k8s_version/cmd/kube-scheduler" \
        --label "org.opencontainers.image.version=$k8s_version" \
        --label "org.opencontainers.image.description=kube-scheduler $k8s_version (tests/e2e/build.sh, CGO_ENABLED=0), built by image/node-images.sh" \
        "$container"
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
    bah config --os linux --arch amd64 --user nonroot:nonroot --workingdir / --port 53 --port 53/udp \
        --entrypoint '["/coredns"]' \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        --label "org.opencontainers.image.source=https://github.com/coredns/coredns/tree/$coredns_version" \
        --label "org.opencontainers.image.version=$coredns_version" \
        --label "org.opencontainers.image.description=CoreDNS $coredns_version ($go_version, CGO_ENABLED=0), built by image/node-images.sh" \
        "$container"
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
    local line name archive started=$SECONDS listed mnt
    if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null; then
        echo "node-images: no containerd/ctr: the import check is skipped"
        return
    fi
    containerd_dir="$(mktemp -d /tmp/node-images-containerd.XXXXXX)"
    cat >"$containerd_dir/config.toml" <<EOF
version = 2
root = "$containerd_dir/root"
state = "$containerd_dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$containerd_dir/containerd.sock"
[ttrpc]
  address = "$containerd_dir/containerd.sock.ttrpc"
[debug]
  address = "$containerd_dir/debug.sock"
EOF
    containerd --config "$containerd_dir/config.toml" >"$containerd_dir/containerd.log" 2>&1 9>&- &
    containerd_pid=$!
    local c=(ctr --address "$containerd_dir/containerd.sock" -n k8s.io)
    for _ in $(seq 50); do
        "${c[@]}" version >/dev/null 2>&1 && break
        sleep 0.2
    done
    for archive in $(cut -f2 "$cache/index" | sort -u); do
        "${c[@]}" images import "$archive" >/dev/null
    done
    listed="$("${c[@]}" images ls -q)"
    while IFS=$'\t' read -r name archive; do
        grep -qxF "$name" <<<"$listed" || {
            echo "node-images: $archive imported, but containerd has no image $name" >&2
            return 1
        }
    done <"$cache/index"
    # CoreDNS' file capability, as containerd unpacked it (the layer's security.capability xattr).
    mnt="$containerd_dir/mnt"
    mkdir -p "$mnt"
    "${c[@]}" images mount "registry.k8s.io/coredns/coredns:$coredns_version" "$mnt" >/dev/null
    getcap "$mnt/coredns" | grep -q 'cap_net_bind_service[=+]ep' || {
        echo "node-images: containerd unpacked /coredns without its cap_net_bind_service" >&2
        return 1
    }
    "${c[@]}" images unmount --rm "$mnt" >/dev/null
    kill "$containerd_pid"
    wait "$containerd_pid" 2>/dev/null || true
    containerd_pid=""
    echo "node-images: containerd $(containerd --version | cut -d' ' -f3) imported all $(wc -l <"$cache/index") names" \
        "in $((SECONDS - started)) s"
}
if [[ $rebuilt == 1 || "$action" == check ]]; then
    check_imports
fi

echo "node-images: done in $SECONDS s; index $cache/index:"
printf '  %s\n' "${summary[@]}"
