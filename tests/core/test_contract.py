"""The wire contract: every request kube-scheduler (v1.31, v1.34) and the gpushare extender's scheduler really
sent is accepted and answered well-formed, in the form it was asked, through the real HTTP app."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.core import contract
from extender.core.protocols.gpushare import Profile
from tests.builders import make_cluster
from tests.conftest import CAPTURED, ClientFor, captured, make_service

EXAMPLE_PROFILE = Profile(memory_resource="example.com/gpu-mem", count_resource="example.com/gpu-count")
"""The captured k8s scenarios manage `example.com/gpu-mem` (node-a and node-b: 2 GPUs, 16 in all)."""


def _verb(path: Path) -> str:
    return path.name.split(".")[0].rsplit("-", 1)[1]


def _sent_names(body: dict[str, Any]) -> list[str]:
    if body.get("NodeNames") is not None:
        return list(body["NodeNames"])
    return [node["metadata"]["name"] for node in (body.get("Nodes") or {}).get("items") or []]


def check_well_formed(verb: str, request: dict[str, Any], reply: Any) -> None:
    if verb == "filter":
        result = contract.ExtenderFilterResult.model_validate(reply)
        sent = _sent_names(request)
        if request.get("NodeNames") is not None:
            assert result.NodeNames is not None
            returned = result.NodeNames
        else:
            assert result.Nodes is not None and result.Nodes.items is not None
            returned = [node["metadata"]["name"] for node in result.Nodes.items]
        assert set(returned) <= set(sent)
        judged = returned + list(result.FailedNodes) + list(result.FailedAndUnresolvableNodes)
        assert len(judged) == len(set(judged)) and set(judged) <= set(sent), "each node sent answered at most once"
        # A node left out of all three is dropped by kube-scheduler without a status (extender.go Filter): the
        # fragmentation policy leaves out the nodes that fit worse than the one it passes. A pod that fits
        # nowhere gets a reason for every node.
        if not returned:
            assert sorted(judged) == sorted(sent), "a refusal explains every node sent"
    elif verb == "prioritize":
        scores = contract.HostPriorityList.validate_python(reply)
        sent = _sent_names(request)
        hosts = [entry.Host for entry in scores]
        assert hosts == [name for name in sent if name in set(hosts)], "only nodes sent, each once, in their order"
        assert all(entry.Score > 0 for entry in scores), "a node left out scores 0: one listed is above it"
    elif verb == "bind":
        contract.ExtenderBindingResult.model_validate(reply)
    elif verb == "preempt":
        result = contract.ExtenderPreemptionResult.model_validate(reply)
        candidates, _ = contract.preemption_candidates(contract.ExtenderPreemptionArgs.model_validate(request))
        for node, victims in result.NodeNameToMetaVictims.items():
            assert node in candidates
            assert [pod.UID for pod in victims.Pods or ()] == candidates[node]


def cluster_for(directory: str) -> tuple[Any, Profile]:
    if directory == "gpushare":
        nodes = captured("gpushare/gpushare-001-filter.resp.json")["Nodes"]["items"]
        return make_cluster(*nodes), Profile()
    nodes = captured(f"{directory}/ext1-001-filter.req.json")["Nodes"]["items"]
    return make_cluster(*nodes, profile=EXAMPLE_PROFILE), EXAMPLE_PROFILE


@pytest.mark.parametrize("directory", ["gpushare", "k8s-1.31", "k8s-1.34"])
async def test_every_captured_request_is_answered_well_formed(directory: str, client_for: ClientFor) -> None:
    cluster, _ = cluster_for(directory)
    client = await client_for(make_service(cluster))
    requests = sorted((CAPTURED / directory).glob("*.req.json"))
    assert requests
    for path in requests:
        body = orjson.loads(path.read_bytes())
        response = await client.post(f"/{_verb(path)}", data=path.read_bytes())
        assert response.status == 200, (path.name, await response.text())
        check_well_formed(_verb(path), body, await response.json())
        assert not cluster.overcommitted()


async def test_gpushare_flow_places_both_pods_and_calls_the_too_big_one_unresolvable(client_for: ClientFor) -> None:
    cluster, _ = cluster_for("gpushare")
    client = await client_for(make_service(cluster))
    answers = {}
    for path in sorted((CAPTURED / "gpushare").glob("*.req.json")):
        response = await client.post(f"/{_verb(path)}", data=path.read_bytes())
        answers[path.name.split(".")[0]] = await response.json()
    assert answers["gpushare-001-filter"]["NodeNames"] == ["gpu-node-2", "gpu-node-1"]
    assert answers["gpushare-003-bind"] == {"Error": ""}
    assert answers["gpushare-004-bind"] == {"Error": ""}
    too_big = answers["gpushare-005-filter"]
    # The Go extender said "Insufficient GPU Memory in one device" in FailedNodes: preemption was tried for nothing.
    assert too_big["NodeNames"] == []
    assert too_big["FailedAndUnresolvableNodes"] == {
        "gpu-node-1": "needs 20 GiB on one GPU; the largest GPU here has 16 GiB"
    }
    assert cluster.nodes["gpu-node-1"].used == [10, 0]
    assert cluster.nodes["gpu-node-2"].used == [12]


async def test_the_nodes_form_is_answered_with_whole_nodes(client_for: ClientFor) -> None:
    cluster, _ = cluster_for("k8s-1.34")
    client = await client_for(make_service(cluster))
    response = await client.post("/filter", data=(CAPTURED / "k8s-1.34/ext1-001-filter.req.json").read_bytes())
    reply = await response.json()
    assert reply["NodeNames"] is None
    assert [node["metadata"]["name"] for node in reply["Nodes"]["items"]] == ["node-a", "node-b"]


async def test_whole_nodes_unknown_to_the_cache_are_judged_from_the_objects_sent(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster(profile=EXAMPLE_PROFILE)))
    response = await client.post("/filter", data=(CAPTURED / "k8s-1.34/ext1-001-filter.req.json").read_bytes())
    reply = await response.json()
    assert [node["metadata"]["name"] for node in reply["Nodes"]["items"]] == ["node-a", "node-b"]


async def test_a_pod_too_big_for_any_single_gpu_is_refused_at_bind_with_the_reason(client_for: ClientFor) -> None:
    # In the captured scenario the scheduler binds filler-a (12) to node-a, whose 2 GPUs hold 8 each.
    cluster, _ = cluster_for("k8s-1.34")
    client = await client_for(make_service(cluster))
    for name in ("ext2-007-filter", "ext2-008-bind"):
        response = await client.post(
            f"/{name.rsplit('-', 1)[1]}", data=(CAPTURED / f"k8s-1.34/{name}.req.json").read_bytes()
        )
    assert (await response.json())["Error"] == (
        "pod default/filler-a no longer fits on node-a: needs 12 GiB on one GPU; the largest GPU here has 8 GiB"
    )


async def test_preemption_with_whole_victims_answers_meta_victims(client_for: ClientFor) -> None:
    cluster, _ = cluster_for("k8s-1.34")
    client = await client_for(make_service(cluster))
    response = await client.post("/preempt", data=(CAPTURED / "k8s-1.34/ext1-005-preempt.req.json").read_bytes())
    reply = await response.json()
    # high-pod asks 8: both nodes have an empty 8 GiB GPU already, so both candidates stand, victims unchanged.
    assert reply == captured("k8s-1.34/ext1-005-preempt.resp.json")
