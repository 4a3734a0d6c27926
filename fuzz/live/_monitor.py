"""What a live server costs, seen from outside: its resident memory and whether it is alive.

:class:`RssMonitor` samples the resident set of the given processes with their children (vLLM
serves from an API process with an engine-core child and a worker: all of them count), and/or
the ``process_resident_memory_bytes`` a Prometheus endpoint reports, in a background thread,
so a peak during a long request is seen even when it is gone by the answer.
:meth:`RssMonitor.mark` and :meth:`RssMonitor.growth_since` give one request's peak growth.

:class:`Health` asks the server's health endpoint (``/health``, or ``/v1/models`` for servers
without one, found at start) whether it is alive, and waits for it to come back.
"""

from __future__ import annotations

import bisect
import contextlib
import threading
import time
from collections.abc import Sequence

import psutil

from fuzz.live._http import HttpClient

__all__ = ["HEALTH_PATHS", "Health", "RssMonitor", "parse_prometheus_rss"]

HEALTH_PATHS: tuple[str, ...] = ("/health", "/healthz", "/v1/models")
_METRIC = "process_resident_memory_bytes"
_CHILDREN_EVERY_S = 1.0
_METRICS_EVERY_S = 0.5


def parse_prometheus_rss(text: str) -> int | None:
    """The sum of every ``process_resident_memory_bytes`` sample in a Prometheus text page
    (several processes may report one each), or None when there is none."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if not line.startswith(_METRIC) or line.startswith("#"):
            continue
        name_end = len(_METRIC)
        if len(line) > name_end and line[name_end] not in " {":
            continue  # another metric with this prefix
        value = line.rsplit("}", 1)[-1].split() if "{" in line else line.split()[1:]
        try:
            total += float(value[0])
            found = True
        except (ValueError, IndexError):
            continue
    return int(total) if found else None


class RssMonitor:
    """Resident memory of ``pids`` (children included) plus what ``metrics`` reports.

    ``interval_s``: the sampling period of the background thread. ``alive()`` is False once a
    watched process is gone (a server that died). With neither pids nor metrics the monitor
    measures nothing and every growth is 0.
    """

    def __init__(
        self,
        pids: Sequence[int] = (),
        metrics: HttpClient | None = None,
        metrics_path: str = "",
        *,
        interval_s: float = 0.05,
        horizon_s: float = 600.0,
    ) -> None:
        self.pids = list(pids)
        self.metrics = metrics
        self.metrics_path = metrics_path
        self.interval_s = interval_s
        self._procs: dict[int, psutil.Process] = {}
        self._gone: set[int] = set()
        self._children_at = 0.0
        self._metrics_at = 0.0
        self._metrics_rss = 0
        self._lock = threading.Lock()
        # Samples of the last ``horizon_s`` seconds (a request's window is within them).
        self.horizon_s = horizon_s
        self._times: list[float] = []
        self._values: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak = 0
        for pid in self.pids:
            self._procs[pid] = psutil.Process(pid)  # NoSuchProcess: the caller's error

    @property
    def enabled(self) -> bool:
        return bool(self.pids) or self.metrics is not None

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="rss-monitor", daemon=True)
        self._thread.start()

    def rebind(self, pids: Sequence[int]) -> None:
        """Watch ``pids`` instead (a restarted server has new processes)."""
        with self._lock:
            self.pids = list(pids)
            self._procs = {}
            self._gone = set()
            self._children_at = 0.0
            for pid in self.pids:
                with contextlib.suppress(psutil.Error):
                    self._procs[pid] = psutil.Process(pid)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # a sampler error must not stop the campaign
                self.sample()

    # ---------------------------------------------------------------------------- sampling

    def alive(self) -> bool:
        """Whether every watched process still exists (True when none are watched)."""
        for pid, proc in list(self._procs.items()):
            if pid in self._gone:
                return False
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                self._gone.add(pid)
                return False
        return True

    def _process_rss(self) -> int:
        now = time.monotonic()
        if now - self._children_at > _CHILDREN_EVERY_S:
            self._children_at = now
            for pid in self.pids:
                parent = self._procs.get(pid)
                if parent is None:
                    continue
                try:
                    kids = parent.children(recursive=True)
                except psutil.Error:
                    continue
                for kid in kids:
                    self._procs.setdefault(kid.pid, kid)
        total = 0
        for pid, proc in list(self._procs.items()):
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                if pid in self.pids:
                    self._gone.add(pid)
                else:
                    self._procs.pop(pid, None)  # a child that ended
        return total

    def _metrics_rss_now(self) -> int:
        if self.metrics is None:
            return 0
        now = time.monotonic()
        if now - self._metrics_at >= _METRICS_EVERY_S:
            self._metrics_at = now
            reply = self.metrics.get(self.metrics_path, timeout_s=5.0)
            if reply.status == 200:
                value = parse_prometheus_rss(reply.body.decode("utf-8", "replace"))
                if value is not None:
                    self._metrics_rss = value
        return self._metrics_rss

    def sample(self) -> int:
        """Measure now; returns the total resident bytes (0 when nothing is watched)."""
        if not self.enabled:
            return 0
        with self._lock:
            value = self._process_rss() + self._metrics_rss_now()
            now = time.monotonic()
            self._times.append(now)
            self._values.append(value)
            if len(self._times) > 4096 and self._times[0] < now - self.horizon_s:
                cut = bisect.bisect_left(self._times, now - self.horizon_s)
                del self._times[:cut], self._values[:cut]
            self.peak = max(self.peak, value)
            return value

    def current(self) -> int:
        with self._lock:
            return self._values[-1] if self._values else 0

    def mark(self) -> tuple[float, int]:
        """The start of a request: (time, resident bytes now)."""
        value = self.sample()
        return time.monotonic(), value

    def growth_since(self, mark: tuple[float, int]) -> int:
        """Peak resident bytes since ``mark`` (a sample is taken now) minus those at ``mark``."""
        if not self.enabled:
            return 0
        self.sample()
        since, base = mark
        with self._lock:
            i = bisect.bisect_left(self._times, since)
            peak = max(self._values[i:], default=base)
        return max(0, peak - base)


class Health:
    """Liveness through the server's health endpoint. ``path`` None: the first of
    :data:`HEALTH_PATHS` that answers 200 when :meth:`detect` is called."""

    def __init__(self, client: HttpClient, path: str | None = None, *, timeout_s: float = 10.0):
        self.client = client
        self.path = path
        self.timeout_s = timeout_s
        self.checks = 0

    def detect(self) -> bool:
        """Find the health path (when not given) and say whether the server is up."""
        if self.path is not None:
            return self.ok()
        for path in HEALTH_PATHS:
            reply = self.client.get(path, timeout_s=self.timeout_s)
            self.checks += 1
            if reply.status == 200:
                self.path = path
                return True
            if reply.status is None:
                return False
        return False

    def ok(self) -> bool:
        if self.path is None:
            return self.detect()
        self.checks += 1
        return self.client.get(self.path, timeout_s=self.timeout_s).status == 200

    def wait(self, timeout_s: float, *, every_s: float = 0.5) -> bool:
        """Poll until the server is up again or ``timeout_s`` has passed."""
        end = time.monotonic() + timeout_s
        while True:
            if self.ok():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(every_s)
