"""Finding the API server and our credentials: in-cluster, an explicit kubeconfig, $KUBECONFIG, ~/.kube/config,
and every way a kubeconfig can be wrong."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import yaml

from extender.sources.kube.config import ConfigError, ExecConfig, KubeConfig, load_config

NO_ENV: dict[str, str] = {}


def write_kubeconfig(
    path: Path,
    cluster: dict[str, Any] | None = None,
    user: dict[str, Any] | None = None,
    namespace: str | None = None,
    current: str = "ctx",
) -> Path:
    """A kubeconfig with one context "ctx" (cluster "c", user "u") and a second, "other", to switch to."""
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace:
        context["namespace"] = namespace
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [
            {"name": "c", "cluster": cluster if cluster is not None else {"server": "https://10.0.0.1:6443/"}},
            {"name": "c2", "cluster": {"server": "https://other.example:443"}},
        ],
        "users": [{"name": "u", "user": user if user is not None else {"token": "abc"}}],
        "contexts": [
            {"name": "ctx", "context": context},
            {"name": "other", "context": {"cluster": "c2", "namespace": "team"}},
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(document))
    return path


def service_account(folder: Path, namespace: str = "gpu-extender") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "token").write_text("sa-token\n")
    (folder / "ca.crt").write_text("not read here\n")
    (folder / "namespace").write_text(namespace)
    return folder


IN_CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def test_in_cluster_from_env_and_service_account_dir(tmp_path: Path) -> None:
    folder = service_account(tmp_path / "sa")
    config = load_config(env=IN_CLUSTER_ENV, service_account_dir=str(folder), home=str(tmp_path))
    assert config == KubeConfig(
        server="https://10.96.0.1:443",
        source="in-cluster service account",
        ca_file=str(folder / "ca.crt"),
        token_file=str(folder / "token"),
        namespace="gpu-extender",
    )


def test_in_cluster_brackets_an_ipv6_host(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = load_config(env=env, service_account_dir=str(service_account(tmp_path / "sa")), home=str(tmp_path))
    assert config.server == "https://[fd00:10:96::1]:443"


def test_in_cluster_needs_the_token(tmp_path: Path) -> None:
    write_kubeconfig(tmp_path / ".kube" / "config")
    config = load_config(env=IN_CLUSTER_ENV, service_account_dir=str(tmp_path / "no-sa"), home=str(tmp_path))
    assert config.source.startswith("kubeconfig ")


def test_an_explicit_kubeconfig_wins_over_in_cluster(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "explicit.yaml")
    folder = service_account(tmp_path / "sa")
    config = load_config(str(path), env=IN_CLUSTER_ENV, service_account_dir=str(folder), home=str(tmp_path))
    assert config.source == f"kubeconfig {path} (context ctx)"
    assert config.server == "https://10.0.0.1:6443"
    assert config.token == "abc"


def test_naming_a_context_skips_in_cluster(tmp_path: Path) -> None:
    write_kubeconfig(tmp_path / ".kube" / "config")
    folder = service_account(tmp_path / "sa")
    config = load_config(context="other", env=IN_CLUSTER_ENV, service_account_dir=str(folder), home=str(tmp_path))
    assert (config.server, config.namespace) == ("https://other.example:443", "team")


def test_kubeconfig_variable_uses_the_first_file_that_exists(tmp_path: Path) -> None:
    second = write_kubeconfig(tmp_path / "second.yaml", user={"token": "second"})
    write_kubeconfig(tmp_path / "third.yaml", user={"token": "third"})
    env = {"KUBECONFIG": f"{tmp_path / 'missing.yaml'}::{second}:{tmp_path / 'third.yaml'}"}
    config = load_config(env=env, service_account_dir=str(tmp_path / "no-sa"), home=str(tmp_path))
    assert config.token == "second"


def test_a_kubeconfig_variable_naming_no_file_does_not_fall_back_to_home(tmp_path: Path) -> None:
    write_kubeconfig(tmp_path / ".kube" / "config")
    env = {"KUBECONFIG": str(tmp_path / "missing.yaml")}
    with pytest.raises(ConfigError, match=r"missing\.yaml"):
        load_config(env=env, service_account_dir=str(tmp_path / "no-sa"), home=str(tmp_path))


def test_home_kubeconfig_is_the_last_resort(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / ".kube" / "config", namespace="ml")
    config = load_config(env=NO_ENV, service_account_dir=str(tmp_path / "no-sa"), home=str(tmp_path))
    assert (config.source, config.namespace) == (f"kubeconfig {path} (context ctx)", "ml")


def test_nothing_usable_lists_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(env=NO_ENV, service_account_dir=str(tmp_path / "no-sa"), home=str(tmp_path))
    message = str(caught.value)
    assert "KUBERNETES_SERVICE_HOST" in message
    assert "$KUBECONFIG (not set)" in message
    assert str(tmp_path / ".kube" / "config") in message


def test_token_user_and_default_namespace(tmp_path: Path) -> None:
    config = load_config(str(write_kubeconfig(tmp_path / "k.yaml")))
    assert (config.token, config.token_file, config.exec, config.namespace) == ("abc", "", None, "default")


def test_relative_paths_resolve_against_the_kubeconfig_directory(tmp_path: Path) -> None:
    folder = tmp_path / "conf"
    folder.mkdir()
    for name in ("ca.crt", "client.crt", "client.key", "token"):
        (folder / name).write_text("x")
    user = {"client-certificate": "client.crt", "client-key": "./client.key", "tokenFile": "token"}
    cluster = {"server": "https://k:6443", "certificate-authority": "ca.crt"}
    config = load_config(str(write_kubeconfig(folder / "k.yaml", cluster=cluster, user=user)))
    assert config.ca_file == str(folder / "ca.crt")
    assert (config.client_cert_file, config.client_key_file) == (str(folder / "client.crt"), str(folder / "client.key"))
    assert config.token_file == str(folder / "token")


def test_base64_data_fields_are_decoded(tmp_path: Path) -> None:
    def encoded(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    cluster = {"server": "https://k:6443", "certificate-authority-data": encoded("CA PEM")}
    user = {"client-certificate-data": encoded("CERT PEM"), "client-key-data": encoded("KEY PEM")}
    config = load_config(str(write_kubeconfig(tmp_path / "k.yaml", cluster=cluster, user=user)))
    assert (config.ca_data, config.client_cert_data, config.client_key_data) == (b"CA PEM", b"CERT PEM", b"KEY PEM")


def test_insecure_skip_tls_verify(tmp_path: Path) -> None:
    cluster = {"server": "https://k:6443", "insecure-skip-tls-verify": True}
    assert load_config(str(write_kubeconfig(tmp_path / "k.yaml", cluster=cluster))).insecure_skip_tls_verify


def test_exec_plugin_fields(tmp_path: Path) -> None:
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token"],
            "env": [{"name": "AWS_PROFILE", "value": "prod"}],
            "interactiveMode": "Never",
        }
    }
    config = load_config(str(write_kubeconfig(tmp_path / "k.yaml", user=user)))
    assert config.exec == ExecConfig(
        "aws", ("eks", "get-token"), (("AWS_PROFILE", "prod"),), "client.authentication.k8s.io/v1beta1"
    )


def test_exec_command_with_a_relative_path_resolves_against_the_kubeconfig(tmp_path: Path) -> None:
    user = {"exec": {"command": "./bin/get-token"}}
    config = load_config(str(write_kubeconfig(tmp_path / "k.yaml", user=user)))
    assert config.exec == ExecConfig(str(tmp_path / "bin" / "get-token"))


def test_context_argument_overrides_current_context(tmp_path: Path) -> None:
    config = load_config(str(write_kubeconfig(tmp_path / "k.yaml")), context="other")
    assert (config.server, config.token, config.namespace) == ("https://other.example:443", "", "team")
    assert config.source.endswith("(context other)")


def test_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kubeconfig .*nope\.yaml: no such file"):
        load_config(str(tmp_path / "nope.yaml"))


def test_kubeconfig_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "k.yaml"
    path.write_text("clusters: [unclosed\n")
    with pytest.raises(ConfigError, match="not YAML"):
        load_config(str(path))


def test_missing_context_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no context named 'prod' in contexts \(known: ctx, other\)"):
        load_config(str(write_kubeconfig(tmp_path / "k.yaml")), context="prod")


def test_no_current_context(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no current-context"):
        load_config(str(write_kubeconfig(tmp_path / "k.yaml", current="")))


@pytest.mark.parametrize(
    ("cluster", "user", "field", "why"),
    [
        ({"server": "https://k"}, {"auth-provider": {"name": "oidc"}}, "auth-provider", "auth-provider oidc is not"),
        ({"server": "https://k"}, {"username": "admin", "password": "x"}, "username", "basic auth is not supported"),
        ({"server": "https://k", "certificate-authority-data": "not base64!"}, {}, "certificate-authority-data", ""),
        ({"server": "https://k"}, {"client-certificate-data": "%%%", "client-key-data": "QQ=="}, "client-cert", ""),
        ({}, {}, "server", "expected an https:// URL"),
        ({"server": 6443}, {}, "server", "expected a string"),
        ({"server": "https://k", "insecure-skip-tls-verify": "yes"}, {}, "insecure-skip-tls-verify", "true or false"),
        ({"server": "https://k", "certificate-authority": "ca.crt"}, {}, "certificate-authority", "no such file"),
        ({"server": "https://k"}, {"client-certificate-data": "QQ=="}, "client-key", "needs both"),
        ({"server": "https://k"}, {"exec": {"args": ["x"]}}, "exec.command", "missing"),
        ({"server": "https://k"}, {"exec": {"command": "x", "env": [{"name": "A"}]}}, "exec.env", "name, value"),
        ({"server": "https://k"}, {"exec": {"command": "x", "args": "get-token"}}, "exec.args", "list of strings"),
    ],
    ids=[
        "auth-provider",
        "basic-auth",
        "bad-base64-ca",
        "bad-base64-cert",
        "no-server",
        "server-not-string",
        "insecure-not-bool",
        "missing-ca-file",
        "cert-without-key",
        "exec-without-command",
        "exec-env-without-value",
        "exec-args-not-list",
    ],
)
def test_malformed_fields_name_file_context_and_field(
    tmp_path: Path, cluster: dict[str, Any], user: dict[str, Any], field: str, why: str
) -> None:
    path = write_kubeconfig(tmp_path / "k.yaml", cluster=cluster, user=user)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    message = str(caught.value)
    assert message.startswith(f"kubeconfig {path} (context ctx): ")
    assert f"field {field}" in message
    assert why in message


def test_bad_base64_says_so(tmp_path: Path) -> None:
    cluster = {"server": "https://k", "certificate-authority-data": "not base64!"}
    with pytest.raises(ConfigError, match="cluster 'c' field certificate-authority-data: not valid base64"):
        load_config(str(write_kubeconfig(tmp_path / "k.yaml", cluster=cluster)))
