"""What a pod is given, as a quota counts it: memory, compute and GPUs, per GPU model (`Charge`).

HAMi counts what each container is given, collapsed over init containers (`holds.Allocation.uses`); a GPU's
model is the node's name for it, so a limit for one model counts only those GPUs (`limits.counts_model`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender.core.devices import Device
from extender.core.holds import Allocation
from extender.core.quota.limits import Limit, Resource, counts_model

Amounts = tuple[int, int, int]
"""Memory, compute, GPUs."""
RESOURCE_INDEX = {Resource.MEMORY: 0, Resource.COMPUTE: 1, Resource.GPUS: 2}


def part(amounts: Amounts, resource: Resource) -> int:
    """What of `amounts` a limit of this resource counts."""
    return amounts[RESOURCE_INDEX[resource]]


@dataclass(frozen=True, slots=True)
class Charge:
    """What one pod is given, per GPU model, as a quota counts it."""

    models: tuple[tuple[str, Amounts], ...] = ()

    @classmethod
    def summed(cls, parts: Iterable[tuple[str, Amounts]]) -> Charge:
        """The charge of these (model, amounts), added up per model."""
        totals: dict[str, list[int]] = {}
        for model, amounts in parts:
            total = totals.setdefault(model, [0, 0, 0])
            for index, amount in enumerate(amounts):
                total[index] += amount
        return cls(tuple((model, (m, c, g)) for model, (m, c, g) in sorted(totals.items())))

    @classmethod
    def merged(cls, charges: Iterable[Charge]) -> Charge:
        """Several pods' charges as one."""
        return cls.summed(part for charge in charges for part in charge.models)

    def amount(self, limit: Limit) -> int:
        """What of it the limit counts."""
        return sum(part(amounts, limit.resource) for model, amounts in self.models if counts_model(limit, model))


NO_CHARGE = Charge()


def charge_of(allocation: Allocation, devices: Sequence[Device]) -> Charge:
    """What the allocation gives on GPUs of each model (`devices`: the node's; a GPU it does not have is of an
    unknown model, "")."""
    by_index = {device.index: device.model for device in devices}
    by_uuid = {device.uuid: device.model for device in devices if device.uuid}
    return Charge.summed(
        (by_index.get(use.index, "") if use.index >= 0 else by_uuid.get(use.uuid, ""), (use.memory, use.cores, 1))
        for use in allocation.uses
    )


def namespace_of(allocation: Allocation) -> str:
    return allocation.pod.partition("/")[0]
