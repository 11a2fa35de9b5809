"""The server's TLS context: HTTPS always unless explicitly turned off, mutual TLS when a client CA is given.

With a client CA the handshake itself refuses callers without a certificate it signed, so no verb (and never
/bind) is served to an unauthenticated caller. ALPN offers only HTTP/1.1: kube-scheduler's Go client offers
h2 as well and falls back cleanly, which keeps aiohttp (HTTP/1.1 only) safe to talk to.
"""

from __future__ import annotations

import os
import ssl


class TLSConfigError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file."""


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
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
