#!/usr/bin/env bash
# cert-manager for the one-node cluster (devtools/cluster), which reaches no container registry: its controller,
# webhook, cainjector and ctl (the chart's startupapicheck job) built from cert-manager's own Go module at a pinned
# release, as images laid out as upstream's, written as docker-archives that `ctr -n k8s.io images import FILE`
# takes with their names (containerd 1.6); and its install manifest rendered from its own Helm chart.
#
#   image/cert-manager.sh          build what is missing or out of date (as root), check it, write the index
#   image/cert-manager.sh check    also import every archive into a throwaway containerd when nothing was rebuilt
#   image/cert-manager.sh clean    remove the archives, the manifest, the index and the buildah storage used
#
# Why v1.11.5, the last release of the v1.11 line: it is the newest release whose commands the Go module proxy can
# serve. From v1.12 on, each command (cmd/controller, cmd/webhook, cmd/cainjector, cmd/acmesolver,
# cmd/startupapicheck) is a module of its own named github.com/cert-manager/cert-manager/<name>-binary while it
# lives in cmd/<name>/: a module path that names no directory of the repository, so the proxy answers 404 for it at
# every version (and the root module's zip leaves nested modules out: no cmd/ in it). v1.11.5's root module still
# holds cmd/, so its commands build from the proxy alone. Upstream supports v1.11 on Kubernetes 1.21 to 1.26; it
# uses only API versions that v1.34 still serves (apiextensions, admissionregistration, coordination,
# certificates.k8s.io v1), and the chart's PodSecurityPolicies stay off (the default).
#
# How: a throwaway module in the scratch directory requires github.com/cert-manager/cert-manager at the version
# and copies its go.mod's replace directives (a replace in the root go.mod is what stops `go install pkg@version`);
# the build list is then checked to be the one cert-manager's go.mod requires. CGO_ENABLED=0, -trimpath and the
# link flags of cert-manager's Makefile (read from the module: AppVersion, AppGitCommit), as `make server-binaries`
# builds them. The images follow hack/containers/Containerfile.<name>: upstream's base is distroless static, here
# the same files from Debian's ca-certificates, netbase and tzdata packages (one base layer), then
# /app/cmd/<name>/<name>, /licenses/LICENSE and /licenses/LICENSES, USER 1000, ENTRYPOINT the binary. The chart
# is assembled as make/manifests.mk does (Chart.yaml from Chart.template.yaml, templates/crds.yaml from deploy/crds
# under `installCRDs`) and rendered with the helm of tests/helm/build.sh as cert-manager's docs install v1.11
# (release cert-manager, namespace cert-manager, installCRDs=true), the Namespace first as in upstream's static
# manifest, every image pinned to the tags built here with imagePullPolicy IfNotPresent. The chart's defaults are
# kept otherwise (webhook on port 10250 behind its Service, which the API server reaches through kube-proxy).
# acmesolver is not built: the controller only starts it for ACME HTTP-01 challenges, which need the Internet.
#
# Output, under ${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/node-images/:
#   cert-manager/<name>.tar        docker-archives (controller, webhook, cainjector, ctl)
#   cert-manager/cert-manager.yaml the rendered manifest: `kubectl apply -f` it
#   index-cert-manager             one `name<TAB>archive` line per image, as node-images.sh's `index`
# The buildah storage (--root/--runroot, never the host's default) is cert-manager/buildah/.
#
# Idempotent: everything is rebuilt when this script (or the helm version tests/helm/build.sh pins) changes, as a
# stamp file records, and only then; the Go build cache makes a rebuild quick. Each binary is run with --help in
# its image (chroot as uid 1000, read-only root, no network), and after a build every archive is imported into a
# throwaway containerd (its own root, state and socket under /tmp, stopped at the end) to check its names.
#
# Needs root (buildah, chroot, mounts), buildah, Go, apt-get and dpkg-deb, and, for the import check, containerd
# and ctr. Not root: it says so and exits 0. Settings (environment): GPU_EXTENDER_CACHE (the cache root),
# STORAGE_DRIVER (overlay; vfs where overlay fails).
#
# The building blocks (the buildah storage, the distroless-like base, running an image, writing an archive, the
# import check) are image/lib.sh's, shared with image/node-images.sh; the stamp covers that file too.
set -euo pipefail

