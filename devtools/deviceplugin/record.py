"""The plugin's own record of every Allocate it answered, one JSON object a line, so a test can judge from the node's
side ("no GPU given twice", "the pod refused was told why") without trusting the extender's view.

Each line says: when, which protocol and node, the pod the plugin served (`namespace/name` and UID, or null when it
found none), the container (HAMi's plugin knows it; gpushare's cannot tell and says null), kubelet's device IDs,
the GPUs given (index, UUID, memory, cores), the environment's device list, whether the call was accepted (kubelet
got an answer, not an error) and why it was refused or gave no GPU. Lines are appended and flushed one by one, so a
reader tailing the file sees each as it happens. The plugins never read it back (`read_records` is for the tests),
and recording never changes what a plugin answers.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import orjson


@dataclass(frozen=True, slots=True)
class GivenGpu:
    index: int | None
    uuid: str
    memory: int
    """In the protocol's unit: gpushare's units (GiB by default), HAMi's MiB."""
    cores: int | None = None
    """HAMi: % of the GPU's compute; gpushare: None."""


@dataclass(frozen=True, slots=True)
class AllocateRecord:
    protocol: str
    node: str
    pod: str | None
    uid: str | None
    container: str | None
    device_ids: tuple[str, ...]
    gpus: tuple[GivenGpu, ...]
    visible_devices: str | None
    """NVIDIA_VISIBLE_DEVICES as answered (None when refused)."""
    accepted: bool
    reason: str = ""
    """Why it was refused, or why it gave no GPU; "" otherwise."""
    found_by: str = ""
    findings: tuple[str, ...] = ()
    """What the real plugin lets through unchecked and the double noticed (a GPU not on the node, memory over it)."""
    time: float = field(default_factory=time.time)

    def json(self) -> dict[str, Any]:
        return asdict(self)


class Recorder:
    """Appends records to a file (or nowhere). Mutable: holds the open file; close it at the end."""

    def __init__(self, path: Path | None) -> None:
        self._file: TextIO | None = path.open("a", encoding="utf-8") if path else None

    def write(self, record: AllocateRecord) -> None:
        if self._file is not None:
            self._file.write(orjson.dumps(record.json()).decode() + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record in a file (for tests and tools that judge the plugin's record)."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_text().splitlines() if line.strip()]
