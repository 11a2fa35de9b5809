"""Quantities, resource names, a pod's demand and a node's devices: pure functions over Kubernetes dicts.

Everything here reads plain Kubernetes JSON (as decoded by orjson) and returns small frozen values. It never
does I/O and never keeps state: the cache (`cluster.py`) calls it once per object change, not per request.

Units: GPU memory is counted in the device plugin's own units (the gpushare plugin advertises
`aliyun.com/gpu-mem: 16` for 16 GiB), so quantities are whole numbers and `Profile.memory_unit` only names
them in messages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

from extender.core import objects
from extender.core.objects import Raw, as_object, pod_key


class InvalidQuantity(Exception):
    """A resource quantity that is not a whole, non-negative Kubernetes quantity."""


class InvalidPod(Exception):
    """A pod whose GPU request cannot be understood; the message names the container and the value."""


@dataclass(frozen=True, slots=True)
class Profile:
    """Which resource names and annotation keys a device plugin uses.

    The default is the gpushare device plugin's, so a cluster can swap its extender for ours without touching
    the nodes. Another plugin is served by another profile built from settings.
    """

    memory_resource: str = "aliyun.com/gpu-mem"
    """Node total and pod demand of GPU memory, in the plugin's units."""
    count_resource: str = "aliyun.com/gpu-count"
    """Number of GPUs on a node; on a pod, how many GPUs its memory is split over (1 when absent)."""
    memory_unit: str = "GiB"
    """How messages name one unit of `memory_resource`."""
    index_annotation: str = "ALIYUN_COM_GPU_MEM_IDX"
    """Pod: the device index, for single-device allocations (what the gpushare plugin reads)."""
    pod_memory_annotation: str = "ALIYUN_COM_GPU_MEM_POD"
    """Pod: the memory the pod was given, in total."""
    device_memory_annotation: str = "ALIYUN_COM_GPU_MEM_DEV"
    """Pod: the capacity of the device it was given."""
    assigned_annotation: str = "ALIYUN_COM_GPU_MEM_ASSIGNED"
    """Pod: "false" when we write it; the plugin sets "true" once the container gets the device."""
    assume_time_annotation: str = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
    """Pod: when we decided, in Unix nanoseconds; the reservation's TTL counts from here after a restart."""
    indexes_annotation: str = "gpu-extender.io/device-indexes"
    """Pod: every device index, comma-separated; the only record of multi-device allocations."""
    node_annotation: str = "gpu-extender.io/node"
    """Pod: the node we reserved on, so a reservation made before a crash is found again before binding."""
    node_devices_annotation: str = "gpu-extender.io/devices"
    """Node: JSON list of devices, `[{"index": 0, "memory": 16, "healthy": true}, ...]`, overriding capacity."""

    @property
    def managed_resources(self) -> tuple[str, ...]:
        """The resources whose pods the scheduler must send us."""
        return (self.memory_resource,)


# --- quantities -------------------------------------------------------------------------------------------

MAX_QUANTITY = 2**63 - 1
"""The largest quantity the API server holds as an integer (int64): nothing larger can be a device count."""

