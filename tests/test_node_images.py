"""image/node-images.sh without building anything: the images it names are the ones the manifests run, and the workload
image's `nvidia-smi` prints what tests/node reads from the pod's log. What it does without root, or with an action it
does not know, is image/lib.sh's (tests/test_image_lib.py). The builds themselves run on a root machine with buildah
(the script checks each image as it makes it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "image" / "node-images.sh"
TEXT = SCRIPT.read_text()


def k8s_version() -> str:
    match = re.search(r"k8s\.io/kubernetes (v\d+\.\d+\.\d+)", (ROOT / "tests" / "e2e" / "k8s" / "go.mod").read_text())
    assert match
    return match.group(1)


def images_of(manifest: Path) -> list[str]:
    return [
        container["image"]
        for document in yaml.safe_load_all(manifest.read_text())
        if document and document.get("kind") == "Deployment"
        for container in document["spec"]["template"]["spec"]["containers"]
    ]


def test_extender_image_is_the_one_the_deployment_runs() -> None:
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version
    assert 'extender_image="ghcr.io/gpu-extender/gpu-extender:$extender_version"' in TEXT
    assert images_of(ROOT / "manifests" / "base" / "deployment.yaml") == [
        f"ghcr.io/gpu-extender/gpu-extender:{version.group(1)}"
    ]


def test_kube_scheduler_image_is_the_release_the_e2e_tier_builds() -> None:
    assert 'image="registry.k8s.io/kube-scheduler:$k8s_version"' in TEXT
    assert images_of(ROOT / "manifests" / "second-scheduler" / "deployment.yaml") == [
        f"registry.k8s.io/kube-scheduler:{k8s_version()}"
    ]


def nvidia_smi() -> str:
    match = re.search(r"nvidia-smi\" <<'EOF'\n(.*?)\nEOF\n", TEXT, re.S)
    assert match, "no nvidia-smi here-document in node-images.sh"
    return match.group(1)


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_nvidia_smi_prints_the_gpu_environment_and_says_what_it_is(tmp_path: Path) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(nvidia_smi() + "\n")
    environment = {
        "PATH": os.environ["PATH"],
        "NVIDIA_VISIBLE_DEVICES": "GPU-1",
        "ALIYUN_COM_GPU_MEM_IDX": "1",
        "ALIYUN_COM_GPU_MEM_POD": "4",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m",
        "HAMI_VGPU_UUID": "x",
        "UNRELATED": "1",
    }
    output = subprocess.run(["sh", str(script)], env=environment, capture_output=True, text=True, check=True).stdout
    lines = output.splitlines()
    assert "not NVIDIA's" in lines[0]
    # What tests/node reads from the pod's log: NAME=value lines, the header not among them.
    found = re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", output, re.M)
    assert found == sorted((name, value) for name, value in environment.items() if name not in ("PATH", "UNRELATED"))

    bare = subprocess.run(["sh", str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert bare.returncode == 0
    assert re.findall(r"^([A-Z][A-Z0-9_]*)=", bare.stdout, re.M) == []
    assert "none" in bare.stdout
