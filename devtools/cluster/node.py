"""Bring the one-node cluster up, and down, whole.

`up` makes the network (network.py) and the credentials (pki.py), then starts, each after the one before is up:
etcd, kube-apiserver (its /readyz), kube-controller-manager (the `default` ServiceAccount and `kube-root-ca.crt`
made), kube-scheduler (its /readyz), containerd (its socket answers; the images imported), kubelet (the Node
Ready), kube-proxy (its /healthz), CoreDNS (Available), cert-manager (its API check passed), and the
device-plugin double of the protocol asked for (the Node shows its resource). A part that does not come up stops
`up` with its log's tail; `down` then removes what was made.

`down` stops the containers (every process in kubelet's pod cgroups, then containerd's shims), the daemons newest
first, unmounts what kubelet and containerd mounted, removes kubelet's cgroups, the network namespace (with every
interface and iptables rule in it) and the cluster's directories. It works on a cluster half made, and on none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from devtools.cluster import addons, components, network, processes
from devtools.cluster.clients import admin_token, api_context, api_get, ctr
from devtools.cluster.layout import (
    API_PORT,
    CNI_BIN,
    CONTAINERD_SOCKET,
    DEVICE_PLUGIN_DIR,
    ETC_KUBERNETES,
    ETC_MARKER,
    KUBELET_ROOT,
    NODE_IP,
    NODE_NAME,
    Paths,
)
from devtools.cluster.pki import api_url, write_pki
from devtools.cluster.processes import ClusterError

CGROUP_ROOT = Path("/sys/fs/cgroup")
TOOLS = ("ip", "nsenter", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "conntrack")
"""From Debian's iproute2, util-linux, containerd, runc, iptables and conntrack packages."""
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")


def preflight(paths: Paths) -> None:
    """Fail before making anything when something `up` needs is missing, saying where it comes from."""
    problems = []
    if os.geteuid() != 0:
        problems.append("run as root: the cluster makes a network namespace, cgroups and mounts")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        problems.append(
            f"missing {', '.join(missing)}: apt-get install containerd runc containernetworking-plugins iptables "
            "conntrack iproute2 util-linux (make cluster does)"
        )
    if not (CNI_BIN / "bridge").exists():
        problems.append(f"no CNI plugins in {CNI_BIN}: apt-get install containernetworking-plugins")
    absent = [name for name in BINARIES if not os.access(paths.binaries / name, os.X_OK)]
    if absent:
        problems.append(f"{', '.join(absent)} missing from {paths.binaries}: run `bash tests/e2e/build.sh`")
    problems.extend(addons.missing_images())
    if problems:
        raise ClusterError("cannot bring the cluster up:\n- " + "\n- ".join(problems))


def is_up(paths: Paths) -> bool:
    """Every daemon `up` starts is running (the device plugin aside, which tests may stop and start)."""
    alive = {name for name in processes.running(paths) if processes.pid_of(paths, name) is not None}
    return {"etcd", "kube-apiserver", "containerd", "kubelet", "kube-proxy"} <= alive


def up(paths: Paths, protocol: str | None = "gpushare", gpus: Path | None = None) -> float:
    """Bring the cluster up (see the module's docstring); returns the seconds it took."""
    started = time.monotonic()
    preflight(paths)
    if network.exists() or paths.state.exists():
        raise ClusterError(f"a cluster is there already ({paths.state}): `make cluster-down` first")
    try:
        for folder in (paths.state, paths.run, paths.config):
            folder.mkdir(parents=True, exist_ok=True)
        network.create()
        write_pki(paths)
        _etc_kubernetes(paths)
        _control_plane(paths)
        _node(paths)
        addons.apply(paths)
        addons.install_cert_manager(paths)
        if protocol is not None:
            addons.start_device_plugin(paths, protocol, gpus)
    except BaseException:
        print(f"cluster: not up; logs in {paths.logs}; removing what was made (their logs are kept in /tmp)")
        with contextlib.suppress(Exception):
            keep = Path("/tmp/gpu-extender-cluster-logs")
            shutil.rmtree(keep, ignore_errors=True)
            shutil.copytree(paths.logs, keep)
        down(paths)
        raise
    return time.monotonic() - started


def _control_plane(paths: Paths) -> None:
    processes.start(paths, "etcd", components.etcd(paths))
    processes.start(paths, "kube-apiserver", components.apiserver(paths))
    token = {"Authorization": f"Bearer {admin_token(paths)}"}
    processes.wait_until(
        paths,
        "kube-apiserver",
        lambda: processes.https_ok(f"{api_url()}/readyz", api_context(paths), token),
        "ready (/readyz)",
    )
    processes.start_and_wait(
        paths,
        "kube-controller-manager",
        components.controller_manager(paths),
        lambda: (
            api_get(paths, "/api/v1/namespaces/default/configmaps/kube-root-ca.crt") is not None
            and api_get(paths, "/api/v1/namespaces/default/serviceaccounts/default") is not None
        ),
        "running (the default ServiceAccount and kube-root-ca.crt made)",
    )
    start_scheduler(paths)


