"""`extender inspect`: fetch a running extender's `/inspect` report and show it as a table people can read.

One GET per run, so the standard library does it (urllib + ssl): HTTPS verified against `--ca` or the system
store, an optional client certificate for an extender that requires mTLS, or no verification only when asked
with `--insecure`. The URL is reached directly (proxy variables are ignored: an extender is reached in-cluster
or through a port-forward). Every failure a user can fix (refused connection, failed TLS verification, an
unknown node, an answer that is not a report) is an `InspectError`: one line naming the URL, never a stack
trace. This module only reads: it never changes the extender's state and never imports the server. Its
drawing of a GPU's fill (`bar`) and its short GPU model names (`short_model`) are the ones `extender demo`
draws too.

What a GPU shows follows what the report carries: memory always; compute (`used_cores/cores %`) and pod slots
(`used_slots/slots`), the GPU's model and a cordon mark where the device plugin tracks them (HAMi); a node's
lock where its plugin holds one. A report without them (gpushare) draws exactly the four memory columns. The
ResourceQuotas that limit GPUs follow the nodes: per limit, what its namespace uses of it (`core/quota/`).
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from extender.core.errors import UserError

TIMEOUT = 5.0
"""Seconds to connect and to wait for the answer."""
BAR_WIDTH = 20
"""Characters inside a fill bar's brackets: 5% of a GPU each."""


class InspectError(UserError):
    """The report could not be fetched or read; the message names the URL and what to do."""


# --- fetching ---------------------------------------------------------------------------------------------


def _ssl_context(ca: str, cert: str, key: str, insecure: bool) -> ssl.SSLContext:
    if key and not cert:
        raise InspectError("--key needs --cert")
    try:
        context = ssl.create_default_context(cafile=ca or None)
    except FileNotFoundError:
        raise InspectError(f"CA file not found: {ca}") from None
    except (ssl.SSLError, OSError) as error:
        raise InspectError(f"cannot use CA file {ca}: {error}") from None
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cert:
        try:
            context.load_cert_chain(cert, key or None)
        except FileNotFoundError as error:
            raise InspectError(f"client certificate or key not found: {error.filename or cert}") from None
        except (ssl.SSLError, OSError) as error:
            raise InspectError(f"cannot use client certificate {cert} with key {key or cert}: {error}") from None
    return context


def _server_error(body: bytes) -> str:
    """The `Error` of a JSON error body, else the start of the body as text."""
    try:
        decoded = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200]
    if isinstance(decoded, dict) and decoded.get("Error"):
        return str(decoded["Error"])
    return json.dumps(decoded)[:200]


def _why(reason: object, scheme: str, cert: str) -> str:
    """A failure to connect, in words that say what to check."""
    # Over TLS 1.3 a server that requires a client certificate refuses it after the handshake: the client sees
    # an alert, or just a closed connection, depending on timing.
    client_cert_hint = ""
    if scheme == "https" and not cert:
        client_cert_hint = ": the extender may require a client certificate (--cert and --key)"
    closed_hint = ": is it serving HTTPS? use an https:// URL" if scheme == "http" else client_cert_hint
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"TLS verification failed ({reason.verify_message or reason.reason}): "
            "give --ca with the CA that signed the extender's certificate (or --insecure to skip the check)"
        )
    if isinstance(reason, ssl.SSLError):
        text = str(reason).upper()
        hint = ""
        if "CERTIFICATE_REQUIRED" in text or "HANDSHAKE_FAILURE" in text or "UNKNOWN_CA" in text:
            hint = client_cert_hint or ": the extender may not accept this client certificate"
        elif "WRONG_VERSION_NUMBER" in text or "RECORD_LAYER" in text:
            hint = ": is the extender serving plain HTTP? use an http:// URL"
        return f"TLS handshake failed ({reason.reason or reason}){hint}"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused: is the extender running and listening there?"
    if isinstance(reason, TimeoutError):
        return f"no answer within {TIMEOUT:g} s"
    if isinstance(reason, (http.client.RemoteDisconnected, ConnectionResetError, ssl.SSLEOFError)):
        return f"the extender closed the connection{closed_hint}"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def fetch(url: str, node: str, ca: str, cert: str, key: str, insecure: bool) -> dict[str, Any]:
    """GET `{url}/inspect` (or `/inspect/{node}`) and return the decoded report."""
    base = url.strip().rstrip("/")
    scheme = urlsplit(base).scheme
    if scheme not in {"http", "https"} or not urlsplit(base).hostname:
        raise InspectError(f"--url {url!r} must be an http:// or https:// URL with a host")
    target = f"{base}/inspect" + (f"/{quote(node, safe='')}" if node else "")
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if scheme == "https":
        handlers.append(urllib.request.HTTPSHandler(context=_ssl_context(ca, cert, key, insecure)))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(target, headers={"Accept": "application/json"})
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            body: bytes = response.read()
    except urllib.error.HTTPError as error:
        with error:
            message = _server_error(error.read())
        if error.code == 404 and node:
            raise InspectError(f"{target}: {message or 'unknown node'}") from None
        raise InspectError(f"{target}: HTTP {error.code}: {message or error.reason}") from None
    except urllib.error.URLError as error:
        raise InspectError(f"{target}: {_why(error.reason, scheme, cert)}") from None
    except (OSError, http.client.HTTPException) as error:
        raise InspectError(f"{target}: {_why(error, scheme, cert)}") from None
    try:
        report = json.loads(body)
    except ValueError:
        raise InspectError(f"{target}: the answer is not JSON; is this the extender's URL?") from None
    expected = "name" if node else "nodes"
    if not isinstance(report, dict) or expected not in report:
        raise InspectError(f"{target}: the answer is not an extender /inspect report (no {expected!r})")
    return report


