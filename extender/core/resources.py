"""Kubernetes quantities and resources as every device protocol reads them: pure functions over dicts.

Quantities are parsed within bounded work (`parse_count`); a container's amount of a resource is its limit,
else its request; a pod's is Kubernetes' effective amount. Everything here reads plain Kubernetes JSON (as
decoded by orjson) and returns small values. It never does I/O and never keeps state: the cache calls it once
per object change, not per request. What a protocol makes of these amounts is `protocols/`.
"""

from __future__ import annotations

import re

from extender.core.objects import Raw, as_object, pod_key


class InvalidQuantity(Exception):
    """A resource quantity that is not a whole, non-negative Kubernetes quantity."""


class InvalidPod(Exception):
    """A pod whose GPU request cannot be understood; the message names the container and the value."""


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


def parse_count(value: object, scale: int = 0) -> int:
    """A whole, non-negative Kubernetes quantity ("16", "2k", "1Gi", "1e3", 4) as an int, at most MAX_QUANTITY.

    Extended resources are integers in Kubernetes; a fraction, a negative number, a magnitude beyond int64 or
    garbage is refused with InvalidQuantity, whose message quotes the value. Bounded work whatever the input:
    the magnitude is judged from the count of digits and the exponent before any number is built, so neither
    `"1e999999"` nor a 5,000-digit string costs more than reading its characters.

    `scale` counts the value in units of 10**-scale: `parse_count("250m", scale=3)` is 250 millicores, and
    `parse_count("1.5", scale=3)` 1500 (`parse_milli`).
    """
    if type(value) is str and len(value) <= _FAST_DIGITS and value.isdigit() and value.isascii():
        number = int(value)  # "16": nearly every quantity a device plugin sees
        return _bounded(number, scale, value) if scale else number
    if isinstance(value, bool):
        raise InvalidQuantity(f"{_quote(value)} is not a quantity")
    if isinstance(value, int):
        if value < 0:
            raise InvalidQuantity(f"{_quote(value)} is negative")
        if value > MAX_QUANTITY:
            raise InvalidQuantity(f"{_quote(value)} is {_TOO_LARGE}")
        return _bounded(value, scale, value)
    if isinstance(value, float):
        return _parse_text(repr(value), value, scale)  # 4.0 -> "4.0", 1e300 -> "1e+300", inf -> "inf" (refused)
    if not isinstance(value, str):
        raise InvalidQuantity(f"{_quote(value)} is not a quantity")
    return _parse_text(value, value, scale)


def parse_milli(value: object) -> int:
    """A non-negative quantity in thousandths, as kube-scheduler counts cpu: "250m" -> 250, "2" -> 2000; a
    finer fraction ("0.0005") is refused, as the API server would round it up and we cannot know how."""
    return parse_count(value, scale=3)


def _bounded(number: int, scale: int, value: object) -> int:
    """`number` x 10**scale, refused beyond MAX_QUANTITY (`value` is what the message quotes)."""
    number *= 10**scale
    if number > MAX_QUANTITY:
        raise InvalidQuantity(f"{_quote(value)} is {_TOO_LARGE}")
    return number


def _parse_text(text: str, value: object, scale: int = 0) -> int:
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
    power += _DECIMAL_SUFFIX.get(suffix or "", 0) + scale
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


# --- a pod's amounts -------------------------------------------------------------------------------------


def container_amount(pod: Raw, container: Raw, resource: str, kind: str) -> int | None:
    """The container's amount of one resource, its limit first, then its request; None when it asks none."""
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise InvalidPod(f"{where(pod, container, kind)}: resources must be an object")
    for section in ("limits", "requests"):
        table = resources.get(section) or {}
        if not isinstance(table, dict):
            raise InvalidPod(f"{where(pod, container, kind)}: resources.{section} must be an object")
        if resource in table:
            try:
                return parse_count(table[resource])
            except InvalidQuantity as error:
                raise InvalidPod(f"{where(pod, container, kind)}: {section} {resource} {error}") from None
    return None


def where(pod: Raw, container: Raw, kind: str) -> str:
    """Names a container in a refusal: "pod <namespace>/<name> <kind> <container name>"."""
    return f"pod {pod_key(pod)} {kind} {container.get('name', '?')}"


def containers(pod: Raw) -> list[tuple[Raw, str]]:
    """The pod's init containers, then its containers, each with its kind ("init container", "container")."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise InvalidPod("Pod.spec is missing or not an object")
    found: list[tuple[Raw, str]] = []
    for field_name, kind in (("initContainers", "init container"), ("containers", "container")):
        listed = spec.get(field_name) or []
        if not isinstance(listed, list):
            raise InvalidPod(f"Pod.spec.{field_name} must be a list")
        for container in listed:
            if not isinstance(container, dict):
                raise InvalidPod(f"Pod.spec.{field_name} must hold objects")
            found.append((container, kind))
    return found


def pod_amount(pod: Raw, resource: str) -> int:
    """Effective pod amount of one resource, by Kubernetes' rule: max(sum of containers, largest init)."""
    total = init_largest = 0
    for container, kind in containers(pod):
        amount = container_amount(pod, container, resource, kind) or 0
        if kind == "container":
            total += amount
        else:
            init_largest = max(init_largest, amount)
    return max(total, init_largest)


