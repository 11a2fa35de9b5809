"""The API double behaves as kube-apiserver does on the wire: lists, paging, watches and their failures, writes
and their conflicts, and the faults it injects. Driven with plain aiohttp calls, as any client would."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest
import trustme

from tests import apidouble
from tests.apidouble import CONTINUE_TOO_OLD, GENERATED_NAME_LETTERS, ApiDouble
from tests.builders import make_node, make_pod

AUTH = {"Authorization": "Bearer test-token"}
MERGE = {"Content-Type": "application/merge-patch+json"}
HISTORY = 20
"""Watch events kept per resource in these tests: a few dozen writes push a revision out of history."""


@pytest.fixture
async def api() -> AsyncIterator[ApiDouble]:
    double = ApiDouble(history=HISTORY)
    await double.start()
    yield double
    await double.stop()


@pytest.fixture
async def kube(api: ApiDouble) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(api.url, headers=AUTH) as session:
        yield session


async def get_json(kube: aiohttp.ClientSession, path: str, **params: str) -> tuple[int, Any]:
    async with kube.get(path, params=params) as response:
        return response.status, await response.json()


async def listed(kube: aiohttp.ClientSession, path: str, **params: str) -> Any:
    status, body = await get_json(kube, path, **params)
    assert status == 200, body
    return body


Watch = Callable[..., Awaitable[aiohttp.ClientResponse]]


@pytest.fixture
async def watch(kube: aiohttp.ClientSession) -> AsyncIterator[Watch]:
    """Open a watch (`await watch(path, resourceVersion="0")`); every stream is closed after the test."""
    opened: list[aiohttp.ClientResponse] = []

    async def open_watch(path: str, **params: str) -> aiohttp.ClientResponse:
        response = await kube.get(path, params={"watch": "1", **params})
        opened.append(response)
        assert response.status == 200
        return response

    yield open_watch
    for response in opened:
        response.close()


async def next_events(response: aiohttp.ClientResponse, count: int) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for _ in range(count):
        event = orjson.loads(await asyncio.wait_for(response.content.readline(), 2))
        events.append((event["type"], event["object"]))
    return events


def named(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    return [(kind, obj["metadata"].get("name", "")) for kind, obj in events]


def pod_names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


# -- lists --


async def test_lists_are_in_etcd_key_order_and_their_items_carry_no_kind(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("z", namespace="a"))
    api.add_pod(make_pod("y", namespace="a-b"))
    api.add_pod(make_pod("b", namespace="a"))
    status, body = await get_json(kube, "/api/v1/pods")
    assert status == 200
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in body["items"]] == [
        ("a-b", "y"),  # "a-b/y" < "a/b": etcd compares the key as a string ('-' sorts before '/')
        ("a", "b"),
        ("a", "z"),
    ]
    assert (body["kind"], body["apiVersion"]) == ("PodList", "v1")
    assert body["metadata"] == {"resourceVersion": str(api.resource_version)}
    assert all("kind" not in item and "apiVersion" not in item for item in body["items"])


async def test_pages_of_one_list_are_the_snapshot_of_its_first_page(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    for i in range(5):
        api.add_pod(make_pod(f"p{i}"))
    first = await listed(kube, "/api/v1/pods", limit="2")
    assert pod_names(first) == ["p0", "p1"]
    assert first["metadata"]["remainingItemCount"] == 3
    api.delete_pod("default", "p3")
    api.add_pod(make_pod("p5"))
    changed = api.pod("default", "p2") or {}
    changed["metadata"]["annotations"] = {"changed": "yes"}
    api.update_pod(changed)
    second = await listed(kube, "/api/v1/pods", limit="2", **{"continue": first["metadata"]["continue"]})
    third = await listed(kube, "/api/v1/pods", limit="2", **{"continue": second["metadata"]["continue"]})
    assert pod_names(second) + pod_names(third) == ["p2", "p3", "p4"]
    assert "annotations" not in second["items"][0]["metadata"]
    assert "continue" not in third["metadata"]
    assert first["metadata"]["resourceVersion"] == second["metadata"]["resourceVersion"]
    assert third["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


async def test_a_namespaced_list_pages_within_its_namespace(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    for namespace in ("a", "b", "c"):
        for name in ("x", "y"):
            api.add_pod(make_pod(name, namespace=namespace))
    first = await listed(kube, "/api/v1/namespaces/b/pods", limit="1")
    second = await listed(kube, "/api/v1/namespaces/b/pods", limit="1", **{"continue": first["metadata"]["continue"]})
    assert [i["metadata"]["namespace"] + "/" + i["metadata"]["name"] for i in first["items"] + second["items"]] == [
        "b/x",
        "b/y",
    ]
    assert "continue" not in second["metadata"]


async def test_a_continue_token_older_than_history_is_410_with_a_token_to_go_on(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    for name in ("a", "b", "c"):
        api.add_pod(make_pod(name))
    first = await listed(kube, "/api/v1/pods", limit="1")
    for i in range(HISTORY + 1):
        api.add_pod(make_pod(f"new-{i:02}"))
    status, gone = await get_json(kube, "/api/v1/pods", limit="2", **{"continue": first["metadata"]["continue"]})
    assert status == 410
    assert (gone["kind"], gone["reason"], gone["code"], gone["message"]) == ("Status", "Expired", 410, CONTINUE_TOO_OLD)
    status, rest = await get_json(kube, "/api/v1/pods", limit="2", **{"continue": gone["metadata"]["continue"]})
    assert status == 200
    assert pod_names(rest) == ["b", "c"]  # from where the first page stopped, at the newest revision
    assert rest["metadata"]["resourceVersion"] == str(api.resource_version)


async def test_compact_expires_every_continue_token(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("a"))
    api.add_pod(make_pod("b"))
    first = await listed(kube, "/api/v1/pods", limit="1")
    api.compact()
    status, gone = await get_json(kube, "/api/v1/pods", limit="1", **{"continue": first["metadata"]["continue"]})
    assert (status, gone["reason"]) == (410, "Expired")


async def test_an_exact_list_at_an_expired_revision_is_410(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("a"))
    api.compact()
    status, body = await get_json(kube, "/api/v1/pods", resourceVersion="1", resourceVersionMatch="Exact")
    assert (status, body["message"]) == (410, "The resourceVersion for the provided list is too old.")


async def test_field_selectors_and_their_terms(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("running", node="n1", phase="Running"))
    api.add_pod(make_pod("done", node="n1", phase="Succeeded"))
    api.add_pod(make_pod("elsewhere", node="n2", phase="Running"))
    body = await listed(kube, "/api/v1/pods", fieldSelector="spec.nodeName=n1,status.phase!=Succeeded")
    assert pod_names(body) == ["running"]
    body = await listed(kube, "/api/v1/pods", fieldSelector="status.phase=Running")
    assert pod_names(body) == ["elsewhere", "running"]


async def test_a_list_newer_than_the_server_is_504_too_large(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    status, body = await get_json(kube, "/api/v1/nodes", resourceVersion=str(api.resource_version + 5))
    assert (status, body["reason"]) == (504, "Timeout")
    assert body["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        ("spec.foo=x", "field label not supported: spec.foo"),
        ("spec.nodeName", "invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'"),
    ],
)
async def test_a_field_selector_it_cannot_serve_is_400(
    kube: aiohttp.ClientSession, selector: str, message: str
) -> None:
    status, body = await get_json(kube, "/api/v1/pods", fieldSelector=selector)
    assert (status, body["reason"], body["message"]) == (400, "BadRequest", message)


# -- watches --


async def test_a_watch_from_a_revision_replays_only_what_came_after(api: ApiDouble, watch: Watch) -> None:
    api.add_pod(make_pod("before"))
    since = api.resource_version
    api.add_pod(make_pod("added"))
    pod = api.pod("default", "before") or {}
    pod["metadata"]["labels"] = {"x": "y"}
    api.update_pod(pod)
    api.delete_pod("default", "added")
    deleted_at = api.resource_version
    response = await watch("/api/v1/pods", resourceVersion=str(since))
    api.add_pod(make_pod("live"))
    events = await next_events(response, 5)
    assert named(events) == [
        ("ADDED", "added"),
        ("MODIFIED", "before"),
        ("MODIFIED", "added"),  # its deletionTimestamp, written before the removal
        ("DELETED", "added"),
        ("ADDED", "live"),
    ]
    assert events[3][1]["metadata"]["resourceVersion"] == str(deleted_at)
    assert (events[0][1]["kind"], events[0][1]["apiVersion"]) == ("Pod", "v1")


async def test_a_watch_from_zero_starts_with_an_added_per_object(api: ApiDouble, watch: Watch) -> None:
    api.add_node(make_node("n1"))
    api.add_node(make_node("n2"))
    response = await watch("/api/v1/nodes", resourceVersion="0")
    api.delete_node("n1")
    assert named(await next_events(response, 3)) == [("ADDED", "n1"), ("ADDED", "n2"), ("DELETED", "n1")]


async def test_send_initial_events_ends_its_added_with_a_marked_bookmark(api: ApiDouble, watch: Watch) -> None:
    api.add_pod(make_pod("p"))
    params = {"sendInitialEvents": "true", "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan"}
    response = await watch("/api/v1/pods", **params)
    [added, (kind, mark)] = await next_events(response, 2)
    assert named([added]) == [("ADDED", "p")]
    assert kind == "BOOKMARK"
    assert mark["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_a_selected_watch_sees_objects_enter_as_added_and_leave_as_deleted(api: ApiDouble, watch: Watch) -> None:
    api.add_pod(make_pod("p", phase="Running"))
    response = await watch("/api/v1/pods", resourceVersion="0", fieldSelector="spec.nodeName=n1")
    pod = api.pod("default", "p") or {}
    pod["spec"]["nodeName"] = "n1"
    api.update_pod(pod)
    moved = api.resource_version
    pod["spec"]["nodeName"] = "n2"
    api.update_pod(pod)
    left = api.resource_version
    events = await next_events(response, 2)
    assert named(events) == [("ADDED", "p"), ("DELETED", "p")]
    assert events[0][1]["metadata"]["resourceVersion"] == str(moved)
    assert events[1][1]["spec"]["nodeName"] == "n1"  # the last content it matched, at the revision it left
    assert events[1][1]["metadata"]["resourceVersion"] == str(left)


async def test_bookmarks_go_only_to_watches_that_asked(api: ApiDouble, watch: Watch) -> None:
    asked = await watch("/api/v1/pods", resourceVersion="0", allowWatchBookmarks="true")
    plain = await watch("/api/v1/pods", resourceVersion="0")
    api.bookmark()
    api.add_pod(make_pod("p"))
    [(kind, mark), added] = await next_events(asked, 2)
    assert kind == "BOOKMARK"
    assert mark == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(api.resource_version - 1)},
        "spec": {"containers": None},
        "status": {},
    }
    assert named([added]) == [("ADDED", "p")]
    assert named(await next_events(plain, 1)) == [("ADDED", "p")]


@pytest.fixture
def quick_bookmarks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-timeout bookmark 0.3 s into a 1 s watch, not 2 s before its end."""
    monkeypatch.setattr(apidouble, "PRE_TIMEOUT_BOOKMARK", 0.7)