# --- rendering --------------------------------------------------------------------------------------------


def bar(used: int, capacity: int, width: int = BAR_WIDTH) -> str:
    """`[#####...............]`: the used share of capacity, rounded up so any use shows."""
    if capacity <= 0:
        return "[" + " " * width + "]"
    filled = min(width, -(-max(used, 0) * width // capacity))
    return "[" + "#" * filled + "." * (width - filled) + "]"


def count(number: int, noun: str) -> str:
    """`1 GPU`, `2 GPUs`: the number and the noun, plural unless the number is 1."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _age(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return "age unknown"
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s ago"
    if whole < 7200:
        return f"{whole // 60}m ago"
    return f"{whole // 3600}h ago"


def short_model(model: str) -> str:
    """A GPU's model without the vendor HAMi's plugin puts first: `NVIDIA A100-SXM4-40GB` is `A100-SXM4-40GB`,
    `NVIDIA-Tesla T4` is `T4`."""
    short = model.removeprefix("NVIDIA").lstrip(" -").removeprefix("Tesla").lstrip(" -")
    return short or model


def _holder(holder: dict[str, Any], unit: str) -> str:
    state = str(holder.get("state", "?"))
    text = f"{holder.get('pod', '?')} {holder.get('memory', '?')} {unit}"
    if "cores" in holder:
        text += f" {holder['cores']} % compute"
    text += f" {state}"
    if state != "observed":
        text += f" {_age(holder.get('age_seconds'))}"
    return text


def _whole(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(frozen=True, slots=True)
class _Row:
    """One GPU: the aligned cells (memory's four, then compute and slots where tracked), then its holders (one
    per line)."""

    cells: tuple[str, ...]
    holders: tuple[str, ...]


def _gpu_cell(device: dict[str, Any]) -> str:
    """`GPU 2`, with its short model where known, and `unhealthy` or `cordoned` when it takes no new pods."""
    cell = f"GPU {device.get('index', '?')}"
    if device.get("model"):
        cell += f" {short_model(str(device['model']))}"
    if not device.get("healthy", True):
        cell += " unhealthy"
    if device.get("cordoned"):
        cell += " cordoned"
    return cell


def _tracked_cells(device: dict[str, Any]) -> tuple[str, ...]:
    """Compute and slots, for a GPU whose plugin tracks them ("-" for the one it does not, so columns align)."""
    if "cores" not in device and "slots" not in device:
        return ()
    compute = f"compute {_whole(device.get('used_cores'))}/{_whole(device['cores'])} %" if "cores" in device else "-"
    slots = f"slots {_whole(device.get('used_slots'))}/{_whole(device['slots'])}" if "slots" in device else "-"
    return compute, slots


def _lock(lock: dict[str, Any]) -> str:
    held_for = lock.get("pod") or "a pod it does not name"
    return (
        f"  node lock held for {held_for}, taken {_age(lock.get('age_seconds'))}: "
        "new pods bind here once the device plugin releases it"
    )


def _node(node: dict[str, Any], unit: str) -> tuple[list[str], list[_Row]]:
    """A node's header lines and its GPUs' rows."""
    status = "ready" if node.get("ready", True) else "NOT READY"
    if not node.get("known", True):
        status = "not listed by the API (known only from pods bound to it)"
    devices: list[dict[str, Any]] = [device for device in node.get("devices") or [] if isinstance(device, dict)]
    header = [
        f"{node.get('name', '?')}  {status}  {_whole(node.get('used'))}/{_whole(node.get('capacity'))} {unit} used  "
        + count(len(devices), "GPU")
    ]
    if node.get("problem"):
        header.append(f"  problem: {node['problem']}")
    if node.get("stray"):
        header.append(f"  {_whole(node['stray'])} {unit} held on GPUs this node no longer has")
    if isinstance(node.get("lock"), dict):
        header.append(_lock(node["lock"]))
    rows = []
    for device in devices:
        used, capacity = _whole(device.get("used")), _whole(device.get("capacity"))
        free = _whole(device["free"]) if "free" in device else max(0, capacity - used)
        holders = tuple(_holder(holder, unit) for holder in device.get("pods") or [] if isinstance(holder, dict))
        cells = (_gpu_cell(device), f"{used}/{capacity} {unit}", f"free {free}", bar(used, capacity))
        rows.append(_Row(cells + _tracked_cells(device), holders or ("-",)))
    return header, rows


def _lines(nodes: list[dict[str, Any]], unit: str) -> list[str]:
    """Every node's lines, the GPU columns aligned across all nodes, a blank line between nodes."""
    described = [_node(node, unit) for node in nodes]
    every_row = [row for _, rows in described for row in rows]
    columns = max((len(row.cells) for row in every_row), default=0)
    widths = [
        max((len(row.cells[column]) for row in every_row if column < len(row.cells)), default=0)
        for column in range(columns)
    ]
    lines: list[str] = []
    for header, rows in described:
        if lines:
            lines.append("")
        lines.extend(header)
        for row in rows:
            cells = row.cells + ("",) * (columns - len(row.cells))
            prefix = "  " + "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)) + "  "
            lines.append(prefix + row.holders[0])
            lines.extend(" " * len(prefix) + holder for holder in row.holders[1:])
    return lines


_QUOTA_UNITS = {"memory": "", "compute": " %", "gpus": ""}


def _quota_lines(quotas: list[dict[str, Any]], unit: str) -> list[str]:
    """Per quota its name, then per limit what it counts, `used/limit` and a bar; unread keys and a quota that
    cannot be read said in words."""
    rows: list[tuple[str, str, str, str]] = []
    notes: dict[int, list[str]] = {}
    for quota in quotas:
        name = f"{quota.get('namespace', '?')}/{quota.get('name', '?')}"
        limits = [limit for limit in quota.get("limits") or [] if isinstance(limit, dict)]
        first = len(rows)
        for limit in limits:
            resource = str(limit.get("resource", "?"))
            what = f"{resource} {limit['model']}" if limit.get("model") else resource
            used, amount = _whole(limit.get("used")), _whole(limit.get("limit"))
            units = f" {unit}" if resource == "memory" and unit else _QUOTA_UNITS.get(resource, "")
            rows.append((name if len(rows) == first else "", what, f"{used}/{amount}{units}", bar(used, amount)))
        if not limits:
            rows.append((name, "-", "", ""))
        problems = [f"cannot be read: {quota['broken']}"] if quota.get("broken") else []
        problems += [f"unread: {text}" for text in quota.get("unread") or []]
        notes[len(rows) - 1] = problems
    widths = [max((len(row[column]) for row in rows), default=0) for column in range(3)]
    lines = ["ResourceQuotas (what each namespace is given of each GPU limit):"]
    for number, row in enumerate(rows):
        cells = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
        lines.append(("  " + "  ".join([*cells, row[3]])).rstrip())
        lines.extend("    " + note for note in notes.get(number, ()))
    return lines


def _readiness(report: dict[str, Any]) -> str:
    """The replica's state in the words of its /readyz: a standby says it is not the leader, with a full cache."""
    if report.get("ready", True):
        return "extender ready"
    reason = report.get("why_not_ready")
    return str(reason) if reason else "extender NOT READY"  # a server older than `why_not_ready` says no more


def render_table(report: dict[str, Any]) -> str:
    """The report as text: per node a header line, per GPU a line with its pods and reservations."""
    unit = str(report.get("unit", ""))
    if "nodes" not in report:
        return "\n".join(_lines([report], unit)) + "\n"
    nodes: list[dict[str, Any]] = [node for node in report.get("nodes") or [] if isinstance(node, dict)]
    gpus = sum(len(node.get("devices") or []) for node in nodes)
    summary = (
        f"{count(len(nodes), 'node')}, {count(gpus, 'GPU')}, "
        f"{_whole(report.get('pods'))} pods in the cache, {_whole(report.get('reservations'))} reserved; "
        f"{_readiness(report)}"
    )
    quotas = [quota for quota in report.get("quotas") or [] if isinstance(quota, dict)]
    quota_lines = ["", *_quota_lines(quotas, unit)] if quotas else []
    if not nodes:
        return "\n".join([*quota_lines[1:], summary]) + "\n" if quotas else summary + "\n"
    return "\n".join([*_lines(nodes, unit), *quota_lines, "", summary]) + "\n"


def fetch_and_render(url: str, node: str, ca: str, cert: str, key: str, insecure: bool, as_json: bool) -> str:
    """What `extender inspect` prints: the table, or with `as_json` the report as indented JSON."""
    report = fetch(url, node, ca, cert, key, insecure)
    if as_json:
        return json.dumps(report, indent=2) + "\n"
    return render_table(report)
