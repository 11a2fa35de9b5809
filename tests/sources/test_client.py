"""The Kubernetes client against small aiohttp apps that stand in for the API server, each for one behaviour:
its Status bodies, its 401 for a token it no longer accepts, its newline-delimited watch streams, its TLS with
client certificates. Credentials come from kubeconfigs and exec plugins written in the test."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from devtools.harness import free_port
from extender.service.tls import server_context
from extender.sources.kube import client as client_module
from extender.sources.kube.client import (
    ApiError,
    Conflict,
    ConnectionFailed,
    Forbidden,
    Gone,
    Invalid,
    KubeClient,
    KubeError,
    NotFound,
    ServerError,
    Throttled,
    Unauthorized,
    WatchStalled,
    api_error,
)
from extender.sources.kube.config import ExecConfig, KubeConfig, load_config
from tests.conftest import Pki

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[..., Awaitable[str]]


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Status body as the API server writes it."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body |= {"message": message, "reason": reason, "code": code}
    return body | ({"details": details} if details else {})


UNAUTHORIZED = status(401, "Unauthorized", "Unauthorized")
"""What the real API server answers for a token it does not (or no longer) accept."""


@pytest.fixture
async def serve(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> Serve:
    """Serve `routes` (path → handler) on loopback, HTTPS when given a context; return the base URL."""

    async def start(routes: dict[str, Handler], context: ssl.SSLContext | None = None) -> str:
        app = web.Application()
        for path, handler in routes.items():
            app.router.add_route("*", path, handler)
        server = await aiohttp_server(app, ssl=context)
        return str(server.make_url("")).rstrip("/")

    return start


def echo_json(request: web.Request, **extra: Any) -> web.Response:
    return web.json_response({"method": request.method, "path": request.path, "query": dict(request.query), **extra})


class TokenApi:
    """The API server's bearer-token authentication: answers 200 to a token it accepts, the real 401 Status body
    to any other; records the tokens it was shown."""

    def __init__(self, *accepted: str) -> None:
        self.accepted = set(accepted)
        self.seen: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen.append(token)
        if token not in self.accepted:
            return web.json_response(UNAUTHORIZED, status=401)
        return echo_json(request, token=token)


# -- requests and errors


async def test_get_returns_decoded_json_and_sends_params_and_headers(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        headers = {name: request.headers.get(name) for name in ("Accept", "User-Agent", "Authorization")}
        return echo_json(request, headers=headers)

    url = await serve({"/api/v1/pods": handler})
    async with KubeClient(KubeConfig(url, "test", token="t0ken"), user_agent="gpu-extender/1") as kube:
        answer = await kube.get("/api/v1/pods", {"labelSelector": "a=b,c in (d)", "limit": "500"})
    assert answer["query"] == {"labelSelector": "a=b,c in (d)", "limit": "500"}
    assert answer["headers"] == {
        "Accept": "application/json",
        "User-Agent": "gpu-extender/1",
        "Authorization": "Bearer t0ken",
    }


@pytest.mark.parametrize(
    ("method", "content_type"),
    [("create", "application/json"), ("replace", "application/json"), ("merge_patch", "application/merge-patch+json")],
)
async def test_writes_send_their_body_as_json(serve: Serve, method: str, content_type: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        return echo_json(request, body=await request.json(), content_type=request.headers["Content-Type"])

    url = await serve({"/api/v1/namespaces/ns/pods/p": handler})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        answer = await getattr(kube, method)("/api/v1/namespaces/ns/pods/p", {"metadata": {"labels": {"a": "é"}}})
    assert (answer["body"], answer["content_type"]) == ({"metadata": {"labels": {"a": "é"}}}, content_type)


async def test_delete_and_an_empty_answer(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=200 if request.method == "DELETE" else 405)

    url = await serve({"/api/v1/namespaces/ns/pods/p": handler})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        assert await kube.delete("/api/v1/namespaces/ns/pods/p") is None


ERRORS = [
    (
        403,
        {},
        status(403, "Forbidden", 'pods is forbidden: User "system:anonymous" cannot list resource "pods"'),
        Forbidden,
    ),
    (404, {}, status(404, "NotFound", 'pods "p" not found', {"name": "p", "kind": "pods"}), NotFound),
    (409, {}, status(409, "AlreadyExists", 'pods "p" already exists', {"name": "p", "kind": "pods"}), Conflict),
    (
        409,
        {},
        status(409, "Conflict", 'Operation cannot be fulfilled on pods "p": the object has been modified'),
        Conflict,
    ),
    (410, {}, status(410, "Expired", "too old resource version: 1 (5012)"), Gone),
    (422, {}, status(422, "Invalid", 'Pod "p" is invalid', {"causes": [{"field": "spec.containers"}]}), Invalid),
    (
        429,
        {"Retry-After": "3"},
        status(429, "TooManyRequests", "Too many requests", {"retryAfterSeconds": 3}),
        Throttled,
    ),
    (500, {}, status(500, "InternalError", "Internal error occurred: etcdserver: request timed out"), ServerError),
    (400, {}, status(400, "BadRequest", "the server rejected our request"), ApiError),
]


@pytest.mark.parametrize(
    ("code", "headers", "body", "kind"),
    ERRORS,
    ids=["403", "404", "409-AlreadyExists", "409-Conflict", "410-Expired", "422", "429", "500", "400"],
)
async def test_error_statuses_raise_their_class_from_the_status_body(
    serve: Serve, code: int, headers: dict[str, str], body: dict[str, Any], kind: type[ApiError]
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=code, headers=headers)

    url = await serve({"/api/v1/pods": handler})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        with pytest.raises(kind) as caught:
            await kube.get("/api/v1/pods")
    error = caught.value
    assert type(error) is kind
    assert (error.status, error.reason, error.message) == (code, body["reason"], body["message"])
    assert error.details == body.get("details", {})
    assert error.retry_after == (3.0 if code == 429 else None)
    assert str(error).startswith(f"GET /api/v1/pods: {code} {body['reason']}: ")


def test_a_body_that_is_not_a_status_gives_the_http_reason_and_its_start() -> None:
    html = b"<html><head><title>503 Service Unavailable</title></head>" + b"x" * 500
    error = api_error(503, html, "GET", "/api", retry_after="7")
    assert isinstance(error, ServerError)
    assert (error.reason, error.message, error.retry_after) == ("Service Unavailable", html[:200].decode(), 7.0)


def test_retry_after_comes_from_status_details_without_the_header() -> None:
    body = orjson.dumps(status(429, "TooManyRequests", "slow down", {"retryAfterSeconds": 2}))
    assert api_error(429, body, "GET", "/api").retry_after == 2.0


async def test_connection_refused_is_connection_failed() -> None:
    server = f"http://127.0.0.1:{free_port()}"
    async with KubeClient(KubeConfig(server, "test")) as kube:
        with pytest.raises(ConnectionFailed, match=f"GET /api: cannot connect to {server}: Connection refused"):
            await kube.get("/api")


async def test_a_slow_answer_times_out(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.json_response({})

    url = await serve({"/api": handler})
    async with KubeClient(KubeConfig(url, "test"), timeout=0.2) as kube:
        with pytest.raises(ConnectionFailed, match=r"GET /api: timed out after 0.2 s"):
            await kube.get("/api")


async def test_an_answer_that_is_not_json(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="<html>proxy</html>")

    url = await serve({"/api": handler})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        with pytest.raises(KubeError, match="GET /api: the answer is not JSON"):
            await kube.get("/api")


# -- tokens


async def test_token_file_is_read_again_when_the_api_refuses_its_token(serve: Serve, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old\n")
    api = TokenApi("old")
    url = await serve({"/api": api.handle})
    async with KubeClient(KubeConfig(url, "test", token_file=str(token_file))) as kube:
        await kube.get("/api")
        token_file.write_text("new\n")
        api.accepted = {"new"}
        assert (await kube.get("/api"))["token"] == "new"
    assert api.seen == ["old", "old", "new"]


async def test_a_second_401_raises_unauthorized(serve: Serve, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("revoked")
    api = TokenApi("valid")
    url = await serve({"/api": api.handle})
    async with KubeClient(KubeConfig(url, "test", token_file=str(tmp_path / "token"))) as kube:
        with pytest.raises(Unauthorized, match="GET /api: 401 Unauthorized: Unauthorized"):
            await kube.get("/api")
    assert api.seen == ["revoked", "revoked"]


async def test_a_static_token_is_not_retried(serve: Serve) -> None:
    api = TokenApi("valid")
    url = await serve({"/api": api.handle})
    async with KubeClient(KubeConfig(url, "test", token="wrong")) as kube:
        with pytest.raises(Unauthorized):
            await kube.get("/api")
    assert api.seen == ["wrong"]


async def test_token_file_is_read_again_once_old(serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "TOKEN_FILE_MAX_AGE", 0.0)
    (tmp_path / "token").write_text("first")
    api = TokenApi("first", "second")
    url = await serve({"/api": api.handle})
    async with KubeClient(KubeConfig(url, "test", token_file=str(tmp_path / "token"))) as kube:
        await kube.get("/api")
        (tmp_path / "token").write_text("second")
        await kube.get("/api")
    assert api.seen == ["first", "second"]


async def test_kubeconfig_token_and_token_file(serve: Serve, tmp_path: Path) -> None:
    api = TokenApi("static", "from-file")
    url = await serve({"/api": api.handle})
    (tmp_path / "token").write_text("from-file\n")
    kubeconfig = tmp_path / "config"
    for user in ({"token": "static"}, {"tokenFile": "token"}):
        kubeconfig.write_text(yaml_config(url, user))
        async with KubeClient(load_config(str(kubeconfig))) as kube:
            await kube.get("/api")
    assert api.seen == ["static", "from-file"]


def yaml_config(server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> str:
    """A one-context kubeconfig (JSON is YAML)."""
    return json.dumps(
        {
            "current-context": "test",
            "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u"}}],
            "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
            "users": [{"name": "u", "user": user}],
        }
    )


# -- watches


def line(event: dict[str, Any]) -> bytes:
    return orjson.dumps(event) + b"\n"


def pod_event(kind: str, name: str, version: int) -> dict[str, Any]:
    return {"type": kind, "object": {"kind": "Pod", "metadata": {"name": name, "resourceVersion": str(version)}}}


ADDED, MODIFIED = pod_event("ADDED", "a", 11), pod_event("MODIFIED", "a", 12)
BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "20"}}}
SPLIT_ACROSS_CHUNKS = [line(ADDED)[:10], line(ADDED)[10:] + line(MODIFIED)[:7], line(MODIFIED)[7:], line(BOOKMARK)]
"""Events as TCP may deliver them: a line cut anywhere, two lines in one chunk."""
HUGE = {"type": "ADDED", "object": {"kind": "Pod", "metadata": {"name": "big", "annotations": {"x": "y" * (1 << 20)}}}}
"""One event line over 1 MiB (a pod with a huge annotation): longer than aiohttp's readline limit."""


