"""What `extender demo` makes of the service's replies: placements and checks read off `GET /inspect`, and the
report's lines.

It exists so the report can be read (and tested) apart from the HTTP that produced it. Pure functions over
the decisions and the decoded /inspect report: it must never send a request, read the cache, or print.
What the report draws follows what /inspect carries: memory for every GPU; compute, pod slots and the model
beside it where the device plugin tracks them (HAMi), so a gpushare report is drawn as it always was.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping

from extender.core.objects import Raw
from extender.core.preemption import BEYOND_PREEMPTION
from extender.tools.demo_burst import BurstPod
from extender.tools.demo_scheduler import Decision
from extender.tools.inspect import BAR_WIDTH, bar, count, short_model

Placement = tuple[str, tuple[int, ...]]
"""Where /inspect shows a pod: its node and the indexes of the GPUs it holds."""

VERBS = ("filter", "prioritize", "bind", "inspect")
"""The order of the latency lines."""
WIDTH = 100
"""Columns the report fits in."""
SMALL_BAR = 10
"""Characters inside the fill bars of a GPU that tracks compute too (two bars share the line)."""


# --- what /inspect shows ----------------------------------------------------------------------------------


def holdings(inspection: Raw) -> dict[str, list[tuple[str, Raw, Raw]]]:
    """Pod UID -> what /inspect shows it holding: (node name, device, the device's entry for the pod) per GPU."""
    held: dict[str, list[tuple[str, Raw, Raw]]] = {}
    for node in inspection["nodes"]:
        for device in node["devices"]:
            for holder in device["pods"]:
                held.setdefault(holder["uid"], []).append((node["name"], device, holder))
    return held


def placements(inspection: Raw) -> dict[str, Placement]:
    """Pod UID -> (node, device indexes), from GET /inspect."""
    return {
        uid: (gpus[0][0], tuple(sorted(device["index"] for _, device, _ in gpus)))
        for uid, gpus in holdings(inspection).items()
    }


def tracks_more(inspection: Raw) -> bool:
    """Whether any GPU tracks compute or pod slots besides memory (HAMi)."""
    return any("cores" in device or "slots" in device for node in inspection["nodes"] for device in node["devices"])


def over_capacity(inspection: Raw) -> list[str]:
    """Every GPU holding more than its capacity in memory, compute or pod slots (or memory on a GPU the node
    lacks), as messages."""
    problems = []
    for node in inspection["nodes"]:
        for device in node["devices"]:
            gpu = f"{node['name']} GPU {device['index']}"
            if device["used"] > device["capacity"]:
                problems.append(f"{gpu}: used {device['used']} > {device['capacity']}")
            if "cores" in device and device["used_cores"] > device["cores"]:
                problems.append(f"{gpu}: compute used {device['used_cores']} % > {device['cores']} %")
            if "slots" in device and device["used_slots"] > device["slots"]:
                problems.append(f"{gpu}: {device['used_slots']} pods > its {device['slots']} slots")
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


def unasked(burst: list[BurstPod], decisions: Mapping[str, Decision], inspection: Raw) -> list[str]:
    """Every bound pod that /inspect shows holding other than it asked, as messages: the number of GPUs, the
    memory and compute on each, a GPU of its `use-gputype` (HAMi's pods)."""
    held = holdings(inspection)
    problems = []
    for pod in burst:
        if not decisions[pod.uid].node:
            continue
        gpus = held.get(pod.uid, [])
        if len(gpus) != pod.gpus:
            problems.append(f"{pod.key} asked {count(pod.gpus, 'GPU')} and holds {len(gpus)}")
        for _, device, holder in gpus:
            asked = (pod.memory_on(device["capacity"]), min(pod.cores, 100))
            if (holder["memory"], holder.get("cores", 0)) != asked:
                problems.append(
                    f"{pod.key} holds {holder['memory']} and {holder.get('cores', 0)} % on GPU {device['index']}, "
                    f"asked {asked[0]} and {asked[1]} %"
                )
            if pod.gpu_type.upper() not in str(device.get("model", "")).upper():
                problems.append(
                    f"{pod.key} asked for a {pod.gpu_type} GPU and holds GPU {device['index']}, a {device.get('model')}"
                )
    return problems


# --- the report -------------------------------------------------------------------------------------------


def fit(line: str) -> str:
    """The line cut to `WIDTH` columns, with `...` where it was cut."""
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


def wrap(line: str, indent: int) -> list[str]:
    """The line as it is when it fits in `WIDTH` columns, else broken between words, each further line indented
    by `indent` (a reason is worth reading whole)."""
    if len(line) <= WIDTH:
        return [line]
    return textwrap.wrap(line, WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False) or [line]


def fill_table(inspection: Raw) -> list[str]:
    """One line per GPU of every listed node: capacity, used, free, a fill bar, the percent used, pods (or, where
    GPUs track compute and slots too, `dimension_table`)."""
    if tracks_more(inspection):
        return dimension_table(inspection)
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


def dimension_table(inspection: Raw) -> list[str]:
    """One line per GPU of every listed node: its model, then used/capacity and a fill bar for memory and for
    compute, and pods against its slots; `cordoned` or `unhealthy` when it takes no new pods."""
    nodes = [node for node in inspection["nodes"] if node["known"]]
    devices = [device for node in nodes for device in node["devices"]]
    name = max([4, *(len(node["name"]) for node in nodes)])
    model = max([5, *(len(short_model(str(device.get("model", "")))) for device in devices)])
    digits = max([1, *(len(str(device["capacity"])) for device in devices)])
    memory_cell, compute_cell = 2 * digits + 1 + 1 + SMALL_BAR + 2, 3 + 1 + 3 + 1 + SMALL_BAR + 2
    memory_head = f"memory {inspection.get('unit', '')}".rstrip()
    lines = [
        f"  {'node':<{name}} {'GPU':>3}  {'model':<{model}}  {memory_head:<{memory_cell}}  "
        f"{'compute %':<{compute_cell}}  pods"
    ]
    for node in nodes:
        if not node["devices"]:
            problem = f": {node['problem']}" if node["problem"] else ""
            lines.extend(wrap(f"  {node['name']:<{name}} {'-':>3}  no GPUs{problem}", name + 9))
            continue
        for position, device in enumerate(node["devices"]):
            used, capacity = device["used"], device["capacity"]
            memory = f"{used:>{digits}}/{capacity:<{digits}} {bar(used, capacity, SMALL_BAR)}"
            compute = "-"
            if "cores" in device:
                cores, used_cores = device["cores"], device["used_cores"]
                compute = f"{used_cores:>3}/{cores:<3} {bar(used_cores, cores, SMALL_BAR)}"
            pods = f"{device['used_slots']:>2}/{device['slots']:<2}" if "slots" in device else str(len(device["pods"]))
            mark = "  unhealthy" if not device["healthy"] else "  cordoned" if device.get("cordoned") else ""
            label, kind = node["name"] if position == 0 else "", short_model(str(device.get("model", "")))
            lines.append(
                f"  {label:<{name}} {device['index']:>3}  {kind:<{model}}  {memory}  {compute:<{compute_cell}}  "
                f"{pods}{mark}"
            )
    return [fit(line) for line in lines]


def _total(inspection: Raw, field: str, tracked: str) -> int:
    """`field` summed over the GPUs of listed nodes that track `tracked`."""
    return sum(
        device[field]
        for node in inspection["nodes"]
        if node["known"]
        for device in node["devices"]
        if tracked in device
    )


def dimension_lines(before: Raw, after: Raw) -> list[str]:
    """The summary's lines for compute and pod slots where GPUs track them: in use after the burst against all
    there is, and before it."""
    lines = []
    cores, slots = _total(after, "cores", "cores"), _total(after, "slots", "slots")
    if cores:
        capacity, used = cores, _total(after, "used_cores", "cores")
        share = f"{100 * used // capacity}% of all GPUs' compute"
        lines.append(
            f"  compute   {used} of {capacity} % in use ({share}), {_total(before, 'used_cores', 'cores')} % before"
        )
    if slots:
        capacity, used = slots, _total(after, "used_slots", "slots")
        earlier = _total(before, "used_slots", "slots")
        lines.append(f"  slots     {used} of {capacity} pod slots in use ({100 * used // capacity}%), {earlier} before")
    return lines


def full_now(decision: Decision) -> dict[str, str]:
    """The nodes that refused the pod for lack of room now: those preemption could help (failed), and those the
    filter answered unresolvable only because no eviction could make room (`preemption.BEYOND_PREEMPTION`)."""
    full = {node: why for node, why in decision.failed.items() if node not in decision.unresolvable}
    for node, why in decision.unresolvable.items():
        for suffix in BEYOND_PREEMPTION:
            if why.endswith(suffix):
                full[node] = why.removesuffix(suffix)
    return full


def never_fits(decision: Decision, nodes: int) -> bool:
    """Whether no node could ever hold the pod (not merely none now)."""
    return len(decision.unresolvable) == nodes and not full_now(decision)


def why_not(decision: Decision, nodes: int) -> list[str]:
    """Why a pod has no node: the filter's verdict over all nodes, then the most common reason."""
    attempt = f"attempt {decision.attempts}: " if decision.attempts > 1 else ""
    if decision.error:
        return ["NOT PLACED", f"{attempt}{decision.error}"]
    no_room_now = full_now(decision)
    if never_fits(decision, nodes):
        verdict = f"unresolvable on all {count(nodes, 'node')} (preemption cannot help)"
    else:
        verdict = f"no room now on {count(len(no_room_now), 'node')}, unresolvable on {nodes - len(no_room_now)}"
    # The nodes without room now are the ones that could take the pod later: their reasons matter most.
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
        lines.extend(wrap(f"{head}{first}", len(head)))
        lines.extend(wrapped for line in rest for wrapped in wrap(" " * 8 + line, 10))
    return lines


def latency_lines(latency: Mapping[str, list[float]]) -> list[str]:
    """Per verb: how many requests, the median and the slowest."""
    lines = []
    for verb, times in sorted(latency.items(), key=lambda pair: VERBS.index(pair[0]) if pair[0] in VERBS else 9):
        ordered = sorted(times)
        median, slowest = ordered[len(ordered) // 2] * 1000, ordered[-1] * 1000
        lines.append(f"{verb:<11} {len(ordered):>4}   median {median:5.1f} ms   max {slowest:5.1f} ms")
    return lines
