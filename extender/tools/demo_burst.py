"""The burst of `extender demo`: which GPU pods it asks the service to place, and each pod as the scheduler sends it.

It exists so the workload is one reproducible thing (the same seed gives the same pods) that the driver and
the tests share. Two bursts, one per device protocol: gpushare's asks GiB of GPU memory (`aliyun.com/gpu-mem`);
HAMi's mixes what HAMi's users ask (`nvidia.com/gpu`, `gpumem` MiB, `gpumem-percentage`, `gpucores`, pods
over several GPUs, `nvidia.com/use-gputype`), each pod as the API server stores it once HAMi's admission
webhook has passed it (which adds `gpucores: 100` to a pod asking whole GPUs). It is data only: it must never
talk to the service or read the cache.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from extender.core.objects import Raw
from extender.settings import Protocol

NAMESPACE = "demo"
SIZES: tuple[tuple[int, int], ...] = ((2, 18), (4, 18), (8, 18), (12, 12), (16, 12), (24, 8), (40, 4))
"""GiB asked on one GPU, and how often, relatively, pods of the burst ask it."""
SPLIT_SIZES = (16, 24, 40)
"""GiB per GPU of the pods that span two GPUs."""
NEVER_FITS = 96
"""GiB on one GPU: more than the largest GPU of the bundled cluster (80), so such a pod fits nowhere."""

HAMI_MEMORY: tuple[tuple[int, int], ...] = (
    (2048, 16), (4096, 18), (8192, 16), (12288, 10), (16384, 7), (24576, 3), (32768, 1),
)  # fmt: skip
"""MiB asked on each GPU (`nvidia.com/gpumem`), and how often, relatively."""
HAMI_CORES: tuple[tuple[int, int], ...] = ((0, 10), (10, 16), (20, 14), (30, 8), (50, 4))
"""% compute asked on each GPU (`nvidia.com/gpucores`; 0: none asked), and how often, relatively."""
HAMI_PERCENT = (10, 25, 50)
"""% of each GPU's memory asked by the pods that ask a share (`nvidia.com/gpumem-percentage`)."""
HAMI_TYPES = ("A100", "H100", "L4")
"""What the pods that choose a GPU model ask (`nvidia.com/use-gputype`: a substring of the model)."""
HAMI_TINY = (512, "T4")
"""MiB and model of the smallest pods (no compute asked): notebooks sharing the one T4, whose pod slots run out
before its memory does."""
HAMI_KINDS: tuple[tuple[str, int], ...] = (
    ("gpumem", 58), ("percentage", 12), ("typed", 14), ("whole", 5), ("tiny", 4),
)  # fmt: skip
"""How often, relatively, a one-GPU pod asks MiB, a share of memory, MiB on a chosen model, a whole GPU, or a
sliver of one."""
HAMI_SPLIT: tuple[tuple[int, int, int], ...] = ((2, 16384, 50), (2, 24576, 30), (4, 0, 100))
"""The pods over several GPUs: GPUs, MiB on each (0: whole GPUs), % compute on each."""
HAMI_NEVER_FITS = 98304
"""MiB on one GPU: more than the largest GPU of the bundled HAMi cluster (an H100: 81559), so it fits nowhere."""
WHOLE_GPU = 100


@dataclass(frozen=True, slots=True)
class BurstPod:
    """One pod of the burst: `memory` in total (GiB for gpushare, MiB for HAMi), over `gpus` GPUs; for HAMi
    also a share of each GPU's memory (`percent`, when `memory` is 0), compute on each, and a GPU model."""

    name: str
    uid: str
    memory: int
    gpus: int = 1
    percent: int = 0
    cores: int = 0
    gpu_type: str = ""
    protocol: Protocol = Protocol.GPUSHARE

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"

    @property
    def size(self) -> str:
        """What it asks, in a few characters (for HAMi, a fixed width: GPUs x memory on each, compute, model)."""
        if self.protocol is Protocol.HAMI:
            memory = f"{self.memory // self.gpus} MiB" if self.memory else f"{self.percent} % mem"
            return f"{self.gpus} x {memory:>9} {self.cores:>3} % {self.gpu_type:<4}"
        return f"{self.memory} GiB" if self.gpus == 1 else f"{self.gpus}x{self.memory // self.gpus} GiB"

    def memory_on(self, capacity: int) -> int:
        """HAMi: the memory it takes on one GPU of `capacity` (its MiB, or its share, rounded down as HAMi does)."""
        return self.memory // self.gpus if self.memory else capacity * self.percent // 100