def streaming(pieces: list[bytes], then: float = 0.0, seen: list[dict[str, str]] | None = None) -> Handler:
    """A watch as the API server streams it: 200 at once, chunked JSON lines, each piece flushed on its own;
    after the pieces it waits `then` seconds (silent) and ends the stream."""

    async def handler(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append(dict(request.query))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0.02)
        await asyncio.sleep(then)
        await response.write_eof()
        return response

    return handler


async def collect(stream: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [event async for event in stream]


async def test_watch_yields_events_split_across_chunks_until_the_server_ends_it(serve: Serve) -> None:
    seen: list[dict[str, str]] = []
    url = await serve({"/api/v1/pods": streaming(SPLIT_ACROSS_CHUNKS, seen=seen)})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        params = {"resourceVersion": "10", "allowWatchBookmarks": "true"}
        events = await collect(kube.watch("/api/v1/pods", params, inactivity=5))
    assert events == [ADDED, MODIFIED, BOOKMARK]
    assert seen == [{"watch": "1", "resourceVersion": "10", "allowWatchBookmarks": "true"}]


async def test_watch_reads_an_event_line_over_one_mebibyte(serve: Serve) -> None:
    encoded = line(HUGE)
    pieces = [encoded[start : start + 65536] for start in range(0, len(encoded), 65536)] + [line(ADDED)]
    url = await serve({"/api/v1/pods": streaming(pieces)})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        assert await collect(kube.watch("/api/v1/pods", {}, inactivity=5)) == [HUGE, ADDED]


async def test_a_silent_watch_raises_watch_stalled(serve: Serve) -> None:
    url = await serve({"/api/v1/pods": streaming([line(ADDED)], then=30)})
    events: list[dict[str, Any]] = []
    async with KubeClient(KubeConfig(url, "test")) as kube:
        with pytest.raises(WatchStalled, match=r"GET /api/v1/pods: watch stalled: no bytes for 0.3 s"):
            async for event in kube.watch("/api/v1/pods", {}, inactivity=0.3):
                events.append(event)
    assert events == [ADDED]


async def test_a_watch_lasts_longer_than_the_request_timeout(serve: Serve) -> None:
    pieces = [line(pod_event("MODIFIED", "a", version)) for version in range(1, 6)]
    url = await serve({"/api/v1/pods": streaming(pieces, then=0.3)})
    async with KubeClient(KubeConfig(url, "test"), timeout=0.1) as kube:
        assert len(await collect(kube.watch("/api/v1/pods", {}, inactivity=1))) == 5


async def test_a_410_answer_to_a_watch_raises_gone(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(status(410, "Expired", "too old resource version: 1 (5012)"), status=410)

    url = await serve({"/api/v1/pods": handler})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        with pytest.raises(Gone, match="too old resource version"):
            await collect(kube.watch("/api/v1/pods", {"resourceVersion": "1"}, inactivity=5))


async def test_a_connection_cut_mid_stream_is_connection_failed(serve: Serve) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(line(ADDED) + line(MODIFIED)[:5])
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return response

    url = await serve({"/api/v1/pods": handler})
    events: list[dict[str, Any]] = []
    async with KubeClient(KubeConfig(url, "test")) as kube:
        with pytest.raises(ConnectionFailed, match="GET /api/v1/pods: "):
            async for event in kube.watch("/api/v1/pods", {}, inactivity=5):
                events.append(event)
    assert events == [ADDED]


class EndlessWatch:
    """A watch the server would keep open for minutes, sending a heartbeat line; notes when the client leaves
    (the handler is cancelled when its connection closes)."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            await response.write(line(ADDED))
            while True:
                await asyncio.sleep(0.02)
                await response.write(b"\n")
        finally:
            self.left.set()


async def test_closing_a_watch_releases_its_connection(serve: Serve) -> None:
    endless = EndlessWatch()
    url = await serve({"/api/v1/pods": endless.handle})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        stream = kube.watch("/api/v1/pods", {}, inactivity=5)
        assert await anext(stream) == ADDED
        await stream.aclose()
        await asyncio.wait_for(endless.left.wait(), 2)


async def test_leaving_a_watch_loop_releases_its_connection(serve: Serve) -> None:
    endless = EndlessWatch()
    url = await serve({"/api/v1/pods": endless.handle})
    async with KubeClient(KubeConfig(url, "test")) as kube:
        async for _ in kube.watch("/api/v1/pods", {}, inactivity=5):
            break
        await asyncio.wait_for(endless.left.wait(), 2)


# -- TLS


async def whoami(request: web.Request) -> web.Response:
    """The API server's view of a client certificate: the subject and issuer it verified."""
    assert request.transport is not None
    peer = request.transport.get_extra_info("peercert") or {}
    names = [value for kind, value in peer.get("subjectAltName", ()) if kind == "DNS"]
    issuer = dict(pair[0] for pair in peer.get("issuer", ()))
    return web.json_response({"name": names[0] if names else None, "issuer": issuer.get("organizationalUnitName")})


async def test_kubeconfig_client_certificate_with_a_relative_ca(serve: Serve, pki: Pki, tmp_path: Path) -> None:
    url = await serve({"/api": whoami}, server_context(pki.server_cert, pki.server_key, client_ca=pki.ca))
    folder = tmp_path / "kube"
    folder.mkdir()
    (folder / "ca.crt").write_bytes(Path(pki.ca).read_bytes())
    user = {"client-certificate": pki.client_cert, "client-key": pki.client_key}
    (folder / "config").write_text(yaml_config(url, user, {"certificate-authority": "ca.crt"}))
    async with KubeClient(load_config(str(folder / "config"))) as kube:
        assert (await kube.get("/api"))["name"] == "kube-scheduler"


async def test_kubeconfig_client_certificate_data(serve: Serve, pki: Pki, tmp_path: Path) -> None:
    url = await serve({"/api": whoami}, server_context(pki.server_cert, pki.server_key, client_ca=pki.ca))
    config = KubeConfig(
        url,
        "test",
        ca_data=Path(pki.ca).read_bytes(),
        client_cert_data=Path(pki.client_cert).read_bytes(),
        client_key_data=Path(pki.client_key).read_bytes(),
    )
    async with KubeClient(config) as kube:
        assert (await kube.get("/api"))["name"] == "kube-scheduler"


async def test_without_a_client_certificate_the_server_refuses(serve: Serve, pki: Pki) -> None:
    url = await serve({"/api": whoami}, server_context(pki.server_cert, pki.server_key, client_ca=pki.ca))
    async with KubeClient(KubeConfig(url, "test", ca_file=pki.ca), timeout=2) as kube:
        with pytest.raises(ConnectionFailed, match="GET /api: "):
            await kube.get("/api")


async def test_a_server_certificate_from_another_ca_fails_the_handshake(serve: Serve, pki: Pki) -> None:
    url = await serve({"/api": whoami}, server_context(pki.server_cert, pki.server_key))
    async with KubeClient(KubeConfig(url, "test", ca_file=pki.other_ca)) as kube:
        with pytest.raises(ConnectionFailed, match=f"GET /api: TLS handshake with {url} failed: .*certificate verify"):
            await kube.get("/api")


async def test_insecure_skip_tls_verify_accepts_any_server_certificate(serve: Serve, pki: Pki) -> None:
    url = await serve({"/api": whoami}, server_context(pki.server_cert, pki.server_key))
    async with KubeClient(KubeConfig(url, "test", insecure_skip_tls_verify=True)) as kube:
        assert (await kube.get("/api"))["name"] is None


# -- exec plugins

PLUGIN = """
import json, os, pathlib, sys
folder = pathlib.Path(sys.argv[1])
run = int((folder / "runs").read_text()) + 1 if (folder / "runs").exists() else 1
(folder / "runs").write_text(str(run))
(folder / "seen.json").write_text(json.dumps({name: os.environ.get(name) for name in sys.argv[2:]}))
if (folder / "fail").exists():
    print("looking up credentials...", file=sys.stderr)
    print("error: SSO session expired, run aws sso login", file=sys.stderr)
    sys.exit(1)
reply = folder / f"reply-{run}.json"
print((reply if reply.exists() else folder / "reply.json").read_text().replace("{run}", str(run)))
"""
"""A credential plugin as kubectl runs one: replies with an ExecCredential from the test's files, counts its runs
and notes the variables named in its arguments."""


def exec_credential(status: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status})


def plugin(folder: Path, reply: dict[str, Any] | None = None, **numbered: dict[str, Any]) -> ExecConfig:
    folder.mkdir(exist_ok=True)
    (folder / "plugin.py").write_text(PLUGIN)
    if reply is not None:
        (folder / "reply.json").write_text(exec_credential(reply))
    for name, status_ in numbered.items():
        (folder / f"{name.replace('_', '-')}.json").write_text(exec_credential(status_))
    variables = ("KUBERNETES_EXEC_INFO", "GREETING")
    return ExecConfig(sys.executable, (str(folder / "plugin.py"), str(folder), *variables), (("GREETING", "hi"),))


def runs(folder: Path) -> int:
    return int((folder / "runs").read_text())


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_exec_plugin_token_through_a_kubeconfig(serve: Serve, tmp_path: Path) -> None:
    api = TokenApi("token-1")
    url = await serve({"/api": api.handle})
    folder = tmp_path / "plugin"
    exec_config = plugin(folder, {"token": "token-{run}"})
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": exec_config.command,
            "args": list(exec_config.args),
            "env": [{"name": "GREETING", "value": "hi"}],
            "interactiveMode": "Never",
        }
    }
    (tmp_path / "config").write_text(yaml_config(url, user))
    async with KubeClient(load_config(str(tmp_path / "config"))) as kube:
        await kube.get("/api")
        await kube.get("/api")
    assert api.seen == ["token-1", "token-1"]
    assert runs(folder) == 1
    seen = json.loads((folder / "seen.json").read_text())
    assert seen["GREETING"] == "hi"
    assert json.loads(seen["KUBERNETES_EXEC_INFO"]) == {
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }


