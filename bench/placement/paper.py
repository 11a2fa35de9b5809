"""The paper's own figures, which ours are read beside: "Beware of Fragmentation" (Weng et al., ATC'23), its
simulator's GPU allocated at 130 % of the capacity arrived, the mean of seeds 42-51, per workload and policy, as
its repository publishes them (hkust-adsl/kubernetes-scheduler-simulator,
experiments/analysis/expected_results/analysis_allo_discrete.csv). Cited, not measured here: the pages say so.
"""

from __future__ import annotations

PAPER: dict[str, dict[str, float]] = {
    "default": {
        "Random": 87.5,
        "DotProd": 90.8,
        "GpuClustering": 91.9,
        "GpuPacking": 92.0,
        "BestFit": 93.1,
        "FGD": 95.4,
    },
    "gpushare100": {
        "Random": 79.4,
        "DotProd": 82.4,
        "GpuClustering": 82.6,
        "GpuPacking": 82.6,
        "BestFit": 85.0,
        "FGD": 86.9,
    },
}
