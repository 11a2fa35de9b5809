"""The GPUs a device-plugin double pretends the node has: what NVML would tell the real plugin, read from a YAML file.

A node of this project has no GPU, so each double is given its GPUs the way the real plugin learns them from NVML
and its own configuration: per GPU its UUID, NVML index (also the /dev/nvidia<minor> gpushare reads), model name,
memory in MiB, compute (HAMi's percent of the card), NUMA node, health, NVLink peers (links per peer UUID) and, for
HAMi's MIG mode, the MIG profiles NVML offers for it after HAMi's allowlist (name, memory, compute share, slice and
instance counts, possible placements). Node-wide settings are the plugin's own flags and node configuration
(gpushare's `--memory-unit`; HAMi's `operatingmode`, split count, scalings, log level, core-limit switch,
GetPreferredAllocation switch, topology score). `devtools/deviceplugin/gpus-*.yaml` are examples. It only reads: it
never decides anything a plugin does with the GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

PCIE_SCORES = {
    "cross-cpu": 10,
    "same-cpu": 20,
    "host-bridge": 30,
    "multi-switch": 40,
    "single-switch": 50,
    "same-board": 60,
}
"""HAMi's pair score per PCIe link between two GPUs (pkg/device/nvidia/calculate_score.go:233-245 at v2.10.0)."""


class GpuFileError(ValueError):
    """The GPUs file cannot be read as described; the message names the field."""


@dataclass(frozen=True, slots=True)
class MigProfileSpec:
    name: str
    memory: int
    """memoryMB NVML gives the profile."""
    core: int
    """% of the card (HAMi: ceil(profile SMs x 100 / the largest profile's SMs), register.go:242-244)."""
    slices: int
    instances: int
    """InstanceCount: the most instances of it the GPU can hold."""
    placements: tuple[tuple[int, int], ...]
    """(start, size) of each placement NVML allows."""


@dataclass(frozen=True, slots=True)
class GpuSpec:
    uuid: str
    index: int
    model: str
    memory: int
    """MiB, as NVML reports the total."""
    cores: int = 100
    numa: int = 0
    healthy: bool = True
    nvlink: dict[str, int] = field(default_factory=dict)
    """Peer UUID -> number of NVLink links."""
    mig_profiles: tuple[MigProfileSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class HamiSettings:
    """HAMi's device configuration and per-node config.json, with the chart's defaults (charts/hami/values.yaml)."""

    operating_mode: str = "hami-core"
    split_count: int = 10
    memory_scaling: float = 1.0
    core_scaling: float = 1.0
    lib_cuda_log_level: str = "1"
    disable_core_limit: bool = False
    enable_preferred_allocation: bool = False
    """config.json `enablegetpreferredallocation`: registration option and Allocate's use of kubelet's IDs."""
    topology_score: bool = False
    """ENABLE_TOPOLOGY_SCORE: publish hami.io/node-nvidia-score."""
    pcie: str = "host-bridge"
    """The PCIe link between any two GPUs, for the topology score."""
    hook_path: str = "/usr/local"
    """HOOK_PATH: where HAMi-core lives in containers (only names paths in the environment here)."""


@dataclass(frozen=True, slots=True)
class GpuFile:
    gpus: tuple[GpuSpec, ...]
    memory_unit: str = "GiB"
    """gpushare's `--memory-unit`: GiB (default) or MiB."""
    hami: HamiSettings = HamiSettings()


def _int(entry: dict[str, Any], key: str, default: int | None = None) -> int:
    value = entry.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GpuFileError(f"{key}: expected a whole number, got {value!r}")
    return value


def _profile(entry: dict[str, Any]) -> MigProfileSpec:
    placements = tuple((int(start), int(size)) for start, size in entry.get("placements") or ())
    return MigProfileSpec(
        str(entry["name"]), _int(entry, "memory"), _int(entry, "core"), _int(entry, "slices", 1),
        _int(entry, "instances", max(1, len(placements))), placements,
    )  # fmt: skip


def _gpu(position: int, entry: dict[str, Any]) -> GpuSpec:
    if not isinstance(entry, dict) or not entry.get("uuid") or "memory" not in entry:
        raise GpuFileError(f"gpus[{position}]: needs at least uuid and memory")
    nvlink = {str(peer): int(links) for peer, links in (entry.get("nvlink") or {}).items()}
    return GpuSpec(
        str(entry["uuid"]), _int(entry, "index", position), str(entry.get("model", "Tesla T4")), _int(entry, "memory"),
        _int(entry, "cores", 100), _int(entry, "numa", 0), bool(entry.get("healthy", True)), nvlink,
        tuple(_profile(profile) for profile in entry.get("migProfiles") or ()),
    )  # fmt: skip


def load_gpus(path: Path) -> GpuFile:
    data = yaml.safe_load(path.read_text()) or {}
    listed = data.get("gpus") or []
    if not listed:
        raise GpuFileError(f"{path}: no gpus")
    gpus = tuple(_gpu(position, entry) for position, entry in enumerate(listed))
    if len({gpu.uuid for gpu in gpus}) != len(gpus) or len({gpu.index for gpu in gpus}) != len(gpus):
        raise GpuFileError(f"{path}: UUIDs and indexes must be distinct")
    unit = str(data.get("memoryUnit", "GiB"))
    if unit not in ("GiB", "MiB"):
        raise GpuFileError(f"memoryUnit: GiB or MiB, not {unit!r}")
    hami = data.get("hami") or {}
    mode = str(hami.get("operatingMode", "hami-core"))
    if mode not in ("hami-core", "mig"):
        raise GpuFileError(f"hami.operatingMode: hami-core or mig, not {mode!r}")
    pcie = str(hami.get("pcie", "host-bridge"))
    if pcie not in PCIE_SCORES:
        raise GpuFileError(f"hami.pcie: one of {', '.join(PCIE_SCORES)}, not {pcie!r}")
    settings = HamiSettings(
        mode, _int(hami, "deviceSplitCount", 10), float(hami.get("deviceMemoryScaling", 1)),
        float(hami.get("deviceCoreScaling", 1)), str(hami.get("libCudaLogLevel", "1")),
        bool(hami.get("disableCoreLimit", False)), bool(hami.get("enableGetPreferredAllocation", False)),
        bool(hami.get("topologyScore", False)), pcie, str(hami.get("hookPath", "/usr/local")),
    )  # fmt: skip
    return GpuFile(gpus, unit, settings)
