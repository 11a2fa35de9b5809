#!/usr/bin/env bash
# Build the gpu-extender image without a Docker daemon or a container registry, then run it to check it:
# Debian's buildah and podman, and a Debian bookworm base made by debootstrap from Debian's mirror. This is how
# the image was built and tested on a machine that reaches Debian's packages and PyPI but no registry.
#
#   sudo image/build.sh            # as root (buildah/podman rootful, debootstrap); needs Debian or Ubuntu
#   sudo image/build.sh clean      # remove it all: images, containers storage, work directory
#
# Idempotent: the base image is made once and kept; buildah's layer cache makes a rebuild after a code change
# re-run only the pip stage. Everything lives under $WORK (default /tmp/gpu-extender-image), nothing in the
# repository: the containers storage too (--root), so `image/build.sh clean` undoes it all.
#
# Settings (environment):
#   WORK             work directory: containers storage, debootstrap tree, logs   (/tmp/gpu-extender-image)
#   IMAGE            the image's name                                             (localhost/gpu-extender)
#   MIRROR           Debian mirror for debootstrap and apt in the build           (http://deb.debian.org/debian)
#   STORAGE_DRIVER   containers storage driver: overlay, or vfs where overlay fails (overlay)
#   PIP_CERT         a CA bundle pip must trust (a TLS-intercepting proxy); mounted into the build if set
#   PIP_INDEX_URL    a PyPI mirror, passed to the build if set
#   SOURCE           the org.opencontainers.image.source label        (the repository's remote origin, if any)
#   INSTALL=1        apt-get install buildah podman crun debootstrap first
#   SKIP_RUN=1       build only, do not run the checks
#
# CI does not run this: it needs root and a few minutes (about one for the base, two for the image).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/gpu-extender-image}
IMAGE=${IMAGE:-localhost/gpu-extender}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
STORAGE_DRIVER=${STORAGE_DRIVER:-overlay}
BASE=localhost/debian-bookworm-debootstrap:latest

if [[ $(id -u) != 0 ]]; then
    echo "image/build.sh: run as root (debootstrap and rootful buildah)" >&2
    exit 2
fi
if [[ ${INSTALL:-0} == 1 ]]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah podman crun debootstrap
fi
# podman only runs the checks: a build with SKIP_RUN=1 needs buildah and debootstrap alone.
tools=(buildah debootstrap)
[[ ${SKIP_RUN:-0} == 1 ]] || tools+=(podman)
for tool in "${tools[@]}"; do
    command -v "$tool" > /dev/null || { echo "image/build.sh: $tool is missing (INSTALL=1 installs it)" >&2; exit 2; }
done

mkdir -p "$WORK"
storage=(--root "$WORK/storage" --runroot "$WORK/run" --storage-driver "$STORAGE_DRIVER")
bah() { buildah "${storage[@]}" "$@"; }
# podman runs the image with crun and no cgroup of its own (--cgroups=disabled): nothing is created in the
# host's cgroup tree. crun refuses a hybrid cgroup v1/v2 host ("cgroups in hybrid mode not supported"); there
# the cgroup2 mount is hidden in a private mount namespace of podman's own, which the host never sees. The
# ulimits are set explicitly because podman's defaults are above what a host without CAP_SYS_RESOURCE can set.
pod() {
    local command=(podman "${storage[@]}" --cgroup-manager cgroupfs --events-backend none "$@")
    if mountpoint -q /sys/fs/cgroup/unified 2> /dev/null; then
        unshare --mount --propagation private -- sh -c 'umount /sys/fs/cgroup/unified && exec "$@"' sh "${command[@]}"
    else
        "${command[@]}"
    fi
}

# `image/build.sh clean`: remove every image and container of $WORK's storage, its mounts, and $WORK.
if [[ ${1:-} == clean ]]; then
    bah rm --all > /dev/null 2>&1 || true
    bah rmi --all --force > /dev/null 2>&1 || true
    awk -v work="$WORK/" 'index($2, work) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n 1 umount
    rm -rf "$WORK"
    echo "removed $WORK"
    exit 0
