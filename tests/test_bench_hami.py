"""The trace in HAMi's protocol (bench/placement/hami.py): read back by the extender's own HAMi code, the share
exact, and the end check reading what a HAMi allocation records."""

from __future__ import annotations

from typing import Any

import pytest

from bench.placement.hami import DEVMEM, HAMI, SPLIT, held, uuid_of
from bench.placement.outcome import Outcome, ReplayResult
from bench.placement.trace import MODEL_LABEL, TraceNode, TracePod, Workload
from extender.core.holds import Grant
from extender.core.protocols import hami

NODE = TraceNode("n-1", 96000, 393216, 2, "G2")
PROTOCOL = hami.Hami()


def test_a_node_is_registered_by_hamis_plugin_with_its_model_and_no_gpushare_resource() -> None:
    body = HAMI.node_object(NODE)
    devices = PROTOCOL.node_devices(body)
    assert not devices.unreadable and len(devices.devices) == 2
    assert all(device.capacity == DEVMEM for device in devices.devices)
    allocatable = body["status"]["allocatable"]
    assert allocatable[hami.GPU] == str(2 * SPLIT) and not any(name.startswith("aliyun.com/") for name in allocatable)
    assert body["metadata"]["labels"][MODEL_LABEL] == "G2"
    cpu_only = HAMI.node_object(TraceNode("c", 1000, 1024, 0, ""))
    assert hami.GPU not in cpu_only["status"]["allocatable"] and not cpu_only["metadata"].get("annotations")


@pytest.mark.parametrize(("gpus", "milli", "percent"), [(1, 470, 47), (1, 50, 5), (1, 1000, 100), (4, 1000, 100)])
def test_a_pod_asks_its_share_as_hamis_percentages_of_memory_and_compute(gpus: int, milli: int, percent: int) -> None:
    body = HAMI.pod_object(TracePod("P-1", 4000, 8192, gpus, milli, ("G2",)), "gpu-scheduler")
    limits = body["spec"]["containers"][0]["resources"]["limits"]
    assert not any(name.startswith("aliyun.com/") for name in limits)
    demand = PROTOCOL.pod_demand(body)
    assert demand.devices == gpus and demand.percent == percent and demand.cores == percent
    gpu = PROTOCOL.node_devices(HAMI.node_object(NODE)).devices[0]
    per_gpu = hami.Request(gpus, percent=demand.percent).memory_on(gpu)
    assert per_gpu * 1000 // DEVMEM == milli, "a milli-GPU share is exact in MiB"
    assert body["spec"]["affinity"]["nodeAffinity"], "the models are the same node affinity as gpushare's"


def bound(name: str, node: str, grants: list[tuple[int, int]], **annotations: str) -> dict[str, Any]:
    text = hami.encode([[Grant(index, memory, 50, uuid_of(node, index)) for index, memory in grants]], {})
    return {
        "metadata": {"name": name, "annotations": {hami.ALLOCATED: text, **annotations}},
        "spec": {"nodeName": node, "containers": [{"resources": {}}]},
    }


def test_what_a_pod_holds_is_read_from_its_allocation_in_milli_gpu() -> None:
    assert held(bound("p", "n-1", [(0, 7520), (1, 7520)])) == {0: 470, 1: 470}
    assert held(bound("p", "n-1", [(1, DEVMEM)])) == {1: 1000}
    assert held(bound("p", "n-1", [(0, 800)], **{hami.BIND_PHASE: "failed"})) is None, "the plugin refused it"
    assert held(bound("p", "other", [(0, 800)]) | {"spec": {"nodeName": "n-1"}}) is None, "a GPU of another node"
    assert held({"metadata": {"name": "p"}, "spec": {"nodeName": "n-1"}}) is None


def test_the_end_check_reads_hamis_allocations_and_finds_one_missing_or_over_a_gpu() -> None:
    pods = (TracePod("a", 100, 100, 2, 470), TracePod("b", 100, 100, 1, 1000), TracePod("c", 100, 100, 1, 530))
    workload = Workload("toy", (NODE,), pods, pods)
    outcomes = [Outcome(pod, NODE.name) for pod in pods]
    api = [bound("a", NODE.name, [(0, 7520), (1, 7520)]), bound("b", NODE.name, [(1, DEVMEM)])]
    result = ReplayResult.from_api("real", workload, outcomes[:2], api, 1.0, HAMI)
    assert result.nodes[NODE.name].gpu_used == [470, 1470]
    assert any("GPU 1: 1470 of 1000" in problem for problem in result.problems)
    missing = ReplayResult.from_api("real", workload, outcomes, [*api, bound("c", NODE.name, [])], 1.0, HAMI)
    assert any("pod c is bound to n-1 without its GPU allocation" in problem for problem in missing.problems)


