"""Where the API server is and how we prove who we are: the pod's service account, or a kubeconfig.

Our own loader, not kubernetes_asyncio's: the extender needs a dozen fields, not a generated client whose models
decode a 5,000-pod list about 30 times slower than orjson dicts; and none of the Python clients does
list/watch/relist-on-410 right by itself, so we would wrap it anyway (see `client.py`).

Order, as `load_config` tries it: an explicit kubeconfig path; in-cluster (`KUBERNETES_SERVICE_HOST`/`_PORT`
and a service-account token); `$KUBECONFIG`; `~/.kube/config`. As kubectl does, a `$KUBECONFIG` that is set
is used alone (never falling back to `~/.kube/config`), and naming a context means a kubeconfig (in-cluster is
skipped). Several `$KUBECONFIG` files are not merged: the first that exists is used. Relative paths in a
kubeconfig resolve against its directory, as kubectl does. Basic auth and `auth-provider` are refused (kubectl
removed the built-in providers; an exec plugin replaces them).

It only reads and checks files: it never connects, never runs an exec plugin and never reads a token (the
client does, at use, because tokens rotate). Anything unusable is a `ConfigError` naming file, context, field.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from extender.core.errors import UserError

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXEC_API_VERSION = "client.authentication.k8s.io/v1"


class ConfigError(UserError):
    """No usable connection; the message says what was tried / what is wrong (file, context, field)."""


@dataclass(frozen=True, slots=True)
class ExecConfig:
    """A credential plugin (`users[].user.exec`). interactiveMode and provideClusterInfo are ignored: we never
    have a terminal, and no plugin we know of needs the cluster info."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSION


@dataclass(frozen=True, slots=True)
class KubeConfig:
    server: str
    """`https://host:port` (perhaps with a path prefix), no trailing slash."""
    source: str
    """For logs and errors: "in-cluster service account" or "kubeconfig /path (context ctx)"."""
    ca_file: str = ""
    ca_data: bytes = b""
    """PEM; overrides `ca_file`. Neither: the system's CAs."""
    insecure_skip_tls_verify: bool = False
    token: str = ""
    token_file: str = ""
    """Read by the client at use and again when old or refused (service-account tokens rotate); wins over `token`."""
    client_cert_file: str = ""
    client_key_file: str = ""
    client_cert_data: bytes = b""
    """PEM; overrides `client_cert_file`, as `client_key_data` does `client_key_file`."""
    client_key_data: bytes = b""
    exec: ExecConfig | None = None
    """Used only when the user has no token and no client certificate (client-go's precedence)."""
    namespace: str = "default"
    """In-cluster: the service account's namespace; kubeconfig: the context's."""


def load_config(
    kubeconfig: str = "",
    context: str = "",
    env: Mapping[str, str] | None = None,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
    home: str | None = None,
) -> KubeConfig:
    env = os.environ if env is None else env
    if kubeconfig:
        return _from_kubeconfig(Path(kubeconfig), context)
    tried: list[str] = []
    if context:
        tried.append("in-cluster (skipped: a context was named)")
    else:
        in_cluster = _in_cluster(env, Path(service_account_dir), tried)
        if in_cluster is not None:
            return in_cluster
    if env.get("KUBECONFIG"):
        for name in env["KUBECONFIG"].split(os.pathsep):
            if name and Path(name).is_file():
                return _from_kubeconfig(Path(name), context)
        tried.append(f"$KUBECONFIG={env['KUBECONFIG']} (no such file)")
    else:
        default = Path(home if home is not None else Path.home()) / ".kube" / "config"
        if default.is_file():
            return _from_kubeconfig(default, context)
        tried.append(f"$KUBECONFIG (not set), {default} (no such file)")
    raise ConfigError(f"no Kubernetes API configuration found; tried: {'; '.join(tried)}")


def _in_cluster(env: Mapping[str, str], folder: Path, tried: list[str]) -> KubeConfig | None:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not (host and port):
        tried.append("in-cluster (KUBERNETES_SERVICE_HOST or KUBERNETES_SERVICE_PORT not set)")
        return None
    if not (folder / "token").is_file():
        tried.append(f"in-cluster (no token at {folder / 'token'})")
        return None
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    namespace_file = folder / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else ""
    return KubeConfig(
        server=f"https://{host}:{port}",
        source="in-cluster service account",
        ca_file=str(folder / "ca.crt") if (folder / "ca.crt").is_file() else "",
        token_file=str(folder / "token"),
        namespace=namespace or "default",
    )