@pytest.mark.usefixtures("quick_bookmarks")
async def test_a_watch_gets_a_bookmark_before_its_timeout_after_a_live_change(api: ApiDouble, watch: Watch) -> None:
    api.add_pod(make_pod("p"))
    response = await watch("/api/v1/pods", resourceVersion="0", allowWatchBookmarks="true", timeoutSeconds="1")
    api.add_node(make_node("n1"))  # another resource: a later resourceVersion, but not this watch's
    pod = api.pod("default", "p") or {}
    pod["metadata"]["labels"] = {"a": "b"}
    changed = api.update_pod(pod)["metadata"]["resourceVersion"]
    api.add_node(make_node("n2"))
    events = await next_events(response, 3)
    assert named(events) == [("ADDED", "p"), ("MODIFIED", "p"), ("BOOKMARK", "")]
    assert events[2][1]["metadata"] == {"resourceVersion": changed}
    assert await asyncio.wait_for(response.content.read(), 2) == b""


@pytest.mark.usefixtures("quick_bookmarks")
async def test_no_bookmark_before_the_timeout_when_nothing_changed_after_the_replay(
    api: ApiDouble, watch: Watch
) -> None:
    since = api.resource_version
    api.add_pod(make_pod("p"))
    response = await watch("/api/v1/pods", resourceVersion=str(since), allowWatchBookmarks="true", timeoutSeconds="1")
    assert named(await next_events(response, 1)) == [("ADDED", "p")]
    assert await asyncio.wait_for(response.content.read(), 2) == b""


