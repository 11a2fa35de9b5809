"""The gang replay: what placing jobs whole is worth, through the real kube-scheduler, on the openb trace's pod
shapes grouped into jobs (`job_mix.py`: our mix of job sizes, said there).

    python -m bench.placement.jobs --trace DIR [--nodes 200] [--seeds 42] [--policies groups,no-groups]
        [--peer gpushare=DIR] [--peer hami=DIR] [--record bench/records]

The method is `make bench-placement`'s fill-up (`real.py`), a job at a time (`jobs_real.py`): the trace's nodes
(a sample of `--nodes`, as `make bench-placement --nodes` takes it), jobs arriving until their GPU demand reaches
130 % of the capacity, what cannot be placed dropped. Each run is one scheduler:

- `groups`: ours as shipped, the jobs declared as Kueue's plain-pod groups (placed whole or not at all);
- `no-groups`: ours, the same pods without the declaration (placed pod by pod);
- `--peer NAME=DIR`: a scheduler users run today, built from its source (`peers.py`), wired as its docs say; it
  knows no groups, so the pods carry none.
Ours runs with `--nodes-to-score=100` (kube-scheduler sends every node to each member's filter, as
docs/how-it-works/jobs.md advises for jobs), both with and without groups, and in gpushare's protocol with
`bench.placement`'s `GPUSHARE_FLAGS`.

Figures (`job_report.py`), read from the API at the end: the share of GPUs allocated, the share allocated to jobs
started whole, jobs started whole, partly placed (with the GPUs their bound pods hold, doing nothing) and never
started; and `make bench-placement`'s own lines (the curve, refusals by reason, the end check). It exits non-zero
when a run fails or an end check finds a problem, never for a figure.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import record as recording
from bench.placement import churn, job_report, job_timeline, peers, report
from bench.placement.__main__ import GPUSHARE_FLAGS
from bench.placement.churn import PlanError
from bench.placement.hami import HAMI
from bench.placement.job_mix import SIZES, JobWorkload, job_workload, sample_nodes
from bench.placement.job_timeline import job_plan
from bench.placement.trace import GPUSHARE, TraceError, read_nodes, read_pods, trace_folder

POLICIES = ("groups", "no-groups")
"""Ours with the jobs declared, and without."""
OURS_FLAGS = ("--nodes-to-score=100",)
"""Given to ours, with groups and without, for `extender serve` and `extender scheduler-config`: every node sent
to each filter, so a member's planned node is among them (docs/how-it-works/jobs.md, "kube-scheduler's share of
nodes")."""
NODES = 200
"""The default sample: a run of ours takes a few minutes, a peer's about ten, on 2 cores."""
SCHEDULERS = {
    "groups": "ours, jobs declared",
    "no-groups": "ours, no groups",
    "gpushare": "gpushare-scheduler-extender",
    "hami": "hami-scheduler",
}
"""How the report and the page name each run's scheduler."""


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.placement.jobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True, help="the trace's csv directory (cluster-trace-gpu-v2023/csv)")
    parser.add_argument("--workload", default="default", help="the trace's pod list whose shapes the jobs take")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds of the node sample and the jobs")
    parser.add_argument("--ratio", type=float, default=1.3, help="GPU demand arriving, over the capacity")
    parser.add_argument("--nodes", type=int, default=NODES, help="a sample of this many of the trace's nodes (0: all)")
    parser.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)} (empty with --peer)"
    )
    parser.add_argument(
        "--peer", action="append", default=[], help=f"NAME=DIR, one of {', '.join(peers.PEERS)} (peers.py)"
    )
    parser.add_argument(
        "--protocol", choices=("gpushare", "hami"), default="", help="default: the peers', else gpushare"
    )
    parser.add_argument("--scheduler-name", default="gpu-scheduler", help="the profile the pods ask for")
    parser.add_argument("--flag", action="append", default=[], help="a flag for extender serve and scheduler-config")
    parser.add_argument("--churn", action="store_true", help="jobs come and go (job_timeline.py, jobs_churn.py)")
    parser.add_argument("--churn-hours", type=float, default=churn.HOURS, help="trace hours of arrivals")
    parser.add_argument("--churn-offered", type=float, default=churn.OFFERED, help="GPU demand offered, in capacities")
    parser.add_argument("--churn-minutes", type=float, default=churn.MINUTES, help="minutes of the scheduler's time")
    parser.add_argument(
        "--churn-patience", type=float, default=churn.PATIENCE / 60, help="trace minutes before a job is withdrawn"
    )
    parser.add_argument("--workdir", default="", help="keep every run's logs here (default: a temporary directory)")
    recording.add_option(parser)
    parsed = parser.parse_args(argv)
    parsed.policy_list = [policy.strip() for policy in parsed.policies.split(",") if policy.strip()]
    try:
        parsed.peers = peers.parse(parsed.peer)
        parsed.seed_list = [int(seed) for seed in parsed.seeds.split(",") if seed.strip()]
    except ValueError as error:
        parser.error(str(error))
    if (not parsed.policy_list and not parsed.peers) or any(policy not in POLICIES for policy in parsed.policy_list):
        parser.error(f"--policies {parsed.policies!r}: each of {', '.join(POLICIES)} (empty only with --peer)")
    protocols = {peers.PEERS[name].protocol for name in parsed.peers} | ({parsed.protocol} - {""})
    if len(protocols) > 1:
        parser.error(f"--peer and --protocol: {', '.join(sorted(protocols))} each need runs of their own")
    parsed.protocol = protocols.pop() if protocols else "gpushare"
    parsed.run_list = [*parsed.policy_list, *parsed.peers]
    return parsed


