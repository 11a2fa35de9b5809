"""The cache's indexes: the fit index and the memo of answers follow every change, and stay bounded."""

from __future__ import annotations

import pytest

from extender.core.memo import NodeMemo, Question
from tests.builders import bound_pod, make_cluster, make_node


def test_the_fit_index_follows_every_change_of_a_node() -> None:
    node = make_node("n1", gpus=1, mem=16)
    cluster = make_cluster(node)
    fits_12 = cluster.fit_index.fitting(12, cluster.nodes)
    assert fits_12 == {"n1"}
    pod = bound_pod("a", "n1", (0,), 8)
    cluster.apply_pod(pod)
    assert fits_12 == set()  # 8 free now
    cluster.apply_pod(pod, deleted=True)
    assert fits_12 == {"n1"}
    cluster.apply_node(make_node("n1", gpus=1, mem=16, ready=False))
    assert fits_12 == set()
    cluster.apply_node(node)
    cluster.apply_node(node, deleted=True)
    assert fits_12 == set()


def test_the_memo_keeps_only_the_most_recent_questions() -> None:
    cluster = make_cluster()
    cluster.memo.limit = 2
    first = cluster.memo.table(Question("a"))
    cluster.memo.table(Question("b"))
    cluster.memo.table(Question("c"))
    assert cluster.memo.table(Question("a")) is not first


def test_the_fit_index_keeps_only_the_most_recent_demand_sizes() -> None:
    cluster = make_cluster(make_node("n1"))
    cluster.fit_index.limit = 2
    first = cluster.fit_index.fitting(1, cluster.nodes)
    cluster.fit_index.fitting(2, cluster.nodes)
    cluster.fit_index.fitting(3, cluster.nodes)
    assert cluster.fit_index.fitting(1, cluster.nodes) is not first  # evicted, rebuilt


def test_a_table_read_after_changes_has_lost_the_changed_nodes_answers_and_kept_the_others() -> None:
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    question: Question[int] = Question("q")
    cluster.memo.table(question).update({"n1": 1, "n2": 2})
    cluster.apply_pod(bound_pod("a", "n1", (0,), 4))
    assert cluster.memo.table(question) == {"n2": 2}


def test_a_table_left_unread_beyond_what_the_log_keeps_is_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster(make_node("n1"), make_node("n2"))
    monkeypatch.setattr(NodeMemo, "LOG_LIMIT", 4)
    question: Question[int] = Question("q")
    cluster.memo.table(question).update({"n1": 1, "n2": 2})
    for number in range(6):
        cluster.memo.forget(f"elsewhere-{number}")
    assert cluster.memo.table(question) == {}