async def test_exec_plugin_runs_again_when_the_api_refuses_its_token(serve: Serve, tmp_path: Path) -> None:
    api = TokenApi("token-2")
    url = await serve({"/api": api.handle})
    async with KubeClient(KubeConfig(url, "test", exec=plugin(tmp_path, {"token": "token-{run}"}))) as kube:
        assert (await kube.get("/api"))["token"] == "token-2"
    assert api.seen == ["token-1", "token-2"]


async def test_exec_credential_is_renewed_before_it_expires(serve: Serve, tmp_path: Path) -> None:
    api = TokenApi("token-1", "token-2")
    url = await serve({"/api": api.handle})
    expiring = plugin(tmp_path, {"token": "token-{run}", "expirationTimestamp": later(5)})
    async with KubeClient(KubeConfig(url, "test", exec=expiring)) as kube:
        await kube.get("/api")
        await kube.get("/api")
    assert api.seen == ["token-1", "token-2"]


async def test_exec_plugin_client_certificates_rebuild_the_connection(serve: Serve, pki: Pki, tmp_path: Path) -> None:
    context = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    context.load_verify_locations(cafile=pki.other_ca)
    url = await serve({"/api": whoami}, context)
    expires = later(5)
    exec_config = plugin(
        tmp_path,
        reply_1={
            "clientCertificateData": Path(pki.client_cert).read_text(),
            "clientKeyData": Path(pki.client_key).read_text(),
            "expirationTimestamp": expires,
        },
        reply_2={
            "clientCertificateData": Path(pki.stranger_cert).read_text(),
            "clientKeyData": Path(pki.stranger_key).read_text(),
            "expirationTimestamp": expires,
        },
    )
    async with KubeClient(KubeConfig(url, "test", ca_file=pki.ca, exec=exec_config)) as kube:
        first, second = await kube.get("/api"), await kube.get("/api")
    assert first["name"] == second["name"] == "kube-scheduler"
    assert first["issuer"] != second["issuer"]


