"""The guard's Prometheus metrics, in a registry of their own per app.

A registry per app (not the process-wide default) so that several apps in one process (tests,
benchmarks) never share or collide on series. Label values are bounded: ``route`` is one of the
guard's routes or ``"other"``, ``code`` a stable error code, ``tenant`` a tenant name from the
policy (or ``"anonymous"``), never a key or a raw path.

The request path only adds to plain numbers: the guard serves from one event loop thread, so
its counters and histogram buckets need no locks, and prometheus_client's metric objects (a lock
and a label lookup per update, a dozen updates per request: measured at about a tenth of the
guard's own time per request) are built from them at scrape time by a collector, with the same
names, types and buckets. What other components already count (the rate and concurrency
limiters) is read at scrape time too.

With ``--workers N`` (``multiprocess_dir`` given) the workers' series are merged for every
scrape through prometheus_client's multiprocess mode (:mod:`guard.telemetry._multiprocess`): the
request path still only adds to plain numbers, which are copied into files every second.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from guard.telemetry._multiprocess import FileExport, forget_dead_workers

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


class Histogram:
    """Bucket counts and a sum, updated without a lock (one event loop thread writes)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Buckets are "less or equal": the first bound >= value.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs, as the exposition format wants them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
        return out


class _Family:
    """A histogram per label values (bounded, so the dict is too)."""

    __slots__ = ("bounds", "by_labels")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.by_labels: dict[tuple[str, ...], Histogram] = {}

    def labels(self, *values: str) -> Histogram:
        hist = self.by_labels.get(values)
        if hist is None:
            hist = self.by_labels[values] = Histogram(self.bounds)
        return hist


_HELP = {
    "requests": "Requests answered, by route and HTTP status (499: the client left).",
    "rejections": "Requests refused or failed, by error code (checks, limits and upstream "
    "failures).",
    "overhead": "Time the guard spent deciding on a forwarded request: headers, key, checks and "
    "rate limit (not reading the body, queueing or the upstream).",
    "upstream_latency": "Time from sending a request upstream to its response headers, by route.",
    "duration": "Time from the request's arrival to the response's last byte, by route.",
    "tokens": "Tokens per tenant: 'in' = prompt tokens, 'out' = completion tokens (the "
    "upstream's usage when it reports one, else the guard's count).",
    "in_flight": "Proxied requests being handled.",
    "queue_wait": "Time forwarded requests waited for a concurrency slot.",
    "fair_wait": "Time requests waited for a concurrency slot, by tenant (anonymous callers "
    "together).",
    "fair_work": "Estimated work (tokens reserved: prompt plus output for every sequence) let "
    "through to the upstream, by tenant: each tenant's share of the upstream is its rate over "
    "the sum.",
    "fair_queued": "Requests waiting for a concurrency slot now, by tenant (anonymous callers "
    "together, each address a flow of its own in the fair queue).",
    "capacity": "The upstream's capacity in force (the guard's global slots) and where it came "
    "from: policy, upstream (read from it while serving), kind (what the upstream is) or "
    "default (rate.global_concurrency).",
    "aborts": "Upstream requests cut short: client_gone, client_too_slow, output_cap, bad_event.",
    "truncated": "Streams the upstream ended early, by route: no_done (the stream ended without "
    "[DONE]; the client gets an upstream_stream_truncated error event), no_finish_reason "
    "([DONE] came while a choice had no finish_reason).",
}


class _Exported(Collector):
    """Builds every series from the plain numbers :class:`GuardMetrics` keeps."""

    def __init__(self, owner: GuardMetrics) -> None:
        self._owner = owner

    def collect(self) -> Iterator[Metric]:
        m = self._owner
        yield _counter("schedguard_guard_requests", "requests", ["route", "status"], m.requests)
        rejections = dict(m.rejections)
        if m.server_rejections is not None:
            for code, count in m.server_rejections().items():
                rejections[(code,)] = rejections.get((code,), 0.0) + count
        yield _counter("schedguard_guard_rejections", "rejections", ["code"], rejections)
        yield _histogram("schedguard_guard_overhead_seconds", "overhead", m.overhead)
        yield _histograms(
            "schedguard_guard_upstream_latency_seconds", "upstream_latency", m.upstream_latency
        )
        yield _histograms("schedguard_guard_request_duration_seconds", "duration", m.duration)
        yield _counter("schedguard_guard_tokens", "tokens", ["tenant", "direction"], m.tokens)
        yield GaugeMetricFamily(
            "schedguard_guard_in_flight_requests", _HELP["in_flight"], value=m.in_flight
        )
        yield _histogram("schedguard_guard_queue_wait_seconds", "queue_wait", m.queue_wait)
        yield _histograms(
            "schedguard_guard_fair_wait_seconds", "fair_wait", m.fair_wait, label="tenant"
        )
        yield _counter("schedguard_guard_fair_work", "fair_work", ["tenant"], m.fair_work)
        queued = GaugeMetricFamily(
            "schedguard_guard_fair_queued_requests", _HELP["fair_queued"], labels=["tenant"]
        )
        if m.queued_by_tenant is not None:
            for tenant, count in sorted(m.queued_by_tenant().items()):
                queued.add_metric([tenant], count)
        yield queued
        if m.capacity is not None:
            limit, source = m.capacity()
            capacity = GaugeMetricFamily(
                "schedguard_guard_upstream_capacity", _HELP["capacity"], labels=["source"]
            )
            capacity.add_metric([source], limit)
            yield capacity
        yield _counter("schedguard_guard_upstream_aborts", "aborts", ["reason"], m.aborts)
        yield _counter(
            "schedguard_guard_upstream_streams_truncated",
            "truncated",
            ["route", "reason"],
            m.truncated,
        )
        checks = CounterMetricFamily(
            "schedguard_guard_check_seconds",
            "Total time spent in each step of the check pipeline (parse and each check).",
            labels=["check"],
        )
        for name, seconds in sorted(m.check_seconds.items()):
            checks.add_metric([name], seconds)
        yield checks
        for source, snapshot in sorted(m.sources.items()):
            yield from _limiter_families(source, snapshot())


