"""Quotas on what pods are given: the GPU keys of ResourceQuotas, per namespace and per GPU model, counted on
the allocations the cache holds.

Why. Kubernetes' own ResourceQuota counts what a pod's spec asks, at admission: a HAMi pod asking a percentage
of a GPU's memory, or a whole card without naming memory, counts nothing, and no native quota knows GPU models.
hami-scheduler enforces its own keys instead, on the memory and compute each container is given (HAMi v2.10.0,
`pkg/device/quota.go`, and the nvidia device's `fitQuota`, `pkg/device/nvidia/device.go:666-692`). This module
reads the same keys with HAMi's rules, the same rule for gpushare's resources, and keys of our own for one GPU
model (`docs/operations/quotas.md`):

- `limits.<memory>` (HAMi `nvidia.com/gpumem`, gpushare `aliyun.com/gpu-mem`): GPU memory given, in the
  protocol's unit; HAMi's quota is in units of its memory factor (`quota.go:81-83`).
- `limits.<cores>` (HAMi `nvidia.com/gpucores`): compute given, in % of a GPU.
- `limits.<gpus>` (HAMi `nvidia.com/gpu`, gpushare `aliyun.com/gpu-count`): GPUs the pod is given any share
  of. HAMi does not read this key; nothing else enforces it.
- `limits.<resource>.<model>`: the same, counting only GPUs of that model. A model is matched by its words
  (split at `-`, `_`, `.`, `/` and spaces, any case): every word of the key's model, in order, must be a word of
  the GPU's model, so `A100` and `A100-40GB` are GPUs of `NVIDIA A100-SXM4-40GB`, while `A10` is not (HAMi's
  `use-gputype` matches substrings, for which `A10` would be an A100).

What is counted is what pods hold: every allocation in the cache (observed, bound, reserved or uncertain),
collapsed over init containers as HAMi counts it (`holds.Allocation.uses`, HAMi `quota.go:97-117` over
`CollapseInitContainerUsage`). A pod is refused when what its namespace holds plus what the pod would be given
exceeds the limit (`quota.go:84,90`): a limit of 0 refuses every pod that takes any of it; a limit without a
model applies to every GPU pod of its namespace, so one over it (a quota lowered) refuses even a pod taking
none of it, as HAMi does; a limit for a model only pods given GPUs of that model. A quantity that is not a whole
number within int64 leaves that key unread, as HAMi's `AsInt64` does (`quota.go:244-245`); keys other than
`limits.` ones are not ours (`quota.go:291`). Unlike HAMi, which keeps one limit per namespace and key (the
last quota written wins, and deleting any quota unsets it: `quota.go:242-286`), every ResourceQuota counts
on its own, as Kubernetes counts them. Scopes (`spec.scopes`, `scopeSelector`) are not read: every quota
applies to every pod of its namespace, as in HAMi.

Bounded: at most `MAX_LIMITS` GPU keys per ResourceQuota and `MAX_NAMESPACE_LIMITS` per namespace (beyond,
the quota cannot be read and refuses every GPU pod of its namespace, saying so: failing open would let a
namespace use what it was denied); each key and its model are of bounded length; usage is kept per namespace
and model, never per request.

The package, by concept: `limits.py` reads a ResourceQuota's GPU keys; `charges.py` says what an allocation
gives, per GPU model, as a quota counts it; `book.py` keeps the quotas and what each namespace holds, following
the cache's holds (it listens to the cache), and says why a pod may not be given more; `admission.py` is where
quotas meet placement: the filter's refusals, asking the placement what a pod would be given on each node. The
ledger checks every reservation against the book before recording it. Nothing here does I/O.
"""
