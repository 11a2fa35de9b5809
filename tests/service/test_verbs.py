"""The HTTP surface: bad input gets a 4xx naming what was wrong, probes, metrics and inspection."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from extender.core.binding import BindError
from extender.core.placement.config import PolicyConfig
from extender.core.preemption import NO_LOWER_PRIORITY
from extender.service.pages import build_health_server
from extender.service.verbs import build_server
from tests.builders import bound_pod, make_cluster, make_node, make_pod, make_quota, quotas_of
from tests.conftest import ClientFor, eventually, make_service


def filter_body(pod: dict[str, Any] | None = None, names: Any = ("n1",)) -> dict[str, Any]:
    return {"Pod": pod if pod is not None else make_pod(gpu_mem=4), "Nodes": None, "NodeNames": list(names)}


class FailingBinder:
    """Stands for an API server whose write fails: with BindError as a refused patch or binding would,
    with anything else as a bug would."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def bind(self, pod: dict[str, Any], node: str, annotations: dict[str, str]) -> None:
        raise self.error


def bind_body(pod: dict[str, Any], node: str = "n1") -> dict[str, Any]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}


BAD_BODIES = [
    # (id, verb, body, status, what the error must say)
    ("not-json", "filter", b"nope", 400, "body is not JSON"),
    ("empty", "filter", b"", 400, "empty body"),
    ("array", "filter", b"[1, 2]", 400, "body must be a JSON object"),
    ("missing-pod", "filter", b'{"NodeNames": ["n1"]}', 400, "Pod: Field required"),
    ("null-pod", "filter", b'{"Pod": null, "NodeNames": []}', 400, "Pod: Input should be a valid dictionary"),
    ("names-not-list", "prioritize", b'{"Pod": {}, "NodeNames": "n1"}', 400, "NodeNames: Input should be a valid list"),
    (
        "name-not-string",
        "filter",
        b'{"Pod": {"spec": {}}, "NodeNames": ["a", 3]}',
        400,
        "NodeNames.1: Input should be a valid string",
    ),
    (
        "negative",
        "filter",
        orjson.dumps(filter_body(make_pod(gpu_mem="-4"))),
        400,
        "limits aliyun.com/gpu-mem '-4' is negative",
    ),
    ("unparsable", "filter", orjson.dumps(filter_body(make_pod(gpu_mem="4 gigs"))), 400, "'4 gigs' is not a quantity"),
    ("pod-without-spec", "filter", b'{"Pod": {"metadata": {}}, "NodeNames": []}', 400, "Pod.spec is missing"),
    ("bind-missing-uid", "bind", b'{"PodName": "p", "PodNamespace": "d", "Node": "n1"}', 400, "PodUID: Field required"),
    (
        "bind-uid-number",
        "bind",
        b'{"PodName": "p", "PodNamespace": "d", "PodUID": 7, "Node": "n1"}',
        400,
        "PodUID: Input should be a valid string",
    ),
    (
        "victim-without-uid",
        "preempt",
        b'{"Pod": {"spec": {}}, "NodeNameToMetaVictims": {"n1": {"Pods": [{"uid": 1}]}}}',
        400,
        "NodeNameToMetaVictims.n1.Pods.0.UID: Field required",
    ),
]


@pytest.mark.parametrize(
    ("verb", "body", "status", "message"), [pytest.param(*case[1:], id=case[0]) for case in BAD_BODIES]
)
async def test_bad_input_gets_a_4xx_that_names_the_problem(
    verb: str, body: bytes, status: int, message: str, client_for: ClientFor
) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    response = await client.post(f"/{verb}", data=body)
    assert response.status == status
    reply = await response.json()
    assert message in reply["Error"]
    assert "Traceback" not in reply["Error"]


async def test_a_body_over_the_limit_gets_413(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1")), max_body_bytes=1024))
    response = await client.post("/filter", data=orjson.dumps(filter_body(names=[f"n{i}" for i in range(500)])))
    assert response.status == 413
    assert "over the limit of 1024 bytes" in (await response.json())["Error"]


async def test_unknown_routes_and_methods_answer_json(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster()))
    missing = await client.get("/nowhere")
    wrong = await client.get("/filter")
    assert (missing.status, (await missing.json())["Error"]) == (404, "GET /nowhere: Not Found")
    assert (wrong.status, (await wrong.json())["Error"]) == (405, "GET /filter: Method Not Allowed")