# The pin: the release, and the commit its tag names (the Makefile's GITCOMMIT is `git rev-parse HEAD`).
version=v1.11.5
commit=b1d501c85d97afd2adde2e86c2b119ac060caece
module_path=github.com/cert-manager/cert-manager
# The images the chart names (values.yaml: image, webhook.image, cainjector.image, startupapicheck.image), by the
# command each runs.
declare -A repositories=(
    [controller]=quay.io/jetstack/cert-manager-controller
    [webhook]=quay.io/jetstack/cert-manager-webhook
    [cainjector]=quay.io/jetstack/cert-manager-cainjector
    [ctl]=quay.io/jetstack/cert-manager-ctl
)
commands=(controller webhook cainjector ctl)

repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=../tests/cache_dir.sh
source "$repo/tests/cache_dir.sh"
# shellcheck source=lib.sh
source "$repo/image/lib.sh"

read_action "nothing is built" "$@"

node_images="${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/node-images"
open_cache_dir node-images/cert-manager
index="$node_images/index-cert-manager"
manifest="$cache/cert-manager.yaml"
use_buildah_storage "$cache/buildah"

if [[ "$action" == clean ]]; then
    remove_buildah_storage
    rm -rf "$cache" "$index"
    echo "cert-manager: removed $cache and $index"
    exit 0
fi

need_tools buildah apt-get dpkg-deb unshare chroot
need_go cert-manager
trap clean_up EXIT

helm_version="$(sed -n 's/^version=//p' "$repo/tests/helm/build.sh")"
helm="${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/helm-$helm_version/helm"
stamp="$cache/cert-manager.stamp"
stamp_value="$({ cat "${BASH_SOURCE[0]}" "$repo/image/lib.sh"; echo "helm $helm_version"; } | sha256sum | cut -d' ' -f1)"
k8s_version="$(grep -oE 'k8s\.io/kubernetes v[0-9]+\.[0-9]+\.[0-9]+' "$repo/tests/e2e/k8s/go.mod" | head -n 1 | cut -d' ' -f2)"
image_of() { echo "${repositories[$1]}:$version"; }

