"""A Kubernetes scheduler extender for GPU sharing: several pods on one GPU, split by GPU memory."""

__version__ = "0.1.0"
