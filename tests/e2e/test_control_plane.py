"""Smoke tests of the e2e tier's own control plane: the pinned release runs, the extender user has exactly the
rights it needs, a real kube-scheduler binds pods to kubelet-less nodes, and watches behave as the extender's
watch loop expects.

What the real v1.34.1 API server answered here, for the extender's code to rely on:
- Binding a pod that is already bound, to the same node or another: 409, reason Conflict, message exactly
  `Operation cannot be fulfilled on pods/binding "<pod>": pod <pod> is already assigned to node "<node>"`
  (details.kind "pods/binding"). Binding a missing pod: 404 NotFound, `pods "<pod>" not found`.
- A watch from a compacted resourceVersion does not fail the request: it answers 200 and sends one
  `ERROR` event whose object is a Status with code 410, reason Expired, message
  "The resourceVersion for the provided watch is too old." (a LIST with resourceVersionMatch=Exact answers
  410 directly: "...for the provided list is too old."). With the watch cache on (the default), a watch from
  an old resourceVersion such as 1 is NOT refused while the cache has evicted nothing since it was filled:
  it replays the current objects as ADDED events; the 410 needs the watch cache off, or eviction.
- etcd 3.4 (Debian's) lacks RequestWatchProgress, which the API server notes at start-up
  ("RequestWatchProgress feature is not supported"); consistent LISTs are then served from etcd.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.conftest import Remember
from tests.e2e.controlplane import EXTENDER_NAMESPACE, ApiError, ControlPlane, eventually

pytestmark = pytest.mark.e2e

NOBODY = "e2e-nobody"
"""A schedulerName no running scheduler owns: pods the tests bind by hand."""
PLAIN_SCHEDULER = """
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
  - schedulerName: default-scheduler
