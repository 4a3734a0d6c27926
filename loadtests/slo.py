"""The SLO gate of a load run: measured numbers in, a table and a pass/fail verdict out.

Plain data and arithmetic (no locust import): the locustfile fills a :class:`RunData` from
locust's stats and the resource monitor when the test stops, and sets the process exit code
from :attr:`Report.passed`.

Checks (thresholds in :class:`Thresholds`, all configurable):

- benign p99 latency (the full response) <= ``p99_ms``;
- benign errors (synthetic traffic and corpus look-alikes) <= ``max_benign_errors`` (0);
- attacks stopped by content checks: of the content attacks' requests the checks judged, the
  share a content check refused >= ``min_attack_rejected`` (all of them). A request a budget,
  rate or concurrency limit refused first was never judged: it is counted apart, neither
  contained nor through (:mod:`loadtests.outcomes`); when every one was, the check fails
  (nothing was shown about the checks);
- floods stopped by a limit: the share of flood bursts a limit refused at least one request
  of >= ``min_attack_rejected`` (a limit is what a flood of valid requests is meant to meet;
  the requests served before it are expected);
- peak RSS of the guard <= ``max_guard_rss_mb``, of the upstream <= ``max_upstream_rss_mb``;
- the upstream alive and answering its health check at the end;
- with a baseline run: benign p99 <= ``max_p99_ratio`` x the baseline's;
- optionally, the RSS slope of guard and upstream <= ``max_rss_slope_mb_per_min`` (soaks),
  judged only over at least :data:`MIN_SLOPE_S` seconds of samples (skipped as too short
  otherwise: a slope over the warm-up measures the warm-up).

A check without data (no guard in front, a remote target without pids) is skipped, not
passed: the table says so.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from loadtests import outcomes

__all__ = [
    "MIN_SLOPE_S",
    "Check",
    "Report",
    "RunData",
    "Thresholds",
    "benign_errors",
    "evaluate",
    "load_baseline_p99",
    "percentile",
    "render_table",
    "rss_slope_mb_per_min",
    "too_short",
]

MB = 1 << 20
Status = Literal["pass", "fail", "skip"]
# Samples from the first part of a run are left out of the slope: caches, pools and the
# allocator's arenas fill then (a third of the run, at least 30 s).
_WARMUP_S = 30.0
_WARMUP_FRACTION = 1 / 3
_SERIES_POINTS = 240
_SLOPE_POINTS = 200  # Theil-Sen is quadratic in the points
# The shortest sampled span whose slope is judged: the warm-up (30 s at least) is left out, and
# what is left must span long enough that a one-off step is not read as a trend.
MIN_SLOPE_S = 120.0


@dataclass(frozen=True)
class Thresholds:
    p99_ms: float = 8000.0
    max_benign_errors: int = 0
    min_attack_rejected: float = 1.0
    max_guard_rss_mb: float | None = 150.0
    max_upstream_rss_mb: float | None = 512.0
    require_upstream_alive: bool = True
    max_p99_ratio: float = 1.5
    baseline_p99_ms: float | None = None
    max_rss_slope_mb_per_min: float | None = None


@dataclass
class RunData:
    """What a run measured. Histograms map a latency in ms (locust's rounding) to a count."""

    duration_s: float = 0.0
    benign_latency_ms: dict[int, int] = field(default_factory=dict)
    benign_requests: int = 0
    benign_failures: int = 0
    lookalike_requests: int = 0
    lookalike_failures: int = 0
    ttft_ms: dict[int, int] = field(default_factory=dict)
    itl_ms: dict[int, int] = field(default_factory=dict)
    # outcomes.key -> count, and flood bursts (outcomes.BURST_STOPPED / BURST_THROUGH) -> count
    attack_records: dict[str, int] = field(default_factory=dict)
    flood_bursts: dict[str, int] = field(default_factory=dict)
    attack_failures: list[str] = field(default_factory=list)
    benign_failure_samples: list[str] = field(default_factory=list)
    guard_peak_rss: int | None = None
    upstream_peak_rss: int | None = None
    upstream_alive: bool | None = None
    upstream_status: str = ""
    guard_rejections: dict[str, float] = field(default_factory=dict)
    client_codes: dict[str, int] = field(default_factory=dict)
    rss_series: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Check:
    name: str
    threshold: str
    measured: str
    status: Status


@dataclass
class Report:
    checks: list[Check]
    numbers: dict[str, Any]
    thresholds: Thresholds = field(default_factory=Thresholds)

    @property
    def passed(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "checks": [asdict(c) for c in self.checks],
            "numbers": self.numbers,
            "thresholds": asdict(self.thresholds),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Report:
        """Inverse of :meth:`to_dict` (``passed`` is recomputed from the checks)."""
        checks = [
            Check(c["name"], c["threshold"], c["measured"], c["status"]) for c in data["checks"]
        ]
        th = Thresholds(**data["thresholds"]) if "thresholds" in data else Thresholds()
        return cls(checks, dict(data.get("numbers", {})), th)

    def with_peak_rss(self, server: str, peak_bytes: int) -> Report:
        """Raise ``server``'s peak RSS to ``peak_bytes`` if that is higher (a finer sampler,
        e.g. ``schedguard load``'s, saw a spike the run's sampler missed: a process that died
        of memory between two samples), re-judging its check."""
        if server not in ("guard", "upstream"):
            raise ValueError(f"no peak RSS check for {server!r}")
        key = f"{server}_peak_rss_mb"
        known = self.numbers.get(key)
        if known is not None and peak_bytes / MB <= known:
            return self
        limit = (
            self.thresholds.max_guard_rss_mb
            if server == "guard"
            else self.thresholds.max_upstream_rss_mb
        )
        check = _peak_rss_check(server, peak_bytes, limit)
        numbers = {**self.numbers, key: round(peak_bytes / MB, 1)}
        checks = [check if c.name == check.name else c for c in self.checks]
        return Report(checks, numbers, self.thresholds)

    def write_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")


def percentile(hist: Mapping[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a latency histogram (nearest rank); ``None`` if empty."""
    total = sum(hist.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    seen = 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= rank:
            return float(value)
    return float(max(hist))


def rss_slope_mb_per_min(series: Sequence[tuple[float, int]]) -> float | None:
    """The growth of RSS after the warm-up, in MB per minute: the Theil-Sen estimate (median of
    the slopes between every two samples), which a one-off step (an allocator arena growing
    once) barely moves while a leak's steady growth shows in full."""
    if len(series) < 3:
        return None
    t_end = series[-1][0]
    start = max(_WARMUP_S, _WARMUP_FRACTION * t_end)
    points = [(t, rss) for t, rss in series if t >= start]
    if len(points) < 3:
        points = list(series)
    step = max(1, len(points) // _SLOPE_POINTS)
    points = points[::step]
    slopes = sorted(
        (r2 - r1) / (t2 - t1)
        for i, (t1, r1) in enumerate(points)
        for t2, r2 in points[i + 1 :]
        if t2 > t1
    )
    if not slopes:
        return None
    mid = len(slopes) // 2
    median = slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2
    return median * 60.0 / MB


def load_baseline_p99(path: str | Path) -> float:
    """The benign p99 (ms) of an earlier run's report (``slo.json`` or ``report.json``)."""
    data = json.loads(Path(path).read_text())
    value = data.get("numbers", {}).get("benign_p99_ms")
    if not isinstance(value, int | float):
        raise ValueError(f"{path}: no numbers.benign_p99_ms in this report")
    return float(value)


def _mb(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MB:.1f} MB"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f} ms"


def _limit(name: str, measured: float | None, limit: float | None, text: str, shown: str) -> Check:
    if limit is None:
        return Check(name, "-", shown, "skip")
    if measured is None:
        return Check(name, text, shown, "skip")
    return Check(name, text, shown, "pass" if measured <= limit else "fail")


def evaluate(data: RunData, th: Thresholds) -> Report:
    p99 = percentile(data.benign_latency_ms, 0.99)
    ratio = _p99_ratio(p99, th)
    spans = {name: _span(s) for name, s in sorted(data.rss_series.items())}
    slopes = {
        name: rss_slope_mb_per_min(s) if spans[name] >= MIN_SLOPE_S else None
        for name, s in sorted(data.rss_series.items())
    }
    attacks = outcomes.summarize(data.attack_records, data.flood_bursts)
    checks = [
        _p99_check(p99, th),
        _benign_errors_check(data, th),
        _content_attacks_check(attacks, th),
        _floods_check(attacks, th),
        *_peak_rss_checks(data, th),
        _upstream_alive_check(data, th),
    ]
    if ratio is not None:
        checks.append(_p99_ratio_check(p99, ratio, th))
    checks.extend(_rss_slope_checks(slopes, spans, th))
    return Report(checks, _numbers(data, p99, ratio, slopes, spans, attacks), th)


def _span(series: Sequence[tuple[float, int]]) -> float:
    return series[-1][0] - series[0][0] if series else 0.0


def _p99_ratio(p99: float | None, th: Thresholds) -> float | None:
    """The benign p99 over the baseline's, when there is a baseline to divide by."""
    if th.baseline_p99_ms is not None and p99 is not None and th.baseline_p99_ms > 0:
        return p99 / th.baseline_p99_ms
    return None


def _p99_check(p99: float | None, th: Thresholds) -> Check:
    check = _limit("benign p99 latency", p99, th.p99_ms, f"<= {th.p99_ms:.0f} ms", _ms(p99))
    if p99 is None:
        return Check(check.name, check.threshold, "no benign requests", "fail")
    return check


def benign_errors(data: RunData) -> tuple[int, int]:
    """(failed, sent) of the benign traffic: the synthetic requests and the look-alikes."""
    return (
        data.benign_failures + data.lookalike_failures,
        data.benign_requests + data.lookalike_requests,
    )


def _benign_errors_check(data: RunData, th: Thresholds) -> Check:
    errors, total = benign_errors(data)
    return Check(
        "benign errors",
        f"<= {th.max_benign_errors}",
        f"{errors} of {total} ({data.benign_requests} synthetic, "
        f"{data.lookalike_requests} look-alikes)",
        "pass" if errors <= th.max_benign_errors else "fail",
    )


CONTENT_CHECK = "attacks stopped by content checks"
FLOOD_CHECK = "floods stopped by a limit"


def _content_attacks_check(attacks: outcomes.AttackCounts, th: Thresholds) -> Check:
    threshold = f">= {th.min_attack_rejected:.0%} of those judged"
    if not attacks.content_sent:
        return Check(CONTENT_CHECK, threshold, "none sent", "skip")
    judged, stopped, limited = (
        attacks.content_judged,
        attacks.content_stopped,
        attacks.content_limited,
    )
    aside = f"; {limited} refused by a limit first, not judged" if limited else ""
    if not judged:
        return Check(CONTENT_CHECK, threshold, f"none reached the checks{aside}", "fail")
    share = stopped / judged
    return Check(
        CONTENT_CHECK,
        threshold,
        f"{share:.1%} ({stopped}/{judged}){aside}",
        "pass" if share >= th.min_attack_rejected else "fail",
    )


def _floods_check(attacks: outcomes.AttackCounts, th: Thresholds) -> Check:
    threshold = f">= {th.min_attack_rejected:.0%} of bursts"
    if not attacks.bursts:
        return Check(FLOOD_CHECK, threshold, "none sent", "skip")
    share = attacks.bursts_stopped / attacks.bursts
    return Check(
        FLOOD_CHECK,
        threshold,
        f"{share:.1%} ({attacks.bursts_stopped}/{attacks.bursts} bursts)",
        "pass" if share >= th.min_attack_rejected else "fail",
    )


def _peak_rss_checks(data: RunData, th: Thresholds) -> list[Check]:
    """The guard's and the upstream's peak RSS against their limits."""
    return [
        _peak_rss_check(server, peak, limit)
        for server, peak, limit in (
            ("guard", data.guard_peak_rss, th.max_guard_rss_mb),
            ("upstream", data.upstream_peak_rss, th.max_upstream_rss_mb),
        )
    ]


def _peak_rss_check(server: str, peak: int | None, limit: float | None) -> Check:
    return _limit(
        f"{server} peak RSS",
        None if peak is None else peak / MB,
        limit,
        f"<= {limit:.0f} MB" if limit is not None else "-",
        _mb(peak),
    )


def _upstream_alive_check(data: RunData, th: Thresholds) -> Check:
    if not th.require_upstream_alive:
        return Check("upstream healthy at end", "-", data.upstream_status or "-", "skip")
    if data.upstream_alive is None:
        return Check("upstream healthy at end", "yes", "unknown", "skip")
    return Check(
        "upstream healthy at end",
        "yes",
        data.upstream_status or ("yes" if data.upstream_alive else "no"),
        "pass" if data.upstream_alive else "fail",
    )


def _p99_ratio_check(p99: float | None, ratio: float, th: Thresholds) -> Check:
    return Check(
        "benign p99 / baseline",
        f"<= {th.max_p99_ratio:.2f}x",
        f"{ratio:.2f}x ({_ms(p99)} / {_ms(th.baseline_p99_ms)})",
        "pass" if ratio <= th.max_p99_ratio else "fail",
    )


def too_short(span_s: float, shortest_s: float = MIN_SLOPE_S) -> str:
    """What a slope over ``span_s`` seconds of samples says instead of a number."""
    return f"too short to judge ({span_s:.0f} s < {shortest_s:.0f} s)"


def _rss_slope_checks(
    slopes: Mapping[str, float | None], spans: Mapping[str, float], th: Thresholds
) -> list[Check]:
    if th.max_rss_slope_mb_per_min is None:
        return []
    text = f"<= {th.max_rss_slope_mb_per_min:g} MB/min"
    checks = []
    for name, slope in slopes.items():
        if spans[name] < MIN_SLOPE_S:
            checks.append(Check(f"{name} RSS slope", text, too_short(spans[name]), "skip"))
            continue
        shown = "n/a" if slope is None else f"{slope:+.2f} MB/min"
        checks.append(_limit(f"{name} RSS slope", slope, th.max_rss_slope_mb_per_min, text, shown))
    return checks


def _numbers(
    data: RunData,
    p99: float | None,
    ratio: float | None,
    slopes: Mapping[str, float | None],
    spans: Mapping[str, float],
    attacks: outcomes.AttackCounts,
) -> dict[str, Any]:
    """The run's figures as report.json records them."""
    benign_rps = data.benign_requests / data.duration_s if data.duration_s else 0.0
    all_requests = data.benign_requests + data.lookalike_requests + attacks.requests
    return {
        "duration_s": round(data.duration_s, 1),
        "benign_requests": data.benign_requests,
        "benign_failures": data.benign_failures,
        "benign_rps": round(benign_rps, 2),
        "benign_p50_ms": percentile(data.benign_latency_ms, 0.5),
        "benign_p95_ms": percentile(data.benign_latency_ms, 0.95),
        "benign_p99_ms": p99,
        "benign_p99_ratio": None if ratio is None else round(ratio, 3),
        "lookalike_requests": data.lookalike_requests,
        "lookalike_failures": data.lookalike_failures,
        "benign_errors": benign_errors(data)[0],
        "ttft_p50_ms": percentile(data.ttft_ms, 0.5),
        "ttft_p99_ms": percentile(data.ttft_ms, 0.99),
        "itl_p50_ms": percentile(data.itl_ms, 0.5),
        "itl_p99_ms": percentile(data.itl_ms, 0.99),
        "attack_requests": attacks.requests,
        "attack_share_of_requests": (
            round(attacks.requests / all_requests, 3) if all_requests else 0.0
        ),
        "attacks": attacks.to_dict(),
        "attacks_not_rejected": data.attack_failures[:50],
        "benign_failure_samples": data.benign_failure_samples[:20],
        "guard_peak_rss_mb": None
        if data.guard_peak_rss is None
        else round(data.guard_peak_rss / MB, 1),
        "upstream_peak_rss_mb": (
            None if data.upstream_peak_rss is None else round(data.upstream_peak_rss / MB, 1)
        ),
        "upstream_alive": data.upstream_alive,
        "upstream_status": data.upstream_status,
        # None when the samples span less than MIN_SLOPE_S (rss_span_s says how long they did)
        "rss_slope_mb_per_min": {k: None if v is None else round(v, 3) for k, v in slopes.items()},
        "rss_span_s": {k: round(v, 1) for k, v in spans.items()},
        "rss_slope_min_s": MIN_SLOPE_S,
        "rss_series_mb": {k: _thin(v) for k, v in sorted(data.rss_series.items())},
        "guard_rejections_by_code": dict(sorted(data.guard_rejections.items())),
        "client_codes": dict(sorted(data.client_codes.items())),
        "target": data.target,
    }


def _thin(series: Sequence[tuple[float, int]]) -> list[tuple[float, float]]:
    step = max(1, len(series) // _SERIES_POINTS)
    return [(round(t, 1), round(rss / MB, 2)) for t, rss in series[::step]]


def render_table(report: Report) -> str:
    """The checks as a fixed-width table, then the main numbers."""
    rows = [("SLO", "threshold", "measured", "status")]
    rows += [(c.name, c.threshold, c.measured, c.status.upper()) for c in report.checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    line = "+".join("-" * (w + 2) for w in widths)
    out = [f"+{line}+"]
    for i, row in enumerate(rows):
        out.append("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |")
        if i == 0:
            out.append(f"+{line}+")
    out.append(f"+{line}+")
    n = report.numbers
    out.append(
        f"SLO gate: {'PASS' if report.passed else 'FAIL'}  |  benign {n['benign_requests']} req "
        f"({n['benign_rps']}/s), p50 {_ms(n['benign_p50_ms'])}, p95 {_ms(n['benign_p95_ms'])}; "
        f"TTFT p99 {_ms(n['ttft_p99_ms'])}, ITL p50 {_ms(n['itl_p50_ms'])}; "
        f"attacks {n['attack_requests']} ({n['attack_share_of_requests']:.0%} of requests)"
    )
    if n["guard_rejections_by_code"]:
        codes = ", ".join(
            f"{k} {v:g}"
            for k, v in sorted(n["guard_rejections_by_code"].items(), key=lambda kv: -kv[1])
        )
        out.append(f"guard rejections by code: {codes}")
    if n["attacks_not_rejected"]:
        out.append("attacks not rejected: " + "; ".join(n["attacks_not_rejected"][:8]))
    if n["benign_failure_samples"]:
        out.append("benign failures: " + "; ".join(n["benign_failure_samples"][:5]))
    return "\n".join(out)