async def test_an_unknown_node_name_is_a_reason_not_a_failure(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    response = await client.post("/filter", data=orjson.dumps(filter_body(names=["ghost"])))
    reply = await response.json()
    assert response.status == 200
    assert reply["NodeNames"] == []
    assert reply["FailedNodes"] == {"ghost": "node is not in the extender's cache (yet)"}
    assert reply["Error"] == ""


async def test_with_a_node_passed_the_nodes_refused_are_counted_and_left_out_of_the_reply(
    client_for: ClientFor,
) -> None:
    """kube-scheduler reads refusals only for a pod it cannot place: with one passed they would be sent for
    nothing (a thousand reasons to encode and decode)."""
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    reply = await (await client.post("/filter", data=orjson.dumps(filter_body(names=["n1", "ghost"])))).json()
    assert (reply["NodeNames"], reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]) == (["n1"], {}, {})
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_filter_rejections_total{cause="not_in_cache"} 1.0' in metrics


async def test_prioritize_leaves_out_the_nodes_that_score_0(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("empty"), make_node("half"), pods=(bound_pod("a", "half", (0,), 8),))
    client = await client_for(make_service(cluster))
    response = await client.post("/prioritize", data=orjson.dumps(filter_body(names=["empty", "half", "ghost"])))
    # empty: device 4*10//16=2, node 4*10//32=1 -> 1; half: device 12*10//16=7, node 12*10//32=3 -> 5; ghost: 0,
    # which kube-scheduler gives any node the reply leaves out.
    assert await response.json() == [{"Host": "empty", "Score": 1}, {"Host": "half", "Score": 5}]
    # Asked again, now from the remembered entries (the ghost is never remembered), a name twice: the same scores.
    again = await client.post("/prioritize", data=orjson.dumps(filter_body(names=["half", "ghost", "empty", "half"])))
    assert await again.json() == [
        {"Host": "half", "Score": 5},
        {"Host": "empty", "Score": 1},
        {"Host": "half", "Score": 5},
    ]


async def test_prioritize_takes_the_lowest_score_off_every_node_and_leaves_out_those_at_it(
    client_for: ClientFor,
) -> None:
    """kube-scheduler adds the same amount less to every node: the ranking is the same, the reply shorter."""
    cluster = make_cluster(
        make_node("empty"), make_node("empty-too"), make_node("half"), pods=(bound_pod("a", "half", (0,), 8),)
    )
    client = await client_for(make_service(cluster))
    body = filter_body(make_pod("q", gpu_mem=4), names=["empty", "half", "empty-too"])
    response = await client.post("/prioritize", data=orjson.dumps(body))
    # empty and empty-too score 1, half 5 (as above): 1 off each, and the two at 1 are left out.
    assert await response.json() == [{"Host": "half", "Score": 4}]
    alike = await client.post("/prioritize", data=orjson.dumps({**body, "NodeNames": ["empty", "empty-too"]}))
    assert await alike.json() == []


async def test_an_unexpected_failure_is_a_500_with_a_message_and_the_reservation_is_released(
    client_for: ClientFor,
) -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=4)
    cluster.apply_pod(pod)
    client = await client_for(make_service(cluster, binder=FailingBinder(RuntimeError("boom"))))
    response = await client.post("/bind", data=orjson.dumps(bind_body(pod)))
    assert response.status == 500
    assert (await response.json())["Error"] == "internal error in bind: RuntimeError: boom"
    assert cluster.nodes["n1"].used == [0, 0]


async def test_a_failed_bind_reports_the_error_and_frees_the_memory(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1"))
    pod = make_pod("p", gpu_mem=4)
    cluster.apply_pod(pod)
    client = await client_for(
        make_service(cluster, binder=FailingBinder(BindError("creating the binding: 403 forbidden")))
    )
    response = await client.post("/bind", data=orjson.dumps(bind_body(pod)))
    assert response.status == 200
    assert (await response.json())["Error"] == "binding default/p to n1 failed: creating the binding: 403 forbidden"
    assert cluster.nodes["n1"].used == [0, 0]
    assert not cluster.reserved


async def test_probes(client_for: ClientFor) -> None:
    ready = {"now": False}
    client = await client_for(make_service(make_cluster(make_node("n1")), ready=lambda: ready["now"]))
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 503
    unready_filter = await (await client.post("/filter", data=orjson.dumps(filter_body()))).json()
    assert unready_filter["Error"].startswith("extender is not ready")
    ready["now"] = True
    assert (await client.get("/readyz")).status == 200


async def test_metrics_count_requests_nodes_and_allocations(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=8), make_node("n2"), pods=(bound_pod("a", "n2", (0,), 4),))
    client = await client_for(make_service(cluster))
    await client.post("/filter", data=orjson.dumps(filter_body(make_pod(gpu_mem=12), names=["n1", "n2", "x"])))
    await client.post("/filter", data=b"nope")
    text = await (await client.get("/metrics")).text()
    assert 'extender_requests_total{outcome="ok",verb="filter"} 1.0' in text
    assert 'extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in text
    assert 'extender_filter_nodes_total{result="accepted"} 1.0' in text
    assert 'extender_filter_nodes_total{result="failed"} 1.0' in text
    assert 'extender_filter_nodes_total{result="unresolvable"} 1.0' in text
    assert 'extender_filter_rejections_total{cause="not_in_cache"} 1.0' in text
    assert 'extender_filter_rejections_total{cause="too_small"} 1.0' in text
    assert 'extender_request_duration_seconds_count{outcome="ok",verb="filter"} 1.0' in text
    assert 'extender_allocations{state="observed"} 1.0' in text
    assert "extender_cache_nodes 2.0" in text