# --- The commands ------------------------------------------------------------------------------------------------
build_binaries() {
    local started=$SECONDS module dir go_mod ldflags flag packages=() command listed wanted
    module="$work/module"
    mkdir -p "$module"
    (cd "$module" && "$go_bin" mod download -json "$module_path@$version") >"$work/download.json"
    dir="$(sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p' "$work/download.json")"
    go_mod="$(sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p' "$work/download.json")"
    if [[ ! -d "$dir/cmd/controller" ]]; then
        echo "cert-manager: $module_path@$version has no cmd/controller ($dir)" >&2
        return 1
    fi
    source_dir="$dir"
    # The throwaway module: cert-manager's Go version and replace directives (one-line or in a block).
    {
        echo "module cert-manager-build"
        echo
        grep -E '^go [0-9.]+$' "$go_mod"
        echo
        echo "require $module_path $version"
        echo
        awk '/^replace \($/ {block = 1} block {print} block && /^\)$/ {block = 0; next} /^replace [^(]/ {print}' "$go_mod"
    } >"$module/go.mod"
    for command in "${commands[@]}"; do
        packages+=("$module_path/cmd/$command")
    done
    (cd "$module" && GOFLAGS=-mod=mod "$go_bin" get "${packages[@]/%/@$version}" >"$work/go-get.log" 2>&1) || {
        tail -n 20 "$work/go-get.log" >&2
        return 1
    }
    # The build list must be what cert-manager's go.mod requires: the throwaway module changed no version.
    listed="$(cd "$module" && "$go_bin" list -m -f '{{.Path}} {{.Version}}' all | tail -n +2 | sort)"
    wanted="$(awk '/^require \($/ {block = 1; next} block && /^\)$/ {block = 0} block && NF >= 2 {print $1, $2}
        /^require [^(]/ {print $2, $3}' "$go_mod" | sort)"
    if [[ -n "$(comm -23 <(echo "$wanted") <(echo "$listed"))" ]]; then
        echo "cert-manager: the build list differs from $module_path@$version's go.mod:" >&2
        comm -23 <(echo "$wanted") <(echo "$listed") | head -n 20 >&2
        return 1
    fi
    # The Makefile's GOLDFLAGS: -w -s and one -X per variable, $(RELEASE_VERSION) and $(GITCOMMIT) filled in.
    ldflags="$(sed -n '/^GOLDFLAGS :=/,/[^\\]$/p' "$dir/Makefile" | tr -d '\\\n' | sed 's/^GOLDFLAGS :=//; s/\s\+/ /g')"
    ldflags="${ldflags//\$(RELEASE_VERSION)/$version}"
    ldflags="${ldflags//\$(GITCOMMIT)/$commit}"
    for flag in "-w -s" "util.AppVersion=$version" "util.AppGitCommit=$commit"; do
        if [[ "$ldflags" != *"$flag"* || "$ldflags" == *'$('* ]]; then
            echo "cert-manager: unexpected GOLDFLAGS in $dir/Makefile: $ldflags" >&2
            return 1
        fi
    done
    grep -qE '^GOFLAGS := -trimpath$' "$dir/Makefile"
    grep -qE '^CGO_ENABLED \?= 0$' "$dir/Makefile"
    echo "cert-manager: building ${commands[*]} $version with $("$go_bin" env GOVERSION)" \
        "(cold, module downloads included: about 5 minutes on 2 cores; the Go build cache makes later builds quick)"
    (cd "$module" && CGO_ENABLED=0 "$go_bin" build -mod=readonly -buildvcs=false -trimpath -ldflags "$ldflags" \
        -o "$work/bin/" "${packages[@]}")
    # -trimpath leaves the link flags out of the build information: look for the commit in the binaries instead.
    for command in "${commands[@]}"; do
        grep -qaF "$commit" "$work/bin/$command" || {
            echo "cert-manager: $command was not linked with AppGitCommit=$commit" >&2
            return 1
        }
    done
    echo "cert-manager: built ${commands[*]} in $((SECONDS - started)) s"
}

# --- The images --------------------------------------------------------------------------------------------------
# What distroless static (upstream's base, make/base_images.mk) holds, from the same Debian packages: /etc/passwd
# and /etc/group with root, nobody and nonroot (65532), the CA bundle and SSL_CERT_FILE, /etc/services and friends,
# /usr/share/zoneinfo, /tmp (1777), /home/nonroot and /root. Committed once, the layer every image starts from.
base_image="localhost/cert-manager-static-base:$version"
build_base() {
    local container
    static_base "$work/base"
    container="$(from_tree "$work/base")"
    static_config "$container" \
        --label "org.opencontainers.image.description=distroless static's files from Debian ($static_base_packages)"
    bah commit --quiet --rm "$container" "$base_image" >/dev/null
}

# Run image $1's entrypoint with the arguments after it, as the image's user 1000 (in_image).
run_image() {
    local image="$1" entrypoint=()
    shift
    mapfile -t entrypoint < <(bah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' \
        "$image" | sed '/^$/d')
    in_image "$image" 1000:1000 -- "${entrypoint[@]}" "$@"
}

# hack/containers/Containerfile.<command>: FROM the base, USER 1000, the binary at /app/cmd/<command>/<command>,
# LICENSE and LICENSES under /licenses, ENTRYPOINT the binary; written as the docker-archive <command>.tar.
build_image() {
    local command="$1" image started=$SECONDS container mountpoint
    image="$(image_of "$command")"
    container="$(bah from --pull=never --quiet "$base_image")"
    mountpoint="$(bah mount "$container")"
    install -D -m 755 "$work/bin/$command" "$mountpoint/app/cmd/$command/$command"
    install -D -m 644 "$source_dir/LICENSE" "$mountpoint/licenses/LICENSE"
    install -D -m 644 "$source_dir/LICENSES" "$mountpoint/licenses/LICENSES"
    bah umount "$container" >/dev/null
    bah config --user 1000 --entrypoint "[\"/app/cmd/$command/$command\"]" \
        --label "org.opencontainers.image.source=https://github.com/cert-manager/cert-manager/tree/$version/cmd/$command" \
        --label "org.opencontainers.image.revision=$commit" \
        --label "org.opencontainers.image.version=$version" \
        --label "org.opencontainers.image.description=cert-manager $command $version from $module_path@$version, built by gpu-extender's image/cert-manager.sh" \
        "$container"
    bah commit --quiet --rm "$container" "$image" >/dev/null
    expect_config "$image" '{{.OCIv1.Config.User}}' 1000
    expect_config "$image" '{{.OCIv1.Config.Entrypoint}}' "[/app/cmd/$command/$command]"
    # Each command answers as itself from inside its image: --help (exit 0), and the version where it prints one.
    case "$command" in
    ctl) run_image "$image" version --client >"$work/$command.out" 2>&1 ;;
    *) run_image "$image" --help >"$work/$command.out" 2>&1 ;;
    esac || {
        cat "$work/$command.out" >&2
        return 1
    }
    case "$command" in
    controller) grep -qF "(default \"quay.io/jetstack/cert-manager-acmesolver:$version\")" "$work/$command.out" ;;
    webhook) grep -qF "($version) ($commit)" "$work/$command.out" ;;
    cainjector) grep -q '^cert-manager CA injector is a Kubernetes addon' "$work/$command.out" ;;
    ctl) grep -qF "GitVersion:\"$version\", GitCommit:\"$commit\"" "$work/$command.out" ;;
    esac || {
        echo "cert-manager: $image's $command did not answer as cert-manager $version:" >&2
        cat "$work/$command.out" >&2
        return 1
    }
    export_archive "$image" "$command"
    echo "cert-manager: $image -> $cache/$command.tar ($(du -h "$cache/$command.tar" | cut -f1)) in" \
        "$((SECONDS - started)) s"
}

