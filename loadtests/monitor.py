"""Watch the guard and the upstream during a run: RSS (psutil, with the kernel's high-water
mark so short peaks are not missed) over time, liveness, and the guard's ``/metrics``
(rejections by code, requests in flight; the rejection counters after each scrape, for the
report's rejections over time).

Driven by the caller (the locustfile calls :meth:`Monitor.sample` from a greenlet every
``sample_interval_s``, and :meth:`Monitor.scrape` every ``scrape_every`` samples); nothing here
starts a thread. :meth:`Monitor.periods` says how often both actually happened (a busy load
generator samples later than asked), which the report states. A server's memory is read from its
pid when known (it runs here: ``schedguard load`` started it, or ``--guard-pid`` /
``--upstream-pid`` named it), else from its Prometheus ``/metrics`` when one is given
(``process_resident_memory_bytes``, summed over the processes that export it: the guard's,
vLLM's API server), else it is unknown.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from guard.isolation import PeakRssSampler

__all__ = ["GuardMetricsSnapshot", "Monitor", "Watched", "parse_guard_metrics", "resident_bytes"]

REJECTIONS = "schedguard_guard_rejections"
RESIDENT = "process_resident_memory_bytes"
IN_FLIGHT = "schedguard_guard_in_flight_requests"
# Memory series are thinned to at most this many points (the slope needs the shape, not every
# sample; a 10-minute soak at 1 Hz is 600).
_MAX_POINTS = 4000
_SNAPSHOT_POINTS = 600  # the dashboard's chart


@dataclass
class GuardMetricsSnapshot:
    rejections: dict[str, float] = field(default_factory=dict)
    in_flight: float | None = None


def parse_guard_metrics(text: str) -> GuardMetricsSnapshot:
    """Rejections by code and requests in flight from the guard's Prometheus text."""
    snap = GuardMetricsSnapshot()
    for family in text_string_to_metric_families(text):
        if family.name == REJECTIONS:
            for s in family.samples:
                if s.name.endswith("_total"):
                    code = s.labels.get("code", "")
                    snap.rejections[code] = snap.rejections.get(code, 0.0) + s.value
        elif family.name == IN_FLIGHT:
            for s in family.samples:
                snap.in_flight = s.value
    return snap


def resident_bytes(text: str) -> int | None:
    """``process_resident_memory_bytes`` of a Prometheus text, summed over its samples (one
    per process that exports it); None when it has none."""
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == RESIDENT
    ]
    return int(sum(values)) if values else None


class Watched:
    """One server: current and peak RSS, from its pid (itself and its children, alive or not)
    or, without one, from its ``/metrics`` (``metrics_url``)."""

    def __init__(self, name: str, pid: int | None, metrics_url: str | None = None) -> None:
        self.name = name
        self.pid = pid
        self.sampler = PeakRssSampler(pid, include_children=True) if pid else None
        self.metrics_url = None if pid else metrics_url
        self.metrics_peak: int | None = None
        self.metrics_error: str | None = None
        self.series: list[tuple[float, int]] = []
        self.current = 0
        self.died_at: float | None = None  # seconds into the run it was first seen gone
        self._stride = 1
        self._seen = 0

    @property
    def peak(self) -> int | None:
        if self.sampler is not None:
            return self.sampler.peak_bytes
        return self.metrics_peak

    @property
    def source(self) -> str | None:
        """Where the memory comes from: ``pid N``, the metrics URL, or None (unknown)."""
        if self.pid:
            return f"pid {self.pid}"
        return self.metrics_url

    def alive(self) -> bool | None:
        if self.pid is None:
            return None
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def sample(self, t: float, timeout_s: float = 2.0) -> None:
        if self.sampler is None:
            if self.metrics_url is not None:
                self._sample_metrics(t, timeout_s)
            return
        if not self.alive():
            self.current = 0
            if self.died_at is None:
                self.died_at = t
            return
        self.current = self.sampler.current_bytes()
        self.sampler.sample_now()
        self._record(t)

    def _sample_metrics(self, t: float, timeout_s: float) -> None:
        assert self.metrics_url is not None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as resp:
                rss = resident_bytes(resp.read().decode("utf-8", "replace"))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.metrics_error = f"{type(exc).__name__}: {exc}"[:200]
            return
        if rss is None:
            self.metrics_error = f"no {RESIDENT} in {self.metrics_url}"
            return
        self.metrics_error = None
        self.current = rss
        # Sampled, not the kernel's high-water mark: a spike between two scrapes is not seen.
        self.metrics_peak = max(rss, self.metrics_peak or 0)
        self._record(t)

    def _record(self, t: float) -> None:
        self._seen += 1
        if self._seen % self._stride == 0:
            self.series.append((t, self.current))
            if len(self.series) > _MAX_POINTS:
                self.series = self.series[::2]
                self._stride *= 2