def _etc_kubernetes(paths: Paths) -> None:
    """/etc/kubernetes/scheduler.conf, the scheduler's kubeconfig where kubeadm keeps it, when the machine has no
    /etc/kubernetes of its own (then `down` removes the folder)."""
    if ETC_KUBERNETES.exists() and not ETC_MARKER.exists():
        return
    ETC_KUBERNETES.mkdir(mode=0o755, exist_ok=True)
    ETC_MARKER.write_text("made by devtools/cluster; removed by `make cluster-down`\n")
    shutil.copyfile(paths.kubeconfig("scheduler"), ETC_KUBERNETES / "scheduler.conf")
    (ETC_KUBERNETES / "scheduler.conf").chmod(0o600)


def start_scheduler(paths: Paths, config: Path | None = None) -> None:
    """(Re)start the cluster's default scheduler, with `config` if given (what wiring (b)'s edit of the static
    pod does: the kubelet restarts the scheduler with the new flag, mounts and DNS policy)."""
    processes.stop(paths, "kube-scheduler")
    processes.start_and_wait(
        paths,
        "kube-scheduler",
        components.scheduler(paths, config),
        lambda: processes.https_ok(f"https://{NODE_IP}:10259/readyz", processes.unverified()),
        "ready (/readyz)",
    )


def _node(paths: Paths) -> None:
    processes.start_and_wait(
        paths,
        "containerd",
        components.containerd(paths),
        lambda: CONTAINERD_SOCKET.exists() and ctr(["version"], check=False).returncode == 0,
        "serving on its socket",
    )
    addons.import_images(paths)
    start_kubelet(paths)
    processes.start_and_wait(
        paths,
        "kube-proxy",
        components.proxy(paths),
        lambda: processes.https_ok(f"http://{NODE_IP}:10256/healthz", processes.unverified()),
        "healthy (its rules synced, /healthz)",
    )


def start_kubelet(paths: Paths) -> None:
    """(Re)start kubelet and wait until the Node is Ready: what `up` does, and what a kubelet restart does."""
    processes.stop(paths, "kubelet")
    processes.start_and_wait(
        paths, "kubelet", components.kubelet(paths), lambda: node_ready(paths), f"Ready (the Node {NODE_NAME})",
        timeout=120,
    )  # fmt: skip


def node_ready(paths: Paths) -> bool:
    node = api_get(paths, f"/api/v1/nodes/{NODE_NAME}")
    if node is None:
        return False
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


# ---- down --------------------------------------------------------------------------------------------------


def down(paths: Paths) -> None:
    """Remove the cluster whole (see the module's docstring): containers, daemons, mounts, cgroups, network, files."""
    processes.stop(paths, "device-plugin")
    _kill_containers()
    for name in reversed(processes.running(paths)):
        processes.stop(paths, name)
    processes.kill_all(_shims())
    processes.kill_all(network.pids_inside())
    _unmount_under((KUBELET_ROOT, paths.run, paths.state))
    _remove_cgroups()
    network.delete()
    for folder in (paths.state, paths.run, KUBELET_ROOT):
        shutil.rmtree(folder, ignore_errors=True)
    if ETC_MARKER.exists():
        shutil.rmtree(ETC_KUBERNETES, ignore_errors=True)


def _pod_cgroups() -> list[Path]:
    """kubelet's pod cgroups in every v1 controller, leaves last; cgroups that vanish while walked are skipped
    (containers exit while `down` runs: a glob would fail on them)."""
    found = []
    for controller in CGROUP_ROOT.iterdir():
        for folder, _, _ in os.walk(controller / "kubepods", onerror=lambda _error: None):
            found.append(Path(folder))
    return found


def _kill_containers() -> None:
    """SIGKILL every process in kubelet's pod cgroups (the containers and their sandboxes), then the shims."""
    for cgroup in _pod_cgroups():
        with contextlib.suppress(OSError):
            processes.kill_all([int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()])
    processes.kill_all(_shims())


def _shims() -> list[int]:
    """containerd-shim processes serving this cluster's containerd (its socket on their command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv and b"containerd-shim" in argv[0] and str(CONTAINERD_SOCKET).encode() in argv:
                found.append(int(entry.name))
    return found


def _unmount_under(roots: Sequence[Path]) -> None:
    """Unmount, deepest first, every mount point under `roots` (kubelet's volumes, containerd's rootfs and pods'
    network namespaces); lazily when a mount is still busy."""
    prefixes = [str(root).rstrip("/") + "/" for root in roots]
    mounts = []
    with open("/proc/self/mounts") as table:
        for line in table:
            point = line.split()[1].replace("\\040", " ")
            if any(point.startswith(prefix) or point + "/" == prefix for prefix in prefixes):
                mounts.append(point)
    for point in sorted(set(mounts), key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _remove_cgroups() -> None:
    """kubelet's `kubepods` hierarchy in every cgroup v1 controller, leaves first (a cgroup goes when empty)."""
    for folder in sorted(_pod_cgroups(), key=lambda path: len(path.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()


def status(paths: Paths) -> list[str]:
    """One line per daemon (running or not), and the Node's readiness."""
    lines = []
    for name in processes.running(paths):
        pid = processes.pid_of(paths, name)
        lines.append(f"{name:<24} {'running, pid ' + str(pid) if pid else 'NOT RUNNING'}")
    if lines:
        lines.append(f"{'node ' + NODE_NAME:<24} {'Ready' if node_ready(paths) else 'NOT READY'}")
        lines.append(f"{'API server':<24} {api_url()} (port {API_PORT}; devices: {DEVICE_PLUGIN_DIR})")
    return lines