def _specials(count: int, seed: int) -> tuple[random.Random, list[int], list[int]]:
    """The burst's random source for `seed`, and which pods (by number) ask more than any GPU has and which
    span several GPUs: none below four pods, else about one in 30 and one in 15."""
    rng = random.Random(seed)
    never = 0 if count < 4 else max(1, count // 30)
    split = 0 if count < 4 else max(1, count // 15)
    special = rng.sample(range(count), never + split)
    return rng, special[:never], special[never:]


def make_burst(count: int, seed: int) -> list[BurstPod]:
    """`count` pods of mixed sizes, the same for the same seed: mostly one GPU and (from four pods up) a few
    asking more than any GPU has, and one asking two GPUs, which gpushare's protocol refuses, saying why (its
    device plugin runs a pod on one GPU: docs/protocols/gpushare.md)."""
    rng, never, split = _specials(count, seed)
    split = split[:1]
    sizes, weights = zip(*SIZES, strict=True)
    pods = []
    for number in range(count):
        memory, gpus = rng.choices(sizes, weights)[0], 1
        if number in never:
            memory = NEVER_FITS
        elif number in split:
            gpus = 2
            memory = gpus * rng.choice(SPLIT_SIZES)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pods.append(BurstPod(f"burst-{number + 1:03d}", uid, memory, gpus))
    return pods


def make_hami_burst(count: int, seed: int) -> list[BurstPod]:
    """`count` HAMi pods, the same for the same seed: mostly one GPU (MiB, a share of its memory, MiB on a
    chosen model, or a whole GPU), and (from four pods up) a few over several GPUs and a few asking more memory
    than any GPU has."""
    rng, never, split = _specials(count, seed)
    kinds, kind_weights = zip(*HAMI_KINDS, strict=True)
    sizes, size_weights = zip(*HAMI_MEMORY, strict=True)
    shares, share_weights = zip(*HAMI_CORES, strict=True)
    pods = []
    for number in range(count):
        name, uid = f"burst-{number + 1:03d}", str(uuid.UUID(int=rng.getrandbits(128), version=4))
        cores = rng.choices(shares, share_weights)[0]
        if number in never:
            pod = BurstPod(name, uid, HAMI_NEVER_FITS, cores=cores, protocol=Protocol.HAMI)
        elif number in split:
            gpus, each, cores = rng.choice(HAMI_SPLIT)
            percent = 0 if each else 100  # whole GPUs: all of each one's memory
            pod = BurstPod(name, uid, gpus * each, gpus, percent=percent, cores=cores, protocol=Protocol.HAMI)
        else:
            kind = rng.choices(kinds, kind_weights)[0]
            memory = rng.choices(sizes, size_weights)[0]
            if kind == "percentage":  # with compute always: HAMi's webhook gives such a pod without it 100 %
                percent, cores = rng.choice(HAMI_PERCENT), cores or 10
                pod = BurstPod(name, uid, 0, percent=percent, cores=cores, protocol=Protocol.HAMI)
            elif kind == "whole":
                pod = BurstPod(name, uid, 0, percent=100, cores=WHOLE_GPU, protocol=Protocol.HAMI)
            elif kind == "tiny":
                pod = BurstPod(name, uid, HAMI_TINY[0], gpu_type=HAMI_TINY[1], protocol=Protocol.HAMI)
            else:
                model = rng.choice(HAMI_TYPES) if kind == "typed" else ""
                pod = BurstPod(name, uid, memory, cores=cores, gpu_type=model, protocol=Protocol.HAMI)
        pods.append(pod)
    return pods


def _limits(pod: BurstPod) -> dict[str, str]:
    if pod.protocol is not Protocol.HAMI:
        limits = {"aliyun.com/gpu-mem": str(pod.memory)}
        if pod.gpus > 1:
            limits["aliyun.com/gpu-count"] = str(pod.gpus)
        return limits
    limits = {"nvidia.com/gpu": str(pod.gpus)}
    if pod.memory:
        limits["nvidia.com/gpumem"] = str(pod.memory // pod.gpus)
    elif pod.percent < 100:
        limits["nvidia.com/gpumem-percentage"] = str(pod.percent)
    if pod.cores:
        limits["nvidia.com/gpucores"] = str(pod.cores)
    return limits


def pod_object(pod: BurstPod) -> Raw:
    """The pod as kube-scheduler sends it: a pending pod as the API server stores it, with the GPU limits (and,
    for HAMi, its GPU model choice as `nvidia.com/use-gputype`)."""
    limits = _limits(pod)
    token_volume = f"kube-api-access-{pod.uid[:5]}"
    metadata: Raw = {
        "name": pod.name,
        "namespace": NAMESPACE,
        "uid": pod.uid,
        "resourceVersion": "1",
        "creationTimestamp": "2026-11-20T09:00:00Z",
        "labels": {"app": "gpu-burst"},
        "managedFields": [
            {
                "manager": "kubectl-create",
                "operation": "Update",
                "apiVersion": "v1",
                "time": "2026-11-20T09:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:resources": {}}}}},
            }
        ],
    }
    if pod.gpu_type:
        metadata["annotations"] = {"nvidia.com/use-gputype": pod.gpu_type}
    return {
        "metadata": metadata,
        "spec": {
            "volumes": [
                {
                    "name": token_volume,
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/gpu-burst:latest",
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {
                            "name": token_volume,
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }
