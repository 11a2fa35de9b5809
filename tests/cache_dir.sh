# Sourced by the build scripts of the Go tools the tests and benches use (tests/e2e/build.sh, tests/helm/build.sh,
# bench/floor/build.sh): one cache directory per tool and version under ~/.cache/gpu-extender (or
# $GPU_EXTENDER_CACHE), one build at a time in it, and scratch space next to the outputs so the final moves are
# renames.
#
#   find_go                sets $go_bin to the Go toolchain (on PATH, else /usr/local/go/bin/go), or to "" when
#                          there is none: each script says itself what goes without it.
#   open_cache_dir NAME    sets $cache (created) and $work (a scratch directory removed on exit), and holds the
#                          cache directory's lock (file descriptor 9) until the script ends.
find_go() {
    go_bin="$(command -v go || true)"
    if [[ -z "$go_bin" && -x /usr/local/go/bin/go ]]; then
        go_bin=/usr/local/go/bin/go
    fi
}

open_cache_dir() {
    cache="${GPU_EXTENDER_CACHE:-$HOME/.cache/gpu-extender}/$1"
    mkdir -p "$cache"
    exec 9>"$cache/.lock"
    if command -v flock >/dev/null; then
        flock 9
    fi
    work="$(mktemp -d "$cache/.work.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
}
