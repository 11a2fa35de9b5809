"""The API double (tests/apidouble.py) against the real kube-apiserver: every scenario both can play runs on both,
through our own KubeClient, and must come out the same, so the double stays true to the server it stands for.

What is compared is what the extender's code sees: the error class, status, reason, message (exact, with the
names, UIDs and resourceVersions of the run put in) and details of a refusal; the shapes of the answers the
informer, binder and leader read (list metadata and items, watch event types and objects, the Binding's Status,
Lease spec). resourceVersions differ between the two by nature; they are checked by how they relate (the same
across the pages of one list, a watch event at the revision its write answered with).

On the real server `admin` makes the calls the extender makes (list, watch, patch, bind, Events, Leases) and
plays the users, kubelets and controllers around it: these tests compare behaviour, not rights (the smoke tests
check the manifests' RBAC). On the double the helpers play those.

Measured on the real v1.34.1 and left out of the comparison:
- Continue tokens are opaque: the first page's (served from etcd) encodes its start key relative to
  `/registry/pods/<ns>/`, the next ones (served from the watch cache's snapshot) relative to
  `/registry/pods/<ns>`. Our client never reads them.
- The watch cache sends its pre-timeout bookmark on a one-second tick, at 1 to 3 s before timeoutSeconds
  (and sometimes twice), and only when the resource changed after the watch caught up. The double sends one,
  2 s before; the watch test waits for it, not for a time.
- A watch from a too-old resourceVersion cannot be had from the shared control plane: its watch cache keeps
  every event younger than 75 s, so nothing is evicted during a test, and a watch from resourceVersion 1 is
  served as a replay. With the cache off the 410 comes from etcd, with another message ("The resourceVersion
  for the provided watch is too old."), which tests/e2e/test_control_plane.py checks on its own control plane;
  the double models the watch cache's. So that scenario runs on the double only.
- The real server drops fields its schema does not know and fills in defaults (a pod's volumes, tolerations,
  qosClass, managedFields); the double keeps what it was given. Only fields the extender reads are compared.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
import pytest

from extender.sources.kube.client import ApiError, KubeClient, KubeError, NotFound
from extender.sources.kube.config import KubeConfig
from tests.apidouble import GENERATED_NAME_LETTERS, ApiDouble
from tests.e2e.controlplane import EXTENDER_NAMESPACE, ControlPlane

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

NAMESPACE = "double-fidelity"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{EXTENDER_NAMESPACE}/leases"
EVENTS = f"/api/v1/namespaces/{NAMESPACE}/events"
NOBODY = "fidelity-nobody"
"""A schedulerName no scheduler owns: the pods here are bound by hand."""
LIVE = "status.phase!=Succeeded,status.phase!=Failed"
"""The informer's field selector for pods."""
ZERO_POD = {"spec": {"containers": None}, "status": {}}


class Backend:
    """One API server and two clients of ours: `client` as the extender, `admin` as everyone else. Mutable: it
    remembers what it made, to remove it afterwards."""

    def __init__(self, client: KubeClient, admin: KubeClient) -> None:
        self.client = client
        self.admin = admin
        self.made: list[str] = []

    async def create_pod(self, name: str, annotations: dict[str, str] | None = None, grace: int = 0) -> Obj:
        raise NotImplementedError

    async def create_node(self, name: str) -> Obj:
        raise NotImplementedError

    def remove_afterwards(self, path: str) -> None:
        self.made.append(path)

    async def close(self) -> None:
        await self.client.close()
        await self.admin.close()


