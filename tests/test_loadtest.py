"""The load test cannot rot: a few seconds of the real thing against a small cluster, and its arithmetic.

The smoke run executes `python -m loadtest.run` as a subprocess (Locust brings gevent, whose monkey-patching
must never reach this process: nothing here imports locust, gevent or `loadtest.locustfile`) and fails on a
broken script, any request error, no pod placed, or a failed end check. It never asserts on latency, so a busy
machine cannot make it flake. The rest checks `loadtest.workload`, which is pure.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loadtest.workload import (
    NAMESPACE,
    NodeSample,
    PodBodies,
    PodMix,
    args_body,
    best_host,
    best_host_encoded,
    nodes_to_find,
    percentile,
)

ROOT = Path(__file__).resolve().parent.parent
SMOKE_TIMEOUT = 60


@pytest.mark.parametrize(
    ("flags", "verbs"),
    [
        # kube-scheduler calls prioritize only when more than one node passed; the default policy passes the
        # best one (the fragmentation policy's narrowing), so filter and bind are what it sends ...
        ((), {"filter", "bind"}),
        # ... and a flag for the server reaches it: binpack passes every node that fits, so prioritize is called.
        (("--server-flag=--placement=fill",), {"filter", "prioritize", "bind"}),
    ],
)
def test_a_short_run_places_pods_without_errors_and_leaves_the_cluster_consistent(
    tmp_path: Path, flags: tuple[str, ...], verbs: set[str]
) -> None:
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "loadtest.run", "--nodes", "20", "--pods-per-second", "20", "--duration", "3",
        "--report", str(report), *flags,
    ]  # fmt: skip

    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT)

    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    summary = json.loads(report.read_text())
    assert summary["errors"] == 0
    assert summary["locust"]["outcomes"]["placed"] > 0
    assert set(summary["locust"]["verbs"]) == verbs
    assert summary["checks"] and all(check["ok"] for check in summary["checks"]), summary["checks"]


@pytest.mark.parametrize(
    ("nodes", "names"),
    [
        (20, 20),  # under 100 nodes: all of them
        (100, 100),  # 50% would be 50: raised to the minimum of 100
        (1000, 420),  # 50 - 1000/125 = 42%
        (5000, 500),  # 50 - 40 = 10%
        (10000, 500),  # 50 - 80 < 5: 5%
    ],
)
def test_names_per_filter_follow_kube_schedulers_adaptive_percentage(nodes: int, names: int) -> None:
    assert nodes_to_find(nodes) == names


def test_a_fixed_percentage_overrides_the_adaptive_one() -> None:
    assert nodes_to_find(1000, percentage=20) == 200
    assert nodes_to_find(1000, percentage=100) == 1000


def test_each_window_starts_where_the_last_one_ended_and_wraps() -> None:
    sample = NodeSample(["a", "b", "c", "d", "e"], 2)

    assert [sample.next() for _ in range(3)] == [["a", "b"], ["c", "d"], ["e", "a"]]


def test_a_window_is_never_larger_than_the_cluster() -> None:
    assert NodeSample(["a", "b"], 1000).next() == ["a", "b"]


def test_pod_mix_draws_only_its_sizes_in_proportion() -> None:
    mix = PodMix.parse("2:3,40:1")
    rng = random.Random(1)

    draws = [mix.draw(rng) for _ in range(4000)]

    assert set(draws) == {2, 40}
    assert draws.count(2) / len(draws) == pytest.approx(0.75, abs=0.03)
    assert mix.mean == pytest.approx((2 * 3 + 40) / 4)


@pytest.mark.parametrize("text", ["", "2:x", "0:1", "4:-1", "big"])
def test_a_bad_pod_mix_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="pod mix"):
        PodMix.parse(text)


def test_a_pod_body_is_the_captured_pod_under_a_new_name_uid_and_size() -> None:
    bodies = PodBodies([4])

    pod = orjson.loads(bodies.render(4, "load-0000001", "0b7c9f8e-1111-4222-8333-444455556666"))

    assert pod["metadata"]["name"] == "load-0000001"
    assert pod["metadata"]["uid"] == "0b7c9f8e-1111-4222-8333-444455556666"
    assert pod["metadata"]["namespace"] == NAMESPACE
    assert pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
    assert pod["spec"]["containers"][0]["resources"]["requests"]["aliyun.com/gpu-mem"] == "4"
    assert pod["metadata"]["managedFields"], "the captured pod's bulk (managed fields, volumes) stays"


def test_args_body_is_extender_args_with_node_names() -> None:
    body = orjson.loads(args_body(b'{"metadata":{}}', ["n1", "n2"]))

    assert body == {"Pod": {"metadata": {}}, "Nodes": None, "NodeNames": ["n1", "n2"]}


def test_the_best_score_wins_and_ties_are_drawn_among_the_best_only() -> None:
    priorities = [{"Host": "a", "Score": 3}, {"Host": "b", "Score": 7}, {"Host": "c", "Score": 7}]
    rng = random.Random(1)

    picks = {best_host(priorities, ["a", "b", "c", "d"], rng) for _ in range(50)}

    assert picks == {"b", "c"}


def test_hosts_left_out_of_the_reply_score_0() -> None:
    rng = random.Random(1)

    assert {best_host([], ["a", "b"], rng) for _ in range(50)} == {"a", "b"}
    assert {best_host([{"Host": "a", "Score": 0}], ["a", "b"], rng) for _ in range(50)} == {"a", "b"}


def test_reading_the_encoded_reply_agrees_with_decoding_it() -> None:
    priorities = [{"Host": f"gpu-node-{n:04d}", "Score": n % 11} for n in range(1, 200) if n % 11]
    body = orjson.dumps(priorities)

    picks = {best_host_encoded(body, ["gpu-node-0000"], random.Random(seed)) for seed in range(40)}

    assert picks == {entry["Host"] for entry in priorities if entry["Score"] == 10}


def test_an_empty_encoded_reply_draws_among_every_host_asked() -> None:
    assert {best_host_encoded(b"[]", ["a", "b"], random.Random(seed)) for seed in range(40)} == {"a", "b"}


@pytest.mark.parametrize(
    "body",
    [
        b'[{"Score":7,"Host":"a"}]',  # another key order: decode it in full
        b'[{"Host":"a","Score":0}]',  # a host at 0 ties with those left out
        b'[{"Host":"a","Score":70}]',  # no score within 0..10
    ],
)
def test_a_reply_in_another_form_is_left_to_the_full_decoder(body: bytes) -> None:
    assert best_host_encoded(body, ["a"], random.Random(1)) is None


def test_percentile_is_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]

    assert (percentile(samples, 0.5), percentile(samples, 0.99), percentile(samples, 1.0)) == (50.0, 99.0, 100.0)
    assert percentile([], 0.99) == 0.0
