"""The burst of `extender demo`: which GPU pods it asks the service to place, and each pod as the scheduler sends it.

It exists so the workload is one reproducible thing (the same seed gives the same pods) that the driver and
the tests share. It is data only: it must never talk to the service or read the cache.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from extender.core.objects import Raw

NAMESPACE = "demo"
SIZES: tuple[tuple[int, int], ...] = ((2, 18), (4, 18), (8, 18), (12, 12), (16, 12), (24, 8), (40, 4))
"""GiB asked on one GPU, and how often, relatively, pods of the burst ask it."""
SPLIT_SIZES = (16, 24, 40)
"""GiB per GPU of the pods that span two GPUs."""
NEVER_FITS = 96
"""GiB on one GPU: more than the largest GPU of the bundled cluster (80), so such a pod fits nowhere."""


@dataclass(frozen=True, slots=True)
class BurstPod:
    """One pod of the burst: `memory` GiB in total, over `gpus` GPUs."""

    name: str
    uid: str
    memory: int
    gpus: int = 1

    @property
    def key(self) -> str:
        return f"{NAMESPACE}/{self.name}"

    @property
    def size(self) -> str:
        return f"{self.memory} GiB" if self.gpus == 1 else f"{self.gpus}x{self.memory // self.gpus} GiB"


def make_burst(count: int, seed: int) -> list[BurstPod]:
    """`count` pods of mixed sizes, the same for the same seed: mostly one GPU, a few spanning two, and (from
    four pods up) a few asking more than any GPU has."""
    rng = random.Random(seed)
    never = 0 if count < 4 else max(1, count // 30)
    split = 0 if count < 4 else max(1, count // 15)
    special = rng.sample(range(count), never + split)
    sizes, weights = zip(*SIZES, strict=True)
    pods = []
    for number in range(count):
        memory, gpus = rng.choices(sizes, weights)[0], 1
        if number in special[:never]:
            memory = NEVER_FITS
        elif number in special[never:]:
            gpus = 2
            memory = gpus * rng.choice(SPLIT_SIZES)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        pods.append(BurstPod(f"burst-{number + 1:03d}", uid, memory, gpus))
    return pods


def pod_object(pod: BurstPod) -> Raw:
    """The pod as kube-scheduler sends it: a pending pod as the API server stores it, with the GPU limits."""
    limits = {"aliyun.com/gpu-mem": str(pod.memory)}
    if pod.gpus > 1:
        limits["aliyun.com/gpu-count"] = str(pod.gpus)
    token_volume = f"kube-api-access-{pod.uid[:5]}"
    return {
        "metadata": {
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
        },
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