_POD_OBJECTS = ("metadata", "spec", "status")


def check_pod_shape(pod: Raw) -> None:
    """Refuse (InvalidPod) a pod whose parts the extender reads later are not objects (metadata and its
    annotations, status): one check at the door keeps every later reader from meeting a string there."""
    for name in _POD_OBJECTS:
        if name in pod and not isinstance(pod[name], dict):
            raise InvalidPod(f"Pod.{name} must be an object")
    meta = pod.get("metadata") or {}
    for name in ("annotations", "labels"):
        if name in meta and meta[name] is not None and not isinstance(meta[name], dict):
            raise InvalidPod(f"Pod.metadata.{name} must be an object")


# --- a node -----------------------------------------------------------------------------------------------


MAX_DEVICES = 256
"""More GPUs than any machine has: a node claiming more is misreporting (and building a list of, say, 10**400
devices would stop the service), so its devices are ignored and the reason shown."""


def node_ready(node: Raw) -> bool:
    """True unless the node reports condition Ready other than True (no conditions: trust the scheduler)."""
    conditions = as_object(node.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True


# --- what kube-scheduler counts: cpu and memory -----------------------------------------------------------


def _quantity(owner: Raw, sections: tuple[str, ...], resource: str, scale: int) -> int:
    """`resource` read from the first of `owner`'s `sections` that names it; 0 when none does, or it cannot be
    read (bookkeeping only: the API server validated it)."""
    for section in sections:
        table = as_object(owner.get(section))
        if resource in table:
            try:
                return parse_count(table[resource], scale)
            except InvalidQuantity:
                return 0
    return 0


def pod_request(pod: Raw, resource: str, scale: int = 0) -> int:
    """What kube-scheduler counts of `resource` (cpu with `scale=3`: millicores; memory: bytes) for the pod:
    max(sum of its containers' requests, largest init container's) plus `spec.overhead`. A container's limit
    alone is its request (the API server copies it).

    Bookkeeping for the placement policy, never a reason to refuse a pod: the API server has validated these
    quantities, and one that still cannot be read counts 0. Sidecar init containers are counted as plain init
    containers (their share of the sum is kube-scheduler's refinement, not ours to repeat).
    """
    try:
        listed = containers(pod)
    except InvalidPod:
        return 0
    total = init_largest = 0
    for container, kind in listed:
        amount = _quantity(as_object(container.get("resources")), ("requests", "limits"), resource, scale)
        if kind == "container":
            total += amount
        else:
            init_largest = max(init_largest, amount)
    return max(total, init_largest) + _quantity(as_object(pod.get("spec")), ("overhead",), resource, scale)


def node_allocatable(node: Raw, resource: str, scale: int = 0) -> int:
    """The node's allocatable `resource` (its capacity when it reports no allocatable), 0 when unreadable."""
    return _quantity(as_object(node.get("status")), ("allocatable", "capacity"), resource, scale)


MAX_MODELS = 64
"""Values read from one node-affinity term: more would be no GPU model list anyone writes."""


def required_values(pod: Raw, label: str) -> tuple[str, ...]:
    """The values of node label `label` the pod requires (its nodeSelector, or `In` expressions in every term
    of its required node affinity); empty when it requires none of them. Terms are ORed by Kubernetes: a term
    that does not restrict the label lets any value, so then the pod requires none."""
    spec = as_object(pod.get("spec"))
    selected = as_object(spec.get("nodeSelector")).get(label)
    allowed: set[str] | None = {selected} if isinstance(selected, str) else None
    affinity = as_object(as_object(spec.get("affinity")).get("nodeAffinity"))
    required = as_object(affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if isinstance(terms, list) and terms:
        union: set[str] = set()
        for term in terms[:MAX_MODELS]:
            values = _term_values(as_object(term), label)
            if values is None:
                union = set()
                break
            union |= values
        if union:
            allowed = union if allowed is None else allowed & union
    return tuple(sorted(allowed)) if allowed else ()


def _term_values(term: Raw, label: str) -> set[str] | None:
    """The values one node selector term allows for `label`, or None when it does not restrict it."""
    expressions = term.get("matchExpressions")
    found: set[str] | None = None
    for expression in expressions[:MAX_MODELS] if isinstance(expressions, list) else ():
        expression = as_object(expression)
        if expression.get("key") != label or expression.get("operator") != "In":
            continue
        values = expression.get("values")
        listed = (
            {value for value in values[:MAX_MODELS] if isinstance(value, str)} if isinstance(values, list) else set()
        )
        found = listed if found is None else found & listed
    return found
