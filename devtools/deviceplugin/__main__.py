"""`python -m devtools.deviceplugin`: run one device-plugin double on this host, for the node's kubelet to call.

    python -m devtools.deviceplugin --protocol gpushare|hami --node NAME --kubeconfig FILE --gpus FILE.yaml
        [--socket-dir DIR] [--record FILE.jsonl] [--refuse POD]... [--strict]

It runs as a root process beside kubelet (not in a pod), logs one line per event to stderr, and stops on SIGTERM or
SIGINT, removing its socket (exit 0); it exits 2 when gpushare's plugin would (its start failed: kubelet not there),
and 1 for a bad command line, GPUs file or kubeconfig. It never imports `extender`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from devtools.deviceplugin.gpus import GpuFileError, load_gpus
from devtools.deviceplugin.gpushare import GpushareDouble
from devtools.deviceplugin.hami import HamiDouble
from devtools.deviceplugin.kube import KubeApi, load_kubeconfig
from devtools.deviceplugin.kubeletapi import DEFAULT_SOCKET_DIR, ApiUnavailable, messages
from devtools.deviceplugin.record import Recorder
from devtools.deviceplugin.runner import NodeDouble, Runner

log = logging.getLogger("devtools.deviceplugin")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devtools.deviceplugin", description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", choices=("gpushare", "hami"), required=True)
    parser.add_argument("--node", required=True, help="the Node this host is")
    parser.add_argument("--kubeconfig", type=Path, required=True, help="token (or client cert) and CA of the API")
    parser.add_argument("--gpus", type=Path, required=True, help="the GPUs file (devtools/deviceplugin/gpus-*.yaml)")
    parser.add_argument("--socket-dir", type=Path, default=DEFAULT_SOCKET_DIR, help="kubelet's device-plugin dir")
    parser.add_argument("--record", type=Path, help="append one JSON line per Allocate to this file")
    parser.add_argument("--refuse", action="append", default=[], metavar="POD", help="fail this pod's Allocate")
    parser.add_argument(
        "--strict", action="store_true", help="hami: refuse entries naming GPUs or amounts the node has not"
    )
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    gpus = load_gpus(args.gpus)
    config = load_kubeconfig(args.kubeconfig)
    recorder = Recorder(args.record)
    messages()  # compile kubelet's API now, so a missing proto is said before anything is served
    try:
        async with KubeApi.session(config) as api:
            refuse = frozenset(args.refuse)
            double: NodeDouble
            if args.protocol == "gpushare":
                double = GpushareDouble(api, args.node, gpus, recorder, refuse)
            else:
                double = HamiDouble(api, args.node, gpus, recorder, refuse, strict=args.strict)
            runner = Runner(double, args.socket_dir)
            runner.handle_signals()
            log.info("%s double for node %s: %d GPUs from %s", args.protocol, args.node, len(gpus.gpus), args.gpus)
            return await runner.run()
    finally:
        recorder.close()


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        return asyncio.run(serve(args))
    except (GpuFileError, ApiUnavailable, OSError, ValueError, KeyError) as error:
        log.error("%s", error)
        return 1


if __name__ == "__main__":
    sys.exit(main())
