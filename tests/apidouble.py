"""A kube-apiserver test double: the endpoints our extender calls, answered as a v1.34 API server answers them on
the wire, plus the faults a real API server will not produce on demand (timeouts, 5xx, 429, dropped and expired
watches, compaction).

What each part stands for:

- Storage is etcd: one global resourceVersion that every write bumps (served as a string), objects kept by their
  etcd key (`namespace/name` for pods, `name` for nodes). A stored object is never mutated, only replaced (copy on
  write), so list snapshots and watch history share them; callers of the helpers always get deep copies. A write
  that changes nothing is not a write: no new resourceVersion, no watch event (the etcd3 store skips it). Empty
  labels and annotations are not kept (Go's `omitempty`: the real server never shows `"annotations": {}`).
- Lists are the etcd3 store: items in key order (a string order, as etcd's), without kind/apiVersion (single
  objects and watch events carry them); `limit` + `continue` paging where every page is the snapshot at the first
  page's revision; the continue token is the real encoding (base64url JSON: rv and start key). A token older than
  the kept history is 410 Expired with the real message and, in metadata.continue, a token that goes on at the
  newest revision (inconsistently), exactly as the real one does after etcd compaction.
- Watches are the watch cache: one kept history per resource (`history` events); a watch from an older
  resourceVersion gets HTTP 200 then a single in-stream ERROR 410; from "" or "0" it starts with a synthetic ADDED
  per object; a field selector turns an object that stops matching into DELETED (its previous content at the
  event's resourceVersion) and one that starts matching into ADDED. BOOKMARK objects are a zero Pod or Node with
  only a resourceVersion; besides `bookmark()`, a watch gets the cache's own one 2 s before its timeoutSeconds.
- Writes follow the registry: merge patch only (RFC 7386); a patch cannot change a pod's status (dropped, as the
  pod strategy does) or its spec beyond the few mutable fields (422); a stale resourceVersion is a 409 (checked
  before validation); a changed metadata.uid is a 422 "field is immutable" (a patch carries no UID precondition;
  PUT and Binding do, and theirs is the storage-level 409). `pods/{name}/status` (merge PATCH and PUT, as kubelets
  write phase) changes status and metadata but never spec. DELETE of a pod always writes deletionTimestamp first
  (a MODIFIED), then, at grace 0 (any unscheduled or finished pod), removes it. A PUT of a missing Lease creates
  it. Binding, Events and Leases otherwise as the registry has them.
- Custom resources (PodGroups of scheduler-plugins' `scheduling.x-k8s.io/v1alpha1` and Volcano's
  `scheduling.volcano.sh/v1beta1`) are served as the CRD handler serves them, once their CRD is installed
  (`install_crd`): list items keep their kind and apiVersion (unstructured objects), a BOOKMARK's object is nothing
  but its kind, apiVersion and resourceVersion. Before that, and after `remove_crd` (which deletes every object of
  it, each a DELETED to the watches, then ends the watches cleanly), a request for it is the 404 of a path the
  server does not know.
- Faults are the network and the control plane misbehaving: `fail()` (status, hang, drop, slow; matched before
  authentication, as a load balancer or an overloaded server would answer), `drop_watches()`, `expire_watches()`,
  `compact()` (the compactor's write, then 410 for anything older), `bookmark()`.

It runs in the test's own event loop and must never import the extender's Kubernetes client: it is the other side
of that client's wire, and stays true to the real server rather than to the client.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import datetime
import enum
import functools
import http
import random
import socket
import ssl
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

Obj = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The real server's texts, in one place (k8s.io/apiserver and k8s.io/kubernetes, v1.34).
MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"
ALREADY_ASSIGNED = 'pod {pod} is already assigned to node "{node}"'
BEING_DELETED = "pod {pod} is being deleted, cannot be assigned to a host"
UID_PRECONDITION = "Precondition failed: UID in precondition: {want}, UID in object meta: {have}"
RV_PRECONDITION = "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {have}"
STORAGE_INVALID_OBJECT = (
    "StorageError: invalid object, Code: 4, Key: {key}, ResourceVersion: 0, AdditionalErrorMsg: {msg}"
)
DELETE_UID_PRECONDITION = (
    "the UID in the precondition ({want}) does not match the UID in record ({have}). "
    "The object might have been deleted and then recreated"
)
TOO_OLD_RESOURCE_VERSION = "too old resource version: {asked} ({oldest})"
LIST_TOO_OLD = "The resourceVersion for the provided list is too old."
CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter, or use the continue token in this response to retrieve the remainder of the "
    "results. Continuing with the provided token results in an inconsistent list - objects that were created, "
    "modified, or deleted between the time the first chunk was returned and now may show up in the list."
)
POD_SPEC_FORBIDDEN = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)
NAME_REQUIRED = "Required value: name or generateName is required"
RV_REQUIRED = "Invalid value: 0: must be specified for an update"
NAMESPACE_MISMATCH = "the namespace of the provided object does not match the namespace sent on the request"
NOT_FOUND_PATH = "the server could not find the requested resource"
VERSION = {
    "major": "1",
    "minor": "34",
    "emulationMajor": "1",
    "emulationMinor": "34",
    "gitVersion": "v1.34.1-double",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-09-09T00:00:00Z",
    "goVersion": "go1.24.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}
FAULT_MODES = ("status", "hang", "drop", "slow")
POD_META_KEPT = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds")
"""What an update of a pod cannot change in its metadata (the rest of metadata is the writer's)."""
ZERO_POD: Obj = {"spec": {"containers": None}, "status": {}}
"""What a BOOKMARK's object carries besides its resourceVersion: a zero api.Pod as Go serializes it."""
ZERO_NODE: Obj = {
    "spec": {},
    "status": {
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": dict.fromkeys(
            (
                "machineID",
                "systemUUID",
                "bootID",
                "kernelVersion",
                "osImage",
                "containerRuntimeVersion",
                "kubeletVersion",
                "kubeProxyVersion",
                "operatingSystem",
                "architecture",
            ),
            "",
        ),
    },
}
PRE_TIMEOUT_BOOKMARK = 2.0
"""Seconds before a watch's timeoutSeconds ends that the watch cache sends its bookmark (cacheWatcher's
nextBookmarkTime)."""
GENERATED_NAME_LETTERS = "bcdfghjklmnpqrstvwxz2456789"
"""The alphabet of generateName's 5-character suffix (k8s.io/apimachinery/pkg/util/rand)."""
LEASES = "leases"
LEASE_GROUP = "coordination.k8s.io"
PODGROUP_VERSIONS = ("scheduling.x-k8s.io/v1alpha1", "scheduling.volcano.sh/v1beta1")
"""The PodGroup CRDs the double can serve (`ApiDouble.install_crd`)."""