async def test_metrics_show_each_quota_limit_and_what_its_namespace_uses_within_a_bound(
    client_for: ClientFor,
) -> None:
    cluster = make_cluster(make_node("n1"), pods=(bound_pod("a", "n1", (0,), 6, namespace="ml-a"),))
    hard = {"limits.aliyun.com/gpu-mem": "16", "limits.aliyun.com/gpu-count.T4": "2"}
    quotas_of(cluster).replace([quotas_of(cluster).read(make_quota("team", "ml-a", **hard))])
    service = make_service(cluster)
    client = await client_for(service)
    refused = make_pod("big", gpu_mem=12, namespace="ml-a")
    reply = await (await client.post("/filter", data=orjson.dumps(filter_body(refused)))).json()
    assert reply["NodeNames"] == [] and "uses 6 of its 16 GiB" in reply["FailedAndUnresolvableNodes"]["n1"]
    text = await (await client.get("/metrics")).text()
    assert 'extender_filter_rejections_total{cause="quota"} 1.0' in text
    labels = 'model="",namespace="ml-a",quota="team",resource="memory"'
    assert f"extender_quota_limit{{{labels}}} 16.0" in text and f"extender_quota_used{{{labels}}} 6.0" in text
    assert 'extender_quota_limit{model="T4",namespace="ml-a",quota="team",resource="gpus"} 2.0' in text
    assert "extender_quota_limits 2.0" in text and "extender_quota_series 1.0" in text
    service.metrics.quota_series_limit = 1  # more limits than series allowed: their count alone
    text = await (await client.get("/metrics")).text()
    assert "extender_quota_limit{" not in text and "extender_quota_used{" not in text
    assert "extender_quota_limits 2.0" in text and "extender_quota_series 0.0" in text


