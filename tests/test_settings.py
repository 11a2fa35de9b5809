"""Settings: defaults < config file < EXTENDER_* variables < flags; wrong values named with their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.core.devices import Strategy
from extender.core.protocols.gpushare import Profile, SeveralGpus
from extender.settings import Settings, load
from extender.settings_values import SettingsError

TLS = {"tls_cert": "s.crt", "tls_key": "s.key"}


def test_defaults_are_https_binpack_and_the_gpushare_profile() -> None:
    settings = load(TLS, env={})
    assert (settings.port, settings.scheme, settings.node_strategy) == (8443, "https", Strategy.BINPACK)
    assert settings.profile.memory_resource == "aliyun.com/gpu-mem"


def test_flags_beat_the_environment_which_beats_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("port: 7000\nhost: 10.0.0.1\nmemory-resource: example.com/gpu-mem\nreservation_ttl: 30\n")
    settings = load({**TLS, "port": "9000"}, env={"EXTENDER_PORT": "8000", "EXTENDER_HOST": "::"}, config=str(config))
    assert (settings.port, settings.host, settings.memory_resource, settings.reservation_ttl) == (
        9000,
        "::",
        "example.com/gpu-mem",
        30.0,
    )


def test_pods_asking_several_gpus_are_refused_in_gpushare_unless_bind_is_set(tmp_path: Path) -> None:
    """The profile the protocol is built from carries the setting (`Settings.device_protocol`)."""
    protocol = load(TLS, env={}).device_protocol
    assert isinstance(protocol, Profile) and protocol.several_gpus is SeveralGpus.REFUSE
    config = tmp_path / "extender.yaml"
    config.write_text("gpushare-several-gpus: bind\n")
    bound = load(TLS, env={}, config=str(config))
    assert bound.gpushare_several_gpus is SeveralGpus.BIND and bound.profile.several_gpus is SeveralGpus.BIND
    assert load({**TLS, "gpushare_several_gpus": "bind"}, env={}).profile.several_gpus is SeveralGpus.BIND


def test_the_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"insecure_http": true}')
    assert load(env={"EXTENDER_CONFIG": str(config)}).insecure_http


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({}, {"EXTENDER_PORT": "eighty"}, "EXTENDER_PORT='eighty': invalid literal"),
        ({"port": "70000"}, {}, "port 70000 is out of range"),
        ({"health_port": "-1"}, {}, "health_port -1 is out of range"),
        ({"health_port": "8443"}, {}, "health_port and port are both 8443: the health listener needs its own port"),
        ({"insecure_http": "maybe"}, {}, "--insecure-http='maybe': expected true or false"),
        ({"node_strategy": "random"}, {}, "(one of: binpack, spread)"),
        ({"gpushare_several_gpus": "split"}, {}, "--gpushare-several-gpus='split': 'split' is not a valid SeveralGpus"),
        ({"reservation_ttl": "0"}, {}, "reservation_ttl must be positive"),
        ({"weight": "0"}, {}, "weight must be > 0"),
        ({"lease_duration": "10"}, {}, "lease_duration (10.0) must be greater than renew_deadline (10.0)"),
        (
            {"renew_deadline": "2", "retry_period": "2"},
            {},
            "renew_deadline (2.0) must be greater than 1.2 x retry_period",
        ),
        ({"watch_inactivity": "0"}, {}, "watch_inactivity must be positive"),
        ({}, {"EXTENDER_LEADER_ELECT": "sometimes"}, "EXTENDER_LEADER_ELECT='sometimes': expected true or false"),
    ],
)
def test_bad_values_name_their_source(flags: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=r".*" + message.replace("(", r"\(").replace(")", r"\)")):
        load({**TLS, **flags}, env=env)


def test_https_needs_a_certificate_unless_plain_http_is_asked_for() -> None:
    with pytest.raises(SettingsError, match="HTTPS needs --tls-cert and --tls-key"):
        load({}, env={})
    assert load({"insecure_http": True}, env={}).scheme == "http"


def test_client_ca_without_https_is_refused() -> None:
    with pytest.raises(SettingsError, match="--client-ca needs HTTPS"):
        load({"insecure_http": True, "client_ca": "ca.crt"}, env={})


def test_a_config_file_with_unknown_keys_or_bad_syntax_is_refused(tmp_path: Path) -> None:
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("prot: 1\n")
    with pytest.raises(SettingsError, match="unknown settings prot"):
        load(TLS, env={}, config=str(unknown))
    broken = tmp_path / "broken.yaml"
    broken.write_text("port: [\n")
    with pytest.raises(SettingsError, match="not YAML or JSON"):
        load(TLS, env={}, config=str(broken))
    with pytest.raises(SettingsError, match="No such file"):
        load(TLS, env={}, config=str(tmp_path / "absent.yaml"))


def test_settings_are_frozen() -> None:
    settings = Settings()
    with pytest.raises(AttributeError):
        settings.port = 1  # type: ignore[misc]


def test_the_listener_limits_settings_default_to_the_transports_own_defaults() -> None:
    """settings sits below service (DESIGN §6), so its defaults are written as numbers, not as the constants of
    `service/limits.py`: this keeps the two from drifting apart."""
    from extender.app import listener_limits
    from extender.service.limits import Limits

    settings = Settings()
    assert listener_limits(settings, settings.max_connections) == Limits()