async def test_expire_watches_sends_an_in_stream_410_then_ends_cleanly(api: ApiDouble, watch: Watch) -> None:
    response = await watch("/api/v1/pods", resourceVersion="0")
    api.expire_watches()
    [(kind, status)] = await next_events(response, 1)
    assert kind == "ERROR"
    assert {k: status[k] for k in ("kind", "status", "reason", "code")} == {
        "kind": "Status",
        "status": "Failure",
        "reason": "Expired",
        "code": 410,
    }
    assert status["message"].startswith("too old resource version: ")
    assert await asyncio.wait_for(response.content.read(), 2) == b""


async def test_a_watch_from_before_the_history_is_200_then_one_error_410(api: ApiDouble, watch: Watch) -> None:
    for i in range(HISTORY + 5):
        api.add_pod(make_pod(f"p{i}"))
    response = await watch("/api/v1/pods", resourceVersion="1")
    [(kind, status)] = await next_events(response, 1)
    assert (kind, status["code"], status["reason"]) == ("ERROR", 410, "Expired")
    assert status["message"] == "too old resource version: 1 (5)"
    assert await asyncio.wait_for(response.content.read(), 2) == b""
    assert api.open_watches == 0


async def test_compact_sends_later_watches_from_old_revisions_a_410(api: ApiDouble, watch: Watch) -> None:
    api.add_pod(make_pod("p"))
    api.compact()
    response = await watch("/api/v1/pods", resourceVersion="1")
    [(kind, status)] = await next_events(response, 1)
    assert (kind, status["code"]) == ("ERROR", 410)


