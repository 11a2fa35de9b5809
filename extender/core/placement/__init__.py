"""Placement: which nodes take a pod, which of them it goes to, and which GPUs it gets there.

How a pod's placement is decided, step by step, and where each step lives:

1. **What the pod asks** (`config.py`): its GPU demand (read by the device protocol, `core/protocols/`), and
   the cpu and memory kube-scheduler counts for it (`Ask`). How to choose is the `PolicyConfig` the settings
   build: the policy (`Policy`), how the filter narrows (`Narrowing`), the fill strategies and weights.
2. **Does it fit on this node?** (`judge.py`): a verdict per node, with a reason a person can act on and its
   cause. A plain demand is judged from the node's summary the cache keeps; any other by the general fit
   (`fit.py`: containers placed in memory, compute and slots, HAMi's model).
3. **Over the names a filter sends** (`filtering.py`): the nodes that fit, at C speed where the cache's
   `FitIndex` answers, and the reasons of the others, summarised for kube-scheduler's message.
4. **Which of the nodes that fit** (`placer.py` dispatches to the policy, `PolicyRules`):
   - the fragmentation policy (`fragmentation.py`, the default) measures each node after placing the pod
     (`measure.py`: the GPU left unusable for the typical shapes, after the ATC'23 FGD paper) against what
     the cluster runs (`workload.py`, learned from the cache's pods by `learned.py`), and passes the best
     (`narrowing.py`);
   - the fill policy (`fill.py`) passes every node and scores them by binpack or spread.
5. **Which GPUs at bind** (`Placer.choose`): the same policy's choice on the node kube-scheduler picked; the
   ledger then reserves it (`core/ledger.py`, `core/binding.py`).

The verbs use `Placer` alone; quotas (`core/quota/`) ask it what a pod would be given. Nothing here does I/O or
changes the cache: `learned.py` only listens to it.
"""
