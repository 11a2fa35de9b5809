"""The file source: Nodes, Pods, ResourceQuotas and PodGroups from a YAML or JSON file of Kubernetes objects, and
a binder that applies binds to that in-memory state as the API server would.

It reads what `kubectl get nodes,pods,resourcequotas -A -o yaml` prints (a `List`), several YAML documents, a
JSON object or a JSON array, and `NodeList`/`PodList`/`ResourceQuotaList`/`PodGroupList`. PodGroups are those
of scheduler-plugins' coscheduling and Volcano, told apart by their apiVersion (`groups.listed`; add
`podgroups.scheduling.x-k8s.io,podgroups.scheduling.volcano.sh` to kubectl's kinds): a CRD none of whose
PodGroups is in the file is taken as not installed. Other kinds, and PodGroups of other API groups, are skipped
(and counted); a document that is not a Kubernetes object is a `ClusterFileError` naming the file and the
document. For demos, load tests and offline what-if runs; it never talks to a cluster.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from extender.core import objects
from extender.core.binding import BindError, BindRequest, slim_pod
from extender.core.cache import Cache
from extender.core.errors import UserError
from extender.core.groups import API_VERSIONS
from extender.core.objects import Raw
from extender.core.recheck import Recheck

log = logging.getLogger(__name__)


class ClusterFileError(UserError):
    """The cluster file cannot be read; the message names the file and what was wrong."""


@dataclass(slots=True)
class ClusterObjects:
    nodes: list[Raw] = field(default_factory=list)
    pods: list[Raw] = field(default_factory=list)
    quotas: list[Raw] = field(default_factory=list)
    """ResourceQuotas (their GPU keys limit what the namespaces' pods are given: `core/quota/`)."""
    podgroups: list[Raw] = field(default_factory=list)
    """PodGroups of either CRD (`groups.API_VERSIONS`), whole: `groups.listed` reads them."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Kinds present in the file that the extender does not use, with their counts."""


def _documents(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise ClusterFileError(f"cluster file {path}: {error.strerror}") from None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            loaded = orjson.loads(text)
        except orjson.JSONDecodeError as error:
            raise ClusterFileError(f"cluster file {path}: not valid JSON: {error}") from None
        return loaded if isinstance(loaded, list) else [loaded]
    try:
        return [
            document
            for document in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
            if document is not None
        ]
    except yaml.YAMLError as error:
        raise ClusterFileError(f"cluster file {path}: not valid YAML: {error}") from None


def _collect(objects: ClusterObjects, document: Any, where: str) -> None:
    if not isinstance(document, dict) or "kind" not in document:
        raise ClusterFileError(f"{where}: not a Kubernetes object (no kind)")
    kind = document["kind"]
    if isinstance(kind, str) and kind.endswith("List"):
        items = document.get("items") or []
        if not isinstance(items, list):
            raise ClusterFileError(f"{where}: {kind}.items is not a list")
        implied = kind[: -len("List")]
        for position, item in enumerate(items):
            if isinstance(item, dict) and "kind" not in item and implied:
                item = {**item, "kind": implied}
                if "apiVersion" not in item and document.get("apiVersion"):  # a PodGroupList's PodGroups: by it
                    item["apiVersion"] = document["apiVersion"]
            _collect(objects, item, f"{where} item {position}")
        return
    meta = document.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        raise ClusterFileError(f"{where}: {kind} without metadata.name")
    if kind == "Node":
        objects.nodes.append(document)
    elif kind == "Pod":
        if not meta.get("uid"):
            raise ClusterFileError(f"{where}: Pod {meta.get('name')} without metadata.uid")
        objects.pods.append(document)
    elif kind == "ResourceQuota":
        objects.quotas.append(document)
    elif kind == "PodGroup" and document.get("apiVersion") in API_VERSIONS.values():
        objects.podgroups.append(document)
    else:
        objects.skipped[str(kind)] = objects.skipped.get(str(kind), 0) + 1


def load_cluster_file(path: str | Path) -> ClusterObjects:
    path = Path(path)
    objects = ClusterObjects()
    for number, document in enumerate(_documents(path), start=1):
        _collect(objects, document, f"cluster file {path} document {number}")
    if objects.skipped:
        log.info("cluster file %s: skipped kinds the extender does not use: %s", path, objects.skipped)
    return objects


class FileBinder:
    """Binds by updating the in-memory pod (annotations, nodeName) and feeding it to the cache, as a watch
    would after a real binding. A pod the file did not list is added, as if it had been created pending.
    It keeps only the slim form of each pod (`slim_pod`): what the cache reads, not the whole object."""

    def __init__(self, cluster: Cache, pods: list[Raw]) -> None:
        self.cluster = cluster
        self._pods: dict[str, Raw] = {objects.uid(pod): slim_pod(pod) for pod in pods}

    async def bind(self, pod: Raw, node: str, annotations: dict[str, str]) -> None:
        uid = objects.uid(pod)
        stored = self._pods.get(uid)
        current = copy.deepcopy(stored if stored is not None else pod)
        spec = current.setdefault("spec", {})
        bound_to = spec.get("nodeName")
        if bound_to and bound_to != node:
            raise BindError(f"pod is already bound to {bound_to}")
        current.setdefault("metadata", {}).setdefault("annotations", {}).update(annotations)
        spec["nodeName"] = node
        self._pods[uid] = current
        self.cluster.apply_pod(current)

    def delete(self, uid: str) -> None:
        """Remove a pod, as a deletion would (what-if runs, tests)."""
        pod = self._pods.pop(uid, None)
        if pod is not None:
            self.cluster.apply_pod(pod, deleted=True)


class FileSource:
    """The `Source` of a service whose cache is a file (`service/context.py`): always synced and ready (there
    is no leader to elect), no loop that could stop, nothing to read again and nothing to count; binds update
    the in-memory objects (`FileBinder`)."""

    def __init__(self, cache: Cache, pods: list[Raw]) -> None:
        self.binder = FileBinder(cache, pods)
        self.recheck: Recheck | None = None

    def is_synced(self) -> bool:
        return True

    def why_not_ready(self) -> str | None:
        return None

    def stopped_loop(self) -> str | None:
        return None

    def cache_current(self) -> bool:
        return True

    def binding_time_left(self) -> float | None:
        return None

    def bind_failed(self, request: BindRequest, error: str) -> None:
        """Logged by the verb already; no Event to record without an API."""

    def counts(self) -> Iterator[tuple[str, dict[str, str], float]]:
        return iter(())
