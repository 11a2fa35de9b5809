# Sourced by the build scripts of the tools the tests use (tests/e2e/build.sh, tests/helm/build.sh): one cache
# directory per tool and version under ~/.cache/gpu-extender (or $GPU_EXTENDER_CACHE), one build at a time in
# it, and scratch space next to the outputs so the final moves are renames.
#
#   open_cache_dir NAME    sets $cache (created) and $work (a scratch directory removed on exit), and holds the
#                          cache directory's lock (file descriptor 9) until the script ends.
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
