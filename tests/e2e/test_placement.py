"""`make bench-placement`'s fast mode held to the real kube-scheduler: on a small workload of the trace's shape,
every pod goes to the same node, and every GPU ends up as full, in both.

Where they can agree exactly: the real kube-scheduler v1.34 (a fresh control plane) with the extender as it
ships (the second scheduler's configuration: every node filtered, every pod sent to us, the one best node
passed), against the fast mode's model of kube-scheduler with the extender's verbs in process. With one node
passed, kube-scheduler has no choice of its own to make, so the two can only differ where the model of its
filters is wrong, or where the extender sees something else (a pod observed later, a bind not yet seen). The
workload's half-life is made endless in both, so wall-clock time, which only the real mode has, weighs nothing.
Pods that ask no GPU are left out: among nodes where their cpu strands no GPU, kube-scheduler breaks ties at
random (`selectHost`), which no model can repeat; their path is covered by the fast mode's tests and by the
real mode's figures.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bench.placement import __main__ as cli
from bench.placement import churn, churn_fast, fast
from bench.placement.churn_real import ChurnReal
from bench.placement.hami import HAMI
from bench.placement.real import RealReplay
from bench.placement.trace import Workload, arrivals, synthetic
from tests.e2e.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

FLAGS = [*cli.GPUSHARE_FLAGS, "--scheduler-name=gpu-scheduler", "--workload-half-life=1e12"]
"""As the bench runs our extender in gpushare's protocol: its pods asking several GPUs bound."""


def gpu_workload(seed: int) -> Workload:
    nodes, pods = synthetic(seed)
    gpu_pods = tuple(pod for pod in pods if pod.gpus)
    return Workload("synthetic-gpu", nodes, arrivals(gpu_pods, nodes, seed, 1.3), gpu_pods)


def test_the_fast_mode_places_every_pod_where_the_real_kube_scheduler_does(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    workload = gpu_workload(seed=11)
    served, _ = cli.command_settings("serve", FLAGS)
    modelled = fast.replay(workload, served, cli.config_text(FLAGS), seed=11)
    real = RealReplay(control_plane.binaries, tmp_path, workload, FLAGS, FLAGS, "gpu-scheduler").run()
    assert real.problems == [] and modelled.problems == []
    assert [outcome.node for outcome in real.outcomes] == [outcome.node for outcome in modelled.outcomes]
    assert {name: use.gpu_used for name, use in real.nodes.items()} == {
        name: use.gpu_used for name, use in modelled.nodes.items()
    }
    refused = [outcome for outcome in real.outcomes if not outcome.node]
    assert refused, "the workload reaches 130 % of the capacity: some pods must be refused"
    assert dataclasses.asdict(refused[0])["reasons"]  # kube-scheduler's message, read per node


def test_the_churn_modes_fast_model_follows_the_real_kube_scheduler(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Pods coming and going on the small cluster, 2 trace hours in a minute: the real kube-scheduler's queue
    (its backoff, its requeueing on deletions) and the driver's clock against the fast mode's model of them. They
    cannot agree pod by pod (a real cycle takes time, and pods arriving meanwhile wait for it), so the test holds
    the figures: the same pods arrive, both keep the cluster within capacity, and the GPU allocated over the full
    part of the run is within 4 points."""
    nodes, pods = synthetic(seed=13)
    gpu_pods = tuple(pod for pod in pods if pod.gpus)
    long = Workload("synthetic-gpu", nodes, arrivals(gpu_pods, nodes, 13, churn.LONGEST), gpu_pods)
    plan, workload = churn.plan(long, hours=2, minutes=1)
    served, _ = cli.command_settings("serve", FLAGS)
    modelled = churn_fast.replay(workload, plan, served, cli.config_text(FLAGS), seed=13)
    real = ChurnReal(control_plane.binaries, tmp_path, workload, FLAGS, FLAGS, "gpu-scheduler", plan=plan).run()
    fast_figures, real_figures = churn.figures(modelled), churn.figures(real)
    print(f"\n{churn.render(modelled, 'fast')}\n{churn.render(real, 'real')}")
    assert real_figures.problems == [] and fast_figures.problems == []
    assert sum(real.arrived.values()) == sum(modelled.arrived.values()) == plan.pods
    assert real_figures.binds > plan.pods / 2
    assert abs(real_figures.allocated - fast_figures.allocated) < 4.0
    assert real.extra["late"] < 2.0  # the driver kept its timetable: the figures are the plan's clock's


def test_the_real_replay_in_hamis_protocol_has_every_bound_pod_allocated_by_the_plugin(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    """`--protocol hami`: the same workload on HAMi's nodes and pods, ours with `--protocol hami`, the device-plugin
    double allocating each bound pod and releasing its node lock. The end check reads HAMi's annotations and counts
    any allocation the plugin refused; the pods placed come within 3 points of the gpushare protocol's (the same
    policy; HAMi's GPUs hold at most 10 pods each, and count compute as well as memory)."""
    workload = gpu_workload(seed=11)
    served, _ = cli.command_settings("serve", FLAGS)
    gpushare = fast.replay(workload, served, cli.config_text(FLAGS), seed=11)
    real = RealReplay(control_plane.binaries, tmp_path, workload, FLAGS, FLAGS, "gpu-scheduler", wire=HAMI).run()
    assert real.problems == []
    bound = [outcome for outcome in real.outcomes if outcome.node]
    assert bound and len(bound) < len(real.outcomes), "130 % of the capacity arrives: some pods are refused"
    capacity = workload.gpu_capacity
    assert abs(real.allocated - gpushare.allocated) / capacity < 0.03, (real.allocated, gpushare.allocated)