async def test_inspect_shows_devices_pods_and_reservations_with_their_age(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1"), pods=(bound_pod("a", "n1", (1,), 6),))
    client = await client_for(make_service(cluster))
    pod = make_pod("b", gpu_mem=4)
    await client.post("/filter", data=orjson.dumps(filter_body(pod)))
    assert (await (await client.post("/bind", data=orjson.dumps(bind_body(pod)))).json()) == {"Error": ""}
    node = await (await client.get("/inspect/n1")).json()
    assert (node["capacity"], node["used"]) == (32, 10)
    gpu1 = node["devices"][1]
    assert (gpu1["capacity"], gpu1["used"], gpu1["free"]) == (16, 10, 6)
    assert sorted((holder["pod"], holder["memory"], holder["state"]) for holder in gpu1["pods"]) == [
        ("default/a", 6, "observed"),
        ("default/b", 4, "observed"),
    ]
    everything = await (await client.get("/inspect")).json()
    assert [entry["name"] for entry in everything["nodes"]] == ["n1"]
    missing = await client.get("/inspect/ghost")
    assert (missing.status, (await missing.json())["Error"]) == (404, "node ghost is not in the extender's cache")


async def test_a_pod_refused_everywhere_is_told_where_preemption_could_help(client_for: ClientFor) -> None:
    """n1 runs a pod of priority 10, n2 one of priority 100: a pod of priority 50 could evict only on n1. The others
    are unresolvable, so kube-scheduler's preemption simulates nothing there (`core/preemption.py`)."""
    running = (bound_pod("low", "n1", (0,), 16, gpus=None), bound_pod("high", "n2", (0,), 16, gpus=None))
    running[0]["spec"]["priority"], running[1]["spec"]["priority"] = 10, 100
    cluster = make_cluster(make_node("n1", gpus=1), make_node("n2", gpus=1), pods=running)
    client = await client_for(make_service(cluster))
    pod = make_pod("p", gpu_mem=8)
    pod["spec"]["priority"] = 50
    reply = await (await client.post("/filter", data=orjson.dumps(filter_body(pod, names=["n1", "n2"])))).json()
    assert list(reply["FailedNodes"]) == ["n1"] and list(reply["FailedAndUnresolvableNodes"]) == ["n2"]
    assert reply["FailedAndUnresolvableNodes"]["n2"].startswith("needs 8 GiB on one GPU")
    assert reply["FailedAndUnresolvableNodes"]["n2"].endswith("so preemption cannot help")


async def test_inspect_shows_the_workload_the_policy_has_learned(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1"), pods=(bound_pod("a", "n1", (1,), 6), bound_pod("b", "n1", (0,), 6)))
    client = await client_for(make_service(cluster, policy=PolicyConfig()))
    await client.post("/filter", data=orjson.dumps(filter_body(make_pod("c", gpu_mem=4))))  # learned when asked
    workload = (await (await client.get("/inspect")).json())["workload"]
    assert (workload["policy"], workload["narrowing"], workload["pods_seen"]) == ("fragmentation", "best", 3)
    assert [(shape["memory_per_gpu"], shape["weight"]) for shape in workload["shapes"]] == [(6, 0.6667), (4, 0.3333)]


async def test_prioritize_answers_follow_the_cache_after_a_bind(client_for: ClientFor) -> None:
    cluster = make_cluster(make_node("n1", gpus=1, mem=16), make_node("n2", gpus=1, mem=16))
    client = await client_for(make_service(cluster))
    body = orjson.dumps(filter_body(make_pod("q", gpu_mem=4), names=["n1", "n2"]))
    before = await (await client.post("/prioritize", data=body)).json()
    pod = make_pod("p", gpu_mem=8)
    await client.post("/filter", data=orjson.dumps(filter_body(pod)))
    assert await (await client.post("/bind", data=orjson.dumps(bind_body(pod)))).json() == {"Error": ""}
    after = await (await client.post("/prioritize", data=body)).json()
    # Both empty first: 4*10//16 = 2 each, alike, so neither is listed. n1 now holds 8: a 4 GiB pod there fills
    # (8+4)*10//16 = 7 on device and node; n2 stays at 2, the lowest, taken off n1's 7.
    assert (before, after) == ([], [{"Host": "n1", "Score": 5}])


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["n1", 3], "NodeNames.1: Input should be a valid string"),
        ([["n1"]], "NodeNames.0: Input should be a valid string"),
        ([{"n": 1}, "n1"], "NodeNames.0: Input should be a valid string"),
        ("n1", "NodeNames: Input should be a valid list"),
    ],
)
async def test_node_names_that_are_not_strings_are_refused_on_every_path(
    verb: str, names: Any, message: str, client_for: ClientFor
) -> None:
    # Filter's fast path checks names by membership in a set of strings; every other path checks them
    # one by one. Either way a wrong item is a 400 that names it, never a 500 or a silently odd answer.
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    response = await client.post(f"/{verb}", data=orjson.dumps({"Pod": make_pod(gpu_mem=4), "NodeNames": names}))
    assert response.status == 400
    assert message in (await response.json())["Error"]