def test_the_plugin_double_admits_a_pod_bound_while_its_watch_was_down() -> None:
    """The API server ends a watch with an ERROR event when its watch cache lags (seen in a churn run: "Too large
    resource version"); the double listed again and took every pod listed as bound before its start, so a pod bound
    in the gap was never allocated, its node's lock went stale and a later bind took it over after 5 minutes. A
    relist is now handled as an informer's replace: the new pod is admitted, the one gone is deleted."""
    import asyncio
    import contextlib
    from types import SimpleNamespace

    import orjson

    from tests.e2e.deviceplugin import DevicePluginDouble

    def pod(name: str, node: str) -> dict[str, Any]:
        gpu = {"limits": {"nvidia.com/gpu": "1"}}
        return {
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": gpu}]},
        }

    lists = [[pod("before", "n1")], [pod("in-the-gap", "n1")]]
    watches = [[{"type": "ERROR", "object": {"code": 504, "message": "Too large resource version"}}], None]

    class Answer:
        status = 200

        def __init__(self, events: list[dict[str, Any]] | None) -> None:
            self.events = events

        @property
        def content(self) -> Any:
            async def lines() -> Any:
                if self.events is None:
                    await asyncio.Event().wait()  # the second watch stays open
                for event in self.events or []:
                    yield orjson.dumps(event) + b"\n"

            return lines()

    class Session:
        @contextlib.asynccontextmanager
        async def get(self, url: str, **_: Any) -> Any:
            yield Answer(watches.pop(0))

    plane = SimpleNamespace(users={"admin": SimpleNamespace(token="t")}, url="https://api")
    double = DevicePluginDouble(plane, ["n1"], delay=0)  # type: ignore[arg-type]
    double._session = Session()  # type: ignore[assignment]

    async def listed(method: str, path: str, body: Any = None) -> dict[str, Any]:
        return {"items": lists.pop(0), "metadata": {"resourceVersion": "1"}}

    double._call = listed  # type: ignore[method-assign]

    async def follow() -> None:
        task = asyncio.create_task(double._follow("/api/v1/pods", double._pod_event, asyncio.Event()))
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not lists:
                break
        await asyncio.sleep(0.05)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(follow())
    queued = double._queues["n1"]
    assert queued.qsize() == 1 and queued.get_nowait()[0]["metadata"]["name"] == "in-the-gap", "admitted"
    assert set(double._pods) == {"uid-in-the-gap"}, "the pod no longer listed is gone"
    assert "uid-before" in double._admitted, "the pod bound before the start was adopted, not admitted"


@pytest.mark.parametrize(
    ("lock_names", "deleted", "refused"),
    [
        ("default/short", True, False),  # its own pod, deleted between admission and Allocate: nothing to refuse
        ("default/other", False, True),  # another pod, gone, while the admitted one lives: a refusal
        ("default/other", True, True),  # another pod, gone: the lock was not the admitted pod's, deleted or not
    ],
)
def test_the_plugin_double_drops_a_pod_deleted_while_kubelet_admits_it(
    lock_names: str, deleted: bool, refused: bool
) -> None:
    """Under churn on `gpushare100` (seed 42, HAMi's protocol, x2) a pod bound at 23:32:29.227 was deleted within a
    second (its lifetime): the double had read it for admission, then its GetPendingPod read the node's lock naming
    it and found it gone, and counted a refusal, failing the run's end check, though no pod was left to refuse (the
    extender took over the lock a second later, as HAMi's LockNode does when its pod is gone). HAMi's Allocate fails
    there and leaves the lock; the double now does the same and records nothing."""
    import asyncio
    from types import SimpleNamespace

    from tests.e2e.controlplane import ApiError
    from tests.e2e.deviceplugin import LOCK, DevicePluginDouble

    short = {
        "metadata": {"name": "short", "namespace": "default", "uid": "uid-short"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    namespace, name = lock_names.split("/")
    node = {"metadata": {"name": "n1", "annotations": {LOCK: f"2026-11-27T23:32:29Z,{namespace},{name}"}}}
    # kubelet reads the pod to admit it; then, when deleted, 404
    reads = {"/api/v1/namespaces/default/pods/short": [short] if deleted else [short, short, short]}
    writes: list[str] = []

    async def call(method: str, path: str, body: Any = None) -> dict[str, Any]:
        if method != "GET":
            writes.append(path)
            return {}
        if path == "/api/v1/nodes/n1":
            return node
        if reads.get(path):
            return reads[path].pop(0)
        raise ApiError(method, path, 404, b'{"reason": "NotFound"}')

    plane = SimpleNamespace(users={"admin": SimpleNamespace(token="t")}, url="https://api")
    double = DevicePluginDouble(plane, ["n1"], delay=0)  # type: ignore[arg-type]
    double._call = double.allocator.call = call  # type: ignore[method-assign]
    asyncio.run(double._admit("n1", short, 0.0))
    assert writes == [], "the lock stays, as HAMi's Allocate leaves it when GetPendingPod fails"
    assert double.violations == []
    if refused:
        [allocation] = double.allocations
        assert not allocation.accepted and "names default/other, which is gone" in allocation.reason
    else:
        assert double.allocations == [], "no pod to refuse"