def pod_body(name: str, annotations: dict[str, str] | None, grace: int) -> Obj:
    meta: Obj = {"name": name, "namespace": NAMESPACE} | ({"annotations": annotations} if annotations else {})
    container = {"name": "main", "image": "registry.example/none:latest"}
    spec = {"schedulerName": NOBODY, "terminationGracePeriodSeconds": grace, "containers": [container]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class RealBackend(Backend):
    async def create_pod(self, name: str, annotations: dict[str, str] | None = None, grace: int = 0) -> Obj:
        self.remove_afterwards(f"{PODS}/{name}")
        created: Obj = await self.admin.create(PODS, pod_body(name, annotations, grace))
        return created

    async def create_node(self, name: str) -> Obj:
        self.remove_afterwards(f"/api/v1/nodes/{name}")
        created: Obj = await self.admin.create("/api/v1/nodes", {"metadata": {"name": name}})
        return created

    async def close(self) -> None:
        for path in reversed(self.made):
            with contextlib.suppress(NotFound):
                await self.admin.request("DELETE", path, body={"gracePeriodSeconds": 0})
        await super().close()


class DoubleBackend(Backend):
    def __init__(self, api: ApiDouble, client: KubeClient, admin: KubeClient) -> None:
        super().__init__(client, admin)
        self.api = api

    async def create_pod(self, name: str, annotations: dict[str, str] | None = None, grace: int = 0) -> Obj:
        return self.api.add_pod(pod_body(name, annotations, grace))

    async def create_node(self, name: str) -> Obj:
        return self.api.add_node({"metadata": {"name": name}})

    async def close(self) -> None:
        await super().close()
        await self.api.stop()


@pytest.fixture(scope="module")
def fidelity_plane(control_plane: ControlPlane) -> ControlPlane:
    """The session's control plane with this module's namespace (and its `default` ServiceAccount, which pods
    need and no controller-manager makes here)."""
    control_plane.namespace_now(NAMESPACE)
    return control_plane


def real_client(plane: ControlPlane, user: str) -> KubeClient:
    config = KubeConfig(
        server=plane.url,
        source=f"the e2e control plane as {user}",
        ca_file=str(plane.ca_file),
        token=plane.users[user].token,
    )
    return KubeClient(config, timeout=10.0)


def double_client(api: ApiDouble) -> KubeClient:
    return KubeClient(KubeConfig(server=api.url, source="the API double", token=api.token), timeout=10.0)


@pytest.fixture(params=["real", "double"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    made: Backend
    if request.param == "real":
        plane = request.getfixturevalue("fidelity_plane")
        # As admin: these compare the API's behaviour, not RBAC (the manifests' rights are the smoke tests').
        made = RealBackend(real_client(plane, "admin"), real_client(plane, "admin"))
    else:
        api = ApiDouble()
        await api.start()
        made = DoubleBackend(api, double_client(api), double_client(api))
    try:
        yield made
    finally:
        await made.close()


Refusal = tuple[str, int, str, str, Obj]


async def refusal(call: Awaitable[Any]) -> Refusal:
    """How our client reports the API refusing `call`: class, status, reason, message, details."""
    with pytest.raises(ApiError) as caught:
        await call
    error = caught.value
    return type(error).__name__, error.status, error.reason, error.message, error.details


def rv(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


def annotations_of(obj: Obj) -> dict[str, str] | None:
    found: dict[str, str] | None = obj["metadata"].get("annotations")
    return found


# -- 1. lists --


def names(page: Obj) -> list[str]:
    return [item["metadata"]["name"] for item in page["items"]]


async def test_list_pages_are_one_snapshot_even_after_the_objects_changed(backend: Backend) -> None:
    for name in ("p-0", "p-1", "p-2"):
        await backend.create_pod(name)
    first = await backend.client.get(PODS, {"limit": "1"})
    await backend.create_pod("p-05")  # sorts between p-0 and p-1
    await backend.admin.delete(f"{PODS}/p-2")
    patched = await backend.admin.merge_patch(f"{PODS}/p-1", {"metadata": {"annotations": {"changed": "yes"}}})
    second = await backend.client.get(PODS, {"limit": "1", "continue": first["metadata"]["continue"]})
    third = await backend.client.get(PODS, {"limit": "1", "continue": second["metadata"]["continue"]})

    assert [names(page) for page in (first, second, third)] == [["p-0"], ["p-1"], ["p-2"]]
    assert annotations_of(second["items"][0]) is None  # as it was when the first page was served
    assert rv(first) == rv(second) == rv(third) < rv(patched)
    assert [page["metadata"].get("remainingItemCount") for page in (first, second, third)] == [2, 1, None]
    assert ["continue" in page["metadata"] for page in (first, second, third)] == [True, True, False]
    assert [(page["kind"], page["apiVersion"]) for page in (first, second, third)] == [("PodList", "v1")] * 3
    assert all("kind" not in item and "apiVersion" not in item for item in first["items"])
    token = orjson.loads(base64.urlsafe_b64decode(first["metadata"]["continue"] + "=="))
    assert (token["v"], token["rv"]) == ("meta.k8s.io/v1", rv(first))

    fresh = await backend.client.get(PODS, {"limit": "10"})
    assert names(fresh) == ["p-0", "p-05", "p-1"]
    assert annotations_of(fresh["items"][2]) == {"changed": "yes"}
    assert rv(fresh) >= rv(patched)
    assert "continue" not in fresh["metadata"] and "remainingItemCount" not in fresh["metadata"]


async def test_node_pages_cover_every_node_at_one_revision(backend: Backend) -> None:
    ours = ["fidelity-node-a", "fidelity-node-b", "fidelity-node-c"]
    for name in reversed(ours):
        await backend.create_node(name)
    pages = [await backend.client.get("/api/v1/nodes", {"limit": "1"})]
    while token := pages[-1]["metadata"].get("continue"):
        pages.append(await backend.client.get("/api/v1/nodes", {"limit": "1", "continue": token}))
    assert {rv(page) for page in pages} == {rv(pages[0])}
    assert all(len(page["items"]) == 1 and page["kind"] == "NodeList" for page in pages)
    listed = [name for page in pages for name in names(page)]
    assert [name for name in listed if name.startswith("fidelity-node-")] == ours  # key order; others may exist


# -- 2. watches --


class Collected:
    """The events of one watch, read in the background. Mutable: events arrive."""

    def __init__(self) -> None:
        self.events: list[Obj] = []
        self.arrived = asyncio.Event()
        self.ended = ""

    async def read(self, client: KubeClient, path: str, params: dict[str, str]) -> None:
        try:
            async for event in client.watch(path, params, inactivity=10.0):
                self.events.append(event)
                self.arrived.set()
            self.ended = "the watch ended"
        except KubeError as error:
            self.ended = f"the watch failed: {error}"
        finally:
            self.arrived.set()

    async def until(self, check: Callable[[list[Obj]], Any], timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not check(self.events):
                assert not self.ended, f"{self.ended} before what was awaited; events: {self.events}"
                self.arrived.clear()
                await self.arrived.wait()


@contextlib.asynccontextmanager
async def watching(client: KubeClient, path: str, params: dict[str, str]) -> AsyncIterator[Collected]:
    collected = Collected()
    task = asyncio.create_task(collected.read(client, path, params))
    try:
        yield collected
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def seen(event: Obj) -> tuple[str, str, str, dict[str, str] | None, bool]:
    obj = event["object"]
    meta = obj["metadata"]
    phase = obj["status"]["phase"]
    return event["type"], meta["name"], phase, meta.get("annotations"), "deletionTimestamp" in meta


async def test_a_selected_watch_sees_writes_and_a_finished_pod_leave_as_deleted(backend: Backend) -> None:
    listed = await backend.client.get(PODS, {"fieldSelector": LIVE})
    params = {"resourceVersion": listed["metadata"]["resourceVersion"], "allowWatchBookmarks": "true"}
    params |= {"fieldSelector": LIVE, "timeoutSeconds": "4"}
    async with watching(backend.client, PODS, params) as watch:
        created = await backend.create_pod("w-1")
        await watch.until(lambda events: events)  # live from here on
        annotated = await backend.client.merge_patch(f"{PODS}/w-1", {"metadata": {"annotations": {"seen": "1"}}})
        running = await backend.admin.merge_patch(f"{PODS}/w-1/status", {"status": {"phase": "Running"}})
        finished_body = await backend.admin.get(f"{PODS}/w-1")
        finished_body["status"]["phase"] = "Succeeded"  # a PUT of status, as UpdateStatus writes it
        finished = await backend.admin.replace(f"{PODS}/w-1/status", finished_body)
        second = await backend.create_pod("w-2")
        removed = await backend.admin.delete(f"{PODS}/w-2")
        await watch.until(lambda events: events[-1]["type"] == "BOOKMARK" and rv(events[-1]["object"]) >= rv(removed))

    changes = [event for event in watch.events if event["type"] != "BOOKMARK"]
    assert [seen(event) for event in changes] == [
        ("ADDED", "w-1", "Pending", None, False),
        ("MODIFIED", "w-1", "Pending", {"seen": "1"}, False),
        ("MODIFIED", "w-1", "Running", {"seen": "1"}, False),
        ("DELETED", "w-1", "Running", {"seen": "1"}, False),  # its last content that matched
        ("ADDED", "w-2", "Pending", None, False),
        ("MODIFIED", "w-2", "Pending", None, True),  # deletionTimestamp first, even at grace 0
        ("DELETED", "w-2", "Pending", None, True),
    ]
    versions = [rv(event["object"]) for event in changes]
    answered = [rv(created), rv(annotated), rv(running), rv(finished), rv(second)]
    assert versions[:5] == answered  # each event at the revision its write answered with
    assert rv(second) < versions[5] < versions[6] == rv(removed)  # other writers may come in between
    assert all((e["object"]["kind"], e["object"]["apiVersion"]) == ("Pod", "v1") for e in changes)
    mark = watch.events[-1]["object"]
    assert mark == {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": str(rv(removed))}, **ZERO_POD}


async def test_deleting_a_bound_pod_marks_it_and_grace_zero_removes_it(backend: Backend) -> None:
    pod = await backend.create_pod("d-1", grace=30)
    await backend.client.create(f"{PODS}/d-1/binding", binding("d-1", "n-1"))
    marked = await backend.admin.delete(f"{PODS}/d-1")
    assert (marked["metadata"]["deletionGracePeriodSeconds"], "deletionTimestamp" in marked["metadata"]) == (30, True)
    assert rv(await backend.client.get(f"{PODS}/d-1")) == rv(marked)  # still there, terminating
    removed = await backend.admin.request("DELETE", f"{PODS}/d-1", body={"gracePeriodSeconds": 0})
    assert removed["metadata"]["deletionGracePeriodSeconds"] == 0
    assert rv(removed) > rv(marked)
    assert await refusal(backend.client.get(f"{PODS}/d-1")) == (
        "NotFound",
        404,
        "NotFound",
        'pods "d-1" not found',
        {"name": "d-1", "kind": "pods"},
    )
    assert removed["metadata"]["uid"] == pod["metadata"]["uid"]


@pytest.mark.parametrize("backend", ["double"], indirect=True)  # the real one's 410: see the module docstring
async def test_a_watch_from_a_too_old_resource_version_ends_with_an_in_stream_410(backend: Backend) -> None:
    """The double's answer only: on a watch-cached control plane the 410 cannot be produced within a test, and
    tests/e2e/test_control_plane.py checks etcd's on its own plane (the module docstring says how they differ)."""
    assert isinstance(backend, DoubleBackend)
    await backend.create_pod("old")
    backend.api.compact()
    events = [event async for event in backend.client.watch(PODS, {"resourceVersion": "1"}, inactivity=5.0)]
    assert events == [
        {
            "type": "ERROR",
            "object": {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f"too old resource version: 1 ({backend.api.resource_version})",
                "reason": "Expired",
                "code": 410,
            },
        }
    ]


# -- 3. binding --


def binding(pod: str, node: str, uid: str = "", annotations: dict[str, str] | None = None) -> Obj:
    """The Binding our binder posts."""
    meta: Obj = {"name": pod, "namespace": NAMESPACE} | ({"uid": uid} if uid else {})
    meta["annotations"] = annotations or {}
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


async def test_a_binding_sets_the_node_and_copies_its_annotations(backend: Backend) -> None:
    pod = await backend.create_pod("b-1", annotations={"mine": "x"})
    allocation = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "4"}
    answer = await backend.client.create(
        f"{PODS}/b-1/binding", binding("b-1", "n-1", pod["metadata"]["uid"], allocation)
    )
    assert answer == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
    bound = await backend.client.get(f"{PODS}/b-1")
    assert bound["spec"]["nodeName"] == "n-1"
    assert annotations_of(bound) == {"mine": "x"} | allocation
    [scheduled] = [c for c in bound["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert {k: scheduled[k] for k in ("status", "lastProbeTime")} == {"status": "True", "lastProbeTime": None}


async def test_a_binding_without_annotations_leaves_the_pod_without(backend: Backend) -> None:
    await backend.create_pod("b-plain")
    await backend.client.create(f"{PODS}/b-plain/binding", binding("b-plain", "n-1"))
    assert annotations_of(await backend.client.get(f"{PODS}/b-plain")) is None


async def test_binding_a_bound_pod_is_409_already_assigned(backend: Backend) -> None:
    await backend.create_pod("b-2")
    await backend.client.create(f"{PODS}/b-2/binding", binding("b-2", "n-1"))
    assert await refusal(backend.client.create(f"{PODS}/b-2/binding", binding("b-2", "n-2"))) == (
        "Conflict",
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods/binding "b-2": pod b-2 is already assigned to node "n-1"',
        {"name": "b-2", "kind": "pods/binding"},
    )


async def test_binding_with_another_uid_fails_the_storage_precondition(backend: Backend) -> None:
    pod = await backend.create_pod("b-3")
    stale = "00000000-0000-0000-0000-000000000000"
    assert await refusal(backend.client.create(f"{PODS}/b-3/binding", binding("b-3", "n-1", stale))) == (
        "Conflict",
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods "b-3": StorageError: invalid object, Code: 4, '
        f"Key: /registry/pods/{NAMESPACE}/b-3, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: "
        f"UID in precondition: {stale}, UID in object meta: {pod['metadata']['uid']}",
        {"name": "b-3", "kind": "pods"},
    )
    assert "nodeName" not in (await backend.client.get(f"{PODS}/b-3"))["spec"]


async def test_binding_a_missing_pod_is_404(backend: Backend) -> None:
    assert await refusal(backend.client.create(f"{PODS}/b-none/binding", binding("b-none", "n-1"))) == (
        "NotFound",
        404,
        "NotFound",
        'pods "b-none" not found',
        {"name": "b-none", "kind": "pods"},
    )


# -- 4. pod merge patches --


async def test_a_merge_patch_sets_and_deletes_annotations(backend: Backend) -> None:
    pod = await backend.create_pod("m-1", annotations={"keep": "1", "drop": "2"})
    patch = {"metadata": {"annotations": {"drop": None, "new": "3"}}}
    patched = await backend.client.merge_patch(f"{PODS}/m-1", patch)
    assert annotations_of(patched) == {"keep": "1", "new": "3"}
    assert rv(patched) > rv(pod) and patched["kind"] == "Pod"
    again = await backend.client.merge_patch(f"{PODS}/m-1", patch)
    assert rv(again) == rv(patched)  # nothing changed: no write
    emptied = await backend.client.merge_patch(f"{PODS}/m-1", {"metadata": {"annotations": None}})
    assert annotations_of(emptied) is None
    still = await backend.client.merge_patch(f"{PODS}/m-1", {"metadata": {"annotations": {}}})
    assert (annotations_of(still), rv(still)) == (None, rv(emptied))


async def test_a_merge_patch_with_another_uid_is_422_immutable(backend: Backend) -> None:
    pod = await backend.create_pod("m-2")
    other = "00000000-0000-0000-0000-000000000000"
    patch = {"metadata": {"uid": other, "annotations": {"a": "b"}}}
    cause = {"reason": "FieldValueInvalid", "message": f'Invalid value: "{other}": field is immutable'}
    cause["field"] = "metadata.uid"
    assert await refusal(backend.client.merge_patch(f"{PODS}/m-2", patch)) == (
        "Invalid",
        422,
        "Invalid",
        f'Pod "m-2" is invalid: metadata.uid: Invalid value: "{other}": field is immutable',
        {"name": "m-2", "kind": "Pod", "causes": [cause, cause]},  # found by two validations, said once
    )
    same = await backend.client.merge_patch(f"{PODS}/m-2", {"metadata": {"uid": pod["metadata"]["uid"]}})
    assert rv(same) == rv(pod)


async def test_a_merge_patch_with_a_stale_resource_version_is_409_before_validation(backend: Backend) -> None:
    pod = await backend.create_pod("m-3")
    await backend.client.merge_patch(f"{PODS}/m-3", {"metadata": {"annotations": {"a": "1"}}})
    stale = pod["metadata"]["resourceVersion"]
    modified = (
        "Conflict",
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods "m-3": the object has been modified; please apply your changes to '
        "the latest version and try again",
        {"name": "m-3", "kind": "pods"},
    )
    patch = {"metadata": {"resourceVersion": stale, "annotations": {"b": "2"}}}
    assert await refusal(backend.client.merge_patch(f"{PODS}/m-3", patch)) == modified
    patch["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    assert await refusal(backend.client.merge_patch(f"{PODS}/m-3", patch)) == modified


async def test_a_merge_patch_of_a_missing_pod_is_404(backend: Backend) -> None:
    patch = {"metadata": {"annotations": {"a": "1"}}}
    assert await refusal(backend.client.merge_patch(f"{PODS}/m-none", patch)) == (
        "NotFound",
        404,
        "NotFound",
        'pods "m-none" not found',
        {"name": "m-none", "kind": "pods"},
    )


async def test_the_status_subresource_writes_status_and_metadata_never_spec(backend: Backend) -> None:
    pod = await backend.create_pod("s-1")
    patch = {"status": {"phase": "Running"}, "metadata": {"annotations": {"by": "kubelet"}}, "spec": {"nodeName": "x"}}
    written = await backend.admin.merge_patch(f"{PODS}/s-1/status", patch)
    assert (written["status"]["phase"], annotations_of(written)) == ("Running", {"by": "kubelet"})
    assert "nodeName" not in written["spec"] and rv(written) > rv(pod)
    unchanged = await backend.admin.merge_patch(f"{PODS}/s-1/status", {"spec": {"nodeName": "x"}})
    assert rv(unchanged) == rv(written)
    body = {**written, "status": {**written["status"], "phase": "Failed"}}
    body["metadata"] = {k: v for k, v in written["metadata"].items() if k != "resourceVersion"}
    unconditional = await backend.admin.replace(f"{PODS}/s-1/status", body)  # pods allow it without a version
    assert unconditional["status"]["phase"] == "Failed"
    assert await refusal(backend.admin.replace(f"{PODS}/s-1/status", written)) == (
        "Conflict",
        409,
        "Conflict",
        'Operation cannot be fulfilled on pods "s-1": the object has been modified; please apply your changes to '
        "the latest version and try again",
        {"name": "s-1", "kind": "pods"},
    )


# -- 5. leases --


def lease(name: str, holder: str, **meta: str) -> Obj:
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": 15,
        "acquireTime": "2025-01-01T00:00:00.000000Z",
        "renewTime": "2025-01-01T00:00:01.250000Z",
        "leaseTransitions": 0,
    }
    metadata = {"name": name, "namespace": EXTENDER_NAMESPACE, **meta}
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


def lease_details(name: str) -> Obj:
    return {"name": name, "group": "coordination.k8s.io", "kind": "leases"}


async def create_lease(backend: Backend, name: str, holder: str = "a") -> Obj:
    backend.remove_afterwards(f"{LEASES}/{name}")
    created: Obj = await backend.client.create(LEASES, lease(name, holder))
    return created


async def test_a_lease_is_created_read_and_renewed_with_its_version(backend: Backend) -> None:
    name = "fidelity-lease-1"
    created = await create_lease(backend, name)
    assert (created["kind"], created["apiVersion"]) == ("Lease", "coordination.k8s.io/v1")
    assert created["spec"] == lease(name, "a")["spec"]
    assert {"uid", "resourceVersion", "creationTimestamp"} <= set(created["metadata"])
    assert await refusal(backend.client.create(LEASES, lease(name, "b"))) == (
        "Conflict",
        409,
        "AlreadyExists",
        f'leases.coordination.k8s.io "{name}" already exists',
        lease_details(name),
    )
    read = await backend.client.get(f"{LEASES}/{name}")
    assert (read["spec"], rv(read)) == (created["spec"], rv(created))
    renewed = await backend.client.replace(
        f"{LEASES}/{name}", {**read, "spec": {**read["spec"], "holderIdentity": "b"}}
    )
    assert (renewed["spec"]["holderIdentity"], renewed["metadata"]["uid"]) == ("b", created["metadata"]["uid"])
    assert rv(renewed) > rv(read)
    assert rv(await backend.client.replace(f"{LEASES}/{name}", renewed)) == rv(renewed)  # no change, no write


async def test_a_lease_update_with_a_stale_version_is_409_conflict(backend: Backend) -> None:
    name = "fidelity-lease-2"
    created = await create_lease(backend, name)
    await backend.client.replace(f"{LEASES}/{name}", {**created, "spec": {**created["spec"], "holderIdentity": "b"}})
    assert await refusal(backend.client.replace(f"{LEASES}/{name}", created)) == (
        "Conflict",
        409,
        "Conflict",
        f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        lease_details(name),
    )


async def test_a_lease_update_without_a_version_is_422(backend: Backend) -> None:
    name = "fidelity-lease-3"
    created = await create_lease(backend, name)
    versionless = lease(name, "b", uid=created["metadata"]["uid"])
    message = "Invalid value: 0: must be specified for an update"
    assert await refusal(backend.client.replace(f"{LEASES}/{name}", versionless)) == (
        "Invalid",
        422,
        "Invalid",
        f'leases.coordination.k8s.io "{name}" is invalid: metadata.resourceVersion: {message}',
        lease_details(name)
        | {"causes": [{"reason": "FieldValueInvalid", "message": message, "field": "metadata.resourceVersion"}]},
    )


async def test_a_lease_update_with_another_uid_fails_the_storage_precondition(backend: Backend) -> None:
    name = "fidelity-lease-4"
    created = await create_lease(backend, name)
    other = "00000000-0000-0000-0000-000000000000"
    assert await refusal(backend.client.replace(f"{LEASES}/{name}", lease(name, "b", uid=other))) == (
        "Conflict",
        409,
        "Conflict",
        f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": StorageError: invalid object, '
        f"Code: 4, Key: /registry/leases/{EXTENDER_NAMESPACE}/{name}, ResourceVersion: 0, AdditionalErrorMsg: "
        f"Precondition failed: UID in precondition: {other}, UID in object meta: {created['metadata']['uid']}",
        lease_details(name),
    )


async def test_a_missing_lease_is_404_to_get_and_created_by_a_put(backend: Backend) -> None:
    name = "fidelity-lease-5"
    assert await refusal(backend.client.get(f"{LEASES}/{name}")) == (
        "NotFound",
        404,
        "NotFound",
        f'leases.coordination.k8s.io "{name}" not found',
        lease_details(name),
    )
    backend.remove_afterwards(f"{LEASES}/{name}")
    put = await backend.client.replace(f"{LEASES}/{name}", lease(name, "a", resourceVersion="12345"))
    assert put["spec"]["holderIdentity"] == "a" and put["metadata"]["resourceVersion"] != "12345"
    assert (await backend.client.get(f"{LEASES}/{name}"))["metadata"]["uid"] == put["metadata"]["uid"]


# -- 6. events --


async def test_an_event_with_generate_name_is_created_and_echoed(backend: Backend) -> None:
    """The Event our binder records for a failed bind."""
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": "e-1.", "namespace": NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "e-1", "namespace": NAMESPACE, "uid": "u-1"},
        "reason": "FailedBinding",
        "message": "binding to n-1 failed: no longer fits",
        "type": "Warning",
        "source": {"component": "gpu-extender"},
        "reportingComponent": "gpu-extender",
        "reportingInstance": "replica-1",
        "firstTimestamp": "2025-01-01T00:00:00Z",
        "lastTimestamp": "2025-01-01T00:00:00Z",
        "count": 1,
    }
    created = await backend.client.create(EVENTS, event)
    meta = created["metadata"]
    assert meta["name"].startswith("e-1.") and len(meta["name"]) == len("e-1.") + 5
    assert set(meta["name"][len("e-1.") :]) <= set(GENERATED_NAME_LETTERS)
    assert (meta["generateName"], meta["namespace"]) == ("e-1.", NAMESPACE)
    assert {"uid", "resourceVersion", "creationTimestamp"} <= set(meta)
    assert {k: created[k] for k in event if k != "metadata"} == {k: v for k, v in event.items() if k != "metadata"}
    assert created["eventTime"] is None


# -- 7. authentication --


async def test_a_wrong_token_is_401_unauthorized(backend: Backend) -> None:
    config = backend.client.config
    async with KubeClient(
        KubeConfig(server=config.server, source="a stranger", ca_file=config.ca_file, token="nope")
    ) as stranger:
        expected: Refusal = ("Unauthorized", 401, "Unauthorized", "Unauthorized", {})
        assert await refusal(stranger.get("/api/v1/nodes")) == expected
        assert await refusal(stranger.create(f"{PODS}/x/binding", binding("x", "n-1"))) == expected

        async def watch() -> None:
            async for _ in stranger.watch(PODS, {}, inactivity=5.0):
                pass

        assert await refusal(watch()) == expected
