# Sourced, after tests/cache_dir.sh, by the scripts that build the one-node cluster's images as root with buildah
# (image/node-images.sh, image/cert-manager.sh): how they build an image from a tree of files, run it without an OCI
# runtime, write it as a docker-archive that containerd imports with its names, and check that import. Messages
# start with $me, the sourcing script's name (node-images, cert-manager).
#
#   read_action SKIPPED ARG...   sets $action from the first ARG (build when none; build, check or clean, else it
#                                prints the usage and exits 2); not root, it says so, then SKIPPED, and exits 0.
#   need_tools TOOL...           exits 2 naming the first TOOL that is not on PATH.
#   need_go WHAT                 sets $go_bin (find_go), or exits 2 saying WHAT cannot be built without Go.
#   use_buildah_storage DIR      sets $buildah_dir (DIR) and $storage, the options with which `bah` runs buildah:
#                                its storage in DIR (--root/--runroot, never the host's default), driver
#                                $STORAGE_DRIVER (overlay; vfs where overlay fails).
#   empty_buildah_storage        removes the storage's working containers and images.
#   remove_buildah_storage       empties it, unmounts what stays mounted below $buildah_dir, and removes that.
#   clean_up                     for `trap clean_up EXIT`: stops the throwaway containerd and removes its directory,
#                                removes the working containers a failed build leaves behind, and $work.
#   debs_into DIR PACKAGE...     unpacks Debian packages, downloaded once into $work/deb and never installed, into DIR.
#   deb_version PACKAGE          prints the version of the package debs_into downloaded.
#   static_base DIR              writes into DIR the files of distroless static from the same Debian packages, and
#                                sets $static_base_packages to those packages with their versions.
#   static_config CONTAINER [OPTION...]   buildah config as distroless static's image (linux/amd64, WORKDIR /, its
#                                PATH and SSL_CERT_FILE), with the further OPTIONs.
#   from_tree DIR                prints a working container from scratch that holds DIR's files (left mounted).
#   in_image IMAGE UID:GID [VAR=value...] -- ARGV...   runs ARGV in the image's files: chroot, read-only, no network.
#   expect_config IMAGE TEMPLATE WANT    fails, saying so, unless buildah inspect's TEMPLATE of IMAGE is WANT.
#   export_archive IMAGE FILE [NAME...]  writes IMAGE as the docker-archive $cache/FILE.tar, named IMAGE and NAMEs.
#   have_containerd              fails, saying the import check is skipped, when containerd or ctr is missing.
#   start_containerd             sets $containerd_dir, $containerd_pid and $ctr_k8s (ctr against it, namespace
#                                k8s.io): a throwaway containerd, its root, state and sockets under /tmp.
#   import_index INDEX           imports each archive INDEX names (`name<TAB>archive` lines) into it, once, and fails
#                                unless it then lists every name.
#   stop_containerd              stops it (clean_up removes its directory).

me="$(basename "$0" .sh)"
containerd_dir=""
containerd_pid=""
ctr_k8s=()

read_action() {
    local skipped="$1"
    action="${2:-build}"
    case "$action" in
    build | check | clean) ;;
    *)
        echo "usage: $0 [build|check|clean]" >&2
        exit 2
        ;;
    esac
    if [[ $EUID -ne 0 ]]; then
        echo "$me: not root: the images are built with buildah and chroot as root; $skipped"
        exit 0
    fi
}

need_tools() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || {
            echo "$me: $tool is missing" >&2
            exit 2
        }
    done
}

need_go() {
    find_go
    if [[ -z "$go_bin" ]]; then
        echo "$me: no Go toolchain (go is not on PATH): $1 cannot be built" >&2
        exit 2
    fi
}

# --- The buildah storage -----------------------------------------------------------------------------------------
use_buildah_storage() {
    buildah_dir="$1"
    storage=(--root "$buildah_dir/storage" --runroot "$buildah_dir/run" --storage-driver "${STORAGE_DRIVER:-overlay}")
}
bah() { buildah "${storage[@]}" "$@"; }

empty_buildah_storage() {
    bah rm --all >/dev/null 2>&1 || true
    bah rmi --all --force >/dev/null 2>&1 || true
}

unmount_under() { # every mount below $1, deepest first
    awk -v dir="$1/" 'index($2, dir) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n 1 umount -l
}

remove_buildah_storage() {
    if [[ -d "$buildah_dir" ]]; then
        empty_buildah_storage
        unmount_under "$buildah_dir"
    fi
    rm -rf "$buildah_dir"
}

clean_up() {
    stop_containerd
    if [[ -n "$containerd_dir" ]]; then
        unmount_under "$containerd_dir"
        rm -rf "$containerd_dir"
    fi
    # A build that failed leaves its working containers (and their mounts) behind.
    bah rm --all >/dev/null 2>&1 || true
    rm -rf "$work"
}