class ApiStatus(Exception):
    """A failure answered with a Status body, raised by a handler and written by the middleware."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: Obj | None = None,
        list_meta: Obj | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.headers = headers or {}
        self.body = status_body(code, reason, message, details, list_meta)

    def response(self) -> web.Response:
        return json_response(self.body, self.code, self.headers)


def status_body(code: int, reason: str, message: str, details: Obj | None = None, list_meta: Obj | None = None) -> Obj:
    """A metav1.Status as Go serializes it: empty reason and details left out."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": list_meta or {}, "status": "Failure"}
    body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _details(name: str, resource: str, group: str = "") -> Obj:
    return {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> ApiStatus:
    return ApiStatus(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found', _details(name, resource, group)
    )


def conflict(resource: str, name: str, cause: str, group: str = "") -> ApiStatus:
    message = f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {cause}'
    return ApiStatus(409, "Conflict", message, _details(name, resource, group))


def already_exists(resource: str, name: str, group: str = "") -> ApiStatus:
    message = f'{_qualified(resource, group)} "{name}" already exists'
    return ApiStatus(409, "AlreadyExists", message, _details(name, resource, group))


def bad_request(message: str) -> ApiStatus:
    return ApiStatus(400, "BadRequest", message)


def expired(message: str, list_meta: Obj | None = None) -> ApiStatus:
    return ApiStatus(410, "Expired", message, list_meta=list_meta)


@dataclass(frozen=True, slots=True)
class FieldError:
    """One entry of a 422: `field.Invalid`, `field.Required`, `field.Forbidden`, `field.NotSupported`."""

    path: str
    reason: str  # FieldValueInvalid, FieldValueRequired, ...
    body: str  # "Invalid value: \"x\": field is immutable", "Required value", ...


def invalid(kind: str, name: str, errors: list[FieldError], resource: str = "", group: str = "") -> ApiStatus:
    """NewInvalid: `Kind "name" is invalid: path: body` (several errors in brackets, comma separated). The message
    names each distinct error once (ToAggregate deduplicates); `details.causes` lists every error, repeats too."""
    texts = list(dict.fromkeys(f"{error.path}: {error.body}" for error in errors))
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details: Obj = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = resource or kind
    details["causes"] = [{"reason": e.reason, "message": e.body, "field": e.path} for e in errors]
    return ApiStatus(422, "Invalid", f'{kind} "{name}" is invalid: {summary}', details)


def immutable(path: str, value: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {go_quote(value)}: field is immutable")


def fault_status(code: int) -> ApiStatus:
    """The Status a real control plane answers with for `code` when it is the server, not the request, at fault."""
    if code == 429:
        message = "Too many requests, please try again later."
        return ApiStatus(429, "TooManyRequests", message, {"retryAfterSeconds": 1}, headers={"Retry-After": "1"})
    if code == 500:
        cause = {"causes": [{"message": "etcdserver: request timed out"}]}
        return ApiStatus(500, "InternalError", "Internal error occurred: etcdserver: request timed out", cause)
    known = {
        400: ("BadRequest", "the server rejected our request for an unknown reason"),
        401: ("Unauthorized", "Unauthorized"),
        403: ("Forbidden", "forbidden"),
        404: ("NotFound", NOT_FOUND_PATH),
        409: ("Conflict", MODIFIED),
        410: ("Expired", "too old resource version"),
        503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
        504: ("Timeout", "Timeout: request did not complete within requested timeout - context deadline exceeded"),
    }
    reason, message = known.get(code, ("", http.HTTPStatus(code).phrase))
    return ApiStatus(code, reason, message)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, headers=headers, content_type="application/json")


def copy(value: Obj) -> Obj:
    """A deep copy, and a check that the value is JSON (what the API server could have stored)."""
    copied: Obj = orjson.loads(orjson.dumps(value))
    return copied


@functools.lru_cache(maxsize=1)
def _rfc3339(second: int) -> str:
    return datetime.datetime.fromtimestamp(second, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_time() -> str:
    """metav1.Time: whole seconds (memoized per second: adding 100,000 pods stays quick)."""
    return _rfc3339(int(time.time()))


def now_micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, without mutating `target`: dicts along the patched paths are new, the rest is shared."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def with_resource_version(obj: Obj, rv: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}


def without_empty_maps(obj: Obj) -> Obj:
    """What a Go round trip leaves of metadata: empty labels and annotations are dropped (`omitempty` maps)."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or all(meta.get(name) for name in ("labels", "annotations") if name in meta):
        return obj
    kept = {k: v for k, v in meta.items() if not (k in ("labels", "annotations") and not v)}
    return {**obj, "metadata": kept}


def same_but_version(a: Obj, b: Obj) -> bool:
    """Whether a write of `b` over `a` would change nothing the store keeps (the resourceVersion aside)."""
    return with_resource_version(a, 0) == with_resource_version(b, 0)


# Field selectors: the fields each registry indexes (pods: pkg/registry/core/pod/strategy.go ToSelectableFields).
FieldGetter = Callable[[Obj], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Obj) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool):
            return "true" if value else "false"
        return "" if value is None else str(value)

    return get


POD_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
    "spec.nodeName": _path("spec", "nodeName"),
    "spec.schedulerName": _path("spec", "schedulerName"),
    "spec.restartPolicy": _path("spec", "restartPolicy"),
    "spec.serviceAccountName": _path("spec", "serviceAccountName"),
    "spec.hostNetwork": lambda pod: "true" if (pod.get("spec") or {}).get("hostNetwork") else "false",
    "status.phase": _path("status", "phase"),
    "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    "status.podIP": _path("status", "podIP"),
}
CONFIGMAP_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}
ZERO_CONFIGMAP: Obj = {}
"""A BOOKMARK's ConfigMap: nothing but its metadata."""
QUOTA_FIELDS = CONFIGMAP_FIELDS
"""A ResourceQuota's field selectors: its name and namespace only, as a ConfigMap's."""
ZERO_QUOTA: Obj = {"spec": {}, "status": {}}
"""A BOOKMARK's ResourceQuota: empty spec and status, as Go's zero value marshals them."""

NODE_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "spec.unschedulable": lambda node: "true" if (node.get("spec") or {}).get("unschedulable") else "false",
}


@dataclass(frozen=True, slots=True)
class Requirement:
    field: str
    get: FieldGetter
    equal: bool
    value: str

    def holds(self, obj: Obj) -> bool:
        return (self.get(obj) == self.value) == self.equal


Selector = tuple[Requirement, ...]


def parse_field_selector(text: str, fields: dict[str, FieldGetter]) -> Selector:
    """`a=b,c!=d` (also `==`), every term must hold; an unknown field or term is a 400, as in the real server."""
    requirements: list[Requirement] = []
    for term in filter(None, text.split(",")):
        operator = next((operator for operator in ("!=", "==", "=") if operator in term), None)
        if operator is None:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        name, value = term.split(operator, 1)
        if name not in fields:
            raise bad_request(f"field label not supported: {name}")
        requirements.append(Requirement(name, fields[name], operator != "!=", value))
    return tuple(requirements)


def matches(selector: Selector, obj: Obj) -> bool:
    return all(requirement.holds(obj) for requirement in selector)


def encode_continue(rv: int, start: str) -> str:
    """The etcd3 store's continue token: base64url (no padding) of {"v","rv","start"}, start relative to the list."""
    raw = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start})
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_continue(token: str) -> tuple[int, str]:
    try:
        data = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        version, rv, start = data["v"], int(data["rv"]), str(data["start"])
    except (ValueError, KeyError, TypeError) as error:
        raise bad_request(f"invalid continue token: continue key is not valid: {error}") from error
    if version != "meta.k8s.io/v1":
        raise bad_request(f"invalid continue token: got unrecognized encoded version {version}")
    if rv == 0:
        raise bad_request("invalid continue token: incorrect encoded start resourceVersion (version meta.k8s.io/v1)")
    if not start:
        raise bad_request("invalid continue token: encoded start key empty (version meta.k8s.io/v1)")
    return rv, start


@dataclass(frozen=True, slots=True)
class Change:
    """One write to a watched resource, as the watch cache keeps it."""

    rv: int
    key: str
    before: Obj | None
    after: Obj | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A resource's objects at one revision, keys in etcd order."""

    keys: list[str]
    objects: dict[str, Obj]