async def test_drop_watches_cuts_the_stream_without_its_last_chunk(api: ApiDouble, watch: Watch) -> None:
    response = await watch("/api/v1/pods", resourceVersion="0")
    assert api.open_watches == 1
    api.drop_watches()
    with pytest.raises(aiohttp.ClientPayloadError):
        await asyncio.wait_for(response.content.read(), 2)
    await asyncio.sleep(0.01)
    assert api.open_watches == 0


async def test_timeout_seconds_ends_the_stream_cleanly(watch: Watch) -> None:
    """The stream ends without an error at its timeout, never before (the double's deadline is taken after the
    request started). How long after, on busy cores, is not asked: the generous wait only keeps a stream that
    never ends from hanging the suite."""
    started = time.monotonic()
    response = await watch("/api/v1/pods", resourceVersion="0", timeoutSeconds="1")
    assert await asyncio.wait_for(response.content.read(), 60) == b""
    assert time.monotonic() - started >= 1


# -- pods: patch, delete, binding --


async def test_merge_patch_sets_and_null_deletes_and_emits_modified(
    api: ApiDouble, kube: aiohttp.ClientSession, watch: Watch
) -> None:
    api.add_pod(make_pod("p"))
    api.update_pod({**(api.pod("default", "p") or {}), "metadata": {"name": "p", "annotations": {"old": "1"}}})
    response = await watch("/api/v1/pods", resourceVersion=str(api.resource_version))
    patch = {"metadata": {"annotations": {"old": None, "new": "2"}}}
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=orjson.dumps(patch), headers=MERGE) as answer:
        assert answer.status == 200
        patched = await answer.json()
    assert patched["metadata"]["annotations"] == {"new": "2"}
    assert patched["metadata"]["resourceVersion"] == str(api.resource_version)
    [(kind, obj)] = await next_events(response, 1)
    assert (kind, obj) == ("MODIFIED", patched)