_QUANTITY = re.compile(
    r"([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E))?", re.ASCII
)
"""Kubernetes' grammar (`<signedNumber><suffix>`, suffix a binary or decimal SI suffix or a decimal exponent),
ASCII digits only; no surrounding spaces, as the API server."""
_DECIMAL_SUFFIX = {"": 0, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_MAX_DIGITS = len(str(MAX_QUANTITY))
_FAST_DIGITS = _MAX_DIGITS - 1
"""Plain ASCII digit strings this short are below MAX_QUANTITY: read at once."""
_EXPONENT_DIGITS = 6
"""An exponent longer than this (after its leading zeros) is decided by its sign alone: too large or a fraction."""


def parse_count(value: object) -> int:
    """A whole, non-negative Kubernetes quantity ("16", "2k", "1Gi", "1e3", 4) as an int, at most MAX_QUANTITY.

    Extended resources are integers in Kubernetes; a fraction, a negative number, a magnitude beyond int64 or
    garbage is refused with InvalidQuantity, whose message quotes the value. Bounded work whatever the input:
    the magnitude is judged from the count of digits and the exponent before any number is built, so neither
    `"1e999999"` nor a 5,000-digit string costs more than reading its characters.
    """
    if type(value) is str and len(value) <= _FAST_DIGITS and value.isdigit() and value.isascii():
        return int(value)  # "16": nearly every quantity a device plugin sees
    if isinstance(value, bool):
        raise InvalidQuantity(f"{_quote(value)} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise InvalidQuantity(f"{_quote(value)} is negative")
        if value > MAX_QUANTITY:
            raise InvalidQuantity(f"{_quote(value)} is {_TOO_LARGE}")
        return value
    if isinstance(value, float):
        return _parse_text(repr(value), value)  # 4.0 -> "4.0", 1e300 -> "1e+300", inf -> "inf" (refused)
    if not isinstance(value, str):
        raise InvalidQuantity(f"{_quote(value)} is not a quantity")
    return _parse_text(value, value)


def _parse_text(text: str, value: object) -> int:
    """`text` read as a quantity; messages quote `value`, what the caller was given."""
    match = _QUANTITY.fullmatch(text)
    if match is None or not (match.group(2) or match.group(3)):
        raise InvalidQuantity(f"{_quote(value)} is not a quantity")
    sign, whole, fraction, exponent, suffix = match.groups()
    fraction = fraction or ""
    digits = (whole + fraction).lstrip("0")
    if not digits:
        return 0  # zero, whatever its sign, exponent or suffix
    if sign == "-":
        raise InvalidQuantity(f"{_quote(value)} is negative")
    significant = digits.rstrip("0")
    power = len(digits) - len(significant) - len(fraction)  # value = significant x 10**power x 2**twos
    twos = _BINARY_SUFFIX.get(suffix or "", 0)
    power += _DECIMAL_SUFFIX.get(suffix or "", 0)
    if exponent is not None:
        magnitude = exponent.lstrip("+-").lstrip("0")
        if len(magnitude) > _EXPONENT_DIGITS:
            negative = exponent.startswith("-")
            raise InvalidQuantity(f"{_quote(value)} is {'not a whole number' if negative else _TOO_LARGE}")
        power += int(exponent)
    # significant >= 10**(len - 1), and 2**twos >= 10**(twos * 0.30103): beyond 10**19 > MAX_QUANTITY at once.
    if len(significant) - 1 + power + (twos * 30103) // 100000 >= _MAX_DIGITS:
        raise InvalidQuantity(f"{_quote(value)} is {_TOO_LARGE}")
    number: int
    if power >= 0:
        number = int(significant) * 10**power << twos
    else:
        # value = significant x 2**twos / 10**shift. significant ends in no zero, so it holds no 2 if it holds
        # a 5: 5**shift must divide it and 2**shift come from the binary suffix. So shift <= twos <= 60, and by
        # the test above significant has under 80 digits.
        shift = -power
        if shift > twos:
            raise InvalidQuantity(f"{_quote(value)} is not a whole number")
        number, remainder = divmod(int(significant), 5**shift)
        if remainder:
            raise InvalidQuantity(f"{_quote(value)} is not a whole number")
        number <<= twos - shift
    if number > MAX_QUANTITY:
        raise InvalidQuantity(f"{_quote(value)} is {_TOO_LARGE}")
    return number


_TOO_LARGE = f"too large (more than {MAX_QUANTITY})"
_QUOTED_CHARACTERS = 40
"""A quantity quoted in a message is cut to this many characters (a 5,000-digit one would fill the log)."""


def _quote(value: object) -> str:
    if isinstance(value, int) and value.bit_length() > 256:  # repr of a huge int is slow, and refused past 4,300 digits
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    if len(text) <= _QUOTED_CHARACTERS:
        return text
    return f"{text[:_QUOTED_CHARACTERS]}... ({len(text)} characters)"


# --- a pod's demand ---------------------------------------------------------------------------------------


def ceil_div(amount: int, parts: int) -> int:
    """`amount / parts` rounded up, in integers (a float would overflow on a huge quantity)."""
    return -(-amount // parts)


@dataclass(frozen=True, slots=True)
class Demand:
    """What a pod asks of one node: `devices` GPUs with `per_device` memory on each."""

    memory: int
    """Total GPU memory, as the device plugin and kubelet account it."""
    devices: int = 1
    per_device: int = field(init=False, compare=False)
    """Memory needed on each device; rounded up so a split never gives less than asked. Stored, not a
    property: the filter reads it once per request and the policy's caches key on it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_device", ceil_div(self.memory, self.devices) if self.devices else 0)

    @property
    def is_zero(self) -> bool:
        return self.memory == 0


NO_DEMAND = Demand(memory=0, devices=1)


def _container_amount(pod: Raw, container: Raw, resource: str, kind: str) -> int:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidPod(f"{_where(pod, container, kind)}: resources must be an object")
    for section in ("limits", "requests"):
        table = resources.get(section) or {}
        if not isinstance(table, dict):
            raise InvalidPod(f"{_where(pod, container, kind)}: resources.{section} must be an object")
        if resource in table:
            try:
                return parse_count(table[resource])
            except InvalidQuantity as error:
                raise InvalidPod(f"{_where(pod, container, kind)}: {section} {resource} {error}") from None
    return 0


def _where(pod: Raw, container: Raw, kind: str) -> str:
    return f"pod {pod_key(pod)} {kind} {container.get('name', '?')}"


def _pod_amount(pod: Raw, resource: str) -> int:
    """Effective pod amount of one resource, by Kubernetes' rule: max(sum of containers, largest init)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise InvalidPod("Pod.spec is missing or not an object")
    total = 0
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise InvalidPod("Pod.spec.containers must be a list")
    for container in containers:
        if not isinstance(container, dict):
            raise InvalidPod("Pod.spec.containers must hold objects")
        total += _container_amount(pod, container, resource, "container")
    init_largest = 0
    init_containers = spec.get("initContainers") or []
    if not isinstance(init_containers, list):
        raise InvalidPod("Pod.spec.initContainers must be a list")
    for container in init_containers:
        if not isinstance(container, dict):
            raise InvalidPod("Pod.spec.initContainers must hold objects")
        init_largest = max(init_largest, _container_amount(pod, container, resource, "init container"))
    return max(total, init_largest)


_POD_OBJECTS = ("metadata", "spec", "status")


def pod_demand(pod: Raw, profile: Profile) -> Demand:
    """The pod's GPU demand; raises InvalidPod naming the field, container or value that cannot be read.

    Also checks the shape of the parts of a pod the extender reads later (metadata and its annotations,
    status), so one check at the door keeps every later reader from meeting a string where an object was.
    """
    for name in _POD_OBJECTS:
        if name in pod and not isinstance(pod[name], dict):
            raise InvalidPod(f"Pod.{name} must be an object")
    meta = pod.get("metadata") or {}
    for name in ("annotations", "labels"):
        if name in meta and meta[name] is not None and not isinstance(meta[name], dict):
            raise InvalidPod(f"Pod.metadata.{name} must be an object")
    memory = _pod_amount(pod, profile.memory_resource)
    if memory == 0:
        return NO_DEMAND
    devices = _pod_amount(pod, profile.count_resource) or 1
    return Demand(memory=memory, devices=devices)


# --- a node's devices -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU: its index as the device plugin numbers it, and its memory (0 when unhealthy)."""

    index: int
    capacity: int
    healthy: bool = True


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """The devices of a node, and why there are none when there are none."""

    devices: tuple[Device, ...]
    unreadable: str = ""
    """Non-empty when the node advertises GPUs we could not read: shown in /inspect and in filter reasons."""


MAX_DEVICES = 256
"""More GPUs than any machine has: a node claiming more is misreporting (and building a list of, say, 10**400
devices would stop the service), so its devices are ignored and the reason shown."""


def node_devices(node: Raw, profile: Profile) -> NodeDevices:
    """Devices from the per-device annotation when present and valid, else from capacity."""
    listed = objects.annotations_of(node).get(profile.node_devices_annotation)
    unreadable = ""
    if listed is not None:
        try:
            return NodeDevices(_devices_from_annotation(listed))
        except ValueError as error:
            unreadable = f"annotation {profile.node_devices_annotation} ignored: {error}; "
    capacity = as_object(as_object(node.get("status")).get("capacity"))
    if profile.memory_resource not in capacity:
        return NodeDevices((), unreadable + f"no {profile.memory_resource} in capacity")
    try:
        memory = parse_count(capacity[profile.memory_resource])
        count = parse_count(capacity.get(profile.count_resource, 0))
    except InvalidQuantity as error:
        return NodeDevices((), unreadable + f"capacity unreadable: {error}")
    if count == 0:
        return NodeDevices((), unreadable + f"{profile.memory_resource} {memory} but no {profile.count_resource}")
    if count > MAX_DEVICES:
        return NodeDevices((), unreadable + f"{profile.count_resource} {count} is more than {MAX_DEVICES} GPUs: ignored")
    each = memory // count
    return NodeDevices(tuple(Device(index, each) for index in range(count)), unreadable.rstrip("; "))


def _devices_from_annotation(text: str) -> tuple[Device, ...]:
    try:
        entries = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ValueError("not JSON") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError("expected a non-empty list of devices")
    if len(entries) > MAX_DEVICES:
        raise ValueError(f"{len(entries)} devices is more than {MAX_DEVICES}")
    devices: list[Device] = []
    seen: set[int] = set()
    for entry in entries:
        if not isinstance(entry, dict) or "index" not in entry or "memory" not in entry:
            raise ValueError('each device needs "index" and "memory"')
        index = entry["index"]
        if not isinstance(index, int) or isinstance(index, bool) or index < 0 or index in seen:
            raise ValueError(f"bad or repeated device index {index!r}")
        seen.add(index)
        try:
            memory = parse_count(entry["memory"])
        except InvalidQuantity as error:
            raise ValueError(f"device {index} memory {error}") from None
        healthy = entry.get("healthy", True) is not False
        devices.append(Device(index, memory if healthy else 0, healthy))
    return tuple(sorted(devices, key=lambda device: device.index))


def node_ready(node: Raw) -> bool:
    """True unless the node reports condition Ready other than True (no conditions: trust the scheduler)."""
    conditions = as_object(node.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True
