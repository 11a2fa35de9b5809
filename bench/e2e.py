"""`make bench-e2e`: the real kube-scheduler, alone and with `extender serve` wired in, on the e2e tier's control
plane, in pods bound per second and CPU per pod; and, when asked, with the floor wired in instead.

Why it exists: `make bench` and `make loadtest` measure the extender with a client playing the scheduler; this
measures what a cluster sees. On the e2e tier's control plane (the cached etcd, kube-apiserver and
kube-scheduler that `tests/e2e/build.sh` builds; no kubelets) it creates N Node objects of 8 GPUs x 40 GiB and
P pending GPU pods of mixed sizes, then starts kube-scheduler (clientConnection qps and burst 5000, as
scheduler_perf does), (a) alone, counting aliyun.com/gpu-mem against the node totals with NodeResourcesFit,
and (b) with the extender wired in as it ships: `extender certs` for mTLS, `extender scheduler-config` for the
scheduler, `extender serve` with the Deployment's flags. Each run gets a fresh control plane. Per run: pods/s
from the 5th to the 95th percentile bind, the median gap between binds, CPU milliseconds per pod of etcd,
kube-apiserver, kube-scheduler and the extender (from /proc/<pid>/stat), and the end check.

The floor (`--wiring floor-full` or `floor-filter-bind`) is `bench/floor`, a do-nothing extender in Go that
binds, wired in as ours is (`full` or `filter-bind`, without preempt): it passes every node, scores none and
posts each Binding. Why: calling any extender costs kube-scheduler and the API server something (the HTTPS calls,
the Binding made by another client), and where cores are few that alone slows scheduling; a floor run
measures that cost, so what ours costs beyond it is what there is to improve. The report gives the connections
kube-scheduler opened to the floor: its extender client keeps 2 idle connections, so a call made while two are
in flight opens a new one, and with it a TLS handshake.

Bind times come from a watch on the pods, stamped as each event arrives (time.perf_counter); the
PodScheduled conditions' lastTransitionTime, which has 1 s resolution, gives a second pace as a cross-check.

It prints numbers and exits non-zero only when a run errors or an end check fails, never for a pace.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import record as recording
from bench.e2e_figures import GPU_MEMORY, GPUS_PER_NODE, POD_MIX, pod_sizes
from bench.e2e_run import ALONE, FLOORS, WIRINGS, Run, RunError, RunResult
from devtools.harness import machine
from tests.e2e.controlplane import binaries_dir, kubernetes_version, missing_binaries

PROCESSES = ("etcd", "kube-apiserver", "kube-scheduler", "extender")
PROBLEMS_SHOWN = 20


def spread(values: Sequence[float], show: Callable[[float], str]) -> str:
    """One value, or the range of several: "203 - 279"."""
    if not values:
        return "—"
    low, high = min(values), max(values)
    return show(low) if len(values) == 1 or show(low) == show(high) else f"{show(low)} - {show(high)}"


def whole(value: float) -> str:
    return f"{value:,.0f}"


def two(value: float) -> str:
    return f"{value:.2f}"


def one(value: float) -> str:
    return f"{value:.1f}"


def label(wiring: str) -> str:
    if wiring == ALONE:
        return "kube-scheduler alone"
    if wiring in FLOORS:
        return f"with a do-nothing Go binder ({wiring})"
    return f"with the extender ({wiring})"


def run_line(number: int, result: RunResult) -> str:
    check = result.check
    verdict = "passed" if check.passed else f"FAILED ({len(check.problems)} problems)"
    return (
        f"| {number} | {label(result.wiring)} | {result.pace.pods_per_second:,.0f} | {result.pace.gap_p50_ms:.2f} "
        f"| {result.pace.gap_max_ms:.0f} "
        f"| {result.condition_pace.pods_per_second:,.0f} | {result.pace.first_to_last:.1f} "
        f"| {result.scheduling_seconds:.1f} | {result.setup_seconds:.0f} | {check.bound:,} bound, {verdict} |"
    )


def runs_table(results: list[tuple[int, RunResult]]) -> str:
    lines = [
        "| round | run | pods/s (5th to 95th pct bind) | gap between binds p50, ms | max, ms "
        "| pods/s by PodScheduled (1 s) "
        "| first → last bind, s | scheduler start → last bind, s | set-up, s | end check |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    lines += [run_line(number, result) for number, result in results]
    return "\n".join(lines)


def pace_table(nodes: int, pods: int, results: list[tuple[int, RunResult]], wirings: Sequence[str]) -> str:
    """The issue's table: pods/s alone and per wiring (a range over the rounds), and the ratio in each round."""
    alone = {number: result.pace.pods_per_second for number, result in results if result.wiring == ALONE}
    header = "| nodes, pods | kube-scheduler alone |"
    rule = "|---|---:|"
    row = f"| {nodes:,}, {pods:,} | {spread(list(alone.values()), whole)} pods/s |"
    for wiring in wirings:
        paces = {number: result.pace.pods_per_second for number, result in results if result.wiring == wiring}
        ratios = [pace / alone[number] for number, pace in paces.items() if alone.get(number)]
        header += f" {label(wiring)} | ratio |"
        rule += "---:|---:|"
        row += f" {spread(list(paces.values()), whole)} pods/s | {spread(ratios, two)} |"
    return "\n".join([header, rule, row])


