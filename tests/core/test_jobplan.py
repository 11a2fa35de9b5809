"""A job's hold as its members' binds write it on their pods (`core/jobplan.py`): read back as written, never
more than its limit, and anything else taken as nothing written."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from extender.core import jobplan
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL, GroupKey, Scheme, WrittenHold
from extender.core.holds import Allocation, Grant, HoldState
from extender.core.mig import MigInstance
from tests.builders import FakeClock, make_cluster, make_ledger, make_node, make_pod

JOB = GroupKey(Scheme.COSCHEDULING, "team", "train-7")


def test_a_written_hold_reads_back_as_it_was_whole_gpus_shares_uuids_mig_instances_and_init_containers() -> None:
    waiting = (
        Allocation.uniform("uid-1", "team/train-7-1", "n1", (0, 3), 16),
        Allocation("uid-2", "team/train-7-2", "n2", ((Grant(-1, 8000, 30, "GPU-a"),),)),
        Allocation(
            "uid-3",
            "team/train-7-3",
            "n3",
            ((Grant(2, 10000, 14, "GPU-c", MigInstance("1g.10gb", 4, 1)),), (Grant(0, 4000, 0),)),
            init_containers=1,
        ),
    )
    text = jobplan.encode(JOB, 1_700_000_123.25, waiting)
    assert text is not None
    assert jobplan.written({jobplan.ANNOTATION: text}) == WrittenHold(JOB, 1_700_000_123.25, waiting)


def test_a_job_too_large_to_write_is_not_written() -> None:
    member = Allocation.uniform("u" * 36, "team/" + "p" * 60, "node-" + "x" * 50, (0,), 16)
    assert jobplan.encode(JOB, 1.0, [member] * 200) is not None
    assert jobplan.encode(JOB, 1.0, [member] * 1000) is None, "1,000 members pass 64 KiB"


def good() -> dict[str, object]:
    return orjson.loads(jobplan.encode(JOB, 5.0, [Allocation.uniform("u", "team/p", "n1", (1,), 8)]) or "")


@pytest.mark.parametrize(
    "change",
    [
        {"scheme": "KAI"},
        {"since": "5"},
        {"since": True},
        {"name": 7},
        {"waiting": [["u", "team/p", "n1", 0, [[[1, -8, 0, "", None]]]]]},
        {"waiting": [["u", "team/p", "n1", 0, [[[1, 8, 0, "", ["1g.10gb", 4]]]]]]},
        {"waiting": [["u", "team/p", "n1", True, [[[1, 8, 0, "", None]]]]]},
        {"waiting": [["u", "team/p", "n1", 0, [[[1, 2**60, 0, "", None]]]]]},
        {"waiting": [["u", "team/p", "n1"]]},
        {"waiting": {"u": "n1"}},
    ],
)
def test_anything_but_what_encode_writes_is_taken_as_nothing_written(change: dict[str, object]) -> None:
    assert jobplan.written({jobplan.ANNOTATION: orjson.dumps(good()).decode()}) is not None
    assert jobplan.written({jobplan.ANNOTATION: orjson.dumps(good() | change).decode()}) is None


@pytest.mark.parametrize("text", ["", "{", "[]", "null", 3, None, " " * (jobplan.LIMIT + 1)])
def test_no_json_object_or_more_than_the_limit_is_nothing_written(text: object) -> None:
    assert jobplan.written({jobplan.ANNOTATION: text}) is None
    assert jobplan.written({}) is None


# ---- held again by the ledger ------------------------------------------------------------------------------------

TRAIN = GroupKey(Scheme.KUEUE, "default", "train")
PLAN = {"w-0": ("n1", 0), "w-1": ("n1", 1), "w-2": ("n2", 0)}
"""A job of three whole 16 GiB GPUs, as planned: w-0 and w-1 on n1, w-2 on n2."""


def kueue_member(name: str, **kwargs: Any) -> dict[str, Any]:
    pod = make_pod(name, gpu_mem=16, uid=f"uid-{name}", **kwargs)
    pod["metadata"]["labels"] = {KUEUE_GROUP: "train"}
    pod["metadata"]["annotations"][KUEUE_TOTAL] = "3"
    return pod


def nodes() -> list[dict[str, Any]]:
    return [make_node("n1", gpus=2, mem=16), make_node("n2", gpus=2, mem=16)]


def held_whole(clock: FakeClock) -> tuple[Any, Any]:
    """A cache with the job's three pods pending and a ledger holding the job whole as `PLAN` says."""
    cluster = make_cluster(*nodes(), pods=tuple(kueue_member(name) for name in PLAN))
    ledger = make_ledger(cluster, clock=clock)
    allocations = [
        Allocation.uniform(f"uid-{name}", f"default/{name}", node, (gpu,), 16) for name, (node, gpu) in PLAN.items()
    ]
    assert ledger.reserve_group(TRAIN, allocations) is None
    return cluster, ledger