async def test_a_patch_that_changes_nothing_is_not_a_write(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("p"))
    before = api.resource_version
    patch = orjson.dumps({"metadata": {"annotations": {}}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=patch, headers=MERGE) as answer:
        assert answer.status == 200
    assert api.resource_version == before


async def test_a_patch_with_a_stale_resource_version_is_409(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    stale = api.add_pod(make_pod("p"))["metadata"]["resourceVersion"]
    api.update_pod({**(api.pod("default", "p") or {}), "metadata": {"name": "p", "labels": {"a": "b"}}})
    patch = orjson.dumps({"metadata": {"resourceVersion": stale, "labels": {"c": "d"}}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=patch, headers=MERGE) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on pods "p": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )


async def test_a_patch_with_another_uid_is_422_immutable_not_a_precondition(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("p", uid="uid-1"))
    patch = orjson.dumps({"metadata": {"uid": "uid-2", "annotations": {"a": "b"}}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=patch, headers=MERGE) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (422, "Invalid")
    assert body["message"] == 'Pod "p" is invalid: metadata.uid: Invalid value: "uid-2": field is immutable'
    cause = {"reason": "FieldValueInvalid", "message": 'Invalid value: "uid-2": field is immutable'}
    assert body["details"]["causes"] == [cause | {"field": "metadata.uid"}] * 2  # rest.BeforeUpdate and the strategy
    assert "annotations" not in (api.pod("default", "p") or {})["metadata"]


async def test_a_stale_resource_version_is_409_before_an_immutable_uid_is_422(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    stale = api.add_pod(make_pod("p", uid="uid-1"))["metadata"]["resourceVersion"]
    api.update_pod({**(api.pod("default", "p") or {}), "metadata": {"name": "p", "labels": {"a": "b"}}})
    patch = orjson.dumps({"metadata": {"uid": "uid-2", "resourceVersion": stale}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=patch, headers=MERGE) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (409, "Conflict")


@pytest.mark.parametrize(
    "content_type",
    ["application/json-patch+json", "application/strategic-merge-patch+json", "application/json"],
)
async def test_patch_types_other_than_merge_patch_are_415(
    api: ApiDouble, kube: aiohttp.ClientSession, content_type: str
) -> None:
    api.add_pod(make_pod("p"))
    headers = {"Content-Type": content_type}
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=b"{}", headers=headers) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (415, "UnsupportedMediaType")


async def test_a_pod_patch_drops_status_and_refuses_spec(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("p", phase="Pending"))
    status_patch = orjson.dumps({"status": {"phase": "Running"}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=status_patch, headers=MERGE) as answer:
        assert (answer.status, (await answer.json())["status"]["phase"]) == (200, "Pending")
    spec_patch = orjson.dumps({"spec": {"nodeName": "n1"}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=spec_patch, headers=MERGE) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (422, "Invalid")
    assert body["message"].startswith('Pod "p" is invalid: spec: Forbidden: pod updates may not change fields')


async def test_a_non_string_annotation_is_422(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("p"))
    patch = orjson.dumps({"metadata": {"annotations": {"count": 3}}})
    async with kube.patch("/api/v1/namespaces/default/pods/p", data=patch, headers=MERGE) as answer:
        body = await answer.json()
    assert answer.status == 422
    assert (
        "cannot unmarshal number into Go struct field ObjectMeta.metadata.annotations of type string"
        in (body["message"])
    )


async def test_deleting_a_bound_pod_is_graceful_and_an_unbound_one_immediate(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("bound", node="n1", phase="Running"))
    api.add_pod(make_pod("pending"))
    async with kube.delete("/api/v1/namespaces/default/pods/bound") as answer:
        body = await answer.json()
    assert answer.status == 200
    assert body["metadata"]["deletionGracePeriodSeconds"] == 30
    assert api.pod("default", "bound") is not None
    async with kube.delete("/api/v1/namespaces/default/pods/pending") as answer:
        assert answer.status == 200
        gone = await answer.json()
    assert api.pod("default", "pending") is None
    assert (gone["metadata"]["deletionGracePeriodSeconds"], gone["metadata"]["resourceVersion"]) == (
        0,
        str(api.resource_version),
    )


async def test_a_delete_writes_the_deletion_timestamp_before_removing_the_pod(
    api: ApiDouble, kube: aiohttp.ClientSession, watch: Watch
) -> None:
    api.add_pod(make_pod("p"))
    response = await watch("/api/v1/pods", resourceVersion=str(api.resource_version))
    async with kube.delete("/api/v1/namespaces/default/pods/p") as answer:
        assert answer.status == 200
    [(modified, marked), (deleted, final)] = await next_events(response, 2)
    assert (modified, deleted) == ("MODIFIED", "DELETED")
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 0 and "deletionTimestamp" in marked["metadata"]
    assert int(final["metadata"]["resourceVersion"]) == int(marked["metadata"]["resourceVersion"]) + 1


async def test_a_shorter_grace_period_moves_the_deletion_and_zero_removes(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("p", node="n1", phase="Running"))
    async with kube.delete("/api/v1/namespaces/default/pods/p") as answer:
        first = (await answer.json())["metadata"]
    async with kube.delete("/api/v1/namespaces/default/pods/p", params={"gracePeriodSeconds": "60"}) as answer:
        longer = (await answer.json())["metadata"]
    assert longer == first  # a longer grace period changes nothing
    async with kube.delete("/api/v1/namespaces/default/pods/p", params={"gracePeriodSeconds": "10"}) as answer:
        shorter = (await answer.json())["metadata"]
    assert shorter["deletionGracePeriodSeconds"] == 10
    assert shorter["deletionTimestamp"] < first["deletionTimestamp"]
    api.delete_pod("default", "p")  # the kubelet's grace-0 delete
    assert api.pod("default", "p") is None


async def test_the_status_subresource_writes_status_and_metadata_but_never_spec(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("p"))
    patch = {"status": {"phase": "Running"}, "metadata": {"labels": {"by": "kubelet"}}, "spec": {"nodeName": "n1"}}
    async with kube.patch(
        "/api/v1/namespaces/default/pods/p/status", data=orjson.dumps(patch), headers=MERGE
    ) as answer:
        body = await answer.json()
    assert answer.status == 200
    assert (body["status"]["phase"], body["metadata"]["labels"]) == ("Running", {"by": "kubelet"})
    assert "nodeName" not in body["spec"]
    assert body == api.pod("default", "p")


async def test_a_status_put_without_a_version_is_unconditional(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    pod = api.add_pod(make_pod("p"))
    api.update_pod({**pod, "metadata": {"name": "p", "labels": {"a": "b"}}})
    pod["status"]["phase"] = "Succeeded"
    del pod["metadata"]["resourceVersion"]
    async with kube.put("/api/v1/namespaces/default/pods/p/status", data=orjson.dumps(pod)) as answer:
        assert answer.status == 200
    assert (api.pod("default", "p") or {})["status"]["phase"] == "Succeeded"


@pytest.mark.parametrize(
    ("meta", "status", "message"),
    [
        ({"resourceVersion": "1"}, 409, 'Operation cannot be fulfilled on pods "p": the object has been modified'),
        ({"uid": "uid-other"}, 409, "Precondition failed: UID in precondition: uid-other, UID in object meta: uid-p"),
        ({"name": "q"}, 400, "the name of the object (q) does not match the name on the URL (p)"),
    ],
)
async def test_a_status_put_is_refused_like_any_update(
    api: ApiDouble, kube: aiohttp.ClientSession, meta: dict[str, str], status: int, message: str
) -> None:
    pod = api.add_pod(make_pod("p", uid="uid-p"))
    api.update_pod({**pod, "metadata": {"name": "p", "labels": {"a": "b"}}})
    pod["metadata"] |= meta
    async with kube.put("/api/v1/namespaces/default/pods/p/status", data=orjson.dumps(pod)) as answer:
        body = await answer.json()
    assert answer.status == status
    assert message in body["message"]


async def test_a_pod_that_finishes_leaves_a_watch_for_live_pods_as_deleted(
    api: ApiDouble, kube: aiohttp.ClientSession, watch: Watch
) -> None:
    api.add_pod(make_pod("p", phase="Running"))
    live = "status.phase!=Succeeded,status.phase!=Failed"
    response = await watch("/api/v1/pods", resourceVersion=str(api.resource_version), fieldSelector=live)
    patch = orjson.dumps({"status": {"phase": "Succeeded"}})
    async with kube.patch("/api/v1/namespaces/default/pods/p/status", data=patch, headers=MERGE) as answer:
        finished = await answer.json()
    [(kind, obj)] = await next_events(response, 1)
    assert (kind, obj["status"]["phase"]) == ("DELETED", "Running")
    assert obj["metadata"]["resourceVersion"] == finished["metadata"]["resourceVersion"]


def binding(name: str, node: str | None = "n1", uid: str | None = None) -> bytes:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name}}
    if uid:
        body["metadata"]["uid"] = uid
    body["target"] = {"kind": "Node", "name": node} if node else {}
    return orjson.dumps(body)


async def test_binding_sets_the_node_and_pod_scheduled_and_answers_201(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("p", uid="uid-p"))
    async with kube.post("/api/v1/namespaces/default/pods/p/binding", data=binding("p", uid="uid-p")) as answer:
        body = await answer.json()
    assert (answer.status, body) == (
        201,
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201},
    )
    pod = api.pod("default", "p") or {}
    assert pod["spec"]["nodeName"] == "n1"
    [condition] = pod["status"]["conditions"]
    assert (condition["type"], condition["status"]) == ("PodScheduled", "True")
    assert "annotations" not in pod["metadata"]  # none in the Binding, none on the pod (no empty map)


async def test_binding_an_assigned_pod_is_409_with_the_real_message(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.add_pod(make_pod("p", node="n2"))
    async with kube.post("/api/v1/namespaces/default/pods/p/binding", data=binding("p")) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (409, "Conflict")
    assert (
        body["message"] == 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n2"'
    )


async def test_binding_with_another_uid_fails_its_precondition(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("p", uid="uid-new"))
    async with kube.post("/api/v1/namespaces/default/pods/p/binding", data=binding("p", uid="uid-old")) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (409, "Conflict")
    assert "Precondition failed: UID in precondition: uid-old, UID in object meta: uid-new" in body["message"]
    assert "nodeName" not in (api.pod("default", "p") or {})["spec"]


async def test_binding_a_missing_pod_is_404(kube: aiohttp.ClientSession) -> None:
    async with kube.post("/api/v1/namespaces/default/pods/gone/binding", data=binding("gone")) as answer:
        body = await answer.json()
    assert (answer.status, body["message"], body["details"]) == (
        404,
        'pods "gone" not found',
        {"name": "gone", "kind": "pods"},
    )


async def test_binding_without_a_target_is_422(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.add_pod(make_pod("p"))
    async with kube.post("/api/v1/namespaces/default/pods/p/binding", data=binding("p", node=None)) as answer:
        body = await answer.json()
    assert (answer.status, body["message"]) == (422, 'Binding "p" is invalid: target.name: Required value')


# -- events and leases --


@pytest.mark.parametrize(
    ("path", "api_version"),
    [
        ("/api/v1/namespaces/default/events", "v1"),
        ("/apis/events.k8s.io/v1/namespaces/default/events", "events.k8s.io/v1"),
    ],
)
async def test_events_are_kept_and_echoed_with_201(
    api: ApiDouble, kube: aiohttp.ClientSession, path: str, api_version: str
) -> None:
    event = {"metadata": {"generateName": "p."}, "reason": "Scheduled", "note": "bound"}
    async with kube.post(path, data=orjson.dumps(event)) as answer:
        body = await answer.json()
    assert answer.status == 201
    assert (body["kind"], body["apiVersion"], body["metadata"]["namespace"]) == ("Event", api_version, "default")
    assert body["metadata"]["name"].startswith("p.")
    assert set(body["metadata"]["name"][2:]) <= set(GENERATED_NAME_LETTERS)
    assert api.events == [body]


async def test_a_core_event_answers_with_a_null_event_time(kube: aiohttp.ClientSession) -> None:
    async with kube.post("/api/v1/namespaces/default/events", data=b'{"metadata": {"generateName": "p."}}') as answer:
        assert (await answer.json())["eventTime"] is None


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


def lease_body(holder: str, resource_version: str | None = None) -> bytes:
    meta = {"name": "gpu-extender"} | ({"resourceVersion": resource_version} if resource_version else {})
    return orjson.dumps(
        {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": {"holderIdentity": holder}}
    )


async def test_a_lease_is_created_read_and_renewed_with_its_version(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    async with kube.post(LEASES, data=lease_body("me")) as answer:
        assert answer.status == 201
        created = await answer.json()
    status, read = await get_json(kube, LEASES + "/gpu-extender")
    assert (status, read) == (200, created)
    async with kube.put(
        LEASES + "/gpu-extender", data=lease_body("me2", read["metadata"]["resourceVersion"])
    ) as answer:
        assert answer.status == 200
    assert (api.lease("kube-system", "gpu-extender") or {})["spec"]["holderIdentity"] == "me2"


async def test_a_lease_update_after_another_replica_took_it_is_409(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    async with kube.post(LEASES, data=lease_body("me")) as answer:
        mine = (await answer.json())["metadata"]["resourceVersion"]
    api.steal_lease("kube-system", "gpu-extender", "other")
    async with kube.put(LEASES + "/gpu-extender", data=lease_body("me", mine)) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "gpu-extender": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    assert body["details"] == {"name": "gpu-extender", "group": "coordination.k8s.io", "kind": "leases"}


async def test_a_lease_update_without_a_version_is_422(kube: aiohttp.ClientSession) -> None:
    await kube.post(LEASES, data=lease_body("me"))
    async with kube.put(LEASES + "/gpu-extender", data=lease_body("me")) as answer:
        body = await answer.json()
    assert (answer.status, body["message"]) == (
        422,
        'leases.coordination.k8s.io "gpu-extender" is invalid: '
        "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
    )


async def test_creating_an_existing_lease_is_409_already_exists(kube: aiohttp.ClientSession) -> None:
    await kube.post(LEASES, data=lease_body("me"))
    async with kube.post(LEASES, data=lease_body("other")) as answer:
        body = await answer.json()
    assert (answer.status, body["reason"], body["message"]) == (
        409,
        "AlreadyExists",
        'leases.coordination.k8s.io "gpu-extender" already exists',
    )


async def test_a_put_of_a_missing_lease_creates_it(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    async with kube.put(LEASES + "/gpu-extender", data=lease_body("me", "12345")) as answer:
        assert answer.status == 201
        created = await answer.json()
    assert created == api.lease("kube-system", "gpu-extender")
    assert created["metadata"]["resourceVersion"] == str(api.resource_version)


async def test_a_put_of_a_missing_lease_with_a_uid_fails_its_precondition(kube: aiohttp.ClientSession) -> None:
    body = orjson.dumps({"metadata": {"name": "gpu-extender", "uid": "uid-1"}, "spec": {}})
    async with kube.put(LEASES + "/gpu-extender", data=body) as answer:
        status = await answer.json()
    assert answer.status == 409
    assert status["message"].endswith("Precondition failed: UID in precondition: uid-1, UID in object meta: ")


async def test_a_missing_lease_is_404(kube: aiohttp.ClientSession) -> None:
    status, body = await get_json(kube, LEASES + "/nobody")
    assert (status, body["message"]) == (404, 'leases.coordination.k8s.io "nobody" not found')


# -- faults --


async def test_a_fault_hits_matching_method_and_prefix_the_given_times(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.fail("GET", "/api/v1/nodes", times=2)
    assert (await get_json(kube, "/api/v1/pods"))[0] == 200
    async with kube.post("/api/v1/nodes") as answer:
        assert answer.status == 405  # another method: not the fault's
    status, body = await get_json(kube, "/api/v1/nodes")
    assert (status, body["reason"], body["message"]) == (
        500,
        "InternalError",
        "Internal error occurred: etcdserver: request timed out",
    )
    assert (await get_json(kube, "/api/v1/nodes/n1"))[0] == 500
    assert (await get_json(kube, "/api/v1/nodes"))[0] == 200


async def test_a_429_fault_says_when_to_retry(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("*", "/api/v1/pods", status=429)
    async with kube.get("/api/v1/pods") as answer:
        body = await answer.json()
    assert (answer.status, answer.headers["Retry-After"], body["reason"]) == (429, "1", "TooManyRequests")


async def test_a_fault_answers_with_the_given_body(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("GET", "/version", status=503, body={"kind": "Status", "code": 503})
    assert await get_json(kube, "/version") == (503, {"kind": "Status", "code": 503})


async def test_faults_match_in_the_order_they_were_added(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("*", "/api", status=503)
    api.fail("GET", "/api/v1/pods", status=429)
    assert (await get_json(kube, "/api/v1/pods"))[0] == 503
    assert (await get_json(kube, "/api/v1/pods"))[0] == 429


async def test_a_fault_applies_to_a_watch_before_its_stream(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("GET", "/api/v1/pods", status=500)
    status, body = await get_json(kube, "/api/v1/pods", watch="1")
    assert (status, body["code"]) == (500, 500)


async def test_a_hang_fault_never_answers(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("GET", "/api/v1/nodes", mode="hang")
    with pytest.raises(asyncio.TimeoutError):
        await kube.get("/api/v1/nodes", timeout=aiohttp.ClientTimeout(total=0.2))


async def test_stop_releases_a_hung_request() -> None:
    api = ApiDouble()
    await api.start()
    api.fail("*", "/", mode="hang")
    async with aiohttp.ClientSession(api.url, headers=AUTH) as session:
        pending = asyncio.ensure_future(session.get("/readyz"))
        while not api.requests:
            await asyncio.sleep(0.01)
        await api.stop()
        with pytest.raises(aiohttp.ClientConnectionError):  # disconnected (aiohttp retries a GET once: refused)
            await pending


async def test_a_drop_fault_closes_the_connection_without_an_answer(
    api: ApiDouble, kube: aiohttp.ClientSession
) -> None:
    api.fail("PATCH", "/api/v1/namespaces/default/pods/", mode="drop")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await kube.patch("/api/v1/namespaces/default/pods/p", data=b"{}", headers=MERGE)


async def test_a_slow_fault_answers_normally_after_its_delay(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    api.fail("GET", "/readyz", mode="slow", delay=0.2)
    started = time.monotonic()
    async with kube.get("/readyz") as answer:
        assert (answer.status, await answer.text()) == (200, "ok")
    assert time.monotonic() - started >= 0.2


# -- the rest of the surface --


async def test_a_missing_or_wrong_token_is_401_and_tokens_rotate(api: ApiDouble) -> None:
    unauthorized = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    async with aiohttp.ClientSession(api.url) as anonymous:
        assert await get_json(anonymous, "/api/v1/nodes") == (401, unauthorized)
        api.set_token("rotated")
        async with anonymous.get("/api/v1/nodes", headers=AUTH) as answer:
            assert answer.status == 401
        async with anonymous.get("/api/v1/nodes", headers={"Authorization": "Bearer rotated"}) as answer:
            assert answer.status == 200


async def test_unknown_paths_are_404_and_wrong_methods_405_as_statuses(kube: aiohttp.ClientSession) -> None:
    status, body = await get_json(kube, "/api/v1/configmaps")
    assert (status, body["reason"], body["message"]) == (
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
    async with kube.put("/api/v1/pods") as answer:
        assert (answer.status, (await answer.json())["reason"]) == (405, "MethodNotAllowed")


async def test_version_and_readyz_and_the_request_log(api: ApiDouble, kube: aiohttp.ClientSession) -> None:
    assert (await get_json(kube, "/version"))[1]["gitVersion"] == "v1.34.1-double"
    async with kube.get("/readyz") as answer:
        assert await answer.text() == "ok"
    await get_json(kube, "/api/v1/pods", limit="5")
    assert api.requests == [("GET", "/version"), ("GET", "/readyz"), ("GET", "/api/v1/pods?limit=5")]


async def test_helpers_never_alias_the_stored_objects(api: ApiDouble) -> None:
    given = make_pod("p")
    given["metadata"]["annotations"] = {"a": "1"}
    returned = api.add_pod(given)
    given["metadata"]["annotations"]["x"] = "1"
    returned["metadata"]["annotations"]["y"] = "2"
    (api.pod("default", "p") or {})["metadata"]["annotations"]["z"] = "3"
    stored = api.pod("default", "p") or {}
    assert stored["metadata"]["annotations"] == {"a": "1"}
    assert stored["metadata"]["uid"] and stored["metadata"]["creationTimestamp"]


async def test_it_serves_https_with_the_given_context() -> None:
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    authority.configure_trust(client_context)
    api = ApiDouble(token=None)
    url = await api.start(server_context)
    try:
        assert url.startswith("https://127.0.0.1:")
        async with aiohttp.ClientSession() as session, session.get(url + "/readyz", ssl=client_context) as answer:
            assert await answer.text() == "ok"
    finally:
        await api.stop()
