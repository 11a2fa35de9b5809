#!/usr/bin/env bash
# The Debian packages the one-node cluster (devtools/cluster) and its images (image/node-images.sh) need, installed
# when missing: containerd, runc and the CNI plugins run the pods; iptables and conntrack are kube-proxy's;
# buildah, debootstrap, busybox-static and libcap2-bin (setcap) build the images. Nothing is installed when all are there.
# Not root, or not Debian: it says the node tier cannot run here and exits 0 (tests/node skips then).
set -euo pipefail

packages=(containerd runc containernetworking-plugins iptables conntrack buildah debootstrap busybox-static iproute2
    util-linux libcap2-bin)
if [[ $EUID -ne 0 ]]; then
    echo "node: not root: the node tier (tests/node, make cluster) needs root and will be skipped"
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-query >/dev/null; then
    echo "node: no apt-get: install ${packages[*]} by hand; the node tier will be skipped"
    exit 0
fi
missing=()
for package in "${packages[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$package")
    fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "node: Debian packages present (${packages[*]})"
    exit 0
fi
echo "node: installing ${missing[*]}"
started=$SECONDS
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "node: installed ${missing[*]} in $((SECONDS - started)) s"
