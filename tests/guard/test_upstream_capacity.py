"""The upstream's capacity in force: read from what the upstream says, per kind, and the limit
following its load (issue 25 item 1)."""

from __future__ import annotations

from typing import Any

import pytest

from guard.gateway import Gateway, build_gateway
from guard.policy import policy_from_yaml
from guard.upstream_capacity import Load, UpstreamCapacity, next_limit, parse_load

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="tiny"}} {kv}
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{le="0.3",model_name="tiny"}} 7.0
"""


def vllm_page(running: float, waiting: float, kv: float) -> bytes:
    return VLLM_METRICS.format(running=running, waiting=waiting, kv=kv).encode()


class FakeUpstream:
    """Answers GETs from a table (path -> body or None for "did not answer 200")."""

    def __init__(self, pages: dict[str, bytes | None]) -> None:
        self.pages = pages
        self.asked: list[str] = []

    async def fetch(self, path: str, keep: int) -> bytes | None:
        self.asked.append(path)
        body = self.pages.get(path)
        return None if body is None or len(body) > keep else body


def gateway(yaml: str = "", kind: str = "other") -> Gateway:
    gw = build_gateway(policy_from_yaml(yaml or "{}"), upstream=None)
    gw.policy = gw.policy.with_upstream_kind(kind)  # type: ignore[arg-type]
    return gw


def test_the_load_gauges_are_read_from_vllms_page() -> None:
    load = parse_load(vllm_page(12, 3, 0.5).decode())
    assert load == Load(running=12.0, waiting=3.0, kv_usage=0.5, max_num_seqs=None)
    assert parse_load("# nothing\nprocess_resident_memory_bytes 1e6\n") is None


def test_the_reference_schedulers_page_says_its_max_num_seqs() -> None:
    page = "schedguard_running 2.0\nschedguard_queue_depth 0.0\nschedguard_max_num_seqs 8.0\n"
    assert parse_load(page) == Load(2.0, 0.0, None, 8)


def test_values_are_summed_over_label_sets() -> None:
    page = (
        'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 4\n'
        'vllm:num_requests_waiting{engine="0"} 0\n'
    )
    load = parse_load(page)
    assert load is not None and load.running == 7.0


@pytest.mark.parametrize(
    ("limit", "in_flight", "load", "expected"),
    [
        (256, 40, Load(30, 10), 30),  # the upstream queues: shrink to what it runs
        (256, 5, Load(0, 50), 1),  # never below one
        (20, 20, Load(20, 0, 0.97), 20),  # KV nearly full: hold
        (20, 10, Load(10, 0, 0.97), 10),  # ... at what is in flight
        (20, 20, Load(20, 0, 0.85), 21),  # filling: grow by one
        (20, 3, Load(3, 0, 0.1), 40),  # room: double
        (200, 3, Load(3, 0, 0.1), 256),  # up to the ceiling
    ],
)
def test_the_limit_follows_the_load(limit: int, in_flight: int, load: Load, expected: int) -> None:
    assert next_limit(limit, in_flight, load, 256) == expected


async def test_vllm_capacity_is_read_while_serving() -> None:
    gw = gateway(kind="vllm")
    up = FakeUpstream({"/metrics": vllm_page(0, 0, 0.0)})
    capacity = UpstreamCapacity(gw, up)  # type: ignore[arg-type]
    await capacity.refresh()
    assert (capacity.value, capacity.source) == (256, "upstream")
    up.pages["/metrics"] = vllm_page(100, 20, 0.9)
    gw.concurrency.in_flight = 120  # as if 120 were through the guard
    await capacity.refresh()
    assert capacity.value == 100
    described = capacity.describe()
    assert described["capacity"] == 100 and described["capacity_source"] == "upstream"
    assert described["upstream_load"] == {"running": 100.0, "waiting": 20.0, "kv_usage": 0.9}
    assert gw.metrics.capacity is not None and gw.metrics.capacity() == (100, "upstream")
    up.pages["/metrics"] = None  # not answering: the limit in force stays
    await capacity.refresh()
    assert capacity.value == 100


async def test_llama_cpp_python_is_one_slot_and_one_waiting() -> None:
    gw = gateway(kind="llama_cpp")
    up = FakeUpstream({})
    capacity = UpstreamCapacity(gw, up)  # type: ignore[arg-type]
    await capacity.refresh()
    assert (capacity.value, capacity.source) == (2, "kind")
    assert up.asked == []  # nothing to ask it


async def test_llama_server_says_its_slots() -> None:
    gw = gateway(kind="other")
    capacity = UpstreamCapacity(gw, FakeUpstream({"/props": b'{"total_slots": 4}'}))  # type: ignore[arg-type]
    await capacity.refresh()
    assert (capacity.value, capacity.source) == (4, "upstream")


async def test_the_policy_overrides_and_the_global_cap_bounds() -> None:
    gw = gateway("upstream: {capacity: 3}", kind="vllm")
    capacity = UpstreamCapacity(gw, FakeUpstream({"/metrics": vllm_page(0, 0, 0)}))  # type: ignore[arg-type]
    await capacity.refresh()
    assert (capacity.value, capacity.source) == (3, "policy")
    gw = gateway("rate: {global_concurrency: 16}", kind="other")
    page = b"schedguard_running 0\nschedguard_queue_depth 0\nschedguard_max_num_seqs 64\n"
    capacity = UpstreamCapacity(gw, FakeUpstream({"/metrics": page}))  # type: ignore[arg-type]
    await capacity.refresh()
    assert capacity.value == 16  # never above rate.global_concurrency


async def test_an_upstream_that_says_nothing_is_asked_again_later() -> None:
    gw = gateway(kind="other")
    up = FakeUpstream({})
    capacity = UpstreamCapacity(gw, up)  # type: ignore[arg-type]
    await capacity.refresh()
    assert (capacity.value, capacity.source) == (256, "default")
    up.pages["/metrics"] = vllm_page(1, 0, 0.1)  # it came up
    for _ in range(12):
        await capacity.refresh()
    assert capacity.source == "upstream"


def test_keys_are_flows_by_tenant_with_their_weight() -> None:
    yaml = """
keys:
  - {key: "sk-gold-0001", tenant: gold, rate: {weight: 3}}
  - {key: "sk-free-0001", tenant: free}
"""
    gw = gateway(yaml)
    for key, tenant, weight in (("sk-gold-0001", "gold", 3.0), ("sk-free-0001", "free", 1.0)):
        ex = gw.exchange("/v1/chat/completions", "POST")
        headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-length", b"2")]
        opened: Any = gw.open(ex, headers, "10.1.1.1")
        assert opened.flow == tenant
        assert gw.policy.rate_for(opened.key).weight == weight


def test_policy_refuses_bad_proxies() -> None:
    with pytest.raises(Exception, match="not an address or CIDR"):
        policy_from_yaml("rate: {trusted_proxies: [not-an-ip]}")