# --- The manifest ------------------------------------------------------------------------------------------------
render_manifest() {
    local started=$SECONDS chart="$work/chart/cert-manager" crd images wrong
    echo "cert-manager: helm $helm_version (tests/helm/build.sh)"
    bash "$repo/tests/helm/build.sh" 9>&- | sed 's/^/  /'
    # make/manifests.mk's chart: the templates and values as they are, Chart.yaml with the release's version,
    # templates/crds.yaml the CRDs of deploy/crds between `{{- if .Values.installCRDs }}` and `{{- end }}`.
    mkdir -p "$chart/templates"
    cp "$source_dir"/deploy/charts/cert-manager/templates/* "$chart/templates/"
    cp "$source_dir/deploy/charts/cert-manager/values.yaml" "$chart/values.yaml"
    sed -e "s/^version: .*/version: $version/" -e "s/^appVersion: .*/appVersion: $version/" \
        -e 's/"{{IS_PRERELEASE}}"/"false"/' "$source_dir/deploy/charts/cert-manager/Chart.template.yaml" >"$chart/Chart.yaml"
    {
        echo '{{- if .Values.installCRDs }}'
        bash "$source_dir/hack/concat-yaml.sh" "$source_dir"/deploy/crds/*.yaml
        echo '{{- end }}'
    } >"$chart/templates/crds.yaml"
    chmod -R u+w "$work/chart"
    # As `helm install cert-manager jetstack/cert-manager --namespace cert-manager --create-namespace
    # --version v1.11.5 --set installCRDs=true`, against the cluster's Kubernetes version; the Namespace first.
    {
        cat "$source_dir/deploy/manifests/namespace.yaml"
        "$helm" template cert-manager "$chart" --namespace cert-manager --kube-version "$k8s_version" \
            --set installCRDs=true \
            --set image.tag="$version" --set image.pullPolicy=IfNotPresent \
            --set webhook.image.tag="$version" --set webhook.image.pullPolicy=IfNotPresent \
            --set cainjector.image.tag="$version" --set cainjector.image.pullPolicy=IfNotPresent \
            --set startupapicheck.image.tag="$version" --set startupapicheck.image.pullPolicy=IfNotPresent \
            --set acmesolver.image.tag="$version"
    } >"$work/cert-manager.yaml"
    # Every container runs an image built here, IfNotPresent; the six CRDs are in it.
    images="$(sed -n 's/^ *image: "\?\([^"]*\)"\? *$/\1/p' "$work/cert-manager.yaml" | sort -u)"
    wrong="$(comm -23 <(echo "$images") <(for command in "${commands[@]}"; do image_of "$command"; done | sort))"
    if [[ -n "$wrong" || "$(echo "$images" | wc -l)" -ne ${#commands[@]} ]]; then
        echo "cert-manager: the manifest's images are not the ones built here: $images" >&2
        return 1
    fi
    if grep -E '^ *imagePullPolicy:' "$work/cert-manager.yaml" | grep -vq 'IfNotPresent$'; then
        echo "cert-manager: an imagePullPolicy other than IfNotPresent in the manifest" >&2
        return 1
    fi
    crd="$(grep -c '^kind: CustomResourceDefinition$' "$work/cert-manager.yaml")"
    if [[ "$crd" -ne "$(compgen -G "$source_dir/deploy/crds/*.yaml" | wc -l)" ]]; then
        echo "cert-manager: $crd CustomResourceDefinitions in the manifest" >&2
        return 1
    fi
    mv -f "$work/cert-manager.yaml" "$manifest"
    echo "cert-manager: rendered $manifest ($(grep -c '^kind:' "$manifest") objects) in $((SECONDS - started)) s"
}

# --- Import every archive into a throwaway containerd: the names must be there as the index says --------------------
check_imports() {
    local started=$SECONDS
    have_containerd || return 0
    start_containerd
    import_index "$index"
    stop_containerd
    echo "cert-manager: containerd $(containerd --version | cut -d' ' -f3) imported all $(wc -l <"$index") images" \
        "with their names in $((SECONDS - started)) s"
}

summary() {
    local command
    echo "cert-manager: $version; index $index, manifest $manifest:"
    for command in "${commands[@]}"; do
        printf '  %-50s %6s  %s\n' "$(image_of "$command")" "$(du -h "$cache/$command.tar" | cut -f1)" "$cache/$command.tar"
    done
}

# --- Build when the stamp says so ----------------------------------------------------------------------------------
up_to_date=1
for file in "${commands[@]/%/.tar}" cert-manager.yaml cert-manager.stamp; do
    [[ -f "$cache/$file" ]] || up_to_date=0
done
if [[ $up_to_date == 1 && -f "$index" && "$(cat "$stamp")" == "$stamp_value" ]]; then
    echo "cert-manager: $version is up to date in $cache ($SECONDS s)"
    if [[ "$action" == check ]]; then
        check_imports
    fi
    summary
    exit 0
fi

rm -f "$stamp" "$index"
build_binaries
started=$SECONDS
# Everything is rebuilt: start from empty storage, so no untagged image of an earlier build stays behind.
empty_buildah_storage
build_base
echo "cert-manager: base layer (Debian's ca-certificates, netbase, tzdata) in $((SECONDS - started)) s"
for command in "${commands[@]}"; do
    build_image "$command"
done
for command in "${commands[@]}"; do
    printf '%s\t%s\n' "$(image_of "$command")" "$cache/$command.tar"
done >"$index.tmp"
mv -f "$index.tmp" "$index"
render_manifest
check_imports
echo "$stamp_value" >"$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
echo "cert-manager: done in $SECONDS s"
summary
