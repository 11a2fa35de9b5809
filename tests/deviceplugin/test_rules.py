"""The small rules under the doubles, each as the real code reads it: the gogo strip of kubelet's proto, gpushare's
quantities and index parsing, HAMi's lock value and device IDs, the GPUs file. No process, no API server."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.deviceplugin.gpus import GpuFileError, load_gpus
from devtools.deviceplugin.gpushare import atoi, quantity
from devtools.deviceplugin.hami import pair_scores, registration
from devtools.deviceplugin.hami_protocol import parse_lock, physical_device_id
from devtools.deviceplugin.kubeletapi import _without_gogo

HAMI_GPUS = Path(__file__).resolve().parents[2] / "devtools" / "deviceplugin" / "gpus-hami.yaml"


def test_gogo_import_and_options_are_stripped_and_nothing_else() -> None:
    """Older kubelet protos import gogo.proto for Go-only options; the wire format does not depend on them."""
    text = (
        'syntax = "proto3";\nimport "github.com/gogo/protobuf/gogoproto/gogo.proto";\n'
        "option (gogoproto.goproto_getters_all) = false;\n"
        'message Device {\n  string ID = 1 [(gogoproto.customname) = "ID"];\n  string health = 2;\n}\n'
    )
    assert _without_gogo(text) == 'syntax = "proto3";\n\nmessage Device {\n  string ID = 1;\n  string health = 2;\n}\n'


@pytest.mark.parametrize(
    ("text", "value"),
    [("4", 4), ("0", 0), ("1500m", 2), ("2k", 2000), ("1Ki", 1024), ("x", 0), ("", 0)],  # Value() rounds up
)
def test_gpushare_reads_quantities_as_kubernetes_value_does(text: str, value: int) -> None:
    assert quantity(text) == value


@pytest.mark.parametrize(("text", "value"), [("1", 1), ("-1", -1), ("+2", 2), ("1,2", None), ("", None), (None, None)])
def test_gpushare_reads_the_index_as_go_atoi(text: str | None, value: int | None) -> None:
    assert atoi(text) == value


@pytest.mark.parametrize(
    ("value", "holder"),
    [("2026-01-02T03:04:05Z,ns,pod", ("ns", "pod")), ("2026-01-02T03:04:05Z", None)],  # legacy: search
)
def test_hami_lock_names_its_pod_or_none_for_the_legacy_form(value: str, holder: tuple[str, str] | None) -> None:
    assert parse_lock(value) == holder


@pytest.mark.parametrize("value", ["2026-01-02T03:04:05Z,ns", "yesterday,ns,pod"])
def test_a_malformed_hami_lock_fails(value: str) -> None:
    """ParseNodeLock's error fails the Allocate call (pkg/util/util.go:127-130)."""
    with pytest.raises(ValueError):
        parse_lock(value)


@pytest.mark.parametrize(
    ("device_id", "gpu"),
    [
        ("GPU-0a1b2c3d-0000-1111-2222-333344445555-7", "GPU-0a1b2c3d-0000-1111-2222-333344445555"),
        ("GPU-0a1b2c3d-0000-1111-2222-333344445555", "GPU-0a1b2c3d-0000-1111-2222-333344445555"),
        ("GPU-a::3", "GPU-a"),
    ],
)
def test_hami_finds_the_gpu_behind_a_replica_id(device_id: str, gpu: str) -> None:
    assert physical_device_id(device_id) == gpu


def test_hami_pair_scores_add_the_pcie_link_and_100_a_nvlink_link() -> None:
    """calculate_score.go:230-285: host-bridge 30 + 2 NVLink links 200."""
    gpus = load_gpus(HAMI_GPUS)
    scores = pair_scores(gpus, [entry["id"] for entry in registration(gpus)])
    assert [list(score["score"].values()) for score in scores] == [[230], [230]]


def test_a_gpus_file_with_a_repeated_uuid_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "gpus.yaml"
    file.write_text("gpus:\n  - {uuid: GPU-a, memory: 1024}\n  - {uuid: GPU-a, memory: 1024}\n")
    with pytest.raises(GpuFileError, match="distinct"):
        load_gpus(file)