"""


def pod_path(name: str, namespace: str = "default") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def binding(pod: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}}


async def test_api_server_reports_the_pinned_release(control_plane: ControlPlane) -> None:
    version = await control_plane.api("GET", "/version")
    assert version["gitVersion"] == control_plane.version == "v1.34.1"
    assert (version["major"], version["minor"]) == ("1", "34")


async def test_nodes_are_created_ready_with_gpu_resources_and_no_taints(
    control_plane: ControlPlane, cleanup: Remember
) -> None:
    node = await control_plane.create_node("smoke-gpu", gpus=2, gpu_mem=16)
    cleanup("/api/v1/nodes/smoke-gpu")
    stored = await control_plane.api("GET", "/api/v1/nodes/smoke-gpu")
    assert stored["status"]["allocatable"] == node["status"]["allocatable"]
    assert stored["status"]["allocatable"]["aliyun.com/gpu-mem"] == "32"
    assert stored["status"]["allocatable"]["aliyun.com/gpu-count"] == "2"
    assert [c["status"] for c in stored["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
    assert "taints" not in stored["spec"]


async def test_extender_lists_nodes_and_pods(control_plane: ControlPlane, cleanup: Remember) -> None:
    await control_plane.create_node("smoke-list")
    cleanup("/api/v1/nodes/smoke-list")
    await control_plane.create_pod("smoke-list", gpu_mem=4, scheduler_name=NOBODY)
    cleanup(pod_path("smoke-list"))
    nodes = await control_plane.api("GET", "/api/v1/nodes", user="extender")
    pods = await control_plane.list_pods(user="extender")
    assert "smoke-list" in {node["metadata"]["name"] for node in nodes["items"]}
    assert "smoke-list" in {pod["metadata"]["name"] for pod in pods["items"]}


async def test_extender_binds_a_pod_once_and_a_second_binding_conflicts(
    control_plane: ControlPlane, cleanup: Remember
) -> None:
    await control_plane.create_node("smoke-bind")
    cleanup("/api/v1/nodes/smoke-bind")
    await control_plane.create_pod("smoke-bind", gpu_mem=4, scheduler_name=NOBODY)
    cleanup(pod_path("smoke-bind"))
    created = await control_plane.api(
        "POST", pod_path("smoke-bind") + "/binding", binding("smoke-bind", "smoke-bind"), user="extender"
    )
    assert (created["status"], created["code"]) == ("Success", 201)
    assert (await control_plane.api("GET", pod_path("smoke-bind")))["spec"]["nodeName"] == "smoke-bind"

    with pytest.raises(ApiError) as conflict:
        await control_plane.api(
            "POST", pod_path("smoke-bind") + "/binding", binding("smoke-bind", "another"), user="extender"
        )
    assert (conflict.value.status, conflict.value.reason) == (409, "Conflict")
    assert conflict.value.message == (
        'Operation cannot be fulfilled on pods/binding "smoke-bind": pod smoke-bind is already assigned to node '
        '"smoke-bind"'
    )


@pytest.mark.parametrize(
    ("path", "event"),
    [
        (
            "/api/v1/namespaces/default/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": "smoke-"},
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "smoke"},
                "reason": "Smoke",
                "message": "core event",
                "type": "Normal",
                "source": {"component": "gpu-extender"},
            },
        ),
    ],
    ids=["core"],
)
async def test_extender_creates_events(
    control_plane: ControlPlane, cleanup: Remember, path: str, event: dict[str, Any]
) -> None:
    created = await control_plane.api("POST", path, event, user="extender")
    cleanup(f"{path}/{created['metadata']['name']}")
    assert created["reason"] == "Smoke"


async def test_extender_gets_creates_and_updates_its_lease(control_plane: ControlPlane, cleanup: Remember) -> None:
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases"
    # The manifests grant get/update on named Leases only; "e2e-election" is the tier's own (LEASE_RULES).
    lease = {"metadata": {"name": "e2e-election"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}
    with pytest.raises(ApiError) as missing:
        await control_plane.api("GET", f"{leases}/e2e-election", user="extender")
    assert missing.value.status == 404
    created = await control_plane.api("POST", leases, lease, user="extender")
    cleanup(f"{leases}/e2e-election")
    created["spec"]["holderIdentity"] = "b"
    updated = await control_plane.api("PUT", f"{leases}/e2e-election", created, user="extender")
    fetched = await control_plane.api("GET", f"{leases}/e2e-election", user="extender")
    assert updated["spec"]["holderIdentity"] == fetched["spec"]["holderIdentity"] == "b"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/api/v1/nodes/smoke-any"),
        ("GET", "/api/v1/namespaces/kube-system/secrets"),
        ("DELETE", "/api/v1/namespaces/default/pods/smoke-any"),
        ("POST", "/api/v1/namespaces/default/pods"),
        ("PATCH", "/api/v1/nodes/smoke-any"),
        ("GET", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"),
        ("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases/smoke-any"),
        ("GET", "/api/v1/namespaces/default/configmaps"),
        ("PATCH", "/api/v1/namespaces/default/pods/smoke-any"),
        ("POST", "/apis/events.k8s.io/v1/namespaces/default/events"),
        ("GET", f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases/someone-elses"),
    ],
)
async def test_extender_is_forbidden_everything_else(control_plane: ControlPlane, method: str, path: str) -> None:
    with pytest.raises(ApiError) as refused:
        await control_plane.api(method, path, {} if method in {"POST", "PATCH"} else None, user="extender")
    assert (refused.value.status, refused.value.reason) == (403, "Forbidden")
    assert 'User "gpu-extender" cannot' in refused.value.message


async def test_scheduler_binds_a_plain_pod_to_a_kubeletless_node(
    control_plane: ControlPlane, cleanup: Remember
) -> None:
    await control_plane.create_node("smoke-schedule", gpus=0)
    cleanup("/api/v1/nodes/smoke-schedule")
    scheduler = control_plane.start_scheduler(PLAIN_SCHEDULER)
    try:
        await control_plane.create_pod("smoke-schedule")
        cleanup(pod_path("smoke-schedule"))

        async def node_name() -> str:
            return str((await control_plane.api("GET", pod_path("smoke-schedule")))["spec"].get("nodeName", ""))

        assert await eventually(node_name) == "smoke-schedule"

        # The scheduler logs the bind after the API answered it, so after we may see the pod bound: wait for it.
        async def logged() -> bool:
            return 'Successfully bound pod to node" pod="default/smoke-schedule"' in control_plane.scheduler_log(
                scheduler
            )

        assert await eventually(logged)
    finally:
        control_plane.stop_scheduler(scheduler)
    assert scheduler.returncode is not None


async def test_watch_from_a_listed_resource_version_shows_a_created_pod(
    control_plane: ControlPlane, cleanup: Remember
) -> None:
    listed = await control_plane.list_pods(user="extender")
    since = listed["metadata"]["resourceVersion"]
    path = f"/api/v1/pods?watch=1&allowWatchBookmarks=true&resourceVersion={since}"
    async with control_plane.watch(path, user="extender", timeout=30) as events:
        await control_plane.create_pod("smoke-watch", gpu_mem=2, scheduler_name=NOBODY)
        cleanup(pod_path("smoke-watch"))
        async for event in events:
            if event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "smoke-watch":
                break
        else:
            pytest.fail("the watch ended without an ADDED event for smoke-watch")
    assert int(event["object"]["metadata"]["resourceVersion"]) > int(since)


async def test_watch_from_a_compacted_resource_version_ends_with_an_expired_error_event(
    tmp_path_factory: pytest.TempPathFactory, control_plane: ControlPlane
) -> None:
    """Its own control plane, with the watch cache off so watches reach etcd, and compaction every second."""
    plane = ControlPlane(
        control_plane.binaries,
        tmp_path_factory.mktemp("compacting-control-plane"),
        ["--watch-cache=false", "--etcd-compaction-interval=1s"],
    )
    plane.start()
    try:
        old = (await plane.create_pod("old", scheduler_name=NOBODY))["metadata"]["resourceVersion"]

        async def expired() -> dict[str, Any] | None:
            await plane.create_pod(f"new-{time.monotonic_ns()}", scheduler_name=NOBODY)
            async with plane.watch(f"/api/v1/pods?watch=1&resourceVersion={old}", timeout=10) as events:
                async for event in events:
                    return event if event["type"] == "ERROR" else None
            return None

        event = await eventually(expired, timeout=20)
    finally:
        plane.stop()
    assert event["object"] == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "The resourceVersion for the provided watch is too old.",
        "reason": "Expired",
        "code": 410,
    }