# How a limiter's counters (exported by guard.app as "rate" and "concurrency") become series:
# counts of events, tokens and the state now each in a family of its own, so that no series
# adds requests to tokens or seconds. The concurrency limiter's total wait is left out: it is
# the sum of schedguard_guard_queue_wait_seconds already.
_LIMITER_PREFIX = {
    "rate": "schedguard_guard_rate_limit",
    "concurrency": "schedguard_guard_concurrency",
}
_LIMITER_TOKENS = {"tokens_reserved": "reserved", "tokens_refunded": "refunded",
                   "tokens_overshoot": "overshoot"}  # fmt: skip
_LIMITER_STATE = frozenset({"in_flight", "waiting"})
_LIMITER_LEFT_OUT = frozenset({"wait_seconds_total"})
_LIMITER_HELP = {
    "schedguard_guard_rate_limit_events": "Rate-limit decisions and failures, each one request "
    "or Redis operation: allowed, rejected_requests, rejected_tokens, rejected_oversize; "
    "fail_open, fail_closed (decided while Redis failed); backend_errors (Redis operations "
    "that failed), settle_errors (of them, settlements).",
    "schedguard_guard_rate_limit_tokens": "Tokens through the token buckets: reserved before "
    "forwarding, refunded after (reserved but not used), overshoot (used beyond the "
    "reservation).",
    "schedguard_guard_concurrency_events": "Concurrency-slot events, each one request: "
    "admitted, waited (admitted after queueing), queue_full, global_queue_full, timeout, "
    "global_timeout (refused), cancelled (the client left while queued).",
    "schedguard_guard_guided_compile_events": "The structured-output compile budget: "
    "constraints admitted cold (charged) or warm (exact repeats, free), charged_ms (estimated "
    "compile milliseconds charged to tenants), requests refused by a tenant's bucket "
    "(refused_budget), the compile pool (refused_pool) or the cold compiles per second "
    "(refused_rate), constraints the LRU forgot (evicted).",
    "schedguard_guard_concurrency_requests": "Requests holding a concurrency slot (in_flight) "
    "or waiting for one (waiting), now.",
}


def _limiter_families(source: str, snapshot: Mapping[str, float]) -> Iterator[Metric]:
    prefix = _LIMITER_PREFIX.get(source, f"schedguard_guard_{source}")

    def described(suffix: str) -> tuple[str, str]:
        name = f"{prefix}_{suffix}"
        return name, _LIMITER_HELP.get(name, f"{source}: {suffix}.")

    events = CounterMetricFamily(*described("events"), labels=["event"])
    tokens = CounterMetricFamily(*described("tokens"), labels=["kind"])
    state = GaugeMetricFamily(*described("requests"), labels=["state"])
    for name, value in sorted(snapshot.items()):
        if name in _LIMITER_TOKENS:
            tokens.add_metric([_LIMITER_TOKENS[name]], value)
        elif name in _LIMITER_STATE:
            state.add_metric([name], value)
        elif name not in _LIMITER_LEFT_OUT:
            events.add_metric([name], value)
    for family in (events, tokens, state):
        if family.samples:
            yield family