def _pod_with(**changes: Any) -> dict[str, Any]:
    pod = make_pod("p", gpu_mem=4)
    for path, value in changes.items():
        target = pod
        *parents, last = path.split("__")
        for parent in parents:
            target = target[parent]
        target[last] = value
    return pod


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        (_pod_with(metadata="x"), "Pod.metadata must be an object"),
        (_pod_with(metadata__annotations="x"), "Pod.metadata.annotations must be an object"),
        (_pod_with(status="x"), "Pod.status must be an object"),
        (_pod_with(spec__initContainers=5), "Pod.spec.initContainers must be a list"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt"])
async def test_a_pod_of_the_wrong_shape_is_a_400(
    pod: dict[str, Any], message: str, verb: str, client_for: ClientFor
) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    body = {"Pod": pod, "NodeNames": ["n1"], "NodeNameToMetaVictims": {}}
    response = await client.post(f"/{verb}", data=orjson.dumps(body))
    assert (response.status, (await response.json())["Error"]) == (400, message)


@pytest.mark.parametrize(
    "node",
    [
        {"metadata": "x"},
        {"metadata": {"name": "odd"}, "status": "x"},
        {"metadata": {"name": "odd"}, "status": {"conditions": 5, "capacity": ["x"]}},
        {"metadata": {"name": "odd", "annotations": "x"}},
    ],
)
async def test_whole_nodes_of_the_wrong_shape_are_nodes_without_gpus_not_errors(
    node: dict[str, Any], client_for: ClientFor
) -> None:
    client = await client_for(make_service(make_cluster()))
    body = orjson.dumps({"Pod": make_pod(gpu_mem=4), "Nodes": {"items": [node]}})
    for verb in ("filter", "prioritize"):
        response = await client.post(f"/{verb}", data=body)
        assert response.status == 200, await response.text()


async def test_preempt_victims_of_the_wrong_shape_are_not_a_500(client_for: ClientFor) -> None:
    client = await client_for(make_service(make_cluster(make_node("n1"))))
    body = {"Pod": make_pod(gpu_mem=4), "NodeNameToVictims": {"n1": {"Pods": [{"metadata": "x"}]}}}
    response = await client.post("/preempt", data=orjson.dumps(body))
    assert response.status == 200


@pytest.mark.parametrize(
    "quantity", ["1e400", "1e999999", "1e5000", "9" * 5000, "\u00b2", "\u0664", "\uff14", " 4 "]
)  # superscript two, Arabic-Indic four, fullwidth four
async def test_an_unreadable_quantity_is_a_400_naming_the_container_and_counted_as_bad_request(
    client_for: ClientFor, quantity: str
) -> None:
    """D2, D3 of the hardening issue: 1e999999 once blocked the process for 25 s and answered 500; "٤" was 4.
    Beyond 2**63 (as the API server refuses) or not ASCII digits, a quantity is refused before any big number
    is built."""
    service = make_service(make_cluster(make_node("n1")))
    client = await client_for(service)
    response = await client.post("/filter", data=orjson.dumps(filter_body(make_pod(gpu_mem=quantity, gpus=3))))
    reply = await response.json()
    assert response.status == 400
    assert "container main" in reply["Error"] and "aliyun.com/gpu-mem" in reply["Error"]
    metrics = await (await client.get("/metrics")).text()
    assert 'extender_requests_total{outcome="bad_request",verb="filter"} 1.0' in metrics


async def test_each_metric_family_is_described_once_with_both_listeners_built() -> None:
    """A second `# HELP` line for one family makes strict exposition parsers refuse the whole scrape."""
    service = make_service(make_cluster(make_node("n1")))
    build_server(service)
    build_health_server(service)
    text = service.metrics.render(service.cache, service.quotas, service.placer.learned).decode()
    helps = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP")]
    assert len(helps) == len(set(helps)) and "extender_http_connections" in helps


async def test_many_full_nodes_share_one_reason_so_kube_schedulers_message_stays_short(client_for: ClientFor) -> None:
    """kube-scheduler counts nodes per distinct reason and writes the whole count into the pod's condition: a
    thousand reasons differing by their numbers made a message of a thousand parts. A few nodes keep theirs."""
    nodes = [make_node(f"n{number}", gpus=1) for number in range(12)]
    pods = tuple(bound_pod(f"p{number}", f"n{number}", (0,), 10 + number % 4) for number in range(12))
    client = await client_for(make_service(make_cluster(*nodes, pods=pods)))
    names = [f"n{number}" for number in range(12)]
    reply = await (await client.post("/filter", data=orjson.dumps(filter_body(make_pod("q", gpu_mem=8), names)))).json()
    reasons = set(reply["FailedNodes"].values()) | set(reply["FailedAndUnresolvableNodes"].values())
    assert reasons == {"needs 8 GiB on one GPU; no GPU here has that much free" + NO_LOWER_PRIORITY}
    few = await (
        await client.post("/filter", data=orjson.dumps(filter_body(make_pod("r", gpu_mem=8), names[:2])))
    ).json()
    assert few["FailedAndUnresolvableNodes"]["n0"].startswith("needs 8 GiB on one GPU; largest free is 6 GiB")


async def test_a_failed_round_of_the_expiry_sweep_is_logged_and_the_next_one_runs(
    client_for: ClientFor, caplog: pytest.LogCaptureFixture
) -> None:
    """A sweep that stopped at its first error would leave every reservation and device-plugin lock held for good,
    and say nothing until the process ends."""
    service = make_service(make_cluster(make_node("n1", gpus=1, mem=16)), expiry_interval=0.01)
    rounds: list[int] = []
    expire = service.ledger.expire

    def failing_once(include_bound: bool = False) -> Any:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("a defect in one round")
        return expire(include_bound=include_bound)

    service.ledger.expire = failing_once  # type: ignore[method-assign]
    await client_for(service)
    await eventually(lambda: len(rounds) >= 3, what="rounds after the failed one")
    failures = [record for record in caplog.records if "expiring reservations and node locks failed" in record.message]
    assert len(failures) == 1 and failures[0].exc_info is not None, "logged once, with its traceback"
