"""The load test's report: one self-contained HTML file (``report.html``) an SRE opens alone.

It shows, from a run's output directory (``slo.json`` or ``report.json``, and
``timeline.json``):

- the verdict of every SLO (threshold, measured, pass/fail/skip);
- the traffic in numbers (requests, latency percentiles, attacks, peak RSS);
- how often each series was sampled, stated once, as the monitor measured it;
- over time: benign latency p50/p99, time to first token and inter-token latency, each with
  the share of requests that attacked behind it; the guard's rejections by code (its
  ``/metrics``) and the attack requests by what refused them, as the client saw them; guard
  and upstream RSS with their SLO lines;
- attacks by THREATS class and by what refused them (:mod:`loadtests.outcomes`: a content
  check, a budget, a rate or concurrency limit, or nothing), what got through, benign
  failures, the servers as they were when the load ended, links to the other files;
- for the fair share phase (``--scenario fair-share``, :mod:`loadtests.fairshare`): each
  tenant's latency over time, its requests, latency and tokens in each segment, the ordinary
  tenant's p99 ratio and each tenant's share of the flood segment;
- with ``compare`` (e.g. a ``--no-guard`` run's directory): the same side by side, the SLO and
  numbers tables with a column per run and each chart beside its counterpart on the same scales.

Every count on the page (tables, legends, bars) comes from one pass over the run's records
(:func:`count`: ``timeline.json``'s per-second buckets, the records the SLO gate summed too);
each table cell and bar carries it as ``data-count`` so a test can check they agree.

Charts are SVG drawn here (:mod:`loadtests.svgchart`); the page has no script and loads
nothing (styles inline), so it opens offline from a file. Plain Python: no locust import.

    python -m loadtests.report OUT_DIR [--compare OTHER_DIR]     # or schedguard load --report-only
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import fairshare, outcomes, slo
from loadtests import timeline as tl
from loadtests.svgchart import Band, Bars, HLine, Line, Marker, Point, bar_chart, line_chart

__all__ = [
    "CHARTS",
    "Counts",
    "Run",
    "RunSeries",
    "build_html",
    "count",
    "load_run",
    "main",
    "series",
    "write_report",
]

# Chart ids, in page order (a compared run's are these + "-compare").
CHARTS = (
    "benign-latency",
    "ttft",
    "itl",
    "rss",
    "guard-rejections",
    "attack-answers",
)
REPORT_FILE = "report.html"
_CHART_W, _CHART_H = 640, 250
_P50, _P99 = "#5aa9e6", "#0b3d91"
_SHARE = "#f28e2b"
_ERRORS = "#c62828"
_SLO = "#b2182b"
_RSS = {"guard": "#2b6cb0", "upstream": "#dd6b20"}
_CODE_COLORS = (
    "#4c78a8",
    "#54a24b",
    "#b279a2",
    "#72b7b2",
    "#eeca3b",
    "#9d755d",
    "#f58518",
    "#79706e",
    "#2f4b7c",
)
_FLOOD_SERVED = "#f4a3a3"
_OTHER = "#c7c7c7"
# What refused an attack request (outcomes.CATEGORIES): refusals cool, what got through red.
_CATEGORY_COLORS = {
    outcomes.CONTENT: "#4c78a8",
    outcomes.BUDGET: "#b279a2",
    outcomes.RATE: "#eeca3b",
    outcomes.CONCURRENCY: "#72b7b2",
    outcomes.SERVED_BEFORE_LIMIT: _FLOOD_SERVED,
    outcomes.SERVED: "#d62728",
    outcomes.SERVER_ERROR: "#8c2d04",
    outcomes.NO_ANSWER: "#222222",
}
_INTENT_LABELS = {outcomes.CONTENT_ATTACK: "content checks", outcomes.FLOOD: "a limit (flood)"}
_TOP_CODES = 10
_MODE_LABELS = {
    "guard": "with the guard",
    "no-guard": "without the guard (--no-guard)",
    "host": "against --host",
}


# ------------------------------------------------------------------------------ input


@dataclass
class Run:
    """One run's files. ``report`` is ``report.json`` (the SLO report plus the mode, servers
    and files) or ``slo.json``; ``timeline`` is ``timeline.json`` when the run wrote one."""

    directory: Path
    report: dict[str, Any]
    timeline: dict[str, Any] | None
    label: str

    @property
    def numbers(self) -> dict[str, Any]:
        return dict(self.report.get("numbers") or {})

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list(self.report.get("checks") or [])

    @property
    def passed(self) -> bool:
        return all(c.get("status") != "fail" for c in self.checks)

    @property
    def mode(self) -> str:
        return str(self.report.get("mode") or "")


def load_run(path: str | Path, label: str | None = None) -> Run:
    """The run in directory ``path`` (its ``report.json``, else ``slo.json``), or the run whose
    ``report.json`` / ``slo.json`` is ``path``."""
    p = Path(path)
    if p.is_dir():
        directory = p
        candidates = [p / "report.json", p / "slo.json"]
    else:
        directory = p.parent
        candidates = [p]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"{path}: no report.json or slo.json (an output dir of a run)")
    report = json.loads(found.read_text())
    if not isinstance(report, dict) or "checks" not in report:
        raise ValueError(f"{found}: not a schedguard load report (no checks)")
    timeline_path = directory / "timeline.json"
    timeline = json.loads(timeline_path.read_text()) if timeline_path.is_file() else None
    mode = str(report.get("mode") or "")
    return Run(directory, report, timeline, label or _MODE_LABELS.get(mode, directory.name))


# ------------------------------------------------------------------------------ series


@dataclass
class Counts:
    """Every count the page shows, from one pass over the run's records (:func:`count`)."""

    bar_starts: list[float]
    bar_seconds: list[float]  # each bar's length within the run
    benign: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> ok / fail
    attacks: outcomes.AttackCounts = field(default_factory=outcomes.AttackCounts)
    answers: dict[str, list[int]] = field(default_factory=dict)  # category -> count per bar
    rejections: dict[str, list[float]] = field(default_factory=dict)  # code -> count per bar
    recorded: bool = False  # the timeline holds attack records (version 2 on)
    fair: fairshare.FairRecords = field(default_factory=fairshare.FairRecords)

    def benign_total(self, key: str = "") -> int:
        """Benign requests (synthetic and look-alikes); ``key`` ``fail``: those that failed."""
        return sum((row.get(key, 0) if key else sum(row.values())) for row in self.benign.values())


def _bars(duration: float, width: float) -> tuple[list[float], list[float]]:
    # A last piece shorter than a tenth of a bar joins the one before; rates are per second of
    # each bar's own length (the last one may be shorter or longer than the others).
    n_bars = max(1, math.ceil(duration / width - 0.1))
    widths = [width] * (n_bars - 1) + [max(1.0, duration - (n_bars - 1) * width)]
    return [i * width for i in range(n_bars)], widths


