"""What feeds the cache: a file of Kubernetes objects (`file.py`) or, later, the API server (`kube/`)."""
