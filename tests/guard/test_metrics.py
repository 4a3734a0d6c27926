"""The guard's /metrics: what each series counts (issue 15).

Every series counts one thing in one unit: the limiters' counters are split into event counts
(requests, Redis operations), tokens and the state now, so that summing a family never adds
tokens to requests; and the process collector's ``process_*`` series are exported, as
docs/deploy says.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from guard.app import create_app
from guard.policy import policy_from_yaml
from tests._guard_harness import fake_upstream, serve

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}


async def test_limiter_series_count_one_unit_each() -> None:
    async with fake_upstream() as fake:
        app = create_app(policy_from_yaml("rate: {tokens_per_minute: 600}"), upstream_url=fake.url)
        async with serve(app) as url, httpx.AsyncClient(base_url=url) as client:
            for _ in range(3):
                assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
            # More tokens than the bucket holds: refused by the limiter, not by a check.
            refused = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000})
            assert refused.json()["error"]["code"] == "request_exceeds_token_budget"
            text = (await client.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "schedguard_guard_limiter_events" not in families

    def values(name: str, label: str) -> dict[str, float]:
        return {s.labels[label]: s.value for s in families[name].samples}

    events = values("schedguard_guard_rate_limit_events", "event")
    assert events["allowed"] == 3 and events["rejected_oversize"] == 1
    tokens = values("schedguard_guard_rate_limit_tokens", "kind")
    rate = app.state.gateway.limiter.metrics
    assert tokens == {
        "reserved": rate.tokens_reserved,
        "refunded": rate.tokens_refunded,
        "overshoot": rate.tokens_overshoot,
    }
    assert 0 < tokens["refunded"] < tokens["reserved"]  # 3 x (prompt + 256) reserved, 3 used
    slots = values("schedguard_guard_concurrency_events", "event")
    assert slots["admitted"] == 3 and "wait_seconds_total" not in slots
    assert values("schedguard_guard_concurrency_requests", "state") == {
        "in_flight": 0,
        "waiting": 0,
    }
    assert families["schedguard_guard_concurrency_requests"].type == "gauge"
    # No event count is named after tokens or seconds.
    for name in ("schedguard_guard_rate_limit_events", "schedguard_guard_concurrency_events"):
        assert not any(
            k.startswith("tokens") or k.endswith("seconds_total") for k in values(name, "event")
        )
    # The process collector, as docs/deploy says (the dashboard's memory and CPU panels).
    assert families["process_resident_memory_bytes"].samples[0].value > 0
    assert "process_cpu_seconds" in families