class Signal(enum.Enum):
    DROP = "drop"  # close the connection mid-stream, no terminating chunk
    EXPIRE = "expire"  # an in-stream ERROR 410, then a clean end
    END = "end"  # a clean end (the resource's storage torn down: its CRD deleted)


class Resource:
    """One watched resource (pods or nodes): objects by etcd key, the kept history, list snapshots, open watches.
    Mutable: this is the double's store."""

    SNAPSHOTS_KEPT = 8

    def __init__(
        self,
        plural: str,
        kind: str,
        fields: dict[str, FieldGetter],
        history: int,
        zero: Obj,
        api_version: str = "v1",
        custom: bool = False,
    ) -> None:
        self.plural = plural
        self.kind = kind
        self.api_version = api_version
        self.custom = custom
        """A custom resource: its list items carry their kind and apiVersion, as unstructured objects do."""
        self.fields = fields
        self.history = history
        self.zero = zero
        self.last_rv = 0  # the newest write to this resource (what the watch cache last processed)
        self.objects: dict[str, Obj] = {}
        self.changes: deque[Change] = deque()
        self.floor = 0  # every change after this resourceVersion is kept
        self.snapshots: OrderedDict[int, Snapshot] = OrderedDict()
        self.watches: set[Watch] = set()

    def typed(self, obj: Obj) -> Obj:
        return {"kind": self.kind, "apiVersion": self.api_version, **obj}

    def bookmark(self, rv: int, annotations: dict[str, str] | None = None) -> bytes:
        meta: Obj = {"resourceVersion": str(rv)} | ({"annotations": annotations} if annotations else {})
        return event_line(
            "BOOKMARK", {"kind": self.kind, "apiVersion": self.api_version, "metadata": meta, **self.zero}
        )

    def record(self, change: Change) -> None:
        self.last_rv = change.rv
        self.changes.append(change)
        while len(self.changes) > self.history:
            self.floor = self.changes.popleft().rv
        for watch in self.watches:
            watch.offer(change)

    def forget(self, rv: int) -> None:
        """Compaction: nothing at or before `rv` can be replayed any more."""
        self.changes.clear()
        self.floor = rv
        self.snapshots.clear()

    def snapshot(self, rv: int) -> Snapshot:
        """The objects at revision `rv` (not older than the kept history): undo the later changes."""
        if (kept := self.snapshots.get(rv)) is not None:
            self.snapshots.move_to_end(rv)
            return kept
        objects = dict(self.objects)
        for change in reversed(self.changes):
            if change.rv <= rv:
                break
            if change.before is None:
                objects.pop(change.key, None)
            else:
                objects[change.key] = change.before
        snapshot = Snapshot(sorted(objects), objects)
        self.snapshots[rv] = snapshot
        while len(self.snapshots) > self.SNAPSHOTS_KEPT:
            self.snapshots.popitem(last=False)
        return snapshot


def scope_prefix(namespace: str | None) -> str:
    return f"{namespace}/" if namespace else ""


def event_line(kind: str, obj: Obj) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + orjson.dumps(obj) + b"}\n"


def expired_line(message: str) -> bytes:
    return event_line("ERROR", status_body(410, "Expired", message))


@dataclass(eq=False)
class Watch:
    """One open watch: what it sees, and the queue its stream is written from."""

    resource: Resource
    namespace: str | None
    selector: Selector
    bookmarks: bool
    since: int
    caught_up: int = 0
    """The resourceVersion of the last event it was replayed before going live (or `since`): the watch cache
    bookmarks it only at a newer one."""
    queue: asyncio.Queue[bytes | Signal] = field(default_factory=asyncio.Queue)

    def sees(self, key: str, obj: Obj | None) -> bool:
        return obj is not None and key.startswith(scope_prefix(self.namespace)) and matches(self.selector, obj)

    def render(self, change: Change) -> bytes | None:
        """The event this watcher gets for `change`, as the watch cache's convertToWatchEvent decides it."""
        now, was = self.sees(change.key, change.after), self.sees(change.key, change.before)
        if now and change.after is not None:
            return event_line("MODIFIED" if was else "ADDED", self.resource.typed(change.after))
        if was and change.before is not None:
            return event_line("DELETED", self.resource.typed(with_resource_version(change.before, change.rv)))
        return None

    def offer(self, change: Change) -> None:
        if (line := self.render(change)) is not None:
            self.queue.put_nowait(line)


@dataclass(slots=True)
class Fault:
    """The next `times` requests matching `method` and `prefix` get this instead of an answer (see ApiDouble.fail)."""

    method: str
    prefix: str
    status: int
    times: int
    mode: str
    delay: float
    body: Obj | None

    def catches(self, request: web.Request) -> bool:
        return self.method in ("*", request.method) and request.path.startswith(self.prefix)


def go_bool(text: str) -> bool:
    """strconv.ParseBool, which the API server's query decoding uses."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("", "0", "f", "F", "false", "FALSE", "False"):
        return False
    raise bad_request(f'strconv.ParseBool: parsing "{text}": invalid syntax')


def query_int(query: Any, name: str) -> int:
    text = query.get(name, "")
    try:
        return int(text) if text else 0
    except ValueError as error:
        raise bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax') from error


def resource_version_of(text: str) -> int:
    try:
        return int(text)
    except ValueError as error:
        raise bad_request(f'invalid resource version: strconv.ParseUint: parsing "{text}": invalid syntax') from error


async def merge_patch_body(request: web.Request) -> Obj:
    if request.content_type != "application/merge-patch+json":
        message = (
            f"the body of the request was in an unknown format - accepted media types include: "
            f"application/merge-patch+json (the API double implements merge patch only; got {request.content_type})"
        )
        raise ApiStatus(415, "UnsupportedMediaType", message)
    return await json_body(request)


async def json_body(request: web.Request) -> Obj:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as error:
        raise bad_request(f"couldn't get version/kind; json parse error: {error}") from error
    if not isinstance(body, dict):
        raise bad_request("couldn't get version/kind; json parse error: cannot unmarshal into Go value of type struct")
    return body


def abort(request: web.Request) -> None:
    """Close the connection under the request at once (no answer, or no terminating chunk)."""
    if request.transport is not None:
        request.transport.abort()


def go_quote(text: str) -> str:
    """Go's %q for the texts we quote (JSON string quoting is the same for them)."""
    return orjson.dumps(text).decode()


def object_key(namespace: str, name: str) -> str:
    """The etcd key of a namespaced object, below its resource's prefix."""
    return f"{namespace}/{name}"


def _mutable_spec_view(spec: Obj) -> Obj:
    """A pod spec with what a pod update may change blanked out (ValidatePodUpdate, simplified)."""
    view = {k: v for k, v in spec.items() if k not in ("activeDeadlineSeconds", "tolerations", "schedulingGates")}
    view.pop("terminationGracePeriodSeconds", None)
    for containers in ("containers", "initContainers"):
        if isinstance(view.get(containers), list):
            view[containers] = [{k: v for k, v in c.items() if k != "image"} for c in view[containers]]
    return view


def _string_map_errors(obj: Obj) -> str:
    """The decode error the API server gives when labels or annotations hold a non-string."""
    go_types = {bool: "bool", int: "number", float: "number", dict: "object", list: "array"}
    for name in ("labels", "annotations"):
        values = (obj.get("metadata") or {}).get(name) or {}
        for value in values.values() if isinstance(values, dict) else ():
            if not isinstance(value, str):
                kind = go_types.get(type(value), "value")
                return f"json: cannot unmarshal {kind} into Go struct field ObjectMeta.metadata.{name} of type string"
    return ""