async def test_a_failing_exec_plugin_names_its_command_and_last_stderr_line(serve: Serve, tmp_path: Path) -> None:
    url = await serve({"/api": TokenApi().handle})
    exec_config = plugin(tmp_path, {"token": "unused"})
    (tmp_path / "fail").touch()
    async with KubeClient(KubeConfig(url, "test", exec=exec_config)) as kube:
        with pytest.raises(KubeError) as caught:
            await kube.get("/api")
    assert str(caught.value) == (
        f"exec plugin {sys.executable} exited with status 1: error: SSO session expired, run aws sso login"
    )


async def test_an_exec_plugin_printing_no_credential(serve: Serve, tmp_path: Path) -> None:
    url = await serve({"/api": TokenApi().handle})
    exec_config = plugin(tmp_path)
    (tmp_path / "reply.json").write_text("Please log in at https://sso.example/")
    async with KubeClient(KubeConfig(url, "test", exec=exec_config)) as kube:
        with pytest.raises(KubeError, match="did not print an ExecCredential"):
            await kube.get("/api")


async def test_a_missing_exec_command(tmp_path: Path) -> None:
    async with KubeClient(KubeConfig("http://127.0.0.1:1", "test", exec=ExecConfig(str(tmp_path / "nope")))) as kube:
        with pytest.raises(KubeError, match=f"exec plugin {tmp_path / 'nope'}: cannot run it: No such file"):
            await kube.get("/api")