def first_bind(clock: FakeClock) -> str:
    """The job held whole by a ledger, w-0's bind taking its hold: what that bind writes of the job's hold."""
    _, ledger = held_whole(clock)
    assert ledger.take_grouped("uid-w-0", "n1") is not None
    text = ledger.written(TRAIN)
    assert text is not None
    return text


def restarted(
    text: str, clock: FakeClock, *extra: dict[str, Any], bound: tuple[str, ...] = ("w-0",)
) -> tuple[Any, Any]:
    """A new cache and ledger from the API's objects after the restart: the members in `bound` bound where planned
    (w-0 carrying what its bind wrote), the others pending, and `extra` pods."""
    pods = []
    for name, (node, gpu) in PLAN.items():
        if name in bound:
            pod = kueue_member(name, node=node, indexes=(gpu,), phase="Running")
            if name == "w-0":
                pod["metadata"]["annotations"][jobplan.ANNOTATION] = text
        else:
            pod = kueue_member(name)
        pods.append(pod)
    cluster = make_cluster(*nodes(), pods=(*pods, *extra))
    return cluster, make_ledger(cluster, clock=clock)


def grouped(cluster: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        uid: (hold.allocation.node, hold.allocation.indexes)
        for uid, hold in cluster.reserved.items()
        if hold.state is HoldState.GROUPED
    }


def test_after_a_restart_between_two_members_binds_the_others_are_held_again_as_written() -> None:
    clock = FakeClock()
    text = first_bind(clock)
    clock.advance(10)
    cluster, ledger = restarted(text, clock)
    assert ledger.restore_groups() == [TRAIN]
    assert grouped(cluster) == {"uid-w-1": ("n1", (1,)), "uid-w-2": ("n2", (0,))}
    held = ledger.group_hold(TRAIN)
    assert held is not None and held.since == clock.now - 10, "it expires when the hold written would have"
    assert cluster.groups.written() == [] and ledger.restore_groups() == [], "held once"
    clock.advance(51)
    assert [released.group.key for released in ledger.expire_groups()] == [TRAIN]


def test_a_member_bound_since_is_left_out_and_the_rest_held() -> None:
    clock = FakeClock()
    text = first_bind(clock)
    cluster, ledger = restarted(text, clock, bound=("w-0", "w-1"))
    assert ledger.restore_groups() == [TRAIN]
    assert grouped(cluster) == {"uid-w-2": ("n2", (0,))}


def test_a_written_hold_expired_a_member_gone_or_its_room_taken_is_not_held_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    text = first_bind(clock)
    clock.advance(61)
    cluster, ledger = restarted(text, clock)
    assert ledger.restore_groups() == [] and not cluster.reserved, "past the job's hold's expiry"
    assert cluster.groups.written() == [], "and forgotten"

    clock = FakeClock()
    text = first_bind(clock)
    cluster, ledger = restarted(text, clock)
    cluster.apply_pod(kueue_member("w-2"), deleted=True)
    assert ledger.restore_groups() == [] and not cluster.reserved, "w-2 is gone: the job is planned again"

    other = make_pod("other", gpu_mem=16, node="n2", indexes=(0,), phase="Running")
    cluster, ledger = restarted(text, clock, other)
    with caplog.at_level(logging.WARNING, "extender.core.ledger"):
        assert ledger.restore_groups() == [] and not cluster.reserved
    assert "job default/train: its hold written by its members' binds cannot be held again" in caplog.text


def test_a_hold_let_go_here_is_never_held_again_from_what_it_wrote() -> None:
    """The leader lets go of a job's hold (a member's bind failed, say) after its first bind wrote it: the watch
    shows that pod with the written hold, and the sweep must not take the hold back."""
    clock = FakeClock()
    cluster, ledger = held_whole(clock)
    assert ledger.take_grouped("uid-w-0", "n1") is not None
    text = ledger.written(TRAIN)
    assert text is not None and ledger.release_group(TRAIN)
    shown = kueue_member("w-0", node="n1", indexes=(0,), phase="Running")
    shown["metadata"]["annotations"][jobplan.ANNOTATION] = text
    cluster.apply_pod(shown)
    assert cluster.groups.written() == [] and ledger.restore_groups() == [] and grouped(cluster) == {}


def test_the_last_members_bind_writes_nothing_more() -> None:
    clock = FakeClock()
    _, ledger = held_whole(clock)
    for name, (node, _) in PLAN.items():
        assert ledger.take_grouped(f"uid-{name}", node) is not None
        said = ledger.written(TRAIN)
        waiting = [] if said is None else [allocation.pod for allocation in jobplan.decode(said).waiting]
        assert waiting == [f"default/{other}" for other in PLAN if other > name]


