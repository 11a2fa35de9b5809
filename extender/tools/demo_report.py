"""What `extender demo` makes of the service's replies: placements and checks read off `GET /inspect`, and the
report's lines.

It exists so the report can be read (and tested) apart from the HTTP that produced it. Pure functions over
the decisions and the decoded /inspect report: it must never send a request, read the cache, or print.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from extender.core.objects import Raw
from extender.tools.demo_burst import BurstPod
from extender.tools.demo_scheduler import Decision
from extender.tools.inspect import BAR_WIDTH, bar, count

Placement = tuple[str, tuple[int, ...]]
"""Where /inspect shows a pod: its node and the indexes of the GPUs it holds."""

VERBS = ("filter", "prioritize", "bind", "inspect")
"""The order of the latency lines."""
WIDTH = 100
"""Columns the report fits in."""


# --- what /inspect shows ----------------------------------------------------------------------------------


def placements(inspection: Raw) -> dict[str, Placement]:
    """Pod UID -> (node, device indexes), from GET /inspect."""
    found: dict[str, tuple[str, list[int]]] = {}
    for node in inspection["nodes"]:
        for device in node["devices"]:
            for holder in device["pods"]:
                found.setdefault(holder["uid"], (node["name"], []))[1].append(device["index"])
    return {uid: (node, tuple(sorted(indexes))) for uid, (node, indexes) in found.items()}


def over_capacity(inspection: Raw) -> list[str]:
    """Every GPU holding more than its capacity (or memory on a GPU the node lacks), as messages."""
    problems = []
    for node in inspection["nodes"]:
        for device in node["devices"]:
            if device["used"] > device["capacity"]:
                problems.append(f"{node['name']} GPU {device['index']}: used {device['used']} > {device['capacity']}")
        if node.get("stray"):
            problems.append(f"{node['name']}: {node['stray']} held on GPUs it does not have")
    return problems


def misplaced(burst: list[BurstPod], decisions: Mapping[str, Decision], where: Mapping[str, Placement]) -> list[str]:
    """Every pod bound to one node that /inspect shows elsewhere (or nowhere), as messages."""
    problems = []
    for pod in burst:
        node = decisions[pod.uid].node
        shown = where.get(pod.uid, ("nowhere",))[0]
        if node and shown != node:
            problems.append(f"{pod.key} was bound to {node} but /inspect shows it on {shown}")
    return problems


# --- the report -------------------------------------------------------------------------------------------


def fit(line: str) -> str:
    """The line cut to `WIDTH` columns, with `...` where it was cut."""
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def fill_table(inspection: Raw) -> list[str]:
    """One line per GPU of every listed node: capacity, used, free, a fill bar, the percent used, pods."""
    unit = inspection.get("unit", "GiB")
    fill = "fill"
    lines = [f"  {'node':<13} {'GPU':>3} {'capacity':>9} {'used':>5} {'free':>5}  {fill:<{BAR_WIDTH + 7}} {'pods':>4}"]
    for node in inspection["nodes"]:
        if not node["known"]:
            continue
        name = node["name"]
        if not node["devices"]:
            lines.append(f"  {name:<13} {'-':>3}  no GPUs{': ' + node['problem'] if node['problem'] else ''}")
            continue
        for position, device in enumerate(node["devices"]):
            label = name if position == 0 else ""
            capacity, used, free = device["capacity"], device["used"], device["free"]
            if not device["healthy"]:
                lines.append(f"  {label:<13} {device['index']:>3} {'-':>9} {'-':>5} {'-':>5}  unhealthy")
                continue
            percent = f"{100 * used // capacity}%" if capacity else "-"
            lines.append(
                f"  {label:<13} {device['index']:>3} {capacity:>5} {unit} {used:>5} {free:>5}  "
                f"{bar(used, capacity)} {percent:>4} {len(device['pods']):>4}"
            )
    return [fit(line) for line in lines]


def why_not(decision: Decision, nodes: int) -> list[str]:
    """Why a pod has no node: the filter's verdict over all nodes, then the most common reason."""
    attempt = f"attempt {decision.attempts}: " if decision.attempts > 1 else ""
    if decision.error:
        return ["NOT PLACED", f"{attempt}{decision.error}"]
    if len(decision.unresolvable) == nodes:
        verdict = f"unresolvable on all {count(nodes, 'node')} (preemption cannot help)"
    else:
        no_room = len(set(decision.failed) - set(decision.unresolvable))
        verdict = f"no room now on {count(no_room, 'node')}, unresolvable on {len(decision.unresolvable)}"
    # The nodes without room now are the ones that could take the pod later: their reasons matter most.
    no_room_now = {node: why for node, why in decision.failed.items() if node not in decision.unresolvable}
    reasons = Counter((no_room_now or decision.unresolvable).values())
    if not reasons:
        return [f"NOT PLACED: {verdict}"]
    reason, saying = min(reasons.items(), key=lambda pair: (-pair[1], pair[0]))
    return [f"NOT PLACED: {verdict}", f"{attempt}{count(saying, 'node')} {'says' if saying == 1 else 'say'}: {reason}"]


def pod_lines(
    burst: list[BurstPod],
    decisions: Mapping[str, Decision],
    where: Mapping[str, Placement],
    nodes: int,
) -> list[str]:
    """One line per pod of the burst: where /inspect shows it, or why it has no node."""
    lines = []
    for pod in burst:
        decision = decisions[pod.uid]
        head = f"  {pod.key:<16} {pod.size:>9}  "
        if decision.node:
            node, indexes = where.get(pod.uid, (decision.node, ()))
            gpus = ",".join(map(str, indexes)) or "?"
            retried = f"  (bound on attempt {decision.attempts})" if decision.attempts > 1 else ""
            lines.append(fit(f"{head}-> {node:<13} GPU {gpus}{retried}"))
            continue
        first, *rest = why_not(decision, nodes)
        lines.append(fit(f"{head}{first}"))
        lines.extend(fit(" " * 8 + line) for line in rest)
    return lines


def latency_lines(latency: Mapping[str, list[float]]) -> list[str]:
    """Per verb: how many requests, the median and the slowest."""
    lines = []
    for verb, times in sorted(latency.items(), key=lambda pair: VERBS.index(pair[0]) if pair[0] in VERBS else 9):
        ordered = sorted(times)
        median, slowest = ordered[len(ordered) // 2] * 1000, ordered[-1] * 1000
        lines.append(f"{verb:<11} {len(ordered):>4}   median {median:5.1f} ms   max {slowest:5.1f} ms")
    return lines