class ApiDouble:
    """The fake API server. Start it, point a client at `url`, change the cluster with the helpers, inject faults.

    Mutable, single-process, in the test's event loop; every helper is synchronous and takes effect at once
    (watch events are queued before it returns)."""

    def __init__(self, *, token: str | None = "test-token", history: int = 1000) -> None:
        self.token = token or ""
        self.resource_version = 0
        self.requests: list[tuple[str, str]] = []
        self.events: list[Obj] = []
        self.url = ""
        self._pods = Resource("pods", "Pod", POD_FIELDS, history, ZERO_POD)
        self._nodes = Resource("nodes", "Node", NODE_FIELDS, history, ZERO_NODE)
        self._configmaps = Resource("configmaps", "ConfigMap", CONFIGMAP_FIELDS, history, ZERO_CONFIGMAP)
        self._quotas = Resource("resourcequotas", "ResourceQuota", QUOTA_FIELDS, history, ZERO_QUOTA)
        self._podgroups = {
            version: Resource("podgroups", "PodGroup", CONFIGMAP_FIELDS, history, {}, version, custom=True)
            for version in PODGROUP_VERSIONS
        }
        self.crds: set[str] = set()
        """The apiVersions of the PodGroup CRDs installed (`install_crd`)."""
        self._leases: dict[str, Obj] = {}
        self._faults: list[Fault] = []
        self._stopping = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # -- lifecycle --

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> str:
        app = web.Application(middlewares=[self._middleware])
        self._routes(app.router)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        await web.SockSite(self._runner, sock, ssl_context=ssl_context).start()
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        """Release hung requests, cut open watches, close the listener."""
        self._stopping.set()
        for resource in (self._pods, self._nodes, self._configmaps, self._quotas, *self._podgroups.values()):
            for watch in resource.watches:
                watch.queue.put_nowait(Signal.DROP)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def set_token(self, token: str | None) -> None:
        """Rotate the accepted Bearer token (None or "" turns authentication off)."""
        self.token = token or ""

    # -- state, as a user, kubelet or controller changes it --

    def add_node(self, node: Obj) -> Obj:
        obj = self._new_object(node, namespace=None)
        return self._create(self._nodes, obj["metadata"]["name"], obj)

    def update_node(self, node: Obj) -> Obj:
        obj = copy(node)
        return self._replace(self._nodes, obj["metadata"]["name"], obj)

    def delete_node(self, name: str) -> None:
        self._remove(self._nodes, name)

    def add_configmap(self, configmap: Obj) -> Obj:
        """A ConfigMap (kube-system's unhealthy-GPU lists of the gpushare protocol), as kubectl would create it."""
        obj = self._new_object(configmap, namespace="default")
        meta = obj["metadata"]
        return self._create(self._configmaps, object_key(meta["namespace"], meta["name"]), obj)

    def update_configmap(self, configmap: Obj) -> Obj:
        obj = copy(configmap)
        return self._replace(self._configmaps, object_key(obj["metadata"]["namespace"], obj["metadata"]["name"]), obj)

    def delete_configmap(self, namespace: str, name: str) -> None:
        self._remove(self._configmaps, object_key(namespace, name))

    def add_quota(self, quota: Obj) -> Obj:
        """A ResourceQuota, as an administrator would create it (no controller fills its status here)."""
        obj = self._new_object(quota, namespace="default")
        meta = obj["metadata"]
        return self._create(self._quotas, object_key(meta["namespace"], meta["name"]), obj)

    def update_quota(self, quota: Obj) -> Obj:
        obj = copy(quota)
        return self._replace(self._quotas, object_key(obj["metadata"]["namespace"], obj["metadata"]["name"]), obj)

    def delete_quota(self, namespace: str, name: str) -> None:
        self._remove(self._quotas, object_key(namespace, name))

    def install_crd(self, api_version: str) -> None:
        """A PodGroup CRD (one of `PODGROUP_VERSIONS`) is installed: its resource is served from now on."""
        if api_version not in self._podgroups:
            raise ValueError(f"the double serves no CRD of {api_version!r}")
        self.crds.add(api_version)

    def remove_crd(self, api_version: str) -> None:
        """The CRD is deleted: its objects first (the apiextensions controller's cleanup, a DELETED each), then its
        watches end cleanly and its paths answer 404."""
        resource = self._podgroups[api_version]
        for key in sorted(resource.objects):
            self._remove(resource, key)
        for watch in resource.watches:
            watch.queue.put_nowait(Signal.END)
        self.crds.discard(api_version)

    def add_podgroup(self, podgroup: Obj) -> Obj:
        """A PodGroup of the CRD its apiVersion names (installed), as kubectl would create it."""
        resource = self._podgroup_resource(podgroup)
        obj = self._new_object(podgroup, namespace="default")
        meta = obj["metadata"]
        return self._create(resource, object_key(meta["namespace"], meta["name"]), obj)

    def update_podgroup(self, podgroup: Obj) -> Obj:
        resource = self._podgroup_resource(podgroup)
        obj = copy(podgroup)
        meta = obj["metadata"]
        return self._replace(resource, object_key(meta.get("namespace") or "default", meta["name"]), obj)

    def delete_podgroup(self, api_version: str, namespace: str, name: str) -> None:
        self._remove(self._podgroups[api_version], object_key(namespace, name))

    def _podgroup_resource(self, podgroup: Obj) -> Resource:
        version = podgroup.get("apiVersion", "")
        if version not in self.crds:
            raise ValueError(f"no CRD of {version!r} is installed")
        return self._podgroups[version]

    def add_pod(self, pod: Obj) -> Obj:
        obj = self._new_object(pod, namespace="default")
        obj.setdefault("status", {}).setdefault("phase", "Pending")
        meta = obj["metadata"]
        return self._create(self._pods, object_key(meta["namespace"], meta["name"]), obj)

    def update_pod(self, pod: Obj) -> Obj:
        obj = copy(pod)
        meta = obj["metadata"]
        return self._replace(self._pods, object_key(meta.get("namespace") or "default", meta["name"]), obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        """The kubelet's grace-0 delete, or a force delete: deletionTimestamp written (MODIFIED), then removed."""
        key = object_key(namespace, name)
        if key not in self._pods.objects:
            raise KeyError(f"pods {key!r} not found")
        self._delete_pod_gracefully(key, self._pods.objects[key], 0)

    def steal_lease(self, namespace: str, name: str, holder: str) -> Obj:
        """Another replica takes the lease: a write of its own, so the next PUT with our resourceVersion is a 409."""
        key = object_key(namespace, name)
        lease = self._leases.get(key) or self._new_object({"metadata": {"name": name}}, namespace=namespace)
        spec = dict(lease.get("spec") or {})
        if spec.get("holderIdentity") != holder:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec.get("holderIdentity") else 0)
            spec["acquireTime"] = now_micro_time()
        spec |= {"holderIdentity": holder, "renewTime": now_micro_time()}
        spec.setdefault("leaseDurationSeconds", 15)
        self._leases[key] = with_resource_version({**lease, "spec": spec}, self._bump())
        return self.lease(namespace, name) or {}

    # -- reading state --

    def node(self, name: str) -> Obj | None:
        found = self._nodes.objects.get(name)
        return copy(self._nodes.typed(found)) if found is not None else None

    def pod(self, namespace: str, name: str) -> Obj | None:
        found = self._pods.objects.get(object_key(namespace, name))
        return copy(self._pods.typed(found)) if found is not None else None

    def nodes(self) -> list[Obj]:
        return [copy(self._nodes.typed(self._nodes.objects[key])) for key in sorted(self._nodes.objects)]

    def pods(self) -> list[Obj]:
        return [copy(self._pods.typed(self._pods.objects[key])) for key in sorted(self._pods.objects)]

    def lease(self, namespace: str, name: str) -> Obj | None:
        found = self._leases.get(object_key(namespace, name))
        return copy(self._lease_typed(found)) if found is not None else None

    @property
    def open_watches(self) -> int:
        return len(self._pods.watches) + len(self._nodes.watches)

    # -- faults --

    def fail(
        self,
        method: str,
        path_prefix: str,
        *,
        status: int = 500,
        times: int = 1,
        mode: str = "status",
        delay: float = 0.0,
        body: Obj | None = None,
    ) -> None:
        """The next `times` requests with `method` (or "*") whose path starts with `path_prefix` get, instead of an
        answer: "status" a Status body for `status` (or `body`), "hang" nothing until the client gives up (or stop),
        "drop" the connection closed, "slow" the normal answer after `delay` seconds. Earlier faults match first."""
        if mode not in FAULT_MODES:
            raise ValueError(f"mode must be one of {FAULT_MODES}, not {mode!r}")
        if times < 1:
            raise ValueError("times must be at least 1")
        self._faults.append(Fault(method.upper(), path_prefix, status, times, mode, delay, body))

    def clear_faults(self) -> None:
        """Forget every fault not played yet (a request already hanging stays so until its client gives up)."""
        self._faults.clear()

    def drop_watches(self) -> None:
        """Cut every open watch mid-stream: the connection closes without the terminating chunk."""
        self._signal_watches(Signal.DROP)

    def expire_watches(self) -> None:
        """An in-stream ERROR 410 Expired to every open watch, then a clean end (a watcher that fell behind)."""
        self._signal_watches(Signal.EXPIRE)

    def compact(self) -> None:
        """etcd compaction: the compactor's own write, then nothing before it can be listed or watched from."""
        rv = self._bump()
        for resource in (self._pods, self._nodes):
            resource.forget(rv)

    def bookmark(self) -> None:
        """A BOOKMARK at the current resourceVersion to every watch that asked for them (the minutely one, or
        one after etcd's progress notification)."""
        for resource in (self._pods, self._nodes):
            mark = resource.bookmark(self.resource_version)
            for watch in resource.watches:
                if watch.bookmarks:
                    watch.queue.put_nowait(mark)

    # -- the store --

    def _bump(self) -> int:
        self.resource_version += 1
        return self.resource_version

    def _new_object(self, given: Obj, namespace: str | None) -> Obj:
        obj = {k: v for k, v in copy(given).items() if k not in ("kind", "apiVersion")}
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            raise ValueError("metadata.name is required")
        if namespace is None:
            meta.pop("namespace", None)
        else:
            meta["namespace"] = meta.get("namespace") or namespace
        meta["uid"] = meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = meta.get("creationTimestamp") or now_time()
        return obj

    def _create(self, resource: Resource, key: str, obj: Obj) -> Obj:
        if key in resource.objects:
            raise ValueError(f"{resource.plural} {key!r} already exists")
        return copy(resource.typed(self._write(resource, key, obj)))

    def _replace(self, resource: Resource, key: str, obj: Obj) -> Obj:
        stored = resource.objects[key]
        obj = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
        meta = obj.setdefault("metadata", {})
        if meta.get("uid") and meta["uid"] != stored["metadata"]["uid"]:
            raise ValueError(f"{resource.plural} {key!r} has uid {stored['metadata']['uid']}, not {meta['uid']}")
        for kept in ("uid", "creationTimestamp", "namespace"):
            if kept in stored["metadata"]:
                meta[kept] = stored["metadata"][kept]
        return copy(resource.typed(self._write(resource, key, obj)))

    def _remove(self, resource: Resource, key: str) -> None:
        if key not in resource.objects:
            raise KeyError(f"{resource.plural} {key!r} not found")
        self._write(resource, key, None)

    def _write(self, resource: Resource, key: str, after: Obj | None) -> Obj:
        """Store `after` (None deletes) at a new resourceVersion and tell the watches; a no-op write is skipped."""
        before = resource.objects.get(key)
        if after is not None:
            after = without_empty_maps(after)
        if after is not None and before is not None and same_but_version(before, after):
            return before
        rv = self._bump()
        if after is None:
            del resource.objects[key]
        else:
            after = with_resource_version(after, rv)
            resource.objects[key] = after
        resource.record(Change(rv, key, before, after))
        return after if after is not None else with_resource_version(before or {}, rv)

    def _signal_watches(self, signal: Signal) -> None:
        for resource in (self._pods, self._nodes, self._configmaps, self._quotas, *self._podgroups.values()):
            for watch in resource.watches:
                watch.queue.put_nowait(signal)

    # -- HTTP: plumbing --

    def _routes(self, router: web.UrlDispatcher) -> None:
        pods = "/api/v1/namespaces/{namespace}/pods"
        leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        router.add_get("/version", self._version)
        router.add_get("/readyz", self._readyz)
        router.add_get("/api/v1/nodes", self._collection(self._nodes, namespaced=False))
        router.add_get("/api/v1/nodes/{name}", self._get_node)
        router.add_get("/api/v1/namespaces/{namespace}/configmaps", self._collection(self._configmaps, namespaced=True))
        router.add_get("/api/v1/resourcequotas", self._collection(self._quotas, namespaced=False))
        for version, resource in self._podgroups.items():
            router.add_get(f"/apis/{version}/podgroups", self._custom(version, resource, namespaced=False))
            namespaced = f"/apis/{version}/namespaces/{{namespace}}/podgroups"
            router.add_get(namespaced, self._custom(version, resource, namespaced=True))
        router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        router.add_get("/api/v1/pods", self._collection(self._pods, namespaced=False))
        router.add_get(pods, self._collection(self._pods, namespaced=True))
        router.add_get(pods + "/{name}", self._get_pod)
        router.add_patch(pods + "/{name}", self._patch_pod)
        router.add_patch(pods + "/{name}/status", self._patch_pod_status)
        router.add_put(pods + "/{name}/status", self._put_pod_status)
        router.add_delete(pods + "/{name}", self._delete_pod)
        router.add_post(pods + "/{name}/binding", self._bind)
        router.add_post("/api/v1/namespaces/{namespace}/events", self._event_creator("v1", "events", ""))
        router.add_post(
            "/apis/events.k8s.io/v1/namespaces/{namespace}/events",
            self._event_creator("events.k8s.io/v1", "events", "events.k8s.io"),
        )
        router.add_post(leases, self._create_lease)
        router.add_get(leases + "/{name}", self._get_lease)
        router.add_put(leases + "/{name}", self._put_lease)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        try:
            fault = self._take_fault(request)
            if fault is not None and (faulted := await self._play(fault, request)) is not None:
                return faulted
            self._authenticate(request)
            return await handler(request)
        except ApiStatus as status:
            return status.response()
        except web.HTTPException as error:  # the router's own 404 and 405
            if error.status == 405:
                message = "the server does not allow this method on the requested resource"
                return ApiStatus(405, "MethodNotAllowed", message, {}).response()
            if error.status == 404:
                return ApiStatus(404, "NotFound", NOT_FOUND_PATH, {}).response()
            raise

    def _take_fault(self, request: web.Request) -> Fault | None:
        for fault in self._faults:
            if fault.catches(request):
                fault.times -= 1
                if fault.times == 0:
                    self._faults.remove(fault)
                return fault
        return None

    async def _play(self, fault: Fault, request: web.Request) -> web.StreamResponse | None:
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay)
            return None
        if fault.mode == "hang":
            await self._stopping.wait()
        if fault.mode in ("hang", "drop"):
            abort(request)
            return web.Response()
        if fault.body is not None:
            return json_response(fault.body, fault.status, {"Retry-After": "1"} if fault.status == 429 else None)
        return fault_status(fault.status).response()

    def _authenticate(self, request: web.Request) -> None:
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiStatus(401, "Unauthorized", "Unauthorized")

    async def _version(self, request: web.Request) -> web.Response:
        return json_response(VERSION)

    async def _readyz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    # -- HTTP: lists and watches --

    def _collection(self, resource: Resource, namespaced: bool) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            namespace = request.match_info["namespace"] if namespaced else None
            query = request.query
            selector = parse_field_selector(query.get("fieldSelector", ""), resource.fields)
            if query.get("labelSelector"):
                raise bad_request("labelSelector is not supported by the API double")
            if go_bool(query.get("watch", "")):
                return await self._watch(request, resource, namespace, selector)
            return self._list(resource, namespace, selector, query)

        return serve

    def _custom(self, api_version: str, resource: Resource, namespaced: bool) -> Handler:
        """A custom resource's collection: served while its CRD is installed, else the 404 of an unknown path."""
        serve = self._collection(resource, namespaced)

        async def served(request: web.Request) -> web.StreamResponse:
            if api_version not in self.crds:
                raise ApiStatus(404, "NotFound", NOT_FOUND_PATH, {})
            return await serve(request)

        return served

    def _list(self, resource: Resource, namespace: str | None, selector: Selector, query: Any) -> web.Response:
        limit = query_int(query, "limit")
        token, asked = query.get("continue", ""), query.get("resourceVersion", "")
        prefix = scope_prefix(namespace)
        start = ""
        if token:
            if asked:
                raise bad_request("specifying resource version is not allowed when using continue")
            at, start = decode_continue(token)
            if at == -1:  # the token a 410 hands out: go on at the newest revision
                at = self.resource_version
            elif at < resource.floor:
                raise expired(CONTINUE_TOO_OLD, {"continue": encode_continue(-1, start)})
        elif query.get("resourceVersionMatch") == "Exact":
            at = resource_version_of(asked)
            if at < resource.floor:
                raise expired(LIST_TOO_OLD)
            self._not_too_large(at)
        else:
            if asked not in ("", "0"):
                self._not_too_large(resource_version_of(asked))
            at = self.resource_version
        snapshot = resource.snapshot(at)
        keys, objects = snapshot.keys, snapshot.objects
        end = bisect.bisect_left(keys, prefix[:-1] + "0") if prefix else len(keys)  # "0" sorts right after "/"
        index = bisect.bisect_left(keys, prefix + start) if start else bisect.bisect_left(keys, prefix)
        items: list[Obj] = []
        while index < end and not (limit and len(items) >= limit):
            obj = objects[keys[index]]
            index += 1
            if matches(selector, obj):
                items.append(resource.typed(obj) if resource.custom else obj)
        meta: Obj = {"resourceVersion": str(at)}
        if limit and index < end:
            meta["continue"] = encode_continue(at, keys[index - 1][len(prefix) :] + "\x00")
            if not selector:
                meta["remainingItemCount"] = end - index
        listed = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": meta, "items": items}
        return json_response(listed)

    def _not_too_large(self, rv: int) -> None:
        if rv > self.resource_version:
            message = f"Too large resource version: {rv}, current: {self.resource_version}"
            details = {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}
            raise ApiStatus(504, "Timeout", message, details | {"retryAfterSeconds": 1})

    async def _watch(
        self, request: web.Request, resource: Resource, namespace: str | None, selector: Selector
    ) -> web.StreamResponse:
        query = request.query
        asked = query.get("resourceVersion", "")
        timeout = query_int(query, "timeoutSeconds")
        watch = Watch(
            resource, namespace, selector, go_bool(query.get("allowWatchBookmarks", "")), self.resource_version
        )
        lines: list[bytes]
        too_old = False
        if asked in ("", "0") or go_bool(query.get("sendInitialEvents", "")):
            current = resource.objects
            lines = [
                event_line("ADDED", resource.typed(current[k])) for k in sorted(current) if watch.sees(k, current[k])
            ]
            watch.caught_up = resource.last_rv
            if go_bool(query.get("sendInitialEvents", "")) and watch.bookmarks:
                end = {"k8s.io/initial-events-end": "true"}
                lines.append(resource.bookmark(self.resource_version, end))
        else:
            watch.since = watch.caught_up = resource_version_of(asked)
            if watch.since < resource.floor:
                too_old = True
                lines = [expired_line(TOO_OLD_RESOURCE_VERSION.format(asked=watch.since, oldest=resource.floor))]
            else:
                lines = []
                for change in resource.changes:
                    if change.rv > watch.since and (line := watch.render(change)) is not None:
                        lines.append(line)
                        watch.caught_up = change.rv
        if not too_old:
            resource.watches.add(watch)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        try:
            await response.prepare(request)
            for chunk in _chunks(lines):
                await response.write(chunk)
            if not too_old and await self._stream(response, watch, timeout) is Signal.DROP:
                abort(request)
                return response
            await response.write_eof()
        except ConnectionError:  # the client went away
            pass
        finally:
            resource.watches.discard(watch)
        return response

    async def _stream(self, response: web.StreamResponse, watch: Watch, timeout: int) -> Signal | None:
        """Copy the watch's queue to the response until a signal or `timeout` seconds; returns the signal.

        A watch that asked for bookmarks gets one `PRE_TIMEOUT_BOOKMARK` seconds before its timeout, at the
        resource's newest resourceVersion, when that is newer than what it was replayed up to: the watch cache's
        pre-timeout bookmark (the real one may repeat it on its next one-second tick)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout > 0 else None
        bookmark_at = None
        if deadline is not None and watch.bookmarks and timeout > PRE_TIMEOUT_BOOKMARK:
            bookmark_at = deadline - PRE_TIMEOUT_BOOKMARK
        while True:
            now = loop.time()
            if bookmark_at is not None and now >= bookmark_at and watch.queue.empty():
                bookmark_at = None
                if watch.resource.last_rv > watch.caught_up:
                    await response.write(watch.resource.bookmark(watch.resource.last_rv))
            remaining = None if deadline is None else deadline - now
            if remaining is not None and remaining <= 0:
                return None
            wait = remaining if bookmark_at is None else max(0.0, bookmark_at - now)
            item: bytes | Signal | None
            if not watch.queue.empty():
                item = watch.queue.get_nowait()
            else:
                try:
                    item = await asyncio.wait_for(watch.queue.get(), wait)
                except TimeoutError:
                    continue
            batch: list[bytes] = []
            while isinstance(item, bytes):  # what is queued goes out in one write, up to a signal
                batch.append(item)
                item = watch.queue.get_nowait() if not watch.queue.empty() else None
            if item is Signal.EXPIRE:
                batch.append(
                    expired_line(TOO_OLD_RESOURCE_VERSION.format(asked=watch.since, oldest=self.resource_version))
                )
            if batch:
                await response.write(b"".join(batch))
            if item is not None:
                return item

    # -- HTTP: pods --

    def _stored_pod(self, request: web.Request) -> tuple[str, Obj]:
        name = request.match_info["name"]
        key = object_key(request.match_info["namespace"], name)
        if (pod := self._pods.objects.get(key)) is None:
            raise not_found("pods", name)
        return key, pod

    async def _get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (node := self._nodes.objects.get(name)) is None:
            raise not_found("nodes", name)
        return json_response(self._nodes.typed(node))

    async def _patch_node(self, request: web.Request) -> web.Response:
        """A merge patch of a Node (HAMi's node lock writes one): metadata.resourceVersion in the patch is the
        registry's precondition (409 when stale); status is kept, as the node strategy keeps it on updates of the
        main resource."""
        patch = await merge_patch_body(request)
        name = request.match_info["name"]
        if (node := self._nodes.objects.get(name)) is None:
            raise not_found("nodes", name)
        patched = {
            k: v for k, v in merge_patch(self._nodes.typed(node), patch).items() if k not in ("kind", "apiVersion")
        }
        meta = patched.get("metadata")
        if not isinstance(meta, dict) or meta.get("name") != name:
            raise bad_request(f"the name of the object does not match the name on the URL ({name})")
        if decode_error := _string_map_errors(patched):
            value = go_quote(orjson.dumps(patched).decode())
            raise invalid("", "", [FieldError("patch", "FieldValueInvalid", f"Invalid value: {value}: {decode_error}")])
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != node["metadata"]["resourceVersion"]:
            raise conflict("nodes", name, MODIFIED)
        patched["metadata"]["resourceVersion"] = node["metadata"]["resourceVersion"]
        if "status" in node:
            patched["status"] = node["status"]
        return json_response(self._nodes.typed(self._write(self._nodes, name, patched)))

    async def _get_pod(self, request: web.Request) -> web.Response:
        return json_response(self._pods.typed(self._stored_pod(request)[1]))

    def _patched(self, pod: Obj, patch: Obj) -> Obj:
        return {k: v for k, v in merge_patch(self._pods.typed(pod), patch).items() if k not in ("kind", "apiVersion")}

    def _checked_update(self, pod: Obj, new: Obj) -> Obj:
        """`new` (a patched pod, or a PUT body) checked as the registry checks an update of `pod`, in its order: the
        name, the maps' types, the resourceVersion (a 409 comes before validation), an immutable metadata.uid (422,
        found twice: by rest.BeforeUpdate and by the strategy). Returned with what the store keeps of `pod`."""
        name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            raise invalid("Pod", name, [FieldError("metadata", "FieldValueRequired", "Required value")])
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        if meta.get("namespace") != namespace:
            raise bad_request(NAMESPACE_MISMATCH)
        if decode_error := _string_map_errors(new):
            value = go_quote(orjson.dumps(new).decode())
            raise invalid("", "", [FieldError("patch", "FieldValueInvalid", f"Invalid value: {value}: {decode_error}")])
        if meta.get("resourceVersion") and meta["resourceVersion"] != pod["metadata"]["resourceVersion"]:
            raise conflict("pods", name, MODIFIED)
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            error = immutable("metadata.uid", meta["uid"])
            raise invalid("Pod", name, [error, error])
        kept = {k: v for k, v in pod["metadata"].items() if k in POD_META_KEPT}
        return {**new, "metadata": {**meta, **kept, "resourceVersion": pod["metadata"]["resourceVersion"]}}

    async def _patch_pod(self, request: web.Request) -> web.Response:
        patch = await merge_patch_body(request)
        key, pod = self._stored_pod(request)
        patched = self._checked_update(pod, self._patched(pod, patch))
        if "status" in pod:  # the pod strategy keeps status on updates of the main resource
            patched["status"] = pod["status"]
        else:
            patched.pop("status", None)
        if _mutable_spec_view(patched.get("spec") or {}) != _mutable_spec_view(pod.get("spec") or {}):
            error = FieldError("spec", "FieldValueForbidden", f"Forbidden: {POD_SPEC_FORBIDDEN}")
            raise invalid("Pod", pod["metadata"]["name"], [error])
        return json_response(self._pods.typed(self._write(self._pods, key, patched)))

    async def _patch_pod_status(self, request: web.Request) -> web.Response:
        patch = await merge_patch_body(request)
        key, pod = self._stored_pod(request)
        return self._write_status(key, pod, self._patched(pod, patch))

    async def _put_pod_status(self, request: web.Request) -> web.Response:
        """A kubelet's status update: no resourceVersion is an unconditional write (pods allow it), a UID is the
        storage's precondition."""
        body = await json_body(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        meta = dict(body.get("metadata") or {})
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(NAMESPACE_MISMATCH)
        if meta.get("name", "") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        key, pod = self._stored_pod(request)
        if (uid := meta.get("uid")) and uid != pod["metadata"]["uid"]:
            cause = UID_PRECONDITION.format(want=uid, have=pod["metadata"]["uid"])
            raise conflict("pods", name, STORAGE_INVALID_OBJECT.format(key=f"/registry/pods/{key}", msg=cause))
        new = {k: v for k, v in body.items() if k not in ("kind", "apiVersion")}
        return self._write_status(key, pod, {**new, "metadata": {**meta, "namespace": namespace}})

    def _write_status(self, key: str, pod: Obj, new: Obj) -> web.Response:
        """podStatusStrategy: status and the rest of metadata are the writer's; spec and ownerReferences stay."""
        updated = self._checked_update(pod, new)
        updated.pop("spec", None)
        if "spec" in pod:
            updated["spec"] = pod["spec"]
        updated["metadata"].pop("ownerReferences", None)
        if "ownerReferences" in pod["metadata"]:
            updated["metadata"]["ownerReferences"] = pod["metadata"]["ownerReferences"]
        return json_response(self._pods.typed(self._write(self._pods, key, updated)))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        options = await json_body(request) if request.can_read_body else {}
        key, pod = self._stored_pod(request)
        name = pod["metadata"]["name"]
        preconditions = options.get("preconditions") or {}
        if (uid := preconditions.get("uid")) and uid != pod["metadata"]["uid"]:
            raise conflict("Pod", name, DELETE_UID_PRECONDITION.format(want=uid, have=pod["metadata"]["uid"]))
        if (rv := preconditions.get("resourceVersion")) and rv != pod["metadata"]["resourceVersion"]:
            cause = (
                f"the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record "
                f"({pod['metadata']['resourceVersion']}). The object might have been modified"
            )
            raise conflict("Pod", name, cause)
        grace = options.get("gracePeriodSeconds")
        if "gracePeriodSeconds" in request.query:
            grace = query_int(request.query, "gracePeriodSeconds")
        return json_response(self._pods.typed(self._delete_pod_gracefully(key, pod, grace)))

    def _delete_pod_gracefully(self, key: str, pod: Obj, grace: int | None) -> Obj:
        """The registry's delete: always first a write of deletionTimestamp and deletionGracePeriodSeconds (the grace
        asked, else the pod's own; 0 for a pod unscheduled or finished; only ever shortened), then, at grace 0, the
        removal. Returns what the API answers: the marked pod, or the removed one at the removal's version."""
        spec, meta = pod.get("spec") or {}, pod["metadata"]
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            grace = 0
        now = datetime.datetime.now(datetime.UTC)
        if "deletionTimestamp" in meta:
            current = meta.get("deletionGracePeriodSeconds")
            if current is None or grace >= current:
                return pod
            marked = datetime.datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%S%z")
            deadline = marked + datetime.timedelta(seconds=grace - current)
        else:
            deadline = now + datetime.timedelta(seconds=grace)
        stamp = {"deletionTimestamp": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"), "deletionGracePeriodSeconds": grace}
        deleting = self._write(self._pods, key, {**pod, "metadata": {**meta, **stamp}})
        return deleting if grace else self._write(self._pods, key, None)

    async def _bind(self, request: web.Request) -> web.Response:
        binding = await json_body(request)
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        meta = binding.get("metadata") or {}
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(NAMESPACE_MISMATCH)
        if meta.get("name", "") != name:
            raise bad_request("name in URL does not match name in Binding object")
        target = binding.get("target") or {}
        errors = []
        if target.get("kind") not in (None, "", "Node"):
            body = f'Unsupported value: "{target["kind"]}": supported values: "Node", "<empty>"'
            errors.append(FieldError("target.kind", "FieldValueNotSupported", body))
        if not target.get("name"):
            errors.append(FieldError("target.name", "FieldValueRequired", "Required value"))
        if errors:
            raise invalid("Binding", name, errors)
        key, pod = self._stored_pod(request)
        pod_meta = pod["metadata"]
        storage_key = f"/registry/pods/{key}"
        if (uid := meta.get("uid")) and uid != pod_meta["uid"]:
            cause = UID_PRECONDITION.format(want=uid, have=pod_meta["uid"])
            raise conflict("pods", name, STORAGE_INVALID_OBJECT.format(key=storage_key, msg=cause))
        if (rv := meta.get("resourceVersion")) and rv != pod_meta["resourceVersion"]:
            cause = RV_PRECONDITION.format(want=rv, have=pod_meta["resourceVersion"])
            raise conflict("pods", name, STORAGE_INVALID_OBJECT.format(key=storage_key, msg=cause))
        if "deletionTimestamp" in pod_meta:
            raise conflict("pods/binding", name, BEING_DELETED.format(pod=name))
        if node := (pod.get("spec") or {}).get("nodeName"):
            raise conflict("pods/binding", name, ALREADY_ASSIGNED.format(pod=name, node=node))
        status = dict(pod.get("status") or {})
        scheduled = {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_time()}
        others = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        status["conditions"] = [*others, scheduled]
        bound_meta = {
            **pod_meta,
            "annotations": {**(pod_meta.get("annotations") or {}), **(meta.get("annotations") or {})},
        }
        bound = {**pod, "metadata": bound_meta, "spec": {**(pod.get("spec") or {}), "nodeName": target["name"]}}
        self._write(self._pods, key, {**bound, "status": status})
        return json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
        )

    # -- HTTP: events and leases --

    def _event_creator(self, api_version: str, resource: str, group: str) -> Handler:
        async def create(request: web.Request) -> web.Response:
            event = await json_body(request)
            namespace = request.match_info["namespace"]
            meta = dict(event.get("metadata") or {})
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(NAMESPACE_MISMATCH)
            if not meta.get("name"):
                if not meta.get("generateName"):
                    error = FieldError("metadata.name", "FieldValueRequired", NAME_REQUIRED)
                    raise invalid(_qualified("Event", group), "", [error], resource, group)
                meta["name"] = meta["generateName"] + "".join(random.choices(GENERATED_NAME_LETTERS, k=5))
            taken = {(e["apiVersion"], e["metadata"]["namespace"], e["metadata"]["name"]) for e in self.events}
            if (api_version, namespace, meta["name"]) in taken:
                raise already_exists(resource, meta["name"], group)
            meta |= {"namespace": namespace, "uid": str(uuid.uuid4()), "creationTimestamp": now_time()}
            meta["resourceVersion"] = str(self._bump())
            stored = {**event, "kind": "Event", "apiVersion": api_version, "metadata": meta}
            if api_version == "v1":
                stored.setdefault("eventTime", None)  # a zero metav1.MicroTime is null, never left out
            self.events.append(stored)
            return json_response(stored, 201)

        return create

    def _lease_typed(self, lease: Obj) -> Obj:
        return {"kind": "Lease", "apiVersion": "coordination.k8s.io/v1", **lease}

    def _lease_body(self, body: Obj, namespace: str) -> Obj:
        meta = dict(body.get("metadata") or {})
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(NAMESPACE_MISMATCH)
        meta["namespace"] = namespace
        return {**{k: v for k, v in body.items() if k not in ("kind", "apiVersion")}, "metadata": meta}

    async def _create_lease(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        lease = self._lease_body(await json_body(request), namespace)
        name = lease["metadata"].get("name", "")
        if not name:
            error = FieldError("metadata.name", "FieldValueRequired", NAME_REQUIRED)
            raise invalid(f"Lease.{LEASE_GROUP}", "", [error], LEASES, LEASE_GROUP)
        if lease["metadata"].get("resourceVersion"):
            raise ApiStatus(500, "", "resourceVersion should not be set on objects to be created")
        key = object_key(namespace, name)
        if key in self._leases:
            raise already_exists(LEASES, name, LEASE_GROUP)
        return self._store_new_lease(key, lease)

    def _store_new_lease(self, key: str, lease: Obj) -> web.Response:
        lease["metadata"] |= {"uid": str(uuid.uuid4()), "creationTimestamp": now_time()}
        self._leases[key] = with_resource_version(lease, self._bump())
        return json_response(self._lease_typed(self._leases[key]), 201)

    async def _get_lease(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (lease := self._leases.get(object_key(request.match_info["namespace"], name))) is None:
            raise not_found(LEASES, name, LEASE_GROUP)
        return json_response(self._lease_typed(lease))

    async def _put_lease(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        lease = self._lease_body(await json_body(request), namespace)
        meta = lease["metadata"]
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name', '')}) does not match the name on the URL ({name})"
            )
        key = object_key(namespace, name)
        stored = self._leases.get(key)
        stored_meta = stored["metadata"] if stored is not None else {}
        if (uid := meta.get("uid")) and uid != stored_meta.get("uid", ""):
            cause = UID_PRECONDITION.format(want=uid, have=stored_meta.get("uid", ""))
            storage_key = f"/registry/leases/{key}"
            raise conflict(LEASES, name, STORAGE_INVALID_OBJECT.format(key=storage_key, msg=cause), LEASE_GROUP)
        if stored is None:  # the lease strategy allows create on update, whatever resourceVersion is sent
            meta.pop("resourceVersion", None)
            return self._store_new_lease(key, lease)
        if not meta.get("resourceVersion"):
            error = FieldError("metadata.resourceVersion", "FieldValueInvalid", RV_REQUIRED)
            raise invalid(_qualified(LEASES, LEASE_GROUP), name, [error], LEASES, LEASE_GROUP)
        if meta["resourceVersion"] != stored_meta["resourceVersion"]:
            raise conflict(LEASES, name, MODIFIED, LEASE_GROUP)
        meta |= {"uid": stored_meta["uid"], "creationTimestamp": stored_meta["creationTimestamp"]}
        if not same_but_version(stored, lease):
            self._leases[key] = with_resource_version(lease, self._bump())
        return json_response(self._lease_typed(self._leases[key]))


def _chunks(lines: Iterable[bytes], size: int = 1 << 16) -> Iterable[bytes]:
    """Join many small event lines into writes of about `size` bytes (a 100,000-pod initial list stays quick)."""
    batch: list[bytes] = []
    length = 0
    for line in lines:
        batch.append(line)
        length += len(line)
        if length >= size:
            yield b"".join(batch)
            batch, length = [], 0
    if batch:
        yield b"".join(batch)
