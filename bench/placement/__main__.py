"""`make bench-placement`: how well the extender places, on a production GPU-sharing trace, in the share of the
cluster's GPUs allocated as the paper "Beware of Fragmentation" (ATC'23) measures it.

    python -m bench.placement --trace DIR [--workload default] [--seeds 42,43,44] [--mode real|fast|burst|...]

`--trace` is the trace's csv directory (alibaba/clusterdata, `cluster-trace-gpu-v2023/csv`; see
`docs/benchmarks/placement.md` for how to get it; it is for research use and never committed). Without it,
`--synthetic` replays a small workload of the same shape.

Modes (comma-separated to run several):
- `real`: the figure of record. kube-scheduler v1.34 on the e2e tier's control plane, with `extender serve` wired
  in by the configuration `extender scheduler-config` renders, pods one at a time (`real.py`).
- `burst`: the same, every pod pending before kube-scheduler starts (a saturated cluster).
- `fast`: the extender's verbs in process behind a model of kube-scheduler's cycle (`fast.py`): seconds to a
  minute per run, for iterating.

`--churn`: pods come and go (`churn.py`): each runs for its lifetime from the trace, the cluster is kept over-full
(`--churn-offered` of its capacity) for `--churn-hours` of trace time compressed into `--churn-minutes`, and a pod
that waits longer than `--churn-patience` trace minutes is withdrawn; in the fast mode (`churn_fast.py`) or
through the real kube-scheduler (`churn_real.py`). Figures: GPU allocated over the full part of the run and over
time, fragmentation over time, waits per kind of pod, pods withdrawn, the end check.

`--policies` runs each mode and seed once per policy: `shipped` (the extender as it ships, with the flags given)
and `fill` (the same with `--placement=fill`), one table and one picture for all. `--plot FILE.svg` draws the
curves of every run (`plot.py`).

`--peer NAME=DIR` (repeatable) runs a scheduler users run today in place of ours, in the real modes, as one more
policy of the table: built from its source in DIR (`peers.py`: gpushare-scheduler-extender; where to get it).

`--mig`: the MIG workload instead (`mig.py`): the trace's MIG-capable nodes in HAMi's MIG mode, the extender
(`--protocol hami`, in process as in the fast mode) against hami-scheduler's own choice; `--mode` is not read.

`--extender-flag` and `--config-flag` (repeatable) pass flags to `extender serve` and `extender scheduler-config`
(the fast mode reads both too), so another policy or wiring can be measured the same way: e.g.
`--extender-flag=--placement=fill` for the fill policy. In gpushare's protocol `extender serve` is first given
`GPUSHARE_FLAGS` (pods asking several GPUs bound, as the published figures were measured), which a flag given
here overrides. It prints the figures of each run and, for several
seeds, their summary beside the paper's; it exits non-zero when a run fails or an end check finds a GPU, cpu or
memory over capacity, never for a figure.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import record as recording
from bench.placement import churn, churn_fast, fast, mig, peers, plot, report
from bench.placement import runs as entries
from bench.placement.churn import ChurnResult, PlanError
from bench.placement.hami import HAMI
from bench.placement.outcome import ReplayResult
from bench.placement.paper import PAPER
from bench.placement.trace import GPUSHARE, TraceError, Workload, arrivals, load, synthetic_workload
from extender import settings
from extender.cli import parser as cli_parser
from extender.tools.schedconfig import Wiring

MODES = ("real", "burst", "fast")
GPUSHARE_FLAGS = ("--gpushare-several-gpus=bind",)
"""Given to our extender in gpushare's protocol, in every mode, before the run's own flags: the trace has pods
asking several GPUs, and the published figures were measured with them bound, before the extender refused them
by default (gpushare's device plugin gives a pod one GPU at most). `--gpushare-several-gpus=refuse` measures that."""
POLICIES = {"shipped": (), "fill": ("--placement=fill",)}
"""Named policies for --policies: the extender flags each adds to the run's own."""
Result = ReplayResult | ChurnResult


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="", help="the trace's csv directory (cluster-trace-gpu-v2023/csv)")
    parser.add_argument("--synthetic", action="store_true", help="a small synthetic workload instead of the trace")
    parser.add_argument("--scale", type=int, default=1, help="with --synthetic: times the base cluster of 15 nodes")
    parser.add_argument("--workload", default="default", help="the trace's pod list (openb_pod_list_<name>.csv)")
    parser.add_argument("--seeds", default="42", help="comma-separated seeds of the arrival sequence")
    parser.add_argument(
        "--ratio", type=float, default=1.3, help="GPU demand arriving, over the capacity (the fill-up replay)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=0,
        help=f"a sample of this many of the trace's nodes (default: all; with --churn, {churn.NODES})",
    )
    parser.add_argument("--mode", default="real", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument(
        "--scheduler-name",
        default="gpu-scheduler",
        help="the profile kube-scheduler runs and the pods ask for: gpu-scheduler, the second scheduler the install "
        "path ships (default), or default-scheduler, the cluster's own",
    )
    parser.add_argument(
        "--flag", action="append", default=[], help="a setting's flag for both extender serve and scheduler-config"
    )
    parser.add_argument("--extender-flag", action="append", default=[], help="a flag for extender serve alone")
    parser.add_argument("--config-flag", action="append", default=[], help="a flag for extender scheduler-config alone")
    parser.add_argument("--mig", action="store_true", help="the MIG workload, ours against HAMi's (mig.py)")
    parser.add_argument(
        "--policies",
        default="shipped",
        help=f"comma-separated, of {', '.join(POLICIES)}: each run once per policy (empty with --peer: the peer alone)",
    )
    parser.add_argument(
        "--peer",
        action="append",
        default=[],
        help=f"NAME=DIR: also run a scheduler users run today, built from its source in DIR (real modes; one of "
        f"{', '.join(peers.PEERS)}: peers.py says where to get it)",
    )
    parser.add_argument(
        "--peer-qps",
        type=int,
        default=0,
        help="hami-scheduler's API client raised to QPS requests a second, bursts of twice that (its flags "
        "--kube-qps and --kube-burst, which its chart sets through scheduler.extender.extraArgs); as shipped it "
        "keeps client-go's 5 and 10",
    )
    parser.add_argument(
        "--protocol",
        choices=("gpushare", "hami"),
        default="",
        help="the device protocol the nodes and pods speak (default: the peers', else gpushare; hami: hami.py, "
        "real fill-up and burst modes)",
    )
    parser.add_argument("--churn", action="store_true", help="the churn mode: pods come and go (churn.py)")
    parser.add_argument("--churn-hours", type=float, default=churn.HOURS, help="trace hours of arrivals")
    parser.add_argument(
        "--churn-offered", type=float, default=churn.OFFERED, help="GPU demand offered, over the capacity"
    )
    parser.add_argument(
        "--churn-minutes", type=float, default=churn.MINUTES, help="minutes of the scheduler's time a run takes"
    )
    parser.add_argument(
        "--churn-patience", type=float, default=churn.PATIENCE / 60, help="trace minutes before a pod is withdrawn"
    )
    parser.add_argument("--plot", default="", help="draw every run's curves into this SVG file")
    parser.add_argument("--workdir", default="", help="keep every run's logs here (default: a temporary directory)")
    recording.add_option(parser)
    parsed = parser.parse_args(argv)
    modes = [mode.strip() for mode in parsed.mode.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        parser.error(f"--mode {parsed.mode!r}: each of {', '.join(MODES)}")
    parsed.modes = modes
    if parsed.churn and "burst" in modes:
        parser.error("--churn runs the fast and real modes (burst is the fill-up replay's)")
    if parsed.churn and not parsed.nodes:
        parsed.nodes = churn.NODES
    parsed.policy_list = [policy.strip() for policy in parsed.policies.split(",") if policy.strip()]
    try:
        parsed.peers = peers.parse(parsed.peer)
    except ValueError as error:
        parser.error(str(error))
    if (not parsed.policy_list and not parsed.peers) or any(policy not in POLICIES for policy in parsed.policy_list):
        parser.error(f"--policies {parsed.policies!r}: each of {', '.join(POLICIES)} (empty only with --peer)")
    if parsed.peer_qps and ("hami" not in parsed.peers or not 1 <= parsed.peer_qps <= 10_000):
        parser.error("--peer-qps: a number of requests a second, 1 to 10000, with --peer hami=DIR")
    if parsed.peers and "fast" in modes:
        parser.error("--peer runs in the real modes (real, burst): a peer is a process of its own, not modelled")
    protocols = {peers.PEERS[name].protocol for name in parsed.peers} | ({parsed.protocol} - {""})
    if len(protocols) > 1:
        parser.error(f"--peer and --protocol: {', '.join(sorted(protocols))} each need runs of their own")
    parsed.protocol = protocols.pop() if protocols else "gpushare"
    if parsed.protocol == "hami" and "fast" in modes:
        parser.error("--protocol hami runs the real modes (real, burst; --churn too), not the fast one")
    parsed.policy_list += list(parsed.peers)
    given = {"flag": parsed.flag, "extender-flag": parsed.extender_flag, "config-flag": parsed.config_flag}
    parsed.own_flags = [f"--{option}={flag}" for option, flags in given.items() for flag in flags]  # name ours
    common = [f"--scheduler-name={parsed.scheduler_name}", *parsed.flag]
    protocol = list(GPUSHARE_FLAGS) if parsed.protocol == "gpushare" and not parsed.mig else []
    parsed.extender_flag = [*protocol, *common, *parsed.extender_flag]
    parsed.config_flag = [*common, *parsed.config_flag]
    try:
        parsed.seed_list = [int(seed) for seed in parsed.seeds.split(",") if seed.strip()]
    except ValueError:
        parser.error(f"--seeds {parsed.seeds!r}: comma-separated integers")
    if not parsed.trace and not parsed.synthetic:
        parser.error(
            "--trace DIR is needed (TRACE=DIR with make): the csv directory of Alibaba's cluster-trace-gpu-v2023, "
            "e.g. `git clone --depth 1 https://github.com/alibaba/clusterdata` and "
            "TRACE=clusterdata/cluster-trace-gpu-v2023/csv (see docs/benchmarks/placement.md); or --synthetic"
        )
    return parsed


def workload(parsed: argparse.Namespace, seed: int) -> Workload:
    ratio = churn.LONGEST if parsed.churn else parsed.ratio  # churn.plan cuts the sequence it needs
    if parsed.synthetic:
        return synthetic_workload(seed, parsed.scale, ratio)
    loaded = load(parsed.trace, parsed.workload, seed, 1.0 if parsed.nodes else ratio)  # a sample draws its own
    if parsed.nodes and parsed.nodes >= len(loaded.nodes):
        return replace(loaded, pods=arrivals(loaded.trace_pods, loaded.nodes, seed, ratio))  # no sample after all
    if parsed.nodes:
        nodes = tuple(sorted(random.Random(seed).sample(loaded.nodes, parsed.nodes), key=lambda node: node.name))
        loaded = replace(loaded, nodes=nodes, pods=arrivals(loaded.trace_pods, nodes, seed, ratio))
    return loaded


def command_settings(command: str, flags: Sequence[str]) -> tuple[settings.Settings, argparse.Namespace]:
    """The settings `extender <command> <flags>` would build (no environment, unchecked: no certificates are
    read in the fast mode), with its parsed arguments."""
    parsed = cli_parser().parse_args([command, *flags])
    given = {field.name: getattr(parsed, field.name, None) for field in settings.fields()}
    return settings.load(given, env={}, config=parsed.config, check=False), parsed


def config_text(flags: Sequence[str]) -> str:
    """What `extender scheduler-config --k8s-version 1.34 <flags>` renders, for the fast mode's model."""
    rendered, parsed = command_settings("scheduler-config", ["--k8s-version", "1.34", *flags])
    return fast.rendered_config(rendered, Wiring(parsed.wiring))


def run_one(parsed: argparse.Namespace, mode: str, seed: int, workdir: Path, policy: str = "shipped") -> Result:
    loaded = workload(parsed, seed)
    extender_flags = [*parsed.extender_flag, *POLICIES.get(policy, ())]
    peer = peers.build(peers.PEERS[policy], parsed.peers[policy]) if policy in parsed.peers else None
    if peer is not None and peer.kind is peers.HAMI and parsed.peer_qps:
        peer = replace(peer, arguments=peers.client_flags(parsed.peer_qps))
    plan = None
    if parsed.churn:
        plan, loaded = churn.plan(
            loaded, parsed.churn_offered, parsed.churn_hours, parsed.churn_minutes, parsed.churn_patience * 60
        )
    print(
        f"-- {policy}, {mode}, workload {loaded.name}, seed {seed}: {len(loaded.nodes):,} nodes, "
        f"{len(loaded.pods):,} pods" + (f"; {plan.describe()}" if plan else ""),
        flush=True,
    )
    if mode == "fast":
        served, _ = command_settings("serve", extender_flags)
        if plan is not None:
            return churn_fast.replay(loaded, plan, served, config_text(parsed.config_flag), seed)
        return fast.replay(loaded, served, config_text(parsed.config_flag), seed)
    from bench.placement.real import RealReplay
    from tests.e2e.controlplane import binaries_dir, missing_binaries

    binaries = binaries_dir()
    missing = missing_binaries(binaries)
    if missing:
        raise SystemExit(
            f"bench-placement: {', '.join(missing)} missing in {binaries}: run `make e2e-build` (needs Go)"
        )
    directory = workdir / f"{policy}-{mode}{'-churn' if plan else ''}-{loaded.name}-{seed}"
    directory.mkdir(parents=True, exist_ok=True)
    wire = HAMI if parsed.protocol == "hami" else GPUSHARE
    arguments = (binaries, directory, loaded, extender_flags, parsed.config_flag, parsed.scheduler_name)
    progress = lambda line: print(f"   {time.strftime('%H:%M:%S')} {line}", flush=True)  # noqa: E731
    if plan is not None:
        from bench.placement.churn_real import ChurnReal

        return ChurnReal(*arguments, plan=plan, progress=progress, peer=peer, wire=wire).run()
    return RealReplay(*arguments, burst=mode == "burst", progress=progress, peer=peer, wire=wire).run()


def run_record(parsed: argparse.Namespace, policy: str, seed: int, result: Result) -> dict[str, Any]:
    """What the run record keeps of one run (`runs.py`), with who ran it and how."""
    kind = peers.PEERS.get(policy) if policy in parsed.peers else None
    qps = parsed.peer_qps if kind is peers.HAMI else 0
    entry = entries.churned(result, seed) if isinstance(result, ChurnResult) else entries.fill_up(result, seed)
    name = entries.scheduler_name(policy, kind.shown if kind else "", qps)
    if parsed.own_flags and not kind:  # ours with settings of the run's own: a row of its own on the pages
        name += f" ({' '.join(parsed.own_flags)})"
    return {
        "scheduler": name,
        "policy": policy,
        "protocol": parsed.protocol,
        "scheduler_name": parsed.scheduler_name,
        "extender_flags": [] if kind else [*parsed.extender_flag, *POLICIES.get(policy, ())],
        **entry,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parsed = arguments(argv)
    recording.settings(parsed)
    if parsed.mig:
        hami = ["--protocol=hami"]
        served, _ = command_settings("serve", [*parsed.extender_flag, *hami])
        return mig.main(parsed, served, config_text([*parsed.config_flag, *hami]))
    keep = bool(parsed.workdir)
    workdir = Path(parsed.workdir) if keep else Path(tempfile.mkdtemp(prefix="bench-placement-"))
    failed = False
    results: dict[str, list[tuple[int, Result]]] = {}
    kept: list[dict[str, Any]] = []
    try:
        for policy in parsed.policy_list:
            for mode in parsed.modes:
                for seed in parsed.seed_list:
                    label = f"{policy}, {mode}" if len(parsed.policy_list) > 1 or policy != "shipped" else mode
                    try:
                        result = run_one(parsed, mode, seed, workdir, policy)
                    except (TraceError, PlanError, OSError, RuntimeError) as error:
                        print(f"bench-placement: {label} seed {seed}: {error}", file=sys.stderr)
                        failed = True
                        continue
                    results.setdefault(label, []).append((seed, result))
                    kept.append(run_record(parsed, policy, seed, result))
                    recording.result("runs", kept)  # each run as it ends: a run that fails later keeps them
                    if isinstance(result, ChurnResult):
                        print(churn.render(result, f"{label}, seed {seed}"), flush=True)
                        failed |= bool(result.all_problems)
                    else:
                        print(report.render(result, f"{label}, seed {seed}"), flush=True)
                        failed |= bool(result.problems)
        print(summary(parsed, results))
        if parsed.plot and results:
            Path(parsed.plot).write_text(picture(parsed, results))
            print(f"curves drawn in {parsed.plot}")
    except BaseException:
        failed = True  # an unexpected error keeps the logs too
        raise
    finally:
        if not keep and not failed:
            shutil.rmtree(workdir, ignore_errors=True)
        elif failed:
            print(f"logs kept in {workdir}", file=sys.stderr)
    return 1 if failed else 0


def summary(parsed: argparse.Namespace, results: dict[str, list[tuple[int, Result]]]) -> str:
    if parsed.churn:
        return churn_summary(results)
    lines = ["", f"== summary: GPU allocated when {parsed.ratio:.0%} of the capacity has arrived"]
    for mode, runs in results.items():
        capacity = runs[0][1].workload.gpu_capacity if runs else 1
        figures = [(seed, 100 * run.allocated / capacity) for seed, run in runs if isinstance(run, ReplayResult)]
        each = ", ".join(f"seed {seed}: {value:.1f} %" for seed, value in figures)
        mean = statistics.mean(value for _, value in figures) if figures else 0.0
        lines.append(f"{mode}: mean {mean:.1f} % ({each})")
    paper = PAPER.get(parsed.workload) if not parsed.synthetic and not parsed.nodes else None
    if paper:
        shown = ", ".join(f"{policy} {value:.1f}" for policy, value in paper.items())
        lines.append(f"the paper's simulator (mean of seeds 42-51): {shown}")
    return "\n".join(lines)


def churn_summary(results: dict[str, list[tuple[int, Result]]]) -> str:
    lines = [
        "",
        "== summary, churn: GPU allocated over the full part (mean of the seeds); p99 wait of pods asking several "
        "GPUs; pods withdrawn",
    ]
    for label, runs in results.items():
        shown = [(seed, churn.figures(run)) for seed, run in runs if isinstance(run, ChurnResult)]
        if not shown:
            continue
        allocated = statistics.mean(figures.allocated for _, figures in shown)
        each = ", ".join(
            f"seed {seed}: {figures.allocated:.1f} %, multi p99 {churn.duration(figures.waits['multi'][2])}, "
            f"withdrawn {figures.withdrawn:,}"
            for seed, figures in shown
        )
        lines.append(f"{label}: mean {allocated:.1f} % ({each})")
    return "\n".join(lines)


def picture(parsed: argparse.Namespace, results: dict[str, list[tuple[int, Result]]]) -> str:
    """Every run's curves, one line per label and seed (`plot.py`)."""
    lines: dict[str, list[plot.Line]] = {}
    for label, runs in results.items():
        for seed, run in runs:
            name, number = f"{label}, seed {seed}", parsed.seed_list.index(seed)
            if isinstance(run, ChurnResult):
                hours = [sample.time / 3600 for sample in run.samples]
                for key, values in (
                    ("allocated", [sample.allocated for sample in run.samples]),
                    ("fragmented", [sample.fragmented for sample in run.samples]),
                    ("waiting", [float(sample.waiting) for sample in run.samples]),
                ):
                    points = tuple((x, y) for x, y in zip(hours, values, strict=True) if not math.isnan(y))
                    line = plot.Line(name, points, group=label, dash=number)  # measured points joined
                    lines.setdefault(key, []).append(line)
            else:
                curve = report.curve(run.workload, [bool(outcome.node) for outcome in run.outcomes])
                points = tuple((float(x), y) for x, y in curve.items())
                lines.setdefault("curve", []).append(plot.Line(name, points, group=label, dash=number))
    workload = "synthetic" if parsed.synthetic else parsed.workload
    if parsed.churn:
        allocated = tuple(lines.get("allocated", ()))
        panels = [
            plot.Panel("GPU allocated", "trace hours", "% of the GPU capacity", allocated),
            plot.Panel("GPU allocated, zoomed", "trace hours", "% of the GPU capacity", allocated, y_low=85.0),
            plot.Panel("Fragmented (the paper's measure)", "trace hours", "% of the GPU capacity",
                       tuple(lines.get("fragmented", ()))),
            plot.Panel("Pods waiting", "trace hours", "pods", tuple(lines.get("waiting", ()))),
        ]  # fmt: skip
        title = f"bench-placement --churn, workload {workload} (a line per seed: solid, dashed, dotted)"
    else:
        panels = [
            plot.Panel("GPU allocated", "GPU demand arrived, % of capacity", "% of the GPU capacity",
                       tuple(lines.get("curve", ()))),
        ]  # fmt: skip
        title = f"bench-placement, workload {workload}"
    return plot.svg(panels, title)


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.placement"))
