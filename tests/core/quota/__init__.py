"""The quota package's tests, and the quota resources they share."""

from extender.core.protocols import QuotaResources
from tests.builders import PROFILE

HAMI = QuotaResources(memory="nvidia.com/gpumem", gpus="nvidia.com/gpu", cores="nvidia.com/gpucores")
HAMI_GIB = QuotaResources(
    memory="nvidia.com/gpumem", gpus="nvidia.com/gpu", cores="nvidia.com/gpucores", memory_factor=1024
)
GPUSHARE = PROFILE.quota_resources