class _Cadence:
    """How often something actually happened: the median gap between two times (the extra
    sample taken when the test stops, moments after the last one, does not move it)."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.gaps: collections.deque[float] = collections.deque(maxlen=_MAX_POINTS)

    def tick(self, t: float) -> None:
        if self.last is not None:
            self.gaps.append(t - self.last)
        self.last = t

    def median_gap(self) -> float | None:
        return statistics.median(self.gaps) if self.gaps else None


class Monitor:
    """The servers under test, sampled on demand."""

    def __init__(
        self,
        *,
        sample_interval_s: float = 1.0,
        scrape_every: int = 2,
        guard_pid: int | None = None,
        upstream_pid: int | None = None,
        guard_url: str | None = None,
        upstream_url: str | None = None,
        upstream_health_path: str = "/health",
        guard_metrics_url: str | None = None,
        upstream_metrics_url: str | None = None,
    ) -> None:
        self.guard = Watched("guard", guard_pid, guard_metrics_url)
        self.upstream = Watched("upstream", upstream_pid, upstream_metrics_url)
        self.guard_url = guard_url.rstrip("/") if guard_url else None
        self.upstream_url = upstream_url.rstrip("/") if upstream_url else None
        self.upstream_health_path = upstream_health_path
        self.metrics = GuardMetricsSnapshot()
        self.metrics_error: str | None = None
        # The guard's rejection counters after each scrape: (seconds, {code: total}).
        self.rejection_series: list[tuple[float, dict[str, float]]] = []
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.sample_interval_s = sample_interval_s
        self.scrape_every = max(1, scrape_every)  # /metrics every this many samples
        self._samples = _Cadence()
        self._scrapes = _Cadence()

    def periods(self) -> dict[str, float]:
        """Seconds between RSS samples and between /metrics scrapes: as measured when there
        were two or more, as asked otherwise (``*_asked_s``)."""
        out = {
            "rss_asked_s": self.sample_interval_s,
            "metrics_asked_s": self.sample_interval_s * self.scrape_every,
        }
        for name, cadence in (("rss_s", self._samples), ("metrics_s", self._scrapes)):
            gap = cadence.median_gap()
            if gap is not None:
                out[name] = round(gap, 3)
        return out

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def wall(self, t: float) -> float:
        """The epoch time of ``t`` seconds into the monitor's life (the series' time base)."""
        return self.started_wall + t

    def sample(self) -> None:
        t = self.elapsed()
        self._samples.tick(t)
        self.guard.sample(t)
        self.upstream.sample(t)

    def scrape(self, timeout_s: float = 2.0) -> GuardMetricsSnapshot:
        if self.guard_url is None:
            return self.metrics
        try:
            with urllib.request.urlopen(self.guard_url + "/metrics", timeout=timeout_s) as resp:
                self.metrics = parse_guard_metrics(resp.read().decode("utf-8", "replace"))
                self.metrics_error = None
            t = self.elapsed()
            self._scrapes.tick(t)
            self.rejection_series.append((t, dict(self.metrics.rejections)))
            if len(self.rejection_series) > _MAX_POINTS:
                self.rejection_series = self.rejection_series[::2]
        except (OSError, urllib.error.URLError, ValueError) as exc:
            self.metrics_error = f"{type(exc).__name__}: {exc}"[:200]
        return self.metrics

    def upstream_health(self, timeout_s: float = 3.0) -> tuple[bool | None, str]:
        """(healthy, description): the process alive (when its pid is known) and its health
        endpoint answering 200 within ``timeout_s``."""
        alive = self.upstream.alive()
        if alive is False:
            died = self.upstream.died_at
            return False, "process gone" + (
                f" ({died:.1f} s into the run)" if died is not None else ""
            )
        if self.upstream_url is None:
            return alive, "alive" if alive else "unknown"
        url = self.upstream_url + self.upstream_health_path
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                if resp.status == 200:
                    return True, "alive, health 200"
                return False, f"health answered {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"health answered {exc.code}"
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            return False, f"health check failed: {reason}"[:200]

    def snapshot(self) -> dict[str, Any]:
        """What the dashboard shows."""
        out: dict[str, Any] = {"elapsed_s": round(self.elapsed(), 1)}
        for w in (self.guard, self.upstream):
            out[w.name] = {
                "pid": w.pid,
                "rss_source": w.source,
                "rss_mb": round(w.current / (1 << 20), 1) if w.peak is not None else None,
                "peak_rss_mb": None if w.peak is None else round(w.peak / (1 << 20), 1),
                "alive": w.alive(),
                "died_at_s": w.died_at,
                # The whole run, thinned: the chart's time axis starts at 0.
                "series": [
                    (round(t, 1), round(b / (1 << 20), 1))
                    for t, b in w.series[:: max(1, len(w.series) // _SNAPSHOT_POINTS)]
                ],
            }
        out["rejections"] = dict(sorted(self.metrics.rejections.items(), key=lambda kv: -kv[1]))
        out["in_flight"] = self.metrics.in_flight
        out["metrics_error"] = self.metrics_error
        return out

    def close(self) -> None:
        for w in (self.guard, self.upstream):
            if w.sampler is not None:
                with contextlib.suppress(Exception):
                    w.sampler.stop()
