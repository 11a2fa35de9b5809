"""A device-plugin double's life on the node, as both real plugins live it: serve `v1beta1.DevicePlugin` on a unix
socket in kubelet's directory, register on `kubelet.sock`, and start over when kubelet does.

The cycle, common to gpushare-device-plugin (45fb8b88, `pkg/gpu/nvidia/gpumanager.go:60-108`, `server.go:105-240`)
and HAMi v2.10.0 (`cmd/device-plugin/nvidia/main.go:262-344`, `plugin/server.go:503-596`): remove a stale socket,
listen, serve, then `Registration.Register` (version v1beta1, the socket's name, the resource); on a creation of
`kubelet.sock` in the directory (kubelet restarted and wiped the directory's sockets) or SIGHUP, stop serving,
remove the socket and do it all again; on SIGTERM or SIGINT stop serving, remove the socket and exit. Where they
differ is what a failed start does: gpushare's exits (status 1 or 2, `gpumanager.go:70-77`), HAMi's retries after
30 s (`main.go:298-309`); each double says which (`retry_after`). kubelet, on Register, dials the socket and asks
GetDevicePluginOptions before it answers (pkg/kubelet/cm/devicemanager/manager.go:225-229 at v1.34.1), so the
server is up first, as in both. This module knows nothing of any protocol and never touches the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Protocol

import grpc

from devtools.deviceplugin import kubeletapi
from devtools.deviceplugin.kubeletapi import KUBELET_SOCKET, DevicePluginService, RegisterRequest
from devtools.deviceplugin.watch import SocketWatch

log = logging.getLogger("devtools.deviceplugin")


class NodeDouble(DevicePluginService, Protocol):
    """A protocol's double, as the runner drives it."""

    socket_name: str
    retry_after: float | None
    """Seconds before a failed start is tried again; None: the process exits."""

    def register_request(self) -> RegisterRequest: ...

    async def before_serving(self) -> None:
        """Each (re)start, before the socket is served (gpushare: read the node, patch aliyun.com/gpu-count)."""
        ...

    async def after_registering(self) -> None:
        """Each (re)start, once kubelet took the registration (HAMi: the registration loop on the Node)."""
        ...

    async def stopped(self) -> None:
        """Each stop: end what `after_registering` started."""
        ...


class Runner:
    """Serves one double in `socket_dir` until told to stop. Mutable: the server of the current cycle."""

    def __init__(self, double: NodeDouble, socket_dir: Path) -> None:
        self.double = double
        self.socket_dir = socket_dir
        self.socket = socket_dir / double.socket_name
        self.stop_requested = asyncio.Event()
        self.restart_requested = asyncio.Event()
        self.registered = asyncio.Event()
        """Set each time kubelet takes a registration (tests wait on it; cleared by whoever waits)."""
        self.registrations = 0
        self._server: grpc.aio.Server | None = None

    def handle_signals(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop_requested.set)
        loop.add_signal_handler(signal.SIGINT, self.stop_requested.set)
        loop.add_signal_handler(signal.SIGHUP, self.restart_requested.set)

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0) or a failed start of a plugin that exits on it (2)."""
        watch = SocketWatch(self.socket_dir, KUBELET_SOCKET)
        try:
            while True:
                started = await self._start()
                if not started and self.double.retry_after is None:
                    await self._stop()
                    return 2
                why = await self._wait(watch, None if started else self.double.retry_after)
                await self._stop()
                if why == "stop":
                    log.info("stopped: socket %s removed", self.socket)
                    return 0
                log.info("%s: restarting", why)
        finally:
            watch.close()

    async def _wait(self, watch: SocketWatch, timeout: float | None) -> str:
        waits = {
            "stop": asyncio.ensure_future(self.stop_requested.wait()),
            f"inotify: {self.socket_dir / KUBELET_SOCKET} created": asyncio.ensure_future(watch.created.wait()),
            "SIGHUP": asyncio.ensure_future(self.restart_requested.wait()),
        }
        try:
            done, _ = await asyncio.wait(waits.values(), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for future in waits.values():
                future.cancel()
        why = next((name for name, future in waits.items() if future in done), "retry after a failed start")
        if why != "stop":
            watch.created.clear()
            self.restart_requested.clear()
        return why

    async def _start(self) -> bool:
        try:
            await self.double.before_serving()
            self.socket.unlink(missing_ok=True)
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((kubeletapi.device_plugin_handler(self.double),))
            server.add_insecure_port(kubeletapi.unix_target(self.socket))
            await server.start()
            self._server = server
            log.info("serving %s on %s", self.double.register_request().resource_name, self.socket)
            request = self.double.register_request()
            await kubeletapi.register(self.socket_dir / KUBELET_SOCKET, request)
        except Exception as error:  # what both plugins log before they exit or retry
            log.error("could not start: %s", getattr(error, "details", lambda: None)() or error)
            return False
        self.registrations += 1
        log.info(
            "registered %s with kubelet (%s, options %s)", request.resource_name, request.endpoint, request.options
        )
        self.registered.set()
        await self.double.after_registering()
        return True

    async def _stop(self) -> None:
        await self.double.stopped()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