# --- Building an image -------------------------------------------------------------------------------------------
debs_into() {
    local into="$1" package deb apt_options=(-o APT::Sandbox::User=root)
    shift
    mkdir -p "$work/deb"
    for package in "$@"; do
        if ! compgen -G "$work/deb/${package}_*.deb" >/dev/null; then
            if ! (cd "$work/deb" && apt-get download -q "${apt_options[@]}" "$package" >/dev/null 2>&1); then
                echo "$me: apt-get download $package failed; running apt-get update once and retrying" >&2
                apt-get update -q >/dev/null
                (cd "$work/deb" && apt-get download -q "${apt_options[@]}" "$package" >/dev/null)
            fi
        fi
        deb="$(compgen -G "$work/deb/${package}_*.deb" | head -n 1)"
        dpkg-deb -x "$deb" "$into"
    done
}

deb_version() {
    dpkg-deb -f "$(compgen -G "$work/deb/${1}_*.deb" | head -n 1)" Version
}

# What upstream's distroless static base (gcr.io/distroless/static-debian12) holds, from the same Debian packages:
# /etc/passwd and /etc/group with root, nobody and nonroot (65532), the CA bundle (ca-certificates), /etc/services
# and friends (netbase), /usr/share/zoneinfo (tzdata), /tmp (1777), /home/nonroot and /root.
static_base() {
    local root="$1" unpacked="$work/static-base-debs" cert package packages=(ca-certificates netbase tzdata)
    rm -rf "$unpacked"
    debs_into "$unpacked" "${packages[@]}"
    static_base_packages="$(for package in "${packages[@]}"; do echo "$package $(deb_version "$package")"; done \
        | paste -sd, | sed 's/,/, /g')"
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

static_config() {
    local container="$1"
    shift
    bah config --os linux --arch amd64 --workingdir / \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
        "$@" "$container"
}

from_tree() {
    local tree="$1" container mountpoint
    container="$(bah from scratch)"
    mountpoint="$(bah mount "$container")"
    tar -C "$tree" -cf - . | tar -C "$mountpoint" -xpf -
    echo "$container"
}

# Without an OCI runtime: chroot as UID:GID, with the image's environment plus the VAR=values, its root read-only
# (readOnlyRootFilesystem), in private mount and network namespaces (only a loopback, down). The working container
# is removed afterwards; the status is ARGV's.
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
        env -i "${env[@]}" "$(command -v chroot)" --userspec="$user" --groups="${user#*:}" "$root" "$@" || status=$?
    bah umount "$container" >/dev/null
    bah rm "$container" >/dev/null
    return "$status"
}

expect_config() {
    local image="$1" template="$2" want="$3" got
    got="$(bah inspect --type image --format "$template" "$image")"
    if [[ "$got" != "$want" ]]; then
        echo "$me: $image: $template is $got, not $want" >&2
        return 1
    fi
}

# buildah push writes one name, so the further names are added to the archive's manifest.json (and its legacy
# `repositories`). The archive is written in $work and moved into place.
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

# --- The import check: a throwaway containerd --------------------------------------------------------------------
have_containerd() {
    if ! command -v containerd >/dev/null || ! command -v ctr >/dev/null; then
        echo "$me: no containerd/ctr: the import check is skipped"
        return 1
    fi
}

start_containerd() {
    containerd_dir="$(mktemp -d "/tmp/$me-containerd.XXXXXX")"
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
    # Without the cache's lock (file descriptor 9, tests/cache_dir.sh): containerd must not hold it.
    containerd --config "$containerd_dir/config.toml" >"$containerd_dir/containerd.log" 2>&1 9>&- &
    containerd_pid=$!
    ctr_k8s=(ctr --address "$containerd_dir/containerd.sock" -n k8s.io)
    for _ in $(seq 50); do
        "${ctr_k8s[@]}" version >/dev/null 2>&1 && break
        sleep 0.2
    done
}

import_index() {
    local index="$1" name archive archives listed
    mapfile -t archives < <(cut -f2 "$index" | sort -u)
    for archive in "${archives[@]}"; do
        "${ctr_k8s[@]}" images import "$archive" >/dev/null
    done
    listed="$("${ctr_k8s[@]}" images ls -q)"
    while IFS=$'\t' read -r name archive; do
        grep -qxF "$name" <<<"$listed" || {
            echo "$me: $archive imported, but containerd has no image $name (it has: $listed)" >&2
            return 1
        }
    done <"$index"
}

stop_containerd() {
    if [[ -n "$containerd_pid" ]]; then
        kill "$containerd_pid" 2>/dev/null || true
        wait "$containerd_pid" 2>/dev/null || true
        containerd_pid=""
    fi
}
