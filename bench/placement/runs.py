"""What a run of `make bench-placement` keeps in its run record (`--record`): one entry per scheduler, mode and
seed, small enough to commit (the figures the pages show, the curves they draw), never the pods one by one.

The docs' table of placement and the README's rows are built from these entries (`bench/figures_placement.py`),
the churn curves too; the run's logs (`--workdir`) keep the rest.
"""

from __future__ import annotations

import math
from typing import Any

from bench.placement import churn, report
from bench.placement.churn import ChurnResult
from bench.placement.outcome import ReplayResult

PROBLEMS_KEPT = 20
"""End-check findings kept in a record (their number is kept whole)."""


def scheduler_name(policy: str, peer_name: str = "", qps: int = 0) -> str:
    """How the pages name the scheduler of a run: ours by its policy, a peer by its program and version."""
    if policy == "shipped":
        return "ours"
    if policy == "fill":
        return "our fill policy"
    name = peer_name or policy
    return f"{name}, client at {qps}/s" if qps else name


def _common(result: ReplayResult | ChurnResult, seed: int) -> dict[str, Any]:
    workload = result.workload
    return {
        "seed": seed,
        "workload": workload.name,
        "nodes": len(workload.nodes),
        "gpus": workload.gpu_capacity // 1000,
        "pods": len(workload.pods),
        "seconds": round(result.seconds, 1),
    }


def _restarts(extra: dict[str, Any]) -> int:
    """How often a peer exited during the run and was started again (`peers.PeerProcess.revive`)."""
    crashes = extra.get("peer_crashes")
    return len(crashes) if isinstance(crashes, list) else 0


def _number(value: float, digits: int = 3) -> float | None:
    """A figure rounded for the record; NaN (not measured) as null."""
    return None if math.isnan(value) else round(value, digits)


def fill_up(result: ReplayResult, seed: int) -> dict[str, Any]:
    """A fill-up (or burst) run: the GPU allocated at the end, and without the pods asking several GPUs (which
    gpushare's device plugin cannot start: a peer that refuses them is compared on the rest), the curve, what is
    left free and how, the refusals by kind, the end check."""
    figures = report.summary(result)
    capacity = result.workload.gpu_capacity
    several = sum(outcome.pod.gpu_demand for outcome in result.outcomes if outcome.node and outcome.pod.gpus > 1)
    problems: list[str] = list(figures["problems"])  # type: ignore[call-overload]
    return {
        **_common(result, seed),
        "kind": "fill-up",
        "mode": result.mode,
        "allocated": _number(float(figures["allocated"])),  # type: ignore[arg-type]
        "allocated_one_gpu_at_most": _number(100 * (result.allocated - several) / capacity),
        "curve": {str(point): _number(value) for point, value in figures["curve"].items()},  # type: ignore[attr-defined]
        "free": _number(float(figures["free"])),  # type: ignore[arg-type]
        "fragmented": _number(float(figures["fragmented"])),  # type: ignore[arg-type]
        "stranded": _number(float(figures["stranded"])),  # type: ignore[arg-type]
        "bound": figures["bound"],
        "refused_kinds": dict(figures["refused_kinds"]),  # type: ignore[call-overload]
        "pods_per_second": _number(float(result.extra.get("pods_per_second") or math.nan), 1),
        "placements": figures["placements"],
        "problems": len(problems),
        "problems_first": problems[:PROBLEMS_KEPT],
        "restarts": _restarts(result.extra),
    }


def churned(result: ChurnResult, seed: int) -> dict[str, Any]:
    """A churn run: the GPU allocated over the full part, the waits by kind of pod, the pods withdrawn and still
    waiting, the end check, and the samples the curves are drawn from."""
    shown = churn.figures(result)
    plan = result.plan
    return {
        **_common(result, seed),
        "kind": "churn",
        "mode": result.mode,
        "allocated": _number(shown.allocated),
        "offered": _number(shown.offered),
        "full_from_hours": _number(shown.full_from / 3600),
        "fragmented": _number(shown.fragmented),
        "stranded": _number(shown.stranded),
        "waits": {
            kind: {"p50": _number(p50, 1), "p90": _number(p90, 1), "p99": _number(p99, 1), "pods": pods}
            for kind, (p50, p90, p99, pods) in shown.waits.items()
        },
        "withdrawn": shown.withdrawn,
        "waiting_at_end": shown.waiting_at_end,
        "binds": shown.binds,
        "placements": shown.placements,
        "plan": {
            "hours": round(plan.span / 3600, 2),
            "speed": round(plan.speed, 2),
            "patience_minutes": round(plan.patience / 60, 1),
            "offered": round(plan.offered, 3),
        },
        "samples": [
            {
                "hours": round(sample.time / 3600, 4),
                "allocated": _number(sample.allocated),
                "waiting": sample.waiting,
                "fragmented": _number(sample.fragmented),
            }
            for sample in result.samples
        ],
        "problems": len(shown.problems),
        "problems_first": shown.problems[:PROBLEMS_KEPT],
        "restarts": _restarts(result.extra),
    }
