"""Requests, responses and routes of the HTTP edge: what a handler receives and answers, and how a method and
path find their handler. Plain values; the transport (`transport.py`, `connection.py`) parses and writes them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: bytes
    params: dict[str, str] = field(default_factory=dict)
    """Values of `{name}` segments of the route."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    """Further header lines (`Allow` of a 405); Content-Type, Content-Length, Date and Connection are written
    by the transport."""


def json_error(status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    return Response(status, orjson.dumps({"Error": message}), headers=headers)


def internal_error(where: str, error: Exception, log: logging.Logger) -> Response:
    """The 500 for what a handler raised at `where` (a verb, or a method and path): its traceback logged on
    `log`, its one-line message answered, never the traceback."""
    log.error("%s: unexpected failure", where, exc_info=error)
    return json_error(500, f"internal error in {where}: {type(error).__name__}: {error}")


Handler = Callable[[Request], "Response | Awaitable[Response]"]
"""Answers at once with a Response, or with an awaitable of one when it must wait (a coroutine function is one)."""
Background = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str
    handler: Handler


class Router:
    """Exact paths, and paths ending in one `{name}` segment (`/inspect/{node}`)."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Route]] = {}
        self._prefixed: dict[str, tuple[str, dict[str, Route]]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        route = Route(method, path, handler)
        if path.endswith("}"):
            prefix, _, name = path.rpartition("/{")
            self._prefixed.setdefault(prefix + "/", (name[:-1], {}))[1][method] = route
        else:
            self._exact.setdefault(path, {})[method] = route

    @property
    def paths(self) -> list[str]:
        return [*self._exact, *(prefix + "{" + name + "}" for prefix, (name, _) in self._prefixed.items())]

    def resolve(self, method: str, path: str) -> tuple[Route | None, dict[str, str], bool]:
        """The route, its parameters, and whether the path exists at all (for 405 against 404)."""
        methods, params = self._methods(path)
        if methods is None:
            return None, params, False
        return methods.get(method), params, True

    def allowed(self, path: str) -> tuple[str, ...]:
        """The methods `path` answers (the `Allow` header of a 405), sorted; none for an unknown path."""
        methods, _ = self._methods(path)
        return tuple(sorted(methods or ()))

    def _methods(self, path: str) -> tuple[dict[str, Route] | None, dict[str, str]]:
        methods = self._exact.get(path)
        if methods is not None:
            return methods, {}
        prefix, _, last = path.rpartition("/")
        found = self._prefixed.get(prefix + "/") if last else None
        if found is None:
            return None, {}
        name, methods = found
        return methods, {name: last}
