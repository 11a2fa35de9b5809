"""The server's TLS context: HTTPS always unless explicitly turned off, mutual TLS when a client CA is given,
and new certificates picked up while serving.

With a client CA the handshake itself refuses callers without a certificate it signed, so no verb (and never
/bind) is served to an unauthenticated caller. ALPN offers only HTTP/1.1: kube-scheduler's Go client offers
h2 as well and falls back cleanly, which keeps our HTTP/1.1 server safe to talk to.

Rotation: a mounted Secret changes by an atomic swap of its `..data` symlink, which raises no file event on
the paths we were given, so `ReloadingContext` polls: it stats the files' resolved paths and, when one
changed, builds a whole new context from them. The listening socket keeps one context whose SNI callback
(called for every handshake, with or without SNI) hands the handshake the newest one: its certificate, its
client CA store and its ALPN; a connection already open keeps the certificate it was made with. A reload
that fails (a key that does not match its certificate, half-written files) must never replace a working
context: it is logged and retried at the next check. A resumed TLS session skips the client certificate
check, so once the client CA changed, sessions made before the change are refused (the client's next full
handshake is checked against the new CA).

No TLS 1.3 session tickets (`num_tickets = 0`): OpenSSL sends two after every TLS 1.3 handshake by default,
which cost a third of the server's CPU per handshake here (1.0 -> 0.7 ms, measured with in-memory BIOs and
`extender certs`' ECDSA certificates), and kube-scheduler's extender client keeps no session cache, so it
never resumes: every ticket would be made, sent and dropped. It opens a new connection when more than two
calls are in flight (`make bench-e2e`: about one per four pods), so that was CPU spent on the event loop, in
front of the next verb. TLS 1.2 clients can still resume (with the client CA check above).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from extender.core.errors import UserError

log = logging.getLogger(__name__)


class TLSConfigError(UserError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    context.num_tickets = 0  # TLS 1.3 session tickets: a third of a handshake's CPU, and our one client drops them
    for role, path in (("certificate", cert), ("key", key)):
        if not os.path.isfile(path):
            raise TLSConfigError(f"TLS {role} not found: {path}")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        raise TLSConfigError(f"cannot use certificate {cert} with key {key}: {error}") from None
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except FileNotFoundError:
            raise TLSConfigError(f"client CA not found: {client_ca}") from None
        except (ssl.SSLError, OSError) as error:
            raise TLSConfigError(f"cannot use client CA {client_ca}: {error}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


FileVersion = tuple[str, int, int, int, int] | tuple[str, str]
"""A file as last seen: its resolved path, device, inode, size and modification time; or the stat error."""


def _version(path: str) -> FileVersion:
    resolved = os.path.realpath(path)
    try:
        seen = os.stat(resolved)
    except OSError as error:
        return (resolved, error.strerror or str(error))
    return (resolved, seen.st_dev, seen.st_ino, seen.st_size, seen.st_mtime_ns)


def describe_certificate(path: str) -> str:
    """`CN=..., valid until ...` of the first certificate in a PEM file, for the log; never raises."""
    try:
        certificate = x509.load_pem_x509_certificates(Path(path).read_bytes())[0]
    except (OSError, ValueError) as error:
        return f"unreadable certificate {path}: {error}"
    until = certificate.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{certificate.subject.rfc4514_string()}, valid until {until}"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str = ""

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.cert, self.key, self.client_ca) if self.client_ca else (self.cert, self.key)

    def versions(self) -> tuple[FileVersion, ...]:
        return tuple(_version(path) for path in self.paths)


class ReloadingContext:
    """The server's TLS context, following its files. Mutable: `current` is replaced on each good reload.

    Give `listening` to the server socket; call `reload()` (or run `watch()`) to pick up changed files.
    """

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.files = TlsFiles(cert, key, client_ca)
        self._loaded = self.files.versions()
        self._failed: tuple[tuple[FileVersion, ...], str] | None = None
        self._client_ca = self._read_client_ca()
        self._client_ca_changed = 0.0
        """When a reload last brought a new client CA (Unix time); sessions from before it are not resumed."""
        self.current = self._build()
        """The context the next handshake gets."""
        self.listening = self._build()
        """The listening socket's context: its verify mode (client certificate required or not) holds for
        every handshake; its SNI callback swaps in `current` for the rest."""
        self.listening.sni_callback = self._choose

    def _build(self) -> ssl.SSLContext:
        """A context from the files' resolved paths, so that a swap between two reads fails to load (key and
        certificate from different versions) rather than mixing versions silently."""
        files = self.files
        client_ca = os.path.realpath(files.client_ca) if files.client_ca else ""
        return server_context(os.path.realpath(files.cert), os.path.realpath(files.key), client_ca)

    def _read_client_ca(self) -> bytes:
        try:
            return Path(self.files.client_ca).read_bytes() if self.files.client_ca else b""
        except OSError:
            return b"unreadable"

    def _choose(self, connection: ssl.SSLObject, server_name: str | None, listening: ssl.SSLContext) -> int | None:
        resumed = connection.session if connection.session_reused else None  # a new one cannot be read yet
        if resumed is not None and resumed.time <= self._client_ca_changed:  # in whole seconds: errs on refusing
            return ssl.ALERT_DESCRIPTION_ACCESS_DENIED
        connection.context = self.current
        return None

    def describe(self) -> str:
        return describe_certificate(self.files.cert)

    def reload(self) -> bool:
        """Load the files again if any changed since the last good load; True when new handshakes now get them.

        A failure keeps the current context and is logged once per version of the files (a warning), and the
        load is tried again at each call until it succeeds.
        """
        versions = self.files.versions()
        if versions == self._loaded:
            return False
        try:
            context = self._build()
        except TLSConfigError as error:
            failure = (versions, str(error))
            level = logging.DEBUG if failure == self._failed else logging.WARNING
            self._failed = failure
            log.log(level, "TLS files changed but cannot be used, still serving the previous certificate: %s", error)
            return False
        client_ca = self._read_client_ca()
        if client_ca != self._client_ca:  # by contents: a Secret's update moves every file to a new path
            self._client_ca, self._client_ca_changed = client_ca, time.time()
        self.current, self._loaded, self._failed = context, versions, None
        log.info("TLS files reloaded: new handshakes get %s", self.describe())
        return True

    async def watch(self, interval: float) -> None:
        """Check the files every `interval` seconds, forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload()
            except Exception:  # never let the checks stop: the current context keeps serving
                log.exception("checking the TLS files failed; trying again in %g s", interval)