def workload(parsed: argparse.Namespace, seed: int) -> JobWorkload:
    """The run's jobs: drawn to the fill-up's ratio, or, for the churn, to `churn.LONGEST` capacities (the plan
    takes what arrives in its hours)."""
    folder = trace_folder(parsed.trace)
    nodes = sample_nodes(read_nodes(folder), parsed.nodes, seed)
    ratio = churn.LONGEST if parsed.churn else parsed.ratio
    return job_workload(parsed.workload, nodes, read_pods(folder, parsed.workload), seed, ratio)


def run_one(parsed: argparse.Namespace, policy: str, seed: int, workdir: Path) -> dict[str, Any]:
    """One run of one scheduler: its figures and report lines, as the record keeps them."""
    from tests.e2e.controlplane import binaries_dir, missing_binaries

    binaries = binaries_dir()
    missing = missing_binaries(binaries)
    if missing:
        raise SystemExit(f"bench.placement.jobs: {', '.join(missing)} missing in {binaries}: run `make e2e-build`")
    jobs = workload(parsed, seed)
    plan = None
    if parsed.churn:
        plan, jobs, as_pods = job_plan(
            jobs, parsed.churn_offered, parsed.churn_hours, parsed.churn_minutes, parsed.churn_patience * 60
        )
    loaded = jobs.workload
    peer = peers.build(peers.PEERS[policy], parsed.peers[policy]) if policy in parsed.peers else None
    protocol = list(GPUSHARE_FLAGS) if parsed.protocol == "gpushare" else []
    common = [f"--scheduler-name={parsed.scheduler_name}", *OURS_FLAGS, *parsed.flag]
    label = f"{SCHEDULERS[policy]}, seed {seed}"
    print(
        f"-- {label}: {len(loaded.nodes):,} nodes, {loaded.gpu_capacity // 1000:,} GPUs, {len(jobs.jobs):,} jobs, "
        f"{len(loaded.pods):,} pods" + (f"; {plan.describe().replace(' pods, one', ' jobs, one')}" if plan else ""),
        flush=True,
    )
    directory = workdir / f"{policy}-{'churn-' if plan else ''}{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    progress = lambda line: print(f"   {time.strftime('%H:%M:%S')} {line}", flush=True)  # noqa: E731
    wire = HAMI if parsed.protocol == "hami" else GPUSHARE
    arguments = (binaries, directory, jobs)
    flags = ([*protocol, *common], common, parsed.scheduler_name)
    ran = {
        "scheduler": SCHEDULERS[policy],
        "policy": policy,
        "protocol": parsed.protocol,
        "seed": seed,
        "nodes": len(loaded.nodes),
        "gpus": loaded.gpu_capacity // 1000,
    }
    if plan is not None:
        from bench.placement.jobs_churn import JobChurn

        churned, figures = JobChurn(
            *arguments, as_pods, *flags, plan=plan, groups=policy == "groups", progress=progress, peer=peer, wire=wire
        ).run_jobs()
        print(churn.render(churned, f"{label}, jobs as pods"), flush=True)
        print(job_timeline.render(figures), flush=True)
        return {
            **ran,
            "mode": "churn",
            "hours": parsed.churn_hours,
            "offered": parsed.churn_offered,
            "patience_minutes": parsed.churn_patience,
            "seconds": churned.seconds,
            "late": churned.extra.get("late"),
            "peer_crashes": churned.extra.get("peer_crashes", []),
            **figures,
            "problems": churned.all_problems,
        }
    from bench.placement.jobs_real import JobReplay

    replay = JobReplay(*arguments, *flags, groups=policy == "groups", progress=progress, peer=peer, wire=wire)
    result, jobs_tally = replay.run_jobs()
    summary = jobs_tally.summary()
    print(report.render(result, label), flush=True)
    print(job_report.render(summary), flush=True)
    return {
        **ran,
        "mode": "fill-up",
        "seconds": result.seconds,
        "pods_per_second": result.extra.get("pods_per_second", 0.0),
        "pods_allocated": 100 * result.allocated / loaded.gpu_capacity,
        "curve": report.curve(loaded, [bool(outcome.node) for outcome in result.outcomes]),
        "refusals": dict(report.refusals(result)),
        "peer_crashes": result.extra.get("peer_crashes", []),
        **summary,
        "problems": [*result.problems, *summary["problems"]],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parsed = arguments(argv)
    recording.settings(parsed, sizes={str(size): weight for size, weight in SIZES}, ours_flags=list(OURS_FLAGS))
    keep = bool(parsed.workdir)
    workdir = Path(parsed.workdir) if keep else Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    failed = False
    runs: list[dict[str, Any]] = []
    try:
        for policy in parsed.run_list:
            for seed in parsed.seed_list:
                try:
                    run = run_one(parsed, policy, seed, workdir)
                except (TraceError, PlanError, OSError, RuntimeError) as error:
                    print(f"bench.placement.jobs: {SCHEDULERS[policy]}, seed {seed}: {error}", file=sys.stderr)
                    failed = True
                    continue
                runs.append(run)
                failed |= bool(run["problems"])
                recording.result("runs", runs)
        print(summary(runs))
    except BaseException:
        failed = True
        raise
    finally:
        if not keep and not failed:
            shutil.rmtree(workdir, ignore_errors=True)
        elif failed:
            print(f"logs kept in {workdir}", file=sys.stderr)
    return 1 if failed else 0


def summary(runs: Sequence[dict[str, Any]]) -> str:
    lines = [
        "",
        "== summary: GPU allocated (to jobs started) %; fill-up: jobs started whole / partly placed (their GPUs) / "
        "never; churn: jobs started / withdrawn / waiting, GPU-hours held by jobs partly placed",
    ]
    for run in runs:
        said = f"{run['scheduler']}, seed {run['seed']}: {run['allocated']:.1f} ({run['useful']:.1f}); "
        if run["mode"] == "churn":
            said += (
                f"{run['started']:,} / {run['withdrawn']:,} / {run['waiting']:,}, "
                f"{run['partial_gpu_hours']:,.1f} GPU-hours"
            )
        else:
            said += f"{run['whole']:,} / {run['partial']:,} ({run['partial_gpus']:,.1f} GPUs) / {run['never']:,}"
        lines.append(said)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.placement.jobs"))