fi
# A build that fails leaves its working containers (and their mounts) behind: remove them whatever happens.
trap 'bah rm --all > /dev/null 2>&1 || true' EXIT

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -n 1)
revision=$(git -C "$repo" rev-parse HEAD 2> /dev/null || true)
source=$(git -C "$repo" config --get remote.origin.url 2> /dev/null || true)

# 1. The builder's base: a minimal Debian bookworm, as debian:bookworm-slim would be (same apt sources).
if ! bah inspect --type image "$BASE" > /dev/null 2>&1; then
    echo "== debootstrap bookworm from $MIRROR"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 \
        || { tail -n 20 "$WORK/debootstrap.log" >&2; exit 1; }
    cat > "$WORK/rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb http://security.debian.org/debian-security bookworm-security main
EOF
    chroot "$WORK/rootfs" apt-get clean
    rm -rf "$WORK/rootfs/var/lib/apt/lists/"* "$WORK/rootfs/var/cache/apt/"*.bin
    container=$(bah from scratch)
    mountpoint=$(bah mount "$container")
    tar -C "$WORK/rootfs" -cf - . | tar -C "$mountpoint" -xpf -
    bah umount "$container" > /dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
        --label org.opencontainers.image.description="Debian bookworm minbase, by debootstrap from $MIRROR" \
        "$container"
    bah commit --rm "$container" "$BASE" > /dev/null
    rm -rf "$WORK/rootfs"
fi

# 2. The image, from the repository's Dockerfile.
args=(--build-arg "DEBIAN_IMAGE=$BASE" --build-arg "VERSION=$version" --build-arg "REVISION=$revision"
    --build-arg "SOURCE=${SOURCE:-$source}")
if [[ -n ${PIP_CERT:-} ]]; then
    args+=(--volume "$PIP_CERT:/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
fi
if [[ -n ${PIP_INDEX_URL:-} ]]; then
    args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
fi
echo "== buildah bud $IMAGE:$version"
start=$(date +%s)
# --isolation chroot: the build's RUN steps need no OCI runtime and no cgroups (works inside containers and VMs).
bah bud --layers --isolation chroot --network host "${args[@]}" -f "$repo/Dockerfile" -t "$IMAGE:$version" -t "$IMAGE:latest" "$repo"
echo "== built in $(($(date +%s) - start)) s"
bah images "$IMAGE"

[[ ${SKIP_RUN:-0} == 1 ]] && exit 0

# 3. Run it as Kubernetes would with the manifests' securityContext: user 65532, read-only root filesystem,
#    no capabilities, no privilege escalation, no network but loopback. The demo alone gets a /tmp (tmpfs).
run=(pod run --rm --read-only --read-only-tmpfs=false --user 65532:65532 --cap-drop ALL
    --security-opt no-new-privileges --network none --cgroups=disabled --ulimit nofile=4096:4096
    --ulimit nproc=4096:4096)
echo "== extender --help"
"${run[@]}" "$IMAGE:$version" --help
echo "== extender demo"
"${run[@]}" --tmpfs /tmp:rw,size=16m,mode=1777 "$IMAGE:$version" demo
echo "== extender scheduler-config --k8s-version 1.31 (no /tmp at all)"
"${run[@]}" "$IMAGE:$version" scheduler-config --k8s-version 1.31 --url https://gpu-extender.gpu-extender.svc:8443 \
    --scheduler-ca-file /etc/kubernetes/extender/ca.crt --scheduler-cert-file /etc/kubernetes/extender/tls.crt \
    --scheduler-key-file /etc/kubernetes/extender/tls.key > /dev/null
echo "== no shell in the image"
if "${run[@]}" --entrypoint /bin/sh "$IMAGE:$version" -c true 2> /dev/null; then
    echo "image/build.sh: the image has a shell" >&2
    exit 1
fi
echo "== ok: $IMAGE:$version"
