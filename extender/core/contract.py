"""Wire types of the scheduler extender API (k8s.io/kube-scheduler/extender/v1), with the Go field names.

The Go types carry no json tags, so the keys are the Go field names (`NodeNames`, `FailedNodes`, ...), while
embedded Pods and Nodes are ordinary Kubernetes JSON, kept here as plain dicts. Requests are validated with
pydantic (strict: no silent coercion of a number into a node name); replies are built as plain dicts by the
`*_reply` functions, which never put a null where the scheduler expects a list or map. The models of the
replies exist so tests can check every reply against them.

This module knows nothing of GPUs, caches or HTTP.
"""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict, Field, SkipValidation, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from extender.core import objects
from extender.core.objects import Raw

UNSCHEDULABLE_FLUSH = 300.0
"""Seconds after which kube-scheduler retries a pod left unschedulable whatever happened
(podMaxInUnschedulablePodsDuration, 5 minutes): how long what we remember about a refused pod can matter."""

MAX_EXTENDER_PRIORITY = 10
"""MaxExtenderPriority in k8s.io/kube-scheduler/extender/v1: scores are 0..10."""


class _Wire(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class NodeList(_Wire):
    """A v1.NodeList, as sent when the extender is not `nodeCacheCapable`."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    items: list[Raw] | None = None


class ExtenderArgs(_Wire):
    """Body of filter and prioritize.

    `NodeNames` is checked to be a list here, and its items to be strings by `checked_names` (or, on
    filter's fast path, by their membership in a set of strings): checking 5,000 names up front cost a
    tenth of a filter request (measured), and the fast path proves them strings anyway.
    """

    Pod: Raw
    Nodes: NodeList | None = None
    NodeNames: SkipValidation[list[str]] | None = None

    @field_validator("NodeNames", mode="before")
    @classmethod
    def _a_list(cls, value: Any) -> Any:
        if value is not None and type(value) is not list:
            raise PydanticCustomError("list_type", "Input should be a valid list")
        return value


class ExtenderFilterResult(_Wire):
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str]
    FailedAndUnresolvableNodes: dict[str, str]
    Error: str


class HostPriority(_Wire):
    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_PRIORITY)


HostPriorityList = TypeAdapter(list[HostPriority])


class ExtenderBindingArgs(_Wire):
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1)
    Node: str = Field(min_length=1)


class ExtenderBindingResult(_Wire):
    Error: str


class MetaPod(_Wire):
    UID: str


class MetaVictims(_Wire):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: int = 0


class Victims(_Wire):
    Pods: list[Raw] | None = None
    NumPDBViolations: int = 0


class ExtenderPreemptionArgs(_Wire):
    Pod: Raw
    NodeNameToVictims: dict[str, Victims | None] | None = None
    NodeNameToMetaVictims: dict[str, MetaVictims | None] | None = None


class ExtenderPreemptionResult(_Wire):
    NodeNameToMetaVictims: dict[str, MetaVictims]


def describe_error(error: ValidationError, prefix: str = "") -> str:
    """One line naming each wrong field, e.g. `NodeNames.3: Input should be a valid string`."""
    parts = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in (prefix, *problem["loc"]) if part != "") or "body"
        parts.append(f"{where}: {problem['msg']}")
    return "; ".join(parts)


_NAMES = TypeAdapter(list[str], config=ConfigDict(strict=True))


class InvalidArgs(Exception):
    """A request that passed the first checks but holds a wrong item; the message names it."""


def checked_names(names: list[Any]) -> list[str]:
    """`names`, once every item is known to be a string; else InvalidArgs naming the first that is not."""
    try:
        return _NAMES.validate_python(names)
    except ValidationError as error:
        raise InvalidArgs(f"invalid ExtenderArgs: {describe_error(error, prefix='NodeNames')}") from None


def requested_names(args: ExtenderArgs, checked: bool = True) -> list[str]:
    """The node names asked about, from whichever form the scheduler used.

    With `checked=False` the items of `NodeNames` are not checked to be strings: the caller proves it.
    """
    if args.NodeNames is not None:
        return checked_names(args.NodeNames) if checked else args.NodeNames
    if args.Nodes is not None and args.Nodes.items:
        return [objects.name(node) for node in args.Nodes.items]
    return []


def filter_reply(
    args: ExtenderArgs,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> Raw:
    """An ExtenderFilterResult in the form the request used (names, whole nodes, or both)."""
    reply: Raw = {
        "NodeNames": None,
        "Nodes": None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if args.Nodes is not None:
        keep = set(passed)
        items = [node for node in args.Nodes.items or () if objects.name(node) in keep]
        reply["Nodes"] = {"metadata": {}, "items": items}
    if args.NodeNames is not None or args.Nodes is None:
        reply["NodeNames"] = passed
    return reply


class HostPriorityEntry(TypedDict):
    """One entry of a HostPriorityList as sent: the policy keeps these per node between requests (never
    mutate one)."""

    Host: str
    Score: int


def host_priority(host: str, score: int) -> HostPriorityEntry:
    return {"Host": host, "Score": score}


def binding_reply(error: str = "") -> Raw:
    return {"Error": error}


def preemption_reply(kept: dict[str, list[str]], violations: dict[str, int]) -> Raw:
    return {
        "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations.get(node, 0)}
            for node, uids in kept.items()
        }
    }


def preemption_candidates(args: ExtenderPreemptionArgs) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Victim UIDs per candidate node (from either form) and PDB violations per node."""
    candidates: dict[str, list[str]] = {}
    violations: dict[str, int] = {}
    if args.NodeNameToMetaVictims is not None:
        for node, meta in args.NodeNameToMetaVictims.items():
            candidates[node] = [pod.UID for pod in (meta.Pods or ())] if meta else []
            violations[node] = meta.NumPDBViolations if meta else 0
    elif args.NodeNameToVictims is not None:
        for node, victims in args.NodeNameToVictims.items():
            pods = (victims.Pods or []) if victims else []
            candidates[node] = [objects.uid(pod) for pod in pods]
            violations[node] = victims.NumPDBViolations if victims else 0
    return candidates, violations
