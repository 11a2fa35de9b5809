"""The file source reads what `kubectl get nodes,pods -A -o yaml` prints, and its binder updates the pods as
the API would."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import yaml

from extender.core.cache import Cache
from extender.sources.file import ClusterFileError, FileBinder, load_cluster_file
from tests.builders import PROFILE, bound_pod, make_node, make_pod


def test_a_kubectl_list_with_other_kinds_loads_nodes_and_pods(tmp_path: Path) -> None:
    listing = {
        "apiVersion": "v1",
        "kind": "List",
        "items": [make_node("n1"), bound_pod("a", "n1", (0,), 4), {"kind": "Service", "metadata": {"name": "s"}}],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(listing))
    objects = load_cluster_file(path)
    assert ([n["metadata"]["name"] for n in objects.nodes], len(objects.pods)) == (["n1"], 1)
    assert objects.skipped == {"Service": 1}


def test_several_yaml_documents_and_typed_lists_load(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    node_list = {"kind": "NodeList", "items": [{k: v for k, v in make_node("n2").items() if k != "kind"}]}
    path.write_text(yaml.safe_dump_all([make_node("n1"), node_list, None]))
    assert [n["metadata"]["name"] for n in load_cluster_file(path).nodes] == ["n1", "n2"]


def test_a_json_array_loads(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_bytes(orjson.dumps([make_node("n1"), make_pod("p")]))
    objects = load_cluster_file(path)
    assert (len(objects.nodes), len(objects.pods)) == (1, 1)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("kind: Node\nmetadata: {name: n1}\n---\n- just\n- a list\n", "document 2: not a Kubernetes object"),
        ("kind: Pod\nmetadata: {name: p}\n", "document 1: Pod p without metadata.uid"),
        ("kind: Node\nmetadata: {}\n", "Node without metadata.name"),
        ("kind: List\nitems: 3\n", "List.items is not a list"),
        ("{not json", "not valid JSON"),
        ("kind: [\n", "not valid YAML"),
    ],
)
def test_bad_files_are_refused_naming_the_document(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    with pytest.raises(ClusterFileError, match=message):
        load_cluster_file(path)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match=r"absent\.yaml: No such file"):
        load_cluster_file(tmp_path / "absent.yaml")


async def test_the_file_binder_sets_node_and_annotations_as_the_api_would() -> None:
    cluster = Cache(PROFILE)
    pod = make_pod("p", gpu_mem=4)
    cluster.replace([make_node("n1")], [pod])
    binder = FileBinder(cluster, [pod])
    await binder.bind(pod, "n1", {PROFILE.index_annotation: "1", PROFILE.pod_memory_annotation: "4"})
    record = cluster.pods[pod["metadata"]["uid"]]
    assert record.node_name == "n1"
    assert cluster.nodes["n1"].used == [0, 4]
    assert "nodeName" not in pod["spec"], "the caller's object is not mutated"
    binder.delete(record.uid)
    assert cluster.nodes["n1"].used == [0, 0]
