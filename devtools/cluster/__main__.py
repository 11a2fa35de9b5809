"""`python -m devtools.cluster up|down|status|scheduler|device-plugin`: the one-node cluster of `make cluster`.

    up [--protocol gpushare|hami|none] [--gpus FILE]   bring it up; prints the kubeconfig to use
    down                                               remove it whole (containers, daemons, mounts, network, files)
    status                                             each daemon, and the Node
    scheduler [--config FILE]                          restart the default scheduler (with a KubeSchedulerConfiguration)
    device-plugin --protocol P [--gpus FILE]           replace the device-plugin double
    kubelet-restart                                    restart kubelet, as `systemctl restart kubelet` would
    images                                             import the images again (after `make node-build` rebuilt
                                                       one: a pod started after it gets the new one)

Errors (something missing, a part that does not come up) are printed as one message, with the log's tail, and exit 1.
Every command but `status` holds the cluster's lock (processes.cluster_lock): it waits for a test session or a
bench using the cluster to end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devtools.cluster.layout import Paths
from devtools.cluster.processes import ClusterError, cluster_lock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cluster", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="bring the cluster up")
    up.add_argument("--protocol", choices=("gpushare", "hami", "none"), default="gpushare")
    up.add_argument("--gpus", type=Path, help="the device-plugin double's GPUs (YAML); its default file if not given")
    commands.add_parser("down", help="remove the cluster whole")
    commands.add_parser("status", help="each daemon, and the Node")
    scheduler = commands.add_parser("scheduler", help="restart the default scheduler")
    scheduler.add_argument("--config", type=Path, help="a KubeSchedulerConfiguration (its clientConnection is set)")
    plugin = commands.add_parser("device-plugin", help="replace the device-plugin double")
    plugin.add_argument("--protocol", choices=("gpushare", "hami"), required=True)
    plugin.add_argument("--gpus", type=Path)
    commands.add_parser("kubelet-restart", help="restart kubelet")
    commands.add_parser("images", help="import the images again")
    options = parser.parse_args(argv)
    paths = Paths()
    # Imported here: `down` and `status` need none of what `up` imports (trustme, cryptography).
    from devtools.cluster import node

    try:
        if options.command == "status":
            lines = node.status(paths)
            print("\n".join(lines) if lines else "cluster: not up")
            return 0 if node.is_up(paths) else 1
        # Every other command changes the cluster: it waits for a test session or a bench using it to end.
        with cluster_lock():
            _change(options, paths)
    except ClusterError as error:
        print(f"cluster: {error}", file=sys.stderr)
        return 1
    return 0


def _change(options: argparse.Namespace, paths: Paths) -> None:
    """The commands that change the cluster, run while holding its lock."""
    from devtools.cluster import addons, node

    if options.command == "up":
        if node.is_up(paths):
            print(f"cluster: already up ({paths.state}); `make cluster-down` removes it")
        else:
            took = node.up(paths, None if options.protocol == "none" else options.protocol, options.gpus)
            print(f"cluster: up in {took:.0f} s")
        print("\n".join(node.status(paths)))
        print(f"\nexport KUBECONFIG={paths.kubeconfig('admin')}\nexport PATH={paths.binaries}:$PATH   # kubectl")
    elif options.command == "down":
        node.down(paths)
        print("cluster: removed (containers, daemons, mounts, cgroups, network namespace, files)")
    elif options.command == "scheduler":
        node.start_scheduler(paths, options.config)
    elif options.command == "device-plugin":
        addons.start_device_plugin(paths, options.protocol, options.gpus)
    elif options.command == "kubelet-restart":
        node.start_kubelet(paths)
    elif options.command == "images":
        addons.import_images(paths)


if __name__ == "__main__":
    sys.exit(main())