def test_the_written_hold_and_the_messages_of_a_restart(caplog: pytest.LogCaptureFixture) -> None:
    """Each written hold is judged on its own (one refused, expired or of no use does not stop the next), and the
    log says which job was held again, for how many members, or why not."""
    clock = FakeClock()
    text = first_bind(clock)
    other = GroupKey(Scheme.KUEUE, "default", "other")
    cluster, ledger = restarted(text, clock, make_pod("taken", gpu_mem=16, node="n2", indexes=(1,), phase="Running"))
    late = WrittenHold(other, clock.now - 61, (Allocation.uniform("uid-x", "default/x", "n2", (1,), 16),))
    refused = WrittenHold(other, clock.now, (Allocation.uniform("uid-w-2", "default/w-2", "n2", (1,), 16),))
    with caplog.at_level(logging.INFO, "extender.core.ledger"):
        cluster.groups.move("uid-late", None, None, late)
        assert ledger.restore_groups() == [TRAIN], "an expired hold of another job written first"
        cluster.groups.move("uid-refused", None, None, refused)
        ledger.release_group(TRAIN)
        cluster.groups.move("uid-w-0", None, None, jobplan.written({jobplan.ANNOTATION: text}))
        assert ledger.restore_groups() == [], "train let go here; other's GPU 1 on n2 is taken"
    assert caplog.messages == [
        "job default/train: its hold for 2 members held again as its members' binds wrote it",
        "job default/other: its hold written by its members' binds cannot be held again "
        "(pod default/w-2: GPU 1 on n2 has 0 free, needs 16)",
    ]


def test_a_member_decided_or_bound_since_is_left_out_one_assumed_is_held() -> None:
    """After the hold was written, w-1 was bound by another scheduler (no allocation of ours on it) and w-2's
    filter assumed a GPU: w-1 is left out (it is placed), w-2 is held as written, its assumption replaced."""
    clock = FakeClock()
    text = first_bind(clock)
    cluster, ledger = restarted(text, clock, bound=("w-0",))
    elsewhere = kueue_member("w-1")
    elsewhere["spec"]["nodeName"] = "n2"
    cluster.apply_pod(elsewhere)
    assert ledger.assume(Allocation.uniform("uid-w-2", "default/w-2", "n2", (1,), 16), 0)
    assert ledger.restore_groups() == [TRAIN]
    assert grouped(cluster) == {"uid-w-2": ("n2", (0,))}

    cluster, ledger = restarted(text, clock, bound=("w-0",))
    assert ledger.reserve(Allocation.uniform("uid-w-1", "default/w-1", "n2", (1,), 16)) is None
    assert ledger.restore_groups() == [TRAIN], "w-1 decided (reserved) elsewhere: left out"
    assert grouped(cluster) == {"uid-w-2": ("n2", (0,))}


def test_what_a_bind_writes_leaves_out_a_member_gone_before_the_sweep() -> None:
    clock = FakeClock()
    cluster, ledger = held_whole(clock)
    cluster.apply_pod(kueue_member("w-2"), deleted=True)
    said = ledger.written(TRAIN)
    assert said is not None and [allocation.pod for allocation in jobplan.decode(said).waiting] == [
        "default/w-0",
        "default/w-1",
    ]


def test_every_written_hold_is_judged_whatever_comes_before_it() -> None:
    """Written holds in this order: one of a job held here already, one expired a moment ago, one whose GPU is
    taken, one written exactly a TTL ago: each skipped on its own, and the last held again (a hold expires only
    once strictly older than the TTL, as the sweep lets go)."""
    clock = FakeClock()
    cluster = make_cluster(*nodes(), pods=(*(kueue_member(name) for name in PLAN), make_pod("x", uid="uid-x")))
    ledger = make_ledger(cluster, clock=clock)
    held = GroupKey(Scheme.KUEUE, "default", "held")
    assert ledger.reserve_group(held, [Allocation.uniform("uid-x", "default/x", "n1", (0,), 16)]) is None
    jobs = [GroupKey(Scheme.KUEUE, "default", name) for name in ("late", "full")]
    written = [
        WrittenHold(held, clock.now, (Allocation.uniform("uid-x", "default/x", "n1", (1,), 16),)),
        WrittenHold(jobs[0], clock.now - 60.001, (Allocation.uniform("uid-w-0", "default/w-0", "n2", (0,), 16),)),
        WrittenHold(jobs[1], clock.now, (Allocation.uniform("uid-w-1", "default/w-1", "n1", (0,), 16),)),
        WrittenHold(TRAIN, clock.now - 60.0, (Allocation.uniform("uid-w-2", "default/w-2", "n2", (1,), 16),)),
    ]
    for number, hold in enumerate(written):
        cluster.groups.move(f"uid-{number}", None, None, hold)
    assert ledger.restore_groups() == [TRAIN]
    assert grouped(cluster) == {"uid-x": ("n1", (0,)), "uid-w-2": ("n2", (1,))}
