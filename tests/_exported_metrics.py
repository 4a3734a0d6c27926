"""The metric names the guard's and the reference scheduler's ``/metrics`` export, read from
the text each serves after a little traffic: each family's name, the names of the series its type
adds (``_total``, ``_bucket``, ...) and every sample's name."""

from __future__ import annotations

import functools

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
    "summary": ("", "_count", "_sum", "_created"),
}


def names_in(text: str) -> frozenset[str]:
    """Every name a Prometheus text exposition holds, a family's own included."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in _SUFFIXES.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


@functools.cache
def guard_metric_names() -> frozenset[str]:
    """The guard's, with rate limits on so that the limiters' families have series, after an
    admitted request (its upstream is down: 502), a check's refusal and a rate limit's."""
    from guard.app import create_app
    from guard.policy import policy_from_yaml

    policy = policy_from_yaml("rate: {anonymous: {requests_per_minute: 2, burst: 2}}")
    app = create_app(policy, upstream_url="http://127.0.0.1:9")
    with TestClient(app) as client:
        client.get("/healthz")
        client.post("/v1/completions", json={"model": "m", "prompt": "hi", "n": 1000000})
        for _ in range(3):
            client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        text = client.get("/metrics").text
    return names_in(text)


@functools.cache
def reference_metric_names() -> frozenset[str]:
    """The reference scheduler's (hardened profile), after one request."""
    from scheduler_ref.profiles import get_profile
    from scheduler_ref.server import create_app

    with TestClient(create_app(get_profile("hardened"))) as client:
        client.post("/v1/completions", json={"model": "x", "prompt": "hi", "max_tokens": 2})
        text = client.get("/metrics").text
    return names_in(text)
