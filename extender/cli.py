"""The `extender` command: serve | demo | inspect | scheduler-config | certs.

Flags of `serve` (and of `scheduler-config`, which renders from the same settings) are generated from the
`Settings` fields, so a new setting is a flag and an `EXTENDER_*` variable at once. Errors a user can fix
(bad flag values, unreadable files, an unreachable server) print one line and exit 2; nothing prints a
stack trace for them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extender import settings as settings_module
from extender.core.errors import UserError
from extender.settings import LogFormat, Settings
from extender.settings_values import SettingsError

log = logging.getLogger("extender")

DEFAULT_CERTS_DIR = "gpu-extender-certs"
DEFAULT_NAMESPACE = "gpu-extender"


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
        help_text = help_text.replace("%", "%%")  # argparse formats help with %: "30 % compute" is text
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
    from extender.app import event_loop_factory, file_service, keep_collections_short, serve, serve_live, server_tls
    from extender.sources.kube.config import ConfigError, load_config

    current = _settings(arguments)
    setup_logging(current.log_level, current.log_format)
    keep_collections_short()
    tls = server_tls(current)  # before loading anything: a bad certificate fails at once
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        if current.cluster:
            service = file_service(current, current.cluster)
            runner.run(serve(service, current, tls))
        else:
            try:
                config = load_config(current.kubeconfig, current.kube_context)
            except ConfigError as error:
                raise SettingsError(f"{error} (or give --cluster FILE to serve from a file)") from None
            runner.run(serve_live(current, tls, config))
    return 0


def _scheduler_config(arguments: argparse.Namespace) -> int:
    from extender.tools.schedconfig import Wiring, render

    current = _settings(arguments, check=False)
    sys.stdout.write(render(current, arguments.k8s_version, Wiring(arguments.wiring)))
    return 0


_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_NAME = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*", re.IGNORECASE)
_NAMESPACE = re.compile(_LABEL)
MAX_DAYS = 36500


def _certs_request(arguments: argparse.Namespace) -> tuple[list[str], list[str], datetime.timedelta]:
    """The DNS names, IP addresses and validity asked for, checked; a ValueError names the bad flag."""
    from extender.tools.certs import service_dns_names

    if not (_NAMESPACE.fullmatch(arguments.namespace) and len(arguments.namespace) <= 63):
        raise UserError(f"--namespace {arguments.namespace!r}: not a Kubernetes namespace name")
    names = list(dict.fromkeys([*service_dns_names(arguments.namespace), *arguments.dns_name]))
    for name in names:
        if not (_DNS_NAME.fullmatch(name) and len(name) <= 253):
            raise UserError(f"--dns-name {name!r}: not a DNS name")
    for ip in arguments.ip:
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            raise UserError(f"--ip {ip!r}: not an IPv4 or IPv6 address") from None
    try:
        days = int(arguments.days)
    except ValueError:
        raise UserError(f"--days {arguments.days!r}: not a whole number") from None
    if not 0 < days <= MAX_DAYS:
        raise UserError(f"--days {days}: must be between 1 and {MAX_DAYS}")
    if not 0 < len(arguments.client_name.strip()) <= 64:
        raise UserError(f"--client-name {arguments.client_name!r}: must be 1 to 64 characters (an X.509 CN)")
    # 127.0.0.1 always, as the cert-manager Certificate of manifests/ has it: `extender inspect` through
    # `kubectl port-forward` (docs/install/check.md) verifies the extender by that address.
    return names, list(dict.fromkeys(["127.0.0.1", *arguments.ip])), datetime.timedelta(days=days)


def _certs(arguments: argparse.Namespace) -> int:
    from extender.tools.certs import issue_certificates, load_ca, secrets_yaml, write_certificates

    names, ips, valid_for = _certs_request(arguments)
    if bool(arguments.ca_cert) != bool(arguments.ca_key):
        raise UserError("--ca-cert and --ca-key go together")
    if arguments.secrets and (arguments.out is not None or arguments.keep_ca_key or arguments.force):
        raise UserError("--secrets prints to stdout: drop --out, --keep-ca-key and --force")
    ca = load_ca(arguments.ca_cert, arguments.ca_key) if arguments.ca_cert else None
    if arguments.secrets:
        issued = issue_certificates(names, ips, arguments.client_name, valid_for, ca)
        sys.stdout.write(secrets_yaml(issued, arguments.namespace))
        return 0
    out = Path(arguments.out or DEFAULT_CERTS_DIR)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: not a directory")
    try:
        files = write_certificates(
            out, names, ips, arguments.client_name, valid_for, arguments.keep_ca_key, ca, replace=arguments.force
        )
    except FileExistsError as error:
        raise UserError(f"{error.filename} already exists: --force replaces it, or choose another --out") from None
    except OSError as error:
        raise UserError(f"cannot write certificates to {out}: {error.strerror}") from None
    server = ", ".join([*names, *ips])
    print(f"wrote to {out}, valid for {valid_for.days} days:")
    print(f"  {files.ca_certificate.name:<10}  the CA: the extender's --client-ca, the scheduler's tlsConfig.caFile")
    print(f"  {files.server_certificate.name:<10}  serving certificate for {server}: --tls-cert")
    print(f"  {files.server_key.name:<10}  its key (0600): --tls-key")
    print(f"  {files.client_certificate.name:<10}  client certificate CN={arguments.client_name}: tlsConfig.certFile")
    print(f"  {files.client_key.name:<10}  its key (0600): tlsConfig.keyFile")
    if files.ca_key is not None:
        print(f"  {files.ca_key.name:<10}  the CA's key (0600): keep it private; --ca-key renews under this CA")
    return 0


def _demo(arguments: argparse.Namespace) -> int:
    from extender.tools.demo import run_demo

    return run_demo(
        pods=arguments.pods,
        seed=arguments.seed,
        cluster_file=arguments.cluster or None,
        protocol=settings_module.Protocol(arguments.protocol),
    )


def _inspect(arguments: argparse.Namespace) -> int:
    from extender.tools.inspect import fetch_and_render

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
    config.add_argument(
        "--wiring",
        choices=("full", "filter-bind"),
        default="full",
        help="full: filter, prioritize, preempt and bind (default); filter-bind: no prioritize, kube-scheduler's "
        "NodeResourcesFit scores the nodes on the GPU resource nodes advertise (1.23 and later).",
    )
    _add_settings_flags(config)
    config.set_defaults(run=_scheduler_config)

    demo = commands.add_parser("demo", help="Place a burst of GPU pods on a bundled demo cluster, over HTTPS.")
    demo.add_argument("--pods", type=int, default=100, help="How many pods in the burst.")
    demo.add_argument("--seed", type=int, default=7, help="Seed of the burst's pod sizes.")
    demo.add_argument("--cluster", default="", help="Cluster file to use instead of the bundled one.")
    demo.add_argument(
        "--protocol",
        choices=[protocol.value for protocol in settings_module.Protocol],
        default=settings_module.Protocol.GPUSHARE.value,
        help="Device plugin the cluster runs: gpushare (GiB of GPU memory), or hami (HAMi's: memory in MiB or a "
        "share, compute, several GPUs, GPU models; its own bundled cluster).",
    )
    demo.set_defaults(run=_demo)

    certs = commands.add_parser(
        "certs",
        help="Write a CA, a serving and a client certificate for mTLS, as files or as Secret manifests.",
        description="For clusters without cert-manager. The serving certificate names the Service "
        "(gpu-extender, gpu-extender.NAMESPACE, .svc, .svc.cluster.local), 127.0.0.1 (for `extender inspect` through "
        "a port-forward) and any --dns-name and --ip; the "
        "client certificate is kube-scheduler's. Keys are ECDSA P-256, written with mode 0600.",
    )
    certs.add_argument(
        "--out",
        default=None,
        help=f"Directory to write ca.crt, tls.crt/key and client.crt/key into (default: {DEFAULT_CERTS_DIR}).",
    )
    certs.add_argument(
        "--secrets",
        action="store_true",
        help="Print Secret manifests instead: gpu-extender-tls (kubernetes.io/tls, with ca.crt) for the extender, "
        "gpu-extender-client-ca (ca.crt) for its --client-ca, gpu-extender-scheduler-client (kubernetes.io/tls, "
        "with ca.crt) for the scheduler.",
    )
    certs.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="Namespace of the Service and of the Secrets.")
    certs.add_argument(
        "--dns-name", action="append", default=[], help="Another DNS name for the serving certificate (repeatable)."
    )
    certs.add_argument(
        "--ip", action="append", default=[], help="An IP address for the serving certificate (repeatable)."
    )
    certs.add_argument("--days", default="365", help="Days the certificates are valid.")
    certs.add_argument("--client-name", default="kube-scheduler", help="CN of the client certificate.")
    certs.add_argument("--ca-cert", default="", help="Sign with this existing CA (PEM) instead of a new one.")
    certs.add_argument("--ca-key", default="", help="Key of --ca-cert (unencrypted PEM, ECDSA or RSA).")
    certs.add_argument("--keep-ca-key", action="store_true", help="Also write the new CA's key (ca.key, mode 0600).")
    certs.add_argument("--force", action="store_true", help="Replace certificates already in --out.")
    certs.set_defaults(run=_certs)

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
    except (UserError, OSError) as error:
        print(f"extender {arguments.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
