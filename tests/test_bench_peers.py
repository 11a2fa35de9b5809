"""`bench/placement/peers.py`: the schedulers users run today, built from a source directory the user gives and
run through the real replay in place of ours. Nothing here builds Go: `build` is checked up to the point where it
would run `go build`, and with a binary already in its cache; the wiring is checked as text against gpushare's
own `config/scheduler-policy-config.yaml`. A real run (`make bench-placement ... PLACEMENT_ARGS='--peer
gpushare=DIR'`) is what exercises the rest."""

from __future__ import annotations

import io
import os
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from bench.placement import __main__ as cli
from bench.placement import peers
from bench.placement.peers import GPUSHARE, GpushareProcess, PeerError


def gpushare_tree(root: Path, module: str = GPUSHARE.module) -> Path:
    """A directory laid out as gpushare's source is (go.mod, go.sum, cmd/main.go, a vendored and a test file)."""
    (root / "cmd").mkdir(parents=True)
    (root / "vendor" / "x").mkdir(parents=True)
    (root / "go.mod").write_text(f"module {module}\n\ngo 1.19\n")
    (root / "go.sum").write_text("")
    (root / "cmd" / "main.go").write_text("package main\n\nfunc main() {}\n")
    (root / "cmd" / "main_test.go").write_text("package main\n")
    (root / "vendor" / "x" / "x.go").write_text("package x\n")
    return root


def test_peer_flags_name_a_known_peer_and_a_directory() -> None:
    assert peers.parse(["gpushare=~/src/gpushare"]) == {"gpushare": Path.home() / "src" / "gpushare"}
    assert peers.parse(["hami=/src/HAMi"]) == {"hami": Path("/src/HAMi")}
    for bad in ("gpushare", "gpushare=", "volcano=/src", "=/src"):
        with pytest.raises(ValueError, match="NAME=DIR"):
            peers.parse([bad])


def test_a_peer_runs_in_the_real_modes_as_one_more_policy(capsys: pytest.CaptureFixture[str]) -> None:
    parsed = cli.arguments(["--synthetic", "--mode", "real", "--policies", "shipped", "--peer", "gpushare=/src"])
    assert parsed.policy_list == ["shipped", "gpushare"]
    assert parsed.peers == {"gpushare": Path("/src")}
    alone = cli.arguments(["--synthetic", "--mode", "real", "--policies=", "--peer", "gpushare=/src"])
    assert alone.policy_list == ["gpushare"]
    with pytest.raises(SystemExit):
        cli.arguments(["--synthetic", "--mode", "real", "--policies="])
    with pytest.raises(SystemExit):
        cli.arguments(["--synthetic", "--mode", "fast", "--peer", "gpushare=/src"])
    assert "real modes" in capsys.readouterr().err


def test_a_hami_peer_makes_the_run_speak_hamis_protocol_and_does_not_mix_with_gpushares(
    capsys: pytest.CaptureFixture[str],
) -> None:
    real = ["--synthetic", "--mode", "real"]
    assert cli.arguments(real).protocol == "gpushare"
    assert cli.arguments([*real, "--peer", "hami=/src"]).protocol == "hami", "ours beside it on the same nodes"
    assert cli.arguments([*real, "--protocol", "hami"]).protocol == "hami"
    for bad in (
        ["--peer", "hami=/src", "--peer", "gpushare=/src2"],
        ["--peer", "hami=/src", "--protocol", "gpushare"],
    ):
        with pytest.raises(SystemExit):
            cli.arguments([*real, *bad])
    assert "runs of their own" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.arguments(["--synthetic", "--mode", "fast", "--protocol", "hami"])