def _from_kubeconfig(path: Path, context: str) -> KubeConfig:
    try:
        document = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"kubeconfig {path}: no such file") from None
    except OSError as error:
        raise ConfigError(f"kubeconfig {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"kubeconfig {path}: not YAML: {error}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"kubeconfig {path}: not a kubeconfig (expected a mapping with clusters, contexts, users)")
    name = context or document.get("current-context") or ""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"kubeconfig {path}: no current-context set and no context named")
    fields = _Fields(f"kubeconfig {path} (context {name})", path.parent)
    chosen = fields.entry(document, "contexts", "context", name)
    cluster_name = fields.string(chosen, "cluster", f"context {name!r}")
    if not cluster_name:
        raise fields.error(f"context {name!r}", "cluster", "missing")
    cluster = fields.entry(document, "clusters", "cluster", cluster_name)
    user_name = fields.string(chosen, "user", f"context {name!r}")
    user = fields.entry(document, "users", "user", user_name) if user_name else {}
    where_cluster, where_user = f"cluster {cluster_name!r}", f"user {user_name!r}"
    server = fields.string(cluster, "server", where_cluster).rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise fields.error(where_cluster, "server", f"expected an https:// URL, not {server!r}")
    for unsupported, what in (("username", "basic auth"), ("password", "basic auth"), ("auth-provider", "")):
        if user.get(unsupported):
            what = (
                what or f"auth-provider {user[unsupported].get('name') if isinstance(user[unsupported], dict) else ''}"
            )
            raise fields.error(
                where_user, unsupported, f"{what.strip()} is not supported; use a token or an exec plugin"
            )
    cert_file = fields.file(user, "client-certificate", where_user)
    key_file = fields.file(user, "client-key", where_user)
    cert_data = fields.base64(user, "client-certificate-data", where_user)
    key_data = fields.base64(user, "client-key-data", where_user)
    if bool(cert_file or cert_data) != bool(key_file or key_data):
        raise fields.error(where_user, "client-key", "a client certificate needs both the certificate and its key")
    namespace = fields.string(chosen, "namespace", f"context {name!r}")
    return KubeConfig(
        server=server,
        source=fields.where,
        ca_file=fields.file(cluster, "certificate-authority", where_cluster),
        ca_data=fields.base64(cluster, "certificate-authority-data", where_cluster),
        insecure_skip_tls_verify=fields.boolean(cluster, "insecure-skip-tls-verify", where_cluster),
        token=fields.string(user, "token", where_user),
        token_file=fields.file(user, "tokenFile", where_user),
        client_cert_file=cert_file,
        client_key_file=key_file,
        client_cert_data=cert_data,
        client_key_data=key_data,
        exec=fields.exec(user, where_user),
        namespace=namespace or "default",
    )


@dataclass(frozen=True, slots=True)
class _Fields:
    """Reads typed fields out of one kubeconfig; every error names the file, the context and the field."""

    where: str
    folder: Path

    def error(self, owner: str, field: str, why: str) -> ConfigError:
        return ConfigError(f"{self.where}: {owner} field {field}: {why}")

    def entry(self, document: dict[str, Any], section: str, kind: str, name: str) -> dict[str, Any]:
        entries = document.get(section) or []
        if not isinstance(entries, list):
            raise ConfigError(f"{self.where}: {section} is not a list")
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == name:
                body = entry.get(kind) or {}
                if not isinstance(body, dict):
                    raise self.error(f"{kind} {name!r}", kind, "not a mapping")
                return body
        known = ", ".join(str(entry.get("name")) for entry in entries if isinstance(entry, dict)) or "none"
        raise ConfigError(f"{self.where}: no {kind} named {name!r} in {section} (known: {known})")

    def string(self, block: dict[str, Any], field: str, owner: str) -> str:
        value = block.get(field)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.error(owner, field, f"expected a string, not {type(value).__name__}")
        return value

    def boolean(self, block: dict[str, Any], field: str, owner: str) -> bool:
        value = block.get(field, False)
        if not isinstance(value, bool):
            raise self.error(owner, field, f"expected true or false, not {value!r}")
        return value

    def file(self, block: dict[str, Any], field: str, owner: str) -> str:
        value = self.string(block, field, owner)
        if not value:
            return ""
        path = self.folder / value
        if not path.is_file():
            raise self.error(owner, field, f"no such file: {path}")
        return str(path)

    def base64(self, block: dict[str, Any], field: str, owner: str) -> bytes:
        value = self.string(block, field, owner)
        try:
            return base64.b64decode("".join(value.split()), validate=True)
        except (binascii.Error, ValueError):
            raise self.error(owner, field, "not valid base64") from None

    def exec(self, block: dict[str, Any], owner: str) -> ExecConfig | None:
        plugin = block.get("exec")
        if plugin is None:
            return None
        if not isinstance(plugin, dict):
            raise self.error(owner, "exec", "not a mapping")
        command = self.string(plugin, "command", owner)
        if not command:
            raise self.error(owner, "exec.command", "missing")
        if os.sep in command and not os.path.isabs(command):
            command = str(self.folder / command)
        args = plugin.get("args") or []
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            raise self.error(owner, "exec.args", "expected a list of strings")
        env = plugin.get("env") or []
        pairs: list[tuple[str, str]] = []
        for item in env if isinstance(env, list) else [None]:
            name, value = (item.get("name"), item.get("value")) if isinstance(item, dict) else (None, None)
            if not (isinstance(name, str) and isinstance(value, str)):
                raise self.error(owner, "exec.env", "expected a list of {name, value} strings")
            pairs.append((name, value))
        api_version = self.string(plugin, "apiVersion", owner) or EXEC_API_VERSION
        return ExecConfig(command, tuple(args), tuple(pairs), api_version)
