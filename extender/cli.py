"""The `extender` command: serve | demo | inspect | scheduler-config.

Flags of `serve` (and of `scheduler-config`, which renders from the same settings) are generated from the
`Settings` fields, so a new setting is a flag and an `EXTENDER_*` variable at once. Errors a user can fix
(bad flag values, unreadable files, an unreachable server) print one line and exit 2; nothing prints a
stack trace for them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from extender import settings as settings_module
from extender.settings import LogFormat, Settings, SettingsError

log = logging.getLogger("extender")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, form: LogFormat) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if form is LogFormat.JSON:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    try:
        root.setLevel(level.upper())
    except ValueError:
        raise SettingsError(f"log level {level!r} is not one of DEBUG, INFO, WARNING, ERROR") from None


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="", help="YAML or JSON file of settings (env: EXTENDER_CONFIG).")
    for field in settings_module.fields():
        help_text = f"{field.metadata['help']} (env: {settings_module.env_name(field)}; default: {field.default})"
        if isinstance(field.default, bool):
            parser.add_argument(
                settings_module.flag(field),
                dest=field.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(settings_module.flag(field), dest=field.name, default=None, help=help_text)


def _settings(arguments: argparse.Namespace, check: bool = True) -> Settings:
    given = {field.name: getattr(arguments, field.name, None) for field in settings_module.fields()}
    return settings_module.load(given, config=arguments.config, check=check)


def _serve(arguments: argparse.Namespace) -> int:
    from extender.app import event_loop_factory, file_service, serve, serve_live, ssl_context
    from extender.sources.kube.config import ConfigError, load_config

    current = _settings(arguments)
    setup_logging(current.log_level, current.log_format)
    context = ssl_context(current)  # before loading anything: a bad certificate fails at once
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        if current.cluster:
            service, _ = file_service(current, current.cluster)
            runner.run(serve(service, current, context))
        else:
            try:
                config = load_config(current.kubeconfig, current.kube_context)
            except ConfigError as error:
                raise SettingsError(f"{error} (or give --cluster FILE to serve from a file)") from None
            runner.run(serve_live(current, context, config))
    return 0


def _scheduler_config(arguments: argparse.Namespace) -> int:
    from extender.schedconfig import render

    current = _settings(arguments, check=False)
    sys.stdout.write(render(current, arguments.k8s_version))
    return 0


def _demo(arguments: argparse.Namespace) -> int:
    from extender.demo import run_demo

    return run_demo(pods=arguments.pods, seed=arguments.seed, cluster_file=arguments.cluster or None)


def _inspect(arguments: argparse.Namespace) -> int:
    from extender.inspection import fetch_and_render

    sys.stdout.write(
        fetch_and_render(
            arguments.url,
            arguments.node,
            ca=arguments.ca,
            cert=arguments.cert,
            key=arguments.key,
            insecure=arguments.insecure,
            as_json=arguments.json,
        )
    )
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="extender", description="GPU-sharing Kubernetes scheduler extender.")
    commands = top.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve the extender API.")
    _add_settings_flags(serve)
    serve.set_defaults(run=_serve)

    config = commands.add_parser(
        "scheduler-config",
        help="Print the kube-scheduler configuration that calls this extender.",
        description="KubeSchedulerConfiguration (v1 from 1.25, v1beta3 for 1.23-1.24) or, below 1.23, a Policy file.",
    )
    config.add_argument("--k8s-version", required=True, help="Kubernetes minor version of the scheduler, e.g. 1.31.")
    _add_settings_flags(config)
    config.set_defaults(run=_scheduler_config)

    demo = commands.add_parser("demo", help="Place a burst of GPU pods on a bundled demo cluster, over HTTPS.")
    demo.add_argument("--pods", type=int, default=100, help="How many pods in the burst.")
    demo.add_argument("--seed", type=int, default=7, help="Seed of the burst's pod sizes.")
    demo.add_argument("--cluster", default="", help="Cluster file to use instead of the bundled one.")
    demo.set_defaults(run=_demo)

    inspect = commands.add_parser("inspect", help="Show nodes, GPUs, pods and reservations of a running extender.")
    inspect.add_argument("node", nargs="?", default="", help="Only this node.")
    inspect.add_argument("--url", default="https://127.0.0.1:8443", help="The extender's base URL.")
    inspect.add_argument("--ca", default="", help="CA bundle to verify the extender's certificate.")
    inspect.add_argument("--cert", default="", help="Client certificate, when the extender requires mTLS.")
    inspect.add_argument("--key", default="", help="Key of --cert.")
    inspect.add_argument("--insecure", action="store_true", help="Do not verify the extender's certificate.")
    inspect.add_argument("--json", action="store_true", help="Print the raw JSON.")
    inspect.set_defaults(run=_inspect)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    try:
        return int(arguments.run(arguments))
    except KeyboardInterrupt:
        return 130
    except (SettingsError, OSError, ValueError) as error:
        print(f"extender {arguments.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