def _counter(
    name: str, help_key: str, labels: list[str], values: Mapping[tuple[str, ...], float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, _HELP[help_key], labels=labels)
    for label_values, value in sorted(values.items()):
        family.add_metric(list(label_values), value)
    return family


def _histogram(name: str, help_key: str, hist: Histogram) -> HistogramMetricFamily:
    out = HistogramMetricFamily(name, _HELP[help_key], labels=[])
    out.add_metric([], hist.buckets(), hist.total)
    return out


def _histograms(
    name: str, help_key: str, family: _Family, label: str = "route"
) -> HistogramMetricFamily:
    out = HistogramMetricFamily(name, _HELP[help_key], labels=[label])
    for label_values, hist in sorted(family.by_labels.items()):
        out.add_metric(list(label_values), hist.buckets(), hist.total)
    return out


class GuardMetrics:
    """Every series the guard exports; :meth:`render` is the ``/metrics`` body.

    ``multiprocess_dir``: the directory the workers of one server share (``--workers N``);
    this process's series are written there (:meth:`sync`, :meth:`close`) and a scrape merges
    every worker's."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, multiprocess_dir: str | None = None
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        own: list[Collector] = [_Exported(self)]
        if registry is None:
            # process_resident_memory_bytes, process_cpu_seconds_total etc.: the dashboard's
            # memory and CPU panels.
            own.append(ProcessCollector(registry=None))
        self.multiprocess_dir = multiprocess_dir
        self._files: FileExport | None = None
        if multiprocess_dir is None:
            for collector in own:
                self.registry.register(collector)
        else:
            self._files = FileExport(own, multiprocess_dir)
            MultiProcessCollector(self.registry, path=multiprocess_dir)  # type: ignore[no-untyped-call]
        self.requests: dict[tuple[str, ...], float] = {}
        self.rejections: dict[tuple[str, ...], float] = {}
        self.tokens: dict[tuple[str, ...], float] = {}
        self.aborts: dict[tuple[str, ...], float] = {}
        self.truncated: dict[tuple[str, ...], float] = {}
        self.overhead = Histogram(_OVERHEAD_BUCKETS)
        self.queue_wait = Histogram(_WAIT_BUCKETS)
        self.upstream_latency = _Family(_LATENCY_BUCKETS)
        self.duration = _Family(_LATENCY_BUCKETS)
        self.in_flight = 0
        self.check_seconds: dict[str, float] = {}
        self.sources: dict[str, Snapshot] = {}
        # Refusals made by the HTTP server before any app saw the request (431 heads).
        self.server_rejections: Snapshot | None = None
        # The fair queue: waits and work by tenant; the queue and the capacity read at scrape.
        self.fair_wait = _Family(_WAIT_BUCKETS)
        self.fair_work: dict[tuple[str, ...], float] = {}
        self.queued_by_tenant: Callable[[], dict[str, int]] | None = None
        self.capacity: Callable[[], tuple[int, str]] | None = None

    def slot_event(self, event: str, tenant: str, value: float) -> None:
        """The concurrency limiter's listener: waits and work of the requests let through."""
        if event == "admitted":
            self.fair_wait.labels(tenant).observe(value)
        elif event == "work":
            key = (tenant,)
            self.fair_work[key] = self.fair_work.get(key, 0.0) + value

    def request_done(self, route: str, status: int, duration_s: float) -> None:
        key = (route, str(status))
        self.requests[key] = self.requests.get(key, 0.0) + 1
        self.duration.labels(route).observe(duration_s)

    def rejected(self, code: str) -> None:
        key = (code,)
        self.rejections[key] = self.rejections.get(key, 0.0) + 1

    def upstream_answered(self, route: str, seconds: float) -> None:
        self.upstream_latency.labels(route).observe(seconds)

    def aborted(self, reason: str) -> None:
        key = (reason,)
        self.aborts[key] = self.aborts.get(key, 0.0) + 1

    def stream_truncated(self, route: str, reason: str) -> None:
        key = (route, reason)
        self.truncated[key] = self.truncated.get(key, 0.0) + 1

    def tokens_used(self, tenant: str, prompt: int, completion: int) -> None:
        tokens = self.tokens
        if prompt:
            key = (tenant, "in")
            tokens[key] = tokens.get(key, 0.0) + prompt
        if completion:
            key = (tenant, "out")
            tokens[key] = tokens.get(key, 0.0) + completion

    def checks_ran(self, durations: Mapping[str, float]) -> None:
        totals = self.check_seconds
        for name, seconds in durations.items():
            totals[name] = totals.get(name, 0.0) + seconds

    def export(self, name: str, snapshot: Snapshot) -> None:
        """Export a component's own counters (``snapshot()`` -> name: value) at scrape time."""
        self.sources[name] = snapshot

    def sync(self) -> None:
        """With workers: copy this process's series into its files (the app does every
        :data:`SYNC_INTERVAL_S`)."""
        if self._files is not None:
            self._files.sync()

    def close(self) -> None:
        """With workers: a last sync, and this process's live gauges leave the merge."""
        if self._files is not None:
            self._files.close()
            self._files = None

    def render(self) -> bytes:
        if self._files is not None and self.multiprocess_dir is not None:
            self._files.sync()  # this worker's numbers as they are now
            forget_dead_workers(self.multiprocess_dir)
        return generate_latest(self.registry)
