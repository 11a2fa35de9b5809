"""kubelet's device-plugin API v1beta1 for the device-plugin doubles: the messages generated at first use from the
proto of the kubelet under test, and a small typed boundary over them.

Why generated here: the proto is kubelet's (`k8s.io/kubelet@v0.34.1`, `pkg/apis/deviceplugin/v1beta1/api.proto`,
in the Go module cache that `tests/e2e/build.sh` fills), so the doubles speak exactly the wire format of the kubelet
they are run against, and no copy of it or of code generated from it is committed. At first use, grpcio-tools'
protoc compiles it into `${GPU_EXTENDER_CACHE:-~/.cache/gpu-extender}/deviceplugin-api-<hash>/`, the hash covering
the proto's text and the protoc and protobuf versions; the directory is written beside and renamed into place, so
two processes starting at once never see half of it.

The gogo import: older releases of this proto import `github.com/gogo/protobuf/gogoproto/gogo.proto` and set
`(gogoproto.*)` options, which only tune the Go code generated and change nothing on the wire. v0.34.1's has none;
should a proto carry them, the import line and every bracketed `(gogoproto.…)` option are stripped before protoc
runs (`_without_gogo`), so no gogo.proto is needed.

Only the messages are generated (`--python_out`); the two services are wired by hand with grpc's generic handlers
under their full names (`/v1beta1.Registration/Register`, `/v1beta1.DevicePlugin/Allocate`, ...), which is what a
generated `_pb2_grpc` module would do, so the untyped generated code stays behind this module: callers see the
dataclasses below. It must never import `extender`: the doubles are the node's side, written independently.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn, Protocol

import grpc

KUBELET_MODULE = "k8s.io/kubelet@v0.34.1"
"""The kubelet whose API the doubles speak: the release the e2e tier and the node are built from."""
PROTO = "pkg/apis/deviceplugin/v1beta1/api.proto"
VERSION = "v1beta1"
"""RegisterRequest.version (`pluginapi.Version`)."""
DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
"""`pluginapi.DevicePluginPath`."""
KUBELET_SOCKET = "kubelet.sock"
"""kubelet's Registration socket in that directory (`pluginapi.KubeletSocket`)."""
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
MODULE_NAME = "kubelet_deviceplugin_v1beta1_pb2"
"""The generated module's name: distinct, so it never shadows another `api_pb2`."""
DEVICE_PLUGIN = "v1beta1.DevicePlugin"
REGISTRATION = "v1beta1.Registration"
GOGO_IMPORT = re.compile(r'^\s*import\s+"github\.com/gogo/protobuf/gogoproto/gogo\.proto";\s*$', re.M)
GOGO_OPTION = re.compile(r"\s*\[\s*\(gogoproto\.[^\]]*\]|^\s*option\s+\(gogoproto\.[^;]*;\s*$", re.M)


class ApiUnavailable(Exception):
    """The proto cannot be found or compiled; the message says how to get it."""


def cache_root() -> Path:
    return Path(os.environ.get("GPU_EXTENDER_CACHE") or Path.home() / ".cache" / "gpu-extender")


def proto_path() -> Path:
    """kubelet's api.proto in the Go module cache (`go env GOMODCACHE`, else $GOMODCACHE, else ~/go/pkg/mod)."""
    roots = []
    if shutil.which("go"):
        found = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout.strip()
        roots.append(found)
    roots += [os.environ.get("GOMODCACHE", ""), str(Path.home() / "go" / "pkg" / "mod")]
    for root in filter(None, roots):
        candidate = Path(root) / KUBELET_MODULE / PROTO
        if candidate.is_file():
            return candidate
    raise ApiUnavailable(
        f"{KUBELET_MODULE}/{PROTO} is not in the Go module cache: "
        "run `cd tests/e2e/k8s && go mod download k8s.io/kubelet`"
    )


def _without_gogo(text: str) -> str:
    return GOGO_OPTION.sub("", GOGO_IMPORT.sub("", text))


