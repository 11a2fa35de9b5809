"""A ResourceQuota's GPU keys, read with HAMi's rules (`read_quota`), and which GPU models a limit counts.

What each key means, and how a model is matched by its words, is the package's docstring. Reading never
raises: a key that cannot be read is listed with why (`Quota.unread`), and a quota with too many GPU keys is
`broken` as a whole (it then refuses every GPU pod of its namespace, saying so).
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field

from extender.core import objects
from extender.core.objects import Raw, as_object
from extender.core.protocols import QuotaResources
from extender.core.resources import InvalidQuantity, parse_count

PREFIX = "limits."
"""The only keys read, as HAMi reads them (`quota.go:291`)."""
MAX_LIMITS = 32
"""GPU keys one ResourceQuota may hold: a few resources times a few models. More is no quota anyone writes."""
MAX_NAMESPACE_LIMITS = 128
"""GPU keys all the ResourceQuotas of one namespace may hold: every filter of its pods reads each."""
MAX_KEY = 317
"""Characters of a key: the API's longest resource name (a 253-character prefix, `/`, 63 characters)."""
MAX_MODEL = 128
"""Characters of a model in a key (a resource name's part after its `/` is at most 63 in the API)."""
MAX_WORDS = 16
MAX_PROBLEMS = 8
"""Unread keys named per quota (the rest counted)."""
_WORD = re.compile(r"[^-_./ \t]+")


class Resource(enum.StrEnum):
    """What a limit counts (the `resource` label of the quota metrics)."""

    MEMORY = "memory"
    COMPUTE = "compute"
    GPUS = "gpus"


@dataclass(frozen=True, slots=True)
class Limit:
    """One GPU key of a ResourceQuota, read."""

    key: str
    """As written: `limits.nvidia.com/gpumem.A100`."""
    resource: Resource
    amount: int
    """In the protocol's unit: memory in its memory unit (the memory factor applied), compute in % of a GPU."""
    model: str = ""
    """The GPU model it counts, as written ("" for every GPU)."""
    words: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", model_words(self.model))


@dataclass(frozen=True, slots=True)
class Quota:
    """What one ResourceQuota says about GPUs."""

    namespace: str
    name: str
    limits: tuple[Limit, ...] = ()
    unread: tuple[str, ...] = ()
    """GPU keys that were not read, each with why (at most `MAX_PROBLEMS`, then how many more)."""
    broken: str = ""
    """Non-empty: the quota could not be read as a whole, and refuses every GPU pod of its namespace."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def model_words(model: str) -> tuple[str, ...]:
    """A model's words, upper-cased: `NVIDIA A100-SXM4-40GB` is (NVIDIA, A100, SXM4, 40GB)."""
    return tuple(word.upper() for word in _WORD.findall(model[:MAX_MODEL]))


@functools.lru_cache(maxsize=4096)
def _words_match(wanted: tuple[str, ...], model: str) -> bool:
    have = iter(model_words(model))
    return all(word in have for word in wanted)  # each found after the one before: a subsequence


def counts_model(limit: Limit, model: str) -> bool:
    """Whether the limit counts GPUs of this model: every word of its model, in order, is one of the GPU's."""
    return not limit.words or _words_match(limit.words, model[:MAX_MODEL])


def _resource_of(key: str, resources: QuotaResources) -> tuple[Resource, str | None] | None:
    """The resource a `limits.` key limits and the model it names (None for none); None for a key not ours."""
    if not key.startswith(PREFIX):
        return None
    rest = key[len(PREFIX) :]
    named = _names(resources)
    for name, resource in named:
        if rest == name:
            return resource, None
    for name, resource in sorted(named, key=lambda pair: -len(pair[0])):
        if rest.startswith(name + "."):
            return resource, rest[len(name) + 1 :]
    return None


def _names(resources: QuotaResources) -> list[tuple[str, Resource]]:
    pairs = ((resources.memory, Resource.MEMORY), (resources.cores, Resource.COMPUTE), (resources.gpus, Resource.GPUS))
    return [(name, resource) for name, resource in pairs if name]


def read_quota(obj: Raw, resources: QuotaResources) -> Quota:
    """The GPU keys of a ResourceQuota object (`spec.hard`), read with HAMi's rules; never raises."""
    namespace, name = objects.namespace(obj), objects.name(obj)
    hard = as_object(as_object(obj.get("spec")).get("hard"))
    limits: list[Limit] = []
    unread: list[str] = []
    found = 0
    for key, value in hard.items():
        if not isinstance(key, str):
            continue
        resource = _resource_of(key, resources)
        if resource is None:
            continue
        found += 1
        if found > MAX_LIMITS:
            continue
        kind, model = resource
        if len(key) > MAX_KEY:
            unread.append(f"{key[:80]}...: longer than a resource name can be ({MAX_KEY} characters)")
            continue
        if model is not None and (len(model) > MAX_MODEL or not 0 < len(model_words(model)) <= MAX_WORDS):
            unread.append(
                f"{key[:80]}: no GPU model after the resource (1 to {MAX_WORDS} words, {MAX_MODEL} characters)"
            )
            continue
        try:
            amount = parse_count(value)
        except InvalidQuantity as error:
            unread.append(f"{key}: {error}; HAMi reads only whole numbers too")  # key: at most MAX_KEY
            continue
        if kind is Resource.MEMORY and resources.memory_factor > 1:
            amount *= resources.memory_factor
        limits.append(Limit(key, kind, amount, model or ""))
    broken = ""
    if found > MAX_LIMITS:
        broken = f"has {found} GPU keys, more than the {MAX_LIMITS} the extender reads"
        limits = []
    if len(unread) > MAX_PROBLEMS:
        unread[MAX_PROBLEMS:] = [f"and {len(unread) - MAX_PROBLEMS} more"]
    return Quota(namespace, name, tuple(sorted(limits, key=lambda limit: limit.key)), tuple(unread), broken)
