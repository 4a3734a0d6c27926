"""The run over time, for the HTML report (:mod:`loadtests.report`).

Two sources, one file (``timeline.json``):

- per-second buckets of what the users saw, filled where the users run (on each worker in
  distributed mode, drained into its stats reports and merged on the master, like the tally):
  the ok/failed count of each request type (``BENIGN``, ``TTFT``, ``ITL``, ``LOOKALIKE``,
  ``ATTACK``) and the latency histogram of its successful requests (a request refused in 1 ms
  because the upstream died is an error, not a fast answer); every attack request's answer as
  a record of :mod:`loadtests.outcomes` (``attack``: class, intent, status and code), and each
  flood burst stopped by a limit or not (``flood burst``);
- the master's samples: users by class, guard and upstream RSS, and the guard's rejection
  counters from its ``/metrics`` (cumulative, by code), with the periods the monitor sampled
  and scraped at.

Buckets are keyed by the wall-clock second (``int(time.time())``) as text, so workers need not
know when the run started and msgpack carries them as they are; times of the samples are
seconds since the epoch too. :func:`build` writes everything relative to the run's start
(``t0``). Plain Python: locust is not imported here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtests import outcomes

__all__ = [
    "ATTACKS",
    "BURSTS",
    "KINDS",
    "VERSION",
    "Timeline",
    "attack_records",
    "bucket_ms",
    "build",
    "burst_records",
    "write",
]

# 2: attack answers as outcomes records (``attack``, ``flood burst``) instead of bare
# status labels (``outcome``), and the sampling periods.
VERSION = 2
KINDS = ("BENIGN", "TTFT", "ITL", "LOOKALIKE", "ATTACK")
ATTACKS = "attack"
BURSTS = "flood burst"
Buckets = dict[str, dict[str, dict[str, int]]]
# Master-side samples are thinned (every other one dropped) past this many points.
_MAX_SAMPLES = 4000


def bucket_ms(ms: float) -> int:
    """Locust's rounding of a response time (two significant digits past 100 ms), which keeps
    a second's histogram to a few keys."""
    if ms < 100:
        return round(ms)
    if ms < 1000:
        return int(round(ms, -1))
    if ms < 10000:
        return int(round(ms, -2))
    return int(round(ms, -3))


class Timeline:
    """Per-second buckets (:data:`Buckets`: second -> series -> label -> count) and the
    master's samples."""

    def __init__(self) -> None:
        self.buckets: Buckets = {}
        self.users: list[tuple[float, dict[str, int]]] = []

    def _series(self, when: float, series: str) -> dict[str, int]:
        bucket = self.buckets.setdefault(str(int(when)), {})
        return bucket.setdefault(series, {})

    def request(self, when: float, kind: str, ms: float, failed: bool) -> None:
        if not failed:
            hist = self._series(when, f"lat {kind}")
            key = str(bucket_ms(ms))
            hist[key] = hist.get(key, 0) + 1
        counts = self._series(when, f"req {kind}")
        key = "fail" if failed else "ok"
        counts[key] = counts.get(key, 0) + 1

    def attack(self, when: float, record: str, n: int = 1) -> None:
        """An attack request's answer: an :func:`loadtests.outcomes.key`."""
        counts = self._series(when, ATTACKS)
        counts[record] = counts.get(record, 0) + n

    def count(self, when: float, series: str, label: str, n: int = 1) -> None:
        """``n`` more of ``label`` in ``series`` (e.g. :mod:`loadtests.fairshare`'s records)."""
        counts = self._series(when, series)
        counts[label] = counts.get(label, 0) + n

    def latency(self, when: float, series: str, ms: float) -> None:
        """One latency in the histogram ``series`` (locust's rounding, :func:`bucket_ms`)."""
        self.count(when, series, str(bucket_ms(ms)))

    def burst(self, when: float, stopped: bool) -> None:
        counts = self._series(when, BURSTS)
        label = outcomes.BURST_STOPPED if stopped else outcomes.BURST_THROUGH
        counts[label] = counts.get(label, 0) + 1

    def drain(self) -> Buckets:
        """The buckets so far, emptied (a worker sends them with its stats report)."""
        out, self.buckets = self.buckets, {}
        return out

    def merge(self, buckets: Mapping[str, Mapping[str, Mapping[str, int]]]) -> None:
        for second, bucket in buckets.items():
            mine = self.buckets.setdefault(str(second), {})
            for series, counts in bucket.items():
                target = mine.setdefault(series, {})
                for label, n in counts.items():
                    target[label] = target.get(label, 0) + int(n)

    def sample_users(self, when: float, by_class: Mapping[str, int]) -> None:
        self.users.append((when, dict(by_class)))
        if len(self.users) > _MAX_SAMPLES:
            self.users = self.users[::2]


def _relative(points: Iterable[tuple[float, Any]], t0: float) -> list[list[Any]]:
    return [[round(t - t0, 2), v] for t, v in points]


def build(
    timeline: Timeline,
    *,
    t0: float,
    end: float,
    rss: Mapping[str, Sequence[tuple[float, int]]] | None = None,
    rejections: Sequence[tuple[float, Mapping[str, float]]] = (),
    died: Mapping[str, float] | None = None,
    periods: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """``timeline.json``'s content: times in seconds since ``t0`` (the test's start), buckets
    keyed by that offset, RSS in MB. ``rss``, ``rejections`` and ``died`` (when a server was
    first seen gone) carry epoch times; ``periods`` the monitor's (``rss_s``, ``metrics_s``)."""
    buckets = {
        str(int(second) - int(t0)): bucket
        for second, bucket in sorted(timeline.buckets.items(), key=lambda kv: int(kv[0]))
    }
    return {
        "version": VERSION,
        "t0": round(t0, 3),
        "duration_s": round(max(0.0, end - t0), 2),
        "buckets": buckets,
        "users": _relative(timeline.users, t0),
        "rss_mb": {
            name: [[round(t - t0, 2), round(b / (1 << 20), 2)] for t, b in series]
            for name, series in sorted((rss or {}).items())
            if series
        },
        "guard_rejections": _relative(((t, dict(sorted(c.items()))) for t, c in rejections), t0),
        "died_s": {name: round(t - t0, 2) for name, t in sorted((died or {}).items())},
        "periods_s": dict(sorted((periods or {}).items())),
    }


def attack_records(buckets: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, int]:
    """Every attack record of the run, summed over its seconds (the gate's input)."""
    out: dict[str, int] = {}
    for bucket in buckets.values():
        for record, n in (bucket.get(ATTACKS) or {}).items():
            out[record] = out.get(record, 0) + int(n)
    return out


def burst_records(buckets: Mapping[str, Mapping[str, Mapping[str, int]]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for bucket in buckets.values():
        for label, n in (bucket.get(BURSTS) or {}).items():
            out[label] = out.get(label, 0) + int(n)
    return out


def write(path: str | Path, data: Mapping[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