def test_hami_schedulers_client_is_raised_by_its_own_flags_and_only_for_hami(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--peer-qps N`: hami-scheduler's `--kube-qps` N and `--kube-burst` 2N (cmd/scheduler/main.go at v2.10.0);
    the record names the run so, and as shipped its command sets neither."""
    real = ["--synthetic", "--mode", "real"]
    parsed = cli.arguments([*real, "--policies=", "--peer", "hami=/src", "--peer-qps", "50"])
    assert parsed.peer_qps == 50
    for bad in (
        ["--peer-qps", "50"],
        ["--peer", "gpushare=/src", "--peer-qps", "50"],
        ["--peer", "hami=/src", "--peer-qps", "-1"],
    ):
        with pytest.raises(SystemExit):
            cli.arguments([*real, *bad])
    assert "--peer-qps" in capsys.readouterr().err
    shipped = peers.Built(peers.HAMI, tmp_path / "hami-scheduler").process(tmp_path, tmp_path / "kubeconfig")
    assert not [flag for flag in shipped.command() if flag.startswith("--kube-")]
    raised = peers.Built(peers.HAMI, tmp_path / "hami-scheduler", peers.client_flags(50))
    command = raised.process(tmp_path, tmp_path / "kubeconfig").command()
    assert command[-2:] == ["--kube-qps=50", "--kube-burst=100"]
    assert peers.HAMI.shown == "hami-scheduler v2.10.0"


def test_hami_scheduler_is_wired_and_started_as_its_chart_does_with_the_webhook_off(tmp_path: Path) -> None:
    """charts/hami/templates/scheduler/configmap.yaml, deployment.yaml and device-configmap.yaml at v2.10.0."""
    process = peers.Built(peers.HAMI, tmp_path / "hami-scheduler").process(tmp_path, tmp_path / "kubeconfig")
    assert isinstance(process, peers.HamiProcess)
    (extender,) = yaml.safe_load(process.config("gpu-scheduler"))["extenders"]
    assert extender["urlPrefix"] == f"http://127.0.0.1:{process.port}" and not extender["enableHTTPS"]
    assert (extender["filterVerb"], extender["bindVerb"], extender["nodeCacheCapable"]) == ("filter", "bind", True)
    assert "prioritizeVerb" not in extender and extender["weight"] == 1
    managed = {resource["name"]: resource["ignoredByScheduler"] for resource in extender["managedResources"]}
    assert managed["nvidia.com/gpu"] is True and managed["nvidia.com/gpumem-percentage"] is True
    command = process.command()
    assert f"--http_bind=127.0.0.1:{process.port}" in command and "--node-scheduler-policy=binpack" in command
    device_config = yaml.safe_load((tmp_path / "hami-device-config.yaml").read_text())
    assert device_config["nvidia"]["deviceSplitCount"] == 10 and device_config["nvidia"]["defaultMemory"] == 0
    assert process.environment() == {"KUBECONFIG": str(tmp_path / "kubeconfig")}


def test_a_directory_that_is_not_the_peers_source_is_refused_saying_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(PeerError, match=r"no go.mod.*git clone https://github.com/AliyunContainerService"):
        peers.build(GPUSHARE, tmp_path, tmp_path / "cache")
    other = gpushare_tree(tmp_path / "other", module="example.com/something-else")
    with pytest.raises(PeerError, match=r"is not github.com/AliyunContainerService/gpushare-scheduler-extender's"):
        peers.build(GPUSHARE, other, tmp_path / "cache")


def test_a_binary_built_from_the_same_tree_is_taken_from_the_cache(tmp_path: Path) -> None:
    source = gpushare_tree(tmp_path / "src")
    cache = tmp_path / "cache"
    cache.mkdir()
    built = cache / f"gpushare-{peers.source_digest(source)}"
    built.write_text("#!/bin/sh\n")
    assert peers.build(GPUSHARE, source, cache) == peers.Built(GPUSHARE, built)


def test_without_go_the_build_says_what_it_needs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = gpushare_tree(tmp_path / "src")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(PeerError, match="needs Go"):
        peers.build(GPUSHARE, source, tmp_path / "cache")


def test_a_failed_build_reports_the_end_of_go_s_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in `go` on PATH that fails as a compile error would (the real one is never run here)."""
    source = gpushare_tree(tmp_path / "src")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "go"
    fake.write_text("#!/bin/sh\necho 'cmd/main.go:3:1: syntax error: unexpected }' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(PeerError, match=r"go build failed in .*syntax error"):
        peers.build(GPUSHARE, source, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("gpushare-*")), "nothing cached for a failed build"


def test_the_digest_follows_the_go_files_and_not_vendor_or_tests(tmp_path: Path) -> None:
    source = gpushare_tree(tmp_path / "src")
    before = peers.source_digest(source)
    (source / "vendor" / "x" / "x.go").write_text("package x // changed\n")
    (source / "cmd" / "main_test.go").write_text("package main // changed\n")
    assert peers.source_digest(source) == before
    (source / "cmd" / "main.go").write_text("package main\n\nfunc main() { println() }\n")
    assert peers.source_digest(source) != before


def test_gpushare_is_wired_as_its_own_docs_wire_it(tmp_path: Path) -> None:
    """gpushare's config/scheduler-policy-config.yaml at c0b6141 (v1beta2 there; the same fields in v1)."""
    process = GpushareProcess(tmp_path / "binary", tmp_path, tmp_path / "kubeconfig")
    config = yaml.safe_load(process.config("gpu-scheduler"))
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["profiles"] == [{"schedulerName": "gpu-scheduler"}]
    (extender,) = config["extenders"]
    assert extender == {
        "urlPrefix": f"http://127.0.0.1:{process.port}/gpushare-scheduler",
        "filterVerb": "filter",
        "bindVerb": "bind",
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "managedResources": [{"name": "aliyun.com/gpu-mem", "ignoredByScheduler": False}],
        "ignorable": False,
    }


def test_a_peer_that_exits_at_start_is_reported_with_its_log(tmp_path: Path) -> None:
    binary = tmp_path / "gpushare"
    binary.write_text("#!/bin/sh\necho 'Error building kubeconfig' >&2\nexit 3\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    process = GpushareProcess(binary, tmp_path, tmp_path / "kubeconfig")
    with pytest.raises(PeerError, match="exited with code 3 at start"):
        process.start()
    assert "Error building kubeconfig" in process.log.read_text()
    assert not process.running()


def test_only_the_end_of_a_peers_output_is_kept(tmp_path: Path) -> None:
    """gpushare logs lines per pod and node even at its quietest level: the log keeps the last chunks of it."""
    binary = tmp_path / "gpushare"
    binary.write_text("#!/bin/sh\nseq 1 2000000\nexit 1\n")  # 14.9 MB
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    process = GpushareProcess(binary, tmp_path, tmp_path / "kubeconfig")
    with pytest.raises(PeerError):
        process.start()
    header, _, kept = process.log.read_bytes().partition(b"\n")
    written = sum(len(f"{number}\n") for number in range(1, 2000001))
    assert peers.TAIL_BYTES <= len(kept) < peers.TAIL_BYTES + peers.CHUNK
    assert header.decode() == f"[{written - len(kept):,} earlier bytes not kept]"
    assert kept.endswith(b"1999999\n2000000\n")


def test_the_tail_is_kept_by_its_bytes_however_small_the_reads(tmp_path: Path) -> None:
    """A Go panic is written a frame at a time, and a reader that keeps up gets each write as its own read: the
    tail was 32 reads, so of a long panic only its last frames were kept and its `panic:` line was lost."""

    class Trickle(io.BytesIO):
        def read1(self, size: int = -1) -> bytes:
            return super().read1(min(size, 7))

    panic = b"panic: runtime error: index out of range [3] with length 3\n"
    frames = b"".join(b"goroutine %d frame\n" % number for number in range(200_000))  # 4.5 MB
    process = GpushareProcess(tmp_path / "gpushare", tmp_path, tmp_path / "kubeconfig")
    process._read(cast(Any, SimpleNamespace(stdout=Trickle(b"serving\n" + panic + frames[: peers.TAIL_BYTES // 2]))))
    assert process._why() == panic.decode().strip()
    process._read(cast(Any, SimpleNamespace(stdout=Trickle(frames))))
    kept = b"".join(process._tail)
    assert peers.TAIL_BYTES <= len(kept) < peers.TAIL_BYTES + 7
    assert kept.endswith(frames[-100:])


def test_a_crash_is_told_by_its_own_output_not_the_one_before(tmp_path: Path) -> None:
    """The tail spans restarts: a second exit that prints no panic was reported with the first one's."""
    binary = tmp_path / "gpushare"
    binary.write_text("#!/bin/sh\necho 'panic: first'\nexit 2\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    process = GpushareProcess(binary, tmp_path, tmp_path / "kubeconfig")
    process._spawn()
    assert process.popen is not None and process._reader is not None
    process.popen.wait(10)
    process._reader.join(10)
    assert process._why() == "panic: first"
    binary.write_text("#!/bin/sh\necho 'killed by the OOM killer'\nexit 137\n")
    process._spawn()
    process.popen.wait(10)
    process._reader.join(10)
    assert process._why() == "killed by the OOM killer"
    process.stop()


def test_a_peer_that_crashes_mid_run_is_started_again_after_kubelets_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpushare c0b6141 exits with "fatal error: concurrent map read and map write" when pods are deleted while
    its workers sync (`removePodCache`, written by the informer's delete handler and read by the workers with no
    lock): in a cluster kubelet starts it again, so the run goes on and counts the crash."""
    binary = tmp_path / "gpushare"
    binary.write_text("#!/bin/sh\necho serving\necho 'fatal error: concurrent map read and map write'\nexit 2\n")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    process = GpushareProcess(binary, tmp_path, tmp_path / "kubeconfig")
    process._spawn()
    assert process.popen is not None
    process.popen.wait(10)
    monkeypatch.setattr(peers, "BACKOFF", 0.2)
    process.revive()
    assert process.crashes == ["fatal error: concurrent map read and map write"]
    first = process.popen
    process.revive()
    assert process.popen is first, "not before its back-off"
    time.sleep(0.25)
    process.revive()
    assert process.popen is not first, "started again"
    process.popen.wait(10)
    process.revive()
    assert len(process.crashes) == 2
    assert process._restart_at == pytest.approx(process.exits[1] + 0.4), "the back-off doubles"
    now = time.monotonic()  # the runner's clock, read once: the exits are placed on its run, 5 s in at the first
    monkeypatch.setattr(peers.time, "monotonic", lambda: now)
    first_exit, second_exit = process.exited_at(now - process.exits[0] + 5)
    assert first_exit == 5.0 and second_exit == round(5 + process.exits[1] - process.exits[0], 1) >= 5.2, (
        "when, in seconds of the run, beside why (the second at least the first back-off after the first)"
    )
    monkeypatch.undo()
    process.stop()


def test_a_run_of_another_policy_alone_names_it_in_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of one policy were labelled by their mode alone: a peer (or fill) run alone read as ours."""
    assert cli.main(["--synthetic", "--mode", "fast", "--policies", "fill"]) == 0
    out = capsys.readouterr().out
    assert "== fill, fast, seed 42:" in out
    assert "\nfill, fast: mean " in out


def test_the_report_says_how_often_the_peer_was_started_again() -> None:
    from bench.placement.outcome import peer_restarts

    assert peer_restarts({}) == ""
    assert peer_restarts({"peer_crashes": []}) == ""
    said = peer_restarts({"peer_crashes": ["fatal error: concurrent map read and map write", "exit code 2"]})
    assert "exited 2 times" in said and said.endswith("fatal error: concurrent map read and map write")
    extra = {"peer_crashes": ["fatal error: concurrent map writes", "exit code 2"], "peer_exited_at": [812.4, 1530.0]}
    assert "exited 2 times (at 812, 1,530 s of the run) and" in peer_restarts(extra)
    said = peer_restarts(extra, speed=3.0)
    assert "(at 812, 1,530 s of the run; trace hour 0.7, 1.3)" in said, "a churn run's exits on its curve's axis"
    extra["peer_exited_at"] = [-40.0, 812.4]  # found while it settled, before the run's clock started
    said = peer_restarts(extra, speed=3.0)
    assert "(1 before the pods came; at 812 s of the run; trace hour 0.7)" in said


def test_hami_scheduler_has_settled_once_every_node_carries_its_handshakes(tmp_path: Path) -> None:
    """At its start hami-scheduler writes a handshake annotation per device type on every node, 5 API calls a
    second: the replay's pods wait for it (`RealReplay._until_settled`); gpushare's extender writes none."""
    hami = peers.Built(peers.HAMI, tmp_path / "hami-scheduler").process(tmp_path, tmp_path / "kubeconfig")

    def node(*keys: str) -> dict[str, object]:
        return {"metadata": {"annotations": {"hami.io/node-nvidia-register": "[]"} | dict.fromkeys(keys, "x")}}

    done = node("hami.io/node-handshake", "hami.io/node-handshake-dcu")
    assert hami.settled([done, done]) == ""
    assert "1 of 3 nodes" in hami.settled([done, done, node("hami.io/node-handshake")])
    assert "2 of 2 nodes" in hami.settled([node(), node()])
    gpushare = peers.Built(GPUSHARE, tmp_path / "gpushare").process(tmp_path, tmp_path / "kubeconfig")
    assert gpushare.settled([node()]) == ""