def count(run: Run) -> Counts:
    """The run's counts: one pass over ``timeline.json``'s buckets (benign requests, attack
    records, flood bursts), each put in the bar of its second (those before the start or after
    the end in the first or last bar: every record is in a bar); the guard's rejections from
    its scraped counters. Without a timeline (an older run), benign counts from the SLO report."""
    tl_data = run.timeline or {}
    duration = max(float(tl_data.get("duration_s") or run.numbers.get("duration_s") or 0.0), 1.0)
    width = _windows(duration)[2]
    starts, seconds = _bars(duration, width)
    out = Counts(starts, seconds)
    n_bars = len(starts)
    records: dict[str, int] = {}
    bursts: dict[str, int] = {}
    for second, bucket in (tl_data.get("buckets") or {}).items():
        i = min(max(0, int(int(second) // width)), n_bars - 1)
        for kind in ("BENIGN", "LOOKALIKE"):
            for label, n in (bucket.get(f"req {kind}") or {}).items():
                row = out.benign.setdefault(kind, {})
                row[label] = row.get(label, 0) + int(n)
        for text, n in (bucket.get(tl.ATTACKS) or {}).items():
            records[text] = records.get(text, 0) + int(n)
            got = outcomes.category(outcomes.parse_key(text))
            out.answers.setdefault(got, [0] * n_bars)[i] += int(n)
        for label, n in (bucket.get(tl.BURSTS) or {}).items():
            bursts[label] = bursts.get(label, 0) + int(n)
        for name, row in bucket.items():
            if name.startswith(fairshare.PREFIX + " "):
                out.fair.add(name, row)
    out.attacks = outcomes.summarize(records, bursts)
    out.recorded = int(tl_data.get("version") or 0) >= 2
    out.rejections = _counts_from_counters(tl_data.get("guard_rejections") or [], width, n_bars)
    if not tl_data:
        n = run.numbers
        out.benign = {
            "BENIGN": _ok_fail(n.get("benign_requests"), n.get("benign_failures")),
            "LOOKALIKE": _ok_fail(n.get("lookalike_requests"), n.get("lookalike_failures")),
        }
    return out


def _ok_fail(requests: Any, failures: Any) -> dict[str, int]:
    return {"ok": int(requests or 0) - int(failures or 0), "fail": int(failures or 0)}


@dataclass
class RunSeries:
    """A run's charts' data, in seconds since the test started."""

    duration: float
    step: float  # seconds between latency points
    span: float  # their trailing window
    bar_width: float  # seconds per bar of the rate charts
    latency: dict[str, dict[str, list[Point]]] = field(default_factory=dict)
    attack_share: list[Point] = field(default_factory=list)
    benign_error_share: list[Point] = field(default_factory=list)  # BENIGN and LOOKALIKE
    rss: dict[str, list[Point]] = field(default_factory=dict)
    peak_rss: dict[str, float] = field(default_factory=dict)  # the kernel's high-water mark
    died: dict[str, float] = field(default_factory=dict)
    bar_starts: list[float] = field(default_factory=list)
    bar_seconds: list[float] = field(default_factory=list)  # each bar's length within the run
    rejections: dict[str, list[float]] = field(default_factory=dict)  # code -> per second
    answers: dict[str, list[float]] = field(default_factory=dict)  # category -> per second
    counts: Counts | None = None  # what the rates above were divided from
    has_timeline: bool = False
    # the fair share phase: tenant -> p50 / p99 -> points (empty for other runs)
    fair_latency: dict[str, dict[str, list[Point]]] = field(default_factory=dict)


def _quantile(hist: Mapping[int, int], q: float) -> float | None:
    return slo.percentile(hist, q)


def _windows(duration: float) -> tuple[float, float, float]:
    step = float(max(1, math.ceil(duration / 120)))
    span = float(min(30, max(3, math.ceil(duration / 10))))
    bar = next((float(w) for w in (5, 10, 15, 30, 60, 120, 300, 600) if duration / w <= 40), 900.0)
    return step, max(span, step), bar


def series(run: Run, counts: Counts | None = None) -> RunSeries:
    """The time series the charts draw, from the run's ``timeline.json`` (RSS falls back to
    the SLO report's ``rss_series_mb`` for a run without one); the bars are ``counts`` (the
    run's :func:`count`) per second of each bar."""
    counts = counts or count(run)
    numbers = run.numbers
    tl_data = run.timeline or {}
    duration = float(tl_data.get("duration_s") or numbers.get("duration_s") or 0.0)
    duration = max(duration, 1.0)
    step, span, bar = _windows(duration)
    out = RunSeries(duration, step, span, bar, has_timeline=bool(tl_data), counts=counts)
    buckets: dict[int, dict[str, dict[str, int]]] = {
        int(k): v for k, v in (tl_data.get("buckets") or {}).items()
    }
    last = math.ceil(duration)
    points = [step * i for i in range(1, int(last // step) + 1)]
    if not points or points[-1] < duration:
        points.append(float(last))

    def window(t: float) -> range:
        return range(math.floor(t - span), math.ceil(t))

    for kind in ("BENIGN", "TTFT", "ITL"):
        p50: list[Point] = []
        p99: list[Point] = []
        for t in points:
            hist: dict[int, int] = {}
            for s in window(t):
                for ms, n in (buckets.get(s, {}).get(f"lat {kind}") or {}).items():
                    hist[int(ms)] = hist.get(int(ms), 0) + n
            p50.append((t, _quantile(hist, 0.5)))
            p99.append((t, _quantile(hist, 0.99)))
        out.latency[kind] = {"p50": p50, "p99": p99}
    if counts.fair:
        for tenant in fairshare.TENANTS:
            lines: dict[str, list[Point]] = {"p50": [], "p99": []}
            for t in points:
                seen: dict[int, int] = {}
                for s in window(t):
                    hist_s = fairshare.latency_series(buckets.get(s, {}), tenant)
                    for lat_ms, k in hist_s.items():
                        seen[lat_ms] = seen.get(lat_ms, 0) + k
                lines["p50"].append((t, _quantile(seen, 0.5)))
                lines["p99"].append((t, _quantile(seen, 0.99)))
            out.fair_latency[tenant] = lines
    for t in points:
        attack = benign = failed = 0
        for s in window(t):
            b = buckets.get(s, {})
            for kind in ("BENIGN", "LOOKALIKE"):
                req = b.get(f"req {kind}") or {}
                benign += sum(req.values())
                failed += req.get("fail", 0)
            # Attack requests as the tables count them (each of a flood burst); a version 1
            # timeline has only locust's ATTACK events (a burst once).
            attacks = b.get(tl.ATTACKS) if counts.recorded else b.get("req ATTACK")
            attack += sum((attacks or {}).values())
        total = attack + benign
        out.attack_share.append((t, attack / total if total else None))
        out.benign_error_share.append((t, failed / benign if benign else None))

    rss_source = tl_data.get("rss_mb") or numbers.get("rss_series_mb") or {}
    for name, pts in rss_source.items():
        out.rss[name] = [(float(t), float(v)) for t, v in pts if -1.0 <= float(t) <= duration + 5]
    out.died = {k: float(v) for k, v in (tl_data.get("died_s") or {}).items()}
    for name in ("guard", "upstream"):
        peak = numbers.get(f"{name}_peak_rss_mb")
        if peak is not None:
            out.peak_rss[name] = float(peak)

    out.bar_starts, out.bar_seconds = counts.bar_starts, counts.bar_seconds
    out.rejections = {
        code: [c / s for c, s in zip(row, counts.bar_seconds, strict=True)]
        for code, row in counts.rejections.items()
    }
    out.answers = {
        label: [c / s for c, s in zip(row, counts.bar_seconds, strict=True)]
        for label, row in counts.answers.items()
    }
    return out


def _counts_from_counters(
    samples: Sequence[Sequence[Any]], width: float, n_bars: int
) -> dict[str, list[float]]:
    """Counts per bar from cumulative counters sampled at times ``t``: each increase goes to
    the bar of the sample that first showed it (it happened since the sample before, at most a
    scrape interval earlier: never drawn before it happened). Increases seen past the last bar
    go into it; those seen before the run's start are dropped."""
    counts: dict[str, list[float]] = {}
    for (_, before), (b, after) in itertools.pairwise(samples):
        if float(b) < 0:
            continue
        i = min(int(float(b) // width), n_bars - 1)
        for code, total in after.items():
            delta = float(total) - float(before.get(code, 0.0))
            if delta > 0:
                counts.setdefault(code, [0.0] * n_bars)[i] += delta
    return counts


# ------------------------------------------------------------------------------ colours


def _colours(runs: Sequence[RunSeries]) -> dict[str, str]:
    """One colour per rejection code across every chart and run: the most frequent codes get
    the palette, the rest 'other'."""
    totals: dict[str, float] = {}
    for rs in runs:
        for code, row in (rs.counts.rejections if rs.counts else {}).items():
            totals[code] = totals.get(code, 0.0) + sum(row)
    palette = iter(_CODE_COLORS)
    return {
        code: next(palette, _OTHER)
        for code, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))
    }


def _stacks(
    rates: Mapping[str, Sequence[float]],
    counts: Mapping[str, Sequence[float]],
    colours: Mapping[str, str],
) -> tuple[list[tuple[str, str, list[float]]], dict[str, list[float]]]:
    """The rows as bar stacks, biggest first, and their counts; codes without a colour of
    their own merged into 'other'."""
    named: list[tuple[str, str, list[float]]] = []
    named_counts: dict[str, list[float]] = {}
    other: list[float] | None = None
    other_counts: list[float] | None = None
    for label, row in sorted(rates.items(), key=lambda kv: (-sum(counts[kv[0]]), kv[0])):
        colour = colours.get(label, _OTHER)
        if colour == _OTHER:
            other = [a + b for a, b in zip(other, row, strict=True)] if other else list(row)
            c = counts[label]
            other_counts = (
                [a + b for a, b in zip(other_counts, c, strict=True)] if other_counts else list(c)
            )
        else:
            named.append((label, colour, list(row)))
            named_counts[label] = list(counts[label])
    if other is not None and other_counts is not None:
        named.append(("other", _OTHER, other))
        named_counts["other"] = other_counts
    return named, named_counts


# ------------------------------------------------------------------------------ HTML


_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;
 background:#f6f7f9}
main{max-width:1360px;margin:0 auto;padding:20px 24px 40px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px}
.sub{color:#555;margin:0}
.verdict{display:inline-block;padding:2px 12px;border-radius:6px;color:#fff;font-size:18px;
 vertical-align:3px;margin-left:8px}
.verdict.pass{background:#1a7f37}.verdict.fail{background:#c62828}
table{border-collapse:collapse;background:#fff;margin:4px 0 8px;min-width:50%}
th,td{border:1px solid #d8dbe0;padding:4px 10px;text-align:left;vertical-align:top}
th{background:#eef0f3;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.status{font-weight:700;text-transform:uppercase;white-space:nowrap}
.status.pass{color:#1a7f37}.status.fail{color:#c62828}.status.skip{color:#888}
tr.fail td{background:#fdecea}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #d8dbe0;border-radius:6px;padding:10px 12px}
figcaption{font-weight:600;margin-bottom:2px}
figcaption .who{font-weight:400;color:#555}
.note{color:#555;font-size:12.5px;margin:0 0 4px;min-height:3.9em}
svg.chart{display:block;width:100%;height:auto}
.legend{list-style:none;padding:0;margin:4px 0 0;font-size:12.5px;display:flex;flex-wrap:wrap;
 gap:2px 14px}
.legend i{display:inline-block;width:14px;height:10px;margin-right:5px;border-radius:2px;
 vertical-align:-1px}
.legend i.dash{height:0;border-top:2px dashed;border-radius:0;vertical-align:3px}
details{margin:6px 0}code{font-size:12.5px}
.cols{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
footer{color:#777;font-size:12px;margin-top:30px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):,.0f} ms"


def _mb(v: Any) -> str:
    return "n/a" if v is None else f"{float(v):,.1f} MB"


def _status(status: str) -> str:
    return f'<span class="status {_e(status)}">{_e(status)}</span>'


def _slo_table(runs: Sequence[Run]) -> str:
    names: list[str] = []
    for run in runs:
        names += [c["name"] for c in run.checks if c["name"] not in names]
    by_run = [{c["name"]: c for c in run.checks} for run in runs]
    head = "<tr><th>SLO</th><th>threshold</th>" + "".join(
        f"<th>measured{_who(run, runs)}</th><th>verdict{_who(run, runs)}</th>" for run in runs
    )
    rows = [head + "</tr>"]
    for name in names:
        first = next(checks[name] for checks in by_run if name in checks)
        own = by_run[0].get(name)
        cls = own["status"] if own else "skip"
        cells = [f"<td>{_e(name)}</td><td>{_e(first['threshold'])}</td>"]
        for checks in by_run:
            c = checks.get(name)
            if c is None:
                cells.append('<td>-</td><td><span class="status skip">-</span></td>')
            else:
                cells.append(f"<td>{_e(c['measured'])}</td><td>{_status(c['status'])}</td>")
        rows.append(f'<tr class="{_e(cls)}" data-slo="{_e(name)}">' + "".join(cells) + "</tr>")
    return '<table class="slo" id="slo-table">' + "".join(rows) + "</table>"


def _who(run: Run, runs: Sequence[Run]) -> str:
    return f"<br><span class='who'>{_e(run.label)}</span>" if len(runs) > 1 else ""


def _n(key: str, value: float) -> str:
    """A count as the page shows it, tagged with what it counts (``data-count``)."""
    return f'<span data-count="{_e(key)}">{value:,.0f}</span>'


def _numbers_rows(run: Run, counts: Counts) -> list[tuple[str, str]]:
    """(label, HTML) rows: counts from ``counts``, latencies and RSS from the SLO report."""
    n = run.numbers
    synthetic = sum(counts.benign.get("BENIGN", {}).values())
    lookalikes = sum(counts.benign.get("LOOKALIKE", {}).values())
    benign = counts.benign_total()
    a = counts.attacks
    everything = benign + a.requests
    duration = float(n.get("duration_s") or 0.0)
    rows = [
        ("duration", _e(f"{n.get('duration_s', 0)} s")),
        (
            "benign requests",
            f"{_n('benign/requests', benign)} ({_n('benign/synthetic', synthetic)} synthetic, "
            f"{_n('benign/lookalike', lookalikes)} look-alikes"
            + (f"; {benign / duration:.2f}/s" if duration else "")
            + f"), {_n('benign/failed', counts.benign_total('fail'))} failed",
        ),
        (
            "benign latency p50 / p95 / p99",
            _e(
                f"{_ms(n.get('benign_p50_ms'))} / {_ms(n.get('benign_p95_ms'))} / "
                f"{_ms(n.get('benign_p99_ms'))}"
            ),
        ),
        (
            "time to first token p50 / p99",
            _e(f"{_ms(n.get('ttft_p50_ms'))} / {_ms(n.get('ttft_p99_ms'))}"),
        ),
        (
            "inter-token latency p50 / p99",
            _e(f"{_ms(n.get('itl_p50_ms'))} / {_ms(n.get('itl_p99_ms'))}"),
        ),
        (
            "attack requests",
            (
                f"{_n('attacks/requests', a.requests)}: "
                f"{_n('attacks/content', a.content_sent)} aimed at content checks, "
                f"{_n('attacks/flood', a.of(outcomes.FLOOD))} flood requests in "
                f"{_n('bursts/sent', a.bursts)} bursts; "
                + (f"{a.requests / everything:.0%} of requests" if everything else "no requests")
            )
            if counts.recorded
            else "not recorded (this run's timeline.json is older than attack records)",
        ),
        ("guard peak RSS", _e(_mb(n.get("guard_peak_rss_mb")))),
        ("upstream peak RSS", _e(_mb(n.get("upstream_peak_rss_mb")))),
        ("upstream at the end", _e(n.get("upstream_status") or "-")),
    ]
    rows += [(f"{name} RSS slope", _e(text)) for name, text in _slopes(run)]
    return rows


def _slopes(run: Run) -> list[tuple[str, str]]:
    """The RSS slopes, only where the soak gate judges them (a threshold is set), and only
    over enough samples: a slope over a short run's warm-up is not a trend."""
    limit = (run.report.get("thresholds") or {}).get("max_rss_slope_mb_per_min")
    if limit is None:
        return []
    n = run.numbers
    spans = n.get("rss_span_s") or {}
    shortest = float(n.get("rss_slope_min_s") or slo.MIN_SLOPE_S)
    out = []
    for name, slope in sorted((n.get("rss_slope_mb_per_min") or {}).items()):
        span = float(spans.get(name, n.get("duration_s") or 0.0))
        if span < shortest:
            text = slo.too_short(span, shortest)
        elif slope is None:
            text = "n/a"
        else:
            text = f"{slope:+.2f} MB/min (gate <= {float(limit):g} MB/min)"
        out.append((name, text))
    return out


def _numbers_table(runs: Sequence[Run], counts: Sequence[Counts]) -> str:
    per_run = [dict(_numbers_rows(run, c)) for run, c in zip(runs, counts, strict=True)]
    labels = list(per_run[0])
    for rows in per_run[1:]:
        labels += [k for k in rows if k not in labels]
    head = "<tr><th></th>" + "".join(f"<th>{_e(r.label)}</th>" for r in runs) + "</tr>"
    body = "".join(
        f"<tr><th>{_e(label)}</th>"
        + "".join(
            f'<td data-run="{i}">{rows.get(label, "-")}</td>' for i, rows in enumerate(per_run)
        )
        + "</tr>"
        for label in labels
    )
    return f'<table class="numbers" id="numbers-table">{head}{body}</table>'


def _run_line(run: Run) -> str:
    n = run.numbers
    target = n.get("target") or {}
    tl = run.timeline or {}
    parts = [run.label]
    if target.get("upstream_profile") and target.get("upstream_profile") != "any":
        parts.append(f"{target['upstream_profile']} reference scheduler upstream")
    if target.get("shape"):
        parts.append(f"{target['shape']} shape")
    fair = (n.get("fair_share") or {}).get("config") or {}
    if fair:
        parts.append(
            f"fair share phase: {fair.get('chat_users')} chat users, "
            f"{fair.get('streams')} flood streams from {fair.get('solo_s')} s"
        )
    elif target.get("users"):
        share = float(target.get("attack_share") or 0.0)
        users = int(target["users"])
        attackers = round(users * share)
        parts.append(f"{users} users ({users - attackers} benign, {attackers} attacking)")
    parts.append(f"{n.get('duration_s', 0)} s of load")
    if tl.get("t0"):
        started = dt.datetime.fromtimestamp(float(tl["t0"]), dt.UTC)
        parts.append(f"started {started:%Y-%m-%d %H:%M:%S} UTC")
    if target.get("host"):
        parts.append(f"target {target['host']}")
    if target.get("upstream_kind") and target.get("upstream_kind") != "reference":
        parts.append(f"{target['upstream_kind']} upstream serving {target.get('model')}")
    memory = target.get("memory_from") or {}
    known = [f"{name} from {where}" for name, where in sorted(memory.items()) if where]
    if known:
        parts.append("memory: " + ", ".join(known))
    return ", ".join(_e(p) for p in parts)


def _legend(items: Sequence[tuple[str, str, bool]]) -> str:
    return (
        '<ul class="legend">'
        + "".join(
            f'<li><i class="dash" style="border-color:{c}"></i>{_e(label)}</li>'
            if dashed
            else f'<li><i style="background:{c}"></i>{_e(label)}</li>'
            for label, c, dashed in items
        )
        + "</ul>"
    )


@dataclass
class _Chart:
    id: str
    title: str
    note: str
    svg: str
    legend: str


def _latency_chart(
    rs: RunSeries,
    kind: str,
    chart_id: str,
    title: str,
    y_max: float,
    x_max: float,
    p99_slo: float | None,
) -> _Chart:
    lat = rs.latency.get(kind, {})
    lines = [
        Line("p50", _P50, lat.get("p50", [])),
        Line("p99", _P99, lat.get("p99", [])),
    ]
    hlines = []
    legend = [("p50", _P50, False), ("p99", _P99, False)]
    if p99_slo is not None:
        hlines.append(HLine(f"p99 SLO {p99_slo:,.0f} ms", _SLO, p99_slo))
        legend.append(("p99 SLO", _SLO, True))
    bands = []
    if any(v is not None for _, v in rs.attack_share):
        bands.append(Band("share of requests attacking", _SHARE, rs.attack_share))
        legend.append(("share of requests attacking (right axis)", _SHARE, False))
    if any(v for _, v in rs.benign_error_share):
        errors = Band("share of benign requests failing", _ERRORS, rs.benign_error_share, 0.35)
        bands.append(errors)
        legend.append(("share of benign requests failing (right axis)", _ERRORS, False))
    markers = [Marker(f"{k} gone", "#c62828", t) for k, t in sorted(rs.died.items())]
    svg = line_chart(
        chart_id,
        title,
        lines=lines,
        x_max=x_max,
        y_unit="ms",
        y_max=y_max,
        bands=bands,
        hlines=hlines,
        markers=markers,
        width=_CHART_W,
        height=_CHART_H,
        empty_text="no data" if rs.has_timeline else "no timeline.json in this run",
    )
    note = (
        f"p50 and p99 of the successful requests over a trailing {rs.span:g} s window, a point "
        f"every {rs.step:g} s; shaded: the share of requests that attacked"
        + (", and of benign requests that failed." if len(bands) > 1 else ".")
    )
    return _Chart(chart_id, title, note, svg, _legend(legend))


_FAIR_COLOURS = {
    (fairshare.CHAT, "p50"): _P50,
    (fairshare.CHAT, "p99"): _P99,
    (fairshare.FLOOD, "p50"): "#f4a261",
    (fairshare.FLOOD, "p99"): "#c1440e",
}


def _fair_summary(run: Run, counts: Counts) -> dict[str, Any]:
    """The phase's figures from the page's counts, with the run's configuration."""
    recorded = run.numbers.get("fair_share") or {}
    return fairshare.summarize(counts.fair, recorded.get("config"))


def _fair_chart(
    rs: RunSeries, run: Run, suffix: str, scales: Mapping[str, float], x_max: float
) -> _Chart:
    """Each tenant's latency over time: the chats' full answers, the flood's wait for its
    streams to begin; when the flood joined; the ratio SLO over the solo p99."""
    recorded = run.numbers.get("fair_share") or {}
    summary = _fair_summary(run, rs.counts or count(run))
    lines, legend = [], []
    names = {fairshare.CHAT: "chat", fairshare.FLOOD: "flood (stream begins)"}
    for tenant in fairshare.TENANTS:
        for q in ("p50", "p99"):
            colour = _FAIR_COLOURS[(tenant, q)]
            lines.append(
                Line(f"{names[tenant]} {q}", colour, rs.fair_latency.get(tenant, {}).get(q, []))
            )
            legend.append((f"{names[tenant]} {q}", colour, False))
    hlines, markers = [], []
    solo = summary["tenants"][fairshare.CHAT][fairshare.SOLO]["p99_ms"]
    limit = (recorded.get("thresholds") or {}).get("max_p99_ratio")
    top = scales["fair"]
    if solo and limit:
        hlines.append(HLine(f"{float(limit):g}x solo chat p99", _SLO, float(limit) * solo))
        legend.append((f"{float(limit):g}x the chat's solo p99 ({solo:,.0f} ms)", _SLO, True))
        top = max(top, float(limit) * solo)
    flood_at = (summary.get("config") or {}).get("solo_s")
    if flood_at is not None:
        markers.append(Marker("flood joins", "#6a3d9a", float(flood_at)))
    svg = line_chart(
        f"fair-latency{suffix}",
        "Latency per tenant (fair share phase)",
        lines=lines,
        x_max=x_max,
        y_unit="ms",
        y_max=top * 1.1,
        hlines=hlines,
        markers=markers,
        width=_CHART_W,
        height=_CHART_H,
        empty_text="no fair share records in this run",
    )
    note = (
        f"p50 and p99 over a trailing {rs.span:g} s window, a point every {rs.step:g} s: the chat "
        "tenant's full answers and the flood's wait until its stream began; the marker: when "
        "the flood joined."
    )
    return _Chart(
        f"fair-latency{suffix}", "Latency per tenant (fair share phase)", note, svg, _legend(legend)
    )


def _fair_table(run: Run, counts: Counts, who: str) -> str:
    """Per tenant and segment: requests, served, not served, p50/p99, tokens; the chat's p99
    ratio and unanswered; each tenant's share of the flood segment (``data-count``
    ``fair/TENANT/SEGMENT/what`` and ``fair/share/TENANT/what``)."""
    if not counts.fair:
        return ""
    summary = _fair_summary(run, counts)
    rows = []
    for tenant in fairshare.TENANTS:
        for segment in fairshare.SEGMENTS:
            r = summary["tenants"][tenant][segment]
            if not r["requests"] and tenant == fairshare.FLOOD:
                continue
            key = f"fair/{tenant}/{segment}"
            answers = ", ".join(f"{_e(k)}: {_n(f'{key}/{k}', v)}" for k, v in r["answers"].items())
            rows.append(
                f"<tr><th>{_e(tenant)}</th><td>{_e(segment)}</td>"
                f"<td>{_n(key + '/requests', r['requests'])}</td>"
                f"<td>{_n(key + '/served', r['served'])}</td>"
                f"<td>{_e(_ms(r['p50_ms']))}</td><td>{_e(_ms(r['p99_ms']))}</td>"
                f"<td>{_n(key + '/tokens', r['tokens'])}</td><td>{answers or '-'}</td></tr>"
            )
    shares = []
    for tenant in fairshare.TENANTS:
        sh = summary["flood_segment_shares"][tenant]
        pct = [("-" if v is None else f"{v:.1%}") for v in (sh["share_served"], sh["share_tokens"])]
        shares.append(
            f"<tr><th>{_e(tenant)}</th><td>{_n(f'fair/share/{tenant}/served', sh['served'])}</td>"
            f"<td>{pct[0]}</td><td>{_n(f'fair/share/{tenant}/tokens', sh['tokens'])}</td>"
            f"<td>{pct[1]}</td></tr>"
        )
    ratio = summary["chat_p99_ratio"]
    cfg = summary["config"]
    line = (
        f"{who}chat p99 under flood / solo: {'-' if ratio is None else f'{ratio:.2f}x'}; chat "
        f"requests not served: {_n('fair/chat/unanswered', summary['chat_unanswered'])}. Flood: "
        f"{_e(cfg.get('streams', '?'))} streams ({_e(cfg.get('unread', '?'))} never read, held "
        f"{_e(cfg.get('hold_s', '?'))} s), max_tokens {_e(cfg.get('flood_tokens', '?'))}, n "
        f"{_e(cfg.get('flood_n', '?'))}, from {_e(cfg.get('solo_s', '?'))} s."
    )
    return (
        f'<p class="note">{line}</p><table class="numbers fair">'
        "<tr><th>tenant</th><th>segment</th><th>requests</th><th>served</th><th>p50</th>"
        "<th>p99</th><th>tokens</th><th>answers (status code)</th></tr>"
        + "".join(rows)
        + '</table><h3>Share of the flood segment</h3><table class="numbers fair">'
        "<tr><th>tenant</th><th>served</th><th>share</th><th>tokens received</th><th>share</th>"
        "</tr>" + "".join(shares) + "</table>"
    )


def _max_of(points: Sequence[Point]) -> float:
    return max([v for _, v in points if v is not None] or [0.0])


def _charts(
    rs: RunSeries,
    run: Run,
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
    colours: Mapping[str, str],
) -> list[_Chart]:
    th = run.report.get("thresholds") or {}
    fair = [_fair_chart(rs, run, suffix, scales, x_max)] if scales.get("fair") else []
    return [
        *fair,
        *_latency_charts(rs, th, suffix, scales, x_max),
        _rss_chart(rs, th, suffix, scales, x_max),
        _rejections_chart(rs, run, suffix, scales, x_max, colours),
        _answers_chart(rs, suffix, scales, x_max),
    ]


def _latency_charts(
    rs: RunSeries,
    th: Mapping[str, Any],
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
) -> list[_Chart]:
    """Benign latency (with its p99 SLO when that fits the chart), time to first token, ITL."""
    p99_slo: float | None = None if th.get("p99_ms") is None else float(th["p99_ms"])
    out = []
    benign_top = scales["benign-latency"]
    show_slo = p99_slo is not None and p99_slo <= 1.5 * benign_top
    out.append(
        _latency_chart(
            rs,
            "BENIGN",
            f"benign-latency{suffix}",
            "Benign latency (full response)",
            max(benign_top, p99_slo if p99_slo is not None and show_slo else 0.0) * 1.1,
            x_max,
            p99_slo if show_slo else None,
        )
    )
    if p99_slo is not None and not show_slo:
        out[-1].note += f" The p99 SLO ({p99_slo:,.0f} ms) is above the chart."
    out.append(
        _latency_chart(
            rs,
            "TTFT",
            f"ttft{suffix}",
            "Time to first token (streams)",
            scales["ttft"] * 1.1,
            x_max,
            None,
        )
    )
    out.append(
        _latency_chart(
            rs,
            "ITL",
            f"itl{suffix}",
            "Inter-token latency (mean gap per stream)",
            scales["itl"] * 1.1,
            x_max,
            None,
        )
    )
    return out


def _rss_chart(
    rs: RunSeries,
    th: Mapping[str, Any],
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
) -> _Chart:
    """The guard's and the upstream's RSS, their peaks between samples, their SLOs, deaths."""
    lines, hlines, legend, off_chart = [], [], [], []
    rss_top = scales["rss"]
    for name in ("guard", "upstream"):
        colour = _RSS[name]
        if rs.rss.get(name):
            lines.append(Line(f"{name} RSS", colour, rs.rss[name]))
            legend.append((f"{name} RSS", colour, False))
        peak = rs.peak_rss.get(name)
        if peak is not None and peak > 1.1 * _max_of(rs.rss.get(name, [])):
            # A spike between two samples (a process killed by its memory cap) still shows.
            hlines.append(HLine(f"{name} peak {peak:,.0f} MB", colour, peak, dash="2 3"))
            legend.append((f"{name} peak (high-water mark, between samples)", colour, True))
        limit = th.get(f"max_{name}_rss_mb")
        if limit is None or not rs.rss.get(name):
            continue
        if float(limit) <= 2 * scales["rss"]:  # a line far above the data would flatten it
            hlines.append(HLine(f"{name} SLO {float(limit):,.0f} MB", colour, float(limit)))
            legend.append((f"{name} peak RSS SLO", colour, True))
            rss_top = max(rss_top, float(limit))
        else:
            off_chart.append(f"{name} {float(limit):,.0f} MB")
    markers = [Marker(f"{k} gone", "#c62828", t) for k, t in sorted(rs.died.items())]
    rss_note = (
        "RSS at each of the load generator's samples (how often: Sampling, above the charts); "
        "dashed: peak RSS SLOs."
    )
    if off_chart:
        rss_note += " Above the chart: the SLO of " + ", ".join(off_chart) + "."
    return _Chart(
        f"rss{suffix}",
        "Memory (RSS, process and children)",
        rss_note,
        line_chart(
            f"rss{suffix}",
            "Memory (RSS)",
            lines=lines,
            x_max=x_max,
            y_unit="MB",
            y_max=rss_top * 1.1,
            hlines=hlines,
            markers=markers,
            width=_CHART_W,
            height=_CHART_H,
            empty_text="no RSS: the servers' pids are unknown (--host)",
        ),
        _legend(legend),
    )


def _rejections_chart(
    rs: RunSeries,
    run: Run,
    suffix: str,
    scales: Mapping[str, float],
    x_max: float,
    colours: Mapping[str, str],
) -> _Chart:
    """The guard's rejections per second by error code, stacked bars."""
    counts = rs.counts.rejections if rs.counts else {}
    stacks, stack_counts = _stacks(rs.rejections, counts, colours)
    bars = Bars(rs.bar_starts, rs.bar_width, stacks, stack_counts)
    return _Chart(
        f"guard-rejections{suffix}",
        "Guard rejections by code",
        "From the guard's /metrics (schedguard_guard_rejections_total), each counted at "
        f"the scrape that first showed it; per second over {rs.bar_width:g} s bars.",
        bar_chart(
            f"guard-rejections{suffix}",
            "Guard rejections by code",
            bars=bars,
            x_max=x_max,
            y_unit="rejections/s",
            y_max=scales["rejections"] * 1.1,
            width=_CHART_W,
            height=_CHART_H,
            empty_text=(
                "no guard in front: nothing rejects"
                if run.mode == "no-guard"
                else "no rejections scraped"
            ),
        ),
        _legend(
            [(f"{label} ({sum(stack_counts[label]):,.0f})", c, False) for label, c, _ in stacks]
        ),
    )


def _answers_chart(rs: RunSeries, suffix: str, scales: Mapping[str, float], x_max: float) -> _Chart:
    """What refused each attack request, per second, stacked bars (outcomes.CATEGORIES)."""
    counts = rs.counts.answers if rs.counts else {}
    order = [c for c in outcomes.CATEGORIES if c in rs.answers]
    stacks = [(c, _CATEGORY_COLORS[c], rs.answers[c]) for c in order]
    bars = Bars(
        rs.bar_starts, rs.bar_width, stacks, {c: [float(n) for n in counts[c]] for c in order}
    )
    recorded = rs.counts is not None and rs.counts.recorded
    return _Chart(
        f"attack-answers{suffix}",
        "Attack requests by what refused them",
        "Every attack request (each request of a flood burst), by what refused it: a content "
        "check, a budget, a rate or concurrency limit; or served (red; a flood's first requests "
        f"are served before its limit, pink). Per second over {rs.bar_width:g} s bars.",
        bar_chart(
            f"attack-answers{suffix}",
            "Attack requests by what refused them",
            bars=bars,
            x_max=x_max,
            y_unit="requests/s",
            y_max=scales["answers"] * 1.1,
            width=_CHART_W,
            height=_CHART_H,
            empty_text=(
                "no attacks"
                if recorded
                else "no attack records in this run (timeline.json before version 2)"
            ),
        ),
        _legend([(f"{c} ({sum(counts[c]):,})", colour, False) for c, colour, _ in stacks]),
    )


def _scales(all_series: Sequence[RunSeries]) -> dict[str, float]:
    def top(fn: Callable[[RunSeries], float]) -> float:
        return max([fn(rs) for rs in all_series] or [0.0]) or 1.0

    def stacked(rows: Mapping[str, Sequence[float]]) -> float:
        return max((sum(col) for col in zip(*rows.values(), strict=True)), default=0.0)

    return {
        "benign-latency": top(lambda rs: _max_of(rs.latency["BENIGN"]["p99"])),
        "ttft": top(lambda rs: _max_of(rs.latency["TTFT"]["p99"])),
        "itl": top(lambda rs: _max_of(rs.latency["ITL"]["p99"])),
        "rss": top(
            lambda rs: (
                max([_max_of(p) for p in rs.rss.values()] + list(rs.peak_rss.values()))
                if rs.rss
                else 0.0
            )
        ),
        "rejections": top(lambda rs: stacked(rs.rejections)),
        # 0 when no run of the page is a fair share phase (then no such chart)
        "fair": max(
            (
                _max_of(pts)
                for rs in all_series
                for lines in rs.fair_latency.values()
                for pts in lines.values()
            ),
            default=0.0,
        )
        or (1.0 if any(rs.fair_latency for rs in all_series) else 0.0),
        "answers": top(lambda rs: stacked(rs.answers)),
    }


def _figure(chart: _Chart, who: str = "") -> str:
    caption = _e(chart.title) + (f' <span class="who">{_e(who)}</span>' if who else "")
    return (
        f'<figure data-figure="{_e(chart.id)}"><figcaption>{caption}</figcaption>'
        f'<p class="note">{_e(chart.note)}</p>{chart.svg}{chart.legend}</figure>'
    )


def _attack_table(run: Run, counts: Counts, who: str) -> str:
    """Attack requests by THREATS class and what each was aimed at, by what refused them;
    subtotals per aim and a total (each cell ``data-count`` ``aim/class/category``)."""
    a = counts.attacks
    if not a.requests:
        if counts.recorded:
            return f"<p>No attacks were sent{_e(who)}.</p>"
        if run.timeline:
            return f"<p>This run's timeline.json has no attack records (version 1){_e(who)}.</p>"
        return f"<p>No timeline.json in this run: no attack records{_e(who)}.</p>"
    present = {c for classes in a.table.values() for row in classes.values() for c in row}
    columns = [c for c in outcomes.CATEGORIES if c in present or c in (outcomes.CONTENT,)]
    head = (
        "<tr><th>THREATS class</th><th>meant to be refused by</th><th>requests</th>"
        + "".join(f"<th>{_e(c)}</th>" for c in columns)
        + "</tr>"
    )

    def cells(prefix: str, row: Mapping[str, int]) -> str:
        out = []
        for c in columns:
            n = row.get(c, 0)
            wrong = n and _wrong(c)
            mark = ' class="num status fail"' if wrong else ' class="num"'
            out.append(f"<td{mark}>{_n(f'{prefix}/{c}', n)}</td>")
        return "".join(out)

    rows = [head]
    totals: dict[str, int] = {}
    for aim in (outcomes.CONTENT_ATTACK, outcomes.FLOOD):
        classes = a.table.get(aim) or {}
        subtotal: dict[str, int] = {}
        for cls, row in sorted(classes.items()):
            for c, n in row.items():
                subtotal[c] = subtotal.get(c, 0) + n
            rows.append(
                f'<tr data-class="{_e(cls)}"><td>{_e(cls)}</td><td>{_e(_INTENT_LABELS[aim])}</td>'
                f'<td class="num">{_n(f"{aim}/{cls}/requests", sum(row.values()))}</td>'
                + cells(f"{aim}/{cls}", row)
                + "</tr>"
            )
        if classes:
            rows.append(
                f'<tr class="subtotal"><th colspan="2">all aimed at {_e(_INTENT_LABELS[aim])}'
                f'</th><td class="num">{_n(f"{aim}/requests", sum(subtotal.values()))}</td>'
                + cells(aim, subtotal)
                + "</tr>"
            )
        for c, n in subtotal.items():
            totals[c] = totals.get(c, 0) + n
    rows.append(
        '<tr class="total"><th colspan="2">all attack requests</th>'
        f'<td class="num">{_n("attacks/requests", a.requests)}</td>'
        + cells("attacks", totals)
        + "</tr>"
    )
    bursts = (
        f"<p>Flood bursts{_e(who)}: {_n('bursts/sent', a.bursts)} sent, "
        f"{_n('bursts/stopped', a.bursts_stopped)} stopped by a limit (a budget, rate or "
        "concurrency limit refused at least one request of the burst).</p>"
        if a.bursts
        else ""
    )
    return f'<table class="attacks" id="attack-classes">{"".join(rows)}</table>{bursts}'


def _wrong(category: str) -> bool:
    """Whether an attack answered so is a failure of the guard: anything served or broken (a
    flood's requests served before its limit are expected: their own category)."""
    return category in (outcomes.SERVED, outcomes.SERVER_ERROR, outcomes.NO_ANSWER)


_ATTACK_NOTE = (
    "Each request counted once (a flood burst's requests each). A content attack is meant to "
    "be refused by a content check (the guard's check codes, docs/ERRORS.md); one a budget or "
    "a rate or concurrency limit refused first was never judged by the checks, so the gate "
    "(attacks stopped by content checks) counts it apart, not as stopped. A flood is valid "
    "requests, meant to meet a limit: its first requests are served before it."
)


def _code_totals(runs: Sequence[Run], counts: Sequence[Counts]) -> str:
    """The guard's rejections by code during each run: the chart's bars summed."""
    totals = [{code: sum(row) for code, row in c.rejections.items()} for c in counts]
    codes = sorted(
        {code for t in totals for code in t}, key=lambda k: (-max(t.get(k, 0) for t in totals), k)
    )
    if not codes:
        return "<p>No rejections were scraped from a guard.</p>"
    head = (
        "<tr><th>code</th><th>refused by</th>"
        + "".join(f"<th>{_e(r.label)}</th>" for r in runs)
        + "</tr>"
    )
    rows = "".join(
        f"<tr><td><code>{_e(code)}</code></td>"
        # /metrics has the code, not the status: a limit's code or else a check's
        f"<td>{_e(outcomes.refused_by(400, code))}</td>"
        + "".join(
            f'<td class="num" data-run="{i}">{_n(f"rejections/{code}", t.get(code, 0))}</td>'
            for i, t in enumerate(totals)
        )
        + "</tr>"
        for code in codes
    )
    return f'<table id="rejection-totals">{head}{rows}</table>'


def _failures(run: Run, who: str) -> str:
    n = run.numbers
    parts = []
    for key, title in (
        ("attacks_not_rejected", "attacks not rejected"),
        ("benign_failure_samples", "benign failures"),
    ):
        items = n.get(key) or []
        if items:
            lis = "".join(f"<li><code>{_e(i)}</code></li>" for i in items)
            parts.append(
                f"<details open><summary>{_e(title)} {who}({len(items)})</summary>"
                f"<ul>{lis}</ul></details>"
            )
    unexpected = (n.get("target") or {}).get("unexpected_codes") or {}
    if unexpected:
        lis = "".join(
            f"<li><code>{_e(k.removeprefix('unexpected '))}</code> x{v}</li>"
            for k, v in sorted(unexpected.items())
        )
        parts.append(
            f"<details><summary>rejected with another status or code than the payload "
            f"expects {who}({len(unexpected)})</summary><ul>{lis}</ul></details>"
        )
    return "".join(parts)


def _state(server: Mapping[str, Any], died_at: float | None) -> str:
    """A server's state when the load ended: ``schedguard load`` read its exit status then
    (``exit``, ``exit_code``); the load generator's monitor saw when it went (``died_s``).
    Either one saying it was gone wins: a process gone is never shown as running."""
    exit_text = str(server.get("exit") or "")
    seen = f", first seen gone {died_at:.1f} s into the run" if died_at is not None else ""
    if exit_text and exit_text != "running":
        return f"gone: {exit_text}{seen}"
    if died_at is not None:
        code = server.get("exit_code")
        known = f"exit code {code}" if code is not None else "exit code unknown"
        return f"gone{seen} ({known})"
    if exit_text == "running":
        return "running when the load ended (then stopped by schedguard load)"
    return "unknown"


def _servers(runs: Sequence[Run]) -> str:
    rows = []
    for run in runs:
        died = (run.timeline or {}).get("died_s") or {}
        for name, s in sorted((run.report.get("servers") or {}).items()):
            gone_at = died.get(name)
            rows.append(
                f"<tr><td>{_e(run.label)}</td><td>{_e(name)}</td><td>{_e(s.get('url', ''))}</td>"
                f"<td class='num'>{_e(s.get('pid', ''))}</td>"
                f"<td class='num'>{_mb(s.get('peak_rss_mb'))}</td>"
                f'<td data-state="{_e(name)}">'
                f"{_e(_state(s, None if gone_at is None else float(gone_at)))}</td></tr>"
            )
    if not rows:
        return ""
    return (
        "<h2>Servers</h2><table id='servers'><tr><th>run</th><th>server</th><th>URL</th>"
        "<th>pid</th><th>peak RSS</th><th>state when the load ended</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _period(seconds: float) -> str:
    return f"{seconds:.2g} s" if seconds < 1 else f"{seconds:.3g} s"


def _sampling(run: Run, rs: RunSeries) -> str:
    """How often each series was sampled, as measured, said once for the page."""
    periods = (run.timeline or {}).get("periods_s") or {}
    parts = []
    rss = periods.get("rss_s")
    if rss is not None:
        asked = periods.get("rss_asked_s")
        parts.append(
            f"RSS every {_period(float(rss))} (median gap"
            + (f"; asked: {_period(float(asked))})" if asked is not None else ")")
            + " by the load generator (psutil, the process and its children: the chart's lines)"
        )
    elif any(len(p) > 1 for p in rs.rss.values()):
        gaps = sorted(b[0] - a[0] for pts in rs.rss.values() for a, b in itertools.pairwise(pts))
        parts.append(
            f"RSS points {_period(gaps[len(gaps) // 2])} apart (median; this run did not "
            "record the monitor's period)"
        )
    fine = sorted(
        {
            float(s["peak_rss_sample_s"])
            for s in (run.report.get("servers") or {}).values()
            if s.get("peak_rss_sample_s") is not None
        }
    )
    peak = "peak RSS: the kernel's high-water mark (VmHWM), which holds a peak between samples"
    if fine:
        peak += (
            ", read at each of those samples and every "
            + " / ".join(_period(f) for f in fine)
            + " by schedguard load"
        )
    parts.append(peak)
    metrics = periods.get("metrics_s")
    if metrics is not None:
        parts.append(f"the guard's /metrics scraped every {_period(float(metrics))} (median gap)")
    parts.append(
        "requests: every one, counted in the second it ended; bars of "
        f"{rs.bar_width:g} s, latency points every {rs.step:g} s over a trailing {rs.span:g} s"
    )
    who = f"{run.label}: " if run.label else ""
    return (
        f'<p class="sampling" data-sampling="{_e(run.mode)}">{_e(who)}'
        + _e("; ".join(parts) + ".")
        + "</p>"
    )


_FILES = (
    ("locust_report.html", "locust's own report"),
    ("report.json", "everything here as JSON"),
    ("slo.json", "the SLO gate's report"),
    ("timeline.json", "the time series"),
    ("locust_stats.csv", "locust stats"),
    ("locust_stats_history.csv", "locust stats per second"),
    ("locust_failures.csv", "locust failures"),
    ("locust.log", "locust's output"),
    ("guard.log", "guard log"),
    ("upstream.log", "upstream log"),
)


def _files(runs: Sequence[Run], out_dir: Path) -> str:
    items = []
    for run in runs:
        for name, what in _FILES:
            path = run.directory / name
            if path.is_file():
                href = os.path.relpath(path, out_dir)
                items.append(
                    f'<li><a href="{_e(href)}">{_e(href)}</a>: {_e(what)}'
                    + (f" ({_e(run.label)})" if len(runs) > 1 else "")
                    + "</li>"
                )
    return "<h2>Files</h2><ul id='files'>" + "".join(items) + "</ul>" if items else ""


def build_html(run: Run, compare: Run | None = None, *, out_dir: Path | None = None) -> str:
    """The report page for ``run`` (and ``compare`` beside it)."""
    runs = [run] if compare is None else [run, compare]
    all_counts = [count(r) for r in runs]  # the one pass: tables and charts read these
    all_series = [series(r, c) for r, c in zip(runs, all_counts, strict=True)]
    x_max = max(rs.duration for rs in all_series)
    scales = _scales(all_series)
    colours = _colours(all_series)
    charts = [
        _charts(rs, r, "" if i == 0 else "-compare", scales, x_max, colours)
        for i, (rs, r) in enumerate(zip(all_series, runs, strict=True))
    ]
    if compare is None:
        chart_html = '<div class="grid">' + "".join(_figure(c) for c in charts[0]) + "</div>"
    else:
        chart_html = "".join(
            f'<div class="grid pair">{_figure(a, run.label)}{_figure(b, compare.label)}</div>'
            for a, b in zip(charts[0], charts[1], strict=True)
        )
    verdict = "pass" if run.passed else "fail"
    subtitle = f'<p class="sub">{_run_line(run)}</p>'
    if compare is not None:
        other = "PASS" if compare.passed else "FAIL"
        subtitle += (
            f'<p class="sub">compared with: {_run_line(compare)}: its gate '
            f'<span class="status {other.lower()}">{other}</span></p>'
        )
    failures = _failures(run, f"({run.label}) " if compare else "")
    if compare is not None:
        failures += _failures(compare, f"({compare.label}) ")
    sampling = "".join(_sampling(r, rs) for r, rs in zip(runs, all_series, strict=True))
    attack_tables = "".join(
        (f"<h3>{_e(r.label)}</h3>" if compare is not None else "")
        + _attack_table(r, c, f" ({r.label})" if compare is not None else "")
        for r, c in zip(runs, all_counts, strict=True)
    )
    fair_tables = "".join(
        _fair_table(r, c, f"({r.label}) " if compare is not None else "")
        for r, c in zip(runs, all_counts, strict=True)
    )
    fair_section = (
        f'<section id="fair-share"><h2>Fair share: tenant by tenant</h2>{fair_tables}</section>'
        if fair_tables
        else ""
    )
    directory = out_dir or run.directory
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = f"schedguard load report: {verdict.upper()}"
    return (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<style>{_CSS}</style></head><body><main>"
        f'<header><h1>schedguard load report <span class="verdict {verdict}" id="verdict">'
        f"{verdict.upper()}</span></h1>{subtitle}</header>"
        f'<section id="slo"><h2>SLO verdicts</h2>{_slo_table(runs)}</section>'
        f'<section id="charts"><h2>Over time</h2>'
        f'<div id="sampling"><h3>Sampling</h3>{sampling}</div>{chart_html}</section>'
        f"{fair_section}"
        f'<section id="numbers"><h2>Traffic</h2>{_numbers_table(runs, all_counts)}</section>'
        f'<section id="attacks"><h2>Attack requests by what refused them</h2>'
        f'<p class="note">{_e(_ATTACK_NOTE)}</p>{attack_tables}'
        f"<h2>Guard rejections by code (totals)</h2>{_code_totals(runs, all_counts)}"
        f"{failures}</section>"
        f"{_servers(runs)}{_files(runs, directory)}"
        f"<footer>schedguard load report, generated {generated}.</footer>"
        "</main></body></html>\n"
    )


def write_report(
    out_dir: str | Path, compare: str | Path | None = None, *, name: str = REPORT_FILE
) -> Path:
    """Write ``report.html`` into ``out_dir`` from the run there (and ``compare``'s)."""
    directory = Path(out_dir)
    run = load_run(directory)
    other = load_run(compare) if compare is not None else None
    path = directory / name
    path.write_text(build_html(run, other, out_dir=directory), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loadtests.report",
        description="Write report.html for a schedguard load run's output directory.",
    )
    parser.add_argument("out", help="the run's output directory (report.json or slo.json)")
    parser.add_argument("--compare", help="another run's directory (e.g. a --no-guard run)")
    args = parser.parse_args(argv)
    try:
        path = write_report(args.out, args.compare)
    except (OSError, ValueError) as exc:
        print(f"loadtests.report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
