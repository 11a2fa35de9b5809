"""The end-to-end tier's fixture: one real control plane (etcd + kube-apiserver) per test session.

The binaries come from `tests/e2e/build.sh` (run by `make test`). Without them the tier is skipped only when
there is no Go toolchain to build them; with Go present, missing binaries fail the tier loudly, so CI can never
pass by silently skipping it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from extender.tools.certs import write_certificates
from tests.e2e.controlplane import (
    BUILD_SCRIPT,
    ApiError,
    ControlPlane,
    binaries_dir,
    go_toolchain,
    missing_binaries,
)
from tests.e2e.extender_process import TLSFiles

Remember = Callable[[str], None]


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries = binaries_dir()
    missing = missing_binaries(binaries)
    if missing:
        build = f"bash {BUILD_SCRIPT.relative_to(BUILD_SCRIPT.parents[2])}"
        if go_toolchain() is None:
            pytest.skip(f"e2e tier skipped: no Go toolchain to build {', '.join(missing)} (see `{build}`)")
        pytest.fail(
            f"e2e tier: {', '.join(missing)} missing from {binaries}; run `{build}` (or `make test`)", pytrace=False
        )
    workdir = tmp_path_factory.mktemp("control-plane")
    plane = ControlPlane(binaries, workdir)
    plane.start()
    yield plane
    plane.stop()


@pytest.fixture
async def cleanup(control_plane: ControlPlane) -> AsyncIterator[Remember]:
    """Remember the API paths of objects a test made; deleted (newest first) after it, so the tests sharing the
    session's control plane each start from a clean cluster."""
    paths: list[str] = []
    yield paths.append
    for path in reversed(paths):
        try:
            await control_plane.delete(path)
        except ApiError as error:
            if error.status != 404:
                raise


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    """A module's extender certificates: one CA for its serving certificate (127.0.0.1) and the client
    certificate kube-scheduler and the tests show it."""
    files = write_certificates(tmp_path_factory.mktemp("extender-tls"), dns_names=(), ips=("127.0.0.1",))
    return TLSFiles(
        files.ca_certificate, files.server_certificate, files.server_key, files.client_certificate, files.client_key
    )
