"""A fake of kubelet's side of the device-plugin API, written with grpcio, for the doubles' tests.

What each part stands for (k8s.io/kubernetes v1.34.1, `dm/` = pkg/kubelet/cm/devicemanager/):
- **start**: kubelet's device manager removes every socket in its directory but its checkpoint, then listens on
  `kubelet.sock` (`dm/plugin/v1beta1/server.go:86-128`, `dm/manager.go:187-219`); `restart` is a kubelet restart,
  which a plugin sees as `kubelet.sock` created again;
- **Register** (`server.go:159-181`): the version must be v1beta1 and the resource an extended resource name
  (a domain-qualified name outside kubernetes.io); kubelet dials `<dir>/<endpoint>` (`client.go:66-77`, 10 s,
  blocking), asks GetDevicePluginOptions before it answers (`dm/manager.go:225-229`) and keeps those options, then
  streams ListAndWatch (`client.go:80-96`);
- **admit**: per container, the device IDs it hands over (`devicesToAllocate`, `dm/manager.go:567-690`, without
  NUMA alignment): when the plugin's options allow it and there is a choice, GetPreferredAllocation with the free
  healthy devices and the size (`:1006-1028`), its answer taken first, the rest filled from the free devices; then
  `Allocate` with one container request (`dm/endpoint.go:102-111`); an error fails the pod's admission.
It records every RegisterRequest, device list and call, so tests judge what the plugin sent. Test code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from devtools.deviceplugin import kubeletapi
from devtools.deviceplugin.kubeletapi import (
    DEVICE_PLUGIN,
    HEALTHY,
    KUBELET_SOCKET,
    AllocateError,
    ContainerAllocation,
    Device,
    Options,
    PreferredRequest,
    RegisterRequest,
)

CHECKPOINT = "kubelet_internal_checkpoint"


class Plugin:
    """One registered plugin as kubelet holds it: the connection, its options, its devices, what it was given."""

    def __init__(self, request: RegisterRequest, channel: grpc.aio.Channel, options: Options) -> None:
        self.request = request
        self.channel = channel
        self.options = options
        self.devices: list[Device] = []
        self.device_lists: list[list[Device]] = []
        self.listed = asyncio.Event()
        self.allocated: set[str] = set()
        self.preferred_calls: list[PreferredRequest] = []
        self.watch: asyncio.Task[None] | None = None

    def call(self, method: str) -> Any:
        return self.channel.unary_unary(
            f"/{DEVICE_PLUGIN}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=lambda raw: raw,
        )


class FakeKubelet:
    """kubelet's device manager in `socket_dir`. Mutable: its plugins, its registrations, its server."""

    def __init__(self, socket_dir: Path) -> None:
        self.socket_dir = socket_dir
        self.registrations: list[RegisterRequest] = []
        self.registered = asyncio.Event()
        """Set on every registration kubelet accepts; cleared by the test that waits for the next."""
        self.plugins: dict[str, Plugin] = {}
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        for path in self.socket_dir.iterdir():
            if path.name != CHECKPOINT and path.is_socket():
                path.unlink()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((kubeletapi.registration_handler(self._register),))
        server.add_insecure_port(kubeletapi.unix_target(self.socket_dir / KUBELET_SOCKET))
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for plugin in self.plugins.values():
            await self._disconnect(plugin)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            (self.socket_dir / KUBELET_SOCKET).unlink()

    async def restart(self) -> None:
        """kubelet restarting: its connections drop, the directory's sockets go, kubelet.sock comes back."""
        await self.stop()
        await self.start()

    async def _disconnect(self, plugin: Plugin) -> None:
        if plugin.watch is not None:
            plugin.watch.cancel()
            await asyncio.gather(plugin.watch, return_exceptions=True)
        await plugin.channel.close()

    async def _register(self, request: RegisterRequest) -> None:
        if request.version != kubeletapi.VERSION:
            raise AllocateError(f"requested device plugin version {request.version} is not supported")
        domain, _, name = request.resource_name.partition("/")
        if not name or "." not in domain or domain.endswith("kubernetes.io"):
            raise AllocateError(f"invalid name of device plugin socket: {request.resource_name}")
        channel = grpc.aio.insecure_channel(kubeletapi.unix_target(self.socket_dir / request.endpoint))
        try:
            await asyncio.wait_for(channel.channel_ready(), 10)
            plugin = Plugin(request, channel, Options())
            raw = await plugin.call("GetDevicePluginOptions")(kubeletapi.messages().Empty())
            plugin.options = kubeletapi.from_options(kubeletapi.messages().DevicePluginOptions.FromString(raw))
        except (TimeoutError, grpc.aio.AioRpcError) as error:
            await channel.close()
            raise AllocateError(f"failed to dial device plugin: {error}") from None
        old = self.plugins.pop(request.resource_name, None)
        if old is not None:
            await self._disconnect(old)
        self.plugins[request.resource_name] = plugin
        plugin.watch = asyncio.create_task(self._list_and_watch(plugin))
        self.registrations.append(request)
        self.registered.set()

    async def _list_and_watch(self, plugin: Plugin) -> None:
        pb = kubeletapi.messages()
        stream = plugin.channel.unary_stream(
            f"/{DEVICE_PLUGIN}/ListAndWatch",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ListAndWatchResponse.FromString,
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for answer in stream(pb.Empty()):
                plugin.devices = kubeletapi.from_devices(answer)
                plugin.device_lists.append(plugin.devices)
                plugin.listed.set()

    async def admit(self, resource: str, count: int) -> list[ContainerAllocation]:
        """One container asking `count` of `resource`: the devices chosen as kubelet chooses them, then Allocate.
        Raises grpc.aio.AioRpcError when the plugin fails the call (kubelet: UnexpectedAdmissionError)."""
        plugin = self.plugins[resource]
        free = [d.id for d in plugin.devices if d.health == HEALTHY and d.id not in plugin.allocated]
        if len(free) < count:
            raise AssertionError(f"requested number of devices unavailable for {resource}: {count} of {len(free)}")
        chosen: list[str] = []
        if plugin.options.get_preferred_allocation_available and len(free) > count:
            asked = PreferredRequest(tuple(free), (), count)
            plugin.preferred_calls.append(asked)
            raw = await plugin.call("GetPreferredAllocation")(kubeletapi.to_preferred_request([asked]))
            answer = kubeletapi.from_preferred(kubeletapi.messages().PreferredAllocationResponse.FromString(raw))
            if answer:
                chosen = [id_ for id_ in answer[0] if id_ in free][:count]
        chosen += [id_ for id_ in free if id_ not in chosen][: count - len(chosen)]
        plugin.allocated.update(chosen)
        return await self.allocate(resource, [chosen])

    async def allocate(self, resource: str, requests: list[list[str]]) -> list[ContainerAllocation]:
        raw = await self.plugins[resource].call("Allocate")(kubeletapi.to_allocate_request(requests))
        return kubeletapi.from_allocation(kubeletapi.messages().AllocateResponse.FromString(raw))