def generate(proto: Path, cache: Path) -> Path:
    """The directory holding `<MODULE_NAME>.py` compiled from `proto`, made on first use."""
    protoc: Any = importlib.import_module("grpc_tools.protoc")  # untyped, and only needed to compile

    text = _without_gogo(proto.read_text())
    versions = f"{importlib.metadata.version('grpcio-tools')}/{importlib.metadata.version('protobuf')}"
    digest = hashlib.sha256(f"{versions}\n{text}".encode()).hexdigest()[:16]
    target = cache / f"deviceplugin-api-{digest}"
    if (target / f"{MODULE_NAME}.py").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".deviceplugin-api-") as work:
        source = Path(work) / f"{MODULE_NAME.removesuffix('_pb2')}.proto"
        source.write_text(text)
        out = Path(work) / "out"
        out.mkdir()
        includes = Path(protoc.__file__).parent / "_proto"
        code = protoc.main(["protoc", f"-I{work}", f"-I{includes}", f"--python_out={out}", str(source)])
        if code != 0:
            raise ApiUnavailable(f"protoc failed ({code}) on {proto}")
        try:
            out.rename(target)
        except OSError:  # another process made it first
            if not (target / f"{MODULE_NAME}.py").is_file():
                raise
    return target


@functools.cache
def messages() -> ModuleType:
    """The generated message classes (untyped: use the dataclasses and converters below)."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    folder = generate(proto_path(), cache_root())
    spec = importlib.util.spec_from_file_location(MODULE_NAME, folder / f"{MODULE_NAME}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


# ---- the typed side ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    """DevicePluginOptions."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    version: str
    endpoint: str
    """The plugin's socket name in kubelet's directory."""
    resource_name: str
    options: Options | None = None
    """None: the request carries no options field (what gpushare's plugin sends)."""


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    health: str = HEALTHY
    numa_nodes: tuple[int, ...] = ()
    """TopologyInfo's NUMA nodes; () sends no topology."""


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """ContainerAllocateResponse."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """ContainerPreferredAllocationRequest."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


