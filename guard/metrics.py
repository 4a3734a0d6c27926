"""The guard's Prometheus metrics, in a registry of their own per app.

A registry per app (not the process-wide default) so that several apps in one process (tests,
benchmarks) never share or collide on series. Label values are bounded: ``route`` is one of the
guard's routes or ``"other"``, ``code`` a stable error code, ``tenant`` a tenant name from the
policy (or ``"anonymous"``), never a key or a raw path.

The request path is kept cheap: labelled children are looked up once and cached, and what other
components already count in plain attributes (the rate and concurrency limiters, per-check time)
is read at scrape time by a collector instead of being pushed per request.

With ``--workers N`` each worker process exports its own series (scrape every worker, or run
one worker per container).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "GuardMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Time spent in the checks: tens of microseconds for most bodies, milliseconds for big ones.
_OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Snapshot = Callable[[], Mapping[str, float]]


class _ScrapeTime(Collector):
    """Series computed when scraped from counters other components keep anyway."""

    def __init__(self, owner: GuardMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        owner = self._owner
        checks = CounterMetricFamily(
            "schedguard_guard_check_seconds",
            "Total time spent in each step of the check pipeline (parse and each check).",
            labels=["check"],
        )
        for name, seconds in sorted(owner.check_seconds.items()):
            checks.add_metric([name], seconds)
        yield checks
        events = CounterMetricFamily(
            "schedguard_guard_limiter_events",
            "Rate and concurrency limiter events (allowed, rejected_*, fail_open, admitted, "
            "queue_full, timeout, ...; tokens_* count tokens).",
            labels=["limiter", "event"],
        )
        gauges = GaugeMetricFamily(
            "schedguard_guard_limiter_state",
            "Concurrency limiter state now: requests holding a slot or waiting for one.",
            labels=["state"],
        )
        for limiter, snapshot in sorted(owner.sources.items()):
            for event, value in sorted(snapshot().items()):
                if limiter == "concurrency" and event in ("in_flight", "waiting"):
                    gauges.add_metric([event], value)
                else:
                    events.add_metric([limiter, event], value)
        yield events
        yield gauges


class GuardMetrics:
    """Every series the guard exports; :meth:`render` is the ``/metrics`` body."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        if registry is None:
            # process_resident_memory_bytes etc.: the dashboard's memory panel and RSS alerts.
            ProcessCollector(registry=r)
        self.requests = Counter(
            "schedguard_guard_requests",
            "Requests answered, by route and HTTP status (499: the client left).",
            ["route", "status"],
            registry=r,
        )
        self.rejections = Counter(
            "schedguard_guard_rejections",
            "Requests refused or failed, by error code (checks, limits and upstream failures).",
            ["code"],
            registry=r,
        )
        self.overhead = Histogram(
            "schedguard_guard_overhead_seconds",
            "Time the guard spent deciding on a forwarded request: headers, key, checks and "
            "rate limit (not reading the body, queueing or the upstream).",
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "schedguard_guard_upstream_latency_seconds",
            "Time from sending a request upstream to its response headers, by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "schedguard_guard_request_duration_seconds",
            "Time from the request's arrival to the response's last byte, by route.",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "schedguard_guard_tokens",
            "Tokens per tenant: 'in' = prompt tokens, 'out' = completion tokens (the upstream's "
            "usage when it reports one, else the guard's count).",
            ["tenant", "direction"],
            registry=r,
        )
        self.in_flight = Gauge(
            "schedguard_guard_in_flight_requests",
            "Proxied requests being handled.",
            registry=r,
        )
        self.queue_wait = Histogram(
            "schedguard_guard_queue_wait_seconds",
            "Time forwarded requests waited for a concurrency slot.",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self.upstream_aborts = Counter(
            "schedguard_guard_upstream_aborts",
            "Upstream requests cut short: client_gone, client_too_slow, output_cap, bad_event.",
            ["reason"],
            registry=r,
        )
        # Read at scrape time (see _ScrapeTime).
        self.check_seconds: dict[str, float] = {}
        self.sources: dict[str, Snapshot] = {}
        r.register(_ScrapeTime(self))
        self._children: dict[tuple[object, ...], object] = {}

    def _child(self, metric: Counter | Histogram, *labels: str) -> object:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            # Label values are bounded (routes, codes, tenants), so the cache is too.
            child = self._children[key] = metric.labels(*labels)
        return child

    def request_done(self, route: str, status: int, duration_s: float) -> None:
        self._child(self.requests, route, str(status)).inc()  # type: ignore[attr-defined]
        self._child(self.duration, route).observe(duration_s)  # type: ignore[attr-defined]

    def rejected(self, code: str) -> None:
        self._child(self.rejections, code).inc()  # type: ignore[attr-defined]

    def upstream_answered(self, route: str, seconds: float) -> None:
        self._child(self.upstream_latency, route).observe(seconds)  # type: ignore[attr-defined]

    def aborted(self, reason: str) -> None:
        self._child(self.upstream_aborts, reason).inc()  # type: ignore[attr-defined]

    def tokens_used(self, tenant: str, prompt: int, completion: int) -> None:
        if prompt:
            self._child(self.tokens, tenant, "in").inc(prompt)  # type: ignore[attr-defined]
        if completion:
            self._child(self.tokens, tenant, "out").inc(completion)  # type: ignore[attr-defined]

    def checks_ran(self, durations: Mapping[str, float]) -> None:
        totals = self.check_seconds
        for name, seconds in durations.items():
            totals[name] = totals.get(name, 0.0) + seconds

    def export(self, name: str, snapshot: Snapshot) -> None:
        """Export a component's own counters (``snapshot()`` -> name: value) at scrape time."""
        self.sources[name] = snapshot

    def render(self) -> bytes:
        return generate_latest(self.registry)