def cores_busy(result: RunResult) -> float:
    """CPU seconds of every measured process (this one too) over the window's wall seconds: how many cores the
    run kept busy. Near the machine's core count, the run was CPU-bound; well below, it waited."""
    return sum(result.cpu_ms_per_pod.values()) * result.pace.bound / 1000 / result.window_seconds


def cpu_table(results: list[tuple[int, RunResult]], wirings: Sequence[str]) -> str:
    """CPU ms per pod per process, the median over the rounds of each kind of run."""
    lines = [
        "| | etcd | kube-apiserver | kube-scheduler | extender | sum | (this bench: the watch) | cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for wiring in (ALONE, *wirings):
        kind = [result for _, result in results if result.wiring == wiring and result.cpu_ms_per_pod]
        if not kind:
            continue
        runs = [result.cpu_ms_per_pod for result in kind]
        busy = statistics.median(cores_busy(result) for result in kind)
        median = {name: statistics.median(run.get(name, 0.0) for run in runs) for name in (*PROCESSES, "bench")}
        cells = [f"{median[name]:.1f} ms" if wiring != ALONE or name != "extender" else "—" for name in PROCESSES]
        total = sum(median[name] for name in PROCESSES)
        lines.append(
            f"| {label(wiring)} | {' | '.join(cells)} | {total:.1f} ms | {median['bench']:.1f} ms | {busy:.2f} |"
        )
    return "\n".join(lines)


def extender_lines(results: list[tuple[int, RunResult]]) -> list[str]:
    """A line per run with an extender: our extender's time in the handler and counts, or the floor's connections."""
    lines = []
    for number, result in results:
        if result.wiring == ALONE:
            continue
        opened = f"{result.connections:,} connections opened" if result.connections is not None else ""
        if result.wiring.startswith("floor"):
            lines.append(f"- round {number}, {result.wiring}: {opened or 'connections not counted'} to the floor")
            continue
        verbs = ", ".join(f"{verb} {ms:.2f} ms" for verb, ms in sorted(result.verb_ms.items()))
        counts = ", ".join(f"{name} {count:,}" for name, count in sorted(result.extender_counts.items()))
        counted = "".join(f"; {part}" for part in (counts, opened) if part)
        lines.append(f"- round {number}, {result.wiring}: mean time in the handler: {verbs or 'no calls'}{counted}")
    return lines


def report(nodes: int, pods: int, results: list[tuple[int, RunResult]], wirings: Sequence[str], seconds: float) -> str:
    mix = ", ".join(f"{size} GiB x{weight}" for size, weight in POD_MIX)
    parts = [
        f"## kube-scheduler {kubernetes_version()} alone and with the extender ({seconds:.0f} s)",
        f"Machine: {machine()}.",
        f"{nodes:,} Node objects of {GPUS_PER_NODE} GPUs x {GPU_MEMORY} GiB, {pods:,} pending pods ({mix} in 100), "
        "created before kube-scheduler starts; clientConnection qps/burst 5000; a fresh control plane per run. "
        "Bind times: a watch on the pods, stamped on arrival (perf_counter).",
        pace_table(nodes, pods, results, wirings),
        "CPU per pod, from /proc/<pid>/stat utime+stime (10 ms ticks), from just before kube-scheduler starts "
        "(its own from its start) to 1 s after the last bind; median over the rounds. Cores busy: all of them (this "
        "bench too) over the window's wall time:",
        cpu_table(results, wirings),
        "Each run:",
        runs_table(results),
        "\n".join(extender_lines(results)),
    ]
    return "\n\n".join(part for part in parts if part)


def problems_of(number: int, result: RunResult) -> list[str]:
    shown = [f"round {number}, {result.wiring}: {problem}" for problem in result.check.problems[:PROBLEMS_SHOWN]]
    if len(result.check.problems) > PROBLEMS_SHOWN:
        shown.append(f"round {number}, {result.wiring}: ... {len(result.check.problems) - PROBLEMS_SHOWN} more")
    return shown


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=1000, help="Node objects of 8 GPUs x 40 GiB.")
    parser.add_argument("--pods", type=int, default=3000, help="Pending GPU pods, created before the scheduler.")
    parser.add_argument("--runs", type=int, default=1, help="Rounds; each runs the scheduler alone, then each wiring.")
    parser.add_argument(
        "--wiring",
        action="append",
        choices=sorted([*WIRINGS, *FLOORS]),
        help="How the extender is wired in (repeatable): full = filter, prioritize, preempt and bind (default); "
        "filter-bind = no prioritize, kube-scheduler's NodeResourcesFit binpacks the nodes on the GPU memory resource; "
        "floor-full and floor-filter-bind = the floor instead, a do-nothing Go extender that binds (bench/floor), "
        "wired in as full or filter-bind without preempt (needs Go to build it).",
    )
    parser.add_argument("--workdir", type=Path, help="Keep each run's logs here (default: a temporary directory).")
    recording.add_option(parser)
    parser.add_argument("--keep", action="store_true", help="Keep the temporary directory even when all passed.")
    arguments = parser.parse_args(argv)
    if arguments.nodes < 1 or arguments.pods < 2 or arguments.runs < 1:
        parser.error("--nodes, --runs must be at least 1 and --pods at least 2")
    arguments.wiring = list(dict.fromkeys(arguments.wiring or ["full"]))
    return arguments


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse(argv)
    recording.settings(arguments)
    binaries = binaries_dir()
    missing = missing_binaries(binaries)
    if missing:
        print(f"bench-e2e: {', '.join(missing)} missing from {binaries}: run `make e2e-build`", file=sys.stderr)
        return 1
    workdir = arguments.workdir or Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    sizes = pod_sizes(arguments.pods)
    print(f"machine: {machine()}; logs in {workdir}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    results: list[tuple[int, RunResult]] = []
    failures: list[str] = []
    for number in range(1, arguments.runs + 1):
        for wiring in (ALONE, *arguments.wiring):
            print(f"round {number}: {label(wiring)} ...", file=sys.stderr, flush=True)
            run = Run(binaries, workdir / f"{number}-{wiring}", wiring, arguments.nodes, sizes)
            try:
                result = run.measure()
            except RunError as error:
                failures.append(f"round {number}, {wiring}: {error}")
                print(f"  failed: {error}", file=sys.stderr, flush=True)
                continue
            results.append((number, result))
            failures += problems_of(number, result)
            print(f"  {run_line(number, result)}", file=sys.stderr, flush=True)
    recording.result("runs", [{"round": number, "result": result} for number, result in results])
    recording.result("failures", failures)
    print(report(arguments.nodes, arguments.pods, results, arguments.wiring, time.perf_counter() - started))
    if failures:
        print("\nFAILED:\n" + "\n".join(f"- {failure}" for failure in failures))
        print(f"logs in {workdir}")
        return 1
    if arguments.workdir is None and not arguments.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(recording.run(main, "bench.e2e"))