class AllocateError(Exception):
    """An RPC the plugin fails: kubelet sees `code` and `message` (an Allocate failure fails the pod's admission,
    UnexpectedAdmissionError)."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class DevicePluginService(Protocol):
    """What a double serves as `v1beta1.DevicePlugin`."""

    def options(self) -> Options: ...

    def list_and_watch(self) -> AsyncIterator[list[Device]]: ...

    async def allocate(self, requests: list[list[str]]) -> list[ContainerAllocation]: ...

    async def preferred(self, requests: list[PreferredRequest]) -> list[list[str]]:
        """Raise AllocateError(UNIMPLEMENTED) where the real plugin has no GetPreferredAllocation."""
        ...


def to_register(request: RegisterRequest) -> Any:
    pb = messages()
    message = pb.RegisterRequest(
        version=request.version, endpoint=request.endpoint, resource_name=request.resource_name
    )
    if request.options is not None:
        message.options.CopyFrom(to_options(request.options))
    return message


def from_register(message: Any) -> RegisterRequest:
    options = from_options(message.options) if message.HasField("options") else None
    return RegisterRequest(str(message.version), str(message.endpoint), str(message.resource_name), options)


def to_options(options: Options) -> Any:
    return messages().DevicePluginOptions(
        pre_start_required=options.pre_start_required,
        get_preferred_allocation_available=options.get_preferred_allocation_available,
    )


def from_options(message: Any) -> Options:
    return Options(bool(message.pre_start_required), bool(message.get_preferred_allocation_available))


def to_devices(devices: Sequence[Device]) -> Any:
    pb = messages()
    listed = []
    for device in devices:
        message = pb.Device(ID=device.id, health=device.health)
        if device.numa_nodes:
            message.topology.nodes.extend(pb.NUMANode(ID=node) for node in device.numa_nodes)
        listed.append(message)
    return pb.ListAndWatchResponse(devices=listed)


def from_devices(message: Any) -> list[Device]:
    return [
        Device(str(d.ID), str(d.health), tuple(int(n.ID) for n in d.topology.nodes) if d.HasField("topology") else ())
        for d in message.devices
    ]


def to_allocation(allocations: Sequence[ContainerAllocation]) -> Any:
    pb = messages()
    answer = pb.AllocateResponse()
    for allocation in allocations:
        container = answer.container_responses.add()
        container.envs.update(allocation.envs)
        container.annotations.update(allocation.annotations)
        for mount in allocation.mounts:
            container.mounts.add(
                container_path=mount.container_path, host_path=mount.host_path, read_only=mount.read_only
            )
    return answer


def from_allocation(message: Any) -> list[ContainerAllocation]:
    answers = []
    for c in message.container_responses:
        mounts = tuple(Mount(m.container_path, m.host_path, m.read_only) for m in c.mounts)
        answers.append(ContainerAllocation(dict(c.envs), mounts, dict(c.annotations)))
    return answers


def to_allocate_request(requests: Sequence[Sequence[str]]) -> Any:
    pb = messages()
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(r)) for r in requests])


def to_preferred_request(requests: Sequence[PreferredRequest]) -> Any:
    pb = messages()
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=list(r.available),
                must_include_deviceIDs=list(r.must_include),
                allocation_size=r.size,
            )
            for r in requests
        ]
    )


def from_preferred(message: Any) -> list[list[str]]:
    return [list(response.deviceIDs) for response in message.container_responses]


# ---- serving ------------------------------------------------------------------------------------------------


async def _fail(context: grpc.aio.ServicerContext[Any, Any], error: AllocateError) -> NoReturn:
    await context.abort(error.code, error.message)


def device_plugin_handler(service: DevicePluginService) -> grpc.GenericRpcHandler:
    """`v1beta1.DevicePlugin` served by `service` (PreStartContainer answers empty: neither plugin needs it)."""
    pb = messages()

    async def options(_: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return to_options(service.options())

    async def list_and_watch(_: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        async for devices in service.list_and_watch():
            yield to_devices(devices)

    async def allocate(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            answer = await service.allocate([list(r.devices_ids) for r in request.container_requests])
        except AllocateError as error:
            await _fail(context, error)
        return to_allocation(answer)

    async def preferred(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        asked = [
            PreferredRequest(tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs), int(r.allocation_size))
            for r in request.container_requests
        ]
        try:
            chosen = await service.preferred(asked)
        except AllocateError as error:
            await _fail(context, error)
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids) for ids in chosen]
        )

    async def pre_start(_: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return pb.PreStartContainerResponse()

    def unary(behaviour: Callable[..., Awaitable[Any]], request: Any) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=request.FromString, response_serializer=lambda m: m.SerializeToString()
        )

    return grpc.method_handlers_generic_handler(
        DEVICE_PLUGIN,
        {
            "GetDevicePluginOptions": unary(options, pb.Empty),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                list_and_watch,
                request_deserializer=pb.Empty.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            ),
            "Allocate": unary(allocate, pb.AllocateRequest),
            "GetPreferredAllocation": unary(preferred, pb.PreferredAllocationRequest),
            "PreStartContainer": unary(pre_start, pb.PreStartContainerRequest),
        },
    )


def registration_handler(register: Callable[[RegisterRequest], Awaitable[None]]) -> grpc.GenericRpcHandler:
    """`v1beta1.Registration` (kubelet's side, for fakes of kubelet): `register` raises AllocateError to refuse."""
    pb = messages()

    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            await register(from_register(request))
        except AllocateError as error:
            await _fail(context, error)
        return pb.Empty()

    method: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=pb.RegisterRequest.FromString, response_serializer=lambda m: m.SerializeToString()
    )
    return grpc.method_handlers_generic_handler(REGISTRATION, {"Register": method})


def unix_target(path: Path) -> str:
    return f"unix://{path.resolve()}" if not path.is_absolute() else f"unix://{path}"


async def register(kubelet_socket: Path, request: RegisterRequest, timeout: float = 5.0) -> None:
    """Registration.Register on kubelet's socket, dialled with a `timeout` as both plugins dial it (5 s, blocking);
    raises grpc.aio.AioRpcError when kubelet refuses or is not there."""
    pb = messages()
    async with grpc.aio.insecure_channel(unix_target(kubelet_socket)) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[Any, Any] = channel.unary_unary(
            f"/{REGISTRATION}/Register",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.Empty.FromString,
        )
        await call(to_register(request), timeout=timeout, wait_for_ready=True)
