"""Prometheus metrics of one server instance, in its own registry.

Each app gets a fresh :class:`~prometheus_client.CollectorRegistry` so several servers (and
tests) in one process never share or collide on metrics. Engine state (queue depth, running
requests, KV usage, preemptions, allocation failures) is read from ``Engine.stats()`` at scrape
time rather than mirrored, so it cannot drift; request outcomes are counted as they happen.
Rejections are labelled by their stable error ``code``, the same one the client receives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

PREFIX = "schedguard"

# (metric suffix, kind, help, stats attribute). Counters from the engine are exported as
# counter families: Prometheus appends "_total".
_ENGINE_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("queue_depth", "gauge", "Requests queued: inbox plus waiting queue.", "queue_depth"),
    ("inbox_depth", "gauge", "Requests in the bounded inbox, not yet scheduled.", "inbox"),
    ("inbox_capacity", "gauge", "Capacity of the bounded inbox.", "inbox_capacity"),
    ("waiting", "gauge", "Requests in the scheduler's waiting queue.", "waiting"),
    ("running", "gauge", "Requests running (holding KV blocks).", "running"),
    ("max_num_seqs", "gauge", "Requests the scheduler runs at once, at most.", "max_num_seqs"),
    (
        "kv_blocks_total",
        "gauge",
        "KV cache blocks (16-token units) in the pool.",
        "kv_blocks_total",
    ),
    ("kv_blocks_used", "gauge", "KV cache blocks (16-token units) allocated.", "kv_blocks_used"),
    ("kv_usage_ratio", "gauge", "Fraction of KV cache blocks allocated.", "kv_usage"),
    ("kv_fragmentation_ratio", "gauge", "Internal fragmentation of KV blocks.", "kv_fragmentation"),
    ("tenants", "gauge", "Tenants with a token bucket.", "tenants"),
    ("preemptions", "counter", "Running requests preempted (recompute).", "preemptions"),
    (
        "preemptions_for_priority",
        "counter",
        "Preemptions in favour of a more urgent request.",
        "preemptions_for_priority",
    ),
    (
        "kv_allocation_failures",
        "counter",
        "KV block allocations that failed for lack of blocks.",
        "allocation_failures",
    ),
    (
        "kv_admission_refusals",
        "counter",
        "Admissions refused by the KV watermark.",
        "admission_refusals",
    ),
    ("engine_steps", "counter", "Engine steps executed.", "steps"),
)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], Any]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:
            return
        for suffix, kind, help_text, attr in _ENGINE_METRICS:
            value = _read(stats, attr)
            if value is None:
                continue
            name = f"{PREFIX}_{suffix}"
            if kind == "counter":
                yield CounterMetricFamily(name, help_text, value=value)
            else:
                yield GaugeMetricFamily(name, help_text, value=value)
        finished = _read_map(stats, "finished")
        if finished:
            family = CounterMetricFamily(
                f"{PREFIX}_engine_finished",
                "Engine requests finished, by final status.",
                labels=["status"],
            )
            for status, count in sorted(finished.items()):
                family.add_metric([status], count)
            yield family


def _read_map(stats: Any, attr: str) -> dict[str, float]:
    value = getattr(stats, attr, None)
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float)}


def _read(stats: Any, attr: str) -> float | None:
    value = stats.get(attr) if isinstance(stats, dict) else getattr(stats, attr, None)
    return float(value) if isinstance(value, int | float) else None


class ServerMetrics:
    """The metrics of one app; ``stats`` returns the engine's current stats (or None)."""

    def __init__(self, stats: Callable[[], Any]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            f"{PREFIX}_requests",
            "HTTP requests answered, by endpoint and status.",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.rejections = Counter(
            f"{PREFIX}_rejections",
            "Requests refused, by stable error code.",
            ["code"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens admitted.", registry=self.registry
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Tokens generated.", registry=self.registry
        )
        self.aborted = Counter(
            f"{PREFIX}_aborted_requests",
            "Engine requests aborted because the client went away.",
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "End-to-end request latency (to the last byte for streams), by endpoint.",
            ["endpoint"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.registry.register(_EngineCollector(stats))

    def reject(self, code: str) -> None:
        self.rejections.labels(code=code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
